#!/usr/bin/env bash
# benches/device_run.sh — one call on the lent H200: unpack the binaries built here
# (.devbuild/bundle.tar.xz: kda, test_cuda_ops, cuda_ops_bench, runtime libs, the prose sample),
# then CUDA op tests, kda's GPT steps (graph and eager), the KDA kernel test + bench, the op
# micro-benchmarks and the PyTorch peer. Logs under $OUT. Each stage has its own time limit.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/kda_out}; mkdir -p "$OUT"
K=/tmp/kdabundle; mkdir -p "$K"; tar -xJf .devbuild/bundle.tar.xz -C "$K"
export LD_LIBRARY_PATH=$K/lib:${LD_LIBRARY_PATH:-} KDA_HOME=$PWD
mkdir -p build/gpu data/small
cp "$K"/bin/test_cuda_ops "$K"/bin/cuda_ops_bench build/gpu/ && cp "$K"/data/prose.txt data/small/
stage() { echo; echo "=== $1 ($(date +%T))"; }
stage device; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
stage "cuda op tests"
KDA_CUDA_SYNC=1 timeout 150 build/gpu/test_cuda_ops > "$OUT/test_cuda_ops.log" 2>&1; echo "rc=$?"
grep -E "^FAIL|passed, " "$OUT/test_cuda_ops.log" | tail -25
stage "kda GPT S steps"
for cfg in "batch=8 seq=512" "batch=64 seq=512 check=0"; do
  timeout 120 "$K/bin/kda" --trust benches/gpt_bench.lua size=S $cfg steps=120 2>&1 | tail -4 | tee -a "$OUT/gpt_bench.log"
done
KDA_NO_GRAPH=1 timeout 60 "$K/bin/kda" --trust benches/gpt_bench.lua size=S batch=8 seq=512 steps=120 check=0 2>&1 | tail -3 | tee -a "$OUT/gpt_bench.log"
stage "kda GPT M steps"
timeout 90 "$K/bin/kda" --trust benches/gpt_bench.lua size=M batch=64 seq=1024 steps=80 check=0 2>&1 | tail -3 | tee -a "$OUT/gpt_bench.log"
stage "KDA kernels"
OUT=$OUT timeout 200 sh benches/kda_gpu.sh > "$OUT/kda_gpu.log" 2>&1; echo "rc=$?"
grep -E "^FAIL|passed, |ms|error" "$OUT/kda_gpu.log" | tail -30
stage "PyTorch peer S 8x512"
for mode in eager compile; do
  timeout 100 python3 benches/peers/gpt_peer.py --d 256 --layers 8 --heads 4 --batch 8 --seq 512 --steps 120 --mode $mode 2>&1 | tail -2 | tee -a "$OUT/peer.log"
done
stage "op micro-benchmarks"
timeout 60 build/gpu/cuda_ops_bench > "$OUT/ops_bench.log" 2>&1; tail -30 "$OUT/ops_bench.log"
stage done
