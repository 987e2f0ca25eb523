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
function nn.Attention:init(o)
  self.d, self.heads, self.rope, self.theta = o.d, o.heads, o.rope ~= false, o.theta or 10000
  if self.d % self.heads ~= 0 then util.fail(("Attention: d=%d is not a multiple of heads=%d"):format(self.d, self.heads)) end
  self.q, self.k, self.v = nn.Linear(o.d, o.d), nn.Linear(o.d, o.d), nn.Linear(o.d, o.d)
  self.o = nn.Linear(o.d, o.d, { std = o.out_std })
end
function nn.Attention:forward(G, x, name, B, T)
  local dh = self.d / self.heads
  local function heads(lin, part)
    local y = lin:forward(G, x, name .. "." .. part):reshape(B, T, self.heads, dh)
    if self.rope and part ~= "v" then y = y:rope(self.theta) end
    return y
  end
  local o = heads(self.q, "q"):attention(heads(self.k, "k"), heads(self.v, "v"))
  return self.o:forward(G, o:reshape(B * T, self.d), name .. ".o")
end

-- Block: pre-norm residual block, x + mixer(norm(x)), then x + mlp(norm(x)).
nn.Block = class("Block")
function nn.Block:init(o)
  local out_std = 0.02 / math.sqrt(2 * o.layers)
  self.norm1, self.norm2 = nn.RMSNorm(o.d), nn.RMSNorm(o.d)
  self.mixer = o.mixer or nn.Attention { d = o.d, heads = o.heads, rope = o.rope, out_std = out_std }
  self.mlp = nn.MLP(o.d, o.ffn, out_std)
end
function nn.Block:forward(G, x, name, B, T)
  x = x:add(self.mixer:forward(G, self.norm1:forward(G, x, name .. ".norm1"), name .. ".mix", B, T))
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

-- Parameters without building a graph (for budgets): count by recording once.
function nn.count_params(model, B, T)
  local G = require("kda.graph").new()
  model:forward(G, G:input("tokens", "i32", { B or 1, T or 8 }))
  return G:param_count()
end

return nn
