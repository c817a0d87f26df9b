"""What canonical-tokenization decoding needs to know about a tokenizer, read from the tokenizer.

:func:`canonical_spec` returns a :class:`CanonicalSpec`: the merge rules (left id, right id, rank,
merged id), the pre-tokenizer (a ``tokenizers`` pre-tokenizer, used on short representative
strings, see :mod:`.canonical`) and flags. Tokenizer classes out of reach raise
:class:`~grammask.errors.CanonicalTokenizationError` naming the reason; nothing degrades silently.

Supported: byte-level BPE with a merge table (``tokenizers`` ``BPE`` models with a ``ByteLevel``
pre-tokenizer, optionally behind ``Split``/``Digits`` pre-tokenizers: GPT-2, SmolLM2, Llama-3,
DeepSeek-style), GGUF ``gpt2``-type vocabularies (rebuilt as such by the GGUF loader), and tiktoken
encodings (ranks + split pattern: Qwen, OpenAI). Not supported: byte-fallback/sentencepiece
vocabularies (``Metaspace``), WordPiece/Unigram models, normalizers that change the text, BPE
dropout, ``continuing_subword_prefix``/``end_of_word_suffix``.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import CanonicalTokenizationError
from .vocab import bytes_to_unicode


#: the split of ``tokenizers``' ``ByteLevel(use_regex=True)`` pre-tokenizer (GPT-2's pattern; the
#: ``tokenizers`` crate splits with it, isolated): such a pre-tokenizer alone is this one regex
GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"


def digits_then_gpt2(individual: bool) -> str:
    r"""One regex for ``Sequence([Digits(individual_digits), ByteLevel(use_regex=True)])``
    (SmolLM2): digits (each one, or each run) are pieces of their own, and GPT-2's pattern runs on
    the text between them, each piece's end being an end of text. Written over the whole text: a
    digit alternative first; no other alternative consumes a digit (` ?\p{N}+` goes: a space
    before a digit ends its piece); and ``\s+(?!\S)`` becomes ``\s+(?![^\s\p{N}])``, as a
    digit after the spaces is where their piece ends. tests/test_canonical.py compares it with the
    pre-tokenizer itself."""
    digit = r"\p{N}" if individual else r"\p{N}+"
    return (digit + r"|'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?[^\s\p{L}\p{N}]+|\s+(?![^\s\p{N}])|\s+")


@dataclass
class CanonicalSpec:
    rules: np.ndarray                 # int64 [n, 4]: left id, right id, rank, merged id
    pre_tokenizer: Any                # a tokenizers PreTokenizer (pre_tokenize_str), or None
    whole_piece_rule: bool = False    # tiktoken / ignore_merges: a pre-token in the vocab is one token
    kind: str = "bpe"
    split_pattern: str | None = None  # the pre-tokenizer is this one regex (Split, isolated): a fast path
    notes: list[str] = field(default_factory=list)


def _fail(reason: str):
    raise CanonicalTokenizationError(f"canonical tokenization is not available for this tokenizer: {reason}",
                                     reason=reason)


def _strip_byte_level(pt: dict | None) -> tuple[Any, bool]:
    """The pre-tokenizer config with the ``ByteLevel`` step removed (it only maps bytes to
    characters, or also splits with the GPT-2 regex when ``use_regex``); returns (tokenizers
    PreTokenizer or None, saw_byte_level)."""
    from tokenizers import Regex, pre_tokenizers

    if pt is None:
        return None, False
    steps = pt["pretokenizers"] if pt.get("type") == "Sequence" else [pt]
    out, saw = [], False
    for s in steps:
        ty = s.get("type")
        if ty == "ByteLevel":
            saw = True
            if s.get("add_prefix_space"):
                _fail("ByteLevel pre-tokenizer with add_prefix_space")
            if s.get("use_regex", True):
                out.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True))
        elif ty == "Split":
            pat = s.get("pattern", {})
            if "Regex" in pat:
                p = Regex(pat["Regex"])
            elif "String" in pat:
                p = pat["String"]
            else:
                _fail(f"Split pre-tokenizer pattern {pat!r}")
            if s.get("invert"):
                _fail("inverted Split pre-tokenizer")
            out.append(pre_tokenizers.Split(p, behavior=s.get("behavior", "isolated").lower()))
        elif ty == "Digits":
            out.append(pre_tokenizers.Digits(individual_digits=bool(s.get("individual_digits"))))
        elif ty == "Punctuation":
            out.append(pre_tokenizers.Punctuation(behavior=s.get("behavior", "isolated").lower()))
        elif ty in ("Whitespace", "WhitespaceSplit"):
            out.append(getattr(pre_tokenizers, ty)())
        else:
            _fail(f"{ty} pre-tokenizer")
    if not out:
        return None, saw
    return (out[0] if len(out) == 1 else pre_tokenizers.Sequence(out)), saw


def spec_from_tokenizers_json(cfg: dict, token_bytes: list[bytes]) -> CanonicalSpec:
    model = cfg.get("model") or {}
    if model.get("type") != "BPE":
        _fail(f"{model.get('type')} model (only BPE merge tables are supported)")
    if model.get("dropout"):
        _fail("BPE dropout")
    if model.get("continuing_subword_prefix") or model.get("end_of_word_suffix"):
        _fail("continuing_subword_prefix / end_of_word_suffix")
    if model.get("byte_fallback"):
        _fail("byte-fallback (sentencepiece-style) vocabulary")
    norm = cfg.get("normalizer")
    if norm is not None:
        _fail(f"{norm.get('type')} normalizer")
    pre, saw_bl = _strip_byte_level(cfg.get("pre_tokenizer"))
    if not saw_bl:
        _fail("not a byte-level BPE (no ByteLevel pre-tokenizer)")
    vocab: dict[str, int] = model["vocab"]
    u2b = {c: b for b, c in bytes_to_unicode().items()}
    rules = []
    for rank, m in enumerate(model.get("merges") or []):
        a, b = m.split(" ", 1) if isinstance(m, str) else m
        ia, ib, io = vocab.get(a), vocab.get(b), vocab.get(a + b)
        if ia is None or ib is None or io is None:
            continue
        rules.append((ia, ib, rank, io))
    # the model's vocabulary bytes must be the ones the matcher sees
    for s, i in vocab.items():
        if i < len(token_bytes) and token_bytes[i]:
            try:
                raw = bytes(u2b[c] for c in s)
            except KeyError:
                _fail(f"vocabulary string {s!r} is not byte-level")
            if raw != token_bytes[i]:
                _fail(f"token {i} bytes differ from the model's vocabulary")
    split = None
    steps = (cfg.get("pre_tokenizer") or {})
    steps = steps.get("pretokenizers", [steps]) if steps else []
    steps = [x for x in steps if not (x.get("type") == "ByteLevel" and not x.get("use_regex", True))]
    if len(steps) == 1 and steps[0].get("type") == "Split" and "Regex" in steps[0].get("pattern", {}) \
            and steps[0].get("behavior", "").lower() == "isolated":
        split = steps[0]["pattern"]["Regex"]
    elif len(steps) == 1 and steps[0].get("type") == "ByteLevel":
        split = GPT2_SPLIT   # use_regex (the others were dropped above): GPT-2
    elif [x.get("type") for x in steps] == ["Digits", "ByteLevel"]:
        split = digits_then_gpt2(bool(steps[0].get("individual_digits")))   # SmolLM2
    return CanonicalSpec(np.array(rules, np.int64).reshape(-1, 4), pre,
                         whole_piece_rule=bool(model.get("ignore_merges")), kind="bpe", split_pattern=split)


def spec_from_ranks(ranks: dict[bytes, int], pat_str: str | None, token_bytes: list[bytes]) -> CanonicalSpec:
    """tiktoken: the rules are every split of a token into two tokens, ranked by the token's rank."""
    from tokenizers import Regex, pre_tokenizers

    by_bytes = {bytes(t): int(r) for t, r in ranks.items()}
    for t, r in by_bytes.items():
        if r >= len(token_bytes) or token_bytes[r] != t:
            _fail(f"tiktoken rank {r} does not match the vocabulary bytes")
    rules = []
    for t, r in by_bytes.items():
        for k in range(1, len(t)):
            ia, ib = by_bytes.get(t[:k]), by_bytes.get(t[k:])
            if ia is not None and ib is not None:
                rules.append((ia, ib, r, r))
    pre = pre_tokenizers.Split(Regex(pat_str), behavior="isolated") if pat_str else None
    return CanonicalSpec(np.array(rules, np.int64).reshape(-1, 4), pre, whole_piece_rule=True, kind="tiktoken",
                         split_pattern=pat_str)


def canonical_spec(info, *, tokenizer: Any = None, pat_str: str | None = None,
                   ranks: dict[bytes, int] | None = None) -> CanonicalSpec:
    """Read the spec from ``tokenizer`` (default: the tokenizer ``info`` was built from)."""
    if ranks is not None:
        return spec_from_ranks(ranks, pat_str, info.token_bytes)
    tok = tokenizer if tokenizer is not None else info.hf_tokenizer
    if tok is None:
        _fail("the TokenizerInfo keeps no tokenizer to read merges from (pass tokenizer=, or ranks= and "
              "pat_str= for a tiktoken file)")
    if type(tok).__name__ == "Encoding" and hasattr(tok, "_mergeable_ranks"):
        return spec_from_ranks(tok._mergeable_ranks, getattr(tok, "_pat_str", None), info.token_bytes)
    backend = getattr(tok, "backend_tokenizer", tok)
    to_str = getattr(backend, "to_str", None)
    if to_str is None:
        _fail(f"unknown tokenizer object {type(tok).__name__}")
    return spec_from_tokenizers_json(json.loads(to_str()), info.token_bytes)
