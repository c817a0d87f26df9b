"""ExprSet shortcuts checked against brute force: structural emptiness and slice containment."""
from itertools import product

import pytest

from grammask.errors import GrammarTooComplexError
from grammask.grammar.regex import parse_regex
from grammask.grammar import regexset
from grammask.grammar.regexset import AND, ExprSet

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


def test_a_containment_walk_stops_within_16_pairs_of_its_deadline(monkeypatch):
    # a clock that passes the deadline at its second read: the walk (contained, ~1,200 pairs
    # without a deadline) must give up (False, not memoised as proved) within 16 pairs explored
    # (it read the clock when the count of pairs seen was a multiple of 64: a step that adds
    # several pairs could jump over them)
    import time

    ex = ExprSet()
    s = parse_regex("a(ba){0,300}b?", ex)   # not a repeat: no structural shortcut, a walk
    u = parse_regex("(ab){0,400}c?", ex)
    reads = []
    monkeypatch.setattr(time, "monotonic", lambda: reads.append(1) or (0.0 if len(reads) == 1 else 10.0))
    seen = []
    real = ExprSet.transitions
    monkeypatch.setattr(ExprSet, "transitions", lambda self, e: seen.append(e) or real(self, e))
    assert not ex.prefixes_contain(s, u, max_seconds=1.0)
    assert len(seen) <= 4 * 16 + 4, len(seen)   # (each pair: both sides, their first bytes)
    assert not any(ex._prefix_cache.values())
    monkeypatch.undo()
    ex2 = ExprSet()   # (contained: proved without the deadline)
    assert ex2.prefixes_contain(parse_regex("a(ba){0,300}b?", ex2), parse_regex("(ab){0,400}c?", ex2))


@pytest.mark.parametrize("pat_u, want", [("(ab){0,400}c?", True), ("(ab){0,290}c?", False)])
def test_a_proof_cut_short_is_resumed_where_it_stopped(pat_u, want, monkeypatch):
    # with ``resume`` a proof out of time answers None (not memoised) and goes on at the next
    # call: with no budget at all each call still explores 15 pairs, so the walk (~1,200 pairs)
    # ends after some tens of calls with the answer of one uncut walk, no pair explored twice
    # (the time of all the calls together is not bounded here: a loaded machine may be slow)
    monkeypatch.setattr(regexset, "MAX_RESUMED_SECONDS", 1e9)
    ex = ExprSet()
    s = parse_regex("a(ba){0,300}b?", ex)   # not a repeat: no structural shortcut, a walk
    u = parse_regex(pat_u, ex)
    explored = []
    real = ExprSet.transitions
    monkeypatch.setattr(ExprSet, "transitions", lambda self, e: explored.append(e) or real(self, e))
    answers = []
    while not answers or answers[-1] is None:
        answers.append(ex.prefixes_contain(s, u, max_seconds=0.0, resume=True))
        assert len(answers) < 1_000
    assert answers[-1] is want and len(answers) > 10
    assert ex._prefix_cache[s << 32 | u] is want and not ex._prefix_partial
    n_resumed = len(explored)
    ex2 = ExprSet()
    explored.clear()
    assert ex2.prefixes_contain(parse_regex("a(ba){0,300}b?", ex2), parse_regex(pat_u, ex2)) is want
    assert n_resumed == len(explored)   # the same pairs explored, in the same order
    # without ``resume`` a proof out of time answers False at once
    ex3 = ExprSet()
    assert ex3.prefixes_contain(parse_regex("a(ba){0,300}b?", ex3), parse_regex("(ab){0,400}c?", ex3),
                                max_seconds=0.0) is False


def test_a_resumed_proof_gives_up_after_its_total_budget(monkeypatch):
    monkeypatch.setattr(regexset, "MAX_RESUMED_SECONDS", 0.0)
    ex = ExprSet()
    s = parse_regex("a(ba){0,300}b?", ex)
    u = parse_regex("(ab){0,400}c?", ex)
    assert ex.prefixes_contain(s, u, max_seconds=0.0, resume=True) is False
    assert ex._prefix_cache[s << 32 | u] is False and not ex._prefix_partial


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



def _key_members(ex, cover: str, rest2: str = '"'):
    """A key lexeme as a JSON object with ``properties``, ``patternProperties`` ``a...`` and
    additional keys builds it: declared keys, pattern keys other than declared ones, other keys."""
    anykey = ex.star(parse_regex("[abc]", ex))
    declared = ex.alt(ex.literal("ab"), ex.literal("b"))
    pattern = parse_regex("a[abc]*", ex)
    other = ex.intersect(anykey, ex.complement(declared), ex.complement(pattern))
    members = [ex.concat(ex.literal("b"), ex.literal('"')), ex.concat(other, ex.literal('"'))]
    if cover == "pattern-minus-declared":
        members.append(ex.concat(ex.intersect(pattern, ex.complement(declared)), ex.literal(rest2)))
    elif cover == "pattern":
        members.append(ex.concat(pattern, ex.literal(rest2)))
    elif cover == "pattern-minus-infinite":
        members.append(ex.concat(ex.intersect(pattern, ex.complement(parse_regex("ab[abc]*", ex))),
                                 ex.literal(rest2)))
    return ex.alt(*members)


@pytest.mark.parametrize("cover,rest2,shortcut", [
    ("pattern-minus-declared", '"', True), ("pattern", '"', True),
    ("none", '"', False), ("pattern-minus-declared", "c", False), ("pattern-minus-infinite", '"', False),
])
def test_additional_keys_beside_pattern_keys_are_decided_structurally(cover, rest2, shortcut):
    """``X* & ~declared & ~pattern`` stands for ``X*`` only when the pattern's keys have their own
    alternative with the same tail (minus finitely many): the answer always equals brute force."""
    ex = ExprSet()
    u = _key_members(ex, cover, rest2)
    for pat in ("[ab]{1,3}", "[abc]{0,4}", "a{1,3}"):
        s = parse_regex(pat, ex)
        assert ex._repeat_covers(s, u) is shortcut
        assert ex.prefixes_contain(s, u) == brute_prefixes_contain(ex, s, u), (cover, rest2, pat)


