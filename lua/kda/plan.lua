-- kda.plan — a built graph ready to run: arena, persistent state, exec list (core/plan.c).
local ffi = require "ffi"
local C = require("kda.ffi").C
local util = require "kda.util"

local Plan = {}
Plan.__index = Plan

local backends = { cpu = C.KDA_BACKEND_CPU, cuda = C.KDA_BACKEND_CUDA }

function Plan.build(G, backend)
  local p = C.kda_plan_build(G.g, backends[backend or "cpu"] or util.fail("unknown backend '" .. tostring(backend) .. "'"))
  if p == nil then util.fail(ffi.string(C.kda_last_error())) end
  return setmetatable({ p = ffi.gc(p, C.kda_plan_free), G = G, backend = backend or "cpu" }, Plan)
end

function Plan:init_params(seed) util.check(C.kda_plan_init_params(self.p, seed or 0), "init") end
function Plan:run(forward_only)
  util.check(C.kda_plan_run(self.p, forward_only and C.KDA_RUN_FORWARD or C.KDA_RUN_STEP), "run")
end
function Plan:write(node, ptr, bytes) util.check(C.kda_plan_write(self.p, node.id, ptr, bytes), "write") end
function Plan:read(node, ptr, bytes) util.check(C.kda_plan_read(self.p, node.id, ptr, bytes), "read") end

-- One float (scalars: loss, grad norm) or a table of floats.
function Plan:read_floats(node, n)
  n = n or node:numel()
  local buf = ffi.new("float[?]", n)
  self:read(node, buf, 4 * n)
  if n == 1 then return tonumber(buf[0]) end
  local t = {}
  for i = 0, n - 1 do t[i + 1] = tonumber(buf[i]) end
  return t
end

function Plan:memory()
  return { arena = tonumber(C.kda_plan_arena_bytes(self.p)), naive = tonumber(C.kda_plan_naive_bytes(self.p)),
           persistent = tonumber(C.kda_plan_persistent_bytes(self.p)) }
end

-- Persistent state (parameters, optimizer moments, schedule) by name: {name=, node=, numel=}.
function Plan:state()
  local out = {}
  for i = 0, C.kda_plan_nstate(self.p) - 1 do
    local id = C.kda_plan_state_node(self.p, i)
    local n = setmetatable({ G = self.G, id = id }, require("kda.graph").Node)
    out[#out + 1] = { name = ffi.string(C.kda_plan_state_name(self.p, i)), node = n, numel = n:numel() }
  end
  return out
end

function Plan:profile(on) C.kda_plan_set_profile(self.p, on and 1 or 0) end
function Plan:op_seconds(opname)
  return C.kda_plan_op_seconds(self.p, C["KDA_OP_" .. opname:upper()])
end

return Plan
