"""llama.cpp model backend for GGUF files (implements :class:`grammask.pipeline.backend.ModelBackend`).

Needs the optional ``llamacpp`` extra (``pip install 'grammask[llamacpp]'``: ``llama-cpp-python``,
built from its sdist with the system compiler). The GGUF file is run as is (quantized weights, no
conversion), on the CPU.

One llama.cpp context holds ``n_seq_max`` sequence slots, each with its own ``n_ctx`` positions of
KV cache (a non-unified cache of ``n_ctx * n_seq_max`` cells). :meth:`LlamaCppBackend.new_sequence`
takes a free slot (its llama.cpp ``seq_id``); :meth:`~LlamaCppBackend.release` removes the slot's
KV cells (``llama_memory_seq_rm``) and frees it. :meth:`~LlamaCppBackend.forward` puts the new
tokens of *all* the given sequences into one ``llama_batch`` (each token with its sequence id and
position, an output flag on each sequence's last token) and runs one ``llama_decode``, several only
when the tokens exceed ``n_batch``; it returns the last-position logits of every sequence as a
float32 ``[B, vocab_size]`` CPU tensor (a copy: masking it in place is allowed).

The tokenizer (:class:`~grammask.grammar.tokenizer_info.TokenizerInfo`) comes from the GGUF's
metadata (``TokenizerInfo.from_gguf``); text is tokenized by llama.cpp itself; the chat prompt is
the GGUF's ``tokenizer.chat_template`` rendered with Jinja2 the way ``transformers`` renders it.

Errors: a failed load is :class:`ModelLoadError`; misuse of a sequence (released, over its
context, bad ids) :class:`SequenceError` / :class:`ContextLengthError`; no free slot
:class:`NoFreeSlotError`; a failed ``llama_decode`` :class:`LlamaCppDecodeError`, after the
sequences of that call were rolled back to their state before it (they stay usable).
"""
from __future__ import annotations

import ctypes
import logging
import os
import threading
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Sequence

from ..errors import GrammaskError
from .models import EMBEDDED_MODEL_NAME, ModelNotFoundError, embedded_model_path
from .transformers_backend import ContextLengthError, ModelLoadError, SequenceError

logger = logging.getLogger(__name__)

#: positions per sequence slot (prompt + completion) unless told otherwise
DEFAULT_N_CTX = 2048
#: sequence slots (concurrent requests' choices) unless told otherwise
DEFAULT_N_SEQ_MAX = 8
#: most tokens in one ``llama_decode`` call
DEFAULT_N_BATCH = 512


class NoFreeSlotError(GrammaskError, RuntimeError):
    """Every sequence slot of the llama.cpp context is in use (release one, or raise ``n_seq_max``)."""


class LlamaCppDecodeError(GrammaskError, RuntimeError):
    """``llama_decode`` failed; ``code`` is its return value (1: no KV slot, 2: aborted, < 0: error)."""

    def __init__(self, message: str, code: int):
        super().__init__(message)
        self.code = code


def _llama_cpp():
    try:
        import llama_cpp
    except ImportError as e:  # pragma: no cover - depends on the install
        raise ModelLoadError(
            "the llama.cpp backend needs the 'llamacpp' extra: pip install 'grammask[llamacpp]' "
            "(builds llama-cpp-python from source)"
        ) from e
    return llama_cpp


@dataclass(eq=False)
class LlamaCppSequence:
    """Per-request state: the llama.cpp sequence slot and the number of tokens in its KV cache."""

    slot: int
    #: tokens in the cache (the position of the next token)
    length: int = 0
    #: float32 logits of the last position, None before the first forward
    last_logits: Any = field(default=None, repr=False)
    released: bool = False

    @property
    def position(self) -> int:
        return self.length


