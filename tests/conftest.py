"""Tiny random targets (vocab 128, hidden 64, fp32) shaped like Llama and Qwen3; the vLLM tests'
setting and a `dcoco serve` subprocess's start and stop."""

from __future__ import annotations

import os
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

from dcoco.models.target.target import TargetModel

TINY_DIMS = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    rope_theta=10000.0,
    eos_token_id=2,
    bos_token_id=1,
    pad_token_id=0,
)


class CharTokenizer:
    """One token per character, so prompt lengths are easy to predict (no chat template)."""

    def __call__(self, text: str) -> dict:
        return {"input_ids": [3 + ord(char) % 120 for char in text]}

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(ord("a") + token % 26) for token in ids)


# The tiny training tests were written for these settings; the CLI defaults follow the shipped
# recipe instead (block 8, gamma 4, dense anchors, a 16,000-token loss shortlist).
TINY_RUN = dict(gamma=7.0, warmup_ratio=0.04, anchor_stride=0, loss_vocab=0)


def make_tiny_target(arch: str = "llama", seed: int = 0, **overrides) -> TargetModel:
    torch.manual_seed(seed)
    dims = {**TINY_DIMS, **overrides}
    if arch == "llama":
        model = LlamaForCausalLM(LlamaConfig(**dims))
    elif arch == "qwen3":
        model = Qwen3ForCausalLM(Qwen3Config(head_dim=16, **dims))
    else:
        raise ValueError(arch)
    # A random init is near-uniform; sharpen the head so greedy text has structure (repeats),
    # which is what gives prompt lookup and drafters something to accept.
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    return TargetModel(model.float().eval(), tokenizer=None, name=f"tiny-{arch}")


@pytest.fixture(params=["llama", "qwen3"])
def tiny_target(request) -> TargetModel:
    return make_tiny_target(request.param)


@pytest.fixture
def tiny_llama_target() -> TargetModel:
    """The tiny Llama target alone (drafter tests): vocab 128, hidden 64, 4 layers, fp32."""
    return make_tiny_target("llama")


@pytest.fixture
def one_thread():
    """Tiny matmuls on a shared 2-core machine run faster without thread hand-offs."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def drawn(monkeypatch):
    """What every figure saved during the test shows, by file name: its title, its lines
    ({label: (xs, ys)}) and its bar groups ({label: heights}). Plot tests check these values."""
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    saved: dict[str, dict] = {}
    original = Figure.savefig

    def savefig(self, path, *args, **kwargs):
        ax = self.axes[0]
        saved[Path(path).name] = {
            "title": ax.get_title(),
            "lines": {
                line.get_label(): (list(line.get_xdata()), list(line.get_ydata()))
                for line in ax.get_lines()
                if not line.get_label().startswith("_")  # matplotlib's own, unlabelled lines
            },
            "bars": {bars.get_label(): [p.get_height() for p in bars] for bars in ax.containers},
        }
        return original(self, path, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", savefig)
    return saved


KV_CACHE_BYTES = 128 << 20  # the vLLM tests' KV cache (the CPU backend's default is GiBs)


def vllm_test_engine(model: str, speculative: dict | None, max_num_seqs: int = 4, **extra):
    """A vLLM engine as the vLLM tests run it: fp32 (greedy output comparable token for token),
    eager, a 512-token context and a KV_CACHE_BYTES cache."""
    from vllm import LLM

    return LLM(model=model, dtype="float32", max_model_len=512, enforce_eager=True,
               kv_cache_memory_bytes=KV_CACHE_BYTES, speculative_config=speculative,
               max_num_seqs=max_num_seqs, seed=0, **extra)  # fmt: skip


# --- the vLLM tests' shared setting (tests/test_vllm*.py) --------------------------------------

VLLM_TARGET = "smollm2-135m-instruct"
VLLM_PROMPTS = [
    "Write a Python function that reverses a list.",
    "What is the capital of France? Answer in one sentence.",
    "Give three tips for sleeping better.",
]
VLLM_COPY = "dflash"  # the shipped drafter, block 8: copy hints and a copy gate, 7 slots
VLLM_ENV = {
    "OMP_NUM_THREADS": "1",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
}


def randomised_dcoco_checkpoint(path, target, drafter):
    from dcoco.data.bigram import successor_log_probs
    from dcoco.data.distill import Sample
    from dcoco.models.heads.head_io import save_with_head
    from dcoco.models.heads.head_registry import build_head

    torch.manual_seed(0)
    prompts = [Sample(str(i), (), tuple(target.encode_chat(t))) for i, t in enumerate(VLLM_PROMPTS)]
    table = successor_log_probs(prompts, drafter.config.vocab_size)
    fields = {"hidden_size": drafter.config.hidden_size, "top_k": 4, "mlp_hidden": 32,
              "features": "normalised", "successor_query": True, "anchor": True,
              "pair_counts": table[0].numel(), "vocab_size": drafter.config.vocab_size}  # fmt: skip
    head = build_head("dcoco", fields, target.embed_tokens)
    head.pair_counts.fill(*table)
    with torch.no_grad():  # non-zero output layers, so the corrector really changes drafts
        head.delta_out.weight.normal_(std=2.0)
        head.query_out.weight.normal_(std=0.5)
        head.bigram_scale.fill_(0.5)
    return save_with_head(path, drafter, head, target.info, dtype=torch.float32)


@pytest.fixture(scope="module")
def dcoco_checkpoint(tmp_path_factory):
    """The shipped drafter plus a randomised DCOCO corrector with every option, saved with
    save_with_head."""
    pytest.importorskip("vllm")
    from dcoco.models.drafter.drafter_io import load_drafter
    from dcoco.models.target.loading import load_target
    from dcoco.paths import checkpoints_dir

    target = load_target(VLLM_TARGET, dtype="fp32", device="cpu")
    drafter = load_drafter(checkpoints_dir() / VLLM_TARGET / VLLM_COPY, target)
    path = tmp_path_factory.mktemp("dcoco") / "ckpt"
    return randomised_dcoco_checkpoint(path, target, drafter)


# --- a `dcoco serve` subprocess (tests/test_vllm_serve.py, tests/test_vllm_export.py) ---------


def wait_healthy(base: str, server: subprocess.Popen, timeout: float) -> None:
    """Until `base`/health answers 200; AssertionError if the server exits or time runs out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise AssertionError(f"dcoco serve exited with {server.returncode}")
        try:
            if urllib.request.urlopen(base + "/health", timeout=5).status == 200:
                return
        except OSError:
            pass
        time.sleep(2)
    raise AssertionError(f"no healthy server at {base} after {timeout} s")


def stop_server(server: subprocess.Popen) -> None:
    """SIGINT, then SIGKILL, to the server's own process group (it and its engine processes)."""
    for sig, wait in ((signal.SIGINT, 60), (signal.SIGKILL, 30)):
        if server.poll() is not None:
            return
        try:
            os.killpg(server.pid, sig)
        except ProcessLookupError:
            return
        try:
            server.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue
