"""Bad command-line input gets one clear line on stderr and exit code 2, no traceback."""

from __future__ import annotations

import pytest

from dcoco.cli import main


@pytest.mark.parametrize(
    "argv, message",
    [
        (["generate", "hi", "--target", "no-such-model"], "unknown target 'no-such-model'"),
        (["generate", "hi", "--temperature", "-1"], "temperature must be >= 0"),
        (["generate", "hi", "--top-p", "0"], "top-p must be in (0, 1]"),
        (["generate", "hi", "--top-p", "1.2"], "top-p must be in (0, 1]"),
        (["generate", "hi", "--max-new-tokens", "0"], "max-new-tokens must be > 0"),
        (["generate", "hi", "--dtype", "int3"], "unknown dtype 'int3'"),
        (["generate", "hi", "--method", "magic"], "unknown method 'magic'"),
    ],
)
def test_bad_input_is_one_line_without_traceback(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("dcoco: error: ") and message in err
    assert "Traceback" not in err and err.count("\n") == 1
