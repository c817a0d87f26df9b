"""The slicer: precomputed masks for unconstrained contexts (see docs/slicer.md).

Large masks come from nearly unconstrained places, above all the inside of a JSON string. The
vocabulary is partitioned once per tokenizer into *slices* (:data:`JSON_STRING_SLICES`, claimed in
that order): the tokens matching ``[^"\\\\\\x00-\\x1F\\x7F]{1,10}``, then ``{11,30}``, then ``{31,}``, then
:data:`PARTIAL_UTF8` (string characters ending inside a UTF-8 character), and the rest. Each part
gets its own trie and its own precomputed bitmask; the tries are laid one after the other under a
shared root (a *forest*), so skipping a slice is one index jump in the walk kernel.

Before walking from lexer state ``s``, we check, once per state, whether every string of a slice's
regex is a prefix of a word of the union of ``s``'s expressions (:meth:`ExprSet.prefixes_contain`:
structural shortcuts, else a product exploration of the two derivative automata). If so, every
token of that slice is allowed: its precomputed mask is OR-ed in and its trie is skipped. The check
is exact, except that a proof that runs out of its budget answers "not contained" and the slice
is walked: :data:`STATE_PROOF_SECONDS` for all slices of a state in one mask (a proof cut short
goes on at the state's next masks, at most :data:`MAX_PROOF_CALLS` of them, before the state cache
builds its entry), :data:`~.regexset.MAX_RESUMED_SECONDS` for one proof in all, :data:`MAX_CHECK_PAIRS`.

Counters. A slice of bounded length (at most ``n`` bytes) is proved against the state's union with
every counted repetition ``x{lo,hi}`` capped at ``x{lo,max(lo,n//minlen(x)+1)}`` (:func:`capped`,
outside complements): a sub-language, so a proof there holds for the state itself, and states that differ
only in counters past the slice's reach (a string's remaining ``maxLength``, a pattern's remaining
word count) share one capped expression, hence one memoised proof. Without this each position of
a ``maxLength: 5000`` string was a new proof, some too slow for the budget.
"""
from __future__ import annotations

import threading
import time
import weakref
from collections import namedtuple

import numpy as np
from numba import njit

from .kstruct import kstruct
from .lexdfa import FastCall, grown
from .lexer import ALL_BYTES, DEAD
from .nodestore import n_parts, part
from .regex import parse_regex
from .reach import TokenReach, begun_within
from .regexset import AND, BYTES, CONCAT, EMPTY, EPS, INF, NOT, OR, REPEAT, ExprSet, pack_ids, put_bounded
from .toktrie import TokTrie

#: a slice of tokens that end inside a UTF-8 character: plain string characters, then a proper
#: prefix of a multi-byte character (byte-level BPE vocabularies have many such tokens)
PARTIAL_UTF8 = "<string characters, then part of a UTF-8 character>"
JSON_STRING_SLICES = (
    r'[^"\\\x00-\x1F\x7F]{1,10}',
    r'[^"\\\x00-\x1F\x7F]{11,30}',
    r'[^"\\\x00-\x1F\x7F]{31,}',
    PARTIAL_UTF8,
)


def slice_expr(pattern: str, ex: ExprSet) -> int:
    """The expression of a slice: a regex, or the named byte-level slice :data:`PARTIAL_UTF8`."""
    if pattern != PARTIAL_UTF8:
        return parse_regex(pattern, ex)
    r = ex.byte_range
    cont = r(0x80, 0xBF)
    partial = ex.alt(
        r(0xC2, 0xDF),
        ex.concat(ex.literal(b"\xe0"), ex.opt(r(0xA0, 0xBF))),
        ex.concat(r(0xE1, 0xEC), ex.opt(cont)),
        ex.concat(ex.literal(b"\xed"), ex.opt(r(0x80, 0x9F))),
        ex.concat(r(0xEE, 0xEF), ex.opt(cont)),
        ex.concat(ex.literal(b"\xf0"), ex.opt(ex.concat(r(0x90, 0xBF), ex.opt(cont)))),
        ex.concat(r(0xF1, 0xF3), ex.opt(ex.concat(cont, ex.opt(cont)))),
        ex.concat(ex.literal(b"\xf4"), ex.opt(ex.concat(r(0x80, 0x8F), ex.opt(cont)))),
    )
    return ex.concat(ex.star(parse_regex(r'[^"\\\x00-\x1F\x7F]', ex)), partial)
MAX_DFA_STATES = 4096
MAX_CHECK_PAIRS = 50_000
#: time allowed to the containment proofs of one lexer state (all its slices together) in one
#: call (one mask); an unfinished proof answers "not contained" for now (the kernel walks that
#: slice's tokens) and goes on at the state's next mask (0.25 s until 2026-11, then 0.03 s, then
#: 0.01 s in one call: the slowest masks of MaskBench were proofs running out of it; docs/slicer.md)
STATE_PROOF_SECONDS = 0.004
#: calls of :meth:`SliceChecker.skip_flags` (one per mask that meets the state before its state
#: cache entry is built) that may go on with a state's unfinished proofs
MAX_PROOF_CALLS = 6
#: entries of an ExprSet's memo of skip flags per set of member expressions before it is cleared
#: (~100 bytes each, more for states of many members)
MAX_SHARED_FLAGS = 50_000

#: the forest as the mask kernel reads it (see :class:`SliceForest`)
ForestArrays = namedtuple("ForestArrays", "node_byte node_depth node_end node_tok seg_start seg_end "
                                          "combo_words dup_first dup_other")

