"""The MaskBench harness's key-order diagnosis (``benchmarks/maskbench.py:reorder_keys``).

It must find a permutation of an instance's object keys that the engine accepts when only the
order is wrong (also when it has to backtrack into a nested object's spelling), and find none
when a value is wrong, so "order only" in the benchmark never hides a content rejection.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from common import Llama3  # noqa: E402
from maskbench import GrammaskEngine, reorder_keys, run_schema, schema_key_order  # noqa: E402


@pytest.fixture(scope="module")
def engine():
    return GrammaskEngine(Llama3().path)


def _accepted(engine, compiled, text: str) -> bool:
    m = engine.matcher(compiled)
    return all(engine.accept(m, t) for t in engine.encode(text)) and engine.can_stop(m)


SCHEMA = {
    "type": "object",
    "properties": {
        "id": {"type": "integer"},
        "tag": {"type": "string"},
        "size": {"type": "integer", "minimum": 0},
        "meta": {"type": "object", "properties": {"x": {"type": "boolean"}, "y": {"enum": ["a", "b"]}},
                 "required": ["y"], "additionalProperties": False},
    },
    "required": ["id", "size"],
    "additionalProperties": False,
}


def test_permutes_keys_at_every_level(engine):
    compiled = engine.compile(SCHEMA)
    data = {"meta": {"y": "b", "x": True}, "size": 3, "id": 7}
    assert not _accepted(engine, compiled, json.dumps(data))
    text = reorder_keys(engine, compiled, data)
    assert text == '{"id": 7, "size": 3, "meta": {"x": true, "y": "b"}}'
    assert json.loads(text) == data and _accepted(engine, compiled, text)


@pytest.mark.parametrize("data", [
    {"size": -1, "id": 7},                      # minimum violated
    {"meta": {"y": "c"}, "size": 3, "id": 7},   # enum violated, nested
    {"size": 3, "tag": "t"},                    # required "id" missing
    {"size": 3, "id": 7, "other": 1},           # additional property
])
def test_finds_no_order_for_invalid_content(engine, data):
    compiled = engine.compile(SCHEMA)
    assert reorder_keys(engine, compiled, data) is None


def test_backtracks_into_a_nested_spelling(engine):
    # Both branches admit the inner object; only branch 2 lets "k" follow it, and only with the
    # inner keys in branch 2's order, so the first inner spelling found must be revisited.
    schema = {"anyOf": [
        {"type": "object", "properties": {"o": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "additionalProperties": False}}, "additionalProperties": False},
        {"type": "object", "properties": {"o": {"type": "object", "properties": {"b": {"type": "integer"}, "a": {"type": "integer"}}, "additionalProperties": False}, "k": {"type": "integer"}}, "required": ["k"], "additionalProperties": False},
    ]}
    compiled = engine.compile(schema)
    data = {"k": 1, "o": {"a": 1, "b": 2}}
    text = reorder_keys(engine, compiled, data)
    assert text == '{"o": {"b": 2, "a": 1}, "k": 1}'
    assert _accepted(engine, compiled, text)


def test_run_schema_counts_order_only_rejections(engine):
    tok = Llama3()
    tests = [(True, d, d) for d in ({"id": 1, "size": 2}, {"size": 2, "id": 1}, {"size": -2, "id": 1})]
    tests = [(v, tok.encode(json.dumps(d)), d) for v, _, d in tests]
    res = run_schema(engine, SCHEMA, tests, order_s=30.0)
    assert [a for _, a in res["tests"]] == [True, False, False]
    assert res["order_only"] == 1


def test_the_schema_order_is_tried_first_and_checked(engine):
    """Given the schema, one check of the keys in declared order (through $ref and allOf) finds
    what the search needs many checks for; a guess the engine rejects is not an answer."""
    schema = {"$defs": {"meta": {"type": "object", "properties": {"x": {"type": "boolean"}, "y": {"enum": ["a", "b"]}}}},
              "allOf": [{"properties": {"id": {"type": "integer"}}},
                        {"properties": {"size": {"type": "integer", "minimum": 0}, "meta": {"$ref": "#/$defs/meta"}}}],
              "required": ["id", "size"]}
    compiled = engine.compile(schema)
    data = {"meta": {"y": "b", "x": True}, "size": 3, "id": 7}
    assert reorder_keys(engine, compiled, data, max_checks=1) is None   # the search alone: no budget
    text = reorder_keys(engine, compiled, data, max_checks=1, schema=schema)
    assert text == '{"id": 7, "size": 3, "meta": {"x": true, "y": "b"}}' and _accepted(engine, compiled, text)
    bad = {"meta": {"y": "c", "x": True}, "size": 3, "id": 7}
    assert reorder_keys(engine, compiled, bad, schema=schema) is None


def test_the_schema_order_follows_the_branch_the_data_takes(engine):
    """Of an anyOf the branch declaring the object's keys, of an if/then/else the branch its
    const selects: the key order of nested objects comes from the right declaration."""
    schema = {"type": "object", "properties": {"kind": {"enum": ["a", "b"]}, "body": {"type": "object"}},
              "allOf": [{"if": {"properties": {"kind": {"const": "a"}}},
                         "then": {"properties": {"body": {"properties": {"p": {"type": "integer"}, "q": {"type": "integer"}}}}},
                         "else": {"properties": {"body": {"properties": {"q": {"type": "integer"}, "p": {"type": "integer"}}}}}}],
              "anyOf": [{"properties": {"x": {"type": "integer"}, "y": {"type": "integer"}}},
                        {"properties": {"z": {"type": "integer"}, "w": {"type": "integer"}}}]}
    compiled = engine.compile(schema)
    for data, want in (({"body": {"q": 1, "p": 2}, "kind": "a"}, '{"kind": "a", "body": {"p": 2, "q": 1}}'),
                       ({"body": {"p": 2, "q": 1}, "kind": "b"}, '{"kind": "b", "body": {"q": 1, "p": 2}}'),
                       ({"w": 1, "z": 2, "kind": "a"}, '{"kind": "a", "z": 2, "w": 1}')):
        assert json.dumps(schema_key_order(schema, schema, data)) == want
        text = reorder_keys(engine, compiled, data, max_checks=1, schema=schema)
        assert text == want and _accepted(engine, compiled, text), data


def test_the_search_leaves_no_reference_cycle(engine):
    """Its recursive generators must not keep the grammar in a cycle: one freed only by a full
    collection made the worker pay for it inside a later schema's timed masks."""
    import gc
    import weakref

    compiled = engine.compile(SCHEMA)
    gone = weakref.ref(compiled)
    gc.collect()
    gc.disable()
    try:
        assert reorder_keys(engine, compiled, {"meta": {"y": "b", "x": True}, "size": 3, "id": 7}) is not None
        assert reorder_keys(engine, compiled, {"size": -1, "id": 7}) is None
        del compiled
        assert gone() is None, "the grammar outlived the search: held by a reference cycle"
        assert gc.collect() == 0
    finally:
        gc.enable()
