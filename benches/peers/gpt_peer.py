#!/usr/bin/env python3
"""gpt_peer.py — the PyTorch peer for kda's speed benchmarks: a GPT-style byte-level model.

Model: vocab 256, tied input/output embedding, pre-norm blocks of
  RMSNorm -> fused qkv Linear -> RoPE (pairs (i, i+Dh/2), theta 10000) -> SDPA causal -> Linear
  RMSNorm -> SwiGLU MLP (hidden = 8d/3 rounded up to a multiple of 64) ,
final RMSNorm, no biases. AdamW (fused=True, lr 3e-4, betas 0.9/0.95, eps 1e-8, wd 0.1 on
matrices, 0 on norms and the embedding), global grad-norm clip 1.0, bf16 autocast with fp32
master weights.

Data: uniform random bytes, generated on the GPU each step (speed only; the loss is meaningless
beyond ln 256 = 8 bits) — or, with --data FILE (the quality race), real bytes: training windows
drawn uniformly from the file minus its last --window bytes, and held-out BPB on exactly those
last bytes cut into sequences the way kda's core/data.c does (sequence k has targets
[S-W+kT, S-W+kT+T), the last one clamped to end at S; every window byte counted once), so both
sides of the race are measured on the same bytes. Training time excludes evaluation.

Reported: parameter count N; time to the end of the first step (includes compilation); the
median step time over steps >= 50 (their indices printed); tokens/s = B*T / median;
MFU = (6*N + 12*L*d*T) * tokens/s / peak, where 6N counts every parameter (the tied embedding
is the lm-head GEMM) and 12*L*d*T is the attention-score and attention-value FLOPs per token
(forward + backward) without a causal discount (the PaLM / nanoGPT convention); the peak is
989e12 FLOP/s, the dense bf16 tensor rate of an H100/H200 SXM (datasheet);
peak memory = torch.cuda.max_memory_allocated().

  python3 benches/peers/gpt_peer.py --d 768 --layers 12 --heads 12 --batch 16 --seq 1024 \
      --steps 80 --mode compile
"""
import argparse
import math
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

PEAK_BF16 = 989e12


class Rope(nn.Module):
    def __init__(self, dh, seq, theta=10000.0):
        super().__init__()
        half = dh // 2
        inv = theta ** (-2.0 * torch.arange(half, dtype=torch.float64) / dh)
        ang = torch.arange(seq, dtype=torch.float64)[:, None] * inv[None, :]
        self.register_buffer("cos", ang.cos().float()[None, :, None, :], persistent=False)
        self.register_buffer("sin", ang.sin().float()[None, :, None, :], persistent=False)

    def forward(self, x):  # x [B,T,H,Dh]; rotate pairs (i, i + Dh/2)
        t = x.shape[1]
        half = x.shape[-1] // 2
        x0, x1 = x[..., :half].float(), x[..., half:].float()
        c, s = self.cos[:, :t], self.sin[:, :t]
        return torch.cat([x0 * c - x1 * s, x0 * s + x1 * c], dim=-1).to(x.dtype)


