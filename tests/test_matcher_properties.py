"""Properties of GrammarMatcher and the bitmask helpers (issue 2, §6.3).

(a) sampling allowed tokens until the stop token yields a string of the language;
(b) rollback(n) restores the exact earlier mask, fork() gives an independent matcher;
(c) a refused accept_token / accept_string leaves the state untouched;
(d) find_jump_forward_string/bytes return exactly the forced text (checked against the reference);
(e) termination: only stop tokens in the mask, nothing accepted afterwards;
(f) fill_next_token_bitmasks in threads equals filling the rows one by one;
(g) apply_token_bitmask_inplace on numpy and torch CPU logits sets exactly the disallowed (and
    padded) logits to -inf.
"""
from __future__ import annotations

import json
import random

import numpy as np
import pytest
import regex

from grammask import (
    GrammarCompiler,
    GrammarMatcher,
    TokenizerInfo,
    allocate_token_bitmask,
    apply_token_bitmask_inplace,
    fill_next_token_bitmasks,
)
from grammask.errors import MatcherError
from grammask.grammar.cfg import Grammar
from grammask.grammar.ebnf import parse_ebnf
from grammask.grammar.regex import parse_regex
from reference import ByteEarley
from small_tokenizers import bytelevel_tokenizer, spm_tokenizer

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def bl():
    tok = bytelevel_tokenizer()
    info = TokenizerInfo.from_huggingface(tok, stop_token_ids=[tok.token_to_id("<|endoftext|>")])
    return info, GrammarCompiler(info)


@pytest.fixture(scope="module")
def spm_padded():
    tok = spm_tokenizer()
    info = TokenizerInfo.from_huggingface(tok, vocab_size=tok.get_vocab_size() + 37,
                                          stop_token_ids=[tok.token_to_id("</s>")])
    return info, GrammarCompiler(info)


def allowed_set(m: GrammarMatcher) -> set[int]:
    words = m.get_next_token_bitmask()
    bits = np.unpackbits(words.view(np.uint8), bitorder="little")[: m.vocab_size]
    return set(np.flatnonzero(bits).tolist())


def mask_of(m: GrammarMatcher) -> np.ndarray:
    bm = allocate_token_bitmask(1, m.vocab_size)
    m.fill_next_token_bitmask(bm, 0)
    return bm[0].copy()


CLOSERS = set(b'}]")')


def sample_until_stop(m: GrammarMatcher, info: TokenizerInfo, r: random.Random, max_steps: int = 400):
    """Sample allowed tokens (preferring the stop token, then closing tokens) until termination."""
    stops = set(info.stop_token_ids)
    out = b""
    for step in range(max_steps):
        allowed = allowed_set(m)
        assert allowed, f"dead end after {out!r}"
        stop_ok = sorted(allowed & stops)
        others = sorted(allowed - stops)
        if stop_ok and (not others or r.random() < 0.7):
            assert m.accept_token(stop_ok[0])
            assert m.is_terminated()
            return out
        closing = [t for t in others if CLOSERS & set(info.token_bytes[t])]
        if step > 4 and closing and r.random() < 0.7:
            t = r.choice(closing)
        else:
            t = r.choice(others)
        assert m.accept_token(t), (out, t, info.token_bytes[t])
        out += info.token_bytes[t]
    raise AssertionError(f"no termination within {max_steps} steps: {out[:200]!r}")


# ---------------------------------------------------------------------------------------------- (a)
# (ECMA pattern for the engine, the same language for the `regex` module)
SAMPLED_REGEXES = [
    (r"[a-z]{1,6}@[a-z]{1,5}\.(com|org)", None),
    (r"\(([0-9]{1,3}(, ?[0-9]{1,3})*)?\)", None),
    (r"[\p{L}]{1,5}( [\p{Lu}\p{N}]{1,3}){0,2}", None),
    (r"(\d+\.)?\d{1,3}\s?\w", r"([0-9]+\.)?[0-9]{1,3}[\t\n\x0b\f\r \xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff]?[A-Za-z0-9_]"),
    (r'"([^"\\]|\\["\\/bfnrt])*"', None),
]


