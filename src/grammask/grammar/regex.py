"""Regex front end: ECMA-262 pattern syntax compiled into a byte-level :class:`ExprSet` expression.

JSON Schema's ``pattern`` keyword and the grammar's regex lexemes use ECMA-262 regular
expressions. This module parses such a pattern with one recursive-descent parser
(:class:`_Parser`) and builds the expression directly in a hash-consed
:class:`~grammask.grammar.regexset.ExprSet`. Characters are Unicode code points; every
character or character class is compiled to the exact UTF-8 byte automaton of its code points
(surrogates D800-DFFF excluded, at most U+10FFFF), so the resulting expressions accept UTF-8
encoded strings only.

Entry points
    :func:`parse_regex`      the whole string must match (``fullmatch``); ``^``/``$`` hold at its
                             start/end only.
    :func:`search_regex`     JSON Schema ``pattern`` semantics (ECMA ``search``): the pattern may
                             match anywhere; ``^``/``$`` hold at the start/end of the input.
    :func:`char_class_expr`  a set of code point ranges as a UTF-8 byte automaton.
    :func:`any_utf8_char`, :func:`any_utf8_string`

Semantics follow ECMA-262 with the ``u`` flag for escapes (``\\u{...}``, surrogate pair escapes
combine, ``\\p{...}``) and Annex B leniency for literal braces and brackets (``a{``, ``{foo}``,
``]``, ``}``) and for ``-`` next to a class escape inside a class (``[\\w-z]``).
``\\d \\w \\s`` are the ECMA (ASCII / ECMA white space) sets, not Python's Unicode ones.

Anchors (no ``m`` flag) may stand anywhere: a sub-expression containing ``^`` or ``$`` is carried
as four expressions, one per context "the match starts at the start of the input" x "ends at its
end" (see :class:`_Ctx`), and concatenation, alternation and repetition combine those exactly
(e.g. ``(^a|b$)``, ``^$x*$``, ``(?:^|,)a``). Lookaheads ``(?=X)`` / ``(?!X)`` are supported at the
start of a top-level alternative (after an optional ``^``), where they constrain the rest of the
input from the match start: they become an intersection with (the complement of) "X matches a
prefix of the rest", which the derivative automaton handles like any other expression.

Unsupported (raise :class:`~grammask.errors.UnsupportedRegexError`): lookaheads elsewhere,
lookbehind, backreferences, word boundaries, inline flags, and Unicode properties other than
General_Category values (which are computed exactly from :mod:`unicodedata`, i.e. from the
Unicode version of the running Python).
"""
from __future__ import annotations

import functools
import re
import unicodedata
import weakref
from typing import Iterable

from ..errors import GrammarTooComplexError, RegexSyntaxError, UnsupportedRegexError
from .regexset import CONCAT, EMPTY, EPS, REPEAT, ExprSet

__all__ = [
    "MAX_REPEAT",
    "parse_regex",
    "search_regex",
    "char_class_expr",
    "any_utf8_char",
    "any_utf8_string",
    "unicode_property_ranges",
]

MAX_CODE_POINT = 0x10FFFF
SURROGATE_LO, SURROGATE_HI = 0xD800, 0xDFFF
#: Largest bound accepted in a ``{m,n}`` quantifier; larger ones raise GrammarTooComplexError.
MAX_REPEAT = 100_000

Ranges = tuple[tuple[int, int], ...]

# ---------------------------------------------------------------------------- code point sets

DIGIT: Ranges = ((0x30, 0x39),)
WORD: Ranges = ((0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A))
SPACE: Ranges = (
    (0x09, 0x0D),  # \t \n \v \f \r
    (0x20, 0x20),
    (0xA0, 0xA0),
    (0x1680, 0x1680),
    (0x2000, 0x200A),
    (0x2028, 0x2029),
    (0x202F, 0x202F),
    (0x205F, 0x205F),
    (0x3000, 0x3000),
    (0xFEFF, 0xFEFF),
)
LINE_TERMINATORS: Ranges = ((0x0A, 0x0A), (0x0D, 0x0D), (0x2028, 0x2029))


