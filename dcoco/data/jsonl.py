"""Reading JSONL prompt files: one place for the file, blank-line and bad-JSON handling."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from dcoco.errors import DcocoError


def iter_jsonl(path: str | Path) -> Iterator[tuple[str, dict]]:
    """Yield (`file:line`, record) for every non-blank line; a clear DcocoError otherwise."""
    file = Path(path)
    if not str(path) or not file.is_file():
        raise DcocoError(f"prompts file not found: '{path}'")
    for number, line in enumerate(file.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise DcocoError(f"{where}: not valid JSON ({error})") from error
        if not isinstance(record, dict):
            raise DcocoError(f"{where}: expected a JSON object")
        yield where, record
