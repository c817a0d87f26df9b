"""The fixpoints of grammar lowering (:mod:`grammask.grammar.cfg`): the sweeping fixpoint agrees
with the counting one on any grammar, including those that make it fall back."""
from __future__ import annotations

import random

import pytest

from grammask.grammar.cfg import _horn_fixpoint, _least_fixpoint, _nullable_nts


def _random_rules(rng: random.Random, n: int, terms: int) -> dict[int, list[list[int]]]:
    rules = {}
    for nt in range(n):
        alts = []
        for _ in range(rng.randint(0, 3)):
            alts.append([rng.randrange(n) if rng.random() < 0.6 else ~rng.randrange(terms)
                         for _ in range(rng.randint(0, 3))])
        rules[nt] = alts
    return rules


@pytest.mark.parametrize("seed", range(300))
def test_sweeping_fixpoint_is_the_counting_fixpoint(seed):
    rng = random.Random(seed)
    rules = _random_rules(rng, rng.randint(1, 40), 6)
    ok = {~e: rng.random() < 0.7 for e in range(6)}
    assert _least_fixpoint(rules, ok) == _horn_fixpoint(rules, lambda e: ok[~e])
    assert _least_fixpoint(rules, None) == _horn_fixpoint(rules, lambda e: False)
    assert _nullable_nts(rules) == _horn_fixpoint(rules, lambda e: False)


@pytest.mark.parametrize("n", [2, 10, 200])
def test_rules_that_refer_to_earlier_rules_settle_too(n):
    """A chain written bottom-up (each rule refers to the one before it) takes one sweep per
    rule from the last to the first: past the work budget the counting fixpoint answers."""
    rules = {0: [[~0]]}
    for nt in range(1, n):
        rules[nt] = [[nt - 1, ~0]]
    rules[n] = [[n, ~1]]   # unproductive: refers only to itself
    ok = {~0: True, ~1: True}
    assert _least_fixpoint(rules, ok) == set(range(n)) == _horn_fixpoint(rules, lambda e: ok[~e])
    nullable = {0: [[]]} | {nt: [[nt - 1]] for nt in range(1, n)}
    assert _least_fixpoint(nullable, None) == set(range(n))


@pytest.mark.parametrize("check_lexemes", [True, False])
def test_lowering_leaves_the_grammar_as_it_was(check_lexemes):
    """Lowering starts from the grammar's own lists (no copy) and must never change them."""
    import copy

    from grammask.grammar.cfg import lower
    from grammask.grammar.ebnf import parse_ebnf

    g = parse_ebnf('''
        root ::= item ("," item)* dead? | "[" root? "]"
        item ::= [a-z]* | "x" "y"* | word
        word ::= "ab" | "a" [b-c]+
        dead ::= dead "z"
        unused ::= "u"
    ''')
    before = copy.deepcopy(g.rules)
    lower(g, "root", check_lexemes=check_lexemes)
    assert g.rules == before


def _reference_prune(ex, rules, root):
    """Productive alternatives reachable from the root, written plainly (the oracle of the
    compiled prune)."""
    alive = {s: ex.alive(~s) for alts in rules.values() for a in alts for s in a if s < 0}
    productive = _horn_fixpoint(rules, lambda e: alive[~e])
    if root not in productive:
        return None
    out, todo = {}, [root]
    while todo:
        nt = todo.pop()
        if nt in out:
            continue
        out[nt] = [a for a in rules[nt] if all((s in productive) if s >= 0 else alive[s] for s in a)]
        todo.extend(s for a in out[nt] for s in a if s >= 0 and s not in out)
    return out


