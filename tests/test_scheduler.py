"""The engine's scheduler on the scripted backend (no model): the token budget per step and chunked
prefill, fairness (every request progresses within a documented number of steps), the bounded
admission queue, and failures inside a busy batch (cancel, malformed request, a mask error) that
leave the other requests' outputs unchanged. Proofs come from the recorded forward calls and the
engine's trace, never from wall-clock thresholds.
"""
from __future__ import annotations

import json
import math
import time
from types import SimpleNamespace

import anyio
import pytest

from grammask.errors import GenerationError, InvalidRequestError
from grammask.pipeline import AsyncEngine, QueueFullError
from grammask.pipeline.scheduler import AdmissionQueue, decode_wait_bound, plan_step, prefill_reserve
from grammask.pipeline.scripted import ScriptedBackend

PERSON_SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
                 "required": ["name", "age"], "additionalProperties": False}
PERSON_EBNF = 'root ::= "{\\"name\\": \\"" [A-Za-z]+ "\\", \\"age\\": " [0-9]+ "}"'


def keyed(answers: dict[str, str]):
    """A responder answering by the key on the prompt's last line (``\\n<key>\\n``)."""
    return lambda prompt: next(v for k, v in answers.items() if prompt.rstrip("\n").endswith("\n" + k))


def msgs(key: str, pad: int = 0) -> list[dict]:
    return [{"role": "user", "content": "x " * pad + "\n" + key}]


async def make(responder, *, backend_kw=None, **engine_kw) -> tuple[AsyncEngine, ScriptedBackend]:
    b = ScriptedBackend(responder, **(backend_kw or {}))
    eng = await AsyncEngine.create(b, trace=True, **engine_kw)
    return eng, b


def content(r) -> str:
    return r.choices[0].message.content


# ---------------------------------------------------------------------------------------------- plan_step
def _c(pending=0, prefilled=True, logits=None, ready=True, served=0, name=""):
    return SimpleNamespace(pending=[7] * pending, prefilled=prefilled, logits=logits, ready=ready, served=served,
                           name=name)


def test_plan_decodes_first_then_prefill_chunks():
    long = _c(100, prefilled=False, name="long")
    decodes = [_c(1, served=s, name=f"d{s}") for s in range(3)]
    ff = _c(5, served=9, name="ff")  # a sampled token and 4 fast-forward tokens
    plan = plan_step([long, *decodes, ff], max_batch=8, budget=16)
    assert [(c.name, n) for c, n in plan.feed] == [("d0", 1), ("d1", 1), ("d2", 1), ("ff", 5), ("long", 8)]
    assert plan.n_tokens == 16
    assert "long" not in {c.name for c in plan.sample}  # a partial chunk: no logits to sample yet
    # no budget: the whole prompt in one forward
    plan = plan_step([long, *decodes], max_batch=8, budget=None)
    assert dict((c.name, n) for c, n in plan.feed)["long"] == 100


def test_plan_keeps_room_for_prefill_and_rotates_decodes():
    decodes = [_c(1, served=s, name=f"d{s}") for s in range(10)]
    waiting = _c(50, prefilled=False, name="p")
    plan = plan_step([waiting, *decodes], max_batch=4, budget=64)
    names = [c.name for c, _ in plan.feed]
    assert names == ["d0", "d1", "d2", "p"]  # least recently served decodes, one slot kept for prefill
    # decodes that eat the budget still leave max(1, budget // 4) tokens to the prompt
    big = [_c(10, served=s, name=f"b{s}") for s in range(4)]
    plan = plan_step([waiting, *big], max_batch=8, budget=16)
    assert dict((c.name, n) for c, n in plan.feed)["p"] >= prefill_reserve(16) == 4
    assert plan.n_tokens <= 16
    # one slot: the least recently served sequence, decode or prefill
    plan = plan_step([_c(3, prefilled=False, served=2, name="p"), _c(1, served=5, name="d")], max_batch=1,
                     budget=8)
    assert [c.name for c, _ in plan.feed] == ["p"]
    # sequences with logits waiting for their grammar are sampled without a forward
    plan = plan_step([_c(0, logits=object(), name="w"), _c(0, logits=object(), ready=False)], max_batch=4, budget=8)
    assert not plan.feed and [c.name for c in plan.sample] == ["w"]


