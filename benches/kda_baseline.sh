#!/usr/bin/env bash
# benches/kda_baseline.sh [REV] — build the KDA kernels' test and benches (test_kda_cuda, kda_bench,
# kda_bench_phases) of git revision REV (default HEAD) in a scratch worktree and pack them as
# .devbuild/bundle_b.tar.xz: the "A" side of `benches/device_run.sh kda_ab`, whose "B" side is
# the working tree's bundle (benches/bundle.sh). One device call then measures both in one run.
set -euo pipefail
cd "$(dirname "$0")/.."
REV=${1:-HEAD}
WT=$(mktemp -d /tmp/kda_base.XXXXXX)
trap 'git worktree remove --force "$WT" >/dev/null 2>&1 || rm -rf "$WT"' EXIT
git worktree add -f --detach "$WT" "$REV" >/dev/null
(cd "$WT" && BUILD_ONLY=1 OUT=build/kda_gpu sh benches/kda_gpu.sh >/dev/null)
mkdir -p "$WT/st/bin" .devbuild
cp "$WT"/build/kda_gpu/{test_kda_cuda,kda_bench,kda_bench_phases} "$WT/st/bin/"
strip "$WT"/st/bin/*
git rev-parse --short "$REV" > "$WT/st/bin/REVISION"
tar -C "$WT/st" -cJf .devbuild/bundle_b.tar.xz bin
ls -la .devbuild/bundle_b.tar.xz
