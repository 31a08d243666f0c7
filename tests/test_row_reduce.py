"""row_argmax and row_topk against torch's own argmax and topk: equal argmax (first occurrence),
equal top-k values, indices that hold those values."""

import pytest
import torch

from dcoco.models.cpu import row_reduce
from dcoco.models.cpu.row_reduce import GROUP, row_argmax, row_topk


@pytest.fixture(params=["fused", "grouped"])
def path(request, monkeypatch):
    """Each test of row_argmax twice: the fused kernel where it builds, and the group maxima."""
    if request.param == "grouped":
        monkeypatch.setattr(row_reduce.cpu_kernels, "takes_rows", lambda rows: False)
    return request.param


def _rows(shape, dtype, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return (4 * torch.randn(*shape, generator=generator)).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("columns", [16000, 49152, 16000 + 37])
def test_argmax_equals_torch(path, dtype, columns):
    rows = _rows((3, 5, columns), dtype)
    assert torch.equal(row_argmax(rows), rows.argmax(dim=-1))


def test_argmax_takes_the_first_of_tied_maxima(path):
    rows = torch.zeros(4, 8 * GROUP)
    rows[:, 3 * GROUP + 5] = 2.0  # a later group holds the same maximum as an earlier column
    rows[0, 7] = 2.0
    rows[1, GROUP + 1] = 2.0
    rows[1, GROUP] = 2.0  # two in one group: the first wins
    rows[3] = float("-inf")  # nothing but -inf: index 0, as torch.argmax
    expected = torch.tensor([7, GROUP, 3 * GROUP + 5, 0])
    assert torch.equal(row_argmax(rows), expected)
    assert torch.equal(rows.argmax(dim=-1), expected)


def test_bf16_ties_agree_with_torch(path):
    # bf16 logits tie often: 8 bits of mantissa over thousands of columns
    rows = _rows((64, 16000), torch.float32, seed=1).round().bfloat16()
    assert torch.equal(row_argmax(rows), rows.argmax(dim=-1))


def test_argmax_of_nan_inf_short_and_strided_rows_equals_torch(path):
    rows = _rows((6, 3 * GROUP + 9), torch.float32, seed=2)
    rows[0, 100], rows[0, 7] = float("nan"), float("nan")  # the first NaN wins
    rows[1, 50], rows[1, 300] = float("inf"), float("inf")
    rows[2] = float("-inf")
    rows[2, 200] = float("nan")
    wide = _rows((4, 3 * GROUP), torch.float32, seed=3)
    for case in (rows, rows.bfloat16(), rows[:, :13], wide[:, : GROUP + 3], wide.T[:5]):
        assert torch.equal(row_argmax(case), case.argmax(dim=-1))


@pytest.mark.parametrize("k", [1, 4, 16])
@pytest.mark.parametrize("columns", [16000, 49152 + 3])
def test_topk_values_equal_torch(k, columns):
    rows = _rows((2, 7, columns), torch.float32, seed=k)
    values, indices = row_topk(rows, k)
    assert torch.equal(values, rows.topk(k, dim=-1).values)
    assert torch.equal(rows.gather(-1, indices), values)
    assert indices.unique(dim=-1).shape == indices.shape  # k distinct columns per row


def test_topk_keeps_ties_within_one_group_and_across_groups():
    rows = torch.zeros(2, 10 * GROUP)
    rows[0, [5, 6, 7, 9 * GROUP]] = 3.0  # four tied maxima, three in one group
    rows[1, [GROUP + 1, 4 * GROUP + 2]] = torch.tensor([5.0, 4.0])
    values, indices = row_topk(rows, 4)
    assert torch.equal(values, rows.topk(4, dim=-1).values)
    assert sorted(indices[0].tolist()) == [5, 6, 7, 9 * GROUP]
    assert indices[1, :2].tolist() == [GROUP + 1, 4 * GROUP + 2]


def test_short_rows_and_empty_batches_fall_back_to_torch():
    rows = _rows((3, 300), torch.float32)
    assert torch.equal(row_argmax(rows), rows.argmax(dim=-1))
    assert torch.equal(row_topk(rows, 16)[1], rows.topk(16, dim=-1).indices)
    empty = torch.zeros(0, 16000)
    assert row_argmax(empty).shape == (0,)
    assert row_topk(empty, 4)[0].shape == (0, 4)


def test_topk_of_a_spread_row_stays_inside_it():
    # logits over a draft vocabulary spread over every token: -inf outside 600 columns
    rows = torch.full((2, 49152 + 5), float("-inf"))
    rows[:, :600] = _rows((2, 600), torch.float32)
    values, indices = row_topk(rows, 16)
    assert torch.equal(values, rows.topk(16, dim=-1).values)
    assert int(indices.max()) < 600
