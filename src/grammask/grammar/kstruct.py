"""Kernel records: a named tuple of arrays handed to the Numba kernels as one boxed struct.

The kernels take their arrays grouped in named tuples (the forest's ``F``, the grammar's ``G``,
the lexer's ``L``, a parse stack's ``P``, ...). Numba unboxes a named tuple field by field on
every call from Python: with the mask kernel's ~60 arrays that took half of a warm mask (a warm
JSON-schema mask went from 11.5 to 5.9 µs once they were records, a commit from 4.0 to 2.5 µs;
docs/mask.md). A :class:`KStruct` holds the same arrays in one Numba ``StructRef`` (one
pointer to unbox) and reads like the named tuple it was made from, in kernels and in Python:
``F.node_byte`` in both; iteration, ``_replace`` and ``_asdict`` in Python.

A record never changes after it is made: writes go into its arrays (shared with the tuple), and an
array replaced (grown) means a new record (``rec._replace(...)``, as for a named tuple). The
struct type follows the tuple's field names and array types, so each kind of record compiles its
kernels once; :func:`kstruct`'s constructor is cached on disk like the kernels.

Nothing is reference-counted inside the kernels (docs/lexer.md: those atomic counts were 15% of a
MaskBench pass): a record is a plain pointer there, held once by the call from Python, and a field
read in a kernel is a borrowed view of the record's array. Such a view must not outlive the call:
a kernel returns a field whole (NumPy gets the array itself back) or a copy, never a slice, and
returns no record but the one :func:`_to_struct` makes; ``GRAMMASK_CHECK_OWNERLESS=1 pytest``
checks both on every kernel call of the suite.
"""
from __future__ import annotations

import os

from numba import njit, types
from numba.core import cgutils, imputils
from numba.core.datamodel import default_manager, models
from numba.core.extending import (NativeValue, box, infer_getattr, lower_getattr_generic, lower_setattr_generic,
                                    overload, unbox)
from numba.core.typing.templates import AttributeTemplate
from numba.experimental import structref


class KStructType(types.StructRef):
    """The Numba type of a :class:`KStruct`: one field per field of the named tuple."""

    def preprocess_fields(self, fields):
        return tuple((name, types.unliteral(t)) for name, t in fields)


class _KStructModel(models.StructModel):
    """A record in a kernel: the pointer to its payload's MemInfo, as ``StructRefModel``, but typed
    as a plain pointer, so that Numba does not count it. A record passed from kernel to kernel is
    borrowed from the Python object the outermost call was given (which holds it alive until that
    call returns), where ``StructRefModel`` made an atomic add on entry and another on each exit
    of every call it was passed to (``_memo_put``'s only counts: 24% of what was left of them)."""

    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, [("meminfo", types.voidptr)])


# Registered by hand rather than with ``structref.register``: the same layout and field writes
# (made only by the constructor), but the record is not counted in kernels (``_KStructModel``) and
# an array field is read as a *borrowed* view (``_getattr``).
default_manager.register(KStructType, _KStructModel)


@infer_getattr
class _KStructAttribute(AttributeTemplate):
    key = KStructType

    def generic_resolve(self, typ, attr):
        return typ.field_dict.get(attr)


@lower_getattr_generic(KStructType)
def _getattr(context, builder, typ, val, attr):
    """``S.field`` in a kernel. An array field comes back without its reference-counted owner
    (``meminfo`` NULL; ``parent``, the NumPy array, kept): the record holds the array alive for as
    long as the kernel holds the record, and every reference-count update of the view (on each
    read, on each call it is passed to, at each exit of those calls) is then a test for NULL
    instead of an atomic add on a counter that all threads share. These updates were 15% of a
    MaskBench pass (docs/lexer.md). The view must not outlive the call that read it: a kernel
    returns a field to Python whole (NumPy then gets ``parent`` back, the array itself) or as a
    copy, and never stores one in a container that outlives the call."""
    data = structref._Utils(context, builder, typ).get_data_struct(val)
    ret = getattr(data, attr)
    fty = typ.field_dict[attr]
    if isinstance(fty, types.Array):
        ary = context.make_array(fty)(context, builder, value=ret)
        ary.meminfo = cgutils.get_null_value(ary.meminfo.type)
        ret = ary._getvalue()
    return imputils.impl_ret_borrowed(context, builder, fty, ret)


