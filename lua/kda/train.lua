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
  -- optimizer options (core/optim.c): Muon for 2-D weights, NaN/spike guard, EMA, retraction
  optimizer = "adamw", muon_lr = false, muon_momentum = 0.95, spike_factor = 0, max_skips = 10,
  ema = 0, retract_norm = 1,
  max_seconds = 0,   -- stop after this much training time (0: no limit), like Ctrl-C
  -- run dir (lua/kda/run.lua); resume/fresh = "cli" follow the --resume/--fresh flags
  run = false, ckpt_every = 0, keep = 3, resume = "cli", fresh = "cli",
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
            min_lr_frac = cfg.min_lr_frac, decay_frac = cfg.decay_frac, optimizer = cfg.optimizer,
            muon_lr = cfg.muon_lr or nil, muon_momentum = cfg.muon_momentum, spike_factor = cfg.spike_factor,
            ema = cfg.ema, retract_norm = cfg.retract_norm }
  return G, io
end

-- Runs fn with every parameter replaced by its EMA ("X.ema"), then puts the weights back.
-- Host copies, once per evaluation: the step itself never leaves the device.
local function with_ema(plan, fn)
  local by_name, swaps = {}, {}
  for _, s in ipairs(plan:state()) do by_name[s.name] = s end
  for name, s in pairs(by_name) do
    local e = by_name[name .. ".ema"]
    if e then
      local w, a = ffi.new("float[?]", s.numel), ffi.new("float[?]", s.numel)
      plan:read(s.node, w, 4 * s.numel)
      plan:read(e.node, a, 4 * s.numel)
      plan:write(s.node, a, 4 * s.numel)
      swaps[#swaps + 1] = { s.node, w, 4 * s.numel }
    end
  end
  local ok, res = pcall(fn)
  for _, sw in ipairs(swaps) do plan:write(sw[1], sw[2], sw[3]) end
  if not ok then error(res, 0) end
  return res
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

-- The model: a module (kda.nn.GPT{...}) or a spec table {arch="gpt"|"hybrid", d=, layers=, ...}
-- that a run records in config.lua so `kda sample` can rebuild it.
function M.model(spec)
  if spec.forward then return spec end
  local nn = require "kda.nn"
  local o = util.copy(spec)
  local arch = o.arch or "gpt"
  o.arch = nil
  local m
  if arch == "gpt" then m = nn.GPT(o)
  elseif arch == "hybrid" then m = nn.hybrid(o)
  else util.fail(("train: model arch '%s' is unknown: use 'gpt' or 'hybrid', or pass a module"):format(tostring(arch))) end
  m.spec = util.copy(spec)
  m.spec.arch = arch
  return m
end

-- One line that rewrites itself on a terminal; plain log lines otherwise.
local function progress(quiet)
  if quiet then return { line = function() end, say = function() end, done = function() end } end
  local term = os.getenv("TERM")
  local tty = C.kda_isatty(1) == 1 and term ~= nil and term ~= "" and term ~= "dumb"
  local P, open = {}, false
  function P.line(live, plain)
    if tty then io.write("\r", live, "\27[K"); io.stdout:flush(); open = true
    else print(plain) end
  end
  function P.say(text)
    if open then io.write("\r\27[K"); open = false end
    print(text)
  end
  function P.done() if open then io.write("\n"); open = false end end
  return P
end

local function fmt_time(s)
  if s ~= s or s == math.huge then return "?" end
  if s >= 3600 then return ("%dh%02dm"):format(s / 3600, s % 3600 / 60) end
  if s >= 60 then return ("%dm%02ds"):format(s / 60, s % 60) end
  return ("%ds"):format(s)
end

-- Model FLOPs utilisation: 6 * params per token (matmuls, forward and backward) over the peak
-- dense bf16 rate of the card. Only on CUDA; the CPU has no single meaningful peak.
local function mfu(backend, nparams, tps)
  if backend ~= "cuda" then return nil end
  local peak = C.kda_cuda_bf16_peak_flops()
  return 6 * nparams * tps / (peak > 0 and peak or 989e12)   -- unknown card: an H100/H200's dense bf16
end

-- " | gpu fwd a bwd b opt c ms": the last step's stages, timed by events inside the step.
local stage_ms = ffi.new("double[3]")
local function stage_text(backend)
  if backend ~= "cuda" or C.kda_cuda_stage_ms(stage_ms) ~= 0 then return "" end
  return (" | gpu fwd %.2f bwd %.2f opt %.2f ms"):format(stage_ms[0], stage_ms[1], stage_ms[2])
end

-- The CPU's model name (/proc/cpuinfo) for meta.txt's device line.
local function cpu_name()
  local f = io.open("/proc/cpuinfo", "r")
  local name = f and f:read("*a"):match("model name%s*:%s*([^\n]+)")
  if f then f:close() end
  return name or "cpu"
end

-- The run directory, resuming from its newest valid checkpoint when asked. Returns run, start step.
local function open_run(cfg, plan, G, data, backend, say)
  local runs = require "kda.run"
  local dir = runs.dir(cfg.run)
  local kda = package.loaded.kda
  local opts = kda and kda.args and kda.args.opts or {}
  local resume, fresh = cfg.resume, cfg.fresh
  if resume == "cli" then resume = opts.resume or false end
  if fresh == "cli" then fresh = opts.fresh or false end
  local have = #runs.checkpoints(dir) > 0
  if have and not resume and not fresh then
    util.fail(("train: %s already holds checkpoints: pass --resume to continue it or --fresh to start over"):format(dir))
  end
  local config = {}
  for k, v in pairs(cfg) do if type(v) ~= "function" then config[k] = v end end
  config.model = runs.model_spec(cfg.model)
  config.data = getmetatable(cfg.data) and "(a data handle opened by the recipe)" or cfg.data
  config.resume, config.fresh = nil, nil
  local o = { keep = cfg.keep, domains = {}, config = config, backend = backend,
              device = backend == "cuda" and ffi.string(C.kda_cuda_device_name()) or cpu_name(),
              script = kda and kda.args and kda.args.script }
  for _, dom in ipairs(data:domains()) do o.domains[#o.domains + 1] = dom.name end
  table.sort(o.domains)
  local start = 0
  if resume and have then
    local m = runs.load_latest(dir, plan, G, false, say)
    if not m then util.fail(("train: no checkpoint in %s loads (see above): delete the run dir or pass --fresh"):format(dir)) end
    util.check(C.kda_data_set_state(data.d, ffi.new("uint64_t[2]", { m.data_seed, m.data_step })), "resume data")
    start, o.resume_step = m.step, m.step
    say(("resumed %s from step %d"):format(dir, start))
    local ok, old = pcall(runs.load_config, cfg.run)
    if ok and old.steps and old.steps ~= cfg.steps then
      say(("note: steps changed from %d to %d: the lr schedule follows the new total"):format(old.steps, cfg.steps))
    end
  elseif resume then
    say(("no checkpoint in %s yet: starting at step 0"):format(dir))
  end
  return runs.open(cfg.run, o), start
end

function M.run(cfg)
  cfg = util.defaults(cfg, defaults, "train")
  if not cfg.model then util.fail("train: give a model, e.g. model = kda.nn.GPT{d=128, layers=4, heads=4}") end
  if not cfg.data then util.fail("train: give data, e.g. data = {{path='file.txt', name='prose'}}") end
  cfg.model = M.model(cfg.model)
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
  local P = progress(cfg.quiet)
  local say = P.say
  local run, start = nil, 0
  if cfg.run then run, start = open_run(cfg, plan, G, data, backend, say) end
  local nparams = G:param_count()
  local mem = plan:memory()
  say(("model %.2fM params | %s | batch %dx%d | arena %.1f MiB (naive %.1f MiB) | persistent %.1f MiB")
      :format(nparams / 1e6, backend, B, T, mem.arena / 2^20, mem.naive / 2^20, mem.persistent / 2^20))
  local result = { losses = {}, evals = {}, params = nparams, memory = mem, backend = backend, start = start,
                   run = run and run.dir }
  local data_state = ffi.new("uint64_t[2]")
  local function checkpoint(step)
    util.check(C.kda_data_get_state(d, data_state), "data state")
    run:save(plan, G, step, data_state)
  end
  local eval_seconds = 0 -- kept out of the training time
  local function evaluate()
    local e0 = C.kda_now()
    local ev
    if cfg.ema > 0 then ev = with_ema(plan, function() return M.evaluate(plan, io, data, B, T, cfg.eval_batches) end)
    else ev = M.evaluate(plan, io, data, B, T, cfg.eval_batches) end
    eval_seconds = eval_seconds + C.kda_now() - e0
    return ev
  end
  local t0, tlog, steps_done, last_ckpt, bpb_txt = C.kda_now(), C.kda_now(), start, start, ""
  local first_step_s   -- seconds from process start to the end of the first step (kda_since_start)
  local sampling = backend == "cuda" and C.kda_cuda_util_start() == 0
  if backend == "cuda" then C.kda_cuda_reset_peak_mem() end
  local reported_skips = 0
  local step_log = start
  for step = start + 1, cfg.steps do
    util.check(C.kda_data_next_batch(d, nil, nil), "data")
    plan:write(io.tokens, ffi.cast("void*", C.kda_data_batch_tokens(d)), 4 * B * T)
    plan:write(io.targets, ffi.cast("void*", C.kda_data_batch_targets(d)), 4 * B * T)
    plan:run(false)
    if step == start + 1 then
      if backend == "cuda" then C.kda_cuda_synchronize() end
      first_step_s = C.kda_since_start()
    end
    steps_done = step
    local row
    if step % cfg.log_every == 0 or step == cfg.steps then
      local loss, gnorm = plan:read_floats(io.loss), plan:read_floats(G.gnorm)
      local st = plan:read_floats(G.state)
      local now = C.kda_now()
      local tps = (step - step_log) * B * T / (now - tlog)
      tlog, step_log = now, step
      result.losses[#result.losses + 1] = { step = step, loss = loss }
      result.tokens_per_s = tps
      local eta = (cfg.steps - step) * B * T / tps
      local m = mfu(backend, nparams, tps)
      local mfu_txt = m and (" | MFU %.1f%%"):format(100 * m) or ""
      P.line(("step %d/%d | loss %.4f%s | %s tok/s%s | ETA %s"):format(step, cfg.steps, loss, bpb_txt, fmt_rate(tps), mfu_txt, fmt_time(eta)),
             ("step %d/%d | loss %.4f | lr %.2e | gnorm %.3f | %s tok/s%s | %.1f s%s")
               :format(step, cfg.steps, loss, st[2], gnorm, fmt_rate(tps), mfu_txt, now - t0, stage_text(backend)))
      row = { step = step, tokens = step * B * T, loss = loss, lr = st[2], grad_norm = gnorm, tok_s = tps,
              mfu = m }
      if cfg.on_log then cfg.on_log(step, loss) end
      local run_of_skips, skipped = st[C.KDA_STATE_SKIP_RUN + 1], st[C.KDA_STATE_SKIPPED + 1]
      if skipped > reported_skips then
        say(("step %d: %d updates skipped so far (non-finite loss or grad norm, or a loss spike)"):format(step, skipped))
        reported_skips = skipped
      end
      if run_of_skips >= cfg.max_skips then
        util.fail(("train: the last %d steps were all skipped (loss %g, grad norm %g): lower the learning rate (lr=%g) or check the data")
                  :format(run_of_skips, loss, gnorm, cfg.lr))
      end
    end
    if cfg.eval_every > 0 and step % cfg.eval_every == 0 and step < cfg.steps then
      local ev = evaluate()
      result.evals[#result.evals + 1] = { step = step, tokens = step * B * T, eval = ev,
                                          train_seconds = C.kda_now() - t0 - eval_seconds }
      say(M.eval_line(step, ev))
      row = row or { step = step, tokens = step * B * T }
      row.bpb = {}
      for k, v in pairs(ev) do row.bpb[k] = v.bpb end
      local names = {}
      for k, v in pairs(ev) do names[#names + 1] = ("%s %.3f"):format(k, v.bpb) end
      table.sort(names)
      bpb_txt = " | bpb " .. table.concat(names, " ")
    end
    if run and row then run:log(row) end
    local out_of_time = cfg.max_seconds > 0 and C.kda_now() - t0 - eval_seconds >= cfg.max_seconds
    local stop = C.kda_interrupted() == 1 or out_of_time
    if run and (stop or step == cfg.steps or (cfg.ckpt_every > 0 and step % cfg.ckpt_every == 0)) then
      checkpoint(step)
      last_ckpt = step
    end
    if stop then
      say(("%s: stopping after step %d%s"):format(out_of_time and ("time budget of %g s spent"):format(cfg.max_seconds) or "interrupted",
                                                  step, run and " (checkpoint saved; --resume continues)" or ""))
      break
    end
  end
  P.done()
  if run and last_ckpt ~= steps_done then checkpoint(steps_done) end
  result.train_seconds = C.kda_now() - t0 - eval_seconds  -- training alone, evaluations excluded
  result.first_step_seconds = first_step_s
  if backend == "cuda" then   -- the run summary: utilisation, memory, time to the first step
    local pct = ffi.new("double[1]")
    local n = sampling and C.kda_cuda_util_stop(pct) or 0
    result.gpu_util = n > 0 and pct[0] or nil
    result.peak_mem = C.kda_cuda_peak_mem_bytes()
    say(("summary: %d steps in %.1f s of training | GPU busy %s | peak device memory %.2f GiB | first step done %.2f s after start")
        :format(steps_done - start, result.train_seconds, n > 0 and ("%.0f%% (NVML, mean of %d samples)"):format(pct[0], n) or "n/a (no NVML)",
                result.peak_mem / 2^30, first_step_s or 0))
  end
  local ev = evaluate()
  result.evals[#result.evals + 1] = { step = steps_done, tokens = steps_done * B * T, eval = ev,
                                      train_seconds = result.train_seconds }
  result.eval, result.steps, result.tokens = ev, steps_done, steps_done * B * T
  result.bpb = {}
  for k, v in pairs(ev) do result.bpb[k] = v.bpb end
  if run then
    run:log { step = steps_done, tokens = steps_done * B * T, bpb = result.bpb }
    run:close()
  end
  say(M.eval_line(steps_done, ev))
  result.plan, result.graph, result.io = plan, G, io
  return result
end

return M
