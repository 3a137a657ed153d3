"""Hostile-input fuzzing against real service processes (issue 12, "Must show").

Hypothesis draws public `GenerateRequest`s and internal messages (scheduler `SubmitRequest` and
session messages, model `Step`s with `StepMasks`, grammar `MaskStep`s) with hostile values:
ids out of range, empty prompts, non-finite floats, huge handles, slots and counts, garbage
packed arrays. For every one: no answer is INTERNAL or UNKNOWN (a refusal is a clear status
such as INVALID_ARGUMENT), no stream breaks, no service dies, and afterwards a healthy request
still runs. During the public-API fuzz a healthy request runs alongside and must finish within
3x its idle latency. Examples are bounded (a CI-sized run: 60 per target, no deadline).
"""

from __future__ import annotations

import math
import statistics
import threading
import time
from collections.abc import Iterator

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from radixmesh.api import Client

from radixmesh_wire.packing import pack_i32, unpack_i32
from radixmesh_wire.pb import (
    api_pb2,
    api_pb2_grpc,
    grammar_pb2,
    grammar_pb2_grpc,
    model_pb2,
    scheduler_pb2,
)
from tests.conftest import LoneModel, Stack
from tests.integration.raw_peers import (
    ModelSession,
    SchedulerSession,
    _Bidi,
    _next_with_timeout,
    channel_as,
)

pytestmark = pytest.mark.integration

FUZZ = settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    suppress_health_check=list(HealthCheck),
)
BAD_CODES = {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN}
VOCAB = 49152

i32 = st.integers(-(2**31), 2**31 - 1)
token = st.one_of(st.integers(0, VOCAB - 1), st.sampled_from([-1, VOCAB, 10**6, 2**31 - 1]))
floats = st.one_of(
    st.floats(-2.0, 3.0),
    st.sampled_from([0.0, 1.0, math.inf, -math.inf, math.nan, 1e-30, 1e30]),
)
small_count = st.one_of(st.integers(-3, 4), st.sampled_from([10**6, 2**31 - 1]))
REGEXES = ["[0-9]{2}", "", "(yes|no)", "[a-z]+", "(", "[0-9]+\\.[0-9]"]
SCHEMAS = ['{"type": "integer"}', '{"type": "object"}', "{", '{"type": "nope"}', "[]"]


def _sampling() -> st.SearchStrategy[api_pb2.SamplingParams]:
    @st.composite
    def build(draw: st.DrawFn) -> api_pb2.SamplingParams:
        s = api_pb2.SamplingParams(max_new_tokens=draw(small_count))
        for name in ("temperature", "top_p", "min_p"):
            if draw(st.booleans()):
                setattr(s, name, draw(floats))
        if draw(st.booleans()):
            s.top_k = draw(st.sampled_from([-5, -1, 0, 1, 50, 10**6]))
        if draw(st.booleans()):
            s.min_new_tokens = draw(small_count)
        s.ignore_eos = draw(st.booleans())
        s.stop_token_ids.extend(draw(st.lists(token, max_size=3)))
        s.stop.extend(draw(st.lists(st.text(max_size=4), max_size=2)))
        if draw(st.booleans()):
            s.seed = draw(st.integers(0, 2**64 - 1))
        kind = draw(st.sampled_from(["none", "none", "regex", "json_schema"]))
        if kind == "regex":
            s.regex = draw(st.sampled_from(REGEXES))
        elif kind == "json_schema":
            s.json_schema = draw(st.sampled_from(SCHEMAS))
        return s

    return build()


@st.composite
def generate_requests(draw: st.DrawFn) -> api_pb2.GenerateRequest:
    req = api_pb2.GenerateRequest(sampling=draw(_sampling()))
    which = draw(st.sampled_from(["text", "ids", "chat", "none"]))
    if which == "text":
        req.text = draw(st.text(max_size=40))
    elif which == "ids":
        req.input_ids.ids.extend(draw(st.lists(token, max_size=12)))
    elif which == "chat":
        for _ in range(draw(st.integers(0, 2))):
            role = draw(st.sampled_from(["user", "assistant", "system", "robot", ""]))
            req.chat.messages.append(
                api_pb2.ChatMessage(role=role, content=draw(st.text(max_size=20)))
            )
    req.logprobs.return_logprob = draw(st.booleans())
    req.logprobs.top_logprobs = draw(st.sampled_from([-1, 0, 2, 21, 10**6]))
    if draw(st.booleans()):
        req.logprobs.prompt_logprobs_from = draw(st.integers(-2, 20))
    req.stream = draw(st.booleans())
    if draw(st.booleans()):
        req.request_id = draw(st.sampled_from(["fuzz-a", "fuzz-b", ""]))
    return req


