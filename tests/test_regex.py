"""The ECMA-262 regex front end (grammask.grammar.regex) against the `regex` module as oracle.

Where ECMA and Python semantics differ (``\\d \\w \\s .``, ``$`` before a final newline,
``[]``/``[^]``, ``\\u{...}``, ``\\cX``, ``x{,n}``) the oracle pattern is written out by hand.
"""
from __future__ import annotations

import random
import re
import unicodedata

import pytest
import regex
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from grammask.errors import GrammarTooComplexError, RegexSyntaxError, UnsupportedRegexError
from grammask.grammar.regex import (
    any_utf8_char,
    any_utf8_string,
    char_class_expr,
    parse_regex,
    search_regex,
    unicode_property_ranges,
)
from grammask.grammar.regexset import ExprSet

ECMA_S = r"[\t\n\x0b\f\r \xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff]"
ECMA_NOT_S = ECMA_S.replace("[", "[^", 1)
DOT = r"[^\n\r\u2028\u2029]"

# (ECMA pattern, equivalent pattern for the `regex` module or None when identical)
CASES: list[tuple[str, str | None]] = [
    ("abc", None),
    ("", None),
    ("a|b|cd|", None),
    ("(ab)*c", None),
    ("(?:a|bc)+d?", None),
    ("((a|b)(c|d)?)+", None),
    ("(?<name>ab)+c", None),
    ("a{2}", None),
    ("a{2,}b", None),
    ("a{1,3}b{0,2}", None),
    ("(ab){0,2}c{3}", None),
    ("a*?b+?c??(de){1,2}?", None),
    ("[a-c]+[^a-c]", None),
    ("[^a]é?", None),
    ("[^\u00e9-\u00ff]+", None),
    (".", DOT),
    ("a.c.*", f"a{DOT}c{DOT}*"),
    (r"\d+-\d{2}", r"[0-9]+-[0-9]{2}"),
    (r"\w+", r"[A-Za-z0-9_]+"),
    (r"\s+x", ECMA_S + "+x"),
    (r"\D\W\S", rf"[^0-9][^A-Za-z0-9_]{ECMA_NOT_S}"),
    (r"[\d\s_-]+", r"[0-9\t\n\x0b\f\r \xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff_-]+"),
    (r"[^\d\s]+", r"[^0-9\t\n\x0b\f\r \xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff]+"),
    (r"[\w-z]", r"[A-Za-z0-9_\-z]"),
    (r"\p{L}+", None),
    (r"\p{Lu}\p{Ll}*", None),
    (r"\p{N}|\p{Nd}x", None),
    (r"\P{L}+", None),
    (r"[\p{Lu}\d]+", r"[\p{Lu}0-9]+"),
    ("é+|中文|😀", None),
    ("[é-ü]+|[α-ω]+", None),
    (r"[\u0100-\u07ff\u0800-\uffff]", r"[\u0100-\u07ff\u0800-\ud7ff\ue000-\uffff]"),
    ("[😀-🙏]+", None),
    (r"\u{1F600}\ud83d\ude01\u00e9", "\U0001f600\U0001f601\u00e9"),
    (r"\x41\u0042\t\n\v\f\r\0", None),
    (r"\cJ\cm", r"\n\r"),
    (r"a\/b\.\*\(\)\[\]\{\}\|\?\+\^\$\\\-", r"a/b\.\*\(\)\[\]\{\}\|\?\+\^\$\\-"),
    ("^ab$", None),
    ("^a$|^b$|c", None),
    ("a{", r"a\{"),
    ("{foo}", r"\{foo\}"),
    ("a{,3}", r"a\{,3\}"),
    ("x{2,3", r"x\{2,3"),
    ("a]b}", r"a\]b\}"),
    ("[]a", "(?!)"),
    ("[^]a", r"[\s\S]a"),
    (r"[\b]", r"\x08"),
    ("[-a][a-]", r"[\-a][a\-]"),
    (r"[\]\\]", None),
]

EXTRA_CHARS = "ab0_ \n\r\t\x0bé中٣\u00a0\u2028😀-{"


