"""The compare report's pooled tables: a method whose server was started twice (`dcoco~2@...`
beside `dcoco@...`) counts as one, at the mean of its servers, with their spread shown."""

from __future__ import annotations

import pytest

from dcoco.eval.served.report import (
    margin_table,
    method_rates,
    numbered,
    pooled,
    ratio_table,
    spread_table,
)


def _run(label: str, rates: dict[int, float]) -> dict:
    levels = [{"temperature": 0.0, "concurrency": c, "output_tok_s": r} for c, r in rates.items()]
    return {"label": label, "levels": levels}


def test_servers_of_one_method_pool_to_their_mean_with_their_spread():
    results = [
        _run("dflash@dflash", {1: 50.0, 8: 200.0}),
        _run("dcoco@dcoco-joint-12k", {1: 60.0, 8: 190.0}),
        _run("dflash~2@dflash", {1: 54.0, 8: 220.0}),
        _run("dcoco~2@dcoco-joint-12k", {1: 66.0, 8: 230.0}),
    ]
    merged = pooled(results)
    assert [result["label"] for result in merged] == ["dflash@dflash", "dcoco@dcoco-joint-12k"]
    dflash = {level["concurrency"]: level for level in merged[0]["levels"]}
    assert dflash[1]["output_tok_s"] == 52.0 and dflash[8]["output_tok_s"] == 210.0
    assert dflash[1]["spread"] == pytest.approx(0.08) and dflash[1]["servers"] == 2
    # the margin from the means: 63 / 52 at one stream, 210 / 210 at eight
    assert "| dflash | 0 | 1.21× | 1.00× |" in margin_table(merged)
    assert "| dcoco | 0 | 2 | 63.0 (10.0%) | 210.0 (21.1%) |" in spread_table(merged)


def test_one_server_per_method_pools_to_nothing():
    assert pooled([_run("plain", {1: 30.0}), _run("dcoco@dcoco-joint-12k", {1: 60.0})]) is None


def test_a_server_with_flags_of_its_own_is_a_row_of_its_own():
    results = [
        _run("plain", {16: 300.0}),
        _run("dcoco@dcoco-joint-12k", {16: 290.0}),
        _run("dcoco@dcoco-joint-12k+draft-schedule:1:6;2-:0", {16: 303.0}),
    ]
    table = ratio_table(results)
    assert "| dcoco | 0 | 0.97× |" in table
    assert "| dcoco+draft-schedule:1:6;2-:0 | 0 | 1.01× |" in table
    margins = margin_table(results)  # no dflash server here: no margins, but a row each
    assert "| dflash | 0 | - |" in margins
    assert "| dflash (`dcoco+draft-schedule:1:6;2-:0`) | 0 | - |" in margins
    assert pooled(results) is None  # two servers, but not of one configuration
    assert method_rates(results)[("dcoco", 0.0)] == {16: 290.0}


def test_runs_compared_together_number_their_repeated_servers():
    first_run = [_run("plain", {1: 30.0}), _run("dcoco@ckpt", {1: 60.0})]
    second_run = [_run("dcoco@ckpt", {1: 64.0}), _run("dcoco~2@ckpt", {1: 62.0})]
    labels = [result["label"] for result in numbered(first_run + second_run)]
    assert labels == ["plain", "dcoco@ckpt", "dcoco~2@ckpt", "dcoco~3@ckpt"]
    merged = {result["label"]: result for result in pooled(numbered(first_run + second_run))}
    assert merged["dcoco@ckpt"]["levels"][0]["output_tok_s"] == 62.0  # three servers' mean
    assert merged["dcoco@ckpt"]["levels"][0]["servers"] == 3
