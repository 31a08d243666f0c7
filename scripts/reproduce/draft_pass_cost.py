"""What a drafter pass costs by draft length under each drafter setting, on the default target.

One proposer per setting, all on one loaded target (`--dtype`, default gguf): the drafter's module
forward as training runs it (`module`), and the decoding pass (dcoco.models.drafter.draft_pass) at
the target's dtype and as int4 groups (`--draft-dtype target | int4`), each over the whole block and
over the drafted slots only (`--draft-block full | drafted`). Each call is a steady-state cycle as
`dcoco profile` times it (2 new taps over a 300-token cache, random tokens and taps, the copy hints
included), the settings in alternation call after call. Prints median ms per draft length; ratios
are within this one run.

Usage: .venv/bin/python scripts/reproduce/draft_pass_cost.py [DTYPE] [METHOD]   (gguf, dflash)
"""

from __future__ import annotations

import sys

import torch

from dcoco.decode.cost_curve import CONTEXT, interleaved_ms, machine_fingerprint, ms_table
from dcoco.decode.methods import MethodOptions, build_proposer
from dcoco.decode.proposers import DraftContext
from dcoco.models.target.cache import crop_cache
from dcoco.models.target.loading import DEFAULT_TARGET, load_target

SETTINGS = {  # name -> (--draft-dtype, --draft-block, the decoding pass)
    "module, full": ("target", "full", False),
    "target, full": ("target", "full", True),
    "target, drafted": ("target", "drafted", True),
    "int4, full": ("int4", "full", True),
    "int4, drafted": ("int4", "drafted", True),
}
SLOTS, REPEATS = (1, 2, 3, 4, 5, 7), 25


def cycle(proposer, slots: int, pass_only: bool = False):
    """One draft of `slots` tokens after 2 new taps, the cache cropped back after it (`pass_only`:
    the drafter's pass, `draft_block`, without a head's correction)."""
    width = proposer.drafter.config.hidden_size * len(proposer.feature_layers)
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, proposer.drafter.config.vocab_size, (CONTEXT + 2,),
                           generator=generator)  # fmt: skip
    dtype = proposer.drafter.dtype
    features = torch.randn(1, CONTEXT + 2, width, generator=generator).to(dtype)
    draft = proposer.draft_block if pass_only else proposer.propose
    proposer.start(tokens[:CONTEXT].tolist())
    draft(DraftContext(tokens[:CONTEXT], features[:, :CONTEXT], slots))
    crop_cache(proposer.cache, CONTEXT - 1)

    def call():
        draft(DraftContext(tokens, features[:, CONTEXT - 1 :], slots))
        crop_cache(proposer.cache, CONTEXT - 1)

    return call


def main(dtype: str, method: str) -> None:
    machine = machine_fingerprint()
    print(f"{machine['cpu']} ({machine['isa']}), {torch.get_num_threads()} threads, "
          f"torch {torch.__version__}; {method} at {dtype}, median ms a draft")  # fmt: skip
    target = load_target(DEFAULT_TARGET, dtype, None, "auto", "auto", "target")
    proposers = {}
    for name, (draft_dtype, block, fast) in SETTINGS.items():
        options = MethodOptions(draft_dtype=draft_dtype, draft_block=block)
        proposers[name] = build_proposer(method, target, options)
        if not fast:
            proposers[name].drafter.use_draft_pass(None)
    table: dict[str, list[float]] = {}
    for slots in SLOTS:
        calls = [cycle(proposer, slots) for proposer in proposers.values()]
        for name, ms in zip(proposers, interleaved_ms(calls, REPEATS, 3), strict=True):
            table.setdefault(name, []).append(ms)
    print(ms_table("--draft-dtype, --draft-block", [f"k = {k}" for k in SLOTS], table))


if __name__ == "__main__":
    arguments = sys.argv[1:]
    main(arguments[0] if arguments else "gguf", arguments[1] if len(arguments) > 1 else "dflash")
