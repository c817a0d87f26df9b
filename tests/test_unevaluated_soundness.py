"""unevaluatedProperties / unevaluatedItems against the annotation rules of JSON Schema 2020-12.

Written from the specification's text (core, "Annotations" / "Collecting Annotations"; the
applicator vocabulary, "unevaluatedItems" and "unevaluatedProperties"), not from a test suite:

* the keywords see the annotations of the *adjacent* keywords and of every in-place subschema
  (allOf/anyOf/oneOf/not/if/then/else/dependentSchemas/$ref/$dynamicRef) that was evaluated
  against the same instance location;
* a subschema that fails contributes no annotations: a failing anyOf/oneOf branch, an ``if``
  that fails (then its ``else`` counts), and ``not``, which never contributes any (its
  subschema passes exactly when ``not`` fails, and ``not``'s own result carries none);
* ``const``/``enum``/``required``/``propertyNames``/``minItems`` ... assert without annotating;
* in 2020-12 ``contains`` annotates the indices of the items it matches (2019-09: it does not);
* a nested ``unevaluated*`` that passes annotates every item/property it was applied to.

The promise under test ("fail closed"): a schema either compiles to a grammar that accepts
no instance the specification rejects, or compiling raises UnsupportedSchemaError naming the
keyword and location. The oracle is ``jsonschema`` (Draft202012Validator), which implements
annotation collection. Cases marked ``exact`` must also accept every valid instance.
"""
from __future__ import annotations

import itertools
import json

import jsonschema
import pytest

from grammask.errors import EmptyLanguageError, UnsupportedSchemaError
from grammask.grammar.compiler import GrammarCompiler
from grammask.grammar.matcher import GrammarMatcher
from grammask.grammar.tokenizer_info import TokenizerInfo

STOP = 256
INFO = TokenizerInfo.from_vocab([bytes([i]) for i in range(256)] + [b"<eos>"], stop_token_ids=[STOP])
GC = GrammarCompiler(INFO)
D2020 = "https://json-schema.org/draft/2020-12/schema"
D2019 = "https://json-schema.org/draft/2019-09/schema"
F = False


def compile_or_none(schema):
    """The compiled grammar, or None when the schema accepts nothing."""
    try:
        return GC.compile_json_schema(schema)
    except EmptyLanguageError:
        return None


def accepts(cg, x) -> bool:
    """Whether the grammar accepts ``x`` with its top-level members in some order (grammask
    writes declared properties in their schema order)."""
    if cg is None:
        return False
    orders = itertools.permutations(x.items()) if isinstance(x, dict) else [None]
    for order in orders:
        m = GrammarMatcher(cg)
        if m.accept_string(json.dumps(x if order is None else dict(order))) and m.can_terminate():
            return True
    return False


def valid(schema, x) -> bool:
    cls = jsonschema.validators.validator_for(schema)
    return cls(schema).is_valid(x)


def with_draft(schema, draft=D2020):
    return {"$schema": draft, **schema}


