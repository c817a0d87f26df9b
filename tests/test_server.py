"""The OpenAI-compatible server (grammask.adapters.server) through the official ``openai`` client.

Every test runs uvicorn on 127.0.0.1 on a free port (in a thread). Most use the scripted backend
(fast, deterministic: it "wants" to write the text after ``REPLY:`` in the prompt); the last
group runs the embedded SmolLM2-135M model (skipped when it is not installed) with small
``max_tokens``.
"""
from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import threading
import time
from typing import Literal

import pytest
from _support import server_deps, user, wait_until

openai = pytest.importorskip("openai")
jsonschema, httpx = server_deps()

from pydantic import BaseModel, Field  # noqa: E402
from starlette.applications import Starlette  # noqa: E402
from starlette.routing import Mount  # noqa: E402

from grammask.adapters.server import create_app, serve_in_thread  # noqa: E402
from grammask.pipeline.scripted import ScriptedBackend  # noqa: E402


def reply(prompt: str) -> str:
    return prompt.split("REPLY:", 1)[1].strip() if "REPLY:" in prompt else "Hello world"


def scripted(**kw) -> ScriptedBackend:
    return ScriptedBackend(reply, **kw)


def client(url: str, **kw) -> "openai.OpenAI":
    return openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=120, **kw)


PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}
WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "strict": True, "parameters": {
        "type": "object", "properties": {"location": {"type": "string"}}, "required": ["location"],
        "additionalProperties": False}}}


class Person(BaseModel):
    name: str
    age: int


# ---------------------------------------------------------------------------------------------- scripted
@pytest.fixture(scope="module")
def app():
    return create_app(model=scripted(), max_concurrency=8, max_queue=32)


@pytest.fixture(scope="module")
def url(app):
    with serve_in_thread(app) as u:
        yield u


def test_models_and_health(url):
    c = client(url)
    models = c.models.list()
    assert [m.id for m in models.data] == ["scripted"]
    assert c.models.retrieve("scripted").id == "scripted"
    with pytest.raises(openai.NotFoundError) as ei:
        c.models.retrieve("gpt-4")
    assert ei.value.body["code"] == "model_not_found"
    h = httpx.get(url + "/health")
    assert h.status_code == 200 and h.json()["status"] == "ok" and h.json()["max_concurrency"] == 8


def test_json_object_and_json_schema_strict(url):
    c = client(url)
    r = c.chat.completions.create(model="scripted", messages=user('REPLY: {"name": "Alice", "age": 42}'),
                                  response_format={"type": "json_object"}, temperature=0)
    assert json.loads(r.choices[0].message.content) == {"name": "Alice", "age": 42}
    assert r.choices[0].finish_reason == "stop" and r.usage.completion_tokens > 0
    r = c.chat.completions.create(
        model="scripted", messages=user('REPLY: {"name": "Bob", "age": 100}'), temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}})
    jsonschema.validate(json.loads(r.choices[0].message.content), PERSON)
    # the scripted model wants free text: the grammar still forces a valid object
    r = c.chat.completions.create(
        model="scripted", messages=user("REPLY: hello"), temperature=0, max_tokens=200,
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}})
    assert r.choices[0].finish_reason in ("stop", "length")
    if r.choices[0].finish_reason == "stop":
        jsonschema.validate(json.loads(r.choices[0].message.content), PERSON)


def test_parse_with_pydantic(url):
    r = client(url).chat.completions.parse(model="scripted", messages=user('REPLY: {"name": "Alice", "age": 42}'),
                                           response_format=Person, temperature=0)
    assert r.choices[0].message.parsed == Person(name="Alice", age=42)


def test_streaming_with_usage(url):
    c = client(url)
    stream = c.chat.completions.create(model="scripted", messages=user('REPLY: {"name": "Alice"}'), temperature=0,
                                       stream=True, stream_options={"include_usage": True},
                                       response_format={"type": "json_object"})
    chunks = list(stream)
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert json.loads(text) == {"name": "Alice"}
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0
    assert chunks[-2].choices[0].finish_reason == "stop"
    # raw SSE: data lines, ending with [DONE]
    body = {"model": "m", "messages": user("REPLY: Hello world"), "stream": True, "temperature": 0}
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=60) as resp:
        assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/event-stream")
        lines = [ln for ln in resp.iter_lines() if ln]
    assert all(ln.startswith("data: ") for ln in lines) and lines[-1] == "data: [DONE]"
    assert "".join(json.loads(ln[6:])["choices"][0]["delta"].get("content", "") for ln in lines[:-1]
                   if json.loads(ln[6:])["choices"]) == "Hello world"


