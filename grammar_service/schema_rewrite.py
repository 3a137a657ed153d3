"""JSON-schema rewrites that keep the language and make xgrammar's masks cheap.

Length-bounded strings. xgrammar 0.2.8 turns `{"type": "string", "maxLength": n}` into a
repetition `char{min, n}` of a one-character rule. Inside such a string every token mask is
computed at run time, token by token: 1-13 ms per row with the Llama-3.1 vocabulary (measured
at 5-20 characters into a maxLength-24 string), and these rows set the wall time of a whole
batch-64 fill (xgrammar's batch fill cannot split one row over threads). The same length bound
written as a `pattern` becomes a finite automaton whose masks xgrammar precomputes: ~0.06 ms
per row in the same states.

`^[^"\\\\\\x00-\\x1f]{min,max}$` is xgrammar's own character set for these strings (no quote,
no backslash, i.e. no escapes) minus the raw control characters that strict JSON forbids and
xgrammar's rule lets through (`radixmesh_bench/gpu/constrained_schemas.py` counts such outputs as
only "lenient"). So the rewritten grammar allows exactly the old strings that are strict JSON, and
the masks differ only in tokens holding raw control bytes (tab, U+0000-U+001F).

Only plain length-bounded strings are rewritten: a string that already has a `pattern`,
`format`, `enum` or `const` is left alone, as is any bound above `MAX_REWRITE_LENGTH` (the
automaton has one state per character). Values that are data, not schemas (`enum`, `const`,
`default`, `examples`), are never walked into.
"""

from __future__ import annotations

import json
from typing import Any

MAX_REWRITE_LENGTH = 256
_CHARS = '[^"\\\\\\x00-\\x1f]'  # regex: not a quote, a backslash or a control character
_DATA_KEYS = frozenset({"enum", "const", "default", "examples"})
_KEEP_KEYS = frozenset({"pattern", "format", "enum", "const"})


def rewrite_schema_text(text: str) -> str:
    """The schema with its plain length-bounded strings as patterns; `text` unchanged (the
    same object) when nothing applies or it is not a JSON object."""
    try:
        schema = json.loads(text)
    except ValueError:
        return text  # the compile path reports the error with the original text
    if not isinstance(schema, dict) or not _rewrite(schema):
        return text
    return json.dumps(schema)


def _rewrite(node: Any) -> bool:
    """Rewrite in place; True if anything changed."""
    changed = False
    if isinstance(node, list):
        for item in node:
            changed |= _rewrite(item)
        return changed
    if not isinstance(node, dict):
        return False
    if _is_bounded_string(node):
        lo = int(node.pop("minLength", 0))
        hi = int(node.pop("maxLength"))
        node["pattern"] = f"^{_CHARS}{{{lo},{hi}}}$"
        changed = True
    for key, value in node.items():
        if key not in _DATA_KEYS:
            changed |= _rewrite(value)
    return changed


def _is_bounded_string(node: dict[str, Any]) -> bool:
    hi, lo = node.get("maxLength"), node.get("minLength", 0)
    return (
        node.get("type") == "string"
        and isinstance(hi, int)
        and isinstance(lo, int)
        and not isinstance(hi, bool)
        and 0 <= lo <= hi <= MAX_REWRITE_LENGTH
        and not (_KEEP_KEYS & node.keys())
    )
