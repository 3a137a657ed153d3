"""`@function`: turns a Python function `f(s, ...)` into a runnable SGLang program.

`run` executes it in interpreter mode; `run_batch` runs many instances concurrently (after
warming the radix cache once with the program's traced constant prefix); `trace` returns
its compiler-mode graph.
"""

from __future__ import annotations

import inspect
import logging
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from radixmesh.lang.backend import Backend, Completion
from radixmesh.lang.compiler import ProgramGraph
from radixmesh.lang.config import get_default_backend, global_config
from radixmesh.lang.context import ProgramContext
from radixmesh.lang.errors import TracingError
from radixmesh.lang.interpreter import StreamExecutor
from radixmesh.lang.params import GenParams, split_sampling
from radixmesh.lang.roles import RoleRenderer
from radixmesh.lang.state import ProgramState
from radixmesh.lang.tracer import trace_program

log = logging.getLogger(__name__)

Progress = Callable[[int, int], None]


class BatchResult(list[ProgramState]):
    """The states of a `run_batch`, in input order, plus the batch's prefix warm-up."""

    prefix_warm: Completion | None = None

    def prompt_tokens(self) -> int:
        warm = self.prefix_warm.prompt_tokens if self.prefix_warm else 0
        return warm + sum(s.prompt_tokens for s in self)

    def cached_tokens(self) -> int:
        warm = self.prefix_warm.cached_tokens if self.prefix_warm else 0
        return warm + sum(s.cached_tokens for s in self)

    def cache_hit_rate(self) -> float:
        prompt = self.prompt_tokens()
        return self.cached_tokens() / prompt if prompt else 0.0


class _ProgressPrinter:
    """Fallback progress bar on stderr (tqdm is used when installed)."""

    def __init__(self, total: int) -> None:
        self.total = total
        try:
            from tqdm import tqdm

            self._bar: Any = tqdm(total=total)
        except ImportError:
            self._bar = None

    def __call__(self, done: int, total: int) -> None:
        if self._bar is not None:
            self._bar.update(1)
            if done == total:
                self._bar.close()
        else:
            end = "\n" if done == total else ""
            print(f"\r{done}/{total} programs", end=end, file=sys.stderr, flush=True)


