"""Per lexer state, the part of a mask that does not depend on the parser (xgrammar's adaptive
token mask cache, on our lexer states; see docs/mask.md, "The state cache").

A mask from lexer state ``s`` walks the token trie (:func:`~.mask.walk_trie`). Most of what the
walk decides depends on ``s`` alone: a node reached by lexer moves only is allowed whatever the
parser says, and a dead lexer move kills its subtree whatever the parser says. The parser takes
part only where a lexeme ends inside a token (the next byte cannot extend it), and only there does
the answer depend on the parse stack. So, for a state met again, :func:`build_entry` walks the
trie once with lexer moves alone and keeps

- the tokens reached by lexer moves alone (a list, or mask words when there are many),
- the nodes where a lexeme ends, grouped by (accepted set, byte): one parser step decides a
  whole group, and a group's subtrees are walked (as the full walk would) only when it is allowed.

:func:`~.mask.fill_mask_cached` then gives the same row as the full walk, with dead subtrees and
lexer-only paths gone. In a JSON string the full walk visits ~4,000 nodes of the Llama-3 trie
that the slices do not cover; the cached mask reads ~300 tokens and decides ~75 groups.

Below a lexeme end the walk goes on from the state the parser's row gives (``t``), over the
subtree of that trie node ``i``: again parser-independent up to its own lexeme ends. So walks ask
for such subtrees (:data:`~.mask.NESTED_MIN_NODES` nodes or more) and one asked for
:data:`NESTED_BUILD_AFTER` times becomes a *nested entry* keyed by ``(t, i)``, read by both mask
kernels in place of the subtree (:data:`~.mask.NestedStore`: one flat store per generation,
written in place after its last entry with the key last, republished whole when an array grows).

A state is cached on its second visit (:data:`BUILD_AFTER`), when its scan meets no lexer state
that is not expanded yet (otherwise the scan is retried at later visits, a power of two apart).
Lexer states only ever grow transitions, so an entry stays valid for the lexer generation it was
built in; the cache belongs to that generation (``lexer.mask_cache``) and goes with it. Its
arrays are bounded per generation by :data:`MAX_CACHE_BYTES` (past it, further states are not
cached) and counted by the grammar's :meth:`~.compiled.CompiledGrammar.held_bytes`.

Entries are shared by the grammars of an ExprSet (:class:`SharedEntries`): a state whose member
expressions another grammar cached takes that entry at its first visit, mapping its groups'
accepted sets to its own lexemes.
"""
from __future__ import annotations

import threading
import weakref

import numpy as np
from numba import njit

from .earley import MISSING, OK
from .kstruct import kstruct, pack, unpack
from .lexdfa import grown
from .mask import FastCall, NestedStore, StateCache, _nested_slot

#: a state is cached on this visit (the first visit of most states is also their last)
BUILD_AFTER = 2
#: bytes of cached arrays per lexer generation, past which no more states are cached
MAX_CACHE_BYTES = 32 << 20
#: per-state Python overhead counted with the arrays (the entry, its tuple and dict slot)
ENTRY_BYTES = 400
#: bytes of shared entries (see :class:`SharedEntries`) per ExprSet and tokenizer, past which no
#: more are shared
MAX_SHARED_BYTES = 64 << 20
#: a subtree below a lexeme end is cached when a walk asks for it this many times
NESTED_BUILD_AFTER = 2
#: per nested entry: its key, offsets and the count of requests before it was built
NESTED_ENTRY_BYTES = 160
#: subtrees whose requests are counted before the counts are dropped (a hash table of 12-byte
#: slots, at most half full: 3 MB at most)
MAX_ASKED = 100_000


