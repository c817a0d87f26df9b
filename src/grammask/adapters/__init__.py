"""Adapters: model backends (transformers, GGUF), CUDA bitmask application, HTTP server,
transformers LogitsProcessor. The only package that knows transformers, GGUF, CUDA and HTTP."""
