"""Shared set-up for the commands that decode: target + method -> Engine, from one config."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dcoco.contracts import SamplingParams
from dcoco.decode.auto_precision import resolve_precision
from dcoco.decode.cost_curve import forward_curve
from dcoco.decode.draft_length import DraftLengthPolicy
from dcoco.decode.draft_precision import check_draft_block, check_draft_dtype
from dcoco.decode.engine import Engine
from dcoco.decode.methods import MethodOptions, build_proposer
from dcoco.errors import DcocoError
from dcoco.models.drafter.draft_vocab import check_draft_vocab
from dcoco.models.target.loading import DEFAULT_TARGET, load_target
from dcoco.models.target.target import TargetModel


@dataclass
class DecodeConfig:
    """What every decoding command shares. The temperature is each command's own: one for
    `generate` and `compare`, a list for `bench`."""

    target: str = DEFAULT_TARGET  # embedded name or HF model directory
    dtype: str = "auto"  # auto (measured per machine) | bf16 | fp32 | fp16 | int8 | gguf | gguf-a8
    attention: str = "auto"  # auto (rowwise on a CPU, sdpa on CUDA) | rowwise | eager | sdpa
    matmul: str = "auto"  # linear kernel: auto (onednn on a CPU at fp32/bf16) | aten | onednn
    device: str = ""  # empty = CUDA when present, else CPU
    threads: int = 0  # CPU threads for torch; 0 = torch's default
    max_new_tokens: int = 256  # new tokens per reply, at most
    top_p: float = 1.0  # nucleus sampling; 1 = off
    top_k: int = 0  # top-k sampling; 0 = off
    seed: int = 0  # sampling seed
    chat: bool = True  # apply the target's chat template
    num_draft_tokens: str = "auto"  # auto | N: drafts per cycle (auto: best measured tokens/s)
    drafter: str = ""  # drafter checkpoint; empty = the one shipped for the target
    selection: str = "greedy"  # dcoco's selection rule: greedy | keep1 | global | discounted | top1
    draft_dtype: str = "auto"  # drafter: auto (measured) | target | fp32 | int4 | w4a8
    head_dtype: str = "auto"  # LM head precision: auto (measured with --dtype) | target | fp32
    draft_vocab: str = "auto"  # drafter head rows: auto (16000 most frequent) | full | N
    draft_block: str = "drafted"  # drafter pass rows: drafted (anchor + drafts) | full (block)
    compile_head: bool = True  # compile the DCOCO corrector's pick (torch.compile, first draft)
    sampled_drafts: bool = True  # at T > 0 draw drafts from the drafter's distribution, not argmax
    correction_gate: bool = True  # dcoco, T = 0: correct only at draft lengths where it pays

    def sampling(self, temperature: float = 0.0) -> SamplingParams:
        return SamplingParams(temperature=temperature, top_p=self.top_p, top_k=self.top_k)

    def method_options(self) -> MethodOptions:
        fixed = self.fixed_draft_tokens()
        return MethodOptions(
            num_draft_tokens=fixed or 0,
            drafter=self.drafter,
            selection=self.selection,
            draft_dtype=check_draft_dtype(self.draft_dtype),  # bad input fails at once
            draft_vocab=check_draft_vocab(self.draft_vocab),
            draft_block=check_draft_block(self.draft_block),
            compile_head=self.compile_head,
            sampled_drafts=self.sampled_drafts,
            correction_gate=self.correction_gate,
        )

    def fixed_draft_tokens(self) -> int | None:
        """The fixed draft count, or None for auto."""
        if self.num_draft_tokens == "auto":
            return None
        try:
            count = int(self.num_draft_tokens)
        except ValueError:
            count = 0
        if count < 1:
            raise DcocoError(
                f"num-draft-tokens must be 'auto' or a count >= 1, got '{self.num_draft_tokens}'"
            )
        return count


def open_target(config: DecodeConfig, methods: list[str] = ()) -> TargetModel:
    """The target at the config's precision; `auto` is resolved here for `methods` (our method
    specs the command decodes with) and written back into `config.dtype` and
    `config.head_dtype`, so everything after the load reads the precision that ran."""
    config.sampling()  # validate the flags before the (slower) model load
    if config.max_new_tokens <= 0:
        raise DcocoError(f"max-new-tokens must be > 0, got {config.max_new_tokens}")
    if config.threads > 0:
        torch.set_num_threads(config.threads)
    config.dtype, config.head_dtype = resolve_precision(config, list(methods))
    return load_target(config.target, config.dtype, config.device or None, config.attention,
                       config.matmul, config.head_dtype)  # fmt: skip


def make_engine(target: TargetModel, method: str, config: DecodeConfig) -> Engine:
    proposer = build_proposer(method, target, config.method_options())
    if proposer is None or config.fixed_draft_tokens() is not None:
        return Engine(target, proposer)
    curve = forward_curve(target, max_tokens=proposer.num_draft_tokens + 1)
    policy = DraftLengthPolicy(curve, proposer.num_draft_tokens, proposer.acceptance_prior)
    return Engine(target, proposer, policy)
