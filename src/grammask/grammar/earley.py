"""Earley parser over lexemes: the parse stack and its Numba kernels.

A parse state is a stack of Earley *rows*; row ``r`` holds the items ``(pos, origin)`` reached after
the ``r``-th lexeme (``pos`` indexes the flat symbol array of :class:`~.cfg.FlatGrammar`). Rows
live in preallocated int32 arrays:

``it_pos, it_org``  items, row after row
``row_beg``         row ``r`` is ``items[row_beg[r]:row_beg[r+1]]``
``row_ls``          lexer start state for the lexemes row ``r`` allows (-2: not registered yet)
``row_key``         id of the accepted-lexeme set that was scanned to build row ``r`` (reuse key)
``row_acc``         1 when the grammar may end after row ``r``

A row depends only on the rows below it and on the scanned lexemes, so the trie walk pushes a row
when a lexeme ends on the way down, pops it (moves the height back) on the way up, and reuses a
popped row when the same lexemes are scanned again at the same height (``cache_top`` says which
popped rows are still consistent with the rows below them). Nullable nonterminals are handled as
in Aycock & Horspool: predicting a nullable nonterminal also advances over it.

The arrays travel to the kernels as named tuples (Numba reads their fields by name): the grammar
tables :class:`GrammarTables` (built once per compiled grammar), the parse stack
:class:`ParseArrays` (rows, scratch and the item hash of one matcher, rebuilt when
:meth:`ParseStack.grow` reallocates them), the lexer's :class:`~.lexer.LexerTables` and the
requests of :class:`MissingRequests`. Kernels return a status; anything but ``OK``/``REJECT`` asks
Python to act and call again: see :meth:`~.compiled.CompiledGrammar.run`, the one driver of that
protocol.
"""
from __future__ import annotations

from collections import namedtuple

import numpy as np
from numba import njit

from .kstruct import kstruct
from .lexer import lexeme_set_hash, lookup_start

OK, REJECT, MISSING, GROW_ITEMS, GROW_ROWS, GROW_HASH = 0, 1, 2, 3, 4, 5

#: bytes one parse stack (items, rows and the item hash of a row) may hold: a request to grow it
#: past this is a :class:`~grammask.errors.GrammarMemoryError` at mask time. A last resort for
#: pathologically ambiguous grammars (``S ::= S S | "a"`` holds O(n) items per row, O(n^2) in
#: all): the compile's own bound (:mod:`.membound`) trips at compile time, where every other
#: bound is; a JSON output of 100,000 lexemes holds some tens of MiB.
MAX_PARSE_STACK_BYTES = 1 << 30
#: slots of the item hash of one row (it is sized by the row's items): the bound on items in one
#: row, 2^24 slots (192 MiB)
MAX_ROW_HASH_SLOTS = 1 << 24


#: the grammar tables of :class:`~.cfg.FlatGrammar` (``nullable`` as int32)
GrammarTables = namedtuple("GrammarTables", "sym end_lhs prod_start nt_lo nt_hi nullable")

#: the arrays of one parse (see the module docstring for the rows), then int32 scratch:
#: ``pred`` (per nonterminal: stamp of its last prediction), ``lex_stamp``/``lex_mark`` (per
#: lexeme), ``allowed`` (the sorted allowed lexemes of a row), ``hstamp``/``hkeys`` (the item
#: hash of the row being built: slot in use when its stamp is current), and
#: ``info = [stamp counter, accept_pos, start nonterminal, top]``: the rows from the matcher's
#: height up to ``top`` (exclusive) are consistent with the rows below them, so a kernel may
#: reuse them (by ``row_key``) across calls; :func:`compute_row` keeps it (see :func:`row_top`)
ParseArrays = namedtuple("ParseArrays", "it_pos it_org row_beg row_ls row_key row_acc "
                                        "pred lex_stamp lex_mark allowed hstamp info hkeys")

