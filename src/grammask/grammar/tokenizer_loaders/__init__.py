"""Tokenizer loaders: each turns one kind of tokenizer into the keyword arguments of
:class:`~grammask.grammar.tokenizer_info.TokenizerInfo` (whose ``from_*`` constructors call them).

``huggingface``   ``tokenizers``/``transformers`` tokenizers (fast and slow) and ``tokenizer.json``
``tiktoken_bpe``  tiktoken BPE files and ``tiktoken.Encoding`` objects
``gguf``          the tokenizer metadata of a GGUF model file
``gguf_reader``   GGUF's binary header reader (metadata only, no tensors)
``fields``        :func:`~.fields.info_fields`, the keyword arguments every loader returns (stop ids resolved)

The vocabulary-string decoding they share with ``TokenizerInfo`` lives in :mod:`grammask.grammar.vocab`;
loaders never import ``tokenizer_info``, so there is no import cycle.
"""
from .gguf import load_gguf
from .gguf_reader import read_gguf_metadata
from .huggingface import backend_of, load_huggingface
from .tiktoken_bpe import is_tiktoken_encoding, load_tiktoken

__all__ = ["backend_of", "is_tiktoken_encoding", "load_gguf", "load_huggingface", "load_tiktoken", "read_gguf_metadata"]
