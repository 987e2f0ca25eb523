#!/usr/bin/env python3
# benches/final_flat_emu.py — a numpy model of k_bwd_final_wg's flat path (kernels/kda_final_wg.cu,
# final_flat_wg) checked against the per-pair formula in float64, for changing that code without a
# GPU: the threads' index maps, the five swizzled tf32 tiles in the room of X, dA, dL (at several
# offsets of the room from a 1024-byte boundary), a model of how the tensor cores read a K-major
# 128-byte-swizzled operand (the layout kda_wgmma.cuh documents and tests/gpu/test_wgmma.cu checks
# on the card), the accumulator fragment map and the epilogues (dQ, R', dKi, dG). Each barrier
# interval is also checked for a tile element written by one thread and read or written by
# another. It models the code as written here, not the hardware: a change to the kernel needs the
# same change here. Usage: python3 benches/final_flat_emu.py [--balanced] (--balanced: the R1 of
# wip/fq50, benches/results/wip/2026-12-05s50-fq.patch). Prints a line a case and ALL OK, or exits 1.
# Written in session 50 (two seconds a run); planted bugs it caught: a dropped diagonal, no
# swizzle, a wrong fragment lane, a wrong B row offset, either of two barriers removed.
import numpy as np, sys

BALANCED = '--balanced' in sys.argv[1:]

C, K, KS, CS, QB, XS = 64, 128, 132, 68, 136, 136
NTC = 512
FW_T = 64 * 64

def tf32r(x):
    u = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    r = ((u + 0x1000) & 0xFFFFE000).astype(np.uint32)
    return r.view(np.float32)

def f32(x): return np.float32(x)
def kexp(x): return np.float32(np.exp2(np.float32(x) * np.float32(1.44269504)))
def bf16(x):
    u = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000).astype(np.uint32)
    return r.view(np.float32)

def wf_off(r, c):
    return (c >> 5) * (64 * 32) + r * 32 + ((((c >> 2) & 7) ^ (r & 7)) << 2) + (c & 3)

class Room:
    """X .. dLs end as floats; absolute shared byte address of X given"""
    def __init__(self, xaddr):
        self.xaddr = xaddr
        self.size = (C + 32) * XS + 2 * C * CS
        self.m = np.full(self.size, np.nan, np.float32)
        self.seg = None
    def begin(self, name):
        self.seg = (name, {}, {})   # addr -> set(writers), addr -> set(readers)
    def end(self):
        name, W, R = self.seg
        bad = 0
        for a, ws in W.items():
            if len(ws) > 1: bad += 1
            rs = R.get(a, set())
            if rs - ws: bad += 1
        if bad: print("HAZARD in segment", name, bad); sys.exit(1)
        self.seg = None
    def chk(self, i):
        assert 0 <= i < self.size, ("out of room", i)
    def rd(self, i, t):
        self.chk(i)
        if self.seg: self.seg[2].setdefault(i, set()).add(t)
        return self.m[i]
    def wr(self, i, v, t):
        self.chk(i)
        if self.seg: self.seg[1].setdefault(i, set()).add(t)
        self.m[i] = v