@pytest.mark.parametrize("body,lo,tail,shortcut", [
    ("[abc]", 4, "c[abc]*", True),    # an unanchored pattern under minLength: decided structurally
    ("[abc]", 9, "c[abc]*", True),
    ("[a]", 4, "c[abc]*", False),     # words outside B*: the minimum cannot be met
    ("[abc]", 4, "c", False),         # a tail without long words: walked
    ("[abc]", 4, "c[abc]{0,2}", False),
])
def test_min_length_over_an_unanchored_pattern_is_decided_structurally(body, lo, tail, shortcut):
    ex = ExprSet()
    y = ex.alt(ex.concat(ex.star(parse_regex("[ab]", ex)), parse_regex(tail, ex)), ex.literal("cc"))
    u = ex.concat(ex.intersect(y, ex.repeat(parse_regex(body, ex), lo, None)), ex.literal('"'))
    for pat in ("[ab]{1,3}", "[ab]{0,4}c?"):
        s = parse_regex(pat, ex)
        assert ex._repeat_covers(s, u) is (shortcut and pat == "[ab]{1,3}"), pat
        assert ex.prefixes_contain(s, u) == brute_prefixes_contain(ex, s, u), (body, lo, tail, pat)


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
    lx = Lexer(ex, words, eager=False)  # the derivative construction (its moves cache)
    s = lx.start_state(list(range(len(words))))
    lx.expand(s, budget=200)
    eager = Lexer(ex, words, eager=True)   # and the compiled one (its packed transitions)
    eager.expand(eager.start_state(list(range(len(words)))), budget=200)
    for w in words:
        ex.min_length(w)
        ex.may_be_infinite(w)
        for m, t in ex.transitions(w):
            ex.byte_classes(t)   # what the emptiness checks of intersections read
    assert len(ex._trans) > 10 and len(ex._fm) > 10 and len(ex.__dict__["_lexer_moves"]) > 1
    for _ in range(5):
        gc.collect()
    ex.deriv(words[0], ord("a"))   # a derivative asked for from Python: memoised here too
    assert ex._deriv
    for name in ("kind", "_nullable", "_has_bool", "_bytes_ids", "_deriv", "_classes", "_alive", "_fm", "_counted_memo",
                 "_partition_cache", "_trans", "_lexer_moves"):
        table = getattr(ex, name) if hasattr(ex, name) else ex.__dict__[name]
        assert not gc.is_tracked(table), (name, [(k, v) for k, v in table.items() if gc.is_tracked(k) or gc.is_tracked(v)][:3] if isinstance(table, dict) else None)
        if isinstance(table, dict):
            assert not any(gc.is_tracked(v) for v in table.values()), name
    # the compiled expansion's rows: flat arrays (grammar/rowstore.py)
    from grammask.grammar.rowstore import row_store

    assert len(row_store(ex)) >= len(words)
    assert all(type(a).__name__ == "ndarray" and not gc.is_tracked(a) for a in row_store(ex).arrays)


def _bounded_language(ex: ExprSet, e: int, sigma: bytes, n: int, memo: dict) -> frozenset:
    """The words of ``e`` over ``sigma`` of at most ``n`` bytes, from the node's meaning alone
    (sets of words, not derivatives): exact for every kind, complement included, since a word
    of at most ``n`` bytes only ever splits into shorter ones."""
    from itertools import product

    from grammask.grammar.regexset import AND, BYTES, CONCAT, EMPTY, EPS, INF, NOT, OR

    if e in memo:
        return memo[e]
    k = ex.kind[e]
    universe = frozenset(bytes(t) for m in range(n + 1) for t in product(sigma, repeat=m))
    if k == EMPTY:
        r = frozenset()
    elif k == EPS:
        r = frozenset([b""])
    elif k == BYTES:
        r = frozenset(bytes([c]) for c in sigma if ex.args[e][0] >> c & 1)
    elif k == CONCAT:
        x, y = (_bounded_language(ex, a, sigma, n, memo) for a in ex.args[e])
        r = frozenset(u + v for u in x for v in y if len(u) + len(v) <= n)
    elif k == OR:
        r = frozenset().union(*(_bounded_language(ex, a, sigma, n, memo) for a in ex.args[e]))
    elif k == AND:
        r = universe
        for a in ex.args[e]:
            r = r & _bounded_language(ex, a, sigma, n, memo)
    elif k == NOT:
        r = universe - _bounded_language(ex, ex.args[e][0], sigma, n, memo)
    else:
        body, lo, hi = ex.args[e]
        x = _bounded_language(ex, body, sigma, n, memo)
        layer, r = frozenset([b""]), frozenset([b""]) if lo == 0 else frozenset()
        for count in range(1, n + lo + 1):
            if hi != INF and count > hi:
                break
            layer = frozenset(u + v for u in layer for v in x if len(u) + len(v) <= n)
            if count >= lo:
                r = r | layer
    memo[e] = r
    return r