_FORESTS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_FOREST_LOCK = threading.Lock()


@njit(nogil=True, cache=True)
def _classify(data, offsets, table, accept, n_tok, out):
    """``out[t]`` = index of the first slice DFA accepting token ``t`` (or -1)."""
    n_slices = table.shape[0]
    for t in range(n_tok):
        out[t] = -1
        lo = offsets[t]
        hi = offsets[t + 1]
        if hi == lo:
            continue
        for k in range(n_slices):
            s = 0
            for i in range(lo, hi):
                s = table[k, s, data[i]]
                if s < 0:
                    break
            if s >= 0 and accept[k, s]:
                out[t] = k
                break


def _dense_dfa(ex: ExprSet, e: int):
    dfa = ex.dense_dfa(e, MAX_DFA_STATES)
    if dfa is None:
        raise ValueError("slice regex too large")
    return dfa


class SliceForest:
    """The vocabulary split into slices, as one forest trie plus per-slice masks."""

    def __init__(self, tokenizer_info, patterns=JSON_STRING_SLICES):
        self.patterns = tuple(patterns)
        tb = tokenizer_info.token_bytes
        trie = tokenizer_info.trie
        in_trie = np.zeros(len(tb), dtype=np.bool_)
        in_trie[trie.tok_ids] = True
        ex = ExprSet()
        dfas = [_dense_dfa(ex, slice_expr(p, ex)) for p in self.patterns]
        n_states = max(d[0].shape[0] for d in dfas)
        table = np.full((len(dfas), n_states, 256), -1, np.int32)
        accept = np.zeros((len(dfas), n_states), np.bool_)
        for k, (t, a) in enumerate(dfas):
            table[k, : t.shape[0]] = t
            accept[k, : a.shape[0]] = a
        lens = np.fromiter((len(b) for b in tb), dtype=np.int64, count=len(tb))
        offsets = np.zeros(len(tb) + 1, np.int64)
        np.cumsum(lens, out=offsets[1:])
        data = np.frombuffer(b"".join(tb), dtype=np.uint8)
        cls = np.empty(len(tb), np.int32)
        _classify(data, offsets, table, accept, len(tb), cls)
        cls[~in_trie] = -2
        n_words = (tokenizer_info.vocab_size + 31) // 32
        groups = [np.nonzero(cls == k)[0] for k in range(len(self.patterns))] + [np.nonzero(cls == -1)[0]]
        self.slice_words = []
        for ids in groups[:-1]:
            w = np.zeros(n_words, np.uint32)
            np.bitwise_or.at(w, ids >> 5, (np.uint32(1) << (ids & 31).astype(np.uint32)))
            self.slice_words.append(w)
        self.slice_sizes = [len(g) for g in groups]
        # the OR of the slice masks for every combination of skipped slices (bit k = slice k)
        self.combo_words = np.zeros((1 << len(self.slice_words), n_words), np.uint32)
        for c in range(1, 1 << len(self.slice_words)):
            low = (c & -c).bit_length() - 1
            self.combo_words[c] = self.combo_words[c & (c - 1)] | self.slice_words[low]
        tries = [TokTrie._build_from(tb, g.tolist()) for g in groups]
        self._concat(tries)
        t = self.trie
        self.arrays = kstruct(ForestArrays(t.node_byte, t.node_depth, t.node_end, self.node_tok, self.seg_start,
                                           self.seg_end, self.combo_words, self.dup_first, self.dup_other))

    def _concat(self, tries) -> None:
        nb, nd, ne, ts, te, ids = [np.zeros(1, np.uint8)], [np.zeros(1, np.int16)], [None], [np.zeros(1, np.int32)], [np.zeros(1, np.int32)], []
        starts, ends = [], []
        off = 1
        tok_off = 0
        for t in tries:
            k = t.n_nodes - 1
            starts.append(off)
            nb.append(t.node_byte[1:])
            nd.append(t.node_depth[1:])
            ne.append(t.node_end[1:] - 1 + off)
            ts.append(t.node_tok_start[1:] + tok_off)
            te.append(t.node_tok_end[1:] + tok_off)
            ids.append(t.tok_ids)
            tok_off += t.tok_ids.shape[0]
            off += k
            ends.append(off)
        ne[0] = np.array([off], np.int32)
        self.trie = TokTrie(np.concatenate(nb), np.concatenate(nd), np.concatenate(ne).astype(np.int32),
                            np.concatenate(ts), np.concatenate(te), np.concatenate(ids) if ids else np.zeros(0, np.int32))
        # one token per node for the kernel; tokens sharing bytes with another are copied after
        t = self.trie
        self.node_tok = np.full(t.n_nodes, -1, np.int32)
        has = t.node_tok_end > t.node_tok_start
        self.node_tok[has] = t.tok_ids[t.node_tok_start[has]]
        extra = np.nonzero(t.node_tok_end - t.node_tok_start > 1)[0]
        firsts, others = [], []
        for i in extra.tolist():
            ids = t.tok_ids[t.node_tok_start[i]:t.node_tok_end[i]].tolist()
            firsts += [ids[0]] * (len(ids) - 1)
            others += ids[1:]
        self.dup_first = np.array(firsts, np.int32)
        self.dup_other = np.array(others, np.int32)
        self.seg_start = np.array(starts[:-1], np.int32)
        self.seg_end = np.array(ends[:-1], np.int32)

    @property
    def n_slices(self) -> int:
        return len(self.patterns)


