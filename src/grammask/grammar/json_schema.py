"""JSON Schema to a lexeme grammar (``GrammarCompiler.compile_json_schema``).

The compiler works in two stages.

1. **Schema -> IR.** Every (sub)schema becomes a node of a small algebra: :class:`Typed` (per JSON
   type: allowed or not, with that type's constraints: :class:`NumC`, :class:`StrC`,
   :class:`ArrC`, :class:`ObjC`), :class:`Union` (``anyOf``, ``enum``, disjoint ``oneOf``) and
   :class:`Ref` (a lazily resolved ``$ref``; recursive schemas stay finite). ``allOf``,
   ``$ref`` siblings (2019-09+), ``if``/``then``/``else``, ``not`` and ``dependent*`` are
   computed as real intersections/complements in this algebra (:meth:`_Compiler.isect`,
   :meth:`_Compiler.negate`); keyword combinations it cannot express exactly raise
   :class:`~grammask.errors.UnsupportedSchemaError` (naming the keyword and its JSON pointer),
   or with ``lenient=True`` are dropped with a warning. Nothing is dropped silently.

2. **IR -> grammar.** Each node becomes a nonterminal. Terminals are complete JSON tokens with
   their leading whitespace (see :mod:`.builtin`): a string (its regex carries the pattern /
   format / length / enum constraints, over the JSON-escaped form of the string), a number (an
   exact digit-level regex of its range, :mod:`.json_numeric`), ``true``/``false``/``null``,
   punctuation, and an object key merged with its colon (``ws "key" ws :``, safe because only key
   lexemes and ``}`` are live where a key can start, and string tokens are prefix-free). These are
   greedy-safe, so the grammar is lowered with ``check_lexemes=False``.

Semantics and choices
    * JSON Schema semantics by default: ``additionalProperties`` defaults to any value (the key of
      an additional property must differ from every declared name: the key lexeme is intersected
      with the complement of those names), optional properties optional. Keys are spelled the
      way ``json.dumps`` spells them: raw printable ASCII, the short escapes, ``\\uXXXX`` (or raw
      UTF-8) for control and non-ASCII characters; a key spelled with ``\\uXXXX`` for a
      printable ASCII character is not generated (so no spelling of a declared name can pass
      as an additional key).
      ``strict=True`` (OpenAI structured outputs): in every schema with ``properties``, every
      declared property is required and ``additionalProperties`` defaults to false.
    * Object members: declared properties appear in ``properties`` order (required ones must
      appear); additional/pattern properties may be interleaved anywhere. With
      ``compile_json_schema(..., property_order="any")`` objects of at most 10 declared
      properties accept them in any order. ``allOf`` (and ``$ref``
      siblings) merge properties in first-appearance order: the schema's own ``properties``, then
      its ``$ref`` target, then ``allOf`` branches in order; then required-but-undeclared names.
    * Integers are generated without fraction or exponent (``1``, not ``1.0``/``1e0``); bounded
      numbers use plain decimals and normalised scientific notation (see :mod:`.json_numeric`).
    * String constraints (``pattern``, ``format``, lengths) are enforced on the decoded value;
      a constrained string accepts raw characters and the usual JSON escapes for ASCII (and
      ``\\uXXXX`` for control characters); lengths count code points (a surrogate-pair escape is
      one character). ``enum``/``const`` strings also accept ``\\uXXXX`` spellings of non-ASCII.
    * Unknown ``format`` values are annotations (JSON Schema 2019-09+) and are ignored; OpenAPI
      integer formats (``int32``...) are enforced as ranges on integers.
    * ``$ref`` siblings are ignored under drafts 3-7 (as those drafts specify) and applied from
      2019-09 on (the default when ``$schema`` is absent). Draft 3 ``required: true``,
      ``divisibleBy``, ``extends`` and ``disallow`` (of type names) are understood.
    * Keywords this module does not know are ignored, as JSON Schema specifies for unknown
      keywords; annotations (``title``, ``default``, ``examples``...) are ignored.
    * Bounded non-integer numbers keep at most 15 significant digits and exponents within
      +-300, so that validators comparing doubles agree with the exact comparison.
    * ``indent=N``: whitespace exactly as ``json.dumps(obj, indent=N)``.
    * Compile work is bounded (union sizes, repetition unrolling, property counts, regex states):
      beyond the bounds :class:`~grammask.errors.GrammarTooComplexError` is raised.

Keyword support
    exact: ``type``, ``enum``, ``const``, ``properties``, ``required``, ``additionalProperties``,
    ``patternProperties``, ``propertyNames``, ``min/maxProperties``, ``items``/``prefixItems``/
    ``additionalItems``, ``min/maxItems``, ``contains``/``min/maxContains`` (up to 3 clauses),
    ``min/maxLength``, ``pattern``, ``format`` (see :mod:`.json_formats`), numeric bounds (both
    spellings of exclusive bounds), ``multipleOf`` (finite decimals; remainder automata up to 25
    states for unbounded integer ranges), ``allOf``, ``anyOf``, ``oneOf`` (disjoint branches, or
    each branch minus the others when their complements are computable), ``not``,
    ``if``/``then``/``else``, ``dependentRequired``/``dependentSchemas``/``dependencies``,
    ``$ref`` (JSON pointers, ``$defs``/``definitions``, ``$anchor``, ``$id``-relative, recursive),
    ``$dynamicRef``/``$recursiveRef`` (resolved statically), boolean schemas.
    approximated from below (never accepting an invalid document): ``unevaluatedProperties``/
    ``unevaluatedItems`` (keys/items evaluated by the schema and its in-place applicators only).
    unsupported (``UnsupportedSchemaError``, or ignored with a warning when ``lenient=True``):
    ``uniqueItems`` except for arrays of at most 10 distinct scalar values or ``maxItems <= 1``;
    regex constructs :mod:`.regex` rejects (lookaround, backreferences...); complements the
    algebra cannot express (e.g. ``not`` of ``uniqueItems`` or fractional ``multipleOf``);
    remote ``$ref`` (nothing is fetched).
    Duplicate keys are not prevented among additional properties (a context-free grammar
    cannot), declared properties appear at most once.
"""
from __future__ import annotations

import json
import warnings
from dataclasses import dataclass, field, replace
from fractions import Fraction
from functools import lru_cache
from urllib.parse import unquote, urldefrag, urljoin

from ..errors import (
    EmptyLanguageError,
    GrammarTooComplexError,
    InvalidSchemaError,
    RegexSyntaxError,
    UnsupportedRegexError,
    UnsupportedSchemaError,
)
from .builtin import DEFAULT_MAX_WHITESPACE, JsonLexemes, whitespace_expr
from .cfg import Grammar
from .json_formats import INT_FORMATS, format_expr
from .json_numeric import number_regex, range_is_empty, to_fraction
from .regexset import AND, BYTES, CONCAT, EMPTY, EPS, NOT, OR, REPEAT, ExprSet

__all__ = ["json_schema_grammar", "normalize_schema_input"]


@lru_cache(maxsize=4096)
def _urldefrag(url: str) -> tuple[str, str]:
    """``urldefrag`` (slow in CPython) for the few base URIs a schema has."""
    r = urldefrag(url)
    return r[0], r[1]

MAX_UNION = 2000            # options of one union (after distributing intersections)
MAX_UNROLL = 10_000         # minItems/maxItems/minProperties... unrolled into rules
MAX_PATTERN_REGIONS = 64    # key regions of patternProperties combinations
MAX_OBJECT_STATES = 100_000
MAX_UNIQUE_VALUES = 10
MAX_UNFOLD_DEPTH = 200
MAX_RULES = 500_000
MAX_NEGATED_REGEXES = 3
MAX_INTERSECTIONS = 200_000  # subschema intersections one compile may compute (bounds its time)
MAX_EMPTY_CHECK_STATES = 2000   # regex emptiness checks while simplifying (unknown beyond)

ALL_TYPES = ("null", "boolean", "number", "integer", "string", "array", "object")

ANNOTATIONS = frozenset({
    "$schema", "$id", "id", "$comment", "title", "description", "default", "examples", "example",
    "deprecated", "readOnly", "writeOnly", "contentEncoding", "contentMediaType", "contentSchema",
    "$vocabulary", "$anchor", "$dynamicAnchor", "$recursiveAnchor", "definitions", "$defs",
    "discriminator", "nullable", "xml", "externalDocs",
})


# ====================================================================== input


def normalize_schema_input(schema) -> dict | bool:
    """A schema as a dict or bool: accepts a dict, a bool, JSON text (str/bytes) or a pydantic
    model class (``model_json_schema()``)."""
    if isinstance(schema, bool) or isinstance(schema, dict):
        return schema
    if isinstance(schema, (bytes, bytearray, memoryview)):
        schema = bytes(schema).decode("utf-8", errors="strict")
    if isinstance(schema, str):
        try:
            obj = json.loads(schema)
        except ValueError as e:
            raise InvalidSchemaError(f"schema is not valid JSON: {e}") from None
        if not isinstance(obj, (dict, bool)):
            raise InvalidSchemaError("a schema must be a JSON object or a boolean")
        return obj
    mjs = getattr(schema, "model_json_schema", None)
    if callable(mjs):
        return mjs()
    try:  # pydantic TypeAdapter-like objects
        from pydantic import TypeAdapter

        if isinstance(schema, TypeAdapter):
            return schema.json_schema()
    except ImportError:  # pragma: no cover
        pass
    raise InvalidSchemaError(f"cannot read a JSON schema from {type(schema).__name__}")


# ====================================================================== IR


class Node:
    __slots__ = ()


@dataclass(eq=False)
class NumC:
    integer: bool = False
    lo: Fraction | None = None
    lo_excl: bool = False
    hi: Fraction | None = None
    hi_excl: bool = False
    mults: tuple = ()
    excl: tuple = ()
    nonint: bool = False    # numbers with a non-zero fractional part
    nmults: tuple = ()      # integers the value is not a multiple of

    def free(self) -> bool:
        return not self.integer and self.lo is None and self.hi is None and not self.mults and not self.excl \
            and not self.nonint and not self.nmults


@dataclass(eq=False)
class StrC:
    literals: frozenset | None = None   # exactly these strings (other fields then unused)
    expr: int | None = None             # decoded-level regex (pattern/format), None = any
    min_len: int = 0
    max_len: int | None = None
    excl: frozenset = frozenset()
    n_neg: int = 0                      # complemented regexes folded into expr (cost bound)

    def free(self) -> bool:
        return self.literals is None and self.expr is None and self.min_len == 0 and self.max_len is None \
            and not self.excl


@dataclass(eq=False)
class ArrC:
    prefix: tuple = ()
    items: Node | None = None
    min: int = 0
    max: int | None = None
    unique: str | None = None   # JSON pointer of a uniqueItems: true
    contains: tuple = ()   # ((node, min, max|None, pointer), ...)

    def item(self, i: int) -> Node:
        if i < len(self.prefix):
            return self.prefix[i]
        return self.items if self.items is not None else ANY


@dataclass(eq=False)
class Conj:
    """The rule of one schema for keys it does not declare: patternProperties, else
    additionalProperties (None: absent)."""
    patterns: tuple = ()   # ((source, decoded expr, node), ...)
    additional: Node | None = None


@dataclass(eq=False)
class ObjC:
    props: tuple = ()      # ((name, node), ...) in order
    required: tuple = ()   # names, in first-appearance order
    rest: tuple = ()       # (Conj, ...)
    names: StrC | None = None
    min: int = 0
    max: int | None = None
    some: tuple = ()       # ((decoded key language, value node), ...): at least one such member each


@dataclass(eq=False)
class Typed(Node):
    null: bool = False
    boolean: frozenset = frozenset()
    num: NumC | None = None
    string: StrC | None = None
    array: ArrC | None = None
    obj: ObjC | None = None

    def empty(self) -> bool:
        return not self.null and not self.boolean and self.num is None and self.string is None \
            and self.array is None and self.obj is None


@dataclass(eq=False)
class Union(Node):
    options: list = field(default_factory=list)


@dataclass(eq=False)
class OneOf(Node):
    """``context`` and exactly one of ``branches``. Intersections go into the context
    (``X and (C and oneOf(B))`` is ``(X and C) and oneOf(B)``), so overlap is decided once the
    whole context is known: the options are ``context and B_i``; when they overlap, option ``i``
    is ``context and B_i and not B_j`` for every other ``j`` (complements of the branches only)."""
    context: Node = None
    branches: list = field(default_factory=list)
    pointer: str = ""


