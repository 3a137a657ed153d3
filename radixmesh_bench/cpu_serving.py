"""`radixmesh bench cpu`: the whole stack vs HF transformers `generate` on the same model, at
batch 1 and for 16 concurrent requests with mixed prompt and output lengths (HF runs those as
one left-padded static batch, the way an HF user would). JSON on stdout."""

from __future__ import annotations

import argparse
import platform
import time
from datetime import datetime, timezone

from radixmesh_bench.stack import local_stack, progress, run_concurrent, summarize

FILLER = (
    "The history of science is the study of the development of science and scientific "
    "knowledge, including both the natural and social sciences. "
)


def make_prompts(tok, lengths: list[int]) -> list[list[int]]:  # type: ignore[no-untyped-def]
    base = tok.encode(FILLER * 64, add_special_tokens=False)
    return [base[i : i + n] for i, n in enumerate(lengths)]


def hf_batch1(model, prompts: list[list[int]], outs: list[int]) -> dict[str, float]:  # type: ignore[no-untyped-def]
    import torch

    toks, wall, ttfts = 0, 0.0, []
    with torch.inference_mode():
        for ids, n in zip(prompts, outs, strict=True):
            x = torch.tensor([ids])
            t0 = time.perf_counter()
            model.generate(x, max_new_tokens=1, min_new_tokens=1, do_sample=False)
            ttfts.append((time.perf_counter() - t0) * 1e3)
            t0 = time.perf_counter()
            model.generate(x, max_new_tokens=n, min_new_tokens=n, do_sample=False)
            wall += time.perf_counter() - t0
            toks += n
    ttfts.sort()
    return {
        "requests": len(prompts),
        "output_tokens": toks,
        "wall_s": round(wall, 3),
        "output_tok_s": round(toks / wall, 2),
        "ttft_ms_p50": round(ttfts[len(ttfts) // 2], 1),
    }


def hf_static_batch(model, tok, prompts: list[list[int]], outs: list[int]) -> dict[str, float]:  # type: ignore[no-untyped-def]
    import torch

    width = max(len(p) for p in prompts)
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    n = max(outs)
    with torch.inference_mode():
        t0 = time.perf_counter()
        model.generate(
            ids, attention_mask=mask, max_new_tokens=1, do_sample=False, pad_token_id=pad
        )
        ttft = (time.perf_counter() - t0) * 1e3
        t0 = time.perf_counter()
        model.generate(
            ids,
            attention_mask=mask,
            max_new_tokens=n,
            min_new_tokens=n,
            do_sample=False,
            pad_token_id=pad,
        )
        wall = time.perf_counter() - t0
    useful = sum(outs)  # a static batch runs to the longest request; count what was asked
    return {
        "requests": len(prompts),
        "output_tokens": useful,
        "wall_s": round(wall, 3),
        "output_tok_s": round(useful / wall, 2),
        "ttft_ms_p50": round(ttft, 1),
        "padded_steps": n,
    }


def run(ns: argparse.Namespace) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from services.model_store import resolve_model

    folder = resolve_model(ns.model)
    tok = AutoTokenizer.from_pretrained(folder)
    b1_in, b1_out = [ns.b1_prompt] * ns.b1_requests, [ns.b1_output] * ns.b1_requests
    mix_in = [16 + (i * 37) % 240 for i in range(16)]
    mix_out = [16 + (i * 23) % 112 for i in range(16)]
    b1_prompts, mix_prompts = make_prompts(tok, b1_in), make_prompts(tok, mix_in)

    def reqs(prompts: list[list[int]], outs: list[int]) -> list[dict]:
        return [
            {"input_ids": p, "max_new_tokens": n, "temperature": 0, "ignore_eos": True}
            for p, n in zip(prompts, outs, strict=True)
        ]

    report: dict = {
        "bench": "cpu_serving",
        "model": str(folder.name),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": {
            "cpus": __import__("os").cpu_count(),
            "python": platform.python_version(),
            "torch": torch.__version__,
        },
    }
    with local_stack(ns.model, scheduler_args=["--radix", "off"], endpoint=ns.endpoint) as ep:
        run_concurrent(ep, reqs(b1_prompts[:1], [4]), 1)  # warm-up
        progress("ours: batch 1")
        t, wall = [], 0.0
        for r in reqs(b1_prompts, b1_out):
            timed, w = run_concurrent(ep, [r], 1)
            t += timed
            wall += w
        report["ours_batch1"] = summarize(t, wall)
        progress("ours: 16 mixed concurrent")
        timed, wall = run_concurrent(ep, reqs(mix_prompts, mix_out), 16)
        report["ours_mixed16"] = summarize(timed, wall)
    progress("HF transformers generate (same process, stack stopped)")
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    model.generate(torch.tensor([b1_prompts[0]]), max_new_tokens=2, do_sample=False)  # warm-up
    report["hf_batch1"] = hf_batch1(model, b1_prompts, b1_out)
    report["hf_mixed16_static"] = hf_static_batch(model, tok, mix_prompts, mix_out)
    report["ratio_batch1"] = round(
        report["ours_batch1"]["output_tok_s"] / report["hf_batch1"]["output_tok_s"], 3
    )
    report["ratio_mixed16"] = round(
        report["ours_mixed16"]["output_tok_s"] / report["hf_mixed16_static"]["output_tok_s"], 3
    )
    report["workload"] = {
        "batch1": {"prompt": ns.b1_prompt, "output": ns.b1_output, "requests": ns.b1_requests},
        "mixed16": {"prompt_lens": mix_in, "output_lens": mix_out},
    }
    return report


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("cpu", help="whole stack vs HF generate on CPU (batch 1, 16 mixed)")
    p.add_argument("--model", default="default")
    p.add_argument("--endpoint", default="", help="use a running stack instead of starting one")
    p.add_argument("--b1-prompt", type=int, default=128)
    p.add_argument("--b1-output", type=int, default=64)
    p.add_argument("--b1-requests", type=int, default=3)
    p.add_argument("--out", default="", help="also write the JSON here")

    def main(ns: argparse.Namespace) -> int:
        from radixmesh_bench.report import emit_report

        return emit_report(run(ns), ns.out)

    p.set_defaults(func=main)
