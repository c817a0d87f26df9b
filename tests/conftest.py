"""Session-wide test setup: the disk cache of tokenizer artefacts is off unless a test turns it on.

``GRAMMASK_DISK_CACHE=0`` is set before any test module is imported (so also for the subprocesses
the tests start, which inherit the environment): the token tries and slice forests the tests build
(:mod:`grammask.grammar.tokenizer_cache`) are never written into, nor read from, the user's cache,
so a test never depends on what an earlier run left there. tests/test_tokenizer_cache.py turns the
cache on, in temporary folders. The backends' converted checkpoints keep their usual cache folder
(converting the embedded GGUF once per machine, not once per test session).
"""
from __future__ import annotations

import os

_SAVED: dict[str, str | None] = {}


def pytest_configure(config):
    _SAVED["GRAMMASK_DISK_CACHE"] = os.environ.get("GRAMMASK_DISK_CACHE")
    os.environ["GRAMMASK_DISK_CACHE"] = "0"


def pytest_unconfigure(config):
    for name, value in _SAVED.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
