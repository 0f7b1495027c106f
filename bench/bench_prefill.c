/*
 * Single-request prefill benchmark: Llama-3-8B attention heads (32 query / 8 KV heads, D = 128),
 * bf16, causal and non-causal, S = qo_len = kv_len in {1k, 4k, 16k}, the library's choice of
 * kernel (the sm90 one on sm_90a) and the sm80 template's (cinfer__prefill_test_no_sm90); then the
 * variants at 16k causal (soft cap 30, a 4k sliding window, ALiBi, custom masks), each timed in
 * rounds that alternate it with plain causal, with the median of the rounds' ratios to plain, on
 * the library's choice and on the sm80 template (the --fp8 table too).
 *
 * FLOPs counted = 4 * S^2 * Hq * D (two GEMMs of 2 * S^2 * D per head), halved for causal
 * (PERF.md), so the figures compare directly with FlashInfer's and FlashAttention's. The window
 * row counts the FLOPs of the kept band only. The data is random (never zeros); each
 * configuration is timed with CUDA events after warm-up (S <= 4k in groups of back-to-back
 * launches) and the median is reported.
 *
 * With --trace FILE (bench/data's Azure conversation trace), batch prefill too: consecutive
 * requests of the trace, each a whole prompt (qo_len = kv_len = its context tokens), batched up
 * to about 16k and 64k tokens, over a ragged K/V and over the paged cache (page 16 or --page-size,
 * pages of a request scattered; with --consecutive-pages also a row whose pages follow each other
 * in memory, to tell the cost of the scattering from the kernel's), causal; FLOPs are the kept
 * causal pairs of every request.
 *
 * With --split, batch prefill of one request with few query rows over a long KV (ragged): the
 * split-KV plan (the KV cut into chunks so the step fills one wave of CTAs, partial states merged
 * by a second kernel) against the unsplit one of an object that never splits (the same kernel;
 * cinfer__batch_prefill_test_no_split), both timed in this run, with the chunk size the planner
 * chose. The first row is the cascade's shared prefix (bench/cascade.py: 64 rows over 8192 keys,
 * not causal). Then three of the shapes with a longer shortest chunk than the planner's
 * (cinfer__batch_prefill_test_min_chunk 1024, 2048, 4096). Then single prefill of such shapes
 * (and one that fills the GPU) through cinfer_single_prefill_with_workspace against
 * cinfer_single_prefill, per call with the host's work (the split plan's) included.
 *
 * With --pack, batch prefill of one request with GQA packing (the 4 query heads of each KV head in
 * one CTA's rows: the default for 32/8 heads) against the same object unpacked
 * (cinfer__batch_prefill_test_pack(-1)), both timed in this run, split-KV as the planner chooses:
 * the cascade's shared prefix first, then causal chunks of a few to 4096 rows.
 *
 * With --fp8 e4m3 (or e5m2), single prefill with fp8 K/V (k_scale = v_scale = 1, q and out bf16)
 * against bf16 K/V on the same shapes, both timed in this run (S = 1k, 4k and 16k, causal and
 * not), with the ratio, on the library's choice and on the sm80 template (--fp8-only skips the
 * plain and variant tables before it); the fp8 data are random finite values of magnitude 2^-3 ..
 * 1.875.
 *
 * With --head-dim 64 (or 256), every table at that D instead of 128 (Llama-3-8B's heads count
 * otherwise; D = 64 is e.g. gpt-oss's and Llama-3.2-1B's, 256 Gemma's). --head-dim 192 is D_qk /
 * D_vo = 192 / 128 (DeepSeek's prefill heads): the plain single prefill table (or --tile) and the
 * trace batches only (with a row of scattered pages on the sm80 template, the kernel that ran them
 * before developers' session 40), FLOPs 2 S^2 Hq (D_qk + D_vo), halved for causal.
 *
 * Usage: bench_prefill [--quick] [--sweep] [--split] [--pack] [--batch-only]
 *                      [--variants-only [sm80|both]] [--head-dim 64|128|192|256]
 *                      [--fp8 e4m3|e5m2 [--fp8-only]]
 *                      [--trace FILE [--consecutive-pages] [--page-size N]] [--steady MS] [--len S]
 *                      [--tile Q,KV,WARPS,STAGES[,sm90] ...].
 * --sweep
 * also times the tile configurations of the sm80 kernel and the sm90 one at S = 16k, causal,
 * non-causal and causal with soft cap 30 (the default's choice should be the fastest). --tile
 * (repeatable) times only the given tiles that way (",sm90": the sm90 kernel's), and nothing
 * else. --batch-only skips the single prefill tables (the plain, variant and fp8 ones);
 * --variants-only runs the variant table of the library's choice alone (an A/B of a variant's
 * kernel in about a third of the default run's time); --variants-only sm80 the sm80 template's,
 * --variants-only both the two. --steady MS runs each single prefill configuration back to back
 * for MS milliseconds of GPU time before timing it (the batch tables keep their warm-up): the H200
 * lowers its SM clock for its power cap within about a second of back-to-back long launches
 * (bench/RESULTS.md, developers' session 27), so without it a long row's figure depends on what ran
 * just before it (the first row of a process runs at the full clock, later ones at the capped one);
 * with it every row is timed at the clock sustained load settles to. --len S (4096..32768) puts S
 * in place of 16384 in the single prefill tables, the variant table and the sweep: at 16896 the
 * sm90 kernel's 128-row items (132 query tiles x 32 heads) fill 32 waves of the H200's 132 SMs
 * exactly, where 16384's 4096 items are 31 waves and 4 items. Prints Markdown tables.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_common.h"
#include "ops/prefill.h"

#define HQ 32
#define HK 8
/* D of q, k and v: 128, or --head-dim's */
static int hd = 128;
static int hd_vo = 128; /* v's and out's head dim: hd, or 128 with --head-dim 192 */
/* Rows per page of the paged batches: 16, or --page-size's (1..256) */
static int page_rows = 16;
/* --steady's milliseconds of back-to-back runs before each timing (0: none) */
static int steady_ms = 0;
/* The long S of the single prefill tables (their 16k rows), the variant table and the sweep:
 * 16384, or --len's */
static int64_t long_s = 16384;

/* Device buffers for the largest S, shared by every configuration. */
typedef struct buffers {
    int64_t max_s;
    CUdeviceptr q, k, v, out;
    CUdeviceptr k8, v8;     /* --fp8: fp8 K and V of max_s tokens */
    DLDataType kv8;         /* their dtype */
    CUdeviceptr slopes;     /* [2][HQ] float32 ALiBi slopes: 0.5 / (h + 1), then the paper's */
    CUdeviceptr mask;       /* max_s^2 bits, all set: a custom mask that keeps what causal keeps */
    CUdeviceptr mask_holes; /* the same with bit 31 of every word clear: each KV tile is tested */
    CUdeviceptr mask_rows;  /* row_offset (int64) and row_stride (int32) of the one request */
} buffers_t;

