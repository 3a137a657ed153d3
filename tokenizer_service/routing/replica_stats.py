"""The front door's admin calls over every replica: GetStats (summed, with one `ReplicaStats`
per replica: what the router knows of it and its own stats) and FlushCache (all of them).

A replica that does not answer is listed with its error; the call fails (UNAVAILABLE) only when
none answers.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import grpc

from radixmesh_wire.pb import api_pb2, scheduler_pb2
from tokenizer_service.routing.replica_set import ReplicaSet
from tokenizer_service.routing.scheduler_link import SchedulerLink

# Stats fields that are not plain sums over replicas (rates, and the front door's own count).
_NOT_SUMMED = {"token_usage", "cache_hit_rate", "frontend_inflight", "replicas", "router_policy"}


class NoReplicaAnswered(Exception):
    pass


def replica_stats(replicas: ReplicaSet, link: SchedulerLink) -> api_pb2.ReplicaStats:
    v = link.view
    counts = replicas.counts.get(link.address)
    out = api_pb2.ReplicaStats(
        address=link.address,
        instance_id=v.instance_id,
        connected=link.connected.is_set(),
        serving=link.serving,
        draining=link.draining,
        moved_in=counts.moved_in if counts else 0,
        exact_cache=v.exact,
        cached_blocks=len(v.blocks),
        cached_host_blocks=v.host_blocks,
        load_tokens=v.load_tokens,
        inflight=len(link.live),
    )
    if counts:
        out.routed.update(counts.by_reason)
    if v.reported is not None:
        r = v.reported
        out.waiting_requests = r.waiting_requests
        out.running_requests = r.running_requests
        out.waiting_tokens = r.waiting_tokens
        out.running_tokens = r.running_tokens
        out.kv_free = r.kv_free
    return out


async def gather_stats(replicas: ReplicaSet, timeout: float = 5.0) -> api_pb2.Stats:
    """Raises NoReplicaAnswered (with every replica's error) when no replica answers."""
    links = list(replicas.links.values())
    answers = await asyncio.gather(
        *(lk.stub.GetStats(api_pb2.GetStatsRequest(), timeout=timeout) for lk in links),
        return_exceptions=True,
    )
    total = api_pb2.Stats(router_policy=replicas.router.policy.value)
    errors = []
    for link, answer in zip(links, answers, strict=True):
        rs = replica_stats(replicas, link)
        if isinstance(answer, api_pb2.Stats):
            rs.scheduler.CopyFrom(answer)
            _add(total, answer)
        else:
            rs.error = _describe(answer)
            errors.append(f"{link.address}: {rs.error}")
        total.replicas.append(rs)
    if len(errors) == len(links):
        raise NoReplicaAnswered("; ".join(errors) or "no scheduler replica is known yet")
    if total.kv_capacity:
        total.token_usage = 1.0 - total.kv_free / total.kv_capacity
    if total.prompt_tokens:
        total.cache_hit_rate = total.cached_prompt_tokens / total.prompt_tokens
    total.frontend_inflight = replicas.inflight
    return total


def _add(total: api_pb2.Stats, one: api_pb2.Stats) -> None:
    for f in api_pb2.Stats.DESCRIPTOR.fields:
        if f.name not in _NOT_SUMMED:
            setattr(total, f.name, getattr(total, f.name) + getattr(one, f.name))


def _describe(exc: BaseException) -> str:
    if isinstance(exc, grpc.aio.AioRpcError):
        return f"{exc.code().name}: {exc.details()}"
    return f"{type(exc).__name__}: {exc}"


@dataclass(frozen=True)
class FlushResult:
    flushed: bool
    evicted_tokens: int
    message: str


async def flush_all(replicas: ReplicaSet, timeout: float = 10.0) -> FlushResult:
    """FlushCache on every replica: flushed only when every one flushed (each refuses while it
    has work, as SGLang does); the message names the ones that did not."""
    links = list(replicas.links.values())
    if not links:
        raise NoReplicaAnswered("no scheduler replica is known yet")
    answers = await asyncio.gather(
        *(lk.stub.FlushCache(scheduler_pb2.FlushCacheRequest(), timeout=timeout) for lk in links),
        return_exceptions=True,
    )
    evicted, refused, failed = 0, [], []
    for link, answer in zip(links, answers, strict=True):
        if isinstance(answer, scheduler_pb2.FlushCacheResponse):
            evicted += answer.evicted_tokens
            if not answer.flushed:
                refused.append((link.address, answer.message))
        else:
            failed.append(f"{link.address}: {_describe(answer)}")
    if len(failed) == len(links):
        raise NoReplicaAnswered("; ".join(failed))
    if len(links) == 1 and refused:  # one replica: its own words
        return FlushResult(False, evicted, refused[0][1])
    problems = [f"{a}: {m}" for a, m in refused] + failed
    return FlushResult(not problems, evicted, "; ".join(problems))
