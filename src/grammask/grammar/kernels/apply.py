"""The one applier for torch tensors: picks the backend by the logits' device and dtype.

``backend="auto"`` (default): the Triton kernel (:mod:`.triton_kernel`) for CUDA rows it handles;
the Numba kernel (:mod:`.cpu`, through a numpy view of the same memory) for contiguous
float32/float64 CPU logits that need no gradient, with a CPU bitmask; torch operations
(:mod:`.torch_ops`) otherwise. ``"cpu"``, ``"triton"`` and ``"torch"`` force one. Every backend
has the semantics of :mod:`grammask.grammar.kernels` (the row-count rule included).
"""
from __future__ import annotations

import numpy as np
import torch

from ...errors import MatcherError
from .cpu import apply_fast
from .torch_ops import apply_token_bitmask_inplace_torch, as_bitmask
from .triton_kernel import TRITON_DTYPES, apply_triton, triton_applies

__all__ = ["apply_token_bitmask_inplace_tensor"]

BACKENDS = ("auto", "cpu", "triton", "torch")
_CPU_DTYPES = (torch.float32, torch.float64)


def _cpu_applies(logits: torch.Tensor, bitmask) -> bool:
    on_cpu = not isinstance(bitmask, torch.Tensor) or bitmask.device.type == "cpu"
    return (on_cpu and logits.device.type == "cpu" and logits.dtype in _CPU_DTYPES and logits.is_contiguous()
            and not logits.requires_grad)


def _apply_cpu(logits: torch.Tensor, bitmask, vocab_size, indices) -> None:
    bm = as_bitmask(bitmask)
    if not _cpu_applies(logits, bm):
        raise MatcherError("the CPU kernel needs contiguous float32/float64 CPU logits (no gradient) "
                           "and a CPU bitmask")
    lg = logits.unsqueeze(0) if logits.dim() == 1 else logits
    bm = bm.unsqueeze(0) if bm.dim() == 1 else bm
    # a view of the same memory: the Numba kernel writes the tensor in place
    apply_fast(lg.numpy(), np.ascontiguousarray(bm.numpy()), vocab_size, indices)


def apply_token_bitmask_inplace_tensor(logits: torch.Tensor, bitmask, *, vocab_size: int | None = None,
                                       indices=None, backend: str = "auto") -> None:
    """Set disallowed logits of a torch tensor to ``-inf`` in place (see the module docstring)."""
    if not isinstance(logits, torch.Tensor):
        raise TypeError(f"logits must be a torch tensor, not {type(logits).__name__}")
    if backend == "auto":
        backend = "triton" if triton_applies(logits) else "cpu" if _cpu_applies(logits, bitmask) else "torch"
    if backend == "cpu":
        _apply_cpu(logits, bitmask, vocab_size, indices)
    elif backend == "triton":
        if not (logits.dim() in (1, 2) and logits.stride(-1) == 1 and logits.dtype in TRITON_DTYPES):
            raise MatcherError("the Triton path needs float32/float16/bfloat16 logits with unit stride rows")
        apply_triton(logits, bitmask, vocab_size, indices)
    elif backend == "torch":
        apply_token_bitmask_inplace_torch(logits, bitmask, vocab_size=vocab_size, indices=indices)
    else:
        raise ValueError(f"unknown backend {backend!r} ({', '.join(BACKENDS)})")