typedef struct workload {
    int64_t s;
    int causal;
    float soft_cap;
    int window_left;
    const char *variant; /* a built-in variant's name, or NULL */
    int fp8;             /* K/V in buffers_t's fp8 buffers instead of bf16 */
} workload_t;

/* FLOPs of the attention a workload keeps: 2 (D_qk + D_vo) (4 D when they are equal) per kept
 * (row, key) pair and query head. */
static double flops(const workload_t *w) {
    const double s = (double)w->s;
    double pairs = w->causal ? s * (s + 1) / 2 : s * s;
    if (w->window_left >= 0 && w->causal && w->window_left < w->s) {
        const double band = (double)w->window_left + 1;
        pairs = band * s - band * (band - 1) / 2;
    }
    return 2.0 * pairs * HQ * (hd + hd_vo);
}

/* One single prefill call (bench_time_groups' callback): through
 * cinfer_single_prefill_with_workspace, or through cinfer__single_prefill_config with tiles (NULL:
 * the default, cinfer_single_prefill's). */
typedef struct single_run {
    cinfer_context_t *ctx;
    const cinfer_attention_options_t *o;
    int causal;
    const DLTensor *q, *k, *v;
    DLTensor *out;
    const cinfer_args_t *args;
    const cinfer__prefill_config_t *tiles; /* without a workspace only */
    int with_workspace;
    void *workspace; /* NULL when bytes is 0 */
    size_t bytes;
    CUstream stream;
} single_run_t;

static void run_single(void *arg) {
    const single_run_t *r = arg;
    if (r->with_workspace)
        CI(cinfer_single_prefill_with_workspace(r->ctx, r->o, r->causal, r->q, r->k, r->v, r->out,
                                                NULL, r->args, r->workspace, r->bytes, r->stream));
    else
        CI(cinfer__single_prefill_config(r->ctx, r->o, r->causal, r->q, r->k, r->v, r->out, NULL,
                                         r->args, r->tiles, r->stream));
}

/* Median milliseconds of one prefill; tiles NULL = the default. Returns a negative value when
 * the tiles are refused (UNSUPPORTED), so a sweep can skip them. */
static double time_prefill(cinfer_context_t *ctx, CUstream stream, const buffers_t *b,
                           const workload_t *w, const cinfer__prefill_config_t *tiles, int iters) {
    const DLDataType bf16 = {kDLBfloat, 16, 1};
    int dev = 0;
    cinfer_context_get_device(ctx, &dev, NULL);
    int64_t q_shape[3] = {w->s, HQ, hd}, kv_shape[3] = {w->s, HK, hd};
    int64_t v_shape[3] = {w->s, HK, hd_vo}, out_shape[3] = {w->s, HQ, hd_vo};
    DLTensor tq = tensor(b->q, bf16, 3, q_shape, dev),
             tout = tensor(b->out, bf16, 3, out_shape, dev);
    const DLDataType kv_dt = w->fp8 ? b->kv8 : bf16;
    DLTensor tk = tensor(w->fp8 ? b->k8 : b->k, kv_dt, 3, kv_shape, dev);
    DLTensor tv = tensor(w->fp8 ? b->v8 : b->v, kv_dt, 3, v_shape, dev);
    cinfer_attention_options_t o = CINFER_ATTENTION_OPTIONS_INIT;
    o.q_dtype = bf16;
    o.kv_dtype = kv_dt;
    o.num_qo_heads = HQ;
    o.num_kv_heads = HK;
    o.head_dim = hd;
    o.head_dim_vo = hd_vo;
    o.logits_soft_cap = w->soft_cap;
    o.window_left = w->window_left;
    /* The ALiBi variant, with the paper's slopes (NULL) or with a slopes tensor (0.5 / (h + 1), or
     * the paper's values: the same kernel, to tell data from code); the custom mask
     * variant with a mask of all ones (the kernel reads every bit of the causal triangle), or one
     * that drops a position in 32 ("custom_mask_holes": no KV tile is kept whole, so every tile
     * takes the per-position test). */
    const int masked = w->variant && strncmp(w->variant, "custom_mask", 11) == 0;
    const int holes = masked && strcmp(w->variant, "custom_mask_holes") == 0;
    o.variant = !w->variant ? NULL
                : masked    ? cinfer_variant_builtin("custom_mask")
                            : cinfer_variant_builtin("alibi");
    int64_t slopes_shape[1] = {HQ}, mask_shape[1] = {b->max_s * b->max_s / 8}, one[1] = {1};
    const int paper = w->variant && strcmp(w->variant, "alibi_slopes_paper") == 0;
    DLTensor slopes = tensor(b->slopes + (paper ? HQ * sizeof(float) : 0),
                             (DLDataType){kDLFloat, 32, 1}, 1, slopes_shape, dev);
    DLTensor mask =
        tensor(holes ? b->mask_holes : b->mask, (DLDataType){kDLUInt, 8, 1}, 1, mask_shape, dev);
    DLTensor row_offset = tensor(b->mask_rows, (DLDataType){kDLInt, 64, 1}, 1, one, dev);
    DLTensor row_stride = tensor(b->mask_rows + 8, (DLDataType){kDLInt, 32, 1}, 1, one, dev);
    cinfer_arg_t arg_list[3] = {
        CINFER_ARG_TENSOR(w->variant && strncmp(w->variant, "alibi_slopes", 12) == 0 ? &slopes
                                                                                     : NULL),
        CINFER_ARG_I32(HQ)};
    cinfer_args_t args = {2, arg_list};
    if (masked) {
        /* One request of w->s rows at positions 0..s-1 (qo_len == kv_len): row_offset 0. */
        const int64_t offset = 0;
        const int32_t stride = (int32_t)w->s;
        CU(cuMemcpyHtoD(b->mask_rows, &offset, 8));
        CU(cuMemcpyHtoD(b->mask_rows + 8, &stride, 4));
        arg_list[0] = CINFER_ARG_TENSOR(&mask);
        arg_list[1] = CINFER_ARG_TENSOR(&row_offset);
        arg_list[2] = CINFER_ARG_TENSOR(&row_stride);
        args.num_args = 3;
    }
    const cinfer_args_t *run_args = w->variant ? &args : NULL;

    cinfer_status_t st = cinfer__single_prefill_config(ctx, &o, w->causal, &tq, &tk, &tv, &tout,
                                                       NULL, run_args, tiles, stream);
    if (st == CINFER_STATUS_UNSUPPORTED && tiles)
        return -1.0;
    CI(st);
    single_run_t run = {.ctx = ctx,
                        .o = &o,
                        .causal = w->causal,
                        .q = &tq,
                        .k = &tk,
                        .v = &tv,
                        .out = &tout,
                        .args = run_args,
                        .tiles = tiles,
                        .stream = stream};
    /* Short runs are timed in back-to-back groups, so the host's argument checks and launch
     * (a few microseconds) overlap the previous kernel instead of adding to a 30 us one. */
    const int reps = w->s <= 1024 ? 20 : w->s <= 4096 ? 4 : 1;
    /* --steady: groups of runs until steady_ms of their GPU time has passed. */
    if (steady_ms > 0) {
        CUevent e0, e1;
        CU(cuEventCreate(&e0, 0));
        CU(cuEventCreate(&e1, 0));
        for (float run_ms = 0.0f; run_ms < (float)steady_ms;) {
            float ms = 0.0f;
            CU(cuEventRecord(e0, stream));
            for (int r = 0; r < 8 * reps; r++)
                run_single(&run);
            CU(cuEventRecord(e1, stream));
            CU(cuEventSynchronize(e1));
            CU(cuEventElapsedTime(&ms, e0, e1));
            run_ms += ms > 0.0f ? ms : 1.0f;
        }
        CU(cuEventDestroy(e0));
        CU(cuEventDestroy(e1));
    }
    return bench_time_groups(stream, reps, iters, run_single, &run);
}

