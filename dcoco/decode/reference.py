"""The slow reference decoder: greedy, no cache, the whole sequence recomputed every step.

It shares nothing with the engine but the target's forward, so the engine's output can be checked
against it token for token (in fp32, where kernels are deterministic enough to compare).
"""

from __future__ import annotations

import torch

from dcoco.models.target.target import TargetModel


def reference_greedy(target: TargetModel, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    ids = list(prompt_ids)
    new_ids: list[int] = []
    budget = min(max_new_tokens, target.max_context - len(prompt_ids))
    for _ in range(budget):
        input_ids = torch.tensor([ids], dtype=torch.long, device=target.device)
        logits = target.forward(input_ids).logits  # [batch, tokens, vocab]
        token = int(logits[0, -1].argmax())
        new_ids.append(token)
        ids.append(token)
        if token in target.stop_ids:
            break
    return new_ids
