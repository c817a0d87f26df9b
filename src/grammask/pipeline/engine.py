"""AsyncEngine: an anyio chat engine with grammar-constrained decoding and an OpenAI-shaped client API (docs/engine.md).

::

    engine = await create_engine()                 # grammask.adapters.models: embedded SmolLM2-135M-Instruct
    engine = await AsyncEngine.create(backend)     # or over a ready ModelBackend
    r = await engine.chat.completions.create(messages=[...], response_format={"type": "json_object"})
    async for chunk in await engine.chat.completions.create(messages=[...], stream=True): ...
    engine.interrupt(request_id)
    await engine.aclose()

How a request runs
------------------
1. The request is validated (pydantic; :class:`InvalidRequestError` / :class:`GrammarError`
   before anything else happens), the prompt tokenized, one backend sequence made per choice.
2. *Admission*: the grammar is compiled (or taken from the LRU cache) in a worker thread while the
   prompt is prefilled (anyio task group); a compile error fails the request cleanly.
   A request gets its backend sequences (caches) when it is admitted: at most ``max_running``
   sequences at once; the others wait in a FIFO of at most ``max_queue`` requests (past it:
   :class:`~.scheduler.QueueFullError`, the server's 503) and are admitted as slots free.
3. *Steps*: there is no background task. Whoever waits for progress (a ``create`` call, a stream's
   ``__anext__``) runs the next step if none is running, otherwise waits for it; each step's batch
   is chosen by :func:`~.scheduler.plan_step` (at most ``max_batch`` sequences and
   ``max_tokens_per_step`` tokens: decode tokens first, least recently served first, then prefill
   chunks of the oldest prompts: chunked prefill), so concurrent requests progress together and
   no request starves (bound in ``pipeline/scheduler.py``). A step:
   the forward pass of all pending tokens (one batched ``backend.forward`` in a worker thread) and
   the mask filling of all grammar-constrained choices (worker thread, Numba releases the GIL) run
   at the same time; then, in a worker thread: masks applied to the logits on their device,
   ``logit_bias``, penalties, temperature/top-p/top-k, seeded sampling, ``accept_token`` (a
   rejected token ends the request with :class:`GenerationError`, never unconstrained output),
   stop tokens/strings, length, and fast-forward (canonical forced tokens fed in the next forward).
   A request's ``canonical`` (or ``response_format.canonical``; default: the engine's) chooses a
   canonical-tokenization matcher for it; the compiled grammar is the same either way (one cache
   entry), only the per-request matcher differs.
   Steps are shielded from cancellation, so a cancelled caller never leaves a half-done step.
4. ``interrupt``, closing a stream, or cancelling ``create`` ends the request at once
   (``finish_reason="abort"``); its sequences are released when no step is running.
"""
from __future__ import annotations

import inspect
import json
import os
import threading
import time
import uuid
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable

import anyio
import anyio.lowlevel
import numpy as np
import torch

from ..errors import (
    CanonicalTokenizationError,
    EngineClosedError,
    GenerationError,
    GrammarError,
    GrammarTooComplexError,
    GrammaskError,
    InvalidRequestError,
)
from ..grammar.bitmask import apply_token_bitmask_inplace, bitmask_words
from ..grammar.compiler import GrammarCompiler
from ..grammar.matcher import GrammarMatcher
from .fast_forward import forced_tokens, token_index
from .gc_heap import freeze_gc_heap
from .protocol import (
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionMessage,
    ChatCompletionRequest,
    Choice,
    ChoiceDelta,
    ChoiceLogprobs,
    ChunkChoice,
    CompletionUsage,
    FunctionCall,
    TokenLogprob,
    ToolCall,
    ToolCallDelta,
    TopLogprob,
    UsageExtra,
    parse_request,
)
from .response_format import GrammarSpec, compile_spec, grammar_spec
from .scheduler import AdmissionQueue, plan_step
from .sampling import SampleResult, Sampler, SamplingParams
from .streaming import TextAssembler
from .structural_tag import TOOL_TRIGGER, new_tool_call_id, parse_tool_calls, tools_system_prompt

_ABANDON = ({"abandon_on_cancel": True}
            if "abandon_on_cancel" in inspect.signature(anyio.to_thread.run_sync).parameters
            else {"cancellable": True})


# ---------------------------------------------------------------------------------------------- state
@dataclass(eq=False)
class _Choice:
    index: int
    request: "_Request"
    seq: Any            # None while the request waits for admission
    sampler: Sampler
    text: TextAssembler
    max_new: int
    pending: list[int] = field(default_factory=list)
    logits: Any = None
    matcher: GrammarMatcher | None = None
    generated: list[int] = field(default_factory=list)
    n_forced: int = 0
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None
    incomplete: bool = False
    prefilled: bool = False
    released: bool = False
    served: int = 0     # the last step that fed it (its admission step before that): decode order
    # stream cursors
    role_sent: bool = False
    cursor: int = 0
    lp_cursor: int = 0
    finish_sent: bool = False

    @property
    def ready(self) -> bool:
        """May sample: no grammar, or its matcher is there."""
        return self.request.spec is None or self.matcher is not None


