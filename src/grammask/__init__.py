"""grammask: grammar-constrained LLM decoding.

- :mod:`grammask.grammar`: JSON Schema / EBNF / regex / JSON to compiled grammars and per-token
  bitmasks (Numba kernels);
- :mod:`grammask.pipeline`: the async chat engine (OpenAI-shaped API, see docs/engine.md);
- :mod:`grammask.adapters`: model backends and loading, HTTP server, transformers.

Layers: ``grammar`` imports neither ``pipeline`` nor ``adapters``; ``pipeline`` does not import
``adapters`` (``tests/test_layers.py``).
"""
from . import errors
from .grammar import (
    CanonicalTokenizer,
    CompiledGrammar,
    Grammar,
    GrammarCompiler,
    GrammarMatcher,
    TokenizerInfo,
    allocate_token_bitmask,
    apply_token_bitmask_inplace,
    bitmask_words,
    canonical_tokenizer,
    fill_next_token_bitmasks,
    preload_kernels,
    preload_kernels_in_background,
    reset_token_bitmask,
    unpack_bitmask,
)

__version__ = "0.1.0"

__all__ = [
    "CanonicalTokenizer", "CompiledGrammar", "Grammar", "GrammarCompiler", "GrammarMatcher", "TokenizerInfo",
    "allocate_token_bitmask", "apply_token_bitmask_inplace", "bitmask_words", "canonical_tokenizer", "errors",
    "fill_next_token_bitmasks", "preload_kernels", "preload_kernels_in_background", "reset_token_bitmask",
    "unpack_bitmask", "__version__",
]
