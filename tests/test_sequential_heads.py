"""The DSpark- and Domino-style sequential heads: untrained they keep the drafter's argmax; their
vectorised select and training loss equal a slow per-row, per-slot loop over the full vocabulary;
they learn; the engine stays lossless with them; and they survive a checkpoint round trip."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dcoco.contracts import IGNORE
from dcoco.decode.engine import Engine
from dcoco.decode.head_proposer import HeadProposer
from dcoco.errors import DcocoError
from dcoco.models.drafter.drafter import BlockDrafter
from dcoco.models.drafter.drafter_config import DrafterConfig
from dcoco.models.drafter.drafter_io import load_drafter
from dcoco.models.heads.base import HeadBatch
from dcoco.models.heads.head_io import head_kind_of, load_head, save_with_head
from dcoco.models.heads.head_registry import build_head
from dcoco.models.heads.sequential_heads import GruHeadConfig, MarkovHeadConfig

VOCAB, HIDDEN, SLOTS, BLOCKS = 40, 12, 5, 6
TAPS = (0, 1, 3)
HEADS = [
    ("dspark", dict(rank=8)),
    ("dspark", dict(rank=8, gated=True)),
    ("domino", dict(state_size=10, mlp_hidden=16)),
]
HEAD_IDS = ["markov", "gated-markov", "gru"]


pytestmark = pytest.mark.usefixtures("one_thread")


def make_head(kind: str, fields: dict, embed: nn.Embedding | None = None, seed: int = 0):
    torch.manual_seed(seed)
    embed = embed if embed is not None else nn.Embedding(VOCAB, HIDDEN)
    sizes = dict(hidden_size=embed.embedding_dim, vocab_size=embed.num_embeddings)
    return build_head(kind, {**sizes, **fields}, embed)


def randomise(head: nn.Module, std: float = 1.0) -> nn.Module:
    """A non-zero output layer, so the head's correction changes drafts."""
    with torch.no_grad():
        for param in getattr(head, output_layer_name(head)).parameters():
            nn.init.normal_(param, std=std)
    return head


def output_layer_name(head: nn.Module) -> str:
    return "bias_out" if head.kind == "dspark" else "delta_out"


def random_batch(
    seed: int, vocab_ids: Tensor | None = None, progress: float = 1.0
) -> tuple[HeadBatch, Tensor]:
    """A HeadBatch over the loss vocabulary `vocab_ids`, and its full-vocabulary logits [blocks,
    slots, vocab]. Block 0 runs past the sequence's end: its last two labels are IGNORE."""
    generator = torch.Generator().manual_seed(seed)
    hidden = torch.randn(BLOCKS, SLOTS, HIDDEN, generator=generator)
    full_logits = 3 * torch.randn(BLOCKS, SLOTS, VOCAB, generator=generator)
    labels = torch.randint(0, VOCAB, (BLOCKS, SLOTS), generator=generator)
    labels[0, -2:] = IGNORE
    if vocab_ids is None:
        label_index = labels.clone()
    else:
        column_of = torch.full((VOCAB,), IGNORE)
        column_of[vocab_ids] = torch.arange(vocab_ids.numel())
        label_index = torch.where(labels >= 0, column_of[labels.clamp(min=0)], IGNORE)
    batch = HeadBatch(
        hidden=hidden,
        logits=full_logits if vocab_ids is None else full_logits[..., vocab_ids],
        vocab_ids=vocab_ids,
        anchor_ids=torch.randint(0, VOCAB, (BLOCKS,), generator=generator),
        label_ids=labels,
        label_index=label_index,
        slot_weights=torch.exp(-torch.arange(SLOTS) / 3.0),
        progress=progress,
    )
    return batch, full_logits


