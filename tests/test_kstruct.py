"""Kernel records (grammar/kstruct.py): one boxed struct per named tuple of arrays."""
from collections import namedtuple

import numpy as np
import pytest
from numba import njit
from numba.core import cgutils, types
from numba.extending import intrinsic

from grammask.grammar.earley import MissingRequests
from grammask.grammar.kstruct import KStruct, kstruct, pack, unpack

# An engine tuple (MissingRequests: states start_lex start_off counts chains) holding arrays of the
# test's own: kstruct's cached constructor keeps the tuple class of every record it made, so the
# class must be importable in every process (see kstruct).


def _rec(states_dtype=np.int32):
    return MissingRequests(np.arange(5, dtype=states_dtype), np.zeros(5, np.int64), np.ones((2, 3)),
                           np.zeros(1, np.int8), np.zeros(1, np.int8))


@njit(cache=False)
def _sum_and_write(r, k):
    r.start_lex[k] = r.states[k] * 10
    return r.states.sum() + r.start_off[0, 1]


def test_a_record_reads_like_its_tuple_in_python():
    t = _rec()
    r = kstruct(t)
    assert isinstance(r, KStruct)
    assert r._fields == MissingRequests._fields
    assert r.states is t.states and r.start_lex is t.start_lex and r.chains is t.chains  # shared
    assert all(x is y for x, y in zip(r, t)) and len(r) == 5 and r[1] is t.start_lex
    assert list(r._asdict()) == list(MissingRequests._fields)
    assert kstruct(r) is r
    with pytest.raises(AttributeError):
        r.no_such_field  # noqa: B018


def test_kernels_read_and_write_the_shared_arrays():
    t = _rec()
    r = kstruct(t)
    assert _sum_and_write(r, 3) == 10 + 1
    assert t.start_lex[3] == 30   # the kernel wrote into the tuple's array
    t.states[0] = 100             # and sees writes made from Python
    assert _sum_and_write(r, 0) == 110 + 1
    assert t.start_lex[0] == 1000


def test_replace_makes_a_new_record_with_the_new_array():
    r = kstruct(_rec())
    r2 = r._replace(states=np.full(5, 2, np.int32))
    assert isinstance(r2, KStruct) and r2.start_lex is r.start_lex and r2.states is not r.states
    assert _sum_and_write(r2, 1) == 10 + 1
    assert r.start_lex[1] == 20               # start_lex is shared by both records
    assert _sum_and_write(r, 1) == 10 + 1     # the old record still holds its own states
    assert r2.start_lex[1] == 10


def test_a_record_keeps_its_arrays_alive():
    import gc

    r = kstruct(_rec())
    gc.collect()
    assert _sum_and_write(r, 2) == 11 and r.start_lex[2] == 20


def test_a_packed_record_is_untracked_and_unpacks_to_the_same_arrays():
    import gc
    import weakref

    t = _rec()
    refs = [weakref.ref(a) for a in t]
    p = pack(kstruct(t))
    del t                     # the packed form alone holds the arrays (its MemInfo and its fields)
    gc.collect()
    gc.collect()
    assert not gc.is_tracked(p), "a full collection walks every packed record a cache holds"
    r = unpack(p)
    assert isinstance(r, KStruct) and r._fields == MissingRequests._fields
    assert type(r._tuple) is MissingRequests and all(a is x() for a, x in zip(r, refs))
    assert r.start_lex is refs[1]() and r[0] is refs[0]()
    assert _sum_and_write(r, 2) == 10 + 1 and refs[1]()[2] == 20
    r2 = unpack(p)            # another proxy of the same payload
    assert r2 is not r and _sum_and_write(r2, 3) == 10 + 1 and r.start_lex[3] == 30
    was = gc.isenabled()
    gc.disable()
    try:
        del r, r2, p
        assert all(x() is None for x in refs)   # freed by their counts, no collector needed
    finally:
        if was:
            gc.enable()


def test_a_record_of_other_array_types_is_another_type():
    a = kstruct(_rec())
    assert kstruct(_rec())._type == a._type
    assert kstruct(_rec(np.int64))._type != a._type


def test_records_of_one_class_and_dtypes_share_one_constructor(monkeypatch):
    """kstruct calls the constructor's entry point of the first record of its class and dtypes
    (no dispatcher typing); a record whose fields differ in more than their dtypes (here one
    field's layout) is refused under the check mode (GRAMMASK_CHECK_FASTCALL=1)."""
    import grammask.grammar.kstruct as ks

    a = kstruct(_rec())
    assert (MissingRequests, tuple(x.dtype for x in _rec())) in ks._ENTRIES
    b = kstruct(_rec())
    assert b._type == a._type and _sum_and_write(b, 2) == 11 and b.start_lex[2] == 20
    monkeypatch.setattr(ks, "CHECK_FASTCALL", True)
    assert kstruct(_rec())._type == a._type
    odd = _rec()._replace(start_off=np.ones((2, 6))[:, ::2])   # same dtype and ndim, strided
    with pytest.raises(TypeError, match="beyond their dtypes"):
        kstruct(odd)


def test_only_the_engines_tuples():
    Other = namedtuple("Other", "a")
    with pytest.raises(TypeError, match="engine's named tuples"):
        kstruct(Other(np.zeros(1)))


