"""The compiled node store of an :class:`~.regexset.ExprSet`: hash-consed byte regexes, their
construction and their Brzozowski derivatives over flat arrays, in Numba.

The ExprSet names every expression by a small int and keeps equal expressions equal by
hash-consing (see :mod:`.regexset`). This module holds the nodes themselves and does, in compiled
code, what a lexer state's first visit spent most of its time on in Python: looking nodes up,
making new ones with the simplifications that keep derivative chains short, deriving them by a
byte and cutting the 256 bytes into the classes on which a derivative is constant. The ExprSet
keeps Python mirrors of the nodes (``kind``, ``args``, flags) for the code that reasons about
expressions structurally (emptiness of intersections, slice containment, counter caps), and adds
every node this store made to them after each call (:meth:`~.regexset.ExprSet._sync`).

Arrays (one :class:`NodeArrays` record, see :mod:`.kstruct`; grown by Python when a kernel reports
:data:`NEED_ROOM`, after which the call is made again: every result is hash-consed or memoised,
so the work done before the stop is found again, not repeated)

``kind[i]``, ``a[i]``, ``b[i]``, ``c[i]``
    the node: ``CONCAT`` (a, b) the two parts (right-nested); ``OR``/``AND`` the ``b[i]``
    children ``pool[a[i]:a[i] + b[i]]``, sorted and distinct; ``NOT`` ``a`` the complemented
    node; ``REPEAT`` ``a`` the body, ``b`` the minimum and ``c`` the maximum count (-1:
    unbounded); ``BYTES`` ``a`` the row of its 256-bit byte mask in ``bm`` (4 words, byte ``k``
    is bit ``k % 64`` of word ``k // 64``).
``nul[i]``, ``hb[i]``, ``liv[i]``, ``ctr[i]``
    the node accepts the empty string; the node contains an intersection or a complement; what
    :func:`alive_search` learnt of its language (0 nothing, :data:`LIVE`, :data:`DEAD`); the node
    contains, outside complements, a counted repetition ``x{lo,hi}`` with a finite ``hi`` above
    ``max(lo, 1)`` (what :func:`.slicer.capped` may lower: without one it is the identity).
``htab``
    open addressing, node id + 1 (0: a free slot), by the hash of the node's contents.
``dkey``, ``dval``
    the derivative memo, open addressing: ``(e << 8 | byte) + 1`` and the derivative.
``nkey``, ``nkr``, ``nval``, ``nbit``
    the counts of counted intersections, open addressing: for the pair ``(x, p)`` and the
    factor ``r`` of ``x & p r{lo,hi}`` (``nkey`` holds ``(x << 32 | p) + 1``, ``nkr`` ``r``),
    ``nval`` the fewest factors of ``r`` a word of ``x & p r*`` begins, -1 where it has none
    (:data:`NEED_UNKNOWN`: not known), and ``nbit`` the counts of factors its words begin, bit
    ``k`` for ``k`` up to 61 and bit 62 for any count past 61 (-1: not known). Filled by
    :meth:`~.regexset.ExprSet._counted_need` and :meth:`~.regexset.ExprSet._counted_bits`;
    read by :func:`counted_lookup`: such an intersection is non-empty exactly when some count
    of its pair lies within ``lo..hi``, whatever ``lo`` and ``hi``.
``cnt``
    counters, see the ``C_*`` constants.
``xs``, ``tw``, ``tt``, ``fr``, ``vals``, ``arena``, ``wk``, ``wparts``
    scratch: the expressions of a union or intersection asked for from Python; the byte class
    masks and targets of :func:`transitions_of`; the frames, values and intersection checks of
    :func:`deriv`; one row of ``wk`` per other use (the ``W_*`` constants) and the classes of
    :func:`alive_search`. A call that needs more works on larger copies of its own.
``mark``, ``mark2``
    per node, the last walk that met it (:func:`_classes`; :func:`alive_search`): a walk
    stamps the nodes it meets with its own number (``cnt[C_EPOCH]``, ``cnt[C_EPOCH2]``), so
    "met already" is one read, with nothing to clear or allocate per walk.

The kernels read the arrays they use out of the record once, into locals, before their loops:
a field read inside a loop can cost two atomic reference-count updates per iteration, where
Numba cannot prove them redundant (``NRT_incref``/``NRT_decref`` were 7% of a MaskBench pass,
half of it here), and they allocate nothing on their common paths (the ``wk`` rows).
"""
from __future__ import annotations

from collections import namedtuple

import numpy as np
from numba import njit

from .lexdfa import _sort, ctz64

EMPTY, EPS, BYTES, CONCAT, OR, AND, NOT, REPEAT = range(8)
INF = -1

#: ``cnt`` slots: nodes, pool entries, byte masks, hash entries, memoised derivatives, the status
#: of the last call, the most nodes allowed, derivatives made (all time), "grow soon" flag
C_NODES, C_POOL, C_BM, C_HT, C_DM, C_STATUS, C_MAX, C_DERIVS, C_GROW, C_SYNCED, C_POOL_NEED, C_EPOCH, C_EPOCH2, \
    C_NT = range(14)
#: rows of the ``wk`` scratch: the stack of :func:`_classes`; the parts and stack of
#: :func:`concat2`; the children and stack of :func:`_flat`; the items of :func:`alt` and
#: :func:`_isect_prep`; the pair of :func:`_derived`; the derivatives met, their parents and the
#: stack of :func:`alive_search`
W_CLS, W_CAT, W_CAT_STACK, W_FLAT, W_FLAT_STACK, W_ITEMS, W_TWO, W_MET, W_PARENT, W_STACK = range(10)
#: the length of a ``wk`` row
WK = 256
#: new derivatives an emptiness walk may make per state of its bound (see :func:`alive_search`)
WALK_DERIVS_PER_STATE = 32
#: ``liv`` values
LIVE = 1
DEAD = 2
#: statuses
DONE = 0
NEED_ROOM = 1
TOO_MANY = 2

#: the initial size of the count table (``nkey``...: a power of two)
NEED_TABLE = 1 << 10
#: ``nval`` of a pair whose least count is not known (its counts ``nbit`` may be)
NEED_UNKNOWN = -2
#: ``nbit``: the bits of the counts 0..61, and the bit of "some count past 61"
BITS_LOW = (1 << 62) - 1
BITS_OVER = 1 << 62

NodeArrays = namedtuple("NodeArrays",
                        "kind a b c nul hb liv ctr mark mark2 pool bm htab dkey dval nkey nkr nval nbit cnt xs tw tt fr vals arena wk "
                        "wparts")


def new_arrays(max_nodes: int, nodes: int = 1 << 12, pool: int = 1 << 12, masks: int = 256,
               table: int = 1 << 13, memo: int = 1 << 14, scratch: int = 64) -> NodeArrays:
    cnt = np.zeros(16, np.int64)
    cnt[C_MAX] = max_nodes
    return NodeArrays(
        kind=np.zeros(nodes, np.uint8), a=np.zeros(nodes, np.int64), b=np.zeros(nodes, np.int64),
        c=np.zeros(nodes, np.int64), nul=np.zeros(nodes, np.uint8), hb=np.zeros(nodes, np.uint8),
        liv=np.zeros(nodes, np.uint8), ctr=np.zeros(nodes, np.uint8), mark=np.zeros(nodes, np.int32), mark2=np.zeros(nodes, np.int32),
        pool=np.zeros(pool, np.int64), bm=np.zeros((masks, 4), np.uint64),
        htab=np.zeros(table, np.int64), dkey=np.zeros(memo, np.int64), dval=np.zeros(memo, np.int64),
        nkey=np.zeros(NEED_TABLE, np.int64), nkr=np.zeros(NEED_TABLE, np.int64), nval=np.zeros(NEED_TABLE, np.int64),
        nbit=np.zeros(NEED_TABLE, np.int64), cnt=cnt, xs=np.zeros(scratch, np.int64), tw=np.zeros((256, 4), np.uint64),
        tt=np.zeros(256, np.int64), fr=np.zeros((256, 4), np.int64), vals=np.zeros(256, np.int64),
        arena=np.zeros(256, np.int64), wk=np.zeros((10, WK), np.int64), wparts=np.zeros((256, 4), np.uint64))


