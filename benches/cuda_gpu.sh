#!/usr/bin/env bash
# cuda_gpu.sh — run on the H200: the CUDA op test (three ways), then the micro-benchmark.
# Builds nothing: expects build/gpu/test_cuda_ops and build/gpu/cuda_ops_bench (docs/cuda.md
# has the build lines). Logs go to $OUT/ when OUT is set, else to build/gpu/logs/.
#   RUN_PEER=1   also run the PyTorch peer (benches/peers/gpt_peer.py) at one GPT-small shape
#   SANITIZE=1   also run the test under compute-sanitizer memcheck (slow; Firecracker only)
set -u
cd "$(dirname "$0")/.."
LOG=${OUT:-build/gpu/logs}
mkdir -p "$LOG"
BIN=build/gpu
rc=0
step() { echo; echo "=== $* ==="; }
{
  step "device"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv 2>&1 | head -5
  step "SASS check: tensor-core instructions in the attention kernels"
  cuobjdump --dump-sass "$BIN/test_cuda_ops" 2>/dev/null | grep -c 'HMMA' || echo "cuobjdump unavailable or no HMMA"
} 2>&1 | tee "$LOG/device.log"

step "test (KDA_CUDA_SYNC=1: a fault names its node)" | tee "$LOG/test.log"
KDA_CUDA_SYNC=1 timeout 300 "$BIN/test_cuda_ops" 2>&1 | tee -a "$LOG/test.log"
[ "${PIPESTATUS[0]}" = 0 ] || rc=1

step "test again: generic attention, no graphs (fallback paths)" | tee "$LOG/test_simple.log"
KDA_ATTN_SIMPLE=1 KDA_NO_GRAPH=1 timeout 300 "$BIN/test_cuda_ops" 2>&1 | tee -a "$LOG/test_simple.log"
[ "${PIPESTATUS[0]}" = 0 ] || rc=1

step "bench" | tee "$LOG/bench.log"
timeout 400 "$BIN/cuda_ops_bench" 2>&1 | tee -a "$LOG/bench.log"
[ "${PIPESTATUS[0]}" = 0 ] || rc=1

if [ "${SANITIZE:-0}" = 1 ] && command -v compute-sanitizer >/dev/null; then
  step "compute-sanitizer memcheck" | tee "$LOG/sanitize.log"
  KDA_NO_GRAPH=1 timeout 400 compute-sanitizer --tool memcheck "$BIN/test_cuda_ops" 2>&1 | tail -40 | tee -a "$LOG/sanitize.log"
fi

if [ "${RUN_PEER:-0}" = 1 ]; then
  step "PyTorch peer (compile)" | tee "$LOG/peer.log"
  timeout 400 python3 benches/peers/gpt_peer.py --d 768 --layers 12 --heads 12 --batch 16 --seq 1024 \
    --steps 80 --mode compile 2>&1 | tee -a "$LOG/peer.log"
fi
echo "cuda_gpu.sh: exit $rc"
exit $rc
