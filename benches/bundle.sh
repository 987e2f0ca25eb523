#!/usr/bin/env bash
# benches/bundle.sh — pack what a device run needs into .devbuild/bundle.tar.xz (git-ignored,
# carried by the device tool): ./kda (CUDA build, stripped), the GPU test and bench binaries,
# the KDA kernels' test and bench, the runtime libraries the H200 image may lack, and the small prose corpus.
# BASE=1: only the libraries and REVISION, no build (what `device_run.sh kda_multi` needs when
# every side it runs is a kda_NAME pack of benches/kda_baseline.sh and no HYBRID entry runs);
# BASE=1 DATA=1 adds the small prose corpus, which a HYBRID entry (gpt_bench) trains on.
set -euo pipefail
cd "$(dirname "$0")/.."
st=.devbuild/stage
rm -rf "$st"; mkdir -p "$st/bin" "$st/lib"
parts="bin lib"
if [ "${BASE:-0}" != 1 ]; then
  make -j2 kda gpu-bins >/dev/null
  BUILD_ONLY=1 OUT=build/kda_gpu sh benches/kda_gpu.sh >/dev/null   # the KDA kernels' test and bench, built here (nvcc, sm_90)
  cp kda build/gpu/test_cuda_ops build/gpu/cuda_ops_bench build/kda_gpu/test_kda_cuda build/kda_gpu/kda_bench build/kda_gpu/kda_bench_phases "$st/bin/"
  strip "$st/bin/"*
  mkdir -p "$st/data"; cp data/small/prose.txt "$st/data/"
  parts="bin lib data"
elif [ "${DATA:-0}" = 1 ]; then
  [ -f data/small/prose.txt ] || { echo "bundle.sh: DATA=1 needs data/small/prose.txt: run 'bash vendor/data.sh small' first" >&2; exit 2; }
  mkdir -p "$st/data"; cp data/small/prose.txt "$st/data/"
  parts="bin lib data"
fi
for l in libtinfo.so.6 libbsd.so.0 libmd.so.0 libgomp.so.1; do cp -L "/lib/x86_64-linux-gnu/$l" "$st/lib/"; done
git describe --always --dirty > "$st/bin/REVISION"   # the device copy's .git may be older: history rows name this
tar -C "$st" -cJf .devbuild/bundle.tar.xz $parts
rm -rf "$st"
ls -la .devbuild/bundle.tar.xz
