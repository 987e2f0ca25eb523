-- kda.data — byte corpora from Lua (core/data.h): open domains, draw training batches, walk the
-- held-out windows. Thin: every loop over bytes is in C.
--
--   local data = require "kda.data"
--   local d = data.open{ manifest = "data/small" }            -- or { {path=, name=, weight=}, ... }
--   d:start(16, 128, 1)                                       -- B, T, seed (prefetch on)
--   local tokens, targets = d:next()                          -- const int32_t* [B,T], valid until next
--   for k, x, y, first in d:window("prose", 128) do ... end   -- every window byte once (y[j], j >= first)
local ffi = require "ffi"
local C = require("kda.ffi").C
local util = require "kda.util"

local M = {}
local Data = {}
Data.__index = Data

-- A domain may be pinned to the bytes a recipe was written for: "prose@6a2633e0" names the
-- domain and a prefix of its sha256 as recorded in MANIFEST (written by vendor/data.sh). A
-- shared recipe then runs on another machine's corpus only if it holds the same bytes.
local function pinned(dir, names)
  local out, want = {}, {}
  for i, n in ipairs(names) do
    local name, sum = n:match("^([^@]+)@(%x+)$")
    out[i] = name or n
    if name then want[name] = sum:lower() end
  end
  if next(want) == nil then return out end
  local f = io.open(dir .. "/MANIFEST", "r")
  if not f then util.fail(("data: %s/MANIFEST is missing: build the corpus with 'bash vendor/data.sh'"):format(dir)) end
  local have = {}
  for line in f:lines() do
    local name, sha = line:match("^domain%s+(%S+)%s+%d+%s+(%x+)%s")
    if name then have[name] = sha:lower() end
  end
  f:close()
  for name, sum in pairs(want) do
    if not have[name] then util.fail(("data: %s/MANIFEST has no domain '%s'"):format(dir, name)) end
    if have[name]:sub(1, #sum) ~= sum then
      util.fail(("data: domain '%s' in %s has sha256 %s..., the recipe asks for %s...: it was written for other bytes; rebuild the corpus or update the recipe")
                :format(name, dir, have[name]:sub(1, 12), sum))
    end
  end
  return out
end
M.pinned = pinned

-- spec: {manifest = dir, domains = {names...}, weights = {...}} or a list of {path=, name=, weight=}.
-- Domain names may carry a checksum pin: "prose@6a2633e0" (see pinned above).
function M.open(spec)
  local d
  local keep = {}
  if spec.manifest then
    local names = pinned(spec.manifest, spec.domains or {})
    local n = #names
    local cnames = ffi.new("const char*[?]", math.max(n, 1), names)
    local w = spec.weights and ffi.new("double[?]", n, spec.weights) or nil
    keep = { cnames, w }
    d = C.kda_data_open_manifest(spec.manifest, n, cnames, w)
  else
    local n = #spec
    if n == 0 then util.fail("data.open: give a list of {path=..., name=...} or {manifest=dir}") end
    local paths, names, weights = ffi.new("const char*[?]", n), ffi.new("const char*[?]", n), ffi.new("double[?]", n)
    for i, s in ipairs(spec) do
      paths[i - 1], names[i - 1], weights[i - 1] = s.path, s.name, s.weight or 1
      keep[#keep + 1] = s.path
      keep[#keep + 1] = s.name
    end
    d = C.kda_data_open(n, paths, names, weights)
  end
  if d == nil then util.fail("data: " .. ffi.string(C.kda_last_error())) end
  return setmetatable({ d = ffi.gc(d, C.kda_data_free) }, Data)
end

-- A domain by 0-based index or by name -> 0-based index.
function Data:index(i)
  if type(i) == "number" then return i end
  for j = 0, C.kda_data_ndomains(self.d) - 1 do
    if ffi.string(C.kda_data_domain_name(self.d, j)) == i then return j end
  end
  util.fail("data: no domain named '" .. tostring(i) .. "'")
end

function Data:domains()
  local out = {}
  for i = 0, C.kda_data_ndomains(self.d) - 1 do
    out[#out + 1] = { index = i, name = ffi.string(C.kda_data_domain_name(self.d, i)),
                      bytes = tonumber(C.kda_data_domain_bytes(self.d, i)),
                      window_start = tonumber(C.kda_data_window_start(self.d, i)),
                      window = tonumber(C.kda_data_window_bytes(self.d, i)),
                      weight = tonumber(C.kda_data_domain_weight(self.d, i)) }
  end
  return out
end

function Data:set_window(i, bytes) util.check(C.kda_data_set_window(self.d, self:index(i), bytes), "data window") end

function Data:start(B, T, seed, prefetch)
  self.B, self.T = B, T
  util.check(C.kda_data_start(self.d, B, T, seed or 1, prefetch == false and 0 or 1), "data start")
end

-- Next training batch: pointers to int32 tokens and targets [B,T], owned by the handle.
function Data:next()
  util.check(C.kda_data_next_batch(self.d, nil, nil), "data")
  return C.kda_data_batch_tokens(self.d), C.kda_data_batch_targets(self.d)
end

-- Sampler state for checkpoints: seed, step as uint64 cdata (exact beyond 2^53).
function Data:state()
  local s = ffi.new("uint64_t[2]")
  util.check(C.kda_data_get_state(self.d, s), "data state")
  return s[0], s[1]
end

function Data:set_state(seed, step)
  util.check(C.kda_data_set_state(self.d, ffi.new("uint64_t[2]", seed, step)), "data state")
end

-- Iterate the held-out window of domain i as sequences of T: yields k, input, target (int32[T],
-- reused between steps) and first (targets j >= first are the ones this sequence counts).
function Data:window(i, T)
  local idx = self:index(i)
  local n = util.check(tonumber(C.kda_data_window_count(self.d, idx, T)), "window")
  local x, y = ffi.new("int32_t[?]", T), ffi.new("int32_t[?]", T)
  local k = -1
  return function()
    k = k + 1
    if k >= n then return nil end
    local first = util.check(tonumber(C.kda_data_window_seq(self.d, idx, T, k, x, y)), "window")
    return k, x, y, first
  end
end

return M
