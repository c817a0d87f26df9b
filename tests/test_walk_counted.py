"""Walk states under counted intersections (``slicer._capped_counted_and``).

A mask may walk from ``Lexer.walk_state(s, n)`` instead of ``s`` only if both read every string of
at most ``n`` bytes alike: the same prefixes alive, the same ones accepted. Under an intersection
``x & p r{0,hi}`` (a ``maxLength`` over a pattern) counters are capped only where that is proven:
the count left is at least what any reachable pair of the intersection needs, and ``x``'s own
counters only when every word of the capped ``x`` is a word of ``p r*``.

Oracle: every string over a small alphabet up to ``n`` bytes, read by exact derivatives and
emptiness checks (``ExprSet.deriv``, ``alive``, ``nullable``) from the original expression and
from its capped form; and on Llama-3, masks from the walk states against masks from the exact
states, with the walk states of a long word-count string shared.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
from _support import llama3_info_and_tokenizer

from grammask import GrammarCompiler, GrammarMatcher
from grammask.grammar.regexset import AND, BYTES, EPS, REPEAT, ExprSet
from grammask.grammar.slicer import capped

ALPHABET = b"a \xc3\xa9\""


def _chars(ex: ExprSet):
    """``S`` (a non-space character: ``a`` or the two bytes of ``é``), ``W`` (a space) and ``r``
    (any one character of the three)."""
    s = ex.alt(ex.literal(b"a"), ex.literal("é"))
    w = ex.literal(b" ")
    return s, w, ex.alt(s, w)


def _words(ex: ExprSet, k: int) -> int:
    """``(S+ W+){0,k} S+``: at most ``k + 1`` words."""
    s, w, _ = _chars(ex)
    return ex.concat(ex.repeat(ex.concat(ex.plus(s), ex.plus(w)), 0, k), ex.plus(s))


def _agree(ex: ExprSet, e: int, c: int, n: int, alphabet: bytes = ALPHABET) -> int:
    """Every string of at most ``n`` bytes over ``alphabet``: alive and nullable alike from
    ``e`` and ``c``. Returns the number of live strings met (both sides dead ends a branch)."""
    live = 0
    todo = [(e, c, b"")]
    while todo:
        x, y, q = todo.pop()
        ax, ay = ex.alive(x), ex.alive(y)
        assert ax == ay, f"alive differs after {q!r}: exact {ax}, capped {ay}"
        if not ax:
            continue
        live += 1
        assert ex.nullable(x) == ex.nullable(y), f"accepts differ after {q!r}"
        if len(q) < n:
            for b in alphabet:
                todo.append((ex.deriv(x, b), ex.deriv(y, b), q + bytes([b])))
    return live


CASES = []
for k in (2, 4, 5, 6, 9, 30):
    for hi in (3, 9, 11, 12, 13, 20, 60):
        CASES.append(("words", k, 0, hi))
CASES += [("words", 6, 4, 40), ("words", 30, 1, 60), ("words", 9, 2, 20),  # a small minimum: the head
          ("letters", 6, 1, 40), ("fixed", 12, 1, 40),
          ("optwords", 30, 1, 60), ("optwords", 6, 1, 40), ("optwords", 9, 0, 20),  # ``^$|words``
          ("words", 30, 1, -1), ("words", 9, 0, -1), ("optwords", 30, 1, -1),   # a minLength alone
          ("letters", 6, 1, -1), ("fixed", 12, 0, -1), ("words", 30, 15, -1),
          ("words", 30, 15, 60),                                            # a large one: no cap
          ("fixed", 12, 0, 40), ("fixed", 12, 0, 24), ("fixed", 3, 0, 30),  # x needs many factors
          ("letters", 6, 0, 40), ("letters", 30, 0, 60)]                  # x not within r*


def _case(ex: ExprSet, kind: str, k: int, lo: int, hi: int) -> int:
    s, w, r = _chars(ex)
    if kind == "words":
        x = _words(ex, k)
    elif kind == "optwords":         # a pattern ``^$|(words)``: the empty string or the words
        x = ex.alt(EPS, _words(ex, k))
    elif kind == "fixed":            # exactly k+1 characters, then anything: need up to k+1
        x = ex.concat(ex.repeat(r, k + 1, k + 1), ex.star(r))
    else:                            # words of a's, but r is one letter: x is not within r*
        x = _words(ex, k)
        r = ex.literal(b"a")
    body = ex.intersect(x, ex.repeat(r, lo, hi))
    return ex.concat(body, ex.literal(b'"'))


@pytest.mark.parametrize("kind,k,lo,hi", CASES)
@pytest.mark.parametrize("n", [4, 7])
def test_capped_counted_and_reads_short_strings_exactly(kind, k, lo, hi, n):
    ex = ExprSet()
    e = _case(ex, kind, k, lo, hi)
    c = capped(ex, e, n, keep_and=True)
    assert _agree(ex, e, c, n) > 0
    # and from states deep in the string (derivatives of e), as the lexer meets them
    for q in (b"a a", b"aa \xc3\xa9 a", b"a " * 5, b"a" * 9):
        d = e
        for b in q:
            d = ex.deriv(d, b)
        if ex.alive(d):
            _agree(ex, d, capped(ex, d, n, keep_and=True), n)


def test_counted_and_is_capped_where_proven():
    """The rule does cap (else the test above would prove nothing): the length counter of a
    word-count string with room left is dropped, and with it the intersection once the capped
    word count is within ``r*`` (no depth of a walk is then a lexer state of its own); a minimum
    left keeps everything; ``x`` outside ``r*`` keeps the intersection, without its count."""
    ex = ExprSet()
    n = 7
    f = n + 1                       # factors 7 bytes can begin (a character is 1 byte at least)

    def counters(e):
        out = []
        todo = [e]
        seen = set()
        while todo:
            x = todo.pop()
            if x in seen:
                continue
            seen.add(x)
            if ex.kind[x] == REPEAT:
                out.append(ex.args[x][1:])
                todo.append(ex.args[x][0])
            elif ex.kind[x] != BYTES:
                todo.extend(ex.args[x])
        return sorted(out)

    e = _case(ex, "words", 30, 0, 60)
    c = capped(ex, e, n, keep_and=True)
    assert c != e and ex.kind[ex.args[c][0]] != AND and not ex.has_bool(c)   # x2 alone
    got = counters(c)
    assert (0, 30) not in got and (0, 60) not in got      # the words capped, the length dropped
    assert all(hi == -1 or hi <= f + 1 for _lo, hi in got)
    # a large minimum left: nothing capped under the intersection
    e = _case(ex, "words", 30, 15, 60)
    assert capped(ex, e, n, keep_and=True) == e
    # a small one (minLength: 1, before the first character) is part of the head: capped alike
    e = _case(ex, "words", 30, 1, 60)
    c = capped(ex, e, n, keep_and=True)
    assert c != e and (0, 60) not in counters(c) and (1, 60) not in counters(c)
    # a minimum and no maximum (``minLength`` alone): the word count capped, the intersection gone
    for kind, lo in (("words", 1), ("words", 0), ("optwords", 1)):
        e = _case(ex, kind, 30, lo, -1)
        c = capped(ex, e, n, keep_and=True)
        assert not ex.has_bool(c) and (0, 30) not in counters(c), (kind, lo)
    # and so is a pattern's empty alternative before a minimum: the words alone lie within r*
    e = _case(ex, "optwords", 30, 1, 60)
    c = capped(ex, e, n, keep_and=True)
    assert not ex.has_bool(c) and (1, 60) not in counters(c) and (0, 30) not in counters(c)
    # x outside r*: the intersection kept, its length counter unbounded
    e = _case(ex, "letters", 30, 0, 60)
    c = capped(ex, e, n, keep_and=True)
    assert ex.kind[ex.args[c][0]] == AND
    got = counters(c)
    assert (0, 30) in got and (0, 60) not in got and (0, -1) in got


ESCAPES = b'a \xc3\xa9"\\n'


@pytest.mark.parametrize("k,hi", [(6, 5), (6, 7), (9, 7), (30, 6)])
@pytest.mark.parametrize("n", [5, 6])
def test_pattern_counters_alone_under_a_length_within_reach(k, hi, n):
    """A length counter within one token's reach stays exact, and the pattern's own counters are
    capped alone (``x2 & p r{0,hi}``): a completion with the fewest characters never needs more
    iterations than a token begins plus one. Checked with JSON escapes among the characters
    (``\\"``, ``\\\\`` non-space, ``\\n`` space: the iterations must be whole characters of the
    string's own reading), on every string over those bytes, from the start and from states
    inside the string."""
    ex = ExprSet()
    s = ex.alt(ex.literal(b"a"), ex.literal("é"), ex.literal(b'\\"'), ex.literal(b"\\\\"))
    w = ex.alt(ex.literal(b" "), ex.literal(b"\\n"))
    r = ex.alt(s, w)
    x = ex.concat(ex.repeat(ex.concat(ex.plus(s), ex.plus(w)), 0, k), ex.plus(s))
    e = ex.concat(ex.intersect(x, ex.repeat(r, 0, hi)), ex.literal(b'"'))
    c = capped(ex, e, n, keep_and=True)
    assert c != e, "the pattern's counter was not capped: the test shows nothing"
    assert _agree(ex, e, c, n, ESCAPES) > 0
    for q in (b"a ", b"a\\n\\\\ ", b'\\"a\\n'):
        d = e
        for b in q:
            d = ex.deriv(d, b)
        if ex.alive(d):
            _agree(ex, d, capped(ex, d, n, keep_and=True), n, ESCAPES)


WORDS = {"type": "object", "properties": {
    "q": {"type": "string", "minLength": 1, "maxLength": 5000, "pattern": "^$|(^(?:\\S+\\s+){0,99}\\S+$)"},
    "a": {"type": "string", "maxLength": 3000, "pattern": "^(?:\\S+\\s+){0,99}\\S+$"}},
    "required": ["q", "a"], "additionalProperties": False}


@pytest.fixture(scope="module")
def llama3():
    return llama3_info_and_tokenizer()


def _mask(m: GrammarMatcher) -> np.ndarray:
    return m.get_next_token_bitmask().copy()


def _walk_and_exact(llama3, monkeypatch, schema, doc):
    """``(walk grammar, its matcher, a matcher of a copy without walk states, doc's ids,
    tokenizer)``."""
    from grammask.grammar.lexer import Lexer

    info, tk = llama3
    walk_g = GrammarCompiler(info, cache_size=0).compile_json_schema(schema)
    exact_g = GrammarCompiler(info, cache_size=0).compile_json_schema(schema)
    real = Lexer.walk_state
    monkeypatch.setattr(Lexer, "walk_state",
                        lambda self, s, n: s if self is exact_g.lexer else real(self, s, n))
    ids = tk.encode(json.dumps(doc), add_special_tokens=False).ids
    return walk_g, GrammarMatcher(walk_g), GrammarMatcher(exact_g), ids, tk


def test_word_count_strings_share_walk_states_llama3(llama3, monkeypatch):
    """The MaskBench shape (o21053): word-count patterns under a large ``maxLength``. Every
    position of both strings walks from one of a handful of walk states (before the counted rule,
    a new one per word, each a thousand new lexer states), and every mask equals the exact one."""
    words = " ".join(f"word{i}" for i in range(30))
    walk_g, a, b, ids, tk = _walk_and_exact(llama3, monkeypatch, WORDS,
                                            {"q": words + " élan", "a": "x" * 200 + " " + words})
    walks, inside = set(), 0
    for step, t in enumerate(ids):
        assert np.array_equal(_mask(a), _mask(b)), f"step {step} before {tk.decode([t])!r}"
        w = walk_g.lexer.walk_state(a._s, a._reach)
        if w != a._s:
            walks.add(w)
            inside += 1
        assert a.accept_token(t) and b.accept_token(t)
    assert np.array_equal(_mask(a), _mask(b)) and a.is_terminated() == b.is_terminated()
    assert inside > 60, "the strings were not walked from capped states"
    assert len(walks) <= 8, f"{len(walks)} walk states for two word-count strings"


SHORT = {"type": "object", "properties": {
    "t": {"type": "string", "maxLength": 60, "pattern": "^(?:\\S+\\s+){0,9}\\S+$"},
    "u": {"type": "string", "minLength": 1, "maxLength": 100, "pattern": "^(?:\\S+\\s+){0,19}\\S+$"}},
    "required": ["t", "u"], "additionalProperties": False}


def test_word_counts_under_a_short_length_llama3(llama3, monkeypatch):
    """The o21142 shape: a word count under a ``maxLength`` that one Llama-3 token could exhaust
    (a token of 128 spaces fits the pattern), so the length counter stays exact and the word
    counter is capped alone. Every mask equals the one walked from the exact state, with JSON
    escapes in the text."""
    doc = {"t": "one two\tthree \"four\" five\\six seven", "u": "a b c d e f g h i j k l m n o p q r"}
    walk_g, a, b, ids, tk = _walk_and_exact(llama3, monkeypatch, SHORT, doc)
    capped_steps = 0
    for step, t in enumerate(ids):
        assert np.array_equal(_mask(a), _mask(b)), f"step {step} before {tk.decode([t])!r}"
        capped_steps += walk_g.lexer.walk_state(a._s, a._reach) != a._s
        assert a.accept_token(t) and b.accept_token(t)
    assert np.array_equal(_mask(a), _mask(b)) and a.is_terminated() == b.is_terminated()
    assert capped_steps > 10, "the word counters were not capped"


def test_walk_states_said_by_the_verdicts_are_the_capped_ones(llama3, monkeypatch):
    """``Lexer.walk_state`` answers most new states from per-expression verdicts kept in the
    ExprSet (a compiled pass over the members, no capping): a second grammar of the same
    compiler takes that path for most of its states, and every answer is the state of the
    capped members (the members capped from scratch here)."""
    import grammask.grammar.lexer as lexer_mod

    info, tk = llama3
    schema = {"type": "object", "properties": {
        "t": {"type": "string", "maxLength": 60, "pattern": "^(?:\\S+\\s+){0,9}\\S+$"},
        "d": {"type": "string", "pattern": "^\\d{1,15}(?:\\.\\d{1,5})?$"},
        "n": {"type": "string", "maxLength": 300}, "k": {"type": "integer", "maximum": 999999}},
        "required": ["t", "d", "n", "k"], "additionalProperties": False}
    doc = {"t": "one two three four", "d": "123456789.25", "n": "x" * 120 + " tail", "k": 4321}
    ids = tk.encode(json.dumps(doc), add_special_tokens=False).ids
    real = lexer_mod._walk_same_call
    said = []
    monkeypatch.setattr(lexer_mod, "_walk_same_call", lambda *a: said.append(real(*a)) or said[-1])
    compiler = GrammarCompiler(info, cache_size=0)
    for run in range(2):
        said.clear()
        g = compiler.compile_json_schema(schema)
        lx, ex = g.lexer, g.lexer.exprs
        m = GrammarMatcher(g)
        own = 0
        for t in ids:
            s = m._s
            n_said = len(said)
            w = lx.walk_state(s, m._reach)
            want = sorted((x, capped(ex, e, m._reach.n, True, m._reach)) for x, e in lx.state_members(s))
            assert sorted(lx.state_members(w)) == want
            if run == 1 and w == s and len(said) > n_said:
                # the first grammar met the same expressions: the verdicts say it
                assert said[-1], f"state {s} is its own walk state, capped again"
                own += 1
            assert m.accept_token(t)
    assert own >= 10 and sum(said) == own, said


def test_verdicts_derived_from_parts_in_a_first_grammar_llama3(llama3, monkeypatch):
    """New derivatives of counted patterns (``[a-z]{2,5}``, ``[0-9]{1,4}`` after a few bytes) are
    new expressions, with no verdict yet; the compiled pass derives theirs from their parts (a
    repetition left as it is when its count is within what one token can begin) in the first
    grammar, without capping in Python. Every answer is the state of the capped members, and
    the masks are those walked from the exact states."""
    import grammask.grammar.lexer as lexer_mod
    import grammask.grammar.slicer as slicer_mod

    info, tk = llama3
    schema = {"type": "object", "properties": {
        "id": {"type": "string", "pattern": "^[a-z]{2,5}-[0-9]{1,4}(?:\\.[a-z]{1,3}){0,2}$"},
        "code": {"type": "string", "pattern": "^[A-Z]{3}[0-9]{2,6}$"},
        "n": {"type": "string", "maxLength": 40}},
        "required": ["id", "code", "n"], "additionalProperties": False}
    docs = [{"id": "ab-12.x.yz", "code": "ABC12345", "n": "hello there"},
            {"id": "wxyz-9", "code": "QRS77", "n": "x" * 30},
            {"id": "qq-4321.abc", "code": "LMN123456", "n": ""}]
    capping = []
    real_capped = slicer_mod.capped
    monkeypatch.setattr(slicer_mod, "capped", lambda *a, **k: capping.append(1) or real_capped(*a, **k))
    g = GrammarCompiler(info, cache_size=0).compile_json_schema(schema)
    lx, ex = g.lexer, g.lexer.exprs
    derived = 0
    for doc in docs:
        m = GrammarMatcher(g)
        for t in tk.encode(json.dumps(doc), add_special_tokens=False).ids:
            s = m._s
            if s not in lx._twins:
                verdict = ex.__dict__.get("_cap_verdicts", {}).get((m._reach.key, True))
                ctr = ex.counter_flags()
                unknown = verdict is not None and any(
                    ctr[e] and (e >= verdict.shape[0] or verdict[e] != lexer_mod.CAP_SAME)
                    for _, e in lx.state_members(s))
                n_cap = len(capping)
                w = lx.walk_state(s, m._reach)
                derived += unknown and w == s and len(capping) == n_cap
                want = sorted((x, real_capped(ex, e, m._reach.n, True, m._reach)) for x, e in lx.state_members(s))
                assert sorted(lx.state_members(w)) == want
            assert m.accept_token(t)
        assert m.can_terminate()
    assert derived >= 5, derived
