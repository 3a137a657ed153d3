"""Issue 14 on real processes: API keys, the admin scope, TLS on the public port, mutual TLS
on internal links (the session hijack and model takeover are refused and the first session is
undisturbed), tenant isolation of the prefix cache, request ownership, and log permissions."""

from __future__ import annotations

import asyncio
import stat
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import requests
from radixmesh.api import Client, RadixMeshError

from radixmesh_wire.pb import model_pb2, model_pb2_grpc, scheduler_pb2, scheduler_pb2_grpc
from services.launcher import free_port
from services.pki import CertFiles, make_server_cert
from services.transport_config import INTERNAL_SERVER_NAME
from tests.conftest import Stack, start_stack

pytestmark = pytest.mark.integration

KEY_A, KEY_B, ADMIN = "key-a-5e3f", "key-b-91c2", "admin-77d0"
# A prompt with a secret in it (73 tokens in the attack; any length shows it).
SECRET = (
    "Confidential memo for the board: the acquisition price agreed with Northwind is 4187 "
    "million dollars, to be announced on the ninth. Summarise the memo in one line:"
)


@pytest.fixture(scope="module")
def sec(tmp_path_factory: pytest.TempPathFactory, model_dir: Path) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("secure")
    ca, cert, key = make_server_cert(tmp / "public-tls", "localhost")
    args = ["--api-keys", f"{KEY_A},{KEY_B}", "--admin-api-keys", ADMIN]
    args += ["--tls-cert", str(cert), "--tls-key", str(key)]
    gen = start_stack(
        tmp / "logs",
        ["--kv-tokens", "8192"],
        ["--debug-invariants"],
        tokenizer_args=args,
        tokenizer_health_port=free_port(),
    )
    stack = next(gen)
    stack.public_ca = ca  # type: ignore[attr-defined]
    yield stack
    gen.close()


def _client(sec: Stack, key: str | None) -> Client:
    return Client(
        f"localhost:{sec.ports.tokenizer}",
        timeout=60,
        api_key=key or "",
        tls=str(sec.public_ca),  # type: ignore[attr-defined]
    )


def _secure_channel(sec: Stack, target: str, role: str | None) -> grpc.aio.Channel:
    files: CertFiles = sec.launcher.pki["tokenizer"]
    ca = files.ca.read_bytes()
    if role is None:  # TLS but no client certificate
        creds = grpc.ssl_channel_credentials(ca)
    else:
        mine = sec.launcher.pki[role]
        creds = grpc.ssl_channel_credentials(ca, mine.key.read_bytes(), mine.cert.read_bytes())
    opts = [("grpc.ssl_target_name_override", INTERNAL_SERVER_NAME)]
    return grpc.aio.secure_channel(target, creds, options=opts)


def test_keys_and_admin_scope(sec: Stack) -> None:
    for key in (None, "wrong-key"):
        with _client(sec, key) as c, pytest.raises(RadixMeshError) as err:
            c.generate("Hello", max_new_tokens=2)
        assert err.value.code == grpc.StatusCode.UNAUTHENTICATED, err.value
    with _client(sec, KEY_A) as c:
        assert c.generate("Hello", max_new_tokens=2, temperature=0).completion_tokens == 2
        with pytest.raises(RadixMeshError) as err:
            c.stats()
        assert err.value.code == grpc.StatusCode.PERMISSION_DENIED
    with _client(sec, ADMIN) as c:
        assert c.stats().kv_capacity == 8192
    with Client(sec.endpoint.replace("127.0.0.1", "localhost"), timeout=10, api_key=KEY_A) as c:
        with pytest.raises(RadixMeshError) as err:  # plaintext against the TLS port
            c.generate("Hello", max_new_tokens=2)
        assert err.value.code == grpc.StatusCode.UNAVAILABLE


