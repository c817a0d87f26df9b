"""Token-mask kernels: one lexer/parser step, and the trie walk that fills a bitmask.

Every kernel takes the grammar tables ``G`` (:class:`~.earley.GrammarTables`), the lexer tables
``L`` (:class:`~.lexer.LexerTables`), the parse stack ``P`` (:class:`~.earley.ParseArrays`) and the
request buffers ``M`` (:class:`~.earley.MissingRequests`), in that order, between its own leading
and trailing arguments; it returns a status (or a tuple led by one) for the driver,
:meth:`~.compiled.CompiledGrammar.run`. ``fill_mask`` also takes the slice forest's arrays
(:class:`~.slicer.ForestArrays`) and the matcher's walk buffers (:class:`WalkBuffers`).

The walk visits the flat token trie in preorder (:mod:`.toktrie`). At each node it does one table
lookup in the lexer DFA; a dead lexer state skips the whole subtree (``i = node_end[i]``). Only
when a lexeme ends (the next byte cannot extend it) does the parser take part: the accepted lexemes
are scanned into a new Earley row, pushed on the way down and popped on the way up (see
:mod:`.earley` for reuse). A token is allowed when the walk reaches its node alive: the lexer can
still complete some lexeme that the parser accepts, and every grammar symbol is productive.
"""
from __future__ import annotations

from collections import namedtuple

import numpy as np
from numba import njit

from .earley import GROW_ROWS, MISSING, OK, REJECT, compute_row, resolve_row_start
from .lexdfa import FastCall  # noqa: F401 - defined there (the lexer uses it too), used from here

#: a trie subtree of at most this many nodes skipped for a missing lexer state is recorded as a
#: chain (``MissingRequests.chains``): Python builds the states of all of it in the same round
CHAIN_NODES = 512


#: a matcher's buffers for :func:`fill_mask`: lexer state and height per trie depth
#: (``ls_st``, ``h_st``), the tokens found (``found``, one slot per trie token) and the stop tokens
WalkBuffers = namedtuple("WalkBuffers", "ls_st h_st found stop_ids")


@njit(nogil=True, cache=True)
def _record_state(M, s):
    buf = M.states
    cnt = M.counts
    if cnt[0] < buf.shape[0]:
        buf[cnt[0]] = s
        cnt[0] += 1


@njit(nogil=True, cache=True)
def _record_chain(M, node, s):
    cnt = M.counts
    k = cnt[3]
    if 2 * k + 1 < M.chains.shape[0]:
        M.chains[2 * k] = node
        M.chains[2 * k + 1] = s
        cnt[3] = k + 1


@njit(nogil=True, cache=True)
def chain_frontier(F, trans, pairs, n_pairs, at, out):
    """For the recorded chains ``pairs[2k], pairs[2k + 1]`` (trie node, lexer state): walk the
    node's subtree by plain lexer moves (``trans``) and write to ``out`` the states met that are
    not expanded yet (their subtrees are not walked); returns how many (at most ``out``'s size).
    ``at`` is scratch (one state per trie depth). Python expands them and calls again until none
    is left (:meth:`~.compiled.CompiledGrammar.resolve`)."""
    node_byte = F.node_byte
    node_depth = F.node_depth
    node_end = F.node_end
    n = 0
    for k in range(n_pairs):
        i = pairs[2 * k]
        s = pairs[2 * k + 1]
        t = trans[s * 256 + node_byte[i]]
        if t == -2:
            if n < out.shape[0]:
                out[n] = s
                n += 1
            continue
        if t < 0:
            continue
        at[node_depth[i]] = t
        j = i + 1
        end = node_end[i]
        while j < end:
            d = node_depth[j]
            p = at[d - 1]
            x = trans[p * 256 + node_byte[j]]
            if x == -2:
                if n < out.shape[0]:
                    out[n] = p
                    n += 1
                j = node_end[j]
                continue
            if x < 0:
                j = node_end[j]
                continue
            at[d] = x
            j += 1
    return n