class SglFunction:
    """A program: the decorated function plus its run / run_batch / trace entry points."""

    def __init__(self, func: Callable[..., Any]) -> None:
        self.func = func
        self.name = getattr(func, "__name__", "program")
        params = list(inspect.signature(func).parameters.values())
        if not params:
            raise TypeError(f"{self.name} must take the prompt state as its first parameter")
        self.arg_names = tuple(p.name for p in params[1:])
        self._graph: ProgramGraph | None = None
        self._trace_error: TracingError | None = None
        self.__doc__ = func.__doc__
        self.__wrapped__ = func

    def __call__(self, s: Any, *args: Any, **kwargs: Any) -> Any:
        """Calls the program as a subroutine on an existing state (no new program)."""
        return self.func(s, *args, **kwargs)

    def _start(
        self,
        backend: Backend,
        args: Sequence[Any],
        kwargs: Mapping[str, Any],
        defaults: GenParams,
        *,
        stream: bool,
        reraise: bool,
    ) -> ProgramState:
        ctx = ProgramContext.create(backend, defaults, stream=stream)
        state = ProgramState(StreamExecutor(ctx))

        def body() -> None:
            try:
                state.ret_value = self.func(state, *args, **kwargs)
            except BaseException as exc:
                state._executor.program_error = exc
                if reraise:
                    raise
            finally:
                state._executor.end()

        if stream:
            threading.Thread(target=body, name=f"radixmesh-{self.name}", daemon=True).start()
        else:
            body()
        return state

    def run(
        self, *args: Any, backend: Backend | None = None, stream: bool = False, **kwargs: Any
    ) -> ProgramState:
        """Runs the program; returns its root state once the body has *submitted* its ops.

        Keyword arguments that are not parameters of the program but name sampling knobs
        (temperature, max_new_tokens / max_tokens, stop, ...) are defaults for every gen.
        With stream=True the body runs on its own thread and `state.text_iter()` streams.
        An exception in the body is raised here (stream=False) or by reads (stream=True).
        """
        program_kwargs, defaults = split_sampling(kwargs, set(self.arg_names))
        return self._start(
            backend or get_default_backend(),
            args,
            program_kwargs,
            defaults,
            stream=stream,
            reraise=not stream,  # a streamed body's error surfaces through the state
        )

    def run_batch(
        self,
        batch_kwargs: Sequence[Mapping[str, Any]],
        *,
        backend: Backend | None = None,
        num_threads: int | str = "auto",
        progress_bar: bool | Progress = False,
        **sampling: Any,
    ) -> BatchResult:
        """Runs one program per kwargs mapping; returns their finished states in input order.

        Up to `num_threads` programs run at once ("auto": min(batch size,
        global_config.default_num_threads); 1 when frontend parallelism is disabled).
        A failing program does not stop the others: its state raises on read.
        With the frontend hint on and more than one program, the program's traced constant
        prefix is first sent once as a prefix-only request.
        `progress_bar`: True for a bar on stderr, or a callable (done, total).
        """
        backend = backend or get_default_backend()
        _, batch_defaults = split_sampling(sampling, set())
        total = len(batch_kwargs)
        if not global_config.enable_parallelism:
            workers = 1
        elif num_threads == "auto":
            workers = max(1, min(total, global_config.default_num_threads))
        else:
            workers = max(1, int(num_threads))
        result = BatchResult()
        if global_config.enable_fork_hint and total > 1:
            result.prefix_warm = self._warm_prefix(backend)

        report: Progress | None = None
        if callable(progress_bar):
            report = progress_bar
        elif progress_bar:
            report = _ProgressPrinter(total)
        states: list[ProgramState | None] = [None] * total
        lock = threading.Lock()
        done = 0

        def job(i: int) -> None:
            nonlocal done
            kwargs, own = split_sampling(batch_kwargs[i], set(self.arg_names))
            defaults = own.merged_over(batch_defaults)
            state = self._start(backend, (), kwargs, defaults, stream=False, reraise=False)
            states[i] = state.wait()
            with lock:
                done += 1
                if report is not None:
                    report(done, total)

        if workers == 1:
            for i in range(total):
                job(i)
        else:
            with ThreadPoolExecutor(workers, thread_name_prefix=f"{self.name}-batch") as pool:
                for future in [pool.submit(job, i) for i in range(total)]:
                    future.result()
        result.extend(s for s in states if s is not None)
        return result

    def trace(self, **bound: Any) -> ProgramGraph:
        """The program's graph; parameters not given in `bound` are abstract arguments."""
        if bound:
            return trace_program(self.func, self.name, self.arg_names, bound)
        if self._graph is None and self._trace_error is None:
            try:
                self._graph = trace_program(self.func, self.name, self.arg_names, {})
            except TracingError as exc:
                self._trace_error = exc
        if self._trace_error is not None:
            raise self._trace_error
        assert self._graph is not None
        return self._graph

    def _warm_prefix(self, backend: Backend) -> Completion | None:
        try:
            graph = self.trace()
        except TracingError:
            return None  # data-dependent program: no static prefix to warm
        info: list[RoleRenderer] = []

        def renderer() -> RoleRenderer:
            if not info:
                info.append(RoleRenderer(backend.model_info()))
            return info[0]

        try:
            prefix = graph.constant_prefix(renderer)
            return backend.warm(prefix) if prefix else None
        except Exception:  # the warm-up only saves compute; never fail the batch for it
            log.warning("run_batch prefix warm-up failed", exc_info=True)
            return None

    def __repr__(self) -> str:
        return f"<radixmesh function {self.name}({', '.join(self.arg_names)})>"


def function(func: Callable[..., Any]) -> SglFunction:
    """Decorator: `@rm.function def prog(s, question): s += ...`."""
    return SglFunction(func)