# ------------------------------------------------------------------------------ hashing
@njit(nogil=True, cache=True, inline="always")
def _fmix(x):
    x ^= x >> np.uint64(33)
    x *= np.uint64(0xFF51AFD7ED558CCD)
    x ^= x >> np.uint64(33)
    x *= np.uint64(0xC4CEB9FE1A85EC53)
    x ^= x >> np.uint64(33)
    return x


@njit(nogil=True, cache=True, inline="always")
def _h(h, x):
    """Fold the int ``x`` (any int64, negatives included) into the hash ``h``."""
    return _fmix(h ^ (np.uint64(x & 0x7FFFFFFFFFFFFFFF) + np.uint64(0x9E3779B97F4A7C15)
                      + (np.uint64(1) if x < 0 else np.uint64(0))))


@njit(nogil=True, cache=True, inline="always")
def _hw(h, w):
    return _fmix(h ^ (w + np.uint64(0x9E3779B97F4A7C15)))


# ------------------------------------------------------------------------------ raw nodes
@njit(nogil=True, cache=True)
def _room(S, pool_need, bm_need):
    """Whether one more node (with ``pool_need`` children, ``bm_need`` masks) fits; sets the
    status (and "grow soon") otherwise. Flags "grow soon" when a table is half full."""
    cnt = S.cnt
    n = cnt[C_NODES]
    if n >= cnt[C_MAX]:
        cnt[C_STATUS] = TOO_MANY
        return False
    cap = S.kind.shape[0]
    hcap = S.htab.shape[0]
    if (n + 1 > cap or cnt[C_POOL] + pool_need > S.pool.shape[0] or cnt[C_BM] + bm_need > S.bm.shape[0]
            or 4 * (cnt[C_HT] + 1) > 3 * hcap):
        cnt[C_STATUS] = NEED_ROOM
        cnt[C_GROW] = 1
        cnt[C_POOL_NEED] = pool_need
        return False
    if 4 * n > 3 * cap or 2 * cnt[C_HT] > hcap or 4 * cnt[C_POOL] > 3 * S.pool.shape[0]:
        cnt[C_GROW] = 1
    return True


@njit(nogil=True, cache=True)
def _finish(S, i, slot, kind, nul, hb, ctr):
    S.kind[i] = kind
    S.nul[i] = nul
    S.hb[i] = hb
    S.ctr[i] = ctr
    S.htab[slot] = i + 1
    S.cnt[C_NODES] = i + 1
    S.cnt[C_HT] += 1
    return i


@njit(nogil=True, cache=True, inline="always")
def _lookup3(S, kind, a, b, c):
    """``(node, slot)``: the node ``(kind, a, b, c)`` (of :func:`mk3`) and its slot in ``htab``,
    or ``(-1, the free slot where it would go)``."""
    h = _h(_h(_h(_h(np.uint64(kind), kind), a), b), c)
    ht = S.htab
    sk = S.kind
    sa = S.a
    sb = S.b
    sc = S.c
    mask = ht.shape[0] - 1
    slot = np.int64(h & np.uint64(mask))
    while ht[slot] != 0:
        i = ht[slot] - 1
        if sk[i] == kind and sa[i] == a and sb[i] == b and sc[i] == c:
            return i, slot
        slot = (slot + 1) & mask
    return -1, slot


@njit(nogil=True, cache=True, inline="always")
def n_parts(S, x):
    """How many parts node ``x`` has that a walk over the structure enters: a repetition's body,
    a concatenation's two, a union's or intersection's list; none for the others (a complement's
    operand is left to each walk)."""
    k = S.kind[x]
    if k == REPEAT:
        return 1
    if k == CONCAT:
        return 2
    if k == OR or k == AND:
        return S.b[x]
    return 0


@njit(nogil=True, cache=True, inline="always")
def part(S, x, j):
    """Part ``j`` of node ``x`` (see :func:`n_parts`)."""
    k = S.kind[x]
    if k == OR or k == AND:
        return S.pool[S.a[x] + j]
    return S.a[x] if j == 0 else S.b[x]


@njit(nogil=True, cache=True)
def mk3(S, kind, a, b, c):
    """The node ``(kind, a, b, c)`` of a kind without children in the pool (EMPTY, EPS, CONCAT,
    NOT, REPEAT), made if new, without simplification; -1 when the store is out of room."""
    i, slot = _lookup3(S, kind, a, b, c)
    if i >= 0:
        return i
    if not _room(S, 0, 0):
        return -1
    i = S.cnt[C_NODES]
    S.a[i] = a
    S.b[i] = b
    S.c[i] = c
    ctr = 0
    if kind == CONCAT:
        nul = S.nul[a] & S.nul[b]
        hb = S.hb[a] | S.hb[b]
        ctr = S.ctr[a] | S.ctr[b]
    elif kind == EPS:
        nul, hb = 1, 0
    elif kind == NOT:
        nul = 1 - S.nul[a]
        hb = 1
    elif kind == REPEAT:
        nul = 1 if (b == 0 or S.nul[a]) else 0
        hb = S.hb[a]
        ctr = 1 if (c != INF and c > max(b, 1)) else S.ctr[a]
    else:
        nul, hb = 0, 0
    return _finish(S, i, slot, kind, nul, hb, ctr)


@njit(nogil=True, cache=True)
def mk_bytes(S, w0, w1, w2, w3):
    """The byte set of the mask ``w0..w3`` (EMPTY for no byte); -1 when out of room."""
    if w0 == 0 and w1 == 0 and w2 == 0 and w3 == 0:
        return EMPTY
    h = _hw(_hw(_hw(_hw(np.uint64(BYTES), w0), w1), w2), w3)
    ht = S.htab
    bm = S.bm
    sk = S.kind
    sa = S.a
    mask = ht.shape[0] - 1
    slot = np.int64(h & np.uint64(mask))
    while ht[slot] != 0:
        i = ht[slot] - 1
        if sk[i] == BYTES:
            r = sa[i]
            if bm[r, 0] == w0 and bm[r, 1] == w1 and bm[r, 2] == w2 and bm[r, 3] == w3:
                return i
        slot = (slot + 1) & mask
    if not _room(S, 0, 1):
        return -1
    i = S.cnt[C_NODES]
    r = S.cnt[C_BM]
    bm[r, 0] = w0
    bm[r, 1] = w1
    bm[r, 2] = w2
    bm[r, 3] = w3
    S.cnt[C_BM] = r + 1
    S.a[i] = r
    S.b[i] = 0
    S.c[i] = 0
    return _finish(S, i, slot, BYTES, 0, 0, 0)


@njit(nogil=True, cache=True)
def _mk_list(S, kind, ch, n):
    """The OR/AND node of the sorted distinct children ``ch[:n]`` (n >= 2), made if new."""
    h = _h(np.uint64(kind), n)
    for j in range(n):
        h = _h(h, ch[j])
    ht = S.htab
    pool = S.pool
    sk = S.kind
    sa = S.a
    sb = S.b
    mask = ht.shape[0] - 1
    slot = np.int64(h & np.uint64(mask))
    while ht[slot] != 0:
        i = ht[slot] - 1
        if sk[i] == kind and sb[i] == n:
            o = sa[i]
            same = True
            for j in range(n):
                if pool[o + j] != ch[j]:
                    same = False
                    break
            if same:
                return i
        slot = (slot + 1) & mask
    if not _room(S, n, 0):
        return -1
    i = S.cnt[C_NODES]
    o = S.cnt[C_POOL]
    nul = 0 if kind == OR else 1
    hb = 1 if kind == AND else 0
    ctr = 0
    sctr = S.ctr
    for j in range(n):
        x = ch[j]
        pool[o + j] = x
        ctr |= sctr[x]
        if kind == OR:
            nul |= S.nul[x]
            hb |= S.hb[x]
        else:
            nul &= S.nul[x]
    S.cnt[C_POOL] = o + n
    S.a[i] = o
    S.b[i] = n
    S.c[i] = 0
    return _finish(S, i, slot, kind, nul, hb, ctr)


