/*
 * `cinfer demo`: one decode step of a serving batch (Llama-3-8B attention heads: 32 query / 8 KV
 * heads, D = 128, bf16, paged KV cache with 16-token pages, request lengths shaped like the Azure
 * LLM inference trace), checked against the float64 CPU reference and timed. Without a GPU it says
 * so, compiles the step's kernels for sm_90a instead, and exits 0.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cuda/context.h"
#include "jit/jit.h"
#include "ops/decode.h"
#include "ref/ref.h"

enum { DEMO_HQ = 32, DEMO_HK = 8, DEMO_D = 128, DEMO_PAGE = 16, DEMO_BATCH = 32, DEMO_RUNS = 20 };

/* Context + generated tokens of 32 requests drawn from the Azure LLM inference trace 2023
 * (CC BY 4.0; bench/data/README.md), as KV lengths of running requests. */
static const int demo_lengths[DEMO_BATCH] = {
    418,  1005, 934,  107, 2048, 761,  1320, 3977, 256,  1790, 643,  1112, 4103, 95,  2674, 880,
    1537, 322,  1981, 705, 1266, 3150, 47,   914,  1688, 540,  2333, 1020, 777,  189, 1459, 2901};

static void demo_options(cinfer_attention_options_t *o) {
    const cinfer_attention_options_t init = CINFER_ATTENTION_OPTIONS_INIT;
    *o = init;
    o->num_qo_heads = DEMO_HQ;
    o->num_kv_heads = DEMO_HK;
    o->head_dim = DEMO_D;
    o->page_size = DEMO_PAGE;
    o->max_batch_size = DEMO_BATCH;
}

static int compile_only(void) {
    printf("no CUDA device found (%s)\n", cinfer_last_error());
    printf("compiling the demo step's kernels for sm_90a instead:\n");
    /* The kernels of the step `demo_run` plans, found by the same function create uses. */
    cinfer_attention_options_t o;
    demo_options(&o);
    cinfer__spec_t specs[2];
    unsigned smem;
    if (cinfer__decode_kernel_specs(&o, true, &specs[0], &specs[1], &smem) != CINFER_STATUS_SUCCESS)
        return cli_fail();
    for (int i = 0; i < 2; i++) {
        void *cubin = NULL;
        size_t size = 0;
        cinfer__jit_source_t from;
        char name[192];
        double start = cinfer__now();
        if (cinfer__jit_cubin(&specs[i], "sm_90a", &cubin, &size, &from, name) !=
            CINFER_STATUS_SUCCESS)
            return cli_fail();
        printf("  %-60s %s in %.2f s, %zu bytes\n", name,
               from == CINFER__JIT_FROM_COMPILE ? "compiled"
               : from == CINFER__JIT_FROM_AOT   ? "from the AOT bundle"
                                                : "cache hit",
               cinfer__now() - start, size);
        free(cubin);
    }
    printf(
        "run `make demo` on a machine with an NVIDIA GPU (sm_80 or later) to see the step run\n");
    return CLI_EXIT_OK;
}

static uint64_t demo_rng = 0x243f6a8885a308d3ull;
static double uniform(void) {
    demo_rng = demo_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(demo_rng >> 11) * (1.0 / 9007199254740992.0) * 2.0 - 1.0;
}

/* Everything the step needs, on the host and the device. */
typedef struct demo {
    int32_t indptr[DEMO_BATCH + 1], last[DEMO_BATCH];
    int32_t *indices;
    int64_t pages, tokens;
    uint16_t *q, *k, *v, *out;
    CUdeviceptr d_q, d_k, d_v, d_out, d_indptr, d_indices, d_last, d_ws;
    size_t cache_bytes, q_bytes, ws_bytes;
} demo_t;

