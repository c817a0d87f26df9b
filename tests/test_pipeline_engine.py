"""Loop semantics of AsyncEngine on the scripted deterministic backend (no model weights).

Penalties, stop tokens and strings, length, abort, fast-forward token counts, grammar cache hits,
the compile/prefill and mask/forward overlaps (proved from recorded spans, no wall-clock
thresholds), concurrency, streaming, and error paths.
"""
from __future__ import annotations

import json
import pathlib
import threading

import anyio
import pytest

from grammask.errors import GenerationError, GrammarSyntaxError, InvalidRequestError
from grammask.pipeline import AsyncEngine
from grammask.pipeline.scripted import ScriptedBackend

MSG = [{"role": "user", "content": "hi"}]
PERSON = '{"name": "Alice", "age": 42}'
PERSON_EBNF = 'root ::= "{\\"name\\": \\"" [A-Za-z]+ "\\", \\"age\\": " [0-9]+ "}"'


async def make(responder="Hello world", **kw) -> tuple[AsyncEngine, ScriptedBackend]:
    ekw = {k: kw.pop(k) for k in ("fast_forward", "cache_size", "max_batch", "json_whitespace") if k in kw}
    b = ScriptedBackend(responder, **kw)
    eng = await AsyncEngine.create(b, trace=True, **ekw)
    return eng, b


async def collect(stream) -> tuple[list, str]:
    chunks = [ch async for ch in stream]
    text = "".join(c.delta.content or "" for ch in chunks for c in ch.choices)
    return chunks, text


# ---------------------------------------------------------------------------------------------- basics
async def test_text_completion_and_usage():
    eng, b = await make("Hello world")
    r = await eng.chat.completions.create(messages=MSG, temperature=0)
    assert r.object == "chat.completion" and r.model == "scripted"
    c = r.choices[0]
    assert c.message.role == "assistant" and c.message.content == "Hello world"
    assert c.finish_reason == "stop" and not c.incomplete
    assert r.usage.completion_tokens == len(b.encode("Hello world")) == 2
    assert r.usage.prompt_tokens == len(b.apply_chat_template([{"role": "user", "content": "hi"}]))
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    x = r.usage.extra
    assert x.e2e_latency_s >= x.time_to_first_token_s > 0 and x.prefill_tokens_per_s > 0
    assert not b.live and not eng.active_requests
    await eng.aclose()


async def test_max_tokens_gives_length_and_incomplete():
    eng, b = await make("the the the the the the the the")
    r = await eng.chat.completions.create(messages=MSG, temperature=0, max_tokens=3)
    c = r.choices[0]
    assert c.finish_reason == "length" and c.incomplete
    assert r.usage.completion_tokens == 3
    assert not b.live
    await eng.aclose()


async def test_stop_strings_cut_the_text():
    eng, b = await make("hello world. bye")
    r = await eng.chat.completions.create(messages=MSG, temperature=0, stop=[".", "zzz"])
    assert r.choices[0].message.content == "hello world"
    assert r.choices[0].finish_reason == "stop"
    # a stop string spanning tokens, streamed: the held-back prefix is never sent
    stream = await eng.chat.completions.create(messages=MSG, temperature=0, stop="d. b", stream=True)
    chunks, text = await collect(stream)
    assert text == "hello worl"
    assert chunks[-1].choices[0].finish_reason == "stop"
    await eng.aclose()


async def test_stop_token_only_when_grammar_can_end():
    # the script wants to stop after "ab" but the regex needs three letters
    eng, b = await make("ab")
    r = await eng.chat.completions.create(messages=MSG, temperature=0, response_format={"type": "regex", "pattern": "[a-c]{3}"})
    content = r.choices[0].message.content
    assert len(content) == 3 and set(content) <= set("abc") and content.startswith("ab")
    assert r.choices[0].finish_reason == "stop"
    await eng.aclose()


