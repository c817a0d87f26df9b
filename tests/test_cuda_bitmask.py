"""Bitmask application on torch tensors (grammask.grammar.kernels) against the CPU reference
(grammask.grammar.bitmask, numpy). The torch path runs everywhere; the Triton kernel runs
through Triton's interpreter on the CPU (a subprocess: TRITON_INTERPRET must be set before the
import), and natively on CUDA when a GPU is there."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from grammask.grammar.kernels.apply import (  # noqa: E402
    apply_token_bitmask_inplace_tensor as apply_token_bitmask_inplace_cuda,
)
from grammask.grammar.kernels.torch_ops import apply_token_bitmask_inplace_torch  # noqa: E402
from grammask.grammar.kernels.triton_kernel import triton_available  # noqa: E402
from grammask.errors import MatcherError  # noqa: E402
from grammask.grammar.bitmask import apply_token_bitmask_inplace  # noqa: E402

HAVE_CUDA = torch.cuda.is_available()
HAVE_TRITON = importlib.util.find_spec("triton") is not None

#: (batch, logits width, bitmask words, vocab_size, indices)
CASES = [
    (1, 100, 4, None, None),
    (3, 1000, 32, None, None),
    (4, 5000, 150, 4700, [0, 2]),          # padded vocabulary, some rows
    (2, 100, 2, 90, None),                 # bitmask narrower than the vocabulary
    (2, 33, 2, None, [1]),
    (5, 49152, 1536, None, None),          # SmolLM2-sized
    (2, 128256, 4008, 128000, [1, 0]),     # Llama-3-sized, padded
]


def make(B, V, W, seed=0, dtype=np.float32):
    rng = np.random.default_rng(seed)
    bm = rng.integers(-2 ** 31, 2 ** 31, size=(B, W), dtype=np.int64).astype(np.int32)
    bm[0, : W // 4] = 0  # some fully blocked words
    if B > 1:
        bm[1, W // 2:] = -1  # some fully open ones
    lg = rng.standard_normal((B, V)).astype(dtype)
    return lg, bm


def reference(lg, bm, vs, idx):
    ref = lg.astype(np.float32).copy()
    apply_token_bitmask_inplace(ref, bm, vocab_size=vs, indices=idx)
    return ref


@pytest.mark.parametrize("B, V, W, vs, idx", CASES)
def test_torch_path_matches_cpu_reference(B, V, W, vs, idx):
    lg, bm = make(B, V, W)
    ref = reference(lg, bm, vs, idx)
    t = torch.from_numpy(lg.copy())
    apply_token_bitmask_inplace_torch(t, torch.from_numpy(bm), vocab_size=vs, indices=idx)
    np.testing.assert_array_equal(t.numpy(), ref)
    t = torch.from_numpy(lg.copy())  # numpy bitmask, auto backend (CPU: torch ops)
    apply_token_bitmask_inplace_cuda(t, bm, vocab_size=vs, indices=idx)
    np.testing.assert_array_equal(t.numpy(), ref)


def test_torch_path_1d_and_half_precision():
    lg, bm = make(1, 300, 10)
    ref = reference(lg, bm, None, None)
    t = torch.from_numpy(lg[0].copy())
    apply_token_bitmask_inplace_torch(t, torch.from_numpy(bm[0]))
    np.testing.assert_array_equal(t.numpy(), ref[0])
    for dtype in (torch.float16, torch.bfloat16):
        t = torch.from_numpy(lg.copy()).to(dtype)
        apply_token_bitmask_inplace_torch(t, bm)
        np.testing.assert_array_equal(torch.isinf(t).numpy(), np.isinf(ref))


def test_errors():
    t = torch.zeros(2, 64)
    with pytest.raises(MatcherError):
        apply_token_bitmask_inplace_cuda(t, np.zeros((2, 2), np.int64))
    with pytest.raises(ValueError):
        apply_token_bitmask_inplace_cuda(t, np.zeros((2, 2), np.int32), backend="opencl")
    with pytest.raises(MatcherError):
        apply_token_bitmask_inplace_cuda(t, np.zeros((3, 2), np.int32), backend="torch")


@pytest.mark.parametrize("backend", ["cpu", "torch", "auto"])
def test_row_count_rule_on_every_cpu_path(backend):
    """Fewer bitmask rows than logits rows: the first rows are masked, the others left alone. More:
    MatcherError. The same on the Numba path ("cpu"), the torch-ops path, and numpy arrays."""
    lg, bm = make(3, 100, 4)
    ref = lg.copy()
    apply_token_bitmask_inplace(ref[:2], bm[:2])
    t = torch.from_numpy(lg.copy())
    apply_token_bitmask_inplace_cuda(t, bm[:2], backend=backend)
    np.testing.assert_array_equal(t.numpy(), ref)
    np.testing.assert_array_equal(t.numpy()[2], lg[2])
    with pytest.raises(MatcherError):
        apply_token_bitmask_inplace_cuda(torch.from_numpy(lg[:2].copy()), bm, backend=backend)
    for logits in (lg[:2].copy(), torch.from_numpy(lg[:2].copy()), torch.from_numpy(lg[:2].copy()).half()):
        with pytest.raises(MatcherError):
            apply_token_bitmask_inplace(logits, bm)
    with pytest.raises(MatcherError):  # the numpy fallback (a dtype the Numba kernel does not take)
        apply_token_bitmask_inplace(lg[:2].astype(np.float16), bm)


def test_cpu_backend_errors():
    lg, bm = make(2, 100, 4)
    with pytest.raises(MatcherError):  # half precision is not the Numba kernel's
        apply_token_bitmask_inplace_cuda(torch.from_numpy(lg).half(), bm, backend="cpu")
    with pytest.raises(MatcherError):  # the Numba kernel does not check its indices: the caller does
        apply_token_bitmask_inplace(lg.copy(), bm, indices=[2])
    with pytest.raises(TypeError):
        apply_token_bitmask_inplace_cuda(lg, bm)


def test_the_adapters_path_still_exports_the_public_names():
    from grammask.adapters import cuda_bitmask

    assert cuda_bitmask.apply_token_bitmask_inplace_cuda is apply_token_bitmask_inplace_cuda
    assert cuda_bitmask.apply_token_bitmask_inplace_torch is apply_token_bitmask_inplace_torch
    assert cuda_bitmask.triton_available is triton_available


@pytest.mark.skipif(not HAVE_TRITON, reason="triton is not installed")
def test_triton_kernel_in_the_interpreter_matches_cpu_reference():
    """The kernel's logic, run by Triton's CPU interpreter on CPU tensors."""
    code = textwrap.dedent("""
        import numpy as np, torch
        from grammask.grammar.kernels import triton_kernel as cb
        from grammask.grammar.bitmask import apply_token_bitmask_inplace
        rng = np.random.default_rng(1)
        cases = [(3, 1000, 32, None, None), (4, 5000, 150, 4700, [0, 2]), (1, 70, 3, None, None),
                 (2, 100, 2, 90, None), (2, 2100, 66, None, [1]), (3, 900, 29, 850, [2, 0])]
        for B, V, W, vs, idx in cases:
            bm = rng.integers(-2**31, 2**31, size=(B, W), dtype=np.int64).astype(np.int32)
            lg = rng.standard_normal((B, V)).astype(np.float32)
            ref = lg.copy()
            apply_token_bitmask_inplace(ref, bm, vocab_size=vs, indices=idx)
            for block in (256, 1024):
                t = torch.from_numpy(lg.copy())
                cb.apply_triton(t, torch.from_numpy(bm), vs, idx, block_size=block)
                assert np.array_equal(t.numpy(), ref), (B, V, W, vs, idx, block)
            t = torch.from_numpy(lg.copy()).to(torch.float16)
            cb.apply_triton(t, torch.from_numpy(bm), vs, idx, block_size=256)
            assert np.array_equal(torch.isinf(t).numpy(), np.isinf(ref)), ("fp16", B, V)
        print("ok")
    """)
    env = dict(os.environ, TRITON_INTERPRET="1")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    if r.returncode != 0 and INTERPRETER_NUMPY_BUG in r.stderr and "triton/runtime/interpreter.py" in r.stderr:
        # Triton 3.6's interpreter calls int() on a 1-element array, which numpy >= 2.5 refuses (seen
        # on the GPU machine's image: triton 3.6.0, numpy 2.5.2); the native kernel is tested below
        pytest.skip(f"Triton's CPU interpreter does not run under numpy {np.__version__}: {INTERPRETER_NUMPY_BUG}")
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout[-2000:] + r.stderr[-4000:]


INTERPRETER_NUMPY_BUG = "only 0-dimensional arrays can be converted to Python scalars"


def test_warm_up_does_nothing_where_the_triton_path_does_not_apply(monkeypatch):
    from grammask.grammar.kernels import triton_kernel as tk

    assert tk.warm_up("cpu", 1000) == 0
    monkeypatch.setenv("GRAMMASK_DISABLE_TRITON", "1")
    assert tk.warm_up("cuda" if HAVE_CUDA else "cpu", 1000) == 0


# ---------------------------------------------------------------------------------------------- CUDA
cuda = pytest.mark.skipif(not HAVE_CUDA, reason="CUDA is not available")


@cuda
@pytest.mark.parametrize("B, V, W, vs, idx", CASES)
@pytest.mark.parametrize("backend", ["torch", "triton", "auto"])
def test_cuda_matches_cpu_reference(B, V, W, vs, idx, backend):
    if backend == "triton" and not triton_available():
        pytest.skip("triton is not available")
    lg, bm = make(B, V, W, seed=B + V)
    ref = reference(lg, bm, vs, idx)
    t = torch.from_numpy(lg.copy()).cuda()
    apply_token_bitmask_inplace_cuda(t, torch.from_numpy(bm), vocab_size=vs, indices=idx, backend=backend)
    np.testing.assert_array_equal(t.cpu().numpy(), ref)
    # the generic entry point dispatches CUDA tensors here, bitmask on the device or not
    for b in (torch.from_numpy(bm), torch.from_numpy(bm).cuda()):
        t = torch.from_numpy(lg.copy()).cuda()
        apply_token_bitmask_inplace(t, b, vocab_size=vs, indices=idx)
        np.testing.assert_array_equal(t.cpu().numpy(), ref)


@cuda
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_cuda_half_precision(dtype):
    lg, bm = make(4, 32000, 1000)
    ref = reference(lg, bm, None, None)
    for backend in ("torch", "auto"):
        t = torch.from_numpy(lg.copy()).cuda().to(getattr(torch, dtype))
        apply_token_bitmask_inplace_cuda(t, torch.from_numpy(bm), backend=backend)
        np.testing.assert_array_equal(torch.isinf(t).cpu().numpy(), np.isinf(ref))


def _compiled_variants(kernel) -> int | None:
    caches = getattr(kernel, "device_caches", None)  # Triton 3.x: device -> (kernel cache, ...)
    if not caches:
        return None
    return sum(len(c[0]) for c in caches.values())


@cuda
def test_cuda_kernel_compiles_once_per_dtype_whatever_the_batch():
    """warm_up compiles every variant decoding needs: no batch size compiles another (before, the
    grid size was a compile-time constant, and each new small batch compiled a variant)."""
    if not triton_available():
        pytest.skip("triton is not available")
    from grammask.grammar.kernels import triton_kernel as tk

    V = 49152
    assert tk.warm_up("cuda", V, (torch.float32, torch.bfloat16), V) == 4
    before = _compiled_variants(tk._kernel())
    if before is None:
        pytest.skip("this Triton keeps no per-device kernel cache to count")
    for B in (1, 2, 3, 5, 7, 11, 16, 33, 64):
        lg, bm = make(B, V, V // 32, seed=B)
        ref = reference(lg, bm, None, list(range(0, B, 2)))
        t = torch.from_numpy(lg.copy()).cuda()
        apply_token_bitmask_inplace_cuda(t, torch.from_numpy(bm), indices=list(range(0, B, 2)))
        np.testing.assert_array_equal(t.cpu().numpy(), ref)
        t = torch.from_numpy(lg.copy()).cuda().to(torch.bfloat16)
        apply_token_bitmask_inplace_cuda(t, torch.from_numpy(bm))
    assert _compiled_variants(tk._kernel()) == before
