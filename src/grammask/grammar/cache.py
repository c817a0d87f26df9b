"""The LRU cache of compiled grammars (one per :class:`~.compiler.GrammarCompiler`, which owns it).

Keys are tuples that separate everything that changes the grammar: the compiler's front ends use
``(kind, canonical text, options)``; the chat engine caches whole requests' grammars under
``(kind, canonical spec, options, tokenizer key)`` through :meth:`~.compiler.GrammarCompiler.get_or_compile`.
Thread-safe; concurrent requests for the same grammar compile it once (the others wait on the
first one's future). A failed compile is not cached. A :class:`CompiledGrammar` is immutable
apart from its lexer, which only grows (under its own lock), so one compiled grammar serves any
number of concurrent requests, each with its own :class:`~grammask.grammar.matcher.GrammarMatcher`.

Two bounds: ``max_size`` entries and ``max_bytes`` of what the entries hold
(:meth:`CompiledGrammar.held_bytes`, an estimate that grows as the grammars' lexers grow with
use: it is re-read at every lookup). Least recently used entries are evicted past either; the
entry just looked up or built stays, so one grammar larger than ``max_bytes`` is still served. An
evicted grammar lives on while matchers use it and is freed with the last of them.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from concurrent.futures import Future
from typing import Callable

from .compiled import CompiledGrammar


#: the default of ``GrammarCache(max_bytes=...)`` and ``GrammarCompiler(cache_max_bytes=...)``
DEFAULT_CACHE_MAX_BYTES = 256 << 20


class GrammarCache:
    def __init__(self, max_size: int = 64, max_bytes: int | None = DEFAULT_CACHE_MAX_BYTES):
        self.max_size = max_size
        self.max_bytes = max_bytes
        self.evictions = 0
        self._entries: OrderedDict[tuple, Future] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get_or_compile(self, key: tuple, build: Callable[[], CompiledGrammar]) -> tuple[CompiledGrammar, bool]:
        """``(compiled grammar, hit)``; ``build`` runs (in the caller's thread) on a miss."""
        if self.max_size <= 0:
            self.misses += 1
            return build(), False
        with self._lock:
            fut = self._entries.get(key)
            if fut is not None:
                self._entries.move_to_end(key)
                self.hits += 1
                owner = False
                self._evict()
            else:
                fut = Future()
                self._entries[key] = fut
                self.misses += 1
                owner = True
                self._evict()
        if not owner:
            return fut.result(), True
        try:
            cg = build()
        except BaseException as e:
            with self._lock:
                if self._entries.get(key) is fut:
                    del self._entries[key]
            fut.set_exception(e)
            fut.exception()  # mark retrieved: waiters re-raise it, nobody logs it
            raise
        fut.set_result(cg)
        with self._lock:
            self._evict()
        return cg, False

    def _evict(self) -> None:
        """Drop least recently used entries past ``max_size`` or ``max_bytes`` (the most recent
        one always stays). Holds ``_lock``."""
        e = self._entries
        while len(e) > self.max_size:
            e.popitem(last=False)
            self.evictions += 1
        if self.max_bytes is None or len(e) <= 1:
            return
        sizes = [_held(f) for f in e.values()]
        total = sum(sizes)
        i = 0
        while total > self.max_bytes and len(e) > 1:
            e.popitem(last=False)
            self.evictions += 1
            total -= sizes[i]
            i += 1

    @property
    def held_bytes(self) -> int:
        """The estimate of what the cached grammars hold (see the module docstring)."""
        with self._lock:
            return sum(_held(f) for f in self._entries.values())

    def __contains__(self, key: tuple) -> bool:
        with self._lock:
            fut = self._entries.get(key)
        return fut is not None and fut.done() and fut.exception() is None

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    @property
    def info(self) -> dict:
        return {"size": len(self._entries), "max_size": self.max_size, "hits": self.hits, "misses": self.misses,
                "held_bytes": self.held_bytes, "max_bytes": self.max_bytes, "evictions": self.evictions}


def _held(fut: Future) -> int:
    """What a finished entry's grammar holds (0 while it compiles or when it failed)."""
    if not fut.done() or fut.exception() is not None:
        return 0
    return fut.result().held_bytes()