static cinfer_status_t demo_alloc(const cinfer__cuda_t *cu, demo_t *d) {
    d->indptr[0] = 0;
    for (int b = 0; b < DEMO_BATCH; b++) {
        const int pages = (demo_lengths[b] + DEMO_PAGE - 1) / DEMO_PAGE;
        d->indptr[b + 1] = d->indptr[b] + pages;
        d->last[b] = demo_lengths[b] - (pages - 1) * DEMO_PAGE;
        d->tokens += demo_lengths[b];
    }
    d->pages = d->indptr[DEMO_BATCH];
    const size_t page_elems = (size_t)DEMO_PAGE * DEMO_HK * DEMO_D;
    d->cache_bytes = (size_t)d->pages * page_elems * 2;
    d->q_bytes = (size_t)DEMO_BATCH * DEMO_HQ * DEMO_D * 2;
    d->indices = malloc(sizeof(int32_t) * (size_t)d->pages);
    d->k = malloc(d->cache_bytes);
    d->v = malloc(d->cache_bytes);
    d->q = malloc(d->q_bytes);
    d->out = malloc(d->q_bytes);
    if (!d->indices || !d->k || !d->v || !d->q || !d->out)
        return cinfer__error(CINFER_STATUS_OUT_OF_MEMORY, "demo: out of host memory");
    /* Pages in a scattered order, as a serving engine's allocator leaves them. */
    for (int64_t i = 0; i < d->pages; i++)
        d->indices[i] = (int32_t)((i * 7919) % d->pages);
    for (size_t i = 0; i < d->cache_bytes / 2; i++) {
        d->k[i] = cinfer__ref_double_to_bf16(uniform());
        d->v[i] = cinfer__ref_double_to_bf16(uniform());
    }
    for (size_t i = 0; i < d->q_bytes / 2; i++)
        d->q[i] = cinfer__ref_double_to_bf16(uniform());
    CINFER__CU(cu, cuMemAlloc(&d->d_k, d->cache_bytes), "demo: cuMemAlloc");
    CINFER__CU(cu, cuMemAlloc(&d->d_v, d->cache_bytes), "demo: cuMemAlloc");
    CINFER__CU(cu, cuMemAlloc(&d->d_q, d->q_bytes), "demo: cuMemAlloc");
    CINFER__CU(cu, cuMemAlloc(&d->d_out, d->q_bytes), "demo: cuMemAlloc");
    CINFER__CU(cu, cuMemAlloc(&d->d_indptr, sizeof d->indptr), "demo: cuMemAlloc");
    CINFER__CU(cu, cuMemAlloc(&d->d_last, sizeof d->last), "demo: cuMemAlloc");
    CINFER__CU(cu, cuMemAlloc(&d->d_indices, sizeof(int32_t) * (size_t)d->pages),
               "demo: cuMemAlloc");
    CINFER__CU(cu, cuMemcpyHtoD(d->d_k, d->k, d->cache_bytes), "demo: upload");
    CINFER__CU(cu, cuMemcpyHtoD(d->d_v, d->v, d->cache_bytes), "demo: upload");
    CINFER__CU(cu, cuMemcpyHtoD(d->d_q, d->q, d->q_bytes), "demo: upload");
    CINFER__CU(cu, cuMemcpyHtoD(d->d_indptr, d->indptr, sizeof d->indptr), "demo: upload");
    CINFER__CU(cu, cuMemcpyHtoD(d->d_last, d->last, sizeof d->last), "demo: upload");
    CINFER__CU(cu, cuMemcpyHtoD(d->d_indices, d->indices, sizeof(int32_t) * (size_t)d->pages),
               "demo: upload");
    return CINFER_STATUS_SUCCESS;
}

static void demo_free(const cinfer__cuda_t *cu, demo_t *d) {
    CUdeviceptr bufs[] = {d->d_q,      d->d_k,       d->d_v,    d->d_out,
                          d->d_indptr, d->d_indices, d->d_last, d->d_ws};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i])
            cu->cuMemFree(bufs[i]);
    free(d->indices);
    free(d->k);
    free(d->v);
    free(d->q);
    free(d->out);
}

