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
compiled pass over the vocabulary's bytes (:func:`_most_iterations`), longest tokens first, so
that the pass stops once no shorter token can hold more; memoised per body in the ExprSet.

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
def _most_iterations(data, offsets, order, table, accept, minlen, best):
    """The most whole non-empty iterations of a body (DFA ``table``/``accept``, start state 0)
    that follow one another inside one token, at least ``best``. ``order``: token indices,
    longest first; a token of ``L`` bytes holds at most ``L // minlen`` iterations, so the pass
    stops at the first token too short to beat ``best``.

    Per position, ``cnt[s]`` is the most iterations completed by a factor ending here in state
    ``s`` of the current iteration (-1: none; the states with one are listed in ``act``). A
    factor may begin at every position (state 0, none completed); an accepting state may close
    its iteration (state 0 again, one more)."""
    n_states = table.shape[0]
    cnt = np.full(n_states, -1, np.int64)
    nxt = np.full(n_states, -1, np.int64)
    act = np.empty(n_states, np.int64)
    act2 = np.empty(n_states, np.int64)
    for k in range(order.shape[0]):
        t = order[k]
        lo = offsets[t]
        hi = offsets[t + 1]
        if (hi - lo) // minlen <= best:
            break
        n_act = 0
        for i in range(lo, hi):
            if cnt[0] < 0:
                cnt[0] = 0
                act[n_act] = 0
                n_act += 1
            b = data[i]
            n2 = 0
            for a in range(n_act):
                s = act[a]
                c = cnt[s]
                cnt[s] = -1
                j = table[s, b]
                if j < 0:
                    continue
                if nxt[j] < 0:
                    act2[n2] = j
                    n2 += 1
                if c > nxt[j]:
                    nxt[j] = c
                if accept[j]:
                    if c + 1 > best:
                        best = c + 1
                    if nxt[0] < 0:
                        act2[n2] = 0
                        n2 += 1
                    if c + 1 > nxt[0]:
                        nxt[0] = c + 1
            cnt, nxt = nxt, cnt
            act, act2 = act2, act
            n_act = n2
        for a in range(n_act):
            cnt[act[a]] = -1
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
    def _tokens(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(bytes, offsets, indices longest first) of the tokens a walk reads: built at the
        first body that needs the pass, not with the first matcher."""
        tb = self._info.token_bytes
        ids = np.unique(np.asarray(self._info.trie.tok_ids, dtype=np.int64))
        toks = [tb[i] for i in ids.tolist()]
        lens = np.fromiter((len(b) for b in toks), dtype=np.int64, count=len(toks))
        offsets = np.zeros(len(toks) + 1, np.int64)
        np.cumsum(lens, out=offsets[1:])
        data = np.frombuffer(b"".join(toks), dtype=np.uint8)
        return data, offsets, np.argsort(-lens, kind="stable").astype(np.int64)

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
