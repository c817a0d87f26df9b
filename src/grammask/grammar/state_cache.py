"""Per lexer state, the part of a mask that does not depend on the parser (xgrammar's adaptive
token mask cache, on our lexer states; see docs/mask.md, "The state cache").

A mask from lexer state ``s`` walks the token trie (:func:`~.mask.walk_trie`). Most of what the
walk decides depends on ``s`` alone: a node reached by lexer moves only is allowed whatever the
parser says, and a dead lexer move kills its subtree whatever the parser says. The parser takes
part only where a lexeme ends inside a token (the next byte cannot extend it), and only there does
the answer depend on the parse stack. So, for a state met again, :func:`~.mask.scan_state` walks the
trie once with lexer moves alone and keeps

- the tokens reached by lexer moves alone (a list, or mask words when there are many),
- the nodes where a lexeme ends, grouped by (accepting state, byte): one parser step decides a
  whole group, and a group's subtrees are walked (as the full walk would) only when it is allowed.

:func:`~.mask.fill_mask_cached` then gives the same row as the full walk, with dead subtrees and
lexer-only paths gone. In a JSON string the full walk visits ~4,000 nodes of the Llama-3 trie
that the slices do not cover; the cached mask reads ~300 tokens and decides ~75 groups.

A state is cached on its second visit (:data:`BUILD_AFTER`), when its scan meets no lexer state
that is not expanded yet (otherwise the scan is retried at later visits, a power of two apart).
Lexer states only ever grow transitions, so an entry stays valid for the lexer generation it was
built in; the cache belongs to that generation (``lexer.mask_cache``) and goes with it. Its
arrays are bounded per generation by :data:`MAX_CACHE_BYTES` (past it, further states are not
cached) and counted by the grammar's :meth:`~.compiled.CompiledGrammar.held_bytes`.
"""
from __future__ import annotations

import threading
import weakref

import numpy as np

from .mask import FastCall, StateCache, scan_state

#: a state is cached on this visit (the first visit of most states is also their last)
BUILD_AFTER = 2
#: bytes of cached arrays per lexer generation, past which no more states are cached
MAX_CACHE_BYTES = 32 << 20
#: per-state Python overhead counted with the arrays (the entry, its tuple and dict slot)
ENTRY_BYTES = 400

_scan_state = FastCall(scan_state)


class StateMaskCache:
    """The state cache of one lexer generation (see the module docstring). :meth:`entry` is
    called once per mask with the matcher's lexer state."""

    def __init__(self, lexer, slicer, forest, max_bytes: int = MAX_CACHE_BYTES):
        # weak, as the slice checker's: the lexer holds this cache
        self._lexer = weakref.ref(lexer)
        self.slicer = slicer
        self.forest = forest
        self.max_bytes = max_bytes
        #: s -> [skip flags, their combination, visits, StateCache or None]
        self._entries: dict[int, list] = {}
        self.nbytes = 0
        self.n_cached = 0
        self._lock = threading.Lock()

    def entry(self, s: int) -> list:
        """``[skip flags, combination, visits, cache]`` of state ``s`` (the cache, when not None,
        is a :data:`~.mask.StateCache` for :func:`~.mask.fill_mask_cached`)."""
        e = self._entries.get(s)
        if e is None:
            flags, combo = self.slicer.skip_flags(s)
            e = self._entries[s] = [flags, combo, 0, None]
        if e[3] is None:
            v = e[2] = e[2] + 1
            # on the second visit, then (a scan that met unexpanded states) at visits 4, 8, ...
            if v >= BUILD_AFTER and v & (v - 1) == 0 and self.nbytes < self.max_bytes:
                e[3] = self._build(s, e[0])
        return e

    def _build(self, s: int, flags: np.ndarray):
        lexer = self._lexer()
        if lexer is None:
            return None
        L = lexer.tables
        F = self.forest.arrays
        n = F.node_byte.shape[0]
        toks = np.empty(self.forest.trie.n_tokens + 1, np.int32)
        nodes = np.empty(n, np.int32)
        states = np.empty(n, np.int32)
        ls = np.empty(int(self.forest.trie.max_depth) + 2, np.int32)
        st, nt, nb = _scan_state(F, flags, s, L.trans, L.state_acc, ls, toks, nodes, states)
        if st != 0:
            return None
        nodes, states = nodes[:nb], states[:nb]
        byte = F.node_byte[nodes].astype(np.int32)
        # groups by (accepted lexemes, state, byte): the parser's rows are shared along a run
        order = np.lexsort((nodes, byte, states, L.state_acc[states]))
        nodes, states, byte = nodes[order], states[order], byte[order]
        new = np.ones(nb, np.bool_)
        if nb:
            new[1:] = (states[1:] != states[:-1]) | (byte[1:] != byte[:-1])
        starts = np.flatnonzero(new)
        off = np.empty(starts.shape[0] + 1, np.int64)
        off[:-1] = starts
        off[-1] = nb
        n_words = F.combo_words.shape[1]
        if nt > n_words:   # many tokens: as mask words (what a list of them would outweigh)
            w = np.zeros(n_words, np.uint32)
            t = toks[:nt]
            np.bitwise_or.at(w, t >> 5, np.left_shift(np.uint32(1), (t & 31).astype(np.uint32)))
            tok_words, tok_list = w, np.empty(0, np.int32)
        else:
            tok_words, tok_list = np.empty(0, np.uint32), toks[:nt].copy()
        C = StateCache(tok_words, tok_list, np.ascontiguousarray(states[starts]),
                       np.ascontiguousarray(byte[starts]), off, np.ascontiguousarray(nodes))
        size = sum(a.nbytes for a in C) + ENTRY_BYTES
        with self._lock:
            self.nbytes += size
            self.n_cached += 1
        return C
