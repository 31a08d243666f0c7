"""What a training run holds between steps, and what a head run adds to it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from dcoco.data.distill import Sample
from dcoco.models.drafter.drafter import BlockDrafter
from dcoco.train.block_pass import AnchorRule, LossVocab
from dcoco.train.distributed import Ranks
from dcoco.train.run_dir import RunDir


@dataclass
class HeadSetup:
    """What a head run adds: how to build the head, and whether the drafter trains too."""

    build: Callable[[BlockDrafter], torch.nn.Module]  # drafter -> fresh head (zero output)
    train_drafter: bool  # True: joint; False: drop-in over a frozen drafter
    loss_weight: float = 1.0  # the head's loss relative to the drafter's (joint only)
    lr: float = 0.0  # the head's peak learning rate; 0: the drafter's (--lr)


@dataclass
class Run:
    """Everything one training run holds between steps."""

    config: object  # DrafterTrainConfig or HeadTrainConfig
    target: object  # TargetModel
    drafter: BlockDrafter
    head: torch.nn.Module | None
    train_drafter: bool
    head_weight: float
    train_set: list[Sample]
    eval_items: list
    features: object  # FeatureCache or TargetFeatures
    trained: list[torch.nn.Parameter]
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    run_dir: RunDir
    weights: torch.Tensor  # [slots] loss weight per slot
    loss_vocab: LossVocab
    full_vocab: LossVocab
    anchor_rule: AnchorRule
    total_steps: int
    step: int = 0
    tokens: int = 0
    started: float = 0.0
    initial_eval: dict | None = None  # held-out metrics before the first step
    last_eval: dict | None = None  # the latest held-out metrics, stored with snapshots
    ranks: Ranks = Ranks()  # this process's place in a data-parallel run (dcoco.train.distributed)

    @property
    def block_size(self) -> int:
        return self.drafter.config.block_size
