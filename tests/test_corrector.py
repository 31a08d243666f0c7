"""The corrector: an untrained one keeps the drafter's argmax draft (alone and in the engine), and
the batched K x K transition scores equal a plain loop over every (p, a, b)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dcoco.decode.dflash_proposer import DFlashProposer
from dcoco.decode.engine import Engine
from dcoco.decode.head_proposer import HeadProposer
from dcoco.errors import DcocoError
from dcoco.models.drafter.drafter import BlockDrafter
from dcoco.models.drafter.drafter_config import DrafterConfig
from dcoco.models.heads.corrector import Corrector, CorrectorConfig
from dcoco.models.heads.selection import SELECTION_RULES, selected_token_ids

VOCAB, HIDDEN, SLOTS, TOP_K = 40, 12, 5, 4
TAPS = (0, 1, 3)
ABLATIONS = [
    dict(),
    dict(use_pair_state=False),
    dict(use_candidate_repr=False),
    dict(use_pair_state=False, use_candidate_repr=False),
]


pytestmark = pytest.mark.usefixtures("one_thread")


def make_corrector(seed: int = 0, **flags) -> Corrector:
    torch.manual_seed(seed)
    config = CorrectorConfig(HIDDEN, top_k=TOP_K, mlp_hidden=8, **flags)
    return Corrector(config, nn.Embedding(VOCAB, HIDDEN))


def random_block(batch: int, seed: int) -> tuple[Tensor, Tensor]:
    """What one drafter pass gives: hidden [batch, slots, hidden], logits [batch, slots, vocab]."""
    generator = torch.Generator().manual_seed(seed)
    hidden = torch.randn(batch, SLOTS, HIDDEN, generator=generator)
    return hidden, 3 * torch.randn(batch, SLOTS, VOCAB, generator=generator)


def naive_transition_scores(corrector: Corrector, hidden: Tensor, logits: Tensor) -> Tensor:
    """S [batch, slots - 1, K, K], one (p, a, b) at a time: delta's MLP on the whole input."""
    candidate_logits, candidate_ids = logits.topk(TOP_K, dim=-1)  # [batch, slots, K]
    z = corrector.candidate_repr(hidden, candidate_ids)  # [batch, slots, K, mlp_hidden]
    pair = corrector.pair_state(hidden)  # [batch, slots - 1, mlp_hidden]
    batch, slots = hidden.shape[:2]
    scores = torch.empty(batch, slots - 1, TOP_K, TOP_K)
    for p in range(slots - 1):
        for a in range(TOP_K):
            for b in range(TOP_K):
                features = torch.cat([
                    pair[:, p],
                    z[:, p, a], candidate_logits[:, p, a, None],
                    z[:, p + 1, b], candidate_logits[:, p + 1, b, None],
                ], dim=-1)  # fmt: skip
                delta = corrector.delta_out(F.silu(corrector.delta_in(features)))[:, 0]
                scores[:, p, a, b] = candidate_logits[:, p + 1, b] + delta
    return scores


def test_untrained_corrector_keeps_the_drafter_argmax():
    corrector = make_corrector()
    for seed, batch in enumerate([1, 2, 7]):
        hidden, logits = random_block(batch, seed)
        scores = corrector(hidden, logits)
        assert scores.candidate_ids.shape == (batch, SLOTS, TOP_K)
        assert scores.transitions.shape == (batch, SLOTS - 1, TOP_K, TOP_K)
        expected = scores.candidate_logits[:, 1:, None, :].expand(-1, -1, TOP_K, -1)
        assert torch.equal(scores.transitions, expected)  # delta is exactly 0
        # with delta = 0 no transition prefers another token, so every rule keeps the argmax
        for rule in SELECTION_RULES.values():
            assert torch.equal(selected_token_ids(scores, rule(scores)), logits.argmax(dim=-1))