#: what a kernel could not find (see :meth:`~.compiled.CompiledGrammar.run`): ``states``
#: (lexer states to expand), ``start_lex``/``start_off`` (the lexeme lists of start sets to
#: register, list ``i`` is ``start_lex[start_off[i]:start_off[i + 1]]``),
#: ``chains`` (``[node, state]`` pairs: a trie subtree the walk skipped because ``state`` was not
#: expanded; Python expands the states of the whole subtree at once, see
#: :meth:`~.compiled.CompiledGrammar.resolve`) and
#: ``counts = [n states, n start sets, n lexemes in start_lex, n chains]``
MissingRequests = namedtuple("MissingRequests", "states start_lex start_off counts chains")

#: ``(trie node, lexer state)`` pairs a trie walk may record per round in ``MissingRequests.chains``
MAX_CHAINS = 64


#: ``MissingRequests.counts``: states, start sets, their lexemes, chains recorded; and a flag: a
#: trie walk that meets a state not built stops there (MISSING at once, its records incomplete:
#: for a read-only walk whose caller walks again building, :meth:`.GrammarMatcher.fill_words`)
STOP_AT_MISSING = 4


def new_missing(n_lex: int) -> MissingRequests:
    """Empty request buffers for a grammar of ``n_lex`` lexemes (one per matcher)."""
    return kstruct(MissingRequests(np.zeros(4096, np.int32), np.zeros(max(16, 4 * n_lex), np.int32),
                                   np.zeros(65, np.int32), np.zeros(5, np.int32),
                                   np.zeros(2 * MAX_CHAINS, np.int32)))


def grammar_tables(f) -> GrammarTables:
    return kstruct(GrammarTables(f.sym, f.end_lhs, f.prod_start, f.nt_prod_lo, f.nt_prod_hi,
                                 f.nt_nullable.astype(np.int32)))


@njit(nogil=True, cache=True)
def _next_stamp(P):
    info = P.info
    info[0] += 1
    if info[0] >= 2_000_000_000:
        P.pred[:] = 0
        P.lex_stamp[:] = 0
        P.lex_mark[:] = 0
        P.hstamp[:] = 0
        info[0] = 1
    return info[0]


@njit(nogil=True, cache=True, inline="always")
def _add(pos, org, end, it_pos, it_org, hst, hkeys, stamp):
    """Append item (pos, org) unless present; returns the new end, -1 (items full), -2 (hash full).
    (Arrays come unpacked: taking an array out of a tuple costs a reference count per call.)"""
    hmask = hkeys.shape[0] - 1
    key = (np.int64(pos) << 32) | np.int64(org)
    x = np.uint64(pos) * np.uint64(0x9E3779B97F4A7C15) + np.uint64(org) * np.uint64(0xC2B2AE3D27D4EB4F)
    x ^= x >> np.uint64(29)
    j = np.int64(x & np.uint64(0x7FFFFFFF)) & hmask
    n = 0
    while hst[j] == stamp:
        if hkeys[j] == key:
            return end
        j = (j + 1) & hmask
        n += 1
        if n > 64:
            return -2
    if end >= it_pos.shape[0]:
        return -1
    hst[j] = stamp
    hkeys[j] = key
    it_pos[end] = pos
    it_org[end] = org
    return end + 1


