"""The intermediate representation of a schema: a small algebra of JSON value sets.

:class:`Typed` (per JSON type: allowed or not, with that type's constraints :class:`NumC`,
:class:`StrC`, :class:`ArrC`, :class:`ObjC`), :class:`Union`, :class:`OneOf` and :class:`Ref` (a
lazily resolved ``$ref``). Plain data and pure helpers only: the operations that need compile
state live in :mod:`.algebra`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction

__all__ = ["Node", "NumC", "StrC", "ArrC", "Conj", "ObjC", "Typed", "Union", "OneOf", "Ref", "ANY", "NOTHING",
           "is_nothing", "num_and", "arr_free", "arr_evaluated", "INF", "obj_free", "type_mask"]


class Node:
    __slots__ = ()


@dataclass(eq=False)
class NumC:
    integer: bool = False
    lo: Fraction | None = None
    lo_excl: bool = False
    hi: Fraction | None = None
    hi_excl: bool = False
    mults: tuple = ()
    excl: tuple = ()
    nonint: bool = False    # numbers with a non-zero fractional part
    nmults: tuple = ()      # integers the value is not a multiple of

    def free(self) -> bool:
        return not self.integer and self.lo is None and self.hi is None and not self.mults and not self.excl \
            and not self.nonint and not self.nmults


@dataclass(eq=False)
class StrC:
    literals: frozenset | None = None   # exactly these strings (other fields then unused)
    expr: int | None = None             # decoded-level regex (pattern/format), None = any
    min_len: int = 0
    max_len: int | None = None
    excl: frozenset = frozenset()
    n_neg: int = 0                      # complemented regexes folded into expr (cost bound)

    def free(self) -> bool:
        return self.literals is None and self.expr is None and self.min_len == 0 and self.max_len is None \
            and not self.excl


@dataclass(eq=False)
class ArrC:
    prefix: tuple = ()
    items: Node | None = None
    min: int = 0
    max: int | None = None
    unique: str | None = None   # JSON pointer of a uniqueItems: true
    contains: tuple = ()   # ((node, min, max|None, pointer, start, evaluates), ...)
    # annotations (for unevaluatedItems): the number of leading items evaluated (prefixItems of
    # the schemas that passed); None: every declared one (the prefix, and every item when items
    # is set). Constraints that come from a complement (``not``, a failed ``if``, the other
    # branches of an overlapping ``oneOf``) or from ``const``/``enum`` constrain items without
    # evaluating them; a contains clause with ``evaluates`` evaluates the items it matches.
    ev: int | None = None

    def item(self, i: int) -> Node:
        if i < len(self.prefix):
            return self.prefix[i]
        return self.items if self.items is not None else ANY


@dataclass(eq=False)
class Conj:
    """The rule of one schema for keys it does not declare: patternProperties, else
    additionalProperties (None: absent)."""
    patterns: tuple = ()   # ((source, decoded expr, node), ...)
    additional: Node | None = None
    evaluates: bool = True   # False: a complement's or const's rule (no annotations)


@dataclass(eq=False)
class ObjC:
    props: tuple = ()      # ((name, node), ...) in order
    required: tuple = ()   # names, in first-appearance order
    rest: tuple = ()       # (Conj, ...)
    names: StrC | None = None
    min: int = 0
    max: int | None = None
    some: tuple = ()       # ((decoded key language, value node), ...): at least one such member each
    noeval: frozenset = frozenset()   # names in props that no passing schema evaluates (from a
                                      # complement or const/enum: see ArrC.ev)


@dataclass(eq=False)
class Typed(Node):
    null: bool = False
    boolean: frozenset = frozenset()
    num: NumC | None = None
    string: StrC | None = None
    array: ArrC | None = None
    obj: ObjC | None = None

    def empty(self) -> bool:
        return not self.null and not self.boolean and self.num is None and self.string is None \
            and self.array is None and self.obj is None


@dataclass(eq=False)
class Union(Node):
    options: list = field(default_factory=list)


@dataclass(eq=False)
class OneOf(Node):
    """``context`` and exactly one of ``branches``. Intersections go into the context
    (``X and (C and oneOf(B))`` is ``(X and C) and oneOf(B)``), so overlap is decided once the
    whole context is known: the options are ``context and B_i``; when they overlap, option ``i``
    is ``context and B_i and not B_j`` for every other ``j`` (complements of the branches only)."""
    context: Node = None
    branches: list = field(default_factory=list)
    pointer: str = ""


@dataclass(eq=False)
class Ref(Node):
    name: str
    target: object = None   # callable -> Node
    _node: Node | None = None

    def resolve(self) -> Node:
        if self._node is None:
            self._node = self.target()
        return self._node


ANY = Typed(True, frozenset({True, False}), NumC(), StrC(), ArrC(), ObjC())
NOTHING = Typed()


def is_nothing(n: Node) -> bool:
    """Whether ``n`` accepts no value, from its structure. A union's or oneOf's answer is kept on
    the node (``_nothing``): their parts are never changed once they are made (a ``Typed`` is
    narrowed by :meth:`.Algebra.norm_typed` before it is put anywhere), and the intersections of
    enums and anyOf asked it of the same big unions again and again (2.5M calls, a quarter of the
    compile time of a 1-in-20 MaskBench pass under the profiler)."""
    if n is NOTHING:
        return True
    if isinstance(n, Typed):
        return n.empty()
    if isinstance(n, Union):
        r = n.__dict__.get("_nothing")
        if r is None:
            r = n._nothing = all(is_nothing(o) for o in n.options)
        return r
    if isinstance(n, OneOf):
        r = n.__dict__.get("_nothing")
        if r is None:
            r = n._nothing = is_nothing(n.context) or all(is_nothing(o) for o in n.branches)
        return r
    return False


def meet(x, y, both):
    """The conjunction of two optional constraints (``None``: unconstrained): the one that is
    present, or ``both(x, y)`` when both are."""
    return y if x is None else x if y is None else both(x, y)


def num_and(a: NumC, b: NumC) -> NumC:
    lo, lo_excl = a.lo, a.lo_excl
    if b.lo is not None and (lo is None or b.lo > lo or (b.lo == lo and b.lo_excl)):
        lo, lo_excl = b.lo, b.lo_excl
    hi, hi_excl = a.hi, a.hi_excl
    if b.hi is not None and (hi is None or b.hi < hi or (b.hi == hi and b.hi_excl)):
        hi, hi_excl = b.hi, b.hi_excl
    mults = tuple(dict.fromkeys(a.mults + b.mults))
    excl = tuple(dict.fromkeys(a.excl + b.excl))
    nmults = tuple(dict.fromkeys(a.nmults + b.nmults))
    return NumC(a.integer or b.integer, lo, lo_excl, hi, hi_excl, mults, excl, a.nonint or b.nonint, nmults)


INF = float("inf")


def arr_evaluated(a: ArrC):
    """How many leading items an array matching ``a`` has evaluated (INF: all of them)."""
    if a.ev is not None:
        return a.ev
    return INF if a.items is not None else len(a.prefix)


def arr_free(a: ArrC | None) -> bool:
    return a is not None and not a.prefix and (a.items is None or a.items is ANY) and a.min == 0 \
        and a.max is None and not a.unique and not a.contains


def obj_free(o: ObjC | None) -> bool:
    return o is not None and not o.props and not o.required and not o.rest and o.names is None \
        and o.min == 0 and o.max is None and not o.some


def type_mask(n: Node) -> int:
    """Bit set of the JSON types a node may accept (all for references and oneOf)."""
    if isinstance(n, Typed):
        return (n.null) | (bool(n.boolean) << 1) | ((n.num is not None) << 2) | ((n.string is not None) << 3) \
            | ((n.array is not None) << 4) | ((n.obj is not None) << 5)
    if isinstance(n, Union):
        m = 0
        for o in n.options:
            m |= type_mask(o)
        return m
    return 63

