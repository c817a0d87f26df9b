"""Hash-consed byte-level regular expressions with Brzozowski derivatives.

Every regular expression the engine uses (lexemes, slices, schema string constraints) lives in one
:class:`ExprSet`: a node is created once and named by a small int, so equal expressions have equal
ids and a derivative cache keyed by ``(id, byte)`` turns the set of expressions into a lazily built
DFA: a state is an expression id, a transition is a derivative (see docs/lexer.md).

The alphabet is bytes (0..255). Unicode is handled by the regex front end, which compiles code
point ranges to UTF-8 byte sequences before they get here.

Node kinds
    EMPTY   the empty language (id 0)
    EPS     the empty string (id 1)
    BYTES   one byte out of a set (a 256-bit int mask)
    CONCAT  a then b (right-nested)
    OR      union of a sorted tuple of children
    AND     intersection of a sorted tuple of children
    NOT     complement (over all byte strings)
    REPEAT  a repeated lo..hi times (hi = -1 for unbounded)

Simplification keeps expressions canonical enough that derivative chains close quickly; language
emptiness is exact (:meth:`ExprSet.alive` explores derivatives when AND/NOT are involved).

The nodes, their construction and their derivatives live in a compiled store
(:mod:`.nodestore`); the ``ExprSet`` keeps Python mirrors of the nodes (``kind``, ``args``, the
flags) for the structural reasoning done here and in the slicer. Callers that may add nodes (any
constructor, ``deriv``, ``transitions``, ``alive``) hold :attr:`ExprSet.lock`, as before: the
store's tables and scratch arrays are written in place.
"""
from __future__ import annotations

import threading
import weakref
from collections import deque

import numpy as np

from ..errors import GrammarTooComplexError
from . import nodestore as ns
from .kstruct import kstruct
from .lexdfa import FastCall
from .membound import DERIV_BATCH, NODE_BATCH, current

EMPTY, EPS, BYTES, CONCAT, OR, AND, NOT, REPEAT = range(8)   # as in nodestore.py
KIND_NAMES = ("EMPTY", "EPS", "BYTES", "CONCAT", "OR", "AND", "NOT", "REPEAT")
ALL_BYTES = (1 << 256) - 1
INF = -1
#: entries of the slice-containment table before it starts over
MAX_PREFIX_CACHE = 2_000_000
#: proofs cut short by their time budget and kept to be resumed (``prefixes_contain(...,
#: resume=True)``) before that table starts over, and the time one proof may take in all its calls
#: together before it answers "not contained" for good (a kept walk holds its pairs: tens of
#: thousands at most, within that time)
MAX_PARTIAL_PROOFS = 16
MAX_RESUMED_SECONDS = 0.02
#: repetition counts from this on are refused (the compiled store keeps them in int64)
MAX_COUNT = 1 << 62
#: entries of ExprSet.counted_need_bound's memo before it starts over
MAX_NEED_MEMO = 200_000
#: entries of the Python memos of :meth:`ExprSet.literal` and :meth:`ExprSet.concat` of two
#: before each is cleared (~100 bytes an entry)
MAX_CALL_MEMO = 100_000
#: the same for concat/alt/intersect of a list (:meth:`ExprSet._list_call`)
MAX_LIST_MEMO = 100_000
MAX_LIST_MEMO_LEN = 16

#: pairs :meth:`ExprSet._counted_need` may meet before it leaves a pair to the other searches
NEED_EXACT_PAIRS = 4_000
#: pairs :meth:`ExprSet._counted_bits` may meet (it meets every pair reachable: a minLength's
#: first character asks it of a format's whole pair graph, where a search stops at one word)
COUNTS_PAIRS = 600
NEED_REFUSED = -3          # past NEED_EXACT_PAIRS / COUNTS_PAIRS (kept in the memo, not the table)
MOST_UNBOUNDED = 1 << 62   # _counted_most: words with any number of factors
MOST_REFUSED = -2          # _counted_most: the pair's graph was past the exploration's limit
#: counted intersections whose counts (minimum, finite maximum) are all at most this are decided
#: by the compiled walk over their derivatives first (:meth:`ExprSet._counted_small`)
COUNTED_WALK_MAX = 16
#: pairs the most-factors exploration may meet when it is tried first (a minLength check); past it
#: the searches decide, and every pair met is remembered as refused (its next states skip it)
MOST_FIRST_PAIRS = 300


def put_bounded(memo: dict, key, value, cap: int):
    """``memo[key] = value`` in a memo of at most ``cap`` entries (full: it starts over); returns
    ``value``. The memos read it inline (``memo.get``) and call this on a miss."""
    if len(memo) >= cap:
        memo.clear()
    memo[key] = value
    return value


def _lowbit(mask: int) -> int:
    return (mask & -mask).bit_length() - 1


_py_mk3 = FastCall(ns.py_mk3)
_py_bytes = FastCall(ns.py_bytes)
_py_alt = FastCall(ns.py_alt)
_py_intersect = FastCall(ns.py_intersect)
_py_concat2 = FastCall(ns.py_concat2)
_py_concat = FastCall(ns.py_concat)
_py_alive = FastCall(ns.py_alive)
_py_complement = FastCall(ns.py_complement)
_py_repeat = FastCall(ns.py_repeat)
#: the kernels of ExprSet._list_call, tagged in its memo's keys (the low 2 bits)
_LIST_TAG = {_py_concat: 1, _py_alt: 2, _py_intersect: 3}
_py_deriv = FastCall(ns.py_deriv)
_py_literal = FastCall(ns.py_literal)
_py_transitions = FastCall(ns.py_transitions)
_py_dense_dfa = FastCall(ns.py_dense_dfa)
_py_counted_moves = FastCall(ns.py_counted_moves)
_min_length_of = FastCall(ns.min_length_of)
_may_be_infinite_of = FastCall(ns.may_be_infinite_of)
_need_put = FastCall(ns.need_put)
_need_rehash = FastCall(ns.need_rehash)
_rehash_nodes = ns.rehash_nodes
_rehash_memo = ns.rehash_memo


def _unless_refused(v: int) -> int | None:
    """A memoised count, None for :data:`NEED_REFUSED`."""
    return None if v == NEED_REFUSED else v


def _counts_decide(least: int, bits: int, lo: int, hi: int) -> int:
    """:func:`.nodestore._counts_decide` (the compiled rule, ``hi`` finite), in Python: 1, 0,
    or -1 where the counts do not say."""
    if lo == 0 and least != ns.NEED_UNKNOWN:
        return 1 if 0 <= least <= hi else 0
    if bits < 0:
        return -1
    if bits == 0:
        return 0
    if lo <= 61 and min(hi, 61) >= lo and bits & ((1 << (min(hi, 61) + 1)) - 1) & ~((1 << lo) - 1):
        return 1
    return -1 if hi >= 62 and bits & ns.BITS_OVER else 0


_MASK_BYTES: dict[int, np.ndarray] = {}


def mask_bytes(m: int) -> np.ndarray:
    """The bytes of a 256-bit byte set ``m`` as an index array, increasing (cached: the sets of a
    grammar's classes recur; read-only)."""
    r = _MASK_BYTES.get(m)
    if r is None:
        bits = np.unpackbits(np.frombuffer(m.to_bytes(32, "little"), np.uint8), bitorder="little")
        r = np.flatnonzero(bits)
        r.flags.writeable = False
        if len(_MASK_BYTES) < 100_000:
            _MASK_BYTES[m] = r
    return r


def pack_ids(xs) -> int:
    """One int naming a sequence of ints below 2**32 (its length, then each in 32 bits)."""
    k = len(xs)
    for x in xs:
        k = k << 32 | x
    return k


