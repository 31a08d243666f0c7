"""`dcoco heldout`: one set of blocks for every method; an untrained corrector scores exactly as its
drafter does, and τ is the mean accepted prefix + 1."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from dcoco.data.distill import Sample
from dcoco.errors import DcocoError
from dcoco.eval.heldout import HeldoutConfig, _label, markdown_table, measure
from dcoco.models.drafter.drafter import BlockDrafter
from dcoco.models.drafter.drafter_config import DrafterConfig
from dcoco.models.drafter.drafter_io import save_drafter
from dcoco.models.heads.corrector import Corrector, CorrectorConfig
from dcoco.models.heads.head_io import save_with_head

pytestmark = pytest.mark.usefixtures("one_thread")


def test_heldout_compares_methods_on_the_same_blocks(tiny_llama_target, tmp_path):
    target = tiny_llama_target
    config = DrafterConfig.for_target(target, num_layers=1, block_size=5, mask_token_id=3,
                                      target_layer_ids=(0, 2))  # fmt: skip
    torch.manual_seed(0)
    drafter = BlockDrafter(config, target.embed_tokens, target.lm_head)
    corrector = Corrector(CorrectorConfig(64, top_k=4, mlp_hidden=8), target.embed_tokens)
    path = save_with_head(tmp_path / "dcoco", drafter, corrector, target.info, torch.float32)
    # Replies the drafter partly predicts: its own greedy drafts, so acceptance is not all zero.
    generator = torch.Generator().manual_seed(0)
    samples = []
    for i in range(4):
        prompt = torch.randint(5, 128, (6,), generator=generator).tolist()
        samples.append(Sample(f"s{i}", tuple(prompt), tuple(prompt * 3)))
    settings = HeldoutConfig(
        methods=(f"dflash@{path}", f"dcoco@{path}", f"dcoco:global@{path}"),
        num_draft_tokens=(1, 2, 4), anchors_per_seq=0,
    )  # fmt: skip
    result = measure(settings, target=target, samples=samples)
    rows = result["methods"]
    assert rows[_label(f"dflash@{path}")] == rows[_label(f"dcoco@{path}")]  # zero-init head
    for row in rows.values():
        assert row["blocks"] == 4 * 14  # anchors 6 .. 19 of 24 tokens: every full block
        assert row["tau"]["1"] == pytest.approx(1 + row["per_position"][0], abs=1e-4)
        assert row["slot_acc"][0] == row["per_position"][0]  # slot 1 is always reached
        assert row["tau"]["1"] <= row["tau"]["2"] <= row["tau"]["4"] <= 5
    assert f"| {_label(f'dcoco@{path}')} |" in markdown_table(result)


def test_rows_name_checkpoints_without_this_machines_paths(tmp_path, monkeypatch):
    monkeypatch.setenv("DCOCO_CACHE_DIR", str(tmp_path / "cache"))
    run = tmp_path / "cache" / "runs" / "x" / "snapshot"
    assert _label(f"dflash@{run}") == "dflash@$DCOCO_CACHE_DIR/runs/x/snapshot"
    assert _label(f"dcoco:global@{run}") == "dcoco:global@$DCOCO_CACHE_DIR/runs/x/snapshot"
    assert _label("dflash@dflash-b16") == "dflash@dflash-b16" and _label("dflash") == "dflash"
    assert not _label(f"dflash@{tmp_path / 'elsewhere'}").startswith("dflash@/")
    stub = SimpleNamespace(name="no-such-target")
    done = {_label(f"dflash@{run}"): {"blocks": 1, "weights": ""}}  # no checkpoint there
    settings = HeldoutConfig(methods=(f"dflash@{run}",), oracle_k=0)
    result = measure(settings, stub, samples=[], done=done)
    assert result["config"]["methods"] == ["dflash@$DCOCO_CACHE_DIR/runs/x/snapshot"]


def test_heldout_reuses_rows_of_an_earlier_run_with_the_same_settings(tmp_path):
    import json
    from dataclasses import asdict

    from dcoco.eval.heldout import JSON_FILE, _earlier_rows, _weights_digest

    config = HeldoutConfig(methods=("dflash",), out=str(tmp_path))
    row = {"blocks": 1, "tau": {"3": 1.5, "15": 1.5}, "per_position": [0.5]}
    (tmp_path / JSON_FILE).write_text(
        json.dumps({"config": asdict(config), "methods": {"dspark": row}})
    )
    wider = HeldoutConfig(methods=("dflash", "dspark"), out=str(tmp_path))
    assert _earlier_rows(tmp_path / JSON_FILE, wider) == {"dspark": row}
    other = HeldoutConfig(methods=("dflash", "dspark"), out=str(tmp_path), anchors_per_seq=8)
    assert _earlier_rows(tmp_path / JSON_FILE, other) == {}  # other blocks: measure again
    checkpoints = {}
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "model.safetensors").write_bytes(name.encode() * 100)
        checkpoints[name] = f"dflash@{tmp_path / name}"
    specs = HeldoutConfig(methods=tuple(checkpoints.values()), out=str(tmp_path), oracle_k=0)
    stub = SimpleNamespace(name="no-such-target")  # checkpoints are given by path
    done = {_label(m): {**row, "weights": _weights_digest(m, stub)} for m in checkpoints.values()}
    assert measure(specs, target=stub, samples=[], done=done)["methods"] == done


def test_heldout_measures_a_retrained_checkpoint_again(tmp_path):
    """A row is reused only for the same weights: a checkpoint retrained under the same name (the
    shipped `dflash` replaced by a better drafter) must not keep the old drafter's row."""
    from dcoco.eval.heldout import _weights_digest

    (tmp_path / "model.safetensors").write_bytes(b"old weights")
    method, stub = f"dflash@{tmp_path}", SimpleNamespace(name="no-such-target")
    before = _weights_digest(method, stub)
    (tmp_path / "model.safetensors").write_bytes(b"new weights")
    assert _weights_digest(method, stub) != before
    done = {_label(method): {"blocks": 1, "weights": before}}
    with pytest.raises(DcocoError, match="no checkpoint for dflash"):  # not reused: loads it
        measure(HeldoutConfig(methods=(method,), oracle_k=0), target=stub, samples=[], done=done)


