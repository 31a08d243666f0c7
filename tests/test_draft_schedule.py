"""Load-aware drafting (dcoco.serving.draft_schedule): the schedule syntax, the choice from a
measured grid, and what `dcoco serve` hands vLLM."""

from __future__ import annotations

import json
import shlex

import pytest

from dcoco.errors import DcocoError
from dcoco.serving import auto_schedule, draft_schedule
from dcoco.serving.draft_schedule import OPEN_END, format_schedule, parse
from dcoco.serving.vllm.settings import SETTINGS_ENV, PluginSettings

SAMPLED_1_2 = PluginSettings(sampled_schedule="1:2,2-:0").environment()  # sampled: K 2 at 1


def test_parse_and_format_round_trip():
    text = "1:7,2-3:5,4-7:3,8-:0"
    schedule = parse(text, max_k=7)
    assert schedule == [(1, 1, 7), (2, 3, 5), (4, 7, 3), (8, OPEN_END, 0)]
    assert format_schedule(schedule) == text
    assert parse("1-:4", max_k=7) == [(1, OPEN_END, 4)]


def test_largest_drafting_batch():
    assert draft_schedule.largest_drafting_batch(parse("1:7,2-3:2,4-:0", max_k=7)) == 3
    assert draft_schedule.largest_drafting_batch(parse("1-:0", max_k=7)) == 0
    assert draft_schedule.largest_drafting_batch(parse("1:7,2-:3", max_k=7)) == OPEN_END


def test_k0_context_limit_follows_both_schedules(monkeypatch):
    """The runner shortcut stores the drafter's context up to the largest batch either schedule
    drafts at plus the margin (steps of sampled requests only: the sampled schedule's, none if it
    never drafts); with no per-batch schedule it always stores it."""
    from types import SimpleNamespace

    from dcoco.serving.vllm import no_draft as vllm_no_draft

    def limit(greedy, sampled=None, margin=None, all_sampled=False):
        settings = PluginSettings(sampled_schedule=sampled or "", context_margin=margin or 1)
        monkeypatch.setenv(SETTINGS_ENV, settings.environment()[SETTINGS_ENV])
        config = SimpleNamespace(num_speculative_tokens_per_batch_size=greedy)
        runner = SimpleNamespace(speculative_config=config)
        return vllm_no_draft._context_limit(runner, all_sampled)

    margin = PluginSettings().context_margin
    assert limit([[1, 2, 7], [3, OPEN_END, 0]]) == 2 + margin
    assert limit([[1, 2, 7], [3, OPEN_END, 0]], sampled="1-4:1,5-:0", margin=3) == 7
    assert limit([[1, 1, 7], [2, OPEN_END, 0]], sampled="1-:0") == 1 + margin
    assert limit(None) >= OPEN_END
    assert limit([[1, 1, 7], [2, OPEN_END, 0]], sampled="1-:0", all_sampled=True) == 0
    assert limit([[1, 4, 7], [5, OPEN_END, 0]], sampled="1-2:1,3-:0", all_sampled=True) == 3
    assert limit([[1, 2, 7], [3, OPEN_END, 0]], all_sampled=True) == 2 + 1  # as greedy


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("2-:3", "start at batch size 1"),
        ("1:7,1-4:3", "overlap"),
        ("1:9", "K in 0..7"),
        ("1:x", "SIZE:K"),
        ("1-3", "SIZE:K"),
        ("0:3", "sizes must be >= 1"),
        ("4-2:1", "ascending"),
    ],
)
def test_parse_rejects_bad_schedules_with_one_line(text, message):
    with pytest.raises(DcocoError, match=message):
        parse(text, max_k=7)


def _argv(capsys, *flags) -> list[str]:
    from dcoco.cli import main

    # --python: the dry run only prints the command, no vLLM needed
    argv = ["serve", "--dry-run", "--layout", "all-cores", "--python", "python3", *flags]
    assert main(argv) == 0
    return shlex.split(capsys.readouterr().out.strip().splitlines()[-1])