@dataclass(eq=False)
class Ref(Node):
    name: str
    target: object = None   # callable -> Node
    _node: Node | None = None

    def resolve(self) -> Node:
        if self._node is None:
            self._node = self.target()
        return self._node


ANY = Typed(True, frozenset({True, False}), NumC(), StrC(), ArrC(), ObjC())
NOTHING = Typed()


def is_nothing(n: Node) -> bool:
    if n is NOTHING:
        return True
    if isinstance(n, Typed):
        return n.empty()
    if isinstance(n, Union):
        return all(is_nothing(o) for o in n.options)
    if isinstance(n, OneOf):
        return is_nothing(n.context) or all(is_nothing(o) for o in n.branches)
    return False


# ====================================================================== helpers


def _mask(bs: bytes) -> int:
    m = 0
    for b in bs:
        m |= 1 << b
    return m


def _escape_pointer(s: str) -> str:
    return s.replace("~", "~0").replace("/", "~1")


_SHORT = {0x22: '\\"', 0x5C: "\\\\", 0x2F: "\\/", 0x08: "\\b", 0x0C: "\\f", 0x0A: "\\n", 0x0D: "\\r", 0x09: "\\t"}


def _byte_runs(m: int) -> list[tuple[int, int]]:
    """Maximal runs of consecutive bytes in the 256-bit set ``m``."""
    out = []
    b = 0
    while m >> b:
        if m >> b & 1:
            lo = b
            while m >> (b + 1) & 1:
                b += 1
            out.append((lo, b))
        b += 1
    return out


class _Strings:
    """JSON string encodings of decoded-string languages."""

    def __init__(self, ex: ExprSet, lx: JsonLexemes):
        from .regex import any_utf8_char, any_utf8_string, char_class_expr

        self.ex = ex
        self.quote = ex.literal('"')
        self.body_full = ex.star(lx.string_char)
        self.any_char = any_utf8_char(ex)
        self.any_dec = any_utf8_string(ex)
        hexd = ex.byteset(_mask(b"0123456789abcdefABCDEF"))
        self.hexd = hexd
        raw = char_class_expr([(0x20, 0x21), (0x23, 0x5B), (0x5D, 0x10FFFF)], ex)
        short = ex.concat(ex.literal("\\"), ex.byteset(_mask(b'"\\/bfnrt')))
        nonsur = ex.alt(ex.concat(ex.byteset(_mask(b"0123456789abcefABCEF")), ex.repeat(hexd, 3, 3)),
                        ex.concat(ex.byteset(_mask(b"dD")), ex.byteset(_mask(b"01234567")), ex.repeat(hexd, 2, 2)))
        pair = ex.concat(ex.literal("\\u"), ex.byteset(_mask(b"dD")), ex.byteset(_mask(b"89abAB")),
                         ex.repeat(hexd, 2, 2), ex.literal("\\u"), ex.byteset(_mask(b"dD")),
                         ex.byteset(_mask(b"cdefCDEF")), ex.repeat(hexd, 2, 2))
        self.unit = ex.alt(raw, short, ex.concat(ex.literal("\\u"), nonsur), pair)
        self.raw_ascii = sum(1 << b for b in range(0x20, 0x80) if b not in (0x22, 0x5C))
        self._esc: dict[int, int] = {}
        self._enc: dict[int, int] = {}
        self._chars: dict[int, object] = {}
        self._maxlen: dict[int, float] = {}
        self._lit: dict[tuple, int] = {}
        self._lit_chars: dict[tuple, int] = {}
        self.body_restricted = None
        self.body_restricted = self.enc(self.any_dec)

    def _hex_ci(self, text: str) -> int:
        ex = self.ex
        parts = []
        for c in text:
            if c.isalpha():
                parts.append(ex.byteset(_mask(c.lower().encode()) | _mask(c.upper().encode())))
            else:
                parts.append(ex.literal(c))
        return ex.concat(*parts)

    def _u(self, cp: int) -> int:
        ex = self.ex
        if cp < 0x10000:
            return ex.concat(ex.literal("\\u"), self._hex_ci(f"{cp:04x}"))
        v = cp - 0x10000
        hi, lo = 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF)
        return ex.concat(ex.literal("\\u"), self._hex_ci(f"{hi:04x}"), ex.literal("\\u"), self._hex_ci(f"{lo:04x}"))

    def ascii_escapes(self, b: int) -> int:
        """Escaped spellings of ASCII byte ``b`` used in constrained strings."""
        e = self._esc.get(b)
        if e is None:
            ex = self.ex
            parts = []
            if b in _SHORT:
                parts.append(ex.literal(_SHORT[b]))
            if b < 0x20 or b == 0x7F:
                parts.append(self._u(b))
            e = self._esc[b] = ex.alt(*parts)
        return e

    # ------------------------------------------------------------------ \uXXXX of character sets
    def _len_bounds(self, e: int) -> tuple:
        r = self._maxlen.get(e)
        if r is not None:
            return r
        ex = self.ex
        k = ex.kind[e]
        if k == EMPTY:
            r = (0, 0)
        elif k == EPS:
            r = (0, 0)
        elif k == BYTES:
            r = (1, 1)
        elif k == CONCAT:
            a, b = (self._len_bounds(x) for x in ex.args[e])
            r = (a[0] + b[0], a[1] + b[1])
        elif k == OR:
            bs = [self._len_bounds(x) for x in ex.args[e]]
            r = (min(b[0] for b in bs), max(b[1] for b in bs))
        elif k == REPEAT:
            x, lo, hi = ex.args[e]
            b = self._len_bounds(x)
            r = (b[0] * lo, float("inf") if hi == -1 else b[1] * hi)
        else:
            r = (0, float("inf"))
        self._maxlen[e] = r
        return r

    def char_ranges(self, e: int):
        """Code point ranges if ``e`` denotes a set of single characters, else None."""
        if e in self._chars:
            return self._chars[e]
        ex = self.ex
        r = None
        lo_len, hi_len = self._len_bounds(e)
        if 1 <= lo_len and hi_len <= 4:
            r = self._explore_chars(e)
        self._chars[e] = r
        return r

    def _explore_chars(self, e: int):
        ex = self.ex
        paths = []
        stack = [(e, ())]
        n = 0
        while stack:
            x, path = stack.pop()
            n += 1
            if n > 400:
                return None
            tr = ex.transitions(x)
            if ex.nullable(x):
                if not path or tr:
                    return None
                paths.append(path)
                continue
            if len(path) >= 4:
                return None
            for m, t in tr:
                stack.append((t, path + (m,)))
        ranges = []
        work = 0
        cont_full = ((1 << 0xC0) - 1) ^ ((1 << 0x80) - 1)
        for path in paths:
            first = path[0]
            n = len(path)
            lead_ok = {1: (0x00, 0x7F), 2: (0xC2, 0xDF), 3: (0xE0, 0xEF), 4: (0xF0, 0xF4)}[n]
            if first >> (lead_ok[1] + 1) or first & ((1 << lead_ok[0]) - 1):
                return None
            for m in path[1:]:
                if m & ~cont_full:
                    return None
            # positions from ``j`` on are all full continuation sets: iterate single bytes before
            # ``j - 1`` and runs of bytes at ``j - 1`` (each run is one contiguous code point range)
            j = n
            while j > 1 and path[j - 1] == cont_full:
                j -= 1
            runs_at = [_byte_runs(m) for m in path]
            prefixes = [()]
            for k in range(j - 1):
                prefixes = [pre + (b,) for pre in prefixes for lo, hi in runs_at[k] for b in range(lo, hi + 1)]
                work += len(prefixes)
                if work > 200_000:
                    return None
            tail_lo, tail_hi = (0x80,) * (n - j), (0xBF,) * (n - j)
            for pre in prefixes:
                for lo, hi in runs_at[j - 1]:
                    a = bytes(pre + (lo,) + tail_lo).decode("utf-8", "surrogatepass")
                    b = bytes(pre + (hi,) + tail_hi).decode("utf-8", "surrogatepass")
                    ranges.append((ord(a), ord(b)))
        merged: list = []
        for lo, hi in sorted(ranges):
            if merged and lo <= merged[-1][1] + 1:
                if hi > merged[-1][1]:
                    merged[-1] = (merged[-1][0], hi)
            else:
                merged.append((lo, hi))
        return merged

    def _hex_range(self, lo: int, hi: int, width: int = 4) -> int:
        """Hex digit strings (any letter case) of ``width`` digits with value in [lo, hi]."""
        ex = self.ex
        digs = "0123456789abcdef"

        def dset(a: int, b: int) -> int:
            m = 0
            for d in range(a, b + 1):
                m |= _mask(digs[d].encode()) | _mask(digs[d].upper().encode())
            return ex.byteset(m)

        def fixed(a: str, b: str) -> int:
            if not a:
                return EPS
            n = len(a) - 1
            x, y = int(a[0], 16), int(b[0], 16)
            if x == y:
                return ex.concat(dset(x, x), fixed(a[1:], b[1:]))
            parts = []
            lo_full = a[1:] == "0" * n
            hi_full = b[1:] == "f" * n
            if not lo_full:
                parts.append(ex.concat(dset(x, x), fixed(a[1:], "f" * n)))
            ml, mh = (x if lo_full else x + 1), (y if hi_full else y - 1)
            if ml <= mh:
                parts.append(ex.concat(dset(ml, mh), ex.repeat(dset(0, 15), n, n)))
            if not hi_full:
                parts.append(ex.concat(dset(y, y), fixed("0" * n, b[1:])))
            return ex.alt(*parts)

        try:
            return fixed(f"{lo:0{width}x}", f"{hi:0{width}x}")
        finally:
            fixed = None  # break the closure's reference cycle

    def u_escapes(self, ranges) -> int:
        """``\\uXXXX`` spellings (surrogate pairs above U+FFFF) of the non-ASCII code points."""
        ex = self.ex
        u = ex.literal("\\u")
        parts = []
        for lo, hi in ranges:
            lo = max(lo, 0x80)
            if lo > hi:
                continue
            if lo <= 0xFFFF:
                parts.append(ex.concat(u, self._hex_range(lo, min(hi, 0xFFFF))))
            if hi >= 0x10000:
                a, b = max(lo, 0x10000) - 0x10000, hi - 0x10000
                ha, hb = 0xD800 + (a >> 10), 0xD800 + (b >> 10)
                la, lb = 0xDC00 + (a & 0x3FF), 0xDC00 + (b & 0x3FF)
                if ha == hb:
                    parts.append(ex.concat(u, self._hex_range(ha, ha), u, self._hex_range(la, lb)))
                else:
                    parts.append(ex.concat(u, self._hex_range(ha, ha), u, self._hex_range(la, 0xDFFF)))
                    if ha + 1 <= hb - 1:
                        parts.append(ex.concat(u, self._hex_range(ha + 1, hb - 1), u, self._hex_range(0xDC00, 0xDFFF)))
                    parts.append(ex.concat(u, self._hex_range(hb, hb), u, self._hex_range(0xDC00, lb)))
        return ex.alt(*parts)

    def _char_prefix(self, e: int):
        """Split ``lead cont... rest`` (a multi-byte character at the head of a concatenation
        chain) into (character set, rest), or None."""
        ex = self.ex
        x, y = ex.args[e]
        if ex.kind[x] != BYTES:
            return None
        m = ex.args[x][0]
        for n, (a, b) in ((2, (0xC2, 0xDF)), (3, (0xE0, 0xEF)), (4, (0xF0, 0xF4))):
            if m and not (m >> (b + 1)) and not (m & ((1 << a) - 1)):
                break
        else:
            return None
        conts = []
        rest = y
        for _ in range(n - 1):
            if ex.kind[rest] == CONCAT:
                c, rest = ex.args[rest]
            elif ex.kind[rest] == BYTES:
                c, rest = rest, EPS
            else:
                return None
            if ex.kind[c] != BYTES:
                return None
            conts.append(c)
        return ex.concat(x, *conts), rest

    def enc(self, e: int) -> int:
        """The JSON-escaped bodies of the decoded strings of ``e``: raw characters, the usual
        escapes of ASCII, ``\\uXXXX`` of control and non-ASCII characters."""
        r = self._enc.get(e)
        if r is not None:
            return r
        ex = self.ex
        k = ex.kind[e]
        if k in (OR, CONCAT):
            cr = self.char_ranges(e)
            if cr is not None:
                r = ex.alt(self._enc_struct(e, self._enc_raw), self.u_escapes(cr))
                self._enc[e] = r
                return r
            if k == CONCAT:
                split = self._char_prefix(e)
                if split is not None:
                    r = ex.concat(self.enc(split[0]), self.enc(split[1]))
                    self._enc[e] = r
                    return r
        r = self._enc_struct(e, self.enc)
        self._enc[e] = r
        return r

    def _enc_raw(self, e: int) -> int:
        """Like :meth:`enc` without ``\\uXXXX`` for non-ASCII (inside a character set that
        gets them as a whole)."""
        return self._enc_struct(e, self._enc_raw)

    def _enc_struct(self, e: int, rec) -> int:
        ex = self.ex
        k = ex.kind[e]
        if k == EMPTY or k == EPS:
            r = e
        elif k == BYTES:
            m = ex.args[e][0]
            keep = m & (self.raw_ascii | (((1 << 256) - 1) ^ ((1 << 128) - 1)))
            parts = [ex.byteset(keep)]
            special = m & ~keep & ((1 << 128) - 1)
            while special:
                low = special & -special
                parts.append(self.ascii_escapes(low.bit_length() - 1))
                special ^= low
            r = ex.alt(*parts)
        elif k == CONCAT:
            a, b = ex.args[e]
            r = ex.concat(rec(a), rec(b))
        elif k == OR:
            r = ex.alt(*[rec(x) for x in ex.args[e]])
        elif k == AND:
            r = ex.intersect(*[rec(x) for x in ex.args[e]])
        elif k == NOT:
            r = ex.intersect(ex.complement(rec(ex.args[e][0])), self.body_restricted)
        elif k == REPEAT:
            x, lo, hi = ex.args[e]
            r = ex.repeat(rec(x), lo, None if hi == -1 else hi)
        else:  # pragma: no cover
            raise AssertionError(k)
        return r

    def literal(self, s: str, full: bool) -> int:
        """Spellings of string ``s`` (body, without quotes). ``full``: every JSON spelling;
        otherwise raw/short escapes, ``\\uXXXX`` for control and non-ASCII characters."""
        key = (s, full)
        r = self._lit.get(key)
        if r is None:
            r = self._lit[key] = self.ex.concat(*[self._char_forms(ch, full) for ch in s])
        return r

    def _char_forms(self, ch: str, full: bool) -> int:
        key = (ch, full)
        r = self._lit_chars.get(key)
        if r is None:
            ex = self.ex
            cp = ord(ch)
            forms = []
            if cp >= 0x20 and ch not in '"\\' and not (0xD800 <= cp <= 0xDFFF):
                forms.append(ex.literal(ch.encode("utf-8")))
            if cp in _SHORT:
                forms.append(ex.literal(_SHORT[cp]))
            if full or not (0x20 <= cp < 0x7F):
                forms.append(self._u(cp))
            r = self._lit_chars[key] = ex.alt(*forms)
        return r


