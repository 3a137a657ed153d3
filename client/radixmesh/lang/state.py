"""The prompt state `s` a program manipulates (SGLang's ProgramState).

`s += x` submits `x` (text or primitives) to the state's stream and returns at once;
`s["name"]`, `s.text()` and `s.messages()` wait for what they read. See `interpreter.py`
for ordering and error semantics.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from radixmesh.lang.errors import BackendError
from radixmesh.lang.forks import BranchGroup
from radixmesh.lang.interpreter import StreamExecutor
from radixmesh.lang.ir import Expr, RoleBegin, RoleEnd, VarScopeBegin, VarScopeEnd, flatten
from radixmesh.lang.meta import MetaInfo
from radixmesh.lang.stats import ProgramStats

#: SGLang's join mode names, mapped to RadixMesh's.
JOIN_MODES = {
    "gather": "gather",
    "gather_variable": "gather",
    "concat": "concat",
    "concate_and_append": "concat",
}


def join_mode(mode: str) -> str:
    if mode not in JOIN_MODES:
        raise ValueError(f"invalid join mode {mode!r}; expected one of {sorted(JOIN_MODES)}")
    return JOIN_MODES[mode]


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
    def _role_scope(self, role: str) -> Iterator[ProgramState]:
        self._executor.submit([RoleBegin(role)])
        yield self
        self._executor.submit([RoleEnd(role)])

    def _role(self, role: str, expr: Expr | str | None) -> Any:
        if expr is None:
            return self._role_scope(role)
        self._executor.submit([RoleBegin(role), *flatten(expr), RoleEnd(role)])
        return None

    def system(self, expr: Expr | str | None = None) -> Any:
        """`s.system(x)` appends x in system markers; `with s.system(): s += ...` wraps what
        is appended inside the block."""
        return self._role("system", expr)

    def user(self, expr: Expr | str | None = None) -> Any:
        return self._role("user", expr)

    def assistant(self, expr: Expr | str | None = None) -> Any:
        return self._role("assistant", expr)

    @contextmanager
    def var_scope(self, name: str) -> Iterator[ProgramState]:
        """`with s.var_scope("x"): s += ...` stores the text appended in the block as s["x"]."""
        self._executor.submit([VarScopeBegin(name)])
        yield self
        self._executor.submit([VarScopeEnd(name)])

    def fork(self, size: int = 1, position_ids_offset: Sequence[int] | None = None) -> ForkGroup:
        """`size` branches that start from this prompt as of now and run in parallel.

        With the frontend hint on (the default), the shared prefix is sent first as a
        prefix-only request so that every branch hits the radix cache. `position_ids_offset`
        is accepted and ignored, as SGLang's interpreter does.
        """
        return ForkGroup(self._executor, [ProgramState(e) for e in self._executor.fork(int(size))])

    @contextmanager
    def copy(self) -> Iterator[ProgramState]:
        """`with s.copy() as c:` a one-branch fork, joined (gather) when the block ends."""
        group = self.fork(1)
        try:
            yield group[0]
        finally:
            group.join()

    # ---- reading (these wait) ---------------------------------------------------------

    def __getitem__(self, name: str) -> Any:
        """The value of variable `name`: str for gen/select, list for a gathered join."""
        return self._executor.get(name)

    def get_var(self, name: str) -> Any:
        return self._executor.get(name)

    def __setitem__(self, name: str, value: Any) -> None:
        """`s[name] = value` sets a variable directly (it is not appended to the prompt)."""
        self._executor.set_var(name, value)

    def set_var(self, name: str, value: Any) -> None:
        self._executor.set_var(name, value)

    def __contains__(self, name: str) -> bool:
        return self._executor.has_var(name)

    def get_meta_info(self, name: str) -> MetaInfo | None:
        """SGLang's meta-info dict of gen/select variable `name` (see `radixmesh.lang.meta`);
        attribute reads go to the Completion / SelectResult behind it."""
        meta = self._executor.meta(name)
        return meta if isinstance(meta, MetaInfo) else None

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

    async def text_async_iter(
        self, var_name: str | None = None, return_meta_data: bool = False
    ) -> AsyncIterator[Any]:
        """`text_iter` for asyncio code: chunks are read on a worker thread, so the event
        loop never blocks. With `return_meta_data` (and a variable) yields (chunk, meta)."""
        loop = asyncio.get_running_loop()
        chunks = self._executor.chunks(var_name)
        done = object()
        while True:
            chunk = await loop.run_in_executor(None, next, chunks, done)
            if chunk is done:
                return
            if return_meta_data and var_name is not None:
                meta = await loop.run_in_executor(None, self._executor.meta, var_name)
                yield chunk, meta
            else:
                yield chunk

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


class ForkGroup(BranchGroup[ProgramState]):
    """The branches of one `fork` (indexing, `+=`, `values`: `forks.BranchGroup`); `join`
    merges them back into the parent."""

    def __init__(self, parent: StreamExecutor, states: list[ProgramState]) -> None:
        super().__init__(states)
        self._parent = parent

    def join(self, mode: str = "gather_variable") -> None:
        """Ends the branches. "gather": each variable set in the branches becomes, in the
        parent, the list of branch values; "concat": the branches' new text is appended to
        the parent in branch order. SGLang's names "gather_variable" and
        "concate_and_append" are the same modes. Does not block."""
        self._parent.join([s._executor for s in self._states], join_mode(mode))
