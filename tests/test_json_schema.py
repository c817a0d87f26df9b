"""JSON Schema compilation (grammask.grammar.json_schema) end to end, against ``jsonschema``.

Every instance is checked three ways (``json.dumps`` default separators, compact separators and
``indent=2``): the engine must accept it exactly when ``jsonschema`` (with its format checker)
says it is valid. The few valid documents the compiler rejects by design (property order, integer
spellings like ``1.0``) are tested separately and named as such. Random walks over the allowed
bytes must only produce valid documents, and for a few schemas the engine's masks are compared
with the byte-level reference recognizer (greedy-safety of the lexemes).
"""
from __future__ import annotations

import json
import random
import re
import warnings
from fractions import Fraction

import jsonschema
import pytest

from grammask.errors import (
    EmptyLanguageError,
    GrammarTooComplexError,
    InvalidSchemaError,
    UnsupportedSchemaError,
)
from grammask.grammar.compiled import CompiledGrammar
from grammask.grammar.compiler import GrammarCompiler
from grammask.grammar.json_schema import json_schema_grammar, normalize_schema_input
from grammask.grammar.json_schema.formats import format_expr
from grammask.grammar.json_schema.numeric import number_regex
from grammask.grammar.matcher import GrammarMatcher
from grammask.grammar.regexset import ExprSet
from grammask.grammar.tokenizer_info import TokenizerInfo

STOP = 256
INFO = TokenizerInfo.from_vocab([bytes([i]) for i in range(256)] + [b"<eos>"], stop_token_ids=[STOP])
GC = GrammarCompiler(INFO)


def compile_schema(schema, **kw):
    return GC.compile_json_schema(schema, **kw)


def accepts(cg, text) -> bool:
    m = GrammarMatcher(cg)
    return m.accept_string(text) and m.can_terminate()


def is_valid(schema, x) -> bool:
    cls = jsonschema.validators.validator_for(schema) if isinstance(schema, dict) else jsonschema.Draft202012Validator
    return cls(schema, format_checker=cls.FORMAT_CHECKER).is_valid(x)


def spellings(x, indent=True):
    out = [json.dumps(x), json.dumps(x, separators=(",", ":"))]
    if indent:
        out.append(json.dumps(x, indent=2))
    return out


def check_agreement(schema, instances, **kw):
    cg = compile_schema(schema, **kw)
    for x in instances:
        v = is_valid(schema, x)
        for text in spellings(x, indent=kw.get("whitespace", "flexible") == "flexible"):
            assert accepts(cg, text) == v, (schema, text, "valid" if v else "invalid")
    return cg


