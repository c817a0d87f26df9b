"""grammask as vLLM's structured-output engine, through vLLM's logits-processor plugin interface.

Written against the sources of ``vllm==0.33.0`` (the PyPI wheel), without patching vLLM.

**Why the logits-processor route.** vLLM's structured-output backends
(``vllm/v1/structured_output/backend_types.py``: ``StructuredOutputBackend`` /
``StructuredOutputGrammar``) cannot be registered from outside: ``StructuredOutputManager.grammar_init``
builds the backend with a hard-coded ``if request_backend == "xgrammar" / "guidance" / "outlines" /
"lm-format-enforcer"`` chain, and ``StructuredOutputsConfig.backend`` is a ``Literal`` of those names
(pydantic rejects any other). Custom *logits processors*, on the other hand, are a public plugin
interface: a class named by ``--logits-processors grammask.adapters.vllm:GrammaskLogitsProcessor``
(``LLM(logits_processors=[...])``) or installed under the entry-point group
``vllm.logits_processors``. Both model runners load them from those two places:

* V1 runner: ``vllm.v1.sample.logits_processor.LogitsProcessor`` (``__init__(vllm_config, device,
  is_pin_memory)``, ``update_state(BatchUpdate | None)`` before each forward pass,
  ``apply(logits)`` after it, ``is_argmax_invariant()``, classmethod ``validate_params(params)``) ->
  :data:`GrammaskLogitsProcessor`.
* V2 runner (``VLLM_USE_V2_MODEL_RUNNER=1``, the default on CUDA when every feature in use is
  supported): ``vllm.v1.worker.gpu.sample.logits_processor.LogitsProcessor`` (``__init__(vllm_config,
  req_states)``, ``add_request(slot, params) -> bool``, ``apply(logits, ctx: LogitsContext)``,
  ``validate_params``) -> :data:`GrammaskLogitsProcessorV2`. Its loader rejects V1 classes, so the
  option names the class matching the runner (there is no entry point for this reason: a plugin
  installed under ``vllm.logits_processors`` is loaded by *both* runners and one of them refuses it).

**How requests keep vLLM's request surface.** ``response_format`` (``json_schema``,
``json_object``), ``structured_outputs`` (``json``, ``regex``, ``choice``, ``grammar``,
``json_object``, ``structural_tag``) arrive as ``SamplingParams.structured_outputs``
(``StructuredOutputsParams``). In the frontend ``InputProcessor._validate_params`` runs
``params.verify(...)`` (vLLM's own checks) and *then* each custom processor's
``validate_params(params)``, before the request is cloned and sent to the engine core. Our
``validate_params`` compiles the spec with grammask (a byte-level vocabulary: syntax and unsupported
features give a typed :class:`~grammask.errors.InvalidRequestError`, which is a ``ValueError``, so
vLLM answers HTTP 400), moves it to ``SamplingParams.extra_args["grammask"]`` and sets
``structured_outputs = None``: the engine core then creates no ``StructuredOutputRequest``
(``StructuredOutputRequest.from_sampling_params`` returns None), vLLM's own backend never sees the
request, and the processor in the worker finds the spec in ``extra_args``. A client may also send
``extra_args={"grammask": {"kind": "regex", "value": "..."}}`` (``vllm_xargs`` over HTTP) directly.
Note that ``validate_params`` edits the caller's ``SamplingParams`` (vLLM clones it afterwards):
an offline ``SamplingParams`` object reused for several requests keeps working (the spec is read
from ``extra_args``), but its ``structured_outputs`` reads None after the first use.

**In the worker.** One :class:`~grammask.grammar.compiler.GrammarCompiler` per processor (its LRU
cache compiles each distinct spec once and shares it between requests), one
:class:`~grammask.grammar.matcher.GrammarMatcher` per request, a numpy bitmask ``[max_num_seqs,
ceil(V/32)]`` whose rows are filled by a thread pool (the Numba kernels release the GIL) and
applied to the logits by grammask's applier (Triton on CUDA, Numba on CPU). The vocabulary is the
model's (``model_config.get_vocab_size()``: the logits width may exceed the tokenizer's vocabulary;
ids beyond it are masked). The matcher follows the request's output token list: new tokens are
accepted; when the list got shorter (tokens discarded after a KV-load failure) the matcher rolls
back with :meth:`GrammarMatcher.rollback`; a request re-added after preemption replays its output.
**Overlap**: V1 calls ``update_state`` before the forward pass and ``apply`` after it, so when every
constrained request's output list is already complete (no ``-1`` placeholder of async scheduling)
``update_state`` submits the mask fill to the pool and ``apply`` only waits for it; otherwise (async
scheduling: the last token is known only after the forward) the fill runs in ``apply``, still
spread over the pool.

**Not supported** (each raises :class:`VLLMUnsupportedError` naming it): speculative decoding
(vLLM itself refuses custom logits processors with a speculative config, so the
``validate_tokens``/rollback-of-drafts path of a ``StructuredOutputBackend`` has no counterpart
here; :meth:`GrammaskBatch.sync` does roll back when vLLM discards committed tokens), xgrammar's
new structural-tag format (``{"type": "structural_tag", "format": ...}``; the legacy
``structures``/``triggers`` form is supported), ``disable_additional_properties``, structured
output inside reasoning (``--reasoning-parser``: vLLM's reasoning gate lives in its
``StructuredOutputManager``, which we bypass, so the grammar applies from the first output token),
Mistral (``tekken``) tokenizers and tokenizers without a Hugging Face vocabulary, canonical
tokenization (``extra_args.grammask.canonical``: the frontend, where requests are checked, does
not hold the model tokenizer's canonical structure). A grammar that
fails to compile in the worker (it was checked in the frontend, so only on resource bounds) is
logged and its request is allowed stop tokens only.

**vLLM 0.26.** ``vllm==0.26.0`` pins ``torch==2.11.0`` (the GPU machine's torch); its V1 classes
are those above and the tests pass against them on CPU; it has no logits-processor interface on
its V2 runner (it falls back to V1 whenever custom logits processors are configured), so only
:data:`GrammaskLogitsProcessor` applies there and asking for the V2 class raises an ImportError
saying so. ``benchmarks/vllm_payload.sh`` / ``benchmarks/vllm_checks.sh`` carry that release to
the GPU machine in pieces and run ``benchmarks/vllm_serve.py`` there.

**Run on a GPU** (an H200, ``benchmarks/RESULTS.md``): ``vllm serve`` 0.26.0 with the V1 class at
1 and 64 concurrent clients beside xgrammar and guidance, every finished output valid, and at 64
clients the lowest time per output token of the three (``benchmarks/vllm_checks.sh``); without
vLLM, the Triton bitmask kernel against xgrammar's, the engine (:mod:`grammask.pipeline`) and the
HTTP server on CUDA (``benchmarks/gpu_checks.sh``). On CUDA the V1 processor compiles the bitmask
kernel when it starts (vLLM's JIT monitor saw it compile during inference before; it no longer
does). **Remains for a GPU machine with vLLM >= 0.33** (it needs ``torch==2.14.0``, which the lent
machine's image cannot take): the V2 runner path
(``GrammaskLogitsProcessorV2`` reads committed tokens from ``req_states.all_token_ids``; the
read-back and its ordering under async scheduling are unverified on a GPU).
"""
from __future__ import annotations