# ------------------------------------------------------------------------------ constructors
@njit(nogil=True, cache=True)
def concat2(S, a, b):
    """``a b``, kept right-nested (a concatenation ``a`` is re-nested onto ``b``: its parts,
    in order, are put in front of ``b`` from the inside out)."""
    if a == EMPTY or b == EMPTY:
        return EMPTY
    if a == EPS:
        return b
    if b == EPS:
        return a
    kind = S.kind
    if kind[a] != CONCAT:
        return mk3(S, CONCAT, a, b, 0)
    # the parts of ``a`` that are not concatenations, in order (no recursion: the kernels are
    # cached, and Numba's cache does not keep recursive functions)
    sa = S.a
    sb = S.b
    parts = S.wk[W_CAT]
    k = 0
    stack = S.wk[W_CAT_STACK]
    stack[0] = a
    sp = 1
    while sp > 0:
        sp -= 1
        x = stack[sp]
        if kind[x] == CONCAT:
            if sp + 2 > stack.shape[0]:
                stack = _grow1(stack)
            stack[sp] = sb[x]
            stack[sp + 1] = sa[x]
            sp += 2
        else:
            if k == parts.shape[0]:
                parts = _grow1(parts)
            parts[k] = x
            k += 1
    r = b
    for j in range(k - 1, -1, -1):
        x = parts[j]
        if x == EMPTY:
            return EMPTY
        if x == EPS:
            continue
        r = mk3(S, CONCAT, x, r, 0)
        if r < 0:
            return -1
    return r


@njit(nogil=True, cache=True)
def complement(S, a):
    if S.kind[a] == NOT:
        return S.a[a]
    return mk3(S, NOT, a, 0, 0)


@njit(nogil=True, cache=True)
def repeat(S, a, lo, hi):
    """``a{lo,hi}`` (``hi`` -1: unbounded); counts are checked by the caller."""
    if hi != INF and hi < lo:
        return EMPTY
    if hi == 0:
        return EPS
    if a == EMPTY:
        return EPS if lo == 0 else EMPTY
    if a == EPS:
        return EPS
    if lo == 1 and hi == 1:
        return a
    return mk3(S, REPEAT, a, lo, hi)


@njit(nogil=True, cache=True)
def _flat(S, xs, n, kind):
    """The children of ``xs[:n]`` with nested ``kind`` nodes (OR/AND) opened, in an array
    (unsorted, with repeats; a ``wk`` row when it fits) and their count."""
    sk = S.kind
    sa = S.a
    sb = S.b
    pool = S.pool
    m = 0
    for j in range(n):
        x = xs[j]
        m += sb[x] if sk[x] == kind else 1
    out = S.wk[W_FLAT]
    stack = S.wk[W_FLAT_STACK]
    if m > WK:
        out = np.empty(m, np.int64)
        stack = np.empty(m, np.int64)
    k = 0
    for j in range(n):
        x = xs[j]
        if sk[x] != kind:
            if k == out.shape[0]:
                out = _grow1(out)
            out[k] = x
            k += 1
            continue
        sp = 0
        stack[sp] = x
        sp += 1
        while sp > 0:
            sp -= 1
            y = stack[sp]
            if sk[y] == kind:
                o = sa[y]
                for t in range(sb[y]):
                    if sp == stack.shape[0]:
                        stack = _grow1(stack)
                    stack[sp] = pool[o + t]
                    sp += 1
            else:
                if k == out.shape[0]:
                    out = _grow1(out)
                out[k] = y
                k += 1
    return out, k


@njit(nogil=True, cache=True)
def _grow1(x):
    y = np.empty(2 * x.shape[0] + 4, x.dtype)
    y[:x.shape[0]] = x
    return y


@njit(nogil=True, cache=True)
def _grow_rows(x):
    y = np.empty((2 * x.shape[0], x.shape[1]), x.dtype)
    y[:x.shape[0]] = x
    return y


@njit(nogil=True, cache=True)
def _sorted_distinct(items, k):
    """``items[:k]`` sorted, repeats dropped: the array (``items`` itself, sorted in place, when
    short: an insertion sort, where ``np.sort`` costs ~0.25 µs even for five) and its length."""
    if k > 32:
        s = np.sort(items[:k])
    else:
        s = items
        _sort(s, k)
    m = 0
    for j in range(k):
        if j == 0 or s[j] != s[j - 1]:
            s[m] = s[j]
            m += 1
    return s, m


@njit(nogil=True, cache=True)
def alt(S, xs, n):
    """The union of ``xs[:n]``: nested unions opened, byte sets merged, EMPTY dropped, EPS
    dropped beside a nullable part, sorted and distinct."""
    sk = S.kind
    if n == 1 and sk[xs[0]] != OR:
        return xs[0]
    sa = S.a
    bm = S.bm
    flat, k = _flat(S, xs, n, OR)
    items = S.wk[W_ITEMS] if k + 1 <= WK else np.empty(k + 1, np.int64)
    m = 0
    w0 = w1 = w2 = w3 = np.uint64(0)
    for j in range(k):
        x = flat[j]
        kx = sk[x]
        if kx == EMPTY:
            continue
        if kx == BYTES:
            r = sa[x]
            w0 |= bm[r, 0]
            w1 |= bm[r, 1]
            w2 |= bm[r, 2]
            w3 |= bm[r, 3]
        else:
            items[m] = x
            m += 1
    if w0 | w1 | w2 | w3:
        bx = mk_bytes(S, w0, w1, w2, w3)
        if bx < 0:
            return -1
        items[m] = bx
        m += 1
    if m == 0:
        return EMPTY
    s, m = _sorted_distinct(items, m)
    if m > 1 and s[0] == EPS:   # EPS is id 1: first unless EMPTY (dropped)
        nul = S.nul
        for j in range(1, m):
            if nul[s[j]]:
                s = s[1:]
                m -= 1
                break
    if m == 1:
        return s[0]
    return _mk_list(S, OR, s, m)


@njit(nogil=True, cache=True)
def _isect_prep(S, xs, n):
    """The first half of an intersection of ``xs[:n]``: ``(result, items, m, w0, w1, w2, w3)``,
    ``result`` >= 0 when it is decided already (or -1 out of room), else -2 with the parts
    ``items[:m]`` left (a ``wk`` row: the caller copies what it keeps before it derives) and the
    byte mask ``w0..w3`` of the byte-set parts."""
    sk = S.kind
    sa = S.a
    bm = S.bm
    flat, k = _flat(S, xs, n, AND)
    items = S.wk[W_ITEMS] if k + 1 <= WK else np.empty(k + 1, np.int64)
    w0 = w1 = w2 = w3 = ~np.uint64(0)
    has_mask = False
    m = 0
    for j in range(k):
        x = flat[j]
        kx = sk[x]
        if kx == EMPTY:
            return EMPTY, items, 0, w0, w1, w2, w3
        if kx == NOT and sa[x] == EMPTY:
            continue   # universal
        if kx == BYTES:
            r = sa[x]
            w0 &= bm[r, 0]
            w1 &= bm[r, 1]
            w2 &= bm[r, 2]
            w3 &= bm[r, 3]
            has_mask = True
        else:
            items[m] = x
            m += 1
    if has_mask:
        if not (w0 | w1 | w2 | w3):
            return EMPTY, items, 0, w0, w1, w2, w3
        return -2, items, m, w0, w1, w2, w3
    if m == 0:
        return complement(S, EMPTY), items, 0, w0, w1, w2, w3
    s, m = _sorted_distinct(items, m)
    if s[0] == EPS or (m > 1 and s[1] == EPS):
        nul = S.nul
        for j in range(m):
            if not nul[s[j]]:
                return EMPTY, s, 0, w0, w1, w2, w3
        return EPS, s, 0, w0, w1, w2, w3
    if m == 1:
        return s[0], s, 1, w0, w1, w2, w3
    return _mk_list(S, AND, s, m), s, m, w0, w1, w2, w3


