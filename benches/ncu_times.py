#!/usr/bin/env python3
"""benches/ncu_times.py — read `ncu --metrics gpu__time_duration.sum --csv` on stdin and print one
line per profiled kernel launch (short name, grid, block, microseconds), then the total, then each
kernel's median over its launches (largest first): where the time of one forward+backward goes, and
the figure to compare a change by (a kernel's phase counters can move without its time moving)."""
import csv, re, statistics, sys

rows = [r for r in csv.reader(l for l in sys.stdin if l.startswith('"'))]
if not rows:
    sys.exit("ncu_times: no CSV rows on stdin (did ncu run and profile any kernel?)")
head, body = rows[0], rows[1:]
col = {name: i for i, name in enumerate(head)}
total, per = 0.0, {}
for r in body:
    if r[col["Metric Name"]] != "gpu__time_duration.sum":
        continue
    unit, val = r[col["Metric Unit"]], float(r[col["Metric Value"]].replace(",", ""))
    us = val / 1e3 if unit in ("ns", "nsecond") else val * 1e3 if unit in ("ms", "msecond") else val
    name = re.sub(r"\(.*", "", r[col["Kernel Name"]])[:48]
    total += us
    per.setdefault(name, []).append(us)
    print(f"{name:48s} grid {r[col['Grid Size']]:>14s} block {r[col['Block Size']]:>12s} {us:9.2f} us")
print(f"total {total:.2f} us over {len(body)} launches")
med = {k: statistics.median(v) for k, v in per.items()}
print("median a launch: " + ", ".join(f"{k.replace('void ', '')} {v:.1f}" for k, v in sorted(med.items(), key=lambda kv: -kv[1])))
