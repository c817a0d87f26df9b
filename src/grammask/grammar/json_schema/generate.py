"""IR -> grammar: :class:`GrammarGenerator`.

Each IR node becomes a nonterminal (a ``$ref`` is its target's: no unit rule of its own, as no
helper rule that could only lead to another is made). Terminals are complete JSON tokens with
their leading whitespace (see :mod:`..builtin`): a string (its regex carries the pattern / format / length /
enum constraints, over the JSON-escaped form of the string, :mod:`.strings`), a number (an exact
digit-level regex of its range, :mod:`.numeric`), ``true``/``false``/``null``, punctuation, and
an object key merged with its colon. Arrays unroll their item counts (with ``uniqueItems`` over
few scalar values and ``contains`` counts as states); objects walk their declared properties in
order (or in any order, up to ``unordered_max`` of them) with additional keys interleaved.
"""
from __future__ import annotations

from ...errors import GrammarTooComplexError
from ..cfg import _count_rules
from ..membound import ALT_BYTES, RULE_BYTES, SYMBOL_BYTES
from ..regexset import EMPTY, EPS
from .algebra import Algebra, CannotNegate
from .ir import ANY, NOTHING, ArrC, Node, NumC, ObjC, OneOf, Ref, StrC, Typed, Union, is_nothing
from .limits import MAX_OBJECT_STATES, MAX_PATTERN_REGIONS, MAX_RULES, MAX_UNIQUE_VALUES, MAX_UNROLL
from .numeric import number_regex
from .state import CompileState, Stage, remember

__all__ = ["GrammarGenerator"]



def _member_counter(mx: int | None, cap: int):
    """``(cnt, can_add)`` over an object's member count ``c``: without ``maxProperties`` counts past
    ``cap`` (the ``minProperties`` still to reach) are one state; ``can_add`` says another member fits."""

    def cnt(c: int) -> int:
        return min(c, cap) if mx is None else c

    def can_add(c: int) -> bool:
        return mx is None or c + 1 <= mx

    return cnt, can_add


def _any_template(g, n0: int, memo_added: list, n_alts: int):
    """The rules :meth:`GrammarGenerator.gen` made for ANY from nonterminal ``n0`` on, as a template:
    ``(names, rules with nonterminals numbered from n0 = 0, [(lead, nonterminal)] of the
    generator's memo entries it added, alternatives, bytes charged)``; None where they refer to an
    earlier nonterminal or the memo gained another node's entry (then each compile generates it)."""
    n1 = len(g.rules)
    leads = []
    for (node_id, ld, _), nt in memo_added:
        if node_id != id(ANY) or not n0 <= nt < n1:
            return None
        leads.append((ld, nt - n0))
    rules = []
    nbytes = RULE_BYTES * (n1 - n0)
    for r in g.rules[n0:n1]:
        if r is None:
            return None
        out = []
        for alt in r:
            for x in alt:
                if x >= 0 and not n0 <= x < n1:
                    return None
            out.append([x - n0 if x >= 0 else x for x in alt])
        rules.append(out)
        nbytes += 56 + ALT_BYTES * len(r) + SYMBOL_BYTES * sum(map(len, r))
    return g.names[n0:n1], rules, leads, n_alts, nbytes


def _ref_target(node: Ref) -> Node | None:
    """The node a chain of references ends at; None where the chain comes back to one of its
    references."""
    seen = set()
    while isinstance(node, Ref):
        if id(node) in seen:
            return None
        seen.add(id(node))
        node = node.resolve()
    return node


