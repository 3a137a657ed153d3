"""A fixed set of grammars for tests and benchmarks: JSON schemas (nested objects, arrays,
enums, bounded numbers, patterns, $ref, anyOf), regexes (the SGLang paper's among them) and EBNF.

Each case carries strings the grammar must accept (`valid`) and reject (`invalid`), written in
the compact JSON the service produces (`any_whitespace=False`: `", "` and `": "` separators,
properties in schema order). `bounded` cases end after a bounded number of tokens whatever is
sampled, so random walks over them terminate; `check` is a Python regex for non-JSON cases
(JSON cases are checked with jsonschema).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from grammar_service.kinds import GrammarKind

PAPER_REGEX = r'\{"summary": "[\w\d\s]+\.", "grade": "[ABCD][+-]?"\}'


@dataclass(frozen=True)
class GrammarCase:
    name: str
    kind: GrammarKind
    text: str
    valid: tuple[str, ...]
    invalid: tuple[str, ...]
    bounded: bool
    check: str = ""  # Python regex equivalent (regex and EBNF cases)

    @property
    def schema(self) -> Any:
        return json.loads(self.text) if self.kind is GrammarKind.JSON_SCHEMA else None


def _js(
    name: str, schema: dict[str, Any], valid: list[Any], invalid: list[str], bounded: bool = True
) -> GrammarCase:
    return GrammarCase(
        name,
        GrammarKind.JSON_SCHEMA,
        json.dumps(schema),
        tuple(json.dumps(v) for v in valid),
        tuple(invalid),
        bounded,
    )


def _rx(name: str, regex: str, valid: list[str], invalid: list[str], bounded: bool) -> GrammarCase:
    return GrammarCase(name, GrammarKind.REGEX, regex, tuple(valid), tuple(invalid), bounded, regex)


def _str(max_len: int) -> dict[str, Any]:
    return {"type": "string", "maxLength": max_len}


def _obj(props: dict[str, Any], required: list[str] | None = None) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": props,
        "required": list(props) if required is None else required,
    }


HOUSES = ["Gryffindor", "Hufflepuff", "Ravenclaw", "Slytherin"]
TOOLS = ["get_weather", "search_web", "send_email"]

SUITE: tuple[GrammarCase, ...] = (
    _js(
        "person",
        _obj({"name": _str(16), "age": {"type": "integer", "minimum": 0, "maximum": 150}}),
        [{"name": "Ada", "age": 36}],
        ['{"name": "Ada", "age": 151}', '{"age": 3}'],
    ),
    _js(
        "nested_address",
        _obj(
            {
                "name": _str(12),
                "address": _obj(
                    {
                        "street": _str(24),
                        "city": {"enum": ["Paris", "Berlin", "Tokyo"]},
                        "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
                    }
                ),
            }
        ),
        [{"name": "Bo", "address": {"street": "1 Rue X", "city": "Paris", "zip": "75001"}}],
        ['{"name": "Bo", "address": {"street": "x", "city": "Rome", "zip": "75001"}}'],
    ),
    _js(
        "int_array",
        {
            "type": "array",
            "items": {"type": "integer", "minimum": -100, "maximum": 100},
            "minItems": 1,
            "maxItems": 5,
        },
        [[1, -2, 100]],
        ["[]", "[1, 2, 3, 4, 5, 6]", "[101]"],
    ),
    _js(
        "status_enum",
        {"type": "string", "enum": ["active", "inactive", "banned"]},
        ["active", "banned"],
        ['"paused"'],
    ),
    _js(
        "bounded_numbers",
        _obj(
            {
                "temperature": {"type": "number", "minimum": -50, "maximum": 60},
                "humidity": {"type": "integer", "minimum": 0, "maximum": 100},
                "pressure": {"type": "number", "exclusiveMinimum": 0, "maximum": 2000},
            }
        ),
        [{"temperature": -3.5, "humidity": 40, "pressure": 1013.2}],
        [
            '{"temperature": 70, "humidity": 40, "pressure": 1}',
            '{"temperature": 1, "humidity": 40, "pressure": 0}',
        ],
    ),
    _js(
        "pattern_fields",
        _obj(
            {
                "phone": {"type": "string", "pattern": "^\\+?[0-9]{7,12}$"},
                "code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"},
            }
        ),
        [{"phone": "+33123456789", "code": "ABC-12"}],
        ['{"phone": "12", "code": "ABC-12"}', '{"phone": "1234567", "code": "abc-12"}'],
    ),
    _js(
        "optional_fields",
        _obj(
            {
                "id": {"type": "integer", "minimum": 1, "maximum": 9999},
                "nick": _str(10),
                "admin": {"type": "boolean"},
            },
            ["id"],
        ),
        [{"id": 7}, {"id": 7, "admin": True}, {"id": 7, "nick": "x", "admin": False}],
        ['{"nick": "x"}', '{"id": 0}'],
    ),
    _js(
        "bool_null",
        _obj({"flag": {"type": "boolean"}, "nothing": {"type": "null"}}),
        [{"flag": True, "nothing": None}],
        ['{"flag": 1, "nothing": null}'],
    ),
    _js(
        "deep_nesting",
        _obj(
            {
                "a": _obj(
                    {"b": _obj({"c": _obj({"d": {"type": "integer", "minimum": 0, "maximum": 9}})})}
                )
            }
        ),
        [{"a": {"b": {"c": {"d": 3}}}}],
        ['{"a": {"b": {"c": {}}}}'],
    ),
    _js(
        "object_array",
        {
            "type": "array",
            "maxItems": 3,
            "items": _obj(
                {
                    "id": {"type": "integer", "minimum": 0, "maximum": 999},
                    "tag": {"enum": ["red", "green", "blue"]},
                }
            ),
        },
        [[], [{"id": 1, "tag": "red"}, {"id": 2, "tag": "blue"}]],
        ['[{"id": 1, "tag": "pink"}]'],
    ),
    _js(
        "any_of",
        {"anyOf": [_str(8), {"type": "integer", "minimum": 0, "maximum": 10**6}]},
        ["hello", 42],
        ['"much too long"', "true"],
    ),
    _js(
        "const_version",
        _obj({"version": {"const": "1.0"}, "ok": {"type": "boolean"}}),
        [{"version": "1.0", "ok": True}],
        ['{"version": "2.0", "ok": true}'],
    ),
    _js(
        "tool_call",
        _obj(
            {
                "name": {"enum": TOOLS},
                "arguments": _obj(
                    {"query": _str(32), "limit": {"type": "integer", "minimum": 1, "maximum": 50}},
                    ["query"],
                ),
            }
        ),
        [{"name": "search_web", "arguments": {"query": "sglang", "limit": 5}}],
        ['{"name": "rm_rf", "arguments": {"query": "x"}}'],
    ),
    _js(
        "character",
        _obj(
            {
                "name": _str(20),
                "house": {"enum": HOUSES},
                "blood_status": {"enum": ["Pure-blood", "Half-blood", "Muggle-born"]},
                "wand": _obj(
                    {
                        "wood": _str(12),
                        "core": _str(12),
                        "length": {"type": "number", "minimum": 5, "maximum": 20},
                    }
                ),
                "alive": {"enum": ["Alive", "Deceased"]},
            }
        ),
        [
            {
                "name": "Hermione",
                "house": "Gryffindor",
                "blood_status": "Muggle-born",
                "wand": {"wood": "Vine", "core": "Dragon", "length": 10.75},
                "alive": "Alive",
            }
        ],
        ['{"name": "Tom", "house": "Durmstrang"}'],
    ),
    _js(
        "defs_ref",
        {
            "type": "object",
            "$defs": {
                "point": _obj(
                    {
                        "x": {"type": "integer", "minimum": -9, "maximum": 9},
                        "y": {"type": "integer", "minimum": -9, "maximum": 9},
                    }
                )
            },
            "properties": {"from": {"$ref": "#/$defs/point"}, "to": {"$ref": "#/$defs/point"}},
            "required": ["from", "to"],
        },
        [{"from": {"x": 1, "y": -2}, "to": {"x": 0, "y": 9}}],
        ['{"from": {"x": 1}}'],
    ),
    _js(
        "free_text",
        _obj({"title": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}}}),
        [{"title": 'anything "quoted"', "tags": ["a", "b"]}],
        ['{"title": 3, "tags": []}'],
        bounded=False,
    ),
    _rx(
        "paper_summary_grade",
        PAPER_REGEX,
        [
            '{"summary": "Good work overall.", "grade": "A+"}',
            '{"summary": "ok 2 go.", "grade": "C"}',
        ],
        ['{"summary": "no period", "grade": "A"}', '{"summary": "x.", "grade": "E"}'],
        bounded=False,
    ),
    _rx(
        "ipv4",
        r"((25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)\.){3}(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)",
        ["192.168.0.1", "8.8.8.8"],
        ["256.1.1.1", "1.2.3"],
        bounded=True,
    ),
    _rx(
        "iso_date",
        r"\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])",
        ["2024-02-29"],
        ["2024-13-01", "24-01-01"],
        bounded=True,
    ),
    _rx("choice", r"(yes|no|maybe)", ["yes", "maybe"], ["perhaps"], bounded=True),
    _rx(
        "email",
        r"[a-z]{1,10}@[a-z]{1,10}\.(com|org|net)",
        ["ada@lovelace.org"],
        ["Ada@x.com", "a@b.io"],
        bounded=True,
    ),
    _rx("us_phone", r"\(\d{3}\) \d{3}-\d{4}", ["(555) 123-4567"], ["555-123-4567"], bounded=True),
    GrammarCase(
        "ebnf_digits",
        GrammarKind.EBNF,
        'root ::= "(" [0-9] ("," [0-9]){0,3} ")"',
        ("(1)", "(1,2,3,4)"),
        ("()", "(1,2,3,4,5)"),
        True,
        r"\([0-9](,[0-9]){0,3}\)",
    ),
    GrammarCase(
        "ebnf_answer",
        GrammarKind.EBNF,
        'root ::= "Answer: " answer "."\nanswer ::= "yes" | "no" | "unsure"',
        ("Answer: yes.", "Answer: unsure."),
        ("Answer: maybe.",),
        True,
        r"Answer: (yes|no|unsure)\.",
    ),
)

BY_NAME: dict[str, GrammarCase] = {c.name: c for c in SUITE}
