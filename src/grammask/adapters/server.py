"""An OpenAI-compatible HTTP server over :class:`~grammask.pipeline.AsyncEngine` (Starlette + uvicorn).

::

    from grammask.adapters.server import create_app
    app = create_app()                                  # the embedded model, made at startup
    app = create_app(engine)                            # a ready AsyncEngine (you close it)
    app = create_app(model="path/to/model.gguf", max_concurrency=8)
    uvicorn.run(app, host="127.0.0.1", port=8000)       # or: grammask serve

Endpoints
---------
``POST /v1/chat/completions``
    OpenAI's chat completion request (JSON). ``stream=true`` answers Server-Sent Events, one
    ``data: {chunk}`` per :class:`~grammask.pipeline.protocol.ChatCompletionChunk`, ending with
    ``data: [DONE]``. An error after the stream started is sent as a last event
    ``data: {"error": {...}}`` (the openai client raises it) and no ``[DONE]``.
``GET /v1/models``, ``GET /v1/models/{id}``
    The served model.
``GET /health``
    ``{"status": "ok", ...}`` with the load figures; 503 while the engine is starting or closed.

Errors are shaped like OpenAI's: ``{"error": {"message", "type", "param", "code"}}``:

- 400 ``invalid_request_error`` for a malformed request (``param`` names the field), a bad
  ``response_format``, grammar, regex or JSON Schema (``code`` ``invalid_schema`` /
  ``unsupported_schema`` / ``invalid_grammar``; the message names the JSON pointer of the bad
  keyword, e.g. ``(at #/properties/age/type)``), and ``code`` ``canonical_unsupported`` when
  ``canonical`` (or ``response_format.canonical``) asks for canonical tokenization on a tokenizer
  class it does not cover (the message names the reason). Grammars are compiled before the response
  starts, so a request whose format cannot be enforced never gets a 200 with free text;
- 400 ``invalid_request_error`` / ``schema_too_large`` when the request's constraints (the
  ``response_format`` schema, grammar or pattern, the tools' parameter schemas, the structural
  tags' schemas; JSON Schemas measured as canonical JSON text, sorted keys, no spaces, UTF-8)
  add up to more than ``max_schema_bytes`` (default 1 MiB), checked before anything is compiled;
- 413 ``body_too_large`` for a body over ``max_body_bytes`` (default 32 MiB; refused from its
  ``Content-Length`` before reading it, else as soon as it passes the limit);
- 415 ``unsupported_media_type`` for a ``multipart/*`` body (a form upload); a body of any other
  ``Content-Type`` (or none) is parsed as JSON, as ``curl -d`` sends JSON labelled form-urlencoded;
- 400 ``invalid_json`` for a body that is not JSON (invalid UTF-8, syntax, nesting too deep) or
  not a JSON object;
- 401 with a wrong or missing API key (when the server has one), 404/405 for unknown routes;
- 503 ``server_error`` / ``queue_full`` with ``Retry-After`` when all ``max_concurrency`` slots
  are busy and ``max_queue`` requests already wait for one, or when the engine's own admission
  queue is full (``engine_kwargs`` ``max_running`` / ``max_queue``, ``pipeline/scheduler.py``);
- 500 ``server_error`` when generation fails (e.g. the model's forward pass raised).

Request bounds (``create_app`` / ``grammask serve`` options): ``max_body_bytes`` (default 32 MiB,
``--max-body-bytes``) bounds the body (413); ``max_schema_bytes`` (default 1 MiB,
``--max-schema-bytes``) bounds the total size of a request's constraints (400 ``schema_too_large``,
``param`` names the largest), checked after the request is parsed and before any grammar is compiled.
``max_tokens`` past the model's context is not an error: the completion stops at the context
(``finish_reason`` ``length``).

Admission: a request holds one of ``max_concurrency`` slots from admission until its response
ends; others wait in a FIFO queue of at most ``max_queue``. A client that disconnects (while
queued, while generating, or mid-stream) cancels its request at once: the engine aborts it and
its slot goes to the next waiting request. ``/health`` reports the slots and, under ``engine``,
the engine's admission queue (sequences holding a cache, requests waiting, the most seen waiting)
and, under ``grammar_cache``, the compiled-grammar LRU cache (size, max_size, hits, misses).

Engine lifecycle: with ``create_app(engine)`` the app uses that engine and leaves it open
(``close_engine=True`` to close it at shutdown). Otherwise the app makes the engine in its
lifespan startup and closes it at shutdown. Starlette does not run the lifespan of a *mounted*
sub-application: mount an app built with an engine you manage, or call
``await app.state.grammask.start()`` / ``aclose()`` from your own lifespan; as a last resort the
engine is made on the first request. Build the engine in the event loop that serves the app.
"""
from __future__ import annotations

