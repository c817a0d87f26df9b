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


def test_maskbench_smoke():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from common import Llama3
    from maskbench import GrammaskEngine, load_schemas, run_schema

    tok = Llama3()
    engine = GrammaskEngine(tok.path)
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
