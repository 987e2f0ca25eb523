#!/usr/bin/env bash
# tests/ladder.sh — the cpu ladder's first rung, as the README's main command runs it, in a
# scratch folder (so runs/ladder of the checkout is untouched). Needs data/small (make data-small);
# without it the check is reported as skipped. Ends with "N passed, N failed[, N skipped]".
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
pass=0 fail=0 skip=0
if [ ! -f "$root/data/small/MANIFEST" ]; then
  echo "ok - cpu ladder rung 1 # skip: data/small missing (make data-small)"; skip=1
else
  out=$(cd "$tmp" && "$root/kda" "$root/recipes/ladder.lua" --profile cpu --rung 1 --fresh \
        --set corpus="$root/data/small" 2>&1); rc=$?
  if [ $rc -eq 0 ] && grep -q "^| 1 | .* | pass |" <<<"$out" && [ -f "$tmp/runs/ladder/results.tsv" ]; then
    pass=$((pass+1)); echo "ok - cpu ladder rung 1 passes its bar and is recorded in runs/ladder"
  else
    fail=$((fail+1)); echo "FAIL - cpu ladder rung 1: rc=$rc"; tail -5 <<<"$out"
  fi
  # a later call keeps what the first recorded (rung 2 here on a token budget too small to pass)
  (cd "$tmp" && "$root/kda" "$root/recipes/ladder.lua" --profile cpu --rung 2 --set rungs.2.tokens=2048 \
      --set corpus="$root/data/small" >/dev/null 2>&1)
  if grep -q "^1	.*	pass	" "$tmp/runs/ladder/results.tsv" && grep -q "^2	.*	fail	" "$tmp/runs/ladder/results.tsv"; then
    pass=$((pass+1)); echo "ok - a later call keeps the recorded result and adds its own"
  else
    fail=$((fail+1)); echo "FAIL - results.tsv after two calls:"; cat "$tmp/runs/ladder/results.tsv"
  fi
fi
if [ $skip -gt 0 ]; then echo "$pass passed, $fail failed, $skip skipped"; else echo "$pass passed, $fail failed"; fi
[ $fail -eq 0 ]
