"""Decoding methods by name: each maps to a proposer for the one engine (`plain` has none).

A method spec is `METHOD[:SELECTION][@CHECKPOINT]`:
- METHOD: plain | pld | dflash | dcoco | dspark | domino | pld-dflash (prompt lookup where the
  context has an n-gram match, the dflash drafter elsewhere);
- SELECTION (dcoco only): the corrector's selection rule, greedy | keep1 | global | discounted |
  top1, optionally /K to walk only the drafter's top K candidates per slot (greedy/4);
- CHECKPOINT (drafter methods): a checkpoint directory, or the name of one shipped under
  `checkpoints/<target>/`; by default the method's default in that directory's catalogue
  (dcoco.models.drafter.catalogue), else the one named like the method.
The whole spec names the method in reports, so `dcoco@dcoco-dropin` and `dcoco` sit side by side.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from dcoco.decode.auto_draft import measured_setting
from dcoco.decode.draft_precision import (
    check_draft_block,
    drafter_product,
    load_proposer_drafter,
    pack_drafter,
)
from dcoco.decode.proposers import PromptLookupProposer, Proposer
from dcoco.errors import DcocoError
from dcoco.models.drafter.catalogue import default_checkpoint
from dcoco.models.drafter.draft_vocab import RANKING_FILE, parse_draft_vocab, read_ranking
from dcoco.models.drafter.drafter_io import CONFIG_FILE, read_drafter_config
from dcoco.models.heads.head_io import HEAD_KEY, head_kind_of
from dcoco.models.heads.selection import check_selection, split_selection
from dcoco.models.target.target import TargetModel
from dcoco.paths import checkpoints_dir

DRAFTER_METHODS = ("dflash", "dcoco", "dspark", "domino", "pld-dflash")
HEAD_METHODS = ("dcoco", "dspark", "domino")  # a drafter with this draft head
PLD_SLOTS = 8  # prompt lookup's most draft tokens per cycle
# Without a catalogue: methods whose default checkpoint is named otherwise than the method.
DEFAULT_CHECKPOINT = {"pld-dflash": "dflash"}


@dataclass
class MethodOptions:
    num_draft_tokens: int = 0  # 0 = the method's most (pld: 8; drafters: block_size - 1)
    drafter: str = ""  # checkpoint dir for drafter methods whose spec names none
    selection: str = "greedy"  # dcoco's selection rule when the spec names none
    draft_dtype: str = "auto"  # the drafter's precision (dcoco.decode.draft_precision)
    draft_vocab: str = "auto"  # the drafter's head rows (dcoco.models.drafter.draft_vocab)
    draft_block: str = "drafted"  # drafted | full: the rows a draft pass runs (BlockDrafter.draft)
    compile_head: bool = (
        False  # the DCOCO corrector's pick compiled (dcoco.models.heads.head_compile)
    )
    sampled_drafts: bool = False  # sampled requests draw drafts (dcoco.decode.sampled_drafts)
    # dcoco corrects at a draft length only while it pays (dcoco.decode.correction_gate)
    correction_gate: bool = False


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
    if selection:
        try:
            check_selection(selection)
        except DcocoError as error:
            raise DcocoError(f"'{spec}': {error}") from error
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


@dataclass(frozen=True)
class ResolvedMethod:
    """A method spec checked against its checkpoint's config (no weights loaded): the engine,
    `heldout` and `dcoco serve` all build from this, so a spec means the same everywhere."""

    spec: MethodSpec
    path: Path | None  # the checkpoint directory (drafter methods); None for plain and pld
    head_kind: str | None  # the draft head the checkpoint carries, if any
    max_slots: int  # most draft tokens a cycle takes (drafter: block_size - 1; pld: 8 or as asked)
    selection: str | None  # dcoco's selection rule (the spec's, else the options'); else None

    def draft_slots(self, requested: int) -> int:
        """Draft tokens per cycle for a requested number (0 = the most), within the limit."""
        return min(requested or self.max_slots, self.max_slots)


def resolve_method(method: str, target, options: MethodOptions, serving: bool = False):
    """`method` checked as one place: its syntax, its checkpoint (present, carrying the head the
    method needs; `serving`: a drafter method also refuses a checkpoint with a head, since vLLM
    builds whatever head a checkpoint carries), its draft-slot limit and its selection rule.
    `target` needs only `.name`."""
    spec = parse_method(method)
    if spec.method == "plain":
        return ResolvedMethod(spec, None, None, 0, None)
    if spec.method == "pld":  # no model bounds lookup: it drafts as many as asked
        return ResolvedMethod(spec, None, None, options.num_draft_tokens or PLD_SLOTS, None)
    path = checkpoint_dir(spec, target, options).expanduser()
    if not (path / CONFIG_FILE).is_file():
        raise DcocoError(
            f"no checkpoint for {method} at {path}: pass METHOD@DIR or --drafter DIR (train one "
            "with `dcoco train-drafter` / `dcoco train-corrector`)"
        )
    drafter_config, _ = read_drafter_config(path)
    kind = head_kind_of(path)
    if spec.method in HEAD_METHODS and kind != spec.method:
        raise DcocoError(
            f"{path} carries {'no draft head' if kind is None else f'a {kind} head'}, not the "
            f"{spec.method} head that '{method}' needs"
        )
    if serving and spec.method not in HEAD_METHODS and kind is not None:
        raise DcocoError(f"{path} holds a {kind} head: serve it with --method {kind}")
    selection = (spec.selection or options.selection) if spec.method == "dcoco" else None
    if selection:
        _check_candidates(method, path, selection)
    return ResolvedMethod(spec, path, kind, drafter_config.block_size - 1, selection)


def _check_candidates(method: str, path: Path, selection: str) -> None:
    """RULE/K walks at most the candidates the corrector was trained on."""
    walked = split_selection(check_selection(selection))[1]
    trained = (read_drafter_config(path)[1].get(HEAD_KEY) or {}).get("top_k")
    if walked and trained and walked > trained:
        raise DcocoError(
            f"'{method}': selection '{selection}' walks {walked} candidates, but the corrector at "
            f"{path} was trained on the top {trained}"
        )


def draft_vocab_ids(setting: str, target_name: str, vocab_size: int):
    """The token ids [N] the drafter's head keeps under `--draft-vocab setting`, from the ranking
    shipped beside the checkpoints of `target_name` (a vocabulary of `vocab_size`); None for every
    row (`full`, a size covering the vocab, or `auto` for a target that ships no ranking)."""
    size = parse_draft_vocab(setting)
    directory = checkpoints_dir() / target_name
    if size is None or size >= vocab_size:
        return None
    if setting == "auto" and not (directory / RANKING_FILE).is_file():
        return None
    return read_ranking(directory, vocab_size)[:size]


def _vocab_ids(options: MethodOptions, target: TargetModel):
    return draft_vocab_ids(options.draft_vocab, target.name, target.info.vocab_size)


def _measured_draft_dtype(method: str, path: Path, target: TargetModel,
                          options: MethodOptions) -> str:  # fmt: skip
    """`--draft-dtype auto`: the setting whose pass of this drafter measured fastest here
    (dcoco.decode.auto_draft), each candidate built as this method with its head uncompiled."""
    config, raw = read_drafter_config(path)
    key = {"drafter": raw, "draft_vocab": options.draft_vocab, "draft_block": options.draft_block}

    def build(setting: str) -> Proposer:
        uncompiled = replace(options, draft_dtype=setting, compile_head=False)
        return build_proposer(method, target, uncompiled)

    return measured_setting(target, config, key, build, label=f"{method}'s drafter")


def build_proposer(method: str, target: TargetModel, options: MethodOptions) -> Proposer | None:
    resolved = resolve_method(method, target, options)
    spec, path = resolved.spec, resolved.path
    if spec.method == "plain":
        return None
    if spec.method == "pld":
        return PromptLookupProposer(num_draft_tokens=resolved.draft_slots(options.num_draft_tokens))
    from dcoco.decode.dflash_proposer import DFlashProposer
    from dcoco.decode.head_proposer import HeadProposer
    from dcoco.decode.hybrid_proposer import HybridProposer
    from dcoco.models.drafter.drafter_io import stored_slot_accuracy
    from dcoco.models.heads.head_io import load_head

    draft_dtype = options.draft_dtype
    if draft_dtype == "auto":
        draft_dtype = _measured_draft_dtype(method, path, target, options)
    drafter = load_proposer_drafter(path, target, draft_dtype)
    product = drafter_product(draft_dtype, target, drafter.config)
    drafter.drafted_rows_only = check_draft_block(options.draft_block) == "drafted"
    num_draft_tokens = options.num_draft_tokens or None
    prior = stored_slot_accuracy(path)
    if spec.method in ("dflash", "pld-dflash"):
        drafter = pack_drafter(drafter, target, product)
        drafter.use_draft_vocab(_vocab_ids(options, target), product)
        proposer = DFlashProposer(
            drafter, num_draft_tokens, prior, sampled_drafts=options.sampled_drafts
        )
        return proposer if spec.method == "dflash" else HybridProposer(proposer)
    head = load_head(path, target, drafter, drafter.dtype)
    drafter = pack_drafter(drafter, target, product)  # after the head, which may read its weights
    drafter.use_draft_vocab(_vocab_ids(options, target), product)
    return HeadProposer(
        drafter,
        head,
        num_draft_tokens,
        name=method,
        selection=resolved.selection,
        acceptance_prior=prior,
        compile_head=options.compile_head,
        sampled_drafts=options.sampled_drafts,
        correction_gate=options.correction_gate,
    )