def test_tools_strict_gives_parsed_tool_calls(url):
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"location": "Paris"}}\n</tool_call>'

    class GetWeather(BaseModel):
        location: str

    c = client(url)
    r = c.chat.completions.create(model="scripted", messages=user("REPLY: " + call), tools=[WEATHER_TOOL],
                                  tool_choice="required", temperature=0)
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls"
    assert ch.message.tool_calls[0].function.name == "get_weather"
    assert json.loads(ch.message.tool_calls[0].function.arguments) == {"location": "Paris"}
    r = c.chat.completions.parse(model="scripted", messages=user("REPLY: " + call), temperature=0,
                                 tools=[openai.pydantic_function_tool(GetWeather, name="get_weather")])
    assert r.choices[0].message.tool_calls[0].function.parsed_arguments == GetWeather(location="Paris")


@pytest.mark.parametrize("rf, code, where", [
    ({"type": "json_schema", "json_schema": {"name": "x", "strict": True, "schema": {
        "type": "object", "properties": {"age": {"type": "integr"}}}}}, "invalid_schema", "#/properties/age/type"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "object", "properties": {"a": {"type": "string", "pattern": "(?<=a)b"}}}}},
     "unsupported_schema", "#/properties/a/pattern"),
    ({"type": "regex", "pattern": "(a"}, "invalid_grammar", None),
    ({"type": "grammar", "grammar": "root ::= undefined_rule"}, "invalid_grammar", None),
    ({"type": "json_object", "schema": "[1, 2"}, "invalid_request", None),
    ({"type": "jsonish"}, "invalid_request", None),
])
def test_bad_formats_are_400_with_openai_errors(app, url, rf, code, where):
    c = client(url)
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as ei:
            c.chat.completions.create(model="scripted", messages=user("hi"), response_format=rf, stream=stream)
        err = ei.value.body
        assert set(err) == {"message", "type", "param", "code"} and err["type"] == "invalid_request_error"
        assert err["code"] == code and err["param"] and err["param"].startswith("response_format")
        if where:
            assert where in err["message"]
    assert wait_until(lambda: not app.state.grammask.engine.active_requests and app.state.grammask.slots.active == 0)


