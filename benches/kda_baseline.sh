#!/usr/bin/env bash
# benches/kda_baseline.sh [REV] [NAME] — build the KDA kernels' test and benches (test_kda_cuda,
# kda_bench, kda_bench_phases) of git revision REV (default HEAD) in a scratch worktree and pack them.
# Without NAME: .devbuild/bundle_b.tar.xz, the "A" side of `benches/device_run.sh kda_ab` (whose "B"
# side is the working tree's bundle, benches/bundle.sh). With NAME: .devbuild/kda_NAME.tar.xz, one
# side of `device_run.sh kda_multi` (several revisions tested and benched in one device call);
# WITH_KDA=1 also packs that revision's ./kda (the CUDA build), for the hybrid step in kda_multi.
set -euo pipefail
cd "$(dirname "$0")/.."
REV=${1:-HEAD}
NAME=${2:-}
SHORT=$(git rev-parse --short "$REV")   # now: HEAD may move while the build runs
WT=$(mktemp -d /tmp/kda_base.XXXXXX)
trap 'git worktree remove --force "$WT" >/dev/null 2>&1 || rm -rf "$WT"' EXIT
git worktree add -f --detach "$WT" "$SHORT" >/dev/null
(cd "$WT" && BUILD_ONLY=1 OUT=build/kda_gpu sh benches/kda_gpu.sh >/dev/null)
mkdir -p "$WT/st/bin" .devbuild
cp "$WT"/build/kda_gpu/{test_kda_cuda,kda_bench,kda_bench_phases} "$WT/st/bin/"
if [ "${WITH_KDA:-0}" = 1 ]; then (cd "$WT" && make -j2 kda >/dev/null) && cp "$WT/kda" "$WT/st/bin/"; fi
strip "$WT"/st/bin/*
echo "$SHORT" > "$WT/st/bin/REVISION"
TAR=.devbuild/bundle_b.tar.xz; [ -n "$NAME" ] && TAR=.devbuild/kda_$NAME.tar.xz
tar -C "$WT/st" -cJf "$TAR" bin
ls -la "$TAR"
