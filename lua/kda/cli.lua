-- kda.cli — the command line: recipes, -e, the REPL, and subcommands.
local ffi = require "ffi"
local C = require("kda.ffi").C

local M = {}

local usage = [[
usage: kda [options] [FILE.lua | COMMAND] [args...]

  kda FILE.lua [args]     run a recipe (its args are in `arg` and kda.args)
  kda -e 'CODE'           run a line of Lua with the library loaded
  kda                     interactive REPL (line editing, history in ~/.kda_history)
  kda ngram [args]        n-gram bars for the data domains (recipes/ngram.lua)
  kda report RUN... [--out FILE]   HTML plots of runs/RUN/metrics.tsv (default runs/report.html)
  kda sample RUN [--prompt TEXT] [-n N] [--temperature T] [--seed S] [--backend cpu|cuda]
                          bytes from the newest checkpoint of runs/RUN (CUDA when a GPU answers)
  kda data [small|full]   build the corpus into data/ (vendor/data.sh)

options (before the file; also accepted after it):
  --set key=value         override a recipe field (repeatable; dotted keys reach nested tables)
  --trust                 run the recipe without the sandbox (os.execute, io.popen, ffi allowed)
  --profile NAME          ladder profile (cpu or gpu); default by GPU presence
  --rung N                run one ladder rung
  --resume                continue the recipe's run (--set run=NAME) from its newest valid checkpoint
  --fresh                 start the run over, deleting its checkpoints
  --no-graph              run CUDA steps eagerly instead of replaying a captured graph
  -h, --help              this text
  -v, --version           print the version]]

local flags_with_value = { ["--set"] = true, ["--profile"] = true, ["--rung"] = true }
local flags_plain = { ["--trust"] = true, ["--no-graph"] = true, ["--resume"] = true, ["--fresh"] = true }

