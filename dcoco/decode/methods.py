"""Decoding methods by name: each maps to a proposer for the one engine (`plain` has none)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dcoco import REPO_ROOT
from dcoco.decode.proposers import PromptLookupProposer, Proposer
from dcoco.errors import DcocoError
from dcoco.models.target import TargetModel

SHIPPED_CHECKPOINTS = REPO_ROOT / "checkpoints"


@dataclass
class MethodOptions:
    num_draft_tokens: int = 0  # 0 = the method's default (pld: 8; drafters: block_size - 1)
    drafter: str = ""  # drafter checkpoint dir; empty = the one shipped for the target


def method_names() -> tuple[str, ...]:
    return ("plain", "pld", "dflash")


def check_method(method: str) -> str:
    if method not in method_names():
        raise DcocoError(f"unknown method '{method}': choose one of {', '.join(method_names())}")
    return method


def default_drafter_dir(target: TargetModel, kind: str = "dflash") -> Path:
    return SHIPPED_CHECKPOINTS / target.name / kind


def build_proposer(method: str, target: TargetModel, options: MethodOptions) -> Proposer | None:
    check_method(method)
    if method == "plain":
        return None
    if method == "pld":
        return PromptLookupProposer(num_draft_tokens=options.num_draft_tokens or 8)
    if method == "dflash":
        from dcoco.decode.dflash_proposer import DFlashProposer
        from dcoco.models.drafter_io import load_drafter

        path = Path(options.drafter) if options.drafter else default_drafter_dir(target)
        if not path.exists():
            raise DcocoError(
                f"no drafter checkpoint at {path}: pass --drafter DIR (train one with "
                "`dcoco train-drafter`)"
            )
        drafter = load_drafter(path, target)
        return DFlashProposer(drafter, num_draft_tokens=options.num_draft_tokens or None)
    raise AssertionError(f"method '{method}' is listed but not built")