@njit(nogil=True, cache=True)
def subtree_depths(node_depth, node_end):
    """The greatest depth in each trie node's subtree (DFS preorder: the subtree of ``i`` is
    ``i .. node_end[i] - 1``, its children ``i + 1``, ``node_end[i + 1]``, ...)."""
    n = node_depth.shape[0]
    out = np.empty(n, np.int16)
    for i in range(n - 1, -1, -1):
        m = node_depth[i]
        j = i + 1
        e = node_end[i]
        while j < e:
            if out[j] > m:
                m = out[j]
            j = node_end[j]
        out[i] = m
    return out


_SUB_DEPTHS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def forest_sub_depth(forest: SliceForest) -> np.ndarray:
    """The greatest depth in each node's subtree of the forest's trie (made with the forest by
    :func:`slice_forest`; kept beside it, not in it, so that the disk cache's layout is unchanged):
    how far below a node a run of bytes can go (:func:`~.mask.chain_frontier`)."""
    d = _SUB_DEPTHS.get(forest)
    if d is None:
        d = _SUB_DEPTHS[forest] = subtree_depths(forest.arrays.node_depth, forest.arrays.node_end)
    return d


def slice_forest(tokenizer_info, patterns=JSON_STRING_SLICES) -> SliceForest:
    """The (cached) forest of a tokenizer for the given slice patterns (built, or loaded from the
    disk cache of :mod:`.tokenizer_cache`)."""
    with _FOREST_LOCK:
        per = _FORESTS.get(tokenizer_info)
        if per is None:
            per = _FORESTS[tokenizer_info] = {}
        f = per.get(tuple(patterns))
        if f is None:
            from .tokenizer_cache import cached_forest

            f = per[tuple(patterns)] = cached_forest(tokenizer_info, patterns)
            forest_sub_depth(f)
        return f


