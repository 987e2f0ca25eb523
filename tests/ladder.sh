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
  # "beats rung N's curve at equal tokens": rung 2 reads rung 1's evaluations from its run
  cat > "$tmp/cmp.lua" <<EOF
local prof = { corpus = "$root/data/small", rungs = {
  { name = "a", domain = "prose", bar = { order = 1 }, model = { arch = "gpt", d = 32, layers = 1, heads = 1 },
    batch = 8, seq = 32, tokens = 12800, eval_every = 25 },
  { name = "b", domain = "prose", bar = { order = 1 }, compare = 1, model = { arch = "gpt", d = 48, layers = 2, heads = 2 },
    batch = 8, seq = 32, tokens = 6400 } } }
require("kda.ladder").run(prof, { rung = 1, fresh = true })
return require("kda.ladder").run(prof, { rung = 2 })
EOF
  out=$(cd "$tmp" && "$root/kda" --trust cmp.lua 2>&1)
  if grep -qE "rung 2: [0-9.]+ bpb vs rung 1's curve at 6400 tokens: [0-9.]+" <<<"$out"; then
    pass=$((pass+1)); echo "ok - a rung compares itself with an earlier rung's curve at equal tokens"
  else
    fail=$((fail+1)); echo "FAIL - curve comparison:"; grep -E "^rung" <<<"$out" | tail -4
  fi
  # a recipe pins a domain to its bytes: "prose@<sha256 prefix from MANIFEST>"
  sum=$(awk '$1 == "domain" && $2 == "prose" { print substr($4, 1, 12) }' "$root/data/small/MANIFEST")
  good=$(cd "$tmp" && "$root/kda" -e "local d = require('kda.data').open{manifest='$root/data/small', domains={'prose@$sum'}}; print('opened', d:domains()[1].name)" 2>&1)
  badp=$(cd "$tmp" && "$root/kda" -e "require('kda.data').open{manifest='$root/data/small', domains={'prose@0123456789ab'}}" 2>&1)
  if grep -qE "opened\s+prose" <<<"$good" && grep -q "the recipe asks for 0123456789ab" <<<"$badp"; then
    pass=$((pass+1)); echo "ok - a pinned domain opens only with the bytes its checksum names"
  else
    fail=$((fail+1)); echo "FAIL - domain pin: $good / $badp"
  fi
fi
if [ $skip -gt 0 ]; then echo "$pass passed, $fail failed, $skip skipped"; else echo "$pass passed, $fail failed"; fi
[ $fail -eq 0 ]
