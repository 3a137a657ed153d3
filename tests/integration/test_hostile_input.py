"""Hostile public requests fail alone, fast, with a clear status, while a plain request keeps
its latency (issue 12, items 1, 6, 7, 8, 13), through the public API of a real stack."""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from typing import Any

import grpc
import pytest
from radixmesh.api import Client, RadixMeshError

from tests.conftest import Stack

pytestmark = pytest.mark.integration

RECURSIVE = (
    '{"$ref":"#/$defs/n","$defs":{"n":{"type":"object","properties":'
    '{"next":{"$ref":"#/$defs/n"}},"required":["next"]}}}'
)
HOUSES = ["格兰芬多", "赫奇帕奇", "拉文克劳", "斯莱特林"]
OK_OR_CLEAR = {None, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED}


def _plain(c: Client) -> float:
    t0 = time.monotonic()
    res = c.generate("Count from one to ten:", max_new_tokens=8, temperature=0, ignore_eos=True)
    assert res.completion_tokens == 8
    return time.monotonic() - t0


def _alongside(c: Client, hostile: Callable[[], Any]) -> tuple[Any, float]:
    """Run `hostile` in a thread while a plain request runs; (its outcome, plain latency)."""
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(hostile())
        except RadixMeshError as exc:
            out.append(exc)

    t = threading.Thread(target=run)
    t.start()
    latency = _plain(c)
    t.join(timeout=120)
    assert not t.is_alive(), "the hostile request never ended"
    return out[0], latency


def test_recursive_schema_fails_alone(stack: Stack) -> None:
    with Client(stack.endpoint) as c:
        idle = _plain(c)
        res, latency = _alongside(
            c,
            lambda: c.generate(
                "JSON:", json_schema=RECURSIVE, max_new_tokens=8, temperature=0, ignore_eos=True
            ),
        )
        if isinstance(res, RadixMeshError):
            assert res.code in OK_OR_CLEAR, (res.code, res.message)
        else:  # an endless forced string: jump-forward proposes it in bounded pieces
            assert res.text.startswith('{"next": {"next":') and res.finish_reason == "length"
        print(f"plain request: idle {idle:.2f} s, beside the recursive schema {latency:.2f} s")


def test_multibyte_regex_finishes(stack: Stack) -> None:
    with Client(stack.endpoint) as c:
        regex = "(" + "|".join(HOUSES) + ")"
        for _ in range(2):  # the second one takes the cached grammar
            res = c.generate("哈利波特的学院是：", regex=regex, max_new_tokens=16, temperature=0)
            assert res.text in HOUSES and res.finish_reason == "stop", res.text


def test_non_finite_temperature_is_invalid(stack: Stack) -> None:
    with Client(stack.endpoint) as c, pytest.raises(RadixMeshError) as err:
        c.generate("hi", temperature=float("inf"), max_new_tokens=2)
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "temperature must be a finite number" in err.value.message


@pytest.mark.parametrize(
    "payload", [b"\x0a\x02\xff\xfe", b"\xff\xff\xff\xff"], ids=["bad-utf8", "not-protobuf"]
)
def test_undecodable_generate_is_invalid_argument(stack: Stack, payload: bytes) -> None:
    with grpc.insecure_channel(stack.endpoint) as ch:
        call = ch.unary_stream("/radixmesh.v1.RadixMesh/Generate")(payload, timeout=30)
        with pytest.raises(grpc.RpcError) as err:
            list(call)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]


def test_huge_texts_are_refused_fast_and_block_nobody(stack: Stack) -> None:
    with Client(stack.endpoint) as c:
        idle = _plain(c)
        for text, code, needle in [
            ("x" * (10 << 20), grpc.StatusCode.RESOURCE_EXHAUSTED, ""),  # over the message bound
            ("word " * 400_000, grpc.StatusCode.INVALID_ARGUMENT, "--max-input-chars"),
        ]:
            t0 = time.monotonic()
            res, latency = _alongside(c, functools.partial(c.generate, text, max_new_tokens=1))
            assert isinstance(res, RadixMeshError) and res.code == code, res
            assert needle in res.message
            took = time.monotonic() - t0  # figures: a busy machine changes them
            print(f"refused in {took:.2f} s; plain request {latency:.2f} s (idle {idle:.2f} s)")