@pytest.mark.parametrize("pattern,oracle", SAMPLED_REGEXES, ids=[f"re{i}" for i in range(len(SAMPLED_REGEXES))])
def test_sampled_regex_outputs_match(bl, pattern, oracle):
    info, comp = bl
    cg = comp.compile_regex(pattern)
    cp = regex.compile(oracle or pattern)
    for seed in range(12):
        m = GrammarMatcher(cg)
        out = sample_until_stop(m, info, random.Random(seed))
        text = out.decode("utf-8")
        assert cp.fullmatch(text), (pattern, text)


def _outside_strings(text: str) -> str:
    """``text`` with every string literal replaced by ``S``."""
    out, in_str, esc = [], False, False
    for c in text:
        if in_str:
            if esc:
                esc = False
            elif c == "\\":
                esc = True
            elif c == '"':
                in_str = False
        elif c == '"':
            in_str = True
            out.append("S")
        else:
            out.append(c)
    return "".join(out)


@pytest.mark.parametrize("whitespace,max_ws", [("flexible", 4), ("compact", 32), ("flexible", 32)])
def test_sampled_json_parses(bl, whitespace, max_ws):
    info, comp = bl
    cg = comp.compile_builtin_json_grammar(whitespace=whitespace, max_whitespace=max_ws)
    kinds = set()
    for seed in range(25):
        m = GrammarMatcher(cg)
        text = sample_until_stop(m, info, random.Random(seed)).decode("utf-8")
        value = json.loads(text)
        kinds.add(type(value).__name__)
        outside = _outside_strings(text)
        if whitespace == "compact":
            assert not set(outside) & set(" \t\n\r"), text
        else:
            assert not regex.search(r"[ \t\n\r]{%d}" % (max_ws + 1), outside), text
            assert outside == outside.rstrip(" \t\n\r") or outside.strip() == "", text
    assert {"dict", "list"} & kinds, kinds


def test_sampled_object_only_json(bl):
    info, comp = bl
    cg = comp.compile_builtin_json_grammar(object_only=True)
    for seed in range(10):
        text = sample_until_stop(GrammarMatcher(cg), info, random.Random(seed)).decode("utf-8")
        assert isinstance(json.loads(text), dict), text


def test_sampled_ebnf_outputs_are_accepted_by_reference(bl):
    info, comp = bl
    text = r"""
root ::= stmt (";" ws stmt)*
stmt ::= name ws "=" ws expr
expr ::= term (ws ("+" | "-") ws term)*
term ::= name | [0-9]+ | "(" expr ")"
name ::= [a-z] [a-z0-9_]{0,5}
ws ::= " "?
"""
    rec = ByteEarley(parse_ebnf(text))
    cg = comp.compile_grammar(text)
    for seed in range(15):
        out = sample_until_stop(GrammarMatcher(cg), info, random.Random(seed))
        assert rec.accepts(out), out


# ---------------------------------------------------------------------------------------------- (b)
def _walk_tokens(m, info, r, n):
    toks = []
    for _ in range(n):
        allowed = sorted(allowed_set(m) - set(info.stop_token_ids))
        if not allowed:
            break
        t = r.choice(allowed)
        assert m.accept_token(t)
        toks.append(t)
    return toks


@pytest.mark.parametrize("which", ["json", "ebnf", "regex"])
def test_rollback_restores_exact_masks(bl, which):
    info, comp = bl
    cg = {"json": lambda: comp.compile_builtin_json_grammar(),
          "ebnf": lambda: comp.compile_grammar('root ::= ("[" root "]" | [a-z]+ " "?)*'),
          "regex": lambda: comp.compile_regex(r"([a-z]+|[0-9]{1,4}|[àéü日]){1,12}")}[which]()
    r = random.Random(5)
    for trial in range(4):
        m = GrammarMatcher(cg)
        masks = [mask_of(m)]
        toks = []
        for _ in range(25):
            allowed = sorted(allowed_set(m) - set(info.stop_token_ids))
            if not allowed:
                break
            t = r.choice(allowed)
            assert m.accept_token(t)
            toks.append(t)
            masks.append(mask_of(m))
        for _ in range(6):
            n = r.randint(0, len(toks))
            m.rollback(n)
            del toks[len(toks) - n:]
            del masks[len(masks) - n:]
            assert np.array_equal(mask_of(m), masks[-1]), (which, trial, n)
            assert m.num_accepted == len(toks)
            # go forward again on a different path
            for _ in range(r.randint(0, 5)):
                step = _walk_tokens(m, info, r, 1)
                if not step:
                    break
                toks += step
                masks.append(mask_of(m))
        # after rolling everything back the matcher is at the start again
        m.rollback(len(toks))
        assert np.array_equal(mask_of(m), masks[0])


