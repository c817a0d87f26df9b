"""A ``transformers`` logits processor: grammar-constrained ``model.generate()``.

::

    from grammask.adapters.transformers import GrammarLogitsProcessor
    proc = GrammarLogitsProcessor({"type": "json_object"}, tokenizer)
    out = model.generate(**inputs, logits_processor=[proc], max_new_tokens=64)

The grammar is a :class:`~grammask.grammar.compiled.CompiledGrammar` (its tokenizer is used; the
``tokenizer`` argument may then be omitted), an OpenAI-style ``response_format`` dict (``json_object``
with an optional ``schema``, ``json_schema``, ``regex``, ``grammar``, ``structural_tag``; ``text``
constrains nothing), or a pydantic model class (its JSON Schema, strict: every field present, no
others). ``tokenizer`` is a ``transformers`` tokenizer or a :class:`~grammask.grammar.TokenizerInfo`.

Batch aware: one :class:`~grammask.grammar.matcher.GrammarMatcher` per row of ``input_ids``; the
rows' masks are filled (in threads with ``parallel=True``) and applied on the logits' device (a Triton kernel on
CUDA, see :mod:`grammask.grammar.kernels`). Every row accepts the token it got at the previous step; the
grammar state of a row is a function of its generated tokens, so beam search (rows reordered
between steps) is followed by matching each row to the row it grew from. A row whose grammar has
ended (stop token accepted) is only offered stop tokens; so is a row that got a token the
grammar rejects (e.g. another processor forced it), which is reported in :attr:`rejected`.

A new ``generate()`` call is detected (different batch, prompt or length) and starts fresh
matchers; :meth:`reset` does it explicitly.
"""
from __future__ import annotations

import logging
import re
import weakref
from typing import Any

import numpy as np
import torch

from ..errors import InvalidRequestError
from ..grammar.bitmask import apply_token_bitmask_inplace, bitmask_words, fill_next_token_bitmasks
from ..grammar.compiled import CompiledGrammar
from ..grammar.compiler import GrammarCompiler
from ..grammar.matcher import GrammarMatcher
from ..grammar.tokenizer_info import TokenizerInfo

try:
    from transformers import LogitsProcessor
except ImportError as e:  # pragma: no cover - depends on the install
    raise ImportError("grammask.adapters.transformers needs the 'hf' extra: pip install 'grammask[hf]'") from e

logger = logging.getLogger(__name__)

__all__ = ["GrammarLogitsProcessor", "compile_response_format", "tokenizer_info_for"]

_RF_TYPES = ("text", "json_object", "json_schema", "grammar", "regex", "structural_tag")
_INFOS: "weakref.WeakKeyDictionary[Any, TokenizerInfo]" = weakref.WeakKeyDictionary()
_COMPILERS: "weakref.WeakKeyDictionary[TokenizerInfo, GrammarCompiler]" = weakref.WeakKeyDictionary()


def tokenizer_info_for(tokenizer: Any, vocab_size: int | None = None) -> TokenizerInfo:
    """The :class:`TokenizerInfo` of a ``transformers`` tokenizer (built once per tokenizer object
    and vocabulary size; building it takes a second or more for big vocabularies)."""
    if isinstance(tokenizer, TokenizerInfo):
        return tokenizer
    try:
        per_tok = _INFOS.get(tokenizer)
    except TypeError:  # not weak-referenceable
        return TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size)
    if per_tok is not None and (vocab_size is None or per_tok.vocab_size == vocab_size):
        return per_tok
    info = TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size)
    _INFOS[tokenizer] = info
    return info


def _compiler_for(info: TokenizerInfo) -> GrammarCompiler:
    comp = _COMPILERS.get(info)
    if comp is None:
        comp = _COMPILERS[info] = GrammarCompiler(info)
    return comp


def _pydantic_response_format(model_cls) -> dict:
    name = re.sub(r"[^A-Za-z0-9_-]", "_", getattr(model_cls, "__name__", "response"))[:64] or "response"
    return {"type": "json_schema", "json_schema": {"name": name, "schema": model_cls.model_json_schema(),
                                                   "strict": True}}


def compile_response_format(response_format: Any, tokenizer_info: TokenizerInfo, *,
                            compiler: GrammarCompiler | None = None,
                            whitespace: str = "flexible") -> CompiledGrammar | None:
    """Compile an OpenAI-style ``response_format`` (dict or pydantic model class) for
    ``tokenizer_info``; None for ``{"type": "text"}``. Raises :class:`InvalidRequestError` or a
    :class:`~grammask.errors.GrammarError` (schema errors carry the JSON pointer)."""
    from ..pipeline.protocol import parse_request
    from ..pipeline.response_format import compile_spec, grammar_spec

    rf = response_format
    if isinstance(rf, type) and callable(getattr(rf, "model_json_schema", None)):
        rf = _pydantic_response_format(rf)
    if hasattr(rf, "model_dump") and not isinstance(rf, dict):
        rf = rf.model_dump(by_alias=True, exclude_none=True)
    if not isinstance(rf, dict):
        raise InvalidRequestError(f"response_format must be a dict or a pydantic model class, not {type(rf).__name__}",
                                  param="response_format")
    if rf.get("type") not in _RF_TYPES:
        raise InvalidRequestError(f"response_format type {rf.get('type')!r} is not one of {', '.join(_RF_TYPES)} "
                                  "(wrap a JSON Schema as {'type': 'json_schema', 'json_schema': {'name': ..., "
                                  "'schema': ...}})", param="response_format.type")
    req = parse_request(messages=[{"role": "user", "content": ""}], response_format=rf)
    spec = grammar_spec(req, whitespace=whitespace)
    if spec is None:
        return None
    return compile_spec(spec, compiler or _compiler_for(tokenizer_info))


