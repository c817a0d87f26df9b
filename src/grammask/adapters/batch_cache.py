"""Slot-based KV cache for batched forwards of many sequences (used by :mod:`.transformers_backend`).

Each layer has one key and one value tensor ``[slots, kv_heads, capacity, head_dim]``; a sequence owns
one slot (a row) and its own length. One model call covers any subset of the slots:

- the query is ``[B, Q]``, every row LEFT-padded to the longest row of the call, so the last query
  position is every row's last real token (``logits_to_keep=1`` stays valid);
- ``position_ids`` are each row's own absolute positions (0 on padding);
- :class:`StepCache` (passed to the model as its cache) writes only the real tokens' keys/values at
  their row's positions ``length .. length + n - 1`` and hands attention the rows' first ``kv_len``
  positions (``kv_len`` = the longest row after the call): a view of the pool when the rows are
  consecutive slots in order, else a gathered copy;
- a 4-D additive mask ``[B, 1, Q, kv_len]`` (transformers uses a 4-D mask as given) lets query ``j`` of a
  row see keys ``0 .. its position``; padding queries see key 0 only (never an all-masked row).

Positions past a row's length may hold stale keys from padding or an aborted call: the mask never shows
them, and the next call overwrites them. Capacity grows by doubling (a copy of the pool) up to what the
longest sequence needs; the slot count grows by doubling; when every slot is free the tensors are
dropped, so memory returns to zero between bursts.

Limitations: one slot capacity for all slots (a long sequence grows every slot's row); the same 4-D
mask goes to every layer, so models with sliding-window layers (Mistral, Gemma 2/3) attend over the
whole context, which only equals their own attention while sequences are shorter than the window.
"""
from __future__ import annotations

from typing import Any, Sequence


