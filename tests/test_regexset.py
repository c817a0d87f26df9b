"""ExprSet shortcuts checked against brute force: structural emptiness and slice containment."""
from itertools import product

import pytest

from grammask.grammar.regex import parse_regex
from grammask.grammar.regexset import ExprSet

ALPHABET = b'abc"'


def strings(max_len: int):
    for n in range(max_len + 1):
        for t in product(ALPHABET, repeat=n):
            yield bytes(t)


def brute_prefixes_contain(ex: ExprSet, s: int, u: int, max_len: int = 6) -> bool:
    """Every string of ``s`` up to ``max_len`` bytes is a prefix of a string of ``u``."""
    return all(ex.is_prefix(u, w) for w in strings(max_len) if ex.matches(s, w))


def lit(ex, t):
    return ex.literal(t)


CASES = [
    # (slice, member builder): counted bodies, stars with tails, key exclusions
    *[("[ab]{1,4}", lambda ex, k=k: ex.concat(ex.repeat(parse_regex("[abc]", ex), 0, k), lit(ex, '"')))
      for k in range(7)],
    ("[ab]{1,4}", lambda ex: ex.concat(ex.repeat(parse_regex("[a]", ex), 0, 9), lit(ex, '"'))),
    ("[ab]*c?", lambda ex: ex.concat(ex.star(parse_regex("[abc]", ex)), lit(ex, '"'))),
    ("[ab]*c?", lambda ex: ex.concat(ex.star(parse_regex("[ab]", ex)), lit(ex, '"'))),
    ("[ab]*", lambda ex: ex.alt(lit(ex, "ab"), lit(ex, "abab"), lit(ex, 'b"'))),
    ("[ab]{1,3}", lambda ex: ex.concat(ex.intersect(ex.star(parse_regex("[ab]", ex)),
                                                    ex.complement(ex.alt(lit(ex, "ab"), lit(ex, "b")))),
                                       lit(ex, '"'))),
    ("[ab]{1,3}", lambda ex: ex.concat(ex.intersect(ex.star(parse_regex("[ab]", ex)),
                                                    ex.complement(ex.star(lit(ex, "a")))),
                                       lit(ex, '"'))),
    ("[ab]{1,3}", lambda ex: ex.concat(ex.intersect(ex.star(parse_regex("[ab]", ex)),
                                                    ex.complement(parse_regex("a[ab]*", ex))),
                                       lit(ex, '"'))),
    ("[ab]{1,3}", lambda ex: ex.intersect(ex.star(parse_regex("[abc]", ex)),
                                          ex.complement(ex.concat(ex.star(parse_regex("[abc]", ex)), lit(ex, "bb"))))),
    ("[ab]{1,3}", lambda ex: ex.alt(lit(ex, "aaa"), ex.concat(ex.repeat(parse_regex("[ab]", ex), 0, 2), lit(ex, "c")))),
]


@pytest.mark.parametrize("k", range(len(CASES)))
def test_prefixes_contain_matches_brute_force(k):
    pat, build = CASES[k]
    ex = ExprSet()
    s = parse_regex(pat, ex)
    u = build(ex)
    # every case is decided within 6 bytes (a counterexample is that short, or none exists)
    assert ex.prefixes_contain(s, u) == brute_prefixes_contain(ex, s, u)
    # a successful walk records every pair it visited as proved: each must hold on its own
    proved = [k for k, v in ex._prefix_cache.items() if v]
    for key in proved:
        x, y = key >> 32, key & 0xFFFFFFFF
        assert brute_prefixes_contain(ex, x, y, max_len=5), (ex.to_str(x), ex.to_str(y))


def test_proved_pairs_answer_later_questions_about_derivatives():
    ex = ExprSet()
    keys = ex.alt(*[ex.literal(w + '"') for w in ("abc", "aba", "bca", "cab")])
    u = ex.alt(keys, ex.concat(parse_regex("(ab)*c?", ex), ex.literal('"')))
    s = parse_regex("a(ba)*b?", ex)   # not a repeat: no structural shortcut, a walk
    assert ex.prefixes_contain(s, u)
    # the next lexer state after reading "ab" asks about the derivatives: already proved
    xs = ex.deriv(ex.deriv(s, ord("a")), ord("b"))
    ys = ex.deriv(ex.deriv(u, ord("a")), ord("b"))
    assert ex._prefix_cache.get(xs << 32 | ys) is True
    assert brute_prefixes_contain(ex, xs, ys)
    n = len(ex._prefix_cache)
    assert ex.prefixes_contain(xs, ys) and len(ex._prefix_cache) == n



@pytest.mark.parametrize("pat,bound,expect", [
    ("[ab]{3}c", 4, True), ("[ab]{3}c", 3, False), ("(ab|c)+", 1, True), ("a{5,}", 4, False),
    ("(ab)*", 0, True), ("x|yyyy", 2, True), ("yy(yy)*", 1, False),
])
def test_alive_of_length_bounded_intersections(pat, bound, expect):
    ex = ExprSet()
    e = ex.intersect(parse_regex(pat, ex), ex.repeat(ex.any_byte(), 0, bound))
    assert ex.alive(e) is expect
    # brute force: some string over the pattern's letters of at most ``bound`` bytes matches
    letters = sorted({c for c in pat.encode() if chr(c).isalnum()})
    words = (bytes(t) for n in range(bound + 1) for t in product(letters, repeat=n))
    assert any(ex.matches(e, w) for w in words) is expect


def test_memo_tables_are_not_tracked_by_the_garbage_collector():
    """A long-lived ExprSet holds millions of memoised results; each container the cyclic
    collector tracks is walked by every full collection (seconds on a big heap, landing on some
    mask). Its tables hold only ints, tuples of ints (or arrays) and bytearrays, so after a few
    collections (each stops tracking the tuples whose items are untracked, then the dicts holding
    them: one level of nesting each) the collector tracks none of them (lists or frozensets would
    stay tracked for ever)."""
    import gc

    from grammask.grammar.lexer import Lexer

    ex = ExprSet()
    words = [parse_regex(p, ex) for p in ("[a-z]+", "[0-9]{1,5}", '"([^"\\\\]|\\\\.)*"', "true|false")]
    lx = Lexer(ex, words)
    s = lx.start_state(list(range(len(words))))
    lx.expand(s, budget=200)
    for w in words:
        ex.min_length(w)
        ex.may_be_infinite(w)
    assert len(ex._trans) > 10 and len(ex._fm) > 10 and len(ex.__dict__["_lexer_moves"]) > 1
    for _ in range(5):
        gc.collect()
    for name in ("kind", "_nullable", "_has_bool", "_ids", "_deriv", "_classes", "_alive", "_fm",
                 "_partition_cache", "_trans", "_lexer_moves"):
        table = getattr(ex, name) if hasattr(ex, name) else ex.__dict__[name]
        assert not gc.is_tracked(table), (name, [(k, v) for k, v in table.items() if gc.is_tracked(k) or gc.is_tracked(v)][:3] if isinstance(table, dict) else None)
        if isinstance(table, dict):
            assert not any(gc.is_tracked(v) for v in table.values()), name
