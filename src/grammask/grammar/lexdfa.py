"""Compiled expansion of lexer states: lazily built lexeme DFAs, subset construction in Numba (see docs/lexer.md, "Compiled expansion").

A lexer state is a set of members, one per lexeme still possible: the lexeme and its derivative
by the bytes read so far. Here a member is a *DFA state* of its lexeme, named by a small int
``g`` (one numbering for all the lexemes of a lexer generation: ``g_lex[g]`` is the lexeme,
``Lexer._g_expr[g]`` the derivative, ``g_null[g]`` whether it accepts). The lexemes' DFAs are built
lazily too, one row at a time (:meth:`~.regexset.ExprSet.transitions`, stored per ExprSet,
so shared by every grammar of a compiler, written by :func:`.rowstore.fill_stored_rows`): ``g_next[g * 256 + b]``
is the next DFA state on byte ``b`` (-1 dead), valid once ``g_done[g]``. There are far fewer lexeme DFA states than
lexer states (which are combinations of them), so the Python work is far smaller.

:func:`eager_expand` builds the lexer states: per byte class it steps every member, interns the
resulting member set in an open-addressing hash (member sets in flat arrays, :class:`ExpandStore`)
and the set of accepted lexemes likewise, and writes the state's 256-entry ``trans`` row. It asks
Python (a status) for the DFA rows it lacks and for room when an array is full, and is called
again. The lexer states and transitions are exactly those of the derivative construction
(``Lexer._expand_one``, still used when :data:`~.lexer.EAGER_LEXER` is off), numbered in another
order.
"""
from __future__ import annotations

from collections import namedtuple

import numpy as np
from numba import njit

from . import pages
from .kstruct import CHECK_FASTCALL, kstruct


class FastCall:
    """Call a Numba kernel from Python through the entry point of the signature its Python
    callers use, skipping the dispatcher's type matching (which costs several microseconds for
    kernels with many array arguments: session 20 found ``eager_expand_rows`` going through it on
    every call, 8M Python calls in a 1-in-20 MaskBench pass, once a compiled caller had added a
    second signature with a literal ``False``). The first call goes through the dispatcher
    (compiling or loading the cache) and fixes the entry to the signature of its arguments'
    types; signatures that compiled callers add (literal constants, narrower ints) do not
    matter. Every Python call of a kernel must pass the same types (each wrapper has its fixed
    call sites); with ``GRAMMASK_CHECK_FASTCALL=1`` in the environment every call checks it
    (``pytest`` under it: the whole suite passes)."""

    __slots__ = ("fn", "entry", "sig")

    #: check every call's argument types against the entry's signature (slow: for tests)
    check = CHECK_FASTCALL

    def __init__(self, fn):
        self.fn = fn
        self.entry = None
        self.sig = None

    def __call__(self, *args):
        e = self.entry
        if e is not None:
            if FastCall.check:
                self._check(args)
            return e(*args)
        r = self.fn(*args)
        sig = tuple(self.fn.typeof_pyval(a) for a in args)
        ov = self.fn.overloads.get(sig)
        if ov is not None:
            self.entry, self.sig = ov.entry_point, sig
        return r

    def _check(self, args) -> None:
        sig = tuple(self.fn.typeof_pyval(a) for a in args)
        if sig != self.sig:
            raise TypeError(f"{self.fn.py_func.__qualname__} called from Python with {sig}, "
                            f"its entry point takes {self.sig}")


#: a lexer state's ``trans`` entry before the state is expanded (as :data:`.lexer.UNKNOWN`)
UNKNOWN = -2


def _debruijn_table() -> np.ndarray:
    t = np.zeros(64, np.int64)
    for i in range(64):
        t[((1 << i) * DEBRUIJN64 & (2 ** 64 - 1)) >> 58] = i
    return t


#: a de Bruijn sequence: ``(x & -x) * DEBRUIJN64 >> 58`` is distinct for each bit of ``x``
DEBRUIJN64 = 0x03F79D71B4CB0A89
_CTZ = _debruijn_table()


@njit(nogil=True, cache=True, inline="always")
def ctz64(x):
    """The index of the lowest set bit of the uint64 ``x`` (not 0)."""
    return _CTZ[((x & (~x + np.uint64(1))) * np.uint64(DEBRUIJN64)) >> np.uint64(58)]


