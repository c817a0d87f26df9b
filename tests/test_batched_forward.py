"""The transformers backend's batched forward (slot KV cache, :mod:`grammask.adapters.batch_cache`) on the
real embedded model (SmolLM2-135M-Instruct, CPU float32).

Tolerance: a sequence's logits inside a batch are compared with the same sequence decoded alone at
``atol=2e-4, rtol=1e-4`` (logits are O(10); observed differences are below 1e-4). They are not
bit-identical because the batched call reduces over padded shapes (``kv_len`` = the longest row, the
matmul blocking depends on ``B``), which changes float32 summation order; masked keys contribute exact
zeros. Greedy tokens must be identical: no near-tie between the top two logits occurred on these prompts
(the test checks the margin, so a tie would show up as a clear failure message, not a flaky mismatch).
"""
from __future__ import annotations

import contextlib
import json

import pytest

torch = pytest.importorskip("torch")
jsonschema = pytest.importorskip("jsonschema")
pytest.importorskip("transformers")

from grammask.adapters.models import ModelNotFoundError, embedded_model_path  # noqa: E402
from grammask.adapters.transformers_backend import SequenceError, TransformersBackend  # noqa: E402

ATOL, RTOL = 2e-4, 1e-4
QUESTIONS = [
    "Hi", "Name three colors.", "Write a haiku about the sea.", "What is 2+2?",
    "Tell me a joke about cats and dogs, please, in one sentence.", "Translate 'bonjour' to English.",
    "List the days of the week.", "Why is the sky blue? Answer briefly.",
]


@pytest.fixture(scope="module")
def backend():
    with contextlib.suppress(ModelNotFoundError):
        embedded_model_path()
        return TransformersBackend.load(device="cpu", dtype="float32")
    pytest.skip("the embedded model is not installed")


def prompt(backend, q):
    return backend.apply_chat_template([{"role": "user", "content": q}])


def solo(backend, p, n):
    """Greedy tokens and the logits before each of them, the sequence decoded alone."""
    s = backend.new_sequence()
    logits = backend.forward([s], [p])[0]
    toks, rows = [], []
    for _ in range(n):
        rows.append(logits.clone())
        toks.append(int(logits.argmax()))
        logits = backend.forward([s], [[toks[-1]]])[0]
    backend.release(s)
    return toks, rows


def test_batch_equals_solo_with_joins_and_leaves(backend):
    """8 prompts of different lengths: they join the running batch at different steps (prefill in the
    same forward call as the others' decode tokens), decode a different number of tokens each, and
    leave (release) while the others go on."""
    prompts = [prompt(backend, q) for q in QUESTIONS]
    n_tokens = [6, 10, 8, 4, 12, 7, 9, 5]
    join_at = [0, 0, 1, 2, 2, 3, 5, 6]
    refs = [solo(backend, p, n) for p, n in zip(prompts, n_tokens)]

    live: dict[int, dict] = {}
    done: dict[int, list[int]] = {}
    step = 0
    while len(done) < len(prompts):
        seqs, toks, who = [], [], []
        for i, st in live.items():
            seqs.append(st["seq"])
            toks.append([st["out"][-1]])
            who.append(i)
        for i in range(len(prompts)):
            if join_at[i] == step:
                st = live[i] = {"seq": backend.new_sequence(), "out": []}
                seqs.append(st["seq"])
                toks.append(prompts[i])
                who.append(i)
        logits = backend.forward(seqs, toks) if seqs else None
        for row, i in enumerate(who):
            st = live[i]
            k = len(st["out"])
            ref_toks, ref_rows = refs[i]
            torch.testing.assert_close(logits[row], ref_rows[k], atol=ATOL, rtol=RTOL,
                                       msg=lambda m: f"prompt {i} token {k}: {m}")
            top2 = ref_rows[k].topk(2).values
            assert float(top2[0] - top2[1]) > 1e-3, f"near tie at prompt {i} token {k}"
            st["out"].append(int(logits[row].argmax()))
            if len(st["out"]) == n_tokens[i]:
                backend.release(st["seq"])
                done[i] = st["out"]
                del live[i]
        step += 1
    for i, (ref_toks, _) in enumerate(refs):
        assert done[i] == ref_toks, i
    assert backend._pool.in_use == 0