def test_invalid_requests(url):
    c = client(url)
    with pytest.raises(openai.BadRequestError) as ei:
        c.chat.completions.create(model="m", messages=user("hi"), temperature=5)
    assert ei.value.body["param"] == "temperature"
    with pytest.raises(openai.BadRequestError) as ei:
        c.chat.completions.create(model="m", messages=user("hi"), extra_body={"frobnicate": 1})
    assert ei.value.body["param"] == "frobnicate"
    with pytest.raises(openai.BadRequestError) as ei:  # tool schema errors name the tools
        c.chat.completions.create(model="m", messages=user("hi"), tools=[{"type": "function", "function": {
            "name": "f", "parameters": {"type": "object", "properties": {"x": {"type": 3}}}}}])
    assert ei.value.body["param"] == "tools" and "#/properties/x/type" in ei.value.body["message"]
    # OpenAI fields that change nothing here are accepted
    r = c.chat.completions.create(model="m", messages=user("REPLY: ok"), temperature=0, store=False, metadata={"a": "b"})
    assert r.choices[0].message.content == "ok"
    r = httpx.post(url + "/v1/chat/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
    r = httpx.post(url + "/v1/chat/completions", json=[1, 2])
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    r = httpx.get(url + "/v1/nothing")
    assert r.status_code == 404 and set(r.json()["error"]) == {"message", "type", "param", "code"}
    r = httpx.get(url + "/v1/chat/completions")
    assert r.status_code == 405 and "error" in r.json()


def test_canonical_option_errors_are_400(app, url):
    c = client(url)
    rf = {"type": "regex", "pattern": "[a-z ]+"}
    for stream in (False, True):
        # not a bool (no coercion of "true" or 1)
        for bad in ("true", 1, "yes", [True]):
            with pytest.raises(openai.BadRequestError) as ei:
                c.chat.completions.create(model="m", messages=user("hi"), response_format=rf, stream=stream,
                                          extra_body={"canonical": bad})
            assert ei.value.body["param"] == "canonical" and ei.value.body["type"] == "invalid_request_error"
        with pytest.raises(openai.BadRequestError) as ei:
            c.chat.completions.create(model="m", messages=user("hi"), stream=stream,
                                      response_format={**rf, "canonical": "1"})
        assert ei.value.body["param"] == "response_format.canonical"
        with pytest.raises(openai.BadRequestError) as ei:   # the two places disagree
            c.chat.completions.create(model="m", messages=user("hi"), stream=stream,
                                      response_format={**rf, "canonical": True}, extra_body={"canonical": False})
        assert ei.value.body["param"] == "canonical" and "disagree" in ei.value.body["message"]
        # the scripted vocabulary is no BPE: canonical=True is refused with the reason, never free text
        for kw, param in (({"extra_body": {"canonical": True}}, "canonical"),
                          ({"response_format": {**rf, "canonical": True}}, "response_format.canonical")):
            kw = {"response_format": rf, **kw}
            with pytest.raises(openai.BadRequestError) as ei:
                c.chat.completions.create(model="m", messages=user("REPLY: hello"), stream=stream, **kw)
            err = ei.value.body
            assert err["type"] == "invalid_request_error" and err["code"] == "canonical_unsupported"
            assert err["param"] == param and "keeps no tokenizer" in err["message"]
    r = c.chat.completions.create(model="m", messages=user("REPLY: hello"), temperature=0, response_format=rf,
                                  extra_body={"canonical": False})
    assert r.choices[0].message.content == "hello"
    assert wait_until(lambda: not app.state.grammask.engine.active_requests and app.state.grammask.slots.active == 0)


def test_canonical_per_request_over_http():
    """A byte-level BPE vocabulary under the scripted model (greedy longest-match: not the BPE's
    own tokens): ``canonical`` per request gives canonical token sequences, plain does not."""
    from small_tokenizers import bytelevel_tokenizer

    from grammask import TokenizerInfo

    tok = bytelevel_tokenizer()
    info = TokenizerInfo.from_huggingface(tok, disk_cache=False)
    by = {b: i for i, b in enumerate(info.token_bytes) if b}
    script = "8651 6353  ll"
    # the roles are text here ("[assistant]" after the prompt): the reply is the rest of its line
    app = create_app(model=ScriptedBackend(lambda p: reply(p).split("\n")[0], tokenizer_info=info),
                     max_concurrency=4)
    with serve_in_thread(app) as u:
        c = client(u)
        for canonical in (True, False, None):
            for stream in (False, True):
                kw = dict(model="m", messages=user("REPLY: " + script), temperature=0, logprobs=True,
                          response_format={"type": "regex", "pattern": "[0-9a-z ]{1,16}"})
                if canonical is not None:
                    kw["extra_body"] = {"canonical": canonical}
                if stream:
                    text, ids = "", []
                    for ch in c.chat.completions.create(stream=True, **kw):
                        for ci in ch.choices:
                            text += ci.delta.content or ""
                            ids += [by[bytes(lp.bytes)] for lp in (ci.logprobs.content or [] if ci.logprobs else [])]
                else:
                    r = c.chat.completions.create(**kw)
                    text = r.choices[0].message.content
                    ids = [by[bytes(lp.bytes)] for lp in r.choices[0].logprobs.content]
                assert info.decode(ids).decode() == text
                same = tok.encode(text, add_special_tokens=False).ids == ids
                if canonical:
                    assert same, text
                else:
                    assert text == script and not same


async def test_16_concurrent_requests_with_different_schemas(app, url):
    c = openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=120)
    names = ["Alice", "Bob", "Paris", "hello", "world", "the", "yes", "no"]
    jobs = []
    for i in range(16):
        key = f"k{i}"
        schema = {"type": "object", "properties": {key: {"type": "string"}, "n": {"type": "integer",
                                                                                "minimum": i, "maximum": i + 100}},
                  "required": [key, "n"], "additionalProperties": False}
        answer = {key: names[i % len(names)], "n": i + 42}
        jobs.append((schema, answer))

    async def one(schema, answer, i):
        kw = dict(model="scripted", messages=user("REPLY: " + json.dumps(answer)), temperature=0,
                  response_format={"type": "json_schema", "json_schema": {"name": f"s{i}", "schema": schema,
                                                                          "strict": True}})
        if i % 2:
            stream = await c.chat.completions.create(stream=True, **kw)
            return "".join([ch.choices[0].delta.content or "" async for ch in stream if ch.choices])
        r = await c.chat.completions.create(**kw)
        return r.choices[0].message.content

    outs = await asyncio.gather(*(one(s, a, i) for i, (s, a) in enumerate(jobs)))
    for (schema, answer), text in zip(jobs, outs):
        obj = json.loads(text)
        jsonschema.validate(obj, schema)
        assert obj == answer
    await c.close()
    assert wait_until(lambda: app.state.grammask.slots.active == 0)