class Block(nn.Module):
    def __init__(self, d, heads, seq):
        super().__init__()
        self.h, self.dh = heads, d // heads
        self.n1, self.n2 = nn.RMSNorm(d, eps=1e-5), nn.RMSNorm(d, eps=1e-5)
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.proj = nn.Linear(d, d, bias=False)
        hid = (8 * d // 3 + 63) // 64 * 64
        self.up = nn.Linear(d, 2 * hid, bias=False)
        self.down = nn.Linear(hid, d, bias=False)
        self.rope = Rope(self.dh, seq)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.n1(x)).view(b, t, 3, self.h, self.dh).unbind(2)
        q, k = self.rope(q), self.rope(k)
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                           is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        a, g = self.up(self.n2(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(a) * g)


class GPT(nn.Module):
    def __init__(self, d, layers, heads, seq):
        super().__init__()
        self.emb = nn.Embedding(256, d)
        self.blocks = nn.ModuleList([Block(d, heads, seq) for _ in range(layers)])
        self.norm = nn.RMSNorm(d, eps=1e-5)
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)

    def logits(self, idx):
        x = self.emb(idx)
        for blk in self.blocks:
            x = blk(x)
        return F.linear(self.norm(x), self.emb.weight)

    def forward(self, idx, tgt):
        return F.cross_entropy(self.logits(idx).float().reshape(-1, 256), tgt.reshape(-1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--d", type=int, default=768)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=80)
    ap.add_argument("--mode", choices=["eager", "compile", "reduce-overhead"], default="compile")
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--data", help="train on this file's bytes and report held-out BPB (the quality race)")
    ap.add_argument("--window", type=int, default=1048576, help="held-out bytes at the end of --data")
    ap.add_argument("--tokens", type=float, default=150e6, help="race: training budget in bytes")
    ap.add_argument("--eval-every", type=int, default=500, help="race: steps between evaluations")
    args = ap.parse_args()
    if args.data:
        return race(args)
    assert args.steps > 50, "--steps must exceed 50: warm timings use steps >= 50"
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = True
    dev = torch.device("cuda")
    model = GPT(args.d, args.layers, args.heads, args.seq).to(dev)
    nparams = sum(p.numel() for p in model.parameters())
    decay = [p for p in model.parameters() if p.dim() == 2 and p is not model.emb.weight]
    no_decay = [p for p in model.parameters() if p.dim() != 2 or p is model.emb.weight]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8, fused=True)
    fwd = model
    if args.mode == "compile":
        fwd = torch.compile(model)
    elif args.mode == "reduce-overhead":
        fwd = torch.compile(model, mode="reduce-overhead")

    B, T = args.batch, args.seq
    times = []
    t_start = time.perf_counter()
    first = None
    for step in range(args.steps):
        data = torch.randint(0, 256, (B, T + 1), device=dev)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = fwd(data[:, :-1], data[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        if first is None:
            first = t1 - t_start
        times.append(t1 - t0)
        if step % 10 == 0 or step == args.steps - 1:
            print(f"step {step:4d} loss {loss.item() / math.log(2):.4f} bits  {1e3 * (t1 - t0):8.2f} ms",
                  flush=True)

    warm = times[50:]
    med = statistics.median(warm)
    tok_s = B * T / med
    flops_tok = 6 * nparams + 12 * args.layers * args.d * T
    mfu = flops_tok * tok_s / PEAK_BF16
    name = torch.cuda.get_device_name()
    print(f"# gpt_peer on {name}, torch {torch.__version__}, mode {args.mode}")
    print(f"config: d={args.d} layers={args.layers} heads={args.heads} batch={B} seq={T} "
          f"steps={args.steps} data=uniform random bytes")
    print(f"params: {nparams} ({nparams / 1e6:.2f} M)")
    print(f"time to first step: {first:.2f} s")
    print(f"warm median step: {1e3 * med:.2f} ms over steps {50}..{args.steps - 1} "
          f"(min {1e3 * min(warm):.2f}, max {1e3 * max(warm):.2f})")
    print(f"tokens/s: {tok_s:.0f}")
    print(f"MFU: {100 * mfu:.1f} % of {PEAK_BF16 / 1e12:.0f} TFLOP/s dense bf16 "
          f"(FLOPs/token = 6N + 12*L*d*T = {flops_tok:.4g})")
    print(f"peak memory: {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB (max_memory_allocated)")


@torch.no_grad()
def window_bpb(model, data, W, B, T):
    """Bits per byte over the last W bytes, every byte counted once (core/data.c's window)."""
    S = data.numel()
    bits, counted, k = 0.0, 0, 0
    nseq = (W + T - 1) // T
    while k < nseq:
        xs, ys, firsts = [], [], []
        for j in range(k, min(k + B, nseq)):
            s = min(S - W + j * T, S - T)
            xs.append(data[s - 1:s - 1 + T])
            ys.append(data[s:s + T])
            firsts.append((S - W + j * T) - s)  # targets before this index were counted already
        x, y = torch.stack(xs).long(), torch.stack(ys).long()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model.logits(x)
        nll = F.cross_entropy(logits.float().reshape(-1, 256), y.reshape(-1), reduction="none").view(len(xs), T)
        for r, f in enumerate(firsts):
            bits += nll[r, f:].sum().item() / math.log(2)
            counted += T - f
        k += len(xs)
    assert counted == W, (counted, W)
    return bits / counted


def race(args):
    """The quality race: train on real bytes for --tokens, evaluate the held-out window."""
    torch.manual_seed(0)
    dev = torch.device("cuda")
    raw = open(args.data, "rb").read()
    data = torch.frombuffer(bytearray(raw), dtype=torch.uint8).to(dev)
    S, W, B, T = data.numel(), args.window, args.batch, args.seq
    model = GPT(args.d, args.layers, args.heads, args.seq).to(dev)
    nparams = sum(p.numel() for p in model.parameters())
    decay = [p for p in model.parameters() if p.dim() == 2 and p is not model.emb.weight]
    no_decay = [p for p in model.parameters() if p.dim() != 2 or p is model.emb.weight]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8, fused=True)
    steps = int(args.tokens // (B * T))
    warm = min(100, steps // 10)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: (s + 1) / warm if s < warm else
                                              0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (s - warm) / max(1, steps - warm))))
    mode = {"eager": None, "compile": "default", "reduce-overhead": "reduce-overhead"}[args.mode]
    fwd = model if mode is None else torch.compile(model, mode=mode)
    gen = torch.Generator(device=dev).manual_seed(1)
    offs_hi = S - W - T - 1
    print(f"# gpt_peer race on {torch.cuda.get_device_name()}: {args.data} ({S} bytes, window {W}), "
          f"{nparams / 1e6:.2f}M params, batch {B}x{T}, {steps} steps, lr {args.lr} cosine, mode {args.mode}", flush=True)
    train_s = 0.0
    for step in range(steps):
        o = torch.randint(0, offs_hi, (B,), device=dev, generator=gen)
        idx = o[:, None] + torch.arange(T + 1, device=dev)[None, :]
        batch = data[idx].long()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = fwd(batch[:, :-1], batch[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        train_s += time.perf_counter() - t0
        if (step + 1) % args.eval_every == 0 or step == steps - 1:
            bpb = window_bpb(model, data, W, 64, T)
            print(f"race: step {step + 1} tokens {(step + 1) * B * T} train_seconds {train_s:.2f} bpb {bpb:.4f}", flush=True)


if __name__ == "__main__":
    main()
