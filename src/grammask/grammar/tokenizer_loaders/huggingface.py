"""Hugging Face tokenizers as :class:`TokenizerInfo` fields: ``tokenizers.Tokenizer`` objects and
``tokenizer.json`` files (fast), ``transformers`` tokenizers with a fast backend, and slow
(sentencepiece-style, ``get_vocab``/``convert_ids_to_tokens`` only) ``transformers`` tokenizers.

The vocab type and prefix space come from the tokenizer's decoder/pre-tokenizer/normalizer
description where it has one (else from the vocabulary strings), and a probe encode of ``"a"``
overrides the prefix space when an encoder is available.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterable, Mapping

from ...errors import TokenizerError
from ..vocab import as_id_list, decode_token, detect_stops, guess_vocab_type, is_control_token
from .fields import info_fields
from .gguf import load_gguf
from .tiktoken_bpe import is_tiktoken_encoding, load_tiktoken


def load_huggingface(
    tokenizer: Any,
    vocab_size: int | None = None,
    stop_token_ids: Iterable[int] | int | None = None,
) -> dict[str, Any]:
    """Keyword arguments of :class:`~grammask.grammar.tokenizer_info.TokenizerInfo` for a Hugging Face
    tokenizer object or ``tokenizer.json`` path (see :meth:`TokenizerInfo.from_huggingface`)."""
    if isinstance(stop_token_ids, int):
        stop_token_ids = [stop_token_ids]
    if isinstance(tokenizer, (str, os.PathLike)):
        path = Path(tokenizer)
        if path.is_dir():
            path = path / "tokenizer.json"
        if not path.is_file():
            raise TokenizerError(f"no tokenizer.json at {tokenizer}")
        if path.suffix == ".gguf":
            return load_gguf(path, vocab_size=vocab_size, stop_token_ids=stop_token_ids)
        if path.suffix == ".tiktoken":
            return load_tiktoken(path, vocab_size=vocab_size, stop_token_ids=stop_token_ids)
        try:
            from tokenizers import Tokenizer
        except ImportError as e:  # pragma: no cover - tokenizers is a dependency
            raise TokenizerError("the 'tokenizers' package is needed to read tokenizer.json") from e
        try:
            backend = Tokenizer.from_file(str(path))
        except Exception as e:
            raise TokenizerError(f"cannot read {path}: {e}") from None
        eos = _eos_from_folder(path.parent, backend)
        return _from_backend(backend, hf_tokenizer=backend,
                             encode_fn=lambda t: backend.encode(t, add_special_tokens=False).ids,
                             eos_ids=eos, extra_special=(), vocab_size=vocab_size, stop_token_ids=stop_token_ids)
    try:
        from tokenizers import Tokenizer
    except ImportError:  # pragma: no cover
        Tokenizer = ()  # type: ignore[assignment]
    if Tokenizer and isinstance(tokenizer, Tokenizer):
        return _from_backend(tokenizer, hf_tokenizer=tokenizer,
                             encode_fn=lambda t: tokenizer.encode(t, add_special_tokens=False).ids,
                             eos_ids=(), extra_special=(), vocab_size=vocab_size, stop_token_ids=stop_token_ids)
    if is_tiktoken_encoding(tokenizer):
        return load_tiktoken(tokenizer, vocab_size=vocab_size, stop_token_ids=stop_token_ids)
    if hasattr(tokenizer, "get_vocab") and hasattr(tokenizer, "convert_ids_to_tokens"):
        eos = as_id_list(getattr(tokenizer, "eos_token_id", None))
        extra = set(as_id_list(getattr(tokenizer, "all_special_ids", None)))

        def encode_fn(t):
            return tokenizer.encode(t, add_special_tokens=False)

        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is not None and hasattr(backend, "to_str"):
            return _from_backend(backend, hf_tokenizer=tokenizer, encode_fn=encode_fn, eos_ids=eos, extra_special=extra,
                                 vocab_size=vocab_size, stop_token_ids=stop_token_ids)
        return _from_slow(tokenizer, encode_fn, eos, extra, vocab_size, stop_token_ids)
    raise TokenizerError(f"unsupported tokenizer object of type {type(tokenizer).__name__}")


def _from_backend(backend, *, hf_tokenizer, encode_fn, eos_ids, extra_special, vocab_size, stop_token_ids):
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
        _place_piece(i, p, None if a is None else (a["content"], a.get("special")), vt, tb, special, texts)
    unk = model.get("unk_token")
    if isinstance(unk, str) and unk in vocab:
        special.add(vocab[unk])
        texts.setdefault(vocab[unk], unk)
    elif isinstance(model.get("unk_id"), int) and 0 <= model["unk_id"] < n:  # Unigram
        special.add(model["unk_id"])
    for i in special:
        tb[i] = b""
    names = {t: i for i, t in texts.items()}
    return _finish(tb, vt, aps, special, texts, names, eos_ids, hf_tokenizer, encode_fn, vocab_size, stop_token_ids)


def _from_slow(tok, encode_fn, eos_ids, extra_special, vocab_size, stop_token_ids):
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
        content = None if a is None else (_token_content(a) or p, getattr(a, "special", False))
        _place_piece(i, p, content, vt, tb, special, texts)
    unk = getattr(tok, "unk_token_id", None)
    if isinstance(unk, int) and 0 <= unk < n:
        special.add(unk)
    for i in special:
        tb[i] = b""
    names = {t: i for i, t in texts.items()}
    return _finish(tb, vt, None, special, texts, names, eos_ids, tok, encode_fn, vocab_size, stop_token_ids)


def _place_piece(i, piece, added, vt, tb, special, texts):
    """Token ``i`` (vocabulary string ``piece``) into ``tb``/``special``/``texts``. An added token
    (``added`` = ``(content, marked special)``) is special when marked so, when it looks like a control
    token or when its id is declared special, else plain text (its content's UTF-8); a model token is
    decoded per ``vt`` unless its id is declared special."""
    if added is not None:
        content, marked = added
        if marked or is_control_token(content) or i in special:
            special.add(i)
            texts[i] = content
        else:
            tb[i] = content.encode("utf-8")
    elif i in special:
        texts[i] = piece
    else:
        tb[i] = decode_token(piece, vt)


def _finish(tb, vt, aps, special, texts, names, eos_ids, hf_tokenizer, encode_fn, vocab_size, stop_token_ids):
    if encode_fn is not None:  # what the tokenizer actually does beats what its config suggests
        try:
            probe = b"".join(tb[i] for i in encode_fn("a") if 0 <= i < len(tb))
            if probe.endswith(b"a") and len(probe) > 1 and probe[:-1].strip(b" ") == b"":
                aps = True
            elif probe == b"a":
                aps = False
        except Exception:
            pass
    return info_fields(tb, special_token_ids=special, special_token_text=texts, vocab_type=vt,
                       add_prefix_space=bool(aps), hf_tokenizer=hf_tokenizer, encode_fn=encode_fn,
                       vocab_size=vocab_size, stop_token_ids=stop_token_ids,
                       find_stops=lambda: detect_stops(names, eos_ids))


# ---------------------------------------------------------------------------------------------- helpers
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
        out.extend(as_id_list(gen.get("eos_token_id")))
    return out


def backend_of(tok: Any):
    """The ``tokenizers.Tokenizer`` of ``tok`` (itself, or a transformers tokenizer's fast backend); else None."""
    try:
        from tokenizers import Tokenizer
    except ImportError:  # pragma: no cover
        return None
    if isinstance(tok, Tokenizer):
        return tok
    backend = getattr(tok, "backend_tokenizer", None)
    return backend if isinstance(backend, Tokenizer) else None


__all__ = ["backend_of", "load_huggingface"]
