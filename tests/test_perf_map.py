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
    assert all(int(ln.split()[0], 16) > 0 and int(ln.split()[1], 16) > 0 for ln in lines)