# ---------------------------------------------------------------------------------------------- sampling knobs
async def test_penalties_change_the_loop():
    eng, _ = await make("xxxxxxxx")
    base = await eng.chat.completions.create(messages=MSG, temperature=0)
    assert base.choices[0].message.content == "xxxxxxxx"
    # 'x' scores 6, '.' 1: frequency 2 makes x fall to 0 after three x's; then the script ends
    r = await eng.chat.completions.create(messages=MSG, temperature=0, frequency_penalty=2.0)
    assert r.choices[0].message.content == "xxx."
    r = await eng.chat.completions.create(messages=MSG, temperature=0, presence_penalty=2.0)
    assert r.choices[0].message.content == "xxxxxxxx"
    r = await eng.chat.completions.create(messages=MSG, temperature=0, repetition_penalty=10.0)
    assert r.choices[0].message.content == "x."
    await eng.aclose()


async def test_logit_bias_never_breaks_the_grammar():
    eng, b = await make("abc")
    y = b.encode("y")[0]
    r = await eng.chat.completions.create(messages=MSG, temperature=0, logit_bias={y: 100}, max_tokens=4)
    assert r.choices[0].message.content == "yyyy"
    r = await eng.chat.completions.create(messages=MSG, temperature=0, logit_bias={str(y): 100}, max_tokens=4,
                                          response_format={"type": "regex", "pattern": "[a-c]+"})
    assert set(r.choices[0].message.content) <= set("abc")
    with pytest.raises(InvalidRequestError) as ei:
        await eng.chat.completions.create(messages=MSG, logit_bias={10**6: 1})
    assert ei.value.param == "logit_bias"
    await eng.aclose()


async def test_seeded_sampling_is_reproducible():
    eng, _ = await make("Hello world")
    outs = []
    for seed in (1, 1, 2, 3, 4):
        r = await eng.chat.completions.create(messages=MSG, temperature=2.0, seed=seed, max_tokens=8)
        outs.append(r.choices[0].message.content)
    assert outs[0] == outs[1]
    assert len(set(outs)) > 1
    # n choices get seed, seed+1, ...
    r = await eng.chat.completions.create(messages=MSG, temperature=2.0, seed=1, max_tokens=8, n=2)
    assert [c.index for c in r.choices] == [0, 1]
    assert r.choices[0].message.content == outs[0]
    await eng.aclose()


async def test_logprobs_and_forced_tokens():
    eng, b = await make(PERSON)
    r = await eng.chat.completions.create(messages=MSG, temperature=0, logprobs=True, top_logprobs=2,
                                          response_format={"type": "grammar", "grammar": PERSON_EBNF})
    lp = r.choices[0].logprobs.content
    assert len(lp) == r.usage.completion_tokens
    assert "".join(t.token for t in lp) == PERSON
    forced = [t for t in lp if t.logprob == 0.0]
    assert len(forced) >= r.usage.extra.forced_tokens > 0
    for t in lp:
        assert t.top_logprobs and t.top_logprobs[0].logprob >= t.logprob - 1e-6
    await eng.aclose()


# ---------------------------------------------------------------------------------------------- grammar
async def test_json_object_mode():
    eng, _ = await make(PERSON)
    r = await eng.chat.completions.create(messages=MSG, temperature=0, response_format={"type": "json_object"})
    assert json.loads(r.choices[0].message.content) == {"name": "Alice", "age": 42}
    # the script wants prose; the grammar makes it an object anyway
    eng2, _ = await make("[1, 2]")
    r = await eng2.chat.completions.create(messages=MSG, temperature=0, max_tokens=40,
                                           response_format={"type": "json_object"})
    assert r.choices[0].message.content.lstrip().startswith("{")  # whitespace is bounded (32)
    await eng.aclose()
    await eng2.aclose()


async def test_fast_forward_counts_and_same_output():
    eng, b = await make(PERSON)
    rf = {"type": "grammar", "grammar": PERSON_EBNF}
    n0 = len(b.calls)
    on = await eng.chat.completions.create(messages=MSG, temperature=0, response_format=rf)
    n1 = len(b.calls)
    off = await eng.chat.completions.create(messages=MSG, temperature=0, response_format=rf, fast_forward=False)
    n2 = len(b.calls)
    assert on.choices[0].message.content == off.choices[0].message.content == PERSON
    # sampled '{"', forced 'name' '": "', sampled 'Alice' '", "', forced 'age' '":' ' ', sampled '42' '}'
    assert on.usage.extra.forced_tokens == 5
    assert off.usage.extra.forced_tokens == 0
    assert on.usage.completion_tokens == off.usage.completion_tokens == 10
    # one prefill, then a forward per sampled token except the last ('}' completes the grammar)
    assert n1 - n0 == 1 + 4
    assert n2 - n1 == 1 + 9
    fed = [c.n_tokens[0] for c in b.calls[n0 + 1:n1]]
    assert fed == [3, 1, 4, 1]  # forced tokens ride along with the sampled one in one forward
    await eng.aclose()