/* Rounds of the variant table (odd: the median is one round's). */
#define VARIANT_ROUNDS 5

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void print_row(const char *name, const workload_t *w, double ms) {
    printf("| %s | %lld | %s | %.3f | %.1f |\n", name, (long long)w->s, w->causal ? "yes" : "no",
           ms, flops(w) / (ms * 1e-3) / 1e12);
    fflush(stdout);
}

/* The ContextTokens column of the trace (CC BY 4.0, Azure LLM inference trace 2023); 0 rows if
 * the file cannot be read. */
static int load_trace(const char *path, int **out) {
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    char line[256];
    int n = 0, cap = 1024;
    int *c = malloc(sizeof(int) * (size_t)cap);
    if (!c || !fgets(line, sizeof line, f)) {
        fclose(f);
        free(c);
        return 0;
    }
    while (fgets(line, sizeof line, f)) {
        const char *comma = strchr(line, ',');
        int a = 0;
        if (!comma || sscanf(comma + 1, "%d", &a) != 1 || a < 1)
            continue;
        if (n == cap) {
            cap *= 2;
            int *grown = realloc(c, sizeof(int) * (size_t)cap);
            if (!grown)
                break;
            c = grown;
        }
        c[n++] = a;
    }
    fclose(f);
    *out = c;
    return n;
}

/* Median milliseconds of one batch prefill run over lens[batch] (whole prompts), ragged (paged 0)
 * or paged (page_rows rows per page; paged 1: each request's pages in a scattered order, 2: table
 * entry i is page i, so consecutive positions are consecutive in memory); FLOPs of the kept causal
 * pairs. */
/* One batch prefill run (bench_time_groups' callback). */
typedef struct batch_run {
    cinfer_batch_prefill_t *op;
    const DLTensor *q, *k, *v, *kv_indices;
    DLTensor *out;
    CUstream stream;
} batch_run_t;

static void run_batch(void *arg) {
    const batch_run_t *r = arg;
    CI(cinfer_batch_prefill_run(r->op, r->q, r->k, r->v, r->kv_indices, r->out, NULL, NULL,
                                r->stream));
}

static double time_batch(cinfer_context_t *ctx, CUstream stream, const buffers_t *b,
                         const int *lens, int batch, int paged, int iters, double *flop) {
    const DLDataType bf16 = {kDLBfloat, 16, 1};
    const int page = page_rows;
    int dev = 0;
    cinfer_context_get_device(ctx, &dev, NULL);
    int32_t *qo = malloc(sizeof(int32_t) * (size_t)(batch + 1));
    int32_t *kv = malloc(sizeof(int32_t) * (size_t)(batch + 1));
    int32_t *last = malloc(sizeof(int32_t) * (size_t)(batch + 1));
    qo[0] = kv[0] = 0;
    *flop = 0;
    for (int i = 0; i < batch; i++) {
        qo[i + 1] = qo[i] + lens[i];
        const int pages = (lens[i] + page - 1) / page;
        kv[i + 1] = kv[i] + (paged ? pages : lens[i]);
        last[i] = lens[i] - (pages - 1) * page;
        *flop += 2.0 * HQ * (hd + hd_vo) * (double)lens[i] * (lens[i] + 1) / 2;
    }
    const int64_t total = qo[batch];
    if (total > b->max_s) {
        fprintf(stderr, "%s: batch of %lld tokens exceeds the buffers\n", bench_name,
                (long long)total);
        exit(1);
    }
    /* The paged pool is the K/V buffers seen as pages of `page` tokens; table entry i is page
     * (7919 i) mod pool, scattered over the pool (or i mod pool with paged 2). Partial last pages
     * make the table longer than the pool, so a few entries share pages (the benchmark only reads
     * them). */
    const int64_t num_pages = b->max_s / page;
    const int64_t num_entries = kv[batch] > num_pages ? kv[batch] : num_pages;
    int32_t *indices = malloc(sizeof(int32_t) * (size_t)num_entries);
    for (int64_t i = 0; i < num_entries; i++)
        indices[i] = (int32_t)((paged == 2 ? i : i * 7919) % num_pages);
    CUdeviceptr d_indices;
    CU(cuMemAlloc(&d_indices, sizeof(int32_t) * (size_t)num_entries));
    CU(cuMemcpyHtoD(d_indices, indices, sizeof(int32_t) * (size_t)num_entries));

    cinfer_attention_options_t o = CINFER_ATTENTION_OPTIONS_INIT;
    o.num_qo_heads = HQ;
    o.num_kv_heads = HK;
    o.head_dim = hd;
    o.head_dim_vo = hd_vo;
    o.page_size = page;
    o.max_batch_size = batch;
    const cinfer_kv_storage_t storage = paged ? CINFER_KV_STORAGE_PAGED : CINFER_KV_STORAGE_RAGGED;
    size_t ws_bytes = 0;
    CI(cinfer_batch_prefill_workspace_size(ctx, &o, storage, 1, total, &ws_bytes));
    CUdeviceptr ws;
    CU(cuMemAlloc(&ws, ws_bytes));
    cinfer_batch_prefill_t *op;
    CI(cinfer_batch_prefill_create(ctx, &o, storage, 1, total, (void *)(uintptr_t)ws, ws_bytes,
                                   &op));
    CI(cinfer_batch_prefill_plan(op, qo, kv, paged ? last : NULL, batch, stream));

    /* (v and out of their own head dim at --head-dim 192) */
    int64_t q_shape[3] = {total, HQ, hd}, kv_shape[3] = {total, HK, hd};
    int64_t out_shape[3] = {total, HQ, hd_vo}, v_shape[3] = {total, HK, hd_vo};
    int64_t cache_shape[4] = {num_pages, page, HK, hd}, idx_shape[1] = {num_entries};
    int64_t v_cache_shape[4] = {num_pages, page, HK, hd_vo};
    DLTensor tq = tensor(b->q, bf16, 3, q_shape, dev),
             tout = tensor(b->out, bf16, 3, out_shape, dev);
    DLTensor tk =
        paged ? tensor(b->k, bf16, 4, cache_shape, dev) : tensor(b->k, bf16, 3, kv_shape, dev);
    DLTensor tv =
        paged ? tensor(b->v, bf16, 4, v_cache_shape, dev) : tensor(b->v, bf16, 3, v_shape, dev);
    DLTensor ti = tensor(d_indices, (DLDataType){kDLInt, 32, 1}, 1, idx_shape, dev);
    batch_run_t run = {op, &tq, &tk, &tv, paged ? &ti : NULL, &tout, stream};
    const double ms = bench_time_groups(stream, 1, iters, run_batch, &run);
    cinfer_batch_prefill_destroy(op);
    CU(cuMemFree(ws));
    CU(cuMemFree(d_indices));
    free(indices);
    free(qo);
    free(kv);
    free(last);
    return ms;
}