def test_heldout_adds_the_count_bigram_on_the_same_blocks(tiny_llama_target, tmp_path):
    target = tiny_llama_target
    config = DrafterConfig.for_target(target, num_layers=1, block_size=4, mask_token_id=3,
                                      target_layer_ids=(0, 2))  # fmt: skip
    torch.manual_seed(0)
    path = save_with_head(
        tmp_path / "dcoco",
        BlockDrafter(config, target.embed_tokens, target.lm_head),
        Corrector(CorrectorConfig(64, top_k=4, mlp_hidden=8), target.embed_tokens),
        target.info,
        torch.float32,
    )
    # A 10-token cycle: the bigram counted on other records of it predicts every slot.
    cycle = list(range(20, 30))
    records = [Sample(f"c{i}", (5, 6), tuple((cycle[i:] + cycle[:i]) * 3)) for i in range(10)]
    settings = HeldoutConfig(
        methods=(f"dflash@{path}",), num_draft_tokens=(1, 3), anchors_per_seq=0
    )
    result = measure(settings, target=target, samples=records[:2], bigram_split=records[2:])
    bigram, drafter = result["methods"]["count bigram"], result["methods"][_label(f"dflash@{path}")]
    assert bigram["blocks"] == drafter["blocks"] == 2 * 27  # the very same blocks
    assert bigram["tau"] == {"1": 2.0, "3": 4.0} and bigram["per_position"] == [1.0, 1.0, 1.0]
    assert bigram["slot_acc"] == [1.0, 1.0, 1.0]
    assert drafter["tau"]["3"] < 2.0  # an untrained drafter is far below the table
    assert "| count bigram |" in markdown_table(result)
    # pld-dflash: once the cycle has come round, lookup names every slot (16 of the 27 blocks)
    lookups = measure(
        HeldoutConfig(
            methods=(f"pld-dflash@{path}", "pld"), num_draft_tokens=(1, 3), anchors_per_seq=0
        ),
        target=target,
        samples=records[:2],
    )["methods"]
    hybrid, pld = lookups[_label(f"pld-dflash@{path}")], lookups["pld"]
    assert hybrid["blocks"] == pld["blocks"] == drafter["blocks"]
    assert hybrid["tau"]["3"] >= (16 * 4 + 11 * 1) / 27 - 1e-4
    # pld also takes single-token matches: it names every slot from one anchor sooner (17 blocks)
    assert pld["tau"]["3"] == pytest.approx((17 * 4 + 10 * 1) / 27, abs=1e-4)


def test_oracle_rows_bound_the_drafter_and_give_each_row_its_headroom_share(
    tiny_llama_target, tmp_path
):
    from dcoco.eval.heldout_table import oracle_names

    target = tiny_llama_target
    config = DrafterConfig.for_target(target, num_layers=1, block_size=4, mask_token_id=3,
                                      target_layer_ids=(0, 2))  # fmt: skip
    torch.manual_seed(0)
    path = tmp_path / "drafter"
    save_drafter(path, BlockDrafter(config, target.embed_tokens, target.lm_head), target.info)
    cycle = list(range(20, 30))
    records = [Sample(f"c{i}", (5, 6), tuple((cycle[i:] + cycle[:i]) * 3)) for i in range(2)]
    label = _label(f"dflash@{path}")
    kept, every = oracle_names(target.info.vocab_size, label)
    settings = HeldoutConfig(methods=(f"dflash@{path}",), num_draft_tokens=(1, 3),
                             anchors_per_seq=0, oracle_k=target.info.vocab_size)  # fmt: skip
    result = measure(settings, target=target, samples=records)
    rows = result["methods"]
    assert rows[every]["tau"] == {"1": 2.0, "3": 4.0}  # the whole vocabulary holds every label
    assert rows[kept]["slot_acc"][0] == rows[label]["slot_acc"][0]  # slot 1 is the drafter's
    assert rows[kept]["slot_acc"][1:] == [1.0, 1.0]
    table = markdown_table(result)
    lines = {line.split(" | ")[0][2:]: line for line in table.splitlines() if line.startswith("| ")}
    assert "headroom" in table and lines[label].endswith("/ 0% |")  # the drafter: none of it
    assert lines[every].endswith("/ 100% |")
    one = measure(HeldoutConfig(methods=(f"dflash@{path}",), num_draft_tokens=(1, 3),
                                anchors_per_seq=0, oracle_k=1),
                  target=target, samples=records)["methods"]  # fmt: skip
    assert all(one[name]["tau"] == one[label]["tau"] for name in oracle_names(1, label))