class SliceChecker:
    """Per compiled grammar: which slices are fully allowed from a lexer state (cached)."""

    def __init__(self, lexer, patterns=JSON_STRING_SLICES):
        # a weak reference: the lexer holds its checker (``lexer.slicer``), and a reference cycle
        # would keep a replaced lexer generation (its tables: megabytes) until the cyclic garbage
        # collector runs, which a workload making few Python objects may not trigger for long
        self._lexer = weakref.ref(lexer)
        ex = lexer.exprs
        with lexer.lock:
            cache = ex.__dict__.setdefault("_slice_exprs", {})
            if patterns not in cache:
                exprs = [slice_expr(p, ex) for p in patterns]
                cache[patterns] = (exprs, _first_table(ex, exprs), _prefix_order(ex, exprs))
            #: per slice, its expression, and a [slice, byte] table of the bytes its strings can
            #: begin with (a necessary condition of containment, below: all slices at once)
            self.exprs, self._first_table, (self._below, self._above) = cache[patterns]
            self._first_ints = [ex.first_bytes(e) for e in self.exprs]
            #: member expressions (packed: :func:`.regexset.pack_ids`) -> combination of the
            #: flags, shared by the grammars of the ExprSet (bounded)
            self._shared = ex.__dict__.setdefault("_skip_flags", {}).setdefault(patterns, {})
            #: combination -> its flags as the kernels read them (at most 2 ** slices)
            self._flag_arrays = ex.__dict__.setdefault("_skip_flag_arrays", {}).setdefault(patterns, {})
        self._cache: dict[int, tuple[np.ndarray, int]] = {}
        #: state -> calls of :meth:`skip_flags` so far, for the states whose proofs are unfinished
        self._pending: dict[int, int] = {}
        #: whether the proving call under way may still take its one step past the budget
        self._one_more = False

    @property
    def lexer(self):
        return self._lexer()

    def skip_flags(self, s: int) -> tuple[np.ndarray, int]:
        """(per-slice skip flags, their combination index) for lexer state ``s``: per state, and
        per set of member expressions in the ExprSet (the flags depend on those alone: every
        grammar compiled into the ExprSet shares them, as a string's states recur in most
        schemas).

        A state whose proofs ran out of this call's budget (:data:`STATE_PROOF_SECONDS`) gets
        the flags proved so far and stays :meth:`pending`: its next call resumes the proofs where
        they stopped, at most :data:`MAX_PROOF_CALLS` calls in all (the last one's flags are
        then kept, unproved slices walked)."""
        f = self._cache.get(s)
        if f is None:
            lexer = self.lexer
            if not lexer.expanded[s]:
                # the walk from ``s`` asks for its row first thing: build it now (the same
                # expansion a kernel round would ask for), which also lets the row answer below
                lexer.expand_many([s], lexer.resolve_budget)
            xs = lexer.member_exprs(s)
            key = pack_ids(xs)
            combo = self._shared.get(key)
            pending = False
            if combo is None:
                combo, pending = self._prove(lexer, s, xs)
                calls = self._pending.get(s, 0) + 1
                if pending and calls < MAX_PROOF_CALLS:
                    self._pending[s] = calls
                else:
                    pending = False
                    put_bounded(self._shared, key, combo, MAX_SHARED_FLAGS)
            arr = self._flag_arrays.get(combo)
            if arr is None:   # one array per combination, shared (kernels only read it)
                arr = self._flag_arrays[combo] = np.array([combo >> k & 1 for k in range(len(self.exprs))], np.int32)
            f = (arr, combo)
            if not pending:
                self._cache[s] = f
                self._pending.pop(s, None)
        return f

    def pending(self, s: int) -> bool:
        """Whether state ``s``'s last :meth:`skip_flags` were cut short by the budget (the next
        call goes on proving)."""
        return s in self._pending

    def _prove(self, lexer, s: int, xs: list[int]) -> tuple[int, bool]:
        """The combination of :meth:`skip_flags` of state ``s`` (expanded; ``xs``: its members'
        expressions, sorted and distinct), proved (bit ``k``: slice ``k`` is contained), and
        whether a proof was cut short by the budget (to be resumed)."""
        # a slice whose strings may begin with a byte on which the state's row is dead
        # (no member lives after it) is not contained: no proof needed. Most states
        # outside strings end here (an expanded row is never written again: read unlocked).
        live = _live_slices(lexer.trans, s, self._first_table)
        todo = [k for k in range(len(self.exprs)) if live >> k & 1]
        if not todo:
            return 0, False
        known = dict.fromkeys(todo)
        with lexer.lock, lexer.counting():
            self._one_more = True   # (:meth:`_settle`; the lock held: one proving call at a time)
            # one time budget for all the slices of a state: a state whose first proof runs
            # out of time rarely has cheap ones after it, and the mask waits for all of them
            deadline = time.monotonic() + STATE_PROOF_SECONDS
            ex = lexer.exprs
            if len(xs) > 1:
                # a slice contained in one member's strings is contained in their union: each
                # member's own combination first (shared by every state and grammar that has
                # it). The states of an object's keys are a string's derivative beside literal
                # keys, which differ from schema to schema: the string alone proves them.
                for x in xs:
                    c = self._member_combo(ex, x, deadline)
                    for k in todo:
                        if c >> k & 1:
                            known[k] = True
                    if None not in known.values():
                        break
            if None in known.values():
                # the union of the state's expressions: the same for every slice
                self._settle(ex, ex.alt(*xs), known, deadline)
        return _combination(known), None in known.values()

    def _member_combo(self, ex: ExprSet, x: int, deadline: float) -> int:
        """The combination of the slices contained in expression ``x`` alone (as a state of that
        one member would have it: the same shared table), proved if not known; not kept while a
        proof of it is cut short (resumed at the next call)."""
        key = pack_ids((x,))
        c = self._shared.get(key)
        if c is None:
            first = first_bytes_over(ex, x)
            known = {k: None for k, f in enumerate(self._first_ints) if f & ~first == 0}
            self._settle(ex, x, known, deadline)
            c = _combination(known)
            if None not in known.values():
                put_bounded(self._shared, key, c, MAX_SHARED_FLAGS)
        return c

    def _settle(self, ex: ExprSet, u: int, known: dict, deadline: float) -> None:
        """Decide the slices of ``known`` still None (True: contained in ``u``'s prefixes;
        False: not, or not proved within :data:`~.regexset.MAX_RESUMED_SECONDS`); those left
        None when ``deadline`` passes are proved by a later call, which resumes the proof it
        cut short."""
        # slices whose strings are all prefixes of another's strings (``{1,10}`` of
        # ``{11,30}``'s) follow from it: a slice contained makes those below it
        # contained, one not contained (or not proved) those above it not proved.
        # So the lowest slice is proved first, then the highest above it, and so on.
        below, above = self._below, self._above
        up = False
        while True:
            left = [k for k, v in known.items() if v is None]
            if not left:
                return
            k = max(left, key=(lambda j: len(below[j])) if up else (lambda j: len(above[j])))
            rest = deadline - time.monotonic()
            if rest <= 0:
                # past the budget, a call still takes one step (the first of its proofs it
                # meets explores a few pairs: :meth:`.ExprSet.prefixes_contain`), so that every
                # call goes on however slow the machine
                if not self._one_more:
                    return
                rest = 0.0
            self._one_more = False
            up = self._contained(ex, u, self.exprs[k], rest)
            if up is None:
                return
            known[k] = up
            for j in (below[k] if up else above[k]):
                if j in known and known[j] is None:
                    known[j] = up

    @staticmethod
    def _contained(ex: ExprSet, u: int, e: int, max_seconds: float) -> bool | None:
        """Every string of slice ``e`` keeps a lexer state alive: the same as every string of
        ``e`` being a prefix of ``u``, the union of the state's expressions (cached in the
        ExprSet, so shared by every grammar compiled into it). Counters the slice cannot reach
        are capped first (see the module docstring). None: cut short by ``max_seconds`` (the
        next call for the same pair resumes it)."""
        n = max_length(ex, e)
        if n != INF:
            u = capped(ex, u, n)
        return ex.prefixes_contain(e, u, MAX_CHECK_PAIRS, max_seconds, resume=True)


def _combination(known: dict) -> int:
    """The combination (bit ``k``) of the slices ``k`` that ``known`` says are contained."""
    c = 0
    for k, v in known.items():
        if v:
            c |= 1 << k
    return c


def _prefix_order(ex: ExprSet, exprs: list[int]) -> tuple[list[list[int]], list[list[int]]]:
    """Per slice ``k``: the slices ``j`` whose every string is a prefix of a string of ``k``
    (below it: if every string of ``k`` keeps a lexer state alive, so does every string of ``j``),
    and those ``k`` is so below (above it). Exact proofs (:meth:`.ExprSet.prefixes_contain`); one
    that runs out of budget leaves the pair unordered, which only costs a proof per state."""
    n = len(exprs)
    below: list[list[int]] = [[] for _ in range(n)]
    above: list[list[int]] = [[] for _ in range(n)]
    for k in range(n):
        for j in range(n):
            if j != k and ex.prefixes_contain(exprs[j], exprs[k], MAX_CHECK_PAIRS, 1.0):
                below[k].append(j)
                above[j].append(k)
    return below, above