@njit(nogil=True, cache=True)
def _memo_find(dk, dv, key):
    """The memoised derivative of ``key`` in the memo ``dk``/``dv`` (the record's
    ``dkey``/``dval``), or -1."""
    dmask = dk.shape[0] - 1
    slot = np.int64(_h(np.uint64(0), key) & np.uint64(dmask))
    while dk[slot] != 0:
        if dk[slot] == key + 1:
            return dv[slot]
        slot = (slot + 1) & dmask
    return -1



@njit(nogil=True, cache=True)
def _memo_put(S, key, r):
    """Memoise ``key -> r``; False (status :data:`NEED_ROOM`) when the memo is three quarters
    full: a walk over many derivatives (:func:`alive_search`) would otherwise derive the same
    expressions again and again."""
    dk = S.dkey
    if 4 * (S.cnt[C_DM] + 1) > 3 * dk.shape[0]:
        S.cnt[C_STATUS] = NEED_ROOM
        S.cnt[C_GROW] = 1
        return False
    S.cnt[C_DERIVS] += 1
    dmask = dk.shape[0] - 1
    slot = np.int64(_h(np.uint64(0), key) & np.uint64(dmask))
    while dk[slot] != 0:
        if dk[slot] == key + 1:
            return True
        slot = (slot + 1) & dmask
    dk[slot] = key + 1
    S.dval[slot] = r
    S.cnt[C_DM] += 1
    if 2 * S.cnt[C_DM] > dk.shape[0]:
        S.cnt[C_GROW] = 1
    return True


@njit(nogil=True, cache=True)
def _derived(S, e, byte, vals, nv):
    """The derivative of ``e`` (not an intersection) by ``byte`` from the derivatives of its
    parts ``vals[:nv]``, in the order :func:`deriv` asks for them."""
    k = S.kind[e]
    if k == CONCAT:
        r = concat2(S, vals[0], S.b[e])
        if r < 0 or nv == 1:
            return r
        dy = vals[1]
        if r == EMPTY:
            return dy
        if dy == EMPTY:
            return r
        two = S.wk[W_TWO]
        two[0] = r
        two[1] = dy
        return alt(S, two, 2)
    if k == OR:
        return alt(S, vals, nv)
    if k == NOT:
        return complement(S, vals[0])
    # REPEAT
    x = S.a[e]
    lo = S.b[e]
    hi = S.c[e]
    rest = repeat(S, x, max(lo - 1, 0), INF if hi == INF else hi - 1)
    if rest < 0:
        return -1
    return concat2(S, vals[0], rest)


@njit(nogil=True, cache=True)
def deriv(S, e, byte):
    """Brzozowski derivative of ``e`` by ``byte`` (memoised); -1 when the store is out of room.

    Without recursion (Numba's cache does not keep recursive functions): a stack of frames,
    each an expression, a byte and a phase, with the derivatives of finished frames on a stack
    of values. Phase 0 asks for the parts' derivatives; phase 1 combines them; an intersection
    whose parts' derivatives include byte sets goes on to phase 2, which checks the bytes left
    one (byte, part) pair at a time (stopping at the first part that rejects the byte, as the
    memoised derivatives it needs are asked for one by one)."""
    dk = S.dkey
    dv = S.dval
    r = _memo_find(dk, dv, e << 8 | byte)
    if r >= 0:
        return r
    fr = S.fr         # frames: expression, byte, phase, arena offset (or first value)
    vals = S.vals     # finished derivatives
    arena = S.arena   # phase 2: [m, next byte, next part, keep0..3, w0..3, items...]
    sa = S.a
    sb = S.b
    pool = S.pool
    nul = S.nul
    bm = S.bm
    fr[0, 0] = e
    fr[0, 1] = byte
    fr[0, 2] = 0
    fr[0, 3] = 0
    nf = 1
    nv = 0
    na = 0
    kind = S.kind
    while nf > 0:
        f = nf - 1
        x = fr[f, 0]
        b = fr[f, 1]
        ph = fr[f, 2]
        if ph == 0:
            r = _memo_find(dk, dv, x << 8 | b)
            if r < 0:
                k = kind[x]
                if k == EMPTY or k == EPS:
                    r = EMPTY
                elif k == BYTES:
                    r = EPS if (bm[sa[x], b >> 6] >> np.uint64(b & 63)) & np.uint64(1) else EMPTY
                if r >= 0 and not _memo_put(S, x << 8 | b, r):
                    return -1
            if r >= 0:
                nf -= 1
                if nv == vals.shape[0]:
                    vals = _grow1(vals)
                vals[nv] = r
                nv += 1
                continue
            # ask for the parts' derivatives: pushed last first, so that they finish in order
            k = kind[x]
            fr[f, 2] = 1
            fr[f, 3] = nv
            if k == CONCAT:
                y = sa[x]
                nk = 2 if nul[y] else 1
            elif k == OR or k == AND:
                nk = sb[x]
            else:
                nk = 1
            while nf + nk > fr.shape[0]:
                fr = _grow_rows(fr)
            for j in range(nk - 1, -1, -1):
                if k == CONCAT:
                    c = sa[x] if j == 0 else sb[x]
                elif k == OR or k == AND:
                    c = pool[sa[x] + j]
                else:
                    c = sa[x]
                fr[nf, 0] = c
                fr[nf, 1] = b
                fr[nf, 2] = 0
                fr[nf, 3] = 0
                nf += 1
            continue
        if ph == 1:
            v0 = fr[f, 3]
            nk = nv - v0
            if kind[x] == AND:
                r, items, m, w0, w1, w2, w3 = _isect_prep(S, vals[v0:nv], nk)
                nv = v0
                if r == -2:
                    # phase 2: the bytes of ``w`` that every part of ``items`` accepts alone
                    need = 11 + m
                    while na + need > arena.shape[0]:
                        arena = _grow1(arena)
                    o = na
                    arena[o] = m
                    arena[o + 1] = 0
                    arena[o + 2] = 0
                    for t in range(4):
                        arena[o + 3 + t] = 0
                    arena[o + 7] = np.int64(w0)
                    arena[o + 8] = np.int64(w1)
                    arena[o + 9] = np.int64(w2)
                    arena[o + 10] = np.int64(w3)
                    for j in range(m):
                        arena[o + 11 + j] = items[j]
                    na += need
                    fr[f, 3] = o
                    fr[f, 2] = 2
                    continue
            else:
                r = _derived(S, x, b, vals[v0:nv], nk)
                nv = v0
            if r < 0 or not _memo_put(S, x << 8 | b, r):
                return -1
            nf -= 1
            if nv == vals.shape[0]:
                vals = _grow1(vals)
            vals[nv] = r
            nv += 1
            continue
        # phase 2 (and 3: a part's derivative by the byte under test has finished)
        o = fr[f, 3]
        m = arena[o]
        if ph == 3:
            nv -= 1
            d = vals[nv]
            fr[f, 2] = 2
            if nul[d]:
                arena[o + 2] += 1
            else:
                arena[o + 1] += 1
                arena[o + 2] = 0
        pushed = False
        while arena[o + 1] < 256:
            c = arena[o + 1]
            if not (np.uint64(arena[o + 7 + (c >> 6)]) >> np.uint64(c & 63)) & np.uint64(1):
                arena[o + 1] += 1
                continue
            j = arena[o + 2]
            if j == m:   # every part accepts the byte
                arena[o + 3 + (c >> 6)] = np.int64(np.uint64(arena[o + 3 + (c >> 6)])
                                                   | (np.uint64(1) << np.uint64(c & 63)))
                arena[o + 1] += 1
                arena[o + 2] = 0
                continue
            d = _memo_find(dk, dv, arena[o + 11 + j] << 8 | c)
            if d < 0:
                if nf == fr.shape[0]:
                    fr = _grow_rows(fr)
                fr[f, 2] = 3
                fr[nf, 0] = arena[o + 11 + j]
                fr[nf, 1] = c
                fr[nf, 2] = 0
                fr[nf, 3] = 0
                nf += 1
                pushed = True
                break
            if nul[d]:
                arena[o + 2] += 1
            else:
                arena[o + 1] += 1
                arena[o + 2] = 0
        if pushed:
            continue
        r = mk_bytes(S, np.uint64(arena[o + 3]), np.uint64(arena[o + 4]), np.uint64(arena[o + 5]),
                     np.uint64(arena[o + 6]))
        na = o
        if r < 0 or not _memo_put(S, x << 8 | b, r):
            return -1
        nf -= 1
        if nv == vals.shape[0]:
            vals = _grow1(vals)
        vals[nv] = r
        nv += 1
    return vals[0]


