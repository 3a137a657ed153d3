"""A JSON schema (or a pydantic model) as a regex: SGLang's `build_regex_from_object`.

SGLang's JSON example builds `gen(regex=build_regex_from_object(Model))`; this is the same
function without outlines (the client installs with grpcio and protobuf only). The regex uses
only what both Python's `re` and the grammar service (xgrammar) read: literals, classes,
groups, `|`, `?`, `*`, `+` and `{m,n}`.

What it covers: objects (properties in schema order, optional ones may be left out; no extra
keys), strings (minLength / maxLength / pattern), integers, numbers, booleans, null, enum,
const, arrays (items, minItems / maxItems), anyOf / oneOf, a one-member allOf, a list of
types, and local `$ref`s (`#/$defs/...`, pydantic's nested models and enums). Anything else
raises ValueError; `gen(json_schema=...)` takes every schema the grammar service does and is
the better choice for new programs.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

#: Between JSON tokens: at most one space (outlines' default, which SGLang uses).
WHITESPACE = r"[ ]?"
_CHAR = r'([^"\\\x00-\x1f]|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4})'
_INTEGER = r"-?(0|[1-9][0-9]*)"
_TYPES = {
    "integer": _INTEGER,
    "number": _INTEGER + r"(\.[0-9]+)?([eE][+-]?[0-9]+)?",
    "boolean": "(true|false)",
    "null": "null",
}
_META = set("\\.^$|?*+()[]{}")


def escape(text: str) -> str:
    """`text` as a regex literal (only metacharacters escaped, as both engines read them)."""
    return "".join("\\" + c if c in _META else c for c in text)


def _literal(value: Any) -> str:
    """A JSON value as a regex literal; non-ASCII text as itself, as a model writes it."""
    return escape(json.dumps(value, ensure_ascii=False))


def build_regex_from_object(obj: Any, whitespace_pattern: str | None = None) -> str:
    """The regex of `obj`: a pydantic model class (anything with `model_json_schema()`), a
    schema dict, or a schema's JSON text."""
    if hasattr(obj, "model_json_schema"):
        schema = obj.model_json_schema()
    elif isinstance(obj, str):
        schema = json.loads(obj)
    elif isinstance(obj, Mapping):
        schema = dict(obj)
    else:
        raise TypeError(f"expected a pydantic model, a schema dict or JSON text, not {obj!r}")
    return _Converter(schema, whitespace_pattern or WHITESPACE).regex(schema)


def build_regex_from_schema(schema: str, whitespace_pattern: str | None = None) -> str:
    """outlines' name: the regex of a schema given as JSON text."""
    return build_regex_from_object(schema, whitespace_pattern)


class _Converter:
    def __init__(self, root: Mapping[str, Any], ws: str) -> None:
        self.root = root
        self.ws = ws

    def regex(self, schema: Mapping[str, Any]) -> str:
        if "$ref" in schema:
            return self.regex(self._resolve(schema["$ref"]))
        if "const" in schema:
            return _literal(schema["const"])
        if "enum" in schema:
            return "(" + "|".join(_literal(v) for v in schema["enum"]) + ")"
        for key in ("anyOf", "oneOf"):
            if key in schema:
                return "(" + "|".join(self.regex(s) for s in schema[key]) + ")"
        if "allOf" in schema:
            if len(schema["allOf"]) != 1:
                raise ValueError("allOf with more than one schema is not supported")
            return self.regex(schema["allOf"][0])
        kind = schema.get("type")
        if kind is None and "properties" in schema:
            kind = "object"
        if isinstance(kind, list):
            return "(" + "|".join(self.regex({**schema, "type": k}) for k in kind) + ")"
        if kind == "object":
            return self._object(schema)
        if kind == "array":
            return self._array(schema)
        if kind == "string":
            return self._string(schema)
        if kind in _TYPES:
            return _TYPES[kind]
        raise ValueError(f"cannot build a regex for the schema {json.dumps(schema)[:200]}")

    def _resolve(self, ref: str) -> Mapping[str, Any]:
        if not ref.startswith("#/"):
            raise ValueError(f"only local $refs are supported, not {ref!r}")
        node: Any = self.root
        for part in ref[2:].split("/"):
            node = node[part.replace("~1", "/").replace("~0", "~")]
        return node  # type: ignore[no-any-return]

    def _string(self, schema: Mapping[str, Any]) -> str:
        if "pattern" in schema:
            pattern = str(schema["pattern"])
            pattern = pattern[1:] if pattern.startswith("^") else pattern
            pattern = pattern[:-1] if pattern.endswith("$") else pattern
            return f'"({pattern})"'
        low, high = schema.get("minLength"), schema.get("maxLength")
        if low is None and high is None:
            return f'"{_CHAR}*"'
        return f'"{_CHAR}{{{low or 0},{"" if high is None else high}}}"'

    def _array(self, schema: Mapping[str, Any]) -> str:
        ws = self.ws
        low, high = int(schema.get("minItems", 0)), schema.get("maxItems")
        if high is not None and int(high) == 0:
            return rf"\[{ws}\]"
        item = self.regex(schema.get("items") or {"type": "string"})
        more, extra_low = f"({ws},{ws}{item})", max(low - 1, 0)
        if high is not None:
            rest = f"{more}{{{extra_low},{int(high) - 1}}}"
        else:
            rest = more + ("*" if extra_low == 0 else f"{{{extra_low},}}")
        body = item + rest if low > 0 else f"({item}{rest})?"
        return rf"\[{ws}{body}{ws}\]"

    def _object(self, schema: Mapping[str, Any]) -> str:
        ws = self.ws
        required = set(schema.get("required", ()))
        props = [
            (f'{ws}"{escape(name)}"{ws}:{ws}{self.regex(sub)}', name in required)
            for name, sub in (schema.get("properties") or {}).items()
        ]
        return r"\{" + _members(props, ws) + ws + r"\}"


def _members(props: list[tuple[str, bool]], ws: str) -> str:
    """Properties in order, commas only between those present; optional ones may be left out."""
    if not props:
        return ""
    comma = f"{ws},"
    first = next((i for i, (_, req) in enumerate(props) if req), None)
    if first is not None:
        out = "".join(f"({p}{comma})?" for p, _ in props[:first]) + props[first][0]
        for p, req in props[first + 1 :]:
            out += f"{comma}{p}" if req else f"({comma}{p})?"
        return out
    # All optional: choose the first one present; each later one may follow it.
    options = []
    for i, (p, _) in enumerate(props):
        options.append(p + "".join(f"({comma}{q})?" for q, _ in props[i + 1 :]))
    return "(" + "|".join(options) + ")?"
