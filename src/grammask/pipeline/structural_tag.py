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
optional whitespace. Tools (``tools=[...]``) become tags ``<tool_call>\\n{"name": "f", "arguments": ``
BODY ``}\\n</tool_call>`` (Hermes/Qwen style) and are parsed back into OpenAI ``tool_calls``.
"""
from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass

from ..errors import UnsupportedSchemaError
from ..grammar.cfg import Grammar
from ..grammar.regexset import AND, BYTES, CONCAT, EMPTY, EPS, NOT, OR, REPEAT, ExprSet

END_WHITESPACE = 8
TOOL_TRIGGER = "<tool_call>"


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
def import_expr(dst: ExprSet, src: ExprSet, e: int, memo: dict[int, int]) -> int:
    """Rebuild expression ``e`` of ``src`` in ``dst`` (iteratively: literals can be long)."""
    if e in memo:
        return memo[e]
    stack = [(e, False)]
    while stack:
        x, ready = stack.pop()
        if x in memo:
            continue
        k = src.kind[x]
        args = src.args[x]
        if k == EMPTY:
            memo[x] = EMPTY
            continue
        if k == EPS:
            memo[x] = EPS
            continue
        if k == BYTES:
            memo[x] = dst.byteset(args[0])
            continue
        kids = (args[0],) if k in (NOT, REPEAT) else tuple(args)
        if not ready:
            stack.append((x, True))
            stack.extend((c, False) for c in kids if c not in memo)
            continue
        if k == CONCAT:
            memo[x] = dst.concat(memo[args[0]], memo[args[1]])
        elif k == OR:
            memo[x] = dst.alt(*[memo[c] for c in args])
        elif k == AND:
            memo[x] = dst.intersect(*[memo[c] for c in args])
        elif k == NOT:
            memo[x] = dst.complement(memo[args[0]])
        else:  # REPEAT
            memo[x] = dst.repeat(memo[args[0]], args[1], args[2])
    return memo[e]


def import_grammar(dst: Grammar, src: Grammar, prefix: str, root: str | int | None = None) -> int:
    """Copy every rule of ``src`` into ``dst`` (names prefixed); return the copied root's id."""
    if root is None:
        root = src.root if src.root is not None else src.index["root"]
    root_id = src.index[root] if isinstance(root, str) else root
    memo: dict[int, int] = {}
    remap = {i: dst.nonterminal(f"{prefix}:{name}") for i, name in enumerate(src.names)}
    for i, alts in enumerate(src.rules):
        if alts is None:
            continue
        new_alts = []
        for a in alts:
            new_alts.append([remap[s] if s >= 0 else ~import_expr(dst.exprs, src.exprs, ~s, memo) for s in a])
        dst.define(remap[i], new_alts)
    return remap[root_id]


# ---------------------------------------------------------------------------------------------- schema grammars
def schema_grammar(schema, *, strict: bool = False, whitespace: str = "flexible") -> Grammar:
    """The JSON grammar of ``schema`` (via :mod:`grammask.grammar.json_schema`); without that
    module only the trivial schemas (``{}``, ``true``, ``{"type": "object"}``) are supported."""
    try:
        from ..grammar.json_schema import json_schema_grammar, normalize_schema_input
    except ImportError:
        from ..grammar.builtin import json_grammar

        if schema is True or schema == {}:
            return json_grammar(whitespace=whitespace)
        if schema == {"type": "object"}:
            return json_grammar(whitespace=whitespace, object_only=True)
        raise UnsupportedSchemaError("JSON Schema support (grammask.grammar.json_schema) is not available",
                                     keyword=None) from None
    return json_schema_grammar(normalize_schema_input(schema), whitespace=whitespace, strict=strict)


# ---------------------------------------------------------------------------------------------- the grammar
def _trigger_free(ex: ExprSet, triggers: tuple[str, ...]) -> tuple[int, int]:
    """(``FREE``, ``¬(.*T.+)``): UTF-8 text containing no trigger; strings with a trigger
    occurrence that is not a suffix, negated."""
    from ..grammar.regex import any_utf8_string

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


# ---------------------------------------------------------------------------------------------- tools
def tool_begin(name: str) -> str:
    return TOOL_TRIGGER + '\n{"name": ' + json.dumps(name) + ', "arguments": '


TOOL_END = "}\n</tool_call>"


def tools_tag_spec(tools, tool_choice, parallel_tool_calls: bool | None = None) -> TagSpec:
    """The tag spec of OpenAI ``tools`` (pydantic :class:`~.protocol.Tool` list) and ``tool_choice``."""
    from .protocol import NamedToolChoice

    fns = [t.function for t in tools]
    if isinstance(tool_choice, NamedToolChoice):
        fns = [f for f in fns if f.name == tool_choice.function.name]
        mode, multiple = "required", False
    elif tool_choice == "required":
        mode, multiple = "required", parallel_tool_calls is not False
    else:
        mode, multiple = "auto", True
    structures = tuple(TagStructure(tool_begin(f.name), f.parameters, TOOL_END) for f in fns)
    return TagSpec(structures, (TOOL_TRIGGER,), mode, multiple)


def tools_system_prompt(tools) -> str:
    """Instructions listing the tools, in the format the tags above enforce."""
    lines = ["You can call functions. Available functions (JSON):"]
    for t in tools:
        f = t.function
        lines.append(json.dumps({"name": f.name, "description": f.description or "", "parameters": f.parameters},
                                ensure_ascii=False))
    lines.append('To call a function, answer with <tool_call>\n{"name": <function name>, "arguments": '
                 "<arguments object>}\n</tool_call>")
    return "\n".join(lines)


def parse_tool_calls(text: str, spec: TagSpec) -> tuple[str, list[dict]]:
    """Split generated ``text`` into (text outside the tags, tags): each tag as
    ``{"name", "arguments", "begin"}`` (``name`` for tool tags). A tag cut short (``max_tokens``)
    is dropped from the text when complete tags precede it, else left in the text."""
    calls: list[dict] = []
    outside: list[str] = []
    pos = 0
    dec = json.JSONDecoder()
    triggers = sorted(set(spec.triggers), key=len, reverse=True)
    pattern = re.compile("|".join(re.escape(t) for t in triggers))
    partial = False
    while True:
        m = pattern.search(text, pos)
        if m is None:
            break
        begins = [x for x in spec.structures if text.startswith(x.begin, m.start())]
        if not begins:
            partial = True
            break
        s = max(begins, key=lambda x: len(x.begin))
        i = m.start() + len(s.begin)
        while i < len(text) and text[i] in " \t\n\r":
            i += 1
        try:
            body, j = dec.raw_decode(text, i)
        except ValueError:
            partial = True
            break
        k = j
        while k < len(text) and text[k] in " \t\n\r":
            k += 1
        if not text.startswith(s.end, k):
            partial = True
            break
        outside.append(text[pos:m.start()])
        name = None
        if s.begin.startswith(TOOL_TRIGGER) and '"name": ' in s.begin:
            name = json.loads(s.begin[len(TOOL_TRIGGER):] + "null}")["name"]
        calls.append({"name": name, "arguments": body, "begin": s.begin})
        pos = k + len(s.end)
    if partial and calls:
        outside.append(text[pos:m.start()])
    else:
        outside.append(text[pos:])
    return "".join(outside), calls


def new_tool_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]
