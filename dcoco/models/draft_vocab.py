"""A drafter's draft vocabulary: the token ids its head scores when decoding.

The shipped drafters trained their loss over the corpus's most frequent reply tokens (the trainers'
`--loss-vocab`, 16,000 of 49,152): the other rows of the shared LM head never carried a label.
Scoring only the vocabulary's rows cuts the largest cost of a draft pass (the 49k-row head) to a
third, and the drafts can only be tokens it was taught. Every other token gets logit -inf, so the
proposal distribution q is still a distribution over the whole vocabulary and verification stays
lossless; only acceptance can change, and `dcoco heldout --draft-vocab full` measures by how much.

The ids live beside the drafter's weights (`draft_vocab.safetensors`, made by `dcoco draft-vocab`
with its corpus coverage in the file's metadata); a checkpoint without the file drafts over the
whole vocabulary.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor, nn

from dcoco.errors import DcocoError

DRAFT_VOCAB_FILE = "draft_vocab.safetensors"


class VocabHead(nn.Module):
    """The rows `vocab_ids` of `head`, scattered into full-vocabulary logits (-inf elsewhere)."""

    def __init__(self, head: nn.Linear, vocab_ids: Tensor):
        super().__init__()
        weight = head.weight.detach()
        self.vocab_size = weight.shape[0]
        self.linear = nn.Linear(weight.shape[1], vocab_ids.numel(), bias=head.bias is not None)
        self.linear.to(device=weight.device, dtype=weight.dtype).requires_grad_(False)
        self.linear.weight.copy_(weight[vocab_ids])
        if head.bias is not None:
            self.linear.bias.copy_(head.bias.detach()[vocab_ids])
        self.register_buffer("vocab_ids", vocab_ids.to(weight.device))

    def forward(self, rows: Tensor) -> Tensor:  # [rows, hidden] -> [rows, vocab]
        scores = self.linear(rows)  # [rows, vocab']
        logits = scores.new_full((rows.shape[0], self.vocab_size), float("-inf"))
        return logits.index_copy_(1, self.vocab_ids, scores)


def save_draft_vocab(directory: str | Path, vocab_ids: Tensor, metadata: dict[str, str]) -> Path:
    from safetensors.torch import save_file

    path = Path(directory) / DRAFT_VOCAB_FILE
    ids = torch.unique(vocab_ids.to(torch.int64).cpu())  # sorted, each once
    save_file({"vocab_ids": ids.to(torch.int32)}, str(path), metadata=metadata)
    return path


def read_draft_vocab(directory: str | Path, vocab_size: int) -> Tensor | None:
    """The sorted int64 ids of `directory`'s draft vocabulary, or None when it ships none."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = Path(directory) / DRAFT_VOCAB_FILE
    if not path.exists():
        return None
    try:
        ids = load_file(str(path))["vocab_ids"].to(torch.int64)
    except (SafetensorError, KeyError, OSError) as error:
        raise DcocoError(f"{path} is unreadable ({error}); rebuild it: dcoco draft-vocab") from None
    if ids.ndim != 1 or not len(ids) or int(ids.min()) < 0 or int(ids.max()) >= vocab_size:
        raise DcocoError(f"{path} holds ids outside 0..{vocab_size - 1}: not this target's")
    return ids


def read_metadata(directory: str | Path) -> dict[str, str]:
    from safetensors import safe_open

    with safe_open(str(Path(directory) / DRAFT_VOCAB_FILE), framework="pt") as handle:
        return dict(handle.metadata() or {})