import json
import logging
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from ..errors import GrammaskError, InvalidRequestError, MatcherError
from ..grammar.bitmask import apply_token_bitmask_inplace, bitmask_words
from ..grammar.compiler import GrammarCompiler
from ..grammar.matcher import GrammarMatcher
from ..grammar.tokenizer_info import TokenizerInfo

__all__ = ["EXTRA_ARGS_KEY", "GrammarSpec", "GrammaskBatch", "VLLMUnsupportedError", "compile_spec",
           "spec_from_sampling_params", "spec_from_structured_outputs", "take_over_structured_outputs",
           "tokenizer_info_from_vllm", "validate_spec"]
# also GrammaskLogitsProcessor and GrammaskLogitsProcessorV2, built on first access (they import vLLM)

log = logging.getLogger(__name__)

#: the ``SamplingParams.extra_args`` key that carries a request's spec to the worker
EXTRA_ARGS_KEY = "grammask"
KINDS = ("json", "json_object", "regex", "grammar", "choice", "structural_tag")


class VLLMUnsupportedError(InvalidRequestError):
    """A vLLM request field or feature grammask's vLLM adapter does not support; ``param`` names it."""

    def __init__(self, what: str, param: str | None = None):
        self.what = what
        super().__init__(f"grammask's vLLM adapter does not support {what}", param)


