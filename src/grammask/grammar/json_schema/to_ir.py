"""Schema -> IR: the keyword readers (:class:`SchemaReader`).

Every (sub)schema becomes an :mod:`.ir` node; the in-place applicators (``allOf``, ``anyOf``,
``oneOf``, ``not``, ``if``, ``dependent*``, ``$ref`` siblings, ``unevaluated*``) are combined
with :class:`~.algebra.Algebra`. A ``$ref`` becomes a lazily resolved :class:`~.ir.Ref`, so
recursive schemas stay finite.
"""
from __future__ import annotations

from fractions import Fraction

from ...errors import InvalidSchemaError, RegexSyntaxError, UnsupportedRegexError, UnsupportedSchemaError
from .algebra import Algebra, CannotNegate
from .formats import INT_FORMATS, format_expr
from .ir import ANY, NOTHING, ArrC, Conj, Node, NumC, ObjC, StrC, Typed, Union, arr_free, num_and, obj_free
from .numeric import to_fraction
from .refs import RefRegistry
from .state import CompileState, Stage, remember

__all__ = ["SchemaReader", "ALL_TYPES"]

ALL_TYPES = ("null", "boolean", "number", "integer", "string", "array", "object")

# annotation keywords (listed for reference: every keyword no reader handles is ignored)
ANNOTATIONS = frozenset({
    "$schema", "$id", "id", "$comment", "title", "description", "default", "examples", "example",
    "deprecated", "readOnly", "writeOnly", "contentEncoding", "contentMediaType", "contentSchema",
    "$vocabulary", "$anchor", "$dynamicAnchor", "$recursiveAnchor", "definitions", "$defs",
    "discriminator", "nullable", "xml", "externalDocs",
})


def _escape_pointer(s: str) -> str:
    return s.replace("~", "~0").replace("/", "~1")


