"""Memoised lexeme-DFA rows in flat arrays, one store per ExprSet (see docs/lexer.md, "Compiled
expansion").

The transitions of an expression (:meth:`~.regexset.ExprSet.transitions`: the byte sets on which
its derivative is alive, and those derivatives) are a property of the expression alone, so every
lexer of every grammar sharing an ExprSet can reuse them: a compiler's grammars share most of
their lexemes (strings, numbers, punctuation after whitespace). They are kept here in arrays, so
that :func:`fill_stored_rows` writes the DFA rows of a lexer's frontier, and breadth first the
rows those lead to whose transitions are stored too, in one Numba call. Python computes only the
transitions not stored yet (the derivatives), and passes no bytes or per-row arrays.

Layout (:class:`RowArrays`): expression ``e`` is stored when ``first[e] > 0``; its ``count[e]``
transitions are entries ``first[e] - 1`` onwards: the byte set ``mask[i]`` (4 uint64 words,
byte ``b`` is bit ``b % 64`` of word ``b // 64``), the target expression ``tgt[i]`` and whether
it is nullable (``null[i]``). ``cnt`` holds the entries used and the expressions stored.

Every reader and writer holds the ExprSet's lock (the lexers' expansion does). Past
:data:`MAX_STORED_EXPRS` expressions the store starts over (a fresh set of arrays: the memory a
long-lived compiler holds stays bounded, as the derivative memo's).
"""
from __future__ import annotations

from collections import namedtuple

import numpy as np
from numba import njit

from . import lexdfa
from . import nodestore as ns
from .kstruct import kstruct
from .lexdfa import FastCall, g_intern, grown

#: rungs of a ladder (a run of bytes: ExprSet.ladder_next) stored with its top at most (a chain
#: round asks for as many as the trie goes deep below its frontier)
MAX_LADDER = 64
#: expressions stored before the store starts over
MAX_STORED_EXPRS = 500_000

RowArrays = namedtuple("RowArrays", "first count mask tgt null cnt")

#: :func:`fill_stored_rows` statuses
DONE = 0
NEED_ROOM = 1   # the lexeme DFA arrays need room for more states: grow them and call again
#: :func:`store_transitions` statuses (besides DONE)
NODES_ROOM = 2  # the ExprSet's node store is out of room (or past its bound: see its status)
ROWS_ROOM = 3   # ``first``/``count`` must cover more expression ids, or the entries are full
PYTHON = 4      # an expression with an intersection or complement: stored by Python
#: derivatives a compiled emptiness walk may meet for a target of a row stored in compiled code
#: (:func:`store_transitions`); past it, Python stores the row
BOOL_ROW_WALK = 16


def _new_arrays(cap_exprs: int, cap_entries: int) -> RowArrays:
    # ``first`` and ``count`` are indexed by expression id, up to the ExprSet's size: zeros are
    # mapped lazily, so a large capacity costs nothing until written
    return kstruct(RowArrays(np.zeros(cap_exprs, np.int64), np.zeros(cap_exprs, np.int32),
                             np.zeros((cap_entries, 4), np.uint64), np.zeros(cap_entries, np.int64),
                             np.zeros(cap_entries, np.uint8), np.zeros(2, np.int64)))


