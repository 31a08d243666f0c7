"""The command line: bad input gets one clear line on stderr and exit code 2, no traceback; every
subcommand comes from the registry, with typed list flags and a help line for every flag."""

from __future__ import annotations

import argparse

import pytest

from dcoco.cli import COMMANDS, build_parser, commands, main


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


def _command_parsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(subparsers.choices)


def test_the_registry_lists_every_subcommand_once():
    names = [command.name for command in commands()]
    assert len(names) == len(set(names)) == len(COMMANDS)
    assert set(_command_parsers()) == set(names)


@pytest.mark.parametrize("name", [command.name for command in commands()])
def test_every_flag_of_every_command_has_a_help_line(name, capsys):
    with pytest.raises(SystemExit) as done:
        main([name, "--help"])
    assert done.value.code == 0
    shown = capsys.readouterr().out
    arguments = [a for a in _command_parsers()[name]._actions if a.help != argparse.SUPPRESS]
    arguments = [a for a in arguments if not isinstance(a, argparse._HelpAction)]
    assert arguments
    for action in arguments:
        what = f"dcoco {name} {'/'.join(action.option_strings) or action.dest}"
        # a bare "(default: ...)" is no help line: the field needs a comment or a `helps` entry
        assert action.help and not action.help.startswith("(default"), f"{what}: no help line"
        assert all(flag in shown for flag in action.option_strings), f"{what}: not in --help"


def test_list_flags_are_typed_and_bench_has_no_single_temperature(capsys):
    parsers = _command_parsers()
    args = parsers["bench"].parse_args(["--temperatures", "0,1", "--methods", "plain,dcoco"])
    assert args.temperatures == (0.0, 1.0) and args.methods == ("plain", "dcoco")
    serve_args = parsers["bench-serve"].parse_args(["--concurrency", "1,4"])
    assert serve_args.concurrency == (1, 4)
    with pytest.raises(SystemExit):
        parsers["bench-serve"].parse_args(["--concurrency", "1,x"])
    assert "expected comma-separated int values, got '1,x'" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # bench sweeps --temperatures; it has no flag to refuse
        parsers["bench"].parse_args(["--temperature", "1"])
    assert "unrecognized arguments: --temperature" in capsys.readouterr().err
