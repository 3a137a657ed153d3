"""The servicer on a real in-process grpc.aio server (free localhost port), through the
generated stub: info, Compile, the Masks stream and its session lifetime, protocol errors."""

from __future__ import annotations

import asyncio
import re
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import grpc
import pytest

from grammar_service.config import GrammarConfig
from grammar_service.server import GrammarServicer, build_servicer, register
from grammar_service.suite import PAPER_REGEX
from model_service.mask_device import decode_rows
from radixmesh_wire.mask_step import MaskStepBuilder, grammar_spec
from radixmesh_wire.packing import unpack_i32
from radixmesh_wire.pb import grammar_pb2 as pb
from radixmesh_wire.pb import grammar_pb2_grpc as pb_grpc


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    """The embedded model's tokenizer, built once and cached under the temp dir."""
    from grammar_service.tokenizer_source import default_tokenizer_dir, load_tokenizer

    return load_tokenizer(default_tokenizer_dir())


@pytest.fixture(scope="module")
def servicer(tokenizer: Any) -> GrammarServicer:
    return build_servicer(tokenizer, GrammarConfig(mask_threads=1, compile_threads=1))


@asynccontextmanager
async def serving(svc: GrammarServicer) -> AsyncIterator[pb_grpc.GrammarStub]:
    server = grpc.aio.server()
    register(server, svc)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield pb_grpc.GrammarStub(channel)
    finally:
        await server.stop(None)


def run(svc: GrammarServicer, body: Callable[[pb_grpc.GrammarStub], Awaitable[None]]) -> None:
    async def main() -> None:
        async with serving(svc) as stub:
            await body(stub)

    asyncio.run(main())


async def open_masks(stub: pb_grpc.GrammarStub, sid: str) -> Any:
    call = stub.Masks()
    await call.write(pb.MaskRequest(open=pb.OpenMasks(session_id=sid)))
    reply = await call.read()
    assert reply.opened.session_id == sid
    return call


async def step(call: Any, b: MaskStepBuilder, step_id: int) -> pb.MaskStepResult:
    await call.write(pb.MaskRequest(step=b.build(step_id)))
    reply = await call.read()
    assert reply.result.step_id == step_id
    return reply.result


async def wait_for(cond: Callable[[], bool]) -> None:
    for _ in range(200):
        if cond():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not reached")


def test_info_and_compile(servicer: GrammarServicer) -> None:
    async def body(stub: pb_grpc.GrammarStub) -> None:
        info = await stub.GetGrammarInfo(pb.GrammarInfoRequest())
        assert info.backend.startswith("xgrammar ") and info.vocab_size == 49152
        assert info.bitmask_words == 1536 and list(info.stop_token_ids) == [2]
        ok = await stub.Compile(pb.CompileRequest(grammar=grammar_spec("regex", PAPER_REGEX)))
        again = await stub.Compile(pb.CompileRequest(grammar=grammar_spec("regex", PAPER_REGEX)))
        assert ok.ok and again.ok and again.cached and not ok.error
        bad = await stub.Compile(pb.CompileRequest(grammar=grammar_spec("ebnf", "root ::= x")))
        assert not bad.ok and 'Rule "x" is not defined' in bad.error
        no_kind = await stub.Compile(pb.CompileRequest(grammar=pb.GrammarSpec(text="a")))
        assert not no_kind.ok and "kind" in no_kind.error

    run(servicer, body)