class GrammarGenerator(Stage):
    """Writes the grammar of IR nodes into the shared :class:`~grammask.grammar.cfg.Grammar`. Its
    own state: the nonterminal of each (node, leading whitespace, depth), token regex caches and
    the rule-size counter."""

    def __init__(self, st: CompileState, alg: Algebra):
        super().__init__(st)
        self.alg = alg
        self.g = st.g
        self.lx = st.lx
        self.indent = st.indent
        self.ws = st.ws
        self.unordered_max = st.unordered_max
        self.gen_memo: dict = {}
        self.n_alts = 0
        #: gen_object's punctuation per (lead, depth), and its key tokens per (key, depth)
        self._punct: dict = {}
        self._key_toks: dict = {}

    def define(self, nt: int, alternatives: list) -> int:
        """Define rule ``nt``; the generator hands its freshly built lists over (no copy)."""
        return self.g.define(nt, alternatives, copy=False)

    def lead_inner(self, depth: int) -> int:
        if self.indent is None:
            return self.ws
        return self.ex.literal("\n" + " " * (self.indent * (depth + 1)))

    def lead_close(self, depth: int) -> int:
        if self.indent is None:
            return self.ws
        return self.ex.literal("\n" + " " * (self.indent * depth))

    def tok(self, lead: int, e: int) -> int:
        return ~self.ex.concat(lead, e)

    def gen(self, node: Node, lead: int, depth: int) -> int:
        if self.indent is None:
            depth = 0
        key = (id(node), lead, depth)
        nt = self.gen_memo.get(key)
        if nt is not None:
            return nt
        if isinstance(node, Ref):
            # a reference is the rule of the node it names (no rule of its own: it was a unit
            # rule in every grammar with a $ref); the target's rule exists before its body is
            # generated, so a recursive reference inside that body finds it
            target = _ref_target(node)
            if target is not None:
                nt = self.gen(target, lead, depth)
                self.gen_memo[key] = nt
                self.st.keep.append(node)
                return nt
        # any JSON value (compact): copied from the ExprSet's template, or generated and kept as one
        any_value = node is ANY and self.indent is None
        if any_value:
            nt = self._copy_any(lead)
            if nt is not None:
                return nt
            mark = (len(self.g.rules), len(self.gen_memo), self.n_alts)
        g = self.g
        nt = g.fresh("v")
        self.gen_memo[key] = nt
        self.st.keep.append(node)
        if self.indent is not None and depth > 64:
            self.define(nt, [])
            return nt
        if isinstance(node, Ref):   # a cycle of references alone (it derives nothing)
            self.define(nt, [[self.gen(node.resolve(), lead, depth)]])
        elif isinstance(node, OneOf):
            self.define(nt, [[self.gen(self.alg.resolve_oneof(node), lead, depth)]])
        elif isinstance(node, Union):
            self.define(nt, [[self.gen(o, lead, depth)] for o in node.options])
        else:
            self.define(nt, self.gen_typed(node, lead, depth))
        self._count_alts(len(g.rules[nt]))
        if any_value:
            n0, m0, a0 = mark
            t = _any_template(g, n0, list(self.gen_memo.items())[m0:], self.n_alts - a0)
            if t is not None:
                remember(self.st.any_rules, (lead, self.ws), t)
        return nt

    def _count_alts(self, n: int) -> None:
        self.n_alts += n
        if self.n_alts > MAX_RULES:
            raise GrammarTooComplexError("the schema's grammar exceeds its size bound")

    def _copy_any(self, lead: int) -> int | None:
        """The rules of :data:`~.ir.ANY` after ``lead`` (compact JSON) copied from the ExprSet's
        template, their nonterminals shifted; None when there is none yet (:meth:`gen` generates
        them and keeps the template). They are the value of every object's undeclared keys when
        ``additionalProperties`` is absent, so in most schemas, and depend on the ExprSet and the
        whitespace alone. Generating them took ~0.1 ms, in 424 of the 566 schemas of the 1-in-20
        MaskBench sample; with the copy the warm compile's median is 3% lower. The grammar is the
        same rule for rule (tests/test_json_schema_memos.py)."""
        t = self.st.any_rules.get((lead, self.ws))
        if t is None:
            return None
        names, rules, leads, n_alts, nbytes = t
        g = self.g
        base = len(g.rules)
        g.names.extend(names)
        g.where.extend([None] * len(names))
        g.rules.extend([[[x + base if x >= 0 else x for x in alt] for alt in r] for r in rules])
        _count_rules(nbytes)
        for ld, j in leads:
            self.gen_memo[(id(ANY), ld, 0)] = base + j
        self._count_alts(n_alts)
        return base

    def gen_typed(self, t: Typed, lead: int, depth: int) -> list:
        ex = self.ex
        scal = []
        if t.null:
            scal.append(ex.literal("null"))
        if True in t.boolean:
            scal.append(ex.literal("true"))
        if False in t.boolean:
            scal.append(ex.literal("false"))
        if t.num is not None:
            scal.append(self.num_tok(t.num))
        if t.string is not None:
            scal.append(self.str_tok(t.string))
        alts = []
        e = ex.alt(*scal)
        if e != EMPTY:
            alts.append([self.tok(lead, e)])
        if t.array is not None:
            alts.extend(self.gen_array(t.array, lead, depth))
        if t.obj is not None:
            alts.extend(self.gen_object(t.obj, lead, depth))
        return alts

    def num_tok(self, n: NumC) -> int:
        key = (n.integer, n.lo, n.lo_excl, n.hi, n.hi_excl, n.mults, n.excl, n.nonint, n.nmults)
        memo = self.st.number_tokens
        e = memo.get(key)
        if e is None:
            e = number_regex(self.ex, integer=n.integer, lo=n.lo, lo_excl=n.lo_excl, hi=n.hi, hi_excl=n.hi_excl,
                             multiple_of=n.mults, excluded=n.excl, nonint=n.nonint, not_multiple_of=n.nmults,
                             full_number=self.lx.number)
            remember(memo, key, e)
        return e

    def str_body(self, sc: StrC) -> int:
        ex = self.ex
        S = self.strings
        if sc.literals is not None:
            return ex.alt(*[S.literal(v, False) for v in sc.literals])
        parts = []
        if sc.expr is not None:
            parts.append(S.enc(sc.expr))
        if sc.min_len or sc.max_len is not None:
            if sc.min_len > MAX_UNROLL * 10:
                raise GrammarTooComplexError("minLength too large")
            parts.append(ex.repeat(S.unit, sc.min_len, sc.max_len))
        if sc.excl:
            parts.append(ex.complement(ex.alt(*[S.literal(v, True) for v in sc.excl])))
            if sc.expr is None:
                parts.append(S.body_full)
        if not parts:
            return S.body_full
        return ex.intersect(*parts)

    def str_tok(self, sc: StrC) -> int:
        key = (sc.literals, sc.expr, sc.min_len, sc.max_len, sc.excl)
        memo = self.st.string_tokens
        e = memo.get(key)
        if e is None:
            q = self.strings.quote
            e = self.ex.concat(q, self.str_body(sc), q)
            remember(memo, key, e)
        return e

    # -------------------------------------------------------------- arrays
    def gen_array(self, a: ArrC, lead: int, depth: int) -> list:
        ex, g = self.ex, self.g
        mn, mx = a.min, a.max
        prefix = list(a.prefix)
        for i, p in enumerate(prefix):
            if is_nothing(p):
                mx = i if mx is None else min(mx, i)
                prefix = prefix[:i]
                break
        items = a.items if a.items is not None else ANY
        if is_nothing(items):
            mx = len(prefix) if mx is None else min(mx, len(prefix))
        if mx is not None and mn > mx:
            return []
        elem_lead = self.lead_inner(depth)
        comma = self.tok(EPS if self.indent is not None else self.ws, ex.literal(","))
        lk = self.tok(lead, ex.literal("["))
        rk_empty = self.tok(EPS if self.indent is not None else self.ws, ex.literal("]"))
        rk = self.tok(self.lead_close(depth), ex.literal("]"))

        def elem(i: int) -> int:
            n = prefix[i] if i < len(prefix) else items
            return self.gen(n, elem_lead, depth + 1)

        if a.unique and (mx is None or mx > 1):
            r = self.gen_unique(a, prefix, items, mn, mx, elem_lead, depth, lk, rk, rk_empty, comma)
            if r is not None:
                return r
        if a.contains:
            return self.gen_contains(a, prefix, items, mn, mx, elem_lead, depth, lk, rk, rk_empty, comma)
        K = max(len(prefix), mn)
        if max(K, mx or 0) > MAX_UNROLL:
            raise GrammarTooComplexError("minItems/maxItems/prefixItems too large to unroll")
        alts = []
        if mn == 0:
            alts.append([lk, rk_empty])
        if mx is not None and mx == 0:
            return alts
        # E[i]: the rest after i elements
        tail = None
        top = mx if mx is not None else K
        E: dict[int, int] = {}
        if mx is None:
            tail = g.fresh("tail")
            self.define(tail, [[], [tail, comma, self.gen(items, elem_lead, depth + 1)]])
        for i in range(top, 0, -1):
            # past the last counted item, the rest is the tail itself
            E[i] = tail if mx is None and i >= K else g.fresh("items")
        for i in range(top, 0, -1):
            nt = E[i]
            if mx is not None and i == mx:
                self.define(nt, [[]])
                continue
            if mx is None and i >= K:
                continue
            nxt = E.get(i + 1, tail)
            rule = [[comma, elem(i), nxt]]
            if i >= mn:
                rule.append([])
            self.define(nt, rule)
        first_rest = E[1] if 1 in E else tail
        alts.append([lk, elem(0), first_rest, rk])
        return alts

    def finite_values(self, n: Node, out: dict) -> bool:
        """Collect the distinct values of a finite scalar schema as {key: token expr}."""
        n = self.alg.expand(n)
        if isinstance(n, Union):
            return all(self.finite_values(o, out) for o in n.options)
        if not isinstance(n, Typed) or n.array is not None or n.obj is not None:
            return False
        ex = self.ex
        if n.null:
            out[("null",)] = ex.literal("null")
        for b in n.boolean:
            out[("bool", b)] = ex.literal("true" if b else "false")
        if n.num is not None:
            if n.num.lo is None or n.num.lo != n.num.hi:
                return False
            out[("num", n.num.lo)] = self.num_tok(n.num)
        if n.string is not None:
            if n.string.literals is None:
                return False
            for v in n.string.literals:
                out[("str", v)] = self.str_tok(StrC(literals=frozenset({v})))
        return len(out) <= MAX_UNIQUE_VALUES

    def gen_unique(self, a, prefix, items, mn, mx, elem_lead, depth, lk, rk, rk_empty, comma):
        g = self.g
        vals: dict = {}
        if prefix or not self.finite_values(items, vals):
            self.st.unsupported("uniqueItems", a.unique, "uniqueItems is only enforced for arrays of at most "
                             f"{MAX_UNIQUE_VALUES} distinct scalar values or maxItems <= 1")
            return None
        toks = [e for e in vals.values()]
        n = len(toks)
        top = n if mx is None else min(n, mx)
        memo: dict[int, int] = {}

        def U(mask: int, count: int) -> int:
            nt = memo.get(mask)
            if nt is not None:
                return nt
            nt = g.fresh("uniq")
            memo[mask] = nt
            rule = []
            if count >= mn:
                rule.append([])
            if count < top:
                for j in range(n):
                    if not mask >> j & 1:
                        rule.append([comma, self.tok(elem_lead, toks[j]), U(mask | 1 << j, count + 1)])
            self.define(nt, rule)
            return nt

        try:
            alts = []
            if mn == 0:
                alts.append([lk, rk_empty])
            if top >= 1:
                for j in range(n):
                    alts.append([lk, self.tok(elem_lead, toks[j]), U(1 << j, 1), rk])
            return alts
        finally:
            U = None  # break the closures' reference cycle

    def gen_contains(self, a, prefix, items, mn, mx, elem_lead, depth, lk, rk, rk_empty, comma):
        """Arrays with contains clauses: the state counts the items matching each clause (capped);
        an item is a hit or a miss of each clause (a miss must match the complement only when
        maxContains bounds the clause)."""
        g = self.g
        if len(a.contains) > 3:
            raise GrammarTooComplexError("too many contains constraints on one array")
        clauses = []
        for c, cmin, cmax, cptr, start, _ in a.contains:
            neg = None
            if cmax is not None:
                try:
                    neg = self.alg.negate(c, cptr)
                except CannotNegate as e:
                    self.st.unsupported("maxContains", cptr, f"cannot compute the complement of the contains schema ({e})")
                    cmax = None
            clauses.append((c, cmin, cmax, neg, start, cmin if cmax is None else cmax + 1))
        nc = len(clauses)
        K = max([len(prefix), mn] + [cl[4] for cl in clauses])
        top = mx if mx is not None else K
        states = top + 1
        for cl in clauses:
            states *= cl[5] + 1
        if states > MAX_OBJECT_STATES:
            raise GrammarTooComplexError("contains with large bounds")

        def elem_node(i):
            return prefix[i] if i < len(prefix) else items

        elem_memo: dict = {}

        def elements(i: int) -> list:
            """[(value nonterminal, hit bits)] for the item at index i."""
            key = min(i, K) if i >= len(prefix) else i
            r = elem_memo.get(key)
            if r is not None:
                return r
            r = []
            for bits in range(1 << nc):
                node = elem_node(i)
                ok = True
                for j, (c, _, cmax, neg, start, _) in enumerate(clauses):
                    if bits >> j & 1:
                        if i < start:
                            ok = False
                            break
                        node = self.alg.isect(node, c)
                    elif neg is not None and i >= start:
                        node = self.alg.isect(node, neg)
                if ok and not is_nothing(node):
                    r.append((self.gen(node, elem_lead, depth + 1), bits))
            elem_memo[key] = r
            return r

        def ok_end(ks) -> bool:
            return all(k >= cl[1] and (cl[2] is None or k <= cl[2]) for k, cl in zip(ks, clauses))

        def step(ks, bits):
            out = []
            for j, (k, cl) in enumerate(zip(ks, clauses)):
                if bits >> j & 1:
                    if cl[2] is not None and k + 1 > cl[2]:
                        return None
                    k = min(k + 1, cl[5])
                out.append(k)
            return tuple(out)

        memo: dict = {}

        def S(i: int, ks) -> int:
            if mx is None and i > K:
                i = K
            key = (i, ks)
            nt = memo.get(key)
            if nt is not None:
                return nt
            nt = g.fresh("contains")
            memo[key] = nt
            rule = []
            if i >= mn and ok_end(ks):
                rule.append([])
            if mx is None or i < mx:
                for v, bits in elements(i):
                    nk = step(ks, bits)
                    if nk is not None:
                        rule.append([comma, v, S(i + 1, nk)])
            self.define(nt, rule)
            return nt

        try:
            zero = (0,) * nc
            alts = []
            if mn == 0 and ok_end(zero):
                alts.append([lk, rk_empty])
            if mx is None or mx >= 1:
                for v, bits in elements(0):
                    nk = step(zero, bits)
                    if nk is not None:
                        alts.append([lk, v, S(1, nk), rk])
            return alts
        finally:
            S = None  # break the closures' reference cycle

    # -------------------------------------------------------------- objects
    def key_regions(self, o: ObjC, declared: list) -> list:
        """[(decoded key language or None for any, value node)] for undeclared keys: the key space
        is split by which patternProperties match (regions refined one pattern at a time, dead
        regions dropped)."""
        ex = self.ex
        groups: dict[int, list] = {}   # pattern expr -> [(conj index, node)]
        for ci, c in enumerate(o.rest):
            for _, e, pn in c.patterns:
                groups.setdefault(e, []).append((ci, pn))
        regions = [(self.alg.str_lang(o.names) if o.names is not None else None, ())]
        for e, _ in groups.items():
            new = []
            for lang, hits in regions:
                pos = e if lang is None else ex.intersect(lang, e)
                neg = ex.intersect(ex.complement(e), self.strings.any_dec if lang is None else lang)
                for lg, h in ((pos, hits + (e,)), (neg, hits)):
                    if self.alg.lang_empty(lg) is not True:
                        new.append((lg, h))
            regions = new
            if len(regions) > MAX_PATTERN_REGIONS:
                raise GrammarTooComplexError("too many patternProperties regions")
        out = []
        for lang, hits in regions:
            v = ANY
            for ci, c in enumerate(o.rest):
                mine = [pn for e in hits for cj, pn in groups[e] if cj == ci]
                if mine:
                    for pn in mine:
                        v = self.alg.isect(v, pn)
                elif c.additional is not None:
                    v = self.alg.isect(v, c.additional)
            if not is_nothing(v):
                out.append((lang, v))
        return out

    def _object_punctuation(self, lead: int, depth: int) -> tuple:
        """The tokens around an object's members at ``depth`` after ``lead``: (key lead, colon,
        value lead, comma, ``{``, ``}`` of the empty object, ``}``), made once per generator."""
        ex = self.ex
        sep_ws = EPS if self.indent is not None else self.ws
        return (self.lead_inner(depth),
                ex.concat(self.ws, ex.literal(":")) if self.indent is None else ex.literal(":"),
                self.ws if self.indent is None else ex.literal(" "),
                self.tok(sep_ws, ex.literal(",")), self.tok(lead, ex.literal("{")),
                self.tok(sep_ws, ex.literal("}")), self.tok(self.lead_close(depth), ex.literal("}")))

    def gen_object(self, o: ObjC, lead: int, depth: int) -> list:
        ex, g = self.ex, self.g
        S = self.strings
        props = list(o.props)
        declared = {k for k, _ in props}
        for r in o.required:
            if r not in declared:
                props.append((r, self.alg.rest_value(o, r)))
        members = []   # (key token, value nt, required)
        for k, v in props:
            if o.names is not None and not self.alg.str_ok(o.names, k):
                v = NOTHING
            req = k in o.required
            if is_nothing(v):
                if req:
                    return []
                continue
            members.append((k, v, req))
        punct = self._punct.get((lead, depth))
        if punct is None:
            punct = self._punct[(lead, depth)] = self._object_punctuation(lead, depth)
        key_lead, colon, vlead, comma, lb, rb_empty, rb = punct
        q = S.quote
        clauses = list(o.some)
        if len(clauses) > 4:
            raise GrammarTooComplexError("too many existential property constraints (from not/oneOf)")
        full = (1 << len(clauses)) - 1
        subsets = [t for t in range(1, full + 1)]

        def key_tok(body: int) -> int:
            # (one concatenation: the node of self.tok(key_lead, ex.concat(q, body, q, colon)),
            # concatenation being associative in the store, made in one call instead of two)
            return ~ex.concat(key_lead, q, body, q, colon)

        keys = self._key_toks
        mem = []   # per declared member: ([(symbols, bits)], required)
        for k, v, req in members:
            kb = k.encode("utf-8", "surrogatepass")
            ktok = keys.get((k, depth))
            if ktok is None:
                ktok = keys[(k, depth)] = key_tok(S.literal(k, False))
            variants = [([ktok, self.gen(v, vlead, depth + 1)], 0)]
            for t in subsets:
                cl = [clauses[c] for c in range(len(clauses)) if t >> c & 1]
                if all(ex.matches(lang, kb) for lang, _ in cl):
                    vv = v
                    for _, cv in cl:
                        vv = self.alg.isect(vv, cv)
                    if not is_nothing(vv):
                        variants.append(([ktok, self.gen(vv, vlead, depth + 1)], t))
            mem.append((variants, req))
        all_names = [k for k, _ in props]
        # keys are spelled like the declared ones (raw ASCII, short escapes, \\uXXXX for control and
        # non-ASCII characters): other keys are those spellings minus the declared names'
        excl_declared = ex.complement(ex.alt(*[S.literal(k, False) for k in all_names])) if all_names else None
        add_alts = []   # [(symbols, bits)]
        for lang, v in self.key_regions(o, all_names):
            for t in [0] + subsets:
                cl = [clauses[c] for c in range(len(clauses)) if t >> c & 1]
                lg, vv = lang, v
                for cl_lang, cv in cl:
                    lg = cl_lang if lg is None else ex.intersect(lg, cl_lang)
                    vv = self.alg.isect(vv, cv)
                if is_nothing(vv):
                    continue
                if t:
                    dec = ex.intersect(lg, ex.complement(ex.alt(*[ex.literal(k.encode("utf-8", "surrogatepass"))
                                                                 for k in all_names]))) if all_names else lg
                    if self.alg.lang_empty(dec) is True:
                        continue
                body = S.body_restricted if lg is None else S.enc(lg)
                if excl_declared is not None:
                    body = ex.intersect(body, excl_declared)
                add_alts.append(([key_tok(body), self.gen(vv, vlead, depth + 1)], t))
        n = len(mem)
        mn, mx = o.min, o.max
        if mx is not None and sum(1 for _, r in mem if r) > mx:
            return []
        if not add_alts:
            if mn > n:
                return []
            if mx is not None and mx >= n:
                mx = None
        cap = max(mn, mx) if mx is not None else mn
        if 1 < n <= self.unordered_max:
            return self.gen_unordered(mem, add_alts, mn, mx, cap, full, comma, lb, rb, rb_empty)
        if (n + 1) * (cap + 1) * (full + 1) > MAX_OBJECT_STATES:
            raise GrammarTooComplexError("object with too many properties/counts")
        req_from = [False] * (n + 1)
        for i in range(n - 1, -1, -1):
            req_from[i] = req_from[i + 1] or mem[i][1]

        cnt, can_add = _member_counter(mx, cap)

        Rm: dict = {}
        Dm: dict = {}

        def R(i: int, c: int, f: int) -> int:
            if not add_alts or not can_add(c):
                return D(i, c, f)   # no member may come in here: R would only lead to D
            key = (i, c, f)
            nt = Rm.get(key)
            if nt is not None:
                return nt
            nt = g.fresh("members")
            Rm[key] = nt
            rule = []
            if can_add(c):
                for syms, bits in add_alts:
                    rule.append([comma, *syms, R(i, cnt(c + 1), f | bits)])
            rule.append([D(i, c, f)])
            self.define(nt, rule)
            return nt

        def D(i: int, c: int, f: int) -> int:
            key = (i, c, f)
            nt = Dm.get(key)
            if nt is not None:
                return nt
            nt = g.fresh("props")
            Dm[key] = nt
            rule = []
            if i == n:
                if c >= mn and f == full:
                    rule.append([])
            else:
                if can_add(c):
                    for syms, bits in mem[i][0]:
                        rule.append([comma, *syms, R(i + 1, cnt(c + 1), f | bits)])
                if not mem[i][1]:
                    rule.append([D(i + 1, c, f)])
            self.define(nt, rule)
            return nt

        try:
            alts = []
            if not req_from[0] and mn == 0 and full == 0:
                alts.append([lb, rb_empty])
            if mx is not None and mx == 0:
                return alts
            FD: dict = {}

            def Fd(i: int) -> int:
                nt = FD.get(i)
                if nt is not None:
                    return nt
                nt = g.fresh("firstprop")
                FD[i] = nt
                rule = []
                if i < n:
                    for syms, bits in mem[i][0]:
                        rule.append([*syms, R(i + 1, cnt(1), bits)])
                    if not mem[i][1]:
                        rule.append([Fd(i + 1)])
                self.define(nt, rule)
                return nt

            if add_alts:
                first = g.fresh("first")
                frule = [[*syms, R(0, cnt(1), bits)] for syms, bits in add_alts]
                frule.append([Fd(0)])
                self.define(first, frule)
            else:
                first = Fd(0)   # (a rule [Fd(0)] alone would be a unit rule)
            alts.append([lb, first, rb])
            return alts
        finally:
            R = D = Fd = None  # break the closures' reference cycle

    def gen_unordered(self, mem, add_alts, mn, mx, cap, full, comma, lb, rb, rb_empty) -> list:
        """Members in any order: the state is the set of declared properties already present
        (2^n states, so only for small n)."""
        g = self.g
        n = len(mem)
        req_mask = sum(1 << j for j in range(n) if mem[j][1])

        cnt, can_add = _member_counter(mx, cap)

        memo: dict = {}

        def U(seen: int, c: int, f: int) -> int:
            key = (seen, c, f)
            nt = memo.get(key)
            if nt is not None:
                return nt
            if len(memo) > MAX_OBJECT_STATES:
                raise GrammarTooComplexError("object with too many unordered properties")
            nt = g.fresh("members")
            memo[key] = nt
            rule = []
            if seen & req_mask == req_mask and c >= mn and f == full:
                rule.append([])
            if can_add(c):
                for j in range(n):
                    if not seen >> j & 1:
                        for syms, bits in mem[j][0]:
                            rule.append([comma, *syms, U(seen | 1 << j, cnt(c + 1), f | bits)])
                for syms, bits in add_alts:
                    rule.append([comma, *syms, U(seen, cnt(c + 1), f | bits)])
            self.define(nt, rule)
            return nt

        try:
            alts = []
            if not req_mask and mn == 0 and full == 0:
                alts.append([lb, rb_empty])
            if mx is not None and mx == 0:
                return alts
            for j in range(n):
                for syms, bits in mem[j][0]:
                    alts.append([lb, *syms, U(1 << j, cnt(1), bits), rb])
            for syms, bits in add_alts:
                alts.append([lb, *syms, U(0, cnt(1), bits), rb])
            return alts
        finally:
            U = None  # break the closures' reference cycle
