"""Context-free grammars over regex terminals, and their lowering to lexemes + flat Earley tables.

Every front end (EBNF/GBNF, regex, builtin JSON, JSON Schema) builds a :class:`Grammar`: rules of
nonterminals whose right-hand sides mix nonterminals and *terminals*, each terminal a regular
expression in the grammar's :class:`~.regexset.ExprSet`.

:func:`lower` turns it into what the kernels run on:

1. undefined rules are reported, unproductive alternatives and unreachable rules dropped
   (a root that derives nothing raises :class:`EmptyLanguageError`);
2. adjacent terminals are concatenated and regular, non-recursive rules inlined, so that whole
   words become single lexemes and the parser is involved only at lexeme boundaries;
3. nullable terminals are split into "non-empty part | nothing" (a lexeme never matches ``""``);
4. greedy-safety (``check_lexemes``): the lexer ends a lexeme only when the next byte cannot extend
   any live lexeme (maximal munch). That equals the context-free semantics exactly when no accepted
   string of a lexeme can be extended, by itself or by a lexeme live beside it, with a byte that may
   follow it in the grammar. Lexemes that break this are split (concatenations into sequences,
   unions into rules, repetitions into recursive rules) until every lexeme is safe; single-byte
   lexemes always are. Front ends that build lexemes known to be safe (JSON) pass
   ``check_lexemes=False``: their terminals are then taken as the lexemes, as given (steps 2 and 4
   are skipped).
5. the rules are flattened into int32 arrays for the Earley kernels (:mod:`.earley`).

Steps 1 and 5 run as one compiled pass over the rules laid out as arrays
(:func:`_prune_flatten_kernel`) where the terminals are the lexemes (JSON Schema: the grammar of a
median MaskBench schema lowered in 0.19 -> 0.10 ms, of a p99 one 9 -> 2.6 ms); a grammar that
keeps a nullable terminal takes the Python path (prune, split, :func:`_flatten`), which is also
the tests' reference for the compiled one.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from itertools import chain

import numpy as np
from numba import njit

from ..errors import EmptyLanguageError, GrammarTooComplexError, UndefinedRuleError
from .lexdfa import FastCall
from .membound import ALT_BYTES, RULE_BYTES, RULES_BATCH, SYMBOL_BYTES, alternatives_bytes, charge, current
from .nodestore import DEAD as NODE_DEAD, LIVE as NODE_LIVE
from .regexset import CONCAT, EMPTY, EPS, INF, OR, REPEAT, ExprSet

# flat symbol encoding in the Earley tables
SYM_END = -1  # end of a production; the lexeme with index l is encoded as -(l + 2)

MAX_SPLIT_REPEAT = 2_000
MAX_LOWER_ROUNDS = 64
MAX_PRODUCT_PAIRS = 5_000
MAX_LOWER_SECONDS = 30.0


def term(e: int) -> int:
    """The grammar symbol of terminal (regex) ``e``."""
    return ~e


def is_term(sym: int) -> bool:
    return sym < 0


def _count_rules(nbytes: int) -> None:
    """Charge grammar rules to the active compile's memory bound (membound.py), in batches."""
    m = current()
    if m is not None:
        m.rules += nbytes
        if m.rules >= RULES_BATCH:
            m.flush()


class Grammar:
    """Rules ``nonterminal -> alternatives``; a symbol >= 0 is a nonterminal, ``~e`` a terminal."""

    def __init__(self, exprs: ExprSet | None = None):
        self.exprs = exprs if exprs is not None else ExprSet()
        self.names: list[str] = []
        self.index: dict[str, int] = {}
        self.rules: list[list[list[int]] | None] = []
        self.where: list[tuple[int, int] | None] = []  # first reference (line, col), for errors
        self.root: int | None = None

    def nonterminal(self, name: str, where: tuple[int, int] | None = None) -> int:
        i = self.index.get(name)
        if i is None:
            i = self._add(name, where)
        return i

    def _add(self, name: str, where: tuple[int, int] | None) -> int:
        """A new nonterminal named ``name`` (not taken)."""
        i = self._new(name, where)
        self.index[name] = i
        return i

    def _new(self, name: str, where: tuple[int, int] | None) -> int:
        _count_rules(RULE_BYTES)
        i = len(self.names)
        self.names.append(name)
        self.rules.append(None)
        self.where.append(where)
        return i

    def fresh(self, prefix: str) -> int:
        """A new helper nonterminal. Its name is spelled ``prefix#<id>`` when shown
        (:func:`rule_name`) and is not in :attr:`index`: a helper is referred to by id only (a
        front end makes thousands: no name is formatted or indexed for them)."""
        return self._new(prefix + "#", None)

    def name(self, nt: int) -> str:
        return rule_name(self.names, nt)

    def define(self, nt: int, alternatives: list[list[int]], copy: bool = True) -> int:
        """Set the alternatives of ``nt`` (copied; ``copy=False``: the caller hands over the lists
        and never changes them again)."""
        _count_rules(56 + ALT_BYTES * len(alternatives) + SYMBOL_BYTES * sum(map(len, alternatives)))
        self.rules[nt] = [list(a) for a in alternatives] if copy else alternatives
        return nt

    def add_alternative(self, nt: int, alt: list[int]) -> None:
        _count_rules(ALT_BYTES + SYMBOL_BYTES * len(alt))
        if self.rules[nt] is None:
            self.rules[nt] = []
        self.rules[nt].append(list(alt))

    def rule(self, name: str, alternatives: list[list[int]]) -> int:
        return self.define(self.nonterminal(name), alternatives)

    def t(self, e: int) -> int:
        return ~e

    def lit(self, s: str | bytes) -> int:
        return ~self.exprs.literal(s)

    def describe(self) -> str:
        out = []
        for i, alts in enumerate(self.rules):
            if alts is None:
                continue
            parts = []
            for a in alts:
                parts.append(" ".join(self.name(s) if s >= 0 else "/" + self.exprs.to_str(~s) + "/" for s in a) or "ε")
            out.append(f"{self.name(i)} ::= " + " | ".join(parts))
        return "\n".join(out)


