"""What the grammar engine needs to know about a tokenizer: the exact bytes of every token id.

:class:`TokenizerInfo` mirrors xgrammar's class of the same name. It turns a vocabulary (Hugging Face
``tokenizers``/``transformers`` tokenizers, ``tokenizer.json`` files, tiktoken BPE files, GGUF files or
plain byte lists) into

``token_bytes``       list[bytes] of length ``vocab_size``; ``b""`` for special, padded and unused ids
``special_token_ids`` sorted ids that never take part in grammar matching (they are not in the trie)
``stop_token_ids``    ids the matcher allows exactly when the grammar can end (also special)
``vocab_type``        how the vocabulary strings encode bytes: ``"byte_level"`` (GPT-2 byte-to-unicode
                      map), ``"byte_fallback"`` (sentencepiece: ``▁`` is a space, ``<0xNN>`` one byte)
                      or ``"raw"`` (the strings are the text, or bytes were given)
``add_prefix_space``  the tokenizer prepends a space to the text it encodes (sentencepiece's ``▁``)
``trie``              the :class:`~grammask.grammar.toktrie.TokTrie` of the non-special tokens
``disk_cache``        where the trie and the slice forest are cached between processes:
                      ``None`` (default: grammask's cache folder unless ``GRAMMASK_DISK_CACHE=0``),
                      ``False`` (never), ``True`` (always) or a cache folder (see
                      :mod:`grammask.grammar.tokenizer_cache`)

Special tokens are the added tokens marked special, added tokens that look like control tokens
(``<|...|>``, ``<｜...｜>``), the tokenizer's declared special ids and its unknown token, and the
stop tokens. Other (non-special) added tokens are plain text and keep their content's UTF-8 bytes.

Reading each kind of tokenizer is the job of :mod:`grammask.grammar.tokenizer_loaders` (the ``from_*``
constructors call them); decoding vocabulary strings is :mod:`grammask.grammar.vocab`, whose public
helpers (and ``read_gguf_metadata``) this module re-exports.
"""
from __future__ import annotations

import hashlib
import json
import os
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from ..errors import TokenizerError
from .tokenizer_loaders import backend_of, load_gguf, load_huggingface, load_tiktoken, read_gguf_metadata
from .tokenizer_loaders.fields import info_fields
from .toktrie import TokTrie
from .vocab import (
    STOP_TOKEN_NAMES,
    VOCAB_TYPES,
    bytes_to_unicode,
    decode_token,
    detect_stops,
    guess_vocab_type,
    is_control_token,
)

_SAVE_FORMAT = "grammask-tokenizer-info-1"


