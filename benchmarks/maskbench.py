"""MaskBench (JSONSchemaBench) harness: grammask against llguidance and xgrammar, same run.

    python benchmarks/maskbench.py DATA_DIR [--engines grammask,llguidance,xgrammar] [--every N]
        [--timeout S] [--tokenizer llama3] [--max-schemas K] [--ids ID,ID,...] [--no-write]

Method (as MaskBench): for each schema compile once; for each test instance, ``json.dumps(data)``
(default separators) tokenized with the Llama-3 tokenizer; before each token compute the mask,
then commit the token if it is allowed. A valid instance must be accepted to its end (and the
grammar must be able to stop there); an invalid one must be rejected somewhere.

TTFM (time to first mask) = compile + the first mask. TBM (time between masks) = one later mask
plus the commit of its token. Warm TBM: every mask and commit of a second pass over the same
instances with the compiled grammar kept (the steady state of a server that sees a schema again).
The engines' workers run side by side: each schema is run by every engine in turn (the first
engine alternating from one schema to the next), so a drift of the host's speed during the run
reaches all engines alike (``--sequential``: one engine after the other, each with the machine to
itself, the method before session 30; the engines then also keep their data in the CPU caches from
one schema to the next, which in the side-by-side runs the other engine's schema evicts). Ratios
are given twice: each engine over its own schemas that ran, and like for like, over the schemas
every engine compiled and ran. Peak RSS: the largest ``ru_maxrss`` of the engine's worker
processes, once its tokenizer is loaded and over the run (a worker killed after a timeout or crash reports nothing). Each engine runs in
its own worker process, which first compiles and masks a small schema (``WARM_SCHEMA``: kernels
and first-use paths loaded, as a server's warm-up; grammask's worker also loads every kernel of
its disk cache first, ``grammask.preload_kernels()``, as ``grammask serve`` does) and then freezes its heap out of the garbage
collector's full collections (``gc.freeze``, as ``grammask serve`` and vLLM do after their start;
``--no-gc-freeze`` to keep them); the full collections that still happen are timed and reported
(count, longest, how many over 50 ms), and the schemas of the slowest masks are named. Every
schema has a time
limit covering its compile and all its masks, and a crash or hang of one schema is recorded and
the worker restarted, so the run always finishes. "compile errors": the engine refused the schema
(an exception from compile or the first mask); "mask errors": an exception from a later mask or
commit (e.g. grammask's typed ``GrammarTooComplexError`` when a lazily built automaton outgrows its
bound); "crashes": the worker process died. Each of these fails the schema.

Property order. Every engine here emits object properties in ``properties`` definition order (as
JSON Schema generators do), while JSON objects are unordered. MaskBench normalised the order of its
instances with llguidance (``maskbench/creation/reorder.py`` in guidance-ai/jsonschemabench), and
only for the schemas llguidance compiles; in the others the instances keep the order the generating
LLM chose. So for each valid instance an engine rejects, the harness also searches (outside the
timings) for a permutation of the instance's object keys that the same engine accepts, the way that
script does: keys chosen one at a time, each checked by feeding the tokenized text prefix to the
engine's matcher (rolled back to the part shared with the previous check); before the search, the
spelling with every object's keys in the order its schema declares them (through ``$ref``,
``allOf``/``anyOf``/``oneOf`` and ``if``/``then``/``else``) is checked once. "valid rejected"
counts the instance as given; "order only" is how many of those the engine accepts with its keys
permuted (nothing else changed); the rest are rejections of content, or orders neither the
declared order nor the budgeted search found.
"""
from __future__ import annotations

import argparse
import bisect
import json
import multiprocessing as mp
import os
import re
import resource
import sys
import time
import traceback
from array import array
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (  # noqa: E402
    RESULTS_MD,
    Llama3,
    command_line,
    fmt,
    machine_line,
    md_table,
    package_versions,
    percentile,
    update_results_section,
)

ENGINES = ("grammask", "llguidance", "xgrammar")


# ------------------------------------------------------------------------------ engines (workers)
class _Engine:
    """What every engine shares: a one-row int32 bitmask in the common layout, and the tokenizer."""

    bitmask = None
    _llama3 = None

    @property
    def llama3(self) -> Llama3:
        """The benchmark's tokenizer (loaded on first use: only the key-order search needs it)."""
        if self._llama3 is None:
            self._llama3 = Llama3()
        return self._llama3

    def encode(self, text: str) -> list[int]:
        return self.llama3.encode(text)

    def encode_with_ends(self, text: str) -> tuple[list[int], list[int]]:
        """Token ids of ``text`` and the character offset where each token ends."""
        enc = self.llama3.tk.encode(text, add_special_tokens=False)
        return enc.ids, [e for _, e in enc.offsets]

    def advance(self, m, tokens) -> int:
        """Commit tokens while they are allowed; how many were committed."""
        for i, t in enumerate(tokens):
            if not self.accept(m, t):
                return i
        return len(tokens)

    def rollback(self, m, n: int) -> None:
        if n:
            m.rollback(n)

    def allowed(self, t: int) -> bool:
        return bool((int(self.bitmask[0, t >> 5]) >> (t & 31)) & 1)


