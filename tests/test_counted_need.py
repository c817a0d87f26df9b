"""The least count of a counted intersection's pair (``ExprSet._counted_need``) and the compiled
table that decides ``x & p r{0,h}`` for every ``h`` from it (``nodestore.counted_lookup``)."""
import random
import re
from itertools import product

import pytest
import regex

from grammask.grammar import nodestore as ns
from grammask.grammar.regex import parse_regex
from grammask.grammar.regexset import EPS, ExprSet


@pytest.fixture(autouse=True)
def _searches(monkeypatch):
    """Small counted intersections go to the compiled walk by default
    (``ExprSet.counted_walk_max``): here, to the searches over pairs under test."""
    monkeypatch.setattr(ExprSet, "counted_walk_max", -1)


class _Unrolled(ExprSet):
    """The plain exploration of derivatives (the counter unrolled in the states): the reference."""

    def _alive_counted(self, e):
        return None


def _derivatives(ex, e, ref, e_ref):
    """``(w, d, d_ref)``: the derivatives of ``e`` (in ``ex``) and ``e_ref`` (in ``ref``) by every
    word ``w`` of up to 3 bytes over ``abcdx`` (a string's states: partial factors, counts left)."""
    for w in (bytes(t) for n in range(4) for t in product(b"abcdx", repeat=n)):
        d, d_ref = e, e_ref
        for b in w:
            d, d_ref = ex.deriv(d, b), ref.deriv(d_ref, b)
        yield w, d, d_ref


def _least_factors(x: str, p: str, r: str, max_len: int) -> int | None:
    """The fewest factors of ``r`` in a split ``u f1 … fk`` (``u`` in ``p``) of a word of ``x``
    of at most ``max_len`` bytes, -1 if none (brute force, :func:`_factor_counts`; None: too many
    words)."""
    counts = _factor_counts(x, p, r, max_len)
    return None if counts is None else min(counts, default=-1)


def _rand_re(rng, d=0, star=True):
    c = rng.random()
    if d > 2 or c < 0.3:
        return rng.choice(["a", "b", "c", "[ab]", "[bc]", "ab", "ba"])
    if c < 0.55:
        return _rand_re(rng, d + 1, star) + _rand_re(rng, d + 1, star)
    if c < 0.75:
        return "(" + _rand_re(rng, d + 1, star) + "|" + _rand_re(rng, d + 1, star) + ")"
    if c < 0.9:
        return "(" + _rand_re(rng, d + 1, star) + ")" + rng.choice(["*", "+", "?", "{2}"] if star else ["?", "{2}"])
    return _rand_re(rng, d + 1, star)


def _random_pairs(seed: int, n: int = 160):
    """``(short, x, p, r, ExprSet, start pair, r's id)`` for random ``x``, ``p``, ``r``; ``short``:
    every word of ``x`` has at most 16 bytes (no loop: a two-byte leaf under three doublings)."""
    rng = random.Random(seed)
    for i in range(n):
        star = i % 2 == 0
        x = _rand_re(rng, star=star)
        if i % 4 == 0:
            x = "(" + x + ")+"
        r = rng.choice(["a", "[ab]", "a|ab", "ab|b", "a*b", "[abc]", "c", "b?|[ac]", _rand_re(rng, star=False)])
        p = rng.choice(["", "", "b", "a?"])
        ex = ExprSet()
        start = parse_regex(x, ex) << 32 | (parse_regex(p, ex) if p else EPS)
        yield bool(not star and i % 4), x, p, r, ex, start, parse_regex(r, ex)