class RowStore:
    """The store of one ExprSet (:func:`row_store`). It holds no reference to the ExprSet (which
    holds it): a cycle would keep a dropped ExprSet, and its megabytes of memo tables, alive until
    the next full garbage collection instead of freeing it with its last grammar."""

    def __init__(self, n_exprs: int):
        self.arrays = _new_arrays(max(1024, 2 * n_exprs), 4096)
        #: expressions stored over the store's life (the memory estimate of the lexers that grew it)
        self.added = 0
        self._out = np.zeros(3, np.int64)   # store_transitions: position, stored, entries needed

    def __len__(self) -> int:
        return int(self.arrays.cnt[1])

    def has(self, e: int) -> bool:
        a = self.arrays
        return e < a.first.shape[0] and a.first[e] > 0

    def ensure(self, ex, es, ladder: int = 1) -> None:
        """Store the transitions of every expression of ``es`` (ids in the ExprSet ``ex``, whose
        store this is) not stored yet, and of the rungs of their ladders (see
        :meth:`~.regexset.ExprSet.ladder_next`; at most ``ladder`` expressions a ladder).

        One compiled call (:func:`store_transitions`) derives and stores the expressions without
        intersections or complements; it stops at each of the others, which Python stores
        (:meth:`~.regexset.ExprSet.transitions`: the emptiness of their targets is decided
        there), and goes on after it."""
        a = self.arrays
        first = a.first
        n = first.shape[0]
        todo = [e for e in es if e >= n or not first[e]]
        if not todo:
            return
        if len(self) + len(todo) > MAX_STORED_EXPRS:
            # start over; every expression asked for is stored again
            self.arrays = _new_arrays(max(1024, 2 * len(ex)), 4096)
            todo = list(es)
        arr = np.array(todo, np.int64)
        rungs = max(1, min(ladder, MAX_LADDER))
        out = self._out
        i = 0
        while i < arr.shape[0]:
            st = _store_transitions(ex._S, self.arrays, arr, i, rungs, out)
            i = int(out[0])
            self.added += int(out[1])
            ex._settle()
            if st == DONE:
                break
            if st == NODES_ROOM:
                ex._make_room()
            elif st == ROWS_ROOM:
                self._room(int(out[2]), len(ex))
            else:   # PYTHON: the expression at ``i``, and its ladder
                self._ensure_py(ex, int(arr[i]), rungs)
                i += 1

    def _room(self, entries: int, n_exprs: int) -> None:
        a = self.arrays
        if n_exprs > a.first.shape[0]:
            n = a.first.shape[0]
            a = a._replace(first=grown(a.first, 2 * n_exprs, n), count=grown(a.count, 2 * n_exprs, n))
        used = int(a.cnt[0])
        if used + entries > a.tgt.shape[0]:
            a = a._replace(mask=grown(a.mask, used + entries, used), tgt=grown(a.tgt, used + entries, used),
                           null=grown(a.null, used + entries, used))
        self.arrays = a

    def _ensure_py(self, ex, e: int, rungs: int) -> None:
        """Store ``e`` (and its ladder) from :meth:`~.regexset.ExprSet.transitions`."""
        items = []      # (expression, its transitions), each once
        batch = set()
        for _ in range(rungs):
            tr = ex.transitions(e)
            items.append((e, tr))
            batch.add(e)
            e = ex.ladder_next(e, tr)
            if e < 0 or e in batch or self.has(e):
                break
        self._add(items, ex)

    def _add(self, items, ex) -> None:
        """Store ``items`` (expression, transitions) in one write per array: the rows first, then
        ``count`` and ``first`` (a kernel that sees ``first[e]`` set sees the whole row)."""
        a = self.arrays
        need = len(ex)   # ``first``/``count`` cover every expression id of the ExprSet
        if need > a.first.shape[0]:
            n = a.first.shape[0]
            a = a._replace(first=grown(a.first, need, n), count=grown(a.count, need, n))
        used = int(a.cnt[0])
        pairs = [p for _e, tr in items for p in tr]
        k = len(pairs)
        if used + k > a.tgt.shape[0]:
            a = a._replace(mask=grown(a.mask, used + k, used), tgt=grown(a.tgt, used + k, used),
                           null=grown(a.null, used + k, used))
        self.arrays = a
        masks = np.frombuffer(b"".join([m.to_bytes(32, "little") for m, _t in pairs]), np.uint64)
        tgt = np.array([t for _m, t in pairs], np.int64)
        es = np.array([e for e, _tr in items], np.int64)
        counts = np.array([len(tr) for _e, tr in items], np.int64)
        # the ExprSet's nullable flags, read in place (the caller holds its lock: nothing appends)
        _store_rows_call(a, es, counts, masks, tgt, np.frombuffer(ex._nullable, np.uint8), used)
        self.added += len(items)


@njit(nogil=True, cache=True)
def _store_rows(a, es, counts, masks, tgt, nullable, used):
    """Write the rows (``masks``: 4 words per transition, ``tgt``) of the expressions ``es``
    (``counts`` transitions each, in order) after the ``used`` entries of store ``a``: the
    entries first, then every ``count``, then every ``first`` (a kernel that sees ``first[e]`` set
    sees the whole row)."""
    k = tgt.shape[0]
    for i in range(k):
        for w in range(4):
            a.mask[used + i, w] = masks[4 * i + w]
        a.tgt[used + i] = tgt[i]
        a.null[used + i] = nullable[tgt[i]]
    for j in range(es.shape[0]):
        a.count[es[j]] = counts[j]
    pos = used + 1
    for j in range(es.shape[0]):
        a.first[es[j]] = pos
        pos += counts[j]
    a.cnt[0] = used + k
    a.cnt[1] += es.shape[0]