def test_admission_queue_bounds():
    q = AdmissionQueue(max_running=2, max_queue=1)
    q.submit("a", 2)
    assert q.admit() == ["a"] and q.running == 2
    q.submit("b", 1)
    with pytest.raises(QueueFullError):
        q.submit("c", 1)
    assert q.admit() == [] and q.stats()["waiting"] == 1 and q.rejected == 1
    q.release(1)
    assert q.admit() == ["b"]
    with pytest.raises(ValueError):
        q.submit("wide", 3)
    # a request that fits waits only for the running step to end: never refused, even with max_queue 0
    q = AdmissionQueue(max_running=4, max_queue=0)
    q.submit("x", 1)
    q.submit("y", 2)
    assert q.admit() == ["x", "y"] and q.max_waiting_seen == 0
    with pytest.raises(QueueFullError):
        q.submit("z", 2)


# ---------------------------------------------------------------------------------------------- engine
async def test_chunked_prefill_respects_the_budget_and_equals_solo():
    answers = {"long": "Hello world", "s1": "the the", "s2": "yes ok"}
    solo_eng, _ = await make(keyed(answers), max_tokens_per_step=None)
    solo = {k: content(await solo_eng.chat.completions.create(messages=msgs(k, 300 if k == "long" else 0),
                                                               temperature=0)) for k in answers}
    await solo_eng.aclose()
    assert solo == answers
    eng, b = await make(keyed(answers), max_tokens_per_step=16)
    out = {}

    async def one(k):
        out[k] = content(await eng.chat.completions.create(messages=msgs(k, 300 if k == "long" else 0), temperature=0))

    async with anyio.create_task_group() as tg:
        for k in answers:
            tg.start_soon(one, k)
    assert out == solo
    assert all(sum(c.n_tokens) <= 16 for c in b.calls)
    assert len(b.calls) > 600 // 16  # the 600-token prompt went in chunks
    assert not b.live and not eng.active_requests
    await eng.aclose()


async def test_no_request_starves_long_and_short():
    """One long prompt and many short requests, max_batch 4, 12 tokens per step: every request is fed
    within the documented bound (scheduler docstring) from the start and between its forwards."""
    answers = {**{f"s{i}": "Hello world " * (1 + i % 3) for i in range(5)}, "long": "the " * 20,
               **{f"s{i}": "Hello world " * (1 + i % 3) for i in range(5, 10)}}  # arrival order
    budget, max_batch = 12, 4
    eng, b = await make(keyed(answers), max_batch=max_batch, max_running=12, max_tokens_per_step=budget)
    out = {}

    async def one(k):
        pad = 200 if k == "long" else 2
        out[k] = content(await eng.chat.completions.create(messages=msgs(k, pad), temperature=0, request_id=k))

    async with anyio.create_task_group() as tg:
        for k in answers:
            tg.start_soon(one, k)
    assert out == answers
    steps: dict[str, list[int]] = {}
    long_prefill: list[int] = []
    for t in eng.trace:
        if t["kind"] == "forward":
            for rid in t["request_ids"]:
                steps.setdefault(rid, []).append(t["step"])
            if "long" in t["prefill_ids"]:
                long_prefill.append(t["step"])
    # the long prompt went in chunks, and the requests that came before it decoded to their end meanwhile
    assert len(long_prefill) >= 400 // budget
    assert all(steps[f"s{i}"][-1] < long_prefill[-1] for i in range(5))
    assert len(steps) == len(answers)
    # all 11 prompts together: at most 2 * 200 + 11 * 12 tokens, at least prefill_reserve(12) per step
    total_prompt = 2 * 200 + len(answers) * 12
    first_bound = math.ceil(total_prompt / prefill_reserve(budget))
    gap_bound = max(first_bound, decode_wait_bound(len(answers), max_batch, budget))
    for rid, s in steps.items():
        assert s[0] <= first_bound, (rid, s[0], first_bound)
        gaps = [b2 - b1 for b1, b2 in zip(s, s[1:])]
        assert max(gaps, default=1) <= gap_bound, (rid, gaps)
    assert all(sum(c.n_tokens) <= budget and c.n_seqs <= max_batch for c in b.calls)
    await eng.aclose()


