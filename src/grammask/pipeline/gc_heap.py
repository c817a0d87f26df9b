"""Keep the cyclic garbage collector's full collections short in a serving process.

CPython's collector walks every tracked object it holds in its oldest generation at each full
collection. A serving process holds hundreds of thousands of them from its start alone (modules,
functions, the model's modules and parameters, the tokenizer's vocabulary), none of which will
ever be garbage. A full collection over them takes tens to hundreds of milliseconds on a small
machine, and it lands on whatever mask or decode step is running: a stall of the whole batch.

:func:`freeze_gc_heap`, called once the process has started and warmed up, collects what is
garbage already and moves everything still alive into the collector's permanent generation
(:func:`gc.freeze`), which later collections skip; vLLM's engine does the same after its start.
What the requests create afterwards is collected as before. The cost: a cycle that was alive at
the freeze and is dropped later is freed only by :func:`gc.unfreeze` (reference counting still
frees everything that is not a cycle), so this is for a process that serves, not for a library
call in the middle of a user's program: :class:`~.engine.AsyncEngine` does it only when asked
(``freeze_gc=True``), and ``grammask serve`` asks.
"""
from __future__ import annotations

import gc
import time

__all__ = ["freeze_gc_heap", "FullCollectionTimer"]


def freeze_gc_heap() -> int:
    """Collect, then move every object the collector tracks into its permanent generation.
    Returns how many objects are frozen now (:func:`gc.get_freeze_count`)."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


class FullCollectionTimer:
    """Times the collector's full (generation 2) collections while installed (a
    :data:`gc.callbacks` hook): ``pauses`` holds each one's duration in seconds, ``freed`` the
    objects each found unreachable (reference cycles: what it had to free besides walking the
    heap; everything else is freed by reference counting where it is dropped).

    >>> with FullCollectionTimer() as t:
    ...     _ = gc.collect()
    >>> len(t.pauses)
    1
    """

    def __init__(self):
        self.pauses: list[float] = []
        self.freed: list[int] = []
        self._t0 = 0.0

    def _callback(self, phase: str, info: dict) -> None:
        if info.get("generation") != 2:
            return
        if phase == "start":
            self._t0 = time.perf_counter()
        else:
            self.pauses.append(time.perf_counter() - self._t0)
            self.freed.append(int(info.get("collected", 0)))

    def __enter__(self) -> "FullCollectionTimer":
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc) -> None:
        try:
            gc.callbacks.remove(self._callback)
        except ValueError:   # pragma: no cover - removed by someone else
            pass
