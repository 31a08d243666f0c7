"""What one categorical draw costs on this CPU, by method and row shape (microseconds a call).

- `multinomial`: torch.multinomial (what dcoco.decode.sampling.sample called before);
- `gumbel`: argmax of p / Exp(1) noise from `exponential_` (vLLM-CPU's recovered tokens, and the
  plugin's draft draw before);
- `inverse-cdf`: dcoco.decode.sampling.inverse_cdf, one uniform a row.

Rows of 49,152 columns are SmolLM2's vocabulary (recovered tokens: one a sampled request in vLLM,
one a draft position in ours); 16,000 its draft vocabulary (the drafts). The calls run in turn,
round after round, so load elsewhere on the machine hits them alike.

Usage: .venv/bin/python scripts/reproduce/sampler_cost.py [ROUNDS]
"""

from __future__ import annotations

import sys

import torch

from dcoco.decode.cost_curve import interleaved_ms
from dcoco.decode.sampling import inverse_cdf

SHAPES = ((1, 49_152), (2, 16_000), (4, 49_152), (16, 49_152))


def main(rounds: int) -> None:
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; us a call (median)")
    print(f"{'rows x columns':>16} {'multinomial':>12} {'gumbel':>10} {'inverse-cdf':>12}")
    generator = torch.Generator().manual_seed(0)
    for rows, columns in SHAPES:
        probs = torch.rand(rows, columns, generator=generator).softmax(-1)
        calls = [
            lambda p=probs: torch.multinomial(p, 1),
            lambda p=probs: (p / torch.empty_like(p).exponential_()).argmax(-1),
            lambda p=probs: inverse_cdf(p, torch.rand(len(p), dtype=torch.float64)),
        ]
        costs = [ms * 1000 for ms in interleaved_ms(calls, rounds)]
        print(f"{rows:>7} x {columns:<6} {costs[0]:>12.0f} {costs[1]:>10.0f} {costs[2]:>12.0f}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 200)