@njit(nogil=True, cache=True)
def _keep_bytes(S, items, m, w):
    """The end of an intersection with byte-set parts ``w``: the bytes every other part of
    ``items[:m]`` accepts as a one-byte string."""
    nul = S.nul
    keep = np.zeros(4, np.uint64)   # (Python's intersections only: not a hot path)
    for b in range(256):
        if not (w[b >> 6] >> np.uint64(b & 63)) & np.uint64(1):
            continue
        ok = True
        for j in range(m):
            d = deriv(S, items[j], b)
            if d < 0:
                return -1
            if not nul[d]:
                ok = False
                break
        if ok:
            keep[b >> 6] |= np.uint64(1) << np.uint64(b & 63)
    return mk_bytes(S, keep[0], keep[1], keep[2], keep[3])


@njit(nogil=True, cache=True)
def intersect(S, xs, n):
    r, items, m, w0, w1, w2, w3 = _isect_prep(S, xs, n)
    if r == -2:
        # the items out of their scratch row: the derivatives below use it
        w = np.empty(4, np.uint64)
        w[0] = w0
        w[1] = w1
        w[2] = w2
        w[3] = w3
        r = _keep_bytes(S, items[:m].copy(), m, w)
    return r


@njit(nogil=True, cache=True)
def literal(S, data):
    """The concatenation of the bytes of ``data`` (uint8)."""
    e = EPS
    z = np.uint64(0)
    for j in range(data.shape[0] - 1, -1, -1):
        b = data[j]
        bit = np.uint64(1) << np.uint64(b & 63)
        q = b >> 6
        x = mk_bytes(S, bit if q == 0 else z, bit if q == 1 else z, bit if q == 2 else z, bit if q == 3 else z)
        if x < 0:
            return -1
        e = x if e == EPS else mk3(S, CONCAT, x, e, 0)
        if e < 0:
            return -1
    return e


# ------------------------------------------------------------------------------ byte classes
@njit(nogil=True, cache=True)
def _epoch(cnt, slot, mark):
    """A new walk number for the marks ``mark`` (``cnt[slot]`` the last one; the marks are
    cleared when the numbers run out)."""
    ep = cnt[slot] + 1
    if ep >= 0x7FFFFFFF:
        mark[:] = 0
        ep = 1
    cnt[slot] = ep
    return np.int32(ep)


@njit(nogil=True, cache=True)
def _refine(parts, np_, w0, w1, w2, w3):
    """Split each class of ``parts[:np_]`` by the mask ``w``; the new count."""
    k = np_
    for j in range(np_):
        a0 = parts[j, 0] & w0
        a1 = parts[j, 1] & w1
        a2 = parts[j, 2] & w2
        a3 = parts[j, 3] & w3
        if not (a0 | a1 | a2 | a3):
            continue
        b0 = parts[j, 0] & ~w0
        b1 = parts[j, 1] & ~w1
        b2 = parts[j, 2] & ~w2
        b3 = parts[j, 3] & ~w3
        if not (b0 | b1 | b2 | b3):
            continue
        parts[j, 0] = a0
        parts[j, 1] = a1
        parts[j, 2] = a2
        parts[j, 3] = a3
        parts[k, 0] = b0
        parts[k, 1] = b1
        parts[k, 2] = b2
        parts[k, 3] = b3
        k += 1
    return k


@njit(nogil=True, cache=True)
def _classes(S, e, parts, np_):
    """Refine ``parts[:np_]`` by every byte mask that can be read first in ``e``. Each node is
    visited once (expressions are DAGs: the parts of an intersection share their subterms)."""
    kind = S.kind
    sa = S.a
    sb = S.b
    nul = S.nul
    pool = S.pool
    bm = S.bm
    mark = S.mark
    ep = _epoch(S.cnt, C_EPOCH, mark)
    stack = S.wk[W_CLS]
    stack[0] = e
    sp = 1
    while sp > 0:
        sp -= 1
        x = stack[sp]
        k = kind[x]
        if k == BYTES:
            r = sa[x]
            np_ = _refine(parts, np_, bm[r, 0], bm[r, 1], bm[r, 2], bm[r, 3])
            continue
        if k == CONCAT:
            nk = 2 if nul[sa[x]] else 1
        elif k == OR or k == AND:
            nk = sb[x]
        elif k == NOT or k == REPEAT:
            nk = 1
        else:
            continue
        if mark[x] == ep:
            continue
        mark[x] = ep
        while sp + nk > stack.shape[0]:
            stack = _grow1(stack)
        for j in range(nk):
            if k == CONCAT:
                stack[sp] = sa[x] if j == 0 else sb[x]
            elif k == OR or k == AND:
                stack[sp] = pool[sa[x] + j]
            else:
                stack[sp] = sa[x]
            sp += 1
    return np_


@njit(nogil=True, cache=True)
def _lowbit(w0, w1, w2, w3):
    """The lowest byte of the mask ``w0..w3``, or -1."""
    if w0:
        return ctz64(w0)
    if w1:
        return 64 + ctz64(w1)
    if w2:
        return 128 + ctz64(w2)
    if w3:
        return 192 + ctz64(w3)
    return -1


@njit(nogil=True, cache=True)
def transitions_of(S, e):
    """The byte classes of ``e`` (a partition of the bytes on which its derivative is
    constant) with their derivatives, EMPTY ones left out: ``S.tw[:n]`` the masks, ``S.tt[:n]``
    the targets; returns ``n`` (-1: out of room). Emptiness of targets with intersections or
    complements is the caller's to decide."""
    parts = S.tw
    tt = S.tt
    parts[0, :] = ~np.uint64(0)
    np_ = _classes(S, e, parts, 1)
    n = 0
    for j in range(np_):
        b = _lowbit(parts[j, 0], parts[j, 1], parts[j, 2], parts[j, 3])
        t = deriv(S, e, b)
        if t < 0:
            return -1
        if t == EMPTY:
            continue
        if n != j:
            for w in range(4):
                parts[n, w] = parts[j, w]
        tt[n] = t
        n += 1
    return n


