"""The compile memory bound (issue 17): GrammarMemoryError, GrammarCompiler(max_compile_memory_bytes),
and the Earley parse stack's mask-time bound.

Adversarial inputs whose single constructs are each within their front end's count bounds but
whose products are not (many bounded repetitions of rule references, many unrolled arrays, a huge
enum, a huge alternation) raise GrammarMemoryError during the compile, before holding what they
ask for; ordinary grammars estimate far below the default bound.
"""
from __future__ import annotations

import pickle

import pytest

from grammask import GrammarCompiler, GrammarMatcher, TokenizerInfo, errors
from grammask.errors import GrammarMemoryError, GrammarTooComplexError
from grammask.grammar import earley
from grammask.grammar.membound import DEFAULT_MAX_COMPILE_MEMORY_BYTES, compile_memory_bound

PARTS = {"regex nodes", "regex derivatives", "grammar rules", "lowered rules", "Earley tables", "lexer tables"}


@pytest.fixture(scope="module")
def info():
    toks = [b""] + [bytes([b]) for b in range(256)] + [b"ab", b"abc", b'{"', b'":']
    return TokenizerInfo(toks, stop_token_ids=[0])


@pytest.fixture(scope="module")
def comp(info):
    return GrammarCompiler(info)


def _check(e: GrammarMemoryError, limit: int) -> None:
    assert isinstance(e, GrammarTooComplexError)
    assert e.what in PARTS, e.what
    assert e.limit_bytes == limit and e.used_bytes > limit
    assert "max_compile_memory_bytes" in str(e) and e.what in str(e)


def test_memory_error_type():
    assert "GrammarMemoryError" in errors.__all__
    assert issubclass(GrammarMemoryError, GrammarTooComplexError)
    e = GrammarMemoryError("over", what="regex nodes", used_bytes=10, limit_bytes=5)
    e2 = pickle.loads(pickle.dumps(e))
    assert (type(e2), str(e2), e2.what, e2.used_bytes, e2.limit_bytes) == (GrammarMemoryError, "over", "regex nodes", 10, 5)


# ------------------------------------------------------------------------------------ at the default bound
def test_default_bound_many_rule_repetitions(comp):
    """50 rules of ``(x "i"){0,10000}``: each within MAX_EXPANSION, 500,000 rules in all (this
    compile held ~600 MiB before it gave up on time)."""
    rules = ["root ::= " + " ".join(f"r{i}" for i in range(50))]
    rules += [f'r{i} ::= (x "{i}"){{0,10000}}' for i in range(50)]
    rules.append('x ::= "a" x | "b"')
    with pytest.raises(GrammarMemoryError) as ei:
        comp.compile_grammar("\n".join(rules))
    _check(ei.value, DEFAULT_MAX_COMPILE_MEMORY_BYTES)


def test_default_bound_many_unrolled_arrays(comp):
    """60 required properties of arrays with ``minItems == maxItems == 9000``: each within
    MAX_UNROLL, 540,000 rules in all (compiled before, holding ~600 MiB)."""
    schema = {"type": "object",
              "properties": {f"p{i}": {"type": "array", "items": {"type": "string"}, "minItems": 9000,
                                       "maxItems": 9000} for i in range(60)},
              "required": [f"p{i}" for i in range(60)]}
    with pytest.raises(GrammarMemoryError) as ei:
        comp.compile_json_schema(schema)
    _check(ei.value, DEFAULT_MAX_COMPILE_MEMORY_BYTES)
    # the compiler is fine afterwards
    m = GrammarMatcher(comp.compile_json_schema({"type": "array", "items": {"type": "string"}, "maxItems": 3}))
    assert m.accept_string('["a","b"]') and m.can_terminate()


# ------------------------------------------------------------------------------------ small bounds: each part
def test_huge_enum_regex_nodes(info):
    comp = GrammarCompiler(info, max_compile_memory_bytes=4 << 20)
    with pytest.raises(GrammarMemoryError) as ei:
        comp.compile_json_schema({"enum": [f"x{i:06d}" for i in range(20000)]})
    _check(ei.value, 4 << 20)
    assert ei.value.what.startswith("regex")


def test_huge_alternation_regex(info):
    comp = GrammarCompiler(info, max_compile_memory_bytes=1 << 20)
    with pytest.raises(GrammarMemoryError) as ei:
        comp.compile_regex("|".join(f"w{i:05d}z" for i in range(5000)))
    _check(ei.value, 1 << 20)


def test_counted_repetitions_are_lazy_or_bounded(info):
    """A regex's counted repetition is one node (its DFA is built lazily while masking): the
    compile's estimate does not grow with the count, and a count past MAX_REPEAT is refused."""
    comp = GrammarCompiler(info, max_compile_memory_bytes=1 << 20)
    estimates = []
    for n in (10, 100_000):
        with compile_memory_bound(None) as mem:
            cg = comp.compile_regex(f"(a|b){{0,{n}}}")
        estimates.append(mem.total)
        m = GrammarMatcher(cg)
        assert m.accept_string("abba" * 2) and m.can_terminate()
    assert estimates[1] < 2 * estimates[0] + (64 << 10)
    with pytest.raises(GrammarTooComplexError):
        comp.compile_regex("(a|b){0,200000}")


