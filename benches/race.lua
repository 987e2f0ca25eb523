-- benches/race.lua — kda's side of the quality race (issue 5): the ~7M KDA hybrid on the prose
-- domain, the same bytes, window and token budget as `gpt_peer.py --data` on the same card.
-- Prints one line per evaluation: tokens, training seconds (evaluation excluded), held-out BPB.
--   kda --trust benches/race.lua corpus=/tmp/corpus tokens=150e6 eval_every=500 [max_seconds=S]
local kda = require "kda"
local opt = { corpus = "data", tokens = 150e6, eval_every = 500, max_seconds = 0, batch = 64, seq = 512, lr = 3e-3,
              d = 256, layers = 8, heads = 4 }
for _, a in ipairs(arg or {}) do
  local k, v = a:match("^([%w_]+)=(.*)$")
  if k then opt[k] = tonumber(v) or v end
end
local steps = math.floor(opt.tokens / (opt.batch * opt.seq))
local r = kda.train { model = { arch = "hybrid", d = opt.d, layers = opt.layers, heads = opt.heads },
                      data = { manifest = opt.corpus, domains = { "prose" } }, batch = opt.batch, seq = opt.seq,
                      steps = steps, lr = opt.lr, warmup = math.min(100, math.floor(steps / 10)), log_every = 250,
                      eval_every = opt.eval_every, max_seconds = opt.max_seconds }
print(("# kda race: hybrid %.2fM params, batch %dx%d, %d steps planned"):format(r.params / 1e6, opt.batch, opt.seq, steps))
for _, e in ipairs(r.evals) do
  print(("race: step %d tokens %d train_seconds %.2f bpb %.4f"):format(e.step, e.tokens, e.train_seconds, e.eval.prose.bpb))
end
