"""Part `constrained` of the GPU bench, without a GPU or a stack: its schemas end and validate
under the real Llama-3.1 tokenizer (random-logit walks through xgrammar, as random weights
would sample), its subset validator agrees with jsonschema, and its figures, goals and tables
come out of known runs."""

from __future__ import annotations

import copy
import json
from typing import Any

import jsonschema
import pytest
import torch
import xgrammar as xgr

from radixmesh_bench.gpu.constrained_report import (
    Outcome,
    finish_doc,
    goal_met,
    render_tables,
    summarize,
    validity,
)
from radixmesh_bench.gpu.constrained_schemas import (
    SCHEMA_TEXT,
    SCHEMAS,
    check_output,
    validate_subset,
)
from radixmesh_bench.gpu.merge_rows import fmt, md_table

VALID: dict[str, Any] = {
    "order_record": {
        "customer_account_identifier": "ABC-123456",
        "shipping_destination_country": "Japan",
        "order_priority_level": 3,
        "express_delivery_requested": False,
        "customer_feedback_summary": "fine",
    },
    "sensor_reading": {
        "device_serial_number": "00FF12AB",
        "measurement_unit_of_temperature": "kelvin",
        "temperature_reading_value": -40,
        "battery_level_percentage": 100,
        "maintenance_required_flag": True,
    },
    "tool_invocation": {
        "function_name_to_invoke": "search_the_web",
        "arguments_for_the_function": {"search_query_text": "", "maximum_number_of_results": 50},
        "request_confidence_grade": "B+",
    },
    "employee_profile": {
        "employee_full_name": "Ada Lovelace",
        "department_assignment": "finance",
        "years_of_service_at_company": 0,
        "primary_skill_tags": ["rust", "sql"],
        "is_remote_employee": False,
    },
}


def _mutations(value: Any, schema: dict[str, Any]) -> list[Any]:
    """Values that break one keyword each (and some that still pass), found by walking."""
    out: list[Any] = [None, "x", 1.5, True, [], {}]
    if isinstance(value, dict):
        for k, v in value.items():
            out.append({kk: vv for kk, vv in value.items() if kk != k})
            for m in _mutations(v, schema["properties"][k]):
                out.append(value | {k: m})
    elif isinstance(value, int) and not isinstance(value, bool):
        out += [value + 1, schema.get("minimum", 0) - 1, schema.get("maximum", 0) + 1, -value]
    elif isinstance(value, str):
        out += [value + "z" * 30, value.lower(), value + "Q", "Ab Cd", "ABC-12345"]
    elif isinstance(value, list):
        out += [value * 2, ["cobol"], value[:1], ["rust", "rust", "sql", "go"]]
    return out


@pytest.mark.parametrize("name", list(SCHEMAS))
def test_subset_validator_agrees_with_jsonschema(name: str) -> None:
    schema = SCHEMAS[name]
    jsonschema.Draft202012Validator.check_schema(schema)
    assert validate_subset(VALID[name], schema) == []
    jsonschema.validate(VALID[name], schema)
    disagreements, rejected = [], 0
    for m in _mutations(VALID[name], schema):
        ours = not validate_subset(m, schema)
        theirs = jsonschema.Draft202012Validator(schema).is_valid(m)
        rejected += not theirs
        if ours != theirs:
            disagreements.append((m, ours, theirs))
    assert not disagreements
    assert rejected >= 10  # the mutations really exercise the keywords


def test_check_output_verdicts() -> None:
    schema = SCHEMAS["order_record"]
    ok = dict(VALID["order_record"])
    assert check_output(json.dumps(ok), schema) == ("strict", "")
    # xgrammar's JSON strings admit raw control characters; strict JSON does not
    raw = json.dumps(ok | {"customer_feedback_summary": "a@@b"}).replace("@@", "\t")
    assert check_output(raw, schema) == ("lenient", "")
    assert check_output(json.dumps(ok | {"order_priority_level": 6}), schema)[0] == "invalid"
    assert check_output('{"customer_account', schema)[0] == "invalid"


@pytest.fixture(scope="module")
def llama_tokenizer() -> Any:
    from grammar_service.tokenizer_source import load_tokenizer
    from model_service.random_configs import random_config

    return load_tokenizer(random_config("tiny-llama")[1])


def test_schemas_end_under_random_logits(llama_tokenizer: Any) -> None:
    """What random weights do: greedy over random logits, masked by xgrammar compiled exactly
    as the grammar service compiles (compact JSON). Every walk ends well inside the part's
    256-token cap and validates (strictly or with raw control characters); the valid examples
    are accepted by the grammar."""
    info = xgr.TokenizerInfo.from_huggingface(llama_tokenizer, vocab_size=128256)
    compiler = xgr.GrammarCompiler(info, max_threads=1)
    gen = torch.Generator().manual_seed(0)
    lengths = []
    for name, text in SCHEMA_TEXT.items():
        compiled = compiler.compile_json_schema(text, any_whitespace=False)
        m = xgr.GrammarMatcher(compiled)
        ids = llama_tokenizer.encode(json.dumps(VALID[name]), add_special_tokens=False)
        assert all(m.accept_token(t) for t in ids) and m.is_completed(), name
        for _ in range(2):
            m = xgr.GrammarMatcher(compiled)
            mask = xgr.allocate_token_bitmask(1, info.vocab_size)
            out: list[int] = []
            while not m.is_terminated() and len(out) < 256:
                m.fill_next_token_bitmask(mask)
                logits = torch.randn(1, info.vocab_size, generator=gen)
                xgr.apply_token_bitmask_inplace(logits, mask)
                out.append(int(logits.argmax()))
                assert m.accept_token(out[-1])
            assert m.is_terminated() and out[-1] in info.stop_token_ids, name
            lengths.append(len(out))
            verdict, why = check_output(llama_tokenizer.decode(out[:-1]), SCHEMAS[name])
            assert verdict in ("strict", "lenient"), (name, why)
    assert max(lengths) < 150, lengths


