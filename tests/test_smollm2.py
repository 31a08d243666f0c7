"""Real-model checks on the embedded SmolLM2-135M-Instruct (fp32, where greedy is exact), with the
linear kernel decoding uses by default (oneDNN prepacked on CPU)."""

from __future__ import annotations

import pytest
import torch

from dcoco.cli import main
from dcoco.decode.engine import Engine
from dcoco.decode.proposers import PromptLookupProposer
from dcoco.decode.reference import reference_greedy
from dcoco.eval.compare import BUILTIN_PROMPTS
from dcoco.models.target.loading import load_target

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smollm2():
    return load_target("smollm2-135m-instruct", dtype="fp32", device="cpu", matmul="auto")


def test_plain_engine_equals_reference_decoder(smollm2):
    prompt = smollm2.encode_chat(BUILTIN_PROMPTS[0])
    assert Engine(smollm2).generate(prompt, 24).new_ids == reference_greedy(smollm2, prompt, 24)


def test_pld_greedy_equals_plain_on_five_prompts(smollm2):
    accepted_any = False
    for text in BUILTIN_PROMPTS[:5]:
        prompt = smollm2.encode_chat(text)
        plain = Engine(smollm2).generate(prompt, 64)
        pld = Engine(smollm2, PromptLookupProposer(8)).generate(prompt, 64)
        assert pld.new_ids == plain.new_ids, text
        accepted_any |= pld.stats.tau > 1.0
    assert accepted_any  # the proposer really drafted and the target really accepted


def test_shipped_drafter_greedy_equals_plain_and_is_accepted(smollm2):
    from dcoco.decode.methods import MethodOptions, build_proposer

    proposer = build_proposer("dflash", smollm2, MethodOptions())
    taus = []
    for text in BUILTIN_PROMPTS[:3]:
        prompt = smollm2.encode_chat(text)
        plain = Engine(smollm2).generate(prompt, 48)
        dflash = Engine(smollm2, proposer).generate(prompt, 48)
        assert dflash.new_ids == plain.new_ids, text
        taus.append(dflash.stats.tau)
    assert sum(taus) / len(taus) > 1.05, taus  # trained: a random drafter gives 1.00


# Every head reads its drafter's gated, hinted logits; dcoco (dcoco-joint-12k) has its own drafter.
@pytest.mark.parametrize(
    "method",
    [
        "dcoco",
        "dcoco:keep1",
        "dcoco@dcoco-joint",
        "dcoco:global@dcoco-joint-12k",
        "dspark",
        "domino",
    ],
)
def test_shipped_heads_greedy_equal_plain(smollm2, method):
    from dcoco.decode.methods import MethodOptions, build_proposer, checkpoint_dir, parse_method

    if not checkpoint_dir(parse_method(method), smollm2, MethodOptions()).exists():
        pytest.skip(f"no {method} checkpoint shipped")
    proposer = build_proposer(method, smollm2, MethodOptions())
    for text in BUILTIN_PROMPTS[:2]:
        prompt = smollm2.encode_chat(text)
        plain = Engine(smollm2).generate(prompt, 40)
        assert Engine(smollm2, proposer).generate(prompt, 40).new_ids == plain.new_ids, text


def test_drafter_for_another_target_is_refused(smollm2, tmp_path, capsys):
    import json
    import shutil

    from dcoco.decode.methods import default_drafter_dir

    bad = tmp_path / "drafter"
    shutil.copytree(default_drafter_dir(smollm2), bad)
    config = json.loads((bad / "config.json").read_text())
    config["vocab_size"] = 32000
    (bad / "config.json").write_text(json.dumps(config))
    assert (
        main(
            ["generate", "hi", "--method", "dflash", "--drafter", str(bad), "--max-new-tokens", "4"]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "vocab" in err and "Traceback" not in err


def test_prompt_over_the_context_is_a_clear_error(capsys):
    assert main(["generate", "word " * 9000, "--max-new-tokens", "4"]) == 2
    err = capsys.readouterr().err
    assert "context is 8192" in err and "Traceback" not in err


def test_generate_json(capsys):
    assert (
        main(
            [
                "generate",
                "Say hello.",
                "--max-new-tokens",
                "8",
                "--method",
                "pld",
                "--json",
                "--dtype",
                "fp32",
            ]
        )
        == 0
    )
    import json

    record = json.loads(capsys.readouterr().out)
    assert {"text", "tokens_per_s", "tau", "cycles", "new_tokens", "accept_hist"} <= set(record)
    assert record["new_tokens"] <= 8


def test_shipped_corrector_walks_fused_and_picks_the_eager_fp32_walks(smollm2):
    """On real drafted blocks, the engine's fused walk (dcoco.models.heads.fused_walk) picks what
    the eager fp32 walk picks, and decoding with it equals plain."""
    from dcoco.decode.methods import MethodOptions, build_proposer
    from dcoco.models.heads.head_compile import HeadSelect

    proposer = build_proposer("dcoco", smollm2, MethodOptions(draft_dtype="target"))
    select = proposer.select
    if not select.fused:
        pytest.skip("the fused CPU kernels do not build here")
    blocks, walk = [], select._call

    def recording(*block):
        blocks.append(tuple(tensor.clone() for tensor in block))
        return walk(*block)

    select._call = recording
    prompt = smollm2.encode_chat(BUILTIN_PROMPTS[1])
    plain = Engine(smollm2).generate(prompt, 48)
    assert Engine(smollm2, proposer).generate(prompt, 48).new_ids == plain.new_ids
    eager = HeadSelect(proposer.head, None, select.column_ids, select.max_slots, compile=False)
    assert len(blocks) > 5
    for block in blocks:
        assert torch.equal(walk(*block), eager(*block))
