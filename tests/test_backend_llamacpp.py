"""The llama.cpp backend (``grammask[llamacpp]``) on the embedded SmolLM2-135M GGUF (CPU, one thread).

Skipped where ``llama_cpp`` (llama-cpp-python) is not installed: it is an optional extra built from
source (``make setup-llamacpp``)."""
from __future__ import annotations

import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import anyio
import pytest

pytest.importorskip("llama_cpp")
torch = pytest.importorskip("torch")

from grammask.adapters import models  # noqa: E402
from grammask.adapters.llamacpp_backend import (  # noqa: E402
    ContextLengthError, LlamaCppBackend, LlamaCppDecodeError, NoFreeSlotError, SequenceError)
from grammask.pipeline import AsyncEngine  # noqa: E402
from grammask.pipeline.backend import ModelBackend  # noqa: E402


def _gguf_path() -> str:
    try:
        return models.embedded_model_path()
    except models.ModelNotFoundError as e:  # pragma: no cover - depends on the install
        pytest.skip(f"embedded GGUF model not installed: {e}", allow_module_level=True)


GGUF_PATH = _gguf_path()
N_SEQ = 4
TEXTS = [
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "  leading spaces, tabs\tand\nnewlines",
    "naïve café — 東京 🙂 {\"a\": [1, 2.5e-3, null]}",
    "def f(x):\n    return x ** 2  # square",
]
QUESTIONS = ["What is the capital of France?", "Name three colors.", "Write a haiku about the sea."]


@pytest.fixture(scope="module")
def backend():
    b = LlamaCppBackend(GGUF_PATH, n_ctx=512, n_seq_max=N_SEQ, n_threads=1)
    yield b
    b.close()


def chat(backend, text):
    return backend.apply_chat_template([{"role": "user", "content": text}])


def solo_logits(backend, prompt, extra=()):
    """Logits after ``prompt`` (then each of ``extra`` one at a time) on a fresh sequence, alone."""
    seq = backend.new_sequence()
    try:
        out = [backend.forward([seq], [prompt])[0].clone()]
        for t in extra:
            out.append(backend.forward([seq], [[t]])[0].clone())
        return out
    finally:
        backend.release(seq)


def close(a, b):
    """Same logits up to batch-shape rounding in llama.cpp's kernels, same argmax."""
    assert int(a.argmax()) == int(b.argmax())
    torch.testing.assert_close(a, b, atol=2e-2, rtol=1e-3)


# ---------------------------------------------------------------------------------------------- basics
def test_protocol_and_metadata(backend):
    assert isinstance(backend, ModelBackend)
    assert backend.device == "cpu"
    assert backend.vocab_size == backend.tokenizer_info.vocab_size == 49152
    assert backend.max_context == 512 and backend.n_seq_max == N_SEQ and backend.n_threads == 1
    im_end = backend.encode("<|im_end|>")
    assert len(im_end) > 1  # plain text: special tokens are not parsed
    [im_end_id] = backend._tokenize("<|im_end|>", parse_special=True)
    assert im_end_id in backend.eos_token_ids


def test_vocabulary_agrees_with_llama_cpp(backend):
    """TokenizerInfo.from_gguf's token bytes are llama.cpp's own pieces, id for id (special tokens
    aside), and llama.cpp's tokenization of sample texts spells them back."""
    info = backend.tokenizer_info
    special = set(info.special_token_ids)
    mismatched = [i for i in range(backend.vocab_size)
                  if i not in special and backend.token_bytes(i, special=False) != info.token_bytes[i]]
    assert mismatched == []
    for text in TEXTS:
        ids = backend.encode(text)
        assert b"".join(info.token_bytes[i] for i in ids) == text.encode("utf-8")
        assert backend.decode(ids) == text
        if info.hf_tokenizer is not None:  # our own GGUF BPE tokenizer: the same ids
            assert info.encode(text) == ids


def test_chat_template_matches_transformers(backend):
    pytest.importorskip("transformers")
    from grammask.adapters.transformers_backend import TransformersBackend

    tb = TransformersBackend.load(device="cpu")
    conversations = [
        [{"role": "user", "content": "What is the capital of France?"}],
        [{"role": "system", "content": "Reply with JSON only."}, {"role": "user", "content": "Lyon? 東京 🙂"}],
        [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
         {"role": "user", "content": "Bye"}],
    ]
    for msgs in conversations:
        for gen in (True, False):
            assert backend.apply_chat_template(msgs, add_generation_prompt=gen) == \
                tb.apply_chat_template(msgs, add_generation_prompt=gen)


