"""How a tokenizer's vocabulary strings encode bytes, and which tokens end a generation.

Shared by :class:`~grammask.grammar.tokenizer_info.TokenizerInfo` and the loaders of
:mod:`grammask.grammar.tokenizer_loaders` (it imports neither, so neither imports the other back).

``vocab_type`` says how the vocabulary strings of a model's tokens encode bytes: ``"byte_level"``
(GPT-2 byte-to-unicode map), ``"byte_fallback"`` (sentencepiece: ``▁`` is a space, ``<0xNN>`` one
byte) or ``"raw"`` (the strings are the text).
"""
from __future__ import annotations

import re
from typing import Any, Iterable, Mapping

from ..errors import TokenizerError

VOCAB_TYPES = ("byte_level", "byte_fallback", "raw")

# Names of tokens that end a generation, looked up when no stop ids are given.
STOP_TOKEN_NAMES = (
    "<|eot_id|>",
    "<|eom_id|>",
    "<|end_of_text|>",
    "<|im_end|>",
    "</s>",
    "<|endoftext|>",
    "<|end▁of▁sentence|>",
    "<｜end▁of▁sentence｜>",
    "<end_of_turn>",
    "<eos>",
    "<|eos|>",
    "<|end|>",
    "<|return|>",
)

_CONTROL_RE = re.compile(r"\A<[|｜].*[|｜]>\Z", re.S)
BYTE_TOKEN_RE = re.compile(r"\A<0x([0-9A-Fa-f]{2})>\Z")


# ---------------------------------------------------------------------------------------------- vocab decoding
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map of the 256 bytes to printable unicode characters."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


_B2U = bytes_to_unicode()
_U2B = {c: b for b, c in _B2U.items()}
_BL_TRANSLATE = str.maketrans({c: chr(b) for c, b in _U2B.items()})
_BL_INVALID = re.compile("[^" + "".join(re.escape(c) for c in _U2B) + "]")


def is_control_token(text: str) -> bool:
    """``<|...|>``-style (also DeepSeek's full-width ``<｜...｜>``) control token text."""
    return bool(_CONTROL_RE.match(text))


def decode_token(piece: str, vocab_type: str) -> bytes:
    """Bytes of one vocabulary string of a model (not added) token."""
    if vocab_type == "byte_level":
        if _BL_INVALID.search(piece):
            return piece.encode("utf-8")
        return piece.translate(_BL_TRANSLATE).encode("latin-1")
    if vocab_type == "byte_fallback":
        m = BYTE_TOKEN_RE.match(piece)
        if m:
            return bytes((int(m.group(1), 16),))
        return piece.replace("▁", " ").encode("utf-8")
    if vocab_type == "raw":
        return piece.encode("utf-8")
    raise TokenizerError(f"unknown vocab_type {vocab_type!r}; expected one of {VOCAB_TYPES}")


def guess_vocab_type(pieces: Iterable[str | None]) -> str:
    """Heuristic vocab type of vocabulary strings, for tokenizers without a decoder description."""
    n = n_byte_tok = n_meta = n_gpt2 = n_bl_ok = 0
    for p in pieces:
        if not isinstance(p, str) or not p:
            continue
        n += 1
        if BYTE_TOKEN_RE.match(p):
            n_byte_tok += 1
        if "▁" in p:
            n_meta += 1
        if "Ġ" in p or "Ċ" in p:
            n_gpt2 += 1
        if not _BL_INVALID.search(p):
            n_bl_ok += 1
    if n == 0:
        return "raw"
    if n_byte_tok >= 128 or n_meta > 0.01 * n:
        return "byte_fallback"
    if n_gpt2 > 0.01 * n and n_bl_ok > 0.95 * n:
        return "byte_level"
    return "raw"


# ---------------------------------------------------------------------------------------------- stop ids
def detect_stops(names: Mapping[str, int], eos_ids: Iterable[int]) -> list[int]:
    """Sorted stop ids: ``eos_ids`` and the ids of the special tokens in ``names`` (text -> id) whose
    text is one of :data:`STOP_TOKEN_NAMES`."""
    stops = {int(i) for i in eos_ids}
    for name in STOP_TOKEN_NAMES:
        if name in names:
            stops.add(int(names[name]))
    return sorted(stops)


def as_id_list(x: Any) -> list[int]:
    """Token ids out of an ``eos_token_id``-style value: ``None``, an int, a list of ints (``None``
    items skipped) or an array/tensor; ``[]`` for anything else."""
    if x is None:
        return []
    if isinstance(x, int):
        return [x]
    if hasattr(x, "tolist"):
        x = x.tolist()
    if isinstance(x, int):
        return [x]
    try:
        return [int(i) for i in x if i is not None]
    except TypeError:
        return []


__all__ = [
    "VOCAB_TYPES",
    "STOP_TOKEN_NAMES",
    "BYTE_TOKEN_RE",
    "as_id_list",
    "bytes_to_unicode",
    "decode_token",
    "detect_stops",
    "guess_vocab_type",
    "is_control_token",
]