@pytest.mark.parametrize("seed", range(6))
def test_compiled_store_matches_the_languages_of_its_nodes(seed):
    """Random expressions over ``abc`` built with every constructor (unions, intersections,
    complements, counted repeats, concatenations re-nested): membership by the compiled
    derivatives (``matches``) agrees with the languages computed from the nodes' meaning, for
    every word of up to 4 bytes; each node is hash-consed (made twice, one id); the transitions
    of a node agree with its derivative by every byte; concatenations stay right-nested."""
    import random
    from itertools import product

    from grammask.grammar.regexset import CONCAT

    rng = random.Random(seed)
    sigma, n = b"abc", 4
    ex = ExprSet()
    pool = [ex.literal(w) for w in ("a", "b", "ab", "ca")] + [ex.byteset(0b110 << 97)]
    for _ in range(70):
        op = rng.randrange(6)
        xs = [rng.choice(pool) for _ in range(rng.randint(1, 3))]
        if op == 0:
            e = ex.concat(*xs)
        elif op == 1:
            e = ex.alt(*xs)
        elif op == 2:
            e = ex.intersect(*xs)
        elif op == 3:
            e = ex.complement(xs[0])
        elif op == 4:
            lo = rng.randint(0, 2)
            e = ex.repeat(xs[0], lo, rng.choice([None, lo, lo + 1, lo + 3]))
        else:
            e = ex.intersect(ex.alt(*xs), ex.repeat(ex.any_byte(), 0, rng.randint(0, 3)))
        pool.append(e)
    memo: dict = {}
    words = [bytes(t) for m in range(n + 1) for t in product(sigma, repeat=m)]
    for e in pool[-40:]:
        lang = _bounded_language(ex, e, sigma, n, memo)
        assert {w for w in words if ex.matches(e, w)} == lang, ex.to_str(e)
        tr = ex.transitions(e)
        for c in range(256):
            moves = [t for m, t in tr if m >> c & 1]
            d = ex.deriv(e, c)
            assert moves == ([d] if ex.alive(d) else []), (ex.to_str(e), c)
    for e in range(len(ex)):
        if ex.kind[e] == CONCAT:
            assert ex.kind[ex.args[e][0]] != CONCAT
            a, b = ex.args[e]
            assert ex.concat(a, b) == e
    assert ex.concat(ex.concat(pool[0], pool[2]), pool[3]) == ex.concat(pool[0], ex.concat(pool[2], pool[3]))
    # the store's counter flag (capping's shortcut) is the structural property it stands for,
    # and capping leaves an expression without it as it is
    from grammask.grammar.regexset import AND, INF, NOT, OR, REPEAT
    from grammask.grammar.slicer import capped

    def has_counter(x):
        k = ex.kind[x]
        if k == NOT:
            return False
        if k == REPEAT:
            body, lo, hi = ex.args[x]
            if hi != INF and hi > max(lo, 1):
                return True
            return has_counter(body)
        return any(has_counter(y) for y in ex.args[x]) if k in (CONCAT, OR, AND) else False

    flags = [ex.has_counter(e) for e in range(len(ex))]
    assert flags == [has_counter(e) for e in range(len(ex))]
    assert any(flags) and not all(flags)
    for e in range(len(ex)):
        if not flags[e]:
            assert capped(ex, e, 1, True) == e and capped(ex, e, 1) == e


def test_store_rehashes_only_the_table_that_filled():
    """A growth rehashes the node table or the derivative memo, whichever is half full, and keeps
    the other as it is (a rehash of the memo cost 5-10 ms on the mask whose node filled the
    other); both still answer afterwards."""
    ex = ExprSet()
    S0 = ex._S
    memo0, table0 = S0.dkey, S0.htab
    ids = []
    while ex._S.htab is table0:   # nodes, no derivatives: the node table fills first
        ids.append(ex.literal(f"n{len(ids)}"))
    assert ex._S.dkey is memo0 and ex._S.dval is S0.dval
    table1 = ex._S.htab
    derivs = {}
    k = 0
    while ex._S.dkey is memo0:   # derivatives (empty ones: no new node) fill the memo
        e, b = ids[k % len(ids)], 128 + k // len(ids)
        derivs[(e, b)] = ex.deriv(e, b)
        k += 1
        assert b < 256
    assert ex._S.htab is table1
    assert [ex.literal(f"n{i}") for i in range(len(ids))] == ids
    ex._deriv.clear()   # asked again from the store's memo
    assert all(ex.deriv(e, b) == d for (e, b), d in derivs.items())
    assert all(ex.deriv(e, ord("n")) == ex.literal(f"{i}") for i, e in enumerate(ids))


def test_compiled_store_grows_and_keeps_its_ids():
    """The store starts small and grows (nodes, children, byte masks, the hash table and the
    derivative memo, each past its first size): every expression made again gets the id it had,
    every derivative is found again, and the Python mirrors match the store."""
    import numpy as np

    from grammask.grammar import nodestore as ns

    ex = ExprSet()
    first = ex._S.kind.shape[0], ex._S.htab.shape[0], ex._S.dkey.shape[0], ex._S.pool.shape[0], ex._S.bm.shape[0]
    words = [f"w{i}-{i * 7919 % 1000}".encode() for i in range(3000)]
    ids = [ex.literal(w) for w in words]
    sets = [ex.byteset((i * 2654435761) & ((1 << 256) - 1) | 1 << 200) for i in range(600)]
    unions = [ex.alt(*ids[i:i + 5]) for i in range(0, 3000, 5)]
    derivs = [ex.deriv(u, ord("w")) for u in unions] + [ex.deriv(i, ord("w")) for i in ids]
    derivs += [ex.deriv(d, c) for d in derivs for c in b"0123"]
    S = ex._S
    now = S.kind.shape[0], S.htab.shape[0], S.dkey.shape[0], S.pool.shape[0], S.bm.shape[0]
    assert all(b > a for a, b in zip(first, now)), (first, now)
    big = [ex.literal(f"z{i}") for i in range(9000)]   # one node with more children than the pool held
    assert ex.args[ex.alt(*big)] == tuple(sorted(big))
    assert [ex.literal(w) for w in words] == ids
    assert [ex.byteset((i * 2654435761) & ((1 << 256) - 1) | 1 << 200) for i in range(600)] == sets
    assert [ex.alt(*ids[i:i + 5]) for i in range(0, 3000, 5)] == unions
    ex._deriv.clear()   # asked again from the store's memo
    again = [ex.deriv(u, ord("w")) for u in unions] + [ex.deriv(i, ord("w")) for i in ids]
    assert again + [ex.deriv(d, c) for d in again for c in b"0123"] == derivs
    assert all(ex.matches(u, words[5 * j]) for j, u in enumerate(unions))
    S = ex._S   # the store's record now (each growth makes a new one)
    n = int(S.cnt[ns.C_NODES])
    assert n == len(ex)
    # every node's arguments, decoded from the store on first read, as the store holds them
    for e in range(n):
        k, a, b = int(S.kind[e]), int(S.a[e]), int(S.b[e])
        want = ((a, b) if k == ns.CONCAT else tuple(S.pool[a:a + b].tolist()) if k in (ns.OR, ns.AND)
                else (a, b, int(S.c[e])) if k == ns.REPEAT else (a,) if k == ns.NOT
                else (int.from_bytes(S.bm[a].tobytes(), "little"),) if k == ns.BYTES else ())
        assert ex.args[e] == want, e
    with pytest.raises(IndexError):
        ex.args[n]
    assert bytes(ex.kind) == S.kind[:n].tobytes() and bytes(ex._nullable) == S.nul[:n].tobytes()
    assert np.array_equal(np.frombuffer(bytes(ex._has_bool), np.uint8), S.hb[:n])


