"""The kernel driver (`CompiledGrammar.run`) and the named array structures the kernels take.

(a) every kernel called through `FastCall` has exactly one compiled signature after a matcher used
    it, so the fast path (the compiled entry point) is taken;
(b) MISSING requests are served, GROW_* reallocates the parse stack and rebuilds its `arrays`,
    and a kernel that never settles raises past MAX_RESOLVE_ROUNDS;
(c) the lexer republishes `tables` whenever it reallocates an array, so kernels never read
    arrays from two moments.
"""
from __future__ import annotations

import numpy as np
import pytest

from grammask import GrammarCompiler, GrammarMatcher, TokenizerInfo
from grammask.errors import GrammarError
from grammask.grammar import compiled as compiled_mod
from grammask.grammar import lexer as lexer_mod
from grammask.grammar import matcher as matcher_mod
from grammask.grammar.earley import GROW_HASH, GROW_ITEMS, GROW_ROWS, MISSING, OK, REJECT
from small_tokenizers import bytelevel_tokenizer


@pytest.fixture(scope="module")
def bl():
    tok = bytelevel_tokenizer()
    info = TokenizerInfo.from_huggingface(tok, stop_token_ids=[tok.token_to_id("<|endoftext|>")])
    return tok, info, GrammarCompiler(info)


def test_fast_call_kernels_have_one_signature(bl):
    tok, info, comp = bl
    cg = comp.compile_json_schema('{"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}')
    m = GrammarMatcher(cg, terminate_without_stop_token=True)
    for t in tok.encode('{"a": "hello"}').ids:
        m.get_next_token_bitmask()
        assert m.accept_token(t)
    m.find_jump_forward_bytes()
    for fc in (matcher_mod._fill_mask, matcher_mod._advance_bytes, matcher_mod._can_end, compiled_mod._initial_row):
        assert fc.entry is not None, fc.fn
    for fc in (matcher_mod._can_end, compiled_mod._initial_row):
        assert len(fc.fn.signatures) == 1, fc.fn
    # the kernels that may build lexer states: a read-only variant (no expander) and one with
    # an expander (Lexer.inline_expander), each called through its own wrapper
    for fc, fx in ((matcher_mod._fill_mask, matcher_mod._fill_mask_x),
                   (matcher_mod._advance_bytes, matcher_mod._advance_bytes_x)):
        assert fx.entry is not None, fx.fn
        assert len(fc.fn.signatures) == 2, fc.fn
        assert str(fc.sig[-1]) == "none" and str(fx.sig[-1]) != "none"


def test_driver_serves_requests_and_grows(bl):
    _tok, _info, comp = bl
    cg = comp.compile_grammar('root ::= "a"+')
    stack = cg.new_stack()
    missing = cg.new_missing(cg.flat.n_lexemes)
    statuses = [GROW_ITEMS, GROW_ROWS, GROW_HASH, MISSING, REJECT]
    seen = []

    def kernel(x, G, L, P, M, y):
        assert (x, y) == ("head", "tail")
        assert G is cg.G and L is cg.lexer.tables and M is missing
        seen.append(P)
        return statuses[len(seen) - 1], 7

    before = stack.arrays
    assert cg.run(kernel, stack, missing, ("head",), ("tail",)) == (REJECT, 7)
    assert len(seen) == 5
    after = stack.arrays
    assert after.it_pos.shape[0] == 2 * before.it_pos.shape[0]
    assert after.row_ls.shape[0] == 2 * before.row_ls.shape[0]
    assert after.row_beg.shape[0] == 2 * before.row_ls.shape[0] + 1
    assert after.hkeys.shape[0] == 4 * before.hkeys.shape[0] == after.hstamp.shape[0]
    assert seen[1] is not seen[0] and seen[4] is after
    assert np.array_equal(after.row_ls[: before.row_ls.shape[0]], before.row_ls)
    assert (after.row_ls[before.row_ls.shape[0]:] == -2).all()


