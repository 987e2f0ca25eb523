-- kda — the Lua library. `local kda = require "kda"` (preloaded in recipes and the REPL).
local ffi = require "ffi"
local C = require("kda.ffi").C
local tensor = require "kda.tensor"

local kda = {
  C = C,
  nn = require "kda.nn",
  graph = require "kda.graph",
  Plan = require "kda.plan",
  util = require "kda.util",
  Tensor = tensor.Tensor,
  tensor = tensor.from,
  zeros = tensor.zeros,
  ones = tensor.ones,
  randn = tensor.randn,
  manual_seed = tensor.manual_seed,
  args = {},      -- parsed command line of the running recipe (--set key=value lands in args.set)
}

function kda.version() return ffi.string(C.kda_version()) end
function kda.cuda() return C.kda_cuda_available() == 1 end
function kda.now() return C.kda_now() end
function kda.train(cfg) return require("kda.train").run(cfg) end
function kda.Graph() return require("kda.graph").new() end

return kda