def test_rollback_of_accept_string_and_stop(bl):
    info, comp = bl
    m = GrammarMatcher(comp.compile_builtin_json_grammar())
    m0 = mask_of(m)
    assert m.accept_string('{"a": [1, ')
    m1 = mask_of(m)
    assert m.accept_string('2]}')
    m2 = mask_of(m)
    stop = info.stop_token_ids[0]
    assert m.accept_token(stop) and m.is_terminated()
    m.rollback(1)
    assert not m.is_terminated()
    assert np.array_equal(mask_of(m), m2)
    m.rollback(1)
    assert np.array_equal(mask_of(m), m1)
    m.rollback(1)
    assert np.array_equal(mask_of(m), m0)
    with pytest.raises(MatcherError):
        m.rollback(1)


def test_max_rollback_tokens_bounds_history(bl):
    info, comp = bl
    m = GrammarMatcher(comp.compile_regex("[a-z]{1,50}"), max_rollback_tokens=3)
    ids = [t for t, b in enumerate(info.token_bytes) if b == b"a"]
    for _ in range(6):
        assert m.accept_token(ids[0])
    m.rollback(3)
    with pytest.raises(MatcherError):
        m.rollback(1)


def test_fork_is_independent(bl):
    info, comp = bl
    cg = comp.compile_builtin_json_grammar()
    r = random.Random(11)
    m = GrammarMatcher(cg)
    toks = _walk_tokens(m, info, r, 8)
    before = mask_of(m)
    f = m.fork()
    assert np.array_equal(mask_of(f), before)
    ftoks = _walk_tokens(f, info, r, 10)
    # the original did not move
    assert np.array_equal(mask_of(m), before)
    # the fork equals a fresh matcher fed the same tokens
    fresh = GrammarMatcher(cg)
    for t in toks + ftoks:
        assert fresh.accept_token(t)
    assert np.array_equal(mask_of(f), mask_of(fresh))
    # moving the original does not move the fork, and rollback histories are separate
    fm = mask_of(f)
    more = _walk_tokens(m, info, r, 5)
    assert np.array_equal(mask_of(f), fm)
    f.rollback(len(ftoks))
    assert np.array_equal(mask_of(f), before)
    m.rollback(len(more))
    assert np.array_equal(mask_of(m), before)
    # a terminated fork does not terminate the original
    g = GrammarMatcher(comp.compile_regex("ab?"))
    assert g.accept_string("a")
    g2 = g.fork()
    assert g2.accept_token(info.stop_token_ids[0]) and g2.is_terminated()
    assert not g.is_terminated() and g.accept_string("b")


# ---------------------------------------------------------------------------------------------- (c)
@pytest.mark.parametrize("which", ["json", "ebnf"])
def test_refused_accept_leaves_state_untouched(bl, which):
    info, comp = bl
    cg = (comp.compile_builtin_json_grammar() if which == "json"
          else comp.compile_grammar('root ::= "a" "bc" | "ab" "d" | [x-z]+ "!"'))
    r = random.Random(3)
    stops = set(info.stop_token_ids)
    m = GrammarMatcher(cg)
    for step in range(12):
        before = mask_of(m)
        allowed = allowed_set(m)
        n_acc = m.num_accepted
        refused = [t for t in range(info.vocab_size) if t not in allowed]
        for t in r.sample(refused, min(40, len(refused))) + [-1, info.vocab_size, info.vocab_size + 5]:
            assert not m.accept_token(t), (step, t)
        for s in ["\x00", "}}}}", "\udcff".encode("utf-8", "surrogatepass"), b"\xff"]:
            assert not m.accept_string(s)
        if not allowed & stops:
            for t in stops:
                assert not m.accept_token(t)
        assert np.array_equal(mask_of(m), before), step
        assert m.num_accepted == n_acc and not m.is_terminated()
        # the mask and accept_token agree on every token of the vocabulary
        for t in range(info.vocab_size):
            ok = m.accept_token(t)
            assert ok == (t in allowed), (step, t, info.token_bytes[t])
            if ok:
                m.rollback(1)
        assert np.array_equal(mask_of(m), before), step
        others = sorted(allowed - stops)
        if not others:
            break
        assert m.accept_token(r.choice(others))


