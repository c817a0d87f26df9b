"""grammask.adapters.transformers.GrammarLogitsProcessor: unit tests on the scripted vocabulary
(fast), then ``model.generate`` on the embedded SmolLM2-135M (skipped when it is not installed)."""
from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
jsonschema = pytest.importorskip("jsonschema")

from pydantic import BaseModel  # noqa: E402

from grammask.adapters.transformers import GrammarLogitsProcessor, compile_response_format  # noqa: E402
from grammask.errors import GrammarError, InvalidRequestError  # noqa: E402
from grammask.grammar import GrammarCompiler, GrammarMatcher  # noqa: E402
from grammask.grammar.bitmask import unpack_bitmask  # noqa: E402
from grammask.pipeline.scripted import ScriptedBackend  # noqa: E402

BACKEND = ScriptedBackend()
INFO = BACKEND.tokenizer_info
V = BACKEND.vocab_size  # wider than the vocabulary, like real models' logits
PROMPT = [1, 2, 50, 60, 3]


def allowed(scores_row: torch.Tensor) -> set[int]:
    return set(torch.nonzero(torch.isfinite(scores_row)).flatten().tolist())


def matcher_allowed(m: GrammarMatcher) -> set[int]:
    return set(np.nonzero(unpack_bitmask(m.get_next_token_bitmask(), INFO.vocab_size))[0].tolist())


def step(proc, ids: list[list[int]]) -> torch.Tensor:
    scores = torch.randn(len(ids), V)
    return proc(torch.tensor(ids), scores)


def test_masks_follow_each_row():
    proc = GrammarLogitsProcessor({"type": "json_object"}, INFO)
    ref = [GrammarMatcher(proc.compiled) for _ in range(2)]
    rows = [list(PROMPT), list(PROMPT)]
    text = ['{"name": "Bob"}', '{"age": 42}']
    toks = [BACKEND.encode(t) for t in text]
    for k in range(max(len(t) for t in toks) + 1):
        out = step(proc, rows)
        for i in range(2):
            a = allowed(out[i])
            assert a == matcher_allowed(ref[i]), (i, k)
            assert max(a) < INFO.vocab_size  # padded ids never
            nxt = toks[i][k] if k < len(toks[i]) else 0  # then <eos>, then <eos> as padding
            assert nxt in a
            if not ref[i].is_terminated():
                assert ref[i].accept_token(nxt)
            rows[i].append(nxt)
    # both rows ended: only the stop token is offered (and the padding generate appends is ignored)
    out = step(proc, rows)
    assert allowed(out[0]) == allowed(out[1]) == {0}
    assert proc.rejected == []


def test_beam_reorder_forks_states():
    proc = GrammarLogitsProcessor({"type": "regex", "pattern": "(ab|ba)c"}, INFO)
    a, b, c = (BACKEND.encode(x)[0] for x in "abc")
    step(proc, [PROMPT, PROMPT])
    step(proc, [PROMPT + [a], PROMPT + [b]])
    # beam search keeps two children of row 1 and drops row 0
    out = step(proc, [PROMPT + [b, a], PROMPT + [b, a]])
    assert allowed(out[0]) == allowed(out[1]) == {c}
    # both complete: only the stop token
    out = step(proc, [PROMPT + [b, a, c], PROMPT + [b, a, c]])
    assert allowed(out[0]) == {0}
    proc2 = GrammarLogitsProcessor({"type": "regex", "pattern": "(ab|ba)c"}, INFO)
    step(proc2, [PROMPT, PROMPT])
    step(proc2, [PROMPT + [a], PROMPT + [b]])
    out = step(proc2, [PROMPT + [b, a], PROMPT + [a, b]])  # rows swapped: each follows its own history
    assert allowed(out[0]) == allowed(out[1]) == {c}


