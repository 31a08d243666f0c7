"""A draft head's pick, compiled with torch.compile (inductor), warmed up before it is timed.

Eagerly, a DCOCO corrector call is some 300 small operators (top-k, features, three vocabulary
tables, pair counts, the successor query, one walk row per slot pair), so at served sizes it
costs about what the drafter's pass does, and whether the corrector pays (dcoco.serving.head_ceiling
under load in vLLM, the draft length in our engine) turns on those milliseconds. Compiled, inductor
fuses them: the schedule probe read the head at +2.0 ms a call over the drafter's own pick at 16
requests x 2 drafts, against +4.1 ms eagerly (2-core Xeon, bf16; `COMPILED=1
scripts/reproduce/corrector_served_cost.py` times both). The picks are the eager ones in fp32; in
bf16 fused operators round differently, so a near tie can go the other way (either pick is
verified: output is unchanged).

Compiling takes 5-15 s a graph on 2 cores, and the walk's loop over slot pairs makes one graph
per slot count (one more for a single request, whose size-1 dimension torch specialises), so the
first call compiles every slot count the drafter can be asked for (1 .. max_slots, for each of
`batch_sizes`: 1 and 2 requests where vLLM serves, later batch sizes reuse the second, dynamic,
graph; 1 in our engine), whether or not the head picks in that step; inductor keeps the compiled
code in its on-disk cache, so a restart mostly re-traces (21 s against 49 s cold, model 207). Any
failure (no C++ compiler, an operator inductor cannot lower) leaves the eager call in place, with
one line on stderr.

A server cannot wait for that: on a fresh 2-core machine the compiling took 155-390 s, and vLLM
fails a step that runs past 300 s (HTTP 500 for every request in flight: CI, 2026-12-07). Nor can
it compile in a thread beside its model steps: tracing patches process-wide state (torch.fx swaps
`nn.Module.__call__` while it traces), and a target step that ran meanwhile in vLLM's thread failed
with `NameError: module is not installed as a submodule`, killing the engine three minutes into
a soak (2026-12-08). So a server's head (`in_background`) never traces in a thread: on a CPU it
walks with the fused C++ call (dcoco.models.heads.fused_walk), whose kernels a thread builds (a
compiler subprocess and an import, nothing traced) while the eager call answers (projecting its
own candidates' embeddings, `defer_tables`); elsewhere it compiles in the calling thread.
"""

from __future__ import annotations

import os
import sys
import threading
import time

import torch
from torch import Tensor, nn

from dcoco.models.heads.base import select_draft
from dcoco.models.heads.fused_walk import fused_walk_for

_GRAPHS = 0  # graphs compiled for draft heads in this process (HeadSelect._compiled)

# config.json of the drafter view `dcoco serve` hands vLLM (dcoco.serving.checkpoint_view): true
# = the plugin's model class compiles its head's pick
COMPILE_KEY = "dcoco_compile_head"


