"""Structural tags: free text interleaved with tagged, schema-constrained JSON bodies.

The grammar (``mode="auto"``, xgrammar's legacy structural tag)::

    root   ::= FREE | TRIG_i rest_i root            one alternative per trigger t_i
    rest_i ::= TAIL_j BODY_j END_j | ...            structures j whose begin starts with t_i

``FREE``   valid UTF-8 text containing no trigger (the generation may end here);
``TRIG_i`` text with no trigger, then ``t_i`` (the first trigger occurrence ends the lexeme);
``TAIL_j`` the rest of ``begin_j`` after the trigger, a literal;
``BODY_j`` the JSON-schema grammar of structure j (imported from its own :class:`Grammar`);
``END_j``  up to 8 whitespace bytes, then ``end_j``.

Every lexeme is greedy-safe by construction (``TRIG_i`` cannot be extended: a longer string would
contain a trigger before its end; literals cannot be extended), so the grammar is compiled with
``check_lexemes=False`` like the JSON grammars it embeds. ``FREE`` and ``TRIG_i`` are built with
regex intersection and complement (``¬(.*T.*)``), which the derivative lexer handles directly.

``mode="required"`` drops the free text: one or more tags (``allow_multiple``), separated by
optional whitespace. Compile with :meth:`~.compiler.GrammarCompiler.compile_structural_tag`.
OpenAI ``tools`` become tag specs in :mod:`grammask.pipeline.structural_tag`.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from .cfg import Grammar
from .regexset import ExprSet

__all__ = ["END_WHITESPACE", "TagSpec", "TagStructure", "import_grammar", "schema_grammar",
           "structural_tag_grammar"]

END_WHITESPACE = 8


@dataclass(frozen=True)
class TagStructure:
    begin: str
    schema: object
    end: str


@dataclass(frozen=True)
class TagSpec:
    structures: tuple[TagStructure, ...]
    triggers: tuple[str, ...]
    mode: str = "auto"            # "auto": free text and tags; "required": tags only
    allow_multiple: bool = True   # required mode: more than one tag

    def canonical(self) -> str:
        return json.dumps({"structures": [[s.begin, s.schema, s.end] for s in self.structures],
                           "triggers": list(self.triggers), "mode": self.mode,
                           "multiple": self.allow_multiple}, sort_keys=True, separators=(",", ":"))


# ---------------------------------------------------------------------------------------------- grammar import
def import_grammar(dst: Grammar, src: Grammar, prefix: str, root: str | int | None = None) -> int:
    """Copy every rule of ``src`` into ``dst`` (names prefixed); return the copied root's id."""
    if root is None:
        root = src.root if src.root is not None else src.index["root"]
    root_id = src.index[root] if isinstance(root, str) else root
    memo: dict[int, int] = {}
    remap = {i: dst.nonterminal(f"{prefix}:{src.name(i)}") for i in range(len(src.names))}
    for i, alts in enumerate(src.rules):
        if alts is None:
            continue
        new_alts = []
        for a in alts:
            new_alts.append([remap[s] if s >= 0 else ~dst.exprs.import_expr(src.exprs, ~s, memo) for s in a])
        dst.define(remap[i], new_alts)
    return remap[root_id]


# ---------------------------------------------------------------------------------------------- schema grammars
def schema_grammar(schema, *, strict: bool = False, whitespace: str = "flexible") -> Grammar:
    """The JSON grammar of ``schema`` (via :mod:`grammask.grammar.json_schema`)."""
    from .json_schema import json_schema_grammar, normalize_schema_input

    return json_schema_grammar(normalize_schema_input(schema), whitespace=whitespace, strict=strict)


# ---------------------------------------------------------------------------------------------- the grammar
def _trigger_free(ex: ExprSet, triggers: tuple[str, ...]) -> tuple[int, int]:
    """(``FREE``, ``¬(.*T.+)``): UTF-8 text containing no trigger; strings with a trigger
    occurrence that is not a suffix, negated."""
    from .regex import any_utf8_string

    anyb = ex.star(ex.any_byte())
    t = ex.alt(*[ex.literal(x) for x in triggers])
    contains = ex.concat(anyb, t, anyb)
    free = ex.intersect(any_utf8_string(ex), ex.complement(contains))
    not_inner = ex.complement(ex.concat(anyb, t, ex.plus(ex.any_byte())))
    return free, not_inner


def structural_tag_grammar(spec: TagSpec, *, strict: bool = False, whitespace: str = "flexible") -> Grammar:
    g = Grammar()
    ex = g.exprs
    ws = ex.repeat(ex.byteset(sum(1 << b for b in b" \t\n\r")), 0, END_WHITESPACE)
    bodies = [import_grammar(g, schema_grammar(s.schema, strict=strict, whitespace=whitespace), f"s{j}")
              for j, s in enumerate(spec.structures)]

    def tag_rest(j: int, trigger: str) -> list[int]:
        s = spec.structures[j]
        tail = s.begin[len(trigger):]
        seq = [g.lit(tail)] if tail else []
        seq.append(bodies[j])
        if s.end:
            seq.append(~ex.concat(ws, ex.literal(s.end)))
        return seq

    root = g.nonterminal("root")
    if spec.mode == "auto":
        free, not_inner = _trigger_free(ex, spec.triggers)
        alts: list[list[int]] = [[~free]]
        for i, t in enumerate(spec.triggers):
            trig = ex.intersect(ex.concat(free, ex.literal(t)), not_inner)
            rest = g.nonterminal(f"rest{i}")
            g.define(rest, [tag_rest(j, t) for j, s in enumerate(spec.structures) if s.begin.startswith(t)])
            alts.append([~trig, rest, root])
        g.define(root, alts)
    elif spec.mode == "required":
        first = g.nonterminal("tag")
        later = g.nonterminal("tag_ws")
        fa, la = [], []
        for t in spec.triggers:
            for j, s in enumerate(spec.structures):
                if s.begin.startswith(t):
                    fa.append([g.lit(t)] + tag_rest(j, t))
                    la.append([~ex.concat(ws, ex.literal(t))] + tag_rest(j, t))
        g.define(first, fa)
        g.define(later, la)
        if spec.allow_multiple:
            more = g.nonterminal("more")
            g.define(more, [[], [more, later]])
            g.define(root, [[first, more]])
        else:
            g.define(root, [[first]])
    else:
        raise ValueError(f"unknown structural tag mode {spec.mode!r}")
    g.root = root
    return g