class GrammaskEngine(_Engine):
    def __init__(self, tok_path: str):
        from grammask import GrammarCompiler, GrammarMatcher, TokenizerInfo, allocate_token_bitmask, preload_kernels

        preload_kernels()   # every cached kernel loaded now, as a server does at startup
        self.info = TokenizerInfo.from_huggingface(tok_path)
        _ = self.info.trie
        self.compiler = GrammarCompiler(self.info, cache_size=0)
        self.Matcher = GrammarMatcher
        self.bitmask = allocate_token_bitmask(1, self.info.vocab_size)

    def compile(self, schema):
        return self.compiler.compile_json_schema(schema)

    def matcher(self, compiled):
        return self.Matcher(compiled)

    def fill(self, m) -> None:
        m.fill_next_token_bitmask(self.bitmask, 0)

    def accept(self, m, t: int) -> bool:
        return m.accept_token(t)

    def can_stop(self, m) -> bool:
        return m.can_terminate()


class LLGuidanceEngine(_Engine):
    def __init__(self, tok_path: str):
        import llguidance
        import llguidance.hf
        import llguidance.numpy
        from transformers import PreTrainedTokenizerFast

        hf = PreTrainedTokenizerFast(tokenizer_file=tok_path)
        self.tok = llguidance.hf.from_tokenizer(hf)
        self.ll = llguidance
        self.np = llguidance.numpy
        self.bitmask = llguidance.numpy.allocate_token_bitmask(1, self.tok.vocab_size)

    def compile(self, schema):
        grm = self.ll.LLMatcher.grammar_from_json_schema(schema, defaults={"whitespace_flexible": True})
        err = self.ll.LLMatcher.validate_grammar(grm, self.tok)
        if err:
            raise ValueError(err)
        return grm

    def matcher(self, grm):
        m = self.ll.LLMatcher(self.tok, grm)
        if m.is_error():
            raise ValueError(m.get_error())
        return m

    def fill(self, m) -> None:
        self.np.fill_next_token_bitmask(m, self.bitmask, 0)

    def accept(self, m, t: int) -> bool:
        return m.consume_token(t) and not m.is_error()

    def advance(self, m, tokens) -> int:
        return m.try_consume_tokens(tokens)

    def can_stop(self, m) -> bool:
        return m.is_accepting()


class XGrammarEngine(_Engine):
    def __init__(self, tok_path: str):
        import xgrammar as xgr
        from transformers import PreTrainedTokenizerFast

        hf = PreTrainedTokenizerFast(tokenizer_file=tok_path)
        self.xgr = xgr
        self.info = xgr.TokenizerInfo.from_huggingface(hf)
        self.compiler = xgr.GrammarCompiler(self.info, cache_enabled=False)
        self.bitmask = xgr.allocate_token_bitmask(1, self.info.vocab_size)

    def compile(self, schema):
        return self.compiler.compile_json_schema(json.dumps(schema), any_whitespace=True, strict_mode=False)

    def matcher(self, compiled):
        return self.xgr.GrammarMatcher(compiled)

    def fill(self, m) -> None:
        m.fill_next_token_bitmask(self.bitmask, 0)

    def accept(self, m, t: int) -> bool:
        return m.accept_token(t)

    def can_stop(self, m) -> bool:
        self.fill(m)
        return any(self.allowed(s) for s in self.info.stop_token_ids)


ENGINE_CLASSES = {"grammask": GrammaskEngine, "llguidance": LLGuidanceEngine, "xgrammar": XGrammarEngine}


class _Budget(Exception):
    pass


class _PrefixChecker:
    """Does ``engine`` accept a text (as a prefix, or complete)? One matcher, rolled back to the
    last token boundary inside the part shared with the previous text; only the rest is tokenized
    (the engines are byte-level: any tokenization of the same bytes is accepted alike). Texts are
    ``json.dumps`` output, ASCII, so character offsets are byte offsets and every token boundary
    is a character boundary."""

    def __init__(self, engine, compiled, max_checks: int, max_s: float):
        self.engine, self.m = engine, engine.matcher(compiled)
        self.text, self.ends = "", []  # text fed so far; end offset of each committed token
        self.left, self.deadline = max_checks, time.perf_counter() + max_s

    def __call__(self, text: str, complete: bool = False) -> bool:
        self.left -= 1
        if self.left < 0 or time.perf_counter() > self.deadline:
            raise _Budget
        shared = len(os.path.commonprefix([self.text, text]))
        keep = bisect.bisect_right(self.ends, shared)
        self.engine.rollback(self.m, len(self.ends) - keep)
        del self.ends[keep:]
        start = self.ends[-1] if self.ends else 0
        toks, ends = self.engine.encode_with_ends(text[start:])
        n = self.engine.advance(self.m, toks)
        self.ends += [start + e for e in ends[:n]]
        self.text = text[:self.ends[-1]] if self.ends else ""
        if n < len(toks):
            return False
        return self.engine.can_stop(self.m) if complete else True


def _resolve_ref(root, s, depth: int = 0):
    while isinstance(s, dict) and isinstance(s.get("$ref"), str) and s["$ref"].startswith("#") and depth < 64:
        node = root
        try:
            for part in s["$ref"][1:].split("/")[1:]:
                part = part.replace("~1", "/").replace("~0", "~")
                node = node[int(part)] if isinstance(node, list) else node[part]
        except (KeyError, IndexError, ValueError, TypeError):
            return s
        s, depth = node, depth + 1
    return s


def _if_holds(root, cond, data) -> bool:
    """Whether ``data`` meets an ``if`` schema, as far as its ``required``, ``const`` and ``enum``
    of properties tell (anything else: assumed met)."""
    cond = _resolve_ref(root, cond)
    if not isinstance(cond, dict) or not isinstance(data, dict):
        return True
    if any(k not in data for k in cond.get("required", ()) if isinstance(k, str)):
        return False
    for k, sub in (cond.get("properties") or {}).items():
        sub = _resolve_ref(root, sub)
        if k in data and isinstance(sub, dict):
            if "const" in sub and data[k] != sub["const"]:
                return False
            if isinstance(sub.get("enum"), list) and data[k] not in sub["enum"]:
                return False
    return True