async def test_fast_forward_is_canonical():
    # after '{"' the grammar forces 'name"' but '":' is a token the model would use: keep 'name' only
    eng, b = await make('{"name":42}')
    rf = {"type": "grammar", "grammar": 'root ::= "{\\"name\\"" " "? ":" [0-9]+ "}"'}
    r = await eng.chat.completions.create(messages=MSG, temperature=0, response_format=rf, logprobs=True)
    toks = [t.token for t in r.choices[0].logprobs.content]
    assert toks[:3] == ['{"', "name", '":']
    assert r.choices[0].message.content == '{"name":42}'
    assert r.usage.extra.forced_tokens == 1
    await eng.aclose()


async def test_grammar_cache_hits():
    eng, _ = await make(PERSON)
    rf1 = {"type": "json_object", "schema": {"type": "object"}}
    rf2 = {"type": "json_object", "schema": '{"type":   "object"}'}  # same schema as JSON text
    r1 = await eng.chat.completions.create(messages=MSG, temperature=0, response_format=rf1)
    r2 = await eng.chat.completions.create(messages=MSG, temperature=0, response_format=rf2)
    assert not r1.usage.extra.grammar_cache_hit and r2.usage.extra.grammar_cache_hit
    assert eng.grammar_cache.info["hits"] == 1 and eng.grammar_cache.info["misses"] == 1
    assert r1.choices[0].message.content == r2.choices[0].message.content
    await eng.aclose()


async def test_json_schema_on_scripted_backend():
    pytest.importorskip("grammask.grammar.json_schema")
    jsonschema = pytest.importorskip("jsonschema")
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
              "required": ["name", "age"]}
    eng, _ = await make(PERSON)
    r = await eng.chat.completions.create(messages=MSG, temperature=0, response_format={
        "type": "json_schema", "json_schema": {"name": "p", "schema": schema, "strict": True}})
    assert r.choices[0].message.content == PERSON
    assert r.usage.extra.forced_tokens > 0
    await eng.aclose()
    # the script wants prose: the schema still holds (enum, boolean, forced keys)
    schema = {"type": "object", "properties": {"mood": {"enum": ["happy", "sad"]}, "ok": {"type": "boolean"}},
              "required": ["mood", "ok"], "additionalProperties": False}
    eng, _ = await make("I feel great", json_whitespace="compact")  # else it would pick whitespace
    r = await eng.chat.completions.create(messages=MSG, temperature=0, max_tokens=100, response_format={
        "type": "json_schema", "json_schema": {"name": "m", "schema": schema}})
    assert r.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(r.choices[0].message.content), schema)
    # tools with real parameter schemas
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"location": "Paris"}}\n</tool_call>'
    eng2, _ = await make(call)
    tools = [{"type": "function", "function": {"name": "get_weather", "strict": True, "parameters": {
        "type": "object", "properties": {"location": {"type": "string"}}, "required": ["location"],
        "additionalProperties": False}}}]
    r = await eng2.chat.completions.create(messages=MSG, temperature=0, tools=tools, tool_choice="required")
    assert json.loads(r.choices[0].message.tool_calls[0].function.arguments) == {"location": "Paris"}
    await eng.aclose()
    await eng2.aclose()


async def test_structural_tag_format():
    target = 'ok <f>{"a": 1}</f> done'
    eng, _ = await make(target)
    rf = {"type": "structural_tag", "structures": [{"begin": "<f>", "schema": {}, "end": "</f>"}], "triggers": ["<f>"]}
    r = await eng.chat.completions.create(messages=MSG, temperature=0, response_format=rf)
    assert r.choices[0].message.content == target
    await eng.aclose()


