"""EBNF front end: the GBNF dialect of llama.cpp as extended by xgrammar, compiled to a :class:`~.cfg.Grammar`.

Syntax
    ``name ::= body``    one rule; ``name`` matches ``[a-zA-Z_][a-zA-Z0-9_-]*``. A rule name must be
                         the first token of its line; a body runs over any number of lines until the
                         next ``name ::=`` (xgrammar). Each name may be defined once.
    ``# ...``            comment to the end of the line.
    ``"..."``            string literal (UTF-8 encoded); ``""`` is the empty string. Escapes:
                         ``\\" \\\\ \\/ \\' \\? \\[ \\]``, ``\\n \\r \\t \\b \\f \\a \\v \\0 \\e``,
                         ``\\xNN`` (exactly two hex digits), ``\\uXXXX``, ``\\UXXXXXXXX``. A raw
                         newline is not allowed inside a literal.
    ``[...]``, ``[^...]`` one character out of a set of code points; ranges ``a-z``; a ``-`` first,
                         last or right after a range is literal. Besides the string escapes,
                         ``\\^ \\$ \\. \\* \\+ \\? \\( \\) \\{ \\} \\| \\- \\/`` are allowed. ``[]`` matches
                         nothing, ``[^]`` any character. Negation is the complement within
                         U+0000..U+10FFFF minus the surrogates.
    ``.``                any one character (llama.cpp; xgrammar has no wildcard).
    ``( ... )``          grouping; ``( )`` is the empty string. ``a b`` sequence, ``a | b`` choice.
    ``x* x+ x?``         repetition; ``x{m}``, ``x{m,}``, ``x{m,n}`` bounded repetition (xgrammar).
                         Only one quantifier per element: ``"a"**`` is an error, write ``("a"*)*``.
    ``Regex("...")``     xgrammar's regex macro: an ECMA-262 pattern, matched in full.
    ``(= ...)``          xgrammar lookahead assertion, allowed once at the end of a rule body.

Lookahead assertions are parsed (their syntax and rule references are checked) and then dropped. In
xgrammar they are hints for the token-mask cache: its Earley parser never checks them, so
``accept_string`` accepts exactly the language of the rule bodies. Dropping them therefore keeps
the language xgrammar defines; the only cost is the pruning speed-up they were meant to give.

Not supported (:class:`~grammask.errors.GrammarSyntaxError` with a clear message): the token-level
and dispatch macros ``TagDispatch``, ``TokenTagDispatch``, ``Token``, ``ExcludeToken``,
``Regex(..., json_string=true)``, rule options ``name[max_tokens=..]``/``[capture]``/
``[temperature=..]``, rule names containing ``.``, regex shorthands ``\\d \\w \\s`` in classes, and
``\\x`` escapes with more than two hex digits (xgrammar reads any number; llama.cpp reads two).

Compilation
    Every part made only of terminals (literals, classes, ``.``, groups and quantifiers of those)
    becomes one terminal expression in :class:`~.regexset.ExprSet`, so ``[a-z]+`` or ``("a"|"b")*`` is
    a single lexeme. Parts containing rule references become helper nonterminals
    (:meth:`Grammar.fresh`): ``X*`` -> ``R ::= R X | ε``, ``X+`` -> ``R ::= R X | X``, ``X?`` ->
    ``R ::= X | ε``, ``X{m,n}`` -> ``m`` copies of ``X`` followed by ``n-m`` nested optionals (at
    most :data:`MAX_EXPANSION` copies, else :class:`~grammask.errors.GrammarTooComplexError`).

Errors carry the 1-based ``line`` and ``column`` (counted in code points, a tab is one column) of
the offending character (for an unterminated literal or class, or an unclosed parenthesis: where it
opens; for a bad escape: its backslash):
:class:`~grammask.errors.GrammarSyntaxError` for malformed text and duplicate rules,
:class:`~grammask.errors.UndefinedRuleError` at the first reference of an undefined rule (or without
a position for a missing root rule).
"""
from __future__ import annotations

import bisect

from ..errors import GrammarSyntaxError, GrammarTooComplexError, RegexSyntaxError, UndefinedRuleError
from .cfg import Grammar
from .regex import MAX_REPEAT, any_utf8_char, char_class_expr, parse_regex
from .regexset import EPS, ExprSet

__all__ = ["parse_ebnf", "MAX_EXPANSION", "MAX_NESTING"]

