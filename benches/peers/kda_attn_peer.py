#!/usr/bin/env python3
"""kda_attn_peer.py — the softmax-attention peer for benches/kda_bench.cu.

PyTorch SDPA causal attention, bf16, [B,H,T,D] at the KDA bench shapes, forward and
forward+backward, timed with CUDA events: median of warm reps, first call separately.
FLOPs: causal attention fwd = 2 * 2 * B*H*T^2*D / 2 (QK^T and PV, half the square);
fwd+bwd = 3.5x fwd (bwd recomputes P: 5 GEMMs of the same size against 2).
Usage: python3 benches/peers/kda_attn_peer.py [--json out.json]
"""
import json
import sys
import time

import torch
import torch.nn.functional as F

SHAPES = [(8, 2048, 16, 128), (1, 8192, 16, 128), (32, 512, 4, 64), (8, 512, 4, 64)]


def timed(fn, reps):
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for _ in range(3):
        fn()
    for a, b in ev:
        a.record()
        fn()
        b.record()
    torch.cuda.synchronize()
    ms = sorted(a.elapsed_time(b) for a, b in ev)
    return ms[len(ms) // 2]


def main():
    if not torch.cuda.is_available():
        print("# no CUDA device: peer skipped")
        return
    print(f"# SDPA causal attention peer on {torch.cuda.get_device_name()} (torch {torch.__version__}), bf16")
    print(f"{'shape (B,T,H,D)':22s} {'mode':7s} {'first_ms':>9s} {'med_ms':>9s} {'TFLOP/s':>9s} {'Mtok/s':>9s}")
    rows = []
    for B, T, H, D in SHAPES:
        q, k, v = (torch.randn(B, H, T, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
        do = torch.randn(B, H, T, D, device="cuda", dtype=torch.bfloat16)
        fwd_flops = 2.0 * B * H * T * T * D   # 2 GEMMs x 2 flop x half of T^2
        reps = 10 if B * T * H * D > 1e8 else 30

        def fwd():
            with torch.no_grad():
                F.scaled_dot_product_attention(q, k, v, is_causal=True)

        def fwdbwd():
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            o.backward(do)

        for mode, fn, fl in (("fwd", fwd, fwd_flops), ("fwd+bwd", fwdbwd, 3.5 * fwd_flops)):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            first = (time.perf_counter() - t0) * 1e3
            med = timed(fn, reps)
            name = f"({B},{T},{H},{D})"
            print(f"{name:22s} {mode:7s} {first:9.3f} {med:9.3f} {fl / med * 1e-9:9.2f} {B * T / med * 1e-3:9.2f}")
            rows.append(dict(shape=[B, T, H, D], mode=mode, first_ms=first, median_ms=med))
    if "--json" in sys.argv:
        with open(sys.argv[sys.argv.index("--json") + 1], "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
