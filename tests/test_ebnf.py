"""The EBNF/GBNF front end (grammask.grammar.ebnf).

Languages are checked with a tiny reference recognizer defined here: a CYK-style table over
byte spans, filled shortest span first with a fixpoint per span (so left recursion, right
recursion and nullable rules all work), terminals checked with ``ExprSet`` derivatives. Regular
grammars are also compared with the ``regex`` module on random strings.
"""
from __future__ import annotations

import random

import pytest
import regex

from grammask.errors import (
    GrammarSyntaxError,
    GrammarTooComplexError,
    UndefinedRuleError,
)
from grammask.grammar.cfg import lower
from grammask.grammar.ebnf import MAX_EXPANSION, parse_ebnf
from grammask.grammar.regexset import EMPTY, ExprSet


# ---------------------------------------------------------------------------- reference recognizer

def derives(g, data: bytes | str, root: str | None = None) -> bool:
    """True iff the IR grammar ``g`` derives ``data`` from ``root`` (default: ``g.root``)."""
    if isinstance(data, str):
        data = data.encode("utf-8")
    ex = g.exprs
    root_id = g.root if root is None else g.index[root]
    rules = [(nt, alts) for nt, alts in enumerate(g.rules) if alts is not None]
    n = len(data)
    term_cache: dict[tuple[int, int], list[int]] = {}

    def term_ends(e: int, p: int) -> list[int]:
        key = (e, p)
        r = term_cache.get(key)
        if r is None:
            r = [p] if ex.nullable(e) else []
            d = e
            for q in range(p, n):
                d = ex.deriv(d, data[q])
                if d == EMPTY:
                    break
                if ex.nullable(d):
                    r.append(q + 1)
            term_cache[key] = r
        return r

    ends: dict[tuple[int, int], set[int]] = {}  # (nonterminal, start) -> ends found so far

    def alt_derives(alt, i, j) -> bool:
        cur = {i}
        for s in alt:
            nxt = set()
            for p in cur:
                found = term_ends(~s, p) if s < 0 else ends.get((s, p), ())
                nxt.update(q for q in found if q <= j)
            if not nxt:
                return False
            cur = nxt
        return j in cur

    for length in range(n + 1):
        for i in range(n - length + 1):
            j = i + length
            changed = True
            while changed:
                changed = False
                for nt, alts in rules:
                    got = ends.setdefault((nt, i), set())
                    if j not in got and any(alt_derives(a, i, j) for a in alts):
                        got.add(j)
                        changed = True
    return n in ends.get((root_id, 0), ())


def check(text: str, accept: list, reject: list, root: str = "root", lowers: bool = True):
    g = parse_ebnf(text, root=root)
    assert g.root == g.index[root]
    for s in accept:
        assert derives(g, s), f"should accept {s!r}"
    for s in reject:
        assert not derives(g, s), f"should reject {s!r}"
    if lowers:
        lower(g, root)  # must not raise
    return g


# ---------------------------------------------------------------------------- languages

JSON_LIKE = r"""
# a small JSON
root   ::= ws value ws
value  ::= object | array | string | number | "true" | "false" | "null"
object ::= "{" ws ( member ( ws "," ws member )* ws )? "}"
member ::= string ws ":" ws value
array  ::= "[" ws ( value ( ws "," ws value )* ws )? "]"
string ::= "\"" ( [^"\\\x00-\x1f] | "\\" ( ["\\/bfnrt] | "u" [0-9a-fA-F]{4} ) )* "\""
number ::= "-"? ( "0" | [1-9] [0-9]* ) ( "." [0-9]+ )? ( [eE] [-+]? [0-9]+ )?
ws     ::= [ \t\n]*
"""


def test_json_like():
    check(
        JSON_LIKE,
        ['{"a": [1, 2.5]}', "[]", " [true,null] ", '"\\u00e9x"', "-0.5e+3", '{"k":{}}', '["é"]'],
        ['{"a" 1}', "[1,]", "01", '"\\x"', "{", "tru", '"a', "[1 2]"],
    )


def test_json_like_lowers():
    lower(parse_ebnf(JSON_LIKE), "root")


def test_adjacent_nullable_whitespace_lowers():
    text = 'root ::= "[" ws ( "1" ( ws "," ws "1" )* )? ws "]"\nws ::= [ \\t\\n]*'
    check(text, ["[]", "[ 1 , 1 ]", "[  ]"], ["[,]"], lowers=False)
    lower(parse_ebnf(text), "root")