@st.composite
def valid_requests(draw: st.DrawFn) -> api_pb2.GenerateRequest:
    """Requests the API accepts, with the edge values that once failed (grammar ends within
    min_new_tokens, ignore_eos on a grammar, extreme finite temperatures)."""
    s = api_pb2.SamplingParams(
        max_new_tokens=draw(st.integers(0, 3)),
        temperature=draw(st.sampled_from([0.0, 0.7, 1.0, 1e-30, 1e30])),
        ignore_eos=draw(st.booleans()),
    )
    s.min_new_tokens = draw(st.integers(0, s.max_new_tokens))
    if draw(st.booleans()):
        s.top_p = draw(st.sampled_from([1e-6, 0.5, 1.0]))
    if draw(st.booleans()):
        s.top_k = draw(st.sampled_from([-1, 0, 1, 40]))
    kind = draw(st.sampled_from(["none", "regex", "json_schema"]))
    if kind == "regex":
        s.regex = draw(st.sampled_from(["[0-9]{2}", "", "(yes|no)", "[a-z]+"]))
    elif kind == "json_schema":
        s.json_schema = draw(st.sampled_from(['{"type": "integer"}', '{"type": "boolean"}']))
    req = api_pb2.GenerateRequest(text=draw(st.text(min_size=1, max_size=30)), sampling=s)
    req.logprobs.top_logprobs = draw(st.integers(0, 3))
    req.stream = draw(st.booleans())
    return req


def _healthy(c: Client) -> float:
    t0 = time.perf_counter()
    res = c.generate("The capital of France is", max_new_tokens=6, temperature=0, ignore_eos=True)
    assert res.completion_tokens == 6
    return time.perf_counter() - t0


def _consume(stub: api_pb2_grpc.RadixMeshStub, req: api_pb2.GenerateRequest) -> grpc.StatusCode:
    try:
        for _ in stub.Generate(req, timeout=60):
            pass
    except grpc.RpcError as exc:
        return exc.code()  # type: ignore[no-any-return]
    return grpc.StatusCode.OK


def test_fuzz_generate(stack: Stack) -> None:
    with Client(stack.endpoint) as c:
        idle = statistics.median(_healthy(c) for _ in range(3))
        seen: list[float] = []
        stop = threading.Event()

        def alongside() -> None:
            while not stop.is_set():
                seen.append(_healthy(c))

        t = threading.Thread(target=alongside)
        t.start()
        chan = grpc.insecure_channel(stack.endpoint)
        stub = api_pb2_grpc.RadixMeshStub(chan)
        codes: list[grpc.StatusCode] = []

        @FUZZ
        @given(req=st.one_of(valid_requests(), generate_requests()))
        def run(req: api_pb2.GenerateRequest) -> None:
            code = _consume(stub, req)
            codes.append(code)
            assert code not in BAD_CODES, (code, req)

        try:
            run()
        finally:
            stop.set()
            t.join()
            chan.close()
        assert grpc.StatusCode.OK in codes and grpc.StatusCode.INVALID_ARGUMENT in codes
        # The fuzzer starves nobody: plain requests finished beside it, each with its tokens
        # (_healthy checks them). Their latencies are figures: a busy machine changes them.
        assert seen, "no plain request finished while the fuzzer ran"
        print(f"plain request beside the fuzzer: idle {idle:.2f} s, max {max(seen):.2f} s")
        _healthy(c)


@st.composite
def submits(draw: st.DrawFn) -> scheduler_pb2.FrontendMessage:
    kind = draw(st.sampled_from(["submit"] * 6 + ["abort", "hello", "empty"]))
    if kind == "abort":
        rid = draw(st.sampled_from(["x", "", "fuzz-0"]))
        return scheduler_pb2.FrontendMessage(abort=scheduler_pb2.AbortRequestInternal(rid=rid))
    if kind == "hello":
        return scheduler_pb2.FrontendMessage(hello=scheduler_pb2.FrontendHello(session_id="x"))
    if kind == "empty":
        return scheduler_pb2.FrontendMessage()
    sampling = draw(_sampling())
    msg = scheduler_pb2.SubmitRequest(
        rid=draw(st.sampled_from(["fuzz-0", "fuzz-1", "", "r"])),
        input_ids=draw(st.lists(token, max_size=12)),
        sampling=sampling,
        output_ids=draw(st.lists(token, max_size=3)),
        eos_token_ids=draw(st.lists(token, max_size=2)),
    )
    msg.logprobs.top_logprobs = draw(st.sampled_from([-1, 0, 3, 10**6]))
    if draw(st.booleans()):
        msg.logprobs.prompt_logprobs_from = draw(st.integers(-2, 20))
    return scheduler_pb2.FrontendMessage(submit=msg)


