"""Several bench_serving clients' results as one (radixmesh_bench/gpu/merge_clients.py)."""

from __future__ import annotations

import pytest

from radixmesh_bench.gpu.merge_clients import merge


def _r(duration: float, out_tokens: int, done: int, itl: float) -> dict:
    return {
        "dataset_name": "sharegpt",
        "duration": duration,
        "completed": done,
        "total_input_tokens": 10 * done,
        "total_output_tokens": out_tokens,
        "output_throughput": out_tokens / duration,
        "median_itl_ms": itl,
        "p99_itl_ms": 2 * itl,
    }


def test_tokens_add_up_over_the_longest_duration() -> None:
    m = merge([_r(10.0, 5000, 50, 40.0), _r(20.0, 6000, 50, 60.0)])
    assert m["clients"] == 2
    assert (m["completed"], m["total_output_tokens"], m["total_input_tokens"]) == (100, 11000, 1000)
    assert m["duration"] == 20.0
    assert m["output_throughput"] == 550.0  # 11,000 tokens over the longest client's 20 s
    assert m["sum_of_client_output_throughputs"] == 800.0  # 500 + 300: an upper bound
    assert m["median_itl_ms_per_client"] == [40.0, 60.0]
    assert m["median_itl_ms_mean_of_clients"] == 50.0
    assert m["median_ttft_ms_per_client"] == [] and m["median_ttft_ms_mean_of_clients"] is None


def test_results_of_different_workloads_are_refused() -> None:
    other = dict(_r(1.0, 1, 1, 1.0), dataset_name="generated-shared-prefix")
    with pytest.raises(ValueError, match="different workloads"):
        merge([_r(1.0, 1, 1, 1.0), other])
    with pytest.raises(ValueError, match="no client"):
        merge([])