@njit(nogil=True, cache=True)
def _closure(r, end, G, P, stamp):
    """Complete and predict row ``r`` whose seed items are ``[row_beg[r], end)``.
    Returns (status, end)."""
    sym = G.sym
    end_lhs = G.end_lhs
    prod_start = G.prod_start
    nt_lo = G.nt_lo
    nt_hi = G.nt_hi
    nullable = G.nullable
    it_pos = P.it_pos
    it_org = P.it_org
    row_beg = P.row_beg
    pred = P.pred
    hst = P.hstamp
    hkeys = P.hkeys
    accept_pos = P.info[1]
    acc = 0
    i = row_beg[r]
    while i < end:
        pos = it_pos[i]
        org = it_org[i]
        i += 1
        s = sym[pos]
        if s == -1:
            if pos == accept_pos and org == 0:
                acc = 1
            if org == r:
                continue  # an empty derivation: handled by the nullable advance in prediction
            lhs = end_lhs[pos]
            for j in range(row_beg[org], row_beg[org + 1]):
                p2 = it_pos[j]
                if sym[p2] == lhs:
                    end = _add(p2 + 1, it_org[j], end, it_pos, it_org, hst, hkeys, stamp)
                    if end < 0:
                        return (GROW_ITEMS if end == -1 else GROW_HASH), 0
        elif s >= 0:
            if pred[s] != stamp:
                pred[s] = stamp
                for k in range(nt_lo[s], nt_hi[s]):
                    end = _add(prod_start[k], r, end, it_pos, it_org, hst, hkeys, stamp)
                    if end < 0:
                        return (GROW_ITEMS if end == -1 else GROW_HASH), 0
            if nullable[s]:
                end = _add(pos + 1, org, end, it_pos, it_org, hst, hkeys, stamp)
                if end < 0:
                    return (GROW_ITEMS if end == -1 else GROW_HASH), 0
    P.row_acc[r] = acc
    return OK, end


@njit(nogil=True, cache=True)
def _allowed_lexemes(r, G, P, stamp):
    """Sorted list of lexemes allowed by row ``r`` in ``P.allowed``; returns their number."""
    sym = G.sym
    it_pos = P.it_pos
    row_beg = P.row_beg
    lst = P.lex_stamp
    out = P.allowed
    n = 0
    for i in range(row_beg[r], row_beg[r + 1]):
        s = sym[it_pos[i]]
        if s <= -2:
            lx = -s - 2
            if lst[lx] != stamp:
                lst[lx] = stamp
                # insertion sort: rows allow few lexemes
                j = n
                while j > 0 and out[j - 1] > lx:
                    out[j] = out[j - 1]
                    j -= 1
                out[j] = lx
                n += 1
    return n


@njit(nogil=True, cache=True)
def _record_missing_start(P, n, M):
    starts_lex = M.start_lex
    starts_off = M.start_off
    cnt = M.counts
    if cnt[1] + 1 >= starts_off.shape[0] or cnt[2] + n > starts_lex.shape[0]:
        return
    allowed = P.allowed
    for i in range(n):
        starts_lex[cnt[2] + i] = allowed[i]
    cnt[2] += n
    cnt[1] += 1
    starts_off[cnt[1]] = cnt[2]


@njit(nogil=True, cache=True)
def resolve_row_start(r, G, L, P, M):
    """(Re)compute ``row_ls[r]`` from the row's allowed lexemes; records a missing start set."""
    stamp = _next_stamp(P)
    n = _allowed_lexemes(r, G, P, stamp)
    key = lexeme_set_hash(P.allowed, n)
    ls = lookup_start(L.st_keys, L.st_vals, key)
    P.row_ls[r] = ls
    if ls == -2:
        _record_missing_start(P, n, M)
    return ls


@njit(nogil=True, cache=True, inline="always")
def row_top(P, h):
    """Where a kernel starting at height ``h`` starts its ``cache_top``: the rows ``h ..
    top - 1`` built by earlier calls are still consistent with the rows below them (a row is
    only ever rebuilt by :func:`compute_row`, which lowers ``top`` to it first; rows below ``h``
    are the matcher's own)."""
    t = P.info[3]
    return t if t > h else h


