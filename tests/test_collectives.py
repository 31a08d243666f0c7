"""Collectives on every backend (dcoco.train.distributed): under NCCL every tensor a collective
sends lives on the rank's GPU (NCCL has no CPU path), under gloo on the CPU. The backend is
mocked, so this runs without a GPU or a process group."""

from __future__ import annotations

import torch

from dcoco.train import distributed
from dcoco.train.distributed import Ranks

TWO = Ranks(rank=0, world=2)


def test_the_collective_device_follows_the_backend(monkeypatch):
    monkeypatch.setattr(distributed.dist, "get_backend", lambda *a: "nccl")
    monkeypatch.setattr(distributed.torch.cuda, "current_device", lambda: 3)
    assert distributed.collective_device() == torch.device("cuda", 3)
    monkeypatch.setattr(distributed.dist, "get_backend", lambda *a: "gloo")
    assert distributed.collective_device() == torch.device("cpu")


def test_every_collective_sends_tensors_on_the_collective_device(monkeypatch):
    # A stand-in for the NCCL rank's GPU: the CPU, so the test runs anywhere, but asked for
    # through collective_device() like the real one; all_reduce records what it is handed.
    sent = []
    monkeypatch.setattr(distributed, "collective_device", lambda: torch.device("cpu"))
    monkeypatch.setattr(distributed.dist, "all_reduce", lambda t, *a, **k: sent.append(t.device))
    assert distributed.all_sum([1.0, 2.0], TWO) == [1.0, 2.0]  # one rank's share: no peer here
    parameters = [torch.nn.Parameter(torch.ones(2)), torch.nn.Parameter(torch.ones(3))]
    parameters[0].grad = torch.full((2,), 2.0)
    distributed.sum_gradients(parameters, TWO)  # the flat gradients and the presence flags
    assert sent == [torch.device("cpu")] * 3
    assert parameters[1].grad is None and parameters[0].grad.tolist() == [2.0, 2.0]


def test_all_sum_asks_for_the_collective_device_only_with_peers(monkeypatch):
    asked = []
    monkeypatch.setattr(distributed, "collective_device", lambda: asked.append(1) or "cpu")
    monkeypatch.setattr(distributed.dist, "all_reduce", lambda t, *a, **k: None)
    distributed.all_sum([1.0], Ranks())
    assert asked == []
    distributed.all_sum([1.0], TWO)
    assert asked == [1]