@njit(nogil=True, cache=True, inline="always")
def _next_bit(w0, w1, w2, w3, b):
    """The first bit after bit ``b`` set in the 256-bit mask ``w0..w3``, or 256."""
    for w in range(b >> 6, 4):
        x = w0 if w == 0 else (w1 if w == 1 else (w2 if w == 2 else w3))
        if w == b >> 6:
            x &= ~((np.uint64(2) << np.uint64(b & 63)) - np.uint64(1))
        if x:
            return 64 * w + ctz64(x)
    return 256


#: row tables (lexer ``trans``, lexeme ``g_next``) double while their capacity is at most this
#: many states, then reserve :data:`RESERVE_STATES` at once (see :func:`grown_capacity`)
RESERVE_FROM = 4096
RESERVE_STATES = 1 << 17

#: kernel statuses
DONE = 0
NEED_ROOM = 1
TOO_MANY = 2
NEED_ROWS = 3

#: the growing store of one lexer generation (see the module docstring and :func:`eager_expand`):
#: member sets ``ms_mem[ms_off[s]:ms_off[s + 1]]`` (sorted ``g``) with their hash ``h_keys``, the
#: hash ``a_keys`` of the accepted sets, the expansion queue, the states deferred for want of DFA
#: rows and the DFA states whose rows they need, and ``cnt``: states, member slots used, accepted
#: sets, accepted-lexeme slots used, queue head, queue tail, full flag, expansions done in this
#: call, DFA states in ``need``, states in ``defer``, states asked for (at the queue's head)
ExpandStore = namedtuple("ExpandStore", "ms_off ms_mem h_keys a_keys queue defer need cnt")
#: the lexemes' DFAs (see the module docstring): DFA state ``g`` is lexeme ``g_lex[g]`` at
#: expression ``g_expr[g]``, found by ``g_keys`` (open addressing over the pair); ``g_cnt[0]`` DFA
#: states; ``g_bnd[g]`` the bytes where its row changes (bit ``b`` of the 4 words: ``b`` is 0 or
#: ``g_next`` differs at ``b - 1`` and ``b``), written with the row
LexemeDFAs = namedtuple("LexemeDFAs", "g_next g_null g_lex g_done g_expr g_keys g_cnt g_bnd")


def new_dfas(cap: int, rows: int = 0) -> LexemeDFAs:
    """Lexeme DFAs with room for ``cap`` DFA states, ``g_next`` for ``max(cap, rows)`` rows."""
    # ``g_next`` is not filled: a row is read only once written whole (``g_done``), as in
    # :func:`grow_dfas`, so the capacity is address space until DFA states use it
    return kstruct(LexemeDFAs(pages.row_table(max(cap, rows) * 256, np.int32), np.zeros(cap, np.bool_),
                              np.zeros(cap, np.int32), np.zeros(cap, np.bool_), np.zeros(cap, np.int64),
                              np.full(2 * cap, -1, np.int32), np.zeros(1, np.int64), np.zeros((cap, 4), np.uint64)))


def grown(a: np.ndarray, need: int, used: int) -> np.ndarray:
    """A copy of ``a``'s first ``used`` entries (rows) in a zeroed array of ``a``'s length doubled
    until it holds ``need`` entries."""
    size = a.shape[0]
    while need > size:
        size *= 2
    b = np.zeros((size,) + a.shape[1:], a.dtype)
    b[:used] = a[:used]
    return b


def grown_capacity(cap: int, need: int) -> int:
    """The capacity (states) an array of lexer or lexeme DFA states of capacity ``cap`` grows to
    for ``need`` states: quadrupled while small (a 1-in-20 MaskBench pass regrew 760 lexers' and 841
    lexeme DFAs' arrays when they doubled, most on their way past 1,024 and 2,048 states); past
    :data:`RESERVE_FROM` at once
    :data:`RESERVE_STATES` (at least), since the 256-entry row tables (``trans``, ``g_next``) are
    allocated without being filled (rows are written as their states are made), so a large
    capacity is address space, not memory, and the copy and page faults of a doubling no
    longer land on one mask (a 32 MB table took 30-70 ms to grow)."""
    while need > cap:
        cap *= 4 if cap < RESERVE_FROM else 2
    if cap > RESERVE_FROM:
        cap = max(cap, RESERVE_STATES)
    return cap