def test_least_count_of_pairs_matches_brute_force():
    """``_counted_need`` against every split of every short word: exact (equal to the least
    over words of up to 16 bytes, for expressions whose words are all that short; never more
    than it otherwise), and -1 exactly where there is no word."""
    kinds = {"exact": 0, "loop": 0, "none": 0}
    for short, x, p, r, ex, start, r_id in _random_pairs(7):
        got = ex._counted_need(start, r_id)
        brute = _least_factors(x, p, r, 16)
        if brute is None:
            continue
        assert got is not None
        if brute == -1 and short:
            assert got == -1, (x, p, r)
            kinds["none"] += 1
        elif brute >= 0:
            assert 0 <= got <= brute, (x, p, r, got, brute)
            if short:
                assert got == brute, (x, p, r, got, brute)   # every word of x is short
                kinds["exact"] += 1
            else:
                kinds["loop"] += got == brute
    assert min(kinds.values()) >= 5, kinds


def test_compiled_table_decides_every_count_as_the_unrolled_exploration():
    """Once a pair's least count is known, ``x & p r{0,h}`` and its derivatives (a string's
    states, which differ in the count left) are decided in compiled code for every ``h``,
    by the table (not a walk), exactly as the unrolled exploration decides them."""
    cases = [(x, r) for x in ("a[bc]*d", "(ab|c)*d", "a(bc)*dd", "(a|bc){2,5}", "[ab]*b", "a*(bca)*c")
             for r in ("[a-d]", "x[ab]|[a-d]", "a|ab", "b?|[acd]")]
    decided = 0
    for x, r in cases:
        ex, ref = ExprSet(), _Unrolled()
        # the least count of the pair first (what the Python check stores on first use)
        ex._counted_need(parse_regex(x, ex) << 32 | EPS, parse_regex(r, ex))
        for h in range(2, 9):
            e = ex.intersect(parse_regex(x, ex), ex.repeat(parse_regex(r, ex), 0, h))
            e_ref = ref.intersect(parse_regex(x, ref), ref.repeat(parse_regex(r, ref), 0, h))
            for w, d, d_ref in _derivatives(ex, e, ref, e_ref):
                want = ref.alive(d_ref)
                if h == 2:
                    # Python's check (which stores the least counts of the pairs it meets)
                    assert ex.alive(d) == want, (x, r, h, w)
                    continue
                q = ns.counted_lookup(ex._S, d)
                if q >= 0:
                    decided += 1
                    assert bool(q) == want, (x, r, h, w)
                # the compiled emptiness walk, with the table
                got = ex._call(lambda S, e: ns.py_alive(S, e, 4), d)
                if got:
                    assert (got == 2) == want, (x, r, h, w)
    assert decided > 500


def _factor_counts(x: str, p: str, r: str, max_len: int) -> set[int] | None:
    """Every number of factors of ``r`` in a split ``u f1 … fk`` (``u`` in ``p``) of a word of
    ``x`` of at most ``max_len`` bytes (brute force; None: too many words)."""
    words, todo, seen = [], [""], 0
    xc = regex.compile(x)
    try:   # (a nested star backtracks for seconds on some words: such an x is left out)
        while todo:
            w = todo.pop()
            seen += 1
            if seen > 3000:
                return None
            if xc.fullmatch(w, timeout=0.05):
                words.append(w)
            if len(w) < max_len:
                todo.extend(w + c for c in "abc" if xc.fullmatch(w + c, partial=True, timeout=0.05))
    except TimeoutError:
        return None
    out: set[int] = set()
    rc, pc = re.compile(r), re.compile(p)
    is_r: dict[str, bool] = {}   # (substrings repeat across words: the backtracking matcher is slow)
    for w in words:
        counts: list[set[int]] = [set() for _ in range(len(w) + 1)]   # splits of w[i:] into factors
        counts[len(w)] = {0}
        for i in range(len(w) - 1, -1, -1):
            for j in range(i + 1, len(w) + 1):
                if counts[j]:
                    f = w[i:j]
                    m = is_r.get(f)
                    if m is None:
                        m = is_r[f] = rc.fullmatch(f) is not None
                    if m:
                        counts[i] |= {c + 1 for c in counts[j]}
        for i in range(len(w) + 1):
            if pc.fullmatch(w[:i]):
                out |= counts[i]
    return out