#: Largest number of copies of a rule-referencing part that ``X{m,n}`` may expand to.
MAX_EXPANSION = 10_000
#: Deepest nesting of parentheses accepted.
MAX_NESTING = 100

MAX_CODE_POINT = 0x10FFFF
SURROGATES = (0xD800, 0xDFFF)

_SIMPLE_ESCAPES = {
    '"': 0x22, "\\": 0x5C, "/": 0x2F, "'": 0x27, "?": 0x3F, "[": 0x5B, "]": 0x5D,
    "n": 0x0A, "r": 0x0D, "t": 0x09, "b": 0x08, "f": 0x0C, "a": 0x07, "v": 0x0B, "0": 0x00,
    "e": 0x1B,
}
_CLASS_ESCAPES = {c: ord(c) for c in "^$\\.*+?()[]{}|/-"}
_HEX = frozenset("0123456789abcdefABCDEF")
_NAME_START = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_")
_NAME_CHARS = _NAME_START | frozenset("0123456789-")
_DIGITS = frozenset("0123456789")
_UNSUPPORTED_MACROS = ("TagDispatch", "TokenTagDispatch", "Token", "ExcludeToken")
_QUANTIFIERS = ("*", "+", "?", "{")


class _Tok:
    __slots__ = ("kind", "value", "pos", "rule_def")

    def __init__(self, kind: str, value, pos: int):
        self.kind = kind      # name str class dot int ( (= ) | * + ? { } , = ::= eof
        self.value = value
        self.pos = pos        # offset in the text
        self.rule_def = False  # a name followed by ::=


# ---------------------------------------------------------------------------- lexer