@njit(nogil=True, cache=True)
def dense_dfa_of(S, e, table, ids, keys):
    """The DFA of ``e`` (no intersection or complement in it: every derivative that is not EMPTY
    is alive) from its derivatives, breadth first in :func:`transitions_of`'s class order (the
    numbering of :meth:`.ExprSet.dense_dfa`): ``table[s, b]`` the state after byte ``b`` (-1:
    dead), ``ids[s]`` its expression, state 0 ``e``; ``keys`` is scratch (a power of two of at
    least twice ``table``'s rows). Returns the number of states, ``table``'s rows + 1 when it has
    more, -1 when the store is out of room."""
    cap = table.shape[0]
    mask = keys.shape[0] - 1
    keys[:] = -1
    ids[0] = e
    keys[_dfa_slot(keys, ids, e, mask)] = 0
    n = 1
    i = 0
    while i < n:
        x = ids[i]
        row = table[i]
        row[:] = -1
        m = transitions_of(S, x)
        if m < 0:
            return -1
        for j in range(m):
            t = S.tt[j]
            slot = _dfa_slot(keys, ids, t, mask)
            k = keys[slot]
            if k < 0:
                if n >= cap:
                    return cap + 1
                k = n
                ids[n] = t
                keys[slot] = n
                n += 1
            for w in range(4):
                bits = S.tw[j, w]
                while bits:
                    b = ctz64(bits)
                    row[64 * w + b] = k
                    bits &= bits - np.uint64(1)
        i += 1
    return n


