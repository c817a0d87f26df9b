"""The merge-level half of canonical tokenization: which adjacent token pairs BPE would never emit.

A token string is the canonical BPE encoding of its text (inside one pre-token) iff every adjacent
pair ``(a, b)`` is canonical, i.e. ``BPE(bytes(a) + bytes(b)) == [a, b]`` (Vieira, Cotterell et al.
2025, "Language Models over Canonical Byte-Pair Encodings"; tested exhaustively on a trained BPE
and by sampling against ``tokenizers`` on Llama-3, Qwen and SmolLM2 in tests/test_canonical.py).

Deciding a pair without running BPE. Run BPE on ``bytes(a) + bytes(b)``: as long as no merge
crosses the boundary, each side follows its own derivation (the one of ``BPE(bytes(a))``), merges
firing in rank order (lowest first, leftmost on ties). The last part of the left side is, over
time, the *right spine* of ``a`` (last byte, ..., ``R(R(a))``, ``R(a)``, ``a``, where ``R(t)`` is the
right half of the merge that made ``t``), each spine token ``x`` alive from ``rank(x)`` until the
rank of the merge that consumes it; likewise the first part of the right side walks the *left
spine* of ``b``. A cross merge ``(x, y)`` of rank ``p`` fires, making the pair non-canonical, iff
``x`` and ``y`` are both alive at ``p``: ``rank(x) < p < consume(x)`` (the left merge wins a tie: it
is leftmost) and ``rank(y) < p <= consume(y)`` (the cross merge wins a tie with the right side).

Hence the compact structure: the *left-spine forest* (parent of ``t`` = the left half of the
merge that made ``t``), laid out in DFS preorder with the children of every node sorted by
decreasing rank. For a fixed rule ``(x, y, p)``, the tokens ``b`` whose left spine holds ``y``
consumed at a rank ``>= p`` are ``y`` itself and the subtrees of its children of rank ``>= p``: one
contiguous range of the preorder. The conflicts of a left token ``a`` are a union of such ranges,
one per rule whose left side is on ``a``'s right spine within its alive window; they are turned
into a bitset over token ids on demand (:meth:`BpeCanon.conflict_words`).

This assumes *monotone* merges (a rule's rank is above the ranks of its two halves), which
trained BPE satisfies; rules that break it are counted (``n_anomalous_rules``) and cannot fire in
the model above (see the tests for the tokenizers where they occur).

Tokens whose own bytes BPE-encode to something else (``reachable[t] == False``) never occur in a
canonical encoding produced by merges (but see ``ignore_merges``/tiktoken's whole-piece rule in
:mod:`.canonical`).
"""
from __future__ import annotations

import numpy as np
from numba import njit

INF_RANK = np.int64(1) << 62


# ---------------------------------------------------------------------------------------------- kernels
@njit(nogil=True, cache=True)
def _rule_lookup(keys, left, right, V):
    k = np.int64(left) * V + right
    i = np.searchsorted(keys, k)
    if i < keys.shape[0] and keys[i] == k:
        return i
    return -1


@njit(nogil=True, cache=True)
def _bpe_ids(parts, n, keys, rule_rank, rule_out, V):
    """BPE over ``parts[:n]`` (token ids) in place: lowest rule rank first, leftmost on ties.
    Returns (new length, last rule index applied or -1)."""
    last = -1
    while n > 1:
        best = INF_RANK
        bi = -1
        br = -1
        for i in range(n - 1):
            r = _rule_lookup(keys, parts[i], parts[i + 1], V)
            if r >= 0 and rule_rank[r] < best:
                best = rule_rank[r]
                bi = i
                br = r
        if bi < 0:
            break
        parts[bi] = rule_out[br]
        for j in range(bi + 1, n - 1):
            parts[j] = parts[j + 1]
        n -= 1
        last = br
    return n, last


