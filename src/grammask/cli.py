"""``grammask chat [--schema FILE | --grammar FILE | --regex P | --json] "prompt"``: one chat turn on
the embedded model (or ``--model``), constrained as asked; prints the answer, then a usage line.

``grammask serve [--model M] [--backend transformers|llamacpp|auto] [--host 127.0.0.1] [--port 8000] [--max-concurrency N]
[--max-body-bytes B] [--max-schema-bytes B]``: the OpenAI-compatible HTTP server
(:mod:`grammask.adapters.server`, needs the ``serve`` extra)."""
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
    from .adapters.models import create_engine

    engine = await create_engine(model=args.model, device=args.device, backend=args.backend,
                                 backend_options=_backend_options(args))
    try:
        messages = []
        if args.system:
            messages.append({"role": "system", "content": args.system})
        messages.append({"role": "user", "content": args.prompt})
        kw = dict(messages=messages, response_format=_response_format(args), max_tokens=args.max_tokens,
                  temperature=args.temperature, seed=args.seed, fast_forward=not args.no_fast_forward)
        if args.canonical:
            kw["canonical"] = True
        if args.canonical_fallback:
            kw["canonical_fallback"] = True
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


def _add_backend_args(p) -> None:
    p.add_argument("--backend", choices=["transformers", "llamacpp", "auto"], default="transformers",
                   help="model runtime: transformers (default), llamacpp (GGUF on CPU, needs the 'llamacpp' "
                        "extra) or auto (llamacpp for a GGUF model when installed)")
    p.add_argument("--threads", type=int, default=None, metavar="T",
                   help="llama.cpp threads (llamacpp backend; default: llama.cpp's own)")


def _backend_options(args) -> dict:
    if args.backend != "transformers" and args.threads is not None:
        return {"n_threads": args.threads}
    return {}


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
    _add_backend_args(c)
    c.add_argument("--system", default=None, help="system message")
    c.add_argument("--max-tokens", type=int, default=256)
    c.add_argument("--temperature", type=float, default=0.0)
    c.add_argument("--seed", type=int, default=None)
    c.add_argument("--stream", action="store_true")
    c.add_argument("--no-fast-forward", action="store_true")
    c.add_argument("--canonical", action="store_true",
                   help="only the tokenizer's canonical token sequences (README 'Canonical tokenization')")
    c.add_argument("--canonical-fallback", action="store_true",
                   help="with --canonical: the plain mask at a canonical dead end instead of an error")
    c.add_argument("--quiet-usage", action="store_true", help="print the usage line on stderr")
    _add_serve_parser(sub)
    args = p.parse_args(argv)
    if args.command == "serve":
        return _serve(args)
    import anyio

    from .errors import GrammaskError

    try:
        return anyio.run(_chat, args)
    except (GrammaskError, OSError) as e:
        print(f"grammask: error: {e}", file=sys.stderr)
        return 2


def _add_serve_parser(sub) -> None:
    s = sub.add_parser("serve", help="OpenAI-compatible HTTP server (needs the 'serve' extra)")
    s.add_argument("--model", default=None,
                   help="GGUF file, model folder or HF id (default: embedded SmolLM2-135M); 'scripted' serves the "
                        "deterministic test backend, which echoes the last line of the prompt")
    s.add_argument("--device", default="auto")
    _add_backend_args(s)
    s.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--max-concurrency", type=int, default=None, metavar="N",
                   help="requests generating at once (default 32)")
    s.add_argument("--max-queue", type=int, default=None, metavar="M",
                   help="requests waiting for a slot before the server answers 503 (default 2 * N)")
    s.add_argument("--retry-after", type=float, default=1.0, metavar="S", help="Retry-After of a 503, in seconds")
    s.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' (default: $GRAMMASK_API_KEY)")
    s.add_argument("--served-model-name", default=None, help="model id reported by the API")
    s.add_argument("--max-body-bytes", type=int, default=None, metavar="B",
                   help="largest request body accepted, larger ones get a 413 (default 33554432: 32 MiB)")
    s.add_argument("--max-schema-bytes", type=int, default=None, metavar="B",
                   help="largest total size of a request's schemas (canonical JSON text), grammar or regex; "
                        "larger ones get a 400 before any compile (default 1048576: 1 MiB)")
    s.add_argument("--max-batch", type=int, default=None, help="sequences per engine step (default 32)")
    s.add_argument("--json-whitespace", choices=["flexible", "compact"], default=None,
                   help="whitespace JSON formats allow (default flexible)")
    s.add_argument("--torch-threads", type=int, default=None, metavar="T",
                   help="torch.set_num_threads(T) (1 is often fastest on a busy CPU)")
    s.add_argument("--no-gc-freeze", action="store_true",
                   help="leave the started server's heap to the garbage collector's full collections "
                        "(default: frozen out of them once the engine is ready, see pipeline/gc_heap.py)")
    s.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])


def scripted_echo_backend():
    """The scripted backend (:mod:`grammask.pipeline.scripted`) answering the last line of the prompt."""
    from .pipeline.scripted import ScriptedBackend

    def echo(prompt: str) -> str:
        lines = [ln for ln in prompt.strip().splitlines() if ln.strip()]
        return lines[-1].strip() if lines else ""

    return ScriptedBackend(echo, max_calls=1000)  # a server runs for ever: keep its records bounded


def _serve(args) -> int:
    import os

    try:
        import uvicorn

        from .adapters.server import create_app
    except ImportError as e:
        print(f"grammask: error: {e} (pip install 'grammask[serve]')", file=sys.stderr)
        return 2
    if args.torch_threads is not None:
        import torch

        torch.set_num_threads(args.torch_threads)
    model = scripted_echo_backend() if args.model == "scripted" else args.model
    engine_kwargs = {} if args.max_batch is None else {"max_batch": args.max_batch}
    if args.json_whitespace is not None:
        engine_kwargs["json_whitespace"] = args.json_whitespace
    engine_kwargs["freeze_gc"] = not args.no_gc_freeze
    if args.model != "scripted" and args.backend != "transformers":
        # create_engine's own options, passed through the server's engine_kwargs
        engine_kwargs["backend"] = args.backend
        engine_kwargs["backend_options"] = _backend_options(args)
    try:
        app = create_app(model=model, device=args.device, engine_kwargs=engine_kwargs,
                         max_concurrency=args.max_concurrency, max_queue=args.max_queue, retry_after=args.retry_after,
                         api_key=args.api_key or os.environ.get("GRAMMASK_API_KEY") or None,
                         served_model_name=args.served_model_name, max_body_bytes=args.max_body_bytes,
                         max_schema_bytes=args.max_schema_bytes)
    except ValueError as e:
        print(f"grammask: error: {e}", file=sys.stderr)
        return 2
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
