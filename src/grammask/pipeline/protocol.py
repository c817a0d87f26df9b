"""Requests and responses of the chat engine: pydantic models shaped like OpenAI's.

``ChatCompletionRequest`` validates everything that can be checked without the model (ranges,
types, combinations); :func:`parse_request` turns pydantic's ``ValidationError`` into a typed
:class:`~grammask.errors.InvalidRequestError` naming the field at fault. Response models
(``ChatCompletion``, ``ChatCompletionChunk``) follow the OpenAI Python client's field names, with
two grammask additions: ``usage.extra`` (timing figures) and ``choice.incomplete``
(True when the output was cut by ``max_tokens`` or the context size, so it may not satisfy the
response format).
"""
from __future__ import annotations

import json
import re
from typing import Annotated, Any, Dict, List, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, StrictBool, ValidationError, field_validator, model_validator

from ..errors import InvalidRequestError

# ---------------------------------------------------------------------------------------------- messages


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ContentPart(_Model):
    type: Literal["text"] = "text"
    text: str


class FunctionCall(BaseModel):
    name: str
    arguments: str


class ToolCall(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Model):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Optional[Union[str, List[ContentPart]]] = None
    name: Optional[str] = None
    tool_calls: Optional[List[ToolCall]] = None
    tool_call_id: Optional[str] = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content)

    def to_template_dict(self) -> dict:
        d: dict[str, Any] = {"role": "system" if self.role == "developer" else self.role, "content": self.text()}
        if self.name is not None:
            d["name"] = self.name
        if self.tool_calls:
            d["tool_calls"] = [tc.model_dump() for tc in self.tool_calls]
        if self.tool_call_id is not None:
            d["tool_call_id"] = self.tool_call_id
        return d


# ---------------------------------------------------------------------------------------------- response_format


def _schema_value(v: Any, field: str) -> Any:
    """A JSON Schema given as a dict/bool or as JSON text (JSON text is accepted too)."""
    if isinstance(v, str):
        try:
            v = json.loads(v)
        except ValueError as e:
            raise ValueError(f"{field} is not valid JSON: {e}") from None
        except RecursionError:
            raise ValueError(f"{field} is nested too deeply") from None
    if not isinstance(v, (dict, bool)):
        raise ValueError(f"{field} must be a JSON Schema object (dict or JSON text), got {type(v).__name__}")
    return v


class TextFormat(_Model):
    type: Literal["text"]


#: grammask extension of the grammar-constrained formats: ``"canonical": true`` allows only the
#: tokenizer's canonical token sequences (README "Canonical tokenization"); None: the request's
#: top-level ``canonical``, else the engine's default
_CanonicalOption = Optional[StrictBool]


class JsonObjectFormat(_Model):
    """Any JSON object; with ``schema`` (dict or JSON text) one valid against it."""

    type: Literal["json_object"]
    schema_: Optional[Any] = Field(default=None, alias="schema")
    canonical: _CanonicalOption = None
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    @field_validator("schema_")
    @classmethod
    def _schema(cls, v):
        return None if v is None else _schema_value(v, "schema")


class JsonSchemaSpec(_Model):
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: Optional[str] = None
    schema_: Any = Field(alias="schema")
    strict: Optional[bool] = None
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    @field_validator("schema_")
    @classmethod
    def _schema(cls, v):
        return _schema_value(v, "schema")


class JsonSchemaFormat(_Model):
    """OpenAI's ``{"type": "json_schema", "json_schema": {"name", "schema", "strict"}}``."""

    type: Literal["json_schema"]
    json_schema: JsonSchemaSpec
    canonical: _CanonicalOption = None


class GrammarFormat(_Model):
    """An EBNF/GBNF grammar (root rule ``root``)."""

    type: Literal["grammar"]
    grammar: str = Field(min_length=1)
    canonical: _CanonicalOption = None