@pytest.mark.parametrize("eager", [True, False], ids=["compiled-expansion", "derivatives"])
def test_driver_builds_missing_states(bl, monkeypatch, eager):
    _tok, info, _comp = bl
    monkeypatch.setattr(lexer_mod, "EAGER_LEXER", eager)
    comp = GrammarCompiler(info, cache_enabled=False)
    cg = comp.compile_grammar('root ::= [a-z]{0,600} "!"')   # more states than the warm-up expands
    lexer = cg.lexer
    assert lexer.eager == eager
    todo = [s for s in range(lexer.n_states) if not lexer.expanded[s]]
    assert todo
    missing = cg.new_missing(cg.flat.n_lexemes)

    def kernel(G, L, P, M):
        if lexer.expanded[todo[0]]:
            return OK
        M.states[0] = todo[0]
        M.counts[0] = 1
        return MISSING

    assert cg.run(kernel, cg.new_stack(), missing, (), ()) == OK
    assert lexer.expanded[todo[0]] and not missing.counts.any()


def test_driver_gives_up(bl, monkeypatch):
    _tok, _info, comp = bl
    cg = comp.compile_grammar('root ::= "a"')
    monkeypatch.setattr(compiled_mod, "MAX_RESOLVE_ROUNDS", 3)
    calls = []

    def kernel(G, L, P, M):
        calls.append(1)
        return MISSING

    with pytest.raises(GrammarError, match="did not settle"):
        cg.run(kernel, cg.new_stack(), cg.new_missing(1), (), ())
    assert len(calls) == 3


def _published(lx) -> bool:
    return all(a is b for a, b in zip(lx.tables, (lx.trans, lx.state_acc, lx.acc_off, lx.acc_lex,
                                                  lx.st_keys, lx.st_vals)))


def test_lexer_tables_follow_reallocation(bl):
    _tok, _info, comp = bl
    cg = comp.compile_grammar('root ::= [a-z]{1,40} | [0-9]{1,40} | "-" [a-z0-9]{1,60}')
    lx = cg.lexer
    assert _published(lx)
    s = 0
    while s < lx.n_states:
        lx.expand(s)
        assert _published(lx)
        s += 1
    assert lx.n_states > 64   # past the first reallocation of trans and state_acc


def test_long_token_runs_are_built_in_one_round(monkeypatch):
    # tokens of 1..64 spaces: without chains (MissingRequests.chains) the trie walk meets one new
    # lexer state per depth and each needs its own round; with them, the subtree is built at once
    toks = [b""] + [b" " * k for k in range(1, 65)] + [b"x"]
    info = TokenizerInfo(toks, stop_token_ids=[0])
    cg = GrammarCompiler(info, cache_enabled=False).compile_grammar('root ::= [ ]{0,200} "x"')
    rounds = []
    real = cg.resolve

    def counting(status, *a, **k):
        rounds.append(status)
        return real(status, *a, **k)

    monkeypatch.setattr(cg, "resolve", counting)
    m = GrammarMatcher(cg)
    allowed = set(np.flatnonzero(np.unpackbits(m.get_next_token_bitmask().view(np.uint8), bitorder="little")).tolist())
    assert allowed == set(range(1, 66))
    assert len(rounds) <= 3, rounds
    assert m.accept_token(64) and m.accept_token(64) and m.accept_token(64)
    rounds.clear()
    allowed = set(np.flatnonzero(np.unpackbits(m.get_next_token_bitmask().view(np.uint8), bitorder="little")).tolist())
    assert allowed == set(range(1, 9)) | {65}    # 192 spaces so far: at most 8 more
    assert len(rounds) <= 3, rounds


@pytest.mark.parametrize("eager,inline", [(True, True), (True, False), (False, False)],
                         ids=["inline-expansion", "compiled-expansion", "derivatives"])