class HeadSelect:
    """`select_draft(head, hidden, logits, anchor_ids, selection, column_ids)`: with `compile`,
    compiled on the first `prepare` or call for every slot count up to `max_slots` (the eager
    call where compiling failed); without, the eager call."""

    def __init__(self, head: nn.Module, selection: str | None, column_ids: Tensor | None,
                 max_slots: int, compile: bool = True,
                 batch_sizes: tuple[int, ...] = (1, 2), in_background: bool = False,
                 fused: bool = False):  # fmt: skip
        """`batch_sizes`: the request counts compiled ahead, for every slot count (vLLM: 1 and 2,
        the second standing for every larger batch; our engine drafts for one). `fused`: where
        the head's walk runs as one C++ call here (dcoco.models.heads.fused_walk), calls run
        that, uncompiled. `in_background`: a server's head, whose process runs models in other
        threads: the fused walk's kernels build in a thread, calls running eagerly until they
        are built, and nothing is compiled on a CPU (see the module's notes)."""
        self.head, self.selection, self.column_ids = head, selection, column_ids
        self.max_slots, self.batch_sizes = max_slots, batch_sizes
        self.in_background = in_background
        self.wants_fused = fused
        walk = fused_walk_for(head, selection, column_ids) if fused and not in_background else None
        self.fused = walk is not None
        self._call = walk or (None if compile else self._eager)  # else set up on first use
        self._thread: threading.Thread | None = None  # the background build, once started
        self.setup_s = 0.0  # seconds the compiling took (0 until it ran, and when eager)

    @property
    def compiled(self) -> bool:
        """Whether calls run the compiled function (not yet prepared, eager, fused or failed:
        False)."""
        return self._call is not None and self._call != self._eager and not self.fused

    def prepare(self, hidden: Tensor, logits: Tensor, anchor_ids: Tensor) -> None:
        """Compile now (or start compiling, `in_background`), from a call's inputs (shapes and
        dtypes): the server's first drafting step does it even where the head's ceiling keeps
        the head out of that step."""
        if self._call is not None or self._thread is not None:
            return
        block = _contiguous(hidden, logits, anchor_ids)
        started = time.perf_counter()  # the frozen tables too are set-up
        if not self.in_background or hidden.device.type != "cpu":
            self._freeze()
            self._call = self._compiled(block, started)
            return
        if not self.wants_fused:  # a CPU server compiles nothing: eager
            self._call = self._eager
            return
        defer = getattr(self.head, "defer_tables", None)
        if defer is not None:  # the thread builds them; eager calls project their own rows
            defer()
        modes = (torch.is_grad_enabled(), torch.is_inference_mode_enabled())
        self._thread = threading.Thread(target=self._fuse_in_background, args=(modes, started),
                                        name="dcoco-head-kernels", daemon=True)  # fmt: skip
        self._thread.start()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for a background compile; True once calls run what it made (compiled or eager)."""
        if self._thread is not None:
            self._thread.join(timeout)
        return self._call is not None

    def __call__(self, hidden: Tensor, logits: Tensor, anchor_ids: Tensor) -> Tensor:
        """Token ids [requests, slots] from hidden [requests, slots, hidden], logits [requests,
        slots, columns] and anchor_ids [requests]."""
        block = _contiguous(hidden, logits, anchor_ids)
        self.prepare(*block)
        return (self._call or self._eager)(*block)  # eager while a background compile runs

    def _fuse_in_background(self, modes: tuple[bool, bool], started: float) -> None:
        """The vocabulary tables and the fused walk's kernels (built where missing), then calls
        switch to the fused walk, or stay eager where the kernels cannot build."""
        grad, inference = modes
        _lowest_priority()  # the serving thread's steps first (it shares the worker's cores)
        with torch.inference_mode(inference), torch.set_grad_enabled(grad):
            self._freeze()
            walk = fused_walk_for(self.head, self.selection, self.column_ids)
        self.fused = walk is not None
        self.setup_s = time.perf_counter() - started
        what = "walks as one C++ call" if walk else "runs eagerly (no fused kernels here)"
        print(f"dcoco: the draft head {what}, set up in {self.setup_s:.0f} s", file=sys.stderr)
        self._call = walk or self._eager

    def _eager(self, hidden: Tensor, logits: Tensor, anchor_ids: Tensor) -> Tensor:
        return select_draft(self.head, hidden, logits, anchor_ids, self.selection, self.column_ids)

    def _freeze(self) -> None:
        prepare = getattr(self.head, "prepare_inference", None)
        if prepare is not None:  # after vLLM swapped the target's embedding in: tables are final
            with torch.no_grad():
                prepare(frozen=True)

    def _compiled(self, block: tuple[Tensor, ...], started: float):
        """The compiled pick, warmed up for every slot count and batch size (`started`: when the
        set-up began, tables included: counted as a first draft's cost, they held
        `--num-draft-tokens auto` at no drafts for a whole demo)."""
        hidden, logits, anchor_ids = block
        # Every HeadSelect compiles the same code object (`_eager`), and dynamo caps the graphs
        # one code object keeps (8 by default): past the cap it would run every head's call
        # eagerly. So the cap grows by the graphs each head compiles (two heads in one run: a
        # bench of two selection rules, `--dtype auto` timing each precision's head).
        global _GRAPHS
        _GRAPHS += len(self.batch_sizes) * self.max_slots + 2
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, _GRAPHS)
        compiled = torch.compile(self._eager, dynamic=True)
        try:
            for slots in range(1, self.max_slots + 1):
                for requests in self.batch_sizes:
                    compiled(*_like(hidden, logits, anchor_ids, requests, slots))
        except Exception as error:  # noqa: BLE001 - any compiler failure: serve the eager call
            reason = (str(error).splitlines() or [""])[0]
            print(f"dcoco: the draft head runs eagerly ({type(error).__name__}: {reason})",
                  file=sys.stderr)  # fmt: skip
            return self._eager
        seconds = self.setup_s = time.perf_counter() - started
        print(f"dcoco: draft head compiled for 1-{self.max_slots} slots in {seconds:.0f} s",
              file=sys.stderr)  # fmt: skip
        return compiled


def _lowest_priority() -> None:
    """This thread at nice 19 where the OS allows it (Linux: a thread has a nice value of its
    own; elsewhere, or without permission, it keeps its priority)."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
    except (AttributeError, OSError):
        pass


def _contiguous(*tensors: Tensor) -> tuple[Tensor, ...]:
    """As the warm-up's inputs are: a view with other strides would compile a graph of its own.
    Dynamo's guards read every stride, a size-1 dimension's too, which `contiguous()` leaves as
    it is (our engine's first 7 of 8 slots: stride 8 x hidden over one request), so such a view
    is copied to the dense strides."""
    return tuple(
        tensor if tensor.stride() == _dense_strides(tensor.shape) else tensor.clone(
            memory_format=torch.contiguous_format)
        for tensor in tensors
    )  # fmt: skip


def _dense_strides(shape: torch.Size) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= size
    return tuple(reversed(strides))


def _like(hidden: Tensor, logits: Tensor, anchor_ids: Tensor, requests: int, slots: int):
    """Inputs shaped as a call with `requests` x `slots` would pass them, values taken from the
    first request of the real call (their values do not matter for compiling)."""
    return (
        hidden[:1, :1].expand(requests, slots, -1).contiguous(),
        logits[:1, :1].expand(requests, slots, -1).contiguous(),
        anchor_ids[:1].expand(requests).contiguous(),
    )
