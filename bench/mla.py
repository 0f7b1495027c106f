#!/usr/bin/env python3
"""MLA decode benchmark: cinfer.BatchMLAPagedAttentionWrapper on DeepSeek-V3's latent cache
(512 ckv + 64 kpe per token, bf16, page 64), one query row per request, H = 16 (tensor parallel
8) and 128 heads, uniform KV lengths. Reports the latent-cache bytes read per second (batch x
kv_len x 576 x 2 bytes) and their ratio to the copy ceiling measured in the same run (a 1 GiB
device copy, read+write bytes), and the tensor-core FLOP/s (2 x heads x kv_len x (576 + 512)
per request: Q K^T over 576 dims, P V over 512).

    python3 bench/mla.py [--iters 50] [--cases 64:4096:16,...]

Times are medians of CUDA-event timings of back-to-back runs after warm-up, queued behind a
~30 ms sleep kernel so that the GPU, not the Python calls, sets their pace; several copies of the
cache rotate so the reads come from HBM, not L2.
"""
import argparse
import math
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import cinfer  # noqa: E402

CKV, KPE = 512, 64


def copy_ceiling() -> float:
    n = 1 << 29  # 1 GiB of bf16
    a = torch.empty(n, dtype=torch.bfloat16, device="cuda")
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    times = []
    for _ in range(10):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        b.copy_(a)
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) * 1e-3)
    return 2 * a.numel() * 2 / statistics.median(times)


def bench_case(batch: int, kv_len: int, heads: int, iters: int, ws) -> tuple:
    page = 64
    pages_per = math.ceil(kv_len / page)
    num_pages = batch * pages_per
    caches = max(1, min(4, int(2e9 // (num_pages * page * (CKV + KPE) * 2))))
    g = torch.Generator("cuda").manual_seed(0)
    ckvs = [torch.randn(num_pages, page, CKV, generator=g, device="cuda").bfloat16()
            for _ in range(caches)]
    kpes = [torch.randn(num_pages, page, KPE, generator=g, device="cuda").bfloat16()
            for _ in range(caches)]
    q_nope = torch.randn(batch, heads, CKV, device="cuda").bfloat16()
    q_pe = torch.randn(batch, heads, KPE, device="cuda").bfloat16()
    out = torch.empty_like(q_nope)
    qo_indptr = torch.arange(batch + 1, dtype=torch.int32)
    kv_indptr = torch.arange(batch + 1, dtype=torch.int32) * pages_per
    indices = torch.randperm(num_pages, dtype=torch.int32)
    kv_lens = torch.full((batch,), kv_len, dtype=torch.int32)
    w = cinfer.BatchMLAPagedAttentionWrapper(ws)
    w.plan(qo_indptr, kv_indptr, indices, kv_lens, heads, CKV, KPE, page, False,
           1.0 / math.sqrt(192), torch.bfloat16, torch.bfloat16)
    for i in range(5):
        w.run(q_nope, q_pe, ckvs[i % caches], kpes[i % caches], out=out)
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(iters)]
    torch.cuda.synchronize()
    torch.cuda._sleep(60_000_000)  # ~30 ms: the host queues every timed run meanwhile
    for i, (s, e) in enumerate(events):
        s.record()
        w.run(q_nope, q_pe, ckvs[i % caches], kpes[i % caches], out=out)
        e.record()
    torch.cuda.synchronize()
    t = statistics.median(s.elapsed_time(e) * 1e-3 for s, e in events)
    bytes_read = batch * kv_len * (CKV + KPE) * 2
    flops = 2 * batch * heads * kv_len * (CKV + KPE + CKV)
    return t, bytes_read / t, flops / t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--cases", default="1:32768:16,64:4096:16,128:2048:16,512:1024:16,"
                                        "64:4096:128,128:1024:128")
    args = ap.parse_args()
    ws = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    ceiling = copy_ceiling()
    print(f"copy ceiling {ceiling / 1e12:.2f} TB/s ({torch.cuda.get_device_name()})")
    print("| batch | kv_len | heads | us | TB/s | of ceiling | TFLOP/s |")
    print("|---|---|---|---|---|---|---|")
    for case in args.cases.split(","):
        batch, kv_len, heads = (int(x) for x in case.split(":"))
        t, bw, fl = bench_case(batch, kv_len, heads, args.iters, ws)
        print(f"| {batch} | {kv_len} | {heads} | {t * 1e6:.1f} | {bw / 1e12:.2f} | "
              f"{100 * bw / ceiling:.0f}% | {fl / 1e12:.0f} |")


if __name__ == "__main__":
    main()