@pytest.mark.parametrize("flags", ABLATIONS)
def test_batched_scores_equal_the_naive_loop(flags):
    corrector = make_corrector(**flags)
    with torch.no_grad():  # a non-zero delta, so the comparison tests the split first layer
        nn.init.normal_(corrector.delta_out.weight)
        corrector.delta_out.bias.fill_(0.3)
        hidden, logits = random_block(3, seed=5)
        batched = corrector(hidden, logits).transitions
        naive = naive_transition_scores(corrector, hidden, logits)
    assert batched.dtype == torch.float32
    assert not torch.allclose(batched, naive[..., :1, :].expand_as(naive))  # depends on a
    torch.testing.assert_close(batched, naive, rtol=0, atol=1e-5)


def test_ablations_drop_their_inputs():
    hidden, logits = random_block(2, seed=7)
    ids = logits.topk(TOP_K, dim=-1).indices
    with torch.no_grad():
        full = make_corrector()
        assert not torch.allclose(*full.candidate_repr(hidden, ids)[:, :, :2].unbind(2))
        no_repr = make_corrector(use_candidate_repr=False)
        z = no_repr.candidate_repr(hidden, ids)  # [batch, slots, K, mlp_hidden]
        assert torch.equal(z, z[:, :, :1].expand_as(z))  # the same for every candidate
        no_pair = make_corrector(use_pair_state=False)
        assert not no_pair.pair_state(hidden).any()
    names = {name for name, _ in no_pair.named_parameters()}
    assert not any(name.startswith("pair.") for name in names)


def test_the_target_embedding_is_not_saved():
    corrector = make_corrector()
    assert not any("embed" in name for name in corrector.state_dict())
    embedding = corrector._shared[0].weight
    assert all(param is not embedding for param in corrector.parameters())


class RecordingProposer:
    """Passes proposals through, keeping each draft."""

    def __init__(self, proposer):
        self.proposer = proposer
        self.name, self.feature_layers = proposer.name, proposer.feature_layers
        self.drafts: list[list[list[int]]] = []

    def start(self, prompt_ids: list[int]) -> None:
        self.proposer.start(prompt_ids)

    def propose(self, context):
        proposal = self.proposer.propose(context)
        self.drafts.append(proposal.draft_tokens.tolist())
        return proposal


def test_untrained_dcoco_proposer_drafts_like_dflash(tiny_target):
    config = DrafterConfig.for_target(tiny_target, num_layers=1, block_size=6, mask_token_id=3,
                                      target_layer_ids=TAPS)  # fmt: skip
    torch.manual_seed(0)
    drafter = BlockDrafter(config, tiny_target.embed_tokens, tiny_target.lm_head)
    corrector = Corrector(
        CorrectorConfig(config.hidden_size, top_k=8, mlp_hidden=16), tiny_target.embed_tokens
    )
    generator = torch.Generator().manual_seed(3)
    for _ in range(2):
        prompt = torch.randint(5, 128, (8,), generator=generator).tolist()
        plain = Engine(tiny_target).generate(prompt, 24)
        dflash = RecordingProposer(DFlashProposer(drafter))
        dcoco = RecordingProposer(HeadProposer(drafter, corrector))
        assert Engine(tiny_target, dcoco).generate(prompt, 24).new_ids == plain.new_ids
        Engine(tiny_target, dflash).generate(prompt, 24)
        assert dcoco.drafts == dflash.drafts
        assert len(dcoco.drafts[0][0]) == 5  # a whole block: block_size - 1 slots


def test_dcoco_proposer_rejects_a_bad_setup(tiny_llama_target):
    target = tiny_llama_target
    config = DrafterConfig.for_target(target, num_layers=1, block_size=4, mask_token_id=3,
                                      target_layer_ids=TAPS)  # fmt: skip
    drafter = BlockDrafter(config, target.embed_tokens, target.lm_head)
    fits = Corrector(CorrectorConfig(config.hidden_size, top_k=8), target.embed_tokens)
    too_wide = Corrector(CorrectorConfig(config.hidden_size, top_k=200), target.embed_tokens)
    with pytest.raises(DcocoError, match="unknown selection"):
        HeadProposer(drafter, fits, selection="beam")
    with pytest.raises(DcocoError, match="top-k"):
        HeadProposer(drafter, too_wide)
