"""`dcoco serve`'s supervision of vLLM's server (dcoco.serving.supervise.supervise): a server that
stops on its own (vLLM-CPU exits 0 when its engine process dies) is an error with one clear
line; SIGTERM is passed on (vLLM then drains) and is a clean stop."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from dcoco.errors import DcocoError
from dcoco.paths import REPO_ROOT
from dcoco.serving.supervise import supervise

# A stand-in server: writes `ready`, then on SIGTERM writes `drained` and exits 0.
CHILD = """
import pathlib, signal, sys, time
here = pathlib.Path(sys.argv[1])
signal.signal(signal.SIGTERM, lambda *_: (here.joinpath("drained").write_text("1"), sys.exit(0)))
here.joinpath("ready").write_text("1")
time.sleep(60)
"""


def test_a_server_that_stops_on_its_own_is_an_error():
    with pytest.raises(DcocoError, match="stopped on its own \\(exit 0\\).*engine process died"):
        supervise([sys.executable, "-c", "pass"], dict(os.environ))


def test_sigterm_is_passed_on_and_is_a_clean_stop(tmp_path):
    child = [sys.executable, "-c", CHILD, str(tmp_path)]
    call = f"sys.exit(supervise({child!r}, {{}}))"
    runner = "import sys; from dcoco.serving.supervise import supervise; " + call
    parent = subprocess.Popen([sys.executable, "-c", runner], cwd=REPO_ROOT)
    deadline = time.monotonic() + 30
    while not (tmp_path / "ready").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    parent.send_signal(signal.SIGTERM)  # to dcoco serve's own pid, as a service manager does
    assert parent.wait(timeout=30) == 0
    assert (tmp_path / "drained").read_text() == "1"
