#!/usr/bin/env bash
# benches/device_run.sh MODE — one call on the lent H200 (make the bundle first: benches/bundle.sh).
# Unpacks .devbuild/bundle.tar.xz (kda, test_cuda_ops, cuda_ops_bench, runtime libs, the small
# prose corpus) and, when present, .devbuild/data (the full prose domain, xz). Logs under $OUT.
#   tests   CUDA op tests (normal, then fallback paths), the KDA kernel test + bench, op benches
#   train   kda GPT / hybrid step times (graph and eager)
#   peers   the PyTorch peer (benches/peers/gpt_peer.py) at the same shapes
#   ladder  gpu ladder rungs 1-2 on the full prose domain (.devbuild/data)
#   rung3   gpu ladder rung 3 alone (time-capped)
#   probe   where the time goes: per-op GPU profile of the GPT/hybrid steps (KDA_CUDA_PROFILE),
#           tests/runs.sh with the CUDA kda (resume identity on the GPU), the KDA kernels under
#           ncu (per-kernel times) and compute-sanitizer (memcheck, racecheck)
#   check   the CUDA op tests (incl. optimizer and decode ops), tests/runs.sh and tests/lua/runs.lua
#           with the CUDA kda, kda sample on the GPU, per-op profiles of the S/M steps
#   large   per-op profiles of the S/M steps, then the L (1.0B) config: kda and the PyTorch peer
#   final   KDA kernels (build, full test, bench, memcheck), the L time to first step, GPT S 8x512
#           beside the peer, the hybrid S step, racecheck last
#   bench   benches/bench.sh (what `make bench` runs) with the bundle's binaries
#   race    the quality race (issue 5): PyTorch peer vs kda's hybrid on the same bytes and window
set -u
cd "$(dirname "$0")/.."
MODE=${1:-tests}
OUT=${OUT:-/tmp/kda_out}; mkdir -p "$OUT"
K=/tmp/kdabundle; mkdir -p "$K"; tar -xJf .devbuild/bundle.tar.xz -C "$K"
export LD_LIBRARY_PATH=$K/lib:${LD_LIBRARY_PATH:-} KDA_HOME=$PWD
mkdir -p build/gpu data/small
cp "$K"/bin/test_cuda_ops "$K"/bin/cuda_ops_bench build/gpu/ && cp "$K"/data/prose.txt data/small/
KDA=$K/bin/kda
stage() { echo; echo "=== $1 ($(date +%T))"; }
stage device; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader

if [ "$MODE" = tests ]; then
  stage "cuda op tests"
  KDA_CUDA_SYNC=1 timeout 150 build/gpu/test_cuda_ops > "$OUT/test_cuda_ops.log" 2>&1; echo "rc=$?"
  grep -E "^FAIL|passed, " "$OUT/test_cuda_ops.log" | tail -25
  stage "cuda op tests: fallback attention, no graphs"
  KDA_ATTN_SIMPLE=1 KDA_NO_GRAPH=1 timeout 120 build/gpu/test_cuda_ops > "$OUT/test_cuda_ops_simple.log" 2>&1; echo "rc=$?"
  grep -E "^FAIL|passed, " "$OUT/test_cuda_ops_simple.log" | tail -10
  stage "KDA kernels"
  OUT=$OUT timeout 260 sh benches/kda_gpu.sh > "$OUT/kda_gpu.log" 2>&1; echo "rc=$?"
  grep -E "^FAIL|passed, " "$OUT/kda_test.log" | tail -12
  cat "$OUT/kda_bench.log" 2>/dev/null | tail -12
  stage "op micro-benchmarks"
  timeout 60 build/gpu/cuda_ops_bench > "$OUT/ops_bench.log" 2>&1; tail -32 "$OUT/ops_bench.log"
fi

if [ "$MODE" = train ]; then
  stage "kda step times"
  for args in "size=S batch=8 seq=512" "size=S batch=8 seq=512 arch=hybrid" "size=S batch=64 seq=512 check=0" \
              "size=S batch=64 seq=512 arch=hybrid check=0" "size=M batch=64 seq=1024 steps=70 check=0"; do
    timeout 100 "$KDA" --trust benches/gpt_bench.lua $args 2>&1 | grep -E "^(check|kda|kda:)" | tee -a "$OUT/gpt_bench.log"
  done
  KDA_NO_GRAPH=1 timeout 60 "$KDA" --trust benches/gpt_bench.lua size=S batch=8 seq=512 check=0 2>&1 | grep -E "^kda" | tee -a "$OUT/gpt_bench.log"
