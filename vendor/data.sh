#!/usr/bin/env bash
# vendor/data.sh — build the kda corpus from Debian packages.
#
#   bash vendor/data.sh small     # data/small/{prose,code,dna,math}.txt + MANIFEST  (~16 MB, ~1 min)
#   bash vendor/data.sh full      # data/{prose,code,dna,math}.txt + MANIFEST        (GBs, minutes)
#
# Packages are fetched with `apt-get download` into .cache/debs/ and unpacked with
# `dpkg-deb -x` into .cache/x/ (both git-ignored); nothing is installed. The only network
# access is the package archive, and a .deb already in .cache/debs is reused without it.
#
# Determinism: file lists are sorted under LC_ALL=C, every transform is a pure function of the
# package bytes, and MANIFEST holds no dates, so a second run writes the same MANIFEST byte for
# byte. The held-out window of a domain is its tail (core/data.c), so the order of sources
# below decides what is held out: the last source of each domain is the evaluation text.
# See docs/data.md for sources, licences and how to add your own domain.
set -euo pipefail
export LC_ALL=C

die() { echo "data.sh: $*" >&2; exit 1; }

PROFILE=${1:-small}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE=$ROOT/.cache
case "$PROFILE" in
  small) OUT=$ROOT/data/small; CAP=$((4 * 1024 * 1024)) ;;
  full)  OUT=$ROOT/data;       CAP=0 ;;
  *) die "unknown profile '$PROFILE': use 'small' or 'full'" ;;
esac
for tool in apt-get dpkg-deb sha256sum zcat tar xz awk; do
  command -v "$tool" >/dev/null || die "missing tool '$tool': apt-get install it (Debian 12 is assumed)"
done
mkdir -p "$CACHE/debs" "$CACHE/x" "$OUT"
TMP=$(mktemp -d); trap 'rm -rf "$TMP"' EXIT

in_archive() { apt-cache policy "$1" 2>/dev/null | grep 'Candidate: [^(]' >/dev/null; }

# apt-get update once per run, when a package is missing from the lists (needs root and network).
LISTS_REFRESHED=0
refresh_lists() {
  [ "$LISTS_REFRESHED" = 1 ] && return 0
  LISTS_REFRESHED=1
  local sudo=""; [ "$(id -u)" -ne 0 ] && sudo="sudo -n"
  echo "data.sh: refreshing the apt package lists" >&2
  $sudo apt-get update -qq >"$TMP/update.log" 2>&1 || echo "data.sh: apt-get update failed ($(tail -n 1 "$TMP/update.log"))" >&2
}

# fetch NAME -> prints the unpacked root of the package. Reuses a cached .deb (newest version).
fetch() {
  local name=$1 deb
  deb=$(ls "$CACHE/debs/${name}"_*.deb 2>/dev/null | sort -V | tail -n 1 || true)
  if [ -z "$deb" ]; then
    # (no grep -q: under pipefail, apt-cache dying of SIGPIPE would read as "not found")
    if ! in_archive "$name"; then
      refresh_lists   # a fresh machine may have no package lists yet
      in_archive "$name" ||
        die "package '$name' is not in the apt archive: run 'apt-get update' (needs network) or drop ${name}_*.deb into .cache/debs/"
    fi
    (cd "$CACHE/debs" && apt-get download "$name" >"$TMP/apt.log" 2>&1) ||
      die "cannot download '$name' ($(tail -n 1 "$TMP/apt.log")): check the network, or drop ${name}_*.deb into .cache/debs/"
    deb=$(ls "$CACHE/debs/${name}"_*.deb | sort -V | tail -n 1)
  fi
  local ver dir
  ver=$(dpkg-deb -f "$deb" Version) || die "corrupt package file $deb: delete it and run again"
  dir=$CACHE/x/${name}_${ver//:/%}
  if [ ! -e "$dir/.unpacked" ]; then
    rm -rf "$dir"; mkdir -p "$dir"
    dpkg-deb -x "$deb" "$dir" || die "cannot unpack $deb: delete it and run again"
    touch "$dir/.unpacked"
  fi
  echo "$name $ver" >>"$TMP/pkgs"   # for MANIFEST (fetch runs in subshells)
  echo "$dir"
}

# catz FILES... : concatenate, decompressing .gz/.dz (dictzip is gzip), in the given order.
catz() { local f; for f in "$@"; do case "$f" in *.gz|*.dz) zcat -- "$f" ;; *) cat -- "$f" ;; esac; done; }
# sorted list of files under DIR matching find expression
files() { local dir=$1; shift; find "$dir" -type f \( "$@" \) -print0 | sort -z | tr '\0' '\n'; }
# FASTA -> sequence only: drop headers, upper-case, anything but ACGT becomes N, drop all-N lines
# (assembly gaps carry no information), one line per record.
fasta() {
  catz "$@" | tr -d '\r' | awk '/^>/ { if (n) printf "\n"; n = 0; next }
    { $0 = toupper($0); gsub(/[^ACGTN]/, "N"); if ($0 ~ /^N*$/) next; printf "%s", $0; n = 1 }
    END { if (n) printf "\n" }'
}
cap() { if [ "$CAP" -gt 0 ]; then head -c "$CAP"; else cat; fi; }

