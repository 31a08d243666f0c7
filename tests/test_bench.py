"""`dcoco bench` end to end on a tiny random target: files, resume, greedy match, report;
and `dcoco compare`, which shares its metrics."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from conftest import CharTokenizer, make_tiny_target

from dcoco.cli import main
from dcoco.errors import DcocoError
from dcoco.eval.bench import BenchConfig, load_bench_prompts, round_robin, run_bench
from dcoco.eval.samples import read_samples, sample_key

ROWS = [
    {"id": "g1", "suite": "gsm8k", "category": "math", "turns": ["2+2?"]},
    {"id": "g2", "suite": "gsm8k", "category": "math", "turns": ["3*3?"]},
    {"id": "g3", "suite": "gsm8k", "category": "math", "turns": ["9-1?"]},
    {"id": "m1", "suite": "mtbench", "category": "chat", "turns": ["abab abab", "more"]},
    {"id": "m2", "suite": "mtbench", "category": "code", "turns": ["def f(): f", "again"]},
]


@pytest.fixture(scope="module")
def target():
    target = make_tiny_target("llama")
    target.tokenizer = CharTokenizer()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model only loses to thread hand-offs on a busy machine
    yield target
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def config(tmp_path_factory) -> BenchConfig:
    tmp_path = tmp_path_factory.mktemp("bench")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("\n".join(json.dumps(row) for row in ROWS) + "\n")
    return BenchConfig(
        methods=("plain", "pld"),
        prompts=str(prompts),
        limit=2,
        temperatures=(0.0, 1.0),
        max_new_tokens=12,
        dtype="fp32",
        num_draft_tokens="4",  # not auto: a timing on a busy machine may choose 1 slot
        run_name="tiny",
        results_dir=str(tmp_path / "results"),
    )


@pytest.fixture(scope="module")
def run_dir(config, target):
    return run_bench(config, target=target, progress=False)


def test_bench_writes_samples_summary_and_report(run_dir):
    for name in ("samples.jsonl", "config.json", "summary.json", "report.md"):
        assert (run_dir / name).is_file(), name
    records = read_samples(run_dir)
    # 2 temperatures x (2 one-turn gsm8k + 2 two-turn mtbench prompts) x 2 methods
    assert len(records) == 2 * (2 + 2 * 2) * 2
    assert {r["suite"] for r in records} == {"gsm8k", "mtbench"}
    assert {"reached_per_slot", "accepted_per_slot", "text", "finish_reason"} <= set(records[0])

    # turn 2 is [user 1, the method's own answer, user 2] (joined by newlines without a template)
    first, second = (
        next(r for r in records if r["id"] == "m1" and r["turn"] == turn and r["method"] == "pld")
        for turn in (1, 2)
    )
    expected = len("abab abab") + 1 + len(first["new_ids"]) + 1 + len("more")
    assert second["prompt_tokens"] == expected

    summary = json.loads((run_dir / "summary.json").read_text())
    greedy = summary["results"]["0"]
    assert greedy["pld"]["overall"]["match_rate"] == 1.0  # lossless, and exact in fp32
    assert set(greedy["pld"]["suites"]) == {"gsm8k", "mtbench"}
    assert greedy["pld"]["suites"]["gsm8k"]["samples"] == 2
    assert summary["results"]["1"]["pld"]["overall"]["match_rate"] is None
    report = (run_dir / "report.md").read_text()
    assert "| method | gsm8k | mtbench | overall |" in report and "## Definitions" in report


def test_report_figures_draw_the_summary(run_dir, drawn):
    from dcoco.eval.report import build_report

    build_report(run_dir, plots=True)
    summary = json.loads((run_dir / "summary.json").read_text())
    for tkey in ("0", "1"):
        results = summary["results"][tkey]
        taus = drawn[f"tau_per_suite_T{tkey}.png"]
        assert taus["title"] == f"τ (tokens per verify cycle), T = {tkey}"
        for method in ("plain", "pld"):
            expected = [results[method]["suites"][s]["tau"] for s in summary["suites"]]
            expected.append(results[method]["overall"]["tau"])
            assert taus["bars"][method] == pytest.approx(expected)
        speedups = drawn[f"speedup_per_suite_T{tkey}.png"]["bars"]
        assert speedups == {"pld": pytest.approx(
            [results["pld"]["suites"][s]["speedup"] for s in summary["suites"]]
            + [results["pld"]["overall"]["speedup"]]
        )}  # fmt: skip
        # plain drafts nothing, so only pld has an acceptance curve
        curves = drawn[f"acceptance_per_position_T{tkey}.png"]["lines"]
        rates = results["pld"]["overall"]["per_position_acceptance"]
        assert list(curves) == ["pld"] and curves["pld"][0] == list(range(1, len(rates) + 1))
        expected = [float("nan") if rate is None else rate for rate in rates]
        assert curves["pld"][1] == pytest.approx(expected, nan_ok=True)


def test_resume_skips_done_samples_and_a_rerun_needs_it(run_dir, config, target):
    lines = (run_dir / "samples.jsonl").read_text()
    resumed = dataclasses.replace(config, resume=True, plots=False)
    run_bench(resumed, target=target, progress=False)
    assert (run_dir / "samples.jsonl").read_text() == lines
    assert len(json.loads((run_dir / "config.json").read_text())["sessions"]) == 2
    with pytest.raises(DcocoError, match="--resume"):
        run_bench(dataclasses.replace(config, plots=False), target=target, progress=False)


def test_resume_refuses_another_kind_of_machine(run_dir, config, target):
    record_file = run_dir / "config.json"
    record = json.loads(record_file.read_text())
    record["sessions"][0]["machine"] = {"cpu": "Another CPU", "flags": ["avx2"], "cores": 2}
    record_file.write_text(json.dumps(record))
    lines = (run_dir / "samples.jsonl").read_text()
    resumed = dataclasses.replace(config, resume=True, plots=False)
    with pytest.raises(DcocoError, match="measured on Another CPU avx2; this machine is"):
        run_bench(resumed, target=target, progress=False)
    assert (run_dir / "samples.jsonl").read_text() == lines  # nothing lost
    assert json.loads(record_file.read_text()) == record


def test_shards_split_every_suite_and_together_make_the_whole_run(run_dir, config, target):
    """Two shards of one run: each gets a share of every suite, none overlaps, and the union of
    their sample files is the unsharded run's set of samples, with equal greedy outputs (fp32)."""
    prompts = load_bench_prompts(config)
    halves = [round_robin(prompts, shard, 2) for shard in (0, 1)]
    assert sorted(p.id for half in halves for p in half) == sorted(p.id for p in prompts)
    assert all({p.suite for p in half} == {"gsm8k", "mtbench"} for half in halves)
    assert [p.suite for p in round_robin(prompts)] == ["gsm8k", "mtbench", "gsm8k", "mtbench"]

    sharded = dataclasses.replace(config, run_name="sharded", shards=2, plots=False)
    for shard in (0, 1):
        run_bench(dataclasses.replace(sharded, shard=shard), target=target, progress=False)
    shard_dir = run_dir.parent / "sharded"
    assert sorted(path.name for path in shard_dir.glob("samples*.jsonl")) == [
        "samples.shard0of2.jsonl",
        "samples.shard1of2.jsonl",
    ]
    whole = {sample_key(r): r for r in read_samples(run_dir)}
    parts = {sample_key(r): r for r in read_samples(shard_dir)}
    assert parts.keys() == whole.keys()
    for key, record in parts.items():
        if key[1] == 0:
            assert record["new_ids"] == whole[key]["new_ids"], key
    sessions = json.loads((shard_dir / "config.json").read_text())["sessions"]
    assert [session["shard"] for session in sessions] == ["0/2", "1/2"]
    with pytest.raises(DcocoError, match="--shard must be"):
        run_bench(dataclasses.replace(sharded, shard=2, resume=True), target=target)


