"""Interpreter mode: every prompt state is an asynchronous stream (paper section 2).

A `StreamExecutor` owns one prompt. Submitting an op (`submit`, `fork`, `join`, `end`)
returns at once; a worker thread executes the stream's ops strictly in submission order.
Reading a variable waits for the op that produces it. With parallelism disabled
(`ProgramContext.parallel=False`) ops run synchronously on the submitting thread instead.

Invariants:
- Ops of one stream run in submission order; different streams run concurrently.
- A named gen/select registers its variable's Future at submission, so a read issued after
  the submission waits for exactly that op (program order), never for a stale value.
- After an op fails, the stream is poisoned: its later ops are skipped, and every Future they
  would resolve fails with a `ProgramError` whose cause chain ends at the original error.
  Forks inherit the failure of their parent's prefix; a join inherits its branches'.
- Worker-owned fields (`_text`, `_messages`, role state) are written only by the op being
  executed; readers see them after `sync()`. `_pending` counts submitted, unfinished ops.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from typing import Any

from radixmesh.lang.context import ProgramContext
from radixmesh.lang.errors import ProgramError
from radixmesh.lang.gen_exec import split_reasoning
from radixmesh.lang.ir import (
    Argument,
    Gen,
    Leaf,
    RoleBegin,
    RoleEnd,
    Select,
    SeparateReasoning,
    Text,
    Variable,
    VarScopeBegin,
    VarScopeEnd,
)
from radixmesh.lang.meta import select_meta
from radixmesh.lang.params import GenParams
from radixmesh.lang.scoring import run_select
from radixmesh.lang.speculation import Speculator, Term
from radixmesh.lang.stream_gen import GenExecution
from radixmesh.lang.stream_ops import (
    Await,
    End,
    ForkPoint,
    Inherit,
    JoinOp,
    LeafOp,
    Op,
    Skipped,
    Snapshot,
    label_of,
)

log = logging.getLogger(__name__)
_ids = itertools.count()


class StreamExecutor(GenExecution):
    """One prompt stream; see the module docstring for the execution model."""

    def __init__(
        self,
        ctx: ProgramContext,
        *,
        inherit: Future[Snapshot] | None = None,
        variables: dict[str, Future[Any]] | None = None,
        submit_role: str | None = None,
    ) -> None:
        self.ctx = ctx
        self.id = next(_ids)
        self._cond = threading.Condition()
        self._vars: dict[str, Future[Any]] = dict(variables or {})
        self._own_vars: list[str] = []  # names first submitted in this stream (for join)
        self._meta: dict[str, Any] = {}
        self._pending = 0
        self._ended = False
        self._finished = False
        self._children: list[StreamExecutor] = []
        self._submit_role = submit_role  # role open as of the latest *submitted* op
        self._error: Exception | None = None
        self._error_label = ""
        self.program_error: BaseException | None = None  # the program body's own exception
        self._chunks: list[tuple[str | None, str]] = []
        # Worker-owned prompt state.
        self._text = ""
        self._fork_len = 0
        self._messages: list[dict[str, str]] = []
        self._role: tuple[str, int] | None = None
        self._roles_started = False
        self._scopes: dict[str, int] = {}  # open var_scope name -> text position
        self._spec = Speculator(ctx.spec_tokens) if ctx.spec_tokens is not None else None
        # Chat speculation: the open assistant turn's terms and the gens' (futures, params).
        self._turn: list[Term] | None = None
        self._turn_gens: list[tuple[list[Future[Any]], GenParams]] = []
        self._queue: queue.SimpleQueue[Op] = queue.SimpleQueue()
        if ctx.parallel:
            name = f"radixmesh-stream-{self.id}"
            threading.Thread(target=self._worker, name=name, daemon=True).start()
        if inherit is not None:
            self._dispatch([Inherit("fork", snapshot=inherit)])

    # ---- submission (caller thread) -------------------------------------------------

    def _dispatch(self, ops: list[Op]) -> None:
        with self._cond:
            if self._ended:
                raise ProgramError("this state has ended (its program returned or it was joined)")
            self._pending += len(ops)
            if self.ctx.parallel:
                for op in ops:
                    self._queue.put(op)
        if not self.ctx.parallel:
            for op in ops:
                self._run(op)

    def submit(self, leaves: list[Leaf]) -> None:
        """Queue leaves in order; validates them all first so a bad submit changes nothing."""
        role = self._submit_role
        for leaf in leaves:
            if isinstance(leaf, Argument | Variable):
                raise TypeError(f"{leaf!r} is a trace placeholder; it cannot run in a state")
            if isinstance(leaf, RoleBegin):
                if role is not None:
                    raise ValueError(f"cannot open role {leaf.role!r} inside role {role!r}")
                role = leaf.role
            elif isinstance(leaf, RoleEnd):
                if role != leaf.role:
                    raise ValueError(f"cannot close role {leaf.role!r}: open role is {role!r}")
                role = None
        ops: list[Op] = []
        with self._cond:
            for leaf in leaves:
                op = LeafOp(label_of(leaf), leaf=leaf)
                named = isinstance(leaf, Gen | Select) and leaf.name is not None
                if named or isinstance(leaf, VarScopeEnd):
                    assert isinstance(leaf, Gen | Select | VarScopeEnd) and leaf.name is not None
                    op.outputs.append(self._register(leaf.name))
                elif isinstance(leaf, SeparateReasoning):
                    op.source = self._vars.get(leaf.gen_name)
                    if op.source is None:
                        raise ValueError(f"separate_reasoning needs a gen named {leaf.gen_name!r}")
                    op.outputs.append(self._register(leaf.gen_name))
                    op.outputs.append(self._register(leaf.name))
                ops.append(op)
        self._submit_role = role
        self._dispatch(ops)

    def _register(self, name: str) -> Future[Any]:
        future: Future[Any] = Future()
        self._vars[name] = future
        if name not in self._own_vars:
            self._own_vars.append(name)
        return future

    def set_var(self, name: str, value: Any) -> None:
        """`s[name] = value`: the variable holds `value` from now on (SGLang's set_var)."""
        future: Future[Any] = Future()
        future.set_result(value)
        with self._cond:
            self._vars[name] = future
            if name not in self._own_vars:
                self._own_vars.append(name)

    def has_var(self, name: str) -> bool:
        with self._cond:
            return name in self._vars

    def submit_value(self, value: Future[Any], label: str) -> None:
        """Append a value another stream will produce (compiler-mode inter-stream edge)."""
        self._dispatch([Await(label, value=value)])

    def fork(self, n: int) -> list[StreamExecutor]:
        """n new streams starting from this stream's prompt at this point of the program."""
        if n < 1:
            raise ValueError("fork needs n >= 1")
        snapshots: list[Future[Any]] = [Future() for _ in range(n)]
        self._dispatch([ForkPoint("fork", outputs=snapshots, hint=self.ctx.hint and n > 1)])
        with self._cond:
            variables = dict(self._vars)
        children = [
            StreamExecutor(self.ctx, inherit=s, variables=variables, submit_role=self._submit_role)
            for s in snapshots
        ]
        with self._cond:
            self._children.extend(children)
        return children

    def spawn(self) -> StreamExecutor:
        """A new stream with an empty prompt in this program's context (a traced call of
        another program); it is ended and waited for with this stream's forks."""
        child = StreamExecutor(self.ctx)
        with self._cond:
            self._children.append(child)
        return child

    def join(self, children: list[StreamExecutor], mode: str) -> None:
        """End `children` and merge them here: "gather" sets each variable first set in the
        branches to the list of branch values (None where a branch lacks it); "concat"
        appends each branch's text after the fork point, in branch order."""
        if mode not in ("gather", "concat"):
            raise ValueError("join mode must be 'gather' or 'concat'")
        for child in children:
            child.end()
        names: list[str] = []
        for child in children:
            names += [n for n in child.own_vars() if n not in names]
        op = JoinOp("join", children=list(children), mode=mode, names=names)
        with self._cond:
            if mode == "gather":
                op.outputs = [self._register(n) for n in names]
        self._dispatch([op])

    def end(self) -> None:
        """No more ops for this stream or its forks; the worker exits when it drains."""
        with self._cond:
            if self._ended:
                return
            children = list(self._children)
        self._dispatch([End("end")])
        with self._cond:
            self._ended = True
        for child in children:
            child.end()

    # ---- reads (caller thread) --------------------------------------------------------

    def own_vars(self) -> list[str]:
        with self._cond:
            return list(self._own_vars)

    def var_future(self, name: str) -> Future[Any]:
        with self._cond:
            future = self._vars.get(name)
        if future is None:
            raise KeyError(f"no variable {name!r} has been submitted in this state")
        return future

    def get(self, name: str) -> Any:
        """The variable's value; waits for it; raises the producing op's ProgramError."""
        return self.var_future(name).result()

    def meta(self, name: str) -> Any:
        self.get(name)
        with self._cond:
            return self._meta.get(name)

    def sync(self) -> None:
        """Waits until every op submitted so far has run (this stream only)."""
        with self._cond:
            while self._pending:
                self._cond.wait()

    def sync_tree(self) -> None:
        """Waits for this stream and, recursively, every stream forked from it."""
        self.sync()
        with self._cond:
            children = list(self._children)
        for child in children:
            child.sync_tree()

    def wait_finished(self) -> None:
        with self._cond:
            while not self._finished:
                self._cond.wait()

    def raise_if_failed(self) -> None:
        if self.program_error is not None:
            raise ProgramError("the program raised") from self.program_error
        if self._error is not None:
            raise ProgramError(f"{self._error_label} failed: {self._error}") from self._error

    def text(self) -> str:
        self.sync()
        self.raise_if_failed()
        with self._cond:
            return self._text

    def messages(self) -> list[dict[str, str]]:
        self.sync()
        self.raise_if_failed()
        with self._cond:
            return [dict(m) for m in self._messages]

    def chunks(self, var: str | None = None) -> Iterator[str]:
        """Yields text as it is appended (only `var`'s when given) until the stream ends."""
        seen = 0
        while True:
            with self._cond:
                while seen >= len(self._chunks) and not self._finished:
                    self._cond.wait()
                batch = self._chunks[seen:]
                seen += len(batch)
                done = self._finished and seen >= len(self._chunks)
            for name, chunk in batch:
                if var is None or name == var:
                    yield chunk
            if done:
                break
        self.raise_if_failed()

    # ---- execution (worker thread, or caller thread when not parallel) ----------------

    def _worker(self) -> None:
        while True:
            op = self._queue.get()
            self._run(op)
            if isinstance(op, End):
                return

    def _run(self, op: Op) -> None:
        try:
            if isinstance(op, End):
                with self._cond:
                    self._finished = True
                return
            if self._error is not None:
                raise Skipped
            self._execute(op)
        except Exception as exc:
            if isinstance(exc, Skipped):
                err = ProgramError(f"{op.label} not run: {self._error_label} failed before it")
                err.__cause__ = self._error
            else:
                self._error, self._error_label = exc, op.label
                err = ProgramError(f"{op.label} failed: {exc}")
                err.__cause__ = exc
            for future in op.outputs:
                if not future.done():
                    future.set_exception(err)
        finally:
            with self._cond:
                self._pending -= 1
                self._cond.notify_all()

    def _fill(self, text: str) -> None:
        """Appends constant text (not model output): it is matched against the speculation."""
        if self._turn is not None:  # chat speculation: part of the turn's template
            self._turn.append(Term(text))
            return
        if self._spec is not None:
            self._spec.fill(text)
        self._append(text)

    def _append(self, text: str, var: str | None = None) -> None:
        if text:
            with self._cond:
                self._text += text
                self._chunks.append((var, text))
                self._cond.notify_all()

    def _execute(self, op: Op) -> None:
        if isinstance(op, LeafOp) and isinstance(op.leaf, SeparateReasoning):
            assert op.source is not None
            value = op.source.result()
            answer, reasoning = split_reasoning(value, op.leaf.begin, op.leaf.end)
            for future, v in zip(op.outputs, (answer, reasoning), strict=True):
                future.set_result(v)
        elif isinstance(op, LeafOp):
            assert op.leaf is not None
            self._execute_leaf(op.leaf, op.outputs)
        elif isinstance(op, Inherit):
            snap = op.snapshot.result()
            self._fork_len = len(snap.text)
            self._messages = [dict(m) for m in snap.messages]
            self._role, self._roles_started = snap.role, snap.roles_started
            self._append(snap.text)  # not a fill: a fork starts without speculation
        elif isinstance(op, ForkPoint):
            if op.hint and self._text:
                try:  # the hint only saves compute: a failure must not fail the program
                    self.ctx.stats.add("hint", self.ctx.backend.warm(self._text))
                except Exception:
                    log.warning("fork hint failed; branches will compute the prefix", exc_info=True)
            snap = Snapshot(self._text, tuple(self._messages), self._role, self._roles_started)
            for future in op.outputs:
                future.set_result(snap)
        elif isinstance(op, Await):
            value = op.value.result()
            self._fill(value if isinstance(value, str) else str(value))
        elif isinstance(op, JoinOp):
            self._execute_join(op)
        else:  # pragma: no cover - all op kinds are handled above
            raise TypeError(f"unknown op {op!r}")

    def _execute_leaf(self, leaf: Leaf, outputs: list[Future[Any]]) -> None:
        value: Any = None
        if isinstance(leaf, Text):
            self._fill(leaf.value)
        elif isinstance(leaf, Gen) and self._turn is not None:
            params = leaf.params.merged_over(self.ctx.defaults)
            self._turn.append(Term("", leaf.name or "", params.stop))
            self._turn_gens.append((outputs, params))
            return  # resolved when the turn is generated, at the role's end
        elif isinstance(leaf, Gen):
            value = self._execute_gen(leaf)
        elif isinstance(leaf, VarScopeBegin):
            self._scopes[leaf.name] = len(self._text)
        elif isinstance(leaf, VarScopeEnd):
            if leaf.name not in self._scopes:
                raise ValueError(f"var_scope {leaf.name!r} ends without beginning")
            value = self._text[self._scopes.pop(leaf.name) :]
        elif isinstance(leaf, Select):
            result = run_select(
                self.ctx.backend,
                self._text,
                leaf.choices,
                leaf.method,
                hint=self.ctx.hint,
                parallel=self.ctx.parallel,
                stats=self.ctx.stats,
            )
            self._append(result.choice, leaf.name)
            value = result.choice
            if leaf.name is not None:
                with self._cond:
                    self._meta[leaf.name] = select_meta(result)
        elif isinstance(leaf, RoleBegin):
            self._begin_role(leaf.role)
        elif isinstance(leaf, RoleEnd):
            assert self._role is not None and self._role[0] == leaf.role  # checked at submit
            if self._turn is not None:
                self._finish_turn()
            # As SGLang: a message's content is the role's text without leading whitespace.
            content = self._text[self._role[1] :].lstrip()
            self._messages.append({"role": leaf.role, "content": content})
            self._role = None
            self._fill(self.ctx.renderer().end(leaf.role))
        for future in outputs:
            future.set_result(value)

    def _begin_role(self, role: str) -> None:
        renderer = self.ctx.renderer()
        first = not self._roles_started
        system = renderer.default_system(role, first=first)
        if system is not None:  # the template's default system message is a message too
            self._messages.append({"role": "system", "content": system.lstrip()})
        self._fill(renderer.begin(role, first=first))
        self._roles_started = True
        self._role = (role, len(self._text))
        chat = getattr(self.ctx.backend, "is_chat_model", False)
        if role == "assistant" and chat and self.ctx.spec_tokens is not None:
            self._turn, self._turn_gens = [], []

    def _execute_join(self, op: JoinOp) -> None:
        for child in op.children:
            child.wait_finished()
        for i, child in enumerate(op.children):
            if child._error is not None:
                raise ProgramError(f"fork branch {i} failed") from child._error
        if op.mode == "concat":
            for child in op.children:
                self._fill(child._text[child._fork_len :])
            return
        for name, future in zip(op.names, op.outputs, strict=True):
            values = []
            for child in op.children:
                f = child._vars.get(name)
                values.append(f.result() if f is not None and name in child._own_vars else None)
            future.set_result(values)
