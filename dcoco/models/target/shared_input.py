"""Linear layers that read one input, run as one product: q/k/v of an attention block, gate/up of
an MLP. A batch-1 step is a few hundred small products; one call for the group instead of one per
layer saves the kernel's fixed cost and the dispatch (measured for gguf's int4 kernel on 2 Xeon
cores, 1 row: q+k+v 22 µs as three calls, 16 µs as one).

The model code keeps calling `q_proj(x)`, `k_proj(x)`, `v_proj(x)`: each is an `OutputSlice` of
one `SharedProduct`, which computes the whole product on the first call and serves the others'
columns from it while they pass the same input tensor.
"""

from __future__ import annotations

from torch import Tensor, nn


class SharedProduct(nn.Module):
    """`linear`'s output over the last input, served once to each of `parts` readers."""

    def __init__(self, linear: nn.Module, parts: int):
        super().__init__()
        self.linear = linear
        self.parts = parts
        self._input: Tensor | None = None
        self._output: Tensor | None = None
        self._served: set[int] = set()

    def output(self, part: int, x: Tensor) -> Tensor:
        # A new input, or a reader asking twice, starts a new product; references are dropped
        # once every reader has had its columns.
        if self._input is not x or part in self._served:
            self._input, self._output, self._served = x, self.linear(x), set()
        output = self._output
        self._served.add(part)
        if len(self._served) == self.parts:
            self._input = self._output = None
        return output


class OutputSlice(nn.Module):
    """Columns [start, stop) of a shared product: what one of the fused layers returns."""

    def __init__(self, product: SharedProduct, part: int, start: int, stop: int):
        super().__init__()
        self.product = product
        self.part, self.start, self.stop = part, start, stop
        self.out_features = stop - start

    def forward(self, x: Tensor) -> Tensor:  # [..., in] -> [..., stop - start]
        return self.product.output(self.part, x)[..., self.start : self.stop]


def slices(product: SharedProduct, widths: list[int]) -> list[OutputSlice]:
    """One OutputSlice per part of `product`, of the given output widths in order."""
    bounds = [sum(widths[:i]) for i in range(len(widths) + 1)]
    return [OutputSlice(product, i, bounds[i], bounds[i + 1]) for i in range(len(widths))]
