#!/usr/bin/env bash
# benches/device_run.sh MODE — one call on the lent H200 (make the bundle first: benches/bundle.sh).
# Unpacks .devbuild/bundle.tar.xz (kda, test_cuda_ops, cuda_ops_bench, the KDA kernels' test_kda_cuda,
# kda_bench and kda_bench_phases, runtime libs, the small prose corpus) and, when present,
# .devbuild/data (the full prose domain, xz). Logs under $OUT
# (the device tool brings back at most 8 files: each mode writes fewer).
#   tests     CUDA op tests (normal, then the fallback paths), the KDA kernels' full test,
#             memcheck on the quick KDA test
#   runs      tests/runs.sh and tests/lua/runs.lua with the CUDA kda (resume bit for bit after
#             SIGKILL, corrupt checkpoints, report, sample on the GPU)
#   racecheck the KDA kernels under racecheck, one case filter at a time (CASES="a|b|...")
#   profile   where the time goes: KDA_CUDA_PROFILE of the GPT S, hybrid S and GPT M steps; ncu
#             per-kernel times of the KDA fwd+bwd at three bench shapes; the KDA kernels' phase
#             timers (kda_bench_phases) at (8,2048,16,128)
#   bench     benches/bench.sh (what `make bench` runs) with the bundle's binaries (SIZES="S M L")
#   ab        one switch measured in the same run: the GPT steps with and without ${AB:-KDA_NO_FUSE}=1,
#             alternating, per config (AB_CFGS="size=S batch=8 seq=512|..."); then the op
#             micro-benchmarks (session 9 ran the same loop inline; not yet run as this mode)
#   kda_ab    the KDA kernels, baseline (.devbuild/bundle_b.tar.xz: benches/kda_baseline.sh REV) against
#             the bundle's: the new test (KDA_AB_ENV applied), then kda_bench alternating A B A B,
#             the new side's precise backward and its phase timers at KDA_BENCH_SHAPE=0; one log
#   kda_multi several revisions in one call (each packed by benches/kda_baseline.sh REV NAME, or
#             staged with SHARED=1 and packed together by kda_baseline.sh --shared: kda_packs*.tar.xz):
#             KDA_MULTI="main new new@KDA_KDA_COMPACT=0 ..." (NAME[@ENV=V,...]); each entry of
#             TESTS runs its full test (QUICK=1: the quick one, path 0 without the long case, for a
#             short call; KDA_BENCH_SHAPE=N likewise limits kda_bench to one shape); then kda_bench in ROUNDS (2) rounds alternating over
#             KDA_MULTI; the precise backward of PRECISE (default all); MEMCHECK="NAME ..." memcheck
#             on the quick test; RACE="NAME[@ENV]:case|..."
#             racecheck filters (each under RACE_TIMEOUT s, 90 by default: "K=V=128 T=300"
#             ran past 90; RACE_KERNEL=NAME checks only kernels whose name holds NAME (an entry's
#             "case#NAME" its own), the rest
#             run unchecked at full speed); HYBRID entries the hybrid S 64x512 step with their kda
#             (WITH_KDA=1; HYBRID_ARGS="|hd=128" runs it once a '|'-separated list of extra
#             gpt_bench options: the default, then the KDA layers at K = V = 128); phases of
#             KDA_MULTI's last entry; NCU="k_bwd_final_tc k_intra_tc ..."
#             profiles those kernels of the last entry at SHAPE (ncu --set full; the details'
#             headline and benches/ncu_sass_mix.py's stall and opcode mix, into the same log)
#             PSHAPES="0 3": the phase counters at those kda_bench shapes (default 0; PHASES_ALL=1:
#             every entry's, for a change whose effect on a kernel's other phases is the question);
#             KTIMES="3 2": each kernel's duration (ncu, one kernel at a time) at those shapes, last entry
#             (KTIMES_ALL=1: every entry; the log keeps the total and each kernel's median)
#   ncu_source one kernel of the bundle's kda_bench (KDA_BIN=NAME: kda_NAME's) under ncu --set full (KERNEL regex, SHAPE
#             0..3 as KDA_BENCH_SHAPE): its details page and its per-line CUDA source and SASS
#             metrics as CSV (the KDA kernels are built with -lineinfo), and benches/ncu_sass_mix.py's
#             stall / opcode summary of the SASS page (session 15 ran the same steps inline: the
#             CUDA-source page came back without metrics, the SASS page with them)
#   sass_map  KERNELS (regexes) of kda_bench (KDA_BIN=NAME): nvdisasm -g of its cubin and ncu's per-SASS-line
#             counts (SourceCounters) at SHAPE, for benches/sass_lines.py's per-source-line table
#   other     (e.g. none) only unpacks the bundle, for a command of one's own after it
#   ladder    gpu ladder rungs 1-2 on the full prose domain (.devbuild/data)
#   rung3     gpu ladder rung 3 alone (time-capped)
#   race      the quality race (issue 5): PyTorch peer vs kda's hybrid on the same bytes and window
set -u
cd "$(dirname "$0")/.."
MODE=${1:-tests}
OUT=${OUT:-/tmp/kda_out}; mkdir -p "$OUT"
K=/tmp/kdabundle; mkdir -p "$K"; tar -xJf .devbuild/bundle.tar.xz -C "$K"
export LD_LIBRARY_PATH=$K/lib:${LD_LIBRARY_PATH:-} KDA_HOME=$PWD
mkdir -p build/gpu data/small
[ -f "$K"/data/prose.txt ] && cp "$K"/data/prose.txt data/small/   # a base bundle (bundle.sh BASE=1) carries none
for b in test_cuda_ops cuda_ops_bench; do [ -x "$K/bin/$b" ] && cp "$K/bin/$b" build/gpu/; done
KDA=$K/bin/kda
export REV=$(cat "$K/bin/REVISION" 2>/dev/null)   # the revision the bundle was built from (bench.sh's history rows)
case "$MODE" in tests|runs|profile|bench|ab|ladder|rung3|race) [ -x "$KDA" ] || {   # a base bundle holds libraries only
  echo "device_run.sh: $MODE needs the full bundle, .devbuild/bundle.tar.xz has no bin/kda (made with BASE=1): run benches/bundle.sh without BASE" >&2; exit 2; } ;; esac