def _branches(root, s, keys=(), depth: int = 0, budget=None, data=None) -> list[dict]:
    """``s`` and, through local ``$ref``, the schemas it combines: every ``allOf`` member, an ``if``
    and the ``then`` or ``else`` that ``data`` takes (:func:`_if_holds`), and of an
    ``anyOf``/``oneOf`` the branch declaring most of ``keys``
    (the keys of the object at hand; the first such branch). At most 16 levels and 2,000
    schemas visited per object (``budget``)."""
    budget = [2000] if budget is None else budget
    budget[0] -= 1
    s = _resolve_ref(root, s)
    if not isinstance(s, dict) or depth > 16 or budget[0] < 0:
        return []
    out = [s]
    for x in s.get("allOf", ()) if isinstance(s.get("allOf"), list) else ():
        out += _branches(root, x, keys, depth + 1, budget, data)
    for k in ("anyOf", "oneOf"):
        alts = [_branches(root, x, keys, depth + 1, budget, data) for x in (s.get(k, ()) if isinstance(s.get(k), list) else ())]
        if alts:
            out += max(alts, key=lambda b: sum(1 for key in keys if any(
                isinstance(x.get("properties"), dict) and key in x["properties"] for x in b)))
    if "if" in s:   # an ``if`` names keys its ``then`` depends on: they come first
        out += _branches(root, s["if"], keys, depth + 1, budget, data)
        k = "then" if _if_holds(root, s["if"], data) else "else"
        if k in s:
            out += _branches(root, s[k], keys, depth + 1, budget, data)
    return out[:200]


def schema_key_order(root, schema, data):
    """``data`` with every object's keys in the order its schema declares them (``properties`` of
    the schema and of the schemas it combines, in order met; other keys after them, as given).
    A guess, not a proof: :func:`reorder_keys` checks it with the engine."""
    subs = _branches(root, schema, list(data) if isinstance(data, dict) else (), data=data)
    if isinstance(data, list):
        items = [x["items"] for x in subs if isinstance(x.get("items"), dict)]
        return [schema_key_order(root, items[0] if items else {}, v) for v in data]
    if not isinstance(data, dict):
        return data
    props: dict = {}   # key -> every schema declaring it (its value meets all of them)
    for x in subs:
        p = x.get("properties")
        for k, v in (p.items() if isinstance(p, dict) else ()):
            props.setdefault(k, []).append(v)
    rank = {k: i for i, k in enumerate(props)}
    given = {k: i for i, k in enumerate(data)}
    out = {}
    for k in sorted(data, key=lambda k: (rank.get(k, len(rank)), given[k])):
        sub = props.get(k)
        if sub is not None:
            sub = sub[0] if len(sub) == 1 else {"allOf": sub}
        else:
            sub = next((v for x in subs for pat, v in (x.get("patternProperties") or {}).items()
                        if isinstance(pat, str) and _search(pat, k)),
                       next((x["additionalProperties"] for x in subs if isinstance(x.get("additionalProperties"), dict)), {}))
        out[k] = schema_key_order(root, sub, data[k])
    return out


def _search(pattern: str, s: str) -> bool:
    try:
        return re.search(pattern, s) is not None
    except re.error:
        return False


def reorder_keys(engine, compiled, data, *, max_checks: int = 50_000, max_s: float = 15.0, schema=None) -> str | None:
    """A ``json.dumps`` spelling of ``data`` with object keys permuted that ``engine`` accepts.

    Given the ``schema``, the spelling with every object's keys in the order its schema declares
    them (:func:`schema_key_order`) is tried first. Then depth-first over spellings, the way
    MaskBench's reorder script orders keys: among the keys
    the engine accepts next, first those after which all the others can still follow, then the
    rest; each accepted spelling of a value (nested objects likewise); backtracking into earlier
    choices when the rest finds no order. Every order returned is one the engine accepted, checked
    to the end. ``None`` when no order is found within the budget."""
    ok = _PrefixChecker(engine, compiled, max_checks, max_s)

    def value(prefix: str, v):
        # every spelling of ``v`` after ``prefix`` the engine accepts (lazily, depth first)
        if isinstance(v, dict):
            yield from members(prefix + "{", v, list(v), first=True)
        elif isinstance(v, list):
            yield from elements(prefix + "[", v, 0)
        else:
            yield prefix + json.dumps(v)

    def elements(text: str, arr: list, i: int):
        if i == len(arr):
            yield text + "]"
            return
        for after in value(text + (", " if i else ""), arr[i]):
            yield from elements(after, arr, i + 1)

    def members(text: str, obj: dict, left: list, first: bool):
        if not left:
            if ok(text + "}"):
                yield text + "}"
            return
        sep = "" if first else ", "
        heads = {k: text + sep + json.dumps(k) + ": " for k in left}
        now = [k for k in left if ok(heads[k])]
        # First the keys after which every other key possible now can still come next (in a
        # fixed-order grammar: the earliest of them, as MaskBench's reorder script chooses), then
        # the others.
        later = []
        for k in now:
            rest = [k2 for k2 in left if k2 != k]
            for after in value(heads[k], obj[k]):
                if all(ok(after + ", " + json.dumps(k2) + ": ") for k2 in now if k2 != k):
                    yield from members(after, obj, rest, False)
                else:
                    later.append((after, rest))
        for after, rest in later:
            yield from members(after, obj, rest, False)

    try:
        if schema is not None:
            try:
                guess = json.dumps(schema_key_order(schema, schema, data))
            except RecursionError:
                guess = None
            if guess is not None and guess != json.dumps(data) and ok(guess, complete=True):
                return guess
        for text in value("", data):
            if ok(text, complete=True):
                return text
    except _Budget:
        pass
    finally:
        # the three generators call each other through their closure cells: a reference cycle
        # that holds ``ok`` (so the grammar and its matchers) until a full collection frees it,
        # and that collection lands in a later schema's timed masks (it was the worker's longest
        # pauses, 20-45 ms). Emptying the cells breaks the cycle: all is freed on return.
        value = elements = members = None  # noqa: F841
    return None


