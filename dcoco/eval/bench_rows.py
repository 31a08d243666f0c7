"""What one row of `dcoco bench` / `dcoco compare` runs: `SPEC[%DTYPE]`.

SPEC is one of our methods (dcoco.decode.methods: plain, pld, dflash, dcoco:keep1@dir, ...) or a
peer engine (dcoco.eval.peers: hf, hf-pld, llama-cpp). `%DTYPE` runs that row at another target
precision than the run's `--dtype` (`plain%bf16` beside a gguf run is our bf16 plain decoding,
its LM head in bf16 whatever `--head-dtype` says);
rows at one precision share one loaded target. The whole string names the row in reports.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dcoco.decode.auto_precision import setting_label
from dcoco.decode.methods import check_method
from dcoco.decode.session import DecodeConfig, make_engine, open_target
from dcoco.errors import DcocoError
from dcoco.eval.peers import PEER_METHODS, HFPeer, LlamaCppPeer
from dcoco.models.target.loading import gguf_file, resolve_target
from dcoco.models.target.precision import WEIGHT_FORMATS, check_precision, load_dtype
from dcoco.models.target.target import TargetModel


@dataclass(frozen=True)
class BenchRow:
    name: str  # as given: the row's label
    method: str  # our method spec or a peer name
    dtype: str | None  # the row's own precision; None = the run's


def parse_row(spec: str) -> BenchRow:
    name = spec.strip()
    method, _, dtype = name.partition("%")
    if dtype:
        check_precision(dtype)
    if method not in PEER_METHODS:
        check_method(method)
    elif method == "llama-cpp" and dtype:
        raise DcocoError(f"'{name}': llama-cpp runs the GGUF as shipped and takes no %DTYPE")
    return BenchRow(name, method, dtype or None)


def our_method_specs(specs) -> list[str]:
    """Our method specs among the row strings `specs`, each once (peers and `%DTYPE` dropped):
    what a run record lists checkpoints for."""
    rows = [parse_row(spec) for spec in specs if spec.strip()]
    return list(dict.fromkeys(row.method for row in rows if row.method not in PEER_METHODS))


def ours_at_run_precision(rows: list[BenchRow]) -> list[str]:
    """Our method specs among `rows` that run at the run's precision (what `--dtype auto` is
    chosen for)."""
    return [row.method for row in rows if row.method not in PEER_METHODS and not row.dtype]


class RowTargets:
    """One loaded target per precision the rows need, the run's own first."""

    def __init__(self, config: DecodeConfig, target: TargetModel | None = None):
        self.config = config
        self.by_dtype: dict[str, TargetModel] = {}
        if target is not None:
            self.by_dtype[target.precision] = target

    def get(self, dtype: str | None) -> TargetModel:
        dtype = dtype or self.config.dtype  # resolved (not auto) by the time rows are built
        if dtype not in self.by_dtype:
            self.by_dtype[dtype] = open_target(_with_dtype(self.config, dtype))
        return self.by_dtype[dtype]


def make_row_engine(row: BenchRow, targets: RowTargets):
    """An object with the Engine's `generate(prompt_ids, max_new_tokens, sampling, seed)`."""
    config = targets.config
    if row.method == "llama-cpp":
        threads = config.threads or torch.get_num_threads()
        return LlamaCppPeer(gguf_file(config.target), targets.get(None), threads)
    if row.method in PEER_METHODS:
        dtype = row.dtype or ("bf16" if config.dtype in WEIGHT_FORMATS else config.dtype)
        model_dir = resolve_target(config.target)
        return HFPeer(model_dir, targets.get(None), load_dtype(dtype), row.method == "hf-pld")
    return make_engine(targets.get(row.dtype), row.method, _with_dtype(config, row.dtype))


def row_precision(row: BenchRow, config: DecodeConfig) -> str:
    """The precision a row's weights run at, for its label in reports."""
    if row.method == "llama-cpp":
        return LlamaCppPeer.precision
    if row.method in PEER_METHODS and not row.dtype and config.dtype in WEIGHT_FORMATS:
        return "bf16"  # transformers runs none of our weight-only formats
    return row.dtype or setting_label(config.dtype, config.head_dtype)


def _with_dtype(config: DecodeConfig, dtype: str | None) -> DecodeConfig:
    import dataclasses

    # a row at its own precision runs that precision as named, its own LM head included
    return config if not dtype else dataclasses.replace(config, dtype=dtype, head_dtype="target")