@njit(nogil=True, cache=True)
def _scan(F, lo, hi, d0, s0, trans, state_acc, ls_st, toks, nodes, states, nt, nb):
    """The part of the walk of trie nodes ``lo .. hi - 1`` (whole subtrees), read from lexer
    state ``s0`` at depth ``d0`` (the depth above the range's top nodes), that the parser takes
    no part in: the tokens reached by lexer moves alone (appended to ``toks`` from ``nt``), and
    the nodes where a lexeme ends (appended to ``nodes`` from ``nb``, the accepting state before
    each in ``states``; their subtrees are not entered). Dead subtrees are dropped. Returns
    (status, nt, nb): OK, or MISSING when a state met is not expanded yet (the scan is
    incomplete and must not be used)."""
    node_byte = F.node_byte
    node_depth = F.node_depth
    node_end = F.node_end
    node_tok = F.node_tok
    ls_st[d0] = s0
    i = lo
    while i < hi:
        d = node_depth[i]
        s = ls_st[d - 1]
        t = trans[s * 256 + node_byte[i]]
        if t >= 0:
            ls_st[d] = t
            tok = node_tok[i]
            toks[nt] = tok
            nt += 1 if tok >= 0 else 0
            i += 1
            continue
        if t == -2:
            return MISSING, nt, nb
        if state_acc[s] >= 0:
            nodes[nb] = i
            states[nb] = s
            nb += 1
        i = node_end[i]
    return OK, nt, nb


@njit(nogil=True, cache=True)
def _groups(F, state_acc, nodes, states, nb):
    """The lexeme ends ``nodes[:nb]`` (accepting states ``states``) sorted by (accepted set,
    byte), stably (the trie's order within a group), and cut into groups of equal accepted set
    and byte: (group accepted sets, group bytes, group offsets, nodes). Only the accepted set
    matters at a lexeme end: the state is dead on the byte (so states that accept alike share
    a group, and one parser step decides it)."""
    node_byte = F.node_byte
    key = np.empty(nb, np.int64)
    for j in range(nb):
        key[j] = (np.int64(state_acc[states[j]]) << 8) | np.int64(node_byte[nodes[j]])
    order = np.argsort(key, kind="mergesort")
    out_nodes = np.empty(nb, np.int32)
    n_grp = 0
    for j in range(nb):
        out_nodes[j] = nodes[order[j]]
        if j == 0 or key[order[j]] != key[order[j - 1]]:
            n_grp += 1
    grp_acc = np.empty(n_grp, np.int32)
    grp_byte = np.empty(n_grp, np.int32)
    grp_off = np.empty(n_grp + 1, np.int64)
    g = -1
    for j in range(nb):
        if j == 0 or key[order[j]] != key[order[j - 1]]:
            g += 1
            grp_acc[g] = state_acc[states[order[j]]]
            grp_byte[g] = node_byte[out_nodes[j]]
            grp_off[g] = j
    grp_off[n_grp] = nb
    return grp_acc, grp_byte, grp_off, out_nodes


@njit(nogil=True, cache=True)
def _runs(acc):
    """The runs of equal values of ``acc`` (the groups' accepted sets, sorted): (the value of
    each run, the run of each element)."""
    n = acc.shape[0]
    run = np.empty(n, np.int32)
    r = -1
    for j in range(n):
        if j == 0 or acc[j] != acc[j - 1]:
            r += 1
        run[j] = r
    ids = np.empty(r + 1, np.int32)
    for j in range(n):
        ids[run[j]] = acc[j]
    return ids, run


@njit(nogil=True, cache=True)
def build_entry(F, seg_skip, s0, trans, state_acc, ls_st, toks, nodes, states):
    """The :data:`~.mask.StateCache` of lexer state ``s0``: the whole trie but the skipped
    slices (``toks``, ``nodes``, ``states``, ``ls_st``: scratch, one slot per trie token, node,
    node and depth). Returns (status, cache, the ids of its accepted sets in ``state_acc``): OK,
    or MISSING when a state met is not expanded yet (the cache is then empty and unused). The
    tokens are kept as a list, or as mask words when there are more of them than words."""
    n_words = F.combo_words.shape[1]
    seg_start = F.seg_start
    seg_end = F.seg_end
    n_seg = seg_start.shape[0]
    n = F.node_byte.shape[0]
    st = OK
    nt = 0
    nb = 0
    seg = 0
    i = 1
    while i < n and st == OK:
        # the segments not skipped and the nodes between segments
        if seg < n_seg and i == seg_start[seg]:
            hi = seg_end[seg]
            seg += 1
            if seg_skip[seg - 1]:
                i = hi
                continue
        else:
            hi = seg_start[seg] if seg < n_seg else n
        st, nt, nb = _scan(F, i, hi, 0, s0, trans, state_acc, ls_st, toks, nodes, states, nt, nb)
        i = hi
    if st != OK:
        nb = 0
        nt = 0
    grp_acc, grp_byte, grp_off, out_nodes = _groups(F, state_acc, nodes, states, nb)
    acc, grp_pat = _runs(grp_acc)   # (groups are sorted by accepted set)
    if nt > n_words:
        tok_words = np.zeros(n_words, np.uint32)
        for j in range(nt):
            t = toks[j]
            tok_words[t >> 5] |= np.uint32(1) << np.uint32(t & 31)
        tok_list = np.empty(0, np.int32)
    else:
        tok_words = np.empty(0, np.uint32)
        tok_list = toks[:nt].copy()
    return st, StateCache(tok_words, tok_list, grp_pat, grp_byte, grp_off, out_nodes), acc


