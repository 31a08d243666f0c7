"""No shipped record (checkpoints/, results/) holds one machine's absolute path: provenance and
results record paths relative to the checkout or the cache dir (dcoco.paths.portable)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from dcoco.paths import CACHE_TOKEN, REPO_ROOT, local, portable, portable_record

SHIPPED = [REPO_ROOT / "checkpoints", REPO_ROOT / "results"]
# /abs/path, ~/path, C:\path: a whole string value that names a place on one machine
ABSOLUTE = re.compile(r"^(/|~|[A-Za-z]:[\\/])")


def strings(value):
    if isinstance(value, dict):
        for item in value.values():
            yield from strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from strings(item)
    elif isinstance(value, str):
        yield value


def shipped_records():
    for root in SHIPPED:
        for path in sorted(root.rglob("*.json")):
            yield path, json.loads(path.read_text())
        for path in sorted(root.rglob("*.jsonl")):
            for number, line in enumerate(path.read_text().splitlines(), start=1):
                if line.strip():
                    yield f"{path}:{number}", json.loads(line)


@pytest.mark.skipif(not SHIPPED[0].is_dir(), reason="not a checkout")
def test_no_shipped_json_holds_an_absolute_path():
    found = [
        f"{where}: {text}"
        for where, record in shipped_records()
        for text in strings(record)
        if ABSOLUTE.match(text)
    ]
    assert not found, "absolute paths in shipped files:\n" + "\n".join(found)


def test_portable_paths_are_relative_to_the_checkout_or_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DCOCO_CACHE_DIR", str(tmp_path / "cache"))
    assert portable(REPO_ROOT / "runs" / "drafter") == "runs/drafter"
    assert portable(REPO_ROOT.parent / "shared" / "data") == "../shared/data"
    assert portable(tmp_path / "cache" / "targets" / "x") == f"{CACHE_TOKEN}/targets/x"
    assert portable("runs/relative") == "runs/relative" and portable("") == ""
    cached = tmp_path / "cache" / "corpus" / "t1"
    assert local(portable(cached)) == str(cached)  # a recipe's cache path, back on this machine
    assert local("runs/a") == "runs/a" and local("$DCOCO_CACHE_DIRX") == "$DCOCO_CACHE_DIRX"
    record = {"out": str(REPO_ROOT / "runs" / "a"), "argv": [str(REPO_ROOT / "x.py"), "--lr"]}
    assert portable_record(record) == {"out": "runs/a", "argv": ["x.py", "--lr"]}
    assert not any(ABSOLUTE.match(s) for s in strings(portable_record({"p": str(Path.home())})))