def test_serve_hands_vllm_a_written_out_schedule(capsys):
    argv = _argv(capsys, "--method", "dflash", "--draft-schedule", "1:7,2-3:3,4-:0")
    speculative = json.loads(argv[argv.index("--speculative-config") + 1])
    assert speculative["num_speculative_tokens"] == 7
    assert speculative["num_speculative_tokens_per_batch_size"] == [
        [1, 1, 7],
        [2, 3, 3],
        [4, OPEN_END, 0],
    ]
    fixed = _argv(capsys, "--method", "dflash", "--draft-schedule", "fixed")
    assert (
        "num_speculative_tokens_per_batch_size"
        not in fixed[fixed.index("--speculative-config") + 1]
    )


def test_serve_ngram_is_vllms_prompt_lookup(capsys):
    argv = _argv(capsys, "--method", "ngram", "--draft-schedule", "1:7,2-:0")
    speculative = json.loads(argv[argv.index("--speculative-config") + 1])
    assert speculative["method"] == "ngram" and speculative["num_speculative_tokens"] == 7


def test_serve_refuses_a_bad_schedule_with_one_line(capsys):
    from dcoco.cli import main

    code = main(["serve", "--dry-run", "--method", "dflash", "--draft-schedule", "1:99"])
    assert code != 0
    assert "K in 0..7" in capsys.readouterr().err


def _summary(rates: dict, acceptance: dict) -> dict:
    """A probe summary whose step times give `rates` at the acceptance `acceptance`."""
    step_s = {
        t: {
            k: {b: int(b) * (1 + sum(acceptance[t][: int(k)])) / r for b, r in cells.items()}
            for k, cells in by_k.items()
        }  # fmt: skip
        for t, by_k in rates.items()
    }
    return {"vllm": "0.32.0", "rates": rates, "step_s": step_s, "acceptance": acceptance}


def _fake_probe(monkeypatch, tmp_path, rates: dict, acceptance: dict) -> list[dict]:
    """A cache under tmp_path and a probe that answers `_summary(rates, acceptance)`; returns the
    list of requests it was sent."""
    monkeypatch.setenv("DCOCO_CACHE_DIR", str(tmp_path))
    calls: list[dict] = []

    def fake_probe(python, request, threads):
        calls.append(request)
        return _summary(rates, acceptance)

    monkeypatch.setattr(auto_schedule, "_run_probe", fake_probe)
    return calls


def test_measured_schedule_is_cached(tmp_path, monkeypatch):
    greedy = {"0": {"1": 30.0, "2": 60.0, "4": 100.0}, "3": {"1": 60.0, "2": 55.0, "4": 50.0}}
    sampled = {"0": {"1": 30.0, "2": 60.0}, "1": {"1": 40.0, "2": 50.0}}
    acceptance = {"0": [0.5, 0.3, 0.2], "1": [0.6, 0.2]}
    calls = _fake_probe(monkeypatch, tmp_path, {"0": greedy, "1": sampled}, acceptance)
    probe = {"speculative": {"method": "dflash", "num_speculative_tokens": 3}}
    first, record = auto_schedule.measured("python", probe, {"machine": "m"}, threads=2)
    again, _ = auto_schedule.measured("python", probe, {"machine": "m"}, threads=2)
    # K = 1 and 2 pay the drafter's pass as K = 3 does (the only drafting K measured): at 2
    # requests K = 0 (60 tokens/s) beats them all
    assert first == again == "1:3,2-:0/1:1,2-:0"
    assert len(calls) == 1
    other = {**probe, "model": "another drafter"}  # another method is measured on its own
    auto_schedule.measured("python", {**other}, {"machine": "m", "probe": other}, threads=2)
    assert len(calls) == 2
    assert calls[0]["draft_lengths"] == {"0": [0, 2, 3], "1": [0, 2]}  # and the longest
    assert record["tokens_per_s"]["0"]["3"]["1"] == 60.0
    assert record["acceptance"]["0"] == [0.5, 0.3, 0.2] and "step_s" in record
    assert calls[0]["calibration"]["max_tokens"] == auto_schedule.CALIBRATION_TOKENS