def _alphabet(pattern: str) -> list[str]:
    chars = {c for c in pattern if c not in "\\()[]|*+?^$"}
    return sorted(chars | set(EXTRA_CHARS))


# `regex`'s partial fullmatch is wrong with lazy quantifiers (it accepts 'bx' for 'b+?c'), so
# prefix checks use the greedy form, which has the same language.
GREEDY = {"a*?b+?c??(de){1,2}?": "a*b+c?(de){1,2}"}


def _unicode_versions_differ(oracle: str, s: str) -> bool:
    """`regex` may know a newer Unicode than `unicodedata`: property classes differ on new chars."""
    return ("\\p" in oracle or "\\P" in oracle) and any(unicodedata.category(c) == "Cn" for c in s)


def _check(x: ExprSet, e: int, oracle: str, s: str) -> None:
    if _unicode_versions_differ(oracle, s):
        return
    want = regex.fullmatch(oracle, s) is not None
    assert x.matches(e, s.encode()) == want, (oracle, s)
    want_prefix = regex.fullmatch(GREEDY.get(oracle, oracle), s, partial=True) is not None
    assert x.is_prefix(e, s.encode()) == want_prefix, ("prefix", oracle, s)


@pytest.fixture(scope="module")
def compiled():
    x = ExprSet()
    return x, {p: parse_regex(p, x) for p, _ in CASES}


@pytest.mark.parametrize("pattern,oracle", CASES)
def test_random_strings_match_oracle(compiled, pattern, oracle):
    x, table = compiled
    e = table[pattern]
    oracle = oracle if oracle is not None else pattern
    rnd = random.Random(pattern)
    alphabet = _alphabet(pattern)
    for _ in range(250):
        s = "".join(rnd.choice(alphabet) for _ in range(rnd.randint(0, 7)))
        _check(x, e, oracle, s)


# re-compatible stand-ins used only to *generate* candidates where the oracle needs `regex`
GENERATORS = {
    "[]a": "a",
    "(?<name>ab)+c": "(?P<name>ab)+c",
    r"\p{L}+": "[a-zA-Zéß中Ωж]+",
    r"\p{Lu}\p{Ll}*": "[A-ZÉΩЖ][a-zéßωж]*",
    r"\p{N}|\p{Nd}x": "[0-9٣½Ⅻ]|[0-9٣]x",
    r"\P{L}+": "[^a-zA-Zé]+",
    r"[\p{Lu}\d]+": "[A-ZÉΩ0-9]+",
}


