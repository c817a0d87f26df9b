"""Attention of a packed call, one row at a time (the transformers backend's varlen attention).

A packed call (:meth:`.batch_cache.SlotKVPool.packed_step`) runs every row's new tokens side by side
in one query row. Attention must not mix rows. The generic way is one attention over all the rows'
keys end to end with a block-diagonal mask: a copy of every row's cache per layer and ``T x S``
scores for ``T`` tokens over ``S`` keys, almost all masked. This module registers an attention
function with ``transformers`` (its ``AttentionInterface``) that, while a packed call runs (a
thread-local layout set by :func:`packed_layout`), attends each row's own queries to its own slot of
the pool directly (a view, no copy), with a bottom-right causal mask when a row has several tokens;
outside a packed call it is transformers' own SDPA attention, unchanged.

Single-token rows (decode steps) attend together in one batched product over their slots; rows of
several tokens (prompts, fast-forward runs) one by one with a bottom-right causal mask. For these
few queries plain matrix products beat SDPA's kernels, whose fixed cost per call dominates (~240 us
per call here). Measured on the embedded model (CPU, bfloat16, one thread, 7 decode rows and one
row of 3 fast-forward tokens, ~70 tokens each): 84-87 ms per packed call with the masked attention
over all rows' keys or with SDPA per row, 77 ms with this (64 ms for 8 plain decode rows).
``tests/test_batched_forward.py`` checks both packed attentions against solo decoding.

:func:`install` switches a model to this function when its attention is SDPA and transformers has
the interface; otherwise the backend keeps the masked packed attention.
"""
from __future__ import annotations

import contextlib
import threading
from typing import Any, Sequence

#: the name registered with transformers' AttentionInterface
NAME = "grammask_packed_sdpa"

_local = threading.local()


class _Layout:
    """What every layer of one packed call needs, computed once: the single-token rows (decode steps)
    attend in ONE batched SDPA over their slots (a view when the slots are consecutive), each
    several-token row (a prompt, a fast-forward run) in its own SDPA with a bottom-right causal mask."""

    def __init__(self, rows: Sequence[tuple[int, int, int]], device: Any):
        import torch

        self.T = sum(n for _s, _k, n in rows)
        singles = [(a, slot, kv) for a, (slot, kv, n) in zip(_starts(rows), rows) if n == 1]
        self.multi = [(a, slot, kv, n) for a, (slot, kv, n) in zip(_starts(rows), rows) if n > 1]
        self.single_q = self.single_slots = self.single_mask = None
        if singles:
            q_idx = [a for a, _s, _k in singles]
            slots = [sl for _a, sl, _k in singles]
            width = max(kv for _a, _s, kv in singles)
            self.width = width
            self.single_q = torch.tensor(q_idx, dtype=torch.long, device=device)
            consecutive = slots == list(range(slots[0], slots[0] + len(slots)))
            self.single_slots = (slice(slots[0], slots[0] + len(slots)) if consecutive
                                 else torch.tensor(slots, dtype=torch.long, device=device))
            lens = torch.tensor([kv for _a, _s, kv in singles], device=device)
            mask = torch.arange(width, device=device).unsqueeze(0) < lens.unsqueeze(1)   # [B1, width]
            self.single_mask = None if bool(mask.all()) else mask.view(len(singles), 1, 1, width)
        self.multi_masks = [torch.ones(n, kv, dtype=torch.bool, device=device).tril(kv - n)
                            for _a, _s, kv, n in self.multi]


def _starts(rows):
    a = 0
    for _slot, _kv, n in rows:
        yield a
        a += n


@contextlib.contextmanager
def packed_layout(rows: Sequence[tuple[int, int, int]], device: Any = "cpu"):
    """While active (in this thread), attention runs per row: ``rows[i] = (slot, kv_len, n_new)``, in
    query order; the cache's ``update`` returns the whole pool tensors for it to slice."""
    prev = getattr(_local, "layout", None)
    _local.layout = _Layout(rows, device)
    try:
        yield
    finally:
        _local.layout = prev


def active() -> bool:
    return getattr(_local, "layout", None) is not None


def packed_sdpa_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None,
                          **kwargs):
    lay = getattr(_local, "layout", None)
    if lay is None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, **kwargs)
    out = query.new_empty(query.shape)  # [1, heads, T, dim]
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    if lay.single_q is not None:
        q = query[0][:, lay.single_q].transpose(0, 1).unsqueeze(2)                 # [B1, heads, 1, dim]
        o = _attend(q, key[lay.single_slots, :, : lay.width], value[lay.single_slots, :, : lay.width],
                    lay.single_mask, scale)
        out[0][:, lay.single_q] = o.squeeze(2).transpose(0, 1)
    for (a, slot, kv_len, n), mask in zip(lay.multi, lay.multi_masks):
        out[:, :, a : a + n] = _attend(query[:, :, a : a + n], key[slot : slot + 1, :, :kv_len],
                                       value[slot : slot + 1, :, :kv_len], mask, scale)
    return out.transpose(1, 2).contiguous(), None


def _attend(q, k, v, mask, scale):
    """Softmax attention of ``q [B, heads, n, dim]`` over ``k, v [B, kv_heads, L, dim]`` (grouped query
    heads share a key/value head) with a boolean ``mask`` broadcastable to ``[B, 1, n, L]`` (or None).
    Plain matrix products: for a handful of queries they cost a fraction of a call into SDPA's
    kernels (measured: ~240 us per call here, 2-8 calls per layer), scores and softmax in float32."""
    import torch

    B, H, n, D = q.shape
    Hk = k.shape[1]
    g = H // Hk
    qg = q.reshape(B, Hk, g * n, D)                                          # heads of a group side by side
    scores = torch.matmul(qg, k.transpose(-1, -2)).float().mul_(scale)      # [B, Hk, g*n, L]
    if mask is not None:
        m = mask.reshape(mask.shape[0], 1, 1, n, mask.shape[-1]) if mask.dim() == 4 else mask.view(1, 1, 1, n, -1)
        scores = scores.view(B, Hk, g, n, -1).masked_fill(~m, float("-inf")).view(B, Hk, g * n, -1)
    probs = torch.softmax(scores, dim=-1).to(v.dtype)
    return torch.matmul(probs, v).view(B, H, n, D)


def install(model: Any) -> bool:
    """Use :func:`packed_sdpa_attention` for ``model`` (True), or leave it alone (False: its attention
    is not SDPA, or this transformers has no ``AttentionInterface``)."""
    cfg = getattr(model, "config", None)
    if getattr(cfg, "_attn_implementation", None) not in ("sdpa", NAME):
        return False
    try:
        from transformers import AttentionInterface

        AttentionInterface.register(NAME, packed_sdpa_attention)
        if hasattr(model, "set_attn_implementation"):
            model.set_attn_implementation(NAME)
        else:  # pragma: no cover - older transformers
            cfg._attn_implementation = NAME
    except Exception:  # pragma: no cover - a transformers without the interface
        return False
    return getattr(cfg, "_attn_implementation", None) == NAME


__all__ = ["NAME", "active", "install", "packed_layout", "packed_sdpa_attention"]
