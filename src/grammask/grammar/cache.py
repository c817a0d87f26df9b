"""The LRU cache of compiled grammars (one per :class:`~.compiler.GrammarCompiler`, which owns it).

Keys are tuples that separate everything that changes the grammar: the compiler's front ends use
``(kind, canonical text, options)``; the chat engine caches whole requests' grammars under
``(kind, canonical spec, options, tokenizer key)`` through :meth:`~.compiler.GrammarCompiler.get_or_compile`.
Thread-safe; concurrent requests for the same grammar compile it once (the others wait on the
first one's future). A failed compile is not cached. A :class:`CompiledGrammar` is immutable
apart from its lexer, which only grows (under its own lock), so one compiled grammar serves any
number of concurrent requests, each with its own :class:`~grammask.grammar.matcher.GrammarMatcher`.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from concurrent.futures import Future
from typing import Callable

from .compiled import CompiledGrammar


class GrammarCache:
    def __init__(self, max_size: int = 64):
        self.max_size = max_size
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
            else:
                fut = Future()
                self._entries[key] = fut
                self.misses += 1
                owner = True
                while len(self._entries) > self.max_size:
                    self._entries.popitem(last=False)
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
        return cg, False

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
        return {"size": len(self._entries), "max_size": self.max_size, "hits": self.hits, "misses": self.misses}

