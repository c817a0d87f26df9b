"""The lexer: a lazily built DFA over all lexemes of a grammar (see docs/lexer.md).

A lexer state is a set of ``(lexeme, expression)`` pairs: the lexemes still possible and, for
each, the derivative of its regex by the bytes read so far (see :mod:`.regexset`). The start
state of a parser row is the set of lexemes that row allows, each at its initial expression.

The kernels only see flat numpy arrays:

``trans[s * 256 + b]``
    next state, ``DEAD`` (-1) or ``UNKNOWN`` (-2, the state is not expanded yet).
``state_acc[s]``
    id of the set of lexemes accepted in ``s`` (an index into ``acc_off``/``acc_lex``), or -1.
``st_keys``/``st_vals``
    open-addressing hash table: hash of a sorted list of allowed lexemes -> start state.

Kernels receive them together as one :class:`LexerTables` (``Lexer.tables``), published again
each time an array is reallocated. A kernel that meets ``UNKNOWN`` or a start set not in the table
records it in a "missing" buffer and treats it as dead; Python then expands the states
(:meth:`Lexer.expand`), registers the start sets (:meth:`Lexer.start_state`) and runs the kernel
again (:meth:`~.compiled.CompiledGrammar.run`). After warm-up nothing is missing.

Generations (bounded memory). A lexer only grows, so a grammar whose automaton is huge (a string
of ``maxLength: 5000`` is ~10 states per character; with a ``pattern`` many more) would grow
without end while documents are generated. Once a lexer holds ``max_states`` states (or its
expressions grew by :data:`MAX_GENERATION_NODES` nodes) it is marked :attr:`Lexer.full`; the next
matcher call makes the compiled grammar start a :meth:`successor`: an empty lexer over a private
:class:`ExprSet` holding only the lexemes. A matcher moves its states to the newest generation
(:meth:`translate`: a state is its members, which are re-interned there) at the start of its next
call; a kernel already running keeps the generation it started with, which stays consistent (ids
are never reused) and is freed with the last matcher that holds it. The states a document still
needs are rebuilt on demand, as in RE2's DFA cache. Only a single call that needs more than
``hard_max_states`` states at once fails (:class:`GrammarTooComplexError`).
"""
from __future__ import annotations

import weakref
from collections import namedtuple

import numpy as np
from numba import njit

from ..errors import GrammarTooComplexError
from . import lexdfa, pages, rowstore
from .kstruct import kstruct
from .lexdfa import FastCall, g_intern, grown, intern_members
from .membound import DERIV_BYTES, MEMBER_BYTES, MOVES_BYTES, NODE_BYTES, PACKED_BYTES, STATE_BYTES
from .nodestore import AND, REPEAT, n_parts, part
from .regexset import ExprSet, mask_bytes, pack_ids, put_bounded

DEAD = -1
UNKNOWN = lexdfa.UNKNOWN   # -2
ALL_BYTES = (1 << 256) - 1
_eager_expand_rows = FastCall(rowstore.eager_expand_rows)
_intern_members = FastCall(intern_members)
_fill_stored_rows = FastCall(rowstore.fill_stored_rows)
_g_intern = FastCall(g_intern)
_intern_acc = FastCall(lexdfa._intern_acc)
#: state moves kept per ExprSet (shared by its grammars) before the cache starts over
MAX_CACHED_MOVES = 50_000
#: states of one lexer generation (see the module docstring); ``trans`` is 1 KiB per state
MAX_LEXER_STATES = 50_000
#: expression nodes a generation may add to its ExprSet (derivatives) before it is full
MAX_GENERATION_NODES = 400_000
#: a generation still in use by a running call may outgrow ``max_states`` up to this factor
#: (and at least by 20,000 states)
HARD_STATES_FACTOR = 8
#: build lexer states in Numba from lazily built lexeme DFAs (:mod:`.lexdfa`); False: the
#: derivative construction of whole states in Python (:meth:`Lexer._expand_one`, the reference)
EAGER_LEXER = True
#: states the compiled expansion builds speculatively (breadth first) beyond those a kernel asked
#: for, from members whose DFA rows exist (Numba only: no derivative, no Python object)
EAGER_RESOLVE_BUDGET = 256
#: DFA rows built beyond those asked for when their transitions are memoised already
EAGER_FREE_ROWS = 256
#: states the compiled expansion builds from the initial state at compile time (DFA rows included)
EAGER_WARM_UP_BUDGET = 64
#: lexer states an eager lexer has room for when made (and rows for as many lexeme DFA states: see
#: :data:`EAGER_INITIAL_DFA_STATES`). Past them its arrays of states are regrown, copying the rows
#: made (``trans``, ``g_next``: 1 KiB a state),
#: the costliest regrowth: 240 in a 1-in-20 MaskBench pass at 1,024 (one grammar in five goes
#: past it), ~0.6 ms each on one mask. The row tables are address space until rows are written;
#: the other arrays of states hold ~75 bytes a state (``held_bytes`` counts them); the arrays of
#: members and accepted sets start at :data:`EAGER_INITIAL_MEMBER_STATES` states' worth
EAGER_INITIAL_STATES = 4096
#: states' worth of members (8 a state) and accepted sets the arrays of an eager lexer start with
#: (regrown by their own counts, without copying rows)
EAGER_INITIAL_MEMBER_STATES = 1024
#: lexeme DFA states the compiled expansion's arrays start with, but ``g_next``, which has rows for
#: :data:`EAGER_INITIAL_STATES` (address space until written) and is kept when the others regrow
#: (:func:`.lexdfa.grow_dfas`): zeroing them for 4,096 was ~60 us of a lexer's construction (of a
#: median time to first mask of ~3 ms), and they regrow without copying rows
EAGER_INITIAL_DFA_STATES = 1024

#: the lexer arrays a kernel reads (see the module docstring); one consistent snapshot
LexerTables = namedtuple("LexerTables", "trans state_acc acc_off acc_lex st_keys st_vals")


def _moves(exprs: ExprSet, key: tuple[int, ...]):
    """The byte transitions of a lexer state whose members have expressions ``key`` (sorted):
    ``cls`` maps each byte to a target index (-1: dead) and ``targets[k]`` lists the
    ``(member position, derivative)`` pairs of target ``k``."""
    per_member = [exprs.transitions(e) for e in key]
    # the coarsest partition of the bytes on which every member's move is constant
    parts = [ALL_BYTES]
    for tr in per_member:
        for m, _t in tr:
            nxt = []
            for p in parts:
                a = p & m
                if a and a != p:
                    nxt.append(a)
                    nxt.append(p & ~m)
                else:
                    nxt.append(p)
            parts = nxt
    cls = np.full(256, -1, dtype=np.int32)
    targets = []
    for p in parts:
        tgt = []
        for j, tr in enumerate(per_member):
            for m, t in tr:
                if m & p:
                    tgt.append((j, t))
                    break
        if tgt:
            cls[mask_bytes(p)] = len(targets)
            targets.append(tuple(tgt))
    return cls, tuple(targets)  # tuples: the cache is left alone by the garbage collector


def _second(pair):
    return pair[1]


#: :meth:`Lexer.walk_state`'s per-expression verdicts (one byte per ExprSet node): not known yet,
#: capping leaves the expression as it is, capping changes it
CAP_UNKNOWN, CAP_SAME, CAP_CHANGED = 0, 1, 2
#: no body count known (walk_state with an int reach: the tests')
_NO_BEGUN = np.full(0, -1, np.int64)


