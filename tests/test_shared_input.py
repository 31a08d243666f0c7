"""Linear layers of one input run as one product (dcoco.models.target.shared_input)."""

from __future__ import annotations

import torch

from dcoco.models.target.shared_input import SharedProduct, slices


class CountingLinear(torch.nn.Linear):
    calls = 0

    def forward(self, x):
        self.calls += 1
        return super().forward(x)


def test_each_reader_gets_its_columns_of_one_product():
    linear = CountingLinear(8, 7)
    q, k, v = slices(SharedProduct(linear, 3), [4, 2, 1])
    x = torch.randn(3, 8)
    full = torch.nn.functional.linear(x, linear.weight, linear.bias)
    outputs = [q(x), k(x), v(x)]
    assert linear.calls == 1
    assert torch.equal(torch.cat(outputs, dim=-1), full)
    assert [o.shape[-1] for o in outputs] == [4, 2, 1]


def test_a_new_input_or_a_repeated_reader_recomputes():
    linear = CountingLinear(8, 6)
    product = SharedProduct(linear, 2)
    gate, up = slices(product, [3, 3])
    x, y = torch.randn(2, 8), torch.randn(2, 8)
    gate(x)
    assert torch.equal(up(y), torch.nn.functional.linear(y, linear.weight, linear.bias)[:, 3:])
    assert linear.calls == 2
    up(y)  # up asks again: a new product, not the one it already read
    assert linear.calls == 3
    gate(y)  # served from that product, which both have now read and which is released
    assert linear.calls == 3
    assert product._input is None and product._output is None