fi

if [ "$MODE" = peers ]; then
  stage "PyTorch peer (same card, same shapes as kda's step times)"
  pick() { grep -E "^(config|time to first|warm median|tokens/s|MFU|peak)"; }
  for mode in eager compile reduce-overhead; do
    timeout 110 python3 benches/peers/gpt_peer.py --d 256 --layers 8 --heads 4 --batch 8 --seq 512 --steps 120 --mode $mode 2>&1 | pick | tee -a "$OUT/peer.log"
  done
  timeout 100 python3 benches/peers/gpt_peer.py --d 256 --layers 8 --heads 4 --batch 64 --seq 512 --steps 120 --mode compile 2>&1 | pick | tee -a "$OUT/peer.log"
  timeout 150 python3 benches/peers/gpt_peer.py --d 768 --layers 12 --heads 12 --batch 64 --seq 1024 --steps 70 --mode compile 2>&1 | pick | tee -a "$OUT/peer.log"
fi

if [ "$MODE" = ladder ] && [ -f .devbuild/data/prose.txt.xz ]; then
    stage "gpu ladder rungs 1-2 on the full prose domain"
    mkdir -p /tmp/corpus && xz -dc .devbuild/data/prose.txt.xz > /tmp/corpus/prose.txt && cp .devbuild/data/MANIFEST /tmp/corpus/
    (cd /tmp && timeout 500 "$KDA" "$KDA_HOME/recipes/ladder.lua" --profile gpu --fresh --set corpus=/tmp/corpus --set rungs.1.max_seconds=150 --set rungs.2.max_seconds=150 --set rungs.3.pending=later --set rungs.4.pending=later --set rungs.5.pending=later --set rungs.6.pending=later 2>&1 | tail -25 | tee "$OUT/ladder.log")
    cp /tmp/runs/ladder/results.tsv "$OUT/ladder_results.tsv" 2>/dev/null
fi
if [ "$MODE" = rung3 ] && [ -f .devbuild/data/prose.txt.xz ]; then
  stage "gpu ladder rung 3 (20-30M hybrid), capped at ${RUNG_SECONDS:-100} s of training"
  mkdir -p /tmp/corpus && xz -dc .devbuild/data/prose.txt.xz > /tmp/corpus/prose.txt && cp .devbuild/data/MANIFEST /tmp/corpus/
  (cd /tmp && timeout 280 "$KDA" "$KDA_HOME/recipes/ladder.lua" --profile gpu --rung 3 --set corpus=/tmp/corpus \
     --set rungs.3.max_seconds=${RUNG_SECONDS:-100} 2>&1 | grep -vE "^step " | tail -16 | tee "$OUT/ladder3.log")
fi

if [ "$MODE" = race ] && [ -f .devbuild/data/prose.txt.xz ]; then
  mkdir -p /tmp/corpus && xz -dc .devbuild/data/prose.txt.xz > /tmp/corpus/prose.txt && cp .devbuild/data/MANIFEST /tmp/corpus/
  stage "quality race: PyTorch peer (GPT, reduce-overhead) on the prose domain, 150M bytes"
  timeout 200 python3 benches/peers/gpt_peer.py --d 256 --layers 8 --heads 4 --batch 64 --seq 512 --mode reduce-overhead \
    --lr 3e-3 --data /tmp/corpus/prose.txt --window 1048576 --tokens 150e6 --eval-every 500 2>&1 | grep -E "^(#|race)" | tee "$OUT/race_peer.log"
  stage "quality race: kda hybrid, same bytes, window and budget (capped at ${RACE_SECONDS:-200} s of training)"
  (cd /tmp && timeout 330 "$KDA" --trust "$KDA_HOME/benches/race.lua" corpus=/tmp/corpus eval_every=500 \
    max_seconds=${RACE_SECONDS:-200} 2>&1 | grep -E "^(#|race)" | tee "$OUT/race_kda.log")
