"""The draft vocabulary (`--draft-vocab`): the drafter's LM head over the target's most frequent
reply tokens only.

The head is most of a draft pass: SmolLM2's 49,152 x 576 head over 7 slots took 3.5 ms (oneDNN,
bf16) of a 10-11 ms pass, where 16,384 rows took 1.1 ms and 8,192 rows 0.45 ms (Intel Xeon with
AMX, 2 threads, `dcoco profile` and scripts/reproduce/draft_vocab.py). The shipped drafters were
trained with their loss over the 16,000 most frequent reply tokens (`--loss-vocab`), so rows
outside those were never ranked by training. A draft over N rows proposes only those tokens; the
target still verifies every token, so the output is unchanged and only what gets proposed can
change (the coverage each size costs is in the ranking's provenance).

The ranking is made once per target from the distillation corpus (`dcoco draft-vocab`) and
shipped beside its checkpoints, so decoding never needs the corpus.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from dcoco.errors import DcocoError
from dcoco.models.drafter.copy_hints import NO_HINT
from dcoco.models.drafter.draft_pass import Product
from dcoco.models.target.packed_linear import PackedLinear, onednn_available

# beside the checkpoints, in checkpoints/<target>/ (a ranking is not a checkpoint)
RANKING_FILE = "draft-vocab.safetensors"
PROVENANCE_FILE = "draft-vocab.json"
AUTO_SIZE = 16_000  # `auto`: the shipped drafters' loss vocabulary (the rows they were trained on)


def parse_draft_vocab(value: str) -> int | None:
    """`auto` -> AUTO_SIZE, `full` -> None (every row), N -> N; anything else fails clearly."""
    if value == "auto":
        return AUTO_SIZE
    if value == "full":
        return None
    try:
        size = int(value)
    except ValueError:
        size = 0
    if size < 1:
        raise DcocoError(f"draft-vocab must be 'auto', 'full' or a row count >= 1, got '{value}'")
    return size


def check_draft_vocab(value: str) -> str:
    parse_draft_vocab(value)
    return value


def rank_tokens(replies: list[tuple[int, ...]]) -> tuple[Tensor, Tensor]:
    """Token ids by descending count over `replies`, ties by id (the order `--loss-vocab` takes),
    and their counts: int64 [distinct] each."""
    counts = Counter(token for reply in replies for token in reply)
    ranked = sorted(counts, key=lambda token: (-counts[token], token))
    return torch.tensor(ranked, dtype=torch.long), torch.tensor([counts[t] for t in ranked])


def coverage(ranked: Tensor, replies: list[tuple[int, ...]], size: int) -> float:
    """Share of the tokens of `replies` inside the first `size` ids of `ranked`."""
    kept = set(ranked[:size].tolist())
    total = sum(len(reply) for reply in replies)
    return sum(token in kept for reply in replies for token in reply) / max(total, 1)


def write_ranking(directory: Path, ranked: Tensor, counts: Tensor, provenance: dict) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    tensors = {"token_ids": ranked.to(torch.int32).contiguous(), "counts": counts.contiguous()}
    save_file(tensors, str(directory / RANKING_FILE))
    digest = hashlib.sha256((directory / RANKING_FILE).read_bytes()).hexdigest()[:16]
    record = {**provenance, "ranking_digest": digest}
    (directory / PROVENANCE_FILE).write_text(json.dumps(record, indent=2) + "\n")


def read_ranking(directory: Path, vocab_size: int) -> Tensor:
    """The ranked token ids [distinct] int64 stored in `directory`, checked against the vocab."""
    path = directory / RANKING_FILE
    if not path.is_file():
        raise DcocoError(
            f"no draft vocabulary ranking at {path}: build it with `dcoco draft-vocab`, or pass "
            "--draft-vocab full"
        )
    try:
        ranked = load_file(str(path))["token_ids"].long()
    except (SafetensorError, KeyError, OSError) as error:
        raise DcocoError(f"{path} is not a draft vocabulary ranking ({error})") from error
    if ranked.ndim != 1 or not len(ranked) or int(ranked.min()) < 0:
        raise DcocoError(f"{path} holds no valid token ids")
    if int(ranked.max()) >= vocab_size or len(set(ranked.tolist())) != len(ranked):
        raise DcocoError(f"{path} does not rank this target's vocabulary of {vocab_size} tokens")
    return ranked


def head_rows(head: nn.Module, token_ids: Tensor, hidden_size: int, dtype) -> Tensor:
    """The LM head's weight rows [N, hidden] for `token_ids`, as `head` computes them: its
    weight where it keeps one, else read back through the head itself (a prepacked or int8
    head: head(I) = Wᵀ)."""
    weight = getattr(head, "weight", None)
    if isinstance(weight, Tensor) and weight.shape[-1] == hidden_size and weight.ndim == 2:
        return weight.detach()[token_ids]
    device = token_ids.device
    with torch.inference_mode():
        probe = head(torch.eye(hidden_size, dtype=dtype, device=device))  # [hidden, vocab]
        return probe.T[token_ids].clone()


class DraftVocab:
    """A draft head over `token_ids` [N] (ascending): logits columns j <-> token_ids[j].

    Not an nn.Module on purpose: a drafter holding one keeps it out of its state_dict."""

    def __init__(self, head: nn.Module, token_ids: Tensor, vocab_size: int, dtype: torch.dtype,
                 product: Product | None = None):  # fmt: skip
        """`product`: the layer the rows run on (`--draft-dtype int4 | w4a8`,
        dcoco.decode.draft_precision.drafter_product); None: a dense copy."""
        self.token_ids = token_ids.sort().values  # [N]: columns keep the vocab's order
        rows = head_rows(head, self.token_ids, _in_features(head), dtype).to(dtype)
        self.head = product(rows) if product is not None else _dense_head(rows)
        self.dtype = dtype
        self._column_of = column_table(self.token_ids, vocab_size)

    @property
    def size(self) -> int:
        return len(self.token_ids)

    def logits(self, hidden: Tensor) -> Tensor:
        """[..., hidden] -> [..., N] over the vocabulary's columns."""
        rows = hidden.reshape(-1, hidden.shape[-1]).to(self.dtype).contiguous()
        return self.head.forward(rows).to(self.dtype).reshape(*hidden.shape[:-1], -1)

    def columns(self, token_ids: Tensor | None) -> Tensor | None:
        """Token ids (NO_HINT allowed) -> columns; NO_HINT for ids outside the vocabulary."""
        return None if token_ids is None else hint_columns(token_ids, self._column_of)


