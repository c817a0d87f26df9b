"""Name the Numba kernels in a Linux ``perf`` profile: run a script with a perf map of the JIT code.

``perf`` sees compiled Numba code as anonymous memory. This runner records the object code of every
kernel library as Numba loads it from its on-disk cache (or compiles it), and when the script ends
writes ``/tmp/perf-<pid>.map`` (start, size and name of every function the JIT exports: the
kernels and their Python and C wrappers), which ``perf report`` reads by itself::

    perf record -F 500 -o /tmp/perf.data .venv/bin/python benchmarks/perf_map.py SCRIPT [ARGS...]
    perf report -i /tmp/perf.data --no-children --sort dso,symbol

Notes:

- Callees the JIT does not export have no name: their samples show as addresses after the last
  named symbol of their library. A callee that several kernels link (``deriv``, ``mk3``...) runs
  from the copy that was loaded first, whichever library that is, so the region a sample lies in
  does not say which kernel called it.
- ``NRT_incref``/``NRT_decref`` (Numba's atomic reference counts) show up as two hot unnamed
  instructions (``lock incq``/``lock decq``). To find their callers, record the top of the stack
  (``--call-graph dwarf,64``): the first word of each sample's user stack is the return address
  into the caller (``perf report -D`` prints it). This is how session 17 found that they were 7%
  of a MaskBench pass (docs/lexer.md, "The compiled store").
- The map is written at exit: the script must end normally (not by ``os._exit``).
"""
from __future__ import annotations

import atexit
import gc
import os
import re
import runpy
import subprocess
import sys
import tempfile

#: the object code of every library loaded from Numba's cache (id of the library -> bytes)
_OBJECTS: dict[int, bytes] = {}


def _install() -> None:
    from numba.core import codegen

    unserialize = codegen.JITCodeLibrary._unserialize.__func__

    def keep_object(cls, cg, state):
        lib = unserialize(cls, cg, state)
        if state[1] == "object":
            _OBJECTS[id(lib)] = state[2][0]
        return lib

    codegen.JITCodeLibrary._unserialize = classmethod(keep_object)


def _short(name: str) -> str:
    """``grammask.grammar.nodestore.deriv`` for a mangled Numba name (else the name as it is)."""
    m = re.match(r"(cfunc\.|cpython\.)?_ZN(.*?)B\d", name)
    if not m:
        return name
    parts, s = [], m.group(2)
    while s and s[0].isdigit():
        k = int(re.match(r"\d+", s).group())
        s = s[len(str(k)):]
        parts.append(s[:k])
        s = s[k:]
    return (m.group(1) or "") + ".".join(parts)


def _symbols(lib, obj: bytes) -> dict[int, tuple[int, str]]:
    """address -> (size, name) of the functions of one library's object code."""
    with tempfile.NamedTemporaryFile(suffix=".o") as f:
        f.write(obj)
        f.flush()
        out = subprocess.run(["nm", "-S", "--defined-only", f.name], capture_output=True, text=True).stdout
    syms = {}
    for line in out.splitlines():
        p = line.split()
        if len(p) != 4 or p[2] not in "Tt":
            continue
        try:
            addr = lib.get_pointer_to_function(p[3])
        except Exception:   # a local symbol the JIT does not export
            continue
        if addr:
            syms[addr] = (int(p[1], 16), _short(p[3]))
    return syms


def write_map() -> str:
    """Write ``/tmp/perf-<pid>.map`` for the kernels loaded so far; returns its path."""
    from numba.core.registry import CPUDispatcher

    gc.unfreeze()   # a frozen heap (gc_heap.freeze_gc_heap) hides its objects from get_objects
    syms: dict[int, tuple[int, str]] = {}
    seen = set()
    for d in gc.get_objects():
        if not isinstance(d, CPUDispatcher):
            continue
        for cres in d.overloads.values():
            lib = cres.library
            if id(lib) in seen:
                continue
            seen.add(id(lib))
            obj = _OBJECTS.get(id(lib))
            if obj is None:
                try:
                    obj = lib._get_compiled_object()
                except Exception:   # compiled in this process and its object consumed
                    continue
            syms.update(_symbols(lib, obj))
    path = f"/tmp/perf-{os.getpid()}.map"
    with open(path, "w") as f:
        for addr in sorted(syms):
            size, name = syms[addr]
            f.write(f"{addr:x} {size:x} {name}\n")
    print(f"perf map: {len(syms)} symbols in {path}", file=sys.stderr)
    return path


def main(argv: list[str]) -> None:
    if not argv:
        raise SystemExit(__doc__)
    _install()
    atexit.register(write_map)
    sys.argv = argv
    runpy.run_path(argv[0], run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
