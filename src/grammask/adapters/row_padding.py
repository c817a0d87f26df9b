"""Batch sizes the CPU's matrix kernels like: pad a decode call's rows to the cheapest size at or above.

A decode step multiplies a ``[B, hidden]`` activation by every weight matrix. On CPU the BLAS (MKL in
the PyTorch wheels) picks its kernel by shape, and some small ``B`` are much slower than a larger one:
measured on this project's 2-core AMD EPYC (AVX-512), SmolLM2-135M float32, one whole decode call of
the transformers backend: B=2 93 ms, B=3 111 ms, B=4 84 ms, B=7 119 ms, B=8 95 ms. Adding throw-away
rows (no token, no cache write, logits dropped: :meth:`.batch_cache.SlotKVPool.step` ``pad_rows``)
makes B=3 run as B=4 and B=7 as B=8.

Which sizes are slow depends on the BLAS, the CPU and the thread count, so nothing is hard-coded:
:meth:`RowPadding.calibrate` times the model's own linear layers (a few decoder layers and the output
head, scaled to the whole model) for ``B = 1 .. max_rows`` once, on the first batched call, in about
0.1-0.3 s, and pads ``B`` to ``B' = argmin t(B')`` over ``B <= B' <= min(2B, max_rows)`` only where that is at least
``min_gain`` faster. On GPUs the backend never pads (``enabled=False``).
"""
from __future__ import annotations

import time
from typing import Any

#: rows considered (bigger calls are compute-bound: their time grows with B, padding never pays)
MAX_ROWS = 16
#: pad only where the padded size is at least this much faster (measurement noise is ~5%)
MIN_GAIN = 0.15


class RowPadding:
    """``pad(B)``: the number of rows to run for ``B`` real rows (see the module docstring)."""

    def __init__(self, *, enabled: bool = True, max_rows: int = MAX_ROWS, min_gain: float = MIN_GAIN):
        self.enabled = enabled
        self.max_rows = int(max_rows)
        self.min_gain = float(min_gain)
        #: B -> rows to run; None until calibrated
        self.table: dict[int, int] | None = None
        #: B -> estimated seconds of the linear layers per call (what the table was chosen from)
        self.timings: dict[int, float] = {}

    def pad(self, rows: int, model: Any = None) -> int:
        if not self.enabled or rows < 2 or rows > self.max_rows:
            return rows
        if self.table is None:
            if model is None:
                return rows
            self.calibrate(model)
        return self.table.get(rows, rows)

    def calibrate(self, model: Any, *, layers: int = 3, repeats: int = 3) -> dict[int, int]:
        """Time the model's linear layers for every row count and choose the padding table."""
        import torch

        blocks = _decoder_layers(model)
        head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
        sample = [m for blk in blocks[:layers] for m in blk.modules() if isinstance(m, torch.nn.Linear)]
        if not sample:
            self.table = {}
            return self.table
        scale = max(1, len(blocks)) / max(1, min(layers, len(blocks)))
        p = next(model.parameters())
        t: dict[int, float] = {}
        with torch.inference_mode():
            for rows in range(1, self.max_rows + 1):
                xs = {m.in_features: torch.randn(rows, m.in_features, dtype=p.dtype, device=p.device)
                      for m in sample}
                body = head_t = float("inf")
                for _ in range(repeats):
                    s = time.perf_counter()
                    for m in sample:
                        m(xs[m.in_features])
                    body = min(body, time.perf_counter() - s)
                    if isinstance(head, torch.nn.Linear):
                        x = torch.randn(rows, head.in_features, dtype=p.dtype, device=p.device)
                        s = time.perf_counter()
                        head(x)
                        head_t = min(head_t, time.perf_counter() - s)
                t[rows] = body * scale + (head_t if head_t != float("inf") else 0.0)
        self.timings = t
        table = {}
        for rows in range(2, self.max_rows + 1):
            best = min(range(rows, min(2 * rows, self.max_rows) + 1), key=lambda r: t[r])
            if best != rows and t[best] <= (1 - self.min_gain) * t[rows]:
                table[rows] = best
        self.table = table
        return table


def _decoder_layers(model: Any) -> list:
    """The model's list of decoder blocks (``model.model.layers`` for Llama-style models)."""
    import torch

    for mod in model.modules():
        if isinstance(mod, torch.nn.ModuleList) and len(mod) > 1:
            return list(mod)
    return []


__all__ = ["MAX_ROWS", "MIN_GAIN", "RowPadding"]