def test_load_backend_choice():
    b = models.load_backend(None, backend="llamacpp", n_ctx=64, n_seq_max=1, n_threads=1)
    try:
        assert isinstance(b, LlamaCppBackend) and b.max_context == 64
    finally:
        b.close()
    with pytest.raises(ValueError):
        models.load_backend(None, backend="vllm")


# ---------------------------------------------------------------------------------------------- batching
def test_batch_equals_solo(backend):
    prompts = [chat(backend, q) for q in QUESTIONS]
    nxt = [[int(t) for t in backend.encode(" Paris is big")], [198], [330, 2124]]
    solo = [solo_logits(backend, p, e) for p, e in zip(prompts, nxt)]
    seqs = [backend.new_sequence() for _ in prompts]
    try:
        first = backend.forward(seqs, prompts)  # three prompts of different lengths in one llama_batch
        assert first.shape == (3, backend.vocab_size) and first.dtype == torch.float32
        for i in range(3):
            close(first[i], solo[i][0])
        for k in range(max(map(len, nxt))):
            live = [i for i in range(3) if k < len(nxt[i])]
            out = backend.forward([seqs[i] for i in live], [[nxt[i][k]] for i in live])
            for row, i in enumerate(live):
                close(out[row], solo[i][k + 1])
        # several tokens per sequence in one call (fast-forward shape) and an empty list (last logits)
        a = backend.forward(seqs[:2], [[11, 12, 13], []])
        assert torch.equal(a[1], backend.forward([seqs[1]], [[]])[0])
    finally:
        for s in seqs:
            backend.release(s)


def test_batches_past_n_batch_are_split(backend):
    small = LlamaCppBackend(GGUF_PATH, n_ctx=256, n_seq_max=2, n_batch=16, n_threads=1)
    try:
        prompts = [chat(small, QUESTIONS[0]), chat(small, QUESTIONS[2])]
        assert sum(map(len, prompts)) > 2 * small.n_batch
        seqs = [small.new_sequence() for _ in prompts]
        out = small.forward(seqs, prompts)
        for i, p in enumerate(prompts):
            close(out[i], solo_logits(backend, p)[0])
    finally:
        small.close()


def test_release_frees_the_slot_without_stale_cache(backend):
    x, y = chat(backend, QUESTIONS[0]), chat(backend, QUESTIONS[1])
    ref = solo_logits(backend, y)[0]
    assert backend.free_slots == N_SEQ
    seqs = [backend.new_sequence() for _ in range(N_SEQ)]
    assert backend.free_slots == 0
    with pytest.raises(NoFreeSlotError):
        backend.new_sequence()
    backend.forward(seqs, [x] * N_SEQ)
    victim = seqs[1]
    backend.release(victim)
    backend.release(victim)  # idempotent
    assert backend.free_slots == 1
    with pytest.raises(SequenceError):
        backend.forward([victim], [[1]])
    fresh = backend.new_sequence()
    assert fresh.slot == victim.slot and fresh.length == 0
    close(backend.forward([fresh], [y])[0], ref)  # nothing of x left in the reused slot
    for s in [fresh] + seqs[:1] + seqs[2:]:
        backend.release(s)
    assert backend.free_slots == N_SEQ


def test_errors_leave_sequences_usable(backend):
    p = chat(backend, QUESTIONS[0])
    ref = solo_logits(backend, p, [198])
    seq = backend.new_sequence()
    try:
        backend.forward([seq], [p])
        with pytest.raises(SequenceError):
            backend.forward([seq], [[backend.vocab_size]])
        with pytest.raises(ContextLengthError):
            backend.forward([seq], [[198] * backend.max_context])
        with pytest.raises(SequenceError):
            backend.forward([seq, seq], [[1], [2]])
        assert seq.length == len(p)
        close(backend.forward([seq], [[198]])[0], ref[1])
    finally:
        backend.release(seq)