@njit(nogil=True, cache=True, inline="always")
def _dfa_slot(keys, ids, t, mask):
    """The slot of expression ``t`` in :func:`dense_dfa_of`'s table: where it is, or the empty
    slot where it goes."""
    j = np.int64((np.uint64(t) * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(40)) & mask
    while True:
        k = keys[j]
        if k < 0 or ids[k] == t:
            return j
        j = (j + 1) & mask


@njit(nogil=True, cache=True)
def py_dense_dfa(S, e, table, ids, keys):
    return _ret(S, dense_dfa_of(S, e, table, ids, keys))


@njit(nogil=True, cache=True)
def counted_moves(S, x, s, r, new, out):
    """The pairs after one byte from the pair ``(x, s)`` of a counted intersection
    ``x & s r{..}`` (see :meth:`.ExprSet._counted_moves`): ``x2 << 32 | s2`` into ``out`` for
    every byte class of ``x`` and of ``s`` (or, ``new`` and ``s`` nullable, of the factor ``r``
    begun: then ``s2`` is ``r``'s derivative) where ``x2`` is neither empty nor known dead and
    ``s2`` is not empty; returns their number (-1: out of room)."""
    s0 = r if new else s
    parts = S.tw
    liv = S.liv
    parts[0, :] = ~np.uint64(0)
    np_ = _classes(S, x, parts, 1)
    np_ = _classes(S, s0, parts, np_)
    n = 0
    for j in range(np_):
        b = _lowbit(parts[j, 0], parts[j, 1], parts[j, 2], parts[j, 3])
        x2 = deriv(S, x, b)
        if x2 < 0:
            return -1
        if x2 == EMPTY or liv[x2] == DEAD:
            continue
        s2 = deriv(S, s0, b)
        if s2 < 0:
            return -1
        if s2 == EMPTY:
            continue
        out[n] = x2 << 32 | s2
        n += 1
    return n


#: :func:`min_length_of` of an expression without words
MINLEN_INF = 1 << 62


@njit(nogil=True, cache=True, inline="always")
def _n_children(k, sb, x):
    """How many operands node ``x`` (kind ``k``: a concatenation, union, intersection or
    repetition) has."""
    if k == CONCAT:
        return 2
    if k == OR or k == AND:
        return sb[x]
    return 1


@njit(nogil=True, cache=True, inline="always")
def _child(k, sa, sb, pool, x, j):
    """Operand ``j`` of node ``x`` (kind ``k``, as :func:`_n_children`)."""
    if k == CONCAT:
        return sa[x] if j == 0 else sb[x]
    if k == OR or k == AND:
        return pool[sa[x] + j]
    return sa[x]


@njit(nogil=True, cache=True, inline="always")
def _push_unknown(stack, sp, memo, k, sa, sb, pool, x):
    """Push the operands of ``x`` not in ``memo`` yet (-1), for a post order over the DAG:
    ``(stack, sp, pushed)`` (the stack grown when full)."""
    pushed = False
    for j in range(_n_children(k, sb, x)):
        y = _child(k, sa, sb, pool, x, j)
        if memo[y] < 0:
            if sp == stack.shape[0]:
                stack = _grow1(stack)
            stack[sp] = y
            sp += 1
            pushed = True
    return stack, sp, pushed


@njit(nogil=True, cache=True)
def min_length_of(S, e, memo):
    """The length of the shortest word of ``e`` (:data:`MINLEN_INF`: none), memoised per node in
    ``memo`` (-1: not known; at least as long as the store's nodes); -2 when the expression holds
    an intersection or complement where the length depends on it. Post order over the DAG (a
    repetition with no minimum is 0 without its body)."""
    kind = S.kind
    sa = S.a
    sb = S.b
    pool = S.pool
    stack = np.empty(64, np.int64)
    stack[0] = e
    sp = 1
    while sp > 0:
        x = stack[sp - 1]
        if memo[x] >= 0:
            sp -= 1
            continue
        k = kind[x]
        if k == EMPTY:
            memo[x] = MINLEN_INF
        elif k == EPS:
            memo[x] = 0
        elif k == BYTES:
            memo[x] = 1
        elif k == AND or k == NOT:
            return -2
        elif k == REPEAT and sb[x] == 0:
            memo[x] = 0
        else:
            # children first
            stack, sp, pushed = _push_unknown(stack, sp, memo, k, sa, sb, pool, x)
            if pushed:
                continue
            if k == CONCAT:
                r = memo[sa[x]] + memo[sb[x]]
                if r > MINLEN_INF:
                    r = MINLEN_INF
            elif k == OR:
                r = MINLEN_INF
                for j in range(sb[x]):
                    m = memo[pool[sa[x] + j]]
                    if m < r:
                        r = m
            else:
                m = memo[sa[x]]
                lo = sb[x]
                if m >= MINLEN_INF:
                    r = MINLEN_INF
                elif m > 0 and lo > MINLEN_INF // m:
                    r = MINLEN_INF
                else:
                    r = lo * m
            memo[x] = r
        sp -= 1
    return memo[e]


@njit(nogil=True, cache=True)
def may_be_infinite_of(S, e, memo):
    """0 when the language of ``e`` is certainly finite (no unbounded repetition, and no
    complement that could make it infinite), else 1; memoised per node in ``memo`` (int8, -1: not
    known; at least as long as the store's nodes). Post order over the DAG, the rules of
    :meth:`.regexset.ExprSet.may_be_infinite`: a complement may be infinite, an intersection is
    when all its operands may be, a union or concatenation when one may be."""
    kind = S.kind
    sa = S.a
    sb = S.b
    sc = S.c
    pool = S.pool
    stack = np.empty(64, np.int64)
    stack[0] = e
    sp = 1
    while sp > 0:
        x = stack[sp - 1]
        if memo[x] >= 0:
            sp -= 1
            continue
        k = kind[x]
        if k == NOT:
            memo[x] = 1
        elif k == REPEAT and sc[x] == INF:
            memo[x] = 1
        elif k == CONCAT or k == OR or k == AND or k == REPEAT:
            stack, sp, pushed = _push_unknown(stack, sp, memo, k, sa, sb, pool, x)
            if pushed:
                continue
            # an intersection when all its operands may be infinite, the others when one may
            want = 0 if k == AND else 1
            r = 1 - want
            for j in range(_n_children(k, sb, x)):
                if memo[_child(k, sa, sb, pool, x, j)] == want:
                    r = want
                    break
            memo[x] = r
        else:
            memo[x] = 0
        sp -= 1
    return memo[e]


@njit(nogil=True, cache=True)
def ladder_next(S, e, n):
    """The next rung of ``e`` whose transitions are ``S.tw[:n]``/``S.tt[:n]`` (see
    :meth:`.regexset.ExprSet.ladder_next`, the same rule), or -1."""
    kind = S.kind
    if n == 0 or kind[e] != CONCAT:
        return -1
    head = S.a[e]
    y = S.b[e]
    if kind[head] == BYTES:
        return y if n == 1 and kind[y] == CONCAT else -1
    if kind[head] != REPEAT:
        return -1
    x = S.a[head]
    hi = S.c[head]
    if S.b[head] != 0 or hi == INF or kind[x] != BYTES:
        return -1
    r = S.a[x]
    for j in range(n):
        if (S.tw[j, 0] == S.bm[r, 0] and S.tw[j, 1] == S.bm[r, 1] and S.tw[j, 2] == S.bm[r, 2]
                and S.tw[j, 3] == S.bm[r, 3]):
            t = S.tt[j]
            if hi == 1:
                return t if t == y else -1
            if kind[t] == CONCAT and S.b[t] == y:
                h2 = S.a[t]
                if kind[h2] == REPEAT and S.a[h2] == x and S.b[h2] == 0 and S.c[h2] == hi - 1:
                    return t
            return -1
    return -1


# ------------------------------------------------------------------------------ emptiness
@njit(nogil=True, cache=True)
def _find3(S, kind, a, b, c):
    """The node ``(kind, a, b, c)`` of :func:`mk3` if it exists, else -1 (nothing is made)."""
    return _lookup3(S, kind, a, b, c)[0]


@njit(nogil=True, cache=True, inline="always")
def _need_slot(nk, key, r):
    return np.int64(_h(_h(np.uint64(0), key), r) & np.uint64(nk.shape[0] - 1))


@njit(nogil=True, cache=True)
def counted_lookup(S, e):
    """Whether ``e = x & p r{lo,hi}`` is non-empty, from the count table (``nkey``...): 1 when
    a word of ``x & p r*`` begins a number of factors of ``r`` within ``lo..hi`` (for ``lo`` 0:
    its least count is at most ``hi``), 0 when none does; -1 when the pair is not in the table,
    its counts do not say (a count past 61 asked for) or ``e`` has another shape.

    The shape is :meth:`~.regexset.ExprSet._alive_counted`'s, read the same way: an intersection
    of two, the counted part ``c = a1 … ak r{lo,hi}`` (a right-nested concatenation without
    intersections or complements ending in a counter; ``lo`` read as 0 where ``r`` is nullable;
    of two such parts, the one with the larger ``max(lo, hi)``, the first on a tie), ``x`` the
    other, ``p`` the concatenation of the heads (looked up, not made: a pair Python stored has
    its ``p``). The counts are a property of the pair, not of ``lo`` and ``hi``: the states of a
    ``maxLength`` string (or of an exact length) that differ only in the count left share them."""
    kind = S.kind
    if kind[e] != AND or S.b[e] != 2:
        return -1
    pool = S.pool
    sa = S.a
    sb = S.b
    sc = S.c
    base = sa[e]
    best = -1
    best_k = 0
    for j in range(2):
        c = pool[base + j]
        if S.hb[c]:
            continue
        y = c
        while kind[y] == CONCAT:
            y = sb[y]
        if kind[y] != REPEAT:
            continue
        lo = sb[y]
        hi = sc[y]
        if lo <= 1 and (hi == INF or hi <= 1):
            continue
        if S.nul[sa[y]]:
            lo = 0
        k = max(lo, hi)
        if best < 0 or k > best_k:
            best = j
            best_k = k
    if best < 0:
        return -1
    c = pool[base + best]
    x = pool[base + 1 - best]
    n_heads = 0
    y = c
    while kind[y] == CONCAT:
        y = sb[y]
        n_heads += 1
    r = sa[y]
    lo = 0 if S.nul[r] else sb[y]
    hi = sc[y]
    if hi == INF or n_heads > 64:
        return -1
    # p: the heads folded from the right (the chain's own nodes end in the counter, not in p)
    p = EPS
    for i in range(n_heads - 1, -1, -1):
        z = c
        for _ in range(i):
            z = sb[z]
        a = sa[z]
        p = a if p == EPS else _find3(S, CONCAT, a, p, 0)
        if p < 0:
            return -1
    nk = S.nkey
    key = x << 32 | p
    mask = nk.shape[0] - 1
    slot = _need_slot(nk, key, r)
    while nk[slot] != 0:
        if nk[slot] == key + 1 and S.nkr[slot] == r:
            return _counts_decide(S.nval[slot], S.nbit[slot], lo, hi)
        slot = (slot + 1) & mask
    return -1


@njit(nogil=True, cache=True, inline="always")
def _counts_decide(least, bits, lo, hi):
    """Whether a pair with least count ``least`` and counts ``bits`` (see ``nval``/``nbit``) has
    a word within ``lo..hi`` factors (``hi`` finite): 1, 0, or -1 when they do not say."""
    if lo == 0 and least != NEED_UNKNOWN:
        return 1 if (0 <= least <= hi) else 0
    if bits < 0:
        return -1
    if bits == 0:
        return 0
    if lo <= 61:
        top = min(hi, 61)
        if top >= lo:
            window = ((np.int64(1) << (top + 1)) - 1) & ~((np.int64(1) << lo) - 1)
            if bits & window:
                return 1
    if hi >= 62 and bits & BITS_OVER:
        return -1
    return 0


@njit(nogil=True, cache=True)
def structural_lookup(S, e):
    """:func:`counted_lookup` through concatenations (a string's counted content before its
    closing quote): ``e``'s parts are each non-empty or decided so by their liveness flag or the
    table (1), one is empty (0); -1 when a part is undecided."""
    kind = S.kind
    liv = S.liv
    hb = S.hb
    y = e
    while True:
        part = S.a[y] if kind[y] == CONCAT else y
        if part == EMPTY or liv[part] == DEAD:
            return 0
        if hb[part] and not S.nul[part] and liv[part] != LIVE:
            q = counted_lookup(S, part)
            if q < 0:
                return -1
            liv[part] = LIVE if q else DEAD
            if q == 0:
                return 0
        if kind[y] != CONCAT:
            return 1
        y = S.b[y]


@njit(nogil=True, cache=True)
def need_put(S, key, r, v, bits):
    """Store the least count ``v`` and the counts ``bits`` of the pair ``key = x << 32 | p`` and
    factor ``r`` (see :func:`counted_lookup`); 0 when the table is half full (Python grows it
    first), else 1."""
    nk = S.nkey
    cnt = S.cnt
    if 2 * (cnt[C_NT] + 1) > nk.shape[0]:
        return 0
    mask = nk.shape[0] - 1
    slot = _need_slot(nk, key, r)
    while nk[slot] != 0:
        if nk[slot] == key + 1 and S.nkr[slot] == r:
            S.nval[slot] = v
            S.nbit[slot] = bits
            return 1
        slot = (slot + 1) & mask
    S.nkr[slot] = r
    S.nval[slot] = v
    S.nbit[slot] = bits
    nk[slot] = key + 1
    cnt[C_NT] += 1
    return 1


@njit(nogil=True, cache=True)
def need_rehash(S, nk, nr, nv, nb):
    """Fill the new, larger count table ``nk``/``nr``/``nv``/``nb`` from ``S``'s."""
    old = S.nkey
    mask = nk.shape[0] - 1
    for s in range(old.shape[0]):
        k1 = old[s]
        if k1 == 0:
            continue
        r = S.nkr[s]
        slot = _need_slot(nk, k1 - 1, r)
        while nk[slot] != 0:
            slot = (slot + 1) & mask
        nk[slot] = k1
        nr[slot] = r
        nv[slot] = S.nval[s]
        nb[slot] = S.nbit[s]


@njit(nogil=True, cache=True)
def alive_search(S, e, limit):
    """Whether the language of ``e`` is non-empty, by a depth-first walk over its derivatives:
    1 when a derivative accepts the empty string, has no intersection or complement left, or is
    known non-empty (then it is non-empty), 0 when none does, -1 (undecided) when more than
    ``limit`` derivatives were met or it made more than :data:`WALK_DERIVS_PER_STATE` new
    derivatives a state of ``limit`` (the states of a product automaton can be large:
    Handwritten---num1's ``multipleOf`` intersections made 6.4M derivatives before meeting 20,000
    states, until the compile's memory bound stopped it after 7 s; Python's exploration had
    stopped at 0.6M), -2 when the store is out of room. What a walk decides is
    kept for every derivative it met (``liv``): each one on the path to a non-empty derivative is
    non-empty; when none is found, all are empty. The lexer's next states are derivatives on
    that path, so their checks are then lookups. A counted intersection whose pair is in the
    least-count table is decided by it (:func:`counted_lookup`), without a walk."""
    nul = S.nul
    hb = S.hb
    liv = S.liv
    if e == EMPTY:
        return 0
    if nul[e] or not hb[e] or liv[e] == LIVE:
        return 1
    if liv[e] == DEAD:
        return 0
    kind = S.kind
    if kind[e] == AND or kind[e] == CONCAT:
        q = structural_lookup(S, e)
        if q >= 0:
            liv[e] = LIVE if q else DEAD
            return q
    cnt = S.cnt
    d_max = cnt[C_DERIVS] + WALK_DERIVS_PER_STATE * limit
    mark = S.mark2   # the derivatives met (stamped with this walk's number)
    ep = _epoch(cnt, C_EPOCH2, mark)
    met = S.wk[W_MET]         # the derivatives met, in order
    parent = S.wk[W_PARENT]   # the index in ``met`` of the one each was met from
    stack = S.wk[W_STACK]     # indexes into ``met``
    parts = S.wparts
    mark[e] = ep
    met[0] = e
    parent[0] = -1
    n = 1
    stack[0] = 0
    sp = 1
    found = -1
    while sp > 0 and found < 0:
        sp -= 1
        i = stack[sp]
        x = met[i]
        parts[0, :] = ~np.uint64(0)
        np_ = _classes(S, x, parts, 1)
        for j in range(np_):
            t = deriv(S, x, _lowbit(parts[j, 0], parts[j, 1], parts[j, 2], parts[j, 3]))
            if t < 0:
                return -2
            if cnt[C_DERIVS] > d_max:
                return -1
            if t == EMPTY or liv[t] == DEAD:
                continue
            if mark[t] == ep:
                continue
            mark[t] = ep
            if hb[t] and (kind[t] == AND or kind[t] == CONCAT) and not nul[t] and liv[t] != LIVE:
                q = structural_lookup(S, t)
                if q == 0:
                    liv[t] = DEAD
                    continue
                if q == 1:
                    liv[t] = LIVE
            if n == met.shape[0]:
                met = _grow1(met)
                parent = _grow1(parent)
            met[n] = t
            parent[n] = i
            n += 1
            if nul[t] or not hb[t] or liv[t] == LIVE:
                found = n - 1
                break
            if n > limit:
                return -1
            if sp == stack.shape[0]:
                stack = _grow1(stack)
            stack[sp] = n - 1
            sp += 1
    if found < 0:
        for q in range(n):
            liv[met[q]] = DEAD
        return 0
    while found >= 0:
        liv[met[found]] = LIVE
        found = parent[found]
    return 1


# ------------------------------------------------------------------------------ growth
@njit(nogil=True, cache=True)
def rehash_nodes(S, htab):
    """Fill the new, larger hash table of the nodes ``htab`` from ``S``'s nodes."""
    hmask = htab.shape[0] - 1
    for i in range(S.cnt[C_NODES]):
        k = S.kind[i]
        if k == BYTES:
            r = S.a[i]
            h = _hw(_hw(_hw(_hw(np.uint64(BYTES), S.bm[r, 0]), S.bm[r, 1]), S.bm[r, 2]), S.bm[r, 3])
        elif k == OR or k == AND:
            n = S.b[i]
            h = _h(np.uint64(k), n)
            for j in range(n):
                h = _h(h, S.pool[S.a[i] + j])
        else:
            h = _h(_h(_h(_h(np.uint64(k), k), S.a[i]), S.b[i]), S.c[i])
        slot = np.int64(h & np.uint64(hmask))
        while htab[slot] != 0:
            slot = (slot + 1) & hmask
        htab[slot] = i + 1


@njit(nogil=True, cache=True)
def rehash_memo(S, dkey, dval):
    """Fill the new, larger derivative memo ``dkey``/``dval`` from ``S``'s."""
    dmask = dkey.shape[0] - 1
    old = S.dkey
    for s in range(old.shape[0]):
        k1 = old[s]
        if k1 == 0:
            continue
        slot = np.int64(_h(np.uint64(0), k1 - 1) & np.uint64(dmask))
        while dkey[slot] != 0:
            slot = (slot + 1) & dmask
        dkey[slot] = k1
        dval[slot] = S.dval[s]


# ------------------------------------------------------------------------------ Python entries
# Fixed signatures (int64 ids and counts, arrays read from the record's scratch), so that each is
# called through its one compiled entry point (:class:`~.lexdfa.FastCall`). Each returns its
# result (>= 0) with flags from bit :data:`FLAGS_SHIFT` on (:data:`NEW_NODES`: nodes the Python
# mirrors lack; :data:`GROW_SOON`), or -1 when the store is out of room (see ``cnt[C_STATUS]``):
# a call that needs nothing of Python costs one comparison there.
FLAGS_SHIFT = 40
NEW_NODES = 1 << FLAGS_SHIFT
GROW_SOON = 2 << FLAGS_SHIFT


@njit(nogil=True, cache=True, inline="always")
def _ret(S, r):
    if r < 0:
        return -1
    if S.cnt[C_NODES] != S.cnt[C_SYNCED]:
        r |= NEW_NODES
    if S.cnt[C_GROW]:
        r |= GROW_SOON
    return r


@njit(nogil=True, cache=True)
def py_mk3(S, kind, a, b, c):
    return _ret(S, mk3(S, kind, a, b, c))


@njit(nogil=True, cache=True)
def py_bytes(S):
    """The byte set of the mask in ``S.tw[0]``."""
    return _ret(S, mk_bytes(S, S.tw[0, 0], S.tw[0, 1], S.tw[0, 2], S.tw[0, 3]))


@njit(nogil=True, cache=True)
def py_alt(S, n):
    return _ret(S, alt(S, S.xs[:n].copy(), n))


@njit(nogil=True, cache=True)
def py_intersect(S, n):
    return _ret(S, intersect(S, S.xs[:n].copy(), n))


@njit(nogil=True, cache=True)
def py_concat2(S, a, b):
    return _ret(S, concat2(S, a, b))


@njit(nogil=True, cache=True)
def py_complement(S, a):
    return _ret(S, complement(S, a))


@njit(nogil=True, cache=True)
def py_repeat(S, a, lo, hi):
    return _ret(S, repeat(S, a, lo, hi))


@njit(nogil=True, cache=True)
def py_concat(S, n):
    """The concatenation of ``S.xs[:n]``, from the right."""
    xs = S.xs[:n].copy()
    r = xs[n - 1]
    for j in range(n - 2, -1, -1):
        r = concat2(S, xs[j], r)
        if r < 0:
            return -1
    return _ret(S, r)


@njit(nogil=True, cache=True)
def py_alive(S, e, limit):
    r = alive_search(S, e, limit)
    if r == -2:
        return -1
    return _ret(S, r + 1)   # 0 undecided, 1 empty, 2 non-empty


@njit(nogil=True, cache=True)
def py_deriv(S, e, b):
    return _ret(S, deriv(S, e, b))


@njit(nogil=True, cache=True)
def py_literal(S, data):
    return _ret(S, literal(S, data))


@njit(nogil=True, cache=True)
def py_transitions(S, e):
    return _ret(S, transitions_of(S, e))


@njit(nogil=True, cache=True)
def py_counted_moves(S, x, s, r, new, out):
    return _ret(S, counted_moves(S, x, s, r, new, out))