def sample(cg, rng, max_steps=400, hint=""):
    """A random walk over allowed bytes until the matcher may stop (None if it did not)."""
    m = GrammarMatcher(cg)
    out = bytearray()
    hint = set(hint)
    for step in range(max_steps):
        mask = m.get_next_token_bitmask()
        allowed = [t for t in range(257) if (int(mask[t // 32]) >> (t % 32)) & 1]
        assert allowed, f"dead end after {bytes(out)!r}"
        if STOP in allowed and (rng.random() < 0.5 or len(allowed) == 1):
            return bytes(out)
        cands = [t for t in allowed if t != STOP]
        late = step > max_steps // 4
        weights = []
        for t in cands:
            c = chr(t)
            if c in '"}]':
                w = 200 if late else 10
            elif c in hint:
                w = 100 if late else 10
            elif c in "{[":
                w = 0.1 if late else 2
            elif c in " \t\n\r":
                w = 0.05
            elif t >= 128 or c == "\\":
                w = 0.1
            else:
                w = 1
            weights.append(w)
        t = rng.choices(cands, weights)[0]
        assert m.accept_token(t)
        out.append(t)
    return None


def check_samples(schema, n=12, seed=0, hint="", **kw):
    cg = compile_schema(schema, **kw)
    rng = random.Random(seed)
    got = 0
    for _ in range(n):
        s = sample(cg, rng, hint=hint)
        if s is None:
            continue
        x = json.loads(s)
        assert is_valid(schema, x), (schema, s)
        got += 1
    assert got > 0
    return got


# ---------------------------------------------------------------------------------------------- cases
# (schema, instances): every valid instance here is one the compiler must accept (keys in
# ``properties`` order, integers without fraction).
CASES = {
    "type_scalars": ({"type": ["string", "null", "boolean"]},
                     ["a", "", None, True, False, 0, 1.5, [], {}]),
    "any": (True, [None, 1, "x", [1, {"a": []}], {"b": {"c": [None]}}]),
    "integer_range": ({"type": "integer", "minimum": -15, "maximum": 120},
                      [-16, -15, -9, 0, 7, 99, 100, 119, 120, 121, 1000, 1.5, "3", -0.5]),
    "integer_exclusive": ({"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 10},
                          [0, 1, 9, 10, -1, 5]),
    "integer_exclusive_draft4": ({"$schema": "http://json-schema.org/draft-04/schema#", "type": "integer",
                                  "minimum": 0, "exclusiveMinimum": True, "maximum": 3, "exclusiveMaximum": True},
                                 [0, 1, 2, 3, -1]),
    "number_fraction_bounds": ({"type": "number", "minimum": 0.5, "maximum": 2.25},
                               [0.49, 0.5, 0.500001, 1, 2, 2.25, 2.2500001, 2.26, -1, 0.05, 5e-1, 1e-7, 2.5e0, 25e-2]),
    "number_exclusive_negative": ({"type": "number", "exclusiveMinimum": -1.5, "exclusiveMaximum": 0},
                                  [-1.5, -1.4999, -1, -0.001, 0, 0.1, -2, -1e-5]),
    "number_unbounded_above": ({"type": "number", "minimum": 100},
                               [99.99, 100, 100.0, 1e300, 12345678901234567890, 1.5e2, 99]),
    "multiple_of_int": ({"type": "integer", "multipleOf": 7},
                        [0, 7, 14, -21, 70007, 8, 15, 22, 100]),
    "multiple_of_bounded": ({"type": "integer", "multipleOf": 15, "minimum": 10, "maximum": 100},
                            [0, 15, 30, 90, 105, 45, 20]),
    "multiple_of_decimal": ({"type": "number", "multipleOf": 0.25},
                            [0, 0.25, 0.5, 1.75, -2.5, 0.1, 0.3, 10, 1.125]),
    "multiple_of_and_range": ({"type": "number", "multipleOf": 0.5, "minimum": -1, "exclusiveMaximum": 2},
                              [-1.5, -1, -0.5, 0, 1.5, 2, 0.75]),
    "string_length": ({"type": "string", "minLength": 2, "maxLength": 4},
                      ["", "a", "ab", "abcd", "abcde", "é", "éé", "日本語", "日本語です", "a\"", "\\\\", "\n\t", "😀😀"]),
    "string_pattern": ({"type": "string", "pattern": "^[a-z]+[0-9]{2}$"},
                       ["ab12", "a12", "12", "ab123", "Ab12", "ab\n12", ""]),  # (Python's "$" matches before a final "\n": not tested)
    "string_pattern_search": ({"type": "string", "pattern": "b+c"}, ["abbcd", "bc", "ac", "", "b\"c"]),
    "string_pattern_and_length": ({"type": "string", "pattern": "^a", "maxLength": 3},
                                  ["a", "abc", "abcd", "ba", "a\"", "aé", "a日本", "a日本語", "a😀"]),
    # non-ASCII characters are accepted raw and as \uXXXX escapes (json.dumps' default)
    "string_pattern_non_ascii": ({"type": "string", "pattern": "^(caf[éè]|[à-ÿ]+|x😀)$"},
                                 ["café", "cafè", "cafe", "éà", "ÿÿÿ", "ā", "x😀", "x😁", ""]),
    "enum_mixed": ({"enum": ["red", "green", 1, None, True, [1, 2], {"a": 1}]},
                   ["red", "green", "blue", 1, 1.0, 2, None, True, False, [1, 2], [2, 1], {"a": 1}, {"a": 2}]),
    "enum_with_type": ({"type": "string", "enum": ["a", 1, "b"]}, ["a", "b", 1, "c"]),
    "const_object": ({"const": {"x": [1, "two", None], "y": {"z": False}}},
                     [{"x": [1, "two", None], "y": {"z": False}}, {"x": [1, "two"], "y": {"z": False}}, {"x": []}]),
    "const_unicode": ({"const": "h\u00e9llo \"q\" \\ \u0001"}, ["h\u00e9llo \"q\" \\ \u0001", "hello"]),
    "object_basic": ({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}},
                      "required": ["a"]},
                     [{"a": 1}, {"a": 1, "b": "x"}, {"b": "x"}, {}, {"a": "1"}, {"a": 1, "c": [1]},
                      {"a": 1, "b": "x", "c": {"d": None}}, {"a": 1, "b": 2}, [], "a"]),
    "object_no_additional": ({"type": "object", "properties": {"a": {"type": "boolean"}, "b": {"type": "null"}},
                              "additionalProperties": False},
                             [{}, {"a": True}, {"b": None}, {"a": False, "b": None}, {"c": 1}, {"a": 1}]),
    "object_additional_schema": ({"type": "object", "properties": {"id": {"type": "integer"}},
                                  "additionalProperties": {"type": "string"}},
                                 [{"id": 1}, {"id": 1, "x": "s"}, {"x": "s", "y": "t"}, {"x": 1}, {"id": "s"},
                                  {"ida": "s"}, {"i": "s"}]),
    "object_declared_key_not_additional": ({"type": "object", "properties": {"a": {"type": "integer"}},
                                            "additionalProperties": True},
                                           [{"a": 1}, {"a": "x"}, {"b": "x"}, {"aa": "x"}, {"b": 1, "a": 2}]),
    "required_undeclared": ({"type": "object", "required": ["k"]}, [{"k": 1}, {}, {"j": 1}, {"k": None, "j": 2}]),
    "pattern_properties": ({"type": "object", "patternProperties": {"^x-": {"type": "integer"}, "y$": {"type": "string"}},
                            "additionalProperties": False},
                           [{}, {"x-a": 1}, {"ay": "s"}, {"x-y": 1}, {"x-a": "s"}, {"b": 1}, {"x-ay": "s"}]),
    "property_names": ({"type": "object", "propertyNames": {"pattern": "^[a-z]+$", "maxLength": 3}},
                       [{}, {"ab": 1}, {"abcd": 1}, {"A": 1}, {"a": 1, "b": [2]}]),
    "min_max_properties": ({"type": "object", "properties": {"a": {}, "b": {}}, "minProperties": 1,
                            "maxProperties": 2},
                           [{}, {"a": 1}, {"a": 1, "b": 2}, {"a": 1, "b": 2, "c": 3}, {"c": 3}, {"c": 1, "d": 2}]),
    "array_items": ({"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 3},
                    [[], [1], [1, 2, 3], [1, 2, 3, 4], ["a"], [1, 2.5]]),
    "array_prefix_items": ({"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}],
                            "items": False},
                           [[], ["a"], ["a", 1], ["a", 1, 2], [1], ["a", "b"]]),
    "array_items_tuple_draft7": ({"$schema": "http://json-schema.org/draft-07/schema#", "type": "array",
                                  "items": [{"type": "string"}, {"type": "integer"}],
                                  "additionalItems": {"type": "boolean"}, "minItems": 2},
                                 [[], ["a"], ["a", 1], ["a", 1, True, False], ["a", 1, 2], [1, "a"]]),
    "array_contains": ({"type": "array", "items": {"type": "integer"}, "contains": {"minimum": 10},
                        "minContains": 2, "maxContains": 3},
                       [[], [10], [10, 11], [1, 10, 2, 11], [10, 11, 12], [10, 11, 12, 13], [1, 2]]),
    "unique_enum_items": ({"type": "array", "items": {"enum": ["a", "b", "c"]}, "uniqueItems": True},
                          [[], ["a"], ["a", "b", "c"], ["a", "a"], ["c", "a"], ["d"]]),
    "nested": ({"type": "object", "properties": {"users": {"type": "array", "items": {
        "type": "object", "properties": {"name": {"type": "string", "minLength": 1}, "age": {"type": "integer", "minimum": 0}},
        "required": ["name"], "additionalProperties": False}}}, "required": ["users"]},
        [{"users": []}, {"users": [{"name": "a"}, {"name": "b", "age": 3}]}, {"users": [{"name": ""}]},
         {"users": [{"age": 3}]}, {"users": [{"name": "a", "age": -1}]}, {}]),
    "anyof": ({"anyOf": [{"type": "string", "maxLength": 2}, {"type": "integer", "minimum": 5}, {"type": "null"}]},
              ["ab", "abc", 5, 4, None, True, 5.5]),
    "oneof_disjoint": ({"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]},
                       ["a", ["a"], [1], 1]),
    "oneof_overlap_types": ({"oneOf": [{"type": "integer"}, {"type": "number", "maximum": 10}]},
                            [1, 5, 11, 2.5, 12.5, "x", 0.5]),
    "oneof_required": ({"type": "object", "properties": {"a": {}, "b": {}}, "oneOf": [{"required": ["a"]},
                                                                                     {"required": ["b"]}]},
                       [{}, {"a": 1}, {"b": 1}, {"a": 1, "b": 2}]),
    "oneof_discriminator": ({"oneOf": [
        {"type": "object", "properties": {"kind": {"const": "circle"}, "r": {"type": "number"}}, "required": ["kind", "r"]},
        {"type": "object", "properties": {"kind": {"const": "square"}, "side": {"type": "number"}}, "required": ["kind", "side"]}]},
        [{"kind": "circle", "r": 1}, {"kind": "square", "side": 2}, {"kind": "circle", "side": 2}, {"kind": "tri"}]),
    "oneof_additional_false": ({"type": "object", "oneOf": [
        {"properties": {"foo": {"type": "string"}}, "additionalProperties": False},
        {"properties": {"bar": {"type": "string"}}, "additionalProperties": False}]},
        [{}, {"foo": "x"}, {"bar": "y"}, {"foo": "x", "bar": "y"}, {"baz": 1}]),
    "allof_merge": ({"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
                               {"properties": {"a": {"minimum": 3}, "b": {"type": "string"}}, "required": ["b"]}]},
                    [{"a": 3, "b": "x"}, {"a": 2, "b": "x"}, {"a": 3}, {"b": "x"}, {"a": 5, "b": "y", "c": 1}]),
    "allof_additional_false": ({"allOf": [{"properties": {"a": {"type": "integer"}}},
                                          {"properties": {"b": {}}, "additionalProperties": False}]},
                               [{"b": 1}, {"a": 1}, {}, {"c": 1}, {"b": 2, "c": 1}]),
    "not_type": ({"not": {"type": ["string", "null"]}}, ["a", None, 1, [], {}, True]),
    "not_enum": ({"type": "string", "not": {"enum": ["a", "b"]}}, ["a", "b", "c", "", "ab"]),
    "not_pattern": ({"type": "string", "not": {"pattern": "^x"}}, ["x", "xa", "ax", "", "y"]),
    "not_const_number": ({"type": "number", "not": {"const": 1}}, [1, 1.0, 2, 0.5, 1.5]),
    "if_then_else": ({"type": "object", "if": {"properties": {"k": {"const": "a"}}, "required": ["k"]},
                      "then": {"required": ["x"]}, "else": {"required": ["y"]}},
                     [{"k": "a", "x": 1}, {"k": "a"}, {"k": "b", "y": 1}, {"k": "b", "x": 1}, {}, {"y": 2}]),
    # conditionals are draft 7's: a draft-04 or draft-06 schema does not have them (MaskBench's
    # Github_medium---o3385 and o39097 are draft-04 schemas with if/then that their valid
    # instances break)
    **{f"if_then_draft{d}": ({"$schema": f"http://json-schema.org/draft-0{d}/schema#", "type": "object",
                              "if": {"properties": {"k": {"const": "a"}}, "required": ["k"]},
                              "then": {"required": ["x"]}},
                             [{"k": "a", "x": 1}, {"k": "a"}, {"k": "b"}, {}])
       for d in (4, 6, 7)},
    "dependent_required": ({"type": "object", "properties": {"a": {}, "b": {}}, "dependentRequired": {"a": ["b"]}},
                           [{}, {"a": 1}, {"a": 1, "b": 2}, {"b": 2}]),
    "dependencies_draft7": ({"$schema": "http://json-schema.org/draft-07/schema#", "type": "object",
                             "properties": {"a": {}, "b": {"type": "integer"}},
                             "dependencies": {"a": {"properties": {"b": {"minimum": 5}}, "required": ["b"]}}},
                            [{}, {"b": 1}, {"a": 1, "b": 5}, {"a": 1, "b": 4}, {"a": 1}]),
    "ref_defs": ({"$defs": {"pos": {"type": "integer", "minimum": 1}}, "type": "array", "items": {"$ref": "#/$defs/pos"}},
                 [[], [1, 2], [0], ["a"]]),
    "ref_definitions_draft4_sibling_ignored": (
        {"$schema": "http://json-schema.org/draft-04/schema#", "definitions": {"s": {"type": "string"}},
         "properties": {"a": {"$ref": "#/definitions/s", "maxLength": 1}}},
        [{"a": "x"}, {"a": "long"}, {"a": 1}]),
    "ref_sibling_applied_2020": ({"$defs": {"s": {"type": "string"}},
                                  "properties": {"a": {"$ref": "#/$defs/s", "maxLength": 1}}},
                                 [{"a": "x"}, {"a": "long"}, {"a": 1}]),
    "ref_recursive_tree": ({"$ref": "#/$defs/node", "$defs": {"node": {
        "type": "object", "properties": {"v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
        "required": ["v"], "additionalProperties": False}}},
        [{"v": 1}, {"v": 1, "kids": [{"v": 2}, {"v": 3, "kids": [{"v": 4}]}]}, {"v": 1, "kids": [{}]}, {"kids": []}]),
    "ref_anchor_and_id": ({"$id": "https://example.com/root.json", "type": "object",
                           "properties": {"a": {"$ref": "item.json"}, "b": {"$ref": "#num"}},
                           "$defs": {"item": {"$id": "item.json", "type": "string"},
                                     "n": {"$anchor": "num", "type": "number"}}},
                          [{"a": "s", "b": 1}, {"a": 1}, {"b": "x"}]),
    "formats": ({"type": "object", "properties": {
        "d": {"type": "string", "format": "date"}, "t": {"type": "string", "format": "date-time"},
        "e": {"type": "string", "format": "email"}, "ip": {"type": "string", "format": "ipv4"},
        "u": {"type": "string", "format": "uuid"}, "v6": {"type": "string", "format": "ipv6"}}},
        [{"d": "2024-02-29"}, {"d": "2023-02-29"}, {"d": "2024-13-01"}, {"t": "2024-01-01T10:20:30Z"},
         {"e": "a.b@example.com"}, {"e": "nope"}, {"ip": "10.0.0.1"}, {"ip": "300.0.0.1"}, {"ip": "01.2.3.4"},
         {"u": "123e4567-e89b-12d3-a456-426614174000"}, {"u": "123"}, {"v6": "fe80::1"}, {"v6": "1::2::3"}]),
    "draft3": ({"$schema": "http://json-schema.org/draft-03/schema#", "type": "object",
                "properties": {"a": {"type": "integer", "required": True, "divisibleBy": 3},
                               "b": {"disallow": ["string", "null"]}}},
               [{"a": 3}, {}, {"a": 4}, {"a": 3, "b": "x"}, {"a": 3, "b": 1}]),
    "dynamic_ref": ({"$defs": {"list": {"$dynamicAnchor": "item", "type": "array",
                                        "items": {"$dynamicRef": "#item"}}},
                     "$ref": "#/$defs/list"}, [[], [[]], [[[], []]], [1], [[1]]]),
    "boolean_subschemas": ({"type": "object", "properties": {"a": True, "b": False}}, [{}, {"a": [1]}, {"b": 1}]),
    "unevaluated_properties": ({"type": "object", "allOf": [{"properties": {"a": {"type": "integer"}}}],
                                "properties": {"b": {"type": "string"}}, "unevaluatedProperties": False},
                               [{}, {"b": "x", "a": 1}, {"b": "x"}, {"a": 1}, {"c": 1}]),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_agrees_with_jsonschema(name):
    schema, instances = CASES[name]
    check_agreement(schema, instances)


@pytest.mark.parametrize("name", ["object_basic", "integer_range", "number_fraction_bounds", "string_length",
                                  "array_contains", "oneof_required", "enum_mixed", "nested"])
def test_compact_whitespace(name):
    schema, instances = CASES[name]
    cg = compile_schema(schema, whitespace="compact")
    for x in instances:
        v = is_valid(schema, x)
        assert accepts(cg, json.dumps(x, separators=(",", ":"))) == v
        if json.dumps(x) != json.dumps(x, separators=(",", ":")):
            assert not accepts(cg, json.dumps(x))


SAMPLED = ["object_basic", "object_no_additional", "object_additional_schema", "integer_range",
           "number_fraction_bounds", "multiple_of_decimal", "string_length", "string_pattern", "enum_mixed",
           "array_prefix_items", "array_contains", "unique_enum_items", "nested", "anyof", "oneof_overlap_types",
           "oneof_required", "oneof_discriminator", "oneof_additional_false", "allof_merge", "not_enum",
           "if_then_else", "dependent_required", "ref_recursive_tree", "pattern_properties", "min_max_properties",
           "formats", "property_names"]


def _names(schema) -> str:
    """Property names and string constants of a schema: the random walk favours their letters."""
    out = []
    if isinstance(schema, dict):
        for k, v in schema.items():
            if k == "properties" and isinstance(v, dict):
                out.extend(v)
            if k == "required":
                out.extend(v)
            if k in ("enum", "const"):
                out.extend(x for x in (v if k == "enum" else [v]) if isinstance(x, str))
            out.append(_names(v))
    elif isinstance(schema, list):
        out.extend(_names(v) for v in schema)
    return "".join(out)


# random walks rarely spell a required key among arbitrary additional ones: these are sampled in
# strict mode (a sublanguage of the schema's, so its documents must still be valid)
SAMPLED_STRICT = {"nested", "oneof_discriminator"}


@pytest.mark.parametrize("name", SAMPLED)
def test_random_walks_are_valid(name):
    schema = CASES[name][0]
    check_samples(schema, n=10, seed=sum(map(ord, name)), hint=_names(schema), strict=name in SAMPLED_STRICT)


# ---------------------------------------------------------------------------------------------- design choices
def test_properties_follow_definition_order():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}
    cg = compile_schema(schema)
    assert accepts(cg, '{"a": 1, "b": 2}')
    assert not accepts(cg, '{"b": 2, "a": 1}')  # valid JSON Schema-wise: rejected by design
    # additional properties may be interleaved anywhere
    assert accepts(cg, '{"x": 0, "a": 1, "y": [], "b": 2, "z": null}')


def test_unordered_properties_option():
    import itertools

    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}, "c": {}},
              "required": ["a", "b"], "maxProperties": 3}
    g = json_schema_grammar(schema, unordered_properties=4)
    cg = CompiledGrammar(g, INFO, check_lexemes=False, kind="json_schema")
    base = {"a": 1, "b": "x", "c": None, "d": 2}
    for k in range(5):
        for keys in itertools.permutations(base, k):
            x = {kk: base[kk] for kk in keys}
            assert accepts(cg, json.dumps(x)) == is_valid(schema, x), x
    assert not accepts(cg, '{"a": 1, "a": 1, "b": "x"}')  # a declared property appears once


def test_allof_property_order_is_first_appearance():
    schema = {"properties": {"own": {}}, "allOf": [{"properties": {"first": {}}}, {"properties": {"second": {}, "own": {}}}]}
    cg = compile_schema(schema)
    assert accepts(cg, '{"own": 1, "first": 2, "second": 3}')
    assert not accepts(cg, '{"first": 2, "own": 1}')


def test_integers_are_plain():
    cg = compile_schema({"type": "integer"})
    for good in ["0", "-7", "123456789012345678901234567890"]:
        assert accepts(cg, good)
    for bad in ["1.0", "1e3", "01", "-", "+1", "--1"]:
        assert not accepts(cg, bad)


def test_declared_key_spellings_cannot_sneak_in_as_additional():
    # "\u0061" is "a": it must not be taken as an additional property with a string value
    cg = compile_schema({"type": "object", "properties": {"a": {"type": "integer"}}})
    assert not accepts(cg, '{"\\u0061": "x"}')
    assert not accepts(cg, '{"\\u0061": 1}')  # spelled keys are not generated (subset), never unsound
    # keys use the spellings json.dumps can produce: raw printable ASCII, \\uXXXX for the rest
    assert accepts(cg, '{"b": "x"}') and accepts(cg, '{"\\u00e9": "x"}') and accepts(cg, '{"\\n": "x"}')
    assert not accepts(cg, '{"\\u0062": "x"}')
    assert accepts(cg, '{"\\u0061b": "x"}') is False and accepts(cg, '{"ab": "x"}')


def test_strict_mode():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}}}
    cg = compile_schema(schema, strict=True)
    assert accepts(cg, '{"a": 1, "b": "x"}')
    assert not accepts(cg, '{"a": 1}')
    assert not accepts(cg, '{"a": 1, "b": "x", "c": 2}')
    cg2 = compile_schema(schema)
    assert accepts(cg2, '{"a": 1}') and accepts(cg2, '{"a": 1, "b": "x", "c": 2}')


