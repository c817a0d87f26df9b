"""The server under a mix of good and bad traffic (issue 17: fail closed, bounded under load).

Well-formed streaming requests (JSON Schema, regex) run concurrently with malformed ones: bodies
that are not JSON or not objects, unknown fields, schemas that fail to compile, a schema over
``max_schema_bytes``, a body over ``max_body_bytes``, enormous ``max_tokens``, invalid UTF-8, a
wrong ``Content-Type``, and clients that vanish mid-body or mid-stream. Every good request ends
with valid output, every bad one gets a 4xx with an OpenAI-shaped error body, nothing is ever a
500, and afterwards nothing is left holding a slot, a sequence or an engine request.

The default test runs the scripted backend (uvicorn in a thread, fast); the ``slow`` one repeats
it on the embedded SmolLM2-135M model.
"""
from __future__ import annotations

import asyncio
import json
import re
import pytest
from _support import server_deps, user, wait_until

jsonschema, httpx = server_deps()

from grammask.adapters.server import create_app, serve_in_thread  # noqa: E402
from grammask.pipeline.scripted import ScriptedBackend  # noqa: E402

MAX_BODY = 256 * 1024
MAX_SCHEMA = 32 * 1024
LONG = " ".join(["hello world"] * 150)


def reply(prompt: str) -> str:
    return prompt.split("REPLY:", 1)[1].strip() if "REPLY:" in prompt else "Hello world"


def json_rf(name: str, schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}


# ---------------------------------------------------------------------------------------------- the traffic
def good_requests(real: bool) -> list[tuple[dict, object]]:
    """``(request body, check)``: check is a JSON Schema (dict) or a compiled regex."""
    out: list[tuple[dict, object]] = []
    for i in range(4 if real else 8):
        if i % 2 == 0:
            schema = {"type": "object", "properties": {f"k{i}": {"type": "string", "maxLength": 10},
                                                       "n": {"type": "integer", "minimum": 0, "maximum": 99}},
                      "required": [f"k{i}", "n"], "additionalProperties": False}
            text = "Give a short word and a number as JSON." if real else \
                "REPLY: " + json.dumps({f"k{i}": "hello", "n": i})
            out.append(({"messages": user(text), "response_format": json_rf(f"g{i}", schema)}, schema))
        else:
            pattern = r"(yes|no), [0-9]{1,2}"
            text = "Answer yes or no, then a number." if real else f"REPLY: yes, {i}"
            out.append(({"messages": user(text), "response_format": {"type": "regex", "pattern": pattern}},
                        re.compile(pattern)))
    # enormous max_tokens: clamped to the context (the engine's behaviour), not an error
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    text = "Is the sky blue? Answer as JSON." if real else 'REPLY: {"ok": true}'
    out.append(({"messages": user(text), "response_format": json_rf("big", schema), "max_tokens": 10 ** 12},
                schema))
    for body, _ in out:
        body.update(model="m", stream=True, temperature=0)
        body.setdefault("max_tokens", 40 if real else 200)
    return out