def test_counted_runs_are_built_in_one_compiled_call(monkeypatch, eager, inline):
    # a run of spaces through a counted alternation: every depth is a state of its own (the
    # count left) that no ladder walks. The mask kernel builds the run as it walks it
    # (lexer.inline_resolve); without that, the compiled chain driver (mask.chain_expand) builds
    # the whole run in one call; the Python loop took a round per byte. Same mask every way.
    monkeypatch.setattr(lexer_mod, "EAGER_LEXER", eager)
    if not inline:
        monkeypatch.setattr(lexer_mod, "INLINE_MAX_ROUNDS", 0)
    toks = [b""] + [b" " * k for k in range(1, 65)] + [b"x", b"y"]
    info = TokenizerInfo(toks, stop_token_ids=[0])
    cg = GrammarCompiler(info, cache_enabled=False).compile_grammar('root ::= (" " | "  " "y"?){0,150} "x"')
    assert cg.lexer.eager == eager
    calls = {"chain": 0, "expand_many": 0}
    real_chain, real_many = compiled_mod._chain_expand, lexer_mod.Lexer.expand_many

    def chain(*a):
        calls["chain"] += 1
        return real_chain(*a)

    def many(self, *a, **k):
        calls["expand_many"] += 1
        return real_many(self, *a, **k)

    monkeypatch.setattr(compiled_mod, "_chain_expand", chain)
    monkeypatch.setattr(lexer_mod.Lexer, "expand_many", many)
    m = GrammarMatcher(cg)
    allowed = set(np.flatnonzero(np.unpackbits(m.get_next_token_bitmask().view(np.uint8), bitorder="little")).tolist())
    assert allowed == set(range(1, 66))   # spaces, and "x" (no "y" before a double space)
    if inline:
        assert cg.lexer.inline_rounds >= 1 and calls["chain"] == 0 and calls["expand_many"] <= 2, calls
    elif eager:
        assert cg.lexer.inline_rounds == 0 and calls["chain"] >= 1 and calls["expand_many"] <= 4, calls
    else:
        assert calls["chain"] == 0 and calls["expand_many"] > 30, calls
    for _ in range(4):
        assert m.accept_token(64)   # 256 spaces: at least 128 iterations
    allowed = set(np.flatnonzero(np.unpackbits(m.get_next_token_bitmask().view(np.uint8), bitorder="little")).tolist())
    assert allowed == set(range(1, 45)) | {65, 66}   # up to 22 more iterations: 44 spaces


def test_fast_call_keeps_the_python_signature_past_a_compiled_callers():
    # a compiled caller passing a literal adds a second signature to the dispatcher; the Python
    # entry point stays (it used to fall back to the dispatcher for good); GRAMMASK_CHECK_FASTCALL
    # catches a Python call with other types
    from numba import njit

    from grammask.grammar.lexdfa import FastCall

    @njit
    def inner(a, k):
        return a[k] + 1

    @njit
    def outer(a):
        return inner(a, 0)

    fc = FastCall(inner)
    a = np.arange(4, dtype=np.int64)
    assert fc(a, 2) == 3 and fc.entry is not None
    assert outer(a) == 1
    assert len(inner.signatures) == 2
    assert fc(a, 3) == 4 and fc.entry is not None
    old = FastCall.check
    try:
        FastCall.check = True
        assert fc(a, 1) == 2
        with pytest.raises(TypeError, match="entry point takes"):
            fc(a.astype(np.int32), 1)
    finally:
        FastCall.check = old