def test_indent_exact():
    schema = CASES["nested"][0]
    cg = compile_schema(schema, indent=2)
    for x in CASES["nested"][1]:
        v = is_valid(schema, x)
        assert accepts(cg, json.dumps(x, indent=2)) == v
        if v and json.dumps(x, indent=2) != json.dumps(x):
            assert not accepts(cg, json.dumps(x))
    x = {"users": [{"name": "a", "age": 3}]}
    text = json.dumps(x, indent=2)
    assert accepts(cg, text)
    assert not accepts(cg, text.replace("\n  ", "\n   ", 1))
    cg4 = compile_schema({"type": "array", "items": {"type": "object"}}, indent=4)
    for x in [[], [{}], [{"a": [1, {"b": None}]}, {}]]:
        assert accepts(cg4, json.dumps(x, indent=4))


def test_max_whitespace_bound():
    cg = compile_schema({"type": "array", "items": {"type": "integer"}}, max_whitespace=3)
    assert accepts(cg, "[   1]")
    assert not accepts(cg, "[    1]")


def test_no_trailing_whitespace_or_garbage():
    cg = compile_schema({"type": "integer"})
    assert accepts(cg, "  12")
    assert not accepts(cg, "12 ")
    assert not accepts(cg, "12,")


# ---------------------------------------------------------------------------------------------- inputs, errors
def test_normalize_schema_input():
    assert normalize_schema_input('{"type": "string"}') == {"type": "string"}
    assert normalize_schema_input(b'true') is True
    with pytest.raises(InvalidSchemaError):
        normalize_schema_input("{not json")
    with pytest.raises(InvalidSchemaError):
        normalize_schema_input("[1, 2]")
    pydantic = pytest.importorskip("pydantic")

    class Item(pydantic.BaseModel):
        name: str
        count: int = 0

    s = normalize_schema_input(Item)
    assert s["properties"]["name"]["type"] == "string"
    cg = compile_schema(Item)
    assert accepts(cg, '{"name": "x", "count": 2}') and not accepts(cg, '{"count": 2}')