@dataclass
class FlatGrammar:
    """The Earley tables of a lowered grammar (all int32 numpy arrays)."""

    sym: np.ndarray            # per position: nonterminal id, SYM_END, or -(lexeme + 2)
    end_lhs: np.ndarray        # per position: lhs at SYM_END positions, else -1
    prod_start: np.ndarray     # first position of each production
    nt_prod_lo: np.ndarray     # productions of nonterminal n: prod_start[nt_prod_lo[n]:nt_prod_hi[n]]
    nt_prod_hi: np.ndarray
    nt_nullable: np.ndarray    # uint8
    start_nt: int              # the augmented start S' -> root
    accept_pos: int            # position of SYM_END of S' -> root
    lexemes: list[int]         # lexeme index -> expression id
    #: the lowered grammar's names and the one of each table nonterminal but the start rule's
    #: (read by :attr:`names`: helper names are spelled only when shown). A tuple of strings and an
    #: array, not lists: they live as long as the grammar, and the garbage collector walks a list
    #: at every full collection (a large schema's were 48k references, a collection of tens of
    #: milliseconds on a cold cache, inside a mask), where a tuple of strings stops being tracked
    name_src: tuple = field(default_factory=tuple, repr=False)
    name_ids: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64), repr=False)

    @property
    def names(self) -> list[str]:
        """The name of each table nonterminal, the start rule's ``<start>`` last."""
        return [rule_name(self.name_src, nt) for nt in self.name_ids] + ["<start>"]

    @property
    def n_lexemes(self) -> int:
        return len(self.lexemes)


def rule_name(names: list[str], nt: int) -> str:
    """The name of nonterminal ``nt`` as shown: a helper's (stored as ``prefix#``, see
    :meth:`Grammar.fresh`) with its id."""
    n = names[nt]
    return n + str(nt) if n[-1:] == "#" else n


