"""Compiled expansion of lexer states: per-lexeme DFAs over byte classes, subset construction in
Numba (see docs/lexer.md, "Compiled expansion").

At compile time each lexeme's regex is determinised on its own, by derivatives
(:meth:`~.regexset.ExprSet.transitions`), into a :class:`LexemeDFA` (cached per ``ExprSet``, so
shared by the grammars of a compiler); a lexeme whose DFA passes :data:`MAX_LEXEME_DFA_STATES`
states (strings of ``maxLength: 5000``, patterns under length limits) has none. When every lexeme
of a grammar has one, its lexer is *eager* (:class:`EagerTables`): the DFAs are laid out as one
table over the grammar's byte classes (bytes no DFA tells apart), a DFA state has a global id
``g`` (the lexeme is implied), and a lexer state is the sorted array of its members' ``g``.
:func:`eager_expand` builds lexer states from these tables without Python objects: per byte class
it steps every member, interns the resulting member set in an open-addressing hash (member sets in
flat arrays, :class:`EagerStates`) and the set of accepted lexemes likewise, and writes the state's
256-entry ``trans`` row. It asks Python for room (a status) when an array is full; Python grows it
and calls again. The lexer states and transitions are exactly those of the derivative
construction (``Lexer._expand_one``), only numbered in another order.
"""
from __future__ import annotations

from collections import namedtuple

import numpy as np
from numba import njit

from ..errors import GrammarTooComplexError
from . import membound

#: states of one lexeme's DFA past which the lexeme (and its grammar's lexer) stays lazy
MAX_LEXEME_DFA_STATES = 1_000
#: DFA states of all the lexemes of one grammar past which its lexer stays lazy
MAX_GRAMMAR_DFA_STATES = 20_000
#: DFA states kept in the per-ExprSet cache before it starts over
MAX_CACHED_DFA_STATES = 200_000

#: kernel statuses
DONE = 0
NEED_ROOM = 1
TOO_MANY = 2

#: the static tables of an eager lexer (shared by its generations): ``cls_of[b]`` the class of
#: byte ``b``; ``g_next[g * C + c]`` the global DFA state after class ``c`` (-1 dead); ``g_null``,
#: ``g_lex`` acceptance and lexeme of each global state
EagerStatic = namedtuple("EagerStatic", "cls_of g_next g_null g_lex")
#: the growing member-set store of one lexer generation (see :func:`eager_expand`); ``cnt``:
#: states, member slots used, accepted sets, accepted-lexeme slots used, queue head, queue tail,
#: full flag, expansions done
EagerStates = namedtuple("EagerStates", "ms_off ms_mem h_keys a_keys queue cnt")


#: one lexeme's DFA: state ``k`` is the derivative ``exprs[k]`` (0: the lexeme itself);
#: ``rows[k, b]`` the next state (-1 dead), ``nullable[k]`` acceptance, ``classes[b]`` the class
#: of byte ``b`` in its coarsest byte partition (a tuple: the per-ExprSet cache stays out of the
#: garbage collector's way, see :class:`~.regexset.ExprSet`)
LexemeDFA = namedtuple("LexemeDFA", "exprs rows nullable classes")


def _lexeme_dfa(exprs, rows, nullable):
    # bytes whose columns are equal are one class
    _u, inv = np.unique(rows, axis=1, return_inverse=True)
    return LexemeDFA(exprs, rows, nullable, inv.reshape(-1).astype(np.int32))


_ABSENT = object()


def lexeme_dfa(exprs, e: int):
    """The DFA of expression ``e`` of ``exprs`` (cached there), or None when it has more than
    :data:`MAX_LEXEME_DFA_STATES` states or its construction hits a bound of the ExprSet."""
    from .lexer import _mask_bytes

    cache = exprs.__dict__.setdefault("_lexeme_dfas", {})
    r = cache.get(e, _ABSENT)
    if r is not _ABSENT:
        return _unpack(r)
    size = exprs.__dict__.get("_lexeme_dfa_states", 0)
    if size > MAX_CACHED_DFA_STATES:
        cache.clear()
        size = 0
    idx = {e: 0}
    order = [e]
    rows = []
    r = None
    try:
        i = 0
        while i < len(order):
            row = np.full(256, -1, np.int32)
            for m, t in exprs.transitions(order[i]):
                k = idx.get(t)
                if k is None:
                    if len(order) >= MAX_LEXEME_DFA_STATES:
                        raise _TooBig
                    k = idx[t] = len(order)
                    order.append(t)
                row[_mask_bytes(m)] = k
            rows.append(row)
            i += 1
        nul = np.array([exprs.nullable(x) for x in order], np.bool_)
        r = _lexeme_dfa(tuple(order), np.stack(rows), nul)
        size += len(order)
    except (_TooBig, GrammarTooComplexError):
        r = None
    exprs.__dict__["_lexeme_dfa_states"] = size
    # kept as a plain tuple of ints and bytes, which the garbage collector stops tracking
    cache[e] = None if r is None else (r.exprs, r.rows.tobytes(), r.nullable.tobytes(), r.classes.tobytes())
    return r


