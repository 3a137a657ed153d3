"""py-spy raw profiles as top-frame tables (radixmesh_bench.pyspy_summary)."""

from __future__ import annotations

from radixmesh_bench.pyspy_summary import summarize_raw

RAW = """\
<module> (a.py:1);run (a.py:10);step (b.py:5) 6
<module> (a.py:1);run (a.py:12);step (b.py:7) 2
<module> (a.py:1);run (a.py:11);wait (c.py:3) 2
not a profile line
"""


def test_self_and_total_merge_a_functions_lines() -> None:
    s = summarize_raw(RAW, top=5)
    assert s["samples"] == 10
    assert s["self"][0] == {"function": "step (b.py)", "pct": 80.0, "total_pct": 80.0}
    assert s["self"][1] == {"function": "wait (c.py)", "pct": 20.0, "total_pct": 20.0}
    total = {e["function"]: e["pct"] for e in s["total"]}
    # `run` is on every stack once per sample, though its lines differ.
    assert total["run (a.py)"] == 100.0
    assert total["<module> (a.py)"] == 100.0
