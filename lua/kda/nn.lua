-- kda.nn — modules that record graph nodes. A module is a table of hyper-parameters with
-- :forward(G, x, name); parameters are created on the graph under dotted names
-- ("blocks.0.attn.q.weight"), which become the checkpoint (safetensors) keys.
local util = require "kda.util"
local nn = {}

local function class(name)
  local c = { __name = name }
  c.__index = c
  setmetatable(c, { __call = function(cls, ...) local o = setmetatable({}, cls); o:init(...); return o end })
  return c
end
nn.class = class

-- Embedding(vocab, dim): ids [...] int32 -> [..., dim]
nn.Embedding = class("Embedding")
function nn.Embedding:init(vocab, dim, std) self.vocab, self.dim, self.std = vocab, dim, std or 0.02 end
function nn.Embedding:weight(G, name)
  return G:find(name .. ".weight") or G:param(name .. ".weight", { self.vocab, self.dim }, "normal", self.std, { no_decay = true })
end
function nn.Embedding:forward(G, ids, name) return self:weight(G, name):embed(ids) end

-- Linear(din, dout): x [N, din] -> x W^T (+ b), W [dout, din] as in PyTorch.
nn.Linear = class("Linear")
function nn.Linear:init(din, dout, o)
  o = o or {}
  self.din, self.dout, self.bias, self.std = din, dout, o.bias, o.std or 0.02
end
function nn.Linear:forward(G, x, name)
  local w = G:param(name .. ".weight", { self.dout, self.din }, "normal", self.std)
  local y = x:matmul(w, false, true)
  if self.bias then y = y:add(G:param(name .. ".bias", { self.dout }, "zero", 0, { no_decay = true })) end
  return y
end

-- RMSNorm(dim): x / rms(x) * w over the last dim.
nn.RMSNorm = class("RMSNorm")
function nn.RMSNorm:init(dim, eps) self.dim, self.eps = dim, eps or 1e-5 end
function nn.RMSNorm:forward(G, x, name)
  return x:rmsnorm(G:param(name .. ".weight", { self.dim }, "one", 0, { no_decay = true }), self.eps)
end

-- MLP(d, hidden): SwiGLU, W2 (silu(x W1^T) * x W3^T).
nn.MLP = class("MLP")
function nn.MLP:init(d, hidden, out_std)
  self.up = nn.Linear(d, hidden)
  self.gate = nn.Linear(d, hidden)
  self.down = nn.Linear(hidden, d, { std = out_std })
end
function nn.MLP:forward(G, x, name)
  local h = self.gate:forward(G, x, name .. ".gate"):swiglu(self.up:forward(G, x, name .. ".up"))
  return self.down:forward(G, h, name .. ".down")
end

-- Attention{d, heads, rope=true}: causal self-attention on x [B*T, d] given B, T.
nn.Attention = class("Attention")
nn.Attention.decodes = true    -- forward takes dec (one-token decoding with a KV cache)
function nn.Attention:init(o)
  self.d, self.heads, self.rope, self.theta = o.d, o.heads, o.rope ~= false, o.theta or 10000
  if self.d % self.heads ~= 0 then util.fail(("Attention: d=%d is not a multiple of heads=%d"):format(self.d, self.heads)) end
  self.q, self.k, self.v = nn.Linear(o.d, o.d), nn.Linear(o.d, o.d), nn.Linear(o.d, o.d)
  self.o = nn.Linear(o.d, o.d, { std = o.out_std })
end
-- dec (decoding one token, see nn.GPT:decode_graph): x is [1, d], B = T = 1; RoPE at dec.pos and
-- attention over the caches "<name>.k_cache", "<name>.v_cache" [dec.max_len, heads, head_dim].
function nn.Attention:forward(G, x, name, B, T, dec)
  local dh = self.d / self.heads
  local function heads(lin, part)
    local y = lin:forward(G, x, name .. "." .. part):reshape(B, T, self.heads, dh)
    if self.rope and part ~= "v" then y = y:rope(self.theta, dec and dec.pos or nil) end
    return y
  end
  local o
  if dec then
    local kc = dec:state(G, name .. ".k_cache", { dec.max_len, self.heads, dh })
    local vc = dec:state(G, name .. ".v_cache", { dec.max_len, self.heads, dh })
    o = heads(self.q, "q"):attn_decode(heads(self.k, "k"), heads(self.v, "v"), kc, vc, dec.pos)
  else
    o = heads(self.q, "q"):attention(heads(self.k, "k"), heads(self.v, "v"))
  end
  return self.o:forward(G, o:reshape(B * T, self.d), name .. ".o")