def test_a_cached_record_is_chosen_again_from_its_measurements(tmp_path, monkeypatch):
    rates = {"0": {"0": {"1": 30.0}, "2": {"1": 60.0}}, "1": {"0": {"1": 30.0}}}
    calls = _fake_probe(monkeypatch, tmp_path, rates, {"0": [0.6, 0.3], "1": [0.1]})
    probe = {"speculative": {"method": "dflash", "num_speculative_tokens": 2}}
    first, _ = auto_schedule.measured("python", probe, {"machine": "m"}, threads=2)
    path = next((tmp_path / "serve-schedules").glob("*.json"))
    stale = {**json.loads(path.read_text()), "schedule": "1-:0/1-:0"}  # an older rule's choice
    path.write_text(json.dumps(stale))
    again, record = auto_schedule.measured("python", probe, {"machine": "m"}, threads=2)
    assert again == first == record["schedule"] == "1-:2/1-:0" and len(calls) == 1
    assert json.loads(path.read_text())["schedule"] == first  # rewritten


def test_schedule_prompts_replace_the_probes_and_key_the_cache(tmp_path, monkeypatch):
    rates = {"0": {"0": {"1": 30.0}, "1": {"1": 40.0}}, "1": {"0": {"1": 30.0}}}
    requests = _fake_probe(monkeypatch, tmp_path, rates, {"0": [0.6], "1": [0.1]})
    traffic = tmp_path / "traffic.jsonl"
    record = {"category": "chat", "turns": ["Plan a picnic.", "And if it rains?"]}
    traffic.write_text(json.dumps(record) + "\n")
    probe = {"speculative": {"method": "dflash", "num_speculative_tokens": 1}}
    text, record = auto_schedule.for_server("python", probe, "all-cores")
    assert text == "1-:1/1-:0" and json.loads(record.read_text())["schedule"] == text
    auto_schedule.for_server("python", probe, "all-cores", str(traffic))
    auto_schedule.for_server("python", probe, "all-cores", str(traffic))  # cached
    assert len(requests) == 2 and "prompts" not in requests[0]
    assert requests[1]["prompts"] == ["Plan a picnic."]
    with pytest.raises(DcocoError, match="schedule prompts file not found"):
        auto_schedule.for_server("python", probe, "all-cores", str(tmp_path / "missing.jsonl"))


def test_sampled_schedule_never_drafts_more_than_the_greedy_one():
    from dcoco.serving.draft_schedule import at_most, parse_pair

    greedy, sampled = parse_pair("1:7,2:2,3-:0/1:3,2-:2", max_k=7)
    assert at_most(sampled, greedy) == [(1, 1, 3), (2, 2, 2), (3, OPEN_END, 0)]
    assert parse_pair("1-:4", max_k=7) == ([(1, OPEN_END, 4)], None)


def test_sampled_requests_drafts_are_trimmed_by_their_schedule(monkeypatch):
    from dcoco.serving.vllm import sampled_drafts

    monkeypatch.setenv(SETTINGS_ENV, SAMPLED_1_2[SETTINGS_ENV])
    drafts = [[5, 6, 7], [8, 9, 10]]
    assert sampled_drafts.trim_sampled(drafts, ["a", "b"], {"b"}) == [[5, 6, 7], []]
    assert sampled_drafts.trim_sampled([[5, 6, 7]], ["b"], {"b"}) == [[5, 6]]
    assert sampled_drafts.trim_sampled(drafts, ["a", "b"], set()) == drafts
    monkeypatch.delenv(SETTINGS_ENV)
    assert sampled_drafts.sampled_drafts(4) is None


