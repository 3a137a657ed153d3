"""SGLang's module paths, as programs import them after `sglang` -> `radixmesh` (issue 33).

Written from SGLang's frontend semantics: the regex constants and expression classes live in
`lang.ir`, `separate_reasoning` builds an expression list of the gen and a reasoning node named
after the reasoning variable, `BaseBackend` lives in `lang.backend.base_backend`, and the JSON
example's `build_regex_from_object` turns a pydantic model or schema into a regex whose full
matches are exactly the schema's instances (in the spacing it allows).
"""

from __future__ import annotations

import enum
import json
import re

import pydantic
import pytest
import radixmesh as rm
import xgrammar
from radixmesh.lang import ir
from radixmesh.lang.backend.base_backend import BaseBackend
from radixmesh.srt.constrained.outlines_backend import build_regex_from_object
from xgrammar.testing import _is_grammar_accept_string


def test_regex_constants_live_in_ir_and_drive_gen_dtype() -> None:
    from radixmesh.lang.ir import REGEX_BOOL, REGEX_FLOAT, REGEX_INT, REGEX_STR

    assert rm.REGEX_INT is REGEX_INT and rm.REGEX_FLOAT is REGEX_FLOAT
    for dtype, regex in ((int, REGEX_INT), (float, REGEX_FLOAT), (bool, REGEX_BOOL)):
        gen = rm.gen("x", dtype=dtype)
        assert isinstance(gen, ir.Gen) and gen.params.regex == regex
    string = rm.gen("x", dtype=str)
    assert isinstance(string, ir.Gen) and string.params.regex == REGEX_STR
    assert re.fullmatch(REGEX_FLOAT, "-3.25\n") and not re.fullmatch(REGEX_INT, "3.5")


def test_separate_reasoning_is_an_expression_list_of_the_gen_and_its_reasoning_node() -> None:
    from radixmesh.lang.ir import SglExprList, SglSeparateReasoning

    answer = rm.gen("answer")
    expr = rm.separate_reasoning(answer, model_type="qwen3")
    assert isinstance(expr, SglExprList)
    assert len(expr.expr_list) == 2 and expr.expr_list[0] is answer
    node = expr.expr_list[1]
    assert isinstance(node, SglSeparateReasoning)
    assert (node.model_type, node.name) == ("qwen3", "answer_reasoning_content")
    assert node.process_name_for_reasoning("x") == "x_reasoning_content"
    assert repr(node) == "SeparateReasoning(model_type=qwen3, name=answer_reasoning_content)"
    # `+` of two expressions is an expression list too, flattened in order
    both = rm.gen("a") + "then" + rm.gen("b")
    assert isinstance(both, SglExprList)


def test_the_expression_classes_a_program_names_are_the_dsl_classes() -> None:
    from radixmesh.lang.ir import (
        SglArgument,
        SglConstantText,
        SglExpr,
        SglFunction,
        SglGen,
        SglRoleBegin,
        SglRoleEnd,
        SglSelect,
        SglVariable,
    )

    assert isinstance(rm.gen("a"), SglGen) and isinstance(rm.gen("a"), SglExpr)
    assert isinstance(rm.select("c", ["x", "y"]), SglSelect)
    assert isinstance(rm.user_begin(), SglRoleBegin) and isinstance(rm.user_end(), SglRoleEnd)
    parts = rm.user("hi").__class__  # a Role composite expands into begin, text, end
    assert parts is ir.Role
    leaves = ir.flatten(rm.user("hi"))
    assert [type(x) for x in leaves] == [SglRoleBegin, SglConstantText, SglRoleEnd]
    assert isinstance(leaves[1], ir.Text) and leaves[1].value == "hi"

    @rm.function
    def prog(s: rm.ProgramState, q: str) -> None:
        s += "Q: " + q + rm.gen("a")

    assert isinstance(prog, SglFunction)
    ops = [n.op for n in prog.trace().nodes]
    assert isinstance(ops[1], SglArgument) and ops[1].name == "q"
    assert SglVariable is ir.Variable
    with pytest.raises(AttributeError):
        ir.SglNoSuchThing  # noqa: B018 - the module's lazy lookup still refuses unknown names


