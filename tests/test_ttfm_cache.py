"""benchmarks/ttfm_cache.py: a child times every schema of its sample once (a compile error is
None, not a time), and the report takes each schema's median over rounds, compares the engines
like for like (the schemas both compiled) and each engine's cold against its warm TTFM."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "maskbench"
sys.path.insert(0, str(ROOT / "benchmarks"))

import ttfm_cache  # noqa: E402


@pytest.mark.skipif(not DATA.is_dir() or not list(DATA.glob("*.jsonl")), reason=f"MaskBench data not found at {DATA}")
def test_a_cold_child_times_each_schema_of_its_sample_once():
    import maskbench as mb

    want = [sid for sid, *_ in mb.load_schemas(DATA, 1000, 4)]
    got = ttfm_cache.child("grammask", "cold", str(DATA), 1000, 1, max_schemas=4, freeze=False)
    assert list(got) == want
    assert all(v is None or v > 0 for v in got.values())
    assert any(v is not None for v in got.values())


def test_report_is_like_for_like_with_the_median_over_rounds():
    e = ["a", "b"]
    runs = {("a", "warm"): [{"s1": 1000.0, "s2": 2000.0, "s3": 3000.0}, {"s1": 3000.0, "s2": 2000.0, "s3": 1000.0},
                            {"s1": 2000.0, "s2": 2000.0, "s3": 2000.0}],
            ("b", "warm"): [{"s1": 1000.0, "s2": None, "s3": 1000.0}] * 3,
            ("a", "cold"): [{"s1": 4000.0, "s2": 4000.0, "s3": 4000.0}] * 3,
            ("b", "cold"): [{"s1": 2000.0, "s2": None, "s3": 2000.0}] * 3}
    table, lines = ttfm_cache.report(runs, e)
    rows = [r.split(" | ") for r in table.splitlines()[2:]]
    # a warm: every schema's median is 2 ms; b compiled two of the three
    assert rows[0][:3] == ["| a", "warm", "3"] and rows[0][4] == "2.00" and rows[0][7] == "2"
    assert rows[1][:3] == ["| b", "warm", "2"] and rows[1][4] == "1.00"
    assert "- warm: a / b TTFM p50 2.00x (like for like 2.00x)" in lines[0]
    assert "- cold: a / b TTFM p50 2.00x" in lines[1]
    assert lines[2].startswith("- a: cold / warm p50 2.00x") and "+2000 µs" in lines[2]
    assert lines[3].startswith("- b: cold / warm p50 2.00x")
