"""Bitmask application on the CPU: a Numba kernel over float32/float64 rows, numpy otherwise.

Used for numpy arrays and for CPU torch tensors (viewed as numpy: the kernel writes the tensor's
memory in place). See :mod:`grammask.grammar.kernels` for the semantics.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from ...errors import MatcherError


def check_row_count(logit_rows: int, bitmask_rows: int, indices) -> None:
    """Without ``indices`` the bitmask may not have more rows than the logits."""
    if indices is None and bitmask_rows > logit_rows:
        raise MatcherError(f"bitmask has {bitmask_rows} rows, logits {logit_rows}")


@njit(nogil=True, cache=True)
def _apply_rows(logits, bitmask, rows, masks, n):
    """``logits[rows[k], t] = -inf`` for every token ``t < n`` whose bit is clear in
    ``bitmask[masks[k]]`` and for every ``t >= n``. Words with all bits set are skipped."""
    V = logits.shape[1]
    W = bitmask.shape[1]
    neg = -np.inf
    for k in range(rows.shape[0]):
        r = rows[k]
        mrow = masks[k]
        for w in range(W):
            word = bitmask[mrow, w]
            if word == -1:
                continue
            base = w * 32
            if base >= n:
                break
            top = min(32, n - base)
            if word == 0:
                logits[r, base:base + top] = neg
                continue
            for b in range(top):
                if not (word >> b) & 1:
                    logits[r, base + b] = neg
        if n < V:
            logits[r, n:] = neg


def apply_fast(lg: np.ndarray, bm: np.ndarray, vocab_size, indices) -> None:
    """The Numba path for float32/float64 C-contiguous 2-D arrays and a C-contiguous 2-D bitmask."""
    check_row_count(lg.shape[0], bm.shape[0], indices)
    V = lg.shape[1] if vocab_size is None else min(vocab_size, lg.shape[1])
    n = min(V, bm.shape[1] * 32)
    if indices is None:
        rows = np.arange(bm.shape[0], dtype=np.int64)
    else:
        rows = np.asarray(list(indices), dtype=np.int64)
        bound = min(lg.shape[0], bm.shape[0])
        if rows.size and (rows.max() >= bound or rows.min() < -bound):  # the kernel does not check
            raise MatcherError(f"row index out of range: indices {rows.tolist()}, {bound} rows")
    _apply_rows(lg, bm, rows, rows, n)


def apply_numpy(logits: np.ndarray, bitmask: np.ndarray, vocab_size, indices) -> None:
    """Set disallowed logits of a numpy array to ``-inf`` in place."""
    if bitmask.dtype != np.int32:
        raise MatcherError("bitmask must be int32")
    lg = logits[None, :] if logits.ndim == 1 else logits
    bm = bitmask[None, :] if bitmask.ndim == 1 else bitmask
    if lg.dtype in (np.float32, np.float64) and lg.flags.c_contiguous:
        apply_fast(lg, np.ascontiguousarray(bm), vocab_size, indices)
        return
    check_row_count(lg.shape[0], bm.shape[0], indices)
    V = lg.shape[1] if vocab_size is None else min(vocab_size, lg.shape[1])
    rows = range(bm.shape[0]) if indices is None else indices
    for r in rows:
        b = bm[r]
        allowed = np.unpackbits(b.view(np.uint8), bitorder="little")
        n = min(V, allowed.shape[0])
        row = lg[r]
        row[:n][allowed[:n] == 0] = -np.inf
        row[n:] = -np.inf