def reference_correction(head, hidden: Tensor, previous: int, state: Tensor):
    """One slot of one row, the slow way: (full-vocab correction [vocab], GRU state [state])."""
    if head.kind == "dspark":
        code = head.token_code.weight[previous]  # [rank]
        if head.gate is not None:
            gate_input = torch.cat([hidden, code])
            code = code * torch.sigmoid(head.gate.weight @ gate_input + head.gate.bias)
        return head.bias_out.weight @ code, state
    embed = head._shared[0].weight[previous]  # [hidden]
    state = head.prefix(embed[None], state[None])[0]
    mlp = F.silu(head.delta_in.weight @ torch.cat([hidden, state]) + head.delta_in.bias)
    return head.delta_out.weight @ mlp + head.delta_out.bias, state


@torch.no_grad()
def reference_draft(head, hidden, logits, anchor_ids, forced: Tensor | None = None):
    """Drafted ids [batch, slots] and corrected logits [batch, slots, vocab], one row and one
    slot at a time. With `forced` [batch, slots], slot k reads forced[:, k - 1] instead of the
    token drafted at k - 1 (teacher forcing)."""
    drafted = torch.empty(logits.shape[:2], dtype=torch.long)
    corrected = torch.empty_like(logits)
    state_size = getattr(head.config, "state_size", 1)
    for row in range(logits.shape[0]):
        previous, state = int(anchor_ids[row]), torch.zeros(state_size)
        for slot in range(logits.shape[1]):
            correction, state = reference_correction(head, hidden[row, slot], previous, state)
            corrected[row, slot] = logits[row, slot] + correction
            drafted[row, slot] = corrected[row, slot].argmax()
            previous = int(drafted[row, slot] if forced is None else max(forced[row, slot], 0))
    return drafted, corrected


def reference_loss(head, batch: HeadBatch, full_logits: Tensor) -> tuple[Tensor, Tensor]:
    """(weighted loss, correct) from full-vocab corrected logits restricted to the loss vocab."""
    _, corrected = reference_draft(
        head, batch.hidden, full_logits, batch.anchor_ids, forced=batch.label_ids
    )
    vocab_ids = batch.vocab_ids if batch.vocab_ids is not None else torch.arange(VOCAB)
    corrected, base = corrected[..., vocab_ids], full_logits[..., vocab_ids]
    base_weight = head.curriculum_lambda(batch.progress) if head.kind == "domino" else 0.0
    total = torch.tensor(0.0)
    for block in range(BLOCKS):
        for slot in range(SLOTS):
            column = int(batch.label_index[block, slot])
            if column == IGNORE:
                continue
            ce = F.cross_entropy(corrected[block, slot], torch.tensor(column))
            base_ce = F.cross_entropy(base[block, slot], torch.tensor(column))
            mixed = (1 - base_weight) * ce + base_weight * base_ce
            total = total + batch.slot_weights[slot] * mixed
    return total, vocab_ids[corrected.argmax(dim=-1)] == batch.label_ids


@pytest.mark.parametrize(("kind", "fields"), HEADS, ids=HEAD_IDS)
def test_untrained_head_keeps_the_drafter_argmax(kind, fields):
    head = make_head(kind, fields)
    vocab_ids = torch.randperm(VOCAB, generator=torch.Generator().manual_seed(1))[:28]
    for seed, ids in enumerate([None, vocab_ids]):
        batch, full_logits = random_batch(seed, ids)
        with torch.no_grad():
            drafted = head.select(batch.hidden, full_logits, batch.anchor_ids)
            loss = head.training_loss(batch)
        assert torch.equal(drafted, full_logits.argmax(dim=-1))
        columns = batch.logits.argmax(dim=-1)
        argmax_ids = columns if ids is None else ids[columns]
        assert torch.equal(loss.correct, argmax_ids == batch.label_ids)
        assert not loss.correct[0, -2:].any()  # IGNORE labels are never matched


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("kind", "fields"), HEADS, ids=HEAD_IDS)
def test_select_equals_the_slow_loop(kind, fields, dtype):
    head = randomise(make_head(kind, fields))
    batch, full_logits = random_batch(seed=2)
    with torch.no_grad():
        expected, _ = reference_draft(head, batch.hidden, full_logits, batch.anchor_ids)
        assert not torch.equal(expected, full_logits.argmax(dim=-1))  # the head changes drafts
        if dtype == torch.float32:
            assert torch.equal(head.select(batch.hidden, full_logits, batch.anchor_ids), expected)
        else:  # bf16 weights round the correction; fp32 logits in, valid ids out
            drafted = head.to(dtype).select(batch.hidden, full_logits, batch.anchor_ids)
            assert drafted.shape == (BLOCKS, SLOTS) and drafted.dtype == torch.long
            assert ((drafted >= 0) & (drafted < VOCAB)).all()


