-- kda.report — one self-contained HTML file comparing runs: `kda report RUN... [--out FILE]`.
-- Inline SVG, no JavaScript: held-out BPB against tokens seen, one plot per domain, one line per
-- run, the n-gram bars of runs/<name>/bars.tsv (domain \t name \t bpb) as dashed lines; then the
-- training loss against step. The page is well-formed XML, so any XML parser can check it.
local util = require "kda.util"
local runs = require "kda.run"

local M = {}

local colors = { "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf" }

local function esc(s)
  return (tostring(s):gsub("[&<>\"]", { ["&"] = "&amp;", ["<"] = "&lt;", [">"] = "&gt;", ['"'] = "&quot;" }))
end

-- metrics.tsv as a list of rows {column = number}; empty cells are absent.
function M.read_metrics(name)
  local path = runs.dir(name) .. "/metrics.tsv"
  local f = io.open(path, "r")
  if not f then util.fail(("report: %s does not exist: is '%s' a run under %s/?"):format(path, name, runs.root)) end
  local cols, rows = nil, {}
  for line in f:lines() do
    local cells = {}
    for c in (line .. "\t"):gmatch("([^\t]*)\t") do cells[#cells + 1] = c end
    if not cols then cols = cells
    else
      local r = {}
      for i, c in ipairs(cols) do r[c] = tonumber(cells[i]) end
      rows[#rows + 1] = r
    end
  end
  f:close()
  return rows, cols or {}
end

function M.read_bars(name)
  local f = io.open(runs.dir(name) .. "/bars.tsv", "r")
  local bars = {}
  if not f then return bars end
  for line in f:lines() do
    local dom, label, v = line:match("^([^\t]+)\t([^\t]+)\t([^\t]+)$")
    if tonumber(v) then bars[#bars + 1] = { domain = dom, name = label, bpb = tonumber(v) } end
  end
  f:close()
  return bars
end

-- Round tick steps: 1, 2 or 5 times a power of ten, about five per axis.
local function ticks(lo, hi)
  local span = hi - lo
  local step = 10 ^ math.floor(math.log10(span / 5))
  for _, m in ipairs { 1, 2, 5, 10 } do if span / (step * m) <= 6 then step = step * m break end end
  local t = {}
  for v = math.ceil(lo / step) * step, hi + step * 1e-9, step do t[#t + 1] = v end
  return t
end

local function fmt(v)
  if v ~= 0 and (math.abs(v) >= 1e4 or math.abs(v) < 1e-2) then return ("%.3g"):format(v) end
  return ("%.4g"):format(v)
end

-- p: {title=, xlabel=, ylabel=, series={{name=, pts={{x,y}...}}}, hlines={{y=, label=}}}
function M.svg(p)
  local W, H, L, R, Tp, Bm = 640, 360, 64, 160, 28, 44
  local xs, ys = {}, {}
  for _, s in ipairs(p.series) do
    for _, pt in ipairs(s.pts) do xs[#xs + 1], ys[#ys + 1] = pt[1], pt[2] end
  end
  for _, h in ipairs(p.hlines or {}) do ys[#ys + 1] = h.y end
  if #xs == 0 then xs, ys = { 0, 1 }, { 0, 1 } end
  local x0, x1, y0, y1 = math.huge, -math.huge, math.huge, -math.huge
  for _, x in ipairs(xs) do x0, x1 = math.min(x0, x), math.max(x1, x) end
  for _, y in ipairs(ys) do y0, y1 = math.min(y0, y), math.max(y1, y) end
  if x1 == x0 then x1 = x0 + 1 end
  if y1 == y0 then y0, y1 = y0 - 0.5, y1 + 0.5 end
  local pad = (y1 - y0) * 0.05
  y0, y1 = y0 - pad, y1 + pad
  local function px(x) return L + (x - x0) / (x1 - x0) * (W - L - R) end
  local function py(y) return H - Bm - (y - y0) / (y1 - y0) * (H - Tp - Bm) end
  local o = {}
  local function add(f, ...) o[#o + 1] = f:format(...) end
  add('<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="11">', W, H, W, H)
  add('<text x="%d" y="16" font-size="13" font-weight="bold">%s</text>', L, esc(p.title))
  add('<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#888"/>', L, Tp, W - L - R, H - Tp - Bm)
  for _, v in ipairs(ticks(x0, x1)) do
    add('<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#eee"/><text x="%.1f" y="%d" text-anchor="middle">%s</text>',
        px(v), Tp, px(v), H - Bm, px(v), H - Bm + 14, fmt(v))
  end
  for _, v in ipairs(ticks(y0, y1)) do
    add('<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#eee"/><text x="%d" y="%.1f" text-anchor="end">%s</text>',
        L, py(v), W - R, py(v), L - 4, py(v) + 4, fmt(v))
  end
  add('<text x="%d" y="%d" text-anchor="middle">%s</text>', L + (W - L - R) / 2, H - 8, esc(p.xlabel))
  add('<text x="14" y="%d" text-anchor="middle" transform="rotate(-90 14 %d)">%s</text>', H / 2, H / 2, esc(p.ylabel))
  for i, h in ipairs(p.hlines or {}) do
    add('<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#555" stroke-dasharray="6 4"/>', L, py(h.y), W - R, py(h.y))
    add('<text x="%d" y="%.1f" fill="#555">%s %s</text>', W - R + 4, py(h.y) + 4, esc(h.label), fmt(h.y))
    if i > 8 then break end
  end
  for i, s in ipairs(p.series) do
    local c = colors[(i - 1) % #colors + 1]
    local pts = {}
    for _, pt in ipairs(s.pts) do pts[#pts + 1] = ("%.1f,%.1f"):format(px(pt[1]), py(pt[2])) end
    if #pts == 1 then add('<circle cx="%s" cy="%s" r="3" fill="%s"/>', pts[1]:match("^(.-),"), pts[1]:match(",(.*)$"), c) end
    add('<polyline fill="none" stroke="%s" stroke-width="1.5" points="%s"/>', c, table.concat(pts, " "))
    add('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="2"/><text x="%d" y="%d">%s</text>',
        W - R + 8, Tp + 8 + 16 * (i - 1), W - R + 28, Tp + 8 + 16 * (i - 1), c, W - R + 32, Tp + 12 + 16 * (i - 1), esc(s.name))
  end
  add("</svg>")
  return table.concat(o, "\n")
end

-- names: run names; out: the HTML path. Returns out.
function M.write(names, out)
  if #names == 0 then util.fail("report: name at least one run, e.g. kda report tiny") end
  local data, domains, seen = {}, {}, {}
  for _, name in ipairs(names) do
    local rows, cols = M.read_metrics(name)
    data[#data + 1] = { name = name, rows = rows, bars = M.read_bars(name) }
    for _, c in ipairs(cols) do
      local dom = c:match("^bpb_(.+)$")
      if dom and not seen[dom] then seen[dom] = true; domains[#domains + 1] = dom end
    end
  end
  local body = {}
  for _, dom in ipairs(domains) do
    local series, hlines, barseen = {}, {}, {}
    for _, r in ipairs(data) do
      local pts = {}
      for _, row in ipairs(r.rows) do
        if row["bpb_" .. dom] and row.tokens then pts[#pts + 1] = { row.tokens, row["bpb_" .. dom] } end
      end
      series[#series + 1] = { name = r.name, pts = pts }
      for _, b in ipairs(r.bars) do
        if b.domain == dom and not barseen[b.name] then barseen[b.name] = true; hlines[#hlines + 1] = { y = b.bpb, label = b.name } end
      end
    end
    body[#body + 1] = M.svg { title = "held-out BPB, " .. dom, xlabel = "tokens", ylabel = "bits per byte", series = series, hlines = hlines }
  end
  local series = {}
  for _, r in ipairs(data) do
    local pts = {}
    for _, row in ipairs(r.rows) do if row.loss then pts[#pts + 1] = { row.step, row.loss } end end
    series[#series + 1] = { name = r.name, pts = pts }
  end
  body[#body + 1] = M.svg { title = "training loss", xlabel = "step", ylabel = "loss (bits per byte)", series = series }
  local tbl = { "<table><tr><th>run</th><th>steps</th><th>tokens</th>" }
  for _, dom in ipairs(domains) do tbl[#tbl + 1] = "<th>BPB " .. esc(dom) .. "</th>" end
  tbl[#tbl + 1] = "</tr>"
  for _, r in ipairs(data) do
    local last, bpb = r.rows[#r.rows] or {}, {}
    for _, row in ipairs(r.rows) do for _, dom in ipairs(domains) do bpb[dom] = row["bpb_" .. dom] or bpb[dom] end end
    tbl[#tbl + 1] = ("<tr><td>%s</td><td>%s</td><td>%s</td>"):format(esc(r.name), last.step or "", last.tokens and ("%.0f"):format(last.tokens) or "")
    for _, dom in ipairs(domains) do tbl[#tbl + 1] = "<td>" .. (bpb[dom] and ("%.4f"):format(bpb[dom]) or "") .. "</td>" end
    tbl[#tbl + 1] = "</tr>"
  end
  tbl[#tbl + 1] = "</table>"
  local html = table.concat({
    '<!DOCTYPE html>',
    '<html xmlns="http://www.w3.org/1999/xhtml"><head><meta charset="utf-8"/><title>kda report</title>',
    '<style>body{font-family:sans-serif;margin:2em}svg{display:block;margin:1em 0}td,th{padding:2px 10px;text-align:right}</style>',
    '</head><body>',
    ("<h1>kda report: %s</h1>"):format(esc(table.concat(names, ", "))),
    ("<p>%s</p>"):format(esc(os.date("!%Y-%m-%d %H:%M UTC"))),
    table.concat(tbl, ""), table.concat(body, "\n"), "</body></html>", "" }, "\n")
  local f, err = io.open(out, "w")
  if not f then util.fail(("report: cannot write %s (%s): choose another --out"):format(out, err)) end
  f:write(html)
  f:close()
  return out
end

return M
