"""Fused CPU kernels for the small bf16 operations of a decoding step and a draft pass.

A gguf step of SmolLM2 on a 2-core EPYC spends about as long in ~1,600 small operators (norms,
rotary, their dtype casts) as in its products: an RMSNorm of one row is 10 operators and 15 µs, the
same arithmetic in one C++ call a few µs. This module compiles cpu_kernels.cpp (RMSNorm, rotary with
an optional per-head norm first, and a row argmax equal to torch.argmax), with int4_dot.cpp and
w4a8_layer.cpp (dcoco.models.target.int4_dot) and draft_attention.cpp (the drafter's attention),
once per machine (-march=native unless DCOCO_CPU_ARCH names another, OpenMP) with torch's
extension builder into $DCOCO_CACHE_DIR/cpu-kernels/, and serves them for CPU tensors outside
autograd. Where it cannot build (no C++ compiler, no ninja) or DCOCO_CPU_KERNELS=off, callers keep
PyTorch's operators, after one line on stderr.

Each kernel rounds to bf16 where the operators do, so rotary is bit-equal to them and a norm
differs only where its fp32 sum of squares rounds differently (at most one bf16 step,
tests/test_cpu_kernels.py). Every row is computed alone, so a k-row verify still computes each
row exactly as the 1-row step would, and greedy output stays equal to plain decoding's.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import torch
from torch import Tensor

from dcoco.models.cpu.cpu_info import cpu_info
from dcoco.paths import cache_dir

KERNEL_FILES = (
    "cpu_kernels.cpp",
    "int4_dot.cpp",
    "w4a8_layer.cpp",
    "draft_attention.cpp",
    "corrector_walk.cpp",
)
SOURCES = [Path(__file__).with_name(name) for name in KERNEL_FILES]
# included by the sources: in the digest
HEADERS = [
    Path(__file__).with_name(name)
    for name in ("vector_math.h", "int4_dot_avx2.h", "few_rows.h", "row_math.h")
]
SWITCH = "DCOCO_CPU_KERNELS"  # `off`: PyTorch's operators only
# the -march the kernels are built for: this CPU's own (`native`) unless set, e.g. `haswell` to
# build and test the AVX2 paths (no AVX-512) on a machine that has AVX-512
ARCH = "DCOCO_CPU_ARCH"


def _flags() -> list[str]:
    """-fopenmp: at::parallel_for is inline OpenMP, one thread without it (torch's own backend)."""
    return ["-O3", f"-march={os.environ.get(ARCH, 'native')}", "-fopenmp"]


@functools.cache
def kernels() -> ModuleType | None:
    """The compiled kernels, built on first use; None where they are off or cannot build."""
    if os.environ.get(SWITCH, "on").lower() in ("off", "0", "false"):
        return None
    sources = b"".join(source.read_bytes() for source in SOURCES + HEADERS)
    digest = hashlib.sha256(sources + _build_key()).hexdigest()[:12]
    build = cache_dir() / "cpu-kernels" / digest
    try:
        from torch.utils.cpp_extension import load

        # the ninja that `pip install` put beside this interpreter, where PATH does not have it
        os.environ["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]])
        build.mkdir(parents=True, exist_ok=True)
        if not any(build.glob("*.so")):
            print("dcoco: building the fused CPU kernels (once per machine, about 30 s)",
                  file=sys.stderr)  # fmt: skip
        with build_lock(build):
            return load(f"dcoco_cpu_kernels_{digest}", [str(source) for source in SOURCES],
                        extra_cflags=_flags(), extra_ldflags=["-fopenmp"],
                        build_directory=str(build), verbose=False)  # fmt: skip
    except Exception as error:  # noqa: BLE001 - any build failure means: keep the operators
        reason = str(error).strip().splitlines()[-1] if str(error).strip() else type(error).__name__
        print(f"dcoco: fused CPU kernels unavailable, using PyTorch's operators ({reason})",
              file=sys.stderr)  # fmt: skip
        return None


@contextlib.contextmanager
def build_lock(build: Path) -> Iterator[None]:
    """One build at a time in `build`, under a lock the OS drops with its process. torch's own
    (the file `lock`, removed when a build ends) stays behind when a build is killed, a server's
    by SIGTERM say, and every later build waited on it for ever; under this lock any such file is
    a dead build's, so it goes."""
    with (build / ".dcoco-build-lock").open("w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        (build / "lock").unlink(missing_ok=True)
        yield


def kernels_state() -> str:
    """`fused` where the kernels serve bf16 CPU rows here, else `operators` (for the records
    that key timings: the two cost differently)."""
    return "fused" if kernels() is not None else "operators"


def _build_key() -> bytes:
    """What a build depends on beside the sources: torch (its version and where it lives: a build
    names the headers and libraries of one install, so each venv keeps its own, not rebuilding
    over another's), the flags, this CPU (-march=native)."""
    torch_dir = Path(torch.__file__).parent
    return f"{torch.__version__} {torch_dir} {_flags()} {sorted(cpu_info().flags)}".encode()


def takes(x: Tensor) -> bool:
    """Whether the kernels serve `x`: bf16 rows ([rows, n] or [outer, inner, n], the last dim
    contiguous) on a CPU, outside autograd, and they build here."""
    if x.dtype != torch.bfloat16 or x.device.type != "cpu" or x.requires_grad:
        return False
    if x.dim() not in (2, 3) or x.stride(-1) != 1:
        return False
    return kernels() is not None


def takes_rows(x: Tensor) -> bool:
    """Whether the row kernels (row_argmax, copy_bonus) serve `x`: fp32 or bf16 rows [..., n] with
    the last dim contiguous, on a CPU, outside autograd, and the kernels build here."""
    if x.dtype not in (torch.float32, torch.bfloat16) or x.device.type != "cpu":
        return False
    if x.requires_grad or x.stride(-1) != 1:
        return False
    return kernels() is not None


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """[rows, n] or [outer, inner, n] -> the same, weight [n] or [inner, n] (takes(x) holds)."""
    return kernels().rms_norm(x, weight, eps)


def rotate(x: Tensor, cos: Tensor, signed_sin: Tensor, norm: Tensor | None = None,
           eps: float = 0.0) -> Tensor:  # fmt: skip
    """x [tokens, heads, head_dim] -> x cos + roll(x, head_dim / 2) signed_sin, contiguous;
    with `norm` [heads, head_dim] each head RMS-normed (eps) first. cos, signed_sin: [tokens, 1,
    head_dim] bf16."""
    return kernels().rotate(x, cos.contiguous(), signed_sin.contiguous(), norm, eps)


def attends(query: Tensor, key: Tensor) -> bool:
    """Whether draft_attention serves `query` [queries, q_heads, 64] over `key` [1, kv_heads,
    keys, 64] (rows of 64 contiguous, any strides): bf16 on a CPU outside autograd, built here
    with AVX-512 bf16."""
    if query.dtype != torch.bfloat16 or key.dtype != torch.bfloat16 or query.requires_grad:
        return False
    if query.device.type != "cpu" or query.dim() != 3 or query.shape[-1] != 64:
        return False
    if key.dim() != 4 or query.shape[1] % key.shape[1] or query.stride(-1) != 1:
        return False
    built = kernels()
    return built is not None and built.draft_attention_available()


def draft_attention(query: Tensor, key: Tensor, value: Tensor) -> Tensor:
    """softmax(q kᵀ / √64) v without a mask, for a draft's few query rows (attends() holds), each
    query head over its kv head (grouped-query) -> [queries, q_heads * 64]; not bit-equal to
    SDPA (dcoco/models/cpu/draft_attention.cpp): drafters only."""
    return kernels().draft_attention(query, key, value, query.shape[-1] ** -0.5)