def test_fuzz_scheduler_session(stack: Stack) -> None:
    sess = SchedulerSession(channel_as(stack.launcher, "scheduler", "tokenizer"))
    keys = iter(range(1, 10**6))
    try:

        @FUZZ
        @given(msg=submits(), bad_key=st.sampled_from([None, None, None, 0, -7]))
        def run(msg: scheduler_pb2.FrontendMessage, bad_key: int | None) -> None:
            if msg.WhichOneof("kind") != "submit":
                sess.send(msg)
                return
            key = next(keys)
            msg.submit.key = key if bad_key is None else bad_key
            msg.submit.rid = msg.submit.rid and f"{msg.submit.rid}-{key}"
            sess.send(msg)
            if bad_key is not None:  # its refusal names a key we cannot tell apart: skip
                return
            out = sess.wait(key, timeout=60)
            assert out.error_code not in BAD_CODES, (out, msg)

        run()
        ok = scheduler_pb2.SubmitRequest(
            rid="after-fuzz",
            input_ids=[1, 2, 3],
            sampling=api_pb2.SamplingParams(max_new_tokens=3, temperature=0, ignore_eos=True),
            key=10**6 + 1,
        )
        sess.submit(ok)
        out = sess.wait(ok.key)
        assert out.error_code is None and len(out.tokens) == 3
    finally:
        sess.close()
    assert stack.launcher.procs["scheduler"].poll() is None


def _packed(values: st.SearchStrategy[int], max_size: int = 6) -> st.SearchStrategy[bytes]:
    """Packed int32 arrays, sometimes with a torn last element."""
    return st.one_of(
        st.lists(values, max_size=max_size).map(pack_i32),
        st.binary(max_size=9),
    )


handle = st.one_of(st.integers(0, 6), st.sampled_from([63, 64, 10**7, 2**32 - 1]))  # uint32
packed_handle = st.one_of(st.integers(0, 6), st.sampled_from([63, 64, 10**7, 2**31 - 1, -1]))
slot = st.one_of(st.integers(0, 4095), st.sampled_from([4096, 2**31 - 1, -1]))


@st.composite
def steps(draw: st.DrawFn) -> model_pb2.Step:
    step = model_pb2.Step()
    for _ in range(draw(st.integers(0, 2))):
        n = draw(st.integers(0, 6))
        step.admits.append(
            model_pb2.Admit(
                handle=draw(handle),
                sampling=model_pb2.RequestSampling(
                    temperature=draw(floats),
                    top_p=draw(floats),
                    top_k=draw(st.sampled_from([-1, 0, 5, 10**6])),
                    min_p=draw(floats),
                    top_logprobs=draw(st.sampled_from([0, 3, -1, 10**6])),
                    prompt_logprobs_from=draw(st.integers(-3, 8)),
                    min_new_tokens=draw(small_count),
                    stop_ids=draw(_packed(token, 3)),
                ),
                prefix_slots=draw(_packed(slot, 4)),
                input_ids=pack_i32(draw(st.lists(token, min_size=n, max_size=n))),
                slots=draw(st.one_of(st.just(pack_i32(range(100, 100 + n))), _packed(slot))),
                sample=draw(st.booleans()),
            )
        )
    for _ in range(draw(st.integers(0, 1))):
        step.extends.append(
            model_pb2.Extend(
                handle=draw(handle),
                input_ids=draw(_packed(token, 3)),
                slots=draw(_packed(slot, 3)),
                sample=draw(st.booleans()),
            )
        )
    step.decode_handles = draw(_packed(packed_handle, 3))
    step.decode_slots = draw(_packed(slot, 3))
    for _ in range(draw(st.integers(0, 1))):
        step.truncates.append(
            model_pb2.Truncate(handle=draw(handle), length=draw(st.integers(0, 9)))
        )
    step.release_handles = draw(_packed(packed_handle, 2))
    step.freed_slots = draw(_packed(slot, 2))
    for _ in range(draw(st.integers(0, 1))):
        step.masks.append(
            grammar_pb2.MaskRow(
                handle=draw(handle),
                encoding=draw(st.integers(0, 5)),  # type: ignore[arg-type]
                data=draw(st.binary(max_size=16)),
            )
        )
    step.masks_follow = draw(st.integers(0, 9)) == 0
    return step


