-- benches/gate_ab.lua — does the KDA layer's default backward (fla's gate-gradient precision) cost
-- quality against precise_gate (A_log / dt_bias gradients at fp32 level, ~2x the backward's time)?
-- Trains the hybrid twice from the same seed on the same bytes, once each way, alternating the
-- order per repeat, and prints held-out bits per byte, the last logged training loss and the
-- training time of each run. CUDA backend (on the CPU both ways are the same fp32 code):
--   kda --trust benches/gate_ab.lua [steps=400] [batch=64] [seq=512] [d=256] [layers=8] [heads=4] [reps=1]
local kda = require "kda"
local opt = { steps = 400, batch = 64, seq = 512, d = 256, layers = 8, heads = 4, lr = 3e-3, reps = 1,
              data = "data/small/prose.txt" }
for _, a in ipairs(arg or {}) do
  local k, v = a:match("^(%w+)=(.*)$")
  if k then opt[k] = tonumber(v) or v end
end

local function run(precise)
  local r = kda.train { model = kda.nn.hybrid { d = opt.d, layers = opt.layers, heads = opt.heads, precise_gate = precise },
                        data = { { path = opt.data, name = "prose" } }, batch = opt.batch, seq = opt.seq,
                        steps = opt.steps, lr = opt.lr, warmup = 50, seed = 1, quiet = true, log_every = 50,
                        eval_every = opt.steps }
  print(("gate_ab precise_gate=%-5s  %d steps of %dx%d  held-out bpb %.4f  last train loss %.4f  train %.2f s")
        :format(tostring(precise), opt.steps, opt.batch, opt.seq, r.bpb.prose, r.losses[#r.losses].loss, r.train_seconds))
  io.stdout:flush()
end

for rep = 1, opt.reps do
  local order = rep % 2 == 1 and { false, true } or { true, false }
  for _, precise in ipairs(order) do run(precise) end
end
