"""Extract a JSON object valid against a schema from free text, on the embedded model
(SmolLM2-135M-Instruct, CPU or CUDA), validate it with jsonschema and print it.

    python examples/extract.py                       # make run: the fastest backend installed
    python examples/extract.py --backend transformers

``--backend auto`` (the default) runs the GGUF file on llama.cpp when the ``llamacpp`` extra is
installed (``make run`` builds it), else on transformers: measured on this project's 2-core CPU,
llama.cpp decodes the embedded model about 5x faster (README, "Which backend").
"""
from __future__ import annotations

import argparse
import json
import sys

import anyio

from grammask.adapters.models import create_engine

TEXT = ("Hi, I'm Maria Lopez, a 34 year old software engineer living in Madrid. "
        "I love hiking, chess and cooking. You can reach me at maria.lopez@example.com.")

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "city": {"type": "string", "maxLength": 30},
        "job": {"type": "string", "maxLength": 40},
        "hobbies": {"type": "array", "items": {"type": "string", "maxLength": 20}, "maxItems": 5},
        "email": {"type": "string", "pattern": "^[a-z0-9._]+@[a-z0-9.]+\\.[a-z]{2,}$"},
    },
    "required": ["name", "age", "city", "job", "hobbies", "email"],
    "additionalProperties": False,
}


async def main(backend: str) -> int:
    import jsonschema

    engine = await create_engine(backend=backend)
    print(f"embedded model (SmolLM2-135M-Instruct) on {type(engine.backend).__name__}", file=sys.stderr)
    try:
        reply = await engine.chat.completions.create(
            messages=[
                {"role": "system", "content": "Extract the person described by the user as JSON."},
                {"role": "user", "content": TEXT},
            ],
            response_format={"type": "json_schema",
                             "json_schema": {"name": "person", "schema": SCHEMA, "strict": True}},
            temperature=0.0,
            max_tokens=200,
        )
    finally:
        await engine.aclose()
    choice = reply.choices[0]
    if choice.finish_reason != "stop":
        print(f"generation stopped early ({choice.finish_reason}): {choice.message.content!r}", file=sys.stderr)
        return 1
    obj = json.loads(choice.message.content)
    jsonschema.validate(obj, SCHEMA)
    print(json.dumps(obj, indent=2, ensure_ascii=False))
    u, x = reply.usage, reply.usage.extra
    print(f"valid against the schema | {u.prompt_tokens} prompt + {u.completion_tokens} completion tokens "
          f"({x.forced_tokens} forced) | {x.decode_tokens_per_s:.1f} tok/s | grammar init "
          f"{x.grammar_init_s * 1e3:.0f} ms, {x.grammar_per_token_s * 1e3:.2f} ms/token", file=sys.stderr)
    return 0


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", choices=["auto", "transformers", "llamacpp"], default="auto")
    sys.exit(anyio.run(main, ap.parse_args().backend))
