"""Llama-family decoder (Llama 2/3/3.1, SmolLM2, Qwen2) written for a slot-indexed KV pool.

Parameter names match Hugging Face checkpoints (`model.layers.N.self_attn.q_proj.weight`, ...),
so safetensors load without renaming. Attention is delegated to a backend (reference torch on
any device, flashinfer on CUDA) that reads and writes the shared KV pool by slot index; the
model itself never knows where a sequence's KV lives.

Two forms of each layer, same function:
- separate (as loaded): q/k/v and gate/up are separate projections, RMSNorm and RoPE written
  out as HF writes them. The CPU reference path always runs this form (token-exact vs HF).
- fused (`LlamaForCausalLM.fuse()`, done at load time on CUDA by `weights.py`): one q|k|v
  matmul and one gate|up matmul (weights concatenated once), the residual add folded into the
  next RMSNorm, RoPE in place on the q|k columns of the qkv output, SiLU-and-mul in one op. The
  element-wise ops come from `fused_ops`: one Triton kernel each on CUDA (after a self-check),
  else a few torch kernels. At batch 1 a decode step is memory-bound on the weights, so the win
  is fewer kernels per layer (about 12 with Triton, 16 with torch ops, 45 before) and one GEMV
  where there were three (the 8 MB k/v GEMVs alone cannot fill the GPU).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import nn
from torch.nn import functional as F

from model_service.attention.backend import LayerAttention


class Reducer(Protocol):
    """The tensor-parallel collectives the model calls (`model_service.tp.comm.TPComm`)."""

    @property
    def rank(self) -> int: ...

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor: ...

    def all_gather_last(self, x: torch.Tensor) -> torch.Tensor: ...


@dataclass(frozen=True)
class LlamaArgs:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict[str, Any] | None
    max_position: int
    tie_word_embeddings: bool
    attention_bias: bool  # Qwen2 has biases on q/k/v
    model_type: str

    @staticmethod
    def from_hf_config(cfg: Any) -> LlamaArgs:
        heads = cfg.num_attention_heads
        rope = getattr(cfg, "rope_parameters", None) or {}
        theta = rope.get("rope_theta", getattr(cfg, "rope_theta", 10000.0))
        scaling = getattr(cfg, "rope_scaling", None) or (
            rope if rope.get("rope_type", "default") != "default" else None
        )
        mtype = getattr(cfg, "model_type", "llama")
        return LlamaArgs(
            vocab_size=cfg.vocab_size,
            hidden_size=cfg.hidden_size,
            intermediate_size=cfg.intermediate_size,
            num_layers=cfg.num_hidden_layers,
            num_heads=heads,
            num_kv_heads=getattr(cfg, "num_key_value_heads", None) or heads,
            head_dim=getattr(cfg, "head_dim", None) or cfg.hidden_size // heads,
            rms_norm_eps=cfg.rms_norm_eps,
            rope_theta=float(theta),
            rope_scaling=dict(scaling) if scaling else None,
            max_position=getattr(cfg, "max_position_embeddings", 4096),
            tie_word_embeddings=bool(getattr(cfg, "tie_word_embeddings", False)),
            attention_bias=bool(getattr(cfg, "attention_bias", mtype == "qwen2")),
            model_type=mtype,
        )


def rope_inv_freq(args: LlamaArgs) -> torch.Tensor:
    dim = args.head_dim
    inv = 1.0 / (args.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    sc = args.rope_scaling
    if sc and sc.get("rope_type", sc.get("type")) == "llama3":
        # Llama 3.1: long wavelengths are slowed by `factor`, short ones kept, smooth between.
        factor = sc["factor"]
        low, high = sc.get("low_freq_factor", 1.0), sc.get("high_freq_factor", 4.0)
        old_ctx = sc.get("original_max_position_embeddings", 8192)
        wavelen = 2 * math.pi / inv
        smooth = (old_ctx / wavelen - low) / (high - low)
        scaled = torch.where(wavelen > old_ctx / low, inv / factor, inv)
        mid = (wavelen <= old_ctx / low) & (wavelen >= old_ctx / high)
        scaled = torch.where(mid, (1 - smooth) * inv / factor + smooth * inv, scaled)
        inv = scaled
    elif sc and sc.get("rope_type", sc.get("type")) not in (None, "default"):
        raise ValueError(f"rope scaling {sc!r} is not supported")
    return inv.float()


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [T, heads, dim]; cos/sin: [T, dim/2]. HF's rotate-half convention."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    c, s = cos.unsqueeze(1), sin.unsqueeze(1)
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)


def _reduce(comm: Reducer | None, x: torch.Tensor) -> torch.Tensor:
    """Row-parallel output: each rank holds a partial sum (no-op without tensor parallelism)."""
    return x if comm is None else comm.all_reduce(x)


class Attention(nn.Module):
    def __init__(self, args: LlamaArgs, layer: int, comm: Reducer | None = None) -> None:
        super().__init__()
        self.layer = layer
        self.comm = comm
        self.nh, self.nkv, self.hd = args.num_heads, args.num_kv_heads, args.head_dim
        bias = args.attention_bias
        self.q_proj = nn.Linear(args.hidden_size, self.nh * self.hd, bias=bias)
        self.k_proj = nn.Linear(args.hidden_size, self.nkv * self.hd, bias=bias)
        self.v_proj = nn.Linear(args.hidden_size, self.nkv * self.hd, bias=bias)
        self.o_proj = nn.Linear(self.nh * self.hd, args.hidden_size, bias=False)
        self.fused = False

    def fuse(self) -> None:
        """Replace q/k/v with one projection whose output columns are q | k | v."""
        if self.fused:
            return
        parts = (self.q_proj, self.k_proj, self.v_proj)
        self.qkv_proj = _concat_linear(parts)
        del self.q_proj, self.k_proj, self.v_proj
        self.fused = True

    def forward_fused(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        attn: LayerAttention,
        ops: Any,
    ) -> torch.Tensor:
        t = x.shape[0]
        k_cache, v_cache, slots = attn.kv_target(self.layer)
        q = ops.rope_store(self.qkv_proj(x), self.nh, self.nkv, cos, sin, k_cache, v_cache, slots)
        out = attn.attend(self.layer, q)
        return _reduce(self.comm, self.o_proj(out.reshape(t, self.nh * self.hd)))

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attn: LayerAttention
    ) -> torch.Tensor:
        t = x.shape[0]
        q = self.q_proj(x).view(t, self.nh, self.hd)
        k = self.k_proj(x).view(t, self.nkv, self.hd)
        v = self.v_proj(x).view(t, self.nkv, self.hd)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        out = attn.forward(self.layer, q, k, v)
        return _reduce(self.comm, self.o_proj(out.reshape(t, self.nh * self.hd)))


class MLP(nn.Module):
    def __init__(self, args: LlamaArgs, comm: Reducer | None = None) -> None:
        super().__init__()
        self.comm = comm
        self.gate_proj = nn.Linear(args.hidden_size, args.intermediate_size, bias=False)
        self.up_proj = nn.Linear(args.hidden_size, args.intermediate_size, bias=False)
        self.down_proj = nn.Linear(args.intermediate_size, args.hidden_size, bias=False)
        self.fused = False

    def fuse(self) -> None:
        """Replace gate/up with one projection whose output columns are gate | up."""
        if self.fused:
            return
        self.gate_up_proj = _concat_linear((self.gate_proj, self.up_proj))
        del self.gate_proj, self.up_proj
        self.fused = True

    def forward_fused(self, x: torch.Tensor, ops: Any) -> torch.Tensor:
        return _reduce(self.comm, self.down_proj(ops.silu_mul(self.gate_up_proj(x))))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _reduce(self.comm, self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x)))


def _concat_linear(parts: tuple[nn.Linear, ...]) -> nn.Linear:
    """One Linear computing all of `parts` (outputs side by side), holding their weights
    concatenated. The parts' storage is released when the caller drops them."""
    w = torch.cat([p.weight.detach() for p in parts], dim=0)
    bias = parts[0].bias is not None
    with torch.device("meta"):
        fused = nn.Linear(w.shape[1], w.shape[0], bias=bias)
    fused.weight = nn.Parameter(w, requires_grad=False)
    if bias:
        b = torch.cat([p.bias.detach() for p in parts if p.bias is not None])
        fused.bias = nn.Parameter(b, requires_grad=False)
    return fused