def _normalize(ranges: Iterable[tuple[int, int]]) -> Ranges:
    """Sort, clamp to ``0..0x10FFFF`` and merge overlapping or adjacent ranges."""
    out: list[list[int]] = []
    for lo, hi in sorted((max(lo, 0), min(hi, MAX_CODE_POINT)) for lo, hi in ranges):
        if lo > hi:
            continue
        if out and lo <= out[-1][1] + 1:
            if hi > out[-1][1]:
                out[-1][1] = hi
        else:
            out.append([lo, hi])
    return tuple((lo, hi) for lo, hi in out)


def _negate(ranges: Iterable[tuple[int, int]]) -> Ranges:
    """The complement of a range set within ``0..0x10FFFF``."""
    out = []
    nxt = 0
    for lo, hi in _normalize(ranges):
        if lo > nxt:
            out.append((nxt, lo - 1))
        nxt = hi + 1
    if nxt <= MAX_CODE_POINT:
        out.append((nxt, MAX_CODE_POINT))
    return tuple(out)


# ---------------------------------------------------------------------------- Unicode properties

_GC_LONG = {
    "Letter": "L", "Cased_Letter": "LC", "Uppercase_Letter": "Lu", "Lowercase_Letter": "Ll",
    "Titlecase_Letter": "Lt", "Modifier_Letter": "Lm", "Other_Letter": "Lo",
    "Mark": "M", "Combining_Mark": "M", "Nonspacing_Mark": "Mn", "Spacing_Mark": "Mc",
    "Enclosing_Mark": "Me",
    "Number": "N", "Decimal_Number": "Nd", "digit": "Nd", "Letter_Number": "Nl", "Other_Number": "No",
    "Punctuation": "P", "punct": "P", "Connector_Punctuation": "Pc", "Dash_Punctuation": "Pd",
    "Open_Punctuation": "Ps", "Close_Punctuation": "Pe", "Initial_Punctuation": "Pi",
    "Final_Punctuation": "Pf", "Other_Punctuation": "Po",
    "Symbol": "S", "Math_Symbol": "Sm", "Currency_Symbol": "Sc", "Modifier_Symbol": "Sk",
    "Other_Symbol": "So",
    "Separator": "Z", "Space_Separator": "Zs", "Line_Separator": "Zl", "Paragraph_Separator": "Zp",
    "Other": "C", "Control": "Cc", "cntrl": "Cc", "Format": "Cf", "Surrogate": "Cs",
    "Private_Use": "Co", "Unassigned": "Cn",
}


@functools.lru_cache(maxsize=1)
def _category_table() -> dict[str, Ranges]:
    """Code point ranges of every two-letter General_Category, from :mod:`unicodedata` (cached)."""
    cats = list(map(unicodedata.category, map(chr, range(MAX_CODE_POINT + 1))))
    table: dict[str, list[tuple[int, int]]] = {}
    start = 0
    prev = cats[0]
    for cp in range(1, MAX_CODE_POINT + 1):
        c = cats[cp]
        if c != prev:
            table.setdefault(prev, []).append((start, cp - 1))
            start, prev = cp, c
    table.setdefault(prev, []).append((start, MAX_CODE_POINT))
    return {k: tuple(v) for k, v in table.items()}


@functools.lru_cache(maxsize=256)
def unicode_property_ranges(name: str) -> Ranges | None:
    """Code point ranges of the Unicode property ``name`` as written in ``\\p{name}``, or None.

    Supported: General_Category values by short or long name (``L``, ``Lu``, ``Letter``,
    ``Uppercase_Letter``, ``LC``/``L&`` ...), optionally written ``General_Category=X`` or
    ``gc=X``, and the special properties ``Any``, ``ASCII`` and ``Assigned``.
    """
    if "=" in name:
        key, _, value = name.partition("=")
        if key not in ("General_Category", "gc"):
            return None
        name = value
    elif name == "Any":
        return ((0, MAX_CODE_POINT),)
    elif name == "ASCII":
        return ((0, 0x7F),)
    elif name == "Assigned":
        return _negate(_category_table().get("Cn", ()))
    code = _GC_LONG.get(name, name)
    if code == "L&":
        code = "LC"
    table = _category_table()
    if code == "LC":
        parts = ("Lu", "Ll", "Lt")
    elif len(code) == 1 and code in "LMNPSZC":
        parts = tuple(k for k in table if k[0] == code)
    elif len(code) == 2 and code[0] in "LMNPSZC" and code in _ALL_GC:
        parts = (code,)
    else:
        return None
    return _normalize(r for p in parts for r in table.get(p, ()))