class LlamaCppBackend:
    """A GGUF model run by llama.cpp (see the module docstring)."""

    device = "cpu"
    #: one call at a time: the context and its batch are shared
    supports_concurrent_calls = False

    def __init__(
        self,
        model_path: str | os.PathLike | None = None,
        *,
        n_ctx: int = DEFAULT_N_CTX,
        n_seq_max: int = DEFAULT_N_SEQ_MAX,
        n_threads: int | None = None,
        n_threads_batch: int | None = None,
        n_batch: int = DEFAULT_N_BATCH,
        flash_attn: bool | None = None,
        kv_unified: bool = False,
        name: str | None = None,
        verbose: bool = False,
    ):
        """``model_path``: a ``.gguf`` file (None: the embedded SmolLM2-135M-Instruct). ``n_ctx``:
        positions per sequence (capped at the model's training context); ``n_seq_max``: sequence
        slots; ``n_threads`` / ``n_threads_batch``: llama.cpp threads for decode / prompt batches
        (default: the cores this process may use); ``n_batch``: most tokens per ``llama_decode``; ``flash_attn``:
        llama.cpp's flash attention (None: llama.cpp's automatic choice, which turns it on here and
        was measured faster: 8.2 vs 9.5 ms per 1-token step, 37 vs 50 ms for 8 sequences, 2 threads;
        ``llama_cpp.Llama`` turns it off by default); ``kv_unified``: one KV buffer shared by the
        slots (``n_ctx * n_seq_max`` cells any sequence may fill) instead of one per slot."""
        from ..grammar.tokenizer_info import TokenizerInfo
        from ..grammar.tokenizer_loaders.gguf_reader import read_gguf_metadata

        lc = _llama_cpp()
        self._lc = lc
        self._ctx = None
        self._model = None
        self._batch = None
        if model_path is None:
            path = Path(embedded_model_path())
            default_name = EMBEDDED_MODEL_NAME
        else:
            path = Path(model_path).expanduser()
            if path.is_dir():
                ggufs = sorted(path.glob("*.gguf"))
                if len(ggufs) == 1:
                    path = ggufs[0]
            if not path.exists():
                raise ModelNotFoundError(f"model path {str(model_path)!r} does not exist")
            if not (path.is_file() and path.suffix.lower() == ".gguf"):
                raise ModelLoadError(f"the llama.cpp backend reads .gguf files, not {path}")
            default_name = path.name.removesuffix(".gguf")
        self.path = str(path.resolve())
        self.name = name or default_name
        self.source = "llama.cpp"
        if n_seq_max < 1 or n_ctx < 1 or n_batch < 1:
            raise ModelLoadError("n_ctx, n_seq_max and n_batch must be >= 1")

        try:
            from llama_cpp._logger import set_verbose

            set_verbose(verbose)
        except ImportError:  # pragma: no cover - other llama-cpp-python layouts
            pass
        lc.llama_backend_init()
        mparams = lc.llama_model_default_params()
        model = lc.llama_model_load_from_file(self.path.encode("utf-8"), mparams)
        if not model:
            raise ModelLoadError(f"llama.cpp cannot load {self.path}")
        self._model = model
        train_ctx = int(lc.llama_model_n_ctx_train(model))
        n_ctx = min(int(n_ctx), train_ctx) if train_ctx > 0 else int(n_ctx)
        cparams = lc.llama_context_default_params()
        cparams.n_ctx = n_ctx * int(n_seq_max)
        cparams.n_batch = int(n_batch)
        cparams.n_ubatch = int(n_batch)
        cparams.n_seq_max = int(n_seq_max)
        cparams.kv_unified = bool(kv_unified)
        if flash_attn is not None:
            cparams.flash_attn_type = (lc.LLAMA_FLASH_ATTN_TYPE_ENABLED if flash_attn
                                       else lc.LLAMA_FLASH_ATTN_TYPE_DISABLED)
        if n_threads is None:  # llama.cpp's own default is 4 threads, whatever the CPU: oversubscribed on 2 cores
            n_threads = _available_cores()
        if n_threads is not None:
            cparams.n_threads = int(n_threads)
            cparams.n_threads_batch = int(n_threads_batch if n_threads_batch is not None else n_threads)
        elif n_threads_batch is not None:
            cparams.n_threads_batch = int(n_threads_batch)
        ctx = lc.llama_init_from_model(model, cparams)
        if not ctx:
            self.close()
            raise ModelLoadError(f"llama.cpp cannot create a context for {self.path}")
        self._ctx = ctx
        self._mem = lc.llama_get_memory(ctx)
        self._vocab = lc.llama_model_get_vocab(model)
        self.n_seq_max = int(lc.llama_n_seq_max(ctx))
        #: the engine admits at most this many sequences (pipeline/backend.py)
        self.max_sequences = self.n_seq_max
        self.n_batch = int(lc.llama_n_batch(ctx))
        #: positions per sequence (llama.cpp may round its context up: the asked-for size holds)
        self.max_context = min(n_ctx, int(lc.llama_n_ctx(ctx)) // self.n_seq_max)
        self.n_threads = int(lc.llama_n_threads(ctx))
        #: llama.cpp's threads fill every core: the engine computes masks before the forward, not beside it
        self.saturates_cpu = self.n_threads >= _available_cores()
        self.n_threads_batch = int(lc.llama_n_threads_batch(ctx))
        self.vocab_size = int(lc.llama_vocab_n_tokens(self._vocab))
        self._batch = lc.llama_batch_init(self.n_batch, 0, 1)
        self._free_slots = list(range(self.n_seq_max))
        self._lock = threading.Lock()

        meta = read_gguf_metadata(self.path, prefix="")
        self._meta_tokens = meta.get("tokenizer.ggml.tokens") or []
        self.chat_template = meta.get("tokenizer.chat_template")
        ftype = meta.get("general.file_type")
        self.dtype = f"gguf(file_type={ftype})" if ftype is not None else "gguf"

        eog = {i for i in (int(lc.llama_vocab_eos(self._vocab)), int(lc.llama_vocab_eot(self._vocab)))
               if 0 <= i < self.vocab_size}
        info = TokenizerInfo.from_gguf(self.path, vocab_size=self.vocab_size)
        if not eog <= set(info.stop_token_ids):
            info = TokenizerInfo.from_gguf(self.path, vocab_size=self.vocab_size,
                                           stop_token_ids=sorted(eog | set(info.stop_token_ids)))
        self.tokenizer_info = info
        self.eos_token_ids: tuple[int, ...] = tuple(sorted(eog | set(info.stop_token_ids)))

    # ------------------------------------------------------------------ lifetime
    def close(self) -> None:
        """Free the llama.cpp batch, context and model (idempotent; ``AsyncEngine.aclose`` calls it).
        The backend is unusable afterwards: its methods raise :class:`SequenceError`."""
        lc = self._lc
        if self._batch is not None:
            lc.llama_batch_free(self._batch)
            self._batch = None
        if self._ctx is not None:
            lc.llama_free(self._ctx)
            self._ctx = None
        if self._model is not None:
            lc.llama_model_free(self._model)
            self._model = None

    def __del__(self):  # pragma: no cover - interpreter shutdown order
        try:
            self.close()
        except Exception:
            pass

    @property
    def closed(self) -> bool:
        return self._ctx is None

    def _check_open(self) -> None:
        if self._ctx is None:
            raise SequenceError(f"the llama.cpp backend of {self.name} is closed")

    @property
    def free_slots(self) -> int:
        """Sequence slots not in use."""
        return len(self._free_slots)

    # ------------------------------------------------------------------ text
    def _token_text(self, i: int | None) -> str:
        if i is None or not 0 <= i < len(self._meta_tokens):
            return ""
        return self._meta_tokens[i]

    def apply_chat_template(self, messages: list[dict], *, tools: list[dict] | None = None,
                            add_generation_prompt: bool = True) -> list[int]:
        """Token ids of the chat prompt rendered with the GGUF's chat template (Jinja2, as
        ``transformers`` renders it: trimmed blocks, ``raise_exception``, ``tojson``)."""
        self._check_open()
        if not self.chat_template:
            raise ModelLoadError(f"{self.name} has no tokenizer.chat_template")
        text = _render_chat_template(
            self.chat_template, messages, tools=tools, add_generation_prompt=add_generation_prompt,
            bos_token=self._token_text(_valid(int(self._lc.llama_vocab_bos(self._vocab)))),
            eos_token=self._token_text(_valid(int(self._lc.llama_vocab_eos(self._vocab)))),
        )
        return self._tokenize(text, parse_special=True)

    def encode(self, text: str) -> list[int]:
        """Token ids of plain text, no special tokens added or parsed."""
        return self._tokenize(text, parse_special=False)

    def _tokenize(self, text: str, *, parse_special: bool) -> list[int]:
        self._check_open()
        lc = self._lc
        data = text.encode("utf-8")
        cap = len(data) + 8
        for _ in range(2):
            buf = (lc.llama_token * cap)()
            n = int(lc.llama_tokenize(self._vocab, data, len(data), buf, cap, False, parse_special))
            if n >= 0:
                return [int(buf[i]) for i in range(n)]
            cap = -n
        raise SequenceError(f"llama.cpp cannot tokenize a text of {len(data)} bytes")

    def token_bytes(self, token: int, *, special: bool = True) -> bytes:
        """llama.cpp's own bytes for one token id (``llama_token_to_piece``)."""
        self._check_open()
        lc = self._lc
        cap = 64
        for _ in range(2):
            buf = ctypes.create_string_buffer(cap)
            n = int(lc.llama_token_to_piece(self._vocab, int(token), buf, cap, 0, special))
            if n >= 0:
                return buf.raw[:n]
            cap = -n
        raise SequenceError(f"llama.cpp cannot render token {token}")

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return b"".join(self.token_bytes(i, special=not skip_special_tokens) for i in ids).decode(
            "utf-8", errors="replace")

    # ------------------------------------------------------------------ sequences
    def new_sequence(self) -> LlamaCppSequence:
        """A fresh sequence in a free slot (empty KV cache at position 0)."""
        self._check_open()
        with self._lock:
            if not self._free_slots:
                raise NoFreeSlotError(f"all {self.n_seq_max} sequence slots of {self.name} are in use")
            slot = self._free_slots.pop(0)
        # a slot is always empty when freed; clear it again in case a failure left cells behind
        self._lc.llama_memory_seq_rm(self._mem, slot, -1, -1)
        return LlamaCppSequence(slot=slot)

    def release(self, seq: LlamaCppSequence) -> None:
        """Remove the sequence's KV cells and free its slot (idempotent)."""
        if seq.released:
            return
        seq.released = True
        seq.last_logits = None
        if self._ctx is not None:
            self._lc.llama_memory_seq_rm(self._mem, seq.slot, -1, -1)
        with self._lock:
            self._free_slots.append(seq.slot)
            self._free_slots.sort()

    def forward(self, seqs: Sequence[LlamaCppSequence], tokens: Sequence[Sequence[int]]):
        """Append ``tokens[i]`` to ``seqs[i]`` in one ``llama_batch`` (several ``llama_decode`` calls
        only past ``n_batch`` tokens) and return the last position's logits of every sequence:
        float32 ``[len(seqs), vocab_size]`` on the CPU. Empty ``tokens[i]`` return the sequence's
        previous last logits."""
        import numpy as np
        import torch

        if len(seqs) != len(tokens):
            raise SequenceError(f"{len(seqs)} sequences but {len(tokens)} token lists")
        if not seqs:
            return torch.empty((0, self.vocab_size), dtype=torch.float32)
        if len({id(s) for s in seqs}) != len(seqs):
            raise SequenceError("the same sequence appears twice in one forward call")
        self._check_open()
        ids_per_seq: list[list[int]] = []
        for seq, toks in zip(seqs, tokens):
            if not isinstance(seq, LlamaCppSequence):
                raise SequenceError(f"not a sequence of this backend: {type(seq).__name__}")
            if seq.released:
                raise SequenceError("forward on a released sequence")
            ids = [int(t) for t in toks]
            problem = _token_problem(ids, seq, self.vocab_size)
            if problem:
                raise SequenceError(problem)
            if seq.length + len(ids) > self.max_context:
                raise ContextLengthError(f"sequence of {seq.length} tokens + {len(ids)} new exceeds max_context "
                                         f"{self.max_context}")
            ids_per_seq.append(ids)

        # (row, token, pos, slot, wants logits) for every new token, sequences one after the other
        flat: list[tuple[int, int, int, int, bool]] = []
        for row, (seq, ids) in enumerate(zip(seqs, ids_per_seq)):
            last = len(ids) - 1
            for j, t in enumerate(ids):
                flat.append((row, t, seq.length + j, seq.slot, j == last))
        out = np.empty((len(seqs), self.vocab_size), dtype=np.float32)
        lc, b = self._lc, self._batch
        try:
            for start in range(0, len(flat), self.n_batch):
                chunk = flat[start : start + self.n_batch]
                outputs: list[tuple[int, int]] = []  # (batch index, row)
                for i, (row, t, pos, slot, want) in enumerate(chunk):
                    b.token[i] = t
                    b.pos[i] = pos
                    b.n_seq_id[i] = 1
                    b.seq_id[i][0] = slot
                    b.logits[i] = 1 if want else 0
                    if want:
                        outputs.append((i, row))
                b.n_tokens = len(chunk)
                rc = int(lc.llama_decode(self._ctx, b))
                if rc != 0:
                    raise LlamaCppDecodeError(f"llama_decode failed with code {rc} on a batch of {len(chunk)} "
                                              f"tokens for {len(seqs)} sequence(s)", rc)
                for i, row in outputs:
                    ptr = lc.llama_get_logits_ith(self._ctx, i)
                    if not ptr:
                        raise LlamaCppDecodeError(f"llama.cpp returned no logits for batch index {i}", -100)
                    out[row] = np.ctypeslib.as_array(ptr, shape=(self.vocab_size,))
        except BaseException:
            # roll every sequence of this call back to its state before it (its cells past the old length)
            for seq in seqs:
                lc.llama_memory_seq_rm(self._mem, seq.slot, seq.length, -1)
            raise
        result = torch.from_numpy(out)
        for row, (seq, ids) in enumerate(zip(seqs, ids_per_seq)):
            if ids:
                seq.length += len(ids)
                seq.last_logits = result[row].clone()
            else:
                result[row] = seq.last_logits
        return result

    def __repr__(self) -> str:
        return (f"LlamaCppBackend(name={self.name!r}, path={self.path!r}, vocab_size={self.vocab_size}, "
                f"max_context={self.max_context}, n_seq_max={self.n_seq_max}, n_threads={self.n_threads})")


def _available_cores() -> int:
    """CPU cores this process may run on (its affinity mask where the OS has one)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # pragma: no cover - macOS, Windows
        return max(1, os.cpu_count() or 1)


def _token_problem(ids: list[int], seq: LlamaCppSequence, vocab_size: int) -> str | None:
    """Why ``ids`` cannot be appended to ``seq`` (None: they can, context length aside)."""
    if not ids:
        return None if seq.last_logits is not None else "forward with no tokens on an empty sequence"
    if min(ids) < 0 or max(ids) >= vocab_size:
        return f"token ids out of range [0, {vocab_size}): {[t for t in ids if not 0 <= t < vocab_size][:5]}"
    return None


def _valid(i: int) -> int | None:
    return i if i >= 0 else None


def _render_chat_template(template: str, messages: list[dict], *, tools, add_generation_prompt: bool,
                          bos_token: str, eos_token: str) -> str:
    """Render a Hugging Face chat template the way ``transformers`` does (sandboxed Jinja2,
    ``trim_blocks``/``lstrip_blocks``, loop controls, ``raise_exception``, ``strftime_now``, a
    ``tojson`` that keeps non-ASCII)."""
    import json

    from jinja2.exceptions import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return env.from_string(template).render(
            messages=messages, tools=tools or None, add_generation_prompt=add_generation_prompt,
            bos_token=bos_token, eos_token=eos_token,
        )
    except TemplateError as e:
        raise SequenceError(f"chat template error: {e}") from e


__all__ = [
    "ContextLengthError",
    "LlamaCppBackend",
    "LlamaCppDecodeError",
    "LlamaCppSequence",
    "ModelLoadError",
    "NoFreeSlotError",
    "SequenceError",
]