def _unpack(c):
    if c is None:
        return None
    exprs, rows, nul, classes = c
    return LexemeDFA(exprs, np.frombuffer(rows, np.int32).reshape(len(exprs), 256),
                     np.frombuffer(nul, np.bool_), np.frombuffer(classes, np.int32))


class _TooBig(Exception):
    pass


class EagerTables:
    """The static tables of an eager lexer over ``lexemes`` (expression ids of ``exprs``)."""

    def __init__(self, exprs, dfas: list[LexemeDFA]):
        self.exprs = exprs
        self.dfas = dfas
        sizes = [d.rows.shape[0] for d in dfas]
        self.base = np.zeros(len(dfas) + 1, np.int64)
        np.cumsum(sizes, out=self.base[1:])
        n_g = int(self.base[-1])
        # the grammar's byte classes: the common refinement of the lexemes' partitions
        if dfas:
            _u, first, inv = np.unique(np.stack([d.classes for d in dfas]), axis=1, return_index=True,
                                       return_inverse=True)
            cls_of = inv.reshape(-1).astype(np.int32)
        else:
            first = np.zeros(1, np.intp)
            cls_of = np.zeros(256, np.int32)
        self.n_classes = C = int(first.shape[0])
        g_next = np.empty((n_g, C), np.int32)
        g_null = np.empty(n_g, np.bool_)
        g_lex = np.empty(n_g, np.int32)
        for lx, d in enumerate(dfas):
            lo, hi = int(self.base[lx]), int(self.base[lx + 1])
            sub = d.rows[:, first]
            g_next[lo:hi] = np.where(sub >= 0, sub + lo, -1)
            g_null[lo:hi] = d.nullable
            g_lex[lo:hi] = lx
        self.static = EagerStatic(cls_of, g_next.reshape(-1), g_null, g_lex)
        self.g_lex = g_lex
        self._base_list = self.base.tolist()

    @classmethod
    def build(cls, exprs, lexemes: list[int]) -> "EagerTables | None":
        """The eager tables of a grammar, or None if some lexeme has no bounded DFA (the lexer
        then stays lazy). The construction is bounded by the DFA limits, not charged to the
        compile's memory bound (so a grammar compiles exactly when it did before)."""
        with membound.suspended():
            dfas = []
            total = 0
            for e in lexemes:
                d = lexeme_dfa(exprs, e)
                if d is None:
                    return None
                total += d.rows.shape[0]
                if total > MAX_GRAMMAR_DFA_STATES:
                    return None
                dfas.append(d)
        return cls(exprs, dfas)

    def g_of(self, lx: int, k: int) -> int:
        return self._base_list[lx] + k

    def local(self, g: int) -> tuple[int, int]:
        lx = int(self.g_lex[g])
        return lx, g - self._base_list[lx]


def new_states(cap_states: int, cap_mem: int, cap_acc: int) -> EagerStates:
    cnt = np.zeros(8, np.int64)
    return EagerStates(np.zeros(cap_states + 1, np.int64), np.zeros(cap_mem, np.int32),
                       np.full(2 * cap_states, -1, np.int32), np.full(2 * cap_acc, -1, np.int32),
                       np.zeros(2 * cap_states + 16, np.int32), cnt)


@njit(nogil=True, cache=True)
def _hash_ints(a, lo, hi):
    h = np.uint64(0x9E3779B97F4A7C15) ^ np.uint64(hi - lo)
    for i in range(lo, hi):
        h ^= np.uint64(a[i]) + np.uint64(0x9E3779B97F4A7C15) + (h << np.uint64(6)) + (h >> np.uint64(2))
        h *= np.uint64(0xBF58476D1CE4E5B9)
        h ^= h >> np.uint64(31)
    return h


@njit(nogil=True, cache=True)
def _intern_acc(buf, k, acc_off, acc_lex, D):
    """The id of the accepted-lexeme set ``buf[:k]`` (sorted), added if new (room reserved)."""
    cnt = D.cnt
    a_keys = D.a_keys
    mask = a_keys.shape[0] - 1
    j = np.int64(_hash_ints(buf, 0, k) & np.uint64(mask))
    while True:
        a = a_keys[j]
        if a < 0:
            break
        lo = acc_off[a]
        if acc_off[a + 1] - lo == k:
            same = True
            for i in range(k):
                if acc_lex[lo + i] != buf[i]:
                    same = False
                    break
            if same:
                return a
        j = (j + 1) & mask
    a = cnt[2]
    used = cnt[3]
    for i in range(k):
        acc_lex[used + i] = buf[i]
    acc_off[a + 1] = used + k
    cnt[3] = used + k
    cnt[2] = a + 1
    a_keys[j] = a
    return a


