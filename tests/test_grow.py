"""Growing a drafter by layers: it starts as the drafter it grew from, then its new layers learn."""

from __future__ import annotations

import pytest
import torch

from dcoco.errors import DcocoError
from dcoco.models.drafter.drafter_io import load_drafter
from dcoco.train.drafter_train import train
from dcoco.train.grow import grow_drafter
from tests.test_drafter import setup as setup  # noqa: F401 (the drafter fixture)
from tests.test_drafter_train import cyclic_corpus, tiny_config

pytestmark = pytest.mark.usefixtures("one_thread")


def test_grown_drafter_drafts_exactly_what_it_grew_from(setup):  # noqa: F811
    _, drafter, ids, features = setup
    grown = grow_drafter(drafter, 2, seed=1)
    assert len(grown.layers) == len(drafter.layers) + 2 == grown.config.num_layers
    old_logits, _ = drafter.draft(ids[:, 17], features[:, :17], drafter.new_cache())
    new_logits, _ = grown.draft(ids[:, 17], features[:, :17], grown.new_cache())
    torch.testing.assert_close(new_logits, old_logits, atol=1e-6, rtol=1e-6)
    # The old weights are copies, not the same tensors: training the grown one leaves `drafter`.
    assert grown.fc.weight.data_ptr() != drafter.fc.weight.data_ptr()
    # Only the residual writes are zero; the rest of a new layer has the fresh init.
    new = grown.layers[-1]
    attention, mlp = new.self_attn, new.mlp
    assert attention.o_proj.weight.abs().max() == 0 and mlp.down_proj.weight.abs().max() == 0
    assert attention.q_proj.weight.abs().max() > 0 and mlp.up_proj.weight.abs().max() > 0


def test_growing_needs_a_non_negative_count(setup):  # noqa: F811
    _, drafter, _, _ = setup
    assert grow_drafter(drafter, 0, seed=0) is drafter
    with pytest.raises(DcocoError, match="add-layers"):
        grow_drafter(drafter, -1, seed=0)


def test_grown_run_starts_at_its_init_and_trains_the_new_layers(tiny_llama_target, tmp_path):
    samples = cyclic_corpus()
    base = train(tiny_config(tmp_path / "base", max_steps=20), tiny_llama_target, samples, False)
    config = tiny_config(tmp_path / "grown", max_steps=10, init=base["drafter"], add_layers=1)
    grown = train(config, tiny_llama_target, samples, False)
    # Same held-out blocks, same function: the grown run's first evaluation is the base's last
    # (to bf16 rounding of the saved base).
    assert grown["initial"]["accept"] == pytest.approx(base["final"]["accept"], abs=0.02)
    drafter = load_drafter(grown["drafter"], tiny_llama_target)
    assert drafter.config.num_layers == 3
    assert drafter.layers[2].self_attn.o_proj.weight.abs().max() > 0  # it was trained


def test_add_layers_without_init_is_refused(tmp_path):
    with pytest.raises(DcocoError, match="--add-layers grows an --init drafter"):
        tiny_config(tmp_path, add_layers=1)
