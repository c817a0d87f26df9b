"""The set algebra of the IR: intersection, complement, emptiness, ``oneOf``, ``unevaluated*``.

``allOf``, ``$ref`` siblings, ``if``/``then``/``else``, ``not`` and ``dependent*`` are computed
here as real intersections and complements of :mod:`.ir` nodes (:meth:`Algebra.isect`,
:meth:`Algebra.negate`). A complement the algebra cannot express raises :class:`CannotNegate`,
which the callers turn into an :class:`~grammask.errors.UnsupportedSchemaError` (or a warning
with ``lenient=True``). The work is bounded (:mod:`.limits`).
"""
from __future__ import annotations

from dataclasses import replace
from fractions import Fraction

from ...errors import GrammarTooComplexError, UnsupportedSchemaError
from .ir import (
    ANY,
    NOTHING,
    INF,
    ArrC,
    Conj,
    Node,
    NumC,
    ObjC,
    OneOf,
    Ref,
    StrC,
    Typed,
    Union,
    arr_evaluated,
    arr_free,
    is_nothing,
    meet,
    num_and,
    obj_free,
    type_mask,
)
from .limits import (
    MAX_EMPTY_CHECK_STATES,
    MAX_INTERSECTIONS,
    MAX_NEGATED_REGEXES,
    MAX_UNFOLD_DEPTH,
    MAX_UNION,
)
from .numeric import _lcm_fraction, range_is_empty
from .state import CompileState, Stage

__all__ = ["Algebra", "CannotNegate"]


class CannotNegate(Exception):
    pass


