-- benches/gpt_bench.lua — kda's GPT step time on the CUDA backend (run on the H200 by
-- benches/device_run.sh). Prints the warm step time (mean of steps 51.. run back to back without a
-- host sync, as training runs them; and step 50 alone, synced), tokens/s, MFU against the card's
-- dense bf16 peak, time from process start to the first finished step (the tiny-model check
-- before it excluded), peak memory, the last step's per-stage GPU times, and a CUDA-vs-CPU loss
-- check on a tiny model.
--   kda --trust benches/gpt_bench.lua size=S batch=8 seq=512 steps=120 [arch=hybrid] [optimizer=muon] [first=1]
-- hd=N (arch=hybrid): the KDA layers' head dim (default d / heads; hd=128 at size S runs the
-- compiled K = V = 128 kernels, the bench shapes' large heads, on a small model)
local kda = require "kda"
local ffi = require "ffi"
local C = kda.C
local check_seconds = 0   -- the tiny-model check is not part of the time to first step
local opt = { size = "S", batch = 8, seq = 512, steps = 120, check = 1, arch = "gpt", optimizer = "adamw" }
for _, a in ipairs(arg or {}) do
  local k, v = a:match("^(%w+)=(.*)$")
  if k then opt[k] = tonumber(v) or v end
end
local sizes = { S = { d = 256, layers = 8, heads = 4 }, M = { d = 768, layers = 12, heads = 12 },
                L = { d = 2048, layers = 20, heads = 16 } }
if not sizes[opt.size] then error(("gpt_bench: size=%s: one of S, M, L"):format(tostring(opt.size)), 0) end
if opt.first ~= 1 and (type(opt.steps) ~= "number" or opt.steps < 52) then   -- steps 40..50 timed alone, 51.. pipelined
  error(("gpt_bench: steps=%s: give at least 52 (steps 40-50 are timed one by one, the mean of 51.. is the figure)")
        :format(tostring(opt.steps)), 0)
end
local train = require "kda.train"
local function model(cfg)
  if opt.arch == "hybrid" then return kda.nn.hybrid { d = cfg.d, layers = cfg.layers, heads = cfg.heads, head_dim = cfg.hd } end
  return kda.nn.GPT(cfg)
end

local function gpt_flops_per_token(n_params, cfg, T)
  -- 6N for the dense weights + causal attention 6 * L * T * d (QK^T and PV, forward + backward, halved by causality x2 ops)
  return 6 * n_params + 6 * cfg.layers * T * cfg.d
end

if opt.check == 1 then -- tiny model: the first losses on CUDA and CPU agree within bf16 rounding
  local c0 = kda.now()
  local losses = {}
  for _, be in ipairs { "cpu", "cuda" } do
    local r = kda.train { model = model { d = 64, layers = 4, heads = 2 }, data = { { path = "data/small/prose.txt", name = "prose" } },
                          batch = 4, seq = 64, steps = 6, log_every = 1, quiet = true, backend = be, eval_batches = 1 }
    losses[be] = r.losses
  end
  local worst = 0
  for i, x in ipairs(losses.cpu) do worst = math.max(worst, math.abs(x.loss - losses.cuda[i].loss) / x.loss) end
  print(("check %s: cuda vs cpu losses over 6 steps, worst relative difference %.2e (%s); cpu %s cuda %s")
        :format(opt.arch, worst, worst < 0.03 and "ok" or "FAIL", losses.cpu[6].loss, losses.cuda[6].loss))
  check_seconds = kda.now() - c0
end

local mcfg = sizes[opt.size]
if opt.hd ~= nil then
  if opt.arch ~= "hybrid" or type(opt.hd) ~= "number" or opt.hd < 1 or opt.hd % 1 ~= 0 then
    error(("gpt_bench: hd=%s: a whole head dim, with arch=hybrid"):format(tostring(opt.hd)), 0)
  end
  mcfg.hd = opt.hd
