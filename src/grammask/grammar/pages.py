"""Row tables that are address space until used: allocated without huge-page advice.

The lexer's transition rows (``Lexer.trans``) and the lexeme DFAs' rows (``LexemeDFAs.g_next``)
are allocated for thousands of states and written one 1 KiB row at a time, as states are made
(nothing reads a row before it is written). Their capacity is meant to cost address space, not
memory. ``numpy.empty`` does not give that on Linux: numpy advises transparent huge pages
(``madvise(MADV_HUGEPAGE)``) for every array of 4 MiB or more (the lexers' first tables are
exactly 4 MiB), and with the system's THP mode ``madvise`` (the common default) the first row
written in each 2 MiB of such a table then makes the kernel find and zero a whole 2 MiB page.
A mask that builds a few thousand states paid for several of them at once: alone in a process,
Github_ultra---o21135's slowest mask took 54-57 ms with them and 25-29 ms without, Github_hard---
o21073's 39-56 ms against 21-22 ms (this project's 2-core host, where a huge page fault cost
milliseconds), and every new lexer held 2 MiB of each table from its first state on.

:func:`row_table` allocates such a table with numpy's huge-page advice switched off for the
call (numpy's own switch, process-wide: set and restored under a lock held for the allocation
only, so that threads allocating tables at the same time leave it as it was). The table is still
an ordinary numpy allocation: freed tables' memory is reused by the next ones, which a table of
its own (an anonymous mapping per table) was not: that variant cost 11% of the 1-in-20 MaskBench
mask time and 12% of its time to first mask, in 4 KiB page faults on every new lexer's rows.
Where numpy has no such switch (it is private API) the table is a plain ``numpy.empty``, as
before.
"""
from __future__ import annotations

import importlib
import threading

import numpy as np

#: numpy advises huge pages from this size on (``alloc.c``: ``nelem * esize >= 1 << 22``)
NUMPY_HUGEPAGE_BYTES = 1 << 22


def _hugepage_switch():
    """numpy's ``_set_madvise_hugepage(enabled) -> previous`` (numpy 2: ``numpy._core``, 1.x:
    ``numpy.core``), or None."""
    for mod in ("numpy._core.multiarray", "numpy.core.multiarray"):
        try:
            m = importlib.import_module(mod)
        except ImportError:
            continue
        f = getattr(m, "_set_madvise_hugepage", None)
        if f is not None:
            return f
    return None


_SET_HUGEPAGE = _hugepage_switch()
#: held while numpy's switch is off (re-entrant: a table allocated inside another's allocation,
#: as a test does, restores what the outer one set)
_LOCK = threading.RLock()


def row_table(n: int, dtype) -> np.ndarray:
    """An uninitialised 1-d array of ``n`` entries of ``dtype`` that numpy does not advise huge
    pages for (see the module's text)."""
    dt = np.dtype(dtype)
    if _SET_HUGEPAGE is None or int(n) * dt.itemsize < NUMPY_HUGEPAGE_BYTES:
        return np.empty(n, dt)
    with _LOCK:
        before = _SET_HUGEPAGE(False)
        try:
            return np.empty(n, dt)
        finally:
            _SET_HUGEPAGE(before)