class SlotKVPool:
    """Per-layer K/V storage with one slot per sequence (allocated lazily at the first update)."""

    def __init__(self, *, min_slots: int = 4, min_capacity: int = 256):
        self.min_slots = int(min_slots)
        self.min_capacity = int(min_capacity)
        self.slots = 0
        self.capacity = 0
        self.keys: list[Any] = []
        self.values: list[Any] = []
        self._free: list[int] = []
        self._used: set[int] = set()

    # ---------------------------------------------------------------- slots
    def alloc(self) -> int:
        if not self._free:
            old = self.slots
            self._resize(slots=max(self.min_slots, 2 * old))
            self._free = list(range(self.slots - 1, old - 1, -1))
        slot = self._free.pop()
        self._used.add(slot)
        return slot

    def free(self, slot: int) -> None:
        if slot in self._used:
            self._used.discard(slot)
            self._free.append(slot)
            self._free.sort(reverse=True)  # lowest slot first: batches stay in consecutive slots
        if not self._used:
            self.clear()

    def clear(self) -> None:
        self.keys, self.values = [], []
        self.slots = self.capacity = 0
        self._free, self._used = [], set()

    @property
    def in_use(self) -> int:
        return len(self._used)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values) if t is not None)

    def ensure_capacity(self, n: int) -> None:
        if n > self.capacity:
            cap = max(self.min_capacity, self.capacity)
            while cap < n:
                cap *= 2
            self._resize(capacity=cap)

    def _resize(self, *, slots: int | None = None, capacity: int | None = None) -> None:
        slots = self.slots if slots is None else slots
        capacity = self.capacity if capacity is None else capacity
        for store in (self.keys, self.values):
            for i, t in enumerate(store):
                if t is None:
                    continue
                new = t.new_zeros((slots, t.shape[1], capacity, t.shape[3]))
                new[: t.shape[0], :, : t.shape[2]] = t
                store[i] = new
        self.slots, self.capacity = slots, capacity

    def layer(self, idx: int, like: Any) -> tuple[Any, Any]:
        """The K and V tensors of layer ``idx``, created from ``like`` (``[B, H, Q, D]``) the first time."""
        while len(self.keys) <= idx:
            self.keys.append(None)
            self.values.append(None)
        if self.keys[idx] is None:
            shape = (self.slots, like.shape[1], self.capacity, like.shape[3])
            self.keys[idx] = like.new_zeros(shape)
            self.values[idx] = like.new_zeros(shape)
        return self.keys[idx], self.values[idx]

    # ---------------------------------------------------------------- prefixes (prefix_cache.py)
    def load(self, slot: int, keys: Any, values: Any) -> None:
        """Write ``keys``/``values`` ``[layers, kv_heads, n, head_dim]`` at positions ``0 .. n-1`` of ``slot``."""
        n = keys.shape[2]
        self.ensure_capacity(n)
        for idx in range(keys.shape[0]):
            K, V = self.layer(idx, keys[idx].unsqueeze(0))
            K[slot, :, :n] = keys[idx]
            V[slot, :, :n] = values[idx]

    def read(self, slot: int, n: int) -> tuple[Any, Any]:
        """Copies of positions ``0 .. n-1`` of ``slot``: keys, values ``[layers, kv_heads, n, head_dim]``."""
        import torch

        return (torch.stack([K[slot, :, :n] for K in self.keys]),
                torch.stack([V[slot, :, :n] for V in self.values]))

    # ---------------------------------------------------------------- one call
    def step(self, slots: Sequence[int], starts: Sequence[int], counts: Sequence[int], device: Any,
             pad_rows: int = 0):
        """``(StepCache, position_ids [B, Q], mask [B, 1, Q, kv_len] as bool "may attend")`` for one
        call appending ``counts[i]`` tokens at ``starts[i]`` to slot ``slots[i]``. ``pad_rows``
        throw-away rows follow (no token, no write: they read the last slot's key 0 only;
        :mod:`.row_padding`)."""
        import torch

        if pad_rows:
            slots = [*slots, *[slots[-1]] * pad_rows]
            starts = [*starts, *[0] * pad_rows]
            counts = [*counts, *[0] * pad_rows]

        B, Q = len(slots), max(counts)
        kv_len = max(s + n for s, n in zip(starts, counts))
        self.ensure_capacity(kv_len)
        starts_t = torch.tensor(starts, dtype=torch.long)
        counts_t = torch.tensor(counts, dtype=torch.long)
        pad = (Q - counts_t).unsqueeze(1)                       # [B, 1]
        j = torch.arange(Q).unsqueeze(0)                       # [1, Q]
        real = j >= pad                                        # [B, Q]
        pos = torch.where(real, starts_t.unsqueeze(1) + j - pad, torch.zeros((), dtype=torch.long))
        keys = torch.arange(kv_len).view(1, 1, kv_len)
        allowed = keys <= pos.unsqueeze(2)                     # [B, Q, kv_len]; padding rows: key 0 only
        b_idx, q_idx = real.nonzero(as_tuple=True)
        slot_t = torch.tensor(list(slots), dtype=torch.long)
        write_slot, write_pos = slot_t[b_idx], pos[b_idx, q_idx]
        consecutive = list(slots) == list(range(slots[0], slots[0] + B))
        cache = StepCache(
            self, kv_len,
            write=tuple(t.to(device) for t in (write_slot, write_pos, b_idx, q_idx)),
            rows=slice(slots[0], slots[0] + B) if consecutive else slot_t.to(device),
        )
        return cache, pos.to(device), allowed.unsqueeze(1).to(device)

    def packed_step(self, slots: Sequence[int], starts: Sequence[int], counts: Sequence[int], device: Any,
                    per_row: bool = False):
        """One PACKED call: every row's new tokens side by side in a single query row ``[1, T]``
        (``T = sum(counts)``, no padding). Attention sees the concatenation of the rows' caches (``S``
        keys: row ``i``'s positions ``0 .. starts[i] + counts[i] - 1``), and the mask lets a token see
        only its own row's keys up to its position (block-diagonal causal). Returns ``(StepCache,
        position_ids [1, T], mask [1, 1, T, S] as bool "may attend", last [B])`` with ``last[i]`` the
        query index of row ``i``'s last token (the logits to keep). ``per_row``: the attention reads each
        row's slot itself (:mod:`.packed_attention`): the cache hands it the whole pool tensors and
        the mask is a placeholder ``[1, 1, T, 1]``."""
        import torch

        kv_len = max(s + n for s, n in zip(starts, counts))
        self.ensure_capacity(kv_len)
        counts_t = torch.tensor(counts, dtype=torch.long)
        starts_t = torch.tensor(starts, dtype=torch.long)
        slot_t = torch.tensor(list(slots), dtype=torch.long)
        row_of_tok = torch.repeat_interleave(torch.arange(len(slots)), counts_t)            # [T]
        first_tok = torch.cumsum(counts_t, 0) - counts_t                                      # [B]
        pos = starts_t[row_of_tok] + torch.arange(len(row_of_tok)) - first_tok[row_of_tok]   # [T]
        ends_t = starts_t + counts_t
        T = len(row_of_tok)
        last = first_tok + counts_t - 1
        write = tuple(t.to(device) for t in (slot_t[row_of_tok], pos, torch.zeros(T, dtype=torch.long),
                                             torch.arange(T)))
        if per_row:
            cache = StepCache(self, kv_len, write=write, rows="pool")
            return (cache, pos.unsqueeze(0).to(device), torch.ones((1, 1, T, 1), dtype=torch.bool, device=device),
                    last.to(device))
        row_of_key = torch.repeat_interleave(torch.arange(len(slots)), ends_t)              # [S]
        first_key = torch.cumsum(ends_t, 0) - ends_t
        key_pos = torch.arange(len(row_of_key)) - first_key[row_of_key]                      # [S]
        allowed = (row_of_key.unsqueeze(0) == row_of_tok.unsqueeze(1)) & (key_pos.unsqueeze(0) <= pos.unsqueeze(1))
        cache = StepCache(self, int(len(row_of_key)), write=write,
                          rows=[(int(sl), int(e)) for sl, e in zip(slots, ends_t.tolist())])
        return cache, pos.unsqueeze(0).to(device), allowed.view(1, 1, T, -1).to(device), last.to(device)


class StepCache:
    """The cache object handed to the model for one call (duck-typed ``transformers`` Cache: the
    attention layers only call :meth:`update` when position ids and a 4-D mask are given)."""

    is_compileable = False

    def __init__(self, pool: SlotKVPool, kv_len: int, *, write: tuple, rows: Any):
        self.pool = pool
        self.kv_len = kv_len
        self.write = write
        self.rows = rows

    def update(self, key_states, value_states, layer_idx: int, *args, **kwargs):
        import torch

        K, V = self.pool.layer(layer_idx, key_states)
        ws, wp, b, q = self.write
        K[ws, :, wp] = key_states[b, :, q]
        V[ws, :, wp] = value_states[b, :, q]
        if isinstance(self.rows, str):  # packed, attention per row (packed_attention.py): the pool itself
            return K, V
        if isinstance(self.rows, list):  # packed: the rows' caches end to end, [1, heads, S, dim]
            return (torch.cat([K[sl, :, :n] for sl, n in self.rows], dim=1).unsqueeze(0),
                    torch.cat([V[sl, :, :n] for sl, n in self.rows], dim=1).unsqueeze(0))
        # a slice: a view of the pool; a tensor of slots: a gathered copy of their first kv_len positions
        return K[self.rows, :, : self.kv_len], V[self.rows, :, : self.kv_len]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.kv_len


__all__ = ["SlotKVPool", "StepCache"]
