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
