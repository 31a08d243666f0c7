"""`dcoco serve` on a machine it has not measured: it starts at once on the defaults and says
how to calibrate; `--calibrate` measures the layout, precision and draft schedule (stand-in
probes here) and later servers read them from the cache; the probe's progress is relayed with an
estimate of the time left."""

from __future__ import annotations

import json
import time

import pytest

from dcoco.serving import auto_schedule, layout, probe_progress, serve
from dcoco.serving.serve import UNCALIBRATED_SCHEDULE, ServeConfig
from dcoco.serving.vllm.settings import SETTINGS_ENV
from tests.test_draft_schedule import _summary
from tests.test_serve_command import serve_dirs  # noqa: F401 - a fixture

GREEDY = {"0": {"1": 30.0, "2": 60.0}, "3": {"1": 60.0, "2": 55.0}}
SAMPLED = {"0": {"1": 30.0, "2": 60.0}, "2": {"1": 25.0, "2": 50.0}}


@pytest.fixture
def stand_ins(tmp_path, monkeypatch):
    """A cache under tmp_path, stand-in layout and schedule probes, and a supervise that records
    the server's argv and environment instead of starting it. Returns the calls of each."""
    monkeypatch.setenv("DCOCO_CACHE_DIR", str(tmp_path / "cache"))
    calls = {"layouts": [], "schedules": [], "servers": []}

    def probe_layout(python, argv, name):
        calls["layouts"].append(name)
        return 20.0 + (1.0 if name == "all-cores" else 0.0)

    def run_probe(python, request, threads):
        calls["schedules"].append(request)
        return _summary({"0": GREEDY, "1": SAMPLED}, {"0": [0.6, 0.3, 0.2], "1": [0.4, 0.2]})

    monkeypatch.setattr(layout, "probe_layout", probe_layout)
    monkeypatch.setattr(auto_schedule, "_run_probe", run_probe)
    monkeypatch.setattr(serve, "supervise", lambda argv, env: calls["servers"].append((argv, env)))
    return calls


def _served(calls) -> tuple[dict, dict, dict]:
    """(vLLM's flags, its speculative config, the plugin's settings) of the last server."""
    argv, env = calls["servers"][-1]
    flags = dict(zip(argv[1::2], argv[2::2], strict=False))
    spec = json.loads(argv[argv.index("--speculative-config") + 1])
    return flags, spec, json.loads(env[SETTINGS_ENV]) | {"reserved": env.get(
        "VLLM_CPU_NUM_OF_RESERVED_CPU")}  # fmt: skip


def test_an_uncalibrated_server_starts_on_defaults_and_says_how_to_calibrate(
    serve_dirs,  # noqa: F811 - the fixture
    stand_ins,
    capsys,
):
    target, drafter = serve_dirs
    config = ServeConfig(target=str(target), checkpoint=str(drafter), python="/opt/py")
    serve.run(config)
    assert stand_ins["layouts"] == stand_ins["schedules"] == []  # nothing timed
    flags, spec, settings = _served(stand_ins)
    assert flags["--dtype"] == "bfloat16" and settings["reserved"] is None  # vllm-default
    assert spec["num_speculative_tokens_per_batch_size"] == [[1, 1, 2], [2, 1 << 16, 0]]
    assert settings["sampled_schedule"] == UNCALIBRATED_SCHEDULE.split("/")[1]
    assert settings["live_record"] == "" and settings["compile_head_in_background"]
    assert "not calibrated on this machine yet" in capsys.readouterr().err

    serve.run(ServeConfig(**{**vars(config), "calibrate": True}))  # measures, then serves
    assert len(stand_ins["layouts"]) == 8 and len(stand_ins["schedules"]) == 1
    flags, spec, settings = _served(stand_ins)
    assert settings["reserved"] == "0"  # all-cores, the faster stand-in
    assert spec["num_speculative_tokens_per_batch_size"] == [[1, 1, 3], [2, 1 << 16, 0]]
    assert settings["live_record"]  # the probe's record, for the live schedule
    capsys.readouterr()

    serve.run(config)  # a later server reads what was measured, at once
    assert len(stand_ins["layouts"]) == 8 and len(stand_ins["schedules"]) == 1
    assert _served(stand_ins) == (flags, spec, settings)
    assert "not calibrated" not in capsys.readouterr().err


def test_the_probes_progress_is_relayed_with_the_time_left(tmp_path, capsys):
    log = tmp_path / "probe.log"
    log.write_text("vLLM starting\n")
    written = [f"{probe_progress.PROGRESS}0 400\n", f"{probe_progress.PROGRESS}100 400\n"]

    class Probe:  # exits after its log has grown by two progress lines
        def poll(self):
            if written:
                with log.open("a") as sink:
                    sink.write(written.pop(0))
                time.sleep(0.01)
                return None
            return 0

    assert probe_progress.follow(Probe(), log, every_s=0.0, minute_s=0.0) == 0
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith("dcoco: draft-schedule probe: 0% timed")
    assert "25% timed" in lines[-1] and "min left" in lines[-1]


def test_time_left_is_the_mean_step_times_the_steps_to_go():
    started = time.perf_counter() - 120.0  # two steps in two minutes
    assert layout.time_left(started, 0, 5) == ""
    assert layout.time_left(started, 2, 5) == ", about 3 min left"
