"""The GPU greedy probe's comparison: agreement, first divergence, and whether a divergence
happened at a near-tie of A (bf16 rounding) or at a wide margin (a bug)."""

from __future__ import annotations

from radixmesh_bench.gpu.greedy_probe import NEAR_TIE, compare


def test_divergence_at_a_near_tie_is_not_counted_as_wide() -> None:
    a = {"ids": [[1, 2, 3], [4, 5, 6]], "margins": [[2.0, 0.01, 1.0], [3.0, 3.0, 3.0]]}
    b = {"ids": [[1, 9, 3], [4, 5, 7]], "margins": [[2.0, 0.01, 1.0], [3.0, 3.0, 3.0]]}
    got = compare(a, b)
    assert got["agreement"] == 4 / 6
    assert got["first_divergence"] == [1, 2]
    assert got["margin_at_divergence"] == [0.01, 3.0]
    assert got["wide_divergences"] == 1 and 3.0 > NEAR_TIE > 0.01


def test_identical_runs_and_old_files() -> None:
    a = {"ids": [[1, 2]], "margins": [[1.0, 1.0]]}
    assert compare(a, a) == {
        "agreement": 1.0,
        "first_divergence": [2],
        "tokens": 2,
        "margin_at_divergence": [],
        "wide_divergences": 0,
    }
    assert compare([[1, 2]], [[1, 3]])["first_divergence"] == [1]  # a bare list: no margins
