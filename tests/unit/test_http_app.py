"""The HTTP app before the scheduler connects, on a real aiohttp server in-process: liveness
stays up, readiness and generation answer 503 in OpenAI's error shape, unknown models 404, and
the core's statuses map to the HTTP codes OpenAI clients expect."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest
from aiohttp.test_utils import TestClient, TestServer

from tokenizer_service.config import TokenizerConfig
from tokenizer_service.core import FrontDoor
from tokenizer_service.http.app import build_app
from tokenizer_service.http.errors import from_status
from tokenizer_service.routing.replica_set import ReplicaSet
from tokenizer_service.tokenization import Tokenization


@pytest.mark.parametrize(
    "status,http",
    [
        (grpc.StatusCode.INVALID_ARGUMENT, 400),
        (grpc.StatusCode.NOT_FOUND, 404),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, 429),
        (grpc.StatusCode.UNAVAILABLE, 503),
        (grpc.StatusCode.DEADLINE_EXCEEDED, 504),
        (grpc.StatusCode.INTERNAL, 500),
    ],
)
def test_status_mapping(status: grpc.StatusCode, http: int) -> None:
    err = from_status(status, "why")
    assert err.status == http
    assert err.body()["error"]["message"] == "why"
    assert err.body()["error"]["code"] == status.name.lower()


def test_not_ready_app(model_dir: Path) -> None:
    cfg = TokenizerConfig(scheduler_address="127.0.0.1:1", served_model_name="mesh")
    core = FrontDoor(cfg, Tokenization(model_dir), ReplicaSet.from_config(cfg))

    async def go() -> None:
        async with TestClient(TestServer(build_app(core, cfg, str(model_dir)))) as c:
            assert (await c.get("/health")).status == 200
            r = await c.get("/ready")
            assert r.status == 503
            assert "scheduler" in (await r.json())["error"]["message"]
            models = await (await c.get("/v1/models")).json()
            assert [m["id"] for m in models["data"]] == ["mesh"]
            r = await c.post("/v1/completions", json={"model": "other", "prompt": "hi"})
            assert r.status == 404
            assert (await r.json())["error"]["code"] == "model_not_found"
            r = await c.post("/v1/completions", json={"model": "mesh", "prompt": "hi"})
            assert r.status == 503
            r = await c.post("/generate", json={"text": "hi"})
            assert r.status == 503
            r = await c.get("/health_generate")
            assert r.status == 503
            r = await c.post("/v1/chat/completions", data=b"[1, 2]")
            assert r.status == 400 and "JSON object" in (await r.json())["error"]["message"]

    asyncio.run(go())


def test_chat_template_override(model_dir: Path) -> None:
    tok = Tokenization(model_dir)
    tok.set_chat_template(
        "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}"
    )
    ids = tok.apply_chat([{"role": "user", "content": "hi"}], True)
    assert tok.decode(ids) == "<user>hi<assistant>"
    assert tok.roles.roles["user"] == ("<user>", "")
