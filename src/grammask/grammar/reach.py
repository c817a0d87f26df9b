"""How far one token reaches into a repetition: what a mask's walk can read of a counter.

A mask reads one token from a lexer state. So a counted repetition ``a{lo,hi}`` whose count one
token cannot exhaust reads every token as ``a{lo,c}`` does, for a ``c`` past what a token can
read (:func:`.slicer.capped`, :meth:`.Lexer.walk_state`): the positions of a long string then
share one walk state, with its expansions, slice proofs and cached masks.

Without the vocabulary, ``n`` bytes (the longest token) read at most ``n // minlen(a)`` whole
iterations of ``a``: 64 for a word ``\\S+\\s+`` of Llama-3, whose longest token has 128 bytes.
But no real token holds 64 words: the pre-tokenizer cut them apart. :class:`TokenReach` answers
the exact question for a tokenizer: the most whole iterations of ``a`` (each a non-empty word of
``a``) that follow one another inside one token, at any offset (a mask may begin a token in the
middle of an iteration, and read a prefix of it). Every string a walk reads is a prefix of a
token, and the iterations it reads in one counter are a factor of it, so the bound holds for
them. Found with the body's DFA (derivatives, at most :data:`MAX_BODY_STATES` states) and one
compiled pass over the token trie (:func:`_most_iterations`: a prefix tokens share is read
once, and a subtree whose tokens are too short to hold more is skipped); memoised per body in the
ExprSet, and per body DFA in the tokenizer's :class:`TokenReach`.

See docs/lexer.md, "Walk states". tests/test_reach.py checks the bound against a brute force
over every factor of every token, and the masks from walk states against exact ones.
"""
from __future__ import annotations

import functools
import hashlib
import threading
import weakref

import numpy as np
from numba import njit

from .regexset import ExprSet

#: a body whose DFA would pass this many states keeps the bound of its length alone
MAX_BODY_STATES = 256
#: answers of the vocabulary pass kept per tokenizer, keyed by the body's DFA (then it starts over)
MAX_DFA_ANSWERS = 4096

_REACHES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


@njit(nogil=True, cache=True)
def _subtree_depths(node_depth, node_end):
    """The greatest depth in each node's subtree of a token trie: the longest token below it
    (every leaf of the trie ends a token)."""
    n = node_depth.shape[0]
    out = node_depth.astype(np.int64)
    for i in range(n - 1, -1, -1):
        # the nodes of i's subtree follow it, up to node_end[i]: its children's answers are
        # final by now, and the first child is i + 1, the next one at that child's end, ...
        c = i + 1
        while c < node_end[i]:
            if out[c] > out[i]:
                out[i] = out[c]
            c = node_end[c]
    return out


@njit(nogil=True, cache=True)
def _most_iterations(node_byte, node_depth, node_end, sub_max, table, accept, minlen, best):
    """The most whole non-empty iterations of a body (DFA ``table``/``accept``, start state 0)
    that follow one another inside one token, at least ``best``: one pass over the token trie
    (flat, preorder: :mod:`.toktrie`), so a prefix that tokens share is read once (Llama-3:
    275k nodes for 831k bytes of tokens). A subtree whose longest token holds at most
    ``best`` iterations (``sub_max // minlen``) is skipped.

    Per trie depth ``d``, ``cnt[d, s]`` is the most iterations completed by a factor of the
    node's path (the prefix read so far) ending at its end in state ``s`` of the current
    iteration (-1: none; the states with one listed in ``act[d]``); a node's row is made from
    its parent's, one depth up, which stays as it is while the node's subtree is read. A factor
    may begin at every position (state 0, none completed); an accepting state may close its
    iteration (state 0 again, one more)."""
    n_states = table.shape[0]
    n = node_byte.shape[0]
    depth = sub_max[0]   # the root's subtree: the longest token
    cnt = np.full((depth + 1, n_states), -1, np.int64)
    act = np.empty((depth + 1, n_states), np.int64)
    n_act = np.zeros(depth + 1, np.int64)
    i = 1   # the root (node 0) is the empty prefix: no state yet
    while i < n:
        if sub_max[i] // minlen <= best:
            i = node_end[i]
            continue
        d = node_depth[i]
        b = node_byte[i]
        row = cnt[d]
        arow = act[d]
        for a in range(n_act[d]):
            row[arow[a]] = -1
        k = 0
        prow = cnt[d - 1]
        parow = act[d - 1]
        # the parent's states, and state 0 begun here (none completed) where it has no count
        m = n_act[d - 1]
        begin = prow[0] < 0
        for a in range(m + (1 if begin else 0)):
            if a < m:
                s = parow[a]
                c = prow[s]
            else:
                s = 0
                c = 0
            j = table[s, b]
            if j < 0:
                continue
            if row[j] < 0:
                arow[k] = j
                k += 1
            if c > row[j]:
                row[j] = c
            if accept[j]:
                if c + 1 > best:
                    best = c + 1
                if row[0] < 0:
                    arow[k] = 0
                    k += 1
                if c + 1 > row[0]:
                    row[0] = c + 1
        n_act[d] = k
        i += 1
    return best


