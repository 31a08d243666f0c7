"""`dcoco serve`'s command without vLLM: the server's argv for each method spec, the checkpoint
view a selection rule is served through, and the automatic layout and precision choice (on a
stand-in probe)."""

from __future__ import annotations

import importlib
import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from dcoco.errors import DcocoError
from dcoco.models.heads.head_compile import COMPILE_KEY
from dcoco.models.heads.head_io import SELECTION_KEY
from dcoco.paths import checkpoints_dir
from dcoco.serving.serve import ServeConfig, build_command, speculative_config


@pytest.fixture
def serve_dirs(tmp_path):
    """A stand-in target dir and a DFlash checkpoint dir (configs only: serve reads no weights),
    from `dflash-mask`, which reads no copy hints."""
    target = tmp_path / "my-target"
    target.mkdir()
    (target / "config.json").write_text("{}")
    drafter = tmp_path / "drafter"
    drafter.mkdir()
    mask_drafter = checkpoints_dir() / "smollm2-135m-instruct" / "dflash-mask"
    shutil.copy(mask_drafter / "config.json", drafter)
    return target, drafter


def test_serve_command_for_a_drafter(serve_dirs):
    target, drafter = serve_dirs
    config = ServeConfig(
        target=str(target), checkpoint=str(drafter), dtype="fp32", port=8123,
        num_draft_tokens=7, python="/opt/py", vllm_args="--max-num-batched-tokens 512",
    )  # fmt: skip
    python, argv = build_command(config)
    assert python == "/opt/py"
    assert argv[:2] == ["-m", "vllm.entrypoints.openai.api_server"]
    flags = dict(zip(argv[2::2], argv[3::2], strict=False))
    assert flags["--model"] == str(target) and flags["--served-model-name"] == "my-target"
    assert flags["--dtype"] == "float32" and flags["--port"] == "8123"
    spec = json.loads(argv[argv.index("--speculative-config") + 1])
    assert spec == {
        "method": "dflash",
        "model": str(drafter.resolve()),
        "num_speculative_tokens": 7,
        "disable_eagle_block_drop": True,  # a DFlash drafter keeps the whole prefix-cache hit
        # vLLM's stock DFlash drafter (this one's architecture) has no get_top_tokens
        "use_local_argmax_reduction": False,
        "draft_sample_method": "probabilistic",  # sampled requests draw their drafts
    }
    assert argv[argv.index("--per-request-spec-decode-metrics") + 1] == "summary"
    config = replace(config, sampled_drafts=False)
    assert speculative_config(config)["draft_sample_method"] == "greedy"
    assert "--enforce-eager" in argv and argv[-2:] == ["--max-num-batched-tokens", "512"]


def test_serve_command_plain_and_bad_setups(serve_dirs):
    target, drafter = serve_dirs
    _, argv = build_command(ServeConfig(method="plain", target=str(target), python="/opt/py"))
    assert "--speculative-config" not in argv and "--per-request-spec-decode-metrics" not in argv
    guard = argv[argv.index("--middleware") + 1]  # vLLM imports it by this path
    module, name = guard.rsplit(".", 1)
    assert callable(getattr(importlib.import_module(module), name))
    _, argv = build_command(
        ServeConfig(method="plain", target=str(target), python="/opt/py", request_guard=False)
    )
    assert "--middleware" not in argv
    with pytest.raises(DcocoError, match="carries no draft head, not the dcoco head"):
        build_command(ServeConfig(method="dcoco", target=str(target), checkpoint=str(drafter)))
    with pytest.raises(DcocoError, match="no checkpoint for dspark"):
        build_command(ServeConfig(method="dspark", target=str(target)))
    with pytest.raises(DcocoError, match="unknown method"):
        build_command(ServeConfig(method="eagle", target=str(target)))
    with pytest.raises(DcocoError, match="not served through vLLM"):
        build_command(ServeConfig(method="pld", target=str(target)))
    slots = json.loads((drafter / "config.json").read_text())["block_size"] - 1
    too_many = ServeConfig(target=str(target), checkpoint=str(drafter), num_draft_tokens=slots + 1)
    with pytest.raises(DcocoError, match=f"1..{slots}"):
        build_command(too_many)
    config = json.loads((drafter / "config.json").read_text())
    config["dcoco"]["copy_hints"] = True  # served: the plugin writes the hints
    (drafter / "config.json").write_text(json.dumps(config))
    hinted = speculative_config(ServeConfig(target=str(target), checkpoint=str(drafter)))
    assert hinted["model"] == str(drafter.resolve()) and hinted["method"] == "dflash"


