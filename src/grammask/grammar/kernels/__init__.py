"""Token bitmask application kernels, one module per backend (as xgrammar's ``kernels/``).

- :mod:`.cpu`: the Numba kernel for numpy arrays (and CPU torch tensors, viewed as numpy);
- :mod:`.torch_ops`: torch operations, any device (imports torch);
- :mod:`.triton_kernel`: one fused Triton kernel for CUDA tensors (imports torch; Triton lazily);
- :mod:`.apply`: the one torch-tensor applier, dispatching by device and dtype.

The public entry point is :func:`grammask.grammar.bitmask.apply_token_bitmask_inplace`, which sends
numpy arrays to :mod:`.cpu` and torch tensors to :mod:`.apply` (torch is imported only then).

Semantics, the same on every backend: logits ``[batch, V]`` or ``[V]``, an int32 bitmask
``[batch, W]`` or ``[W]`` (bit ``t % 32`` of word ``t // 32`` set = token ``t`` allowed);
disallowed tokens become ``-inf``; tokens at or beyond ``vocab_size`` (default ``V``) or beyond the
bitmask's ``32 * W`` bits become ``-inf``. Rows: with ``indices``, logits row ``i`` is masked with
bitmask row ``i`` for each ``i`` in ``indices`` (xgrammar's meaning); without, the first
``bitmask rows`` rows of the logits are masked (the others are left alone) and a bitmask with more
rows than the logits is an error (:class:`~grammask.errors.MatcherError`), whatever the backend.
"""