# ---------------------------------------------------------------------------------------------- slots
LONG = "REPLY: " + " ".join(["hello world"] * 150)


def long_requests(url: str, max_tokens: int) -> tuple[dict, list[threading.Thread]]:
    """Two LONG requests, "a" and "b", ready to start one by one in threads: (results, threads)."""
    results: dict[str, object] = {}

    def run(name):
        try:
            results[name] = client(url).chat.completions.create(model="m", messages=user(LONG), max_tokens=max_tokens,
                                                                temperature=0)
        except Exception as e:
            results[name] = e

    return results, [threading.Thread(target=run, args=(n,)) for n in ("a", "b")]


def test_queue_full_is_503_with_retry_after():
    app = create_app(model=scripted(forward_delay=0.02), max_concurrency=1, max_queue=1, retry_after=2)
    with serve_in_thread(app) as url:
        srv = app.state.grammask
        results, threads = long_requests(url, 60)
        threads[0].start()
        assert wait_until(lambda: srv.slots.active == 1)
        threads[1].start()
        assert wait_until(lambda: srv.slots.waiting == 1)
        raw = httpx.post(url + "/v1/chat/completions", json={"model": "m", "messages": user("hi")})
        assert raw.status_code == 503 and raw.headers["retry-after"] == "2"
        assert raw.json()["error"]["code"] == "queue_full" and raw.json()["error"]["type"] == "server_error"
        with pytest.raises(openai.InternalServerError) as ei:
            client(url).chat.completions.create(model="m", messages=user("hi"))
        assert ei.value.status_code == 503
        for t in threads:
            t.join(60)
        assert all(getattr(r, "choices", None) for r in results.values()), results  # queued one was served
        # the slot is released just after the response is sent: wait for it, bounded
        assert wait_until(lambda: srv.slots.active == 0) and srv.slots.rejected == 2


def test_engine_queue_full_is_503_with_retry_after():
    """The engine's own admission queue (max_running caches, max_queue waiting) past its limit: 503 +
    Retry-After, streaming or not, while the running and the queued requests finish."""
    backend = scripted(forward_delay=0.02)
    app = create_app(model=backend, max_concurrency=8, max_queue=8, retry_after=3,
                     engine_kwargs={"max_running": 1, "max_queue": 1})
    with serve_in_thread(app) as url:
        srv = app.state.grammask
        results, threads = long_requests(url, 40)
        threads[0].start()
        assert wait_until(lambda: srv.engine is not None and srv.engine.scheduler_stats["running_seqs"] == 1)
        threads[1].start()
        assert wait_until(lambda: srv.engine.scheduler_stats["waiting"] == 1)
        assert httpx.get(url + "/health").json()["engine"]["waiting"] == 1
        for stream in (False, True):
            raw = httpx.post(url + "/v1/chat/completions", json={"model": "m", "messages": user("hi"),
                                                                 "stream": stream})
            assert raw.status_code == 503 and raw.headers["retry-after"] == "3", raw.text
            assert raw.json()["error"]["code"] == "queue_full"
        for t in threads:
            t.join(60)
        assert all(getattr(r, "choices", None) for r in results.values()), results
        assert len(backend.live) <= 1
        assert wait_until(lambda: not srv.engine.active_requests) and not backend.live


