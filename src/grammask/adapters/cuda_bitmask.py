"""Token bitmask application on accelerator tensors: a Triton kernel on CUDA, torch ops elsewhere.

:func:`apply_token_bitmask_inplace_cuda` has the semantics of
:func:`grammask.grammar.bitmask.apply_token_bitmask_inplace` (the CPU/numpy reference): logits
``[batch, V]`` or ``[V]`` (float32/float16/bfloat16), an int32 bitmask ``[batch, W]`` or ``[W]``
(bit ``t % 32`` of word ``t // 32`` set = token ``t`` allowed); disallowed tokens become
``-inf``; tokens at or beyond ``vocab_size`` (default ``V``) or beyond the bitmask's ``32 * W``
bits become ``-inf``; ``indices`` selects the rows (row ``i`` of the logits is masked with row
``i`` of the bitmask, like xgrammar). The bitmask may live on the CPU: it is copied to the
logits' device (pinned memory makes that copy asynchronous).

Backends (``backend=``):

- ``"triton"``: one fused kernel (a persistent grid over rows x blocks of ``BLOCK_SIZE``
  tokens; each program loads ``BLOCK_SIZE / 32`` words and stores ``-inf`` where a bit is
  clear). Needs a CUDA tensor, the ``triton`` package, and rows with unit stride;
- ``"torch"``: expand the bits with torch ops on the logits' device (any device; what
  :mod:`grammask.grammar.bitmask` does for CPU tensors);
- ``"auto"`` (default): Triton when it applies, else torch. ``GRAMMASK_DISABLE_TRITON=1``
  turns Triton off.
"""
from __future__ import annotations

import importlib.util
import os
from typing import Any

import torch

from ..errors import MatcherError

__all__ = ["apply_token_bitmask_inplace_cuda", "apply_token_bitmask_inplace_torch", "triton_available"]

_TRITON_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_KERNEL: Any = None
_NUM_SMS: dict[int, int] = {}


def triton_available() -> bool:
    """The Triton path can be used: the package is there, CUDA is there, and it is not disabled."""
    if os.environ.get("GRAMMASK_DISABLE_TRITON", "") not in ("", "0"):
        return False
    return importlib.util.find_spec("triton") is not None and torch.cuda.is_available()


def _as_bitmask(bitmask, device) -> torch.Tensor:
    if not isinstance(bitmask, torch.Tensor):
        import numpy as np

        bitmask = torch.from_numpy(np.ascontiguousarray(bitmask))
    if bitmask.dtype != torch.int32:
        raise MatcherError("bitmask must be int32")
    if bitmask.device != device:
        bitmask = bitmask.to(device, non_blocking=True)
    return bitmask


def _index_tensor(indices, device) -> torch.Tensor | None:
    if indices is None:
        return None
    if isinstance(indices, torch.Tensor):
        return indices.to(device=device, dtype=torch.int32)
    return torch.tensor(list(indices), device=device, dtype=torch.int32)


# ---------------------------------------------------------------------------------------------- torch
def apply_token_bitmask_inplace_torch(logits: torch.Tensor, bitmask, *, vocab_size: int | None = None,
                                      indices=None) -> None:
    """The torch-ops implementation (any device)."""
    lg = logits.unsqueeze(0) if logits.dim() == 1 else logits
    bm = _as_bitmask(bitmask, lg.device)
    bm = bm.unsqueeze(0) if bm.dim() == 1 else bm
    V = lg.shape[1] if vocab_size is None else min(int(vocab_size), lg.shape[1])
    n = min(V, bm.shape[1] * 32)
    rows = bm.shape[0] if indices is None else None
    bits = torch.arange(32, device=lg.device, dtype=torch.int32)
    if indices is None:
        if rows > lg.shape[0]:
            raise MatcherError(f"bitmask has {rows} rows, logits {lg.shape[0]}")
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