async def test_tools_give_tool_calls():
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"location": "Paris"}}\n</tool_call>'
    eng, _ = await make(call)
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}},
             {"type": "function", "function": {"name": "other", "parameters": {"type": "object"}}}]
    for choice in ("auto", "required", {"type": "function", "function": {"name": "get_weather"}}):
        r = await eng.chat.completions.create(messages=MSG, temperature=0, tools=tools, tool_choice=choice)
        c = r.choices[0]
        assert c.finish_reason == "tool_calls", choice
        assert c.message.content is None
        (tc,) = c.message.tool_calls
        assert tc.function.name == "get_weather" and json.loads(tc.function.arguments) == {"location": "Paris"}
        stream = await eng.chat.completions.create(messages=MSG, temperature=0, tools=tools, tool_choice=choice,
                                                   stream=True)
        chunks, text = await collect(stream)
        assert text == ""
        deltas = [d for ch in chunks for c in ch.choices for d in (c.delta.tool_calls or [])]
        assert [d.function["name"] for d in deltas] == ["get_weather"]
        assert chunks[-1].choices[0].finish_reason == "tool_calls"
    await eng.aclose()
    eng, _ = await make("It is sunny.")
    r = await eng.chat.completions.create(messages=MSG, temperature=0, tools=tools)
    assert r.choices[0].message.content == "It is sunny." and r.choices[0].message.tool_calls is None
    assert r.choices[0].finish_reason == "stop"
    await eng.aclose()


# ---------------------------------------------------------------------------------------------- overlap
async def test_compile_overlaps_prefill():
    """Each side waits (bounded) until the other has started: if the engine ran them one after
    the other, the spans could not overlap and the assertion below fails."""
    compile_started, prefill_started = threading.Event(), threading.Event()

    def on_prefill():
        prefill_started.set()
        compile_started.wait(5)

    eng, b = await make(PERSON, on_prefill=on_prefill)
    real = eng._compile_fn

    def compile_fn(spec, compiler):
        compile_started.set()
        prefill_started.wait(5)
        return real(spec, compiler)

    eng._compile_fn = compile_fn
    r = await eng.chat.completions.create(messages=MSG, temperature=0, response_format={"type": "json_object"})
    comp = [t for t in eng.trace if t["kind"] == "compile" and t["request_id"] == r.id]
    pre = [t for t in eng.trace if t["kind"] == "forward" and r.id in t["prefill_ids"]]
    assert len(comp) == 1 and len(pre) == 1
    c, p = comp[0], pre[0]
    assert c["start"] < p["end"] and p["start"] < c["end"], (c, p)
    await eng.aclose()


async def test_mask_fill_overlaps_forward():
    """The step's mask fill and its forward run at the same time: each worker thread, once
    started, waits (bounded) until the other one has started too. Run one after the other, the
    first would wait out its bound and record a miss."""
    mask_started, forward_started = threading.Event(), threading.Event()
    eng, b = await make(PERSON)
    real_fill = eng._fill_masks
    met_forward: dict[int, bool] = {}   # per step: the mask thread saw the forward start
    met_mask: list[bool] = []      # per decode step: the forward thread saw the mask start

    def fill(matchers, bitmask):
        mask_started.set()
        step_no = eng._step_no   # set before the step starts its threads
        met_forward[step_no] = forward_started.wait(5)
        return real_fill(matchers, bitmask)

    def on_forward(prefill):
        forward_started.set()
        if not prefill:   # a prefill step may have no mask to wait for
            met_mask.append(mask_started.wait(5))

    real_step = eng._step

    async def step():
        mask_started.clear()   # arm the barrier for this step's two threads
        forward_started.clear()
        await real_step()

    eng._fill_masks = fill
    eng._step = step
    b.on_forward = on_forward
    await eng.chat.completions.create(messages=MSG, temperature=0, response_format={"type": "json_object"},
                                      fast_forward=False)
    fwd = {t["step"] for t in eng.trace if t["kind"] == "forward" and not t["prefill_ids"]}
    masks = {t["step"] for t in eng.trace if t["kind"] == "mask"}
    assert len(fwd) >= 5 and fwd <= masks   # every decode forward had its step's mask fill
    assert len(met_mask) == len(fwd) and all(met_mask), met_mask
    assert all(met_forward[k] for k in fwd), met_forward
    await eng.aclose()


