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

Kernels return a status; anything but ``OK``/``REJECT`` asks Python to act and call again:
``MISSING`` (lexer states or start sets to build), ``GROW_*`` (an array is full).
"""
from __future__ import annotations

import numpy as np
from numba import njit

from .lexer import lexeme_set_hash, lookup_start

OK, REJECT, MISSING, GROW_ITEMS, GROW_ROWS, GROW_HASH = 0, 1, 2, 3, 4, 5

# indices into the tuples handed to kernels
# G: grammar tables
G_SYM, G_END_LHS, G_PROD_START, G_NT_LO, G_NT_HI, G_NULLABLE = range(6)
# P: parse stack
P_POS, P_ORG, P_ROW_BEG, P_ROW_LS, P_ROW_KEY, P_ROW_ACC = range(6)
# S: int32 scratch
S_PRED, S_LEX_STAMP, S_LEX_MARK, S_ALLOWED, S_HSTAMP, S_INFO = range(6)
# S_INFO slots: [0] stamp counter, [1] accept_pos, [2] start nonterminal
# M: missing buffers: (states, start_lex, start_off, counts[3]: n_states, n_starts, n_lex)


@njit(nogil=True, cache=True)
def _next_stamp(S):
    info = S[S_INFO]
    info[0] += 1
    if info[0] >= 2_000_000_000:
        S[S_PRED][:] = 0
        S[S_LEX_STAMP][:] = 0
        S[S_LEX_MARK][:] = 0
        S[S_HSTAMP][:] = 0
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
def _closure(r, end, G, P, S, hkeys, stamp):
    """Complete and predict row ``r`` whose seed items are ``[row_beg[r], end)``.
    Returns (status, end)."""
    sym = G[G_SYM]
    end_lhs = G[G_END_LHS]
    prod_start = G[G_PROD_START]
    nt_lo = G[G_NT_LO]
    nt_hi = G[G_NT_HI]
    nullable = G[G_NULLABLE]
    it_pos = P[P_POS]
    it_org = P[P_ORG]
    row_beg = P[P_ROW_BEG]
    pred = S[S_PRED]
    hst = S[S_HSTAMP]
    accept_pos = S[S_INFO][1]
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
    P[P_ROW_ACC][r] = acc
    return OK, end


@njit(nogil=True, cache=True)
def _allowed_lexemes(r, G, P, S, stamp):
    """Sorted list of lexemes allowed by row ``r`` in ``S[S_ALLOWED]``; returns their number."""
    sym = G[G_SYM]
    it_pos = P[P_POS]
    row_beg = P[P_ROW_BEG]
    lst = S[S_LEX_STAMP]
    out = S[S_ALLOWED]
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
def _record_missing_start(S, n, M):
    starts_lex = M[1]
    starts_off = M[2]
    cnt = M[3]
    if cnt[1] + 1 >= starts_off.shape[0] or cnt[2] + n > starts_lex.shape[0]:
        return
    allowed = S[S_ALLOWED]
    for i in range(n):
        starts_lex[cnt[2] + i] = allowed[i]
    cnt[2] += n
    cnt[1] += 1
    starts_off[cnt[1]] = cnt[2]


@njit(nogil=True, cache=True)
def resolve_row_start(r, G, L_st_keys, L_st_vals, P, S, M):
    """(Re)compute ``row_ls[r]`` from the row's allowed lexemes; records a missing start set."""
    stamp = _next_stamp(S)
    n = _allowed_lexemes(r, G, P, S, stamp)
    key = lexeme_set_hash(S[S_ALLOWED], n)
    ls = lookup_start(L_st_keys, L_st_vals, key)
    P[P_ROW_LS][r] = ls
    if ls == -2:
        _record_missing_start(S, n, M)
    return ls