def test_counts_of_pairs_match_brute_force():
    """``_counted_bits`` against every split of every short word: the same set of counts where
    every word of ``x`` is short, a superset otherwise (longer words add counts)."""
    checked = {"exact": 0, "loop": 0}
    for short, x, p, r, ex, start, r_id in _random_pairs(13):
        bits = ex._counted_bits(start, r_id)
        brute = _factor_counts(x, p, r, 16)
        if brute is None:
            continue
        assert bits is not None and bits >= 0
        got = {k for k in range(62) if bits >> k & 1}
        if short:
            assert got == brute and not bits & ns.BITS_OVER, (x, p, r, got, brute)
            checked["exact"] += 1
        else:
            assert brute <= got | {k for k in brute if k > 61}, (x, p, r, got, brute)
            checked["loop"] += 1
    assert min(checked.values()) >= 10, checked


def test_compiled_table_decides_minimums_as_the_unrolled_exploration():
    """``x & p r{lo,hi}`` with a minimum (an exact length: ``lo == hi``; a range) and its
    derivatives, decided by the counts in the table for every ``lo``/``hi``, exactly as the
    unrolled exploration decides them."""
    cases = [(x, r) for x in ("a[bc]*d", "(ab|c)*d", "a(bc)*dd", "(a|bc){2,5}", "[ab]*b", "[a-d]*[bd]{3}[a-d]*")
             for r in ("[a-d]", "x[ab]|[a-d]", "a|ab")]
    decided = 0
    for x, r in cases:
        ex, ref = ExprSet(), _Unrolled()
        ex._counted_bits(parse_regex(x, ex) << 32 | EPS, parse_regex(r, ex))
        for lo, hi in ((2, 2), (3, 3), (5, 5), (2, 4), (4, 7), (1, 9)):
            e = ex.intersect(parse_regex(x, ex), ex.repeat(parse_regex(r, ex), lo, hi))
            e_ref = ref.intersect(parse_regex(x, ref), ref.repeat(parse_regex(r, ref), lo, hi))
            for w, d, d_ref in _derivatives(ex, e, ref, e_ref):
                want = ref.alive(d_ref)
                q = ns.counted_lookup(ex._S, d)
                if q >= 0:
                    decided += 1
                    assert bool(q) == want, (x, r, lo, hi, w)
                got = ex._call(lambda S, e: ns.py_alive(S, e, 4), d)
                if got:
                    assert (got == 2) == want, (x, r, lo, hi, w)
                assert ex.alive(d) == want, (x, r, lo, hi, w)
    assert decided > 1000


def test_refused_counts_fall_back_to_the_searches(monkeypatch):
    """Past their pair limits the least count and the counts are refused (every pair met
    remembered as refused: the next states skip them), and the searches decide, exactly as the
    unrolled exploration does."""
    import grammask.grammar.regexset as rs

    monkeypatch.setattr(rs, "COUNTS_PAIRS", 3)
    monkeypatch.setattr(rs, "NEED_EXACT_PAIRS", 3)
    refused = 0
    for x, r in [("a(bc)*dd", "[a-d]"), ("[a-d]*[bd]{3}[a-d]*", "x[ab]|[a-d]"), ("(ab|c)*d", "a|ab")]:
        for lo, hi in ((0, 5), (3, 3), (4, 4)):
            ex, ref = ExprSet(), _Unrolled()
            e = ex.intersect(parse_regex(x, ex), ex.repeat(parse_regex(r, ex), lo, hi))
            e_ref = ref.intersect(parse_regex(x, ref), ref.repeat(parse_regex(r, ref), lo, hi))
            for w, d, d_ref in _derivatives(ex, e, ref, e_ref):
                assert ex.alive(d) == ref.alive(d_ref), (x, r, lo, hi, w)
            refused += sum(1 for v in list(ex._need_exact.values()) + list(ex._count_bits.values())
                           if v == rs.NEED_REFUSED)
    assert refused > 0