def test_base_backend_at_sglangs_module_path() -> None:
    from radixmesh.lang.backend import BaseBackend as FromPackage
    from radixmesh.lang.backend.openai import OpenAI
    from radixmesh.lang.backend.runtime_endpoint import RuntimeEndpoint

    assert BaseBackend is FromPackage is rm.BaseBackend is rm.BackendBase
    assert RuntimeEndpoint is rm.RuntimeEndpoint and OpenAI is rm.OpenAI

    class Echo(BaseBackend):  # a custom backend, as SGLang users subclass it
        def generate(self, prompt, params, *, logprobs=None, on_text=None):  # type: ignore[no-untyped-def]
            return rm.Completion(text=" echo", prompt_tokens=3, completion_tokens=1)

        def model_info(self) -> rm.ModelInfo:
            return rm.ModelInfo()

    @rm.function
    def prog(s: rm.ProgramState) -> None:
        s += "say" + rm.gen("a", max_tokens=4)

    backend = Echo()
    assert prog.run(backend=backend).text() == "say echo"
    assert backend.warm("x").text == " echo"  # BaseBackend's warm goes through generate
    # token_usage counts what programs ran (the one gen), not direct backend calls
    assert (backend.token_usage.prompt_tokens, backend.token_usage.completion_tokens) == (3, 1)


class Weapon(str, enum.Enum):
    sword = "sword"
    staff = "staff"


class Wizard(pydantic.BaseModel):
    name: str
    age: int
    weapon: Weapon
    spells: list[str] = []
    power: float | None = None


VALID = [
    '{"name": "Gandalf", "age": 2019, "weapon": "staff"}',
    '{"name":"Sa\\"ruman","age":-1,"weapon":"sword","spells":["fire", "ice"]}',
    '{"name": "", "age": 0, "weapon": "staff", "spells": [], "power": 1.5e3}',
    '{"name": "x", "age": 7, "weapon": "sword", "power": null}',
]
INVALID = [
    '{"name": "Gandalf", "age": 2019}',  # a required property missing
    '{"name": "G", "age": 07, "weapon": "staff"}',  # a leading zero
    '{"name": "G", "age": 1, "weapon": "bow"}',  # not in the enum
    '{"age": 1, "name": "G", "weapon": "staff"}',  # out of schema order
    '{"name": "G", "age": 1.5, "weapon": "staff"}',  # not an integer
    '{"name": "G", "age": 1, "weapon": "staff", "spells": [1]}',  # wrong item type
    '{"name": "G", "age": 1, "weapon": "staff",}',  # a trailing comma
]


@pytest.mark.parametrize("source", ["model", "dict", "json"])
def test_build_regex_from_object_matches_exactly_the_schemas_instances(source: str) -> None:
    schema = Wizard.model_json_schema()
    obj = {"model": Wizard, "dict": schema, "json": json.dumps(schema)}[source]
    regex = build_regex_from_object(obj)
    grammar = xgrammar.Grammar.from_regex(regex)  # the grammar service compiles it so
    for text in VALID:
        Wizard.model_validate_json(text)  # the cases are what they claim to be
        assert re.fullmatch(regex, text), text
        assert _is_grammar_accept_string(grammar, text), text
    for text in INVALID:
        assert not re.fullmatch(regex, text), text
        assert not _is_grammar_accept_string(grammar, text), text


def test_build_regex_from_object_optional_only_objects_arrays_and_refusals() -> None:
    schema = {
        "type": "object",
        "properties": {"a": {"type": "boolean"}, "b": {"const": "k"}},
    }
    regex = build_regex_from_object(schema)
    for text in ("{}", '{"a": true}', '{"b": "k"}', '{"a": false, "b": "k"}'):
        assert re.fullmatch(regex, text), text
    for text in ('{"b": "k", "a": true}', '{, "b": "k"}', '{"a": true,}'):
        assert not re.fullmatch(regex, text), text
    bounded = build_regex_from_object(
        {"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 2}
    )
    assert [bool(re.fullmatch(bounded, t)) for t in ("[]", "[1]", "[1, 2]", "[1,2,3]")] == [
        False,
        True,
        True,
        False,
    ]
    short = build_regex_from_object({"type": "string", "maxLength": 2})
    assert re.fullmatch(short, '"ab"') and not re.fullmatch(short, '"abc"')
    literal = build_regex_from_object({"enum": ["café", "a.b", 3]})
    assert [bool(re.fullmatch(literal, t)) for t in ('"café"', '"a.b"', '"aXb"', "3")] == [
        True,
        True,
        False,
        True,
    ]
    with pytest.raises(ValueError, match="cannot build a regex"):
        build_regex_from_object({"description": "anything"})
    with pytest.raises(TypeError):
        build_regex_from_object(42)