/* Median milliseconds of one batch prefill run of a single request, qo_len rows over kv_len
 * positions (ragged); unsplit = 1 uses an object whose plans are never split, pack its GQA
 * packing (cinfer__batch_prefill_test_pack: 0 the default, -1 none), min_chunk the shortest
 * split chunk (cinfer__batch_prefill_test_min_chunk: 0 the default).
 * *chunk: the plan's split-KV chunk size (0 = unsplit); *flop: 4 D Hq per kept (row, key). */
static double time_rows(cinfer_context_t *ctx, CUstream stream, const buffers_t *b, int qo_len,
                        int kv_len, int causal, int unsplit, int pack, int min_chunk, int iters,
                        int *chunk, double *flop) {
    const DLDataType bf16 = {kDLBfloat, 16, 1};
    int dev = 0;
    cinfer_context_get_device(ctx, &dev, NULL);
    const int32_t qo[2] = {0, qo_len}, kv[2] = {0, kv_len};
    *flop = 0;
    for (int i = 0; i < qo_len; i++) {
        const int64_t keep = causal ? (int64_t)kv_len - qo_len + i + 1 : kv_len;
        *flop += 4.0 * HQ * hd * (double)(keep < 0 ? 0 : keep > kv_len ? kv_len : keep);
    }
    cinfer_attention_options_t o = CINFER_ATTENTION_OPTIONS_INIT;
    o.num_qo_heads = HQ;
    o.num_kv_heads = HK;
    o.head_dim = hd;
    o.max_batch_size = 1;
    cinfer__batch_prefill_test_no_split(unsplit);
    cinfer__batch_prefill_test_pack(pack);
    cinfer__batch_prefill_test_min_chunk(min_chunk);
    size_t ws_bytes = 0;
    CI(cinfer_batch_prefill_workspace_size(ctx, &o, CINFER_KV_STORAGE_RAGGED, causal, qo_len,
                                           &ws_bytes));
    CUdeviceptr ws;
    CU(cuMemAlloc(&ws, ws_bytes));
    cinfer_batch_prefill_t *op;
    CI(cinfer_batch_prefill_create(ctx, &o, CINFER_KV_STORAGE_RAGGED, causal, qo_len,
                                   (void *)(uintptr_t)ws, ws_bytes, &op));
    cinfer__batch_prefill_test_no_split(false);
    cinfer__batch_prefill_test_pack(0);
    cinfer__batch_prefill_test_min_chunk(0);
    CI(cinfer_batch_prefill_plan(op, qo, kv, NULL, 1, stream));
    *chunk = cinfer__batch_prefill_chunk_size(op);
    int64_t q_shape[3] = {qo_len, HQ, hd}, kv_shape[3] = {kv_len, HK, hd};
    DLTensor tq = tensor(b->q, bf16, 3, q_shape, dev), tout = tensor(b->out, bf16, 3, q_shape, dev);
    DLTensor tk = tensor(b->k, bf16, 3, kv_shape, dev), tv = tensor(b->v, bf16, 3, kv_shape, dev);
    /* Back-to-back groups, so the host's checks and launches overlap the previous kernels. */
    batch_run_t run = {op, &tq, &tk, &tv, NULL, &tout, stream};
    const double ms = bench_time_groups(stream, 10, iters, run_batch, &run);
    cinfer_batch_prefill_destroy(op);
    CU(cuMemFree(ws));
    return ms;
}

/* Median milliseconds of one single prefill of qo_len rows over kv_len keys (32/8 heads, bf16),
 * through cinfer_single_prefill_with_workspace (with the workspace its size function asks for)
 * or cinfer_single_prefill, in back-to-back groups (so a call's host work, the split plan's
 * included, overlaps the previous kernels unless it takes longer than them). *bytes: the
 * workspace size (0: the call does not split). */
static double time_single_ws(cinfer_context_t *ctx, CUstream stream, const buffers_t *b, int qo_len,
                             int kv_len, int causal, int use_ws, int iters, size_t *bytes) {
    const DLDataType bf16 = {kDLBfloat, 16, 1};
    int dev = 0;
    cinfer_context_get_device(ctx, &dev, NULL);
    cinfer_attention_options_t o = CINFER_ATTENTION_OPTIONS_INIT;
    o.num_qo_heads = HQ;
    o.num_kv_heads = HK;
    o.head_dim = hd;
    *bytes = 0;
    CI(cinfer_single_prefill_workspace_size(ctx, &o, causal, qo_len, kv_len, bytes));
    CUdeviceptr ws = 0;
    if (*bytes)
        CU(cuMemAlloc(&ws, *bytes));
    int64_t q_shape[3] = {qo_len, HQ, hd}, kv_shape[3] = {kv_len, HK, hd};
    DLTensor tq = tensor(b->q, bf16, 3, q_shape, dev), tout = tensor(b->out, bf16, 3, q_shape, dev);
    DLTensor tk = tensor(b->k, bf16, 3, kv_shape, dev), tv = tensor(b->v, bf16, 3, kv_shape, dev);
    single_run_t run = {.ctx = ctx,
                        .o = &o,
                        .causal = causal,
                        .q = &tq,
                        .k = &tk,
                        .v = &tv,
                        .out = &tout,
                        .with_workspace = use_ws,
                        .workspace = (void *)(uintptr_t)ws,
                        .bytes = *bytes,
                        .stream = stream};
    const double ms = bench_time_groups(stream, 10, iters, run_single, &run);
    if (ws)
        CU(cuMemFree(ws));
    return ms;
}

/* "Q,KV,WARPS,STAGES" or "Q,KV,WARPS,STAGES,sm90" into *cfg; false when it is neither. */
static int parse_tile(const char *text, cinfer__prefill_config_t *cfg) {
    int n = 0;
    memset(cfg, 0, sizeof *cfg);
    if (sscanf(text, "%d,%d,%d,%d%n", &cfg->tile_q, &cfg->tile_kv, &cfg->warps, &cfg->stages, &n) !=
        4)
        return 0;
    if (strcmp(text + n, ",sm90") == 0)
        cfg->sm90 = true;
    else if (text[n] != '\0')
        return 0;
    return 1;
}

