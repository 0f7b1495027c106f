#!/usr/bin/env python3
"""Single-request prefill through cinfer's Python package and PyTorch's attention backends, side
by side: cinfer (single_prefill_with_kv_cache, the library's choice of kernel), SDPA with the cuDNN
backend and with the FlashAttention-2 backend, and FlexAttention (torch.compile'd; its compile
time is not timed), at bench_prefill's shapes: one request, 32 query / 8 KV heads (GQA), bf16,
S = qo_len = kv_len in {1k, 4k, 16k}, causal and not, D = --head-dim (128 by default; 192 is
D_qk / D_vo = 192 / 128, DeepSeek's prefill heads).

Each shape is timed in --rounds rounds, each round timing every implementation once (the order
rotating from round to round), and each figure is the median of its rounds. Under sustained load
the H200 lowers its SM clock for its power cap (nvidia-smi's clocks_event_reasons.active 0x4,
bench/RESULTS.md, developers' session 27), so a figure depends on what ran just before it;
rounds that alternate the implementations give each the same mix of clock states, and the
cinfer / cuDNN column compares them under it. As in bench_prefill, the short shapes are timed in
back-to-back groups of calls (20 at 1k, 4 at 4k, one at 16k) between one pair of events, so that
each call's host time (Python's argument handling and the launch) overlaps the kernel before it
rather than adding to the figure.

FLOPs = 4 * S^2 * Hq * D (2 * S^2 * Hq * (D_qk + D_vo) at 192 / 128), halved for causal (PERF.md),
as bench_prefill counts them. A round's
figure is the median of CUDA-event timings of --iters runs after warm-up (bench/peers.py's Timer:
the upper median for an even count), on random data. An implementation that refuses a shape
(e.g. cuDNN for some head dims) prints its error instead of a figure. Without PyTorch or a CUDA
device it says so and exits 0; without libcinfer.so ($CINFER_LIBRARY, else the source tree's
build/) the cinfer column is left out.

    python3 bench/peers_prefill.py [--head-dim 64|128|192|256] [--iters N] [--rounds N] [--no-flex]
"""
import argparse
import os
import sys

from peers import Timer  # bench/peers.py: the median of CUDA-event timings after warm-up

HQ, HK = 32, 8
LENS = (1024, 4096, 16384)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--head-dim", type=int, default=128, choices=(64, 128, 192, 256))
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3)
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
    if args.iters < 1 or args.rounds < 1:
        print("peers_prefill: --iters and --rounds must be >= 1")
        return 2
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
    try:
        import cinfer

        cinfer.library_path()
    except Exception as e:  # no libcinfer.so built or named
        print(f"peers_prefill: cinfer not loadable ({e}); its column is left out")
        cinfer = None
    flex = None
    if not args.no_flex:
        try:
            from torch.nn.attention.flex_attention import create_block_mask, flex_attention

            flex = torch.compile(flex_attention)
        except Exception as e:  # an older PyTorch
            print(f"peers_prefill: FlexAttention not available ({e})")
    d = args.head_dim
    dv = 128 if d == 192 else d  # v's and out's head dim
    timer = Timer(torch, args.iters)
    dims = f"{d} / {dv}" if dv != d else f"{d}"
    print(f"single prefill, {HQ}/{HK} heads, D = {dims}, bf16, {torch.cuda.get_device_name()}, "
          f"PyTorch {torch.__version__} (TFLOP/s; median of {args.rounds} alternating rounds of "
          f"{args.iters} timings each)\n")
    names = (["cinfer"] if cinfer else []) + ["SDPA cuDNN", "SDPA FA2"] + (
        ["FlexAttention"] if flex else [])
    ratio = cinfer is not None
    print("| S | causal | " + " | ".join(names) + (" | cinfer / cuDNN |" if ratio else " |"))
    print("|---|---|" + "---|" * (len(names) + ratio))
    gen = torch.Generator(device="cuda").manual_seed(1)
    for s in LENS:
        q = torch.randn(1, HQ, s, d, device="cuda", dtype=torch.bfloat16, generator=gen)
        k = torch.randn(1, HK, s, d, device="cuda", dtype=torch.bfloat16, generator=gen)
        v = torch.randn(1, HK, s, dv, device="cuda", dtype=torch.bfloat16, generator=gen)
        # SDPA's backends take GQA as repeated K/V heads (enable_gqa is not on every backend);
        # cinfer takes [S, heads, D] (NHD).
        kr, vr = k.repeat_interleave(HQ // HK, 1), v.repeat_interleave(HQ // HK, 1)
        qn, kn, vn = (x[0].transpose(0, 1).contiguous() for x in (q, k, v))
        for causal in (True, False):
            flops = 2.0 * s * s * HQ * (d + dv) / (2 if causal else 1)
            reps = 20 if s <= 1024 else 4 if s <= 4096 else 1
            mask = None
            if flex and causal:
                mask = create_block_mask(lambda b, h, qi, ki: qi >= ki, None, None, s, s)

            def sdpa(backend):
                def run():
                    with sdpa_kernel(backend):
                        F.scaled_dot_product_attention(q, kr, vr, is_causal=causal)
                return run

            fns = {"SDPA cuDNN": sdpa(SDPBackend.CUDNN_ATTENTION),
                   "SDPA FA2": sdpa(SDPBackend.FLASH_ATTENTION)}
            if cinfer:
                fns["cinfer"] = lambda: cinfer.single_prefill_with_kv_cache(qn, kn, vn,
                                                                            causal=causal)
            if flex:
                fns["FlexAttention"] = lambda: flex(q, k, v, block_mask=mask, enable_gqa=True)
            times = {n: [] for n in names}
            errors = {}
            for r in range(args.rounds):
                for i in range(len(names)):
                    n = names[(i + r) % len(names)]
                    if n in errors:
                        continue
                    try:
                        def group(fn=fns[n]):
                            for _ in range(reps):
                                fn()

                        times[n].append(timer(group, warmup=1) / reps)
                    except Exception as e:
                        errors[n] = f"({type(e).__name__})"
            tflops = {}
            for n in names:
                if n not in errors:
                    ts = sorted(times[n])
                    tflops[n] = flops / (ts[len(ts) // 2] * 1e-3) / 1e12
            row = [f"{tflops[n]:.1f}" if n in tflops else errors[n] for n in names]
            if ratio:
                ok = "cinfer" in tflops and "SDPA cuDNN" in tflops
                row.append(f"{tflops['cinfer'] / tflops['SDPA cuDNN']:.2f}x" if ok else "-")
            print(f"| {s} | {'yes' if causal else 'no'} | " + " | ".join(row) + " |", flush=True)
        del q, k, v, kr, vr, qn, kn, vn
    return 0


if __name__ == "__main__":
    sys.exit(main())
