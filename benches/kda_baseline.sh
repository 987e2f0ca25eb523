#!/usr/bin/env bash
# benches/kda_baseline.sh [REV] [NAME] — build the KDA kernels' test and benches (test_kda_cuda,
# kda_bench, kda_bench_phases) of git revision REV (default HEAD) in a scratch worktree and pack them.
# Without NAME: .devbuild/bundle_b.tar.xz, the "A" side of `benches/device_run.sh kda_ab` (whose "B"
# side is the working tree's bundle, benches/bundle.sh). With NAME: .devbuild/kda_NAME.tar.xz, one
# side of `device_run.sh kda_multi` (several revisions tested and benched in one device call);
# WITH_KDA=1 also packs that revision's ./kda (the CUDA build), for the hybrid step in kda_multi.
# PACK="kda_bench test_kda_cuda" packs only those of the three (default all): the device tool
# carries 64 MiB in all, a full pack is ~30 MB and kda_bench alone ~9.5 MB, so a kda_multi call of
# several sides packs kda_bench for each and the test (and the phases) only where they run.
set -euo pipefail
cd "$(dirname "$0")/.."
REV=${1:-HEAD}
NAME=${2:-}
PACK=${PACK:-test_kda_cuda kda_bench kda_bench_phases}
for f in $PACK; do case $f in test_kda_cuda|kda_bench|kda_bench_phases) ;;
  *) echo "kda_baseline.sh: PACK names '$f': use test_kda_cuda, kda_bench, kda_bench_phases" >&2; exit 2 ;; esac; done
SHORT=$(git rev-parse --short "$REV")   # now: HEAD may move while the build runs
WT=$(mktemp -d /tmp/kda_base.XXXXXX)
trap 'git worktree remove --force "$WT" >/dev/null 2>&1 || rm -rf "$WT"' EXIT
git worktree add -f --detach "$WT" "$SHORT" >/dev/null
(cd "$WT" && BUILD_ONLY=1 OUT=build/kda_gpu sh benches/kda_gpu.sh >/dev/null)
mkdir -p "$WT/st/bin" .devbuild
for f in $PACK; do cp "$WT/build/kda_gpu/$f" "$WT/st/bin/"; done
if [ "${WITH_KDA:-0}" = 1 ]; then
  (cd "$WT" && make -j2 kda >/dev/null) || { echo "kda_baseline.sh: make kda failed at $SHORT (run vendor/ first: its headers and LuaJIT)" >&2; exit 1; }
  cp "$WT/kda" "$WT/st/bin/"
fi
strip "$WT"/st/bin/*
echo "$SHORT" > "$WT/st/bin/REVISION"
TAR=.devbuild/bundle_b.tar.xz; [ -n "$NAME" ] && TAR=.devbuild/kda_$NAME.tar.xz
tar -C "$WT/st" -cf - bin | xz -9 -T2 > "$TAR"   # -9: the binaries' cubins share most of their bytes
ls -la "$TAR"
