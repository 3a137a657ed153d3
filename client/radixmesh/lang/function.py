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
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from radixmesh.lang.backend import Backend, Completion
from radixmesh.lang.compiler import ProgramGraph
from radixmesh.lang.config import get_default_backend, global_config
from radixmesh.lang.context import ProgramContext, usage_of
from radixmesh.lang.errors import TracingError
from radixmesh.lang.interpreter import StreamExecutor
from radixmesh.lang.params import GenParams, params_from_kwargs, split_sampling
from radixmesh.lang.roles import RoleRenderer
from radixmesh.lang.state import ProgramState
from radixmesh.lang.tracer import TracerState, active_builder, trace_call, trace_program

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

    def __init__(
        self,
        func: Callable[..., Any],
        *,
        num_api_spec_tokens: int | None = None,
        bind_arguments: Mapping[str, Any] | None = None,
    ) -> None:
        self.func = func
        self.name = getattr(func, "__name__", "program")
        params = list(inspect.signature(func).parameters.values())
        if not params:
            raise TypeError(f"{self.name} must take the prompt state as its first parameter")
        if num_api_spec_tokens is not None and num_api_spec_tokens < 1:
            raise ValueError("num_api_spec_tokens must be >= 1")
        self.num_api_spec_tokens = num_api_spec_tokens
        self.bind_arguments: dict[str, Any] = dict(bind_arguments or {})
        self.arg_names = tuple(p.name for p in params[1:])
        self._graph: ProgramGraph | None = None
        self._trace_error: TracingError | None = None
        self.__doc__ = func.__doc__
        self.__wrapped__ = func

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """On a prompt state (`other(s, ...)` inside a program): runs as a subroutine on that
        state. Otherwise starts a run, as SGLang does: `prog(question="...")` is `prog.run(...)`;
        while another program is traced, that call is traced into its graph (`trace_call`).
        """
        if args and isinstance(args[0], ProgramState | TracerState):
            return self.func(*args, **kwargs)
        if active_builder() is not None:  # called while another program is traced
            return trace_call(self.func, self.name, self.arg_names, self._arguments(args, kwargs))
        return self.run(*args, **kwargs)

    def bind(self, **kwargs: Any) -> SglFunction:
        """A copy of the program with some arguments fixed (SGLang's `bind`)."""
        unknown = [k for k in kwargs if k not in self.arg_names]
        if unknown:
            raise TypeError(f"{self.name} has no parameters {unknown}")
        return SglFunction(
            self.func,
            num_api_spec_tokens=self.num_api_spec_tokens,
            bind_arguments={**self.bind_arguments, **kwargs},
        )

    def _arguments(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """Positional and keyword program arguments (plus bound ones) as keywords."""
        free = [a for a in self.arg_names if a not in self.bind_arguments]
        if len(args) > len(free):
            raise TypeError(f"{self.name} takes {len(free)} positional arguments, got {len(args)}")
        out = dict(zip(free, args, strict=False))
        for key, value in kwargs.items():
            if key in out:
                raise TypeError(f"{self.name} got multiple values for argument {key!r}")
            out[key] = value
        out.update(self.bind_arguments)
        return out

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
        ctx = ProgramContext.create(
            backend, defaults, stream=stream, spec_tokens=self.num_api_spec_tokens
        )
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
            (),
            self._arguments(args, program_kwargs),
            defaults,
            stream=stream,
            reraise=not stream,  # a streamed body's error surfaces through the state
        )

    def run_batch(
        self,
        batch_kwargs: Sequence[Mapping[str, Any] | Sequence[Any]],
        *,
        backend: Backend | None = None,
        num_threads: int | str = "auto",
        progress_bar: bool | Progress = False,
        generator_style: bool = False,
        **sampling: Any,
    ) -> Any:
        """Runs one program per item (a kwargs mapping, or a tuple of positional arguments);
        returns their finished states in input order.

        Up to `num_threads` programs run at once ("auto": min(batch size,
        global_config.default_num_threads); 1 when frontend parallelism is disabled).
        A failing request does not stop the others: its state raises on read. An exception
        raised by a program body itself is re-raised here (the first in input order) once
        every program has finished, as SGLang does. Keyword arguments must be sampling knobs
        (a misspelt one is a TypeError). With the frontend hint on and more than one program,
        the program's traced constant prefix is first sent once as a prefix-only request.
        `progress_bar`: True for a bar on stderr, or a callable (done, total).
        `generator_style=True` returns an iterator yielding the states in input order, each
        as soon as it (and those before it) finished.
        """
        backend = backend or get_default_backend()
        batch_defaults = params_from_kwargs(sampling)
        items = [self._batch_item(item) for item in batch_kwargs]
        total = len(items)
        if not global_config.enable_parallelism:
            workers = 1
        elif num_threads == "auto":
            workers = max(1, min(total, global_config.default_num_threads))
        else:
            workers = max(1, int(num_threads))
        prefix_warm = None
        if global_config.enable_fork_hint and total > 1:
            prefix_warm = self._warm_prefix(backend)

        report: Progress | None = None
        if callable(progress_bar):
            report = progress_bar
        elif progress_bar:
            report = _ProgressPrinter(total)
        lock = threading.Lock()
        done = 0

        def job(i: int) -> ProgramState:
            nonlocal done
            kwargs, own = split_sampling(items[i], set(self.arg_names))
            defaults = own.merged_over(batch_defaults)
            state = self._start(backend, (), kwargs, defaults, stream=False, reraise=False)
            state.wait()
            with lock:
                done += 1
                if report is not None:
                    report(done, total)
            return state

        if generator_style:
            return self._batch_iter(job, total, workers)
        result = BatchResult()
        result.prefix_warm = prefix_warm
        result.extend(self._batch_iter(job, total, workers))
        for state in result:
            if state._executor.program_error is not None:
                raise state._executor.program_error
        return result

    def _batch_item(self, item: Mapping[str, Any] | Sequence[Any]) -> dict[str, Any]:
        if isinstance(item, Mapping):
            return self._arguments((), item)
        if isinstance(item, list | tuple):
            return self._arguments(item, {})
        raise TypeError(f"run_batch items must be dicts or tuples, not {type(item).__name__}")

    @staticmethod
    def _batch_iter(
        job: Callable[[int], ProgramState], total: int, workers: int
    ) -> Iterator[ProgramState]:
        if workers == 1:
            for i in range(total):
                yield job(i)
            return
        with ThreadPoolExecutor(workers, thread_name_prefix="radixmesh-batch") as pool:
            futures = [pool.submit(job, i) for i in range(total)]
            for future in futures:
                yield future.result()

    def cache(self, backend: Backend | None = None) -> Completion | None:
        """Sends the program's constant prefix once as a prefix-only request (SGLang's
        `cache`), so that later runs hit the radix cache."""
        return self._warm_prefix(backend or get_default_backend())

    def compile(self, *, backend: Backend | None = None) -> ProgramGraph:
        """SGLang's `compile`: the traced graph, which runs without re-running Python
        (`graph.run(...)`, `graph.run_batch(...)`)."""
        return self.trace()

    def trace(self, *, backend: Backend | None = None, **bound: Any) -> ProgramGraph:
        """The program's graph; parameters not given in `bound` are abstract arguments.
        `backend` is accepted for SGLang's signature (tracing needs none)."""
        bound = {**self.bind_arguments, **bound}
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
        except TracingError:  # data-dependent program: warm what precedes the dependency
            bound = self.bind_arguments
            graph = trace_program(self.func, self.name, self.arg_names, bound, partial=True)
        info: list[RoleRenderer] = []

        def renderer() -> RoleRenderer:
            if not info:
                info.append(RoleRenderer(backend.model_info()))
            return info[0]

        try:
            prefix = graph.constant_prefix(renderer)
            if not prefix:
                return None
            warm = backend.warm(prefix)
            usage = usage_of(backend)
            if usage is not None:
                usage.add(warm)
            return warm
        except Exception:  # the warm-up only saves compute; never fail the batch for it
            log.warning("run_batch prefix warm-up failed", exc_info=True)
            return None

    def __repr__(self) -> str:
        return f"<radixmesh function {self.name}({', '.join(self.arg_names)})>"


def function(
    func: Callable[..., Any] | None = None, *, num_api_spec_tokens: int | None = None
) -> Any:
    """Decorator: `@rm.function def prog(s, question): s += ...`, or
    `@rm.function(num_api_spec_tokens=64)` for API speculative execution
    (`radixmesh.lang.speculation`)."""
    if func is not None:
        return SglFunction(func, num_api_spec_tokens=num_api_spec_tokens)

    def decorate(f: Callable[..., Any]) -> SglFunction:
        return SglFunction(f, num_api_spec_tokens=num_api_spec_tokens)

    return decorate
