"""The state cache (grammar/state_cache.py): per lexer state, the parser-independent part of the
walk (tokens reached by lexer moves alone, lexeme ends grouped by state and byte), used by
``fill_mask_cached`` instead of the full walk, and nested entries for the subtrees below lexeme
ends (read by both kernels). Masks must be exactly those of the full walk:

- with every state cached from its first visit, random walks on the two trained tokenizers must
  give the brute-force reference masks (the walks of test_bruteforce_masks);
- on Llama-3, JSON Schemas walked with the cache forced give the same masks, step by step, as the
  same grammar compiled apart with the cache off;
- the cache is bounded per lexer generation and counted in the grammar's held bytes.
"""
from __future__ import annotations

import json
import random

import numpy as np
import pytest
import test_bruteforce_masks as bf
from _support import llama3_info_and_tokenizer

from grammask import GrammarCompiler, GrammarMatcher
from grammask.grammar import state_cache


@pytest.fixture
def cache_every_state(monkeypatch):
    monkeypatch.setattr(state_cache, "BUILD_AFTER", 1)
    monkeypatch.setattr(state_cache, "NESTED_BUILD_AFTER", 1)


def _used(comp_grammar) -> int:
    return comp_grammar.mask_cache_of(comp_grammar.lexer).n_cached


def _nested(comp_grammar) -> int:
    return comp_grammar.mask_cache_of(comp_grammar.lexer).n_nested


@pytest.mark.parametrize("tok_name", ["bytelevel", "spm_padded"])
@pytest.mark.parametrize("kind,name", [("json", "json_flexible_ws3"), ("json", "json_compact"),
                                       ("ebnf", "arithmetic"), ("ebnf", "adjacent_numbers"),
                                       ("ebnf", "unicode_words"), ("regex", "quoted"),
                                       ("regex", "ambiguous_alt")])
def test_cached_masks_equal_reference(cache_every_state, tok_name, kind, name):
    info = bf.TOKENIZERS[tok_name]()
    comp = GrammarCompiler(info)
    for seed in range(4):
        bf.random_walk(info, comp, kind, name, seed=31 + seed, max_steps=30)
    cg = bf.compile_public(comp, kind, name)   # the compiler's cached grammar the walks used
    assert _used(cg) > 0, "no state was cached: the test did not exercise the cached kernel"


SCHEMAS = [
    {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                      "tags": {"type": "array", "items": {"type": "string"}}},
     "required": ["name"]},
    {"type": "object", "properties": {
        "id": {"type": "string", "pattern": "^[a-z]{2,5}-[0-9]{1,4}$"},
        "kind": {"enum": ["alpha", "beta", "gamma delta"]},
        "score": {"type": "number", "minimum": -5, "maximum": 100},
        "note": {"type": "string", "maxLength": 12},
        "nested": {"type": "object", "properties": {"ok": {"type": "boolean"}, "v": {"type": ["null", "integer"]}},
                   "additionalProperties": False}},
     "additionalProperties": False},
    {"type": "array", "items": {"anyOf": [{"type": "string", "format": "date"}, {"type": "number"}]},
     "maxItems": 6},
]

DOCS = [
    [{"name": "John Smith", "age": 42, "tags": ["a", "bc", "x y z"]}, {"name": "é日本 \"q\"\\n", "extra": [1, {}]}],
    [{"id": "ab-12", "kind": "gamma delta", "score": 99.5, "note": "short", "nested": {"ok": True, "v": None}},
     {"id": "xyz-9", "kind": "alpha", "score": -4.25e0, "nested": {"ok": False, "v": 7}}],
    [["2024-02-29", 1.5, -3, "1999-12-31"], []],
]


@pytest.fixture(scope="module")
def llama3():
    return llama3_info_and_tokenizer()


def _mask(m: GrammarMatcher) -> np.ndarray:
    return m.get_next_token_bitmask().copy()


def _detour(info, r, a, b, ma, p: float) -> None:
    """Now and then (probability ``p``) a random token of mask ``ma`` instead of the document's,
    on both matchers, their next masks compared, then taken back."""
    if r.random() < p:
        allowed = np.flatnonzero(np.unpackbits(ma.view(np.uint8), bitorder="little")[: info.vocab_size])
        allowed = [x for x in allowed.tolist() if x not in info.stop_token_ids]
        if allowed:
            x = r.choice(allowed)
            assert a.accept_token(x) and b.accept_token(x)
            assert np.array_equal(_mask(a), _mask(b))
            a.rollback(1)
            b.rollback(1)