def test_failed_decode_is_typed_and_rolled_back(backend):
    """A llama_decode failure after part of the batch was decoded (the second of several chunks)
    raises LlamaCppDecodeError and leaves every sequence of the call as it was before it."""
    small = LlamaCppBackend(GGUF_PATH, n_ctx=256, n_seq_max=2, n_batch=16, n_threads=1)
    real = small._lc

    class FailSecondDecode:
        calls = 0

        def __getattr__(self, name):
            return getattr(real, name)

        def llama_decode(self, ctx, batch):
            FailSecondDecode.calls += 1
            return 1 if FailSecondDecode.calls == 2 else real.llama_decode(ctx, batch)

    try:
        a, b = small.new_sequence(), small.new_sequence()
        pa, pb = chat(small, QUESTIONS[0]), chat(small, QUESTIONS[1])
        ref = [small.forward([s], [p])[0].clone() for s, p in ((a, pa), (b, pb))]
        small._lc = FailSecondDecode()
        with pytest.raises(LlamaCppDecodeError) as e:
            small.forward([a, b], [pb, pa])  # > n_batch tokens: several decodes, the second fails
        assert e.value.code == 1
        small._lc = real
        assert (a.length, b.length) == (len(pa), len(pb))
        for s, r in ((a, ref[0]), (b, ref[1])):
            assert torch.equal(small.forward([s], [[]])[0], r)
        # nothing of the failed call is left in the cache: the next token gives the logits it gives alone
        again = small.forward([a, b], [[198], [198]])
        for row, p in enumerate((pa, pb)):
            close(again[row], solo_logits(backend, p, [198])[1])
    finally:
        small._lc = real
        small.close()


# ---------------------------------------------------------------------------------------------- engine
@pytest.fixture(scope="module")
def llama_ref():
    from llama_cpp import Llama

    # flash attention on, as the backend has it by default (llama.cpp's automatic choice on this CPU)
    llm = Llama(model_path=GGUF_PATH, n_ctx=512, n_threads=1, n_threads_batch=1, flash_attn=True, verbose=False)
    yield llm
    llm.close()


def llama_greedy(llm, prompt, n, eos):
    out = []
    llm.reset()
    for tok in llm.generate(prompt, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0):
        out.append(int(tok))
        if tok in eos or len(out) >= n:
            break
    return out


def engine_backend():
    """A backend of its own for an engine (``AsyncEngine.aclose`` closes its backend)."""
    return LlamaCppBackend(GGUF_PATH, n_ctx=512, n_seq_max=2, n_threads=1)


async def test_engine_greedy_equals_llama_cpp(llama_ref):
    backend = engine_backend()
    engine = await AsyncEngine.create(backend, warmup=False)
    try:
        for q in QUESTIONS:
            msgs = [{"role": "user", "content": q}]
            ref = llama_greedy(llama_ref, backend.apply_chat_template(msgs), 24, set(backend.eos_token_ids))
            r = await engine.chat.completions.create(messages=msgs, max_tokens=24, temperature=0)
            text = backend.decode([t for t in ref if t not in backend.eos_token_ids])
            assert r.choices[0].message.content == text
            assert r.choices[0].finish_reason == ("stop" if ref[-1] in backend.eos_token_ids else "length")
        assert backend.free_slots == backend.n_seq_max  # every request released its slot
        # more concurrent requests than the backend's 2 slots: the engine queues the rest (no
        # NoFreeSlotError), every request completes, and never more than 2 slots are used
        assert engine.scheduler_stats["max_running"] == backend.n_seq_max == 2
        rs = {}

        async def one(k, q):
            rs[k] = await engine.chat.completions.create(messages=[{"role": "user", "content": q}], max_tokens=8,
                                                         temperature=0)
        async with anyio.create_task_group() as tg:
            for k, q in enumerate(QUESTIONS * 2):
                tg.start_soon(one, k, q)
        assert len(rs) == 2 * len(QUESTIONS) and all(r.choices[0].finish_reason for r in rs.values())
        assert engine.scheduler_stats["max_waiting_seen"] >= 1 and backend.free_slots == 2
    finally:
        await engine.aclose()
    assert backend.closed
    with pytest.raises(SequenceError):
        backend.new_sequence()


async def test_engine_json_schema_validates():
    jsonschema = pytest.importorskip("jsonschema")
    schema = {"type": "object",
              "properties": {"name": {"type": "string", "maxLength": 20},
                             "age": {"type": "integer", "minimum": 0, "maximum": 120}},
              "required": ["name", "age"], "additionalProperties": False}
    engine = await AsyncEngine.create(engine_backend())
    try:
        for ff in (False, True):
            r = await engine.chat.completions.create(
                messages=[{"role": "user", "content": "Alice is 31 years old. Give her name and age as JSON."}],
                max_tokens=60, temperature=0, fast_forward=ff,
                response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": schema,
                                                                         "strict": True}})
            c = r.choices[0]
            assert c.finish_reason == "stop", c.message.content
            jsonschema.validate(json.loads(c.message.content), schema)
    finally:
        await engine.aclose()
