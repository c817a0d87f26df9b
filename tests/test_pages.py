"""Row tables (grammar/pages.py): the lexer's and the lexeme DFAs' 256-entry row tables are
allocated without numpy's huge-page advice, and numpy's own setting is left as it was."""
from __future__ import annotations

import sys
import threading

import numpy as np
import pytest

from grammask.grammar import lexdfa, pages
from grammask.grammar.lexer import EAGER_INITIAL_STATES, Lexer
from grammask.grammar.regex import parse_regex
from grammask.grammar.regexset import ExprSet

needs_switch = pytest.mark.skipif(pages._SET_HUGEPAGE is None, reason="this numpy has no huge-page switch")


def _vm_flags(a: np.ndarray):
    """The VmFlags of the mapping holding the middle of ``a`` (Linux), or None."""
    addr = a.__array_interface__["data"][0] + a.nbytes // 2
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if head and "-" in head[0] and not head[0].endswith(":"):
                lo, _, hi = head[0].partition("-")
                inside = int(lo, 16) <= addr < int(hi, 16)
            elif inside and head and head[0] == "VmFlags:":
                return head[1:]
    return None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="VmFlags are Linux's")
@needs_switch
def test_a_row_table_is_not_advised_huge_pages_where_numpy_would():
    # 64 MiB: past glibc's largest mmap threshold, so each array is a mapping of its own
    n = 64 << 20
    plain = np.empty(n, np.uint8)
    table = pages.row_table(n, np.uint8)
    assert table.shape == (n,) and table.dtype == np.uint8 and table.flags.writeable
    assert "hg" in _vm_flags(plain)        # numpy advised huge pages (MADV_HUGEPAGE) ...
    assert "hg" not in _vm_flags(table)    # ... and not for the row table


@needs_switch
@pytest.mark.parametrize("before", [True, False])
def test_numpys_setting_is_off_for_the_allocation_only_and_restored(monkeypatch, before):
    switch = pages._SET_HUGEPAGE
    seen = []
    real_empty = np.empty

    def spy(n, dt):
        now = switch(False)   # (reads the setting: sets it back below)
        switch(now)
        seen.append((n, now))
        if len(seen) == 1:    # a table allocated while another is: restored once, after both
            inner = pages.row_table(pages.NUMPY_HUGEPAGE_BYTES, np.uint8)
            assert inner.nbytes == pages.NUMPY_HUGEPAGE_BYTES
        return real_empty(n, dt)

    old = switch(before)
    try:
        monkeypatch.setattr(pages.np, "empty", spy)
        pages.row_table(1 << 20, np.int32)          # 4 MiB: numpy would advise it
        assert seen == [(1 << 20, False), (pages.NUMPY_HUGEPAGE_BYTES, False)]
        assert switch(before) is before              # restored to what it was
        seen.clear()
        pages.row_table(1000, np.int32)              # small: numpy advises nothing, left alone
        assert seen[0] == (1000, before)
    finally:
        switch(old)


@needs_switch
def test_threads_allocating_tables_leave_numpys_setting_as_it_was():
    switch = pages._SET_HUGEPAGE
    old = switch(True)
    try:
        def work():
            for _ in range(50):
                pages.row_table(pages.NUMPY_HUGEPAGE_BYTES // 4, np.int32)

        ts = [threading.Thread(target=work) for _ in range(4)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        assert switch(True) is True
    finally:
        switch(old)


def test_the_lexers_row_tables_are_row_tables(monkeypatch):
    made = []
    real = pages.row_table

    def spy(n, dt):
        a = real(n, dt)
        made.append(a)
        return a

    monkeypatch.setattr(pages, "row_table", spy)
    ex = ExprSet()
    lx = Lexer(ex, [parse_regex('"[a-z]{0,40}"', ex), parse_regex("[0-9]+", ex)], eager=True)
    assert any(a is lx.trans for a in made)
    assert any(a is lx._X.g_next for a in made)
    assert lx.trans.shape[0] == EAGER_INITIAL_STATES * 256
    made.clear()
    X = lexdfa.grow_dfas(lx._X, 4 * lx._X.g_next.shape[0] // 256)
    assert any(a is X.g_next for a in made)
    made.clear()
    lx._grow_states(2 * EAGER_INITIAL_STATES)
    assert any(a is lx.trans for a in made)