@njit(nogil=True, cache=True)
def _walk_same(ms_off, ms_mem, g_expr, S, verdict, begun, s):
    """True when state ``s`` is its own walk state: each member's expression holds no counter
    capping could lower (the store's ``ctr`` flags) or is left as it is by :func:`.slicer.capped`
    (``keep_and``), by the verdicts known (``verdict[e] == CAP_SAME``) or derived here
    (:func:`_same_when_capped`, which records them). False when that is not shown (the caller
    caps in Python)."""
    ctr = S.ctr
    stack = np.empty(0, np.int64)
    for i in range(ms_off[s], ms_off[s + 1]):
        e = g_expr[ms_mem[i]]
        if ctr[e] and (e >= verdict.shape[0] or verdict[e] != CAP_SAME):
            if stack.shape[0] == 0:
                stack = np.empty(256, np.int64)   # (the call's own: walk_state runs unlocked)
            if not _same_when_capped(S, verdict, begun, e, stack):
                return False
    return True


_walk_same_call = FastCall(_walk_same)


@njit(nogil=True, cache=True)
def _member_exprs(ms_off, ms_mem, g_expr, s):
    """The expressions of compiled lexer state ``s``'s members, sorted and distinct."""
    a = ms_off[s]
    n = ms_off[s + 1] - a
    xs = np.empty(n, np.int64)
    for j in range(n):
        xs[j] = g_expr[ms_mem[a + j]]
    if n > 32:
        xs = np.sort(xs)
    else:
        lexdfa._sort(xs, n)   # (an insertion sort: most states have a few members)
    m = 0
    for j in range(n):
        if j == 0 or xs[j] != xs[j - 1]:
            xs[m] = xs[j]
            m += 1
    return xs[:m].copy()


_member_exprs_call = FastCall(_member_exprs)


@njit(nogil=True, cache=True)
def _same_when_capped(S, verdict, begun, e, stack):
    """Whether :func:`.slicer.capped` (``keep_and``, for the reach whose body counts are
    ``begun``: per expression, how many iterations of it one token can begin, -1 not known) leaves
    ``e`` as it is, derived from its parts as :func:`.slicer._capped_into` caps them: a
    concatenation or union is left as it is when every part is; a counted repetition
    ``x{lo,hi}`` when its body is and ``hi <= max(lo, begun[x])`` (or ``hi`` is infinite or at most
    ``max(lo, 1)``); a complement, byte set or empty word always; a part without counter always.
    Each part shown so gets ``CAP_SAME`` in ``verdict``. False when not shown: a part already
    known to change, an intersection (capped by a proof: Python's), a body count not known, a
    node past ``verdict``, or a deeper nesting than ``stack`` holds."""
    kind = S.kind
    ctr = S.ctr
    nv = verdict.shape[0]
    stack[0] = e
    sp = 1
    while sp > 0:
        x = stack[sp - 1]
        if x >= nv:
            return False
        v = verdict[x]
        if v == CAP_SAME or not ctr[x]:
            sp -= 1
            continue
        if v == CAP_CHANGED:
            return False
        k = kind[x]
        if k == AND:
            return False
        if k == REPEAT:
            lo = S.b[x]
            hi = S.c[x]
            if hi != -1 and hi > max(lo, 1):
                y = S.a[x]
                bg = begun[y] if y < begun.shape[0] else -1
                if bg < 0 or hi > max(lo, bg):
                    return False
        pushed = False
        for j in range(n_parts(S, x)):
            y = part(S, x, j)
            if ctr[y] and (y >= nv or verdict[y] != CAP_SAME):
                if y >= nv or verdict[y] == CAP_CHANGED or sp >= stack.shape[0]:
                    return False
                stack[sp] = y
                sp += 1
                pushed = True
        if not pushed:
            verdict[x] = CAP_SAME
            sp -= 1
    return verdict[e] == CAP_SAME


@njit(nogil=True, cache=True)
def lexeme_set_hash(lex: np.ndarray, n: int) -> np.int64:
    """Hash of the sorted lexeme list ``lex[:n]`` (never 0: 0 marks an empty table slot)."""
    h = np.uint64(0x9E3779B97F4A7C15) ^ np.uint64(n)
    for i in range(n):
        h ^= np.uint64(lex[i]) + np.uint64(0x9E3779B97F4A7C15) + (h << np.uint64(6)) + (h >> np.uint64(2))
        h *= np.uint64(0xBF58476D1CE4E5B9)
        h ^= h >> np.uint64(31)
    r = np.int64(h & np.uint64(0x7FFFFFFFFFFFFFFF))
    if r == 0:
        r = 1
    return r


@njit(nogil=True, cache=True)
def lookup_start(st_keys: np.ndarray, st_vals: np.ndarray, key: np.int64) -> np.int32:
    """Start state for a lexeme-set hash, or UNKNOWN."""
    mask = st_keys.shape[0] - 1
    j = key & mask
    while True:
        k = st_keys[j]
        if k == key:
            return st_vals[j]
        if k == 0:
            return np.int32(-2)
        j = (j + 1) & mask


@njit(nogil=True, cache=True)
def _put_start(st_keys, st_vals, key, s):
    """Add ``key -> s`` to the start table (open addressing; room must be there)."""
    mask = st_keys.shape[0] - 1
    j = key & mask
    while st_keys[j] != 0:
        j = (j + 1) & mask
    # the value before the key: a concurrent reader never sees a key without its value
    st_vals[j] = s
    st_keys[j] = key


@njit(nogil=True, cache=True)
def register_starts(start_lex, start_off, n_sets, lexemes, lex_null, g0, X, trans, state_acc, acc_off, acc_lex, D,
                    buf, abuf, max_states, hard_max, st_keys, st_vals, out):
    """The start states of the lexeme sets a kernel asked for (``start_lex[start_off[i]:start_off[i +
    1]]``, sorted; a set may be asked for more than once): each looked up, else made (the DFA state
    of each lexeme's start, ``g0``, then the lexer state of those, :func:`.lexdfa.intern_members`)
    and registered in the start table. Room must be reserved for ``n_sets`` new states of all the
    sets' lexemes, as many lexeme DFA states and start-table entries
    (:meth:`Lexer.start_states`). Writes the states to ``out`` (one per set); returns how many
    were registered, or -1 past ``hard_max`` states."""
    added = 0
    for i in range(n_sets):
        a = start_off[i]
        k = start_off[i + 1] - a
        key = lexeme_set_hash(start_lex[a:], k)
        s = lookup_start(st_keys, st_vals, key)
        if s == UNKNOWN:
            s = _make_start(start_lex, a, k, key, lexemes, lex_null, g0, X, trans, state_acc, acc_off, acc_lex, D,
                            buf, abuf, max_states, hard_max, st_keys, st_vals)
            if s < 0:
                return -1
            added += 1
        out[i] = s
    return added


@njit(nogil=True, cache=True)
def _make_start(lex, a, k, key, lexemes, lex_null, g0, X, trans, state_acc, acc_off, acc_lex, D, buf, abuf,
                max_states, hard_max, st_keys, st_vals):
    """The start state of the lexeme set ``lex[a:a + k]`` (hash ``key``, not registered yet): the
    DFA state of each lexeme's start (``g0``, made where missing), the lexer state of those
    (:func:`.lexdfa.intern_members`), registered in the start table. Room must be there. -1
    past ``hard_max`` states."""
    for j in range(k):
        lx = lex[a + j]
        g = g0[lx]
        if g < 0:
            g = lexdfa.g_intern(X, lexemes[lx], lx, lex_null[lx])
            g0[lx] = g
        buf[j] = g
    s = lexdfa.intern_members(buf, k, X, trans, state_acc, acc_off, acc_lex, D, abuf, max_states, hard_max)
    if s >= 0:
        _put_start(st_keys, st_vals, key, s)
    return s


_register_starts = FastCall(register_starts)

#: what a mask kernel needs to build lexer states itself (:func:`inline_resolve`): the compiled
#: expansion's arrays (those of :meth:`Lexer._eager_loop` and :func:`register_starts`) and ``cfg``:
#: the settings below by index, and two counters the call writes. Kernels take it in a tuple
#: ``(E, X, D, S, A)`` with the records it cannot hold (a record holds no record): the lexeme
#: DFAs, the expansion store, the ExprSet's store and its row store
Expander = namedtuple("Expander", "cfg trans state_acc expanded acc_off acc_lex buf pbuf ibuf abuf fqueue out lexemes "
                                  "lex_null g0 st_keys st_vals failed")