@lower_setattr_generic(KStructType)
def _setattr(context, builder, sig, args, attr):
    """``s.field = value``, in :func:`_struct_from` only: the record owns a reference to each value."""
    sty, vty = sig.args
    inst, value = args
    data = structref._Utils(context, builder, sty).get_data_struct(inst)
    fty = sty.field_dict[attr]
    new = context.cast(builder, value, vty, fty)
    old = getattr(data, attr)
    context.nrt.incref(builder, fty, new)
    context.nrt.decref(builder, fty, old)
    setattr(data, attr, new)


class KStruct(structref.StructRefProxy):
    """A kernel record (see the module docstring). Python reads its fields from the instance
    dict (filled once when it is made), so attribute reads cost what a plain object's do."""

    def __iter__(self):
        return iter(self._tuple)

    def __len__(self):
        return len(self._tuple)

    def __getitem__(self, i):
        return self._tuple[i]

    def _replace(self, **fields) -> "KStruct":
        return kstruct(self._tuple._replace(**fields))

    def _asdict(self) -> dict:
        return self._tuple._asdict()

    @property
    def _fields(self) -> tuple:
        return self._tuple._fields

    def __repr__(self) -> str:
        return f"KStruct({self._tuple!r})"


_MIP = types.MemInfoPointer(types.voidptr)


@box(KStructType)
def _box(typ, val, c):
    """A record returned to Python: only :func:`_to_struct` returns one, the record it made; its
    MemInfo's one reference goes to the Python object. (A kernel returning a record it was given
    would give away a reference it does not hold: none does, see tests/test_kstruct.py.)"""
    meminfo = cgutils.create_struct_proxy(typ)(c.context, c.builder, value=val).meminfo
    boxed = c.box(_MIP, meminfo)
    ctor = c.pyapi.unserialize(c.pyapi.serialize_object(KStruct._numba_box_))
    tyobj = c.pyapi.unserialize(c.pyapi.serialize_object(typ))
    res = c.pyapi.call_function_objargs(ctor, [tyobj, boxed])
    for o in (ctor, tyobj, boxed):
        c.pyapi.decref(o)
    return res


@unbox(KStructType)
def _unbox(typ, obj, c):
    """A record passed from Python: its MemInfo, held (one atomic add) until the call returns."""
    mi_obj = c.pyapi.object_getattr_string(obj, "_meminfo")
    mi = c.unbox(_MIP, mi_obj).value   # acquires a reference
    c.pyapi.decref(mi_obj)
    rec = cgutils.create_struct_proxy(typ)(c.context, c.builder)
    rec.meminfo = mi

    def release():
        c.context.nrt.decref(c.builder, _MIP, mi)

    return NativeValue(rec._getvalue(), cleanup=release)


def _struct_from(nt):  # typed by the overload below; never runs in Python
    raise NotImplementedError


@overload(_struct_from, jit_options={"nogil": True})
def _ol_struct_from(nt):
    if not isinstance(nt, (types.NamedTuple, types.NamedUniTuple)):
        return None
    if any(isinstance(t, KStructType) for t in nt.types):
        raise TypeError("a record's fields are arrays and scalars, not records (records are not "
                        "counted in kernels: a record field would not hold its record alive)")
    st = KStructType(list(zip(nt.fields, nt.types)))
    body = "".join(f"    s.{f} = nt[{i}]\n" for i, f in enumerate(nt.fields))
    src = f"def impl(nt):\n    s = new(st)\n{body}    return s\n"
    scope = {"new": structref.new, "st": st}
    exec(src, scope)   # one assignment per field: StructRef fields are set by name
    return scope["impl"]


@njit(nogil=True, cache=True)
def _to_struct(nt):
    return _struct_from(nt)


