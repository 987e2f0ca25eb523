#!/usr/bin/env bash
# tests/run.sh — every CPU test (make test calls this after building):
#   C unit tests (build/tests/test_*), the same under ASan+UBSan (build/asan/test_*),
#   the Lua suite (tests/lua/run.lua), the CLI suite (tests/cli.sh), run dirs and checkpoints
#   (tests/lua/runs.lua, tests/runs.sh).
# Each prints "N passed, N failed"; this adds them up and ends with the total line.
set -u
cd "$(dirname "$0")/.."
total_pass=0 total_fail=0 broken=()

run_suite() {
  local name=$1; shift
  echo "== $name"
  local log rc
  log=$("$@" 2>&1); rc=$?
  echo "$log"
  local line p f
  line=$(grep -E '^[0-9]+ passed, [0-9]+ failed' <<<"$log" | tail -1)
  if [ -z "$line" ]; then
    broken+=("$name (rc=$rc, no summary line)")
    total_fail=$((total_fail + 1))
    return
  fi
  p=${line%% passed*}; f=${line#*passed, }; f=${f%% failed*}
  total_pass=$((total_pass + p)); total_fail=$((total_fail + f))
  if [ $rc -ne 0 ] && [ "$f" = 0 ]; then broken+=("$name (rc=$rc)"); total_fail=$((total_fail + 1)); fi
}

for t in build/tests/test_*; do run_suite "$(basename "$t")" "$t"; done
for t in build/asan/test_*; do
  run_suite "$(basename "$t") (asan+ubsan)" env ASAN_OPTIONS=detect_leaks=0 KDA_SKIP_SPEED=1 "$t"
done
run_suite "lua" ./kda --trust tests/lua/run.lua
run_suite "cli" bash tests/cli.sh
run_suite "lua runs" ./kda --trust tests/lua/runs.lua
run_suite "runs" bash tests/runs.sh
run_suite "ladder" bash tests/ladder.sh

for b in "${broken[@]}"; do echo "broken suite: $b"; done
echo "$total_pass passed, $total_fail failed"
[ $total_fail -eq 0 ]
