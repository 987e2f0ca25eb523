-- kda.sample — bytes from a trained run: `kda sample RUN --prompt "..." -n 200 --temperature T`.
-- Rebuilds the run's model (config.lua) as a one-token decode graph (nn.GPT:decode_graph: KV
-- caches for attention layers, conv caches and the recurrent state for KDA layers), loads the
-- parameters of the newest valid checkpoint, feeds the prompt one byte at a time (prefill by
-- decode), then samples n bytes, one decode step each. The context is bounded by the run's
-- training seq (Tmax): when it is full, the states are reset and the last Tmax/2 bytes are fed
-- again (a sliding window that moves by halves; said once on stderr). Decoding runs on CUDA when a
-- device answers (each step one replay of a captured graph; bf16 activations, so the logits, and
-- with them the sampled bytes, may differ from the CPU's), else on the CPU; o.backend = "cpu" or
-- "cuda" (--backend) overrides.
local ffi = require "ffi"
local C = require("kda.ffi").C
local util = require "kda.util"
local Plan = require "kda.plan"
local runs = require "kda.run"

local M = {}

-- splitmix64: a deterministic stream from the seed, the same on every machine.
local function rng(seed)
  local s = ffi.new("uint64_t[1]", seed)
  return function()
    s[0] = s[0] + 0x9E3779B97F4A7C15ULL
    local z = s[0]
    z = bit.bxor(z, bit.rshift(z, 30)) * 0xBF58476D1CE4E5B9ULL
    z = bit.bxor(z, bit.rshift(z, 27)) * 0x94D049BB133111EBULL
    z = bit.bxor(z, bit.rshift(z, 31))
    return (tonumber(bit.rshift(z, 11)) + 0.5) * 2 ^ -53
  end
end

-- A byte from logits[0..V-1]: softmax(logits / temperature); temperature 0 = the argmax.
local function pick(logits, V, temperature, u)
  local best = 0
  for i = 1, V - 1 do if logits[i] > logits[best] then best = i end end
  if temperature <= 0 then return best end
  local p, sum = {}, 0
  for i = 0, V - 1 do
    p[i] = math.exp((logits[i] - logits[best]) / temperature)
    sum = sum + p[i]
  end
  local x, acc = u * sum, 0
  for i = 0, V - 1 do
    acc = acc + p[i]
    if x < acc then return i end
  end
  return best
end

-- The next-byte logits of a plan (f32 on the CPU, bf16 on CUDA) as floats in row[0..V-1].
local function logits_reader(plan, node, V, row)
  if C.kda_plan_node_dtype(plan.p, node.id) ~= C.KDA_BF16 then
    return function() plan:read(node, row, 4 * V) end
  end
  local raw, u = ffi.new("uint16_t[?]", V), ffi.new("union { uint32_t u; float f; }")
  return function()
    plan:read(node, raw, 2 * V)
    for i = 0, V - 1 do
      u.u = raw[i] * 65536                               -- bf16 is the top half of an f32
      row[i] = u.f
    end
  end
end

local function pick_backend(want)
  local cuda = C.kda_cuda_available() == 1
  if want == nil then return cuda and "cuda" or "cpu" end
  if want ~= "cpu" and want ~= "cuda" then
    util.fail(("sample: --backend wants cpu or cuda, got '%s'"):format(tostring(want)))
  end
  if want == "cuda" and not cuda then
    util.fail("sample: --backend cuda, but no CUDA device answers (built without nvcc, or no GPU): use --backend cpu")
  end
  return want
end

-- o: {run=, prompt=, n=, temperature=, seed=, quiet=, max_len=, backend=}. Returns the generated
-- bytes (without the prompt).
function M.generate(o)
  local cfg = runs.load_config(o.run)
  if type(cfg.model) ~= "table" or cfg.model.arch == "custom" then
    util.fail(("sample: run '%s' has a model its config.lua cannot rebuild (a custom module): pass the model as a spec, e.g. model = {arch='gpt', d=128, layers=4, heads=4}")
      :format(o.run))
  end
  local model = require("kda.train").model(cfg.model)
  local Tmax = o.max_len or cfg.seq
  local dec = model:decode_graph { max_len = Tmax }
  local G, V = dec.G, dec.logits:shape()[2]
  local backend = pick_backend(o.backend)
  local plan = Plan.build(G, backend)
  local dir = runs.dir(o.run)
  local m = runs.load_latest(dir, plan, G, true, function(s) io.stderr:write(s, "\n") end)
  if not m then util.fail(("sample: no checkpoint of run '%s' loads (%s has none valid): train it with --set run=%s"):format(o.run, dir, o.run)) end
  if not o.quiet then io.stderr:write(("note: %s step %d, decoding on %s\n"):format(dir, m.step, backend)) end
  local tok, pos, row = ffi.new("int32_t[1]"), ffi.new("int32_t[1]"), ffi.new("float[?]", V)
  local read_logits = logits_reader(plan, dec.logits, V, row)
  local ctx, p, noted = {}, 0, false
  local function feed(b)                                 -- one decode step at position p
    tok[0], pos[0] = b, p
    plan:write(dec.tokens, tok, 4)
    plan:write(dec.pos, pos, 4)
    plan:run(true)
    p = p + 1
  end
  -- Appends byte b to the context and decodes it; the logits of the next byte land in row.
  local keep = math.max(1, math.floor(Tmax / 2))
  local function push(b)
    ctx[#ctx + 1] = b
    if p >= Tmax then                                    -- full: restart from the last keep bytes
      if not noted and not o.quiet then
        io.stderr:write(("note: the context reached %d bytes (the run's seq); decoding goes on over the last %d to %d bytes\n")
          :format(Tmax, keep, Tmax))
      end
      noted = true
      dec:reset(plan)
      p = 0
      for i = #ctx - keep + 1, #ctx - 1 do feed(ctx[i]) end
    end
    feed(b)
  end
  local prompt = { o.prompt:byte(1, -1) }
  if #prompt == 0 then prompt[1] = 10 end                -- an empty prompt starts after a newline
  for i = math.max(1, #prompt - Tmax + 1), #prompt do push(prompt[i]) end
  local rand, gen = rng(o.seed or 1), {}
  for i = 1, o.n do
    read_logits()
    local b = pick(row, V, o.temperature or 1, rand())
    gen[#gen + 1] = string.char(b % 256)
    if i < o.n then push(b) end
  end
  return table.concat(gen)
end

return M
