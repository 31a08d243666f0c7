"""`dcoco train-drafter`: train a DFlash block drafter on the target's own replies.

The loss is the decayed, same-position cross-entropy of the mask slots (dcoco/train/blocks.py
holds the block rules; dcoco/train/loop.py the loop). The drafter sees exactly the inference math:
one BlockDrafter.forward, here with a block-diagonal mask.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from dcoco import REPO_ROOT
from dcoco.config import add_config_args, config_from_args
from dcoco.data.distill import Sample
from dcoco.errors import DcocoError
from dcoco.models.loading import DEFAULT_TARGET
from dcoco.train.loop import run_training

# The shared corpus sits beside the checkout (resolved from the package, not the cwd).
DEFAULT_CORPUS = REPO_ROOT.parent / "shared" / "data" / "distill" / "smollm2-135m-instruct"


@dataclass
class DrafterTrainConfig:
    target: str = DEFAULT_TARGET
    corpus: str = str(DEFAULT_CORPUS)
    out: str = "runs/drafter"
    num_layers: int = 2
    block_size: int = 16
    mask_token_id: int = 16
    taps: tuple[int, ...] = ()
    gamma: float = 7.0
    lr: float = 6e-4
    weight_decay: float = 0.0
    warmup_ratio: float = 0.04
    grad_clip: float = 1.0
    epochs: int = 1
    max_steps: int = 0
    batch_size: int = 4
    anchors_per_seq: int = 32
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
    loss_vocab: int = 0
    anchor_chunk: int = 32

    def __post_init__(self) -> None:
        positive = [
            "num_layers",
            "batch_size",
            "anchors_per_seq",
            "eval_every",
            "save_every",
            "anchor_chunk",
        ]
        bad = [name for name in positive if getattr(self, name) < 1]
        if bad or self.block_size < 2 or self.gamma <= 0 or self.lr <= 0:
            raise DcocoError(
                f"bad training settings: {', '.join(bad) or 'block size/gamma/lr'} out of range "
                "(counts must be >= 1, block size >= 2, gamma and lr > 0)"
            )


HELPS = {
    "target": "embedded target name or Hugging Face model directory",
    "corpus": "directory of part-*.jsonl distillation records",
    "out": "run directory (log, ckpt/ for resuming, drafter/ at the end)",
    "num_layers": "draft layers",
    "mask_token_id": "target vocab row used as the MASK input (an id the target never emits)",
    "taps": "target layers to tap, comma-separated; empty = DFlash's rule with 3 taps",
    "gamma": "slot loss decay: w_k = exp(-(k-1)/gamma)",
    "epochs": "passes over the training split (ignored when --max-steps > 0)",
    "max_steps": "stop after this many optimizer steps; 0 = run the epochs",
    "batch_size": "sequences per optimizer step",
    "anchors_per_seq": "blocks sampled per sequence per step",
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
    "feature_cache": "directory to keep target features in (bf16); empty = recompute",
    "init": "start from this drafter checkpoint (its shape overrides the shape flags)",
    "loss_vocab": "train the loss over the N most frequent reply tokens of the corpus (a CPU "
    "speed-up: the full head is most of a step); 0 = the full vocabulary. Evaluation and "
    "decoding always use the full vocabulary",
    "anchor_chunk": "blocks per drafter forward (attention cost grows with its square)",
}


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "train-drafter",
        help="train a DFlash block drafter for a target",
        description="Train a DFlash block drafter on the target's own replies. Writes "
        "<out>/train_log.jsonl, a resumable <out>/ckpt/ (rerun with the same --out to continue) "
        "and finally <out>/drafter/ (config.json, model.safetensors, provenance.json).",
    )
    add_config_args(parser, DrafterTrainConfig, HELPS)
    parser.set_defaults(handler=run)


def run(args) -> int:
    result = train(config_from_args(DrafterTrainConfig, args))
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
    return run_training(config, target, samples, progress_bar, head_setup=None)


if __name__ == "__main__":
    from dcoco.cli import main

    sys.exit(main(["train-drafter", *sys.argv[1:]]))
