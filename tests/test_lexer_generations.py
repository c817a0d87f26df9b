"""Lexer generations (grammar/lexer.py): a compiled grammar's lazy lexer DFA is replaced by a fresh
one past ``max_lexer_states`` states, so the memory it holds stays bounded (issue 17: a grammar
that compiles must never fail while masking; MaskBench's ``maxLength: 5000`` strings needed up to
550,000 states). Matchers move their states to the newest generation at their next call.

The oracle: the same walks with a tiny bound (a new generation every few dozen states) give
exactly the masks of the byte-level reference recognizer, and of the same grammar compiled with
the default bound; rollback, fork and threads across generations included.
"""
from __future__ import annotations

import gc
import random
import threading
import weakref

import numpy as np
import pytest

from grammask import GrammarCompiler, GrammarMatcher, TokenizerInfo
from grammask.grammar import lexer as lexer_mod
from small_tokenizers import bytelevel_tokenizer
from test_bruteforce_masks import GRAMMARS, engine_mask, random_walk

TINY = 16


@pytest.fixture(scope="module")
def info():
    tok = bytelevel_tokenizer()
    return TokenizerInfo.from_huggingface(tok, stop_token_ids=[tok.token_to_id("<|endoftext|>")])


@pytest.fixture(scope="module")
def tiny(info):
    return GrammarCompiler(info, max_lexer_states=TINY)


@pytest.fixture(scope="module")
def normal(info):
    return GrammarCompiler(info)


@pytest.mark.parametrize("kind,name", GRAMMARS, ids=[n for _, n in GRAMMARS])
def test_masks_equal_reference_across_generations(info, tiny, kind, name):
    # the brute-force walks of test_bruteforce_masks, on a compiler whose lexers hold 16 states
    for seed in range(2):
        random_walk(info, tiny, kind, name, seed, max_steps=30)


SCHEMA = {"type": "object", "properties": {"text": {"type": "string", "maxLength": 2000},
                                             "tag": {"type": "string", "pattern": "^[a-z]+( [a-z]+)*$"}},
          "required": ["text", "tag"]}


def _walk(r: random.Random, m: GrammarMatcher, info, steps: int, refs=()):
    """A random walk that prefers staying inside strings (long lexemes); the masks of every
    matcher in ``refs`` (fed the same tokens) must equal ``m``'s at each step. Returns the
    tokens and the masks seen before each."""
    toks, masks = [], []
    for _ in range(steps):
        mask = engine_mask(m, info)
        for ref in refs:
            assert engine_mask(ref, info) == mask
        masks.append(mask)
        allowed = sorted(t for t in mask if t not in info.stop_token_ids)
        if not allowed:
            break
        wordy = [t for t in allowed if info.token_bytes[t].strip(b" ").isalpha()]
        t = r.choice(wordy if wordy and r.random() < 0.85 else allowed)
        assert m.accept_token(t)
        for ref in refs:
            assert ref.accept_token(t)
        toks.append(t)
    return toks, masks


def test_long_string_many_generations_equal_default(info, tiny, normal):
    small = tiny.compile_json_schema(SCHEMA)
    big = normal.compile_json_schema(SCHEMA)
    r = random.Random(7)
    m, ref = GrammarMatcher(small), GrammarMatcher(big)
    assert m.accept_string('{"text": "')
    assert ref.accept_string('{"text": "')
    _walk(r, m, info, 150, refs=[ref])
    assert small.lexer_generations >= 3
    assert big.lexer_generations == 0
    # bounded: one generation holds at most its bound plus what a single call added
    assert small.lexer.n_states < TINY + 400


# words of three letters: the mask depends on the position in the word and on the length left
WORDS = {"type": "string", "maxLength": 120, "pattern": "^([a-z]{3} )*[a-z]{0,3}$"}


def test_rollback_across_generations(info, tiny):
    small = tiny.compile_json_schema(WORDS)
    m = GrammarMatcher(small)
    toks, masks = _walk(random.Random(3), m, info, 60)
    assert len(toks) >= 15 and len({frozenset(x) for x in masks}) > 3
    assert small.lexer_generations >= 3
    # every state in the rollback history was moved into later generations: undo one token at a time
    for k in range(len(toks) - 1, -1, -1):
        m.rollback(1)
        assert engine_mask(m, info) == masks[k], f"after rolling back to step {k}"


def test_rollback_and_fork_across_generations(info, tiny, normal):
    small = tiny.compile_json_schema(SCHEMA)
    r = random.Random(3)
    m = GrammarMatcher(small)
    m.accept_string('{"text": "')
    g0 = small.lexer_generations
    toks, masks = _walk(r, m, info, 60)
    assert small.lexer_generations > g0
    m.rollback(25)
    assert engine_mask(m, info) == masks[len(toks) - 25]
    # a fork continues on its own; both agree with a fresh matcher of the default bound fed alike
    f = m.fork()
    ref = GrammarMatcher(normal.compile_json_schema(SCHEMA))
    ref.accept_string('{"text": "')
    for t in toks[: len(toks) - 25]:
        assert ref.accept_token(t)
    ref2 = ref.fork()
    _walk(random.Random(11), m, info, 40, refs=[ref])
    _walk(random.Random(12), f, info, 40, refs=[ref2])
    # back to the start of the document
    m.rollback(m.num_accepted)
    fresh = GrammarMatcher(normal.compile_json_schema(SCHEMA))
    assert engine_mask(m, info) == engine_mask(fresh, info)