# ---------------------------------------------------------------------------------------------- (d)
def _reference_forced(rec: ByteEarley, sets) -> bytes:
    out = b""
    while not rec.can_end(sets):
        nxt = [(b, s) for b in range(256) if (s := rec.step(sets, b)) is not None]
        if len(nxt) != 1:
            break
        out += bytes([nxt[0][0]])
        sets = nxt[0][1]
    return out


def test_jump_forward_hello_world(bl):
    info, comp = bl
    text = 'root ::= "hello" " " ("world" | "there")'
    m = GrammarMatcher(comp.compile_grammar(text))
    jf = m.find_jump_forward_string()
    assert jf == "hello "
    assert m.accept_string(jf)
    tokens = GrammarMatcher(comp.compile_grammar(text))
    for t in info.encode("hello "):
        assert tokens.accept_token(t)
    assert np.array_equal(mask_of(m), mask_of(tokens))
    assert m.find_jump_forward_string() == ""
    assert m.accept_string("w")
    assert m.find_jump_forward_string() == "orld"
    assert m.accept_string("orld")
    assert m.find_jump_forward_string() == "" and m.can_terminate()


def test_jump_forward_cut_to_whole_characters(bl):
    info, comp = bl
    m = GrammarMatcher(comp.compile_regex("(é|è)x"))
    assert m.find_jump_forward_bytes() == b"\xc3"
    assert m.find_jump_forward_string() == ""
    m = GrammarMatcher(comp.compile_regex("日本(語|人)"))
    assert m.find_jump_forward_string() == "日本"
    assert m.find_jump_forward_bytes() == "日本".encode()  # 語 = e8.., 人 = e4..: no common byte
    m = GrammarMatcher(comp.compile_regex("x(ü|ö)"))  # c3 bc / c3 b6
    assert m.find_jump_forward_bytes() == b"x\xc3"
    assert m.find_jump_forward_string() == "x"


JF_GRAMMARS = [
    ("ebnf", 'root ::= "{" ws "\\"name\\"" ws ":" ws value ws "}"\nvalue ::= "\\"" [a-z]* "\\"" | "null"\nws ::= " "?'),
    ("ebnf", 'root ::= "let " name " = " ("true" | "trap") ";"\nname ::= [a-z]+'),
    ("regex", r"(abc|abd)e{2}f?"),
    ("regex", r"https://(www\.)?example\.com/[a-z]{0,3}"),
    ("json", "compact"),
]


@pytest.mark.parametrize("kind,src", JF_GRAMMARS, ids=[f"jf{i}" for i in range(len(JF_GRAMMARS))])
def test_jump_forward_equals_reference_forced_bytes(bl, kind, src):
    info, comp = bl
    if kind == "ebnf":
        g, cg = parse_ebnf(src), comp.compile_grammar(src)
    elif kind == "regex":
        g = Grammar()
        g.rule("root", [[~parse_regex(src, g.exprs)]])
        cg = comp.compile_regex(src)
    else:
        from grammask.grammar.builtin import json_grammar

        g, cg = json_grammar(whitespace=src), comp.compile_builtin_json_grammar(whitespace=src)
    rec = ByteEarley(g)
    r = random.Random(2)
    stops = set(info.stop_token_ids)
    for walk in range(6):
        m = GrammarMatcher(cg)
        sets = rec.initial()
        for step in range(30):
            want = _reference_forced(rec, sets)
            got = m.find_jump_forward_bytes()
            assert got == want, (kind, src, walk, step)
            s = m.find_jump_forward_string()
            assert s.encode() == want[: len(s.encode())] and len(want) - len(s.encode()) < 4
            if got and r.random() < 0.5:
                f = m.fork()
                assert f.accept_string(got)
                sets = rec.feed(sets, got)
                m = f
                continue
            allowed = sorted(allowed_set(m) - stops)
            if not allowed:
                break
            t = r.choice(allowed)
            assert m.accept_token(t)
            sets = rec.feed(sets, info.token_bytes[t])