def lower(g: Grammar, root: str | int = "root", check_lexemes: bool = True) -> FlatGrammar:
    """Normalise ``g`` and flatten it into Earley tables (see the module docstring)."""
    ex = g.exprs
    root_id = g.index.get(root) if isinstance(root, str) else root
    if root_id is None or g.rules[root_id] is None:
        raise UndefinedRuleError(f"the root rule {root!r} is not defined")
    for i, alts in enumerate(g.rules):
        if alts is None:
            w = g.where[i]
            raise UndefinedRuleError(f"rule {g.name(i)!r} is referenced but not defined",
                                     *(w if w else (None, None)))
    # the working copy lowering rewrites (the grammar itself is kept: both are held)
    charge("lowered rules", len(g.rules) * (RULE_BYTES + 56) + ALT_BYTES * sum(map(len, g.rules))
           + SYMBOL_BYTES * sum(map(len, chain.from_iterable(g.rules))))
    # lowering never changes a list of the grammar's: it replaces a rule's alternatives with new
    # lists, so the working copy starts out sharing them
    rules: dict[int, list[list[int]]] = dict(enumerate(g.rules))
    names = list(g.names)
    # terminal symbol -> its language is non-empty (prune's cache)
    term_alive: dict[int, bool] = {}

    def fresh(prefix: str) -> int:
        # a helper rule of lowering (an optional, a split union or repetition): its name and a
        # small rule (a split union charges its alternatives itself)
        charge("lowered rules", RULE_BYTES + alternatives_bytes(((0,), ())))
        names.append(prefix + "#")
        return len(names) - 1

    def merge_terminals(alt: list[int]) -> list[int]:
        out: list[int] = []
        for s in alt:
            if s < 0 and out and out[-1] < 0:
                out[-1] = ~ex.concat(~out[-1], ~s)
            elif s < 0 and ~s == EPS:
                continue
            else:
                out.append(s)
        return out

    def prune() -> bool:
        # (returns whether a rule kept has a nullable terminal)
        # productive nonterminals: an alternative is productive when every nonterminal in it is
        # and every terminal is non-empty. Emptiness is decided first, for every terminal in rule
        # order (deciding it may add expressions to the ExprSet: always in the same order)
        for alts in rules.values():
            for a in alts:
                for s in a:
                    if s < 0 and s not in term_alive:
                        term_alive[s] = ex.alive(~s)
        productive = _least_fixpoint(rules, term_alive)
        if root_id not in productive:
            raise EmptyLanguageError(f"the grammar's root {rule_name(names, root_id)!r} derives no string")
        # reachable from the root through productive alternatives, which are all that is kept
        seen = {root_id}
        todo = [root_id]
        nul = ex._nullable
        nullable_terms = False
        while todo:
            nt = todo.pop()
            alts = rules[nt]
            kept = []
            for a in alts:
                for s in a:
                    if (s not in productive) if s >= 0 else not term_alive[s]:
                        break
                else:
                    kept.append(a)
                    for s in a:
                        if s >= 0:
                            if s not in seen:
                                seen.add(s)
                                todo.append(s)
                        elif nul[~s]:
                            nullable_terms = True
            if len(kept) != len(alts):
                rules[nt] = kept
        if len(seen) != len(rules):
            for nt in list(rules):
                if nt not in seen:
                    del rules[nt]
        return nullable_terms

    def recursive_nts() -> set[int]:
        # nonterminals on a cycle (Tarjan-free: a simple DFS reachability per node is fine here)
        graph = {nt: {s for a in alts for s in a if s >= 0} for nt, alts in rules.items()}
        rec: set[int] = set()
        index: dict[int, int] = {}
        low: dict[int, int] = {}
        stack: list[int] = []
        on: set[int] = set()
        counter = [0]

        def strong(v: int) -> None:
            work = [(v, iter(sorted(graph[v])))]
            index[v] = low[v] = counter[0]
            counter[0] += 1
            stack.append(v)
            on.add(v)
            while work:
                node, it = work[-1]
                advanced = False
                for w in it:
                    if w not in index:
                        index[w] = low[w] = counter[0]
                        counter[0] += 1
                        stack.append(w)
                        on.add(w)
                        work.append((w, iter(sorted(graph[w]))))
                        advanced = True
                        break
                    if w in on:
                        low[node] = min(low[node], index[w])
                if advanced:
                    continue
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == node:
                            break
                    if len(comp) > 1 or node in graph[node]:
                        rec.update(comp)

        for v in graph:
            if v not in index:
                strong(v)
        return rec

    def inline_regular() -> bool:
        rec = recursive_nts()
        changed = False
        regular: dict[int, int] = {}
        for nt, alts in rules.items():
            if nt == root_id or nt in rec:
                continue
            alts = [merge_terminals(a) for a in alts]
            if all(all(s < 0 for s in a) for a in alts):
                regular[nt] = ex.alt(*[ex.concat(*[~s for s in a]) if a else EPS for a in alts])
        if not regular:
            return False
        for nt, alts in rules.items():
            new_alts = []
            for a in alts:
                b = [~regular[s] if s >= 0 and s in regular else s for s in a]
                if b != a:
                    changed = True
                new_alts.append(merge_terminals(b))
            rules[nt] = new_alts
        for nt in regular:
            if nt in rules:
                del rules[nt]
        return changed

    def split_nullable_terminals() -> None:
        memo: dict[int, int] = {}
        nul = ex._nullable
        for nt in list(rules):
            alts = rules[nt]
            for a in alts:
                for s in a:
                    if s < 0 and nul[~s]:
                        break
                else:
                    continue
                break
            else:
                continue   # no nullable terminal in this rule
            new_alts = []
            for a in alts:
                b = []
                for s in a:
                    if s < 0 and nul[~s]:
                        e = ~s
                        if e not in memo:
                            ne = ex.nonempty_part(e)
                            opt = fresh("opt")
                            rules[opt] = [[~ne], []] if ne != 0 and ex.alive(ne) else [[]]
                            memo[e] = opt
                        b.append(memo[e])
                    else:
                        b.append(s)
                new_alts.append(b)
            rules[nt] = new_alts

    if check_lexemes:
        # build words: merge adjacent terminals and inline regular rules (checked below)
        for nt in rules:
            rules[nt] = [merge_terminals(a) for a in rules[nt]]
        prune()
        for _ in range(MAX_LOWER_ROUNDS):
            if not inline_regular():
                break
        split_nullable_terminals()
        prune()
    else:
        # pruned and flattened in one compiled pass, unless a nullable terminal is kept
        flat = _flatten_compiled(ex, rules, root_id, names, prune=True)
        if flat is not None:
            return flat
        prune()
        # the optional rules it adds are productive and reachable: no second prune needed
        split_nullable_terminals()
        return _flatten(ex, rules, root_id, names)

    _make_greedy_safe(ex, rules, root_id, fresh, merge_terminals, split_nullable_terminals, prune)
    return _flatten_compiled(ex, rules, root_id, names, prune=False)


def _horn_fixpoint(rules: dict[int, list[list[int]]], term_ok) -> set[int]:
    """The least set of nonterminals N such that nt is in N when some alternative of nt has all
    its nonterminals in N and ``term_ok(e)`` for each of its terminals ~e. Linear in the grammar
    size: every alternative counts its missing nonterminals, and a nonterminal joining N
    decrements the alternatives it occurs in."""
    missing: list[int] = []
    owner: list[int] = []
    uses: dict[int, list[int]] = {}
    done: set[int] = set()
    todo: list[int] = []
    for nt, alts in rules.items():
        for a in alts:
            k = len(missing)
            need = 0
            ok = True
            for s in a:
                if s >= 0:
                    need += 1
                    uses.setdefault(s, []).append(k)
                elif not term_ok(~s):
                    ok = False
            missing.append(need if ok else -1)
            owner.append(nt)
            if ok and need == 0 and nt not in done:
                done.add(nt)
                todo.append(nt)
    while todo:
        nt = todo.pop()
        for k in uses.get(nt, ()):
            if missing[k] > 0:
                missing[k] -= 1
                if missing[k] == 0:
                    o = owner[k]
                    if o not in done:
                        done.add(o)
                        todo.append(o)
    return done