def _first_table(ex: ExprSet, exprs: list[int]) -> np.ndarray:
    """``[k, w]``: the bytes the strings of ``exprs[k]`` can begin with, as four 64-bit words
    (byte ``b``: bit ``b % 64`` of word ``b // 64``)."""
    t = np.zeros((len(exprs), 4), np.uint64)
    for k, e in enumerate(exprs):
        t[k] = np.frombuffer(ex.first_bytes(e).to_bytes(32, "little"), np.uint64)
    return t


@njit(nogil=True, cache=True)
def _live_slices(trans, s, first):
    """The slices (bit ``k``: slice ``k``, at most 63) none of whose first bytes (``first``, as
    :func:`_first_table`'s) is dead in expanded lexer state ``s``'s row of ``trans``: the only
    ones that may be contained (a dead byte kills every string it begins)."""
    dead = np.zeros(4, np.uint64)
    base = s * 256
    for b in range(256):
        if trans[base + b] == DEAD:
            dead[b >> 6] |= np.uint64(1) << np.uint64(b & 63)
    r = 0
    for k in range(first.shape[0]):
        if (first[k, 0] & dead[0]) | (first[k, 1] & dead[1]) | (first[k, 2] & dead[2]) | (first[k, 3] & dead[3]) == 0:
            r |= 1 << k
    return r


INF_FLOAT = float("inf")
#: expressions larger than this are proved as they are (capping walks the whole expression)
MAX_CAP_NODES = 20_000
#: entries of the memo of :func:`capped` (per ``n``) before it is cleared
MAX_CAPPED_MEMO = 100_000
#: the largest minimum of a counted intersection that :func:`capped` takes into the fixed head
#: (``p r{lo,hi}`` as ``p r^lo r{0,hi-lo}``); a larger one keeps the intersection as it is
MAX_FIXED_MIN = 8
#: pairs one exploration of :meth:`.ExprSet.counted_need_bound` may meet for a walk state (the
#: word-count patterns of MaskBench need a few thousand); past it the counter stays exact
MAX_NEED_PAIRS = 10_000


def max_length(ex: ExprSet, e: int) -> int:
    """The length in bytes of the longest string of ``e`` (``INF``: unbounded; over-estimated
    through complements and intersections), memoised in the ExprSet."""
    memo = ex.__dict__.setdefault("_max_length", {})
    r = memo.get(e)
    if r is not None:
        return r
    order = _post_order(ex, e, memo)
    if order is None:
        return INF
    for x in order:
        k = ex.kind[x]
        if k == EMPTY or k == EPS:
            v = 0
        elif k == BYTES:
            v = 1
        elif k == NOT:
            v = INF
        elif k == REPEAT:
            a, _lo, hi = ex.args[x]
            m = memo[a]
            v = 0 if m == 0 else (INF if hi == INF or m == INF else m * hi)
        else:
            vals = [memo[y] for y in ex.args[x]]
            if k == CONCAT:
                v = INF if INF in vals else sum(vals)
            elif k == OR:
                v = INF if INF in vals else max(vals)
            else:  # AND: the shortest bounded part bounds it
                b = [y for y in vals if y != INF]
                v = min(b) if b else INF
        memo[x] = v
    return memo[e]


#: the deepest nesting of parts :func:`_first_over` walks (deeper: the Python walk)
FIRST_OVER_DEPTH = 1024


def first_bytes_over(ex: ExprSet, e: int) -> int:
    """A mask of the bytes that can begin a string of ``e``, over-estimated through complements
    (any byte) and intersections (those of every part), from the structure alone: no derivative
    (:meth:`.ExprSet.first_bytes` takes them all, and decides which are alive). Compiled
    (:func:`_first_over`), memoised per node in the ExprSet; :func:`_first_bytes_over_py` where
    the compiled walk gives up (a nesting deeper than its stack)."""
    memo = ex.__dict__.get("_first_over_arrays")
    if memo is None:
        memo = ex.__dict__["_first_over_arrays"] = (np.zeros(4096, np.uint8), np.zeros((4096, 4), np.uint64))
    known, fm = memo
    if known.shape[0] <= e:
        n = known.shape[0]
        known, fm = ex.__dict__["_first_over_arrays"] = (grown(known, e + 1, n), grown(fm, e + 1, n))
    if known[e] or _first_over_call(ex._S, known, fm, e, np.empty(FIRST_OVER_DEPTH, np.int64)):
        return int.from_bytes(fm[e].tobytes(), "little")
    return _first_bytes_over_py(ex, e)