# ---------------------------------------------------------------------------------------------- concurrency
async def test_concurrent_requests_are_batched_and_independent():
    targets = {"a": PERSON, "b": '{"name": "Bob", "age": 100}', "c": "Hello world"}
    eng, b = await make(lambda prompt: next(v for k, v in targets.items() if f"\n{k}\n" in prompt))

    def msgs(k):
        return [{"role": "user", "content": f"\n{k}"}]

    solo = {}
    for k in targets:
        rf = None if k == "c" else {"type": "json_object"}
        solo[k] = (await eng.chat.completions.create(messages=msgs(k), temperature=0, response_format=rf)).choices[0].message.content
    assert solo == targets
    n0 = len(b.calls)
    results = {}

    async def one(k):
        rf = None if k == "c" else {"type": "json_object"}
        results[k] = (await eng.chat.completions.create(messages=msgs(k), temperature=0, response_format=rf)).choices[0].message.content

    async with anyio.create_task_group() as tg:
        for k in targets:
            tg.start_soon(one, k)
    assert results == solo
    assert max(c.n_seqs for c in b.calls[n0:]) == 3
    assert not b.live and not eng.active_requests
    await eng.aclose()


async def test_streams_interleave_fairly():
    eng, b = await make("the the the the the the")
    order = []

    async def consume(name):
        s = await eng.chat.completions.create(messages=MSG, temperature=0, stream=True)
        async for ch in s:
            if ch.choices and ch.choices[0].delta.content:
                order.append(name)

    async with anyio.create_task_group() as tg:
        tg.start_soon(consume, "x")
        tg.start_soon(consume, "y")
    assert order.count("x") == order.count("y") == 6
    # neither stream finished before the other started producing
    last_x = len(order) - 1 - order[::-1].index("x")
    assert order.index("y") < last_x
    await eng.aclose()


# ---------------------------------------------------------------------------------------------- abort
async def test_interrupt_and_close_stop_at_once():
    eng, b = await make("the " * 200, forward_delay=0.002)
    stream = await eng.chat.completions.create(messages=MSG, temperature=0, stream=True)
    n = 0
    async for ch in stream:
        if ch.choices and ch.choices[0].delta.content:
            n += 1
            if n == 3:
                assert eng.interrupt(stream.request_id)
        if ch.choices and ch.choices[0].finish_reason:
            assert ch.choices[0].finish_reason == "abort"
    assert n <= 4
    assert not b.live and not eng.active_requests
    # closing the iterator
    stream = await eng.chat.completions.create(messages=MSG, temperature=0, stream=True)
    async for ch in stream:
        if ch.choices and ch.choices[0].delta.content:
            break
    await stream.aclose()
    assert not b.live and not eng.active_requests
    # cancelling a non-streaming call stops it between two steps, long before its 200 tokens
    calls = []
    b.on_forward = lambda *a, **k: calls.append(1)
    with anyio.move_on_after(0.05):
        await eng.chat.completions.create(messages=MSG, temperature=0)
    b.on_forward = None
    assert not b.live and not eng.active_requests
    assert len(calls) < 150, f"{len(calls)} forward calls after the caller was cancelled"
    # dropping a stream without closing it (break, then garbage)
    stream = await eng.chat.completions.create(messages=MSG, temperature=0, stream=True)
    async for ch in stream:
        if ch.choices and ch.choices[0].delta.content:
            break
    del stream, ch
    import gc
    gc.collect()
    # the engine still works
    r = await eng.chat.completions.create(messages=MSG, temperature=0, max_tokens=2)
    assert r.choices[0].message.content == "the the"
    assert not b.live and not eng.active_requests
    assert not eng.interrupt("no-such-request")
    await eng.aclose()


async def test_aclose_aborts_everything():
    eng, b = await make("the " * 200, forward_delay=0.002)
    stream = await eng.chat.completions.create(messages=MSG, temperature=0, stream=True)
    await stream.__anext__()
    await stream.__anext__()
    await eng.aclose()
    rest = [ch async for ch in stream]
    assert rest[-1].choices[0].finish_reason == "abort"
    assert not b.live
    from grammask.errors import EngineClosedError
    with pytest.raises(EngineClosedError):
        await eng.chat.completions.create(messages=MSG)


