-- kda.util — errors that point at the recipe, and small helpers shared by the library.
local ffi = require "ffi"
local C = require("kda.ffi").C
local M = {}

-- The first stack frame outside lua/kda/: the user's recipe or REPL line.
local function user_frame()
  for level = 3, 40 do
    local info = debug.getinfo(level, "Sl")
    if not info then break end
    if info.currentline and info.currentline > 0 and not info.short_src:match("lua/kda/") and info.what ~= "C" then
      return info.short_src .. ":" .. info.currentline .. ": "
    end
  end
  return ""
end

-- Raise msg as an error located at the user's line (no second location prefix).
function M.fail(msg)
  error(user_frame() .. msg, 0)
end

-- rc from C: 0 ok, -1 error (message in kda_last_error).
function M.check(rc, what)
  if rc == nil or (type(rc) == "number" and rc < 0) or (type(rc) == "cdata" and rc == nil) then
    M.fail((what and (what .. ": ") or "") .. ffi.string(C.kda_last_error()))
  end
  return rc
end

function M.shape_str(shape)
  return "[" .. table.concat(shape, ",") .. "]"
end

-- Copy a table so that editing the copy leaves the original alone.
function M.copy(t)
  if type(t) ~= "table" then return t end
  local r = {}
  for k, v in pairs(t) do r[k] = M.copy(v) end
  return r
end

-- Fill defaults into cfg (recursively) and reject keys nobody knows.
function M.defaults(cfg, defs, where)
  cfg = cfg or {}
  for k, _ in pairs(cfg) do
    if defs[k] == nil then M.fail(("%s: unknown field '%s'"):format(where, tostring(k))) end
  end
  local out = {}
  for k, v in pairs(defs) do
    if cfg[k] == nil then out[k] = M.copy(v) else out[k] = cfg[k] end
  end
  return out
end

return M
