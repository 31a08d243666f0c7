"""The view of a checkpoint that `dcoco serve` points vLLM at when the served drafter is not the
checkpoint as stored: a corrector selection rule (`dcoco:keep1`, `dcoco:greedy/4`) and/or a draft
vocabulary (`--draft-vocab`, dcoco.models.drafter.draft_vocab).

vLLM's worker builds the drafter from its directory alone (config.json and every *.safetensors in
it), so what differs travels inside one: a directory under the cache whose config.json is the
checkpoint's plus the rule and/or `draft_vocab_size`, with the checkpoint's files linked. A draft
vocabulary adds one weights file in the layout vLLM's DFlash drafter reads for one: the target's
LM head rows of the vocabulary (`lm_head.weight` [N, hidden]) and each row's offset to its token id
(`d2t` [N] = token id - row); vLLM keeps those rows as the drafter's own head and spreads its N
logits over the whole vocabulary, -inf elsewhere. The checkpoint itself is never written.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import Tensor

from dcoco import paths
from dcoco.errors import DcocoError
from dcoco.models.drafter.drafter_io import CONFIG_FILE
from dcoco.models.heads.head_compile import COMPILE_KEY
from dcoco.models.heads.head_io import HEAD_KEY, SELECTION_KEY

VOCAB_WEIGHTS_FILE = "draft-vocab-head.safetensors"
VOCAB_SIZE_KEY = "draft_vocab_size"  # vLLM's name (qwen3_dflash reads it from config.json)


@dataclass(frozen=True)
class ServedVocab:
    """A draft vocabulary for a served drafter: `token_ids` [N] of the target in `target_dir`."""

    token_ids: Tensor
    target_dir: Path


def served_vocab(setting: str, target_dir: Path, target_name: str) -> ServedVocab | None:
    """The draft vocabulary `--draft-vocab setting` gives the target in `target_dir` (its
    checkpoints filed under `target_name`), or None for every row: the ranking and sizes of
    `dcoco decode --draft-vocab` (dcoco.models.drafter.draft_vocab)."""
    from dcoco.decode.methods import draft_vocab_ids

    hf = json.loads((target_dir / "config.json").read_text())
    vocab_size = hf.get("vocab_size") or (hf.get("text_config") or {}).get("vocab_size")
    if not vocab_size:  # nothing to check a ranking against
        if setting in ("auto", "full"):
            return None
        raise DcocoError(f"{target_dir}/config.json names no vocab_size: pass --draft-vocab full")
    ids = draft_vocab_ids(setting, target_name, int(vocab_size))
    return None if ids is None else ServedVocab(ids, target_dir)


def served_view(
    path: Path,
    selection: str | None = None,
    vocab: ServedVocab | None = None,
    compile_head: bool = False,
) -> Path:
    """A view of checkpoint `path` whose config.json names the corrector's `selection` rule,
    whether the plugin compiles a draft head's pick (`compile_head`, where there is a head) and
    whose head is `vocab`'s rows of the target's (its other files linked): vLLM's worker builds
    the drafter from that directory; the checkpoint itself where none of these applies."""
    source = path.resolve()
    hf = json.loads((source / CONFIG_FILE).read_text())
    compile_head = compile_head and HEAD_KEY in hf
    token_ids = None if vocab is None else vocab.token_ids.sort().values
    if not (selection or compile_head or token_ids is not None):
        return source  # nothing to change: vLLM reads the checkpoint itself
    key = hashlib.sha1(f"{source}|{selection}{'|compiled' if compile_head else ''}".encode())
    if token_ids is not None:
        key.update(token_ids.numpy().tobytes())
        key.update(_target_stamp(vocab.target_dir).encode())
    name = f"{source.name}-{key.hexdigest()[:12]}"
    view = paths.cache_dir() / "serve" / name
    view.mkdir(parents=True, exist_ok=True)
    for item in source.iterdir():
        link = view / item.name
        if item.name != CONFIG_FILE and not link.is_symlink():
            link.symlink_to(item)
    if selection:
        hf[SELECTION_KEY] = selection
    if compile_head:
        hf[COMPILE_KEY] = True
    if token_ids is not None:
        hf[VOCAB_SIZE_KEY] = len(token_ids)
        if not (view / VOCAB_WEIGHTS_FILE).is_file():
            _write_vocab_head(view / VOCAB_WEIGHTS_FILE, token_ids, vocab.target_dir)
    (view / CONFIG_FILE).write_text(json.dumps(hf, indent=2) + "\n")
    return view


def _write_vocab_head(path: Path, token_ids: Tensor, target_dir: Path) -> None:
    rows = target_head_rows(target_dir, token_ids)
    offsets = token_ids - torch.arange(len(token_ids))  # [N]: vLLM's d2t
    partial = path.with_suffix(".partial")
    save_file({"lm_head.weight": rows.contiguous(), "d2t": offsets.contiguous()}, str(partial))
    partial.replace(path)  # a view is never left with half a head


def target_head_rows(target_dir: Path, token_ids: Tensor) -> Tensor:
    """The target's LM head rows [N, hidden] for `token_ids`, read from its safetensors in their
    stored dtype: `lm_head.weight`, or the token embedding where the target ties them."""
    config = json.loads((target_dir / "config.json").read_text())
    tied = config.get("tie_word_embeddings", True)  # transformers' default
    names = ("model.embed_tokens.weight",) if tied else ("lm_head.weight",)
    for file in sorted(target_dir.glob("*.safetensors")):
        with safe_open(str(file), "pt") as weights:
            for name in names:
                if name in weights.keys():
                    return weights.get_tensor(name)[token_ids].clone()
    raise DcocoError(
        f"no {' or '.join(names)} in {target_dir}'s safetensors: cannot cut a draft vocabulary "
        "from its LM head; pass --draft-vocab full"
    )


def _target_stamp(target_dir: Path) -> str:
    """Names the target's weights as stored (path, sizes, times): a changed target gets a new
    view rather than a stale head."""
    stamps = []
    for file in sorted(target_dir.glob("*.safetensors")):
        stat = file.stat()
        stamps.append(f"{file.resolve()}:{stat.st_size}:{stat.st_mtime_ns}")
    return "|".join(stamps)