class _Lexer:
    def __init__(self, text: str, exprs: ExprSet):
        self.text = text
        self.exprs = exprs
        # offsets where lines start; "\r\n", "\r" and "\n" all end a line
        starts = [0]
        i, n = 0, len(text)
        while i < n:
            c = text[i]
            if c == "\n" or (c == "\r" and (i + 1 >= n or text[i + 1] != "\n")):
                starts.append(i + 1)
            i += 1
        self.line_starts = starts

    def where(self, pos: int) -> tuple[int, int]:
        line = bisect.bisect_right(self.line_starts, pos)
        return line, pos - self.line_starts[line - 1] + 1

    def error(self, message: str, pos: int) -> GrammarSyntaxError:
        return GrammarSyntaxError(message, *self.where(pos))

    def tokens(self) -> list[_Tok]:
        text, n = self.text, len(self.text)
        out: list[_Tok] = []
        i = 0
        while True:
            while i < n:  # blanks and comments
                c = text[i]
                if c in " \t\r\n":
                    i += 1
                elif c == "#":
                    while i < n and text[i] not in "\r\n":
                        i += 1
                else:
                    break
            if i >= n:
                out.append(_Tok("eof", None, n))
                return out
            c = text[i]
            if c in _NAME_START:
                j = i + 1
                while j < n and text[j] in _NAME_CHARS:
                    j += 1
                out.append(_Tok("name", text[i:j], i))
                i = j
            elif c == '"':
                value, i2 = self._string(i)
                out.append(_Tok("str", value, i))
                i = i2
            elif c == "[":
                value, i2 = self._char_class(i)
                out.append(_Tok("class", value, i))
                i = i2
            elif c in _DIGITS:
                j = i + 1
                while j < n and text[j] in _DIGITS:
                    j += 1
                if j - i > 15:
                    raise self.error("integer too large", i)
                out.append(_Tok("int", int(text[i:j]), i))
                i = j
            elif c == ":":
                if text.startswith("::=", i):
                    out.append(_Tok("::=", None, i))
                    i += 3
                else:
                    raise self.error("unexpected ':' (expected '::=')", i)
            elif c == "(":
                if i + 1 < n and text[i + 1] == "=":
                    out.append(_Tok("(=", None, i))
                    i += 2
                else:
                    out.append(_Tok("(", None, i))
                    i += 1
            elif c in ")|*+?{},=.":
                out.append(_Tok("dot" if c == "." else c, None, i))
                i += 1
            else:
                raise self.error(f"unexpected character {c!r}", i)

    def _escape(self, i: int, in_class: bool) -> tuple[int, int]:
        """The code point of the escape sequence at ``text[i] == '\\'`` and the offset after it."""
        text, n = self.text, len(self.text)
        if i + 1 >= n or text[i + 1] in "\r\n":
            raise self.error("incomplete escape sequence", i)
        c = text[i + 1]
        if c in _SIMPLE_ESCAPES:
            return _SIMPLE_ESCAPES[c], i + 2
        if in_class and c in _CLASS_ESCAPES:
            return _CLASS_ESCAPES[c], i + 2
        if c in "xuU":
            width = 2 if c == "x" else 4 if c == "u" else 8
            digits = text[i + 2:i + 2 + width]
            if len(digits) != width or not all(d in _HEX for d in digits):
                raise self.error(f"invalid escape sequence: \\{c} needs {width} hex digits", i)
            cp = int(digits, 16)
            if cp > MAX_CODE_POINT:
                raise self.error(f"code point U+{cp:X} is beyond U+10FFFF", i)
            return cp, i + 2 + width
        if in_class and c in "dDsSwW":
            raise self.error(f"character class escape \\{c} is not supported, write the ranges explicitly", i)
        raise self.error(f"invalid escape sequence \\{c}", i)

    def _string(self, start: int) -> tuple[bytes, int]:
        text, n = self.text, len(self.text)
        out = bytearray()
        i = start + 1
        while True:
            if i >= n or text[i] in "\r\n":
                raise self.error("unterminated string literal", start)
            c = text[i]
            if c == '"':
                return bytes(out), i + 1
            if c == "\\":
                cp, i2 = self._escape(i, in_class=False)
                if SURROGATES[0] <= cp <= SURROGATES[1]:
                    raise self.error(f"surrogate code point U+{cp:X} cannot be encoded in UTF-8", i)
                out += chr(cp).encode("utf-8")
                i = i2
            else:
                try:
                    out += c.encode("utf-8")
                except UnicodeEncodeError:
                    raise self.error("invalid character (lone surrogate) in string literal", i) from None
                i += 1

    def _char_class(self, start: int) -> tuple[int, int]:
        text, n = self.text, len(self.text)
        i = start + 1
        negated = i < n and text[i] == "^"
        if negated:
            i += 1
        items: list[tuple[bool, int, int]] = []  # (is_raw_dash, code point, offset)
        while True:
            if i >= n:
                raise self.error("unterminated character class", start)
            c = text[i]
            if c == "]":
                end = i + 1
                break
            if c in "\r\n":
                raise self.error("newline in character class (write \\n)", i)
            if c == "-":
                items.append((True, 0x2D, i))
                i += 1
            elif c == "\\":
                cp, i2 = self._escape(i, in_class=True)
                items.append((False, cp, i))
                i = i2
            else:
                items.append((False, ord(c), i))
                i += 1
        ranges: list[tuple[int, int]] = []
        k = 0
        while k < len(items):
            _, lo, lo_pos = items[k]
            if k + 2 < len(items) and items[k + 1][0]:
                hi = items[k + 2][1]
                if lo > hi:
                    raise self.error("invalid character class range: lower bound above upper bound", lo_pos)
                ranges.append((lo, hi))
                k += 3
            else:
                ranges.append((lo, lo))
                k += 1
        if negated:
            ranges = _complement(ranges)
        return char_class_expr(ranges, self.exprs), end


