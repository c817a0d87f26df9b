"""Flat token trie: every token's bytes as a path from the root, stored as numpy arrays.

Nodes are numbered in DFS preorder with children visited in increasing byte order, so the nodes are
exactly the distinct non-empty prefixes of the token byte strings (plus the root, node 0) in
lexicographic order. The subtree of node ``i`` is the contiguous range ``i .. node_end[i] - 1``;
skipping a subtree while walking is ``i = node_end[i]`` and the first child of ``i`` (if any) is
``i + 1``.

Arrays (``n = n_nodes``):

``node_byte``      uint8[n]   the byte on the edge into the node (root: 0, unused)
``node_depth``     int16[n]   path length (root: 0)
``node_end``       int32[n]   one past the last node of the node's subtree
``node_tok_start`` int32[n]   ``tok_ids[node_tok_start[i]:node_tok_end[i]]`` are the token ids whose
``node_tok_end``   int32[n]   bytes equal the path to node ``i`` (several ids may share bytes)
``tok_ids``        int32[k]   token ids grouped by node, in node order

``node_tok_start`` is cumulative (the number of token ids at nodes ``< i``), so every token id in the
subtree of ``i`` is ``tok_ids[node_tok_start[i]:node_tok_start[node_end[i]]]`` (use ``len(tok_ids)``
when ``node_end[i] == n``).

Construction is sort-based: sort the unique byte strings, compute the longest common prefix (LCP)
of each with its predecessor, and emit the bytes after the LCP as new nodes. Everything except the
sort and a few list comprehensions is vectorised numpy.
"""
from __future__ import annotations

from itertools import compress
from typing import Iterable, Sequence

import numpy as np

from ..errors import TokenizerError

_ARRAY_NAMES = ("node_byte", "node_depth", "node_end", "node_tok_start", "node_tok_end", "tok_ids")
_MAX_DEPTH = np.iinfo(np.int16).max


def _lcp_sorted(strs: Sequence[bytes], lens: np.ndarray, window: int = 16) -> np.ndarray:
    """LCP of each string with its predecessor in a sorted list (``lcp[0] = 0``).

    Compares ``window`` bytes at a time as zero-padded numpy rows; only the pairs that agree on a
    whole window (rare after the first) go on to the next window. Zero padding may compare equal to
    a real 0x00 byte, so the result is clipped to ``min(len_prev, len_cur)``.
    """
    m = len(strs)
    lcp = np.zeros(m, dtype=np.int64)
    if m < 2:
        return lcp
    bound = np.minimum(lens[1:], lens[:-1])
    active = np.arange(1, m)
    off = 0
    while len(active):
        if off == 0:  # every string takes part: one matrix, compared with itself shifted by a row
            mat = np.frombuffer(b"".join([x[:window].ljust(window, b"\0") for x in strs]), dtype=np.uint8)
            mat = mat.reshape(m, window)
            diff = mat[1:] != mat[:-1]
        else:
            idx = active.tolist()
            cur = b"".join([strs[k][off : off + window].ljust(window, b"\0") for k in idx])
            prev = b"".join([strs[k - 1][off : off + window].ljust(window, b"\0") for k in idx])
            diff = np.frombuffer(cur, dtype=np.uint8) != np.frombuffer(prev, dtype=np.uint8)
            diff = diff.reshape(-1, window)
        has = diff.any(axis=1)
        lcp[active] = off + np.where(has, diff.argmax(axis=1), window)
        off += window
        active = active[~has]
        active = active[bound[active - 1] > off]
    lcp[1:] = np.minimum(lcp[1:], bound)
    return lcp


