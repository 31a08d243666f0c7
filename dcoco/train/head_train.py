"""`dcoco train-corrector`: train a draft head (the DCOCO corrector, or a DSpark/Domino-style
sequential head) on top of a drafter checkpoint.

Two modes:
- `joint`: drafter and head train together (drafter loss + head loss), starting from `--init`;
- `dropin`: the drafter is frozen and only the head trains, so it drops into an existing drafter.

The head's loss is its own (dcoco.models.heads.base): for DCOCO the cross-entropy over the K x K
transitions of adjacent slots, labelled with the target's own token pair. For a fair baseline
train the plain drafter for the same steps with `dcoco train-drafter --init` on the same flags.
The result is `<out>/<head kind>/`, a drafter checkpoint that carries the head. An `--init` that
carries a head of the same kind (a shipped `dcoco-joint`, say) starts the head from it too, so a
run trains both on; its settings must match the flags.
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

from dcoco.config import Command
from dcoco.data.bigram import successor_log_probs
from dcoco.data.distill import Sample, corpus_parts, load_corpus, read_part, split_heldout
from dcoco.errors import DcocoError
from dcoco.models.drafter.drafter_io import WEIGHTS_FILE
from dcoco.models.heads.head_io import continue_head
from dcoco.models.heads.head_registry import build_head, head_classes, head_kinds
from dcoco.train.cached_head_train import train_from_cache
from dcoco.train.corrector_cache import drafter_path
from dcoco.train.distributed import under_torchrun
from dcoco.train.drafter_train import HELPS, RUN_FLAGS, DrafterTrainConfig, with_target_defaults
from dcoco.train.loop import run_training
from dcoco.train.run_state import HeadSetup

MODES = ("joint", "dropin")
# Head sizes whose flag value 0 means "the head's own default" (its width differs per head kind).
HEAD_DEFAULT_SIZES = ("mlp_hidden", "rank", "state_size")


@dataclass
class HeadTrainConfig(DrafterTrainConfig):
    out: str = "runs/corrector"
    head: str = "dcoco"
    mode: str = "joint"
    head_loss_weight: float = 1.0
    head_lr: float = 0.0
    top_k: int = 16
    mlp_hidden: int = 0
    use_pair_state: bool = True
    use_candidate_repr: bool = True
    rank: int = 0
    gated: bool = False
    state_size: int = 0
    lambda_warm: float = 1.0
    features: str = "logit"
    successor_query: bool = False
    anchor: bool = False
    loss: str = "pairs"
    count_pairs: bool = False
    corrector_cache: bool = False
    cache_stride: int = 8
    cache_build: bool = True
    blocks_per_step: int = 256

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.head not in head_kinds():
            raise DcocoError(f"unknown head '{self.head}': choose one of {', '.join(head_kinds())}")
        if self.mode not in MODES:
            raise DcocoError(f"unknown mode '{self.mode}': choose one of {', '.join(MODES)}")
        if not self.init:
            raise DcocoError("train-corrector needs --init: the drafter checkpoint to start from")
        if self.corrector_cache and self.mode != "dropin":
            raise DcocoError("--corrector-cache trains a drop-in head only (--mode dropin)")
        if self.count_pairs and self.head != "dcoco":
            raise DcocoError("--count-pairs is a dcoco corrector option")
        if self.count_pairs and self.cache_parts <= 0:
            raise DcocoError(
                "--count-pairs needs --cache-parts N: the pairs are counted on the parts after "
                "the first N, which it does not train on (counts of its own training replies "
                "would hand it the labels)"
            )
        if self.cache_stride < 1 or self.blocks_per_step < 1:
            raise DcocoError("--cache-stride and --blocks-per-step must be >= 1")

    def head_fields(self, drafter) -> dict:
        """The head's config fields: shapes from the drafter, 0-valued sizes left to defaults."""
        config_class, _ = head_classes(self.head)
        known = {f.name for f in dataclasses.fields(config_class)}
        fields = {
            "hidden_size": drafter.config.hidden_size,
            "vocab_size": drafter.config.vocab_size,
            **{f.name: getattr(self, f.name) for f in dataclasses.fields(HeadTrainConfig)},
        }
        return {
            name: value
            for name, value in fields.items()
            if name in known and not (name in HEAD_DEFAULT_SIZES and value == 0)
        }