class _Unrolled(ExprSet):
    """The plain exploration of derivatives (the counter unrolled in the states): the reference
    for the counted-intersection emptiness check."""

    def _alive_counted(self, e):
        return None


# (x, factor r, lo, hi): ``x & r{lo,hi}``; factors that are prefix codes (single bytes, an
# escape-like ``\x``-led code), one that is not (``a|ab``) and a nullable one
COUNTED = [
    (x, r, lo, hi)
    for x in ("a[bc]*d", "(ab|c)*d", "a(bc)*dd", "d{3,}", "(a|bc){2,5}", "[ab]*b")
    for r in ("[a-d]", "x[ab]|[a-d]", "a|ab", "b?|[acd]")
    for lo, hi in ((0, 3), (2, 5), (3, 3), (4, None), (0, 7))
]
LETTERS = b"abcdx"


@pytest.mark.parametrize("pattern,want", [
    ("abc", 3), ("a|bc|", 0), ("(ab){3,7}c", 7), ("(ab|c){2,}d?", 2), ("(a{0,3}b){4}", 4), ("x*", 0),
    ("[^a]{5}(q|rs)*", 5), ("(((ab){2}c){3}|d{20})e", 16), ("a{3}(b|cd){0,9}", 3),
])
def test_min_length_is_the_shortest_word(pattern, want):
    """The compiled shortest-word length (nodestore.min_length_of) of hand-checked patterns, of
    the empty language, and of every sub-expression of a large alternation (an enum) against
    the shortest of its words; an intersection inside is refused."""
    ex = ExprSet()
    assert ex.min_length(parse_regex(pattern, ex)) == want
    assert ex.min_length(ex.EMPTY) == float("inf")
    assert ex.min_length(ex.concat(ex.literal("ab"), ex.EMPTY)) == float("inf")
    words = ["w%d%s" % (i, "x" * (i % 7)) for i in range(300)]
    enum = ex.alt(*[ex.literal(w) for w in words])
    assert ex.min_length(enum) == min(len(w) for w in words)
    assert ex.min_length(ex.repeat(enum, 3, 5)) == 3 * min(len(w) for w in words)
    with pytest.raises(ValueError):
        ex.min_length(ex.concat(ex.literal("a"), ex.intersect(parse_regex("a+", ex), parse_regex("a{2}", ex))))


@pytest.fixture
def searches(monkeypatch):
    """Small counted intersections go to the compiled walk by default
    (``ExprSet.counted_walk_max``): to the searches over pairs, for the tests of those."""
    monkeypatch.setattr(ExprSet, "counted_walk_max", -1)


# each counted check is run both ways: depth first first, or the periodic layers first
LAYERS_FIRST = {"depth_first": 10 ** 9, "layers_first": 0}


@pytest.mark.parametrize("order", sorted(LAYERS_FIRST))
@pytest.mark.parametrize("k", range(len(COUNTED)))
def test_alive_of_counted_intersections_matches_the_unrolled_exploration(k, order, searches):
    """``x & r{lo,hi}`` and its derivatives (the states a lexer reaches: partial factors, counts
    in between) are decided by the counted check exactly as the unrolled exploration decides
    them (small counts: both finish)."""
    x, r, lo, hi = COUNTED[k]
    sets = []
    for cls in (ExprSet, _Unrolled):
        ex = cls()
        ex.counted_layers_from = LAYERS_FIRST[order]
        e = ex.intersect(parse_regex(x, ex), ex.complement(ex.literal("abd")), ex.repeat(parse_regex(r, ex), lo, hi))
        sets.append((ex, e))
    (ex, e), (ref, e_ref) = sets
    assert ex.has_bool(e) and ex._alive_counted(e) is not None   # the check under test applies
    words = [b""] + [bytes(t) for n in range(1, 4) for t in product(LETTERS, repeat=n)]
    for w in words:
        d, d_ref = e, e_ref
        for b in w:
            d, d_ref = ex.deriv(d, b), ref.deriv(d_ref, b)
        assert ex.alive(d) == ref.alive(d_ref), (x, r, lo, hi, w)


@pytest.mark.parametrize("undecided", [False, True])
def test_small_counted_intersections_are_walked_as_the_unrolled_exploration(undecided, monkeypatch):
    """By default a counted intersection with small counts (all of ``COUNTED``'s) is decided by
    the compiled walk over its derivatives, not the searches over pairs, exactly as the unrolled
    exploration; where the walk is undecided (stubbed here) the searches decide instead."""
    import grammask.grammar.regexset as rs

    searched = []   # intersections the searches decided

    def spy(self, e, real=ExprSet._alive_counted):
        got = real(self, e)
        if got is not None:
            searched.append(e)
        return got

    monkeypatch.setattr(ExprSet, "_alive_counted", spy)
    current = []
    if undecided:   # the walk gives up on every small counted intersection
        real_walk = rs._py_alive
        monkeypatch.setattr(rs, "_py_alive", lambda S, e, limit: (
            0 if S is current[-1]._S and current[-1]._counted_small(e) else real_walk(S, e, limit)))
    for x, r, lo, hi in COUNTED[::3]:
        ex, ref = ExprSet(), _Unrolled()
        current.append(ex)
        e = ex.intersect(parse_regex(x, ex), ex.complement(ex.literal("abd")), ex.repeat(parse_regex(r, ex), lo, hi))
        e_ref = ref.intersect(parse_regex(x, ref), ref.complement(ref.literal("abd")), ref.repeat(parse_regex(r, ref), lo, hi))
        assert ex._counted_small(e)
        for w in [b""] + [bytes(t) for n in range(1, 3) for t in product(LETTERS, repeat=n)]:
            d, d_ref = e, e_ref
            for b in w:
                d, d_ref = ex.deriv(d, b), ref.deriv(d_ref, b)
            assert ex.alive(d) == ref.alive(d_ref), (x, r, lo, hi, w)
    assert bool(searched) == undecided