# ---------------------------------------------------------------------------------------------- specs
@dataclass(frozen=True)
class GrammarSpec:
    """One constraint, as vLLM carries it: ``kind`` (one of :data:`KINDS`), ``value`` (schema JSON
    text, regex, EBNF, choices as a JSON list, structural tag JSON; "" for ``json_object``) and the
    JSON whitespace rule (``"flexible"``, ``"compact"`` or a regex)."""

    kind: str
    value: str
    whitespace: str = "flexible"

    def to_dict(self) -> dict:
        return {"kind": self.kind, "value": self.value, "whitespace": self.whitespace}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "GrammarSpec":
        if not isinstance(d, Mapping):
            raise InvalidRequestError("extra_args.grammask must be an object", "extra_args.grammask")
        kind = d.get("kind")
        if kind not in KINDS:
            raise InvalidRequestError(f"extra_args.grammask.kind must be one of {', '.join(KINDS)}, not {kind!r}",
                                      "extra_args.grammask.kind")
        value = d.get("value", "")
        if not isinstance(value, str):
            value = json.dumps(value, ensure_ascii=False)
        ws = d.get("whitespace", "flexible")
        if not isinstance(ws, str):
            raise InvalidRequestError("extra_args.grammask.whitespace must be a string", "extra_args.grammask.whitespace")
        if d.get("canonical"):
            # the worker's matchers would need the model tokenizer's canonical structure, which the
            # frontend (where requests are checked) does not have: refused, never silently plain
            raise VLLMUnsupportedError("canonical tokenization (canonical=True)", "extra_args.grammask.canonical")
        unknown = sorted(set(d) - {"kind", "value", "whitespace", "canonical"})
        if unknown:
            raise InvalidRequestError(f"extra_args.grammask has unknown fields: {', '.join(unknown)}",
                                      "extra_args.grammask")
        return cls(kind, value, ws)


def _get(obj, name, default=None):
    return obj.get(name, default) if isinstance(obj, Mapping) else getattr(obj, name, default)


def spec_from_structured_outputs(so) -> GrammarSpec | None:
    """Map vLLM's ``StructuredOutputsParams`` (or an object/dict with its fields) to a
    :class:`GrammarSpec`; None when it sets no constraint. The precedence is vLLM's
    (``get_structured_output_key``): json, json_object, regex, choice, grammar, structural_tag."""
    if so is None:
        return None
    if _get(so, "disable_additional_properties", False):
        raise VLLMUnsupportedError("structured_outputs.disable_additional_properties (a guidance-only option)",
                                   "structured_outputs.disable_additional_properties")
    ws = "flexible"
    if _get(so, "disable_any_whitespace", False):
        ws = "compact"
    if (pat := _get(so, "whitespace_pattern")) is not None:
        ws = pat
    if (js := _get(so, "json")) is not None:
        return GrammarSpec("json", js if isinstance(js, str) else json.dumps(js, ensure_ascii=False), ws)
    if _get(so, "json_object"):
        return GrammarSpec("json_object", "", ws)
    if (rx := _get(so, "regex")) is not None:
        return GrammarSpec("regex", rx)
    if (ch := _get(so, "choice")) is not None:
        return GrammarSpec("choice", ch if isinstance(ch, str) else json.dumps(list(ch), ensure_ascii=False))
    if (gr := _get(so, "grammar")) is not None:
        return GrammarSpec("grammar", gr)
    if (st := _get(so, "structural_tag")) is not None:
        return GrammarSpec("structural_tag", st if isinstance(st, str) else json.dumps(st, ensure_ascii=False))
    return None


