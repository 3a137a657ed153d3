"""The stack's per-step cost, pinned by structure rather than by the clock (issue 27): the step
messages' bytes per row, and the scheduler's Python function calls per decode row of a step
(at 256 running, per-row Python is what a step costs the scheduler)."""

from __future__ import annotations

import argparse
import sys
from types import FrameType
from typing import Any

import pytest

from radixmesh_bench.step_codec_cost import make_output, make_step, measure_case
from radixmesh_bench.step_cost_sched import SchedulerDriver
from radixmesh_wire.pb import model_pb2
from radixmesh_wire.step_codec import encode_output, encode_step


@pytest.mark.parametrize("rows", [1, 64, 256])
def test_decode_step_messages_cost_a_few_bytes_per_row(rows: int) -> None:
    """A decode row is a handle and a slot on the way out (two packed int32) and a handle,
    a token and a logprob on the way back: nothing per request is re-sent every step."""
    ops, _ = make_step(rows)
    step = model_pb2.StepRequest(step=encode_step(ops)).SerializeToString()
    reply = model_pb2.StepReply(result=encode_output(make_output(ops))).SerializeToString()
    assert len(step) <= 8 * rows + 24
    assert len(reply) <= 12 * rows + 24


def _python_calls(fn: Any) -> int:
    """Python-level function calls made while `fn` runs (C functions not counted)."""
    n = 0

    def prof(frame: FrameType, event: str, arg: object) -> None:
        nonlocal n
        if event == "call":
            n += 1

    sys.setprofile(prof)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return n


def _calls_per_cycle(running: int) -> int:
    d = SchedulerDriver(running, waiting=0, steps=80)
    for _ in range(40):  # every prompt admitted and prefilled: the batch decodes
        d.cycle()
    st = d.sched.st
    assert st is not None and len(st.running) == running
    return _python_calls(d.cycle)


def test_scheduler_python_calls_per_decode_row() -> None:
    """One step cycle (build, encode, decode the result, apply it, flush) at 256 running
    against 64: the 192 extra decode rows may add at most 1.5 Python calls each (the pending
    count's transition). Before: 4 (Request.decode, _current, sample_settled, _on_token)."""
    marginal = (_calls_per_cycle(256) - _calls_per_cycle(64)) / 192
    assert marginal <= 1.5, marginal


def test_bench_reports_the_codec_fields() -> None:
    case = measure_case(4, 1, iters=2, repeats=1)
    assert case["step_bytes"] > 0 and case["result_bytes"] > 0
    assert case["codec_us_per_step"] == pytest.approx(
        sum(case[k] for k in case if k.endswith("_us") and k != "codec_us_per_step"), abs=0.05
    )


def test_step_cost_command_is_wired() -> None:
    from radixmesh_bench.cli import build_parser

    ns = build_parser().parse_args(["step-cost", "--parts", "codec", "--rows", "1"])
    assert isinstance(ns, argparse.Namespace) and ns.parts == ["codec"] and ns.rows == [1]


def test_session_part_runs_the_real_step_session() -> None:
    """The `session` part drives ModelWorkerServicer.Steps to the end (an error reply of the
    step check would raise) and prices it per step."""
    from radixmesh_bench.step_cost_session import run_session

    out = run_session([4], steps=5, repeats=1)
    assert out["rows_4"]["session_cpu_ms_per_step"] > 0


def test_split_of_a_stack_result() -> None:
    """`--split`: a stack row's wall = GPU busy + GPU idle between steps + the rest."""
    from radixmesh_bench.step_cost import stack_split

    doc = {
        "rows": [
            {"path": "in-process ModelRunner", "workload": "w", "tok_s": 100.0},
            {
                "path": "grpc-stack",
                "workload": "w",
                "overlap": "on",
                "tok_s": 80.0,
                "wall_s": 5.0,
                "scheduler_steps": 200,
                "gpu_busy_ms_per_step": 15.0,
                "gpu_idle_ms_per_step": 2.5,
            },
        ]
    }
    (row,) = stack_split(doc)
    assert (row["gpu_busy_s"], row["gpu_idle_between_steps_s"], row["rest_s"]) == (3.0, 0.5, 1.5)
    assert row["in_process_tok_s"] == 100