def test_tenants_do_not_share_the_prefix_cache(sec: Stack) -> None:
    with _client(sec, KEY_A) as a, _client(sec, KEY_B) as b:
        first = a.generate(SECRET, max_new_tokens=1, temperature=0)
        again = a.generate(SECRET, max_new_tokens=1, temperature=0)
        assert first.cached_tokens == 0
        assert again.cached_tokens >= first.prompt_tokens - 2  # the tenant's own repeat hits
        probe = b.generate(SECRET, max_new_tokens=1, temperature=0)
        assert probe.cached_tokens == 0  # the exact prompt of another tenant: no hit at all
        salted = a.generate(SECRET, max_new_tokens=1, temperature=0, cache_salt="other")
        assert salted.cached_tokens == 0  # a salt is a namespace of its own
        assert probe.output_ids == first.output_ids  # isolation changes no output


def test_only_the_owner_can_abort(sec: Stack) -> None:
    with _client(sec, KEY_A) as a, _client(sec, KEY_B) as b:
        done: dict[str, object] = {}

        def run() -> None:
            try:
                done["r"] = a.generate(
                    "Count: 1 2 3", request_id="mine", max_new_tokens=24, ignore_eos=True
                )
            except RadixMeshError as exc:
                done["r"] = exc

        t = threading.Thread(target=run)
        t.start()
        while t.is_alive() and not b.abort("mine"):  # B tries for as long as A's request lives
            if a.abort("not-mine"):  # A sees only its own ids too
                raise AssertionError("a made-up id was found")
            t.join(0.01)
        t.join(60)
        r = done["r"]
        assert not isinstance(r, Exception), r
        assert r.finish_reason == "length" and r.completion_tokens == 24  # type: ignore[attr-defined]


async def _open_scheduler_session(sec: Stack, role: str | None, sid: str) -> grpc.StatusCode:
    async with _secure_channel(sec, sec.address("scheduler"), role) as chan:
        stub = scheduler_pb2_grpc.SchedulerStub(chan)

        async def hello():  # type: ignore[no-untyped-def]
            yield scheduler_pb2.FrontendMessage(hello=scheduler_pb2.FrontendHello(session_id=sid))
            await asyncio.sleep(3600)  # stand-in: a peer that keeps its stream open

        call = stub.Session(hello())
        try:
            await asyncio.wait_for(call.read(), 10)
        except grpc.aio.AioRpcError as exc:
            return exc.code()
        call.cancel()
        return grpc.StatusCode.OK


async def _open_model_session(sec: Stack, role: str | None) -> grpc.StatusCode:
    async with _secure_channel(sec, sec.address("model"), role) as chan:
        stub = model_pb2_grpc.ModelWorkerStub(chan)

        async def opening():  # type: ignore[no-untyped-def]
            yield model_pb2.StepRequest(open=model_pb2.OpenSession(session_id="intruder"))
            await asyncio.sleep(3600)  # stand-in: a peer that keeps its stream open

        call = stub.Steps(opening())
        try:
            await asyncio.wait_for(call.read(), 10)
        except grpc.aio.AioRpcError as exc:
            return exc.code()
        call.cancel()
        return grpc.StatusCode.OK


def test_internal_ports_refuse_strangers_and_keep_the_first_session(sec: Stack) -> None:
    with _client(sec, KEY_A) as a:
        result: dict[str, object] = {}
        t = threading.Thread(
            target=lambda: result.update(
                r=a.generate("Once upon a time", max_new_tokens=32, ignore_eos=True, seed=3)
            )
        )
        t.start()
        # Plaintext and certificate-less TLS die in the handshake; a certificate of the wrong
        # role is refused by the method; the right role cannot take a live session over.
        for target in ("scheduler", "model", "grammar"):
            with pytest.raises(grpc.RpcError) as err:
                grpc_insecure_health(sec.address(target))
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE  # type: ignore[attr-defined]
        assert asyncio.run(_open_scheduler_session(sec, None, "x")) == grpc.StatusCode.UNAVAILABLE
        denied = asyncio.run(_open_scheduler_session(sec, "client", "x"))
        assert denied == grpc.StatusCode.PERMISSION_DENIED
        assert asyncio.run(_open_model_session(sec, "client")) == grpc.StatusCode.PERMISSION_DENIED
        taken = asyncio.run(_open_model_session(sec, "scheduler"))
        assert taken == grpc.StatusCode.FAILED_PRECONDITION  # the open session stays
        t.join(60)
        r = result["r"]
        assert r.completion_tokens == 32 and r.finish_reason == "length"  # type: ignore[attr-defined]
        again = a.generate("Once upon a time", max_new_tokens=32, ignore_eos=True, seed=3)
        assert again.output_ids == r.output_ids  # type: ignore[attr-defined]


