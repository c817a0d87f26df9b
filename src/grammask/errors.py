"""Typed errors of grammask. Every failure on bad input is one of these, never a hang or a crash."""
from __future__ import annotations


class GrammaskError(Exception):
    """Base class of every error grammask raises on purpose."""


class GrammarError(GrammaskError, ValueError):
    """A grammar, regex or schema cannot be compiled."""


class GrammarSyntaxError(GrammarError):
    """Invalid EBNF/GBNF text. Carries ``line`` and ``column`` (1-based)."""

    def __init__(self, message: str, line: int | None = None, column: int | None = None):
        self.line, self.column = line, column
        where = f" at {line}:{column}" if line is not None else ""
        super().__init__(f"{message}{where}")


class UndefinedRuleError(GrammarSyntaxError):
    """A rule is referenced but never defined."""


class RegexSyntaxError(GrammarError):
    """Invalid regular expression. Carries ``pattern`` and ``position`` (0-based)."""

    def __init__(self, message: str, pattern: str = "", position: int | None = None):
        self.pattern, self.position = pattern, position
        where = f" at position {position}" if position is not None else ""
        super().__init__(f"{message}{where} in regex {pattern!r}")


class UnsupportedRegexError(RegexSyntaxError):
    """A regex construct we do not support (lookaround, backreference, \\b): ``construct``."""

    def __init__(self, construct: str, pattern: str = "", position: int | None = None):
        self.construct = construct
        super().__init__(f"unsupported regex construct {construct}", pattern, position)


class EmptyLanguageError(GrammarError):
    """The grammar, regex or schema accepts no string at all."""


class GrammarTooComplexError(GrammarError):
    """A compile-time bound (automaton states, rules, time) was exceeded."""


class GrammarMemoryError(GrammarTooComplexError):
    """A compile-time memory bound was exceeded: the estimate of what a compile holds went past
    ``GrammarCompiler(max_compile_memory_bytes=...)``, or (a last resort at mask time, for
    pathologically ambiguous grammars) an Earley parse stack went past its bound. Carries
    ``what`` (the part that grew past the bound), ``used_bytes`` and ``limit_bytes``."""

    def __init__(self, message: str, what: str | None = None, used_bytes: int | None = None,
                 limit_bytes: int | None = None):
        self.what, self.used_bytes, self.limit_bytes = what, used_bytes, limit_bytes
        super().__init__(message)

    def __reduce__(self):
        return type(self), (str(self), self.what, self.used_bytes, self.limit_bytes)


class UnsupportedSchemaError(GrammarError):
    """A JSON Schema keyword we cannot enforce. Carries ``keyword`` and ``pointer``."""

    def __init__(self, message: str, keyword: str | None = None, pointer: str = ""):
        self.keyword, self.pointer = keyword, pointer
        super().__init__(f"{message} (at {pointer or '#'})")


class InvalidSchemaError(GrammarError):
    """The JSON Schema itself is malformed. Carries ``pointer``."""

    def __init__(self, message: str, pointer: str = ""):
        self.pointer = pointer
        super().__init__(f"{message} (at {pointer or '#'})")


class TokenizerError(GrammaskError, ValueError):
    """The tokenizer cannot be read or its vocabulary is inconsistent."""


class MatcherError(GrammaskError, RuntimeError):
    """Misuse of a GrammarMatcher (rollback too far, bitmask of the wrong shape, ...)."""


class CanonicalTokenizationError(GrammaskError, ValueError):
    """``canonical=True`` was asked for a tokenizer whose class canonical-tokenization decoding does
    not cover (e.g. a byte-fallback sentencepiece vocabulary, a WordPiece model, an unknown
    pre-tokenizer). Carries ``reason``."""

    def __init__(self, message: str, reason: str | None = None):
        self.reason = reason
        super().__init__(message)

    def __reduce__(self):
        return type(self), (str(self), self.reason)


__all__ = [n for n in dir() if n.endswith("Error")]


class InvalidRequestError(GrammaskError, ValueError):
    """A chat request is malformed or combines options that do not go together (raised before any
    token is generated). Carries ``param``: the request field at fault (dotted path), like OpenAI's
    ``invalid_request_error``."""

    def __init__(self, message: str, param: str | None = None):
        self.param = param
        super().__init__(f"{message} (param: {param})" if param else message)


class GenerationError(GrammaskError, RuntimeError):
    """Generation failed after it started: the grammar rejected the sampled token (an internal
    error: output is never left unconstrained), or the model backend raised. Carries
    ``request_id``."""

    def __init__(self, message: str, request_id: str | None = None):
        self.request_id = request_id
        super().__init__(message)


class EngineClosedError(GrammaskError, RuntimeError):
    """The engine was closed: it serves no more requests."""


__all__ = [n for n in dir() if n.endswith("Error")]
