"""vLLM's DFlash drafter plus a dcoco draft head and/or a copy gate (imported by vLLM through the
plugin registry).

`DcocoDFlashForCausalLM` is vLLM's `DFlashQwen3ForCausalLM` (the V1 DFlash proposer asserts that
class) with two optional additions:
- `self.head`, the very module the training code builds
(`dcoco.models.heads.head_registry.build_head`,
  config from config.json's `dcoco_head`, weights from the checkpoint's `head.*` tensors). See
  dcoco.serving.vllm.plugin for how the head's choice reaches vLLM's draft; above the head's
  ceiling of running requests (dcoco.serving.head_ceiling; a ceiling of its own in steps whose
  requests are all sampled) the drafter's own top-1 is the draft, and with sampled drafts
  (`draft_sample_method: probabilistic`) a step of sampled requests draws from the drafter's
  distribution without the head;
- `self.copy_gate` of a copy-hint drafter (config.json `dcoco.copy_gate`, weights `copy_gate.*`):
  its bonus goes on each mask row's hint, which dcoco.serving.vllm.hints wrote into the rows'
  input ids, as `BlockDrafter.logits` does in our engine.
With a draft vocabulary (vLLM's own `draft_vocab_size` + `d2t` layout, written by
dcoco.serving.checkpoint_view) the gate and the head work over the vocabulary's columns, as
`BlockDrafter.draft` + `HeadProposer` do, and only the chosen draft is spread over every token.

What the head sees matches `BlockDrafter.draft` + `HeadProposer.propose` in our own engine:
- `hidden` [requests, slots, hidden]: the drafter's final hidden states after `norm`, mask slots
  only (vLLM's `DFlashQwen3Model.forward` returns `norm(...)`, and the proposer passes the mask
  rows of it to `compute_logits`);
- `logits` [requests, slots, vocab]: the shared target lm_head on those states;
- `anchor_ids` [requests]: the token each block starts from (the bonus token of the last verify),
  read from the `input_ids` stashed in `forward`;
- the token embedding: the target's, which the proposer puts in place of the drafter's own
  `embed_tokens` after loading, so it is looked up at call time.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor, nn
from vllm.config import VllmConfig
from vllm.model_executor.models.qwen3_dflash import DFlashQwen3ForCausalLM

from dcoco.errors import DcocoError
from dcoco.models.cpu.row_reduce import row_argmax
from dcoco.models.drafter.copy_hints import NO_HINT, add_copy_bonus
from dcoco.models.drafter.draft_vocab import column_table, full_vocab_logits, hint_columns
from dcoco.models.drafter.drafter_io import COPY_ARCHITECTURE, HEAD_ARCHITECTURES, HEAD_PREFIX
from dcoco.models.heads.head_compile import COMPILE_KEY, HeadSelect
from dcoco.models.heads.head_io import HEAD_KEY, SELECTION_KEY
from dcoco.models.heads.head_registry import build_head
from dcoco.models.heads.selection import check_selection
from dcoco.serving.head_ceiling import head_max_batch
from dcoco.serving.vllm.draft_sampling import draw
from dcoco.serving.vllm.plugin import point_mass_logits, request_layout
from dcoco.serving.vllm.settings import current


class _TargetEmbedding:
    """Stands in for an nn.Embedding: looks up `owner.embed_tokens` when called.

    vLLM swaps the target's embedding into the drafter after the weights are loaded, so the head
    must not keep the one it was built with. A plain object, not a Module: nothing is registered.
    """

    def __init__(self, owner: nn.Module, embedding_dim: int, num_embeddings: int):
        self._owner = owner
        self.embedding_dim = embedding_dim
        self.num_embeddings = num_embeddings

    @property
    def weight(self) -> Tensor:
        return self._owner.embed_tokens.weight[: self.num_embeddings]

    def __call__(self, ids: Tensor) -> Tensor:
        return self._owner.embed_tokens(ids)


COPY_GATE_PREFIX = "copy_gate."


class DcocoDFlashForCausalLM(DFlashQwen3ForCausalLM):
    def __init__(self, *, vllm_config: VllmConfig, prefix: str = ""):
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        self.head = self._build_head()
        ours = getattr(self.config, "dcoco", None) or {}
        self._copy_hints = bool(ours.get("copy_hints"))
        self.copy_gate = nn.Linear(self.config.hidden_size, 1) if ours.get("copy_gate") else None
        # The rule comes with the drafter's config (`dcoco serve` writes it), read once here.
        selection = getattr(self.config, SELECTION_KEY, None)
        try:
            self._selection = check_selection(selection) if selection else None
        except DcocoError as error:
            raise ValueError(f"config.json {SELECTION_KEY}: {error}") from error
        speculative = vllm_config.speculative_config
        self._default_slots = int(speculative.num_speculative_tokens or 0)
        # Sampled drafts (`draft_sample_method: probabilistic`, as `dcoco serve` sets it): vLLM
        # draws a sampled request's drafts from these logits, which a head's point mass would make
        # deterministic again (dcoco.decode.sampled_drafts: a draw lands more often at T = 1).
        self._sampled_drafts = getattr(speculative, "draft_sample_method", "") == "probabilistic"
        self._mask_token_id = self.model.mask_token_id
        self._input_ids: Tensor | None = None
        self.sampled_step = False  # set per step by dcoco.serving.vllm.no_draft's proposer wrapper
        self._column_ids: Tensor | None = None  # set by load_weights for a draft vocabulary
        self._column_of: Tensor | None = None
        self._compile_head = bool(getattr(self.config, COMPILE_KEY, False))
        self._select = None  # the head's pick, made on the first call (after vLLM's set-up)

    def _build_head(self) -> nn.Module | None:
        """The checkpoint's draft head; None for a copy-hint drafter without one."""
        fields = getattr(self.config, HEAD_KEY, None)
        architectures = getattr(self.config, "architectures", None) or []
        if fields is None and COPY_ARCHITECTURE in architectures:
            return None
        if not isinstance(fields, dict) or "kind" not in fields:
            raise ValueError(
                f"a {'/'.join(HEAD_ARCHITECTURES.values())} checkpoint needs `{HEAD_KEY}` "
                "(the head's kind and config) in config.json; a plain drafter is "
                "`DFlashDraftModel`"
            )
        fields = dict(fields)
        kind = fields.pop("kind")
        if kind in HEAD_ARCHITECTURES and HEAD_ARCHITECTURES[kind] not in architectures:
            raise ValueError(
                f"config.json names {architectures} but holds a {kind} head "
                f"(expected {HEAD_ARCHITECTURES[kind]})"
            )
        self._embedding = _TargetEmbedding(
            self.model, self.config.hidden_size, self.config.vocab_size
        )
        return build_head(kind, fields, self._embedding).eval()

    def forward(  # type: ignore[override]
        self,
        input_ids: Tensor,
        positions: Tensor,
        inputs_embeds: Tensor | None = None,
    ) -> Tensor:
        self._input_ids = input_ids  # [requests * (1 + slots)]: the anchors for compute_logits
        return super().forward(input_ids, positions, inputs_embeds)

    def compute_logits(self, hidden_states: Tensor) -> Tensor | None:
        """hidden_states [requests * slots, hidden] (request-major mask rows) -> logits whose
        argmax per row is the draft token: the copy gate's bonus added, the head's choice."""
        logits, chosen = self._draft(hidden_states)
        if chosen is not None:
            return point_mass_logits(chosen, logits, self.config.vocab_size)
        return logits if logits is None or self._column_ids is None else self._spread(logits)

    def get_top_tokens(self, hidden_states: Tensor) -> Tensor:
        """The draft token ids [requests * slots] themselves, which vLLM's proposer asks for in
        place of compute_logits(...).argmax(-1) under `use_local_argmax_reduction` (as `dcoco
        serve` configures it): no logits over every token are built and searched. The same
        tokens, ties aside: the first maximal column here, the first maximal token id there."""
        logits, chosen = self._draft(hidden_states)
        if chosen is not None:
            return chosen
        # [rows] draft-vocabulary columns, or token ids; the group maxima, as before the fused
        # kernels: nothing compiles inside a serving worker
        columns = row_argmax(logits, fused=False)
        return columns if self._column_ids is None else self._column_ids[columns]

    def sample_drafts(
        self, hidden_states: Tensor, temperature: Tensor
    ) -> tuple[Tensor, Tensor | None]:
        """Drafts of a step holding sampled requests (dcoco.serving.vllm.draft_sampling): token
        ids [rows] drawn from the drafter over its columns at each request's `temperature`
        [requests], and q [rows, vocab]; the head's picks and no q where it picked."""
        logits, chosen = self._draft(hidden_states)
        if chosen is not None:
            return chosen, None
        per_row = temperature.repeat_interleave(hidden_states.shape[0] // temperature.shape[0])
        return draw(logits, self._column_ids, self.config.vocab_size, per_row)

    def _draft(self, hidden_states: Tensor) -> tuple[Tensor | None, Tensor | None]:
        """The drafter's logits [rows, vocab or N columns] with the copy gate's bonus, and the
        head's token ids [rows] (None where the drafter's own top-1 is the draft)."""
        column_ids = self._column_ids  # [N]: a draft vocabulary's token ids, None: every row
        if column_ids is None:
            logits = super().compute_logits(hidden_states)
        else:  # over the vocabulary's columns; spread over every token by the callers
            logits = self.logits_processor(self.lm_head, hidden_states)
        if logits is None or self._input_ids is None or hidden_states.shape[0] == 0:
            return logits, None
        mask = self._mask_token_id
        requests, slots = request_layout(
            self._input_ids,
            hidden_states.shape[0],
            None if self._copy_hints else mask,  # hinted slots hold tokens, not MASK
            self._default_slots,
        )
        blocks = self._input_ids[: requests * (slots + 1)].view(requests, slots + 1)
        if self.copy_gate is not None:
            hints = blocks[:, 1:].reshape(-1)  # [rows]: the hint, or MASK where there is none
            hint_columns = self._hint_columns(torch.where(hints == mask, NO_HINT, hints))
            bonus = self.copy_gate(hidden_states).squeeze(-1).float()  # [rows]
            bonused = add_copy_bonus(logits.float(), bonus, hint_columns, fused=False)
            logits = bonused.to(logits.dtype)
        if self.head is None:
            return logits, None
        block = (
            hidden_states.view(requests, slots, -1),
            logits.view(requests, slots, logits.shape[-1]),
            blocks[:, 0],  # the anchors
        )
        if self._select is None:  # compiled (head_compile) where the config asks for it
            max_slots = max(1, self._default_slots)
            # a server on a CPU: eager until the fused walk's kernels are built, nothing compiled
            # beside its model steps (dcoco.models.heads.head_compile); elsewhere `select`,
            # compiled where the config asks
            background = current().compile_head_in_background
            self._select = HeadSelect(
                self.head, self._selection, self._column_ids, max_slots,
                compile=self._compile_head, in_background=background, fused=background,
            )  # fmt: skip
        if requests > head_max_batch(self.sampled_step) or (
            self.sampled_step and self._sampled_drafts
        ):  # the drafter's own top-1, or a draw from its distribution, is the draft
            self._select.prepare(*block)  # compiled before the head first picks
            return logits, None
        return logits, self._select(*block).reshape(-1)  # [rows] the head's token ids

    def _spread(self, logits: Tensor) -> Tensor:
        """[rows, N] column logits -> [rows, vocab], -inf outside the vocabulary (as vLLM's)."""
        return full_vocab_logits(logits, self._column_ids, self.config.vocab_size)

    def _hint_columns(self, hints: Tensor) -> Tensor:
        """Token ids (NO_HINT allowed) -> logits columns; NO_HINT outside a draft vocabulary."""
        return hints if self._column_of is None else hint_columns(hints, self._column_of)

    def load_weights(self, weights: Iterable[tuple[str, Tensor]]):
        head_weights: dict[str, Tensor] = {}
        gate_weights: dict[str, Tensor] = {}

        def drafter_weights():
            for name, tensor in weights:
                if name.startswith(HEAD_PREFIX):
                    head_weights[name[len(HEAD_PREFIX) :]] = tensor
                elif name.startswith(COPY_GATE_PREFIX):
                    gate_weights[name[len(COPY_GATE_PREFIX) :]] = tensor
                else:
                    yield name, tensor

        loaded = super().load_weights(drafter_weights())
        self._index_vocabulary()
        if self.head is not None:
            self._load_head(head_weights)
        if self.copy_gate is not None:
            with torch.no_grad():  # strict: names the missing or unexpected tensors
                self.copy_gate.load_state_dict(gate_weights, strict=True)
        elif gate_weights:
            raise ValueError("the checkpoint has copy_gate.* weights but no dcoco.copy_gate flag")
        if loaded is not None:
            loaded = set(loaded) | {HEAD_PREFIX + name for name in head_weights}
            loaded |= {COPY_GATE_PREFIX + name for name in gate_weights}
        return loaded

    def _index_vocabulary(self) -> None:
        """With a draft vocabulary (config.json `draft_vocab_size`, tensors `lm_head.weight` and
        `d2t`, dcoco.serving.checkpoint_view): each column's token id and each token's column."""
        offsets = self.draft_id_to_target_id
        if offsets is None:
            return
        columns = torch.arange(offsets.shape[0], device=offsets.device)
        self._column_ids = columns + offsets  # [N]
        self._column_of = column_table(self._column_ids, self.config.vocab_size)

    def _load_head(self, weights: dict[str, Tensor]) -> None:
        expected = set(self.head.state_dict())
        missing, unexpected = sorted(expected - set(weights)), sorted(set(weights) - expected)
        if missing or unexpected:
            raise ValueError(
                f"{self.head.kind} head weights do not match the checkpoint: missing {missing}, "
                f"unexpected {unexpected}"
            )
        with torch.no_grad():
            self.head.load_state_dict(weights, strict=True)  # copies, casting to the model dtype
        self.head.eval()
