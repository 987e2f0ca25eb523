#!/usr/bin/env python3
"""benches/ncu_sass_mix.py FILE.csv[.xz] — summarise one kernel's per-instruction ncu source page
(`ncu -i REP --page source --csv --print-source sass`, as `device_run.sh ncu_source` writes it;
an optional second argument N: how many of the top-stalling instructions to list, default 12):
warp-stall reasons over all sampled instructions, then the opcode mix (executed warp
instructions, and each opcode's share of the stall samples). The page itself has 9k rows a
kernel; this is what decides where a kernel's issue slots go (e.g. integer address work, the
exponent's wrapper)."""
import collections, csv, sys

from sass_lines import opened   # a page as written, or .xz


def num(x):
    try:
        return float(x or 0)
    except ValueError:
        return 0.0


rows = list(csv.reader(opened(sys.argv[1])))
hdr = rows[1]
ix = {h: i for i, h in enumerate(hdr)}
data = [r for r in rows[2:] if len(r) >= len(hdr)]
S, X = ix["Warp Stall Sampling (All Samples)"], ix["Instructions Executed"]
samples = sum(num(r[S]) for r in data)
insts = sum(num(r[X]) for r in data)
print(f"stall samples {samples:.0f}, warp instructions executed {insts:.0f}, SASS lines {len(data)}")
stall = collections.Counter()
for r in data:
    for h in hdr:
        if h.startswith("stall_"):
            stall[h] += num(r[ix[h]])
for h, v in stall.most_common(12):
    print(f"{h:30s} {v:10.0f} {100 * v / samples:5.1f}%")
ops, op_s = collections.Counter(), collections.Counter()
for r in data:
    w = r[ix["Source"]].split()
    if not w:
        continue
    o = (w[1] if w[0].startswith("@") else w[0]).split(".")[0]   # opcode without predicate, modifiers
    ops[o] += num(r[X])
    op_s[o] += num(r[S])
print("opcode      warp insts   share  stall share")
for o, v in ops.most_common(20):
    print(f"{o:10s} {v:12.0f} {100 * v / insts:6.1f}% {100 * op_s[o] / samples:6.1f}%")
# the instructions holding the most stall samples, each with its two largest reasons (where a
# kernel waits: a fence, a barrier, a load's consumer)
print("top lines: samples share  reasons  instruction")
stalls = [h for h in hdr if h.startswith("stall_")]
for r in sorted(data, key=lambda r: -num(r[S]))[:int(sys.argv[2]) if len(sys.argv) > 2 else 12]:
    why = sorted(stalls, key=lambda h: -num(r[ix[h]]))[:2]
    reasons = " ".join(f"{h[6:]}:{num(r[ix[h]]):.0f}" for h in why if num(r[ix[h]]))
    print(f"{num(r[S]):8.0f} {100 * num(r[S]) / samples:5.1f}%  {reasons:34s} {' '.join(r[ix['Source']].split())[:70]}")
