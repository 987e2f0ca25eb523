-- ladder.lua — the milestone ladder as data. Each rung: model, budget, the bar it must beat on
-- a domain's held-out window. `kda recipes/ladder.lua [--profile cpu|gpu] [--rung N] [--fresh]`.
-- The profile follows GPU presence. Results persist in runs/ladder/ (a later call continues).
local kda = require "kda"

local profiles = {
  -- tiny models on the small corpus: the whole ladder in minutes on 2 cores. Budgets are given in
  -- tokens here (time-boxed), not the default 20 bytes per parameter; small batches, because
  -- at this size the number of updates matters more than the batch (measured: d64 reached
  -- 3.88 BPB after 160k tokens at batch 8x64, 4.51 at 16x128).
  cpu = {
    corpus = "data/small",
    rungs = {
      { name = "tiny GPT beats the unigram bar on prose", domain = "prose", bar = { order = 1 },
        model = { arch = "gpt", d = 64, layers = 2, heads = 2 }, batch = 8, seq = 64, tokens = 160000, lr = 6e-3 },
      { name = "small GPT beats the bigram bar on prose", domain = "prose", bar = { order = 2 },
        model = { arch = "gpt", d = 96, layers = 3, heads = 3 }, batch = 8, seq = 128, tokens = 400000, lr = 4e-3 },
      { name = "0.84M GPT beats the trigram bar on prose", domain = "prose", bar = { order = 3 },
        model = { arch = "gpt", d = 128, layers = 4, heads = 4 }, batch = 8, seq = 128, tokens = 800000, lr = 3e-3 },
    },
  },
  -- the owner's ladder (an H200); budgets default to 20 bytes per parameter, each rung capped at
  -- 5 minutes of training (max_seconds) as the issue asks.
  gpu = {
    corpus = "data",
    rungs = {
      { name = "~7.5M KDA hybrid beats the unigram bar", domain = "prose", bar = { order = 1 },
        model = { arch = "hybrid", d = 256, layers = 8, heads = 4 }, batch = 64, seq = 512, lr = 3e-3, max_seconds = 300, eval_every = 500 },
      { name = "~7.5M KDA hybrid beats the strongest n-gram bar on prose", domain = "prose", bar = { strongest = true },
        model = { arch = "hybrid", d = 256, layers = 8, heads = 4 }, batch = 64, seq = 512, lr = 3e-3, max_seconds = 300, eval_every = 500 },
      { name = "20-30M hybrid beats the strongest bar (and the 7.5M curve at equal tokens)", domain = "prose",
        bar = { strongest = true }, compare = 2, model = { arch = "hybrid", d = 512, layers = 8, heads = 8 }, batch = 64, seq = 512,
        lr = 2e-3, max_seconds = 300, eval_every = 500 },
      { name = "domain arm: dna beats its strongest n-gram bar", domain = "dna", bar = { strongest = true },
        model = { arch = "hybrid", d = 256, layers = 8, heads = 4 }, batch = 64, seq = 512, lr = 3e-3, max_seconds = 300, eval_every = 500 },
      { name = "domain arm: code beats its strongest n-gram bar", domain = "code", bar = { strongest = true },
        model = { arch = "hybrid", d = 256, layers = 8, heads = 4 }, batch = 64, seq = 512, lr = 3e-3, max_seconds = 300, eval_every = 500 },
      { name = "domain arm: math beats its strongest n-gram bar", domain = "math", bar = { strongest = true },
        model = { arch = "hybrid", d = 256, layers = 8, heads = 4 }, batch = 64, seq = 512, lr = 3e-3, max_seconds = 300, eval_every = 500 },
      { name = "post-training: SFT -> execution-grounded RLVR -> distillation", pending = "no issue yet" },
      { name = "1B model", pending = "no issue yet" },
    },
  },
}

local opts = kda.args.opts or {}
local name = opts.profile or (kda.cuda() and "gpu" or "cpu")
local profile = profiles[name] or error(("unknown profile '%s': use cpu or gpu"):format(tostring(name)), 0)
require("kda.cli").apply_set(profile, kda.args.set)
print(("ladder: profile %s on %s"):format(name, profile.corpus))
return require("kda.ladder").run(profile, { rung = tonumber(opts.rung), fresh = opts.fresh })