def dfas_bytes(X: LexemeDFAs) -> int:
    """The memory ``X`` holds: ``g_next`` by its rows in use (the rest is never written)."""
    n = int(X.g_cnt[0])
    return int(min(X.g_next.nbytes, 1024 * n) + sum(a.nbytes for a in X[1:]))


def grow_dfas(X: LexemeDFAs, cap: int) -> LexemeDFAs:
    """``X`` with room for ``cap`` DFA states (the rows in use and the arrays copied, the pair
    hash rebuilt; ``g_next`` only when short). ``g_next`` rows of states without ``g_done`` are never read (:func:`.rowstore.fill_stored_rows`
    writes a whole row), so the new table is not filled."""
    C = 256
    n = int(X.g_cnt[0])
    # ``g_next`` kept while it has the rows (made longer than the other arrays: :func:`new_dfas`):
    # kernels bound DFA states by ``g_null``, and only the expansion, the lexer's lock held,
    # reads the lexeme DFAs, always its newest record (no kernel holds an older one)
    nxt = X.g_next
    if nxt.shape[0] < cap * C:
        nxt = pages.row_table(cap * C, np.int32)
        nxt[:n * C] = X.g_next[:n * C]
    old = X.g_null.shape[0]
    arrs = []
    for a in (X.g_null, X.g_lex, X.g_done, X.g_expr, X.g_bnd):
        b = np.zeros((cap,) + a.shape[1:], a.dtype)
        b[:old] = a
        arrs.append(b)
    keys = np.full(2 * cap, -1, np.int32)
    _rehash_g(keys, arrs[3], arrs[1], n)
    return X._replace(g_next=nxt, g_null=arrs[0], g_lex=arrs[1], g_done=arrs[2], g_expr=arrs[3], g_keys=keys,
                      g_bnd=arrs[4])


@njit(nogil=True, cache=True)
def _g_hash(expr, lx):
    h = np.uint64(expr) * np.uint64(0x9E3779B97F4A7C15) ^ (np.uint64(lx) + np.uint64(0x632BE59BD9B4E019))
    h ^= h >> np.uint64(29)
    h *= np.uint64(0xBF58476D1CE4E5B9)
    h ^= h >> np.uint64(32)
    return h


@njit(nogil=True, cache=True)
def _rehash_g(keys, g_expr, g_lex, n):
    mask = keys.shape[0] - 1
    for g in range(n):
        j = np.int64(_g_hash(g_expr[g], g_lex[g]) & np.uint64(mask))
        while keys[j] >= 0:
            j = (j + 1) & mask
        keys[j] = g


@njit(nogil=True, cache=True)
def g_intern(X, expr, lx, null):
    """The DFA state of lexeme ``lx`` at expression ``expr`` (added without a row if new; room
    must be reserved)."""
    keys = X.g_keys
    mask = keys.shape[0] - 1
    j = np.int64(_g_hash(expr, lx) & np.uint64(mask))
    while True:
        g = keys[j]
        if g < 0:
            break
        if X.g_expr[g] == expr and X.g_lex[g] == lx:
            return g
        j = (j + 1) & mask
    g = X.g_cnt[0]
    X.g_expr[g] = expr
    X.g_lex[g] = lx
    X.g_null[g] = null != 0
    X.g_done[g] = False
    keys[j] = g
    X.g_cnt[0] = g + 1
    return g


def new_store(cap_states: int, cap_mem: int, cap_acc: int) -> ExpandStore:
    # the queue's room for the seeds of a call besides its states (:meth:`.Lexer._reserve` asks
    # for ``2 * cap + 16 + n_new``, a chain expansion for its 256-state frontier plus 16):
    # without it the first call of every lexer regrows it
    q = 2 * cap_states + 16 + 256
    return kstruct(ExpandStore(np.zeros(cap_states + 1, np.int64), np.zeros(cap_mem, np.int32),
                               np.full(2 * cap_states, -1, np.int32), np.full(2 * cap_acc, -1, np.int32),
                               np.zeros(q, np.int32), np.zeros(q, np.int32), np.zeros(1024, np.int32),
                               np.zeros(11, np.int64)))