@pytest.mark.parametrize("k", range(len(SCHEMAS)))
def test_cached_equals_full_walk_llama3(llama3, cache_every_state, k):
    info, tk = llama3
    cached = GrammarCompiler(info, cache_size=0).compile_json_schema(SCHEMAS[k])
    plain = GrammarCompiler(info, cache_size=0).compile_json_schema(SCHEMAS[k])
    plain.mask_cache_of(plain.lexer).max_bytes = 0       # never cached: the full walk every time
    r = random.Random(k)
    n = 0
    for doc in DOCS[k]:
        for text in (json.dumps(doc), json.dumps(doc, indent=2)):
            a, b = GrammarMatcher(cached), GrammarMatcher(plain)
            ids = tk.encode(text, add_special_tokens=False).ids
            for step, t in enumerate(ids):
                ma, mb = _mask(a), _mask(b)
                assert np.array_equal(ma, mb), f"schema {k} step {step} before {tk.decode([t])!r} of {text!r}"
                n += 1
                _detour(info, r, a, b, ma, 0.2)
                assert a.accept_token(t) and b.accept_token(t), (k, step)
            assert np.array_equal(_mask(a), _mask(b))
    assert n > 50
    assert _used(cached) > 0 and _nested(cached) > 0 and _used(plain) == 0


def test_cache_is_bounded_and_counted(llama3, cache_every_state):
    info, tk = llama3
    cg = GrammarCompiler(info, cache_size=0).compile_json_schema(SCHEMAS[0])
    mc = cg.mask_cache_of(cg.lexer)
    before = cg.held_bytes()
    m = GrammarMatcher(cg)
    for t in tk.encode(json.dumps(DOCS[0][0]), add_special_tokens=False).ids:
        m.get_next_token_bitmask()
        assert m.accept_token(t)
    assert mc.n_cached > 1 and mc.nbytes > 0
    assert cg.held_bytes() >= before + mc.nbytes
    # a bound already reached: no further state is cached
    cg2 = GrammarCompiler(info, cache_size=0).compile_json_schema(SCHEMAS[0])
    mc2 = cg2.mask_cache_of(cg2.lexer)
    mc2.max_bytes = 1
    m = GrammarMatcher(cg2)
    for t in tk.encode(json.dumps(DOCS[0][0]), add_special_tokens=False).ids:
        m.get_next_token_bitmask()
        assert m.accept_token(t)
    assert mc2.n_cached == 1    # the first one crosses the bound, then none


def test_request_counts_grow_and_are_dropped_past_their_bound(llama3, monkeypatch):
    """The compiled count of subtree requests (``take_requests``): from a table of 4 slots it
    grows, past a bound of 8 keys it is emptied; subtrees asked for twice are still built, and
    every mask equals that of an uncached copy."""
    info, tk = llama3
    monkeypatch.setattr(state_cache, "MAX_ASKED", 8)
    cg = GrammarCompiler(info, cache_size=0).compile_json_schema(SCHEMAS[1])
    plain = GrammarCompiler(info, cache_size=0).compile_json_schema(SCHEMAS[1])
    plain.mask_cache_of(plain.lexer).max_bytes = 0
    mc = cg.mask_cache_of(cg.lexer)
    mc._ask_keys = np.full(4, -1, np.int64)
    mc._ask_vals = np.zeros(4, np.int32)
    sizes, emptied = set(), []
    real = mc._more_counts

    def more():
        emptied.append(int(mc._ask_n[0]) >= state_cache.MAX_ASKED)
        real()
        sizes.add(mc._ask_keys.shape[0])

    mc._more_counts = more
    for doc in DOCS[1] * 2:
        for text in (json.dumps(doc), json.dumps(doc, indent=2)):
            a, b = GrammarMatcher(cg), GrammarMatcher(plain)
            for step, t in enumerate(tk.encode(text, add_special_tokens=False).ids):
                assert np.array_equal(_mask(a), _mask(b)), (text, step)
                assert a.accept_token(t) and b.accept_token(t)
    assert any(emptied) and not all(emptied), emptied
    assert max(sizes) >= 16 and int(mc._ask_n[0]) <= 2 * state_cache.MAX_ASKED
    assert _nested(cg) > 0


