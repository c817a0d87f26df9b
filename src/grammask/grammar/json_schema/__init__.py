"""JSON Schema to a lexeme grammar (``GrammarCompiler.compile_json_schema``).

The compiler works in two stages.

1. **Schema -> IR.** Every (sub)schema becomes a node of a small algebra: :class:`Typed` (per JSON
   type: allowed or not, with that type's constraints: :class:`NumC`, :class:`StrC`,
   :class:`ArrC`, :class:`ObjC`), :class:`Union` (``anyOf``, ``enum``, disjoint ``oneOf``) and
   :class:`Ref` (a lazily resolved ``$ref``; recursive schemas stay finite). ``allOf``,
   ``$ref`` siblings (2019-09+), ``if``/``then``/``else``, ``not`` and ``dependent*`` are
   computed as real intersections/complements in this algebra (:meth:`.algebra.Algebra.isect`,
   :meth:`.algebra.Algebra.negate`); keyword combinations it cannot express exactly raise
   :class:`~grammask.errors.UnsupportedSchemaError` (naming the keyword and its JSON pointer),
   or with ``lenient=True`` are dropped with a warning. Nothing is dropped silently.

2. **IR -> grammar.** Each node becomes a nonterminal. Terminals are complete JSON tokens with
   their leading whitespace (see :mod:`..builtin`): a string (its regex carries the pattern /
   format / length / enum constraints, over the JSON-escaped form of the string), a number (an
   exact digit-level regex of its range, :mod:`.numeric`), ``true``/``false``/``null``,
   punctuation, and an object key merged with its colon (``ws "key" ws :``, safe because only key
   lexemes and ``}`` are live where a key can start, and string tokens are prefix-free). These are
   greedy-safe, so the grammar is lowered with ``check_lexemes=False``.

Semantics and choices
    * JSON Schema semantics by default: ``additionalProperties`` defaults to any value (the key of
      an additional property must differ from every declared name: the key lexeme is intersected
      with the complement of those names), optional properties optional. Keys are spelled the
      way ``json.dumps`` spells them: raw printable ASCII, the short escapes, ``\\uXXXX`` (or raw
      UTF-8) for control and non-ASCII characters; a key spelled with ``\\uXXXX`` for a
      printable ASCII character is not generated (so no spelling of a declared name can pass
      as an additional key).
      ``strict=True`` (OpenAI structured outputs): in every schema with ``properties``, every
      declared property is required and ``additionalProperties`` defaults to false.
    * Object members: declared properties appear in ``properties`` order (required ones must
      appear); additional/pattern properties may be interleaved anywhere. With
      ``compile_json_schema(..., property_order="any")`` objects of at most 10 declared
      properties accept them in any order. ``allOf`` (and ``$ref``
      siblings) merge properties in first-appearance order: the schema's own ``properties``, then
      its ``$ref`` target, then ``allOf`` branches in order; then required-but-undeclared names.
    * Integers are generated without fraction or exponent (``1``, not ``1.0``/``1e0``); bounded
      numbers use plain decimals and normalised scientific notation (see :mod:`.numeric`).
    * String constraints (``pattern``, ``format``, lengths) are enforced on the decoded value;
      a constrained string accepts raw characters and the usual JSON escapes for ASCII (and
      ``\\uXXXX`` for control characters); lengths count code points (a surrogate-pair escape is
      one character). ``enum``/``const`` strings also accept ``\\uXXXX`` spellings of non-ASCII.
    * Unknown ``format`` values are annotations (JSON Schema 2019-09+) and are ignored; OpenAPI
      integer formats (``int32``...) are enforced as ranges on integers.
    * ``$ref`` siblings are ignored under drafts 3-7 (as those drafts specify) and applied from
      2019-09 on (the default when ``$schema`` is absent). ``if``/``then``/``else`` apply from
      draft 7 on (under drafts 3-6 they are unknown keywords, as those drafts' validators read them). Draft 3 ``required: true``,
      ``divisibleBy``, ``extends`` and ``disallow`` (of type names) are understood.
    * Keywords this module does not know are ignored, as JSON Schema specifies for unknown
      keywords; annotations (``title``, ``default``, ``examples``...) are ignored.
    * Bounded non-integer numbers keep at most 15 significant digits and exponents within
      +-300, so that validators comparing doubles agree with the exact comparison.
    * ``indent=N``: whitespace exactly as ``json.dumps(obj, indent=N)``.
    * Compile work is bounded (union sizes, repetition unrolling, property counts, regex states):
      beyond the bounds :class:`~grammask.errors.GrammarTooComplexError` is raised.

Keyword support
    exact: ``type``, ``enum``, ``const``, ``properties``, ``required``, ``additionalProperties``,
    ``patternProperties``, ``propertyNames``, ``min/maxProperties``, ``items``/``prefixItems``/
    ``additionalItems``, ``min/maxItems``, ``contains``/``min/maxContains`` (up to 3 clauses),
    ``min/maxLength``, ``pattern``, ``format`` (see :mod:`.formats`), numeric bounds (both
    spellings of exclusive bounds), ``multipleOf`` (finite decimals; remainder automata up to 25
    states for unbounded integer ranges), ``allOf``, ``anyOf``, ``oneOf`` (disjoint branches, or
    each branch minus the others when their complements are computable), ``not``,
    ``if``/``then``/``else``, ``dependentRequired``/``dependentSchemas``/``dependencies``,
    ``$ref`` (JSON pointers, ``$defs``/``definitions``, ``$anchor``, ``$id``-relative, recursive),
    ``$dynamicRef``/``$recursiveRef`` (resolved statically), boolean schemas.
    approximated from below (never accepting an invalid document): ``unevaluatedProperties``/
    ``unevaluatedItems`` (keys/items evaluated by the schema and its in-place applicators only).
    unsupported (``UnsupportedSchemaError``, or ignored with a warning when ``lenient=True``):
    ``uniqueItems`` except for arrays of at most 10 distinct scalar values or ``maxItems <= 1``;
    regex constructs :mod:`..regex` rejects (lookaround, backreferences...); complements the
    algebra cannot express (e.g. ``not`` of ``uniqueItems`` or fractional ``multipleOf``);
    remote ``$ref`` (nothing is fetched).
    Duplicate keys are not prevented among additional properties (a context-free grammar
    cannot), declared properties appear at most once.

Modules, one per stage
    :mod:`.input` (what a schema may be given as, its draft, its cache-key text), :mod:`.ir` (the
    IR), :mod:`.refs` (the ``$ref`` registry), :mod:`.to_ir` (schema -> IR), :mod:`.algebra`
    (intersection, complement, emptiness, ``oneOf``...), :mod:`.strings` (string escapes),
    :mod:`.numeric` and :mod:`.formats` (number and ``format`` regexes), :mod:`.generate` (IR ->
    grammar); :mod:`.state` is what the stages of one compile share, :mod:`.limits` the bounds of
    its work.
"""
from __future__ import annotations

