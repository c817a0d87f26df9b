"""Request validation, response_format specs and cache keys, structural-tag grammars, streaming
text assembly (no model)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from grammask.errors import GrammarError, InvalidRequestError, InvalidSchemaError
from grammask.grammar.compiled import CompiledGrammar
from grammask.grammar.matcher import GrammarMatcher
from grammask.pipeline.protocol import ChatCompletionRequest, parse_request
from grammask.pipeline.response_format import grammar_spec
from grammask.pipeline.scripted import ScriptedBackend
from grammask.pipeline.streaming import TextAssembler
from grammask.grammar.structural_tag import TagSpec, TagStructure, structural_tag_grammar
from grammask.pipeline.structural_tag import parse_tool_calls, tools_tag_spec

MSG = [{"role": "user", "content": "hi"}]


# ---------------------------------------------------------------------------------------------- validation
@pytest.mark.parametrize("kw, param", [
    (dict(messages=[]), "messages"),
    (dict(messages=[{"role": "robot", "content": "x"}]), "messages.0.role"),
    (dict(messages=MSG, response_format={"type": "xml"}), "response_format"),
    (dict(messages=MSG, response_format={"type": "json_object", "schema": "{not json"}), "response_format.schema"),
    (dict(messages=MSG, response_format={"type": "json_object", "schema": 12}), "response_format.schema"),
    (dict(messages=MSG, response_format={"type": "json_schema", "json_schema": {"schema": {}}}),
     "response_format.json_schema.name"),
    (dict(messages=MSG, response_format={"type": "json_schema", "json_schema": {"name": "a b", "schema": {}}}),
     "response_format.json_schema.name"),
    (dict(messages=MSG, response_format={"type": "json_schema", "json_schema": {"name": "x"}}),
     "response_format.json_schema.schema"),
    (dict(messages=MSG, response_format={"type": "grammar", "grammar": ""}), "response_format.grammar"),
    (dict(messages=MSG, response_format={"type": "regex"}), "response_format.pattern"),
    (dict(messages=MSG, response_format={"type": "json_object", "extra": 1}), "response_format.extra"),
    (dict(messages=MSG, response_format={"type": "structural_tag", "structures": [{"begin": "<a>", "schema": {}}],
                                         "triggers": ["<b>"]}), "response_format"),
    (dict(messages=MSG, temperature=-1), "temperature"),
    (dict(messages=MSG, top_p=0), "top_p"),
    (dict(messages=MSG, max_tokens=0), "max_tokens"),
    (dict(messages=MSG, n=0), "n"),
    (dict(messages=MSG, frequency_penalty=3), "frequency_penalty"),
    (dict(messages=MSG, repetition_penalty=0), "repetition_penalty"),
    (dict(messages=MSG, stop=[""]), "stop"),
    (dict(messages=MSG, logit_bias={"5": 101}), "logit_bias"),
    (dict(messages=MSG, logit_bias={"x": 1}), "logit_bias.x.[key]"),
    (dict(messages=MSG, top_logprobs=2), "top_logprobs"),
    (dict(messages=MSG, top_logprobs=21, logprobs=True), "top_logprobs"),
    (dict(messages=MSG, stream_options={"include_usage": True}), "stream_options"),
    (dict(messages=MSG, tool_choice="auto"), "tool_choice"),
    (dict(messages=MSG, tools=[{"type": "function", "function": {"name": "f"}}],
          tool_choice={"type": "function", "function": {"name": "g"}}), "tool_choice"),
    (dict(messages=MSG, tools=[{"type": "function", "function": {"name": "f"}}] * 2), "tools"),
    (dict(messages=MSG, tools=[{"type": "function", "function": {"name": "f"}}],
          response_format={"type": "json_object"}), "response_format"),
    (dict(messages=MSG, ignore_eos=True, response_format={"type": "json_object"}), "ignore_eos"),
    (dict(messages=MSG, max_tokens=3, max_completion_tokens=4), "max_completion_tokens"),
    (dict(messages=MSG, bogus=1), "bogus"),
    (dict(messages=MSG, canonical="yes"), "canonical"),
    (dict(messages=MSG, canonical=1), "canonical"),
    (dict(messages=MSG, canonical="true"), "canonical"),
    (dict(messages=MSG, response_format={"type": "regex", "pattern": "a", "canonical": "true"}),
     "response_format.canonical"),
    (dict(messages=MSG, response_format={"type": "text", "canonical": True}), "response_format.canonical"),
    (dict(messages=MSG, canonical=True, response_format={"type": "json_object", "canonical": False}), "canonical"),
])
def test_invalid_requests_raise_typed_errors(kw, param):
    with pytest.raises(InvalidRequestError) as ei:
        parse_request(**kw)
    assert ei.value.param == param
    assert isinstance(ei.value, ValueError)


def test_valid_requests():
    r = parse_request(messages=MSG, stop="x", logit_bias={"5": -3}, max_completion_tokens=7,
                      response_format={"type": "json_object", "schema": '{"type": "object"}'})
    assert r.stop == ["x"] and r.logit_bias == {5: -3.0} and r.completion_limit == 7
    assert r.response_format.schema_ == {"type": "object"}
    r = parse_request({"messages": MSG, "response_format": {"type": "structural_tag", "structural_tag": json.dumps(
        {"structures": [{"begin": "<a>", "schema": {}, "end": "</a>"}], "triggers": ["<a"]})}})
    assert r.response_format.triggers == ["<a"]
    r2 = parse_request(r, temperature=0)
    assert r2.temperature == 0 and r2.response_format.triggers == ["<a"]
    assert isinstance(parse_request(ChatCompletionRequest(messages=MSG)), ChatCompletionRequest)
    # content parts
    r = parse_request(messages=[{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}])
    assert r.messages[0].text() == "ab"


def test_canonical_in_the_request_or_its_response_format():
    assert parse_request(messages=MSG).canonical_requested is None
    assert parse_request(messages=MSG, canonical=False).canonical_requested is False
    for rf in ({"type": "json_object"}, {"type": "regex", "pattern": "a"}, {"type": "grammar", "grammar": 'root ::= "a"'},
               {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}},
               {"type": "structural_tag", "structures": [{"begin": "<a>", "schema": {}}], "triggers": ["<a"]}):
        r = parse_request(messages=MSG, response_format={**rf, "canonical": True})
        assert r.canonical_requested is True and r.canonical is None
        assert parse_request(messages=MSG, canonical=True, response_format={**rf, "canonical": True}).canonical_requested
        # the grammar (its cache key) does not depend on canonical: only the matcher does
        assert grammar_spec(r) == grammar_spec(parse_request(messages=MSG, response_format=rf))
    r = parse_request(messages=MSG, response_format={"type": "regex", "pattern": "a", "canonical": True})
    assert parse_request(r, temperature=0).canonical_requested is True
    with pytest.raises(InvalidRequestError, match="disagree"):
        parse_request(messages=MSG, canonical=False, response_format={"type": "regex", "pattern": "a",
                                                                      "canonical": True})


def test_invalid_schema_is_typed():
    req = parse_request(messages=MSG, response_format={"type": "json_schema",
                                                       "json_schema": {"name": "x", "schema": {"type": 12}}})
    with pytest.raises(InvalidSchemaError):
        grammar_spec(req)
    assert issubclass(InvalidSchemaError, GrammarError)


def test_cache_key_is_canonical():
    a = grammar_spec(parse_request(messages=MSG, response_format={
        "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "properties": {"a": {}, "b": {}}}}}))
    b = grammar_spec(parse_request(messages=MSG, response_format={
        "type": "json_schema", "json_schema": {"name": "y", "schema": json.dumps({"properties": {"b": {}, "a": {}}, "type": "object"})}}))
    c = grammar_spec(parse_request(messages=MSG, response_format={
        "type": "json_schema", "json_schema": {"name": "y", "strict": True, "schema": {"type": "object"}}}))
    assert a.key("tok") != b.key("tok")  # property order is output order: a different grammar
    b2 = grammar_spec(parse_request(messages=MSG, response_format={
        "type": "json_schema", "json_schema": {"name": "y", "schema": json.dumps({"properties": {"a": {}, "b": {}}, "type": "object"})}}))
    assert a.key("tok") == b2.key("tok")  # same schema, other keyword order, as JSON text
    assert a.key("tok") != a.key("other tokenizer")
    assert a.key("tok") != c.key("tok")
    assert grammar_spec(parse_request(messages=MSG)) is None
    assert grammar_spec(parse_request(messages=MSG, response_format={"type": "text"})) is None
    assert grammar_spec(parse_request(messages=MSG, response_format={"type": "json_object"})).kind == "json_object"


# ---------------------------------------------------------------------------------------------- structural tags
def _matches(cg, text: str) -> bool:
    m = GrammarMatcher(cg, stop_token_ids=[0])
    return m.accept_string(text) and m.can_terminate()


def test_structural_tag_grammar_language():
    info = ScriptedBackend().tokenizer_info
    spec = TagSpec((TagStructure("<f=a>", {}, "</f>"), TagStructure("<f=b>", {}, "</f>")), ("<f=",))
    cg = CompiledGrammar(structural_tag_grammar(spec), info, check_lexemes=False)
    assert _matches(cg, "just text, even <f and f= and <f-")
    assert _matches(cg, 'x <f=a>{"k": [1]}</f> y <f=b>2 \n</f>')
    assert _matches(cg, "")
    assert not _matches(cg, "x <f=c>1</f>")          # no structure begins with <f=c
    assert not _matches(cg, "x <f=a>{bad}</f>")      # body is not JSON
    assert not _matches(cg, 'x <f=a>{"k": 1}')       # tag not closed
    # the first trigger occurrence starts a tag: text cannot "skip over" it
    m = GrammarMatcher(cg, stop_token_ids=[0])
    assert m.accept_string("hi <f=")
    assert not m.can_terminate()


def test_required_tools_grammar_and_parse():
    from grammask.pipeline.protocol import Tool

    tools = [Tool.model_validate({"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}})]
    info = ScriptedBackend().tokenizer_info
    spec = tools_tag_spec(tools, "required")
    cg = CompiledGrammar(structural_tag_grammar(spec), info, check_lexemes=False)
    one = '<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>'
    assert _matches(cg, one)
    assert _matches(cg, one + "\n" + one)
    assert not _matches(cg, "text " + one)
    assert not _matches(cg, "")
    text, calls = parse_tool_calls("pre " + one + " post", spec)
    assert text == "pre  post"
    assert calls == [{"name": "f", "arguments": {"a": 1}, "begin": spec.structures[0].begin}]
    # a cut-short tag stays text
    text, calls = parse_tool_calls(one[:-5], spec)
    assert calls == [] and text == one[:-5]


# ---------------------------------------------------------------------------------------------- text assembly
def test_text_assembler_utf8_and_stop():
    t = TextAssembler(stop=["END"])
    data = "añ日😀".encode()
    for i in range(len(data)):
        t.push(data[i:i + 1])
        assert "\ufffd" not in t.text
    assert t.text == "añ日😀"
    t.push(b"xxE")
    assert t.text.endswith("xxE") and t.safe_end() == len(t.text) - 1  # "E" may start "END"
    t.push(b"N")
    assert t.safe_end() == len(t.text) - 2
    assert t.push(b"D more") and t.stopped
    assert t.text == "añ日😀xx" and t.safe_end() == len(t.text)
    t2 = TextAssembler()
    t2.push(b"ab\xe6\x97")  # cut inside a character
    assert t2.text == "ab" and t2.finish() == "ab\ufffd"


def test_text_assembler_triggers():
    t = TextAssembler(triggers=["<tool_call>"])
    t.push(b"hello <tool")
    assert t.safe_end() == len("hello ")
    t.push(b"_call>{")
    assert t.trigger_at == len("hello ") and t.safe_end() == len("hello ")


def test_bitmask_shapes_unchanged():
    # the engine relies on int32 [rows, words] masks filled row by row
    info = ScriptedBackend().tokenizer_info
    from grammask.grammar.compiler import GrammarCompiler

    cg = GrammarCompiler(info).compile_regex("[ab]")
    bm = np.zeros((2, (info.vocab_size + 31) // 32), np.int32)
    GrammarMatcher(cg).fill_next_token_bitmask(bm, 1)
    assert bm[0].sum() == 0 and bm[1].any()


def test_parse_tool_calls_drops_a_cut_tag_after_complete_ones():
    from grammask.pipeline.protocol import Tool

    tools = [Tool.model_validate({"type": "function", "function": {"name": "f"}})]
    spec = tools_tag_spec(tools, "auto")
    one = '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>'
    for cut in ("\n<tool_call>", '\n<tool_call>\n{"name": "f", "argu', "\n" + one[:-3]):
        text, calls = parse_tool_calls("a " + one + cut, spec)
        assert text == "a " + "\n" and len(calls) == 1, cut