# name: (schema, instances (from the spec's rules), "exact" | "sound")
# "sound": valid instances may be rejected (noted in the comment), invalid ones never accepted.
CASES = {
    # ---- baseline: the simple cases stay exact
    "prefix_false": ({"prefixItems": [{"const": 1}], "unevaluatedItems": F},
                     [[], [1], [1, 1], [2], ["a"]], "exact"),
    "prefix_schema": ({"prefixItems": [{"type": "string"}], "unevaluatedItems": {"const": 1}},
                      [[], ["a"], ["a", 1], ["a", 2], ["a", 1, 1], [1]], "exact"),
    "allof_objects": ({"allOf": [{"properties": {"a": True}}, {"properties": {"b": True}}],
                       "unevaluatedProperties": F},
                      [{}, {"a": 1}, {"a": 1, "b": 2}, {"c": 1}, {"a": 1, "c": 1}], "exact"),
    "adjacent_properties": ({"properties": {"a": {"type": "integer"}}, "patternProperties": {"^x": True},
                             "unevaluatedProperties": {"type": "string"}},
                            [{"a": 1}, {"xy": 1}, {"b": "s"}, {"b": 1}, {"a": "s"}], "exact"),
    "ref_sibling": ({"$defs": {"d": {"properties": {"a": True}}}, "$ref": "#/$defs/d",
                     "unevaluatedProperties": F},
                    [{"a": 1}, {"b": 1}, {}], "exact"),
    "dependent_schemas": ({"properties": {"a": True}, "dependentSchemas": {"a": {"properties": {"b": True}}},
                           "unevaluatedProperties": F},
                          [{"a": 1}, {"a": 1, "b": 1}, {"b": 1}, {"a": 1, "c": 1}], "exact"),
    "oneof_disjoint": ({"oneOf": [{"properties": {"t": {"const": 1}, "a": True}, "required": ["t"]},
                                  {"properties": {"t": {"const": 2}, "b": True}, "required": ["t"]}],
                        "unevaluatedProperties": F},
                       [{"t": 1, "a": 1}, {"t": 2, "b": 1}, {"t": 1, "b": 1}, {"t": 2, "a": 1}], "exact"),
    "additional_in_allof": ({"allOf": [{"additionalProperties": {"type": "integer"}}], "unevaluatedProperties": F},
                            [{"a": 1}, {"a": "s"}, {}], "exact"),
    "nested_unevaluated_false": ({"allOf": [{"properties": {"a": True}, "unevaluatedProperties": F}],
                                  "properties": {"b": True}, "unevaluatedProperties": F},
                                 [{"a": 1}, {"b": 1}, {"a": 1, "b": 1}, {}], "exact"),
    # ---- not: never contributes annotations
    "not_properties": ({"properties": {"foo": True}, "not": {"properties": {"a": {"const": 1}}, "required": ["a"]},
                        "unevaluatedProperties": F},
                       [{"foo": 1}, {"a": 2}, {"a": 1}, {"foo": 1, "a": 2}], "exact"),
    "not_not_properties": ({"not": {"not": {"properties": {"a": True}}}, "unevaluatedProperties": F},
                           [{}, {"a": 1}], "exact"),
    "not_pattern": ({"not": {"patternProperties": {"^a": {"const": 1}}}, "unevaluatedProperties": F},
                    [{"a": 2}, {"ab": "x"}, {"a": 1}, {}], "exact"),
    "not_not_pattern": ({"not": {"not": {"patternProperties": {"^a": {"const": 1}}}}, "unevaluatedProperties": F},
                        [{"a": 1}, {}, {"b": 1}], "exact"),
    "not_additional": ({"not": {"additionalProperties": {"const": 1}}, "unevaluatedProperties": F},
                       [{"a": 2}, {"a": 1}, {}], "exact"),
    "not_with_unevaluated_inside": ({"not": {"properties": {"a": True}, "unevaluatedProperties": F},
                                     "unevaluatedProperties": {"const": 1}},
                                    [{"b": 1}, {"b": 2}, {"a": 1, "b": 1}, {"a": 2, "b": 1}], "exact"),
    "not_prefix_items": ({"not": {"prefixItems": [{"const": 1}]}, "unevaluatedItems": F},
                         [[2], ["a"], [1], []], "exact"),
    "not_contains": ({"not": {"contains": {"const": 1}}, "unevaluatedItems": F},
                     [[], [2], ["a", 2], [1]], "exact"),
    "not_items_with_prefix": ({"prefixItems": [True], "not": {"items": {"const": 1}}, "unevaluatedItems": {"type": "string"}},
                              [[1], [1, 2], [1, "a"], [1, "a", 1], [1, 1, "a"]], "exact"),
    "not_required_harmless": ({"properties": {"a": {"const": 1}}, "not": {"required": ["b"]},
                               "unevaluatedProperties": {"type": "string"}},
                              [{"a": 1}, {"c": "s"}, {"c": 1}, {"b": "s"}], "exact"),
    # ---- if: annotations of a failing if are dropped (then else counts)
    "if_fails": ({"if": {"properties": {"a": {"const": 1}}, "required": ["a"]}, "then": {"required": ["b"]},
                  "unevaluatedProperties": F},
                 [{"a": 2}, {"a": 1, "b": 1}, {"a": 1}, {}], "exact"),
    "if_then_else": ({"if": {"properties": {"a": {"const": 1}}}, "then": {"properties": {"b": True}},
                      "else": {"properties": {"c": True}}, "unevaluatedProperties": F},
                     [{"a": 1}, {"a": 2}, {"a": 1, "b": 1}, {"a": 1, "c": 1}, {"c": 1}, {"b": 1}, {"a": 2, "c": 1}],
                     "exact"),
    "if_then_outer_declared": ({"properties": {"a": {"enum": [1, 2]}}, "if": {"properties": {"a": {"const": 1}}},
                                "then": {"properties": {"b": True}}, "unevaluatedProperties": F},
                               [{"a": 1, "b": 1}, {"a": 2, "b": 1}, {"a": 2}], "exact"),
    "if_items": ({"if": {"prefixItems": [{"const": 1}]}, "then": True, "else": {"prefixItems": [True, True]},
                  "unevaluatedItems": F},
                 [[1], [1, 2], [2], [2, 3], [2, 3, 4], []], "exact"),
    # ---- oneOf whose branches overlap: the others' complements evaluate nothing
    "oneof_overlap": ({"oneOf": [{"properties": {"a": {"const": 1}}},
                                 {"properties": {"b": {"const": 1}}, "required": ["b"]}],
                       "unevaluatedProperties": F},
                      [{"a": 1}, {"b": 1}, {"b": 2}, {"a": 1, "b": 2}, {"a": 2, "b": 1}], "exact"),
    # ---- anyOf: only passing branches annotate. Where several pass, the union of their
    # annotations counts; grammask sees one branch at a time (rejects such instances: sound).
    "anyof_failing_branch": ({"anyOf": [{"properties": {"a": {"const": 1}}, "required": ["a"]},
                                        {"properties": {"b": {"const": 1}}, "required": ["b"]}],
                              "unevaluatedProperties": F},
                             [{"a": 1}, {"b": 1}, {"a": 1, "b": 2}, {"a": 2, "b": 1}], "sound"),   # {"a":1,"b":1}
    "anyof_two_pass": ({"anyOf": [{"properties": {"a": True}}, {"properties": {"b": True}}],
                        "unevaluatedProperties": F},
                       [{"a": 1}, {"b": 1}, {"c": 1}], "sound"),   # {"a":1,"b":1} valid, rejected
    # ---- const/enum assert without annotating
    "const_object": ({"const": {"a": 1}, "unevaluatedProperties": F}, [{"a": 1}, {}], "exact"),
    "enum_objects": ({"enum": [{"a": 1}, {"b": 1}], "properties": {"b": True}, "unevaluatedProperties": F},
                     [{"a": 1}, {"b": 1}], "exact"),
    "const_array": ({"const": [1], "unevaluatedItems": F}, [[1], []], "exact"),
    "const_array_with_prefix": ({"const": [1, 2], "prefixItems": [True], "unevaluatedItems": {"const": 2}},
                                [[1, 2]], "exact"),
    # ---- contains (2020-12) annotates the items it matches
    "contains": ({"contains": {"const": 1}, "unevaluatedItems": F}, [[1], [1, 1], [1, 2], [2], []], "exact"),
    "prefix_and_contains": ({"prefixItems": [True], "contains": {"type": "string"}, "unevaluatedItems": F},
                            [[1, "a"], ["a"], [1, "a", 2], [1, "a", "b"], [1]], "exact"),
    "contains_max": ({"contains": {"type": "string"}, "maxContains": 1, "unevaluatedItems": {"const": 1}},
                     [["a"], ["a", 1], ["a", 2], ["a", "b"], [1]], "exact"),
    "contains_in_allof": ({"allOf": [{"contains": {"const": 1}}], "unevaluatedItems": {"const": 2}},
                          [[1, 2], [1, 3], [2], [1, 1]], "exact"),
    "contains_in_failed_anyof": ({"anyOf": [{"contains": {"const": 1}}, {"minItems": 2}], "unevaluatedItems": F},
                                 [[1], [1, 2], [2, 2], [1, 1]], "sound"),
    # ---- nested unevaluated*: a passing one annotates everything (an inner "true" does too;
    # grammask does not see the inner true's annotations: sound, rejects e.g. {"a":1})
    "nested_unevaluated_true": ({"allOf": [{"unevaluatedProperties": True}], "unevaluatedProperties": F},
                                [{}, {"a": 1}], "sound"),
    "nested_unevaluated_items": ({"allOf": [{"prefixItems": [True], "unevaluatedItems": {"type": "string"}}],
                                  "unevaluatedItems": F},
                                 [[1], [1, "a"], [1, 2], []], "exact"),
    # ---- recursion through $ref keeps working
    "recursive": ({"$defs": {"n": {"properties": {"v": True, "next": {"$ref": "#/$defs/n"}},
                                   "unevaluatedProperties": F}},
                   "$ref": "#/$defs/n"},
                  [{"v": 1, "next": {"v": 2}}, {"v": 1, "next": {"w": 2}}, {"w": 1}], "exact"),
    "anyof_through_refs": ({"$defs": {"u": {"anyOf": [{"$ref": "#/$defs/v"}, {"properties": {"a": True}}]},
                                      "v": {"anyOf": [{"properties": {"b": {"const": 1}}, "required": ["b"]},
                                                      {"type": "string"}]}},
                            "$ref": "#/$defs/u", "unevaluatedProperties": F},
                           [{"a": 1}, {"b": 1}, {"b": 2}, "s", {"c": 1}], "sound"),   # {"a":1,"b":1}: as anyof_two_pass
}