end
local cfg = { model = model(mcfg), optimizer = opt.optimizer, batch = opt.batch, seq = opt.seq, steps = opt.steps, lr = 3e-3, warmup = 10,
              schedule = "cosine", min_lr_frac = 0.1, decay_frac = 0.2, weight_decay = 0.1, beta1 = 0.9, beta2 = 0.95,
              eps = 1e-8, clip = 1.0 }
local data = train.open_data { { path = "data/small/prose.txt", name = "prose" } }
local t_build = kda.now()
local G, io = train.build(cfg)
local plan = kda.Plan.build(G, "cuda")
local t_init = kda.now()
plan:init_params(1)
C.kda_cuda_synchronize()
local init_s, build_s = kda.now() - t_init, t_init - t_build   -- where the time to the first step goes
local B, T = opt.batch, opt.seq
data:start(B, T, 1, true)
C.kda_cuda_reset_peak_mem()
C.kda_cuda_util_start()
local times, first_step = {}, nil
local t_pipe   -- steps after 50 run without a host sync, as in training: their mean is the throughput
for step = 0, opt.steps - 1 do
  local tok, tgt = data:next()
  local t0 = kda.now()
  plan:write(io.tokens, ffi.cast("void*", tok), 4 * B * T)
  plan:write(io.targets, ffi.cast("void*", tgt), 4 * B * T)
  plan:run(false)
  if step <= 50 then
    C.kda_cuda_synchronize()
    times[#times + 1] = kda.now() - t0
    if step == 0 then first_step = C.kda_since_start() - check_seconds end
    if step == 0 and opt.first == 1 then   -- first=1: time to the first step only (the L config)
      print(("kda %s %s %.2fM params batch %dx%d | first step %.2f s after start (step 0; graph + plan %.2f s, parameter init %.2f s, step 0 itself %.2f s) | device %s")
            :format(opt.arch, opt.size, G:param_count() / 1e6, B, T, first_step, build_s, init_s, times[1],
                    ffi.string(C.kda_cuda_device_name())))
      os.exit(0)
    end
    if step == 50 then t_pipe = kda.now() end
  end
end
C.kda_cuda_synchronize()
local pipe = (kda.now() - t_pipe) / (opt.steps - 51)
local stage = ffi.new("double[3]")
C.kda_cuda_stage_ms(stage)
local util = ffi.new("double[1]")
C.kda_cuda_util_stop(util)
local warm = {}
for i = 41, 51 do warm[#warm + 1] = times[i] end   -- steps 40..50, each timed alone (host sync)
table.sort(warm)
local synced = warm[math.floor((#warm + 1) / 2)]
local med = pipe
local n = G:param_count()
local fpt = gpt_flops_per_token(n, mcfg, T)
local peak = C.kda_cuda_bf16_peak_flops()
local loss = plan:read_floats(io.loss)
local fc = ffi.new("int[4]")
C.kda_cuda_fusion_counts(fc)
local fusions = ("fused add+rmsnorm %d rmsnorm_bwd+add %d matmul+add %d cross_entropy+bwd %d")
  :format(fc[0], fc[1], fc[2], fc[3])
print(("kda %s %s %s %.2fM params batch %dx%d graph=%s | warm step (mean of steps 51..%d, pipelined) %.3f ms | %.3f M tok/s | MFU %.1f%% of %.0f TFLOP/s | first step %.2f s after start | peak mem %.2f GiB | GPU util %.0f%% | final loss %.3f | device %s | step %d alone (synced, median of steps 40..50) %.3f ms | gpu fwd %.3f bwd %.3f opt %.3f ms (last step) | %s")
      :format(opt.arch, opt.optimizer, opt.size, n / 1e6, B, T, os.getenv("KDA_NO_GRAPH") and "no" or "yes", opt.steps - 1, med * 1e3, B * T / med / 1e6,
              100 * fpt * B * T / med / peak, peak / 1e12, first_step, C.kda_cuda_peak_mem_bytes() / 2^30, util[0], loss,
              ffi.string(C.kda_cuda_device_name()), 50, synced * 1e3, stage[0], stage[1], stage[2], fusions))
