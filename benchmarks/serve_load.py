"""Load benchmark of the HTTP server (``grammask serve``): N concurrent streaming clients on loopback.

For each level N (``--clients``, default 1,8,32) the script runs N clients (``openai.AsyncOpenAI``,
``stream=True`` with ``stream_options={"include_usage": True}``) against the server on 127.0.0.1.
Every client asks for JSON against its own schema (``--format json_schema``: N different schemas, so
the grammar cache sees N compiles, then hits), one request after the other (after a 503, it waits
for the ``Retry-After`` seconds), until the level's request
budget (``--requests``, default ``max(32, 4 * N)``) is used up or ``--duration`` seconds have passed;
requests still running ``--grace`` seconds after that are cancelled and counted as ``cut``. So every
level ends by itself, and so does the script.

Reported per level: completed requests, 503s (only expected when ``--max-queue`` is below
``N - max_concurrency``), errors (anything else, including an output that is not valid against its
schema: must be 0), lost requests (a stream that ended without a finish reason, or a request that
was never answered: must be 0), requests/s and aggregate completion tokens/s over the level's wall
time, p50/p99 end-to-end latency and time to first token (first content chunk), and the longest
queue seen (``/health`` polled every 50 ms: requests waiting for a server slot plus requests waiting
in the engine's admission queue, which also holds, for the rest of a step, the requests that
arrived during it: they join the batch between steps). Then the issue-12 ratios: 8 clients' aggregate tok/s over 1
client's (target >= 4x) and 8 clients' p50 latency over 1 client's (target <= 2x).

The server is started by the script in a subprocess (``python -m grammask.cli serve`` on a free
port of 127.0.0.1; ``--model scripted`` is the deterministic scripted backend, which answers with the
last line of the prompt, i.e. measures the server, engine and grammar overhead with no model), or is
given with ``--url`` (loopback addresses only).

    .venv/bin/python benchmarks/serve_load.py --model scripted --results benchmarks/RESULTS.md
    .venv/bin/python benchmarks/serve_load.py --model embedded --clients 1,8 --max-tokens 32
"""
from __future__ import annotations

import argparse
import asyncio
import ipaddress
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlparse

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (  # noqa: E402
    REPO_ROOT,
    command_line,
    fmt,
    machine_line,
    md_table,
    package_versions,
    percentile,
    update_results_section,
)

WORDS = ["Alice", "Bob", "Paris", "hello", "world", "yes", "no", "ok"]


# ---------------------------------------------------------------------------------------------- workload
def client_schema(i: int) -> dict:
    """Client ``i``'s schema: the same shape, different bounds (a different grammar per client)."""
    return {"type": "object",
            "properties": {"name": {"type": "string", "maxLength": 16 + i},
                           "age": {"type": "integer", "minimum": 0, "maximum": 100 + i},
                           "city": {"type": "string", "maxLength": 24 + i % 7}},
            "required": ["name", "age", "city"], "additionalProperties": False}


def request_kwargs(args, i: int, k: int) -> dict:
    """Request ``k`` of client ``i``."""
    schema = client_schema(i)
    if args.model == "scripted":
        # the scripted backend writes the prompt's last line: a valid answer, different per request
        answer = {"name": WORDS[(i + k) % len(WORDS)], "age": (i * 7 + k) % 100, "city": WORDS[(i * 3 + k) % 8]}
        prompt = json.dumps(answer) if args.format != "text" else " ".join(WORDS[(i + j + k) % 8] for j in range(12))
    else:
        prompt = (f"Invent a person number {i * 100 + k}: give name, age and city as a JSON object."
                  if args.format != "text" else f"Write a short story number {i * 100 + k} about a cat.")
    kw = dict(model="grammask", messages=[{"role": "user", "content": prompt}], max_tokens=args.max_tokens,
              temperature=0, stream=True, stream_options={"include_usage": True})
    if args.format == "json_schema":
        kw["response_format"] = {"type": "json_schema", "json_schema": {"name": f"client{i}", "schema": schema,
                                                                         "strict": True}}
    elif args.format == "json_object":
        kw["response_format"] = {"type": "json_object"}
    return kw, schema