@njit(nogil=True, cache=True, inline="always")
def step_slow(b, s, h, cache_top, G, L, P, M):
    """The byte ``b`` in lexer state ``s`` over ``h`` rows when the table says it is not a plain
    lexer move. Returns (status, state, height, cache_top)."""
    t = L.trans[s * 256 + b]
    if t >= 0:
        return OK, t, h, cache_top
    if t == -2:
        _record_state(M, s)
        return MISSING, s, h, cache_top
    k = L.state_acc[s]
    if k < 0:
        return REJECT, s, h, cache_top
    row_key = P.row_key
    row_ls = P.row_ls
    if h < cache_top and row_key[h] == k:
        s2 = row_ls[h]
        if s2 == -2:
            s2 = resolve_row_start(h, G, L, P, M)
    else:
        if h + 2 > P.row_beg.shape[0]:
            return GROW_ROWS, s, h, cache_top
        st = compute_row(h, k, G, L, P, M)
        if st != OK:
            return st, s, h, h
        cache_top = h + 1
        s2 = row_ls[h]
    if s2 == -2 or s2 * 256 >= L.trans.shape[0]:
        # not registered yet, or registered by another thread after our arrays were taken
        return MISSING, s, h, cache_top
    if s2 < 0:
        return REJECT, s, h, cache_top
    t = L.trans[s2 * 256 + b]
    if t == -2:
        _record_state(M, s2)
        return MISSING, s, h, cache_top
    if t == -1:
        return REJECT, s, h, cache_top
    return OK, t, h + 1, cache_top


@njit(nogil=True, cache=True)
def _step_slow_call(b, s, h, cache_top, G, L, P, M):
    """:func:`step_slow` as a real call, for :func:`walk_trie`: inlined there, its body (four
    structures of arrays) made the walk's hot loop about 10% slower; the call is taken rarely."""
    return step_slow(b, s, h, cache_top, G, L, P, M)


@njit(nogil=True, cache=True)
def _walk_ranges(R, nr, F, G, L, P, M, W, nf, cache_top):
    """Walk the trie node ranges ``R[r, 0] .. R[r, 1] - 1``, ``r < nr`` (whole subtrees, in
    preorder). Before range ``r``, when ``R[r, 2] >= 0``, the lexer state and height at depth
    ``R[r, 2]`` are set to ``R[r, 3]``, ``R[r, 4]`` (the depth above the range's top nodes). Appends
    the tokens found to ``W.found`` from ``nf``. Returns (status, nf): OK, MISSING when subtrees
    were skipped for want of lexer states (call again once they are built), or GROW_* (an array
    is full). The arrays are taken out of their structures once here: inside the loop each
    access would count a reference."""
    node_byte = F.node_byte
    node_depth = F.node_depth
    node_end = F.node_end
    node_tok = F.node_tok
    ls_st = W.ls_st
    h_st = W.h_st
    found = W.found
    trans = L.trans
    state_acc = L.state_acc
    n_states = trans.shape[0] // 256
    row_key = P.row_key
    row_ls = P.row_ls
    incomplete = False
    for r in range(nr):
        i = R[r, 0]
        hi = R[r, 1]
        if R[r, 2] >= 0:
            ls_st[R[r, 2]] = R[r, 3]
            h_st[R[r, 2]] = R[r, 4]
        while i < hi:
            d = node_depth[i]
            s = ls_st[d - 1]
            h = h_st[d - 1]
            b = node_byte[i]
            t = trans[s * 256 + b]
            if t == -1:
                # the fast paths of step_slow, inlined: calls pass many arrays (refcounts) and cost
                k = state_acc[s]
                if k < 0:
                    i = node_end[i]
                    continue
                if h < cache_top and row_key[h] == k:
                    s2 = row_ls[h]
                    if s2 >= 0 and s2 < n_states:
                        t = trans[s2 * 256 + b]
                        if t == -1:
                            i = node_end[i]
                            continue
                        if t >= 0:
                            h += 1
            if t < 0:
                st, t, h, cache_top = _step_slow_call(b, s, h, cache_top, G, L, P, M)
                if st != OK:
                    if st == REJECT:
                        i = node_end[i]
                        continue
                    if st == MISSING:
                        incomplete = True
                        # a small subtree below a state not expanded yet (long tokens: runs of
                        # spaces or dashes) is expanded whole by Python, not one level per round
                        if i + 1 < node_end[i] <= i + CHAIN_NODES and trans[s * 256 + b] == -2:
                            _record_chain(M, i, s)
                        i = node_end[i]
                        continue
                    return st, nf
            ls_st[d] = t
            h_st[d] = h
            tok = node_tok[i]
            found[nf] = tok
            nf += 1 if tok >= 0 else 0
            i += 1
    return (MISSING if incomplete else OK), nf


