"""Data-parallel training under torchrun (dcoco.train.distributed), on CPU with gloo: two
processes sharing a global batch take the optimizer steps one process takes with that batch, build
the feature cache between them, write one log, and resume after the loss of a rank.

Each run is a subprocess (this file run as a script, under `torch.distributed.run` for two
ranks) on the tiny Llama target and a tiny corpus of three parts, one thread per process.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

STEPS, KILL_AFTER = 8, 5


def _launch(
    work: Path, out: Path, ranks: int, mode: str = "library"
) -> subprocess.CompletedProcess:
    # a cache dir per run, so each run builds (the two-rank one, shares out) its feature cache
    env = {**os.environ, "DCOCO_CACHE_DIR": str(work / f"cache-{out.name}"), "OMP_NUM_THREADS": "1"}
    env.pop("WORLD_SIZE", None)
    script = [__file__, str(work), str(out), mode]
    if ranks == 1:
        command = [sys.executable, *script]
    else:
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                   "--nproc-per-node", str(ranks), *script]  # fmt: skip
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)


def _weights(out: Path) -> dict:
    state = torch.load(out / "ckpt" / "state.pt", weights_only=True)
    head = {f"head.{k}": v for k, v in (state.get("head") or {}).items()}
    return {"step": state["step"], **state["model"], **head}


def _train_lines(out: Path) -> list[dict]:
    lines = (out / "train_log.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["event"] == "train"]


def _close(a: dict, b: dict) -> None:
    """Equal within fp32 rounding: the two ranks' gradients are summed in another order than one
    process accumulates them, and Adam's normalisation carries that rounding (measured: at most
    1.2e-6 on weights up to 1.0 after 8 steps)."""
    assert a.keys() == b.keys() and a["step"] == b["step"] == STEPS
    worst = max((a[k] - b[k]).abs().max().item() for k in a if torch.is_tensor(a[k]))
    assert worst < 1e-5


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    work = tmp_path_factory.mktemp("ddp")
    one = _launch(work, work / "one", 1)
    assert one.returncode == 0, one.stderr[-3000:]
    return work


@pytest.mark.slow
def test_two_gloo_ranks_take_the_steps_of_one_process(runs):
    two = _launch(runs, runs / "two", 2, mode="cli")
    assert two.returncode == 0, two.stderr[-3000:]
    _close(_weights(runs / "one"), _weights(runs / "two"))
    one_log, two_log = _train_lines(runs / "one"), _train_lines(runs / "two")
    assert [r["step"] for r in two_log] == list(range(1, STEPS + 1))  # one writer
    for a, b in zip(one_log, two_log, strict=True):  # the whole batch's metrics
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-6)
        assert b["blocks"] == a["blocks"] and b["tokens"] == a["tokens"]
    cache = runs / "cache-two" / "features"
    assert len(list(cache.glob("*/part-*.json"))) == 3  # every part built once, by some rank


@pytest.mark.slow
def test_a_killed_rank_fails_the_run_and_the_same_command_resumes_it(runs):
    killed = _launch(runs, runs / "killed", 2, mode="kill")
    assert killed.returncode != 0 and (runs / "killed" / "rank1-killed").is_file()
    again = _launch(runs, runs / "killed", 2, mode="kill")  # the marker stops a second kill
    assert again.returncode == 0, again.stderr[-3000:]
    _close(_weights(runs / "one"), _weights(runs / "killed"))
    assert any(r["event"] == "resume" for r in map(json.loads, _log(runs / "killed")))


@pytest.mark.slow
def test_joint_corrector_training_on_two_ranks_equals_one(runs):
    """`train-corrector --mode joint` (drafter and DCOCO head together) under torchrun."""
    one = _launch(runs, runs / "joint-one", 1, mode="joint")
    assert one.returncode == 0, one.stderr[-3000:]
    two = _launch(runs, runs / "joint-two", 2, mode="joint")
    assert two.returncode == 0, two.stderr[-3000:]
    a, b = _weights(runs / "joint-one"), _weights(runs / "joint-two")
    assert any(k.startswith("head.") for k in a)
    for x, y in zip(
        _train_lines(runs / "joint-one"), _train_lines(runs / "joint-two"), strict=True
    ):
        assert y["loss"] == pytest.approx(x["loss"], rel=1e-6)
    # Every tensor but one agrees within 3e-7. The head's zero-initialised output bias gets a
    # gradient that is nearly zero (its terms cancel), where Adam's g / sqrt(v) turns the
    # summation order's rounding into a step of up to lr (3e-3): measured 2.5e-4 after 8 steps.
    _close({k: v for k, v in a.items() if k != "head.delta_out.bias"},
           {k: v for k, v in b.items() if k != "head.delta_out.bias"})  # fmt: skip
    assert (a["head.delta_out.bias"] - b["head.delta_out.bias"]).abs().max() < 3e-3


def _log(out: Path) -> list[str]:
    return (out / "train_log.jsonl").read_text().splitlines()


def _main(work: Path, out: Path, mode: str) -> None:
    sys.path.insert(0, str(Path(__file__).parent))
    from conftest import make_tiny_target
    from test_corrector_cache import write_corpus
    from test_head_train import SHARED, two_mode_corpus

    import dcoco.train.loop as loop
    from dcoco.train.drafter_train import DrafterTrainConfig
    from dcoco.train.drafter_train import train as train_drafter

    torch.set_num_threads(1)
    corpus = work / "corpus"
    if not corpus.is_dir() and os.environ.get("RANK", "0") == "0":
        write_corpus(two_mode_corpus(24), corpus, parts=3)
    if mode == "kill":  # rank 1 dies once, after KILL_AFTER steps (the last checkpoint: step 4)
        step = loop.train_step

        def dying_step(run):
            marker = out / "rank1-killed"
            if run.ranks.rank == 1 and run.step == KILL_AFTER and not marker.exists():
                marker.touch()
                os.kill(os.getpid(), signal.SIGKILL)
            return step(run)

        loop.train_step = dying_step
    settings = {**SHARED, "batch_size": 4, "save_every": 4, "heldout": 4, "max_steps": STEPS}
    if mode == "cli":  # the command a user runs: torchrun ... -m dcoco train-drafter FLAGS
        from dcoco.cli import main

        loop.load_target = lambda *args, **kwargs: make_tiny_target("llama")
        flags = [f"--{k.replace('_', '-')}={','.join(map(str, v)) if isinstance(v, tuple) else v}"
                 for k, v in settings.items()]  # fmt: skip
        args = ["train-drafter", "--target", "tiny", "--out", str(out), "--corpus", str(corpus)]
        sys.exit(main([*args, *flags]))
    if mode == "joint":  # over the one-process run's drafter
        from dcoco.train.head_train import HeadTrainConfig
        from dcoco.train.head_train import train as train_head

        head = dict(init=str(work / "one" / "drafter"), mode="joint", top_k=4, mlp_hidden=16)
        config = HeadTrainConfig(out=str(out), corpus=str(corpus), **head, **settings)
        train_head(config, target=make_tiny_target("llama"), progress_bar=False)
        return
    config = DrafterTrainConfig(out=str(out), corpus=str(corpus), **settings)
    train_drafter(config, target=make_tiny_target("llama"), progress_bar=False)


if __name__ == "__main__":  # [torchrun ...] python tests/test_distributed_training.py WORK OUT MODE
    _main(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3])
