#!/usr/bin/env bash
# vendor/install.sh — installs kda's build dependencies from Debian packages (no source is
# copied into the repository). The CUDA toolkit is optional: when nvcc is present, make also
# builds kernels/ for sm_90; without it the binary runs on the CPU backend.
set -euo pipefail
cd "$(dirname "$0")"
pkgs=$(grep -v '^#' packages.txt | xargs)
missing=()
for p in $pkgs; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -eq 0 ]; then echo "vendor: all packages present"; exit 0; fi
SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
echo "vendor: installing ${missing[*]}"
$SUDO apt-get update -qq || { echo "vendor: apt-get update failed: check the network or the Debian mirror" >&2; exit 1; }
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null \
  || { echo "vendor: apt-get install failed for: ${missing[*]}" >&2; exit 1; }
echo "vendor: done"
