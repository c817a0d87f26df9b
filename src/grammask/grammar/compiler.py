"""GrammarCompiler: EBNF, regex, builtin JSON, JSON Schema and structural tags to
:class:`CompiledGrammar`, cached.

Mirrors xgrammar's ``GrammarCompiler``. Thread-safe: concurrent requests for the same grammar
compile it once (the others wait for it); compiled grammars are kept in the compiler's LRU cache
(:class:`~.cache.GrammarCache`) keyed by ``(kind, canonical text, options)``. A caller with its own
notion of "the same grammar" (the chat engine: a request's ``response_format``) caches under its
own key with :meth:`GrammarCompiler.get_or_compile`; compiles run inside it are not cached again.

Every compile is bounded in memory: an estimate of what it holds (regex nodes and derivatives,
grammar rules, lowered rules, Earley and lexer tables; see :mod:`.membound`) is charged as it
grows, and going past ``max_compile_memory_bytes`` (default 256 MiB) raises
:class:`~grammask.errors.GrammarMemoryError` naming the part and the figures. So does a
``MemoryError`` while compiling.
"""
from __future__ import annotations

import functools
import gc
import threading
from contextlib import contextmanager
from typing import Callable

from ..errors import GrammarMemoryError, GrammarTooComplexError
from .builtin import DEFAULT_MAX_WHITESPACE, json_grammar
from .cache import DEFAULT_CACHE_MAX_BYTES, GrammarCache
from .cfg import Grammar
from .compiled import CompiledGrammar
from .lexer import MAX_LEXER_STATES
from .membound import DEFAULT_MAX_COMPILE_MEMORY_BYTES, compile_memory_bound, mib
from .regexset import ExprSet

#: a compiler starts a new shared ExprSet once the current one holds this many expressions. The
#: ExprSet and the caches that live on it (derivatives, lexeme DFA rows, shared mask-cache entries,
#: walk verdicts, slice proofs) grow with every distinct grammar compiled: this bound, not the
#: grammar cache, is what keeps a server that sees a new schema per request bounded (was
#: 1,000,000: RSS grew ~28 MiB per 100 requests). A reset costs colder compiles and first visits
#: until the common lexemes (strings, numbers, whitespace) are rebuilt. 20,000 (sessions 14-33)
#: meant a reset every ~24 schemas on MaskBench's (~800 expressions each); at 80,000 (session 34)
#: a 1-in-20 pass resets 6 times instead of 24: TBM total -5%, TTFM total -10% (three interleaved
#: pairs), peak RSS +65 MiB (776 -> 842); benchmarks/server_rss.py, 2,000 distinct requests:
#: 872 -> 916 MiB. 160,000 gained little more (2 resets) for another +100 MiB.
EXPRS_RESET_NODES = 80_000
#: the room a shared ExprSet is made with: it held 20-27k nodes (and their derivatives) when it
#: was replaced at 20,000 (the 1-in-20 MaskBench pass), which from the default start took it
#: through ~8 regrowths and rehashes of its tables, 0.3 s of the pass. At 80,000 a start of
#: 1 << 16 still grew once, past 65,536 nodes, inside whatever mask made that node (a 16 ms
#: rehash in Github_ultra---o21135's slowest one): 1 << 17 holds the ExprSet up to its reset.
#: The tables reached that size before each reset anyway; measured, peak RSS 908 -> 935 MiB on
#: the full MaskBench run and benchmarks/server_rss.py within its run-to-run drift. (Its tables
#: still regrow at half full, past 65,536 nodes or 262,144 derivatives, 12 times in a 1-in-20
#: pass, 3-11 ms each once only the full one was rehashed, session 38; 1 << 18 left one of
#: them for +30 MiB of peak RSS, and was not taken.)
SHARED_EXPRS_ROOM = 1 << 17


#: no full garbage collection while a grammar compiles (see :func:`_collector_paused`)
PAUSE_GC_WHILE_COMPILING = True
_GC_LOCK = threading.Lock()
_gc_state: dict = {"depth": 0, "thresholds": None}


@contextmanager
def _collector_paused():
    """No full (oldest-generation) garbage collection while a grammar compiles (the collector is
    one per process, so for every thread). A compile builds up to hundreds of thousands of objects
    that live until it ends (the schema's IR, rules, expressions), and each full collection it
    triggers walks all of them: over a MaskBench pass, 90 of the 129 collections of over 30 ms were
    inside compiles (up to 170 ms each, in the compile's time or another thread's mask). The young
    generations are still collected (so cyclic garbage does not pile up: with the collector off
    altogether the sample's peak RSS went 676 -> 1,067 MiB); the oldest generation's threshold is
    raised out of reach and put back when the last running compile ends."""
    if not PAUSE_GC_WHILE_COMPILING:
        yield
        return
    st = _gc_state
    with _GC_LOCK:
        if st["depth"] == 0:
            t = st["thresholds"] = gc.get_threshold()
            gc.set_threshold(t[0], t[1], 1 << 30)
        st["depth"] += 1
    try:
        yield
    finally:
        with _GC_LOCK:
            st["depth"] -= 1
            if st["depth"] == 0:
                gc.set_threshold(*st["thresholds"])


