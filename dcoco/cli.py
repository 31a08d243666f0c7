"""The `dcoco` command line: one subcommand per job, each a thin call into the library.

Every subcommand is a `dcoco.config.Command` named `COMMAND` in its module; `COMMANDS` below lists
those modules, one line each, and the parser is built from them (flags from the config dataclass).
"""

from __future__ import annotations

import argparse
import importlib
import sys

from dcoco.config import Command
from dcoco.errors import DcocoError

# Imported when the parser is built, so `import dcoco.cli` stays light.
COMMANDS = (
    "dcoco.eval.profile",
    "dcoco.generate",
    "dcoco.eval.compare",
    "dcoco.eval.bench",
    "dcoco.eval.report",
    "dcoco.eval.coverage",
    "dcoco.eval.heldout",
    "dcoco.train.drafter_train",
    "dcoco.train.head_train",
    "dcoco.train.corrector_cache",
    "dcoco.data.draft_vocab_build",
    "dcoco.train.recipe",
    "dcoco.data.datagen",
    "dcoco.serving.serve",
    "dcoco.serving.export",
    "dcoco.eval.served.bench",
    "dcoco.eval.served.soak",
    "dcoco.eval.train_curves",
)


def commands() -> list[Command]:
    return [importlib.import_module(name).COMMAND for name in COMMANDS]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dcoco", description="Speculative decoding with corrected parallel drafts."
    )
    subparsers = parser.add_subparsers(dest="command", required=True)
    for command in commands():
        command.add_to(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.command_run(args)
    except DcocoError as error:
        print(f"dcoco: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("dcoco: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
