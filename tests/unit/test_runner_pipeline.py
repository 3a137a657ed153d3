"""The model runner's two halves (launch, finish) and late masks, on the CPU reference path.

Launching step N+1 before finishing N must give exactly the tokens of running one step at a
time: decode inputs are read from the device-side last token, never from the host. A skipped
decode row (late masks) must leave the request as if that decode never happened.
"""

from __future__ import annotations

import pytest
import torch

from model_service.attention.reference import ReferenceAttention
from model_service.kv_pool import KVPool
from model_service.runner import ModelRunner
from model_service.weights import random_model
from radixmesh_wire.mask_rows import EncodedRow, encode_ids
from radixmesh_wire.step_ops import AdmitOp, ExtendOp, Sampling, StepOps
from tests.tiny_runner import tiny_llama_args

VOCAB = 300
# On a GPU machine the same checks run on CUDA, where launch-ahead is real (queued kernels).
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def _runner(device: str) -> ModelRunner:
    args = tiny_llama_args(VOCAB)
    dev = torch.device(device)
    model = random_model(args, torch.float32, dev, seed=7)
    pool = KVPool(2, 128, 2, 32, torch.float32, dev)
    return ModelRunner(model, pool, ReferenceAttention(pool, 4, 32), dev)


SAMPLINGS = [Sampling(temperature=0.0), Sampling(temperature=1.0, top_p=0.9, seed=5)]
PROMPTS = [[11, 12, 13, 14, 15], [21, 22, 23]]


def _admit() -> StepOps:
    ops = StepOps(1)
    base = 0
    for h, (s, p) in enumerate(zip(SAMPLINGS, PROMPTS, strict=True)):
        ops.admits.append(AdmitOp(h, s, 0, [], p, list(range(base, base + len(p))), True))
        base += len(p)
    return ops


def _decode(step: int, handles: list[int], slot0: int) -> StepOps:
    return StepOps(
        step, decode_handles=handles, decode_slots=[slot0 + i for i in range(len(handles))]
    )


def _tokens(out: object) -> dict[int, int]:
    return {r.handle: r.token for r in out.rows}  # type: ignore[attr-defined]


@pytest.mark.parametrize("device", DEVICES)
def test_launch_ahead_gives_the_tokens_of_one_step_at_a_time(device: str) -> None:
    steps = [_admit()] + [_decode(2 + i, [0, 1], 8 + 2 * i) for i in range(5)]
    one = _runner(device)
    expected = [_tokens(one.step(s)) for s in steps]

    two = _runner(device)
    got = []
    pending = two.launch(steps[0])
    for s in steps[1:]:
        nxt = two.launch(s)  # before the previous step's tokens are read back
        got.append(_tokens(two.finish(pending)))
        pending = nxt
    got.append(_tokens(two.finish(pending)))
    assert got == expected
    assert all(len(t) == 2 for t in got)


@pytest.mark.parametrize("device", DEVICES)
def test_late_mask_is_applied_and_a_skipped_decode_leaves_no_trace(device: str) -> None:
    allowed = 42
    row = encode_ids([allowed], VOCAB)
    late = {3: ({0: row}, {1})}  # step 3: mask row 0, skip row 1
    r = _runner(device)
    r.mask_source = lambda step_id: late.pop(step_id)
    ref = _runner(device)

    first = _tokens(r.step(_admit()))
    assert first == _tokens(ref.step(_admit()))
    out = r.step(StepOps(3, decode_handles=[0, 1], decode_slots=[8, 9], masks_follow=True))
    assert _tokens(out) == {0: allowed}
    assert len(r.requests[1].slots) == len(PROMPTS[1])  # the skipped decode's slot is gone
    # The reference never decoded handle 1 at step 3 and sampled handle 0 under the same mask.
    ref.step(StepOps(3, decode_handles=[0], decode_slots=[8], masks={0: row}))
    after = r.step(_decode(4, [0, 1], 10))
    assert _tokens(after) == _tokens(ref.step(_decode(4, [0, 1], 10)))
    assert not late


@pytest.mark.parametrize("device", DEVICES)
def test_late_mask_wait_is_accounted(device: str) -> None:
    """The worker measures its wait for late masks (the `step_burst` log's mask_wait figures):
    a mask source that answers only after a delay shows at least that delay."""
    import time

    row = encode_ids([42], VOCAB)
    r = _runner(device)

    def slow_source(step_id: int) -> tuple[dict[int, EncodedRow], set[int]]:
        time.sleep(0.05)  # the grammar service's round trip, not synchronisation
        return {0: row}, set()

    r.mask_source = slow_source
    r.step(_admit())
    assert r.bursts.burst[5] == 0.0  # no late masks in a prefill step
    out = r.step(StepOps(3, decode_handles=[0], decode_slots=[8], masks_follow=True))
    assert _tokens(out) == {0: 42}
    assert r.bursts.burst[5] >= 0.05
    if device == "cuda":  # the forward pass is far shorter than the wait: the GPU waited too
        assert r.bursts.burst[6] > 10.0  # ms


@pytest.mark.parametrize("device", DEVICES)
def test_a_draw_after_a_jump_forward_is_the_draw_of_a_resumed_stream(device: str) -> None:
    """A seeded draw's position is the output length, forced (jump-forward) tokens included:
    a stream resumed from the tokens it received (admitted with output_offset = their count)
    draws exactly what the undisturbed one draws next."""
    s = Sampling(temperature=1.0, seed=9)
    prompt = [11, 12, 13, 14, 15]
    one = _runner(device)
    first = _tokens(
        one.step(StepOps(1, admits=[AdmitOp(0, s, 0, [], prompt, [0, 1, 2, 3, 4], True)]))
    )[0]
    # Jump-forward: roll back nothing, append the sampled token and three forced ones, sample.
    forced = [40, 41, 42]
    ext = ExtendOp(0, [first, *forced], [5, 6, 7, 8], True)
    after_jump = _tokens(one.step(StepOps(2, extends=[ext])))[0]
    then = _tokens(one.step(_decode(3, [0], 9)))[0]

    resumed = _runner(device)
    output = [first, *forced]
    seq = prompt + output
    admit = AdmitOp(0, s, len(output), [], seq, list(range(len(seq))), True)
    assert _tokens(resumed.step(StepOps(1, admits=[admit])))[0] == after_jump
    assert _tokens(resumed.step(_decode(2, [0], 9)))[0] == then
