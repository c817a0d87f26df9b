"""PrefixCache (adapters/prefix_cache.py) on small tensors: longest common prefix, one token always left
to compute, entries covered by a longer one dropped, and the byte budget (LRU) always respected."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from grammask.adapters.prefix_cache import PrefixCache  # noqa: E402


def kv(n: int, fill: float = 0.0):
    """Keys/values ``[layers=2, heads=1, n, dim=4]`` (2 * 2 * n * 4 * 4 bytes = 64n bytes)."""
    return torch.full((2, 1, n, 4), fill), torch.full((2, 1, n, 4), -fill)


def test_longest_prefix_and_one_token_left():
    c = PrefixCache(1 << 20, min_tokens=3)
    a = list(range(10))
    assert c.store(a, *kv(10, 1.0))
    e, n = c.lookup(a + [99])
    assert e is not None and n == 10
    e, n = c.lookup(a)  # the same prompt: its last token is computed again (its logits are needed)
    assert n == 9
    e, n = c.lookup(a[:5] + [77, 78])
    assert n == 5 and float(e.keys[0, 0, 0, 0]) == 1.0
    assert c.lookup([0, 1, 50, 51, 52]) == (None, 0)  # below min_tokens
    assert c.lookup([5, 6, 7, 8]) == (None, 0)
    assert c.hits == 3 and c.tokens_reused == 24


def test_covered_entries_and_byte_budget():
    c = PrefixCache(64 * 25, min_tokens=2)  # room for 25 tokens
    assert c.store([1, 2, 3, 4], *kv(4))
    assert c.covered([1, 2, 3]) and not c.covered([1, 2, 3, 4, 5])
    assert c.store([1, 2, 3, 4, 5, 6], *kv(6))  # the shorter entry is a prefix of it: dropped
    assert len(c) == 1 and c.nbytes == 64 * 6
    for k in range(10):
        c.store([100 + k] * 8, *kv(8))
        assert c.nbytes <= c.max_bytes
    assert len(c) == 3  # 3 x 8 tokens fit in 25
    assert c.lookup([1, 2, 3, 4, 5, 6, 7]) == (None, 0)  # evicted (least recently used)
    assert not c.store(list(range(30)), *kv(30))  # larger than the whole budget: not kept
    off = PrefixCache(0)
    assert not off.enabled and not off.store([1, 2, 3, 4, 5, 6, 7, 8, 9], *kv(9)) and off.lookup(list(range(20))) == (None, 0)
