"""The JSON schemas of the GPU constrained-decoding part, and how its outputs are checked.

Random weights write arbitrary text, so every schema here ends after a bounded number of tokens
whatever is sampled: strings have a `maxLength` or a pattern with bounded repetition, numbers
are integers with bounds, enums and booleans close themselves, arrays have `maxItems`. Keys are
long and fixed (`"shipping_destination_country": "`), so jump-forward has something to jump.
With the Llama-3.1 tokenizer and random logits a compact output is 75-100 tokens.

Checking: the GPU machine may lack `jsonschema`, so `validate_subset` covers exactly the
keywords used here (a unit test holds it to jsonschema's verdicts). `check_output` is strict
JSON first; xgrammar's JSON string rule (0.2.8) admits raw control characters (a tab, U+000E)
that strict JSON forbids, so an output that parses only with `strict=False` is counted apart
("lenient"), not as invalid.
"""

from __future__ import annotations

import json
import re
from typing import Any

_INT = "integer"


def _obj(props: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": list(props)}


SCHEMAS: dict[str, dict[str, Any]] = {
    "order_record": _obj(
        {
            "customer_account_identifier": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{6}$"},
            "shipping_destination_country": {
                "enum": ["Germany", "France", "Japan", "Brazil", "Canada"]
            },
            "order_priority_level": {"type": _INT, "minimum": 1, "maximum": 5},
            "express_delivery_requested": {"type": "boolean"},
            "customer_feedback_summary": {"type": "string", "maxLength": 24},
        }
    ),
    "sensor_reading": _obj(
        {
            "device_serial_number": {"type": "string", "pattern": "^[A-F0-9]{8}$"},
            "measurement_unit_of_temperature": {"enum": ["celsius", "fahrenheit", "kelvin"]},
            "temperature_reading_value": {"type": _INT, "minimum": -40, "maximum": 125},
            "battery_level_percentage": {"type": _INT, "minimum": 0, "maximum": 100},
            "maintenance_required_flag": {"type": "boolean"},
        }
    ),
    "tool_invocation": _obj(
        {
            "function_name_to_invoke": {
                "enum": ["search_the_web", "get_current_weather", "send_email_message"]
            },
            "arguments_for_the_function": _obj(
                {
                    "search_query_text": {"type": "string", "maxLength": 20},
                    "maximum_number_of_results": {"type": _INT, "minimum": 1, "maximum": 50},
                }
            ),
            "request_confidence_grade": {"type": "string", "pattern": "^[ABCD][+-]?$"},
        }
    ),
    "employee_profile": _obj(
        {
            "employee_full_name": {
                "type": "string",
                "pattern": "^[A-Z][a-z]{1,9} [A-Z][a-z]{1,11}$",
            },
            "department_assignment": {
                "enum": ["engineering", "marketing", "finance", "operations"]
            },
            "years_of_service_at_company": {"type": _INT, "minimum": 0, "maximum": 60},
            "primary_skill_tags": {
                "type": "array",
                "items": {"enum": ["python", "rust", "sql", "design", "sales"]},
                "minItems": 1,
                "maxItems": 3,
            },
            "is_remote_employee": {"type": "boolean"},
        }
    ),
}
SCHEMA_TEXT: dict[str, str] = {name: json.dumps(s) for name, s in SCHEMAS.items()}

_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,),
    "array": (list,),
    "string": (str,),
    "boolean": (bool,),
    "integer": (int,),
    "number": (int, float),
}


def validate_subset(value: Any, schema: dict[str, Any], path: str = "$") -> list[str]:
    """Errors of `value` against `schema`, for the keywords SCHEMAS uses (type, enum,
    properties, required, minimum, maximum, minLength, maxLength, pattern, items, minItems,
    maxItems). Empty means valid. Unknown keywords are an error, so the subset cannot silently
    pass a schema it does not understand."""
    known = {"type", "enum", "properties", "required", "minimum", "maximum", "minLength"}
    known |= {"maxLength", "pattern", "items", "minItems", "maxItems"}
    if unknown := set(schema) - known:
        return [f"{path}: validator does not support {sorted(unknown)}"]
    t = schema.get("type")
    if t is not None:
        number = t in ("integer", "number")
        if not isinstance(value, _TYPES[t]) or (number and isinstance(value, bool)):
            return [f"{path}: not {t}: {value!r}"]
    errs: list[str] = []
    if "enum" in schema and value not in schema["enum"]:
        errs.append(f"{path}: {value!r} not in enum")
    if isinstance(value, int | float) and not isinstance(value, bool):
        errs += _number_errors(value, schema, path)
    if isinstance(value, str):
        errs += _string_errors(value, schema, path)
    if isinstance(value, list):
        errs += _list_errors(value, schema, path)
    if isinstance(value, dict):
        errs += [f"{path}: missing {k}" for k in schema.get("required", []) if k not in value]
        for k, sub in schema.get("properties", {}).items():
            if k in value:
                errs += validate_subset(value[k], sub, f"{path}.{k}")
    return errs


def _number_errors(value: float, schema: dict[str, Any], path: str) -> list[str]:
    errs = []
    if "minimum" in schema and value < schema["minimum"]:
        errs.append(f"{path}: {value} < minimum {schema['minimum']}")
    if "maximum" in schema and value > schema["maximum"]:
        errs.append(f"{path}: {value} > maximum {schema['maximum']}")
    return errs


def _string_errors(value: str, schema: dict[str, Any], path: str) -> list[str]:
    errs = []
    if len(value) > schema.get("maxLength", len(value)):
        errs.append(f"{path}: longer than {schema['maxLength']}")
    if len(value) < schema.get("minLength", 0):
        errs.append(f"{path}: shorter than {schema['minLength']}")
    if "pattern" in schema and not re.search(schema["pattern"], value):
        errs.append(f"{path}: {value!r} does not match {schema['pattern']}")
    return errs


def _list_errors(value: list[Any], schema: dict[str, Any], path: str) -> list[str]:
    errs = []
    if len(value) > schema.get("maxItems", len(value)):
        errs.append(f"{path}: more than {schema['maxItems']} items")
    if len(value) < schema.get("minItems", 0):
        errs.append(f"{path}: fewer than {schema['minItems']} items")
    for i, item in enumerate(value):
        errs += validate_subset(item, schema.get("items", {}), f"{path}[{i}]")
    return errs


def _validator() -> tuple[str, Any]:
    try:
        import jsonschema
    except ImportError:
        return "subset", None
    from importlib.metadata import version

    return f"jsonschema {version('jsonschema')}", jsonschema


VALIDATOR_NAME, _JSONSCHEMA = _validator()


def check_output(text: str, schema: dict[str, Any]) -> tuple[str, str]:
    """("strict" | "lenient" | "invalid", message) for one finished output."""
    verdict = "strict"
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        try:
            value = json.loads(text, strict=False)  # raw control characters inside strings
        except json.JSONDecodeError as exc:
            return "invalid", f"not JSON: {exc}"
        verdict = "lenient"
    if _JSONSCHEMA is not None:
        try:
            _JSONSCHEMA.validate(value, schema)
        except _JSONSCHEMA.ValidationError as exc:
            return "invalid", exc.message[:200]
    elif errs := validate_subset(value, schema):
        return "invalid", "; ".join(errs)[:200]
    return verdict, ""
