#!/usr/bin/env bash
# benches/kda_baseline.sh [REV] [NAME] — build the KDA kernels' test and benches (test_kda_cuda,
# kda_bench, kda_bench_phases) of git revision REV (default HEAD) in a scratch worktree and pack them.
# Without NAME: .devbuild/bundle_b.tar.xz, the "A" side of `benches/device_run.sh kda_ab` (whose "B"
# side is the working tree's bundle, benches/bundle.sh). With NAME: .devbuild/kda_NAME.tar.xz, one
# side of `device_run.sh kda_multi` (several revisions tested and benched in one device call);
# WITH_KDA=1 also packs that revision's ./kda (the CUDA build), for the hybrid step in kda_multi.
# KFLAGS_<file>="..." (e.g. KFLAGS_kda_tc_bwd="-Xptxas --register-usage-level=3") builds that
# kernel file with those extra options (kda_gpu.sh's hook); REVISION then names them.
# PACK="kda_bench test_kda_cuda" packs only those of the three (default all): the device tool
# carries 64 MiB in all, a full pack is ~30 MB and kda_bench alone ~9.5 MB, so a kda_multi call of
# several sides packs kda_bench for each and the test (and the phases) only where they run.
# SHARED=1 (with NAME): the binaries go to .devbuild/packs/kda_NAME instead of a pack of their own;
# then `benches/kda_baseline.sh --shared` packs every side staged there into one archive,
# .devbuild/kda_packs.tar.xz (`--shared TAG NAME[:BIN,BIN]...`: those sides, or only those binaries
# of a side, into kda_packs_TAG.tar.xz),
# which device_run.sh kda_multi unpacks first (every kda_packs*.tar.xz the call carries). When the
# sides' binaries shared most of their bytes one archive was far smaller (2026-12-04: five
# kda_bench sides, one with its test, 48 MB in five packs, 12.5 MB in one); on 2026-12-06 two
# builds differed nearly everywhere and each binary cost ~6 MB packed: pack only what runs.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = --shared ]; then
  # --shared [TAG NAME...]: only the sides named, into .devbuild/kda_packs_TAG.tar.xz, so that
  # two device calls carry two archives when one would pass the 64 MiB carry limit
  [ -d .devbuild/packs ] || { echo "kda_baseline.sh --shared: nothing staged in .devbuild/packs (run it with SHARED=1 REV NAME first)" >&2; exit 2; }
  # NAME:BIN,BIN (e.g. m66:kda_bench,kda_bench_phases) packs only those of the side's binaries:
  # builds are no longer byte-identical outside the changed kernels, so xz finds little shared
  # between sides and a full side is ~18 MB; a side that only benches needs kda_bench (~6 MB)
  OUTA=.devbuild/kda_packs.tar.xz FILES=$(ls .devbuild/packs)
  if [ $# -ge 2 ]; then
    OUTA=.devbuild/kda_packs_$2.tar.xz; shift 2; FILES=""
    [ $# -ge 1 ] || { echo "kda_baseline.sh --shared TAG: name the sides to pack after the tag (--shared TAG NAME[:BIN,BIN]...)" >&2; exit 2; }
    for a in "$@"; do n=${a%%:*}
      [ -d .devbuild/packs/kda_$n ] || { echo "kda_baseline.sh --shared: side '$n' is not staged (.devbuild/packs/kda_$n)" >&2; exit 2; }
      case $a in *:*) FILES="$FILES kda_$n/bin/REVISION"
        for b in $(echo "${a#*:}" | tr ',' ' '); do [ -f .devbuild/packs/kda_$n/bin/$b ] ||
          { echo "kda_baseline.sh --shared: side '$n' has no '$b' (staged: $(ls .devbuild/packs/kda_$n/bin | tr '\n' ' '))" >&2; exit 2; }
          FILES="$FILES kda_$n/bin/$b"; done ;;
        *) FILES="$FILES kda_$n" ;; esac; done
  fi
  tar -C .devbuild/packs -cf - $FILES | xz -9 -T2 > $OUTA   # by name: not "." (its mode would land on /tmp)
  echo $FILES; ls -la $OUTA
  # what a call carrying it would send: the tracked and untracked-not-ignored files, the bundle, it
  tree=$(git ls-files -z --cached --others --exclude-standard | xargs -0 stat -c %s 2>/dev/null | awk '{t += $1} END {print t + 0}')
  bun=$(stat -c %s .devbuild/bundle.tar.xz 2>/dev/null || echo 0)
  tot=$((tree + bun + $(stat -c %s $OUTA)))
  echo "with the working tree ($tree bytes) and .devbuild/bundle.tar.xz ($bun): $tot of the device's 67108864 (64 MiB)"
  [ $tot -lt 67108864 ] || echo "kda_baseline.sh --shared: a call carrying $OUTA and the bundle would send over the device's 64 MiB: pack fewer sides (--shared TAG NAME...)" >&2
  exit 0
fi
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
{ echo "$SHORT"; env | grep '^KFLAGS_' || true; } | paste -sd' ' > "$WT/st/bin/REVISION"   # the revision and any per-file flags (kda_gpu.sh)
if [ "${SHARED:-0}" = 1 ]; then
  [ -n "$NAME" ] || { echo "kda_baseline.sh: SHARED=1 needs a NAME" >&2; exit 2; }
  rm -rf .devbuild/packs/kda_$NAME && mkdir -p .devbuild/packs/kda_$NAME && cp -r "$WT/st/bin" .devbuild/packs/kda_$NAME/
  echo "staged .devbuild/packs/kda_$NAME ($SHORT); pack them all with benches/kda_baseline.sh --shared"
  exit 0
fi
TAR=.devbuild/bundle_b.tar.xz; [ -n "$NAME" ] && TAR=.devbuild/kda_$NAME.tar.xz
tar -C "$WT/st" -cf - bin | xz -9 -T2 > "$TAR"   # -9: the binaries' cubins share most of their bytes
ls -la "$TAR"
