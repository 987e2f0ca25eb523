#!/usr/bin/env bash
# s54f: wip/sw54 (k_bwd_final_wg with swizzled G, dG, dKb tiles) against main ae720a2 (mw) in a
# short call: the quick test of sw, two rounds of kda_bench at (8,2048,16,128) each, phases of both
bash benches/device_run.sh other > /dev/null 2>&1
tar -xJf .devbuild/kda_packs_e54.tar.xz -C /tmp
export LD_LIBRARY_PATH=/tmp/kdabundle/lib:${LD_LIBRARY_PATH:-}
cat /tmp/kda_mw/bin/REVISION /tmp/kda_sw/bin/REVISION
timeout 100 /tmp/kda_sw/bin/test_kda_cuda quick > $OUT/kda_test_quick.log 2>&1; echo "quick test rc=$?"
grep -E "^FAIL|passed, " $OUT/kda_test_quick.log | head -8
for i in 1 2; do for s in mw sw; do echo "== $s ($i)"; KDA_BENCH_SHAPE=0 timeout 40 /tmp/kda_$s/bin/kda_bench 2>&1 | grep "^(8,2048"; done; done
for s in mw sw; do echo "== $s phases"; KDA_BENCH_SHAPE=0 timeout 40 /tmp/kda_$s/bin/kda_bench_phases 2>&1 | grep -E "^bwd_final"; done