def _least_fixpoint(rules: dict[int, list[list[int]]], term_ok: dict[int, bool] | None) -> set[int]:
    """What :func:`_horn_fixpoint` computes, with ``term_ok`` a dict from terminal *symbols* to
    their truth (None: no terminal is ok). Sweeps over the rules from the last to the first:
    rules mostly refer to rules made after them (front ends name a rule before building what it
    refers to), so one sweep settles nearly everything and another one or two the rest. Sweeps
    stop when one adds nothing; past a few times the grammar's size in work, the counting
    fixpoint takes over (linear in every case)."""
    done: set[int] = set()
    pending = list(reversed(rules.items()))
    budget = 4 * len(pending) + 64
    while True:
        rest = []
        for nt, alts in pending:
            for a in alts:
                for s in a:
                    if s >= 0:
                        if s not in done:
                            break
                    elif term_ok is None or not term_ok[s]:
                        break
                else:
                    done.add(nt)
                    break
            else:
                rest.append((nt, alts))
        if not rest or len(rest) == len(pending):
            return done   # settled: a sweep that adds nothing leaves nothing to add
        budget -= len(pending)
        if budget < len(rest):
            return _horn_fixpoint(rules, (lambda e: False) if term_ok is None else (lambda e: term_ok[~e]))
        pending = rest


def _nullable_nts(rules: dict[int, list[list[int]]]) -> set[int]:
    return _least_fixpoint(rules, None)


class _JitClock:
    """Seconds this process spent compiling Numba kernels (outermost compilations, all threads):
    a cold kernel cache compiles them during a process's first grammars, which is not the
    grammar's work, so the lowering's time bound does not charge it (:func:`work_clock`).

    One process-wide depth counter, not per thread: Numba's compiler lock serialises
    compilations, so the nested start/end events of one thread's compile (a kernel compiling
    the kernels it calls) never interleave with another thread's."""

    seconds = 0.0
    _depth = 0
    _t0 = 0.0
    _installed = False

    @classmethod
    def install(cls) -> None:
        if cls._installed:
            return
        from numba.core import event

        class _Listener(event.Listener):
            def on_start(self, ev):
                if _JitClock._depth == 0:
                    _JitClock._t0 = time.monotonic()
                _JitClock._depth += 1

            def on_end(self, ev):
                _JitClock._depth -= 1
                if _JitClock._depth == 0:
                    _JitClock.seconds += time.monotonic() - _JitClock._t0

        event.register("numba:compile", _Listener())
        cls._installed = True


def work_clock() -> float:
    """``time.monotonic()`` less the time spent compiling Numba kernels (see :class:`_JitClock`)."""
    _JitClock.install()
    return time.monotonic() - _JitClock.seconds


def _check_deadline(deadline: float | None) -> None:
    if deadline is not None and work_clock() > deadline:
        raise GrammarTooComplexError(f"checking the grammar's lexemes took over {MAX_LOWER_SECONDS:.0f} s")


def _follow_sets(rules, root_id, term_value, deadline: float | None = None) -> tuple[dict[int, int], int]:
    """For every terminal, the union over its occurrences of what may come right after it, and
    what may come first from the root; ``term_value(e)`` is a terminal's own (bitset) value:
    its first bytes, or its lexeme bit."""
    nullable = _nullable_nts(rules)
    first: dict[int, int] = {nt: 0 for nt in rules}
    tv: dict[int, int] = {}

    def value(e: int) -> int:
        v = tv.get(e)
        if v is None:
            v = tv[e] = term_value(e)
        return v

    def first_of(seq) -> tuple[int, bool]:
        m = 0
        for s in seq:
            if s < 0:
                return m | value(~s), False
            m |= first[s]
            if s not in nullable:
                return m, False
        return m, True

    changed = True
    while changed:
        changed = False
        _check_deadline(deadline)
        for nt, alts in rules.items():
            m = first[nt]
            for a in alts:
                m |= first_of(a)[0]
            if m != first[nt]:
                first[nt] = m
                changed = True
    follow: dict[int, int] = {nt: 0 for nt in rules}
    changed = True
    while changed:
        changed = False
        _check_deadline(deadline)
        for nt, alts in rules.items():
            for a in alts:
                for i, s in enumerate(a):
                    if s < 0:
                        continue
                    m, nul = first_of(a[i + 1:])
                    if nul:
                        m |= follow[nt]
                    if m & ~follow[s]:
                        follow[s] |= m
                        changed = True
    term_follow: dict[int, int] = {}
    for nt, alts in rules.items():
        for a in alts:
            for i, s in enumerate(a):
                if s < 0:
                    m, nul = first_of(a[i + 1:])
                    if nul:
                        m |= follow[nt]
                    term_follow[~s] = term_follow.get(~s, 0) | m
    return term_follow, first[root_id]


def _colive(ex: ExprSet, rules, root_id, terms: list[int], deadline: float | None = None) -> dict[int, int]:
    """For each terminal, a bitset (by position in ``terms``) of the terminals that may be
    allowed in the same Earley row (a sound over-approximation).

    A row is the initial row or comes from scanning the lexemes that ended together; what it
    allows is what may follow one of them. So the groups are FIRST(root) and FOLLOW(X) for each
    terminal X, and FOLLOW(X1) | FOLLOW(X2) whenever X1 and X2 share a group and a string."""
    bit = {e: 1 << i for i, e in enumerate(terms)}
    follow, start = _follow_sets(rules, root_id, lambda e: bit[e], deadline)
    groups = {start} | {follow.get(e, 0) for e in terms}
    meets: dict[tuple[int, int], bool] = {}
    for _ in range(8):
        new = set()
        for g in groups:
            members = [e for e in terms if g & bit[e]]
            for i, x1 in enumerate(members):
                for x2 in members[i + 1:]:
                    k = (x1, x2)
                    if k not in meets:
                        meets[k] = ex.alive(ex.intersect(x1, x2))
                    if meets[k]:
                        u = follow.get(x1, 0) | follow.get(x2, 0)
                        if u not in groups:
                            new.add(u)
        if not new:
            break
        groups |= new
    else:
        return {e: (1 << len(terms)) - 1 for e in terms}
    out = {e: bit[e] for e in terms}
    for g in groups:
        for e in terms:
            if g & bit[e]:
                out[e] |= g
    return out