_ALL_GC = frozenset(
    "Lu Ll Lt Lm Lo Mn Mc Me Nd Nl No Pc Pd Ps Pe Pi Pf Po Sm Sc Sk So Zs Zl Zp Cc Cf Cs Co Cn".split()
)

# ---------------------------------------------------------------------------- UTF-8 compilation

_UTF8_BOUNDS = (0x7F, 0x7FF, 0xFFFF)


def _utf8_split(lo: int, hi: int, out: list[tuple[tuple[int, int], ...]]) -> None:
    """Append to ``out`` the byte-range sequences whose union encodes exactly ``lo..hi``.

    Standard UTF-8 range splitting: cut out the surrogates, split where the encoded length
    changes, then split until every continuation position spans a full ``80-BF`` block or lies
    under one common prefix, so each piece is a product of per-byte ranges.
    """
    if lo > hi:
        return
    if lo <= SURROGATE_HI and hi >= SURROGATE_LO:
        _utf8_split(lo, SURROGATE_LO - 1, out)
        _utf8_split(SURROGATE_HI + 1, hi, out)
        return
    for b in _UTF8_BOUNDS:
        if lo <= b < hi:
            _utf8_split(lo, b, out)
            _utf8_split(b + 1, hi, out)
            return
    n = 1 if lo <= 0x7F else 2 if lo <= 0x7FF else 3 if lo <= 0xFFFF else 4
    for i in range(1, n):
        m = (1 << (6 * i)) - 1
        if lo & ~m != hi & ~m:
            if lo & m:
                _utf8_split(lo, lo | m, out)
                _utf8_split((lo | m) + 1, hi, out)
                return
            if hi & m != m:
                _utf8_split(lo, (hi & ~m) - 1, out)
                _utf8_split(hi & ~m, hi, out)
                return
    a, b = chr(lo).encode("utf-8"), chr(hi).encode("utf-8")
    out.append(tuple(zip(a, b)))


@functools.lru_cache(maxsize=1024)
def _utf8_sequences(ranges: Ranges) -> tuple[tuple[tuple[int, int], ...], ...]:
    out: list[tuple[tuple[int, int], ...]] = []
    for lo, hi in ranges:
        _utf8_split(lo, hi, out)
    return tuple(out)


def _build_trie(exprs: ExprSet, seqs: list[tuple[tuple[int, int], ...]]) -> int:
    """Factor byte-range sequences by common first range, then merge heads with equal tails."""
    groups: dict[tuple[int, int], list[tuple[tuple[int, int], ...]]] = {}
    ends = False
    for s in seqs:
        if not s:
            ends = True
        else:
            groups.setdefault(s[0], []).append(s[1:])
    by_tail: dict[int, int] = {}
    for (lo, hi), rests in groups.items():
        tail = _build_trie(exprs, rests)
        by_tail[tail] = by_tail.get(tail, 0) | (((1 << (hi + 1)) - 1) ^ ((1 << lo) - 1))
    parts = [exprs.concat(exprs.byteset(mask), tail) for tail, mask in by_tail.items()]
    if ends:
        parts.append(EPS)
    return exprs.alt(*parts)


_class_cache: "weakref.WeakKeyDictionary[ExprSet, dict[Ranges, int]]" = weakref.WeakKeyDictionary()


def char_class_expr(ranges: Iterable[tuple[int, int]], exprs: ExprSet) -> int:
    """One UTF-8 encoded code point out of ``ranges`` (inclusive ``(lo, hi)`` pairs).

    The automaton is exact: it accepts precisely the shortest-form UTF-8 encodings of the code
    points in the ranges, never a surrogate (D800-DFFF) nor anything above U+10FFFF.
    """
    key = _normalize(ranges)
    cache = _class_cache.get(exprs)
    if cache is None:
        cache = _class_cache[exprs] = {}
    e = cache.get(key)
    if e is None:
        e = cache[key] = _build_trie(exprs, list(_utf8_sequences(key)))
    return e


def any_utf8_char(exprs: ExprSet) -> int:
    """Any single Unicode scalar value, UTF-8 encoded."""
    return char_class_expr(((0, MAX_CODE_POINT),), exprs)