import contextlib
import json
import logging
import math
import time
import uuid
from collections import deque
from typing import Any

import anyio

from ..errors import (
    CanonicalTokenizationError,
    EngineClosedError,
    GenerationError,
    GrammarError,
    GrammaskError,
    InvalidRequestError,
    InvalidSchemaError,
    UnsupportedSchemaError,
)
from ..pipeline.scheduler import QueueFullError

try:
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route
except ImportError as e:  # pragma: no cover - depends on the install
    raise ImportError("the grammask server needs the 'serve' extra: pip install 'grammask[serve]'") from e

logger = logging.getLogger("grammask.server")

DEFAULT_MAX_CONCURRENCY = 32
#: largest request body accepted (bytes; ``create_app(max_body_bytes=...)``, ``--max-body-bytes``)
MAX_BODY_BYTES = 32 * 1024 * 1024
#: largest total size of a request's constraints: schemas as canonical JSON text, grammar and regex
#: text (bytes; ``create_app(max_schema_bytes=...)``, ``--max-schema-bytes``)
MAX_SCHEMA_BYTES = 1024 * 1024
#: OpenAI request fields that change nothing here: accepted and dropped
IGNORED_FIELDS = frozenset({"store", "metadata", "service_tier", "prompt_cache_key", "prompt_cache_retention",
                            "safety_identifier"})

__all__ = ["DEFAULT_MAX_CONCURRENCY", "MAX_BODY_BYTES", "MAX_SCHEMA_BYTES", "GrammaskServer", "QueueFullError",
           "SchemaTooLargeError", "constraint_sizes", "create_app", "error_body", "error_for_exception",
           "serve_in_thread"]


