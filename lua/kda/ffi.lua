-- kda.ffi — declares the C API to LuaJIT from the public headers themselves.
-- core/kda.h is the manual and the cdef; the other public headers are added when present.
-- Preprocessor lines and the C++ guard blocks are dropped; the rest is plain C.
local ffi = require "ffi"

local root = rawget(_G, "KDA_ROOT") or os.getenv("KDA_HOME") or "."
local headers = { "core/kda.h", "core/data.h", "core/ngram.h", "core/kda_ref.h",
                  "core/ckpt.h", "kernels/kda_cuda_api.h" }

local function cdef_text(path)
  local f = io.open(path, "r")
  if not f then return nil end
  local out, skip = {}, false
  for line in f:lines() do
    if line:match("^%s*#%s*ifdef%s+__cplusplus") then skip = true
    elseif skip and line:match("^%s*#%s*endif") then skip = false
    elseif not skip and not line:match("^%s*#") then out[#out + 1] = line end
  end
  f:close()
  return table.concat(out, "\n")
end

local loaded = {}
for _, h in ipairs(headers) do
  local text = cdef_text(root .. "/" .. h)
  if text then
    ffi.cdef(text)
    loaded[#loaded + 1] = h
  elseif h == "core/kda.h" then
    error("cannot read " .. root .. "/core/kda.h: set KDA_HOME to the kda source folder")
  end
end

return { C = ffi.C, headers = loaded }