@njit(nogil=True, cache=True)
def _first_over(S, known, fm, e, stack):
    """:func:`first_bytes_over` of node ``e`` into ``fm[e]`` (four 64-bit words, byte ``b``: bit
    ``b % 64`` of word ``b // 64``), and of every part it needs, each marked in ``known``; False
    (nothing wrong written) when a part is past ``known`` or the parts nest deeper than
    ``stack``."""
    ka = S.a
    kb = S.b
    pool = S.pool
    n = known.shape[0]
    stack[0] = e
    sp = 1
    while sp > 0:
        x = stack[sp - 1]
        if known[x]:
            sp -= 1
            continue
        k = S.kind[x]
        n_ch = n_parts(S, x)
        pushed = False
        for j in range(n_ch):
            y = part(S, x, j)
            if y >= n:
                return False
            if not known[y]:
                if sp >= stack.shape[0]:
                    return False
                stack[sp] = y
                sp += 1
                pushed = True
        if pushed:
            continue
        for w in range(4):
            if k == BYTES:
                v = S.bm[ka[x], w]
            elif k == NOT:
                v = ~np.uint64(0)
            elif k == REPEAT:
                v = fm[ka[x], w]
            elif k == CONCAT:
                v = fm[ka[x], w]
                if S.nul[ka[x]]:
                    v |= fm[kb[x], w]
            elif k == OR:
                v = np.uint64(0)
                for j in range(n_ch):
                    v |= fm[pool[ka[x] + j], w]
            elif k == AND:
                v = ~np.uint64(0)
                for j in range(n_ch):
                    v &= fm[pool[ka[x] + j], w]
            else:   # EMPTY, EPS
                v = np.uint64(0)
            fm[x, w] = v
        known[x] = 1
        sp -= 1
    return True


_first_over_call = FastCall(_first_over)


def _first_bytes_over_py(ex: ExprSet, e: int) -> int:
    """:func:`first_bytes_over` in Python (its reference, and where the compiled walk gives up)."""
    memo = ex.__dict__.setdefault("_first_over", {})
    r = memo.get(e)
    if r is not None:
        return r
    order = _post_order(ex, e, memo, skip_not=True)
    if order is None:
        return ALL_BYTES
    nullable = ex.nullable
    for x in order:
        k = ex.kind[x]
        if k == BYTES:
            v = ex.args[x][0]
        elif k == NOT:
            v = ALL_BYTES
        elif k == REPEAT:
            v = memo[ex.args[x][0]]
        elif k == CONCAT:
            v = 0
            for y in ex.args[x]:
                v |= memo[y]
                if not nullable(y):
                    break
        elif k == OR:
            v = 0
            for y in ex.args[x]:
                v |= memo[y]
        elif k == AND:
            v = ALL_BYTES
            for y in ex.args[x]:
                v &= memo[y]
        else:   # EMPTY, EPS
            v = 0
        memo[x] = v
    return memo[e]


def capped(ex: ExprSet, e: int, n: int, keep_and: bool = False, reach: TokenReach | None = None) -> int:
    """``e`` with every counted repetition ``x{lo,hi}`` whose ``hi`` (finite) exceeds
    ``c = max(lo, n // minlen(x) + 1)`` made ``x{lo,c}`` (a string of ``n`` bytes reads at most
    ``n // minlen(x)`` whole iterations of ``x`` and part of one more), except under complements:
    a sub-language of ``e`` (every constructor but the complement is monotone). Memoised per
    ``(e, n)`` in the ExprSet.

    ``keep_and``: intersections are kept whole too. Then a string of at most ``n`` bytes is alive
    (a prefix of a word) and accepted in the result exactly when it is in ``e``: the capped
    counters still reach their lower bounds, and a completion never needs more iterations than
    the prefix used plus one. Under an intersection that is not so (capping ``.{1,65536}`` in
    ``uri & .{1,65536}`` leaves no room to complete ``[``), except for the one case proven by
    :func:`_capped_counted_and`: a count left of at least what any reachable state of the
    intersection can need. What :meth:`.Lexer.walk_state` uses.

    ``reach`` (a tokenizer's :class:`.TokenReach`, its ``n`` the longest token): the strings are
    the prefixes of its tokens only, and a counter is capped past the iterations of its body
    that one token can begin (:meth:`.TokenReach.begun`), where ``n // minlen(x) + 1`` bounds
    them for any string. The arguments above hold as they are: they count only the iterations
    that the strings begin."""
    if not ex.has_counter(e):
        return e   # nothing to cap: no walk, no memo entry
    # one memo per ``n`` of every sub-expression's capped form: the states of a lexer share most
    # of their sub-expressions, so each new state caps only what is new in it
    if reach is not None:
        n = reach.n
    key = (n, keep_and) if reach is None else (reach.key, keep_and)
    done = ex.__dict__.setdefault("_capped", {}).setdefault(key, {})
    r = done.get(e)
    if r is not None:
        return r
    if len(done) > MAX_CAPPED_MEMO:
        done.clear()
    begun = (lambda x: begun_within(ex, x, n)) if reach is None else (lambda x: reach.begun(ex, x))
    return _capped_into(ex, e, begun, keep_and, done)


def _capped_into(ex: ExprSet, e: int, begun, keep_and: bool, done: dict) -> int:
    """:func:`capped` into its memo ``done`` (never cleared here: a caller may be in the middle
    of its own post order)."""
    r = done.get(e)
    if r is not None:
        return r
    order = _post_order(ex, e, done, skip_not=True, skip_and=keep_and, counted_only=True)
    if order is None:
        return e
    for x in order:
        k = ex.kind[x]
        if k in (EMPTY, EPS, BYTES, NOT):
            v = x
        elif keep_and and k == AND:
            v = _capped_counted_and(ex, x, begun, done)
        elif k == REPEAT:
            a, lo, hi = ex.args[x]
            a2 = done.get(a, a)   # not in ``done``: without a counter, itself
            hi2 = hi
            if hi != INF and hi > max(lo, 1):
                cap = max(lo, begun(a))
                hi2 = cap if hi > cap else hi
            v = x if (a2 == a and hi2 == hi) else ex.repeat(a2, lo, hi2)
        else:
            args = ex.args[x]
            new = [done.get(y, y) for y in args]
            if new == list(args):
                v = x
            elif k == CONCAT:
                v = ex.concat(*new)
            elif k == OR:
                v = ex.alt(*new)
            else:
                v = ex.intersect(*new)
        done[x] = v
    return done.get(e, e)   # not in ``done``: without a counter, itself


