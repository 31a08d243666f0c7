"""One resolver for a method spec (dcoco.decode.methods.resolve_method): its checkpoint, head,
draft-slot limit and selection rule, the same for the engine and for `dcoco serve`."""

from __future__ import annotations

import pytest
import torch

from dcoco.decode.methods import MethodOptions, build_proposer, resolve_method
from dcoco.errors import DcocoError
from dcoco.models.drafter.drafter import BlockDrafter
from dcoco.models.drafter.drafter_config import DrafterConfig
from dcoco.models.drafter.drafter_io import save_drafter
from dcoco.models.heads.head_io import save_with_head
from dcoco.models.heads.head_registry import build_head


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

    from dcoco.models.heads.head_io import SELECTION_KEY
    from dcoco.serving.checkpoint_view import VOCAB_WEIGHTS_FILE, served_view

    monkeypatch.setenv("DCOCO_CACHE_DIR", str(tmp_path / "cache"))
    _, headed = checkpoints
    view = served_view(headed, "greedy/4")
    assert view.parent == tmp_path / "cache" / "serve" and "/" not in view.name
    config = json.loads((view / "config.json").read_text())
    assert config[SELECTION_KEY] == "greedy/4" and "draft_vocab_size" not in config
    assert (view / "model.safetensors").resolve() == (headed / "model.safetensors").resolve()
    assert not (view / VOCAB_WEIGHTS_FILE).exists()
    assert served_view(headed, "greedy/4") == view and served_view(headed, "keep1") != view


def _target_dir(path, tied: bool):
    import json

    from safetensors.torch import save_file

    path.mkdir()
    weight = torch.randn(32, 8)
    name = "model.embed_tokens.weight" if tied else "lm_head.weight"
    others = {} if tied else {"model.embed_tokens.weight": torch.zeros(32, 8)}
    save_file({name: weight, **others}, str(path / "model.safetensors"))
    config = {"vocab_size": 32, "tie_word_embeddings": tied}
    (path / "config.json").write_text(json.dumps(config))
    return weight


@pytest.mark.parametrize("tied", [True, False])
def test_a_served_draft_vocabulary_is_the_targets_head_rows_in_vllms_layout(
    checkpoints, tmp_path, monkeypatch, tied
):
    """`dcoco serve --draft-vocab N`: the view holds the target's LM head rows of the vocabulary
    (the tied embedding's where it ties) and vLLM's `d2t` offsets, config `draft_vocab_size`."""
    import json

    from safetensors.torch import load_file

    from dcoco.models.heads.head_io import SELECTION_KEY
    from dcoco.serving.checkpoint_view import VOCAB_WEIGHTS_FILE, ServedVocab, served_view

    monkeypatch.setenv("DCOCO_CACHE_DIR", str(tmp_path / "cache"))
    _, headed = checkpoints
    weight = _target_dir(tmp_path / "target", tied)
    vocab = ServedVocab(torch.tensor([9, 3, 30]), tmp_path / "target")
    view = served_view(headed, "greedy/4", vocab)
    config = json.loads((view / "config.json").read_text())
    assert config["draft_vocab_size"] == 3 and config[SELECTION_KEY] == "greedy/4"
    head = load_file(str(view / VOCAB_WEIGHTS_FILE))
    assert torch.equal(head["lm_head.weight"], weight[[3, 9, 30]])  # columns in the vocab's order
    assert head["d2t"].tolist() == [3, 8, 28]  # token id - column, as vLLM adds them back
    assert served_view(headed, "greedy/4", vocab) == view
    other = served_view(headed, None, ServedVocab(torch.tensor([3, 9]), tmp_path / "target"))
    assert other != view and "draft_vocab_size" not in json.loads(
        (served_view(headed, "greedy/4") / "config.json").read_text()
    )


def test_a_target_without_its_head_weights_cannot_cut_a_draft_vocabulary(tmp_path):
    import json

    from dcoco.serving.checkpoint_view import served_vocab, target_head_rows

    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "config.json").write_text(json.dumps({"tie_word_embeddings": False}))
    with pytest.raises(DcocoError, match="--draft-vocab full"):
        target_head_rows(tmp_path / "t", torch.tensor([1]))
    assert served_vocab("auto", tmp_path / "t", "t") is None  # no vocab_size: every row
    with pytest.raises(DcocoError, match="names no vocab_size"):
        served_vocab("12", tmp_path / "t", "t")
