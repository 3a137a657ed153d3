"""The fused layer form (q|k|v and gate|up concatenated, fused RMSNorm, in-place RoPE) computes
the same function as the separate form it is built from. Runs on CPU (fp32, reference
attention) and, where there is one, on CUDA (bf16); CPU CI runs this file."""

from __future__ import annotations

import copy
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from model_service.attention.reference import ReferenceAttention, RowPlan
from model_service.kv_pool import KVPool
from model_service.models.fused_ops import TorchOps
from model_service.models.llama import LlamaArgs, LlamaForCausalLM, apply_rope, rope_inv_freq
from model_service.weights import load_model, random_model
from tests.tiny_runner import tiny_llama_args

ROPE31 = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def _args(bias: bool = False) -> LlamaArgs:
    """The tiny Llama (tests/tiny_runner.py) with Llama-3.1's RoPE scaling."""
    return replace(
        tiny_llama_args(300),
        rope_theta=500000.0,
        rope_scaling=ROPE31,
        attention_bias=bias,
    )


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def _run(model: LlamaForCausalLM, device: str, dtype: torch.dtype) -> torch.Tensor:
    """Two prompts prefilled in one step, then three decode steps of both; all logits."""
    a = model.args
    pool = KVPool(a.num_layers, 64, a.num_kv_heads, a.head_dim, dtype, device)
    attn = ReferenceAttention(pool, a.num_heads, a.head_dim)
    g = torch.Generator().manual_seed(7)
    lens = [9, 5]
    slots = [list(range(0, 20)), list(range(30, 50))]
    ids = torch.randint(0, a.vocab_size, (sum(lens),), generator=g)
    out = []
    with torch.inference_mode():
        rows = [
            RowPlan(n, torch.tensor(s[:n], device=device)) for n, s in zip(lens, slots, strict=True)
        ]
        attn.plan(rows, torch.tensor(slots[0][:9] + slots[1][:5], device=device))
        pos = torch.tensor(list(range(9)) + list(range(5)), device=device)
        out.append(model(ids.to(device), pos, attn, torch.arange(14, device=device)))
        for j in range(3):
            n = [lens[0] + j, lens[1] + j]
            rows = [
                RowPlan(1, torch.tensor(s[: k + 1], device=device))
                for k, s in zip(n, slots, strict=True)
            ]
            attn.plan(rows, torch.tensor([slots[0][n[0]], slots[1][n[1]]], device=device))
            tok = torch.randint(0, a.vocab_size, (2,), generator=g).to(device)
            out.append(
                model(tok, torch.tensor(n, device=device), attn, torch.arange(2, device=device))
            )
    return torch.cat(out).float()


KERNELS = [("cpu", "torch")] + (
    [("cuda", "torch"), ("cuda", "triton")] if torch.cuda.is_available() else []
)


@pytest.mark.parametrize(("device", "kernels"), KERNELS)
@pytest.mark.parametrize("bias", [False, True])
def test_fused_matches_separate(device: str, kernels: str, bias: bool) -> None:
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    sep = random_model(_args(bias), dtype, torch.device(device), seed=3, fuse=False)
    if bias:
        with torch.no_grad():
            for name, p in sep.named_parameters():
                if name.endswith("bias"):
                    p.normal_(0.0, 0.5)
    fused = copy.deepcopy(sep).fuse(kernels)
    assert fused.fused and not sep.fused
    assert fused.ops.name == kernels, fused.ops_note
    names = {k for k, _ in fused.named_parameters()}
    assert any("qkv_proj" in k for k in names) and not any("q_proj" in k for k in names)
    assert any("gate_up_proj" in k for k in names) and not any(
        "up_proj." in k for k in names if "gate_up" not in k
    )
    ref, got = _run(sep, device, dtype), _run(fused, device, dtype)
    assert not got.isnan().any()
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    assert _rel(got, ref) < tol
    assert torch.equal(got.argmax(-1), ref.argmax(-1)) or dtype != torch.float32


