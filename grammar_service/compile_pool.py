"""Compile worker processes: bounded in time and memory, killable, fairly scheduled.

`CompilePool.compile(kind, text)` runs one compile in a worker process
(grammar_service/compile_worker.py) and returns the CompiledGrammar, deserialized here.

Bounds (each message names the flag that sets it):
- time: a compile running longer than `timeout_s` (--compile-timeout-s) is killed with its
  worker, and refused;
- memory: a worker's address space is capped at its start size + `memory_mb`
  (--compile-memory-mb); a compile that hits it fails and the worker is replaced;
- nobody waiting: cancelling `compile` (every waiter left: see CompileCache.get) kills the
  worker that runs it, or drops it from the queue.

Fairness: queued compiles run shortest text first (a proxy for cost that needs no compile),
and when there are two or more workers the last one only takes grammars of at most
`small_chars` characters, so a trivial grammar never waits behind big ones that fill every
other worker: at worst behind one other small grammar, itself bounded by the deadline.

Workers are forked by a multiprocessing forkserver that preloads xgrammar (a fresh Python with
torch takes seconds to start; a fork takes milliseconds), so replacing a killed worker is cheap.
As with any multiprocessing start method but fork, a program run as a plain script re-imports
itself in each worker (`python -m pkg` does not): such scripts need `if __name__ == "__main__"`.
Cold compiles of the 24 suite grammars, 2 shared cores: total 2.0-2.7 s in workers vs 1.8-2.0 s
in-process (the compiled grammar crosses the pipe as JSON).

Invariants:
- The queue, `_idle` and every job's future are touched on the event loop thread only; a
  worker's process and pipe are used by one executor thread at a time (the job it runs), and
  the loop thread only sends it SIGKILL, which ends that thread's wait with EOF.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import multiprocessing as mp
import os
import signal
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import structlog
import xgrammar as xgr

from grammar_service.compile_worker import worker_main
from grammar_service.kinds import GrammarError, GrammarKind

log = structlog.get_logger(__name__)

START_TIMEOUT_S = 120.0  # the forkserver's first start imports torch (xgrammar needs it)
_CTX = mp.get_context("forkserver")
_CTX.set_forkserver_preload(["grammar_service.compile_worker"])


@dataclass(eq=False)
class _Job:
    kind: GrammarKind
    text: str
    fut: asyncio.Future[tuple[str, Any]]
    worker: _Worker | None = None
    cancelled: bool = False


@dataclass(eq=False)
class _Worker:
    pool: CompilePool
    small_only: bool
    proc: Any = None
    conn: Any = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def ensure(self) -> None:
        """Start the process if it is not running (blocking: executor threads only)."""
        with self.lock:
            if self.proc is not None and self.proc.is_alive():
                return
            self._reap()
            ours, theirs = _CTX.Pipe()
            p = self.pool
            self.proc = _CTX.Process(
                target=worker_main,
                args=(theirs, p.tokenizer_json, p.threads, p.memory_bytes, *p.flags),
                name="grammar-compile",
                daemon=True,
            )
            self.proc.start()
            theirs.close()
            self.conn = ours
            if not ours.poll(START_TIMEOUT_S) or ours.recv()[0] != "ready":
                self._reap()
                raise RuntimeError(f"compile worker not ready within {START_TIMEOUT_S:g} s")
            log.debug("compile_worker_started", pid=self.proc.pid, small_only=self.small_only)

    def _reap(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.join()
            self.conn.close()
        self.proc = self.conn = None

    def call(self, kind: GrammarKind, text: str, timeout_s: float) -> tuple[str, Any]:
        """One compile: ("ok", CompiledGrammar) or (status, message) with status "error",
        "memory", "timeout" or "died". Runs in an executor thread."""
        self.ensure()
        conn = self.conn
        try:
            conn.send((kind.value, text))
            if not conn.poll(timeout_s if timeout_s > 0 else None):
                with self.lock:
                    self._reap()
                return "timeout", ""
            status, payload = conn.recv()
        except (EOFError, OSError):
            with self.lock:
                code = self.proc.exitcode if self.proc is not None else None
                self._reap()
            return "died", f"exit code {code}"
        if status == "ok":
            return status, xgr.CompiledGrammar.deserialize_json(payload, self.pool.tokenizer_info)
        if status == "memory":
            with self.lock:
                self._reap()
        return status, payload

    def kill(self) -> None:
        """From the loop thread: end the running compile now (its thread sees EOF)."""
        proc = self.proc
        if proc is not None and proc.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)


class CompilePool:
    def __init__(
        self,
        tokenizer_info: xgr.TokenizerInfo,
        *,
        workers: int = 2,
        threads: int = 1,
        timeout_s: float = 20.0,
        memory_mb: int = 2048,
        small_chars: int = 2048,
        any_whitespace: bool = False,
        pattern_strings: bool = True,
    ) -> None:
        self.tokenizer_info = tokenizer_info
        self.tokenizer_json = tokenizer_info.serialize_json()
        self.threads = max(1, threads)
        self.timeout_s = timeout_s
        self.memory_mb = memory_mb
        self.memory_bytes = memory_mb << 20
        self.small_chars = small_chars
        self.flags = (any_whitespace, pattern_strings)
        n = max(1, workers)
        self._workers = [_Worker(self, small_only=n >= 2 and i == n - 1) for i in range(n)]
        self._idle = list(self._workers)
        self._queue: list[tuple[int, int, _Job]] = []
        self._seq = itertools.count()
        self._io = ThreadPoolExecutor(n, thread_name_prefix="compile-io")
        for w in self._workers:  # start the processes in the background
            self._io.submit(w.ensure)

    @property
    def queued(self) -> int:
        return sum(1 for *_, j in self._queue if not j.cancelled)

    async def compile(self, kind: GrammarKind, text: str) -> xgr.CompiledGrammar:
        """The compiled grammar; GrammarError (with the limit's flag where one was hit).
        Cancelling this call kills the compile."""
        job = _Job(kind, text, asyncio.get_running_loop().create_future())
        heapq.heappush(self._queue, (len(text), next(self._seq), job))
        self._dispatch()
        try:
            status, payload = await job.fut
        except asyncio.CancelledError:
            job.cancelled = True
            if job.worker is not None:
                log.info("compile_cancelled", kind=kind.value, chars=len(text))
                job.worker.kill()
            raise
        if status == "ok":
            return payload  # type: ignore[no-any-return]
        if status == "error":
            raise GrammarError(payload)
        if status == "timeout":
            raise GrammarError(
                f"grammar compile took longer than {self.timeout_s:g} s, the grammar service's "
                "limit (--compile-timeout-s): simplify the grammar (fewer or shorter bounded "
                "strings, less nesting) or ask the operator to raise the limit"
            )
        why = "needed" if status == "memory" else f"died ({payload}), most likely needing"
        raise GrammarError(
            f"grammar compile {why} more than {self.memory_mb} MiB, the grammar service's "
            "limit (--compile-memory-mb): simplify the grammar or ask the operator to raise "
            "the limit"
        )

    def _dispatch(self) -> None:
        while self._queue and self._idle:
            length, _, job = self._queue[0]
            if job.cancelled:
                heapq.heappop(self._queue)
                continue
            w = next((w for w in self._idle if not w.small_only), None)
            if w is None and length <= self.small_chars:
                w = next((w for w in self._idle if w.small_only), None)
            if w is None:
                return  # only the small lane is free and the shortest job is too big for it
            heapq.heappop(self._queue)
            self._idle.remove(w)
            job.worker = w
            asyncio.get_running_loop().create_task(self._run(w, job))

    async def _run(self, w: _Worker, job: _Job) -> None:
        loop = asyncio.get_running_loop()
        try:
            res = await loop.run_in_executor(self._io, w.call, job.kind, job.text, self.timeout_s)
        except Exception as exc:  # a broken pipe while starting, say: this job fails alone
            log.exception("compile_worker_failed", kind=job.kind.value)
            res = ("died", repr(exc))
        finally:
            self._idle.append(w)
            self._dispatch()
        if res[0] in ("timeout", "memory", "died") and not job.cancelled:
            log.warning("compile_bounded", kind=job.kind.value, chars=len(job.text), why=res[0])
        if not job.fut.done():
            job.fut.set_result(res)

    def close(self) -> None:
        for w in self._workers:
            w.kill()
        self._io.shutdown(wait=False, cancel_futures=True)