def _capped_counted_and(ex: ExprSet, e: int, begun, done: dict) -> int:
    """The intersection ``e = x & p r{0,hi}`` (a ``maxLength`` over a pattern or format; a
    minimum ``lo`` up to :data:`MAX_FIXED_MIN` is read as ``p r^lo r{0,hi-lo}``) with the count
    dropped, ``x & p r*``, when ``hi > f + F + 1``, where ``f`` bounds the factors of ``r`` that
    ``n`` bytes begin and ``F`` the factors that any pair reachable from ``(x, p)`` needs to a
    word (:meth:`.ExprSet.counted_need_bound`); and that is ``x`` itself where every word of ``x``
    is a word of ``p r*`` (:meth:`.ExprSet.within_star`: a pattern written in JSON string
    characters). ``e`` itself otherwise (another shape, a larger minimum, an exploration past its
    bound).

    Exact for strings of at most ``n`` bytes: every part of a derivative by such a string is
    ``x' & s r{0,h}`` with ``h`` at least ``hi - f > F``, alive iff the pair ``(x', s)`` needs at
    most ``h`` factors, which it does exactly when it needs any finite number, as in
    ``x' & s r*``; nullable iff ``x'`` and ``s`` are, in both. (Until session 19 the count was
    lowered to ``f + F + 1`` instead: exact too, but each byte of the walk then counted down, so
    every depth of the token trie was a lexer state of its own. A word count under
    ``maxLength: 5000``, Github_easy---o21053, built 4,400 states for one mask.)

    ``x`` free of intersections and complements is capped too (its own counters: the words of a
    word-count pattern, so that every position of such a string shares one walk state) where
    every word of the capped ``x'`` is a word of ``p r*`` (:meth:`.ExprSet.within_star`: the
    pattern is written in JSON string characters) and ``F`` is taken over the pairs of ``x'``.
    Then, for a string ``q`` of at most ``n`` bytes: the derivative of the capped intersection is
    alive iff ``x'_q`` is (``x'_q`` lies within the union of the ``s r*`` of its pairs, each with
    room for what it needs); ``x'_q`` iff ``x_q`` (:func:`capped`); and ``x_q`` alive makes the
    exact intersection alive, as some pair ``(x'_q, s)`` has a word within ``F`` factors and
    ``x_q`` contains ``x'_q``. Nullable likewise (an empty word of ``x'_q`` is one of some
    ``s r*``).

    Where ``hi`` is not lowered (one token could exhaust it, or no bound was found), ``x``'s own
    counters are still capped alone, ``x2 & p r{0,hi}``, if every word of ``x2`` is a word of
    ``p r*`` and the words of every body that may be capped are words of ``r*`` (checks of the
    premise below, on what is small: ``x`` itself may hold a counter of thousands). For a string
    ``q`` the walk reads: ``q`` is in ``x`` iff in ``x2`` (:func:`capped`), which settles
    acceptance; and a completion ``w`` of ``q`` in ``x`` with the fewest factors of ``r`` is one
    in ``x2``. A counter instance with more iterations than its cap has one lying wholly in
    ``w`` (``q`` begins at most the cap), and dropping it leaves a word of ``x`` (the count stays
    at least ``lo``) with fewer factors: the iteration is whole characters, in the string's own
    reading, since every part of the pattern is written in whole JSON string characters
    (``r``, each read one way). Repeated, that gives a completion in ``x2`` with no more factors,
    so ``hi`` decides aliveness alike. This is what o21142's ``maxLength: 100`` over a word count
    needs: a Llama-3 token of 128 spaces fits the pattern, so the length stays exact, but the
    word count, capped, no longer makes every word a new set of lexer states.

    With a tokenizer's reach (:func:`capped`), "strings of at most ``n`` bytes" above are the
    prefixes of its tokens and ``f`` the factors one token begins (``begun(r)``): the argument
    counts only what the strings begin."""
    args = ex.args[e]
    best = None
    for c in args:
        cp = ex._counted_part(c)
        if cp is not None and cp[2] <= MAX_FIXED_MIN and cp[3] != INF and (best is None or cp[3] > best[1][3]):
            best = (c, cp)
    if best is None:
        return _capped_star_and(ex, e, begun, done)
    c, (p, r, lo, hi) = best
    # p r{lo,hi} is p r^lo r{0,hi-lo}: a small minimum (a string's minLength: 1, before its
    # first character) becomes part of the fixed head, the same language
    p = ex.concat(p, ex.repeat(r, lo, lo))
    hi -= lo
    parts = _pattern_part(ex, args, c, begun, done)
    if parts is None:
        return e
    x, x2 = parts
    f = begun(r)
    if hi > f + 1:
        # x capped where its words are within p r*, then x whole (the length counter alone;
        # not with a minimum taken into the head: before the fold such a state was left as it
        # is, and exploring x whole, a count of 99 words, meets thousands of pairs)
        within = ex.within_star(x2, p, r)
        tries = [x2] if within else []
        if x not in tries and not lo:
            tries.append(x)
        for y in tries:
            need = ex.counted_need_bound(y, p, r, MAX_NEED_PAIRS)
            if need is not None and hi > f + need + 1:
                # the count dropped, not lowered: no depth of the walk is a state of its own
                if within and y == x2:
                    return x2   # every word of x2 is one of p r*: x2 & p r* is x2
                return ex.intersect(y, ex.concat(p, ex.repeat(r, 0, INF)))
    if x2 != x and ex.within_star(x2, p, r) and _bodies_within_star(ex, x, r):
        # the length counter kept as it is (within one token's reach, or no bound found)
        return ex.intersect(x2, c)
    return e