def test_rope_inplace_matches_apply_rope() -> None:
    g = torch.Generator().manual_seed(0)
    t, heads, dim = 5, 6, 32
    wide = torch.randn(t, heads * dim + 17, generator=g)  # q|k columns of a wider row
    x = wide[:, : heads * dim].view(t, heads, dim)
    ang = torch.randn(t, dim // 2, generator=g)
    want = apply_rope(x.clone(), ang.cos(), ang.sin())
    tail = wide[:, heads * dim :].clone()
    TorchOps.rope(wide[:, : heads * dim].view(t, heads, 2, dim // 2), ang.cos(), ang.sin())
    assert torch.allclose(wide[:, : heads * dim].view(t, heads, dim), want, atol=1e-6)
    assert torch.equal(wide[:, heads * dim :], tail)  # the other columns are untouched


def test_inv_freq_stays_fp32_through_dtype_casts() -> None:
    a = _args()
    m = LlamaForCausalLM(a).to(torch.bfloat16)
    assert m.inv_freq.dtype == torch.float32
    assert torch.equal(m.inv_freq, rope_inv_freq(a))
    assert m.half().inv_freq.dtype == torch.float32
    r = random_model(a, torch.bfloat16, torch.device("cpu"))
    assert r.inv_freq.dtype == torch.float32 and r.lm_head.weight.dtype == torch.bfloat16


def test_cpu_never_fused_by_default_and_same_seed_same_weights() -> None:
    a = _args()
    sep = random_model(a, torch.float32, torch.device("cpu"), seed=5)
    assert not sep.fused
    fused = random_model(a, torch.float32, torch.device("cpu"), seed=5, fuse=True)
    a0: Any = sep.model.layers[0]
    f0: Any = fused.model.layers[0]
    w = torch.cat(
        [a0.self_attn.q_proj.weight, a0.self_attn.k_proj.weight, a0.self_attn.v_proj.weight]
    )
    assert torch.equal(f0.self_attn.qkv_proj.weight, w)


def test_load_model_fuses_hf_named_checkpoint(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    from safetensors.torch import save_file

    from model_service.random_configs import config_dict, hf_config

    cfg = hf_config(config_dict("tiny-llama", num_hidden_layers=1, vocab_size=300))
    a = LlamaArgs.from_hf_config(cfg)
    sep = random_model(a, torch.float32, torch.device("cpu"), seed=2)
    save_file(
        {k: v.contiguous() for k, v in sep.state_dict().items()},
        str(tmp_path / "model.safetensors"),
    )
    cfg.save_pretrained(tmp_path)
    fused = load_model(tmp_path, torch.float32, torch.device("cpu"), fuse=True)
    plain = load_model(tmp_path, torch.float32, torch.device("cpu"))
    assert fused.fused and not plain.fused
    assert fused.inv_freq.dtype == torch.float32
    ref, got = _run(plain, "cpu", torch.float32), _run(fused, "cpu", torch.float32)
    assert _rel(got, ref) < 1e-5


def test_triton_kernels_match_torch_ops_in_interpreter() -> None:
    """The Triton kernels (fused_ops.TritonOps) against TorchOps, run by Triton's CPU
    interpreter in a subprocess (TRITON_INTERPRET must be set before triton is imported)."""
    pytest.importorskip("triton")
    import os
    import subprocess
    import sys

    code = (
        "import torch\n"
        "from model_service.models.fused_ops import TritonOps, self_check\n"
        "self_check(TritonOps(), torch.device('cpu'), torch.float32, tol=1e-5)\n"
        "self_check(TritonOps(), torch.device('cpu'), torch.bfloat16)\n"
        "print('ok')\n"
    )
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(root)}
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=240, cwd=root
    )
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr[-3000:]


def test_triton_kernels_compile_for_hopper() -> None:
    """Every Triton kernel compiles for sm_90 (the H100) on this machine, GPU or not: the
    interpreter above runs the kernels' Python but not Triton's type checks (a name bound to
    differently shaped tiles in the two branches of an `if` passed it and failed on the GPU)."""
    triton = pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from model_service.models.fused_ops import _kernels

    _, norm, rope, silu, rope_store = _kernels()
    bf, i32 = "*bf16", "i32"
    cases = [
        (
            norm,
            {"x_ptr": bf, "r_ptr": bf, "w_ptr": bf, "out_ptr": bf, "n_cols": i32},
            {"x_stride": i32, "r_stride": i32, "out_stride": i32, "eps": "fp32"},
            {"HAS_RES": True, "BLOCK": 4096},
        ),
        (
            rope,
            {"x_ptr": bf, "cos_ptr": bf, "sin_ptr": bf, "row_stride": i32, "n_heads": i32},
            {"cs_stride": i32},
            {"HALF": 64, "BLOCK_H": 64},
        ),
        (
            silu,
            {"gu_ptr": bf, "out_ptr": bf, "n": i32, "gu_stride": i32, "out_stride": i32},
            {},
            {"BLOCK": 1024},
        ),
        (
            rope_store,
            {"qkv_ptr": bf, "q_ptr": bf, "k_ptr": bf, "v_ptr": bf, "slots_ptr": "*i64"},
            {"cos_ptr": bf, "sin_ptr": bf, "row_stride": i32, "cs_stride": i32},
            {"NQ": 32, "NKV": 8, "HALF": 64, "BLOCK_Q": 32, "BLOCK_KV": 8},
        ),
    ]
    for fn, sig1, sig2, consts in cases:
        sig = {**sig1, **sig2, **dict.fromkeys(consts, "constexpr")}
        triton.compile(ASTSource(fn, sig, constexprs=consts), target=GPUTarget("cuda", 90, 32))