def test_serve_takes_method_specs_with_a_selection_and_a_checkpoint(
    serve_dirs, tmp_path, monkeypatch
):
    monkeypatch.setenv("DCOCO_CACHE_DIR", str(tmp_path / "cache"))
    target, drafter = serve_dirs
    config = json.loads((drafter / "config.json").read_text())
    config["architectures"] = ["DFlashDcocoDraftModel"]
    config["dcoco_head"] = {"kind": "dcoco", "hidden_size": 576}
    (drafter / "config.json").write_text(json.dumps(config))
    spec = ServeConfig(method=f"dcoco:global@{drafter}", target=str(target), python="/opt/py")
    _, argv = build_command(spec)
    served = json.loads(argv[argv.index("--speculative-config") + 1])
    assert served["use_local_argmax_reduction"]  # our model class hands over its token ids
    view = Path(served["model"])
    # vLLM gets a view of the checkpoint whose config names the rule; the checkpoint is untouched.
    assert view.is_relative_to(tmp_path / "cache") and view != drafter.resolve()
    # and that the plugin compiles the head's pick (--no-compile-head: not)
    expected = {**config, SELECTION_KEY: "global", COMPILE_KEY: True}
    assert json.loads((view / "config.json").read_text()) == expected
    assert SELECTION_KEY not in json.loads((drafter / "config.json").read_text())
    eager = ServeConfig(method=f"dcoco@{drafter}", target=str(target), python="/opt/py")
    _, argv = build_command(replace(eager, compile_head=False))
    assert json.loads(argv[argv.index("--speculative-config") + 1])["model"] == str(
        drafter.resolve()
    )
    with pytest.raises(DcocoError, match="only dcoco takes a selection"):
        build_command(ServeConfig(method="dflash:global", target=str(target)))
    with pytest.raises(DcocoError, match="holds a dcoco head: serve it with --method dcoco"):
        build_command(ServeConfig(method=f"dflash@{drafter}", target=str(target)))


def test_the_auto_layout_of_a_drafter_also_times_drafting_nothing(
    serve_dirs, tmp_path, monkeypatch
):
    """`--layout auto --dtype auto` with a measured schedule: each layout and dtype is also timed
    with a schedule of K = 0, so a precision that decodes one token at a time faster wins even
    where another drafts faster (rates from the AVX2 Zen 3: fp32 drafting 12.3, bf16 plain-like
    16.4)."""
    from dcoco.serving import layout, serve

    monkeypatch.setenv("DCOCO_CACHE_DIR", str(tmp_path / "cache"))
    target, drafter = serve_dirs
    rates = {("float32", True): 12.3, ("bfloat16", True): 7.3,
             ("float32", False): 13.1, ("bfloat16", False): 16.4}  # fmt: skip
    probed = []

    def probe(python, argv, name):
        spec = json.loads(argv[argv.index("--speculative-config") + 1])
        drafts = "num_speculative_tokens_per_batch_size" not in spec
        assert drafts or spec["num_speculative_tokens_per_batch_size"] == [[1, 1 << 16, 0]]
        probed.append((name, argv[argv.index("--dtype") + 1], drafts))
        return rates[probed[-1][1:]] + (0.5 if name == "all-cores" else 0.0)

    monkeypatch.setattr(layout, "probe_layout", probe)
    config = ServeConfig(target=str(target), checkpoint=str(drafter), python="/opt/py",
                         calibrate=True)  # fmt: skip
    chosen, dtype, _, argv = serve._measured_setup(config)
    assert (chosen, dtype) == ("all-cores", "bf16") and len(probed) == 8
    assert "num_speculative_tokens_per_batch_size" in argv[argv.index("--speculative-config") + 1]
    probed.clear()  # a schedule fixed by the user is timed as it is
    serve._measured_setup(replace(config, draft_schedule="fixed", dtype="fp32"))
    assert sorted(probed) == [("all-cores", "float32", True), ("vllm-default", "float32", True)]