def test_bench_report_rebuilds_from_samples(run_dir):
    (run_dir / "report.md").unlink()
    assert main(["bench-report", str(run_dir), "--no-plots"]) == 0
    assert "### Cycle time split" in (run_dir / "report.md").read_text()


def test_compare_prints_the_shared_overall_table(target, monkeypatch, capsys):
    monkeypatch.setattr("dcoco.eval.compare.open_target", lambda config, methods=(): target)
    argv = ["compare", "--methods", "plain,pld", "--limit", "2", "--max-new-tokens", "8"]
    assert main([*argv, "--dtype", "fp32", "--no-warmup"]) == 0
    out = capsys.readouterr().out
    assert "| method | samples |" in out and "| pld | 2 |" in out and "| 100% |" in out


def test_bench_runs_head_methods_on_an_arbitrary_file(config, target, tmp_path):
    """`--methods plain,dcoco@DIR,...` on a prompts file: every head decodes losslessly (fp32)."""
    from dcoco.models.drafter.drafter import BlockDrafter
    from dcoco.models.drafter.drafter_config import DrafterConfig
    from dcoco.models.heads.corrector import Corrector, CorrectorConfig
    from dcoco.models.heads.head_io import save_with_head
    from dcoco.models.heads.sequential_heads import MarkovHead, MarkovHeadConfig

    drafter_config = DrafterConfig.for_target(target, num_layers=1, block_size=5, mask_token_id=3,
                                              target_layer_ids=(0, 2))  # fmt: skip
    torch.manual_seed(0)
    drafter = BlockDrafter(drafter_config, target.embed_tokens, target.lm_head)
    corrector = Corrector(CorrectorConfig(64, top_k=4, mlp_hidden=16), target.embed_tokens)
    markov = MarkovHead(MarkovHeadConfig(64, 128, rank=8), target.embed_tokens)
    for head in (corrector, markov):  # non-zero outputs, so the heads really re-draft
        for parameter in head.parameters():
            torch.nn.init.normal_(parameter, std=0.5)
    dcoco_dir = save_with_head(tmp_path / "dcoco", drafter, corrector, target.info, torch.float32)
    dspark_dir = save_with_head(tmp_path / "dspark", drafter, markov, target.info, torch.float32)
    methods = (
        "plain", f"dflash@{dcoco_dir}", f"dcoco@{dcoco_dir}", f"dcoco:global@{dcoco_dir}",
        f"dspark@{dspark_dir}",
    )  # fmt: skip
    settings = dataclasses.replace(
        config, methods=methods, limit=3, temperatures=(0.0,), run_name="heads", plots=False
    )
    run_dir = run_bench(settings, target=target, progress=False)
    records = read_samples(run_dir)
    assert {r["method"] for r in records} == set(methods)
    by_method = {}
    for record in records:
        by_method.setdefault(record["method"], {})[(record["id"], record["turn"])] = record
    for method, rows in by_method.items():
        for key, record in rows.items():
            assert record["new_ids"] == by_method["plain"][key]["new_ids"], (method, key)
    assert any(r["time_s"]["correct"] > 0 for r in by_method[f"dcoco@{dcoco_dir}"].values())
    summary = json.loads((run_dir / "summary.json").read_text())["results"]["0"]
    assert set(summary) == set(methods)
    for method in methods:
        overall = summary[method]["overall"]
        # every head is lossless in fp32: each sample equals plain's, token for token
        assert overall["match_rate"] == 1.0 and overall["samples"] == len(by_method["plain"])
        assert overall["tau"] >= 1.0
    assert summary["plain"]["overall"]["tau"] == 1.0
    # only the heads spend time correcting after the drafter's pass; every drafter method drafts
    correct_ms = {m: summary[m]["overall"]["cycle_split"]["correct_ms"] for m in methods}
    assert correct_ms["plain"] == correct_ms[f"dflash@{dcoco_dir}"] == 0.0
    assert all(correct_ms[m] > 0 for m in methods[2:])
    assert all(summary[m]["overall"]["cycle_split"]["draft_ms"] > 0 for m in methods[1:])


