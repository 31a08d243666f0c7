"""`--draft-dtype auto` by measurement (dcoco.decode.auto_draft): the settings weighed on each CPU
kind, the fastest pass kept and cached, and a proposer built at the setting chosen."""

from __future__ import annotations

import dataclasses
import json
import time
from types import SimpleNamespace

import pytest
import torch
from conftest import make_tiny_target

import dcoco.decode.auto_draft as auto_draft
from dcoco.decode.methods import MethodOptions, build_proposer
from dcoco.models.drafter.drafter import BlockDrafter
from dcoco.models.drafter.drafter_config import DrafterConfig
from dcoco.models.drafter.drafter_io import save_drafter
from dcoco.models.target.precision import quantise_int8_weights

pytestmark = pytest.mark.usefixtures("one_thread")


def bf16_target():
    target = make_tiny_target("llama")
    target.model.to(torch.bfloat16)
    return target


def drafter_config(target, **overrides) -> DrafterConfig:
    config = DrafterConfig.for_target(target, block_size=5, mask_token_id=3,
                                      target_layer_ids=(0, 1, 3))  # fmt: skip
    return dataclasses.replace(config, **overrides)


def machine(monkeypatch, native: bool, int8_rows: bool) -> None:
    monkeypatch.setattr(auto_draft, "native_bf16", lambda: native)
    monkeypatch.setattr(auto_draft, "int4_dot_available", lambda: int8_rows)


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    """Choices in a cache of the test's own (the kernels stay in the user's: built once)."""
    monkeypatch.setattr(auto_draft, "cache_dir", lambda: tmp_path / "cache")


def test_the_settings_weighed_on_each_cpu_kind(monkeypatch):
    target = bf16_target()
    config = drafter_config(target)
    machine(monkeypatch, native=False, int8_rows=True)  # AVX2: bf16 emulated, no bf16 drafter
    assert auto_draft.candidates(target, config) == ["fp32", "int4", "w4a8"]
    machine(monkeypatch, native=True, int8_rows=True)  # AVX-512 bf16 (and AMX)
    assert auto_draft.candidates(target, config) == ["target", "fp32", "int4", "w4a8"]
    machine(monkeypatch, native=True, int8_rows=False)
    assert auto_draft.candidates(target, config) == ["target", "fp32", "int4"]
    odd = drafter_config(target, intermediate_size=120)  # the int4 kernels pack 32 inputs
    assert auto_draft.candidates(target, odd) == ["target", "fp32"]
    assert auto_draft.candidates(make_tiny_target("llama"), config) == ["target"]  # fp32 target
    quantise_int8_weights(target.model)
    target.lm_head = target.model.get_output_embeddings()  # no plain head: no fp32 copy of it
    assert "fp32" not in auto_draft.candidates(target, config)


class TimedProposer:
    """A proposer whose pass takes `ms` (what measure_draft times)."""

    feature_layers = (0, 1, 3)

    def __init__(self, ms: float):
        self.ms = ms

    def start(self, tokens):
        pass

    def propose(self, context):
        time.sleep(self.ms / 1000)
        return SimpleNamespace(correct_s=0.0)


def test_the_fastest_pass_is_chosen_once_and_then_read(monkeypatch, capsys):
    target = bf16_target()
    config = drafter_config(target)
    machine(monkeypatch, native=True, int8_rows=True)
    passes = {"target": 12.0, "fp32": 9.0, "int4": 3.0, "w4a8": 6.0}
    built = []

    def build(setting):
        built.append(setting)
        return TimedProposer(passes[setting])

    key = {"drafter": {"block_size": 5}}
    assert auto_draft.measured_setting(target, config, key, build) == "int4"
    assert sorted(built) == sorted(passes)
    line = capsys.readouterr().err
    assert "draft dtype auto -> int4 for the drafter beside" in line and "w4a8 6." in line
    [cached] = (auto_draft.cache_dir() / "profiles").glob("draft-dtype-*.json")
    record = json.loads(cached.read_text())
    assert record["draft_dtype"] == "int4"
    assert record["draft_ms"]["int4"] < record["draft_ms"]["w4a8"]

    def never(setting):
        raise AssertionError("a cached choice builds nothing")

    assert auto_draft.measured_setting(target, config, key, never) == "int4"
    # another drafter (its checkpoint's config in the key) is measured anew
    passes["int4"] = 20.0
    other = {"drafter": {"block_size": 9}}
    assert auto_draft.measured_setting(target, config, other, build) == "w4a8"
    cached.write_text("{not json")  # an unreadable choice is measured again
    assert auto_draft.measured_setting(target, config, key, build) == "w4a8"
    assert auto_draft.forget_draft_settings() == 2  # `dcoco profile --refresh`
    built.clear()
    auto_draft.measured_setting(target, config, key, build)
    assert sorted(built) == sorted(passes)


def test_a_proposer_is_built_at_the_measured_setting(monkeypatch, tmp_path):
    target = bf16_target()
    config = drafter_config(target)
    torch.manual_seed(0)
    drafter = BlockDrafter(config, target.embed_tokens, target.lm_head).eval()
    path = save_drafter(tmp_path / "drafter", drafter, target.info, dtype=torch.float32)
    machine(monkeypatch, native=False, int8_rows=False)  # fp32 or int4: both run everywhere
    proposer = build_proposer(f"dflash@{path}", target, MethodOptions())
    [cached] = (auto_draft.cache_dir() / "profiles").glob("draft-dtype-*.json")
    chosen = json.loads(cached.read_text())["draft_dtype"]
    assert chosen in ("fp32", "int4")
    expected = torch.float32 if chosen == "fp32" else torch.bfloat16
    assert proposer.drafter.dtype == expected