# ---- sources, one function per domain; each writes the domain text to stdout -----------------
prose() {
  local d j f b
  if [ "$PROFILE" = full ]; then
    local g; g=$(fetch dict-gcide); catz "$g/usr/share/dictd/gcide.dict.dz"
  fi
  d=$(fetch dict-devil); catz "$d/usr/share/dictd/devil.dict.dz"
  j=$(fetch jargon-text); catz "$j/usr/share/doc/jargon-text/jargon.txt.gz"
  if [ "$PROFILE" = full ]; then
    local l; l=$(linux_tree)
    files "$l" -path '*/Documentation/*' -name '*.rst' ! -path '*/translations/*' | xargs -d '\n' cat --
  fi
  f=$(fetch fortunes)
  files "$f/usr/share/games/fortunes" ! -name '*.dat' ! -name '*.u8' | xargs -d '\n' cat --
  if [ "$PROFILE" = full ]; then      # the bible is stored in its own compressed format: use its reader
    local t r; t=$(fetch bible-kjv-text); r=$(fetch bible-kjv)
    "$r/usr/bin/bible" -l79 -p "$t/usr/lib" "Gen1:1-Rev22:21"
  fi
}

code() {
  if [ "$PROFILE" = full ]; then
    local l; l=$(linux_tree)
    files "$l" -name '*.c' -o -name '*.h' | xargs -d '\n' cat --
  else
    local h; h=$(fetch linux-libc-dev)
    files "$h/usr/include" -name '*.h' | xargs -d '\n' cat --
  fi
}

dna() {
  local a; a=$(fetch augustus-doc)
  if [ "$PROFILE" = full ]; then
    local s m v
    s=$(fetch smalt-examples); m=$(fetch maffilter-examples); v=$(fetch vt-examples)
    fasta "$m/usr/share/doc/maffilter/examples/Umaydis/Umaydis.fasta.gz"
    fasta "$s/usr/share/doc/smalt/test/data/genome_1.fa.gz" "$s/usr/share/doc/smalt/test/data/hs37chrXtrunc.fa.gz"
    fasta "$a/usr/share/doc/augustus/tutorial/data/chr2R.fa"
    fasta "$v/usr/share/doc/vt/examples/ref/20.fa.gz"
  else
    fasta "$a/usr/share/doc/augustus/tutorial/data/chr2R.2M-7M.fa"
  fi
}

math() {
  local p g; p=$(fetch pari-doc); g=$(fetch gretl-doc)
  if [ "$PROFILE" = full ]; then
    local b s; b=$(fetch texlive-latex-base-doc); s=$(fetch texlive-science-doc)
    files "$b" -name '*.tex' | xargs -d '\n' cat --
    files "$s" -name '*.tex' | xargs -d '\n' cat --
  fi
  files "$g/usr/share/doc/gretl" -name '*.tex' | xargs -d '\n' cat --
  files "$p/usr/share/pari/doc" -name '*.tex' | xargs -d '\n' cat --
}

# The linux-source package holds a tarball; unpack only the text we use, once.
linux_tree() {
  local s dir
  s=$(fetch linux-source-6.1)
  dir=$CACHE/x/linux-tree-$(basename "$s")
  if [ ! -e "$dir/.unpacked" ]; then
    rm -rf "$dir"; mkdir -p "$dir"
    tar -xJf "$s"/usr/src/linux-source-6.1.tar.xz -C "$dir" --wildcards '*.c' '*.h' '*.rst' ||
      die "cannot unpack the linux source tarball: delete $s and run again"
    touch "$dir/.unpacked"
  fi
  echo "$dir"
}

# ---- build -------------------------------------------------------------------------------------
echo "data.sh: building profile '$PROFILE' into ${OUT#$ROOT/}/" >&2
: >"$TMP/pkgs"
for dom in prose code dna math; do
  t0=$SECONDS
  $dom >"$TMP/$dom.raw"
  cap <"$TMP/$dom.raw" >"$OUT/$dom.txt.part"
  [ -s "$OUT/$dom.txt.part" ] || die "domain '$dom' came out empty: a package changed layout; see vendor/data.sh"
  mv "$OUT/$dom.txt.part" "$OUT/$dom.txt"
  echo "data.sh: $dom: $(stat -c %s "$OUT/$dom.txt") bytes ($((SECONDS - t0)) s)" >&2
done

{
  echo "# kda data manifest v1: lines 'package NAME VERSION' and 'domain NAME BYTES SHA256 FILE'"
  echo "profile $PROFILE"
  sort -u "$TMP/pkgs" | sed 's/^/package /'
  for dom in prose code dna math; do
    echo "domain $dom $(stat -c %s "$OUT/$dom.txt") $(sha256sum "$OUT/$dom.txt" | cut -d' ' -f1) $dom.txt"
  done
} >"$OUT/MANIFEST.part"
mv "$OUT/MANIFEST.part" "$OUT/MANIFEST"
echo "data.sh: wrote ${OUT#$ROOT/}/MANIFEST" >&2