def test_unsupported_keyword_raises_with_pointer():
    schema = {"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string"},
                                                          "uniqueItems": True}}}
    with pytest.raises(UnsupportedSchemaError) as ei:
        json_schema_grammar(schema)
    assert ei.value.keyword == "uniqueItems"
    assert ei.value.pointer == "#/properties/tags/uniqueItems"


def test_lenient_warns_and_ignores():
    schema = {"type": "array", "items": {"type": "string"}, "uniqueItems": True}
    with pytest.warns(UserWarning, match="uniqueItems"):
        cg = compile_schema(schema, lenient=True)
    assert accepts(cg, '["a", "a"]')  # the ignored constraint, as announced


def test_unsupported_regex_in_pattern():
    with pytest.raises(UnsupportedSchemaError) as ei:
        json_schema_grammar({"type": "string", "pattern": "(a)\\1"})
    assert ei.value.keyword == "pattern"


def test_recursive_combination_needing_its_own_result_is_a_typed_error():
    # oneOf [anything, S] is "not S"; S contains the same oneOf under a pattern property, so its
    # complement needs the result being computed (was a KeyError from the memo).
    schema = {"definitions": {
        "all": {"patternProperties": {"^[a-z][a-zA-Z][a-zA-Z0-9]+$": {"$ref": "#/definitions/res"}}},
        "res": {"oneOf": [{}, {"$ref": "#/definitions/sel"}]},
        "sel": {"oneOf": [{"properties": {"ref": {"type": "string"}}},
                          {"patternProperties": {"^[a-zA-Z][a-zA-Z][a-zA-Z]?(-[a-zA-Z0-9]+)?$":
                                                 {"$ref": "#/definitions/res"}}}]}},
        "oneOf": [{"$ref": "#/definitions/all"}]}
    with pytest.raises(UnsupportedSchemaError, match="needs its own result"):
        json_schema_grammar(schema)


