-- tests/lua/runs.lua — checkpoints, resume, run dirs, report, sample (docs/runs.md).
-- Run as `kda --trust tests/lua/runs.lua [filter]`; ends with "N passed, N failed[, N skipped]".
local kda = require "kda"
local ffi = require "ffi"
local C = kda.C
local runs = require "kda.run"
local passed, failed, skipped = 0, 0, 0
local filter = arg and arg[1]

local function test(name, fn)
  if filter and not name:find(filter, 1, true) then return end
  local ok, err = pcall(fn)
  if ok and err == "skip" then return end
  if ok then passed = passed + 1; print("ok - " .. name)
  else failed = failed + 1; print("FAIL - " .. name .. ": " .. tostring(err)) end
end
local function skip(name, why) skipped = skipped + 1; print("ok - " .. name .. " # skip: " .. why); return "skip" end
local function expect(cond, msg) if not cond then error(msg or "expectation failed", 2) end end

local tmp = os.tmpname()
os.remove(tmp)
assert(C.kda_mkdirs(tmp) == 0)
runs.root = tmp                                     -- every run of this suite lives under tmp

local licenses = { { path = "/usr/share/common-licenses", name = "licenses" } }
local function train(steps, run, o)
  local cfg = { model = { d = 32, layers = 2, heads = 2 }, data = licenses, batch = 4, seq = 32, steps = steps,
                log_every = 1, eval_every = 10, eval_batches = 1, run = run, ckpt_every = 10, quiet = true,
                resume = false, fresh = true }
  for k, v in pairs(o or {}) do cfg[k] = v end
  return kda.train(cfg)
end

-- Every persistent buffer of a plan as one string per name.
local function buffers(plan)
  local out = {}
  for _, s in ipairs(plan:state()) do
    local buf = ffi.new("float[?]", s.numel)
    plan:read(s.node, buf, 4 * s.numel)
    out[s.name] = ffi.string(buf, 4 * s.numel)
  end
  return out
end
local function same(a, b)
  local n = 0
  for k, v in pairs(a) do if b[k] ~= v then return false, k end n = n + 1 end
  for _ in pairs(b) do n = n - 1 end
  return n == 0, "count"
end
local function sh(cmd) return os.execute(cmd) == 0 end