static DLTensor view(CUdeviceptr p, DLDataType dt, int ndim, int64_t *shape, int device) {
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

/* Plans the step, runs it DEMO_RUNS times on a stream and reports the median milliseconds. */
static cinfer_status_t demo_run(cinfer_context_t *ctx, demo_t *d, double *median_ms) {
    const cinfer__cuda_t *cu = ctx->cu;
    cinfer_attention_options_t o;
    demo_options(&o);
    CINFER__CHECK(cinfer_batch_decode_workspace_size(ctx, &o, &d->ws_bytes));
    CINFER__CU(cu, cuMemAlloc(&d->d_ws, d->ws_bytes), "demo: workspace");
    cinfer_batch_decode_t *op = NULL;
    CINFER__CHECK(
        cinfer_batch_decode_create(ctx, &o, (void *)(uintptr_t)d->d_ws, d->ws_bytes, &op));
    CUstream stream = NULL;
    CUevent start = NULL, stop = NULL;
    cinfer_status_t st = CINFER_STATUS_SUCCESS;
    CUresult res = cu->cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING);
    if (res == CUDA_SUCCESS)
        res = cu->cuEventCreate(&start, 0);
    if (res == CUDA_SUCCESS)
        res = cu->cuEventCreate(&stop, 0);
    if (res != CUDA_SUCCESS) {
        st = cinfer__cu_error(res, "demo: stream and events");
        goto out_destroy;
    }
    if ((st = cinfer_batch_decode_plan(op, d->indptr, d->last, DEMO_BATCH, stream)))
        goto out_destroy;
    const DLDataType bf16 = {kDLBfloat, 16, 1}, i32 = {kDLInt, 32, 1};
    int64_t q_shape[3] = {DEMO_BATCH, DEMO_HQ, DEMO_D};
    int64_t cache_shape[4] = {d->pages, DEMO_PAGE, DEMO_HK, DEMO_D};
    int64_t indptr_shape[1] = {DEMO_BATCH + 1}, last_shape[1] = {DEMO_BATCH},
            idx_shape[1] = {d->pages};
    DLTensor q = view(d->d_q, bf16, 3, q_shape, ctx->device);
    DLTensor out = view(d->d_out, bf16, 3, q_shape, ctx->device);
    DLTensor k = view(d->d_k, bf16, 4, cache_shape, ctx->device);
    DLTensor v = view(d->d_v, bf16, 4, cache_shape, ctx->device);
    DLTensor indptr = view(d->d_indptr, i32, 1, indptr_shape, ctx->device);
    DLTensor last = view(d->d_last, i32, 1, last_shape, ctx->device);
    DLTensor indices = view(d->d_indices, i32, 1, idx_shape, ctx->device);
    float times[DEMO_RUNS];
    for (int i = -3; i < DEMO_RUNS; i++) {
        if ((res = cu->cuEventRecord(start, stream)) != CUDA_SUCCESS)
            break;
        if ((st = cinfer_batch_decode_run(op, &q, &k, &v, &indptr, &indices, &last, &out, NULL,
                                          NULL, stream)))
            goto out_destroy;
        if ((res = cu->cuEventRecord(stop, stream)) != CUDA_SUCCESS ||
            (res = cu->cuEventSynchronize(stop)) != CUDA_SUCCESS)
            break;
        if (i >= 0 && (res = cu->cuEventElapsedTime(&times[i], start, stop)) != CUDA_SUCCESS)
            break;
    }
    if (res != CUDA_SUCCESS) {
        st = cinfer__cu_error(res, "demo: running the step");
        goto out_destroy;
    }
    for (int i = 1; i < DEMO_RUNS; i++) /* insertion sort for the median */
        for (int j = i; j > 0 && times[j] < times[j - 1]; j--) {
            float t = times[j];
            times[j] = times[j - 1];
            times[j - 1] = t;
        }
    *median_ms = times[DEMO_RUNS / 2];
    res = cu->cuMemcpyDtoH(d->out, d->d_out, d->q_bytes);
    if (res != CUDA_SUCCESS)
        st = cinfer__cu_error(res, "demo: downloading the output");
out_destroy:
    if (stop)
        cu->cuEventDestroy(stop);
    if (start)
        cu->cuEventDestroy(start);
    if (stream)
        cu->cuStreamDestroy(stream);
    cinfer_batch_decode_destroy(op);
    return st;
}