def test_pattern_anchors_in_groups_and_leading_lookaheads():
    # ECMA semantics: anchors anywhere; a lookahead at the start of an alternative
    cg = compile_schema({"type": "string", "pattern": "(^[a-z0-9_.()-]+$)"})
    assert accepts(cg, '"ab.c"') and not accepts(cg, '"a b"') and not accepts(cg, '""')
    cg = compile_schema({"type": "object", "propertyNames": {"pattern": "^(?!lucene\\.|builtin\\.).*"}})
    assert accepts(cg, '{"my.x": 1}') and accepts(cg, '{"lucene": 1}')
    assert not accepts(cg, '{"lucene.std": 1}') and not accepts(cg, '{"builtin.x": 1}')
    cg = compile_schema({"type": "object", "patternProperties": {"^(?!pattern$).*$": {"type": "integer"}},
                         "additionalProperties": False})
    assert accepts(cg, '{"patterns": 1, "x": 2}') and not accepts(cg, '{"pattern": 1}')
    assert not accepts(cg, '{"x": "s"}')


def test_intersection_budget_bounds_compile_work(monkeypatch):
    import grammask.grammar.json_schema.algebra as js

    schema = {"type": "object", "properties": {f"p{i}": {"oneOf": [{"type": "integer", "minimum": 0},
                                                                  {"type": "integer", "maximum": 5}]}
                                               for i in range(6)}}
    compile_schema(schema)  # within the default budget
    monkeypatch.setattr(js, "MAX_INTERSECTIONS", 20)
    with pytest.raises(GrammarTooComplexError, match="intersections"):
        json_schema_grammar(schema)


def test_invalid_schemas():
    for bad in [{"type": "strin"}, {"minLength": -1}, {"enum": 3}, {"properties": []}, {"$ref": "#/nope"},
                {"type": "string", "pattern": "("}, {"minimum": "3"}]:
        with pytest.raises(InvalidSchemaError):
            json_schema_grammar(bad)


def test_remote_ref_unsupported():
    with pytest.raises(UnsupportedSchemaError) as ei:
        json_schema_grammar({"$ref": "https://example.com/other.json"})
    assert ei.value.keyword == "$ref"


def test_empty_languages():
    for s in [False, {"type": "integer", "minimum": 5, "maximum": 4}, {"allOf": [{"type": "string"}, {"type": "number"}]},
              {"type": "string", "minLength": 3, "maxLength": 2}, {"type": "object", "required": ["a"],
                                                                   "additionalProperties": False},
              {"type": "integer", "minimum": 0.2, "maximum": 0.8}, {"enum": []}, {"not": {}}]:
        with pytest.raises(EmptyLanguageError):
            compile_schema(s)