#: compiled and masked once by each worker before it reports ready (JIT loading, first-use paths)
WARM_SCHEMA = {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "integer"}}}


def run_schema(engine, schema, tests, order_s: float = 0.0) -> dict:
    """Compile ``schema`` and run its tests; all times in microseconds."""
    # the times in arrays, not lists of floats: the worker's own records stay out of the objects
    # the garbage collector walks in the engine's collections (a list of 10,000 masks' times was
    # the largest container some of them met)
    out = {"compile_error": None, "ttfm_us": None, "tbm_us": array("d"), "tests": []}
    t0 = time.perf_counter()
    try:
        compiled = engine.compile(schema)
        first = engine.matcher(compiled)
        engine.fill(first)
    except Exception as e:  # noqa: BLE001 - every compile failure is a result
        out["compile_error"] = f"{type(e).__name__}: {str(e)[:200]}"
        return out
    out["ttfm_us"] = (time.perf_counter() - t0) * 1e6
    try:
        _run_tests(engine, compiled, first, tests, out)
        # warm: the same instances again with the compiled grammar kept (a server that sees the
        # schema again): every mask, the first of each instance included
        warm = {"tbm_us": array("d"), "tests": []}
        _run_tests(engine, compiled, None, tests, warm, warm=True)
        out["tbm_warm_us"] = warm["tbm_us"]
    except Exception as e:  # noqa: BLE001 - an engine error while masking fails the schema
        out["mask_error"] = f"{type(e).__name__}: {str(e)[:200]}"
        return out
    # outside the timings: which valid rejections are about key order only (``order_s`` seconds
    # in all for this schema's searches)
    out["order_only"] = 0
    deadline = time.perf_counter() + order_s
    for (valid, _, data), (_, accepted) in zip(tests, out["tests"]):
        left = deadline - time.perf_counter()
        if valid and not accepted and left > 0:
            try:
                out["order_only"] += reorder_keys(engine, compiled, data, max_s=left, schema=schema) is not None
            except Exception:  # noqa: BLE001 - the search is a diagnosis, never a failure
                pass
    return out


def _run_tests(engine, compiled, first, tests, out, warm: bool = False) -> None:
    for k, (valid, tokens, _) in enumerate(tests):
        m = first if k == 0 and not warm else engine.matcher(compiled)
        accepted = True
        for i, t in enumerate(tokens):
            timed = warm or i > 0 or k > 0   # the cold pass's first mask is in TTFM
            t1 = time.perf_counter()
            if timed:
                engine.fill(m)
            ok = engine.allowed(t) and engine.accept(m, t)
            if timed:
                out["tbm_us"].append((time.perf_counter() - t1) * 1e6)
            if not ok:
                accepted = False
                break
        if accepted:
            accepted = engine.can_stop(m)
        out["tests"].append((valid, accepted))


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


class _JitCounter:
    """Numba compilations in the worker after its warm-up. A kernel compiled while a schema runs
    is inside its timings (seconds, against microseconds): after an edit to a module with kernels,
    Numba's cache of that module is stale until some run has compiled it again. The report says how
    many there were, so that such a run is seen and run again, not read."""

    def __init__(self):
        self.n = 0

    @classmethod
    def install(cls):
        from numba.core import event

        self = cls()

        class _Listener(event.Listener):
            def on_start(self_, ev):
                self.n += 1

            def on_end(self_, ev):
                pass

        event.register("numba:compile", _Listener())
        return self

    def take(self) -> int:
        n, self.n = self.n, 0
        return n


def worker(name: str, tok_path: str, conn, gc_freeze: bool = True) -> None:
    from grammask.pipeline.gc_heap import FullCollectionTimer, freeze_gc_heap

    try:
        engine = ENGINE_CLASSES[name](tok_path)
        run_schema(engine, WARM_SCHEMA, [])   # kernels and first-use paths loaded before any timing
    except Exception:  # noqa: BLE001
        conn.send(("init_error", traceback.format_exc()))
        return
    if gc_freeze:
        freeze_gc_heap()   # as a server after its start (grammask serve, vLLM): see pipeline/gc_heap.py
    jit = _JitCounter.install()
    conn.send(("ready", _peak_rss_mib()))
    while True:
        msg = conn.recv()
        if msg is None:
            return
        sid, schema, tests, order_s = msg
        timer = FullCollectionTimer()
        try:
            with timer:
                res = run_schema(engine, schema, tests, order_s)
        except Exception as e:  # noqa: BLE001
            res = {"compile_error": None, "crash": f"{type(e).__name__}: {e}", "ttfm_us": None,
                   "tbm_us": [], "tests": []}
        res["peak_rss_mib"] = _peak_rss_mib()
        res["gc_pauses_ms"] = [p * 1e3 for p in timer.pauses]
        res["gc_freed"] = sum(timer.freed)
        res["jit_compiles"] = jit.take()
        conn.send(("result", res))