def test_malformed_request_in_a_busy_batch_gets_its_400():
    backend = scripted(forward_delay=0.01)
    app = create_app(model=backend, max_concurrency=4, max_queue=4)
    with serve_in_thread(app) as url:
        srv = app.state.grammask
        results, threads = long_requests(url, 40)
        for t in threads:
            t.start()
        assert wait_until(lambda: srv.engine is not None and len(srv.engine.active_requests) == 2)
        n_calls = len(backend.calls)
        for bad in ({"response_format": {"type": "json_schema", "json_schema": {"name": "x",
                                                                                 "schema": {"type": "nonsense"}}}},
                    {"response_format": {"type": "grammar", "grammar": "root ::= ("}}, {"temperature": -1}):
            raw = httpx.post(url + "/v1/chat/completions", json={"model": "m", "messages": user("hi"), **bad})
            assert raw.status_code == 400, raw.text
        assert wait_until(lambda: len(backend.calls) > n_calls)  # the batch went on
        for t in threads:
            t.join(60)
        assert [results[k].choices[0].finish_reason for k in "ab"] == ["length", "length"], results


def test_client_dropped_mid_stream_frees_its_slot_at_once():
    backend = scripted(forward_delay=0.03)
    app = create_app(model=backend, max_concurrency=1, max_queue=4)
    with serve_in_thread(app) as url:
        srv = app.state.grammask
        c = client(url)
        stream = c.chat.completions.create(model="m", messages=user(LONG), stream=True, temperature=0)
        got = 0
        for ch in stream:
            got += bool(ch.choices and ch.choices[0].delta.content)
            if got >= 3:
                break
        t_drop = time.monotonic()
        stream.close()  # drops the connection
        assert wait_until(lambda: srv.slots.active == 0 and not srv.engine.active_requests, 5)
        freed = time.monotonic() - t_drop
        assert freed < 2.0, freed
        assert wait_until(lambda: srv.disconnected == 1)
        assert not backend.live  # its sequence was released
        n_calls = len(backend.calls)
        time.sleep(0.2)
        assert len(backend.calls) == n_calls  # nothing generates any more
        r = c.chat.completions.create(model="m", messages=user("REPLY: Hello world"), temperature=0)
        assert r.choices[0].message.content == "Hello world" and r.choices[0].finish_reason == "stop"


def test_client_dropped_while_waiting_or_generating_non_stream():
    backend = scripted(forward_delay=0.03)
    app = create_app(model=backend, max_concurrency=1, max_queue=4)
    with serve_in_thread(app) as url:
        srv = app.state.grammask
        host, port = url.removeprefix("http://").split(":")
        body = json.dumps({"model": "m", "messages": user(LONG), "temperature": 0}).encode()
        req = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
               f"Content-Length: {len(body)}\r\n\r\n").encode() + body
        s1 = socket.create_connection((host, int(port)))
        s1.sendall(req)
        assert wait_until(lambda: srv.engine is not None and len(srv.engine.active_requests) == 1)
        s2 = socket.create_connection((host, int(port)))
        s2.sendall(req)
        assert wait_until(lambda: srv.slots.waiting == 1)
        s2.close()  # leaves the queue
        assert wait_until(lambda: srv.slots.waiting == 0)
        s1.close()  # cancels the generation
        assert wait_until(lambda: srv.slots.active == 0 and not srv.engine.active_requests, 5)
        assert srv.disconnected == 2 and not backend.live
        r = client(url).chat.completions.create(model="m", messages=user("REPLY: ok"), temperature=0)
        assert r.choices[0].message.content == "ok"


def test_generation_error_mid_stream_is_an_error_event():
    state = {"n": 0}

    def on_forward(prefill):
        if not prefill:
            state["n"] += 1
            if state["n"] == 3:
                raise RuntimeError("device lost")

    app = create_app(model=scripted(on_forward=on_forward))
    with serve_in_thread(app) as url:
        c = client(url)
        stream = c.chat.completions.create(model="m", messages=user(LONG), stream=True, temperature=0)
        with pytest.raises(openai.APIError) as ei:
            for _ in stream:
                pass
        assert "device lost" in str(ei.value)
        with pytest.raises(openai.InternalServerError) as ei:  # not streaming: a 500
            state["n"] = 0
            c.chat.completions.create(model="m", messages=user(LONG), temperature=0)
        assert ei.value.body["code"] == "generation_error"
        # both slots come back (the streaming one once its response has been torn down)
        assert wait_until(lambda: app.state.grammask.slots.active == 0, 5)