# ---------------------------------------------------------------------------------------------- one level
async def run_level(args, url: str, n_clients: int) -> dict:
    import openai

    try:
        import jsonschema
    except ImportError:  # pragma: no cover - a test dependency
        jsonschema = None
    budget = args.requests if args.requests else max(32, 4 * n_clients)
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=args.duration + args.grace)
    st = {"issued": 0, "ok": 0, "rejected": 0, "errors": 0, "cut": 0, "lost": 0, "incomplete": 0, "tokens": 0,
          "inflight": 0, "max_queue": 0, "lat": [], "ttft": [], "samples": []}
    t0 = time.perf_counter()
    stop_issuing = t0 + args.duration

    async def poll_queue() -> None:
        """The longest queue seen: server slots' waiters plus the engine's admission queue."""
        try:  # the openai client's HTTP library
            import httpx2 as httpx
        except ImportError:
            import httpx

        async with httpx.AsyncClient(timeout=2) as hc:
            while True:
                try:
                    h = (await hc.get(url + "/health")).json()
                    q = int(h.get("waiting") or 0) + int((h.get("engine") or {}).get("waiting") or 0)
                    st["max_queue"] = max(st["max_queue"], q)
                except Exception:
                    pass
                await asyncio.sleep(0.05)

    async def one(i: int, k: int) -> None:
        st["inflight"] += 1
        try:
            await _one(i, k)
        finally:
            st["inflight"] -= 1

    async def _one(i: int, k: int) -> None:
        kw, schema = request_kwargs(args, i, k)
        t_start = time.perf_counter()
        t_first = None
        text, usage, finish = [], None, None
        try:
            stream = await client.chat.completions.create(**kw)
            async for ch in stream:
                if ch.usage is not None:
                    usage = ch.usage
                for c in ch.choices:
                    if c.delta.content:
                        if t_first is None:
                            t_first = time.perf_counter()
                        text.append(c.delta.content)
                    if c.finish_reason:
                        finish = c.finish_reason
        except openai.APIStatusError as e:
            if e.status_code == 503:  # deliberate: the queue is full; wait as told
                st["rejected"] += 1
                try:
                    wait = float(e.response.headers.get("retry-after", "1"))
                except ValueError:
                    wait = 1.0
                await asyncio.sleep(max(0.0, min(wait, stop_issuing - time.perf_counter())))
                return
            st["errors"] += 1
            st["samples"].append(f"HTTP {e.status_code}: {e.message}"[:200])
            return
        except Exception as e:
            st["errors"] += 1
            st["samples"].append(f"{type(e).__name__}: {e}"[:200])
            return
        t_end = time.perf_counter()
        out = "".join(text)
        if finish is None:  # the stream ended without a finish reason: an answer lost on the way
            st["lost"] += 1
            st["samples"].append(f"lost: the stream ended without a finish reason after {out[:60]!r}")
            return
        if finish == "length":
            st["incomplete"] += 1
        elif args.format != "text":
            try:
                obj = json.loads(out)
                if args.format == "json_schema" and jsonschema is not None:
                    jsonschema.validate(obj, schema)
            except Exception as e:
                st["errors"] += 1
                st["samples"].append(f"invalid output {out[:80]!r}: {type(e).__name__}"[:200])
                return
        st["ok"] += 1
        st["tokens"] += usage.completion_tokens if usage is not None else 0
        st["lat"].append(t_end - t_start)
        st["ttft"].append((t_first or t_end) - t_start)

    async def worker(i: int) -> None:
        k = 0
        while st["issued"] < budget and time.perf_counter() < stop_issuing:
            st["issued"] += 1
            await one(i, k)
            k += 1

    poller = asyncio.ensure_future(poll_queue())
    tasks = [asyncio.ensure_future(worker(i)) for i in range(n_clients)]
    done, pending = await asyncio.wait(tasks, timeout=args.duration + args.grace)
    st["cut"] = st["inflight"]  # still running at the level's time bound
    for t in pending:
        t.cancel()
    if pending:
        await asyncio.wait(pending, timeout=10)
    wall = time.perf_counter() - t0
    poller.cancel()
    # every issued request is accounted for, or it was lost
    st["lost"] += max(0, st["issued"] - st["ok"] - st["rejected"] - st["errors"] - st["cut"] - st["lost"])
    await client.close()
    lat, ttft = sorted(st["lat"]), sorted(st["ttft"])
    return {"clients": n_clients, "requests": st["ok"], "rejected": st["rejected"], "errors": st["errors"],
            "cut": st["cut"], "lost": st["lost"], "max_queue": st["max_queue"], "incomplete": st["incomplete"], "wall": wall, "rps": st["ok"] / wall,
            "tps": st["tokens"] / wall, "tokens": st["tokens"],
            "lat50": percentile(lat, 50), "lat99": percentile(lat, 99),
            "ttft50": percentile(ttft, 50), "ttft99": percentile(ttft, 99), "samples": st["samples"][:5],
            "lat": lat, "ttft": ttft}


