"""Token bitmasks: allocation, batched filling in threads, and application to logits.

Layout (shared with xgrammar and llguidance): int32 ``[batch, ceil(vocab_size / 32)]``; token
``t`` is allowed when bit ``t % 32`` of word ``t // 32`` is set.

This module imports no torch: torch is imported when a tensor is passed in. The application
kernels (Numba, torch ops, Triton) live in :mod:`grammask.grammar.kernels`, one module per backend.
"""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from .kernels.cpu import apply_numpy

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

    ``logits``: ``[batch, V]`` or ``[V]`` numpy array or torch tensor (any device for torch: a
    Triton kernel on CUDA when available, torch ops elsewhere, the Numba kernel on CPU float
    tensors). ``V`` may differ from the bitmask's width * 32 (padded vocabularies): tokens beyond
    the bitmask are disallowed, bits beyond ``V`` are ignored. ``indices`` (xgrammar's meaning):
    only rows ``i in indices`` are masked, logits row ``i`` with bitmask row ``i``; without it the
    bitmask's rows mask the first rows of the logits, and a bitmask with more rows than the logits
    raises :class:`~grammask.errors.MatcherError`. The kernels: :mod:`grammask.grammar.kernels`.
    """
    if isinstance(logits, np.ndarray):
        apply_numpy(logits, np.asarray(bitmask), vocab_size, indices)
        return
    from .kernels.apply import apply_token_bitmask_inplace_tensor  # imports torch

    apply_token_bitmask_inplace_tensor(logits, bitmask, vocab_size=vocab_size, indices=indices)
