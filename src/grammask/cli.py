"""``grammask chat [--schema FILE | --grammar FILE | --regex P | --json] "prompt"``: one chat turn on
the embedded model (or ``--model``), constrained as asked; prints the answer, then a usage line."""
from __future__ import annotations

import argparse
import json
import sys


def _usage_line(usage) -> str:
    x = usage.extra
    parts = [f"usage: prompt {usage.prompt_tokens} + completion {usage.completion_tokens} = {usage.total_tokens} tokens"]
    if x is not None:
        parts.append(f"ttft {x.time_to_first_token_s:.3f}s")
        parts.append(f"e2e {x.e2e_latency_s:.3f}s")
        parts.append(f"prefill {x.prefill_tokens_per_s:.0f} tok/s")
        parts.append(f"decode {x.decode_tokens_per_s:.1f} tok/s")
        if x.grammar_init_s or x.grammar_per_token_s:
            parts.append(f"grammar init {x.grammar_init_s * 1e3:.1f} ms"
                         f"{' (cached)' if x.grammar_cache_hit else ''}, {x.grammar_per_token_s * 1e3:.2f} ms/token")
            parts.append(f"forced {x.forced_tokens}")
    return " | ".join(parts)


def _response_format(args) -> dict | None:
    if args.schema:
        with open(args.schema, encoding="utf-8") as f:
            schema = json.load(f)
        return {"type": "json_schema", "json_schema": {"name": "response", "schema": schema, "strict": True}}
    if args.grammar:
        with open(args.grammar, encoding="utf-8") as f:
            return {"type": "grammar", "grammar": f.read()}
    if args.regex:
        return {"type": "regex", "pattern": args.regex}
    if args.json:
        return {"type": "json_object"}
    return None


async def _chat(args) -> int:
    from .pipeline import AsyncEngine

    engine = await AsyncEngine.create(model=args.model, device=args.device)
    try:
        messages = []
        if args.system:
            messages.append({"role": "system", "content": args.system})
        messages.append({"role": "user", "content": args.prompt})
        kw = dict(messages=messages, response_format=_response_format(args), max_tokens=args.max_tokens,
                  temperature=args.temperature, seed=args.seed, fast_forward=not args.no_fast_forward)
        if args.stream:
            stream = await engine.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw)
            usage = None
            async for chunk in stream:
                for ch in chunk.choices:
                    if ch.delta.content:
                        sys.stdout.write(ch.delta.content)
                        sys.stdout.flush()
                if chunk.usage is not None:
                    usage = chunk.usage
            sys.stdout.write("\n")
        else:
            r = await engine.chat.completions.create(**kw)
            print(r.choices[0].message.content)
            usage = r.usage
            if r.choices[0].finish_reason == "length":
                print("(cut short by --max-tokens: the output is incomplete)", file=sys.stderr)
        if usage is not None:
            print(_usage_line(usage), file=sys.stderr if args.quiet_usage else sys.stdout)
    finally:
        await engine.aclose()
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="grammask", description="grammar-constrained decoding")
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("chat", help="one constrained chat turn")
    c.add_argument("prompt")
    fmt = c.add_mutually_exclusive_group()
    fmt.add_argument("--schema", metavar="FILE", help="JSON Schema file: the answer is valid JSON against it")
    fmt.add_argument("--grammar", metavar="FILE", help="EBNF/GBNF grammar file (root rule: root)")
    fmt.add_argument("--regex", metavar="PATTERN", help="the answer matches this regex")
    fmt.add_argument("--json", action="store_true", help="the answer is a JSON object")
    c.add_argument("--model", default=None, help="GGUF file, model folder or HF id (default: embedded SmolLM2-135M)")
    c.add_argument("--device", default="auto")
    c.add_argument("--system", default=None, help="system message")
    c.add_argument("--max-tokens", type=int, default=256)
    c.add_argument("--temperature", type=float, default=0.0)
    c.add_argument("--seed", type=int, default=None)
    c.add_argument("--stream", action="store_true")
    c.add_argument("--no-fast-forward", action="store_true")
    c.add_argument("--quiet-usage", action="store_true", help="print the usage line on stderr")
    args = p.parse_args(argv)
    import anyio

    from .errors import GrammaskError

    try:
        return anyio.run(_chat, args)
    except (GrammaskError, OSError) as e:
        print(f"grammask: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
