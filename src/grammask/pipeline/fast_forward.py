"""Fast-forward (forced) tokens, tokenized canonically (see docs/fast-forward.md).

When the grammar forces the next bytes, they are tokenized with the model's own tokenizer and fed
in one forward pass instead of being sampled token by token. To keep the tokenization canonical,
trailing tokens are dropped when a token of the vocabulary could span the end of the forced bytes
(start inside them and go past them) in a way the grammar allows: the model would have produced
that token, so forcing the shorter one would push it off its distribution.

Algorithm: tokenize the forced bytes; look at the last ``max_tokens_back`` tokens;
for each byte position ``idx`` from the start of that tail to the end, if some token starts with
``forced[idx:]``, is longer, and the grammar accepts ``forced[:idx] + token``, cut at the first
such ``idx`` and drop every token that reaches past it.
"""
from __future__ import annotations

import bisect
import threading
import weakref
from typing import Callable, Sequence

from ..grammar.matcher import GrammarMatcher
from ..grammar.utf8 import utf8_prefix

MAX_TOKENS_BACK = 4
#: grammar checks per call before giving up (and cutting, which is always safe)
MAX_CANDIDATE_CHECKS = 4096


class TokenIndex:
    """The vocabulary's token bytes, sorted, to find the tokens that extend a byte string."""

    def __init__(self, token_bytes: Sequence[bytes]):
        pairs = sorted((b, i) for i, b in enumerate(token_bytes) if b)
        self.keys = [b for b, _ in pairs]
        self.ids = [i for _, i in pairs]

    def extending(self, prefix: bytes):
        """Ids of the tokens that start with ``prefix`` and are longer, in byte order."""
        keys = self.keys
        i = bisect.bisect_right(keys, prefix)
        n = len(keys)
        while i < n and keys[i].startswith(prefix):
            yield self.ids[i]
            i += 1


_INDEX: "weakref.WeakKeyDictionary[object, TokenIndex]" = weakref.WeakKeyDictionary()
_INDEX_LOCK = threading.Lock()


def token_index(tokenizer_info) -> TokenIndex:
    with _INDEX_LOCK:
        idx = _INDEX.get(tokenizer_info)
        if idx is None:
            idx = _INDEX[tokenizer_info] = TokenIndex(tokenizer_info.token_bytes)
        return idx


def forced_tokens(matcher: GrammarMatcher, encode: Callable[[str], list[int]], *, limit: int | None = None,
                  max_tokens_back: int = MAX_TOKENS_BACK) -> list[int]:
    """Canonical tokens for the bytes the grammar forces from ``matcher``'s state (not accepted:
    the caller accepts them). ``[]`` when nothing is forced or nothing can be forced safely."""
    if limit is not None and limit <= 0:
        return []
    forced = utf8_prefix(matcher.find_jump_forward_bytes())
    if not forced:
        return []
    info = matcher.tokenizer_info
    tb = info.token_bytes
    try:
        ids = encode(forced.decode("utf-8"))
    except Exception:  # a tokenizer that cannot encode this text: no fast-forward
        return []
    toks: list[int] = []
    acc = b""
    for t in ids:
        b = tb[t] if 0 <= t < len(tb) else b""
        if not b or not forced.startswith(acc + b, 0):
            break
        toks.append(t)
        acc += b
    if not toks:
        return []
    total = len(acc)
    start = total - sum(len(tb[t]) for t in toks[-max_tokens_back:]) if max_tokens_back > 0 else total
    cut = total
    if start < total:
        cut = _boundary(matcher, acc, start, token_index(info), tb)
    while toks and total > cut:
        total -= len(tb[toks.pop()])
    if limit is not None:
        toks = toks[:limit]
    return toks


def _boundary(matcher: GrammarMatcher, acc: bytes, start: int, index: TokenIndex, tb) -> int:
    """The first byte position in ``acc[start:]`` where an allowed token spans the end."""
    if not matcher.accept_string(acc):
        return start  # cannot happen for forced bytes; dropping the tail is safe
    try:
        # the bytes the grammar allows right after the forced ones: a cheap first filter
        allowed_first: dict[int, bool] = {}
        checks = 0
        for idx in range(start, len(acc)):
            suffix = acc[idx:]
            n = len(suffix)
            for tok in index.extending(suffix):
                extra = tb[tok][n:]
                ok = allowed_first.get(extra[0])
                if ok is None:
                    ok = allowed_first[extra[0]] = matcher.accept_string(extra[:1])
                    if ok:
                        matcher.rollback(1)
                if not ok:
                    continue
                checks += 1
                if checks > MAX_CANDIDATE_CHECKS:
                    return idx
                if len(extra) == 1 or matcher.accept_string(extra):
                    if len(extra) > 1:
                        matcher.rollback(1)
                    return idx
        return len(acc)
    finally:
        matcher.rollback(1)
