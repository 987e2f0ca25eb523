-- tiny.lua — a ~0.85M-parameter byte-level GPT on real English text, on the CPU in ~2 minutes.
-- The text is the licence collection every Debian system ships (base-files:
-- /usr/share/common-licenses); the held-out window is its last 10 % (at most 1 MiB).
local kda = require "kda"
local cfg = {
  model = { d = 128, layers = 4, heads = 4 },
  data = { { path = "/usr/share/common-licenses", name = "licenses" } },
  batch = 16, seq = 128, steps = 300, lr = 3e-3, warmup = 20, log_every = 25, eval_every = 100,
}
require("kda.cli").apply_set(cfg, kda.args.set)
cfg.model = kda.nn.GPT(cfg.model)
local r = kda.train(cfg)
print(("held-out BPB %.4f after %d steps (%d tokens, %.1f s, %.0f tok/s)")
      :format(r.bpb.licenses, r.steps, r.tokens, r.train_seconds, r.tokens / r.train_seconds))
return r.bpb.licenses < 8 and 0 or 1
