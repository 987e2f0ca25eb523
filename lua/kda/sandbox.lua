-- kda.sandbox — the environment a recipe runs in. Recipes are shared like documents but are
-- code; without --trust they get no os.execute, io.popen, ffi, loadlib or raw C access, and may
-- write files only under their run directory (runs/).
local M = {}

local safe_os = { "clock", "date", "difftime", "getenv", "time" }
local safe_globals = { "assert", "error", "ipairs", "next", "pairs", "pcall", "print", "rawequal", "rawget",
                       "rawlen", "rawset", "select", "setmetatable", "getmetatable", "tonumber", "tostring",
                       "type", "unpack", "xpcall", "math", "string", "table", "coroutine", "bit" }

local function denied(name)
  return function() error(name .. " is not allowed in a recipe without --trust", 2) end
end

-- Writes only below allowed_dir; reads anywhere.
local function guarded_open(allowed_dir)
  return function(path, mode)
    mode = mode or "r"
    if mode:match("[wa+]") then
      local p = tostring(path)
      if p:find("%.%.") or p:sub(1, #allowed_dir + 1) ~= allowed_dir .. "/" then
        error(("writing '%s' is not allowed in a recipe without --trust (only under %s/)"):format(p, allowed_dir), 2)
      end
    end
    return io.open(path, mode)
  end
end

-- A restricted `kda` table: the library without the raw C namespace.
local function public_kda(kda)
  local pub = {}
  for k, v in pairs(kda) do if k ~= "C" then pub[k] = v end end
  return pub
end

function M.env(kda, trust, args)
  if trust then
    local env = setmetatable({ kda = kda, arg = args }, { __index = _G })
    return env
  end
  local env = {}
  for _, k in ipairs(safe_globals) do env[k] = _G[k] end
  env.os = {}
  for _, k in ipairs(safe_os) do env.os[k] = os[k] end
  env.os.execute, env.os.remove, env.os.rename, env.os.exit = denied("os.execute"), denied("os.remove"), denied("os.rename"), denied("os.exit")
  env.io = { open = guarded_open("runs"), write = io.write, read = io.read, lines = io.lines, stdout = io.stdout,
             stderr = io.stderr, popen = denied("io.popen") }
  env.kda = public_kda(kda)
  env.require = function(name)
    if name == "kda" then return env.kda end
    if name:match("^kda%.") and name ~= "kda.ffi" then return require(name) end
    error("require '" .. tostring(name) .. "' is not allowed in a recipe without --trust", 2)
  end
  env.load, env.loadstring, env.dofile, env.loadfile = denied("load"), denied("loadstring"), denied("dofile"), denied("loadfile")
  env.arg = args
  env._G = env
  return env
end

return M