def test_arithmetic_left_and_right_recursion():
    text = """
root   ::= expr
expr   ::= expr [-+] term | term
term   ::= factor [*/] term | factor
factor ::= [0-9]+ | "(" expr ")" | "-" factor
"""
    check(text, ["1", "1+2*3", "(1-2)/-3", "((4))", "12*(3+4)-5"], ["", "1+", "(1", "1)", "+1", "1**2"])


def test_balanced_parentheses_and_empty_alternatives():
    check('root ::= "(" root ")" root | ""', ["", "()", "(())()", "()(()())"], ["(", ")(", "(()"])
    check('root ::= sign [0-9]\nsign ::= "" | "+" | "-"', ["1", "+1", "-1"], ["", "+-1", "++1"])
    check('root ::= "a" ( ) "b" ("" | "c")', ["ab", "abc"], ["a", "ac", "abcc"])


def test_nested_quantifiers_with_references():
    text = """
root ::= ( ( "a" b? )+ "c" )*
b    ::= "b" | "bb"
"""
    check(text, ["", "ac", "abbabac", "acac", "abacabbc"], ["a", "c", "abbbac", "abbbc", "acc", "bc"])


def test_bounded_repetition_with_references():
    text = """
root ::= item ( "," item ){1,3} tail{0} opt{2,} end{3}
item ::= [a-b]
tail ::= "t"
opt  ::= "o"
end  ::= "e"
"""
    check(text, ["a,booeee", "a,b,a,booooeee"], ["aooeee", "a,b,a,b,aooeee", "a,booee", "a,boeee", "a,btooeee"])


def test_unicode_classes_and_escapes():
    text = r"""
root ::= greek+ "\u00e9" [^a-z] emoji? "\x41\t\"\\\n" "\U0001F600"
greek ::= [α-ω]
emoji ::= [\U0001F600-\U0001F64F]
"""
    check(
        text,
        ['αβéZ\U0001F601A\t"\\\n\U0001F600', 'ωéé' + 'A\t"\\\n\U0001F600'],
        ['éZA\t"\\\n\U0001F600', 'αéaA\t"\\\n\U0001F600', 'αéZ\U0001F680A\t"\\\n\U0001F600'],
    )
    # a negated class matches any scalar value outside it, multi-byte ones included, never a surrogate
    g = check("root ::= [^a]", ["b", "\n", "é", "\U0010FFFF", "\uFFFF"], ["a", "", "bb"])
    assert not derives(g, b"\xed\xa0\x80")  # the UTF-8-like encoding of U+D800
    assert not derives(g, b"\xff")


def test_dot_is_any_character():
    check('root ::= "<" . ">"', ["<a>", "<\n>", "<é>", "<\U0001F600>"], ["<>", "<ab>"])


def test_character_class_dashes_and_escapes():
    check("root ::= [-a]+", ["-", "a-a"], ["b"])
    check("root ::= [a-]+", ["-", "a-"], ["b"])
    check("root ::= [a-c-e]+", ["b", "-", "e"], ["d"])
    check(r"root ::= [\-\]\\\^]+", ["-", "]", "\\", "^"], ["a", "["])
    check(r"root ::= [\x41-\x43\u00e9]", ["A", "C", "é"], ["D"])
    check("root ::= [^]", ["a", "\n", "é"], [""])
    check('root ::= [] | "x"', ["x"], ["", "[", "]"])
    check(r'root ::= [\n\t ]* "a"', ["\n \ta", "a"], [" b"])


def test_multiline_bodies_comments_crlf_and_dashed_names():
    text = (
        "# leading comment\r\n"
        "root ::= first-part # trailing comment\r\n"
        "         | second_part\r"
        '           "!"\n'
        'first-part ::= "a"\n'
        "second_part ::=\n"
        '   "b" |\n'
        '   "c"\n'
    )
    check(text, ["a", "b!", "c!"], ["a!", "b", "!"])


def test_string_escapes():
    g = parse_ebnf(r'''root ::= "\"\\\/\'\?\[\]\n\r\t\b\f\a\v\0\e\x7f\u20ac\U0001F600"''')
    assert derives(g, "\"\\/'?[]\n\r\t\b\f\a\v\0\x1b\x7f€\U0001F600")
    g = parse_ebnf(r'root ::= "\x41B"')  # \x takes exactly two hex digits
    assert derives(g, "AB")