@pytest.mark.parametrize("seed", range(200))
def test_compiled_prune_and_flatten_match_the_python_ones(seed):
    """The compiled pass (:func:`_flatten_compiled`) gives the tables of the plain prune and
    :func:`_flatten`, array for array; it declines grammars that keep a nullable terminal and
    raises where the root derives nothing. Terminals: live, dead (an empty intersection) and
    nullable expressions."""
    import numpy as np

    from grammask.errors import EmptyLanguageError
    from grammask.grammar.cfg import _flatten, _flatten_compiled
    from grammask.grammar.regexset import ExprSet

    rng = random.Random(seed)
    ex = ExprSet()
    a, b = ex.literal("a"), ex.literal("b")
    pool = [a, b, ex.literal("ab"), ex.intersect(a, b), ex.star(a) if rng.random() < 0.3 else ex.literal("c"),
            ex.intersect(ex.star(a), ex.concat(a, a))]
    n = rng.randint(1, 30)
    rules = _random_rules(rng, n, len(pool))
    rules = {nt: [[~pool[~s] if s < 0 else s for s in alt] for alt in alts] for nt, alts in rules.items()}
    names = [f"r{i}" for i in range(n)]
    before = {nt: [list(x) for x in alts] for nt, alts in rules.items()}
    ref_rules = _reference_prune(ex, {nt: [list(x) for x in alts] for nt, alts in rules.items()}, 0)
    if ref_rules is None:
        with pytest.raises(EmptyLanguageError):
            _flatten_compiled(ex, rules, 0, names, prune=True)
        return
    got = _flatten_compiled(ex, rules, 0, names, prune=True)
    assert rules == before
    nullable_kept = any(s < 0 and ex.nullable(~s) for alts in ref_rules.values() for x in alts for s in x)
    if nullable_kept:
        assert got is None
        return
    for pruned, flat in ((True, got), (False, _flatten_compiled(ex, ref_rules, 0, names, prune=False))):
        ref = _flatten(ex, ref_rules, 0, names)
        for f in ("sym", "end_lhs", "prod_start", "nt_prod_lo", "nt_prod_hi", "nt_nullable"):
            x, y = getattr(ref, f), getattr(flat, f)
            assert x.dtype == y.dtype and np.array_equal(x, y), (pruned, f)
        assert (ref.start_nt, ref.accept_pos, ref.lexemes, ref.names) == (flat.start_nt, flat.accept_pos, flat.lexemes, flat.names)


def test_the_work_clock_does_not_charge_numba_compilation():
    """A kernel compiled while a grammar is lowered (a cold kernel cache) is not the grammar's
    work: the lowering's time bound runs on :func:`work_clock`, which leaves compilation out."""
    import time

    import numpy as np
    from numba import njit

    from grammask.grammar import cfg

    @njit(cache=False)
    def fresh(a):   # defined here: never compiled before, never cached
        s = 0
        for i in range(a.shape[0]):
            s += a[i] * (i % 7)
        return s

    w0, m0, j0 = cfg.work_clock(), time.monotonic(), cfg._JitClock.seconds
    assert fresh(np.arange(10)) == sum(i * (i % 7) for i in range(10))
    w1, m1, j1 = cfg.work_clock(), time.monotonic(), cfg._JitClock.seconds
    assert j1 > j0                       # the compilation was seen and counted
    assert j1 - j0 <= (m1 - m0) + 1e-6   # within the elapsed time
    # what is left is the call itself, a small part of a compilation's ~0.1 s or more
    assert (w1 - w0) < 0.5 * (m1 - m0)


def test_the_flat_grammars_names_are_not_walked_by_the_garbage_collector():
    # they live as long as the compiled grammar: a list is walked at every full collection (a
    # large schema's 48k references were tens of milliseconds inside a mask); a tuple of strings
    # stops being tracked after a collection, an array never is
    import gc

    from grammask import GrammarCompiler, TokenizerInfo

    info = TokenizerInfo([b"", b"a", b"b", b"ab"], stop_token_ids=[0])
    cg = GrammarCompiler(info, cache_enabled=False).compile_grammar('root ::= x x\nx ::= "a" | "b" | x "ab"')
    flat = cg.flat
    gc.collect()
    assert not gc.is_tracked(flat.name_src) and not gc.is_tracked(flat.name_ids)
    assert "x" in flat.names and all(isinstance(n, str) for n in flat.names)
