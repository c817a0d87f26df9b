"""Schema input: what a caller may pass as a schema, the draft it declares, its cache-key text."""
from __future__ import annotations

import json

from ...errors import InvalidSchemaError

__all__ = ["normalize_schema_input", "canonical_schema_text", "detect_draft"]


def normalize_schema_input(schema) -> dict | bool:
    """A schema as a dict or bool: accepts a dict, a bool, JSON text (str/bytes) or a pydantic
    model class (``model_json_schema()``)."""
    if isinstance(schema, bool) or isinstance(schema, dict):
        return schema
    if isinstance(schema, (bytes, bytearray, memoryview)):
        schema = bytes(schema).decode("utf-8", errors="strict")
    if isinstance(schema, str):
        try:
            obj = json.loads(schema)
        except ValueError as e:
            raise InvalidSchemaError(f"schema is not valid JSON: {e}") from None
        if not isinstance(obj, (dict, bool)):
            raise InvalidSchemaError("a schema must be a JSON object or a boolean")
        return obj
    mjs = getattr(schema, "model_json_schema", None)
    if callable(mjs):
        return mjs()
    try:  # pydantic TypeAdapter-like objects
        from pydantic import TypeAdapter

        if isinstance(schema, TypeAdapter):
            return schema.json_schema()
    except ImportError:  # pragma: no cover
        pass
    raise InvalidSchemaError(f"cannot read a JSON schema from {type(schema).__name__}")


def detect_draft(root) -> int:
    if not isinstance(root, dict):
        return 2020
    s = root.get("$schema")
    if not isinstance(s, str):
        return 2020
    for tag, d in (("draft-03", 3), ("draft-04", 4), ("draft-06", 6), ("draft-07", 7), ("2019-09", 2019),
                   ("2020-12", 2020)):
        if tag in s:
            return d
    return 2020


def canonical_schema_text(schema) -> str:
    """A cache key for a schema: keys sorted everywhere except inside ``properties``, whose order
    is the order of the output (so two schemas differing only there get different grammars)."""

    def canon(x, ordered=False):
        if isinstance(x, dict):
            items = x.items() if ordered else sorted(x.items())
            return {k: canon(v, ordered=(k == "properties" and not ordered)) for k, v in items}
        if isinstance(x, list):
            return [canon(v) for v in x]
        return x

    return json.dumps(canon(schema), separators=(",", ":"), ensure_ascii=False)

