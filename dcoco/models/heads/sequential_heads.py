"""Sequential draft heads: a logit correction applied slot by slot, left to right, after the
drafter's one parallel pass. Both follow the head contract of dcoco.models.heads.base.

- `MarkovHead` (`dspark`, after DSpark's Markov head): a low-rank bias from the previous token,
  B(x_{k-1}) = W1[x_{k-1}] @ W2, optionally gated by sigmoid(Linear([h_k ; W1[x_{k-1}]])).
- `GruHead` (`domino`, after Domino's head): a GRU runs over the target's frozen embeddings of the
  anchor and the tokens drafted so far; an MLP on [h_k ; GRU state] gives a full-vocabulary delta.

Slot k drafts argmax(U_k + correction), with U_k the drafter's logits and the correction read from
the tokens before slot k (the anchor for slot 0). Training is teacher-forced: the tokens before
slot k are the anchor and the labels of slots 0 .. k - 1. Both output layers start at zero, so an
untrained head drafts exactly the drafter's argmax.

Parameters at SmolLM2-135M sizes (vocab 49152, hidden 576), default settings, counted with
`sum(p.numel() for p in head.parameters())`; the frozen target embedding is not among them:
- dspark (rank 128): 12,582,912; gated: 12,673,152.
- domino (state 256, mlp_hidden 512): 26,281,984.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dcoco.contracts import IGNORE
from dcoco.errors import DcocoError
from dcoco.models.heads.base import HeadBatch, HeadLoss


@dataclass(frozen=True)
class MarkovHeadConfig:
    hidden_size: int  # the drafter's hidden size
    vocab_size: int
    rank: int = 128  # width of the previous-token code W1[x] (shape word: rank)
    gated: bool = False  # gate the code by the slot's hidden state (DSpark's GatedMarkovHead)

    def __post_init__(self) -> None:
        if min(self.hidden_size, self.vocab_size, self.rank) < 1:
            raise DcocoError("a dspark head needs hidden size, vocab size and rank all >= 1")


@dataclass(frozen=True)
class GruHeadConfig:
    hidden_size: int  # the drafter's hidden size (= the target's embedding size, the GRU input)
    vocab_size: int
    state_size: int = 256  # the GRU state's width (shape word: state)
    mlp_hidden: int = 512  # width of the delta MLP's hidden layer (shape word: mlp_hidden)
    lambda_warm: float = 1.0  # weight of the base CE at the first step, decaying linearly to 0

    def __post_init__(self) -> None:
        if min(self.hidden_size, self.vocab_size, self.state_size, self.mlp_hidden) < 1:
            raise DcocoError(
                "a domino head needs hidden size, vocab size, state size and MLP width all >= 1"
            )
        if not 0.0 <= self.lambda_warm <= 1.0:
            raise DcocoError(f"domino lambda_warm must be in [0, 1], not {self.lambda_warm}")


class MarkovHead(nn.Module):
    """A low-rank logit bias from the previous token. Needs no target embedding: W1 is its own."""

    kind = "dspark"

    def __init__(self, config: MarkovHeadConfig, embed_tokens: nn.Embedding):
        super().__init__()
        self.config = config
        self.token_code = nn.Embedding(config.vocab_size, config.rank)  # W1
        self.gate = (
            nn.Linear(config.hidden_size + config.rank, config.rank) if config.gated else None
        )
        # W2, stored transposed as a Linear weight [vocab, rank], so that restricting the bias to
        # a loss vocabulary gathers whole rows. Zero: an untrained head adds no bias.
        self.bias_out = nn.Linear(config.rank, config.vocab_size, bias=False)
        nn.init.zeros_(self.bias_out.weight)

    @property
    def dtype(self) -> torch.dtype:
        return self.token_code.weight.dtype

    def code(self, hidden: Tensor, previous_ids: Tensor) -> Tensor:
        """The (gated) code W1[x_prev] [..., rank] from hidden [..., hidden] and ids [...]."""
        code = self.token_code(previous_ids)
        if self.gate is not None:
            gate_input = torch.cat([hidden.to(self.dtype), code], dim=-1)
            code = code * torch.sigmoid(self.gate(gate_input))
        return code

    def select(self, hidden: Tensor, logits: Tensor, anchor_ids: Tensor) -> Tensor:
        """Draft ids [batch, slots] from hidden [batch, slots, hidden], full-vocabulary logits
        [batch, slots, vocab] and anchor_ids [batch]; each slot reads the token drafted before."""
        drafted = []
        previous = anchor_ids
        for slot in range(logits.shape[1]):
            bias = self.bias_out(self.code(hidden[:, slot], previous))  # [batch, vocab]
            previous = (logits[:, slot].float() + bias.float()).argmax(dim=-1)
            drafted.append(previous)
        return torch.stack(drafted, dim=1)

    def training_loss(self, batch: HeadBatch) -> HeadLoss:
        """Teacher-forced CE of the corrected logits: every slot at once, as its previous token
        is known (the anchor or the previous slot's label)."""
        code = self.code(batch.hidden, teacher_forced_inputs(batch))  # [blocks, slots, rank]
        weight, _ = loss_vocab_rows(self.bias_out, batch.vocab_ids)  # [vocab', rank]
        corrected = batch.logits.float() + F.linear(code, weight).float()  # [blocks, slots, vocab']
        ce = slot_cross_entropy(corrected, batch.label_index)
        weighted = (ce * batch.slot_weights.to(ce.dtype)).sum()
        return HeadLoss(weighted_loss=weighted, correct=teacher_forced_correct(corrected, batch))


class GruHead(nn.Module):
    """A full-vocabulary logit delta from a GRU over the drafted prefix. `embed_tokens` is the
    target's: frozen and held outside the module's registry, like the corrector's."""

    kind = "domino"

    def __init__(self, config: GruHeadConfig, embed_tokens: nn.Embedding):
        super().__init__()
        if embed_tokens.embedding_dim != config.hidden_size:
            raise DcocoError(
                f"domino head hidden size {config.hidden_size} does not match the embedding size "
                f"{embed_tokens.embedding_dim}"
            )
        self.config = config
        self.prefix = nn.GRUCell(config.hidden_size, config.state_size)
        self.delta_in = nn.Linear(config.hidden_size + config.state_size, config.mlp_hidden)
        # Zero output: an untrained head adds no delta, so training starts at the drafter.
        self.delta_out = nn.Linear(config.mlp_hidden, config.vocab_size)
        nn.init.zeros_(self.delta_out.weight)
        nn.init.zeros_(self.delta_out.bias)
        # A tuple is not a Module, so nn.Module does not register (save, train or move) it.
        self._shared = (embed_tokens,)

    @property
    def dtype(self) -> torch.dtype:
        return self.delta_in.weight.dtype

    def step(self, token_ids: Tensor, state: Tensor | None) -> Tensor:
        """The GRU state [rows, state] after reading token_ids [rows] from state (None = zeros)."""
        embeds = self._shared[0](token_ids).detach().to(self.dtype)  # [rows, hidden]
        return self.prefix(embeds, state)

    def delta_features(self, hidden: Tensor, state: Tensor) -> Tensor:
        """[..., mlp_hidden]: the delta MLP's hidden layer, from hidden [..., hidden] and state
        [..., state]."""
        return F.silu(self.delta_in(torch.cat([hidden.to(self.dtype), state], dim=-1)))

    def curriculum_lambda(self, progress: float) -> float:
        """The base CE's weight: lambda_warm at the first step, falling linearly to 0 at the end."""
        return self.config.lambda_warm * (1.0 - min(max(progress, 0.0), 1.0))

    def select(self, hidden: Tensor, logits: Tensor, anchor_ids: Tensor) -> Tensor:
        """Draft ids [batch, slots] from hidden [batch, slots, hidden], full-vocabulary logits
        [batch, slots, vocab] and anchor_ids [batch]; the GRU reads each drafted token."""
        drafted = []
        previous, state = anchor_ids, None
        for slot in range(logits.shape[1]):
            state = self.step(previous, state)  # [batch, state]
            delta = self.delta_out(self.delta_features(hidden[:, slot], state))  # [batch, vocab]
            previous = (logits[:, slot].float() + delta.float()).argmax(dim=-1)
            drafted.append(previous)
        return torch.stack(drafted, dim=1)

    def training_loss(self, batch: HeadBatch) -> HeadLoss:
        """Teacher-forced (1 - lambda) * CE(corrected) + lambda * CE(base). The base term has no
        gradient into the head; it anchors the drafter when both are trained together."""
        inputs = teacher_forced_inputs(batch)  # [blocks, slots]
        states, state = [], None
        for slot in range(inputs.shape[1]):
            state = self.step(inputs[:, slot], state)  # [blocks, state]
            states.append(state)
        features = self.delta_features(batch.hidden, torch.stack(states, dim=1))
        weight, bias = loss_vocab_rows(self.delta_out, batch.vocab_ids)  # [vocab', mlp_hidden]
        delta = F.linear(features, weight, bias)  # [blocks, slots, vocab']
        corrected = batch.logits.float() + delta.float()
        ce = slot_cross_entropy(corrected, batch.label_index)  # [blocks, slots]
        base_weight = self.curriculum_lambda(batch.progress)
        if base_weight > 0:  # the base CE costs a pass over the vocabulary; skip it once unused
            base_ce = slot_cross_entropy(batch.logits.float(), batch.label_index)
            ce = (1.0 - base_weight) * ce + base_weight * base_ce
        weighted = (ce * batch.slot_weights.to(ce.dtype)).sum()
        return HeadLoss(weighted_loss=weighted, correct=teacher_forced_correct(corrected, batch))


def teacher_forced_inputs(batch: HeadBatch) -> Tensor:
    """[blocks, slots]: the token before each slot, [anchor, label_0, .., label_{slots-2}]."""
    # A label past the sequence's end is IGNORE; every slot after it is IGNORE too, so any valid
    # id will do there.
    labels = batch.label_ids[:, :-1].clamp(min=0)
    return torch.cat([batch.anchor_ids[:, None].to(labels.dtype), labels], dim=1)


def loss_vocab_rows(output: nn.Linear, vocab_ids: Tensor | None) -> tuple[Tensor, Tensor | None]:
    """The output layer's weight [vocab', in] and bias [vocab'] cut to the loss vocabulary's
    rows, so only the columns the loss reads are computed."""
    if vocab_ids is None:
        return output.weight, output.bias
    bias = None if output.bias is None else output.bias[vocab_ids]
    return output.weight[vocab_ids], bias


def slot_cross_entropy(logits: Tensor, label_index: Tensor) -> Tensor:
    """CE [blocks, slots] of logits [blocks, slots, vocab'] at label_index; 0 where IGNORE."""
    return F.cross_entropy(
        logits.flatten(0, 1), label_index.flatten(), ignore_index=IGNORE, reduction="none"
    ).view_as(label_index)


def teacher_forced_correct(corrected: Tensor, batch: HeadBatch) -> Tensor:
    """[blocks, slots] bool: the argmax token of corrected [blocks, slots, vocab'] is the label."""
    columns = corrected.argmax(dim=-1)
    drafted = columns if batch.vocab_ids is None else batch.vocab_ids[columns]
    return drafted == batch.label_ids