def _dense_head(rows: Tensor) -> nn.Module:
    """The head rows [N, hidden] as a linear layer, prepacked for oneDNN where the CPU takes it."""
    linear = nn.Linear(rows.shape[1], rows.shape[0], bias=False, device="meta", dtype=rows.dtype)
    linear = linear.to_empty(device=rows.device).requires_grad_(False)
    linear.weight.copy_(rows)
    cpu = rows.device.type == "cpu"
    return PackedLinear(linear) if cpu and onednn_available(rows.dtype) else linear


def column_table(token_ids: Tensor, vocab_size: int) -> Tensor:
    """[vocab + 1]: each token's column in the vocabulary of `token_ids` [N] (distinct ids),
    NO_HINT for a token outside it; the extra last entry is NO_HINT too, so that a NO_HINT id
    (-1) reads it."""
    table = torch.full((vocab_size + 1,), NO_HINT, dtype=torch.long, device=token_ids.device)
    table[token_ids] = torch.arange(len(token_ids), device=token_ids.device)
    return table


def hint_columns(token_ids: Tensor, column_of: Tensor) -> Tensor:
    """Token ids (NO_HINT allowed) -> the vocabulary's columns by `column_of` (column_table;
    NO_HINT for a token outside it): one lookup. The copy gate adds its bonus at these columns."""
    return column_of[token_ids]


def full_vocab_logits(logits: Tensor, token_ids: Tensor, vocab_size: int) -> Tensor:
    """Column logits [..., N] spread over the whole vocabulary [..., vocab], -inf elsewhere (for
    the heads that read every token's logit)."""
    return _spread(logits, token_ids, vocab_size, float("-inf"))


def full_vocab_probs(probs: Tensor, token_ids: Tensor, vocab_size: int) -> Tensor:
    """Column probabilities [..., N] spread over the whole vocabulary [..., vocab], 0 elsewhere
    (a sampled draft's q, which the verifier reads by token id)."""
    return _spread(probs, token_ids, vocab_size, 0.0)


def _spread(values: Tensor, token_ids: Tensor, vocab_size: int, fill: float) -> Tensor:
    full = values.new_full((*values.shape[:-1], vocab_size), fill)
    full[..., token_ids] = values
    return full


def _in_features(head: nn.Module) -> int:
    return int(getattr(head, "in_features", 0) or head.weight.shape[1])