@njit(nogil=True, cache=True)
def walk_trie(F, seg_skip, s0, h0, G, L, P, M, W):
    """Append to ``W.found`` every token of the trie allowed from lexer state ``s0`` over ``h0``
    rows, jumping over the forest segments ``k`` with ``seg_skip[k]`` (slices whose precomputed
    mask is used instead). ``F.node_tok[i]`` is the token ending at node ``i`` or -1: the append
    is branch-free. Returns (status, number found); status MISSING means some subtrees were
    skipped for want of lexer states (call again once they are built), GROW_* that an array is
    full."""
    seg_start = F.seg_start
    seg_end = F.seg_end
    n = F.node_byte.shape[0]
    n_seg = seg_start.shape[0]
    # the ranges walked: the segments not skipped and the nodes between segments
    R = np.empty((2 * n_seg + 1, 5), np.int64)
    nr = 0
    seg = 0
    i = 1
    while i < n:
        if seg < n_seg and i == seg_start[seg]:
            hi = seg_end[seg]
            seg += 1
            if seg_skip[seg - 1]:
                i = hi
                continue
        else:
            hi = seg_start[seg] if seg < n_seg else n
        R[nr, 0] = i
        R[nr, 1] = hi
        R[nr, 2] = -1
        nr += 1
        i = hi
    W.ls_st[0] = s0
    W.h_st[0] = h0
    return _walk_ranges(R, nr, F, G, L, P, M, W, 0, h0)


@njit(nogil=True, cache=True)
def _assemble(F, combo, can, tok_words, toks, W, nf, words):
    """The mask row from its parts: the precomputed mask of the skipped slices (``combo``), the
    words ``tok_words`` (if any) and tokens ``toks`` of a state's cache, the tokens the walk found
    (``W.found[:nf]``), then the tokens that share bytes with an allowed one, and the stop tokens
    (allowed iff ``can``)."""
    combo_words = F.combo_words[combo]
    found = W.found
    dup_first = F.dup_first
    dup_other = F.dup_other
    stop_ids = W.stop_ids
    nw = words.shape[0]
    if tok_words.shape[0] == nw:
        for j in range(nw):
            words[j] = combo_words[j] | tok_words[j]
    else:
        for j in range(nw):
            words[j] = combo_words[j]
    for k in range(toks.shape[0]):
        t = toks[k]
        words[t >> 5] |= np.uint32(1) << np.uint32(t & 31)
    for k in range(nf):
        t = found[k]
        words[t >> 5] |= np.uint32(1) << np.uint32(t & 31)
    for k in range(dup_first.shape[0]):
        f = dup_first[k]
        if (words[f >> 5] >> np.uint32(f & 31)) & np.uint32(1):
            o = dup_other[k]
            words[o >> 5] |= np.uint32(1) << np.uint32(o & 31)
    # a stop token is only ever a stop token (even if it also has text): allowed iff the grammar can end
    for k in range(stop_ids.shape[0]):
        t = stop_ids[k]
        if 0 <= t < nw * 32:
            if can:
                words[t >> 5] |= np.uint32(1) << np.uint32(t & 31)
            else:
                words[t >> 5] &= ~(np.uint32(1) << np.uint32(t & 31))


@njit(nogil=True, cache=True)
def fill_mask(F, seg_skip, s0, h0, lex_len, G, L, P, M, W, words):
    """One whole mask row into ``words`` (uint32, ``ceil(V/32)`` words): the precomputed mask
    of the skipped slices (``F.combo_words``), the tokens the trie walk finds, tokens that share
    bytes with a found one, and the stop tokens when the grammar can end. Returns a status."""
    st, nf = walk_trie(F, seg_skip, s0, h0, G, L, P, M, W)
    if st != OK:
        return st
    st, can = can_end(s0, h0, lex_len, G, L, P, M)
    if st != OK:
        return st
    combo = 0
    for k in range(seg_skip.shape[0]):
        if seg_skip[k]:
            combo |= 1 << k
    _assemble(F, combo, can, F.combo_words[0][:0], W.found[:0], W, nf, words)
    return OK


#: what :func:`~.state_cache.build_entry` finds for a lexer state (see :mod:`.state_cache`): the tokens reached by
#: lexer moves alone, as a list ``toks`` or as mask words ``tok_words`` (one of them empty), and
#: the trie nodes where a lexeme ends, grouped: group ``g`` is the byte ``grp_byte[g]`` read in the
#: accepting lexer state ``grp_state[g]`` at the nodes ``nodes[grp_off[g]:grp_off[g + 1]]``
StateCache = namedtuple("StateCache", "tok_words toks grp_state grp_byte grp_off nodes")


