-- tests/lua/run.lua — the Lua test suite: modules, shapes, the planner, determinism, a real
-- training run. Run as `kda --trust tests/lua/run.lua [filter]`; ends with "N passed, N failed".
local kda = require "kda"
local passed, failed = 0, 0
local filter = arg and arg[1]

local function test(name, fn)
  if filter and not name:find(filter, 1, true) then return end
  local ok, err = pcall(fn)
  if ok then passed = passed + 1; print("ok - " .. name)
  else failed = failed + 1; print("FAIL - " .. name .. ": " .. tostring(err)) end
end
local function expect(cond, msg) if not cond then error(msg or "expectation failed", 2) end end

local licenses = "/usr/share/common-licenses"

test("eager tensors: matmul, indexing, totable", function()
  local a = kda.tensor { { 1, 2 }, { 3, 4 } }
  local c = a:matmul(a)
  expect(c[1][1] == 7 and c[1][2] == 10 and c[2][1] == 15 and c[2][2] == 22, "wrong product")
  expect(c:shape()[1] == 2 and c:totable()[2][2] == 22, "shape or totable")
  expect(tostring(c):find("kda.Tensor f32 of size 2x2"), "printing")
  local ok, err = pcall(function() return a:matmul(kda.zeros(3, 3)) end)
  expect(not ok and err:find("inner dimensions differ"), "bad shape message: " .. tostring(err))
end)

test("nn: GPT shapes and parameter names", function()
  local G = kda.Graph()
  local m = kda.nn.GPT { d = 32, layers = 2, heads = 2 }
  local logits = m:forward(G, G:input("tokens", "i32", { 3, 16 }))
  local s = logits:shape()
  expect(s[1] == 48 and s[2] == 256, "logits shape " .. table.concat(s, "x"))
  expect(G:find("blocks.1.mix.q.weight") and G:find("embed.weight") and G:find("norm.weight"), "names")
  local want = 256 * 32 + 2 * (4 * 32 * 32 + 3 * 32 * m.cfg.ffn + 2 * 32) + 32
  expect(G:param_count() == want, ("param count %d ~= %d"):format(G:param_count(), want))
end)