# ---------------------------------------------------------------------------------------------- triton
def _build_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def _bitmask_kernel(logits_ptr, bitmask_ptr, indices_ptr, num_rows, vocab_size, n_cols, logits_stride,
                        bitmask_stride, bitmask_words, NUM_PROGRAMS: tl.constexpr, HAS_INDICES: tl.constexpr,
                        BLOCK_SIZE: tl.constexpr):
        pid = tl.program_id(0)
        num_blocks = tl.cdiv(n_cols, BLOCK_SIZE)
        for work_id in tl.range(pid, num_rows * num_blocks, NUM_PROGRAMS):
            row_id = work_id // num_blocks
            block_start = (work_id % num_blocks) * BLOCK_SIZE
            if HAS_INDICES:
                row = tl.load(indices_ptr + row_id).to(tl.int64)
            else:
                row = row_id.to(tl.int64)
            offsets = block_start + tl.arange(0, BLOCK_SIZE)
            word_offsets = block_start // 32 + tl.arange(0, BLOCK_SIZE // 32)
            words = tl.load(bitmask_ptr + row * bitmask_stride + word_offsets, mask=word_offsets < bitmask_words,
                            other=0)
            blocked = ((words[:, None] >> tl.arange(0, 32)[None, :]) & 1) == 0
            blocked = tl.reshape(blocked, (BLOCK_SIZE,))
            blocked = blocked | (offsets >= vocab_size)
            tl.store(logits_ptr + row * logits_stride + offsets, -float("inf"), mask=(offsets < n_cols) & blocked)

    return _bitmask_kernel


def _kernel():
    global _KERNEL
    if _KERNEL is None:
        _KERNEL = _build_kernel()
    return _KERNEL


def _num_programs(device: torch.device) -> int:
    if device.type != "cuda":  # the Triton interpreter (tests): a small grid
        return 4
    idx = device.index if device.index is not None else torch.cuda.current_device()
    n = _NUM_SMS.get(idx)
    if n is None:
        n = _NUM_SMS[idx] = int(torch.cuda.get_device_properties(idx).multi_processor_count)
    return n


def _apply_triton(logits: torch.Tensor, bitmask, vocab_size, indices, block_size: int = 4096) -> None:
    lg = logits.unsqueeze(0) if logits.dim() == 1 else logits
    bm = _as_bitmask(bitmask, lg.device)
    bm = bm.unsqueeze(0) if bm.dim() == 1 else bm
    if bm.stride(-1) != 1:
        bm = bm.contiguous()
    n_cols = lg.shape[1]
    V = n_cols if vocab_size is None else min(int(vocab_size), n_cols)
    idx = _index_tensor(indices, lg.device)
    num_rows = bm.shape[0] if idx is None else idx.shape[0]
    if idx is None and num_rows > lg.shape[0]:
        raise MatcherError(f"bitmask has {num_rows} rows, logits {lg.shape[0]}")
    if num_rows == 0 or n_cols == 0:
        return
    n_programs = min(_num_programs(lg.device), num_rows * ((n_cols + block_size - 1) // block_size))
    _kernel()[(n_programs,)](
        lg, bm, idx if idx is not None else bm, num_rows, V, n_cols, lg.stride(0), bm.stride(0), bm.shape[1],
        NUM_PROGRAMS=n_programs, HAS_INDICES=idx is not None, BLOCK_SIZE=block_size,
        num_warps=8 if lg.device.type == "cuda" else 1,
    )


def _triton_applies(logits: torch.Tensor) -> bool:
    return (logits.is_cuda and logits.dtype in _TRITON_DTYPES and logits.dim() in (1, 2)
            and logits.stride(-1) == 1 and triton_available())


# ---------------------------------------------------------------------------------------------- entry point
def apply_token_bitmask_inplace_cuda(logits: torch.Tensor, bitmask, *, vocab_size: int | None = None,
                                     indices=None, backend: str = "auto") -> None:
    """Set disallowed logits to ``-inf`` in place (see the module docstring)."""
    if not isinstance(logits, torch.Tensor):
        raise TypeError(f"logits must be a torch tensor, not {type(logits).__name__}")
    if backend == "auto":
        backend = "triton" if _triton_applies(logits) else "torch"
    if backend == "triton":
        if not (logits.dim() in (1, 2) and logits.stride(-1) == 1 and logits.dtype in _TRITON_DTYPES):
            raise MatcherError("the Triton path needs float32/float16/bfloat16 logits with unit stride rows")
        _apply_triton(logits, bitmask, vocab_size, indices)
    elif backend == "torch":
        apply_token_bitmask_inplace_torch(logits, bitmask, vocab_size=vocab_size, indices=indices)
    else:
        raise ValueError(f"unknown backend {backend!r} (auto, triton, torch)")