# 2019-09: contains does not annotate (its unevaluatedItems sees items, additionalItems and
# unevaluatedItems only); jsonschema lets contains annotate there too, so grammask, following the
# 2019-09 text, rejects [1] which the oracle accepts: "sound", not "exact"
CASES_2019 = {
    "contains_2019": ({"contains": {"const": 1}, "unevaluatedItems": F}, [[1], [], [1, 1]], "sound"),
    "items_array_2019": ({"items": [{"const": 1}], "unevaluatedItems": F}, [[1], [1, 1], []], "exact"),
}

ALL = {**{k: (with_draft(s), xs, m) for k, (s, xs, m) in CASES.items()},
       **{k: (with_draft(s, D2019), xs, m) for k, (s, xs, m) in CASES_2019.items()}}


@pytest.mark.parametrize("name", sorted(ALL))
def test_hand_written_instances(name):
    schema, instances, mode = ALL[name]
    cg = compile_or_none(schema)
    for x in instances:
        v, a = valid(schema, x), accepts(cg, x)
        assert not (a and not v), f"{name}: invalid instance accepted: {json.dumps(x)}"
        if mode == "exact":
            assert a == v, f"{name}: valid instance rejected: {json.dumps(x)}"


def candidates():
    out = [None, 1, "a", True, [], {}]
    for n in range(1, 4):
        out.extend(list(t) for t in itertools.product([1, 2, "a"], repeat=n))
    keys = ["a", "b", "c", "t", "foo", "xy"]
    for n in range(1, 3):
        for ks in itertools.combinations(keys, n):
            for vs in itertools.product([1, 2, "s"], repeat=n):
                out.append(dict(zip(ks, vs)))
    out.extend([{"v": 1, "next": {"v": 2}}, {"v": 1, "next": {"w": 2}}, {"a": 1, "b": 1, "c": 1}])
    return out