@njit(nogil=True, cache=True)
def compute_row(r, acc_set, G, acc_off, acc_lex, L_st_keys, L_st_vals, P, S, hkeys, M):
    """Build row ``r``: the initial row when ``r == 0``, else scan the lexemes of accepted set
    ``acc_set`` from row ``r - 1``. Returns a status (OK, REJECT when no item advances, GROW_*,
    MISSING when ``acc_set`` is newer than the arrays passed in)."""
    row_beg = P[P_ROW_BEG]
    if r + 2 > row_beg.shape[0]:
        return GROW_ROWS
    stamp = _next_stamp(S)
    end = row_beg[r]
    it_pos = P[P_POS]
    it_org = P[P_ORG]
    hst = S[S_HSTAMP]
    if r == 0:
        start_nt = S[S_INFO][2]
        end = _add(G[G_PROD_START][G[G_NT_LO][start_nt]], 0, end, it_pos, it_org, hst, hkeys, stamp)
        if end < 0:
            return GROW_ITEMS if end == -1 else GROW_HASH
    else:
        if acc_set + 1 >= acc_off.shape[0]:
            # a lexeme set registered by another thread after our arrays were taken: call again
            return MISSING
        sym = G[G_SYM]
        mark = S[S_LEX_MARK]
        for j in range(acc_off[acc_set], acc_off[acc_set + 1]):
            mark[acc_lex[j]] = stamp
        for i in range(row_beg[r - 1], row_beg[r]):
            s = sym[it_pos[i]]
            if s <= -2 and mark[-s - 2] == stamp:
                end = _add(it_pos[i] + 1, it_org[i], end, it_pos, it_org, hst, hkeys, stamp)
                if end < 0:
                    return GROW_ITEMS if end == -1 else GROW_HASH
        if end == row_beg[r]:
            P[P_ROW_LS][r] = -1
            return REJECT
    st, end = _closure(r, end, G, P, S, hkeys, stamp)
    if st != OK:
        return st
    row_beg[r + 1] = end
    P[P_ROW_KEY][r] = acc_set
    resolve_row_start(r, G, L_st_keys, L_st_vals, P, S, M)
    return OK


class ParseStack:
    """The arrays of one parse (owned by a matcher); grown by Python when a kernel asks."""

    def __init__(self, flat, items: int = 4096, rows: int = 256, hash_size: int = 4096):
        self.flat = flat
        i32 = np.int32
        self.it_pos = np.zeros(items, i32)
        self.it_org = np.zeros(items, i32)
        self.row_beg = np.zeros(rows + 1, i32)
        self.row_ls = np.full(rows, -2, i32)
        self.row_key = np.full(rows, -1, i32)
        self.row_acc = np.zeros(rows, i32)
        n_nt = int(flat.nt_prod_lo.shape[0])
        n_lex = max(1, flat.n_lexemes)
        info = np.zeros(4, i32)
        info[1] = flat.accept_pos
        info[2] = flat.start_nt
        self.scratch = (np.zeros(n_nt, i32), np.zeros(n_lex, i32), np.zeros(n_lex, i32),
                        np.zeros(n_lex + 1, i32), np.zeros(hash_size, i32), info)
        self.hkeys = np.zeros(hash_size, np.int64)

    @property
    def P(self):
        return (self.it_pos, self.it_org, self.row_beg, self.row_ls, self.row_key, self.row_acc)

    def grow(self, status: int) -> None:
        if status == GROW_ITEMS:
            n = 2 * self.it_pos.shape[0]
            self.it_pos = _resized(self.it_pos, n)
            self.it_org = _resized(self.it_org, n)
        elif status == GROW_ROWS:
            n = 2 * self.row_ls.shape[0]
            self.row_beg = _resized(self.row_beg, n + 1)
            self.row_ls = _resized(self.row_ls, n, -2)
            self.row_key = _resized(self.row_key, n, -1)
            self.row_acc = _resized(self.row_acc, n)
        elif status == GROW_HASH:
            n = 4 * self.hkeys.shape[0]
            if n > (1 << 26):
                from ..errors import GrammarTooComplexError
                raise GrammarTooComplexError("an Earley row grew beyond its bound")
            s = list(self.scratch)
            s[S_HSTAMP] = np.zeros(n, np.int32)
            self.scratch = tuple(s)
            self.hkeys = np.zeros(n, np.int64)
        else:  # pragma: no cover
            raise AssertionError(status)

    def copy(self) -> "ParseStack":
        new = object.__new__(ParseStack)
        new.flat = self.flat
        for name in ("it_pos", "it_org", "row_beg", "row_ls", "row_key", "row_acc", "hkeys"):
            setattr(new, name, getattr(self, name).copy())
        new.scratch = tuple(a.copy() for a in self.scratch)
        return new


def _resized(a: np.ndarray, n: int, fill: int = 0) -> np.ndarray:
    out = np.full(n, fill, dtype=a.dtype)
    out[: a.shape[0]] = a
    return out
