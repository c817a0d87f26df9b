"""Bitmask application with torch operations, on the logits' device (any device, any float dtype).

The bits are expanded with torch ops; the bitmask (numpy or torch, any device) is copied to the
logits' device (pinned memory makes that copy asynchronous). See :mod:`grammask.grammar.kernels`
for the semantics.
"""
from __future__ import annotations

import numpy as np
import torch

from ...errors import MatcherError
from .cpu import check_row_count

__all__ = ["apply_token_bitmask_inplace_torch"]


def as_bitmask(bitmask, device=None) -> torch.Tensor:
    """``bitmask`` as an int32 tensor (numpy arrays are shared, not copied), on ``device`` if given."""
    if not isinstance(bitmask, torch.Tensor):
        bitmask = torch.from_numpy(np.ascontiguousarray(bitmask))
    if bitmask.dtype != torch.int32:
        raise MatcherError("bitmask must be int32")
    if device is not None and bitmask.device != device:
        bitmask = bitmask.to(device, non_blocking=True)
    return bitmask


def apply_token_bitmask_inplace_torch(logits: torch.Tensor, bitmask, *, vocab_size: int | None = None,
                                      indices=None) -> None:
    """The torch-ops implementation (any device)."""
    lg = logits.unsqueeze(0) if logits.dim() == 1 else logits
    bm = as_bitmask(bitmask, lg.device)
    bm = bm.unsqueeze(0) if bm.dim() == 1 else bm
    V = lg.shape[1] if vocab_size is None else min(int(vocab_size), lg.shape[1])
    n = min(V, bm.shape[1] * 32)
    bits = torch.arange(32, device=lg.device, dtype=torch.int32)
    if indices is None:
        rows = bm.shape[0]
        check_row_count(lg.shape[0], rows, indices)
        words = bm[:rows, : (n + 31) // 32]
        target = lg[:rows]
    else:
        idx = torch.as_tensor(list(indices) if not isinstance(indices, torch.Tensor) else indices,
                              device=lg.device, dtype=torch.long)
        words = bm.index_select(0, idx)[:, : (n + 31) // 32]
        target = lg.index_select(0, idx)
    blocked = ((words.unsqueeze(-1) >> bits) & 1).eq(0).reshape(words.shape[0], -1)[:, :n]
    target[:, :n].masked_fill_(blocked, float("-inf"))
    target[:, n:] = float("-inf")
    if indices is not None:
        lg.index_copy_(0, idx, target)