fi
if [ "$MODE" = check ]; then
  stage "cuda op tests"
  KDA_CUDA_SYNC=1 timeout 150 build/gpu/test_cuda_ops > "$OUT/test_cuda_ops.log" 2>&1; echo "rc=$?"
  grep -E "^FAIL|passed, " "$OUT/test_cuda_ops.log" | tail -25
  KDA_ATTN_SIMPLE=1 KDA_NO_GRAPH=1 timeout 120 build/gpu/test_cuda_ops >> "$OUT/test_cuda_ops.log" 2>&1; echo "fallback paths rc=$?"
  grep -E "^FAIL|passed, " "$OUT/test_cuda_ops.log" | tail -3
  stage "tests/runs.sh and tests/lua/runs.lua with the CUDA kda"
  KDA=$KDA timeout 200 bash tests/runs.sh > "$OUT/runs_gpu.log" 2>&1; echo "rc=$?"; grep -E "^FAIL|passed, " "$OUT/runs_gpu.log"
  timeout 120 "$KDA" --trust tests/lua/runs.lua >> "$OUT/runs_gpu.log" 2>&1; echo "lua runs rc=$?"; grep -E "^FAIL|passed, " "$OUT/runs_gpu.log" | tail -4
  stage "per-op GPU profile (KDA_CUDA_PROFILE=1) and the pipelined S step"
  for args in "size=S batch=8 seq=512" "size=S batch=8 seq=512 arch=hybrid" "size=M batch=64 seq=1024"; do
    echo "## $args" >> "$OUT/profile.log"
    KDA_CUDA_PROFILE=1 timeout 90 "$KDA" --trust benches/gpt_bench.lua $args steps=56 check=0 2>&1 | grep -E "^(#|  |kda:)" >> "$OUT/profile.log"
  done
  head -c 9000 "$OUT/profile.log"
  timeout 60 "$KDA" --trust benches/gpt_bench.lua size=S batch=8 seq=512 steps=300 2>&1 | grep -E "^(check|kda)"
fi

if [ "$MODE" = large ]; then
  stage "per-op GPU profile (KDA_CUDA_PROFILE=1)"
  for args in "size=S batch=8 seq=512" "size=S batch=8 seq=512 arch=hybrid" "size=M batch=64 seq=1024"; do
    echo "## $args" >> "$OUT/profile.log"
    KDA_CUDA_PROFILE=1 timeout 60 "$KDA" --trust benches/gpt_bench.lua $args steps=56 check=0 2>&1 | grep -E "^(#|  |kda:)" >> "$OUT/profile.log"
  done
  cat "$OUT/profile.log"
  stage "L (1.0B): kda, then the PyTorch peer (torch.compile)"
  timeout 200 "$KDA" --trust benches/gpt_bench.lua size=L batch=16 seq=2048 steps=56 check=0 2>&1 | grep -E "^(kda|kda:)" | tee -a "$OUT/large.log"
  timeout 200 python3 benches/peers/gpt_peer.py --d 2048 --layers 20 --heads 16 --batch 16 --seq 2048 --steps 60 --mode compile 2>&1 \
    | grep -E "^(config|time to first|warm median|tokens/s|MFU|peak)" | tee -a "$OUT/large.log"
fi

if [ "$MODE" = bench ]; then
  KDA=$KDA BIN=build/gpu OUT=$OUT SIZES="${SIZES:-S M L}" bash benches/bench.sh
  cp benches/history.tsv "$OUT/history.tsv"
fi