test("checkpoint round trip: every buffer of a fresh plan equals the saved one", function()
  local r = train(12, "rt")
  local prefix = runs.prefix(runs.dir("rt"), 12)
  local cfg = { model = kda.nn.GPT { d = 32, layers = 2, heads = 2 }, batch = 4, seq = 32, steps = 12, lr = 3e-3 }
  local G = require("kda.train").build(cfg)
  local plan = kda.Plan.build(G, "cpu")
  local meta = ffi.new("uint64_t[?]", C.KDA_CKPT_NMETA)
  expect(C.kda_ckpt_load(plan.p, G.g, prefix, meta) == 0, ffi.string(C.kda_last_error()))
  local ok, which = same(buffers(r.plan), buffers(plan))
  expect(ok, "buffer differs: " .. tostring(which))
  expect(tonumber(meta[C.KDA_CKPT_STEP]) == 12 and tonumber(meta[C.KDA_CKPT_DATA_STEP]) == 12, "meta")
  expect(#plan:state() > 3 * 10, "state count")
end)

test("resume: 10 steps + resume to 20 gives the losses of 20 in one go, bit for bit", function()
  local a = train(20, "one")
  train(10, "two")
  local b = train(20, "two", { resume = true, fresh = false })
  expect(b.start == 10 and #b.losses == 10, "resumed from " .. tostring(b.start))
  for i = 11, 20 do
    local x, y = a.losses[i], b.losses[i - 10]
    expect(x.step == y.step and x.loss == y.loss, ("step %d: %.9g vs %.9g"):format(x.step, x.loss, y.loss))
  end
  expect(a.bpb.licenses == b.bpb.licenses, "final BPB differs")
  local ok, which = same(buffers(a.plan), buffers(b.plan))
  expect(ok, "final buffers differ: " .. tostring(which))
  local steps, seen = {}, {}
  for line in io.lines(runs.dir("two") .. "/metrics.tsv") do
    local s, loss = line:match("^(%d+)\t%d+\t([^\t]+)")
    if s then expect(not seen[s], "metrics.tsv repeats step " .. s); seen[s] = true; steps[#steps + 1] = s end
  end
  expect(#steps == 20, "metrics.tsv loss rows: " .. #steps)
end)

test("run dir: recipe, config, meta, the last `keep` checkpoints", function()
  train(40, "keep", { keep = 2 })
  local d = runs.dir("keep")
  for _, f in ipairs { "recipe.lua", "config.lua", "meta.txt", "metrics.tsv" } do expect(io.open(d .. "/" .. f), f) end
  local st = runs.checkpoints(d)
  expect(#st == 2 and st[1] == 30 and st[2] == 40, "kept " .. table.concat(st, ","))
  local cfg = runs.load_config("keep")
  expect(cfg.model.arch == "gpt" and cfg.model.d == 32 and cfg.seq == 32, "config.lua")
  local meta = io.open(d .. "/meta.txt"):read("*a")
  local be = kda.cuda() and "cuda" or "cpu"   -- kda.train picks CUDA when a device answers
  expect(meta:find("backend\t" .. be) and meta:find("device\t[^\n]+") and meta:find("git\t"), "meta.txt: " .. meta)
  local ok, err = pcall(train, 40, "keep", { fresh = false })
  expect(not ok and err:find("already holds checkpoints: pass %-%-resume"), "existing run: " .. tostring(err))
end)

test("corrupt checkpoints are refused with the file named; resume falls back", function()
  local d = runs.dir("two")                          -- ckpt-10, ckpt-20 from the resume test
  local prefix = runs.prefix(d, 20)
  local cfg = { model = kda.nn.GPT { d = 32, layers = 2, heads = 2 }, batch = 4, seq = 32, steps = 20, lr = 3e-3 }
  local G = require("kda.train").build(cfg)
  local plan = kda.Plan.build(G, "cpu")
  plan:init_params(7)
  local before = buffers(plan)
  local meta = ffi.new("uint64_t[?]", C.KDA_CKPT_NMETA)
  local function refused(pattern)
    expect(C.kda_ckpt_load(plan.p, G.g, prefix, meta) == -1, "load accepted a corrupt file")
    local e = ffi.string(C.kda_last_error())
    expect(e:find(pattern), "message: " .. e)
    expect(same(before, buffers(plan)), "a refused load changed the plan")
  end
  local path = prefix .. ".state.safetensors"
  local orig = io.open(path, "rb"):read("*a")
  local function put(s) local f = io.open(path, "wb"); f:write(s); f:close() end
  put(orig:sub(1, #orig - 100))
  refused("ckpt%-20%.state%.safetensors: .*truncated")
  put(orig:sub(1, #orig - 40) .. string.char((orig:byte(#orig - 39) + 1) % 256) .. orig:sub(#orig - 38))
  refused("ckpt%-20%.state%.safetensors: checksum mismatch")
  put(orig:sub(1, 20) .. "#" .. orig:sub(22))
  refused("ckpt%-20%.state%.safetensors: bad header")
  put(orig:sub(1, 5))
  refused("truncated")
  put(orig)
  expect(C.kda_ckpt_load(plan.p, G.g, prefix, meta) == 0, ffi.string(C.kda_last_error()))
  local m = io.open(prefix .. ".model.safetensors", "rb"):read("*a")
  local f = io.open(prefix .. ".model.safetensors", "wb"); f:write(m:sub(1, #m - 1)); f:close()
  local said = {}
  local got = runs.load_latest(d, plan, G, false, function(s) said[#said + 1] = s end)
  expect(got and got.step == 10, "fell back to " .. tostring(got and got.step))
  expect(#said == 1 and said[1]:find("checkpoint 20 refused: .*ckpt%-20%.model%.safetensors.*trying the one before"), said[1])
end)

test("safetensors: Python's safetensors package reads both files", function()
  if not sh("python3 -c 'import safetensors, numpy' 2>/dev/null") then
    return skip("safetensors: Python's safetensors package reads both files", "python3 safetensors/numpy not installed")
  end
  local p = runs.prefix(runs.dir("rt"), 12)
  local py = ([[
import sys
from safetensors.numpy import load_file
from safetensors import safe_open
m, s = load_file("%s.model.safetensors"), load_file("%s.state.safetensors")
assert m["embed.weight"].shape == (256, 32) and str(m["embed.weight"].dtype) == "float32"
assert "embed.weight.adam_m" in s and "embed.weight" not in s and not any(k.endswith("adam_m") for k in m)
with safe_open("%s.model.safetensors", "np") as f: md = f.metadata()
assert md["format"] == "kda" and md["step"] == "12", md
]]):format(p, p, p)
  local f = io.open(tmp .. "/check.py", "w"); f:write(py); f:close()
  expect(sh("python3 " .. tmp .. "/check.py"), "python check failed")
end)

test("report: one well-formed HTML file with an SVG per domain and the loss", function()
  local f = io.open(runs.dir("one") .. "/bars.tsv", "w")
  f:write("licenses\tkn-4\t2.5\n"); f:close()
  local out = require("kda.report").write({ "one", "two" }, tmp .. "/report.html")
  local html = io.open(out):read("*a")
  local _, nsvg = html:gsub("<svg ", "")
  expect(nsvg == 2 and html:find("stroke%-dasharray") and html:find(">kn%-4 "), "svg count / bar line")
  if sh("python3 -c 'import xml.dom.minidom' 2>/dev/null") then
    expect(sh(("python3 -c 'import re,xml.dom.minidom as x; s=open(\"%s\").read(); [x.parseString(m) for m in re.findall(r\"<svg.*?</svg>\", s, re.S)]; x.parseString(s.replace(\"<!DOCTYPE html>\",\"\"))'"):format(out)),
           "not well-formed XML")
  end
end)

-- The one-token decode graph (nn.GPT:decode_graph) against the training graph's forward: the
-- same parameters (copied by name), a 20-byte sequence, the logits at every position.
local function decode_matches(model, tol)
  local Tn, V = 20, 256
  local G = kda.graph.new()
  local tokens = G:input("tokens", "i32", { 1, Tn })
  local logits = G:keep(model:forward(G, tokens))
  local plan = kda.Plan.build(G, "cpu")
  plan:init_params(7)
  model:post_init(plan, 7)
  local dec = model:decode_graph { max_len = 24 }
  local dplan = kda.Plan.build(dec.G, "cpu")
  local nparams = 0
  for _, s in ipairs(plan:state()) do
    local d = dec.G:find(s.name)
    expect(d, "decode graph lacks parameter " .. s.name)
    local buf = ffi.new("float[?]", s.numel)
    plan:read(s.node, buf, 4 * s.numel)
    dplan:write(d, buf, 4 * s.numel)
    nparams = nparams + 1
  end
  expect(nparams == #dplan:state(), ("decode graph has %d parameters, training %d"):format(#dplan:state(), nparams))
  local text = "The quick brown fox."
  local x = ffi.new("int32_t[?]", Tn)
  for i = 0, Tn - 1 do x[i] = text:byte(i + 1) end
  plan:write(tokens, x, 4 * Tn)
  plan:run(true)
  local full = ffi.new("float[?]", Tn * V)
  plan:read(logits, full, 4 * Tn * V)
  local row, tok, pos = ffi.new("float[?]", V), ffi.new("int32_t[1]"), ffi.new("int32_t[1]")
  local worst = 0
  for t = 0, Tn - 1 do
    tok[0], pos[0] = x[t], t
    dplan:write(dec.tokens, tok, 4)
    dplan:write(dec.pos, pos, 4)
    dplan:run(true)
    dplan:read(dec.logits, row, 4 * V)
    local num, den = 0, 1e-6
    for j = 0, V - 1 do
      num = math.max(num, math.abs(row[j] - full[t * V + j]))
      den = math.max(den, math.abs(full[t * V + j]))
    end
    worst = math.max(worst, num / den)
  end
  expect(worst <= tol, ("decode logits differ from the forward: relative %.3g > %g"):format(worst, tol))
  -- reset zeroes the states: decoding position 0 again gives the first row again
  dec:reset(dplan)
  tok[0], pos[0] = x[0], 0
  dplan:write(dec.tokens, tok, 4)
  dplan:write(dec.pos, pos, 4)
  dplan:run(true)
  dplan:read(dec.logits, row, 4 * V)
  for j = 0, V - 1 do expect(math.abs(row[j] - full[j]) <= tol * 10 * (1 + math.abs(full[j])), "reset does not restart") end
  return #dec.states
end

test("decode graph: GPT (RoPE, KV cache) logits at every position == the forward's", function()
  local n = decode_matches(kda.nn.GPT { d = 32, layers = 2, heads = 2 }, 1e-4)
  expect(n == 4, "states: " .. n)
end)

test("decode graph: hybrid (KDA state + conv caches, NoPE attention) logits == the forward's", function()
  local n = decode_matches(kda.nn.hybrid { d = 32, layers = 2, heads = 2, attn_every = 2, chunk = 8 }, 1e-4)
  expect(n == 4 + 2, "states: " .. n)                  -- layer 1: 3 conv caches + kda_state; layer 2: k, v caches
end)

test("sample: n bytes, the same for the same seed", function()
  local S = require "kda.sample"
  local a = S.generate { run = "one", prompt = "The ", n = 40, temperature = 0.8, seed = 5, quiet = true }
  local b = S.generate { run = "one", prompt = "The ", n = 40, temperature = 0.8, seed = 5, quiet = true }
  local c = S.generate { run = "one", prompt = "The ", n = 40, temperature = 0.8, seed = 6, quiet = true }
  expect(#a == 40 and a == b, "not deterministic")
  expect(a ~= c, "the seed changes nothing")
  local long = S.generate { run = "one", prompt = ("x"):rep(50), n = 3, temperature = 0, seed = 1, quiet = true }
  expect(#long == 3, "prompt longer than seq")
end)

os.execute("rm -rf '" .. tmp .. "'")
if skipped > 0 then print(("%d passed, %d failed, %d skipped"):format(passed, failed, skipped))
else print(("%d passed, %d failed"):format(passed, failed)) end
return failed == 0 and 0 or 1
