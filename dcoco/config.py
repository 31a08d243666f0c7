"""Config dataclasses <-> CLI flags: every field of a config dataclass is exactly one flag.

Field `max_new_tokens` becomes `--max-new-tokens`; the field's default and type drive the parser,
and its trailing comment is the flag's help line (a command's `helps` may override it). Booleans
become `--flag / --no-flag`. Tuples are typed lists, comma-separated on the command line
(`--taps 1,14,27`, `--temperatures 0,1`, `--methods plain,dcoco`).

A subcommand is a `Command`: its name, its config dataclass and `run(config) -> exit code`;
dcoco.cli lists them and builds the parser from them. A command with many flags names the ones a
user sets (`main_flags`): `--help` shows those, `--help-all` every flag (ablations and tuning in
a group of their own). A flag renamed keeps its old name as a hidden alias (`renamed`), so
commands written before still run.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import io
import tokenize
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Command:
    """One `dcoco` subcommand: flags from `config`, then `run(config_instance)`."""

    name: str
    help: str
    config: type
    run: Callable[[Any], int]
    description: str = ""
    positional: tuple[str, ...] = ()  # fields taken as positional arguments, in this order
    helps: Mapping[str, str] = field(default_factory=dict)  # help lines beyond field comments
    main_flags: tuple[str, ...] = ()  # the fields `--help` shows (empty: every field)
    renamed: Mapping[str, str] = field(default_factory=dict)  # old flag name -> field, hidden

    def add_to(self, subparsers) -> argparse.ArgumentParser:
        # No abbreviations: `bench --temperature 1` must not silently mean `--temperatures 1`.
        parser = subparsers.add_parser(
            self.name,
            help=self.help,
            description=self.description or self.help,
            allow_abbrev=False,
        )
        self.add_flags(parser, show_all=not self.main_flags)
        if self.main_flags:
            parser.add_argument(
                "--help-all", action=_HelpAll, command=self, help="show every flag and exit"
            )
        parser.set_defaults(command_run=lambda args: self.run(config_from_args(self.config, args)))
        return parser

    def add_flags(self, parser: argparse.ArgumentParser, show_all: bool) -> None:
        main = set(self.main_flags) | set(self.positional) if self.main_flags else None
        add_config_args(parser, self.config, self.helps, self.positional, main, show_all)
        for old, name in self.renamed.items():
            parser.add_argument(_flag(old), dest=name, type=_converter(
                typing.get_type_hints(self.config)[name]), help=argparse.SUPPRESS)  # fmt: skip


class _HelpAll(argparse.Action):
    """`--help-all`: the help with every flag, those beyond `main_flags` in a group of their own."""

    def __init__(self, option_strings, dest, command: Command, help: str):
        super().__init__(option_strings, dest=argparse.SUPPRESS, nargs=0, help=help)
        self.command = command

    def __call__(self, parser, namespace, values, option_string=None):
        full = argparse.ArgumentParser(
            prog=parser.prog, description=parser.description, allow_abbrev=False
        )
        self.command.add_flags(full, show_all=True)
        full.print_help()
        parser.exit()


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _list_of(item: type) -> Callable[[str], tuple]:
    def parse(text: str) -> tuple:
        try:
            return tuple(item(x.strip()) for x in text.split(",") if x.strip())
        except ValueError as error:
            raise argparse.ArgumentTypeError(
                f"expected comma-separated {item.__name__} values, got '{text}'"
            ) from error

    parse.__name__ = f"list of {item.__name__}"  # argparse names the type in its errors
    return parse


def _converter(kind) -> Callable[[str], Any]:
    """The argparse `type` for a field annotation: tuple[X, ...] is a list of X, `X | None` is X."""
    origin = typing.get_origin(kind)
    if origin is tuple:
        return _list_of(typing.get_args(kind)[0])
    if origin in (typing.Union, types.UnionType):
        return next(a for a in typing.get_args(kind) if a is not type(None))
    return kind


def _shown(value) -> str:
    return ",".join(str(v) for v in value) if isinstance(value, tuple) else repr(value)


def field_comments(cls: type) -> dict[str, str]:
    """Field name -> its trailing `# comment` in the class body, for `cls` and its bases."""
    comments: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        source = inspect.getsource(klass)
        lines: dict[int, list] = {}
        for token in tokenize.generate_tokens(io.StringIO(source).readline):
            lines.setdefault(token.start[0], []).append(token)
        for tokens in lines.values():
            kinds = [t for t in tokens if t.type not in (tokenize.INDENT, tokenize.DEDENT)]
            if (
                len(kinds) > 2
                and kinds[0].type == tokenize.NAME
                and kinds[1].string == ":"
                and kinds[-2].type == tokenize.COMMENT
            ):
                comments[kinds[0].string] = kinds[-2].string.lstrip("#").strip()
    return comments


def add_config_args(
    parser: argparse.ArgumentParser,
    cls: type,
    helps: Mapping[str, str] | None = None,
    positional: tuple[str, ...] = (),
    main: set[str] | None = None,
    show_all: bool = True,
) -> None:
    """Add one flag per field of dataclass `cls` to `parser` (positional ones as arguments).
    With `main`, the other fields go in an "advanced" group, shown only with `show_all`."""
    hints = typing.get_type_hints(cls)
    texts = {**field_comments(cls), **(helps or {})}
    advanced = None
    if main is not None and show_all:
        advanced = parser.add_argument_group("advanced flags (ablations, tuning)")
    for item in dataclasses.fields(cls):
        target = parser
        if main is not None and item.name not in main:
            target = advanced if show_all else _Hidden(parser)
        kind = hints[item.name]
        default = (
            item.default if item.default is not dataclasses.MISSING else item.default_factory()  # type: ignore[misc]
        )
        text = texts.get(item.name, "").replace("%", "%%")  # argparse formats help with %
        if item.name in positional:
            parser.add_argument(item.name, type=_converter(kind), help=text)
            continue
        text = f"{text} (default: {_shown(default)})".strip()
        if kind is bool:
            target.add_argument(
                _flag(item.name),
                dest=item.name,
                default=default,
                action=argparse.BooleanOptionalAction,
                help=text,
            )
            continue
        target.add_argument(
            _flag(item.name), dest=item.name, type=_converter(kind), default=default, help=text
        )


class _Hidden:
    """A parser's add_argument with the help suppressed: the flag works, --help leaves it out."""

    def __init__(self, parser: argparse.ArgumentParser):
        self.parser = parser

    def add_argument(self, *args, **kwargs):
        return self.parser.add_argument(*args, **{**kwargs, "help": argparse.SUPPRESS})


def config_from_args(cls: type[T], args: argparse.Namespace) -> T:
    """Build `cls` from the parsed flags that `add_config_args` added."""
    return config_from_dict(cls, vars(args))


def config_from_dict(cls: type[T], values: dict) -> T:
    """Build `cls` from `values` (parsed flags, a stored config); extra keys are ignored. Stored
    lists become tuples, and a list stored as one comma-separated string (older runs) is split."""
    hints = typing.get_type_hints(cls)
    kept = {}
    for item in dataclasses.fields(cls):  # type: ignore[arg-type]
        if item.name not in values:
            continue
        value = values[item.name]
        if typing.get_origin(hints[item.name]) is tuple:
            value = _converter(hints[item.name])(value) if isinstance(value, str) else tuple(value)
        kept[item.name] = value
    return cls(**kept)
