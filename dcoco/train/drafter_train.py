"""`dcoco train-drafter`: train a DFlash block drafter on the target's own replies.

The loss is the decayed, same-position cross-entropy of the mask slots (dcoco/train/blocks.py
holds the block rules; dcoco/train/loop.py the loop). The drafter sees exactly the inference math:
one BlockDrafter.forward, here with a block-diagonal mask.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from pathlib import Path

from dcoco import paths
from dcoco.config import Command
from dcoco.data.distill import Sample
from dcoco.errors import DcocoError
from dcoco.models.target.loading import DEFAULT_TARGET, EMBEDDED_TARGETS
from dcoco.train.loop import run_training


@dataclass
class DrafterTrainConfig:
    target: str = DEFAULT_TARGET
    corpus: str = ""
    out: str = "runs/drafter"
    num_layers: int = 2
    block_size: int = 8
    mask_token_id: int = -1
    taps: tuple[int, ...] = ()
    gamma: float = 4.0
    lr: float = 6e-4
    weight_decay: float = 0.0
    warmup_ratio: float = 0.02
    grad_clip: float = 1.0
    epochs: int = 1
    max_steps: int = 0
    batch_size: int = 1
    anchors_per_seq: int = 32
    anchor_stride: int = 4
    context_window: int = 0
    window_doubling_steps: int = 500
    max_seq_len: int = 1024
    max_records: int = 0
    seed: int = 0
    target_dtype: str = "fp32"
    device: str = ""
    autocast: bool = False
    eval_every: int = 100
    heldout: int = 32
    save_every: int = 50
    threads: int = 0
    feature_cache: str = ""
    init: str = ""
    init_from_target: bool = False
    add_layers: int = 0
    loss_vocab: int = 16000
    anchor_chunk: int = 32
    records_per_forward: int = 1
    copy_hints: bool = False
    copy_gate: bool = False
    mix_corpus: str = ""
    mix_share: float = 0.5
    cache_parts: int = 0

    def __post_init__(self) -> None:
        positive = [
            "num_layers",
            "batch_size",
            "anchors_per_seq",
            "eval_every",
            "save_every",
            "anchor_chunk",
            "records_per_forward",
            "window_doubling_steps",
        ]
        bad = [name for name in positive if getattr(self, name) < 1]
        if not 0 < self.mix_share <= 1:
            raise DcocoError(f"--mix-share must be in (0, 1], got {self.mix_share}")
        if self.add_layers and not self.init:
            raise DcocoError("--add-layers grows an --init drafter: pass the checkpoint to grow")
        if bad or self.block_size < 2 or self.gamma <= 0 or self.lr <= 0:
            raise DcocoError(
                f"bad training settings: {', '.join(bad) or 'block size/gamma/lr'} out of range "
                "(counts must be >= 1, block size >= 2, gamma and lr > 0)"
            )


HELPS = {
    "target": "embedded target name or Hugging Face model directory",
    "corpus": "directory of part-*.jsonl distillation records; empty = the target's corpus "
    "under the shared data (dcoco.paths)",
    "out": "run directory (log, ckpt/ for resuming, drafter/ at the end)",
    "num_layers": "draft layers",
    "block_size": "tokens per block: the anchor plus block_size - 1 draft slots",
    "lr": "peak learning rate (AdamW; warmup, then cosine decay)",
    "weight_decay": "AdamW weight decay",
    "warmup_ratio": "share of the steps spent warming the learning rate up",
    "grad_clip": "clip the gradient norm to this",
    "seed": "seed of the init, the batch order and the anchors (with --anchor-stride, the first "
    "epoch's offset: a later stage with another seed trains on positions its init did not)",
    "mask_token_id": "target vocab row used as the MASK input (an id the target never emits); "
    "-1 = the target's own (dcoco.models.target.loading.EMBEDDED_TARGETS)",
    "taps": "target layers to tap, comma-separated; empty = the target's own, else DFlash's rule "
    "with 3 taps",
    "gamma": "slot loss decay: w_k = exp(-(k-1)/gamma)",
    "epochs": "passes over the training split (ignored when --max-steps > 0)",
    "max_steps": "stop after this many optimizer steps; 0 = run the epochs",
    "batch_size": "sequences per optimizer step (under torchrun: over all processes together)",
    "anchors_per_seq": "blocks sampled per sequence per step (random anchors; held-out blocks "
    "always use this rule)",
    "anchor_stride": "dense anchors: every N-th reply position is an anchor, shifted by one each "
    "epoch so every position serves once per N epochs; 0 = --anchors-per-seq random anchors",
    "context_window": "curriculum: training blocks first see only their last N context positions, "
    "so the attention finds the anchor's neighbourhood before the whole context dilutes it; 0 = "
    "the whole context from the start (evaluation and decoding always see all of it)",
    "window_doubling_steps": "steps after which the curriculum's context window doubles",
    "max_seq_len": "cut sequences (prompt + response) to this many tokens",
    "max_records": "read at most this many corpus records; 0 = all",
    "target_dtype": "frozen target dtype (fp32, bf16, fp16); CPUs without AVX512-BF16/AMX run bf16 "
    "matmuls 50-100x slower than fp32",
    "device": "cpu or cuda; empty = cuda when available",
    "autocast": "bf16 autocast for the drafter (fp32 master weights); a win only where bf16 "
    "matmuls are fast (GPU, AMX)",
    "eval_every": "steps between held-out evaluations",
    "heldout": "held-out sequences (chosen by hash of id) for the acceptance estimate",
    "save_every": "steps between resumable checkpoints",
    "threads": "torch CPU threads; 0 = torch's default",
    "feature_cache": "root of the target-feature cache (memory-mapped bf16 shards per corpus "
    "part, built where missing); empty = the cache dir ($DCOCO_CACHE_DIR); off = recompute "
    "every step",
    "init": "start from this drafter checkpoint (its shape overrides the shape flags; see "
    "--add-layers)",
    "init_from_target": "start a fresh drafter from the target's last layers, final norm and "
    "deepest tap (dcoco.train.warm_start) instead of a random init",
    "add_layers": "append N layers to the --init drafter, their residual writes zeroed so training "
    "starts from its exact function (dcoco.train.grow): more capacity without redoing its training",
    "loss_vocab": "train the loss over the N most frequent reply tokens of the corpus (a CPU "
    "speed-up: the full head is most of a step); 0 = the full vocabulary. Evaluation and "
    "decoding always use the full vocabulary",
    "anchor_chunk": "blocks of each record per drafter forward (attention cost grows with its "
    "square)",
    "records_per_forward": "records side by side in one drafter forward (a batch, padded to the "
    "longest); a step's --batch-size records accumulate gradients over their forwards. Raise it "
    "where one record's blocks leave the device idle (a GPU)",
    "copy_hints": "fill the mask slots with prompt lookup's tokens where it has a match "
    "(dcoco.models.drafter.copy_hints), so the drafter learns when to copy; with --init, turns "
    "them on for the init's weights. vLLM runs such a drafter through dcoco's plugin (dcoco serve)",
    "mix_corpus": "a second corpus trained on beside --corpus (e.g. the target's sampled replies, "
    "`dcoco datagen --temperature 1`; dcoco.train.corpus_mix): its ids must differ from the "
    "corpus's, records answering a held-out prompt are dropped; a leading $DCOCO_CACHE_DIR is "
    "the cache dir; empty = none",
    "mix_share": "the mix corpus's share of the training records: the corpus's records are "
    "subsampled (a fixed random subset) to leave it this share, or all kept",
    "cache_parts": "train on the first n corpus parts only (0 = all): runs compare on the same "
    "blocks while the corpus grows",
    "copy_gate": "add a learnt bonus to each hinted slot's hint logit, read from the slot's hidden "
    "state and zero at the start (implies --copy-hints; with --init, added to the init's weights)",
}


def run(config: DrafterTrainConfig) -> int:
    result = train(config)
    summary = f"dcoco: drafter -> {result['drafter']} after {result['steps']} steps"
    if result["final"]:
        summary += f"; held-out acceptance length {result['final']['accept']:.2f}"
    print(summary, file=sys.stderr)
    return 0


def train(
    config: DrafterTrainConfig,
    target=None,
    samples: list[Sample] | None = None,
    progress_bar: bool = True,
) -> dict:
    """Train (or resume) a drafter as `config` says; returns the held-out metrics and paths.

    `target` (a TargetModel) and `samples` replace loading `config.target` and `config.corpus`.
    """
    return run_training(with_target_defaults(config, target), target, samples, progress_bar, None)


def with_target_defaults(config: DrafterTrainConfig, target=None) -> DrafterTrainConfig:
    """`config` with what its flags left to the target filled in: the corpus, and the mask id
    and taps of the target's registry entry. An `--init` checkpoint brings its own mask id."""
    name = target.name if target is not None else Path(config.target).name
    entry = EMBEDDED_TARGETS.get(name)
    changes: dict = {}
    if not config.corpus:
        changes["corpus"] = str(paths.default_corpus(name))
    if not config.taps and entry is not None:
        changes["taps"] = entry.taps
    if config.mask_token_id < 0 and not config.init:
        if entry is None:
            raise DcocoError(
                f"target '{name}' has no default mask token: pass --mask-token-id, an unused row "
                "of its vocab"
            )
        changes["mask_token_id"] = entry.mask_token_id
    return replace(config, **changes)


# What `--help` shows; the rest (ablations, tuning) is under `--help-all`.
RUN_FLAGS = ("target", "corpus", "out", "init", "max_steps", "lr", "batch_size", "seed",
             "threads", "target_dtype", "autocast", "eval_every", "save_every", "heldout",
             "cache_parts")  # fmt: skip
MAIN_FLAGS = (*RUN_FLAGS, "num_layers", "block_size", "epochs", "device", "copy_hints",
              "copy_gate", "feature_cache")  # fmt: skip

COMMAND = Command(
    "train-drafter",
    "train a DFlash block drafter for a target",
    DrafterTrainConfig,
    run,
    description="Train a DFlash block drafter on the target's own replies. Writes "
    "<out>/train_log.jsonl, a resumable <out>/ckpt/ (rerun with the same --out to continue) "
    "and finally <out>/drafter/ (config.json, model.safetensors, provenance.json).",
    helps=HELPS,
    main_flags=MAIN_FLAGS,
)
