/*
 * What the benchmark programs share: checked driver and library calls (a benchmark exits on the
 * first failure, with the library's message), a seeded generator, random device data and DLTensor
 * views. Each benchmark program includes this once and sets bench_name first thing in main.
 */
#ifndef CINFER_BENCH_COMMON_H
#define CINFER_BENCH_COMMON_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cinfer.h"
#include "cuda/context.h"

static const cinfer__cuda_t *cu;
static const char *bench_name = "bench";

/* A driver call through the loaded table; exits with the driver's message on failure. */
#define CU(call)                                                                                   \
    do {                                                                                           \
        CUresult r_ = cu->call;                                                                    \
        if (r_ != CUDA_SUCCESS) {                                                                  \
            cinfer__cu_error(r_, #call);                                                           \
            fprintf(stderr, "%s: %s\n", bench_name, cinfer_last_error());                          \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

/* A cinfer call; exits with the status and message on failure. */
#define CI(call)                                                                                   \
    do {                                                                                           \
        cinfer_status_t s_ = (call);                                                               \
        if (s_ != CINFER_STATUS_SUCCESS) {                                                         \
            fprintf(stderr, "%s: %s: %s: %s\n", bench_name, #call, cinfer_status_name(s_),         \
                    cinfer_last_error());                                                          \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

/* Loads the driver (into cu); without one (no GPU), says that the benchmark needs a GPU and
 * exits 1. */
static void bench_load_driver(void) {
    if (cinfer__cuda_get(&cu) != CINFER_STATUS_SUCCESS) {
        fprintf(stderr, "%s: needs an NVIDIA GPU and its driver: %s\n", bench_name,
                cinfer_last_error());
        exit(1);
    }
}

/* splitmix64 with a fixed seed, so every run draws the same data and batches. */
static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rng_next(void) {
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/*
 * GPU time of each of `warmup + iters` queued runs, as a CUDA graph replay or an engine's queued
 * step sees it (the host's argument checks and launch latency left out, which a run of a few
 * microseconds would otherwise be dominated by): a 4 GiB memset (about a millisecond) holds the
 * stream while the host queues every run between its own pair of events. run(arg, i) queues run i
 * (i < 0: warm-up). times_ms gets the `iters` timed runs. Warns when the host fell behind (the
 * hold ended before the last run was queued), since then launch gaps are counted.
 */
#define BENCH_HOLD_BYTES (4ull << 30)
static inline void bench_time_queued(CUstream stream, int warmup, int iters,
                                     void (*run)(void *, int), void *arg, float *times_ms) {
    static CUdeviceptr hold;
    if (!hold)
        CU(cuMemAlloc(&hold, BENCH_HOLD_BYTES));
    const int n = warmup + iters;
    CUevent *ev = malloc(sizeof(CUevent) * 2 * (size_t)n), held;
    if (!ev) {
        fprintf(stderr, "%s: out of host memory\n", bench_name);
        exit(1);
    }
    for (int i = 0; i < 2 * n; i++)
        CU(cuEventCreate(&ev[i], 0));
    CU(cuEventCreate(&held, 0));
    CU(cuMemsetD32Async(hold, 0, BENCH_HOLD_BYTES / 4, stream));
    CU(cuEventRecord(held, stream));
    for (int i = 0; i < n; i++) {
        CU(cuEventRecord(ev[2 * i], stream));
        run(arg, i - warmup);
        CU(cuEventRecord(ev[2 * i + 1], stream));
    }
    if (cu->cuEventQuery(held) == CUDA_SUCCESS)
        fprintf(stderr,
                "%s: warning: the host queued slower than the GPU ran; times include "
                "launch gaps\n",
                bench_name);
    CU(cuEventSynchronize(ev[2 * n - 1]));
    for (int i = 0; i < iters; i++)
        CU(cuEventElapsedTime(&times_ms[i], ev[2 * (warmup + i)], ev[2 * (warmup + i) + 1]));
    for (int i = 0; i < 2 * n; i++)
        CU(cuEventDestroy(ev[i]));
    CU(cuEventDestroy(held));
    free(ev);
}

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/*
 * Median milliseconds of one run: `iters` timed groups (after 3 untimed ones) of `reps` runs
 * queued back to back between a pair of events, the host waiting for each group's end. run(arg)
 * queues one run. Groups let a short run's host work (checks, plan, launch) overlap the runs
 * before it, unless it takes longer than they do.
 */
static inline double bench_time_groups(CUstream stream, int reps, int iters, void (*run)(void *),
                                       void *arg) {
    CUevent e0, e1;
    CU(cuEventCreate(&e0, 0));
    CU(cuEventCreate(&e1, 0));
    float *times = malloc(sizeof(float) * (size_t)iters);
    if (!times) {
        fprintf(stderr, "%s: out of host memory\n", bench_name);
        exit(1);
    }
    for (int i = -3; i < iters; i++) {
        CU(cuEventRecord(e0, stream));
        for (int r = 0; r < reps; r++)
            run(arg);
        CU(cuEventRecord(e1, stream));
        CU(cuEventSynchronize(e1));
        if (i >= 0)
            CU(cuEventElapsedTime(&times[i], e0, e1));
    }
    qsort(times, (size_t)iters, sizeof(float), cmp_float);
    const double ms = times[iters / 2] / reps;
    free(times);
    CU(cuEventDestroy(e0));
    CU(cuEventDestroy(e1));
    return ms;
}

/*
 * GPU time per run of `per_graph` runs captured in one CUDA graph and replayed `3 + iters` times,
 * each replay between its own pair of events; times_ms gets the `iters` timed replays' times
 * divided by per_graph. run(arg, j) queues run j of the graph (j = 0 .. per_graph - 1, e.g. the
 * rotation j mod rotations). Event pairs around every run (bench_time_queued) add about 1.4 us per
 * run on an H200 (bench/RESULTS.md, developers' session 11: one 8k decode step 17.9 us between
 * its own events, 16.5 us queued between one pair), which a step of a few microseconds feels; here
 * they are spread over the graph's runs, as FlashInfer's bench_gpu_time_with_cudagraph does (ten
 * runs per graph, rotating buffers). The runs must be capturable (plan before, run inside).
 */
static inline void bench_time_graph(CUstream stream, int per_graph, int iters,
                                    void (*run)(void *, int), void *arg, float *times_ms) {
    CUgraph graph;
    CUgraphExec exec;
    CU(cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
    for (int j = 0; j < per_graph; j++)
        run(arg, j);
    CU(cuStreamEndCapture(stream, &graph));
    CU(cuGraphInstantiate(&exec, graph, 0));
    CUevent e0, e1;
    CU(cuEventCreate(&e0, 0));
    CU(cuEventCreate(&e1, 0));
    for (int i = -3; i < iters; i++) {
        CU(cuEventRecord(e0, stream));
        CU(cuGraphLaunch(exec, stream));
        CU(cuEventRecord(e1, stream));
        CU(cuEventSynchronize(e1));
        if (i >= 0) {
            CU(cuEventElapsedTime(&times_ms[i], e0, e1));
            times_ms[i] /= (float)per_graph;
        }
    }
    CU(cuEventDestroy(e0));
    CU(cuEventDestroy(e1));
    CU(cuGraphExecDestroy(exec));
    CU(cuGraphDestroy(graph));
}

/* Fills n bytes of device memory with random data (never zeros): a 64 MB block uploaded once and
 * copied over the range. Its bf16 values have magnitude 2^-15..1 (sign, exponent 0x70..0x7e, 6
 * random mantissa bits); read as fp8 bytes they are finite e4m3 values too, since no byte has all
 * 7 low bits set. */
static void fill_random(CUdeviceptr dst, size_t n) {
    static unsigned char *host;
    static CUdeviceptr block;
    const size_t block_bytes = 64u << 20;
    if (!host) {
        host = malloc(block_bytes);
        if (!host) {
            fprintf(stderr, "%s: out of host memory\n", bench_name);
            exit(1);
        }
        for (size_t i = 0; i < block_bytes; i += 2) {
            uint64_t r = rng_next();
            uint16_t v =
                (uint16_t)(((r & 1) << 15) | ((0x70 + (r >> 8) % 15) << 7) | ((r >> 16) & 0x3f));
            memcpy(host + i, &v, 2);
        }
        CU(cuMemAlloc(&block, block_bytes));
        CU(cuMemcpyHtoD(block, host, block_bytes));
    }
    for (size_t off = 0; off < n; off += block_bytes) {
        size_t len = n - off < block_bytes ? n - off : block_bytes;
        CU(cuMemcpyDtoDAsync(dst + off, block, len, NULL));
    }
    CU(cuCtxSynchronize());
}

/* A compact DLTensor view of device memory (shape owned by the caller). */
static DLTensor tensor(CUdeviceptr p, DLDataType dt, int ndim, int64_t *shape, int device) {
    DLTensor t;
    memset(&t, 0, sizeof t);
    t.data = (void *)(uintptr_t)p;
    t.device.device_type = kDLCUDA;
    t.device.device_id = device;
    t.ndim = ndim;
    t.dtype = dt;
    t.shape = shape;
    return t;
}

#endif