#: the constructor's entry point per (named tuple class, its fields' dtypes): the dispatcher's own
#: typing of a record's arguments (a fingerprint of every array) cost ~5 us of a ~8 us record, and
#: ~10 us of ~20 right after a compile (11 records per compile and first mask: ~10% of the median
#: MaskBench time to first mask). A class's fields keep their ndim and layout from record to record
#: (the engine makes each field one way); ``GRAMMASK_CHECK_FASTCALL=1`` checks every record (as
#: :class:`.lexdfa.FastCall` does for kernels).
_ENTRIES: dict = {}
#: ``GRAMMASK_CHECK_FASTCALL=1``: check every record's and every FastCall's argument types (the
#: one reading of the variable: :class:`.lexdfa.FastCall` starts from it; tests toggle each)
CHECK_FASTCALL = bool(os.environ.get("GRAMMASK_CHECK_FASTCALL"))


def kstruct(nt) -> KStruct:
    """The kernel record of named tuple ``nt`` (its arrays, shared, not copied).

    Only the engine's own named tuples (classes defined in a ``grammask`` module): the cached
    constructor's index names the tuple class of every record made, and every later process
    imports those classes to read the index. A class from a module that is not importable there
    (a test's, a script's ``__main__``) would break the cache for all of them."""
    if isinstance(nt, KStruct):
        return nt
    cls = type(nt)
    try:
        key = (cls, tuple([a.dtype for a in nt]))
    except AttributeError:   # a scalar field: the dispatcher types the call
        key = None
    entry = _ENTRIES.get(key)
    if entry is not None and not CHECK_FASTCALL:
        s = entry(nt)
    else:
        mod = cls.__module__
        if not mod.startswith("grammask."):
            raise TypeError(f"kstruct takes the engine's named tuples only, not {mod}.{cls.__qualname__}")
        s = _to_struct(nt)
        if key is not None:
            sig = (_to_struct.typeof_pyval(nt),)
            ov = _to_struct.overloads.get(sig)
            if entry is None:
                if ov is not None:
                    _ENTRIES[key] = ov.entry_point
            elif ov is None or ov.entry_point is not entry:
                raise TypeError(f"kstruct: a {cls.__qualname__} whose fields differ from the first one's "
                                f"beyond their dtypes: {sig[0]}")
    return _with_fields(s, nt)


def _with_fields(s: KStruct, nt) -> KStruct:
    """``s`` with the fields of its named tuple ``nt`` in its instance dict (Python reads them
    there, as a plain object's attributes)."""
    d = s.__dict__
    d.update(zip(nt._fields, nt))
    d["_tuple"] = nt
    return s


#: (struct type, named tuple class) of the records :func:`pack` has seen, by index: a packed
#: record names them by position, so that it holds nothing the garbage collector tracks
_KINDS: list = []
_KIND_INDEX: dict = {}


def pack(rec: KStruct) -> tuple:
    """Record ``rec`` as plain tuples that the garbage collector stops tracking after a pass or
    two over them: ``(kind index, the record's MemInfo, its fields as a plain tuple)``. A
    :class:`KStruct` (its instance dict, its named tuple) is tracked for as long as it lives, and
    each full collection walks it; a cache that holds thousands of records for the life of the
    process (:class:`~.state_cache.SharedEntries`) keeps them packed and :func:`unpack` makes a
    record again where one is taken out (~2 us, against ~7 for :func:`kstruct`). The MemInfo
    holds the record's payload, and so its arrays, alive."""
    nt = rec._tuple
    kind = (rec._type, type(nt))
    k = _KIND_INDEX.get(kind)
    if k is None:
        k = _KIND_INDEX[kind] = len(_KINDS)
        _KINDS.append(kind)
    return (k, rec._meminfo, tuple(nt))


def unpack(packed: tuple) -> KStruct:
    """The record :func:`pack` packed (a new proxy of the same payload: the same arrays)."""
    k, mi, fields = packed
    ty, cls = _KINDS[k]
    s = object.__new__(KStruct)
    s._type = ty
    s._meminfo = mi
    return _with_fields(s, cls._make(fields))
