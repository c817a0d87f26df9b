"""Builtin grammars: any JSON value, any JSON object, and the JSON lexemes they share.

Whitespace policy (``whitespace=``):

``"flexible"`` (default)
    up to ``max_whitespace`` (default 32) consecutive bytes of ``[ \\t\\n\\r]`` before any JSON
    token, so pretty-printed output works but a model cannot loop on whitespace for ever;
    nothing is allowed after the final token, so the model stops right after it.
``"compact"``
    no whitespace at all (``json.dumps(separators=(",", ":"))``).
a regex string
    a custom pattern for the whitespace allowed before each token (e.g. ``"[ ]?"``).

Every lexeme carries the whitespace *before* it. A run of whitespace therefore always lies inside
one lexeme, so its bound holds, and no lexeme ends in whitespace, so maximal munch is exact: the
lexemes are greedy-safe by construction (:func:`~.cfg.lower` does not need to check them).
"""
from __future__ import annotations

from dataclasses import InitVar, dataclass

from .cfg import Grammar
from .regexset import ExprSet

DEFAULT_MAX_WHITESPACE = 32


def whitespace_expr(exprs: ExprSet, whitespace: str = "flexible", max_whitespace: int = DEFAULT_MAX_WHITESPACE) -> int:
    if whitespace == "flexible":
        return exprs.repeat(exprs.byteset(_mask(b" \t\n\r")), 0, max_whitespace)
    if whitespace == "compact":
        return exprs.EPS
    from .regex import parse_regex

    return parse_regex(whitespace, exprs)


def _mask(bs: bytes) -> int:
    m = 0
    for b in bs:
        m |= 1 << b
    return m


@dataclass
class JsonLexemes:
    """Expressions of the JSON tokens (without leading whitespace) in one ExprSet (not kept:
    the ExprSet keeps these among its shared compile tables, and a reference back would make the
    pair a cycle, freed only by a full garbage collection)."""

    exprs: InitVar[ExprSet]

    def __post_init__(self, exprs):
        ex = exprs
        from .regex import char_class_expr

        # any Unicode scalar except '"', '\\' and control characters U+0000..U+001F
        plain = char_class_expr([(0x20, 0x21), (0x23, 0x5B), (0x5D, 0x10FFFF)], ex)
        hexd = ex.byteset(_mask(b"0123456789abcdefABCDEF"))
        esc = ex.concat(ex.literal("\\"), ex.alt(ex.byteset(_mask(b'"\\/bfnrt')),
                                                 ex.concat(ex.literal("u"), ex.repeat(hexd, 4, 4))))
        self.string_char = ex.alt(plain, esc)
        self.string = ex.concat(ex.literal('"'), ex.star(self.string_char), ex.literal('"'))
        digit = ex.byte_range(0x30, 0x39)
        digit19 = ex.byte_range(0x31, 0x39)
        self.integer = ex.concat(ex.opt(ex.literal("-")), ex.alt(ex.literal("0"), ex.concat(digit19, ex.star(digit))))
        frac = ex.concat(ex.literal("."), ex.plus(digit))
        exp = ex.concat(ex.byteset(_mask(b"eE")), ex.opt(ex.byteset(_mask(b"+-"))), ex.plus(digit))
        self.number = ex.concat(self.integer, ex.opt(frac), ex.opt(exp))


def json_grammar(exprs: ExprSet | None = None, *, whitespace: str = "flexible",
                 max_whitespace: int = DEFAULT_MAX_WHITESPACE, object_only: bool = False) -> Grammar:
    """Any JSON value (or, with ``object_only``, any JSON object) as a lexeme grammar."""
    g = Grammar(exprs)
    ex = g.exprs
    ws = whitespace_expr(ex, whitespace, max_whitespace)
    lx = JsonLexemes(ex)

    def tok(e: int) -> int:
        return ~ex.concat(ws, e)

    lb, rb, lk, rk = tok(ex.literal("{")), tok(ex.literal("}")), tok(ex.literal("[")), tok(ex.literal("]"))
    comma, colon = tok(ex.literal(",")), tok(ex.literal(":"))
    string, number = tok(lx.string), tok(lx.number)
    lit = tok(ex.alt(ex.literal("true"), ex.literal("false"), ex.literal("null")))

    value = g.nonterminal("value")
    obj = g.nonterminal("object")
    members = g.nonterminal("members")
    arr = g.nonterminal("array")
    elements = g.nonterminal("elements")
    g.define(value, [[obj], [arr], [string], [number], [lit]])
    g.define(obj, [[lb, rb], [lb, members, rb]])
    # left recursion keeps Earley linear on long objects and arrays
    g.define(members, [[string, colon, value], [members, comma, string, colon, value]])
    g.define(arr, [[lk, rk], [lk, elements, rk]])
    g.define(elements, [[value], [elements, comma, value]])
    g.rule("root", [[obj]] if object_only else [[value]])
    g.root = g.index["root"]
    return g
