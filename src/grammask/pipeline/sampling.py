"""Logits processing and sampling for one sequence, on the logits' device (CPU or CUDA torch).

Order (after the grammar mask has set forbidden tokens to ``-inf``):

1. ``logit_bias`` (added; a bias never un-masks a forbidden token: ``-inf + b = -inf``);
2. penalties over the tokens generated so far: ``repetition_penalty`` (CTRL/HF: positive logits
   divided, negative multiplied), ``frequency_penalty`` (times the count) and
   ``presence_penalty`` (once per distinct token), as OpenAI defines them;
3. log-probabilities (``logprobs``) are taken here: the distribution the constraint and the
   request's biases define, before temperature;
4. ``temperature`` (0: greedy argmax, ties to the lowest id), ``top_k``, ``top_p``;
5. a draw with the request's own seeded ``torch.Generator`` (CPU), so results are reproducible
   and independent of other requests and of the device: the uniform number is drawn on the CPU
   and the inverse CDF is evaluated on the logits' device.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

import torch

from ..errors import GenerationError


@dataclass
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    logit_bias: dict[int, float] | None = None
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logprobs: bool = False
    top_logprobs: int = 0
    seed: int | None = None

    @classmethod
    def from_request(cls, req) -> "SamplingParams":
        return cls(temperature=req.temperature, top_p=req.top_p, top_k=max(0, req.top_k),
                   logit_bias=dict(req.logit_bias) if req.logit_bias else None,
                   frequency_penalty=req.frequency_penalty, presence_penalty=req.presence_penalty,
                   repetition_penalty=req.repetition_penalty, logprobs=req.logprobs,
                   top_logprobs=req.top_logprobs or 0, seed=req.seed)

    @property
    def has_penalties(self) -> bool:
        return self.frequency_penalty != 0.0 or self.presence_penalty != 0.0 or self.repetition_penalty != 1.0


@dataclass
class SampleResult:
    token: int
    logprob: float | None = None
    top: list[tuple[int, float]] = field(default_factory=list)


class Sampler:
    """Per-sequence sampling state: the generator and the counts of generated tokens."""

    def __init__(self, params: SamplingParams, vocab_size: int, seed: int | None = None):
        self.params = params
        self.vocab_size = vocab_size
        self.generator = torch.Generator(device="cpu")
        self.generator.manual_seed(seed if seed is not None else random.getrandbits(63))
        self.counts: dict[int, int] = {}
        self._bias_cache: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}
        if params.logit_bias:
            bad = [t for t in params.logit_bias if not 0 <= t < vocab_size]
            if bad:
                from ..errors import InvalidRequestError

                raise InvalidRequestError(f"logit_bias token id {bad[0]} is out of range (vocabulary "
                                          f"size {vocab_size})", param="logit_bias")

    def observe(self, token: int) -> None:
        """Count a generated token (sampled or forced) for the penalties."""
        self.counts[token] = self.counts.get(token, 0) + 1

    # ------------------------------------------------------------------ processing
    def process(self, logits: torch.Tensor) -> torch.Tensor:
        """Bias and penalties, in place on a float32 1-D row; returns it."""
        p = self.params
        dev = logits.device
        if p.logit_bias:
            ids, vals = self._bias_cache.get(dev, (None, None))
            if ids is None:
                ids = torch.tensor(list(p.logit_bias.keys()), dtype=torch.long, device=dev)
                vals = torch.tensor(list(p.logit_bias.values()), dtype=logits.dtype, device=dev)
                self._bias_cache[dev] = (ids, vals)
            logits.index_add_(0, ids, vals)
        if p.has_penalties and self.counts:
            ids = torch.tensor(list(self.counts.keys()), dtype=torch.long, device=dev)
            sel = logits.index_select(0, ids)
            if p.repetition_penalty != 1.0:
                rp = p.repetition_penalty
                sel = torch.where(sel > 0, sel / rp, sel * rp)
            if p.frequency_penalty != 0.0 or p.presence_penalty != 0.0:
                cnt = torch.tensor(list(self.counts.values()), dtype=logits.dtype, device=dev)
                sel = sel - p.frequency_penalty * cnt - p.presence_penalty
            logits.index_copy_(0, ids, sel)
        return logits

    def sample(self, logits: torch.Tensor) -> SampleResult:
        """Process ``logits`` (a 1-D row; modified in place) and draw the next token."""
        p = self.params
        logits = self.process(logits)
        best = torch.max(logits)
        if not torch.isfinite(best) or best.item() == -math.inf:
            raise GenerationError("no token is allowed at this step (every logit is -inf)")
        res = SampleResult(token=-1)
        logp = None
        if p.logprobs:
            logp = torch.log_softmax(logits, dim=-1)
        if p.temperature == 0.0:
            tok = int(torch.argmax(logits).item())
        else:
            tok = self._draw(logits)
        res.token = tok
        if logp is not None:
            res.logprob = float(logp[tok].item())
            if p.top_logprobs:
                k = min(p.top_logprobs, logp.shape[0])
                v, i = torch.topk(logp, k)
                res.top = [(int(a), float(b)) for a, b in zip(i.tolist(), v.tolist()) if b > -math.inf]
        return res

    def _draw(self, logits: torch.Tensor) -> int:
        p = self.params
        x = logits / p.temperature
        u = torch.rand((), generator=self.generator).item()
        if p.top_k <= 0 and p.top_p >= 1.0:
            probs = torch.softmax(x, dim=-1)
            cdf = torch.cumsum(probs, dim=-1)
            idx = int(torch.searchsorted(cdf, torch.tensor([u * float(cdf[-1])], device=cdf.device, dtype=cdf.dtype), right=True).item())
            idx = min(idx, x.shape[0] - 1)
            # never land on a zero-probability token through rounding
            if probs[idx] <= 0:
                idx = int(torch.argmax(probs).item())
            return idx
        vals, order = torch.sort(x, descending=True)
        if p.top_k > 0:
            vals, order = vals[: p.top_k], order[: p.top_k]
        probs = torch.softmax(vals, dim=-1)
        if p.top_p < 1.0:
            cum = torch.cumsum(probs, dim=-1)
            keep = (cum - probs) < p.top_p  # the smallest prefix whose mass reaches top_p
            keep[0] = True
            probs = probs * keep
        cdf = torch.cumsum(probs, dim=-1)
        j = int(torch.searchsorted(cdf, torch.tensor([u * float(cdf[-1])], device=cdf.device, dtype=cdf.dtype), right=True).item())
        j = min(j, probs.shape[0] - 1)
        if probs[j] <= 0:
            j = 0
        return int(order[j].item())
