"""The checkpoint catalogue: `checkpoints/<target>/catalogue.json` lists every shipped checkpoint.

Each entry, keyed by a name that never changes meaning once published:

    status          default | supported
    kind            drafter | dcoco | dspark | domino (the head it carries)
    serves          the methods it is the default checkpoint of (status default), else []
    drafter         the catalogued drafter it was trained over and is served with (a head's own
                    drafter part must be that drafter, tensor for tensor); a head trained jointly
                    with its drafter names itself: its drafter part ships inside it
    init            (joint heads only) the catalogued checkpoint the joint run started from (a
                    drafter, or a joint head it trained on)
    drafter_digest  `drafter_digest()` of its drafter tensors
    heldout         its held-out τ at 3 and 7 slots, and the run that measured it
    recipe          the command that makes it

A checkpoint ships when a method takes it by default or a recipe starts from it; superseded ones
leave the tree (git history keeps them). The catalogue's `draft_vocab` names the draft
vocabulary's files beside the checkpoints and the command that makes them. Method defaults are
read from here (dcoco.decode.methods); a checkpoint directory that is not catalogued is not
shipped.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch
from safetensors import safe_open

from dcoco.errors import DcocoError
from dcoco.models.drafter.drafter_io import HEAD_PREFIX, WEIGHTS_FILE

CATALOGUE_FILE = "catalogue.json"


def read_catalogue(target_dir: Path) -> dict:
    """The catalogue's entries (name -> entry) in `target_dir`; {} if it has none."""
    path = Path(target_dir) / CATALOGUE_FILE
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text())["checkpoints"]
    except (ValueError, KeyError, TypeError) as error:
        raise DcocoError(f"{path} is not a checkpoint catalogue ({error})") from error


def default_checkpoint(target_dir: Path, method: str) -> str | None:
    """The catalogued default checkpoint of `method`, or None if none is catalogued."""
    for name, entry in read_catalogue(target_dir).items():
        if entry.get("status") == "default" and method in entry.get("serves", ()):
            return name
    return None


def drafter_digest(checkpoint: Path) -> str:
    """sha256[:16] over the drafter's tensors in a checkpoint (a head's are left out): names,
    dtypes, shapes and bytes, in name order. Equal digests mean the same drafter."""
    digest = hashlib.sha256()
    with safe_open(Path(checkpoint) / WEIGHTS_FILE, "pt") as weights:
        for name in sorted(weights.keys()):
            if name.startswith(HEAD_PREFIX):
                continue
            tensor = weights.get_tensor(name).contiguous()
            digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}".encode())
            digest.update(tensor.view(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()[:16]
