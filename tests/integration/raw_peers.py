"""Test clients that speak the internal streams directly, as a buggy or hostile peer would:
a front-door session to the scheduler and a step session to a model worker (sync gRPC, one
bidi call each, fed from a queue). On a stack with internal mutual TLS they present the
certificate of the role a real peer has (`channel_as`): the point is a buggy peer that got in,
not an outsider (tests/integration/test_security.py covers those)."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import grpc

from radixmesh_wire.packing import unpack_i32
from radixmesh_wire.pb import model_pb2, model_pb2_grpc, scheduler_pb2, scheduler_pb2_grpc
from services.launcher import Launcher


def channel_as(launcher: Launcher, name: str, role: str) -> grpc.Channel:
    """A sync channel to internal service `name` with `role`'s certificate (plaintext on a
    stack without internal TLS)."""
    address = launcher.specs[name].address
    files = launcher.pki.get(role)
    if files is None:
        return grpc.insecure_channel(address)
    tls = files.internal()
    return grpc.secure_channel(address, tls.channel_credentials(), options=tls.channel_options())


@dataclass
class Outcome:
    tokens: list[int]
    error_code: grpc.StatusCode | None
    error_message: str
    finish_reason: int


def _code(value: int) -> grpc.StatusCode:
    return next(c for c in grpc.StatusCode if c.value[0] == value)


class _Bidi:
    def __init__(self) -> None:
        self._out: queue.Queue[Any] = queue.Queue()
        self._chan: grpc.Channel | None = None

    def _requests(self) -> Iterator[Any]:
        while (msg := self._out.get()) is not None:
            yield msg

    def send(self, msg: Any) -> None:
        self._out.put(msg)

    def close(self) -> None:
        self._out.put(None)
        if self._chan is not None:
            self._chan.close()


class SchedulerSession(_Bidi):
    """A front-door session: submit SubmitRequests, collect each key's outcome."""

    def __init__(self, chan: grpc.Channel) -> None:
        super().__init__()
        self._chan = chan
        stub = scheduler_pb2_grpc.SchedulerStub(self._chan)
        self.send(scheduler_pb2.FrontendMessage(hello=scheduler_pb2.FrontendHello()))
        self._call = stub.Session(self._requests())
        self.hello = next(self._call).hello
        self._lock = threading.Lock()
        self._tokens: dict[int, list[int]] = {}
        self._ended: dict[int, Outcome] = {}
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        try:
            for msg in self._call:
                with self._lock:
                    for k, ev in zip(unpack_i32(msg.keys), unpack_i32(msg.events), strict=True):
                        toks = self._tokens.setdefault(k, [])
                        if ev >= 0:
                            toks.append(ev)
                        else:
                            del toks[len(toks) + ev :]
                    for ex in msg.extras:
                        if ex.error_code or ex.finish_reason:
                            self._ended[ex.key] = Outcome(
                                self._tokens.get(ex.key, []),
                                _code(ex.error_code) if ex.error_code else None,
                                ex.error_message,
                                ex.finish_reason,
                            )
        except grpc.RpcError:
            pass

    def submit(self, msg: scheduler_pb2.SubmitRequest) -> None:
        self.send(scheduler_pb2.FrontendMessage(submit=msg))

    def abort(self, rid: str) -> None:
        self.send(scheduler_pb2.FrontendMessage(abort=scheduler_pb2.AbortRequestInternal(rid=rid)))

    def wait(self, key: int, timeout: float = 30.0) -> Outcome:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if key in self._ended:
                    return self._ended.pop(key)
            time.sleep(0.01)
        raise TimeoutError(f"no outcome for key {key} in {timeout} s")


class ModelSession(_Bidi):
    """A step session: send Steps (and StepMasks), read StepResults in order."""

    def __init__(self, chan: grpc.Channel, session_id: str = "raw", wait_s: float = 30.0) -> None:
        super().__init__()
        self._chan = chan
        stub = model_pb2_grpc.ModelWorkerStub(self._chan)
        deadline = time.monotonic() + wait_s
        while True:  # the worker refuses a second session until the previous one has ended
            self._out = queue.Queue()
            self.send(model_pb2.StepRequest(open=model_pb2.OpenSession(session_id=session_id)))
            self._call = stub.Steps(self._requests())
            try:
                self.info = next(self._call).opened.info
                return
            except grpc.RpcError as exc:
                self._out.put(None)
                if exc.code() != grpc.StatusCode.FAILED_PRECONDITION:
                    raise
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def step(self, step: model_pb2.Step) -> None:
        self.send(model_pb2.StepRequest(step=step))

    def masks(self, masks: model_pb2.StepMasks) -> None:
        self.send(model_pb2.StepRequest(masks=masks))

    def result(self, timeout: float = 30.0) -> model_pb2.StepResult:
        return _next_with_timeout(self._call, timeout).result


def _next_with_timeout(call: Any, timeout: float) -> Any:
    """The call's next message; its RpcError (the stream ended with a status) is raised here."""
    box: queue.Queue[Any] = queue.Queue()

    def read() -> None:
        try:
            box.put(next(call))
        except Exception as exc:  # noqa: BLE001 - handed to the caller
            box.put(exc)

    threading.Thread(target=read, daemon=True).start()
    item = box.get(timeout=timeout)
    if isinstance(item, Exception):
        raise item
    return item
