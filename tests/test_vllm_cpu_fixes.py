"""vLLM-CPU's rejection-sampler fix (dcoco.serving.vllm.cpu_fixes): the pure expand, the broken
override it replaces, and the corruption it removes, reproduced end to end.

The end-to-end test serves a greedy request alone, then beside a sampled one, with vLLM's own
n-gram speculative decoding (no drafter of ours), once with the plugin disabled (VLLM_PLUGINS=none:
the corruption must show, or the test proves nothing) and once with it (the greedy reply must be
its solo reply, token for token).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from dcoco.paths import REPO_ROOT
from dcoco.serving.vllm.cpu_fixes import expand_into


def test_expand_into_fills_each_requests_tokens_in_the_outputs_dtype():
    out = torch.full((6,), -7.0)
    expand_into(
        out, torch.tensor([0.0, 0.7, 1.3]), torch.tensor([2, 5, 6], dtype=torch.int32), 0, 1
    )
    assert out.tolist() == pytest.approx([1.0, 1.0, 0.7, 0.7, 0.7, 1.3])
    top_k = torch.full((4,), -1, dtype=torch.int32)
    expand_into(top_k, torch.tensor([5, 0], dtype=torch.int32), torch.tensor([1, 3]), 0, 9)
    assert top_k.tolist() == [5, 9, 9, -1]  # past the last request's tokens nothing is written
    expand_into(out, torch.tensor([]), torch.tensor([], dtype=torch.int32), 0, 1)  # no requests


def test_the_probe_tells_a_fixed_override_from_a_broken_one():
    from dcoco.serving.vllm.cpu_fixes import expands_correctly

    def drops_its_result(output, input_val, cu_num_tokens, replace_from, replace_to):
        expand_into(output.clone(), input_val, cu_num_tokens, replace_from, replace_to)

    def truncates(output, input_val, *args):  # writes back an int64 copy: 0.5 becomes 0
        expand_into(output, input_val.to(torch.int64).to(output.dtype), *args)

    def raises(*args):
        raise RuntimeError("no C++ kernels")

    assert expands_correctly(expand_into)
    assert not any(map(expands_correctly, (drops_its_result, truncates, raises)))


@pytest.mark.vllm
def test_the_registered_cpu_override_expands_correctly_once_fixed():
    pytest.importorskip("vllm")
    import vllm._custom_ops  # noqa: F401  (loads the C++ kernels the overrides call)
    from vllm.platforms.cpu import CpuPlatform
    from vllm.utils import cpu_triton_utils
    from vllm.v1.sample.rejection_sampler import expand_batch_to_tokens

    from dcoco.serving.vllm import cpu_fixes as vllm_cpu_fixes

    vllm_cpu_fixes.install()
    original = vllm_cpu_fixes.replaced
    if original is not None:  # vLLM's own override: it drops its result (the bug)
        out = torch.full((6,), -7.0)
        original(
            out, torch.tensor([0.0, 0.7, 1.3]), torch.tensor([2, 5, 6], dtype=torch.int32), 0, 1
        )
        assert out.tolist() == [-7.0] * 6
    CpuPlatform.register_triton_kernel_overrides()  # as a worker does, after loading plugins
    assert cpu_triton_utils._expand_kernel_impl is expand_into
    temperatures = torch.tensor([0.0, 0.7, 1.3])
    expanded = expand_batch_to_tokens(
        temperatures, torch.tensor([2, 5, 6], dtype=torch.int32), 6, 0, 1
    )
    assert expanded.tolist() == pytest.approx([1.0, 1.0, 0.7, 0.7, 0.7, 1.3])


SCENARIO = r"""
import json, os
from vllm import LLM, SamplingParams
from dcoco.models.target.loading import resolve_target
llm = LLM(model=str(resolve_target("smollm2-135m-instruct")), dtype="float32", max_model_len=512,
          enforce_eager=True, kv_cache_memory_bytes=128 << 20, max_num_seqs=4, seed=0,
          speculative_config={"method": "ngram", "num_speculative_tokens": 4,
                              "prompt_lookup_max": 4, "prompt_lookup_min": 2})
text = "The quick brown fox jumps over the lazy dog near the river while the sun sets. " * 2
greedy_chat = [{"role": "user", "content": "Repeat this text exactly three times: " + text}]
other_chat = [{"role": "user", "content": "Tell me a story about a dragon."}]
greedy = SamplingParams(temperature=0.0, max_tokens=64)
sampled = SamplingParams(temperature=0.8, seed=1, max_tokens=64)
alone = llm.chat([greedy_chat], greedy, use_tqdm=False)[0].outputs[0].token_ids
both = llm.chat([greedy_chat, other_chat], [greedy, sampled], use_tqdm=False)
beside = both[0].outputs[0].token_ids
print("RESULT " + json.dumps({"alone": list(alone), "beside_sampled": list(beside)}))
"""


def _scenario(plugins: str | None) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind",
           "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}  # fmt: skip
    if plugins is not None:
        env["VLLM_PLUGINS"] = plugins
    done = subprocess.run(
        [sys.executable, "-c", SCENARIO], cwd=REPO_ROOT, env=env, capture_output=True,
        text=True, timeout=600,
    )  # fmt: skip
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    return json.loads(lines[-1].removeprefix("RESULT "))


@pytest.mark.vllm
def test_a_sampled_neighbour_leaves_a_greedy_reply_intact_only_with_the_fix():
    pytest.importorskip("vllm")
    unpatched = _scenario("none")  # no plugin loads: vLLM as shipped
    assert unpatched["beside_sampled"] != unpatched["alone"], "the corruption did not reproduce"
    fixed = _scenario(None)
    assert fixed["beside_sampled"] == fixed["alone"]
    assert fixed["alone"] == unpatched["alone"]  # a lone greedy request never expands
