"""Bitmask application on CUDA tensors: one fused Triton kernel.

A persistent grid over rows x blocks of ``BLOCK_SIZE`` tokens; each program loads
``BLOCK_SIZE / 32`` words and stores ``-inf`` where a bit is clear. Needs a CUDA tensor, the
``triton`` package, and rows with unit stride; ``GRAMMASK_DISABLE_TRITON=1`` turns it off. Runs in
Triton's CPU interpreter too (``TRITON_INTERPRET=1``, the tests). See
:mod:`grammask.grammar.kernels` for the semantics.
"""
from __future__ import annotations

import importlib.util
import os
from typing import Any

import torch

from .cpu import check_row_count
from .torch_ops import as_bitmask

__all__ = ["TRITON_DTYPES", "apply_triton", "triton_applies", "triton_available", "warm_up"]

TRITON_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_KERNEL: Any = None
_NUM_SMS: dict[int, int] = {}


def triton_available() -> bool:
    """The Triton path can be used: the package is there, CUDA is there, and it is not disabled."""
    if os.environ.get("GRAMMASK_DISABLE_TRITON", "") not in ("", "0"):
        return False
    return importlib.util.find_spec("triton") is not None and torch.cuda.is_available()


def triton_applies(logits: torch.Tensor) -> bool:
    """``logits`` are CUDA rows the kernel handles, and Triton is available."""
    return (logits.is_cuda and logits.dtype in TRITON_DTYPES and logits.dim() in (1, 2)
            and logits.stride(-1) == 1 and triton_available())


def _index_tensor(indices, device) -> torch.Tensor | None:
    if indices is None:
        return None
    if isinstance(indices, torch.Tensor):
        return indices.to(device=device, dtype=torch.int32)
    return torch.tensor(list(indices), device=device, dtype=torch.int32)


def _build_kernel():
    import triton
    import triton.language as tl

    # the batch's row count and the grid size are runtime values that Triton would otherwise
    # specialise on (== 1, % 16): without this every new small batch compiled another variant
    # during decoding (vLLM's JIT monitor caught it on the H200). One variant per dtype and
    # HAS_INDICES remains; warm_up() compiles those ahead.
    @triton.jit(do_not_specialize=["num_rows", "num_programs"])
    def _bitmask_kernel(logits_ptr, bitmask_ptr, indices_ptr, num_rows, vocab_size, n_cols, logits_stride,
                        bitmask_stride, bitmask_words, num_programs, HAS_INDICES: tl.constexpr,
                        BLOCK_SIZE: tl.constexpr):
        pid = tl.program_id(0)
        num_blocks = tl.cdiv(n_cols, BLOCK_SIZE)
        for work_id in tl.range(pid, num_rows * num_blocks, num_programs):
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


def apply_triton(logits: torch.Tensor, bitmask, vocab_size, indices, block_size: int = 4096,
                 num_warps: int | None = None) -> None:
    """Launch the kernel (the caller checked :func:`triton_applies`, or runs the interpreter).
    ``num_warps``: warps per program; default 16 for float32 logits and 32 for 16-bit ones (the best of
    4/8/16/32 on an H200 at B = 64..256, ``benchmarks/cuda_bitmask.py --warps``)."""
    lg = logits.unsqueeze(0) if logits.dim() == 1 else logits
    bm = as_bitmask(bitmask, lg.device)
    bm = bm.unsqueeze(0) if bm.dim() == 1 else bm
    if bm.stride(-1) != 1:
        bm = bm.contiguous()
    n_cols = lg.shape[1]
    V = n_cols if vocab_size is None else min(int(vocab_size), n_cols)
    idx = _index_tensor(indices, lg.device)
    num_rows = bm.shape[0] if idx is None else idx.shape[0]
    check_row_count(lg.shape[0], bm.shape[0], idx)
    if num_rows == 0 or n_cols == 0:
        return
    n_programs = min(_num_programs(lg.device), num_rows * ((n_cols + block_size - 1) // block_size))
    _kernel()[(n_programs,)](
        lg, bm, idx if idx is not None else bm, num_rows, V, n_cols, lg.stride(0), bm.stride(0), bm.shape[1],
        n_programs, HAS_INDICES=idx is not None, BLOCK_SIZE=block_size,
        num_warps=(num_warps or (16 if lg.element_size() == 4 else 32)) if lg.device.type == "cuda" else 1,
    )


def warm_up(device, n_cols: int, dtypes=(torch.float32,), vocab_size: int | None = None) -> int:
    """Compile the kernel ahead for logits rows of ``n_cols`` on ``device`` in each of ``dtypes``,
    with and without row indices, so that the first decoding steps do not pay Triton's JIT (a
    server calls this when it starts). Returns the number of launches made: 0 where the Triton
    path does not apply (no CUDA, no Triton, ``GRAMMASK_DISABLE_TRITON``). ``vocab_size``: as the
    calls to come will pass it (their bitmask has ``ceil(vocab_size / 32)`` words): Triton
    specialises on its divisibility too."""
    device = torch.device(device)
    words = (int(vocab_size if vocab_size is not None else n_cols) + 31) // 32
    done = 0
    for dtype in dict.fromkeys(dtypes):
        logits = torch.zeros((2, int(n_cols)), dtype=dtype, device=device)
        if not triton_applies(logits):
            continue
        bitmask = torch.full((2, words), -1, dtype=torch.int32, device=device)
        for indices in (None, [1]):
            apply_triton(logits, bitmask, vocab_size, indices)
            done += 1
    if done and device.type == "cuda":
        torch.cuda.synchronize(device)
    return done
