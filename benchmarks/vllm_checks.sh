#!/usr/bin/env bash
# Issue 15's vLLM end-to-end check on the lent GPU machine, in three calls that must follow each
# other while the machine is warm (each call may carry at most 64 MiB; what a call parks under /root
# stays for the next one). No network there, so vLLM travels as pieces of its PyPI wheel.
#
# vllm==0.26.0 is the release whose pins match the machine's image (torch 2.11.0+cu130, CUDA 13:
# its kernels link libcudart.so.13); later releases need another torch. Prepared here (ignored
# folders, listed in .git/info/exclude), from the PyPI wheel and cp312 wheels:
#   .vp1/c.xz        vllm/_C_stable_libtorch.abi3.so (xz), and the wheels grammask itself needs
#   .vp2/g.a         the embedded GGUF, xz-compressed, first 58 MiB
#   .vp3/g.b         the rest of it; fa3.xz (vllm_flash_attn/_vllm_fa3_C.abi3.so, the Hopper
#                    attention kernels); vllm_py.tar.xz (vLLM's Python and its small .so, without
#                    FA2, the MoE kernels and the SM100 headers: unused by a dense model on Hopper);
#                    the other wheels vLLM imports at `vllm serve` (found by importing its serving,
#                    engine, worker and structured-output modules on CPU; lm-format-enforcer too,
#                    which vLLM imports while validating any structured-output request)
#
#   call 1 (carry .vp1): park; copy src to /root/gm-src and compile grammask's Numba kernels there
#            in the background (setsid: it outlives the call), so call 3's engine does not; run the
#            CUDA bitmask tests meanwhile (their log comes back from call 3)
#   call 2 (carry .vp2): park
#   call 3 (carry .vp3): install, join and unpack, convert the GGUF to a bf16 safetensors folder
#            with transformers, then benchmarks/vllm_serve.py (grammask, xgrammar, guidance, and
#            unconstrained, at 1 and 64 clients); reports land in $OUT
set -u
stage=${1:?stage 1, 2 or 3}
GGUF_SHA=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
# the wheel leaves flashinfer out (an optional dependency); its sampler is on by default on CUDA
export VLLM_USE_FLASHINFER_SAMPLER=0
export NUMBA_CACHE_DIR=/root/gm-numba GRAMMASK_CACHE_DIR=/root/gm-cache VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
OUT=${OUT:-/tmp/gpu-out}
P=/root/vp
mkdir -p "$OUT" "$NUMBA_CACHE_DIR" "$GRAMMASK_CACHE_DIR" $P
site() { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$@"; }
date
if [ "$stage" = 1 ]; then
  cp .vp1/c.xz $P/ && site .vp1/*.whl || exit 3
  rm -rf /root/gm-src && cp -r src /root/gm-src && rm -rf /root/gm-tests && cp -r tests /root/gm-tests
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c "import torch, triton, transformers, numba; print(torch.__version__, triton.__version__, transformers.__version__, numba.__version__)"
  (cd /root && PYTHONPATH=/root/gm-src:/tmp/site setsid nohup timeout 400 python3 -m pytest -q -x -p no:cacheprovider \
     gm-tests/test_bruteforce_masks.py gm-tests/test_json_schema.py gm-tests/test_adapter_vllm.py >/root/warmup.log 2>&1 &)
  # the CUDA bitmask tests (the kernel compiled once per dtype whatever the batch size), meanwhile
  (cd /root && PYTHONPATH=/root/gm-src:/tmp/site setsid nohup timeout 300 python3 -m pytest -q -p no:cacheprovider -rs \
     gm-tests/test_cuda_bitmask.py >/root/cudatests.log 2>&1 &)
  sleep 2; ls -la $P; echo "stage 1 parked"
elif [ "$stage" = 2 ]; then
  cp .vp2/g.a $P/ || exit 3
  ls -la $P; tail -2 /root/warmup.log; echo "stage 2 parked"
elif [ "$stage" = 3 ]; then
  [ -f $P/c.xz ] && [ -f $P/g.a ] || { echo "parked pieces missing: a fresh machine"; exit 4; }
  site .vp3/*.whl || exit 3
  tar -C /tmp/site -xJf .vp3/vllm_py.tar.xz || exit 3
  xz -dc $P/c.xz >/tmp/site/vllm/_C_stable_libtorch.abi3.so && xz -dc .vp3/fa3.xz >/tmp/site/vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so || exit 3
  mkdir -p /root/gg && cat $P/g.a .vp3/g.b | xz -dc >/root/gg/smol.gguf || exit 3
  echo "$GGUF_SHA  /root/gg/smol.gguf" | sha256sum -c - || exit 5
  export PYTHONPATH=/root/gm-src:/tmp/site
  tail -3 /root/warmup.log
  python3 - <<'EOF' || exit 6
import time, torch, transformers
t = time.time()
kw = {"gguf_file": "smol.gguf", "dtype": torch.bfloat16}
if hasattr(transformers, "GgufConfig"):  # newer transformers keep GGUF weights packed unless told
    kw["quantization_config"] = transformers.GgufConfig(dequantize=True)
m = transformers.AutoModelForCausalLM.from_pretrained("/root/gg", **kw)
tok = transformers.AutoTokenizer.from_pretrained("/root/gg", gguf_file="smol.gguf")
m.save_pretrained("/root/smol"); tok.save_pretrained("/root/smol")
print(f"converted in {time.time() - t:.1f} s; chat template: {tok.chat_template is not None}")
import vllm; print("vllm", vllm.__version__)
EOF
  timeout 300 python3 benchmarks/vllm_serve.py --model /root/smol --clients 1,64 --log-dir "$OUT" \
    --out "$OUT/vllm_serve.md" 2>&1 | grep -v "^\[.*\] clients=" ; echo "vllm_serve rc=${PIPESTATUS[0]}"
  python3 -c "from importlib.metadata import version as v; print(*(f'{n} {v(n)}' for n in ('vllm','torch','xgrammar','llguidance','transformers')))"
  cp /root/warmup.log /root/cudatests.log "$OUT"/ 2>/dev/null; tail -4 /root/cudatests.log
fi
date