-- Split argv into options and positional args; unknown flags are an error.
function M.parse(argv)
  local opts, pos, set = {}, {}, {}
  local i = 1
  while i <= #argv do
    local a = argv[i]
    if a == "--" then
      for j = i + 1, #argv do pos[#pos + 1] = argv[j] end
      break
    elseif flags_with_value[a] then
      local v = argv[i + 1]
      if v == nil then error(("option %s needs a value (see kda --help)"):format(a), 0) end
      if a == "--set" then
        local k, val = v:match("^([%w_%.]+)=(.*)$")
        if not k then error(("--set wants key=value, got '%s'"):format(v), 0) end
        set[#set + 1] = { k, val }
      else
        opts[a:sub(3)] = v
      end
      i = i + 2
    elseif flags_plain[a] then
      opts[a:sub(3)] = true
      i = i + 1
    elseif a:match("^%-%-?%a") and #pos == 0 or (a:match("^%-%-") and pos[1] and pos[1]:match("%.lua$")) then
      error(("unknown option '%s' (see kda --help)"):format(a), 0)
    else
      pos[#pos + 1] = a
      i = i + 1
    end
  end
  opts.set = set
  return opts, pos
end

-- "3e-3" -> number, "true" -> boolean, else string.
local function coerce(v)
  if v == "true" then return true elseif v == "false" then return false end
  return tonumber(v) or v
end

-- Apply --set overrides to a config table (dotted keys reach nested tables).
function M.apply_set(cfg, set)
  for _, kv in ipairs(set or {}) do
    local t, path = cfg, {}
    for part in kv[1]:gmatch("[^%.]+") do path[#path + 1] = part end
    for j = 1, #path - 1 do
      local k = tonumber(path[j]) or path[j]
      if type(t[k]) ~= "table" then t[k] = {} end
      t = t[k]
    end
    local last = path[#path]
    t[tonumber(last) or last] = coerce(kv[2])
  end
  return cfg
end

local function run_file(path, opts, args)
  local kda = require "kda"
  local f = io.open(path, "r")
  if not f then error(("cannot open recipe '%s': no such file (check the path)"):format(path), 0) end
  f:close()
  local chunk, err = loadfile(path)
  if not chunk then error(err, 0) end
  kda.args = { opts = opts, set = opts.set, positional = args, script = path }
  if opts["no-graph"] and kda.C.kda_cuda_available() == 1 then kda.C.kda_cuda_set_graphs(0) end
  local env = require("kda.sandbox").env(kda, opts.trust, args)
  setfenv(chunk, env)
  local ok, res = xpcall(function() return chunk(unpack(args)) end, function(e)
    if os.getenv("KDA_TRACE") then return debug.traceback(tostring(e), 2) end
    return tostring(e)
  end)
  if not ok then error(res, 0) end
  if type(res) == "number" then return res end
  return 0
end

local function repl()
  local kda = require "kda"
  local env = setmetatable({ kda = kda }, { __index = _G })
  for k, v in pairs { randn = kda.randn, zeros = kda.zeros, ones = kda.ones, tensor = kda.tensor } do env[k] = v end
  local home = os.getenv("HOME") or "."
  local hist = home .. "/.kda_history"
  C.kda_history_load(hist)
  print(kda.version() .. " — Lua " .. (jit and jit.version or _VERSION) ..
        (kda.cuda() and " — CUDA" or " — CPU only") .. ". Try: x = kda.randn(4,4); print(x:matmul(x))")
  while true do
    local p = C.kda_readline("kda> ")
    if p == nil then break end
    local line = ffi.string(p)
    if line:match("%S") then
      C.kda_history_add(line)
      local chunk = loadstring("return " .. line, "=stdin")
      if not chunk then chunk = loadstring(line, "=stdin") end
      local ok, err
      if chunk then
        setfenv(chunk, env)
        local res = { pcall(chunk) }
        ok = table.remove(res, 1)
        if ok then
          for i = 1, select("#", unpack(res)) do print(tostring(res[i])) end
        else err = res[1] end
      else
        local _, e = loadstring(line, "=stdin")
        err = e
      end
      if err then print("error: " .. tostring(err)) end
    end
  end
  C.kda_history_save(hist)
  print()
  return 0
end

-- Options of a subcommand: spec maps "--flag" to "string" or "number"; the rest is positional.
local function parse_sub(cmd, args, spec)
  local o, pos, i = {}, {}, 1
  while i <= #args do
    local a = args[i]
    if spec[a] then
      local v = args[i + 1]
      if v == nil then error(("%s: %s needs a value"):format(cmd, a), 0) end
      if spec[a] == "number" then
        v = tonumber(v) or error(("%s: %s wants a number, got '%s'"):format(cmd, a, args[i + 1]), 0)
      end
      o[a:gsub("^%-+", "")] = v
      i = i + 2
    elseif a:match("^%-") then error(("%s: unknown option '%s' (see kda --help)"):format(cmd, a), 0)
    else pos[#pos + 1] = a; i = i + 1 end
  end
  return o, pos
end

local subcommands = {
  report = function(args)
    local o, names = parse_sub("report", args, { ["--out"] = "string" })
    local out = require("kda.report").write(names, o.out or "runs/report.html")
    print("wrote " .. out)
    return 0
  end,
  sample = function(args)
    local o, pos = parse_sub("sample", args, { ["--prompt"] = "string", ["-n"] = "number", ["--temperature"] = "number",
                                               ["--seed"] = "number", ["--backend"] = "string" })
    if #pos ~= 1 then error("sample: name one run, e.g. kda sample tiny --prompt 'The ' -n 200", 0) end
    local prompt = o.prompt or ""
    local text = require("kda.sample").generate { run = pos[1], prompt = prompt, n = o.n or 200,
                                                  temperature = o.temperature or 1, seed = o.seed or 1,
                                                  backend = o.backend }
    io.write(prompt, text, "\n")
    return 0
  end,
}

function M.main(argv)
  if subcommands[argv[1]] then return subcommands[argv[1]]({ unpack(argv, 2) }) end
  if argv[1] == "-h" or argv[1] == "--help" then print(usage) return 0 end
  if argv[1] == "-v" or argv[1] == "--version" then print(ffi.string(C.kda_version())) return 0 end
  if argv[1] == "-e" then
    if not argv[2] then io.stderr:write("kda: -e needs a line of Lua code\n") return 2 end
    local chunk, err = loadstring(argv[2], "=(command line)")
    if not chunk then error(err, 0) end
    setfenv(chunk, setmetatable({ kda = require "kda" }, { __index = _G }))
    chunk()
    return 0
  end
  local ok, opts, pos = pcall(M.parse, argv)
  if not ok then
    io.stderr:write("kda: " .. tostring(opts) .. "\n")
    return 2
  end
  local first = pos[1]
  if not first then return repl() end
  local rest = { unpack(pos, 2) }
  if first == "ngram" then return run_file(KDA_ROOT .. "/recipes/ngram.lua", opts, rest) end
  if first == "data" then
    return os.execute(("bash %q/vendor/data.sh %s"):format(KDA_ROOT, rest[1] or "full")) == 0 and 0 or 1
  end
  if not first:match("%.lua$") then
    local f = io.open(first, "r")
    if not f then
      io.stderr:write(("kda: '%s' is neither a recipe file nor a command (see kda --help)\n"):format(first))
      return 2
    end
    f:close()
  end
  return run_file(first, opts, rest)
end

return M
