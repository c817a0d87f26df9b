"""Keep Numba's on-disk kernel cache consistent across the kernel modules.

Numba (``cache=True``) invalidates a cached kernel only when the file that defines it changes, but
a kernel that calls a kernel of another module embeds the callee's machine code: after an edit of
``earley.py`` the cached ``mask.py`` kernels would still run the old Earley code. At import we
fingerprint all kernel modules together and drop the cached kernels when the fingerprint changed.

The kernel modules are not listed by hand (a moved or renamed file would silently keep stale
kernels): :func:`kernel_modules` finds every module of the package that imports Numba. A package
whose sources cannot be read, or in which no kernel module is found, is an installation error and
raises :class:`ImportError`. Writing the cache is best effort: a read-only install keeps whatever
Numba decides.
"""
from __future__ import annotations

import hashlib
import logging
import os
import re
import threading
from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parent.parent   # src/grammask
STAMP_NAME = "grammask-kernels.stamp"
_USES_NUMBA = re.compile(rb"^\s*(?:from\s+numba[\s.]|import\s+numba\b)", re.MULTILINE)


def kernel_modules(root: Path = PACKAGE_ROOT) -> list[Path]:
    """Every module below ``root`` that imports Numba (sorted), derived from the sources."""
    try:
        files = sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)
        found = [p for p in files if _USES_NUMBA.search(p.read_bytes())]
    except OSError as e:
        raise ImportError(f"grammask: cannot read the kernel modules under {root}: {e}") from e
    if not found:
        raise ImportError(f"grammask: no Numba kernel module found under {root}; the package is incomplete")
    return found


def kernel_fingerprint(root: Path = PACKAGE_ROOT) -> str:
    """One hash over the path and text of every kernel module and of this file."""
    h = hashlib.sha256()
    for p in kernel_modules(root) + [Path(__file__).resolve()]:  # this file decides what is stale
        try:
            data = p.read_bytes()
        except OSError as e:
            raise ImportError(f"grammask: kernel module {p} is missing or unreadable: {e}") from e
        h.update((p.relative_to(root).as_posix() if p.is_relative_to(root) else p.name).encode())
        h.update(len(data).to_bytes(8, "little") + data)
    return h.hexdigest()


def _cache_files(root: Path, modules: list[Path], cache_dir: Path | None):
    """Numba's cache files (``<module stem>.<kernel>-<line>.pyXY.nbi/.nbc``) of the kernel modules."""
    stems = {p.stem for p in modules}
    dirs = [cache_dir] if cache_dir is not None else sorted({p.parent / "__pycache__" for p in modules})
    for d in dirs:
        if not d.is_dir():
            continue
        for f in (d.rglob("*") if cache_dir is not None else d.iterdir()):
            if f.suffix in (".nbi", ".nbc") and f.name.split(".", 1)[0] in stems:
                yield f


def invalidate_stale_kernel_cache(root: Path = PACKAGE_ROOT, cache_dir: Path | None = None) -> bool:
    """Remove the cached kernels of the package if any kernel module changed; True if it did."""
    modules = kernel_modules(root)
    stamp = kernel_fingerprint(root)
    if cache_dir is None and os.environ.get("NUMBA_CACHE_DIR"):
        cache_dir = Path(os.environ["NUMBA_CACHE_DIR"])
    stamp_file = (cache_dir or root / "grammar" / "__pycache__") / STAMP_NAME
    try:
        if stamp_file.read_text() == stamp:
            return False
    except OSError:
        pass
    try:
        removed = False
        for f in list(_cache_files(root, modules, cache_dir)):
            f.unlink(missing_ok=True)
            removed = True
        stamp_file.parent.mkdir(parents=True, exist_ok=True)
        stamp_file.write_text(stamp)
        return removed
    except OSError:
        return False


def preload_kernels(root: Path = PACKAGE_ROOT) -> int:
    """Load now every kernel that Numba's disk cache holds for the package (all the signatures
    compiled before, for this machine and this code), instead of at the first call that needs
    each. A kernel is otherwise loaded lazily, 5-30 ms per signature: the first mask of a process
    to meet a rare path (a counted intersection's rows, an emptiness walk) paid for ten of them,
    up to 0.2 s in one mask. A server calls this once at startup (``grammask serve`` does, in a
    background thread: :func:`preload_kernels_in_background`); so does the MaskBench worker before
    it times anything (xgrammar and llguidance are compiled ahead of time). Returns the
    number of signatures loaded (0 when the cache is empty: nothing is compiled here)."""
    import importlib

    from numba.core.registry import CPUDispatcher

    n = 0
    for p in kernel_modules(root):
        rel = p.relative_to(root).with_suffix("")
        mod = importlib.import_module(".".join((root.name,) + rel.parts))
        for obj in list(vars(mod).values()):
            if not isinstance(obj, CPUDispatcher) or obj.py_func.__module__ != mod.__name__:
                continue
            cache = getattr(obj, "_cache", None)
            if cache is None or not getattr(cache, "_enabled", False):
                continue
            try:   # Numba's cache internals: if they change, the lazy loads still work
                index = cache._cache_file._load_index()
                codegen = obj.targetctx.codegen()
                todo = [key[0] for key in list(index)
                        if key[0] not in obj.overloads and key == cache._index_key(key[0], codegen)]
            except Exception:   # noqa: BLE001 - an unreadable or foreign index
                continue
            for sig in todo:   # (a key of another machine or older code is left out above)
                obj.compile(sig)
                n += 1
    return n


_PRELOAD_LOCK = threading.Lock()
_PRELOAD: threading.Thread | None = None


def preload_kernels_in_background() -> threading.Thread:
    """:func:`preload_kernels` in a daemon thread, once per process (later calls return the same
    thread). Loading takes Numba's compiler lock per signature, so a request that needs a kernel
    meanwhile waits for at most one load, never for the whole preload."""
    global _PRELOAD
    with _PRELOAD_LOCK:
        if _PRELOAD is None:
            def run():
                try:
                    n = preload_kernels()
                    logging.getLogger("grammask").debug("preloaded %d cached kernel signatures", n)
                except Exception:   # noqa: BLE001 - an optimisation: the lazy loads still work
                    logging.getLogger("grammask").debug("kernel preload failed", exc_info=True)

            _PRELOAD = threading.Thread(target=run, name="grammask-kernel-preload", daemon=True)
            _PRELOAD.start()
        return _PRELOAD