class TokTrie:
    """A token trie in flat DFS-preorder arrays. Build with :meth:`build`."""

    __slots__ = (
        "node_byte",
        "node_depth",
        "node_end",
        "node_tok_start",
        "node_tok_end",
        "tok_ids",
        "max_depth",
        "_token_bytes",
        "_lists",
        "_root_children",
    )

    def __init__(
        self,
        node_byte: np.ndarray,
        node_depth: np.ndarray,
        node_end: np.ndarray,
        node_tok_start: np.ndarray,
        node_tok_end: np.ndarray,
        tok_ids: np.ndarray,
        token_bytes: Sequence[bytes] | None = None,
    ):
        self.node_byte = np.ascontiguousarray(node_byte, dtype=np.uint8)
        self.node_depth = np.ascontiguousarray(node_depth, dtype=np.int16)
        self.node_end = np.ascontiguousarray(node_end, dtype=np.int32)
        self.node_tok_start = np.ascontiguousarray(node_tok_start, dtype=np.int32)
        self.node_tok_end = np.ascontiguousarray(node_tok_end, dtype=np.int32)
        self.tok_ids = np.ascontiguousarray(tok_ids, dtype=np.int32)
        n = len(self.node_byte)
        if n == 0 or not (
            len(self.node_depth) == len(self.node_end) == len(self.node_tok_start) == len(self.node_tok_end) == n
        ):
            raise TokenizerError("inconsistent token trie arrays")
        self.max_depth = int(self.node_depth.max()) if n else 0
        self._token_bytes = token_bytes
        self._lists = None
        self._root_children = None

    # ------------------------------------------------------------------ construction
    @classmethod
    def build(cls, token_bytes: Sequence[bytes], exclude_ids: Iterable[int] = ()) -> "TokTrie":
        """Trie of every token ``i`` with non-empty ``token_bytes[i]`` and ``i not in exclude_ids``."""
        exclude = set(int(i) for i in exclude_ids)
        ids = [i for i, b in enumerate(token_bytes) if b and i not in exclude]
        return cls._build_from(token_bytes, ids)

    @classmethod
    def _build_from(cls, token_bytes: Sequence[bytes], ids: Sequence[int]) -> "TokTrie":
        if not ids:
            z = np.zeros(1, dtype=np.int32)
            return cls(np.zeros(1, np.uint8), np.zeros(1, np.int16), np.ones(1, np.int32), z, z, np.zeros(0, np.int32), token_bytes)
        # one stable sort of the ids by their bytes groups equal strings, ids ascending within a group
        order = sorted(ids, key=token_bytes.__getitem__)  # ids arrive sorted: ties stay ascending
        sb = [bytes(token_bytes[i]) for i in order]
        is_new = np.empty(len(sb), dtype=bool)
        is_new[0] = True
        if len(sb) > 1:
            is_new[1:] = np.fromiter(map(bytes.__ne__, sb[1:], sb[:-1]), dtype=bool, count=len(sb) - 1)
        strs = list(compress(sb, is_new.tolist()))
        m = len(strs)
        lens = np.fromiter((len(s) for s in strs), dtype=np.int64, count=m)
        if int(lens.max()) > _MAX_DEPTH:
            raise TokenizerError(f"token of {int(lens.max())} bytes is too long for the token trie")
        lcp = _lcp_sorted(strs, lens)
        counts = lens - lcp  # >= 1: strings are unique and sorted, so none is a prefix of its successor
        n_nodes = 1 + int(counts.sum())
        block_start = np.empty(m, dtype=np.int64)  # first node emitted by string k
        block_start[0] = 1
        np.cumsum(counts[:-1], out=block_start[1:])
        block_start[1:] += 1
        end_node = block_start + counts - 1  # node whose path is the whole string k

        node_byte = np.zeros(n_nodes, dtype=np.uint8)
        node_byte[1:] = np.frombuffer(b"".join(s[l:] for s, l in zip(strs, lcp.tolist())), dtype=np.uint8)
        # depth of node block_start[k] + j is lcp[k] + 1 + j
        owner = np.repeat(np.arange(m), counts)
        offs = np.arange(n_nodes - 1) - (block_start[owner] - 1)
        node_depth = np.zeros(n_nodes, dtype=np.int16)
        node_depth[1:] = lcp[owner] + 1 + offs

        node_end = cls._subtree_ends(node_depth, block_start, lcp)

        # token ids grouped by string, in node order
        tok_ids = np.asarray(order, dtype=np.int32)
        group = np.cumsum(is_new) - 1
        per_node = np.zeros(n_nodes, dtype=np.int64)
        per_node[end_node] = np.bincount(group, minlength=m)
        node_tok_start = np.zeros(n_nodes, dtype=np.int32)
        np.cumsum(per_node[:-1], out=node_tok_start[1:])
        node_tok_end = node_tok_start + per_node.astype(np.int32)
        return cls(node_byte, node_depth, node_end, node_tok_start, node_tok_end, tok_ids, token_bytes)

    @staticmethod
    def _subtree_ends(node_depth: np.ndarray, block_start: np.ndarray, lcp: np.ndarray) -> np.ndarray:
        """``node_end`` from parent pointers and subtree sizes summed bottom-up, level by level.

        Inside a block (the nodes one string adds) the parent of a node is the node before it; the
        first node of block k hangs off the last earlier node at depth ``lcp[k]`` (on the shared
        prefix). Work is O(n log n) whatever the token lengths."""
        n = len(node_depth)
        depth = node_depth.astype(np.int64)
        parent = np.arange(-1, n - 1, dtype=np.int64)
        by_depth = np.argsort(depth, kind="stable")  # grouped by depth, ascending index within
        keys = depth[by_depth] * n + by_depth
        pos = np.searchsorted(keys, lcp * n + block_start) - 1
        parent[block_start] = by_depth[pos]
        size = np.ones(n, dtype=np.int64)
        bounds = np.searchsorted(depth[by_depth], np.arange(int(depth.max()) + 2))
        for d in range(int(depth.max()), 0, -1):
            level = by_depth[bounds[d] : bounds[d + 1]]
            np.add.at(size, parent[level], size[level])
        return (np.arange(n) + size).astype(np.int32)

    def sub_trie(self, token_ids: Iterable[int], token_bytes: Sequence[bytes] | None = None) -> "TokTrie":
        """Trie of the given subset of this trie's tokens; ids keep their numbering and ids that are
        not in this trie are ignored. ``token_bytes`` (indexed by id) saves rebuilding the bytes from
        the node paths when this trie was loaded from arrays."""
        if token_bytes is None:
            token_bytes = self.token_bytes_map()
            keep = [i for i in {int(i) for i in token_ids} if i in token_bytes]
        else:
            in_trie = set(self.tok_ids.tolist())
            keep = [i for i in {int(i) for i in token_ids} if i in in_trie]
        return TokTrie._build_from(token_bytes, sorted(keep))

    def token_bytes_map(self) -> dict[int, bytes]:
        """``{token id: bytes}`` for every token of the trie, rebuilt from the node paths."""
        if self._token_bytes is not None:
            tb = self._token_bytes
            return {i: bytes(tb[i]) for i in self.tok_ids.tolist()}
        out: dict[int, bytes] = {}
        path = bytearray()
        nb, nd = self.node_byte.tolist(), self.node_depth.tolist()
        ts, te, tok = self.node_tok_start.tolist(), self.node_tok_end.tolist(), self.tok_ids.tolist()
        for i in range(1, len(nb)):
            del path[nd[i] - 1 :]
            path.append(nb[i])
            if te[i] > ts[i]:
                b = bytes(path)
                for t in tok[ts[i] : te[i]]:
                    out[t] = b
        return out

    # ------------------------------------------------------------------ (de)serialisation
    def to_arrays(self) -> dict[str, np.ndarray]:
        return {name: getattr(self, name) for name in _ARRAY_NAMES}

    @classmethod
    def from_arrays(cls, arrays, token_bytes: Sequence[bytes] | None = None) -> "TokTrie":
        try:
            return cls(*(np.asarray(arrays[name]) for name in _ARRAY_NAMES), token_bytes=token_bytes)
        except KeyError as e:
            raise TokenizerError(f"token trie arrays lack {e}") from None

    # ------------------------------------------------------------------ queries
    @property
    def n_nodes(self) -> int:
        return len(self.node_byte)

    @property
    def n_tokens(self) -> int:
        return len(self.tok_ids)

    def __len__(self) -> int:
        return self.n_nodes

    def __repr__(self) -> str:
        return f"TokTrie(n_nodes={self.n_nodes}, n_tokens={self.n_tokens}, max_depth={self.max_depth})"

    def _py(self):
        if self._lists is None:
            self._lists = (self.node_byte.tolist(), self.node_end.tolist())
            rc = [-1] * 256
            nb, ne = self._lists
            i = 1
            while i < len(nb):
                rc[nb[i]] = i
                i = ne[i]
            self._root_children = rc
        return self._lists

    def child(self, node: int, byte: int) -> int:
        """The child of ``node`` along ``byte``, or -1."""
        nb, ne = self._py()
        if node == 0:
            return self._root_children[byte]
        end = ne[node]
        i = node + 1
        while i < end:
            if nb[i] == byte:
                return i
            i = ne[i]
        return -1

    def lookup(self, data: bytes) -> int:
        """The node whose path is ``data`` (the root for ``b""``), or -1 when no token starts with it."""
        node = 0
        for b in data:
            node = self.child(node, b)
            if node < 0:
                return -1
        return node

    def tokens_at(self, node: int) -> np.ndarray:
        """Token ids whose bytes are exactly the path to ``node``."""
        return self.tok_ids[self.node_tok_start[node] : self.node_tok_end[node]]

    def token_ids_of(self, data: bytes) -> list[int]:
        """Token ids whose bytes equal ``data``."""
        node = self.lookup(data)
        return [] if node <= 0 else self.tokens_at(node).tolist()

    def subtree_tokens(self, node: int) -> np.ndarray:
        end = int(self.node_end[node])
        stop = len(self.tok_ids) if end >= self.n_nodes else int(self.node_tok_start[end])
        return self.tok_ids[self.node_tok_start[node] : stop]

    def tokens_with_prefix(self, prefix: bytes) -> list[int]:
        """Every token id whose bytes start with ``prefix`` (all tokens for ``b""``), sorted."""
        node = self.lookup(prefix)
        if node < 0:
            return []
        return sorted(self.subtree_tokens(node).tolist())

    def tokens_prefix_of(self, data: bytes) -> list[tuple[int, int]]:
        """``(length, token id)`` for every token whose bytes are a non-empty prefix of ``data``."""
        out = []
        node = 0
        for k, b in enumerate(data):
            node = self.child(node, b)
            if node < 0:
                break
            out.extend((k + 1, t) for t in self.tokens_at(node).tolist())
        return out


__all__ = ["TokTrie"]
