"""A CI-sized MaskBench run: about 200 schemas spread over every split, MaskBench's method
(Llama-3 tokens of ``json.dumps(data)``, mask before each token, commit it if allowed).

Nothing invalid may be accepted, and the share of passing schemas must stay at the level the full
benchmark shows (``benchmarks/maskbench.py`` runs all engines; this runs grammask alone).
Reads ``../shared/maskbench`` beside the repository and skips, saying so, where it is absent.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "maskbench"
N_SCHEMAS = 200
MIN_PASSING = 0.85

pytestmark = pytest.mark.skipif(not DATA.is_dir() or not list(DATA.glob("*.jsonl")),
                                reason=f"MaskBench data not found at {DATA}")


@pytest.fixture(scope="module")
def llama3_engine():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from common import Llama3
    from maskbench import GrammaskEngine

    tok = Llama3()
    return tok, GrammaskEngine(tok.path)


def test_maskbench_smoke(llama3_engine):
    from maskbench import load_schemas, run_schema

    tok, engine = llama3_engine
    total = sum(sum(1 for _ in open(f)) for f in DATA.glob("*.jsonl"))
    schemas = load_schemas(DATA, max(1, total // N_SCHEMAS), None)
    splits = {s for _, s, _, _ in schemas}
    assert len(splits) >= 15, splits
    passing, invalid_accepted, failures = 0, [], []
    for sid, _split, schema, tests in schemas:
        toks = [(bool(t["valid"]), tok.encode(json.dumps(t["data"])), t["data"]) for t in tests]
        res = run_schema(engine, schema, toks)
        bad = [v for v, a in res["tests"] if not v and a]
        if bad:
            invalid_accepted.append(sid)
        ok = res["ttfm_us"] is not None and all(v == a for v, a in res["tests"])
        passing += ok
        if not ok:
            failures.append((sid, res["compile_error"]))
    assert not invalid_accepted, f"invalid instances accepted for {invalid_accepted}"
    rate = passing / len(schemas)
    assert rate >= MIN_PASSING, f"passing {passing}/{len(schemas)}; failures: {failures[:20]}"


def test_sourcery_yaml_schema_masks_every_test(llama3_engine):
    """It compiled, then raised GrammarTooComplexError while masking its valid instances (its
    ``url`` is a ``format: uri`` of ``maxLength: 65536``: issue 17)."""
    from maskbench import run_schema

    tok, engine = llama3_engine
    path = DATA / "JsonSchemaStore.jsonl"
    recs = []
    if path.is_file():
        with open(path) as f:
            recs = [json.loads(line) for line in f if "sourcery_yaml_schema" in line[:100]]
    if not recs:
        pytest.skip(f"JsonSchemaStore---sourcery_yaml_schema not in {path}")
    rec = recs[0]
    toks = [(bool(t["valid"]), tok.encode(json.dumps(t["data"])), t["data"]) for t in rec["tests"]]
    res = run_schema(engine, rec["schema"], toks)
    assert res["compile_error"] is None and res.get("mask_error") is None, res
    assert any(v for v, _ in res["tests"]) and all(v == a for v, a in res["tests"]), res["tests"]


def test_numba_compilations_while_timing_are_counted_and_reported():
    """A kernel compiled inside a timed schema (a stale Numba cache after an edit) is counted by the
    worker and named in the report, so that run is not read as the engine's speed."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from types import SimpleNamespace

    import numba
    from maskbench import _JitCounter, report, summarize

    jit = _JitCounter.install()

    @numba.njit
    def fresh_kernel(x):
        return x * 3 + 1

    assert fresh_kernel(2) == 7 and jit.take() == 1 and jit.take() == 0
    base = {"compile_error": None, "ttfm_us": 1000.0, "tbm_us": [10.0, 12.0], "tbm_warm_us": [9.0],
            "tests": [(True, True)], "peak_rss_mib": 100.0, "gc_pauses_ms": []}
    quiet = summarize("grammask", [dict(base, jit_compiles=0)] * 2, ["a", "a"], ["s1", "s2"])
    stale = summarize("grammask", [dict(base, jit_compiles=0), dict(base, jit_compiles=3)], ["a", "a"], ["s1", "s2"])
    args = SimpleNamespace(data="d", every=1, timeout=30.0, ids=None, no_gc_freeze=False)
    assert "Numba compilations" not in report([quiet], args, 2, 1.0)
    text = report([stale], args, 2, 1.0)
    assert "3 Numba compilations while schemas ran" in text and "s2" in text
    # the schemas the longest full collections ran in are named (to rerun them alone)
    assert "Longest collections" not in text
    paused = summarize("grammask", [dict(base, jit_compiles=0, gc_pauses_ms=[3.0]),
                                    dict(base, jit_compiles=0, gc_pauses_ms=[1.0, 64.5])], ["a", "a"], ["s1", "s2"])
    assert "Longest collections, by the schema they ran in: grammask: s2 (64.5 ms), s1 (3.0 ms)." in report([paused], args, 2, 1.0)
