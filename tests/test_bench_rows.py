"""Bench rows `SPEC[%DTYPE]`: parsing, the specs a run record lists checkpoints for."""

from __future__ import annotations

import pytest

from dcoco.errors import DcocoError
from dcoco.eval.bench_rows import our_method_specs, ours_at_run_precision, parse_row


def test_parse_row_splits_method_and_precision():
    row = parse_row(" plain%bf16 ")
    assert (row.name, row.method, row.dtype) == ("plain%bf16", "plain", "bf16")
    assert parse_row("hf-pld").dtype is None


@pytest.mark.parametrize("spec", ["plain%fp8", "nosuch", "llama-cpp%bf16"])
def test_parse_row_refuses_bad_rows(spec):
    with pytest.raises(DcocoError):
        parse_row(spec)


def test_run_record_specs_drop_peers_and_precisions():
    # `dcoco bench` failed after its report on a row `plain%bf16` before this list existed.
    specs = ["plain", "plain%bf16", "hf", "hf-pld", "llama-cpp", "dflash%fp32", "dflash", " "]
    assert our_method_specs(specs) == ["plain", "dflash"]
    rows = [parse_row(s) for s in specs if s.strip()]
    assert ours_at_run_precision(rows) == ["plain", "dflash"]


def test_llama_cpp_row_runs_prompt_and_decode_on_the_threads_asked(monkeypatch):
    """`--threads 1` means one thread for llama.cpp's prompt too (its default is every core)."""
    import sys
    from types import ModuleType, SimpleNamespace

    from dcoco.eval.peers import LlamaCppPeer

    made = {}
    fake = ModuleType("llama_cpp")
    fake.Llama = lambda **kwargs: made.update(kwargs)
    monkeypatch.setitem(sys.modules, "llama_cpp", fake)
    LlamaCppPeer("model.gguf", SimpleNamespace(max_context=2048, stop_ids={2}), threads=1)
    assert made["n_threads"] == 1 and made["n_threads_batch"] == 1