def spec_from_sampling_params(params) -> GrammarSpec | None:
    """The request's spec: ``extra_args["grammask"]`` first (set by :func:`take_over_structured_outputs`
    or by the client), else ``structured_outputs``."""
    extra = getattr(params, "extra_args", None) or {}
    if EXTRA_ARGS_KEY in extra:
        return GrammarSpec.from_dict(extra[EXTRA_ARGS_KEY])
    return spec_from_structured_outputs(getattr(params, "structured_outputs", None))


def _choice_grammar(value: str) -> str:
    try:
        choices = json.loads(value)
    except ValueError:
        raise InvalidRequestError("structured_outputs.choice must be a list of strings",
                                  "structured_outputs.choice") from None
    if not isinstance(choices, list) or not choices or not all(isinstance(c, str) for c in choices):
        raise InvalidRequestError("structured_outputs.choice must be a non-empty list of strings",
                                  "structured_outputs.choice")
    # JSON string syntax is also GBNF string-literal syntax (\" \\ \n \t \uXXXX)
    return "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)


def _structural_tag(value: str):
    from ..grammar.structural_tag import TagSpec, TagStructure

    try:
        d = json.loads(value)
    except ValueError as e:
        raise InvalidRequestError(f"structural_tag is not valid JSON: {e}", "structured_outputs.structural_tag") from None
    if isinstance(d, dict) and "format" in d and "structures" not in d:
        raise VLLMUnsupportedError("xgrammar's structural-tag 'format' form (use 'structures' and 'triggers')",
                                   "structured_outputs.structural_tag.format")
    if not isinstance(d, dict) or not isinstance(d.get("structures"), list) or not isinstance(d.get("triggers"), list):
        raise InvalidRequestError("structural_tag must be an object with 'structures' and 'triggers'",
                                  "structured_outputs.structural_tag")
    structures = []
    for i, s in enumerate(d["structures"]):
        if not isinstance(s, dict) or not isinstance(s.get("begin"), str):
            raise InvalidRequestError(f"structures[{i}] needs a string 'begin'", "structured_outputs.structural_tag")
        structures.append(TagStructure(s["begin"], s.get("schema", {}), s.get("end", "")))
    triggers = tuple(d["triggers"])
    for t in triggers:
        if not isinstance(t, str) or not t or not any(s.begin.startswith(t) for s in structures):
            raise InvalidRequestError(f"trigger {t!r} begins no structure", "structured_outputs.structural_tag")
    return TagSpec(tuple(structures), triggers, "auto", True)


def compile_spec(compiler: GrammarCompiler, spec: GrammarSpec):
    """Compile ``spec`` with ``compiler`` (cached there: one compile per distinct spec). Raises the
    compiler's typed errors (:class:`~grammask.errors.GrammarError` subclasses) or
    :class:`InvalidRequestError`."""
    k, v = spec.kind, spec.value
    if k == "json":
        return compiler.compile_json_schema(v, whitespace=spec.whitespace)
    if k == "json_object":
        return compiler.compile_builtin_json_grammar(whitespace=spec.whitespace, object_only=True)
    if k == "regex":
        return compiler.compile_regex(v)
    if k == "grammar":
        return compiler.compile_grammar(v)
    if k == "choice":
        return compiler.compile_grammar(_choice_grammar(v))
    if k == "structural_tag":
        return compiler.compile_structural_tag(_structural_tag(v), whitespace=spec.whitespace)
    raise InvalidRequestError(f"unknown constraint kind {k!r}", "structured_outputs")


_BYTE_COMPILER: GrammarCompiler | None = None
_BYTE_LOCK = threading.Lock()