# ---------------------------------------------------------------------------------------------- (e)
def test_termination(bl):
    info, comp = bl
    stops = set(info.stop_token_ids)
    m = GrammarMatcher(comp.compile_grammar('root ::= "ab" | "ab" "c"'))
    assert not m.can_terminate()
    assert not (allowed_set(m) & stops)
    assert m.accept_string("ab")
    assert m.can_terminate() and allowed_set(m) & stops == stops
    assert not m.is_terminated()
    assert m.accept_token(info.stop_token_ids[0])
    assert m.is_terminated() and not m.can_terminate()
    assert allowed_set(m) == stops
    assert m.find_jump_forward_string() == ""
    assert not m.accept_token(info.encode("c")[0])
    assert not m.accept_token(info.stop_token_ids[0])
    assert not m.accept_string("c")
    assert m.is_terminated() and allowed_set(m) == stops
    m.reset()
    assert not m.is_terminated() and m.num_accepted == 0
    fresh = GrammarMatcher(comp.compile_grammar('root ::= "ab" | "ab" "c"'))
    assert np.array_equal(mask_of(m), mask_of(fresh))


def test_terminate_without_stop_token(bl):
    info, comp = bl
    m = GrammarMatcher(comp.compile_regex("ab"), terminate_without_stop_token=True)
    assert m.accept_string("a")
    b = info.token_bytes.index(b"b")
    assert m.accept_token(b)
    assert m.is_terminated()
    assert allowed_set(m) == set(info.stop_token_ids)


def test_custom_stop_token_mask_agrees_with_accept(bl):
    """A matcher-level stop token that is an ordinary text token ('a' here): the mask and
    accept_token must agree on it."""
    info, comp = bl
    a = info.token_bytes.index(b"a")
    m = GrammarMatcher(comp.compile_regex("ab"), stop_token_ids=[a])
    allowed = allowed_set(m)
    accepted = m.fork().accept_token(a)
    assert (a in allowed) == accepted, f"mask allows 'a': {a in allowed}, accept_token('a'): {accepted}"


# ---------------------------------------------------------------------------------------------- (f)
def _matchers_in_various_states(info, comp, n=7):
    r = random.Random(8)
    cgs = [comp.compile_builtin_json_grammar(), comp.compile_builtin_json_grammar(whitespace="compact"),
           comp.compile_grammar('root ::= ("[" root "]" | [a-z]+ " "?)*'), comp.compile_regex(r"[a-zé日 ]{1,40}")]
    ms = []
    for i in range(n):
        m = GrammarMatcher(cgs[i % len(cgs)])
        _walk_tokens(m, info, r, r.randint(0, 12))
        ms.append(m)
    return ms


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_batched_fill_in_threads_equals_serial(bl, backend):
    info, comp = bl
    ms = _matchers_in_various_states(info, comp)
    serial = allocate_token_bitmask(len(ms), info.vocab_size)
    for i, m in enumerate(ms):
        m.fill_next_token_bitmask(serial, i)
    for _ in range(3):
        bm = allocate_token_bitmask(len(ms), info.vocab_size, backend=backend)
        fill_next_token_bitmasks(ms, bm)
        got = bm if backend == "numpy" else bm.numpy()
        assert np.array_equal(got, serial)
    # indices and None entries: rows of None stay as allocated (all ones)
    bm = allocate_token_bitmask(len(ms) + 2, info.vocab_size, backend=backend)
    idx = list(range(2, len(ms) + 2))
    fill_next_token_bitmasks([None] + ms[1:], bm, idx)
    got = bm if backend == "numpy" else bm.numpy()
    assert (got[:3] == -1).all()
    assert np.array_equal(got[3:], serial[1:])
    # the same matchers filled again give the same rows (filling has no side effect)
    bm2 = allocate_token_bitmask(len(ms), info.vocab_size)
    fill_next_token_bitmasks(ms, bm2, parallel=False)
    assert np.array_equal(bm2, serial)