def _union(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    """Union of two sorted tuples of distinct ints, sorted."""
    if not a or a == b:
        return b
    if not b:
        return a
    return tuple(sorted(set(a).union(b)))


#: the most nodes :class:`_NodeArgs` keeps read
NODE_ARGS_MEMO = 4096


class _NodeArgs(dict):
    """:attr:`ExprSet.args`: a node's arguments as a tuple, ``(a, b)`` of a concatenation, the
    sorted children of a union or intersection, ``(mask,)`` of a byte set (a 256-bit int),
    ``(x, lo, hi)`` of a repetition (``hi`` -1: unbounded), ``(x,)`` of a complement, ``()`` of
    the empty set and the empty word. Read from the compiled store the first time a node is
    asked for and kept (a node never changes): most nodes, the derivatives the compiled lexer
    makes by the thousand, are never read from Python, and mirroring each as it was made cost
    a quarter of a microsecond a node. An id past the store's nodes raises IndexError.

    At most :data:`NODE_ARGS_MEMO` nodes are kept, then the memo starts again: a dict subclass
    stays tracked by the garbage collector, and every full collection of a serving process walks
    all its entries (the shared ExprSet's reached 9,800 on the 1-in-20 MaskBench sample, most of
    what such a collection walked once the state cache was packed). Reading a node again costs
    about a microsecond: with 4,096 the sample read 43,600 nodes from the store, against 41,200
    unbounded."""

    __slots__ = ("_owner",)

    def __init__(self, owner: "ExprSet"):
        super().__init__()
        self._owner = weakref.ref(owner)   # (no cycle: an ExprSet is freed by its count)

    def __missing__(self, e: int) -> tuple:
        ex = self._owner()
        v = ex._mv
        if v[9] is not ex._S:
            v = ex._views()
        mk, ma, mb, mc, _, _, mpool, mbm, mcnt, _ = v
        if not 0 <= e < mcnt[ns.C_NODES]:
            raise IndexError(f"no node {e}")
        k = mk[e]
        if k == CONCAT:
            r = (ma[e], mb[e])
        elif k == OR or k == AND:
            a = ma[e]
            r = tuple(mpool[a:a + mb[e]])
        elif k == BYTES:
            i = 4 * ma[e]
            r = (mbm[i] | mbm[i + 1] << 64 | mbm[i + 2] << 128 | mbm[i + 3] << 192,)
        elif k == REPEAT:
            r = (ma[e], mb[e], mc[e])
        elif k == NOT:
            r = (ma[e],)
        else:
            r = ()
        if len(self) >= NODE_ARGS_MEMO:
            self.clear()
        self[e] = r
        return r


class ExprSet:
    """A store of hash-consed byte regexes, their derivatives and properties."""

    EMPTY = 0
    EPS = 1
    #: counted intersections (:meth:`_alive_counted`) with a minimum count from this on are
    #: decided by the periodic layers first: depth first needs at least that many states
    counted_layers_from = 16
    #: see :meth:`_counted_small` (-1: every counted intersection to the searches over pairs)
    counted_walk_max = COUNTED_WALK_MAX

    def __init__(self, max_nodes: int = 2_000_000, max_alive_states: int = 20_000, *,
                 initial_nodes: int | None = None):
        """``initial_nodes``: room made at once for that many nodes (a power of two), their hash
        table and about four derivatives each, where a store is known to grow that big (the
        compiler's shared one); else the store starts small and doubles as it fills."""
        if not 0 < max_nodes < 1 << 32:
            raise ValueError("max_nodes must be below 2**32 (node ids are packed into keys)")
        # The nodes live in a compiled store (nodestore.py: hash-consing, construction and
        # derivatives in Numba); ``kind``, ``args`` and the flags are Python mirrors of it, for
        # the structural reasoning done here, brought up to date after every call into it
        # (:meth:`_sync`). Everything memoised here is kept out of the cyclic garbage
        # collector's way: flags in bytearrays, keys packed into ints, results as tuples of ints
        # (which the collector stops tracking) rather than lists or frozensets. A long-lived set
        # holds millions of entries; a dict with tuple keys is tracked again by every insertion
        # of a fresh key, and each full collection then walks all its keys (up to a second on a
        # big heap: a pause that lands on whatever mask is being computed).
        sizes = {} if initial_nodes is None else {"nodes": initial_nodes, "table": initial_nodes,
                                                   "memo": 4 * initial_nodes}
        self._S = kstruct(ns.new_arrays(max_nodes, **sizes))
        self.kind = bytearray()
        #: node id -> its arguments (children, a byte mask, repeat bounds), decoded on first read
        self.args = _NodeArgs(self)
        self._nullable = bytearray()
        self._has_bool = bytearray()  # contains AND or NOT: emptiness needs exploration
        self._derivs_seen = 0               # the store's derivative count at the last charge
        self._mv = (None,) * 10             # memoryviews of the store's arrays (see _views)
        self._deriv: dict[int, int] = {}    # e << 8 | byte -> derivative (asked for from Python)
        self._moves_out = np.zeros(256, np.int64)   # the pairs of one _counted_moves
        self._minlen_arr = np.full(0, -1, np.int64)   # node -> min_length (-1: not known), compiled
        self._bytes_ids: dict[int, int] = {}   # byte mask -> its byte set
        self._literals: dict[bytes, int] = {}   # literal() of two bytes or more (bounded)
        self._concats: dict[int, int] = {}      # a << 32 | b -> concat(a, b) (bounded)
        self._lists: dict[int, int] = {}        # (kernel, ids) packed -> concat/alt/intersect (bounded)
        self._classes: dict[int, tuple[int, ...]] = {}
        self._alive: dict[int, bool] = {}
        self._minlen: dict[int, float] = {}
        self._unbounded: dict[int, bool] = {}
        self._unbounded_arr = np.full(0, -1, np.int8)   # node -> may_be_infinite (-1: not known), compiled
        self._subset_cache: dict[int, bool] = {}   # c << 32 | x
        self._fm: dict[int, tuple[int, ...]] = {}  # sorted first-byte masks
        self._partition_cache: dict[tuple[int, ...], tuple[int, ...]] = {}
        self._trans: dict[int, tuple[tuple[int, int], ...]] = {}
        #: :meth:`first_bytes` memo (the union of an expression's transition masks)
        self._first: dict[int, int] = {}
        self.max_nodes = max_nodes
        self.max_alive_states = max_alive_states
        #: held by every writer: compilers, lexers and slice checks of all grammars sharing the set
        self.lock = threading.RLock()
        self._prefix_cache: dict[int, bool] = {}   # s << 32 | u
        #: s << 32 | u -> (pairs seen, pairs to explore, seconds spent): proofs to resume
        self._prefix_partial: dict[int, tuple] = {}
        # (x << 32 | s) << 32 | r -> an upper bound of the factors of r to begin from the pair
        # (x, s) to a word of x & s r*, or -1 where there is none (see _alive_counted)
        self._counted_memo: dict[int, int] = {}
        # (x << 32 | s) << 32 | r -> a bound of the factors needed from every pair reachable
        # from (x, s) (see counted_need_bound), or -1 where the exploration was refused
        self._need_memo: dict[int, int] = {}
        self._within: dict[int, bool] = {}   # (x << 32 | p) << 32 | r -> within_star
        # (x << 32 | s) << 32 | r -> the fewest factors of r a word of x & s r* begins from the
        # pair (x, s), -1 where none: exact (see _counted_need); mirrored in the store's table,
        # where the compiled emptiness checks read it
        self._need_exact: dict[int, int] = {}
        # the same keys -> the counts of factors the pair's words begin (see _counted_bits)
        self._count_bits: dict[int, int] = {}
        # (x << 32 | s) << 32 | r -> the most factors of r any word of x & s r* begins
        # (MOST_UNBOUNDED: no bound), -1 where it has no word (see _counted_most)
        self._most_memo: dict[int, int] = {}
        self._byte_ids = [EMPTY] * 256   # byte -> its one-byte set (EMPTY: not made yet)
        assert self._call(_py_mk3, EMPTY, 0, 0, 0) == 0 and self._call(_py_mk3, EPS, 0, 0, 0) == 1

    # ------------------------------------------------------------------ the compiled store
    def _call(self, fn, *args) -> int:
        """``fn(store, *args)`` (a kernel of :mod:`.nodestore`): its result, once the store has
        grown and the call was made again if it ran out of room, and the mirrors are up to
        date."""
        r = fn(self._S, *args)
        if 0 <= r < ns.NEW_NODES:
            return r
        return self._after(r, fn, args)

    def _after(self, r: int, fn, args) -> int:
        while r < 0:
            self._make_room()
            r = fn(self._S, *args)
        if r & ns.GROW_SOON:
            self._grow()
        if r & ns.NEW_NODES:
            self._sync()
        return r & (ns.NEW_NODES - 1)

    def _make_room(self) -> None:
        """After a kernel stopped for want of room (its status): grow the store, or raise past
        ``max_nodes``."""
        cnt = self._S.cnt
        st = cnt[ns.C_STATUS]
        cnt[ns.C_STATUS] = ns.DONE
        if st == ns.TOO_MANY:
            self._sync()
            raise GrammarTooComplexError(f"regular expressions exceed {self.max_nodes} nodes")
        self._grow()

    def _settle(self) -> None:
        """After a kernel that writes the store and returns no flags (the row store's, the
        lexer's): the mirrors brought up to date, and the store grown if it asked to be."""
        cnt = self._S.cnt
        if cnt[ns.C_NODES] != cnt[ns.C_SYNCED]:
            self._sync()
        if cnt[ns.C_GROW]:
            self._grow()

    def _grow(self) -> None:
        """A new store record where an array is half full (tables rehashed)."""
        S = self._S
        cnt = S.cnt
        cnt[ns.C_GROW] = 0
        n = int(cnt[ns.C_NODES])
        new = {}

        def more(name, used, need=0):
            x = getattr(S, name)
            if 2 * (used + need + 1) > x.shape[0]:
                size = x.shape[0]
                while 2 * (used + need + 1) > size:
                    size *= 2
                y = np.zeros((size,) + x.shape[1:], x.dtype)
                y[:used] = x[:used]
                new[name] = y

        for name in ("kind", "a", "b", "c", "nul", "hb", "liv", "ctr", "mark", "mark2"):
            more(name, n)
        more("pool", int(cnt[ns.C_POOL]), int(cnt[ns.C_POOL_NEED]))
        cnt[ns.C_POOL_NEED] = 0
        more("bm", int(cnt[ns.C_BM]))
        # each table rehashed only when it is the one half full (a rehash of the derivative memo
        # cost 5-10 ms at 0.5-1M slots, on whatever mask made the node that filled the other)
        if 2 * (int(cnt[ns.C_HT]) + 1) > S.htab.shape[0]:
            new["htab"] = np.zeros(2 * S.htab.shape[0], np.int64)
            _rehash_nodes(S, new["htab"])
        if 2 * (int(cnt[ns.C_DM]) + 1) > S.dkey.shape[0]:
            new["dkey"] = np.zeros(2 * S.dkey.shape[0], np.int64)
            new["dval"] = np.zeros(new["dkey"].shape[0], np.int64)
            _rehash_memo(S, new["dkey"], new["dval"])
        if new:
            self._S = kstruct(S._tuple._replace(**new))

    def _views(self):
        """Memoryviews of the store's arrays (Python reads an int from one without numpy's
        scalar boxing: a sync adds one or two nodes at a time)."""
        S = self._S
        v = self._mv = (memoryview(S.kind), memoryview(S.a), memoryview(S.b), memoryview(S.c),
                        memoryview(S.nul), memoryview(S.hb), memoryview(S.pool),
                        memoryview(S.bm.reshape(-1)), memoryview(S.cnt), S)
        return v

    def _sync(self) -> None:
        """Add the nodes the store made since the last call to the Python mirrors of the kinds and
        flags (:attr:`args` reads a node when asked), and count them, and the derivatives made,
        against the active compile's memory bound."""
        v = self._mv
        if v[9] is not self._S:
            v = self._views()
        mk, _, _, _, mnul, mhb, _, _, mcnt, _ = v
        n0 = len(self.kind)
        n = mcnt[ns.C_NODES]
        mcnt[ns.C_SYNCED] = n
        if n == n0 + 1:   # (most syncs: appends cost a third of slices)
            self.kind.append(mk[n0])
            self._nullable.append(mnul[n0])
            self._has_bool.append(mhb[n0])
        else:
            self.kind += mk[n0:n]
            self._nullable += mnul[n0:n]
            self._has_bool += mhb[n0:n]
        # charged once the mirrors are whole (the charge may raise)
        d = mcnt[ns.C_DERIVS]   # charged with the nodes (a derivative alone adds little)
        m = current()   # the compile memory bound (membound.py), counted in batches
        if m is not None:
            m.nodes += n - n0
            m.derivs += d - self._derivs_seen
        self._derivs_seen = d
        if m is not None and (m.nodes >= NODE_BATCH or m.derivs >= DERIV_BATCH):
            m.flush()

    def has_counter(self, e: int) -> bool:
        """Whether ``e`` holds, outside complements, a counted repetition ``x{lo,hi}`` with a
        finite ``hi`` above ``max(lo, 1)`` (what :func:`.slicer.capped` may lower; the store's
        flag, set as nodes are made)."""
        return bool(self._S.ctr[e])

    def counter_flags(self):
        """:meth:`has_counter` of every node, indexable (a view of the store's flags: valid
        until the next node is made)."""
        return memoryview(self._S.ctr)

    def counter_array(self) -> np.ndarray:
        """:meth:`counter_flags` as the store's array (for compiled callers; replaced when the
        store grows)."""
        return self._S.ctr

    @property
    def n_derivs(self) -> int:
        """Derivatives made so far (all time; each memoised in the store)."""
        return int(self._S.cnt[ns.C_DERIVS])

    def _list_call(self, fn, xs) -> int:
        # memoised like concat2 (up to MAX_LIST_MEMO_LEN ids), keyed by the ids (an int key:
        # see __init__) and the kernel's tag in the low 2 bits
        if len(xs) > MAX_LIST_MEMO_LEN:
            return self._list_call_store(fn, xs)
        k = pack_ids(xs) << 2 | _LIST_TAG[fn]
        r = self._lists.get(k)
        if r is None:
            r = put_bounded(self._lists, k, self._list_call_store(fn, xs), MAX_LIST_MEMO)
        return r

    def _list_call_store(self, fn, xs) -> int:
        S = self._S
        n = len(xs)
        if n > S.xs.shape[0]:
            self._S = S = kstruct(S._tuple._replace(xs=np.zeros(2 * n, np.int64)))
        S.xs[:n] = xs
        return self._call(fn, n)

    # ------------------------------------------------------------------ construction
    def __len__(self) -> int:
        return len(self.kind)

    def byteset(self, mask: int) -> int:
        mask &= ALL_BYTES
        if not mask:
            return EMPTY
        i = self._bytes_ids.get(mask)
        if i is None:
            self._S.tw[0] = np.frombuffer(mask.to_bytes(32, "little"), np.uint64)
            i = self._bytes_ids[mask] = self._call(_py_bytes)
        return i

    def byte_range(self, lo: int, hi: int) -> int:
        if lo > hi:
            return EMPTY
        return self.byteset(((1 << (hi + 1)) - 1) ^ ((1 << lo) - 1))

    def any_byte(self) -> int:
        return self.byteset(ALL_BYTES)

    def single_bytes(self, data: bytes) -> list[int]:
        """The one-byte set of each byte of ``data``, in order."""
        byte_ids = self._byte_ids
        return [byte_ids[b] or self._single_byte(b) for b in data]

    def _single_byte(self, b: int) -> int:
        i = self._byte_ids[b] = self.byteset(1 << b)
        return i

    def literal(self, data: bytes | str) -> int:
        if isinstance(data, str):
            data = data.encode("utf-8")
        if len(data) == 1:
            return self._byte_ids[data[0]] or self._single_byte(data[0])
        if not data:
            return EPS
        r = self._literals.get(data)
        if r is None:
            r = put_bounded(self._literals, data, self._call(_py_literal, np.frombuffer(data, np.uint8)),
                            MAX_CALL_MEMO)
        return r

    def concat(self, *xs: int) -> int:
        n = len(xs)
        if n <= 2:
            return EPS if n == 0 else xs[0] if n == 1 else self._concat2(xs[0], xs[1])
        return self._list_call(_py_concat, xs)

    def _concat2(self, a: int, b: int) -> int:
        # memoised here too: the store hash-conses, but a compile asks again for most of its
        # pairs (the same leading whitespace and token, key and colon: 4 in 5 calls on
        # MaskBench), and a dict read costs a tenth of the kernel call
        k = a << 32 | b
        r = self._concats.get(k)
        if r is None:
            r = put_bounded(self._concats, k, self._call(_py_concat2, a, b), MAX_CALL_MEMO)
        return r

    def alt(self, *xs: int) -> int:
        if len(xs) == 1 and self.kind[xs[0]] != OR:
            return xs[0]   # a union of one expression (a byte set, EPS, EMPTY included) is itself
        return self._list_call(_py_alt, xs)

    def intersect(self, *xs: int) -> int:
        if len(xs) == 1 and self.kind[xs[0]] != AND:
            return xs[0]   # an intersection of one expression is itself
        return self._list_call(_py_intersect, xs)

    def complement(self, a: int) -> int:
        if self.kind[a] == NOT:
            return self.args[a][0]
        return self._call(_py_complement, a)

    def repeat(self, a: int, lo: int, hi: int | None = None) -> int:
        """``a{lo,hi}``; ``hi=None`` (or -1) is unbounded."""
        if hi is None:
            hi = INF
        if hi != INF and hi < lo:
            return EMPTY
        if hi == 0:
            return EPS
        if lo >= MAX_COUNT or hi >= MAX_COUNT:
            raise GrammarTooComplexError(f"repetition count {max(lo, hi)} is too large")
        return self._call(_py_repeat, a, lo, hi)   # simplified there (nodestore.repeat)

    def star(self, a: int) -> int:
        return self.repeat(a, 0, INF)

    def plus(self, a: int) -> int:
        return self.repeat(a, 1, INF)

    def opt(self, a: int) -> int:
        return self.repeat(a, 0, 1)

    # ------------------------------------------------------------------ properties
    def nullable(self, e: int) -> bool:
        return self._nullable[e] == 1

    def has_bool(self, e: int) -> bool:
        return self._has_bool[e] == 1

    def deriv(self, e: int, b: int) -> int:
        """Brzozowski derivative of ``e`` by byte ``b`` (memoised in the store, and here for
        the derivatives asked for from Python)."""
        key = e << 8 | b
        r = self._deriv.get(key)
        if r is None:
            r = self._deriv[key] = self._call(_py_deriv, e, b)
        return r

    def _first_masks(self, e: int) -> tuple[int, ...]:
        """The byte masks that can be read first in ``e`` (memoised per node): the derivative of
        ``e`` is constant on each cell of their common refinement."""
        r = self._fm.get(e)
        if r is not None:
            return r
        k = self.kind[e]
        if k == BYTES:
            r = (self.args[e][0],)
        elif k == CONCAT:
            x, y = self.args[e]
            r = self._first_masks(x)
            if self._nullable[x]:
                r = _union(r, self._first_masks(y))
        elif k == OR or k == AND:
            r = ()
            for x in self.args[e]:
                r = _union(r, self._first_masks(x))
        elif k == NOT or k == REPEAT:
            r = self._first_masks(self.args[e][0])
        else:
            r = ()
        self._fm[e] = r
        return r

    def byte_classes(self, e: int) -> tuple[int, ...]:
        """A partition of the 256 bytes into masks on which the derivative of ``e`` is constant."""
        r = self._classes.get(e)
        if r is not None:
            return r
        r = self._classes[e] = self._partition(self._first_masks(e))
        return r

    def _partition(self, masks: tuple[int, ...]) -> tuple[int, ...]:
        """The common refinement of ``masks`` (and their complements) into byte classes."""
        r = self._partition_cache.get(masks)
        if r is None:
            parts = [ALL_BYTES]
            for m in masks:
                nxt = []
                for p in parts:
                    a = p & m
                    if a:
                        nxt.append(a)
                        b = p & ~m
                        if b:
                            nxt.append(b)
                    else:
                        nxt.append(p)
                parts = nxt
            r = tuple(parts)
            self._partition_cache[masks] = r
        return r

    def transitions(self, e: int) -> tuple[tuple[int, int], ...]:
        """``[(byte_mask, target)]`` for every live derivative of ``e`` (dead ones left out), one
        per byte class of ``e`` (classes in the order of their lowest byte)."""
        r = self._trans.get(e)
        if r is not None:
            return r
        n = self._call(_py_transitions, e)
        S = self._S
        masks = S.tw[:n].tobytes()
        tgt = S.tt[:n].tolist()
        r = [(int.from_bytes(masks[32 * j:32 * j + 32], "little"), tgt[j]) for j in range(n)]
        if self._has_bool[e]:
            r = [(m, t) for m, t in r if self.alive(t)]
        r = self._trans[e] = tuple(r)
        return r

    def dense_dfa(self, e: int, max_states: int):
        """The DFA of ``e`` from its derivatives: ``(table, accept)``, ``table[s, b]`` the state
        after byte ``b`` (int32, -1 dead), state 0 ``e`` itself, the others numbered breadth
        first; None past ``max_states`` states. Without intersections or complements in ``e``
        (every derivative alive) it is one compiled call (:func:`.nodestore.dense_dfa_of`): a
        body of Unicode letters (~190 states) took ~8 ms here, inside a mask (``TokenReach.begun``)."""
        if self._has_bool[e]:
            return self._dense_dfa_py(e, max_states)
        cap = max(1, int(max_states))
        table = np.empty((cap, 256), np.int32)
        ids = np.empty(cap, np.int64)
        keys = np.empty(1 << (2 * cap - 1).bit_length(), np.int64)
        n = self._call(_py_dense_dfa, e, table, ids, keys)
        if n > cap:
            return None
        nullable = self._nullable
        return table[:n].copy(), np.array([nullable[x] for x in ids[:n].tolist()], dtype=np.bool_)

    def _dense_dfa_py(self, e: int, max_states: int):
        """:meth:`dense_dfa` over :meth:`transitions` (dead targets of intersections and
        complements left out; the reference of the compiled one, in the tests)."""
        states = {e: 0}
        order = [e]
        rows = []
        i = 0
        while i < len(order):
            x = order[i]
            i += 1
            row = np.full(256, -1, np.int32)
            for m, t in self.transitions(x):
                j = states.get(t)
                if j is None:
                    if len(order) >= max_states:
                        return None
                    j = states[t] = len(order)
                    order.append(t)
                row[mask_bytes(m)] = j
            rows.append(row)
        return np.stack(rows), np.array([self.nullable(x) for x in order], dtype=np.bool_)

    def ladder_next(self, e: int, tr) -> int:
        """The next rung of ``e`` when its transitions ``tr`` are those of a shape that a run of
        bytes walks down: ``c y`` (``c`` a byte set) reads ``c`` into ``y``;
        ``c{0,h} y`` (no byte of ``c`` starting ``y``, ``h`` finite) reads ``c`` into
        ``c{0,h-1} y``. -1 otherwise. The row store stores a whole ladder at once
        (:mod:`.rowstore`), so that a run of whitespace or the bytes of a key are walked by the
        compiled expansion without a round trip per byte."""
        if not tr or self.kind[e] != CONCAT:
            return -1
        head, y = self.args[e]
        k = self.kind[head]
        if k == BYTES:
            return y if len(tr) == 1 and self.kind[y] == CONCAT else -1
        if k != REPEAT:
            return -1
        x, lo, hi = self.args[head]
        if lo != 0 or hi == INF or self.kind[x] != BYTES:
            return -1
        cm = self.args[x][0]
        for m, t in tr:
            if m == cm:   # the class of ``c``'s bytes: the next rung if they move to it alone
                if hi == 1:
                    return t if t == y else -1
                if self.kind[t] == CONCAT and self.args[t][1] == y:
                    h2 = self.args[t][0]
                    if self.kind[h2] == REPEAT and self.args[h2] == (x, 0, hi - 1):
                        return t
                return -1
        return -1

    def alive(self, e: int) -> bool:
        """True iff the language of ``e`` is non-empty (exact)."""
        if e == EMPTY:
            return False
        if not self._has_bool[e] or self._nullable[e]:
            return True
        r = self._alive.get(e)
        if r is not None:
            return r
        r = self._alive_structural(e)
        if r is None:
            # a compiled walk over the derivatives (nodestore.alive_search), which stops at the
            # derivatives decided before (here or by earlier walks: the store keeps both)
            r = self._call(_py_alive, e, self.max_alive_states)
            if r == 0:
                # undecided: a small counted intersection (:meth:`_counted_small`) left to the
                # walk goes to the searches over pairs after all
                r = self._alive_counted(e) if self.kind[e] == AND else None
                if r is None:
                    raise GrammarTooComplexError("emptiness check of a regex intersection/complement exceeded its state bound")
            else:
                r = r == 2
        self._alive[e] = r
        self._S.liv[e] = ns.LIVE if r else ns.DEAD
        return r

    def _alive_structural(self, e: int) -> bool | None:
        """Emptiness from the structure where that is exact (None: explore the automaton).
        Concatenations, unions and repeats reduce to their parts; ``x & .{lo,hi}`` with ``x``
        free of intersections/complements (length bounds of formats, ``maxLength``) is decided
        by the shortest word of ``x``, which avoids exploring the product automaton. Other
        intersections with a counter go to the searches over pairs (:meth:`_alive_counted`),
        but those whose counts are small to the compiled walk (:meth:`_counted_small`)."""
        k = self.kind[e]
        if k == CONCAT:
            while self.kind[e] == CONCAT:
                x, e = self.args[e]
                if not self.alive(x):
                    return False
            return self.alive(e)
        if k == OR:
            return any(self.alive(x) for x in self.args[e])
        if k == REPEAT:
            return self.args[e][1] == 0 or self.alive(self.args[e][0])
        if k == AND and len(self.args[e]) == 2:
            a, b = self.args[e]
            for x, y in ((a, b), (b, a)):
                if (self.kind[y] == REPEAT and self.args[y][0] == self.any_byte()
                        and not self._has_bool[x]):
                    _, lo, hi = self.args[y]
                    n = self.min_length(x)
                    if hi != INF and n > hi:
                        return False
                    if n >= lo:
                        return True
        if k == AND:
            return None if self._counted_small(e) else self._alive_counted(e)
        return None

    def head_and_repeat(self, c: int):
        """``(p, r, lo, hi)`` when ``c`` is ``p r{lo,hi}`` (``p`` the concatenation before a
        final repeat, EPS for none) free of intersections/complements, else None."""
        if self._has_bool[c]:
            return None
        kind, args = self.kind, self.args
        heads = []
        while kind[c] == CONCAT:
            a, c = args[c]
            heads.append(a)
        if kind[c] != REPEAT:
            return None
        r, lo, hi = args[c]
        return self.concat(*heads), r, lo, hi

    def _counted_part(self, c: int):
        """:meth:`head_and_repeat` when the repeat is a counter (``lo > 1`` or a finite
        ``hi > 1``), else None."""
        hr = self.head_and_repeat(c)
        if hr is None:
            return None
        p, r, lo, hi = hr
        if lo <= 1 and (hi == INF or hi <= 1):
            return None
        if self._nullable[r]:
            lo = 0   # empty factors pad any count up to ``lo``
        return p, r, lo, hi

    def _counted_small(self, e: int) -> bool:
        """Whether the intersection ``e`` has a counted part (:meth:`_counted_part`) and none
        counts past :data:`COUNTED_WALK_MAX`: its derivatives then differ in at most that many
        counts, and the compiled walk over them (:meth:`alive`) is cheaper than the searches
        over pairs (Github_hard---o69972's ``email & pattern & .{6,}``: 85 ms of Python searches
        in one first visit, 5 ms walked)."""
        most = -1
        for c in self.args[e]:
            cp = self._counted_part(c)
            if cp is not None:
                most = max(most, cp[2], cp[3])
        return 0 <= most <= self.counted_walk_max

    def _alive_counted(self, e: int) -> bool | None:
        """Emptiness of ``x & p r{lo,hi}`` (``p``, ``r`` free of intersections/complements,
        ``x`` the intersection of the other parts) without unrolling the counter (None: no part
        of that shape).

        The derivatives of such an intersection carry the count left in every state, so exploring
        them is a product with the counter: ``maxLength: 65536`` over a pattern or format with a
        loop (``[a-z]+@…``, a URI's ``[v1.x]`` host) makes tens of thousands of states that differ
        only in the count. Here a state is a pair ``(x', s)``: ``x'`` a derivative of ``x``, ``s``
        one of ``p`` or of the current factor ``r``. A byte either continues ``s`` or, where ``s``
        is nullable, begins a factor (``r``'s derivative); a word is in the intersection iff some
        path of its bytes ends in a pair with both parts nullable having begun between ``lo`` and
        ``hi`` factors.

        Two exact searches: :meth:`_counted_search`, depth first over pairs and the factors
        begun up to ``lo``, stops at the first word it meets; :meth:`_counted_layered` takes the
        sets of pairs reachable with exactly ``0, 1, …, lo`` factors, each from the one before
        (they repeat periodically as soon as one set recurs: the rest of the way to ``lo`` is
        skipped), then the least number of factors from the pairs at ``lo``: bounded by the pairs
        (those of ``x`` times those of ``r``), not by ``lo`` or ``hi``. The first is tried first
        below ``counted_layers_from``; the other one where the first is not conclusive (its
        words all begin too many factors) or meets too many states."""
        best_c = None
        for c in self.args[e]:
            cp = self._counted_part(c)
            if cp is not None and (best_c is None or max(cp[2], cp[3]) > max(best_c[1][2], best_c[1][3])):
                best_c = (c, cp)
        if best_c is None:
            return None
        c, (p, r, lo, hi) = best_c
        x = self.intersect(*[y for y in self.args[e] if y != c])
        if x == EMPTY:
            return False
        if lo == 0:
            # the least count of the pair decides every count at once, and goes to the compiled
            # table: the next states of the string, which differ only in the count left, are
            # then decided without Python
            least = self._counted_need(x << 32 | p, r)
            if least is not None:
                return 0 <= least and (hi == INF or least <= hi)
        elif lo == hi:
            # an exact length: the counts of the pair, likewise (only there: the set of counts
            # needs every pair reachable, where the searches below stop at the first word in
            # range; a format's graph under a minLength past COUNTS_PAIRS made each state of
            # Github_easy---o58907's email explore it again, 0.5 s a state)
            got = self._counted_bits(x << 32 | p, r)
            if got is not None:
                d = _counts_decide(ns.NEED_UNKNOWN, got, lo, hi)
                if d >= 0:
                    return d == 1
        # depth first needs at least ``lo`` states: from large minimums on, the layers first,
        # and with no maximum (``minLength``) the most factors, which is the same for every count
        methods = (self._counted_search, self._counted_layered)
        if lo >= self.counted_layers_from:
            methods = methods[::-1]
        if hi == INF:
            methods = (self._counted_at_least,) + methods
        err = None
        for method in methods:
            try:
                res = method(x << 32 | p, r, lo, hi)
            except GrammarTooComplexError as exc:
                err = exc
                continue
            if res is not None:
                return res
        raise err

    def _counted_need(self, start: int, r: int) -> int | None:
        """The fewest factors of ``r`` that a word of ``x & p r*`` begins, from the pair
        ``start = x << 32 | p``; -1 where there is no word; None past :data:`NEED_EXACT_PAIRS`
        pairs (a format's pair graph can be large: the searches that stop at the first word
        decide those). Exact: the pairs (:meth:`_counted_moves`) are searched cheapest first (an edge
        weighs 1 where it begins a factor), and a pair whose least count is known already is a
        leaf that ends in a word at that many more. Every pair on the cheapest path gets its own
        least count (the rest of that path: a cheaper one from it would make a cheaper path from
        ``start``), and every pair of a search that met no word gets -1; all of them go to the
        store's table (:func:`.nodestore.counted_lookup`), which decides the intersections of
        those pairs for any count in compiled code."""
        import heapq

        memo = self._need_exact
        got = memo.get(start << 32 | r)
        if got is not None:
            return _unless_refused(got)
        nullable = self._nullable
        dist = {start: 0}
        parent = {start: -1}
        heap = [(0, start)]
        best, end = -1, -1
        limit = NEED_EXACT_PAIRS
        while heap:
            d, k = heapq.heappop(heap)
            if d > dist[k]:
                continue
            if best >= 0 and d >= best:
                break
            known = memo.get(k << 32 | r) if k != start else None
            if known is not None:
                if known >= 0 and (best < 0 or d + known < best):
                    best, end = d + known, k
                continue
            if nullable[k >> 32] and nullable[k & 0xFFFFFFFF]:
                best, end = d, k
                continue
            for new in ((False, True) if nullable[k & 0xFFFFFFFF] else (False,)):
                d2 = d + new
                for t in self._counted_moves(k, r, new):
                    old = dist.get(t)
                    if old is None or d2 < old:
                        dist[t] = d2
                        parent[t] = k
                        heapq.heappush(heap, (d2, t))
            if len(dist) > limit:
                # every pair met is refused (in the memo only: the other methods decide): the
                # next states of the string are pairs met, and each would explore again
                for k2 in dist:
                    memo.setdefault(k2 << 32 | r, NEED_REFUSED)
                return None
        if len(memo) > MAX_NEED_MEMO:
            self._need_clear()
        if best < 0:
            for k in dist:
                self._need_store(k, r, -1)
            return -1
        k = end
        while k >= 0:
            if (k << 32 | r) not in memo:
                self._need_store(k, r, best - dist[k])
            k = parent[k]
        return best

    def _need_store(self, k: int, r: int, v: int | None = None, bits: int | None = None) -> None:
        """``v``, the least count of pair ``k`` with factor ``r``, and/or ``bits``, its counts
        (see :meth:`_counted_bits`), in the memos and the store's table (grown when half full),
        beside what is known of the pair already."""
        key = k << 32 | r
        if v is None:
            got = self._need_exact.get(key)
            v = ns.NEED_UNKNOWN if got is None or got == NEED_REFUSED else got
        else:
            self._need_exact[key] = v
        if bits is None:
            got = self._count_bits.get(key)
            bits = -1 if got is None or got == NEED_REFUSED else got
        else:
            self._count_bits[key] = bits
        while not _need_put(self._S, k, r, v, bits):
            S = self._S
            size = 2 * S.nkey.shape[0]
            nk, nr, nv, nb = (np.zeros(size, np.int64) for _ in range(4))
            _need_rehash(S, nk, nr, nv, nb)
            self._S = kstruct(S._tuple._replace(nkey=nk, nkr=nr, nval=nv, nbit=nb))

    def _need_clear(self) -> None:
        """Empty the store's count table and both its memos (past :data:`MAX_NEED_MEMO`)."""
        self._need_exact.clear()
        self._count_bits.clear()
        S = self._S
        size = ns.NEED_TABLE
        S.cnt[ns.C_NT] = 0
        self._S = kstruct(S._tuple._replace(nkey=np.zeros(size, np.int64), nkr=np.zeros(size, np.int64),
                                           nval=np.zeros(size, np.int64), nbit=np.zeros(size, np.int64)))

    def _counted_bits(self, start: int, r: int) -> int | None:
        """The counts of factors of ``r`` that the words of ``x & p r*`` begin, from the pair
        ``start = x << 32 | p``: bit ``k`` for each count ``k`` up to 61, bit 62 if some count is
        past 61 (:data:`.nodestore.BITS_OVER`); None past :data:`COUNTS_PAIRS` pairs (each
        pair met is then refused: the searches decide it and its derivatives).

        Every pair reachable from ``start`` is met (:meth:`_counted_moves`; a pair whose counts
        are known is a leaf), then the counts flow backwards to a fixpoint: a pair with both
        parts nullable has 0; a move that begins a factor adds one to its target's counts (a
        count past 61 stays past it), one that does not passes them on. Exact for every pair
        met, and all go to the store's table: an exact length (``minLength`` = ``maxLength``,
        Github_easy---o44204's ten digits) makes every state of the string a pair of this graph
        with a count of its own left, each a fresh search before."""
        from collections import deque

        memo = self._count_bits
        got = memo.get(start << 32 | r)
        if got is not None:
            return _unless_refused(got)
        nullable = self._nullable
        index = {start: 0}
        pairs = [start]
        zero: list[list[int]] = []
        one: list[list[int]] = []
        bits: list[int] = []
        i = 0
        while i < len(pairs):
            k = pairs[i]
            z: list[int] = []
            o: list[int] = []
            known = memo.get(k << 32 | r) if i else None
            if known is not None and known != NEED_REFUSED:
                bits.append(known)
            else:
                bits.append(1 if nullable[k >> 32] and nullable[k & 0xFFFFFFFF] else 0)
                for new in ((False, True) if nullable[k & 0xFFFFFFFF] else (False,)):
                    for t in self._counted_moves(k, r, new):
                        j = index.get(t)
                        if j is None:
                            j = index[t] = len(pairs)
                            pairs.append(t)
                        (o if new else z).append(j)
                if len(pairs) > COUNTS_PAIRS:
                    # every pair met refused (the memo only: the searches decide), as above
                    for k2 in pairs:
                        memo.setdefault(k2 << 32 | r, NEED_REFUSED)
                    return None
            zero.append(z)
            one.append(o)
            i += 1
        n = len(pairs)
        back0: list[list[int]] = [[] for _ in range(n)]
        back1: list[list[int]] = [[] for _ in range(n)]
        for v in range(n):
            for w in zero[v]:
                back0[w].append(v)
            for w in one[v]:
                back1[w].append(v)
        low, over = ns.BITS_LOW, ns.BITS_OVER
        work = deque(v for v in range(n) if bits[v])
        queued = bytearray(n)
        for v in work:
            queued[v] = 1
        while work:
            w = work.popleft()
            queued[w] = 0
            b = bits[w]
            sb = ((b & low) << 1) & low | (over if b & over or b & (1 << 61) else 0)
            for vs, add in ((back0[w], b), (back1[w], sb)):
                for v in vs:
                    nb = bits[v] | add
                    if nb != bits[v]:
                        bits[v] = nb
                        if not queued[v]:
                            queued[v] = 1
                            work.append(v)
        if len(memo) > MAX_NEED_MEMO:
            self._need_clear()
        for v in range(n):
            if memo.get(pairs[v] << 32 | r, NEED_REFUSED) != NEED_REFUSED:
                continue   # known before (a leaf here)
            b = bits[v]
            least = (b & -b).bit_length() - 1 if b & low else (-1 if not b else None)
            self._need_store(pairs[v], r, least, b)
        return bits[0]

    def _counted_at_least(self, start: int, r: int, lo: int, hi: int) -> bool | None:
        """``x & p r{lo,}`` (``hi`` infinite): alive iff some word begins at least ``lo`` factors
        (None: the pairs are too many to explore first, see :data:`MOST_FIRST_PAIRS`)."""
        assert hi == INF
        most = self._counted_most(start, r, MOST_FIRST_PAIRS)
        return None if most is None else most >= lo

    def _counted_most(self, start: int, r: int, limit: int | None = None) -> int | None:
        """The most factors of ``r`` that a word of ``x & p r*`` begins, from the pair
        ``start = x << 32 | p``: -1 if there is no word, :data:`MOST_UNBOUNDED` if there is no
        bound, None when more than ``limit`` pairs (default :attr:`max_alive_states`) are met.
        Exact, and independent of any count: every pair met is memoised, and the derivatives of
        ``x & p r{lo,}`` (the next lexer states of a ``minLength`` string) are pairs met, so
        each is then answered by a lookup whatever its count left. A refusal is memoised too
        (:data:`MOST_REFUSED`, for every pair met), so the next states do not explore again.

        The graph of pairs (:meth:`_counted_moves`, an edge weighing 1 where it begins a factor)
        is explored forward from ``start`` (a memoised pair is a leaf with its known value);
        words end at pairs with both parts nullable. A cycle with a factor edge among pairs that
        lie on a path to a word makes the count unbounded; otherwise the most is the longest
        path over the acyclic condensation."""
        memo = self._most_memo
        got = memo.get(start << 32 | r)
        if got is not None:
            return None if got == MOST_REFUSED else got
        if limit is None:
            limit = self.max_alive_states
        nullable = self._nullable
        index = {start: 0}
        pairs = [start]
        edges: list[list[tuple[int, int]]] = []   # source -> [(target, weight)]
        i = 0
        while i < len(pairs):
            k = pairs[i]
            out: list[tuple[int, int]] = []
            known = memo.get(k << 32 | r)
            if known is None:
                for new in ((False, True) if nullable[k & 0xFFFFFFFF] else (False,)):
                    for t in self._counted_moves(k, r, new):
                        j = index.get(t)
                        if j is None:
                            j = index[t] = len(pairs)
                            pairs.append(t)
                        out.append((j, int(new)))
            if known == MOST_REFUSED or len(pairs) > limit:
                if len(memo) > MAX_NEED_MEMO:
                    memo.clear()
                for k2 in pairs:
                    memo.setdefault(k2 << 32 | r, MOST_REFUSED)
                return None
            edges.append(out)
            i += 1
        n = len(pairs)
        # strongly connected components (iterative Tarjan); Tarjan emits them sinks first
        comp = [-1] * n
        low = [0] * n
        num = [-1] * n
        stack: list[int] = []
        on = bytearray(n)
        comps: list[list[int]] = []
        counter = 0
        for root in range(n):
            if num[root] >= 0:
                continue
            work = [(root, 0)]
            num[root] = low[root] = counter
            counter += 1
            stack.append(root)
            on[root] = 1
            while work:
                v, ei = work[-1]
                if ei < len(edges[v]):
                    work[-1] = (v, ei + 1)
                    w = edges[v][ei][0]
                    if num[w] < 0:
                        num[w] = low[w] = counter
                        counter += 1
                        stack.append(w)
                        on[w] = 1
                        work.append((w, 0))
                    elif on[w]:
                        low[v] = min(low[v], num[w])
                    continue
                work.pop()
                if work:
                    u = work[-1][0]
                    low[u] = min(low[u], low[v])
                if low[v] == num[v]:
                    members = []
                    while True:
                        w = stack.pop()
                        on[w] = 0
                        comp[w] = len(comps)
                        members.append(w)
                        if w == v:
                            break
                    comps.append(members)
        most = [-1] * n
        for c, members in enumerate(comps):   # successors' components come first
            best = -1
            cyclic = False
            for v in members:
                k = pairs[v]
                known = memo.get(k << 32 | r)
                if known is not None:
                    best = max(best, known)
                    continue
                if nullable[k >> 32] and nullable[k & 0xFFFFFFFF]:
                    best = max(best, 0)
                for w, wt in edges[v]:
                    if comp[w] != c:
                        if most[w] >= 0:
                            best = max(best, MOST_UNBOUNDED if most[w] == MOST_UNBOUNDED else most[w] + wt)
                    elif wt:
                        cyclic = True
            if best >= 0 and cyclic:
                # a factor edge on a cycle of pairs that reach a word: each member reaches the
                # cycle and, from it, the word, so there is no bound
                best = MOST_UNBOUNDED
            # otherwise every edge inside the component weighs 0 and its members reach one
            # another: they all have the same most
            for v in members:
                most[v] = best
        if len(memo) > MAX_NEED_MEMO:
            memo.clear()
        for v in range(n):
            memo.setdefault(pairs[v] << 32 | r, most[v])
        return most[0]

    def _counted_layered(self, start: int, r: int, lo: int, hi: int) -> bool:
        """The pairs reachable from ``start`` with exactly ``0, 1, …, lo`` factors begun, each
        set from the one before, skipping ahead once a set recurs; then :meth:`_counted_least`
        from the pairs at ``lo``."""
        nullable = self._nullable
        work = 0

        def closure(seeds) -> frozenset:
            """``seeds`` and every pair reachable from them without beginning a factor."""
            nonlocal work
            out = set(seeds)
            todo = list(out)
            while todo:
                k = todo.pop()
                for t in self._counted_moves(k, r, False):
                    if t not in out:
                        out.add(t)
                        todo.append(t)
            work += len(out)
            if work > self.max_alive_states:
                raise GrammarTooComplexError("emptiness check of a regex intersection/complement exceeded its state bound")
            return frozenset(out)

        if lo == 0:
            return self._counted_least((start,), r, 0, hi)
        layer = closure([start])
        layers, index = [layer], {layer: 0}
        for j in range(1, lo + 1):
            layer = closure([t for k in layer if nullable[k & 0xFFFFFFFF] for t in self._counted_moves(k, r, True)])
            if not layer:
                return False
            i = index.get(layer)
            if i is not None:   # periodic from ``i`` on with period ``j - i``
                layer = layers[i + (lo - i) % (j - i)]
                break
            index[layer] = j
            layers.append(layer)
        return self._counted_least(layer, r, lo, hi)

    def _counted_moves(self, k: int, r: int, new: bool) -> list[int]:
        """Pairs ``x2 << 32 | s2`` after one byte from the pair ``k = x << 32 | s``: continuing
        ``s``, or (``new``, for a nullable ``s``) beginning a factor ``r``; one per byte class
        of both parts where the derivative of ``x`` is not empty nor known dead and that of the
        other part not empty. Compiled (:func:`.nodestore.counted_moves`): the searches over
        pairs below make thousands of moves in a first visit (a ``maxLength`` over a format), at
        ~20 us each in Python (sessions to 34), the slowest masks of MaskBench."""
        out = self._moves_out
        n = self._call(_py_counted_moves, k >> 32, k & 0xFFFFFFFF, r, 1 if new else 0, out)
        return out[:n].tolist()

    def _counted_bound(self, k: int, r: int):
        """Factors of ``r`` known to suffice from the pair ``k`` to a word (0 where both parts
        are nullable), -1 if none does, None if unknown."""
        if self._nullable[k >> 32] and self._nullable[k & 0xFFFFFFFF]:
            return 0
        return self._counted_memo.get(k << 32 | r)

    def _counted_found(self, k: int, extra: int, r: int, cost: dict, parent: dict, shift: int) -> bool:
        """A word from state ``k`` with ``extra`` more factors: every state on the path to it
        bounds the factors its pair (``state >> shift``) needs (:attr:`_counted_memo`)."""
        memo = self._counted_memo
        end = cost[k] + extra
        while k >= 0:
            key = (k >> shift) << 32 | r
            old = memo.get(key)
            if old is None or old > end - cost[k]:
                memo[key] = end - cost[k]
            k = parent[k]
        return True

    def _counted_search(self, start: int, r: int, lo: int, hi: int) -> bool | None:
        """Depth first from the pair ``start`` over states ``(pair, min(factors, lo))``, the
        number of factors taken along the path: True on a word within ``lo..hi`` factors, False
        when no word is reachable at all, None when the words found all take more than ``hi``.

        Every path to a word bounds the factors each pair on it needs, and a search finding no
        word proves the pairs it met with ``lo`` factors empty: both are kept
        (:attr:`_counted_memo`) and end later searches early (the next lexer states are pairs on
        the path just found)."""
        memo = self._counted_memo
        cost: dict[int, int] = {}
        parent: dict[int, int] = {}

        def visit(k: int, n: int, via: int):
            """Enter state ``k`` at ``n`` factors: True/False (a word within ``hi`` / more),
            None when nothing is known of its pair."""
            cost[k] = n
            parent[k] = via
            if len(cost) > self.max_alive_states:
                raise GrammarTooComplexError("emptiness check of a regex intersection/complement exceeded its state bound")
            if k & 0xFFFFFFFFFFFFFFFF != lo:
                return None
            ub = self._counted_bound(k >> 64, r)
            if ub is None or ub < 0:
                return None
            return hi == INF or n + ub <= hi

        if lo == 0 and memo.get(start << 32 | r) == -1:
            return False
        k0 = start << 64   # no factor begun
        v = visit(k0, 0, -1)
        if v:
            return self._counted_found(k0, self._counted_bound(start, r), r, cost, parent, 64)
        over = v is False
        todo = [k0]
        nullable = self._nullable
        while todo:
            k = todo.pop()
            pk, j, n1 = k >> 64, k & 0xFFFFFFFFFFFFFFFF, cost[k]
            for new in ((False, True) if nullable[pk & 0xFFFFFFFF] else (False,)):
                j2 = min(j + 1, lo) if new else j
                n2 = n1 + new
                for t in self._counted_moves(pk, r, new):
                    tk = t << 64 | j2
                    if tk in cost or (j2 == lo and memo.get(t << 32 | r) == -1):
                        continue
                    v = visit(tk, n2, k)
                    if v:
                        return self._counted_found(tk, self._counted_bound(t, r), r, cost, parent, 64)
                    over = over or v is False
                    todo.append(tk)
        if over:
            return None
        for k in cost:
            if k & 0xFFFFFFFFFFFFFFFF == lo:
                memo[(k >> 64) << 32 | r] = -1
        return False

    def _counted_least(self, starts, r: int, n0: int, hi: int) -> bool:
        """Whether from some pair of ``starts`` (``n0`` factors begun) a pair with both parts
        nullable is reached having begun at most ``hi`` factors in all: 0-1 breadth first, the
        least number of factors for every pair."""
        from collections import deque

        memo = self._counted_memo
        cost: dict[int, int] = {}
        parent: dict[int, int] = {}

        def visit(k: int, n: int, via: int) -> None:
            cost[k] = n
            parent[k] = via
            if len(cost) > self.max_alive_states:
                raise GrammarTooComplexError("emptiness check of a regex intersection/complement exceeded its state bound")

        q = deque()
        for k in starts:
            if k not in cost and memo.get(k << 32 | r) != -1:
                visit(k, n0, -1)
                q.append(k)
        while q:
            k = q.popleft()
            n1 = cost[k]
            ub = self._counted_bound(k, r)
            if ub is not None and ub >= 0 and (hi == INF or n1 + ub <= hi):
                return self._counted_found(k, ub, r, cost, parent, 0)
            for new in ((False, True) if self._nullable[k & 0xFFFFFFFF] and (hi == INF or n1 < hi) else (False,)):
                n2 = n1 + new
                for t in self._counted_moves(k, r, new):
                    old = cost.get(t)
                    if (old is not None and old <= n2) or memo.get(t << 32 | r) == -1:
                        continue
                    if old is None:
                        visit(t, n2, k)
                    else:
                        cost[t], parent[t] = n2, k
                    if new:
                        q.append(t)
                    else:
                        q.appendleft(t)
        return False

    def within_star(self, x: int, p: int, r: int) -> bool:
        """Whether every word of ``x`` is a word of ``p r*`` (an exploration of
        ``x & ~(p r*)``, bounded by :attr:`max_alive_states`: False past it). Memoised through
        :meth:`alive`; the derivatives of one pattern share their explorations."""
        key = (x << 32 | p) << 32 | r
        got = self._within.get(key)
        if got is None:
            try:
                got = not self.alive(self.intersect(x, self.complement(self.concat(p, self.star(r)))))
            except GrammarTooComplexError:
                got = False
            if len(self._within) > MAX_NEED_MEMO:
                self._within.clear()
            self._within[key] = got
        return got

    def counted_need_bound(self, x: int, p: int, r: int, max_pairs: int | None = None) -> int | None:
        """An upper bound ``F`` of the factors of ``r`` that a word of ``x' & s r*`` needs, over
        every pair ``(x', s)`` reachable from ``(x, p)`` that has a word at all (None: more than
        ``max_pairs`` pairs, by default :attr:`max_alive_states`).

        What makes a counter under an intersection safe to cap (:func:`.slicer.capped`): from
        ``x & p r{0,hi}``, after any string, each part of the derivative is ``x' & s r{0,h}`` for
        a reachable pair, alive exactly when the least number of factors to a word of the pair is
        at most ``h``; a count left of at least ``F`` therefore decides nothing more than a larger
        one. The pairs are explored once (forward over :meth:`_counted_moves`, then the least
        factors backwards, 0-1 breadth first from the pairs with both parts nullable), and every
        pair explored keeps the bound of its first exploration, which also bounds its own
        successors."""
        from collections import deque

        memo = self._need_memo
        start = x << 32 | p
        got = memo.get(start << 32 | r)
        if got is not None:
            return None if got < 0 else got
        limit = self.max_alive_states if max_pairs is None else max_pairs
        nullable = self._nullable
        index = {start: 0}
        pairs = [start]
        redges: list[list[tuple[int, int]]] = [[]]   # target -> [(source, factors)]
        i = 0
        while i < len(pairs):
            k = pairs[i]
            for new in ((False, True) if nullable[k & 0xFFFFFFFF] else (False,)):
                for t in self._counted_moves(k, r, new):
                    j = index.get(t)
                    if j is None:
                        if len(pairs) >= limit or memo.get(t << 32 | r) == -1:
                            # refused: so are the pairs met, and a later exploration that meets
                            # one of them (the next positions of the same string) stops there
                            for k2 in pairs:
                                memo.setdefault(k2 << 32 | r, -1)
                            memo[start << 32 | r] = -1
                            return None
                        j = index[t] = len(pairs)
                        pairs.append(t)
                        redges.append([])
                    redges[j].append((i, int(new)))
            i += 1
        inf = len(pairs) + 1
        need = [inf] * len(pairs)
        q = deque()
        for j, k in enumerate(pairs):
            if nullable[k >> 32] and nullable[k & 0xFFFFFFFF]:
                need[j] = 0
                q.append(j)
        while q:
            j = q.popleft()
            d = need[j]
            for src, c in redges[j]:
                if d + c < need[src]:
                    need[src] = d + c
                    if c:
                        q.append(src)
                    else:
                        q.appendleft(src)
        bound = max([d for d in need if d < inf], default=0)
        for k in pairs:
            # the first bound stays: the walk states of one string then all get the same cap
            # (a tighter bound per pair would give every position its own)
            memo.setdefault(k << 32 | r, bound)
        if len(memo) > MAX_NEED_MEMO:
            memo.clear()
            memo[start << 32 | r] = bound
        return bound

    def _repeat_covers(self, s: int, u: int) -> bool:
        """A sufficient structural test for :meth:`prefixes_contain`: ``s`` is ``C{a,b}`` (or
        ``C{a,} t`` with ``t`` within the prefixes of ``X`` words) and some
        alternative of ``u`` is ``X{lo,hi} rest`` with ``L(C)`` within ``L(X)``, ``b <= hi`` and
        ``X``, ``rest`` non-empty: then every ``w`` in ``C^k`` (``k <= b``) is in ``X^k``, which
        extends to a word of ``u``. This is the common case of a slice against a string
        lexeme deep in a counted body (``maxLength``)."""
        tail = EPS
        if self.kind[s] == CONCAT:
            s, tail = self.args[s]   # ``C{a,b} t``: then ``t`` must also be a prefix of an ``X`` word
        if self.kind[s] != REPEAT:
            return False
        c, _a, b = self.args[s]
        members = self.args[u] if self.kind[u] == OR else (u,)
        split = [self.args[m] if self.kind[m] == CONCAT else (m, EPS) for m in members]
        for first, rest in split:
            heads = (first,)
            if self.kind[first] == AND:
                head = self._open_repeat_of(first, rest, members, split)
                heads = (head,) if head != first else self._heads_past_min_length(first)
            for head in heads:
                if self.kind[head] != REPEAT:
                    continue
                x, _lo, hi = self.args[head]
                if hi != INF and (b == INF or b > hi):
                    continue
                if not (self.alive(x) and self.alive(rest)):
                    continue
                if self._subset(c, x) and (tail == EPS or (b == INF and self.prefixes_contain(tail, x))):
                    return True
        return False

    def _subset(self, a: int, b: int) -> bool:
        """``L(a)`` within ``L(b)`` (memoised)."""
        key = a << 32 | b
        sub = self._subset_cache.get(key)
        if sub is None:
            sub = self._subset_cache[key] = not self.alive(self.intersect(a, self.complement(b)))
        return sub

    def _heads_past_min_length(self, first: int) -> tuple[int, ...]:
        """For ``first`` = ``Y & B{lo,}`` (a ``minLength``: ``B`` one character, of bounded
        length), the heads ``X{0,}`` of the alternatives ``X{0,} T`` of ``Y`` that may stand for
        ``first`` in :meth:`_repeat_covers`: ``T`` has arbitrarily long words and ``X{0,} T``
        is within ``B*``. Then every prefix ``p`` of an ``X{0,}`` word extends to ``p' t`` in
        ``Y`` (``p'`` an ``X{0,}`` word, ``t`` a word of ``T`` as long as needed), a word of
        ``B*`` long enough to hold ``lo`` characters: in ``first``. (An unanchored pattern
        under ``minLength``, Github_hard---o79409's ``trace_id``: the product walk met thousands
        of pairs per slice.)"""
        parts = self.args[first]
        if len(parts) != 2:
            return ()
        for y, r in (parts, parts[::-1]):
            if self.kind[r] != REPEAT or self.kind[y] == NOT:
                continue
            bb, _lo, hi = self.args[r]
            if hi != INF or self._has_bool[bb] or self.may_be_infinite(bb) or not self.first_bytes(bb):
                continue
            out = []
            for alt in (self.args[y] if self.kind[y] == OR else (y,)):
                if self.kind[alt] != CONCAT:
                    continue
                p, t = self.args[alt]
                if (self.kind[p] == REPEAT and self.args[p][1] == 0 and self.args[p][2] == INF
                        and self._has_long_words(t) and self._subset(alt, self.repeat(bb, 0, INF))):
                    out.append(p)
            return tuple(out)
        return ()

    def _has_long_words(self, t: int) -> bool:
        """``t`` has arbitrarily long words (a sufficient test): non-empty parts ending in an
        unbounded repeat of a body with a non-empty word."""
        while self.kind[t] == CONCAT:
            h, t = self.args[t]
            if not self.alive(h):
                return False
        if self.kind[t] != REPEAT or self.args[t][2] != INF:
            return False
        z = self.args[t][0]
        return bool(self.first_bytes(z)) and (self.args[t][1] == 0 or self.alive(z))

    def _open_repeat_of(self, first: int, rest: int, members, split) -> int:
        """``X{lo,}`` when the alternative ``first rest`` of a union (``members``; ``split``: them
        as ``(first, rest)``) may stand for ``X{lo,} rest`` in :meth:`prefixes_contain`, else
        ``first`` itself. ``first`` is ``X{lo,} & ~B & ~C1 & ...`` with ``B`` finite (a key other
        than the declared ones), and each ``Ci`` is finite too or has its own alternative
        ``(Ci & ~Bi) rest`` with ``Bi`` finite, or ``Ci rest`` (keys of a ``patternProperties``
        pattern, taken out of the additional keys: clang-format's ``^x-``). Then the union holds
        ``(X{lo,} minus a finite set) rest``, and every prefix of an ``X{lo,}`` word, having
        infinitely many completions (``X`` has a non-empty word), has one outside the finite set."""
        parts = self.args[first]
        pos = [x for x in parts if self.kind[x] != NOT]
        if len(pos) != 1 or self.kind[pos[0]] != REPEAT or self.args[pos[0]][2] != INF:
            return first
        if not self.first_bytes(self.args[pos[0]][0]):
            return first
        for n in parts:
            if n == pos[0]:
                continue
            cj = self.args[n][0]
            if not self.may_be_infinite(cj):
                continue
            if not (any(r2 == rest and self._finite_minus(f2, cj) for f2, r2 in split)
                    or self.concat(cj, rest) in members):
                return first
        return pos[0]

    def _finite_minus(self, f: int, c: int) -> bool:
        """``f`` is ``c & ~B`` with ``B`` finite."""
        if self.kind[f] != AND or len(self.args[f]) != 2:
            return False
        x, y = self.args[f]
        if x != c:
            x, y = y, x
        return x == c and self.kind[y] == NOT and not self.may_be_infinite(self.args[y][0])

    def _node_memo(self, name: str) -> np.ndarray:
        """The per-node memo array ``name`` of a compiled walk (-1: not known), grown to cover
        every node of the store (its dtype kept)."""
        memo = getattr(self, name)
        n = len(self.kind)
        if memo.shape[0] < n:
            new = np.full(max(2 * n, 1024), -1, memo.dtype)
            new[:memo.shape[0]] = memo
            setattr(self, name, new)
            memo = new
        return memo

    def may_be_infinite(self, e: int) -> bool:
        """False only when the language of ``e`` is certainly finite (no unbounded repeat
        or complement that could make it infinite)."""
        r = self._unbounded.get(e)
        if r is not None:
            return r
        # compiled, over the store's arrays (:func:`.nodestore.may_be_infinite_of`), as
        # min_length: the first question about a state of many literal keys walked thousands
        # of nodes here, recursively and reading each node's arguments (~15 ms of one mask of
        # JsonSchemaStore---clang-format's)
        r = bool(_may_be_infinite_of(self._S, e, self._node_memo("_unbounded_arr")))
        self._unbounded[e] = r
        return r

    def min_length(self, e: int) -> float:
        """Length of the shortest word of ``e`` (``inf`` when empty); for expressions without
        intersections or complements."""
        r = self._minlen.get(e)
        if r is not None:
            return r
        # compiled, over the store's arrays (:func:`.nodestore.min_length_of`): the first
        # question about a large enum or alternation walked thousands of nodes here, 16 ms in
        # one mask of Github_hard---o79409's
        v = _min_length_of(self._S, e, self._node_memo("_minlen_arr"))
        if v == -2:
            raise ValueError("min_length of an intersection or complement")
        r = float("inf") if v >= ns.MINLEN_INF else int(v)
        self._minlen[e] = r
        return r

    def prefixes_contain(self, s: int, u: int, max_pairs: int = 50_000, max_seconds: float = 0.25,
                         resume: bool = False) -> bool | None:
        """True iff every string of ``s`` is a prefix of some string of ``u`` (memoised). Exact,
        except that an exploration beyond ``max_pairs`` pairs or ``max_seconds`` answers False
        (the slicer then walks the slice's trie: slower, never wrong).

        With ``resume``, an exploration cut short by ``max_seconds`` answers None instead and is
        kept (at most :data:`MAX_PARTIAL_PROOFS` of them): the next call for the same pair goes
        on from where it stopped, so a long proof is spread over several calls (the slicer's, one
        per mask) rather than paid in one. Past :data:`MAX_RESUMED_SECONDS` in all it answers
        False, as a proof out of its budget does.

        A successful walk proves the property for every pair it visited (each one's walk is part
        of it): they are all remembered, so a later question about a derivative of ``u`` (the
        next lexer state) is answered from the table."""
        import time

        key = s << 32 | u
        pc = self._prefix_cache
        r = pc.get(key)
        if r is not None:
            return r
        first_bytes = self.first_bytes
        partial = self._prefix_partial.pop(key, None) if resume else None
        if partial is None:
            if len(pc) > MAX_PREFIX_CACHE:
                pc.clear()
            if self.may_be_infinite(s) and not self.may_be_infinite(u):
                # a finite language has finitely many prefixes (deep in a counted string such as
                # ``maxLength: 65535`` this saves exploring the whole counter); False is the safe
                # answer if ``s`` happens to be finite after all
                self._prefix_cache[key] = False
                return False
            if self._repeat_covers(s, u):
                self._prefix_cache[key] = True
                return True
            seen = {(s, u)}
            # breadth first, each pair checked as it is met rather than when it is explored: a
            # string of ``s`` that is no prefix of ``u`` is found at its shortest, and one byte
            # earlier (a slice of all UTF-8 characters against a class of some letters fails at
            # its second byte, not after a depth-first walk through all the longer characters)
            todo = deque([(s, u)])
            spent = 0.0
            r = not first_bytes(s) & ~first_bytes(u)
        else:
            seen, todo, spent = partial
            r = True
        start = time.monotonic()
        deadline = start + max_seconds
        steps = 0
        cut = False
        while todo and r:
            # the clock read every 16 pairs explored (a pair's transitions may each cost tens of
            # microseconds: counted repetitions; ``len(seen) & 63`` could step over its zeros)
            steps += 1
            if steps & 15 == 0 and time.monotonic() > deadline:
                cut = True
                break
            x, y = todo.popleft()
            ty = self.transitions(y)
            for m1, x2 in self.transitions(x):
                for m2, y2 in ty:
                    if m1 & m2 and (x2, y2) not in seen:
                        if pc.get(x2 << 32 | y2) is True:
                            continue   # proved before (a False may be a budget's: explore it)
                        if first_bytes(x2) & ~first_bytes(y2) or len(seen) >= max_pairs:
                            r = False
                            break
                        seen.add((x2, y2))
                        todo.append((x2, y2))
                if not r:
                    break
        if cut:
            spent += time.monotonic() - start
            if resume and spent < MAX_RESUMED_SECONDS:
                part = self._prefix_partial
                if len(part) >= MAX_PARTIAL_PROOFS:
                    part.clear()
                part[key] = (seen, todo, spent)
                return None
            r = False
        if r:
            for x, y in seen:
                pc[x << 32 | y] = True
        else:
            pc[key] = False
        return r

    def first_bytes(self, e: int) -> int:
        """Mask of the bytes that can start a non-empty string of ``e``."""
        m = self._first.get(e)
        if m is None:
            m = 0
            for mm, _ in self.transitions(e):
                m |= mm
            self._first[e] = m
        return m

    def can_extend(self, e: int) -> bool:
        return any(True for _ in self.transitions(e))

    def matches(self, e: int, data: bytes | str) -> bool:
        if isinstance(data, str):
            data = data.encode("utf-8")
        for b in data:
            e = self.deriv(e, b)
            if e == EMPTY:
                return False
        return self._nullable[e]

    def is_prefix(self, e: int, data: bytes) -> bool:
        """True iff ``data`` can be extended to a string of ``e``."""
        for b in data:
            e = self.deriv(e, b)
            if e == EMPTY:
                return False
        return self.alive(e)

    def nonempty_part(self, e: int) -> int:
        """An expression for ``L(e) minus {empty string}``, built from derivatives (no AND/NOT)."""
        if not self._nullable[e]:
            return e
        return self.alt(*[self._concat2(self.byteset(m), t) for m, t in self.transitions(e)])

    def is_literal(self, e: int) -> bytes | None:
        """The single string of ``e`` when ``e`` is a concatenation of single bytes, else None."""
        out = bytearray()
        while e != EPS:
            k = self.kind[e]
            if k == CONCAT:
                x, e = self.args[e]
            elif k == BYTES:
                x, e = e, EPS
            else:
                return None
            if self.kind[x] != BYTES:
                return None
            m = self.args[x][0]
            if m & (m - 1):
                return None
            out.append(_lowbit(m))
        return bytes(out)

    # ------------------------------------------------------------------ copying between sets
    def import_expr(self, src: "ExprSet", e: int, memo: dict[int, int]) -> int:
        """Rebuild expression ``e`` of ``src`` in this set and return its id here (iteratively:
        literals can be long). ``memo`` maps ``src`` ids to ids here; pass the same dict for every
        expression of one import so shared nodes are rebuilt once."""
        if e in memo:
            return memo[e]
        stack = [(e, False)]
        while stack:
            x, ready = stack.pop()
            if x in memo:
                continue
            k = src.kind[x]
            args = src.args[x]
            if k == EMPTY:
                memo[x] = EMPTY
                continue
            if k == EPS:
                memo[x] = EPS
                continue
            if k == BYTES:
                memo[x] = self.byteset(args[0])
                continue
            kids = (args[0],) if k in (NOT, REPEAT) else tuple(args)
            if not ready:
                stack.append((x, True))
                stack.extend((c, False) for c in kids if c not in memo)
                continue
            if k == CONCAT:
                memo[x] = self.concat(memo[args[0]], memo[args[1]])
            elif k == OR:
                memo[x] = self.alt(*[memo[c] for c in args])
            elif k == AND:
                memo[x] = self.intersect(*[memo[c] for c in args])
            elif k == NOT:
                memo[x] = self.complement(memo[args[0]])
            else:  # REPEAT
                memo[x] = self.repeat(memo[args[0]], args[1], args[2])
        return memo[e]

    # ------------------------------------------------------------------ debugging
    def to_str(self, e: int, depth: int = 0) -> str:
        k = self.kind[e]
        if depth > 40:
            return "…"
        if k == EMPTY:
            return "∅"
        if k == EPS:
            return "ε"
        if k == BYTES:
            return _mask_str(self.args[e][0])
        if k == CONCAT:
            return self.to_str(self.args[e][0], depth + 1) + self.to_str(self.args[e][1], depth + 1)
        if k == OR:
            return "(" + "|".join(self.to_str(x, depth + 1) for x in self.args[e]) + ")"
        if k == AND:
            return "(" + "&".join(self.to_str(x, depth + 1) for x in self.args[e]) + ")"
        if k == NOT:
            return "~(" + self.to_str(self.args[e][0], depth + 1) + ")"
        x, lo, hi = self.args[e]
        return "(" + self.to_str(x, depth + 1) + f"){{{lo},{'' if hi == INF else hi}}}"


def _mask_str(m: int) -> str:
    if m == ALL_BYTES:
        return "."
    bs = [b for b in range(256) if (m >> b) & 1]
    if len(bs) == 1:
        c = bs[0]
        return chr(c) if 32 < c < 127 and chr(c) not in "()[]{}|.*+?\\" else f"\\x{c:02x}"
    return "[" + "".join(chr(c) if 32 < c < 127 and chr(c) not in "]\\-^" else f"\\x{c:02x}" for c in bs[:40]) + ("…" if len(bs) > 40 else "") + "]"
