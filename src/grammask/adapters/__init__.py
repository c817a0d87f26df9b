"""Adapters: model backends (transformers, GGUF) and model loading (``models.create_engine``), HTTP
server, transformers LogitsProcessor. The only package that knows transformers, GGUF and HTTP (the
bitmask kernels, CUDA's included, are in :mod:`grammask.grammar.kernels`)."""
