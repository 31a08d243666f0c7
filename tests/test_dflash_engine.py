"""The DFlash proposer in the engine: a drafter overfit on the target's own replies is accepted
often, and greedy output stays exactly the target's (fp32)."""

from __future__ import annotations

import pytest
import torch
from conftest import TINY_RUN

from dcoco.data.distill import Sample
from dcoco.decode.dflash_proposer import DFlashProposer
from dcoco.decode.engine import Engine
from dcoco.models.drafter.drafter import BlockDrafter
from dcoco.models.drafter.drafter_config import DrafterConfig
from dcoco.models.drafter.drafter_io import load_drafter
from dcoco.train.drafter_train import DrafterTrainConfig, train

TAPS = (0, 1, 3)


pytestmark = pytest.mark.usefixtures("one_thread")


def prompts(count: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(3)
    return [torch.randint(5, 128, (8,), generator=generator).tolist() for _ in range(count)]


def test_untrained_drafter_keeps_greedy_output(tiny_target):
    config = DrafterConfig.for_target(tiny_target, num_layers=1, block_size=6, mask_token_id=3,
                                      target_layer_ids=TAPS)  # fmt: skip
    torch.manual_seed(0)
    drafter = BlockDrafter(config, tiny_target.embed_tokens, tiny_target.lm_head)
    for prompt in prompts(3):
        plain = Engine(tiny_target).generate(prompt, 30)
        dflash = Engine(tiny_target, DFlashProposer(drafter)).generate(prompt, 30)
        assert dflash.new_ids == plain.new_ids
        assert dflash.stats.proposed_per_slot[0] >= dflash.stats.cycles - 1  # last: 1 token left


def test_overfit_drafter_is_accepted_in_the_engine(tiny_llama_target, tmp_path):
    target = tiny_llama_target
    train_prompts = prompts(24)
    corpus = [
        Sample(f"p{i}", tuple(p), tuple(Engine(target).generate(p, 40).new_ids))
        for i, p in enumerate(train_prompts)
    ]
    config = DrafterTrainConfig(
        out=str(tmp_path / "run"), num_layers=1, block_size=4, mask_token_id=3, taps=TAPS,
        batch_size=4, anchors_per_seq=16, heldout=0, max_steps=150, lr=3e-3, autocast=False,
        eval_every=1000, save_every=1000, **TINY_RUN,
    )  # fmt: skip
    result = train(config, target=target, samples=corpus, progress_bar=False)
    drafter = load_drafter(result["drafter"], target, dtype=torch.float32)
    taus = []
    for prompt in train_prompts[:6]:
        plain = Engine(target).generate(prompt, 40)
        dflash = Engine(target, DFlashProposer(drafter)).generate(prompt, 40)
        assert dflash.new_ids == plain.new_ids
        taus.append(dflash.stats.tau)
    assert sum(taus) / len(taus) > 2.0, taus  # block 4: tau is at most 4
