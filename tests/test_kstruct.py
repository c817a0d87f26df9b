"""Kernel records (grammar/kstruct.py): one boxed struct per named tuple of arrays."""
from collections import namedtuple

import numpy as np
import pytest
from numba import njit

from grammask.grammar.kstruct import KStruct, kstruct

Rec = namedtuple("Rec", "a b c")


@njit(cache=False)
def _sum_and_write(r, k):
    r.b[k] = r.a[k] * 10
    return r.a.sum() + r.c[0, 1]


def _rec():
    return Rec(np.arange(5, dtype=np.int32), np.zeros(5, np.int64), np.ones((2, 3), np.float64))


def test_a_record_reads_like_its_tuple_in_python():
    t = _rec()
    r = kstruct(t)
    assert isinstance(r, KStruct)
    assert r._fields == ("a", "b", "c")
    assert r.a is t.a and r.b is t.b and r.c is t.c   # shared, not copied
    assert [x is y for x, y in zip(r, t)] == [True, True, True]
    assert len(r) == 3 and r[1] is t.b
    assert r._asdict().keys() == {"a", "b", "c"}
    assert kstruct(r) is r


def test_kernels_read_and_write_the_shared_arrays():
    t = _rec()
    r = kstruct(t)
    assert _sum_and_write(r, 3) == 10 + 1
    assert t.b[3] == 30   # the kernel wrote into the tuple's array
    t.a[0] = 100          # and sees writes made from Python
    assert _sum_and_write(r, 0) == 110 + 1
    assert t.b[0] == 1000


def test_replace_makes_a_new_record_with_the_new_array():
    t = _rec()
    r = kstruct(t)
    r2 = r._replace(a=np.full(5, 2, np.int32))
    assert isinstance(r2, KStruct) and r2.b is r.b and r2.a is not r.a
    assert _sum_and_write(r2, 1) == 10 + 1
    assert r.b[1] == 20        # b is shared by both records
    assert _sum_and_write(r, 1) == 10 + 1   # the old record still holds its own a
    assert r2.b[1] == 10


def test_a_record_keeps_its_arrays_alive():
    r = kstruct(Rec(np.arange(5, dtype=np.int32), np.zeros(5, np.int64), np.ones((2, 3))))
    import gc

    gc.collect()
    assert _sum_and_write(r, 2) == 11


def test_a_record_of_a_different_layout_is_a_different_type():
    a = kstruct(_rec())
    b = kstruct(Rec(np.arange(5, dtype=np.int64), np.zeros(5, np.int64), np.ones((2, 3))))
    assert a._type != b._type
    assert kstruct(_rec())._type == a._type


def test_the_matchers_kernels_take_records():
    """The mask and commit kernels are called with records (one pointer each to unbox), and
    with one signature each (so FastCall reaches their entry point)."""
    from grammask import GrammarCompiler, GrammarMatcher, TokenizerInfo
    from grammask.grammar import mask
    from grammask.grammar.kstruct import KStructType

    vocab = [bytes([c]) for c in b'{}":,abc0123456789 '] + [b'"a"', b'{"', b'":']
    info = TokenizerInfo.from_vocab([v.decode() for v in vocab], stop_token_ids=[])
    cg = GrammarCompiler(info).compile_regex("(ab|c)[0-9]+")
    m = GrammarMatcher(cg)
    for arr in (cg.G, m._M, m._walk, m._stack.arrays, m._lexer.tables, cg.forest.arrays):
        assert isinstance(arr, KStruct)
    m.get_next_token_bitmask()
    assert m.accept_token(vocab.index(b"c"))
    for fn in (mask.fill_mask, mask.advance_bytes):
        sigs = [s for s in fn.signatures if any(isinstance(x, KStructType) for x in s)]
        assert sigs, fn
        for s in fn.signatures:   # nothing in the engine calls them with plain tuples
            assert not any(type(x).__name__.startswith("Named") for x in s), s
    with pytest.raises(AttributeError):
        cg.G.no_such_field  # noqa: B018
