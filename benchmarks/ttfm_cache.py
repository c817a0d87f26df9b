"""Time to first mask with warm and with cold CPU caches, grammask and llguidance, same schemas.

``maskbench.py`` measures the time to first mask (TTFM: compile + matcher + first mask) in a
worker that has just masked the previous schema's instances, and the other engine's worker ran in
between: the compile starts on caches that hold little of what it needs. How much of an engine's
TTFM is paid for that? Here each engine compiles every schema of the sample once, in a process of
its own (one per engine and mode, so that no schema is seen twice and no shared memo is warm from
an earlier pass), and nothing else runs between the compiles:

- ``warm``: back to back; what the last compile left in the caches is there for the next one;
- ``cold``: before each compile (outside the timing) ``--flush-mib`` MiB of a buffer are written,
  more than the last-level cache, so that the compile finds its code and data in memory only.

The table gives both engines' TTFM in each mode, their ratio (over every schema each compiled,
and like for like: the schemas both compiled), and each engine's cold / warm factor, the share of
its TTFM that is cache misses. ``--rounds`` repeats the four processes (order reversed every other
round) and takes each schema's median.

    python benchmarks/ttfm_cache.py ../shared/maskbench --every 20
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (DEFAULT_MASKBENCH, command_line, fmt, llama3_tokenizer_path, machine_line,  # noqa: E402
                    md_table, percentile, update_results_section)

ENGINES = ("grammask", "llguidance")
MODES = ("warm", "cold")


def child(engine: str, mode: str, data: str, every: int, flush_mib: int, *, max_schemas: int | None = None,
          freeze: bool = True) -> dict:
    """TTFM in microseconds of every schema of the sample (None: compile error), in this process
    (its own: ``freeze`` moves the startup heap out of the collector's reach for good)."""
    import numpy as np

    import maskbench as mb
    from grammask.pipeline.gc_heap import freeze_gc_heap

    eng = mb.ENGINE_CLASSES[engine](llama3_tokenizer_path())
    mb.run_schema(eng, mb.WARM_SCHEMA, [])   # kernels and first-use paths loaded before timing
    # the schemas as JSON text: each is parsed just before its compile (as the worker receives it)
    items = [(sid, json.dumps(schema)) for sid, _split, schema, _tests in
             mb.load_schemas(Path(data), every, max_schemas)]
    if freeze:
        freeze_gc_heap()   # as maskbench's worker (the startup heap out of full collections)
    flush = np.zeros(flush_mib << 20, np.uint8) if mode == "cold" else None
    out = {}
    for sid, text in items:
        schema = json.loads(text)
        if flush is not None:
            flush += 1   # every line of the buffer written: the caches hold it, not the engine
        # maskbench's own timing of compile + matcher + first mask (no instances: nothing after it)
        out[sid] = mb.run_schema(eng, schema, [])["ttfm_us"]   # None: a compile error
    return out


def run_child(engine: str, mode: str, args) -> dict:
    cmd = [sys.executable, __file__, "--child", engine, "--mode", mode, "--every", str(args.every),
           "--flush-mib", str(args.flush_mib), args.data]
    res = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise SystemExit(f"{engine} {mode} failed:\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def stats(vals: list[float]) -> dict:
    v = sorted(vals)
    return {"n": len(v), "p25": percentile(v, 25) / 1e3, "p50": percentile(v, 50) / 1e3,
            "p75": percentile(v, 75) / 1e3, "mean": (sum(v) / len(v) / 1e3) if v else float("nan")}


def report(runs: dict, engines: list[str]) -> tuple[str, list[str]]:
    """The table and the ratio lines of ``runs`` ({(engine, mode): [per round: {schema: TTFM µs or
    None}]}): per schema the median over rounds (None where a round did not compile it)."""
    ttfm: dict = {}
    for key, rs in runs.items():
        per = {}
        for sid in rs[0]:
            vals = [x[sid] for x in rs]
            per[sid] = None if any(v is None for v in vals) else statistics.median(vals)
        ttfm[key] = per
    rows = []
    summary: dict = {}
    for m in MODES:
        both = [sid for sid in ttfm[(engines[0], m)]
                if all(ttfm[(e, m)].get(sid) is not None for e in engines)]
        for e in engines:
            s = stats([v for v in ttfm[(e, m)].values() if v is not None])
            lfl = stats([ttfm[(e, m)][sid] for sid in both])
            summary[(e, m)] = (s, lfl)
            rows.append([e, m, s["n"], fmt(s["p25"], 2), fmt(s["p50"], 2), fmt(s["p75"], 2), fmt(s["mean"], 2),
                         lfl["n"], fmt(lfl["p50"], 2)])
    table = md_table(["engine", "caches", "schemas", "p25", "p50", "p75", "mean", "like for like",
                      "p50 (like for like)"], rows)
    lines = []
    if len(engines) == 2:
        a, b = engines
        for m in MODES:
            (sa, la), (sb, lb) = summary[(a, m)], summary[(b, m)]
            lines.append(f"- {m}: {a} / {b} TTFM p50 {sa['p50'] / sb['p50']:.2f}x "
                         f"(like for like {la['p50'] / lb['p50']:.2f}x), mean {sa['mean'] / sb['mean']:.2f}x")
    for e in engines:
        (sw, lw), (sc, lc) = summary[(e, "warm")], summary[(e, "cold")]
        lines.append(f"- {e}: cold / warm p50 {sc['p50'] / sw['p50']:.2f}x (like for like "
                     f"{lc['p50'] / lw['p50']:.2f}x), +{(sc['p50'] - sw['p50']) * 1e3:.0f} µs at the median")
    return table, lines


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("data", nargs="?", default=str(DEFAULT_MASKBENCH), help="the MaskBench folder")
    ap.add_argument("--every", type=int, default=20, help="every N-th schema (default 20)")
    ap.add_argument("--flush-mib", type=int, default=64, help="MiB written before each cold compile (default 64)")
    ap.add_argument("--rounds", type=int, default=1, help="repeat the four processes, each schema's median kept")
    ap.add_argument("--engines", default=",".join(ENGINES))
    ap.add_argument("--no-write", action="store_true", help="print only; do not update RESULTS.md")
    ap.add_argument("--results", default=str(Path(__file__).resolve().parent / "RESULTS.md"))
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.mode, args.data, args.every, args.flush_mib)))
        return
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    runs: dict = {(e, m): [] for e in engines for m in MODES}
    t_start = time.time()
    for r in range(args.rounds):
        order = [(e, m) for m in MODES for e in engines]
        for e, m in (order if r % 2 == 0 else order[::-1]):
            runs[(e, m)].append(run_child(e, m, args))
            print(f"  round {r + 1}: {e} {m} done, {time.time() - t_start:.0f} s", file=sys.stderr)
    table, lines = report(runs, engines)
    n_schemas = len(runs[(engines[0], MODES[0])][0])
    body = "\n".join([
        f"{n_schemas} schemas (every {args.every}th of {args.data}), tokenizer Llama-3, "
        f"{args.rounds} round(s), {args.flush_mib} MiB written before each cold compile; {machine_line()}; "
        f"run took {time.time() - t_start:.0f} s.",
        "",
        "TTFM in ms (compile + matcher + first mask), each engine and mode in a process of its own, every "
        "schema compiled once:",
        "",
        table,
        "",
        *lines,
    ])
    print(body)
    if not args.no_write:
        update_results_section(args.results, "ttfm_cache.py", f"Measured by `{command_line()}`.\n\n{body}")


if __name__ == "__main__":
    main()