CANDIDATES = candidates()


@pytest.mark.parametrize("name", sorted(ALL))
def test_sweep_never_accepts_invalid(name):
    """Every small array/object (length 0..3 over a few values): nothing the specification
    rejects is accepted; for the cases marked exact, nothing it accepts is rejected."""
    schema, _, mode = ALL[name]
    cg = compile_or_none(schema)
    bad, missed = [], []
    for x in CANDIDATES:
        v, a = valid(schema, x), accepts(cg, x)
        if a and not v:
            bad.append(x)
        elif v and not a:
            missed.append(x)
    assert not bad, f"{name}: invalid instances accepted: {json.dumps(bad[:5])}"
    if mode == "exact":
        assert not missed, f"{name}: valid instances rejected: {json.dumps(missed[:5])}"


# ---------------------------------------------------------------- refusals
# $dynamicRef is resolved statically; where another resource of the document declares the same
# $dynamicAnchor the dynamic scope may pick it instead: refused, never approximated.
DYNAMIC_OVERRIDE = {
    "$schema": D2020,
    "$id": "https://example.com/root",
    "$ref": "list",
    "$defs": {
        "override": {"$dynamicAnchor": "elem", "type": "string"},
        "list": {
            "$id": "list",
            "type": "array",
            "items": {"$dynamicRef": "#elem"},
            "$defs": {"fallback": {"$dynamicAnchor": "elem"}},
        },
    },
}


def test_dynamic_ref_with_a_possible_override_is_refused():
    assert valid(DYNAMIC_OVERRIDE, ["s"]) and not valid(DYNAMIC_OVERRIDE, [1])   # the override applies
    with pytest.raises(UnsupportedSchemaError) as ei:
        GC.compile_json_schema(DYNAMIC_OVERRIDE)
    assert ei.value.keyword == "$dynamicRef"
    assert ei.value.pointer.endswith("/items/$dynamicRef")


def test_dynamic_ref_without_override_compiles_exactly():
    schema = {"$schema": D2020, "$id": "https://example.com/root", "$dynamicAnchor": "node",
              "properties": {"a": True, "kids": {"type": "array", "items": {"$dynamicRef": "#node"}}},
              "unevaluatedProperties": F}
    cg = compile_or_none(schema)
    for x in [{"a": 1}, {"kids": [{"a": 1}]}, {"kids": [{"b": 1}]}, {"b": 1}, {"kids": [{"kids": []}]}]:
        assert accepts(cg, x) == valid(schema, x), x


def test_lenient_ignores_a_refused_dynamic_ref():
    with pytest.warns(UserWarning, match=r"\$dynamicRef"):
        GC.compile_json_schema(DYNAMIC_OVERRIDE, lenient=True)