@njit(nogil=True, cache=True)
def build_nested(F, t, i, trans, state_acc, ls_st, toks, nodes, states):
    """A nested entry: the subtree of trie node ``i`` read from lexer state ``t`` (the state a
    lexeme end at ``i`` leads to). Returns (status, tokens, group states, group bytes, group
    offsets, nodes), as :func:`build_entry`'s (tokens always as a list)."""
    st, nt, nb = _scan(F, i + 1, F.node_end[i], F.node_depth[i], t, trans, state_acc, ls_st, toks, nodes,
                       states, 0, 0)
    if st != OK:
        nb = 0
        nt = 0
    grp_acc, grp_byte, grp_off, out_nodes = _groups(F, state_acc, nodes, states, nb)
    return st, toks[:nt].copy(), grp_acc, grp_byte, grp_off, out_nodes


@njit(nogil=True, cache=True)
def _nested_insert(keys, vals, t, i, e):
    """Add key ``(t, i)`` -> ``e`` (room reserved; the value is written before the key, so a
    kernel reading the table concurrently never sees a key without its value)."""
    slot = _nested_slot(keys, t, i)
    vals[slot] = e
    keys[slot] = (np.int64(t) << 32) | np.int64(i)


@njit(nogil=True, cache=True)
def append_nested(S, n, t, i, toks, gs, gb, go, nodes):
    """Write a nested entry (:func:`build_nested`'s arrays) for key ``(t, i)`` after the ``n =
    [entries, tokens, groups, nodes]`` used in store ``S``, its key last (a kernel reading the
    table concurrently sees the key only with the whole entry), and count it in ``n``. False,
    with nothing written, when an array of ``S`` is too short (see
    :meth:`StateMaskCache._grown_store`)."""
    ne, nt, ng, nn = n[0], n[1], n[2], n[3]
    nt2 = nt + toks.shape[0]
    ng2 = ng + gs.shape[0]
    nn2 = nn + nodes.shape[0]
    if (2 * (ne + 1) > S.keys.shape[0] or ne + 2 > S.e_tok_off.shape[0] or ne + 2 > S.e_grp_off.shape[0]
            or nt2 > S.toks.shape[0] or ng2 > S.grp_acc.shape[0] or ng2 > S.grp_byte.shape[0]
            or ng2 + 1 > S.grp_node_off.shape[0] or nn2 > S.nodes.shape[0]):
        return False
    S.toks[nt:nt2] = toks
    S.grp_acc[ng:ng2] = gs
    S.grp_byte[ng:ng2] = gb
    S.grp_node_off[ng] = nn
    for j in range(1, go.shape[0]):
        S.grp_node_off[ng + j] = go[j] + nn
    S.nodes[nn:nn2] = nodes
    S.e_tok_off[ne + 1] = nt2
    S.e_grp_off[ne + 1] = ng2
    _nested_insert(S.keys, S.vals, t, i, ne)
    n[0] = ne + 1
    n[1] = nt2
    n[2] = ng2
    n[3] = nn2
    return True


#: why :func:`take_requests` stopped: every request taken; the store is short for the entry it
#: built (grow it, then resume at the same request); the table of counts is half full
TAKEN, STORE_SHORT, COUNTS_FULL = 0, 1, 2


