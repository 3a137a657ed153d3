"""Element-wise pieces of the fused Llama layer, two interchangeable implementations.

`TorchOps` (any device) and `TritonOps` (CUDA, one Triton kernel per op) compute:
- `rmsnorm(x, w, eps)`: RMSNorm in fp32, one rounding to x's dtype at the end;
- `add_rmsnorm(x, residual, w, eps) -> (normed, residual)`: residual <- x + residual (rounded to
  the model dtype, as HF's `x = x + h` is), then RMSNorm of that sum. The Triton kernel does
  both in one pass and updates `residual` in place;
- `rope(x, cos, sin)`: rotate-half RoPE in place on x viewed as [T, heads, 2, dim/2] (the q|k
  columns of the fused qkv output); cos/sin are [T, dim/2] in the model dtype, as HF casts them;
- `silu_mul(gu)`: silu(gate) * up for gu = [T, 2 * inter] holding gate | up;
- `rope_store(qkv, nh, nkv, cos, sin, k_cache, v_cache, slots) -> q`: RoPE on the q and k
  columns of the fused qkv output, k and v stored at the step's KV slots, and q returned as a
  contiguous [T, nh, head_dim] tensor for the attention kernel. The Triton kernel does all of it
  in one launch, where the torch form takes RoPE, two index_copy and a copy of q.

Per decoder layer at decode that is 2 (norm), 1 (rope + KV store), 1 (SiLU-and-mul) Triton
kernels in place of 4, 6 and 2 torch kernels. `pick_ops(device)` returns TritonOps only after
a self-check against TorchOps on random inputs passes on that device, so a Triton that is
missing, fails to compile or computes wrong falls back to TorchOps (and says why).
"""

from __future__ import annotations

import os
from typing import Any

import torch
from torch.nn import functional as F

ENV_TRITON = "RADIXMESH_TRITON"  # 0: never use the Triton kernels


