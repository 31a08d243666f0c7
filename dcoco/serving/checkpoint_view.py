"""The view of a checkpoint that `dcoco serve` points vLLM at when a method names its corrector's
selection rule (`dcoco:keep1`, `dcoco:greedy/4`).

vLLM's worker builds the draft head from the drafter's config.json and takes no other input, so
the rule travels inside it: a directory under the cache whose config.json is the checkpoint's
plus the rule, every other file linked. The checkpoint itself is never written.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from dcoco import paths
from dcoco.models.drafter_io import CONFIG_FILE
from dcoco.models.head_io import SELECTION_KEY


def with_selection(path: Path, selection: str) -> Path:
    """A view of checkpoint `path` whose config.json names the corrector's `selection` rule (its
    other files linked): vLLM's worker builds the head from that config."""
    source = path.resolve()
    digest = hashlib.sha1(str(source).encode()).hexdigest()[:10]
    view = paths.cache_dir() / "serve" / f"{source.name}-{digest}-{selection.replace('/', '-k')}"
    view.mkdir(parents=True, exist_ok=True)
    for item in source.iterdir():
        link = view / item.name
        if item.name != CONFIG_FILE and not link.is_symlink():
            link.symlink_to(item)
    hf = json.loads((source / CONFIG_FILE).read_text())
    (view / CONFIG_FILE).write_text(json.dumps({**hf, SELECTION_KEY: selection}, indent=2) + "\n")
    return view