@pytest.mark.parametrize("progress", [1.0, 0.25])
@pytest.mark.parametrize(("kind", "fields"), HEADS, ids=HEAD_IDS)
def test_training_loss_equals_the_slow_loop(kind, fields, progress):
    head = randomise(make_head(kind, fields), std=0.3)
    vocab_ids = torch.randperm(VOCAB, generator=torch.Generator().manual_seed(4))[:28]
    for seed, ids in enumerate([None, vocab_ids]):
        batch, full_logits = random_batch(seed + 10, ids, progress=progress)
        with torch.no_grad():
            loss = head.training_loss(batch)
        expected_loss, expected_correct = reference_loss(head, batch, full_logits)
        torch.testing.assert_close(loss.weighted_loss, expected_loss, rtol=1e-5, atol=1e-5)
        assert torch.equal(loss.correct, expected_correct)
        if ids is not None:
            assert (batch.label_index == IGNORE).sum() > 2  # some labels are outside the vocab


@pytest.mark.parametrize(("kind", "fields"), HEADS, ids=HEAD_IDS)
def test_a_head_learns_what_the_drafter_misses(kind, fields):
    """Each label is a function of the previous token, which the (noise) base logits ignore."""
    head = make_head(kind, {**fields, "lambda_warm": 0.0} if kind == "domino" else fields)
    batch, _ = random_batch(seed=5)
    previous = batch.anchor_ids
    for slot in range(SLOTS):
        batch.label_ids[:, slot] = (7 * previous + 3) % VOCAB
        previous = batch.label_ids[:, slot]
    batch.label_index = batch.label_ids.clone()
    optimizer = torch.optim.Adam(head.parameters(), lr=0.05)
    losses = []
    for _ in range(40):
        loss = head.training_loss(batch)
        optimizer.zero_grad()
        loss.weighted_loss.backward()
        optimizer.step()
        losses.append(loss.weighted_loss.item())
    assert losses[-1] < 0.3 * losses[0], losses
    assert head.training_loss(batch).correct.float().mean() > 0.9


def test_domino_curriculum_moves_from_base_to_corrected_ce():
    head = randomise(make_head("domino", dict(state_size=10, mlp_hidden=16)), std=0.3)
    losses = {}
    for progress in (0.0, 0.5, 1.0):
        batch, _ = random_batch(seed=6, progress=progress)
        losses[progress] = head.training_loss(batch).weighted_loss
    base = F.cross_entropy(
        batch.logits.flatten(0, 1), batch.label_index.flatten(), reduction="none"
    ).view(BLOCKS, SLOTS)
    torch.testing.assert_close(losses[0.0], (base * batch.slot_weights).sum())
    assert not torch.allclose(losses[1.0], losses[0.0])
    torch.testing.assert_close(losses[0.5], (losses[0.0] + losses[1.0]) / 2)
    # At lambda 1 the loss is the drafter's alone: no gradient reaches the head.
    losses[0.0].backward()
    assert not head.delta_out.weight.grad.any()
    half = make_head("domino", dict(state_size=10, mlp_hidden=16, lambda_warm=0.5))
    assert half.curriculum_lambda(0.0) == 0.5 and half.curriculum_lambda(1.0) == 0.0


