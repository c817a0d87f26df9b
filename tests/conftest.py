"""Session-wide test setup: grammask's cache folder is a temporary folder of the test session.

``GRAMMASK_CACHE_DIR`` is pointed at a fresh temporary folder before any test module is imported
(so also for the subprocesses the tests start, which inherit the environment) and removed at the
end: the tokenizer artefacts (:mod:`grammask.grammar.tokenizer_cache`) and the backends' converted
checkpoints are never written into, nor read from, the user's own cache. ``GRAMMASK_DISK_CACHE``
is cleared so the default (cache on) is what runs; tests that need another folder or setting
monkeypatch them.
"""
from __future__ import annotations

import os
import shutil
import tempfile

_SAVED: dict[str, str | None] = {}
_DIR: list[str] = []


def pytest_configure(config):
    for name in ("GRAMMASK_CACHE_DIR", "GRAMMASK_DISK_CACHE"):
        _SAVED[name] = os.environ.pop(name, None)
    d = tempfile.mkdtemp(prefix="grammask-test-cache-")
    _DIR.append(d)
    os.environ["GRAMMASK_CACHE_DIR"] = d


def pytest_unconfigure(config):
    for name, value in _SAVED.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    for d in _DIR:
        shutil.rmtree(d, ignore_errors=True)
    _DIR.clear()