#: ``Expander.cfg`` entries: on (0: the kernel builds nothing, the arrays are not read), the
#: speculation budget, the generation's bounds, free DFA rows, the row store's bound, entries of
#: the start table (updated), rounds taken (updated) and their bound, speculative rows, rounds
#: that needed Python (updated; their states are kept in ``failed`` and not tried again in the
#: call; past its room the call builds nothing more)
X_ON, X_BUDGET, X_MAX_STATES, X_HARD, X_FREE, X_MAX_STORED, X_N_START, X_ROUNDS, X_MAX_ROUNDS, X_SPEC, X_FAILED = range(11)
#: rounds one mask call may build in (each ends with the kernel stepping on again)
INLINE_MAX_ROUNDS = 4096


@njit(nogil=True, cache=True)
def _inline_state(E, X, D, S, A, s):
    """Expand lexer state ``s`` (and speculatively what it leads to) in the calling kernel; False
    when it needs Python (rows whose derivatives the compiled walk leaves open, an array to grow):
    then the state stays as it was, to be built by :meth:`Lexer.expand_many`."""
    if E.expanded[s]:
        return True
    cnt = D.cnt
    cfg = E.cfg
    if D.queue.shape[0] < 2:
        return False
    D.queue[0] = s
    cnt[4] = 0
    cnt[5] = 1
    cnt[7] = 0
    cnt[8] = 0
    cnt[9] = 0
    cnt[10] = 1
    st, _s = rowstore.eager_expand_rows(cfg[X_BUDGET], cfg[X_SPEC] != 0, cfg[X_MAX_STATES], cfg[X_HARD], X,
                                        E.trans, E.state_acc, E.expanded, E.acc_off, E.acc_lex, D, E.buf, E.pbuf,
                                        E.ibuf, E.abuf, S, A, 1, cfg[X_FREE], E.fqueue, E.out, cfg[X_MAX_STORED])
    return st == lexdfa.DONE and E.expanded[s]


@njit(nogil=True, cache=True)
def _inline_start(E, X, D, lex, a, k):
    """The start state of the lexeme set ``lex[a:a + k]`` (sorted), registered in the calling
    kernel as :func:`register_starts` does, where every array has room for it; -1 when not."""
    key = lexeme_set_hash(lex[a:], k)
    s = lookup_start(E.st_keys, E.st_vals, key)
    if s != UNKNOWN:
        return s
    cfg = E.cfg
    cnt = D.cnt
    g_cnt = X.g_cnt[0]
    if g_cnt + k > X.g_null.shape[0] or 2 * (g_cnt + k) > X.g_keys.shape[0]:
        return -1
    n0 = cnt[0]
    if (n0 + 2 > E.state_acc.shape[0] or n0 + 2 > D.ms_off.shape[0] or cnt[1] + k > D.ms_mem.shape[0]
            or 2 * (n0 + 1) > D.h_keys.shape[0] or cnt[2] + 2 >= E.acc_off.shape[0]
            or cnt[3] + k > E.acc_lex.shape[0] or 2 * (cnt[2] + 1) > D.a_keys.shape[0]
            or 2 * (cfg[X_N_START] + 1) > E.st_keys.shape[0] or k > E.buf.shape[0]):
        return -1
    s = _make_start(lex, a, k, key, E.lexemes, E.lex_null, E.g0, X, E.trans, E.state_acc, E.acc_off, E.acc_lex, D,
                    E.buf, E.abuf, cfg[X_MAX_STATES], cfg[X_HARD], E.st_keys, E.st_vals)
    if s >= 0:
        cfg[X_N_START] += 1
    return s


@njit(nogil=True, cache=True)
def _failed(E, s):
    """A round that needs Python (rows the compiled construction leaves open, an array to grow):
    counted, its state ``s`` kept so that the call does not try it again; past ``E.failed``'s
    room the call builds nothing more. Returns False."""
    cfg = E.cfg
    if cfg[X_FAILED] < E.failed.shape[0]:
        E.failed[cfg[X_FAILED]] = s
        cfg[X_FAILED] += 1
    else:
        cfg[X_ON] = 0
    return False


@njit(nogil=True, cache=True)
def inline_resolve(XE, M, m0, m1, m2):
    """Build, in the mask kernel that calls it, what that kernel recorded as missing since its
    request counts were ``m0`` states, ``m1`` start sets and ``m2`` lexemes (``M``: see
    :class:`~.earley.MissingRequests`): the start states of the sets, registered and expanded,
    and the states. True when all of it was built (the records are taken back: the kernel steps
    on again from where it stopped); False without an expander (``XE`` None: the kernels'
    read-only variants) or with one that is off, when nothing was recorded (a
    full buffer drops a request), the call's rounds are spent or something needs Python (the
    records stay for :meth:`~.compiled.CompiledGrammar.resolve`). The caller holds the lexer's
    lock (:meth:`Lexer.inline_expander`). ``XE``: ``(E, X, D, S, A)`` (see :data:`Expander`)."""
    if XE is None:   # the kernels' read-only variants (compiled without this function's body)
        return False
    E, X, D, S, A = XE
    cfg = E.cfg
    cnt = M.counts
    if cfg[X_ON] == 0 or (cnt[0] == m0 and cnt[1] == m1) or cfg[X_ROUNDS] >= cfg[X_MAX_ROUNDS]:
        return False
    off = M.start_off
    for i in range(m0, cnt[0]):
        # a state that needed Python in this call is met again on every path through it: it is
        # not tried again (the walk records it, for the Python round)
        s = M.states[i]
        for j in range(cfg[X_FAILED]):
            if E.failed[j] == s:
                return False
    cfg[X_ROUNDS] += 1
    for i in range(m1, cnt[1]):
        s = _inline_start(E, X, D, M.start_lex, off[i], off[i + 1] - off[i])
        if s < 0 or not _inline_state(E, X, D, S, A, s):
            return _failed(E, -1)
    for i in range(m0, cnt[0]):
        if not _inline_state(E, X, D, S, A, M.states[i]):
            return _failed(E, M.states[i])
    cnt[0] = m0
    cnt[1] = m1
    cnt[2] = m2
    return True


def _rehashed(keys: np.ndarray, need: int, off: np.ndarray, data: np.ndarray, n: int) -> np.ndarray:
    """A set table (see :func:`.lexdfa.rehash`) of ``keys``' size doubled until it has ``need``
    slots, holding the ``n`` sets ``data[off[i]:off[i + 1]]``."""
    size = keys.shape[0]
    while need > size:
        size *= 2
    new = np.full(size, -1, np.int32)
    lexdfa.rehash(new, off, data, n)
    return new


class _Counting:
    """:meth:`Lexer.counting` (a plain context manager: it is entered at every expansion)."""

    __slots__ = ("lx", "ex", "store", "n0")

    def __init__(self, lx: "Lexer"):
        self.lx = lx
        self.ex = lx.exprs
        self.store = rowstore.row_store(self.ex)   # the compiled expansion's rows

    def __enter__(self):
        ex = self.ex
        self.n0 = (len(ex), ex.n_derivs, len(self.lx._moves_cache), self.store.added)
        return self

    def __exit__(self, *exc):
        lx, ex = self.lx, self.ex
        n0, d0, m0, p0 = self.n0
        lx.grown_nodes += max(0, len(ex) - n0)
        lx.grown_derivs += max(0, ex.n_derivs - d0)
        lx.grown_moves += max(0, len(lx._moves_cache) - m0)
        lx.grown_packed += max(0, self.store.added - p0)
        return False


