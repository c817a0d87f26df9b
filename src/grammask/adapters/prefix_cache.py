"""Prompt-prefix KV reuse for the transformers backend (the idea of vLLM's automatic prefix caching
and SGLang's radix cache, at token granularity, in a small LRU).

Chat prompts of one deployment share long prefixes: the chat template's system turn (SmolLM2's
default system prompt is 20 of the ~50 tokens of a short question), a common instruction, few-shot
examples. Keys and values of a causal LM at position ``p`` depend only on tokens ``0 .. p``, so the
cache of a prompt's first ``n`` tokens is valid for every prompt that starts with the same ``n``
tokens. :class:`PrefixCache` keeps the keys/values of recently prefilled prompts; a new sequence's
first call copies the longest common prefix into its slot and runs only the rest (always at least one
token: its logits are the call's result).

Exactness: the reused keys/values are the ones the model computed for those very tokens at those very
positions; they can differ from a fresh computation only by floating-point rounding of a different
call shape (the same order of difference as batching itself: tests compare logits with a tolerance and
greedy outputs exactly).

Memory: entries are evicted least recently used first so that the total stays within ``max_bytes``
(default 64 MiB: ~1,400 tokens of SmolLM2-135M's 46 KiB per token); an entry larger than the budget is
not kept. ``max_bytes=0`` turns reuse off.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Sequence

#: default byte budget of the kept keys/values
DEFAULT_PREFIX_CACHE_BYTES = 64 << 20
#: shorter common prefixes are not worth a lookup's copy
MIN_REUSE_TOKENS = 8


@dataclass(eq=False)
class PrefixEntry:
    ids: tuple[int, ...]
    #: ``[layers, kv_heads, len(ids), head_dim]`` each
    keys: Any
    values: Any

    @property
    def nbytes(self) -> int:
        return 2 * self.keys.numel() * self.keys.element_size()


class PrefixCache:
    """Keys/values of recent prompts, looked up by longest common token prefix (see the module doc)."""

    def __init__(self, max_bytes: int = DEFAULT_PREFIX_CACHE_BYTES, *, min_tokens: int = MIN_REUSE_TOKENS):
        if max_bytes < 0:
            raise ValueError("max_bytes must be >= 0")
        self.max_bytes = int(max_bytes)
        self.min_tokens = max(1, int(min_tokens))
        self._entries: OrderedDict[tuple[int, ...], PrefixEntry] = OrderedDict()
        self.nbytes = 0
        self.lookups = 0
        self.hits = 0
        self.tokens_reused = 0

    @property
    def enabled(self) -> bool:
        return self.max_bytes > 0

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, ids: Sequence[int]) -> tuple[PrefixEntry | None, int]:
        """The entry sharing the longest prefix with ``ids`` and that prefix's length, at most
        ``len(ids) - 1`` (one token is left to compute), or ``(None, 0)`` below ``min_tokens``."""
        if not self.enabled or len(ids) <= self.min_tokens:
            return None, 0
        self.lookups += 1
        best, best_n = None, 0
        limit = len(ids) - 1
        for e in self._entries.values():
            n = _common_prefix(e.ids, ids, limit)
            if n > best_n:
                best, best_n = e, n
        if best is None or best_n < self.min_tokens:
            return None, 0
        self._entries.move_to_end(best.ids)
        self.hits += 1
        self.tokens_reused += best_n
        return best, best_n

    def covered(self, ids: Sequence[int]) -> bool:
        """An entry already holds all of ``ids`` (storing them again would add nothing)."""
        n = len(ids)
        return any(len(e.ids) >= n and _common_prefix(e.ids, ids, n) == n for e in self._entries.values())

    def store(self, ids: Sequence[int], keys: Any, values: Any) -> bool:
        """Keep the keys/values ``[layers, kv_heads, len(ids), head_dim]`` of the prompt ``ids``."""
        if not self.enabled or len(ids) < self.min_tokens:
            return False
        entry = PrefixEntry(tuple(int(t) for t in ids), keys, values)
        if entry.nbytes > self.max_bytes:
            return False
        old = self._entries.pop(entry.ids, None)
        if old is not None:
            self.nbytes -= old.nbytes
        # entries that are prefixes of the new one add nothing once it is kept
        for k in [k for k in self._entries if len(k) < len(entry.ids) and entry.ids[: len(k)] == k]:
            self.nbytes -= self._entries.pop(k).nbytes
        self._entries[entry.ids] = entry
        self.nbytes += entry.nbytes
        while self.nbytes > self.max_bytes:
            _k, e = self._entries.popitem(last=False)
            self.nbytes -= e.nbytes
        return True

    def clear(self) -> None:
        self._entries.clear()
        self.nbytes = 0

    def stats(self) -> dict:
        return {"entries": len(self._entries), "bytes": self.nbytes, "max_bytes": self.max_bytes,
                "lookups": self.lookups, "hits": self.hits, "tokens_reused": self.tokens_reused}


def _common_prefix(a: Sequence[int], b: Sequence[int], limit: int) -> int:
    n = min(len(a), len(b), limit)
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


__all__ = ["DEFAULT_PREFIX_CACHE_BYTES", "MIN_REUSE_TOKENS", "PrefixCache", "PrefixEntry"]