def bad_requests() -> list[tuple[str, bytes, dict, int, str | None]]:
    """``(label, raw body, extra headers, expected status, expected error code or None)``."""
    ok = {"model": "m", "messages": user("REPLY: hi"), "stream": True}

    def j(obj) -> bytes:
        return json.dumps(obj).encode()

    huge_enum = {"type": "string", "enum": [f"value-{i:06d}" for i in range(3000)]}  # ~50 KB > MAX_SCHEMA
    return [
        ("malformed JSON", b'{"model": "m", "messages": [', {}, 400, "invalid_json"),
        ("trailing garbage", j(ok) + b"}", {}, 400, "invalid_json"),
        ("empty body", b"", {}, 400, "invalid_json"),
        ("a list", b"[1, 2, 3]", {}, 400, "invalid_json"),
        ("a string", b'"hello"', {}, 400, "invalid_json"),
        ("null", b"null", {}, 400, "invalid_json"),
        ("nested too deeply", b"[" * 20000 + b"]" * 20000, {}, 400, "invalid_json"),
        ("unknown field", j({**ok, "frobnicate": 1}), {}, 400, "invalid_request"),
        ("no messages", j({"model": "m", "stream": True}), {}, 400, "invalid_request"),
        ("messages not a list", j({**ok, "messages": "hi"}), {}, 400, "invalid_request"),
        ("invalid schema", j({**ok, "response_format": json_rf("x", {
            "type": "object", "properties": {"age": {"type": "integr"}}})}), {}, 400, "invalid_schema"),
        ("unsupported keyword", j({**ok, "response_format": json_rf("x", {
            "type": "object", "properties": {"a": {"type": "string", "pattern": "(?<=a)b"}}})}),
         {}, 400, "unsupported_schema"),
        ("unsatisfiable schema", j({**ok, "response_format": json_rf("x", {
            "type": "integer", "minimum": 5, "maximum": 1})}), {}, 400, None),
        ("schema nested too deeply", j({**ok, "response_format": json_rf("x", _deep(300))}), {}, 400, None),
        ("schema as bad JSON text", j({**ok, "response_format": {"type": "json_object", "schema": "[1, 2"}}),
         {}, 400, "invalid_request"),
        ("bad regex", j({**ok, "response_format": {"type": "regex", "pattern": "(a"}}), {}, 400, "invalid_grammar"),
        ("bad grammar", j({**ok, "response_format": {"type": "grammar", "grammar": "root ::= nothing"}}),
         {}, 400, "invalid_grammar"),
        ("bad tool schema", j({**ok, "tools": [{"type": "function", "function": {
            "name": "f", "parameters": {"type": "object", "properties": {"x": {"type": 3}}}}}]}), {}, 400, None),
        ("huge schema", j({**ok, "response_format": json_rf("x", huge_enum)}), {}, 400, "schema_too_large"),
        ("huge regex", j({**ok, "response_format": {"type": "regex", "pattern": "a|" * 20000 + "b"}}),
         {}, 400, "schema_too_large"),
        ("huge tool schemas", j({**ok, "tools": [{"type": "function", "function": {
            "name": f"f{i}", "parameters": {"type": "object", "properties": {"x": huge_enum}}}} for i in range(2)]}),
         {}, 400, "schema_too_large"),
        ("oversized body", j({**ok, "messages": user("x" * (MAX_BODY + 10))}), {}, 413, "body_too_large"),
        ("max_tokens 0", j({**ok, "max_tokens": 0}), {}, 400, "invalid_request"),
        ("max_tokens negative", j({**ok, "max_tokens": -5}), {}, 400, "invalid_request"),
        ("max_tokens not a number", j({**ok, "max_tokens": "lots"}), {}, 400, "invalid_request"),
        ("temperature out of range", j({**ok, "temperature": 7}), {}, 400, "invalid_request"),
        ("invalid UTF-8", b'{"model": "m", "messages": [{"role": "user", "content": "\xff\xfe"}]}', {},
         400, "invalid_json"),
        ("multipart", j(ok), {"content-type": "multipart/form-data; boundary=x"}, 415, "unsupported_media_type"),
        ("form encoded, not JSON", b"model=m&messages=hi", {"content-type": "application/x-www-form-urlencoded"},
         400, "invalid_json"),
    ]


def _deep(n: int) -> dict:
    s: dict = {"type": "string"}
    for _ in range(n):
        s = {"type": "object", "properties": {"a": s}, "required": ["a"]}
    return s


def check_error(label: str, status: int, body: bytes, want_status: int, want_code: str | None) -> None:
    assert status == want_status, (label, status, body[:300])
    err = json.loads(body)["error"]
    assert set(err) == {"message", "type", "param", "code"}, (label, err)
    assert err["type"] == "invalid_request_error" and err["message"], (label, err)
    if want_code is not None:
        assert err["code"] == want_code, (label, err)


async def stream_text(client, body: dict) -> tuple[str, list[dict]]:
    """POST a streaming request; (its text, its chunks), after checking the SSE framing."""
    async with client.stream("POST", "/v1/chat/completions", json=body) as resp:
        raw = (await resp.aread()).decode("utf-8")
        assert resp.status_code == 200, raw[:500]
    events = [ln[len("data: "):] for ln in raw.split("\n") if ln.startswith("data: ")]
    assert events and events[-1] == "[DONE]", raw[-500:]
    chunks = [json.loads(e) for e in events[:-1]]
    assert all("error" not in c for c in chunks), chunks
    text = "".join((ch["delta"].get("content") or "") for c in chunks for ch in c["choices"])
    return text, chunks