class GrammarLogitsProcessor(LogitsProcessor):
    """See the module docstring.

    ``vocab_size``: logits width for the :class:`TokenizerInfo` built from a ``transformers``
    tokenizer (default: the tokenizer's size; wider logits have their extra ids masked out).
    ``stop_token_ids``: the tokens that end the output (default: the tokenizer's end-of-text
    and end-of-turn tokens); generation only stops on them if ``generate`` also knows them as
    ``eos_token_id``. ``whitespace``: ``"flexible"`` or ``"compact"`` JSON. ``parallel``: fill
    the rows' masks in threads (off by default: concurrent mask filling on matchers sharing one
    compiled grammar is not reliable yet while its lazy lexer grows). ``canonical``: allow only the
    tokenizer's canonical token sequences (README "Canonical tokenization"; default: the
    ``response_format``'s ``canonical``, else off); a tokenizer it cannot support raises
    :class:`~grammask.errors.CanonicalTokenizationError` here."""

    def __init__(self, grammar: Any, tokenizer: Any = None, *, vocab_size: int | None = None,
                 stop_token_ids=None, whitespace: str = "flexible", compiler: GrammarCompiler | None = None,
                 parallel: bool = False, canonical: bool | None = None):
        if canonical is None and isinstance(grammar, dict):
            canonical = grammar.get("canonical")
        if canonical is not None and not isinstance(canonical, bool):
            raise InvalidRequestError("canonical must be true or false", param="canonical")
        self.canonical = bool(canonical)
        if isinstance(grammar, CompiledGrammar):
            compiled = grammar
            info = grammar.tokenizer_info
        else:
            if tokenizer is None:
                raise InvalidRequestError("a tokenizer is needed to compile a response_format", param="tokenizer")
            info = tokenizer_info_for(tokenizer, vocab_size)
            compiled = compile_response_format(grammar, info, compiler=compiler, whitespace=whitespace)
        self.compiled: CompiledGrammar | None = compiled
        self.tokenizer_info = info
        self.vocab_size = info.vocab_size
        self.stop_token_ids = list(info.stop_token_ids if stop_token_ids is None else stop_token_ids)
        self.parallel = parallel
        #: (row, token) pairs the grammar rejected since the last reset (the row then only gets stop tokens)
        self.rejected: list[tuple[int, int]] = []
        if self.canonical and compiled is not None:
            self._new_matcher()   # the tokenizer's canonical structure: built (or refused) now
        self.reset()

    # ------------------------------------------------------------------ state
    def reset(self) -> None:
        """Forget the current generation: the next call starts fresh matchers."""
        self._prev: torch.Tensor | None = None
        self._states: list[GrammarMatcher | None] = []
        self._bitmask: np.ndarray | None = None
        self.rejected = []

    def _new_matcher(self) -> GrammarMatcher:
        return GrammarMatcher(self.compiled, stop_token_ids=self.stop_token_ids, canonical=self.canonical)

    def _start(self, input_ids: torch.Tensor) -> None:
        self.reset()
        base = self._new_matcher()
        self._states = [base] + [base.fork() for _ in range(input_ids.shape[0] - 1)]

    def _parents(self, input_ids: torch.Tensor) -> list[int] | None:
        """For every row, the previous row it grew from; None when this is not the next step of
        the same generation."""
        prev = self._prev
        if prev is None or input_ids.dim() != 2 or input_ids.shape[1] != prev.shape[1] + 1:
            return None
        head = input_ids[:, :-1]
        if head.shape == prev.shape and torch.equal(head, prev.to(head.device)):
            return list(range(input_ids.shape[0]))
        # beam search: rows reordered (or a new generation): match every row to an old one
        p = prev.to(head.device)
        same = (head.unsqueeze(1) == p.unsqueeze(0)).all(-1)  # [B_new, B_old]
        found = same.any(1)
        if not bool(found.all()):
            return None
        return same.to(torch.int8).argmax(1).tolist()

    def _advance(self, input_ids: torch.Tensor, parents: list[int]) -> None:
        last = input_ids[:, -1].tolist()
        old = self._states
        uses: dict[int, int] = {}
        states: list[GrammarMatcher | None] = []
        for j in parents:  # fork before any row advances: siblings share their parent's state
            m = old[j]
            n = uses.get(j, 0)
            uses[j] = n + 1
            states.append(m if (m is None or n == 0) else m.fork())
        for i, (m, tok) in enumerate(zip(states, last)):
            if m is None or m.is_terminated():
                continue  # finished rows get padding; dead rows stay dead
            if not m.accept_token(int(tok)):
                logger.warning("grammar rejected token %d in row %d: the row may only stop now", tok, i)
                self.rejected.append((i, int(tok)))
                states[i] = None
        self._states = states

    # ------------------------------------------------------------------ the processor
    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self.compiled is None:
            return scores
        parents = self._parents(input_ids)
        if parents is None:
            self._start(input_ids)
        else:
            self._advance(input_ids, parents)
        self._prev = input_ids.detach().clone()
        B = input_ids.shape[0]
        words = bitmask_words(self.vocab_size)
        if self._bitmask is None or self._bitmask.shape[0] != B:
            self._bitmask = np.empty((B, words), np.int32)
        bm = self._bitmask
        for i, m in enumerate(self._states):
            if m is None:  # only stop tokens
                row = bm[i].view(np.uint32)
                row[:] = 0
                for t in self.stop_token_ids:
                    if 0 <= t < self.vocab_size:
                        row[t >> 5] |= np.uint32(1 << (t & 31))
        fill_next_token_bitmasks(self._states, bm, parallel=self.parallel)
        apply_token_bitmask_inplace(scores, torch.from_numpy(bm), vocab_size=self.vocab_size)
        return scores