def test_old_generation_is_freed(info):
    comp = GrammarCompiler(info, max_lexer_states=TINY)
    compiled = comp.compile_json_schema(SCHEMA)
    first = weakref.ref(compiled.lexer)
    m = GrammarMatcher(compiled)
    m.accept_string('{"text": "')
    _walk(random.Random(5), m, info, 40)
    assert compiled.lexer_generations >= 2
    gc.collect()
    assert first() is None, "a lexer generation no matcher uses any more is still alive"


def test_old_generation_is_freed_without_the_cycle_collector(info):
    # a replaced generation holds megabytes of tables: it must go with its last user, not wait for
    # a cyclic collection (which a run making few Python objects may not trigger for long); the
    # lexer's slice checker refers back to it only weakly
    comp = GrammarCompiler(info, max_lexer_states=TINY)
    compiled = comp.compile_json_schema(SCHEMA)
    assert compiled.slicer.lexer is compiled.lexer
    first = weakref.ref(compiled.lexer)
    gc.collect()
    gc.disable()
    try:
        m = GrammarMatcher(compiled)
        m.accept_string('{"text": "')
        _walk(random.Random(5), m, info, 40)
        assert compiled.lexer_generations >= 2
        assert first() is None, "a replaced lexer generation waits for the cyclic garbage collector"
    finally:
        gc.enable()


def test_node_bound_also_starts_a_generation(info, monkeypatch):
    # the expressions a generation adds (derivatives) are bounded too, not only its states
    monkeypatch.setattr(lexer_mod, "MAX_GENERATION_NODES", 50)
    comp = GrammarCompiler(info)
    compiled = comp.compile_json_schema(SCHEMA)
    ref = GrammarMatcher(GrammarCompiler(info).compile_json_schema(SCHEMA))
    m = GrammarMatcher(compiled)
    for x in (m, ref):
        x.accept_string('{"text": "')
    _walk(random.Random(9), m, info, 40, refs=[ref])
    assert compiled.lexer_generations >= 1
    assert compiled.lexer.generation == compiled.lexer_generations


def test_threads_share_a_grammar_across_generations(info, normal):
    comp = GrammarCompiler(info, max_lexer_states=TINY)
    small = comp.compile_json_schema(SCHEMA)
    big = normal.compile_json_schema(SCHEMA)
    errors = []

    def run(seed):
        try:
            m, ref = GrammarMatcher(small), GrammarMatcher(big)
            for x in (m, ref):
                x.accept_string('{"text": "')
            _walk(random.Random(seed), m, info, 60, refs=[ref])
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    assert small.lexer_generations >= 3


def test_bitmask_of_a_matcher_idle_through_generations(info):
    # a matcher created before several swaps (its states in generation 0) moves on at its next call
    comp = GrammarCompiler(info, max_lexer_states=TINY)
    compiled = comp.compile_json_schema(SCHEMA)
    idle = GrammarMatcher(compiled)
    idle.accept_string('{"text": "ab')
    idle_gen = idle._lexer.generation
    busy = GrammarMatcher(compiled)
    busy.accept_string('{"text": "')
    _walk(random.Random(1), busy, info, 50)
    assert compiled.lexer_generations >= idle_gen + 2 and idle._lexer.generation == idle_gen
    ref = GrammarMatcher(GrammarCompiler(info).compile_json_schema(SCHEMA))
    ref.accept_string('{"text": "ab')
    a = np.zeros((1, (info.vocab_size + 31) // 32), np.int32)
    b = np.zeros_like(a)
    idle.fill_next_token_bitmask(a)
    ref.fill_next_token_bitmask(b)
    assert (a == b).all()
    assert idle._lexer is compiled.lexer


def test_start_states_of_a_round_equal_one_by_one_registration(info):
    """``Lexer.start_states`` registers every lexeme set a kernel asked for in one compiled call
    (:func:`.lexer.register_starts`). Its states must be those :meth:`Lexer.start_state` gives the
    same sets one by one on a twin lexer, in the same order, registered in the start table (where
    kernels look them up); a set asked for twice, or registered already, is one state; and the
    tables grow as needed (more sets than the start table and the expansion's arrays hold)."""
    from grammask.grammar.earley import new_missing

    schema = {"type": "object", "properties": {f"p{i}": {"type": ["string", "integer", "boolean"][i % 3]}
                                               for i in range(30)}}
    a = GrammarCompiler(info, cache_size=0).compile_json_schema(schema).lexer
    b = GrammarCompiler(info, cache_size=0).compile_json_schema(schema).lexer
    n_lex = len(a.lexemes)
    assert n_lex >= 30
    rng = random.Random(7)
    sets = [tuple(sorted(rng.sample(range(n_lex), rng.randint(1, 12)))) for _ in range(200)]
    sets += [sets[3], sets[10], (0,)]   # asked twice; and one a grammar registers at compile time
    M = new_missing(n_lex)
    M = M._replace(start_lex=np.zeros(sum(map(len, sets)), np.int32), start_off=np.zeros(len(sets) + 1, np.int32))
    pos = 0
    for i, st in enumerate(sets):
        M.start_lex[pos:pos + len(st)] = st
        pos += len(st)
        M.start_off[i + 1] = pos
    M.counts[1] = len(sets)
    M.counts[2] = pos
    keys0 = a.st_keys.shape[0]
    got = a.start_states(M).tolist()
    assert a.st_keys.shape[0] > keys0    # the start table grew
    want = [b.start_state(list(st)) for st in sets]
    assert got == want
    assert len(set(got)) == len(set(sets))
    for st, s in zip(sets, got):
        key = lexer_mod.lexeme_set_hash(np.array(st, np.int32), len(st))
        assert int(lexer_mod.lookup_start(a.st_keys, a.st_vals, key)) == s
        assert a.state_members(s) == b.state_members(s)
        assert a.accepted_lexemes(s) == b.accepted_lexemes(s)