/* The tile sweep at S = 16k: tiles[0 .. num_tiles), or with tiles NULL the candidates below. */
static void sweep_table(cinfer_context_t *ctx, CUstream stream, const buffers_t *b,
                        const cinfer__prefill_config_t *tiles, int num_tiles, int quick) {
    /* Candidates around the defaults (single prefill's turn-taking tile, 256 x 64 on 8 warps in 4
     * stages, among them): rows per warp (16 or 32), KV tile, warps and stages.
     * 32 rows per warp (tile_q 128 on four warps) halves the K/V ldmatrix reads per mma;
     * 128 x 64 in 2 stages and 128 x 32 in 2..4 stages run two CTAs per SM; 256 rows on eight
     * warps run one, whose two warp groups take turns at the tensor cores from 3 stages on
     * (PINGPONG in kernels/prefill.cu). */
    static const cinfer__prefill_config_t candidates[] = {
        {128, 64, 8, 2, false}, {128, 64, 8, 3, false}, {128, 32, 8, 2, false},
        {128, 32, 8, 4, false}, {128, 64, 4, 2, false}, {128, 64, 4, 3, false},
        {128, 32, 4, 2, false}, {128, 32, 4, 3, false}, {128, 32, 4, 4, false},
        {64, 64, 4, 2, false},  {64, 64, 4, 3, false},  {64, 32, 2, 3, false},
        {256, 64, 8, 2, false}, {256, 64, 8, 3, false}, {256, 64, 8, 4, false},
        {256, 32, 8, 2, false}, {256, 32, 8, 3, false}, {128, 16, 4, 4, false},
        {64, 128, 4, 2, false}, {128, 128, 8, 2, true}, {128, 128, 8, 3, true},
        {64, 128, 4, 2, true},
    };
    /* Columns: causal, non-causal, and causal with soft cap 30 (whose kernel has other
     * register and MUFU loads, so possibly another best tile). */
    const workload_t cols[] = {{long_s, 1, 0.0f, -1, NULL, 0},
                               {long_s, 0, 0.0f, -1, NULL, 0},
                               {long_s, 1, 30.0f, -1, NULL, 0}};
    printf("\ntile sweep at S = %lld (TFLOP/s; - = does not fit the device)\n\n",
           (long long)long_s);
    printf("| tile_q | tile_kv | warps | stages | causal | non-causal | soft cap 30 causal |\n");
    printf("|---|---|---|---|---|---|---|\n");
    if (!tiles) {
        tiles = candidates;
        num_tiles = (int)(sizeof candidates / sizeof candidates[0]);
    }
    for (int i = 0; i < num_tiles; i++) {
        printf("| %d%s | %d | %d | %d |", tiles[i].tile_q, tiles[i].sm90 ? " (sm90)" : "",
               tiles[i].tile_kv, tiles[i].warps, tiles[i].stages);
        for (size_t c = 0; c < sizeof cols / sizeof cols[0]; c++) {
            const double ms = time_prefill(ctx, stream, b, &cols[c], &tiles[i], quick ? 3 : 7);
            if (ms > 0)
                printf(" %.1f |", flops(&cols[c]) / (ms * 1e-3) / 1e12);
            else
                printf(" - |");
        }
        printf("\n");
        fflush(stdout);
    }
}

