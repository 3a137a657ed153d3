"""End-to-end mask correctness without a model: random logits, masked by the service's rows
(decoded and applied exactly as the model service will), greedy argmax, until EOS. Every walk
over every suite grammar must produce valid output (jsonschema / the Python regex), with and
without jump-forward proposals applied. Also checks the suite's own valid/invalid samples."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import jsonschema
import pytest
import torch
import xgrammar as xgr

from grammar_service.compile_cache import GrammarKind
from grammar_service.config import GrammarConfig
from grammar_service.server import GrammarServicer, build_servicer
from grammar_service.suite import SUITE, GrammarCase
from model_service.mask_device import decode_rows
from radixmesh_wire.mask_step import MaskStepBuilder
from radixmesh_wire.packing import unpack_i32

MAX_STEPS = 400
# Unbounded grammars (free strings, `[\w\d\s]+`) end only when a closing token is sampled; a
# bias toward tokens holding closing punctuation keeps those walks short. The bias changes
# which allowed token wins, never which tokens are allowed, so validity is still what's tested.
CLOSERS = b'".}],'


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    """The embedded model's tokenizer, built once and cached under the temp dir."""
    from grammar_service.tokenizer_source import default_tokenizer_dir, load_tokenizer

    return load_tokenizer(default_tokenizer_dir())


@pytest.fixture(scope="module")
def servicer(tokenizer: Any) -> GrammarServicer:
    return build_servicer(tokenizer, GrammarConfig(mask_threads=1, compile_threads=1))


@pytest.fixture(scope="module")
def closer_bias(servicer: GrammarServicer) -> torch.Tensor:
    vocab = servicer.token_bytes
    return torch.tensor([4.0 if any(c in tok for c in CLOSERS) else 0.0 for tok in vocab])


def check_output(case: GrammarCase, text: str) -> None:
    if case.kind is GrammarKind.JSON_SCHEMA:
        jsonschema.validate(json.loads(text), case.schema)
    else:
        assert re.fullmatch(case.check, text), (case.name, text)


async def walk(
    svc: GrammarServicer, case: GrammarCase, seed: int, jump: bool, bias: torch.Tensor
) -> tuple[str, int]:
    """One constrained generation; returns (text, forward passes)."""
    vocab = svc.engine.vocab_size
    token_bytes = svc.token_bytes
    stop = set(svc.engine.stop_token_ids)
    gen = torch.Generator().manual_seed(seed)
    state, b = svc.new_session(f"walk-{case.name}"), MaskStepBuilder()
    b.bind(1, case.kind.value, case.text)
    out: list[int] = []
    for step in range(MAX_STEPS):
        b.want(1, jump_forward=jump)
        result = await svc.run_step(state, b.build(step))
        assert not result.errors, result.errors
        (row,) = result.rows
        jf = row.jump_forward
        if jf.tokens:  # apply the proposal as the scheduler would: roll back, extend
            new = unpack_i32(jf.tokens)
            before = b"".join(token_bytes[t] for t in out)
            out = out[: len(out) - jf.rollback] + new
            assert b"".join(token_bytes[t] for t in out) == before + jf.text.encode()
            b.rollback(1, jf.rollback)
            b.accept(1, new)
            continue
        logits = torch.randn(1, vocab, generator=gen)
        if not case.bounded:
            logits += bias
        xgr.apply_token_bitmask_inplace(logits, decode_rows([row], vocab))
        token = int(logits.argmax())
        if token in stop:
            assert row.can_end
            return b"".join(token_bytes[t] for t in out).decode("utf-8"), step + 1
        out.append(token)
        b.accept(1, [token])
    raise AssertionError(f"{case.name}: no EOS after {MAX_STEPS} steps")


@pytest.mark.parametrize("case", SUITE, ids=[c.name for c in SUITE])
def test_random_walks_produce_valid_output(
    servicer: GrammarServicer, closer_bias: torch.Tensor, case: GrammarCase
) -> None:
    async def main() -> None:
        for seed, jump in ((0, False), (1, True), (2, True)):
            text, _ = await walk(servicer, case, seed, jump, closer_bias)
            check_output(case, text)

    asyncio.run(main())


@pytest.mark.parametrize("case", SUITE, ids=[c.name for c in SUITE])
def test_suite_samples(servicer: GrammarServicer, tokenizer: Any, case: GrammarCase) -> None:
    async def main() -> None:
        state, b = servicer.new_session("samples"), MaskStepBuilder()
        samples = [(s, True) for s in case.valid] + [(s, False) for s in case.invalid]
        for text in case.valid:
            check_output(case, text)
        for h, (text, _) in enumerate(samples):
            replay = tokenizer.encode(text, add_special_tokens=False)
            b.bind(h, case.kind.value, case.text, replay=replay)
            b.want(h)
        result = await servicer.run_step(state, b.build(0))
        failed = {e.handle for e in result.errors}
        for h, (text, valid) in enumerate(samples):
            complete = h not in failed and result.rows[h].can_end
            assert complete == valid, (case.name, text)

    asyncio.run(main())


def test_suite_is_big_and_varied() -> None:
    assert len(SUITE) >= 20 and len({c.name for c in SUITE}) == len(SUITE)
    assert {c.kind for c in SUITE} == set(GrammarKind)
    assert any(c.name == "paper_summary_grade" for c in SUITE)