def test_fast_forward_rows_in_a_batch(backend):
    """Rows of several tokens (fast-forward) alongside single-token rows in one padded call."""
    pa, pb = prompt(backend, "Give me a JSON object."), prompt(backend, "Say hello.")
    ff = backend.encode('{"name": "Bob", "age"')
    ref = backend.new_sequence()
    ref_logits = backend.forward([ref], [pa + ff])
    rb = backend.new_sequence()
    backend.forward([rb], [pb])
    ref_b = backend.forward([rb], [[42]])
    a, b = backend.new_sequence(), backend.new_sequence()
    backend.forward([a, b], [pa, pb])
    both = backend.forward([b, a], [[42], ff])
    torch.testing.assert_close(both[1], ref_logits[0], atol=ATOL, rtol=RTOL)
    torch.testing.assert_close(both[0], ref_b[0], atol=ATOL, rtol=RTOL)
    assert a.length == ref.length and b.length == rb.length
    for s in (ref, rb, a, b):
        backend.release(s)



@pytest.mark.parametrize("row_attention", [True, False], ids=["attention-per-row", "block-diagonal-mask"])
def test_packed_prefill_prefix_reuse_and_row_padding_equal_solo(backend, row_attention):
    """The three shapes a step can take beside the plain padded call, each equal to solo decoding:
    prompts joining running sequences in ONE packed call (attention row by row over each row's slot,
    packed_attention.py, or the fallback: one attention over all rows' keys with a block-diagonal
    mask), prompts that start with a kept prompt's tokens (the chat template's system turn) copying
    that prefix's keys/values instead of computing them, and decode calls padded with throw-away rows
    to a faster batch size."""
    from grammask.adapters.prefix_cache import PrefixCache
    from grammask.adapters.transformers_backend import _pack_max_keys

    assert backend._row_attention  # SDPA model: installed at load
    qs = QUESTIONS[:4]
    prompts = [prompt(backend, q) for q in qs]
    saved = (backend.prefix_cache, backend.row_padding.table, backend.row_padding.enabled,
             backend._row_attention, backend._pack_max_keys)
    backend._row_attention = row_attention
    backend._pack_max_keys = None if row_attention else _pack_max_keys(backend.model)
    try:
        backend.prefix_cache = PrefixCache(0)  # references: no reuse, no padding, one sequence
        backend.row_padding.enabled = False
        refs = [solo(backend, p, 3)[1] for p in prompts]
        backend.prefix_cache = PrefixCache(1 << 26)
        backend.row_padding.enabled, backend.row_padding.table = True, {2: 4, 3: 4}
        before = dict(backend.call_stats)
        seqs = [backend.new_sequence() for _ in qs]
        first = backend.forward(seqs[:1], prompts[:1])  # alone: its prompt is kept
        torch.testing.assert_close(first[0], refs[0][0], atol=ATOL, rtol=RTOL)
        nxt = [int(refs[0][0].argmax())]
        out = backend.forward(seqs, [nxt] + prompts[1:])  # 1 decode row + 3 prompts: one packed call
        assert backend.call_stats["packed"] == before["packed"] + 1
        assert backend.prefix_cache.hits == 3 and backend.prefix_cache.tokens_reused >= 3 * 20
        torch.testing.assert_close(out[0], refs[0][1], atol=ATOL, rtol=RTOL)
        for i in (1, 2, 3):
            torch.testing.assert_close(out[i], refs[i][0], atol=ATOL, rtol=RTOL)
        # three decode rows run as four (one throw-away row); the fourth sequence waits
        toks = [[int(out[0].argmax())], [int(out[1].argmax())], [int(out[2].argmax())]]
        pads = backend.call_stats["pad_rows"]
        out3 = backend.forward(seqs[:3], toks)
        assert backend.call_stats["pad_rows"] == pads + 1 and out3.shape[0] == 3
        torch.testing.assert_close(out3[0], refs[0][2], atol=ATOL, rtol=RTOL)
        for i in (1, 2):
            torch.testing.assert_close(out3[i], refs[i][1], atol=ATOL, rtol=RTOL)
        # the waiting sequence was not touched by the padded call
        out4 = backend.forward(seqs[3:], [[int(out[3].argmax())]])
        torch.testing.assert_close(out4[0], refs[3][1], atol=ATOL, rtol=RTOL)
        for sq in seqs:
            backend.release(sq)
    finally:
        (backend.prefix_cache, backend.row_padding.table, backend.row_padding.enabled,
         backend._row_attention, backend._pack_max_keys) = saved

def test_bad_row_changes_nothing(backend):
    p = prompt(backend, "Hi")
    a, b = backend.new_sequence(), backend.new_sequence()
    backend.forward([a, b], [p, p])
    with pytest.raises(SequenceError):
        backend.forward([a, b], [[1], [backend.vocab_size]])
    assert a.length == b.length == len(p) and not a.broken and not b.broken
    out = backend.forward([a, b], [[1], [1]])
    torch.testing.assert_close(out[0], out[1], atol=ATOL, rtol=RTOL)
    backend.release(a)
    backend.release(b)


