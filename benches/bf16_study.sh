#!/usr/bin/env bash
# benches/bf16_study.sh — the precision cost of storing the fast backward's fp32 intermediates in
# bf16 (the dQ, dKi scratch; dW, dKb, dA, dL; the kept Kb, M; the final kernel's flat products' operands), on the CPU: builds benches/bf16_study.c against
# core/kda_ref.c and against a copy of it patched by benches/results/wip/2026-12-04s45-bf16study.patch
# (its public functions renamed *_b16), once per intermediate, and runs each.
# Needs gcc and patch; no GPU. Prints one line of RMS ratios a case.
set -euo pipefail
cd "$(dirname "$0")/.."
T=$(mktemp -d /tmp/kda_bf16.XXXXXX)
trap 'rm -rf "$T"' EXIT
cp core/kda_ref.c "$T/kda_ref_b16.c"
patch -s "$T/kda_ref_b16.c" < benches/results/wip/2026-12-04s45-bf16study.patch ||
  { echo "bf16_study.sh: the study patch no longer applies to core/kda_ref.c: redo it against the current file" >&2; exit 1; }
REN=""
for f in kda_kda_nseq kda_kda_check_args kda_kdaref_forward kda_kdaref_backward kda_kdaref_recurrent64 \
         kda_kdaref_recurrent64_backward kda_kdaref_step kda_convref_forward kda_convref_backward kda_convref_step; do
  REN="$REN -D$f=${f}_b16"
done
CF="-O2 -std=c11 -Icore -Wall"
gcc $CF -c -o "$T/a.o" core/kda_ref.c
gcc $CF -c -o "$T/u.o" core/util.c
# the control first: the patched sums with the rounding off (B16_IDENTITY) must match the
# reference to fp32 summation order (~1e-7), else the patch changed more than the rounding; then
# one intermediate at a time (B16_MASK, the patch's list)
for v in "control:-DB16_IDENTITY:rounding off (control)" "m1:-DB16_MASK=1:the dQ, dKi scratch" "m2:-DB16_MASK=2:dW" \
         "m4:-DB16_MASK=4:dKb" "m8:-DB16_MASK=8:dA" "m16:-DB16_MASK=16:dL" "m32:-DB16_MASK=32:the kept Kb (mat's dW Kb^T)" \
         "m64:-DB16_MASK=64:the kept M (mat's four products)" \
         "m128:-DB16_MASK=128:the final kernel's flat form on bf16 operands" \
         "m256:-DB16_MASK=256:the final kernel's flat form on tf32 operands"; do
  n=${v%%:*} r=${v#*:}; fl=${r%%:*} lab=${r#*:}
  gcc $CF $REN $fl -c -o "$T/b.o" "$T/kda_ref_b16.c"
  gcc $CF "-DSTUDY_LABEL=\"$lab\"" $([ $n = control ] && echo -DB16_CONTROL) -o "$T/$n" benches/bf16_study.c "$T/a.o" "$T/b.o" "$T/u.o" -lm
  echo "== $n"; "$T/$n"
done