class RegexFormat(_Model):
    """The whole output matches an ECMA-262 regex."""

    type: Literal["regex"]
    pattern: str = Field(min_length=1)
    canonical: _CanonicalOption = None


class TagStructure(_Model):
    """One tag: ``begin`` literal, a body valid against ``schema`` (JSON), ``end`` literal."""

    begin: str = Field(min_length=1)
    schema_: Any = Field(alias="schema")
    end: str = ""
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    @field_validator("schema_")
    @classmethod
    def _schema(cls, v):
        return _schema_value(v, "schema")


class StructuralTagFormat(_Model):
    """xgrammar's (legacy) structural tag: free text until one of ``triggers`` appears; from
    there the text must continue as one of the ``structures`` whose ``begin`` starts with that
    trigger (body constrained by its schema), then free text again. web-llm nests the same
    fields under ``structural_tag`` (an object or its JSON text); both forms are accepted."""

    type: Literal["structural_tag"]
    structures: List[TagStructure] = Field(min_length=1)
    triggers: List[Annotated[str, Field(min_length=1)]] = Field(min_length=1)
    canonical: _CanonicalOption = None

    @model_validator(mode="before")
    @classmethod
    def _unnest(cls, data):
        if isinstance(data, dict) and "structural_tag" in data:
            inner = data["structural_tag"]
            if isinstance(inner, str):
                try:
                    inner = json.loads(inner)
                except ValueError as e:
                    raise ValueError(f"structural_tag is not valid JSON: {e}") from None
            if not isinstance(inner, dict):
                raise ValueError("structural_tag must be an object")
            rest = {k: v for k, v in data.items() if k != "structural_tag"}
            data = {**rest, **inner}
        return data

    @model_validator(mode="after")
    def _check(self):
        for i, s in enumerate(self.structures):
            if not any(s.begin.startswith(t) for t in self.triggers):
                raise ValueError(f"structures[{i}].begin {s.begin!r} starts with none of the triggers")
        for t in self.triggers:
            if not any(s.begin.startswith(t) for s in self.structures):
                raise ValueError(f"trigger {t!r} begins no structure")
        return self


ResponseFormat = Annotated[
    Union[TextFormat, JsonObjectFormat, JsonSchemaFormat, GrammarFormat, RegexFormat, StructuralTagFormat],
    Field(discriminator="type"),
]

# ---------------------------------------------------------------------------------------------- tools


class FunctionDefinition(_Model):
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    description: Optional[str] = None
    parameters: Any = None
    strict: Optional[bool] = None

    @field_validator("parameters")
    @classmethod
    def _params(cls, v):
        return {"type": "object", "properties": {}} if v is None else _schema_value(v, "parameters")


class Tool(_Model):
    type: Literal["function"] = "function"
    function: FunctionDefinition


class NamedFunction(_Model):
    name: str


class NamedToolChoice(_Model):
    type: Literal["function"] = "function"
    function: NamedFunction


ToolChoice = Union[Literal["none", "auto", "required"], NamedToolChoice]


class StreamOptions(_Model):
    include_usage: bool = False


# ---------------------------------------------------------------------------------------------- request