if [ "$MODE" = final ]; then
  stage "KDA kernels: build, full test, bench"
  BUILD_ONLY=1 OUT=$OUT timeout 170 sh benches/kda_gpu.sh > "$OUT/kda_build.log" 2>&1; echo "build rc=$?"
  timeout 90 build/kda_gpu/test_kda_cuda > "$OUT/kda_test.log" 2>&1; echo "test rc=$?"
  grep -E "^FAIL|passed, |^# [0-9.]+ s" "$OUT/kda_test.log" | head -20
  timeout 90 build/kda_gpu/kda_bench > "$OUT/kda_bench.log" 2>&1; echo "bench rc=$?"; cat "$OUT/kda_bench.log"
  timeout 90 compute-sanitizer --tool memcheck --print-limit 10 build/kda_gpu/test_kda_cuda quick > "$OUT/kda_sanitizer.log" 2>&1
  echo "memcheck rc=$?"; grep -E "ERROR SUMMARY|passed, " "$OUT/kda_sanitizer.log" | head -4
  stage "L time to first step; GPT S 8x512 beside the peer; hybrid S 64x512"
  timeout 60 "$KDA" --trust benches/gpt_bench.lua size=L batch=16 seq=2048 first=1 check=0 2>&1 | grep -E "^(kda|kda:)" | tee -a "$OUT/steps.log"
  timeout 40 "$KDA" --trust benches/gpt_bench.lua size=S batch=8 seq=512 steps=300 check=0 2>&1 | grep -E "^(kda|kda:)" | tee -a "$OUT/steps.log"
  timeout 100 python3 benches/peers/gpt_peer.py --d 256 --layers 8 --heads 4 --batch 8 --seq 512 --steps 120 --mode reduce-overhead 2>&1 \
    | grep -E "^(config|time to first|warm median|tokens/s|MFU|peak)" | tee -a "$OUT/steps.log"
  timeout 60 "$KDA" --trust benches/gpt_bench.lua size=S batch=64 seq=512 arch=hybrid steps=120 check=0 2>&1 | grep -E "^(kda|kda:)" | tee -a "$OUT/steps.log"
  stage "racecheck (quick test)"
  timeout 150 compute-sanitizer --tool racecheck --print-limit 10 build/kda_gpu/test_kda_cuda quick >> "$OUT/kda_sanitizer.log" 2>&1
  echo "racecheck rc=$?"; grep -E "RACECHECK SUMMARY|ERROR SUMMARY|passed, |hazard" "$OUT/kda_sanitizer.log" | tail -5
fi

if [ "$MODE" = racecheck ]; then   # the KDA kernels under racecheck on two small cases
  BUILD_ONLY=1 OUT=$OUT timeout 170 sh benches/kda_gpu.sh > "$OUT/kda_build.log" 2>&1; echo "build rc=$?"
  for c in "T=65 B=2" "K=100 V=60"; do
    timeout 55 compute-sanitizer --tool racecheck --print-limit 10 build/kda_gpu/test_kda_cuda quick "$c" > "$OUT/race.log" 2>&1
    echo "racecheck '$c' rc=$?"; grep -E "RACECHECK SUMMARY|ERROR SUMMARY|passed, |hazard|^ok|^FAIL" "$OUT/race.log" | cut -c1-100 | tail -4
  done
fi

if [ "$MODE" = probe ]; then
  stage "per-op GPU profile (KDA_CUDA_PROFILE=1: segments run back to back, eager)"
  for args in "size=S batch=8 seq=512" "size=S batch=8 seq=512 arch=hybrid" "size=S batch=64 seq=512" \
              "size=S batch=64 seq=512 arch=hybrid" "size=M batch=64 seq=1024"; do
    echo "## $args" | tee -a "$OUT/profile.log"
    KDA_CUDA_PROFILE=1 timeout 90 "$KDA" --trust benches/gpt_bench.lua $args steps=56 check=0 2>&1 | grep -E "^(#|  |kda:)" | tee -a "$OUT/profile.log"
  done
  stage "tests/runs.sh with the CUDA kda (resume bit-identity, SIGKILL mid-checkpoint, corrupt checkpoint)"
  KDA=$KDA timeout 240 bash tests/runs.sh > "$OUT/runs_gpu.log" 2>&1; echo "rc=$?"; tail -12 "$OUT/runs_gpu.log"
  stage "KDA kernels: build, ncu per-kernel times, compute-sanitizer"
  BUILD_ONLY=1 OUT=$OUT timeout 200 sh benches/kda_gpu.sh > "$OUT/kda_build.log" 2>&1; echo "build rc=$?"
  for sh in 0 2 3; do
    KDA_BENCH_SHAPE=$sh timeout 100 ncu --clock-control none --metrics gpu__time_duration.sum --launch-count 30 \
      --print-summary per-kernel build/kda_gpu/kda_bench > "$OUT/kda_ncu_$sh.log" 2>&1; echo "ncu shape $sh rc=$?"
    grep -E "^  [a-zA-Z_]|gpu__time_duration|^shape|^\(" "$OUT/kda_ncu_$sh.log" | head -60
  done
  for tool in memcheck racecheck; do
    timeout 240 compute-sanitizer --tool $tool --print-limit 20 build/kda_gpu/test_kda_cuda quick > "$OUT/kda_$tool.log" 2>&1
    echo "compute-sanitizer $tool rc=$?"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|passed, |Invalid|hazard" "$OUT/kda_$tool.log" | head -8
  done
fi
stage done
