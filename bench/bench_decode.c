/*
 * Batch decode benchmark: Llama-3-8B attention heads (32 query / 8 KV heads, D = 128), bf16 (and
 * fp8 e4m3 / e5m2) paged KV cache with 16-token pages, against the device's copy bandwidth measured
 * in the same run.
 *
 * Bytes counted = the K and V bytes every step must read once (PERF.md). Pages are scattered
 * (a random permutation of a large pool), the data is random (never zeros), and each timed run
 * uses the next of several page tables over disjoint parts of the pool, so that no run finds the
 * previous one's KV in the 60 MB L2. Times are medians of CUDA-event timings after warm-up, twice:
 * of runs queued back to back behind a hold, each between its own events (bench_time_queued: GPU
 * time, launch latency left out), and of runs captured 16 or more to a CUDA graph, one pair of
 * events per replay (bench_time_graph: without the ~1.4 us an event pair adds to a run). A last
 * table times the uniform runs' bytes as one device-to-device copy timed the same two ways, the
 * floor of a run of that size (launch, ramp and tail included), beside the tensor-core decode.
 *
 * Usage: bench_decode [TRACE.csv] [--quick] [--case BATCH:LEN[:KERNEL]] [--lens LENS]
 *                     [--kv bf16|e4m3|e5m2] [--layout nhd|hnd].
 * Prints a Markdown table; --case times one configuration on both kernels, or on KERNEL alone
 * (0: CUDA cores, 1: tensor cores; LEN 0: lengths sampled from the trace), with the KV dtype of
 * --kv (bf16 by default), e.g. under ncu. --lens times one batch of the given lengths on the
 * tensor-core kernel: LEN[*COUNT] terms separated by commas (at most 256 requests), e.g.
 * "1*66,1000" for 66 one-token requests and one of 1000 tokens. --layout: the pages' layout (NHD,
 * FlashInfer's default, unless hnd).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_common.h"

#define PAGE 16
#define HQ   32
#define HK   8
#define HD   128
/* Every timed configuration touches at least this many bytes across its rotations: 4x the L2. */
#define ROTATE_BYTES  (256ull << 20)
#define MAX_ROTATIONS 8

/* Device-to-device copy bandwidth over 2 GiB, counting bytes read plus written. */
static double copy_ceiling(CUstream stream) {
    size_t bytes = 2ull << 30;
    CUdeviceptr a, b;
    CU(cuMemAlloc(&a, bytes));
    CU(cuMemAlloc(&b, bytes));
    fill_random(a, bytes);
    CUevent e0, e1;
    CU(cuEventCreate(&e0, 0));
    CU(cuEventCreate(&e1, 0));
    float times[20];
    for (int i = 0; i < 23; i++) {
        CU(cuEventRecord(e0, stream));
        CU(cuMemcpyDtoDAsync(b, a, bytes, stream));
        CU(cuEventRecord(e1, stream));
        CU(cuEventSynchronize(e1));
        if (i >= 3)
            CU(cuEventElapsedTime(&times[i - 3], e0, e1));
    }
    qsort(times, 20, sizeof times[0], cmp_float);
    CU(cuMemFree(a));
    CU(cuMemFree(b));
    CU(cuEventDestroy(e0));
    CU(cuEventDestroy(e1));
    return 2.0 * (double)bytes / (times[10] * 1e-3) / 1e12;
}

/* Queued device-to-device copies of `half` bytes (so 2 * half read + written), run i from and to
 * the next part of two pools of pool bytes, so that no run finds its source in the L2. */
typedef struct copy_state {
    CUdeviceptr src, dst;
    size_t half, pool;
    CUstream stream;
} copy_state_t;

static void queue_copy(void *arg, int i) {
    const copy_state_t *c = arg;
    const size_t slots = c->pool / c->half;
    const size_t off = (size_t)((i + 64) % (int)(slots > 0 ? slots : 1)) * c->half;
    CU(cuMemcpyDtoDAsync(c->dst + off, c->src + off, c->half, c->stream));
}

