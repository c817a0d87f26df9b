"""The engine's scheduler: admission (a bounded queue) and the choice of each step's batch.

Two bounds keep memory and step time in check (docs/engine.md, "Scheduling"):

- **Admission** (:class:`AdmissionQueue`): at most ``max_running`` sequences hold a backend
  sequence (a KV cache) at once; a request that does not fit waits, without a cache, in a FIFO of
  at most ``max_queue`` requests, and is admitted as soon as finished, failed or aborted requests
  free their sequences. Past ``max_queue`` a request is refused with :class:`QueueFullError`
  (the server answers 503 with ``Retry-After``).
- **One step** (:func:`plan_step`): at most ``max_batch`` sequences and at most
  ``max_tokens_per_step`` tokens in the forward. Decode tokens (the sampled token plus any
  fast-forward tokens) of running sequences go first, least recently served first; prefill chunks
  of admitted prompts fill the rest of the budget, oldest request first (chunked prefill: a long
  prompt is fed over several steps and never stalls the running sequences for a whole prompt's
  forward). A sequence fed only part of its pending tokens gets no logits that step; its next
  step carries the rest (the backend protocol is unchanged: a chunk is just fewer tokens).

Fairness bound. While prompts wait for prefill, the decodes of a step keep one slot and a quarter
of the token budget (``max(1, budget // 4)``) free for them, so with ``D`` decoding sequences
every decoding sequence is fed at least once every ``ceil(D / k)`` steps, with
``k = min(max_batch - 1, budget - max(1, budget // 4))`` (``k = min(max_batch, budget)`` when no
prompt waits); the oldest prompt waiting for prefill gets at least ``max(1, budget // 4)`` tokens
every step, so a prompt of ``P`` tokens behind prompts totalling ``Q`` tokens is prefilled within
``ceil((P + Q) / max(1, budget // 4))`` steps. (With ``max_batch == 1`` the single slot goes to
the least recently served sequence, decode or prefill; the bounds need a budget of 2 or more.)
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Sequence

from ..errors import GrammaskError

__all__ = ["AdmissionQueue", "QueueFullError", "StepPlan", "decode_wait_bound", "plan_step", "prefill_reserve"]


class QueueFullError(GrammaskError, RuntimeError):
    """Every slot is busy and the waiting queue is full (HTTP 503 with ``Retry-After``)."""

    def __init__(self, message: str, retry_after: float | None = None):
        super().__init__(message)
        self.retry_after = retry_after


# ---------------------------------------------------------------------------------------------- admission
class AdmissionQueue:
    """Counts the sequences holding a cache and keeps the FIFO of requests waiting for one.

    ``submit(item, n)`` queues a request of ``n`` sequences (or raises :class:`QueueFullError`);
    ``admit()`` pops, in order, the waiting requests that fit now (never skipping the head, so a
    wide request is not starved by narrow ones); ``release(n)`` frees ``n`` sequences. The engine
    admits between steps only, so a request that fits also waits here until the running step ends;
    it is never refused, and ``max_waiting_seen`` counts only requests that did not fit."""

    def __init__(self, max_running: int, max_queue: int | None):
        if max_running < 1:
            raise ValueError("max_running must be >= 1")
        if max_queue is not None and max_queue < 0:
            raise ValueError("max_queue must be >= 0 (or None: unbounded)")
        self.max_running = int(max_running)
        self.max_queue = None if max_queue is None else int(max_queue)
        self.running = 0
        self.waiting: deque[tuple[Any, int]] = deque()
        self.max_waiting_seen = 0
        self.rejected = 0

    def submit(self, item: Any, n: int) -> None:
        if n > self.max_running:
            raise ValueError(f"{n} sequences never fit in max_running {self.max_running}")
        # fits: only waits for the running step to end (sequences are made between steps)
        fits_now = self.running + sum(k for _it, k in self.waiting) + n <= self.max_running
        if not fits_now and self.max_queue is not None and len(self.waiting) >= self.max_queue:
            self.rejected += 1
            raise QueueFullError(f"the engine is busy: {self.running} sequences running and {len(self.waiting)} "
                                 f"requests waiting (max_running {self.max_running}, max_queue {self.max_queue}); "
                                 "retry later")
        self.waiting.append((item, n))
        if not fits_now:
            self.max_waiting_seen = max(self.max_waiting_seen, len(self.waiting))

    def admit(self) -> list[Any]:
        out = []
        while self.waiting and self.running + self.waiting[0][1] <= self.max_running:
            item, n = self.waiting.popleft()
            self.running += n
            out.append(item)
        return out

    def discard(self, item: Any) -> bool:
        """Drop a waiting request (aborted before admission)."""
        for k, (it, _n) in enumerate(self.waiting):
            if it is item:
                del self.waiting[k]
                return True
        return False

    def release(self, n: int = 1) -> None:
        self.running = max(0, self.running - n)

    def stats(self) -> dict:
        return {"running_seqs": self.running, "waiting": len(self.waiting), "max_running": self.max_running,
                "max_queue": self.max_queue, "max_waiting_seen": self.max_waiting_seen, "rejected": self.rejected}


# ---------------------------------------------------------------------------------------------- one step
@dataclass
class StepPlan:
    #: (choice, number of its pending tokens fed in this step's forward), decodes first
    feed: list[tuple[Any, int]] = field(default_factory=list)
    #: choices sampled this step: fed all their pending tokens (or fed earlier) and ready
    sample: list[Any] = field(default_factory=list)

    @property
    def n_tokens(self) -> int:
        return sum(n for _c, n in self.feed)


def prefill_reserve(budget: int | None) -> int:
    """Tokens of a step kept for prefill while prompts wait (decodes take the rest first)."""
    return 0 if budget is None else max(1, budget // 4)


def decode_wait_bound(n_decoding: int, max_batch: int, budget: int | None, prefill_waiting: bool = True) -> int:
    """Steps within which every one of ``n_decoding`` decoding sequences is fed at least once."""
    slots = max_batch - (1 if prefill_waiting and max_batch > 1 else 0)
    cap = slots if budget is None else min(slots, budget - (prefill_reserve(budget) if prefill_waiting else 0))
    return math.ceil(n_decoding / max(1, cap))


def plan_step(choices: Sequence[Any], *, max_batch: int, budget: int | None) -> StepPlan:
    """This step's batch. ``choices``: the active choices in admission order, each with
    ``pending`` (tokens to feed), ``prefilled``, ``logits`` (or None), ``ready`` (may sample) and
    ``served`` (the last step it was fed, or its admission step)."""
    plan = StepPlan()
    waiting_sample = [c for c in choices if not c.pending and c.logits is not None and c.ready]
    plan.sample.extend(waiting_sample[:max_batch])
    slots = max_batch - len(plan.sample)
    left = math.inf if budget is None else max(1, int(budget))
    decode = sorted((c for c in choices if c.pending and c.prefilled), key=lambda c: c.served)
    prefill = [c for c in choices if c.pending and not c.prefilled]

    def take(c, room) -> int:
        n = int(min(len(c.pending), room))
        plan.feed.append((c, n))
        if n == len(c.pending) and c.ready:
            plan.sample.append(c)
        return n

    if slots <= 0:
        return plan
    if slots == 1 and decode and prefill:  # one slot: least recently served, decode or prefill
        c = min(decode + prefill, key=lambda c: c.served)
        take(c, left)
        return plan
    d_slots, d_left = slots, left
    if prefill:
        d_slots -= 1
        if budget is not None:
            d_left = left - prefill_reserve(budget) if left > 1 else left
    # decodes within their share, then prefill chunks within what is left of the step
    used_slots = used_tokens = 0
    for group, slot_cap, token_cap in ((decode, d_slots, d_left), (prefill, slots, left)):
        for c in group:
            if used_slots >= slot_cap or used_tokens >= token_cap:
                break
            used_tokens += take(c, token_cap - used_tokens)
            used_slots += 1
    return plan