def validate_spec(spec: GrammarSpec) -> None:
    """Compile ``spec`` over a 256-token byte vocabulary (cheap, cached): syntax errors and
    unsupported constructs raise here, in vLLM's frontend, before the request is admitted."""
    global _BYTE_COMPILER
    with _BYTE_LOCK:
        if _BYTE_COMPILER is None:
            info = TokenizerInfo([bytes([b]) for b in range(256)] + [None], stop_token_ids=[256])
            _BYTE_COMPILER = GrammarCompiler(info, cache_size=256)
    compile_spec(_BYTE_COMPILER, spec)


def take_over_structured_outputs(params) -> GrammarSpec | None:
    """Move the request's constraint from ``params.structured_outputs`` to
    ``params.extra_args["grammask"]`` (after checking it compiles) so that vLLM's own structured
    output backend does not run for it. Returns the spec (None: an unconstrained request)."""
    spec = spec_from_sampling_params(params)
    if spec is None:
        return None
    validate_spec(spec)
    params.extra_args = {**(getattr(params, "extra_args", None) or {}), EXTRA_ARGS_KEY: spec.to_dict()}
    if getattr(params, "structured_outputs", None) is not None:
        params.structured_outputs = None
    return spec


# ---------------------------------------------------------------------------------------------- tokenizer
def tokenizer_info_from_vllm(tokenizer, vocab_size: int | None = None) -> TokenizerInfo:
    """grammask's vocabulary from vLLM's tokenizer (a Hugging Face tokenizer, or vLLM's wrapper of
    one); ``vocab_size`` is the model's (the logits width)."""
    if type(tokenizer).__name__.startswith("Mistral"):
        raise VLLMUnsupportedError("Mistral (tekken) tokenizers", "tokenizer_mode")
    hf = getattr(tokenizer, "tokenizer", None) if not hasattr(tokenizer, "backend_tokenizer") else tokenizer
    src = hf if hf is not None and hasattr(hf, "backend_tokenizer") else tokenizer
    try:
        return TokenizerInfo.from_huggingface(src, vocab_size=vocab_size)
    except GrammaskError:
        raise
    except Exception as e:  # noqa: BLE001
        raise VLLMUnsupportedError(f"the tokenizer {type(tokenizer).__name__} ({type(e).__name__}: {e})",
                                   "tokenizer") from e


# ---------------------------------------------------------------------------------------------- batch state
class _Slot:
    __slots__ = ("matcher", "output", "consumed", "error", "spec")

    def __init__(self, matcher, output, spec):
        self.matcher: GrammarMatcher | None = matcher
        self.output: list[int] | None = output   # vLLM's running output list (a reference), V1
        self.consumed = 0                         # output tokens fed to the matcher
        self.error: str | None = None
        self.spec = spec


def _known(tokens: Sequence[int]) -> int:
    """Length of ``tokens`` without its trailing ``-1`` placeholders (async scheduling)."""
    n = len(tokens)
    while n and tokens[n - 1] == -1:
        n -= 1
    return n


