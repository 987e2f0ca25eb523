-- ngram.lua — the bars: per domain, bits per byte on the held-out window for the n-gram
-- methods (back-off, Kneser-Ney, PPM) at orders 1..8, plus compressor anchors, and the strongest.
--   kda recipes/ngram.lua                                  -- data/small (bash vendor/data.sh small)
--   kda recipes/ngram.lua --set manifest=data --set train_mb=64 --set anchors=false
local kda = require "kda"
local cfg = { manifest = "data/small", max_order = 8, train_mb = 0, tail_mb = 8, seq = 0, anchors = true }
require("kda.cli").apply_set(cfg, kda.args.set)

local d = require("kda.data").open{ manifest = cfg.manifest }
local ngram = require "kda.ngram"
local res = ngram.bars(d, { max_order = cfg.max_order, train_bytes = math.floor(cfg.train_mb * 1048576),
                            tail_bytes = math.floor(cfg.tail_mb * 1048576), seq_len = cfg.seq,
                            anchors = cfg.anchors })
print(("n-gram bars on %s (BPB on each domain's held-out window, %s)")
      :format(cfg.manifest, cfg.seq > 0 and ("sequences of " .. cfg.seq) or "full context"))
ngram.print_bars(res)
return 0
