"""CUDA graphs for decode-only steps (flashinfer attention only).

A decode step of an 8B model launches several hundred small kernels; at batch 1 their launch
cost from Python is larger than the GPU time (docs/architecture.md: the weights alone take
5.3 ms to read). So at start-up we capture, for each batch-size bucket, one graph of the whole
forward pass (embedding, layers, final norm, lm_head) for `bucket` decode rows, and a decode-
only step whose batch fits a bucket replays the smallest such graph instead of running eagerly.

Per bucket the graph owns static inputs (token ids, positions, output slots: one [3, bucket]
int64 tensor filled with one copy) and its own flashinfer decode wrapper in CUDA-graph mode,
whose index buffers the graph reads. Before each replay the wrapper is re-planned outside the
graph (flashinfer's documented pattern; in graph mode its plan layout depends only on the batch
size, so the captured kernels stay valid for any KV lengths).

Padding rows (bucket - n of them) decode token 0 at position 0 and write and read only the
scratch slot, one KV slot past the scheduler's index space (the engine allocates the pool one
slot larger than the capacity it reports), so padding never touches a real sequence's KV.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from model_service.attention.backend import RowPlan
from model_service.attention.flashinfer import FlashInferAttention, kv_indices
from model_service.kv_pool import KVPool
from model_service.models.llama import LlamaForCausalLM

DEFAULT_BUCKETS = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128)
DEFAULT_MAX_BS = 128  # ModelServiceConfig.cuda_graph_max_bs (--cuda-graph-max-bs)


def buckets_up_to(max_bs: int = DEFAULT_MAX_BS) -> list[int]:
    """The batch-size buckets captured for `--cuda-graph-max-bs max_bs`: the default buckets up
    to `max_bs`, then `max_bs` itself; [] (no graphs) when it is 0 or less."""
    if max_bs <= 0:
        return []
    out = [b for b in DEFAULT_BUCKETS if b <= max_bs]
    if not out or out[-1] != max_bs:
        out.append(max_bs)
    return out


class _GraphAttention:
    """The attention seen by the captured forward pass (a `LayerAttention`): static slots, one
    wrapper, planned by `DecodeCudaGraphs` outside the graph."""

    def __init__(self, pool: KVPool, slots: torch.Tensor, wrapper: Any) -> None:
        self.pool = pool
        self.slots = slots
        self.wrapper = wrapper

    def forward(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        self.pool.write(layer, self.slots, k, v)
        return self.attend(layer, q)

    def kv_target(self, layer: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.pool.k[layer], self.pool.v[layer], self.slots

    def attend(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        return self.wrapper.run(q.contiguous(), (self.pool.k[layer], self.pool.v[layer]))


@dataclass
class _Captured:
    bs: int
    inputs: torch.Tensor  # int64 [3, bs]: token ids, positions, output slots
    wrapper: Any
    graph: torch.cuda.CUDAGraph
    logits: torch.Tensor  # fp32 [bs, vocab], written by each replay
    # Everything else the captured kernels read must outlive the capture: the graph holds raw
    # addresses, so a tensor freed after capture would be reused by the allocator and read as
    # garbage at replay (seen: out-of-range logit rows).
    keep: tuple[Any, ...] = ()


class DecodeCudaGraphs:
    def __init__(
        self,
        model: LlamaForCausalLM,
        attn: FlashInferAttention,
        buckets: Sequence[int],
        scratch_slot: int,
        max_kv_tokens: int,
    ) -> None:
        if not buckets:
            raise ValueError("no batch-size buckets to capture")
        if not 0 <= scratch_slot < attn.pool.k.shape[1]:
            raise ValueError(f"scratch slot {scratch_slot} is outside the KV pool")
        self.model = model
        self.attn = attn
        self.pool = attn.pool
        self.buckets = sorted(set(int(b) for b in buckets))
        self.scratch = scratch_slot
        dev = attn.device
        self.device = dev
        top = self.buckets[-1]
        # One index buffer for all buckets (only one graph replays at a time).
        self.indices_buf = torch.zeros(max_kv_tokens + top, dtype=torch.int32, device=dev)
        self.scratch_pad = torch.full((top,), scratch_slot, dtype=torch.int64, device=dev)
        self.graphs: dict[int, _Captured] = {}
        self.mempool: Any = None
        self.replays = 0
        self.capture_s = 0.0

    # -- start-up -----------------------------------------------------------------------------
    @torch.inference_mode()
    def capture(self) -> None:
        import time

        t0 = time.perf_counter()
        self.mempool = torch.cuda.graph_pool_handle()
        for bs in reversed(self.buckets):  # largest first: smaller graphs reuse its memory
            self.graphs[bs] = self._capture(bs)
        torch.cuda.synchronize(self.device)
        self.capture_s = time.perf_counter() - t0

    def _capture(self, bs: int) -> _Captured:
        import flashinfer

        dev = self.device
        wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            self.attn.workspace,
            "NHD",
            use_cuda_graph=True,
            use_tensor_cores=self.attn.tensor_cores,
            paged_kv_indptr_buffer=torch.arange(bs + 1, dtype=torch.int32, device=dev),
            paged_kv_indices_buffer=self.indices_buf,
            paged_kv_last_page_len_buffer=torch.ones(bs, dtype=torch.int32, device=dev),
        )
        inputs = torch.zeros(3, bs, dtype=torch.int64, device=dev)
        inputs[2].fill_(self.scratch)
        logit_rows = torch.arange(bs, device=dev)
        shim = _GraphAttention(self.pool, inputs[2], wrapper)
        self._plan(wrapper, bs, [], 0)  # every row a padding row: KV = [scratch]

        def fwd() -> torch.Tensor:
            return self.model(inputs[0], inputs[1], shim, logit_rows)

        side = torch.cuda.Stream(dev)
        side.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(side):
            for _ in range(2):  # warm-up: lazy inits and autotuning stay out of the graph
                fwd()
        torch.cuda.current_stream(dev).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.mempool):
            logits = fwd()
        return _Captured(bs, inputs, wrapper, graph, logits, keep=(logit_rows, shim))

    def _plan(
        self,
        wrapper: Any,
        bs: int,
        rows: Sequence[RowPlan],
        n: int,
        flat: torch.Tensor | None = None,
    ) -> None:
        lens = [int(r.kv_slots.numel()) for r in rows] + [1] * (bs - n)
        indptr = torch.zeros(bs + 1, dtype=torch.int32)
        indptr[1:] = torch.tensor(lens, dtype=torch.int32).cumsum(0)
        pad = self.scratch_pad[: bs - n] if bs > n else None
        if rows:
            indices = kv_indices(rows, self.device, pad, flat)
        else:
            indices = self.scratch_pad[:bs].to(torch.int32)
        a = self.attn
        a.plans.plan(  # waits for this wrapper's previous plan to be read (PlanGuard)
            wrapper,
            indptr,
            indices,
            torch.ones(bs, dtype=torch.int32),
            a.nh,
            a.nkv,
            a.hd,
            1,
            q_data_type=a.dtype,
            kv_data_type=a.dtype,
        )

    # -- per step -----------------------------------------------------------------------------
    def bucket_for(self, n: int) -> int | None:
        for b in self.buckets:
            if b >= n:
                return b
        return None

    def run(
        self,
        ids: torch.Tensor,
        positions: torch.Tensor,
        out_slots: torch.Tensor,
        rows: Sequence[RowPlan],
        started: torch.cuda.Event | None = None,
        kv_flat: torch.Tensor | None = None,
    ) -> torch.Tensor | None:
        """Logits [n, vocab] (fp32) of a decode-only step by graph replay, or None when no
        bucket fits (the caller then runs the step eagerly). `ids`, `positions` and
        `out_slots` are on the device (decode inputs may not have reached the host; the
        runner stages the rest in one copy); `started` is recorded just before the replay.
        The returned tensor is the graph's static output: read it before the next replay."""
        n = int(ids.numel())
        bs = self.bucket_for(n)
        if bs is None or n == 0:
            return None
        total = sum(int(r.kv_slots.numel()) for r in rows) + (bs - n)
        if total > self.indices_buf.numel():
            return None
        g = self.graphs[bs]
        pad = bs - n
        g.inputs[0, :n].copy_(ids)
        g.inputs[1, :n].copy_(positions)
        g.inputs[2, :n].copy_(out_slots)
        if pad:  # padded rows: token 0 at position 0, writing the scratch slot
            g.inputs[:2, n:].zero_()
            g.inputs[2, n:].fill_(self.scratch)
        self._plan(g.wrapper, bs, rows, n, kv_flat)
        if started is not None:
            started.record()
        g.graph.replay()
        self.replays += 1
        return g.logits[:n]


def capture_decode_graphs(
    model: LlamaForCausalLM,
    attn: FlashInferAttention,
    scratch_slot: int,
    max_kv_tokens: int,
    buckets: Sequence[int] | None = None,
    max_bs: int = DEFAULT_MAX_BS,
) -> DecodeCudaGraphs | None:
    """Capture decode graphs at start-up: `buckets`, else `buckets_up_to(max_bs)`; None when
    turned off (bucket list empty, e.g. `--cuda-graph-max-bs 0`)."""
    bl = list(buckets) if buckets is not None else buckets_up_to(max_bs)
    if not bl:
        return None
    graphs = DecodeCudaGraphs(model, attn, bl, scratch_slot, max_kv_tokens)
    graphs.capture()
    return graphs
