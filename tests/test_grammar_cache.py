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
    assert c.cache.info == {"size": 2, "max_size": 128, "hits": 1, "misses": 2}


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