@pytest.mark.parametrize("x,r,lo,hi,max_len", [
    ("ab|ba", "[ab]", 2, 2, 4), ("ab|ba", "[ab]", 3, 9, 9), ("a(ab)*", "ab|a", 1, 2, 4), ("a(ab)*", "ab", 1, 4, 8),
    ("(aab)*", "a|ab|b", 3, 3, 6), ("b(aa)*", "aa|b", 2, 4, 8), ("ab", "b?|[ab]", 3, 3, 3),
    # ``hi`` tight: the first word found may take too many factors (``b*a?`` and ``a*b`` split
    # a word in many ways), then the least number is searched for
    ("[ab]b(ab|[bc])abba(c)?", "b*a?", 1, 2, 9), ("baba(b|a)ab[ab]", "a*b", 1, 4, 9),
])
@pytest.mark.parametrize("order", sorted(LAYERS_FIRST))
def test_alive_of_counted_intersections_matches_brute_force(x, r, lo, hi, max_len, order, searches):
    ex = ExprSet()
    ex.counted_layers_from = LAYERS_FIRST[order]
    e = ex.intersect(parse_regex(x, ex), ex.repeat(parse_regex(r, ex), lo, hi))
    got = ex._alive_counted(e)
    assert got is not None
    # every word of x (or of r{lo,hi}) has at most max_len bytes
    words = (bytes(t) for n in range(max_len + 1) for t in product(b"abc", repeat=n))
    assert got is any(ex.matches(e, w) for w in words)


@pytest.mark.parametrize("order", sorted(LAYERS_FIRST))
def test_alive_of_random_counted_intersections_matches_the_unrolled_exploration(order, searches):
    import random

    rng = random.Random(5)

    def rand_re(d=0):
        c = rng.random()
        if d > 2 or c < 0.3:
            return rng.choice(["a", "b", "c", "[ab]", "[bc]", "ab", "ba"])
        if c < 0.55:
            return rand_re(d + 1) + rand_re(d + 1)
        if c < 0.75:
            return "(" + rand_re(d + 1) + "|" + rand_re(d + 1) + ")"
        if c < 0.9:
            return "(" + rand_re(d + 1) + ")" + rng.choice(["*", "+", "?", "{2}", "{1,3}"])
        return rand_re(d + 1)

    checked = 0
    for _ in range(300):
        x, r = rand_re(), rng.choice(["a*b", "a*b|c", "(ab)*c", "b*a?", "a+|b", rand_re()])
        lo = rng.randint(0, 4)
        hi = rng.choice([None, lo, lo + 1, lo + 3, 2 * lo + 2])
        sets = []
        for cls in (ExprSet, _Unrolled):
            ex = cls()
            ex.counted_layers_from = LAYERS_FIRST[order]
            sets.append((ex, ex.intersect(parse_regex(x, ex), ex.repeat(parse_regex(r, ex), lo, hi))))
        (ex, e), (ref, e_ref) = sets
        if ex.kind[e] != AND or ex._alive_counted(e) is None:
            continue   # simplified away, or no counter (e.g. r{0,1})
        checked += 1
        for w in (bytes(t) for n in range(4) for t in product(b"abc", repeat=n)):
            d, d_ref = e, e_ref
            for b in w:
                d, d_ref = ex.deriv(d, b), ref.deriv(d_ref, b)
            assert ex.alive(d) == ref.alive(d_ref), (x, r, lo, hi, w)
    assert checked > 150


@pytest.mark.parametrize("limit", [1, 4])
def test_refused_most_factors_fall_back_to_the_searches(limit, monkeypatch, searches):
    """With the most-factors exploration refused past ``limit`` pairs (each pair met is then
    remembered as refused), ``minLength``-shaped intersections and their derivatives are decided
    by the searches exactly as the unrolled exploration decides them."""
    import grammask.grammar.regexset as rs

    monkeypatch.setattr(rs, "MOST_FIRST_PAIRS", limit)
    refused = 0
    for x, r, lo, hi in COUNTED:
        if hi is not None:
            continue
        sets = []
        for cls in (ExprSet, _Unrolled):
            ex = cls()
            e = ex.intersect(parse_regex(x, ex), ex.complement(ex.literal("abd")), ex.repeat(parse_regex(r, ex), lo, hi))
            sets.append((ex, e))
        (ex, e), (ref, e_ref) = sets
        for w in [b""] + [bytes(t) for n in range(1, 4) for t in product(LETTERS, repeat=n)]:
            d, d_ref = e, e_ref
            for b in w:
                d, d_ref = ex.deriv(d, b), ref.deriv(d_ref, b)
            assert ex.alive(d) == ref.alive(d_ref), (x, r, lo, w)
        refused += sum(1 for v in ex._most_memo.values() if v == rs.MOST_REFUSED)
    assert refused > 0


def _most_factors(x: str, p: str, r: str, max_len: int) -> int | None:
    """The most factors of ``r`` in a split ``u f1 … fk`` (``u`` in ``p``) of a word of ``x`` of
    at most ``max_len`` bytes, -1 if none: brute force with Python's ``re`` (None: x has too
    many such words to try)."""
    import re

    import regex

    words, todo, seen = [], [""], 0   # the words of x, grown along the prefixes that regex's
    while todo:                       # partial matching says some word of x continues
        w = todo.pop()
        seen += 1
        if seen > 3000:
            return None
        if re.fullmatch(x, w):
            words.append(w)
        if len(w) < max_len:
            todo.extend(w + c for c in "abc" if regex.fullmatch(x, w + c, partial=True))
    best = -1
    for w in words:
        most = [-1] * (len(w) + 1)   # most[i]: factors in a split of w[i:] into r-factors
        most[len(w)] = 0
        for i in range(len(w) - 1, -1, -1):
            for j in range(i + 1, len(w) + 1):
                if most[j] >= 0 and re.fullmatch(r, w[i:j]):
                    most[i] = max(most[i], most[j] + 1)
        for i in range(len(w) + 1):
            if most[i] >= 0 and re.fullmatch(p, w[:i]):
                best = max(best, most[i])
    return best


