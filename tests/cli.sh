#!/usr/bin/env bash
# tests/cli.sh — the kda command as a user meets it: every bad input gives one clear line on
# stderr and a non-zero exit, never a crash. Ends with "N passed, N failed".
set -u
cd "$(dirname "$0")/.."
KDA=./kda
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pass=0 fail=0

# check NAME WANT_RC PATTERN -- command...   (stderr+stdout matched against PATTERN)
check() {
  local name=$1 want=$2 pat=$3; shift 4
  local out rc
  out=$("$@" 2>&1); rc=$?
  if [ "$want" = nonzero ] && [ $rc -ne 0 ] && [ $rc -lt 128 ] && grep -qE -e "$pat" <<<"$out"; then ok=1
  elif [ "$want" = 0 ] && [ $rc -eq 0 ] && grep -qE -e "$pat" <<<"$out"; then ok=1
  else ok=0; fi
  if [ $ok = 1 ]; then pass=$((pass+1)); echo "ok - $name"
  else fail=$((fail+1)); echo "FAIL - $name: rc=$rc output: $(head -c 300 <<<"$out")"; fi
}

printf 'local x = \n' > "$tmp/syntax.lua"
printf 'local a = 1\nerror("boom at line two")\n' > "$tmp/runtime.lua"
printf 'local g = kda.Graph()\nlocal a = g:param("a", {3,4})\nlocal b = g:param("b", {5,6})\nlocal c = a:matmul(b)\n' > "$tmp/shape.lua"
printf 'os.execute("true")\n' > "$tmp/exec.lua"
printf 'print("args", ...)\nprint(kda.args.set[1][1], kda.args.set[1][2])\n' > "$tmp/args.lua"
printf 'local r = kda.train { model = kda.nn.GPT { d = 16, layers = 1, heads = 2 }, data = { { path = "/usr/share/common-licenses", name = "l" } }, batch = 2, seq = 16, steps = 3, log_every = 3, eval_batches = 1 }\nprint("no-graph", kda.args.opts["no-graph"], r.steps)\n' > "$tmp/nograph.lua"

check "--version"                0 '^kda [0-9]+\.[0-9]+'                     -- $KDA --version
check "--help"                   0 'usage: kda'                               -- $KDA --help
check "-e runs code"             0 '^6$'                                      -- $KDA -e 'print(2*3)'
check "-e with the REPL example" 0 'kda.Tensor f32 of size 4x4'               -- $KDA -e 'x = kda.randn(4,4); print(x:matmul(x))'
check "missing recipe file"      nonzero "cannot open recipe '.*nope.lua'"    -- $KDA "$tmp/nope.lua"
check "syntax error names file:line" nonzero "syntax.lua:[0-9]+: unexpected symbol"                  -- $KDA "$tmp/syntax.lua"
check "runtime error names file:line" nonzero "runtime.lua:2: boom at line two" -- $KDA "$tmp/runtime.lua"
check "bad shape names the recipe line" nonzero "shape.lua:4: .*inner dimensions differ" -- $KDA "$tmp/shape.lua"
check "unknown flag"             nonzero "unknown option '--bogus'"           -- $KDA --bogus
check "--set needs key=value"    nonzero "--set wants key=value"              -- $KDA --set nonsense "$tmp/args.lua"
check "sandbox refuses os.execute" nonzero "os.execute is not allowed in a recipe without --trust" -- $KDA "$tmp/exec.lua"
check "--trust allows os.execute" 0 ''                                        -- $KDA --trust "$tmp/exec.lua"
check "recipe sees args and --set" 0 'args	a	b'                           -- $KDA --set lr=3 "$tmp/args.lua" a b
check "--no-graph: the run trains (eagerly on CUDA)" 0 'no-graph	true	3' -- $KDA --no-graph "$tmp/nograph.lua"
check "REPL evaluates and exits at EOF" 0 'kda.Tensor f32 of size 2x2'        -- bash -c "printf 'x = kda.ones(2,2)\nx:matmul(x)\n' | HOME=$tmp $KDA"

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