@njit(nogil=True, cache=True)
def _hash_ints(a, lo, hi):
    h = np.uint64(0x9E3779B97F4A7C15) ^ np.uint64(hi - lo)
    for i in range(lo, hi):
        h ^= np.uint64(a[i]) + np.uint64(0x9E3779B97F4A7C15) + (h << np.uint64(6)) + (h >> np.uint64(2))
        h *= np.uint64(0xBF58476D1CE4E5B9)
        h ^= h >> np.uint64(31)
    return h


@njit(nogil=True, cache=True)
def rehash(keys, off, data, n):
    """Insert the sets ``data[off[i]:off[i + 1]]``, ``i < n``, into the empty table ``keys``."""
    mask = keys.shape[0] - 1
    for s in range(n):
        j = np.int64(_hash_ints(data, off[s], off[s + 1]) & np.uint64(mask))
        while keys[j] >= 0:
            j = (j + 1) & mask
        keys[j] = s


@njit(nogil=True, cache=True)
def _find_set(keys, off, data, buf, k):
    """Look the set ``buf[:k]`` up in a store of sets ``data[off[i]:off[i + 1]]`` indexed by the
    open-addressing table ``keys`` (-1: empty slot). Returns (its id or -1, the slot where it is
    or where it goes)."""
    mask = keys.shape[0] - 1
    j = np.int64(_hash_ints(buf, 0, k) & np.uint64(mask))
    while True:
        s = keys[j]
        if s < 0:
            return -1, j
        lo = off[s]
        if off[s + 1] - lo == k:
            same = True
            for i in range(k):
                if data[lo + i] != buf[i]:
                    same = False
                    break
            if same:
                return s, j
        j = (j + 1) & mask


@njit(nogil=True, cache=True)
def _sort(a, k):
    """Sort ``a[:k]`` in place (insertion sort: sets are small)."""
    for i in range(1, k):
        x = a[i]
        j = i - 1
        while j >= 0 and a[j] > x:
            a[j + 1] = a[j]
            j -= 1
        a[j + 1] = x


@njit(nogil=True, cache=True)
def _intern_acc(buf, k, acc_off, acc_lex, D):
    """The id of the accepted-lexeme set ``buf[:k]`` (sorted), added if new (room reserved):
    its lexemes and end offset are written before the id is used anywhere."""
    cnt = D.cnt
    a_keys = D.a_keys
    found, j = _find_set(a_keys, acc_off, acc_lex, buf, k)
    if found >= 0:
        return found
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
def intern_members(buf, k, X, trans, state_acc, acc_off, acc_lex, D, abuf, max_states, hard_max):
    """The lexer state whose members are the DFA states ``buf[:k]`` (sorted here), added if new (room
    for one state of ``k`` members must be reserved) with its ``trans`` row all ``UNKNOWN``.
    Returns its id, or -1 past ``hard_max`` states. Sets ``D.cnt[6]`` (the generation is full) once
    ``max_states`` are reached."""
    cnt = D.cnt
    h_keys = D.h_keys
    ms_off = D.ms_off
    ms_mem = D.ms_mem
    _sort(buf, k)
    found, j = _find_set(h_keys, ms_off, ms_mem, buf, k)
    if found >= 0:
        return found
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
    g_null = X.g_null
    g_lex = X.g_lex
    for i in range(k):
        if g_null[buf[i]]:
            abuf[na] = g_lex[buf[i]]
            na += 1
    _sort(abuf, na)
    # the accepted set and the row before the state is visible (another thread's kernel may
    # read them); rows past the states are never read, so ``trans`` grows without filling them
    state_acc[s] = _intern_acc(abuf, na, acc_off, acc_lex, D) if na else -1
    base = s * 256
    for b in range(256):
        trans[base + b] = UNKNOWN
    h_keys[j] = s
    cnt[0] = s + 1
    return s