@njit(nogil=True, cache=True)
def bpe_merge(parts, n, keys, rule_rank, rule_out, V, rk, ri):
    """:func:`_bpe_ids` (the same merges in the same order: lowest rule rank first, leftmost on
    ties) with the rank of each adjacent pair kept in ``rk`` (its rule in ``ri``; scratch, ``n``
    entries each): a merge looks up only the two pairs it changes, not every pair again. Returns
    the new length."""
    for i in range(n - 1):
        r = _rule_lookup(keys, parts[i], parts[i + 1], V)
        ri[i] = r
        rk[i] = rule_rank[r] if r >= 0 else INF_RANK
    while n > 1:
        best = INF_RANK
        bi = -1
        for i in range(n - 1):
            if rk[i] < best:
                best = rk[i]
                bi = i
        if bi < 0:
            break
        parts[bi] = rule_out[ri[bi]]
        for j in range(bi + 1, n - 1):
            parts[j] = parts[j + 1]
        for j in range(bi + 1, n - 2):
            rk[j] = rk[j + 1]
            ri[j] = ri[j + 1]
        n -= 1
        for i in (bi - 1, bi):
            if 0 <= i < n - 1:
                r = _rule_lookup(keys, parts[i], parts[i + 1], V)
                ri[i] = r
                rk[i] = rule_rank[r] if r >= 0 else INF_RANK
    return n


@njit(nogil=True, cache=True)
def derive_all(tok_data, tok_off, byte_id, keys, rule_rank, rule_out, rule_left, rule_right, V):
    """For every token: reachable (its bytes BPE-encode to itself), and the halves and rank of the
    last merge that made it (-1 for single bytes)."""
    reach = np.zeros(V, np.uint8)
    top_l = np.full(V, -1, np.int32)
    top_r = np.full(V, -1, np.int32)
    rank = np.full(V, -1, np.int64)
    maxlen = 1
    for t in range(V):
        ln = tok_off[t + 1] - tok_off[t]
        if ln > maxlen:
            maxlen = ln
    parts = np.empty(maxlen, np.int32)
    for t in range(V):
        s = tok_off[t]
        ln = tok_off[t + 1] - s
        if ln == 0:
            continue
        ok = True
        for i in range(ln):
            b = byte_id[tok_data[s + i]]
            if b < 0:
                ok = False
                break
            parts[i] = b
        if not ok:
            continue
        n, last = _bpe_ids(parts, ln, keys, rule_rank, rule_out, V)
        if n == 1 and parts[0] == t:
            reach[t] = 1
            if last >= 0:
                top_l[t] = rule_left[last]
                top_r[t] = rule_right[last]
                rank[t] = rule_rank[last]
    return reach, top_l, top_r, rank


@njit(nogil=True, cache=True)
def pair_is_canonical(a, b, top_r, top_l, rank, keys, rule_rank, V):
    """The spine test of one pair (both reachable)."""
    x = a
    hi = INF_RANK
    while x >= 0:
        lo = rank[x]
        y = b
        yhi = INF_RANK
        while y >= 0:
            ylo = rank[y]
            r = _rule_lookup(keys, x, y, V)
            if r >= 0:
                p = rule_rank[r]
                if lo < p and p < hi and ylo < p and p <= yhi:
                    return False
            yhi = ylo
            y = top_l[y]
        hi = lo
        x = top_r[x]
    return True


@njit(nogil=True, cache=True)
def conflict_ranges(a, top_r, rank, by_left_start, by_left_rule, rule_rank, rule_right,
                    pre, sub_end, child_start, child_list, child_rank, out):
    """Ranges ``[s, e)`` of the left-spine preorder of the right tokens conflicting with ``a``,
    written as pairs into ``out``; returns how many (or -1 when ``out`` is too small)."""
    n = 0
    x = a
    hi = INF_RANK
    while x >= 0:
        lo = rank[x]
        for k in range(by_left_start[x], by_left_start[x + 1]):
            r = by_left_rule[k]
            p = rule_rank[r]
            if p <= lo:
                continue
            if p >= hi:
                break  # sorted by rank
            y = rule_right[r]
            if pre[y] < 0 or rank[y] >= p:
                continue
            # children of y sorted by decreasing rank: the first with rank < p ends the range
            c0, c1 = child_start[y], child_start[y + 1]
            lo_i, hi_i = c0, c1
            while lo_i < hi_i:
                mid = (lo_i + hi_i) // 2
                if child_rank[mid] >= p:
                    lo_i = mid + 1
                else:
                    hi_i = mid
            e = sub_end[y] if lo_i == c1 else pre[child_list[lo_i]]
            if n >= out.shape[0] // 2:
                return -1
            out[2 * n] = pre[y]
            out[2 * n + 1] = e
            n += 1
        hi = lo
        x = top_r[x]
    return n


