"""Sampling (penalties, bias, temperature/top-k/top-p, seeds, logprobs) and canonical fast-forward."""
from __future__ import annotations

import math

import pytest
import torch

from grammask.errors import GenerationError
from grammask.grammar.compiler import GrammarCompiler
from grammask.grammar.matcher import GrammarMatcher
from grammask.pipeline.fast_forward import TokenIndex, forced_tokens
from grammask.pipeline.sampling import Sampler, SamplingParams
from grammask.pipeline.scripted import ScriptedBackend


def sampler(**kw) -> Sampler:
    seed = kw.pop("seed", 0)
    return Sampler(SamplingParams(**kw), vocab_size=6, seed=seed)


def test_greedy_ties_and_bias():
    s = sampler(temperature=0.0)
    assert s.sample(torch.tensor([0.0, 3.0, 3.0, 1.0, -math.inf, 0.0])).token == 1
    s = sampler(temperature=0.0, logit_bias={3: 5.0, 4: 100.0})
    # the bias cannot revive a masked (-inf) token
    assert s.sample(torch.tensor([0.0, 3.0, 3.0, 1.0, -math.inf, 0.0])).token == 3


def test_penalties_math():
    s = sampler(temperature=0.0, frequency_penalty=0.5, presence_penalty=0.25, repetition_penalty=2.0)
    for t in (1, 1, 2):
        s.observe(t)
    out = s.process(torch.tensor([1.0, 4.0, -2.0, 1.0, 0.0, 0.0]))
    # token 1: 4/2 - 0.5*2 - 0.25 = 0.75; token 2: -2*2 - 0.5 - 0.25 = -4.75
    assert out.tolist() == pytest.approx([1.0, 0.75, -4.75, 1.0, 0.0, 0.0])


def test_top_k_top_p_and_seeds():
    logits = torch.tensor([2.0, 1.9, 1.8, -1.0, -1.0, -1.0])
    draws = {sampler(temperature=1.0, top_k=1, seed=k).sample(logits.clone()).token for k in range(20)}
    assert draws == {0}
    draws = {sampler(temperature=1.0, top_p=0.01, seed=k).sample(logits.clone()).token for k in range(20)}
    assert draws == {0}
    draws = {sampler(temperature=1.0, top_k=3, seed=k).sample(logits.clone()).token for k in range(60)}
    assert draws == {0, 1, 2}
    a = [sampler(temperature=1.5, seed=7).sample(logits.clone()).token for _ in range(5)]
    assert len(set(a)) == 1  # same seed, same draw
    s1, s2 = sampler(temperature=1.5, seed=3), sampler(temperature=1.5, seed=3)
    assert [s1.sample(logits.clone()).token for _ in range(30)] == [s2.sample(logits.clone()).token for _ in range(30)]
    # a masked token is never drawn, whatever the temperature
    masked = torch.tensor([0.0, -math.inf, 0.0, -math.inf, -math.inf, -math.inf])
    assert {sampler(temperature=2.0, seed=k).sample(masked.clone()).token for k in range(50)} == {0, 2}


def test_logprobs_and_all_masked():
    s = sampler(temperature=0.0, logprobs=True, top_logprobs=2)
    r = s.sample(torch.tensor([0.0, math.log(3.0), -math.inf, -math.inf, -math.inf, -math.inf]))
    assert r.token == 1 and r.logprob == pytest.approx(math.log(0.75))
    assert [t for t, _ in r.top] == [1, 0]
    with pytest.raises(GenerationError):
        sampler().sample(torch.full((6,), -math.inf))


# ---------------------------------------------------------------------------------------------- fast-forward
@pytest.fixture(scope="module")
def toy():
    b = ScriptedBackend()
    return b, GrammarCompiler(b.tokenizer_info)


def _after(compiled, b, prefix: str) -> GrammarMatcher:
    m = GrammarMatcher(compiled, stop_token_ids=[0])
    for t in b.encode(prefix):
        assert m.accept_token(t)
    return m


def test_forced_tokens_canonical_cut(toy):
    b, comp = toy
    cg = comp.compile_grammar('root ::= "{\\"name\\"" " "? ":" [0-9]+ "}"')
    m = _after(cg, b, '{"')
    assert m.find_jump_forward_bytes() == b'name"'
    # '"' could merge with ':' into the token '":' -> dropped
    assert [b.tokenizer_info.token_bytes[t] for t in forced_tokens(m, b.encode)] == [b"name"]
    assert [b.tokenizer_info.token_bytes[t] for t in forced_tokens(m, b.encode, max_tokens_back=0)] == [b"name", b'"']
    assert m.num_accepted == 1  # the matcher is left as it was


def test_forced_tokens_kept_when_no_token_spans(toy):
    b, comp = toy
    cg = comp.compile_grammar('root ::= "{\\"name\\": \\"" [A-Za-z]+ "\\"}"')
    m = _after(cg, b, '{"')
    toks = forced_tokens(m, b.encode)
    assert b"".join(b.tokenizer_info.token_bytes[t] for t in toks) == b'name": "'
    assert forced_tokens(m, b.encode, limit=1) == toks[:1]
    assert forced_tokens(m, b.encode, limit=0) == []
    m2 = _after(cg, b, '{"name": "Al')
    assert forced_tokens(m2, b.encode) == []  # nothing forced inside the free string


def test_token_index():
    idx = TokenIndex([b"a", b"ab", b"abc", b"b", b"", b"ab"])
    assert sorted(idx.extending(b"a")) == [1, 2, 5]
    assert list(idx.extending(b"ab")) == [2]
    assert list(idx.extending(b"z")) == []