@njit(nogil=True, cache=True)
def take_requests(F, S, n, ask_keys, ask_vals, ask_n, req, k, after, budget, trans, state_acc, ls_st, toks,
                  nodes, states, out):
    """:meth:`StateMaskCache.requested` from request ``k`` of ``req`` on (count, then (state,
    node) pairs): each request counted in the table ``ask_keys``/``ask_vals`` (``ask_n[0]`` keys
    in it), and the subtree asked for ``after`` times built (:func:`build_nested`) and appended to
    store ``S`` (:func:`append_nested`) while the bytes written (``out[4]``, added to) stay under
    ``budget``. Returns the request it stopped at, with why in ``out[0]`` (:data:`TAKEN`,
    :data:`STORE_SHORT` with the entry's tokens, groups and nodes in ``out[1:4]``: that request
    is not counted yet, or :data:`COUNTS_FULL`)."""
    cnt = req[0]
    while k < cnt:
        if 2 * (ask_n[0] + 1) > ask_keys.shape[0]:
            out[0] = COUNTS_FULL
            return k
        t = req[1 + 2 * k]
        i = req[2 + 2 * k]
        slot = _nested_slot(ask_keys, t, i)
        new = ask_keys[slot] == -1
        v = 1 if new else ask_vals[slot] + 1
        if v == after and out[4] < budget and S.keys[_nested_slot(S.keys, t, i)] == -1:
            st, tk, gs, gb, go, nd = build_nested(F, t, i, trans, state_acc, ls_st, toks, nodes, states)
            if st == OK:
                if not append_nested(S, n, t, i, tk, gs, gb, go, nd):
                    out[0] = STORE_SHORT
                    out[1] = tk.shape[0]
                    out[2] = gs.shape[0]
                    out[3] = nd.shape[0]
                    return k
                out[4] += tk.nbytes + gs.nbytes + gb.nbytes + go.nbytes + nd.nbytes + NESTED_ENTRY_BYTES
        ask_vals[slot] = v
        if new:
            ask_keys[slot] = (np.int64(t) << 32) | np.int64(i)
            ask_n[0] += 1
        k += 1
    out[0] = TAKEN
    return k


@njit(nogil=True, cache=True)
def _rehash(keys, vals, new_keys, new_vals):
    """Every key of the table ``keys``/``vals`` (``(t, i)`` keys, as :func:`_nested_slot`'s)
    inserted with its value into the empty, larger table ``new_keys``/``new_vals``."""
    for j in range(keys.shape[0]):
        key = keys[j]
        if key != -1:
            _nested_insert(new_keys, new_vals, key >> 32, key & 0xFFFFFFFF, vals[j])


_build_entry = FastCall(build_entry)
_take_requests = FastCall(take_requests)


@njit(nogil=True, cache=True)
def _members_by_expression(ms_off, ms_mem, g_expr, g_lex, s):
    """The members of compiled lexer state ``s`` sorted by (expression, lexeme): (expressions,
    lexemes), as :func:`_by_expression`'s."""
    a = ms_off[s]
    n = ms_off[s + 1] - a
    key = np.empty(n, np.int64)
    for j in range(n):
        g = ms_mem[a + j]
        key[j] = (np.int64(g_expr[g]) << 32) | np.int64(g_lex[g])
    key.sort()
    exprs = np.empty(n, np.int64)
    lexemes = np.empty(n, np.int64)
    for j in range(n):
        exprs[j] = key[j] >> 32
        lexemes[j] = key[j] & 0xFFFFFFFF
    return exprs, lexemes


_members_by_expr = FastCall(_members_by_expression)


def _by_expression(lexer, s: int) -> tuple[bytes, list[int]]:
    """State ``s``'s members sorted by (expression, lexeme): (the expressions as bytes, the
    lexemes). Position ``j`` names the same member in every state with these expressions."""
    if lexer.eager:
        D, X = lexer._D, lexer._X
        exprs, lexemes = _members_by_expr(D.ms_off, D.ms_mem, X.g_expr, X.g_lex, s)
        return exprs.tobytes(), lexemes.tolist()
    srt = sorted(lexer.state_members(s), key=lambda m: (m[1], m[0]))
    return np.array([e for _, e in srt], np.int64).tobytes(), [lx for lx, _ in srt]