def test_a_live_session_id_cannot_be_reused(sec: Stack) -> None:
    async def run() -> tuple[grpc.StatusCode, grpc.StatusCode]:
        async with _secure_channel(sec, sec.address("scheduler"), "tokenizer") as chan:
            stub = scheduler_pb2_grpc.SchedulerStub(chan)
            gate = asyncio.Event()

            async def hello():  # type: ignore[no-untyped-def]
                yield scheduler_pb2.FrontendMessage(
                    hello=scheduler_pb2.FrontendHello(session_id="fixed-id-for-test")
                )
                await gate.wait()

            first = stub.Session(hello())
            await first.read()  # the first session is open
            second = await _open_scheduler_session(sec, "tokenizer", "fixed-id-for-test")
            gate.set()
            first.cancel()
            return grpc.StatusCode.OK, second

    ok, second = asyncio.run(run())
    assert second == grpc.StatusCode.ALREADY_EXISTS


def grpc_insecure_health(address: str) -> None:
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(address) as chan:
        health_pb2_grpc.HealthStub(chan).Check(health_pb2.HealthCheckRequest(), timeout=5)


def test_logs_are_private_and_hold_no_keys(sec: Stack) -> None:
    logs = sec.log_dir
    assert stat.S_IMODE(logs.stat().st_mode) == 0o700
    for f in logs.glob("*.log"):
        assert stat.S_IMODE(f.stat().st_mode) == 0o600, f
        text = f.read_text(errors="replace")
        for secret in (KEY_A, KEY_B, ADMIN, "Northwind"):
            assert secret not in text, (f, secret)


HTTP_PROMPT = "A prompt only tenant A has sent, about quiet harbours and their lighthouses."


def _post(s: Stack, path: str, key: str | None, body: dict) -> requests.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    url = f"https://localhost:{s.ports.http}{path}"
    return requests.post(url, json=body, headers=headers, verify=str(s.public_ca), timeout=60)  # type: ignore[attr-defined]


def test_http_keys_scopes_and_tenants(sec: Stack) -> None:
    """The HTTP port under the same settings: HTTPS, the same keys, tenants apart."""
    body = {"prompt": HTTP_PROMPT, "max_tokens": 1, "temperature": 0}
    r = _post(sec, "/v1/completions", None, body)
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    assert _post(sec, "/v1/completions", "wrong", body).status_code == 401
    first = _post(sec, "/v1/completions", KEY_A, body)
    assert first.status_code == 200, first.text
    again = _post(sec, "/v1/completions", KEY_A, body).json()
    other = _post(sec, "/v1/completions", KEY_B, body).json()
    p = again["usage"]["prompt_tokens"]
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == p - 1
    assert other["usage"]["prompt_tokens_details"]["cached_tokens"] == 0  # no shared KV
    assert _post(sec, "/flush_cache", KEY_A, {}).status_code == 403
    assert _post(sec, "/flush_cache", ADMIN, {}).status_code == 200
    url = f"https://localhost:{sec.ports.http}/health"
    assert requests.get(url, verify=str(sec.public_ca), timeout=10).status_code == 200  # type: ignore[attr-defined]