end

-- KDA{d, heads, head_dim, v_heads=heads, expand_v=1, conv=4, chunk=64, out_std, norm_eps=1e-5,
--     precise_gate=false}:
-- Kimi Delta Attention token mixer on x [B*T, d] (docs: /work/shared/docs/KDA.md §1.2).
--   q, k = SiLU(Conv(W x)) [B,T,H,K]; v = SiLU(Conv(W x)) [B,T,HV,V]  (conv: depthwise causal, width 4)
--   g_raw = f2(f1 x) (d -> V -> HV*K); beta_raw = b_proj x (d -> HV)
--   o = kda(q, k, v, g_raw, beta_raw, A_log, dt_bias) with the softplus gate, qk l2norm, sigmoid beta
--   o = RMSNorm_V(o) * sigmoid(g2(g1 x) + b) per head; y = o_proj(o) (HV*V -> d)
-- A_log and dt_bias are created zero-initialised and get the fla init (A_log = log U(1,16);
-- dt_bias = softplus^-1(dt), dt log-uniform in [1e-3, 1e-1], >= 1e-4) from :post_init(plan, name,
-- seed), which kda.train calls after plan:init_params (call it yourself for hand-built plans).
-- precise_gate: the CUDA backward with fp32-level A_log / dt_bias gradients (Node:kda's option;
-- the default is fla's precision, ~20% faster a hybrid step: docs/kda.md "Gate gradients").
nn.KDA = class("KDA")
nn.KDA.decodes = true          -- forward takes dec (recurrent decoding, KDA.md §5)
function nn.KDA:init(o)
  o = util.defaults(o, { d = false, heads = false, head_dim = false, v_heads = false, expand_v = 1, conv = 4,
                         chunk = 64, out_std = false, norm_eps = 1e-5, precise_gate = false }, "KDA")
  if not o.d or not o.heads then util.fail("KDA: give d and heads, e.g. nn.KDA{d=128, heads=4}") end
  self.d, self.H = o.d, o.heads
  self.K = o.head_dim or (o.d / o.heads)
  self.HV = o.v_heads or o.heads
  self.V = math.floor(self.K * o.expand_v)
  if self.K ~= math.floor(self.K) or self.K < 1 then util.fail(("KDA: head_dim %s is not a whole number"):format(tostring(self.K))) end
  if self.HV % self.H ~= 0 then util.fail(("KDA: v_heads=%d is not a multiple of heads=%d"):format(self.HV, self.H)) end
  self.conv, self.chunk, self.eps, self.precise_gate = o.conv, o.chunk, o.norm_eps, o.precise_gate
  local d, H, HV, K, V = self.d, self.H, self.HV, self.K, self.V
  self.q_proj, self.k_proj, self.v_proj = nn.Linear(d, H * K), nn.Linear(d, H * K), nn.Linear(d, HV * V)
  self.f1, self.f2 = nn.Linear(d, V), nn.Linear(V, HV * K)
  self.b_proj = nn.Linear(d, HV)
  self.g1, self.g2 = nn.Linear(d, V), nn.Linear(V, HV * V, { bias = true })
  self.o_proj = nn.Linear(HV * V, d, { std = o.out_std or nil })
end
-- dec (one token, see nn.GPT:decode_graph): B = T = 1; the convs keep "<name>.q_conv.cache" (k, v
-- alike) [C, conv] and the recurrence "<name>.kda_state" [HV, K, V] (KDA.md §5).
function nn.KDA:forward(G, x, name, B, T, dec)
  local H, HV, K, V = self.H, self.HV, self.K, self.V
  local function conv_branch(lin, part, heads, hd)
    local y = lin:forward(G, x, name .. "." .. part .. "_proj"):reshape(B, T, heads * hd)
    -- nn.Conv1d's default init (kaiming uniform, a=sqrt(5)): U(+-1/sqrt(width))
    local w = G:param(name .. "." .. part .. "_conv.weight", { heads * hd, self.conv }, "uniform", 1 / math.sqrt(self.conv))
    if dec then
      local cache = dec:state(G, name .. "." .. part .. "_conv.cache", { heads * hd, self.conv })
      return y:conv1d_decode(w, cache, true):reshape(B, T, heads, hd)
    end
    return y:conv1d(w, true):reshape(B, T, heads, hd)
  end
  local q, k, v = conv_branch(self.q_proj, "q", H, K), conv_branch(self.k_proj, "k", H, K), conv_branch(self.v_proj, "v", HV, V)
  local g = self.f2:forward(G, self.f1:forward(G, x, name .. ".f1"), name .. ".f2"):reshape(B, T, HV, K)
  local beta = self.b_proj:forward(G, x, name .. ".b_proj"):reshape(B, T, HV)
  local A_log = G:param(name .. ".A_log", { HV }, "zero", 0, { no_decay = true })
  local dt_bias = G:param(name .. ".dt_bias", { HV * K }, "zero", 0, { no_decay = true })
  local o
  if dec then
    o = q:kda_decode(k, v, g, beta, A_log, dt_bias, dec:state(G, name .. ".kda_state", { HV, K, V }), { chunk = self.chunk })
  else
    o = q:kda(k, v, g, beta, A_log, dt_bias, { chunk = self.chunk, precise_gate = self.precise_gate })
  end
  o = o:reshape(B * T * HV, V):rmsnorm(G:param(name .. ".o_norm.weight", { V }, "one", 0, { no_decay = true }), self.eps)
  local gate = self.g2:forward(G, self.g1:forward(G, x, name .. ".g1"), name .. ".g2"):sigmoid():reshape(B * T * HV, V)
  return self.o_proj:forward(G, o:mul(gate):reshape(B * T, HV * V), name .. ".o_proj")
end
-- Deterministic fla-style init of A_log and dt_bias (a small LCG seeded by the name and seed).
local function lcg(name, seed)
  local s = (seed or 0) % 2147483647
  for i = 1, #name do s = (s * 31 + name:byte(i)) % 2147483647 end
  s = s + 1
  return function() s = (s * 48271) % 2147483647; return s / 2147483647 end
end
function nn.KDA:post_init(plan, name, seed)
  local ffi = require "ffi"
  local G = plan.G
  local a, dt = G:find(name .. ".A_log"), G:find(name .. ".dt_bias")
  if not a or not dt then util.fail("KDA post_init: no parameters under '" .. name .. "'") end
  local rnd = lcg(name, seed)
  local ba = ffi.new("float[?]", self.HV)
  for i = 0, self.HV - 1 do ba[i] = math.log(1 + 15 * rnd()) end
  plan:write(a, ba, 4 * self.HV)
  local n = self.HV * self.K
  local bd = ffi.new("float[?]", n)
  for i = 0, n - 1 do
    local t = math.max(math.exp(math.log(1e-3) + rnd() * (math.log(1e-1) - math.log(1e-3))), 1e-4)
    bd[i] = t + math.log(1 - math.exp(-t)) -- softplus^-1(t) = log(exp(t) - 1)
  end
  plan:write(dt, bd, 4 * n)
end

-- Block: pre-norm residual block, x + mixer(norm(x)), then x + mlp(norm(x)).
nn.Block = class("Block")
function nn.Block:init(o)
  local out_std = 0.02 / math.sqrt(2 * o.layers)
  self.norm1, self.norm2 = nn.RMSNorm(o.d), nn.RMSNorm(o.d)
  self.mixer = o.mixer or nn.Attention { d = o.d, heads = o.heads, rope = o.rope, out_std = out_std }
  self.mlp = nn.MLP(o.d, o.ffn, out_std)
end
function nn.Block:forward(G, x, name, B, T, dec)
  if dec and not self.mixer.decodes then
    util.fail(("decode: the mixer of %s (%s) has no one-token decode path; only nn.Attention and nn.KDA decode")
      :format(name, tostring(getmetatable(self.mixer) and getmetatable(self.mixer).__name)))
  end
  x = x:add(self.mixer:forward(G, self.norm1:forward(G, x, name .. ".norm1"), name .. ".mix", B, T, dec))
  return x:add(self.mlp:forward(G, self.norm2:forward(G, x, name .. ".norm2"), name .. ".mlp"))
end

-- GPT{d, layers, heads, ffn, vocab=256, tie=true}: byte-level decoder. forward(G, ids [B,T])
-- returns logits [B*T, vocab].
nn.GPT = class("GPT")
function nn.GPT:init(o)
  o = util.defaults(o, { d = 128, layers = 4, heads = 4, ffn = false, vocab = 256, tie = true, rope = true,
                         mixers = false }, "GPT")
  if not o.ffn then o.ffn = math.floor((8 * o.d / 3 + 31) / 32) * 32 end
  self.cfg = o
  self.embed = nn.Embedding(o.vocab, o.d)
  self.blocks = {}
  for i = 1, o.layers do
    local mixer = o.mixers and o.mixers(i, o) or nil
    self.blocks[i] = nn.Block { d = o.d, heads = o.heads, ffn = o.ffn, layers = o.layers, rope = o.rope, mixer = mixer }
  end
  self.norm = nn.RMSNorm(o.d)
  if not o.tie then self.head = nn.Linear(o.d, o.vocab) end
end
function nn.GPT:forward(G, ids)
  local shape = ids:shape()
  local B, T, d = shape[1], shape[2], self.cfg.d
  local x = self.embed:forward(G, ids, "embed"):reshape(B * T, d)
  for i, blk in ipairs(self.blocks) do x = blk:forward(G, x, "blocks." .. (i - 1), B, T) end
  x = self.norm:forward(G, x, "norm")
  if self.head then return self.head:forward(G, x, "head") end
  return x:matmul(self.embed:weight(G, "embed"), false, true)
end

-- The one-token decode graph (kda sample): inputs tokens [1,1] i32 and pos [1] i32 (the position
-- of that token, 0-based); parameters under the training graph's names (a checkpoint's model
-- file loads into it); per-layer state leaves (KV caches, conv caches, KDA states: f32 inputs,
-- zero at plan build, updated in place by each run) listed in dec.states. o.max_len (default:
-- o.seq or 1024) = Tmax, the rows of the attention caches. Returns dec = {G, tokens, pos,
-- logits [1, vocab] (kept), states, max_len}; dec:reset(plan) zeroes the states.
local Decode = {}
Decode.__index = Decode
function Decode:state(G, name, shape)
  local n = G:input(name, "f32", shape)
  self.states[#self.states + 1] = n
  return n
end
function Decode:reset(plan)
  local ffi = require "ffi"
  for _, n in ipairs(self.states) do
    local bytes = 4 * n:numel()
    local z = ffi.new("uint8_t[?]", bytes)
    plan:write(n, z, bytes)
  end
end
function nn.GPT:decode_graph(o)
  o = o or {}
  local G = o.G or require("kda.graph").new()
  local dec = setmetatable({ G = G, states = {}, max_len = o.max_len or o.seq or 1024 }, Decode)
  dec.tokens = G:input("tokens", "i32", { 1, 1 })
  dec.pos = G:input("pos", "i32", { 1 })
  local d = self.cfg.d
  local x = self.embed:forward(G, dec.tokens, "embed"):reshape(1, d)
  for i, blk in ipairs(self.blocks) do x = blk:forward(G, x, "blocks." .. (i - 1), 1, 1, dec) end
  x = self.norm:forward(G, x, "norm")
  local logits = self.head and self.head:forward(G, x, "head") or x:matmul(self.embed:weight(G, "embed"), false, true)
  dec.logits = G:keep(logits)
  return dec
end

-- Model-specific inits that kda_plan_init_params cannot express (KDA's A_log, dt_bias).
function nn.GPT:post_init(plan, seed)
  for i, blk in ipairs(self.blocks) do
    if blk.mixer.post_init then blk.mixer:post_init(plan, "blocks." .. (i - 1) .. ".mix", seed) end
  end
end

-- hybrid{d, layers, heads, attn_every=4, head_dim=d/heads, precise_gate=false, ...GPT options}: Kimi-Linear-style
-- stack (KDA.md §1.3): KDA mixers, except every attn_every-th layer (i % attn_every == 0,
-- 1-based), which is softmax attention without RoPE (NoPE; KDA is the position-aware op).
function nn.hybrid(o)
  o = util.defaults(o, { d = 128, layers = 4, heads = 4, attn_every = 4, head_dim = false, ffn = false,
                         vocab = 256, tie = true, chunk = 64, precise_gate = false }, "hybrid")
  local every, hd, chunk, pg = o.attn_every, o.head_dim, o.chunk, o.precise_gate
  local cfg = { d = o.d, layers = o.layers, heads = o.heads, ffn = o.ffn, vocab = o.vocab, tie = o.tie, rope = false }
  cfg.mixers = function(i, c)
    local out_std = 0.02 / math.sqrt(2 * c.layers)
    if every > 0 and i % every == 0 then return nn.Attention { d = c.d, heads = c.heads, rope = false, out_std = out_std } end
    return nn.KDA { d = c.d, heads = c.heads, head_dim = hd or nil, chunk = chunk, out_std = out_std, precise_gate = pg }
  end
  return nn.GPT(cfg)
end

-- Parameters without building a graph (for budgets): count by recording once.
function nn.count_params(model, B, T)
  local G = require("kda.graph").new()
  model:forward(G, G:input("tokens", "i32", { B or 1, T or 8 }))
  return G:param_count()
end

return nn
