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

from . import rowstore
from .earley import GROW_ROWS, MISSING, OK, REJECT, STOP_AT_MISSING, compute_row, resolve_row_start, row_top
from .lexdfa import FastCall  # noqa: F401 - defined there (the lexer uses it too), used from here
from .lexer import inline_resolve

#: a trie subtree of at most this many nodes skipped for a missing lexer state is recorded as a
#: chain (``MissingRequests.chains``): Python builds the states of all of it in the same round
CHAIN_NODES = 512


#: a matcher's buffers for :func:`fill_mask`: lexer state and height per trie depth
#: (``ls_st``, ``h_st``), the tokens found (``found``, one slot per trie token), the stop tokens
#: the subtrees the walk asks the state cache to keep (``req``: count, then (state, node) pairs)
#: and the walk's work stack (``stack``, :func:`walk_stack`)
WalkBuffers = namedtuple("WalkBuffers", "ls_st h_st found stop_ids req stack")


def walk_stack(depth: int, n_segments: int) -> np.ndarray:
    """The work stack of :func:`_walk_dfs` (``WalkBuffers.stack``): the forest's ranges, then at
    most two items (a continuation and a child) per trie depth."""
    return np.empty((4 * depth + 2 * n_segments + 9, 6), np.int64)


@njit(nogil=True, cache=True)
def _record_state(M, s):
    buf = M.states
    cnt = M.counts
    if cnt[0] and buf[cnt[0] - 1] == s:
        return      # the same state again (a row's 256 bytes: allowed_bytes)
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
def chain_frontier(F, trans, pairs, n_pairs, at, out, sub_depth, deep):
    """For the recorded chains ``pairs[2k], pairs[2k + 1]`` (trie node, lexer state): walk the
    node's subtree by plain lexer moves (``trans``) and write to ``out`` the states met that are
    not expanded yet (their subtrees are not walked); returns how many (at most ``out``'s size).
    ``at`` is scratch (one state per trie depth). ``deep[0]`` is set to the most bytes the trie
    still holds below any of those states (``sub_depth``: :func:`~.slicer.forest_sub_depth`), which bounds
    how far down a run of bytes the walk can go from them. Python expands them and calls again
    until none is left (:meth:`~.compiled.CompiledGrammar.resolve`)."""
    node_byte = F.node_byte
    node_depth = F.node_depth
    node_end = F.node_end
    n = 0
    most = 0
    for k in range(n_pairs):
        i = pairs[2 * k]
        s = pairs[2 * k + 1]
        t = trans[s * 256 + node_byte[i]]
        if t == -2:
            if n < out.shape[0]:
                out[n] = s
                n += 1
                r = sub_depth[i] - node_depth[i] + 1
                if r > most:
                    most = r
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
                    r = sub_depth[j] - d + 1
                    if r > most:
                        most = r
                j = node_end[j]
                continue
            if x < 0:
                j = node_end[j]
                continue
            at[d] = x
            j += 1
    deep[0] = most
    return n


@njit(nogil=True, cache=True)
def chain_expand(F, pairs, n_pairs, at, found, sub_depth, deep, rounds, budget, spec_rows, max_states, hard_max, X,
                 trans, state_acc, expanded, acc_off, acc_lex, D, buf, pbuf, ibuf, abuf, S, A, free, fqueue,
                 out, max_stored):
    """Rounds of :func:`chain_frontier` and the compiled expansion of the states it names
    (:func:`.rowstore.eager_expand_rows`, each round's seeds queued as
    :meth:`.Lexer._eager_expand` queues them, with a ladder as deep as the trie goes below them)
    until no state is left to build: a run of new states (a string whose count left makes every
    byte a state of its own, which no ladder walks) costs one call, not a Python round per byte.
    Returns ``(status, state, left)``: the expansion's status and state where it stopped for
    Python (rows, room: the queue is left as it is, to be finished first) or was full, with
    ``left`` 0; DONE with ``left`` 1 when ``rounds`` ran out (call again), 0 when none is left.
    ``found`` is scratch for the frontier (its size bounds a round, as ``D.queue``'s must);
    ``spec_rows`` is the expansion's (a Python bool: a literal ``False`` here would compile
    ``eager_expand_rows`` a second time, for this call site alone)."""
    cnt = D.cnt
    for _ in range(rounds):
        n = chain_frontier(F, trans, pairs, n_pairs, at, found, sub_depth, deep)
        if n == 0:
            return rowstore.DONE, 0, 0
        seeds = np.sort(found[:n])
        queue = D.queue
        k = 0
        for i in range(n):
            if (i == 0 or seeds[i] != seeds[i - 1]) and not expanded[seeds[i]]:
                queue[k] = seeds[i]
                k += 1
        cnt[4] = 0
        cnt[5] = k
        cnt[7] = 0
        cnt[8] = 0
        cnt[9] = 0
        cnt[10] = k
        ladder = max(1, min(deep[0], rowstore.MAX_LADDER))
        st, s = rowstore.eager_expand_rows(budget, spec_rows, max_states, hard_max, X, trans, state_acc, expanded,
                                           acc_off, acc_lex, D, buf, pbuf, ibuf, abuf, S, A, ladder, free,
                                           fqueue, out, max_stored)
        if st != rowstore.DONE or cnt[6] != 0:
            return st, s, 0
    return rowstore.DONE, 0, 1


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
    st, t, h2, cache_top = step_end(b, k, h, cache_top, G, L, P, M)
    return st, (t if st == OK else s), h2, cache_top


