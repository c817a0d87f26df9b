"""What :func:`.mask.forced_after` knows about tokens with no forced text after them, per lexer
state, shared by the grammars of an ExprSet.

The canonical mode asks, for the candidates of a mask, which of them the grammar forces text
after (:meth:`.GrammarMatcher.forced_after_words`). A candidate read from lexer state ``s`` by
lexer moves alone, after which the lexer alone reads two bytes, has none from any parser state
over ``s``: a fact of ``s``, kept as one bit per token in ``s``'s *row* and not read again (see
:func:`.mask.forced_after`, which also keeps such facts for the state the next lexeme starts in).

The fact depends on nothing but the lexer moves from ``s``, that is on the state's member
expressions (as the state cache's entries, :class:`.state_cache.SharedEntries`), so a row is
keyed by those expressions and shared by every grammar compiled into one ExprSet for one
tokenizer: the value start of a string property, or the whitespace before a key, is the same
state in most JSON schemas, and a first document of a new schema finds its rows learned.

Rows are given under a lock, never inside the kernel, and zeroed when given; a kernel running in
another thread may set bits in a row meanwhile, each a fact true for every grammar sharing it.
"""
from __future__ import annotations

import threading

import numpy as np

from .state_cache import _by_expression

#: rows per ExprSet and tokenizer (16 KB each on a 128k vocabulary, taken only when given): past
#: them, a new state gets no row (its candidates are read at every mask)
MAX_ROWS = 2048


class SharedSkipRows:
    """The rows of one ExprSet for one tokenizer: ``bits[k]`` for the states whose member
    expressions are ``key``, ``rows[key] == k``."""

    def __init__(self, n_words: int):
        self.n_words = n_words
        # every row at once, uninitialised: only the rows given are ever touched (zeroing them
        # all here cost up to ~30 ms a grammar)
        self.bits = np.empty((MAX_ROWS, n_words), np.uint32)
        self.rows: dict[bytes, int] = {}
        self.lock = threading.Lock()

    @property
    def nbytes(self) -> int:
        return len(self.rows) * self.n_words * 4

    def row(self, key: bytes) -> int:
        """The row of ``key`` (given now if it has none: zeros; -1 when every row is given)."""
        k = self.rows.get(key)
        if k is not None:
            return k
        with self.lock:
            k = self.rows.get(key)
            if k is None:
                if len(self.rows) == MAX_ROWS:
                    return -1
                k = len(self.rows)
                self.bits[k] = 0
                self.rows[key] = k
            return k


def shared_skip_rows(exprs, info, n_words: int) -> SharedSkipRows:
    """The :class:`SharedSkipRows` of ``exprs`` for tokenizer ``info``."""
    per = exprs.__dict__.setdefault("_skip_rows", {})
    key = (info.cache_key, n_words)
    sr = per.get(key)
    if sr is None:
        with exprs.lock:
            sr = per.get(key)
            if sr is None:
                sr = per[key] = SharedSkipRows(n_words)
    return sr


class SkipPool:
    """One lexer generation's view of its :class:`SharedSkipRows`: ``slot_of[s]``, the row of
    state ``s`` in ``bits`` (-1: none yet), the arrays :func:`.mask.forced_after` takes."""

    __slots__ = ("shared", "bits", "slot_of", "n_words", "_lock")

    def __init__(self, shared: SharedSkipRows, n_states: int = 1024):
        self.shared = shared
        self.bits = shared.bits
        self.n_words = shared.n_words
        self.slot_of = np.full(n_states, -1, np.int64)
        self._lock = threading.Lock()

    @property
    def nbytes(self) -> int:
        """This lexer's own arrays (the rows are the ExprSet's)."""
        return self.slot_of.nbytes

    def slot(self, s: int, lexer) -> int:
        """State ``s``'s row (given now if it has none: zeros, or those learned by another
        grammar with its expressions; -1 when the shared rows are all given)."""
        if s < self.slot_of.shape[0]:
            k = int(self.slot_of[s])
            if k >= 0:
                return k
        k = self.shared.row(_by_expression(lexer, s)[0])
        if k >= 0:
            with self._lock:
                if s >= self.slot_of.shape[0]:
                    grown = np.full(max(2 * self.slot_of.shape[0], s + 1), -1, np.int64)
                    grown[: self.slot_of.shape[0]] = self.slot_of
                    self.slot_of = grown
                self.slot_of[s] = k
        return k