async def drop_mid_stream(host: str, port: int, body: dict) -> None:
    """A raw connection: send a streaming request, read its first event, then vanish."""
    reader, writer = await asyncio.open_connection(host, port)
    data = json.dumps(body).encode()
    writer.write((f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                  f"Content-Length: {len(data)}\r\n\r\n").encode() + data)
    await writer.drain()
    got = b""
    while b"data: {" not in got:
        chunk = await asyncio.wait_for(reader.read(4096), 60)
        assert chunk, got
        got += chunk
    assert got.startswith(b"HTTP/1.1 200"), got[:200]
    writer.transport.abort()  # RST, no FIN handshake: as abrupt as it gets


async def drop_mid_body(host: str, port: int) -> None:
    """A raw connection that announces a body and sends half of it."""
    reader, writer = await asyncio.open_connection(host, port)
    writer.write((f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                  f"Content-Length: 5000\r\n\r\n").encode() + b'{"model": "m", "messages": [')
    await writer.drain()
    await asyncio.sleep(0.05)
    writer.close()


async def drop_with_httpx(client, body: dict) -> None:
    """The client library's way out: stop reading the stream after one event and close it."""
    async with client.stream("POST", "/v1/chat/completions", json=body) as resp:
        assert resp.status_code == 200
        async for line in resp.aiter_lines():
            if line.startswith("data: {"):
                break


async def run_mixed_traffic(url: str, *, real: bool, rounds: int = 2) -> dict:
    host, port = url.removeprefix("http://").split(":")
    port = int(port)
    goods = good_requests(real)
    bads = bad_requests()
    long_body = {"model": "m", "messages": user(("Write a long story about the sea." if real else "REPLY: " + LONG)),
                 "stream": True, "temperature": 0, "max_tokens": 200}
    limits = httpx.Limits(max_connections=200, max_keepalive_connections=50)
    results: dict[str, list] = {"good": [], "bad": [], "dropped": 0}
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:
        async def good(body, check):
            text, chunks = await stream_text(client, body)
            finish = [ch["finish_reason"] for c in chunks for ch in c["choices"] if ch.get("finish_reason")]
            results["good"].append((body, check, text, finish))

        async def bad(label, raw, headers, want_status, want_code):
            h = {"content-type": "application/json", **headers}
            r = await client.post("/v1/chat/completions", content=raw, headers=h)
            check_error(label, r.status_code, r.content, want_status, want_code)
            results["bad"].append(label)

        async def dropped(coro):
            await coro
            results["dropped"] += 1

        jobs = []
        for rnd in range(rounds):
            jobs += [good(dict(b), c) for b, c in goods]
            jobs += [bad(*b) for b in bads]
            jobs += [dropped(drop_mid_stream(host, port, long_body)) for _ in range(2)]
            jobs += [dropped(drop_with_httpx(client, long_body))]
            jobs += [dropped(drop_mid_body(host, port))]
        await asyncio.gather(*jobs)
    assert len(results["good"]) == rounds * len(goods) and len(results["bad"]) == rounds * len(bads)
    return results


def check_goods(results: dict, *, real: bool) -> None:
    for body, check, text, finish in results["good"]:
        assert finish, (body, text)
        if real and finish[0] == "length":  # the small model may run out of tokens: then output is cut
            continue
        assert finish == ["stop"], (body, text, finish)
        if isinstance(check, dict):
            jsonschema.validate(json.loads(text), check)
        else:
            assert check.fullmatch(text), (check.pattern, text)


def check_nothing_leaked(app, live=None) -> dict:
    srv = app.state.grammask
    eng = srv.engine

    def idle() -> bool:
        st = eng.scheduler_stats
        return (srv.slots.active == 0 and srv.slots.waiting == 0 and not eng.active_requests
                and st["running_seqs"] == 0 and st["waiting"] == 0 and (live is None or not live()))

    assert wait_until(idle, 15), (srv.stats(), live() if live else None)
    return srv.stats()


def check_health(url: str) -> dict:
    h = httpx.get(url + "/health", timeout=30)
    assert h.status_code == 200, h.text
    st = h.json()
    assert st["status"] == "ok" and st["running"] == 0 and st["waiting"] == 0 and st["engine_requests"] == 0
    assert st["engine"]["running_seqs"] == 0 and st["engine"]["waiting"] == 0
    return st