@njit(nogil=True, cache=True)
def compute_row(r, acc_set, G, L, P, M):
    """Build row ``r``: the initial row when ``r == 0``, else scan the lexemes of accepted set
    ``acc_set`` from row ``r - 1``. Returns a status (OK, REJECT when no item advances, GROW_*,
    MISSING when ``acc_set`` is newer than the arrays passed in)."""
    row_beg = P.row_beg
    if r + 2 > row_beg.shape[0]:
        return GROW_ROWS
    # the rows from r up are no longer consistent (valid again up to r + 1 once built)
    P.info[3] = r
    stamp = _next_stamp(P)
    end = row_beg[r]
    it_pos = P.it_pos
    it_org = P.it_org
    hst = P.hstamp
    hkeys = P.hkeys
    if r == 0:
        start_nt = P.info[2]
        end = _add(G.prod_start[G.nt_lo[start_nt]], 0, end, it_pos, it_org, hst, hkeys, stamp)
        if end < 0:
            return GROW_ITEMS if end == -1 else GROW_HASH
    else:
        acc_off = L.acc_off
        if acc_set + 1 >= acc_off.shape[0]:
            # a lexeme set registered by another thread after our arrays were taken: call again
            return MISSING
        acc_lex = L.acc_lex
        sym = G.sym
        mark = P.lex_mark
        for j in range(acc_off[acc_set], acc_off[acc_set + 1]):
            mark[acc_lex[j]] = stamp
        for i in range(row_beg[r - 1], row_beg[r]):
            s = sym[it_pos[i]]
            if s <= -2 and mark[-s - 2] == stamp:
                end = _add(it_pos[i] + 1, it_org[i], end, it_pos, it_org, hst, hkeys, stamp)
                if end < 0:
                    return GROW_ITEMS if end == -1 else GROW_HASH
        if end == row_beg[r]:
            P.row_ls[r] = -1
            return REJECT
    st, end = _closure(r, end, G, P, stamp)
    if st != OK:
        return st
    row_beg[r + 1] = end
    P.row_key[r] = acc_set
    resolve_row_start(r, G, L, P, M)
    P.info[3] = r + 1
    return OK


@njit(nogil=True, cache=True)
def initial_row(G, L, P, M):
    """Build row 0 and its lexer start state; MISSING until that start set is registered."""
    st = compute_row(0, -1, G, L, P, M)
    if st == OK and P.row_ls[0] < 0:
        return MISSING
    return st


@njit(nogil=True, cache=True)
def stack_key(P, h, out):
    """Write into ``out`` (int32) a key of the parse below height ``h``: two stacks with equal
    keys can parse the same continuations, alike (the converse need not hold). The key is the rows
    reachable from the top row through the items' origins (completion reads no other row), top
    first, each as its item count and its items ``(pos, origin)``, the origin written as the rank
    of that row among the reachable ones. Rows that nothing reaches (a finished array element's)
    and the rows' absolute heights drop out, so the same place in each element of an array after
    the first has one key (the first is parsed by another rule). Returns the length written, or
    -1 when ``out`` is too short."""
    row_beg = P.row_beg
    it_pos = P.it_pos
    it_org = P.it_org
    rank = np.full(h, -1, np.int32)
    rank[h - 1] = 0
    # origins are at or below their row: one pass downward marks every reachable row
    for r in range(h - 1, -1, -1):
        if rank[r] < 0:
            continue
        for i in range(row_beg[r], row_beg[r + 1]):
            o = it_org[i]
            if rank[o] < 0:
                rank[o] = 0
    k = 0
    for r in range(h - 1, -1, -1):
        if rank[r] >= 0:
            rank[r] = k
            k += 1
    n = 0
    for r in range(h - 1, -1, -1):
        if rank[r] < 0:
            continue
        a, b = row_beg[r], row_beg[r + 1]
        if n + 1 + 2 * (b - a) > out.shape[0]:
            return -1
        out[n] = b - a
        n += 1
        for i in range(a, b):
            out[n] = it_pos[i]
            out[n + 1] = rank[it_org[i]]
            n += 2
    return n


