"""Freezing a serving process's heap out of full garbage collections (pipeline/gc_heap.py)."""
from __future__ import annotations

import gc

import anyio
import pytest

from grammask import cli
from grammask.adapters import server
from grammask.pipeline import AsyncEngine
from grammask.pipeline.gc_heap import FullCollectionTimer, freeze_gc_heap
from grammask.pipeline.scripted import ScriptedBackend


@pytest.fixture
def unfrozen():
    """Every test here starts and ends with nothing frozen (the test process goes on)."""
    gc.unfreeze()
    yield
    gc.unfreeze()


class _Cycle:
    def __init__(self):
        self.me = self


def test_freeze_moves_the_live_heap_out_of_full_collections(unfrozen):
    keep = [_Cycle() for _ in range(1000)]
    before = len(gc.get_objects())
    n = freeze_gc_heap()
    # frozen objects that other threads of the test process free (earlier tests' workers ending)
    # leave the permanent generation: the count can only have dropped since the call
    assert n >= gc.get_freeze_count() >= 1000 and n - gc.get_freeze_count() < 100
    # what was alive is frozen, not collected, and no longer walked by a collection
    walked = {id(o) for o in gc.get_objects()}
    assert len(walked) < before / 10
    assert not any(id(c) in walked for c in keep)
    # what is created afterwards is still collected: a dropped cycle goes at the next collection
    late = _Cycle()
    late_id = id(late)
    del late
    gc.collect()
    assert all(id(o) != late_id for o in gc.get_objects())
    gc.unfreeze()
    assert gc.get_freeze_count() == 0
    assert keep[0].me is keep[0]


def test_the_timer_records_full_collections_only(unfrozen):
    with FullCollectionTimer() as t:
        gc.collect(0)
        gc.collect(1)
        assert t.pauses == []
        gc.collect()
        cycles = [_Cycle() for _ in range(100)]
        del cycles
        gc.collect(2)
    assert len(t.pauses) == 2 and all(p >= 0 for p in t.pauses)
    # what each freed: the second found the 100 dropped cycles (instance and its __dict__ each)
    assert len(t.freed) == 2 and t.freed[1] >= 100
    gc.collect()   # removed from gc.callbacks on exit
    assert len(t.pauses) == 2
    assert t._callback not in gc.callbacks


def test_engine_freezes_only_when_asked(unfrozen):
    async def main():
        e = await AsyncEngine.create(ScriptedBackend(lambda prompt: "{}"))
        assert e.gc_frozen == 0 and gc.get_freeze_count() == 0
        await e.aclose()
        e = await AsyncEngine.create(ScriptedBackend(lambda prompt: "{}"), freeze_gc=True)
        assert e.gc_frozen > 1000 and gc.get_freeze_count() > 1000
        # the engine still serves
        # greedy: at temperature 1 the scripted "{}" loses to another allowed token now and then
        r = await e.chat.completions.create(messages=[{"role": "user", "content": "x"}],
                                            response_format={"type": "json_object"}, max_tokens=8,
                                            temperature=0)
        assert r.choices[0].message.content == "{}"
        await e.aclose()

    anyio.run(main)


@pytest.mark.parametrize("flag, frozen", [([], True), (["--no-gc-freeze"], False)])
def test_serve_freezes_unless_told_not_to(monkeypatch, flag, frozen):
    seen = {}

    def fake_create_app(**kw):
        seen.update(kw)
        return object()

    import uvicorn

    monkeypatch.setattr(server, "create_app", fake_create_app)
    monkeypatch.setattr(uvicorn, "run", lambda *a, **k: None)
    assert cli.main(["serve", "--model", "scripted", *flag]) == 0
    assert seen["engine_kwargs"]["freeze_gc"] is frozen
