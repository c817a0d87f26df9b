"""GrammarCompiler: EBNF, regex, builtin JSON and JSON Schema to :class:`CompiledGrammar`, cached.

Mirrors xgrammar's ``GrammarCompiler``. Thread-safe: concurrent requests for the same grammar
compile it once (the others wait for it); compiled grammars are kept in an LRU cache keyed by
``(kind, canonical text, options)``.
"""
from __future__ import annotations

import json
import threading
from collections import OrderedDict
from concurrent.futures import Future

from .builtin import DEFAULT_MAX_WHITESPACE, json_grammar
from .cfg import Grammar
from .compiled import CompiledGrammar
from .regexset import ExprSet

#: a compiler starts a new shared ExprSet once the current one holds this many expressions
EXPRS_RESET_NODES = 1_000_000


class GrammarCompiler:
    def __init__(self, tokenizer_info, *, cache_size: int = 128, max_threads: int = 8,
                 cache_enabled: bool = True):
        self.tokenizer_info = tokenizer_info
        self.cache_size = cache_size
        self.cache_enabled = cache_enabled and cache_size > 0
        self._cache: OrderedDict[tuple, Future] = OrderedDict()
        self._lock = threading.Lock()
        self._exprs = ExprSet()
        self.hits = 0
        self.misses = 0

    def _shared_exprs(self) -> ExprSet:
        """The ExprSet every grammar of this compiler is built in: derivatives, lexer transitions
        and slice checks of common lexemes (strings, numbers, formats) are computed once. Writers
        hold its lock. Replaced by a fresh one when it grows too big (old grammars keep theirs)."""
        with self._lock:
            if len(self._exprs) > EXPRS_RESET_NODES:
                self._exprs = ExprSet()
            return self._exprs

    # ------------------------------------------------------------------ cache
    def _cached(self, key: tuple, build) -> CompiledGrammar:
        if not self.cache_enabled:
            return build()
        with self._lock:
            fut = self._cache.get(key)
            if fut is not None:
                self._cache.move_to_end(key)
                self.hits += 1
                owner = False
            else:
                fut = Future()
                self._cache[key] = fut
                self.misses += 1
                owner = True
                while len(self._cache) > self.cache_size:
                    self._cache.popitem(last=False)
        if not owner:
            return fut.result()
        try:
            cg = build()
        except BaseException as e:
            with self._lock:
                if self._cache.get(key) is fut:
                    del self._cache[key]
            fut.set_exception(e)
            raise
        fut.set_result(cg)
        return cg

    def clear_cache(self) -> None:
        with self._lock:
            self._cache.clear()

    @property
    def cache_info(self) -> dict:
        return {"size": len(self._cache), "hits": self.hits, "misses": self.misses}

    # ------------------------------------------------------------------ front ends
    def compile_grammar(self, ebnf: str | Grammar, root: str = "root") -> CompiledGrammar:
        """An EBNF/GBNF grammar text (or a :class:`Grammar` built in code)."""
        if isinstance(ebnf, Grammar):
            return CompiledGrammar(ebnf, self.tokenizer_info, root=root, kind="grammar")

        def build():
            from .ebnf import parse_ebnf

            ex = self._shared_exprs()
            with ex.lock:
                g = parse_ebnf(ebnf, root=root, exprs=ex)
                return CompiledGrammar(g, self.tokenizer_info, root=root, kind="grammar", source=ebnf)

        return self._cached(("grammar", ebnf, root), build)

    def compile_regex(self, pattern: str) -> CompiledGrammar:
        """A regex (ECMA-262 syntax) matched against the whole output."""

        def build():
            from .regex import parse_regex

            ex = self._shared_exprs()
            with ex.lock:
                g = Grammar(ex)
                e = parse_regex(pattern, ex)
                g.rule("root", [[~e]])
                return CompiledGrammar(g, self.tokenizer_info, kind="regex", source=pattern)

        return self._cached(("regex", pattern), build)

    def compile_builtin_json_grammar(self, *, whitespace: str = "flexible",
                                     max_whitespace: int = DEFAULT_MAX_WHITESPACE,
                                     object_only: bool = False) -> CompiledGrammar:
        """Any JSON value (``object_only``: any JSON object, for ``json_object`` mode)."""

        def build():
            ex = self._shared_exprs()
            with ex.lock:
                g = json_grammar(ex, whitespace=whitespace, max_whitespace=max_whitespace, object_only=object_only)
                return CompiledGrammar(g, self.tokenizer_info, check_lexemes=False,
                                       kind="json_object" if object_only else "json")

        return self._cached(("json", whitespace, max_whitespace, object_only), build)

    def compile_json_schema(self, schema, *, whitespace: str = "flexible",
                            max_whitespace: int = DEFAULT_MAX_WHITESPACE, strict: bool = False,
                            lenient: bool = False, indent: int | None = None,
                            any_whitespace: bool | None = None,
                            property_order: str = "definition") -> CompiledGrammar:
        """A JSON Schema (dict, JSON text, or pydantic model class).

        ``property_order``: ``"definition"`` (default, as llguidance and xgrammar): declared
        properties appear in ``properties`` order; ``"any"``: objects with at most 10 declared
        properties accept them in any order (JSON Schema's own semantics; the grammar tracks
        which are present), larger ones keep the definition order.
        ``any_whitespace`` is accepted for xgrammar compatibility (False means compact)."""
        from .json_schema import canonical_schema_text, json_schema_grammar, normalize_schema_input

        if property_order not in ("definition", "any"):
            raise ValueError(f"property_order must be 'definition' or 'any', not {property_order!r}")
        unordered = 10 if property_order == "any" else 0
        if any_whitespace is False:
            whitespace = "compact"
        schema_obj = normalize_schema_input(schema)
        # the canonical text is the cache key (and the grammar's ``source``, computed on demand
        # when there is no cache: for big schemas it costs about as much as a compile step)
        text = canonical_schema_text(schema_obj) if self.cache_enabled else None
        opts = (whitespace, max_whitespace, strict, lenient, indent, unordered)

        def build():
            ex = self._shared_exprs()
            with ex.lock:
                g = json_schema_grammar(schema_obj, whitespace=whitespace, max_whitespace=max_whitespace,
                                        strict=strict, lenient=lenient, indent=indent,
                                        unordered_properties=unordered, exprs=ex)
                return CompiledGrammar(g, self.tokenizer_info, check_lexemes=False, kind="json_schema",
                                       source=text if text is not None else (lambda: canonical_schema_text(schema_obj)))

        return self._cached(("json_schema", text, opts), build)