_store_rows_call = FastCall(_store_rows)


@njit(nogil=True, cache=True)
def store_transitions(S, A, es, start, rungs, out):
    """Store in ``A`` the transitions (:func:`.nodestore.transitions_of`) of the expressions
    ``es[start:]`` of node store ``S`` not stored yet, each with the rungs of its ladder
    (:func:`.nodestore.ladder_next`, at most ``rungs`` expressions in all). Returns a status:
    DONE; or where it stopped, at ``out[0]`` (``out[1]``: expressions stored): NODES_ROOM,
    ROWS_ROOM (``out[2]``: the entries one expression needs), PYTHON (``es[out[0]]`` has an
    intersection or complement: its targets' emptiness is Python's to decide)."""
    out[1] = 0
    for i in range(start, es.shape[0]):
        out[0] = i
        e = es[i]
        for rung in range(rungs):
            if e < A.first.shape[0] and A.first[e] > 0:
                break   # stored (a rung of an earlier ladder, or met twice)
            if e >= A.first.shape[0]:
                out[2] = 0
                return ROWS_ROOM
            n = ns.transitions_of(S, e)
            if n < 0:
                return NODES_ROOM
            if S.hb[e]:
                # targets with intersections or complements: those whose emptiness a short
                # compiled walk decides are kept or dropped here; for any other, Python decides
                # (its structural checks avoid exploring counters), and stores ``e``
                k = 0
                for j in range(n):
                    t = S.tt[j]
                    r = ns.alive_search(S, t, BOOL_ROW_WALK)
                    if r == -2:
                        return NODES_ROOM
                    if r == -1:
                        if rung == 0:
                            return PYTHON
                        n = -1   # a rung Python stores when it is asked for
                        break
                    if r == 1:
                        if k != j:
                            S.tt[k] = t
                            for w in range(4):
                                S.tw[k, w] = S.tw[j, w]
                        k += 1
                if n < 0:
                    break
                n = k
            used = A.cnt[0]
            if used + n > A.tgt.shape[0]:
                out[2] = n
                return ROWS_ROOM
            for j in range(n):
                for w in range(4):
                    A.mask[used + j, w] = S.tw[j, w]
                t = S.tt[j]
                A.tgt[used + j] = t
                A.null[used + j] = S.nul[t]
            A.cnt[0] = used + n
            A.count[e] = n
            A.first[e] = used + 1   # last: a reader that sees it set sees the whole row
            A.cnt[1] += 1
            out[1] += 1
            e = ns.ladder_next(S, e, n)
            if e < 0:
                break
    out[0] = es.shape[0]
    return DONE


_store_transitions = FastCall(store_transitions)



def row_store(exprs) -> RowStore:
    """The ExprSet's row store (made on first use; callers hold ``exprs.lock``)."""
    s = exprs.__dict__.get("_row_store")
    if s is None:
        s = exprs.__dict__["_row_store"] = RowStore(len(exprs))
    return s


@njit(nogil=True, cache=True)
def fill_stored_rows(gs, X, S, free, queue):
    """Write the DFA rows of the lexeme DFA states ``gs`` that have none (their expressions'
    transitions must be stored), then, breadth first, of up to ``free`` of the new DFA states
    they lead to whose expressions' transitions are stored. ``queue`` is scratch space of at least
    ``free`` entries. A row is written only when ``X`` has room for every target it may add; if
    not, returns ``(NEED_ROOM, k)`` with the rows of ``gs[:k]`` written (grow ``X``, call again
    with ``gs[k:]``), else ``(DONE, len(gs))``."""
    cap = X.g_null.shape[0]
    first = S.first
    count = S.count
    n_first = first.shape[0]
    qn = 0
    for i in range(gs.shape[0]):
        g = gs[i]
        e = X.g_expr[g]
        if X.g_done[g] or e >= n_first or first[e] == 0:
            continue   # done, or not stored (the caller stores them first: never here)
        if X.g_cnt[0] + count[e] > cap:
            return NEED_ROOM, i
        qn = _write_row(g, e, X, S, queue, qn, free)
    head = 0
    while head < qn:   # the free rows, breadth first
        g = queue[head]
        head += 1
        e = X.g_expr[g]
        if X.g_done[g] or e >= n_first or first[e] == 0:
            continue
        if X.g_cnt[0] + count[e] > cap:
            break
        qn = _write_row(g, e, X, S, queue, qn, free)
    return DONE, gs.shape[0]