def _extension_bytes(ex: ExprSet, e1: int, e2: int) -> int:
    """Bytes ``b`` such that some non-empty ``u`` in L(e1) has ``u b`` as a prefix of L(e2)."""
    out = 0
    seen = set()
    todo = [(e1, e2)]
    while todo:
        x1, x2 = todo.pop()
        t1 = ex.transitions(x1)
        t2 = ex.transitions(x2)
        for m1, y1 in t1:
            for m2, y2 in t2:
                if m1 & m2 and (y1, y2) not in seen:
                    seen.add((y1, y2))
                    if len(seen) > MAX_PRODUCT_PAIRS:
                        return -1  # too big to tell: treat as unsafe
                    if ex.nullable(y1):
                        out |= ex.first_bytes(y2)
                    todo.append((y1, y2))
    return out


def _make_greedy_safe(ex, rules, root_id, fresh, merge_terminals, split_nullable_terminals, prune):
    deadline = work_clock() + MAX_LOWER_SECONDS
    ext_cache: dict[tuple[int, int], int] = {}
    for _ in range(MAX_LOWER_ROUNDS):
        term_follow, _ = _follow_sets(rules, root_id, ex.first_bytes, deadline)
        terms = sorted(term_follow)
        colive = _colive(ex, rules, root_id, terms, deadline)
        firsts = {e: ex.first_bytes(e) for e in terms}
        to_split: dict[int, int | None] = {}
        for e1 in terms:
            fol = term_follow[e1]
            if not fol:
                continue
            for j, e2 in enumerate(terms):
                if not (colive[e1] >> j) & 1 or not (firsts[e1] & firsts[e2]):
                    continue
                key = (e1, e2)
                _check_deadline(deadline)
                x = ext_cache.get(key)
                if x is None:
                    x = ext_cache[key] = _extension_bytes(ex, e1, e2)
                if x == -1 or x & fol:
                    if _splittable(ex, e2):
                        to_split.setdefault(e2, e1 if e2 != e1 else None)
                    elif _splittable(ex, e1):
                        to_split.setdefault(e1, None)
        if not to_split:
            return
        repl = {e: _split(ex, e, rules, fresh, hint) for e, hint in to_split.items()}
        _replace_terminals(rules, repl)
        # nullable pieces are split structurally too (star -> recursive rule, ...): rebuilding
        # them with nonempty_part would recreate the very lexeme that was just split
        for _ in range(MAX_LOWER_ROUNDS):
            nullable = {~s for alts in list(rules.values()) for a in alts for s in a
                        if s < 0 and ex.nullable(~s) and _splittable(ex, ~s)}
            if not nullable:
                break
            _replace_terminals(rules, {e: _split(ex, e, rules, fresh) for e in nullable})
        split_nullable_terminals()
        prune()
    raise GrammarTooComplexError("could not split the grammar's terminals into unambiguous lexemes")


def _replace_terminals(rules, repl: dict[int, list[int]]) -> None:
    for nt in list(rules):
        new_alts = []
        for a in rules[nt]:
            b: list[int] = []
            for s in a:
                if s < 0 and ~s in repl:
                    b.extend(repl[~s])
                elif s != ~EPS:
                    b.append(s)
            new_alts.append(b)
        rules[nt] = new_alts


def _splittable(ex: ExprSet, e: int) -> bool:
    return ex.kind[e] in (CONCAT, OR, REPEAT)


def _split(ex: ExprSet, e: int, rules, fresh, hint: int | None = None) -> list[int]:
    """Split terminal ``e`` one level; a concatenation that starts with the lexeme ``hint`` (the
    one it extends) is cut right after it, so the shorter lexeme is kept whole."""
    k = ex.kind[e]
    if k == CONCAT:
        if hint is not None:
            xs = []
            x = e
            while ex.kind[x] == CONCAT:
                xs.append(ex.args[x][0])
                x = ex.args[x][1]
            xs.append(x)
            for cut in range(len(xs) - 1, 0, -1):
                if ex.concat(*xs[:cut]) == hint:
                    return [~hint, ~ex.concat(*xs[cut:])]
        a, b = ex.args[e]
        return [~a, ~b]
    if k == OR:
        nt = fresh("alt")
        rules[nt] = [[] if x == EPS else [~x] for x in ex.args[e]]
        charge("lowered rules", alternatives_bytes(rules[nt]))
        return [nt]
    if k == REPEAT:
        a, lo, hi = ex.args[e]
        if lo + (0 if hi == INF else hi) > MAX_SPLIT_REPEAT:
            raise GrammarTooComplexError(f"repetition bound {max(lo, hi)} too large to expand")
        seq = [~a] * lo
        if hi == INF:
            star = fresh("star")
            rules[star] = [[~a, star], []]
            seq.append(star)
        elif hi > lo:
            prev = None
            for _ in range(hi - lo):
                nt = fresh("rep")
                rules[nt] = [[~a] + ([prev] if prev is not None else []), []]
                prev = nt
            seq.append(prev)
        return seq
    return [~e]