def test_lookahead_assertion_is_ignored():
    plain = 'root ::= a "b"\na ::= "x"*'
    with_la = 'root ::= a "b"\na ::= "x"* (= "b")'
    for text in (plain, with_la):
        check(text, ["b", "xxb"], ["x", "xbb"])
    check('root ::= a\na ::= "x" | "y" (= ("z" | c)*)\nc ::= "c"', ["x", "y"], ["z"])
    with pytest.raises(UndefinedRuleError) as ei:
        parse_ebnf('root ::= "x" (= nope)')
    assert (ei.value.line, ei.value.column) == (1, 17)
    with pytest.raises(GrammarSyntaxError) as ei:
        parse_ebnf('root ::= ("x" (= "y") )')
    assert (ei.value.line, ei.value.column) == (1, 15)


def test_regex_macro():
    check('root ::= "<" Regex("[a-c]+\\\\d{2}") ">"', ["<ab12>"], ["<12>", "<a1>"])
    with pytest.raises(GrammarSyntaxError):
        parse_ebnf('root ::= Regex("(a")')
    with pytest.raises(GrammarSyntaxError):
        parse_ebnf('root ::= Regex("a", json_string=true)')


def test_custom_root_and_shared_exprset():
    ex = ExprSet()
    g = parse_ebnf('start ::= "a" other\nother ::= "b"', root="start", exprs=ex)
    assert g.exprs is ex
    assert g.root == g.index["start"]
    assert derives(g, "ab")
    lower(g, "start")


def test_terminal_only_parts_become_single_terminals():
    g = parse_ebnf('root ::= [a-z]+\nx ::= ("a" | "b")* "c"{2,5} [0-9]? root')
    root = g.index["root"]
    assert len(g.rules[root]) == 1 and len(g.rules[root][0]) == 1 and g.rules[root][0][0] < 0
    x = g.rules[g.index["x"]]
    assert len(x) == 1 and len(x[0]) == 2 and x[0][0] < 0 and x[0][1] == root
    assert len(g.names) == 2  # no helper rules


# ---------------------------------------------------------------------------- against `regex`

REGULAR = [
    ('root ::= [a-c]+ "x"?', r"[a-c]+x?", "abcx"),
    ('root ::= ("ab" | "a")* "b"', r"(?:ab|a)*b", "ab"),
    ("root ::= [^a-c]{1,3}", r"[^a-c]{1,3}", "abdé\n"),
    ('root ::= "x"{2} [0-9]{0,2}', r"x{2}[0-9]{0,2}", "x01"),
    ('root ::= ([α-γ] | "é")+ .', r"(?s:(?:[α-γ]|é)+.)", "αβγδé\n"),
    (r"root ::= [\-\]a-]*", r"[\-\]a-]*", "-]ab"),
    ('root ::= ("" | "a") ("b" | ( ))', r"a?b?", "ab"),
    ('root ::= "a"{2,} "b"{0}', r"a{2,}", "ab"),
    ('root ::= w ("," w)*\nw ::= [a-b]+', r"[ab]+(?:,[ab]+)*", "ab,"),
    ('root ::= (w ",")* w{1,3}\nw ::= [ab]', r"(?:[ab],)*[ab]{1,3}", "ab,"),
    ('root ::= (w | "c"){2,4} w{0} w?\nw ::= [ab]', r"(?:[ab]|c){2,4}[ab]?", "abc"),
    ("root ::= w{3,}\nw ::= [ab]", r"[ab]{3,}", "abc"),
    ('root ::= (w "x"?)+\nw ::= [ab]', r"(?:[ab]x?)+", "abx"),
    ('root ::= ((w "x")? "y")*\nw ::= "a" | "bb"', r"(?:(?:(?:a|bb)x)?y)*", "abxy"),
]


@pytest.mark.parametrize("text,pattern,alphabet", REGULAR)
def test_agrees_with_regex_module(text, pattern, alphabet):
    g = parse_ebnf(text)
    lower(g, "root")
    rng = random.Random(hash(pattern) & 0xFFFF)
    strings = {""} | {"".join(rng.choice(alphabet) for _ in range(rng.randint(1, 7))) for _ in range(150)}
    for s in sorted(strings):
        assert derives(g, s) == bool(regex.fullmatch(pattern, s)), s