def test_most_factors_of_counted_pairs_matches_brute_force():
    """``_counted_most`` (what decides ``x & p r{lo,}``, a ``minLength``) against every split of
    every short word: exact where the words are short, unbounded exactly where the most grows
    with the length."""
    import random

    from grammask.grammar.regexset import EPS, MOST_UNBOUNDED

    rng = random.Random(11)

    def rand_re(d=0, star=True):
        c = rng.random()
        if d > 2 or c < 0.3:
            return rng.choice(["a", "b", "c", "[ab]", "[bc]", "ab", "ba"])
        if c < 0.55:
            return rand_re(d + 1, star) + rand_re(d + 1, star)
        if c < 0.75:
            return "(" + rand_re(d + 1, star) + "|" + rand_re(d + 1, star) + ")"
        if c < 0.9:
            return "(" + rand_re(d + 1, star) + ")" + rng.choice(["*", "+", "?", "{2}"] if star else ["?", "{2}"])
        return rand_re(d + 1, star)

    kinds = {"finite": 0, "bounded": 0, "unbounded": 0, "none": 0}
    for i in range(120):
        star = i % 2 == 0
        x = rand_re(star=star)
        if i % 4 == 0:
            x = "(" + x + ")+"
        r = rng.choice(["a", "[ab]", "a|ab", "ab|b", "a*b", "[abc]", "c", rand_re(star=False)])
        p = rng.choice(["", "", "b", "a?"])
        ex = ExprSet()
        got = ex._counted_most(parse_regex(x, ex) << 32 | parse_regex(p, ex) if p else parse_regex(x, ex) << 32 | EPS,
                               parse_regex(r, ex))
        short, long = _most_factors(x, p, r, 10), _most_factors(x, p, r, 16)
        if long is None:
            continue
        if got == MOST_UNBOUNDED:
            assert long > short, (x, p, r)
            kinds["unbounded"] += 1
        else:
            # x's words without a loop have at most 16 bytes (a two-byte leaf under three
            # doublings: concatenations or {2}); a bounded most with a loop is reached by a
            # short word too
            assert got == short == long, (x, p, r)
            kinds[("finite" if not star else "bounded") if got >= 0 else "none"] += 1
    assert min(kinds.values()) >= 5, kinds


@pytest.mark.parametrize("x,r,prefix,expect", [
    ("[a-z]+@[a-z]+\\.com", "[ -~]", b"a", True),
    ("\\[(v[0-9a-f]+\\.[a-z:]+|[0-9]+)\\]", "[ -~]", b"[", True),
    ("v[0-9a-f]+\\.[a-z:]+\\]", "[ -~]", b"v", True),
    ("a[0-9]*##", "[a-z0-9]", b"a", False),      # '#' is no factor: empty, whatever the count
    ("0(00)*##", "[0#]{2}", b"0", False),        # factors of two bytes, words of odd length
])
def test_alive_with_a_large_counter_is_decided_without_unrolling(x, r, prefix, expect):
    """``maxLength: 65536`` over a pattern with a loop: the unrolled exploration meets tens of
    thousands of states that differ only in the count left (it raised GrammarTooComplexError
    during lexing); the counted check visits a few pairs."""
    ex = ExprSet(max_alive_states=200)
    e = ex.intersect(parse_regex(x, ex), ex.repeat(parse_regex(r, ex), 1, 65536))
    for b in prefix:
        e = ex.deriv(e, b)
    assert ex.alive(e) is expect
    ref = _Unrolled(max_alive_states=200)
    e_ref = ref.intersect(parse_regex(x, ref), ref.repeat(parse_regex(r, ref), 1, 65536))
    for b in prefix:
        e_ref = ref.deriv(e_ref, b)
    with pytest.raises(GrammarTooComplexError):
        ref.alive(e_ref)


def test_alive_with_a_large_minimum_skips_the_periodic_layers():
    """``minLength`` in the tens of thousands: the sets of pairs per count recur after a few
    counts, so the check does not walk the count up to the minimum."""
    ex = ExprSet(max_alive_states=200)
    unit = parse_regex("[ -~]|\\\\u[0-9a-f]{4}", ex)
    for x, n, expect in (("[a-z]+(-[a-z]+)*", 50_000, True), ("(ab)+", 50_000, True),
                         ("(ab)+c", 50_000, False), ("(ab)+c", 50_001, True)):
        e = ex.intersect(parse_regex(x, ex), ex.repeat(unit, n, n))
        assert ex.alive(e) is expect, (x, n)


@pytest.mark.parametrize("patterns", [
    ("[a-z]+", "[0-9]{1,5}", '"([^"\\\\]|\\\\.)*"', "true|false", "tr[a-u]e", "-?[0-9]+(\\.[0-9]+)?"),
    ("\\s*\\{", "\\s*\"name\"", "\\s*\"nam\"", "\\s*[0-9]+", "\\s*,", "[^\\x00-\\x1f\"]{0,12}"),
    ("(ab|a)*c", "a{2,40}", "[\\x80-\\xbf]{1,3}x", "[^a]+", "é+|ü"),
])
def test_compiled_expansion_is_the_derivative_construction(patterns):
    """The compiled expansion (lexeme DFAs over byte classes, subset construction in Numba) builds
    the lexer automaton of the derivative construction of whole states: every state reachable
    from every start set, explored in full on both, has the same members, accepted lexemes and
    moves (states matched by their members, ids differ)."""
    from grammask.grammar.lexer import Lexer

    ex = ExprSet()
    words = [parse_regex(p, ex) for p in patterns]
    ref = Lexer(ex, words, eager=False)
    fast = Lexer(ex, words, eager=True)
    starts = [list(range(len(words)))] + [[k] for k in range(len(words))] + [[0, len(words) - 1]]
    for allowed in starts:
        assert len(explore_same_automaton(fast, ref, fast.start_state(allowed), ref.start_state(allowed))) >= 2
    assert fast.n_states == ref.n_states > 20