HEAD_HELPS = {
    **HELPS,
    "out": "run directory (log, ckpt/ for resuming, <head>/ at the end)",
    "head": f"head kind: {', '.join(head_kinds())}",
    "mode": "joint: drafter + head train together; dropin: frozen drafter, head only",
    "head_loss_weight": "head loss relative to the drafter loss (joint mode)",
    "head_lr": "the head's peak learning rate; 0 = --lr (joint mode: the drafter keeps --lr)",
    "top_k": "dcoco: candidates per slot (K)",
    "mlp_hidden": "dcoco/domino: MLP width; 0 = the head's default",
    "use_pair_state": "dcoco: the pair state s_p (ablation: --no-use-pair-state)",
    "use_candidate_repr": "dcoco: token embedding in the candidate representation (ablation: "
    "--no-use-candidate-repr)",
    "rank": "dspark: rank of the Markov bias; 0 = the head's default",
    "gated": "dspark: gate the previous-token embedding by the slot's hidden state",
    "state_size": "domino: GRU state size; 0 = the head's default",
    "lambda_warm": "domino: weight of the base-logit loss at the start (decays to 0)",
    "features": "dcoco: candidate features, logit (L only) or normalised (log p, p, gap to top-1, "
    "rank, is-top-1)",
    "successor_query": "dcoco: add the bilinear successor term <q(s_p, z_a), E[b]>",
    "anchor": "dcoco: re-select slot 1 from the anchor token (start scores)",
    "loss": "dcoco: pairs (one softmax over K x K) or conditional (K-way per row, given the "
    "target's token at the previous slot)",
    "count_pairs": "dcoco: read counted log P(b | a) of adjacent reply tokens, counted on the "
    "corpus parts after --cache-parts (shipped in the checkpoint)",
    "corrector_cache": "drop-in only: train from the frozen drafter's cached outputs over the "
    "whole corpus (built once under the cache dir)",
    "cache_stride": "with --corrector-cache: every n-th reply position is a cached block",
    "cache_build": "with --corrector-cache: build missing shards first (--no-cache-build: train "
    "on the shards built so far)",
    "cache_parts": HELPS["cache_parts"] + ", and --count-pairs counts the parts after them",
    "blocks_per_step": "with --corrector-cache: blocks per optimizer step",
    "init": "the drafter checkpoint to start from (required)",
}


def run(config: HeadTrainConfig) -> int:
    result = train(config)
    summary = f"dcoco: head checkpoint -> {result['drafter']} after {result['steps']} steps"
    if result["final"]:
        summary += f"; held-out acceptance length {result['final']['accept']:.2f}"
        summary += f" (drafter alone {result['final']['drafter_accept']:.2f})"
    print(summary, file=sys.stderr)
    return 0


def train(
    config: HeadTrainConfig,
    target=None,
    samples: list[Sample] | None = None,
    progress_bar: bool = True,
) -> dict:
    """Train (or resume) a head as `config` says; returns the held-out metrics and paths."""
    config = with_target_defaults(config, target)

    def build(drafter):
        fields = config.head_fields(drafter)
        table = None
        if config.count_pairs:
            table = successor_log_probs(count_records(config), drafter.config.vocab_size)
            fields["pair_counts"] = table[0].numel()
        head = build_head(config.head, fields, drafter._shared[0])
        if table is not None:
            head.pair_counts.fill(*table)
        init = init_dir(config)
        if init is not None and continue_head(head, init):  # trains on from the init's own head
            print(f"dcoco: {config.head} head continues from {init}", file=sys.stderr)
        return head

    if config.corrector_cache:
        if under_torchrun():
            raise DcocoError(
                "--corrector-cache trains in one process (its cache is the costly part and is "
                "built once); run it without torchrun"
            )
        return train_from_cache(config, build, target, progress_bar)
    setup = HeadSetup(
        build=build,
        train_drafter=config.mode == "joint",
        loss_weight=config.head_loss_weight,
        lr=config.head_lr,
    )
    return run_training(config, target, samples, progress_bar, head_setup=setup)


def init_dir(config: HeadTrainConfig) -> Path | None:
    """The --init checkpoint's directory (a path, or a name under checkpoints/<target>/)."""
    path = drafter_path(config.init, SimpleNamespace(name=config.target))
    return path if (path / WEIGHTS_FILE).is_file() else None


def count_records(config: HeadTrainConfig) -> list[Sample]:
    """The replies the pair counts come from: the corpus parts after the first `cache_parts`
    (the corrector trains on those), less the held-out split."""
    parts = corpus_parts(config.corpus)[config.cache_parts :]
    if not parts:
        raise DcocoError(f"--cache-parts {config.cache_parts} leaves no corpus part to count on")
    records = load_corpus(config.corpus)
    _, heldout = split_heldout(records, config.heldout)
    counted = {s.id for part in parts for s in read_part(part)} - {s.id for s in heldout}
    return [s for s in records if s.id in counted]


COMMAND = Command(
    "train-corrector",
    "train a draft head (dcoco corrector, dspark, domino) on a drafter",
    HeadTrainConfig,
    run,
    description="Train a draft head on top of a drafter checkpoint (--init), jointly with the "
    "drafter or as a drop-in over the frozen drafter. Writes <out>/train_log.jsonl, a resumable "
    "<out>/ckpt/ and finally <out>/<head>/ (drafter + head, provenance.json).",
    helps=HEAD_HELPS,
    main_flags=(
        *RUN_FLAGS,
        "head",
        "mode",
        "head_lr",
        "head_loss_weight",
        "top_k",
        "count_pairs",
        "corrector_cache",
    ),  # fmt: skip
)
