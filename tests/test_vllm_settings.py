"""The plugin's settings (dcoco.serving.vllm.settings) and its ordered patches: what `dcoco serve`
hands vLLM's processes travels as one object, and every patch module installs in a stated order."""

from __future__ import annotations

import importlib

import pytest

from dcoco.errors import DcocoError
from dcoco.serving.draft_schedule import OPEN_END
from dcoco.serving.vllm.plugin import PATCHES
from dcoco.serving.vllm.settings import SETTINGS_ENV, PluginSettings, current, use


def test_settings_travel_as_one_variable_and_come_back_equal(monkeypatch):
    monkeypatch.delenv(SETTINGS_ENV, raising=False)
    assert current() == PluginSettings()
    sent = PluginSettings(context_margin=4, live_record="r.json").with_schedule("1:7,2-:0/1-:2@8/0")
    env = sent.environment()
    assert list(env) == [SETTINGS_ENV]
    monkeypatch.setenv(SETTINGS_ENV, env[SETTINGS_ENV])
    assert current() == sent
    assert (sent.sampled_schedule, sent.head_max_batch, sent.sampled_head_max_batch) == (
        "1-:2", 8, 0,
    )  # fmt: skip
    use(PluginSettings())
    assert current().head_max_batch == OPEN_END


def test_unreadable_settings_are_one_clear_error(monkeypatch):
    monkeypatch.setenv(SETTINGS_ENV, '{"no_such_field": 1}')
    with pytest.raises(DcocoError, match=SETTINGS_ENV):
        current()


def test_every_patch_module_installs_and_the_order_is_stated():
    assert PATCHES[0].endswith("cpu_fixes") and PATCHES[-1].endswith("live_schedule")
    assert PATCHES.index("dcoco.serving.vllm.no_draft") < PATCHES.index(
        "dcoco.serving.live_schedule"
    )
    for name in PATCHES:  # importable without vLLM; install() imports vLLM itself
        assert callable(importlib.import_module(name).install), name
