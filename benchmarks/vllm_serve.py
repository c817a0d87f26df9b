"""vLLM end to end (issue 15): ``vllm serve`` with grammask beside vLLM's own structured-output
backends (xgrammar, guidance), same model, same GPU, same run, at 1 and N concurrent clients.

The script starts one ``vllm serve`` per backend, all at once (they share the GPU, each with
``--gpu-memory-utilization`` of it), waits for their ``/health``, then loads them one after the
other (never two at a time), with the same requests:

* grammask: ``--logits-processors grammask.adapters.vllm:GrammaskLogitsProcessor``;
* xgrammar, guidance: ``--structured-outputs-config.backend xgrammar|guidance``;
* unconstrained: the same prompts without any constraint, on the xgrammar server (the reference
  speed of the model and server).

Every server runs the same model runner (``VLLM_USE_V2_MODEL_RUNNER=0``: vLLM's V2 runner does
not take custom logits processors, so grammask runs on V1, and so do the others here, so the
backend is the only difference) and ``--enforce-eager`` (no graph capture: a fast start).

Requests (``openai`` client, chat completions), in turn by kind:
``json_schema`` (``response_format`` strict json_schema, 4 schemas), ``regex`` and ``grammar``
(``structured_outputs`` in the request body, vLLM's field). Each output is checked: the JSON
parsed and validated with ``jsonschema``, the regex with ``re.fullmatch``, the grammar with a
recursive-descent recogniser written here. An output cut by ``max_tokens`` (finish reason
``length``) is counted as ``cut`` and not checked. ``invalid`` must be 0.

Each level runs twice: not streamed (wall time, requests and tokens per second, latency), then the
same requests streamed, for each request's time to its first token and time per output token after
it (TPOT). Backends whose outputs differ in length (a grammar that lets the model stop sooner
finishes the same requests with fewer tokens) compare on TPOT, not on tokens per second.

    python benchmarks/vllm_serve.py --model /root/smol --clients 1,64 --out vllm_serve.md
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import fmt, md_table, percentile  # noqa: E402

LOGITS_PROCESSOR = "grammask.adapters.vllm:GrammaskLogitsProcessor"

# ---------------------------------------------------------------------------------------------- workload
SCHEMAS = [
    {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "city": {"type": "string", "maxLength": 24},
        "tags": {"type": "array", "items": {"type": "string", "enum": ["friend", "work", "family"]},
                 "maxItems": 3}},
     "required": ["name", "age", "city", "tags"], "additionalProperties": False},
    {"type": "object", "properties": {
        "title": {"type": "string", "maxLength": 40},
        "year": {"type": "integer", "minimum": 1900, "maximum": 2030},
        "rating": {"type": "number", "minimum": 0, "maximum": 10},
        "genre": {"type": "string", "enum": ["drama", "comedy", "action", "horror"]}},
     "required": ["title", "year", "rating", "genre"], "additionalProperties": False},
    {"type": "object", "properties": {
        "product": {"type": "string", "maxLength": 30},
        "price": {"type": "number", "minimum": 0},
        "in_stock": {"type": "boolean"},
        "sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"}},
     "required": ["product", "price", "in_stock", "sku"], "additionalProperties": False},
    {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 24},
        "temperature_c": {"type": "number", "minimum": -60, "maximum": 60},
        "conditions": {"type": "string", "enum": ["sunny", "cloudy", "rain", "snow"]},
        "wind": {"type": "object", "properties": {
            "speed_kmh": {"type": "integer", "minimum": 0, "maximum": 300},
            "direction": {"type": "string", "enum": ["N", "E", "S", "W"]}},
            "required": ["speed_kmh", "direction"], "additionalProperties": False}},
     "required": ["city", "temperature_c", "conditions", "wind"], "additionalProperties": False},
]
SCHEMA_PROMPTS = ["Describe a person as JSON.", "Describe a film as JSON.",
                  "Describe a product as JSON.", "Give today's weather as JSON."]

DAYS = "Monday|Tuesday|Wednesday|Thursday|Friday|Saturday|Sunday"
MONTHS = "January|February|March|April|May|June|July|August|September|October|November|December"
REGEX = f"({DAYS}), [1-9][0-9]? ({MONTHS}) 20[0-9][0-9]"
REGEX_PROMPT = "Pick a date next year and write it as: weekday, day month year."

# GBNF (xgrammar, llguidance and grammask all read it): arithmetic over small integers
GRAMMAR = r"""root ::= expr
expr ::= term (("+" | "-") term)*
term ::= factor (("*" | "/") factor)*
factor ::= num | "(" expr ")"
num ::= [1-9] [0-9]? | "0"
"""
GRAMMAR_PROMPT = "Write an arithmetic expression that equals 42."

KINDS = ("json_schema", "regex", "grammar")


def request(kind: str, i: int, constrained: bool = True) -> dict:
    if kind == "json_schema":
        k = i % len(SCHEMAS)
        kw = {"messages": [{"role": "user", "content": SCHEMA_PROMPTS[k]}]}
        if constrained:
            kw["response_format"] = {"type": "json_schema", "json_schema": {
                "name": f"s{k}", "schema": SCHEMAS[k], "strict": True}}
        return kw
    if kind == "regex":
        kw = {"messages": [{"role": "user", "content": REGEX_PROMPT}]}
        if constrained:
            kw["extra_body"] = {"structured_outputs": {"regex": REGEX}}
        return kw
    kw = {"messages": [{"role": "user", "content": GRAMMAR_PROMPT}]}
    if constrained:
        kw["extra_body"] = {"structured_outputs": {"grammar": GRAMMAR}}
    return kw


_NUM = re.compile(r"[1-9][0-9]?|0")


def grammar_ok(s: str) -> bool:
    """Recogniser for GRAMMAR (no whitespace anywhere)."""
    pos = 0

    def factor() -> bool:
        nonlocal pos
        if s.startswith("(", pos):
            pos += 1
            if not expr() or not s.startswith(")", pos):
                return False
            pos += 1
            return True
        m = _NUM.match(s, pos)
        if m:
            pos = m.end()
        return m is not None

    def chain(operand, ops: str) -> bool:     # operand (op operand)*
        nonlocal pos
        if not operand():
            return False
        while pos < len(s) and s[pos] in ops:
            pos += 1
            if not operand():
                return False
        return True

    def expr() -> bool:
        return chain(lambda: chain(factor, "*/"), "+-")

    return expr() and pos == len(s)


def check(kind: str, i: int, text: str) -> str | None:
    """None when ``text`` is valid for request ``i`` of ``kind``, else why not."""
    if kind == "json_schema":
        import jsonschema

        try:
            jsonschema.validate(json.loads(text), SCHEMAS[i % len(SCHEMAS)])
        except Exception as e:  # noqa: BLE001 - any failure is an invalid output
            return f"{type(e).__name__}: {str(e)[:120]}"
        return None
    if kind == "regex":
        return None if re.fullmatch(REGEX, text) else "no regex match"
    return None if grammar_ok(text) else "not in the grammar"


# ---------------------------------------------------------------------------------------------- servers
def launch(backend: str, model: str, port: int, args, log_dir: Path) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", model, "--host", "127.0.0.1",
           "--port", str(port), "--served-model-name", "m", "--seed", "0", "--enforce-eager",
           "--gpu-memory-utilization", str(args.gpu_mem), "--max-num-seqs", str(args.max_num_seqs),
           "--max-model-len", str(args.max_model_len)]
    if args.kv_cache_bytes:  # a fixed KV cache: the servers start together, and vLLM's memory
        # profiling counts the others' allocations as its own (one server got -0.49 GiB on the H200)
        cmd += ["--kv-cache-memory-bytes", str(args.kv_cache_bytes)]
    if backend == "grammask":
        cmd += ["--logits-processors", LOGITS_PROCESSOR]
    else:
        cmd += ["--structured-outputs-config.backend", backend]
    env = dict(os.environ, VLLM_USE_V2_MODEL_RUNNER="0")
    log = open(log_dir / f"vllm_{backend}.log", "w")
    print(f"[{backend}] {' '.join(cmd)}", flush=True)
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)


def healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
            return r.status == 200
    except Exception:  # noqa: BLE001
        return False


# ---------------------------------------------------------------------------------------------- load
async def _complete(client, kwargs: dict, stream: bool, t0: float):
    """One chat completion: (text, finish reason, completion tokens, time to the first content
    chunk or None). Streamed, the text is the deltas joined and the usage comes in the last chunk."""
    if not stream:
        r = await client.chat.completions.create(**kwargs)
        choice = r.choices[0]
        return choice.message.content or "", choice.finish_reason, r.usage.completion_tokens if r.usage else 0, None
    parts, finish, n_tok, first = [], None, 0, None
    it = await client.chat.completions.create(**kwargs, stream=True, stream_options={"include_usage": True})
    async for ch in it:
        if ch.usage is not None:
            n_tok = ch.usage.completion_tokens
        for c in ch.choices:
            if c.delta is not None and c.delta.content:
                if first is None:
                    first = time.perf_counter() - t0
                parts.append(c.delta.content)
            if c.finish_reason:
                finish = c.finish_reason
    return "".join(parts), finish, n_tok, first


async def run_level(port: int, n_clients: int, n_requests: int, constrained: bool, max_tokens: int,
                    temperature: float, stream: bool = False) -> dict:
    import openai

    client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0,
                                timeout=300)
    todo = list(range(n_requests))
    lat, toks = [], 0
    ttft, tpot = [], []   # streamed: time to the first token; per output token after it
    stats = {"ok": 0, "invalid": 0, "cut": 0, "errors": 0}
    cut_kinds = {k: 0 for k in KINDS}
    examples: list[str] = []
    cut_examples: dict[str, str] = {}

    async def worker() -> None:
        nonlocal toks
        while todo:
            i = todo.pop(0)
            kind = KINDS[i % len(KINDS)]
            t0 = time.perf_counter()
            try:
                text, finish, n_tok, first = await _complete(
                    client, dict(model="m", max_tokens=max_tokens, temperature=temperature, seed=i,
                                 **request(kind, i // len(KINDS), constrained)), stream, t0)
            except Exception as e:  # noqa: BLE001
                stats["errors"] += 1
                if len(examples) < 4:
                    examples.append(f"{kind}: error {type(e).__name__}: {str(e)[:200]}")
                continue
            lat.append(time.perf_counter() - t0)
            toks += n_tok
            if first is not None:
                ttft.append(first)
                if n_tok > 1:
                    tpot.append((lat[-1] - first) / (n_tok - 1))
            if finish == "length":
                stats["cut"] += 1
                cut_kinds[kind] += 1
                cut_examples.setdefault(kind, f"{kind}: cut: {text!r:.160}")
                continue
            if not constrained:
                stats["ok"] += 1
                continue
            why = check(kind, i // len(KINDS), text)
            if why is None:
                stats["ok"] += 1
            else:
                stats["invalid"] += 1
                if len(examples) < 4:
                    examples.append(f"{kind}: {why}: {text!r:.200}")

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(n_clients)))
    wall = time.perf_counter() - t0
    await client.close()
    lat.sort()
    ttft.sort()
    tpot.sort()
    nan = float("nan")
    return {"ttft_p50": percentile(ttft, 50) if ttft else nan,
            "tpot_p50": percentile(tpot, 50) if tpot else nan, "tpot_p99": percentile(tpot, 99) if tpot else nan,
            **stats, "cut_kinds": "/".join(str(cut_kinds[k]) for k in KINDS),
            "cut_examples": list(cut_examples.values()), "tok_req": toks / max(1, len(lat)),
            "wall": wall, "req_s": len(lat) / wall, "tok_s": toks / wall, "tokens": toks,
            "p50": percentile(lat, 50) if lat else float("nan"),
            "p99": percentile(lat, 99) if lat else float("nan"), "examples": examples}


def _label(backend: str, constrained: bool) -> str:
    return backend if constrained else f"unconstrained (on the {backend} server)"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="a Hugging Face model folder")
    ap.add_argument("--backends", default="grammask,xgrammar,guidance")
    ap.add_argument("--clients", default="1,64")
    ap.add_argument("--requests", type=int, default=0,
                    help="requests per level (default: max(9, 3 * clients))")
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument("--temperature", type=float, default=0.8)
    ap.add_argument("--gpu-mem", type=float, default=0.25)
    ap.add_argument("--kv-cache-bytes", type=int, default=4 << 30,
                    help="KV cache per server (0: sized by --gpu-mem and vLLM's memory profiling)")
    ap.add_argument("--max-num-seqs", type=int, default=64)
    ap.add_argument("--no-stream", dest="stream", action="store_false",
                    help="skip the streamed pass (time to first token, time per output token)")
    ap.add_argument("--max-model-len", type=int, default=2048)
    ap.add_argument("--port-base", type=int, default=8100)
    ap.add_argument("--start-timeout", type=float, default=240)
    ap.add_argument("--log-dir", default=".")
    ap.add_argument("--out", default=None, help="write the markdown report here too")
    args = ap.parse_args(argv)

    backends = args.backends.split(",")
    levels = [int(c) for c in args.clients.split(",")]
    log_dir = Path(args.log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    ports = {b: args.port_base + k for k, b in enumerate(backends)}
    procs = {b: launch(b, args.model, ports[b], args, log_dir) for b in backends}
    t0 = time.time()
    up: dict[str, float] = {}
    while len(up) + sum(p.poll() is not None for b, p in procs.items() if b not in up) < len(backends) \
            and time.time() - t0 < args.start_timeout:
        for b, p in procs.items():
            if b not in up and p.poll() is None and healthy(ports[b]):
                up[b] = time.time() - t0
                print(f"[{b}] healthy after {up[b]:.0f} s", flush=True)
        time.sleep(1)
    for b, p in procs.items():
        if b not in up:
            print(f"[{b}] NOT UP (rc={p.poll()}); the end of its log:", flush=True)
            print("".join(open(log_dir / f"vllm_{b}.log").readlines()[-25:]), flush=True)

    runs = [(b, True) for b in backends if b in up]
    ref = next((b for b in ("xgrammar", "guidance", "grammask") if b in up), None)
    if ref is not None:
        runs.append((ref, False))
    rows, srows, notes, cuts = [], [], [], []
    try:
        for b, _ in runs:  # warm-up: one unconstrained and one request of each kind, not timed
            asyncio.run(run_level(ports[b], 1, 1, False, 8, args.temperature))
            asyncio.run(run_level(ports[b], 3, 3, True, 8, args.temperature))
        for n in levels:
            n_req = args.requests or max(9, 3 * n)
            for b, constrained in runs:
                r = asyncio.run(run_level(ports[b], n, n_req, constrained, args.max_tokens,
                                          args.temperature))
                name = _label(b, constrained)
                print(f"[{name}] clients={n}: {r}", flush=True)
                rows.append([name, n, r["ok"], r["invalid"], r["cut"], r["cut_kinds"], r["errors"],
                             fmt(r["wall"], 1), fmt(r["req_s"], 2), fmt(r["tok_req"], 1), fmt(r["tok_s"], 0),
                             fmt(r["p50"], 3), fmt(r["p99"], 3)])
                notes += [f"{name}, {n} clients: {e}" for e in r["examples"]]
                cuts += [f"{name}, {n} clients: {e}" for e in r["cut_examples"]]
            if args.stream:   # the same requests streamed: per-token latency, whatever the lengths
                for b, constrained in runs:
                    r = asyncio.run(run_level(ports[b], n, n_req, constrained, args.max_tokens,
                                              args.temperature, stream=True))
                    name = _label(b, constrained)
                    print(f"[{name}] clients={n} streamed: {r}", flush=True)
                    srows.append([name, n, r["ok"], r["invalid"], r["cut"], r["errors"], fmt(r["tok_req"], 1),
                                  fmt(r["ttft_p50"] * 1e3, 1), fmt(r["tpot_p50"] * 1e3, 2),
                                  fmt(r["tpot_p99"] * 1e3, 2), fmt(r["tok_s"], 0)])
                    notes += [f"{name}, {n} clients, streamed: {e}" for e in r["examples"]]
    finally:
        for p in procs.values():
            try:
                os.killpg(p.pid, 15)
            except ProcessLookupError:
                pass
    table = md_table(["backend", "clients", "ok", "invalid", "cut", "cut j/r/g", "errors", "wall s",
                      "req/s", "tok/req", "tok/s", "p50 lat s", "p99 lat s"], rows)
    start = ", ".join(f"{b} {s:.0f} s" for b, s in up.items())
    report = (f"{table}\n\nServers healthy after: {start}. Requests per level: "
              f"{args.requests or 'max(9, 3 x clients)'}, in turn json_schema / regex / grammar, "
              f"max_tokens {args.max_tokens}, temperature {args.temperature}.\n")
    if srows:
        report += ("\nStreamed (the same requests again, `stream=True`): time to the first token, and time "
                   "per output token after it (TPOT: the request's time after its first token over its "
                   "other tokens), per request; a like-for-like step cost whatever each backend's output "
                   "lengths.\n\n" + md_table(["backend", "clients", "ok", "invalid", "cut", "errors",
                                               "tok/req", "TTFT p50 ms", "TPOT p50 ms", "TPOT p99 ms",
                                               "tok/s"], srows) + "\n")
    if notes:
        report += "\nExamples of failures:\n" + "\n".join(f"- {x}" for x in notes) + "\n"
    if cuts:
        report += "\nThe first output cut by max_tokens, per kind:\n" + "\n".join(f"- {x}" for x in cuts) + "\n"
    print(report)
    if args.out:
        Path(args.out).write_text(report)
    return 0 if rows else 1


if __name__ == "__main__":
    sys.exit(main())