def test_fuzz_model_steps(lone_model: LoneModel) -> None:
    sess = ModelSession(grpc.insecure_channel(lone_model.address), "fuzz")
    ids: Iterator[int] = iter(range(1, 10**6))
    errors: list[str] = []
    try:

        @FUZZ
        @given(step=steps(), late=st.binary(max_size=12))
        def run(step: model_pb2.Step, late: bytes) -> None:
            step.step_id = next(ids)
            sess.step(step)
            if step.masks_follow:
                sess.masks(model_pb2.StepMasks(step_id=step.step_id, skip_handles=late))
            res = sess.result(timeout=30)
            assert res.step_id == step.step_id
            if res.error:
                errors.append(res.error)

        run()
        assert errors  # the hostile steps were refused, each with its reason
        sess.step(model_pb2.Step(step_id=next(ids), release_handles=pack_i32(range(64))))
        assert not sess.result().error
        sess.step(
            model_pb2.Step(
                step_id=next(ids),
                admits=[
                    model_pb2.Admit(
                        handle=5,
                        sampling=model_pb2.RequestSampling(top_p=1, prompt_logprobs_from=-1),
                        input_ids=pack_i32([1, 2]),
                        slots=pack_i32([0, 1]),
                        sample=True,
                    )
                ],
            )
        )
        res = sess.result()
        assert not res.error and unpack_i32(res.handles) == [5]
    finally:
        sess.close()
    assert lone_model_alive(lone_model)


def lone_model_alive(m: LoneModel) -> bool:
    try:
        with open(f"/proc/{m.pid}/status") as f:
            return "State:\tZ" not in f.read()
    except FileNotFoundError:
        return False


class GrammarSession(_Bidi):
    def __init__(self, chan: grpc.Channel) -> None:
        super().__init__()
        self._chan = chan
        stub = grammar_pb2_grpc.GrammarStub(self._chan)
        self.send(grammar_pb2.MaskRequest(open=grammar_pb2.OpenMasks(session_id="fuzz")))
        self._call = stub.Masks(self._requests())
        self.info = next(self._call).opened.info

    def step(self, msg: grammar_pb2.MaskStep, timeout: float = 60) -> grammar_pb2.MaskStepResult:
        self.send(grammar_pb2.MaskRequest(step=msg))
        return _next_with_timeout(self._call, timeout).result


@st.composite
def mask_steps(draw: st.DrawFn) -> grammar_pb2.MaskStep:
    msg = grammar_pb2.MaskStep(release_handles=draw(_packed(packed_handle, 2)))
    for _ in range(draw(st.integers(0, 2))):
        kind = draw(st.integers(0, 4))
        text = draw(st.sampled_from(REGEXES if kind == 2 else SCHEMAS))
        msg.binds.append(
            grammar_pb2.Bind(
                handle=draw(handle),
                grammar=grammar_pb2.GrammarSpec(kind=kind, text=text),  # type: ignore[arg-type]
                replay_tokens=draw(_packed(token, 3)),
            )
        )
    for _ in range(draw(st.integers(0, 1))):
        msg.rollbacks.append(
            grammar_pb2.Rollback(handle=draw(handle), num_tokens=draw(st.integers(0, 2**32 - 1)))
        )
    msg.accept_handles = draw(_packed(packed_handle, 2))
    msg.accept_counts = draw(_packed(small_count, 2))
    msg.accept_tokens = draw(_packed(token, 3))
    msg.mask_handles = draw(_packed(packed_handle, 3))
    msg.jump_forward_handles = draw(_packed(packed_handle, 2))
    return msg


def test_fuzz_grammar_mask_steps(stack: Stack) -> None:
    """A malformed step may end the stream, but with a clear status (INVALID_ARGUMENT); the
    next session works."""
    sessions = [GrammarSession(channel_as(stack.launcher, "grammar", "scheduler"))]
    ids = iter(range(1, 10**6))
    try:

        @FUZZ
        @given(msg=mask_steps())
        def run(msg: grammar_pb2.MaskStep) -> None:
            msg.step_id = next(ids)
            try:
                res = sessions[-1].step(msg)
            except grpc.RpcError as exc:
                assert exc.code() not in BAD_CODES, (exc, msg)
                sessions.append(GrammarSession(channel_as(stack.launcher, "grammar", "scheduler")))
                return
            assert res.step_id == msg.step_id
            for err in res.errors:
                assert err.code != grammar_pb2.GRAMMAR_ERROR_INTERNAL, (err, msg)

        run()
    finally:
        for sess in sessions:
            sess.close()
    assert stack.launcher.procs["grammar"].poll() is None
    with Client(stack.endpoint) as c:
        res = c.generate("Answer:", regex="(yes|no)", max_new_tokens=4, temperature=0)
        assert res.text in ("yes", "no")