class Worker:
    def __init__(self, name: str, tok_path: str, gc_freeze: bool = True):
        self.name, self.tok_path, self.gc_freeze = name, tok_path, gc_freeze
        self.ctx = mp.get_context("spawn")
        self.proc = None
        self.starts, self.ready_rss_mib = 0, 0.0   # worker processes started; their largest peak RSS when ready
        self.start()

    def start(self) -> None:
        self.conn, child = self.ctx.Pipe()
        self.proc = self.ctx.Process(target=worker, args=(self.name, self.tok_path, child, self.gc_freeze),
                                     daemon=True)
        self.proc.start()
        if not self.conn.poll(600):
            raise SystemExit(f"{self.name}: worker did not start")
        kind, payload = self.conn.recv()
        if kind != "ready":
            raise SystemExit(f"{self.name}: worker failed to start:\n{payload}")
        self.starts += 1
        self.ready_rss_mib = max(self.ready_rss_mib, payload)

    def run(self, sid, schema, tests, timeout: float, order_s: float = 0.0) -> dict:
        try:
            self.conn.send((sid, schema, tests, order_s))
            # the key-order searches run after the timed part, within their own allowance
            if self.conn.poll(timeout + order_s + 1):
                kind, res = self.conn.recv()
                return res
            status = "timeout"
        except (EOFError, BrokenPipeError, ConnectionResetError):
            status = "crash"
        if status == "timeout" or not self.proc.is_alive():
            pass
        self.proc.kill()
        self.proc.join()
        if self.proc.exitcode not in (None, -9) and status == "timeout":
            status = "crash"
        self.start()
        return {"compile_error": None, status: True, "ttfm_us": None, "tbm_us": [], "tests": []}

    def close(self) -> None:
        try:
            self.conn.send(None)
        except Exception:  # noqa: BLE001
            pass
        self.proc.join(5)
        if self.proc.is_alive():
            self.proc.kill()


# ------------------------------------------------------------------------------ data and report
def load_schemas(data_dir: Path, every: int, max_schemas: int | None):
    files = sorted(data_dir.glob("*.jsonl"))
    if not files:
        raise SystemExit(f"no *.jsonl in {data_dir}")
    out = []
    idx = 0
    for f in files:
        with open(f) as fh:
            for line in fh:
                if idx % every == 0:
                    rec = json.loads(line)
                    out.append((rec["id"], f.stem, rec["schema"], rec.get("tests", [])))
                idx += 1
    return out[:max_schemas] if max_schemas else out


def summarize(name: str, results: list[dict], splits: list[str], ids: list[str] | None = None) -> dict:
    tbm = sorted(t for r in results for t in r["tbm_us"])
    ttfm = sorted(r["ttfm_us"] for r in results if r["ttfm_us"] is not None)
    s = {"engine": name, "schemas": len(results), "tbm": tbm, "ttfm": ttfm,
         "tbm_warm": sorted(t for r in results for t in r.get("tbm_warm_us", ()))}
    s["compile_errors"] = sum(1 for r in results if r["compile_error"])
    s["timeouts"] = sum(1 for r in results if r.get("timeout"))
    s["crashes"] = sum(1 for r in results if r.get("crash"))
    s["mask_errors"] = sum(1 for r in results if r.get("mask_error"))
    s["valid_rejected"] = sum(1 for r in results for v, a in r["tests"] if v and not a)
    s["invalid_accepted"] = sum(1 for r in results for v, a in r["tests"] if not v and a)
    s["order_only"] = sum(r.get("order_only", 0) for r in results)
    s["tests"] = sum(len(r["tests"]) for r in results)
    passing = [r["ttfm_us"] is not None and not r.get("timeout") and not r.get("crash")
               and not r.get("mask_error") and all(v == a for v, a in r["tests"]) for r in results]
    s["passing"] = sum(passing)
    per_split = defaultdict(lambda: [0, 0])
    for sp, ok in zip(splits, passing):
        per_split[sp][0] += ok
        per_split[sp][1] += 1
    s["per_split"] = dict(per_split)
    s["peak_rss_mib"] = max((r["peak_rss_mib"] for r in results if "peak_rss_mib" in r), default=float("nan"))
    # the schema during which the worker's RSS rose the most (``ru_maxrss`` is a running maximum)
    rises, last = [], None
    for r, sid in zip(results, ids or [""] * len(results)):
        if "peak_rss_mib" in r:
            if last is not None and r["peak_rss_mib"] > last:
                rises.append((r["peak_rss_mib"] - last, sid))
            last = r["peak_rss_mib"]
    s["rss_rises"] = sorted(rises, reverse=True)[:3]
    s["gc_pauses_ms"] = sorted(p for r in results for p in r.get("gc_pauses_ms", ()))
    s["gc_freed"] = sum(r.get("gc_freed", 0) for r in results)
    # the schemas during which the longest full collections ran (to rerun them alone)
    s["gc_worst"] = sorted(((max(r["gc_pauses_ms"]), sid) for r, sid in zip(results, ids or [""] * len(results))
                            if r.get("gc_pauses_ms")), reverse=True)[:4]
    s["jit"] = sorted(((r["jit_compiles"], sid) for r, sid in zip(results, ids or [""] * len(results))
                       if r.get("jit_compiles")), reverse=True)
    # the schemas of the slowest masks (each schema once)
    s["worst"] = sorted(((max(r["tbm_us"]), sid) for r, sid in zip(results, ids or [""] * len(results))
                         if r["tbm_us"]), reverse=True)[:6]
    # per schema: did it compile and run, and its (valid, accepted) outcomes, to compare engines
    # on the schemas they all handle
    s["ran"] = [r["ttfm_us"] is not None and not r.get("timeout") and not r.get("crash")
                and not r.get("mask_error") for r in results]
    s["outcomes"] = [r["tests"] for r in results]
    # per schema, for the like-for-like ratios
    s["by_schema"] = [(r["ttfm_us"], r["tbm_us"], r.get("tbm_warm_us", ())) for r in results]
    return s