async def test_queue_limit_and_admission_as_slots_free():
    answers = {"a": "the " * 30, "b": "Hello world", "c": "yes"}
    seen_live = []
    eng, b = await make(keyed(answers), max_running=1, max_queue=1,
                        backend_kw={"forward_delay": 0.001, "on_forward": lambda _p: seen_live.append(len(b.live))})
    out, errors = {}, {}

    async def one(k):
        try:
            out[k] = content(await eng.chat.completions.create(messages=msgs(k), temperature=0))
        except QueueFullError as e:
            errors[k] = e

    async with anyio.create_task_group() as tg:
        tg.start_soon(one, "a")
        await anyio.sleep(0)
        tg.start_soon(one, "b")  # waits for a's slot
        await anyio.sleep(0)
        tg.start_soon(one, "c")  # the queue is full: refused at once
    assert out == {"a": answers["a"], "b": answers["b"]}
    assert set(errors) == {"c"} and not isinstance(errors["c"], InvalidRequestError)
    assert max(seen_live) == 1  # never more than max_running caches
    st = eng.scheduler_stats
    assert st["max_waiting_seen"] == 1 and st["rejected"] == 1 and st["waiting"] == 0 and st["running_seqs"] == 0
    assert not b.live and not eng.active_requests
    await eng.aclose()



async def test_admission_never_exceeds_the_backend_slots():
    """A backend with fixed slots (llama.cpp's n_seq_max): the engine admits no more sequences than
    it has, the others wait in the queue and complete; asking for more running sequences is refused."""
    answers = {k: f"{k} " * 6 for k in "abcdef"}
    seen_live = []
    eng, b = await make(keyed(answers), backend_kw={"max_sequences": 2, "on_forward": lambda _p: seen_live.append(len(b.live))})
    assert eng.scheduler_stats["max_running"] == 2
    out = {}

    async def one(k):
        out[k] = content(await eng.chat.completions.create(messages=msgs(k), temperature=0))

    async with anyio.create_task_group() as tg:
        for k in answers:
            tg.start_soon(one, k)
    assert out == answers
    assert max(seen_live) == 2 and eng.scheduler_stats["max_waiting_seen"] >= 1
    assert not b.live and not eng.active_requests
    await eng.aclose()
    with pytest.raises(ValueError, match="sequence slots"):
        AsyncEngine(ScriptedBackend("x", max_sequences=2), max_running=3)