def _flatten(ex: ExprSet, rules: dict[int, list[list[int]]], root_id: int, names: list[str]) -> FlatGrammar:
    nts = sorted(rules)
    remap = {nt: i for i, nt in enumerate(nts)}
    start = len(nts)
    lex_index: dict[int, int] = {}   # terminal symbol -> its symbol in the tables
    lexemes: list[int] = []
    sym: list[int] = []
    prod_start: list[int] = []
    lo: list[int] = []
    hi: list[int] = []
    all_rules = [(remap[nt], rules[nt]) for nt in nts] + [(start, [[root_id]])]
    n_prods = sum(map(len, rules.values())) + 1   # and the start rule's [root]
    n_pos = n_prods + sum(map(len, chain.from_iterable(rules.values()))) + 1
    # sym and end_lhs per position, prod_start per production, nt_prod_lo/hi and nullable (uint8,
    # and the int32 copy of grammar_tables) per nonterminal
    charge("Earley tables", 8 * n_pos + 4 * n_prods + 13 * (start + 1))
    ends: list[int] = []   # the SYM_END positions (end_lhs holds -1 elsewhere)
    # the alternatives without terminals, in table numbering: only they can be nullable (a
    # terminal never is here)
    eps_rules: dict[int, list[list[int]]] = {}
    for new_nt, alts in all_rules:
        lo.append(len(prod_start))
        for a in alts:
            p = len(sym)
            prod_start.append(p)
            pure = True
            for s in a:
                if s >= 0:
                    sym.append(remap[s])
                else:
                    pure = False
                    li = lex_index.get(s)
                    if li is None:
                        li = lex_index[s] = -(len(lexemes) + 2)
                        lexemes.append(~s)
                    sym.append(li)
            if pure:
                if new_nt in eps_rules:
                    eps_rules[new_nt].append(sym[p:])
                else:
                    eps_rules[new_nt] = [sym[p:]]
            ends.append(len(sym))
            sym.append(SYM_END)
        hi.append(len(prod_start))
    end_lhs = np.full(len(sym), -1, dtype=np.int32)
    end_lhs[ends] = [new_nt for new_nt, alts in all_rules for _ in alts]
    nul = np.zeros(start + 1, dtype=np.uint8)
    for n in _nullable_nts(eps_rules):   # the start rule's too
        nul[n] = 1
    accept_pos = len(sym) - 1
    i32 = lambda x: np.asarray(x, dtype=np.int32)  # noqa: E731
    return FlatGrammar(
        sym=i32(sym), end_lhs=end_lhs, prod_start=i32(prod_start), nt_prod_lo=i32(lo),
        nt_prod_hi=i32(hi), nt_nullable=nul, start_nt=start, accept_pos=accept_pos,
        lexemes=lexemes, name_src=tuple(names), name_ids=np.array(nts, np.int64),
    )


# ------------------------------------------------------------------ compiled prune and flatten
#: :func:`_prune_flatten_kernel`'s status
FLAT_OK, FLAT_EMPTY_ROOT, FLAT_NULLABLE_TERMINAL, FLAT_UNDECIDED = 0, 1, 2, 3


@njit(nogil=True, cache=True)
def _horn(n_nts, owner, start, length, syms, alt_ok, counted):
    """The counting fixpoint of :func:`_horn_fixpoint` over table-shaped rules: ``owner[k]``,
    ``start[k]``, ``length[k]`` of alternative ``k`` (symbols ``syms``, a nonterminal as its index
    below ``n_nts``); ``alt_ok[k]`` false drops the alternative; a symbol counts where
    ``counted[position]`` (the others are terminals taken as fine). Returns uint8 per
    nonterminal."""
    n_alts = owner.shape[0]
    missing = np.zeros(n_alts, np.int64)
    n_uses = np.zeros(n_nts + 1, np.int64)
    for k in range(n_alts):
        if alt_ok[k]:
            for p in range(start[k], start[k] + length[k]):
                if counted[p]:
                    n_uses[syms[p] + 1] += 1
    for i in range(n_nts):
        n_uses[i + 1] += n_uses[i]
    uses = np.empty(n_uses[n_nts], np.int64)
    fill = n_uses[:n_nts].copy()
    done = np.zeros(n_nts, np.uint8)
    todo = np.empty(n_nts, np.int64)
    n_todo = 0
    for k in range(n_alts):
        if not alt_ok[k]:
            continue
        need = 0
        for p in range(start[k], start[k] + length[k]):
            if counted[p]:
                uses[fill[syms[p]]] = k
                fill[syms[p]] += 1
                need += 1
        missing[k] = need
        if need == 0 and not done[owner[k]]:
            done[owner[k]] = 1
            todo[n_todo] = owner[k]
            n_todo += 1
    while n_todo:
        n_todo -= 1
        nt = todo[n_todo]
        for u in range(n_uses[nt], n_uses[nt + 1]):
            k = uses[u]
            missing[k] -= 1
            if missing[k] == 0 and not done[owner[k]]:
                done[owner[k]] = 1
                todo[n_todo] = owner[k]
                n_todo += 1
    return done