# ---------------------------------------------------------------------------------------------- streaming
async def test_streaming_equals_non_streaming_and_utf8():
    target = "日本語 é café 😀!"
    eng, b = await make(target)
    r = await eng.chat.completions.create(messages=MSG, temperature=0)
    assert r.choices[0].message.content == target
    stream = await eng.chat.completions.create(messages=MSG, temperature=0, stream=True,
                                               stream_options={"include_usage": True})
    chunks, text = await collect(stream)
    assert text == target
    assert all("\ufffd" not in (c.delta.content or "") for ch in chunks for c in ch.choices)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-2].choices[0].finish_reason == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == r.usage.completion_tokens
    assert all(ch.usage is None for ch in chunks[:-1])
    assert len({ch.id for ch in chunks}) == 1 and chunks[0].object == "chat.completion.chunk"
    await eng.aclose()


async def test_streaming_grammar_and_n():
    eng, _ = await make(PERSON)
    stream = await eng.chat.completions.create(messages=MSG, temperature=0, stream=True, n=2,
                                               response_format={"type": "grammar", "grammar": PERSON_EBNF})
    chunks, _ = await collect(stream)
    per = {0: "", 1: ""}
    for ch in chunks:
        for c in ch.choices:
            per[c.index] += c.delta.content or ""
    assert per == {0: PERSON, 1: PERSON}
    await eng.aclose()


# ---------------------------------------------------------------------------------------------- errors
async def test_compile_error_fails_cleanly():
    eng, b = await make(PERSON)
    for stream in (False, True):
        with pytest.raises(GrammarSyntaxError):
            await eng.chat.completions.create(messages=MSG, stream=stream,
                                              response_format={"type": "grammar", "grammar": "root ::= ("})
        assert not b.live and not eng.active_requests
    r = await eng.chat.completions.create(messages=MSG, temperature=0, response_format={"type": "json_object"})
    assert json.loads(r.choices[0].message.content)
    await eng.aclose()


async def test_rejected_token_is_an_error_not_free_text(monkeypatch):
    from grammask.grammar.matcher import GrammarMatcher

    eng, b = await make(PERSON)
    monkeypatch.setattr(GrammarMatcher, "accept_token", lambda self, t, **kw: False)
    with pytest.raises(GenerationError) as ei:
        await eng.chat.completions.create(messages=MSG, temperature=0, response_format={"type": "json_object"})
    assert ei.value.request_id
    assert not b.live and not eng.active_requests
    monkeypatch.undo()
    r = await eng.chat.completions.create(messages=MSG, temperature=0, response_format={"type": "json_object"})
    assert json.loads(r.choices[0].message.content)
    await eng.aclose()


async def test_backend_failure_is_a_generation_error():
    eng, b = await make(PERSON)

    def boom(prefill):
        if not prefill:
            raise RuntimeError("device lost")

    b.on_forward = boom
    with pytest.raises(GenerationError, match="device lost"):
        await eng.chat.completions.create(messages=MSG, temperature=0)
    assert not b.live
    await eng.aclose()


async def test_bad_requests_generate_nothing():
    eng, b = await make(PERSON)
    bad = [
        dict(messages=[]),
        dict(messages=MSG, response_format={"type": "xml"}),
        dict(messages=MSG, response_format={"type": "json_schema", "json_schema": {"schema": {}}}),
        dict(messages=MSG, top_logprobs=3),
        dict(messages=MSG, stream_options={"include_usage": True}),
        dict(messages=MSG, temperature=3),
        dict(messages=[{"role": "user", "content": "x" * 5000}]),
        dict(messages=MSG, response_format={"type": "json_object"}, tools=[{"type": "function", "function": {"name": "f"}}]),
    ]
    for kw in bad:
        with pytest.raises(InvalidRequestError):
            await eng.chat.completions.create(**kw)
    assert not b.calls and not b.live
    await eng.aclose()


async def test_create_needs_a_backend():
    """The pipeline only receives backends; loading a model by name is grammask.adapters.models'."""
    for model in (None, "some/model", pathlib.Path("model.gguf")):
        with pytest.raises(TypeError, match="create_engine"):
            await AsyncEngine.create(model)
