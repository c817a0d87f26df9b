"""A GGUF model file's tokenizer (``tokenizer.ggml.*`` metadata) as :class:`TokenizerInfo` fields.

Only the header is read (:mod:`.gguf_reader`). For byte-level BPE models (``tokenizer.ggml.model``
``gpt2``) a ``tokenizers`` BPE is rebuilt from the vocabulary and merges, so ``encode()`` works.
"""
from __future__ import annotations

import os
from typing import Any, Iterable

from ...errors import TokenizerError
from ..vocab import BYTE_TOKEN_RE, decode_token, detect_stops, guess_vocab_type, is_control_token
from .fields import info_fields
from .gguf_reader import read_gguf_metadata


def load_gguf(
    path: str | os.PathLike,
    *,
    vocab_size: int | None = None,
    stop_token_ids: Iterable[int] | int | None = None,
) -> dict[str, Any]:
    """Keyword arguments of :class:`~grammask.grammar.tokenizer_info.TokenizerInfo` for the tokenizer
    of a GGUF file (see :meth:`TokenizerInfo.from_gguf`)."""
    if isinstance(stop_token_ids, int):
        stop_token_ids = [stop_token_ids]
    meta = read_gguf_metadata(path)
    tokens = meta.get("tokenizer.ggml.tokens")
    if not tokens:
        raise TokenizerError(f"{path} has no tokenizer.ggml.tokens")
    types = meta.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    model = meta.get("tokenizer.ggml.model", "")
    vt = {"gpt2": "byte_level", "llama": "byte_fallback", "t5": "byte_fallback"}.get(model)
    if vt is None:
        vt = guess_vocab_type(t for t, ty in zip(tokens, types) if ty == 1)
    # llama.cpp token types: 1 normal, 2 unknown, 3 control, 4 user defined, 5 unused, 6 byte
    tb: list[bytes] = [b""] * len(tokens)
    special: set[int] = set()
    texts: dict[int, str] = {}
    for i, (t, ty) in enumerate(zip(tokens, types)):
        if ty in (2, 3, 5) or (ty == 4 and is_control_token(t)):
            special.add(i)
            texts[i] = t
        elif ty == 4:
            tb[i] = t.encode("utf-8", errors="surrogateescape")
        elif ty == 6:
            m = BYTE_TOKEN_RE.match(t)
            tb[i] = bytes((int(m.group(1), 16),)) if m else decode_token(t, vt)
        else:
            tb[i] = decode_token(t, vt)
    aps = meta.get("tokenizer.ggml.add_space_prefix")
    if aps is None:
        aps = model == "llama"
    backend = _gguf_bpe_backend(meta) if model == "gpt2" else None
    encode_fn = (lambda s: backend.encode(s, add_special_tokens=False).ids) if backend is not None else None

    def find_stops():
        eos = [
            int(meta[k])
            for k in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id")
            if isinstance(meta.get(k), int) and 0 <= meta[k] < len(tokens)
        ]
        return detect_stops({t: i for i, t in texts.items()}, eos)

    return info_fields(tb, special_token_ids=special, special_token_text=texts, vocab_type=vt,
                       add_prefix_space=bool(aps), hf_tokenizer=backend, encode_fn=encode_fn,
                       vocab_size=vocab_size, stop_token_ids=stop_token_ids, find_stops=find_stops)


def _gguf_bpe_backend(meta: dict):
    """A ``tokenizers`` byte-level BPE rebuilt from a GGUF's vocabulary and merges (for encode()).

    The pre-tokenizer follows ``tokenizer.ggml.pre`` where we know it (``smollm``: digits split one
    by one, as in SmolLM2's tokenizer.json), else GPT-2's."""
    merges = meta.get("tokenizer.ggml.merges")
    tokens = meta.get("tokenizer.ggml.tokens")
    if not merges or not tokens:
        return None
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    vocab = {t: i for i, t in enumerate(tokens)}
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    tok = Tokenizer(models.BPE(vocab, pairs))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if meta.get("tokenizer.ggml.pre") == "smollm":
        tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    else:
        tok.pre_tokenizer = byte_level
    tok.decoder = decoders.ByteLevel()
    types = meta.get("tokenizer.ggml.token_type") or []
    specials = [t for t, ty in zip(tokens, types) if ty in (3, 4)]
    if specials:
        tok.add_special_tokens([AddedToken(t, special=True) for t in specials])
    return tok


__all__ = ["load_gguf"]
