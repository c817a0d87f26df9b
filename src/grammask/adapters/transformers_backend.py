"""Hugging Face ``transformers`` model backend (implements :class:`grammask.pipeline.backend.ModelBackend`).

``TransformersBackend.load()`` takes

- nothing: the embedded default model (SmolLM2-135M-Instruct Q4_1 GGUF, see :mod:`.models`);
- a path to a ``.gguf`` file;
- a path to a Hugging Face model folder (``config.json`` + weights + tokenizer files);
- a ``transformers`` ``PreTrainedModel`` instance (pass ``tokenizer=`` unless the model's
  ``name_or_path`` is a local folder holding one).

GGUF files are dequantized by transformers, which is slow (tens of seconds even for 135M params). The
first load therefore writes the dequantized weights, config, generation config and tokenizer as a plain
Hugging Face folder (safetensors) into grammask's cache folder (``$GRAMMASK_CACHE_DIR``, else
``$XDG_CACHE_HOME/grammask``, else ``~/.cache/grammask``; see :func:`.models.cache_root`), under a
subfolder keyed by the GGUF file's name, size and mtime. It is written into a temporary folder and
renamed into place, so a crash or a concurrent load never leaves a half-written cache folder behind.
Later loads read that folder with a plain ``from_pretrained`` (a fraction of a second).

Each request gets its own sequence (:meth:`TransformersBackend.new_sequence`): a slot (row) in the
backend's slot KV cache (:mod:`.batch_cache`) and its length. :meth:`~TransformersBackend.forward` runs
the decode / fast-forward tokens of all its sequences in ONE left-padded model call (per-row positions
and a 4-D attention mask), or, when prompts join, ONE packed call (all rows' tokens side by side, a
block-diagonal causal mask); a prompt starting with a recent prompt's tokens reuses their keys/values
(:mod:`.prefix_cache`); all under
``torch.inference_mode()``, and returns the last position's logits as float32 ``[B, V]``
on the model's device (ordinary tensors: masking them in place afterwards is allowed).
"""
from __future__ import annotations

import contextlib
import inspect
import json
import logging
import os
import re
import shutil
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from ..errors import GrammaskError
from ..grammar.vocab import as_id_list
from . import packed_attention
from .batch_cache import SlotKVPool
from .models import EMBEDDED_MODEL_NAME, ModelNotFoundError, cache_root, embedded_model_path
from .prefix_cache import DEFAULT_PREFIX_CACHE_BYTES, PrefixCache
from .row_padding import RowPadding

logger = logging.getLogger(__name__)

#: bump when the layout of the converted cache folders changes
CACHE_FORMAT = 1
CACHE_MARKER = "grammask-cache.json"
#: longest chunk of tokens sent through the model in one call (long prompts are prefilled in chunks)
PREFILL_CHUNK = 2048
#: rows of at most this many new tokens (decode steps, fast-forward runs) share one padded model call;
#: longer rows (prompts) are prefilled one sequence per call (padding them would multiply the work)
BATCH_MAX_TOKENS = 16
#: prompts are prefilled together while padding adds at most 25% to their tokens
PREFILL_PAD_RATIO = 1.25
#: rows of unequal lengths run as ONE packed call (every row's tokens side by side, block-diagonal
#: mask) while the attention over the other rows' keys costs at most this share of the linear layers' work
PACK_ATTENTION_SHARE = 0.5


class ModelLoadError(GrammaskError, RuntimeError):
    """A model or its tokenizer cannot be loaded."""


class SequenceError(GrammaskError, ValueError):
    """Misuse of a sequence: released, broken by an earlier failure, over the context, bad token ids."""


class ContextLengthError(SequenceError):
    """Appending the tokens would make the sequence longer than the model's ``max_context``."""


# ---------------------------------------------------------------------------------------------- sequences
@dataclass(eq=False)
class TransformersSequence:
    """Per-request state: the KV cache and the number of tokens in it."""

    #: the sequence's row in the backend's slot cache (None before its first forward / after release)
    slot: int | None = None
    #: tokens in the cache (the position of the next token)
    length: int = 0
    #: float32 logits of the last position (an inference tensor), None before the first forward
    last_logits: Any = field(default=None, repr=False)
    released: bool = False
    #: an exception during forward left the cache in an unknown state
    broken: bool = False

    @property
    def position(self) -> int:
        return self.length


# ---------------------------------------------------------------------------------------------- helpers
def _torch():
    import torch

    return torch


def _transformers():
    try:
        import transformers
    except ImportError as e:  # pragma: no cover - depends on the install
        raise ModelLoadError(
            "the transformers backend needs the 'hf' extra: pip install 'grammask[hf]'"
        ) from e
    return transformers


def _version_tuple(v: str) -> tuple[int, ...]:
    out = []
    for part in v.split(".")[:3]:
        m = re.match(r"\d+", part)
        out.append(int(m.group()) if m else 0)
    return tuple(out)


def _dtype_kwarg() -> str:
    """``from_pretrained``'s dtype keyword: ``dtype`` since transformers 4.56, ``torch_dtype`` before."""
    return "dtype" if _version_tuple(_transformers().__version__) >= (4, 56) else "torch_dtype"


