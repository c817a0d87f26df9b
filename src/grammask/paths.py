"""Where grammask keeps files between runs: :func:`cache_root`.

Shared by every layer (the model backends' converted checkpoints in :mod:`grammask.adapters`, the
tokenizer artefacts of :mod:`grammask.grammar.tokenizer_cache`); imports nothing of grammask.
"""
from __future__ import annotations

import os
from pathlib import Path


def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """grammask's user cache folder: ``cache_dir`` if given, else ``$GRAMMASK_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/grammask``, else ``~/.cache/grammask``. Not created here."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    env = os.environ.get("GRAMMASK_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg:
        return Path(xdg).expanduser() / "grammask"
    return Path.home() / ".cache" / "grammask"


__all__ = ["cache_root"]