# ---------------------------------------------------------------------------------------------- TokenizerInfo
class TokenizerInfo:
    """Byte-exact view of a tokenizer's vocabulary for grammar matching (see module docstring)."""

    def __init__(
        self,
        token_bytes: Sequence[bytes | None],
        *,
        vocab_size: int | None = None,
        stop_token_ids: Iterable[int] = (),
        special_token_ids: Iterable[int] = (),
        vocab_type: str = "raw",
        add_prefix_space: bool = False,
        hf_tokenizer: Any = None,
        encode_fn: Callable[[str], list[int]] | None = None,
        special_token_text: Mapping[int, str] | None = None,
        trie: TokTrie | None = None,
        disk_cache: bool | str | os.PathLike | None = None,
        _strict_stops: bool = True,
    ):
        if vocab_type not in VOCAB_TYPES:
            raise TokenizerError(f"unknown vocab_type {vocab_type!r}; expected one of {VOCAB_TYPES}")
        tb: list[bytes] = list(token_bytes)
        if not all([type(b) is bytes for b in tb]):
            for i, b in enumerate(tb):
                if b is None:
                    tb[i] = b""
                elif isinstance(b, (bytes, bytearray, memoryview)):
                    tb[i] = bytes(b)
                else:
                    raise TokenizerError(f"token {i}: expected bytes, got {type(b).__name__}")
        specials = {int(i) for i in special_token_ids}
        stops = sorted({int(i) for i in stop_token_ids})
        n = len(tb)
        if vocab_size is None:
            vocab_size = max([n] + [i + 1 for i in specials])
        vocab_size = int(vocab_size)
        if vocab_size <= 0:
            raise TokenizerError(f"vocab_size must be positive, got {vocab_size}")
        if vocab_size < n:
            dropped = [i for i in range(vocab_size, n) if tb[i] and i not in specials]
            if dropped:
                raise TokenizerError(
                    f"vocab_size {vocab_size} is smaller than the tokenizer's vocabulary "
                    f"({n} ids; {len(dropped)} text tokens would be dropped, e.g. id {dropped[0]})"
                )
            tb = tb[:vocab_size]
        elif vocab_size > n:
            tb.extend([b""] * (vocab_size - n))
        bad = [i for i in stops if not 0 <= i < vocab_size]
        if bad:
            if _strict_stops:
                raise TokenizerError(f"stop token ids {bad} out of range for vocab_size {vocab_size}")
            stops = [i for i in stops if 0 <= i < vocab_size]
        specials = {i for i in specials if 0 <= i < vocab_size}
        specials.update(stops)
        for i in specials:
            tb[i] = b""
        specials.update(i for i, b in enumerate(tb) if not b)

        self.vocab_size: int = vocab_size
        self.token_bytes: list[bytes] = tb
        self.special_token_ids: list[int] = sorted(specials)
        self.stop_token_ids: list[int] = stops
        self.vocab_type: str = vocab_type
        self.add_prefix_space: bool = bool(add_prefix_space)
        self.hf_tokenizer = hf_tokenizer
        self.special_token_text: dict[int, str] = {
            int(i): str(t) for i, t in (special_token_text or {}).items() if 0 <= int(i) < vocab_size
        }
        self._encode_fn = encode_fn
        self._trie = trie
        self.disk_cache = disk_cache
        self._cache_key: str | None = None
        self._special_mask: np.ndarray | None = None

    # ------------------------------------------------------------------ xgrammar-style aliases
    @property
    def decoded_vocab(self) -> list[bytes]:
        return self.token_bytes

    @property
    def prepend_space_in_tokenization(self) -> bool:
        return self.add_prefix_space

    def __len__(self) -> int:
        return self.vocab_size

    def __repr__(self) -> str:
        return (
            f"TokenizerInfo(vocab_size={self.vocab_size}, vocab_type={self.vocab_type!r}, "
            f"add_prefix_space={self.add_prefix_space}, n_special={len(self.special_token_ids)}, "
            f"stop_token_ids={self.stop_token_ids})"
        )

    # ------------------------------------------------------------------ derived data
    @property
    def trie(self) -> TokTrie:
        """Trie of every non-special token (built on first use, once; or loaded from the disk cache)."""
        if self._trie is None:
            from .tokenizer_cache import cached_trie

            self._trie = cached_trie(self)
        return self._trie

    def token_bytes_flat(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every token's bytes in one array, token ``t`` being ``data[off[t]:off[t + 1]]``, and
        each token's rank in byte order (built once, kept here)."""
        hit = self.__dict__.get("_bytes_flat")
        if hit is None:
            tb = self.token_bytes
            off = np.zeros(len(tb) + 1, np.int64)
            np.cumsum([len(b) for b in tb], out=off[1:])
            rank = np.empty(len(tb), np.int64)
            rank[sorted(range(len(tb)), key=tb.__getitem__)] = np.arange(len(tb))
            hit = self._bytes_flat = (np.frombuffer(b"".join(tb), np.uint8), off, rank)
        return hit

    def token_by_rank(self) -> np.ndarray:
        """The token ids in byte order: ``by_rank[rank[t]] == t`` (:meth:`token_bytes_flat`)."""
        hit = self.__dict__.get("_by_rank")
        if hit is None:
            hit = self._by_rank = np.argsort(self.token_bytes_flat()[2]).astype(np.int64)
        return hit

    @property
    def special_mask(self) -> np.ndarray:
        """bool[vocab_size], True for the special (never grammar-matched) ids."""
        if self._special_mask is None:
            m = np.zeros(self.vocab_size, dtype=bool)
            m[self.special_token_ids] = True
            self._special_mask = m
        return self._special_mask

    @property
    def cache_key(self) -> str:
        """Stable hex digest of the vocabulary bytes, special and stop ids and vocab_size."""
        if self._cache_key is None:
            h = hashlib.sha256()
            h.update(f"{_SAVE_FORMAT}|{self.vocab_size}|".encode())
            lens = np.fromiter((len(b) for b in self.token_bytes), dtype="<i8", count=self.vocab_size)
            h.update(lens.tobytes())
            h.update(b"".join(self.token_bytes))
            h.update(np.asarray(self.special_token_ids, dtype="<i8").tobytes())
            h.update(b"|stop|")
            h.update(np.asarray(self.stop_token_ids, dtype="<i8").tobytes())
            self._cache_key = h.hexdigest()
        return self._cache_key

    def is_special(self, token_id: int) -> bool:
        return bool(self.special_mask[token_id])

    # ------------------------------------------------------------------ text helpers
    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (no BOS/EOS added); needs the tokenizer this info was built from."""
        if self._encode_fn is None:
            raise TokenizerError("this TokenizerInfo was built without a tokenizer; encode() is unavailable")
        return [int(i) for i in self._encode_fn(text)]

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> bytes:
        """Exact bytes of ``ids`` (special tokens contribute their text only when not skipped)."""
        tb, out = self.token_bytes, []
        for i in ids:
            i = int(i)
            if not 0 <= i < self.vocab_size:
                raise TokenizerError(f"token id {i} out of range for vocab_size {self.vocab_size}")
            b = tb[i]
            if not b and not skip_special_tokens:
                b = self.special_token_text.get(i, "").encode("utf-8")
            out.append(b)
        return b"".join(out)

    # ------------------------------------------------------------------ constructors
    @classmethod
    def from_vocab(
        cls,
        token_bytes: Sequence[bytes | str | None],
        *,
        vocab_size: int | None = None,
        stop_token_ids: Iterable[int] | None = None,
        special_token_ids: Iterable[int] = (),
        vocab_type: str = "raw",
        add_prefix_space: bool = False,
        disk_cache: bool | str | os.PathLike | None = None,
    ) -> "TokenizerInfo":
        """From a list indexed by token id: bytes are taken as they are; strings are vocabulary strings
        decoded per ``vocab_type``; ``None``/``b""`` mark unused ids. Without ``stop_token_ids`` the stop
        tokens are looked up by name among the special string tokens."""
        special = {int(i) for i in special_token_ids}
        tb: list[bytes] = []
        names: dict[str, int] = {}
        texts: dict[int, str] = {}
        for i, t in enumerate(token_bytes):
            if t is None:
                tb.append(b"")
            elif isinstance(t, str):
                if i in special:
                    names.setdefault(t, i)
                    texts[i] = t
                    tb.append(b"")
                else:
                    tb.append(decode_token(t, vocab_type))
            elif isinstance(t, (bytes, bytearray, memoryview)):
                tb.append(bytes(t))
            else:
                raise TokenizerError(f"token {i}: expected bytes or str, got {type(t).__name__}")
        return cls(**info_fields(tb, special_token_ids=special, special_token_text=texts, vocab_type=vocab_type,
                                 add_prefix_space=add_prefix_space, hf_tokenizer=None, encode_fn=None,
                                 vocab_size=vocab_size, stop_token_ids=stop_token_ids,
                                 find_stops=lambda: detect_stops(names, ())), disk_cache=disk_cache)

    @classmethod
    def from_huggingface(
        cls,
        tokenizer: Any,
        vocab_size: int | None = None,
        stop_token_ids: Iterable[int] | int | None = None,
        *,
        disk_cache: bool | str | os.PathLike | None = None,
    ) -> "TokenizerInfo":
        """From a ``tokenizers.Tokenizer``, a ``transformers`` tokenizer, or a path to ``tokenizer.json``
        (or to a folder holding one; its ``tokenizer_config.json``/``generation_config.json`` give the EOS)."""
        return cls(**load_huggingface(tokenizer, vocab_size, stop_token_ids), disk_cache=disk_cache)

    @classmethod
    def from_tiktoken(
        cls,
        source: Any,
        special_tokens: Mapping[str, int] | None = None,
        *,
        vocab_size: int | None = None,
        stop_token_ids: Iterable[int] | int | None = None,
        pat_str: str | None = None,
        disk_cache: bool | str | os.PathLike | None = None,
    ) -> "TokenizerInfo":
        """From a tiktoken BPE file (lines ``base64(token) rank``) or a ``tiktoken.Encoding``.

        ``special_tokens`` maps special token text to ids (read from the Encoding when one is given).
        With a file, giving ``pat_str`` (and having ``tiktoken`` installed) enables :meth:`encode`."""
        return cls(**load_tiktoken(
            source, special_tokens, vocab_size=vocab_size, stop_token_ids=stop_token_ids, pat_str=pat_str
        ), disk_cache=disk_cache)

    @classmethod
    def from_gguf(
        cls,
        path: str | os.PathLike,
        *,
        vocab_size: int | None = None,
        stop_token_ids: Iterable[int] | int | None = None,
        disk_cache: bool | str | os.PathLike | None = None,
    ) -> "TokenizerInfo":
        """From the tokenizer metadata of a GGUF model file (``tokenizer.ggml.*``); reads only the header."""
        return cls(**load_gguf(path, vocab_size=vocab_size, stop_token_ids=stop_token_ids), disk_cache=disk_cache)

    # ------------------------------------------------------------------ persistence
    def save(self, path: str | os.PathLike, include_tokenizer: bool = False) -> None:
        """Write an ``.npz`` with the token bytes, metadata and trie arrays (loading skips the trie build).

        With ``include_tokenizer`` a ``tokenizers`` backend is stored too, so :meth:`encode` works after
        :meth:`load`."""
        lens = np.fromiter((len(b) for b in self.token_bytes), dtype=np.int64, count=self.vocab_size)
        offsets = np.zeros(self.vocab_size + 1, dtype=np.int64)
        np.cumsum(lens, out=offsets[1:])
        meta = {
            "format": _SAVE_FORMAT,
            "vocab_size": self.vocab_size,
            "vocab_type": self.vocab_type,
            "add_prefix_space": self.add_prefix_space,
            "stop_token_ids": self.stop_token_ids,
            "special_token_ids": self.special_token_ids,
            "special_token_text": {str(k): v for k, v in self.special_token_text.items()},
            "cache_key": self.cache_key,
        }
        arrays = {
            "meta": np.array(json.dumps(meta)),
            "token_data": np.frombuffer(b"".join(self.token_bytes), dtype=np.uint8),
            "token_offsets": offsets,
        }
        arrays.update({f"trie_{k}": v for k, v in self.trie.to_arrays().items()})
        if include_tokenizer:
            backend = backend_of(self.hf_tokenizer)
            if backend is not None:
                arrays["tokenizer_json"] = np.array(backend.to_str())
        try:
            with open(path, "wb") as f:
                np.savez(f, **arrays)
        except OSError as e:
            raise TokenizerError(f"cannot write {path}: {e}") from None

    @classmethod
    def load(cls, path: str | os.PathLike, *, disk_cache: bool | str | os.PathLike | None = None) -> "TokenizerInfo":
        """A :class:`TokenizerInfo` written by :meth:`save` (trie included: nothing is rebuilt)."""
        try:
            with np.load(path, allow_pickle=False) as z:
                meta = json.loads(str(z["meta"]))
                if meta.get("format") != _SAVE_FORMAT:
                    raise TokenizerError(f"{path}: unknown format {meta.get('format')!r}")
                data = z["token_data"].tobytes()
                offsets = z["token_offsets"].tolist()
                trie_arrays = {k[5:]: z[k] for k in z.files if k.startswith("trie_")}
                tok_json = str(z["tokenizer_json"]) if "tokenizer_json" in z.files else None
        except TokenizerError:
            raise
        except (OSError, KeyError, ValueError) as e:
            raise TokenizerError(f"cannot load tokenizer info from {path}: {e}") from None
        vocab_size = int(meta["vocab_size"])
        if len(offsets) != vocab_size + 1:
            raise TokenizerError(f"{path}: token offsets do not match vocab_size")
        tb = [data[offsets[i] : offsets[i + 1]] for i in range(vocab_size)]
        trie = TokTrie.from_arrays(trie_arrays, token_bytes=tb)
        hf = encode_fn = None
        if tok_json is not None:
            try:
                from tokenizers import Tokenizer

                hf = Tokenizer.from_str(tok_json)
                encode_fn = lambda t: hf.encode(t, add_special_tokens=False).ids  # noqa: E731
            except Exception:
                hf = encode_fn = None
        info = cls(
            tb,
            vocab_size=vocab_size,
            stop_token_ids=meta["stop_token_ids"],
            special_token_ids=meta["special_token_ids"],
            vocab_type=meta["vocab_type"],
            add_prefix_space=meta["add_prefix_space"],
            hf_tokenizer=hf,
            encode_fn=encode_fn,
            special_token_text={int(k): v for k, v in meta.get("special_token_text", {}).items()},
            trie=trie,
            disk_cache=disk_cache,
        )
        if meta.get("cache_key") and info.cache_key != meta["cache_key"]:
            raise TokenizerError(f"{path}: cache key mismatch (corrupt file?)")
        return info


__all__ = [
    "TokenizerInfo",
    "VOCAB_TYPES",
    "STOP_TOKEN_NAMES",
    "bytes_to_unicode",
    "decode_token",
    "guess_vocab_type",
    "is_control_token",
    "read_gguf_metadata",
]