# ====================================================================== compiler


class _Compiler:
    def __init__(self, root, *, whitespace, max_whitespace, strict, lenient, indent, unordered_max=0, exprs=None):
        self.root = root
        self.unordered_max = unordered_max
        self.refs: list[Ref] = []   # every Ref made: unlinked by close()
        self.g = Grammar(exprs)
        self.ex = self.g.exprs
        # the JSON lexemes and the string-encoding caches live with the ExprSet: a compiler that
        # shares one ExprSet across schemas builds them once
        shared = self.ex.__dict__.setdefault("_json_schema_shared", {})
        if "lx" not in shared:
            shared["lx"] = JsonLexemes(self.ex)
            shared["strings"] = _Strings(self.ex, shared["lx"])
        self.lx = shared["lx"]
        self.strict = strict
        self.lenient = lenient
        self.indent = indent
        self.ws = whitespace_expr(self.ex, whitespace, max_whitespace) if indent is None else EPS
        self.strings = shared["strings"]
        self.warnings: list[str] = []
        self.draft = _detect_draft(root)
        self.ir_cache: dict = {}
        self.in_progress: set = set()
        self.ref_nodes: dict = {}
        self.isect_memo: dict = {}
        self.isect_busy: set = set()
        self.unfold_depth = 0
        self.n_isect = 0
        self.gen_memo: dict = {}
        self.keep: list = []   # keeps memo-keyed nodes alive (ids stay unique)
        self.str_tok_cache: dict = {}
        self.num_tok_cache: dict = {}
        self.regex_cache: dict = {}
        self.n_alts = 0
        self.base0 = "https://grammask.invalid/root.json"
        self.resources: dict[str, tuple] = {}
        self.anchors: dict[str, tuple] = {}
        self._index(root, self.base0, True)

    # ------------------------------------------------------------------ errors
    def unsupported(self, keyword: str, pointer: str, message: str) -> None:
        """Raise, or (lenient) record a warning: the caller then ignores the keyword."""
        if not self.lenient:
            raise UnsupportedSchemaError(message, keyword, pointer)
        self.warnings.append(f"{pointer or '#'}: {keyword}: {message} (ignored)")

    # ------------------------------------------------------------------ $ref registry
    def _own_base(self, s: dict, parent: str) -> str:
        sid = s.get("$id") if self.draft > 4 else s.get("id")
        if isinstance(sid, str) and not (sid.startswith("#") and self.draft <= 7):
            return urljoin(parent, sid)
        return parent

    def _index(self, s, parent: str, top: bool = False) -> None:
        """Register resources ($id), anchors ($anchor, $dynamicAnchor, draft 4-7 '#name' ids).
        Each entry is ``(schema, base URI of its parent)``."""
        if isinstance(s, list):
            for x in s:
                self._index(x, parent)
            return
        if not isinstance(s, dict):
            return
        base = self._own_base(s, parent)
        url, frag = _urldefrag(base)
        if top:
            self.resources.setdefault(_urldefrag(self.base0)[0], (s, parent))
        if base != parent or top:
            self.resources.setdefault(url, (s, parent))
            if frag and not frag.startswith("/"):
                self.anchors.setdefault(url + "#" + frag, (s, parent))
        sid = s.get("$id") if self.draft > 4 else s.get("id")
        if isinstance(sid, str) and sid.startswith("#") and self.draft <= 7:
            self.anchors.setdefault(url + sid, (s, parent))
        for akw in ("$anchor", "$dynamicAnchor"):
            a = s.get(akw)
            if isinstance(a, str):
                self.anchors.setdefault(url + "#" + a, (s, parent))
        for k, v in s.items():
            if k in ("enum", "const", "examples", "default", "example"):
                continue
            if isinstance(v, (dict, list)):
                self._index(v, base)

    def resolve_ref(self, ref: str, base: str, pointer: str):
        """``(target, base URI of the target's parent, display name)``."""
        if not isinstance(ref, str):
            raise InvalidSchemaError("$ref must be a string", pointer)
        full = urljoin(base, ref)
        url, frag = urldefrag(full)
        if not url:
            url = urldefrag(base)[0]
        res = self.resources.get(url)
        if res is None:
            raise UnsupportedSchemaError(f"cannot resolve $ref {ref!r} (remote references are not fetched)",
                                         "$ref", pointer)
        doc, parent = res
        if not frag or frag.startswith("/"):
            target, tparent = doc, parent
            for raw in (frag.split("/")[1:] if frag else []):
                part = unquote(raw).replace("~1", "/").replace("~0", "~")
                here = self._own_base(target, tparent) if isinstance(target, dict) else tparent
                if isinstance(target, dict) and part in target:
                    target = target[part]
                elif isinstance(target, list) and part.isdigit() and int(part) < len(target):
                    target = target[int(part)]
                else:
                    raise InvalidSchemaError(f"$ref {ref!r} points to nothing", pointer)
                tparent = here
            return target, tparent, "#" + frag if doc is self.root else full
        hit = self.anchors.get(url + "#" + frag)
        if hit is None:
            raise InvalidSchemaError(f"$ref {ref!r}: anchor not found", pointer)
        return hit[0], hit[1], full

    def ref_node(self, ref: str, base: str, pointer: str) -> Node:
        target, tbase, tptr = self.resolve_ref(ref, base, pointer)
        if isinstance(target, bool):
            return ANY if target else NOTHING
        if not isinstance(target, dict):
            raise InvalidSchemaError(f"$ref {ref!r} does not point to a schema", pointer)
        key = (id(target), tbase)
        r = self.ref_nodes.get(key)
        if r is None:
            r = self.new_ref(tptr, lambda t=target, p=tptr, b=tbase: self.to_ir(t, p, b))
            self.ref_nodes[key] = r
        return r

    def new_ref(self, name: str, target) -> Ref:
        r = Ref(name, target)
        self.refs.append(r)
        return r

    def close(self) -> None:
        """Drop the compile state. The IR of a recursive schema is cyclic (a Ref resolves to a
        node that contains it), and the memo tables and generator closures refer to one
        another: unlinking them lets reference counting free it all at once, rather than leave
        it to a full pass of the cyclic garbage collector (a pause of up to a second once such
        garbage has piled up, landing on some later mask)."""
        for r in self.refs:
            r.target = r._node = None
        self.__dict__.clear()

    def unfold(self, n: Node) -> Node:
        depth = 0
        while isinstance(n, Ref):
            depth += 1
            if depth > MAX_UNFOLD_DEPTH:
                raise GrammarTooComplexError("a chain of $ref does not end")
            n = n.resolve()
        return n

    # ------------------------------------------------------------------ schema -> IR
    def to_ir(self, s, ptr: str, base: str) -> Node:
        if s is True:
            return ANY
        if s is False:
            return NOTHING
        if not isinstance(s, dict):
            raise InvalidSchemaError("a schema must be an object or a boolean", ptr)
        base = self._own_base(s, base)
        key = (id(s), base)
        r = self.ir_cache.get(key)
        if r is not None:
            return r
        if key in self.in_progress:
            raise UnsupportedSchemaError("a schema that contains itself through allOf/$ref siblings "
                                         "(not through a property or item) cannot be expanded", "$ref", ptr)
        self.in_progress.add(key)
        try:
            r = self._build(s, ptr, base)
        finally:
            self.in_progress.discard(key)
        self.ir_cache[key] = r
        self.keep.append(s)
        return r

    def _build(self, s: dict, ptr: str, base: str) -> Node:
        ref = s.get("$ref")
        if ref is not None and self.draft <= 7:
            return self.ref_node(ref, base, ptr)   # drafts 4-7: siblings of $ref are ignored
        node = self.typed_part(s, ptr, base)
        if "enum" in s:
            vals = s["enum"]
            if not isinstance(vals, list):
                raise InvalidSchemaError("enum must be an array", ptr + "/enum")
            node = self.isect(node, self.enum_node(vals, ptr + "/enum"))
        if "const" in s:
            node = self.isect(node, self.enum_node([s["const"]], ptr + "/const"))
        if ref is not None:
            node = self.isect(node, self.ref_node(ref, base, ptr + "/$ref"))
        # dynamic references are resolved statically (exact unless a dynamic scope overrides them)
        for kw in ("$dynamicRef", "$recursiveRef"):
            if kw in s:
                node = self.isect(node, self.ref_node(s[kw], base, ptr + "/" + kw))
        if self.draft <= 3:
            node = self.draft3(s, node, ptr, base)
        if "allOf" in s:
            subs = self._schema_list(s["allOf"], ptr + "/allOf")
            for i, sub in enumerate(subs):
                node = self.isect(node, self.to_ir(sub, f"{ptr}/allOf/{i}", base))
        if "anyOf" in s:
            subs = self._schema_list(s["anyOf"], ptr + "/anyOf")
            node = self.isect(node, self.union([self.to_ir(x, f"{ptr}/anyOf/{i}", base) for i, x in enumerate(subs)]))
        if "oneOf" in s:
            subs = self._schema_list(s["oneOf"], ptr + "/oneOf")
            node = self.make_oneof(node, [self.to_ir(x, f"{ptr}/oneOf/{i}", base) for i, x in enumerate(subs)],
                                   ptr + "/oneOf")
        if "not" in s:
            sub = self.to_ir(s["not"], ptr + "/not", base)
            try:
                node = self.isect_not(node, sub, ptr + "/not")
            except _CannotNegate as e:
                self.unsupported("not", ptr + "/not", f"cannot compute the complement of this schema ({e})")
        if "if" in s and ("then" in s or "else" in s):
            node = self.isect(node, self.if_then_else(s, ptr, base))
        deps = []
        if isinstance(s.get("dependencies"), dict):
            for k, v in s["dependencies"].items():
                deps.append((k, v, f"{ptr}/dependencies/{_escape_pointer(k)}"))
        for kw in ("dependentRequired", "dependentSchemas"):
            if isinstance(s.get(kw), dict):
                for k, v in s[kw].items():
                    deps.append((k, v, f"{ptr}/{kw}/{_escape_pointer(k)}"))
        for k, v, p in deps:
            node = self.isect(node, self.dependency(k, v, p, base))
        if "unevaluatedProperties" in s:
            p = ptr + "/unevaluatedProperties"
            node = self.unevaluated_props(node, self.to_ir(s["unevaluatedProperties"], p, base), p)
        if "unevaluatedItems" in s:
            node = self.unevaluated_items(node, self.to_ir(s["unevaluatedItems"], ptr + "/unevaluatedItems", base),
                                          ptr + "/unevaluatedItems")
        return node

    def draft3(self, s: dict, node: Node, ptr: str, base: str) -> Node:
        """Draft 3 keywords: divisibleBy (multipleOf), extends (allOf), disallow (not type)."""
        if "divisibleBy" in s:
            m = self._num(s, "divisibleBy", ptr)
            if m <= 0:
                raise InvalidSchemaError("divisibleBy must be positive", ptr + "/divisibleBy")
            node = self.isect(node, Typed(True, frozenset({True, False}), NumC(mults=(m,)), StrC(), ArrC(), ObjC()))
        if "extends" in s:
            ext = s["extends"]
            for i, sub in enumerate(ext if isinstance(ext, list) else [ext]):
                node = self.isect(node, self.to_ir(sub, f"{ptr}/extends/{i}", base))
        if "disallow" in s:
            d = s["disallow"]
            types = d if isinstance(d, list) else [d]
            if not all(isinstance(t, str) for t in types):
                self.unsupported("disallow", ptr + "/disallow", "disallow with schemas")
            else:
                node = self.isect_not(node, self.typed_part({"type": types}, ptr + "/disallow", base), ptr)
        return node

    def _schema_list(self, v, ptr) -> list:
        if not isinstance(v, list) or not v:
            raise InvalidSchemaError("expected a non-empty array of schemas", ptr)
        return v

    # -------------------------------------------------------------- typed keywords
    def typed_part(self, s: dict, ptr: str, base: str) -> Node:
        t = s.get("type")
        if t is None:
            types = set(ALL_TYPES)
        else:
            tl = t if isinstance(t, list) else [t]
            for x in tl:
                if x not in ALL_TYPES:
                    if x == "any":
                        tl = list(ALL_TYPES)
                        break
                    raise InvalidSchemaError(f"unknown type {x!r}", ptr + "/type")
            types = set(tl)
        num = None
        if "number" in types or "integer" in types:
            num = self.num_c(s, ptr, "integer" in types and "number" not in types)
        string = self.str_c(s, ptr) if "string" in types else None
        array = self.arr_c(s, ptr, base) if "array" in types else None
        obj = self.obj_c(s, ptr, base) if "object" in types else None
        bools = frozenset({True, False}) if "boolean" in types else frozenset()
        node = Typed("null" in types, bools, num, string, array, obj)
        if t is None and num.free() and string.free() and _arr_free(array) and _obj_free(obj):
            return ANY
        return self.norm_typed(node)

    def _num(self, s, key, ptr):
        v = s[key]
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise InvalidSchemaError(f"{key} must be a number", f"{ptr}/{key}")
        try:
            return to_fraction(v)
        except ValueError:
            raise InvalidSchemaError(f"{key} must be finite", f"{ptr}/{key}") from None

    def _count(self, s, key, ptr) -> int | None:
        if key not in s:
            return None
        v = s[key]
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise InvalidSchemaError(f"{key} must be a non-negative integer", f"{ptr}/{key}")
        return v

    def num_c(self, s: dict, ptr: str, integer: bool) -> NumC:
        n = NumC(integer=integer)
        if "minimum" in s:
            v = self._num(s, "minimum", ptr)
            excl = s.get("exclusiveMinimum") is True
            n = _num_and(n, NumC(lo=v, lo_excl=excl))
        if "maximum" in s:
            v = self._num(s, "maximum", ptr)
            excl = s.get("exclusiveMaximum") is True
            n = _num_and(n, NumC(hi=v, hi_excl=excl))
        if "exclusiveMinimum" in s and not isinstance(s["exclusiveMinimum"], bool):
            n = _num_and(n, NumC(lo=self._num(s, "exclusiveMinimum", ptr), lo_excl=True))
        if "exclusiveMaximum" in s and not isinstance(s["exclusiveMaximum"], bool):
            n = _num_and(n, NumC(hi=self._num(s, "exclusiveMaximum", ptr), hi_excl=True))
        if "multipleOf" in s:
            m = self._num(s, "multipleOf", ptr)
            if m <= 0:
                raise InvalidSchemaError("multipleOf must be positive", ptr + "/multipleOf")
            if m != 1 or not integer:
                n = _num_and(n, NumC(mults=(m,)))
        fmt = s.get("format")
        if integer and isinstance(fmt, str) and fmt in INT_FORMATS:
            lo, hi = INT_FORMATS[fmt]
            n = _num_and(n, NumC(lo=Fraction(lo), hi=Fraction(hi)))
        return n

    def str_c(self, s: dict, ptr: str) -> StrC:
        ex = self.ex
        mn = self._count(s, "minLength", ptr) or 0
        mx = self._count(s, "maxLength", ptr)
        exprs = []
        if "pattern" in s:
            p = s["pattern"]
            if not isinstance(p, str):
                raise InvalidSchemaError("pattern must be a string", ptr + "/pattern")
            e = self.pattern_expr(p, ptr + "/pattern", "pattern")
            if e is not None:
                exprs.append(e)
        fmt = s.get("format")
        if isinstance(fmt, str):
            e = self.regex_cache.get(("format", fmt))
            if e is None:
                e = format_expr(fmt, ex)
                self.regex_cache[("format", fmt)] = e if e is not None else -1
            if e is not None and e != -1:
                exprs.append(e)
        expr = ex.intersect(*exprs) if len(exprs) > 1 else (exprs[0] if exprs else None)
        return StrC(expr=expr, min_len=mn, max_len=mx)

    def pattern_expr(self, p: str, ptr: str, keyword: str) -> int | None:
        key = ("pattern", p)
        e = self.regex_cache.get(key)
        if e is not None:
            return e
        from .regex import search_regex

        try:
            e = search_regex(p, self.ex)
        except UnsupportedRegexError as err:
            self.unsupported(keyword, ptr, f"regex {p!r}: {err}")
            return None
        except RegexSyntaxError as err:
            raise InvalidSchemaError(f"invalid regex {p!r}: {err}", ptr) from None
        self.regex_cache[key] = e
        return e

    def arr_c(self, s: dict, ptr: str, base: str) -> ArrC:
        prefix: list = []
        items = None
        if "prefixItems" in s:
            pi = s["prefixItems"]
            if not isinstance(pi, list):
                raise InvalidSchemaError("prefixItems must be an array", ptr + "/prefixItems")
            prefix = [self.to_ir(x, f"{ptr}/prefixItems/{i}", base) for i, x in enumerate(pi)]
            if "items" in s:
                items = self.to_ir(s["items"], ptr + "/items", base)
        elif isinstance(s.get("items"), list):
            prefix = [self.to_ir(x, f"{ptr}/items/{i}", base) for i, x in enumerate(s["items"])]
            if "additionalItems" in s:
                items = self.to_ir(s["additionalItems"], ptr + "/additionalItems", base)
        elif "items" in s:
            items = self.to_ir(s["items"], ptr + "/items", base)
        mn = self._count(s, "minItems", ptr) or 0
        mx = self._count(s, "maxItems", ptr)
        unique = ptr + "/uniqueItems" if s.get("uniqueItems") is True else None
        contains = ()
        if "contains" in s:
            c = self.to_ir(s["contains"], ptr + "/contains", base)
            cmin = self._count(s, "minContains", ptr)
            cmax = self._count(s, "maxContains", ptr)
            contains = ((c, 1 if cmin is None else cmin, cmax, ptr + "/contains", 0),)
        return ArrC(tuple(prefix), items, mn, mx, unique, contains)

    def obj_c(self, s: dict, ptr: str, base: str) -> ObjC:
        props_s = s.get("properties", {})
        if not isinstance(props_s, dict):
            raise InvalidSchemaError("properties must be an object", ptr + "/properties")
        pats_s = s.get("patternProperties", {})
        if not isinstance(pats_s, dict):
            raise InvalidSchemaError("patternProperties must be an object", ptr + "/patternProperties")
        patterns = []
        for p, sub in pats_s.items():
            e = self.pattern_expr(p, f"{ptr}/patternProperties/{_escape_pointer(p)}", "patternProperties")
            if e is None:
                continue
            patterns.append((p, e, self.to_ir(sub, f"{ptr}/patternProperties/{_escape_pointer(p)}", base)))
        props = []
        for k, sub in props_s.items():
            v = self.to_ir(sub, f"{ptr}/properties/{_escape_pointer(k)}", base)
            for p, e, pn in patterns:
                if self.ex.matches(e, k):
                    v = self.isect(v, pn)
            props.append((k, v))
        req = s.get("required", [])
        if isinstance(req, bool):   # the draft 3 spelling, read from the parent (below)
            req = []
        if self.draft <= 3:
            req = list(req) + [k for k, sub in props_s.items() if isinstance(sub, dict) and sub.get("required") is True]
        if not isinstance(req, list) or not all(isinstance(x, str) for x in req):
            raise InvalidSchemaError("required must be an array of strings", ptr + "/required")
        required = tuple(dict.fromkeys(req))
        additional = None
        if "additionalProperties" in s:
            additional = self.to_ir(s["additionalProperties"], ptr + "/additionalProperties", base)
        if self.strict and "properties" in s:
            required = tuple(dict.fromkeys(required + tuple(k for k, _ in props)))
            if additional is None and not patterns:
                additional = NOTHING
        rest = (Conj(tuple(patterns), additional),) if (patterns or additional is not None) else ()
        names = None
        if "propertyNames" in s:
            pn = self.expand(self.to_ir(s["propertyNames"], ptr + "/propertyNames", base))
            names = self.names_constraint(pn, ptr + "/propertyNames")
        mn = self._count(s, "minProperties", ptr) or 0
        mx = self._count(s, "maxProperties", ptr)
        return ObjC(tuple(props), required, rest, names, mn, mx)

    def names_constraint(self, pn: Node, ptr: str) -> StrC | None:
        """propertyNames as a string constraint (keys are strings: other types are irrelevant)."""
        if isinstance(pn, Union):
            opts = [self.expand(o) for o in pn.options]
            langs = []
            for o in opts:
                if not isinstance(o, Typed):
                    self.unsupported("propertyNames", ptr, "propertyNames schema not understood")
                    return None
                if o.string is not None:
                    langs.append(self.str_lang(o.string))
            return StrC(expr=self.ex.alt(*langs)) if langs else StrC(literals=frozenset())
        if not isinstance(pn, Typed):
            self.unsupported("propertyNames", ptr, "propertyNames schema not understood")
            return None
        if pn.string is None:
            return StrC(literals=frozenset())
        return None if pn.string.free() else pn.string

    def enum_node(self, vals: list, ptr: str) -> Node:
        strings = []
        null = False
        bools = set()
        others = []
        for v in vals:
            if isinstance(v, str):
                strings.append(v)
            elif v is None:
                null = True
            elif isinstance(v, bool):
                bools.add(v)
            else:
                others.append(self.const_node(v, ptr))
        opts = []
        if strings or null or bools:
            opts.append(Typed(null, frozenset(bools), None, StrC(literals=frozenset(strings)) if strings else None))
        opts.extend(others)
        return self.union(opts)

    def const_node(self, v, ptr: str) -> Node:
        if v is None:
            return Typed(null=True)
        if isinstance(v, bool):
            return Typed(boolean=frozenset({v}))
        if isinstance(v, (int, float)):
            f = to_fraction(v)
            return Typed(num=NumC(lo=f, hi=f))
        if isinstance(v, str):
            return Typed(string=StrC(literals=frozenset({v})))
        if isinstance(v, list):
            return Typed(array=ArrC(tuple(self.const_node(x, ptr) for x in v), NOTHING, len(v), len(v)))
        if isinstance(v, dict):
            props = tuple((k, self.const_node(x, ptr)) for k, x in v.items())
            return Typed(obj=ObjC(props, tuple(v), (Conj((), NOTHING),)))
        raise InvalidSchemaError(f"not a JSON value: {v!r}", ptr)

    # -------------------------------------------------------------- combinators
    def union(self, opts: list) -> Node:
        flat = []
        for o in opts:
            if isinstance(o, Union):
                flat.extend(o.options)
            elif not is_nothing(o):
                if o is ANY:
                    return ANY
                flat.append(o)
        flat = [o for o in flat if not is_nothing(o)]
        if not flat:
            return NOTHING
        if len(flat) == 1:
            return flat[0]
        if len(flat) > MAX_UNION:
            raise GrammarTooComplexError(f"a union of {len(flat)} alternatives is too large")
        return Union(flat)

    def _memo_result(self, key):
        """The finished result a recursive reference points to. Missing when it is needed before
        the computation it refers to has finished: recursive intersections and complements are
        built eagerly down to their property and item values, so e.g. a oneOf whose exactness
        needs the complement of a branch that contains the same oneOf (under a property) asks
        for its own result; or when that computation failed."""
        r = self.isect_memo.get(key)
        if r is None:
            raise UnsupportedSchemaError(
                "a recursive schema whose allOf/oneOf/not combination (an intersection or a "
                "complement) needs its own result while it is computed is not supported")
        return r

    def isect(self, a: Node, b: Node) -> Node:
        self.n_isect += 1
        if self.n_isect > MAX_INTERSECTIONS:
            raise GrammarTooComplexError(
                f"the schema needs more than {MAX_INTERSECTIONS:,} intersections of subschemas "
                "(allOf/oneOf/not combinations)")
        if a is ANY or a is b:
            return b
        if b is ANY:
            return a
        if is_nothing(a) or is_nothing(b):
            return NOTHING
        key = (id(a), id(b))
        r = self.isect_memo.get(key)
        if r is not None:
            return r
        if isinstance(a, Ref) or isinstance(b, Ref):
            if key in self.isect_busy:
                # a recursive intersection: refer to the result being built
                return self.new_ref(f"{getattr(a, 'name', '?')}&{getattr(b, 'name', '?')}",
                                    lambda k=key: self._memo_result(k))
            self.isect_busy.add(key)
            self.unfold_depth += 1
            try:
                if self.unfold_depth > MAX_UNFOLD_DEPTH:
                    raise GrammarTooComplexError("intersection of recursive schemas nests too deeply")
                r = self.isect(self.unfold(a), self.unfold(b))
            finally:
                self.unfold_depth -= 1
                self.isect_busy.discard(key)
        elif isinstance(a, Union) or isinstance(b, Union):
            la = a.options if isinstance(a, Union) else [a]
            lb = b.options if isinstance(b, Union) else [b]
            out = []
            mb = [_tmask(y) for y in lb]
            for x in la:
                mx_ = _tmask(x)
                for y, my in zip(lb, mb):
                    if mx_ & my:
                        z = self.isect(x, y)
                        if not is_nothing(z):
                            out.append(z)
                            if len(out) > MAX_UNION:
                                raise GrammarTooComplexError("intersection of unions (allOf of anyOf/oneOf/enum) "
                                                             "is too large")
            r = self.union(out)
        elif isinstance(a, OneOf):
            r = self.make_oneof(self.isect(a.context, b), a.branches, a.pointer)
        elif isinstance(b, OneOf):
            r = self.make_oneof(self.isect(a, b.context), b.branches, b.pointer)
        else:
            r = self.isect_typed(a, b)
        self.isect_memo[key] = r
        self.keep.append((a, b))
        return r

    def isect_typed(self, a: Typed, b: Typed) -> Node:
        num = _num_and(a.num, b.num) if a.num is not None and b.num is not None else None
        string = self.str_and(a.string, b.string) if a.string is not None and b.string is not None else None
        array = self.arr_and(a.array, b.array) if a.array is not None and b.array is not None else None
        obj = self.obj_and(a.obj, b.obj) if a.obj is not None and b.obj is not None else None
        return self.norm_typed(Typed(a.null and b.null, a.boolean & b.boolean, num, string, array, obj))

    def norm_typed(self, t: Typed) -> Node:
        if t.num is not None and self.num_empty(t.num):
            t.num = None
        if t.string is not None and self.str_empty(t.string) is True:
            t.string = None
        if t.array is not None and self.arr_empty(t.array):
            t.array = None
        if t.obj is not None and self.obj_empty(t.obj):
            t.obj = None
        return NOTHING if t.empty() else t

    # numbers
    def num_empty(self, n: NumC) -> bool:
        if range_is_empty(n.lo, n.lo_excl, n.hi, n.hi_excl, n.integer):
            return True
        if n.integer and n.nonint:
            return True
        if n.nonint and n.mults and all(m.denominator == 1 for m in n.mults):
            return True
        if n.lo is not None and n.lo == n.hi:
            v = n.lo
            if v in n.excl or (n.integer and v.denominator != 1) or (n.nonint and v.denominator == 1) \
                    or any((v / m).denominator != 1 for m in n.mults) or any((v / m).denominator == 1 for m in n.nmults):
                return True
        if any(m == 1 for m in n.nmults) and n.integer:
            return True
        if n.mults and n.lo is not None and n.hi is not None:
            ms = list(n.mults) + ([Fraction(1)] if n.integer else [])
            from .json_numeric import _lcm_fraction

            m = _lcm_fraction(ms)
            a = -((-n.lo) // m)
            b = n.hi // m
            if n.lo_excl and a * m == n.lo:
                a += 1
            if n.hi_excl and b * m == n.hi:
                b -= 1
            if a > b:
                return True
        return False

    # strings
    def str_lang(self, sc: StrC) -> int:
        """The decoded-level language of a string constraint."""
        ex = self.ex
        if sc.literals is not None:
            return ex.alt(*[ex.literal(x.encode("utf-8", "surrogatepass")) for x in sc.literals])
        parts = []
        if sc.expr is not None:
            parts.append(sc.expr)
        if sc.min_len or sc.max_len is not None:
            parts.append(ex.repeat(self.strings.any_char, sc.min_len, sc.max_len))
        if sc.excl:
            parts.append(ex.complement(ex.alt(*[ex.literal(x.encode("utf-8", "surrogatepass")) for x in sc.excl])))
            parts.append(self.strings.any_dec)
        if not parts:
            return self.strings.any_dec
        return ex.intersect(*parts)

    def str_ok(self, sc: StrC, v: str) -> bool:
        if sc.literals is not None:
            return v in sc.literals
        if len(v) < sc.min_len or (sc.max_len is not None and len(v) > sc.max_len) or v in sc.excl:
            return False
        if sc.expr is not None:
            try:
                data = v.encode("utf-8")
            except UnicodeEncodeError:
                return False
            return self.ex.matches(sc.expr, data)
        return True

    def str_and(self, a: StrC, b: StrC) -> StrC:
        if a.free():
            return b
        if b.free():
            return a
        if a.literals is not None or b.literals is not None:
            lits = a.literals if a.literals is not None else b.literals
            other = b if a.literals is not None else a
            return StrC(literals=frozenset(v for v in lits if self.str_ok(other, v)))
        expr = a.expr if b.expr is None else (b.expr if a.expr is None else self.ex.intersect(a.expr, b.expr))
        mx = a.max_len if b.max_len is None else (b.max_len if a.max_len is None else min(a.max_len, b.max_len))
        n_neg = a.n_neg + b.n_neg
        if n_neg > MAX_NEGATED_REGEXES:
            raise GrammarTooComplexError("too many complemented string patterns (not/oneOf over overlapping "
                                         "patterns) in one string constraint")
        return StrC(None, expr, max(a.min_len, b.min_len), mx, a.excl | b.excl, n_neg)

    def str_empty(self, sc: StrC):
        """True (empty), False (not empty) or None (unknown)."""
        if sc.literals is not None:
            return not sc.literals
        if sc.max_len is not None and sc.min_len > sc.max_len:
            return True
        if sc.expr is None and not sc.excl:
            return False
        return self.lang_empty(self.str_lang(sc))

    def lang_empty(self, e: int):
        """Emptiness of a regex with a bounded search (None: unknown)."""
        ex = self.ex
        saved = ex.max_alive_states
        ex.max_alive_states = min(saved, MAX_EMPTY_CHECK_STATES)
        try:
            return not ex.alive(e)
        except GrammarTooComplexError:
            return None
        finally:
            ex.max_alive_states = saved

    # arrays
    def arr_and(self, a: ArrC, b: ArrC) -> ArrC:
        n = max(len(a.prefix), len(b.prefix))
        prefix = tuple(self.isect(a.item(i), b.item(i)) for i in range(n))
        if a.items is None:
            items = b.items
        elif b.items is None:
            items = a.items
        else:
            items = self.isect(a.items, b.items)
        mx = a.max if b.max is None else (b.max if a.max is None else min(a.max, b.max))
        return ArrC(prefix, items, max(a.min, b.min), mx, a.unique or b.unique, a.contains + b.contains)

    def arr_empty(self, a: ArrC) -> bool:
        mx = a.max
        for i, p in enumerate(a.prefix):
            if is_nothing(p):
                mx = i if mx is None else min(mx, i)
                break
        if a.items is not None and is_nothing(a.items):
            lim = len(a.prefix)
            mx = lim if mx is None else min(mx, lim)
        if mx is not None and a.min > mx:
            return True
        for c, cmin, cmax, _, _ in a.contains:
            if cmax is not None and cmin > cmax:
                return True
            if cmin > 0 and is_nothing(c):
                return True
            if mx is not None and cmin > mx:
                return True
        return False

    # objects
    def rest_value(self, o: ObjC, k: str) -> Node:
        v = ANY
        for c in o.rest:
            hit = False
            for _, e, pn in c.patterns:
                if self.ex.matches(e, k.encode("utf-8", "surrogatepass")):
                    v = self.isect(v, pn)
                    hit = True
            if not hit and c.additional is not None:
                v = self.isect(v, c.additional)
        return v

    def obj_and(self, a: ObjC, b: ObjC) -> ObjC:
        pa = dict(a.props)
        pb = dict(b.props)
        props = []
        for k in list(pa) + [k for k in pb if k not in pa]:
            va = pa[k] if k in pa else self.rest_value(a, k)
            vb = pb[k] if k in pb else self.rest_value(b, k)
            props.append((k, self.isect(va, vb)))
        if a.names is None:
            names = b.names
        elif b.names is None:
            names = a.names
        else:
            names = self.str_and(a.names, b.names)
        mx = a.max if b.max is None else (b.max if a.max is None else min(a.max, b.max))
        return ObjC(tuple(props), tuple(dict.fromkeys(a.required + b.required)), a.rest + b.rest, names,
                    max(a.min, b.min), mx, a.some + b.some)

    def obj_empty(self, o: ObjC) -> bool:
        if o.max is not None and o.min > o.max:
            return True
        pd = dict(o.props)
        for r in o.required:
            v = pd[r] if r in pd else self.rest_value(o, r)
            if is_nothing(v):
                return True
            if o.names is not None and not self.str_ok(o.names, r):
                return True
        if o.max is not None and len(o.required) > o.max:
            return True
        for lang, v in o.some:
            if is_nothing(v) or self.lang_empty(lang) is True:
                return True
        return False

    # -------------------------------------------------------------- negation
    def isect_not(self, x: Node, n: Node, ptr: str) -> Node:
        """``x and not n``, folding ``x`` into the complement of each option of a union so that
        pieces ruled out by ``x`` are dropped early."""
        if isinstance(n, Union):
            for o in n.options:
                x = self.isect_not(x, o, ptr)
                if is_nothing(x):
                    return NOTHING
            return x
        return self.isect(x, self.negate(n, ptr))

    def negate(self, n: Node, ptr: str) -> Node:
        if isinstance(n, (Ref, OneOf)):
            # lazily: the complement of a recursive schema refers to itself
            key = ("not", id(n))
            r = self.isect_memo.get(key)
            if r is None:
                r = self.new_ref(f"not {getattr(n, 'name', 'oneOf')}", lambda n=n: self._lazy_negate(n, ptr))
                self.isect_memo[key] = r
                self.keep.append(n)
            return r
        n = self.expand(n)
        if n is ANY:
            return NOTHING
        if is_nothing(n):
            return ANY
        if isinstance(n, Union):
            r = ANY
            for o in n.options:
                r = self.isect(r, self.negate(o, ptr))
            return r
        assert isinstance(n, Typed)
        pieces: list = []
        if not n.null:
            pieces.append(Typed(null=True))
        if len(n.boolean) < 2:
            pieces.append(Typed(boolean=frozenset({True, False}) - n.boolean))
        if n.num is None:
            pieces.append(Typed(num=NumC()))
        elif not n.num.free():
            pieces.extend(Typed(num=x) for x in self.neg_num(n.num))
        if n.string is None:
            pieces.append(Typed(string=StrC()))
        elif not n.string.free():
            pieces.append(Typed(string=self.neg_str(n.string)))
        if n.array is None:
            pieces.append(Typed(array=ArrC()))
        elif not _arr_free(n.array):
            pieces.extend(Typed(array=x) for x in self.neg_arr(n.array, ptr))
        if n.obj is None:
            pieces.append(Typed(obj=ObjC()))
        elif not _obj_free(n.obj):
            pieces.extend(self.neg_obj(n.obj, ptr))
        pieces = [self.norm_typed(p) if isinstance(p, Typed) else p for p in pieces]
        return self.union(pieces)

    def _lazy_negate(self, n: Node, ptr: str) -> Node:
        try:
            return self.negate(self.expand(n), ptr)
        except _CannotNegate as e:
            last = ptr.rsplit("/", 1)[-1]
            keyword = last if last in ("not", "oneOf", "if", "contains", "disallow") else "not"
            self.unsupported(keyword, ptr, f"cannot compute the complement of a schema ({e})")
            return ANY

    def neg_num(self, n: NumC) -> list:
        if any(m.denominator != 1 for m in n.mults):
            raise _CannotNegate("multipleOf with a fraction")
        out = []
        for m in n.mults:
            out.append(NumC(nmults=(m,)))
        for m in n.nmults:
            out.append(NumC(mults=(m,)))
        if n.integer:
            out.append(NumC(nonint=True))
        if n.nonint:
            out.append(NumC(integer=True))
        if n.lo is not None:
            out.append(NumC(hi=n.lo, hi_excl=not n.lo_excl))
        if n.hi is not None:
            out.append(NumC(lo=n.hi, lo_excl=not n.hi_excl))
        for v in n.excl:
            out.append(NumC(lo=v, hi=v))
        return out

    def neg_str(self, sc: StrC) -> StrC:
        if sc.literals is not None:
            return StrC(excl=sc.literals)
        ex = self.ex
        return StrC(expr=ex.intersect(ex.complement(self.str_lang(sc)), self.strings.any_dec), n_neg=sc.n_neg + 1)

    def neg_arr(self, a: ArrC, ptr: str) -> list:
        if a.unique:
            raise _CannotNegate("uniqueItems")
        out = []
        for c, cmin, cmax, _, start in a.contains:
            if cmin != 1 or cmax is not None:
                raise _CannotNegate("minContains/maxContains")
            # no item (from index start) matches: every such item is in the complement
            out.append(ArrC(prefix=(ANY,) * start, items=self.negate(c, ptr)))
        if a.min > 0:
            out.append(ArrC(max=a.min - 1))
        if a.max is not None:
            out.append(ArrC(min=a.max + 1))
        for i, p in enumerate(a.prefix):
            if p is not ANY:
                np_ = self.negate(p, ptr)
                if not is_nothing(np_):
                    out.append(ArrC(prefix=(ANY,) * i + (np_,), min=i + 1))
        if a.items is not None and a.items is not ANY:
            ni = self.negate(a.items, ptr)
            if not is_nothing(ni):
                k = len(a.prefix)
                out.append(ArrC(prefix=(ANY,) * k, min=k + 1, contains=((ni, 1, None, ptr, k),)))
        return out

    def neg_obj(self, o: ObjC, ptr: str) -> list:
        """Objects violating ``o``: each piece violates one of its constraints."""
        ex = self.ex
        any_dec = self.strings.any_dec
        out = []
        for lang, v in o.some:
            # no member with a key in lang has a value in v: every such member is in not-v
            out.append(Typed(obj=ObjC(rest=(Conj((("<some>", lang, self.negate(v, ptr)),), None),))))
        for r in o.required:
            out.append(Typed(obj=ObjC(props=((r, NOTHING),))))
        for k, v in o.props:
            if v is ANY:
                continue
            nv = self.negate(v, ptr)
            if not is_nothing(nv):
                out.append(Typed(obj=ObjC(props=((k, nv),), required=(k,))))
        declared = [k for k, _ in o.props]
        not_declared = ex.complement(ex.alt(*[ex.literal(k.encode("utf-8", "surrogatepass")) for k in declared])) \
            if declared else None

        def undeclared(lang: int) -> int:
            parts = [lang, any_dec] + ([not_declared] if not_declared is not None else [])
            return ex.intersect(*parts)

        for c in o.rest:
            for _, e, pn in c.patterns:
                if pn is not ANY:
                    nv = self.negate(pn, ptr)
                    if not is_nothing(nv):
                        out.append(Typed(obj=ObjC(some=((undeclared(e), nv),))))
            if c.additional is not None and c.additional is not ANY:
                nv = self.negate(c.additional, ptr)
                if not is_nothing(nv):
                    lang = ex.complement(ex.alt(*[e for _, e, _ in c.patterns])) if c.patterns else any_dec
                    out.append(Typed(obj=ObjC(some=((undeclared(lang), nv),))))
        if o.names is not None:
            bad = ex.intersect(ex.complement(self.str_lang(o.names)), any_dec)
            out.append(Typed(obj=ObjC(some=((bad, ANY),))))
        if o.min > 0:
            out.append(Typed(obj=ObjC(max=o.min - 1)))
        if o.max is not None:
            out.append(Typed(obj=ObjC(min=o.max + 1)))
        return out

    # -------------------------------------------------------------- oneOf, if, dependencies
    def disjoint(self, a: Node, b: Node) -> bool:
        try:
            return is_nothing(self.isect(a, b))
        except (UnsupportedSchemaError, GrammarTooComplexError):
            return False

    def make_oneof(self, context: Node, branches: list, ptr: str) -> Node:
        if is_nothing(context):
            return NOTHING
        branches = [o for o in branches if not is_nothing(o)]
        if not branches:
            return NOTHING
        if len(branches) == 1:
            return self.isect(context, branches[0])
        return OneOf(context, branches, ptr)

    def resolve_oneof(self, n: OneOf) -> Node:
        """oneOf as a union: of the options if they are pairwise disjoint, else of each option
        minus the other branches (needs their complements)."""
        key = ("oneof", id(n))
        r = self.isect_memo.get(key)
        if r is not None:
            return r
        if key in self.isect_busy:
            return self.new_ref("oneOf", lambda k=key: self._memo_result(k))
        self.isect_busy.add(key)
        try:
            r = self._resolve_oneof(n)
        finally:
            self.isect_busy.discard(key)
        self.isect_memo[key] = r
        self.keep.append(n)
        return r

    def _resolve_oneof(self, n: OneOf) -> Node:
        opts = [self.isect(n.context, b) for b in n.branches]
        overlap = any(not self.disjoint(opts[i], opts[j]) for i in range(len(opts)) for j in range(i + 1, len(opts)))
        if not overlap:
            r = self.union(opts)
        else:
            try:
                out = []
                for i, o in enumerate(opts):
                    x = o
                    for j in range(len(opts)):
                        if j != i and not self.disjoint(opts[i], opts[j]):
                            x = self.isect_not(x, n.branches[j], n.pointer)
                    out.append(x)
                r = self.union(out)
            except _CannotNegate as e:
                self.unsupported("oneOf", n.pointer,
                                 f"oneOf branches may overlap and their complement cannot be computed ({e})")
                r = self.union(opts)
        return r

    def expand(self, n: Node) -> Node:
        """Resolve references and oneOf until the node is a Typed or a Union."""
        for _ in range(MAX_UNFOLD_DEPTH):
            if isinstance(n, Ref):
                n = n.resolve()
            elif isinstance(n, OneOf):
                n = self.resolve_oneof(n)
            else:
                return n
        raise GrammarTooComplexError("a chain of $ref does not end")

    def if_then_else(self, s: dict, ptr: str, base: str) -> Node:
        cond = self.to_ir(s["if"], ptr + "/if", base)
        then = self.to_ir(s["then"], ptr + "/then", base) if "then" in s else ANY
        other = self.to_ir(s["else"], ptr + "/else", base) if "else" in s else ANY
        try:
            neg_part = self.isect_not(other, cond, ptr + "/if")
        except _CannotNegate as e:
            self.unsupported("if", ptr + "/if", f"cannot decide the 'if' schema structurally ({e})")
            return ANY
        return self.union([self.isect(cond, then), neg_part])

    def dependency(self, k: str, v, ptr: str, base: str) -> Node:
        """dependentRequired / dependentSchemas: non-objects, objects without ``k``, or objects
        with ``k`` that satisfy the dependency."""
        if isinstance(v, list):
            if not all(isinstance(x, str) for x in v):
                raise InvalidSchemaError("dependentRequired values must be arrays of strings", ptr)
            present = Typed(obj=ObjC(required=tuple(dict.fromkeys([k, *v]))))
        else:
            sub = self.to_ir(v, ptr, base)
            present = self.isect(Typed(obj=ObjC(required=(k,))), sub)
        non_obj = Typed(True, frozenset({True, False}), NumC(), StrC(), ArrC(), None)
        return self.union([non_obj, Typed(obj=ObjC(props=((k, NOTHING),))), present])

    def unevaluated_props(self, node: Node, u: Node, ptr: str) -> Node:
        if u is ANY:
            return node
        node = self.expand(node)
        opts = node.options if isinstance(node, Union) else [node]
        out = []
        for o in opts:
            o = self.expand(o)
            if not isinstance(o, Typed):
                self.unsupported("unevaluatedProperties", ptr, "cannot track evaluated properties here")
                return node
            if o.obj is None:
                out.append(o)
                continue
            ob = o.obj
            if any(c.additional is not None for c in ob.rest):
                out.append(o)   # additionalProperties evaluates every key
                continue
            pats = tuple((src, e, ANY) for c in ob.rest for src, e, _ in c.patterns)
            nob = replace(ob, rest=ob.rest + (Conj(pats, u),))
            out.append(self.norm_typed(Typed(o.null, o.boolean, o.num, o.string, o.array, nob)))
        return self.union(out)

    def unevaluated_items(self, node: Node, u: Node, ptr: str) -> Node:
        if u is ANY:
            return node
        node = self.expand(node)
        opts = node.options if isinstance(node, Union) else [node]
        out = []
        for o in opts:
            o = self.expand(o)
            if not isinstance(o, Typed):
                self.unsupported("unevaluatedItems", ptr, "cannot track evaluated items here")
                return node
            if o.array is None or o.array.items is not None:
                out.append(o)
                continue
            a = o.array
            na = ArrC(a.prefix, u, a.min, a.max, a.unique, a.contains)
            out.append(self.norm_typed(Typed(o.null, o.boolean, o.num, o.string, na, o.obj)))
        return self.union(out)

    # ================================================================== IR -> grammar
    def lead_inner(self, depth: int) -> int:
        if self.indent is None:
            return self.ws
        return self.ex.literal("\n" + " " * (self.indent * (depth + 1)))

    def lead_close(self, depth: int) -> int:
        if self.indent is None:
            return self.ws
        return self.ex.literal("\n" + " " * (self.indent * depth))

    def tok(self, lead: int, e: int) -> int:
        return ~self.ex.concat(lead, e)

    def gen(self, node: Node, lead: int, depth: int) -> int:
        if self.indent is None:
            depth = 0
        key = (id(node), lead, depth)
        nt = self.gen_memo.get(key)
        if nt is not None:
            return nt
        g = self.g
        nt = g.fresh("v")
        self.gen_memo[key] = nt
        self.keep.append(node)
        if self.indent is not None and depth > 64:
            g.define(nt, [])
            return nt
        if isinstance(node, Ref):
            g.define(nt, [[self.gen(node.resolve(), lead, depth)]])
        elif isinstance(node, OneOf):
            g.define(nt, [[self.gen(self.resolve_oneof(node), lead, depth)]])
        elif isinstance(node, Union):
            g.define(nt, [[self.gen(o, lead, depth)] for o in node.options])
        else:
            g.define(nt, self.gen_typed(node, lead, depth))
        self.n_alts += len(g.rules[nt])
        if self.n_alts > MAX_RULES:
            raise GrammarTooComplexError("the schema's grammar exceeds its size bound")
        return nt

    def gen_typed(self, t: Typed, lead: int, depth: int) -> list:
        ex = self.ex
        scal = []
        if t.null:
            scal.append(ex.literal("null"))
        if True in t.boolean:
            scal.append(ex.literal("true"))
        if False in t.boolean:
            scal.append(ex.literal("false"))
        if t.num is not None:
            scal.append(self.num_tok(t.num))
        if t.string is not None:
            scal.append(self.str_tok(t.string))
        alts = []
        e = ex.alt(*scal)
        if e != EMPTY:
            alts.append([self.tok(lead, e)])
        if t.array is not None:
            alts.extend(self.gen_array(t.array, lead, depth))
        if t.obj is not None:
            alts.extend(self.gen_object(t.obj, lead, depth))
        return alts

    def num_tok(self, n: NumC) -> int:
        key = (n.integer, n.lo, n.lo_excl, n.hi, n.hi_excl, n.mults, n.excl, n.nonint, n.nmults)
        e = self.num_tok_cache.get(key)
        if e is None:
            e = number_regex(self.ex, integer=n.integer, lo=n.lo, lo_excl=n.lo_excl, hi=n.hi, hi_excl=n.hi_excl,
                             multiple_of=n.mults, excluded=n.excl, nonint=n.nonint, not_multiple_of=n.nmults,
                             full_number=self.lx.number)
            self.num_tok_cache[key] = e
        return e

    def str_body(self, sc: StrC) -> int:
        ex = self.ex
        S = self.strings
        if sc.literals is not None:
            return ex.alt(*[S.literal(v, False) for v in sc.literals])
        parts = []
        if sc.expr is not None:
            parts.append(S.enc(sc.expr))
        if sc.min_len or sc.max_len is not None:
            if sc.min_len > MAX_UNROLL * 10:
                raise GrammarTooComplexError("minLength too large")
            parts.append(ex.repeat(S.unit, sc.min_len, sc.max_len))
        if sc.excl:
            parts.append(ex.complement(ex.alt(*[S.literal(v, True) for v in sc.excl])))
            if sc.expr is None:
                parts.append(S.body_full)
        if not parts:
            return S.body_full
        return ex.intersect(*parts)

    def str_tok(self, sc: StrC) -> int:
        e = self.str_tok_cache.get(id(sc))
        if e is None:
            q = self.strings.quote
            e = self.ex.concat(q, self.str_body(sc), q)
            self.str_tok_cache[id(sc)] = e
            self.keep.append(sc)
        return e

    # -------------------------------------------------------------- arrays
    def gen_array(self, a: ArrC, lead: int, depth: int) -> list:
        ex, g = self.ex, self.g
        mn, mx = a.min, a.max
        prefix = list(a.prefix)
        for i, p in enumerate(prefix):
            if is_nothing(p):
                mx = i if mx is None else min(mx, i)
                prefix = prefix[:i]
                break
        items = a.items if a.items is not None else ANY
        if is_nothing(items):
            mx = len(prefix) if mx is None else min(mx, len(prefix))
        if mx is not None and mn > mx:
            return []
        elem_lead = self.lead_inner(depth)
        comma = self.tok(EPS if self.indent is not None else self.ws, ex.literal(","))
        lk = self.tok(lead, ex.literal("["))
        rk_empty = self.tok(EPS if self.indent is not None else self.ws, ex.literal("]"))
        rk = self.tok(self.lead_close(depth), ex.literal("]"))

        def elem(i: int) -> int:
            n = prefix[i] if i < len(prefix) else items
            return self.gen(n, elem_lead, depth + 1)

        if a.unique and (mx is None or mx > 1):
            r = self.gen_unique(a, prefix, items, mn, mx, elem_lead, depth, lk, rk, rk_empty, comma)
            if r is not None:
                return r
        if a.contains:
            return self.gen_contains(a, prefix, items, mn, mx, elem_lead, depth, lk, rk, rk_empty, comma)
        K = max(len(prefix), mn)
        if max(K, mx or 0) > MAX_UNROLL:
            raise GrammarTooComplexError("minItems/maxItems/prefixItems too large to unroll")
        alts = []
        if mn == 0:
            alts.append([lk, rk_empty])
        if mx is not None and mx == 0:
            return alts
        # E[i]: the rest after i elements
        tail = None
        top = mx if mx is not None else K
        E: dict[int, int] = {}
        for i in range(top, 0, -1):
            nt = g.fresh("items")
            E[i] = nt
        if mx is None:
            tail = g.fresh("tail")
            g.define(tail, [[], [tail, comma, self.gen(items, elem_lead, depth + 1)]])
        for i in range(top, 0, -1):
            nt = E[i]
            if mx is not None and i == mx:
                g.define(nt, [[]])
                continue
            if mx is None and i >= K:
                g.define(nt, [[tail]])
                continue
            nxt = E.get(i + 1, tail)
            rule = [[comma, elem(i), nxt]]
            if i >= mn:
                rule.append([])
            g.define(nt, rule)
        first_rest = E[1] if 1 in E else tail
        alts.append([lk, elem(0), first_rest, rk])
        return alts

    def finite_values(self, n: Node, out: dict) -> bool:
        """Collect the distinct values of a finite scalar schema as {key: token expr}."""
        n = self.expand(n)
        if isinstance(n, Union):
            return all(self.finite_values(o, out) for o in n.options)
        if not isinstance(n, Typed) or n.array is not None or n.obj is not None:
            return False
        ex = self.ex
        if n.null:
            out[("null",)] = ex.literal("null")
        for b in n.boolean:
            out[("bool", b)] = ex.literal("true" if b else "false")
        if n.num is not None:
            if n.num.lo is None or n.num.lo != n.num.hi:
                return False
            out[("num", n.num.lo)] = self.num_tok(n.num)
        if n.string is not None:
            if n.string.literals is None:
                return False
            for v in n.string.literals:
                out[("str", v)] = self.str_tok(StrC(literals=frozenset({v})))
        return len(out) <= MAX_UNIQUE_VALUES

    def gen_unique(self, a, prefix, items, mn, mx, elem_lead, depth, lk, rk, rk_empty, comma):
        g = self.g
        vals: dict = {}
        if prefix or not self.finite_values(items, vals):
            self.unsupported("uniqueItems", a.unique, "uniqueItems is only enforced for arrays of at most "
                             f"{MAX_UNIQUE_VALUES} distinct scalar values or maxItems <= 1")
            return None
        toks = [e for e in vals.values()]
        n = len(toks)
        top = n if mx is None else min(n, mx)
        memo: dict[int, int] = {}

        def U(mask: int, count: int) -> int:
            nt = memo.get(mask)
            if nt is not None:
                return nt
            nt = g.fresh("uniq")
            memo[mask] = nt
            rule = []
            if count >= mn:
                rule.append([])
            if count < top:
                for j in range(n):
                    if not mask >> j & 1:
                        rule.append([comma, self.tok(elem_lead, toks[j]), U(mask | 1 << j, count + 1)])
            g.define(nt, rule)
            return nt

        try:
            alts = []
            if mn == 0:
                alts.append([lk, rk_empty])
            if top >= 1:
                for j in range(n):
                    alts.append([lk, self.tok(elem_lead, toks[j]), U(1 << j, 1), rk])
            return alts
        finally:
            U = None  # break the closures' reference cycle

    def gen_contains(self, a, prefix, items, mn, mx, elem_lead, depth, lk, rk, rk_empty, comma):
        """Arrays with contains clauses: the state counts the items matching each clause (capped);
        an item is a hit or a miss of each clause (a miss must match the complement only when
        maxContains bounds the clause)."""
        g = self.g
        if len(a.contains) > 3:
            raise GrammarTooComplexError("too many contains constraints on one array")
        clauses = []
        for c, cmin, cmax, cptr, start in a.contains:
            neg = None
            if cmax is not None:
                try:
                    neg = self.negate(c, cptr)
                except _CannotNegate as e:
                    self.unsupported("maxContains", cptr, f"cannot compute the complement of the contains schema ({e})")
                    cmax = None
            clauses.append((c, cmin, cmax, neg, start, cmin if cmax is None else cmax + 1))
        nc = len(clauses)
        K = max([len(prefix), mn] + [cl[4] for cl in clauses])
        top = mx if mx is not None else K
        states = top + 1
        for cl in clauses:
            states *= cl[5] + 1
        if states > MAX_OBJECT_STATES:
            raise GrammarTooComplexError("contains with large bounds")

        def elem_node(i):
            return prefix[i] if i < len(prefix) else items

        elem_memo: dict = {}

        def elements(i: int) -> list:
            """[(value nonterminal, hit bits)] for the item at index i."""
            key = min(i, K) if i >= len(prefix) else i
            r = elem_memo.get(key)
            if r is not None:
                return r
            r = []
            for bits in range(1 << nc):
                node = elem_node(i)
                ok = True
                for j, (c, _, cmax, neg, start, _) in enumerate(clauses):
                    if bits >> j & 1:
                        if i < start:
                            ok = False
                            break
                        node = self.isect(node, c)
                    elif neg is not None and i >= start:
                        node = self.isect(node, neg)
                if ok and not is_nothing(node):
                    r.append((self.gen(node, elem_lead, depth + 1), bits))
            elem_memo[key] = r
            return r

        def ok_end(ks) -> bool:
            return all(k >= cl[1] and (cl[2] is None or k <= cl[2]) for k, cl in zip(ks, clauses))

        def step(ks, bits):
            out = []
            for j, (k, cl) in enumerate(zip(ks, clauses)):
                if bits >> j & 1:
                    if cl[2] is not None and k + 1 > cl[2]:
                        return None
                    k = min(k + 1, cl[5])
                out.append(k)
            return tuple(out)

        memo: dict = {}

        def S(i: int, ks) -> int:
            if mx is None and i > K:
                i = K
            key = (i, ks)
            nt = memo.get(key)
            if nt is not None:
                return nt
            nt = g.fresh("contains")
            memo[key] = nt
            rule = []
            if i >= mn and ok_end(ks):
                rule.append([])
            if mx is None or i < mx:
                for v, bits in elements(i):
                    nk = step(ks, bits)
                    if nk is not None:
                        rule.append([comma, v, S(i + 1, nk)])
            g.define(nt, rule)
            return nt

        try:
            zero = (0,) * nc
            alts = []
            if mn == 0 and ok_end(zero):
                alts.append([lk, rk_empty])
            if mx is None or mx >= 1:
                for v, bits in elements(0):
                    nk = step(zero, bits)
                    if nk is not None:
                        alts.append([lk, v, S(1, nk), rk])
            return alts
        finally:
            S = None  # break the closures' reference cycle

    # -------------------------------------------------------------- objects
    def key_regions(self, o: ObjC, declared: list) -> list:
        """[(decoded key language or None for any, value node)] for undeclared keys: the key space
        is split by which patternProperties match (regions refined one pattern at a time, dead
        regions dropped)."""
        ex = self.ex
        groups: dict[int, list] = {}   # pattern expr -> [(conj index, node)]
        for ci, c in enumerate(o.rest):
            for _, e, pn in c.patterns:
                groups.setdefault(e, []).append((ci, pn))
        regions = [(self.str_lang(o.names) if o.names is not None else None, ())]
        for e, _ in groups.items():
            new = []
            for lang, hits in regions:
                pos = e if lang is None else ex.intersect(lang, e)
                neg = ex.intersect(ex.complement(e), self.strings.any_dec if lang is None else lang)
                for lg, h in ((pos, hits + (e,)), (neg, hits)):
                    if self.lang_empty(lg) is not True:
                        new.append((lg, h))
            regions = new
            if len(regions) > MAX_PATTERN_REGIONS:
                raise GrammarTooComplexError("too many patternProperties regions")
        out = []
        for lang, hits in regions:
            v = ANY
            for ci, c in enumerate(o.rest):
                mine = [pn for e in hits for cj, pn in groups[e] if cj == ci]
                if mine:
                    for pn in mine:
                        v = self.isect(v, pn)
                elif c.additional is not None:
                    v = self.isect(v, c.additional)
            if not is_nothing(v):
                out.append((lang, v))
        return out

    def gen_object(self, o: ObjC, lead: int, depth: int) -> list:
        ex, g = self.ex, self.g
        S = self.strings
        props = list(o.props)
        declared = {k for k, _ in props}
        for r in o.required:
            if r not in declared:
                props.append((r, self.rest_value(o, r)))
        members = []   # (key token, value nt, required)
        for k, v in props:
            if o.names is not None and not self.str_ok(o.names, k):
                v = NOTHING
            req = k in o.required
            if is_nothing(v):
                if req:
                    return []
                continue
            members.append((k, v, req))
        key_lead = self.lead_inner(depth)
        colon = ex.concat(self.ws, ex.literal(":")) if self.indent is None else ex.literal(":")
        vlead = self.ws if self.indent is None else ex.literal(" ")
        sep_ws = EPS if self.indent is not None else self.ws
        comma = self.tok(sep_ws, ex.literal(","))
        lb = self.tok(lead, ex.literal("{"))
        rb_empty = self.tok(sep_ws, ex.literal("}"))
        rb = self.tok(self.lead_close(depth), ex.literal("}"))
        q = S.quote
        clauses = list(o.some)
        if len(clauses) > 4:
            raise GrammarTooComplexError("too many existential property constraints (from not/oneOf)")
        full = (1 << len(clauses)) - 1
        subsets = [t for t in range(1, full + 1)]

        def key_tok(body: int) -> int:
            return self.tok(key_lead, ex.concat(q, body, q, colon))

        mem = []   # per declared member: ([(symbols, bits)], required)
        for k, v, req in members:
            kb = k.encode("utf-8", "surrogatepass")
            ktok = key_tok(S.literal(k, False))
            variants = [([ktok, self.gen(v, vlead, depth + 1)], 0)]
            for t in subsets:
                cl = [clauses[c] for c in range(len(clauses)) if t >> c & 1]
                if all(ex.matches(lang, kb) for lang, _ in cl):
                    vv = v
                    for _, cv in cl:
                        vv = self.isect(vv, cv)
                    if not is_nothing(vv):
                        variants.append(([ktok, self.gen(vv, vlead, depth + 1)], t))
            mem.append((variants, req))
        all_names = [k for k, _ in props]
        # keys are spelled like the declared ones (raw ASCII, short escapes, \\uXXXX for control and
        # non-ASCII characters): other keys are those spellings minus the declared names'
        excl_declared = ex.complement(ex.alt(*[S.literal(k, False) for k in all_names])) if all_names else None
        add_alts = []   # [(symbols, bits)]
        for lang, v in self.key_regions(o, all_names):
            for t in [0] + subsets:
                cl = [clauses[c] for c in range(len(clauses)) if t >> c & 1]
                lg, vv = lang, v
                for cl_lang, cv in cl:
                    lg = cl_lang if lg is None else ex.intersect(lg, cl_lang)
                    vv = self.isect(vv, cv)
                if is_nothing(vv):
                    continue
                if t:
                    dec = ex.intersect(lg, ex.complement(ex.alt(*[ex.literal(k.encode("utf-8", "surrogatepass"))
                                                                 for k in all_names]))) if all_names else lg
                    if self.lang_empty(dec) is True:
                        continue
                body = S.body_restricted if lg is None else S.enc(lg)
                if excl_declared is not None:
                    body = ex.intersect(body, excl_declared)
                add_alts.append(([key_tok(body), self.gen(vv, vlead, depth + 1)], t))
        n = len(mem)
        mn, mx = o.min, o.max
        if mx is not None and sum(1 for _, r in mem if r) > mx:
            return []
        if not add_alts:
            if mn > n:
                return []
            if mx is not None and mx >= n:
                mx = None
        cap = max(mn, mx) if mx is not None else mn
        if 1 < n <= self.unordered_max:
            return self.gen_unordered(mem, add_alts, mn, mx, cap, full, comma, lb, rb, rb_empty)
        if (n + 1) * (cap + 1) * (full + 1) > MAX_OBJECT_STATES:
            raise GrammarTooComplexError("object with too many properties/counts")
        req_from = [False] * (n + 1)
        for i in range(n - 1, -1, -1):
            req_from[i] = req_from[i + 1] or mem[i][1]

        def cnt(c: int) -> int:
            return min(c, cap) if mx is None else c

        def can_add(c: int) -> bool:
            return mx is None or c + 1 <= mx

        Rm: dict = {}
        Dm: dict = {}

        def R(i: int, c: int, f: int) -> int:
            key = (i, c, f)
            nt = Rm.get(key)
            if nt is not None:
                return nt
            nt = g.fresh("members")
            Rm[key] = nt
            rule = []
            if can_add(c):
                for syms, bits in add_alts:
                    rule.append([comma, *syms, R(i, cnt(c + 1), f | bits)])
            rule.append([D(i, c, f)])
            g.define(nt, rule)
            return nt

        def D(i: int, c: int, f: int) -> int:
            key = (i, c, f)
            nt = Dm.get(key)
            if nt is not None:
                return nt
            nt = g.fresh("props")
            Dm[key] = nt
            rule = []
            if i == n:
                if c >= mn and f == full:
                    rule.append([])
            else:
                if can_add(c):
                    for syms, bits in mem[i][0]:
                        rule.append([comma, *syms, R(i + 1, cnt(c + 1), f | bits)])
                if not mem[i][1]:
                    rule.append([D(i + 1, c, f)])
            g.define(nt, rule)
            return nt

        try:
            alts = []
            if not req_from[0] and mn == 0 and full == 0:
                alts.append([lb, rb_empty])
            if mx is not None and mx == 0:
                return alts
            first = g.fresh("first")
            frule = []
            for syms, bits in add_alts:
                frule.append([*syms, R(0, cnt(1), bits)])
            FD: dict = {}

            def Fd(i: int) -> int:
                nt = FD.get(i)
                if nt is not None:
                    return nt
                nt = g.fresh("firstprop")
                FD[i] = nt
                rule = []
                if i < n:
                    for syms, bits in mem[i][0]:
                        rule.append([*syms, R(i + 1, cnt(1), bits)])
                    if not mem[i][1]:
                        rule.append([Fd(i + 1)])
                g.define(nt, rule)
                return nt

            frule.append([Fd(0)])
            g.define(first, frule)
            alts.append([lb, first, rb])
            return alts
        finally:
            R = D = Fd = None  # break the closures' reference cycle


    def gen_unordered(self, mem, add_alts, mn, mx, cap, full, comma, lb, rb, rb_empty) -> list:
        """Members in any order: the state is the set of declared properties already present
        (2^n states, so only for small n)."""
        g = self.g
        n = len(mem)
        req_mask = sum(1 << j for j in range(n) if mem[j][1])

        def cnt(c: int) -> int:
            return min(c, cap) if mx is None else c

        def can_add(c: int) -> bool:
            return mx is None or c + 1 <= mx

        memo: dict = {}

        def U(seen: int, c: int, f: int) -> int:
            key = (seen, c, f)
            nt = memo.get(key)
            if nt is not None:
                return nt
            if len(memo) > MAX_OBJECT_STATES:
                raise GrammarTooComplexError("object with too many unordered properties")
            nt = g.fresh("members")
            memo[key] = nt
            rule = []
            if seen & req_mask == req_mask and c >= mn and f == full:
                rule.append([])
            if can_add(c):
                for j in range(n):
                    if not seen >> j & 1:
                        for syms, bits in mem[j][0]:
                            rule.append([comma, *syms, U(seen | 1 << j, cnt(c + 1), f | bits)])
                for syms, bits in add_alts:
                    rule.append([comma, *syms, U(seen, cnt(c + 1), f | bits)])
            g.define(nt, rule)
            return nt

        try:
            alts = []
            if not req_mask and mn == 0 and full == 0:
                alts.append([lb, rb_empty])
            if mx is not None and mx == 0:
                return alts
            for j in range(n):
                for syms, bits in mem[j][0]:
                    alts.append([lb, *syms, U(1 << j, cnt(1), bits), rb])
            for syms, bits in add_alts:
                alts.append([lb, *syms, U(0, cnt(1), bits), rb])
            return alts
        finally:
            U = None  # break the closures' reference cycle


class _CannotNegate(Exception):
    pass


def _num_and(a: NumC, b: NumC) -> NumC:
    lo, lo_excl = a.lo, a.lo_excl
    if b.lo is not None and (lo is None or b.lo > lo or (b.lo == lo and b.lo_excl)):
        lo, lo_excl = b.lo, b.lo_excl
    hi, hi_excl = a.hi, a.hi_excl
    if b.hi is not None and (hi is None or b.hi < hi or (b.hi == hi and b.hi_excl)):
        hi, hi_excl = b.hi, b.hi_excl
    mults = tuple(dict.fromkeys(a.mults + b.mults))
    excl = tuple(dict.fromkeys(a.excl + b.excl))
    nmults = tuple(dict.fromkeys(a.nmults + b.nmults))
    return NumC(a.integer or b.integer, lo, lo_excl, hi, hi_excl, mults, excl, a.nonint or b.nonint, nmults)


def _arr_free(a: ArrC | None) -> bool:
    return a is not None and not a.prefix and (a.items is None or a.items is ANY) and a.min == 0 \
        and a.max is None and not a.unique and not a.contains


def _obj_free(o: ObjC | None) -> bool:
    return o is not None and not o.props and not o.required and not o.rest and o.names is None \
        and o.min == 0 and o.max is None and not o.some


def _tmask(n: Node) -> int:
    """Bit set of the JSON types a node may accept (all for references and oneOf)."""
    if isinstance(n, Typed):
        return (n.null) | (bool(n.boolean) << 1) | ((n.num is not None) << 2) | ((n.string is not None) << 3) \
            | ((n.array is not None) << 4) | ((n.obj is not None) << 5)
    if isinstance(n, Union):
        m = 0
        for o in n.options:
            m |= _tmask(o)
        return m
    return 63


def _detect_draft(root) -> int:
    if not isinstance(root, dict):
        return 2020
    s = root.get("$schema")
    if not isinstance(s, str):
        return 2020
    for tag, d in (("draft-03", 3), ("draft-04", 4), ("draft-06", 6), ("draft-07", 7), ("2019-09", 2019),
                   ("2020-12", 2020)):
        if tag in s:
            return d
    return 2020


def canonical_schema_text(schema) -> str:
    """A cache key for a schema: keys sorted everywhere except inside ``properties``, whose order
    is the order of the output (so two schemas differing only there get different grammars)."""

    def canon(x, ordered=False):
        if isinstance(x, dict):
            items = x.items() if ordered else sorted(x.items())
            return {k: canon(v, ordered=(k == "properties" and not ordered)) for k, v in items}
        if isinstance(x, list):
            return [canon(v) for v in x]
        return x

    return json.dumps(canon(schema), separators=(",", ":"), ensure_ascii=False)


def json_schema_grammar(schema, *, whitespace: str = "flexible", max_whitespace: int = DEFAULT_MAX_WHITESPACE,
                        strict: bool = False, lenient: bool = False, indent: int | None = None,
                        unordered_properties: int = 0, exprs=None) -> Grammar:
    """The grammar of the JSON documents valid against ``schema`` (see the module docstring).

    ``unordered_properties=N``: objects with at most N declared properties (N <= 10) accept them
    in any order (the grammar tracks which are present: 2^N states); larger objects keep the
    ``properties`` order. ``exprs``: the ExprSet to build in (a compiler shares one across its
    grammars so that derivatives are computed once)."""
    schema = normalize_schema_input(schema)
    if indent is not None and (not isinstance(indent, int) or isinstance(indent, bool) or indent < 0):
        raise ValueError("indent must be a non-negative integer")
    c = None
    try:
        c = _Compiler(schema, whitespace=whitespace, max_whitespace=max_whitespace, strict=strict,
                      lenient=lenient, indent=indent, unordered_max=min(max(unordered_properties, 0), 10),
                      exprs=exprs)
        node = c.to_ir(schema, "#", c.base0)
        if is_nothing(node):
            raise EmptyLanguageError("the schema accepts no JSON value")
        lead = c.ws if indent is None else EPS
        top = c.gen(node, lead, 0)
    except RecursionError:
        raise GrammarTooComplexError("the schema nests too deeply") from None
    finally:
        if c is not None:
            g, found = c.g, c.warnings
            c.close()
    if found:
        warnings.warn("JSON schema constraints ignored (lenient=True): " + "; ".join(found), stacklevel=3)
    g.rule("root", [[top]])
    g.root = g.index["root"]
    return g