def merge_rounds(runs: list[dict]) -> dict:
    """One level's rounds as one result: counts and walls added, latencies pooled."""
    if len(runs) == 1:
        return runs[0]
    out = {"clients": runs[0]["clients"]}
    for k in ("requests", "rejected", "errors", "cut", "lost", "incomplete", "wall", "tokens"):
        out[k] = sum(r[k] for r in runs)
    out["max_queue"] = max(r["max_queue"] for r in runs)
    out["lat"] = sorted(x for r in runs for x in r["lat"])
    out["ttft"] = sorted(x for r in runs for x in r["ttft"])
    out["rps"], out["tps"] = out["requests"] / out["wall"], out["tokens"] / out["wall"]
    out["lat50"], out["lat99"] = percentile(out["lat"], 50), percentile(out["lat"], 99)
    out["ttft50"], out["ttft99"] = percentile(out["ttft"], 50), percentile(out["ttft"], 99)
    out["samples"] = [x for r in runs for x in r["samples"]][:5]
    out["rounds"] = [(r["tps"], r["lat50"]) for r in runs]
    return out


# ---------------------------------------------------------------------------------------------- server
def is_loopback(url: str) -> bool:
    host = urlparse(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(args) -> tuple[subprocess.Popen, str]:
    port = free_port()
    model = {"embedded": None}.get(args.model, args.model)
    cmd = [sys.executable, "-m", "grammask.cli", "serve", "--host", "127.0.0.1", "--port", str(port),
           "--log-level", "warning", "--device", args.device]
    if model is not None:
        cmd += ["--model", model]
    if args.max_concurrency:
        cmd += ["--max-concurrency", str(args.max_concurrency)]
    if args.max_queue is not None:
        cmd += ["--max-queue", str(args.max_queue)]
    if args.torch_threads:
        cmd += ["--torch-threads", str(args.torch_threads)]
    if args.json_whitespace:
        cmd += ["--json-whitespace", args.json_whitespace]
    if args.backend != "transformers":
        cmd += ["--backend", args.backend]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    if args.max_batch:
        cmd += ["--max-batch", str(args.max_batch)]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT / "src"), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:  # the openai client's HTTP library
        import httpx2 as httpx
    except ImportError:
        import httpx

    deadline = time.monotonic() + args.startup_timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited ({proc.returncode}): {proc.stderr.read().decode()[-2000:]}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return proc, url
        except Exception:
            pass
        time.sleep(0.25)
    stop_server(proc)
    raise SystemExit(f"the server did not answer /health within {args.startup_timeout} s")


