#!/usr/bin/env python3
"""Cascade attention benchmark (issue 6): one decode step of 64 requests that share an 8k-token
prefix and own 256 tokens each, as plain batch decode over each request's whole page table
versus cinfer.MultiLevelCascadeAttentionWrapper (level 0: the prefix, read once for all 64
query rows; level 1: each request's own tokens; merged with merge_state_in_place).

Plain decode reads the prefix once per request, so the KV bytes it moves are
batch * (prefix + own) against prefix + batch * own for the cascade; the ratio is the most the
cascade can save (the printed "KV read ratio"). The measured speedup also pays for the prefix
level's prefill (64 query rows over 8k keys, split-KV: 8 chunks of 1024 keys x 32 heads = 256 CTAs
on an H200, then their merge) and the merge of the levels.

    python3 bench/cascade.py [--batch 64] [--prefix 8192] [--own 256] [--iters 50]

Prints the configuration, each path's median time per step (CUDA events), the speedup and the
largest difference between the two outputs. Without PyTorch, a CUDA device or libcinfer.so
($CINFER_LIBRARY, else the source tree's build/) it says so and exits 0. Runs in a few seconds on an H200 once the kernels are compiled (first run: JIT).
"""

import argparse
import math
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--prefix", type=int, default=8192, help="shared prefix tokens")
    ap.add_argument("--own", type=int, default=256, help="tokens each request owns")
    ap.add_argument("--num-qo-heads", type=int, default=32)
    ap.add_argument("--num-kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--page-size", type=int, default=16)
    ap.add_argument("--iters", type=int, default=50)
    args = ap.parse_args()

    try:
        import torch
    except ImportError:
        print("bench/cascade.py: PyTorch is not installed; skipped")
        return 0
    if not torch.cuda.is_available():
        print("bench/cascade.py: no CUDA device; skipped")
        return 0
    import cinfer

    try:
        cinfer.library_path()
    except cinfer.CinferError as e:
        print(f"bench/cascade.py: {e}; skipped")
        return 0
    t_start = time.perf_counter()
    dev = "cuda"
    batch, ps = args.batch, args.page_size
    hq, hk, d = args.num_qo_heads, args.num_kv_heads, args.head_dim
    dtype = torch.float16
    prefix_pages = math.ceil(args.prefix / ps)
    own_pages = math.ceil(args.own / ps)
    num_pages = prefix_pages + batch * own_pages
    cache = torch.randn(num_pages, 2, ps, hk, d, device=dev, dtype=dtype)
    q = torch.randn(batch, hq, d, device=dev, dtype=dtype)
    prefix_last = args.prefix - (prefix_pages - 1) * ps
    own_last = args.own - (own_pages - 1) * ps
    if prefix_last != ps:
        print("bench/cascade.py: --prefix must be a multiple of --page-size (the plain page "
              "table continues the prefix's last page with the request's own pages)")
        return 2

    def i32(x):
        return torch.tensor(x, dtype=torch.int32)

    own = [list(range(prefix_pages + b * own_pages, prefix_pages + (b + 1) * own_pages))
           for b in range(batch)]
    # Plain: each request's table is the prefix's pages followed by its own.
    plain_indices = [p for b in range(batch) for p in list(range(prefix_pages)) + own[b]]
    plain_indptr = [b * (prefix_pages + own_pages) for b in range(batch + 1)]
    ws_plain = torch.empty(256 << 20, dtype=torch.uint8, device=dev)
    plain = cinfer.BatchDecodeWithPagedKVCacheWrapper(ws_plain, "NHD")
    plain.plan(i32(plain_indptr), i32(plain_indices), i32([own_last] * batch), hq, hk, d, ps,
               q_data_type=dtype)

    ws_cascade = torch.empty(256 << 20, dtype=torch.uint8, device=dev)
    cascade = cinfer.MultiLevelCascadeAttentionWrapper(2, ws_cascade, "NHD")
    cascade.plan(
        [i32([0, batch]), i32(list(range(batch + 1)))],
        [i32([0, prefix_pages]), i32([b * own_pages for b in range(batch + 1)])],
        [i32(list(range(prefix_pages))), i32([p for o in own for p in o])],
        [i32([prefix_last]), i32([own_last] * batch)],
        hq, hk, d, ps, causal=True, q_data_type=dtype)

    def timed(fn):
        for _ in range(5):  # warm-up (and JIT on the first call of a fresh cache)
            fn()
        torch.cuda.synchronize()
        times = []
        for _ in range(args.iters):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) * 1e3)  # microseconds
        return statistics.median(times)

    out_plain = plain.run(q, cache)
    out_cascade = cascade.run(q, cache)
    torch.cuda.synchronize()
    diff = (out_plain.float() - out_cascade.float()).abs().max().item()
    t_plain = timed(lambda: plain.run(q, cache))
    t_cascade = timed(lambda: cascade.run(q, cache))

    kv_row = 2 * hk * d * cache.element_size()  # bytes of K and V per token
    plain_bytes = batch * (args.prefix + args.own) * kv_row
    cascade_bytes = (args.prefix + batch * args.own) * kv_row
    print(f"cascade decode step: batch {batch}, shared prefix {args.prefix}, own {args.own} "
          f"tokens, heads {hq}/{hk}, head_dim {d}, page {ps}, fp16, "
          f"{torch.cuda.get_device_name()}")
    print(f"  plain batch decode : {t_plain:9.1f} us  ({plain_bytes / t_plain / 1e3:7.1f} GB/s "
          f"of {plain_bytes / 2**20:.0f} MiB KV)")
    print(f"  cascade (2 levels) : {t_cascade:9.1f} us  ({cascade_bytes / t_cascade / 1e3:7.1f} "
          f"GB/s of {cascade_bytes / 2**20:.0f} MiB KV)")
    print(f"  speedup {t_plain / t_cascade:.2f}x; KV read ratio {plain_bytes / cascade_bytes:.1f}x "
          f"(the most the cascade can save); max |plain - cascade| = {diff:.2e}")
    print(f"  wall {time.perf_counter() - t_start:.1f} s (JIT included on a cold cache)")
    return 0 if diff < 1e-2 else 1


if __name__ == "__main__":
    sys.exit(main())
