"""`dcoco export` against stock vLLM's DFlash drafter (our plugin switched off with
VLLM_PLUGINS=""): vLLM loads the exported shipped drafter
(`dflash`, its copy gate left out) through its own `qwen3_dflash` loader with the very tensors we
wrote, and greedy fp32 output with it as the drafter equals plain vLLM's, offline and from the
`vllm serve` line `dcoco export` prints.

Needs vLLM: run in the vLLM venv (`make test-vllm`); skipped elsewhere.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import urllib.request

import pytest
import torch
from conftest import KV_CACHE_BYTES, stop_server, vllm_test_engine, wait_healthy
from conftest import VLLM_ENV as ENV
from conftest import VLLM_PROMPTS as PROMPTS
from conftest import VLLM_TARGET as TARGET
from safetensors.torch import load_file
from test_vllm import MAX_TOKENS

from dcoco.serving.export import ExportConfig, export
from dcoco.serving.layout import free_port


def _drafter_parameters(worker) -> dict:
    """vLLM's drafter, as loaded: each parameter still held as such, and for each linear layer
    (vLLM-CPU repacks their weights) its output on a fixed input."""
    model = worker.model_runner.drafter.model
    found = {name: p.detach().cpu().clone() for name, p in model.named_parameters() if p.numel()}
    found["__module__"] = type(model).__module__
    generator = torch.Generator().manual_seed(0)
    for name, module in model.named_modules():
        if type(module).__name__.endswith("Linear") and hasattr(module, "input_size"):
            x = torch.randn(3, module.input_size, generator=generator)
            out = module(x)
            found[f"{name}.weight@x"] = (x, (out[0] if isinstance(out, tuple) else out).detach())
    return found


def _generate(target_dir: str, prompts, speculative: dict | None, parameters: bool = False):
    from vllm import SamplingParams
    from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

    llm = vllm_test_engine(target_dir, speculative)
    try:
        greedy = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
        outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], greedy, use_tqdm=False)
        ids = [list(o.outputs[0].token_ids) for o in outputs]
        loaded = llm.collective_rpc(_drafter_parameters)[0] if parameters else None
    finally:
        del llm
        gc.collect()
        cleanup_dist_env_and_memory()
    return ids, loaded


def _served(target_dir: str, speculative: dict, prompts, tmp_path) -> list[list[int]]:
    """Greedy completions of `prompts` from `vllm serve` with the export, our plugin off."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    # `vllm serve` itself: vllm-cpu's `vllm` command looks up a package named vllm and stops,
    # so the server module it runs is started directly, with the same arguments
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", target_dir,
               "--port", str(port), "--dtype", "float32", "--max-model-len", "512",
               "--enforce-eager", "--kv-cache-memory-bytes", str(KV_CACHE_BYTES),
               "--speculative-config", json.dumps(speculative)]  # fmt: skip
    env = {**os.environ, **ENV, "VLLM_ENABLE_V1_MULTIPROCESSING": "1", "VLLM_PLUGINS": ""}
    log = open(tmp_path / "server.log", "w")  # noqa: SIM115 - closed in finally
    server = subprocess.Popen(command, env=env, stdout=log,
                              stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    try:
        wait_healthy(base, server, timeout=900)
        replies = []
        for prompt in prompts:
            body = {"model": target_dir, "prompt": prompt, "max_tokens": MAX_TOKENS,
                    "temperature": 0.0, "return_token_ids": True}  # fmt: skip
            request = urllib.request.Request(base + "/v1/completions", json.dumps(body).encode(),
                                             {"Content-Type": "application/json"})  # fmt: skip
            answer = json.loads(urllib.request.urlopen(request, timeout=300).read())
            replies.append(answer["choices"][0]["token_ids"])
        return replies
    finally:
        stop_server(server)
        log.close()


def _expected(name: str, ours: dict) -> torch.Tensor | None:
    """Our tensor(s) behind vLLM parameter `name` (q/k/v and gate/up are stacked there)."""
    base = name.removeprefix("model.")
    for fused, parts in ((".qkv_proj.", ("q_proj", "k_proj", "v_proj")),
                         (".gate_up_proj.", ("gate_proj", "up_proj"))):  # fmt: skip
        if fused in base:
            return torch.cat([ours[base.replace(fused, f".{part}.")] for part in parts])
    return ours.get(base)


@pytest.mark.vllm
def test_stock_vllm_loads_the_export_and_decodes_like_plain(tmp_path):
    pytest.importorskip("vllm")
    from dcoco.models.target.loading import load_target, resolve_target

    out, dropped = export(ExportConfig(drafter="dflash", out=str(tmp_path / "x"), dtype="fp32"))
    assert "copy_gate" in dropped
    with pytest.MonkeyPatch.context() as patch:
        for key, value in ENV.items():
            patch.setenv(key, value)
        patch.setenv("VLLM_PLUGINS", "")  # no plugin of ours: stock vLLM alone
        torch.set_num_threads(1)
        target = load_target(TARGET, dtype="fp32", device="cpu")
        prompts = [target.encode_chat(text) for text in PROMPTS]
        target_dir = str(resolve_target(TARGET))
        plain, _ = _generate(target_dir, prompts, None)
        speculative = {"method": "dflash", "model": str(out), "num_speculative_tokens": 7}
        drafted, loaded = _generate(target_dir, prompts, speculative, parameters=True)
    assert drafted == plain
    # vLLM's own DFlash model class (ours, dcoco.serving.vllm.model, would be registered where
    # this process already loaded the plugin, as `make test-vllm` does before this test)
    assert loaded["__module__"] == "vllm.model_executor.models.qwen3_dflash"
    assert _served(target_dir, speculative, prompts, tmp_path) == plain
    ours = load_file(str(out / "model.safetensors"))
    compared = set()
    for name, value in loaded.items():
        expected = _expected(name.removesuffix("@x"), ours)
        if expected is None:
            continue
        if isinstance(value, tuple):  # a linear layer: its output on x
            x, output = value
            assert torch.allclose(output, x @ expected.T, rtol=1e-4, atol=1e-4), name
        else:
            assert torch.equal(value, expected), name
        compared.add(name.removesuffix("@x"))
    fused = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")
    unfused = {n for n in ours if not any(f".{f}." in n for f in fused)}
    assert unfused <= {n.removeprefix("model.") for n in compared}  # every tensor checked
    assert sum(".qkv_proj." in n or ".gate_up_proj." in n for n in compared) == 2 * len(
        {n.split(".self_attn")[0] for n in ours if ".q_proj." in n}
    )