class DecoderLayer(nn.Module):
    def __init__(self, args: LlamaArgs, layer: int, comm: Reducer | None = None) -> None:
        super().__init__()
        self.self_attn = Attention(args, layer, comm)
        self.mlp = MLP(args, comm)
        self.input_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attn: LayerAttention
    ) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, attn)
        return x + self.mlp(self.post_attention_layernorm(x))

    def forward_fused(
        self,
        x: torch.Tensor,
        residual: torch.Tensor | None,
        cos: torch.Tensor,
        sin: torch.Tensor,
        attn: LayerAttention,
        ops: Any,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(x, residual) -> (this layer's MLP output, residual stream before adding it): the
        residual add is done by the next norm (x + residual, as the separate form adds)."""
        n1, n2 = self.input_layernorm, self.post_attention_layernorm
        if residual is None:
            residual, h = x, ops.rmsnorm(x, n1.weight, n1.eps)
        else:
            h, residual = ops.add_rmsnorm(x, residual, n1.weight, n1.eps)
        h = self.self_attn.forward_fused(h, cos, sin, attn, ops)
        h, residual = ops.add_rmsnorm(h, residual, n2.weight, n2.eps)
        return self.mlp.forward_fused(h, ops), residual


class LlamaBody(nn.Module):
    def __init__(self, args: LlamaArgs, comm: Reducer | None = None) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(args.vocab_size, args.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(args, i, comm) for i in range(args.num_layers))
        self.norm = RMSNorm(args.hidden_size, args.rms_norm_eps)


class LlamaForCausalLM(nn.Module):
    """forward(input_ids [T], positions [T], attn, logit_rows [R]) -> logits [R, vocab] (fp32).

    Tensor parallel (`comm` given): `args` are one rank's shapes (`tp.shard.local_args`: its
    heads, MLP slice and `args.vocab_size` rows of the vocabulary) and `vocab_size` the whole
    vocabulary; the outputs of o/down projections and the embedding are all-reduced and the
    logits all-gathered, so every rank returns the same full logits."""

    inv_freq: torch.Tensor

    def __init__(self, args: LlamaArgs, comm: Reducer | None = None, vocab_size: int = 0) -> None:
        super().__init__()
        self.args = args
        self.comm = comm
        self.vocab_size = vocab_size or args.vocab_size  # the whole vocabulary
        self.model = LlamaBody(args, comm)
        self.lm_head = nn.Linear(args.hidden_size, args.vocab_size, bias=False)
        if args.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.register_buffer("inv_freq", rope_inv_freq(args), persistent=False)
        self.fused = False
        self.ops: Any = None  # fused_ops.TritonOps or TorchOps once fused
        self.ops_note = ""

    def _apply(self, fn: Any, recurse: bool = True) -> LlamaForCausalLM:
        # `.to(dtype)` / `.half()` cast buffers too; RoPE frequencies must stay fp32 (as HF
        # keeps them): a bf16 inv_freq puts positions in the wrong place past a few hundred.
        super()._apply(fn, recurse)
        if self.inv_freq.dtype != torch.float32:
            self.inv_freq = rope_inv_freq(self.args).to(self.inv_freq.device)
        return self

    def fuse(self, kernels: str = "auto") -> LlamaForCausalLM:
        """Switch every layer to the fused form (module docstring); `kernels` picks the
        element-wise ops: auto (Triton on CUDA if its self-check passes, else torch), triton,
        torch. Callable again to switch kernels. Afterwards the state dict holds `qkv_proj` /
        `gate_up_proj` names: load HF checkpoints before."""
        from model_service.models.fused_ops import pick_ops

        for layer in self.model.layers:
            assert isinstance(layer, DecoderLayer)
            layer.self_attn.fuse()
            layer.mlp.fuse()
        self.ops, self.ops_note = pick_ops(self.lm_head.weight.device, kernels)
        self.fused = True
        return self

    def rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions.to(torch.float32)[:, None] * self.inv_freq[None, :]
        dtype = self.model.embed_tokens.weight.dtype
        return freqs.cos().to(dtype), freqs.sin().to(dtype)

    def hidden(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        attn: LayerAttention,
        embeds: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """`embeds`: the input embeddings when the caller computed them (LLaVA's images)."""
        x = self.embed(input_ids) if embeds is None else embeds
        cos, sin = self.rope(positions)
        if self.fused:
            ops, residual = self.ops, None
            for layer in self.model.layers:
                assert isinstance(layer, DecoderLayer)
                x, residual = layer.forward_fused(x, residual, cos, sin, attn, ops)
            norm = self.model.norm
            if residual is None:  # no layers
                return ops.rmsnorm(x, norm.weight, norm.eps)
            return ops.add_rmsnorm(x, residual, norm.weight, norm.eps)[0]
        for layer in self.model.layers:
            x = layer(x, cos, sin, attn)
        return self.model.norm(x)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.comm is None:
            return self.model.embed_tokens(input_ids)
        # Vocab-parallel: this rank looks up only its rows; exactly one rank holds each id, so
        # the all-reduce sums one value with zeros (bit-exact).
        n = self.args.vocab_size
        local = input_ids - self.comm.rank * n
        outside = (local < 0) | (local >= n)
        x = self.model.embed_tokens(local.masked_fill(outside, 0))
        return self.comm.all_reduce(x.masked_fill(outside[:, None], 0))

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        attn: LayerAttention,
        logit_rows: torch.Tensor,
        embeds: torch.Tensor | None = None,
    ) -> torch.Tensor:
        h = self.hidden(input_ids, positions, attn, embeds)
        logits = self.lm_head(h.index_select(0, logit_rows))
        if self.comm is not None:  # each rank's vocabulary rows, side by side; drop padding
            logits = self.comm.all_gather_last(logits)[:, : self.vocab_size]
        return logits.float()