class SharedEntries:
    """State cache entries in a form that names no lexeme, shared by every grammar compiled into
    one ExprSet for one tokenizer (:func:`shared_entries`).

    An entry depends on the state's member expressions alone, but for its groups' accepted
    sets: those name lexemes, and the same expressions are other lexemes in another grammar.
    So each group keeps a *pattern*, the positions (in the member list sorted by expression,
    :func:`_by_expression`) of the members that accept, which a grammar maps back to its own
    lexemes (:meth:`StateMaskCache._adopt`). The key is the expressions (with repeats, in that
    order) and the skip combination. Bounded by :data:`MAX_SHARED_BYTES`: past it, entries are
    no longer added (those held stay valid: expressions are never reused)."""

    def __init__(self, forest):
        self.forest = forest
        #: key -> (the entry's kernel record (:data:`~.mask.StateCache`) packed
        #: (:func:`~.kstruct.pack`), the pattern of each of its accepted sets (a tuple of member
        #: positions)). Packed, an entry is plain tuples of untracked objects, which the garbage
        #: collector stops tracking after a pass or two: this cache lives as long as the ExprSet,
        #: holds thousands of entries, and as records they were four fifths of what every full
        #: collection walked in a serving process (docs/mask.md, section 5c)
        self.entries: dict = {}
        self.nbytes = 0
        self.lock = threading.Lock()

    def publish(self, key, C, patterns: tuple, nbytes: int) -> None:
        """Add entry ``C`` (a kernel record, ``nbytes`` of arrays) with its ``patterns`` under
        ``key``, unless there or past the bound."""
        if self.nbytes < MAX_SHARED_BYTES:
            with self.lock:
                if key not in self.entries:
                    self.entries[key] = (pack(C), patterns)
                    self.nbytes += nbytes + ENTRY_BYTES


def shared_entries(exprs, forest) -> SharedEntries:
    """The :class:`SharedEntries` of ``exprs`` for the tokenizer of ``forest``."""
    per = exprs.__dict__.setdefault("_state_entries", {})
    se = per.get(id(forest))
    if se is None:
        with exprs.lock:
            se = per.get(id(forest))
            if se is None:   # (held strongly: the id is not reused while the entry lives)
                se = per[id(forest)] = SharedEntries(forest)
    return se


