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