def _run(tokens: list[int], wall: float, steps: int, jf_tokens: int = 0) -> dict[str, Any]:
    outs = [
        Outcome("order_record", text="{}", finish="stop", tokens=n, ttft_s=0.01 * (i + 1),
                itl_s=(0.005,) * (n - 1))
        for i, n in enumerate(tokens)
    ]  # fmt: skip
    d = {"steps": steps, "generated_tokens": sum(tokens) - jf_tokens + len(tokens),
         "mask_wait_seconds": 0.002 * steps, "jump_forwards": 1 if jf_tokens else 0,
         "jump_forward_tokens": jf_tokens}  # fmt: skip
    return summarize(outs, wall, d)


def test_summarize_figures() -> None:
    s = _run([10, 30], wall=0.5, steps=31, jf_tokens=8)
    assert s["tok_s"] == 80.0 and s["output_tokens_per_request"] == 20.0
    assert s["forward_passes_per_request"] == (40 - 8 + 2) / 2
    assert s["mask_stall_ms_per_step"] == 2.0
    assert s["mask_stall_fraction_of_step"] == round(0.062 / 0.5, 4)
    assert s["ttft_ms_p50"] in (10.0, 20.0) and s["itl_ms_p50"] == 5.0
    assert s["finish"] == {"stop": 2} and s["cut_by_length"] == 0 and s["errors"] == 0
    failed = summarize([Outcome("x", error="UNAVAILABLE: gone")], 1.0, _zero())
    assert failed["errors"] == 1 and failed["first_error"].startswith("UNAVAILABLE")


def _zero() -> dict[str, Any]:
    return dict.fromkeys(
        ("steps", "generated_tokens", "mask_wait_seconds", "jump_forwards", "jump_forward_tokens"),
        0,
    )


def test_validity_counts_only_stopped_outputs() -> None:
    good = json.dumps(VALID["sensor_reading"])
    bad = json.dumps(VALID["sensor_reading"] | {"battery_level_percentage": 101})
    v = validity([
        Outcome("sensor_reading", text=good, finish="stop"),
        Outcome("sensor_reading", text=bad, finish="stop"),
        Outcome("sensor_reading", text=good[:20], finish="length"),  # cut: counted elsewhere
        Outcome("sensor_reading", error="DEADLINE_EXCEEDED: x"),
    ])  # fmt: skip
    assert (v["checked"], v["valid_strict"], v["invalid"]) == (2, 1, 1)
    assert v["examples_not_strict"][0]["verdict"] == "invalid"


def _mode(c_tok: list[int], u_tok: list[int], c_wall: float, u_wall: float) -> dict[str, Any]:
    c, u = _run(c_tok, c_wall, max(c_tok)), _run(u_tok, u_wall, max(u_tok))
    valid = {"checked": 2, "valid_strict": 2, "valid_lenient": 0, "invalid": 0}
    return {
        "batch64": {
            "batch": 64,
            "requests": 64,
            "constrained": c,
            "unconstrained_length_matched": u,
            "ratio_constrained_over_unconstrained": round(c["tok_s"] / u["tok_s"], 4),
            "ratio_rounds": [0.8],
            "validity": valid | {"examples_not_strict": []},
        }
    }


def test_finish_doc_goals_and_tables() -> None:
    doc: dict[str, Any] = {"model": "m", "input_len": 128, "rows": [], "errors": [],
                           "date": "2026-11-22T00:00:00", "device": "NVIDIA H100 (80 GiB)",
                           "modes": {"off": _mode([80, 80], [80, 80], 1.2, 1.0),
                                     "on": _mode([40, 40], [40, 40], 0.4, 0.5)}}  # fmt: skip
    snapshot = copy.deepcopy(doc["modes"])
    finish_doc(doc, "batch64")
    assert doc["modes"] == snapshot
    assert len(doc["rows"]) == 4 and not doc["errors"]
    g = doc["goal_results"]
    assert g["off"]["ratio"] == round(1.0 / 1.2, 4) and not g["off"]["met"]
    assert g["on"]["ratio"] == 1.25 and g["on"]["met"]
    jf = doc["jump_forward"]["batch64"]
    assert jf["requests_per_s_on_over_off"] == pytest.approx(3.0, rel=1e-3)
    assert jf["steps_off_over_on"] == 2.0
    md = "\n".join(render_tables(doc, fmt, md_table))
    assert "| off | batch64 | 133.3 | 160.0 | 0.833 |" in md
    assert "jump-forward on: 1.250 vs 1.0 (met)" in md.replace("1.25 vs", "1.250 vs")


def test_goal_thresholds() -> None:
    assert goal_met("off", 0.90) and not goal_met("off", 0.8999)
    assert not goal_met("on", 1.0) and goal_met("on", 1.0001) and not goal_met("on", None)
