"""What the stages of one compile share: :class:`CompileState`.

A compile is three objects over one state: :class:`~.to_ir.SchemaReader` (schema -> IR),
:class:`~.algebra.Algebra` (intersections, complements, emptiness) and
:class:`~.generate.GrammarGenerator` (IR -> grammar). Each keeps its own memo tables and
counters; what they share is here, explicitly: the grammar being built and its ExprSet, the JSON
lexemes and string encodings, the options, the warnings of ``lenient`` mode, every :class:`Ref`
made (so :meth:`CompileState.close` can unlink them), and the list that keeps memo-keyed objects
alive (memo keys are ``id()`` s, which must stay unique while the compile runs).

What depends only on the ExprSet lives with it, shared by every compile into it: the JSON
lexemes, the string encodings (:class:`~.strings.Strings`), memos by value of number and
string tokens and of ``pattern``/``format`` expressions, and the rules of any JSON value
(:meth:`~.generate.GrammarGenerator._copy_any`) (each bounded by :data:`MAX_SHARED_TOKENS`: a hit
returns the very expression, or rules, a recomputation would build).
"""
from __future__ import annotations

from ...errors import UnsupportedSchemaError
from ..builtin import JsonLexemes, whitespace_expr
from ..cfg import Grammar
from ..regexset import EPS, put_bounded
from .input import detect_draft
from .ir import Ref
from .strings import Strings

__all__ = ["CompileState", "Stage", "remember", "MAX_SHARED_TOKENS"]

#: entries of each token memo shared by the compiles of one ExprSet (number tokens, string
#: tokens) before it starts over
MAX_SHARED_TOKENS = 4096


def remember(memo: dict, key, value) -> None:
    """``memo[key] = value`` in a memo bounded by :data:`MAX_SHARED_TOKENS` (full: it starts over)."""
    put_bounded(memo, key, value, MAX_SHARED_TOKENS)


class CompileState:
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
            shared["strings"] = Strings(self.ex, shared["lx"])
        self.lx = shared["lx"]
        # tokens of number and string constraints, by value: the same constraints come back in
        # other schemas (and a token's expression depends on nothing else in the ExprSet)
        self.number_tokens: dict = shared.setdefault("number_tokens", {})
        self.string_tokens: dict = shared.setdefault("string_tokens", {})
        # the rules of any JSON value, per (leading whitespace, whitespace): GrammarGenerator._copy_any
        self.any_rules: dict = shared.setdefault("any_rules", {})
        # the decoded-string expressions of ``pattern`` and ``format`` values (-1: no format)
        self.regexes: dict = shared.setdefault("regexes", {})
        self.strict = strict
        self.lenient = lenient
        self.indent = indent
        self.ws = whitespace_expr(self.ex, whitespace, max_whitespace) if indent is None else EPS
        self.strings = shared["strings"]
        self.warnings: list[str] = []
        self.draft = detect_draft(root)
        self.keep: list = []   # keeps memo-keyed nodes alive (ids stay unique)

    def unsupported(self, keyword: str, pointer: str, message: str) -> None:
        """Raise, or (lenient) record a warning: the caller then ignores the keyword."""
        if not self.lenient:
            raise UnsupportedSchemaError(message, keyword, pointer)
        self.warnings.append(f"{pointer or '#'}: {keyword}: {message} (ignored)")

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


class Stage:
    """A stage of one compile: it holds the shared :class:`CompileState` and its own tables,
    all dropped by :meth:`close` (see :meth:`CompileState.close`)."""

    def __init__(self, st: CompileState):
        self.st = st
        self.ex = st.ex
        self.strings = st.strings

    def close(self) -> None:
        self.__dict__.clear()
