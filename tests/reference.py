"""A slow, independent reference recognizer for the test oracles.

``ByteEarley`` runs a byte-level Earley parser directly on a :class:`grammask.grammar.cfg.Grammar`
(before any lowering: no lexemes, no maximal munch). A terminal is followed through its regex
derivatives byte by byte, so the recognizer implements the plain context-free semantics that the
engine's lexer/parser split must reproduce. Everything here is simple Python on purpose.
"""
from __future__ import annotations


class ByteEarley:
    def __init__(self, grammar, root="root"):
        self.g = grammar
        self.ex = grammar.exprs
        self.root = grammar.index[root] if isinstance(root, str) else root
        self.rules = {i: alts for i, alts in enumerate(grammar.rules) if alts is not None}
        self.nullable = self._nullable()

    def _nullable(self):
        ex = self.ex
        nul = set()
        changed = True
        while changed:
            changed = False
            for nt, alts in self.rules.items():
                if nt in nul:
                    continue
                for a in alts:
                    if all((s >= 0 and s in nul) or (s < 0 and ex.nullable(~s)) for s in a):
                        nul.add(nt)
                        changed = True
                        break
        return nul

    # an item: (nt, alt_index, dot, origin, d) with d the derivative of the terminal at dot (or -1)
    def initial(self):
        items = set()
        self._close(items, [(-1, 0, 0, 0, -1)], 0, [])
        return [items]

    def _alt(self, nt, ai):
        if nt == -1:
            return [self.root]
        return self.rules[nt][ai]

    def _close(self, items, todo, k, sets):
        ex = self.ex
        while todo:
            it = todo.pop()
            if it in items:
                continue
            items.add(it)
            nt, ai, dot, org, d = it
            alt = self._alt(nt, ai)
            if dot == len(alt):
                if nt == -1:
                    continue
                base = sets[org] if org < k else items
                for it2 in list(base):
                    nt2, ai2, dot2, org2, d2 = it2
                    alt2 = self._alt(nt2, ai2)
                    if dot2 < len(alt2) and alt2[dot2] == nt and d2 == -1:
                        todo.append((nt2, ai2, dot2 + 1, org2, -1))
                continue
            s = alt[dot]
            if s >= 0:
                for aj in range(len(self.rules[s])):
                    todo.append((s, aj, 0, k, -1))
                if s in self.nullable:
                    todo.append((nt, ai, dot + 1, org, -1))
                # completions of s that already happened in this set (origin k)
                for it2 in list(items):
                    nt2, ai2, dot2, org2, _ = it2
                    if nt2 == s and org2 == k and dot2 == len(self._alt(nt2, ai2)):
                        todo.append((nt, ai, dot + 1, org, -1))
            else:
                e = ~s if d == -1 else d
                if d == -1 and ex.nullable(e):
                    todo.append((nt, ai, dot + 1, org, -1))

    def step(self, sets, b):
        """Sets after one more byte, or None if the prefix dies."""
        ex = self.ex
        k = len(sets)
        seeds = []
        for it in sets[-1]:
            nt, ai, dot, org, d = it
            alt = self._alt(nt, ai)
            if dot < len(alt) and alt[dot] < 0:
                e = ~alt[dot] if d == -1 else d
                e2 = ex.deriv(e, b)
                if ex.alive(e2):
                    seeds.append((nt, ai, dot, org, e2))
                    if ex.nullable(e2):
                        seeds.append((nt, ai, dot + 1, org, -1))
        if not seeds:
            return None
        items = set()
        new = sets + [items]
        self._close(items, seeds, k, new)
        return new

    def feed(self, sets, data: bytes):
        for b in data:
            sets = self.step(sets, b)
            if sets is None:
                return None
        return sets

    def can_end(self, sets) -> bool:
        return any(it[0] == -1 and it[2] == 1 for it in sets[-1])

    def accepts(self, data: bytes) -> bool:
        sets = self.feed(self.initial(), data)
        return sets is not None and self.can_end(sets)


def reference_mask(rec: ByteEarley, sets, token_bytes, stop_ids):
    """Set of token ids the reference allows after ``sets``."""
    allowed = set()
    cache = {}
    for t, tb in enumerate(token_bytes):
        if t in stop_ids:
            if rec.can_end(sets):
                allowed.add(t)
            continue
        if not tb:
            continue
        # share work between tokens with common prefixes
        cur = sets
        i = 0
        for j in range(len(tb), 0, -1):
            if tb[:j] in cache:
                cur, i = cache[tb[:j]], j
                break
        ok = cur is not None
        while ok and i < len(tb):
            cur = rec.step(cur, tb[i])
            i += 1
            cache[tb[:i]] = cur
            ok = cur is not None
        if ok:
            allowed.add(t)
    return allowed