class TokenReach:
    """What one mask's walk can read, for one tokenizer: ``n`` bytes (the longest token), and
    per repetition body the iterations one token can begin (:meth:`begun`)."""

    def __init__(self, tokenizer_info):
        self._info = tokenizer_info
        self.n = int(tokenizer_info.trie.max_depth)
        #: memo keys in an ExprSet (several tokenizers may share one)
        self.key = ("reach", tokenizer_info.cache_key)
        #: the vocabulary pass's answer per body DFA (a digest of its table, acceptance and least
        #: length): the ExprSet's memo goes with the ExprSet (a compiler starts a fresh one past
        #: EXPRS_RESET_NODES expressions), and the same bodies (a word, a string character) come
        #: back in the next one. A 1-in-20 MaskBench pass (a reset every 20,000 expressions then)
        #: made 78 passes of up to 20 ms (0.37 s, ~2.5% of its mask time, inside masks) for 11
        #: distinct DFAs.
        self._by_dfa: dict[bytes, int] = {}

    @functools.cached_property
    def _tokens(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The token trie's arrays that the pass reads (bytes, depths, subtree ends) and the
        longest token under each node: made at the first body that needs the pass, not with the
        first matcher."""
        t = self._info.trie
        return t.node_byte, t.node_depth, t.node_end, _subtree_depths(t.node_depth, t.node_end)

    def begun(self, ex: ExprSet, a: int) -> int:
        """How many iterations of ``a`` a string that a walk reads (a prefix of a token) can
        begin: the whole ones that follow one another inside a token, and part of one more. At
        most ``n // minlen(a) + 1``, and that bound for a body with empty words, with
        intersections or complements, or with a DFA past :data:`MAX_BODY_STATES`."""
        memo = ex.__dict__.setdefault("_reach", {})
        r = memo.get((self.key, a))
        if r is not None:
            return r
        r = begun_within(ex, a, self.n)
        if r > 1 and not ex.has_bool(a):
            m = ex.min_length(a)
            dfa = ex.dense_dfa(a, MAX_BODY_STATES) if 1 <= m < float("inf") else None
            if dfa is not None:
                r = min(r, self._most_whole(dfa[0], dfa[1], int(m)) + 1)
        memo[(self.key, a)] = r
        arrays = ex.__dict__.setdefault("_reach_arrays", {})
        arr = arrays.get(self.key)
        if arr is None or arr.shape[0] <= a:
            size = max(1024, 2 * (a + 1), 0 if arr is None else arr.shape[0])
            new = np.full(size, -1, np.int64)
            if arr is not None:
                new[:arr.shape[0]] = arr
            arr = arrays[self.key] = new
        arr[a] = r
        return r

    def _most_whole(self, table: np.ndarray, accept: np.ndarray, minlen: int) -> int:
        """:func:`_most_iterations` of a body's DFA over the vocabulary, memoised by the DFA."""
        h = hashlib.blake2b(digest_size=20)
        h.update(np.array([table.shape[0], minlen], np.int64).tobytes())
        h.update(np.ascontiguousarray(table, np.int32).tobytes())
        h.update(np.ascontiguousarray(accept, np.bool_).tobytes())
        key = h.digest()
        k = self._by_dfa.get(key)
        if k is None:
            k = int(_most_iterations(*self._tokens, table, accept, minlen, 0))
            if len(self._by_dfa) >= MAX_DFA_ANSWERS:
                self._by_dfa.clear()
            self._by_dfa[key] = k
        return k

    def begun_array(self, ex: ExprSet) -> np.ndarray:
        """:meth:`begun` of the bodies it was asked for so far in ``ex``, by expression id (-1: not
        asked yet), for compiled readers (replaced when it grows)."""
        arr = ex.__dict__.get("_reach_arrays", {}).get(self.key)
        return _NONE if arr is None else arr


_NONE = np.full(0, -1, np.int64)


def begun_within(ex: ExprSet, x: int, n: int) -> int:
    """How many iterations of ``x`` a string of ``n`` bytes can begin: ``n // minlen(x)`` whole
    ones and part of one more (``n + 1`` for an ``x`` with empty or no words)."""
    m = ex.min_length(x)
    return n // int(m) + 1 if 1 <= m < float("inf") else n + 1


def token_reach(tokenizer_info) -> TokenReach:
    """The (cached) :class:`TokenReach` of a tokenizer."""
    with _LOCK:
        r = _REACHES.get(tokenizer_info)
        if r is None:
            r = _REACHES[tokenizer_info] = TokenReach(tokenizer_info)
        return r