@njit(nogil=True, cache=True)
def ranges_to_words(ranges, n, order, words):
    """Set the bits of ``order[s:e]`` for each range into ``words`` (uint32, zeroed by the caller)."""
    for i in range(n):
        for k in range(ranges[2 * i], ranges[2 * i + 1]):
            t = order[k]
            words[t >> 5] |= np.uint32(1) << np.uint32(t & 31)


@njit(nogil=True, cache=True)
def forest_preorder(top_l, rank, reach, V):
    """DFS preorder of the left-spine forest over the reachable tokens (roots: single bytes),
    children sorted by decreasing rank. Returns pre, sub_end, order, child_start, child_list,
    child_rank."""
    cnt = np.zeros(V + 1, np.int64)
    for t in range(V):
        if reach[t] and top_l[t] >= 0:
            cnt[top_l[t] + 1] += 1
    child_start = np.zeros(V + 1, np.int64)
    for t in range(V):
        child_start[t + 1] = child_start[t] + cnt[t + 1]
    fill = child_start[:-1].copy()
    m = child_start[V]
    child_list = np.empty(m, np.int32)
    for t in range(V):
        if reach[t] and top_l[t] >= 0:
            p = top_l[t]
            child_list[fill[p]] = t
            fill[p] += 1
    child_rank = np.empty(m, np.int64)
    for p in range(V):
        s, e = child_start[p], child_start[p + 1]
        if e - s > 1:
            seg = child_list[s:e]
            ks = np.argsort(-rank[seg], kind="mergesort")
            child_list[s:e] = seg[ks]
        for k in range(s, e):
            child_rank[k] = rank[child_list[k]]
    pre = np.full(V, -1, np.int64)
    sub_end = np.full(V, -1, np.int64)
    order = np.empty(V, np.int32)
    stack = np.empty(V + 1, np.int64)   # node ids; negative (-1 - id) = close marker
    pos = 0
    for root in range(V):
        if not reach[root] or top_l[root] >= 0:
            continue
        sp = 0
        stack[sp] = root
        sp += 1
        while sp > 0:
            sp -= 1
            v = stack[sp]
            if v < 0:
                sub_end[-1 - v] = pos
                continue
            pre[v] = pos
            order[pos] = v
            pos += 1
            stack[sp] = -1 - v
            sp += 1
            s, e = child_start[v], child_start[v + 1]
            for k in range(e - 1, s - 1, -1):     # pushed reversed: popped in sorted order
                stack[sp] = child_list[k]
                sp += 1
    return pre, sub_end, order[:pos].copy(), child_start, child_list, child_rank


