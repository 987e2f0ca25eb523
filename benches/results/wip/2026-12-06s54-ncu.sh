#!/usr/bin/env bash
# s54: ncu details (throughput, pipes, shared memory, stalls, instruction mix) of the intra and final
# kernels at (8,2048,16,128): main's k_intra_tc and k_bwd_final_wg, wip/pair54's k_intra_pair,
# wip/wu54's k_intra_tc. Run from the repository root on the device after device_run.sh kda_multi
# unpacked the sides (or it unpacks .devbuild/kda_packs_b54.tar.xz itself).
[ -x /tmp/kdabundle/lib ] || bash benches/device_run.sh other > /dev/null 2>&1
[ -d /tmp/kda_m54 ] || tar -xJf .devbuild/kda_packs_b54.tar.xz -C /tmp
export LD_LIBRARY_PATH=/tmp/kdabundle/lib:${LD_LIBRARY_PATH:-}
S="--section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables --section WarpStateStats --section InstructionStats --section Occupancy --section LaunchStats"
run() {  # NAME SIDE KERNEL ENV...
  local n=$1 sd=$2 k=$3; shift 3
  env "$@" KDA_BENCH_SHAPE=0 timeout 150 ncu $S -k "regex:^$k" --launch-skip 3 --launch-count 1 -f -o /tmp/ncu_$n /tmp/kda_$sd/bin/kda_bench > /dev/null 2>&1
  echo "== $n ($sd: $k) rc=$?"
  ncu -i /tmp/ncu_$n.ncu-rep --page details --print-details all > $OUT/ncu_$n.txt 2>&1 || ncu -i /tmp/ncu_$n.ncu-rep --page details > $OUT/ncu_$n.txt 2>&1
  grep -E "Duration|Issue Slots Busy|Issued Ipc|Executed Ipc A|SM Busy|Memory Throughput|Mem Busy|Mem Pipes Busy|Max Bandwidth|DRAM Throughput|No Eligible|Active Warps|Eligible Warps|Warp Cycles Per Issued" $OUT/ncu_$n.txt | head -24
}
run intra m54 k_intra_tc
run pair pr k_intra_pair KDA_KDA_PAIR=1
run intra_wu wu k_intra_tc
run final m54 k_bwd_final_wg