def test_released_slots_are_reused_and_memory_is_bounded(backend):
    p = backend.encode("Once upon a time")
    assert backend._pool.in_use == 0
    peak_bytes, peak_slots = 0, 0
    live = []
    for k in range(50):
        s = backend.new_sequence()
        backend.forward([s] + live, [p] + [[1]] * len(live))  # a prefill beside the others' decode tokens
        live.append(s)
        if len(live) == 4:  # at most 4 sequences open at a time
            for t in live[:3]:
                backend.release(t)
            live = live[3:]
        peak_bytes = max(peak_bytes, backend._pool.nbytes)
        peak_slots = max(peak_slots, backend._pool.slots)
        if k == 10:
            bytes_after_10 = backend._pool.nbytes
    assert peak_slots <= 4 and backend._pool.nbytes <= bytes_after_10 == peak_bytes
    for s in live:
        backend.release(s)
        backend.release(s)  # idempotent
    assert backend._pool.in_use == 0 and backend._pool.nbytes == 0
    with pytest.raises(SequenceError):
        backend.forward([live[0]], [[1]])


# ---------------------------------------------------------------------------------------------- engine
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120}},
          "required": ["name", "age"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "strict": True, "parameters": {
    "type": "object", "properties": {"location": {"type": "string", "maxLength": 16}},
    "required": ["location"], "additionalProperties": False}}}]
REQUESTS = [
    dict(messages=[{"role": "user", "content": "Say hello."}], max_tokens=16),
    dict(messages=[{"role": "user", "content": "Alice is 31. Give name and age as JSON."}], max_tokens=30,
         response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA, "strict": True}}),
    dict(messages=[{"role": "user", "content": "Bob is 7 years old. JSON please."}], max_tokens=30,
         response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA, "strict": True}}),
    dict(messages=[{"role": "user", "content": "Give a person."}], max_tokens=24,
         response_format={"type": "grammar",
                          "grammar": 'root ::= "{\\"name\\": \\"" [A-Za-z]{1,8} "\\", \\"age\\": " [0-9]{1,2} "}"'}),
    dict(messages=[{"role": "user", "content": "A date please."}], max_tokens=16,
         response_format={"type": "regex", "pattern": "[0-9]{4}-[0-9]{2}-[0-9]{2}"}),
    dict(messages=[{"role": "user", "content": "Weather in Paris?"}], max_tokens=30, tools=TOOLS,
         tool_choice="required"),
    dict(messages=[{"role": "user", "content": "Describe a red apple as JSON."}], max_tokens=20,
         response_format={"type": "json_object"}),
    dict(messages=[{"role": "user", "content": "Count to five."}], max_tokens=12),
]


def outcome(r):
    c = r.choices[0]
    calls = [(t.function.name, t.function.arguments) for t in (c.message.tool_calls or [])]
    return c.message.content, calls, c.finish_reason, r.usage.completion_tokens


def test_engine_batch_equals_solo(backend):
    anyio = pytest.importorskip("anyio")
    from grammask.pipeline.engine import AsyncEngine

    async def main():
        eng = await AsyncEngine.create(backend)
        try:
            alone = [outcome(await eng.chat.completions.create(temperature=0, **kw)) for kw in REQUESTS]
            together: list = [None] * len(REQUESTS)

            async def one(i):
                together[i] = outcome(await eng.chat.completions.create(temperature=0, **REQUESTS[i]))

            async with anyio.create_task_group() as tg:
                for i in range(len(REQUESTS)):
                    tg.start_soon(one, i)
        finally:
            await eng.aclose()
        return alone, together

    alone, together = anyio.run(main)
    assert together == alone
    for kw, (content, _, finish, _) in zip(REQUESTS, alone):
        if kw.get("response_format", {}).get("type") == "json_schema" and finish == "stop":
            jsonschema.validate(json.loads(content), SCHEMA)
    assert backend._pool.in_use == 0


def test_prefill_groups():
    from grammask.adapters.transformers_backend import PREFILL_CHUNK, _prefill_groups

    ids = [[0] * n for n in (44, 43, 3000, 100, 44, PREFILL_CHUNK, 45)]
    # similar prompts together (shortest first), a much longer one alone, over-long ones alone (chunked)
    assert _prefill_groups(list(range(7)), ids) == [[1, 0, 4, 6], [3], [5], [2]]
    assert _prefill_groups([], ids) == []
