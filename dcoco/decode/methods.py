"""Decoding methods by name: each maps to a proposer for the one engine (`plain` has none).

A method spec is `METHOD[:SELECTION][@CHECKPOINT]`:
- METHOD: plain | pld | dflash | dcoco | dspark | domino | pld-dflash (prompt lookup where the
  context has an n-gram match, the dflash drafter elsewhere);
- SELECTION (dcoco only): the corrector's selection rule, greedy | keep1 | global | discounted |
  top1;
- CHECKPOINT (drafter methods): a checkpoint directory, or the name of one shipped under
  `checkpoints/<target>/`; by default the method's default in that directory's catalogue
  (dcoco.models.catalogue), else the one named like the method.
The whole spec names the method in reports, so `dcoco@dcoco-dropin` and `dcoco` sit side by side.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dcoco.decode.proposers import PromptLookupProposer, Proposer
from dcoco.errors import DcocoError
from dcoco.models.catalogue import default_checkpoint
from dcoco.models.packed_linear import pack_linears
from dcoco.models.selection import SELECTION_RULES
from dcoco.models.target import TargetModel
from dcoco.paths import checkpoints_dir

DRAFTER_METHODS = ("dflash", "dcoco", "dspark", "domino", "pld-dflash")
# Without a catalogue: methods whose default checkpoint is named otherwise than the method.
DEFAULT_CHECKPOINT = {"pld-dflash": "dflash"}


@dataclass
class MethodOptions:
    num_draft_tokens: int = 0  # 0 = the method's most (pld: 8; drafters: block_size - 1)
    drafter: str = ""  # checkpoint dir for drafter methods whose spec names none
    selection: str = "greedy"  # dcoco's selection rule when the spec names none


@dataclass(frozen=True)
class MethodSpec:
    method: str
    selection: str | None = None
    checkpoint: str | None = None


def method_names() -> tuple[str, ...]:
    return ("plain", "pld", *DRAFTER_METHODS)


def parse_method(spec: str) -> MethodSpec:
    """Parse `METHOD[:SELECTION][@CHECKPOINT]`, with a clear error for anything else."""
    head, _, checkpoint = spec.strip().partition("@")
    method, _, selection = head.partition(":")
    if method not in method_names():
        raise DcocoError(f"unknown method '{method}': choose one of {', '.join(method_names())}")
    if selection and method != "dcoco":
        raise DcocoError(f"'{spec}': only dcoco takes a selection rule (dcoco:greedy)")
    if selection and selection not in SELECTION_RULES:
        raise DcocoError(
            f"'{spec}': unknown selection '{selection}': choose one of {', '.join(SELECTION_RULES)}"
        )
    if checkpoint and method not in DRAFTER_METHODS:
        raise DcocoError(f"'{spec}': {method} takes no checkpoint")
    return MethodSpec(method, selection or None, checkpoint or None)


def check_method(spec: str) -> str:
    parse_method(spec)
    return spec.strip()


def default_drafter_dir(target: TargetModel, kind: str = "dflash") -> Path:
    return checkpoints_dir() / target.name / kind


def checkpoint_dir(spec: MethodSpec, target: TargetModel, options: MethodOptions) -> Path:
    """Where a drafter method's checkpoint is: a path, a shipped name, or the default."""
    if spec.checkpoint:
        path = Path(spec.checkpoint)
        shipped = default_drafter_dir(target, spec.checkpoint)
        return path if path.exists() or not shipped.exists() else shipped
    if options.drafter:
        return Path(options.drafter)
    catalogued = default_checkpoint(default_drafter_dir(target, ""), spec.method)
    name = catalogued or DEFAULT_CHECKPOINT.get(spec.method, spec.method)
    return default_drafter_dir(target, name)


def build_proposer(method: str, target: TargetModel, options: MethodOptions) -> Proposer | None:
    spec = parse_method(method)
    if spec.method == "plain":
        return None
    if spec.method == "pld":
        return PromptLookupProposer(num_draft_tokens=options.num_draft_tokens or 8)
    from dcoco.decode.dflash_proposer import DFlashProposer
    from dcoco.decode.head_proposer import HeadProposer
    from dcoco.decode.hybrid_proposer import HybridProposer
    from dcoco.models.drafter_io import load_drafter, stored_slot_accuracy
    from dcoco.models.head_io import head_kind_of, load_head

    path = checkpoint_dir(spec, target, options)
    if not path.exists():
        raise DcocoError(
            f"no checkpoint for {method} at {path}: pass METHOD@DIR or --drafter DIR (train one "
            "with `dcoco train-drafter` / `dcoco train-corrector`)"
        )
    drafter = load_drafter(path, target)
    num_draft_tokens = options.num_draft_tokens or None
    prior = stored_slot_accuracy(path)
    if spec.method in ("dflash", "pld-dflash"):
        drafter = _matmul_like_target(drafter, target)
        proposer = DFlashProposer(
            drafter, num_draft_tokens=num_draft_tokens, acceptance_prior=prior
        )
        return proposer if spec.method == "dflash" else HybridProposer(proposer)
    kind = head_kind_of(path)
    if kind != spec.method:
        raise DcocoError(
            f"{path} carries {'no draft head' if kind is None else f'a {kind} head'}, not the "
            f"{spec.method} head that '{method}' needs"
        )
    head = load_head(path, target, drafter)
    drafter = _matmul_like_target(drafter, target)  # after the head, which may read its weights
    selection = (spec.selection or options.selection) if spec.method == "dcoco" else None
    return HeadProposer(
        drafter, head, num_draft_tokens, name=method, selection=selection, acceptance_prior=prior
    )


def _matmul_like_target(drafter, target: TargetModel):
    """The drafter's linear layers on the target's matmul kernel (its head is the target's own);
    the draft heads keep aten's, as they read their weights directly."""
    if target.matmul == "onednn":
        pack_linears(drafter)
    return drafter
