"""Copy hints in vLLM (dcoco.serving.vllm.hints): the block inputs the plugin writes, no vLLM."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import torch

from dcoco.models.drafter.copy_hints import NO_HINT, context_hints
from dcoco.models.drafter.drafter import BlockDrafter
from dcoco.models.drafter.drafter_config import DrafterConfig
from dcoco.models.drafter.drafter_io import (
    ARCHITECTURE,
    COPY_ARCHITECTURE,
    read_drafter_config,
    save_drafter,
)
from dcoco.serving.vllm.hints import committed_tokens, reads_hints, write_hints

MASK = 16


def test_write_hints_fills_the_mask_slots_of_requests_whose_tokens_end_at_their_anchor():
    looping = torch.tensor([5, 6, 7, 8, 5, 6, 7, 8, 5, 6], dtype=torch.int32)  # anchor 6
    stale = torch.tensor([5, 6, 7, 8, 5, 6], dtype=torch.int32)  # ends at 6, anchor 9: not current
    fresh = torch.tensor([1, 2, 3], dtype=torch.int32)  # no repeat: no hints
    slots = 4
    input_ids = torch.tensor([6, *[MASK] * slots, 9, *[MASK] * slots, 3, *[MASK] * slots, 0, 0])
    hinted = write_hints(input_ids, [6, 9, 3], [looping, stale, fresh], slots, MASK)
    assert hinted == 2  # the looping and the fresh request
    blocks = input_ids[:15].view(3, 1 + slots)
    assert blocks[0].tolist() == [6, 7, 8, 5, 6]
    assert blocks[0, 1:].tolist() == context_hints(looping.long(), slots).tolist()
    assert blocks[1].tolist() == [9, *[MASK] * slots]
    assert context_hints(fresh.long(), slots).tolist() == [NO_HINT] * slots
    assert blocks[2].tolist() == [3, *[MASK] * slots]
    assert input_ids[15:].tolist() == [0, 0]  # padding untouched


def test_committed_tokens_rebuild_each_request_from_its_verified_inputs():
    """Before vLLM's bookkeeping: the table up to the first verified position, the accepted part
    of the verified tokens, then the anchor."""
    table = np.zeros((2, 16), dtype=np.int32)
    table[0, :5] = [1, 2, 3, 4, 5]  # request 0: 5 committed; verifies [5, d, d, d] at 4..7
    table[1, :3] = [7, 8, 9]  # request 1: prefill of [7, 8, 9] at 0..2
    target_ids = torch.tensor([5, 60, 61, 62, 7, 8, 9])
    positions = torch.tensor([4, 5, 6, 7, 0, 1, 2])
    anchors = torch.tensor([70, 10])
    histories = committed_tokens(table, target_ids, positions, [0, 4, 7], [2, 0], anchors)
    assert histories[0].tolist() == [1, 2, 3, 4, 5, 60, 70]  # 60 accepted, 61 and 62 rejected
    assert histories[1].tolist() == [7, 8, 9, 10]
    assert committed_tokens(table, target_ids, positions, [0, 4, 7], None, anchors)[0].tolist() == [
        1, 2, 3, 4, 5, 60, 61, 62, 70,
    ]  # fmt: skip


def test_a_copy_hint_drafter_names_the_plugin_architecture(tiny_llama_target, tmp_path):
    target = tiny_llama_target
    config = DrafterConfig.for_target(
        target, block_size=4, mask_token_id=3, target_layer_ids=(0, 1)
    )
    for hints, architecture in ((False, ARCHITECTURE), (True, COPY_ARCHITECTURE)):
        drafter = BlockDrafter(
            DrafterConfig(**{**config.__dict__, "copy_hints": hints}),
            target.embed_tokens,
            target.lm_head,
        )
        path = save_drafter(tmp_path / str(hints), drafter, target.info)
        hf = json.loads((path / "config.json").read_text())
        assert hf["architectures"] == [architecture]
        assert read_drafter_config(path)[0].copy_hints == hints
        assert reads_hints(SimpleNamespace(**hf)) == hints
