"""A linear map of the target's token embedding, tabled over the whole vocabulary for inference.

The corrector projects the embedding of each of its K candidates per slot (z's token part, the
successor query's E[b]). At inference that is a matmul over batch x slots x K embedding rows,
recomputed every step for the same few thousand token ids; a table of the projected embedding
(vocab x width) turns it into a row gather. The table is rebuilt whenever a tensor it was made
from changes (another tensor, an in-place update such as an optimiser step, a new dtype or
device), so it can never serve stale weights. Training (grad enabled) never uses it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

CHUNK_ROWS = 4096  # embedding rows projected at once when building: bounds the temporary


class VocabTable:
    def __init__(self, project: Callable[[Tensor], Tensor]):
        self._project = project  # embedding rows [rows, hidden] -> projected rows [rows, width]
        self._key: tuple | None = None
        self._table: Tensor | None = None
        self._frozen = False
        # until frozen, project the rows asked for instead of building the table (a server's
        # first steps, while another thread builds it: dcoco.models.heads.head_compile)
        self.deferred = False

    @property
    def table(self) -> Tensor | None:
        """The table as last built (None before the first build)."""
        return self._table

    def freeze(self) -> None:
        """Serve the table as built, its key no longer checked: for a head whose weights never
        change again (a served one), and so that torch.compile can trace `rows` (a data pointer
        comparison breaks its graph)."""
        if self._table is None:
            raise RuntimeError("a vocabulary table is frozen after it is built")
        self._frozen = True

    def rows(self, ids: Tensor, embedding: Tensor, sources: tuple[Tensor, ...], dtype) -> Tensor:
        """project(embedding[ids].to(dtype)) [..., width] for token ids [...]; `sources` are the
        tensors `project` reads, whose identity and version key the table."""
        if self._frozen:
            return self._table[ids]
        if self.deferred:
            return self._project(embedding[ids].to(dtype))
        self.build(embedding, sources, dtype)
        return self._table[ids]

    def build(self, embedding: Tensor, sources: tuple[Tensor, ...], dtype) -> None:
        """Make the table now, unless the one there was made from these very tensors."""
        key = (dtype,) + tuple(
            (tensor.data_ptr(), tensor._version, tensor.dtype, tensor.device)
            for tensor in (embedding, *sources)
        )
        if key == self._key:
            return
        self._table = None  # free the old table before building the new one
        with torch.no_grad():
            self._table = torch.cat(
                [
                    self._project(embedding[start : start + CHUNK_ROWS].to(dtype))
                    for start in range(0, embedding.shape[0], CHUNK_ROWS)
                ]
            )
        self._key = key
