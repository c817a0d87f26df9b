"""The async chat pipeline: :class:`AsyncEngine`, an in-process engine with an OpenAI-shaped client API.

Modules: ``backend`` (the model protocol), ``protocol`` (pydantic requests/responses),
``response_format`` (validation, canonical cache keys, compile; the cache is the grammar
compiler's), ``structural_tag`` (tools as structural tags), ``sampling`` (penalties, temperature,
top-p/top-k, seeded draws, logprobs), ``fast_forward`` (canonical forced tokens), ``streaming``
(UTF-8 safe deltas, stop strings), ``scheduler`` (bounded admission queue, each step's batch:
``max_batch``, token budget, chunked prefill, fairness), ``engine`` (admission, batched steps,
streams), ``scripted``
(a deterministic backend for tests).
"""
from .backend import ModelBackend
from .engine import AsyncEngine, ChatCompletionStream
from .protocol import (
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    CompletionUsage,
    UsageExtra,
    parse_request,
)
from .scheduler import QueueFullError

__all__ = [
    "AsyncEngine", "ChatCompletion", "ChatCompletionChunk", "ChatCompletionRequest", "ChatCompletionStream",
    "CompletionUsage", "ModelBackend", "QueueFullError", "UsageExtra", "parse_request",
]
