"""End-to-end decoding benchmark on the embedded model (issue 4).

One engine (``AsyncEngine``, the embedded SmolLM2-135M-Instruct on CPU/CUDA), the same extraction
prompts for every mode, in the same run:

``text``           unconstrained, ``ignore_eos`` so every request decodes ``--max-tokens`` tokens
``json_object``    any JSON object (builtin grammar), fast-forward off
``schema``         ``json_schema`` (strict) with the prompt's schema, fast-forward off
``schema+ff``      the same with fast-forward on (forced tokens fed in one forward, counted as
                   completion tokens)
``schema+ff/cmp``  the same on a second engine over the same loaded model with
                   ``json_whitespace="compact"`` (no optional whitespace: keys and punctuation are
                   forced); shows how much of fast-forward's gain the whitespace policy decides

Per mode: completion tokens, decode tokens/s as the engine reports it (``usage.extra``: completion
tokens after the first one / time from the first sampled token to the end, forced tokens included),
the ratio to ``text`` (per repeat, over the same prompts), the share of forced tokens, and the
decode step taken apart from the engine's trace (``AsyncEngine(trace=True)``): model forward, mask
filling (which runs at the same time as the forward, in another thread), the part of the mask that
ends after the forward ("exposed"), sampling (mask application, ``accept_token``, fast-forward) and
the rest (event-loop and thread hand-offs). Every ``json_schema`` output is validated with
``jsonschema``; a ``json_object`` output must parse as an object.

Warm-up: one short unconstrained request, then a *cold pass* over the constrained modes (every
grammar compiled for the first time: its ``grammar_init_s`` and first-pass mask times are reported
separately); the timed repeats follow (greedy decoding, so they retrace the cold pass's grammar
states and the lazily grown lexer is warm). Modes take turns per prompt, in an order rotated per
prompt and repeat, so drifting load from other processes hits all modes alike.

Threads: ``torch.set_num_threads(--threads)`` (default 1: on an oversubscribed 2-core box one
thread was measured faster than two) for the main measurement; afterwards one reference pass over
``--ref-prompts`` prompts runs with PyTorch's default thread count.

llama.cpp: when ``llama_cpp`` (llama-cpp-python) is importable, the same prompt tokens run on the
same GGUF file, unconstrained (end-of-text banned) and with ``LlamaGrammar.from_json_schema``;
then grammask's engine on the llama.cpp backend (``LlamaCppBackend``, same GGUF, same thread count)
runs ``text``, ``schema`` and ``schema+ff`` on the same prompts, in the same table; otherwise that
part is skipped (and says so). It is never installed by this script (``make setup-llamacpp`` does).
``--backend llamacpp`` runs the main measurement itself on the llama.cpp backend.

    .venv/bin/python benchmarks/e2e.py [--prompts N] [--max-tokens N] [--repeat N] [--threads N]
        [--ref-prompts N] [--device cpu] [--backend transformers|llamacpp] [--no-llama-cpp]
        [--no-llama-cpp-backend] [--out FILE] [--results benchmarks/RESULTS.md]

Prints a Markdown report; ``--results`` replaces the ``## e2e.py`` section of a results file
(``## e2e.py --backend llamacpp`` for a main measurement on llama.cpp).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (command_line, fmt, machine_line, md_table, package_versions,  # noqa: E402
                    update_results_section)

# ---------------------------------------------------------------------------------------------- workload
PROMPTS: list[dict] = [
    {
        "name": "person",
        "text": ("Hi, I'm Maria Lopez, a 34 year old software engineer living in Madrid. "
                 "I love hiking and chess."),
        "task": "Extract the person's name, age and city as JSON.",
        "schema": {
            "type": "object",
            "properties": {
                "name": {"type": "string", "maxLength": 30},
                "age": {"type": "integer", "minimum": 0, "maximum": 120},
                "city": {"type": "string", "maxLength": 20},
            },
            "required": ["name", "age", "city"], "additionalProperties": False,
        },
    },
    {
        "name": "order",
        "text": "Please send me 3 boxes of green tea at 4.50 each. They are still in stock, right?",
        "task": "Extract the order (product, quantity, unit price, in stock) as JSON.",
        "schema": {
            "type": "object",
            "properties": {
                "product": {"type": "string", "maxLength": 24},
                "quantity": {"type": "integer", "minimum": 1, "maximum": 100},
                "unit_price": {"type": "number", "minimum": 0},
                "in_stock": {"type": "boolean"},
            },
            "required": ["product", "quantity", "unit_price", "in_stock"], "additionalProperties": False,
        },
    },
    {
        "name": "review",
        "text": "The hotel room was spotless and the staff were lovely, but breakfast was cold. Four stars.",
        "task": "Classify the review's sentiment and rating as JSON.",
        "schema": {
            "type": "object",
            "properties": {
                "sentiment": {"enum": ["positive", "negative", "mixed", "neutral"]},
                "rating": {"type": "integer", "minimum": 1, "maximum": 5},
                "topic": {"enum": ["hotel", "restaurant", "product", "service"]},
            },
            "required": ["sentiment", "rating", "topic"], "additionalProperties": False,
        },
    },
    {
        "name": "city",
        "text": "Lyon is a French city of about 520000 people on the Rhone and Saone rivers.",
        "task": "Extract the city, its country and population as JSON.",
        "schema": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 20},
                "country": {"type": "string", "maxLength": 20},
                "population": {"type": "integer", "minimum": 0},
            },
            "required": ["city", "country", "population"], "additionalProperties": False,
        },
    },
    {
        "name": "meeting",
        "text": "Team sync on 2024-03-18 with Ana and Bob about the budget.",
        "task": "Extract the meeting (date, people, subject) as JSON.",
        "schema": {
            "type": "object",
            "properties": {
                "date": {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"},
                "people": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3},
                "subject": {"type": "string", "maxLength": 20},
            },
            "required": ["date", "people", "subject"], "additionalProperties": False,
        },
    },
]

MODES = ("text", "json_object", "schema", "schema+ff", "schema+ff/cmp")
CONSTRAINED = MODES[1:]
WARMUP_MESSAGES = [{"role": "user", "content": "Say hello."}]


def messages_of(p: dict) -> list[dict]:
    return [{"role": "system", "content": p["task"] + " Reply with JSON only."},
            {"role": "user", "content": p["text"]}]


def request_kwargs(mode: str, p: dict, max_tokens: int) -> dict:
    kw: dict = {"messages": messages_of(p), "max_tokens": max_tokens, "temperature": 0}
    if mode == "text":
        kw.update(ignore_eos=True, fast_forward=False)
    elif mode == "json_object":
        kw.update(response_format={"type": "json_object"}, fast_forward=False)
    else:
        kw.update(response_format={"type": "json_schema",
                                   "json_schema": {"name": p["name"], "schema": p["schema"], "strict": True}},
                  fast_forward=mode != "schema")
    return kw


# ---------------------------------------------------------------------------------------------- one request
@dataclass
class Run:
    mode: str
    prompt: str
    repeat: int  # -1: cold pass, -2: reference pass (default threads)
    completion: int
    forced: int
    finish: str
    decode_tokens: int
    decode_s: float
    engine_tps: float
    grammar_init_s: float
    cache_hit: bool
    ok: bool | None  # output validates (None: not checked)
    note: str
    content: str
    # decode steps from the trace
    steps: int = 0
    fwd_tokens: int = 0
    fwd: list[float] = field(default_factory=list)
    fwd_n: list[int] = field(default_factory=list)  # tokens per decode forward
    mask: list[float] = field(default_factory=list)
    exposed: list[float] = field(default_factory=list)
    sample: list[float] = field(default_factory=list)
    step_wall: list[float] = field(default_factory=list)  # forward/mask start -> sample end, plus the gap before it


def parse_steps(trace: list[dict], run: Run) -> None:
    """Group the trace into steps (forward and/or mask, then sample) and keep the decode steps
    (those whose forward is not a prefill)."""
    steps: list[dict] = []
    cur: dict = {}
    for ev in trace:
        k = ev["kind"]
        if k in ("forward", "mask"):
            cur[k] = ev
        elif k == "sample":
            cur["sample"] = ev
            steps.append(cur)
            cur = {}
    if cur:
        steps.append(cur)
    prev_end = None
    for s in steps:
        f, m, sm = s.get("forward"), s.get("mask"), s.get("sample")
        start = min(e["start"] for e in (f, m, sm) if e is not None)
        end = max(e["end"] for e in (f, m, sm) if e is not None)
        decode = f is not None and not f.get("prefill_ids")
        if decode:
            run.steps += 1
            run.fwd_tokens += int(f.get("n_tokens", 1))
            run.fwd.append(f["end"] - f["start"])
            run.fwd_n.append(int(f.get("n_tokens", 1)))
            if m is not None:
                run.mask.append(m["end"] - m["start"])
                run.exposed.append(max(0.0, m["end"] - f["end"]))
            if sm is not None:
                run.sample.append(sm["end"] - sm["start"])
            run.step_wall.append(end - start + (start - prev_end if prev_end is not None else 0.0))
        prev_end = end


def check_output(mode: str, p: dict, content: str, finish: str) -> tuple[bool | None, str]:
    if mode == "text":
        return None, ""
    import jsonschema

    if finish != "stop":
        return False, f"cut at max_tokens ({finish})"
    try:
        obj = json.loads(content)
    except ValueError as e:
        return False, f"not JSON: {e}"
    if mode == "json_object":
        return isinstance(obj, dict), "" if isinstance(obj, dict) else "not an object"
    try:
        jsonschema.validate(obj, p["schema"])
    except jsonschema.ValidationError as e:
        return False, f"invalid: {e.message}"
    return True, ""


async def run_one(engines: dict, mode: str, p: dict, max_tokens: int, repeat: int) -> Run:
    engine = engines["compact"] if mode == "schema+ff/cmp" else engines["flexible"]
    engine.trace.clear()
    r = await engine.chat.completions.create(**request_kwargs(mode, p, max_tokens))
    trace = list(engine.trace)
    x = r.usage.extra
    ch = r.choices[0]
    content = ch.message.content or ""
    ok, note = check_output(mode, p, content, ch.finish_reason)
    dec_tokens = max(0, r.usage.completion_tokens - 1)
    dec_s = x.time_per_output_token_s * dec_tokens
    run = Run(mode, p["name"], repeat, r.usage.completion_tokens, x.forced_tokens, ch.finish_reason,
              dec_tokens, dec_s, x.decode_tokens_per_s, x.grammar_init_s, x.grammar_cache_hit, ok, note, content)
    parse_steps(trace, run)
    return run


# ---------------------------------------------------------------------------------------------- aggregation
def pooled_rate(runs: list[Run]) -> float:
    t = sum(r.decode_s for r in runs)
    return sum(r.decode_tokens for r in runs) / t if t > 0 else math.nan


def _mean(v) -> float:
    v = list(v)
    return sum(v) / len(v) if v else math.nan


def _med(v) -> float:
    v = list(v)
    return statistics.median(v) if v else math.nan


def forward_cost(backend, prefix: list[int], ns=(1, 2, 3, 4, 6, 8), rounds: int = 5, calls: int = 3) -> dict:
    """``backend.forward`` seconds by tokens per call on one sequence after ``prefix`` (the sizes take
    turns, ``rounds`` × ``calls`` each): ``{n: (min, median)}``."""
    seq = backend.new_sequence()
    try:
        backend.forward([seq], [list(prefix)])
        backend.forward([seq], [[prefix[-1]]])  # warm-up
        times: dict[int, list[float]] = {n: [] for n in ns}
        for k in range(rounds):
            for n in (ns if k % 2 == 0 else tuple(reversed(ns))):
                for _ in range(calls):
                    toks = [prefix[(j * 7) % len(prefix)] for j in range(n)]
                    t = time.perf_counter()
                    backend.forward([seq], [toks])
                    times[n].append(time.perf_counter() - t)
    finally:
        backend.release(seq)
    return {n: (min(v), statistics.median(v)) for n, v in times.items()}


def cost_factor(cost: dict, n: int) -> float:
    """A forward of ``n`` tokens relative to one of 1 token (medians; linear between measured sizes)."""
    if not cost:
        return float(n)
    ns = sorted(cost)
    med = {k: cost[k][1] / cost[1][1] for k in ns}
    if n in med:
        return med[n]
    if n > ns[-1]:
        return med[ns[-1]] * n / ns[-1]
    lo = max(k for k in ns if k < n)
    hi = min(k for k in ns if k > n)
    return med[lo] + (med[hi] - med[lo]) * (n - lo) / (hi - lo)


def mode_stats(runs: list[Run], repeats: list[int], cost: dict) -> dict:
    """Per-mode figures over the timed repeats."""
    by_rep = {(m, k): [r for r in runs if r.mode == m and r.repeat == k] for m in MODES for k in repeats}
    rates = {m: [pooled_rate(by_rep[(m, k)]) for k in repeats] for m in MODES}
    figs: dict = {}
    for m in MODES:
        rs = [r for r in runs if r.mode == m and r.repeat in repeats]
        if not rs:
            continue
        fwd = [x for r in rs for x in r.fwd]
        fwd_n = [x for r in rs for x in r.fwd_n]
        fwd1 = [t for r in rs for t, n in zip(r.fwd, r.fwd_n) if n == 1]
        fwdk = [t for r in rs for t, n in zip(r.fwd, r.fwd_n) if n > 1]
        mask = [x for r in rs for x in r.mask]
        exposed = [x for r in rs for x in r.exposed]
        sample = [x for r in rs for x in r.sample]
        wall = [x for r in rs for x in r.step_wall]
        steps = sum(r.steps for r in rs)
        n_tok = sum(r.completion for r in rs)
        checked = [r for r in rs if r.ok is not None]
        cut = [r for r in checked if r.finish != "stop"]
        fin = [r for r in checked if r.finish == "stop"]
        step_ms = _mean(wall) * 1e3
        fwd_ms = _mean(fwd) * 1e3
        sample_ms = _mean(sample) * 1e3
        exposed_ms = _mean(exposed) * 1e3 if exposed else 0.0
        figs[m] = {
            "rates": rates[m], "rate_med": _med(rates[m]),
            "ratios": [rates[m][i] / rates["text"][i] for i in range(len(repeats))],
            "requests": len(rs), "completion": n_tok, "forced": sum(r.forced for r in rs),
            "forced_share": sum(r.forced for r in rs) / n_tok if n_tok else 0.0,
            "steps": steps, "tok_per_step": sum(r.decode_tokens for r in rs) / steps if steps else math.nan,
            "step_ms": step_ms, "fwd_ms": fwd_ms, "fwd1_ms": _mean(fwd1) * 1e3 if fwd1 else math.nan,
            "fwdk_ms": _mean(fwdk) * 1e3 if fwdk else math.nan, "fwdk_tokens": _mean(n for n in fwd_n if n > 1),
            "n_fwdk": len(fwdk), "fwd_factor": _mean(cost_factor(cost, n) for n in fwd_n),
            "mask": mask, "mask_mean_ms": _mean(mask) * 1e3, "exposed_ms": exposed_ms,
            "exposed_max_ms": max(exposed) * 1e3 if exposed else 0.0, "sample_ms": sample_ms,
            "nonfwd_ms": step_ms - fwd_ms, "other_ms": step_ms - fwd_ms - exposed_ms - sample_ms,
            "valid": f"{sum(1 for r in fin if r.ok)}/{len(fin)}" + (f" (+{len(cut)} cut)" if cut else "")
            if checked else "–",
            "invalid": [r for r in fin if not r.ok],
        }
    t = figs.get("text")
    for m, f in figs.items():
        f["ratio_med"] = _med(f["ratios"])
        if t:
            # forward held at text's 1-token forward (scaled by the measured cost of multi-token calls):
            # what the mode's own non-forward time and tokens per step give without the load noise
            base = t["fwd_ms"] + t["nonfwd_ms"]
            est_step = t["fwd_ms"] * f["fwd_factor"] + f["nonfwd_ms"]
            f["ratio_est"] = f["tok_per_step"] * base / est_step
    return figs


# ---------------------------------------------------------------------------------------------- llama.cpp
def llama_cpp_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("llama_cpp") is not None


#: grammask's modes run on the llama.cpp backend beside llama.cpp's own rates
LLAMACPP_MODES = ("text", "schema", "schema+ff")


async def run_llama_cpp(prompt_tokens: dict[str, list[int]], prompts: list[dict], max_tokens: int, threads: int,
                        repeats: int, with_grammask: bool = True) -> tuple[list[list], str, dict]:
    """Decode tokens/s of llama.cpp on the same GGUF: unconstrained (end-of-text banned) and with
    its own JSON-schema grammar, the rate being (streamed tokens - 1) / (last token - first token);
    with ``with_grammask``, grammask's engine on :class:`~grammask.adapters.llamacpp_backend.LlamaCppBackend`
    (same file, same threads) in :data:`LLAMACPP_MODES` (rate: ``usage.extra.decode_tokens_per_s``),
    taking turns with llama.cpp's own runs per prompt (order rotated per prompt and repeat) so load
    noise hits both alike. Pass 0 is a warm-up (grammar compiles), not counted; medians over the rest."""
    from llama_cpp import Llama, LlamaGrammar

    from grammask.adapters.models import embedded_model_path

    gguf = embedded_model_path()
    llm = Llama(model_path=gguf, n_ctx=1024, n_threads=threads, n_threads_batch=threads, verbose=False)
    eos = [int(llm.token_eos())]

    def one(tokens, grammar):
        t_first = t_last = None
        n = 0
        text = []
        kw = {"grammar": grammar} if grammar is not None else {"logit_bias": {t: -1e30 for t in eos}}
        llm.reset()
        for chunk in llm.create_completion(prompt=tokens, max_tokens=max_tokens, temperature=0.0, top_k=1,
                                           repeat_penalty=1.0, stream=True, **kw):
            now = time.perf_counter()
            n += 1
            t_first = now if t_first is None else t_first
            t_last = now
            text.append(chunk["choices"][0].get("text") or "")
        rate = (n - 1) / (t_last - t_first) if n > 1 and t_last > t_first else math.nan
        return n, rate, "".join(text)

    engine = backend = None
    modes = ["llama.cpp text", "llama.cpp json_schema"]
    if with_grammask:
        from grammask.adapters.llamacpp_backend import LlamaCppBackend
        from grammask.pipeline import AsyncEngine

        backend = LlamaCppBackend(gguf, n_ctx=1024, n_seq_max=2, n_threads=threads)
        engine = await AsyncEngine.create(backend, fast_forward=True)
        modes += [f"grammask on llama.cpp {m}" for m in LLAMACPP_MODES]
    res: dict[str, list[tuple[int, float, bool | None]]] = {m: [] for m in modes}
    try:
        for k in range(repeats + 1):  # pass 0: warm-up, not counted
            for i, p in enumerate(prompts):
                rot = (k + i) % len(modes)
                for m in modes[rot:] + modes[:rot]:
                    if m.startswith("llama.cpp"):
                        g = (None if m.endswith("text") else
                             LlamaGrammar.from_json_schema(json.dumps(p["schema"]), verbose=False))
                        n, rate, out = one(prompt_tokens[p["name"]], g)
                        ok = None if g is None else check_output("schema", p, out, "stop")[0]
                    else:
                        gm = m.rsplit(" ", 1)[1]
                        r = await engine.chat.completions.create(**request_kwargs(gm, p, max_tokens))
                        ch = r.choices[0]
                        n, rate = r.usage.completion_tokens, r.usage.extra.decode_tokens_per_s
                        ok = check_output(gm, p, ch.message.content or "", ch.finish_reason)[0]
                    print(f"{m:34s} pass {k} {p['name']:8s} {n:3d} tok {rate:6.2f} tok/s", file=sys.stderr)
                    if k > 0:
                        res[m].append((n, rate, ok))
    finally:
        llm.close()
        if engine is not None:
            await engine.aclose()  # closes its backend too
    rows = []
    meds = {m: _med([r for _, r, _ in v]) for m, v in res.items()}
    for m, v in res.items():
        base = meds["grammask on llama.cpp text" if m.startswith("grammask") else "llama.cpp text"]
        checked = [ok for _, _, ok in v if ok is not None]
        rows.append([m, len(v), sum(n for n, _, _ in v), fmt(meds[m], 2),
                     "1" if m.endswith("text") else f"{meds[m] / base:.3f}",
                     f"{sum(checked)}/{len(checked)}" if checked else "–"])
    return rows, gguf, meds


# ---------------------------------------------------------------------------------------------- main
async def amain(args) -> str:
    import anyio
    import torch

    default_threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    from grammask.adapters.models import create_engine
    from grammask.pipeline import AsyncEngine

    prompts = PROMPTS[: args.prompts]
    t0 = time.perf_counter()
    engine = await create_engine(model=None, device=args.device, fast_forward=True, trace=True,
                                 backend=args.backend,
                                 backend_options={} if args.backend == "transformers" else {"n_threads": args.threads})
    load_s = time.perf_counter() - t0
    compact = await AsyncEngine.create(engine.backend, fast_forward=True, trace=True, json_whitespace="compact")
    engines = {"flexible": engine, "compact": compact}
    backend = engine.backend
    prompt_tokens = {p["name"]: list(backend.apply_chat_template(messages_of(p), add_generation_prompt=True))
                     for p in prompts}
    runs: list[Run] = []
    t_start = time.perf_counter()
    try:
        await engine.chat.completions.create(messages=WARMUP_MESSAGES, max_tokens=4, temperature=0)
        # cold pass: first compile of every grammar, lexer growth
        for p in prompts:
            for m in CONSTRAINED:
                runs.append(await run_one(engines, m, p, args.max_tokens, -1))
                print(f"cold {p['name']:8s} {m:14s} {runs[-1].completion:3d} tok "
                      f"{runs[-1].engine_tps:6.2f} tok/s", file=sys.stderr)
        for k in range(args.repeat):
            for i, p in enumerate(prompts):
                rot = (k + i) % len(MODES)
                for m in MODES[rot:] + MODES[:rot]:
                    runs.append(await run_one(engines, m, p, args.max_tokens, k))
                    rr = runs[-1]
                    print(f"rep {k} {p['name']:8s} {m:14s} {rr.completion:3d} tok {rr.engine_tps:6.2f} tok/s "
                          f"fwd {_mean(rr.fwd) * 1e3:6.1f} ms", file=sys.stderr)
        main_s = time.perf_counter() - t_start
        # cost of a forward by tokens per call (what fast-forward's multi-token forwards cost)
        t1 = time.perf_counter()
        cost = await anyio.to_thread.run_sync(forward_cost, backend, prompt_tokens[prompts[0]["name"]])
        cost_s = time.perf_counter() - t1
        print("forward cost: " + ", ".join(f"{n}: {v[1] * 1e3:.1f} ms" for n, v in cost.items()), file=sys.stderr)
        # reference: PyTorch's default thread count
        ref_runs: list[Run] = []
        if args.ref_prompts > 0:
            torch.set_num_threads(default_threads)
            try:
                for p in prompts[: args.ref_prompts]:
                    for m in MODES:
                        ref_runs.append(await run_one(engines, m, p, args.max_tokens, -2))
                        print(f"ref {p['name']:8s} {m:14s} {ref_runs[-1].engine_tps:6.2f} tok/s", file=sys.stderr)
            finally:
                torch.set_num_threads(args.threads)
    finally:
        await compact.aclose()
        await engine.aclose()
    total_s = time.perf_counter() - t_start

    # ------------------------------------------------------------------ llama.cpp
    llama_rows, llama_note, llama_verdict = None, "", ""
    if args.no_llama_cpp:
        llama_note = "llama.cpp: skipped (--no-llama-cpp)."
    elif not llama_cpp_available():
        llama_note = ("llama.cpp: skipped — `llama_cpp` (llama-cpp-python) is not importable here "
                      "(it is optional and builds from source; this script never installs it).")
    else:
        try:
            llama_rows, gguf, meds = await run_llama_cpp(prompt_tokens, prompts, args.max_tokens, args.threads,
                                                         args.repeat, with_grammask=not args.no_llama_cpp_backend)
            llama_note = (f"llama.cpp on `{Path(gguf).name}`, {args.threads} thread(s), same prompt tokens, "
                          f"temperature 0, runs taking turns per prompt: llama.cpp's own rates "
                          f"(`Llama.create_completion`, unconstrained with end-of-text banned / "
                          f"`LlamaGrammar.from_json_schema`) and grammask's engine on the llama.cpp backend "
                          f"(`LlamaCppBackend`, same threads; `text` ignores EOS, `schema` fast-forward off, "
                          f"`schema+ff` on):")
            if not args.no_llama_cpp_backend:
                gbnf, gt = meds["llama.cpp json_schema"], meds["grammask on llama.cpp text"]
                gs, gf = meds["grammask on llama.cpp schema"], meds["grammask on llama.cpp schema+ff"]
                llama_verdict = (
                    f"Targets (issue 12), single stream: grammask constrained on the llama.cpp backend "
                    f"(`schema`, fast-forward off) {gs:.2f} tok/s = {gs / gbnf:.3f}× llama.cpp's GBNF rate "
                    f"({gbnf:.2f}) and {gs / gt:.3f}× our unconstrained rate ({gt:.2f}); with fast-forward "
                    f"{gf:.2f} tok/s = {gf / gbnf:.3f}× GBNF, {gf / gt:.3f}× unconstrained. llama.cpp's own "
                    f"unconstrained rate: {meds['llama.cpp text']:.2f} tok/s.")
        except Exception as e:  # an optional comparison must not sink the report
            llama_note = f"llama.cpp: failed — {type(e).__name__}: {e}"
    print(llama_note, file=sys.stderr)

    # ------------------------------------------------------------------ report
    repeats = list(range(args.repeat))
    figs = mode_stats(runs, repeats, cost)
    out: list[str] = []
    out.append(f"Command: `{command_line()}`\n")
    out.append(f"Machine: {machine_line()}.  ")
    out.append(f"Packages: {package_versions(['grammask', 'torch', 'transformers', 'numba', 'numpy', 'anyio'])}.  ")
    out.append(f"Model: {backend.name} ({getattr(backend, 'source', '?')}, weights {backend.dtype}, device "
               f"{backend.device}), loaded in {load_s:.1f} s. torch threads: **{args.threads}** "
               f"(`torch.set_num_threads`) for everything but the reference pass (PyTorch's default here: "
               f"{default_threads}). {len(prompts)} prompts ({', '.join(p['name'] for p in prompts)}) × "
               f"{len(MODES)} modes × {args.repeat} timed repeat(s) after a cold pass, max_tokens "
               f"{args.max_tokens}, greedy. Cold pass + repeats {main_s:.0f} s, forward-cost probe "
               f"{cost_s:.0f} s, whole run {total_s:.0f} s.\n")
    per_req = sorted(_mean(t for t, n in zip(r.fwd, r.fwd_n) if n == 1) for r in runs
                     if r.repeat >= 0 and any(n == 1 for n in r.fwd_n))
    out.append(f"**Timings are noisy** ({os.cpu_count()} CPU cores, load average "
               f"{', '.join(f'{x:.2f}' for x in os.getloadavg())} at the end): the mean 1-token forward of "
               f"a request ranged {per_req[0] * 1e3:.0f}–{per_req[-1] * 1e3:.0f} ms over the timed requests "
               f"(same model, same settings). Modes take turns per prompt (order rotated per "
               "prompt and repeat); rates are pooled over the prompts per repeat (Σ decode tokens / Σ decode "
               "time) and given as median [min–max] over the repeats; *÷ text* is a mode's pooled rate over "
               "`text`'s in the same repeat. *÷ text (est.)* takes the load noise out: the forward time held at "
               "`text`'s mean 1-token forward (times the measured cost of the mode's multi-token forwards, "
               "table below), plus the mode's own measured non-forward time per step, times its tokens per "
               "step.\n")
    trows = []
    for m in MODES:
        f = figs.get(m)
        if not f:
            continue
        trows.append([m, f["requests"], f["completion"], f"{100 * f['forced_share']:.1f}",
                      fmt(f["tok_per_step"], 2),
                      f"{fmt(f['rate_med'], 2)} [{fmt(min(f['rates']), 2)}–{fmt(max(f['rates']), 2)}]",
                      "1" if m == "text" else f"{f['ratio_med']:.3f} [{min(f['ratios']):.3f}–{max(f['ratios']):.3f}]",
                      "1" if m == "text" else f"{f['ratio_est']:.3f}", f["valid"]])
    out.append(md_table(["mode", "requests", "completion tok", "forced %", "tok/step", "decode tok/s",
                         "÷ text", "÷ text (est.)", "valid"], trows))
    out.append("")
    srows = []
    for m in MODES:
        f = figs.get(m)
        if not f:
            continue
        mk = f["mask"]
        srows.append([m, f["steps"], fmt(f["step_ms"], 1), fmt(f["fwd1_ms"], 1),
                      f"{fmt(f['fwdk_ms'], 1)} ({fmt(f['fwdk_tokens'], 1)} tok × {f['n_fwdk']})" if f["n_fwdk"] else "–",
                      fmt(f["mask_mean_ms"], 3) if mk else "–", fmt(_med(mk) * 1e3, 3) if mk else "–",
                      fmt(max(mk) * 1e3, 2) if mk else "–",
                      f"{100 * f['mask_mean_ms'] / f['fwd_ms']:.2f}" if mk else "–",
                      fmt(f["exposed_ms"], 4) if mk else "–", fmt(f["exposed_max_ms"], 3) if mk else "–",
                      fmt(f["sample_ms"], 2), fmt(f["other_ms"], 2), fmt(f["nonfwd_ms"], 2)])
    out.append("Decode step taken apart (engine trace, means over the decode steps of the timed repeats, ms):\n")
    out.append(md_table(["mode", "steps", "ms/step", "forward (1 tok)", "forward (multi-token)", "mask mean",
                         "mask p50", "mask max", "mask % of fwd", "exposed mask", "exposed max", "sample",
                         "other", "non-forward"], srows))
    out.append("")
    out.append("*ms/step*: wall time of a decode step, hand-off to the next included; *forward*: "
               "`backend.forward` (forced tokens go into the next step's call); *mask*: the mask-filling "
               "span per step (`fill_next_token_bitmask`), run in a worker thread while the forward runs; "
               "*exposed mask*: the part of it that ends after the forward (what the step waits for); "
               "*sample*: mask application to the logits, sampling, `accept_token` and fast-forward (serial, "
               "after both); *other*: the rest (event loop, thread hand-offs); *non-forward* = ms/step − "
               "forward. *decode tok/s* = `usage.extra.decode_tokens_per_s` (completion tokens after the first "
               "/ time from the first sampled token to the end; forced tokens count). *valid*: `json_schema` "
               "outputs that validate with `jsonschema` / finished ones; `json_object`: parses as an object; "
               "*cut*: stopped by max_tokens (not checked).\n")
    crow = [[n, fmt(v[0] * 1e3, 1), fmt(v[1] * 1e3, 1), f"{v[1] / cost[1][1]:.2f}"] for n, v in cost.items()]
    out.append(f"`backend.forward` by tokens per call ({args.threads} thread(s), one sequence after the "
               f"{len(prompt_tokens[prompts[0]['name']])}-token prompt of `{prompts[0]['name']}`, sizes taking turns):\n")
    out.append(md_table(["tokens per call", "min ms", "median ms", "÷ 1 token (median)"], crow))
    out.append("")

    # verdict
    t = figs.get("text")
    lines = ["Targets (issue 4):"]
    v = figs.get("schema")
    if v and t:
        lines.append(f"- fast-forward off, ≥ 0.98× text: measured {v['ratio_med']:.3f} "
                     f"(repeats {', '.join(f'{x:.3f}' for x in v['ratios'])}), est. {v['ratio_est']:.3f}. "
                     f"Mask {v['mask_mean_ms']:.3f} ms/step ({100 * v['mask_mean_ms'] / v['fwd_ms']:.2f}% of the "
                     f"{v['fwd_ms']:.1f} ms forward), exposed {v['exposed_ms']:.4f} ms/step; the non-forward time "
                     f"is {v['nonfwd_ms']:.2f} ms/step against text's {t['nonfwd_ms']:.2f} (sampling "
                     f"{v['sample_ms']:.2f} vs {t['sample_ms']:.2f} ms).")
    for name, key in (("fast-forward on", "schema+ff"), ("fast-forward on, compact whitespace", "schema+ff/cmp")):
        v = figs.get(key)
        if v and t:
            lines.append(f"- {name}, > 1.0× text: measured {v['ratio_med']:.3f} "
                         f"(repeats {', '.join(f'{x:.3f}' for x in v['ratios'])}), est. {v['ratio_est']:.3f}; "
                         f"{100 * v['forced_share']:.1f}% of the completion tokens forced, "
                         f"{v['tok_per_step']:.2f} tokens per step, a step's forward costing "
                         f"{v['fwd_factor']:.2f}× a 1-token one on average, non-forward {v['nonfwd_ms']:.2f} ms/step.")
    out.append("\n".join(lines) + "\n")

    # cold pass and grammar_init_s
    cold = [r for r in runs if r.repeat == -1]
    warm = [r for r in runs if r.repeat >= 0 and r.mode != "text"]
    crow = []
    for m in CONSTRAINED:
        cr = [r for r in cold if r.mode == m]
        wr = [r for r in warm if r.mode == m]
        if not cr:
            continue
        miss = [r.grammar_init_s for r in cr if not r.cache_hit]
        cmask = [x for r in cr for x in r.mask]
        cexp = [x for r in cr for x in r.exposed]
        wmask = [x for r in wr for x in r.mask]
        crow.append([m, f"{sum(not r.cache_hit for r in cr)}/{len(cr)}",
                     fmt(_mean(miss) * 1e3, 1) if miss else "– (cached)",
                     fmt(max(miss) * 1e3, 1) if miss else "–",
                     fmt(_mean(r.grammar_init_s for r in wr) * 1e3, 2),
                     fmt(_mean(cmask) * 1e3, 2), fmt(max(cmask) * 1e3, 1) if cmask else "–",
                     fmt(sum(cexp) * 1e3, 1), fmt(_mean(wmask) * 1e3, 3), fmt(pooled_rate(cr), 2)])
    out.append("Grammar setup and the cold pass (first request per grammar; `schema+ff` reuses `schema`'s "
               "cached grammar; `schema+ff/cmp` compiles its compact-whitespace grammar on its own engine). "
               "grammar_init = `usage.extra.grammar_init_s` (compile or cache lookup + matcher; it overlaps "
               "the prefill). Cold-pass masks include the lazily grown lexer:\n")
    out.append(md_table(["mode", "compiled (cache miss)", "grammar_init ms (miss, mean)", "max",
                         "grammar_init ms (timed, cached)", "cold mask ms mean", "cold mask ms max",
                         "cold exposed mask ms (total)", "warm mask ms mean", "cold decode tok/s"], crow))
    out.append("")

    # per prompt
    prow = []
    for p in prompts:
        for m in MODES:
            rs = [r for r in runs if r.prompt == p["name"] and r.mode == m and r.repeat >= 0]
            if not rs:
                continue
            r0 = rs[0]
            same = all(r.content == r0.content for r in rs)
            valid = "–" if r0.ok is None else ("cut" if r0.finish != "stop" else
                                               ("yes" if all(r.ok for r in rs) else "NO: " + r0.note))
            prow.append([p["name"], m, r0.completion, r0.forced, r0.finish, fmt(_med(r.engine_tps for r in rs), 2),
                         valid, ("" if same else "(varies) ") + "`" +
                         r0.content[:72].replace("`", "'").replace("\n", "\\n") + "`"])
    out.append("Per prompt (first timed repeat's output; decode tok/s: median over the repeats):\n")
    out.append(md_table(["prompt", "mode", "completion", "forced", "finish", "decode tok/s", "valid", "output"],
                        prow, align="llrrlrll"))
    out.append("")

    # reference run with default threads
    if ref_runs:
        rrow = []
        base = pooled_rate([r for r in ref_runs if r.mode == "text"])
        for m in MODES:
            rs = [r for r in ref_runs if r.mode == m]
            rrow.append([m, sum(r.completion for r in rs), fmt(pooled_rate(rs), 2), f"{pooled_rate(rs) / base:.3f}",
                         fmt(_mean(t for r in rs for t, n in zip(r.fwd, r.fwd_n) if n == 1) * 1e3, 1),
                         fmt(_mean(x for r in rs for x in r.mask) * 1e3, 3) if m != "text" else "–",
                         fmt(_mean(x for r in rs for x in r.exposed) * 1e3, 4) if m != "text" else "–"])
        main_fwd = figs["text"]["fwd1_ms"] if "text" in figs else math.nan
        out.append(f"Reference: one pass with PyTorch's default thread count ({default_threads}) over "
                   f"{', '.join(p['name'] for p in prompts[: args.ref_prompts])} (warm grammars; the main "
                   f"measurement's 1-token forward, {args.threads} thread(s): {fmt(main_fwd, 1)} ms):\n")
        out.append(md_table(["mode", "completion tok", "decode tok/s", "÷ text", "forward ms (1 tok)",
                             "mask ms mean", "exposed mask ms"], rrow))
        out.append("")

    out.append(llama_note + ("\n" if llama_rows is None else ""))
    if llama_rows is not None:
        out.append("")
        out.append(md_table(["engine / mode", "requests", "tokens", "decode tok/s (median)", "÷ text", "valid"],
                            llama_rows))
        out.append("")
        if llama_verdict:
            out.append(llama_verdict + "\n")
    return "\n".join(out).rstrip() + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=4, help=f"how many of the {len(PROMPTS)} prompts (default 4)")
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--repeat", type=int, default=2, help="timed repeats after the cold pass (default 2)")
    ap.add_argument("--threads", type=int, default=1, help="torch.set_num_threads for the main measurement")
    ap.add_argument("--ref-prompts", type=int, default=1,
                    help="prompts in the reference pass with PyTorch's default thread count (0: none)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--no-llama-cpp", action="store_true")
    ap.add_argument("--no-llama-cpp-backend", action="store_true",
                    help="skip grammask's own rows on the llama.cpp backend")
    ap.add_argument("--backend", choices=["transformers", "llamacpp"], default="transformers",
                    help="backend of the main measurement (llamacpp: --threads llama.cpp threads)")
    ap.add_argument("--out", help="also write the report to this file")
    ap.add_argument("--results", help="replace the '## e2e.py' section of this Markdown file")
    args = ap.parse_args(argv)
    args.prompts = max(1, min(len(PROMPTS), args.prompts))
    args.repeat = max(1, args.repeat)

    import anyio

    report = anyio.run(amain, args)
    print(report)
    if args.out:
        Path(args.out).write_text(report, encoding="utf-8")
    if args.results:
        # one section per backend of the main measurement
        title = "e2e.py" if args.backend == "transformers" else f"e2e.py --backend {args.backend}"
        update_results_section(args.results, title, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