# ---------------------------------------------------------------------------------------------- tests
def test_mixed_good_and_bad_traffic_scripted():
    backend = ScriptedBackend(reply, forward_delay=0.005)
    app = create_app(model=backend, max_concurrency=16, max_queue=256, max_body_bytes=MAX_BODY,
                     max_schema_bytes=MAX_SCHEMA)
    with serve_in_thread(app) as url:
        results = asyncio.run(run_mixed_traffic(url, real=False))
        check_goods(results, real=False)
        stats = check_nothing_leaked(app, live=lambda: backend.live)
        h = check_health(url)
        assert h["max_body_bytes"] == MAX_BODY and h["max_schema_bytes"] == MAX_SCHEMA
        # the streams dropped mid-way were seen as disconnects, and nothing ever failed with a 500
        assert stats["disconnected"] >= 6, stats
        assert stats["completed"] >= len(results["good"]), stats
        # the server still serves normally afterwards
        good = good_requests(False)[0]
        text, _ = asyncio.run(_one_stream(url, good[0]))
        jsonschema.validate(json.loads(text), good[1])
        assert check_nothing_leaked(app, live=lambda: backend.live)["running"] == 0
        # JSON labelled form-urlencoded (what `curl -d` sends) is served as JSON
        body = {**good[0], "stream": False}
        with httpx.Client(base_url=url, timeout=60) as client:
            r = client.post("/v1/chat/completions", content=json.dumps(body).encode(),
                            headers={"content-type": "application/x-www-form-urlencoded"})
        assert r.status_code == 200, r.text
        jsonschema.validate(json.loads(r.json()["choices"][0]["message"]["content"]), good[1])


async def _one_stream(url: str, body: dict):
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        return await stream_text(client, body)


def test_default_bounds_and_cli_flags():
    from grammask.adapters.server import MAX_BODY_BYTES, MAX_SCHEMA_BYTES, constraint_sizes
    from grammask.pipeline.protocol import parse_request

    assert MAX_BODY_BYTES == 32 * 1024 * 1024 and MAX_SCHEMA_BYTES == 1024 * 1024
    srv = create_app(model=ScriptedBackend(reply)).state.grammask
    assert (srv.max_body_bytes, srv.max_schema_bytes) == (MAX_BODY_BYTES, MAX_SCHEMA_BYTES)
    with pytest.raises(ValueError):
        create_app(model=ScriptedBackend(reply), max_schema_bytes=0)
    schema = {"b": 1, "a": "é"}
    req = parse_request(messages=user("hi"), response_format=json_rf("x", schema))
    assert constraint_sizes(req) == [("response_format.json_schema.schema", len('{"a":"é","b":1}'.encode()))]
    import argparse

    from grammask import cli

    p = argparse.ArgumentParser()
    cli._add_serve_parser(p.add_subparsers(dest="command"))
    args = p.parse_args(["serve", "--max-body-bytes", "1000", "--max-schema-bytes", "200"])
    assert (args.max_body_bytes, args.max_schema_bytes) == (1000, 200)


try:
    import grammask.adapters.models  # noqa: F401
    import transformers  # noqa: F401

    HAVE_MODEL = True
except Exception:  # pragma: no cover - depends on the install
    HAVE_MODEL = False


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_MODEL, reason="the embedded model (or transformers) is not installed")
def test_mixed_good_and_bad_traffic_real_model():
    import torch

    from grammask.adapters.models import load_backend

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        backend = load_backend(None, "cpu")
        live: set[int] = set()
        new_sequence, release = backend.new_sequence, backend.release

        def tracked_new():
            s = new_sequence()
            live.add(id(s))
            return s

        def tracked_release(s):
            live.discard(id(s))
            return release(s)

        backend.new_sequence, backend.release = tracked_new, tracked_release
        app = create_app(model=backend, device="cpu", max_concurrency=16, max_queue=256, max_body_bytes=MAX_BODY,
                         max_schema_bytes=MAX_SCHEMA, engine_kwargs={"json_whitespace": "compact"})
        with serve_in_thread(app) as url:
            results = asyncio.run(run_mixed_traffic(url, real=True, rounds=1))
            check_goods(results, real=True)
            assert any(f == ["stop"] for *_, f in results["good"]), results["good"]
            stats = check_nothing_leaked(app, live=lambda: live)
            check_health(url)
            assert stats["disconnected"] >= 3, stats
    finally:
        torch.set_num_threads(before)