class TorchOps:
    name = "torch"

    @staticmethod
    def rmsnorm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
        return torch.rms_norm(x, (x.shape[-1],), w, eps)

    @staticmethod
    def add_rmsnorm(
        x: torch.Tensor, residual: torch.Tensor, w: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        residual = residual + x
        return torch.rms_norm(residual, (x.shape[-1],), w, eps), residual

    @staticmethod
    def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
        # x * (c, c) + flip(x) * (-s, s) = (x1 c - x2 s, x2 c + x1 s): three kernels
        t, half = cos.shape
        cc = torch.stack((cos, cos), dim=1).view(t, 1, 2, half)
        ss = torch.stack((-sin, sin), dim=1).view(t, 1, 2, half)
        swapped = x.flip(2)
        x.mul_(cc)
        x.addcmul_(swapped, ss)

    @staticmethod
    def silu_mul(gu: torch.Tensor) -> torch.Tensor:
        gate, up = gu.split(gu.shape[-1] // 2, dim=-1)
        return F.silu(gate).mul_(up)

    @staticmethod
    def rope_store(
        qkv: torch.Tensor,
        nh: int,
        nkv: int,
        cos: torch.Tensor,
        sin: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        slots: torch.Tensor,
    ) -> torch.Tensor:
        t, hd = qkv.shape[0], k_cache.shape[-1]
        nq, nqk = nh * hd, (nh + nkv) * hd
        TorchOps.rope(qkv[:, :nqk].view(t, nh + nkv, 2, hd // 2), cos, sin)
        k_cache.index_copy_(0, slots, qkv[:, nq:nqk].view(t, nkv, hd).to(k_cache.dtype))
        v_cache.index_copy_(0, slots, qkv[:, nqk:].view(t, nkv, hd).to(v_cache.dtype))
        return qkv[:, :nq].reshape(t, nh, hd)


def _kernels() -> Any:
    """Define the Triton kernels on first use (importing triton is slow and optional)."""
    import triton
    import triton.language as tl

    @triton.jit
    def add_rmsnorm_kernel(
        x_ptr,
        r_ptr,
        w_ptr,
        out_ptr,
        n_cols,
        x_stride,
        r_stride,
        out_stride,
        eps,
        HAS_RES: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK)
        mask = cols < n_cols
        x = tl.load(x_ptr + row * x_stride + cols, mask=mask, other=0.0).to(tl.float32)
        if HAS_RES:
            r = tl.load(r_ptr + row * r_stride + cols, mask=mask, other=0.0).to(tl.float32)
            s = (x + r).to(r_ptr.dtype.element_ty)  # the residual stream keeps model dtype
            tl.store(r_ptr + row * r_stride + cols, s, mask=mask)
            x = s.to(tl.float32)
        var = tl.sum(x * x, axis=0) / n_cols
        rstd = 1.0 / tl.sqrt(var + eps)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        y = x * rstd * w
        tl.store(out_ptr + row * out_stride + cols, y.to(out_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def rope_kernel(
        x_ptr,
        cos_ptr,
        sin_ptr,
        row_stride,
        n_heads,
        cs_stride,
        HALF: tl.constexpr,
        BLOCK_H: tl.constexpr,
    ):
        t = tl.program_id(0).to(tl.int64)
        h = tl.arange(0, BLOCK_H)[:, None]
        d = tl.arange(0, HALF)[None, :]
        mask = (h < n_heads) & (d < HALF)
        base = x_ptr + t * row_stride + h * (2 * HALF) + d
        x1 = tl.load(base, mask=mask, other=0.0).to(tl.float32)
        x2 = tl.load(base + HALF, mask=mask, other=0.0).to(tl.float32)
        c = tl.load(cos_ptr + t * cs_stride + d).to(tl.float32)
        s = tl.load(sin_ptr + t * cs_stride + d).to(tl.float32)
        tl.store(base, (x1 * c - x2 * s).to(x_ptr.dtype.element_ty), mask=mask)
        tl.store(base + HALF, (x2 * c + x1 * s).to(x_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def silu_mul_kernel(gu_ptr, out_ptr, n, gu_stride, out_stride, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = cols < n
        g = tl.load(gu_ptr + row * gu_stride + cols, mask=mask, other=0.0).to(tl.float32)
        u = tl.load(gu_ptr + row * gu_stride + n + cols, mask=mask, other=0.0).to(tl.float32)
        y = g / (1.0 + tl.exp(-g)) * u
        tl.store(out_ptr + row * out_stride + cols, y.to(out_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def rope_store_kernel(
        qkv_ptr,
        q_ptr,
        k_ptr,
        v_ptr,
        slots_ptr,
        cos_ptr,
        sin_ptr,
        row_stride,
        cs_stride,
        NQ: tl.constexpr,
        NKV: tl.constexpr,
        HALF: tl.constexpr,
        BLOCK_Q: tl.constexpr,
        BLOCK_KV: tl.constexpr,
    ):
        # program (t, 0): q heads of token t -> q_out; program (t, 1): its k heads rotated and
        # its v heads, both stored at KV slot slots[t] (caches are [capacity, NKV, 2 * HALF]).
        t = tl.program_id(0).to(tl.int64)
        d = tl.arange(0, HALF)[None, :]
        row = qkv_ptr + t * row_stride
        c = tl.load(cos_ptr + t * cs_stride + d).to(tl.float32)
        s = tl.load(sin_ptr + t * cs_stride + d).to(tl.float32)
        # Each branch names its own variables: Triton types a name assigned in both branches
        # once, and the q and kv tiles have different shapes.
        if tl.program_id(1) == 0:
            hq = tl.arange(0, BLOCK_Q)[:, None]
            mq = (hq < NQ) & (d < HALF)
            x1 = tl.load(row + hq * (2 * HALF) + d, mask=mq, other=0.0).to(tl.float32)
            x2 = tl.load(row + hq * (2 * HALF) + HALF + d, mask=mq, other=0.0).to(tl.float32)
            qd = q_ptr + t * (NQ * 2 * HALF) + hq * (2 * HALF) + d
            tl.store(qd, (x1 * c - x2 * s).to(q_ptr.dtype.element_ty), mask=mq)
            tl.store(qd + HALF, (x2 * c + x1 * s).to(q_ptr.dtype.element_ty), mask=mq)
        else:
            slot = tl.load(slots_ptr + t).to(tl.int64)
            hk = tl.arange(0, BLOCK_KV)[:, None]
            mk = (hk < NKV) & (d < HALF)
            kb = row + (NQ + hk) * (2 * HALF) + d
            k1 = tl.load(kb, mask=mk, other=0.0).to(tl.float32)
            k2 = tl.load(kb + HALF, mask=mk, other=0.0).to(tl.float32)
            kd = k_ptr + slot * (NKV * 2 * HALF) + hk * (2 * HALF) + d
            tl.store(kd, (k1 * c - k2 * s).to(k_ptr.dtype.element_ty), mask=mk)
            tl.store(kd + HALF, (k2 * c + k1 * s).to(k_ptr.dtype.element_ty), mask=mk)
            vb = row + (NQ + NKV + hk) * (2 * HALF) + d
            vd = v_ptr + slot * (NKV * 2 * HALF) + hk * (2 * HALF) + d
            ty = v_ptr.dtype.element_ty
            tl.store(vd, tl.load(vb, mask=mk, other=0.0).to(ty), mask=mk)
            tl.store(vd + HALF, tl.load(vb + HALF, mask=mk, other=0.0).to(ty), mask=mk)

    return triton, add_rmsnorm_kernel, rope_kernel, silu_mul_kernel, rope_store_kernel


class TritonOps:
    name = "triton"

    def __init__(self) -> None:
        self.triton, self._norm, self._rope, self._silu, self._rope_store = _kernels()

    def _norm_launch(
        self, x: torch.Tensor, r: torch.Tensor | None, w: torch.Tensor, eps: float
    ) -> torch.Tensor:
        n = x.shape[-1]
        assert x.stride(-1) == 1 and (r is None or r.stride(-1) == 1)
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        block = self.triton.next_power_of_2(n)
        warps = 8 if block >= 4096 else 4
        self._norm[(x.shape[0],)](
            x,
            r if r is not None else x,
            w,
            out,
            n,
            x.stride(0),
            r.stride(0) if r is not None else 0,
            out.stride(0),
            eps,
            HAS_RES=r is not None,
            BLOCK=block,
            num_warps=warps,
        )
        return out

    def rmsnorm(self, x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
        return self._norm_launch(x, None, w, eps)

    def add_rmsnorm(
        self, x: torch.Tensor, residual: torch.Tensor, w: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return self._norm_launch(x, residual, w, eps), residual

    def rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
        t, heads, two, half = x.shape
        assert two == 2 and x.stride(3) == 1 and x.stride(2) == half and x.stride(1) == 2 * half
        assert cos.stride(1) == 1 and sin.stride() == cos.stride() and cos.shape == (t, half)
        self._rope[(t,)](
            x,
            cos,
            sin,
            x.stride(0),
            heads,
            cos.stride(0),
            HALF=half,
            BLOCK_H=self.triton.next_power_of_2(heads),
            num_warps=4,
        )

    def silu_mul(self, gu: torch.Tensor) -> torch.Tensor:
        t, n2 = gu.shape
        n = n2 // 2
        assert gu.stride(1) == 1
        out = torch.empty((t, n), dtype=gu.dtype, device=gu.device)
        block = 1024
        self._silu[(t, self.triton.cdiv(n, block))](
            gu, out, n, gu.stride(0), out.stride(0), BLOCK=block, num_warps=4
        )
        return out

    def rope_store(
        self,
        qkv: torch.Tensor,
        nh: int,
        nkv: int,
        cos: torch.Tensor,
        sin: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        slots: torch.Tensor,
    ) -> torch.Tensor:
        t, hd = qkv.shape[0], k_cache.shape[-1]
        assert qkv.stride(1) == 1 and qkv.shape[1] == (nh + 2 * nkv) * hd
        assert k_cache.is_contiguous() and v_cache.is_contiguous()
        assert k_cache.shape[1:] == (nkv, hd) and v_cache.shape == k_cache.shape
        assert cos.stride(1) == 1 and sin.stride() == cos.stride() and cos.shape == (t, hd // 2)
        assert slots.shape == (t,) and slots.dtype == torch.int64
        q = torch.empty((t, nh, hd), dtype=qkv.dtype, device=qkv.device)
        if t == 0:
            return q
        np2 = self.triton.next_power_of_2
        self._rope_store[(t, 2)](
            qkv,
            q,
            k_cache,
            v_cache,
            slots,
            cos,
            sin,
            qkv.stride(0),
            cos.stride(0),
            NQ=nh,
            NKV=nkv,
            HALF=hd // 2,
            BLOCK_Q=np2(nh),
            BLOCK_KV=np2(nkv),
            num_warps=4,
        )
        return q


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))


def self_check(
    ops: Any, device: torch.device, dtype: torch.dtype = torch.bfloat16, tol: float = 1e-2
) -> None:
    """Raise unless `ops` matches TorchOps on random inputs (odd sizes, strided views)."""
    g = torch.Generator(device="cpu").manual_seed(0)

    def rnd(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g).to(device=device, dtype=dtype)

    ref = TorchOps()
    for t, n in ((1, 4096), (5, 200)):
        x, r, w = rnd(t, n), rnd(t, n), rnd(n)
        if _rel(ops.rmsnorm(x, w, 1e-5), ref.rmsnorm(x, w, 1e-5)) > tol:
            raise RuntimeError(f"rmsnorm differs at {t}x{n}")
        r1, r2 = r.clone(), r.clone()
        y1, s1 = ops.add_rmsnorm(x, r1, w, 1e-5)
        y2, s2 = ref.add_rmsnorm(x, r2, w, 1e-5)
        if _rel(y1, y2) > tol or _rel(s1, s2) > tol:
            raise RuntimeError(f"add_rmsnorm differs at {t}x{n}")
    for t, heads, half, extra in ((1, 40, 64, 2048), (7, 6, 16, 40)):
        wide = rnd(t, heads * 2 * half + extra)
        ang = torch.randn(t, half, generator=g).to(device)
        cos, sin = ang.cos().to(dtype), ang.sin().to(dtype)
        a, b = wide.clone(), wide.clone()
        ops.rope(a[:, : heads * 2 * half].view(t, heads, 2, half), cos, sin)
        ref.rope(b[:, : heads * 2 * half].view(t, heads, 2, half), cos, sin)
        if _rel(a, b) > tol or not torch.equal(
            a[:, heads * 2 * half :], wide[:, heads * 2 * half :]
        ):
            raise RuntimeError(f"rope differs at T={t} heads={heads}")
    for t, n in ((1, 14336), (3, 1500)):
        gu = rnd(t, 2 * n)
        if _rel(ops.silu_mul(gu), ref.silu_mul(gu)) > tol:
            raise RuntimeError(f"silu_mul differs at {t}x{n}")
    for t, nh, nkv, hd in ((1, 32, 8, 128), (5, 6, 3, 32)):
        qkv = rnd(t, (nh + 2 * nkv) * hd)
        ang = torch.randn(t, hd // 2, generator=g).to(device)
        cos, sin = ang.cos().to(dtype), ang.sin().to(dtype)
        slots = torch.randperm(2 * t + 3, generator=g)[:t].to(device)
        caches = [rnd(2 * t + 3, nkv, hd) for _ in range(2)]
        mine = [c.clone() for c in caches]
        q1 = ops.rope_store(qkv.clone(), nh, nkv, cos, sin, mine[0], mine[1], slots)
        q2 = ref.rope_store(qkv.clone(), nh, nkv, cos, sin, caches[0], caches[1], slots)
        if _rel(q1, q2) > tol or any(_rel(a, b) > tol for a, b in zip(mine, caches, strict=True)):
            raise RuntimeError(f"rope_store differs at T={t} heads={nh}/{nkv}")


def pick_ops(device: torch.device, want: str = "auto") -> tuple[Any, str]:
    """(ops, note): TritonOps on CUDA when wanted and its self-check passes, else TorchOps;
    `note` says why Triton was not taken ('' when it was, or when it was not wanted)."""
    if want == "torch" or os.environ.get(ENV_TRITON, "1").strip() == "0":
        return TorchOps(), ""
    if device.type != "cuda" and not os.environ.get("TRITON_INTERPRET"):
        return TorchOps(), "" if want == "auto" else "triton needs CUDA"
    try:
        ops = TritonOps()
        self_check(ops, device)
    except Exception as exc:  # missing, fails to compile, or wrong: keep the torch path
        # A Triton CompilationError's text starts with the kernel source: keep its first line
        # (where) and its last (why).
        lines = str(exc).strip().splitlines() or [""]
        why = lines[0] if len(lines) == 1 else f"{lines[0]} ... {lines[-1]}"
        return TorchOps(), f"triton kernels not used: {type(exc).__name__}: {why}"[:500]
    return ops, ""
