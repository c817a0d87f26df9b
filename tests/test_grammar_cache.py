"""The one grammar cache (grammask.grammar.cache, owned by GrammarCompiler): front-end keys, callers'
keys (the engine's), compile-once under concurrency, failures not cached; compile_structural_tag."""
from __future__ import annotations

import threading
import time

import pytest

from grammask.errors import GrammarSyntaxError
from grammask.grammar.compiled import CompiledGrammar
from grammask.grammar.compiler import GrammarCompiler
from grammask.grammar.matcher import GrammarMatcher
from grammask.grammar.structural_tag import TagSpec, TagStructure, structural_tag_grammar
from grammask.pipeline.scripted import ScriptedBackend

INFO = ScriptedBackend().tokenizer_info


def test_front_ends_cache_by_their_own_keys():
    c = GrammarCompiler(INFO)
    a = c.compile_regex("[a-z]+")
    assert c.compile_regex("[a-z]+") is a
    assert c.compile_regex("[a-z]*") is not a
    assert c.cache_info == {"size": 2, "hits": 1, "misses": 2}
    c.clear_cache()
    assert c.compile_regex("[a-z]+") is not a


def test_cache_size_zero_compiles_every_time_and_counts_nothing():
    c = GrammarCompiler(INFO, cache_size=0)
    assert c.compile_regex("a") is not c.compile_regex("a")
    assert c.cache_info == {"size": 0, "hits": 0, "misses": 0}


def test_get_or_compile_caches_under_the_callers_key_only():
    c = GrammarCompiler(INFO)
    cg, hit = c.get_or_compile(("mine", 1), lambda: c.compile_regex("ab"))
    assert not hit and len(c.cache) == 1   # the inner compile_regex made no entry of its own
    cg2, hit2 = c.get_or_compile(("mine", 1), lambda: pytest.fail("must not build on a hit"))
    assert hit2 and cg2 is cg
    assert c.compile_regex("ab") is not cg   # outside get_or_compile the front end caches again
    info = c.cache.info
    assert {k: info[k] for k in ("size", "max_size", "hits", "misses", "evictions")} == \
        {"size": 2, "max_size": 128, "hits": 1, "misses": 2, "evictions": 0}
    assert info["max_bytes"] == 256 << 20 and 0 < info["held_bytes"] < info["max_bytes"]


def test_concurrent_callers_compile_once():
    c = GrammarCompiler(INFO)
    builds = []
    start = threading.Barrier(4)

    def build():
        builds.append(1)
        time.sleep(0.2)
        return c.compile_regex("x+")

    out = []

    def worker():
        start.wait()
        out.append(c.get_or_compile(("k",), build))

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(builds) == 1
    assert len({id(cg) for cg, _ in out}) == 1
    assert sorted(hit for _, hit in out) == [False, True, True, True]


def test_a_failed_compile_is_not_cached():
    c = GrammarCompiler(INFO)
    with pytest.raises(GrammarSyntaxError):
        c.get_or_compile(("bad",), lambda: c.compile_grammar("root ::= ("))
    with pytest.raises(GrammarSyntaxError):
        c.compile_grammar("root ::= (")
    assert len(c.cache) == 0
    cg, hit = c.get_or_compile(("bad",), lambda: c.compile_regex("ok"))
    assert not hit and cg.kind == "regex"


def _matches(cg, text: str) -> bool:
    m = GrammarMatcher(cg, stop_token_ids=[0])
    return m.accept_string(text) and m.can_terminate()


def test_compile_structural_tag():
    spec = TagSpec((TagStructure("<f>", {"type": "object"}, "</f>"),), ("<f>",))
    c = GrammarCompiler(INFO)
    cg = c.compile_structural_tag(spec)
    assert cg.kind == "structural_tag" and cg.source == spec.canonical()
    by_hand = CompiledGrammar(structural_tag_grammar(spec), INFO, check_lexemes=False)
    for text in ("", "free text", 'a <f>{"k": 1}</f> b', "a <f>1</f>", "a <f>{}", "<f>{} </f><f>{}</f>"):
        assert _matches(cg, text) == _matches(by_hand, text), text
    assert c.compile_structural_tag(spec) is cg
    assert c.compile_structural_tag(spec, strict=True) is not cg
    assert c.compile_structural_tag(spec, whitespace="compact") is not cg
    assert c.cache_info["size"] == 3


# ---------------------------------------------------------------------------- the byte bound
class _Sized:
    """Stands for a compiled grammar: the cache only asks it what it holds."""

    def __init__(self, n: int):
        self.n = n

    def held_bytes(self) -> int:
        return self.n


def test_the_byte_bound_evicts_least_recently_used_and_keeps_the_newest():
    from grammask.grammar.cache import GrammarCache

    c = GrammarCache(max_size=100, max_bytes=1000)
    a, b = _Sized(400), _Sized(400)
    c.get_or_compile("a", lambda: a)
    c.get_or_compile("b", lambda: b)
    assert len(c) == 2 and c.held_bytes == 800 and c.evictions == 0
    assert c.get_or_compile("a", lambda: pytest.fail("a is cached")) == (a, True)   # a is now the newest
    c.get_or_compile("c", lambda: _Sized(300))   # 1100 > 1000: b, least recently used, goes
    assert "b" not in c and "a" in c and "c" in c and c.evictions == 1
    # one grammar larger than the bound is still cached (and served); the others make room
    big = _Sized(5000)
    assert c.get_or_compile("big", lambda: big) == (big, False)
    assert len(c) == 1 and "big" in c and c.evictions == 3
    assert c.get_or_compile("big", lambda: pytest.fail("big is cached"))[1] is True