# ---------------------------------------------------------------------------- errors

def _err(text, cls=GrammarSyntaxError, **kw):
    with pytest.raises(cls) as ei:
        parse_ebnf(text, **kw)
    assert type(ei.value) is cls
    return ei.value


@pytest.mark.parametrize(
    "text,line,column",
    [
        ('root ::= "abc', 1, 10),                 # unterminated string: its opening quote
        ('root ::= "ab\n"', 1, 10),               # a raw newline ends nothing
        ('root ::= "a"\nx ::= "a\\qb"', 2, 9),    # unknown escape: its backslash
        ('root ::= "\\x4"', 1, 11),               # \x needs two hex digits
        ('root ::= "\\u12G4"', 1, 11),
        ('root ::= "\\U00110000"', 1, 11),        # beyond U+10FFFF
        ('root ::= "\\uD800"', 1, 11),            # surrogate
        ("root ::= [z-a]", 1, 11),                # reversed range: its lower end
        ("root ::= [abc", 1, 10),                 # unterminated class
        ("root ::= [a\nb]", 1, 12),               # newline inside a class
        ("root ::= [\\d]", 1, 11),                # regex shorthand in a class
        ("root ::= [\\q]", 1, 11),
        ('root "a"', 1, 6),                       # missing ::=
        ('root = "a"', 1, 6),
        ('root : "a"', 1, 6),
        ('  ::= "a"', 1, 3),
        ('root ::= ("a" | "b"', 1, 10),           # unclosed '(': the parenthesis
        ('root ::= (("a")\nx ::= "b"', 1, 10),
        ('root ::= "a")', 1, 13),                 # unbalanced ')'
        ('root ::= "a" | )', 1, 16),
        ('root ::= "a" b ::= "c"', 1, 14),        # a rule name must start its line
        ('root ::= "a"**', 1, 14),                # stacked quantifiers
        ('root ::= "a"{3,1}', 1, 13),             # bad repetition range
        ('root ::= "a"{,3}', 1, 14),
        ('root ::= "a"{2', 1, 15),
        ("root ::=", 1, 9),                       # empty body
        ('root ::= "a" |\nx ::= "b"', 2, 1),     # empty alternative
        ('root ::= "a" @', 1, 14),
        ('root ::= TagDispatch(("<t>", x))\nx ::= "a"', 1, 10),
        ('root[max_tokens=3] ::= "a"', 1, 5),
    ],
)
def test_syntax_errors_with_positions(text, line, column):
    e = _err(text)
    assert (e.line, e.column) == (line, column), str(e)
    assert f"{line}:{column}" in str(e)


def test_empty_grammar():
    assert (_err("").line, _err("").column) == (1, 1)
    e = _err("  # only a comment\n\n")
    assert e.line == 3


def test_duplicate_rule():
    e = _err('root ::= a\na ::= "x"\n\n  a ::= "y"')
    assert (e.line, e.column) == (4, 3)
    assert "already defined at 2:1" in str(e)


def test_undefined_rule_position():
    e = _err('root ::= "x" value\nvalue ::= "(" list ")" | item\n  item ::= [0-9] | list', UndefinedRuleError)
    assert (e.line, e.column) == (2, 15)
    assert "'list'" in str(e)


def test_missing_root():
    e = _err('start ::= "a"', UndefinedRuleError)
    assert e.line is None
    e = _err('root ::= "a"', UndefinedRuleError, root="main")
    assert "main" in str(e)


def test_expansion_bounds():
    parse_ebnf(f'root ::= a{{{MAX_EXPANSION}}}\na ::= "x"')
    with pytest.raises(GrammarTooComplexError):
        parse_ebnf(f'root ::= a{{{MAX_EXPANSION + 1}}}\na ::= "x"')
    with pytest.raises(GrammarTooComplexError):
        parse_ebnf(f'root ::= a{{0,{MAX_EXPANSION + 1}}}\na ::= "x"')
    with pytest.raises(GrammarTooComplexError):
        parse_ebnf('root ::= "x"{1000000}')
    with pytest.raises(GrammarTooComplexError):
        parse_ebnf("root ::= " + "(" * 300 + '"a"' + ")" * 300)
    g = parse_ebnf('root ::= "x"{5000} | a{3,}\na ::= "y"')  # regular repeats stay lazy
    assert derives(g, "yyy") and not derives(g, "yy")