def test_api_key_and_mounting_in_a_host_app():
    sub = create_app(model=scripted(), api_key="s3cret")
    host = Starlette(routes=[Mount("/llm", app=sub)])  # the sub-app's lifespan does not run: lazy start
    with serve_in_thread(host) as url:
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=url + "/llm/v1", api_key="wrong", max_retries=0).models.list()
        c = openai.OpenAI(base_url=url + "/llm/v1", api_key="s3cret", max_retries=0)
        r = c.chat.completions.create(model="m", messages=user("REPLY: ok"), temperature=0)
        assert r.choices[0].message.content == "ok"
        assert httpx.get(url + "/llm/health").json()["status"] == "ok"


def test_app_with_a_ready_engine_is_left_open():
    import contextlib

    from grammask.pipeline import AsyncEngine

    # the engine lives in the server's loop: build it from the host's lifespan
    holder = {}

    @contextlib.asynccontextmanager
    async def lifespan(app):
        holder["engine"] = engine = AsyncEngine(scripted())
        holder["sub"] = sub = create_app(engine)
        app.router.routes.append(Mount("/v", app=sub))
        yield
        holder["open_at_shutdown"] = not engine._closed
        await engine.aclose()

    host = Starlette(lifespan=lifespan)
    with serve_in_thread(host) as url:
        r = openai.OpenAI(base_url=url + "/v/v1", api_key="x", max_retries=0).chat.completions.create(
            model="m", messages=user("REPLY: ok"), temperature=0)
        assert r.choices[0].message.content == "ok"
    assert holder["open_at_shutdown"]
    with pytest.raises(TypeError):
        create_app(object())


def test_cli_serve_subcommand():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, "-m", "grammask.cli", "serve", "--model", "scripted", "--port", str(port),
                             "--max-concurrency", "2", "--log-level", "warning"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        ok = False
        end = time.monotonic() + 120
        while time.monotonic() < end and proc.poll() is None:
            try:
                ok = httpx.get(url + "/health", timeout=2).json()["status"] == "ok"
                break
            except Exception:
                time.sleep(0.2)
        assert ok, proc.stdout.read().decode() if proc.poll() is not None else "no answer"
        assert httpx.get(url + "/health").json()["max_concurrency"] == 2
        r = client(url).chat.completions.create(model="m", messages=user("Hello world"), temperature=0)
        assert r.choices[0].message.content == "Hello world"  # the scripted echo of the last line
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:  # pragma: no cover
            proc.kill()


# ---------------------------------------------------------------------------------------------- real model
try:
    from grammask.adapters.models import embedded_model_path

    embedded_model_path()
    import transformers  # noqa: F401

    HAVE_MODEL = True
except Exception:  # pragma: no cover - depends on the install
    HAVE_MODEL = False

needs_model = pytest.mark.skipif(not HAVE_MODEL, reason="the embedded model (or transformers) is not installed")


@pytest.fixture(scope="module")
def real_url():
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)  # 1 intra-op thread: many times faster on a busy shared CPU
    # compact JSON: this small model likes to pad flexible JSON with newlines up to max_tokens
    app = create_app(device="cpu", max_concurrency=16, engine_kwargs={"json_whitespace": "compact"})
    try:
        with serve_in_thread(app) as u:
            yield u, app
    finally:
        torch.set_num_threads(before)


SMALL_PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                                 "age": {"type": "integer", "minimum": 0, "maximum": 120}},
                "required": ["name", "age"], "additionalProperties": False}


class City(BaseModel):
    city: str = Field(max_length=16)
    country: Literal["France", "Italy", "Spain"]