def _complement(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Code points of U+0000..U+10FFFF, surrogates excluded, that are not in ``ranges``."""
    out = []
    nxt = 0
    for lo, hi in sorted(list(ranges) + [SURROGATES]):
        if lo > nxt:
            out.append((nxt, lo - 1))
        nxt = max(nxt, hi + 1)
    if nxt <= MAX_CODE_POINT:
        out.append((nxt, MAX_CODE_POINT))
    return out


# ---------------------------------------------------------------------------- AST
# ("expr", e) | ("ref", name, pos) | ("seq", [nodes]) | ("alt", [nodes]) | ("rep", node, lo, hi)
# hi is None for an unbounded repetition.


class _Parser:
    def __init__(self, text: str, exprs: ExprSet):
        self.lex = _Lexer(text, exprs)
        self.exprs = exprs
        self.toks = self.lex.tokens()
        self.i = 0
        self.depth = 0
        self.refs: list[tuple[str, int]] = []  # every rule reference in text order

    # ------------------------------------------------------------------ helpers
    @property
    def tok(self) -> _Tok:
        return self.toks[self.i]

    def error(self, message: str, tok_or_pos) -> GrammarSyntaxError:
        pos = tok_or_pos.pos if isinstance(tok_or_pos, _Tok) else tok_or_pos
        return self.lex.error(message, pos)

    def _describe(self, tok: _Tok) -> str:
        if tok.kind == "eof":
            return "end of grammar"
        if tok.kind == "name":
            return f"rule definition {tok.value!r}" if tok.rule_def else f"name {tok.value!r}"
        if tok.kind in ("str", "class", "int", "dot"):
            return {"str": "string literal", "class": "character class", "int": "integer", "dot": "'.'"}[tok.kind]
        return repr(tok.kind)

    def mark_rule_names(self) -> None:
        toks = self.toks
        for k, t in enumerate(toks):
            if t.kind != "::=":
                continue
            prev = toks[k - 1] if k > 0 else None
            if prev is None or prev.kind != "name":
                if (prev is not None and prev.kind == "class" and k >= 2 and toks[k - 2].kind == "name"
                        and self.lex.where(toks[k - 2].pos)[0] == self.lex.where(prev.pos)[0]):
                    raise self.error("rule options (name[...] ::=) are not supported", prev)
                raise self.error("'::=' must follow a rule name", t)
            if k >= 2 and self.lex.where(toks[k - 2].pos)[0] == self.lex.where(prev.pos)[0]:
                raise self.error("a rule name must be at the start of a line", prev)
            prev.rule_def = True

    # ------------------------------------------------------------------ rule bodies
    def choices(self):
        seqs = [self.sequence()]
        while self.tok.kind == "|":
            self.i += 1
            seqs.append(self.sequence())
        return seqs[0] if len(seqs) == 1 else ("alt", seqs)

    def _starts_element(self, t: _Tok) -> bool:
        return t.kind in ("str", "class", "dot", "(") or (t.kind == "name" and not t.rule_def)

    def sequence(self):
        items = []
        while self._starts_element(self.tok):
            items.append(self.quantified())
        t = self.tok
        if not items:
            raise self.error(f"expected an element, got {self._describe(t)}", t)
        if t.kind in _QUANTIFIERS:
            raise self.error("a quantifier cannot follow another quantifier; use parentheses", t)
        if t.kind not in ("|", ")", "(=", "eof") and not (t.kind == "name" and t.rule_def):
            raise self.error(f"unexpected {self._describe(t)}", t)
        return items[0] if len(items) == 1 else ("seq", items)

    def quantified(self):
        node = self.element()
        t = self.tok
        if t.kind == "*":
            self.i += 1
            return ("rep", node, 0, None)
        if t.kind == "+":
            self.i += 1
            return ("rep", node, 1, None)
        if t.kind == "?":
            self.i += 1
            return ("rep", node, 0, 1)
        if t.kind == "{":
            lo, hi = self.braces()
            return ("rep", node, lo, hi)
        return node

    def braces(self) -> tuple[int, int | None]:
        open_tok = self.tok
        self.i += 1
        if self.tok.kind != "int":
            raise self.error(f"expected an integer in repetition range, got {self._describe(self.tok)}", self.tok)
        lo = hi = self.tok.value
        self.i += 1
        if self.tok.kind == ",":
            self.i += 1
            if self.tok.kind == "}":
                hi = None
            elif self.tok.kind == "int":
                hi = self.tok.value
                self.i += 1
            else:
                raise self.error(f"expected an integer or '}}', got {self._describe(self.tok)}", self.tok)
        if self.tok.kind != "}":
            raise self.error(f"expected '}}' to close the repetition range, got {self._describe(self.tok)}", self.tok)
        self.i += 1
        if hi is not None and hi < lo:
            raise self.error(f"repetition range {{{lo},{hi}}}: lower bound above upper bound", open_tok)
        return lo, hi

    def element(self):
        t = self.tok
        if t.kind == "str":
            self.i += 1
            return ("expr", self.exprs.literal(t.value))
        if t.kind == "class":
            self.i += 1
            return ("expr", t.value)
        if t.kind == "dot":
            self.i += 1
            return ("expr", any_utf8_char(self.exprs))
        if t.kind == "(":
            return self.group()
        # a name
        nxt = self.toks[self.i + 1]
        if nxt.kind == "(":
            if t.value == "Regex":
                return self.regex_macro()
            if t.value in _UNSUPPORTED_MACROS:
                raise self.error(f"the xgrammar macro {t.value}(...) is not supported", t)
        self.i += 1
        self.refs.append((t.value, t.pos))
        return ("ref", t.value, t.pos)

    def _enter(self, t: _Tok) -> None:
        self.depth += 1
        if self.depth > MAX_NESTING:
            line, col = self.lex.where(t.pos)
            raise GrammarTooComplexError(f"parentheses nested deeper than {MAX_NESTING} levels at {line}:{col}")

    def group(self):
        open_tok = self.tok
        self._enter(open_tok)
        self.i += 1
        if self.tok.kind == ")":
            self.i += 1
            self.depth -= 1
            return ("expr", EPS)
        node = self.choices()
        t = self.tok
        if t.kind != ")":
            if t.kind == "(=":
                raise self.error("a lookahead assertion is only allowed at the end of a rule body", t)
            raise self.error("unbalanced '(': missing ')'", open_tok)
        self.i += 1
        self.depth -= 1
        return node

    def lookahead(self) -> None:
        open_tok = self.tok
        self._enter(open_tok)
        self.i += 1
        self.choices()  # checked, then dropped (see the module docstring)
        if self.tok.kind != ")":
            raise self.error("unbalanced '(=': missing ')'", open_tok)
        self.i += 1
        self.depth -= 1

    def regex_macro(self):
        name_tok = self.tok
        self.i += 2  # Regex (
        t = self.tok
        if t.kind != "str":
            raise self.error("Regex(...) expects a string literal pattern", t)
        self.i += 1
        if self.tok.kind == ",":
            self.i += 1
            a, eq, v = self.toks[self.i:self.i + 3]
            if not (a.kind == "name" and a.value == "json_string" and eq.kind == "="
                    and v.kind == "name" and v.value in ("true", "false")):
                raise self.error("Regex(...) accepts only the argument json_string=false", a)
            if v.value == "true":
                raise self.error("Regex(..., json_string=true) is not supported", v)
            self.i += 3
        if self.tok.kind != ")":
            raise self.error(f"expected ')' to close Regex(, got {self._describe(self.tok)}", self.tok)
        self.i += 1
        try:
            pattern = t.value.decode("utf-8")
            e = parse_regex(pattern, self.exprs)
        except RegexSyntaxError as err:
            raise self.error(f"invalid pattern in Regex(...): {err}", t) from err
        except UnicodeDecodeError as err:  # pragma: no cover - literals are valid UTF-8
            raise self.error("invalid pattern in Regex(...)", name_tok) from err
        return ("expr", e)


def _parse_rules(parser: _Parser) -> list[tuple[str, int, object]]:
    """Drive :class:`_Parser` rule by rule, recording each rule's name and offset."""
    parser.mark_rule_names()
    if parser.tok.kind == "eof":
        raise parser.error("empty grammar: expected a rule 'name ::= ...'", parser.tok)
    rules = []
    while parser.tok.kind != "eof":
        t = parser.tok
        if t.kind != "name":
            raise parser.error(f"expected a rule definition 'name ::= ...', got {parser._describe(t)}", t)
        if not t.rule_def:
            raise parser.error(f"expected '::=' after rule name {t.value!r}", parser.toks[parser.i + 1])
        parser.i += 2
        body = parser.choices()
        lookahead = parser.tok.kind == "(="
        if lookahead:
            parser.lookahead()
        nxt = parser.tok
        if not (nxt.kind == "eof" or (nxt.kind == "name" and nxt.rule_def)):
            if lookahead:
                raise parser.error("a lookahead assertion must end its rule body", nxt)
            if nxt.kind == ")":
                raise parser.error("unbalanced ')'", nxt)
            raise parser.error(f"unexpected {parser._describe(nxt)}", nxt)
        rules.append((t.value, t.pos, body))
    return rules


# ---------------------------------------------------------------------------- IR


class _Compiler:
    def __init__(self, g: Grammar):
        self.g = g
        self.ex = g.exprs
        self.memo: dict[int, int | None] = {}
        self.rule = ""  # name of the rule being compiled, for helper names

    def regular(self, node) -> int | None:
        """The single expression of ``node`` when it contains no rule reference, else None."""
        key = id(node)
        if key in self.memo:
            return self.memo[key]
        kind = node[0]
        if kind == "expr":
            r = node[1]
        elif kind == "ref":
            r = None
        elif kind == "rep":
            r = self.regular(node[1])
            if r is not None:
                lo, hi = node[2], node[3]
                if max(lo, hi or 0) > MAX_REPEAT:
                    raise GrammarTooComplexError(f"repetition bound above {MAX_REPEAT}")
                r = self.ex.repeat(r, lo, hi)
        else:
            parts = [self.regular(c) for c in node[1]]
            if any(p is None for p in parts):
                r = None
            else:
                r = self.ex.concat(*parts) if kind == "seq" else self.ex.alt(*parts)
        self.memo[key] = r
        return r

    def alternatives(self, node) -> list[list[int]]:
        """Productions whose union derives ``node``."""
        if self.regular(node) is None and node[0] == "alt":
            return [self.symbols(c) for c in node[1]]
        return [self.symbols(node)]

    def symbols(self, node) -> list[int]:
        """A sequence of grammar symbols deriving exactly the language of ``node``."""
        e = self.regular(node)
        if e is not None:
            return [] if e == EPS else [~e]
        kind = node[0]
        if kind == "ref":
            return [self.g.index[node[1]]]
        if kind == "seq":
            out: list[int] = []
            for c in node[1]:
                for s in self.symbols(c):
                    if s < 0 and out and out[-1] < 0:
                        out[-1] = ~self.ex.concat(~out[-1], ~s)
                    else:
                        out.append(s)
            return out
        if kind == "alt":
            nt = self.g.fresh(f"{self.rule}_alt")
            self.g.define(nt, [self.symbols(c) for c in node[1]])
            return [nt]
        return self.repeat(node[1], node[2], node[3])

    def repeat(self, child, lo: int, hi: int | None) -> list[int]:
        g = self.g
        if hi == 0:
            return []
        copies = lo if hi is None else hi
        if copies > MAX_EXPANSION:
            raise GrammarTooComplexError(
                f"repetition {{{lo},{'' if hi is None else hi}}} of a part with rule references "
                f"would expand to more than {MAX_EXPANSION} copies")
        syms = self.symbols(child)
        if len(syms) == 1:
            x = syms[0]
        else:
            x = g.fresh(f"{self.rule}_grp")
            g.define(x, [syms])
        if hi is None:
            rec = g.fresh(f"{self.rule}_star" if lo == 0 else f"{self.rule}_plus")
            g.define(rec, [[rec, x], [] if lo == 0 else [x]])  # left recursion: linear in Earley
            if lo <= 1:
                return [rec]
            body = [x] * (lo - 1) + [rec]
        else:
            body = [x] * lo
            if hi > lo:
                tail = g.fresh(f"{self.rule}_opt")
                g.define(tail, [[x], []])
                for _ in range(hi - lo - 1):
                    nt = g.fresh(f"{self.rule}_opt")
                    g.define(nt, [[x, tail], []])
                    tail = nt
                body.append(tail)
            if len(body) == 1:
                return body
        nt = g.fresh(f"{self.rule}_rep")
        g.define(nt, [body])
        return [nt]


def parse_ebnf(text: str, root: str = "root", exprs: ExprSet | None = None) -> Grammar:
    """Parse an EBNF/GBNF grammar (see the module docstring) into a :class:`Grammar` rooted at ``root``.

    Raises :class:`GrammarSyntaxError` (malformed text, duplicate rule), :class:`UndefinedRuleError`
    (a referenced rule or the root is not defined) and :class:`GrammarTooComplexError` (expansion
    or nesting bounds), all with 1-based line and column where there is a position to give.
    """
    try:
        return _parse_ebnf(text, root, exprs)
    except RecursionError:
        raise GrammarTooComplexError("grammar nested too deeply") from None


def _parse_ebnf(text: str, root: str, exprs: ExprSet | None) -> Grammar:
    g = Grammar(exprs)
    parser = _Parser(text, g.exprs)
    rules = _parse_rules(parser)

    defined: dict[str, int] = {}
    for name, pos, _ in rules:
        if name in defined:
            line, col = parser.lex.where(defined[name])
            raise parser.error(f"rule {name!r} is already defined at {line}:{col}", pos)
        defined[name] = pos
    for name, pos in parser.refs:
        if name not in defined:
            raise UndefinedRuleError(f"rule {name!r} is referenced but not defined", *parser.lex.where(pos))
    if root not in defined:
        raise UndefinedRuleError(f"the root rule {root!r} is not defined")

    first_ref: dict[str, int] = {}
    for name, pos in parser.refs:
        first_ref.setdefault(name, pos)
    for name, pos, _ in rules:
        g.nonterminal(name, parser.lex.where(first_ref.get(name, pos)))

    comp = _Compiler(g)
    for name, _, body in rules:
        comp.rule = name
        nt = g.index[name]
        e = comp.regular(body)
        if e is not None:
            g.define(nt, [[] if e == EPS else [~e]])
        else:
            g.define(nt, comp.alternatives(body))
    g.root = g.index[root]
    return g