def test_threads_share_the_cache_llama3(llama3, cache_every_state):
    """Free-running threads with their own matchers of one fresh grammar: states and nested
    entries are built (and the nested store grown and republished) while other threads' kernels
    read it; every mask must equal the sequential mask of an uncached copy."""
    import threading

    info, tk = llama3
    plain = GrammarCompiler(info, cache_size=0).compile_json_schema(SCHEMAS[0])
    plain.mask_cache_of(plain.lexer).max_bytes = 0
    texts = [json.dumps(d, indent=k) for d in DOCS[0] for k in (None, 1, 2)]
    ref = []
    for text in texts:
        ids = tk.encode(text, add_special_tokens=False).ids
        m = GrammarMatcher(plain)
        masks = []
        for t in ids:
            masks.append(_mask(m))
            assert m.accept_token(t)
        ref.append((ids, masks))
    cg = GrammarCompiler(info, cache_size=0).compile_json_schema(SCHEMAS[0])
    errors = []

    def run(k):
        try:
            ids, masks = ref[k % len(ref)]
            for _ in range(2):
                m = GrammarMatcher(cg)
                for step, (t, want) in enumerate(zip(ids, masks)):
                    if not np.array_equal(_mask(m), want):
                        errors.append((k, step))
                        return
                    assert m.accept_token(t)
        except Exception as e:  # noqa: BLE001
            errors.append((k, repr(e)))

    threads = [threading.Thread(target=run, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert _used(cg) > 0 and _nested(cg) > 0


@pytest.mark.parametrize("k", range(len(SCHEMAS)))
def test_rows_kept_across_calls_match_a_fresh_matcher(llama3, k):
    """Parser rows built above the height by one call are reused by the next ones
    (``earley.row_top``): through masks, refused tokens, rollbacks and forks, every mask must
    equal that of a fresh matcher fed the same accepted tokens."""
    info, tk = llama3
    cg = GrammarCompiler(info, cache_size=0).compile_json_schema(SCHEMAS[k])
    r = random.Random(100 + k)
    for doc in DOCS[k]:
        ids = tk.encode(json.dumps(doc), add_special_tokens=False).ids
        m = GrammarMatcher(cg)
        pos = 0
        for _ in range(3 * len(ids)):
            if pos == len(ids):
                break
            op = r.random()
            if op < 0.3:
                x = r.randrange(info.vocab_size)   # mostly refused: a byte step that fails
                if m.accept_token(x):
                    m.rollback(1)
            elif op < 0.45 and pos:
                back = r.randint(1, min(3, pos))
                m.rollback(back)
                pos -= back
            elif op < 0.55:
                m = m.fork()
            fresh = GrammarMatcher(cg)
            for x in ids[:pos]:
                assert fresh.accept_token(x)
            assert np.array_equal(_mask(m), _mask(fresh)), (k, pos)
            assert m.accept_token(ids[pos])
            pos += 1


LONG = {"type": "object", "properties": {
    "a": {"type": "string", "maxLength": 300},
    "b": {"type": "string", "minLength": 150, "maxLength": 400},
    "c": {"type": "string", "pattern": "^(?:\\S+\\s+){0,99}\\S+$", "maxLength": 2000},
    "d": {"type": "array", "items": {"type": "integer"}, "maxItems": 400}},
    "required": ["a", "b", "c", "d"], "additionalProperties": False}


def test_walk_states_of_long_counters_give_the_exact_masks(llama3, monkeypatch):
    """Masks walk from ``Lexer.walk_state`` (far counters capped at the longest token): the
    positions of a long string share a walk state, and every mask must equal the mask walked
    from the exact state (a copy of the grammar with walk states turned off)."""
    from grammask.grammar.lexer import Lexer

    info, tk = llama3
    capped_g = GrammarCompiler(info, cache_size=0).compile_json_schema(LONG)
    exact_g = GrammarCompiler(info, cache_size=0).compile_json_schema(LONG)
    real = Lexer.walk_state

    def walk_state(self, s, n):
        return s if self is exact_g.lexer else real(self, s, n)

    monkeypatch.setattr(Lexer, "walk_state", walk_state)
    words = " ".join(f"w{i}" for i in range(40))
    doc = {"a": "x" * 120 + "é" * 20, "b": "y" * 160 + " z" * 10, "c": words + "  tail", "d": list(range(60))}
    ids = tk.encode(json.dumps(doc), add_special_tokens=False).ids
    a, b = GrammarMatcher(capped_g), GrammarMatcher(exact_g)
    shared = set()
    for step, t in enumerate(ids):
        assert np.array_equal(_mask(a), _mask(b)), f"step {step} before {tk.decode([t])!r}"
        shared.add(capped_g.lexer.walk_state(a._s, a._reach) != a._s)
        assert a.accept_token(t) and b.accept_token(t)
    assert np.array_equal(_mask(a), _mask(b))
    assert True in shared, "no state was capped: the test did not exercise walk states"


def test_nested_entries_are_appended_and_read_back_across_growth():
    """``append_nested`` writes an entry after the used part of the store and its key last, or
    writes nothing when an array is short; ``_grown_store`` then publishes grown copies (the old
    entries kept) and the append goes through. Every entry reads back as written."""
    import numpy as np

    from grammask.grammar.kstruct import kstruct
    from grammask.grammar.mask import NestedStore, _nested_slot
    from grammask.grammar.state_cache import StateMaskCache, append_nested

    S = kstruct(NestedStore(np.full(4, -1, np.int64), np.zeros(4, np.int32), np.zeros(3, np.int64),
                            np.zeros(2, np.int32), np.zeros(3, np.int64), np.zeros(2, np.int32),
                            np.zeros(2, np.int32), np.zeros(3, np.int64), np.zeros(2, np.int32)))
    n = np.zeros(4, np.int64)
    rng = np.random.default_rng(0)
    written = []
    for k in range(40):
        nt, ng = int(rng.integers(0, 5)), int(rng.integers(0, 4))
        toks = rng.integers(0, 1000, nt).astype(np.int32)
        gs = rng.integers(0, 50, ng).astype(np.int32)
        gb = rng.integers(0, 256, ng).astype(np.int32)
        sizes = rng.integers(0, 3, ng)
        go = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        nodes = rng.integers(0, 10_000, int(go[-1])).astype(np.int32)
        t, i = 7 + k, 1000 + 3 * k
        before = n.copy()
        if not append_nested(S, n, t, i, toks, gs, gb, go, nodes):
            assert (n == before).all() and S.keys[_nested_slot(S.keys, t, i)] == -1   # nothing written
            S = StateMaskCache._grown_store(S, n, nt, ng, int(go[-1]))
            assert append_nested(S, n, t, i, toks, gs, gb, go, nodes)
        written.append((t, i, toks, gs, gb, go, nodes))
    assert n[0] == 40
    for e, (t, i, toks, gs, gb, go, nodes) in enumerate(written):
        slot = _nested_slot(S.keys, t, i)
        assert S.keys[slot] == (t << 32 | i) and S.vals[slot] == e
        assert (S.toks[S.e_tok_off[e]:S.e_tok_off[e + 1]] == toks).all()
        g0, g1 = S.e_grp_off[e], S.e_grp_off[e + 1]
        assert (S.grp_acc[g0:g1] == gs).all() and (S.grp_byte[g0:g1] == gb).all()
        for j in range(g1 - g0):
            got = S.nodes[S.grp_node_off[g0 + j]:S.grp_node_off[g0 + j + 1]]
            assert (got == nodes[go[j]:go[j + 1]]).all()


# two schemas over the same lexemes, met in other orders (and the second with more before them),
# so that a lexeme has another id in each: the second adopts the first's entries (one ExprSet: one
# compiler), mapping each group's accepting members to its own lexemes. A date is also a string
# of at most 12 characters: where one ends, both members accept.
SHARED_SCHEMAS = [
    {"type": "array", "items": {"anyOf": [{"type": "string", "format": "date"}, {"type": "string", "maxLength": 12},
                                          {"type": "integer"}]}},
    {"type": "object", "properties": {"x": {"type": "integer"}, "d": {"type": "array", "items": {"anyOf": [
        {"type": "integer"}, {"type": "string", "maxLength": 12}, {"type": "string", "format": "date"}]}}}},
]
SHARED_TEXTS = [[json.dumps(["2024-01-05", "ab", 3, "1999-12-31"]), json.dumps(["x y", 12, "2000-02-29"], indent=1)],
                [json.dumps({"x": 1, "d": ["2024-01-05", 7, "q"]}), json.dumps({"d": ["1999-12-31", "é"]})]]


def _walk_pair(info, tk, a_cg, b_cg, texts, seed):
    r = random.Random(seed)
    for text in texts:
        a, b = GrammarMatcher(a_cg), GrammarMatcher(b_cg)
        for t in tk.encode(text, add_special_tokens=False).ids:
            ma, mb = _mask(a), _mask(b)
            assert np.array_equal(ma, mb), f"before {tk.decode([t])!r} of {text!r}"
            _detour(info, r, a, b, ma, 0.3)
            assert a.accept_token(t) and b.accept_token(t)
        assert np.array_equal(_mask(a), _mask(b)) and a.can_terminate() and b.can_terminate()


def test_entries_shared_across_grammars_map_their_lexemes(llama3, cache_every_state):
    info, tk = llama3
    comp = GrammarCompiler(info, cache_size=0)   # every grammar of it shares one ExprSet
    first = comp.compile_json_schema(SHARED_SCHEMAS[0])
    plain0 = GrammarCompiler(info, cache_size=0).compile_json_schema(SHARED_SCHEMAS[0])
    plain0.mask_cache_of(plain0.lexer).max_bytes = 0
    _walk_pair(info, tk, first, plain0, SHARED_TEXTS[0], 0)
    mc0 = first.mask_cache_of(first.lexer)
    assert mc0.n_cached > 0
    shared = mc0.shared.entries
    assert shared and any(len(p) > 1 for _, pats in shared.values() for p in pats), \
        "no shared entry has a group where two members accept: the mapping is not exercised"
    second = comp.compile_json_schema(SHARED_SCHEMAS[1])
    assert second.lexer.exprs is first.lexer.exprs
    plain1 = GrammarCompiler(info, cache_size=0).compile_json_schema(SHARED_SCHEMAS[1])
    plain1.mask_cache_of(plain1.lexer).max_bytes = 0
    _walk_pair(info, tk, second, plain1, SHARED_TEXTS[1], 1)
    assert second.mask_cache_of(second.lexer).n_adopted > 0
    assert plain1.mask_cache_of(plain1.lexer).n_cached == 0


def test_shared_entries_are_untracked_by_the_collector(llama3, cache_every_state):
    """The shared entries live as long as the ExprSet: packed, a full collection stops walking
    them (as records each was four tracked objects)."""
    import gc

    info, tk = llama3
    comp = GrammarCompiler(info, cache_size=0)
    cg = comp.compile_json_schema(SHARED_SCHEMAS[0])
    plain = GrammarCompiler(info, cache_size=0).compile_json_schema(SHARED_SCHEMAS[0])
    plain.mask_cache_of(plain.lexer).max_bytes = 0
    _walk_pair(info, tk, cg, plain, SHARED_TEXTS[0], 3)
    shared = cg.mask_cache_of(cg.lexer).shared.entries
    assert shared
    for _ in range(3):
        gc.collect()
    assert not any(gc.is_tracked(v) for v in shared.values())


def test_shared_entries_are_bounded(llama3, cache_every_state, monkeypatch):
    info, tk = llama3
    monkeypatch.setattr(state_cache, "MAX_SHARED_BYTES", 0)
    comp = GrammarCompiler(info, cache_size=0)
    cg = comp.compile_json_schema(SHARED_SCHEMAS[0])
    plain = GrammarCompiler(info, cache_size=0).compile_json_schema(SHARED_SCHEMAS[0])
    _walk_pair(info, tk, cg, plain, SHARED_TEXTS[0][:1], 2)
    mc = cg.mask_cache_of(cg.lexer)
    assert mc.n_cached > 0 and not mc.shared.entries and mc.shared.nbytes == 0
