"""One resolver for a method spec (dcoco.decode.methods.resolve_method): its checkpoint, head,
draft-slot limit and selection rule, the same for the engine and for `dcoco serve`."""

from __future__ import annotations

import pytest
import torch

from dcoco.decode.methods import MethodOptions, build_proposer, resolve_method
from dcoco.errors import DcocoError
from dcoco.models.drafter import BlockDrafter
from dcoco.models.drafter_config import DrafterConfig
from dcoco.models.drafter_io import save_drafter
from dcoco.models.head_io import save_with_head
from dcoco.models.head_registry import build_head


@pytest.fixture
def checkpoints(tiny_llama_target, tmp_path):
    """(a plain block-5 drafter, the same drafter with a dcoco head) as checkpoint directories."""
    target = tiny_llama_target
    config = DrafterConfig.for_target(
        target, block_size=5, mask_token_id=3, target_layer_ids=(0, 1)
    )
    torch.manual_seed(0)
    drafter = BlockDrafter(config, target.embed_tokens, target.lm_head).eval()
    plain = save_drafter(tmp_path / "drafter", drafter, target.info)
    fields = {"hidden_size": config.hidden_size, "top_k": 4, "mlp_hidden": 8}
    head = build_head("dcoco", fields, target.embed_tokens)
    return plain, save_with_head(tmp_path / "head", drafter, head, target.info)


def test_a_drafter_spec_resolves_its_checkpoint_slots_and_selection(tiny_llama_target, checkpoints):
    plain, headed = checkpoints
    options = MethodOptions(selection="global")
    dflash = resolve_method(f"dflash@{plain}", tiny_llama_target, options)
    assert (dflash.path, dflash.head_kind, dflash.max_slots, dflash.selection) == (
        plain, None, 4, None
    )  # fmt: skip
    assert [dflash.draft_slots(n) for n in (0, 2, 4, 9)] == [4, 2, 4, 4]
    assert resolve_method(f"dcoco@{headed}", tiny_llama_target, options).selection == "global"
    keep1 = resolve_method(f"dcoco:keep1@{headed}", tiny_llama_target, options)
    assert (keep1.head_kind, keep1.selection) == ("dcoco", "keep1")
    walk4 = resolve_method(f"dcoco:greedy/4@{headed}", tiny_llama_target, options)
    assert walk4.selection == "greedy/4"
    # the drafter part of a head checkpoint decodes in our engine, but vLLM would build its head
    assert resolve_method(f"dflash@{headed}", tiny_llama_target, options).head_kind == "dcoco"
    with pytest.raises(DcocoError, match="holds a dcoco head: serve it with --method dcoco"):
        resolve_method(f"dflash@{headed}", tiny_llama_target, options, serving=True)


@pytest.mark.parametrize(
    "spec, message",
    [
        ("dcoco@{plain}", "carries no draft head, not the dcoco head"),
        ("dspark@{headed}", "carries a dcoco head, not the dspark head"),
        ("dflash@{plain}/nowhere", "no checkpoint for dflash"),
        ("dflash:keep1@{plain}", "only dcoco takes a selection rule"),
        ("dcoco:greedy/5@{headed}", "walks 5 candidates, but the corrector .* top 4"),
        ("dcoco:greedy/0@{headed}", "K in RULE/K must be a whole number"),
    ],
)
def test_a_spec_that_does_not_fit_its_checkpoint_is_one_clear_error(
    tiny_llama_target, checkpoints, spec, message
):
    plain, headed = checkpoints
    method = spec.format(plain=plain, headed=headed)
    with pytest.raises(DcocoError, match=message):
        resolve_method(method, tiny_llama_target, MethodOptions())
    with pytest.raises(DcocoError, match=message):  # the engine builds from the same check
        build_proposer(method, tiny_llama_target, MethodOptions())


def test_lookup_and_plain_need_no_checkpoint(tiny_llama_target):
    assert resolve_method("pld", tiny_llama_target, MethodOptions()).max_slots == 8
    assert (
        resolve_method("pld", tiny_llama_target, MethodOptions(num_draft_tokens=12)).max_slots == 12
    )
    assert resolve_method("plain", tiny_llama_target, MethodOptions()).path is None


def test_a_served_selection_with_k_is_a_view_of_the_checkpoint(checkpoints, tmp_path, monkeypatch):
    """`dcoco serve --method dcoco:greedy/4`: vLLM reads the rule from a linked view of the
    checkpoint whose config names it; the view's name holds no path separator."""
    import json

    from dcoco.models.head_io import SELECTION_KEY
    from dcoco.serving.checkpoint_view import with_selection

    monkeypatch.setenv("DCOCO_CACHE_DIR", str(tmp_path / "cache"))
    _, headed = checkpoints
    view = with_selection(headed, "greedy/4")
    assert view.parent == tmp_path / "cache" / "serve" and view.name.endswith("-greedy-k4")
    assert json.loads((view / "config.json").read_text())[SELECTION_KEY] == "greedy/4"
    assert (view / "model.safetensors").resolve() == (headed / "model.safetensors").resolve()
