"""Target features for drafter training: tapped hidden states of whole sequences, optionally
kept on local disk.

Recomputing costs a full target forward (about 1 ms a token for SmolLM2 on CPU); a cached
sequence is one small bf16 safetensors read. The cache pays off from the second epoch on. Cache
entries live under `<dir>/<target fingerprint>-taps-<ids>/` and are named by a hash of the sample
id and its token ids, so a different target, different taps or a re-cut sequence never hits a
stale entry.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import Tensor

from dcoco.data.distill import Sample


class TargetFeatures:
    """`features(sample)` -> [1, tokens, taps * hidden], a plain tensor autograd may read."""

    def __init__(self, target, taps: tuple[int, ...], cache_dir: str | Path | None = None):
        self.target = target
        self.taps = tuple(taps)
        self.cache_dir = None
        if cache_dir:
            name = f"{target.info.fingerprint}-taps-{'-'.join(str(t) for t in self.taps)}"
            self.cache_dir = Path(cache_dir) / name
            self.cache_dir.mkdir(parents=True, exist_ok=True)

    def __call__(self, sample: Sample) -> Tensor:
        path = self._path(sample)
        if path is not None and path.is_file():
            try:
                features = load_file(path)["features"][None]
                return features.to(device=self.target.device, dtype=self.target.dtype)
            except (SafetensorError, OSError, KeyError):
                path.unlink(missing_ok=True)  # a torn write from an interrupted run: recompute
        ids = torch.tensor([sample.input_ids], device=self.target.device)
        out = self.target.forward(ids, feature_layers=self.taps, with_logits=False)
        # The target runs under inference_mode; a clone made outside it can enter autograd.
        features = out.features.clone()  # [1, tokens, taps * hidden]
        if path is not None:
            staging = path.with_suffix(".partial")
            save_file({"features": features[0].to(torch.bfloat16).cpu().contiguous()}, staging)
            os.replace(staging, path)
        return features

    def _path(self, sample: Sample) -> Path | None:
        if self.cache_dir is None:
            return None
        key = json.dumps([sample.id, sample.input_ids]).encode()
        return self.cache_dir / f"{hashlib.sha1(key).hexdigest()}.safetensors"
