"""The GPU path, wherever a GPU exists (skipped here): the trainer with bf16 autocast on CUDA, and
decoding on CUDA, lossless against plain decoding at fp32. The same commands take `--device
cuda`; under torchrun each process takes LOCAL_RANK's GPU (dcoco.train.distributed).
"""

from __future__ import annotations

import pytest
import torch
from conftest import make_tiny_target
from test_drafter_train import cyclic_corpus, tiny_config

from dcoco.decode.engine import Engine
from dcoco.decode.methods import MethodOptions, build_proposer
from dcoco.train.drafter_train import train

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def test_autocast_training_and_decoding_on_cuda(tmp_path):
    target = make_tiny_target("llama")
    target.model.to("cuda")
    config = tiny_config(tmp_path / "run", max_steps=40, autocast=True, device="cuda")
    result = train(config, target=target, samples=cyclic_corpus(), progress_bar=False)
    assert result["final"]["accept"] > result["initial"]["accept"] + 1.0
    proposer = build_proposer(f"dflash@{result['drafter']}", target, MethodOptions())
    assert proposer.drafter.fc.weight.device.type == "cuda"
    prompt = [40, 41, 42, 20, 21, 22, 23]
    plain = Engine(target).generate(prompt, 24).new_ids
    assert Engine(target, proposer).generate(prompt, 24).new_ids == plain  # fp32 target: exact
