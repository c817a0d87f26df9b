"""Session-wide test setup: the disk cache of tokenizer artefacts is off unless a test turns it on.

``GRAMMASK_DISK_CACHE=0`` is set before any test module is imported (so also for the subprocesses
the tests start, which inherit the environment): the token tries and slice forests the tests build
(:mod:`grammask.grammar.tokenizer_cache`) are never written into, nor read from, the user's cache,
so a test never depends on what an earlier run left there. tests/test_tokenizer_cache.py turns the
cache on, in temporary folders. The backends' converted checkpoints keep their usual cache folder
(converting the embedded GGUF once per machine, not once per test session).

``GRAMMASK_CHECK_OWNERLESS=1`` runs the whole session under
:func:`_support.ownerless_arrays_returned`: it fails if any kernel handed Python an array view of
a record's field (borrowed, see grammar/kstruct.py) in any test.
"""
from __future__ import annotations

import os

_SAVED: dict[str, str | None] = {}


_OWNERLESS: list = []


def pytest_configure(config):
    _SAVED["GRAMMASK_DISK_CACHE"] = os.environ.get("GRAMMASK_DISK_CACHE")
    os.environ["GRAMMASK_DISK_CACHE"] = "0"
    if os.environ.get("GRAMMASK_CHECK_OWNERLESS") == "1":
        from _support import ownerless_arrays_returned

        cm = ownerless_arrays_returned()
        _OWNERLESS[:] = [cm, cm.__enter__()]


def pytest_sessionfinish(session, exitstatus):
    if _OWNERLESS:
        cm, bad = _OWNERLESS
        cm.__exit__(None, None, None)
        bad = [b for b in bad if b.startswith("grammask.")]   # not test_kstruct's own example
        if bad:
            print(f"\nkernels that returned an array without owner: {sorted(set(bad))}")
            session.exitstatus = 1


def pytest_unconfigure(config):
    for name, value in _SAVED.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