def test_bad_configs_are_refused():
    with pytest.raises(DcocoError, match="rank"):
        MarkovHeadConfig(HIDDEN, VOCAB, rank=0)
    with pytest.raises(DcocoError, match="lambda_warm"):
        GruHeadConfig(HIDDEN, VOCAB, lambda_warm=1.5)
    with pytest.raises(DcocoError, match="embedding size"):
        build_head("domino", dict(hidden_size=HIDDEN + 1, vocab_size=VOCAB), nn.Embedding(40, 12))
    with pytest.raises(DcocoError, match="unknown fields"):
        build_head(
            "dspark", dict(hidden_size=HIDDEN, vocab_size=VOCAB, top_k=4), nn.Embedding(1, 1)
        )


class ChangeCountingHead:
    """Passes `select` through, counting the blocks whose draft differs from the drafter's."""

    def __init__(self, head: nn.Module):
        self.head, self.kind, self.config = head, head.kind, head.config
        self.changed = 0

    def select(self, hidden: Tensor, logits: Tensor, anchor_ids: Tensor) -> Tensor:
        drafted = self.head.select(hidden, logits, anchor_ids)
        self.changed += int((drafted != logits.argmax(dim=-1)).any())
        return drafted


def tiny_drafter(target) -> BlockDrafter:
    config = DrafterConfig.for_target(target, num_layers=1, block_size=6, mask_token_id=3,
                                      target_layer_ids=TAPS)  # fmt: skip
    torch.manual_seed(0)
    return BlockDrafter(config, target.embed_tokens, target.lm_head)


@pytest.mark.parametrize(("kind", "fields"), HEADS[::2], ids=HEAD_IDS[::2])
def test_a_randomised_head_keeps_greedy_output(tiny_target, kind, fields):
    drafter = tiny_drafter(tiny_target)
    head = ChangeCountingHead(randomise(make_head(kind, fields, tiny_target.embed_tokens), 3.0))
    generator = torch.Generator().manual_seed(3)
    for _ in range(2):
        prompt = torch.randint(5, 128, (8,), generator=generator).tolist()
        plain = Engine(tiny_target, None).generate(prompt, 24)
        with_head = Engine(tiny_target, HeadProposer(drafter, head)).generate(prompt, 24)
        assert with_head.new_ids == plain.new_ids
    assert head.changed > 0  # the head's drafts were not the drafter's


@pytest.mark.parametrize(("kind", "fields"), HEADS, ids=HEAD_IDS)
def test_checkpoint_round_trip(tiny_llama_target, tmp_path, kind, fields):
    target = tiny_llama_target
    drafter = tiny_drafter(target)
    head = randomise(make_head(kind, fields, target.embed_tokens))
    assert not any("embed_tokens" in name or "_shared" in name for name in head.state_dict())
    path = save_with_head(tmp_path / kind, drafter, head, target.info, dtype=torch.float32)
    assert head_kind_of(path) == kind
    loaded_drafter = load_drafter(path, target, dtype=torch.float32)
    for name, tensor in drafter.state_dict().items():
        assert torch.equal(loaded_drafter.state_dict()[name], tensor), name
    loaded = load_head(path, target, loaded_drafter, dtype=torch.float32)
    assert type(loaded) is type(head) and loaded.config == head.config
    for name, tensor in head.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name
    assert loaded.state_dict()[f"{output_layer_name(head)}.weight"].any()
    hidden = torch.randn(3, SLOTS, target.info.hidden_size)
    logits = torch.randn(3, SLOTS, target.info.vocab_size)
    anchors = torch.tensor([5, 9, 17])
    with torch.no_grad():
        assert torch.equal(
            loaded.select(hidden, logits, anchors), head.select(hidden, logits, anchors)
        )