# ---------------------------------------------------------------------------------------------- errors
def error_body(message: str, type: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict:
    """OpenAI's error object."""
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def _schema_param(req: Any) -> str | None:
    """The request field a schema error comes from."""
    if req is None:
        return None
    if getattr(req, "tools_active", False):
        return "tools"
    rf = getattr(req, "response_format", None)
    if rf is None:
        return None
    if rf.type == "json_schema":
        return "response_format.json_schema.schema"
    if rf.type == "json_object":
        return "response_format.schema"
    return "response_format"


def _canonical_param(req: Any) -> str | None:
    """The request field that asked for canonical tokenization (None: the engine's default)."""
    if req is None:
        return None
    if getattr(req, "canonical", None) is not None:
        return "canonical"
    if getattr(getattr(req, "response_format", None), "canonical", None) is not None:
        return "response_format.canonical"
    return None


def error_for_exception(exc: BaseException, req: Any = None) -> tuple[int, dict]:
    """``(HTTP status, OpenAI error body)`` for an exception raised while serving ``req``."""
    if isinstance(exc, QueueFullError):
        return 503, error_body(str(exc), "server_error", None, "queue_full")
    if isinstance(exc, InvalidRequestError):
        code = "schema_too_large" if isinstance(exc, SchemaTooLargeError) else "invalid_request"
        return 400, error_body(str(exc), "invalid_request_error", exc.param, code)
    if isinstance(exc, CanonicalTokenizationError):
        return 400, error_body(str(exc), "invalid_request_error", _canonical_param(req), "canonical_unsupported")
    if isinstance(exc, UnsupportedSchemaError):
        return 400, error_body(str(exc), "invalid_request_error", _schema_param(req), "unsupported_schema")
    if isinstance(exc, InvalidSchemaError):
        return 400, error_body(str(exc), "invalid_request_error", _schema_param(req), "invalid_schema")
    if isinstance(exc, GrammarError):
        param = _schema_param(req)
        rf = getattr(req, "response_format", None)
        if rf is not None and rf.type in ("grammar", "regex") and not getattr(req, "tools_active", False):
            param = "response_format." + ("grammar" if rf.type == "grammar" else "pattern")
        return 400, error_body(str(exc), "invalid_request_error", param, "invalid_grammar")
    if isinstance(exc, EngineClosedError):
        return 503, error_body(str(exc), "server_error", None, "engine_closed")
    if isinstance(exc, GenerationError):
        return 500, error_body(str(exc), "server_error", None, "generation_error")
    return 500, error_body(f"internal server error: {type(exc).__name__}: {exc}", "server_error", None, None)


# ---------------------------------------------------------------------------------------------- request bounds
def _canonical_size(schema: Any) -> int:
    """Bytes of ``schema``'s canonical JSON text (sorted keys, no spaces, UTF-8)."""
    return len(json.dumps(schema, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                          default=str).encode("utf-8"))


def constraint_sizes(req: Any) -> list[tuple[str, int]]:
    """``(request field, bytes)`` of each constraint in a parsed request: the ``response_format``
    schema (canonical JSON text), grammar or pattern, the structural tags' schemas and the active
    tools' parameter schemas. Their sum is what ``max_schema_bytes`` bounds."""
    out: list[tuple[str, int]] = []
    rf = getattr(req, "response_format", None)
    if rf is not None:
        if rf.type == "json_schema":
            out.append(("response_format.json_schema.schema", _canonical_size(rf.json_schema.schema_)))
        elif rf.type == "json_object" and rf.schema_ is not None:
            out.append(("response_format.schema", _canonical_size(rf.schema_)))
        elif rf.type == "grammar":
            out.append(("response_format.grammar", len(rf.grammar.encode("utf-8", "surrogatepass"))))
        elif rf.type == "regex":
            out.append(("response_format.pattern", len(rf.pattern.encode("utf-8", "surrogatepass"))))
        elif rf.type == "structural_tag":
            for i, st in enumerate(rf.structures):
                out.append((f"response_format.structures.{i}.schema", _canonical_size(st.schema_)
                            + len((st.begin + st.end).encode("utf-8", "surrogatepass"))))
    if getattr(req, "tools_active", False):
        for i, tool in enumerate(req.tools):
            out.append((f"tools.{i}.function.parameters", _canonical_size(tool.function.parameters)))
    return out


class SchemaTooLargeError(InvalidRequestError):
    """The request's constraints exceed the server's ``max_schema_bytes`` (a 400 ``schema_too_large``)."""


def _check_constraint_size(req: Any, limit: int) -> None:
    """Raise :class:`InvalidRequestError` when the request's constraints exceed ``limit`` bytes."""
    sizes = constraint_sizes(req)
    total = sum(n for _, n in sizes)
    if total > limit:
        param = max(sizes, key=lambda x: x[1])[0]
        what = f"{param} is {total} bytes" if len(sizes) == 1 else \
            f"the request's schemas/grammars add up to {total} bytes (the largest: {param})"
        raise SchemaTooLargeError(f"{what} (canonical JSON text for JSON Schemas): over the server's "
                                  f"max_schema_bytes limit of {limit} bytes", param=param)


# ---------------------------------------------------------------------------------------------- admission
class _Lease:
    __slots__ = ("slots", "released")

    def __init__(self, slots: "_Slots"):
        self.slots = slots
        self.released = False

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.slots._release()


class _Slots:
    """``limit`` concurrent holders, a FIFO of at most ``max_queue`` waiters, the rest refused.
    A released slot is handed straight to the first waiter."""

    def __init__(self, limit: int, max_queue: int):
        self.limit = max(1, int(limit))
        self.max_queue = max(0, int(max_queue))
        self.active = 0
        self._waiters: deque[anyio.Event] = deque()
        self.admitted = 0
        self.rejected = 0
        self.max_waiting_seen = 0

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    async def acquire(self) -> _Lease:
        if self.active < self.limit and not self._waiters:
            self.active += 1
            self.admitted += 1
            return _Lease(self)
        if len(self._waiters) >= self.max_queue:
            self.rejected += 1
            raise QueueFullError(f"the server is busy: {self.active} requests running and {len(self._waiters)} "
                                 f"waiting (max_concurrency {self.limit}, max_queue {self.max_queue}); retry later")
        ev = anyio.Event()
        self._waiters.append(ev)
        self.max_waiting_seen = max(self.max_waiting_seen, len(self._waiters))
        try:
            await ev.wait()
        except BaseException:
            try:
                self._waiters.remove(ev)
            except ValueError:  # the slot was handed to us as we were cancelled: pass it on
                self._release()
            raise
        self.admitted += 1
        return _Lease(self)

    def _release(self) -> None:
        if self._waiters:
            self._waiters.popleft().set()  # the slot changes hands; ``active`` stays
        else:
            self.active -= 1


# ---------------------------------------------------------------------------------------------- server state
class GrammaskServer:
    """The state behind an app from :func:`create_app` (``app.state.grammask``): the engine,
    the slots and counters. :meth:`start` / :meth:`aclose` are what the lifespan calls."""

    def __init__(self, engine=None, *, model=None, device: str = "auto", engine_kwargs: dict | None = None,
                 max_concurrency: int | None = None, max_queue: int | None = None, retry_after: float = 1.0,
                 api_key: str | None = None, close_engine: bool | None = None, served_model_name: str | None = None,
                 max_body_bytes: int | None = None, max_schema_bytes: int | None = None):
        self._engine = engine
        self.model = model
        self.device = device
        self.engine_kwargs = dict(engine_kwargs or {})
        self.close_engine = (engine is None) if close_engine is None else bool(close_engine)
        limit = DEFAULT_MAX_CONCURRENCY if max_concurrency is None else int(max_concurrency)
        if limit < 1:
            raise ValueError("max_concurrency must be at least 1")
        queue = 2 * limit if max_queue is None else int(max_queue)
        if queue < 0:
            raise ValueError("max_queue must be >= 0")
        self.slots = _Slots(limit, queue)
        self.max_body_bytes = MAX_BODY_BYTES if max_body_bytes is None else int(max_body_bytes)
        self.max_schema_bytes = MAX_SCHEMA_BYTES if max_schema_bytes is None else int(max_schema_bytes)
        if self.max_body_bytes < 1 or self.max_schema_bytes < 1:
            raise ValueError("max_body_bytes and max_schema_bytes must be at least 1")
        self.retry_after = float(retry_after)
        self.api_key = api_key
        self.served_model_name = served_model_name
        self.created = int(time.time())
        self.closed = False
        self._start_lock: anyio.Lock | None = None
        self.completed = 0
        self.failed = 0
        self.disconnected = 0

    @property
    def engine(self):
        return self._engine

    @property
    def model_name(self) -> str:
        if self.served_model_name:
            return self.served_model_name
        if self._engine is not None:
            return self._engine.model_name
        return "grammask"

    async def start(self):
        """Make the engine if there is none yet (idempotent); return it. The cached kernels
        load in a background thread meanwhile (:func:`~grammask.preload_kernels_in_background`),
        so that no request's first mask waits for them."""
        from ..grammar.jit_cache import preload_kernels_in_background

        preload_kernels_in_background()
        if self._engine is not None:
            self._apply_name()
            return self._engine
        if self.closed:
            raise EngineClosedError("the server is shut down")
        if self._start_lock is None:
            self._start_lock = anyio.Lock()
        async with self._start_lock:
            if self._engine is None:
                from .models import create_engine

                logger.info("starting the engine (model %s, device %s)", self.model or "embedded", self.device)
                self._engine = await create_engine(self.model, self.device, **self.engine_kwargs)
                self._apply_name()
        return self._engine

    def _apply_name(self) -> None:
        if self.served_model_name and self._engine is not None:
            self._engine.model_name = self.served_model_name

    async def aclose(self) -> None:
        self.closed = True
        if self._engine is not None and self.close_engine:
            await self._engine.aclose()

    def stats(self) -> dict:
        eng = self._engine
        return {
            "model": self.model_name,
            "running": self.slots.active,
            "waiting": self.slots.waiting,
            "max_concurrency": self.slots.limit,
            "max_queue": self.slots.max_queue,
            "max_body_bytes": self.max_body_bytes,
            "max_schema_bytes": self.max_schema_bytes,
            "admitted": self.slots.admitted,
            "rejected": self.slots.rejected,
            "max_waiting_seen": self.slots.max_waiting_seen,
            "completed": self.completed,
            "failed": self.failed,
            "disconnected": self.disconnected,
            "engine_requests": len(eng.active_requests) if eng is not None else 0,
            # the engine's own admission queue (sequences holding a cache, requests waiting for one)
            "engine": eng.scheduler_stats if eng is not None and hasattr(eng, "scheduler_stats") else None,
            # the compiled-grammar LRU cache (size <= max_size: what bounds per-schema memory)
            "grammar_cache": (eng.grammar_cache.info if eng is not None and hasattr(eng, "grammar_cache")
                              else None),
        }

    def retry_headers(self, status: int) -> dict[str, str] | None:
        """``Retry-After`` for a 503 (a full queue, the server's or the engine's)."""
        return {"retry-after": str(max(1, math.ceil(self.retry_after)))} if status == 503 else None


# ---------------------------------------------------------------------------------------------- ASGI helpers
def _json_bytes(obj: Any) -> bytes:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


async def _send_json(send, status: int, obj: Any, headers: dict[str, str] | None = None) -> None:
    body = obj if isinstance(obj, bytes) else _json_bytes(obj)
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw += [(k.lower().encode("latin-1"), str(v).encode("latin-1")) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body, "more_body": False})