def stop_server(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


# ---------------------------------------------------------------------------------------------- results
INTRO = ("N concurrent streaming clients against `grammask serve` on 127.0.0.1 (see the docstring of "
         "`benchmarks/serve_load.py`). One subsection per model; a run replaces its own subsection.")


def write_subsection(path, title: str, label: str, body: str) -> None:
    """Replace (or add) ``### label`` inside the ``## title`` section, keeping the other subsections."""
    import re

    path = Path(path)
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    m = re.search(rf"^## {re.escape(title)}[ \t]*\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    subs: dict[str, str] = {}
    if m:
        for part in re.split(r"^### ", m.group(1), flags=re.M)[1:]:
            head, _, rest = part.partition("\n")
            subs[head.strip()] = rest.strip()
    subs[label] = body.strip()
    section = INTRO + "\n\n" + "\n\n".join(f"### {k}\n\n{v}" for k, v in subs.items())
    update_results_section(path, title, section)


# ---------------------------------------------------------------------------------------------- main
def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="scripted", help="scripted (default), embedded, or a model path")
    p.add_argument("--url", default=None, help="a running server (loopback only) instead of starting one")
    p.add_argument("--clients", default="1,8,32", help="comma-separated concurrency levels")
    p.add_argument("--requests", type=int, default=0, help="requests per level (default max(32, 4 * N))")
    p.add_argument("--duration", type=float, default=30.0, help="seconds per level before no new request starts")
    p.add_argument("--grace", type=float, default=30.0, help="then seconds before running requests are cut")
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--format", choices=["json_schema", "json_object", "text"], default="json_schema")
    p.add_argument("--max-concurrency", type=int, default=None, help="server slots (default: the server's, 32)")
    p.add_argument("--max-queue", type=int, default=None, help="server queue (default: the server's, 2 * slots)")
    p.add_argument("--device", default="auto")
    p.add_argument("--torch-threads", type=int, default=1, help="the server's torch threads (0: leave alone)")
    p.add_argument("--rounds", type=int, default=1, help="run the levels this many times in turn; figures pooled")
    p.add_argument("--backend", choices=["transformers", "llamacpp", "auto"], default="transformers",
                   help="the server's model runtime (llamacpp: GGUF on CPU, the 'llamacpp' extra)")
    p.add_argument("--threads", type=int, default=None, help="llama.cpp threads (llamacpp backend)")
    p.add_argument("--max-batch", type=int, default=None, help="the engine's sequences per step")
    p.add_argument("--json-whitespace", choices=["flexible", "compact"], default=None)
    p.add_argument("--startup-timeout", type=float, default=600.0)
    p.add_argument("--results", default=None, help="write the table into this Markdown file (## serve_load.py)")
    args = p.parse_args(argv)
    levels = [int(x) for x in args.clients.split(",") if x.strip()]
    if any(n < 1 or n > 256 for n in levels):
        raise SystemExit("--clients: levels between 1 and 256")

    proc = None
    if args.url:
        if not is_loopback(args.url):
            raise SystemExit("--url must be a loopback address (127.0.0.1, ::1, localhost)")
        url = args.url.rstrip("/")
        if url.endswith("/v1"):
            url = url[:-3]
    else:
        t = time.perf_counter()
        proc, url = start_server(args)
        print(f"server up at {url} in {time.perf_counter() - t:.1f} s", flush=True)
    rows, results = [], []
    by_level: dict[int, list[dict]] = {n: [] for n in levels}
    try:
        # rounds take the levels in turn (1, 8, 32, 1, 8, 32, ...): a drift in the machine's speed
        # (other jobs on a shared box) hits every level alike instead of one level's whole run
        for _round in range(max(1, args.rounds)):
            for n in levels:
                r = asyncio.run(run_level(args, url, n))
                by_level[n].append(r)
                print(f"  round {_round + 1}, N={n}: {r['tps']:.1f} tok/s, latency p50 {r['lat50']:.3f} s", flush=True)
        for n in levels:
            r = merge_rounds(by_level[n])
            results.append(r)
            print(f"N={n:3d}: {r['requests']} ok, {r['rejected']} 503, {r['errors']} errors, {r['cut']} cut, "
                  f"{r['lost']} lost, max queue {r['max_queue']}, "
                  f"{r['rps']:.2f} req/s, {r['tps']:.1f} tok/s, latency p50 {r['lat50']:.3f} s p99 {r['lat99']:.3f} s,"
                  f" TTFT p50 {r['ttft50']:.3f} s p99 {r['ttft99']:.3f} s", flush=True)
            for s in r["samples"]:
                print("   error:", s, flush=True)
            rows.append([n, r["requests"], r["rejected"], r["errors"], r["cut"], r["lost"], r["max_queue"],
                         r["incomplete"], fmt(r["wall"], 1),
                         fmt(r["rps"], 2), fmt(r["tps"], 1), fmt(r["lat50"], 3), fmt(r["lat99"], 3),
                         fmt(r["ttft50"], 3), fmt(r["ttft99"], 3)])
    finally:
        if proc is not None:
            stop_server(proc)
    table = md_table(["clients", "ok", "503", "errors", "cut", "lost", "max queue", "length", "wall s", "req/s",
                      "tok/s", "p50 lat s", "p99 lat s", "p50 TTFT s", "p99 TTFT s"], rows)
    print(table)
    ratios = scaling_line(results)
    if ratios:
        print(ratios)
    if args.results:
        model = {"scripted": "scripted backend (no model: server + engine + grammar overhead)",
                 "embedded": "embedded SmolLM2-135M-Instruct"}.get(args.model, args.model)
        if args.model != "scripted":
            model += f", backend {args.backend}" + (f" ({args.threads} threads)" if args.threads else "")
            model += f", torch threads {args.torch_threads}" if args.backend != "llamacpp" else ""
        body = "\n".join([
            f"Command: `{command_line()}`", "",
            f"Machine: {machine_line()}.  ",
            f"Packages: {package_versions(['grammask', 'uvicorn', 'starlette', 'openai', 'torch'])}.  ",
            f"Server: {'given URL' if args.url else 'grammask serve (subprocess) on 127.0.0.1'}, model: {model}, "
            f"device {args.device}, max_concurrency {args.max_concurrency or 'default (32)'}, "
            f"max_queue {args.max_queue if args.max_queue is not None else 'default (2 x slots)'}.  ",
            f"Workload: {args.format}, one schema per client, streaming with usage, temperature 0, max_tokens "
            f"{args.max_tokens}; per level at most {args.requests or 'max(32, 4N)'} requests and {args.duration:g} s "
            f"(+{args.grace:g} s grace)" + (f"; {args.rounds} rounds taking the levels in turn, pooled" if args.rounds > 1
                                            else "") + ".", "",
            table, "",
            *([ratios, ""] if ratios else []),
            "ok: completed (JSON valid against the client's schema); 503: refused by the full queue; errors: "
            "anything else (must be 0); cut: still running at the level's time bound; lost: never answered or a "
            "stream without a finish reason (must be 0); max queue: the most requests seen waiting (server slots "
            "+ engine admission queue, /health every 50 ms); length: stopped by "
            "max_tokens (counted in ok). tok/s: completion tokens of the ok requests over the wall time. TTFT: "
            "first content chunk.",
        ])
        label = "scripted backend" if args.model == "scripted" else f"model {args.model}, {args.backend}"
        write_subsection(args.results, "serve_load.py", label, body)
        print(f"wrote ## serve_load.py / ### {label} to {args.results}")
    return 1 if any(r["errors"] or r["lost"] for r in results) else 0


def scaling_line(results: list[dict]) -> str | None:
    """Issue 12's targets: 8 clients' aggregate tok/s >= 4x one client's, their p50 latency <= 2x."""
    by = {r["clients"]: r for r in results}
    one, eight = by.get(1), by.get(8)
    if not one or not eight or not one["tps"] or not one["lat50"]:
        return None
    tps, lat = eight["tps"] / one["tps"], eight["lat50"] / one["lat50"]
    line = (f"8 clients vs 1: aggregate tok/s {tps:.2f}x (target >= 4x: {'met' if tps >= 4 else 'NOT met'}), "
            f"p50 latency {lat:.2f}x (target <= 2x: {'met' if lat <= 2 else 'NOT met'}).")
    if "rounds" in one and "rounds" in eight:
        per = ", ".join(f"{e[0] / o[0]:.2f}x / {e[1] / o[1]:.2f}x" for o, e in zip(one["rounds"], eight["rounds"]))
        line += f" Per round (tok/s / latency): {per}."
    return line


if __name__ == "__main__":
    sys.exit(main())
