"""Keep Numba's on-disk kernel cache consistent across the kernel modules.

Numba (``cache=True``) invalidates a cached kernel only when the file that defines it changes, but
a kernel that calls a kernel of another module embeds the callee's machine code: after an edit of
``earley.py`` the cached ``mask.py`` kernels would still run the old Earley code. At import we
fingerprint all kernel modules together and drop the cached kernels when the fingerprint changed.
Best effort: a read-only install just keeps whatever Numba decides.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

KERNEL_MODULES = ("earley.py", "lexer.py", "mask.py", "slicer.py", "jit_cache.py")


def invalidate_stale_kernel_cache() -> bool:
    """Remove cached kernels of this package if any kernel module changed; True if it did."""
    here = Path(__file__).resolve().parent
    h = hashlib.sha256()
    for name in KERNEL_MODULES:
        try:
            h.update(name.encode() + (here / name).read_bytes())
        except OSError:
            return False
    stamp = h.hexdigest()
    cache_dir = Path(os.environ.get("NUMBA_CACHE_DIR") or here / "__pycache__")
    stamp_file = cache_dir / "grammask-kernels.stamp"
    try:
        if stamp_file.read_text() == stamp:
            return False
    except OSError:
        pass
    try:
        removed = False
        if cache_dir.is_dir():
            for p in cache_dir.rglob("*"):
                if p.suffix in (".nbi", ".nbc") and any(p.name.startswith(m[:-3] + ".") for m in KERNEL_MODULES):
                    p.unlink(missing_ok=True)
                    removed = True
        cache_dir.mkdir(parents=True, exist_ok=True)
        stamp_file.write_text(stamp)
        return removed
    except OSError:
        return False
