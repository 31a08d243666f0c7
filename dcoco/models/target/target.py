"""The target adapter: one forward that returns logits and tapped hidden states, over a rollbackable
KV cache, plus the tokenizer side (chat template, stop ids).

A tap on layer i is the output of decoder layer i (HF `hidden_states[i + 1]`), before the
final norm.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from transformers import DynamicCache, PreTrainedModel

from dcoco.contracts import TargetOutput
from dcoco.errors import DcocoError
from dcoco.models.target.cache import new_cache
from dcoco.models.target.head_precision import Fp32Head
from dcoco.models.target.layer_loop import layer_loop_for
from dcoco.models.target.precision import LOAD_DTYPES
from dcoco.models.target.rowwise_attention import kv_storage_dtype


@dataclass(frozen=True)
class TargetInfo:
    """What a drafter trained on this target must agree with."""

    name: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    fingerprint: str


class TargetModel:
    """A Hugging Face causal LM seen through the interface the engine and the trainers need."""

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer=None,
        name: str = "target",
        precision: str = "",
        attention: str = "",
        matmul: str = "aten",
    ):
        """`precision`, `attention` and `matmul` name how the forward runs
        (dcoco.models.target.precision, dcoco.models.target.packed_linear); by default the model's
        own dtype
        and attention implementation, and aten's linear layers."""
        self.model = model.eval()
        self.model.requires_grad_(False)
        self.tokenizer = tokenizer
        self.config = model.config
        self.name = name
        self.precision = precision or _dtype_name(model.dtype)
        self.attention = attention or str(getattr(model.config, "_attn_implementation", ""))
        self.matmul = matmul
        self.layers: nn.ModuleList = model.model.layers
        self.embed_tokens: nn.Embedding = model.get_input_embeddings()
        self.lm_head: nn.Linear = model.get_output_embeddings()
        # decoding steps and verifies run through our own pass over the same modules (bit-equal,
        # without transformers' per-call machinery); None: every call takes the model's forward
        self.layer_loop = layer_loop_for(model)
        self.max_context = int(getattr(self.config, "max_position_embeddings", 2048))
        self.stop_ids = self._stop_ids()
        self.info = TargetInfo(
            name=name,
            vocab_size=self.embed_tokens.weight.shape[0],
            hidden_size=self.config.hidden_size,
            num_layers=len(self.layers),
            fingerprint=self._fingerprint(),
        )

    @property
    def device(self) -> torch.device:
        return self.embed_tokens.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.embed_tokens.weight.dtype

    @property
    def head_dtype(self) -> str:
        """`fp32` where the LM head runs in fp32 beside a half-precision target
        (dcoco.models.target.head_precision), else `target`."""
        return "fp32" if isinstance(self.lm_head, Fp32Head) else "target"

    def new_cache(self) -> DynamicCache:
        attention = str(getattr(self.config, "_attn_implementation", ""))
        storage = kv_storage_dtype(attention, self.dtype, self.device)
        return new_cache(self.config, storage)

    @torch.inference_mode()
    def forward(
        self,
        input_ids: Tensor,  # [batch, tokens]
        cache: DynamicCache | None = None,
        feature_layers: tuple[int, ...] = (),
        attention_mask: Tensor | None = None,  # [batch, past + tokens], 1 = real token
        with_logits: bool = True,
        last_logits_only: bool = False,
    ) -> TargetOutput:
        """Run the target over `input_ids`, appending to `cache` when given.

        Positions continue from the cache length. `feature_layers` picks the taps; their outputs
        are concatenated along the hidden dimension. `with_logits=False` skips the LM head (the
        drafter trainers only need features); `last_logits_only` keeps the final position only
        (prefill needs nothing else, and the 49k-row head is a large share of a step).
        """
        for layer in feature_layers:
            if not 0 <= layer < len(self.layers):
                raise DcocoError(
                    f"layer tap {layer} does not exist: the target has {len(self.layers)} layers"
                )
        if self.layer_loop is not None and self.layer_loop.takes(input_ids, cache, attention_mask):
            hidden, captured = self.layer_loop.forward(input_ids, cache, feature_layers)
        else:
            hidden, captured = self._model_forward(input_ids, cache, feature_layers, attention_mask)
        if last_logits_only:
            hidden = hidden[:, -1:]
        logits = self.lm_head(hidden) if with_logits else None
        features = (
            torch.cat([captured[layer] for layer in feature_layers], dim=-1)
            if feature_layers
            else None
        )
        return TargetOutput(logits=logits, features=features)

    def _model_forward(self, input_ids, cache, feature_layers, attention_mask):
        """The model's own forward: its last hidden state and the tapped layers' outputs."""
        captured: dict[int, Tensor] = {}
        hooks = [
            self.layers[layer].register_forward_hook(_capture_into(captured, layer))
            for layer in feature_layers
        ]
        try:
            outputs = self.model.model(
                input_ids=input_ids,
                attention_mask=attention_mask,
                cache=cache,
                use_cache=cache is not None,
            )
        finally:
            for hook in hooks:
                hook.remove()
        return outputs.last_hidden_state, captured  # [batch, tokens, hidden]

    # --- tokenizer side -------------------------------------------------------------------

    def encode_chat(self, messages: list[dict[str, str]] | str, chat: bool = True) -> list[int]:
        """Token ids of a prompt: with the chat template (and generation prompt) by default."""
        if self.tokenizer is None:
            raise DcocoError("this target has no tokenizer; pass token ids instead of text")
        return encode_chat(self.tokenizer, messages, chat)

    def decode(self, ids: list[int]) -> str:
        if self.tokenizer is None:
            return " ".join(str(i) for i in ids)
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def _stop_ids(self) -> frozenset[int]:
        ids: set[int] = set()
        sources = [getattr(self.model, "generation_config", None), self.config, self.tokenizer]
        for source in sources:
            eos = getattr(source, "eos_token_id", None) if source is not None else None
            if isinstance(eos, int):
                ids.add(eos)
            elif isinstance(eos, (list, tuple)):
                ids.update(int(x) for x in eos)
        return frozenset(ids)

    def _fingerprint(self) -> str:
        """A short hash of the shapes and a slice of the embedding, stable across fp32/bf16."""
        rows = self.embed_tokens.weight[:16].detach().to(torch.bfloat16).float().cpu()
        digest = hashlib.sha256()
        digest.update(f"{self.info_dims()}".encode())
        digest.update(rows.numpy().tobytes())
        return digest.hexdigest()[:16]

    def info_dims(self) -> tuple[int, int, int]:
        return (self.embed_tokens.weight.shape[0], self.config.hidden_size, len(self.layers))


def encode_chat(tokenizer, messages: list[dict[str, str]] | str, chat: bool = True) -> list[int]:
    """Token ids of a prompt with `tokenizer`: its chat template (and generation prompt) when it
    has one and `chat`, else the messages' text joined by newlines."""
    if isinstance(messages, str):
        messages = [{"role": "user", "content": messages}]
    if chat and getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return tokenizer(text, add_special_tokens=False)["input_ids"]
    return tokenizer("\n".join(m["content"] for m in messages))["input_ids"]


def _dtype_name(dtype: torch.dtype) -> str:
    names = {torch_dtype: name for name, torch_dtype in LOAD_DTYPES.items()}
    return names.get(dtype, str(dtype).removeprefix("torch."))


def _capture_into(store: dict[int, Tensor], layer: int):
    def hook(_module, _inputs, output):
        store[layer] = output[0] if isinstance(output, tuple) else output

    return hook
