"""Image questions with the radix cache on and off (issue 32; the paper's LLaVA-bench shape).

A workload of `images` distinct images with `questions` questions each (the paper runs
several questions per image): every request is "USER: <image>\\n{question}\\nASSISTANT:",
sent `concurrency` at a time in an interleaved order (image 0 q0, image 1 q0, ..., image 0 q1,
...), so a request's image was usually seen a few requests before. The same workload runs on
a stack with `--radix tree` and one with `--radix off` (one after the other, same model and
device): throughput, output tokens per second, and the hit rate (cached prompt tokens over
prompt tokens, from each request's cached_tokens).

    python -m radixmesh_bench.multimodal --random-weights llava-1.5-7b --device cuda
    python -m radixmesh_bench.multimodal --random-weights tiny-llava --device cpu \\
        --images 4 --questions 4 --max-new-tokens 8

LLaVA-NeXT shapes (`llava-next-7b`, `tiny-llava-next`) take the same workload; their images
become tiles by size (`--image-size WxH`, 512x512 by default: LLaVA-NeXT-7B's 2 x 2 grid plus
the base tile, 2,928 positions an image).

Prints one JSON object (tree, off, speedup).
"""

from __future__ import annotations

import argparse
import io
import json
from typing import Any

import numpy as np

from radixmesh_bench.stack import local_stack, model_source, progress, run_concurrent, summarize

QUESTIONS = (
    "What is in this image?",
    "Describe the colours you see.",
    "How many objects are there?",
    "What might happen next in this scene?",
    "Is this picture taken indoors or outdoors?",
    "Write a short caption for it.",
    "What is the most striking detail?",
    "Which season could this be?",
)


def image_png(seed: int, size: tuple[int, int] = (512, 512)) -> bytes:
    """A random picture of `size` (width, height)."""
    from PIL import Image

    w, h = size
    arr = np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="PNG")
    return buf.getvalue()


def workload(
    images: int, questions: int, max_new_tokens: int, size: tuple[int, int] = (512, 512)
) -> list[dict[str, Any]]:
    pngs = [image_png(i, size) for i in range(images)]
    out = []
    for q in range(questions):
        for i in range(images):
            out.append(
                {
                    "prompt": f"USER: <image>\n{QUESTIONS[q % len(QUESTIONS)]} (#{q})\nASSISTANT:",
                    "images": [pngs[i]],
                    "max_new_tokens": max_new_tokens,
                    "ignore_eos": True,
                    "temperature": 0.0,
                }
            )
    return out


def run_one(radix: str, ns: argparse.Namespace, reqs: list[dict[str, Any]]) -> dict[str, Any]:
    model, margs = model_source("default", ns.random_weights, ns.device, ns.kv_tokens)
    if ns.model:
        model, margs = ns.model, ["--device", ns.device]
    with local_stack(model, margs, ["--radix", radix]) as ep:
        # Warm-up with text only: nothing of the workload's prompts gets cached by it.
        run_concurrent(ep, [{"prompt": "Hello", "max_new_tokens": 2}], 1)
        progress(f"radix {radix}: {len(reqs)} requests")
        timed, wall = run_concurrent(ep, reqs, ns.concurrency)
    prompt = sum(t.result.prompt_tokens for t in timed)
    cached = sum(t.result.cached_tokens for t in timed)
    out: dict[str, Any] = dict(summarize(timed, wall))
    out["hit_rate"] = round(cached / prompt, 4) if prompt else 0.0
    out["requests_per_s"] = round(len(timed) / wall, 3)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--random-weights", default="llava-1.5-7b")
    p.add_argument("--model", default="", help="an HF LLaVA folder instead of random weights")
    p.add_argument("--device", default="cuda")
    p.add_argument("--kv-tokens", type=int, default=0)
    p.add_argument("--images", type=int, default=16)
    p.add_argument("--questions", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--image-size", default="512x512", help="WIDTHxHEIGHT of every image")
    ns = p.parse_args(argv)
    w, _, h = ns.image_size.partition("x")
    reqs = workload(ns.images, ns.questions, ns.max_new_tokens, (int(w), int(h)))
    tree = run_one("tree", ns, reqs)
    off = run_one("off", ns, reqs)
    speedup = tree["requests_per_s"] / off["requests_per_s"] if off["requests_per_s"] else 0.0
    print(json.dumps({"tree": tree, "off": off, "speedup": round(speedup, 3)}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