int main(int argc, char **argv) {
    bench_name = "bench_prefill";
    int quick = 0, sweep = 0, split = 0, pack = 0, batch_only = 0, consecutive = 0, fp8_only = 0;
    int variants_only = 0;
    const char *trace = NULL, *fp8 = NULL;
    cinfer__prefill_config_t only[16];
    int num_only = 0;
    static const char usage[] =
        "usage: bench_prefill [--quick] [--sweep] [--split] [--pack] [--batch-only] "
        "[--variants-only [sm80|both]] [--head-dim 64|128|192|256] [--fp8 e4m3|e5m2 [--fp8-only]] "
        "[--trace FILE [--consecutive-pages] [--page-size N]] [--steady MS] [--len S] "
        "[--tile Q,KV,WARPS,STAGES[,sm90] ...]\n";
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            fputs(usage, stdout);
            return 0;
        } else if (strcmp(argv[i], "--quick") == 0)
            quick = 1;
        else if (strcmp(argv[i], "--sweep") == 0)
            sweep = 1;
        else if (strcmp(argv[i], "--split") == 0)
            split = 1;
        else if (strcmp(argv[i], "--pack") == 0)
            pack = 1;
        else if (strcmp(argv[i], "--batch-only") == 0)
            batch_only = 1;
        else if (strcmp(argv[i], "--variants-only") == 0) {
            /* an optional backend: the library's choice (default), the sm80 template or both */
            variants_only = 1;
            if (i + 1 < argc && strcmp(argv[i + 1], "sm80") == 0)
                variants_only = 2, i++;
            else if (i + 1 < argc && strcmp(argv[i + 1], "both") == 0)
                variants_only = 3, i++;
        } else if (strcmp(argv[i], "--consecutive-pages") == 0)
            consecutive = 1;
        else if (strcmp(argv[i], "--head-dim") == 0 && i + 1 < argc &&
                 (strcmp(argv[i + 1], "64") == 0 || strcmp(argv[i + 1], "128") == 0 ||
                  strcmp(argv[i + 1], "192") == 0 || strcmp(argv[i + 1], "256") == 0)) {
            hd = atoi(argv[++i]);
            hd_vo = hd == 192 ? 128 : hd;
        } else if (strcmp(argv[i], "--page-size") == 0 && i + 1 < argc && atoi(argv[i + 1]) >= 1 &&
                   atoi(argv[i + 1]) <= 256)
            page_rows = atoi(argv[++i]);
        else if (strcmp(argv[i], "--steady") == 0 && i + 1 < argc && atoi(argv[i + 1]) >= 1 &&
                 atoi(argv[i + 1]) <= 60000)
            steady_ms = atoi(argv[++i]);
        else if (strcmp(argv[i], "--len") == 0 && i + 1 < argc && atoi(argv[i + 1]) >= 4096 &&
                 atoi(argv[i + 1]) <= 32768)
            long_s = atoi(argv[++i]);
        else if (strcmp(argv[i], "--trace") == 0 && i + 1 < argc)
            trace = argv[++i];
        else if (strcmp(argv[i], "--fp8") == 0 && i + 1 < argc &&
                 (strcmp(argv[i + 1], "e4m3") == 0 || strcmp(argv[i + 1], "e5m2") == 0))
            fp8 = argv[++i];
        else if (strcmp(argv[i], "--fp8-only") == 0)
            fp8_only = 1;
        else if (strcmp(argv[i], "--tile") == 0 && i + 1 < argc && num_only < 16 &&
                 parse_tile(argv[i + 1], &only[num_only])) {
            num_only++;
            i++;
        } else {
            fprintf(stderr, "bench_prefill: unknown or incomplete argument '%s'%s\n", argv[i],
                    strcmp(argv[i], "--page-size") == 0 ? " (a page size of 1..256 rows)"
                    : strcmp(argv[i], "--steady") == 0  ? " (1..60000 milliseconds)"
                    : strcmp(argv[i], "--len") == 0     ? " (4096..32768 tokens)"
                                                        : "");
            fputs(usage, stderr);
            return 2;
        }
    }
    /* Argument errors before the device is looked for. */
    if (fp8_only && (!fp8 || batch_only || variants_only)) {
        fprintf(stderr, "bench_prefill: --fp8-only times the fp8 table: give --fp8 e4m3|e5m2, "
                        "without --batch-only or --variants-only\n");
        return 2;
    }
    if (consecutive && !trace) {
        fprintf(stderr, "bench_prefill: --consecutive-pages times trace batches: give --trace\n");
        return 2;
    }
    if (hd != hd_vo && (sweep || split || pack || variants_only || fp8)) {
        fprintf(stderr,
                "bench_prefill: --head-dim %d (D_vo %d) times the plain single prefill "
                "table, --tile and --trace's batches (with --batch-only those alone)\n",
                hd, hd_vo);
        return 2;
    }
    int *trace_lens = NULL;
    const int trace_n = trace ? load_trace(trace, &trace_lens) : 0;
    if (trace && trace_n == 0) {
        fprintf(stderr, "bench_prefill: --trace %s: no requests read from it\n", trace);
        return 2;
    }
    bench_load_driver();
    cinfer_context_t *ctx;
    CI(cinfer_context_create(NULL, &ctx));
    CI(cinfer__context_activate(ctx));
    CUstream stream;
    CU(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));

    buffers_t b;
    b.max_s = trace ? 65536 : long_s > 16384 ? long_s : 16384;
    const size_t q_bytes = (size_t)b.max_s * HQ * hd * 2, kv_bytes = (size_t)b.max_s * HK * hd * 2;
    CU(cuMemAlloc(&b.q, q_bytes));
    CU(cuMemAlloc(&b.out, q_bytes));
    CU(cuMemAlloc(&b.k, kv_bytes));
    CU(cuMemAlloc(&b.v, kv_bytes));
    fill_random(b.q, q_bytes);
    fill_random(b.k, kv_bytes);
    fill_random(b.v, kv_bytes);
    {
        float slopes[2 * HQ];
        for (int h = 0; h < HQ; h++) {
            slopes[h] = 0.5f / (float)(h + 1);
            slopes[HQ + h] = exp2f(-8.0f * (float)(h + 1) / HQ); /* the paper's, HQ a power of 2 */
        }
        CU(cuMemAlloc(&b.slopes, sizeof slopes));
        CU(cuMemcpyHtoD(b.slopes, slopes, sizeof slopes));
        CU(cuMemAlloc(&b.mask, (size_t)(b.max_s * b.max_s / 8)));
        CU(cuMemsetD8(b.mask, 0xff, (size_t)(b.max_s * b.max_s / 8)));
        CU(cuMemAlloc(&b.mask_holes, (size_t)(b.max_s * b.max_s / 8)));
        CU(cuMemsetD32Async(b.mask_holes, 0x7fffffffu, (size_t)(b.max_s * b.max_s / 32), stream));
        CU(cuMemAlloc(&b.mask_rows, 16));
    }
    b.k8 = b.v8 = 0;
    if (fp8) {
        /* kDLFloat8_e4m3fn = 10, kDLFloat8_e5m2 = 12 in DLPack 1.x (the installed dlpack.h may
         * predate the names). Bytes sign | 0x30..0x3f: finite in both encodings. */
        b.kv8 = (DLDataType){(uint8_t)(strcmp(fp8, "e4m3") == 0 ? 10 : 12), 8, 1};
        const size_t kv8_bytes = (size_t)b.max_s * HK * hd;
        unsigned char *host = malloc(kv8_bytes);
        if (!host) {
            fprintf(stderr, "%s: out of host memory\n", bench_name);
            return 1;
        }
        for (size_t i = 0; i < kv8_bytes; i++) {
            const uint64_t r = rng_next();
            host[i] = (unsigned char)((r & 0x80) | (0x30 + (r >> 8) % 16));
        }
        CU(cuMemAlloc(&b.k8, kv8_bytes));
        CU(cuMemAlloc(&b.v8, kv8_bytes));
        CU(cuMemcpyHtoD(b.k8, host, kv8_bytes));
        for (size_t i = 0; i < kv8_bytes; i++)
            host[i] ^= (unsigned char)(rng_next() & 0x87); /* V differs from K */
        CU(cuMemcpyHtoD(b.v8, host, kv8_bytes));
        free(host);
    }

    cinfer__prefill_config_t def;
    cinfer__prefill_context_config(ctx, hd, &def);
    cinfer__prefill_config_t turns;
    cinfer__prefill_turn_config(&turns);
    printf("single prefill, %d/%d heads, D = %d, bf16, %s; default tiles: tile_q %d, tile_kv %d, "
           "warps %d, stages %d; for grids of two waves or more without soft cap: tile_q %d, "
           "tile_kv %d, warps %d, stages %d (the warp groups take turns)\n\n",
           HQ, HK, hd, ctx->arch, def.tile_q, def.tile_kv, def.warps, def.stages, turns.tile_q,
           turns.tile_kv, turns.warps, turns.stages);
    if (hd != hd_vo)
        printf("(D is q's and k's head dim; v's and out's is %d)\n\n", hd_vo);
    if (num_only > 0) {
        sweep_table(ctx, stream, &b, only, num_only, quick);
        goto free_all;
    }
    if (batch_only)
        goto batch_tables;
    if (fp8_only)
        goto fp8_table;
    /* "plain": the library's choice (the sm90 kernel on sm_90a, grids of a wave or more); "plain,
     * sm80 template": the choice with the sm90 kernel left out (issue 5's figures). */
    if (!variants_only)
        printf("| workload | S | causal | time (ms) | TFLOP/s |\n|---|---|---|---|---|\n");
    const int64_t lens[] = {1024, 4096, long_s};
    for (int li = 0; li < (variants_only ? 0 : 3); li++) {
        for (int causal = 1; causal >= 0; causal--) {
            workload_t w = {lens[li], causal, 0.0f, -1, NULL, 0};
            const int iters = quick ? 5 : lens[li] >= 16384 ? 15 : 30;
            print_row("plain", &w, time_prefill(ctx, stream, &b, &w, NULL, iters));
            cinfer__prefill_test_no_sm90(true);
            print_row("plain, sm80 template", &w, time_prefill(ctx, stream, &b, &w, NULL, iters));
            cinfer__prefill_test_no_sm90(false);
        }
    }
    if (hd != hd_vo) /* D_qk != D_vo: the plain table, --tile and the trace batches only */
        goto batch_tables;
    /* The variant table once per template (the library's choice, then the sm80 template's). */
    for (int sm80 = variants_only == 2; sm80 < (variants_only == 1 ? 1 : 2); sm80++) {
        cinfer__prefill_test_no_sm90(sm80 != 0);
        /* Variants against plain causal at S = 16k, in rounds that alternate the two (plain, then
         * the variant), so that a drift of the GPU's clocks over the table (runs of one binary
         * differ by up to 10% between calls) moves both sides of a ratio alike. The ratio is that
         * of TFLOP/s (the window row's FLOPs are its band's), each round's, the median of
         * VARIANT_ROUNDS. */
        const struct {
            const char *name;
            workload_t w;
        } rows[] = {
            {"soft cap 30", {long_s, 1, 30.0f, -1, NULL, 0}},
            {"window 4k (band FLOPs)", {long_s, 1, 0.0f, 4095, NULL, 0}},
            {"alibi (variant, default slopes)", {long_s, 1, 0.0f, -1, "alibi", 0}},
            {"alibi (variant, slopes tensor)", {long_s, 1, 0.0f, -1, "alibi_slopes", 0}},
            {"alibi (variant, slopes tensor of the paper's values)",
             {long_s, 1, 0.0f, -1, "alibi_slopes_paper", 0}},
            {"custom mask (variant, causal + mask)", {long_s, 1, 0.0f, -1, "custom_mask", 0}},
            {"custom mask, 1 in 32 dropped (causal FLOPs)",
             {long_s, 1, 0.0f, -1, "custom_mask_holes", 0}},
        };
        const workload_t plain = {long_s, 1, 0.0f, -1, NULL, 0};
        const int iters = quick ? 3 : 7;
        printf("\nvariants at S = %lld, causal, each in %d rounds alternating with plain causal, "
               "%s (median times; of plain: the median of the rounds' TFLOP/s ratios)\n\n",
               (long long)long_s, VARIANT_ROUNDS,
               sm80 ? "sm80 template" : "the library's choice (sm90 kernel on sm_90a)");
        printf("| workload | S | causal | time (ms) | TFLOP/s | plain (ms) | of plain |\n"
               "|---|---|---|---|---|---|---|\n");
        for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++) {
            double tp[VARIANT_ROUNDS], tv[VARIANT_ROUNDS], ratio[VARIANT_ROUNDS];
            for (int k = 0; k < VARIANT_ROUNDS; k++) {
                tp[k] = time_prefill(ctx, stream, &b, &plain, NULL, iters);
                tv[k] = time_prefill(ctx, stream, &b, &rows[r].w, NULL, iters);
                ratio[k] = (flops(&rows[r].w) / tv[k]) / (flops(&plain) / tp[k]);
            }
            qsort(tp, VARIANT_ROUNDS, sizeof(double), cmp_double);
            qsort(tv, VARIANT_ROUNDS, sizeof(double), cmp_double);
            qsort(ratio, VARIANT_ROUNDS, sizeof(double), cmp_double);
            const double ms = tv[VARIANT_ROUNDS / 2];
            printf("| %s | %lld | yes | %.3f | %.1f | %.3f | %.1f%% |\n", rows[r].name,
                   (long long)rows[r].w.s, ms, flops(&rows[r].w) / (ms * 1e-3) / 1e12,
                   tp[VARIANT_ROUNDS / 2], 100.0 * ratio[VARIANT_ROUNDS / 2]);
            fflush(stdout);
        }
    }
    if (variants_only)
        goto free_all;

