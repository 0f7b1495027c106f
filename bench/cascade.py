#!/usr/bin/env python3
"""Cascade attention benchmark (issue 6): one decode step of 64 requests that share an 8k-token
prefix and own 256 tokens each, as plain batch decode over each request's whole page table
versus cinfer.MultiLevelCascadeAttentionWrapper (level 0: the prefix, read once for all 64
query rows, batch prefill; level 1: each request's own tokens, batch decode, in CUDA graph mode
too; one merge_states of the two levels).

Plain decode reads the prefix once per request, so the KV bytes it moves are
batch * (prefix + own) against prefix + batch * own for the cascade; the ratio is the most the
cascade can save (the printed "KV read ratio"). The measured speedup also pays for the prefix
level's prefill (64 query rows over 8k keys, the 4 query heads of each KV head packed into 256
rows: on an H200 the sm90 kernel's two 128-row tiles x 8 KV heads x split-KV in 8 chunks of 1024
keys = 128 CTAs, one per SM, then their merge), which is compute: 4 * 64 * 32 * 8192 * 128 = 8.6
GFLOP (the floor line below); and plain decode finds much of the shared prefix in the L2 (its
queued GB/s exceed the copy ceiling: 8.6 TB/s on the H200, 2026-11-30).

    python3 bench/cascade.py [--batch 64] [--prefix 8192] [--own 256] [--iters 50] [--caches 4]
                             [--timeline]

Each path is timed three ways, the cascade also per level (medians of CUDA-event timings after
warm-up):

- per call: one run between two events, then a synchronize, so the host work of the call
  (the Python wrapper between its launches) shows as GPU idle time;
- queued: the runs enqueued back to back behind a hold kernel, each between its own events
  (bench_decode's and peers_decode.py's method), so the figure is GPU time plus the GPU's own
  gaps between launches, as a CUDA graph replay would see; the host's enqueue time per run is
  printed beside it;
- per level (queued): each level's launches alone, and the merge of the levels alone, with the
  level's kind (batch prefill, batch decode, or "packed": prefill over GQA-packed rows);
- graph: a CUDA graph (wrappers in use_cuda_graph mode) of one run per cache, its replays
  queued behind a hold, divided by the runs it holds.

The floor line bounds what any cascade can do on this GPU: the prefix level's FLOPs at the fp16
GEMM ceiling (or its prefix bytes at the copy ceiling, if longer) and the own level's KV bytes at
the copy ceiling, both ceilings measured here with PyTorch (an 8192^3 torch.mm; a 1 GiB copy,
read+write bytes), summed (the levels one after the other, as they run: each fills the SMs) and
overlapped (the larger); with the speedup over plain decode's graph step each allows.

--timeline also prints the kernels of one step of the cascade's graph with their start and end
(torch.profiler over three replays; microseconds from the step's first kernel): which kernels run
beside which, and the gaps between them.

The runs rotate over --caches copies of the paged cache (the layers of a model), so that no run
finds the previous run's KV in the 60 MB L2 (--caches 1: the same cache every run, as this script
did before). Prints the configuration, each path's three times, the three speedups, the KV read
ratio, the floor and the largest difference between the paths' outputs (eager and graph).
Without PyTorch, a CUDA device or libcinfer.so ($CINFER_LIBRARY, else the source tree's build/)
it says so and exits 0; exits 1 when the outputs differ by 1e-2 or more, 2 on bad arguments.
Runs in a few seconds on an H200 once the kernels are compiled (first run: JIT).
"""

import argparse
import math
import os
import statistics
import sys
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))

# torch.cuda._sleep cycles of the first hold (about 10 ms at the H200's ~2 GHz); doubled while
# the host has not enqueued every timed run before the hold ends.
HOLD_CYCLES = 20_000_000
WARMUP = 5