@njit(nogil=True, cache=True)
def intern_members(buf, k, S, state_acc, acc_off, acc_lex, D, abuf, max_states, hard_max):
    """The lexer state whose members are the global DFA states ``buf[:k]`` (sorted), added if
    new (room for one state of ``k`` members must be reserved). Returns the id, or -1 past
    ``hard_max`` states. Sets ``D.cnt[6]`` (full) once ``max_states`` are reached."""
    cnt = D.cnt
    h_keys = D.h_keys
    ms_off = D.ms_off
    ms_mem = D.ms_mem
    mask = h_keys.shape[0] - 1
    j = np.int64(_hash_ints(buf, 0, k) & np.uint64(mask))
    while True:
        s = h_keys[j]
        if s < 0:
            break
        lo = ms_off[s]
        if ms_off[s + 1] - lo == k:
            same = True
            for i in range(k):
                if ms_mem[lo + i] != buf[i]:
                    same = False
                    break
            if same:
                return s
        j = (j + 1) & mask
    s = cnt[0]
    if s + 1 >= max_states:
        cnt[6] = 1
        if s >= hard_max:
            return -1
    used = cnt[1]
    for i in range(k):
        ms_mem[used + i] = buf[i]
    ms_off[s + 1] = used + k
    cnt[1] = used + k
    na = 0
    g_null = S.g_null
    g_lex = S.g_lex
    for i in range(k):
        if g_null[buf[i]]:
            abuf[na] = g_lex[buf[i]]
            na += 1
    # the accepted set before the state is visible (another thread's kernel may read it)
    state_acc[s] = _intern_acc(abuf, na, acc_off, acc_lex, D) if na else -1
    h_keys[j] = s
    cnt[0] = s + 1
    return s


@njit(nogil=True, cache=True)
def eager_expand(budget, max_states, hard_max, S, trans, state_acc, expanded, acc_off, acc_lex, D,
                 buf, abuf, row):
    """Expand the states of ``D.queue[cnt[4]:cnt[5]]`` (the requested ones first), and breadth
    first the new states they lead to while fewer than ``budget`` expansions were made beyond the
    requested ``cnt[7]``... Returns (status, needed members): DONE; NEED_ROOM when an array
    may be too small for the next state's expansion (Python grows them and calls again: nothing
    of that state was written); TOO_MANY past ``hard_max`` states."""
    cnt = D.cnt
    queue = D.queue
    ms_off = D.ms_off
    ms_mem = D.ms_mem
    cls_of = S.cls_of
    g_next = S.g_next
    C = row.shape[0]
    while cnt[4] < cnt[5]:
        s = queue[cnt[4]]
        if expanded[s]:
            cnt[4] += 1
            continue
        lo = ms_off[s]
        m = ms_off[s + 1] - lo
        # room for C new states of at most m members each
        n = cnt[0]
        if (n + C + 1 > state_acc.shape[0] or cnt[1] + C * m > ms_mem.shape[0]
                or 2 * (n + C) > D.h_keys.shape[0] or cnt[2] + C + 1 >= acc_off.shape[0]
                or cnt[3] + C * m > acc_lex.shape[0] or 2 * (cnt[2] + C) > D.a_keys.shape[0]
                or cnt[5] + C > queue.shape[0]):
            return NEED_ROOM, m
        cnt[4] += 1
        for c in range(C):
            k = 0
            for i in range(lo, lo + m):
                t = g_next[ms_mem[i] * C + c]
                if t >= 0:
                    buf[k] = t
                    k += 1
            if k == 0:
                row[c] = -1
                continue
            n0 = cnt[0]
            t = intern_members(buf, k, S, state_acc, acc_off, acc_lex, D, abuf, max_states, hard_max)
            if t < 0:
                return TOO_MANY, m
            row[c] = t
            if cnt[0] > n0 and cnt[7] < budget and cnt[6] == 0:
                queue[cnt[5]] = t
                cnt[5] += 1
        base = s * 256
        for b in range(256):
            trans[base + b] = row[cls_of[b]]
        expanded[s] = True
        cnt[7] += 1
    return DONE, 0


@njit(nogil=True, cache=True)
def rehash(keys, off, data, n):
    """Insert the sets ``data[off[i]:off[i + 1]]``, ``i < n``, into the empty table ``keys``."""
    mask = keys.shape[0] - 1
    for s in range(n):
        j = np.int64(_hash_ints(data, off[s], off[s + 1]) & np.uint64(mask))
        while keys[j] >= 0:
            j = (j + 1) & mask
        keys[j] = s
