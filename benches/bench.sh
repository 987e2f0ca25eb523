#!/usr/bin/env bash
# benches/bench.sh — `make bench`: every speed figure issues 3 and 4 ask for, in one run on one
# card, kda and its PyTorch peers side by side, each figure appended to benches/history.tsv
# (date, git revision, card, config, step index, figure). Needs a CUDA build (./kda,
# build/gpu/*; `make kda gpu-bins`), a GPU and python3 with torch; logs go to $OUT (default
# build/bench). Sizes: S (d 256, 8 layers, 4 heads) at 8x512 and 64x512, M (d 768, 12, 12) at
# 64x1024, L (d 2048, 20, 16) at 16x2048. SIZES="S M" skips L; RACE=1 adds the quality race
# (needs the full prose domain: CORPUS=dir holding prose.txt and MANIFEST); KDA_KERNELS=0 leaves
# out the KDA kernels' stage (to fit one 10-minute device call).
#   1. the CUDA op tests (the bench stops if they fail: a wrong kernel's speed means nothing)
#   2. op micro-benchmarks; the KDA kernels' test and bench beside PyTorch SDPA
#   3. per size: kda (graph, steps run back to back) and the peer in eager, torch.compile and,
#      at S, torch.compile mode reduce-overhead; the ratio to the best peer mode and its target
set -u
cd "$(dirname "$0")/.."
KDA=${KDA:-$PWD/kda}
BIN=${BIN:-build/gpu}
OUT=${OUT:-build/bench}
HIST=${HIST:-benches/history.tsv}
SIZES=${SIZES:-S M L}
mkdir -p "$OUT"
if ! nvidia-smi >/dev/null 2>&1; then echo "bench: no GPU answers (nvidia-smi): run make bench on the H200"; exit 2; fi
[ -x "$KDA" ] && [ -x "$BIN/test_cuda_ops" ] || { echo "bench: build first: make kda gpu-bins"; exit 2; }
python3 -c "import torch" 2>/dev/null || { echo "bench: python3 with torch is needed for the peers"; exit 2; }
REV=${REV:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
CARD=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
DAY=$(date +%F)
row() { printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$DAY" "$REV" "$CARD" "$1" "$2" "$3" >> "$HIST"; echo "  + $1 | $2 | $3"; }
stage() { echo; echo "=== $1 ($(date +%T))"; }
field() { sed -n "s#.*$1.*#\1#p" | head -1; }   # field 'regex with one \(group\)' < text

stage "CUDA op tests"
KDA_CUDA_SYNC=1 timeout 300 "$BIN/test_cuda_ops" > "$OUT/test_cuda_ops.log" 2>&1
tail -1 "$OUT/test_cuda_ops.log"
grep -q " 0 failed" "$OUT/test_cuda_ops.log" || { echo "bench: the CUDA op tests fail ($OUT/test_cuda_ops.log): no figures taken"; exit 1; }

stage "op micro-benchmarks; KDA kernels beside SDPA"
timeout 300 "$BIN/cuda_ops_bench" > "$OUT/ops_bench.log" 2>&1; tail -5 "$OUT/ops_bench.log"
grep -E "^\| attention" "$OUT/ops_bench.log" | while read -r line; do row "kda attention (benches/cuda_ops_bench.cu)" "median" "$line"; done
if [ "${KDA_KERNELS:-1}" != 0 ]; then   # KDA_KERNELS=0 leaves out the KDA kernels' build, test and bench (~4 min)
  OUT=$OUT timeout 900 sh benches/kda_gpu.sh > "$OUT/kda_gpu.log" 2>&1; echo "kda_gpu.sh rc=$?"
  grep -E "passed, " "$OUT/kda_test.log" | tail -1
  while read -r shape mode first med graph tf gb mt wall fx; do
    case "$shape" in \(*) row "kda KDA $mode $shape bf16 (benches/kda_bench.cu)" "median" "$med ms (graph $graph ms; first call $first ms, ${fx}x a warm call's $wall ms wall-clock); $tf TFLOP/s";; esac
  done < "$OUT/kda_bench.log"
  grep -E "^\(" "$OUT/kda_attn_peer.log" 2>/dev/null | head -8 | while read -r line; do row "PyTorch attention peer (benches/peers/kda_attn_peer.py)" "median" "$line"; done
fi

# kda_line SIZE B T [ARCH] -> appends the row, echoes the warm step in ms
kda_step() {
  local size=$1 b=$2 t=$3 arch=${4:-gpt} steps=${5:-200} line
  line=$(timeout 600 "$KDA" --trust benches/gpt_bench.lua size=$size batch=$b seq=$t arch=$arch steps=$steps check=0 2>&1 | grep -E "^kda " | tail -1)
  echo "$line" >> "$OUT/steps.log"
  [ -n "$line" ] || { echo "bench: kda $size ${b}x$t failed (see $OUT/steps.log)" >&2; return 1; }
  local ms tok mfu first peak util
  ms=$(field 'pipelined) \([0-9.]*\) ms' <<<"$line"); tok=$(field '| \([0-9.]*\) M tok/s' <<<"$line")
  mfu=$(field 'MFU \([0-9.]*\)%' <<<"$line"); first=$(field 'first step \([0-9.]*\) s' <<<"$line")
  peak=$(field 'peak mem \([0-9.]*\) GiB' <<<"$line"); util=$(field 'GPU util \([0-9]*\)%' <<<"$line")
  row "kda $arch $size ${b}x$t (graph, steps back to back)" "mean steps 51..$((steps - 1))" \
      "$ms ms; $tok M tok/s; MFU $mfu%; first step $first s; peak $peak GiB; GPU util $util%" >&2
  echo "$ms"
}
# peer_step SIZE-ARGS MODE STEPS LABEL -> appends the row, echoes the warm median in ms
peer_step() {
  local args=$1 mode=$2 steps=$3 label=$4 log
  log=$(timeout 900 python3 benches/peers/gpt_peer.py $args --steps "$steps" --mode "$mode" 2>&1)
  echo "$log" >> "$OUT/peers.log"
  local ms tok mfu first peak
  ms=$(field 'warm median step: \([0-9.]*\) ms' <<<"$log"); tok=$(field 'tokens/s: \([0-9]*\)' <<<"$log")
  mfu=$(field 'MFU: \([0-9.]*\) %' <<<"$log"); first=$(field 'time to first step: \([0-9.]*\) s' <<<"$log")
  peak=$(field 'peak memory: \([0-9.]*\) GiB' <<<"$log")
  [ -n "$ms" ] || { echo "bench: peer $label $mode failed (see $OUT/peers.log)" >&2; return 1; }
  row "PyTorch peer $label $mode (benches/peers/gpt_peer.py)" "median steps 50..$((steps - 1))" \
      "$ms ms; $tok tok/s; MFU $mfu%; first step $first s; peak $peak GiB" >&2
  echo "$ms"
}
# compare LABEL KDA_MS TARGET PEER_MS... -> the ratio row against the fastest peer mode
compare() {
  local label=$1 k=$2 target=$3; shift 3
  local best="" p
  for p in "$@"; do [ -n "$p" ] && { [ -z "$best" ] || awk "BEGIN{exit !($p < $best)}"; } && best=$p; done
  [ -n "$k" ] && [ -n "$best" ] || return 0
  row "kda / best PyTorch mode, $label" "same run" "$(awk "BEGIN{printf \"%.2fx (kda %s ms, peer %s ms; target %s)\", $best / $k, $k, $best, \"$target\"}")"
}

for size in $SIZES; do
  case $size in
  S)
    stage "S 8x512 and 64x512"
    sargs="--d 256 --layers 8 --heads 4 --seq 512"
    k8=$(kda_step S 8 512); k64=$(kda_step S 64 512)
    kh=$(kda_step S 64 512 hybrid 120)
    e8=$(peer_step "$sargs --batch 8" eager 120 "S 8x512"); c8=$(peer_step "$sargs --batch 8" compile 120 "S 8x512")
    r8=$(peer_step "$sargs --batch 8" reduce-overhead 120 "S 8x512")
    c64=$(peer_step "$sargs --batch 64" compile 120 "S 64x512"); r64=$(peer_step "$sargs --batch 64" reduce-overhead 120 "S 64x512")
    compare "S 8x512" "$k8" ">= 3x" "$e8" "$c8" "$r8"
    compare "S 64x512" "$k64" ">= 2x" "$c64" "$r64"
    compare "S 64x512, kda's KDA hybrid vs the peer's GPT" "$kh" "(context)" "$c64" "$r64" ;;
  M)
    stage "M 64x1024"
    km=$(kda_step M 64 1024 gpt 70)
    margs="--d 768 --layers 12 --heads 12 --batch 64 --seq 1024"
    em=$(peer_step "$margs" eager 70 "M 64x1024"); cm=$(peer_step "$margs" compile 70 "M 64x1024")
    compare "M 64x1024" "$km" ">= 1.3x torch.compile" "$cm" "$em" ;;
  L)
    stage "L 16x2048"
    kl=$(kda_step L 16 2048 gpt 60)
    largs="--d 2048 --layers 20 --heads 16 --batch 16 --seq 2048"
    cl=$(peer_step "$largs" compile 60 "L 16x2048")
    compare "L 16x2048" "$kl" ">= 1.15x torch.compile" "$cl" ;;
  esac