def ceilings(torch, dev):
    """(copy TB/s of read+write bytes, fp16 GEMM TFLOP/s) of this GPU: medians of CUDA-event
    timings of a 1 GiB device-to-device copy and an 8192^3 torch.mm."""

    def median_s(fn, reps=10):
        for _ in range(3):
            fn()
        times = []
        for _ in range(reps):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) / 1e3)
        return statistics.median(times)

    src = torch.empty(1 << 29, dtype=torch.float16, device=dev)
    dst = torch.empty_like(src)
    copy = 2 * src.numel() * src.element_size() / median_s(lambda: dst.copy_(src)) / 1e12
    del src, dst
    n = 8192
    a = torch.randn(n, n, dtype=torch.float16, device=dev)
    gemm = 2 * n**3 / median_s(lambda: torch.mm(a, a)) / 1e12
    return copy, gemm


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
    ap.add_argument("--caches", type=int, default=4,
                    help="copies of the paged cache the runs rotate over (layers)")
    ap.add_argument("--timeline", action="store_true",
                    help="also print the kernels of one cascade graph step (torch.profiler)")
    args = ap.parse_args()
    if args.iters < 1 or args.caches < 1:
        print("bench/cascade.py: --iters and --caches must be >= 1")
        return 2

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
    prefix_last = args.prefix - (prefix_pages - 1) * ps
    own_last = args.own - (own_pages - 1) * ps
    if prefix_last != ps:
        print("bench/cascade.py: --prefix must be a multiple of --page-size (the plain page "
              "table continues the prefix's last page with the request's own pages)")
        return 2
    caches = [torch.randn(num_pages, 2, ps, hk, d, device=dev, dtype=dtype)
              for _ in range(args.caches)]
    q = torch.randn(batch, hq, d, device=dev, dtype=dtype)

    def i32(x, device="cpu"):
        return torch.tensor(x, dtype=torch.int32, device=device)

    own = [list(range(prefix_pages + b * own_pages, prefix_pages + (b + 1) * own_pages))
           for b in range(batch)]
    # Plain: each request's table is the prefix's pages followed by its own.
    plain_indices = [p for b in range(batch) for p in list(range(prefix_pages)) + own[b]]
    plain_indptr = [b * (prefix_pages + own_pages) for b in range(batch + 1)]
    plain_last = [own_last] * batch
    # Cascade: level 0 is one group of every row over the prefix, level 1 a group per request.
    levels = (
        [i32([0, batch]), i32(list(range(batch + 1)))],
        [i32([0, prefix_pages]), i32([b * own_pages for b in range(batch + 1)])],
        [i32(list(range(prefix_pages))), i32([p for o in own for p in o])],
        [i32([prefix_last]), i32([own_last] * batch)],
    )

    def plain_wrapper(graph: bool):
        ws = torch.empty(256 << 20, dtype=torch.uint8, device=dev)
        if graph:
            w = cinfer.BatchDecodeWithPagedKVCacheWrapper(
                ws, "NHD", use_cuda_graph=True,
                paged_kv_indptr_buffer=i32(plain_indptr, dev),
                paged_kv_indices_buffer=i32(plain_indices, dev),
                paged_kv_last_page_len_buffer=i32(plain_last, dev))
        else:
            w = cinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD")
        w.plan(i32(plain_indptr), i32(plain_indices), i32(plain_last), hq, hk, d, ps,
               q_data_type=dtype)
        return w

    def cascade_wrapper(graph: bool):
        ws = torch.empty(256 << 20, dtype=torch.uint8, device=dev)
        if graph:
            bufs = [[t.to(dev) for t in arr] for arr in levels]
            w = cinfer.MultiLevelCascadeAttentionWrapper(
                2, ws, "NHD", use_cuda_graph=True, qo_indptr_buf_arr=bufs[0],
                paged_kv_indptr_buf_arr=bufs[1], paged_kv_indices_buf_arr=bufs[2],
                paged_kv_last_page_len_buf_arr=bufs[3])
        else:
            w = cinfer.MultiLevelCascadeAttentionWrapper(2, ws, "NHD")
        w.plan(*levels, hq, hk, d, ps, causal=True, q_data_type=dtype)
        return w

    def per_call(run):
        for i in range(WARMUP):  # warm-up (and JIT on the first call of a fresh cache)
            run(i)
        torch.cuda.synchronize()
        times = []
        for i in range(args.iters):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            run(i)
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) * 1e3)  # microseconds
        return statistics.median(times)

    def queued(run):
        """(median GPU us per run, host enqueue us per run) with the runs queued behind a
        hold, each between its own events."""
        for i in range(WARMUP):
            run(i)
        torch.cuda.synchronize()
        cycles = HOLD_CYCLES
        for _ in range(6):
            events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                      for _ in range(args.iters)]
            held = torch.cuda.Event()
            torch.cuda._sleep(cycles)
            held.record()
            t0 = time.perf_counter()
            for i, (a, b) in enumerate(events):
                a.record()
                run(i)
                b.record()
            host = (time.perf_counter() - t0) / args.iters * 1e6
            short = held.query()  # the hold ended before the last run was enqueued
            torch.cuda.synchronize()
            if not short:
                times = [a.elapsed_time(b) * 1e3 for a, b in events]
                return statistics.median(times), host
            cycles *= 2
        raise RuntimeError("the hold kernel never outlasted the enqueueing of the runs")

    def graph_time(run):
        """(median GPU us per run of CUDA-graph replays queued behind a hold, the runs' outputs,
        the graph); one graph holds one run per cache."""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up on the capture's side stream, as PyTorch asks
            for i in range(WARMUP):
                run(i)
        torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            outs = [run(i) for i in range(args.caches)]
        replay_us, _ = queued(lambda i: g.replay())
        return replay_us / args.caches, outs, g

    def print_timeline(g):
        """The kernels of one step in graph g (its second replay's first run) as profiled."""
        from torch.profiler import ProfilerActivity, profile
        replays = 3
        for _ in range(replays):
            g.replay()
        torch.cuda.synchronize()
        with warnings.catch_warnings():  # (torch.profiler's note on clearing events per cycle)
            warnings.simplefilter("ignore")
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(replays):
                    g.replay()
                torch.cuda.synchronize()
        kernels = sorted((e.time_range.start, e.time_range.end, e.name) for e in prof.events()
                         if e.device_type == torch.autograd.DeviceType.CUDA)
        per_replay = len(kernels) // replays
        per_step = per_replay // args.caches
        if per_step < 1 or per_replay * replays != len(kernels):
            print(f"  timeline: {len(kernels)} kernels in {replays} replays, not a whole number "
                  "per step; skipped")
            return
        step = kernels[per_replay:per_replay + per_step]
        first = step[0][0]
        print("  cascade graph step, kernel by kernel (us from its first kernel's start; "
              "torch.profiler):")
        for start, end, name in step:
            print(f"    {start - first:7.2f} .. {end - first:7.2f}  {name}")

    plain = plain_wrapper(graph=False)
    cascade = cascade_wrapper(graph=False)
    out_plain = plain.run(q, caches[0])
    out_cascade = cascade.run(q, caches[0])
    torch.cuda.synchronize()
    diff = (out_plain.float() - out_cascade.float()).abs().max().item()

    def plain_run(i):
        return plain.run(q, caches[i % args.caches])

    def cascade_run(i):
        return cascade.run(q, caches[i % args.caches])

    t_plain = per_call(plain_run)
    t_cascade = per_call(cascade_run)
    q_plain, host_plain = queued(plain_run)
    q_cascade, host_cascade = queued(cascade_run)
    # Each level alone and the merge alone (queued): the launch bound at plan (the wrapper's
    # internals, timing only) with the other levels' launches, or the merge, replaced by no-ops.
    launch = cascade._launch
    all_levels, merge_fn = launch.levels, launch.merge_fn

    class Skip:
        rows = None  # as a level that takes the run's q whole

        def launch(self, *args):
            pass

    q_levels = []
    try:
        for i in range(len(all_levels) + 1):
            launch.levels = [lvl if j == i else Skip() for j, lvl in enumerate(all_levels)]
            launch.merge_fn = merge_fn if i == len(all_levels) else (lambda *args: 0)
            q_levels.append(queued(cascade_run)[0])
    finally:
        launch.levels, launch.merge_fn = all_levels, merge_fn
    kinds = [lvl.kind for lvl in all_levels]

    plain_g = plain_wrapper(graph=True)
    cascade_g = cascade_wrapper(graph=True)
    g_plain, outs_plain, _ = graph_time(lambda i: plain_g.run(q, caches[i % args.caches]))
    g_cascade, outs_cascade, cascade_graph = graph_time(
        lambda i: cascade_g.run(q, caches[i % args.caches]))
    torch.cuda.synchronize()
    # The graphs' first runs read cache 0, as the eager outputs did.
    diff_graph = max((outs[0].float() - out_plain.float()).abs().max().item()
                     for outs in (outs_plain, outs_cascade))

    kv_row = 2 * hk * d * caches[0].element_size()  # bytes of K and V per token
    plain_bytes = batch * (args.prefix + args.own) * kv_row
    cascade_bytes = (args.prefix + batch * args.own) * kv_row
    print(f"cascade decode step: batch {batch}, shared prefix {args.prefix}, own {args.own} "
          f"tokens, heads {hq}/{hk}, head_dim {d}, page {ps}, fp16, {args.caches} cache(s), "
          f"{torch.cuda.get_device_name()}")
    print(f"  {'':18}   {'per call':>9} {'queued':>9} {'graph':>9}   (us per step)")
    for name, t, tq, tg, host, nbytes in (
            ("plain batch decode", t_plain, q_plain, g_plain, host_plain, plain_bytes),
            ("cascade (2 levels)", t_cascade, q_cascade, g_cascade, host_cascade,
             cascade_bytes)):
        print(f"  {name} : {t:9.1f} {tq:9.1f} {tg:9.1f}   host enqueue {host:6.1f} us/call; "
              f"queued {nbytes / tq / 1e3:7.1f} GB/s of {nbytes / 2**20:.0f} MiB KV")
    print(f"  speedup            : {t_plain / t_cascade:8.2f}x {q_plain / q_cascade:8.2f}x "
          f"{g_plain / g_cascade:8.2f}x")
    print("  cascade per level  : " + ", ".join(
        f"level {i} ({k}) {t:.1f} us" for i, (k, t) in enumerate(zip(kinds, q_levels))) +
        f", merge {q_levels[-1]:.1f} us (queued, each alone)")
    copy_tbs, gemm_tflops = ceilings(torch, dev)
    level0_flops = 4 * batch * hq * args.prefix * d
    t0 = max(level0_flops / gemm_tflops, args.prefix * kv_row / copy_tbs) / 1e6  # us
    t1 = batch * args.own * kv_row / copy_tbs / 1e6
    print(f"  floor {t0 + t1:.1f} us serial, {max(t0, t1):.1f} us overlapped: level 0 {t0:.1f} us "
          f"({level0_flops / 1e9:.1f} GFLOP at the fp16 GEMM ceiling, {gemm_tflops:.0f} TFLOP/s), "
          f"level 1 {t1:.1f} us ({batch * args.own * kv_row / 2**20:.0f} MiB at the copy ceiling, "
          f"{copy_tbs:.2f} TB/s); speedup bounds {g_plain / (t0 + t1):.1f}x / "
          f"{g_plain / max(t0, t1):.1f}x over plain's graph step (the cascade's: "
          f"{g_plain / g_cascade:.2f}x, {100 * (t0 + t1) / g_cascade:.0f}% of the serial floor's "
          "speed)")
    print(f"  KV read ratio {plain_bytes / cascade_bytes:.1f}x (the most the cascade can save); "
          f"max |plain - cascade| = {diff:.2e} eager, {diff_graph:.2e} graph")
    if args.timeline:
        print_timeline(cascade_graph)
    print(f"  wall {time.perf_counter() - t_start:.1f} s (JIT included on a cold cache)")
    return 0 if max(diff, diff_graph) < 1e-2 else 1


if __name__ == "__main__":
    sys.exit(main())