stage() { echo; echo "=== $1 ($(date +%T))"; }
build_kda() {   # the bundle's prebuilt KDA binaries (KDA_BIN=NAME: those of .devbuild/kda_NAME.tar.xz); an older bundle without them: build here
  local kb=$K/bin; if [ -n "${KDA_BIN:-}" ]; then kb=/tmp/kda_$KDA_BIN/bin; [ -d "$kb" ] || { mkdir -p /tmp/kda_$KDA_BIN && tar -xJf .devbuild/kda_$KDA_BIN.tar.xz -C /tmp/kda_$KDA_BIN; }; fi
  if [ -x "$kb/kda_bench" ]; then mkdir -p build/kda_gpu && cp "$kb"/test_kda_cuda "$kb"/kda_bench "$kb"/kda_bench_phases build/kda_gpu/ && touch build/kda_gpu/*; return; fi
  BUILD_ONLY=1 OUT=$OUT timeout 200 sh benches/kda_gpu.sh > "$OUT/kda_build.log" 2>&1; echo "KDA build rc=$?"; }
stage device; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader

if [ "$MODE" = tests ]; then
  stage "cuda op tests (KDA_CUDA_SYNC=1), then the fallback paths (KDA_ATTN_SIMPLE=1 KDA_NO_GRAPH=1)"
  KDA_CUDA_SYNC=1 timeout 150 build/gpu/test_cuda_ops > "$OUT/test_cuda_ops.log" 2>&1; echo "rc=$?"
  KDA_ATTN_SIMPLE=1 KDA_NO_GRAPH=1 timeout 150 build/gpu/test_cuda_ops >> "$OUT/test_cuda_ops.log" 2>&1; echo "fallback rc=$?"
  grep -E "^FAIL|passed, " "$OUT/test_cuda_ops.log" | tail -25
  stage "KDA kernels: build, full test, memcheck on the quick test"
  build_kda
  timeout 120 build/kda_gpu/test_kda_cuda > "$OUT/kda_test.log" 2>&1; echo "test rc=$?"
  grep -E "^FAIL|passed, |^# [0-9.]+ s" "$OUT/kda_test.log" | head -20
  timeout 150 compute-sanitizer --tool memcheck --print-limit 10 build/kda_gpu/test_kda_cuda quick > "$OUT/kda_memcheck.log" 2>&1
  echo "memcheck rc=$?"; grep -E "ERROR SUMMARY|passed, " "$OUT/kda_memcheck.log" | head -4
fi

if [ "$MODE" = runs ]; then
  stage "tests/runs.sh and tests/lua/runs.lua with the CUDA kda"
  KDA=$KDA timeout 240 bash tests/runs.sh > "$OUT/runs_gpu.log" 2>&1; echo "runs.sh rc=$?"
  timeout 120 "$KDA" --trust tests/lua/runs.lua >> "$OUT/runs_gpu.log" 2>&1; echo "runs.lua rc=$?"
  grep -E "^FAIL|passed, " "$OUT/runs_gpu.log"
fi

if [ "$MODE" = racecheck ]; then   # a whole test under racecheck takes minutes: one filter at a time
  build_kda
  IFS='|' read -r -a cases <<< "${CASES:-T=65 B=2|K=100 V=60|varlen|GVA|chunk|K=128 V=256|decay -1000|lower-bound gate|T=1 B=2|T=500}"
  for c in "${cases[@]}"; do
    timeout 60 compute-sanitizer --tool racecheck --print-limit 5 build/kda_gpu/test_kda_cuda quick "$c" > "$OUT/race_case.log" 2>&1
    echo "racecheck '$c' rc=$? $(grep -cE '^ok' "$OUT/race_case.log") ok | $(grep -E 'RACECHECK SUMMARY' "$OUT/race_case.log" | cut -c1-80)"
    grep -E "^FAIL|hazard" "$OUT/race_case.log" | head -3
  done
fi

if [ "$MODE" = profile ]; then
  stage "per-op GPU profile (KDA_CUDA_PROFILE=1: segments run back to back, eager)"
  for args in "size=S batch=8 seq=512" "size=S batch=8 seq=512 arch=hybrid" "size=M batch=64 seq=1024"; do
    echo "## $args" >> "$OUT/profile.log"
    KDA_CUDA_PROFILE=1 timeout 90 "$KDA" --trust benches/gpt_bench.lua $args steps=56 check=0 2>&1 | grep -E "^(#|  |kda:)" >> "$OUT/profile.log"
  done
  cat "$OUT/profile.log"
  stage "KDA fwd+bwd per kernel (ncu, unmodified clocks)"
  build_kda
  for sh in 0 2 3; do
    KDA_BENCH_SHAPE=$sh timeout 100 ncu --clock-control none --metrics gpu__time_duration.sum --launch-count 30 \
      --print-summary per-kernel build/kda_gpu/kda_bench > "$OUT/kda_ncu_$sh.log" 2>&1; echo "ncu shape $sh rc=$?"
    grep -E "^  [a-zA-Z_]|gpu__time_duration|^\(" "$OUT/kda_ncu_$sh.log" | head -40
  done
  stage "KDA kernels' phases (kda_bench_phases: cycles per block per phase, all calls of the bench)"
  KDA_BENCH_SHAPE=0 timeout 120 build/kda_gpu/kda_bench_phases 2>&1 | tail -8 | tee "$OUT/kda_phases.log"
fi

if [ "$MODE" = bench ]; then   # bench.sh writes a dozen logs: they come back as one archive
  build_kda                      # the bundle's KDA binaries, newer than the sources: kda_gpu.sh runs them as they are
  KDA=$KDA BIN=build/gpu OUT=/tmp/bench_out SIZES="${SIZES:-S M L}" bash benches/bench.sh
  cp benches/history.tsv "$OUT/history.tsv"
  tar -czf "$OUT/bench_logs.tgz" -C /tmp/bench_out .
fi

if [ "$MODE" = ab ]; then
  SW=${AB:-KDA_NO_FUSE}
  IFS='|' read -r -a cfgs <<< "${AB_CFGS:-size=S batch=8 seq=512|size=S batch=64 seq=512|size=M batch=64 seq=1024}"
  for c in "${cfgs[@]}"; do
    for rep in 1 2; do
      for sw in 0 1; do
        stage "$c, $SW=$sw (repeat $rep)"
        env "$SW=$([ $sw = 1 ] && echo 1 || echo 0)" timeout 120 "$KDA" --trust benches/gpt_bench.lua $c steps=150 check=0 2>&1 | grep -E "^kda " | tee -a "$OUT/ab.log"
      done
    done
  done
  stage "op micro-benchmarks"
  timeout 200 build/gpu/cuda_ops_bench > "$OUT/ops_bench.log" 2>&1; echo "rc=$?"; grep -iE "attention|rmsnorm|add" "$OUT/ops_bench.log" | head -20
fi

if [ "$MODE" = kda_ab ]; then   # env for the new side only: KDA_AB_ENV="KDA_KDA_ROWS_SEP=0 ..."
  KA=/tmp/kda_base; mkdir -p "$KA"; tar -xJf .devbuild/bundle_b.tar.xz -C "$KA"
  echo "A = $(cat "$KA/bin/REVISION" 2>/dev/null), B = $REV ${KDA_AB_ENV:-}" > "$OUT/kda_ab.log"
  { env ${KDA_AB_ENV:-} timeout 150 "$K/bin/test_kda_cuda" > "$OUT/kda_test.log" 2>&1; echo "B test rc=$?"
    grep -E "^FAIL|passed, " "$OUT/kda_test.log" | head -12
    for rep in 1 2; do
      echo "== A ($rep)"; timeout 90 "$KA/bin/kda_bench" 2>&1 | grep -E "^\("
      echo "== B ($rep)"; env ${KDA_AB_ENV:-} timeout 90 "$K/bin/kda_bench" 2>&1 | grep -E "^\("
    done
    echo "== B, KDA_KDA_PRECISE=1"; env ${KDA_AB_ENV:-} KDA_KDA_PRECISE=1 timeout 90 "$K/bin/kda_bench" 2>&1 | grep "fwd+bwd"
    echo "== B phases (8,2048,16,128)"; env ${KDA_AB_ENV:-} KDA_BENCH_SHAPE=0 timeout 90 "$K/bin/kda_bench_phases" 2>&1 | grep -vE "^(#|\(|shape)"
  } >> "$OUT/kda_ab.log" 2>&1
  cat "$OUT/kda_ab.log"
fi

if [ "$MODE" = kda_multi ]; then
  bin() { echo "/tmp/kda_${1%%@*}/bin"; }                      # NAME[@ENV] -> its unpacked bin folder
  envof() { case "$1" in *@*) echo "${1#*@}" | tr ',' ' ';; esac; }
  races=$(echo "${RACE:-}" | tr '|' '\n' | sed 's/:.*//')           # every name any list mentions
  # the shared archives' sides (kda_baseline.sh --shared); PACKS names this call's archives (a warm
  # machine keeps an earlier call's carried files), else every kda_packs*.tar.xz there
  for a in ${PACKS:-.devbuild/kda_packs*.tar.xz}; do [ -f "$a" ] && tar -xJf "$a" -C /tmp; done
  for e in ${KDA_MULTI:?} ${TESTS:-} ${HYBRID:-} ${PRECISE:-} $races; do n=${e%%@*}; [ -d /tmp/kda_$n ] && continue
    mkdir -p /tmp/kda_$n && tar -xJf .devbuild/kda_$n.tar.xz -C /tmp/kda_$n; done
  for e in ${KDA_MULTI:?} ${TESTS:-} ${HYBRID:-} ${PRECISE:-} $races; do n=${e%%@*}; echo "$n = $(cat /tmp/kda_$n/bin/REVISION 2>/dev/null || echo missing)"; done |
    sort -u | tee "$OUT/kda_multi.log"
  { i=0; for n in ${TESTS:-}; do i=$((i+1)); echo "== test $n"
      env $(envof "$n") timeout 150 "$(bin "$n")/test_kda_cuda" ${QUICK:+quick} > "$OUT/kda_test_$i.log" 2>&1; echo "rc=$?"
      grep -E "^FAIL|passed, " "$OUT/kda_test_$i.log" | head -12; done
    for n in ${MEMCHECK:-}; do   # compute-sanitizer memcheck on the quick test
      env $(envof "$n") timeout 150 compute-sanitizer --tool memcheck --print-limit 10 "$(bin "$n")/test_kda_cuda" quick > "$OUT/kda_memcheck.log" 2>&1
      echo "memcheck $n rc=$? | $(grep -E 'ERROR SUMMARY' "$OUT/kda_memcheck.log") | $(grep -E 'passed, ' "$OUT/kda_memcheck.log")"; done
    IFS='|' read -r -a races <<< "${RACE:-}"
    [ -n "${RACE_KERNEL:-}" ] && { echo "compute-sanitizer's kernel filter (RACE_KERNEL=$RACE_KERNEL):"
      compute-sanitizer --help 2>&1 | grep -A4 -- "--kernel-name " | head -8; }
    for r in "${races[@]}"; do n=${r%%:*}; c=${r#*:}; kf=${RACE_KERNEL:-}
      case $c in *'#'*) kf=${c##*#}; c=${c%#*} ;; esac   # "case#KERNEL": this entry's own filter
      env $(envof "$n") timeout ${RACE_TIMEOUT:-90} compute-sanitizer --tool racecheck --print-limit 5 \
        ${kf:+--kernel-name kns=$kf} "$(bin $n)/test_kda_cuda" quick "$c" > "$OUT/race_case.log" 2>&1
      echo "racecheck $n '$c'${kf:+ (kernels: $kf)} rc=$? $(grep -cE '^ok' "$OUT/race_case.log") ok | $(grep -E 'RACECHECK SUMMARY' "$OUT/race_case.log" | cut -c1-80)"
      grep -E "^FAIL|hazard" "$OUT/race_case.log" | head -3; done
    for rep in $(seq 1 ${ROUNDS:-2}); do for e in $KDA_MULTI; do
      echo "== $e ($rep)"; env $(envof "$e") timeout 90 "$(bin "$e")/kda_bench" 2>&1 | grep -E "^\(|^# first call"; done; done
    for e in ${PRECISE:-$KDA_MULTI}; do echo "== $e, KDA_KDA_PRECISE=1"; env $(envof "$e") KDA_KDA_PRECISE=1 timeout 90 "$(bin "$e")/kda_bench" 2>&1 | grep "fwd+bwd"; done
    IFS='|' read -r -a hvars <<< "${HYBRID_ARGS:-}"; [ ${#hvars[@]} -gt 0 ] || hvars=("")
    for ha in "${hvars[@]}"; do for n in ${HYBRID:-}; do echo "== hybrid S 64x512${ha:+ $ha}, $n"
      env $(envof "$n") timeout 120 "$(bin "$n")/kda" --trust benches/gpt_bench.lua size=S batch=64 seq=512 arch=hybrid steps=120 check=0 $ha 2>&1 | grep -E "^(kda|#)" | tail -4; done; done
    last=$(echo $KDA_MULTI | awk '{print $NF}')
    for e in $([ "${PHASES_ALL:-0}" = 1 ] && echo $KDA_MULTI || echo $last); do for sh in ${PSHAPES:-0}; do
      echo "== $e phases, shape $sh (0: (8,2048,16,128))"
      [ -x "$(bin "$e")/kda_bench_phases" ] || { echo "no kda_bench_phases in $e's pack (kda_baseline.sh PACK)"; continue; }
      env $(envof "$e") KDA_BENCH_SHAPE=$sh timeout 90 "$(bin "$e")/kda_bench_phases" 2>&1 | grep -vE "^(#|\(|shape)"; done; done
    for e in $([ "${KTIMES_ALL:-0}" = 1 ] && echo $KDA_MULTI || echo $last); do for sh in ${KTIMES:-}; do
      echo "== kernel times, $e, shape $sh (ncu gpu__time_duration, warm launches, each kernel alone)"
      env $(envof "$e") KDA_BENCH_SHAPE=$sh timeout 90 ncu --metrics gpu__time_duration.sum --launch-skip ${KSKIP:-60} \
        --launch-count ${KCOUNT:-40} --csv "$(bin "$e")/kda_bench" 2>/dev/null | python3 benches/ncu_times.py | tail -2; done; done
    for k in ${NCU:-}; do echo "== ncu $k, $last (shape ${SHAPE:-0})"   # each kernel's details + stall/opcode mix
      env $(envof "$last") KDA_BENCH_SHAPE=${SHAPE:-0} timeout 90 ncu --set full -k "regex:^$k" --launch-skip 2 --launch-count 1 \
        -f -o /tmp/ncu_$k "$(bin "$last")/kda_bench" > /dev/null 2>&1; echo "ncu rc=$?"
      ncu -i /tmp/ncu_$k.ncu-rep --page details 2>&1 | grep -E "Duration|Registers Per|Issue Slots Busy|No Eligible|Executed Ipc A|DRAM Throughput|Memory Throughput|L2 Hit Rate|L1/TEX Hit Rate"
      ncu -i /tmp/ncu_$k.ncu-rep --page source --csv --print-source sass > /tmp/ncu_$k.csv 2>&1
      python3 benches/ncu_sass_mix.py /tmp/ncu_$k.csv 2>&1 | head -50; done
  } >> "$OUT/kda_multi.log" 2>&1
  cat "$OUT/kda_multi.log"
fi

if [ "$MODE" = ncu_source ]; then
  build_kda
  KDA_BENCH_SHAPE=${SHAPE:-0} timeout 300 ncu --set full --import-source yes -k "regex:${KERNEL:?}" --launch-skip 3 \
    --launch-count 1 -f -o /tmp/kda_prof build/kda_gpu/kda_bench > "$OUT/ncu_run.log" 2>&1; echo "ncu rc=$?"
  ncu -i /tmp/kda_prof.ncu-rep --page details > "$OUT/ncu_details.txt" 2>&1
  ncu -i /tmp/kda_prof.ncu-rep --page source --csv --print-source cuda > "$OUT/ncu_source_cuda.csv" 2>&1
  ncu -i /tmp/kda_prof.ncu-rep --page source --csv --print-source sass > "$OUT/ncu_source_sass.csv" 2>&1
  python3 benches/ncu_sass_mix.py "$OUT/ncu_source_sass.csv" > "$OUT/ncu_mix.txt" 2>&1
  xz -f "$OUT"/ncu_source_*.csv; ls -la "$OUT"; head -60 "$OUT/ncu_details.txt"; cat "$OUT/ncu_mix.txt"
fi

if [ "$MODE" = sass_map ]; then   # per-source-line instruction counts of kernels (KERNELS: regexes; KDA_BIN=NAME)
  build_kda                      # every cubin's SASS with line info (nvdisasm -g) and ncu's per-instruction page a kernel
  mkdir -p /tmp/cubins && (cd /tmp/cubins && cuobjdump -xelf all "$KDA_HOME/build/kda_gpu/kda_bench" > /dev/null 2>&1)
  NVD=$(command -v nvdisasm || ls /usr/local/cuda*/bin/nvdisasm 2>/dev/null | head -1); echo "nvdisasm: $NVD"
  [ -n "$NVD" ] || echo "sass_map: no nvdisasm on this machine (the CUDA toolkit's bin): kernels_sass.txt.xz will be empty"
  for c in /tmp/cubins/*.cubin; do "$NVD" -g -c "$c" 2>/dev/null; done | xz > "$OUT/kernels_sass.txt.xz"
  for k in ${KERNELS:?}; do
    KDA_BENCH_SHAPE=${SHAPE:-0} timeout 200 ncu --section SourceCounters --section WarpStateStats -k "regex:^$k" --launch-skip 3 \
      --launch-count 1 -f -o /tmp/kda_sm build/kda_gpu/kda_bench > "$OUT/ncu_run.log" 2>&1; echo "ncu $k rc=$?"
    ncu -i /tmp/kda_sm.ncu-rep --page source --csv --print-source sass 2>&1 | xz > "$OUT/ncu_$k.csv.xz"
  done
  ls -la "$OUT"
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
stage done