fp8_table:
    /* fp8 K/V against bf16 K/V on the library's choice (the sm90 kernel on sm_90a), then on the
     * sm80 template */
    for (int sm80 = 0; fp8 && sm80 < 2; sm80++) {
        cinfer__prefill_test_no_sm90(sm80 != 0);
        printf("\nsingle prefill, fp8 %s K/V against bf16 K/V (q and out bf16), %d/%d heads, D = "
               "%d, %s, same run\n\n",
               fp8, HQ, HK, hd,
               sm80 ? "sm80 template" : "the library's choice (sm90 kernel on sm_90a)");
        printf("| S | causal | bf16 KV (ms) | TFLOP/s | fp8 KV (ms) | TFLOP/s | fp8 / bf16 speed "
               "|\n|---|---|---|---|---|---|---|\n");
        const int64_t fp8_lens[] = {1024, 4096, long_s};
        for (int li = 0; li < 3; li++)
            for (int causal = 1; causal >= 0; causal--) {
                workload_t w = {fp8_lens[li], causal, 0.0f, -1, NULL, 0};
                workload_t w8 = w;
                w8.fp8 = 1;
                const int iters = quick ? 5 : 15;
                const double ms = time_prefill(ctx, stream, &b, &w, NULL, iters);
                const double ms8 = time_prefill(ctx, stream, &b, &w8, NULL, iters);
                printf("| %lld | %s | %.3f | %.1f | %.3f | %.1f | %.3fx |\n",
                       (long long)fp8_lens[li], causal ? "yes" : "no", ms,
                       flops(&w) / (ms * 1e-3) / 1e12, ms8, flops(&w8) / (ms8 * 1e-3) / 1e12,
                       ms / ms8);
                fflush(stdout);
            }
    }

