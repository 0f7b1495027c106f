#!/usr/bin/env python3
"""Single-request prefill through PyTorch's attention backends, to set beside bench_prefill's
table in the same run: SDPA with the cuDNN backend and with the FlashAttention-2 backend, and
FlexAttention (torch.compile'd; its compile time is not timed), at bench_prefill's shapes: one
request, 32 query / 8 KV heads (GQA), bf16, S = qo_len = kv_len in {1k, 4k, 16k}, causal and not,
D = --head-dim (128 by default).

FLOPs = 4 * S^2 * Hq * D, halved for causal (PERF.md), as bench_prefill counts them. Each figure
is the median of CUDA-event timings of --iters runs after warm-up (bench/peers.py's Timer: the
upper median for an even count), on random data. A backend that refuses a shape (e.g. cuDNN for
some head dims) prints its error instead of a figure. Without PyTorch or a CUDA device it says so
and exits 0.

    python3 bench/peers_prefill.py [--head-dim 64|128|256] [--iters N] [--no-flex]
"""
import argparse
import sys

from peers import Timer  # bench/peers.py: the median of CUDA-event timings after warm-up

HQ, HK = 32, 8
LENS = (1024, 4096, 16384)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--head-dim", type=int, default=128, choices=(64, 128, 256))
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--no-flex", action="store_true", help="skip FlexAttention")
    args = ap.parse_args()
    try:
        import torch
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError as e:
        print(f"peers_prefill: PyTorch not importable ({e}); nothing timed")
        return 0
    if not torch.cuda.is_available():
        print("peers_prefill: no CUDA device; nothing timed")
        return 0
    flex = None
    if not args.no_flex:
        try:
            from torch.nn.attention.flex_attention import create_block_mask, flex_attention

            flex = torch.compile(flex_attention)
        except Exception as e:  # an older PyTorch
            print(f"peers_prefill: FlexAttention not available ({e})")
    d = args.head_dim
    timer = Timer(torch, args.iters)
    print(f"single prefill through PyTorch {torch.__version__}, {HQ}/{HK} heads, D = {d}, bf16, "
          f"{torch.cuda.get_device_name()} (TFLOP/s; median of {args.iters} runs)\n")
    cols = ["SDPA cuDNN", "SDPA FA2"] + (["FlexAttention"] if flex else [])
    print("| S | causal | " + " | ".join(cols) + " |")
    print("|---|---|" + "---|" * len(cols))
    gen = torch.Generator(device="cuda").manual_seed(1)
    for s in LENS:
        q = torch.randn(1, HQ, s, d, device="cuda", dtype=torch.bfloat16, generator=gen)
        k = torch.randn(1, HK, s, d, device="cuda", dtype=torch.bfloat16, generator=gen)
        v = torch.randn(1, HK, s, d, device="cuda", dtype=torch.bfloat16, generator=gen)
        # SDPA's backends take GQA as repeated K/V heads (enable_gqa is not on every backend).
        kr, vr = k.repeat_interleave(HQ // HK, 1), v.repeat_interleave(HQ // HK, 1)
        for causal in (True, False):
            flops = 4.0 * s * s * HQ * d / (2 if causal else 1)
            row = []
            for backend in (SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION):
                try:
                    with sdpa_kernel(backend):
                        ms = timer(
                            lambda: F.scaled_dot_product_attention(q, kr, vr, is_causal=causal),
                            warmup=3)
                    row.append(f"{flops / (ms * 1e-3) / 1e12:.1f}")
                except Exception as e:
                    row.append(f"({type(e).__name__})")
            if flex:
                try:
                    mask = None
                    if causal:
                        mask = create_block_mask(lambda b, h, qi, ki: qi >= ki, None, None, s, s)
                    ms = timer(lambda: flex(q, k, v, block_mask=mask, enable_gqa=True), warmup=3)
                    row.append(f"{flops / (ms * 1e-3) / 1e12:.1f}")
                except Exception as e:
                    row.append(f"({type(e).__name__})")
            print(f"| {s} | {'yes' if causal else 'no'} | " + " | ".join(row) + " |", flush=True)
        del q, k, v, kr, vr
    return 0


if __name__ == "__main__":
    sys.exit(main())