@njit(nogil=True, cache=True)
def _prune_flatten_kernel(keys, n_alts, alt_len, syms, hb, nul, liv, root, n_names, prune):
    """:func:`lower`'s prune (when ``prune``) and :func:`_flatten` in one pass over rules as
    arrays: ``keys`` the nonterminals (ids below ``n_names``) with ``n_alts`` alternatives each,
    of lengths ``alt_len``, symbols ``syms`` concatenated (a terminal ``~e``). A terminal is alive
    when nullable, free of intersections and complements (``hb``) or decided live (``liv``, the
    store's flags); one that is none of these nor decided dead makes the status
    :data:`FLAT_UNDECIDED`, with those terminals' expressions (Python decides them, and calls
    again). Else the status is :data:`FLAT_OK`, or :data:`FLAT_EMPTY_ROOT`, or
    :data:`FLAT_NULLABLE_TERMINAL` when pruning kept a nullable terminal (lowering must split
    those first), with the tables: sym, end_lhs, prod_start, nt_prod_lo, nt_prod_hi,
    nt_nullable, the lexemes (expression ids) and the kept nonterminals in table order (the
    start rule's not among them)."""
    n_rules = keys.shape[0]
    n_all = alt_len.shape[0]
    n_pos = syms.shape[0]
    e32 = np.zeros(0, np.int32)
    e64 = np.zeros(0, np.int64)
    # the distinct terminals, numbered in order of first occurrence
    tpos = np.empty(n_pos, np.int64)
    n_t = 0
    for p in range(n_pos):
        if syms[p] < 0:
            tpos[n_t] = p
            n_t += 1
    tpos = tpos[:n_t]
    texpr = np.empty(n_t, np.int64)
    for i in range(n_t):
        texpr[i] = ~syms[tpos[i]]
    by = np.argsort(texpr, kind="mergesort")   # (stable: the first of equal ones first)
    tidx = np.full(n_pos, -1, np.int64)
    first = np.empty(n_t, np.int64)   # distinct terminal -> its first occurrence's rank
    n_u = 0
    for j in range(n_t):
        i = by[j]
        if j == 0 or texpr[i] != texpr[by[j - 1]]:
            first[n_u] = i
            n_u += 1
        tidx[tpos[i]] = n_u - 1
    # renumbered by first occurrence
    rank = np.argsort(first[:n_u])
    renum = np.empty(n_u, np.int64)
    for i in range(n_u):
        renum[rank[i]] = i
    uexpr = np.empty(n_u, np.int64)
    for i in range(n_u):
        uexpr[i] = texpr[first[rank[i]]]
    for p in range(n_pos):
        if tidx[p] >= 0:
            tidx[p] = renum[tidx[p]]
    term_ok = np.zeros(n_u, np.uint8)
    n_undecided = 0
    undecided = np.empty(n_u, np.int64)
    for i in range(n_u):
        e = uexpr[i]
        if e == EMPTY:
            continue
        if nul[e] or not hb[e] or liv[e] == NODE_LIVE:
            term_ok[i] = 1
        elif liv[e] != NODE_DEAD and prune:   # Python decides
            undecided[n_undecided] = e
            n_undecided += 1
    if n_undecided:
        return (FLAT_UNDECIDED, e32, e32, e32, e32, e32, np.zeros(0, np.uint8), undecided[:n_undecided].copy(), e64)
    rule_of = np.full(n_names, -1, np.int64)
    for r in range(n_rules):
        rule_of[keys[r]] = r
    first_alt = np.zeros(n_rules + 1, np.int64)
    for r in range(n_rules):
        first_alt[r + 1] = first_alt[r] + n_alts[r]
    start = np.zeros(n_all, np.int64)
    owner = np.empty(n_all, np.int64)
    for r in range(n_rules):
        for k in range(first_alt[r], first_alt[r + 1]):
            owner[k] = r
    for k in range(1, n_all):
        start[k] = start[k - 1] + alt_len[k - 1]
    # nonterminal symbols as rule indices (-1: not a rule)
    rsym = np.full(n_pos, -1, np.int64)
    is_nt = np.zeros(n_pos, np.uint8)
    for p in range(n_pos):
        s = syms[p]
        if s >= 0:
            is_nt[p] = 1
            if s < n_names:
                rsym[p] = rule_of[s]
    alt_ok = np.ones(n_all, np.uint8)
    root_rule = rule_of[root] if 0 <= root < n_names else -1
    keep = np.ones(n_rules, np.uint8)
    if prune:
        for k in range(n_all):
            for p in range(start[k], start[k] + alt_len[k]):
                if (is_nt[p] and rsym[p] < 0) or (not is_nt[p] and not term_ok[tidx[p]]):
                    alt_ok[k] = 0
                    break
        productive = _horn(n_rules, owner, start, alt_len, rsym, alt_ok, is_nt)
        if root_rule < 0 or not productive[root_rule]:
            return (FLAT_EMPTY_ROOT, e32, e32, e32, e32, e32, np.zeros(0, np.uint8), e64, e64)
        for k in range(n_all):
            if alt_ok[k]:
                for p in range(start[k], start[k] + alt_len[k]):
                    if is_nt[p] and not productive[rsym[p]]:
                        alt_ok[k] = 0
                        break
        # reachable from the root through the alternatives kept
        keep[:] = 0
        keep[root_rule] = 1
        todo = np.empty(n_rules, np.int64)
        todo[0] = root_rule
        n_todo = 1
        while n_todo:
            n_todo -= 1
            r = todo[n_todo]
            for k in range(first_alt[r], first_alt[r + 1]):
                if not alt_ok[k]:
                    continue
                for p in range(start[k], start[k] + alt_len[k]):
                    if is_nt[p]:
                        q = rsym[p]
                        if not keep[q]:
                            keep[q] = 1
                            todo[n_todo] = q
                            n_todo += 1
                    elif nul[uexpr[tidx[p]]]:
                        return (FLAT_NULLABLE_TERMINAL, e32, e32, e32, e32, e32, np.zeros(0, np.uint8), e64, e64)
    # table order: the kept nonterminals by id, then the start rule S' -> root
    order = np.argsort(keys)
    table = np.full(n_rules, -1, np.int64)
    kept = np.empty(n_rules, np.int64)
    n_kept = 0
    for i in range(n_rules):
        r = order[i]
        if keep[r]:
            table[r] = n_kept
            kept[n_kept] = keys[r]
            n_kept += 1
    n_prods = 1
    n_sym = 2
    for k in range(n_all):
        if keep[owner[k]] and alt_ok[k]:
            n_prods += 1
            n_sym += alt_len[k] + 1
    sym = np.empty(n_sym, np.int32)
    end_lhs = np.full(n_sym, -1, np.int32)
    prod_start = np.empty(n_prods, np.int32)
    lo = np.empty(n_kept + 1, np.int32)
    hi = np.empty(n_kept + 1, np.int32)
    p_owner = np.empty(n_prods, np.int64)
    p_pure = np.zeros(n_prods, np.uint8)
    lex_of = np.full(n_u, -1, np.int64)
    lexemes = np.empty(n_u, np.int64)
    n_lex = 0
    n_p = 0
    q = 0
    for i in range(n_kept + 1):
        lo[i] = n_p
        if i < n_kept:
            r = rule_of[kept[i]]
            k0, k1 = first_alt[r], first_alt[r + 1]
        else:
            k0, k1 = 0, 1   # the start rule, one alternative [root]
        for k in range(k0, k1):
            if i < n_kept and not alt_ok[k]:
                continue
            prod_start[n_p] = q
            p_owner[n_p] = i
            pure = 1
            if i == n_kept:
                sym[q] = table[root_rule]
                q += 1
            else:
                for p in range(start[k], start[k] + alt_len[k]):
                    if is_nt[p]:
                        sym[q] = table[rsym[p]]
                    else:
                        pure = 0
                        t = tidx[p]
                        if lex_of[t] < 0:
                            lex_of[t] = n_lex
                            lexemes[n_lex] = uexpr[t]
                            n_lex += 1
                        sym[q] = -(lex_of[t] + 2)
                    q += 1
            p_pure[n_p] = pure
            end_lhs[q] = i
            sym[q] = SYM_END
            q += 1
            n_p += 1
        hi[i] = n_p
    # nullable: the counting fixpoint over the alternatives without terminals
    p_len = np.empty(n_prods, np.int64)
    p_start = np.empty(n_prods, np.int64)
    for j in range(n_prods):
        p_start[j] = prod_start[j]
        p_len[j] = (prod_start[j + 1] if j + 1 < n_prods else q) - prod_start[j] - 1
    counted = np.zeros(q, np.uint8)
    sym64 = np.empty(q, np.int64)
    for j in range(q):
        sym64[j] = sym[j]
        counted[j] = sym[j] >= 0
    nt_nul = _horn(n_kept + 1, p_owner, p_start, p_len, sym64, p_pure, counted)
    return (FLAT_OK, sym, end_lhs, prod_start, lo, hi, nt_nul, lexemes[:n_lex].copy(), kept[:n_kept].copy())