class _Disconnected(Exception):
    pass


async def _read_body(receive, limit: int) -> bytes:
    chunks, size = [], 0
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            raise _Disconnected()
        if msg["type"] != "http.request":
            continue
        data = msg.get("body", b"")
        size += len(data)
        if size > limit:
            raise InvalidRequestError(f"the request body exceeds the server's max_body_bytes ({limit} bytes)")
        chunks.append(data)
        if not msg.get("more_body", False):
            return b"".join(chunks)


async def _until_disconnect(receive, work, on_disconnect=None) -> tuple[bool, Any, BaseException | None]:
    """Run ``await work()`` while watching for the client's disconnect, which calls
    ``on_disconnect()`` (interrupting the engine request: the engine's steps are shielded, so a
    cancellation alone may only land when the request ends) and cancels the work.
    Returns ``(disconnected, result, exception)``."""
    out: dict[str, Any] = {"disconnected": False, "result": None, "error": None, "finished": False}
    async with anyio.create_task_group() as tg:
        async def watch():
            while True:
                msg = await receive()
                if msg["type"] == "http.disconnect":
                    if not out.get("finished"):  # (not the one after our own last message)
                        out["disconnected"] = True
                        if on_disconnect is not None:
                            on_disconnect()
                    tg.cancel_scope.cancel()
                    return

        async def run():
            try:
                out["result"] = await work()
            except Exception as e:
                out["error"] = e
            out["finished"] = True
            tg.cancel_scope.cancel()

        tg.start_soon(watch)
        tg.start_soon(run)
    return out["disconnected"], out["result"], out["error"]


