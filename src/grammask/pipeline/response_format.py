"""``response_format`` (and ``tools``) of a request to a grammar: canonical spec, cache key, compile.

:func:`grammar_spec` turns a validated request into a :class:`GrammarSpec` (``None`` for free
text). The spec's :attr:`~GrammarSpec.canonical` text is the same for equal inputs (schemas are
dumped with sorted keys), so ``(kind, canonical, options, tokenizer)`` is a sound cache key.
:func:`compile_spec` has the :class:`~grammask.grammar.compiler.GrammarCompiler` build the
:class:`~grammask.grammar.compiled.CompiledGrammar`; it is what runs in a worker thread while the
prompt is prefilled.

Kinds::

    text             no grammar
    json_object      any JSON object (builtin grammar), or with ``schema`` a JSON Schema (JSON
                     Schema semantics: optional properties optional, additional ones allowed
                     unless ``additionalProperties`` says otherwise)
    json_schema      OpenAI json_schema; ``strict`` as given (default False); strict means
                     OpenAI structured outputs: every property required, no additional ones
    grammar          EBNF/GBNF text, root rule ``root``
    regex            ECMA-262 regex over the whole output
    structural_tag   free text and tags (:mod:`grammask.grammar.structural_tag`); also what
                     ``tools`` become (:mod:`.structural_tag`)
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import InvalidSchemaError
from ..grammar.compiled import CompiledGrammar
from ..grammar.structural_tag import TagSpec, TagStructure
from .protocol import ChatCompletionRequest
from .structural_tag import tools_tag_spec


def _canon_json(obj) -> str:
    from ..grammar.json_schema import canonical_schema_text

    return canonical_schema_text(obj)


@dataclass(frozen=True)
class GrammarSpec:
    kind: str
    canonical: str
    options: tuple = ()
    #: the parsed form the compiler needs (schema object, TagSpec, ...): not part of the key
    payload: object = field(default=None, compare=False, hash=False)

    def key(self, tokenizer_key: str) -> tuple:
        return (self.kind, self.canonical, self.options, tokenizer_key)


def _check_schema(schema, where: str) -> None:
    """Structural check of a JSON Schema with ``jsonschema`` when it is installed (the grammar
    front end checks what it compiles in any case)."""
    if isinstance(schema, bool):
        return
    try:
        from jsonschema import exceptions, validators
    except ImportError:  # pragma: no cover - jsonschema is a test dependency
        return
    try:
        cls = validators.validator_for(schema, default=validators.Draft202012Validator)
        cls.check_schema(schema)
    except exceptions.SchemaError as e:
        pointer = "#/" + "/".join(str(p) for p in e.absolute_path) if e.absolute_path else "#"
        raise InvalidSchemaError(f"invalid JSON Schema in {where}: {e.message}", pointer) from None


def grammar_spec(req: ChatCompletionRequest, *, whitespace: str = "flexible") -> GrammarSpec | None:
    """The grammar a request asks for, validated; ``None`` for unconstrained text."""
    if req.tools_active:
        spec = tools_tag_spec(req.tools, req.tool_choice or "auto", req.parallel_tool_calls)
        for i, t in enumerate(req.tools):
            _check_schema(t.function.parameters, f"tools[{i}].function.parameters")
        strict = all(bool(t.function.strict) for t in req.tools)
        return GrammarSpec("structural_tag", spec.canonical(), (whitespace, strict), (spec, strict))
    rf = req.response_format
    if rf is None or rf.type == "text":
        return None
    if rf.type == "json_object":
        if rf.schema_ is None:
            return GrammarSpec("json_object", "", (whitespace,))
        _check_schema(rf.schema_, "response_format.schema")
        return GrammarSpec("json_schema", _canon_json(rf.schema_), (whitespace, False), rf.schema_)
    if rf.type == "json_schema":
        schema = rf.json_schema.schema_
        _check_schema(schema, "response_format.json_schema.schema")
        strict = bool(rf.json_schema.strict)
        return GrammarSpec("json_schema", _canon_json(schema), (whitespace, strict), schema)
    if rf.type == "grammar":
        return GrammarSpec("grammar", rf.grammar, ())
    if rf.type == "regex":
        return GrammarSpec("regex", rf.pattern, ())
    if rf.type == "structural_tag":
        structures = tuple(TagStructure(s.begin, s.schema_, s.end) for s in rf.structures)
        for i, s in enumerate(rf.structures):
            _check_schema(s.schema_, f"response_format.structures[{i}].schema")
        spec = TagSpec(structures, tuple(rf.triggers), "auto", True)
        return GrammarSpec("structural_tag", spec.canonical(), (whitespace, False), (spec, False))
    raise AssertionError(rf.type)  # pragma: no cover - pydantic admits no other type


def compile_spec(spec: GrammarSpec, compiler) -> CompiledGrammar:
    """Compile ``spec`` with a :class:`~grammask.grammar.compiler.GrammarCompiler` (blocking)."""
    if spec.kind == "json_object":
        return compiler.compile_builtin_json_grammar(whitespace=spec.options[0], object_only=True)
    if spec.kind == "json_schema":
        whitespace, strict = spec.options
        schema = spec.payload
        if schema is True or schema == {}:
            return compiler.compile_builtin_json_grammar(whitespace=whitespace)
        return compiler.compile_json_schema(schema, whitespace=whitespace, strict=strict)
    if spec.kind == "grammar":
        return compiler.compile_grammar(spec.canonical)
    if spec.kind == "regex":
        return compiler.compile_regex(spec.canonical)
    if spec.kind == "structural_tag":
        tag, strict = spec.payload
        return compiler.compile_structural_tag(tag, strict=strict, whitespace=spec.options[0])
    raise ValueError(f"unknown grammar kind {spec.kind!r}")