class Algebra(Stage):
    """Operations on IR nodes within one compile. Its own state: the memo table of intersections
    and complements (keyed by node ids), the set of those being computed (a recursive request
    gets a :class:`Ref` to the result), and the budgets' counters."""

    def __init__(self, st: CompileState):
        super().__init__(st)
        self.isect_memo: dict = {}
        self.isect_busy: set = set()
        self.unfold_depth = 0
        self.n_isect = 0

    def unfold(self, n: Node) -> Node:
        depth = 0
        while isinstance(n, Ref):
            depth += 1
            if depth > MAX_UNFOLD_DEPTH:
                raise GrammarTooComplexError("a chain of $ref does not end")
            n = n.resolve()
        return n

    # -------------------------------------------------------------- combinators
    def union(self, opts: list) -> Node:
        flat = []
        for o in opts:
            if isinstance(o, Union):
                flat.extend(o.options)
            elif not is_nothing(o):
                if o is ANY:
                    return ANY
                flat.append(o)
        flat = [o for o in flat if not is_nothing(o)]
        if not flat:
            return NOTHING
        if len(flat) == 1:
            return flat[0]
        if len(flat) > MAX_UNION:
            raise GrammarTooComplexError(f"a union of {len(flat)} alternatives is too large")
        return Union(flat)

    def _memo_result(self, key):
        """The finished result a recursive reference points to. Missing when it is needed before
        the computation it refers to has finished: recursive intersections and complements are
        built eagerly down to their property and item values, so e.g. a oneOf whose exactness
        needs the complement of a branch that contains the same oneOf (under a property) asks
        for its own result; or when that computation failed."""
        r = self.isect_memo.get(key)
        if r is None:
            raise UnsupportedSchemaError(
                "a recursive schema whose allOf/oneOf/not combination (an intersection or a "
                "complement) needs its own result while it is computed is not supported")
        return r

    def isect(self, a: Node, b: Node) -> Node:
        self.n_isect += 1
        if self.n_isect > MAX_INTERSECTIONS:
            raise GrammarTooComplexError(
                f"the schema needs more than {MAX_INTERSECTIONS:,} intersections of subschemas "
                "(allOf/oneOf/not combinations)")
        if a is ANY or a is b:
            return b
        if b is ANY:
            return a
        if is_nothing(a) or is_nothing(b):
            return NOTHING
        key = (id(a), id(b))
        r = self.isect_memo.get(key)
        if r is not None:
            return r
        if isinstance(a, Ref) or isinstance(b, Ref):
            if key in self.isect_busy:
                # a recursive intersection: refer to the result being built
                return self.st.new_ref(f"{getattr(a, 'name', '?')}&{getattr(b, 'name', '?')}",
                                    lambda k=key: self._memo_result(k))
            self.isect_busy.add(key)
            self.unfold_depth += 1
            try:
                if self.unfold_depth > MAX_UNFOLD_DEPTH:
                    raise GrammarTooComplexError("intersection of recursive schemas nests too deeply")
                r = self.isect(self.unfold(a), self.unfold(b))
            finally:
                self.unfold_depth -= 1
                self.isect_busy.discard(key)
        elif isinstance(a, Union) or isinstance(b, Union):
            la = a.options if isinstance(a, Union) else [a]
            lb = b.options if isinstance(b, Union) else [b]
            out = []
            mb = [type_mask(y) for y in lb]
            for x in la:
                mx_ = type_mask(x)
                for y, my in zip(lb, mb):
                    if mx_ & my:
                        z = self.isect(x, y)
                        if not is_nothing(z):
                            out.append(z)
                            if len(out) > MAX_UNION:
                                raise GrammarTooComplexError("intersection of unions (allOf of anyOf/oneOf/enum) "
                                                             "is too large")
            r = self.union(out)
        elif isinstance(a, OneOf):
            r = self.make_oneof(self.isect(a.context, b), a.branches, a.pointer)
        elif isinstance(b, OneOf):
            r = self.make_oneof(self.isect(a, b.context), b.branches, b.pointer)
        else:
            r = self.isect_typed(a, b)
        self.isect_memo[key] = r
        self.st.keep.append((a, b))
        return r

    def isect_typed(self, a: Typed, b: Typed) -> Node:
        num = num_and(a.num, b.num) if a.num is not None and b.num is not None else None
        string = self.str_and(a.string, b.string) if a.string is not None and b.string is not None else None
        array = self.arr_and(a.array, b.array) if a.array is not None and b.array is not None else None
        obj = self.obj_and(a.obj, b.obj) if a.obj is not None and b.obj is not None else None
        return self.norm_typed(Typed(a.null and b.null, a.boolean & b.boolean, num, string, array, obj))

    def norm_typed(self, t: Typed) -> Node:
        if t.num is not None and self.num_empty(t.num):
            t.num = None
        if t.string is not None and self.str_empty(t.string) is True:
            t.string = None
        if t.array is not None and self.arr_empty(t.array):
            t.array = None
        if t.obj is not None and self.obj_empty(t.obj):
            t.obj = None
        return NOTHING if t.empty() else t

    # numbers
    def num_empty(self, n: NumC) -> bool:
        if range_is_empty(n.lo, n.lo_excl, n.hi, n.hi_excl, n.integer):
            return True
        if n.integer and n.nonint:
            return True
        if n.nonint and n.mults and all(m.denominator == 1 for m in n.mults):
            return True
        if n.lo is not None and n.lo == n.hi:
            v = n.lo
            if v in n.excl or (n.integer and v.denominator != 1) or (n.nonint and v.denominator == 1) \
                    or any((v / m).denominator != 1 for m in n.mults) or any((v / m).denominator == 1 for m in n.nmults):
                return True
        if any(m == 1 for m in n.nmults) and n.integer:
            return True
        if n.mults and n.lo is not None and n.hi is not None:
            ms = list(n.mults) + ([Fraction(1)] if n.integer else [])
            m = _lcm_fraction(ms)
            a = -((-n.lo) // m)
            b = n.hi // m
            if n.lo_excl and a * m == n.lo:
                a += 1
            if n.hi_excl and b * m == n.hi:
                b -= 1
            if a > b:
                return True
        return False

    # strings
    def str_lang(self, sc: StrC) -> int:
        """The decoded-level language of a string constraint."""
        ex = self.ex
        if sc.literals is not None:
            return ex.alt(*[ex.literal(x.encode("utf-8", "surrogatepass")) for x in sc.literals])
        parts = []
        if sc.expr is not None:
            parts.append(sc.expr)
        if sc.min_len or sc.max_len is not None:
            parts.append(ex.repeat(self.strings.any_char, sc.min_len, sc.max_len))
        if sc.excl:
            parts.append(ex.complement(ex.alt(*[ex.literal(x.encode("utf-8", "surrogatepass")) for x in sc.excl])))
            parts.append(self.strings.any_dec)
        if not parts:
            return self.strings.any_dec
        return ex.intersect(*parts)

    def str_ok(self, sc: StrC, v: str) -> bool:
        if sc.literals is not None:
            return v in sc.literals
        if len(v) < sc.min_len or (sc.max_len is not None and len(v) > sc.max_len) or v in sc.excl:
            return False
        if sc.expr is not None:
            try:
                data = v.encode("utf-8")
            except UnicodeEncodeError:
                return False
            return self.ex.matches(sc.expr, data)
        return True

    def str_and(self, a: StrC, b: StrC) -> StrC:
        if a.free():
            return b
        if b.free():
            return a
        if a.literals is not None or b.literals is not None:
            lits = a.literals if a.literals is not None else b.literals
            other = b if a.literals is not None else a
            return StrC(literals=frozenset(v for v in lits if self.str_ok(other, v)))
        expr = meet(a.expr, b.expr, self.ex.intersect)
        mx = meet(a.max_len, b.max_len, min)
        n_neg = a.n_neg + b.n_neg
        if n_neg > MAX_NEGATED_REGEXES:
            raise GrammarTooComplexError("too many complemented string patterns (not/oneOf over overlapping "
                                         "patterns) in one string constraint")
        return StrC(None, expr, max(a.min_len, b.min_len), mx, a.excl | b.excl, n_neg)

    def str_empty(self, sc: StrC):
        """True (empty), False (not empty) or None (unknown)."""
        if sc.literals is not None:
            return not sc.literals
        if sc.max_len is not None and sc.min_len > sc.max_len:
            return True
        if sc.expr is None and not sc.excl:
            return False
        return self.lang_empty(self.str_lang(sc))

    def lang_empty(self, e: int):
        """Emptiness of a regex with a bounded search (None: unknown)."""
        ex = self.ex
        saved = ex.max_alive_states
        ex.max_alive_states = min(saved, MAX_EMPTY_CHECK_STATES)
        try:
            return not ex.alive(e)
        except GrammarTooComplexError:
            return None
        finally:
            ex.max_alive_states = saved

    # arrays
    def arr_and(self, a: ArrC, b: ArrC) -> ArrC:
        n = max(len(a.prefix), len(b.prefix))
        prefix = tuple(self.isect(a.item(i), b.item(i)) for i in range(n))
        # inline, not meet(): isect recurses through here, and a frame per level would halve the depth
        items = b.items if a.items is None else a.items if b.items is None else self.isect(a.items, b.items)
        ev = max(arr_evaluated(a), arr_evaluated(b))
        return ArrC(prefix, items, max(a.min, b.min), meet(a.max, b.max, min), a.unique or b.unique, a.contains + b.contains,
                    None if ev == INF else ev)

    def arr_empty(self, a: ArrC) -> bool:
        mx = a.max
        for i, p in enumerate(a.prefix):
            if is_nothing(p):
                mx = i if mx is None else min(mx, i)
                break
        if a.items is not None and is_nothing(a.items):
            lim = len(a.prefix)
            mx = lim if mx is None else min(mx, lim)
        if mx is not None and a.min > mx:
            return True
        for c, cmin, cmax, _, _, _ in a.contains:
            if cmax is not None and cmin > cmax:
                return True
            if cmin > 0 and is_nothing(c):
                return True
            if mx is not None and cmin > mx:
                return True
        return False

    # objects
    def rest_value(self, o: ObjC, k: str) -> Node:
        v = ANY
        for c in o.rest:
            hit = False
            for _, e, pn in c.patterns:
                if self.ex.matches(e, k.encode("utf-8", "surrogatepass")):
                    v = self.isect(v, pn)
                    hit = True
            if not hit and c.additional is not None:
                v = self.isect(v, c.additional)
        return v

    def obj_and(self, a: ObjC, b: ObjC) -> ObjC:
        pa = dict(a.props)
        pb = dict(b.props)
        props = []
        for k in list(pa) + [k for k in pb if k not in pa]:
            va = pa[k] if k in pa else self.rest_value(a, k)
            vb = pb[k] if k in pb else self.rest_value(b, k)
            props.append((k, self.isect(va, vb)))
        names = meet(a.names, b.names, self.str_and)
        # only a name that one side declares without evaluating it may stay unevaluated
        noeval = frozenset(k for k in a.noeval | b.noeval if not self.evaluates(a, k) and not self.evaluates(b, k))
        return ObjC(tuple(props), tuple(dict.fromkeys(a.required + b.required)), a.rest + b.rest, names,
                    max(a.min, b.min), meet(a.max, b.max, min), a.some + b.some, noeval)

    def evaluates(self, o: ObjC, k: str) -> bool:
        """Whether an object matching ``o`` has member ``k`` (if present) evaluated: declared in
        properties, or matched by the patternProperties/additionalProperties of a schema that
        passed (annotations, for unevaluatedProperties)."""
        if k not in o.noeval and any(k == x for x, _ in o.props):
            return True
        for c in o.rest:
            if not c.evaluates:
                continue
            if c.additional is not None:
                return True
            for _, e, _ in c.patterns:
                if self.ex.matches(e, k.encode("utf-8", "surrogatepass")):
                    return True
        return False

    def obj_empty(self, o: ObjC) -> bool:
        if o.max is not None and o.min > o.max:
            return True
        pd = dict(o.props)
        for r in o.required:
            v = pd[r] if r in pd else self.rest_value(o, r)
            if is_nothing(v):
                return True
            if o.names is not None and not self.str_ok(o.names, r):
                return True
        if o.max is not None and len(o.required) > o.max:
            return True
        for lang, v in o.some:
            if is_nothing(v) or self.lang_empty(lang) is True:
                return True
        return False

    # -------------------------------------------------------------- negation
    def isect_not(self, x: Node, n: Node, ptr: str) -> Node:
        """``x and not n``, folding ``x`` into the complement of each option of a union so that
        pieces ruled out by ``x`` are dropped early."""
        if isinstance(n, Union):
            for o in n.options:
                x = self.isect_not(x, o, ptr)
                if is_nothing(x):
                    return NOTHING
            return x
        return self.isect(x, self.negate(n, ptr))

    def negate(self, n: Node, ptr: str) -> Node:
        if isinstance(n, (Ref, OneOf)):
            # lazily: the complement of a recursive schema refers to itself
            key = ("not", id(n))
            r = self.isect_memo.get(key)
            if r is None:
                r = self.st.new_ref(f"not {getattr(n, 'name', 'oneOf')}", lambda n=n: self._lazy_negate(n, ptr))
                self.isect_memo[key] = r
                self.st.keep.append(n)
            return r
        n = self.expand(n)
        if n is ANY:
            return NOTHING
        if is_nothing(n):
            return ANY
        if isinstance(n, Union):
            r = ANY
            for o in n.options:
                r = self.isect(r, self.negate(o, ptr))
            return r
        assert isinstance(n, Typed)
        pieces: list = []
        if not n.null:
            pieces.append(Typed(null=True))
        if len(n.boolean) < 2:
            pieces.append(Typed(boolean=frozenset({True, False}) - n.boolean))
        if n.num is None:
            pieces.append(Typed(num=NumC()))
        elif not n.num.free():
            pieces.extend(Typed(num=x) for x in self.neg_num(n.num))
        if n.string is None:
            pieces.append(Typed(string=StrC()))
        elif not n.string.free():
            pieces.append(Typed(string=self.neg_str(n.string)))
        if n.array is None:
            pieces.append(Typed(array=ArrC()))
        elif not arr_free(n.array):
            pieces.extend(Typed(array=x) for x in self.neg_arr(n.array, ptr))
        if n.obj is None:
            pieces.append(Typed(obj=ObjC()))
        elif not obj_free(n.obj):
            pieces.extend(self.neg_obj(n.obj, ptr))
        pieces = [self.norm_typed(p) if isinstance(p, Typed) else p for p in pieces]
        return self.union(pieces)

    def _lazy_negate(self, n: Node, ptr: str) -> Node:
        try:
            return self.negate(self.expand(n), ptr)
        except CannotNegate as e:
            last = ptr.rsplit("/", 1)[-1]
            keyword = last if last in ("not", "oneOf", "if", "contains", "disallow") else "not"
            self.st.unsupported(keyword, ptr, f"cannot compute the complement of a schema ({e})")
            return ANY

    def neg_num(self, n: NumC) -> list:
        if any(m.denominator != 1 for m in n.mults):
            raise CannotNegate("multipleOf with a fraction")
        out = []
        for m in n.mults:
            out.append(NumC(nmults=(m,)))
        for m in n.nmults:
            out.append(NumC(mults=(m,)))
        if n.integer:
            out.append(NumC(nonint=True))
        if n.nonint:
            out.append(NumC(integer=True))
        if n.lo is not None:
            out.append(NumC(hi=n.lo, hi_excl=not n.lo_excl))
        if n.hi is not None:
            out.append(NumC(lo=n.hi, lo_excl=not n.hi_excl))
        for v in n.excl:
            out.append(NumC(lo=v, hi=v))
        return out

    def neg_str(self, sc: StrC) -> StrC:
        if sc.literals is not None:
            return StrC(excl=sc.literals)
        ex = self.ex
        return StrC(expr=ex.intersect(ex.complement(self.str_lang(sc)), self.strings.any_dec), n_neg=sc.n_neg + 1)

    def neg_arr(self, a: ArrC, ptr: str) -> list:
        if a.unique:
            raise CannotNegate("uniqueItems")
        out = []
        # the pieces of a complement evaluate nothing (ev=0, contains without evaluates)
        for c, cmin, cmax, _, start, _ in a.contains:
            if cmin != 1 or cmax is not None:
                raise CannotNegate("minContains/maxContains")
            # no item (from index start) matches: every such item is in the complement
            out.append(ArrC(prefix=(ANY,) * start, items=self.negate(c, ptr), ev=0))
        if a.min > 0:
            out.append(ArrC(max=a.min - 1, ev=0))
        if a.max is not None:
            out.append(ArrC(min=a.max + 1, ev=0))
        for i, p in enumerate(a.prefix):
            if p is not ANY:
                np_ = self.negate(p, ptr)
                if not is_nothing(np_):
                    out.append(ArrC(prefix=(ANY,) * i + (np_,), min=i + 1, ev=0))
        if a.items is not None and a.items is not ANY:
            ni = self.negate(a.items, ptr)
            if not is_nothing(ni):
                k = len(a.prefix)
                out.append(ArrC(prefix=(ANY,) * k, min=k + 1, contains=((ni, 1, None, ptr, k, False),), ev=0))
        return out

    def neg_obj(self, o: ObjC, ptr: str) -> list:
        """Objects violating ``o``: each piece violates one of its constraints."""
        ex = self.ex
        any_dec = self.strings.any_dec
        out = []
        for lang, v in o.some:
            # no member with a key in lang has a value in v: every such member is in not-v
            out.append(Typed(obj=ObjC(rest=(Conj((("<some>", lang, self.negate(v, ptr)),), None, evaluates=False),))))
        # the pieces of a complement evaluate nothing: their names are noeval, their rules
        # evaluates=False (``not`` never contributes annotations)
        for r in o.required:
            out.append(Typed(obj=ObjC(props=((r, NOTHING),), noeval=frozenset({r}))))
        for k, v in o.props:
            if v is ANY:
                continue
            nv = self.negate(v, ptr)
            if not is_nothing(nv):
                out.append(Typed(obj=ObjC(props=((k, nv),), required=(k,), noeval=frozenset({k}))))
        declared = [k for k, _ in o.props]
        not_declared = ex.complement(ex.alt(*[ex.literal(k.encode("utf-8", "surrogatepass")) for k in declared])) \
            if declared else None

        def undeclared(lang: int) -> int:
            parts = [lang, any_dec] + ([not_declared] if not_declared is not None else [])
            return ex.intersect(*parts)

        for c in o.rest:
            for _, e, pn in c.patterns:
                if pn is not ANY:
                    nv = self.negate(pn, ptr)
                    if not is_nothing(nv):
                        out.append(Typed(obj=ObjC(some=((undeclared(e), nv),))))
            if c.additional is not None and c.additional is not ANY:
                nv = self.negate(c.additional, ptr)
                if not is_nothing(nv):
                    lang = ex.complement(ex.alt(*[e for _, e, _ in c.patterns])) if c.patterns else any_dec
                    out.append(Typed(obj=ObjC(some=((undeclared(lang), nv),))))
        if o.names is not None:
            bad = ex.intersect(ex.complement(self.str_lang(o.names)), any_dec)
            out.append(Typed(obj=ObjC(some=((bad, ANY),))))
        if o.min > 0:
            out.append(Typed(obj=ObjC(max=o.min - 1)))
        if o.max is not None:
            out.append(Typed(obj=ObjC(min=o.max + 1)))
        return out

    # -------------------------------------------------------------- oneOf, unevaluated*
    def disjoint(self, a: Node, b: Node) -> bool:
        try:
            return is_nothing(self.isect(a, b))
        except (UnsupportedSchemaError, GrammarTooComplexError):
            return False

    def make_oneof(self, context: Node, branches: list, ptr: str) -> Node:
        if is_nothing(context):
            return NOTHING
        branches = [o for o in branches if not is_nothing(o)]
        if not branches:
            return NOTHING
        if len(branches) == 1:
            return self.isect(context, branches[0])
        return OneOf(context, branches, ptr)

    def resolve_oneof(self, n: OneOf) -> Node:
        """oneOf as a union: of the options if they are pairwise disjoint, else of each option
        minus the other branches (needs their complements)."""
        key = ("oneof", id(n))
        r = self.isect_memo.get(key)
        if r is not None:
            return r
        if key in self.isect_busy:
            return self.st.new_ref("oneOf", lambda k=key: self._memo_result(k))
        self.isect_busy.add(key)
        try:
            r = self._resolve_oneof(n)
        finally:
            self.isect_busy.discard(key)
        self.isect_memo[key] = r
        self.st.keep.append(n)
        return r

    def _resolve_oneof(self, n: OneOf) -> Node:
        opts = [self.isect(n.context, b) for b in n.branches]
        overlap = any(not self.disjoint(opts[i], opts[j]) for i in range(len(opts)) for j in range(i + 1, len(opts)))
        if not overlap:
            r = self.union(opts)
        else:
            try:
                out = []
                for i, o in enumerate(opts):
                    x = o
                    for j in range(len(opts)):
                        if j != i and not self.disjoint(opts[i], opts[j]):
                            x = self.isect_not(x, n.branches[j], n.pointer)
                    out.append(x)
                r = self.union(out)
            except CannotNegate as e:
                self.st.unsupported("oneOf", n.pointer,
                                 f"oneOf branches may overlap and their complement cannot be computed ({e})")
                r = self.union(opts)
        return r

    def expand(self, n: Node) -> Node:
        """Resolve references and oneOf until the node is a Typed or a Union."""
        for _ in range(MAX_UNFOLD_DEPTH):
            if isinstance(n, Ref):
                n = n.resolve()
            elif isinstance(n, OneOf):
                n = self.resolve_oneof(n)
            else:
                return n
        raise GrammarTooComplexError("a chain of $ref does not end")

    def _unevaluated(self, node: Node, ptr: str, keyword: str, what: str, rewrite) -> Node:
        """Apply ``rewrite`` (a Typed option -> a new Typed, or None to keep it) to every option
        of ``node``; an option that is not a plain Typed cannot be tracked.

        Exact because each option is a conjunction of schemas that all pass on the values it
        accepts, and the IR records which of its constraints evaluate (annotations): declared
        properties and prefixItems, patternProperties/additionalProperties/items, contains
        (2020-12). Constraints from complements (``not``, the failing side of ``if``, the other
        branches of an overlapping ``oneOf``) and from ``const``/``enum`` are marked as not
        evaluating (ObjC.noeval, Conj.evaluates, ArrC.ev, contains' flag), so the keyword
        still applies to what they constrain. (Where several anyOf branches pass, an option
        sees the annotations of its own branch only: stricter than the specification, never
        looser.)"""
        node = self.expand(node)
        opts = []
        seen = set()

        def flatten(n, depth=0):
            n = self.expand(n)
            if isinstance(n, Union):
                if id(n) in seen:
                    return True   # a union within itself (recursion): its options are in already
                if depth > MAX_UNFOLD_DEPTH:
                    return False
                seen.add(id(n))
                return all(flatten(o, depth + 1) for o in n.options)
            opts.append(n)
            return True

        if not flatten(node):
            self.st.unsupported(keyword, ptr, f"cannot track evaluated {what} here (unions nest too deeply)")
            return node
        out = []
        for o in opts:
            if not isinstance(o, Typed):
                self.st.unsupported(keyword, ptr, f"cannot track evaluated {what} here")
                return node
            t = rewrite(o)
            out.append(o if t is None else self.norm_typed(t))
        return self.union(out)

    def unevaluated_props(self, node: Node, u: Node, ptr: str) -> Node:
        if u is ANY:
            return node

        def rewrite(o: Typed) -> Typed | None:
            ob = o.obj
            if ob is None or any(c.evaluates and c.additional is not None for c in ob.rest):
                return None   # no object, or additionalProperties evaluates every name
            pats = tuple((src, e, ANY) for c in ob.rest if c.evaluates for src, e, _ in c.patterns)
            props = ob.props
            if ob.noeval:
                # a name declared only by a complement or a const: present, it is unevaluated
                # unless an evaluating pattern matches it
                props = tuple((k, v if k not in ob.noeval or self.evaluates(ob, k) else self.isect(v, u))
                              for k, v in ob.props)
            nob = replace(ob, props=props, rest=ob.rest + (Conj(pats, u),), noeval=frozenset())
            return Typed(o.null, o.boolean, o.num, o.string, o.array, nob)

        return self._unevaluated(node, ptr, "unevaluatedProperties", "properties", rewrite)

    def unevaluated_items(self, node: Node, u: Node, ptr: str) -> Node:
        if u is ANY:
            return node

        def rewrite(o: Typed) -> Typed | None:
            a = o.array
            if a is None:
                return None
            ev = arr_evaluated(a)
            if ev == INF:
                return None   # items evaluates every item
            # an item past the evaluated prefix must match an (evaluating) contains clause or u
            allow = self.union([c for c, _, _, _, _, evaluates in a.contains if evaluates] + [u])
            prefix = tuple(p if i < ev else self.isect(p, allow) for i, p in enumerate(a.prefix))
            items = allow if a.items is None else self.isect(a.items, allow)
            return Typed(o.null, o.boolean, o.num, o.string, ArrC(prefix, items, a.min, a.max, a.unique, a.contains),
                         o.obj)

        return self._unevaluated(node, ptr, "unevaluatedItems", "items", rewrite)