def test_too_complex():
    with pytest.raises(GrammarTooComplexError):
        json_schema_grammar({"type": "array", "minItems": 10 ** 6})
    with pytest.raises(GrammarTooComplexError):
        json_schema_grammar({"type": "integer", "multipleOf": 97})


def test_annotations_and_unknown_keywords_ignored():
    schema = {"title": "t", "description": "d", "default": 1, "examples": [1], "$comment": "c", "deprecated": True,
              "readOnly": True, "x-custom": {"type": "string"}, "type": "integer", "format": "not-a-known-format"}
    cg = compile_schema(schema)
    assert accepts(cg, "5") and not accepts(cg, '"5"')


# ---------------------------------------------------------------------------------------------- numbers
def _num_value(s):
    from decimal import Decimal

    return Fraction(Decimal(s))


NUM_SAMPLES = (["0", "-0", "0.0", "-0.0", "1", "-1", "0.5", "0.50", "0.49", "0.499999", "5e-1", "5E-1", "50e-2",
                "0.05e1", "1e1", "1E+1", "10", "9.99", "10.01", "-10", "-10.5", "-9.5", "1.5e2", "150", "149.99",
                "-1e-3", "2.5e0", "3", "7", "-7", "21", "1e-07", "0.0000001", "100", "99.5", "1.25", "-1.25",
                "1.2500", "12.5e-1", "2", "4.0", "1e0", "123456789", "-123456788"])


@pytest.mark.parametrize("lo,lo_x,hi,hi_x,integer", [
    (Fraction(1, 2), False, None, False, False), (Fraction(1, 2), True, Fraction(10), False, False),
    (None, False, Fraction(-1, 2), True, False), (Fraction(-10), False, Fraction(10), True, True),
    (Fraction(-21, 2), True, Fraction(3, 2), False, False), (Fraction(0), False, Fraction(0), False, False),
    (Fraction(1, 10 ** 7), False, Fraction(150), False, False), (None, False, None, False, True),
])
def test_number_regex_exact(lo, lo_x, hi, hi_x, integer):
    ex = ExprSet()
    e = number_regex(ex, integer=integer, lo=lo, lo_excl=lo_x, hi=hi, hi_excl=hi_x)
    for s in NUM_SAMPLES:
        v = _num_value(s)
        ok = (lo is None or (v > lo if lo_x else v >= lo)) and (hi is None or (v < hi if hi_x else v <= hi))
        if integer:
            ok = ok and v.denominator == 1
        got = ex.matches(e, s)
        assert not (got and not ok), s
        plain = re.fullmatch(r"-?(0|[1-9]\d*)(\.\d+)?", s)
        sci = re.fullmatch(r"-?[1-9](\.\d+)?[eE][+-]?\d+", s)
        if ok and (plain and not (integer and "." in s) or (sci and not integer)):
            assert got, s


def test_number_regex_multiples():
    ex = ExprSet()
    e = number_regex(ex, integer=True, multiple_of=[Fraction(3)])
    for k in range(-40, 200):
        assert ex.matches(e, str(k)) == (k % 3 == 0)
    e = number_regex(ex, multiple_of=[Fraction(1, 20)])
    for s in ["0.05", "0.1", "0.15", "1.95", "0.051", "0.07", "3", "0.050", "-0.35"]:
        assert ex.matches(e, s) == ((_num_value(s) * 20).denominator == 1), s
    # a number that is a multiple of an integer may spell it with a fraction of zeros (MaskBench:
    # 6000.0 under {"type": "number", "multipleOf": 1}); an integer may not
    spellings = ["6", "6.0", "6.00", "6.5", "9.0", "-9.0", "10.0", "10.01", "0.0", "-0", "15.000", "16.0", "20.0", "21.0"]
    for mult, lo, hi in ((1, None, None), (3, None, None), (5, Fraction(0), Fraction(20))):
        e = number_regex(ex, multiple_of=[Fraction(mult)], lo=lo, hi=hi)
        for s in spellings:
            v = _num_value(s)
            ok = (v / mult).denominator == 1 and (lo is None or lo <= v <= hi)
            assert ex.matches(e, s) == ok, (mult, s)
    e = number_regex(ex, integer=True, multiple_of=[Fraction(1)])
    assert ex.matches(e, "6") and not ex.matches(e, "6.0")


# ---------------------------------------------------------------------------------------------- formats
def test_format_dates():
    ex = ExprSet()
    e = format_expr("date", ex)
    import datetime

    rng = random.Random(3)
    for _ in range(400):
        y, m, d = rng.choice([1900, 2000, 2023, 2024, 2100, 1, 9999]), rng.randint(0, 13), rng.randint(0, 32)
        s = f"{y:04d}-{m:02d}-{d:02d}"
        try:
            datetime.date(y, m, d)
            ok = True
        except ValueError:
            ok = False
        assert ex.matches(e, s) == ok, s
    dt = format_expr("date-time", ex)
    assert ex.matches(dt, "2024-02-29T23:59:59.123+05:30")
    for bad in ["2024-02-29t10:00:00Z", "2024-02-29T24:00:00Z", "2024-02-29T10:00Z", "2024-02-29T10:00:00"]:
        assert not ex.matches(dt, bad)


def test_format_regex_subset_is_valid_python_regex():
    ex = ExprSet()
    e = format_expr("regex", ex)
    for good in ["^[a-z]+$", "(a|b)*c", r"\d{3}-\d{4}", "^(?:[A-Z][a-z]*)+$", "a.b", ""]:
        assert ex.matches(e, good), good
    for bad in ["[", "(", "a**", "a{2,1}", "*", "[z-a]", "(?<x>a)"]:
        assert not ex.matches(e, bad), bad
    schema = {"type": "string", "format": "regex", "maxLength": 12}
    cg = compile_schema(schema)
    rng = random.Random(5)
    for _ in range(15):
        s = sample(cg, rng, max_steps=60)
        if s is not None:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                re.compile(json.loads(s))


