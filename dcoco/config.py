"""Config dataclasses <-> CLI flags: every field of a config dataclass is exactly one flag.

Field `max_new_tokens` becomes `--max-new-tokens`; the field's comment-free default and type drive
the parser. Booleans become `--flag / --no-flag`. Tuples of ints are comma-separated (`1,14,27`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import typing
from typing import Any, TypeVar

T = TypeVar("T")


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _int_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x.strip())


def add_config_args(
    parser: argparse.ArgumentParser, cls: type, helps: dict[str, str] | None = None
):
    """Add one flag per field of dataclass `cls` to `parser`."""
    hints = typing.get_type_hints(cls)
    helps = helps or {}
    for field in dataclasses.fields(cls):
        kind = hints[field.name]
        default = (
            field.default if field.default is not dataclasses.MISSING else field.default_factory()  # type: ignore[misc]
        )
        text = helps.get(field.name, "") + f" (default: {default})"
        if kind is bool:
            parser.add_argument(
                _flag(field.name),
                dest=field.name,
                default=default,
                action=argparse.BooleanOptionalAction,
                help=text,
            )
            continue
        origin = typing.get_origin(kind)
        if origin is tuple:
            convert: Any = _int_tuple
        elif origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
            args = [a for a in typing.get_args(kind) if a is not type(None)]
            convert = args[0]
        else:
            convert = kind
        parser.add_argument(
            _flag(field.name), dest=field.name, type=convert, default=default, help=text
        )


def config_from_args(cls: type[T], args: argparse.Namespace) -> T:
    """Build `cls` from the parsed flags that `add_config_args` added."""
    return config_from_dict(cls, vars(args))


def config_from_dict(cls: type[T], values: dict) -> T:
    """Build `cls` from `values` (parsed flags, a stored config); extra keys are ignored."""
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    return cls(**{k: v for k, v in values.items() if k in names})


def config_to_json(config: Any) -> str:
    return json.dumps(dataclasses.asdict(config), indent=2, sort_keys=True)