class Lexer:
    """Lazily determinised lexer over the lexemes ``lexemes`` (expression ids in ``exprs``)."""

    def __init__(self, exprs: ExprSet, lexemes: list[int], max_states: int = MAX_LEXER_STATES,
                 *, generation: int = 0, eager: bool | None = None):
        self.exprs = exprs
        self.lexemes = list(lexemes)
        self.max_states = max(1, int(max_states))
        self.hard_max_states = max(HARD_STATES_FACTOR * self.max_states, self.max_states + 20_000)
        #: 0 for the lexer built at compile time, +1 for each successor
        self.generation = generation
        #: set once this generation holds ``max_states`` states (or grew its ExprSet by
        #: MAX_GENERATION_NODES): the next matcher call moves on to a successor
        self.full = False
        #: the start state of the grammar's initial row (set by the compiled grammar)
        self.initial_state = -1
        self._base_nodes = len(exprs)
        # per source ExprSet: its expression ids -> ours (states translated from older generations)
        self._imports: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self.lock = exprs.lock  # one writer at a time over the (possibly shared) ExprSet
        self._moves_cache = exprs.__dict__.setdefault("_lexer_moves", {})
        self._states: list[tuple[tuple[int, int], ...]] = []
        self._state_ids: dict[tuple, int] = {}
        self._twins: dict[int, int] = {}   # walk_state's memo
        self._acc_sets: list[tuple[int, ...]] = []
        self._acc_ids: dict[tuple, int] = {}
        # room for the states most grammars ever make (EAGER_INITIAL_STATES: a regrowth copies
        # the rows made); the rows are written as states are made (never read before), so
        # ``trans`` is address space until then
        cap = EAGER_INITIAL_STATES if self.eager_default(eager) else 64
        self.trans = pages.row_table(cap * 256, np.int32)
        self.state_acc = np.full(cap, -1, dtype=np.int32)
        self.acc_off = np.zeros(1, dtype=np.int32)
        self.acc_lex = np.zeros(0, dtype=np.int32)
        self.st_keys = np.zeros(256, dtype=np.int64)
        self.st_vals = np.zeros(256, dtype=np.int32)
        self._n_start = 0
        self._expander = None   # (its tables, free-row queue, Expander record): inline_expander
        self._room_mark = None   # what _room_for_round found room for, and in which arrays
        self.expanded = np.zeros(cap, dtype=np.bool_)
        #: what this generation added to its ExprSet while it grew (expressions, memoised
        #: derivatives, moves): counted by :meth:`counting` for :meth:`held_bytes`
        self.grown_nodes = self.grown_derivs = self.grown_moves = self.grown_packed = 0
        #: members over all states (a state's member tuple grows with its lexemes; the
        #: reference construction's Python tuples)
        self.n_members = 0
        #: rounds mask kernels built states in themselves (:func:`inline_resolve`)
        self.inline_rounds = 0
        #: of those, the rounds that needed Python
        self.inline_failed = 0
        #: states are built by the compiled expansion (:mod:`.lexdfa`); False: by derivatives of
        #: whole states in Python (:meth:`_expand_one`, the reference)
        self.eager = self.eager_default(eager)
        if self.eager:
            self._init_compiled(cap)
        self._publish()

    @staticmethod
    def eager_default(eager) -> bool:
        """Whether a lexer made with ``eager`` uses the compiled expansion."""
        return EAGER_LEXER if eager is None else bool(eager)

    def _publish(self) -> None:
        """Hand the current arrays to kernels (after any of them was reallocated): one attribute
        store, so a kernel never sees arrays from two different moments."""
        self.tables = kstruct(LexerTables(self.trans, self.state_acc, self.acc_off, self.acc_lex,
                                          self.st_keys, self.st_vals))

    @property
    def walked(self) -> bool:
        """Whether a building call (:meth:`.CompiledGrammar.call_building`, from a mask or a
        token's bytes) ran in this generation: it made the expander, kept from then on (until
        then a mask skips the read-only walk, :data:`.matcher.SKIP_FIRST_READ_ONLY`, which reads
        ``_expander`` inline on its hot path)."""
        return self._expander is not None

    # ---------------------------------------------------------------- states
    @property
    def n_states(self) -> int:
        if self.eager:
            return int(self._D.cnt[0])
        return len(self._states)

    def state_members(self, s: int) -> tuple[tuple[int, int], ...]:
        """The members of state ``s``: ``(lexeme, expression)`` pairs sorted by lexeme."""
        if self.eager:
            D = self._D
            g_lex, g_expr = self._X.g_lex, self._X.g_expr
            return tuple(sorted([(int(g_lex[g]), int(g_expr[g]))
                                 for g in D.ms_mem[D.ms_off[s]:D.ms_off[s + 1]].tolist()]))
        return self._states[s]

    def member_exprs(self, s: int) -> list[int]:
        """The expressions of state ``s``'s members, sorted and distinct (what its skip flags and
        cache entries depend on)."""
        if self.eager:
            D = self._D
            return _member_exprs_call(D.ms_off, D.ms_mem, self._X.g_expr, s).tolist()
        return sorted({x for _, x in self._states[s]})

    # ---------------------------------------------------------------- compiled expansion
    def _init_compiled(self, cap: int) -> None:
        """The arrays of the compiled expansion (see :mod:`.lexdfa`)."""
        # room for the free rows a first expansion may add (:meth:`_fill_rows` reserves them):
        # a smaller table is regrown at once, on every grammar's first expansion
        self._X = lexdfa.new_dfas(min(EAGER_INITIAL_DFA_STATES, cap), cap)   # (rows for ``cap``)
        self._g0 = np.full(len(self.lexemes), -1, np.int64)   # the DFA state of each lexeme's start
        # per lexeme: its expression and whether it is nullable (register_starts' inputs)
        self._lex_arr = np.array(self.lexemes, np.int64)
        self._lex_null = np.array([1 if self.exprs.nullable(e) else 0 for e in self.lexemes], np.int64)
        self._start_out = np.zeros(64, np.int32)
        m = min(cap, EAGER_INITIAL_MEMBER_STATES)
        self._D = lexdfa.new_store(cap, 8 * m, m)
        self.acc_off = np.zeros(m + 1, dtype=np.int32)
        self.acc_lex = np.zeros(8 * m, dtype=np.int32)
        nl = max(1, len(self.lexemes))
        self._buf = np.zeros(nl, np.int32)
        self._pbuf = np.zeros(nl, np.int32)
        self._ibuf = np.zeros(nl, np.int32)
        self._abuf = np.zeros(nl, np.int32)
        self._free_queue = np.zeros(EAGER_FREE_ROWS, np.int64)
        self._rows_out = np.zeros(4, np.int64)   # rowstore.store_transitions' (and the stored count)

    def _reserve_g(self, k: int) -> None:
        X = self._X
        n = int(X.g_cnt[0])
        cap = X.g_null.shape[0]
        if n + k > cap:
            self._X = lexdfa.grow_dfas(X, lexdfa.grown_capacity(cap, n + k))

    def _g(self, lx: int, e: int) -> int:
        """The DFA state of lexeme ``lx`` at expression ``e`` (a new one has no row yet)."""
        self._reserve_g(1)
        return int(_g_intern(self._X, e, lx, 1 if self.exprs.nullable(e) else 0))

    def _fill_rows(self, gs, ladder: int = 1) -> None:
        """The DFA rows of the DFA states ``gs`` that have none yet: their transitions
        (derivatives, stored per ExprSet: :mod:`.rowstore`) written in one Numba call
        (:func:`.rowstore.fill_stored_rows`), with, breadth first, the rows of up to
        :data:`EAGER_FREE_ROWS` of the new DFA states they lead to whose transitions are stored
        already (no derivative to compute: rows other grammars of the compiler needed), so that
        speculative expansion can go on from them."""
        ex = self.exprs
        store = rowstore.row_store(ex)
        X = self._X
        arr = np.asarray(gs, np.int64)
        exprs = X.g_expr[arr]
        store.ensure(ex, exprs.tolist(), ladder)
        free = EAGER_FREE_ROWS
        queue = self._free_queue
        if queue.shape[0] < free:
            queue = self._free_queue = np.zeros(free, np.int64)
        while True:
            self._reserve_g(int(store.arrays.count[exprs].sum()) + free)
            st, k = _fill_stored_rows(arr, self._X, store.arrays, free, queue)
            if st == rowstore.DONE:
                break
            arr, exprs = arr[k:], exprs[k:]   # NEED_ROOM: the rows before k are written
        self._check_full()

    def _check_full(self) -> None:
        """Mark the generation full past its nodes or its lexeme DFA states (the lexeme DFAs are
        bounded with the lexer states: 1 KiB per row each)."""
        if len(self.exprs) - self._base_nodes > MAX_GENERATION_NODES or int(self._X.g_cnt[0]) >= self.max_states:
            self.full = True

    def _eager_intern(self, gs: list[int]) -> int:
        """Intern the lexer state of DFA states ``gs`` (not expanded)."""
        self._reserve(1, len(gs))
        buf = self._buf
        buf[:len(gs)] = gs
        s = int(_intern_members(buf, len(gs), self._X, self.trans, self.state_acc, self.acc_off,
                                self.acc_lex, self._D, self._abuf, self.max_states, self.hard_max_states))
        self._after_eager(s)
        return s

    def _after_eager(self, s: int) -> None:
        if self._D.cnt[6]:
            self.full = True
        if s < 0:
            raise GrammarTooComplexError(
                f"lexer automaton exceeds {self.hard_max_states} states in one generation "
                f"(one call needed more than {self.hard_max_states - self.max_states} new states)")

    def _reserve(self, n_new: int, m: int) -> None:
        """Room for ``n_new`` more states of at most ``m`` members (and accepted sets) in the
        arrays the compiled expansion writes: grown (and published) where they are short."""
        D = self._D
        cnt = D.cnt.tolist()
        n, mem_used, n_acc, acc_used = cnt[0], cnt[1], cnt[2], cnt[3]
        changed = False
        cap = self.state_acc.shape[0]
        if n + n_new + 1 > cap:
            cap = lexdfa.grown_capacity(cap, n + n_new + 1)
            self._grow_states(cap)   # publishes trans/state_acc/expanded
        ms_off, ms_mem, h_keys, a_keys, queue, defer = D.ms_off, D.ms_mem, D.h_keys, D.a_keys, D.queue, D.defer
        if ms_off.shape[0] < cap + 1:
            ms_off = np.zeros(cap + 1, np.int64)
            ms_off[:n + 1] = D.ms_off[:n + 1]
            changed = True
        if mem_used + n_new * m > ms_mem.shape[0]:
            ms_mem = grown(ms_mem, mem_used + n_new * m, mem_used)
            changed = True
        if 2 * (n + n_new) > h_keys.shape[0]:
            h_keys = _rehashed(h_keys, 2 * (n + n_new), ms_off, ms_mem, n)
            changed = True
        if queue.shape[0] < 2 * cap + 16 + n_new:
            q = np.zeros(2 * cap + 16 + n_new, np.int32)
            q[:queue.shape[0]] = queue
            queue = q
            d = np.zeros(q.shape[0], np.int32)
            d[:defer.shape[0]] = defer
            defer = d
            changed = True
        acc_off, acc_lex = self.acc_off, self.acc_lex
        published = False
        if n_acc + n_new + 1 >= acc_off.shape[0]:
            acc_off = grown(acc_off, n_acc + n_new + 2, n_acc + 1)
            published = True
        if acc_used + n_new * m > acc_lex.shape[0]:
            acc_lex = grown(acc_lex, acc_used + n_new * m, acc_used)
            published = True
        if 2 * (n_acc + n_new) > a_keys.shape[0]:
            a_keys = _rehashed(a_keys, 2 * (n_acc + n_new), acc_off.astype(np.int64), acc_lex, n_acc)
            changed = True
        if changed:
            self._D = D._replace(ms_off=ms_off, ms_mem=ms_mem, h_keys=h_keys, a_keys=a_keys, queue=queue,
                                 defer=defer)
        if published:
            self.acc_lex, self.acc_off = acc_lex, acc_off
            self._publish()

    def _eager_expand(self, states, budget: int, spec_rows: bool = False, ladder: int = 1) -> None:
        """Expand ``states`` (and breadth first up to ``budget`` more, only those whose members'
        DFA rows are built unless ``spec_rows``) in Numba (lock held)."""
        seeds = [s for s in states if not self.expanded[s]]
        if not seeds:
            return
        self._room_for_seeds(len(seeds))
        D = self._D
        D.queue[:len(seeds)] = seeds
        cnt = D.cnt
        cnt[4] = 0
        cnt[5] = len(seeds)
        cnt[7] = 0
        cnt[8] = 0
        cnt[9] = 0
        cnt[10] = len(seeds)
        self._eager_loop(budget, spec_rows, max(1, min(ladder, rowstore.MAX_LADDER)))

    def _eager_loop(self, budget: int, spec_rows: bool, rungs: int) -> None:
        """Run the compiled expansion of the queue set up in ``self._D`` to its end (lock held):
        Python builds the rows it cannot, and grows the arrays it asks for."""
        ex = self.exprs
        store = rowstore.row_store(ex)
        out = self._rows_out
        while True:
            st, s = _eager_expand_rows(budget, spec_rows, self.max_states, self.hard_max_states, self._X,
                                       self.trans, self.state_acc, self.expanded, self.acc_off, self.acc_lex,
                                       self._D, self._buf, self._pbuf, self._ibuf, self._abuf, ex._S, store.arrays,
                                       rungs, EAGER_FREE_ROWS, self._free_queue, out, rowstore.MAX_STORED_EXPRS)
            self._after_rows(store, out)
            if st == lexdfa.DONE:
                self._after_eager(0)
                return
            self._serve(st, s, rungs)

    def _room_for_seeds(self, n: int, n_new: int = 0, m: int = 0) -> None:
        """Room in the expansion's arrays (for ``n_new`` more states of at most ``m`` members:
        :meth:`_reserve`), its queue for ``n`` seeds and its free-row queue."""
        self._reserve(n_new, m)
        if self._D.queue.shape[0] < n + 16:
            q = 2 * n + 16
            self._D = self._D._replace(queue=np.zeros(q, np.int32), defer=np.zeros(q, np.int32))
        if self._free_queue.shape[0] < EAGER_FREE_ROWS:
            self._free_queue = np.zeros(EAGER_FREE_ROWS, np.int64)

    def _serve(self, st: int, s: int, rungs: int) -> None:
        """What the compiled expansion stopped for (status ``st`` at state ``s``): the rows it
        needs built (ladders of ``rungs``), room for state ``s``, or the generation's bound."""
        D = self._D
        if st == lexdfa.NEED_ROWS:
            n = int(D.cnt[8])
            self._fill_rows(sorted(set(D.need[:n].tolist())), rungs)
            D.cnt[8] = 0
        elif st == lexdfa.NEED_ROOM:
            self._reserve(1, int(D.ms_off[s + 1] - D.ms_off[s]))
        else:
            self._after_eager(-1)

    def _after_rows(self, store, out: np.ndarray) -> None:
        """After a compiled expansion: what its rows added (the ExprSet's mirrors, the store's
        count ``out[3]``, the generation's bound)."""
        self.exprs._settle()
        if out[3]:
            store.added += int(out[3])
            out[3] = 0
            self._check_full()

    def _intern(self, members: tuple[tuple[int, int], ...]) -> int:
        s = self._state_ids.get(members)
        if s is not None:
            return s
        s = len(self._states)
        if s + 1 >= self.max_states:
            self.full = True
            if s >= self.hard_max_states:
                raise GrammarTooComplexError(
                    f"lexer automaton exceeds {self.hard_max_states} states in one generation "
                    f"(one call needed more than {self.hard_max_states - self.max_states} new states)")
        if s >= self.state_acc.shape[0]:
            self._grow_states(lexdfa.grown_capacity(self.state_acc.shape[0], s + 1))
        self.trans[s * 256:(s + 1) * 256] = UNKNOWN   # rows past the states are never filled
        self._states.append(members)
        self._state_ids[members] = s
        self.n_members += len(members)
        acc = tuple(sorted({lx for lx, e in members if self.exprs.nullable(e)}))
        self.state_acc[s] = self._intern_acc(acc) if acc else -1
        return s

    def _grow_states(self, cap: int) -> None:
        """Room for ``cap`` states: the rows of the states made so far are copied, the others
        left unwritten (each is filled with ``UNKNOWN`` when its state is made: nothing reads a
        row past the states), so a large ``cap`` costs address space until it is used."""
        old = self.state_acc.shape[0]
        n = self.n_states
        trans = pages.row_table(cap * 256, np.int32)
        trans[: n * 256] = self.trans[: n * 256]
        acc = np.full(cap, -1, dtype=np.int32)
        acc[:old] = self.state_acc
        exp = np.zeros(cap, dtype=np.bool_)
        exp[:old] = self.expanded
        # publish the new arrays only once they are complete (kernels may hold the old ones)
        self.trans, self.state_acc, self.expanded = trans, acc, exp
        self._publish()

    def _intern_acc(self, acc: tuple[int, ...]) -> int:
        k = self._acc_ids.get(acc)
        if k is not None:
            return k
        k = len(self._acc_sets)
        self._acc_sets.append(acc)
        self._acc_ids[acc] = k
        self.acc_lex = np.concatenate([self.acc_lex, np.array(acc, dtype=np.int32)])
        self.acc_off = np.concatenate([self.acc_off, np.array([self.acc_lex.shape[0]], dtype=np.int32)])
        self._publish()
        return k

    def accepted_lexemes(self, s: int) -> tuple[int, ...]:
        k = int(self.state_acc[s])
        if k < 0:
            return ()
        return self.accepted_set(k)

    def accepted_set(self, k: int) -> tuple[int, ...]:
        """The lexemes (sorted) of accepted set ``k`` (an id of ``state_acc``)."""
        if self.eager:
            return tuple(self.acc_lex[self.acc_off[k]:self.acc_off[k + 1]].tolist())
        return self._acc_sets[k]

    def accepted_id(self, acc: tuple[int, ...]) -> int:
        """The id of the accepted set of lexemes ``acc`` (sorted, not empty), added if new (lock
        held): for entries of the state cache made by other grammars (:mod:`.state_cache`)."""
        if not self.eager:
            return self._intern_acc(acc)
        self._reserve(1, len(acc))
        buf = self._abuf
        buf[:len(acc)] = acc
        return int(_intern_acc(buf, len(acc), self.acc_off, self.acc_lex, self._D))

    @property
    def resolve_budget(self) -> int:
        """The speculation budget of an expansion a kernel asked for (:data:`EAGER_RESOLVE_BUDGET`
        for the compiled construction, none for the reference one)."""
        return EAGER_RESOLVE_BUDGET if self.eager else 0

    def expand_many(self, states, budget: int = 0, ladder: int = 1) -> None:
        """Expand every state of ``states`` (an eager lexer also up to ``budget`` more, breadth
        first: see :data:`EAGER_RESOLVE_BUDGET`)."""
        with self.lock, self.counting():
            if self.eager:
                self._eager_expand(states, budget, ladder=ladder)
                return
            for s in states:
                if not self.expanded[s]:
                    self.expand(s, 0)

    def inline_expander(self):
        """An expander tuple (:data:`Expander` and its records) over this lexer's arrays, for one
        kernel call that builds the states it meets (:func:`inline_resolve`), after room is made
        for a round's worth of them (:meth:`_room_for_round`). The caller
        holds ``self.lock`` (and ``counting()``) until the call returned and :meth:`after_inline`
        ran: the kernel writes the arrays as :meth:`expand_many` does. The record is kept and
        used again while its arrays are the lexer's (its ``cfg`` and ``failed`` set anew): making
        one costs more than most building calls (~11 us), and a first visit makes many calls.
        Its arrays are the published tables' (:meth:`_publish`: every reallocation of one of
        them publishes), ``expanded`` (reallocated with ``trans``) and buffers made once, but for
        the free-row queue."""
        self._room_for_round()
        kept = self._expander
        if kept is None or kept[0] is not self.tables or kept[1] is not self._free_queue:
            arrays = (self.trans, self.state_acc, self.expanded, self.acc_off, self.acc_lex, self._buf, self._pbuf,
                      self._ibuf, self._abuf, self._free_queue, self._rows_out, self._lex_arr, self._lex_null,
                      self._g0, self.st_keys, self.st_vals)
            E = kstruct(Expander(np.zeros(11, np.int64), *arrays, np.full(16, -1, np.int32)))
            self._expander = kept = (self.tables, self._free_queue, E)
        E = kept[2]
        cfg = E.cfg
        cfg[:] = 0   # rounds, speculative rows and failures counted afresh (``failed`` is read
        cfg[X_ON] = 1   # below its count only)
        cfg[X_BUDGET] = self.resolve_budget
        cfg[X_MAX_STATES] = self.max_states
        cfg[X_HARD] = self.hard_max_states
        cfg[X_FREE] = EAGER_FREE_ROWS
        cfg[X_MAX_STORED] = rowstore.MAX_STORED_EXPRS
        cfg[X_N_START] = self._n_start
        cfg[X_MAX_ROUNDS] = INLINE_MAX_ROUNDS
        return (E, self._X, self._D, self.exprs._S, rowstore.row_store(self.exprs).arrays)

    def _room_for_round(self) -> None:
        """Room for a round of inline building: ``EAGER_RESOLVE_BUDGET`` states of up to 8
        members (:meth:`_room_for_seeds`), ``EAGER_FREE_ROWS`` + 64 lexeme DFA states
        (:meth:`_reserve_g`) and 16 start sets (:meth:`_room_for_starts`). The counters up to
        which those find room (:meth:`_room_limits`) are kept with the arrays they were read
        from, so that while none of those was reallocated, a call whose counters are within
        them reserves nothing: the same arrays as reserving each time, for a few reads (the
        reservations cost ~20 us in a mask, most building calls build a few states)."""
        B, F = EAGER_RESOLVE_BUDGET, EAGER_FREE_ROWS
        D, X = self._D, self._X
        mk = self._room_mark
        if (mk is not None and mk[0] is self.tables and mk[1] is D and mk[2] is X and mk[3] is self._free_queue
                and mk[4] == B and mk[5] == F):
            lim = mk[6]
            n, mem, n_acc, acc_used = D.cnt[:4].tolist()
            if (n <= lim[0] and mem <= lim[1] and n_acc <= lim[2] and acc_used <= lim[3]
                    and X.g_cnt[0] <= lim[4] and self._n_start <= lim[5]):
                return
        self._room_for_seeds(16, B, 8)
        self._reserve_g(F + 64)
        self._room_for_starts(16)
        self._room_mark = (self.tables, self._D, self._X, self._free_queue, B, F, self._room_limits(B, 8, F + 64, 16))

    def _room_limits(self, n_new: int, m: int, k: int, starts: int) -> tuple[int, ...]:
        """The counters (states, their members, accepted sets, their lexemes, lexeme DFA states,
        start sets) up to which :meth:`_reserve` ``(n_new, m)``, :meth:`_reserve_g` ``(k)`` and
        :meth:`_room_for_starts` ``(starts)`` find room in the current arrays (after they ran:
        the arrays sized by the capacity alone are then long enough). The same conditions as
        theirs, solved for the counters."""
        D = self._D
        return (min(self.state_acc.shape[0] - n_new - 1, D.h_keys.shape[0] // 2 - n_new),
                D.ms_mem.shape[0] - n_new * m,
                min(self.acc_off.shape[0] - n_new - 2, D.a_keys.shape[0] // 2 - n_new),
                self.acc_lex.shape[0] - n_new * m,
                self._X.g_null.shape[0] - k,
                self.st_keys.shape[0] // 2 - starts)

    def after_inline(self, E) -> None:
        """After a mask call with :meth:`inline_expander`'s ``E`` (lock still held): what it
        added (the ExprSet's mirrors, the row store's count, the start table's entries, the
        generation's bounds)."""
        out = self._rows_out
        if out[3]:   # rows stored: :meth:`_after_rows` (which settles the ExprSet)
            self._after_rows(rowstore.row_store(self.exprs), out)
        else:
            self.exprs._settle()
        c = E[0].cfg.tolist()
        self._n_start = c[X_N_START]
        self.inline_rounds += c[X_ROUNDS]
        self.inline_failed += c[X_FAILED]
        if self._D.cnt[6]:   # (:meth:`_after_eager`: the kernel's bound)
            self.full = True

    def expand_chains(self, kernel, head: tuple, found: np.ndarray, deep: np.ndarray, rounds: int) -> None:
        """Expand what ``kernel(*head, rounds, budget, <the expansion's arrays>)`` names round after
        round (:func:`.mask.chain_expand`) until it reports none left; where it stops for Python,
        the expansion it began is finished here (:meth:`_eager_loop`, with the ladder the round
        asked for: ``deep[0]``) and the rounds go on. ``found`` is the kernel's frontier buffer
        (the queue is sized for it)."""
        with self.lock, self.counting():
            if not self.eager:
                raise ValueError("expand_chains needs the compiled (eager) expansion")
            ex = self.exprs
            while True:
                self._room_for_seeds(found.shape[0])
                store = rowstore.row_store(ex)
                out = self._rows_out
                st, s, left = kernel(*head, rounds, self.resolve_budget, False, self.max_states, self.hard_max_states,
                                     self._X, self.trans, self.state_acc, self.expanded, self.acc_off, self.acc_lex,
                                     self._D, self._buf, self._pbuf, self._ibuf, self._abuf, ex._S, store.arrays,
                                     EAGER_FREE_ROWS, self._free_queue, out, rowstore.MAX_STORED_EXPRS)
                self._after_rows(store, out)
                if st == lexdfa.DONE:
                    self._after_eager(0)
                    if not left or self.full:
                        return
                    continue
                # stopped for Python: finish this round's expansion the usual way, then go on
                rungs = max(1, min(int(deep[0]), rowstore.MAX_LADDER))
                self._serve(st, s, rungs)
                self._eager_loop(self.resolve_budget, False, rungs)
                if self.full:
                    return

    def expand(self, s: int, budget: int = 0) -> None:
        """Compute all 256 transitions of state ``s`` (and, breadth first, of up to ``budget``
        states it leads to that are not expanded yet)."""
        with self.lock, self.counting():
            if self.eager:
                self._eager_expand([s], budget)
                return
            todo = [s]
            done = 0
            while todo:
                s = todo.pop(0)
                if self.expanded[s]:
                    continue
                new = self._expand_one(s)
                done += 1
                if done > budget:
                    break
                todo.extend(t for t in new if not self.expanded[t])

    def _expand_one(self, s: int) -> list[int]:
        members = self._states[s]
        # the moves depend only on the members' expressions: they are computed once per ExprSet
        # (shared by every grammar compiled on it) in a lexeme-independent form, so the many
        # grammars that share JSON's lexemes (strings, numbers, punctuation) reuse them
        if len(members) == 1:
            lx0, e0 = members[0]
            key = (e0,)
            lxs = (lx0,)
        else:
            srt = sorted(members, key=_second)
            key = tuple([e for _, e in srt])
            lxs = [lx for lx, _ in srt]
        cache = self._moves_cache
        ck = pack_ids(key)   # an int key: see ExprSet on keeping memo tables off the collector
        moves = cache.get(ck)
        if moves is None:   # about 1.3 KB each: bound the memory it holds
            moves = put_bounded(cache, ck, _moves(self.exprs, key), MAX_CACHED_MOVES)
        cls, targets = moves
        ids = [0] * len(targets) + [DEAD]
        new = []
        ids_get = self._state_ids.get
        for k, tgt in enumerate(targets):
            m = tuple(sorted([(lxs[j], e) for j, e in tgt])) if len(tgt) > 1 else ((lxs[tgt[0][0]], tgt[0][1]),)
            t = ids_get(m)
            if t is None:
                t = self._intern(m)
                new.append(t)
            ids[k] = t
        self.trans[s * 256:(s + 1) * 256] = np.array(ids, dtype=np.int32)[cls]
        self.expanded[s] = True
        if len(self.exprs) - self._base_nodes > MAX_GENERATION_NODES:
            self.full = True
        return new

    # ---------------------------------------------------------------- memory
    def counting(self) -> "_Counting":
        """Count what the block adds to the ExprSet (under ``self.lock``) as this lexer's own."""
        return _Counting(self)

    def table_bytes(self) -> int:
        """Bytes of the tables kernels read (transitions, accepted sets, start states) and the
        expanded flags; what a compile's memory bound charges for its lexer."""
        return int(self.trans_bytes() + self.state_acc.nbytes + self.expanded.nbytes + self.acc_off.nbytes
                   + self.acc_lex.nbytes + self.st_keys.nbytes + self.st_vals.nbytes)

    def trans_bytes(self) -> int:
        """The memory of ``trans``: its rows in use (past them it is address space, never written)."""
        return int(min(self.trans.nbytes, 1024 * max(self.n_states, 64)))

    def held_bytes(self) -> int:
        """An estimate of the memory this generation holds: its arrays, its states (the member
        tuples and their index) and what it added to its ExprSet while it grew (expressions,
        derivatives, cached moves, slice proofs); the per-item figures of
        :mod:`.membound`. The estimate the grammar cache's byte bound evicts by."""
        arrays = self.table_bytes()
        mc = self.__dict__.get("mask_cache")
        if mc is not None:   # the state cache (:mod:`.state_cache`)
            arrays += mc.nbytes
        for m in list(self.__dict__.get("canonical_memos", {}).values()):   # (canonical.LookaheadMemo)
            arrays += m.nbytes
        for a in list(self.__dict__.get("_narrow_live", {}).values()):    # (GrammarMatcher._per_lexer_state)
            arrays += a.nbytes
        pool = self.__dict__.get("_skip_pool")      # (GrammarMatcher._skip_pool)
        if pool is not None:
            arrays += pool.nbytes
        if self.eager:   # the compiled expansion's lexeme DFAs and member store
            arrays += lexdfa.dfas_bytes(self._X) + sum(a.nbytes for a in self._D)
        return int(arrays + STATE_BYTES * len(self._states) + MEMBER_BYTES * self.n_members
                   + self.grown_exprs_bytes())

    def grown_exprs_bytes(self) -> int:
        """The estimate of what this generation added to its ExprSet."""
        return int(NODE_BYTES * self.grown_nodes + DERIV_BYTES * self.grown_derivs + MOVES_BYTES * self.grown_moves
                   + PACKED_BYTES * self.grown_packed)

    # ---------------------------------------------------------------- generations
    def successor(self) -> "Lexer":
        """An empty lexer for the same lexemes over a fresh private ExprSet (see the module
        docstring), with this one's initial state carried over."""
        src = self.exprs
        ex = ExprSet(max_nodes=src.max_nodes, max_alive_states=src.max_alive_states)
        memo: dict[int, int] = {}
        with self.lock:
            lexemes = [ex.import_expr(src, e, memo) for e in self.lexemes]
        new = Lexer(ex, lexemes, self.max_states, generation=self.generation + 1, eager=self.eager)
        new._imports[src] = memo
        if self.initial_state >= 0:
            new.initial_state = new.translate(self, self.initial_state)
        return new

    def translate(self, old: "Lexer", s: int) -> int:
        """State ``s`` of lexer ``old`` (an earlier generation of the same grammar) as a state
        here: the same lexemes at equal expressions (imported), interned, not expanded."""
        members = old.state_members(s)
        with self.lock:
            memo = self._imports.get(old.exprs)
            if memo is None:
                memo = self._imports[old.exprs] = {}
            imp = self.exprs.import_expr
            m = tuple(sorted([(lx, imp(old.exprs, e, memo)) for lx, e in members]))
            if self.eager:
                return self._eager_intern([self._g(lx, e) for lx, e in m])
            return self._intern(m)

    # ---------------------------------------------------------------- walk states
    def walk_state(self, s: int, reach) -> int:
        """A state that reads every token as ``s`` does (the same prefixes alive, the same
        lexemes accepted after each): ``s`` with every counted repetition its members cannot
        finish within one token capped, outside complements and all but one shape of
        intersections (:func:`.slicer.capped` with ``keep_and``; ``s`` itself when nothing is
        capped). ``reach``: the tokenizer's :class:`.TokenReach` (how many iterations of a body
        one token can begin), or an int ``n``, any string of at most ``n`` bytes. A mask reads
        one token, so it may walk from this state instead: the states of a long string
        (``maxLength: 255``, a new lexer state per character) share their walk states, and so
        their expansions, slice proofs and state cache entries. Memoised per state (a lexer
        serves one tokenizer; an int ``n`` is for tests)."""
        twins = self._twins
        r = twins.get(s)
        if r is not None:
            return r
        ex = self.exprs
        n, rc = (reach, None) if isinstance(reach, int) else (reach.n, reach)
        # per expression, whether capping changes it (for this reach, in the ExprSet: every
        # grammar compiled into it shares the verdicts): most new states are their own walk
        # state, which one compiled pass over their members then says without capping anything
        # (nor the lock): 3 in 4 of the new states of a 1-in-20 MaskBench pass
        vkey = (n if rc is None else rc.key, True)
        verdicts = ex.__dict__.setdefault("_cap_verdicts", {})
        if self.eager and vkey in verdicts:
            D = self._D
            verdict = self._verdicts_of(verdicts, vkey)
            begun = _NO_BEGUN if rc is None else rc.begun_array(ex)
            if _walk_same_call(D.ms_off, D.ms_mem, self._X.g_expr, ex._S, verdict, begun, s):
                r = s
        if r is None:
            from .slicer import capped

            with self.lock, self.counting():
                members = self.state_members(s)
                capd = [capped(ex, e, n, True, rc) for _, e in members]
                new = tuple(sorted([(lx, c) for (lx, _), c in zip(members, capd)]))
                if new == tuple(sorted(members)):
                    r = s
                elif self.eager:
                    r = self._eager_intern([self._g(lx, e) for lx, e in new])
                else:
                    r = self._intern(new)
                self._record_verdicts(verdicts, vkey, members, capd)
        if len(twins) > MAX_LEXER_STATES:
            twins.clear()
        twins[s] = r
        return r

    def _verdicts_of(self, verdicts: dict, vkey) -> np.ndarray:
        """The verdict array of ``vkey`` (one byte per ExprSet node), made or grown to the
        ExprSet's nodes."""
        ex = self.exprs
        verdict = verdicts.get(vkey)
        if verdict is None:
            verdict = verdicts[vkey] = np.zeros(max(1024, 2 * len(ex)), np.int8)
        elif verdict.shape[0] < len(ex):
            verdict = verdicts[vkey] = grown(verdict, len(ex), verdict.shape[0])
        return verdict

    def _record_verdicts(self, verdicts: dict, vkey, members, capd) -> None:
        """Note, for :meth:`walk_state`'s compiled pass, whether capping changed each member
        expression that holds a counter (an array over the ExprSet's nodes, grown with it:
        one byte a node)."""
        verdict = self._verdicts_of(verdicts, vkey)
        ctr = self.exprs.counter_flags()
        for (_, e), c in zip(members, capd):
            if ctr[e]:
                verdict[e] = CAP_SAME if c == e else CAP_CHANGED

    # ---------------------------------------------------------------- start states
    def start_state(self, allowed: list[int] | tuple[int, ...]) -> int:
        """The start state for a sorted list of allowed lexemes (registered in the hash table)."""
        with self.lock, self.counting():
            allowed = sorted(set(allowed))
            lexemes = self.lexemes
            if self.eager:
                g0 = self._g0
                gs = []
                for lx in allowed:
                    g = int(g0[lx])
                    if g < 0:
                        g = g0[lx] = self._g(lx, lexemes[lx])
                    gs.append(g)
                s = self._eager_intern(gs)
            else:
                members = tuple([(lx, lexemes[lx]) for lx in allowed])
                s = self._intern(members)
            arr = np.array(allowed, dtype=np.int32)
            key = int(lexeme_set_hash(arr, len(allowed)))
            if int(lookup_start(self.st_keys, self.st_vals, key)) == UNKNOWN:
                self._insert_start(key, s)
            return s

    def start_states(self, M) -> np.ndarray:
        """The start states of the lexeme sets a kernel's request buffers ``M`` ask for (one per
        set, in order), registered: :meth:`start_state` for all of them in one compiled call
        (:func:`register_starts`), after room is reserved for them all. Compiled expansion
        only."""
        cnt = M.counts
        n = int(cnt[1])
        total = int(cnt[2])
        with self.lock, self.counting():
            # room for n new states of ``total`` members (and accepted lexemes) in all, as many
            # lexeme DFA states and start-table entries
            self._reserve(n, -(-total // n))
            self._reserve_g(total)
            self._room_for_starts(n)
            out = self._start_out
            if out.shape[0] < n:
                out = self._start_out = np.zeros(2 * n, np.int32)
            r = int(_register_starts(M.start_lex, M.start_off, n, self._lex_arr, self._lex_null, self._g0, self._X,
                                     self.trans, self.state_acc, self.acc_off, self.acc_lex, self._D, self._buf,
                                     self._abuf, self.max_states, self.hard_max_states, self.st_keys, self.st_vals,
                                     out))
            self._after_eager(r)
            self._n_start += r
            return out[:n]

    def _room_for_starts(self, n: int) -> None:
        """Room for ``n`` more entries in the start table (doubled, rehashed and published while
        more than half full)."""
        if 2 * (self._n_start + n) <= self.st_keys.shape[0]:
            return
        keys, vals = self.st_keys, self.st_vals
        cap = keys.shape[0]
        while 2 * (self._n_start + n) > cap:
            cap *= 2
        nk = np.zeros(cap, dtype=np.int64)
        nv = np.zeros(cap, dtype=np.int32)
        for k, v in zip(keys.tolist(), vals.tolist()):
            if k:
                _put_start(nk, nv, k, v)
        self.st_vals, self.st_keys = nv, nk
        self._publish()

    def _insert_start(self, key: int, s: int) -> None:
        self._room_for_starts(1)
        _put_start(self.st_keys, self.st_vals, key, s)
        self._n_start += 1

    def warm_up(self, start: int, budget: int = 256) -> None:
        """Expand states reachable from ``start`` breadth first, at most ``budget`` of them
        (an eager lexer: at least :data:`EAGER_WARM_UP_BUDGET`)."""
        if self.eager:
            with self.lock, self.counting():
                self._eager_expand([start], max(budget, EAGER_WARM_UP_BUDGET), spec_rows=True)
            return
        self.expand(start, budget)
