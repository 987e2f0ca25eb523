-- kda.ladder — the milestone ladder: train a rung, measure held-out BPB against its bar, climb
-- only when it passes. Results are kept in runs/ladder/results.tsv so a later call continues
-- where the last one stopped; the table is printed and saved as runs/ladder/table.md.
local kda = require "kda"
local ngram = require "kda.ngram"
local util = require "kda.util"

local M = {}

-- The bar of a rung on one domain: {order=k} = best n-gram method at order k;
-- {strongest=true} = best method and order up to 8.
local function bar_value(d, domain, bar, cache)
  local key = domain .. ":" .. (bar.order or "best")
  if cache[key] then return cache[key].bpb, cache[key].name end
  local i = d:index(domain)
  local m = ngram.train(d, i, bar.order or 8, 0)
  local best, name = math.huge, "?"
  for _, meth in ipairs(ngram.methods) do
    local t = ngram.bpb_orders(m, meth, d, i, 0)
    for k, v in ipairs(t) do
      if (bar.strongest or k == bar.order) and v < best then best, name = v, ("%s-%d"):format(meth, k) end
    end
  end
  cache[key] = { bpb = best, name = name }
  return best, name
end

-- The held-out BPB curve of an earlier rung's run: {tokens, bpb} points from its metrics.tsv.
local function curve(run, domain)
  local f = io.open(require("kda.run").dir(run) .. "/metrics.tsv", "r")
  if not f then return {} end
  local cols, pts = nil, {}
  for line in f:lines() do
    local fields = {}
    for x in (line .. "\t"):gmatch("([^\t]*)\t") do fields[#fields + 1] = x end
    if not cols then
      cols = {}
      for i, name in ipairs(fields) do cols[name] = i end
    else
      local tok, bpb = tonumber(fields[cols.tokens]), tonumber(fields[cols["bpb_" .. domain] or 0])
      if tok and bpb then pts[#pts + 1] = { tok, bpb } end
    end
  end
  f:close()
  table.sort(pts, function(a, b) return a[1] < b[1] end)
  return pts
end

-- Linear interpolation of a curve at `tokens`; nil outside the measured range.
local function at_tokens(pts, tokens)
  for i = 2, #pts do
    local a, b = pts[i - 1], pts[i]
    if tokens >= a[1] and tokens <= b[1] then
      return a[2] + (b[2] - a[2]) * (tokens - a[1]) / math.max(1, b[1] - a[1])
    end
  end
  if #pts > 0 and tokens == pts[#pts][1] then return pts[#pts][2] end
  return nil
end

local function load_results(path)
  local done = {}
  local f = io.open(path, "r")
  if not f then return done end
  for line in f:lines() do
    local rung, pass = line:match("^(%d+)\t[^\t]*\t[^\t]*\t[^\t]*\t[^\t]*\t(%a+)")
    if rung then done[tonumber(rung)] = { line = line, pass = pass == "pass" } end
  end
  f:close()
  return done
end

local function fmt_row(r)
  return ("%d\t%s\t%s\t%.4f\t%s\t%s\t%d\t%.1f"):format(r.rung, r.name, r.bar_name, r.bar, r.bpb and ("%.4f"):format(r.bpb) or "-",
                                                      r.status, r.tokens or 0, r.seconds or 0)
end

-- Run a profile: {corpus=dir, rungs={...}}. opts: rung (only that one), fresh (ignore saved).
function M.run(profile, opts)
  opts = opts or {}
  local dir = "runs/ladder"
  kda.util.check(kda.C.kda_mkdirs(dir), "ladder: cannot create " .. dir)
  local results_path = dir .. "/results.tsv"
  local saved = opts.fresh and {} or load_results(results_path)
  local d = require("kda.data").open { manifest = profile.corpus }
  local cache, rows = {}, {}
  for n, rung in ipairs(profile.rungs) do
    local row = { rung = n, name = rung.name, bar_name = "-", bar = 0, status = "pending" }
    if rung.pending then
      row.bar_name = rung.pending
    elseif opts.rung and opts.rung ~= n then
      row.status = saved[n] and (saved[n].pass and "pass" or "fail") or "skipped"
    elseif saved[n] and saved[n].pass and not opts.rung then
      row.status, row.line = "pass", saved[n].line
      print(("rung %d: passed earlier (runs/ladder/results.tsv) — skipping"):format(n))
    else
      local domain = rung.domain:match("^[^@]+")        -- "prose@6a2633e0": a pinned domain
      local bar, bar_name = bar_value(d, domain, rung.bar, cache)
      row.bar, row.bar_name = bar, bar_name
      local model = require("kda.train").model(rung.model)
      local params = kda.nn.count_params(model, rung.batch, rung.seq)
      local tokens = rung.tokens or (rung.bytes_per_param or 20) * params
      local steps = math.max(1, math.floor(tokens / (rung.batch * rung.seq)))
      print(("rung %d: %s — %.2fM params, %d steps (%d tokens), bar %s %.4f bpb on %s")
            :format(n, rung.name, params / 1e6, steps, steps * rung.batch * rung.seq, bar_name, bar, rung.domain))
      local t0 = kda.now()
      -- each rung is a run (runs/ladder-rung-N: metrics, checkpoints, its bar for `kda report`)
      local run = ("ladder-rung-%d"):format(n)
      local r = kda.train { model = model, data = { manifest = profile.corpus, domains = { rung.domain } },
                            batch = rung.batch, seq = rung.seq, steps = steps, lr = rung.lr or 3e-3,
                            warmup = rung.warmup or math.min(50, math.floor(steps / 10)), log_every = rung.log_every or 50,
                            eval_every = rung.eval_every or 0, backend = rung.backend,
                            max_seconds = rung.max_seconds or 0, run = run, fresh = true, resume = false }
      local bars = assert(io.open(require("kda.run").dir(run) .. "/bars.tsv", "w"))
      bars:write(("%s\t%s\t%.4f\n"):format(domain, bar_name, bar))
      bars:close()
      row.bpb, row.tokens, row.seconds = r.bpb[domain], r.tokens, kda.now() - t0
      row.status = row.bpb < bar and "pass" or "fail"
      print(("rung %d: %s — %.4f bpb vs bar %.4f"):format(n, row.status:upper(), row.bpb, bar))
      if rung.compare then -- "beats rung N's curve at equal tokens"
        local ref = at_tokens(curve(("ladder-rung-%d"):format(rung.compare), domain), r.tokens)
        if not ref then
          row.status = "fail"
          print(("rung %d: rung %d's run has no evaluations spanning %d tokens: run it (with eval_every) first"):format(n, rung.compare, r.tokens))
        else
          if row.bpb >= ref then row.status = "fail" end
          row.bar_name = ("%s; rung %d curve %.4f"):format(bar_name, rung.compare, ref)
          print(("rung %d: %.4f bpb vs rung %d's curve at %d tokens: %.4f (%s)")
                :format(n, row.bpb, rung.compare, r.tokens, ref, row.bpb < ref and "better" or "not better"))
        end
      end
      saved[n] = { line = fmt_row(row), pass = row.status == "pass" }
      local out = assert(io.open(results_path, "w"))
      for k = 1, #profile.rungs do if saved[k] then out:write(saved[k].line, "\n") end end
      out:close()
      if row.status ~= "pass" and not opts.rung then rows[#rows + 1] = row; break end
    end
    rows[#rows + 1] = row
  end
  M.print_table(rows, dir .. "/table.md")
  for _, r in ipairs(rows) do if r.status == "fail" then return 1 end end
  return 0
end

function M.print_table(rows, path)
  local lines = { "| rung | what | bar | bar BPB | measured BPB | result | tokens | wall s |",
                  "|---|---|---|---|---|---|---|---|" }
  for _, r in ipairs(rows) do
    if r.line and not r.bpb then
      local f = {}
      for x in (r.line .. "\t"):gmatch("([^\t]*)\t") do f[#f + 1] = x end
      lines[#lines + 1] = "| " .. table.concat(f, " | ") .. " |"
    else
      lines[#lines + 1] = ("| %d | %s | %s | %s | %s | %s | %s | %s |"):format(r.rung, r.name, r.bar_name,
        r.bar > 0 and ("%.4f"):format(r.bar) or "-", r.bpb and ("%.4f"):format(r.bpb) or "-", r.status,
        r.tokens and tostring(r.tokens) or "-", r.seconds and ("%.0f"):format(r.seconds) or "-")
    end
  end
  local text = table.concat(lines, "\n")
  print(text)
  local f = io.open(path, "w")
  if f then f:write(text, "\n"); f:close() end
end

return M