def test_heldout_on_a_bench_run_rebuilds_its_prompts(run_dir, target, tmp_path):
    """`heldout --bench-run`: each (prompt, turn) comes back with the exact context plain decoded
    from (decoding it again gives the same reply, second MT-Bench turns included), and the rows
    split by suite."""
    from dcoco.contracts import SamplingParams
    from dcoco.decode.engine import Engine
    from dcoco.eval.bench_corpus import bench_samples
    from dcoco.eval.heldout import HeldoutConfig, markdown_table, measure
    from dcoco.models.drafter.drafter import BlockDrafter
    from dcoco.models.drafter.drafter_config import DrafterConfig
    from dcoco.models.drafter.drafter_io import save_drafter

    samples = bench_samples(run_dir, target)
    assert sorted(s.id for s in samples) == sorted(
        f"{r['suite']}/{r['id']}/{r['turn']}"
        for r in read_samples(run_dir)
        if r["method"] == "plain" and r["temperature"] == 0
    )
    assert any(s.id.endswith("/2") for s in samples)
    engine = Engine(target)
    for sample in samples:
        again = engine.generate(list(sample.prompt_ids), 12, SamplingParams(), seed=0)
        assert tuple(again.new_ids) == sample.response_ids, sample.id

    config = DrafterConfig.for_target(target, num_layers=1, block_size=4, mask_token_id=3,
                                      target_layer_ids=(0, 2))  # fmt: skip
    torch.manual_seed(0)
    drafter = BlockDrafter(config, target.embed_tokens, target.lm_head)
    path = save_drafter(tmp_path / "d", drafter, target.info, torch.float32)
    settings = HeldoutConfig(methods=(f"dflash@{path}",), num_draft_tokens=(1, 3),
                             anchors_per_seq=0, bench_run=str(run_dir), oracle_k=0)  # fmt: skip
    result = measure(settings, target=target)
    (row,) = result["methods"].values()
    assert set(row["suites"]) == {"gsm8k", "mtbench"}
    assert sum(part["blocks"] for part in row["suites"].values()) == row["blocks"]
    assert "τ per suite" in markdown_table(result)
    with pytest.raises(DcocoError, match="not a `dcoco bench` run"):
        bench_samples(tmp_path, target)


