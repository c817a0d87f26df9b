"""The engine on the real embedded model (SmolLM2-135M-Instruct via transformers, CPU or CUDA).

Skipped when transformers or the embedded model file is missing. Kept short: a few generations
of at most 60 tokens.
"""
from __future__ import annotations

import json

import pytest

jsonschema = pytest.importorskip("jsonschema")
pytest.importorskip("transformers")
pytest_asyncio = pytest.importorskip("pytest_asyncio")

from grammask.errors import GrammarError, InvalidRequestError  # noqa: E402

try:
    from grammask.adapters.models import embedded_model_path
    from grammask.adapters.transformers_backend import TransformersBackend  # noqa: F401

    embedded_model_path()
except Exception as e:  # pragma: no cover - depends on the installation
    pytest.skip(f"the embedded model is not available: {e}", allow_module_level=True)

from grammask.adapters.models import create_engine  # noqa: E402

pytestmark = pytest.mark.asyncio(loop_scope="module")

SCHEMAS = {
    "person": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                                "age": {"type": "integer", "minimum": 0, "maximum": 120}},
               "required": ["name", "age"], "additionalProperties": False},
    "sentiment": {"type": "object", "properties": {"sentiment": {"enum": ["positive", "negative", "neutral"]},
                                                   "confident": {"type": "boolean"}},
                  "required": ["sentiment", "confident"], "additionalProperties": False},
    "colors": {"type": "object", "properties": {"colors": {"type": "array", "minItems": 1, "maxItems": 3,
                                                           "items": {"enum": ["red", "green", "blue"]}}},
               "required": ["colors"], "additionalProperties": False},
    "address": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                                 "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                "required": ["city", "zip"], "additionalProperties": False},
    "measure": {"type": "object", "properties": {"value": {"anyOf": [{"type": "number", "minimum": 0,
                                                                      "maximum": 1000}, {"type": "null"}]},
                                                 "unit": {"const": "kg"}},
                "required": ["value", "unit"], "additionalProperties": False},
}

PROMPTS = {
    "person": "Alice is 31 years old. Give her name and age as JSON.",
    "sentiment": "Classify the sentiment of: 'I love this phone!' as JSON.",
    "colors": "List two primary colors as JSON.",
    "address": "Paris, zip code 75001. Give city and zip as JSON.",
    "measure": "The bag weighs 12 kg. Give value and unit as JSON.",
}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engine():
    eng = await create_engine()
    yield eng
    await eng.aclose()


@pytest.mark.parametrize("name", list(SCHEMAS))
async def test_schema_outputs_validate(engine, name):
    schema = SCHEMAS[name]
    r = await engine.chat.completions.create(
        messages=[{"role": "user", "content": PROMPTS[name]}], temperature=0, max_tokens=60,
        response_format={"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}})
    c = r.choices[0]
    assert c.finish_reason == "stop", c.message.content
    jsonschema.validate(json.loads(c.message.content), schema)
    assert r.usage.extra.grammar_init_s > 0 and r.usage.completion_tokens > 0


async def test_streaming_equals_non_streaming(engine):
    kw = dict(messages=[{"role": "user", "content": "Describe a red apple as a JSON object."}], temperature=0,
              max_tokens=30, response_format={"type": "json_object"})
    r = await engine.chat.completions.create(**kw)
    stream = await engine.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw)
    chunks = [ch async for ch in stream]
    text = "".join(c.delta.content or "" for ch in chunks for c in ch.choices)
    assert text == r.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == r.usage.completion_tokens
    assert chunks[-2].choices[0].finish_reason == r.choices[0].finish_reason


async def test_free_text_generation(engine):
    r = await engine.chat.completions.create(messages=[{"role": "user", "content": "Say hello."}], temperature=0,
                                             max_tokens=12)
    assert r.choices[0].message.content and r.usage.completion_tokens <= 12


@pytest.mark.parametrize("rf, err", [
    ({"type": "grammar", "grammar": "root ::= foo"}, GrammarError),
    ({"type": "regex", "pattern": "(a"}, GrammarError),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}, GrammarError),
    ({"type": "json_object", "schema": "[1, 2"}, InvalidRequestError),
    ({"type": "jsonish"}, InvalidRequestError),
])
async def test_bad_response_format_raises_typed_errors(engine, rf, err):
    with pytest.raises(err):
        await engine.chat.completions.create(messages=[{"role": "user", "content": "hi"}], max_tokens=5,
                                             response_format=rf)
    assert not engine.active_requests