def pct(vals, q):
    return percentile(vals, q) if vals else float("nan")


def restrict(s: dict, idx: list[int]) -> dict:
    """The timings of summary ``s`` over the schemas ``idx`` only."""
    by = s["by_schema"]
    return {"tbm": sorted(t for i in idx for t in by[i][1]),
            "ttfm": sorted(by[i][0] for i in idx if by[i][0] is not None),
            "tbm_warm": sorted(t for i in idx for t in by[i][2])}


def ratio_row(label: str, g: dict, s: dict) -> list:
    """grammask's timings ``g`` over another engine's ``s``: TBM avg/p50/p99, TTFM p50/p99, warm
    avg/p50 ("-" where either side has none)."""
    def ratio(key, stat):
        a, b = g[key], s[key]
        if not a or not b:
            return "-"
        return fmt(stat(a) / stat(b), 2)

    avg = lambda v: sum(v) / len(v)  # noqa: E731
    p50, p99 = (lambda v: pct(v, 50)), (lambda v: pct(v, 99))
    return [label, ratio("tbm", avg), ratio("tbm", p50), ratio("tbm", p99), ratio("ttfm", p50),
            ratio("ttfm", p99), ratio("tbm_warm", avg), ratio("tbm_warm", p50)]


def report(summaries: list[dict], args, n_schemas: int, elapsed: float) -> str:
    which = f"selected by --ids from {args.data}" if getattr(args, "ids", None) else f"every {args.every}th of {args.data}"
    how = ("engines one after the other" if getattr(args, "sequential", False)
           else "engines side by side, each schema by each in turn")
    lines = [f"{n_schemas} schemas ({which}), tokenizer Llama-3, "
             f"timeout {args.timeout:g} s per schema, {how}; {machine_line()}; run took {elapsed:.0f} s.", ""]
    head = ["engine", "passing", "compile errors", "mask errors", "timeouts", "crashes", "valid rejected",
            "of which order only", "invalid accepted", "tests"]
    rows = [[s["engine"], f"{s['passing']} ({100 * s['passing'] / max(1, s['schemas']):.1f}%)",
             s["compile_errors"], s["mask_errors"], s["timeouts"], s["crashes"], s["valid_rejected"],
             s["order_only"], s["invalid_accepted"], s["tests"]] for s in summaries]
    lines += ["### Correctness", "", md_table(head, rows), "",
              "\"order only\": valid instances rejected as given but accepted by the same engine once their "
              "object keys are permuted (see the module docstring: MaskBench normalised key order with "
              "llguidance, for the schemas llguidance compiles).", ""]
    if len(summaries) > 1:
        common = [all(s["ran"][i] for s in summaries) for i in range(n_schemas)]
        rows = []
        for s in summaries:
            outs = [o for i, o in enumerate(s["outcomes"]) if common[i]]
            rows.append([s["engine"], sum(common),
                         sum(all(v == a for v, a in o) for o in outs),
                         sum(1 for o in outs for v, a in o if v and not a),
                         sum(1 for o in outs for v, a in o if not v and a),
                         sum(len(o) for o in outs)])
        lines += ["Like for like: the schemas that every engine compiled and ran (no compile error, "
                  "mask error, timeout or crash):", "",
                  md_table(["engine", "schemas", "passing", "valid rejected", "invalid accepted", "tests"], rows), ""]
    qs = [25, 50, 75, 90, 95, 99, 99.9]
    head = ["engine", "masks", "avg"] + [f"p{q:g}" for q in qs] + ["max"]
    rows = []
    for s in summaries:
        v = s["tbm"]
        rows.append([s["engine"], len(v), fmt(sum(v) / len(v) if v else float("nan"))]
                    + [fmt(pct(v, q)) for q in qs] + [fmt(v[-1] if v else float("nan"))])
    lines += ["### TBM: time between masks (µs)", "", md_table(head, rows), ""]
    for s in summaries:
        if s.get("worst"):
            lines.append(f"Slowest masks, {s['engine']}: "
                         + ", ".join(f"{sid} ({us / 1000:,.1f} ms)" for us, sid in s["worst"]) + ".")
    lines.append("")
    rows = []
    for s in summaries:
        v = s["tbm_warm"]
        rows.append([s["engine"], len(v), fmt(sum(v) / len(v) if v else float("nan"))]
                    + [fmt(pct(v, q)) for q in qs] + [fmt(v[-1] if v else float("nan"))])
    lines += ["### Warm TBM: the same instances masked again, compiled grammar kept (µs)", "",
              "Every mask and commit of a second pass over the schema's instances with the grammar compiled "
              "in the first (the steady state of a server that sees a schema again); each engine's own "
              "schemas that ran without error.", "", md_table(head, rows), ""]
    head = ["engine", "schemas", "avg"] + [f"p{q:g}" for q in qs[:-1]] + ["max"]
    rows = []
    for s in summaries:
        v = [x / 1000 for x in s["ttfm"]]
        rows.append([s["engine"], len(v), fmt(sum(v) / len(v) if v else float("nan"), 2)]
                    + [fmt(pct(v, q), 2) for q in qs[:-1]] + [fmt(v[-1] if v else float("nan"), 2)])
    lines += ["### TTFM: compile + first mask (ms)", "", md_table(head, rows), ""]
    rows = [[s["engine"], fmt(s.get("ready_rss_mib", float("nan")), 0), fmt(s["peak_rss_mib"], 0),
             s.get("workers", "-"), ", ".join(f"{sid} (+{d:,.0f})" for d, sid in s.get("rss_rises", ())) or "-"]
            for s in summaries]
    lines += ["### Peak RSS of the engine's worker process (MiB)", "",
              md_table(["engine", "tokenizer loaded", "over the run", "worker processes", "largest rises (schema)"], rows), ""]
    rows = []
    for s in summaries:
        g = s.get("gc_pauses_ms", [])
        rows.append([s["engine"], len(g), fmt(sum(g) / 1e3, 2), fmt(pct(g, 50), 1) if g else "-",
                     fmt(g[-1], 1) if g else "-", sum(1 for p in g if p > 50), f"{s.get('gc_freed', 0):,}"])
    frozen = "frozen once the worker was ready" if not getattr(args, "no_gc_freeze", False) else "not frozen"
    lines += ["### Full garbage collections in the worker (generation 2)", "",
              f"Startup heap {frozen} (`gc.freeze`, as a server after its start: `src/grammask/pipeline/gc_heap.py`). "
              "Pauses are timed over each schema's compile, masks and key-order searches; one that falls "
              "inside a timed mask is part of that mask's time. \"objects freed\": what they found unreachable "
              "(reference cycles, which reference counting cannot free), all collections together.", "",
              md_table(["engine", "collections", "total (s)", "p50 (ms)", "longest (ms)", "over 50 ms", "objects freed"],
                       rows), ""]
    worst = [f"{s['engine']}: " + ", ".join(f"{sid} ({ms:,.1f} ms)" for ms, sid in s["gc_worst"])
             for s in summaries if s.get("gc_worst")]
    if worst:
        lines += ["Longest collections, by the schema they ran in: " + "; ".join(worst) + ".", ""]
    for s in summaries:
        if s.get("jit"):
            lines += [f"**{s['engine']}: {sum(n for n, _ in s['jit'])} Numba compilations while schemas ran** "
                      f"(in {len(s['jit'])} schemas, first {', '.join(sid for _, sid in s['jit'][:4])}): "
                      "a stale kernel cache (a module with kernels edited since the last run); those "
                      "timings include the compilations: run again.", ""]
    base = {s["engine"]: s for s in summaries}
    if "grammask" in base and len(base) > 1:
        g = base["grammask"]
        rows = []
        for s in summaries:
            if s["engine"] == "grammask" or not s["tbm"] or not g["tbm"]:
                continue
            rows.append(ratio_row(f"grammask / {s['engine']}", g, s))
            # the same, over the schemas both engines compiled and ran
            both = [i for i in range(n_schemas) if g["ran"][i] and s["ran"][i]]
            rows.append(ratio_row(f"grammask / {s['engine']}, the {len(both)} schemas both ran",
                                  restrict(g, both), restrict(s, both)))
        lines += ["### Ratios (lower is better for grammask)", "",
                  "Each engine over its own schemas that ran, then both over the schemas both compiled and ran "
                  "(like for like: an engine that refuses a schema leaves its compile and masks out of its "
                  "figures).", "",
                  md_table(["ratio", "TBM avg", "TBM p50", "TBM p99", "TTFM p50", "TTFM p99", "warm avg",
                            "warm p50"], rows), ""]
    rows = []
    for s in summaries:
        for kind in ("timeout", "crash", "mask error"):
            ids = [sid for sid, why in s.get("failures", []) if why and why.startswith(kind)]
            if ids:
                rows.append([s["engine"], kind, len(ids), ", ".join(ids[:12]) + (" ..." if len(ids) > 12 else "")])
    if rows:
        lines += ["### Schemas that timed out, crashed or failed while masking", "",
                  md_table(["engine", "failure", "schemas", "ids"], rows), ""]
    splits = sorted({sp for s in summaries for sp in s["per_split"]})
    head = ["split"] + [s["engine"] for s in summaries]
    rows = []
    for sp in splits:
        row = [sp]
        for s in summaries:
            ok, n = s["per_split"].get(sp, (0, 0))
            row.append(f"{ok}/{n}")
        rows.append(row)
    lines += ["### Passing schemas per split", "", md_table(head, rows), ""]
    return "\n".join(lines)