# ---------------------------------------------------------------------------------------------- the object
class BpeCanon:
    """Merge-level canonicity of token pairs for one BPE vocabulary (see the module docstring).

    ``token_bytes``: bytes of every id (``b""`` for ids outside the model); ``rules``: int64 array
    ``[n, 4]`` of (left id, right id, rank, merged id)."""

    ARRAYS = ("keys", "rule_rank", "rule_out", "rule_left", "rule_right", "reach", "top_l", "top_r", "rank",
              "by_left_start", "by_left_rule", "pre", "sub_end", "order", "child_start", "child_list",
              "child_rank", "byte_id")

    def __init__(self, arrays: dict[str, np.ndarray], vocab_size: int):
        self.V = int(vocab_size)
        for k in self.ARRAYS:
            setattr(self, k, arrays[k])
        self._ranges = np.empty(2 * 4096, np.int64)
        self._pairs: dict[int, bool] = {}     # pair_ok's answers (a compiled call costs ~3 us)
        self.n_anomalous_rules = int(arrays.get("n_anomalous", np.zeros(1))[0])

    def to_arrays(self) -> dict[str, np.ndarray]:
        d = {k: getattr(self, k) for k in self.ARRAYS}
        d["n_anomalous"] = np.array([self.n_anomalous_rules], np.int64)
        return d

    @classmethod
    def build(cls, token_bytes: list[bytes], rules: np.ndarray) -> "BpeCanon":
        V = len(token_bytes)
        rules = np.asarray(rules, np.int64).reshape(-1, 4)
        keys = rules[:, 0] * V + rules[:, 1]
        # duplicates (same pair twice): keep the lowest rank
        o = np.lexsort((rules[:, 2], keys))
        keys, rules = keys[o], rules[o]
        keep = np.ones(len(keys), bool)
        keep[1:] = keys[1:] != keys[:-1]
        keys, rules = keys[keep], rules[keep]
        rule_left = rules[:, 0].astype(np.int32)
        rule_right = rules[:, 1].astype(np.int32)
        rule_rank = rules[:, 2].copy()
        rule_out = rules[:, 3].astype(np.int32)
        lens = np.fromiter((len(b) for b in token_bytes), np.int64, count=V)
        off = np.zeros(V + 1, np.int64)
        np.cumsum(lens, out=off[1:])
        data = np.frombuffer(b"".join(token_bytes), np.uint8) if off[-1] else np.zeros(1, np.uint8)
        # base byte tokens: single-byte tokens that no rule makes
        made = np.zeros(V, bool)
        made[rule_out] = True
        byte_id = np.full(256, -1, np.int32)
        for t in np.nonzero(lens == 1)[0][::-1]:      # the lowest id wins; an unmade one over a made one
            b = token_bytes[t][0]
            if byte_id[b] < 0 or made[byte_id[b]] or not made[t]:
                byte_id[b] = t
        reach, top_l, top_r, rank = derive_all(data, off, byte_id, keys, rule_rank, rule_out, rule_left,
                                               rule_right, V)
        base = np.zeros(V, bool)
        base[byte_id[byte_id >= 0]] = True
        reach &= (top_l >= 0) | base
        tok_rank = np.where(reach.astype(bool), rank, -1)
        anomalous = (rule_rank <= np.maximum(tok_rank[rule_left], tok_rank[rule_right]))
        by = np.lexsort((rule_rank, rule_left))
        cnt = np.bincount(rule_left, minlength=V)
        by_left_start = np.zeros(V + 1, np.int64)
        np.cumsum(cnt, out=by_left_start[1:])
        pre, sub_end, order, child_start, child_list, child_rank = forest_preorder(top_l, rank, reach, V)
        arrays = dict(keys=keys, rule_rank=rule_rank, rule_out=rule_out, rule_left=rule_left,
                      rule_right=rule_right, reach=reach, top_l=top_l, top_r=top_r, rank=rank,
                      by_left_start=by_left_start, by_left_rule=by.astype(np.int64), pre=pre, sub_end=sub_end,
                      order=order, child_start=child_start, child_list=child_list, child_rank=child_rank,
                      byte_id=byte_id, n_anomalous=np.array([int(anomalous.sum())], np.int64))
        return cls(arrays, V)

    # -------------------------------------------------------------- queries
    def is_reachable(self, t: int) -> bool:
        return 0 <= t < self.V and bool(self.reach[t])

    def pair_ok(self, a: int, b: int) -> bool:
        """Merge-level canonicity of the pair (both tokens reachable, else False)."""
        k = a * self.V + b
        hit = self._pairs.get(k)
        if hit is not None:
            return hit
        if not (self.is_reachable(a) and self.is_reachable(b)):
            hit = False
        else:
            hit = bool(pair_is_canonical(a, b, self.top_r, self.top_l, self.rank, self.keys, self.rule_rank,
                                         np.int64(self.V)))
        if len(self._pairs) >= 1 << 18:
            self._pairs.clear()
        self._pairs[k] = hit
        return hit

    def conflict_ranges(self, a: int) -> np.ndarray:
        while True:
            n = conflict_ranges(a, self.top_r, self.rank, self.by_left_start, self.by_left_rule, self.rule_rank,
                                self.rule_right, self.pre, self.sub_end, self.child_start, self.child_list,
                                self.child_rank, self._ranges)
            if n >= 0:
                return self._ranges[: 2 * n].copy()
            self._ranges = np.empty(2 * self._ranges.shape[0], np.int64)

    def conflict_words(self, a: int, n_words: int) -> np.ndarray:
        """uint32 bitset of the right tokens ``b`` with ``(a, b)`` non-canonical at merge level
        (reachable tokens only; unreachable ones are handled by the caller)."""
        w = np.zeros(n_words, np.uint32)
        r = self.conflict_ranges(a)
        ranges_to_words(r, r.shape[0] // 2, self.order, w)
        return w

    def memory_bytes(self) -> int:
        return sum(getattr(self, k).nbytes for k in self.ARRAYS)