class ChatCompletionRequest(_Model):
    """OpenAI's chat completion parameters (plus the grammask extensions ``fast_forward``,
    ``canonical`` and ``ignore_eos``)."""

    messages: List[ChatMessage] = Field(min_length=1)
    model: Optional[str] = None
    response_format: Optional[ResponseFormat] = None
    stream: bool = False
    stream_options: Optional[StreamOptions] = None
    max_tokens: Optional[int] = Field(default=None, ge=1)
    max_completion_tokens: Optional[int] = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=-1)
    seed: Optional[int] = None
    stop: Optional[Union[str, List[str]]] = None
    logit_bias: Optional[Dict[int, float]] = None
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    repetition_penalty: float = Field(default=1.0, gt=0.0)
    logprobs: bool = False
    top_logprobs: Optional[int] = Field(default=None, ge=0, le=20)
    n: int = Field(default=1, ge=1, le=16)
    tools: Optional[List[Tool]] = None
    tool_choice: Optional[ToolChoice] = None
    parallel_tool_calls: Optional[bool] = None
    user: Optional[str] = None
    request_id: Optional[str] = None
    #: grammask: feed grammar-forced tokens in one forward pass (None: the engine's default)
    fast_forward: Optional[bool] = None
    #: grammask: allow only canonical token sequences under the grammar (None: the engine's default;
    #: also accepted as ``response_format.canonical``). No effect on unconstrained text.
    canonical: Optional[StrictBool] = None
    #: grammask: with ``canonical``, where no canonical token is left but the grammar allows some
    #: (a dead end), take the grammar's plain mask for that step instead of failing the request;
    #: counted in ``usage.extra.canonical_fallbacks`` (None: the engine's default)
    canonical_fallback: Optional[StrictBool] = None
    #: grammask: ignore the end-of-text token (generate to max_tokens, text format only)
    ignore_eos: bool = False

    @field_validator("stop")
    @classmethod
    def _stop(cls, v):
        if v is None:
            return None
        v = [v] if isinstance(v, str) else list(v)
        if any(s == "" for s in v):
            raise ValueError("stop strings must not be empty")
        return v or None

    @field_validator("logit_bias")
    @classmethod
    def _bias(cls, v):
        if v is None:
            return None
        for k, b in v.items():
            if k < 0:
                raise ValueError(f"logit_bias token id {k} is negative")
            if not -100.0 <= b <= 100.0:
                raise ValueError(f"logit_bias value {b} for token {k} is outside [-100, 100]")
        return v

    @model_validator(mode="after")
    def _combinations(self):
        # "param: message": parse_request reports the param
        if self.top_logprobs is not None and self.top_logprobs > 0 and not self.logprobs:
            raise ValueError("top_logprobs: top_logprobs needs logprobs=true")
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options: stream_options is only allowed with stream=true")
        if self.max_tokens is not None and self.max_completion_tokens is not None \
                and self.max_tokens != self.max_completion_tokens:
            raise ValueError("max_completion_tokens: max_tokens and max_completion_tokens disagree")
        if self.tool_choice is not None and not self.tools:
            raise ValueError("tool_choice: tool_choice needs tools")
        if self.tools:
            names = [t.function.name for t in self.tools]
            if len(set(names)) != len(names):
                raise ValueError("tools: tools have duplicate function names")
            if isinstance(self.tool_choice, NamedToolChoice) and self.tool_choice.function.name not in names:
                raise ValueError(f"tool_choice: tool_choice names the unknown function "
                                 f"{self.tool_choice.function.name!r}")
            rf = self.response_format
            if rf is not None and rf.type != "text" and self.tool_choice != "none":
                raise ValueError("response_format: a response_format other than text cannot be combined with "
                                 "tools (use tool_choice='none', or a structural_tag response_format)")
        rf_canon = getattr(self.response_format, "canonical", None)
        if self.canonical is not None and rf_canon is not None and self.canonical != rf_canon:
            raise ValueError(f"canonical: canonical={str(self.canonical).lower()} and response_format.canonical="
                             f"{str(rf_canon).lower()} disagree (give one, or the same value in both)")
        if self.ignore_eos and self.response_format is not None and self.response_format.type != "text":
            raise ValueError("ignore_eos: ignore_eos is only allowed with the text response format")
        return self

    @property
    def completion_limit(self) -> Optional[int]:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    @property
    def canonical_requested(self) -> Optional[bool]:
        """``canonical`` or ``response_format.canonical`` (they agree when both are given); None:
        the engine's default."""
        if self.canonical is not None:
            return self.canonical
        return getattr(self.response_format, "canonical", None)

    @property
    def tools_active(self) -> bool:
        return bool(self.tools) and self.tool_choice != "none"