MIXED = {
    "text": ("Hello world the the", None),
    "schema": ('{"name": "Alice", "age": 42}',
               {"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON_SCHEMA, "strict": True}}),
    "grammar": ('{"name": "Bob", "age": 100}', {"type": "grammar", "grammar": PERSON_EBNF}),
    "regex": ("yes ok", {"type": "regex", "pattern": "(yes|no) ok"}),
    "object": ('{"name": "Paris"}', {"type": "json_object"}),
    "short": ("the the the the the the", None),  # with max_tokens
    "stopped": ("hello world the end", None),    # with a stop string
}


def mixed_kwargs(k: str) -> dict:
    kw = dict(messages=msgs(k), temperature=0, response_format=MIXED[k][1])
    if k == "short":
        kw["max_tokens"] = 3
    if k == "stopped":
        kw["stop"] = [" the"]
    return kw


def summary(r) -> tuple:
    return content(r), r.choices[0].finish_reason, r.usage.completion_tokens, r.usage.extra.forced_tokens


async def run_mixed(eng, k: str, out: dict) -> None:
    out[k] = summary(await eng.chat.completions.create(**mixed_kwargs(k)))


def mixed_engine(**engine_kw):
    return make(keyed({k: v for k, (v, _) in MIXED.items()}), **engine_kw)


async def solo_outputs(keys, **engine_kw) -> dict:
    eng, _ = await mixed_engine(**engine_kw)
    out = {}
    for k in keys:
        await run_mixed(eng, k, out)
    await eng.aclose()
    return out


@pytest.mark.parametrize("budget", [8, 2])
async def test_batch_equals_solo_with_max_tokens_stop_and_fast_forward(budget):
    """Seven mixed requests at once (text, json_schema, grammar, regex, json_object, max_tokens, stop);
    with 2 tokens per step even the fast-forward tokens of a decode go in chunks."""
    solo = await solo_outputs(MIXED)
    assert solo["short"][:2] == ("the the the", "length")
    assert solo["stopped"][:2] == ("hello world", "stop")
    assert solo["grammar"][3] > 0 and solo["schema"][3] > 0  # fast-forward at work
    eng, b = await mixed_engine(max_tokens_per_step=budget)
    out = {}

    async with anyio.create_task_group() as tg:
        for k in MIXED:
            tg.start_soon(run_mixed, eng, k, out)
    assert out == solo
    assert max(c.n_seqs for c in b.calls) >= 2
    assert all(sum(c.n_tokens) <= budget for c in b.calls)
    json.loads(out["schema"][0])
    assert not b.live and not eng.active_requests
    await eng.aclose()


async def test_masks_before_the_forward_when_the_backend_saturates_the_cpu():
    """``saturates_cpu`` backends (llama.cpp with a thread per core) get each step's masks before the
    forward instead of beside it: the same outputs, and every mask span of a step ends before its
    forward starts (the engine's trace)."""
    solo = await solo_outputs(MIXED)
    eng, b = await mixed_engine()
    b.saturates_cpu = True
    eng2 = AsyncEngine(b, trace=True)
    assert eng.overlap_masks and not eng2.overlap_masks
    await eng.aclose()
    out = {}
    async with anyio.create_task_group() as tg:
        for k in MIXED:
            tg.start_soon(run_mixed, eng2, k, out)
    assert out == solo
    spans: dict[int, dict[str, tuple]] = {}
    for e in eng2.trace:
        if e["kind"] in ("mask", "forward"):
            spans.setdefault(e["step"], {})[e["kind"]] = (e["start"], e["end"])
    both = [v for v in spans.values() if len(v) == 2]
    assert both and all(v["mask"][1] <= v["forward"][0] for v in both)
    await eng2.aclose()


async def test_cancel_mid_batch_frees_slot_and_cache():
    answers = {"long": "the " * 30, "regex": "Hello world " * 10, "schema": '{"name": "Alice", "age": 42}',
               "victim": "the " * 100, "late": "Hello world"}
    formats = {"regex": {"type": "regex", "pattern": "(Hello world )+"}, "schema": MIXED["schema"][1]}
    keys = ["long", "regex", "schema"]

    async def one(k, eng=None):
        out[k] = summary(await eng.chat.completions.create(messages=msgs(k), temperature=0,
                                                           response_format=formats.get(k)))

    out = {}
    solo_eng, _ = await make(keyed(answers))
    for k in keys:
        await one(k, solo_eng)
    await solo_eng.aclose()
    solo, out = out, {}
    # the three first requests running before the victim comes, at 10 ms a step so that the
    # shortest (~12 tokens) still runs when the victim's first token arrives, even on a loaded
    # machine (at 1 ms a step and without the wait, ~1 run in 25 under three busy loops on 2 cores
    # had 3 running, not 4: one finished, or not admitted yet)
    eng, b = await make(keyed(answers), max_running=4, max_queue=4, backend_kw={"forward_delay": 0.01})

    async with anyio.create_task_group() as tg:
        for k in keys:
            tg.start_soon(one, k, eng)
        with anyio.fail_after(10):
            while eng.scheduler_stats["running_seqs"] < len(keys):
                await anyio.sleep(0.001)
        victim = await eng.chat.completions.create(messages=msgs("victim"), temperature=0, stream=True)
        vreq = eng._requests[victim.request_id]
        n = 0
        async for ch in victim:
            if ch.choices and ch.choices[0].delta.content:
                n += 1
                if n == 1:
                    vseq = vreq.choices[0].seq     # admitted: it has a sequence now
                    # the batch is full (4 running): a fifth request waits for a slot
                    assert eng.scheduler_stats["running_seqs"] == 4
                    tg.start_soon(_late, eng, out)
                    with anyio.fail_after(10):   # parsed in a worker thread, then queued
                        while eng.scheduler_stats["waiting"] != 1:
                            await anyio.sleep(0.001)
                    await victim.aclose()
                    break
        # released once the step running now ends (never mid-step), and its slot goes to the late one
        while eng.scheduler_stats["waiting"]:
            await anyio.sleep(0.001)
        assert vseq.released and id(vseq) not in b.live
        assert "late" not in out  # admitted in the victim's slot, still running
    assert {k: out[k] for k in keys} == solo
    assert out["late"][0] == "Hello world"
    assert not b.live and not eng.active_requests and eng.scheduler_stats["running_seqs"] == 0
    await eng.aclose()


async def _late(eng, out):
    r = await eng.chat.completions.create(messages=msgs("late"), temperature=0)
    out["late"] = (content(r), r.choices[0].finish_reason, 0, 0)


async def test_malformed_request_in_busy_batch_fails_alone():
    keys = ["text", "schema", "grammar", "regex"]
    solo = await solo_outputs(keys)
    eng, b = await mixed_engine(backend_kw={"forward_delay": 0.001})
    out, errors = {}, []

    async with anyio.create_task_group() as tg:
        for k in keys:
            tg.start_soon(run_mixed, eng, k, out)
        while not b.calls:
            await anyio.sleep(0.001)
        for bad in (dict(messages=msgs("text"), temperature=-1),
                    dict(messages=msgs("text"), response_format={"type": "grammar", "grammar": "root ::= ("}),
                    dict(messages=msgs("text"), response_format={"type": "json_schema", "json_schema": {
                        "name": "x", "schema": {"type": "nonsense"}}})):
            with pytest.raises((InvalidRequestError, Exception)) as ei:
                await eng.chat.completions.create(**bad)
            errors.append(ei.value)
    assert out == solo
    from grammask.adapters.server import error_for_exception
    assert [error_for_exception(e)[0] for e in errors] == [400, 400, 400]
    assert not b.live and not eng.active_requests
    await eng.aclose()


async def test_mask_error_fails_one_request_the_batch_goes_on():
    keys = ["text", "schema", "regex"]
    solo = await solo_outputs(keys)
    eng, b = await mixed_engine(backend_kw={"forward_delay": 0.001})
    out = {}

    failed = []
    async with anyio.create_task_group() as tg:
        for k in keys:
            tg.start_soon(run_mixed, eng, k, out)
        stream = await eng.chat.completions.create(**mixed_kwargs("grammar"), stream=True)
        m = eng._requests[stream.request_id].choices[0].matcher
        real, calls = m.fill_next_token_bitmask, []

        def broken(bitmask, row=0):
            calls.append(row)
            if len(calls) >= 3:
                raise RuntimeError("injected mask failure")
            return real(bitmask, row)

        m.fill_next_token_bitmask = broken
        try:
            async for _ in stream:
                pass
        except GenerationError as e:
            failed.append(e)
    assert len(failed) == 1 and "injected mask failure" in str(failed[0])
    assert out == solo
    assert not b.live and not eng.active_requests
    await eng.aclose()


async def test_server_maps_the_engine_queue_to_503():
    from grammask.adapters.server import error_for_exception
    status, body = error_for_exception(QueueFullError("busy"))
    assert status == 503 and body["error"]["code"] == "queue_full"


async def test_waiting_requests_can_be_interrupted_and_closed():
    answers = {"a": "the " * 40, "b": "Hello world", "c": "yes"}
    eng, b = await make(keyed(answers), max_running=1, max_queue=4, backend_kw={"forward_delay": 0.001})
    with pytest.raises(InvalidRequestError):  # n sequences that never fit
        await eng.chat.completions.create(messages=msgs("b"), n=2)
    out = {}

    async def one(k):
        r = await eng.chat.completions.create(messages=msgs(k), temperature=0, request_id=k)
        out[k] = (content(r), r.choices[0].finish_reason)

    async def start_all_then(tg, action):
        for k in answers:
            tg.start_soon(one, k)
            await anyio.sleep(0)
        while eng.scheduler_stats["waiting"] < 2:  # "a" runs, "b" and "c" wait
            await anyio.sleep(0.001)
        await action()

    async def interrupt_b():
        assert eng.interrupt("b")  # waiting: leaves the queue, no sequence was ever made for it

    async with anyio.create_task_group() as tg:
        await start_all_then(tg, interrupt_b)
    assert out["b"] == ("", "abort") and out["a"] == (answers["a"], "stop") and out["c"] == (answers["c"], "stop")
    assert len(b.calls) and not b.live and eng.scheduler_stats["running_seqs"] == 0
    # closing the engine with requests waiting aborts them all
    async with anyio.create_task_group() as tg:
        await start_all_then(tg, eng.aclose)
    assert {v[1] for v in out.values()} == {"abort"} and not b.live


@pytest.mark.slow
async def test_chunked_prefill_on_the_embedded_model_equals_solo():
    """The real model (SmolLM2-135M-Instruct): three mixed requests at once with 16 tokens per step
    (prompts fed in chunks next to decodes) give the greedy outputs of one-at-a-time, unchunked runs."""
    pytest.importorskip("transformers")
    jsonschema = pytest.importorskip("jsonschema")
    try:
        from grammask.adapters.models import load_backend
        backend = load_backend(None, "cpu")
    except Exception as e:  # pragma: no cover - depends on the install
        pytest.skip(f"the embedded model is not available: {e}")
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}},
              "required": ["name", "age"], "additionalProperties": False}
    reqs = [dict(messages=[{"role": "user", "content": "Describe a cat. " * 20}], max_tokens=12),
            dict(messages=[{"role": "user", "content": "Invent a person as JSON."}], max_tokens=40,
                 response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": schema}}),
            dict(messages=[{"role": "user", "content": "Say yes or no."}], max_tokens=8,
                 response_format={"type": "regex", "pattern": "(yes|no)[.!]"})]
    solo_eng = await AsyncEngine.create(backend, max_tokens_per_step=None)
    solo = [content(await solo_eng.chat.completions.create(temperature=0, **kw)) for kw in reqs]
    # solo_eng is not closed: aclose() would close the backend both engines share
    eng = await AsyncEngine.create(backend, max_tokens_per_step=16, trace=True)
    out: dict[int, str] = {}

    async def one(i):
        out[i] = content(await eng.chat.completions.create(temperature=0, **reqs[i]))

    async with anyio.create_task_group() as tg:
        for i in range(len(reqs)):
            tg.start_soon(one, i)
    assert [out[i] for i in range(len(reqs))] == solo
    jsonschema.validate(json.loads(out[1]), schema)
    forwards = [t for t in eng.trace if t["kind"] == "forward"]
    assert max(t["n_tokens"] for t in forwards) <= 16 and max(t["n_seqs"] for t in forwards) >= 2
    await eng.aclose()


async def test_requests_are_checked_off_the_event_loop_and_queued_in_arrival_order():
    # checking a request's schema can take seconds (a 1 MiB schema): it runs in a worker thread
    # while the loop keeps serving, and requests are still queued in the order they arrived
    eng, _ = await make(keyed({"slow": "one", "fast": "two"}))
    ticks = 0
    seen = {}
    order = []
    real_parse, real_submit = eng._parse, eng.admission.submit

    def parse(request, kwargs):
        key = (request or kwargs)["messages"][0]["content"]
        if key == msgs("slow")[0]["content"]:
            before = ticks
            time.sleep(0.2)     # stands for a long schema check
            seen["ticks during the slow check"] = ticks - before
        return real_parse(request, kwargs)

    def submit(r, n):
        order.append(r.req.messages[0].content.split("\n")[-1])
        return real_submit(r, n)

    eng._parse = parse
    eng.admission.submit = submit
    out = {}

    async def ticker():
        nonlocal ticks
        while True:
            await anyio.sleep(0.001)
            ticks += 1

    async def ask(key):
        out[key] = content(await eng.chat.completions.create(messages=msgs(key), temperature=0))

    async with anyio.create_task_group() as tg:
        tg.start_soon(ticker)
        tg.start_soon(ask, "slow")
        await anyio.sleep(0)
        tg.start_soon(ask, "fast")      # arrives second, parses at once, waits for its turn
        with anyio.fail_after(10):
            while len(out) < 2:
                await anyio.sleep(0.001)
        tg.cancel_scope.cancel()
    assert out == {"slow": "one", "fast": "two"}
    assert seen["ticks during the slow check"] > 0, "the event loop was blocked by the check"
    assert order == ["slow", "fast"]
    await eng.aclose()
