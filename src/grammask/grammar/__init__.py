"""The grammar engine: compile grammars, fill token bitmasks, accept tokens.

Modules, one per concept: ``regexset`` (regex derivatives), ``regex`` (ECMA regex syntax),
``lexer`` (lazy lexer DFA), ``cfg`` (grammar IR and lowering to lexemes), ``earley`` (parser
rows), ``mask`` (trie-walk kernel), ``slicer`` (precomputed masks), ``ebnf`` (GBNF front end),
``builtin`` (JSON grammars), ``json_schema`` (JSON Schema front end), ``structural_tag`` (free
text and tagged JSON), ``tokenizer_info`` and ``toktrie`` (vocabulary), ``compiler``/``compiled``/
``matcher`` (public objects), ``canonical``/``canonical_bpe``/``canonical_spec`` (canonical-tokenization
decoding), ``cache`` (the compiler's LRU of compiled grammars), ``bitmask`` (its
application kernels in ``kernels``: one module per backend), ``utf8``.
"""
from .jit_cache import invalidate_stale_kernel_cache, preload_kernels, preload_kernels_in_background

invalidate_stale_kernel_cache()

from .bitmask import (  # noqa: E402
    allocate_token_bitmask,
    apply_token_bitmask_inplace,
    bitmask_words,
    fill_next_token_bitmasks,
    reset_token_bitmask,
    unpack_bitmask,
)
from .canonical import CanonicalTokenizer, canonical_tokenizer  # noqa: E402
from .cfg import Grammar  # noqa: E402
from .compiled import CompiledGrammar  # noqa: E402
from .compiler import GrammarCompiler  # noqa: E402
from .matcher import GrammarMatcher  # noqa: E402
from .tokenizer_info import TokenizerInfo  # noqa: E402

__all__ = [
    "CanonicalTokenizer", "CompiledGrammar", "Grammar", "GrammarCompiler", "GrammarMatcher", "TokenizerInfo",
    "allocate_token_bitmask", "canonical_tokenizer", "apply_token_bitmask_inplace", "bitmask_words",
    "fill_next_token_bitmasks", "reset_token_bitmask", "unpack_bitmask",
]
