"""The vLLM plugin's pure helpers (dcoco.serving.vllm.plugin): the draft pass's request layout,
the point-mass logits of a head's pick, the supported vLLM release. No vLLM needed."""

from __future__ import annotations

import pytest
import torch

from dcoco.errors import DcocoError
from dcoco.serving.vllm.plugin import NOT_CHOSEN, check_version, point_mass_logits, request_layout


def _blocks(anchors: list[int], slots: int, mask: int = 16) -> torch.Tensor:
    return torch.tensor([x for a in anchors for x in [a, *[mask] * slots]])


def test_request_layout_reads_requests_and_slots_per_call():
    ids = _blocks([101, 102, 103], slots=15)
    assert request_layout(ids, 45, mask_token_id=16, default_slots=15) == (3, 15)
    # dynamic speculative decoding shrank K: derived from the inputs, not the config
    assert request_layout(_blocks([7, 8], slots=4), 8, 16, default_slots=15) == (2, 4)


def test_request_layout_padded_inputs_fall_back_to_the_configured_slots():
    ids = torch.cat([_blocks([5, 6], slots=3), torch.zeros(5, dtype=torch.long)])
    assert request_layout(ids, 6, mask_token_id=16, default_slots=3) == (2, 3)
    with pytest.raises(RuntimeError, match="cannot split"):
        request_layout(torch.arange(10), 6, mask_token_id=16, default_slots=3)


def test_point_mass_logits_make_argmax_and_softmax_pick_the_choice():
    like = torch.randn(4, 50)
    chosen = torch.tensor([3, 0, 49, 7])
    out = point_mass_logits(chosen, like)
    assert out.shape == like.shape and out.dtype == like.dtype
    assert torch.equal(out.argmax(-1), chosen)
    assert torch.equal(out.softmax(-1).argmax(-1), chosen)
    assert torch.allclose(out.softmax(-1).max(-1).values, torch.ones(4))
    assert (out == NOT_CHOSEN).sum() == 4 * 49


def test_version_check_names_the_supported_release():
    assert check_version("0.32.0") == "0.32.0"
    assert check_version("0.32.3+cpu") == "0.32.3+cpu"
    with pytest.raises(DcocoError, match=r"supports vLLM 0\.32\.x only, found vLLM 0\.33\.0"):
        check_version("0.33.0")