/* Median microseconds of a copy that reads and writes `bytes` in all (bytes / 2 each way, at most
 * pool), timed as the decode runs are, between its own events (bench_time_queued) and in a CUDA
 * graph of 16 (*graph_us; bench_time_graph): how long any kernel takes to move that many bytes,
 * its launch and ramp included, beside which a decode run's own overhead shows. */
static double copy_us(CUstream stream, CUdeviceptr src, CUdeviceptr dst, size_t pool, double bytes,
                      int iters, double *graph_us) {
    copy_state_t c = {src, dst, ((size_t)(bytes / 2) + 255) / 256 * 256, pool, stream};
    float *times = malloc(sizeof(float) * (size_t)iters);
    if (!times) {
        fprintf(stderr, "%s: out of host memory\n", bench_name);
        exit(1);
    }
    bench_time_queued(stream, 3, iters, queue_copy, &c, times);
    qsort(times, (size_t)iters, sizeof(float), cmp_float);
    const double us = times[iters / 2] * 1e3;
    bench_time_graph(stream, 16, iters, queue_copy, &c, times);
    qsort(times, (size_t)iters, sizeof(float), cmp_float);
    *graph_us = times[iters / 2] * 1e3;
    free(times);
    return us;
}

#define KERNEL(tc) ((tc) ? "tensor cores" : "CUDA cores")

/* The columns after kv_len: each timing's microseconds, TB/s and share of the copy ceiling. */
#define TIMES_FMT "%.1f | %.2f | %.0f%% | %.1f | %.2f | %.0f%% |"
#define TIMES_ARGS(r, cei)                                                                         \
    (r).us, (r).tbps, 100 * (r).tbps / (cei), (r).graph_us, (r).graph_tbps,                        \
        100 * (r).graph_tbps / (cei)

/* --layout: the paged cache's layout, NHD ([pages, page_size, Hk, D], the default) or HND
 * ([pages, Hk, page_size, D]: a head's rows of a page contiguous). */
static cinfer_kv_layout_t bench_layout = CINFER_KV_LAYOUT_NHD;

/* A run's median time with an event pair of its own (us, tbps) and in a CUDA graph of several
 * (graph_us, graph_tbps; bench_time_graph). */
typedef struct result {
    double us, tbps, graph_us, graph_tbps;
} result_t;

/* Runs per CUDA graph: a multiple of the rotations, at least 16, so that consecutive runs (across
 * replays too) read different rotations. */
static int runs_per_graph(int rotations) {
    return rotations * ((16 + rotations - 1) / rotations);
}

/* One queued run of a planned batch decode; run i reads the (i mod rotations)-th page table. */
typedef struct run_state {
    cinfer_batch_decode_t *op;
    const DLTensor *q, *k, *v, *indptr, *indices, *last;
    DLTensor *out;
    int rotations;
    CUstream stream;
} run_state_t;

static void queue_run(void *arg, int i) {
    const run_state_t *rs = arg;
    const int r = ((i % rs->rotations) + rs->rotations) % rs->rotations;
    CI(cinfer_batch_decode_run(rs->op, rs->q, rs->k, rs->v, rs->indptr, &rs->indices[r], rs->last,
                               rs->out, NULL, NULL, rs->stream));
}