def plot(summaries: list[dict], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import numpy as np
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for s in summaries:
        v = np.asarray(s["tbm"])
        if v.size:
            ax.plot(np.sort(v), np.linspace(0, 1, v.size), label=f"{s['engine']} (n={v.size})")
    ax.set_xscale("log")
    ax.set_xlabel("time between masks (µs, log scale)")
    ax.set_ylabel("fraction of masks")
    ax.set_title("MaskBench: distribution of mask times")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("data", nargs="?", default=str(Path(__file__).resolve().parents[2] / "shared" / "maskbench"))
    ap.add_argument("--engines", default=",".join(ENGINES))
    ap.add_argument("--every", type=int, default=20)
    ap.add_argument("--timeout", type=float, default=30.0)
    ap.add_argument("--tokenizer", default="llama3", choices=["llama3"])
    ap.add_argument("--max-schemas", type=int, default=None)
    ap.add_argument("--order-search", type=float, default=20.0, metavar="S",
                    help="seconds per schema to search key orders for rejected valid instances (0: off)")
    ap.add_argument("--ids", default=None,
                    help="comma-separated schema ids to run (instead of --every; own RESULTS.md section)")
    ap.add_argument("--no-write", action="store_true", help="print only; do not update RESULTS.md")
    ap.add_argument("--no-gc-freeze", action="store_true",
                    help="leave each worker's startup heap to the cyclic collector (default: frozen once ready)")
    ap.add_argument("--section", default=None,
                    help="the RESULTS.md section's name, 'maskbench.py (NAME)' (default: full data, 1 in N, or "
                         "selected schemas with --ids)")
    ap.add_argument("--sequential", action="store_true",
                    help="run the engines one after the other (each over every schema, with the machine to itself: "
                         "the method before session 30), not side by side")
    ap.add_argument("--plot", default=None,
                    help="PNG path (default benchmarks/maskbench_tbm.png, or maskbench_tbm_1inN.png for --every N)")
    args = ap.parse_args(argv)
    suffix = "" if args.every == 1 else f"_1in{args.every}"
    if args.ids:
        suffix = "_selected"   # never the full data's plot
    if args.plot is None:
        args.plot = str(Path(__file__).resolve().parent / f"maskbench_tbm{suffix}.png")
    # the full data and each sample keep their own section of RESULTS.md
    section = "maskbench.py (full data)" if args.every == 1 else f"maskbench.py (1 in {args.every})"
    if args.section and not args.ids:
        section = f"maskbench.py ({args.section})"
    ids = set(args.ids.split(",")) if args.ids else None
    if ids:
        args.every = 1
        section = f"maskbench.py ({args.section or 'selected schemas'})"
    engines = [e for e in args.engines.split(",") if e]
    for e in engines:
        if e not in ENGINE_CLASSES:
            raise SystemExit(f"unknown engine {e!r}")
    tok = Llama3()
    schemas = load_schemas(Path(args.data), args.every, args.max_schemas)
    if ids:
        schemas = [x for x in schemas if x[0] in ids]
        missing = ids - {x[0] for x in schemas}
        if missing:
            raise SystemExit(f"unknown schema ids: {', '.join(sorted(missing))}")
    tasks = []
    for sid, split, schema, tests in schemas:
        toks = [(bool(t["valid"]), tok.encode(json.dumps(t["data"])), t["data"]) for t in tests]
        tasks.append((sid, split, schema, toks))
    t_start = time.time()
    results: list[list[dict]] = [[] for _ in engines]
    workers = []
    if args.sequential:   # one engine at a time, each with the machine to itself
        for j, name in enumerate(engines):
            w = Worker(name, tok.path, gc_freeze=not args.no_gc_freeze)
            for k, (sid, split, schema, toks) in enumerate(tasks):
                results[j].append(w.run(sid, schema, toks, args.timeout, args.order_search))
                if (k + 1) % 50 == 0:
                    print(f"  {name}: {k + 1}/{len(tasks)} schemas, {time.time() - t_start:.0f} s", file=sys.stderr)
            w.close()
            workers.append(w)
    else:
        # side by side, every schema run by each engine in turn (the first alternating): a drift
        # of the host's speed over the run reaches every engine alike
        workers = [Worker(name, tok.path, gc_freeze=not args.no_gc_freeze) for name in engines]
        for k, (sid, split, schema, toks) in enumerate(tasks):
            order = range(len(engines)) if k % 2 == 0 else reversed(range(len(engines)))
            for j in order:
                results[j].append(workers[j].run(sid, schema, toks, args.timeout, args.order_search))
            if (k + 1) % 50 == 0:
                print(f"  {k + 1}/{len(tasks)} schemas, {time.time() - t_start:.0f} s", file=sys.stderr)
        for w in workers:
            w.close()
    summaries = []
    for name, w, res in zip(engines, workers, results):
        s = summarize(name, res, [t[1] for t in tasks], [t[0] for t in tasks])
        s["ready_rss_mib"], s["workers"] = w.ready_rss_mib, w.starts
        s["failures"] = [(t[0], "timeout" if r.get("timeout") else "crash" if r.get("crash")
                          else f"mask error: {r['mask_error']}" if r.get("mask_error")
                          else f"compile error: {r['compile_error']}" if r.get("compile_error") else None)
                         for t, r in zip(tasks, res)]
        summaries.append(s)
        print(f"{name}: passing {s['passing']}/{s['schemas']}, invalid accepted {s['invalid_accepted']}, "
              f"valid rejected {s['valid_rejected']}", file=sys.stderr)
    body = report(summaries, args, len(tasks), time.time() - t_start)
    body += "\n" + package_versions(["grammask", "llguidance", "xgrammar"]) + "\n"
    body += f"\nCommand: `{command_line()}`\n"
    if not ids:   # --ids runs draw no plot
        body += f"\nPlot: `benchmarks/{Path(args.plot).name}`\n"
    print(body)
    if not args.no_write:
        if not ids:
            plot(summaries, Path(args.plot))
        update_results_section(RESULTS_MD, section, body)


if __name__ == "__main__":
    main()