_prune_flatten = FastCall(_prune_flatten_kernel)


def _flatten_compiled(ex: ExprSet, rules: dict[int, list[list[int]]], root_id: int, names: list[str],
                      prune: bool) -> FlatGrammar | None:
    """:func:`_flatten`, after lowering's prune when ``prune`` (JSON Schema grammars: their
    terminals are their lexemes), in one compiled pass (:func:`_prune_flatten_kernel`). None
    where the pruned rules hold a nullable terminal (lowering splits those in Python first, and
    flattens in Python); raises :class:`EmptyLanguageError` where the root derives nothing. The rules are left as
    they were."""
    keys = np.fromiter(rules, np.int64, len(rules))
    alts = list(rules.values())
    n_alts = np.fromiter(map(len, alts), np.int64, len(alts))
    flat = list(chain.from_iterable(alts))
    alt_len = np.fromiter(map(len, flat), np.int64, len(flat))
    syms = np.fromiter(chain.from_iterable(flat), np.int64, int(alt_len.sum()))
    for _ in range(2):
        S = ex._S
        r = _prune_flatten(keys, n_alts, alt_len, syms, S.hb, S.nul, S.liv, root_id, len(names), prune)
        status, sym, end_lhs, prod_start, lo, hi, nul, lexemes, kept = r
        if status != FLAT_UNDECIDED:
            break
        for e in lexemes.tolist():   # terminals whose emptiness takes a search, in rule order
            ex.alive(e)   # (decided in the store's flags)
    else:
        return None
    if status == FLAT_EMPTY_ROOT:
        raise EmptyLanguageError(f"the grammar's root {rule_name(names, root_id)!r} derives no string")
    if status == FLAT_NULLABLE_TERMINAL:
        return None
    charge("Earley tables", 8 * sym.shape[0] + 4 * prod_start.shape[0] + 13 * lo.shape[0])
    return FlatGrammar(
        sym=sym, end_lhs=end_lhs, prod_start=prod_start, nt_prod_lo=lo, nt_prod_hi=hi, nt_nullable=nul,
        start_nt=lo.shape[0] - 1, accept_pos=sym.shape[0] - 1, lexemes=lexemes.tolist(),
        name_src=tuple(names), name_ids=kept,
    )