def test_format_regex_counted_ranges():
    # {n,m} is a valid quantifier iff n <= m: accepted for every pair the subset can spell (one or
    # two digits each, or m longer than n), refused otherwise; accepted ones compile with `re`
    ex = ExprSet()
    e = format_expr("regex", ex)
    spelled = 0
    for n in list(range(0, 120)) + [150, 999, 1000]:
        for m in list(range(0, 120)) + [150, 200, 999, 1000, 9999]:
            src = f"^[a-z_]{{{n},{m}}}$"
            ok = ex.matches(e, src)
            if n > m:
                assert not ok, src
            elif len(str(n)) < len(str(m)) or len(str(m)) <= 2:
                assert ok, src
                re.compile(src)
                spelled += 1
            else:                           # equal lengths of 3-4 digits: refused (conservative)
                assert not ok, src
    assert spelled > 7000
    for bad in ["a{01,2}", "a{1,02}", "a{,3}", "a{2,1}?", "a{12345,99999}"]:
        assert not ex.matches(e, bad), bad
    assert ex.matches(e, "a{3,16}?") and ex.matches(e, "(ab){0,10}|c{5}")


def test_format_hostname_and_uri():
    ex = ExprSet()
    h = format_expr("hostname", ex)
    for good in ["example.com", "a", "a-b.c0", "xn--bcher-kva.example"]:
        assert ex.matches(h, good), good
    for bad in ["-a.com", "a..b", "a_b.com", "a" * 64, "1.2.3.4", "a.b-", ("a." * 130) + "com"]:
        assert not ex.matches(h, bad), bad
    u = format_expr("uri", ex)
    for good in ["http://example.com/a?b#c", "urn:isbn:123", "mailto:a@b.c", "http://[::1]:80/", "file:///x"]:
        assert ex.matches(u, good), good
    for bad in ["//example.com", "a b:c", "http://exa mple.com", "1http:x", "http://x/%zz"]:
        assert not ex.matches(u, bad), bad