def _check_auth(server: GrammaskServer, headers) -> bool:
    if not server.api_key:
        return True
    auth = headers.get("authorization", "")
    return auth == f"Bearer {server.api_key}" or headers.get("x-api-key") == server.api_key


# ---------------------------------------------------------------------------------------------- endpoints
class _ChatCompletionsEndpoint:
    """``POST /v1/chat/completions`` as a raw ASGI app: full control of disconnects and streaming."""

    def __init__(self, server: GrammaskServer):
        self.server = server

    async def __call__(self, scope, receive, send) -> None:
        server = self.server
        if scope["method"] != "POST":
            await _send_json(send, 405, error_body("use POST", "invalid_request_error", None, "method_not_allowed"),
                             {"allow": "POST"})
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        if not _check_auth(server, headers):
            await _send_json(send, 401, error_body("invalid or missing API key", "invalid_request_error", None,
                                                   "invalid_api_key"))
            return
        ctype = headers.get("content-type", "").split(";", 1)[0].strip().lower()
        if ctype.startswith("multipart/"):  # a form upload is never a JSON body; any other type is parsed
            await _send_json(send, 415, error_body(   # as JSON (curl -d sends form-urlencoded)
                f"unsupported Content-Type {ctype!r}: send the request as JSON (Content-Type: application/json)",
                "invalid_request_error", None, "unsupported_media_type"))
            return
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) > server.max_body_bytes:  # refused without reading it
            await _send_json(send, 413, error_body(
                f"the request body ({int(declared)} bytes) exceeds the server's max_body_bytes "
                f"({server.max_body_bytes} bytes)", "invalid_request_error", None, "body_too_large"))
            return
        try:
            body = await _read_body(receive, server.max_body_bytes)
        except _Disconnected:
            server.disconnected += 1
            return
        except InvalidRequestError as e:
            await _send_json(send, 413, error_body(str(e), "invalid_request_error", None, "body_too_large"))
            return
        try:
            data = json.loads(body)
        except (ValueError, RecursionError) as e:  # (UnicodeDecodeError is a ValueError)
            why = "it is nested too deeply" if isinstance(e, RecursionError) else str(e)
            await _send_json(send, 400, error_body(f"the request body is not valid JSON: {why}",
                                                   "invalid_request_error", None, "invalid_json"))
            return
        if not isinstance(data, dict):
            await _send_json(send, 400, error_body("the request body must be a JSON object", "invalid_request_error",
                                                   None, "invalid_json"))
            return
        for k in IGNORED_FIELDS & data.keys():
            del data[k]
        from ..pipeline.protocol import parse_request

        try:
            req = parse_request(data)  # cheap checks before queueing
            _check_constraint_size(req, server.max_schema_bytes)  # before anything is compiled
        except InvalidRequestError as e:
            status, err = error_for_exception(e)
            await _send_json(send, status, err)
            return
        except RecursionError:
            await _send_json(send, 400, error_body("the request is nested too deeply", "invalid_request_error",
                                                   None, "invalid_request"))
            return
        if req.request_id is None:  # known before the engine answers: a disconnect can interrupt it
            req = req.model_copy(update={"request_id": "chatcmpl-" + uuid.uuid4().hex})
        try:
            engine = await server.start()
        except Exception as e:  # pragma: no cover - a broken model path in a lazily started app
            logger.exception("the engine failed to start")
            status, err = error_for_exception(e if isinstance(e, GrammaskError) else EngineClosedError(str(e)))
            await _send_json(send, 503 if status >= 500 else status, err)
            return

        # admission: a slot, or the bounded queue, or 503
        disconnected, lease, error = await _until_disconnect(receive, server.slots.acquire)
        if disconnected:
            server.disconnected += 1
            if lease is not None:
                lease.release()
            return
        if error is not None:
            status, err = error_for_exception(error, req)
            await _send_json(send, status, err, server.retry_headers(status))
            return
        handed_over = False
        try:
            if req.stream:
                handed_over = True
                await self._stream(engine, req, lease, receive, send)
            else:
                await self._complete(engine, req, receive, send)
        finally:
            if not handed_over:
                lease.release()

    async def _complete(self, engine, req, receive, send) -> None:
        server = self.server
        disconnected, result, error = await _until_disconnect(receive, lambda: engine.chat.completions.create(req),
                                                              lambda: engine.interrupt(req.request_id))
        if disconnected:
            server.disconnected += 1
            return
        if error is not None:
            server.failed += 1
            status, err = error_for_exception(error, req)
            if status >= 500:
                logger.warning("request failed: %s: %s", type(error).__name__, error)
            await _send_json(send, status, err, server.retry_headers(status) if isinstance(error, QueueFullError)
                             else None)
            return
        server.completed += 1
        await _send_json(send, 200, result.model_dump_json().encode("utf-8"), {"x-request-id": result.id})

    async def _stream(self, engine, req, lease: _Lease, receive, send) -> None:
        server = self.server
        stream = None
        try:
            # compiling the grammar (and prefill) happen here: errors are still plain HTTP errors
            interrupt = lambda: engine.interrupt(req.request_id)  # noqa: E731
            disconnected, stream, error = await _until_disconnect(
                receive, lambda: engine.chat.completions.create(req), interrupt)
            if disconnected:
                server.disconnected += 1
                return
            if error is not None:
                server.failed += 1
                status, err = error_for_exception(error, req)
                await _send_json(send, status, err, server.retry_headers(status)
                                 if isinstance(error, QueueFullError) else None)
                return
            await send({"type": "http.response.start", "status": 200, "headers": [
                (b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache"),
                (b"x-accel-buffering", b"no"), (b"x-request-id", stream.request_id.encode("latin-1"))]})
            outcome: dict[str, Any] = {}

            async def pump():
                try:
                    async for chunk in stream:
                        data = chunk.model_dump_json(exclude_none=True)
                        await send({"type": "http.response.body", "body": b"data: " + data.encode("utf-8") + b"\n\n",
                                    "more_body": True})
                except Exception as e:
                    outcome["error"] = e
                    _, err = error_for_exception(e, req)
                    await send({"type": "http.response.body", "body": b"data: " + _json_bytes(err) + b"\n\n",
                                "more_body": True})
                else:
                    await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": True})
                await send({"type": "http.response.body", "body": b"", "more_body": False})

            disconnected, _, error = await _until_disconnect(receive, pump, interrupt)
            if error is None:
                error = outcome.get("error")
            if disconnected:
                server.disconnected += 1
            elif error is not None:
                server.failed += 1
                logger.warning("stream failed: %s: %s", type(error).__name__, error)
            else:
                server.completed += 1
        finally:
            # abort the generation (if still running) and free the slot at once
            with anyio.CancelScope(shield=True):
                if stream is not None:
                    with contextlib.suppress(Exception):
                        await stream.aclose()
                lease.release()


def _error_json(status: int, message: str, type_: str, code: str | None, headers=None) -> JSONResponse:
    return JSONResponse(error_body(message, type_, None, code), status_code=status, headers=headers)


def create_app(engine=None, *, model=None, device: str = "auto", engine_kwargs: dict | None = None,
               max_concurrency: int | None = None, max_queue: int | None = None, retry_after: float = 1.0,
               api_key: str | None = None, close_engine: bool | None = None,
               served_model_name: str | None = None, max_body_bytes: int | None = None,
               max_schema_bytes: int | None = None) -> Starlette:
    """The ASGI app (Starlette) serving ``engine``, or an engine made at startup from ``model``
    (None: the embedded model; a path; a ready :class:`~grammask.pipeline.backend.ModelBackend`)
    with ``device`` and ``engine_kwargs`` (``AsyncEngine`` options).

    ``max_concurrency`` (default 32): requests generating at once; ``max_queue`` (default
    ``2 * max_concurrency``): requests waiting for a slot before 503s; ``retry_after``: seconds
    in the 503's ``Retry-After``; ``api_key``: require ``Authorization: Bearer <key>``;
    ``close_engine``: close the engine at shutdown (default: only an engine the app made);
    ``served_model_name``: the model id reported (default: the engine's); ``max_body_bytes``
    (default 32 MiB): larger bodies get a 413; ``max_schema_bytes`` (default 1 MiB): requests
    whose schemas (canonical JSON text), grammar or pattern add up to more get a 400
    ``schema_too_large`` before anything is compiled."""
    from ..pipeline import AsyncEngine

    if engine is not None and not isinstance(engine, AsyncEngine):
        raise TypeError(f"engine must be an AsyncEngine (pass model= for a backend or a path), "
                        f"not {type(engine).__name__}")
    server = GrammaskServer(engine, model=model, device=device, engine_kwargs=engine_kwargs,
                            max_concurrency=max_concurrency, max_queue=max_queue, retry_after=retry_after,
                            api_key=api_key, close_engine=close_engine, served_model_name=served_model_name,
                            max_body_bytes=max_body_bytes, max_schema_bytes=max_schema_bytes)

    def denied(request: Request) -> JSONResponse | None:
        if _check_auth(server, request.headers):
            return None
        return _error_json(401, "invalid or missing API key", "invalid_request_error", "invalid_api_key")

    def model_card() -> dict:
        return {"id": server.model_name, "object": "model", "created": server.created, "owned_by": "grammask"}

    async def models(request: Request) -> Response:
        if (r := denied(request)) is not None:
            return r
        await server.start()
        return JSONResponse({"object": "list", "data": [model_card()]})

    async def model_info(request: Request) -> Response:
        if (r := denied(request)) is not None:
            return r
        await server.start()
        if request.path_params["model_id"] != server.model_name:
            return JSONResponse(error_body(f"the model {request.path_params['model_id']!r} does not exist",
                                           "invalid_request_error", "model", "model_not_found"), status_code=404)
        return JSONResponse(model_card())

    async def health(request: Request) -> Response:
        stats = server.stats()
        if server.closed:
            return JSONResponse({"status": "closed", **stats}, status_code=503)
        if server.engine is None:
            return JSONResponse({"status": "starting", **stats}, status_code=503)
        return JSONResponse({"status": "ok", **stats})

    async def http_error(request: Request, exc: HTTPException) -> Response:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        return _error_json(exc.status_code, str(exc.detail), "invalid_request_error", code, exc.headers)

    async def server_error(request: Request, exc: Exception) -> Response:
        status, body = error_for_exception(exc)
        return JSONResponse(body, status_code=status)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        await server.start()
        try:
            yield
        finally:
            await server.aclose()

    app = Starlette(
        routes=[
            Route("/v1/chat/completions", _ChatCompletionsEndpoint(server), methods=["POST"]),
            Route("/v1/models", models, methods=["GET"]),
            Route("/v1/models/{model_id:path}", model_info, methods=["GET"]),
            Route("/health", health, methods=["GET"]),
        ],
        exception_handlers={HTTPException: http_error, Exception: server_error},
        lifespan=lifespan,
    )
    app.state.grammask = server
    return app


@contextlib.contextmanager
def serve_in_thread(app, host: str = "127.0.0.1", port: int = 0, *, log_level: str = "warning",
                    startup_timeout: float = 600.0):
    """Run ``app`` with uvicorn in a background thread (its own event loop) on ``host:port``
    (port 0: a free port) and yield its base URL (``http://host:port``); stop it on exit.
    For tests, notebooks and benchmarks."""
    import socket
    import threading

    import uvicorn

    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level=log_level, timeout_graceful_shutdown=10))
    failure: list[BaseException] = []

    def run():
        try:
            server.run(sockets=[sock])
        except BaseException as e:  # pragma: no cover - reported below
            failure.append(e)

    thread = threading.Thread(target=run, name=f"grammask-uvicorn-{port}", daemon=True)
    thread.start()
    deadline = time.monotonic() + startup_timeout
    try:
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the server did not start on {host}:{port}"
                                   + (f": {failure[0]!r}" if failure else ""))
            time.sleep(0.02)
        yield f"http://{'[' + host + ']' if ':' in host else host}:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=60)
        sock.close()