def test_scheduler_asks_sampled_steps_for_the_sampled_schedules_k(monkeypatch):
    from types import SimpleNamespace

    from dcoco.serving.vllm import sampled_drafts

    def request(temperature):
        return SimpleNamespace(sampling_params=SimpleNamespace(temperature=temperature))

    monkeypatch.setenv(SETTINGS_ENV, SAMPLED_1_2[SETTINGS_ENV])
    scheduler = SimpleNamespace(running=[request(1.0)])
    lookup = sampled_drafts.SampledAwareLookup([0, 7, 3, 0], scheduler)
    assert lookup[1] == 2 and lookup[2] == 0 and lookup[3] == 0
    scheduler.running = [request(1.0), request(0.0)]  # replaced, as vLLM's scheduler does
    assert lookup[1] == 7 and lookup[2] == 3
    scheduler.running = [SimpleNamespace(sampling_params=None)]  # pooling: not sampled
    assert lookup[2] == 3


def test_serve_passes_the_sampled_schedule_to_the_server_processes():
    assert PluginSettings().with_schedule("1:7,2-:0/1-:0").sampled_schedule == "1-:0"
    for text in ("1:7,2-:0", "fixed"):
        assert PluginSettings().with_schedule(text) == PluginSettings()
    assert PluginSettings().with_schedule("1:7,2-:0/1-:0").environment() != (
        PluginSettings().environment()
    )


class _FakeEngine:
    """vLLM's LLMEngine as queue_rate uses it: each step, every running request emits `per_step`
    tokens (a delta) and finishes after `length`; records how many ran at each step."""

    def __init__(self, length: int, per_step: dict[int, int]):
        self.length, self.per_step = length, per_step
        self.running: dict[str, list[int]] = {}  # id -> [prompt index, tokens so far]
        self.sizes: list[int] = []
        self.aborted: list[str] = []
        self.emitted: list[int] = []  # tokens per step

    def add_request(self, request_id, prompt, params):
        assert request_id not in self.running
        self.running[request_id] = [prompt, 0]

    def step(self):
        from types import SimpleNamespace as NS

        self.sizes.append(len(self.running))
        outputs = []
        for request_id, state in list(self.running.items()):
            new = min(self.per_step[state[0] % 2], self.length - state[1])
            state[1] += new
            finished = state[1] == self.length
            outputs.append(NS(request_id=request_id, finished=finished,
                              outputs=[NS(token_ids=[0] * new)]))  # fmt: skip
            if finished:
                del self.running[request_id]
        self.emitted.append(sum(len(o.outputs[0].token_ids) for o in outputs))
        return outputs

    def abort_request(self, request_ids):
        self.aborted += request_ids
        for request_id in request_ids:
            del self.running[request_id]

    def has_unfinished_requests(self):
        return bool(self.running)


def test_probe_queue_keeps_the_batch_full_and_counts_tokens_after_the_first_completion():
    from dcoco.serving.vllm.engine_queue import queue_rate

    # even-numbered requests emit 4 tokens a step, odd ones 1: a batch started together would
    # end with the slow ones running alone; the queue refills every finished slot at once
    engine = _FakeEngine(length=8, per_step={0: 4, 1: 1})
    rate, step = queue_rate(engine, lambda i: (i, None), batch=3, tokens=60)
    assert rate > 0 and step > 0
    assert set(engine.sizes) == {3}  # never fewer than 3 running, never more
    assert len(engine.aborted) == 3 and not engine.running  # the leftovers are cleaned up
    # timed from the step after the first completion (step 2) to the first step that brings
    # the count to 60; the abort's drain adds no steps here (it removes everything at once)
    timed = engine.emitted[2:]
    assert sum(timed[:-1]) < 60 <= sum(timed)
    assert rate * step == pytest.approx(sum(timed) / len(timed))  # tokens a step, timed steps


def test_none_beyond_cuts_a_schedule_at_a_batch_size():
    none_beyond = draft_schedule.none_beyond
    schedule = [(1, 1, 3), (2, 16, 1), (17, OPEN_END, 0)]
    assert none_beyond(schedule, 4) == [(1, 1, 3), (2, 4, 1), (5, OPEN_END, 0)]
    assert none_beyond(schedule, 1) == [(1, 1, 3), (2, OPEN_END, 0)]
    assert none_beyond(schedule, 32) == [(1, 1, 3), (2, 16, 1), (17, OPEN_END, 0)]
