"""Length-bounded JSON strings compiled as patterns (grammar_service/schema_rewrite.py): the
rewrite itself, and that the compiled grammar accepts the same strict-JSON documents."""

from __future__ import annotations

import json
from typing import Any

import pytest
import xgrammar as xgr

from grammar_service.schema_rewrite import MAX_REWRITE_LENGTH, rewrite_schema_text


def _obj(props: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": list(props)}


def test_bounded_strings_become_patterns_and_data_is_not_walked() -> None:
    schema = _obj(
        {
            "a": {"type": "string", "maxLength": 4},
            "b": {"type": "string", "minLength": 1, "maxLength": 3},
            "c": {"type": "array", "items": {"type": "string", "maxLength": 2}, "maxItems": 2},
            "d": {"type": "string", "maxLength": 4, "pattern": "^x+$"},  # has its own pattern
            "e": {"type": "string", "maxLength": MAX_REWRITE_LENGTH + 1},  # too long
            "f": {"type": "string"},  # unbounded
            "g": {"enum": [{"type": "string", "maxLength": 2}]},  # data, not a schema
        }
    )
    out = json.loads(rewrite_schema_text(json.dumps(schema)))["properties"]
    chars = '[^"\\\\\\x00-\\x1f]'
    assert out["a"] == {"type": "string", "pattern": f"^{chars}{{0,4}}$"}
    assert out["b"] == {"type": "string", "pattern": f"^{chars}{{1,3}}$"}
    assert out["c"]["items"] == {"type": "string", "pattern": f"^{chars}{{0,2}}$"}
    for key in "defg":
        assert out[key] == schema["properties"][key]


def test_nothing_to_rewrite_returns_the_same_text() -> None:
    for text in ('{"type": "string"}', "not json", "[1, 2]", '{"type": "integer"}'):
        assert rewrite_schema_text(text) is text


@pytest.fixture(scope="module")
def tokenizer_info() -> xgr.TokenizerInfo:
    from grammar_service.tokenizer_source import load_tokenizer
    from model_service.random_configs import random_config

    return xgr.TokenizerInfo.from_huggingface(load_tokenizer(random_config("tiny-llama")[1]))


def test_same_strict_documents_accepted(tokenizer_info: xgr.TokenizerInfo) -> None:
    schema = json.dumps(
        _obj({"s": {"type": "string", "minLength": 2, "maxLength": 5}, "n": {"type": "integer"}})
    )
    compiler = xgr.GrammarCompiler(tokenizer_info, max_threads=1, cache_enabled=False)
    old = compiler.compile_json_schema(schema, any_whitespace=False)
    new = compiler.compile_json_schema(rewrite_schema_text(schema), any_whitespace=False)

    def accepts(grammar: xgr.CompiledGrammar, doc: str) -> bool:
        m = xgr.GrammarMatcher(grammar)
        return bool(m.accept_string(doc) and m.is_completed())

    for body in ("ab", "abcde", "héllo", "a b", "x/y"):
        doc = json.dumps({"s": body, "n": 1}, ensure_ascii=False)
        assert accepts(old, doc) and accepts(new, doc), doc
    for body in ("a", "abcdef", 'a"b', "a\\nb"):  # too short, too long, escapes
        doc = '{"s": "' + body + '", "n": 1}'
        assert not accepts(old, doc) and not accepts(new, doc), doc
    tab = '{"s": "a\tb", "n": 1}'  # a raw tab: not strict JSON
    assert accepts(old, tab) and not accepts(new, tab)