def test_sizes_are_read_again_as_cached_grammars_grow():
    from grammask.grammar.cache import GrammarCache

    c = GrammarCache(max_size=100, max_bytes=1000)
    a = _Sized(100)
    c.get_or_compile("a", lambda: a)
    c.get_or_compile("b", lambda: _Sized(100))
    assert len(c) == 2
    a.n = 950   # its lexer grew while it was used
    c.get_or_compile("b", lambda: pytest.fail("b is cached"))   # a lookup re-reads the sizes
    assert "a" not in c and "b" in c


def test_no_byte_bound_and_failed_or_running_compiles_count_nothing():
    from grammask.grammar.cache import GrammarCache

    c = GrammarCache(max_size=100, max_bytes=None)
    for k in range(5):
        c.get_or_compile(k, lambda: _Sized(10 ** 9))
    assert len(c) == 5 and c.evictions == 0
    c = GrammarCache(max_size=100, max_bytes=1000)
    with pytest.raises(ValueError):
        c.get_or_compile("bad", lambda: (_ for _ in ()).throw(ValueError("no")))
    assert c.held_bytes == 0 and len(c) == 0


def test_held_bytes_of_a_real_grammar_grows_with_its_lexer_and_the_compiler_evicts_by_it():
    c = GrammarCompiler(INFO, cache_max_bytes=None)
    cg = c.compile_regex("[a-z]{1,40}@[a-z]{1,40}\\.(com|org)")
    h0 = cg.held_bytes()
    assert h0 >= cg.memory_size_bytes and cg.compile_bytes > 0
    m = GrammarMatcher(cg)
    for ch in "someone@example.com":
        m.get_next_token_bitmask()
        assert m.accept_string(ch)
    assert cg.lexer.n_states > 30 and cg.lexer.grown_nodes > 0
    assert cg.held_bytes() > h0
    # a compiler whose byte bound holds about one such grammar keeps only the newest
    bound = cg.held_bytes() + 1000
    c2 = GrammarCompiler(INFO, cache_max_bytes=bound)
    grammars = []
    for k in range(3):
        g = c2.compile_regex(f"[a-z]{{1,40}}@[a-z]{{1,40}}\\.(com|org|n{k})")
        mk = GrammarMatcher(g)
        for ch in "someone@example.com":
            mk.get_next_token_bitmask()
            mk.accept_string(ch)
        grammars.append(g)
    c2.compile_regex("x")   # a lookup: the grown sizes are read again
    assert c2.cache.evictions >= 2 and c2.cache.held_bytes <= bound


def test_what_a_first_generation_left_in_the_grammars_exprset_still_counts():
    c = GrammarCompiler(INFO, max_lexer_states=20, cache_size=0)
    cg = c.compile_regex("[a-z]{1,200}")
    m = GrammarMatcher(cg)
    for _ in range(60):
        m.get_next_token_bitmask()
        assert m.accept_string("q")
    assert cg.lexer_generations >= 1 and cg._retired_bytes > 0
    assert cg.held_bytes() >= cg._retired_bytes + cg.lexer.held_bytes()


def test_no_full_collection_while_a_grammar_compiles(monkeypatch):
    """Full collections during a compile walk the compile's own objects over and over (the
    slowest TTFMs): the oldest generation's threshold is out of reach inside a compile, for every
    compile running, and back after the last one ends, failed or not; the young generations are
    still collected."""
    import gc

    from grammask.grammar import compiler as compiler_mod

    before = gc.get_threshold()
    seen = []
    inside = threading.Event()
    release = threading.Event()
    real = compiler_mod.CompiledGrammar

    def spy(*args, **kwargs):
        seen.append(gc.get_threshold())
        if kwargs.get("source") == "slow":
            inside.set()
            assert release.wait(10)
        return real(*args, **kwargs)

    monkeypatch.setattr(compiler_mod, "CompiledGrammar", spy)
    c = GrammarCompiler(INFO, cache_size=0)
    c.compile_grammar('root ::= "a"')
    assert seen == [(before[0], before[1], 1 << 30)] and gc.get_threshold() == before
    with pytest.raises(GrammarSyntaxError):
        c.compile_grammar("root ::= (")
    assert gc.get_threshold() == before
    # two compiles at once: the first to end leaves the other's setting
    slow = threading.Thread(target=lambda: c._bounded(lambda: spy(_grammar(), INFO, source="slow")))
    slow.start()
    assert inside.wait(10)
    c.compile_grammar('root ::= "b"')
    assert gc.get_threshold()[2] == 1 << 30
    release.set()
    slow.join(10)
    assert gc.get_threshold() == before and seen[-1][2] == 1 << 30
    monkeypatch.setattr(compiler_mod, "PAUSE_GC_WHILE_COMPILING", False)
    c.compile_grammar('root ::= "d"')
    assert seen[-1] == before


def _grammar():
    from grammask.grammar.ebnf import parse_ebnf

    return parse_ebnf('root ::= "s"')
