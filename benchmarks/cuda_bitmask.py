"""Bitmask application on CUDA: grammask's kernels beside xgrammar's, same run, same tensors (issue 15).

For each batch size B the logits are ``[B, V]`` (default V = 128,256, Llama-3's vocabulary; float32,
and bfloat16 as a second table) on the GPU and the bitmask ``[B, ceil(V/32)]`` int32 random bits.
Columns:

``grammask triton``  :func:`grammask.grammar.kernels.apply.apply_token_bitmask_inplace_tensor`
                     with ``backend="triton"`` (the engine's path on CUDA), bitmask on the GPU
``grammask torch``   the same with ``backend="torch"`` (the fallback when Triton is missing)
``xgrammar triton``  ``xgrammar.kernels.apply_token_bitmask_inplace_triton`` (what xgrammar, and
                     vLLM's default structured-output backend through it, run on CUDA tensors)
``H2D pinned/pageable``  copying the host bitmask ``[B, W]`` to the GPU (``non_blocking`` from
                     pinned memory, and from an ordinary numpy array), the copy a server pays per step

Times are medians of ``triton.testing.do_bench`` (CUDA events, the L2 cache flushed before each
call, so each call pays its Python launch cost and cold-cache memory traffic), in µs. Every
implementation's output is compared element for element with a torch reference on fresh random
logits before it is timed; a mismatch is printed and fails the run (exit 1).

    python benchmarks/cuda_bitmask.py [--vocab 128256] [--batches 1,2,4,...,256] [--out FILE]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from common import command_line, fmt, md_table, package_versions  # noqa: E402

BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
#: extra launch configurations of grammask's kernel (``--warps``), timed beside the default
WARPS: list[int] = []


def reference(logits, bitmask, V: int):
    import torch
    bits = torch.arange(32, device=logits.device, dtype=torch.int32)
    allowed = ((bitmask.unsqueeze(-1) >> bits) & 1).bool().reshape(bitmask.shape[0], -1)[:, :V]
    out = logits.clone()
    out[:, :V].masked_fill_(~allowed, float("-inf"))
    return out


def implementations():
    from grammask.grammar.kernels.apply import apply_token_bitmask_inplace_tensor as apply
    impls = {
        "grammask triton": lambda lg, bm, V: apply(lg, bm, vocab_size=V, backend="triton"),
        "grammask torch": lambda lg, bm, V: apply(lg, bm, vocab_size=V, backend="torch"),
    }
    from grammask.grammar.kernels.triton_kernel import apply_triton
    for w in WARPS:
        impls[f"grammask triton w{w}"] = (lambda w: lambda lg, bm, V: apply_triton(lg, bm, V, None, num_warps=w))(w)
    why = ""
    try:
        from xgrammar.kernels.apply_token_bitmask_inplace_triton import apply_token_bitmask_inplace_triton
        impls["xgrammar triton"] = lambda lg, bm, V: apply_token_bitmask_inplace_triton(lg, bm, vocab_size=V)
    except Exception as e:  # noqa: BLE001 - reported in the table's notes
        why = f"xgrammar not importable ({type(e).__name__}: {e})"
    return impls, why


def run(args) -> tuple[str, bool]:
    import torch
    from triton.testing import do_bench

    dev = torch.device("cuda")
    V = args.vocab
    W = (V + 31) // 32
    impls, why = implementations()
    names = list(impls)
    ok = True
    lines = [f"Device: {torch.cuda.get_device_name(0)}; torch {torch.__version__}; "
             f"{package_versions(['triton', 'xgrammar'])}; V = {V:,}, bitmask words W = {W:,}.", ""]
    if why:
        lines.append(f"Note: {why}.")
    gen = torch.Generator(device=dev)
    gen.manual_seed(0)
    for dtype in (torch.float32, torch.bfloat16):
        batches = args.batches if dtype == torch.float32 else [b for b in args.batches if b in (1, 16, 64, 256)]
        rows = []
        for B in batches:
            bm = torch.randint(-2 ** 31, 2 ** 31 - 1, (B, W), device=dev, dtype=torch.int32, generator=gen)
            times = {}
            for name, fn in list(impls.items()):
                lg = torch.randn(B, V, device=dev, dtype=dtype, generator=gen)
                ref = reference(lg, bm, V)
                try:
                    fn(lg, bm, V)
                    torch.cuda.synchronize()
                except Exception as e:  # noqa: BLE001 - a peer that fails here is reported, not fatal
                    print(f"FAILED {name} B={B} {dtype}: {type(e).__name__}: {e}", flush=True)
                    lines.append(f"Note: {name} failed at B={B}, {dtype} ({type(e).__name__}: {e}); left out.")
                    ok = ok and not name.startswith("grammask")
                    del impls[name]
                    continue
                if not torch.equal(lg, ref):
                    bad = int((lg != ref).sum())
                    print(f"MISMATCH {name} B={B} {dtype}: {bad} elements differ", flush=True)
                    ok = False
                lg = torch.randn(B, V, device=dev, dtype=dtype, generator=gen)
                times[name] = do_bench(lambda: fn(lg, bm, V), warmup=25, rep=args.rep_ms, return_mode="median") * 1e3
            host = np.random.default_rng(B).integers(-2 ** 31, 2 ** 31, (B, W), dtype=np.int64).astype(np.int32)
            pinned = torch.from_numpy(host).pin_memory()
            h2d_pin = do_bench(lambda: pinned.to(dev, non_blocking=True), warmup=10, rep=args.rep_ms,
                               return_mode="median") * 1e3
            h2d_page = do_bench(lambda: torch.from_numpy(host).to(dev), warmup=10, rep=args.rep_ms,
                                return_mode="median") * 1e3
            # bytes the kernel must move at least: the bitmask read once, the blocked half of the logits written
            floor_bytes = B * W * 4 + B * V * lg.element_size() / 2
            t = times.get("grammask triton", float("nan"))
            row = [B] + [fmt(times[n], 1) if n in times else "-" for n in names]
            if "xgrammar triton" in names:
                row.append(fmt(t / times["xgrammar triton"], 2) if "xgrammar triton" in times else "-")
            row += [fmt(floor_bytes / (t * 1e-6) / 1e9, 0), fmt(h2d_pin, 1), fmt(h2d_page, 1)]
            rows.append(row)
            print(f"{dtype} B={B}: " + ", ".join(f"{n} {v:.1f}" for n, v in times.items()), flush=True)
        head = ["B"] + [f"{n} µs" for n in names]
        if "xgrammar triton" in names:
            head.append("grammask triton / xgrammar")
        head += ["grammask triton GB/s (floor bytes)", "H2D pinned µs", "H2D pageable µs"]
        lines += [f"**{str(dtype).replace('torch.', '')} logits**", "", md_table(head, rows), ""]
    return "\n".join(lines), ok


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--vocab", type=int, default=128256)
    ap.add_argument("--batches", default=",".join(map(str, BATCHES)))
    ap.add_argument("--rep-ms", type=int, default=200, help="do_bench's timing window per case, ms")
    ap.add_argument("--warps", default="", help="also time grammask's kernel with these warps per program, e.g. 16,32")
    ap.add_argument("--out", help="also write the report to this file")
    args = ap.parse_args(argv)
    args.batches = [int(b) for b in args.batches.split(",")]
    WARPS[:] = [int(w) for w in args.warps.split(",") if w]
    import torch
    if not torch.cuda.is_available():
        print("cuda_bitmask.py: no CUDA device here; this benchmark runs on a GPU machine only.")
        return 2
    t0 = time.time()
    body, ok = run(args)
    report = (f"Command: `{command_line()}`; {time.time() - t0:.0f} s.\n\n" + body)
    print(report)
    if args.out:
        Path(args.out).write_text(report + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