@njit(nogil=True, cache=True, inline="always")
def step_end(b, k, h, cache_top, G, L, P, M):
    """The byte ``b`` after a lexeme of the accepted set ``k`` ends (the lexer state it ended in
    is dead on ``b``) over ``h`` rows: the parser's row for ``k``, then ``b`` from its start
    state. Returns (status, state, height, cache_top); the state is -1 unless OK."""
    row_key = P.row_key
    row_ls = P.row_ls
    if h < cache_top and row_key[h] == k:
        s2 = row_ls[h]
        if s2 == -2:
            s2 = resolve_row_start(h, G, L, P, M)
    else:
        if h + 2 > P.row_beg.shape[0]:
            return GROW_ROWS, -1, h, cache_top
        st = compute_row(h, k, G, L, P, M)
        if st != OK:
            return st, -1, h, h
        cache_top = h + 1
        s2 = row_ls[h]
    if s2 == -2 or s2 * 256 >= L.trans.shape[0]:
        # not registered yet, or registered by another thread after our arrays were taken
        return MISSING, -1, h, cache_top
    if s2 < 0:
        return REJECT, -1, h, cache_top
    t = L.trans[s2 * 256 + b]
    if t == -2:
        _record_state(M, s2)
        return MISSING, -1, h, cache_top
    if t == -1:
        return REJECT, -1, h, cache_top
    return OK, t, h + 1, cache_top


@njit(nogil=True, cache=True)
def _step_slow_call(b, s, h, cache_top, G, L, P, M):
    """:func:`step_slow` as a real call, for :func:`walk_trie`: inlined there, its body (four
    structures of arrays) made the walk's hot loop about 10% slower; the call is taken rarely."""
    return step_slow(b, s, h, cache_top, G, L, P, M)


@njit(nogil=True, cache=True)
def _step_end_call(b, k, h, cache_top, G, L, P, M):
    """:func:`step_end` as a real call (as :func:`_step_slow_call`), for the state cache's groups."""
    return step_end(b, k, h, cache_top, G, L, P, M)


#: work items of :func:`_walk_dfs` (rows of 6 int64): a range of trie nodes ``[a, b)``, with the
#: lexer state ``d`` and height ``e`` set at depth ``c`` first when ``c >= 0``; an entry of the state
#: cache being read (``a``: -1 for the root entry, else the nested entry's id; ``b`` its current
#: group; ``c`` the next node of that group, -1 before the group is decided; ``d`` the height its
#: lexemes end at; ``e`` the lexer state the group's byte leads to); a nested entry to enter (its
#: tokens added, then read as an entry)
_RANGE = 0
_ENTRY = 1
_ENTER = 2
#: subtrees of at least this many nodes, walked below a lexeme end, are asked to be cached
#: (smaller ones cost less to walk than to look up)
NESTED_MIN_NODES = 24

#: the nested entries of the state cache (:mod:`.state_cache`): the subtree of trie node ``i``
#: read from lexer state ``t`` (the state a lexeme end there leads to) is entry
#: ``vals[slot]`` where ``keys[slot] == t << 32 | i`` (open addressing, -1 empty); entry ``e``
#: holds the tokens ``toks[e_tok_off[e]:e_tok_off[e + 1]]`` reached by lexer moves alone and the
#: groups ``e_grp_off[e] .. e_grp_off[e + 1] - 1`` of lexeme ends (as :data:`StateCache`'s, with
#: ``grp_node_off`` cutting ``nodes``)
NestedStore = namedtuple("NestedStore", "keys vals e_tok_off toks e_grp_off grp_acc grp_byte grp_node_off nodes")