def test_long_max_length_over_a_looping_format_or_pattern_masks_without_error():
    """A ``maxLength`` in the tens of thousands on a format or pattern with a loop (a URI's
    ``[v1.x]`` host, ``[a-z]+@...``): emptiness of the lexer's states was explored with the count
    left in every state and ran out of its state bound while masking (MaskBench's
    ``JsonSchemaStore---sourcery_yaml_schema``). Every byte is checked against the mask too."""
    schema = {"type": "object", "additionalProperties": False, "properties": {
        "url": {"type": "string", "format": "uri", "minLength": 1, "maxLength": 65536},
        "mail": {"type": "string", "pattern": "^[a-z]+@[a-z]+\\.com$", "minLength": 6, "maxLength": 65536}}}
    cg = compile_schema(schema)
    cases = [('{"url": "http://[::1]/x"}', True), ('{"url": "http://[v1f.a:b]/x?y#z"}', True),
             ('{"url": "http://[v1f.]"}', False), ('{"url": "http://[x]"}', False), ('{"url": ""}', False),
             ('{"mail": "ab@cd.com"}', True), ('{"mail": "ab@cd.co"}', False), ('{"mail": "a@c.com"}', True),
             ('{"url": "a:", "mail": "x@y.com"}', True)]
    for text, valid in cases:
        m = GrammarMatcher(cg)
        ok = True
        for b in text.encode():
            mask = m.get_next_token_bitmask()
            allowed = bool((int(mask[b // 32]) >> (b % 32)) & 1)
            assert m.accept_token(b) == allowed, text
            if not allowed:
                ok = False
                break
        assert (ok and m.can_terminate()) == valid, text
    rng = random.Random(3)
    for _ in range(8):
        s = sample(cg, rng, max_steps=80, hint="@.:/[]")
        if s is not None:
            assert json.loads(s).keys() <= {"url", "mail"}


# ---------------------------------------------------------------------------------------------- greedy safety
REF_SCHEMAS = [
    {"type": "object", "properties": {"a": {"type": "integer", "minimum": -5, "maximum": 12}, "ab": {"enum": ["x", 1.5]}},
     "additionalProperties": {"type": "number"}},
    {"type": "array", "items": {"anyOf": [{"type": "integer", "maximum": 9}, {"type": "number", "minimum": 10}]},
     "maxItems": 3},
    {"anyOf": [{"type": "string", "pattern": "^a+$"}, {"type": "string", "maxLength": 2}, {"const": [1, {"b": None}]}]},
]


@pytest.mark.parametrize("idx", range(len(REF_SCHEMAS)))
def test_masks_equal_reference(idx):
    from reference import ByteEarley, reference_mask

    schema = REF_SCHEMAS[idx]
    g = json_schema_grammar(schema, max_whitespace=2)
    cg = CompiledGrammar(g, INFO, check_lexemes=False, kind="json_schema")
    rec = ByteEarley(g)
    rng = random.Random(idx)
    stops = {STOP}
    for walk in range(4):
        m = GrammarMatcher(cg)
        sets = rec.initial()
        for step in range(40):
            mask = m.get_next_token_bitmask()
            got = {t for t in range(257) if (int(mask[t // 32]) >> (t % 32)) & 1}
            ref = reference_mask(rec, sets, INFO.token_bytes, stops)
            assert got == ref, (schema, step)
            cands = sorted(got - stops)
            if not cands or (STOP in got and rng.random() < 0.1):
                break
            weights = [20 if chr(t) in '"}],:' else (0.2 if t >= 128 else 1) for t in cands]
            t = rng.choices(cands, weights)[0]
            assert m.accept_token(t)
            sets = rec.step(sets, t)


def test_uncached_compiler_gives_the_same_grammar_and_source():
    """Without a cache the canonical text is not needed up front; ``source`` still gives it."""
    schema = {"type": "object", "properties": {"b": {"type": "integer"}, "a": {"type": "string"}},
              "required": ["b"]}
    plain = GrammarCompiler(INFO, cache_size=0).compile_json_schema(schema)
    cached = GC.compile_json_schema(schema)
    assert plain.source == cached.source == '{"properties":{"b":{"type":"integer"},"a":{"type":"string"}},' \
                                            '"required":["b"],"type":"object"}'
    for text in ('{"b": 1, "a": "x"}', '{"b": 1}', '{"a": "x", "b": 1}', '{"b": "1"}'):
        assert accepts(plain, text) == accepts(cached, text) == (text in ('{"b": 1, "a": "x"}', '{"b": 1}'))


def test_property_order_any():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"},
                                               "c": {"type": "boolean"}}, "required": ["a", "c"]}
    ordered = compile_schema(schema)
    anyorder = compile_schema(schema, property_order="any")
    docs = ['{"a": 1, "b": "x", "c": true}', '{"c": true, "a": 1}', '{"b": "x", "c": false, "a": 2}',
            '{"c": true, "b": "x", "a": 1}', '{"a": 1, "c": true, "a": 2}', '{"b": "x", "c": true}',
            '{"a": 1, "c": true, "d": null}', '{"d": null, "c": true, "a": 1}']
    for d in docs:
        # any order: exactly the valid documents (duplicates are not generated)
        valid = is_valid(schema, json.loads(d)) and d.count('"a"') == 1
        assert accepts(anyorder, d) == valid, d
    assert accepts(ordered, docs[0]) and not accepts(ordered, docs[1]) and not accepts(ordered, docs[2])
    with pytest.raises(ValueError):
        compile_schema(schema, property_order="sorted")


def test_compiling_leaves_no_cyclic_garbage():
    """The compile state (recursive IR through $ref, memo tables, the generators' mutually
    recursive closures) is unlinked when compilation ends, so reference counting frees it; left
    to the cyclic collector it piled up into full collections of up to a second in a long-lived
    process, landing on some later mask."""
    import gc

    ex = ExprSet()
    schemas = [
        {"$ref": "#/$defs/node", "$defs": {"node": {
            "type": "object", "properties": {"v": {"type": "integer"},
                                             "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
            "required": ["v"]}}},
        {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "number"}},
         "minProperties": 1, "maxProperties": 2, "additionalProperties": {"type": "boolean"}},
        {"type": "array", "items": {"enum": ["x", "y", "z"]}, "uniqueItems": True, "contains": {"const": "x"}},
        {"allOf": [{"$ref": "#/$defs/t"}, {"not": {"required": ["z"]}}],
         "$defs": {"t": {"type": "object", "properties": {"z": {"$ref": "#/$defs/t"}}}}},
    ]
    json_schema_grammar(schemas[0], exprs=ex)   # warm the shared caches of the ExprSet
    gc.collect()
    gc.disable()
    try:
        gc.set_debug(gc.DEBUG_SAVEALL)
        for schema in schemas:
            json_schema_grammar(schema, exprs=ex)
        gc.collect()
        ours = [o for o in gc.garbage if type(o).__module__.startswith("grammask")
                or str(getattr(o, "__module__", None)).startswith("grammask.grammar.json_schema")]
        assert ours == []
        assert len(gc.garbage) < 50, [type(o).__qualname__ for o in gc.garbage][:20]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()


def test_an_exprset_that_compiled_schemas_is_freed_without_the_cyclic_collector():
    """The JSON lexemes and string tables a compile keeps on its ExprSet (shared by the schemas
    compiled into it) hold no strong reference back to it: an ExprSet dropped with its grammars
    (a compiler starting a new shared set, a grammar with a set of its own evicted) is freed by
    reference counting at once. As a cycle it waited for the next full collection, which then
    freed its millions of nodes inside whatever mask was running (pauses of 100+ ms)."""
    import gc
    import weakref

    from grammask import GrammarCompiler, GrammarMatcher, TokenizerInfo

    vocab = [bytes([c]) for c in range(32, 127)] + [b'{"', b'":', b'"a"']
    info = TokenizerInfo.from_vocab(vocab, stop_token_ids=[])
    schema = {"type": "object", "properties": {"a": {"type": "string", "pattern": "^[a-z]+$", "maxLength": 5},
                                               "b": {"type": "number"}}, "required": ["a"]}
    was = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        ex = ExprSet()
        cg = GrammarCompiler(info, cache_size=0).compile_json_schema(schema)
        json_schema_grammar(schema, exprs=ex)
        ref_own, ref_cg = weakref.ref(ex), weakref.ref(cg.exprs)
        m = GrammarMatcher(cg)
        m.get_next_token_bitmask()
        assert m.accept_string('{"a": "xy"')
        m.get_next_token_bitmask()
        del ex, cg, m
        assert ref_own() is None
        assert ref_cg() is None
    finally:
        if was:
            gc.enable()


def test_long_property_lists_compile():
    """Grammar generation recurses once per declared property (no helper frames in between): a
    flat object of 400 optional properties compiles with Python's default recursion limit, and
    its documents are accepted. (A memo wrapper around the member rules once cut this to ~160.)"""
    n = 400
    schema = {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(n)}}
    cg = compile_schema(schema)
    for doc in ({}, {f"p{n - 1}": 1}, {"p0": 0, f"p{n // 2}": 5, f"p{n - 1}": 7}):
        assert accepts(cg, json.dumps(doc)), doc
    assert not accepts(cg, json.dumps({f"p{n - 1}": 1, "p0": 0}))   # definition order


def test_anchors_under_names_that_are_keywords_elsewhere():
    """A definition or property NAMED like a data keyword ("default", "enum", "const") holds a schema:
    its $anchor / $id are found (the data keywords' own values are never indexed)."""
    named = {"default": {"$anchor": "num", "type": "integer"}, "enum": {"$id": "https://example.com/s", "type": "string"}}
    refs = {"a": {"$ref": "#num"}, "b": {"$ref": "https://example.com/s"}}
    for schema in ({"$defs": named, "type": "object", "properties": refs, "additionalProperties": False},
                   {"type": "object", "properties": {**named, **refs}, "additionalProperties": False}):
        schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
        cg = compile_schema(schema)
        for x in ({"a": 1}, {"b": "x"}, {"a": "x"}, {"b": 2}, {"default": 3}, {"default": "y"}):
            assert accepts(cg, json.dumps(x)) == is_valid(schema, x), (schema, x)
    # a "default" VALUE with an $anchor inside is data: not a schema to resolve
    with pytest.raises(InvalidSchemaError):
        compile_schema({"default": {"$anchor": "x"}, "$ref": "#x"})


def test_format_expressions_are_built_once_and_imported_as_the_same_expressions():
    """format_expr builds each format once per process (a private ExprSet) and imports it: the
    import is the very expression the format's regex builds in the target set (hash-consed ids
    equal), for every format; a fresh set gets it without parsing the regex again."""
    from grammask.grammar import regex as regex_mod
    from grammask.grammar.json_schema.formats import FORMATS, build_format_expr

    names = sorted(FORMATS) + ["regex"]
    for name in names:
        ex = ExprSet()
        assert format_expr(name, ex) == build_format_expr(name, ex), name
    assert format_expr("no-such-format", ExprSet()) is None
    calls = []
    orig = regex_mod.parse_regex
    try:
        regex_mod.parse_regex = lambda *a, **k: calls.append(a) or orig(*a, **k)
        ex = ExprSet()
        for name in names:
            assert format_expr(name, ex) is not None
    finally:
        regex_mod.parse_regex = orig
    assert calls == []