batch_tables:;
    cinfer__prefill_test_no_sm90(false);
    if (trace_n > 0) {
        char dims[48] = "";
        if (hd != hd_vo)
            snprintf(dims, sizeof dims, " (q and k) / %d (v and out)", hd_vo);
        printf("\nbatch prefill, whole prompts of consecutive trace requests (causal, %d/%d heads, "
               "D = %d%s, bf16; paged: page %d)\n\n",
               HQ, HK, hd, dims, page_rows);
        printf("| KV | requests | tokens | mean prompt | time (ms) | TFLOP/s |\n"
               "|---|---|---|---|---|---|\n");
        static const int64_t budgets[] = {16384, 65536};
        int start = 0;
        for (int bi = 0; bi < 2; bi++) {
            /* Requests from `start` while they fit the budget (a longer prompt is skipped). */
            int req_lens[4096], n = 0;
            int64_t total = 0;
            for (int i = start; i < trace_n && n < 4096; i++) {
                if (total + trace_lens[i] > budgets[bi])
                    break;
                req_lens[n++] = trace_lens[i];
                total += trace_lens[i];
            }
            start += n;
            if (n == 0)
                continue; /* the next prompt alone exceeds the budget */
            /* At D_qk != D_vo also the scattered pages on the sm80 template (kv 3), which ran
             * them before the sm90 kernel took paged caches at 192 / 128. */
            for (int kv = 0; kv < 4; kv++) {
                if ((kv == 2 && !consecutive) || (kv == 3 && hd == hd_vo))
                    continue;
                double flop = 0;
                cinfer__prefill_test_no_sm90(kv == 3);
                const double ms = time_batch(ctx, stream, &b, req_lens, n, kv == 3 ? 1 : kv,
                                             quick ? 5 : 20, &flop);
                cinfer__prefill_test_no_sm90(false);
                static const char *const kv_names[] = {
                    "ragged", "paged", "paged, consecutive pages", "paged, sm80 template"};
                printf("| %s | %d | %lld | %.0f | %.3f | %.1f |\n", kv_names[kv], n,
                       (long long)total, (double)total / n, ms, flop / (ms * 1e-3) / 1e12);
                fflush(stdout);
            }
        }
    }
    free(trace_lens);

    if (split) {
        /* qo_len, kv_len, causal: the cascade prefix, then causal chunks of a long context. */
        static const int shapes[][3] = {
            {64, 8192, 0},  {1, 16384, 1},   {16, 16384, 1},  {64, 4096, 1},
            {64, 16384, 1}, {128, 16384, 1}, {256, 16384, 1}, {512, 16384, 1},
        };
        printf("\nbatch prefill, one request of few rows over a long KV (ragged, %d/%d heads, D = "
               "%d, bf16): split-KV against unsplit (same kernel), same run\n\n",
               HQ, HK, hd);
        printf("| qo_len | kv_len | causal | chunk | split (us) | TFLOP/s | unsplit (us) | TFLOP/s "
               "| speedup |\n|---|---|---|---|---|---|---|---|---|\n");
        for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
            int chunk = 0, unused = 0;
            double flop = 0;
            const int iters = quick ? 5 : 20;
            const double ms = time_rows(ctx, stream, &b, shapes[i][0], shapes[i][1], shapes[i][2],
                                        0, 0, 0, iters, &chunk, &flop);
            const double ms1 = time_rows(ctx, stream, &b, shapes[i][0], shapes[i][1], shapes[i][2],
                                         1, 0, 0, iters, &unused, &flop);
            printf("| %d | %d | %s | %d | %.1f | %.1f | %.1f | %.1f | %.2fx |\n", shapes[i][0],
                   shapes[i][1], shapes[i][2] ? "yes" : "no", chunk, ms * 1e3,
                   flop / (ms * 1e-3) / 1e12, ms1 * 1e3, flop / (ms1 * 1e-3) / 1e12, ms1 / ms);
            fflush(stdout);
        }
        /* The planner's shortest chunk (CINFER__PREFILL_CHUNK_MIN, an estimate) against longer
         * ones: fewer, longer CTAs and fewer partial states to write and merge. */
        static const int few[][3] = {{64, 8192, 0}, {16, 16384, 1}, {64, 16384, 1}};
        static const int mins[] = {0, 1024, 2048, 4096};
        printf("\nsplit-KV with a longer shortest chunk (us; the chunk the plan took in brackets)"
               "\n\n| qo_len | kv_len | causal | default | 1024 | 2048 | 4096 |\n"
               "|---|---|---|---|---|---|---|\n");
        for (size_t i = 0; i < sizeof few / sizeof few[0]; i++) {
            printf("| %d | %d | %s |", few[i][0], few[i][1], few[i][2] ? "yes" : "no");
            for (size_t m = 0; m < sizeof mins / sizeof mins[0]; m++) {
                int chunk = 0;
                double flop = 0;
                const double ms = time_rows(ctx, stream, &b, few[i][0], few[i][1], few[i][2], 0, 0,
                                            mins[m], quick ? 5 : 20, &chunk, &flop);
                printf(" %.1f (%d) |", ms * 1e3, chunk);
            }
            printf("\n");
            fflush(stdout);
        }
        /* Single prefill of the same shapes (and one that fills the GPU): split through a
         * workspace against cinfer_single_prefill's one launch. */
        static const int single[][3] = {{1, 16384, 1},   {16, 16384, 1},  {64, 8192, 0},
                                        {128, 16384, 1}, {256, 16384, 1}, {2048, 2048, 1}};
        printf("\nsingle prefill (%d/%d heads, D = %d, bf16): cinfer_single_prefill_with_workspace "
               "against cinfer_single_prefill, same run (us per call, host work included)\n\n"
               "| qo_len | kv_len | causal | workspace (KiB) | with it (us) | without (us) | "
               "speedup |\n|---|---|---|---|---|---|---|\n",
               HQ, HK, hd);
        for (size_t i = 0; i < sizeof single / sizeof single[0]; i++) {
            size_t bytes = 0;
            const int iters = quick ? 5 : 20;
            const double ms = time_single_ws(ctx, stream, &b, single[i][0], single[i][1],
                                             single[i][2], 1, iters, &bytes);
            const double ms1 = time_single_ws(ctx, stream, &b, single[i][0], single[i][1],
                                              single[i][2], 0, iters, &bytes);
            printf("| %d | %d | %s | %.0f | %.1f | %.1f | %.2fx |\n", single[i][0], single[i][1],
                   single[i][2] ? "yes" : "no", (double)bytes / 1024.0, ms * 1e3, ms1 * 1e3,
                   ms1 / ms);
            fflush(stdout);
        }
    }

    if (pack) {
        /* qo_len, kv_len, causal: the cascade prefix, then causal chunks of a long context. */
        static const int shapes[][3] = {
            {64, 8192, 0},   {1, 16384, 1},   {16, 16384, 1},  {64, 4096, 1},
            {256, 16384, 1}, {1024, 4096, 1}, {4096, 4096, 1},
        };
        printf("\nbatch prefill, one request over a ragged KV (%d/%d heads, D = %d, bf16): GQA "
               "packing against unpacked, same run\n\n",
               HQ, HK, hd);
        printf("| qo_len | kv_len | causal | packed (us) | TFLOP/s | unpacked (us) | TFLOP/s | "
               "speedup |\n|---|---|---|---|---|---|---|---|\n");
        for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
            int chunk = 0;
            double flop = 0;
            const int iters = quick ? 5 : 20;
            const double ms = time_rows(ctx, stream, &b, shapes[i][0], shapes[i][1], shapes[i][2],
                                        0, 0, 0, iters, &chunk, &flop);
            const double ms1 = time_rows(ctx, stream, &b, shapes[i][0], shapes[i][1], shapes[i][2],
                                         0, -1, 0, iters, &chunk, &flop);
            printf("| %d | %d | %s | %.1f | %.1f | %.1f | %.1f | %.2fx |\n", shapes[i][0],
                   shapes[i][1], shapes[i][2] ? "yes" : "no", ms * 1e3, flop / (ms * 1e-3) / 1e12,
                   ms1 * 1e3, flop / (ms1 * 1e-3) / 1e12, ms1 / ms);
            fflush(stdout);
        }
    }

    if (sweep)
        sweep_table(ctx, stream, &b, NULL, 0, quick);

free_all:
    CU(cuMemFree(b.q));
    CU(cuMemFree(b.out));
    CU(cuMemFree(b.k));
    CU(cuMemFree(b.v));
    CU(cuMemFree(b.slopes));
    CU(cuMemFree(b.mask));
    CU(cuMemFree(b.mask_holes));
    CU(cuMemFree(b.mask_rows));
    if (fp8) {
        CU(cuMemFree(b.k8));
        CU(cuMemFree(b.v8));
    }
    cu->cuStreamDestroy(stream);
    cinfer_context_destroy(ctx);
    return 0;
}
