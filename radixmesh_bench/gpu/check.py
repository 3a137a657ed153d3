"""Part `check`: teacher-forced logits of our model vs HF transformers on the same random weights.

The numerics rule (docs/architecture.md): ||ours - ref32|| / ||ref32|| must be at most 1.5x HF's own
bf16 error against the same fp32 reference, and never NaN. The model is Llama-3.1-8B's shapes cut to
a few layers (full vocabulary, GQA 32/8, llama3 RoPE scaling), weights normal(0, 0.02), norms 1.

Three sequences are run as a server would: a mixed first step (sequence 0's first prefill
chunk, sequence 1's whole prompt), a second mixed step (sequence 0's second chunk over its
cached prefix, sequence 2's prompt, and sequence 1's first decode), then decode steps of all
live rows until each has consumed its 32 teacher-forced tokens. The KV pool is NaN-filled and
sequences get scattered slots, so a read of an unwritten slot or a wrong index shows up.
Variants: reference attention, flashinfer eager, flashinfer with decode CUDA graphs (3 rows run
in the 4-row graph with a padding row, then 2 rows in the 2-row graph), all on the fused model
the service runs on CUDA (q|k|v and gate|up concatenated, fused RMSNorm, in-place RoPE), and
flashinfer eager on the separate-projection model (`flashinfer unfused`) for comparison. The
fused model uses the Triton element-wise kernels where they pass their self-check
(`model.ops`); `flashinfer torch-ops` runs it with the torch versions instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from radixmesh_bench.gpu.common import hf_model, log, ours_from_state, strict_fp32

PROMPTS = (100, 37, 64)
TEACHER = 32
CHUNK0 = 60  # sequence 0 prefills 60 tokens, then 40 over its cached prefix


@dataclass
class Seq:
    tokens: list[int]
    slots: list[int]
    done: int = 0  # tokens whose KV is in the pool


def schedule() -> list[list[tuple[int, int, int]]]:
    """Steps as lists of (sequence, start, end) token ranges."""
    lens = [p + TEACHER for p in PROMPTS]
    steps = [
        [(0, 0, CHUNK0), (1, 0, PROMPTS[1])],
        [(0, CHUNK0, PROMPTS[0]), (2, 0, PROMPTS[2]), (1, PROMPTS[1], PROMPTS[1] + 1)],
    ]
    done = [PROMPTS[0], PROMPTS[1] + 1, PROMPTS[2]]
    while any(d < n for d, n in zip(done, lens, strict=True)):
        step = []
        for i in range(3):
            if done[i] < lens[i]:
                step.append((i, done[i], done[i] + 1))
                done[i] += 1
        steps.append(step)
    return steps


def run_ours(
    model: Any,
    attn_kind: str,
    seqs_tokens: list[list[int]],
    capacity: int,
    slot_perm: list[int],
    device: str = "cuda",
) -> tuple[list[torch.Tensor], dict[str, Any]]:
    from model_service.attention.flashinfer import FlashInferAttention
    from model_service.attention.reference import ReferenceAttention, RowPlan
    from model_service.cuda_graphs import DecodeCudaGraphs
    from model_service.kv_pool import KVPool

    a = model.args
    dtype = model.model.embed_tokens.weight.dtype
    pool = KVPool(
        a.num_layers, capacity + 1, a.num_kv_heads, a.head_dim, dtype, device, nan_fill=True
    )
    graphs = None
    if attn_kind == "reference":
        attn: Any = ReferenceAttention(pool, a.num_heads, a.head_dim)
    else:
        attn = FlashInferAttention(pool, a.num_heads, a.num_kv_heads, a.head_dim)
        if attn_kind == "flashinfer+graphs":
            graphs = DecodeCudaGraphs(
                model, attn, [1, 2, 4], scratch_slot=capacity, max_kv_tokens=capacity
            )
            graphs.capture()
    seqs, off = [], 0
    for toks in seqs_tokens:
        seqs.append(Seq(toks, slot_perm[off : off + len(toks)]))
        off += len(toks)
    logits: list[list[torch.Tensor]] = [[] for _ in seqs]
    info = {"graph_replays": 0, "eager_steps": 0}
    with torch.inference_mode():
        for step in schedule():
            ids, pos, out_slots, rows = [], [], [], []
            for i, s, e in step:
                sq = seqs[i]
                assert sq.done == s
                ids += sq.tokens[s:e]
                pos += list(range(s, e))
                out_slots += sq.slots[s:e]
                rows.append(RowPlan(e - s, torch.tensor(sq.slots[:e], device=device)))
                sq.done = e
            out = None
            if graphs is not None and len(ids) == len(rows):
                out = graphs.run(
                    torch.tensor(ids, device=device),
                    torch.tensor(pos, device=device),
                    torch.tensor(out_slots, device=device),
                    rows,
                )
                if out is not None:
                    out = out.clone()
                    info["graph_replays"] += 1
            if out is None:
                info["eager_steps"] += 1
                attn.plan(rows, torch.tensor(out_slots, device=device))
                out = model(
                    torch.tensor(ids, device=device),
                    torch.tensor(pos, device=device),
                    attn,
                    torch.arange(len(ids), device=device),
                )
            c = 0
            for i, s, e in step:
                logits[i].append(out[c : c + e - s].float())
                c += e - s
    if device == "cuda":
        torch.cuda.synchronize()
    return [torch.cat(x) for x in logits], info


def _empty_cache(device: str) -> None:
    if device == "cuda":
        torch.cuda.empty_cache()


def rel(x: torch.Tensor, ref: torch.Tensor) -> float:
    return float((x.double() - ref.double()).norm() / ref.double().norm())


VARIANTS = (
    "reference",
    "flashinfer",
    "flashinfer+graphs",
    "flashinfer torch-ops",
    "flashinfer unfused",
)


def run_check(
    doc: dict[str, Any],
    spec: str = "llama-3.1-8b:num_hidden_layers=4",
    device: str = "cuda",
    variants: tuple[str, ...] = VARIANTS,
) -> bool:
    from model_service.models.llama import LlamaArgs
    from model_service.random_configs import random_config
    from model_service.weights import random_model

    strict_fp32()
    hf_cfg, _ = random_config(spec)
    args = LlamaArgs.from_hf_config(hf_cfg)
    doc["model"] = f"{spec} ({args.num_layers} layers), random normal(0, 0.02), norms 1"
    log("building fp32 weights")
    ours32 = random_model(args, torch.float32, torch.device(device), seed=0, fuse=False)
    state = {k: v for k, v in ours32.state_dict().items()}
    g = torch.Generator().manual_seed(1234)
    seqs = [
        torch.randint(0, args.vocab_size, (p + TEACHER,), generator=g).tolist() for p in PROMPTS
    ]

    log("HF fp32 reference")
    refs: list[torch.Tensor] = []
    hf32 = hf_model(hf_cfg, torch.float32, device)
    missing, unexpected = hf32.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise RuntimeError(f"HF state mismatch: {missing[:3]} {unexpected[:3]}")
    with torch.inference_mode():
        for s in seqs:
            refs.append(
                hf32(input_ids=torch.tensor([s], device=device), use_cache=False).logits[0].float()
            )
    del hf32, ours32
    _empty_cache(device)

    log("HF bf16")
    hf16 = hf_model(hf_cfg, torch.bfloat16, device)
    hf16.load_state_dict({k: v.to(torch.bfloat16) for k, v in state.items()}, strict=False)
    rope_dtype = str(hf16.model.rotary_emb.inv_freq.dtype)
    hf16_logits = []
    with torch.inference_mode():
        for s in seqs:
            hf16_logits.append(
                hf16(input_ids=torch.tensor([s], device=device), use_cache=False).logits[0].float()
            )
    del hf16
    _empty_cache(device)

    ours16 = ours_from_state(args, state, torch.bfloat16, device)
    doc["fused_kernels"] = ours16.ops.name
    doc["fused_kernels_note"] = ours16.ops_note
    log(f"fused model element-wise kernels: {ours16.ops.name} {ours16.ops_note}")
    unfused16 = (
        ours_from_state(args, state, torch.bfloat16, device, fuse=False)
        if "flashinfer unfused" in variants
        else None
    )
    del state
    _empty_cache(device)
    capacity = 1024
    perm = torch.randperm(capacity, generator=g).tolist()
    ref_all = torch.cat(refs)
    n_prefill = [p for p in PROMPTS]

    def split_err(parts: list[torch.Tensor]) -> tuple[float, float]:
        pre = torch.cat([x[:n] for x, n in zip(parts, n_prefill, strict=True)])
        dec = torch.cat([x[n:] for x, n in zip(parts, n_prefill, strict=True)])
        rpre = torch.cat([x[:n] for x, n in zip(refs, n_prefill, strict=True)])
        rdec = torch.cat([x[n:] for x, n in zip(refs, n_prefill, strict=True)])
        return rel(pre, rpre), rel(dec, rdec)

    hf_err = rel(torch.cat(hf16_logits), ref_all)
    hp, hd = split_err(hf16_logits)
    ref_top = ref_all.argmax(-1)
    doc["rows"].append(
        {
            "system": "hf-transformers",
            "variant": f"bf16 sdpa (RoPE buffer {rope_dtype})",
            "rel_err": hf_err,
            "rel_err_prefill": hp,
            "rel_err_decode": hd,
            "ratio_vs_hf_bf16": 1.0,
            "nan": bool(torch.cat(hf16_logits).isnan().any()),
            "argmax_agree": float((torch.cat(hf16_logits).argmax(-1) == ref_top).float().mean()),
            "positions": int(ref_all.shape[0]),
        }
    )
    ok = True
    outs: dict[str, torch.Tensor] = {}
    for kind in variants:
        log(f"ours: {kind}")
        try:
            if kind == "flashinfer unfused":
                parts, info = run_ours(unfused16, "flashinfer", seqs, capacity, perm, device)
            elif kind == "flashinfer torch-ops":
                ours16.fuse("torch")
                try:
                    parts, info = run_ours(ours16, "flashinfer", seqs, capacity, perm, device)
                finally:
                    ours16.fuse("auto")
            else:
                parts, info = run_ours(ours16, kind, seqs, capacity, perm, device)
        except Exception as exc:  # report and go on with the other variants
            import traceback

            traceback.print_exc()
            doc["errors"].append(f"{kind}: {exc!r}")
            ok = False
            continue
        allv = torch.cat(parts)
        outs[kind] = allv
        err = rel(allv, ref_all)
        p_err, d_err = split_err(parts)
        nan = bool(allv.isnan().any())
        ratio = err / hf_err if hf_err > 0 else float("inf")
        passed = (not nan) and ratio <= 1.5
        ok &= passed
        doc["rows"].append(
            {
                "system": "radixmesh",
                "variant": kind,
                "rel_err": err,
                "rel_err_prefill": p_err,
                "rel_err_decode": d_err,
                "ratio_vs_hf_bf16": ratio,
                "nan": nan,
                "argmax_agree": float((allv.argmax(-1) == ref_top).float().mean()),
                "positions": int(allv.shape[0]),
                "pass": passed,
                **info,
            }
        )
    if "reference" in outs and "flashinfer" in outs:
        doc["flashinfer_vs_reference_rel"] = rel(outs["flashinfer"], outs["reference"])
    if "flashinfer" in outs and "flashinfer unfused" in outs:
        doc["fused_vs_unfused_rel"] = rel(outs["flashinfer"], outs["flashinfer unfused"])
    if "flashinfer" in outs and "flashinfer+graphs" in outs:
        doc["graphs_vs_eager_rel"] = rel(outs["flashinfer+graphs"], outs["flashinfer"])
    doc["pass"] = ok
    return ok