def _depth_bounded(what: str):
    """A front end whose input nests deeper than Python's recursion (a regex of thousands of
    groups, a schema nested hundreds of levels where a check recurses before the front end's own
    depth bound) raises :class:`GrammarTooComplexError`, never a bare ``RecursionError``."""

    def wrap(fn):
        @functools.wraps(fn)
        def inner(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except RecursionError:
                raise GrammarTooComplexError(f"the {what} is nested too deeply to compile") from None

        return inner

    return wrap


@contextmanager
def _memory_bounded(limit: int | None):
    """A compile under the memory bound ``limit`` (see :mod:`.membound`); a ``MemoryError``
    inside is a :class:`GrammarMemoryError` too."""
    with compile_memory_bound(limit) as mem:
        try:
            yield mem
        except MemoryError:
            raise GrammarMemoryError(
                f"the compile ran out of memory (MemoryError) at an estimate of {mib(mem.total)}",
                what="MemoryError", used_bytes=mem.total, limit_bytes=limit) from None


class GrammarCompiler:
    """Compiles grammars for one tokenizer (see the module docstring).

    ``max_compile_memory_bytes``: the bound on the estimate of what one compile holds (default
    :data:`~.membound.DEFAULT_MAX_COMPILE_MEMORY_BYTES`, 256 MiB; ``None``: unbounded); past it,
    :class:`~grammask.errors.GrammarMemoryError`. The grammars of MaskBench estimate at most a few
    MiB (benchmarks/RESULTS.md, memory.py).

    The grammar cache holds at most ``cache_size`` grammars and ``cache_max_bytes`` (default
    256 MiB; ``None``: no byte bound) of what they hold, by :meth:`CompiledGrammar.held_bytes`
    (see :mod:`.cache`)."""

    def __init__(self, tokenizer_info, *, cache_size: int = 128, max_threads: int = 8,
                 cache_enabled: bool = True, max_shared_exprs: int = EXPRS_RESET_NODES,
                 max_lexer_states: int = MAX_LEXER_STATES,
                 max_compile_memory_bytes: int | None = DEFAULT_MAX_COMPILE_MEMORY_BYTES,
                 cache_max_bytes: int | None = DEFAULT_CACHE_MAX_BYTES):
        self.tokenizer_info = tokenizer_info
        self.max_compile_memory_bytes = max_compile_memory_bytes
        self.cache_size = cache_size
        self.cache_enabled = cache_enabled and cache_size > 0
        self.cache = GrammarCache(cache_size if self.cache_enabled else 0, cache_max_bytes)
        self._lock = threading.Lock()
        self._local = threading.local()   # .depth: inside get_or_compile / uncached() in this thread
        self._exprs = ExprSet(initial_nodes=SHARED_EXPRS_ROOM)
        self.max_shared_exprs = int(max_shared_exprs)
        #: states of one lexer generation of each compiled grammar (see grammar/lexer.py)
        self.max_lexer_states = int(max_lexer_states)
        self.exprs_resets = 0

    def _shared_exprs(self) -> ExprSet:
        """The ExprSet every grammar of this compiler is built in: derivatives, lexer transitions
        and slice checks of common lexemes (strings, numbers, formats) are computed once. Writers
        hold its lock. Replaced by a fresh one when it grows too big (old grammars keep theirs)."""
        with self._lock:
            if len(self._exprs) > self.max_shared_exprs:
                self._exprs = ExprSet(initial_nodes=SHARED_EXPRS_ROOM)
                self.exprs_resets += 1
            return self._exprs

    # ------------------------------------------------------------------ cache
    def get_or_compile(self, key: tuple, build: Callable[[], CompiledGrammar]) -> tuple[CompiledGrammar, bool]:
        """``(compiled grammar, hit)`` from the cache under the caller's ``key`` (a tuple that
        separates everything that changes the grammar); ``build`` runs in the caller's thread on a
        miss, and the compiles it runs through this compiler are not cached under their own keys.
        With ``cache_size=0`` every call builds (and counts a miss)."""
        def bounded():
            with _memory_bounded(self.max_compile_memory_bytes):
                return build()

        with self.uncached():
            return self.cache.get_or_compile(key, bounded)

    @contextmanager
    def uncached(self):
        """Compiles through this compiler in this thread, inside the block, skip the cache."""
        self._local.depth = getattr(self._local, "depth", 0) + 1
        try:
            yield self
        finally:
            self._local.depth -= 1

    def _caching(self) -> bool:
        return self.cache_enabled and not getattr(self._local, "depth", 0)

    def _bounded(self, build: Callable[[], CompiledGrammar]) -> CompiledGrammar:
        """``build()`` under this compiler's memory bound; its lexer tables are charged last."""
        with _memory_bounded(self.max_compile_memory_bytes) as mem, _collector_paused():
            cg = build()
            cg.compile_bytes = mem.total   # the lexer is counted by the grammar's own estimate
            mem.charge("lexer tables", cg.lexer.table_bytes())
        return cg

    def _cached(self, key: tuple, build) -> CompiledGrammar:
        if not self._caching():
            return self._bounded(build)
        return self.cache.get_or_compile(key, lambda: self._bounded(build))[0]

    def clear_cache(self) -> None:
        self.cache.clear()

    @property
    def hits(self) -> int:
        return self.cache.hits

    @property
    def misses(self) -> int:
        return self.cache.misses

    @property
    def cache_info(self) -> dict:
        return {"size": len(self.cache), "hits": self.hits, "misses": self.misses}

    # ------------------------------------------------------------------ front ends
    @_depth_bounded("grammar")
    def compile_grammar(self, ebnf: str | Grammar, root: str = "root") -> CompiledGrammar:
        """An EBNF/GBNF grammar text (or a :class:`Grammar` built in code)."""
        if isinstance(ebnf, Grammar):
            return self._bounded(lambda: CompiledGrammar(ebnf, self.tokenizer_info, max_lexer_states=self.max_lexer_states,
                                                         root=root, kind="grammar"))

        def build():
            from .ebnf import parse_ebnf

            ex = self._shared_exprs()
            with ex.lock:
                g = parse_ebnf(ebnf, root=root, exprs=ex)
                return CompiledGrammar(g, self.tokenizer_info, max_lexer_states=self.max_lexer_states, root=root, kind="grammar", source=ebnf)

        return self._cached(("grammar", ebnf, root), build)

    @_depth_bounded("regex")
    def compile_regex(self, pattern: str) -> CompiledGrammar:
        """A regex (ECMA-262 syntax) matched against the whole output."""

        def build():
            from .regex import parse_regex

            ex = self._shared_exprs()
            with ex.lock:
                g = Grammar(ex)
                e = parse_regex(pattern, ex)
                g.rule("root", [[~e]])
                return CompiledGrammar(g, self.tokenizer_info, max_lexer_states=self.max_lexer_states, kind="regex", source=pattern)

        return self._cached(("regex", pattern), build)

    def compile_builtin_json_grammar(self, *, whitespace: str = "flexible",
                                     max_whitespace: int = DEFAULT_MAX_WHITESPACE,
                                     object_only: bool = False) -> CompiledGrammar:
        """Any JSON value (``object_only``: any JSON object, for ``json_object`` mode)."""

        def build():
            ex = self._shared_exprs()
            with ex.lock:
                g = json_grammar(ex, whitespace=whitespace, max_whitespace=max_whitespace, object_only=object_only)
                return CompiledGrammar(g, self.tokenizer_info, max_lexer_states=self.max_lexer_states, check_lexemes=False,
                                       kind="json_object" if object_only else "json")

        return self._cached(("json", whitespace, max_whitespace, object_only), build)

    @_depth_bounded("JSON Schema")
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
        text = canonical_schema_text(schema_obj) if self._caching() else None
        opts = (whitespace, max_whitespace, strict, lenient, indent, unordered)

        def build():
            ex = self._shared_exprs()
            with ex.lock:
                g = json_schema_grammar(schema_obj, whitespace=whitespace, max_whitespace=max_whitespace,
                                        strict=strict, lenient=lenient, indent=indent,
                                        unordered_properties=unordered, exprs=ex)
                return CompiledGrammar(g, self.tokenizer_info, max_lexer_states=self.max_lexer_states, check_lexemes=False, kind="json_schema",
                                       source=text if text is not None else (lambda: canonical_schema_text(schema_obj)))

        return self._cached(("json_schema", text, opts), build)

    @_depth_bounded("structural tag")
    def compile_structural_tag(self, spec, *, strict: bool = False, whitespace: str = "flexible") -> CompiledGrammar:
        """Free text interleaved with tagged JSON bodies (a :class:`~.structural_tag.TagSpec`:
        structures ``(begin, schema, end)``, triggers, mode); see :mod:`.structural_tag`.
        ``strict`` and ``whitespace`` apply to the bodies' JSON Schemas."""
        from .structural_tag import structural_tag_grammar

        canonical = spec.canonical()

        def build():
            g = structural_tag_grammar(spec, strict=strict, whitespace=whitespace)
            return CompiledGrammar(g, self.tokenizer_info, max_lexer_states=self.max_lexer_states, check_lexemes=False, kind="structural_tag",
                                   source=canonical)

        return self._cached(("structural_tag", canonical, whitespace, strict), build)