test("planner: no two live buffers overlap; arena well below the naive sum", function()
  local C = kda.C
  local cfg = { model = kda.nn.GPT { d = 64, layers = 4, heads = 4 }, batch = 4, seq = 32, steps = 10, lr = 1e-3 }
  local G, io = require("kda.train").build(cfg)
  local plan = kda.Plan.build(G, "cpu")
  local bufs = {}
  for id = 0, G:nnodes() - 1 do
    local off = tonumber(C.kda_plan_node_offset(plan.p, id))
    local op = C.kda_graph_node_op(G.g, id)
    if off >= 0 and op ~= C.KDA_OP_VIEW then
      local first, last = require("ffi").new("int32_t[1]"), require("ffi").new("int32_t[1]")
      C.kda_plan_node_live(plan.p, id, first, last)
      local n = setmetatable({ G = G, id = id }, kda.graph.Node):numel() * 4
      bufs[#bufs + 1] = { off, off + n, first[0], last[0], id }
    end
  end
  expect(#bufs > 100, "too few buffers: " .. #bufs)
  for i = 1, #bufs do
    for j = i + 1, #bufs do
      local a, b = bufs[i], bufs[j]
      if a[3] <= b[4] and b[3] <= a[4] then
        expect(a[2] <= b[1] or b[2] <= a[1], ("nodes %d and %d overlap while both live"):format(a[5], b[5]))
      end
    end
  end
  local mem = plan:memory()
  print(("#   arena %.2f MiB, naive %.2f MiB (%.0f%%)"):format(mem.arena / 2^20, mem.naive / 2^20, 100 * mem.arena / mem.naive))
  expect(mem.arena < 0.6 * mem.naive, "arena not well below the naive sum")
end)

local function short_run(seed)
  return kda.train { model = kda.nn.GPT { d = 32, layers = 2, heads = 2 }, data = { { path = licenses, name = "l" } },
                     batch = 4, seq = 32, steps = 12, log_every = 3, seed = seed, quiet = true, eval_batches = 2 }
end

test("nn: KDA hybrid builds, names, NoPE attention every 4th layer, 10 steps lower the loss", function()
  local m = kda.nn.hybrid { d = 32, layers = 4, heads = 2, attn_every = 4 }
  local G = kda.Graph()
  local logits = m:forward(G, G:input("tokens", "i32", { 2, 16 }))
  local s = logits:shape()
  expect(s[1] == 32 and s[2] == 256, "logits shape " .. table.concat(s, "x"))
  for _, n in ipairs { "q_proj.weight", "k_proj.weight", "v_proj.weight", "q_conv.weight", "k_conv.weight",
                       "v_conv.weight", "f1.weight", "f2.weight", "b_proj.weight", "A_log", "dt_bias",
                       "o_norm.weight", "g1.weight", "g2.weight", "g2.bias", "o_proj.weight" } do
    for _, l in ipairs { 0, 1, 2 } do
      expect(G:find(("blocks.%d.mix.%s"):format(l, n)), "missing blocks." .. l .. ".mix." .. n)
    end
  end
  expect(G:find("blocks.3.mix.q.weight") and not G:find("blocks.3.mix.A_log"), "layer 4 must be attention")
  expect(G:find("blocks.0.mix.q_conv.weight"):shape()[2] == 4, "conv width 4")
  expect(not m.blocks[4].mixer.rope, "attention layers must be NoPE")
  -- precise_gate reaches the KDA nodes (the CUDA backward's gate-gradient precision); off by default
  local function kda_flags(model)
    local g = kda.Graph(); model:forward(g, g:input("tokens", "i32", { 1, 8 }))
    local f = {}
    for id = 0, g:nnodes() - 1 do
      if kda.C.kda_graph_node_op(g.g, id) == kda.C.KDA_OP_KDA then f[#f + 1] = tonumber(kda.C.kda_graph_node_iattr(g.g, id, 4)) end
    end
    return f
  end
  local off, on = kda_flags(m), kda_flags(kda.nn.hybrid { d = 32, layers = 4, heads = 2, precise_gate = true })
  expect(#off == 3 and #on == 3 and off[1] == 0 and off[3] == 0 and on[1] == 1 and on[3] == 1,
         "precise_gate flags " .. table.concat(off, ",") .. " / " .. table.concat(on, ","))
  local r = kda.train { model = m, data = { { path = licenses, name = "l" } }, batch = 4, seq = 32, steps = 10,
                        lr = 3e-3, log_every = 1, seed = 3, quiet = true, eval_batches = 1 }
  local first, last = r.losses[1].loss, r.losses[#r.losses].loss
  print(("#   hybrid %d params, loss %.4f -> %.4f over %d logged steps"):format(r.params, first, last, #r.losses))
  expect(last < first, ("loss did not go down: %.4f -> %.4f"):format(first, last))
  -- post_init gave A_log = log U(1,16) and a positive-softplus dt_bias
  local G2, plan = nil, nil
  G2 = kda.Graph(); m:forward(G2, G2:input("tokens", "i32", { 1, 8 }))
  plan = kda.Plan.build(G2, "cpu"); plan:init_params(1); m:post_init(plan, 1)
  local a = plan:read_floats(G2:find("blocks.0.mix.A_log"))
  expect(a[1] >= 0 and a[1] <= math.log(16) and a[2] ~= a[1], "A_log init " .. a[1] .. " " .. a[2])
  local dt = plan:read_floats(G2:find("blocks.0.mix.dt_bias"))
  for _, x in ipairs(dt) do
    local sp = math.log(1 + math.exp(x))
    expect(sp > 0.9e-4 and sp < 0.11, "dt_bias softplus out of [1e-4, 0.1]: " .. sp)
  end
end)

test("determinism: same seed, same losses bit for bit", function()
  local a, b, c = short_run(7), short_run(7), short_run(8)
  for i, x in ipairs(a.losses) do
    expect(x.loss == b.losses[i].loss, ("step %d: %.9g vs %.9g"):format(x.step, x.loss, b.losses[i].loss))
  end
  expect(a.losses[#a.losses].loss ~= c.losses[#c.losses].loss, "a different seed gave the same loss")
end)

test("optimizer options: Muon trains; EMA weights are evaluated and the weights restored", function()
  local function run(o)
    local cfg = { model = kda.nn.GPT { d = 32, layers = 2, heads = 2 }, data = { { path = licenses, name = "l" } },
                  batch = 4, seq = 32, steps = 24, log_every = 6, quiet = true, eval_batches = 2 }
    for k, v in pairs(o) do cfg[k] = v end
    return kda.train(cfg)
  end
  local m = run { optimizer = "muon", muon_lr = 0.02 }
  expect(m.losses[#m.losses].loss < m.losses[1].loss - 1, "muon did not lower the loss")
  expect(m.graph:find("blocks.0.mix.q.weight.muon_m") and not m.graph:find("blocks.0.mix.q.weight.adam_m"), "muon state names")
  local e = run { ema = 0.9 }
  local w = e.plan:read_floats(e.graph:find("blocks.0.mix.q.weight"))
  local ev = require("kda.train").evaluate(e.plan, e.io, require("kda.train").open_data({ { path = licenses, name = "l" } }), 4, 32, 2)
  expect(math.abs(ev.l.bpb - e.bpb.l) > 1e-4, "the final evaluation did not use the EMA weights")
  local w2 = e.plan:read_floats(e.graph:find("blocks.0.mix.q.weight"))
  expect(w[1] == w2[1] and w[#w] == w2[#w2], "weights were not restored after the EMA evaluation")
end)

test("held-out window is the same bytes whatever batch or seq_len", function()
  local d = require("kda.train").open_data({ { path = licenses, name = "l" } })
  local doms = d:domains()
  expect(doms[1].window > 1000 and doms[1].window <= 1048576, "window size " .. doms[1].window)
  -- evaluation at two batch/seq settings counts exactly the window's bytes
  local cfg = { model = kda.nn.GPT { d = 16, layers = 1, heads = 1 }, batch = 3, seq = 40, steps = 1, lr = 1e-3 }
  for _, bt in ipairs { { 3, 40 }, { 5, 64 } } do
    cfg.batch, cfg.seq = bt[1], bt[2]
    local G, io = require("kda.train").build(cfg)
    local plan = kda.Plan.build(G, "cpu")
    plan:init_params(1)
    local ev = require("kda.train").evaluate(plan, io, d, bt[1], bt[2])
    expect(ev.l.bytes == doms[1].window, ("batch %dx%d counted %d of %d window bytes"):format(bt[1], bt[2], ev.l.bytes, doms[1].window))
  end
end)

test("training on real English text beats the unigram entropy", function()
  -- unigram entropy of the held-out window's own bytes (a bar the model must clear)
  local C, ffi = kda.C, require "ffi"
  local d = require("kda.train").open_data({ { path = licenses, name = "licenses" } })
  local start, w = tonumber(C.kda_data_window_start(d.d, 0)), tonumber(C.kda_data_window_bytes(d.d, 0))
  local p, counts = C.kda_data_domain_ptr(d.d, 0), {}
  for i = 0, 255 do counts[i] = 0 end
  for i = start, start + w - 1 do counts[p[i]] = counts[p[i]] + 1 end
  local h = 0
  for i = 0, 255 do if counts[i] > 0 then local q = counts[i] / w; h = h - q * math.log(q) / math.log(2) end end
  local budget = tonumber(os.getenv("KDA_TRAIN_TEST_STEPS") or "150")
  -- at most 150 steps and at most 110 s of training (a loaded machine gets fewer steps)
  local r = kda.train { model = kda.nn.GPT { d = 128, layers = 4, heads = 4 }, data = d, batch = 16, seq = 128,
                        steps = budget, lr = 3e-3, warmup = 15, log_every = 25, quiet = false, max_seconds = 110 }
  print(("#   params %.2fM, %d steps, held-out BPB %.4f vs unigram entropy %.4f, %.1f s, %.0f tok/s")
        :format(r.params / 1e6, r.steps, r.bpb.licenses, h, r.train_seconds, r.tokens / r.train_seconds))
  expect(r.train_seconds < 120, "the run took over 2 minutes")
  expect(r.bpb.licenses < h - 0.5, ("BPB %.3f is not clearly below the unigram entropy %.3f"):format(r.bpb.licenses, h))
end)

print(("%d passed, %d failed"):format(passed, failed))
return failed == 0 and 0 or 1
