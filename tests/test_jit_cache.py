"""The Numba kernel-cache guard: the kernel modules are derived from the sources, a change of any
of them drops every cached kernel, and a missing module fails loudly."""
from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path

import pytest

import grammask
from grammask.grammar import jit_cache


def test_every_numba_kernel_lives_in_a_fingerprinted_module():
    """Oracle independent of the source scan: the files that define the Numba dispatchers."""
    from numba.core.registry import CPUDispatcher

    defining = set()
    for m in pkgutil.walk_packages(grammask.__path__, "grammask."):
        try:
            mod = importlib.import_module(m.name)
        except ImportError:  # optional dependencies (server, transformers...) may be absent
            continue
        for v in vars(mod).values():
            if isinstance(v, CPUDispatcher):
                defining.add(Path(v.py_func.__code__.co_filename).resolve())
    assert defining, "no Numba kernel found at all"
    assert defining <= set(jit_cache.kernel_modules())


def _tree(tmp_path: Path) -> Path:
    root = tmp_path / "pkg"
    (root / "grammar" / "__pycache__").mkdir(parents=True)
    (root / "grammar" / "k.py").write_text("from numba import njit\n")
    (root / "grammar" / "plain.py").write_text("import numpy\n")
    return root


def _cached(d: Path, stem: str) -> list[Path]:
    d.mkdir(parents=True, exist_ok=True)
    files = [d / f"{stem}.kern-3.py311.nbi", d / f"{stem}.kern-3.py311.1.nbc"]
    for f in files:
        f.write_bytes(b"x")
    return files


def test_change_of_any_kernel_module_drops_the_cache(tmp_path):
    root = _tree(tmp_path)
    pyc = root / "grammar" / "__pycache__"
    assert [p.name for p in jit_cache.kernel_modules(root)] == ["k.py"]
    stale = _cached(pyc, "k")
    other = _cached(pyc, "plain")          # not a kernel module: left alone
    assert jit_cache.invalidate_stale_kernel_cache(root) is True
    assert not any(f.exists() for f in stale) and all(f.exists() for f in other)
    fresh = _cached(pyc, "k")
    assert jit_cache.invalidate_stale_kernel_cache(root) is False      # nothing changed
    assert all(f.exists() for f in fresh)
    (root / "grammar" / "k.py").write_text("from numba import njit\n# edited\n")
    assert jit_cache.invalidate_stale_kernel_cache(root) is True
    assert not any(f.exists() for f in fresh)


def test_a_moved_kernel_module_is_found_where_it_went(tmp_path):
    root = _tree(tmp_path)
    jit_cache.invalidate_stale_kernel_cache(root)
    (root / "grammar" / "kernels").mkdir()
    (root / "grammar" / "k.py").rename(root / "grammar" / "kernels" / "k2.py")
    assert [p.relative_to(root).as_posix() for p in jit_cache.kernel_modules(root)] == ["grammar/kernels/k2.py"]
    stale = _cached(root / "grammar" / "kernels" / "__pycache__", "k2")
    assert jit_cache.invalidate_stale_kernel_cache(root) is True
    assert not any(f.exists() for f in stale)


def test_numba_cache_dir_is_honoured(tmp_path):
    root = _tree(tmp_path)
    cache = tmp_path / "numba-cache"
    stale = _cached(cache / "some" / "mirrored" / "path", "k")
    assert jit_cache.invalidate_stale_kernel_cache(root, cache_dir=cache) is True
    assert not any(f.exists() for f in stale)
    assert (cache / jit_cache.STAMP_NAME).exists()


def test_missing_kernel_module_fails_loudly(tmp_path):
    root = _tree(tmp_path)
    (root / "grammar" / "gone.py").symlink_to(tmp_path / "nowhere.py")   # listed by the tree, unreadable
    with pytest.raises(ImportError, match="cannot read"):
        jit_cache.kernel_modules(root)
    empty = tmp_path / "empty"
    (empty / "grammar").mkdir(parents=True)
    (empty / "grammar" / "plain.py").write_text("x = 1\n")
    with pytest.raises(ImportError, match="no Numba kernel module"):
        jit_cache.invalidate_stale_kernel_cache(empty)


def test_preload_loads_the_cached_kernels_before_any_call():
    """In a fresh process, a kernel the cache holds (``py_deriv``, compiled here first) is not
    loaded until called, unless :func:`preload_kernels` ran: then it is, with every other cached
    signature, and a second preload has nothing left to do."""
    import subprocess
    import sys

    from grammask.grammar.regex import parse_regex
    from grammask.grammar.regexset import ExprSet

    ex = ExprSet()
    ex.deriv(parse_regex("ab|c", ex), ord("a"))   # py_deriv compiled, so cached on disk
    code = ("from grammask.grammar import nodestore\n"
            "from grammask import preload_kernels\n"
            "before = len(nodestore.py_deriv.signatures)\n"
            "n = preload_kernels()\n"
            "print(before, n, len(nodestore.py_deriv.signatures), preload_kernels())\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    before, n, after, again = map(int, out.stdout.split())
    assert before == 0 and after >= 1 and n >= after and again == 0