def test_new_generation_resets_and_rejections_only_stop():
    proc = GrammarLogitsProcessor({"type": "regex", "pattern": "[0-9]+"}, INFO)
    one = BACKEND.encode("1")[0]
    letter = BACKEND.encode("x")[0]
    step(proc, [PROMPT])
    out = step(proc, [PROMPT + [one]])
    assert 0 in allowed(out[0]) and one in allowed(out[0])
    out = step(proc, [PROMPT + [one, letter]])  # forced by someone else: the row may only stop
    assert allowed(out[0]) == {0} and proc.rejected == [(0, letter)]
    # a new generate() call (other prompt and length): fresh matchers
    out = step(proc, [[2, 70, 3]])
    assert 0 not in allowed(out[0]) and one in allowed(out[0]) and proc.rejected == []
    proc.reset()
    out = step(proc, [PROMPT + [one]])  # after reset() any input is a new prompt
    assert 0 not in allowed(out[0])


def test_grammar_inputs_and_errors():
    comp = GrammarCompiler(INFO)
    cg = comp.compile_regex("yes|no")
    proc = GrammarLogitsProcessor(cg)  # a compiled grammar needs no tokenizer
    out = step(proc, [PROMPT])
    assert allowed(out[0]) == {BACKEND.encode("yes")[0], BACKEND.encode("no")[0], BACKEND.encode("y")[0],
                               BACKEND.encode("n")[0]}

    class Person(BaseModel):
        name: str
        age: int

    assert compile_response_format(Person, INFO).kind == "json_schema"
    text = GrammarLogitsProcessor({"type": "text"}, INFO)
    s = torch.randn(1, V)
    assert torch.equal(text(torch.tensor([PROMPT]), s.clone()), s)
    with pytest.raises(InvalidRequestError):
        GrammarLogitsProcessor({"type": "object", "properties": {}}, INFO)  # a bare schema
    with pytest.raises(InvalidRequestError):
        GrammarLogitsProcessor({"type": "json_object"})  # no tokenizer
    with pytest.raises(GrammarError) as ei:
        GrammarLogitsProcessor({"type": "json_schema", "json_schema": {"name": "x", "schema": {
            "type": "object", "properties": {"a": {"type": "strin"}}}}}, INFO)
    assert "#/properties/a/type" in str(ei.value)


# ---------------------------------------------------------------------------------------------- real model
@pytest.fixture(scope="module")
def hf():
    try:
        from grammask.adapters.models import embedded_model_path

        embedded_model_path()
    except Exception as e:  # pragma: no cover - depends on the install
        pytest.skip(f"the embedded model is not installed: {e}")
    from grammask.adapters.transformers_backend import TransformersBackend

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    b = TransformersBackend.load(device="cpu")
    yield b.model, b.tokenizer
    torch.set_num_threads(before)


PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120}},
          "required": ["name", "age"], "additionalProperties": False}


def _inputs(tok, prompts):
    texts = [tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
             for p in prompts]
    tok.padding_side = "left"
    return tok(texts, return_tensors="pt", padding=True)


def test_generate_batch_with_json_schema(hf):
    model, tok = hf
    proc = GrammarLogitsProcessor({"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON,
                                                                          "strict": True}}, tok)
    inp = _inputs(tok, ["Bob is 30 years old. Give his name and age as JSON.",
                        "Describe Alice, 25 years old, as JSON with name and age."])
    out = model.generate(**inp, logits_processor=[proc], max_new_tokens=40, do_sample=False)
    for row in out[:, inp["input_ids"].shape[1]:]:
        jsonschema.validate(json.loads(tok.decode(row, skip_special_tokens=True)), PERSON)
    assert proc.rejected == []


def test_generate_sampling_and_beams(hf):
    model, tok = hf
    proc = GrammarLogitsProcessor({"type": "regex", "pattern": "(yes|no|maybe)"}, tok)
    inp = _inputs(tok, ["Is the sky blue?"])
    torch.manual_seed(0)
    out = model.generate(**inp, logits_processor=[proc], max_new_tokens=6, do_sample=True, temperature=1.5,
                         num_return_sequences=3)
    for row in out[:, inp["input_ids"].shape[1]:]:
        assert tok.decode(row, skip_special_tokens=True) in ("yes", "no", "maybe")
    out = model.generate(**inp, logits_processor=[proc], max_new_tokens=6, num_beams=3, num_return_sequences=3,
                         do_sample=False)
    for row in out[:, inp["input_ids"].shape[1]:]:
        assert tok.decode(row, skip_special_tokens=True) in ("yes", "no", "maybe")