def any_utf8_string(exprs: ExprSet) -> int:
    """Any valid UTF-8 string (including the empty one)."""
    return exprs.star(any_utf8_char(exprs))


def _char_expr(cp: int, exprs: ExprSet) -> int:
    if SURROGATE_LO <= cp <= SURROGATE_HI:
        return EMPTY  # a lone surrogate is not a scalar value: no UTF-8 string contains it
    return exprs.literal(chr(cp).encode("utf-8"))


# ---------------------------------------------------------------------------- anchors


class _Ctx:
    """A sub-expression containing anchors: ``e[a][b]`` is its language when its match starts at
    the start of the input (``a``) or not, and ends at the end of the input (``b``) or not.
    Anchor-free sub-expressions stay plain expression ids (the same in every context)."""

    __slots__ = ("e",)

    def __init__(self, e):
        self.e = e

    @staticmethod
    def of(node) -> "_Ctx":
        return node if isinstance(node, _Ctx) else _Ctx(((node, node), (node, node)))


def _ctx_concat(x: ExprSet, p, q):
    """``p`` then ``q``. The split point is at the input start only if ``p`` matched nothing
    and the whole match starts there; at the input end only if ``q`` matched nothing and the
    whole match ends there."""
    if not isinstance(p, _Ctx) and not isinstance(q, _Ctx):
        return x.concat(p, q)
    if p is _START:  # ^q: q where the match starts the input
        Q = _Ctx.of(q).e
        return _Ctx(((EMPTY, EMPTY), Q[1]))
    if q is _END:    # p$: p where the match ends the input
        P = _Ctx.of(p).e
        return _Ctx(((EMPTY, P[0][1]), (EMPTY, P[1][1])))
    P, Q = _Ctx.of(p).e, _Ctx.of(q).e

    def eps(e):
        return EPS if x.nullable(e) else EMPTY

    out = [[EMPTY, EMPTY], [EMPTY, EMPTY]]
    for a in (0, 1):
        for b in (0, 1):
            out[a][b] = x.alt(
                x.concat(x.nonempty_part(P[a][0]), x.nonempty_part(Q[0][b])),  # both non-empty
                x.concat(eps(P[a][0]), x.nonempty_part(Q[a][b])),             # p empty
                x.concat(x.nonempty_part(P[a][b]), eps(Q[0][b])),             # q empty
                x.concat(eps(P[a][b]), eps(Q[a][b])))                        # both empty
    return _Ctx(tuple(tuple(r) for r in out))


def _ctx_alt(x: ExprSet, nodes: list):
    if not any(isinstance(n, _Ctx) for n in nodes):
        return x.alt(*nodes)
    es = [_Ctx.of(n).e for n in nodes]
    return _Ctx(tuple(tuple(x.alt(*[e[a][b] for e in es]) for b in (0, 1)) for a in (0, 1)))


def _ctx_star(x: ExprSet, node):
    """``node*``: empty iterations add nothing, so only the first non-empty iteration may start
    at the input start and only the last may end at the input end."""
    E = node.e

    def ne(a, b):
        return x.nonempty_part(E[a][b])

    mid = x.star(ne(0, 0))
    return _Ctx(tuple(tuple(x.alt(EPS, ne(a, b), x.concat(ne(a, 0), mid, ne(0, b)))
                            for b in (0, 1)) for a in (0, 1)))


def _ctx_repeat(x: ExprSet, node, lo: int, hi: int | None):
    if not isinstance(node, _Ctx):
        return x.repeat(node, lo, hi)
    if lo > 16 or (hi is not None and hi > 16):
        raise GrammarTooComplexError("a counted repetition of a group containing an anchor "
                                     "(more than 16 times) is not supported")
    out = EPS
    for _ in range(lo):
        out = _ctx_concat(x, out, node)
    if hi is None:
        return _ctx_concat(x, out, _ctx_star(x, node))
    opt = _ctx_alt(x, [EPS, node])
    for _ in range(hi - lo):
        out = _ctx_concat(x, out, opt)
    return out


_START = _Ctx(((EMPTY, EMPTY), (EPS, EPS)))  # ^: holds only where the match starts the input
_END = _Ctx(((EMPTY, EPS), (EMPTY, EPS)))    # $: holds only where the match ends the input


