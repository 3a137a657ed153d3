"""Typed service configuration from dataclasses: every field becomes a CLI flag and can be set
through the environment as RADIXMESH_<FIELD> (CLI wins). Each service keeps its own dataclass in
its own `config.py`; this module only turns dataclasses into parsers."""

from __future__ import annotations

import argparse
import dataclasses
import os
import types
import typing
from typing import Any, TypeVar

T = TypeVar("T")

ENV_PREFIX = "RADIXMESH_"


def _base_type(tp: Any) -> Any:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return args[0]
    return tp


def _parse_bool(text: str) -> bool:
    low = text.strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected a boolean, got {text!r}")


def add_config_args(parser: argparse.ArgumentParser, cls: type) -> None:
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = _base_type(hints[f.name])
        flag = "--" + f.name.replace("_", "-")
        help_text = f.metadata.get("help", "")
        env = ENV_PREFIX + f.name.upper()
        default = os.environ.get(env)
        kwargs: dict[str, Any] = {
            "dest": f.name,
            "default": None,
            "help": f"{help_text} (env {env})".strip(),
        }
        if f.metadata.get("choices"):
            kwargs["choices"] = f.metadata["choices"]
        if tp is bool:
            kwargs["type"] = _parse_bool
            kwargs["nargs"] = "?"
            kwargs["const"] = True
        elif tp in (int, float, str):
            kwargs["type"] = tp
        else:
            continue
        parser.add_argument(flag, **kwargs)
        if default is not None:
            parser.set_defaults(**{f.name: kwargs["type"](default)})


def config_from_args(cls: type[T], ns: argparse.Namespace, **overrides: Any) -> T:
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        v = getattr(ns, f.name, None)
        if v is not None:
            values[f.name] = v
    values.update({k: v for k, v in overrides.items() if v is not None})
    cfg = cls(**values)
    validate = getattr(cfg, "validate", None)
    if callable(validate):
        validate()
    return cfg


def parse_config(cls: type[T], argv: list[str] | None = None, description: str = "") -> T:
    parser = argparse.ArgumentParser(description=description or cls.__doc__)
    add_config_args(parser, cls)
    return config_from_args(cls, parser.parse_args(argv))


def field(default: Any, help: str = "", choices: list[str] | None = None) -> Any:  # noqa: A002
    meta: dict[str, Any] = {"help": help}
    if choices:
        meta["choices"] = choices
    return dataclasses.field(default=default, metadata=meta)
