"""Compatibility path: the bitmask kernels live in :mod:`grammask.grammar.kernels`.

Kept because its three names are public API: :func:`apply_token_bitmask_inplace_cuda` (the one
torch-tensor applier, :func:`grammask.grammar.kernels.apply.apply_token_bitmask_inplace_tensor`),
:func:`apply_token_bitmask_inplace_torch` and :func:`triton_available`.
"""
from __future__ import annotations

from ..grammar.kernels.apply import apply_token_bitmask_inplace_tensor as apply_token_bitmask_inplace_cuda
from ..grammar.kernels.torch_ops import apply_token_bitmask_inplace_torch
from ..grammar.kernels.triton_kernel import triton_available

__all__ = ["apply_token_bitmask_inplace_cuda", "apply_token_bitmask_inplace_torch", "triton_available"]
