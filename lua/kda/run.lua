-- kda.run — a run directory, runs/<name>/ (docs/runs.md):
--   recipe.lua   the recipe text            config.lua  the resolved config (a Lua table)
--   meta.txt     git revision, backend, date metrics.tsv one row per log or eval step
--   ckpt-<step>.model.safetensors / ckpt-<step>.state.safetensors   the last `keep` checkpoints
local ffi = require "ffi"
local C = require("kda.ffi").C
local util = require "kda.util"

local M = { root = "runs" }
local Run = {}
Run.__index = Run

function M.dir(name)
  name = tostring(name)
  if not name:match("^[%w_][%w_%-%.]*$") then
    util.fail(("run name '%s' is not allowed: use letters, digits, '_', '-' and '.' (it is a folder under %s/)"):format(name, M.root))
  end
  return M.root .. "/" .. name
end

-- ---- config.lua: a plain Lua table, written and read back without running recipe code ----
local function ser(v, indent)
  local t = type(v)
  if t == "string" then return ("%q"):format(v) end
  if t == "number" then
    if v ~= v then return "0/0" end
    local short = ("%.15g"):format(v)   -- 0.9, not 0.90000000000000002, when that reads back exact
    return tonumber(short) == v and short or ("%.17g"):format(v)
  end
  if t == "boolean" or t == "nil" then return tostring(v) end
  if t ~= "table" then return ("nil --[[ %s ]]"):format(t) end
  local keys = {}
  for k in pairs(v) do keys[#keys + 1] = k end
  table.sort(keys, function(a, b) return tostring(a) < tostring(b) end)
  local pad, out = indent .. "  ", {}
  for _, k in ipairs(keys) do
    local key = type(k) == "string" and k:match("^[%a_][%w_]*$") and k or "[" .. ser(k, "") .. "]"
    out[#out + 1] = pad .. key .. " = " .. ser(v[k], pad) .. ","
  end
  return "{\n" .. table.concat(out, "\n") .. "\n" .. indent .. "}"
end
function M.serialize(v) return "return " .. ser(v, "") .. "\n" end

-- The model as a spec sample can rebuild: {arch="gpt"|"hybrid", ...}, or {arch="custom"}.
function M.model_spec(model)
  if model.spec then return model.spec end
  local mt = getmetatable(model)
  if mt and mt.__name == "GPT" and model.cfg and not model.cfg.mixers then
    local s = util.copy(model.cfg)
    s.arch, s.mixers = "gpt", nil
    return s
  end
  return { arch = "custom" }
end

function M.load_config(name)
  local path = M.dir(name) .. "/config.lua"
  local f = io.open(path, "r")
  if not f then util.fail(("run '%s': %s does not exist: is it a run under %s/?"):format(name, path, M.root)) end
  f:close()
  local chunk, err = loadfile(path)
  if not chunk then util.fail(("run '%s': %s is not valid Lua (%s): fix or delete it"):format(name, path, err)) end
  setfenv(chunk, {})   -- data only: no globals
  return chunk()
end

local function read_file(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local s = f:read("*a")
  f:close()
  return s
end

local function write_file(path, text)
  local f, err = io.open(path, "wb")
  if not f then util.fail(("run: cannot write %s (%s): check the run dir"):format(path, err)) end
  f:write(text)
  f:close()
end

local function git_rev()
  local p = io.popen("git rev-parse --short HEAD 2>/dev/null")
  local rev = p and p:read("*l")
  if p then p:close() end
  return rev or "unknown"
end

-- ---- checkpoints ----------------------------------------------------------------------------
function M.checkpoints(dir)
  local n = C.kda_ckpt_list(dir, nil, 0)
  local buf = ffi.new("int64_t[?]", math.max(n, 1))
  n = C.kda_ckpt_list(dir, buf, n)
  local steps = {}
  for i = 0, n - 1 do steps[#steps + 1] = tonumber(buf[i]) end
  return steps
end

function M.prefix(dir, step) return ("%s/ckpt-%d"):format(dir, step) end

-- Loads the newest checkpoint that validates; a refused one is named in one line and the one
-- before it is tried. Returns {step=, data_seed=, data_step=} or nil when none loads.
-- params_only: the model file alone (a plan without optimizer state).
function M.load_latest(dir, plan, G, params_only, say)
  local steps = M.checkpoints(dir)
  local meta = ffi.new("uint64_t[?]", C.KDA_CKPT_NMETA)
  local load = params_only and C.kda_ckpt_load_params or C.kda_ckpt_load
  for i = #steps, 1, -1 do
    local rc = load(plan.p, G.g, M.prefix(dir, steps[i]), meta)
    if rc == 0 and tonumber(meta[C.KDA_CKPT_STEP]) == steps[i] then
      return { step = steps[i], data_seed = meta[C.KDA_CKPT_DATA_SEED], data_step = meta[C.KDA_CKPT_DATA_STEP] }
    end
    local why = rc == 0 and "the step in its metadata differs from its name" or ffi.string(C.kda_last_error())
    if say then say(("checkpoint %d refused: %s%s"):format(steps[i], why, i > 1 and "; trying the one before" or "")) end
  end
  return nil
end

-- ---- a run being trained ---------------------------------------------------------------------
local function columns(domains)
  local cols = { "step", "tokens", "loss" }
  for _, d in ipairs(domains) do cols[#cols + 1] = "bpb_" .. d end
  for _, c in ipairs { "lr", "grad_norm", "tok_s", "mfu" } do cols[#cols + 1] = c end
  return cols
end

-- Opens (creating) runs/<name>/. fresh: remove earlier checkpoints and metrics; resume_step: keep
-- metrics rows up to that step only (a killed run may have logged past its last checkpoint).
function M.open(name, o)
  local self = setmetatable({ name = tostring(name), keep = o.keep or 3, domains = o.domains }, Run)
  self.dir = M.dir(name)
  util.check(C.kda_mkdirs(self.dir), "run")
  self.cols = columns(o.domains)
  local metrics = self.dir .. "/metrics.tsv"
  if o.resume_step then
    local old, rows = read_file(metrics) or "", {}
    for line in old:gmatch("[^\n]+") do
      local s = tonumber(line:match("^(%d+)\t"))
      if #rows == 0 or (s and s <= o.resume_step) then rows[#rows + 1] = line end
    end
    if #rows == 0 then rows[1] = table.concat(self.cols, "\t") end
    write_file(metrics, table.concat(rows, "\n") .. "\n")
    write_file(self.dir .. "/config.lua", M.serialize(o.config))   -- the config that continues
    local meta = io.open(self.dir .. "/meta.txt", "a")
    if meta then meta:write(("resumed\t%d\t%s\t%s\n"):format(o.resume_step, git_rev(), os.date("!%Y-%m-%dT%H:%M:%SZ"))); meta:close() end
  else
    for _, s in ipairs(M.checkpoints(self.dir)) do self:remove(s) end
    write_file(metrics, table.concat(self.cols, "\t") .. "\n")
    local script = o.script and read_file(o.script)
    write_file(self.dir .. "/recipe.lua", script or "-- (no recipe file: kda.train was called directly)\n")
    write_file(self.dir .. "/config.lua", M.serialize(o.config))
    write_file(self.dir .. "/meta.txt", ("git\t%s\nversion\t%s\nbackend\t%s\ndevice\t%s\ndate\t%s\n")
      :format(git_rev(), ffi.string(C.kda_version()), o.backend, o.device or o.backend, os.date("!%Y-%m-%dT%H:%M:%SZ")))
  end
  self.metrics = assert(io.open(metrics, "a"))
  return self
end

-- row: {step=, tokens=, loss=, bpb={domain=value}, lr=, grad_norm=, tok_s=, mfu=}; missing = empty.
function Run:log(row)
  local out = {}
  for i, c in ipairs(self.cols) do
    local v = c:match("^bpb_") and row.bpb and row.bpb[c:sub(5)] or row[c]
    if v == nil then out[i] = ""
    elseif type(v) ~= "number" then out[i] = tostring(v)
    else out[i] = (math.floor(v) == v and "%.0f" or "%.8g"):format(v) end
  end
  self.metrics:write(table.concat(out, "\t"), "\n")
  self.metrics:flush()
end

function Run:remove(step)
  local p = M.prefix(self.dir, step)
  os.remove(p .. ".model.safetensors")  -- first: without it the checkpoint no longer counts
  os.remove(p .. ".state.safetensors")
end

-- Saves ckpt-<step> and keeps the newest `keep`.
function Run:save(plan, G, step, data_state)
  local meta = ffi.new("uint64_t[?]", C.KDA_CKPT_NMETA)
  meta[C.KDA_CKPT_STEP], meta[C.KDA_CKPT_DATA_SEED], meta[C.KDA_CKPT_DATA_STEP] = step, data_state[0], data_state[1]
  util.check(C.kda_ckpt_save(plan.p, G.g, M.prefix(self.dir, step), meta), "run " .. self.name)
  local steps = M.checkpoints(self.dir)
  for i = 1, #steps - self.keep do self:remove(steps[i]) end
end

function Run:close() if self.metrics then self.metrics:close(); self.metrics = nil end end

return M
