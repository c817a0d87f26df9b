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
