"""Matchers of one compiled grammar filled in parallel threads while its lexer grows.

The lexer of a fresh grammar is built lazily by whichever thread meets a missing state, while
other threads' kernels read its arrays without a lock. Every mask computed that way must equal the
mask of a sequential run on a separately compiled copy of the grammar (and nothing may crash).
"""
from __future__ import annotations

import random
import threading

import numpy as np
import pytest

from grammask import GrammarCompiler, GrammarMatcher, TokenizerInfo
from grammask.grammar.bitmask import fill_next_token_bitmasks, unpack_bitmask

from small_tokenizers import bytelevel_tokenizer


@pytest.fixture(scope="module")
def info():
    return TokenizerInfo.from_huggingface(bytelevel_tokenizer())


def _walks(info, compile_fn, n_walks, steps, seed):
    """Token sequences of random walks, with their sequential masks (the reference)."""
    cg = compile_fn(GrammarCompiler(info, cache_size=0))
    rng = random.Random(seed)
    out = []
    for _ in range(n_walks):
        m = GrammarMatcher(cg)
        toks, masks = [], []
        for _ in range(steps):
            allowed = np.nonzero(unpack_bitmask(m.get_next_token_bitmask(), info.vocab_size))[0].tolist()
            masks.append(set(allowed))
            allowed = [t for t in allowed if t not in info.stop_token_ids]
            if not allowed:
                break
            t = rng.choice(allowed)
            assert m.accept_token(t)
            toks.append(t)
        out.append((toks, masks))
    return out


@pytest.mark.parametrize("kind", ["json", "schema", "ebnf"])
def test_parallel_fill_on_a_fresh_grammar_matches_sequential(info, kind):
    compile_fn = {
        "json": lambda c: c.compile_builtin_json_grammar(),
        "schema": lambda c: c.compile_json_schema({
            "type": "object",
            "properties": {"name": {"type": "string", "maxLength": 12},
                           "tags": {"type": "array", "items": {"enum": ["a", "ab", "café"]}},
                           "n": {"type": "integer", "minimum": -5, "maximum": 250}},
            "required": ["name"]}),
        "ebnf": lambda c: c.compile_grammar(
            'root ::= "[" item ("," item)* "]"\nitem ::= [a-z]+ | "(" root ")" | [0-9]{1,3}'),
    }[kind]
    walks = _walks(info, compile_fn, n_walks=6, steps=25, seed=7)
    for rep in range(3):
        cg = compile_fn(GrammarCompiler(info, cache_size=0))  # fresh: its lexer is empty
        matchers = [GrammarMatcher(cg) for _ in walks]
        bm = np.zeros((len(walks), (info.vocab_size + 31) // 32), np.int32)
        for step in range(max(len(m) for _, m in walks)):
            live = [i for i, (_, masks) in enumerate(walks) if step < len(masks)]
            fill_next_token_bitmasks([matchers[i] for i in live], bm, indices=live, parallel=True)
            for i in live:
                got = set(np.nonzero(unpack_bitmask(bm[i], info.vocab_size))[0].tolist())
                assert got == walks[i][1][step], f"walk {i} step {step} (repeat {rep}): {sorted(got ^ walks[i][1][step])[:10]}"
                if step < len(walks[i][0]):
                    assert matchers[i].accept_token(walks[i][0][step])


def test_threads_accept_and_fill_concurrently(info):
    """Free-running threads, each with its own matcher of one fresh grammar."""
    cg = GrammarCompiler(info, cache_size=0).compile_builtin_json_grammar()
    ref = _walks(info, lambda c: c.compile_builtin_json_grammar(), n_walks=4, steps=30, seed=11)
    errors = []

    def run(i):
        try:
            m = GrammarMatcher(cg)
            toks, masks = ref[i]
            for step, want in enumerate(masks):
                got = set(np.nonzero(unpack_bitmask(m.get_next_token_bitmask(), info.vocab_size))[0].tolist())
                if got != want:
                    errors.append((i, step))
                    return
                if step < len(toks):
                    m.accept_token(toks[step])
        except Exception as e:  # noqa: BLE001
            errors.append((i, repr(e)))

    threads = [threading.Thread(target=run, args=(i % len(ref),)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