class GrammaskBatch:
    """Per-request matchers keyed by batch row, the batch bitmask and its application: everything
    of the vLLM adapter that does not need vLLM (the processor classes forward to it)."""

    def __init__(self, tokenizer_info: TokenizerInfo, *, max_rows: int = 256,
                 compiler: GrammarCompiler | None = None, threads: int | None = None):
        self.info = tokenizer_info
        self.compiler = compiler or GrammarCompiler(tokenizer_info)
        self.words = bitmask_words(tokenizer_info.vocab_size)
        self.bitmask = np.zeros((max_rows, self.words), np.int32)
        self.slots: dict[int, _Slot] = {}
        threads = threads or max(1, min(8, (os.cpu_count() or 2) // 2))
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="grammask-vllm") if threads > 1 else None
        self._pending: Future | None = None
        self._prefilled: dict[int, tuple[int, int]] = {}   # row -> (id(slot), consumed) at prefetch
        self._device_mask = None

    # ------------------------------------------------------------------ membership
    def add(self, row: int, params, output: list[int] | None = None) -> bool:
        """Start tracking the request at ``row`` (replacing any previous one). Returns whether it is
        constrained. ``output``: vLLM's live output token list (replayed into the matcher)."""
        self._drop_prefetch()
        self.slots.pop(row, None)
        spec = spec_from_sampling_params(params)
        if spec is None:
            return False
        self._grow(row)
        stops = getattr(params, "all_stop_token_ids", None)
        try:
            compiled = compile_spec(self.compiler, spec)
            matcher = GrammarMatcher(compiled, stop_token_ids=sorted(stops) if stops else None)
            slot = _Slot(matcher, output, spec)
        except Exception as e:  # noqa: BLE001 - never take the engine down for one request
            log.error("grammask: the grammar of the request at row %d failed to compile: %s", row, e)
            slot = _Slot(None, output, spec)
            slot.error = f"{type(e).__name__}: {e}"
        self.slots[row] = slot
        if output:
            self.sync(row, output)
        return True

    def remove(self, row: int) -> None:
        self._drop_prefetch()
        self.slots.pop(row, None)

    def move(self, a: int, b: int, swap: bool) -> None:
        self._drop_prefetch()
        sa, sb = self.slots.pop(a, None), self.slots.pop(b, None)
        if sa is not None:
            self.slots[b] = sa
        if swap and sb is not None:
            self.slots[a] = sb

    def update(self, batch_update) -> None:
        """Apply a vLLM ``BatchUpdate`` (duck-typed: ``removed``, ``added`` as ``(row, params,
        prompt_ids, output_ids)``, ``moved`` as ``(a, b, directionality)``), in vLLM's order."""
        if batch_update is None:
            return
        for row in batch_update.removed:
            self.remove(row)
        for row, params, _prompt, output in batch_update.added:
            self.add(row, params, output)
        for a, b, direction in batch_update.moved:
            self.move(a, b, getattr(direction, "name", str(direction)) == "SWAP")

    def _grow(self, row: int) -> None:
        if row >= self.bitmask.shape[0]:
            bm = np.zeros((max(row + 1, 2 * self.bitmask.shape[0]), self.words), np.int32)
            bm[: self.bitmask.shape[0]] = self.bitmask
            self.bitmask = bm

    # ------------------------------------------------------------------ tokens
    def sync(self, row: int, tokens: Sequence[int] | None = None) -> None:
        """Bring the row's matcher to ``tokens`` (default: its live output list): accept the new
        ones; when the list got shorter, roll back (reset and replay past the rollback history)."""
        slot = self.slots[row]
        toks = slot.output if tokens is None else tokens
        if toks is None or slot.matcher is None:
            return
        n = _known(toks)
        m = slot.matcher
        if n < slot.consumed:
            back = slot.consumed - n
            try:
                m.rollback(back)
                slot.consumed = n
            except MatcherError:
                m.reset()
                slot.consumed = 0
                slot.error = None
        for i in range(slot.consumed, n):
            t = int(toks[i])
            if slot.error is None and not m.is_terminated() and not m.accept_token(t):
                slot.error = f"token {t} at output position {i} rejected by the grammar"
                log.error("grammask: row %d: %s", row, slot.error)
        slot.consumed = n

    # ------------------------------------------------------------------ masks
    def _fill_one(self, row: int) -> None:
        slot = self.slots[row]
        words = self.bitmask[row].view(np.uint32)
        if slot.matcher is None:
            words[:] = 0   # failed compile: stop tokens only
            for t in self.info.stop_token_ids:
                if 0 <= t < self.info.vocab_size:
                    words[t >> 5] |= np.uint32(1 << (t & 31))
        elif slot.matcher.is_terminated():
            words[:] = np.uint32(0xFFFFFFFF)   # as vLLM: a finished grammar constrains nothing
        else:
            slot.matcher.fill_words(words)

    def fill(self, rows: Sequence[int]) -> None:
        """Fill the bitmask rows of ``rows`` (worker threads when there are several)."""
        rows = list(rows)
        if len(rows) > 1 and self._pool is not None:
            list(self._pool.map(self._fill_one, rows))
        else:
            for r in rows:
                self._fill_one(r)

    def prefetch(self) -> bool:
        """Before the forward pass: when every constrained row's output is complete (no async
        placeholder), sync the matchers and start filling the masks in the pool. Returns whether
        it started."""
        self._drop_prefetch()
        if not self.slots or self._pool is None:
            return False
        for slot in self.slots.values():
            if slot.output is None or (slot.output and slot.output[-1] == -1):
                return False
        for row in self.slots:
            self.sync(row)
        rows = sorted(self.slots)
        self._prefilled = {r: (id(self.slots[r]), self.slots[r].consumed) for r in rows}
        self._pending = self._pool.submit(self.fill, rows)
        return True

    def _drop_prefetch(self) -> None:
        if self._pending is not None:
            self._pending.result()
            self._pending = None
        self._prefilled = {}

    def compute(self, rows_tokens: Mapping[int, Sequence[int]] | None = None) -> list[int]:
        """Sync every row (from its output list, or from ``rows_tokens``) and fill the masks not
        already filled by :meth:`prefetch`. Returns the constrained rows, sorted."""
        pending, prefilled = self._pending, self._prefilled
        self._pending, self._prefilled = None, {}
        if pending is not None:
            pending.result()
        for row in self.slots:
            self.sync(row, None if rows_tokens is None else rows_tokens.get(row))
        rows = sorted(self.slots)
        stale = [r for r in rows if prefilled.get(r) != (id(self.slots[r]), self.slots[r].consumed)]
        self.fill(stale)
        return rows

    def apply(self, logits, rows_tokens: Mapping[int, Sequence[int]] | None = None,
              rows: Sequence[int] | None = None):
        """Mask ``logits`` ``[num_rows, V']`` in place: row ``r`` with the mask of the request at
        row ``r``; unconstrained rows are left alone. ``rows`` restricts to rows present this
        step (V2: the slots of the batch, already mapped to logits rows by the caller)."""
        constrained = self.compute(rows_tokens)
        if rows is not None:
            present = set(rows)
            constrained = [r for r in constrained if r in present]
        constrained = [r for r in constrained if r < logits.shape[0]]
        if not constrained:
            return logits
        n = max(constrained) + 1
        bm = self.bitmask[:n]
        if hasattr(logits, "device") and getattr(logits.device, "type", "cpu") != "cpu":
            import torch

            bm = torch.from_numpy(bm).to(logits.device, non_blocking=False)
        apply_token_bitmask_inplace(logits, bm, vocab_size=self.info.vocab_size, indices=constrained)
        return logits

    def close(self) -> None:
        self._drop_prefetch()
        if self._pool is not None:
            self._pool.shutdown(wait=False)


# ---------------------------------------------------------------------------------------------- vLLM classes
def _validate_params(cls, sampling_params) -> None:
    take_over_structured_outputs(sampling_params)


def _setup(vllm_config) -> GrammaskBatch:
    from vllm.tokenizers import cached_tokenizer_from_config

    if getattr(vllm_config, "speculative_config", None):
        raise VLLMUnsupportedError("speculative decoding", "speculative_config")
    model_config = vllm_config.model_config
    tokenizer = cached_tokenizer_from_config(model_config=model_config)
    info = tokenizer_info_from_vllm(tokenizer, model_config.get_vocab_size())
    return GrammaskBatch(info, max_rows=vllm_config.scheduler_config.max_num_seqs)


def _warm_up_kernel(vllm_config, device, vocab_size: int | None = None) -> None:
    """Compile the CUDA bitmask kernel for this model's logits now, not at the first requests (V1
    hands logits processors float32 logits; the model's dtype too, in case). ``vocab_size``: the
    tokenizer's, as :meth:`GrammaskBatch.apply` passes it."""
    if getattr(device, "type", str(device).split(":")[0]) != "cuda":
        return
    try:
        import torch

        from ..grammar.kernels.triton_kernel import warm_up

        dtype = getattr(vllm_config.model_config, "dtype", None)
        dtypes = (torch.float32,) + ((dtype,) if isinstance(dtype, torch.dtype) else ())
        warm_up(device, vllm_config.model_config.get_vocab_size(), dtypes, vocab_size)
    except Exception as e:  # noqa: BLE001 - a cold kernel only costs time
        log.warning("grammask: the CUDA bitmask kernel was not compiled ahead: %s", e)


def _build_v1():
    from vllm.v1.sample.logits_processor import LogitsProcessor

    class GrammaskLogitsProcessor(LogitsProcessor):
        """grammask constraints for vLLM's V1 model runner (see the module docstring)."""

        validate_params = classmethod(_validate_params)

        def __init__(self, vllm_config, device, is_pin_memory: bool) -> None:
            self.batch = _setup(vllm_config)
            self.device = device
            _warm_up_kernel(vllm_config, device, self.batch.info.vocab_size)

        def is_argmax_invariant(self) -> bool:
            return False

        def update_state(self, batch_update) -> None:
            self.batch.update(batch_update)
            self.batch.prefetch()

        def apply(self, logits):
            return self.batch.apply(logits)

    GrammaskLogitsProcessor.__module__ = __name__
    return GrammaskLogitsProcessor


def _build_v2():
    try:
        from vllm.v1.worker.gpu.sample.logits_processor import LogitsProcessor
    except ImportError as e:
        import vllm

        raise ImportError(
            f"vLLM {vllm.__version__} has no logits-processor interface for its V2 model runner "
            "(vllm.v1.worker.gpu.sample.logits_processor): it runs custom logits processors on the "
            "V1 runner, so name grammask.adapters.vllm:GrammaskLogitsProcessor") from e

    class GrammaskLogitsProcessorV2(LogitsProcessor):
        """grammask constraints for vLLM's V2 model runner (see the module docstring)."""

        validate_params = classmethod(_validate_params)

        def __init__(self, vllm_config, req_states) -> None:
            self.batch = _setup(vllm_config)
            self.req_states = req_states

        def add_request(self, req_idx: int, sampling_params) -> bool:
            return self.batch.add(req_idx, sampling_params, None)

        def _tokens(self, slot: int, start: int, end: int) -> list[int]:
            t = self.req_states.all_token_ids
            host = getattr(t, "np", None)
            if host is not None:
                return host[slot, start:end].tolist()
            return t.gpu[slot, start:end].tolist()

        def _prompt_len(self, slot: int) -> int:
            p = self.req_states.prompt_len
            host = getattr(p, "np", None)
            return int(host[slot]) if host is not None else int(p.gpu[slot].item())

        def apply(self, logits, ctx):
            slots = [int(s) for s in ctx.idx_mapping_np]
            if logits.shape[0] != len(slots):
                raise VLLMUnsupportedError("speculative decoding", "speculative_config")
            mine = {s: b for b, s in enumerate(slots) if s in self.batch.slots}
            if not mine:
                return logits
            toks = {s: self._tokens(s, self._prompt_len(s), int(ctx.seq_lens_upper_bound_np[b]))
                    for s, b in mine.items()}
            # batch rows <- slots: fill by slot, then apply row by row through a gathered view
            self.batch.compute(toks)
            import torch

            order = sorted(mine, key=mine.get)
            bm = torch.from_numpy(self.batch.bitmask[order]).to(logits.device)
            rows = torch.tensor([mine[s] for s in order], device=logits.device)
            sub = logits.index_select(0, rows)
            apply_token_bitmask_inplace(sub, bm, vocab_size=self.batch.info.vocab_size)
            logits.index_copy_(0, rows, sub)
            return logits

    GrammaskLogitsProcessorV2.__module__ = __name__
    return GrammaskLogitsProcessorV2


_BUILT: dict[str, type] = {}


def __getattr__(name: str):
    """``GrammaskLogitsProcessor`` / ``GrammaskLogitsProcessorV2`` subclass vLLM's base classes, so
    they are built on first access (importing vLLM then, never at this module's import)."""
    builders = {"GrammaskLogitsProcessor": _build_v1, "GrammaskLogitsProcessorV2": _build_v2}
    if name not in builders:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if name not in _BUILT:
        _BUILT[name] = builders[name]()
    return _BUILT[name]