@njit(nogil=True, cache=True)
def eager_expand(budget, spec_rows, max_states, hard_max, X, trans, state_acc, expanded, acc_off,
                 acc_lex, D, buf, pbuf, ibuf, abuf):
    """Expand the lexer states ``D.queue[cnt[4]:cnt[5]]``, and breadth first the new states they
    lead to while fewer than ``budget`` expansions were made in this call (``cnt[7]``) and the
    generation is not full. A state with a member whose DFA row is not built yet is deferred
    (``D.defer``) and the member recorded (``D.need``) if it is one of the first ``cnt[10]`` of
    the queue (those asked for) or ``spec_rows`` is set, else left alone (speculation builds no
    rows: Python's derivatives are the cost); once the queue is done the deferred states are
    queued again and the kernel returns NEED_ROWS: Python builds those rows and calls again (so
    one round builds the rows of a whole frontier). Per byte, the members' moves are compared
    with the previous byte's and interned only when they differ (runs of bytes that behave the
    same: a byte-class alphabet found on the fly). Returns (status, state): DONE, NEED_ROWS;
    NEED_ROOM when an array may be too small for the next state that the expansion of ``state``
    adds (Python grows the arrays and calls again); TOO_MANY past ``hard_max`` states."""
    cnt = D.cnt
    queue = D.queue
    ms_off = D.ms_off
    ms_mem = D.ms_mem
    need = D.need
    defer = D.defer
    g_next = X.g_next
    g_done = X.g_done
    g_bnd = X.g_bnd
    h_keys = D.h_keys
    a_keys = D.a_keys
    while True:
        while cnt[4] < cnt[5]:
            s = queue[cnt[4]]
            if expanded[s]:
                cnt[4] += 1
                continue
            lo = ms_off[s]
            m = ms_off[s + 1] - lo
            ready = True
            need_before = cnt[8]
            for i in range(lo, lo + m):
                g = ms_mem[i]
                if not g_done[g]:
                    ready = False
                    if cnt[8] < need.shape[0]:
                        need[cnt[8]] = g
                        cnt[8] += 1
            if not ready:
                if spec_rows or cnt[4] < cnt[10]:
                    defer[cnt[9]] = s
                    cnt[9] += 1
                else:
                    cnt[8] = need_before
                cnt[4] += 1
                continue
            cnt[4] += 1
            base = s * 256
            # the bytes where some member's row changes: the row is constant between two of them
            c0 = c1 = c2 = c3 = np.uint64(0)
            for i in range(lo, lo + m):
                g = ms_mem[i]
                c0 |= g_bnd[g, 0]
                c1 |= g_bnd[g, 1]
                c2 |= g_bnd[g, 2]
                c3 |= g_bnd[g, 3]
            pk = -1
            prev = -1
            b = 0
            while b < 256:
                nb = _next_bit(c0, c1, c2, c3, b)
                k = 0
                for i in range(lo, lo + m):
                    t = g_next[ms_mem[i] * 256 + b]
                    if t >= 0:
                        buf[k] = t
                        k += 1
                same = k == pk
                if same:
                    for i in range(k):
                        if buf[i] != pbuf[i]:
                            same = False
                            break
                if not same:
                    for i in range(k):
                        pbuf[i] = buf[i]
                        ibuf[i] = buf[i]
                    pk = k
                    if k == 0:
                        prev = -1
                    else:
                        n0 = cnt[0]
                        # room for one more state (the row is left part written: its entries are
                        # either right or UNKNOWN, and the state is expanded again once Python
                        # made room)
                        if (n0 + 2 > state_acc.shape[0] or cnt[1] + k > ms_mem.shape[0]
                                or 2 * (n0 + 1) > h_keys.shape[0] or cnt[2] + 2 >= acc_off.shape[0]
                                or cnt[3] + k > acc_lex.shape[0] or 2 * (cnt[2] + 1) > a_keys.shape[0]
                                or cnt[5] + 1 > queue.shape[0]):
                            cnt[4] -= 1
                            return NEED_ROOM, s
                        prev = intern_members(ibuf, k, X, trans, state_acc, acc_off, acc_lex, D, abuf,
                                              max_states, hard_max)
                        if prev < 0:
                            return TOO_MANY, s
                        if cnt[0] > n0 and cnt[7] < budget and cnt[6] == 0:
                            queue[cnt[5]] = prev
                            cnt[5] += 1
                for j in range(b, nb):
                    trans[base + j] = prev
                b = nb
            expanded[s] = True
            cnt[7] += 1
        if cnt[9] == 0:
            return DONE, 0
        # the deferred states: queued again, for after their rows are built
        nd = cnt[9]
        for i in range(nd):
            queue[i] = defer[i]
        cnt[4] = 0
        cnt[5] = nd
        cnt[9] = 0
        cnt[10] = nd
        if cnt[8] > 0:
            return NEED_ROWS, 0