class SchemaReader(Stage):
    """Reads a schema document into IR nodes. Its own state: the ``$ref`` registry of the
    document, the IR of each (subschema, base URI) read so far, the Ref of each ``$ref`` target,
    and the compiled ``pattern``/``format`` regexes (shared by the compiles of the ExprSet)."""

    def __init__(self, st: CompileState, alg: Algebra):
        super().__init__(st)
        self.alg = alg
        self.draft = st.draft
        self.strict = st.strict
        self.ir_cache: dict = {}
        self.in_progress: set = set()
        self.ref_nodes: dict = {}
        self.regex_cache: dict = st.regexes   # shared by the compiles of the ExprSet
        self.registry = RefRegistry(st.root, st.draft)

    def read(self) -> Node:
        """The IR of the whole document."""
        return self.to_ir(self.st.root, "#", self.registry.base0)

    def to_ir(self, s, ptr: str, base: str) -> Node:
        if s is True:
            return ANY
        if s is False:
            return NOTHING
        if not isinstance(s, dict):
            raise InvalidSchemaError("a schema must be an object or a boolean", ptr)
        base = self.registry.own_base(s, base)
        key = (id(s), base)
        r = self.ir_cache.get(key)
        if r is not None:
            return r
        if key in self.in_progress:
            raise UnsupportedSchemaError("a schema that contains itself through allOf/$ref siblings "
                                         "(not through a property or item) cannot be expanded", "$ref", ptr)
        self.in_progress.add(key)
        try:
            r = self._build(s, ptr, base)
        finally:
            self.in_progress.discard(key)
        self.ir_cache[key] = r
        self.st.keep.append(s)
        return r

    def ref_node(self, ref: str, base: str, pointer: str) -> Node:
        target, tbase, tptr = self.registry.resolve(ref, base, pointer)
        if isinstance(target, bool):
            return ANY if target else NOTHING
        if not isinstance(target, dict):
            raise InvalidSchemaError(f"$ref {ref!r} does not point to a schema", pointer)
        key = (id(target), tbase)
        r = self.ref_nodes.get(key)
        if r is None:
            r = self.st.new_ref(tptr, lambda t=target, p=tptr, b=tbase: self.to_ir(t, p, b))
            self.ref_nodes[key] = r
        return r

    def _build(self, s: dict, ptr: str, base: str) -> Node:
        ref = s.get("$ref")
        if ref is not None and self.draft <= 7:
            return self.ref_node(ref, base, ptr)   # drafts 4-7: siblings of $ref are ignored
        node = self.typed_part(s, ptr, base)
        if "enum" in s:
            vals = s["enum"]
            if not isinstance(vals, list):
                raise InvalidSchemaError("enum must be an array", ptr + "/enum")
            node = self.alg.isect(node, self.enum_node(vals, ptr + "/enum"))
        if "const" in s:
            node = self.alg.isect(node, self.enum_node([s["const"]], ptr + "/const"))
        if ref is not None:
            node = self.alg.isect(node, self.ref_node(ref, base, ptr + "/$ref"))
        # dynamic references are resolved statically: exact unless another resource declares the
        # same dynamic anchor (the dynamic scope could then pick it): refused
        for kw in ("$dynamicRef", "$recursiveRef"):
            if kw in s:
                why = self.registry.dynamic_override(kw, s[kw], base, ptr + "/" + kw)
                if why is not None:
                    self.st.unsupported(kw, ptr + "/" + kw, why)
                    continue
                node = self.alg.isect(node, self.ref_node(s[kw], base, ptr + "/" + kw))
        if self.draft <= 3:
            node = self.draft3(s, node, ptr, base)
        if "allOf" in s:
            subs = self._schema_list(s["allOf"], ptr + "/allOf")
            for i, sub in enumerate(subs):
                node = self.alg.isect(node, self.to_ir(sub, f"{ptr}/allOf/{i}", base))
        if "anyOf" in s:
            subs = self._schema_list(s["anyOf"], ptr + "/anyOf")
            node = self.alg.isect(node, self.alg.union([self.to_ir(x, f"{ptr}/anyOf/{i}", base) for i, x in enumerate(subs)]))
        if "oneOf" in s:
            subs = self._schema_list(s["oneOf"], ptr + "/oneOf")
            node = self.alg.make_oneof(node, [self.to_ir(x, f"{ptr}/oneOf/{i}", base) for i, x in enumerate(subs)],
                                   ptr + "/oneOf")
        if "not" in s:
            sub = self.to_ir(s["not"], ptr + "/not", base)
            try:
                node = self.alg.isect_not(node, sub, ptr + "/not")
            except CannotNegate as e:
                self.st.unsupported("not", ptr + "/not", f"cannot compute the complement of this schema ({e})")
        if "if" in s and ("then" in s or "else" in s) and self.draft >= 7:
            # conditionals are draft 7's: a schema declaring an older draft does not have them (an
            # unknown keyword, as its validators read it; MaskBench's valid instances of draft-04
            # schemas that use them, e.g. Github_medium---o3385, break their ``then``)
            node = self.alg.isect(node, self.if_then_else(s, ptr, base))
        deps = []
        if isinstance(s.get("dependencies"), dict):
            for k, v in s["dependencies"].items():
                deps.append((k, v, f"{ptr}/dependencies/{_escape_pointer(k)}"))
        for kw in ("dependentRequired", "dependentSchemas"):
            if isinstance(s.get(kw), dict):
                for k, v in s[kw].items():
                    deps.append((k, v, f"{ptr}/{kw}/{_escape_pointer(k)}"))
        for k, v, p in deps:
            node = self.alg.isect(node, self.dependency(k, v, p, base))
        if "unevaluatedProperties" in s:
            p = ptr + "/unevaluatedProperties"
            node = self.alg.unevaluated_props(node, self.to_ir(s["unevaluatedProperties"], p, base), p)
        if "unevaluatedItems" in s:
            node = self.alg.unevaluated_items(node, self.to_ir(s["unevaluatedItems"], ptr + "/unevaluatedItems", base),
                                          ptr + "/unevaluatedItems")
        return node

    def draft3(self, s: dict, node: Node, ptr: str, base: str) -> Node:
        """Draft 3 keywords: divisibleBy (multipleOf), extends (allOf), disallow (not type)."""
        if "divisibleBy" in s:
            m = self._num(s, "divisibleBy", ptr)
            if m <= 0:
                raise InvalidSchemaError("divisibleBy must be positive", ptr + "/divisibleBy")
            node = self.alg.isect(node, Typed(True, frozenset({True, False}), NumC(mults=(m,)), StrC(), ArrC(), ObjC()))
        if "extends" in s:
            ext = s["extends"]
            for i, sub in enumerate(ext if isinstance(ext, list) else [ext]):
                node = self.alg.isect(node, self.to_ir(sub, f"{ptr}/extends/{i}", base))
        if "disallow" in s:
            d = s["disallow"]
            types = d if isinstance(d, list) else [d]
            if not all(isinstance(t, str) for t in types):
                self.st.unsupported("disallow", ptr + "/disallow", "disallow with schemas")
            else:
                node = self.alg.isect_not(node, self.typed_part({"type": types}, ptr + "/disallow", base), ptr)
        return node

    def _schema_list(self, v, ptr) -> list:
        if not isinstance(v, list) or not v:
            raise InvalidSchemaError("expected a non-empty array of schemas", ptr)
        return v

    # -------------------------------------------------------------- typed keywords
    def typed_part(self, s: dict, ptr: str, base: str) -> Node:
        t = s.get("type")
        if t is None:
            types = set(ALL_TYPES)
        else:
            tl = t if isinstance(t, list) else [t]
            for x in tl:
                if x not in ALL_TYPES:
                    if x == "any":
                        tl = list(ALL_TYPES)
                        break
                    raise InvalidSchemaError(f"unknown type {x!r}", ptr + "/type")
            types = set(tl)
        num = None
        if "number" in types or "integer" in types:
            num = self.num_c(s, ptr, "integer" in types and "number" not in types)
        string = self.str_c(s, ptr) if "string" in types else None
        array = self.arr_c(s, ptr, base) if "array" in types else None
        obj = self.obj_c(s, ptr, base) if "object" in types else None
        bools = frozenset({True, False}) if "boolean" in types else frozenset()
        node = Typed("null" in types, bools, num, string, array, obj)
        if t is None and num.free() and string.free() and arr_free(array) and obj_free(obj):
            return ANY
        return self.alg.norm_typed(node)

    def _num(self, s, key, ptr):
        v = s[key]
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise InvalidSchemaError(f"{key} must be a number", f"{ptr}/{key}")
        try:
            return to_fraction(v)
        except ValueError:
            raise InvalidSchemaError(f"{key} must be finite", f"{ptr}/{key}") from None

    def _count(self, s, key, ptr) -> int | None:
        if key not in s:
            return None
        v = s[key]
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise InvalidSchemaError(f"{key} must be a non-negative integer", f"{ptr}/{key}")
        return v

    def num_c(self, s: dict, ptr: str, integer: bool) -> NumC:
        n = NumC(integer=integer)
        if "minimum" in s:
            v = self._num(s, "minimum", ptr)
            excl = s.get("exclusiveMinimum") is True
            n = num_and(n, NumC(lo=v, lo_excl=excl))
        if "maximum" in s:
            v = self._num(s, "maximum", ptr)
            excl = s.get("exclusiveMaximum") is True
            n = num_and(n, NumC(hi=v, hi_excl=excl))
        if "exclusiveMinimum" in s and not isinstance(s["exclusiveMinimum"], bool):
            n = num_and(n, NumC(lo=self._num(s, "exclusiveMinimum", ptr), lo_excl=True))
        if "exclusiveMaximum" in s and not isinstance(s["exclusiveMaximum"], bool):
            n = num_and(n, NumC(hi=self._num(s, "exclusiveMaximum", ptr), hi_excl=True))
        if "multipleOf" in s:
            m = self._num(s, "multipleOf", ptr)
            if m <= 0:
                raise InvalidSchemaError("multipleOf must be positive", ptr + "/multipleOf")
            if m != 1 or not integer:
                n = num_and(n, NumC(mults=(m,)))
        fmt = s.get("format")
        if integer and isinstance(fmt, str) and fmt in INT_FORMATS:
            lo, hi = INT_FORMATS[fmt]
            n = num_and(n, NumC(lo=Fraction(lo), hi=Fraction(hi)))
        return n

    def str_c(self, s: dict, ptr: str) -> StrC:
        ex = self.ex
        mn = self._count(s, "minLength", ptr) or 0
        mx = self._count(s, "maxLength", ptr)
        exprs = []
        if "pattern" in s:
            p = s["pattern"]
            if not isinstance(p, str):
                raise InvalidSchemaError("pattern must be a string", ptr + "/pattern")
            e = self.pattern_expr(p, ptr + "/pattern", "pattern")
            if e is not None:
                exprs.append(e)
        fmt = s.get("format")
        if isinstance(fmt, str):
            e = self.regex_cache.get(("format", fmt))
            if e is None:
                e = format_expr(fmt, ex)
                remember(self.regex_cache, ("format", fmt), e if e is not None else -1)
            if e is not None and e != -1:
                exprs.append(e)
        expr = ex.intersect(*exprs) if len(exprs) > 1 else (exprs[0] if exprs else None)
        return StrC(expr=expr, min_len=mn, max_len=mx)

    def pattern_expr(self, p: str, ptr: str, keyword: str) -> int | None:
        key = ("pattern", p)
        e = self.regex_cache.get(key)
        if e is not None:
            return e
        from ..regex import search_regex

        try:
            e = search_regex(p, self.ex)
        except UnsupportedRegexError as err:
            self.st.unsupported(keyword, ptr, f"regex {p!r}: {err}")
            return None
        except RegexSyntaxError as err:
            raise InvalidSchemaError(f"invalid regex {p!r}: {err}", ptr) from None
        remember(self.regex_cache, key, e)
        return e

    def arr_c(self, s: dict, ptr: str, base: str) -> ArrC:
        prefix: list = []
        items = None
        if "prefixItems" in s:
            pi = s["prefixItems"]
            if not isinstance(pi, list):
                raise InvalidSchemaError("prefixItems must be an array", ptr + "/prefixItems")
            prefix = [self.to_ir(x, f"{ptr}/prefixItems/{i}", base) for i, x in enumerate(pi)]
            if "items" in s:
                items = self.to_ir(s["items"], ptr + "/items", base)
        elif isinstance(s.get("items"), list):
            prefix = [self.to_ir(x, f"{ptr}/items/{i}", base) for i, x in enumerate(s["items"])]
            if "additionalItems" in s:
                items = self.to_ir(s["additionalItems"], ptr + "/additionalItems", base)
        elif "items" in s:
            items = self.to_ir(s["items"], ptr + "/items", base)
        mn = self._count(s, "minItems", ptr) or 0
        mx = self._count(s, "maxItems", ptr)
        unique = ptr + "/uniqueItems" if s.get("uniqueItems") is True else None
        contains = ()
        if "contains" in s:
            c = self.to_ir(s["contains"], ptr + "/contains", base)
            cmin = self._count(s, "minContains", ptr)
            cmax = self._count(s, "maxContains", ptr)
            # contains evaluates the items it matches from draft 2020-12 on (not in 2019-09)
            contains = ((c, 1 if cmin is None else cmin, cmax, ptr + "/contains", 0, self.draft >= 2020),)
        return ArrC(tuple(prefix), items, mn, mx, unique, contains)

    def obj_c(self, s: dict, ptr: str, base: str) -> ObjC:
        props_s = s.get("properties", {})
        if not isinstance(props_s, dict):
            raise InvalidSchemaError("properties must be an object", ptr + "/properties")
        pats_s = s.get("patternProperties", {})
        if not isinstance(pats_s, dict):
            raise InvalidSchemaError("patternProperties must be an object", ptr + "/patternProperties")
        patterns = []
        for p, sub in pats_s.items():
            e = self.pattern_expr(p, f"{ptr}/patternProperties/{_escape_pointer(p)}", "patternProperties")
            if e is None:
                continue
            patterns.append((p, e, self.to_ir(sub, f"{ptr}/patternProperties/{_escape_pointer(p)}", base)))
        props = []
        for k, sub in props_s.items():
            v = self.to_ir(sub, f"{ptr}/properties/{_escape_pointer(k)}", base)
            for p, e, pn in patterns:
                if self.ex.matches(e, k):
                    v = self.alg.isect(v, pn)
            props.append((k, v))
        req = s.get("required", [])
        if isinstance(req, bool):   # the draft 3 spelling, read from the parent (below)
            req = []
        if self.draft <= 3:
            req = list(req) + [k for k, sub in props_s.items() if isinstance(sub, dict) and sub.get("required") is True]
        if not isinstance(req, list) or not all(isinstance(x, str) for x in req):
            raise InvalidSchemaError("required must be an array of strings", ptr + "/required")
        required = tuple(dict.fromkeys(req))
        additional = None
        if "additionalProperties" in s:
            additional = self.to_ir(s["additionalProperties"], ptr + "/additionalProperties", base)
        if self.strict and "properties" in s:
            required = tuple(dict.fromkeys(required + tuple(k for k, _ in props)))
            if additional is None and not patterns:
                additional = NOTHING
        rest = (Conj(tuple(patterns), additional),) if (patterns or additional is not None) else ()
        names = None
        if "propertyNames" in s:
            pn = self.alg.expand(self.to_ir(s["propertyNames"], ptr + "/propertyNames", base))
            names = self.names_constraint(pn, ptr + "/propertyNames")
        mn = self._count(s, "minProperties", ptr) or 0
        mx = self._count(s, "maxProperties", ptr)
        return ObjC(tuple(props), required, rest, names, mn, mx)

    def names_constraint(self, pn: Node, ptr: str) -> StrC | None:
        """propertyNames as a string constraint (keys are strings: other types are irrelevant)."""
        if isinstance(pn, Union):
            opts = [self.alg.expand(o) for o in pn.options]
            langs = []
            for o in opts:
                if not isinstance(o, Typed):
                    self.st.unsupported("propertyNames", ptr, "propertyNames schema not understood")
                    return None
                if o.string is not None:
                    langs.append(self.alg.str_lang(o.string))
            return StrC(expr=self.ex.alt(*langs)) if langs else StrC(literals=frozenset())
        if not isinstance(pn, Typed):
            self.st.unsupported("propertyNames", ptr, "propertyNames schema not understood")
            return None
        if pn.string is None:
            return StrC(literals=frozenset())
        return None if pn.string.free() else pn.string

    def enum_node(self, vals: list, ptr: str) -> Node:
        strings = []
        null = False
        bools = set()
        others = []
        for v in vals:
            if isinstance(v, str):
                strings.append(v)
            elif v is None:
                null = True
            elif isinstance(v, bool):
                bools.add(v)
            else:
                others.append(self.const_node(v, ptr))
        opts = []
        if strings or null or bools:
            opts.append(Typed(null, frozenset(bools), None, StrC(literals=frozenset(strings)) if strings else None))
        opts.extend(others)
        return self.alg.union(opts)

    def const_node(self, v, ptr: str) -> Node:
        if v is None:
            return Typed(null=True)
        if isinstance(v, bool):
            return Typed(boolean=frozenset({v}))
        if isinstance(v, (int, float)):
            f = to_fraction(v)
            return Typed(num=NumC(lo=f, hi=f))
        if isinstance(v, str):
            return Typed(string=StrC(literals=frozenset({v})))
        if isinstance(v, list):
            # const/enum constrain items and members without evaluating them (no annotations)
            return Typed(array=ArrC(tuple(self.const_node(x, ptr) for x in v), NOTHING, len(v), len(v), ev=0))
        if isinstance(v, dict):
            props = tuple((k, self.const_node(x, ptr)) for k, x in v.items())
            return Typed(obj=ObjC(props, tuple(v), (Conj((), NOTHING, evaluates=False),), noeval=frozenset(v)))
        raise InvalidSchemaError(f"not a JSON value: {v!r}", ptr)

    # -------------------------------------------------------------- if, dependencies
    def if_then_else(self, s: dict, ptr: str, base: str) -> Node:
        cond = self.to_ir(s["if"], ptr + "/if", base)
        then = self.to_ir(s["then"], ptr + "/then", base) if "then" in s else ANY
        other = self.to_ir(s["else"], ptr + "/else", base) if "else" in s else ANY
        try:
            neg_part = self.alg.isect_not(other, cond, ptr + "/if")
        except CannotNegate as e:
            self.st.unsupported("if", ptr + "/if", f"cannot decide the 'if' schema structurally ({e})")
            return ANY
        return self.alg.union([self.alg.isect(cond, then), neg_part])

    def dependency(self, k: str, v, ptr: str, base: str) -> Node:
        """dependentRequired / dependentSchemas: non-objects, objects without ``k``, or objects
        with ``k`` that satisfy the dependency."""
        if isinstance(v, list):
            if not all(isinstance(x, str) for x in v):
                raise InvalidSchemaError("dependentRequired values must be arrays of strings", ptr)
            present = Typed(obj=ObjC(required=tuple(dict.fromkeys([k, *v]))))
        else:
            sub = self.to_ir(v, ptr, base)
            present = self.alg.isect(Typed(obj=ObjC(required=(k,))), sub)
        non_obj = Typed(True, frozenset({True, False}), NumC(), StrC(), ArrC(), None)
        absent = Typed(obj=ObjC(props=((k, NOTHING),), noeval=frozenset({k})))
        return self.alg.union([non_obj, absent, present])
