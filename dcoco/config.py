"""Config dataclasses <-> CLI flags: every field of a config dataclass is exactly one flag.

Field `max_new_tokens` becomes `--max-new-tokens`; the field's default and type drive the parser,
and its trailing comment is the flag's help line (a command's `helps` may override it). Booleans
become `--flag / --no-flag`. Tuples are typed lists, comma-separated on the command line
(`--taps 1,14,27`, `--temperatures 0,1`, `--methods plain,dcoco`).

A subcommand is a `Command`: its name, its config dataclass and `run(config) -> exit code`;
dcoco.cli lists them and builds the parser from them.
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

    def add_to(self, subparsers) -> argparse.ArgumentParser:
        # No abbreviations: `bench --temperature 1` must not silently mean `--temperatures 1`.
        parser = subparsers.add_parser(
            self.name,
            help=self.help,
            description=self.description or self.help,
            allow_abbrev=False,
        )
        add_config_args(parser, self.config, self.helps, self.positional)
        parser.set_defaults(command_run=lambda args: self.run(config_from_args(self.config, args)))
        return parser


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
) -> None:
    """Add one flag per field of dataclass `cls` to `parser` (positional ones as arguments)."""
    hints = typing.get_type_hints(cls)
    texts = {**field_comments(cls), **(helps or {})}
    for item in dataclasses.fields(cls):
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
            parser.add_argument(
                _flag(item.name),
                dest=item.name,
                default=default,
                action=argparse.BooleanOptionalAction,
                help=text,
            )
            continue
        parser.add_argument(
            _flag(item.name), dest=item.name, type=_converter(kind), default=default, help=text
        )


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