def resolve_device(device: Any = "auto") -> Any:
    """``"auto"``/None: CUDA when available, else CPU; anything else is passed to ``torch.device``."""
    torch = _torch()
    if device is None or (isinstance(device, str) and device == "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ModelLoadError(f"bad device {device!r}: {e}") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError(f"device {device!r} was asked for, but CUDA is not available")
    return dev


_DTYPE_NAMES = {
    "float32": "float32", "fp32": "float32", "float": "float32",
    "float16": "float16", "fp16": "float16", "half": "float16",
    "bfloat16": "bfloat16", "bf16": "bfloat16",
}


def resolve_dtype(dtype: Any, device: Any) -> Any:
    """A ``torch.dtype`` or ``"auto"`` (the checkpoint's own dtype).

    None means the checkpoint's dtype on accelerators and, on CPU, bfloat16 where the CPU has native
    bfloat16 dot products (``avx512_bf16`` or ``amx_bf16``: :func:`cpu_has_native_bf16`), else float32
    (emulated reduced-precision matmuls are slower than float32). Measured on this project's 2-core
    AMD EPYC (avx512_bf16), embedded model, one thread: a 1-token step 59 -> 56 ms, 8 sequences
    117 -> 64 ms, a 46-token prompt 238 -> 154 ms. Strings like ``"bf16"``/``"float16"`` are accepted.
    """
    torch = _torch()
    if dtype is None:
        if device.type != "cpu":
            return "auto"
        return torch.bfloat16 if cpu_has_native_bf16() else torch.float32
    if isinstance(dtype, torch.dtype):
        return dtype
    if isinstance(dtype, str):
        if dtype == "auto":
            return "auto"
        name = _DTYPE_NAMES.get(dtype.lower().removeprefix("torch."))
        if name is not None:
            return getattr(torch, name)
    raise ModelLoadError(f"unsupported dtype {dtype!r}; use a torch.dtype, 'auto', 'float32', 'bfloat16' or 'float16'")


def cpu_has_native_bf16() -> bool:
    """The CPU computes bfloat16 dot products in hardware (x86 ``avx512_bf16`` / ``amx_bf16`` flags, read
    from ``/proc/cpuinfo``; False where that file does not exist)."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    return bool(flags & {"avx512_bf16", "amx_bf16"})
    except OSError:
        pass
    return False


def _chat_ids(out: Any) -> list[int]:
    """Token ids out of whatever ``apply_chat_template(tokenize=True)`` returned (list, nested list,
    tensor, ``BatchEncoding``/dict)."""
    if isinstance(out, Mapping) or hasattr(out, "input_ids"):
        out = out["input_ids"] if isinstance(out, Mapping) else out.input_ids
    if hasattr(out, "tolist"):
        out = out.tolist()
    out = list(out)
    if out and not isinstance(out[0], int) and hasattr(out[0], "__len__"):
        if len(out) != 1:
            raise ModelLoadError(f"apply_chat_template returned a batch of {len(out)} prompts, expected one")
        out = list(out[0])
    return [int(i) for i in out]


def _max_context(config: Any, tokenizer: Any) -> int:
    cfg = config.get_text_config() if hasattr(config, "get_text_config") else config
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length", "n_ctx"):
        v = getattr(cfg, key, None)
        if isinstance(v, int) and v > 0:
            return v
    v = getattr(tokenizer, "model_max_length", None)
    if isinstance(v, int) and 0 < v < 10_000_000:
        return v
    return 2048


def _logits_width(model: Any) -> int:
    out = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    w = getattr(out, "weight", None)
    if w is not None and getattr(w, "ndim", 0) == 2:
        return int(w.shape[0])
    cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    return int(cfg.vocab_size)


# ---------------------------------------------------------------------------------------------- GGUF cache
def gguf_cache_folder(gguf_path: str | os.PathLike, cache_dir: str | os.PathLike | None = None) -> Path:
    """Folder the dequantized copy of ``gguf_path`` is (or will be) cached in: keyed by the file's name,
    size and mtime, so a replaced file is converted again."""
    p = Path(gguf_path)
    st = p.stat()
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", p.name.removesuffix(".gguf"))[:120]
    return cache_root(cache_dir) / f"hf-from-gguf-v{CACHE_FORMAT}" / f"{stem}-{st.st_size}-{st.st_mtime_ns}"


def _cache_is_complete(folder: Path) -> bool:
    try:
        meta = json.loads((folder / CACHE_MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return meta.get("format") == CACHE_FORMAT and (folder / "config.json").is_file()


@contextlib.contextmanager
def _memoized_gguf_parsing():
    """Within the block, ``gguf.GGUFReader(path)`` and ``gguf.get_tensor_name_map(arch, n)`` are memoized.

    transformers parses the GGUF file's metadata with ``GGUFReader`` (slow pure-Python code) three times
    per load (tokenizer, config, weights) and rebuilds the tensor name map once per submodule (~400
    times): memoizing both cuts the conversion time to about a third. Both are read-only objects; the
    originals are restored on exit. Without the ``gguf`` package (or those names) it does nothing."""
    try:
        import gguf
    except ImportError:
        yield
        return
    orig_reader = getattr(gguf, "GGUFReader", None)
    orig_map = getattr(gguf, "get_tensor_name_map", None)
    if orig_reader is None or orig_map is None:
        yield
        return
    readers: dict[tuple, Any] = {}
    maps: dict[tuple, Any] = {}

    def reader(path, mode="r", *args, **kwargs):
        if args or kwargs or mode != "r":
            return orig_reader(path, mode, *args, **kwargs)
        key = (os.fspath(path),)
        if key not in readers:
            readers[key] = orig_reader(path, mode)
        return readers[key]

    def name_map(arch, n_blocks, *args, **kwargs):
        if args or kwargs:
            return orig_map(arch, n_blocks, *args, **kwargs)
        key = (arch, n_blocks)
        if key not in maps:
            maps[key] = orig_map(arch, n_blocks)
        return maps[key]

    gguf.GGUFReader, gguf.get_tensor_name_map = reader, name_map
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = orig_reader, orig_map
        readers.clear()
        maps.clear()


def _load_from_gguf(gguf_path: Path) -> tuple[Any, Any]:
    """``(model, tokenizer)`` read from a GGUF file with transformers, weights dequantized to float32.

    The slow step (tens of seconds). Module-level so tests can check it is not called again."""
    with _memoized_gguf_parsing():
        return _load_from_gguf_unpatched(gguf_path)


def _load_from_gguf_unpatched(gguf_path: Path) -> tuple[Any, Any]:
    transformers = _transformers()
    folder, fname = str(gguf_path.parent), gguf_path.name
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=fname)
        kwargs: dict[str, Any] = {}
        GgufConfig = getattr(transformers, "GgufConfig", None)
        if GgufConfig is not None:
            # newer transformers may keep GGUF blocks packed (not serializable): ask for plain weights
            kwargs["quantization_config"] = GgufConfig(dequantize=True)
        model = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=fname, **kwargs)
    except Exception as e:
        raise ModelLoadError(f"cannot load GGUF file {gguf_path} with transformers: {e}") from e
    # the weights are plain tensors now; forget the GGUF "quantization" so save_pretrained works
    if getattr(model, "hf_quantizer", None) is not None:
        model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    for attr in ("is_quantized", "quantization_method"):
        if attr in vars(model):
            delattr(model, attr)
    return model, tokenizer


def _write_cache(model: Any, tokenizer: Any, gguf_path: Path, folder: Path) -> None:
    """Save ``model`` and ``tokenizer`` to ``folder`` atomically (temp folder in the same parent + rename)."""
    parent = folder.parent
    parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_temps(parent)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{folder.name}-", dir=parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        st = gguf_path.stat()
        marker = {
            "format": CACHE_FORMAT,
            "source": str(gguf_path),
            "size": st.st_size,
            "mtime_ns": st.st_mtime_ns,
            "transformers": _transformers().__version__,
            "created": time.time(),
        }
        (tmp / CACHE_MARKER).write_text(json.dumps(marker, indent=1), encoding="utf-8")
        try:
            os.rename(tmp, folder)
        except OSError:
            if _cache_is_complete(folder):  # another process won the race: use its copy
                shutil.rmtree(tmp, ignore_errors=True)
                return
            raise
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _remove_stale_temps(parent: Path, max_age_s: float = 6 * 3600) -> None:
    """Temp folders of conversions that crashed long ago (they hold hundreds of MB)."""
    now = time.time()
    try:
        entries = list(parent.iterdir())
    except OSError:
        return
    for e in entries:
        if e.name.startswith((".tmp-", ".bad-")) and e.is_dir():
            try:
                if now - e.stat().st_mtime > max_age_s or e.name.startswith(".bad-"):
                    shutil.rmtree(e, ignore_errors=True)
            except OSError:
                pass


def _discard_cache(folder: Path) -> None:
    bad = folder.with_name(f".bad-{folder.name}-{uuid.uuid4().hex[:8]}")
    try:
        os.rename(folder, bad)
    except OSError:
        return
    shutil.rmtree(bad, ignore_errors=True)


# ---------------------------------------------------------------------------------------------- backend
class TransformersBackend:
    """A causal LM run with ``transformers`` + PyTorch (CPU or CUDA). Build it with :meth:`load`."""

    #: the pipeline must not call :meth:`forward` from two threads at once
    supports_concurrent_calls = False

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        name: str,
        tokenizer_info: Any = None,
        source: str = "instance",
        cache_folder: str | None = None,
        prefix_cache_bytes: int = DEFAULT_PREFIX_CACHE_BYTES,
    ):
        torch = _torch()
        from ..grammar.tokenizer_info import TokenizerInfo

        self.model = model.eval()
        self.tokenizer = tokenizer
        self.name = name
        #: where the weights came from: "instance", "folder", "gguf-converted", "gguf-cache", "gguf-memory"
        self.source = source
        #: the converted GGUF folder in the cache, when there is one
        self.cache_folder = cache_folder
        param = next(iter(model.parameters()), None)
        self.torch_device = param.device if param is not None else torch.device("cpu")
        self.device = str(self.torch_device)
        self.dtype = param.dtype if param is not None else torch.float32
        self.vocab_size = _logits_width(model)
        self.max_context = _max_context(model.config, tokenizer)

        eos = set(as_id_list(getattr(tokenizer, "eos_token_id", None)))
        gen = getattr(model, "generation_config", None)
        eos.update(as_id_list(getattr(gen, "eos_token_id", None)))
        eos = {i for i in eos if 0 <= i < self.vocab_size}
        if tokenizer_info is None:
            tokenizer_info = TokenizerInfo.from_huggingface(tokenizer, vocab_size=self.vocab_size)
            if not eos <= set(tokenizer_info.stop_token_ids):
                tokenizer_info = TokenizerInfo.from_huggingface(
                    tokenizer, vocab_size=self.vocab_size,
                    stop_token_ids=sorted(eos | set(tokenizer_info.stop_token_ids)),
                )
        if tokenizer_info.vocab_size != self.vocab_size:
            raise ModelLoadError(
                f"tokenizer_info.vocab_size {tokenizer_info.vocab_size} != logits width {self.vocab_size}"
            )
        self.tokenizer_info = tokenizer_info
        #: end of turn / end of text ids: the tokenizer's and generation config's EOS plus the stop
        #: tokens found by name (``<|im_end|>``, ``<|endoftext|>``, ...)
        self.eos_token_ids: tuple[int, ...] = tuple(sorted(eos | set(tokenizer_info.stop_token_ids)))

        params = inspect.signature(model.forward).parameters
        if "logits_to_keep" in params:
            self._logits_kw = {"logits_to_keep": 1}
        elif "num_logits_to_keep" in params:
            self._logits_kw = {"num_logits_to_keep": 1}
        else:
            self._logits_kw = {}
        #: the model's keyword for the cache: ``cache`` since transformers 5.x, ``past_key_values`` before
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        #: slot KV cache shared by all sequences (one row each); forward/release hold the lock
        self._pool = SlotKVPool()
        #: packed calls attend row by row over each row's own slot (packed_attention.py; this switches
        #: an SDPA model to grammask's attention function, which is SDPA itself outside packed calls)
        self._row_attention = packed_attention.install(model)
        #: most keys (all rows' caches end to end) a packed call may attend over (PACK_ATTENTION_SHARE);
        #: None with attention per row (no cross-row keys: packing is bounded by PREFILL_CHUNK alone)
        self._pack_max_keys = None if self._row_attention else _pack_max_keys(model)
        #: model calls by kind (``padded``, ``packed``) and throw-away rows run (``pad_rows``)
        self.call_stats = {"padded": 0, "packed": 0, "pad_rows": 0}
        #: keys/values of recent prompts, reused by prompts sharing their prefix (``.prefix_cache``)
        self.prefix_cache = PrefixCache(prefix_cache_bytes)
        #: decode calls padded to the batch sizes the CPU's matrix kernels run fastest (CPU only)
        self.row_padding = RowPadding(enabled=self.torch_device.type == "cpu")
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ loading
    @classmethod
    def load(
        cls,
        model: Any = None,
        *,
        tokenizer: Any = None,
        device: Any = "auto",
        dtype: Any = None,
        cache_dir: str | os.PathLike | None = None,
        name: str | None = None,
        trust_remote_code: bool = False,
        num_threads: int | None = None,
        prefix_cache_bytes: int | None = None,
    ) -> "TransformersBackend":
        """Load a model (see the module docstring for what ``model`` may be).

        ``tokenizer``: a ``transformers`` tokenizer or a path to load one from (default: the model's own).
        ``device``: ``"auto"`` (CUDA if available, else CPU), ``"cpu"``, ``"cuda"``, ``"cuda:1"``, a
        ``torch.device``; a model instance stays where it is with ``"auto"``.
        ``dtype``: a torch dtype / name / ``"auto"``; None = bfloat16 on a CPU with native bfloat16
        (else float32), the checkpoint's dtype on GPU (:func:`resolve_dtype`).
        ``cache_dir``: overrides the cache folder for converted GGUF files.
        ``num_threads``: if given, ``torch.set_num_threads(num_threads)`` (process-wide!). The default
        leaves PyTorch's setting alone; on an oversubscribed CPU, 1 thread can be several times faster.
        ``prefix_cache_bytes``: budget of the prompt-prefix KV reuse (:mod:`.prefix_cache`; default
        64 MiB, 0 turns it off).
        """
        backend = cls._load(model, tokenizer=tokenizer, device=device, dtype=dtype, cache_dir=cache_dir, name=name,
                            trust_remote_code=trust_remote_code, num_threads=num_threads)
        if prefix_cache_bytes is not None:
            backend.prefix_cache = PrefixCache(prefix_cache_bytes)
        return backend

    @classmethod
    def _load(cls, model, *, tokenizer, device, dtype, cache_dir, name, trust_remote_code, num_threads):
        transformers = _transformers()
        if num_threads is not None:
            _torch().set_num_threads(int(num_threads))
        if model is not None and not isinstance(model, (str, os.PathLike)):
            return cls._from_instance(model, tokenizer=tokenizer, device=device, dtype=dtype, name=name,
                                      trust_remote_code=trust_remote_code)
        dev = resolve_device(device)
        dt = resolve_dtype(dtype, dev)
        if model is None:
            path = Path(embedded_model_path())
            default_name = EMBEDDED_MODEL_NAME
        else:
            path = Path(model).expanduser()
            default_name = None
        if path.is_dir() and not (path / "config.json").is_file():
            ggufs = sorted(path.glob("*.gguf"))
            if len(ggufs) == 1:
                path = ggufs[0]
        if path.is_file() and path.suffix.lower() == ".gguf":
            return cls._from_gguf(path, tokenizer=tokenizer, device=dev, dtype=dt, cache_dir=cache_dir,
                                  name=name or default_name or path.name.removesuffix(".gguf"))
        if path.is_dir():
            source, ident = "folder", str(path)
            default_name = path.resolve().name
        elif path.exists():
            raise ModelLoadError(f"{path} is neither a .gguf file nor a Hugging Face model folder")
        elif isinstance(model, str) and re.fullmatch(r"[\w.-]+/[\w.-]+", model):
            # a hub id: only what is in the local Hugging Face cache is used when HF_HUB_OFFLINE=1
            source, ident, default_name = "hub", model, model
        else:
            raise ModelNotFoundError(f"model path {str(model)!r} does not exist")
        try:
            hf_model = cls._from_pretrained(transformers, ident, dev, dt, trust_remote_code=trust_remote_code)
            tok = cls._load_tokenizer(tokenizer, ident, trust_remote_code=trust_remote_code)
        except (ModelLoadError, ModelNotFoundError):
            raise
        except Exception as e:
            raise ModelLoadError(f"cannot load model {ident}: {e}") from e
        return cls(hf_model, tok, name=name or default_name, source=source)

    @staticmethod
    def _from_pretrained(transformers: Any, ident: str, dev: Any, dt: Any, *, trust_remote_code: bool = False):
        kwargs: dict[str, Any] = {_dtype_kwarg(): dt}
        if trust_remote_code:
            kwargs["trust_remote_code"] = True
        if dev.type != "cpu":
            kwargs["device_map"] = {"": str(dev)}
        model = transformers.AutoModelForCausalLM.from_pretrained(ident, **kwargs)
        return model if _same_device(_model_device(model), dev) else model.to(dev)

    @staticmethod
    def _load_tokenizer(tokenizer: Any, ident: str | None, *, trust_remote_code: bool = False):
        if tokenizer is not None and not isinstance(tokenizer, (str, os.PathLike)):
            return tokenizer
        src = str(tokenizer) if tokenizer is not None else ident
        if src is None:
            raise ModelLoadError("no tokenizer: pass tokenizer= (a transformers tokenizer or a path)")
        transformers = _transformers()
        try:
            kwargs = {"trust_remote_code": True} if trust_remote_code else {}
            return transformers.AutoTokenizer.from_pretrained(src, **kwargs)
        except Exception as e:
            raise ModelLoadError(f"cannot load tokenizer from {src}: {e}") from e

    @classmethod
    def _from_instance(cls, model, *, tokenizer, device, dtype, name, trust_remote_code):
        torch = _torch()
        if not isinstance(model, torch.nn.Module) or not hasattr(model, "config"):
            raise ModelLoadError(
                f"model must be None, a path, or a transformers PreTrainedModel, not {type(model).__name__}"
            )
        if not (isinstance(device, str) and device == "auto") and device is not None:
            dev = resolve_device(device)
            if not _same_device(_model_device(model), dev):
                model = model.to(dev)
        if dtype is not None:
            dt = resolve_dtype(dtype, _model_device(model))
            if dt != "auto":
                model = model.to(dt)
        src = getattr(model, "name_or_path", None) or getattr(model.config, "_name_or_path", None)
        tok_src = src if (tokenizer is None and src and Path(src).is_dir()) else None
        if tokenizer is None and tok_src is None:
            raise ModelLoadError("pass tokenizer= with a model instance whose name_or_path is not a local folder")
        tok = cls._load_tokenizer(tokenizer, tok_src, trust_remote_code=trust_remote_code)
        default = Path(src).name if src else type(model).__name__
        return cls(model, tok, name=name or default, source="instance")

    @classmethod
    def _from_gguf(cls, path: Path, *, tokenizer, device, dtype, cache_dir, name):
        transformers = _transformers()
        path = path.resolve()
        folder = gguf_cache_folder(path, cache_dir)
        if _cache_is_complete(folder):
            try:
                hf_model = cls._from_pretrained(transformers, str(folder), device, dtype)
                tok = cls._load_tokenizer(tokenizer, str(folder))
                return cls(hf_model, tok, name=name, source="gguf-cache", cache_folder=str(folder))
            except Exception as e:  # corrupt cache: convert again
                logger.warning("cached conversion %s is unusable (%s); converting %s again", folder, e, path)
                _discard_cache(folder)
        logger.info("converting %s to a Hugging Face folder in %s (one-time; slow)", path, folder)
        t0 = time.perf_counter()
        hf_model, gguf_tok = _load_from_gguf(path)
        try:
            _write_cache(hf_model, gguf_tok, path, folder)
        except OSError as e:
            logger.warning("cannot cache the converted model in %s (%s); using it from memory", folder, e)
            hf_model = hf_model.to(dtype=dtype) if dtype != "auto" else hf_model
            hf_model = hf_model.to(device)
            tok = cls._load_tokenizer(tokenizer, None) if tokenizer is not None else gguf_tok
            return cls(hf_model, tok, name=name, source="gguf-memory")
        logger.info("converted %s in %.1f s", path.name, time.perf_counter() - t0)
        del hf_model, gguf_tok
        # reload from the folder: the same state as every later (cached) start
        hf_model = cls._from_pretrained(transformers, str(folder), device, dtype)
        tok = cls._load_tokenizer(tokenizer, str(folder))
        return cls(hf_model, tok, name=name, source="gguf-converted", cache_folder=str(folder))

    # ------------------------------------------------------------------ text
    def apply_chat_template(self, messages: list[dict], *, tools: list[dict] | None = None,
                            add_generation_prompt: bool = True) -> list[int]:
        """Token ids of the chat prompt rendered with the tokenizer's chat template."""
        if not getattr(self.tokenizer, "chat_template", None):
            raise ModelLoadError(f"the tokenizer of {self.name} has no chat template")
        kwargs: dict[str, Any] = {"add_generation_prompt": add_generation_prompt, "tokenize": True}
        if tools:
            kwargs["tools"] = tools
        out = self.tokenizer.apply_chat_template(messages, **kwargs)
        return _chat_ids(out)

    def encode(self, text: str) -> list[int]:
        """Token ids of plain text, no special tokens added."""
        return [int(i) for i in self.tokenizer.encode(text, add_special_tokens=False)]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def warmup(self) -> None:
        """One-time measurements before serving (the engine's warm-up calls it): the CPU batch-size
        calibration of :mod:`.row_padding` (0.2-1.4 s here), which would otherwise stall the first
        batched decode step."""
        if self.row_padding.enabled and self.row_padding.table is None:
            with self._lock:
                self.row_padding.calibrate(self.model)

    # ------------------------------------------------------------------ sequences
    def new_sequence(self) -> TransformersSequence:
        """A fresh per-request state (no slot until its first forward, position 0)."""
        return TransformersSequence()

    def forward(self, seqs: Sequence[TransformersSequence], tokens: Sequence[Sequence[int]]):
        """Append ``tokens[i]`` to ``seqs[i]`` and return the last position's logits of every sequence:
        float32 ``[len(seqs), vocab_size]`` on :attr:`device`. Empty ``tokens[i]`` return the sequence's
        previous last logits.

        Every argument is checked before any model call (a bad row raises and changes nothing). A new
        sequence first copies the longest kept prompt prefix (:mod:`.prefix_cache`). Then rows of
        unequal lengths (prompts joining decode rows) go through ONE packed call when its attention
        stays cheap (:meth:`_packable`); otherwise rows of at most :data:`BATCH_MAX_TOKENS` tokens
        (decode steps, fast-forward runs) go through ONE left-padded call over the slot cache
        (:mod:`.batch_cache`; on CPU padded to a faster batch size, :mod:`.row_padding`), and longer
        rows (prompts) are prefilled in their own calls: prompts of similar lengths together
        (:func:`_prefill_groups`), a long one alone in chunks of :data:`PREFILL_CHUNK`."""
        torch = _torch()
        if len(seqs) != len(tokens):
            raise SequenceError(f"{len(seqs)} sequences but {len(tokens)} token lists")
        if not seqs:
            return torch.empty((0, self.vocab_size), dtype=torch.float32, device=self.torch_device)
        if len({id(s) for s in seqs}) != len(seqs):
            raise SequenceError("the same sequence appears twice in one forward call")
        ids = [self._check(seq, toks) for seq, toks in zip(seqs, tokens)]
        with self._lock, torch.inference_mode():
            prompts = self._reuse_prefixes(seqs, ids)
            live = [i for i, t in enumerate(ids) if t]
            if self._packable([seqs[i] for i in live], [ids[i] for i in live]):
                self._run([seqs[i] for i in live], [ids[i] for i in live], packed=True)
                live = []
            short = [i for i in live if len(ids[i]) <= BATCH_MAX_TOKENS]
            for group in _prefill_groups([i for i in live if len(ids[i]) > BATCH_MAX_TOKENS], ids):
                if len(group) == 1:
                    t = ids[group[0]]
                    for start in range(0, len(t), PREFILL_CHUNK):
                        self._run([seqs[group[0]]], [t[start : start + PREFILL_CHUNK]])
                else:
                    self._run([seqs[i] for i in group], [ids[i] for i in group])
            if short:
                self._run([seqs[i] for i in short], [ids[i] for i in short])
            for seq, t in prompts:
                if not self.prefix_cache.covered(t):
                    self.prefix_cache.store(t, *self._pool.read(seq.slot, len(t)))
            rows = [seq.last_logits for seq in seqs]
        # outside inference mode: ordinary tensors the caller may modify in place (bitmask application)
        return torch.stack(rows)

    def _check(self, seq: TransformersSequence, toks: Sequence[int]) -> list[int]:
        if not isinstance(seq, TransformersSequence):
            raise SequenceError(f"not a sequence of this backend: {type(seq).__name__}")
        if seq.released:
            raise SequenceError("forward on a released sequence")
        if seq.broken:
            raise SequenceError("the sequence's cache is in an unknown state after an earlier failure")
        ids = [int(t) for t in toks]
        if not ids and seq.last_logits is None:
            raise SequenceError("forward with no tokens on an empty sequence")
        bad = [t for t in ids if not 0 <= t < self.vocab_size]
        if bad:
            raise SequenceError(f"token ids out of range [0, {self.vocab_size}): {bad[:5]}")
        if seq.length + len(ids) > self.max_context:
            raise ContextLengthError(
                f"sequence of {seq.length} tokens + {len(ids)} new exceeds max_context {self.max_context}"
            )
        return ids

    def _reuse_prefixes(self, seqs: Sequence[TransformersSequence], ids: list[list[int]]) -> list:
        """Sequences starting now (position 0): copy the longest cached prompt prefix into their slot
        and leave only the rest in ``ids`` (:mod:`.prefix_cache`). Returns the ``(sequence, first
        call's ids)`` to keep in the prefix cache once the call is done."""
        cache = self.prefix_cache
        if not cache.enabled:
            return []
        prompts = []
        for i, (seq, t) in enumerate(zip(seqs, ids)):
            if seq.length != 0 or len(t) < cache.min_tokens:
                continue
            prompts.append((seq, t))
            entry, n = cache.lookup(t)
            if entry is None:
                continue
            try:
                if seq.slot is None:
                    seq.slot = self._pool.alloc()
                self._pool.load(seq.slot, entry.keys[:, :, :n], entry.values[:, :, :n])
            except BaseException:
                seq.broken = True
                raise
            seq.length = n
            ids[i] = t[n:]
        return prompts

    def _packable(self, seqs: list[TransformersSequence], ids: list[list[int]]) -> bool:
        """Rows of unequal lengths (prompts or fast-forward runs beside decode tokens), where left-padding
        them to the longest would add more than PREFILL_PAD_RATIO to the tokens run, within
        PREFILL_CHUNK tokens and the attention budget: one packed call instead of a padded call and
        prefill calls (measured on the embedded model, 2 threads: 7 decode rows + 2 prompts of 19
        tokens 319 ms in two calls, ~170 ms packed)."""
        if len(seqs) < 2:
            return False
        n = sum(len(t) for t in ids)
        if len(ids) * max(len(t) for t in ids) <= PREFILL_PAD_RATIO * n or n > PREFILL_CHUNK:
            return False
        if self._pack_max_keys is None:
            return True
        return sum(s.length + len(t) for s, t in zip(seqs, ids)) <= self._pack_max_keys

    def _run(self, seqs: list[TransformersSequence], ids: list[list[int]], packed: bool = False) -> None:
        """One model call appending ``ids[i]`` to ``seqs[i]`` (all non-empty); sets ``last_logits``.
        Left-padded rows ``[B, max len]`` (decode steps, prompt groups), or ``packed``: all tokens in
        one row ``[1, sum len]`` (:meth:`.batch_cache.SlotKVPool.packed_step`)."""
        try:
            for seq in seqs:
                if seq.slot is None:
                    seq.slot = self._pool.alloc()
            order = sorted(range(len(seqs)), key=lambda i: seqs[i].slot)  # consecutive slots: no gather
            seqs, ids = [seqs[i] for i in order], [ids[i] for i in order]
            counts = [len(t) for t in ids]
            if packed:
                logits = self._call_packed(seqs, ids, counts)
            else:
                logits = self._call_padded(seqs, ids, counts)
            self.call_stats["packed" if packed else "padded"] += 1
        except BaseException:
            for seq in seqs:
                seq.broken = True
            raise
        for row, (seq, n) in enumerate(zip(seqs, counts)):
            seq.length += n
            seq.last_logits = logits[row]

    def _call_packed(self, seqs, ids, counts):
        torch = _torch()
        slots, starts = [s.slot for s in seqs], [s.length for s in seqs]
        cache, position_ids, allowed, last = self._pool.packed_step(
            slots, starts, counts, self.torch_device, per_row=self._row_attention)
        input_ids = torch.tensor([[t for row in ids for t in row]], dtype=torch.long, device=self.torch_device)
        mask = self._additive_mask(allowed)
        keep = {k: last for k in self._logits_kw}  # the rows' last tokens only (a 1-D index tensor)
        layout = (packed_attention.packed_layout([(sl, st + n, n) for sl, st, n in zip(slots, starts, counts)],
                                                 self.torch_device)
                  if self._row_attention else contextlib.nullcontext())
        with layout:
            out = self.model(input_ids=input_ids, attention_mask=mask, position_ids=position_ids,
                             **{self._cache_kw: cache}, use_cache=True, **keep)
        logits = out.logits[0] if keep else out.logits[0, last]
        return logits.to(torch.float32)

    def _call_padded(self, seqs, ids, counts):
        torch = _torch()
        Q = max(counts)
        n_pad = self.row_padding.pad(len(seqs), self.model) - len(seqs) if Q == 1 else 0
        cache, position_ids, allowed = self._pool.step(
            [s.slot for s in seqs], [s.length for s in seqs], counts, self.torch_device, pad_rows=n_pad)
        self.call_stats["pad_rows"] += n_pad
        pad_id = ids[0][0]
        input_ids = torch.tensor([[pad_id] * (Q - len(t)) + t for t in ids] + [[pad_id] * Q] * n_pad,
                                 dtype=torch.long, device=self.torch_device)
        mask = self._additive_mask(allowed)
        out = self.model(input_ids=input_ids, attention_mask=mask, position_ids=position_ids,
                         **{self._cache_kw: cache}, use_cache=True, **self._logits_kw)
        return out.logits[: len(seqs), -1].to(torch.float32)

    def _additive_mask(self, allowed):
        """The model's 4-D attention mask from a boolean "may attend" one: 0 where allowed, the
        dtype's minimum elsewhere."""
        torch = _torch()
        mask = torch.zeros(allowed.shape, dtype=self.dtype, device=self.torch_device)
        return mask.masked_fill_(~allowed, torch.finfo(self.dtype).min)

    def release(self, seq: TransformersSequence) -> None:
        """Free the sequence's slot in the cache (idempotent)."""
        with self._lock:
            if seq.slot is not None:
                self._pool.free(seq.slot)
                seq.slot = None
        seq.last_logits = None
        seq.released = True

    def __repr__(self) -> str:
        return (
            f"TransformersBackend(name={self.name!r}, device={self.device!r}, dtype={self.dtype}, "
            f"vocab_size={self.vocab_size}, max_context={self.max_context}, source={self.source!r})"
        )


def _prefill_groups(rows: list[int], ids: list[list[int]]) -> list[list[int]]:
    """Rows to prefill, grouped for left-padded calls: by length, a group grows while its padded size
    (rows x longest) stays within :data:`PREFILL_CHUNK` tokens and :data:`PREFILL_PAD_RATIO` x its real
    tokens. Measured on the embedded model (CPU, 1 thread): 8 prompts of ~44 tokens take 1.0 s in one
    call, 1.5 s one by one; a prompt padded into the decode rows' call costs 3x its own call."""
    groups: list[list[int]] = []
    real = 0
    for i in sorted(rows, key=lambda r: len(ids[r])):
        n = len(ids[i])
        if groups and (len(groups[-1]) + 1) * n <= min(PREFILL_CHUNK, PREFILL_PAD_RATIO * (real + n)):
            groups[-1].append(i)
            real += n
        else:
            groups.append([i])
            real = n
    return groups


def _pack_max_keys(model: Any) -> int:
    """Keys a packed call may attend over: attention costs ~``4 * heads * head_dim`` flops per query
    and key per layer, the linear layers ``2 * (weights of one decoder layer)`` per token; the extra
    keys of the other rows stay within PACK_ATTENTION_SHARE of the latter."""
    torch = _torch()
    cfg = getattr(model, "config", None)
    heads = getattr(cfg, "num_attention_heads", None)
    hidden = getattr(cfg, "hidden_size", None)
    head_dim = getattr(cfg, "head_dim", None) or (hidden // heads if heads and hidden else None)
    blocks = [m for m in model.modules() if isinstance(m, torch.nn.ModuleList) and len(m) > 1]
    if not heads or not head_dim or not blocks:
        return 0  # unknown shape: never pack
    per_layer = sum(m.weight.numel() for m in blocks[0][0].modules() if isinstance(m, torch.nn.Linear))
    return int(PACK_ATTENTION_SHARE * 2 * per_layer / (4 * heads * head_dim))


def _same_device(have: Any, want: Any) -> bool:
    """``have`` (a concrete device) is ``want`` (an index-less ``cuda`` means the current CUDA device)."""
    if have.type != want.type:
        return False
    if want.index is None or have.type == "cpu":
        return have.type != "cuda" or have.index == _torch().cuda.current_device()
    return have.index == want.index


def _model_device(model: Any):
    torch = _torch()
    p = next(iter(model.parameters()), None)
    return p.device if p is not None else torch.device("cpu")


__all__ = [
    "CACHE_FORMAT",
    "ContextLengthError",
    "ModelLoadError",
    "SequenceError",
    "TransformersBackend",
    "TransformersSequence",
    "gguf_cache_folder",
    "resolve_device",
    "cpu_has_native_bf16",
    "resolve_dtype",
]
