-- kda.ngram — the n-gram bars and compressor anchors (core/ngram.h) for a kda.data corpus.
--
--   local ngram = require "kda.ngram"
--   local res = ngram.bars(d, { max_order = 8 })   -- d from kda.data.open
--   ngram.print_bars(res)
local ffi = require "ffi"
local C = require("kda.ffi").C
local util = require "kda.util"

local M = { methods = { "backoff", "kn", "ppm" }, tools = { "xz", "zstd", "ppmd" } }
local method_id = { backoff = C.KDA_NGRAM_BACKOFF, kn = C.KDA_NGRAM_KN, ppm = C.KDA_NGRAM_PPM }

-- Train on domain i's training bytes (the last max_bytes before its window; 0 = all).
function M.train(d, i, max_order, max_bytes)
  local m = C.kda_ngram_train_domain(d.d, d:index(i), max_order or 8, max_bytes or 0)
  if m == nil then util.fail("ngram: " .. ffi.string(C.kda_last_error())) end
  return ffi.gc(m, C.kda_ngram_free)
end

-- BPB on the held-out window for orders 1..max_order of one method -> array.
function M.bpb_orders(m, method, d, i, seq_len)
  local n = C.kda_ngram_max_order(m)
  local out = ffi.new("double[?]", n)
  util.check(C.kda_ngram_bpb_orders(m, method_id[method] or method, d.d, d:index(i), seq_len or 0, out), "ngram bpb")
  local t = {}
  for k = 1, n do t[k] = out[k - 1] end
  return t
end

-- Compressor anchor: BPB of the window given the last tail_bytes of training. nil, why if unavailable.
function M.anchor(tool, d, i, tail_bytes)
  if C.kda_anchor_available(tool) == 0 then return nil, tool .. " not installed" end
  local v = C.kda_anchor_bpb(tool, d.d, d:index(i), tail_bytes)
  if v < 0 then return nil, ffi.string(C.kda_last_error()) end
  return v
end

-- Every domain: method x order table, anchors, counting speed, and the strongest bar.
-- opts: max_order (8), train_bytes (0 = all), tail_bytes (8 MiB), seq_len (0 = whole window), anchors (true).
function M.bars(d, opts)
  opts = opts or {}
  local res = {}
  for _, dom in ipairs(d:domains()) do
    local m = M.train(d, dom.index, opts.max_order or 8, opts.train_bytes or 0)
    local r = { name = dom.name, window_start = dom.window_start, bytes = dom.bytes, table = {}, anchors = {},
                trained = tonumber(C.kda_ngram_trained_bytes(m)),
                count_mbps = tonumber(C.kda_ngram_trained_bytes(m)) / 1e6 / C.kda_ngram_count_seconds(m),
                memory_mb = tonumber(C.kda_ngram_memory_bytes(m)) / 1e6 }
    r.best, r.best_name = math.huge, "?"
    for _, meth in ipairs(M.methods) do
      r.table[meth] = M.bpb_orders(m, meth, d, dom.index, opts.seq_len or 0)
      for k, v in ipairs(r.table[meth]) do
        if v < r.best then r.best, r.best_name = v, meth .. "-" .. k end
      end
    end
    if opts.anchors ~= false then
      for _, tool in ipairs(M.tools) do
        local v, why = M.anchor(tool, d, dom.index, opts.tail_bytes or 8 * 1048576)
        r.anchors[tool] = v or why
        if v and v < r.best then r.best, r.best_name = v, tool end
      end
    end
    res[#res + 1] = r
  end
  return res
end

function M.print_bars(res)
  for _, r in ipairs(res) do
    print(("\n%s: window [%d, %d), n-grams on %.2f MB before it (count %.1f MB/s, %.0f MB of tables)")
          :format(r.name, r.window_start, r.bytes, r.trained / 1e6, r.count_mbps, r.memory_mb))
    local n = #r.table.kn
    local head = { ("%-8s"):format("method") }
    for k = 1, n do head[#head + 1] = ("%7d"):format(k) end
    print(table.concat(head, " "))
    for _, meth in ipairs(M.methods) do
      local row = { ("%-8s"):format(meth) }
      for k = 1, n do row[#row + 1] = ("%7.4f"):format(r.table[meth][k]) end
      print(table.concat(row, " "))
    end
    local a = {}
    for _, tool in ipairs(M.tools) do
      local v = r.anchors[tool]
      if v ~= nil then a[#a + 1] = type(v) == "number" and ("%s %.4f"):format(tool, v) or ("%s skipped (%s)"):format(tool, v) end
    end
    if #a > 0 then print("anchors (adaptive compressors): " .. table.concat(a, ", ")) end
    print(("strongest bar: %s %.4f BPB"):format(r.best_name, r.best))
  end
end

return M