class StateMaskCache:
    """The state cache of one lexer generation (see the module docstring). :meth:`entry` is
    called once per mask with the matcher's lexer state."""

    def __init__(self, lexer, slicer, forest, max_bytes: int = MAX_CACHE_BYTES):
        # weak, as the slice checker's: the lexer holds this cache
        self._lexer = weakref.ref(lexer)
        self.slicer = slicer
        self.forest = forest
        self.max_bytes = max_bytes
        #: s -> [skip flags, their combination, visits, StateCache record or None, the ids of
        #: its accepted sets in this lexer]
        self._entries: dict[int, list] = {}
        self.nbytes = 0
        self.n_cached = 0
        # builds share one set of scratch arrays (the size of the forest)
        self._lock = threading.Lock()
        self._scratch = None
        #: nested entries (see :data:`~.mask.NestedStore`): published whole when an array grows,
        #: else written in place after the last entry, its key last
        # sized for a median grammar of MaskBench's (57 entries, 2.9k tokens, 183 groups, 197
        # nodes; ~30 KB): a smaller start regrew it six times a grammar on average
        self.store = kstruct(NestedStore(np.full(256, -1, np.int64), np.zeros(256, np.int32), np.zeros(129, np.int64),
                                         np.zeros(4096, np.int32), np.zeros(129, np.int64), np.zeros(512, np.int32),
                                         np.zeros(512, np.int32), np.zeros(513, np.int64), np.zeros(512, np.int32)))
        self._n = np.zeros(4, np.int64)   # entries, tokens, groups, nodes used in the store
        # the count of requests per subtree (key ``t << 32 | i``), a hash table: see take_requests
        self._ask_keys = np.full(256, -1, np.int64)
        self._ask_vals = np.zeros(256, np.int32)
        self._ask_n = np.zeros(1, np.int64)
        self._take_out = np.zeros(5, np.int64)
        self.n_nested = 0
        #: entries shared with the other grammars of the ExprSet (see :class:`SharedEntries`)
        self.shared = shared_entries(lexer.exprs, forest)
        #: of ``n_cached``, the entries taken from ``shared``
        self.n_adopted = 0
        #: s -> (its key in ``shared``, its members' lexemes by position)
        self._keys: dict[int, tuple] = {}
        #: accepted sets (lexemes) -> id, as adopted entries ask for them
        self._acc_memo: dict[tuple, int] = {}

    def entry(self, s: int) -> list:
        """``[skip flags, combination, visits, cache, accepted sets]`` of state ``s`` (the cache,
        when not None, is a :data:`~.mask.StateCache` for :func:`~.mask.fill_mask_cached`, with
        the ids of its accepted sets)."""
        e = self._entries.get(s)
        if e is None:
            flags, combo = self.slicer.skip_flags(s)
            e = self._entries[s] = [flags, combo, 0, None, None]
            if self.shared.entries and self.nbytes < self.max_bytes:
                # another grammar's entry for these expressions: used from the first visit
                e[3:5] = self._adopt(s, combo)   # one store: a reader on another thread sees both or neither
        if e[3] is None:
            v = e[2] = e[2] + 1
            due = v & (v - 1) == 0
            if self.slicer.pending(s):
                if v == 1:
                    return e
                # the proofs the first visit ran out of time for go on (one budget a visit):
                # the entry is built once they are done, with the flags they proved
                e[0:2] = self.slicer.skip_flags(s)   # one store, as below
                if self.slicer.pending(s):
                    return e
                due = True
            # on the second visit, then (a scan that met unexpanded states) at visits 4, 8, ...
            if v >= BUILD_AFTER and due and self.nbytes < self.max_bytes:
                e[3:5] = self._build(s, e[0], e[1])
        return e

    def requested(self, req: np.ndarray) -> None:
        """The subtrees a walk asked for (``req``: count, then (state, node) pairs): counted, and
        built once asked for :data:`NESTED_BUILD_AFTER` times, all in one compiled call
        (:func:`take_requests`) but where the store or the table of counts needs room."""
        lexer = self._lexer()
        if lexer is None:
            req[0] = 0
            return
        L = lexer.tables
        F = self.forest.arrays
        out = self._take_out
        k = 0
        with self._lock:
            n = self._n
            ne0 = int(n[0])
            out[4] = 0
            while True:
                S = self.store
                k = _take_requests(F, S, n, self._ask_keys, self._ask_vals, self._ask_n, req, k, NESTED_BUILD_AFTER,
                                   self.max_bytes - self.nbytes, L.trans, L.state_acc, *self._scratch_arrays(F), out)
                why = int(out[0])
                if why == TAKEN:
                    break
                if why == STORE_SHORT:
                    # publish grown copies, then write (the new entry's key must appear only in
                    # a table published with its arrays: a kernel still holding the old arrays
                    # would read past them)
                    self.store = self._grown_store(S, n, int(out[1]), int(out[2]), int(out[3]))
                else:
                    self._more_counts()
            self.nbytes += int(out[4])
            self.n_nested += int(n[0]) - ne0
        req[0] = 0

    def _more_counts(self) -> None:
        """Room in the table of request counts: doubled, or emptied past :data:`MAX_ASKED` keys
        (counts only)."""
        if int(self._ask_n[0]) >= MAX_ASKED:
            self._ask_keys.fill(-1)
            self._ask_n[0] = 0
            return
        keys = np.full(2 * self._ask_keys.shape[0], -1, np.int64)
        vals = np.zeros(keys.shape[0], np.int32)
        _rehash(self._ask_keys, self._ask_vals, keys, vals)
        self._ask_keys, self._ask_vals = keys, vals

    def _scratch_arrays(self, F):
        if self._scratch is None:
            n = F.node_byte.shape[0]
            self._scratch = (np.empty(int(self.forest.trie.max_depth) + 2, np.int32),
                             np.empty(self.forest.trie.n_tokens + 1, np.int32),
                             np.empty(n, np.int32), np.empty(n, np.int32))
        return self._scratch

    @staticmethod
    def _grown_store(S, n, n_toks: int, n_grps: int, n_nodes: int):
        """``S`` with every array too short for one more entry of that size grown (the key table
        doubled and rehashed when half full); the others shared."""
        ne, nt, ng, nn = (int(x) for x in n)
        nt2, ng2, nn2 = nt + n_toks, ng + n_grps, nn + n_nodes
        keys, vals = S.keys, S.vals
        new = {}
        if 2 * (ne + 1) > keys.shape[0]:
            keys = np.full(2 * keys.shape[0], -1, np.int64)
            vals = np.zeros(keys.shape[0], np.int32)
            _rehash(S.keys, S.vals, keys, vals)
            new.update(keys=keys, vals=vals)
        for name, need, used in (("e_tok_off", ne + 2, ne + 1), ("e_grp_off", ne + 2, ne + 1),
                                 ("toks", nt2, nt), ("grp_acc", ng2, ng), ("grp_byte", ng2, ng),
                                 ("grp_node_off", ng2 + 1, ng + 1), ("nodes", nn2, nn)):
            a = getattr(S, name)
            if need > a.shape[0]:
                new[name] = grown(a, need, used)
        if "keys" not in new:
            new.update(keys=keys.copy(), vals=vals.copy())
        return S._replace(**new)

    def _key(self, lexer, s: int, combo: int):
        """(the key of state ``s`` in :attr:`shared`, its members' lexemes by position)."""
        k = self._keys.get(s)
        if k is None:
            exprs, lexemes = _by_expression(lexer, s)
            k = self._keys[s] = ((exprs, combo), lexemes)
        return k

    def _adopt(self, s: int, combo: int):
        """The shared entry of state ``s`` (skip combination ``combo``) made this grammar's:
        (its record, the ids here of its accepted sets: each pattern's members at those positions
        here), or (None, None) when there is none."""
        lexer = self._lexer()
        if lexer is None:
            return None, None
        key, lexemes = self._key(lexer, s, combo)
        sh = self.shared.entries.get(key)
        if sh is None:
            return None, None
        packed, patterns = sh
        memo = self._acc_memo
        ids = []
        for p in patterns:
            a = tuple(sorted([lexemes[j] for j in p]))
            k = memo.get(a)
            if k is None:
                with lexer.lock:
                    k = memo[a] = lexer.accepted_id(a)
            ids.append(k)
        acc = np.array(ids, np.int32)
        with self._lock:
            self.nbytes += acc.nbytes + ENTRY_BYTES
            self.n_cached += 1
            self.n_adopted += 1
        return unpack(packed), acc

    def _build(self, s: int, flags: np.ndarray, combo: int):
        """(the entry of state ``s`` (skip ``flags``, their ``combo``), the ids of its accepted
        sets), another grammar's if made since the first visit, else built here and shared; (None,
        None) when its scan met states not built yet."""
        lexer = self._lexer()
        if lexer is None:
            return None, None
        if self.shared.entries:
            C, acc = self._adopt(s, combo)   # made by another grammar since the first visit
            if C is not None:
                return C, acc
        L = lexer.tables
        F = self.forest.arrays
        with self._lock:
            st, C, acc = _build_entry(F, flags, s, L.trans, L.state_acc, *self._scratch_arrays(F))
            if st != OK:
                return None, None
            nbytes = sum(a.nbytes for a in C)
            self.nbytes += nbytes + acc.nbytes + ENTRY_BYTES
            self.n_cached += 1
        C = kstruct(C)
        key, lexemes = self._key(lexer, s, combo)
        pos = {lx: j for j, lx in enumerate(lexemes)}
        self.shared.publish(key, C, tuple([tuple(sorted([pos[lx] for lx in lexer.accepted_set(k)]))
                                           for k in acc.tolist()]), nbytes)
        return C, acc
