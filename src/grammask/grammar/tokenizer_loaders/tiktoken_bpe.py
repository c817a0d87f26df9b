"""A tiktoken vocabulary (a BPE file of ``base64(token) rank`` lines, or a ``tiktoken.Encoding``) as
:class:`TokenizerInfo` fields. tiktoken ranks are the token ids and the tokens are raw bytes."""
from __future__ import annotations

import base64
from pathlib import Path
from typing import Any, Iterable, Mapping

from ...errors import TokenizerError
from ..vocab import detect_stops
from .fields import info_fields


def is_tiktoken_encoding(obj: Any) -> bool:
    """``obj`` looks like a ``tiktoken.Encoding`` (checked without importing tiktoken)."""
    return type(obj).__name__ == "Encoding" and hasattr(obj, "encode_ordinary") and hasattr(obj, "n_vocab")


def load_tiktoken(
    source: Any,
    special_tokens: Mapping[str, int] | None = None,
    *,
    vocab_size: int | None = None,
    stop_token_ids: Iterable[int] | int | None = None,
    pat_str: str | None = None,
) -> dict[str, Any]:
    """Keyword arguments of :class:`~grammask.grammar.tokenizer_info.TokenizerInfo` for a tiktoken
    file or Encoding (see :meth:`TokenizerInfo.from_tiktoken`)."""
    if isinstance(stop_token_ids, int):
        stop_token_ids = [stop_token_ids]
    encode_fn = None
    hf = None
    if is_tiktoken_encoding(source):
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

    def find_stops():
        eos = [int(getattr(hf, "eot_token"))] if hf is not None and getattr(hf, "eot_token", None) is not None else []
        return detect_stops(names, eos)

    return info_fields(tb, special_token_ids=special_ids, special_token_text=texts, vocab_type="raw",
                       add_prefix_space=False, hf_tokenizer=hf, encode_fn=encode_fn,
                       vocab_size=vocab_size, stop_token_ids=stop_token_ids, find_stops=find_stops)


__all__ = ["is_tiktoken_encoding", "load_tiktoken"]
