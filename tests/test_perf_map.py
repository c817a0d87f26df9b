"""benchmarks/perf_map.py: the perf map names the kernels loaded from Numba's cache."""
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))


def test_short_names_of_mangled_kernels():
    import perf_map

    assert perf_map._short("_ZN8grammask7grammar9nodestore5derivB2v3B52c8tJTIeFIjxB2IKSgI4CrvQClQZ6FcpCShpgEU0AExbxxN")\
        == "grammask.grammar.nodestore.deriv"
    assert perf_map._short("cfunc._ZN8grammask7grammar4mask9fill_maskB4v327B40c8") == "cfunc.grammask.grammar.mask.fill_mask"
    assert perf_map._short("NRT_decref") == "NRT_decref"


@pytest.mark.skipif(shutil.which("nm") is None, reason="needs binutils' nm")
def test_map_names_a_kernel_loaded_from_the_cache(tmp_path):
    """Run in a fresh interpreter (the hook must be in place before the kernels load): a kernel
    called there is in the map, at an address inside the process."""
    import subprocess

    from grammask.grammar.regexset import ExprSet

    ex = ExprSet()   # compiled here first if it is not yet: the child loads it from the cache
    ex.transitions(ex.literal("abc"))
    script = tmp_path / "s.py"
    script.write_text("from grammask.grammar.regexset import ExprSet\n"
                      "ex = ExprSet(); e = ex.literal('abc'); ex.transitions(e)\n")
    out = subprocess.run([sys.executable, str(Path(__file__).resolve().parents[1] / "benchmarks" / "perf_map.py"),
                          str(script)], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    path = out.stderr.strip().split(" in ")[-1]
    lines = Path(path).read_text().splitlines()
    Path(path).unlink()
    names = [ln.split(" ", 2)[2] for ln in lines]
    assert any(n == "grammask.grammar.nodestore.py_transitions" for n in names), names[:10]
    # callees the JIT does not export are placed from an exported function of their section:
    # the derivative py_transitions calls, and Numba's reference counts (weak symbols)
    assert "grammask.grammar.nodestore.deriv" in names, names[:10]
    assert "NRT_incref" in names and "NRT_decref" in names
    assert all(int(ln.split()[0], 16) > 0 and int(ln.split()[1], 16) > 0 for ln in lines)


def _raw_lines(data: bytes) -> list[str]:
    """``data`` as ``perf report -D`` dumps an event's raw bytes."""
    out = []
    for off in range(0, len(data), 16):
        chunk = " ".join(f"{x:02x}" for x in data[off:off + 16])
        out.append(f".  {off:04x}:  {chunk}  ................")
    return out


def test_callers_name_the_function_holding_each_samples_return_address():
    import perf_map

    rows = [(0x1000, 0x10, "NRT_incref"), (0x2000, 0x100, "caller_a"), (0x3000, 0x100, "caller_b")]

    def event(ip: int, ret: int) -> list[str]:
        data = bytearray(0xe0 + 8 + 64)
        data[0xe0:0xe8] = (64).to_bytes(8, "little")      # the user stack's size word
        data[0xe8:0xf0] = ret.to_bytes(8, "little")        # then the stack: the return address
        return (["0x43b0@/tmp/perf.data [0x138]: event: 9", ".", ". ... raw event: size 312 bytes"]
                + _raw_lines(bytes(data))
                + ["", f"985058816845 0x43b0 [0x138]: PERF_RECORD_SAMPLE(IP, 0x2): 1/1: {ip:#x} period: 1 addr: 0",
                   "... FP chain: nr:0", "... ustack: size 64, offset 0xe0", " ... thread: python:1"])

    dump = (event(0x1004, 0x2010) + event(0x1008, 0x2020) + event(0x100c, 0x3050)
            + event(0x2004, 0x3000)     # a sample elsewhere: not counted
            + event(0x1004, 0x9000))    # a return address outside every function
    got = perf_map.callers(dump, rows, "NRT_incref")
    assert got == {"caller_a": 2, "caller_b": 1, "?": 1}