@dataclass(eq=False)
class _Request:
    id: str
    req: ChatCompletionRequest
    spec: GrammarSpec | None
    prompt_ids: list[int]
    fast_forward: bool
    created: int
    t_start: float
    choices: list[_Choice] = field(default_factory=list)
    error: BaseException | None = None
    aborted: bool = False
    t_first: float | None = None
    t_end: float | None = None
    prefill_span: tuple[float, float] | None = None
    compile_span: tuple[float, float] | None = None
    cache_hit: bool = False
    grammar_init_s: float = 0.0
    grammar_s: float = 0.0
    grammar_steps: int = 0
    forward_s: float = 0.0
    mask_s: float = 0.0
    usage_sent: bool = False
    #: canonical-tokenization matchers (the request's ``canonical``, else the engine's default)
    canonical: bool = False
    #: their plain mask at a canonical dead end (``canonical_fallback``; else the request fails there)
    canonical_fallback: bool = False

    @property
    def done(self) -> bool:
        return self.error is not None or self.aborted or all(c.finish_reason is not None for c in self.choices)


# ---------------------------------------------------------------------------------------------- engine
class AsyncEngine:
    """See the module docstring. Build with :meth:`create` (or the constructor, given a backend)."""

    def __init__(self, backend, *, cache_size: int = 64, fast_forward: bool = True, max_batch: int = 32,
                 max_tokens_per_step: int | None = 512, max_running: int | None = None,
                 max_queue: int | None = 256, trace: bool = False, json_whitespace: str = "flexible",
                 parallel_masks: bool = True, overlap_masks: bool | None = None, canonical: bool = False,
                 canonical_fallback: bool = False):
        self.backend = backend
        self.tokenizer_info = backend.tokenizer_info
        self.model_name = getattr(backend, "name", "model")
        # the one grammar cache is the compiler's: requests are cached under their spec's key
        self.compiler = GrammarCompiler(self.tokenizer_info, cache_size=cache_size)
        self.grammar_cache = self.compiler.cache
        self.fast_forward = fast_forward
        self.max_batch = max(1, max_batch)
        if max_tokens_per_step is not None and max_tokens_per_step < 1:
            raise ValueError("max_tokens_per_step must be >= 1 (or None: unlimited)")
        self.max_tokens_per_step = max_tokens_per_step
        # sequences holding a backend cache, and the bounded FIFO of requests waiting for one
        # a backend with a fixed number of sequence slots (llama.cpp's n_seq_max) bounds max_running:
        # requests past it wait in the queue instead of failing on a slot the backend does not have
        slots = getattr(backend, "max_sequences", None)
        if max_running is None:
            max_running = self.max_batch if slots is None else min(self.max_batch, int(slots))
        elif slots is not None and max_running > int(slots):
            raise ValueError(f"max_running {max_running} exceeds the backend's {int(slots)} sequence slots")
        self.admission = AdmissionQueue(max_running, max_queue)
        self.json_whitespace = json_whitespace
        # canonical=True: every request's matcher allows only canonical token sequences (README,
        # "Canonical tokenization"); raises CanonicalTokenizationError here for a tokenizer it cannot cover
        # a request's ``canonical`` overrides it (checked when the request arrives: _check_canonical)
        self._canonical_lock = threading.Lock()
        self._canonical_error: BaseException | None = None
        self._canonical_ready = False
        self.canonical = bool(canonical)
        #: default of a request's ``canonical_fallback`` (GrammarMatcher's: the plain mask at a
        #: canonical dead end, counted in ``usage.extra.canonical_fallbacks``)
        self.canonical_fallback = bool(canonical_fallback)
        if self.canonical:
            self._check_canonical()
        self.trace: deque | None = deque(maxlen=100_000) if trace else None
        self._eos = frozenset(int(t) for t in backend.eos_token_ids)
        nv = self.tokenizer_info.vocab_size
        self._matcher_stops = [t for t in backend.eos_token_ids if 0 <= t < nv]
        self._requests: dict[str, _Request] = {}
        self._stepping = False
        self._closed = False
        self._changed = anyio.Event()
        self._arrival_tail: anyio.Event | None = None   # the latest request being parsed (_arrive)
        self._step_no = 0   # decode steps taken (trace entries of one step share it)
        # masks are computed while the forward runs, unless the backend's forward keeps every core busy
        # (llama.cpp with a thread per core: a third busy thread stalls its threads at every barrier,
        # measured 11.1 -> 11.6 ms per forward); then they run just before it (None: the backend says)
        self.overlap_masks = (not getattr(backend, "saturates_cpu", False)) if overlap_masks is None else overlap_masks
        self._pool = ThreadPoolExecutor(max_workers=max(1, min(8, os.cpu_count() or 1)),
                                        thread_name_prefix="grammask-masks") if parallel_masks else None
        self._compile_fn: Callable[[GrammarSpec, GrammarCompiler], Any] = compile_spec
        self.chat = _Chat(self)
        #: objects frozen out of the garbage collector's full collections at the start (create(freeze_gc=True))
        self.gc_frozen = 0

    # ------------------------------------------------------------------ construction
    @classmethod
    async def create(cls, backend=None, *, warmup: bool = True, freeze_gc: bool = False,
                     **kwargs) -> "AsyncEngine":
        """An engine over ``backend`` (a :class:`~.backend.ModelBackend`), warmed up in a worker
        thread. Loading a model (the embedded SmolLM2-135M-Instruct, a GGUF file or model folder,
        a Hugging Face id) is the adapters' job: :func:`grammask.adapters.models.create_engine`.

        ``freeze_gc=True``: once started (and warmed up), freeze the process's heap out of the
        cyclic garbage collector's full collections (:func:`.gc_heap.freeze_gc_heap`), so that
        they stop stalling decode steps; for a process that serves (``grammask serve`` sets it)."""
        if backend is None or isinstance(backend, (str, os.PathLike)):
            raise TypeError("AsyncEngine.create needs a model backend; load a model by name or path with "
                            "grammask.adapters.models.create_engine(model, device=...)")
        engine = cls(backend, **kwargs)
        if warmup:
            await anyio.to_thread.run_sync(engine._warmup)
        if freeze_gc:
            engine.gc_frozen = freeze_gc_heap()
        return engine

    def _warmup(self) -> None:
        """Build the tokenizer's trie and slice forest, JIT-load the kernels and warm the backend (once)."""
        with self.compiler.uncached():  # not a request: leaves the cache and its statistics alone
            cg = self.compiler.compile_builtin_json_grammar(object_only=True)
        m = GrammarMatcher(cg, stop_token_ids=self._matcher_stops)
        bm = np.zeros((1, bitmask_words(self.tokenizer_info.vocab_size)), np.int32)
        m.fill_next_token_bitmask(bm, 0)
        token_index(self.tokenizer_info)
        warm = getattr(self.backend, "warmup", None)  # the backend's own one-time measurements
        if callable(warm):
            warm()

    async def aclose(self) -> None:
        """Abort every request, wait for the running step, release everything."""
        if self._closed:
            return
        self._closed = True
        for rid in list(self._requests):
            self.interrupt(rid)
        while self._stepping:
            await self._changed.wait()
        self._cleanup()
        if self._pool is not None:
            self._pool.shutdown(wait=False)
        close = getattr(self.backend, "close", None)
        if callable(close):
            close()
        self._notify()

    async def __aenter__(self) -> "AsyncEngine":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()

    @property
    def active_requests(self) -> list[str]:
        return list(self._requests)

    @property
    def scheduler_stats(self) -> dict:
        """Sequences holding a cache, requests waiting for admission, the most seen waiting, refusals."""
        return self.admission.stats()

    # ------------------------------------------------------------------ control
    def interrupt(self, request_id: str) -> bool:
        """Stop a request now (``finish_reason="abort"``); False if it is unknown or finished."""
        r = self._requests.get(request_id)
        if r is None or r.done:
            return False
        self._abort(r)
        return True

    def _abort(self, r: _Request) -> None:
        _mark_aborted(r)
        self._cleanup()
        self._notify()

    def _notify(self) -> None:
        ev, self._changed = self._changed, anyio.Event()
        ev.set()

    def _cleanup(self) -> None:
        """Release the sequences of finished, failed or aborted choices (never during a step)."""
        if self._stepping:
            return
        for rid, r in list(self._requests.items()):
            for c in r.choices:
                if not c.released and (c.finish_reason is not None or r.error is not None or r.aborted):
                    c.released = True
                    if c.seq is None:  # never admitted
                        continue
                    self.admission.release(1)
                    try:
                        self.backend.release(c.seq)
                    except Exception:  # pragma: no cover - a backend bug must not wedge the engine
                        pass
            if r.done:
                if r.t_end is None:
                    r.t_end = time.perf_counter()
                self.admission.discard(r)
                del self._requests[rid]
        self._admit_waiting()

    def _admit_waiting(self) -> None:
        """Give the waiting requests that fit now their sequences (never during a step)."""
        if self._stepping or self._closed:
            return
        admitted = self.admission.admit()
        for k, r in enumerate(admitted):
            try:
                for c in r.choices:
                    c.seq = self.backend.new_sequence()
                    c.pending = list(r.prompt_ids)
                    c.served = self._step_no
            except Exception as e:
                err = GenerationError(f"the backend could not make a sequence: {type(e).__name__}: {e}", r.id)
                err.__cause__ = e
                r.error = err
                for c in r.choices:  # the slots counted for sequences never made
                    if c.seq is None:
                        c.released = True
                        self.admission.release(1)
        if admitted:
            self._notify()

    # ------------------------------------------------------------------ requests
    async def _create(self, request=None, **kwargs):
        if self._closed:
            raise EngineClosedError("the engine is closed")
        self._cleanup()  # e.g. streams dropped without aclose()
        r, req, spec = await self._arrive(request, kwargs)
        try:
            if spec is not None:
                await self._admit(r)
            if req.stream:
                return ChatCompletionStream(self, r)
            await self._drive(r, lambda: r.done)
            if r.error is not None:
                raise r.error
            return self._completion(r)
        except BaseException:
            if not r.done:
                self._abort(r)
            raise

    def _parse(self, request, kwargs) -> tuple[ChatCompletionRequest, GrammarSpec | None]:
        """The request validated and the grammar it asks for (in a worker thread: see _arrive)."""
        req = parse_request(request, **kwargs)
        try:
            spec = grammar_spec(req, whitespace=self.json_whitespace)
        except RecursionError:  # a schema nested deeper than its checks (or canonical form) can recurse
            raise GrammarTooComplexError("the response format's schema is nested too deeply to check and "
                                         "compile") from None
        if spec is not None and self._wants_canonical(req):
            self._check_canonical()   # CanonicalTokenizationError before anything is queued
        return req, spec

    def _wants_canonical(self, req: ChatCompletionRequest) -> bool:
        c = req.canonical_requested
        return self.canonical if c is None else bool(c)

    def _check_canonical(self) -> None:
        """Build this tokenizer's canonical side once (the first canonical request, or the engine's
        ``canonical=True``), or raise the :class:`CanonicalTokenizationError` saying why it cannot
        be built (remembered: later requests fail at once with the same error)."""
        if self._canonical_ready:
            return
        with self._canonical_lock:
            if self._canonical_error is None and not self._canonical_ready:
                from ..grammar.canonical import canonical_tokenizer

                try:
                    canonical_tokenizer(self.tokenizer_info)
                except CanonicalTokenizationError as e:
                    self._canonical_error = e
                else:
                    self._canonical_ready = True
            err = self._canonical_error
        if err is not None:
            raise CanonicalTokenizationError(str(err), reason=getattr(err, "reason", None))

    async def _arrive(self, request, kwargs):
        """Parse and check a request off the event loop (checking a 1 MiB schema against the JSON
        Schema meta-schema and writing its canonical form takes seconds; the loop keeps serving
        the other requests meanwhile), then queue it in arrival order: each arrival waits for
        the one before it to be queued (or to fail) before its own turn."""
        prev, mine = self._arrival_tail, anyio.Event()
        self._arrival_tail = mine
        try:
            req, spec = await anyio.to_thread.run_sync(self._parse, request, kwargs)
            if prev is not None:
                await prev.wait()
            if self._closed:
                raise EngineClosedError("the engine is closed")
            r = self._new_request(req, spec)
            self.admission.submit(r, len(r.choices))  # QueueFullError past max_queue: nothing to undo
            self._requests[r.id] = r
            self._admit_waiting()
            self._notify()
            return r, req, spec
        finally:
            mine.set()

    def _new_request(self, req: ChatCompletionRequest, spec: GrammarSpec | None) -> _Request:
        rid = req.request_id or "chatcmpl-" + uuid.uuid4().hex
        if rid in self._requests:
            raise InvalidRequestError(f"request id {rid!r} is already running", param="request_id")
        messages = [m.to_template_dict() for m in req.messages]
        if req.tools_active:
            tool_text = tools_system_prompt(req.tools)
            if messages and messages[0]["role"] == "system":
                messages[0] = {**messages[0], "content": messages[0]["content"] + "\n\n" + tool_text}
            else:
                messages.insert(0, {"role": "system", "content": tool_text})
        prompt = list(self.backend.apply_chat_template(messages, add_generation_prompt=True))
        ctx = int(self.backend.max_context)
        if len(prompt) >= ctx:
            raise InvalidRequestError(f"the prompt has {len(prompt)} tokens; the model's context is {ctx}",
                                      param="messages")
        if req.n > self.admission.max_running:
            raise InvalidRequestError(f"n={req.n} exceeds the engine's max_running {self.admission.max_running}",
                                      param="n")
        room = ctx - len(prompt)
        limit = req.completion_limit
        max_new = room if limit is None else min(limit, room)
        params = SamplingParams.from_request(req)
        samplers = [Sampler(params, int(self.backend.vocab_size),
                            seed=None if req.seed is None else req.seed + i) for i in range(req.n)]
        ff = self.fast_forward if req.fast_forward is None else req.fast_forward
        r = _Request(rid, req, spec, prompt, ff, int(time.time()), time.perf_counter(),
                     canonical=spec is not None and self._wants_canonical(req),
                     canonical_fallback=self.canonical_fallback if req.canonical_fallback is None
                     else req.canonical_fallback)
        triggers = [TOOL_TRIGGER] if req.tools_active else []
        for i in range(req.n):
            c = _Choice(i, r, None, samplers[i], TextAssembler(req.stop, triggers), max_new)
            r.choices.append(c)
        return r

    async def _admit(self, r: _Request) -> None:
        """Compile the grammar in a worker thread while the prompt is prefilled."""
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._compile, r)
            tg.start_soon(self._drive, r, lambda: all(c.prefilled for c in r.choices))
        if r.error is not None:
            self._cleanup()
            raise r.error

    async def _compile(self, r: _Request) -> None:
        key = r.spec.key(self.tokenizer_info.cache_key)
        n = len(r.choices)

        def work():
            t0 = time.perf_counter()
            cg, hit = self.compiler.get_or_compile(key, lambda: self._compile_fn(r.spec, self.compiler))
            matchers = [GrammarMatcher(cg, stop_token_ids=self._matcher_stops, canonical=r.canonical,
                                       canonical_fallback=r.canonical_fallback) for _ in range(n)]
            return matchers, hit, t0, time.perf_counter()

        try:
            matchers, hit, t0, t1 = await anyio.to_thread.run_sync(work, **_ABANDON)
        except GrammaskError as e:
            r.error = e
        except Exception as e:  # a bug in a front end still fails the request cleanly
            err = GrammarError(f"internal error compiling the grammar: {type(e).__name__}: {e}")
            err.__cause__ = e
            r.error = err
        else:
            r.compile_span = (t0, t1)
            r.grammar_init_s = t1 - t0
            r.cache_hit = hit
            self._trace("compile", t0, t1, request_id=r.id, cache_hit=hit)
            for c, m in zip(r.choices, matchers):
                c.matcher = m
        self._notify()

    async def _drive(self, r: _Request, until: Callable[[], bool]) -> None:
        """Make progress (running steps when nobody else is) until ``until()`` or ``r`` ends."""
        while True:
            if until() or r.done:
                return
            if self._closed and not self._stepping:
                raise EngineClosedError("the engine is closed")
            if not self._stepping and self._has_work():
                self._stepping = True
                try:
                    with anyio.CancelScope(shield=True):
                        await self._step()
                finally:
                    self._stepping = False
                    self._cleanup()
                    self._notify()
                # a cancellation point between steps: a cancelled caller stops here (its request
                # is aborted by the caller's cleanup), the step itself is never cut in half
                await anyio.lowlevel.checkpoint()
                continue
            await self._changed.wait()

    def _has_work(self) -> bool:
        for r in self._requests.values():
            if r.error is not None or r.aborted:
                continue
            for c in r.choices:
                if c.finish_reason is None and (c.pending or (c.logits is not None and c.ready)):
                    return True
        return False

    # ------------------------------------------------------------------ one step
    def _trace(self, kind: str, start: float, end: float, **kw) -> None:
        if self.trace is not None:
            self.trace.append({"kind": kind, "start": start, "end": end, **kw})

    async def _step(self) -> None:
        active = [c for r in self._requests.values() if r.error is None and not r.aborted for c in r.choices
                  if c.finish_reason is None and c.seq is not None]
        plan = plan_step(active, max_batch=self.max_batch, budget=self.max_tokens_per_step)
        if not plan.feed and not plan.sample:
            return
        self._step_no += 1
        step = self._step_no
        fwd = [c for c, _n in plan.feed]
        tokens = [list(c.pending[:n]) for c, n in plan.feed]
        samp = plan.sample
        masked = [c for c in samp if c.matcher is not None]
        bitmask = np.empty((len(masked), bitmask_words(self.tokenizer_info.vocab_size)), np.int32) if masked else None
        out: dict[str, Any] = {}

        async def forward():
            t0 = time.perf_counter()
            try:
                out["logits"] = await anyio.to_thread.run_sync(self.backend.forward, [c.seq for c in fwd], tokens)
            except Exception as e:
                out["forward_error"] = e
            out["forward_span"] = (t0, time.perf_counter())

        async def masks():
            out["masks"] = await anyio.to_thread.run_sync(self._fill_masks, [c.matcher for c in masked], bitmask)

        if not self.overlap_masks:
            if masked:
                await masks()
            if fwd:
                await forward()
        else:
            async with anyio.create_task_group() as tg:
                if fwd:
                    tg.start_soon(forward)
                if masked:
                    tg.start_soon(masks)

        if fwd:
            t0, t1 = out["forward_span"]
            self._trace("forward", t0, t1, step=step, request_ids=sorted({c.request.id for c in fwd}),
                        n_seqs=len(fwd), n_tokens=sum(len(t) for t in tokens),
                        prefill_ids=sorted({c.request.id for c in fwd if not c.prefilled}))
            err = out.get("forward_error")
            for reqs in {c.request for c in fwd}:
                reqs.forward_s += t1 - t0
            if err is not None:
                for c in fwd:
                    if c.request.error is None:
                        e = GenerationError(f"the model's forward pass failed: {type(err).__name__}: {err}",
                                            c.request.id)
                        e.__cause__ = err
                        c.request.error = e
            else:
                logits = out["logits"]
                for i, c in enumerate(fwd):
                    c.served = step
                    c.pending = c.pending[len(tokens[i]):]
                    if not c.pending:  # a partial chunk's logits are not a next-token distribution
                        c.logits = logits[i]
                    if not c.prefilled:
                        r = c.request
                        r.prefill_span = (t0, t1) if r.prefill_span is None else (min(r.prefill_span[0], t0), t1)
                        c.prefilled = not c.pending
        if masked:
            times, errors, m0, m1 = out["masks"]
            self._trace("mask", m0, m1, step=step, n_rows=len(masked),
                        request_ids=sorted({c.request.id for c in masked}))
            for j, c in enumerate(masked):
                c.request.mask_s += times[j]
                c.request.grammar_s += times[j]
                if errors[j] is not None and c.request.error is None:
                    e = GenerationError(f"mask computation failed: {errors[j]}", c.request.id)
                    e.__cause__ = errors[j]
                    c.request.error = e
        samp = [c for c in samp if c.request.error is None and not c.request.aborted and c.finish_reason is None
                and c.logits is not None]
        if not samp:
            return
        row_of = {id(c): j for j, c in enumerate(masked)}
        t0 = time.perf_counter()
        await anyio.to_thread.run_sync(self._sample_all, samp, bitmask, row_of)
        self._trace("sample", t0, time.perf_counter(), step=step, n_rows=len(samp))

    def _fill_masks(self, matchers: list[GrammarMatcher], bitmask: np.ndarray):
        n = len(matchers)
        times = [0.0] * n
        errors: list[BaseException | None] = [None] * n
        t0 = time.perf_counter()

        def one(i: int) -> None:
            s = time.perf_counter()
            try:
                matchers[i].fill_next_token_bitmask(bitmask, i)
            except Exception as e:
                errors[i] = e
            times[i] = time.perf_counter() - s

        if n > 1 and self._pool is not None:
            list(self._pool.map(one, range(n)))
        else:
            for i in range(n):
                one(i)
        return times, errors, t0, time.perf_counter()

    def _sample_all(self, samp: list[_Choice], bitmask, row_of: dict[int, int]) -> None:
        """Apply masks, sample and advance every choice (worker thread)."""
        nv = self.tokenizer_info.vocab_size
        L = torch.stack([c.logits for c in samp]).float()
        if L.shape[1] > nv:
            L[:, nv:] = float("-inf")  # padded ids: never a token
        if any(c.matcher is not None for c in samp):
            # one bitmask row per logits row (all ones where there is no grammar)
            bm = np.full((len(samp), bitmask.shape[1]), -1, np.int32)
            for i, c in enumerate(samp):
                if c.matcher is not None:
                    bm[i] = bitmask[row_of[id(c)]]
            apply_token_bitmask_inplace(L, torch.from_numpy(bm), vocab_size=nv)
        for i, c in enumerate(samp):
            r = c.request
            if c.finish_reason is not None or r.error is not None or r.aborted:
                continue
            try:
                self._advance(c, L[i])
            except GrammaskError as e:
                if isinstance(e, GenerationError) and e.request_id is None:
                    e.request_id = r.id
                r.error = e
            except Exception as e:
                err = GenerationError(f"internal error while sampling: {type(e).__name__}: {e}", r.id)
                err.__cause__ = e
                r.error = err

    def _advance(self, c: _Choice, row: torch.Tensor) -> None:
        r = c.request
        req = r.req
        if req.ignore_eos and self._eos:
            row[list(self._eos)] = float("-inf")
        res = c.sampler.sample(row)
        tok = res.token
        c.logits = None
        m = c.matcher
        g0 = time.perf_counter()
        if m is not None and not m.accept_token(tok):
            raise GenerationError(f"internal error: the grammar rejected sampled token {tok} "
                                  f"({self.tokenizer_info.token_bytes[tok]!r}) although the mask allowed it", r.id)
        g = time.perf_counter() - g0
        if r.t_first is None:
            r.t_first = time.perf_counter()
        if tok in self._eos:
            self._finish(c, "stop")
            if m is not None:
                r.grammar_s += g
                r.grammar_steps += 1
            return
        self._add_token(c, tok, res)
        ff: list[int] = []
        if m is not None and not c.text.stopped:
            g0 = time.perf_counter()
            if r.fast_forward and len(c.generated) < c.max_new:
                ff = forced_tokens(m, self.backend.encode, limit=c.max_new - len(c.generated))
                for i, t in enumerate(ff):
                    if not m.accept_token(t):
                        if r.canonical:   # not canonical after what came before: sample the rest
                            ff = ff[:i]
                            break
                        raise GenerationError(f"internal error: the grammar rejected forced token {t}", r.id)
                for t in ff:
                    self._add_token(c, t, None)
                    if c.text.stopped:
                        break
            complete = m.can_terminate() and not _has_continuation(m)
            if complete and self._matcher_stops:
                m.accept_token(self._matcher_stops[0])
            r.grammar_s += g + time.perf_counter() - g0
            r.grammar_steps += 1
            if complete and not c.text.stopped:
                self._finish(c, "stop")
                return
        if c.text.stopped:
            self._finish(c, "stop")
            return
        if len(c.generated) >= c.max_new:
            self._finish(c, "length", incomplete=True)
            return
        c.pending = [tok] + ff

    def _add_token(self, c: _Choice, tok: int, res: SampleResult | None) -> None:
        c.generated.append(tok)
        c.sampler.observe(tok)
        data = self.tokenizer_info.token_bytes[tok] if 0 <= tok < self.tokenizer_info.vocab_size else b""
        if res is None:
            c.n_forced += 1
        if c.sampler.params.logprobs:
            text = data.decode("utf-8", errors="replace")
            if res is None:  # forced: probability 1 under the constraint
                c.logprobs.append(TokenLogprob(token=text, logprob=0.0, bytes=list(data),
                                               top_logprobs=[TopLogprob(token=text, logprob=0.0, bytes=list(data))]
                                               if c.sampler.params.top_logprobs else []))
            else:
                tops = []
                for t, lp in res.top:
                    b = self.tokenizer_info.token_bytes[t] if t < self.tokenizer_info.vocab_size else b""
                    tops.append(TopLogprob(token=b.decode("utf-8", errors="replace"), logprob=lp, bytes=list(b)))
                c.logprobs.append(TokenLogprob(token=text, logprob=res.logprob, bytes=list(data), top_logprobs=tops))
        if not c.text.stopped:
            c.text.push(data)

    def _finish(self, c: _Choice, reason: str, incomplete: bool = False) -> None:
        c.text.finish()
        c.incomplete = incomplete
        c.finish_reason = reason
        r = c.request
        if r.t_end is None and all(x.finish_reason is not None for x in r.choices):
            r.t_end = time.perf_counter()

    # ------------------------------------------------------------------ responses
    def _usage(self, r: _Request) -> CompletionUsage:
        completion = sum(len(c.generated) for c in r.choices)
        prompt = len(r.prompt_ids)
        t_end = r.t_end or time.perf_counter()
        t_first = r.t_first or t_end
        extra = UsageExtra(
            e2e_latency_s=t_end - r.t_start,
            time_to_first_token_s=t_first - r.t_start,
            forced_tokens=sum(c.n_forced for c in r.choices),
            grammar_init_s=r.grammar_init_s,
            grammar_per_token_s=r.grammar_s / r.grammar_steps if r.grammar_steps else 0.0,
            forward_s=r.forward_s,
            mask_s=r.mask_s,
            grammar_cache_hit=r.cache_hit,
            canonical_fallbacks=sum(getattr(c.matcher, "canonical_fallbacks", 0) for c in r.choices),
        )
        if r.prefill_span is not None and r.prefill_span[1] > r.prefill_span[0]:
            extra.prefill_tokens_per_s = prompt * len(r.choices) / (r.prefill_span[1] - r.prefill_span[0])
        if completion > len(r.choices) and t_end > t_first:
            decode_tokens = completion - len(r.choices)
            extra.decode_tokens_per_s = decode_tokens / (t_end - t_first)
            extra.time_per_output_token_s = (t_end - t_first) / decode_tokens
        return CompletionUsage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion,
                               extra=extra)

    def _final_message(self, c: _Choice) -> tuple[str | None, list[ToolCall] | None, str]:
        text = c.text.finish()
        reason = c.finish_reason or "stop"
        r = c.request
        if not r.req.tools_active:
            return text, None, reason
        tag = r.spec.payload[0]
        outside, calls = parse_tool_calls(text, tag)
        if not calls:
            return text, None, reason
        tool_calls = [ToolCall(id=new_tool_call_id(),
                               function=FunctionCall(name=call["name"], arguments=json.dumps(call["arguments"],
                                                                                             ensure_ascii=False)))
                      for call in calls]
        content = outside.strip() or None
        return content, tool_calls, "tool_calls" if reason == "stop" else reason

    def _completion(self, r: _Request) -> ChatCompletion:
        choices = []
        for c in r.choices:
            content, tool_calls, reason = self._final_message(c)
            choices.append(Choice(
                index=c.index, message=ChatCompletionMessage(content=content, tool_calls=tool_calls),
                finish_reason=reason, incomplete=c.incomplete,
                logprobs=ChoiceLogprobs(content=list(c.logprobs)) if r.req.logprobs else None))
        return ChatCompletion(id=r.id, created=r.created, model=self.model_name, choices=choices, usage=self._usage(r))


