-- kda.tensor — eager host tensors for the REPL and tests (core/tensor.c).
-- Indexing is 1-based like Lua and torch7: t[i] is row i (a view) or, for a vector, a number.
local ffi = require "ffi"
local C = require("kda.ffi").C
local util = require "kda.util"

local M = {}
local Tensor = {}
local dtypes = { f32 = C.KDA_F32, bf16 = C.KDA_BF16, i32 = C.KDA_I32, u8 = C.KDA_U8, f64 = C.KDA_F64 }
M.dtypes = dtypes
local ctypes = { [0] = "float*", [2] = "int32_t*", [3] = "uint8_t*", [4] = "double*" }

-- A tensor is a Lua table holding the C handle `h` (a table, so t[i] can mean row i).
local mt
local function wrap(ptr)
  if ptr == nil then util.fail(ffi.string(C.kda_last_error())) end
  return setmetatable({ h = ffi.gc(ptr, C.kda_tensor_free) }, mt)
end

local function shape_of(args)
  local shape = type(args[1]) == "table" and args[1] or args
  local s = ffi.new("int64_t[4]")
  if #shape < 1 or #shape > 4 then util.fail("a tensor has 1 to 4 dims, got " .. #shape) end
  for i, v in ipairs(shape) do s[i - 1] = v end
  return s, #shape
end

function M.new(dtype, ...)
  local s, n = shape_of({ ... })
  return wrap(C.kda_tensor_new(dtype, n, s))
end

function M.zeros(...) return M.new(C.KDA_F32, ...) end
function M.ones(...) local t = M.zeros(...); t:fill(1); return t end
local seed_counter = 0
function M.manual_seed(s) seed_counter = s end
function M.randn(...)
  local t = M.zeros(...)
  seed_counter = seed_counter + 1
  C.kda_tensor_randn(t.h, seed_counter, 1.0)
  return t
end