def _capped_star_and(ex: ExprSet, e: int, begun, done: dict) -> int:
    """The intersection ``e = x & p r{lo,}`` (a pattern under a ``minLength`` and no
    ``maxLength``; after the minimum, ``x & p r*``) as ``x2``, ``x`` with its own counters capped
    (:func:`capped`), where every word of ``x2`` is a word of ``p r^lo r*``
    (:meth:`.ExprSet.within_star`; ``lo`` up to :data:`MAX_FIXED_MIN`); ``e`` itself otherwise.

    Exact for strings ``q`` of at most ``n`` bytes: ``q`` is in ``x2`` iff in ``x``, and ``x2``
    lies within the other part, so acceptance agrees; a completion in ``x2`` is one in ``e``, and
    ``q`` alive in ``e`` is alive in ``x``, hence in ``x2`` (the prefixes :func:`capped` keeps).
    What a word count without ``maxLength`` needs (``{0,199}`` words, Github_hard---o21074): the
    intersection kept its counter whole, so every word of the string was a new walk state with
    its own slice proofs (34 ms each)."""
    args = ex.args[e]
    for c in args:
        hr = ex.head_and_repeat(c)
        if hr is None or hr[3] != INF:
            continue
        p, r, lo, _hi = hr
        lo = 0 if ex.nullable(r) else lo
        if lo > MAX_FIXED_MIN:
            continue
        parts = _pattern_part(ex, args, c, begun, done)
        if parts is not None and ex.within_star(parts[1], ex.concat(p, ex.repeat(r, lo, lo)), r):
            return parts[1]
    return e   # (a pattern may end in a star too: every part of that shape is tried)


def _pattern_part(ex: ExprSet, args, c: int, begun, done: dict):
    """``(x, x2)`` for the intersection of ``args`` but its length part ``c``: ``x`` the other
    parts, without their empty word where ``c`` has none (a pattern's ``^$|…``: the intersection
    is the same, and ``x``'s other words may then lie within ``c``'s shape), ``x2`` that with its
    own counters capped; None where ``x`` holds intersections or complements (formats such as
    email and uri: their pair graphs run past any useful bound, Github_medium---o6230: 20,000
    pairs and 0.4 s, refused)."""
    x = ex.intersect(*[y for y in args if y != c])
    if ex.has_bool(x):
        return None
    if not ex.nullable(c) and ex.kind[x] == OR and EPS in ex.args[x]:
        x = ex.alt(*[y for y in ex.args[x] if y != EPS])
    return x, _capped_into(ex, x, begun, True, done)


def _bodies_within_star(ex: ExprSet, x: int, r: int) -> bool:
    """Every counted repetition of ``x`` that :func:`capped` may lower has a body whose words
    are words of ``r*`` (each iteration whole factors of ``r``: characters of a JSON string)."""
    order = _post_order(ex, x, {}, skip_not=True, skip_and=True, counted_only=True)
    if order is None:
        return False
    for y in order:
        if ex.kind[y] == REPEAT:
            a, lo, hi = ex.args[y]
            if hi != INF and hi > max(lo, 1) and not ex.within_star(a, EPS, r):
                return False
    return True


def _post_order(ex: ExprSet, e: int, done: dict, skip_not: bool = False,
                skip_and: bool = False, counted_only: bool = False) -> list[int] | None:
    """The sub-expressions of ``e`` not in ``done``, children before parents (None: more than
    :data:`MAX_CAP_NODES`). With ``skip_not`` (``skip_and``) the inside of a complement (an
    intersection) is not entered. With ``counted_only``, neither is a sub-expression without a
    counter that :func:`capped` may lower (:meth:`.ExprSet.has_counter`, a flag of the store):
    capping leaves it as it is, and a large one (an enum of hundreds of strings beside a
    ``maxLength``) was most of a first mask's time."""
    if e in done or (counted_only and not ex.has_counter(e)):
        return []
    kind, args = ex.kind, ex.args
    ctr = ex.counter_flags() if counted_only else None
    order: list[int] = []
    seen: set[int] = set()
    # ``~x`` marks the second visit of ``x`` (its children done); children done or (with
    # ``counted_only``) without a counter are never pushed
    stack = [e]
    while stack:
        x = stack.pop()
        if x < 0:
            order.append(~x)
            continue
        if x in seen:
            continue
        seen.add(x)
        if len(seen) > MAX_CAP_NODES:
            return None
        stack.append(~x)
        k = kind[x]
        if k == REPEAT:
            ys = (args[x][0],)
        elif k == CONCAT or k == OR or (k == AND and not skip_and) or (k == NOT and not skip_not):
            ys = args[x]
        else:
            continue
        for y in ys:
            if y not in seen and y not in done and (ctr is None or ctr[y]):
                stack.append(y)
    return order