def run(n, xmod, seed, span):
    rng = np.random.default_rng(seed)
    # inputs
    gate = -rng.uniform(0, 1, (C, K)).astype(np.float32)
    gate *= (span / 64.0 / 0.5) * rng.uniform(0.2, 1.0, (1, K)).astype(np.float32)
    Gs = np.cumsum(gate, 0, dtype=np.float32)
    Gs[n:] = Gs[n - 1]                                   # pad rows repeat the last
    spanmax = float(np.max(Gs[0] - Gs[n - 1]))
    assert spanmax <= 128.0, spanmax
    qraw = bf16(rng.normal(0, 1, (C, K))); kraw = bf16(rng.normal(0, 1, (C, K)))
    qraw[n:] = 0; kraw[n:] = 0
    rq = np.zeros(C, np.float32); rk = np.zeros(C, np.float32); bs = np.zeros(C, np.float32)
    rq[:n] = 1 / np.sqrt((qraw[:n] ** 2).sum(1)); rk[:n] = 1 / np.sqrt((kraw[:n] ** 2).sum(1))
    bs[:n] = rng.uniform(0, 1, n)
    dA = rng.normal(0, 1, (C, C)).astype(np.float32); dL = rng.normal(0, 1, (C, C)).astype(np.float32)
    dA[n:] = 0; dL[n:] = 0                                # cp_tile zero-fills rows past n; above-diagonal garbage kept
    dQ0 = rng.normal(0, 1, (C, K)).astype(np.float32); dKb0 = rng.normal(0, 1, (C, K)).astype(np.float32)
    dKi0 = rng.normal(0, 1, (C, K)).astype(np.float32)
    scale = np.float32(K ** -0.5)
    qv = lambda i, d: f32(qraw[i, d] * rq[i]); kv = lambda i, d: f32(kraw[i, d] * rk[i])
    # ---- direct formula (float64) ----
    G = Gs.astype(np.float64); qn = (qraw * rq[:, None]).astype(np.float64); kn = (kraw * rk[:, None]).astype(np.float64)
    A = np.tril(dA.astype(np.float64)); Lm = np.tril(dL.astype(np.float64), -1)
    ref = {}
    rdQ = np.zeros((n, K)); rR = np.zeros((n, K)); rdKi = np.zeros((n, K)); rdG = np.zeros((n, K))
    for d in range(K):
        E = np.exp(G[:n, d][:, None] - G[:n, d][None, :])   # E[i, j] = e^{G_i - G_j}
        E = np.tril(E)
        dqi = (A[:n, :n] * E) @ kn[:n, d]
        R = (Lm[:n, :n] * E) @ kn[:n, d]
        col = (A[:n, :n] * E).T @ qn[:n, d] + (Lm[:n, :n] * E).T @ (bs[:n] * kn[:n, d])
        eg = np.exp(G[:n, d])
        dq = scale * dQ0[:n, d] * eg
        rdQ[:, d] = dq + dqi
        rR[:, d] = R + dKb0[:n, d] * eg
        dki = dKi0[:n, d] * np.exp(G[n - 1, d] - G[:n, d])
        rdKi[:, d] = dki + col
        rdG[:, d] = qn[:n, d] * rdQ[:, d] - kn[:n, d] * rdKi[:, d]
    # ---- emulation ----
    smbase = xmod  # absolute byte address of X (16-aligned)
    room = Room(smbase)
    # staged dA, dL tiles (and Xd garbage elsewhere)
    dAs0 = (C + 32) * XS; dLs0 = dAs0 + C * CS
    for i in range(C):
        for j in range(CS):
            room.m[dAs0 + i * CS + j] = dA[i, j] if j < C else np.nan
            room.m[dLs0 + i * CS + j] = dL[i, j] if j < C else np.nan
    room.m[:dAs0] = rng.normal(0, 1, dAs0)  # X (Xd etc.): garbage, never read here
    dQg = dQ0.copy(); dQg[n:] = np.nan
    dKig = dKi0.copy(); dKig[n:] = np.nan
    dKbs = dKb0.copy(); dKbs[n:] = np.nan
    if BALANCED:   # fq50: dQ0 staged into the dG tile, zeros past n
        dGs = np.zeros((C, K), np.float32); dGs[:n] = dQ0[:n]
    else:
        dGs = np.full((C, K), np.nan, np.float32)
    pad = ((1024 - (smbase & 1023)) & 1023) // 4
    T = [pad + t * FW_T for t in range(5)]
    assert T[4] + FW_T <= room.size
    def stage_t(lo, hi, h0, h1, v):
        for t in range(NTC):
            for e in range(t, 64 * 16 * (h1 - h0), NTC):
                i = e & 63; d = 64 * h0 + ((e >> 6) << 2)
                x = [0.0] * 4
                if i < n: x = v(i, d)
                Tt = lo if d < 64 else hi
                for u in range(4): room.wr(Tt + wf_off((d & 63) + u, i), tf32r(x[u]), t)
    def up_dn(i, d):
        g = Gs[i, d:d + 4]; g0 = Gs[0, d:d + 4]; gl = Gs[n - 1, d:d + 4]
        m = (np.float32(0.5) * (g0 + gl)).astype(np.float32)
        return [kexp(g[u] - m[u]) for u in range(4)], [kexp(m[u] - g[u]) for u in range(4)]
    def v4(raw, r, i, d): return [f32(raw[i, d + u] * r[i]) for u in range(4)]
    # hardware read model of a K-major, 128B-swizzled operand: element (m, kk) of the k8 step at k0
    def hw(tile_float, n0, M, k0, tid):
        base = smbase + 4 * tile_float
        assert base % 1024 == 0
        out = np.zeros((M, 8), np.float64)
        for mm in range(M):
            for kk in range(8):
                adv = (k0 >> 5) * 8192 + (k0 & 31) * 4
                logical = base + adv + ((n0 + mm) // 8) * 1024 + ((n0 + mm) % 8) * 128 + kk * 4
                phys = logical ^ (((logical >> 7) & 7) << 4)
                out[mm, kk] = room.rd((phys - smbase) // 4, tid)
        return out
    def wgmma(Ta, Tb, n0, N, g, acc=None):
        D = np.zeros((64, N)) if acc is None else acc
        for k0 in range(0, 64, 8):
            a = hw(Ta, 0, 64, k0, -1 - g); b = hw(Tb, n0, N, k0, -1 - g)
            D = D + a @ b.T
        return D
    def frag(D, t, N):  # thread t of the warpgroup: acc[4j+q]
        wq = t >> 5; l = t & 31
        acc = np.zeros(N // 2)
        for j in range(N // 8):
            for q in range(4):
                acc[4 * j + q] = D[16 * wq + (l >> 2) + 8 * (q >> 1), 8 * j + 2 * (l & 3) + (q & 1)]
        return acc.astype(np.float32)
    # S1
    room.begin("S1")
    for t in range(NTC):
        for e in range(t, 64 * 16, NTC):
            i = e & 63; c = (e >> 6) << 2
            av = [room.rd(dAs0 + i * CS + c + u, t) for u in range(4)]
            bv = [room.rd(dLs0 + i * CS + c + u, t) for u in range(4)]
            for u in range(4):
                ya = tf32r(av[u]) if (i < n and c + u <= i) else np.float32(0)
                yl = tf32r(bv[u]) if (i < n and c + u < i) else np.float32(0)
                room.wr(T[2] + wf_off(c + u, i), ya, t)
                room.wr(T[0] + wf_off(i, c + u), ya, t)
                room.wr(T[1] + wf_off(i, c + u), yl, t)
    room.end()
    room.begin("S2")
    stage_t(T[3], T[4], 0, 2, lambda j, d: [a * b for a, b in zip(v4(kraw, rk, j, d), up_dn(j, d)[1])])
    room.end()
    # R1
    if BALANCED:   # wip/fq50: every warpgroup a 32-column block of both products, dQ0 staged in the dG tile
        room.begin("R1")
        for g in range(4):
            d0 = 32 * g
            Bt = T[4] if g >> 1 else T[3]
            DA = wgmma(T[0], Bt, 32 * (g & 1), 32, g)
            DL = wgmma(T[1], Bt, 32 * (g & 1), 32, g)
            for tt in range(128):
                t = 128 * g + tt
                qa = frag(DA, tt, 32); la = frag(DL, tt, 32)
                wq = (t >> 5) & 3; l = t & 31; r0 = 16 * wq + (l >> 2); c0 = 2 * (l & 3)
                for jj in range(4):
                    for h in range(2):
                        i = r0 + 8 * h; d = d0 + 8 * jj + c0; o = 4 * jj + 2 * h
                        if i >= n: continue
                        up = []; eg = []
                        for u in range(2):
                            m = np.float32(0.5) * (Gs[0, d + u] + Gs[n - 1, d + u])
                            up.append(kexp(Gs[i, d + u] - m)); eg.append(kexp(Gs[i, d + u]))
                        q0v = [dGs[i, d], dGs[i, d + 1]]
                        for u in range(2):
                            dq = f32(f32(scale * q0v[u]) * eg[u]); y = f32(qa[o + u] * up[u]); qq = qv(i, d + u)
                            dQg[i, d + u] = dq + y
                            dGs[i, d + u] = f32(qq * dq) + f32(qq * y)
                            dKbs[i, d + u] = f32(la[o + u] * up[u]) + f32(dKbs[i, d + u] * eg[u])
        room.end()
    else:          # main: warpgroups 0, 2 dA's rows, 1, 3 dL's, 64 columns each
        room.begin("R1")
        for g in range(4):
            ga = g & 1; d0 = 64 * (g >> 1)
            D = wgmma(T[1] if ga else T[0], T[4] if g >> 1 else T[3], 0, 64, g)
            for tt in range(128):
                t = 128 * g + tt
                acc = frag(D, tt, 64)
                wq = (t >> 5) & 3; l = t & 31; r0 = 16 * wq + (l >> 2); c0 = 2 * (l & 3)
                for jj in range(8):
                    for h in range(2):
                        i = r0 + 8 * h; d = d0 + 8 * jj + c0; o = 4 * jj + 2 * h
                        if i >= n: continue
                        pf = [dKbs[i, d], dKbs[i, d + 1]] if ga else [dQg[i, d], dQg[i, d + 1]]
                        y = []; eg = []
                        for u in range(2):
                            m = np.float32(0.5) * (Gs[0, d + u] + Gs[n - 1, d + u])
                            y.append(f32(acc[o + u] * kexp(Gs[i, d + u] - m))); eg.append(kexp(Gs[i, d + u]))
                        if not ga:
                            for u in range(2):
                                dq = f32(f32(scale * pf[u]) * eg[u]); qq = qv(i, d + u)
                                dQg[i, d + u] = dq + y[u]
                                dGs[i, d + u] = f32(qq * dq) + f32(qq * y[u])
                        else:
                            for u in range(2): dKbs[i, d + u] = y[u] + f32(pf[u] * eg[u])
        room.end()
    room.begin("S3")
    for t in range(NTC):
        for e in range(t, 64 * 16, NTC):
            i = e & 63; c = (e >> 6) << 2
            for u in range(4):
                x = room.rd(T[1] + wf_off(i, c + u), t)
                room.wr(T[0] + wf_off(c + u, i), x, t)
    stage_t(T[3], T[4], 0, 2, lambda i, d: [a * b for a, b in zip(v4(qraw, rq, i, d), up_dn(i, d)[0])])
    room.end()
    def ybk(i, d):
        up = up_dn(i, d)[0]; k = v4(kraw, rk, i, d)
        return [f32(f32(bs[i] * k[u]) * up[u]) for u in range(4)]
    room.begin("R2a")
    Ds = [wgmma(T[2], T[4] if g >> 1 else T[3], 32 * (g & 1), 32, g) for g in range(4)]
    stage_t(T[1], T[1], 0, 1, ybk)
    room.end()
    room.begin("Ybk1")
    stage_t(T[3], T[3], 1, 2, ybk)
    room.end()
    room.begin("R2b")
    for g in range(4):
        D = wgmma(T[0], T[3] if g >> 1 else T[1], 32 * (g & 1), 32, g, Ds[g])
        d0 = 32 * g
        for tt in range(128):
            t = 128 * g + tt
            acc = frag(D, tt, 32)
            wq = (t >> 5) & 3; l = t & 31; r0 = 16 * wq + (l >> 2); c0 = 2 * (l & 3)
            for jj in range(4):
                for h in range(2):
                    j = r0 + 8 * h; d = d0 + 8 * jj + c0; o = 4 * jj + 2 * h
                    if j >= n: continue
                    for u in range(2):
                        m = np.float32(0.5) * (Gs[0, d + u] + Gs[n - 1, d + u])
                        col = f32(acc[o + u] * kexp(m - Gs[j, d + u]))
                        dki = f32(dKig[j, d + u] * kexp(Gs[n - 1, d + u] - Gs[j, d + u]))
                        kk = kv(j, d + u)
                        dKig[j, d + u] = dki + col
                        dGs[j, d + u] = dGs[j, d + u] - (f32(kk * dki) + f32(kk * col))
    room.end()
    # compare
    def rr(a, b):
        return np.sqrt(np.mean((a.astype(np.float64) - b) ** 2)) / np.sqrt(np.mean(b ** 2))
    res = dict(dQ=rr(dQg[:n], rdQ), R=rr(dKbs[:n], rR), dKi=rr(dKig[:n], rdKi), dG=rr(dGs[:n], rdG))
    untouched = np.all(np.isnan(dQg[n:])) and np.all(np.isnan(dKig[n:])) and np.all(np.isnan(dKbs[n:])) and (np.all(dGs[n:] == 0) if BALANCED else np.all(np.isnan(dGs[n:])))
    finite = all(np.all(np.isfinite(x[:n])) for x in (dQg, dKig, dKbs, dGs))
    print(f"n={n} X%1024={xmod % 1024} span={spanmax:.1f} pad={pad*4}B " +
          " ".join(f"{k}={v:.2e}" for k, v in res.items()) + f" rows>=n untouched={untouched} finite={finite}")
    return max(res.values()) < 7e-3 and untouched and finite

ok = True
for n, xmod, seed, span in [(64, 33792 + 256, 1, 120.0), (37, 33792 + 16, 2, 100.0), (64, 33792 + 1008, 3, 60.0),
                             (1, 33792 + 0, 4, 10.0), (50, 33792 + 512, 5, 127.0)]:
    ok &= run(n, xmod, seed, span)
print("ALL OK" if ok else "FAILED")
sys.exit(0 if ok else 1)