@pytest.mark.parametrize("pattern,oracle", CASES)
def test_sampled_strings_match_oracle(compiled, pattern, oracle):
    x, table = compiled
    e = table[pattern]
    oracle = oracle if oracle is not None else pattern
    alphabet = _alphabet(pattern)

    @settings(max_examples=12, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(s=st.from_regex(GENERATORS.get(pattern, oracle), fullmatch=True), i=st.integers(0, 50),
           c=st.sampled_from(alphabet))
    def run(s, i, c):
        _check(x, e, oracle, s)
        # near misses: every single-character deletion and one insertion
        for j in range(len(s)):
            _check(x, e, oracle, s[:j] + s[j + 1:])
        i = min(i, len(s))
        _check(x, e, oracle, s[:i] + c + s[i:])
        # an incomplete trailing UTF-8 sequence of a member is still a prefix
        b = s.encode()
        if regex.fullmatch(oracle, s) and b and b[-1] >= 0x80:
            assert x.is_prefix(e, b[:-1])
            assert not x.matches(e, b[:-1])

    run()


def _walk(x: ExprSet, e: int, rnd: random.Random, max_len: int = 12) -> bytes | None:
    """A random member of ``e`` built by following its derivatives (None if the walk got lost)."""
    out = bytearray()
    while len(out) <= 4 * max_len:
        if x.nullable(e) and (len(out) >= max_len or rnd.random() < 0.3):
            return bytes(out)
        tr = x.transitions(e)
        if not tr:
            return bytes(out) if x.nullable(e) else None
        m, e = rnd.choice(tr)
        out.append(rnd.choice([b for b in range(256) if m >> b & 1]))
    return None


@pytest.mark.parametrize("pattern,oracle", CASES)
def test_generated_members_match_oracle(compiled, pattern, oracle):
    """Strings generated from our automaton are valid UTF-8 and accepted by the oracle."""
    x, table = compiled
    e = table[pattern]
    oracle = oracle if oracle is not None else pattern
    rnd = random.Random(pattern)
    n = 0
    for _ in range(60):
        b = _walk(x, e, rnd)
        if b is None:
            continue
        s = b.decode("utf-8")
        assert _unicode_versions_differ(oracle, s) or regex.fullmatch(oracle, s), (pattern, s)
        n += 1
    assert n > 0 or not x.alive(e)


def test_ecma_class_escapes_are_ascii():
    x = ExprSet()
    d, w, s, dot = (parse_regex(p, x) for p in (r"\d", r"\w", r"\s", "."))
    assert x.matches(d, "7") and not x.matches(d, "٣") and not x.matches(d, "１")
    assert x.matches(w, "_") and not x.matches(w, "é") and not x.matches(w, "٣")
    for c in "\t\n\x0b\x0c\r \u00a0\u1680\u2000\u200a\u2028\u2029\u202f\u205f\u3000\ufeff":
        assert x.matches(s, c), repr(c)
    for c in "\u0085\u200b\x1c\x1f\u180ea":
        assert not x.matches(s, c), repr(c)
    for c in "\n\r\u2028\u2029":
        assert not x.matches(dot, c)
    for c in "\x0b\x0c\u0085é😀\x00":
        assert x.matches(dot, c)
    nd, nw = parse_regex(r"\D", x), parse_regex(r"\W", x)
    assert x.matches(nd, "٣") and x.matches(nw, "é") and not x.matches(nd, "3")


# ---------------------------------------------------------------------------- search semantics

SEARCH_CASES: list[tuple[str, str | None]] = [
    ("ab", None),
    ("^ab", None),
    ("ab$", r"ab\Z"),
    ("^ab$", r"^ab\Z"),
    ("a|^b", None),
    ("^a$|^b$|c", r"^a\Z|^b\Z|c"),
    ("^(a|b)+$", r"^(a|b)+\Z"),
    (r"\d{2}", "[0-9]{2}"),
    ("é.", "é" + DOT),
    ("", None),
    ("^", None),
    ("$", r"\Z"),
    ("[^a]$", r"[^a]\Z"),
    # anchors anywhere
    ("(^a)", None),
    ("(a$)", r"(a\Z)"),
    ("a^b", None),
    ("a$b", r"a\Zb"),
    ("^$a*$", r"^\Za*\Z"),
    ("(?:^|0)a", None),
    ("(^a|b$)", r"(^a|b\Z)"),
    ("(a|^)b", None),
    ("(^a|b)*9", None),
    ("(a$|b)*", r"(a\Z|b)*"),
    ("(^a)+b", None),
    ("(^|a){2}b", None),
    ("x?(^|$)", r"x?(^|\Z)"),
    # counted repetitions at the ends of a search: only their lower bound matters
    ("[a0-9]{1,255}", "[a0-9]"),
    ("a{2,5}", None),
    ("a{0,3}b{1,2}", None),
    ("b{2,}a{0,4}", None),
    ("(ab){1,3}é{2,9}", None),
    ("a{3,4}b|é{0,2}", None),
    ("a{2,2}9{1,2}a{0,1}", None),
    # lookaheads at the start of a top-level alternative
    ("^(?!ab)[ab]*$", r"^(?!ab)[ab]*\Z"),
    ("(?!a)b", None),
    ("(?=a)[ab]+", None),
    ("^(?!a$|b$).*$", r"^(?!a\Z|b\Z).*\Z"),
    ("^(?!^a|0)(?=.*b).", None),
    ("(?!a|é)..|^9", None),
]


@pytest.mark.parametrize("pattern,oracle", SEARCH_CASES)
def test_search_matches_oracle(pattern, oracle):
    x = ExprSet()
    e = search_regex(pattern, x)
    oracle = oracle if oracle is not None else pattern
    rnd = random.Random(pattern)
    alphabet = list("ab0\né中") + ["9"]
    for _ in range(300):
        s = "".join(rnd.choice(alphabet) for _ in range(rnd.randint(0, 6)))
        assert x.matches(e, s.encode()) == (regex.search(oracle, s) is not None), (pattern, s)


def test_search_keeps_only_the_lower_bound_of_end_repetitions():
    """``.*r{lo,hi}.*`` is ``.*r{lo}.*`` (the oracle cases above check the languages); here, that
    the search's expression is the trimmed one, so its derivatives carry no counter."""
    x = ExprSet()
    assert search_regex("[A-Za-z0-9-_.:]{1,255}", x) == search_regex("[A-Za-z0-9-_.:]", x)
    assert search_regex("a{0,3}b{2,7}", x) == search_regex("b{2}", x)
    assert search_regex("x{0,4}", x) == search_regex("", x)
    assert search_regex("^a{1,9}", x) != search_regex("^a", x)   # anchored: the bound matters


def test_parse_ignores_anchors():
    x = ExprSet()
    assert parse_regex("^a$|^b$", x) == parse_regex("a|b", x)
    assert parse_regex("^(?:ab)$", x) == parse_regex("ab", x)


@pytest.mark.parametrize("pattern,oracle", [
    ("(^a|b)(c|$)", r"(^a|b)(c|\Z)"),
    ("a$|b", r"a\Z|b"),
    ("(?:a|^b)+", None),
    ("(?!ab)[ab]*", None),
    ("(?=.*0)(?!.*9)[0-9a]{0,4}", None),
    ("a^", None),
])
def test_fullmatch_with_anchors_and_lookaheads(pattern, oracle):
    x = ExprSet()
    e = parse_regex(pattern, x)
    oracle = oracle if oracle is not None else pattern
    rnd = random.Random(pattern)
    alphabet = list("ab09c")
    for _ in range(400):
        s = "".join(rnd.choice(alphabet) for _ in range(rnd.randint(0, 6)))
        assert x.matches(e, s.encode()) == (regex.fullmatch(oracle, s) is not None), (pattern, s)


# ---------------------------------------------------------------------------- errors

ERRORS = [
    ("a(?!b)", UnsupportedRegexError, 1),
    ("(a(?=b))", UnsupportedRegexError, 2),
    ("(?=a)*b", UnsupportedRegexError, 0),
    ("(?<=a)b", UnsupportedRegexError, 0),
    ("x(?<!a)b", UnsupportedRegexError, 1),
    (r"(a)\1", UnsupportedRegexError, 3),
    (r"(a)x\9", UnsupportedRegexError, 4),
    (r"(?<n>a)\k<n>", UnsupportedRegexError, 7),
    (r"(?P<n>a)(?P=n)", UnsupportedRegexError, 8),
    (r"a\b", UnsupportedRegexError, 1),
    (r"\Ba", UnsupportedRegexError, 0),
    ("(?i)a", UnsupportedRegexError, 0),
    ("a$*", RegexSyntaxError, 2),
    ("(^{2})", RegexSyntaxError, 2),
    (r"\p{Script=Greek}", UnsupportedRegexError, 0),
    (r"x\p{Alphabetic}", UnsupportedRegexError, 1),
    ("(a", RegexSyntaxError, 0),
    ("a(b(c)", RegexSyntaxError, 1),
    ("a)", RegexSyntaxError, 1),
    ("ab|c)d", RegexSyntaxError, 4),
    ("a{2,1}", RegexSyntaxError, 1),
    ("*a", RegexSyntaxError, 0),
    ("a|+", RegexSyntaxError, 2),
    ("(?:?)", RegexSyntaxError, 3),
    ("a**", RegexSyntaxError, 2),
    ("a{2}{3}", RegexSyntaxError, 4),
    ("{2}", RegexSyntaxError, 0),
    ("^*", RegexSyntaxError, 1),
    ("a\\", RegexSyntaxError, 1),
    ("[a\\", RegexSyntaxError, 2),
    ("[a", RegexSyntaxError, 0),
    ("x[^", RegexSyntaxError, 1),
    ("[z-a]", RegexSyntaxError, 1),
    (r"\x4", RegexSyntaxError, 0),
    (r"a\u12", RegexSyntaxError, 1),
    (r"\u{110000}", RegexSyntaxError, 0),
    (r"\u{}", RegexSyntaxError, 0),
    (r"\c1", RegexSyntaxError, 0),
    (r"\q", RegexSyntaxError, 0),
    (r"\Z", RegexSyntaxError, 0),
    (r"\01", RegexSyntaxError, 0),
    (r"\p{L", RegexSyntaxError, 0),
    (r"\pL", RegexSyntaxError, 0),
    ("(?<1a>x)", RegexSyntaxError, 0),
    ("(?<ab", RegexSyntaxError, 0),
    ("(?", RegexSyntaxError, 0),
]


@pytest.mark.parametrize("pattern,exc,pos", ERRORS)
def test_errors(pattern, exc, pos):
    with pytest.raises(exc) as info:
        parse_regex(pattern, ExprSet())
    assert type(info.value) is exc
    assert info.value.position == pos
    assert info.value.pattern == pattern
    if exc is UnsupportedRegexError:
        assert info.value.construct


def test_unsupported_construct_names():
    for pattern, name in [("b(?=a)", "lookahead"), ("(?<!a)", "lookbehind"), (r"(a)\1", "backreference"),
                          (r"\b", "word boundary")]:
        with pytest.raises(UnsupportedRegexError) as info:
            parse_regex(pattern, ExprSet())
        assert name in info.value.construct


def test_quantifier_bounds():
    x = ExprSet()
    e = parse_regex("a{100000}", x)
    assert x.matches(e, b"a" * 100000) and not x.matches(e, b"a" * 99999)
    for p in ("a{100001}", "a{0,100001}", "a{99999999999999999999,}", "{100001}"):
        with pytest.raises(GrammarTooComplexError):
            parse_regex(p, x)
    with pytest.raises(GrammarTooComplexError):
        search_regex("(ab){3,200000}", x)


def test_errors_are_typed_in_search():
    with pytest.raises(UnsupportedRegexError):
        search_regex("a(?=b)", ExprSet())
    with pytest.raises(RegexSyntaxError):
        search_regex("a(", ExprSet())


# ---------------------------------------------------------------------------- UTF-8 classes

WINDOWS = [(0, 0x100), (0x780, 0x880), (0xD780, 0xE080), (0xFF80, 0x10080), (0x10FF80, 0x10FFFF)]
RANGE_SETS = [
    [(0x41, 0x5A)],
    [(0x7F, 0x80)],
    [(0x50, 0x850)],
    [(0x7FF, 0x800), (0xFFFF, 0x10000)],
    [(0x7C0, 0x7FF)],
    [(0x801, 0xFFFE)],
    [(0xD7FF, 0xE000)],
    [(0xD800, 0xDFFF)],
    [(0xFFC0, 0x1003F), (0x10FFFE, 0x10FFFF)],
    [(0, 0x10FFFF)],
    [(0x10000, 0x10FFFF)],
    [(0x20, 0x20), (0x22, 0x22), (0xE9, 0xE9), (0x10001, 0x10001)],
]


def _in(ranges, cp):
    return not (0xD800 <= cp <= 0xDFFF) and any(lo <= cp <= hi for lo, hi in ranges)


def _encode(cp: int) -> bytes:
    return chr(cp).encode("utf-8", "surrogatepass")


@pytest.mark.parametrize("ranges", RANGE_SETS, ids=str)
def test_char_class_exact_on_windows(ranges):
    x = ExprSet()
    e = char_class_expr(ranges, x)
    for lo, hi in WINDOWS:
        for cp in range(lo, hi + 1):
            assert x.matches(e, _encode(cp)) == _in(ranges, cp), hex(cp)
    assert not x.matches(e, b"")


def test_char_class_random_ranges():
    rnd = random.Random(7)
    x = ExprSet()
    for _ in range(25):
        pts = sorted(rnd.choice([rnd.randrange(0x110000), rnd.randrange(0x800), rnd.randrange(0x10000)])
                     for _ in range(2 * rnd.randint(1, 4)))
        ranges = list(zip(pts[::2], pts[1::2]))
        e = char_class_expr(ranges, x)
        probes = {p + d for p in pts for d in (-1, 0, 1)} | {rnd.randrange(0x110000) for _ in range(200)}
        for cp in probes:
            if 0 <= cp <= 0x10FFFF:
                assert x.matches(e, _encode(cp)) == _in(ranges, cp), (ranges, hex(cp))


BAD_UTF8 = [
    b"\xed\xa0\x80", b"\xed\xbf\xbf", b"\xed\xa0\xbd\xed\xb8\x80",  # surrogates (CESU)
    b"\xc0\x80", b"\xc1\xbf", b"\xe0\x80\x80", b"\xe0\x9f\xbf",  # overlong
    b"\xf0\x80\x80\x80", b"\xf0\x8f\xbf\xbf",
    b"\xf4\x90\x80\x80", b"\xf5\x80\x80\x80", b"\xff", b"\x80", b"\xc3",  # too large / stray
]


def test_no_class_matches_invalid_utf8():
    x = ExprSet()
    exprs = [any_utf8_char(x), char_class_expr([(0xD000, 0xE000)], x), parse_regex("[^a]", x),
             parse_regex(".", x), parse_regex(r"\D", x), parse_regex(r"\S", x), parse_regex(r"\P{L}", x),
             parse_regex("[^]", x), parse_regex(r"[\ud800-\udfff]", x)]
    for e in exprs:
        for b in BAD_UTF8:
            assert not x.matches(e, b), (x.to_str(e)[:60], b)
    assert parse_regex(r"[\ud800-\udfff]", x) == 0
    assert parse_regex("\ud800", x) == 0


def test_any_utf8_string_is_valid_utf8():
    x = ExprSet()
    e = any_utf8_string(x)
    rnd = random.Random(3)
    lead = (0x41, 0xC0, 0xC2, 0xDF, 0xE0, 0xED, 0xEF, 0xF0, 0xF4, 0xF5)
    pieces = [bytes([b]) for b in lead + (0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF)]
    for _ in range(3000):
        b = b"".join(rnd.choice(pieces) for _ in range(rnd.randint(0, 6)))
        try:
            b.decode("utf-8")
            ok = True
        except UnicodeDecodeError:
            ok = False
        assert x.matches(e, b) == ok, b


@pytest.mark.parametrize("name", ["L", "Lu", "Ll", "N", "Nd", "P", "Zs", "C", "Letter", "gc=Lu", "LC"])
def test_unicode_properties_exact(name):
    x = ExprSet()
    e = parse_regex(rf"\p{{{name}}}", x)
    ne = parse_regex(rf"\P{{{name}}}", x)
    code = {"Letter": "L", "gc=Lu": "Lu"}.get(name, name)
    cps = list(range(0, 0x3000)) + list(range(0x3000, 0x110000, 97))
    for cp in cps:
        cat = unicodedata.category(chr(cp))
        want = cat in ("Lu", "Ll", "Lt") if code == "LC" else cat.startswith(code)
        if cat == "Cs":
            want = False
            assert not x.matches(ne, _encode(cp))
        else:
            assert x.matches(ne, _encode(cp)) != want, (name, hex(cp))
        assert x.matches(e, _encode(cp)) == want, (name, hex(cp))


def test_unicode_property_ranges_unknown():
    assert unicode_property_ranges("Xx") is None
    assert unicode_property_ranges("Script=Latin") is None
    assert unicode_property_ranges("ASCII") == ((0, 0x7F),)
