-- kda.graph — recording a model as a static graph of C nodes (core/graph.c).
-- A Node is {G=graph, id=int}; its methods record ops and return new Nodes. Nothing runs until
-- a plan is built and run. Shapes are checked as each op is recorded.
local ffi = require "ffi"
local C = require("kda.ffi").C
local util = require "kda.util"

local Graph, Node = {}, {}
Graph.__index, Node.__index = Graph, Node

local function new_graph()
  local g = C.kda_graph_new()
  if g == nil then util.fail(ffi.string(C.kda_last_error())) end
  return setmetatable({ g = ffi.gc(g, C.kda_graph_free), params = {} }, Graph)
end

local function node(G, id)
  if id < 0 then util.fail(ffi.string(C.kda_last_error())) end
  return setmetatable({ G = G, id = id }, Node)
end

local function i64(shape)
  return ffi.new("int64_t[4]", shape)
end

function Graph:input(name, dtype, shape)
  local dt = type(dtype) == "string" and require("kda.tensor").dtypes[dtype] or dtype
  return node(self, C.kda_graph_input(self.g, name, dt, #shape, i64(shape)))
end

local inits = { zero = C.KDA_INIT_ZERO, one = C.KDA_INIT_ONE, normal = C.KDA_INIT_NORMAL, uniform = C.KDA_INIT_UNIFORM }

-- param(name, shape, init="normal", scale=0.02, {no_decay=true, retract=true})
function Graph:param(name, shape, init, scale, opts)
  local flags = (opts and opts.no_decay) and C.KDA_PARAM_NO_DECAY or 0
  if opts and opts.retract then flags = bit.bor(flags, C.KDA_PARAM_RETRACT) end
  local kind = inits[init or "normal"] or util.fail("unknown init '" .. tostring(init) .. "'")
  local n = node(self, C.kda_graph_param(self.g, name, #shape, i64(shape), kind, scale or 0.02, flags))
  self.params[#self.params + 1] = n
  return n
end

function Graph:op(opid, inputs, iattr, fattr)
  local ids = ffi.new("int32_t[?]", #inputs)
  for i, x in ipairs(inputs) do ids[i - 1] = x.id end
  local ia = ffi.new("int64_t[8]", iattr or {})
  local fa = ffi.new("float[8]", fattr or {})
  return node(self, C.kda_graph_op(self.g, opid, #inputs, ids, ia, fa))
end

function Graph:backward(loss) util.check(C.kda_graph_backward(self.g, loss.id), "backward") end
function Graph:keep(x) util.check(C.kda_graph_keep(self.g, x.id), "keep"); return x end
function Graph:nnodes() return C.kda_graph_nnodes(self.g) end
function Graph:param_count() return tonumber(C.kda_graph_param_count(self.g)) end
function Graph:find(name) local id = C.kda_graph_find(self.g, name); return id >= 0 and node(self, id) or nil end

local schedules = { constant = C.KDA_SCHED_CONSTANT, cosine = C.KDA_SCHED_COSINE, wsd = C.KDA_SCHED_WSD }
-- The optimizer: AdamW, or Muon for 2-D weights (o.optimizer = "muon"); the lr schedule, the
-- NaN/spike guard, EMA and retraction live on the backend (core/optim.c).
function Graph:adamw(o)
  if o.optimizer and o.optimizer ~= "adamw" and o.optimizer ~= "muon" then
    util.fail("unknown optimizer '" .. tostring(o.optimizer) .. "': use adamw or muon")
  end
  local cfg = ffi.new("kda_adamw_config", {
    lr = o.lr, beta1 = o.beta1 or 0.9, beta2 = o.beta2 or 0.95, eps = o.eps or 1e-8,
    weight_decay = o.weight_decay or 0.1, clip = o.clip or 1.0, min_lr_frac = o.min_lr_frac or 0.1,
    decay_frac = o.decay_frac or 0.2,
    schedule = schedules[o.schedule or "cosine"] or util.fail("unknown schedule '" .. tostring(o.schedule) .. "'"),
    warmup_steps = o.warmup or 0, total_steps = o.steps or 0,
    spike_factor = o.spike_factor or 0, ema_decay = o.ema or 0, muon = o.optimizer == "muon" and 1 or 0,
    muon_lr_mult = o.muon_lr and o.muon_lr / o.lr or 1, muon_momentum = o.muon_momentum or 0.95,
    retract_norm = o.retract_norm or 1 })
  util.check(C.kda_graph_adamw(self.g, cfg), "optimizer")
  self.state = node(self, C.kda_graph_state_node(self.g))
  self.gnorm = node(self, C.kda_graph_gnorm_node(self.g))
end

-- ---- node methods: each records one op ---------------------------------------------------
function Node:shape()
  local s = {}
  for i = 0, C.kda_graph_node_ndim(self.G.g, self.id) - 1 do s[#s + 1] = tonumber(C.kda_graph_node_dim(self.G.g, self.id, i)) end
  return s
end
function Node:numel() local n = 1; for _, d in ipairs(self:shape()) do n = n * d end; return n end
function Node:name() return ffi.string(C.kda_graph_node_name(self.G.g, self.id)) end

function Node:matmul(b, ta, tb) return self.G:op(C.KDA_OP_MATMUL, { self, b }, { ta and 1 or 0, tb and 1 or 0 }) end
function Node:add(b) return self.G:op(C.KDA_OP_ADD, { self, b }) end
function Node:mul(b) return self.G:op(C.KDA_OP_MUL, { self, b }) end
function Node:scale(s) return self.G:op(C.KDA_OP_SCALE, { self }, nil, { s }) end
function Node:embed(idx) return self.G:op(C.KDA_OP_EMBED, { self, idx }) end
function Node:rmsnorm(w, eps) return self.G:op(C.KDA_OP_RMSNORM, { self, w }, nil, { eps or 1e-5 }) end
function Node:silu() return self.G:op(C.KDA_OP_SILU, { self }) end
function Node:gelu() return self.G:op(C.KDA_OP_GELU, { self }) end
function Node:sigmoid() return self.G:op(C.KDA_OP_SIGMOID, { self }) end
function Node:swiglu(b) return self.G:op(C.KDA_OP_SWIGLU, { self, b }) end
function Node:softmax() return self.G:op(C.KDA_OP_SOFTMAX, { self }) end
-- x:rope(theta [, pos]): pos, a [1] i32 node, is the position of row 0 (decoding).
function Node:rope(theta, pos)
  return self.G:op(C.KDA_OP_ROPE, pos and { self, pos } or { self }, nil, { theta or 10000 })
end
function Node:attention(k, v, scale) return self.G:op(C.KDA_OP_ATTENTION, { self, k, v }, nil, { scale or 0 }) end
-- q:kda(k, v, g_raw, beta_raw, A_log, dt_bias, opts) -> o [B,T,HV,V] (KDA_OP_KDA, core/kda_ref.h).
-- opts: gate_mode (1 softplus | 0 log | 2 lower bound), qk_l2norm (true), beta_mode (1 sigmoid |
-- 0 raw | 2 2*sigmoid), chunk (64), scale (0 = 1/sqrt(K)), lower_bound (gate_mode 2 only),
-- precise_gate (false; true makes the CUDA backward run the products that feed the A_log and
-- dt_bias gradients in split tf32, at about twice its time; docs/kda.md "Gate gradients").
function Node:kda(k, v, g, beta, A_log, dt_bias, o)
  o = o or {}
  local l2 = o.qk_l2norm == nil and 1 or ((o.qk_l2norm == true or o.qk_l2norm == 1) and 1 or 0)
  return self.G:op(C.KDA_OP_KDA, { self, k, v, g, beta, A_log, dt_bias },
                   { o.gate_mode or 1, l2, o.beta_mode or 1, o.chunk or 64, o.precise_gate and 1 or 0 },
                   { o.scale or 0, o.lower_bound or 0 })
end
-- x [B,T,C]:conv1d(w [C,W], silu) -> depthwise causal conv, SiLU fused when silu is true.
function Node:conv1d(w, silu) return self.G:op(C.KDA_OP_CONV1D, { self, w }, { silu and 1 or 0 }) end
-- One-token decode ops (forward only, CPU): each updates its state leaf (a G:input, persistent,
-- zero at plan build) in place and returns its own output.
-- q [1,1,H,Dh]:attn_decode(k, v, kcache [Tmax,H,Dh], vcache, pos [1] i32, scale) -> o [1,1,H,Dh]
function Node:attn_decode(k, v, kc, vc, pos, scale)
  return self.G:op(C.KDA_OP_ATTN_DECODE, { self, k, v, kc, vc, pos }, nil, { scale or 0 })
end
-- x [1,1,C]:conv1d_decode(w [C,W], cache [C,W], silu) -> y [1,1,C]
function Node:conv1d_decode(w, cache, silu) return self.G:op(C.KDA_OP_CONV1D_DECODE, { self, w, cache }, { silu and 1 or 0 }) end
-- q [1,1,H,K]:kda_decode(k, v, g_raw, beta_raw, A_log, dt_bias, state [HV,K,V], opts): as Node:kda
function Node:kda_decode(k, v, g, beta, A_log, dt_bias, state, o)
  o = o or {}
  local l2 = o.qk_l2norm == nil and 1 or ((o.qk_l2norm == true or o.qk_l2norm == 1) and 1 or 0)
  return self.G:op(C.KDA_OP_KDA_DECODE, { self, k, v, g, beta, A_log, dt_bias, state },
                   { o.gate_mode or 1, l2, o.beta_mode or 1, o.chunk or 64 }, { o.scale or 0, o.lower_bound or 0 })
end
function Node:cross_entropy(t) return self.G:op(C.KDA_OP_CROSS_ENTROPY, { self, t }) end
function Node:sum() return self.G:op(C.KDA_OP_SUM, { self }) end
function Node:mean() return self.G:op(C.KDA_OP_MEAN, { self }) end
function Node:transpose(a, b) return self.G:op(C.KDA_OP_TRANSPOSE, { self }, { a - 1, b - 1 }) end
function Node:view(shape, offset)
  local ia = { offset or 0, #shape }
  for i, v in ipairs(shape) do ia[2 + i] = v end
  return self.G:op(C.KDA_OP_VIEW, { self }, ia)
end
function Node:reshape(...) return self:view(type(...) == "table" and ... or { ... }, 0) end
-- Rows first..last (1-based, inclusive) along dim 1, as a view.
function Node:rows(first, last)
  local shape = self:shape()
  local stride = self:numel() / shape[1]
  shape[1] = last - first + 1
  return self:view(shape, (first - 1) * stride)
end

return { new = new_graph, Graph = Graph, Node = Node }