/* The float64 reference of the step and the relative L2 error of the GPU output against it. */
static cinfer_status_t demo_check(const demo_t *d, double *rel_err, int64_t *nonfinite) {
    cinfer__ref_heads_t heads = {DEMO_HQ, DEMO_HK, DEMO_D, DEMO_D};
    cinfer__ref_strided3_t q;
    cinfer__ref_paged_t k, v;
    cinfer__ref_strided3_packed(&q, d->q, CINFER__REF_DTYPE_BF16, CINFER__REF_LAYOUT_NHD,
                                DEMO_BATCH, DEMO_HQ, DEMO_D);
    cinfer__ref_paged_packed(&k, d->k, CINFER__REF_DTYPE_BF16, CINFER__REF_LAYOUT_NHD, DEMO_PAGE,
                             DEMO_HK, DEMO_D);
    cinfer__ref_paged_packed(&v, d->v, CINFER__REF_DTYPE_BF16, CINFER__REF_LAYOUT_NHD, DEMO_PAGE,
                             DEMO_HK, DEMO_D);
    cinfer__ref_page_table_t table = {DEMO_BATCH, DEMO_PAGE,  d->pages,
                                      d->indptr,  d->indices, d->last};
    cinfer__ref_attn_opts_t opts;
    cinfer__ref_attn_opts_init(&opts, DEMO_D);
    const int64_t n = (int64_t)DEMO_BATCH * DEMO_HQ * DEMO_D;
    double *ref = malloc(sizeof(double) * (size_t)n);
    if (!ref)
        return cinfer__error(CINFER_STATUS_OUT_OF_MEMORY, "demo: out of host memory");
    if (cinfer__ref_batch_paged(&heads, &q, NULL, &k, &v, &table, NULL, NULL, &opts, ref, NULL)) {
        free(ref);
        return cinfer__error(CINFER_STATUS_INTERNAL, "demo: the CPU reference rejected the step");
    }
    cinfer__ref_error_t err;
    cinfer__ref_compare(CINFER__REF_DTYPE_BF16, d->out, ref, n, &err);
    *rel_err = err.rel_l2_err;
    *nonfinite = err.num_nonfinite;
    free(ref);
    return CINFER_STATUS_SUCCESS;
}

int cli_demo(int argc, char **argv) {
    if (argc > 1)
        return cli_is_help(argv[1])
                   ? cli_print_help("demo")
                   : cli_usage_error("demo", "unexpected argument \"%s\"", argv[1]);
    cinfer_context_t *ctx = NULL;
    cinfer_status_t st = cinfer_context_create(NULL, &ctx);
    if (st == CINFER_STATUS_NO_DEVICE)
        return compile_only();
    if (st != CINFER_STATUS_SUCCESS)
        return cli_fail();
    demo_t d;
    memset(&d, 0, sizeof d);
    double ms = 0, rel_err = 0;
    int64_t nonfinite = 0;
    st = cinfer__context_activate(ctx);
    if (!st)
        st = demo_alloc(ctx->cu, &d);
    if (!st)
        st = demo_run(ctx, &d, &ms);
    if (!st)
        st = demo_check(&d, &rel_err, &nonfinite);
    demo_free(ctx->cu, &d);
    cinfer_context_destroy(ctx);
    if (st)
        return cli_fail();
    const double bytes = 2.0 * (double)d.tokens * DEMO_HK * DEMO_D * 2;
    /* bf16 outputs carry 8 significant bits: a relative error of 1e-2 is the suite's bound. */
    const bool ok = nonfinite == 0 && rel_err <= 1e-2;
    printf("one decode step: %d requests, %lld KV tokens (Llama-3-8B heads 32/8, D=128, bf16, "
           "page 16)\n",
           DEMO_BATCH, (long long)d.tokens);
    printf("| time (us) | KV read (MB) | TB/s | check vs float64 CPU reference |\n");
    printf("|---|---|---|---|\n");
    printf("| %.1f | %.1f | %.2f | %s (relative L2 error %.1e) |\n", ms * 1e3, bytes / 1e6,
           bytes / (ms * 1e-3) / 1e12, ok ? "passed" : "FAILED", rel_err);
    return ok ? CLI_EXIT_OK : CLI_EXIT_FAILED;
}
