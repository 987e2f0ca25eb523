-- kda.train — the training loop: data -> graph -> plan -> steps, with held-out evaluation.
--
--   local r = kda.train{ model = kda.nn.GPT{d=128, layers=4, heads=4},
--                        data = { {path="/usr/share/common-licenses", name="prose"} },
--                        batch = 16, seq = 128, steps = 300, lr = 3e-3 }
--   r.bpb.prose, r.losses, r.tokens_per_s
--
-- BPB is measured on each domain's fixed held-out window (core/data.h): the same bytes whatever
-- batch or seq_len, every byte counted once; the eval line names the window size in bytes.
local ffi = require "ffi"
local C = require("kda.ffi").C
local util = require "kda.util"
local graph = require "kda.graph"
local Plan = require "kda.plan"

local M = {}

local defaults = {
  model = false, data = false, batch = 16, seq = 128, steps = 200, lr = 3e-3, warmup = 20,
  schedule = "cosine", min_lr_frac = 0.1, decay_frac = 0.2, weight_decay = 0.1, beta1 = 0.9,
  beta2 = 0.95, eps = 1e-8, clip = 1.0, seed = 1, log_every = 10, eval_every = 0,
  eval_batches = 0, window = false, backend = false, quiet = false, prefetch = true,
  profile = false, on_log = false, on_eval = false,
}

-- A kda.data handle from a spec ({manifest=dir} or a list of {path=, name=, weight=}) or as given.
function M.open_data(spec, window)
  local data = require "kda.data"
  local d = getmetatable(spec) and spec or data.open(spec)
  if window then
    for _, dom in ipairs(d:domains()) do d:set_window(dom.index, window) end
  end
  return d
end

-- Records the model and its loss. Inputs: tokens [B,T], targets [B*T], mask [B*T] (which
-- targets an evaluation batch counts; training reads the unmasked mean).
function M.build(cfg)
  local G = graph.new()
  local B, T = cfg.batch, cfg.seq
  local io = {}
  io.tokens = G:input("tokens", "i32", { B, T })
  io.targets = G:input("targets", "i32", { B * T })
  io.mask = G:input("mask", "f32", { B * T })
  local logits = cfg.model:forward(G, io.tokens)
  local bits = logits:cross_entropy(io.targets)                -- [B*T] bits per target byte
  io.masked_bits = G:keep(bits:mul(io.mask):sum())             -- eval: counted bits only
  io.counted = G:keep(io.mask:sum())                           -- eval: counted target bytes
  io.loss = G:keep(bits:mean())
  G:backward(io.loss)
  G:adamw { lr = cfg.lr, beta1 = cfg.beta1, beta2 = cfg.beta2, eps = cfg.eps, weight_decay = cfg.weight_decay,
            clip = cfg.clip, schedule = cfg.schedule, warmup = cfg.warmup, steps = cfg.steps,
            min_lr_frac = cfg.min_lr_frac, decay_frac = cfg.decay_frac }
  return G, io
end

-- Bits per byte on every byte of each domain's window; forward-only runs of the same plan.
function M.evaluate(plan, io, data, B, T, max_batches)
  local d = data.d
  local input, target = ffi.new("int32_t[?]", B * T), ffi.new("int32_t[?]", B * T)
  local mask = ffi.new("float[?]", B * T)
  local out = {}
  for _, dom in ipairs(data:domains()) do
    local nseq = tonumber(C.kda_data_window_count(d, dom.index, T))
    local bits, counted, first = 0, 0, 0
    local batches = 0
    while first < nseq and (max_batches == nil or max_batches == 0 or batches < max_batches) do
      local rows = util.check(C.kda_data_window_batch(d, dom.index, T, B, first, input, target, mask), "eval window")
      plan:write(io.tokens, input, 4 * B * T)
      plan:write(io.targets, target, 4 * B * T)
      plan:write(io.mask, mask, 4 * B * T)
      plan:run(true)
      bits = bits + plan:read_floats(io.masked_bits)
      counted = counted + plan:read_floats(io.counted)
      first = first + tonumber(rows)
      batches = batches + 1
    end
    out[dom.name] = { bpb = bits / counted, bytes = counted, window = dom.window }
  end
  return out
end

