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

Special tokens are the added tokens marked special, added tokens that look like control tokens
(``<|...|>``, ``<｜...｜>``), the tokenizer's declared special ids and its unknown token, and the
stop tokens. Other (non-special) added tokens are plain text and keep their content's UTF-8 bytes.
"""
from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import struct
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from ..errors import TokenizerError
from .toktrie import TokTrie

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
_BYTE_TOKEN_RE = re.compile(r"\A<0x([0-9A-Fa-f]{2})>\Z")
_SAVE_FORMAT = "grammask-tokenizer-info-1"


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
        m = _BYTE_TOKEN_RE.match(piece)
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
        if _BYTE_TOKEN_RE.match(p):
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


def _walk(node: Any):
    """Every component of a tokenizer.json normalizer/pre-tokenizer/decoder (Sequences flattened)."""
    if isinstance(node, dict):
        yield node
        for key in ("decoders", "pretokenizers", "normalizers", "processors"):
            for sub in node.get(key) or ():
                yield from _walk(sub)
    elif isinstance(node, list):
        for sub in node:
            yield from _walk(sub)


def _vocab_type_from_config(cfg: Mapping[str, Any]) -> tuple[str | None, bool | None]:
    """``(vocab_type, add_prefix_space)`` read from a tokenizer.json; ``None`` where it does not say."""
    model = cfg.get("model") or {}
    dec = list(_walk(cfg.get("decoder")))
    pre = list(_walk(cfg.get("pre_tokenizer")))
    norm = list(_walk(cfg.get("normalizer")))
    dec_types = {d.get("type") for d in dec}

    def replaces_metaspace(d):
        pat = d.get("pattern")
        return d.get("type") == "Replace" and isinstance(pat, dict) and pat.get("String") == "▁"

    vt = None
    if "ByteLevel" in dec_types:
        vt = "byte_level"
    elif "ByteFallback" in dec_types or "Metaspace" in dec_types or any(replaces_metaspace(d) for d in dec):
        vt = "byte_fallback"
    elif any(p.get("type") == "ByteLevel" for p in pre):
        vt = "byte_level"
    elif model.get("byte_fallback") or any(p.get("type") == "Metaspace" for p in pre):
        vt = "byte_fallback"

    aps = None
    for n in norm:
        if n.get("type") == "Prepend" and n.get("prepend") == "▁":
            aps = True
    for p in pre:
        if p.get("type") == "Metaspace":
            scheme = p.get("prepend_scheme")
            aps = bool(aps) or (scheme in ("always", "first") if scheme is not None else bool(p.get("add_prefix_space", True)))
        elif p.get("type") == "ByteLevel" and p.get("add_prefix_space"):
            aps = True
    return vt, aps


def _load_json(path: Path) -> Any:
    try:
        with open(path, "r", encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _token_content(tok: Any) -> str | None:
    if isinstance(tok, str):
        return tok
    if isinstance(tok, dict):
        c = tok.get("content")
        return c if isinstance(c, str) else None
    return getattr(tok, "content", None)


# ---------------------------------------------------------------------------------------------- GGUF metadata
_GGUF_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


def read_gguf_metadata(path: str | os.PathLike, prefix: str = "tokenizer.") -> dict[str, Any]:
    """Key/value metadata of a GGUF file (only keys starting with ``prefix``), without the tensors.

    Reads just the header, so it is fast even for large model files (unlike ``gguf.GGUFReader``).
    """
    try:
        f = open(path, "rb")
    except OSError as e:
        raise TokenizerError(f"cannot open GGUF file {path}: {e}") from None
    with f:
        def read(fmt):
            size = struct.calcsize(fmt)
            data = f.read(size)
            if len(data) != size:
                raise TokenizerError(f"truncated GGUF file {path}")
            return struct.unpack(fmt, data)[0]

        def read_str():
            n = read("<Q")
            data = f.read(n)
            if len(data) != n:
                raise TokenizerError(f"truncated GGUF file {path}")
            return data.decode("utf-8", errors="surrogateescape")

        def read_value(vtype, keep):
            if vtype == 8:
                return read_str()
            if vtype == 9:
                etype, count = read("<I"), read("<Q")
                if etype == 8:
                    if not keep:
                        for _ in range(count):
                            f.seek(read("<Q"), 1)
                        return None
                    return [read_str() for _ in range(count)]
                if etype in _GGUF_SCALARS:
                    fmt = _GGUF_SCALARS[etype]
                    size = struct.calcsize(fmt)
                    data = f.read(size * count)
                    if len(data) != size * count:
                        raise TokenizerError(f"truncated GGUF file {path}")
                    return np.frombuffer(data, dtype=np.dtype(fmt)).tolist() if keep else None
                return [read_value(etype, keep) for _ in range(count)]
            if vtype in _GGUF_SCALARS:
                return read(_GGUF_SCALARS[vtype])
            raise TokenizerError(f"unknown GGUF value type {vtype} in {path}")

        if f.read(4) != b"GGUF":
            raise TokenizerError(f"{path} is not a GGUF file")
        version = read("<I")
        if version < 2:
            raise TokenizerError(f"GGUF version {version} of {path} is not supported")
        read("<Q")  # tensor count
        n_kv = read("<Q")
        out: dict[str, Any] = {}
        for _ in range(n_kv):
            key = read_str()
            keep = key.startswith(prefix)
            value = read_value(read("<I"), keep)
            if keep:
                out[key] = value
        return out


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
        """Trie of every non-special token (built on first use, once)."""
        if self._trie is None:
            self._trie = TokTrie.build(self.token_bytes)
        return self._trie

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
        stops = list(stop_token_ids) if stop_token_ids is not None else _detect_stops(names, ())
        return cls(
            tb,
            vocab_size=vocab_size,
            stop_token_ids=stops,
            special_token_ids=special,
            vocab_type=vocab_type,
            add_prefix_space=add_prefix_space,
            special_token_text=texts,
            _strict_stops=stop_token_ids is not None,
        )

    @classmethod
    def from_huggingface(
        cls,
        tokenizer: Any,
        vocab_size: int | None = None,
        stop_token_ids: Iterable[int] | int | None = None,
    ) -> "TokenizerInfo":
        """From a ``tokenizers.Tokenizer``, a ``transformers`` tokenizer, or a path to ``tokenizer.json``
        (or to a folder holding one; its ``tokenizer_config.json``/``generation_config.json`` give the EOS)."""
        if isinstance(stop_token_ids, int):
            stop_token_ids = [stop_token_ids]
        if isinstance(tokenizer, (str, os.PathLike)):
            path = Path(tokenizer)
            if path.is_dir():
                path = path / "tokenizer.json"
            if not path.is_file():
                raise TokenizerError(f"no tokenizer.json at {tokenizer}")
            if path.suffix == ".gguf":
                return cls.from_gguf(path, vocab_size=vocab_size, stop_token_ids=stop_token_ids)
            if path.suffix == ".tiktoken":
                return cls.from_tiktoken(path, vocab_size=vocab_size, stop_token_ids=stop_token_ids)
            try:
                from tokenizers import Tokenizer
            except ImportError as e:  # pragma: no cover - tokenizers is a dependency
                raise TokenizerError("the 'tokenizers' package is needed to read tokenizer.json") from e
            try:
                backend = Tokenizer.from_file(str(path))
            except Exception as e:
                raise TokenizerError(f"cannot read {path}: {e}") from None
            eos = _eos_from_folder(path.parent, backend)
            return cls._from_backend(
                backend,
                hf_tokenizer=backend,
                encode_fn=lambda t: backend.encode(t, add_special_tokens=False).ids,
                eos_ids=eos,
                extra_special=(),
                vocab_size=vocab_size,
                stop_token_ids=stop_token_ids,
            )
        try:
            from tokenizers import Tokenizer
        except ImportError:  # pragma: no cover
            Tokenizer = ()  # type: ignore[assignment]
        if Tokenizer and isinstance(tokenizer, Tokenizer):
            return cls._from_backend(
                tokenizer,
                hf_tokenizer=tokenizer,
                encode_fn=lambda t: tokenizer.encode(t, add_special_tokens=False).ids,
                eos_ids=(),
                extra_special=(),
                vocab_size=vocab_size,
                stop_token_ids=stop_token_ids,
            )
        if _is_tiktoken_encoding(tokenizer):
            return cls.from_tiktoken(tokenizer, vocab_size=vocab_size, stop_token_ids=stop_token_ids)
        if hasattr(tokenizer, "get_vocab") and hasattr(tokenizer, "convert_ids_to_tokens"):
            eos = _as_id_list(getattr(tokenizer, "eos_token_id", None))
            extra = set(_as_id_list(getattr(tokenizer, "all_special_ids", None)))

            def encode_fn(t):
                return tokenizer.encode(t, add_special_tokens=False)

            backend = getattr(tokenizer, "backend_tokenizer", None)
            if backend is not None and hasattr(backend, "to_str"):
                return cls._from_backend(
                    backend,
                    hf_tokenizer=tokenizer,
                    encode_fn=encode_fn,
                    eos_ids=eos,
                    extra_special=extra,
                    vocab_size=vocab_size,
                    stop_token_ids=stop_token_ids,
                )
            return cls._from_slow(tokenizer, encode_fn, eos, extra, vocab_size, stop_token_ids)
        raise TokenizerError(f"unsupported tokenizer object of type {type(tokenizer).__name__}")

    @classmethod
    def _from_backend(cls, backend, *, hf_tokenizer, encode_fn, eos_ids, extra_special, vocab_size, stop_token_ids):
        cfg = _backend_config(backend)
        vocab: dict[str, int] = backend.get_vocab(with_added_tokens=True)
        model = cfg.get("model") or {}
        added = {int(a["id"]): a for a in cfg.get("added_tokens") or () if "id" in a and "content" in a}
        n = max([max(vocab.values(), default=-1) + 1] + [i + 1 for i in added])
        pieces: list[str | None] = [None] * n
        for s, i in vocab.items():
            pieces[i] = s
        vt, aps = _vocab_type_from_config(cfg)
        if vt is None:
            vt = guess_vocab_type(p for i, p in enumerate(pieces) if i not in added)

        special: set[int] = {int(i) for i in extra_special if 0 <= int(i) < n}
        texts: dict[int, str] = {}
        tb: list[bytes] = [b""] * n
        for i, p in enumerate(pieces):
            if p is None:
                continue
            a = added.get(i)
            if a is not None:
                content = a["content"]
                if a.get("special") or is_control_token(content) or i in special:
                    special.add(i)
                    texts[i] = content
                else:
                    tb[i] = content.encode("utf-8")
            elif i in special:
                texts[i] = p
            else:
                tb[i] = decode_token(p, vt)
        unk = model.get("unk_token")
        if isinstance(unk, str) and unk in vocab:
            special.add(vocab[unk])
            texts.setdefault(vocab[unk], unk)
        elif isinstance(model.get("unk_id"), int) and 0 <= model["unk_id"] < n:  # Unigram
            special.add(model["unk_id"])
        for i in special:
            tb[i] = b""
        names = {t: i for i, t in texts.items()}
        return cls._finish(tb, vt, aps, special, texts, names, eos_ids, hf_tokenizer, encode_fn, vocab_size, stop_token_ids)

    @classmethod
    def _from_slow(cls, tok, encode_fn, eos_ids, extra_special, vocab_size, stop_token_ids):
        try:
            vocab = dict(tok.get_vocab())
        except Exception as e:
            raise TokenizerError(f"cannot read the tokenizer's vocabulary: {e}") from None
        n = max(vocab.values(), default=-1) + 1
        try:
            n = max(n, len(tok))
        except TypeError:
            pass
        pieces = list(tok.convert_ids_to_tokens(list(range(n))))
        added_dec = getattr(tok, "added_tokens_decoder", None) or {}
        added = {int(i): a for i, a in dict(added_dec).items()}
        vt = guess_vocab_type(p for i, p in enumerate(pieces) if i not in added and isinstance(p, str))
        special = {int(i) for i in extra_special if 0 <= int(i) < n}
        texts: dict[int, str] = {}
        tb: list[bytes] = [b""] * n
        for i, p in enumerate(pieces):
            if p is None:
                continue
            if isinstance(p, (bytes, bytearray)):
                if i in special:
                    texts[i] = bytes(p).decode("utf-8", "replace")
                else:
                    tb[i] = bytes(p)
                continue
            a = added.get(i)
            if a is not None:
                content = _token_content(a) or p
                if getattr(a, "special", False) or is_control_token(content) or i in special:
                    special.add(i)
                    texts[i] = content
                else:
                    tb[i] = content.encode("utf-8")
            elif i in special:
                texts[i] = p
            else:
                tb[i] = decode_token(p, vt)
        unk = getattr(tok, "unk_token_id", None)
        if isinstance(unk, int) and 0 <= unk < n:
            special.add(unk)
        for i in special:
            tb[i] = b""
        names = {t: i for i, t in texts.items()}
        return cls._finish(tb, vt, None, special, texts, names, eos_ids, tok, encode_fn, vocab_size, stop_token_ids)

    @classmethod
    def _finish(cls, tb, vt, aps, special, texts, names, eos_ids, hf_tokenizer, encode_fn, vocab_size, stop_token_ids):
        if encode_fn is not None:  # what the tokenizer actually does beats what its config suggests
            try:
                probe = b"".join(tb[i] for i in encode_fn("a") if 0 <= i < len(tb))
                if probe.endswith(b"a") and len(probe) > 1 and probe[:-1].strip(b" ") == b"":
                    aps = True
                elif probe == b"a":
                    aps = False
            except Exception:
                pass
        if stop_token_ids is not None:
            stops, strict = [int(i) for i in stop_token_ids], True
        else:
            stops, strict = _detect_stops(names, eos_ids), False
        return cls(
            tb,
            vocab_size=vocab_size,
            stop_token_ids=stops,
            special_token_ids=special,
            vocab_type=vt,
            add_prefix_space=bool(aps),
            hf_tokenizer=hf_tokenizer,
            encode_fn=encode_fn,
            special_token_text=texts,
            _strict_stops=strict,
        )

    @classmethod
    def from_tiktoken(
        cls,
        source: Any,
        special_tokens: Mapping[str, int] | None = None,
        *,
        vocab_size: int | None = None,
        stop_token_ids: Iterable[int] | int | None = None,
        pat_str: str | None = None,
    ) -> "TokenizerInfo":
        """From a tiktoken BPE file (lines ``base64(token) rank``) or a ``tiktoken.Encoding``.

        ``special_tokens`` maps special token text to ids (read from the Encoding when one is given).
        With a file, giving ``pat_str`` (and having ``tiktoken`` installed) enables :meth:`encode`."""
        if isinstance(stop_token_ids, int):
            stop_token_ids = [stop_token_ids]
        encode_fn = None
        hf = None
        if _is_tiktoken_encoding(source):
            enc = source
            specials = dict(getattr(enc, "_special_tokens", None) or {})
            if not specials:
                for name in getattr(enc, "special_tokens_set", ()):
                    specials[name] = enc.encode_single_token(name)
            if special_tokens:
                specials.update(special_tokens)
            special_ids = set(specials.values())
            ranks = getattr(enc, "_mergeable_ranks", None)
            if ranks:
                by_id = {int(r): bytes(t) for t, r in ranks.items()}
            else:
                by_id = {}
                for i in range(enc.n_vocab):
                    if i in special_ids:
                        continue
                    try:
                        by_id[i] = enc.decode_single_token_bytes(i)
                    except Exception:
                        pass
            encode_fn, hf = enc.encode_ordinary, enc
        else:
            path = Path(source)
            try:
                data = path.read_bytes()
            except OSError as e:
                raise TokenizerError(f"cannot read tiktoken file {source}: {e}") from None
            by_id = {}
            for lineno, line in enumerate(data.splitlines(), 1):
                if not line.strip():
                    continue
                parts = line.split()
                try:
                    tok, rank = base64.b64decode(parts[0], validate=True), int(parts[1])
                except Exception:
                    raise TokenizerError(f"{source}:{lineno}: expected 'base64 rank', got {line[:60]!r}") from None
                if rank in by_id:
                    raise TokenizerError(f"{source}:{lineno}: duplicate rank {rank}")
                by_id[rank] = tok
            specials = dict(special_tokens or {})
            if pat_str is not None:
                try:
                    import tiktoken

                    enc = tiktoken.Encoding(path.stem, pat_str=pat_str, mergeable_ranks={t: r for r, t in by_id.items()}, special_tokens=specials)
                    encode_fn, hf = enc.encode_ordinary, enc
                except ImportError:
                    pass
        special_ids = {int(i) for i in specials.values()}
        n = max([max(by_id, default=-1) + 1] + [i + 1 for i in special_ids])
        tb = [b""] * n
        for i, t in by_id.items():
            if i not in special_ids:
                tb[i] = t
        texts = {int(i): name for name, i in specials.items()}
        names = dict(specials)
        if stop_token_ids is not None:
            stops, strict = [int(i) for i in stop_token_ids], True
        else:
            eos = [int(getattr(hf, "eot_token"))] if hf is not None and getattr(hf, "eot_token", None) is not None else []
            stops, strict = _detect_stops(names, eos), False
        return cls(
            tb,
            vocab_size=vocab_size,
            stop_token_ids=stops,
            special_token_ids=special_ids,
            vocab_type="raw",
            add_prefix_space=False,
            hf_tokenizer=hf,
            encode_fn=encode_fn,
            special_token_text=texts,
            _strict_stops=strict,
        )

    @classmethod
    def from_gguf(
        cls,
        path: str | os.PathLike,
        *,
        vocab_size: int | None = None,
        stop_token_ids: Iterable[int] | int | None = None,
    ) -> "TokenizerInfo":
        """From the tokenizer metadata of a GGUF model file (``tokenizer.ggml.*``); reads only the header."""
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
                m = _BYTE_TOKEN_RE.match(t)
                tb[i] = bytes((int(m.group(1), 16),)) if m else decode_token(t, vt)
            else:
                tb[i] = decode_token(t, vt)
        if stop_token_ids is not None:
            stops, strict = [int(i) for i in stop_token_ids], True
        else:
            eos = [
                int(meta[k])
                for k in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id")
                if isinstance(meta.get(k), int) and 0 <= meta[k] < len(tokens)
            ]
            stops, strict = _detect_stops({t: i for i, t in texts.items()}, eos), False
        aps = meta.get("tokenizer.ggml.add_space_prefix")
        if aps is None:
            aps = model == "llama"
        backend = _gguf_bpe_backend(meta) if model == "gpt2" else None
        encode_fn = (lambda s: backend.encode(s, add_special_tokens=False).ids) if backend is not None else None
        return cls(
            tb,
            vocab_size=vocab_size,
            stop_token_ids=stops,
            special_token_ids=special,
            vocab_type=vt,
            add_prefix_space=bool(aps),
            special_token_text=texts,
            hf_tokenizer=backend,
            encode_fn=encode_fn,
            _strict_stops=strict,
        )

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
            backend = _backend_of(self.hf_tokenizer)
            if backend is not None:
                arrays["tokenizer_json"] = np.array(backend.to_str())
        try:
            with open(path, "wb") as f:
                np.savez(f, **arrays)
        except OSError as e:
            raise TokenizerError(f"cannot write {path}: {e}") from None

    @classmethod
    def load(cls, path: str | os.PathLike) -> "TokenizerInfo":
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
        )
        if meta.get("cache_key") and info.cache_key != meta["cache_key"]:
            raise TokenizerError(f"{path}: cache key mismatch (corrupt file?)")
        return info


# ---------------------------------------------------------------------------------------------- helpers
def _as_id_list(x: Any) -> list[int]:
    if x is None:
        return []
    if isinstance(x, (int, np.integer)):
        return [int(x)]
    try:
        return [int(i) for i in x if i is not None]
    except TypeError:
        return []


def _detect_stops(names: Mapping[str, int], eos_ids: Iterable[int]) -> list[int]:
    stops = {int(i) for i in eos_ids}
    for name in STOP_TOKEN_NAMES:
        if name in names:
            stops.add(int(names[name]))
    return sorted(stops)


def _backend_config(backend) -> dict[str, Any]:
    """The parts of a ``tokenizers.Tokenizer``'s JSON description we need, without serialising (and
    re-parsing) its whole vocabulary and merges when the bindings expose the parts directly."""
    try:
        cfg: dict[str, Any] = {}
        for key in ("decoder", "pre_tokenizer", "normalizer"):
            comp = getattr(backend, key)
            cfg[key] = None if comp is None else json.loads(comp.__getstate__())
        model = backend.model
        mcfg = {"type": type(model).__name__}
        for attr in ("byte_fallback", "unk_token", "unk_id"):
            if hasattr(model, attr):
                mcfg[attr] = getattr(model, attr)
        cfg["model"] = mcfg
        cfg["added_tokens"] = [
            {"id": int(i), "content": a.content, "special": bool(a.special)}
            for i, a in backend.get_added_tokens_decoder().items()
        ]
        return cfg
    except Exception:
        pass
    try:
        return json.loads(backend.to_str())
    except Exception as e:
        raise TokenizerError(f"cannot read the tokenizer's configuration: {e}") from None


def _eos_from_folder(folder: Path, backend) -> list[int]:
    """EOS ids from a tokenizer_config.json / generation_config.json next to a tokenizer.json."""
    out: list[int] = []
    cfg = _load_json(folder / "tokenizer_config.json")
    if isinstance(cfg, dict):
        name = _token_content(cfg.get("eos_token"))
        if name:
            i = backend.token_to_id(name)
            if i is not None:
                out.append(int(i))
    gen = _load_json(folder / "generation_config.json")
    if isinstance(gen, dict):
        out.extend(_as_id_list(gen.get("eos_token_id")))
    return out


def _is_tiktoken_encoding(obj: Any) -> bool:
    return type(obj).__name__ == "Encoding" and hasattr(obj, "encode_ordinary") and hasattr(obj, "n_vocab")


def _backend_of(tok: Any):
    try:
        from tokenizers import Tokenizer
    except ImportError:  # pragma: no cover
        return None
    if isinstance(tok, Tokenizer):
        return tok
    backend = getattr(tok, "backend_tokenizer", None)
    return backend if isinstance(backend, Tokenizer) else None


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