@njit(nogil=True, cache=True, inline="always")
def _nested_slot(keys, t, i):
    """The slot of key ``(t, i)`` in ``keys`` (where it is, or the empty slot it would take)."""
    key = (np.int64(t) << 32) | np.int64(i)
    mask = keys.shape[0] - 1
    j = np.int64((np.uint64(key) * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(40)) & mask
    while keys[j] != -1 and keys[j] != key:
        j = (j + 1) & mask
    return j


@njit(nogil=True, cache=True, inline="always")
def _push(stack, sp, kind, a, b, c, d, e):
    stack[sp, 0] = kind
    stack[sp, 1] = a
    stack[sp, 2] = b
    stack[sp, 3] = c
    stack[sp, 4] = d
    stack[sp, 5] = e
    return sp + 1


@njit(nogil=True, cache=True)
def _walk_dfs(stack, sp, Cgp, Cacc, Cgb, Cgo, Cn, F, G, L, P, M, W, S, cache_top, XE):
    """The trie walk of a mask, as a depth-first loop over work items (``stack[:sp]``, see
    :data:`_RANGE`): node ranges walked node by node, and entries of the state cache (the root
    entry's groups ``Cgp``/``Cgb``/``Cgo``/``Cn`` with its accepted sets ``Cacc``, nested entries in
    ``S``) read group by group.
    Below a lexeme end whose subtree has a nested entry, the entry is read instead of the
    subtree; a walked subtree of :data:`NESTED_MIN_NODES` or more is asked for (``W.req``).
    Appends the tokens found to ``W.found``. Returns (status, number found): OK, MISSING when
    subtrees were skipped for want of lexer states (call again once they are built), or GROW_*
    (an array is full).

    Depth first, so that the parser rows an item was decided with are still there when its
    children are read; the arrays are taken out of their structures once here (inside the loop
    each access would count a reference)."""
    node_byte = F.node_byte
    node_depth = F.node_depth
    node_end = F.node_end
    node_tok = F.node_tok
    ls_st = W.ls_st
    h_st = W.h_st
    found = W.found
    req = W.req
    trans = L.trans
    state_acc = L.state_acc
    n_states = trans.shape[0] // 256
    row_key = P.row_key
    row_ls = P.row_ls
    s_keys = S.keys
    s_vals = S.vals
    s_tok_off = S.e_tok_off
    s_toks = S.toks
    s_grp_off = S.e_grp_off
    s_ga = S.grp_acc
    s_gb = S.grp_byte
    s_go = S.grp_node_off
    s_n = S.nodes
    n_req = (req.shape[0] - 1) // 2
    incomplete = False
    nf = 0
    while sp > 0:
        sp -= 1
        kind = stack[sp, 0]
        if kind == _ENTER:
            e = stack[sp, 1]
            for x in range(s_tok_off[e], s_tok_off[e + 1]):
                found[nf] = s_toks[x]
                nf += 1
            sp = _push(stack, sp, _ENTRY, e, s_grp_off[e], -1, stack[sp, 4], -2)
            continue
        if kind == _ENTRY:
            e = stack[sp, 1]
            g = stack[sp, 2]
            j = stack[sp, 3]
            h = stack[sp, 4]
            t = stack[sp, 5]
            # (scalars read from the root's or the store's arrays: an array variable assigned
            # in the loop would count references at every item)
            root = e < 0
            g_end = Cgp.shape[0] if root else s_grp_off[e + 1]
            while g < g_end:
                if j < 0:
                    # the byte after the lexeme: allowed by the row that scans it (groups are
                    # sorted by accepted set, so the row is built once per set and then read)
                    k = Cacc[Cgp[g]] if root else s_ga[g]
                    b = Cgb[g] if root else s_gb[g]
                    t = -2
                    if h < cache_top and row_key[h] == k:
                        s2 = row_ls[h]
                        if s2 >= 0 and s2 < n_states:
                            t = trans[s2 * 256 + b]
                    if t == -2:
                        m0, m1, m2 = M.counts[0], M.counts[1], M.counts[2]
                        st, t, _h, cache_top = _step_end_call(b, k, h, cache_top, G, L, P, M)
                        if st != OK:
                            if st == MISSING:
                                if inline_resolve(XE, M, m0, m1, m2):
                                    continue   # built in this call: the same group again
                                if M.counts[STOP_AT_MISSING]:
                                    return MISSING, nf
                                incomplete = True
                            elif st != REJECT:
                                return st, nf
                            t = -1
                    if t < 0:
                        g += 1
                        continue
                    j = Cgo[g] if root else s_go[g]
                if j >= (Cgo[g + 1] if root else s_go[g + 1]):
                    g += 1
                    j = -1
                    continue
                i = Cn[j] if root else s_n[j]
                j += 1
                d = node_depth[i]
                ls_st[d] = t
                h_st[d] = h + 1
                tok = node_tok[i]
                found[nf] = tok
                nf += 1 if tok >= 0 else 0
                end = node_end[i]
                if end > i + 1:
                    # the subtree below, before the rest of this entry
                    sp = _push(stack, sp, _ENTRY, e, g, j, h, t)
                    slot = _nested_slot(s_keys, t, i)
                    if s_keys[slot] != -1:
                        sp = _push(stack, sp, _ENTER, s_vals[slot], 0, 0, h + 1, 0)
                    else:
                        if end - i >= NESTED_MIN_NODES and req[0] < n_req:
                            req[1 + 2 * req[0]] = t
                            req[2 + 2 * req[0]] = i
                            req[0] += 1
                        sp = _push(stack, sp, _RANGE, i + 1, end, d, t, h + 1)
                    break
            continue
        # a range of nodes
        i = stack[sp, 1]
        hi = stack[sp, 2]
        if stack[sp, 3] >= 0:
            ls_st[stack[sp, 3]] = stack[sp, 4]
            h_st[stack[sp, 3]] = stack[sp, 5]
        while i < hi:
            d = node_depth[i]
            s = ls_st[d - 1]
            h0 = h_st[d - 1]
            h = h0
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
                m0, m1, m2 = M.counts[0], M.counts[1], M.counts[2]
                st, t, h, cache_top = _step_slow_call(b, s, h, cache_top, G, L, P, M)
                if st != OK:
                    if st == REJECT:
                        i = node_end[i]
                        continue
                    if st == MISSING:
                        if inline_resolve(XE, M, m0, m1, m2):
                            continue   # built in this call: the same node again
                        if M.counts[STOP_AT_MISSING]:
                            return MISSING, nf
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
            end = node_end[i]
            if h != h0 and end > i + 1:
                # a lexeme ended at this node: its subtree may be cached
                slot = _nested_slot(s_keys, t, i)
                if s_keys[slot] != -1:
                    if end < hi:
                        sp = _push(stack, sp, _RANGE, end, hi, -1, 0, 0)
                    sp = _push(stack, sp, _ENTER, s_vals[slot], 0, 0, h, 0)
                    break
                if end - i >= NESTED_MIN_NODES and req[0] < n_req:
                    req[1 + 2 * req[0]] = t
                    req[2 + 2 * req[0]] = i
                    req[0] += 1
            i += 1
    return (MISSING if incomplete else OK), nf


@njit(nogil=True, cache=True)
def walk_trie(F, seg_skip, s0, h0, G, L, P, M, W, S, XE):
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
    # the ranges walked: the segments not skipped and the nodes between segments, pushed last
    # first (each sets the start state at depth 0: the items before it may have changed it)
    stack = W.stack
    sp = 0
    i = n
    seg = n_seg - 1
    while i > 1:
        if seg >= 0 and i == seg_end[seg]:
            lo = seg_start[seg]
            if not seg_skip[seg]:
                sp = _push(stack, sp, _RANGE, lo, i, 0, s0, h0)
            seg -= 1
        else:
            lo = seg_end[seg] if seg >= 0 else 1
            sp = _push(stack, sp, _RANGE, lo, i, 0, s0, h0)
        i = lo
    W.req[0] = 0
    e32 = F.dup_first[:0]
    # no root entry: empty group arrays (views, nothing allocated)
    return _walk_dfs(stack, sp, e32, e32, e32, W.req[:0], e32, F, G, L, P, M, W, S,
                     row_top(P, h0), XE)


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
def fill_mask(F, seg_skip, s0, h0, lex_len, G, L, P, M, W, S, words, XE):
    """One whole mask row into ``words`` (uint32, ``ceil(V/32)`` words): the precomputed mask
    of the skipped slices (``F.combo_words``), the tokens the trie walk finds, tokens that share
    bytes with a found one, and the stop tokens when the grammar can end. Returns a status.
    ``XE``: None (the read-only variant: it builds nothing), or an expander
    (:meth:`.Lexer.inline_expander`): the walk then builds the lexer states it meets missing
    itself (:func:`~.lexer.inline_resolve`) and steps on, instead of skipping their subtrees for a
    Python round and a walk again."""
    st, nf = walk_trie(F, seg_skip, s0, h0, G, L, P, M, W, S, XE)
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
#: the trie nodes where a lexeme ends, grouped: group ``g`` is the byte ``grp_byte[g]`` read after
#: a lexeme of accepted set ``grp_pat[g]`` ends, at the nodes ``nodes[grp_off[g]:grp_off[g + 1]]``.
#: The groups' sets are numbered in the entry (``0 ..``, in order): a grammar reads it with its own
#: array of their ids in ``state_acc`` (entries are shared by grammars: :class:`~.state_cache.SharedEntries`)
StateCache = namedtuple("StateCache", "tok_words toks grp_pat grp_byte grp_off nodes")


@njit(nogil=True, cache=True)
def fill_mask_cached(F, combo, C, acc, s0, h0, lex_len, G, L, P, M, W, S, words, XE):
    """:func:`fill_mask` from a state's cache ``C`` (:data:`StateCache`, built by
    :func:`~.state_cache.build_entry` for ``s0`` with the same slices skipped, ``combo``; ``acc``:
    the ids of its accepted sets in this lexer): the cached tokens as they are, one parser step
    per group of lexeme ends, and below the groups the parser allows, nested entries or the
    subtrees walked as the full walk would. The same row as :func:`fill_mask`."""
    stack = W.stack
    sp = _push(stack, 0, _ENTRY, -1, 0, -1, h0, -2)
    W.req[0] = 0
    st, nf = _walk_dfs(stack, sp, C.grp_pat, acc, C.grp_byte, C.grp_off, C.nodes, F, G, L, P, M, W, S,
                       row_top(P, h0), XE)
    if st != OK:
        return st
    st, can = can_end(s0, h0, lex_len, G, L, P, M)
    if st != OK:
        return st
    _assemble(F, combo, can, C.tok_words, C.toks, W, nf, words)
    return OK


@njit(nogil=True, cache=True)
def advance_bytes(data, s, h, G, L, P, M, out, XE):
    """Feed ``data`` from (``s``, ``h``); on OK, ``out = [state, height]``. ``XE``: as
    :func:`fill_mask`'s (with an expander, a state missing on the way is built here)."""
    cache_top = row_top(P, h)
    i = 0
    n = data.shape[0]
    # the requests when a step fails are those at entry: a failed step returns at once, unless
    # what it recorded was built and taken back
    m0, m1, m2 = M.counts[0], M.counts[1], M.counts[2]
    while i < n:
        st, s2, h2, cache_top = step_slow(data[i], s, h, cache_top, G, L, P, M)
        if st != OK:
            if st == MISSING and inline_resolve(XE, M, m0, m1, m2):
                continue   # built: the same byte again
            return st
        s = s2
        h = h2
        i += 1
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
    cache_top = row_top(P, h)
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
def _probe_live(s, h, lex_len, nfirst, nend, k, G, L, P, M, rest):
    """(status, whether one of the bytes set in ``nfirst[k]`` may come next from (s, h), or the
    grammar may end there while ``nend[k]``; whether the lexer alone read such a byte, asking the
    parser nothing). The lexer's own moves are tried first; ``rest`` (256 entries, scratch) gets
    the bytes only the parser can decide."""
    not_accepting = L.state_acc[s] < 0
    n = 0
    for w in range(8):
        v = nfirst[k, w]
        while v:
            low = v & (~v + np.uint32(1))
            b = w * 32 + _low_bit(low)
            v ^= low
            t = L.trans[s * 256 + b]
            if t >= 0:
                return OK, True, True
            if t == -1 and not_accepting:
                continue
            rest[n] = b
            n += 1
    if nend[k]:
        st, e = can_end(s, h, lex_len, G, L, P, M)
        if st != OK:
            return st, False, False
        if e:
            return OK, True, False
    cache_top = row_top(P, h)
    incomplete = False
    for i in range(n):
        st, _t, _h, cache_top = step_slow(rest[i], s, h, cache_top, G, L, P, M)
        if st == OK:
            return OK, True, False
        if st == MISSING:
            incomplete = True
        elif st != REJECT:
            return st, False, False
    return (MISSING if incomplete else OK), False, False


@njit(nogil=True, cache=True, inline="always")
def _low_bit(x):
    """The index of the only set bit of ``x`` (uint32)."""
    i = 0
    while x > np.uint32(1):
        x >>= np.uint32(1)
        i += 1
    return i


#: a probe of :func:`forced_after` after which more bytes than this may come is not reported (inside
#: a string most bytes may: what follows a space there is almost never confined, and reading every
#: space token of every string position cost ~5x a plain mask)
NARROW_MAX_BYTES = 64


@njit(nogil=True, cache=True, inline="always")
def _bits_of(ok, nxt, j):
    """Row ``j`` of ``nxt`` (8 words) := the bytes ``b`` with ``ok[b]`` set, as bits."""
    for w in range(8):
        nxt[j, w] = 0
    for b in range(256):
        if ok[b]:
            nxt[j, b >> 5] |= np.uint32(1) << np.uint32(b & 31)


@njit(nogil=True, cache=True, inline="always")
def _lexer_moves(L, s, order):
    """The bytes lexer state ``s`` reads by a lexer move, scanned in ``order``: (how many, capped
    at 2; the last one of them), or (-1, -1) when its row is not built yet."""
    only = -1
    cnt = 0
    base = s * 256
    for k in range(256):
        x = L.trans[base + order[k]]
        if x == -2:
            return -1, -1
        if x != -1:
            cnt += 1
            only = order[k]
            if cnt == 2:
                break
    return cnt, only


@njit(nogil=True, cache=True, inline="always")
def _only_byte(ok):
    """(how many bytes ``ok`` allows, capped at 2; the last one of them)."""
    only = -1
    cnt = 0
    for b in range(256):
        if ok[b]:
            cnt += 1
            only = b
            if cnt == 2:
                break
    return cnt, only


@njit(nogil=True, cache=True)
def jump_forward(s, h, lex_len, G, L, P, M, buf, ok, XE):
    """Bytes forced from (s, h): while exactly one byte is possible and the grammar cannot end.
    Writes them to ``buf``; returns (status, n). ``ok`` is a 256-byte scratch array. ``XE``: as
    :func:`fill_mask`'s (with an expander, the states met on the way are built here, where the
    read-only variant needs a Python round for each byte of forced text that meets one)."""
    n = 0
    while n < buf.shape[0]:
        m0, m1, m2 = M.counts[0], M.counts[1], M.counts[2]
        st, e = can_end(s, h, lex_len, G, L, P, M)
        if st != OK:
            if st == MISSING and inline_resolve(XE, M, m0, m1, m2):
                continue
            return st, n
        if e:
            break
        st = allowed_bytes(s, h, G, L, P, M, ok)
        if st != OK:
            if st == MISSING and inline_resolve(XE, M, m0, m1, m2):
                continue
            return st, n
        cnt, only = _only_byte(ok)
        if cnt != 1:
            break
        st, s2, h2, _ct = step_slow(only, s, h, h, G, L, P, M)
        if st != OK:
            if st == MISSING and inline_resolve(XE, M, m0, m1, m2):
                continue
            return st, n
        s, h = s2, h2
        buf[n] = only
        n += 1
        lex_len += 1
    return OK, n


#: :func:`forced_after` puts this many candidates or more in byte order through a bit set of their
#: ranks (a pass over the vocabulary's words), fewer through a comparison sort (argsort: ~21 us
#: for 1,800 candidates)
SORT_BY_BITS = 128


@njit(nogil=True, cache=True)
def _end_row(k, h, cache_top, G, L, P, M):
    """(status, cache_top): row ``h``, where a lexeme of the accepted set ``k`` ends over ``h``
    rows, taken from the rows below ``cache_top`` where its key matches (as :func:`step_end`),
    else built (REJECT: no item advances; cache_top is then ``h``)."""
    if h < cache_top and P.row_key[h] == k:
        return OK, cache_top
    if h + 2 > P.row_beg.shape[0]:
        return GROW_ROWS, cache_top
    st = compute_row(h, k, G, L, P, M)
    return st, (h + 1 if st == OK else h)


@njit(nogil=True, cache=True)
def _row_start(k, h, cache_top, G, L, P, M):
    """(status, the lexer state the parser starts the next lexeme in after a lexeme of the
    accepted set ``k`` ends over ``h`` rows (< 0: none), cache_top): :func:`step_end`'s first
    half."""
    st, cache_top = _end_row(k, h, cache_top, G, L, P, M)
    if st != OK:
        return st, -1, cache_top
    s2 = P.row_ls[h]
    if s2 == -2:
        s2 = resolve_row_start(h, G, L, P, M)
    return OK, s2, cache_top


@njit(nogil=True, cache=True)
def _end_and_bytes(s, h, G, L, P, M, out):
    """(:func:`can_end`, :func:`allowed_bytes`) at (s, h) after at least one byte of the lexeme:
    the row the lexeme would end in built once, then read for every byte the lexer does not."""
    trans = L.trans
    k = L.state_acc[s]
    s2 = -1
    e = 0
    if k >= 0:
        st, s2, _ct = _row_start(k, h, h, G, L, P, M)     # (built anew, as can_end does)
        if st == OK:
            e = P.row_acc[h]
            if s2 == -2 or s2 * 256 >= trans.shape[0]:
                # not registered yet (recorded), or by another thread after our arrays were taken
                return MISSING, 0
        elif st != REJECT:
            return st, 0
    incomplete = False
    base = s * 256
    for b in range(256):
        t = trans[base + b]
        if t >= 0:
            out[b] = 1
            continue
        out[b] = 0
        if t == -2:
            _record_state(M, s)
            incomplete = True
        elif s2 >= 0:
            t2 = trans[s2 * 256 + b]
            if t2 >= 0:
                out[b] = 1
            elif t2 == -2:
                _record_state(M, s2)
                incomplete = True
    return (MISSING if incomplete else OK), e


@njit(nogil=True, cache=True)
def _end_fans_out(s, h, cache_top, G, L, P, M, order):
    """Whether the text may end at (s, h) or two bytes or more may come next: (status, 2 if so,
    else how many bytes may come (0 or 1), cache_top). The row the lexeme of ``s`` ends in is
    taken from the rows below ``cache_top`` where its key matches (as :func:`step_end`), else
    built; the bytes are scanned in ``order`` and the scan stops at the second one."""
    k = L.state_acc[s]
    if k >= 0:
        st, cache_top = _end_row(k, h, cache_top, G, L, P, M)
        if st != OK and st != REJECT:
            return st, 0, cache_top
        if st == OK and P.row_acc[h]:
            return OK, 2, cache_top
    trans = L.trans
    base = s * 256
    cnt = 0
    incomplete = False
    for i in range(256):
        b = order[i]
        t = trans[base + b]
        if t == -1 and k < 0:
            continue
        if t >= 0:
            st = OK
        else:
            st, _t, _h, cache_top = step_slow(b, s, h, cache_top, G, L, P, M)
        if st == OK:
            cnt += 1
            if cnt == 2:
                return OK, 2, cache_top
        elif st == MISSING:
            incomplete = True
        elif st != REJECT:
            return st, 0, cache_top
    return (MISSING if incomplete else OK), cnt, cache_top


@njit(nogil=True, cache=True)
def forced_after(s, h, lex_len, G, L, P, M, words, pool, slot_of, probe, nidx, nfirst, nend, nknown, nfresh, nlive,
                 rank, by_rank, data, off, order, ok, cand, out_n, hit, flen, fbuf, nxt, XE):
    """The bytes the grammar forces right after each candidate token read from (s, h): the
    candidates are the set bits of ``words`` not known to have nothing forced after them (token
    ``t``'s bytes being ``data[off[t]:off[t + 1]]``; what is known: below). A candidate after which something is forced (as
    :func:`jump_forward` from there, at most ``fbuf.shape[1]`` bytes) or that the grammar rejects
    is a hit: hit ``j`` is token ``hit[j]``, its forced bytes ``fbuf[j, :flen[j]]`` (``flen[j]``
    -1: rejected) and the bytes that may follow them as bits in ``nxt[j]`` (8 words);
    ``out_n[0]`` counts the hits, ``out_n[1]`` is set when there were more than the arrays hold.
    A candidate read by lexer moves alone, after which the lexer alone reads two bytes, has no
    forced text from any parser state over lexer state ``s``: its bit is set in ``skip``, row
    ``slot_of[s]`` of ``pool`` (a fact of ``s``, kept by the caller; no row: nothing known, nothing
    kept). The same holds after the lexeme of ``s`` ends: a candidate whose first byte ends it
    (``s`` reads no such byte) is read from the lexer state that the parser starts the next
    lexeme in, ``s2``, and its bit in ``s2``'s row is the same fact of ``s2``: read from there,
    and set there when the lexer alone read it (``out_n[2]``: ``s2`` where it has no row yet, for
    the caller to give it one; else -1; ``out_n[3]``: how many candidates were read, added to
    what it held: calls repeated by the driver add up). Rows above ``h`` are scratch, so every
    candidate starts from the same parser state. ``cand`` is scratch (one entry per token). A candidate whose bit is set
    in ``probe`` and after which nothing is forced is a hit too: ``flen[j]`` 0, or -2 when the
    grammar may end right after it, and ``nxt[j]`` the bytes that may follow it (the one-step
    lookahead of the canonical mode). A probe whose verdict the caller can give from what may
    follow (``nknown[nidx[t]]``: the first bytes ``nfirst[nidx[t]]`` of what may come canonically
    after it, ``nend[nidx[t]]`` whether the text may end after it) is decided here, reading only
    those bytes: not reported when one of them may come next (or both may end), else reported
    with ``flen`` -3 (to be dropped). Such a probe read by lexer moves alone, whose row is its
    row after a certain boundary (``nfresh[nidx[t]]``: the same in every region it is read after)
    and after which the lexer alone reads one of those bytes, is viable from every parser state
    over lexer state ``s``: its bit is set in ``nlive`` (a fact of ``s``, kept by the caller, as
    ``skip``). Returns a status (OK, or what the driver must build before
    calling again). ``XE``: as :func:`fill_mask`'s (with an expander, the states met are built
    as they are met: the forced text after a new structure meets one per byte, each a Python
    round of the read-only variant)."""
    out_n[0] = 0
    out_n[1] = 0
    out_n[2] = -1
    slot2 = -1
    slot = slot_of[s] if s < slot_of.shape[0] else -1
    skip = pool[slot] if slot >= 0 else pool[0]     # (read only where slot >= 0)
    n = 0
    for w in range(words.shape[0]):
        v = words[w]
        if slot >= 0:
            v &= ~skip[w] | probe[w]
        if v:
            for k in range(32):
                if (v >> np.uint32(k)) & np.uint32(1):
                    cand[n] = w * 32 + k
                    n += 1
    cache_top = row_top(P, h)
    k0 = L.state_acc[s]
    incomplete = False
    base = s * 256
    if n and k0 >= 0 and h + 2 <= P.row_beg.shape[0]:
        ends = False
        for i in range(n):
            t = cand[i]
            if off[t + 1] > off[t] and L.trans[base + data[off[t]]] == -1:
                ends = True
                break
        if ends:
            # the lexer state the next lexeme starts in when the lexeme of s ends (its row
            # computed now, as the first candidate ending it would: kept for the candidates)
            m0, m1, m2 = M.counts[0], M.counts[1], M.counts[2]
            st2, s2, cache_top = _row_start(k0, h, cache_top, G, L, P, M)
            if st2 == MISSING and inline_resolve(XE, M, m0, m1, m2):
                st2, s2, cache_top = _row_start(k0, h, cache_top, G, L, P, M)
            if st2 == MISSING:
                incomplete = True       # (the driver builds it: the candidates go on without it)
            elif st2 != OK and st2 != REJECT:
                return st2
            if st2 == OK and s2 >= 0 and s2 * 256 < L.trans.shape[0]:
                slot2 = slot_of[s2] if s2 < slot_of.shape[0] else -1
                if slot2 < 0:
                    out_n[2] = s2
                else:
                    # known after the lexeme of s ends, where the first byte ends it
                    row2 = pool[slot2]
                    kept = 0
                    for i in range(n):
                        t = cand[i]
                        w = t >> 5
                        bit = np.uint32(1) << np.uint32(t & 31)
                        if not (row2[w] & bit and not probe[w] & bit and off[t + 1] > off[t]
                                and L.trans[base + data[off[t]]] == -1):
                            cand[kept] = t
                            kept += 1
                    n = kept
    out_n[3] += n
    if n == 0:
        return MISSING if incomplete else OK
    # candidates in byte order share their common prefix with the one before: the states along
    # the previous one's bytes are kept (rows below a state's height are never rebuilt by the
    # steps after it; the rows a candidate built stay valid for the next one where their keys
    # match, as in the trie walk: a row is a function of the rows below it and its key)
    longest = 0
    for i in range(n):
        longest = max(longest, off[cand[i] + 1] - off[cand[i]])
    inorder = np.empty(n, np.int64)
    if n >= SORT_BY_BITS:
        # many: their ranks as bits, read back in order (no comparison sort)
        rb = np.zeros((by_rank.shape[0] + 31) >> 5, np.uint32)
        for i in range(n):
            r = rank[cand[i]]
            rb[r >> 5] |= np.uint32(1) << np.uint32(r & 31)
        j = 0
        for w in range(rb.shape[0]):
            v = rb[w]
            while v:
                low = v & (~v + np.uint32(1))
                v ^= low
                inorder[j] = by_rank[w * 32 + _low_bit(low)]
                j += 1
    else:
        rk = np.empty(n, np.int64)
        for i in range(n):
            rk[i] = rank[cand[i]]
        byrank = np.argsort(rk)
        for i in range(n):
            inorder[i] = cand[byrank[i]]
    rest = np.empty(256, np.int64)      # (_probe_live's scratch)
    ps = np.empty(longest + 1, np.int64)
    ph = np.empty(longest + 1, np.int64)
    ps[0] = s
    ph[0] = h
    prev = -1
    prev_ok = 0         # states known along the previous candidate's bytes, ps[0..prev_ok]
    nh = 0
    # a state not built yet is recorded and its candidate passed over: the driver builds all of
    # them and calls again (once or twice, not once per state)
    for i in range(n):
        t = inorder[i]
        a = off[t]
        ln = off[t + 1] - a
        d = 0
        if prev >= 0:
            pa = off[prev]
            lim = min(ln, prev_ok, off[prev + 1] - pa)
            while d < lim and data[a + d] == data[pa + d]:
                d += 1
        cs = ps[d]
        ch = ph[d]
        if d:
            # the rows below ch are the shared prefix's; row ch is a function of them and its key
            # (kept where the key matches, as the steps do)
            cache_top = min(cache_top, ch + 1)
        rejected = False
        missing = False
        k = d
        while k < ln:
            m0, m1, m2 = M.counts[0], M.counts[1], M.counts[2]
            st, cs2, ch2, cache_top = step_slow(data[a + k], cs, ch, cache_top, G, L, P, M)
            if st == REJECT:
                rejected = True
                break
            if st == MISSING:       # recorded: the next candidates go on, the call is repeated
                if inline_resolve(XE, M, m0, m1, m2):
                    continue        # built: the same byte again
                missing = True
                break
            cs, ch = cs2, ch2
            if st != OK:
                return st
            k += 1
            ps[k] = cs
            ph[k] = ch
        prev = t
        prev_ok = k
        if missing:
            incomplete = True
            continue
        if not rejected:
            # two bytes the lexer alone can read next: nothing is forced (most candidates; the
            # bytes in ``order``, whitespace, quote, digits and letters first, so the scan usually
            # stops after a few). A row not expanded yet is expanded first
            live, _b = _lexer_moves(L, cs, order)
            if live < 0:
                m0, m1, m2 = M.counts[0], M.counts[1], M.counts[2]
                _record_state(M, cs)
                if inline_resolve(XE, M, m0, m1, m2):
                    live, _b = _lexer_moves(L, cs, order)
            if live < 0:
                incomplete = True
                continue
            if live == 2:
                if ch == h:
                    if slot >= 0:
                        skip[t >> 5] |= np.uint32(1) << np.uint32(t & 31)
                elif slot2 >= 0 and ch == h + 1 and ph[1] == h + 1:
                    # the lexeme of s ended at the first byte, the rest read by lexer moves
                    pool[slot2, t >> 5] |= np.uint32(1) << np.uint32(t & 31)
                if not (probe[t >> 5] >> np.uint32(t & 31)) & np.uint32(1):
                    continue
                # a probe whose verdict is known is decided here; an unknown one goes on to the
                # loop below, which stops at once (nothing is forced) and reports what may follow
                k = nidx[t]
                if k >= 0 and nknown[k]:
                    cache_top = min(cache_top, ch)
                    m0, m1, m2 = M.counts[0], M.counts[1], M.counts[2]
                    st, live, by_lexer = _probe_live(cs, ch, lex_len + ln, nfirst, nend, k, G, L, P, M, rest)
                    while st == MISSING and inline_resolve(XE, M, m0, m1, m2):
                        st, live, by_lexer = _probe_live(cs, ch, lex_len + ln, nfirst, nend, k, G, L, P, M, rest)
                    if st == MISSING:
                        incomplete = True
                        continue
                    if st != OK:
                        return st
                    if live:
                        if by_lexer and ch == h and nfresh[k]:
                            nlive[t >> 5] |= np.uint32(1) << np.uint32(t & 31)
                        continue
                    if nh == flen.shape[0]:
                        out_n[1] = 1
                        continue
                    flen[nh] = -3
                    hit[nh] = t
                    nh += 1
                    out_n[0] = nh
                    continue
        if nh == flen.shape[0]:
            out_n[1] = 1
            continue
        if rejected:
            flen[nh] = -1
        else:
            # jump_forward's loop, keeping the state it ends in
            ll = lex_len + ln
            m = 0
            if not (probe[t >> 5] >> np.uint32(t & 31)) & np.uint32(1):
                # most candidates end where two bytes may come (or the text may end): asked with
                # the row the lexeme would end in kept (between candidates too), the scan
                # stopping at the second byte; one byte alone goes on below
                m0, m1, m2 = M.counts[0], M.counts[1], M.counts[2]
                st, cnt, cache_top = _end_fans_out(cs, ch, cache_top, G, L, P, M, order)
                if st == MISSING and inline_resolve(XE, M, m0, m1, m2):
                    st, cnt, cache_top = _end_fans_out(cs, ch, cache_top, G, L, P, M, order)
                if st == MISSING:
                    incomplete = True
                    continue
                if st != OK:
                    return st
                if cnt >= 2:
                    continue
            cache_top = min(cache_top, ch)   # the loop rebuilds the rows from ch up
            while True:
                if m < fbuf.shape[1] and L.state_acc[cs] < 0:
                    # inside a lexeme that cannot end here (``ull`` after ``n``): one lexer move
                    # is the only byte, no parser question (a row not built: the parser's way)
                    cnt, only = _lexer_moves(L, cs, order)
                    if cnt == 1:
                        cs = L.trans[cs * 256 + only]
                        fbuf[nh, m] = only
                        m += 1
                        ll += 1
                        continue
                m0, m1, m2 = M.counts[0], M.counts[1], M.counts[2]
                st, e = _end_and_bytes(cs, ch, G, L, P, M, ok)
                if st != OK:
                    if st == MISSING and inline_resolve(XE, M, m0, m1, m2):
                        continue
                    return st
                cnt, only = _only_byte(ok)
                if e or cnt != 1 or m == fbuf.shape[1]:
                    break
                st, cs2, ch2, _ct = step_slow(only, cs, ch, ch, G, L, P, M)
                if st != OK:
                    if st == MISSING and inline_resolve(XE, M, m0, m1, m2):
                        continue
                    return st
                cs, ch = cs2, ch2
                fbuf[nh, m] = only
                m += 1
                ll += 1
            if m == 0:
                if not (probe[t >> 5] >> np.uint32(t & 31)) & np.uint32(1) or np.count_nonzero(ok) > NARROW_MAX_BYTES:
                    continue
                flen[nh] = -2 if e else 0       # a probe: what may follow it
            else:
                flen[nh] = m
            _bits_of(ok, nxt, nh)
        hit[nh] = t
        nh += 1
        out_n[0] = nh
    return MISSING if incomplete else OK
