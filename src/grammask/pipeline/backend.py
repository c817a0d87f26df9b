"""The model backend protocol: all the pipeline knows about a model.

Implementations live in :mod:`grammask.adapters` (Hugging Face transformers, GGUF files) and in
tests (a scripted, deterministic backend). Methods are synchronous and may block for a forward
pass; the pipeline calls them from worker threads (``anyio.to_thread``), one call at a time per
backend unless ``supports_concurrent_calls`` is True.
"""
from __future__ import annotations

from typing import Any, Protocol, Sequence, runtime_checkable


@runtime_checkable
class ModelBackend(Protocol):
    #: model id reported in responses
    name: str
    #: "cpu", "cuda", "cuda:0", ...
    device: str
    #: width of the logits (may exceed the tokenizer's vocabulary: padded ids are masked out)
    vocab_size: int
    #: :class:`grammask.grammar.tokenizer_info.TokenizerInfo` of the model's tokenizer
    tokenizer_info: Any
    #: ids that end a generation (end of turn / end of text)
    eos_token_ids: Sequence[int]
    #: maximum sequence length (prompt + completion)
    max_context: int
    # Optional: ``max_sequences`` (int), the most sequences the backend can hold at once (e.g.
    # llama.cpp's ``n_seq_max`` slots); the engine admits no more (``max_running`` defaults to it).
    # Without it, the engine's ``max_running`` is the only bound.
    # Optional: ``saturates_cpu`` (bool), the forward keeps every CPU core busy (llama.cpp with a thread
    # per core): the engine then computes a step's masks just before the forward instead of beside it.

    def apply_chat_template(self, messages: list[dict], *, tools: list[dict] | None = None,
                            add_generation_prompt: bool = True) -> list[int]:
        """Token ids of the chat prompt."""

    def encode(self, text: str) -> list[int]:
        """Token ids of plain text, no special tokens added."""

    def new_sequence(self) -> Any:
        """A fresh per-request state (KV cache and position)."""

    def forward(self, seqs: Sequence[Any], tokens: Sequence[Sequence[int]]):
        """Append ``tokens[i]`` (one or more ids: prompt, a sampled token, or fast-forward tokens)
        to sequence ``seqs[i]``, update its cache, and return the logits of the last position of
        every sequence: a float tensor ``[len(seqs), vocab_size]`` on :attr:`device`."""

    def release(self, seq: Any) -> None:
        """Free a sequence's cache."""