class ParseStack:
    """The arrays of one parse (owned by a matcher) as :class:`ParseArrays` in ``arrays``;
    grown by Python when a kernel asks (the tuple is rebuilt only then)."""

    def __init__(self, flat, items: int = 4096, rows: int = 256, hash_size: int = 4096):
        self.flat = flat
        i32 = np.int32
        n_nt = int(flat.nt_prod_lo.shape[0])
        n_lex = max(1, flat.n_lexemes)
        info = np.zeros(4, i32)
        info[1] = flat.accept_pos
        info[2] = flat.start_nt
        self.arrays = kstruct(ParseArrays(
            it_pos=np.zeros(items, i32), it_org=np.zeros(items, i32),
            row_beg=np.zeros(rows + 1, i32), row_ls=np.full(rows, -2, i32),
            row_key=np.full(rows, -1, i32), row_acc=np.zeros(rows, i32),
            pred=np.zeros(n_nt, i32), lex_stamp=np.zeros(n_lex, i32), lex_mark=np.zeros(n_lex, i32),
            allowed=np.zeros(n_lex + 1, i32), hstamp=np.zeros(hash_size, i32), info=info,
            hkeys=np.zeros(hash_size, np.int64)))

    def grow(self, status: int) -> None:
        """Grow the array a kernel found full: items and rows x2, the row's item hash x4; past
        :data:`MAX_PARSE_STACK_BYTES` in all, or :data:`MAX_ROW_HASH_SLOTS`,
        :class:`~grammask.errors.GrammarMemoryError` (the stack is left as it was)."""
        a = self.arrays
        if status == GROW_ITEMS:
            n = 2 * a.it_pos.shape[0]
            self._check("Earley items", n * 8 - a.it_pos.nbytes - a.it_org.nbytes)
            a = a._replace(it_pos=_resized(a.it_pos, n), it_org=_resized(a.it_org, n))
        elif status == GROW_ROWS:
            n = 2 * a.row_ls.shape[0]
            self._check("Earley rows", n * 16 + 4 - a.row_beg.nbytes - a.row_ls.nbytes - a.row_key.nbytes
                        - a.row_acc.nbytes)
            a = a._replace(row_beg=_resized(a.row_beg, n + 1), row_ls=_resized(a.row_ls, n, -2),
                           row_key=_resized(a.row_key, n, -1), row_acc=_resized(a.row_acc, n))
        elif status == GROW_HASH:
            n = 4 * a.hkeys.shape[0]
            if n > MAX_ROW_HASH_SLOTS:
                self._exceeded("Earley items of one row (its item hash)", n * 12, MAX_ROW_HASH_SLOTS * 12)
            self._check("Earley items of one row (its item hash)", n * 12 - a.hstamp.nbytes - a.hkeys.nbytes)
            a = a._replace(hstamp=np.zeros(n, np.int32), hkeys=np.zeros(n, np.int64))
        else:  # pragma: no cover
            raise AssertionError(status)
        self.arrays = a

    @property
    def nbytes(self) -> int:
        return int(sum(x.nbytes for x in self.arrays))

    def _check(self, what: str, more: int) -> None:
        if self.nbytes + more > MAX_PARSE_STACK_BYTES:
            self._exceeded(what, self.nbytes + more, MAX_PARSE_STACK_BYTES)

    @staticmethod
    def _exceeded(what: str, used: int, limit: int):
        from ..errors import GrammarMemoryError

        raise GrammarMemoryError(
            f"the Earley parse stack's memory bound was exceeded: {what} would take it to "
            f"{used / (1 << 20):.1f} MiB, over {limit / (1 << 20):.1f} MiB (a pathologically "
            f"ambiguous grammar)", what=what, used_bytes=used, limit_bytes=limit)

    def copy(self) -> "ParseStack":
        new = object.__new__(ParseStack)
        new.flat = self.flat
        new.arrays = kstruct(ParseArrays(*[x.copy() for x in self.arrays]))
        return new


def _resized(a: np.ndarray, n: int, fill: int = 0) -> np.ndarray:
    out = np.full(n, fill, dtype=a.dtype)
    out[: a.shape[0]] = a
    return out