# ---------------------------------------------------------------------------- parser

_BRACES = re.compile(r"\{([0-9]+)(?:(,)([0-9]*))?\}")
_HEX = frozenset("0123456789abcdefABCDEF")
_GROUP_NAME = re.compile(r"(?:[^\W\d]|\$)[\w$]*")
_SIMPLE_ESCAPES = {"t": 0x09, "n": 0x0A, "v": 0x0B, "f": 0x0C, "r": 0x0D}
_CLASS_ESCAPES = {"d": DIGIT, "w": WORD, "s": SPACE}


class _Parser:
    """Recursive-descent parser of one ECMA-262 pattern, building :class:`ExprSet` nodes.

    Grammar (``top`` is the whole pattern)::

        top         := top_alt ('|' top_alt)*
        top_alt     := '^'? lookahead* sequence    lookaheads allowed only here
        lookahead   := '(?=' disjunction ')' | '(?!' disjunction ')'
        disjunction := sequence ('|' sequence)*
        sequence    := ('^' | '$' | atom quantifier?)*
        quantifier  := ('*' | '+' | '?' | '{' m (',' n?)? '}') '?'?
        atom        := '(' group ')' | '[' class ']' | '.' | '\\' escape | character

    A parsed node is an expression id, or a :class:`_Ctx` where it contains an anchor.

    Character sets are carried as normalized code point range tuples until they are compiled
    with :func:`char_class_expr`; single characters as ints.
    """

    def __init__(self, pattern: str, exprs: ExprSet):
        self.p = pattern
        self.n = len(pattern)
        self.i = 0
        self.x = exprs

    # -- helpers
    def _peek(self, k: int = 0) -> str:
        j = self.i + k
        return self.p[j] if j < self.n else ""

    def _syntax(self, message: str, pos: int) -> RegexSyntaxError:
        return RegexSyntaxError(message, self.p, pos)

    def _unsupported(self, construct: str, pos: int) -> UnsupportedRegexError:
        return UnsupportedRegexError(construct, self.p, pos)

    # -- structure
    def parse_top(self) -> list[tuple[list, object]]:
        """The top-level alternatives as ``(lookaheads, node)``; ``lookaheads`` lists
        ``(negative, node)`` for each ``(?=X)``/``(?!X)`` at the alternative's start."""
        alts = []
        while True:
            start = self._peek() == "^"
            if start:
                self._anchor()
            looks = []
            while self.p.startswith(("(?=", "(?!"), self.i):
                open_pos = self.i
                negative = self.p[self.i + 2] == "!"
                self.i += 3
                node = self._disjunction()
                if self._peek() != ")":
                    raise self._syntax("missing ')'", open_pos)
                self.i += 1
                if self._peek() in ("*", "+", "?", "{"):
                    raise self._unsupported("quantified lookahead", open_pos)
                looks.append((negative, node))
            node = self._sequence()
            alts.append((looks, _ctx_concat(self.x, _START, node) if start else node))
            c = self._peek()
            if c == "":
                return alts
            if c == ")":
                raise self._syntax("unmatched ')'", self.i)
            self.i += 1  # '|'

    def _disjunction(self):
        alts = [self._sequence()]
        while self._peek() == "|":
            self.i += 1
            alts.append(self._sequence())
        return _ctx_alt(self.x, alts)

    def _anchor(self) -> _Ctx:
        """``^`` or ``$`` at the cursor (an assertion: nothing may repeat it)."""
        c = self.p[self.i]
        self.i += 1
        nxt = self._peek()
        if nxt in ("*", "+", "?") or (nxt == "{" and self._braces(self.i) is not None):
            raise self._syntax("nothing to repeat", self.i)
        return _START if c == "^" else _END

    def _sequence(self):
        items = []
        while self.i < self.n:
            c = self.p[self.i]
            if c == "|" or c == ")":
                break
            items.append(self._anchor() if c in "^$" else self._quantifier(self._atom()))
        # runs of anchor-free items are concatenated as plain expressions
        out, run = EPS, []
        for item in items:
            if not isinstance(item, _Ctx):
                run.append(item)
                continue
            if run:
                out, run = _ctx_concat(self.x, out, self.x.concat(*run)), []
            out = _ctx_concat(self.x, out, item)
        return _ctx_concat(self.x, out, self.x.concat(*run)) if run else out

    def _braces(self, pos: int) -> tuple[int, int | None, int] | None:
        """``(lo, hi, end)`` of a valid ``{m}``/``{m,}``/``{m,n}`` at ``pos``, else None."""
        m = _BRACES.match(self.p, pos)
        if m is None:
            return None
        lo = int(m.group(1))
        hi = lo if m.group(2) is None else (int(m.group(3)) if m.group(3) else None)
        if hi is not None and hi < lo:
            raise self._syntax("numbers out of order in {} quantifier", pos)
        if lo > MAX_REPEAT or (hi is not None and hi > MAX_REPEAT):
            raise GrammarTooComplexError(
                f"quantifier bound above {MAX_REPEAT} at position {pos} in regex {self.p!r}"
            )
        return lo, hi, m.end()

    def _quantifier(self, atom):
        c = self._peek()
        if c == "*":
            lo, hi, end = 0, None, self.i + 1
        elif c == "+":
            lo, hi, end = 1, None, self.i + 1
        elif c == "?":
            lo, hi, end = 0, 1, self.i + 1
        elif c == "{":
            b = self._braces(self.i)
            if b is None:
                return atom  # Annex B: a '{' that is no quantifier is a literal
            lo, hi, end = b
        else:
            return atom
        self.i = end
        if self._peek() == "?":
            self.i += 1  # lazy: the same language
        return _ctx_repeat(self.x, atom, lo, hi)

    # -- atoms
    def _atom(self):
        pos = self.i
        c = self.p[pos]
        if c == "(":
            return self._group()
        if c == "[":
            neg, ranges = self._class()
            return char_class_expr(_negate(ranges) if neg else ranges, self.x)
        if c == ".":
            self.i += 1
            return char_class_expr(_negate(LINE_TERMINATORS), self.x)
        if c == "\\":
            return self._atom_escape()
        if c in "*+?" or (c == "{" and self._braces(pos) is not None):
            raise self._syntax("nothing to repeat", pos)
        self.i += 1
        return _char_expr(ord(c), self.x)

    def _group(self):
        open_pos = self.i
        self.i += 1
        if self._peek() == "?":
            nxt = self._peek(1)
            if nxt == ":":
                self.i += 2
            elif nxt in ("=", "!"):
                raise self._unsupported("lookahead not at the start of a top-level alternative",
                                        open_pos)
            elif nxt == "<" and self._peek(2) in ("=", "!"):
                raise self._unsupported("lookbehind", open_pos)
            elif nxt == "<" or (nxt == "P" and self._peek(2) == "<"):
                self.i += 2 if nxt == "<" else 3
                self._group_name(open_pos)
            elif nxt == "P" and self._peek(2) == "=":
                raise self._unsupported("backreference", open_pos)
            elif nxt.isalpha() or nxt == "-":
                raise self._unsupported("inline flags", open_pos)
            else:
                raise self._syntax("invalid group", open_pos)
        e = self._disjunction()
        if self._peek() != ")":
            raise self._syntax("missing ')'", open_pos)
        self.i += 1
        return e

    def _group_name(self, open_pos: int) -> None:
        m = _GROUP_NAME.match(self.p, self.i)
        if m is None or m.end() >= self.n or self.p[m.end()] != ">":
            raise self._syntax("invalid group name", open_pos)
        self.i = m.end() + 1

    def _class(self) -> tuple[bool, Ranges]:
        """Parse ``[...]`` at the cursor: ``(negated, ranges)``."""
        open_pos = self.i
        self.i += 1
        neg = False
        if self._peek() == "^":
            neg = True
            self.i += 1
        ranges: list[tuple[int, int]] = []
        while True:
            if self.i >= self.n:
                raise self._syntax("unterminated character class", open_pos)
            if self.p[self.i] == "]":
                self.i += 1
                return neg, _normalize(ranges)
            a_pos = self.i
            a = self._class_atom()
            if self._peek() == "-" and self._peek(1) not in ("]", ""):
                self.i += 1
                b = self._class_atom()
                if isinstance(a, tuple) or isinstance(b, tuple):
                    # Annex B: a class escape next to '-' makes the '-' a literal
                    for part in (a, ord("-"), b):
                        ranges.extend(part if isinstance(part, tuple) else [(part, part)])
                elif a > b:
                    raise self._syntax("range out of order in character class", a_pos)
                else:
                    ranges.append((a, b))
            else:
                ranges.extend(a if isinstance(a, tuple) else [(a, a)])

    def _class_atom(self) -> int | Ranges:
        c = self.p[self.i]
        if c == "\\":
            return self._escape(in_class=True)
        self.i += 1
        return ord(c)

    def _atom_escape(self) -> int:
        pos = self.i
        c = self._peek(1)
        if c in ("b", "B"):
            raise self._unsupported(f"word boundary \\{c}", pos)
        if c and c in "123456789":
            raise self._unsupported("backreference", pos)
        if c == "k":
            if self._peek(2) == "<":
                raise self._unsupported("backreference", pos)
            raise self._syntax("invalid escape \\k", pos)
        r = self._escape(in_class=False)
        if isinstance(r, tuple):
            return char_class_expr(r, self.x)
        return _char_expr(r, self.x)

    def _escape(self, in_class: bool) -> int | Ranges:
        """Parse an escape at the cursor (on the backslash): a code point or a range set."""
        pos = self.i
        if pos + 1 >= self.n:
            raise self._syntax("pattern ends with a lone backslash", pos)
        c = self.p[pos + 1]
        self.i = pos + 2
        if c in _CLASS_ESCAPES:
            return _CLASS_ESCAPES[c]
        if c.lower() in _CLASS_ESCAPES:
            return _negate(_CLASS_ESCAPES[c.lower()])
        if c in _SIMPLE_ESCAPES:
            return _SIMPLE_ESCAPES[c]
        if c == "p" or c == "P":
            return self._property(pos, negated=c == "P")
        if c == "0":
            if self._peek() and self._peek() in "0123456789":
                raise self._syntax("octal escape", pos)
            return 0
        if c == "x":
            h = self.p[self.i:self.i + 2]
            if len(h) != 2 or not set(h) <= _HEX:
                raise self._syntax("invalid \\x escape", pos)
            self.i += 2
            return int(h, 16)
        if c == "u":
            return self._unicode_escape(pos)
        if c == "c":
            letter = self._peek()
            if not ("a" <= letter <= "z" or "A" <= letter <= "Z"):
                raise self._syntax("invalid \\c escape", pos)
            self.i += 1
            return ord(letter) % 32
        if in_class and c == "b":
            return 0x08
        if c.isascii() and c.isalnum():
            if in_class and c in "123456789":
                raise self._syntax("octal escape in character class", pos)
            raise self._syntax(f"invalid escape \\{c}", pos)
        return ord(c)  # identity escape: \. \* \/ \- ...

    def _hex4(self, at: int) -> int | None:
        h = self.p[at:at + 4]
        if len(h) == 4 and set(h) <= _HEX:
            return int(h, 16)
        return None

    def _unicode_escape(self, pos: int) -> int:
        if self._peek() == "{":
            end = self.p.find("}", self.i)
            h = self.p[self.i + 1:end] if end >= 0 else ""
            if not h or not set(h) <= _HEX or int(h, 16) > MAX_CODE_POINT:
                raise self._syntax("invalid \\u{...} escape", pos)
            self.i = end + 1
            return int(h, 16)
        cp = self._hex4(self.i)
        if cp is None:
            raise self._syntax("invalid \\u escape", pos)
        self.i += 4
        if 0xD800 <= cp <= 0xDBFF and self.p.startswith("\\u", self.i):
            low = self._hex4(self.i + 2)
            if low is not None and 0xDC00 <= low <= 0xDFFF:
                self.i += 6
                return 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00)
        return cp

    def _property(self, pos: int, negated: bool) -> Ranges:
        if self._peek() != "{":
            raise self._syntax("invalid Unicode property escape", pos)
        end = self.p.find("}", self.i)
        if end < 0:
            raise self._syntax("unterminated Unicode property escape", pos)
        name = self.p[self.i + 1:end]
        ranges = unicode_property_ranges(name)
        if ranges is None:
            raise self._unsupported(f"Unicode property \\p{{{name}}}", pos)
        self.i = end + 1
        return _negate(ranges) if negated else ranges