def test_ebnf_repetition_expansion(info):
    """A repetition of a rule reference is expanded into rules (one per copy): bounded by memory
    before MAX_EXPANSION."""
    comp = GrammarCompiler(info, max_compile_memory_bytes=1 << 20)
    with pytest.raises(GrammarMemoryError) as ei:
        comp.compile_grammar('root ::= (x ","){0,9000}\nx ::= "a" x | "b"')
    _check(ei.value, 1 << 20)
    assert ei.value.what in ("grammar rules", "lowered rules")
    m = GrammarMatcher(comp.compile_grammar('root ::= (x ","){0,90}\nx ::= "a" x | "b"'))
    assert m.accept_string("ab,b,") and m.can_terminate()


def test_combinatorial_schema(info):
    """allOf of two anyOf of 20 objects: 400 intersected objects of 12 enum properties (within
    MAX_UNION; the grammar grows with the product)."""
    def objects(c):
        return [{"type": "object", "required": [f"{c}{i}_{j}" for j in range(6)],
                 "properties": {f"{c}{i}_{j}": {"enum": [f"{c}{i}{j}v{t}" for t in range(5)]} for j in range(6)}}
                for i in range(20)]

    comp = GrammarCompiler(info, max_compile_memory_bytes=4 << 20)
    with pytest.raises(GrammarMemoryError) as ei:
        comp.compile_json_schema({"allOf": [{"anyOf": objects("a")}, {"anyOf": objects("b")}]})
    _check(ei.value, 4 << 20)
    GrammarCompiler(info).compile_json_schema({"allOf": [{"anyOf": objects("a")[:3]}, {"anyOf": objects("b")[:3]}]})


def test_nested_compiles_and_memory_error(info):
    """get_or_compile's build is bounded too (its compiles count against it), and a MemoryError
    while compiling is a GrammarMemoryError; neither is cached."""
    comp = GrammarCompiler(info, max_compile_memory_bytes=1 << 20)
    words = "|".join(f"w{i:05d}" for i in range(3000))

    def two():
        comp.compile_regex(words[: len(words) // 2])
        return comp.compile_regex(words[len(words) // 2:])

    with pytest.raises(GrammarMemoryError):
        comp.get_or_compile(("two",), two)

    def oom():
        raise MemoryError

    for _ in range(2):
        with pytest.raises(GrammarMemoryError, match="MemoryError"):
            comp.get_or_compile(("oom",), oom)
    cg, hit = comp.get_or_compile(("ok",), lambda: comp.compile_regex("[0-9]+"))
    assert not hit and GrammarMatcher(cg).accept_string("42")


# ------------------------------------------------------------------------------------ ordinary grammars
def test_ordinary_grammars_estimate_far_below_the_default(info):
    comp = GrammarCompiler(info)
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 40},
                                               "tags": {"type": "array", "items": {"enum": ["a", "b"]}},
                                               "age": {"type": "integer", "minimum": 0}},
              "required": ["name"]}
    cases = [
        lambda: comp.compile_builtin_json_grammar(),
        lambda: comp.compile_json_schema(schema),
        lambda: comp.compile_grammar('root ::= item ("," item)*\nitem ::= [a-z]+ | "(" root ")"'),
        lambda: comp.compile_regex(r"\d{3}-\d{4}"),
    ]
    for make in cases:
        comp.clear_cache()
        with compile_memory_bound(None) as mem:
            make()
        assert set(mem.parts) <= PARTS and mem.parts["Earley tables"] > 0 and mem.parts["lexer tables"] > 0
        assert 0 < mem.total < DEFAULT_MAX_COMPILE_MEMORY_BYTES // 64, mem.parts


def test_estimate_is_charged_once_per_compile(info):
    """A cached grammar costs nothing; a compile charges its own additions to the shared ExprSet."""
    comp = GrammarCompiler(info)
    with compile_memory_bound(None) as first:
        comp.compile_json_schema({"type": "object", "properties": {"a": {"type": "string"}}})
    with compile_memory_bound(None) as again:
        comp.compile_json_schema({"type": "object", "properties": {"a": {"type": "string"}}})
    assert first.total > 0 and again.total == 0


# ------------------------------------------------------------------------------------ mask time: the parse stack
def test_parse_stack_bound_on_an_ambiguous_grammar(comp, monkeypatch):
    """``S ::= S S | "a"`` holds O(n) items per row: the parse stack's bound (a last resort at
    mask time) raises GrammarMemoryError instead of growing without end."""
    cg = comp.compile_grammar('root ::= root root | "a"')
    m = GrammarMatcher(cg)
    for _ in range(40):
        assert m.accept_string("a")
    monkeypatch.setattr(earley, "MAX_PARSE_STACK_BYTES", 1 << 18)
    with pytest.raises(GrammarMemoryError) as ei:
        for _ in range(2000):
            assert m.accept_string("a")
    e = ei.value
    assert e.what.startswith("Earley") and e.limit_bytes == 1 << 18 and e.used_bytes > 1 << 18
    assert "Earley parse stack" in str(e)