def test_a_read_only_walk_stops_at_the_first_missing_state(bl):
    """With ``STOP_AT_MISSING`` set (a first mask's read-only call, walked again by the building
    variant) the walk returns MISSING at the first state not built, having recorded at most that
    one; without it the walk goes on and records them all. (The masks the matcher makes so are
    those of every mask test: the building call makes the whole row.)"""
    from grammask.grammar.earley import STOP_AT_MISSING

    tok, info, _ = bl
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "n": {"type": "integer"},
                                               "tags": {"type": "array", "items": {"enum": ["x", "yy"]}}}}
    recorded = {}
    for stop in (0, 1):
        cg = GrammarCompiler(info, cache_size=0).compile_json_schema(schema)
        m = GrammarMatcher(cg)
        lexer, mc = m._lexer, cg.mask_cache_of(m._lexer)
        s = lexer.walk_state(m._s, m._reach)
        skip, _combo, _v, _cache, _acc = mc.entry(s)
        words = np.zeros((info.vocab_size + 31) // 32, np.uint32)
        M = m._M
        M.counts[:] = 0
        M.counts[STOP_AT_MISSING] = stop
        st = matcher_mod._fill_mask(cg.forest.arrays, skip, s, m._h, m._lex_len, cg.G, lexer.tables,
                                    m._stack.arrays, M, m._walk, mc.store, words, None)
        assert st == MISSING
        recorded[stop] = int(M.counts[0]) + int(M.counts[1]) + int(M.counts[3])
        M.counts[:] = 0
    assert recorded[1] <= 1 < recorded[0], recorded


def test_inline_room_is_skipped_exactly_when_reserving_would_change_nothing(bl, monkeypatch):
    # Lexer._room_for_round reserves nothing while the counters are within the limits it read
    # from the current arrays: check, at every building call of masks that build thousands of
    # states, that reserving anyway would have changed no array (the fast path loses nothing),
    # and that where the limits sent it to reserve with the same arrays, reserving grew one
    # (the limits are the reservations' own conditions, not stricter)
    tok, info, _comp = bl
    monkeypatch.setattr(lexer_mod, "EAGER_INITIAL_STATES", 1024)   # (so that the masks regrow it)
    comp = GrammarCompiler(info, cache_enabled=False)
    cg = comp.compile_regex("([a-z]+ ){0,2000}[a-z]+!")   # one lexeme: a state per position and count
    orig = lexer_mod.Lexer._room_for_round
    seen = {"fast": 0, "grew": 0}

    def arrays(lx):
        return (lx.tables, lx._D, lx._X, lx._free_queue)

    def checked(self):
        mk = self._room_mark
        before = arrays(self)
        orig(self)
        if self._room_mark is mk:   # the fast path: reserving must change nothing
            seen["fast"] += 1
            self._room_for_seeds(16, lexer_mod.EAGER_RESOLVE_BUDGET, 8)
            self._reserve_g(lexer_mod.EAGER_FREE_ROWS + 64)
            self._room_for_starts(16)
            assert all(a is b for a, b in zip(arrays(self), before))
        elif mk is not None and all(a is b for a, b in zip(mk[:4], before)):
            # the same arrays, past a limit: the reservation grew one of them
            assert any(a is not b for a, b in zip(arrays(self), before))
            seen["grew"] += 1

    monkeypatch.setattr(lexer_mod.Lexer, "_room_for_round", checked)
    text = " ".join("abcdefghij"[: 1 + i % 9] + "xyz"[i % 3] for i in range(1200)) + "!"
    m = GrammarMatcher(cg, terminate_without_stop_token=True)
    for t in tok.encode(text).ids:
        m.get_next_token_bitmask()
        assert m.accept_token(t)
    assert cg.lexer.n_states > 2_000 and seen["fast"] > 100 and seen["grew"] >= 1, (cg.lexer.n_states, seen)


def _masks_and_read_only_walks(monkeypatch, info, tok, skip: bool):
    """The masks along a document of a freshly compiled grammar, and how many read-only mask
    walks (STOP_AT_MISSING set) each matcher's first mask made."""
    from grammask.grammar.earley import STOP_AT_MISSING

    monkeypatch.setattr(matcher_mod, "SKIP_FIRST_READ_ONLY", skip)
    walks = []
    for name in ("_fill_mask", "_fill_mask_cached"):
        real = getattr(matcher_mod, name)

        def counted(*a, _real=real):
            M = next(x for x in a if getattr(x, "_fields", None) and "counts" in x._fields)
            walks.append(int(M.counts[STOP_AT_MISSING]))
            return _real(*a)

        monkeypatch.setattr(matcher_mod, name, counted)
    cg = GrammarCompiler(info, cache_enabled=False).compile_json_schema(
        '{"type": "object", "properties": {"name": {"type": "string"}, "n": {"type": "integer"}}}')
    assert not cg.lexer.walked
    masks, first_walks = [], []
    for _ in range(2):   # a second matcher of the same grammar: its lexer has walked
        m = GrammarMatcher(cg, terminate_without_stop_token=True)
        for i, t in enumerate(tok.encode('{"name": "ab cd", "n": 12}').ids):
            walks.clear()
            masks.append(m.get_next_token_bitmask().copy())
            if i == 0:
                first_walks.append(sum(walks))
            assert m.accept_token(t)
        assert cg.lexer.walked
    return masks, first_walks


def test_a_lexer_generations_first_mask_skips_the_read_only_walk(bl, monkeypatch):
    # matcher.SKIP_FIRST_READ_ONLY: the first mask of a fresh lexer goes straight to the building
    # call (its walk meets states not built yet); later masks walk read-only first, as before;
    # the masks are the same either way
    tok, info, _ = bl
    masks, first_walks = _masks_and_read_only_walks(monkeypatch, info, tok, skip=True)
    assert first_walks == [0, 1]
    masks_ref, first_ref = _masks_and_read_only_walks(monkeypatch, info, tok, skip=False)
    assert first_ref == [1, 1]
    assert len(masks) == len(masks_ref) and all(np.array_equal(a, b) for a, b in zip(masks, masks_ref))
