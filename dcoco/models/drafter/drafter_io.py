"""Drafter checkpoints: a directory with `config.json` + `model.safetensors`.

The layout is the DFlash one that vLLM's `qwen3_dflash` loads unchanged (`architectures:
["DFlashDraftModel"]`, the qwen3 fields, `block_size`, `dflash_config`); our own metadata (which
target it was trained on) lives under the `dcoco` key, which other loaders ignore. The target's
embedding and lm_head are not saved: they are shared with the target at load time.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from dcoco.errors import DcocoError
from dcoco.models.drafter.drafter import BlockDrafter
from dcoco.models.drafter.drafter_config import DrafterConfig, check_compatible

FORMAT_VERSION = 1
ARCHITECTURE = "DFlashDraftModel"
# A drafter that carries a draft head (dcoco.models.heads.head_io) names the head's architecture
# instead; vLLM only treats names starting with "DFlash" as DFlash drafters.
HEAD_ARCHITECTURES = {
    "dcoco": "DFlashDcocoDraftModel",
    "dspark": "DFlashDSparkDraftModel",
    "domino": "DFlashDominoDraftModel",
}
# A copy-hint drafter (DrafterConfig.copy_hints) without a head: vLLM must run it through our
# plugin, which feeds the hints (dcoco.serving.vllm.hints) and adds its copy gate's bonus.
COPY_ARCHITECTURE = "DFlashDcocoCopyDraftModel"
HEAD_PREFIX = "head."
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
TRAIN_LOG_FILE = "train_log.jsonl"  # shipped beside the weights; written by the trainers


def config_to_hf(config: DrafterConfig, target_info, extra: dict | None = None) -> dict:
    """The config.json dict: DFlash/qwen3 fields for vLLM, plus our metadata under `dcoco`."""
    return {
        "architectures": [COPY_ARCHITECTURE if config.copy_hints else ARCHITECTURE],
        "model_type": "qwen3",
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads,
        "num_key_value_heads": config.num_kv_heads,
        "head_dim": config.head_dim,
        "vocab_size": config.vocab_size,
        "hidden_act": "silu",
        "rms_norm_eps": config.rms_norm_eps,
        "max_position_embeddings": config.max_position_embeddings,
        # Both spellings: without rope_parameters vLLM falls back to qwen3's 1e6.
        "rope_theta": config.rope_theta,
        "rope_parameters": {"rope_theta": config.rope_theta, "rope_type": "default"},
        "attention_bias": False,
        "tie_word_embeddings": False,
        "block_size": config.block_size,
        "num_target_layers": config.num_target_layers,
        # Our tap i is the output of target layer i; vLLM adds the +1 itself.
        "dflash_config": {
            "mask_token_id": config.mask_token_id,
            "target_layer_ids": list(config.target_layer_ids),
        },
        "dcoco": {
            "format_version": FORMAT_VERSION,
            # read by dcoco.serving.vllm.hints: vLLM's DFlash proposer itself feeds MASK slots
            "copy_hints": config.copy_hints,
            "copy_gate": config.copy_gate,
            "target": {
                "name": target_info.name,
                "vocab_size": target_info.vocab_size,
                "hidden_size": target_info.hidden_size,
                "num_layers": target_info.num_layers,
                "fingerprint": target_info.fingerprint,
            },
            **(extra or {}),
        },
    }


def config_from_hf(hf: dict, where: str = CONFIG_FILE) -> DrafterConfig:
    """Read a DFlash config.json dict (ours or another DFlash checkpoint's)."""
    known = {ARCHITECTURE, COPY_ARCHITECTURE, *HEAD_ARCHITECTURES.values()}
    if not known & set(hf.get("architectures") or []) or "dflash_config" not in hf:
        raise DcocoError(f"{where} is not a DFlash drafter config (architectures/dflash_config)")
    rope = hf.get("rope_parameters") or {}
    try:
        dflash = hf["dflash_config"]
        return DrafterConfig(
            hidden_size=int(hf["hidden_size"]),
            intermediate_size=int(hf["intermediate_size"]),
            num_heads=int(hf["num_attention_heads"]),
            num_kv_heads=int(hf["num_key_value_heads"]),
            head_dim=int(hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"]),
            rms_norm_eps=float(hf["rms_norm_eps"]),
            rope_theta=float(rope.get("rope_theta", hf.get("rope_theta", 1e6))),
            max_position_embeddings=int(hf["max_position_embeddings"]),
            vocab_size=int(hf["vocab_size"]),
            mask_token_id=int(dflash["mask_token_id"]),
            target_layer_ids=tuple(int(t) for t in dflash["target_layer_ids"]),
            num_target_layers=int(hf["num_target_layers"]),
            num_layers=int(hf["num_hidden_layers"]),
            block_size=int(hf.get("block_size", 16)),
            copy_hints=bool((hf.get("dcoco") or {}).get("copy_hints", False)),
            copy_gate=bool((hf.get("dcoco") or {}).get("copy_gate", False)),
        )
    except (KeyError, TypeError, ValueError) as error:
        raise DcocoError(f"{where}: missing or bad drafter field ({error!r})") from error


def save_drafter(
    path: str | Path,
    drafter: BlockDrafter,
    target_info,
    dtype: torch.dtype = torch.bfloat16,
    extra: dict | None = None,
) -> Path:
    """Write `drafter` to directory `path` (created); `extra` goes under config.json's `dcoco`."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    weights = {
        name: tensor.detach().to(dtype).contiguous()
        for name, tensor in drafter.state_dict().items()
    }
    save_file(weights, path / WEIGHTS_FILE, metadata={"format": "pt"})
    hf = config_to_hf(drafter.config, target_info, extra)
    (path / CONFIG_FILE).write_text(json.dumps(hf, indent=2) + "\n")
    return path


def read_drafter_config(path: str | Path) -> tuple[DrafterConfig, dict]:
    """(config, raw config.json dict) of the checkpoint directory `path`."""
    path = Path(path)
    config_path = path / CONFIG_FILE
    if not path.is_dir():
        raise DcocoError(f"drafter checkpoint {path} does not exist")
    if not config_path.is_file():
        raise DcocoError(f"drafter checkpoint {path} has no {CONFIG_FILE}")
    try:
        hf = json.loads(config_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise DcocoError(f"{config_path} is not valid JSON ({error})") from error
    if not isinstance(hf, dict):
        raise DcocoError(f"{config_path} is not a JSON object")
    return config_from_hf(hf, str(config_path)), hf


def read_weights(path: str | Path, config: DrafterConfig, hf: dict, target) -> dict:
    """All tensors of checkpoint `path`, after checking that it fits `target`."""
    path = Path(path)
    stored = (hf.get("dcoco") or {}).get("target") or {}
    check_compatible(config, target.info, fingerprint=stored.get("fingerprint"))
    weights_path = path / WEIGHTS_FILE
    if not weights_path.is_file():
        raise DcocoError(f"drafter checkpoint {path} has no {WEIGHTS_FILE}")
    try:
        return load_file(weights_path)
    except (SafetensorError, OSError, ValueError) as error:
        raise DcocoError(f"{weights_path} is corrupt or truncated ({error})") from error


def load_weights_strict(module: torch.nn.Module, weights: dict, where: Path) -> None:
    """load_state_dict with an error that names what does not match."""
    expected = module.state_dict()
    missing = sorted(set(expected) - set(weights))
    unexpected = sorted(set(weights) - set(expected))
    wrong = sorted(n for n in expected if n in weights and weights[n].shape != expected[n].shape)
    if missing or unexpected or wrong:
        raise DcocoError(
            f"{where} does not match its config: missing {missing[:4]}, unexpected "
            f"{unexpected[:4]}, wrong shape {wrong[:4]}"
        )
    module.load_state_dict(weights)


def load_drafter(
    path: str | Path, target, dtype: torch.dtype | None = None, lm_head: nn.Module | None = None
) -> BlockDrafter:
    """Load the drafter in `path` for `target` (a TargetModel), in `dtype` (default: the
    target's), sharing the target's embedding and lm_head (or using `lm_head`, a copy of it that
    takes `dtype`)."""
    path = Path(path)
    config, hf = read_drafter_config(path)
    weights = read_weights(path, config, hf, target)
    # A draft head's weights share the file; dcoco.models.heads.head_io loads them.
    weights = {k: v for k, v in weights.items() if not k.startswith(HEAD_PREFIX)}
    head, head_dtype = (target.lm_head, None) if lm_head is None else (lm_head, dtype)
    drafter = BlockDrafter(config, target.embed_tokens, head, head_dtype)
    load_weights_strict(drafter, weights, path / WEIGHTS_FILE)
    return drafter.to(device=target.device, dtype=dtype or target.dtype).eval()


def stored_slot_accuracy(path: str | Path) -> tuple[float, ...]:
    """Per-slot held-out accuracy from the last eval in the checkpoint's training log; () when it
    has none (the `--num-draft-tokens auto` prior, see dcoco.decode.draft_length)."""
    log = Path(path) / TRAIN_LOG_FILE
    if not log.is_file():
        return ()
    accuracy: tuple[float, ...] = ()
    for line in log.read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue  # a torn last line of a log still being written
        if record.get("event") == "eval" and record.get("slot_acc"):
            accuracy = tuple(float(a) for a in record["slot_acc"])
    return accuracy