def test_bitmask_misuse_raises(bl):
    info, comp = bl
    m = GrammarMatcher(comp.compile_regex("a+"))
    with pytest.raises(MatcherError):
        m.fill_next_token_bitmask(np.zeros((1, 3), np.int32), 0)  # too few words
    with pytest.raises(MatcherError):
        m.fill_next_token_bitmask(allocate_token_bitmask(1, info.vocab_size).astype(np.int64), 0)
    with pytest.raises(MatcherError):
        m.fill_next_token_bitmask(np.zeros((2, (info.vocab_size + 31) // 32 * 2), np.int32)[:, ::2], 0)


# ---------------------------------------------------------------------------------------------- (g)
def _expected(logits: np.ndarray, allowed_rows: list[set[int]]):
    exp = logits.copy()
    for r, allowed in enumerate(allowed_rows):
        for t in range(exp.shape[1]):
            if t not in allowed:
                exp[r, t] = -np.inf
    return exp


def test_apply_bitmask_numpy_and_torch(spm_padded):
    info, comp = spm_padded
    ms = _matchers_in_various_states(info, comp, n=4)
    bm = allocate_token_bitmask(len(ms), info.vocab_size)
    fill_next_token_bitmasks(ms, bm)
    allowed = [allowed_set(m) for m in ms]
    assert all(a for a in allowed)
    # logits wider than the vocabulary (model padding beyond vocab_size and beyond the bitmask width)
    V = bm.shape[1] * 32 + 19
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((len(ms), V)).astype(np.float32)
    exp = _expected(logits, allowed)
    assert np.isneginf(exp[:, info.vocab_size:]).all()

    got = logits.copy()
    apply_token_bitmask_inplace(got, bm)
    assert np.array_equal(got, exp)

    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        t = torch.from_numpy(logits.copy()).to(dtype)
        apply_token_bitmask_inplace(t, torch.from_numpy(bm))
        want = torch.from_numpy(exp).to(dtype)
        assert torch.equal(t, want), dtype

    # 1-D logits and a single row
    one = logits[2].copy()
    apply_token_bitmask_inplace(one, bm[2])
    assert np.array_equal(one, exp[2])
    one_t = torch.from_numpy(logits[2].copy())
    apply_token_bitmask_inplace(one_t, torch.from_numpy(bm[2].copy()))
    assert torch.equal(one_t, torch.from_numpy(exp[2]))

    # indices (xgrammar's meaning): only the listed rows are masked, row i with bitmask row i
    rows = [3, 1]
    got = logits.copy()
    apply_token_bitmask_inplace(got, bm, indices=rows)
    want = logits.copy()
    want[3] = exp[3]
    want[1] = exp[1]
    assert np.array_equal(got, want)
    got_t = torch.from_numpy(logits.copy())
    apply_token_bitmask_inplace(got_t, torch.from_numpy(bm.copy()), indices=rows)
    assert torch.equal(got_t, torch.from_numpy(want))

    # vocab_size: logits at and beyond it are disallowed whatever the bits say
    full = allocate_token_bitmask(1, V)  # all ones
    got = logits[:1].copy()
    apply_token_bitmask_inplace(got, full, vocab_size=info.vocab_size)
    assert np.array_equal(got[0, : info.vocab_size], logits[0, : info.vocab_size])
    assert np.isneginf(got[0, info.vocab_size:]).all()
    got_t = torch.from_numpy(logits[:1].copy())
    apply_token_bitmask_inplace(got_t, torch.from_numpy(full), vocab_size=info.vocab_size)
    assert torch.equal(got_t, torch.from_numpy(got))

    with pytest.raises(MatcherError):
        apply_token_bitmask_inplace(logits.copy(), bm.astype(np.int64))
    with pytest.raises(MatcherError):
        apply_token_bitmask_inplace(torch.from_numpy(logits.copy()), torch.from_numpy(bm.astype(np.int64)))


def test_the_first_matcher_takes_the_compiles_request_buffers(bl):
    """The first matcher of a compiled grammar takes the request buffers its compile used (one
    record less before the first mask), the next ones fresh buffers; all mask alike."""
    info, compiler = bl
    c = GrammarCompiler(info, cache_size=0).compile_json_schema(
        {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "integer"}}})
    spare = c._spare_missing
    m1, m2 = GrammarMatcher(c), GrammarMatcher(c)
    assert m1._M is spare and m2._M is not spare and "_spare_missing" not in c.__dict__
    assert not spare.counts.any()
    for text in ['{"a": "x', '{"a": "xy", "b": 12']:
        for m in (m1, m2):
            m.reset()
            assert m.accept_string(text)
        assert allowed_set(m1) == allowed_set(m2)
