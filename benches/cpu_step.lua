-- benches/cpu_step.lua — CPU training throughput of the recipes/tiny.lua model and the share of
-- step time spent in each op (GEMM first). kda --trust benches/cpu_step.lua [steps]
local kda = require "kda"
local steps = tonumber(arg and arg[1]) or 40
local r = kda.train { model = kda.nn.GPT { d = 128, layers = 4, heads = 4 },
                      data = { { path = "/usr/share/common-licenses", name = "licenses" } },
                      batch = 16, seq = 128, steps = steps, log_every = steps, profile = true, quiet = true,
                      eval_batches = 1, prefetch = false }
local names = { "matmul", "attention", "attention_bwd", "rmsnorm", "rmsnorm_bwd", "swiglu", "swiglu_bwd", "rope",
                "add", "adamw", "embed", "embed_bwd", "cross_entropy", "cross_entropy_bwd", "mul", "grad_norm" }
local total, rows = 0, {}
for _, n in ipairs(names) do local s = r.plan:op_seconds(n); total = total + s; rows[#rows + 1] = { n, s } end
table.sort(rows, function(a, b) return a[2] > b[2] end)
print(("cpu tiny GPT %.2fM params batch 16x128: %.0f tok/s over %d steps (%.1f s)"):format(r.params / 1e6, r.tokens / r.train_seconds, r.steps, r.train_seconds))
for _, x in ipairs(rows) do print(("  %-18s %5.1f%%"):format(x[1], 100 * x[2] / total)) end
