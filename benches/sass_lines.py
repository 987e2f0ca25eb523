#!/usr/bin/env python3
"""benches/sass_lines.py SASS.txt NCU.csv [N] [FILE:L1,L2,...] — where one kernel's instructions come from, by
source line. SASS.txt: `nvdisasm -g -c` of the cubin holding the kernel (its line-info comments
name the source line of each instruction, the innermost inlined call site first); NCU.csv: ncu's
per-instruction source page of one launch (`--page source --csv --print-source sass`), both
written by `benches/device_run.sh sass_map`. The profiled function is the disassembled one whose
opcodes match the page's row for row; each row's executed warp instructions and stall samples
are then summed by source line (file:line of the innermost frame), with the share that is
integer or address arithmetic (IMAD, IADD3, LEA, SHF, ISETP, LOP3, ...). Prints the N (40) lines
with the most instructions, and the totals by file; where the page has the shared-memory
wavefront columns (SourceCounters), the lines with the most excessive wavefronts (bank
conflicts; a cp.async whose global and shared addresses differ mod 128 bytes); and the lines with
the most instruction-fetch stall samples (no_inst: a hot loop whose body is spread over code it
does not run, e.g. a runtime mode's branches inlined in every unrolled row); and the lines with the most
stall samples, each with its three leading stall reasons. With FILE:L1,L2,...: also the totals by
region of FILE (region i from line L(i) up to L(i+1), e.g. a kernel's phase markers; region 0
before L1), each instruction counted in the region of the last FILE line seen before it in the
SASS (helpers inlined from other files go to their caller's region)."""
import collections, csv, lzma, re, sys

INT_OPS = {"IMAD", "IADD3", "LEA", "SHF", "ISETP", "LOP3", "IABS", "IMNMX", "SEL", "PRMT", "SGXT", "BMSK",
           "IADD", "IMUL", "ISCADD", "MOV", "S2R", "CS2R", "P2R", "R2P", "PLOP3", "VIMNMX", "FLO", "POPC"}


def opened(path):
    return lzma.open(path, "rt") if path.endswith(".xz") else open(path)


def opcode(text):
    w = text.replace("{", " ").split()
    if not w:
        return ""
    if w[0].startswith("@"):
        w = w[1:]
    return w[0].split(".")[0].rstrip(";") if w else ""


def functions(path):
    """{name: [(opcode, (file, line) or None), ...]} from nvdisasm -g -c output"""
    funcs, cur, where = {}, None, None
    loc = re.compile(r'//## File "([^"]+)", line (\d+)')
    ins = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?);")
    for raw in opened(path):
        m = re.match(r"\s*\.text\.(\S+):", raw)
        if m:
            cur, where = m.group(1), None
            funcs[cur] = []
            continue
        if cur is None:
            continue
        m = loc.search(raw)
        if m:
            where = (m.group(1).split("/")[-1], int(m.group(2)))
            continue
        m = ins.search(raw)
        if m:
            funcs[cur].append((opcode(m.group(2)), where))
    return funcs