_PARAM_PREFIX = re.compile(r"^(?:Value error, )?([a-z_]+): ")


def parse_request(request: "ChatCompletionRequest | dict | None" = None, **kwargs) -> ChatCompletionRequest:
    """Validate a request given as a model, a dict, or keyword arguments; raise
    :class:`InvalidRequestError` (with ``param``) on any problem."""
    if isinstance(request, ChatCompletionRequest):
        if kwargs:
            request = request.model_dump(by_alias=True, exclude_unset=True) | kwargs
        else:
            return request
    data = dict(request or {}) | kwargs
    try:
        return ChatCompletionRequest.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        loc = [str(p) for p in err.get("loc", ())]
        # drop the discriminator tags pydantic puts into union locations
        if len(loc) >= 2 and loc[0] == "response_format" and loc[1] in (
                "text", "json_object", "json_schema", "grammar", "regex", "structural_tag"):
            loc = [loc[0]] + loc[2:]
        param = ".".join(loc) or None
        msg = err.get("msg", str(e))
        m = _PARAM_PREFIX.match(msg)
        if m is not None and m.group(1) in ChatCompletionRequest.model_fields:
            msg = msg[m.end():]
            if param is None:
                param = m.group(1)
        raise InvalidRequestError(msg, param=param) from None


# ---------------------------------------------------------------------------------------------- responses


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: Optional[List[int]] = None


class TokenLogprob(BaseModel):
    token: str
    logprob: float
    bytes: Optional[List[int]] = None
    top_logprobs: List[TopLogprob] = Field(default_factory=list)


class ChoiceLogprobs(BaseModel):
    content: Optional[List[TokenLogprob]] = None


class UsageExtra(BaseModel):
    """Timing figures of one request (seconds and tokens per second); docs/engine.md lists them."""

    model_config = ConfigDict(extra="allow")
    e2e_latency_s: float = 0.0
    time_to_first_token_s: float = 0.0
    prefill_tokens_per_s: float = 0.0
    decode_tokens_per_s: float = 0.0
    time_per_output_token_s: float = 0.0
    grammar_init_s: float = 0.0
    grammar_per_token_s: float = 0.0
    forced_tokens: int = 0
    #: grammask: total seconds in the model's forward passes and in mask filling (the two overlap)
    forward_s: float = 0.0
    mask_s: float = 0.0
    #: grammask: the compiled grammar came from the cache
    grammar_cache_hit: bool = False
    #: grammask: canonical steps that fell back to the plain mask (``canonical_fallback``)
    canonical_fallbacks: int = 0


class CompletionUsage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    extra: Optional[UsageExtra] = None


class ChatCompletionMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: Optional[str] = None
    tool_calls: Optional[List[ToolCall]] = None


FinishReason = Literal["stop", "length", "tool_calls", "abort"]


class Choice(BaseModel):
    index: int
    message: ChatCompletionMessage
    finish_reason: Optional[FinishReason] = None
    logprobs: Optional[ChoiceLogprobs] = None
    #: grammask: the output was cut short (max_tokens / context) and may violate the format
    incomplete: bool = False


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: List[Choice]
    usage: Optional[CompletionUsage] = None
    system_fingerprint: Optional[str] = None


class ToolCallDelta(BaseModel):
    index: int
    id: Optional[str] = None
    type: Optional[Literal["function"]] = None
    function: Optional[Dict[str, str]] = None


class ChoiceDelta(BaseModel):
    role: Optional[Literal["assistant"]] = None
    content: Optional[str] = None
    tool_calls: Optional[List[ToolCallDelta]] = None


class ChunkChoice(BaseModel):
    index: int
    delta: ChoiceDelta
    finish_reason: Optional[FinishReason] = None
    logprobs: Optional[ChoiceLogprobs] = None
    incomplete: bool = False


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: List[ChunkChoice]
    usage: Optional[CompletionUsage] = None
    system_fingerprint: Optional[str] = None