def explore_same_automaton(fast, ref, sf, sr, budget: int = 3) -> set:
    """Explore the lexers ``fast`` and ``ref`` in full from their states ``sf`` and ``sr``, states
    matched by their members (ids differ): the same members, accepted lexemes and moves. Returns
    the states of ``fast`` met."""
    from grammask.grammar.lexer import DEAD

    pairs = [(sf, sr)]
    seen = set()
    while pairs:
        sf, sr = pairs.pop()
        if sf in seen:
            continue
        seen.add(sf)
        assert fast.state_members(sf) == ref.state_members(sr)
        assert fast.accepted_lexemes(sf) == ref.accepted_lexemes(sr)
        fast.expand(sf, budget=budget)
        ref.expand(sr)
        tf = fast.trans[sf * 256:(sf + 1) * 256].tolist()
        tr = ref.trans[sr * 256:(sr + 1) * 256].tolist()
        assert [t == DEAD for t in tf] == [t == DEAD for t in tr]
        pairs.extend((a, b) for a, b in zip(tf, tr) if a != DEAD)
    return seen


@pytest.mark.parametrize("eager", [True, False], ids=["compiled-expansion", "derivatives"])
def test_row_tables_grow_past_their_reservation_without_filling(monkeypatch, eager):
    """Past :data:`~grammask.grammar.lexdfa.RESERVE_FROM` states the row tables (``trans``,
    ``g_next``) jump to a large capacity that is allocated, not filled: each state's row is
    written when the state is made. Made small here so that the jump, and a doubling past the
    reservation, happen on a lexer of a few thousand states. Every state not expanded must read
    ``UNKNOWN`` on all 256 bytes (a kernel reading garbage there would take it for a move), the
    automaton must be the one the derivative construction builds with the old growth (same
    states, same moves), and the memory charged is the rows in use, not the capacity."""
    from grammask.grammar import lexdfa
    from grammask.grammar.lexer import UNKNOWN, Lexer

    monkeypatch.setattr(lexdfa, "RESERVE_FROM", 64)
    monkeypatch.setattr(lexdfa, "RESERVE_STATES", 1024)
    ex = ExprSet()
    words = [parse_regex(p, ex) for p in ("[a-c]{0,900}x", "[b-d]{0,1100}y", "b+z")]
    lx = Lexer(ex, words, eager=eager)
    s0 = lx.start_state([0, 1, 2])
    lx.warm_up(s0, budget=2500)
    for _ in range(3):   # expand the frontier, so that states made but not expanded remain
        frontier = [s for s in range(lx.n_states) if not lx.expanded[s]]
        lx.expand_many(frontier[: len(frontier) // 2])
    n = lx.n_states
    assert n > 2048 and lx.trans.shape[0] >= 4096 * 256   # past the reservation, doubled again
    rows = lx.trans[: n * 256].reshape(n, 256)
    unexpanded = ~lx.expanded[:n]
    assert unexpanded.any()
    assert (rows[unexpanded] == UNKNOWN).all()
    assert not (rows[~unexpanded] == UNKNOWN).any()
    assert lx.trans_bytes() == 1024 * n < lx.trans.nbytes
    if eager:
        assert lexdfa.dfas_bytes(lx._X) < sum(a.nbytes for a in lx._X)
    # the same automaton as a lexer that never reached the reservation's size
    monkeypatch.setattr(lexdfa, "RESERVE_FROM", 1 << 30)
    ref = Lexer(ex, words, eager=False)
    seen = explore_same_automaton(lx, ref, s0, ref.start_state([0, 1, 2]), budget=0)
    assert len(seen) == lx.n_states == ref.n_states > 2048


def test_store_past_its_node_bound_raises_a_typed_error():
    """``max_nodes`` bounds the compiled store: past it a constructor raises
    GrammarTooComplexError, and the Python mirrors still hold every node the store made (the set
    goes on answering for them)."""
    ex = ExprSet(max_nodes=60)
    made = []
    with pytest.raises(GrammarTooComplexError, match="exceed 60 nodes"):
        for i in range(100):
            made.append(ex.literal(f"key{i}"))
    assert 40 <= len(ex) == len(ex._nullable) <= 60
    assert all(isinstance(ex.args[e], tuple) for e in range(len(ex)))
    assert made and all(ex.matches(e, f"key{i}") for i, e in enumerate(made))


def test_bit_scans_of_the_compiled_expansion_match_python():
    """``ctz64`` (a de Bruijn table) and ``_next_bit`` (the runs of a lexer state's row) against
    plain Python on random 256-bit masks, every word boundary included."""
    import random

    import numpy as np
    from numba import njit

    from grammask.grammar.lexdfa import _next_bit, ctz64

    @njit
    def scan(w0, w1, w2, w3, b):
        return _next_bit(w0, w1, w2, w3, b)

    @njit
    def low(x):
        return ctz64(x)

    rng = random.Random(7)
    for i in range(64):
        assert low(np.uint64(1 << i | (1 << 63))) == i
    for _ in range(2000):
        m = 0
        for _ in range(rng.randint(0, 6)):
            m |= 1 << rng.choice([0, 1, 62, 63, 64, 127, 128, 191, 192, 255, rng.randrange(256)])
        b = rng.choice([0, 62, 63, 64, 127, 191, 254, 255, rng.randrange(256)])
        words = [np.uint64(m >> (64 * k) & (2 ** 64 - 1)) for k in range(4)]
        assert scan(*words, b) == next((i for i in range(b + 1, 256) if m >> i & 1), 256), (hex(m), b)


@pytest.mark.parametrize("pattern", [r'[^"\\\x00-\x1F\x7F]*', r'(\S+\s+){0,4}\S+', r'[A-Za-z\u00e0-\u00ff]{1,5}',
                                     r'[0-9]{2}-[a-f]+|x'])
def test_dense_dfa_equals_the_derivatives_byte_by_byte(pattern):
    """``dense_dfa`` against the derivative by every byte (an oracle that shares only ``deriv``,
    ``alive`` and ``nullable`` with it): following the table from state 0, each state stands for
    one expression, the derivative of its predecessor's, dead exactly where the derivative is."""
    ex = ExprSet()
    e = parse_regex(pattern, ex)
    table, accept = ex.dense_dfa(e, 4096)
    expr = {0: e}
    todo = [0]
    while todo:
        i = todo.pop()
        assert accept[i] == ex.nullable(expr[i])
        for b in range(256):
            d = ex.deriv(expr[i], b)
            j = int(table[i, b])
            if j < 0:
                assert not ex.alive(d), (i, b)
            elif j in expr:
                assert expr[j] == d, (i, b)
            else:
                expr[j] = d
                todo.append(j)
    assert sorted(expr) == list(range(table.shape[0]))
    assert len(set(expr.values())) == table.shape[0]
    assert ex.dense_dfa(e, 2) is None


def test_node_arguments_are_read_again_past_the_memos_bound(monkeypatch):
    """``ExprSet.args`` keeps at most ``NODE_ARGS_MEMO`` nodes (a dict the collector walks whole):
    past it the memo starts again, and a node read again gives the same arguments."""
    import grammask.grammar.regexset as regexset

    ex = ExprSet()
    roots = [parse_regex(p, ex) for p in ("(ab|c)*d{2,5}", "[a-c]+&~(abc)", "x(y|z){0,3}w?")]
    roots.append(ex.deriv(roots[0], ord("a")))
    n = len(ex.kind)
    assert n > 8
    want = [ex.args[e] for e in range(n)]
    monkeypatch.setattr(regexset, "NODE_ARGS_MEMO", 3)
    ex.args.clear()
    for order in (range(n), reversed(range(n)), range(0, n, 2)):
        for e in order:
            assert ex.args[e] == want[e], e
            assert len(ex.args) <= 3
    with pytest.raises(IndexError):
        ex.args[n + 10]


def _may_be_infinite_reference(ex: ExprSet, e: int) -> bool:
    """The rules of ``ExprSet.may_be_infinite`` read from the nodes' arguments, recursively (the
    Python walk the compiled one replaced)."""
    from grammask.grammar.regexset import CONCAT, INF, NOT, OR, REPEAT
    k = ex.kind[e]
    if k == REPEAT:
        return ex.args[e][2] == INF or _may_be_infinite_reference(ex, ex.args[e][0])
    if k == NOT:
        return True
    if k == AND:
        return all(_may_be_infinite_reference(ex, x) for x in ex.args[e])
    if k == OR:
        return any(_may_be_infinite_reference(ex, x) for x in ex.args[e])
    if k == CONCAT:
        return any(_may_be_infinite_reference(ex, x) for x in ex.args[e])
    return False


@pytest.mark.parametrize("pattern,finite", [
    ("abc", True), ("a|bc|", True), ("(ab){3,7}c", True), ("(ab|c){2,}d?", False), ("x*", False),
    ("[^a]{5}(q|rs){0,4}", True), ("(((ab){2}c){3}|d{20})e", True), ("a{3}(b|cd)+", False),
])
def test_may_be_infinite_follows_its_rules_on_every_node(pattern, finite):
    """The compiled answer (nodestore.may_be_infinite_of) on hand-checked patterns, and on every
    node made along the way (large alternations, intersections, complements, counted repeats
    nested in concatenations) against the rules read recursively from the nodes: first from
    the top nodes with nothing memoised (one walk answers all below), then node by node."""
    ex = ExprSet()
    e = parse_regex(pattern, ex)
    words = [ex.literal("k%d%s" % (i, "y" * (i % 5))) for i in range(400)]
    keys = ex.alt(*words)
    star = parse_regex("[a-z]*", ex)
    built = [
        keys, ex.concat(keys, ex.literal('":')), ex.repeat(keys, 0, 3), ex.repeat(keys, 2, None),
        ex.intersect(star, ex.complement(keys)), ex.intersect(keys, ex.complement(star)),
        ex.intersect(ex.repeat(keys, 1, None), star), ex.complement(keys),
        ex.concat(ex.literal("a"), ex.concat(ex.repeat(parse_regex("b", ex), 1, 4), ex.concat(star, keys))),
        ex.alt(keys, ex.intersect(star, ex.repeat(parse_regex("[ab]", ex), 0, 9))),
    ]
    want = [_may_be_infinite_reference(ex, x) for x in built]
    assert [ex.may_be_infinite(x) for x in reversed(built)] == want[::-1]
    assert ex.may_be_infinite(e) is (not finite)
    for x in range(len(ex.kind)):
        assert ex.may_be_infinite(x) is _may_be_infinite_reference(ex, x), x
    assert ex.may_be_infinite(ex.EMPTY) is False and ex.may_be_infinite(ex.EPS) is False


@pytest.mark.parametrize("pattern", ["[A-Za-z\u00aa\u00b5\u00ba\u00c0-\u00d6\u0370-\u03ff\u4e00-\u9fff]",
                                     r"(\S+\s+){0,9}\S+", r"[0-9]{2,5}(\.[0-9]+)?", "(ab|c){0,9}d", "x*",
                                     r'[^"\\]{1,10}', "(a|bb){3,40}c{0,30}"])
def test_the_compiled_dense_dfa_is_the_python_one(pattern):
    ex = ExprSet()
    e = parse_regex(pattern, ex)
    got = ex.dense_dfa(e, 4096)
    want = ex._dense_dfa_py(e, 4096)
    assert got is not None and want is not None
    assert got[0].shape == want[0].shape and (got[0] == want[0]).all() and (got[1] == want[1]).all()
    n = want[0].shape[0]
    if n > 1:   # one state short: None from both
        assert ex.dense_dfa(e, n - 1) is None and ex._dense_dfa_py(e, n - 1) is None
        assert ex.dense_dfa(e, n) is not None
