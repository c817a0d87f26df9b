"""The memos shared by the JSON Schema compiles of one ExprSet (number and string tokens,
``pattern``/``format`` expressions, re-nested concatenations): bounded, and a compile builds the same grammar with them, without
them, and with them starting over at any point."""
from __future__ import annotations

import pytest

import grammask.grammar.json_schema.generate as generate
import grammask.grammar.json_schema.state as state
import grammask.grammar.json_schema.to_ir as to_ir
from grammask.grammar.cfg import lower
from grammask.grammar.json_schema import json_schema_grammar
from grammask.grammar.regexset import ExprSet

SCHEMAS = [
    {"type": "object", "properties": {"id": {"type": "integer", "minimum": 0}, "name": {"type": "string"},
                                      "tags": {"type": "array", "items": {"enum": ["a", "b/c", "d\"e"]}}},
     "required": ["id"]},
    {"type": "object", "properties": {"id": {"type": "integer", "minimum": 0}, "score": {"type": "number", "maximum": 5},
                                      "name": {"type": "string", "maxLength": 8}}},
    {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 100, "multipleOf": 5}},
    {"anyOf": [{"type": "string", "enum": ["x", "y"]}, {"type": "number", "exclusiveMinimum": 1.5}]},
    {"type": "object", "properties": {"ключ": {"const": "значение"}, "a/b": {"type": "boolean"}},
     "additionalProperties": {"type": "integer", "minimum": 0}},
    {"type": "object", "properties": {"id": {"type": "integer", "minimum": 0}, "name": {"type": "string"}}},
    {"type": "object", "properties": {"when": {"type": "string", "format": "date"},
                                      "code": {"type": "string", "pattern": "^[A-Z]{2}[0-9]+$"}},
     "patternProperties": {"^x-": {"type": "string", "format": "email"}}},
]


def _compile_all() -> tuple[list, ExprSet]:
    ex = ExprSet()
    out = []
    for s in SCHEMAS * 2:
        g = json_schema_grammar(s, exprs=ex)
        f = lower(g, "root", check_lexemes=False)
        out.append((g.describe(), f.sym.tolist(), f.end_lhs.tolist(), f.lexemes, f.nt_nullable.tolist()))
    return out, ex


def _forgetful(memo, key, value) -> None:
    memo.clear()


@pytest.mark.parametrize("cap", [1, 2, 4096])
def test_shared_token_memos_are_bounded_and_change_no_grammar(cap, monkeypatch):
    monkeypatch.setattr(generate, "remember", _forgetful)
    monkeypatch.setattr(to_ir, "remember", _forgetful)
    want, ex0 = _compile_all()
    monkeypatch.undo()
    monkeypatch.setattr(state, "MAX_SHARED_TOKENS", cap)
    got, ex = _compile_all()
    assert got == want
    assert ex.args == ex0.args   # the same expressions, made in the same order
    shared = ex.__dict__["_json_schema_shared"]
    for name in ("number_tokens", "string_tokens", "regexes"):
        assert 0 < len(shared[name]) <= cap


def test_shared_token_memos_are_hit_by_later_schemas():
    ex = ExprSet()
    json_schema_grammar(SCHEMAS[0], exprs=ex)
    shared = ex.__dict__["_json_schema_shared"]
    n_num, n_str = len(shared["number_tokens"]), len(shared["string_tokens"])
    json_schema_grammar(SCHEMAS[5], exprs=ex)   # the same integer and string constraints
    assert (len(shared["number_tokens"]), len(shared["string_tokens"])) == (n_num, n_str)


@pytest.mark.parametrize("cap", [0, 1, 3])
def test_expression_call_memos_are_bounded_and_change_no_expression(cap, monkeypatch):
    """ExprSet's Python memos of literal(), concat() and the list constructors answer what the
    compiled store answers: with them cleared at every entry (cap 0) or tiny, the compiles make
    the same grammars and the same expressions in the same order, and the memos stay bounded."""
    import grammask.grammar.regexset as regexset

    want, ex0 = _compile_all()
    monkeypatch.setattr(regexset, "MAX_CALL_MEMO", cap)
    monkeypatch.setattr(regexset, "MAX_LIST_MEMO", cap)
    got, ex = _compile_all()
    assert got == want
    assert ex.args == ex0.args
    for memo in (ex._literals, ex._concats, ex._lists):
        assert len(memo) <= max(cap, 1)
    assert ex0._literals and ex0._concats and ex0._lists


def test_a_reference_is_the_rule_of_its_target():
    """A ``$ref`` adds no rule of its own: referring to a definition from two places makes the
    grammar of writing it once, and a recursive reference still derives the nesting."""
    item = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}}}
    inline = {"type": "object", "properties": {"x": item}}
    by_ref = {"type": "object", "properties": {"x": {"$ref": "#/definitions/item"}, "y": {"$ref": "#/definitions/item"}},
              "definitions": {"item": item}}
    once = {"type": "object", "properties": {"x": item, "y": item}}
    ex = ExprSet()

    def n_rules(schema):
        return len(lower(json_schema_grammar(schema, exprs=ex), "root", check_lexemes=False).nt_prod_lo)

    # x and y share the rule of item, as when the same schema object is written twice
    assert n_rules(by_ref) == n_rules(once)
    assert n_rules(by_ref) == n_rules({"type": "object", "properties": {"x": item, "y": {"$ref": "#/properties/x"}}})
    assert n_rules(inline) < n_rules(by_ref)

    from grammask import GrammarCompiler, GrammarMatcher, TokenizerInfo

    tree = {"$ref": "#/definitions/node", "definitions": {"node": {
        "type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#/definitions/node"}}},
        "additionalProperties": False}}}
    info = TokenizerInfo.from_vocab([bytes([i]) for i in range(256)] + [b"<eos>"], stop_token_ids=[256])
    cg = GrammarCompiler(info).compile_json_schema(tree)
    for doc, ok in (('{"kids": [{"kids": []}, {"kids": [{}]}]}', True), ('{"kids": [{"kid": []}]}', False)):
        m = GrammarMatcher(cg)
        assert (m.accept_string(doc) and m.can_terminate()) == ok, doc


@pytest.mark.parametrize("base", [None, "https://example.com/s/root.json", "https://example.com/s/a.json#frag",
                                  "urn:example:thing", "file:///tmp/x.json?q=1"])
def test_reference_urls_are_urljoin_and_urldefrag(base):
    """The registry's own reading of ``$ref`` URLs (a fast path for fragments of the root
    document, a memo per document otherwise) gives what ``urljoin`` and ``urldefrag`` give."""
    from urllib.parse import urldefrag, urljoin

    from grammask.grammar.json_schema.refs import RefRegistry

    reg = RefRegistry({"$defs": {"a": {"type": "integer"}}}, 2020)
    base = reg.base0 if base is None else base
    for ref in ["#/$defs/a", "#a", "#/a#b", "#%2Fx", "#/d/a%20b", "#/~1x", "#", "", "other.json",
                "other.json#/x", "../up.json#anchor", "https://elsewhere.org/x.json#/y", "#/$defs/a"]:
        full = urljoin(base, ref)
        url, frag = urldefrag(full)
        assert reg._ref_url(base, ref) == (full, url, frag), ref
    assert reg._defrag(base) == tuple(urldefrag(base))
    other = RefRegistry({}, 2020)
    assert (base, "other.json") in reg._urls and (base, "other.json") not in other._urls, \
        "a memo shared by documents (it lived as long as the process)"
