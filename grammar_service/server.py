"""The grammar service's gRPC surface: Compile, the per-session Masks stream, GetGrammarInfo.

Threads: the event loop only decodes messages and awaits work. Compiles run in the cache's
compile pool; mask steps run in the mask pool (`mask_threads`), except steps light enough that
the thread hop would cost more than the work (`inline_step_weight`). Each session runs one step
at a time, so its matchers are never touched by two threads at once.

Use `build_servicer(tokenizer, config)` to embed the servicer in any grpc.aio server, or
`serve(config)` to run it with the shared bootstrap (health, reflection, drain on SIGTERM).
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import os
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import structlog
import xgrammar as xgr

from grammar_service.compile_cache import CompileCache, GrammarError, GrammarKey
from grammar_service.config import GrammarConfig
from grammar_service.jump_forward import ForcedBytes, Retokenizer
from grammar_service.metrics import GrammarMetrics
from grammar_service.steps import (
    MaskEngine,
    SessionState,
    StepFormatError,
    StepOps,
    grammar_key,
    parse_step,
)
from grammar_service.tokenizer_source import load_tokenizer
from radixmesh_wire.pb import grammar_pb2 as pb
from radixmesh_wire.pb import grammar_pb2_grpc as pb_grpc
from services.security import require_peer
from services.watchdog import Progress, Watchdog

log = structlog.get_logger(__name__)

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Grammar"].full_name


class GrammarServicer(pb_grpc.GrammarServicer):
    def __init__(self, tokenizer: Any, config: GrammarConfig) -> None:
        """`tokenizer`: a loaded Hugging Face tokenizer (see `build_servicer` for paths)."""
        config.validate()
        self.config = config
        self.metrics: GrammarMetrics | None = None  # set by `serve` when metrics are on
        # Mask-step heartbeat for the liveness watchdog (`serve` sets it): a step that never
        # ends turns liveness NOT_SERVING.
        self.progress: Progress | None = None
        self.tokenizer_info = xgr.TokenizerInfo.from_huggingface(
            tokenizer,
            vocab_size=config.vocab_size or None,
            stop_token_ids=config.parsed_stop_token_ids(),
        )
        self.cache = CompileCache(
            self.tokenizer_info,
            max_entries=config.max_cache_entries,
            max_bytes=config.max_cache_bytes,
            compile_threads=config.compile_threads,
            any_whitespace=config.any_whitespace,
            disable_xgrammar_cache=config.disable_xgrammar_cache,
            error_ttl_s=config.error_ttl_s,
            pattern_strings=config.pattern_strings,
            isolation=config.compile_isolation,
            timeout_s=config.compile_timeout_s,
            memory_mb=config.compile_memory_mb,
            small_chars=config.compile_small_chars,
        )
        # Why a copy: `decoded_vocab` rebuilds a Python list on every access (~0.3 s).
        self.token_bytes: list[bytes] = list(self.tokenizer_info.decoded_vocab)
        forced = ForcedBytes(
            self.token_bytes,
            int(self.tokenizer_info.vocab_size),
            [int(t) for t in self.tokenizer_info.stop_token_ids],
            max_bytes=config.jump_forward_max_bytes,
            max_steps=config.jump_forward_max_steps,
        )
        retok = (
            Retokenizer(tokenizer, self.token_bytes, forced, config.jump_forward_window)
            if config.jump_forward_window > 0
            else None
        )
        self.engine = MaskEngine(
            self.tokenizer_info,
            retok,
            stop_token_ids=[int(t) for t in self.tokenizer_info.stop_token_ids],
            batch_fill_min_rows=config.batch_fill_min_rows,
            # 128k-vocabulary masks for a batch of 64 are milliseconds of work per step, and
            # the model waits for them: use the cores (xgrammar fills rows in native threads)
            fill_threads=config.fill_threads or min(8, os.cpu_count() or 1),
        )
        self._pool = ThreadPoolExecutor(config.mask_threads, thread_name_prefix="masks")
        self._sessions: dict[int, SessionState] = {}  # keyed by id(): session ids may repeat
        self.backend = f"xgrammar {importlib.metadata.version('xgrammar')}"

    # --- unary ---------------------------------------------------------------------------

    def info(self) -> pb.GrammarInfo:
        return pb.GrammarInfo(
            backend=self.backend,
            vocab_size=self.engine.vocab_size,
            bitmask_words=self.engine.words,
            stop_token_ids=self.engine.stop_token_ids,
            cache_entries=len(self.cache),
            cache_bytes=self.cache.nbytes,
            sessions=len(self._sessions),
            matchers=sum(len(s.table) for s in self._sessions.values()),
        )

    async def GetGrammarInfo(
        self, request: pb.GrammarInfoRequest, context: grpc.aio.ServicerContext
    ) -> pb.GrammarInfo:
        await require_peer(context, "scheduler")
        return self.info()

    async def Compile(
        self, request: pb.CompileRequest, context: grpc.aio.ServicerContext
    ) -> pb.CompileReply:
        await require_peer(context, "scheduler")
        t0 = time.perf_counter()
        try:
            kind, text = grammar_key(request.grammar)
            _, cached = await self.cache.get(kind, text)
            reply = pb.CompileReply(ok=True, cached=cached)
        except (ValueError, GrammarError) as exc:
            reply = pb.CompileReply(ok=False, error=str(exc))
        reply.compile_ms = (time.perf_counter() - t0) * 1e3
        return reply

    # --- the mask stream -----------------------------------------------------------------

    async def Masks(
        self, request_iterator: AsyncIterator[pb.MaskRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.MaskReply]:
        requests = aiter(request_iterator)
        first = await anext(requests, None)  # read before refusing: see frontend_link.Session
        await require_peer(context, "scheduler")
        if first is None:
            return
        if first.WhichOneof("kind") != "open":
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "first message must be open")
        sid = first.open.session_id
        state = self.new_session(sid)
        self._sessions[id(state)] = state
        log.info("masks_session_opened")
        try:
            yield pb.MaskReply(opened=pb.MasksOpened(session_id=sid, info=self.info()))
            async for req in requests:
                if req.WhichOneof("kind") != "step":
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "expected a step")
                yield pb.MaskReply(result=await self._step(state, req.step, context))
        finally:
            # Drop the reference only: a step still running in a thread finishes on its own
            # objects, and the matchers go with the last reference.
            self._sessions.pop(id(state), None)
            log.info("masks_session_closed", steps=state.steps, matchers=len(state.table))

    async def _step(
        self, state: SessionState, step: pb.MaskStep, context: grpc.aio.ServicerContext
    ) -> pb.MaskStepResult:
        try:
            return await self.run_step(state, step)
        except StepFormatError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"step {step.step_id}: {exc}")
        except Exception as exc:  # a bug, not a grammar problem: fail the stream loudly
            log.exception("mask_step_failed", step=step.step_id)
            await context.abort(grpc.StatusCode.INTERNAL, f"step {step.step_id}: {exc}")
        raise AssertionError("unreachable: abort raises")

    def new_session(self, session_id: str) -> SessionState:
        return SessionState(
            session_id,
            max_rollback_tokens=self.config.max_rollback_tokens,
            keep_tokens=self.config.jump_forward_window,
        )

    async def run_step(self, state: SessionState, step: pb.MaskStep) -> pb.MaskStepResult:
        """Apply one step to a session (the Masks stream's body, usable in-process). Raises
        StepFormatError for a malformed step."""
        t0 = time.perf_counter()
        ops = parse_step(step)
        for b in ops.binds:  # one line per matcher bound, naming its request
            log.debug("bind", rid=b.rid, handle=b.handle, replay=len(b.replay), error=b.error)
        compiled = await self._compile_binds(ops)  # bounded by --compile-timeout-s
        progress = self.progress
        if progress is not None:
            progress.begin()
        try:
            if not ops.binds and ops.weight() <= self.config.inline_step_weight:
                result = self.engine.run(state, ops, compiled)
            else:
                loop = asyncio.get_running_loop()
                result = await loop.run_in_executor(
                    self._pool, self.engine.run, state, ops, compiled
                )
        finally:
            if progress is not None:
                progress.end()
        state.steps += 1
        seconds = time.perf_counter() - t0
        result.service_ms = seconds * 1e3
        if self.metrics is not None:
            self.metrics.mask_time.observe(seconds)
        return result

    async def _compile_binds(self, ops: StepOps) -> dict[GrammarKey, xgr.CompiledGrammar | str]:
        """Every distinct grammar the step binds, compiled concurrently (usually cache hits:
        the scheduler compiles at submission)."""
        keys = list(dict.fromkeys(b.key for b in ops.binds if b.key is not None))
        if not keys:
            return {}
        got = await asyncio.gather(*(self.cache.get(*k) for k in keys), return_exceptions=True)
        out: dict[GrammarKey, xgr.CompiledGrammar | str] = {}
        for key, res in zip(keys, got, strict=True):
            if isinstance(res, GrammarError):
                out[key] = str(res)
            elif isinstance(res, BaseException):
                raise res
            else:
                out[key] = res[0]
        return out

    async def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.cache.close()


def build_servicer(tokenizer: Any, config: GrammarConfig | None = None) -> GrammarServicer:
    """A servicer from a tokenizer folder, "default", or a loaded HF tokenizer."""
    config = config or GrammarConfig()
    return GrammarServicer(load_tokenizer(tokenizer), config)


def register(server: grpc.aio.Server, servicer: GrammarServicer) -> list[str]:
    pb_grpc.add_GrammarServicer_to_server(servicer, server)
    return [SERVICE_NAME]


async def serve(config: GrammarConfig) -> None:
    """Run the grammar service until SIGTERM/SIGINT with the shared bootstrap."""
    from services.server import Listen, run_server

    servicer = build_servicer(config.tokenizer, config)
    dog = Watchdog()
    servicer.progress = dog.progress("mask step", config.watchdog_s)
    if config.metrics_port:
        servicer.metrics = GrammarMetrics(servicer.cache.stats)
        servicer.cache.on_compiled = servicer.metrics.compile_time.observe
        servicer.metrics.serve(config.host, config.metrics_port, "grammar")
    log.info(
        "grammar_ready",
        backend=servicer.backend,
        vocab_size=servicer.engine.vocab_size,
        stop_token_ids=servicer.engine.stop_token_ids,
    )
    await run_server(
        "grammar",
        config.host,
        config.port,
        register=lambda server, _health: register(server, servicer),
        on_stop=servicer.close,
        listen=Listen(health_port=config.health_port),
        watchdog=dog,
        grace_s=config.shutdown_grace_s,
    )