# ---------------------------------------------------------------------------- entry points


def _parse(pattern: str, exprs: ExprSet) -> list[tuple[list, object]]:
    # parsed once per ExprSet (expressions are hash-consed there, so the result stays valid)
    cache = exprs.__dict__.setdefault("_regex_parse_cache", {})
    r = cache.get(pattern)
    if r is None:
        r = _Parser(pattern, exprs).parse_top()
        if len(cache) < 10_000:
            cache[pattern] = r
    return r


def _prefix_match(x: ExprSet, node, a: int) -> int:
    """The inputs (from a position that is the input start iff ``a``) of which ``node`` matches
    a prefix: a lookahead's condition, and the part of a search from the match start on."""
    E = _Ctx.of(node).e
    anything = any_utf8_string(x)
    if E[a][0] == E[a][1]:
        return x.concat(E[a][1], anything)
    return x.alt(E[a][1], x.concat(E[a][0], any_utf8_char(x), anything))


def _conditions(x: ExprSet, looks: list, a: int) -> list[int]:
    out = []
    for negative, node in looks:
        p = _prefix_match(x, node, a)
        out.append(x.complement(p) if negative else p)
    return out


def parse_regex(pattern: str, exprs: ExprSet) -> int:
    """The expression matching the strings that ``pattern`` fully matches (``^``/``$`` hold at
    the start/end of the string only; leading lookaheads constrain the whole string).

    Raises :class:`RegexSyntaxError`, :class:`UnsupportedRegexError` (both with a 0-based
    ``position``) or :class:`GrammarTooComplexError` (quantifier bound above :data:`MAX_REPEAT`).
    """
    parts = []
    for looks, node in _parse(pattern, exprs):
        e = _Ctx.of(node).e[1][1] if isinstance(node, _Ctx) else node
        parts.append(exprs.intersect(e, *_conditions(exprs, looks, 1)) if looks else e)
    return exprs.alt(*parts)