/* Times one batch of kv lengths; returns the median microseconds and TB/s of K+V bytes. */
static result_t run_case(cinfer_context_t *ctx, CUstream stream, const int *lens, int batch,
                         DLDataType kv_dtype, int tensor_cores, int iters) {
    const int fp8 = kv_dtype.bits == 8;
    const size_t elem = fp8 ? 1 : 2;
    const size_t page_bytes = (size_t)PAGE * HK * HD * elem;
    int64_t pages_needed = 0, tokens = 0;
    for (int b = 0; b < batch; b++) {
        pages_needed += (lens[b] + PAGE - 1) / PAGE;
        tokens += lens[b];
    }
    const double kv_bytes = 2.0 * (double)tokens * HK * HD * (double)elem;
    int rotations = (int)ceil((double)ROTATE_BYTES / (kv_bytes > 1 ? kv_bytes : 1));
    if (rotations < 1)
        rotations = 1;
    if (rotations > MAX_ROTATIONS)
        rotations = MAX_ROTATIONS;
    const int64_t pool_pages = pages_needed * rotations;

    CUdeviceptr k_cache, v_cache, q, out, indptr, indices, last;
    CU(cuMemAlloc(&k_cache, (size_t)pool_pages * page_bytes + 1));
    CU(cuMemAlloc(&v_cache, (size_t)pool_pages * page_bytes + 1));
    fill_random(k_cache, (size_t)pool_pages * page_bytes);
    fill_random(v_cache, (size_t)pool_pages * page_bytes);
    CU(cuMemAlloc(&q, (size_t)batch * HQ * HD * 2));
    CU(cuMemAlloc(&out, (size_t)batch * HQ * HD * 2));
    fill_random(q, (size_t)batch * HQ * HD * 2);

    /* A random permutation of the pool; rotation r uses its r-th block of pages. */
    int32_t *perm = malloc(sizeof(int32_t) * (size_t)(pool_pages ? pool_pages : 1));
    for (int64_t i = 0; i < pool_pages; i++)
        perm[i] = (int32_t)i;
    for (int64_t i = pool_pages - 1; i > 0; i--) {
        int64_t j = (int64_t)(rng_next() % (uint64_t)(i + 1));
        int32_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    int32_t *h_indptr = malloc(sizeof(int32_t) * (size_t)(batch + 1));
    int32_t *h_last = malloc(sizeof(int32_t) * (size_t)batch);
    h_indptr[0] = 0;
    for (int b = 0; b < batch; b++) {
        int np = (lens[b] + PAGE - 1) / PAGE;
        h_indptr[b + 1] = h_indptr[b] + np;
        h_last[b] = np ? lens[b] - (np - 1) * PAGE : 0;
    }
    CU(cuMemAlloc(&indptr, sizeof(int32_t) * (size_t)(batch + 1)));
    CU(cuMemAlloc(&last, sizeof(int32_t) * (size_t)batch));
    CU(cuMemAlloc(&indices, sizeof(int32_t) * (size_t)(pool_pages ? pool_pages : 1)));
    CU(cuMemcpyHtoD(indptr, h_indptr, sizeof(int32_t) * (size_t)(batch + 1)));
    CU(cuMemcpyHtoD(last, h_last, sizeof(int32_t) * (size_t)batch));
    CU(cuMemcpyHtoD(indices, perm, sizeof(int32_t) * (size_t)(pool_pages ? pool_pages : 1)));

    cinfer_attention_options_t opt = CINFER_ATTENTION_OPTIONS_INIT;
    opt.num_qo_heads = HQ;
    opt.num_kv_heads = HK;
    opt.head_dim = HD;
    opt.page_size = PAGE;
    opt.kv_layout = bench_layout;
    opt.kv_dtype = kv_dtype;
    opt.max_batch_size = batch;
    opt.use_tensor_cores = tensor_cores;
    size_t ws_bytes;
    CI(cinfer_batch_decode_workspace_size(ctx, &opt, &ws_bytes));
    CUdeviceptr ws;
    CU(cuMemAlloc(&ws, ws_bytes));
    cinfer_batch_decode_t *op;
    CI(cinfer_batch_decode_create(ctx, &opt, (void *)(uintptr_t)ws, ws_bytes, &op));
    CI(cinfer_batch_decode_plan(op, h_indptr, h_last, batch, stream));

    const DLDataType bf16 = {kDLBfloat, 16, 1}, i32 = {kDLInt, 32, 1};
    const int hnd = bench_layout == CINFER_KV_LAYOUT_HND;
    int64_t q_shape[3] = {batch, HQ, HD},
            cache_shape[4] = {pool_pages, hnd ? HK : PAGE, hnd ? PAGE : HK, HD};
    int64_t indptr_shape[1] = {batch + 1}, last_shape[1] = {batch}, idx_shape[1] = {pages_needed};
    int dev = 0;
    cinfer_context_get_device(ctx, &dev, NULL);
    DLTensor tq = tensor(q, bf16, 3, q_shape, dev), tout = tensor(out, bf16, 3, q_shape, dev);
    DLTensor tk = tensor(k_cache, kv_dtype, 4, cache_shape, dev);
    DLTensor tv = tensor(v_cache, kv_dtype, 4, cache_shape, dev);
    DLTensor tindptr = tensor(indptr, i32, 1, indptr_shape, dev);
    DLTensor tlast = tensor(last, i32, 1, last_shape, dev);
    DLTensor tidx[MAX_ROTATIONS];
    for (int r = 0; r < rotations; r++)
        tidx[r] = tensor(indices + (CUdeviceptr)r * (CUdeviceptr)pages_needed * sizeof(int32_t),
                         i32, 1, idx_shape, dev);

    float *times = malloc(sizeof(float) * (size_t)iters);
    run_state_t rs = {op, &tq, &tk, &tv, &tindptr, tidx, &tlast, &tout, rotations, stream};
    bench_time_queued(stream, 5, iters, queue_run, &rs, times);
    qsort(times, (size_t)iters, sizeof(float), cmp_float);
    result_t res;
    res.us = times[iters / 2] * 1e3;
    res.tbps = kv_bytes / (res.us * 1e-6) / 1e12;
    bench_time_graph(stream, runs_per_graph(rotations), iters, queue_run, &rs, times);
    qsort(times, (size_t)iters, sizeof(float), cmp_float);
    res.graph_us = times[iters / 2] * 1e3;
    res.graph_tbps = kv_bytes / (res.graph_us * 1e-6) / 1e12;

    free(times);
    cinfer_batch_decode_destroy(op);
    CU(cuMemFree(ws));
    CU(cuMemFree(k_cache));
    CU(cuMemFree(v_cache));
    CU(cuMemFree(q));
    CU(cuMemFree(out));
    CU(cuMemFree(indptr));
    CU(cuMemFree(indices));
    CU(cuMemFree(last));
    free(perm);
    free(h_indptr);
    free(h_last);
    return res;
}

/* kv_len = context + a uniform share of the generated tokens, for requests sampled from the
 * trace (CC BY 4.0, Azure LLM inference trace 2023). */
static int load_trace(const char *path, int **ctx_out, int **gen_out) {
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    char line[256];
    int n = 0, cap = 1024;
    int *c = malloc(sizeof(int) * (size_t)cap), *g = malloc(sizeof(int) * (size_t)cap);
    if (!fgets(line, sizeof line, f)) {
        fclose(f);
        return 0;
    }
    while (fgets(line, sizeof line, f)) {
        char *comma = strchr(line, ',');
        if (!comma)
            continue;
        int a = 0, b = 0;
        if (sscanf(comma + 1, "%d,%d", &a, &b) != 2)
            continue;
        if (n == cap) {
            cap *= 2;
            c = realloc(c, sizeof(int) * (size_t)cap);
            g = realloc(g, sizeof(int) * (size_t)cap);
        }
        c[n] = a;
        g[n] = b;
        n++;
    }
    fclose(f);
    *ctx_out = c;
    *gen_out = g;
    return n;
}

int main(int argc, char **argv) {
    bench_name = "bench_decode";
    const char *trace = NULL;
    int quick = 0;
    int case_batch = 0, case_len = -1, case_kernel = -1;
    /* --kv: the KV dtypes by name (DLPack codes: kDLBfloat, then float8 e4m3fn and e5m2). */
    static const struct {
        const char *name;
        DLDataType type;
    } kv_types[] = {{"bf16", {kDLBfloat, 16, 1}}, {"e4m3", {10, 8, 1}}, {"e5m2", {12, 8, 1}}};
    int case_kv = 0;
    int *lens = malloc(sizeof(int) * 256);
    int custom = 0; /* --lens: requests in lens */
    static const char usage[] =
        "usage: bench_decode [TRACE.csv] [--quick] [--case BATCH:LEN[:KERNEL]] "
        "[--lens LENS] [--kv bf16|e4m3|e5m2] [--layout nhd|hnd]\n";
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0)
            quick = 1;
        else if (strcmp(argv[i], "--kv") == 0 && i + 1 < argc) {
            const char *name = argv[++i];
            case_kv = -1;
            for (int t = 0; t < 3; t++)
                if (strcmp(name, kv_types[t].name) == 0)
                    case_kv = t;
            if (case_kv < 0) {
                fprintf(stderr, "bench_decode: --kv %s, expected bf16, e4m3 or e5m2\n", name);
                return 2;
            }
        } else if (strcmp(argv[i], "--layout") == 0 && i + 1 < argc) {
            const char *name = argv[++i];
            if (strcmp(name, "nhd") != 0 && strcmp(name, "hnd") != 0) {
                fprintf(stderr, "bench_decode: --layout %s, expected nhd or hnd\n", name);
                return 2;
            }
            bench_layout = strcmp(name, "hnd") == 0 ? CINFER_KV_LAYOUT_HND : CINFER_KV_LAYOUT_NHD;
        } else if (strcmp(argv[i], "--lens") == 0 && i + 1 < argc) {
            const char *at = argv[++i];
            int64_t requested = 0;
            custom = 0;
            while (*at) {
                int len = -1, count = 1, used = 0;
                if (sscanf(at, "%d%n", &len, &used) != 1 || len < 0)
                    break;
                at += used;
                if (*at == '*' && (sscanf(at + 1, "%d%n", &count, &used) != 1 || count < 1))
                    break;
                if (*at == '*')
                    at += 1 + used;
                requested += count;
                for (int k = 0; k < count && custom < 256; k++)
                    lens[custom++] = len;
                if (*at == ',')
                    at++;
                else if (*at)
                    break;
            }
            if (*at || requested < 1 || requested > 256) {
                fprintf(stderr,
                        "bench_decode: --lens %s, expected LEN[*COUNT] terms separated by commas, "
                        "1 to 256 requests\n",
                        argv[i]);
                return 2;
            }
        } else if (strcmp(argv[i], "--case") == 0 && i + 1 < argc) {
            const int got = sscanf(argv[++i], "%d:%d:%d", &case_batch, &case_len, &case_kernel);
            if (got < 2 || case_batch < 1 || case_batch > 256 || case_len < 0 ||
                (got == 3 && (case_kernel < 0 || case_kernel > 1))) {
                fprintf(stderr,
                        "bench_decode: --case %s, expected BATCH:LEN[:KERNEL] with BATCH 1..256, "
                        "LEN >= 0 (0: lengths sampled from the trace) and KERNEL 0 (CUDA cores) "
                        "or 1 (tensor cores)\n",
                        argv[i]);
                return 2;
            }
        } else if (argv[i][0] != '-' && !trace) {
            trace = argv[i];
        } else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            fputs(usage, stdout);
            return 0;
        } else {
            fprintf(stderr, "bench_decode: unknown or incomplete argument '%s'\n", argv[i]);
            fputs(usage, stderr);
            return 2;
        }
    }
    /* The trace, read before the device is looked for. */
    int *tc = NULL, *tg = NULL;
    const int n = trace ? load_trace(trace, &tc, &tg) : 0;
    if (trace && n <= 0) {
        fprintf(stderr, "bench_decode: %s: no requests read from the trace\n", trace);
        return 2;
    }
    bench_load_driver();
    cinfer_context_t *ctx;
    CI(cinfer_context_create(NULL, &ctx));
    CI(cinfer__context_activate(ctx));
    CUstream stream;
    CU(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    const double ceiling = copy_ceiling(stream);
    const int iters = quick ? 10 : 30;
    const DLDataType bf16 = kv_types[0].type, e4m3 = kv_types[1].type, e5m2 = kv_types[2].type;

    printf("copy ceiling (device-to-device, 2 GiB, read+write): %.2f TB/s; paged KV layout %s\n\n",
           ceiling, bench_layout == CINFER_KV_LAYOUT_HND ? "HND" : "NHD");
    printf("Each run timed between its own pair of events (time, TB/s, of ceiling), and in CUDA "
           "graphs of 16 or more runs (graph: one pair of events per graph)\n\n");
    printf("| workload | kernel | kv dtype | batch | kv_len | time (us) | TB/s | of ceiling | "
           "graph (us) | TB/s | of ceiling |\n");
    printf("|---|---|---|---|---|---|---|---|---|---|---|\n");
    if (custom > 0) {
        int64_t total = 0;
        for (int b = 0; b < custom; b++)
            total += lens[b];
        result_t r = run_case(ctx, stream, lens, custom, kv_types[case_kv].type, 1, iters);
        printf("| custom (%lld tokens) | %s | %s | %d | mixed | " TIMES_FMT "\n", (long long)total,
               KERNEL(1), kv_types[case_kv].name, custom, TIMES_ARGS(r, ceiling));
        free(lens);
        free(tc);
        free(tg);
        cu->cuStreamDestroy(stream);
        cinfer_context_destroy(ctx);
        return 0;
    }
    if (case_batch > 0) {
        /* One configuration on both kernels (for a profiler): uniform, or sampled from the trace.
         */
        const int cn = case_len == 0 ? n : 0; /* trace requests to sample (LEN 0) */
        if (case_len == 0 && cn <= 0) {
            fprintf(stderr, "bench_decode: --case %d:0 needs a trace file\n", case_batch);
            return 2;
        }
        for (int b = 0; b < case_batch; b++) {
            const int k = cn > 0 ? (int)(rng_next() % (uint64_t)cn) : 0;
            lens[b] = cn > 0 ? tc[k] + (int)(rng_next() % (uint64_t)(tg[k] + 1)) : case_len;
        }
        for (int k = 0; k < 2; k++) {
            if (case_kernel >= 0 && k != case_kernel)
                continue;
            result_t r = run_case(ctx, stream, lens, case_batch, kv_types[case_kv].type, k, iters);
            printf("| %s | %s | %s | %d | %d | " TIMES_FMT "\n", cn > 0 ? "trace" : "uniform",
                   KERNEL(k), kv_types[case_kv].name, case_batch, case_len, TIMES_ARGS(r, ceiling));
        }
        free(tc);
        free(tg);
        free(lens);
        cu->cuStreamDestroy(stream);
        cinfer_context_destroy(ctx);
        return 0;
    }
    static const int batches[] = {1, 16, 64, 256};
    static const int lengths[] = {1024, 4096, 8192, 32768};
    double tc_us[4][4] = {{0}}, tc_graph_us[4][4] = {{0}};
    for (size_t bi = 0; bi < 4; bi++) {
        for (size_t li = 0; li < 4; li++) {
            int batch = batches[bi], len = lengths[li];
            if (quick && (int64_t)batch * len > (1 << 20))
                continue;
            for (int b = 0; b < batch; b++)
                lens[b] = len;
            for (int k = 0; k < 2; k++) {
                result_t r = run_case(ctx, stream, lens, batch, bf16, k, iters);
                printf("| uniform | %s | bf16 | %d | %d | " TIMES_FMT "\n", KERNEL(k), batch, len,
                       TIMES_ARGS(r, ceiling));
                fflush(stdout);
                if (k == 1) {
                    tc_us[bi][li] = r.us;
                    tc_graph_us[bi][li] = r.graph_us;
                }
            }
        }
    }
    for (int b = 0; b < 64; b++)
        lens[b] = 4096;
    result_t base = run_case(ctx, stream, lens, 64, bf16, 0, iters);
    result_t base_tc = run_case(ctx, stream, lens, 64, bf16, 1, iters);
    result_t f8 = run_case(ctx, stream, lens, 64, e4m3, 0, iters);
    result_t f8_tc = run_case(ctx, stream, lens, 64, e4m3, 1, iters);
    result_t e5_tc = run_case(ctx, stream, lens, 64, e5m2, 1, iters);
    printf("| uniform | %s | e4m3 | 64 | 4096 | " TIMES_FMT "\n", KERNEL(0),
           TIMES_ARGS(f8, ceiling));
    printf("| uniform | %s | e4m3 | 64 | 4096 | " TIMES_FMT "\n", KERNEL(1),
           TIMES_ARGS(f8_tc, ceiling));
    printf("| uniform | %s | e5m2 | 64 | 4096 | " TIMES_FMT "\n", KERNEL(1),
           TIMES_ARGS(e5_tc, ceiling));
    printf("\nfp8 e4m3 vs bf16 at B=64 L=4096: %.2fx (CUDA cores) and %.2fx (tensor cores) the "
           "steps per second of the same kernel; the faster fp8 kernel %.2fx the faster bf16 one\n",
           base.us / f8.us, base_tc.us / f8_tc.us,
           (base.us < base_tc.us ? base.us : base_tc.us) / (f8.us < f8_tc.us ? f8.us : f8_tc.us));
    printf("fp8 e5m2 vs bf16 at B=64 L=4096, tensor cores: %.2fx the steps per second\n",
           base_tc.us / e5_tc.us);
    printf("in CUDA graphs, tensor cores: e4m3 %.2fx, e5m2 %.2fx the bf16 steps per second\n",
           base_tc.graph_us / f8_tc.graph_us, base_tc.graph_us / e5_tc.graph_us);

    if (n > 0) {
        static const int trace_batches[] = {64, 256};
        for (int i = 0; i < 2; i++) {
            int batch = trace_batches[i];
            double mean = 0;
            for (int b = 0; b < batch; b++) {
                int k = (int)(rng_next() % (uint64_t)n);
                lens[b] = tc[k] + (int)(rng_next() % (uint64_t)(tg[k] + 1));
                mean += lens[b];
            }
            for (int k = 0; k < 2; k++) {
                result_t r = run_case(ctx, stream, lens, batch, bf16, k, iters);
                printf("| trace (mean %.0f) | %s | bf16 | %d | mixed | " TIMES_FMT "\n",
                       mean / batch, KERNEL(k), batch, TIMES_ARGS(r, ceiling));
            }
        }
    }
    {
        /* The same bytes as one copy: the floor of a run of that size (a copy of 2 GiB reaches
         * the ceiling; shorter ones pay their launch, ramp and tail over fewer bytes). */
        const size_t pool = 1ull << 30;
        CUdeviceptr src, dst;
        CU(cuMemAlloc(&src, pool));
        CU(cuMemAlloc(&dst, pool));
        fill_random(src, pool);
        printf("\nthe uniform runs' K+V bytes as one device-to-device copy (read + written), timed "
               "like the runs (own events; in graphs); tensor-core decode beside it\n\n");
        printf("| batch | kv_len | MB | copy (us) | TB/s | of ceiling | decode (us) | decode / "
               "copy time | graph: copy (us) | of ceiling | decode (us) | decode / copy time "
               "|\n|---|---|---|---|---|---|---|---|---|---|---|---|\n");
        for (size_t bi = 0; bi < 4; bi++)
            for (size_t li = 0; li < 4; li++) {
                const double bytes = 2.0 * batches[bi] * lengths[li] * HK * HD * 2.0;
                if (tc_us[bi][li] <= 0 || bytes > (double)pool)
                    continue;
                double graph_us;
                const double us = copy_us(stream, src, dst, pool, bytes, iters, &graph_us);
                const double tbps = bytes / (us * 1e-6) / 1e12;
                const double graph_tbps = bytes / (graph_us * 1e-6) / 1e12;
                printf("| %d | %d | %.0f | %.1f | %.2f | %.0f%% | %.1f | %.2f | %.1f | %.0f%% | "
                       "%.1f | %.2f |\n",
                       batches[bi], lengths[li], bytes / 1e6, us, tbps, 100 * tbps / ceiling,
                       tc_us[bi][li], tc_us[bi][li] / us, graph_us, 100 * graph_tbps / ceiling,
                       tc_graph_us[bi][li], tc_graph_us[bi][li] / graph_us);
                fflush(stdout);
            }
        CU(cuMemFree(src));
        CU(cuMemFree(dst));
    }
    free(lens);
    free(tc);
    free(tg);
    cu->cuStreamDestroy(stream);
    cinfer_context_destroy(ctx);
    return 0;
}