@njit(nogil=True, cache=True)
def fill_mask_cached(F, combo, C, s0, h0, lex_len, G, L, P, M, W, words):
    """:func:`fill_mask` from a state's cache ``C`` (:data:`StateCache`, built by
    :func:`~.state_cache.build_entry` for ``s0`` with the same slices skipped, ``combo``): the cached tokens as
    they are, one parser step per group of lexeme ends, and the subtrees of the groups the parser
    allows walked as the full walk would. The same row as :func:`fill_mask`."""
    trans = L.trans
    state_acc = L.state_acc
    n_states = trans.shape[0] // 256
    row_key = P.row_key
    row_ls = P.row_ls
    node_depth = F.node_depth
    node_end = F.node_end
    grp_state = C.grp_state
    grp_byte = C.grp_byte
    grp_off = C.grp_off
    nodes = C.nodes
    R = np.empty((nodes.shape[0], 5), np.int64)
    nr = 0
    cache_top = h0
    incomplete = False
    for g in range(grp_state.shape[0]):
        s = grp_state[g]
        b = grp_byte[g]
        # the byte after the lexeme: allowed by the row that scans it (groups are sorted by
        # accepted set, so the row is built once per set and then read)
        t = -2
        k = state_acc[s]
        if h0 < cache_top and row_key[h0] == k:
            s2 = row_ls[h0]
            if s2 >= 0 and s2 < n_states:
                t = trans[s2 * 256 + b]
        if t == -2:
            st, t, _h, cache_top = _step_slow_call(b, s, h0, cache_top, G, L, P, M)
            if st != OK:
                if st == REJECT:
                    continue
                if st == MISSING:
                    incomplete = True
                    continue
                return st
        if t < 0:
            continue
        for j in range(grp_off[g], grp_off[g + 1]):
            i = nodes[j]
            R[nr, 0] = i
            R[nr, 1] = node_end[i]
            R[nr, 2] = node_depth[i] - 1
            R[nr, 3] = s
            R[nr, 4] = h0
            nr += 1
    st, nf = _walk_ranges(R, nr, F, G, L, P, M, W, 0, cache_top)
    if st == MISSING or incomplete:
        return MISSING
    if st != OK:
        return st
    st, can = can_end(s0, h0, lex_len, G, L, P, M)
    if st != OK:
        return st
    _assemble(F, combo, can, C.tok_words, C.toks, W, nf, words)
    return OK


@njit(nogil=True, cache=True)
def advance_bytes(data, s, h, G, L, P, M, out):
    """Feed ``data`` from (``s``, ``h``); on OK, ``out = [state, height]``."""
    cache_top = h
    for i in range(data.shape[0]):
        st, s, h, cache_top = step_slow(data[i], s, h, cache_top, G, L, P, M)
        if st != OK:
            return st
    out[0] = s
    out[1] = h
    return OK


@njit(nogil=True, cache=True)
def can_end(s, h, lex_len, G, L, P, M):
    """(status, 1 if the grammar may end here else 0)."""
    if lex_len == 0:
        return OK, P.row_acc[h - 1]
    k = L.state_acc[s]
    if k < 0:
        return OK, 0
    if h + 2 > P.row_beg.shape[0]:
        return GROW_ROWS, 0
    st = compute_row(h, k, G, L, P, M)
    if st == REJECT:
        return OK, 0
    if st != OK:
        return st, 0
    return OK, P.row_acc[h]


@njit(nogil=True, cache=True)
def allowed_bytes(s, h, G, L, P, M, out):
    """``out[b] = 1`` for every byte that can come next. Returns a status."""
    cache_top = h
    incomplete = False
    trans = L.trans
    not_accepting = L.state_acc[s] < 0
    base = s * 256
    for b in range(256):
        # plain lexer moves and dead ends decided here: the slow step reads tuples (refcounts)
        t = trans[base + b]
        if t >= 0:
            out[b] = 1
            continue
        if t == -1 and not_accepting:
            out[b] = 0
            continue
        st, _t, _h, cache_top = step_slow(b, s, h, cache_top, G, L, P, M)
        out[b] = 1 if st == OK else 0
        if st == MISSING:
            incomplete = True
        elif st != OK and st != REJECT:
            return st
    return MISSING if incomplete else OK


@njit(nogil=True, cache=True)
def jump_forward(s, h, lex_len, G, L, P, M, buf, ok):
    """Bytes forced from (s, h): while exactly one byte is possible and the grammar cannot end.
    Writes them to ``buf``; returns (status, n). ``ok`` is a 256-byte scratch array."""
    n = 0
    while n < buf.shape[0]:
        st, e = can_end(s, h, lex_len, G, L, P, M)
        if st != OK:
            return st, n
        if e:
            break
        st = allowed_bytes(s, h, G, L, P, M, ok)
        if st != OK:
            return st, n
        only = -1
        cnt = 0
        for b in range(256):
            if ok[b]:
                cnt += 1
                only = b
        if cnt != 1:
            break
        st, s, h, _ct = step_slow(only, s, h, h, G, L, P, M)
        if st != OK:
            return st, n
        buf[n] = only
        n += 1
        lex_len += 1
    return OK, n