import warnings

from ...errors import EmptyLanguageError, GrammarTooComplexError
from ..builtin import DEFAULT_MAX_WHITESPACE
from ..cfg import Grammar
from ..regexset import EPS
from .algebra import Algebra
from .generate import GrammarGenerator
from .input import canonical_schema_text, normalize_schema_input
from .ir import is_nothing
from .state import CompileState
from .to_ir import SchemaReader

__all__ = ["json_schema_grammar", "normalize_schema_input", "canonical_schema_text"]


def json_schema_grammar(schema, *, whitespace: str = "flexible", max_whitespace: int = DEFAULT_MAX_WHITESPACE,
                        strict: bool = False, lenient: bool = False, indent: int | None = None,
                        unordered_properties: int = 0, exprs=None) -> Grammar:
    """The grammar of the JSON documents valid against ``schema`` (see the module docstring).

    ``unordered_properties=N``: objects with at most N declared properties (N <= 10) accept them
    in any order (the grammar tracks which are present: 2^N states); larger objects keep the
    ``properties`` order. ``exprs``: the ExprSet to build in (a compiler shares one across its
    grammars so that derivatives are computed once)."""
    schema = normalize_schema_input(schema)
    if indent is not None and (not isinstance(indent, int) or isinstance(indent, bool) or indent < 0):
        raise ValueError("indent must be a non-negative integer")
    st = None
    stages = []
    try:
        st = CompileState(schema, whitespace=whitespace, max_whitespace=max_whitespace, strict=strict,
                          lenient=lenient, indent=indent, unordered_max=min(max(unordered_properties, 0), 10),
                          exprs=exprs)
        alg = Algebra(st)
        stages.append(alg)
        reader = SchemaReader(st, alg)
        stages.append(reader)
        generator = GrammarGenerator(st, alg)
        stages.append(generator)
        node = reader.read()
        if is_nothing(node):
            raise EmptyLanguageError("the schema accepts no JSON value")
        lead = st.ws if indent is None else EPS
        top = generator.gen(node, lead, 0)
    except RecursionError:
        raise GrammarTooComplexError("the schema nests too deeply") from None
    finally:
        if st is not None:
            g, found = st.g, st.warnings
            for part in stages:
                part.close()
            st.close()
    if found:
        warnings.warn("JSON schema constraints ignored (lenient=True): " + "; ".join(found), stacklevel=3)
    g.rule("root", [[top]])
    g.root = g.index["root"]
    return g
