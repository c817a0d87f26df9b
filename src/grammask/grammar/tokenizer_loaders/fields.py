"""What every loader returns: the keyword arguments of :class:`TokenizerInfo`, stop ids resolved."""
from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping


def info_fields(
    token_bytes: list[bytes],
    *,
    vocab_size: int | None,
    stop_token_ids: Iterable[int] | None,
    find_stops: Callable[[], list[int]],
    special_token_ids: Iterable[int],
    vocab_type: str,
    add_prefix_space: bool,
    special_token_text: Mapping[int, str],
    hf_tokenizer: Any,
    encode_fn: Callable[[str], list[int]] | None,
) -> dict[str, Any]:
    """Keyword arguments of :class:`~grammask.grammar.tokenizer_info.TokenizerInfo`.

    Stop ids the caller gave are kept as given, and one out of range is an error; without them,
    ``find_stops()`` detects them (called only then) and those out of range are dropped."""
    if stop_token_ids is not None:
        stops, strict = [int(i) for i in stop_token_ids], True
    else:
        stops, strict = find_stops(), False
    return dict(token_bytes=token_bytes, vocab_size=vocab_size, stop_token_ids=stops,
                special_token_ids=special_token_ids, vocab_type=vocab_type, add_prefix_space=add_prefix_space,
                hf_tokenizer=hf_tokenizer, encode_fn=encode_fn, special_token_text=special_token_text,
                _strict_stops=strict)

__all__ = ["info_fields"]