def _trim_search(x: ExprSet, e: int) -> int:
    """An expression ``f`` with ``.*f.*`` the language of ``.*e.*``: a counted repetition
    ``r{lo,hi}`` at either end of ``e`` becomes ``r{lo}`` (dropped when ``lo`` is 0), repeatedly.
    A string with a substring ``r^k b`` (``lo <= k <= hi``) has the substring ``r^lo b`` and the
    other way round, so the upper bound says nothing in a search; left as it was, it made every
    position of the search count (``[A-Za-z0-9-_.:]{1,255}`` in ``patternProperties``: 255
    intertwined counters, 0.2 s for the derivatives of one mask)."""
    items = []
    rest = e
    while x.kind[rest] == CONCAT:
        a, rest = x.args[rest]
        items.append(a)
    items.append(rest)
    changed = False
    for end in (0, -1):
        while items and x.kind[items[end]] == REPEAT:
            r, lo, hi = x.args[items[end]]
            if hi == lo:
                break
            changed = True
            if lo == 0:
                items.pop(end)
            else:
                items[end] = x.repeat(r, lo, lo)
                break
    return x.concat(*items) if changed else e


def search_regex(pattern: str, exprs: ExprSet) -> int:
    """The expression of JSON Schema ``pattern`` semantics (ECMA ``RegExp.prototype.test``).

    A string matches if the pattern matches any substring of it: an anchor-free alternative
    becomes ``.*alt.*`` over any UTF-8 string; one with anchors is split by whether its match
    starts at the input start and ends at the input end; a leading lookahead intersects the
    part from the match start to the end of the input with its condition.
    """
    x = exprs
    anything = any_utf8_string(x)
    plus = x.concat(any_utf8_char(x), anything)
    parts = []
    for looks, node in _parse(pattern, x):
        if not isinstance(node, _Ctx) and not looks:
            parts.append(x.concat(anything, _trim_search(x, node), anything))
            continue
        # the input from the match start on: a match, then anything
        at_start = x.intersect(_prefix_match(x, node, 1), *_conditions(x, looks, 1))
        later = x.intersect(_prefix_match(x, node, 0), *_conditions(x, looks, 0))
        if at_start == later:
            parts.append(x.concat(anything, later))
        else:
            parts.append(x.alt(at_start, x.concat(plus, later)))
    return x.alt(*parts)