def _mark_aborted(r: _Request) -> None:
    r.aborted = True
    for c in r.choices:
        if c.finish_reason is None:
            c.finish_reason = "abort"
            c.incomplete = True
            c.text.finish()
    if r.t_end is None:
        r.t_end = time.perf_counter()


def _has_continuation(m: GrammarMatcher) -> bool:
    fn = getattr(m, "_has_continuation", None)
    return True if fn is None else bool(fn())


# ---------------------------------------------------------------------------------------------- streaming
class ChatCompletionStream:
    """Async iterator of :class:`ChatCompletionChunk`. ``aclose()`` (or leaving ``async with``)
    aborts the request at once; so does cancelling the task that iterates. A stream dropped
    without ``aclose()`` (``break`` out of ``async for``) is aborted when it is garbage-collected;
    its sequence is released after the next step."""

    def __init__(self, engine: AsyncEngine, r: _Request):
        self.engine = engine
        self._r = r
        self._queue: deque[ChatCompletionChunk] = deque()
        self._closed = False
        self._streamed: dict[int, str] = {c.index: "" for c in r.choices}
        self.include_usage = bool(r.req.stream_options and r.req.stream_options.include_usage)

    @property
    def request_id(self) -> str:
        return self._r.id

    def __aiter__(self) -> "ChatCompletionStream":
        return self

    async def __aenter__(self) -> "ChatCompletionStream":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()

    def __del__(self):
        r = getattr(self, "_r", None)
        if r is not None and not r.done:
            try:
                _mark_aborted(r)
            except Exception:  # pragma: no cover - interpreter shutdown
                pass

    async def aclose(self) -> None:
        self._closed = True
        self._queue.clear()
        if not self._r.done:
            self.engine._abort(self._r)

    def _chunk(self, choices, usage=None) -> ChatCompletionChunk:
        r = self._r
        return ChatCompletionChunk(id=r.id, created=r.created, model=self.engine.model_name, choices=choices,
                                   usage=usage)

    def _collect(self) -> None:
        r = self._r
        if r.error is not None:
            return
        for c in r.choices:
            if not c.role_sent:
                c.role_sent = True
                self._queue.append(self._chunk([ChunkChoice(index=c.index, delta=ChoiceDelta(role="assistant",
                                                                                               content=""))]))
            if c.finish_sent:
                continue
            text = c.text.text
            end = c.text.safe_end()
            if end > c.cursor:
                lp = None
                if r.req.logprobs:
                    lp = ChoiceLogprobs(content=c.logprobs[c.lp_cursor:])
                    c.lp_cursor = len(c.logprobs)
                delta = text[c.cursor:end]
                self._streamed[c.index] += delta
                c.cursor = end
                self._queue.append(self._chunk([ChunkChoice(index=c.index, delta=ChoiceDelta(content=delta),
                                                            logprobs=lp)]))
            if c.finish_reason is not None:
                content, tool_calls, reason = self.engine._final_message(c)
                sent = self._streamed[c.index]
                rest = ""
                if content and content.startswith(sent):
                    rest = content[len(sent):]
                if rest:
                    self._queue.append(self._chunk([ChunkChoice(index=c.index, delta=ChoiceDelta(content=rest))]))
                if tool_calls:
                    deltas = [ToolCallDelta(index=k, id=tc.id, type="function",
                                            function={"name": tc.function.name, "arguments": tc.function.arguments})
                              for k, tc in enumerate(tool_calls)]
                    self._queue.append(self._chunk([ChunkChoice(index=c.index, delta=ChoiceDelta(tool_calls=deltas))]))
                lp = ChoiceLogprobs(content=c.logprobs[c.lp_cursor:]) if r.req.logprobs and \
                    c.lp_cursor < len(c.logprobs) else None
                c.lp_cursor = len(c.logprobs)
                c.finish_sent = True
                self._queue.append(self._chunk([ChunkChoice(index=c.index, delta=ChoiceDelta(), finish_reason=reason,
                                                            logprobs=lp, incomplete=c.incomplete)]))
        if all(c.finish_sent for c in r.choices) and self.include_usage and not r.usage_sent:
            r.usage_sent = True
            self._queue.append(self._chunk([], usage=self.engine._usage(r)))

    def _has_news(self) -> bool:
        r = self._r
        if r.error is not None or r.aborted:
            return True
        for c in r.choices:
            if not c.role_sent or (not c.finish_sent and (c.finish_reason is not None or c.text.safe_end() > c.cursor)):
                return True
        return False

    async def __anext__(self) -> ChatCompletionChunk:
        r = self._r
        while True:
            if self._queue:
                return self._queue.popleft()
            if self._closed:
                raise StopAsyncIteration
            self._collect()
            if self._queue:
                continue
            if r.error is not None:
                self._closed = True
                raise r.error
            if all(c.finish_sent for c in r.choices):
                self._closed = True
                raise StopAsyncIteration
            try:
                await self.engine._drive(r, self._has_news)
            except BaseException:
                if not r.done:
                    self.engine._abort(r)
                raise


# ---------------------------------------------------------------------------------------------- namespaces
class _Completions:
    def __init__(self, engine: AsyncEngine):
        self._engine = engine

    async def create(self, request: ChatCompletionRequest | dict | None = None, **kwargs):
        """A :class:`ChatCompletion`, or with ``stream=True`` a :class:`ChatCompletionStream`."""
        return await self._engine._create(request, **kwargs)


class _Chat:
    def __init__(self, engine: AsyncEngine):
        self.completions = _Completions(engine)
