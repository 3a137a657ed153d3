"""flashinfer attention vs the reference attention on random inputs (CUDA only; skipped
elsewhere, so CPU CI skips the whole file).

Each case fills a NaN-poisoned pool's used slots with random KV, scatters rows over random
slots, and checks that both backends write the step's k/v to the same slots and produce the
same attention output, with no NaN (a read of an unwritten slot would bring one in).
"""

from __future__ import annotations

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("CUDA is not available", allow_module_level=True)
pytest.importorskip("flashinfer")

from model_service.attention.flashinfer import FlashInferAttention  # noqa: E402
from model_service.attention.reference import ReferenceAttention, RowPlan  # noqa: E402
from model_service.kv_pool import KVPool  # noqa: E402

DEV = torch.device("cuda")
HD = 128


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def _case(
    rows_spec: list[tuple[int, int]], nh: int, nkv: int, seed: int, tensor_cores: bool | None = None
) -> None:
    """rows_spec: (cached prefix length, q_len) per row."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    total = sum(p + q for p, q in rows_spec)
    cap = total + 64
    perm = torch.randperm(cap, generator=g)
    pools = [KVPool(2, cap, nkv, HD, torch.bfloat16, DEV, nan_fill=True) for _ in range(2)]
    rows, out_slots, off = [], [], 0
    for prefix, q_len in rows_spec:
        slots = perm[off : off + prefix + q_len].to(DEV)
        off += prefix + q_len
        if prefix:
            kp = torch.randn(2, prefix, nkv, HD, generator=g).to(DEV, torch.bfloat16)
            vp = torch.randn(2, prefix, nkv, HD, generator=g).to(DEV, torch.bfloat16)
            for p in pools:
                p.k[:, slots[:prefix]] = kp
                p.v[:, slots[:prefix]] = vp
        rows.append(RowPlan(q_len, slots))
        out_slots.append(slots[prefix:])
    out = torch.cat(out_slots)
    n = out.numel()
    q = torch.randn(n, nh, HD, generator=g).to(DEV, torch.bfloat16)
    k = torch.randn(n, nkv, HD, generator=g).to(DEV, torch.bfloat16)
    v = torch.randn(n, nkv, HD, generator=g).to(DEV, torch.bfloat16)
    ref = ReferenceAttention(pools[0], nh, HD)
    fi = FlashInferAttention(pools[1], nh, nkv, HD, decode_tensor_cores=tensor_cores)
    for layer in (0, 1):
        ref.plan(rows, out)
        fi.plan(rows, out)
        o_ref = ref.forward(layer, q, k, v)
        o_fi = fi.forward(layer, q, k, v)
        torch.cuda.synchronize()
        assert not o_fi.isnan().any(), "flashinfer output has NaN"
        assert not o_ref.isnan().any(), "reference output has NaN"
        err = _rel(o_fi.float(), o_ref.float())
        assert err < 1e-2, f"layer {layer}: relative error {err:.2e}"
        assert torch.equal(pools[0].k[layer, out], pools[1].k[layer, out])
        assert torch.equal(pools[0].v[layer, out], pools[1].v[layer, out])
    # nothing outside the rows' slots was written
    used = perm[:off].to(DEV)
    mask = torch.ones(cap, dtype=torch.bool, device=DEV)
    mask[used] = False
    assert pools[1].k[:, mask].isnan().all()


@pytest.mark.parametrize("nh,nkv", [(32, 8), (8, 8)])
def test_decode_only(nh: int, nkv: int) -> None:
    _case([(0, 1), (16, 1), (299, 1), (63, 1), (128, 1)], nh, nkv, seed=1)


@pytest.mark.parametrize("nh,nkv", [(32, 8), (8, 8)])
def test_prefill_with_cached_prefix_and_mixed_decode(nh: int, nkv: int) -> None:
    _case([(0, 7), (50, 1), (20, 33), (3, 1), (0, 130)], nh, nkv, seed=2)


def test_single_long_prefill() -> None:
    _case([(0, 1000)], 32, 8, seed=3)


def test_single_decode_row_long_context() -> None:
    _case([(4000, 1)], 32, 8, seed=4)


def test_cuda_core_decode_matches_tensor_core_decode() -> None:
    _case([(10, 1), (700, 1), (5, 1)], 32, 8, seed=5, tensor_cores=False)


@pytest.mark.parametrize("kernels", ["separate", "torch", "triton"])
def test_decode_graphs_match_eager(kernels: str) -> None:
    """A tiny Llama (separate layers, or fused with torch / Triton element-wise ops): graph
    replay of a padded decode step equals the eager flashinfer step, and padding rows touch
    only the scratch slot."""
    from model_service.cuda_graphs import DecodeCudaGraphs
    from model_service.models.llama import LlamaArgs, LlamaForCausalLM, rope_inv_freq

    args = LlamaArgs(
        vocab_size=1000,
        hidden_size=512,
        intermediate_size=1024,
        num_layers=2,
        num_heads=4,
        num_kv_heads=1,
        head_dim=HD,
        rms_norm_eps=1e-5,
        rope_theta=500000.0,
        rope_scaling=None,
        max_position=4096,
        tie_word_embeddings=False,
        attention_bias=False,
        model_type="llama",
    )
    torch.manual_seed(0)
    with torch.device(DEV):
        model = LlamaForCausalLM(args).to(torch.bfloat16).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.fill_(1.0) if name.endswith("norm.weight") else p.normal_(0, 0.02)
    model.inv_freq = rope_inv_freq(args).to(DEV)
    if kernels != "separate":
        model.fuse(kernels)
        assert model.ops.name == kernels, model.ops_note
    cap = 600
    pool = KVPool(2, cap + 1, 1, HD, torch.bfloat16, DEV, nan_fill=True)
    attn = FlashInferAttention(pool, 4, 1, HD)
    graphs = DecodeCudaGraphs(model, attn, [1, 4], scratch_slot=cap, max_kv_tokens=cap)
    graphs.capture()
    # Reuse freed memory: a tensor the graph reads but nobody kept alive would now hold junk.
    junk = [
        torch.full((n,), 10**6, dtype=torch.int64, device=DEV)
        for n in (1, 2, 3, 4, 8, 16, 64, 256)
        for _ in range(32)
    ]
    lens = [5, 100, 250]
    perm = torch.randperm(cap)
    seqs, off = [], 0
    for n in lens:
        seqs.append(perm[off : off + n + 1].to(DEV))
        off += n + 1
    ids = torch.randint(0, 1000, (sum(lens),), device=DEV)
    with torch.inference_mode():
        # prefill all three eagerly
        rows = [RowPlan(n, s[:n]) for n, s in zip(lens, seqs, strict=True)]
        pos = torch.cat([torch.arange(n, device=DEV) for n in lens])
        attn.plan(rows, torch.cat([s[:n] for n, s in zip(lens, seqs, strict=True)]))
        model(ids, pos, attn, torch.arange(ids.numel(), device=DEV))
        snapshot_k, snapshot_v = pool.k.clone(), pool.v.clone()
        dec_ids = [7, 8, 9]
        dec_pos = list(lens)
        dec_slots = [int(s[n]) for n, s in zip(lens, seqs, strict=True)]
        dec_rows = [RowPlan(1, s[: n + 1]) for n, s in zip(lens, seqs, strict=True)]
        attn.plan(dec_rows, torch.tensor(dec_slots, device=DEV))
        eager = model(
            torch.tensor(dec_ids, device=DEV),
            torch.tensor(dec_pos, device=DEV),
            attn,
            torch.arange(3, device=DEV),
        ).clone()
        eager_k = pool.k.clone()
        pool.k.copy_(snapshot_k)
        pool.v.copy_(snapshot_v)
        replay = graphs.run(
            torch.tensor(dec_ids, device=DEV),
            torch.tensor(dec_pos, device=DEV),
            torch.tensor(dec_slots, device=DEV),
            dec_rows,
        )
        assert replay is not None and replay.shape == eager.shape
        replay = replay.clone()
        torch.cuda.synchronize()
    assert graphs.replays == 1
    del junk
    assert not replay.isnan().any()
    assert _rel(replay, eager) < 1e-2
    assert torch.equal(replay.argmax(-1), eager.argmax(-1))
    step = torch.tensor(dec_slots, device=DEV)
    assert _rel(pool.k[:, step].float(), eager_k[:, step].float()) < 1e-2
    other = torch.ones(cap + 1, dtype=torch.bool, device=DEV)
    other[cap] = False  # the scratch slot takes the padding rows' KV
    other[step] = False
    a, b = pool.k[:, other], eager_k[:, other]
    same = (a == b) | (a.isnan() & b.isnan())
    assert same.all(), "graph replay wrote outside the step's slots and the scratch slot"
    zeros = torch.zeros(5, dtype=torch.int64, device=DEV)
    no_bucket = graphs.run(torch.arange(5, device=DEV), zeros, zeros, dec_rows[:1] * 5)
    assert no_bucket is None
