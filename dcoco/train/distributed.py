"""Data-parallel training under `torchrun` (PyTorch's own process groups; gloo on CPU, NCCL on
CUDA). One process per device, each holding the whole drafter (it is small: DDP, not FSDP):

- every rank draws the same global batch of a step, `batch_size` records, and trains on its
  share (records rank, rank + world, ...), each record with the anchors it would get alone;
- the loss is normalised by the global batch's slot weight, and gradients are summed across
  ranks before clipping, so every rank takes the optimizer step a single process would take with
  the same batch and seed (a test checks the weights);
- rank 0 is the one writer: log, checkpoints, snapshots, held-out evaluation; every rank resumes
  from the checkpoint it wrote, so `torchrun --max-restarts N` survives the loss of any rank;
- the feature cache's missing parts are built by the ranks in turn (part i by rank i mod world),
  then every rank reads all of them.

Without `torchrun` (WORLD_SIZE unset or 1) nothing here talks to a process group.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Ranks:
    rank: int = 0
    world: int = 1

    @property
    def writer(self) -> bool:
        """Whether this process writes logs, checkpoints and artefacts."""
        return self.rank == 0

    def share(self, items: list) -> list:
        """This rank's share of `items`: items rank, rank + world, ..."""
        return items[self.rank :: self.world]


SINGLE = Ranks()  # one process, no process group


def under_torchrun() -> bool:
    """Whether this process is one of several that torchrun launched."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def init_ranks(device: str = "") -> Ranks:
    """Join torchrun's process group (once) when WORLD_SIZE > 1; on CUDA, pick LOCAL_RANK's
    device. SINGLE when not launched by torchrun."""
    if not under_torchrun():
        return SINGLE
    cuda = device.startswith("cuda") or (not device and torch.cuda.is_available())
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    if not dist.is_initialized():
        dist.init_process_group("nccl" if cuda else "gloo")
    return Ranks(dist.get_rank(), dist.get_world_size())


def rank_device(device: str, ranks: Ranks) -> str:
    """`device` for this rank: a bare `cuda` becomes this process's own GPU."""
    if ranks.world > 1 and device == "cuda":
        return f"cuda:{torch.cuda.current_device()}"
    return device


def collective_device() -> torch.device:
    """Where a collective's tensors must live: this rank's GPU under NCCL (which has no CPU
    path: a CPU tensor there raises), the CPU under gloo."""
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def all_sum(values: list[float], ranks: Ranks) -> list[float]:
    """Element-wise sums of `values` over the ranks (unchanged with one)."""
    if ranks.world == 1:
        return values
    tensor = torch.tensor(values, dtype=torch.float64, device=collective_device())
    dist.all_reduce(tensor)
    return tensor.tolist()


def all_cat(tensor: torch.Tensor, ranks: Ranks) -> torch.Tensor:
    """Every rank's `tensor` [n_r, ...] concatenated in rank order (for metrics)."""
    if ranks.world == 1:
        return tensor
    gathered: list = [None] * ranks.world
    dist.all_gather_object(gathered, tensor.cpu())
    return torch.cat(gathered).to(tensor.device)


def sum_gradients(parameters: list[torch.nn.Parameter], ranks: Ranks) -> None:
    """Sum every parameter's gradient over the ranks, in one flat buffer. A parameter no rank
    has a gradient for keeps none (the optimizer skips it, as it would in one process)."""
    if ranks.world == 1 or not parameters:
        return
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in parameters]
    present = torch.tensor([float(p.grad is not None) for p in parameters], device=grads[0].device)
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    dist.all_reduce(present)
    offset = 0
    for parameter, grad, seen in zip(parameters, grads, present.tolist(), strict=True):
        summed = flat[offset : offset + grad.numel()].view_as(grad)
        parameter.grad = summed.clone() if seen else None
        offset += grad.numel()


def barrier(ranks: Ranks) -> None:
    if ranks.world > 1:
        dist.barrier()


def finish(ranks: Ranks) -> None:
    """Leave the process group at the end of a run (every rank waits for the writer)."""
    if ranks.world > 1 and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