def main():
    sass, page = sys.argv[1], sys.argv[2]
    top = int(sys.argv[3]) if len(sys.argv) > 3 else 40
    rows = list(csv.reader(opened(page)))
    h = next((i for i, r in enumerate(rows) if "Source" in r and "Instructions Executed" in r), None)
    if h is None:
        sys.exit(f"sass_lines: {page} has no 'Source' and 'Instructions Executed' columns: write it with "
                 "ncu -i REP --page source --csv --print-source sass from a report with the SourceCounters section")
    hdr = rows[h]
    ix = {k: i for i, k in enumerate(hdr)}
    data = [r for r in rows[h + 1:] if len(r) >= len(hdr)]
    ops = [opcode(r[ix["Source"]]) for r in data]
    best = None
    for name, f in functions(sass).items():
        if len(f) == len(ops) and all(a == b for a, (b, _) in zip(ops, f)):
            best = (name, f)
    if not best:
        sys.exit(f"sass_lines: no function in {sass} matches the {len(ops)} instructions of {page}")
    name, f = best
    num = lambda x: float(x or 0) if re.match(r"^[0-9.eE+-]+$", x or "") else 0.0
    S = ix["Warp Stall Sampling (All Samples)"]
    by, files = collections.defaultdict(lambda: [0.0, 0.0, 0.0]), collections.Counter()
    tot_i = tot_s = 0.0
    for r, (op, where) in zip(data, f):
        n, s = num(r[ix["Instructions Executed"]]), num(r[S])
        b = by[where]
        b[0] += n
        b[1] += s
        b[2] += n if op in INT_OPS else 0
        files[where[0] if where else "?"] += n
        tot_i += n
        tot_s += s
    print(f"{name}: {len(ops)} SASS lines, {tot_i:.0f} warp instructions, {tot_s:.0f} stall samples")
    print("  file:line              insts  share  int%  stall%")
    for where, (n, s, ii) in sorted(by.items(), key=lambda kv: -kv[1][0])[:top]:
        w = f"{where[0]}:{where[1]}" if where else "?"
        print(f"  {w:22s} {n:9.0f} {100 * n / tot_i:5.1f}% {100 * ii / max(n, 1):4.0f}% {100 * s / max(tot_s, 1):5.1f}%")
    print("by file: " + ", ".join(f"{k} {100 * v / tot_i:.1f}%" for k, v in files.most_common(8)))
    wf, wx = ix.get("L1 Wavefronts Shared"), ix.get("L1 Wavefronts Shared Excessive")
    if wf is not None and wx is not None:   # shared-memory wavefronts (the L1 data pipe's work) and bank conflicts
        sh = collections.defaultdict(lambda: [0.0, 0.0])
        for r, (op, where) in zip(data, f):
            sh[(where, op)][0] += num(r[wf])
            sh[(where, op)][1] += num(r[wx])
        tw, tx = sum(v[0] for v in sh.values()), sum(v[1] for v in sh.values())
        print(f"shared-memory wavefronts {tw:.0f}, {tx:.0f} of them excessive (bank conflicts, misaligned "
              f"cp.async): {100 * tx / max(tw, 1):.1f}%")
        print("  file:line              opcode      wavefronts  excessive")
        for (where, op), (w, x) in sorted(sh.items(), key=lambda kv: -kv[1][1])[:min(top, 16)]:
            if x <= 0:
                break
            loc = f"{where[0]}:{where[1]}" if where else "?"
            print(f"  {loc:22s} {op:10s} {w:11.0f} {x:10.0f}")
    ni, br = ix.get("stall_no_inst"), ix.get("stall_branch_resolving")
    if ni is not None and br is not None:   # instruction fetch: code layout (a hot loop's body spread over cold code)
        fe = collections.defaultdict(lambda: [0.0, 0.0, 0.0])
        for r, (op, where) in zip(data, f):
            e = fe[where]
            e[0] += num(r[ni])
            e[1] += num(r[br])
            e[2] += num(r[S])
        tn, tb = sum(v[0] for v in fe.values()), sum(v[1] for v in fe.values())
        print(f"instruction fetch: no_inst {tn:.0f} samples ({100 * tn / max(tot_s, 1):.1f}% of all), "
              f"branch_resolving {tb:.0f} ({100 * tb / max(tot_s, 1):.1f}%)")
        print("  file:line              no_inst  branch  line's samples")
        for where, (n, b, s) in sorted(fe.items(), key=lambda kv: -kv[1][0])[:min(top, 16)]:
            if n <= 0:
                break
            loc = f"{where[0]}:{where[1]}" if where else "?"
            print(f"  {loc:22s} {n:7.0f} {b:7.0f} {s:9.0f}")
    reasons = [(k[6:], i) for k, i in ix.items() if k.startswith("stall_") and "(" not in k]
    if reasons:   # where the warps wait, and for what (the reasons' samples by source line)
        st = collections.defaultdict(collections.Counter)
        for r, (op, where) in zip(data, f):
            for k, i in reasons:
                st[where][k] += num(r[i])
        print("stall samples by source line, the three leading reasons:")
        print("  file:line              samples  share  reasons")
        for where, c in sorted(st.items(), key=lambda kv: -sum(kv[1].values()))[:min(top, 20)]:
            n = sum(c.values())
            loc = f"{where[0]}:{where[1]}" if where else "?"
            why = ", ".join(f"{k} {100 * v / max(n, 1):.0f}%" for k, v in c.most_common(3) if v > 0)
            print(f"  {loc:22s} {n:7.0f} {100 * n / max(tot_s, 1):5.1f}%  {why}")
    if len(sys.argv) > 4:
        fname, cuts = sys.argv[4].split(":")
        cuts = [int(x) for x in cuts.split(",")]
        reg, cur = collections.defaultdict(lambda: [0.0, 0.0, 0.0]), None
        for r, (op, where) in zip(data, f):
            if where and where[0] == fname:
                cur = sum(1 for c in cuts if where[1] >= c)
            n, s = num(r[ix["Instructions Executed"]]), num(r[S])
            e = reg[cur]
            e[0] += n
            e[1] += s
            e[2] += n if op in INT_OPS else 0
        print(f"by region of {fname} (lines {sys.argv[4].split(':')[1]}):")
        for k in sorted(reg, key=lambda x: -1 if x is None else x):
            n, s, ii = reg[k]
            print(f"  region {k}: insts {100 * n / tot_i:5.1f}%  stall {100 * s / max(tot_s, 1):5.1f}%  int {100 * ii / max(n, 1):4.0f}%")


if __name__ == "__main__":
    main()