@njit(nogil=True, cache=True)
def _write_row(g, e, X, S, queue, qn, free):
    """Write the row of DFA state ``g`` (expression ``e``, stored) and queue the new DFA states it
    made (candidates for the free rows) while ``queue`` holds fewer than ``free``; returns the
    queue's new length."""
    g_next = X.g_next
    lx = X.g_lex[g]
    base = g * 256
    for b in range(256):
        g_next[base + b] = -1
    n0 = X.g_cnt[0]
    lo = S.first[e] - 1
    for j in range(lo, lo + S.count[e]):
        t = g_intern(X, S.tgt[j], lx, S.null[j])
        for w in range(4):
            x = S.mask[j, w]
            while x:
                k = lexdfa.ctz64(x)
                g_next[base + 64 * w + k] = t
                x &= x - np.uint64(1)
    # where the row changes (what :func:`.lexdfa.eager_expand` reads instead of 256 bytes)
    g_bnd = X.g_bnd
    c = np.uint64(1)
    prev = g_next[base]
    for b in range(1, 256):
        cur = g_next[base + b]
        if cur != prev:
            c |= np.uint64(1) << np.uint64(b & 63)
            prev = cur
        if b & 63 == 63:
            g_bnd[g, b >> 6] = c
            c = np.uint64(0)
    X.g_done[g] = True
    for h in range(n0, X.g_cnt[0]):
        if qn < free:
            queue[qn] = h
            qn += 1
    return qn


@njit(nogil=True, cache=True)
def _rows_inline(S, A, X, D, ladder, free, fqueue, out, max_stored):
    """The DFA rows :func:`.lexdfa.eager_expand` asked for (``D.need``), built here when every
    expression they need is stored by :func:`store_transitions` and the arrays have room; False
    (nothing lost: what was stored stays) when Python must do it (``Lexer._fill_rows``)."""
    n = D.cnt[8]
    gs = np.unique(D.need[:n].astype(np.int64))
    es = np.empty(gs.shape[0], np.int64)
    for i in range(gs.shape[0]):
        es[i] = X.g_expr[gs[i]]
    if A.cnt[1] + es.shape[0] * ladder > max_stored:
        return False   # Python starts the store over
    st = store_transitions(S, A, es, 0, ladder, out)
    out[3] += out[1]
    if st != DONE:
        return False
    total = 0
    for i in range(es.shape[0]):
        e = es[i]
        if e >= A.first.shape[0] or A.first[e] == 0:
            return False
        total += A.count[e]
    if X.g_cnt[0] + total + free > X.g_null.shape[0]:
        return False
    st2, k = fill_stored_rows(gs, X, A, free, fqueue)
    if st2 != DONE:
        return False
    D.cnt[8] = 0
    return True


@njit(nogil=True, cache=True)
def eager_expand_rows(budget, spec_rows, max_states, hard_max, X, trans, state_acc, expanded, acc_off,
                      acc_lex, D, buf, pbuf, ibuf, abuf, S, A, ladder, free, fqueue, out, max_stored):
    """:func:`.lexdfa.eager_expand`, building the DFA rows it asks for in the same call where it
    can (:func:`_rows_inline`): a lexer state's first visit then needs no round trip through
    Python unless a row needs Python (an emptiness check the compiled walk leaves open) or an
    array must grow. ``out[3]`` counts the expressions stored; past ``max_stored`` in the store
    (:data:`MAX_STORED_EXPRS`) Python builds the rows, and starts the store over."""
    while True:
        st, s = lexdfa.eager_expand(budget, spec_rows, max_states, hard_max, X, trans, state_acc, expanded,
                                    acc_off, acc_lex, D, buf, pbuf, ibuf, abuf)
        if st != lexdfa.NEED_ROWS or not _rows_inline(S, A, X, D, ladder, free, fqueue, out, max_stored):
            return st, s