def test_masks_stream_generates_the_paper_format(servicer: GrammarServicer, tokenizer: Any) -> None:
    vocab = servicer.engine.vocab_size
    script_text = ["Fine", ".", "B", '"}']
    words = {w: tokenizer.encode(w, add_special_tokens=False) for w in script_text}
    assert all(len(ids) == 1 for ids in words.values())

    async def body(stub: pb_grpc.GrammarStub) -> None:
        call = await open_masks(stub, "sched-1")
        assert len(servicer._sessions) == 1
        b, step_id = MaskStepBuilder(), 0
        out: list[int] = []
        b.bind(3, "regex", PAPER_REGEX)
        script = iter([words[w][0] for w in script_text])
        while True:
            b.want(3, jump_forward=True)
            step_id += 1
            result = await step(call, b, step_id)
            assert not result.errors and result.service_ms > 0
            (row,) = result.rows
            if row.jump_forward.tokens:
                new = unpack_i32(row.jump_forward.tokens)
                out = out[: len(out) - row.jump_forward.rollback] + new
                b.rollback(3, row.jump_forward.rollback)
                b.accept(3, new)
                continue
            if row.can_end:
                break
            token = next(script)
            mask = decode_rows([row], vocab)[0]
            assert (int(mask[token // 32]) >> (token % 32)) & 1  # the script stays allowed
            out.append(token)
            b.accept(3, [token])
        text = tokenizer.decode(out)
        assert re.fullmatch(PAPER_REGEX, text) and text == '{"summary": "Fine.", "grade": "B"}'
        await call.done_writing()
        assert await call.read() == grpc.aio.EOF
        await wait_for(lambda: not servicer._sessions)  # matchers dropped with the stream

    run(servicer, body)


def test_sessions_are_independent_and_dropped_on_cancel(
    servicer: GrammarServicer, tokenizer: Any
) -> None:
    async def body(stub: pb_grpc.GrammarStub) -> None:
        a, c = await open_masks(stub, "a"), await open_masks(stub, "c")
        ba, bc = MaskStepBuilder(), MaskStepBuilder()
        ba.bind(1, "regex", "(yes|no)")
        bc.bind(1, "regex", "(maybe)")
        ba.want(1, jump_forward=True)
        bc.want(1, jump_forward=True)
        ra, rc = await asyncio.gather(step(a, ba, 1), step(c, bc, 1))
        assert not ra.rows[0].jump_forward.text and rc.rows[0].jump_forward.text == "maybe"
        info = await stub.GetGrammarInfo(pb.GrammarInfoRequest())
        assert (info.sessions, info.matchers) == (2, 2)
        a.cancel()
        await wait_for(lambda: len(servicer._sessions) == 1)
        await c.done_writing()
        await wait_for(lambda: not servicer._sessions)

    run(servicer, body)


def test_protocol_errors_end_the_stream(servicer: GrammarServicer) -> None:
    async def body(stub: pb_grpc.GrammarStub) -> None:
        call = stub.Masks()
        await call.write(pb.MaskRequest(step=pb.MaskStep(step_id=1)))
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await call.read()
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        call = await open_masks(stub, "bad")
        await call.write(pb.MaskRequest(step=pb.MaskStep(step_id=1, mask_handles=b"\x01\x02")))
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await call.read()
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "int32" in (info.value.details() or "")
        await wait_for(lambda: not servicer._sessions)

    run(servicer, body)


def test_a_stuck_mask_step_shows_in_liveness(
    servicer: GrammarServicer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A mask step that never ends (a stuck fill) is what the watchdog reports, so liveness
    turns NOT_SERVING and the supervisor restarts the service; an idle one is never stuck."""
    from services.watchdog import Progress, Watchdog

    release = threading.Event()
    real_run = servicer.engine.run

    def stuck(*args: Any) -> Any:
        release.wait(10)
        return real_run(*args)

    monkeypatch.setattr(servicer.engine, "run", stuck)
    dog = Watchdog()
    monkeypatch.setattr(servicer, "progress", dog.progress("mask step", 0.05))
    assert isinstance(servicer.progress, Progress)

    async def body() -> str | None:
        assert dog.problem(time.monotonic() + 1.0) is None  # idle: not stuck
        b = MaskStepBuilder()
        b.bind(5, "regex", "[ab]+")
        b.want(5)
        task = asyncio.create_task(servicer.run_step(servicer.new_session("s"), b.build(1)))
        deadline = time.monotonic() + 10
        while (problem := dog.problem(time.monotonic())) is None:
            assert time.monotonic() < deadline, "the stuck step was never reported"
            await asyncio.sleep(0.01)
        release.set()
        await task
        return problem

    problem = asyncio.run(body())
    assert problem is not None and "mask step made no progress" in problem
    assert servicer.progress.active == 0
