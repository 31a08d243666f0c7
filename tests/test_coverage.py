"""`dcoco coverage` on a tiny target: its teacher-forced per-slot counts equal what the decoding
path (BlockDrafter.draft with a cache) drafts at the same anchors."""

from __future__ import annotations

import json

import pytest
import torch

from dcoco.data.distill import Sample
from dcoco.eval.coverage import CoverageConfig, measure, write
from dcoco.models.drafter.drafter import BlockDrafter
from dcoco.models.drafter.drafter_config import DrafterConfig
from dcoco.models.drafter.drafter_io import save_drafter

pytestmark = pytest.mark.usefixtures("one_thread")
BLOCK, TOP_K = 4, 5


def test_coverage_counts_match_the_decoding_path(tiny_llama_target, tmp_path):
    target = tiny_llama_target
    config = DrafterConfig.for_target(target, num_layers=1, block_size=BLOCK, mask_token_id=3,
                                      target_layer_ids=(0, 2))  # fmt: skip
    torch.manual_seed(0)
    drafter = BlockDrafter(config, target.embed_tokens, target.lm_head)
    save_drafter(tmp_path / "drafter", drafter, target.info, dtype=torch.float32)
    generator = torch.Generator().manual_seed(1)
    samples = [
        Sample(f"s{i}", tuple(torch.randint(5, 128, (6,), generator=generator).tolist()),
               tuple(torch.randint(5, 128, (9,), generator=generator).tolist()))
        for i in range(3)
    ]  # fmt: skip
    settings = CoverageConfig(drafter=str(tmp_path / "drafter"), top_k=TOP_K, anchors_per_seq=0)
    result = measure(settings, target=target, samples=samples)

    # Every anchor with a full block: response positions 6 .. 15 - BLOCK, per sequence.
    hits = torch.zeros(BLOCK - 1, TOP_K)
    blocks = 0
    for sample in samples:
        ids = torch.tensor(sample.input_ids)
        for anchor in range(len(sample.prompt_ids), len(ids) - BLOCK + 1):
            features = target.forward(ids[None, :anchor], feature_layers=(0, 2)).features
            logits, _ = drafter.draft(ids[anchor : anchor + 1], features, drafter.new_cache())
            ranked = logits[0].topk(TOP_K, dim=-1).indices  # [slots, K]
            labels = ids[anchor + 1 : anchor + BLOCK]
            hits += ((ranked == labels[:, None]).cumsum(-1) > 0).float()
            blocks += 1
    assert result["blocks"] == blocks
    for slot, row in enumerate(result["per_slot"]):
        assert row["coverage"] == pytest.approx((hits[slot] / blocks).tolist(), abs=1e-4)
        assert row["top1"] == row["coverage"][0]
        assert row["coverage"] == sorted(row["coverage"])  # top-k grows with k
        assert row["coverage_when_top1_wrong"][0] == 0.0  # top-1 is wrong there by definition

    out = write(result, tmp_path / "out")
    assert json.loads((out / "coverage.json").read_text())["blocks"] == blocks
    assert (out / "coverage.png").stat().st_size > 0