local function fmt_rate(x)
  if x >= 1e6 then return ("%.2fM"):format(x / 1e6) end
  if x >= 1e3 then return ("%.1fk"):format(x / 1e3) end
  return ("%.0f"):format(x)
end

function M.eval_line(step, ev)
  local parts = {}
  local names = {}
  for name in pairs(ev) do names[#names + 1] = name end
  table.sort(names)
  for _, name in ipairs(names) do
    parts[#parts + 1] = ("%s %.4f bpb over %d bytes"):format(name, ev[name].bpb, ev[name].bytes)
  end
  return ("eval step %d | %s"):format(step, table.concat(parts, " | "))
end

function M.run(cfg)
  cfg = util.defaults(cfg, defaults, "train")
  if not cfg.model then util.fail("train: give a model, e.g. model = kda.nn.GPT{d=128, layers=4, heads=4}") end
  if not cfg.data then util.fail("train: give data, e.g. data = {{path='file.txt', name='prose'}}") end
  local backend = cfg.backend or (C.kda_cuda_available() == 1 and "cuda" or "cpu")
  local B, T = cfg.batch, cfg.seq
  local data = M.open_data(cfg.data, cfg.window)
  local d = data.d
  local G, io = M.build(cfg)
  local plan = Plan.build(G, backend)
  plan:init_params(cfg.seed)
  if cfg.model.post_init then cfg.model:post_init(plan, cfg.seed) end
  if cfg.profile then plan:profile(true) end
  util.check(C.kda_data_start(d, B, T, cfg.seed, cfg.prefetch and 1 or 0), "data start")
  local nparams = G:param_count()
  local mem = plan:memory()
  local say = cfg.quiet and function() end or print
  say(("model %.2fM params | %s | batch %dx%d | arena %.1f MiB (naive %.1f MiB) | persistent %.1f MiB")
      :format(nparams / 1e6, backend, B, T, mem.arena / 2^20, mem.naive / 2^20, mem.persistent / 2^20))
  local result = { losses = {}, evals = {}, params = nparams, memory = mem, backend = backend }
  local t0, tlog, steps_done = C.kda_now(), C.kda_now(), 0
  for step = 1, cfg.steps do
    util.check(C.kda_data_next_batch(d, nil, nil), "data")
    plan:write(io.tokens, ffi.cast("void*", C.kda_data_batch_tokens(d)), 4 * B * T)
    plan:write(io.targets, ffi.cast("void*", C.kda_data_batch_targets(d)), 4 * B * T)
    plan:run(false)
    steps_done = step
    if step % cfg.log_every == 0 or step == cfg.steps then
      local loss, gnorm = plan:read_floats(io.loss), plan:read_floats(G.gnorm)
      local st = plan:read_floats(G.state)
      local now = C.kda_now()
      local tps = cfg.log_every * B * T / (now - tlog)
      tlog = now
      result.losses[#result.losses + 1] = { step = step, loss = loss }
      result.tokens_per_s = tps
      say(("step %d/%d | loss %.4f | lr %.2e | gnorm %.3f | %s tok/s | %.1f s")
          :format(step, cfg.steps, loss, st[2], gnorm, fmt_rate(tps), now - t0))
      if cfg.on_log then cfg.on_log(step, loss) end
      if loss ~= loss then util.fail(("train: loss is NaN at step %d: lower the learning rate (lr=%g)"):format(step, cfg.lr)) end
    end
    if cfg.eval_every > 0 and step % cfg.eval_every == 0 and step < cfg.steps then
      local ev = M.evaluate(plan, io, data, B, T, cfg.eval_batches)
      result.evals[#result.evals + 1] = { step = step, tokens = step * B * T, eval = ev }
      say(M.eval_line(step, ev))
    end
    if C.kda_interrupted() == 1 then
      say(("interrupted: stopping after step %d"):format(step))
      break
    end
  end
  result.train_seconds = C.kda_now() - t0
  local ev = M.evaluate(plan, io, data, B, T, cfg.eval_batches)
  result.evals[#result.evals + 1] = { step = steps_done, tokens = steps_done * B * T, eval = ev }
  result.eval, result.steps, result.tokens = ev, steps_done, steps_done * B * T
  result.bpb = {}
  for k, v in pairs(ev) do result.bpb[k] = v.bpb end
  say(M.eval_line(steps_done, ev))
  result.plan, result.graph, result.io = plan, G, io
  return result
end

return M
