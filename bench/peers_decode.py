"""Decode peers on the same GPU, in the same benchmark call as bench_decode: PyTorch SDPA
(cuDNN and FlashAttention-2 backends) on dense KV with the same heads and lengths.

Bytes counted = K and V read once, as in bench_decode. Times are medians of CUDA-event timings
after warm-up, as bench_decode takes them: runs queued back to back each between its own events,
and runs captured 16 or more to a CUDA graph (one pair of events per replay), rotating over several
KV copies so the 60 MB L2 never holds the next run's KV.
Prints Markdown rows; run: python3 bench/peers_decode.py
"""
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

HQ, HK, D = 32, 8, 128
ROTATE_BYTES = 256 << 20


def time_sdpa(backend, batch, length, iters=30):
    kv_bytes = 2 * batch * HK * length * D * 2
    copies = max(1, min(8, -(-ROTATE_BYTES // kv_bytes)))
    q = torch.randn(batch, HQ, 1, D, device="cuda", dtype=torch.bfloat16)
    ks = [torch.randn(batch, HK, length, D, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
    vs = [torch.randn(batch, HK, length, D, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
    # As bench_decode: runs queued back to back behind a hold (a sleep kernel of ~5 ms), each between
    # its own events, so the figures are GPU time without the host's launch latency.
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(iters + 5)]
    with sdpa_kernel(backend):
        torch.cuda._sleep(10_000_000)
        for i, (start, end) in enumerate(events):
            k, v = ks[i % copies], vs[i % copies]
            start.record()
            F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
            end.record()
        torch.cuda.synchronize()
    times = [s.elapsed_time(e) for s, e in events[5:]]
    times.sort()
    us = times[len(times) // 2] * 1e3
    # In a CUDA graph: as bench_decode's bench_time_graph, a multiple of the copies, at least 16.
    per_graph = copies * -(-16 // copies)
    graph_us = None
    try:
        with sdpa_kernel(backend):
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                F.scaled_dot_product_attention(q, ks[0], vs[0], enable_gqa=True)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for j in range(per_graph):
                    F.scaled_dot_product_attention(q, ks[j % copies], vs[j % copies],
                                                   enable_gqa=True)
        replays = []
        for i in range(iters + 3):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            if i >= 3:
                replays.append(start.elapsed_time(end) / per_graph)
        replays.sort()
        graph_us = replays[len(replays) // 2] * 1e3
    except RuntimeError:  # a backend that cannot be captured
        pass
    graph_tbps = kv_bytes / (graph_us * 1e-6) / 1e12 if graph_us else None
    return us, kv_bytes / (us * 1e-6) / 1e12, graph_us, graph_tbps


def main():
    print("| peer | batch | kv_len | time (us) | TB/s | graph (us) | TB/s |")
    print("|---|---|---|---|---|---|---|")
    for batch, length in [(1, 8192), (1, 32768), (16, 4096), (64, 1024), (64, 4096), (128, 2048),
                          (256, 1024)]:
        for name, backend in [("SDPA cuDNN", SDPBackend.CUDNN_ATTENTION),
                              ("SDPA FlashAttention-2", SDPBackend.FLASH_ATTENTION)]:
            try:
                us, tbps, graph_us, graph_tbps = time_sdpa(backend, batch, length)
                graph = f"{graph_us:.1f} | {graph_tbps:.2f}" if graph_us else "n/a | n/a"
                print(f"| {name} | {batch} | {length} | {us:.1f} | {tbps:.2f} | {graph} |",
                      flush=True)
            except RuntimeError as e:  # a backend that refuses the shape
                print(f"| {name} | {batch} | {length} | n/a | {str(e).splitlines()[0][:60]} "
                      "| n/a | n/a |")
            torch.cuda.empty_cache()


if __name__ == "__main__":
    sys.exit(main())