def test_every_report_table_has_as_many_separators_as_header_cells(run_dir):
    lines = (run_dir / "report.md").read_text().splitlines()
    tables = 0
    for header, separator in zip(lines, lines[1:], strict=False):
        if separator.startswith("|---"):
            tables += 1
            assert header.count("|") == separator.count("|"), header
    assert tables >= 5


def test_report_tabulates_per_position_acceptance_of_drafting_methods(run_dir):
    report = (run_dir / "report.md").read_text()
    table = report.split("### Per-position acceptance (all suites)")[1].split("###")[0]
    rows = [line for line in table.splitlines() if line.startswith("| ")]
    assert rows[0].startswith("| method | slot 1 | slot 2 |")
    assert [row.split(" | ")[0] for row in rows[1:]] == ["| pld"]  # plain drafts nothing
    assert "%" in rows[1] and "(" in rows[1]


def test_a_resumed_run_keeps_the_precision_its_first_session_ran_at(tmp_path):
    """`--dtype auto` chosen again from a shared machine's timings could land elsewhere; a
    resumed run takes its first session's precision and head instead."""
    from dcoco.eval.run_record import keep_first_precision

    record = {"config": {}, "sessions": [{"dtype": "gguf", "head_dtype": "fp32"}, {"dtype": "x"}]}
    (tmp_path / "config.json").write_text(json.dumps(record))
    config = BenchConfig()  # dtype and head dtype auto
    keep_first_precision(config, tmp_path / "config.json")
    assert (config.dtype, config.head_dtype) == ("gguf", "fp32")
    record["sessions"][0].pop("head_dtype")  # a run from before the head setting
    (tmp_path / "config.json").write_text(json.dumps(record))
    asked = BenchConfig(dtype="bf16")
    keep_first_precision(asked, tmp_path / "config.json")
    assert (asked.dtype, asked.head_dtype) == ("bf16", "target")  # what is asked for stays
    (tmp_path / "config.json").write_text("{broken")
    with pytest.raises(DcocoError, match="config.json is unreadable"):
        keep_first_precision(BenchConfig(), tmp_path / "config.json")