-- kda.tensor{{1,2},{3,4}} from nested tables (f32), or kda.tensor(tbl, "i32").
function M.from(tbl, dtype)
  local shape, t = {}, tbl
  while type(t) == "table" do shape[#shape + 1] = #t; t = t[1] end
  local out = M.new(dtypes[dtype or "f32"] or C.KDA_F32, shape)
  local p, k = out:ptr(), 0
  local function walk(x)
    if type(x) == "table" then for _, v in ipairs(x) do walk(v) end else p[k] = x; k = k + 1 end
  end
  walk(tbl)
  return out
end

function Tensor:shape()
  local s = {}
  for i = 0, C.kda_tensor_ndim(self.h) - 1 do s[#s + 1] = tonumber(C.kda_tensor_dim(self.h, i)) end
  return s
end
function Tensor:dim() return C.kda_tensor_ndim(self.h) end
function Tensor:numel() return tonumber(C.kda_tensor_numel(self.h)) end
function Tensor:dtype() return C.kda_tensor_dtype(self.h) end
function Tensor:ptr()
  local ct = ctypes[self:dtype()]
  if not ct then util.fail("bf16 tensors have no element access: cast with :float() first") end
  return ffi.cast(ct, C.kda_tensor_data(self.h))
end
function Tensor:fill(v) local p = self:ptr(); for i = 0, self:numel() - 1 do p[i] = v end; return self end
function Tensor:float() return wrap(C.kda_tensor_cast(self.h, C.KDA_F32)) end
function Tensor:cast(name) return wrap(C.kda_tensor_cast(self.h, dtypes[name] or util.fail("unknown dtype " .. tostring(name)))) end

local function op(opid, inputs, iattr, fattr)
  local ins = ffi.new("kda_tensor*[?]", #inputs)
  for i, t in ipairs(inputs) do ins[i - 1] = t.h end
  local ia = ffi.new("int64_t[8]", iattr or {})
  local fa = ffi.new("float[8]", fattr or {})
  return wrap(C.kda_tensor_op(opid, #inputs, ins, ia, fa))
end
M.op = op

function Tensor:view(shape, offset)
  local ia = { offset or 0, #shape }
  for i, v in ipairs(shape) do ia[2 + i] = v end
  local out = op(C.KDA_OP_VIEW, { self }, ia)
  return out
end
function Tensor:reshape(...)
  local shape = type(...) == "table" and ... or { ... }
  return self:view(shape, 0)
end
function Tensor:matmul(b, ta, tb) return op(C.KDA_OP_MATMUL, { self, b }, { ta and 1 or 0, tb and 1 or 0 }) end
function Tensor:t() local n = self:dim(); return op(C.KDA_OP_TRANSPOSE, { self }, { n - 2, n - 1 }) end
function Tensor:transpose(a, b) return op(C.KDA_OP_TRANSPOSE, { self }, { a - 1, b - 1 }) end
function Tensor:add(b) return op(C.KDA_OP_ADD, { self, b }) end
function Tensor:mul(b) return op(C.KDA_OP_MUL, { self, b }) end
function Tensor:scale(s) return op(C.KDA_OP_SCALE, { self }, nil, { s }) end
function Tensor:sum() return op(C.KDA_OP_SUM, { self }):ptr()[0] end
function Tensor:mean() return op(C.KDA_OP_MEAN, { self }):ptr()[0] end
function Tensor:silu() return op(C.KDA_OP_SILU, { self }) end
function Tensor:gelu() return op(C.KDA_OP_GELU, { self }) end
function Tensor:sigmoid() return op(C.KDA_OP_SIGMOID, { self }) end
function Tensor:softmax() return op(C.KDA_OP_SOFTMAX, { self }) end
function Tensor:rmsnorm(w, eps) return op(C.KDA_OP_RMSNORM, { self, w }, nil, { eps or 1e-5 }) end
function Tensor:swiglu(b) return op(C.KDA_OP_SWIGLU, { self, b }) end
function Tensor:rope(theta) return op(C.KDA_OP_ROPE, { self }, nil, { theta or 10000 }) end
function Tensor:attention(k, v) return op(C.KDA_OP_ATTENTION, { self, k, v }) end
function Tensor:cross_entropy(targets) return op(C.KDA_OP_CROSS_ENTROPY, { self, targets }) end

-- Nested Lua tables of the values (the `:numpy()` of kda).
function Tensor:totable()
  local shape, p = self:shape(), (self:dtype() == C.KDA_BF16 and self:float() or self):ptr()
  local function build(d, off)
    local out, stride = {}, 1
    for i = d + 1, #shape do stride = stride * shape[i] end
    for i = 0, shape[d] - 1 do
      out[i + 1] = d == #shape and tonumber(p[off + i]) or build(d + 1, off + i * stride)
    end
    return out
  end
  return build(1, 0)
end
Tensor.numpy = Tensor.totable

local function fmt(v)
  if v ~= v then return "nan" end
  if v == math.floor(v) and math.abs(v) < 1e6 then return ("%d"):format(v) end
  return ("%.4g"):format(v)
end

function Tensor:__tostring()
  local shape, rows = self:shape(), {}
  local t = self:dtype() == C.KDA_BF16 and self:float() or self
  local p, n, cols = t:ptr(), self:numel(), shape[#shape]
  local maxrows = 20
  for r = 0, math.min(n / cols, maxrows) - 1 do
    local line = {}
    for c = 0, math.min(cols, 12) - 1 do line[#line + 1] = ("%9s"):format(fmt(tonumber(p[r * cols + c]))) end
    if cols > 12 then line[#line + 1] = " ..." end
    rows[#rows + 1] = table.concat(line, " ")
  end
  if n / cols > maxrows then rows[#rows + 1] = "  ..." end
  local names = { [0] = "f32", "bf16", "i32", "u8", "f64" }
  rows[#rows + 1] = ("[kda.Tensor %s of size %s]"):format(names[self:dtype()], table.concat(shape, "x"))
  return table.concat(rows, "\n")
end

local methods = Tensor
mt = {
  __index = function(self, k)
    if type(k) == "number" then
      local shape = self:shape()
      if k < 1 or k > shape[1] then util.fail(("index %d out of range 1..%d"):format(k, shape[1])) end
      if #shape == 1 then return tonumber(self:ptr()[k - 1]) end
      local rest, stride = {}, 1
      for i = 2, #shape do rest[#rest + 1] = shape[i]; stride = stride * shape[i] end
      return self:view(rest, (k - 1) * stride)
    end
    return methods[k]
  end,
  __newindex = function(self, k, v)
    local shape = self:shape()
    if type(k) ~= "number" or #shape ~= 1 then util.fail("assign elements of a vector: t[i] = x") end
    if k < 1 or k > shape[1] then util.fail(("index %d out of range 1..%d"):format(k, shape[1])) end
    self:ptr()[k - 1] = v
  end,
  __tostring = Tensor.__tostring,
  __add = function(a, b) if type(b) == "number" then local o = a:float(); local p = o:ptr(); for i = 0, o:numel() - 1 do p[i] = p[i] + b end; return o end return a:add(b) end,
  __mul = function(a, b)
    if type(a) == "number" then return b:scale(a) end
    if type(b) == "number" then return a:scale(b) end
    return a:mul(b)
  end,
  __sub = function(a, b) return a:add(b:scale(-1)) end,
  __unm = function(a) return a:scale(-1) end,
}
function M.is_tensor(x) return getmetatable(x) == mt end
M.Tensor = Tensor
return M
