#!/usr/bin/env python3
"""gpt_peer.py — the PyTorch peer for kda's speed benchmarks: a GPT-style byte-level model.

Model: vocab 256, tied input/output embedding, pre-norm blocks of
  RMSNorm -> fused qkv Linear -> RoPE (pairs (i, i+Dh/2), theta 10000) -> SDPA causal -> Linear
  RMSNorm -> SwiGLU MLP (hidden = 8d/3 rounded up to a multiple of 64) ,
final RMSNorm, no biases. AdamW (fused=True, lr 3e-4, betas 0.9/0.95, eps 1e-8, wd 0.1 on
matrices, 0 on norms and the embedding), global grad-norm clip 1.0, bf16 autocast with fp32
master weights.

Data: uniform random bytes, generated on the GPU each step (speed only; the loss is meaningless
beyond ln 256 = 8 bits).

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

    def forward(self, idx, tgt):
        x = self.emb(idx)
        for blk in self.blocks:
            x = blk(x)
        logits = F.linear(self.norm(x), self.emb.weight)
        return F.cross_entropy(logits.float().reshape(-1, 256), tgt.reshape(-1))


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
    args = ap.parse_args()
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


if __name__ == "__main__":
    main()
