#!/usr/bin/env python3
"""benches/sass_check.py DIR [BASE_DIR] [NAME ...] — what the compiler made of the kernels, read
without a GPU from the files benches/sass_local.sh writes (DIR/*.sass: cuobjdump -sass;
DIR/*.ptxas: nvcc -Xptxas -v).

For each kernel (only those whose mangled name holds one of NAME, when given):
  * registers and spill bytes (ptxas), local-memory instructions (LDL / STL);
  * accesses the source wrote as one vector that the compiler split: four 32-bit accesses of one
    base register at o, o + 4, o + 8, o + 12 (or, for global memory, two at o, o + 4) within a few
    instructions. Two scalar loads of neighbouring elements look the same, so a hit is a place to
    read, not a verdict; a 4-byte pair beside an STG.E.64 of the same helper is its unaligned branch.
With BASE_DIR: only the kernels whose code differs between BASE_DIR and DIR: registers, spills,
memory-instruction counts, and the instruction stream itself (opcodes and operands, branch
targets and encodings aside). Same counts, other code is a change too: st2f's 64-bit store
(f931d00) left k_bwd_final_tc's counts as they were and moved its registers and schedule, and the
kernel ran 1268 -> 1328 us (H200, 2026-12-04s44b); the counts alone had called it unchanged.

Why: the front end split a float2 / uint4 store written through a pointer into 4-byte stores
wherever it could not prove the alignment; a warp's 4-byte stores to 32 rows made the kept
wgmma forward 2.8x slower (2026-12-04, session 43) and every reverse sweep stored dVn that way."""
import collections, glob, os, re, sys

MEM = re.compile(r"\b(STG|LDG|STS|LDS|STL|LDL)((?:\.\w+)*)\s+(.*?);")
ADDR = re.compile(r"\[(U?R\d+)(?:\.64|\.X4|\.U32)?(?:\+(0x[0-9a-f]+))?\]")
NARROW = ("128", "64", "U16", "S16", "U8", "S8")
WINDOW = 8


def sass(d):
    """kernel -> (op counts, split hits, instruction stream)"""
    ops, hits = collections.defaultdict(collections.Counter), collections.defaultdict(collections.Counter)
    code = collections.defaultdict(list)
    for f in glob.glob(os.path.join(d, "*.sass")):
        fn, recent = None, []
        for line in open(f):
            m = re.search(r"Function : (\S+)", line)
            if m:
                fn, recent = m.group(1), []
                continue
            if "*/" not in line or fn is None:
                continue
            ins = line[line.index("*/") + 2:].split("/*")[0].strip()
            if ins and not re.match(r"@?!?\w*\s*(BRA|CALL|JMP|BSSY|BRX)\b", ins.split(" ", 1)[-1] if ins.startswith("@") else ins):
                code[fn].append(ins)   # branch targets move with any code before them: left out
            m = MEM.search(re.sub(r"desc\[\w+\]", "", line[line.index("*/") + 2:]))
            if not m:
                continue
            op, mods, args = m.groups()
            ops[fn][op + mods.replace(".E", "").replace(".BYPASS", "")] += 1
            a = ADDR.search(args)
            if not a or any(t in mods for t in NARROW) or op in ("STL", "LDL"):
                recent = (recent + [None])[-WINDOW:]
                continue
            key = (op, a.group(1), int(a.group(2) or "0", 16))
            recent = (recent + [key])[-WINDOW:]
            have = set(k for k in recent[:-1] if k)
            o = key[2]
            if o % 16 == 12 and all((op, key[1], o - k) in have for k in (4, 8, 12)):
                hits[fn][op + " x4"] += 1
            elif op in ("STG", "LDG") and o % 8 == 4 and (op, key[1], o - 4) in have:
                hits[fn][op + " x2"] += 1
    return ops, hits, code


def ptxas(d):
    """kernel -> (registers, spill stores, spill loads)"""
    r = {}
    for f in glob.glob(os.path.join(d, "*.ptxas")):
        cur = None
        for line in open(f):
            m = re.search(r"Compiling entry function '(\S+)'", line)
            if m:
                cur = m.group(1)
            m = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)
            if m and cur:
                r[cur] = r.get(cur, (0, 0, 0))[:1] + (int(m.group(1)), int(m.group(2)))
            m = re.search(r"Used (\d+) registers", line)
            if m and cur:
                r[cur] = (int(m.group(1)),) + r.get(cur, (0, 0, 0))[1:]
    return r


def main():
    args = sys.argv[1:]
    if not args:
        sys.exit(__doc__)
    d, base = args[0], None
    if len(args) > 1 and os.path.isdir(args[1]):
        base, args = args[1], args[2:]
    else:
        args = args[1:]
    want = lambda k: not args or any(n in k for n in args)
    ops, hits, code = sass(d)
    regs = ptxas(d)
    if base:
        bops, _, bcode = sass(base)
        bregs = ptxas(base)
        for k in sorted(set(ops) | set(bops)):
            if not want(k):
                continue
            diff = {o: ops[k][o] - bops[k][o] for o in set(ops[k]) | set(bops[k]) if ops[k][o] != bops[k][o]}
            same = code[k] == bcode[k]
            if diff or regs.get(k) != bregs.get(k) or not same:
                moved = sum(a != b for a, b in zip(code[k], bcode[k])) + abs(len(code[k]) - len(bcode[k]))
                print(f"{k[:78]}\n    registers, spill st/ld {bregs.get(k)} -> {regs.get(k)}; memory ops {diff}; "
                      f"instructions {len(bcode[k])} -> {len(code[k])}, {moved} differ in place")
        return
    for k in sorted(set(ops) | set(regs)):
        if not want(k):
            continue
        rg = regs.get(k, ("?", "?", "?"))
        local = ops[k]["LDL"] + ops[k]["STL"] + ops[k]["LDL.LU"]
        split = " ".join(f"{o}:{n}" for o, n in sorted(hits[k].items())) or "-"
        print(f"{rg[0]:>4} regs  spill {rg[1]}/{rg[2]:<4} local ops {local:<3} split {split:<24} {k[:70]}")


if __name__ == "__main__":
    main()
