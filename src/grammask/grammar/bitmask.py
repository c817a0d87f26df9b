"""Token bitmasks: allocation, batched filling in threads, and application to logits.

Layout (shared with xgrammar and llguidance): int32 ``[batch, ceil(vocab_size / 32)]``; token
``t`` is allowed when bit ``t % 32`` of word ``t // 32`` is set.

This module imports no torch: torch tensors are recognised by duck typing and handled with torch
operations only when one is passed in. CUDA application lives in :mod:`grammask.adapters`.
"""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from numba import njit

from ..errors import MatcherError

_POOL: ThreadPoolExecutor | None = None


def bitmask_words(vocab_size: int) -> int:
    return (vocab_size + 31) // 32


def allocate_token_bitmask(batch_size: int, vocab_size: int, *, backend: str = "numpy"):
    """A bitmask with every token allowed (all bits set), as numpy or (``backend="torch"``) a
    CPU torch tensor (pinned memory is left to the caller)."""
    arr = np.full((batch_size, bitmask_words(vocab_size)), -1, dtype=np.int32)
    if backend == "numpy":
        return arr
    if backend == "torch":
        import torch

        return torch.from_numpy(arr)
    raise ValueError(f"unknown backend {backend!r}")


def reset_token_bitmask(bitmask) -> None:
    bitmask[...] = -1


def unpack_bitmask(bitmask_row, vocab_size: int) -> np.ndarray:
    """Boolean ``[vocab_size]`` array from one bitmask row (numpy or CPU torch)."""
    row = bitmask_row if isinstance(bitmask_row, np.ndarray) else bitmask_row.cpu().numpy()
    bits = np.unpackbits(row.astype(np.int32).view(np.uint8), bitorder="little")
    return bits[:vocab_size].astype(bool)


def _pool() -> ThreadPoolExecutor:
    global _POOL
    if _POOL is None:
        _POOL = ThreadPoolExecutor(max_workers=max(1, min(32, os.cpu_count() or 1)),
                                   thread_name_prefix="grammask-mask")
    return _POOL


def fill_next_token_bitmasks(matchers, bitmask, indices=None, *, parallel: bool = True) -> None:
    """Fill row ``indices[i]`` (default ``i``) of ``bitmask`` from ``matchers[i]``; ``None``
    entries leave their row untouched. The Numba kernels release the GIL, so the rows are
    computed in parallel threads."""
    if indices is None:
        indices = range(len(matchers))
    jobs = [(m, i) for m, i in zip(matchers, indices) if m is not None]
    if not parallel or len(jobs) <= 1:
        for m, i in jobs:
            m.fill_next_token_bitmask(bitmask, i)
        return
    futs = [_pool().submit(m.fill_next_token_bitmask, bitmask, i) for m, i in jobs]
    for f in futs:
        f.result()


def apply_token_bitmask_inplace(logits, bitmask, *, vocab_size: int | None = None, indices=None) -> None:
    """Set disallowed logits to ``-inf`` in place.

    ``logits``: ``[batch, V]`` or ``[V]`` numpy array or torch tensor (any device for torch: the
    mask is expanded with torch ops on the logits' device). ``V`` may differ from the bitmask's
    width * 32 (padded vocabularies): tokens beyond the bitmask are disallowed, bits beyond ``V``
    are ignored. ``indices`` (xgrammar's meaning): only rows ``i in indices`` are masked, logits
    row ``i`` with bitmask row ``i``.
    """
    if isinstance(logits, np.ndarray):
        _apply_numpy(logits, np.asarray(bitmask), vocab_size, indices)
        return
    if getattr(logits, "is_cuda", False):  # a Triton kernel when available (lazy: no torch import here)
        from ..adapters.cuda_bitmask import apply_token_bitmask_inplace_cuda

        apply_token_bitmask_inplace_cuda(logits, bitmask, vocab_size=vocab_size, indices=indices)
        return
    _apply_torch(logits, bitmask, vocab_size, indices)


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


def _apply_fast(lg: np.ndarray, bm: np.ndarray, vocab_size, indices) -> None:
    """The Numba path for float32/float64 2-D arrays (numpy, or CPU torch tensors viewed as numpy)."""
    V = lg.shape[1] if vocab_size is None else min(vocab_size, lg.shape[1])
    n = min(V, bm.shape[1] * 32)
    if indices is None:
        rows = np.arange(min(bm.shape[0], lg.shape[0]), dtype=np.int64)
    else:
        rows = np.asarray(list(indices), dtype=np.int64)
    _apply_rows(lg, bm, rows, rows, n)


def _apply_numpy(logits: np.ndarray, bitmask: np.ndarray, vocab_size, indices) -> None:
    if bitmask.dtype != np.int32:
        raise MatcherError("bitmask must be int32")
    squeeze = logits.ndim == 1
    lg = logits[None, :] if squeeze else logits
    bm = bitmask[None, :] if bitmask.ndim == 1 else bitmask
    if lg.dtype in (np.float32, np.float64) and lg.flags.c_contiguous:
        _apply_fast(lg, np.ascontiguousarray(bm), vocab_size, indices)
        return
    V = lg.shape[1] if vocab_size is None else min(vocab_size, lg.shape[1])
    rows = range(bm.shape[0]) if indices is None else indices
    for r in rows:
        b = bm[r]
        allowed = np.unpackbits(b.view(np.uint8), bitorder="little")
        n = min(V, allowed.shape[0])
        row = lg[r]
        row[:n][allowed[:n] == 0] = -np.inf
        row[n:] = -np.inf


def _apply_torch(logits, bitmask, vocab_size, indices) -> None:
    import torch

    if not isinstance(bitmask, torch.Tensor):
        bitmask = torch.from_numpy(np.ascontiguousarray(bitmask))
    if bitmask.dtype != torch.int32:
        raise MatcherError("bitmask must be int32")
    squeeze = logits.dim() == 1
    lg = logits.unsqueeze(0) if squeeze else logits
    bm = bitmask.unsqueeze(0) if bitmask.dim() == 1 else bitmask
    if (lg.device.type == "cpu" and lg.dtype in (torch.float32, torch.float64) and lg.is_contiguous()
            and not lg.requires_grad and bm.device.type == "cpu"):
        # a view of the same memory: the Numba kernel writes the tensor in place
        _apply_fast(lg.numpy(), np.ascontiguousarray(bm.numpy()), vocab_size, indices)
        return
    bm = bm.to(lg.device, non_blocking=True)
    V = lg.shape[1] if vocab_size is None else min(vocab_size, lg.shape[1])
    bits = torch.arange(32, device=lg.device, dtype=torch.int32)
    allowed = ((bm.unsqueeze(-1) >> bits) & 1).bool().reshape(bm.shape[0], -1)
    n = min(V, allowed.shape[1])
    if indices is None:
        target = lg[: bm.shape[0]]
        target[:, :n].masked_fill_(~allowed[:, :n], float("-inf"))
        target[:, n:] = float("-inf")
    else:
        idx = torch.as_tensor(list(indices), device=lg.device, dtype=torch.long)
        sub = lg.index_select(0, idx)
        sub[:, :n].masked_fill_(~allowed.index_select(0, idx)[:, :n], float("-inf"))
        sub[:, n:] = float("-inf")
        lg.index_copy_(0, idx, sub)
