"""Two settings of grammask's engine measured in one process, on the same MaskBench schemas.

Between two processes this 2-core host drifts by up to 10-15% in MaskBench totals (the same code,
run after run), more than most changes to a tunable are worth. Here both settings run in one
process, each with its own ``GrammarCompiler`` (its own ExprSet, state caches and lexers), and
every schema is run on both, one after the other, the order alternating from schema to schema,
so a slow spell of the host falls on both. The same code run as both settings (an A/A run) gave
TBM totals within 1.4%, p99 within 3% and TTFM p50 within 1% of each other (session 37).

A setting is a list of module attributes set while its engine runs (``module:NAME=value``, the
value a Python expression), and optionally the compiler's ``max_shared_exprs``. Only settings
read at call time can be compared this way (module constants that a function reads when it
runs, not defaults bound at definition). Masks are not compared: run
``mask_fingerprint.py`` for that.

    python benchmarks/ab_settings.py ../shared/maskbench --every 20 \\
        --b grammask.grammar.lexer:EAGER_RESOLVE_BUDGET=64
"""
from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from array import array
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import DEFAULT_MASKBENCH, Llama3, llama3_tokenizer_path  # noqa: E402


def parse_setting(items: list[str]) -> list[tuple[object, str, object]]:
    """``[(owner object, attribute, value)]`` of ``module:NAME=value`` items (dotted names reach
    class attributes)."""
    out = []
    for item in items:
        mod, _, rest = item.partition(":")
        name, eq, value = rest.partition("=")
        if not mod or not name or not eq:
            raise SystemExit(f"a setting is module:NAME=value, not {item!r}")
        obj = importlib.import_module(mod)
        parts = name.split(".")
        for p in parts[:-1]:
            obj = getattr(obj, p)
        if not hasattr(obj, parts[-1]):
            raise SystemExit(f"{mod} has no attribute {name}")
        out.append((obj, parts[-1], eval(value)))   # (the user's own expression)
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("data", nargs="?", default=str(DEFAULT_MASKBENCH), help="the MaskBench folder")
    ap.add_argument("--every", type=int, default=20, help="every N-th schema (default 20)")
    ap.add_argument("--a", action="append", default=[], metavar="module:NAME=value", help="setting A (repeatable)")
    ap.add_argument("--b", action="append", default=[], metavar="module:NAME=value", help="setting B (repeatable)")
    ap.add_argument("--a-max-shared-exprs", type=int, default=None)
    ap.add_argument("--b-max-shared-exprs", type=int, default=None)
    args = ap.parse_args(argv)

    import numpy as np

    import maskbench as mb

    settings = [parse_setting(args.a), parse_setting(args.b)]
    defaults = [(o, n, getattr(o, n)) for s in settings for o, n, _ in s]

    def use(i: int) -> None:
        for o, n, v in defaults:
            setattr(o, n, v)
        for o, n, v in settings[i]:
            setattr(o, n, v)

    engines = [mb.GrammaskEngine(llama3_tokenizer_path()) for _ in range(2)]
    for i, mse in enumerate((args.a_max_shared_exprs, args.b_max_shared_exprs)):
        if mse is not None:
            engines[i].compiler.max_shared_exprs = mse
        use(i)
        mb.run_schema(engines[i], mb.WARM_SCHEMA, [])
    tok = Llama3()
    items = mb.load_schemas(Path(args.data), args.every, None)
    from grammask.pipeline.gc_heap import freeze_gc_heap

    freeze_gc_heap()   # as the benchmark's worker
    tbm = [array("d"), array("d")]
    ttfm = [array("d"), array("d")]
    passing = [0, 0]
    t0 = time.perf_counter()
    for k, (_sid, _split, schema, tests) in enumerate(items):
        docs = [(bool(t["valid"]), tok.encode(json.dumps(t["data"])), t["data"]) for t in tests]
        for i in ((0, 1) if k % 2 else (1, 0)):
            use(i)
            r = mb.run_schema(engines[i], schema, docs)
            if r.get("ttfm_us") is not None:
                ttfm[i].append(r["ttfm_us"])
            tbm[i].extend(r["tbm_us"])
            if r.get("compile_error") is None and not r.get("mask_error") and all(v == a for v, a in r["tests"]):
                passing[i] += 1
    use(0)
    rows = []
    for i in (0, 1):
        t, f = np.array(tbm[i]), np.array(ttfm[i])
        rows.append([passing[i], len(t), t.sum() / 1e6, t.mean(), np.percentile(t, 50), np.percentile(t, 99),
                     t.max() / 1e3, np.percentile(f, 50) / 1e3, np.percentile(f, 99) / 1e3,
                     engines[i].compiler.exprs_resets])
    print(f"{len(items)} schemas (1 in {args.every}), {time.perf_counter() - t0:.0f} s\n")
    print("| setting | passing | masks | TBM total s | avg µs | p50 µs | p99 µs | max ms | TTFM p50 ms | TTFM p99 ms | ExprSet resets |")
    print("| --- | --: | --: | --: | --: | --: | --: | --: | --: | --: | --: |")
    for name, spec, r in (("A", args.a, rows[0]), ("B", args.b, rows[1])):
        label = name + (": " + ", ".join(spec) if spec else ": defaults")
        print(f"| {label} | {r[0]} | {r[1]} | {r[2]:.2f} | {r[3]:.1f} | {r[4]:.1f} | {r[5]:.0f} | {r[6]:.1f} | "
              f"{r[7]:.2f} | {r[8]:.1f} | {r[9]} |")
    a, b = rows
    print(f"| B / A | | | {b[2] / a[2]:.3f} | {b[3] / a[3]:.3f} | {b[4] / a[4]:.3f} | {b[5] / a[5]:.3f} | "
          f"{b[6] / a[6]:.3f} | {b[7] / a[7]:.3f} | {b[8] / a[8]:.3f} | |")


if __name__ == "__main__":
    main()
