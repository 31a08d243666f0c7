"""The prepared GPU check: what only a CUDA machine can show, on small random models, in minutes.

Run it wherever a GPU is at hand (no network, no real weights; the tests' tiny models):
    scripts/device_check.sh            # on the GPU: cuda, NCCL
    scripts/device_check.sh --cpu      # the dry run anywhere: the same checks on the CPU, gloo
It prints one line per check, `PASS name (seconds): what it showed` or `FAIL name (seconds):
why`, then `N passed, N failed`, and exits 1 if any failed. The checks:
- greedy:    our engine's greedy output on the device equals the slow reference decoder's, plain
             and with `pld`, `dflash` (a random drafter) and `dcoco` (a random corrector over it),
             token for token at fp32;
- sampling:  speculative sampling on the device stays lossless: the emitted tokens follow the
             target's law at every block position (chi-square below its 99.9% quantile);
- drafter:   drafter training steps under bf16 autocast (fp32 with --cpu) raise the simulated
             acceptance;
- corrector: joint corrector training steps, likewise, lower the drafter's loss;
- nccl:      a world-size-1 NCCL group (gloo with --cpu): dcoco's all-sum and gradient sum;
- compiled:  the DCOCO corrector's compiled pick equals its eager pick at several batch sizes.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]  # the package and the tests' tiny models

import torch  # noqa: E402
from conftest import make_tiny_target  # noqa: E402

CHECKS = []
# bf16 autocast on the GPU; the CPU dry run keeps fp32 (bf16 products are emulated on many CPUs)
AUTOCAST = {"cuda": True, "cpu": False}
AUTOCAST_NOTE = {"cuda": " under bf16 autocast", "cpu": " (fp32: the dry run)"}


def check(function):
    CHECKS.append(function)
    return function


@check
def greedy(device: str, work: Path) -> str:
    from test_head_train import two_mode_corpus

    from dcoco.decode.engine import Engine
    from dcoco.decode.methods import MethodOptions, build_proposer
    from dcoco.decode.reference import reference_greedy

    target = make_tiny_target("llama")
    target.model.to(device)
    drafter, dcoco = _tiny_checkpoints(target, device, work, two_mode_corpus(8))
    prompt = [40, 41, 42, 10, 20, 21, 22, 10, 30, 31, 32, 10]
    expected = reference_greedy(target, prompt, 32)
    outputs = {"plain": Engine(target).generate(prompt, 32).new_ids}
    for method in ("pld", f"dflash@{drafter}", f"dcoco@{dcoco}"):
        proposer = build_proposer(method, target, MethodOptions(compile_head=False))
        outputs[method.split("@")[0]] = Engine(target, proposer).generate(prompt, 32).new_ids
    wrong = [name for name, ids in outputs.items() if list(ids) != list(expected)]
    assert not wrong, f"differ from the reference: {wrong}"
    return f"{', '.join(outputs)} = reference, {len(expected)} tokens"


def _tiny_checkpoints(target, device: str, work: Path, samples) -> tuple[str, str]:
    """A drafter and a dcoco head over it, two steps each, saved as checkpoints."""
    from test_head_train import SHARED

    from dcoco.train.drafter_train import DrafterTrainConfig
    from dcoco.train.drafter_train import train as train_drafter
    from dcoco.train.head_train import HeadTrainConfig
    from dcoco.train.head_train import train as train_head

    flags = {**SHARED, "device": device}
    drafter = train_drafter(
        DrafterTrainConfig(out=str(work / "drafter"), max_steps=2, **flags),
        target=target, samples=samples, progress_bar=False,
    )["drafter"]  # fmt: skip
    head = HeadTrainConfig(out=str(work / "dcoco"), init=drafter, mode="dropin", max_steps=2,
                           top_k=4, mlp_hidden=16, **flags)  # fmt: skip
    return drafter, train_head(head, target=target, samples=samples, progress_bar=False)["drafter"]


@check
def sampling(device: str, work: Path) -> str:
    from test_verify import CHI2_LIMIT, ROWS, SLOTS, TARGET, VOCAB, _emitted, _fit

    from dcoco.decode.sampling import sample
    from dcoco.decode.verify import verify_with_draft_probs

    generator = torch.Generator(device).manual_seed(0)
    target = TARGET.to(device)
    exponentials = -torch.rand(SLOTS, VOCAB, generator=generator, device=device).log()
    draft_probs = (exponentials / exponentials.sum(-1, keepdim=True)).expand(ROWS, -1, -1)
    draft_tokens = sample(draft_probs, generator)
    verdict = verify_with_draft_probs(
        draft_tokens, draft_probs, target.expand(ROWS, -1, -1), generator
    )
    draft_tokens = draft_tokens.cpu()
    verdict = type(verdict)(verdict.num_accepted.cpu(), verdict.next_token.cpu())
    chi2 = [_fit(_emitted(draft_tokens, verdict, p), TARGET[p])[1] for p in range(SLOTS + 1)]
    assert max(chi2) < CHI2_LIMIT, f"chi-square {chi2} over {CHI2_LIMIT}"
    return f"chi-square per position {', '.join(f'{c:.1f}' for c in chi2)} < {CHI2_LIMIT}"


@check
def drafter(device: str, work: Path) -> str:
    from test_drafter_train import cyclic_corpus, tiny_config

    from dcoco.train.drafter_train import train

    target = make_tiny_target("llama")
    target.model.to(device)
    steps = 40 if device == "cuda" else 12
    config = tiny_config(work / "run", max_steps=steps, autocast=AUTOCAST[device], device=device)
    result = train(config, target=target, samples=cyclic_corpus(), progress_bar=False)
    before, after = result["initial"]["accept"], result["final"]["accept"]
    assert after > before + (1.0 if device == "cuda" else 0.0), (before, after)
    return f"{steps} steps{AUTOCAST_NOTE[device]}: simulated tau {before:.2f} -> {after:.2f}"


@check
def corrector(device: str, work: Path) -> str:
    from test_head_train import SHARED, tiny_drafter, two_mode_corpus

    from dcoco.train.head_train import HeadTrainConfig
    from dcoco.train.head_train import train as train_head

    target = make_tiny_target("llama")
    target.model.to(device)
    samples = two_mode_corpus(16)
    init = tiny_drafter(target, work, samples, 4)["drafter"]  # on the target's device
    config = HeadTrainConfig(
        out=str(work / "joint"), init=init, mode="joint", max_steps=6, top_k=4, mlp_hidden=16,
        **{**SHARED, "autocast": AUTOCAST[device], "device": device},
    )  # fmt: skip
    result = train_head(config, target=target, samples=samples, progress_bar=False)
    before, after = result["initial"]["drafter_loss"], result["final"]["drafter_loss"]
    assert after < before, (before, after)
    return f"6 joint steps{AUTOCAST_NOTE[device]}: drafter loss {before:.3f} -> {after:.3f}"


@check
def nccl(device: str, work: Path) -> str:
    import torch.distributed as dist

    from dcoco.train.distributed import Ranks, all_sum, collective_device, sum_gradients

    backend = "nccl" if device == "cuda" else "gloo"
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    dist.init_process_group(backend, rank=0, world_size=1)
    try:
        peers = Ranks(rank=0, world=2)  # takes the collective path; the group holds one rank
        assert all_sum([1.5, 2.0], peers) == [1.5, 2.0]
        parameter = torch.nn.Parameter(torch.ones(3, device=device))
        parameter.grad = torch.full((3,), 2.0, device=device)
        sum_gradients([parameter], peers)
        assert parameter.grad.tolist() == [2.0, 2.0, 2.0]
        return f"{backend}: all-sum and gradient sum on {collective_device()}"
    finally:
        dist.destroy_process_group()


@check
def compiled(device: str, work: Path) -> str:
    from test_corrector_options import make_corrector, random_block

    from dcoco.models.heads.base import select_draft
    from dcoco.models.heads.head_compile import HeadSelect

    corrector = make_corrector(seed=2, randomise=True, features="normalised",
                               successor_query=True, anchor=True).eval().to(device)  # fmt: skip
    select = HeadSelect(corrector, None, None, 3)
    with torch.inference_mode():
        for batch, slots in ((2, 2), (1, 1), (7, 3), (4, 1)):
            hidden, logits, anchors = (t.to(device) for t in random_block(batch, batch + slots))
            picks = select(hidden[:, :slots], logits[:, :slots], anchors)
            eager = select_draft(corrector, hidden[:, :slots], logits[:, :slots], anchors, None)
            assert torch.equal(picks, eager), (batch, slots)
    assert select.compiled, "the pick ran eager: torch.compile failed"
    return "compiled picks = eager picks at 4 batch/slot shapes"


def main(argv: list[str]) -> int:
    device = "cpu" if "--cpu" in argv else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        print("FAIL setup: no CUDA device (pass --cpu for the dry run)")
        return 1
    where = torch.cuda.get_device_name() if device == "cuda" else "CPU (dry run)"
    print(f"device check on {where}, torch {torch.__version__}")
    passed = failed = 0
    for function in CHECKS:
        started = time.perf_counter()
        with tempfile.TemporaryDirectory() as work:
            try:
                torch.manual_seed(0)
                detail, status = function(device, Path(work)), "PASS"
            except Exception as error:  # noqa: BLE001 (one line per check, whatever broke)
                detail, status = f"{type(error).__name__}: {error}", "FAIL"
                traceback.print_exc(file=sys.stderr)
        passed, failed = passed + (status == "PASS"), failed + (status == "FAIL")
        print(f"{status} {function.__name__} ({time.perf_counter() - started:.1f} s): {detail}",
              flush=True)  # fmt: skip
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
