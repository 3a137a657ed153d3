"""flashinfer attention over the slot-indexed KV pool (CUDA only).

The pool keeps one slot per token (page size 1), so a row's flashinfer page indices are simply
its KV slots and every "last page" holds exactly one token. The pool's per-layer tensors
`k[layer]`, `v[layer]` ([capacity, kv_heads, head_dim]) are passed to flashinfer as they are: a
3-D cache is read as NHD with page size 1, so no copy and no change to KVPool.

Per step, `plan` builds the index arrays once and plans one wrapper:
- every row has q_len == 1 (a decode-only step): BatchDecodeWithPagedKVCacheWrapper;
- otherwise (prefill chunks, possibly mixed with decodes): one ragged, causal
  BatchPrefillWithPagedKVCacheWrapper over all rows; flashinfer aligns the causal mask to the
  end of each row's KV, so a cached prefix (kv_len > q_len) is handled as in the reference.
Per layer, `forward` writes this step's k/v at the step's out slots (index_copy) and runs the
planned wrapper; the fused layers store k/v themselves (fused_ops.rope_store into
`kv_target`) and call `attend`. GQA is native (num_qo_heads a multiple of num_kv_heads).

For the grouped-query shapes of Llama 3 (4 query heads per KV head and more) decode runs on
tensor cores, as SGLang does; that also reuses the prefill kernel module, so a process JIT-
compiles one attention module instead of two.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Final

import torch

from model_service.attention.backend import AttentionBackend, RowPlan
from model_service.kv_pool import KVPool

WORKSPACE_BYTES = 256 << 20  # flashinfer's split-kv scratch; 128 MiB is its documented minimum


class PlanGuard:
    """Keeps flashinfer's plan buffers from being overwritten before the GPU has read them.

    A wrapper's ``plan`` fills a pinned host buffer of that wrapper on the CPU and queues an
    async copy from it to the device on the current stream, with no wait. The host runs ahead
    of the GPU (two steps in flight, and a step whose host-tier load the stream waits for
    can sit queued for a long time), so a second plan on the same wrapper could rewrite the
    buffer before the first copy ran: the earlier step's kernels would then read the later
    step's plan and index outside the KV pool (the GPU host-tier run's illegal memory access).
    So before a wrapper plans again the host waits for the event recorded just after its
    previous plan; normally long passed, it costs nothing then."""

    def __init__(self, new_event: Callable[[], Any] | None = None) -> None:
        self._new_event = new_event if new_event is not None else torch.cuda.Event
        self._after: dict[int, Any] = {}  # id(wrapper) -> event after its last plan's copy

    def plan(self, wrapper: Any, *args: Any, **kwargs: Any) -> None:
        before = self._after.get(id(wrapper))
        if before is not None:
            before.synchronize()
        wrapper.plan(*args, **kwargs)
        after = self._new_event()
        after.record()
        self._after[id(wrapper)] = after


def flashinfer_available() -> tuple[bool, str]:
    """(usable, reason): flashinfer imports and a CUDA device is present."""
    if not torch.cuda.is_available():
        return False, "CUDA is not available"
    try:
        import flashinfer  # noqa: F401
    except Exception as exc:  # ImportError, or a broken install raising anything else
        return False, f"flashinfer does not import: {exc!r}"
    return True, ""


def use_tensor_core_decode(num_heads: int, num_kv_heads: int) -> bool:
    return num_heads // num_kv_heads >= 4


class FlashInferAttention:
    """An `AttentionBackend`. Importing this module needs no flashinfer: only constructing one
    does (`choose_attention` checks first)."""

    name: Final = "flashinfer"

    def __init__(
        self,
        pool: KVPool,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        workspace_bytes: int = WORKSPACE_BYTES,
        prefill_backend: str = "fa2",
        decode_tensor_cores: bool | None = None,
        workspace: torch.Tensor | None = None,
    ) -> None:
        import flashinfer

        dev = pool.k.device
        if dev.type != "cuda":
            raise ValueError("flashinfer attention needs the KV pool on a CUDA device")
        if num_heads % num_kv_heads:
            raise ValueError(f"{num_heads} query heads are not a multiple of {num_kv_heads}")
        self.pool = pool
        self.nh, self.nkv, self.hd = num_heads, num_kv_heads, head_dim
        self.dtype = pool.k.dtype
        self.device = dev
        self.tensor_cores = (
            use_tensor_core_decode(num_heads, num_kv_heads)
            if decode_tensor_cores is None
            else decode_tensor_cores
        )
        # Both wrappers share one float workspace: they run one after the other on one stream.
        self.workspace = (
            workspace
            if workspace is not None
            else torch.zeros(workspace_bytes, dtype=torch.uint8, device=dev)
        )
        self._prefill = flashinfer.BatchPrefillWithPagedKVCacheWrapper(
            self.workspace, "NHD", backend=prefill_backend
        )
        self._decode = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            self.workspace, "NHD", use_tensor_cores=self.tensor_cores
        )
        self._active: Any = None
        self.plans = PlanGuard()  # every plan of this backend's wrappers and its graphs'
        self.out_slots = torch.empty(0, dtype=torch.int64, device=dev)
        self.decode_only = False

    def plan(
        self, rows: Sequence[RowPlan], out_slots: torch.Tensor, kv_flat: torch.Tensor | None = None
    ) -> None:
        if not rows:
            raise ValueError("a step with no rows has nothing to attend")
        qo = [0]
        kv = [0]
        for r in rows:
            qo.append(qo[-1] + r.q_len)
            kv.append(kv[-1] + int(r.kv_slots.numel()))
        qo_indptr = torch.tensor(qo, dtype=torch.int32)
        kv_indptr = torch.tensor(kv, dtype=torch.int32)
        indices = kv_indices(rows, self.device, flat=kv_flat)
        last_page_len = torch.ones(len(rows), dtype=torch.int32)  # page size 1: always full
        self.out_slots = out_slots.to(self.device, torch.int64)
        self.decode_only = qo[-1] == len(rows)
        if self.decode_only:
            self.plans.plan(
                self._decode,
                kv_indptr,
                indices,
                last_page_len,
                self.nh,
                self.nkv,
                self.hd,
                1,
                q_data_type=self.dtype,
                kv_data_type=self.dtype,
            )
            self._active = self._decode
        else:
            self.plans.plan(
                self._prefill,
                qo_indptr,
                kv_indptr,
                indices,
                last_page_len,
                self.nh,
                self.nkv,
                self.hd,
                1,
                causal=True,
                q_data_type=self.dtype,
                kv_data_type=self.dtype,
            )
            self._active = self._prefill

    def forward(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        self.pool.write(layer, self.out_slots, k, v)
        return self.attend(layer, q)

    def kv_target(self, layer: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.pool.k[layer], self.pool.v[layer], self.out_slots

    def attend(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        return self._active.run(q.contiguous(), (self.pool.k[layer], self.pool.v[layer]))


def kv_indices(
    rows: Sequence[RowPlan],
    device: torch.device,
    pad: torch.Tensor | None = None,
    flat: torch.Tensor | None = None,
) -> torch.Tensor:
    """All rows' KV slots in row order as one int32 tensor on `device` (flashinfer's
    paged_kv_indices for page size 1), optionally followed by `pad`. `flat`: the rows' slots
    already concatenated on the device (the runner builds them so; saves a cat of B views)."""
    parts = [flat] if flat is not None else [r.kv_slots for r in rows]
    if pad is not None:
        parts.append(pad)
    flat = torch.cat([p.to(device, non_blocking=True) for p in parts])
    return flat.to(torch.int32)


def warm_up(attn: FlashInferAttention) -> None:
    """Plan and run one prefill and one decode on the pool's last slot, at start-up: flashinfer
    JIT-compiles (and may reject a shape) on first use, and that must happen here, where a
    failure falls back to the reference path, never inside a request's step. The last slot is
    the CUDA-graph scratch slot (outside the scheduler's index space); it is refilled after."""
    pool = attn.pool
    slot = pool.k.shape[1] - 1
    dev, dt = attn.device, attn.dtype
    for q_len in (2, 1):  # a prefill chunk, then a decode-only step
        slots = torch.full((q_len,), slot, dtype=torch.int64, device=dev)
        attn.plan([RowPlan(q_len, slots)], slots)
        q = torch.zeros(q_len, attn.nh, attn.hd, dtype=dt, device=dev)
        kv = torch.zeros(q_len, attn.nkv, attn.hd, dtype=dt, device=dev)
        attn.forward(0, q, kv, kv)
    torch.cuda.synchronize(dev)
    fill = float("nan") if pool.nan_fill else 0.0
    pool.k[:, slot] = fill
    pool.v[:, slot] = fill


def choose_attention(
    choice: str, pool: KVPool, num_heads: int, num_kv_heads: int, head_dim: int
) -> tuple[AttentionBackend, str]:
    """(backend, note) for `--attention auto|reference|flashinfer`.

    `auto` takes flashinfer where it can run (CUDA, flashinfer importable, a 16-bit KV dtype,
    a warm-up step that compiles and runs its kernels) and the reference otherwise. An explicit
    `flashinfer` that cannot run falls back to the reference with a note for the log: a serving
    process never fails to start over this, nor fails mid-request over a kernel never tried.
    """
    from model_service.attention.reference import ReferenceAttention

    if choice not in ("auto", "reference", "flashinfer"):
        raise ValueError(f"--attention {choice!r}: expected auto, reference or flashinfer")
    if choice == "reference":
        return ReferenceAttention(pool, num_heads, head_dim), ""
    if pool.k.device.type != "cuda":
        why = "the KV pool is not on a CUDA device"
    elif pool.k.dtype not in (torch.float16, torch.bfloat16):
        why = f"flashinfer kernels here take fp16/bf16 KV, not {pool.k.dtype}"
    else:
        ok, why = flashinfer_available()
        if ok:
            try:
                attn = FlashInferAttention(pool, num_heads, num_kv_heads, head_dim)
                warm_up(attn)
                return attn, ""
            except Exception as exc:  # a broken install, a failed JIT, an unsupported shape
                why = f"flashinfer failed to start: {exc!r}"
    note = ""
    if choice == "flashinfer" or pool.k.device.type == "cuda":
        note = f"flashinfer unavailable ({why}); using the reference attention"
    return ReferenceAttention(pool, num_heads, head_dim), note
