"""Name the Numba kernels in a Linux ``perf`` profile: run a script with a perf map of the JIT code.

``perf`` sees compiled Numba code as anonymous memory. This runner records the object code of every
kernel library as Numba loads it from its on-disk cache (or compiles it), and when the script ends
writes ``/tmp/perf-<pid>.map`` (start, size and name of every function the JIT exports: the
kernels and their Python and C wrappers), which ``perf report`` reads by itself::

    perf record -F 500 -o /tmp/perf.data .venv/bin/python benchmarks/perf_map.py SCRIPT [ARGS...]
    perf report -i /tmp/perf.data --no-children --sort dso,symbol
    perf record -F 300 --call-graph dwarf,64 -o /tmp/perf.data .venv/bin/python benchmarks/perf_map.py SCRIPT
    .venv/bin/python benchmarks/perf_map.py --callers /tmp/perf.data /tmp/perf-PID.map NRT_incref

Notes:

- Callees the JIT does not export (``deriv``, ``mk3``, Numba's ``NRT_incref``/``NRT_decref``...)
  are named too: their offsets in the object file are placed from an exported function of the
  same section (the loader copies a section whole). A callee that several kernels link runs from
  the copy that was loaded first, whichever library that is, so its name does not say which
  kernel called it.
- ``NRT_incref``/``NRT_decref`` are Numba's atomic reference counts. To find their callers,
  record the top of the stack (``--call-graph dwarf,64``): the first word of each sample's user
  stack is the return address into the caller (``perf report -D`` dumps each sample's raw bytes
  and the offset of its user stack; ``--callers`` reads them). This is how session 17 found that they
  were 7% of a MaskBench pass (docs/lexer.md, "The compiled store"), and session 18 that they
  were still 15% of all samples (44% of the time in compiled code), called mostly from small
  per-item kernels: each array or record argument of a call that LLVM does not inline is counted
  on entry and released on exit (``intern_members``: 8 arguments, then 4 record fields).
- The map is written at exit: the script must end normally (not by ``os._exit``).
"""
from __future__ import annotations

import atexit
import bisect
import gc
import os
import re
import runpy
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

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
    """address -> (size, name) of the functions of one library's object code. The JIT exports
    some of them; the others (local callees such as ``deriv``) are placed from an exported one of
    the same section, since the loader copies a section whole."""
    with tempfile.NamedTemporaryFile(suffix=".o") as f:
        f.write(obj)
        f.flush()
        out = subprocess.run(["nm", "-S", "--defined-only", f.name], capture_output=True, text=True).stdout
        sec = subprocess.run(["objdump", "-t", f.name], capture_output=True, text=True).stdout
    section = {}
    for line in sec.splitlines():   # objdump -t: value, flags, section, size, name
        p = line.split()
        if len(p) >= 5 and p[-3].startswith("."):
            section[p[-1]] = p[-3]
    syms, local, base = {}, [], {}
    for line in out.splitlines():
        p = line.split()
        if len(p) != 4 or p[2] not in "TtW":
            continue
        try:
            addr = lib.get_pointer_to_function(p[3])
        except Exception:   # a local symbol the JIT does not export
            addr = 0
        if addr:
            syms[addr] = (int(p[1], 16), _short(p[3]))
            base.setdefault(section.get(p[3]), addr - int(p[0], 16))
        else:
            local.append(p)
    for p in local:
        b = base.get(section.get(p[3]))
        if b is not None:
            syms.setdefault(b + int(p[0], 16), (int(p[1], 16), _short(p[3])))
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


def read_map(path: str) -> list[tuple[int, int, str]]:
    """The ``(start, size, name)`` rows of a perf map, by start."""
    rows = []
    for line in Path(path).read_text().splitlines():
        a, n, name = line.split(" ", 2)
        rows.append((int(a, 16), int(n, 16), name))
    return sorted(rows)


def callers(dump_lines, rows: list[tuple[int, int, str]], symbol: str) -> Counter:
    """Who calls ``symbol`` (a leaf such as ``NRT_incref``), by the samples inside it: the first
    word of a sample's user stack is its return address, named by the map's function that holds
    it (``?`` outside every function). ``dump_lines``: the text of ``perf report -D`` over a
    recording made with ``--call-graph dwarf,64``, where each event's raw bytes come first, then
    its sample line (the instruction pointer), then the offset of its user stack."""
    spans = [(a, a + n) for a, n, name in rows if name == symbol]
    starts = [a for a, _, _ in rows]
    raw: dict[int, int] = {}   # offset -> byte, of the event being dumped
    ip, event = None, {}
    out: Counter = Counter()
    for line in dump_lines:
        m = _RAW.match(line)
        if m:
            off = int(m.group(1), 16)
            for j, x in enumerate(m.group(2).split()):
                raw[off + j] = int(x, 16)
            continue
        m = _SAMPLE.search(line)
        if m:
            ip, event, raw = int(m.group(1), 16), raw, {}
            continue
        m = _USTACK.search(line)
        if m and ip is not None:
            if any(a <= ip < b for a, b in spans):
                at = int(m.group(1), 16) + 8   # past the stack's size word
                ret = int.from_bytes(bytes(event.get(at + j, 0) for j in range(8)), "little")
                k = bisect.bisect_right(starts, ret) - 1
                inside = k >= 0 and rows[k][0] <= ret < rows[k][0] + rows[k][1]
                out[rows[k][2] if inside else "?"] += 1
            ip = None
        elif "event:" in line:   # a new event: its raw bytes follow
            raw = {}
    return out


_RAW = re.compile(r"^\.  ([0-9a-f]{4}):  ((?:[0-9a-f]{2} ?)+)")
_USTACK = re.compile(r"ustack: size \d+, offset (0x[0-9a-f]+)")
_SAMPLE = re.compile(r"PERF_RECORD_SAMPLE\([^)]*\): \d+/\d+: (0x[0-9a-f]+)")


def main(argv: list[str]) -> None:
    if not argv:
        raise SystemExit(__doc__)
    if argv[0] == "--callers":   # --callers PERF_DATA MAP SYMBOL
        data, map_path, symbol = argv[1:4]
        dump = subprocess.run(["perf", "report", "-D", "-i", data], capture_output=True, text=True).stdout
        got = callers(dump.splitlines(), read_map(map_path), symbol)
        total = sum(got.values())
        for name, n in got.most_common(30):
            print(f"{n:7d} {100 * n / max(total, 1):5.1f}%  {name}")
        print(f"{total} samples in {symbol}")
        return
    _install()
    atexit.register(write_map)
    sys.argv = argv
    runpy.run_path(argv[0], run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
