"""Training survives kills: a run SIGKILLed five times at random moments and rerun each time ends
with the weights of a run never killed, bit for bit. For the drafter, a drop-in corrector on
the online loop, and a corrector on the corrector cache (whose build is killed too).

Each run is a subprocess (this file run as a script) on the tiny Llama target and a tiny corpus,
one thread, so a kill is a real one: no cleanup, files left as they were.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

KINDS = ("drafter", "dropin", "cached")
KILLS = 5


def _run_in_subprocess(kind: str, work: Path, out: Path) -> subprocess.Popen:
    # a cache dir per run, so the killed run builds (and is killed building) its own cache
    env = {**os.environ, "DCOCO_CACHE_DIR": str(work / f"cache-{out.name}"), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, __file__, kind, str(work), str(out)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip


def _last_step(out: Path) -> int:
    """The last train step the run logged (its log survives kills; a torn last line is skipped)."""
    path = out / "train_log.jsonl"
    if not path.is_file():
        return 0
    steps = [0]
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if record.get("event") == "train":
            steps.append(record["step"])
    return steps[-1]


def _final_state(out: Path) -> dict:
    state = torch.load(out / "ckpt" / "state.pt", weights_only=True)
    weights = state.get("head") or state["model"]
    return {"step": state["step"], **weights}


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_five_random_kills_leave_the_weights_of_an_unkilled_run(kind, tmp_path):
    straight = _run_in_subprocess(kind, tmp_path, tmp_path / "straight")
    assert straight.wait(timeout=600) == 0, straight.stderr.read().decode()[-2000:]
    rng = random.Random(kind)
    killed_out = tmp_path / "killed"
    kills = 0
    while kills < KILLS:
        run = _run_in_subprocess(kind, tmp_path, killed_out)
        # kill at a random moment after a random number of further steps (never before the
        # run is training, and never after it is done: each kill lands mid-run)
        target = _last_step(killed_out) + rng.randint(5, 50)
        while _last_step(killed_out) < target and run.poll() is None:
            time.sleep(0.02)
        time.sleep(rng.uniform(0.0, 0.3))
        if run.poll() is not None:
            assert run.returncode == 0, run.stderr.read().decode()[-2000:]
            break
        run.send_signal(signal.SIGKILL)
        run.wait()
        kills += 1
    finish = _run_in_subprocess(kind, tmp_path, killed_out)
    assert finish.wait(timeout=600) == 0, finish.stderr.read().decode()[-2000:]
    assert kills == KILLS, "the run finished before it was killed five times: lengthen it"
    a, b = _final_state(tmp_path / "straight"), _final_state(killed_out)
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) if torch.is_tensor(a[k]) else a[k] == b[k] for k in a)


def _main(kind: str, work: Path, out: Path) -> None:
    """One (resumable) run of `kind` into `out`, sharing the drafter and corpus under `work`."""
    sys.path.insert(0, str(Path(__file__).parent))
    from conftest import make_tiny_target
    from test_corrector_cache import write_corpus
    from test_head_train import SHARED, two_mode_corpus

    from dcoco.train.drafter_train import DrafterTrainConfig
    from dcoco.train.drafter_train import train as train_drafter
    from dcoco.train.head_train import HeadTrainConfig
    from dcoco.train.head_train import train as train_head

    torch.set_num_threads(1)
    target = make_tiny_target("llama")
    samples = two_mode_corpus(48)
    settings = {**SHARED, "save_every": 7, "eval_every": 1000}
    if kind == "drafter":
        config = DrafterTrainConfig(out=str(out), max_steps=600, **settings)
        train_drafter(config, target=target, samples=samples, progress_bar=False)
        return
    base = work / "base"
    if not (base / "drafter" / "provenance.json").is_file():  # the drafter the heads drop into
        train_drafter(DrafterTrainConfig(out=str(base), max_steps=10, **settings),
                      target=target, samples=samples, progress_bar=False)  # fmt: skip
    head = dict(init=str(base / "drafter"), mode="dropin", top_k=4, mlp_hidden=16)
    if kind == "dropin":
        config = HeadTrainConfig(out=str(out), max_steps=700, **head, **settings)
        train_head(config, target=target, samples=samples, progress_bar=False)
        return
    corpus = work / "corpus"
    if not corpus.is_dir():
        write_corpus(samples, corpus, parts=6)
    cached = dict(corpus=str(corpus), corrector_cache=True, cache_stride=1, blocks_per_step=64,
                  features="normalised", anchor=True, loss="conditional", count_pairs=True,
                  cache_parts=3)  # fmt: skip
    config = HeadTrainConfig(out=str(out), max_steps=2000, **head, **cached, **settings)
    train_head(config, target=target, progress_bar=False)
    (out / "done.json").write_text(json.dumps({"kind": kind}))


if __name__ == "__main__":  # python tests/test_training_kills.py KIND WORK OUT
    _main(sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]))
