"""The prompt state `s` a program manipulates (SGLang's ProgramState).

`s += x` submits `x` (text or primitives) to the state's stream and returns at once;
`s["name"]`, `s.text()` and `s.messages()` wait for what they read. See `interpreter.py`
for ordering and error semantics.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any, overload

from radixmesh.lang.backend import Completion
from radixmesh.lang.errors import BackendError
from radixmesh.lang.interpreter import StreamExecutor
from radixmesh.lang.ir import Expr, RoleBegin, RoleEnd, flatten
from radixmesh.lang.scoring import SelectResult
from radixmesh.lang.stats import ProgramStats


class ProgramState:
    """One prompt stream of a running program (the root state or a fork)."""

    def __init__(self, executor: StreamExecutor) -> None:
        self._executor = executor
        self.ret_value: Any = None  # what the program function returned (root state)

    # ---- building the prompt ----------------------------------------------------------

    def __iadd__(self, other: Expr | str) -> ProgramState:
        self._executor.submit(flatten(other))
        return self

    def extend(self, other: Expr | str) -> None:
        """Same as `s += other`."""
        self._executor.submit(flatten(other))

    @contextmanager
    def _role(self, role: str) -> Iterator[ProgramState]:
        self._executor.submit([RoleBegin(role)])
        yield self
        self._executor.submit([RoleEnd(role)])

    def system(self) -> AbstractContextManager[ProgramState]:
        """`with s.system(): s += ...` wraps what is appended in system markers."""
        return self._role("system")

    def user(self) -> AbstractContextManager[ProgramState]:
        return self._role("user")

    def assistant(self) -> AbstractContextManager[ProgramState]:
        return self._role("assistant")

    def fork(self, size: int = 1) -> ForkGroup:
        """`size` branches that start from this prompt as of now and run in parallel.

        With the frontend hint on (the default), the shared prefix is sent first as a
        prefix-only request so that every branch hits the radix cache.
        """
        return ForkGroup(self._executor, [ProgramState(e) for e in self._executor.fork(size)])

    # ---- reading (these wait) ---------------------------------------------------------

    def __getitem__(self, name: str) -> Any:
        """The value of variable `name`: str for gen/select, list for a gathered join."""
        return self._executor.get(name)

    def get_var(self, name: str) -> Any:
        return self._executor.get(name)

    def get_meta_info(self, name: str) -> Completion | SelectResult | None:
        """The Completion (gen: cached_tokens, finish_reason, ...) or SelectResult (select:
        per-choice scores) behind variable `name`."""
        meta = self._executor.meta(name)
        return meta if isinstance(meta, Completion | SelectResult) else None

    def text(self) -> str:
        """The whole prompt so far; raises ProgramError if an op of this stream failed."""
        return self._executor.text()

    def messages(self) -> list[dict[str, str]]:
        """The chat messages (role, content) closed so far."""
        return self._executor.messages()

    def text_iter(self, var_name: str | None = None) -> Iterator[str]:
        """Text as it is produced (gen streams token chunks when run with stream=True),
        only variable `var_name`'s when given; ends when the program returns."""
        yield from self._executor.chunks(var_name)

    def sync(self) -> None:
        """Waits for every op submitted to this state so far (not its forks)."""
        self._executor.sync()

    def wait(self) -> ProgramState:
        """Waits for this state and every fork of it; returns self."""
        self._executor.sync_tree()
        return self

    def error(self) -> BaseException | None:
        """The root cause of this stream's first failure (or the program body's exception),
        None if there is none; waits for this stream's submitted ops first. The chain stops at
        a BackendError (the runtime's status and message), never at transport internals."""
        self._executor.sync()
        try:
            self._executor.raise_if_failed()
        except Exception as exc:  # reported, not handled
            root: BaseException = exc
            while root.__cause__ is not None and not isinstance(root, BackendError):
                root = root.__cause__
            return root
        return None

    # ---- accounting -------------------------------------------------------------------

    @property
    def stats(self) -> ProgramStats:
        """Requests of the whole program (shared by all its states) finished so far."""
        return self._executor.ctx.stats

    @property
    def prompt_tokens(self) -> int:
        return self.stats.prompt_tokens()

    @property
    def cached_tokens(self) -> int:
        return self.stats.cached_tokens()

    @property
    def cache_hit_rate(self) -> float:
        return self.stats.cache_hit_rate()

    def __repr__(self) -> str:
        return f"ProgramState(stream={self._executor.id})"


class ForkGroup(Sequence[ProgramState]):
    """The branches of one `fork`; `join` merges them back into the parent."""

    def __init__(self, parent: StreamExecutor, states: list[ProgramState]) -> None:
        self._parent = parent
        self._states = states

    @overload
    def __getitem__(self, index: int) -> ProgramState: ...
    @overload
    def __getitem__(self, index: slice) -> list[ProgramState]: ...
    def __getitem__(self, index: int | slice) -> ProgramState | list[ProgramState]:
        return self._states[index]

    def __len__(self) -> int:
        return len(self._states)

    def __iadd__(self, other: Expr | str | Sequence[Expr | str]) -> ForkGroup:
        """Appends `other` to every branch, or element i to branch i for a sequence."""
        if isinstance(other, Expr | str):
            for state in self._states:
                state += other
            return self
        items = list(other)
        if len(items) != len(self._states):
            raise ValueError(f"{len(items)} items for {len(self._states)} branches")
        for state, item in zip(self._states, items, strict=True):
            state += item
        return self

    def values(self, name: str) -> list[Any]:
        """Variable `name` of every branch (waits)."""
        return [s[name] for s in self._states]

    def join(self, mode: str = "gather") -> None:
        """Ends the branches. "gather": each variable set in the branches becomes, in the
        parent, the list of branch values; "concat": the branches' new text is appended to
        the parent in branch order. Does not block."""
        self._parent.join([s._executor for s in self._states], mode)