done

if [ "${RACE:-0}" = 1 ]; then
  stage "quality race (issue 5)"
  C=${CORPUS:-data/full}
  [ -f "$C/prose.txt" ] || { echo "bench: RACE=1 needs $C/prose.txt (make data, or CORPUS=dir)"; exit 1; }
  timeout 600 python3 benches/peers/gpt_peer.py --d 256 --layers 8 --heads 4 --batch 64 --seq 512 --mode reduce-overhead \
    --lr 3e-3 --data "$C/prose.txt" --window 1048576 --tokens 150e6 --eval-every 500 2>&1 | grep -E "^(#|race)" > "$OUT/race_peer.log"
  (cd "$OUT" && timeout 900 "$KDA" --trust "$OLDPWD/benches/race.lua" corpus="$OLDPWD/$C" eval_every=500 max_seconds=${RACE_SECONDS:-300} 2>&1) \
    | grep -E "^(#|race)" > "$OUT/race_kda.log"
  pb=$(tail -1 "$OUT/race_peer.log" | field 'bpb \([0-9.]*\)'); ps=$(tail -1 "$OUT/race_peer.log" | field 'train_seconds \([0-9.]*\)')
  row "quality race: PyTorch peer GPT reduce-overhead, prose, window last 1 MiB, 64x512, 150M bytes" "final eval" "$pb BPB in $ps s"
  hit=$(awk -v b="$pb" '$NF + 0 <= b + 0 && /^race:/ {print; exit}' "$OUT/race_kda.log")
  if [ -n "$hit" ]; then
    ks=$(field 'train_seconds \([0-9.]*\)' <<<"$hit")
    row "quality race: kda KDA hybrid, same bytes and window" "$(field 'step \([0-9]*\)' <<<"$hit")" \
        "$(field 'bpb \([0-9.]*\)' <<<"$hit") BPB at $ks s = $(awk "BEGIN{printf \"%.2f\", $ks / $ps}")x the peer's time (target <= 0.4x)"
  else
    row "quality race: kda KDA hybrid, same bytes and window" "last eval" "did not reach $pb BPB: $(tail -1 "$OUT/race_kda.log")"
  fi
fi
stage "done: rows appended to $HIST, logs in $OUT"