@needs_model
def test_real_json_object_and_schema(real_url):
    url, _ = real_url
    c = client(url)
    r = c.chat.completions.create(model="x", messages=user("Describe a red apple as a JSON object."),
                                  response_format={"type": "json_object"}, max_tokens=40, temperature=0)
    ch = r.choices[0]
    assert ch.finish_reason in ("stop", "length")
    if ch.finish_reason == "stop":
        assert isinstance(json.loads(ch.message.content), dict)
    r = c.chat.completions.create(
        model="x", messages=user("Bob is 30 years old. Give his name and age as JSON."), max_tokens=40,
        temperature=0, response_format={"type": "json_schema", "json_schema": {"name": "person",
                                                                                 "schema": SMALL_PERSON,
                                                                                 "strict": True}})
    assert r.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(r.choices[0].message.content), SMALL_PERSON)


@needs_model
def test_real_parse_stream_and_invalid_schema(real_url):
    url, _ = real_url
    c = client(url)
    r = c.chat.completions.parse(model="x", messages=user("Paris is in France. Give the city and country."),
                                 response_format=City, max_tokens=40, temperature=0)
    assert isinstance(r.choices[0].message.parsed, City)
    stream = c.chat.completions.create(model="x", messages=user("Give a person as JSON."), max_tokens=30,
                                       temperature=0, stream=True, stream_options={"include_usage": True},
                                       response_format={"type": "json_schema", "json_schema": {
                                           "name": "person", "schema": SMALL_PERSON, "strict": True}})
    chunks = list(stream)
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
    if chunks[-2].choices[0].finish_reason == "stop":
        jsonschema.validate(json.loads(text), SMALL_PERSON)
    with pytest.raises(openai.BadRequestError) as ei:
        c.chat.completions.create(model="x", messages=user("hi"), response_format={
            "type": "json_schema", "json_schema": {"name": "bad", "schema": {
                "type": "object", "properties": {"n": {"type": "integer", "minimum": "zero"}}}}})
    assert "#/properties/n/minimum" in ei.value.body["message"]


@needs_model
def test_real_tools(real_url):
    url, _ = real_url

    class GetWeather(BaseModel):
        location: str = Field(max_length=16)

    r = client(url).chat.completions.parse(
        model="x", messages=user("What is the weather in Paris?"), max_tokens=60, temperature=0,
        tools=[openai.pydantic_function_tool(GetWeather, name="get_weather")],
        tool_choice={"type": "function", "function": {"name": "get_weather"}})
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls"
    assert isinstance(ch.message.tool_calls[0].function.parsed_arguments, GetWeather)


@needs_model
def test_real_client_dropped_mid_stream_then_normal_request(real_url):
    url, app = real_url
    srv = app.state.grammask
    c = client(url)
    stream = c.chat.completions.create(model="x", messages=user("Write a long story about a cat."), max_tokens=200,
                                       temperature=0, stream=True)
    got = 0
    for ch in stream:
        got += bool(ch.choices and ch.choices[0].delta.content)
        if got >= 2:
            break
    stream.close()
    assert wait_until(lambda: srv.slots.active == 0 and not srv.engine.active_requests, 10)
    r = c.chat.completions.create(model="x", messages=user("Say hi."), max_tokens=8, temperature=0)
    assert r.choices[0].message.content and r.choices[0].finish_reason in ("stop", "length")


@needs_model
async def test_real_16_concurrent_schemas(real_url):
    url, _ = real_url
    c = openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=600)
    enums = [["red", "green"], ["cat", "dog"], ["yes", "no"], ["up", "down"]]

    async def one(i):
        schema = {"type": "object", "properties": {f"f{i}": {"enum": enums[i % 4]},
                                                   "n": {"type": "integer", "minimum": 0, "maximum": 9}},
                  "required": [f"f{i}", "n"], "additionalProperties": False}
        r = await c.chat.completions.create(model="x", messages=user(f"Pick one of {enums[i % 4]} and a digit."),
                                            max_tokens=30, temperature=0, response_format={
                                                "type": "json_schema", "json_schema": {"name": f"s{i}",
                                                                                       "schema": schema,
                                                                                       "strict": True}})
        return schema, r.choices[0]

    for schema, ch in await asyncio.gather(*(one(i) for i in range(16))):
        assert ch.finish_reason == "stop"
        jsonschema.validate(json.loads(ch.message.content), schema)
    await c.close()