def test_the_matchers_kernels_take_records():
    """The mask and commit kernels are called with records (one pointer each to unbox), and
    never with plain tuples (so each keeps one signature and FastCall reaches its entry point)."""
    from grammask import GrammarCompiler, GrammarMatcher, TokenizerInfo
    from grammask.grammar import mask
    from grammask.grammar.kstruct import KStructType

    vocab = [bytes([c]) for c in b'{}":,abc0123456789 '] + [b'"a"', b'{"', b'":']
    info = TokenizerInfo.from_vocab(vocab, stop_token_ids=[])
    cg = GrammarCompiler(info).compile_regex("(ab|c)[0-9]+")
    m = GrammarMatcher(cg)
    for rec in (cg.G, m._M, m._walk, m._stack.arrays, m._lexer.tables, cg.forest.arrays):
        assert isinstance(rec, KStruct)
    m.get_next_token_bitmask()
    assert m.accept_token(vocab.index(b"c"))
    for fn in (mask.fill_mask, mask.advance_bytes):
        assert any(isinstance(x, KStructType) for s in fn.signatures for x in s), fn
        for s in fn.signatures:
            assert not any(type(x).__name__.startswith("Named") for x in s), s


def test_a_dropped_record_frees_its_arrays_without_the_cyclic_collector():
    import gc
    import weakref

    t = _rec()
    refs = [weakref.ref(a) for a in t]
    r = kstruct(t)
    del t
    was = gc.isenabled()
    gc.disable()
    try:
        assert _sum_and_write(r, 0) == 11 and all(x() is not None for x in refs)
        del r
        assert all(x() is None for x in refs)
    finally:
        if was:
            gc.enable()


@intrinsic
def _meminfo(typingctx, a):
    """The address of an array's reference-counted owner (0: none), in a kernel."""
    def codegen(context, builder, sig, args):
        ary = context.make_array(sig.args[0])(context, builder, value=args[0])
        return builder.ptrtoint(ary.meminfo, cgutils.intp_t)
    return types.intp(a), codegen


@njit(cache=False)
def _field_meminfos(r):
    own = r.states.copy()
    return _meminfo(r.states), _meminfo(r.start_off), _meminfo(own)


def test_a_field_read_in_a_kernel_is_borrowed_from_the_record():
    """A field read in a kernel has no reference-counted owner (reference-count updates on it
    are a test for NULL, not atomic adds); an array the kernel makes has one."""
    r = kstruct(_rec())
    states, start_off, own = _field_meminfos(r)
    assert states == 0 and start_off == 0 and own != 0


@njit(cache=False)
def _fields_back(r):
    return r.states, r.start_off[1:].copy()


def test_a_field_returned_whole_is_the_array_itself():
    t = _rec()
    r = kstruct(t)
    whole, copy = _fields_back(r)
    assert whole is t.states
    assert copy.flags.owndata or copy.base is not None


def test_no_kernel_hands_python_an_array_without_owner():
    """Borrowed field views must not outlive the call that read them: every array a kernel returns
    to Python is a field returned whole (NumPy gets the array itself), a copy, or a new array,
    never a view with no owner. Checked on every kernel call made from Python while a JSON
    schema, a regex and an EBNF grammar are compiled, masked and advanced (``conftest`` runs the
    same check over the whole suite with ``GRAMMASK_CHECK_OWNERLESS=1``); the check itself is
    shown to catch a field's row returned as a view."""
    from grammask import GrammarCompiler, GrammarMatcher, TokenizerInfo

    from _support import ownerless_arrays_returned

    vocab = [bytes([c]) for c in b'{}[]()":,abcxyz0123456789 .-'] + [b'"a"', b'{"', b'":', b'ab', b'12']
    info = TokenizerInfo.from_vocab(vocab, stop_token_ids=[])
    schema = {"type": "object", "properties": {"a": {"type": "string", "pattern": "^[a-c]{1,3}$"},
                                               "b": {"type": "array", "items": {"type": "integer"}}},
              "required": ["a", "b"]}
    comp = GrammarCompiler(info, cache_enabled=False)
    with ownerless_arrays_returned() as bad:
        for text, cg in [('{"a":"ab","b":[12,3]}', comp.compile_json_schema(schema)),
                         ("ab12", comp.compile_regex("(ab|c)[0-9]+")),
                         ("x(y)z", comp.compile_grammar('root ::= [a-z] ("(" [a-z] ")")* [a-z]'))]:
            m = GrammarMatcher(cg)
            for ch in text.encode():
                m.get_next_token_bitmask()
                assert m.accept_token(vocab.index(bytes([ch]))), text
            m.get_next_token_bitmask()
            assert m.can_terminate()
    assert not bad, sorted(set(bad))

    @njit(cache=False)
    def row_view(r):
        return r.start_off[1]

    with ownerless_arrays_returned() as bad:
        row_view(kstruct(_rec()))
    assert bad and bad[0].endswith("row_view")


def test_kernels_do_not_count_a_record_they_are_given():
    """A record is held once per call from Python (released when the call returns) and not
    counted again by the kernels it is passed to: its MemInfo's count is the same before and
    after many calls."""
    r = kstruct(_rec())
    _sum_and_write(r, 1)
    before = r._meminfo.refcount
    for _ in range(100):
        _sum_and_write(r, 1)
    assert r._meminfo.refcount == before == 1


def test_a_record_field_of_record_type_is_refused():
    inner = kstruct(_rec())
    with pytest.raises(Exception, match="not records"):
        kstruct(MissingRequests(inner, np.zeros(1, np.int64), np.zeros((1, 1)), np.zeros(1, np.int8),
                                np.zeros(1, np.int8)))
