"""A long prompt's prefill never holds a short request up for more than a few steps (issue 26
item 2: a 3,000-token prompt kept a small concurrent request waiting 45.9 s, 82.7 s with prompt
logprobs, on the CPU stack).

Counted in scheduler steps, never seconds: the real step builder, policy, adder, cache and
output processor run a loop of build / apply with two steps in flight (the scheduler's overlap),
against a model that samples token 7 for every row at once. The CPU budgets apply (512 prefill
tokens per step, 64 while anything decodes). A request's "own work" is its prefill chunks at
half the decoding budget (what the oldest prefill leaves it) plus one step per new token.
"""

from __future__ import annotations

import math
import random

import pytest

from radixmesh_wire.step_ops import StepOutcome
from scheduler_service.cache.allocator import SlotAllocator
from scheduler_service.cache.radix_cache import RadixCache
from scheduler_service.config import SchedulerConfig
from scheduler_service.planner.batch_builder import BatchBuilder, PlannedStep
from scheduler_service.planner.chunk_budget import ChunkBudget
from scheduler_service.planner.output_processor import apply_result
from scheduler_service.planner.policy import SchedulePolicy
from scheduler_service.request import Phase, Request, SamplingSpec
from scheduler_service.state import SchedState

BUDGET = ChunkBudget.resolve(0, 0, "cpu")  # 512 idle / 64 decoding
NEW = 16  # new tokens of each short request


class Loop:
    """Build, send, apply, with two steps in flight, counting steps."""

    def __init__(self) -> None:
        self.st = SchedState(cache=RadixCache(SlotAllocator(16384)), context_length=8192)
        cfg = SchedulerConfig()
        policy = SchedulePolicy("lpm", in_batch_prefix_threshold=cfg.in_batch_prefix_tokens)
        self.builder = BatchBuilder(cfg, self.st, policy, BUDGET)
        self.inflight: list[PlannedStep] = []
        self.steps = 0
        self.rng = random.Random(0)
        self._keys = 0

    def request(self, rid: str, prompt: list[int], new: int, prompt_lps: bool) -> Request:
        self._keys += 1
        r = Request(
            rid=rid,
            session="s",
            prompt=prompt,
            spec=SamplingSpec(
                temperature=0,
                max_new_tokens=new,
                ignore_eos=True,
                prompt_logprobs_from=0 if prompt_lps else -1,
            ),
            eos_ids=frozenset({2}),
            key=self._keys,
        )
        r.outbox = self.st.outbox("s")
        return r

    def ids(self, n: int) -> list[int]:
        return [self.rng.randrange(100, 40000) for _ in range(n)]

    def step(self) -> None:
        self.inflight.append(self.builder.build())
        self.steps += 1
        if len(self.inflight) < 2:
            return
        plan = self.inflight.pop(0)
        n = len(plan.sampling)
        apply_result(
            self.st, plan, StepOutcome(plan.ops.step_id, plan.sampling, [7] * n, [0.0] * n)
        )

    def run_until_done(self, reqs: list[Request], limit: int = 500) -> dict[str, int]:
        """Steps from now until each of `reqs` finished."""
        start, done = self.steps, dict[str, int]()
        while len(done) < len(reqs):
            assert self.steps - start < limit, "requests never finished"
            self.step()
            for r in reqs:
                if r.phase is Phase.DONE and r.rid not in done:
                    done[r.rid] = self.steps - start
        return done


def _own_work(prompt: int, new: int) -> int:
    return math.ceil(prompt / (BUDGET.decoding // 2)) + new


@pytest.mark.parametrize("prompt_lps", [False, True], ids=["plain", "prompt_logprobs"])
@pytest.mark.parametrize("short_prompt", [12, 40, 100])
@pytest.mark.parametrize("decoding", [False, True], ids=["alone", "beside_a_decoder"])
def test_a_short_request_beside_a_long_prefill_waits_a_few_steps(
    prompt_lps: bool, short_prompt: int, decoding: bool
) -> None:
    """Before: with another request decoding (budget 64, of which the long prompt's chunk was
    sure of 32), a 40- or 100-token prompt could not be admitted whole, and only one request
    could be chunked at a time: it waited for the 3,000-token prefill (63 and 64 steps, where its
    own work was 18 and 20)."""
    loop = Loop()
    if decoding:
        loop.st.waiting.append(loop.request("bg", loop.ids(20), 10_000, False))
        loop.step()
    long = loop.request("long", loop.ids(3000), NEW, prompt_lps)
    loop.st.waiting.append(long)
    loop.step()  # the long prompt's first chunk is in flight when the short one arrives
    short = loop.request("short", loop.ids(short_prompt), NEW, prompt_lps)
    loop.st.waiting.append(short)
    steps = loop.run_until_done([short])["short"]
    # own work, plus the step in flight ahead of it and the one after it (overlap)
    assert steps <= _own_work(short_prompt, NEW) + 2, steps
    assert long.phase is not Phase.DONE  # it really ran beside the long prefill


@pytest.mark.parametrize("long_prompt", [0, 3000])
def test_prompt_logprobs_do_not_serialize_requests_sharing_a_template(long_prompt: int) -> None:
    """Eight chat requests with one template arrive together. With prompt logprobs the cache
    may serve them nothing, yet in-batch prefix sharing deferred all but one of them per round
    (each deferral pointless): the last finished after 48 steps beside a long prefill where the
    same requests without prompt logprobs took 20 (24 and 19 without it). Now both take the same
    few steps."""

    def last_done(prompt_lps: bool) -> int:
        loop = Loop()
        if long_prompt:
            loop.st.waiting.append(loop.request("long", loop.ids(long_prompt), NEW, prompt_lps))
            loop.step()
        template = loop.ids(30)
        shorts = [loop.request(f"s{i}", template + loop.ids(8), NEW, prompt_lps) for i in range(8)]
        loop.st.waiting.extend(shorts)
        return max(loop.run_until_done(shorts).values())

    plain, with_lps = last_done(False), last_done(True)
    assert plain <= NEW + 4, plain
    assert with_lps <= plain + 1, (with_lps, plain)
