/*
 * Batch and single decode against the float64 CPU reference: layouts, page sizes, GQA ratios,
 * head dims, dtypes (fp8 KV too), soft cap, sliding window, empty and tiny requests, one very long
 * request (split-KV), 64-bit page addressing, CUDA graph capture and replay after re-planning,
 * in-kernel RoPE, and argument errors. Every output is poisoned before the run and surrounded by
 * canaries; every KV slot that no request owns holds NaN, so a read of a wrong page or slot shows
 * up as NaN.
 */
#include "support/gpu.h"
#include "support/variants.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static cinfer_context_t *ctx;
static CUstream stream;
/* CINFER_TEST_DECODE_TC=1 (a second ctest entry) runs every case the tensor-core kernel supports
 * on it; the others, and every case by default, run on the CUDA-core kernel. */
static int force_tensor_cores;
static const cinfer__cuda_t *cu;
/* Default attention, for checks of runs made without a variant. */
static tv_state no_variant;

typedef struct decode_case {
    const char *desc;
    int batch;
    const int *lens; /* NULL: random in [0, max_len] */
    int max_len;
    int hq, hk, d, page_size;
    cinfer_kv_layout_t layout;
    int combined; /* one [pages, 2, ...] cache */
    cinfer__dtype_t q_dtype, kv_dtype;
    float soft_cap, sm_scale, k_scale, v_scale;
    int window_left;
    int lse;
    int extra_pages;              /* unowned (NaN) pages in the pool */
    int64_t page_index_base;      /* added to every page index on the device (64-bit addressing) */
    tv_kind variant;              /* TV_NONE: default attention */
    int rope;                     /* in-kernel RoPE (pos_encoding_mode = ROPE_LLAMA) */
    float rope_scale, rope_theta; /* with rope; 0: the defaults 1 and 1e4 */
} decode_case;

static decode_case base_case(const char *desc) {
    decode_case c;
    memset(&c, 0, sizeof c);
    c.desc = desc;
    c.batch = 5;
    c.max_len = 2000;
    c.hq = 32;
    c.hk = 8;
    c.d = 128;
    c.page_size = 16;
    c.layout = CINFER_KV_LAYOUT_NHD;
    c.q_dtype = CINFER__DT_BF16;
    c.kv_dtype = CINFER__DT_BF16;
    c.k_scale = c.v_scale = 1.0f;
    c.window_left = -1;
    c.lse = 1;
    c.extra_pages = 7;
    return c;
}

/* Everything one case needs on the host and the device. */
typedef struct decode_data {
    int batch;
    int *lens;
    int32_t *indptr, *indices, *last;
    int64_t max_pages, total_pages, page_elems;
    unsigned char *cache; /* host copy of the whole pool (K then V, or combined) */
    size_t cache_bytes, q_bytes, out_bytes, lse_bytes;
    unsigned char *q;
    cinfer_test_buf d_cache, d_q, d_out, d_lse, d_indptr, d_indices, d_last, d_ws;
} decode_data;

static void free_data(decode_data *x) {
    free(x->lens);
    free(x->indptr);
    free(x->indices);
    free(x->last);
    free(x->cache);
    free(x->q);
    cinfer_test_buf_free(&x->d_cache);
    cinfer_test_buf_free(&x->d_q);
    cinfer_test_buf_free(&x->d_out);
    cinfer_test_buf_free(&x->d_lse);
    cinfer_test_buf_free(&x->d_indptr);
    cinfer_test_buf_free(&x->d_indices);
    cinfer_test_buf_free(&x->d_last);
    cinfer_test_buf_free(&x->d_ws);
    memset(x, 0, sizeof *x);
}

/* Element strides of the paged pool: (page, slot, head) for K; V is K's data plus v_offset. */
static void pool_strides(const decode_case *c, int64_t *s_page, int64_t *s_slot, int64_t *s_head,
                         int64_t *v_offset, int64_t max_pages) {
    const int64_t page = (int64_t)c->page_size * c->hk * c->d;
    if (c->layout == CINFER_KV_LAYOUT_NHD) {
        *s_slot = (int64_t)c->hk * c->d;
        *s_head = c->d;
    } else {
        *s_head = (int64_t)c->page_size * c->d;
        *s_slot = c->d;
    }
    *s_page = c->combined ? 2 * page : page;
    *v_offset = c->combined ? page : max_pages * page;
}

/* Makes lengths, a scattered page table and the KV pool (NaN outside owned slots). */
static void make_data(const decode_case *c, cinfer_test_rng *rng, decode_data *x) {
    memset(x, 0, sizeof *x);
    x->batch = c->batch;
    x->lens = calloc((size_t)c->batch + 1, sizeof(int));
    x->indptr = calloc((size_t)c->batch + 1, sizeof(int32_t));
    x->last = calloc((size_t)c->batch + 1, sizeof(int32_t));
    for (int b = 0; b < c->batch; b++)
        x->lens[b] =
            c->lens ? c->lens[b] : (int)cinfer_test_rng_below(rng, (uint64_t)c->max_len + 1);
    for (int b = 0; b < c->batch; b++) {
        int pages = (x->lens[b] + c->page_size - 1) / c->page_size;
        x->indptr[b + 1] = x->indptr[b] + pages;
        x->last[b] = pages ? x->lens[b] - (pages - 1) * c->page_size : 0;
    }
    x->total_pages = x->indptr[c->batch];
    x->max_pages = x->total_pages + c->extra_pages;
    int32_t *perm = malloc(sizeof(int32_t) * (size_t)(x->max_pages + 1));
    for (int64_t i = 0; i < x->max_pages; i++)
        perm[i] = (int32_t)i;
    for (int64_t i = x->max_pages - 1; i > 0; i--) {
        int64_t j = (int64_t)cinfer_test_rng_below(rng, (uint64_t)i + 1);
        int32_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    x->indices = perm;

    const size_t esz = cinfer__dtype_size(c->kv_dtype);
    x->page_elems = (int64_t)c->page_size * c->hk * c->d;
    x->cache_bytes = (size_t)(2 * x->max_pages * x->page_elems) * esz;
    x->cache = malloc(x->cache_bytes + 1);
    memset(x->cache, 0xff, x->cache_bytes); /* NaN in every dtype (e4m3: 0xff is NaN) */
    int64_t s_page, s_slot, s_head, v_off;
    pool_strides(c, &s_page, &s_slot, &s_head, &v_off, x->max_pages);
    const double range =
        c->kv_dtype == CINFER__DT_E4M3 || c->kv_dtype == CINFER__DT_E5M2 ? 3.0 : 1.0;
    for (int b = 0; b < c->batch; b++) {
        for (int t = 0; t < x->lens[b]; t++) {
            int64_t page = x->indices[x->indptr[b] + t / c->page_size];
            int64_t slot = t % c->page_size;
            for (int h = 0; h < c->hk; h++) {
                for (int kv = 0; kv < 2; kv++) {
                    int64_t off = page * s_page + slot * s_slot + h * s_head + (kv ? v_off : 0);
                    for (int i = 0; i < c->d; i++)
                        cinfer_test_store(c->kv_dtype, x->cache, off + i,
                                          cinfer_test_rng_uniform(rng, -range, range));
                }
            }
        }
    }
    const int64_t q_elems = (int64_t)c->batch * c->hq * c->d;
    x->q_bytes = (size_t)q_elems * 2;
    x->q = malloc(x->q_bytes + 2);
    cinfer_test_fill_uniform(rng, c->q_dtype, q_elems, -1.0, 1.0, x->q, NULL);
    x->out_bytes = x->q_bytes;
    x->lse_bytes = (size_t)c->batch * c->hq * sizeof(float);
}

static cinfer_attention_options_t options_for(const decode_case *c, int max_batch) {
    cinfer_attention_options_t o = CINFER_ATTENTION_OPTIONS_INIT;
    o.num_qo_heads = c->hq;
    o.num_kv_heads = c->hk;
    o.head_dim = c->d;
    o.page_size = c->page_size;
    o.kv_layout = c->layout;
    o.q_dtype = cinfer_test_dl_dtype(c->q_dtype);
    o.kv_dtype = cinfer_test_dl_dtype(c->kv_dtype);
    o.sm_scale = c->sm_scale;
    o.logits_soft_cap = c->soft_cap;
    o.window_left = c->window_left;
    o.k_scale = c->k_scale;
    o.v_scale = c->v_scale;
    o.max_batch_size = max_batch;
    const int fp8 = c->kv_dtype == CINFER__DT_E4M3 || c->kv_dtype == CINFER__DT_E5M2;
    const int tc_possible =
        (c->q_dtype == c->kv_dtype || fp8) && (c->d == 64 || c->d == 128 || c->d == 256);
    /* RoPE runs on the CUDA-core kernel only (the tensor-core one rejects it). */
    o.use_tensor_cores = force_tensor_cores && tc_possible && !c->rope ? 1 : 0;
    if (c->rope) {
        o.pos_encoding_mode = CINFER_POS_ENCODING_ROPE_LLAMA;
        if (c->rope_scale > 0)
            o.rope_scale = c->rope_scale;
        if (c->rope_theta > 0)
            o.rope_theta = c->rope_theta;
    }
    return o;
}

/* The reference's RoPE fields for a case. */
static void ref_rope(const decode_case *c, cinfer__ref_attn_opts_t *opts) {
    opts->rope_llama = c->rope != 0;
    opts->rope_scale = c->rope_scale > 0 ? c->rope_scale : 1.0;
    opts->rope_theta = c->rope_theta > 0 ? c->rope_theta : 1e4;
}

/* The reference output [batch, Hq, D] and lse [batch, Hq] for the case's data. */
static void reference(const decode_case *c, const decode_data *x, const tv_state *tv, double *o,
                      double *lse, double *logits) {
    cinfer__ref_heads_t heads = {c->hq, c->hk, c->d, c->d};
    cinfer__ref_strided3_t q;
    cinfer__ref_strided3_packed(&q, x->q, cinfer_test_ref_dtype_of(c->q_dtype),
                                CINFER__REF_LAYOUT_NHD, c->batch, c->hq, c->d);
    int64_t s_page, s_slot, s_head, v_off;
    pool_strides(c, &s_page, &s_slot, &s_head, &v_off, x->max_pages);
    const size_t esz = cinfer__dtype_size(c->kv_dtype);
    cinfer__ref_paged_t k = {
        x->cache, cinfer_test_ref_dtype_of(c->kv_dtype), s_page, s_slot, s_head, 1};
    cinfer__ref_paged_t v = {x->cache + (size_t)v_off * esz,
                             cinfer_test_ref_dtype_of(c->kv_dtype),
                             s_page,
                             s_slot,
                             s_head,
                             1};
    cinfer__ref_page_table_t table = {c->batch,  c->page_size, x->max_pages,
                                      x->indptr, x->indices,   x->last};
    cinfer__ref_attn_opts_t opts;
    cinfer__ref_attn_opts_init(&opts, c->d);
    if (c->sm_scale > 0)
        opts.sm_scale = c->sm_scale;
    opts.k_scale = c->k_scale;
    opts.v_scale = c->v_scale;
    opts.logits_soft_cap = c->soft_cap;
    opts.window_left = c->window_left;
    ref_rope(c, &opts);
    tv_ref_opts(tv, -1, &opts);
    opts.logits_out = logits;
    /* The user variant's mask: one row per request at position kv_len - 1. */
    uint8_t *mask = NULL;
    if (tv->kind == TV_USER) {
        int64_t total = 0;
        for (int b = 0; b < c->batch; b++)
            total += x->lens[b];
        mask = malloc((size_t)total + 1);
        for (int b = 0, at = 0; b < c->batch; at += x->lens[b], b++)
            for (int j = 0; j < x->lens[b]; j++)
                mask[at + j] = (uint8_t)tv_user_keep(x->lens[b] - 1, j);
    }
    int rc = cinfer__ref_batch_paged(&heads, &q, NULL, &k, &v, &table,
                                     tv->kind == TV_MASK ? tv->mask : mask, NULL, &opts, o, lse);
    free(mask);
    if (rc != 0)
        fail_msg("%s: the reference failed (%d)", c->desc, rc);
}

/* Uploads a case's data into (possibly pre-allocated, larger) device buffers. */
static void upload(const decode_case *c, decode_data *x, int alloc) {
    const size_t idx_bytes = sizeof(int32_t) * (size_t)(x->total_pages + 1);
    if (alloc) {
        CINFER_TEST_OK(cinfer_test_buf_alloc(&x->d_cache, x->cache_bytes));
        CINFER_TEST_OK(cinfer_test_buf_alloc(&x->d_q, x->q_bytes));
        CINFER_TEST_OK(cinfer_test_buf_alloc(&x->d_out, x->out_bytes));
        CINFER_TEST_OK(cinfer_test_buf_alloc(&x->d_lse, x->lse_bytes));
        CINFER_TEST_OK(
            cinfer_test_buf_alloc(&x->d_indptr, sizeof(int32_t) * (size_t)(c->batch + 1)));
        CINFER_TEST_OK(cinfer_test_buf_alloc(&x->d_indices, idx_bytes));
        CINFER_TEST_OK(cinfer_test_buf_alloc(&x->d_last, sizeof(int32_t) * (size_t)(c->batch + 1)));
    }
    CINFER_TEST_OK(cinfer_test_buf_upload(&x->d_cache, 0, x->cache, x->cache_bytes));
    CINFER_TEST_OK(cinfer_test_buf_upload(&x->d_q, 0, x->q, x->q_bytes));
    CINFER_TEST_OK(cinfer_test_buf_upload(&x->d_indptr, 0, x->indptr,
                                          sizeof(int32_t) * (size_t)(c->batch + 1)));
    /* Device page indices carry page_index_base; the tensors' data pointers are moved back by as
     * many pages, so addresses land in the same memory while the index arithmetic needs 64 bits. */
    int32_t *dev_idx = malloc(idx_bytes);
    for (int64_t i = 0; i < x->total_pages; i++)
        dev_idx[i] = (int32_t)(x->indices[i] + c->page_index_base);
    if (x->total_pages)
        CINFER_TEST_OK(cinfer_test_buf_upload(&x->d_indices, 0, dev_idx,
                                              sizeof(int32_t) * (size_t)x->total_pages));
    free(dev_idx);
    CINFER_TEST_OK(
        cinfer_test_buf_upload(&x->d_last, 0, x->last, sizeof(int32_t) * (size_t)c->batch));
    CINFER_TEST_OK(cinfer_test_buf_poison(&x->d_out));
    CINFER_TEST_OK(cinfer_test_buf_poison(&x->d_lse));
}

typedef struct decode_tensors {
    cinfer_test_tensor q, k, v, indptr, indices, last, out, lse;
} decode_tensors;

/* A batch decode object over a workspace of exactly workspace_size bytes (x->d_ws), planned for
 * x's first `batch` requests. */
static cinfer_batch_decode_t *create_planned(const cinfer_attention_options_t *o, decode_data *x,
                                             int batch) {
    size_t ws_bytes = 0;
    CINFER_TEST_OK(cinfer_batch_decode_workspace_size(ctx, o, &ws_bytes));
    CINFER_TEST_OK(cinfer_test_buf_alloc(&x->d_ws, ws_bytes));
    cinfer_batch_decode_t *op = NULL;
    CINFER_TEST_OK(
        cinfer_batch_decode_create(ctx, o, (void *)(uintptr_t)x->d_ws.ptr, ws_bytes, &op));
    CINFER_TEST_OK(cinfer_batch_decode_plan(op, x->indptr, x->last, batch, stream));
    return op;
}

static void make_tensors(const decode_case *c, decode_data *x, decode_tensors *t) {
    const int64_t q_shape[3] = {c->batch, c->hq, c->d};
    cinfer_test_tensor_init(&t->q, &x->d_q, 0, 0, c->q_dtype, 3, q_shape, NULL);
    cinfer_test_tensor_init(&t->out, &x->d_out, 0, 0, c->q_dtype, 3, q_shape, NULL);
    const int64_t lse_shape[2] = {c->batch, c->hq};
    cinfer_test_tensor_init(&t->lse, &x->d_lse, 0, 0, CINFER__DT_F32, 2, lse_shape, NULL);
    const int64_t pages = x->max_pages + c->page_index_base;
    const size_t esz = cinfer__dtype_size(c->kv_dtype);
    int64_t s_page, s_slot, s_head, v_off;
    pool_strides(c, &s_page, &s_slot, &s_head, &v_off, x->max_pages);
    /* Shift the data pointer back by page_index_base pages (see upload). */
    cinfer_test_buf shifted = x->d_cache;
    shifted.ptr -= (CUdeviceptr)(c->page_index_base * s_page * (int64_t)esz);
    if (c->combined) {
        int64_t shape[5], strides[5];
        shape[0] = pages;
        shape[1] = 2;
        strides[0] = s_page;
        strides[1] = v_off;
        if (c->layout == CINFER_KV_LAYOUT_NHD) {
            shape[2] = c->page_size, shape[3] = c->hk;
            strides[2] = s_slot, strides[3] = s_head;
        } else {
            shape[2] = c->hk, shape[3] = c->page_size;
            strides[2] = s_head, strides[3] = s_slot;
        }
        shape[4] = c->d;
        strides[4] = 1;
        cinfer_test_tensor_init(&t->k, &shifted, 0, 0, c->kv_dtype, 5, shape, strides);
    } else {
        int64_t shape[4] = {pages, 0, 0, c->d};
        if (c->layout == CINFER_KV_LAYOUT_NHD)
            shape[1] = c->page_size, shape[2] = c->hk;
        else
            shape[1] = c->hk, shape[2] = c->page_size;
        cinfer_test_tensor_init(&t->k, &shifted, 0, 0, c->kv_dtype, 4, shape, NULL);
        cinfer_test_buf vbuf = shifted;
        vbuf.ptr += (CUdeviceptr)(v_off * (int64_t)esz);
        cinfer_test_tensor_init(&t->v, &vbuf, 0, 0, c->kv_dtype, 4, shape, NULL);
    }
    const int64_t indptr_shape[1] = {c->batch + 1}, last_shape[1] = {c->batch},
                  idx_shape[1] = {x->total_pages};
    cinfer_test_tensor_init(&t->indptr, &x->d_indptr, 0, 0, CINFER__DT_I32, 1, indptr_shape, NULL);
    cinfer_test_tensor_init(&t->indices, &x->d_indices, 0, 0, CINFER__DT_I32, 1, idx_shape, NULL);
    cinfer_test_tensor_init(&t->last, &x->d_last, 0, 0, CINFER__DT_I32, 1, last_shape, NULL);
}

/* Downloads out/lse and compares them with the reference; checks every canary. */
/* The longest request + 1: the per-head stride of the dumped logits (tv_setup in run_case). */
static int64_t dump_stride(const decode_case *c, const decode_data *x) {
    int64_t L = 1;
    for (int b = 0; b < c->batch; b++)
        L = x->lens[b] + 1 > L ? x->lens[b] + 1 : L;
    return L;
}

static void check_outputs(const decode_case *c, decode_data *x, uint64_t seed, tv_state *tv) {
    const int64_t n = (int64_t)c->batch * c->hq * c->d, rows = (int64_t)c->batch * c->hq;
    double *ref_o = malloc(sizeof(double) * (size_t)(n + 1));
    double *ref_lse = malloc(sizeof(double) * (size_t)(rows + 1));
    double *ref_logits = NULL;
    if (tv->kind == TV_DUMP) {
        int64_t total = 0;
        for (int b = 0; b < c->batch; b++)
            total += (int64_t)c->hq * x->lens[b];
        ref_logits = malloc(sizeof(double) * (size_t)(total + 1));
    }
    reference(c, x, tv, ref_o, ref_lse, ref_logits);
    if (ref_logits) {
        /* The reference's blocks are [Hq, kv_len_b] per request; the kernel's rows are
         * b * Hq * L + h * L + j. Every kept position (finite reference) was dumped. */
        tv_download_logits(tv);
        const int64_t L = dump_stride(c, x);
        for (int b = 0, at = 0; b < c->batch; at += c->hq * x->lens[b], b++)
            for (int h = 0; h < c->hq; h++)
                for (int j = 0; j < x->lens[b]; j++) {
                    const double r = ref_logits[at + (int64_t)h * x->lens[b] + j];
                    if (!isfinite(r))
                        continue;
                    const double g = tv->logits[((int64_t)b * c->hq + h) * L + j];
                    if (!(fabs(g - r) <= 2e-3 * (1.0 + fabs(r))))
                        fail_msg("%s: dumped logit of request %d head %d key %d is %g, expected %g "
                                 "(seed %llu)",
                                 c->desc, b, h, j, g, r, (unsigned long long)seed);
                }
        free(ref_logits);
    }
    unsigned char *out = malloc(x->out_bytes + 1);
    float *lse = malloc(x->lse_bytes + 4);
    CINFER_TEST_OK(cinfer_test_buf_download(&x->d_out, 0, out, x->out_bytes));
    CINFER_TEST_OK(cinfer_test_buf_download(&x->d_lse, 0, lse, x->lse_bytes));
    CINFER_TEST_ASSERT_CLOSE(cinfer_test_compare(c->q_dtype, out, ref_o, n,
                                                 cinfer_test_value_tolerance(c->q_dtype),
                                                 tv_max_abs_tol(tv, ref_o, n), 1e-3),
                             "out", c->desc, seed);
    if (c->lse)
        CINFER_TEST_ASSERT_LSE_CLOSE(cinfer_test_compare_lse(lse, ref_lse, rows, 1e-4), "lse",
                                     c->desc, seed);
    cinfer_test_buf *bufs[] = {&x->d_cache,  &x->d_q,       &x->d_out,  &x->d_lse,
                               &x->d_indptr, &x->d_indices, &x->d_last, &x->d_ws};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]->base)
            CINFER_TEST_OK(cinfer_test_buf_check_canaries(bufs[i]));
    free(ref_o);
    free(ref_lse);
    free(out);
    free(lse);
}

/* Plans and runs one case end to end and checks it. */
static void run_case(const decode_case *c, uint64_t seed) {
    cinfer_test_case(c->desc);
    cinfer_test_rng rng;
    cinfer_test_rng_init(&rng, seed);
    decode_data x;
    make_data(c, &rng, &x);
    upload(c, &x, 1);
    cinfer_attention_options_t o = options_for(c, c->batch > 0 ? c->batch : 1);
    tv_state tv;
    {
        const int64_t L = dump_stride(c, &x);
        int64_t *row_offset = malloc(sizeof(int64_t) * (size_t)(c->batch + 1));
        for (int b = 0; b < c->batch; b++)
            row_offset[b] = (int64_t)b * c->hq * L;
        tv_setup(&tv, c->variant, c->hq, &rng, (int64_t)c->batch * c->hq * L + 1, c->batch,
                 row_offset, L, 0);
        free(row_offset);
        if (c->variant == TV_MASK) {
            int *ones = malloc(sizeof(int) * (size_t)(c->batch + 1));
            for (int b = 0; b < c->batch; b++)
                ones[b] = 1;
            tv_setup_mask(&tv, &rng, c->batch, ones, x.lens);
            free(ones);
        }
    }
    o.variant = tv.variant;
    cinfer_batch_decode_t *op = create_planned(&o, &x, c->batch);
    decode_tensors t;
    make_tensors(c, &x, &t);
    /* Twice on one plan: a run must not depend on what an earlier run left in the workspace. */
    for (int rep = 0; rep < 2; rep++)
        CINFER_TEST_OK(cinfer_batch_decode_run(op, &t.q.t, &t.k.t, c->combined ? NULL : &t.v.t,
                                               &t.indptr.t, &t.indices.t, &t.last.t, &t.out.t,
                                               c->lse ? &t.lse.t : NULL, tv_args(&tv), stream));
    CINFER_TEST_SYNC(stream);
    check_outputs(c, &x, seed, &tv);
    if (!c->lse) {
        /* lse was not asked for: its buffer must still hold the poison. */
        float *lse = malloc(x.lse_bytes + 4);
        CINFER_TEST_OK(cinfer_test_buf_download(&x.d_lse, 0, lse, x.lse_bytes));
        for (int64_t i = 0; i < (int64_t)c->batch * c->hq; i++)
            assert_true(isnan(lse[i]));
        free(lse);
    }
    cinfer_batch_decode_destroy(op);
    tv_free(&tv);
    free_data(&x);
}

static void basic_llama_heads(void **state) {
    (void)state;
    decode_case c = base_case("llama3-8b heads, bf16, page 16, NHD");
    c.batch = 7;
    run_case(&c, cinfer_test_seed());
}

static void layouts_and_page_sizes(void **state) {
    (void)state;
    static const int pages[] = {1, 3, 16, 64, 256};
    for (int layout = 0; layout < 2; layout++) {
        for (int combined = 0; combined < 2; combined++) {
            for (size_t p = 0; p < sizeof pages / sizeof pages[0]; p++) {
                char desc[128];
                snprintf(desc, sizeof desc, "%s%s page %d", layout ? "HND" : "NHD",
                         combined ? " combined" : "", pages[p]);
                decode_case c = base_case(desc);
                c.layout = (cinfer_kv_layout_t)layout;
                c.combined = combined;
                c.page_size = pages[p];
                c.hq = 8;
                c.hk = 2;
                c.batch = 4;
                c.max_len = 700;
                run_case(&c,
                         cinfer_test_seed() + (uint64_t)(layout * 100 + combined * 10 + (int)p));
            }
        }
    }
}

static void gqa_groups_and_head_dims(void **state) {
    (void)state;
    static const int heads[][2] = {{8, 8},  {10, 2}, {7, 1},  {16, 1},
                                   {64, 1}, {24, 2}, {33, 3}, {1, 1}};
    for (size_t i = 0; i < sizeof heads / sizeof heads[0]; i++) {
        char desc[96];
        snprintf(desc, sizeof desc, "Hq %d Hk %d", heads[i][0], heads[i][1]);
        decode_case c = base_case(desc);
        c.hq = heads[i][0];
        c.hk = heads[i][1];
        c.batch = 3;
        c.max_len = 1500;
        run_case(&c, cinfer_test_seed() + 1000 + i);
    }
    static const int dims[] = {32, 48, 64, 80, 96, 112, 160, 192, 256};
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++) {
        char desc[96];
        snprintf(desc, sizeof desc, "head dim %d", dims[i]);
        decode_case c = base_case(desc);
        c.d = dims[i];
        c.hq = 8;
        c.hk = 2;
        c.batch = 3;
        c.max_len = 900;
        run_case(&c, cinfer_test_seed() + 2000 + i);
    }
}

static void dtypes_and_scales(void **state) {
    (void)state;
    struct {
        cinfer__dtype_t q, kv;
        float k_scale, v_scale;
    } combos[] = {{CINFER__DT_F16, CINFER__DT_F16, 1, 1},
                  {CINFER__DT_BF16, CINFER__DT_F16, 1, 1},
                  {CINFER__DT_BF16, CINFER__DT_E4M3, 0.7f, 1.3f},
                  {CINFER__DT_F16, CINFER__DT_E4M3, 0.25f, 2.0f},
                  {CINFER__DT_BF16, CINFER__DT_E5M2, 0.5f, 0.9f}};
    for (size_t i = 0; i < sizeof combos / sizeof combos[0]; i++) {
        char desc[96];
        snprintf(desc, sizeof desc, "q %s kv %s scales %.2f/%.2f", cinfer__dtype_name(combos[i].q),
                 cinfer__dtype_name(combos[i].kv), combos[i].k_scale, combos[i].v_scale);
        decode_case c = base_case(desc);
        c.q_dtype = combos[i].q;
        c.kv_dtype = combos[i].kv;
        c.k_scale = combos[i].k_scale;
        c.v_scale = combos[i].v_scale;
        c.batch = 6;
        run_case(&c, cinfer_test_seed() + 3000 + i);
    }
}

/* fp8 KV (e4m3 and e5m2, with k_scale and v_scale) over both layouts, page sizes 1 to 64, GQA
 * groups 4 and 8 and head dims 64, 128 and 256, plus 16 query heads a KV head at D = 256 and one
 * long request (split-KV); with CINFER_TEST_DECODE_TC=1 they run on the tensor-core kernel's fp8
 * path, whose 32-token tiles the random lengths end anywhere inside. */
static void fp8_layouts_pages_groups_and_head_dims(void **state) {
    (void)state;
    static const cinfer__dtype_t kvs[] = {CINFER__DT_E4M3, CINFER__DT_E5M2};
    static const int pages[] = {1, 3, 16, 64};
    static const int groups[] = {4, 8};
    static const int dims[] = {64, 128, 256};
    int n = 0;
    for (int k = 0; k < 2; k++) {
        for (int layout = 0; layout < 2; layout++) {
            for (int gi = 0; gi < 2; gi++) {
                for (int di = 0; di < 3; di++, n++) {
                    char desc[128];
                    decode_case c = base_case(desc);
                    c.kv_dtype = kvs[k];
                    c.q_dtype = n % 2 ? CINFER__DT_F16 : CINFER__DT_BF16;
                    c.layout = (cinfer_kv_layout_t)layout;
                    c.combined = n % 3 == 0;
                    c.page_size = pages[n % 4];
                    c.hk = 2;
                    c.hq = c.hk * groups[gi];
                    c.d = dims[di];
                    c.k_scale = 0.6f;
                    c.v_scale = 1.4f;
                    c.batch = 3;
                    c.max_len = 700;
                    snprintf(desc, sizeof desc, "q %s kv %s %s%s page %d Hq %d Hk %d D %d",
                             cinfer__dtype_name(c.q_dtype), cinfer__dtype_name(c.kv_dtype),
                             layout ? "HND" : "NHD", c.combined ? " combined" : "", c.page_size,
                             c.hq, c.hk, c.d);
                    run_case(&c, cinfer_test_seed() + 3500 + (uint64_t)n);
                }
            }
        }
    }
    decode_case w = base_case("kv e5m2, 16 query heads on one KV head, D 256");
    w.kv_dtype = CINFER__DT_E5M2;
    w.hq = 16;
    w.hk = 1;
    w.d = 256;
    w.batch = 3;
    w.max_len = 900;
    run_case(&w, cinfer_test_seed() + 3599);
    static const int lens[] = {50000, 7, 33};
    decode_case l = base_case("kv e4m3, one long request (split-KV) and two short ones");
    l.kv_dtype = CINFER__DT_E4M3;
    l.k_scale = 0.8f;
    l.v_scale = 1.2f;
    l.batch = 3;
    l.lens = lens;
    run_case(&l, cinfer_test_seed() + 3600);
}

/* The tensor-core kernel copies fp8 rows in 16-byte chunks: a cache 8 bytes off a 16-byte
 * boundary is refused there (the CUDA-core kernel reads fp8 in 8-byte pieces and takes it). */
static void fp8_rows_on_tensor_cores_need_16_bytes(void **state) {
    (void)state;
    decode_case c = base_case("fp8 cache 8 bytes off a 16-byte boundary, tensor cores");
    c.kv_dtype = CINFER__DT_E4M3;
    c.batch = 2;
    c.hq = 8;
    c.hk = 2;
    cinfer_test_rng rng;
    cinfer_test_rng_init(&rng, cinfer_test_seed() + 3700);
    decode_data x;
    make_data(&c, &rng, &x);
    upload(&c, &x, 1);
    cinfer_attention_options_t o = options_for(&c, c.batch);
    o.use_tensor_cores = 1;
    cinfer_batch_decode_t *op = create_planned(&o, &x, c.batch);
    decode_tensors t;
    make_tensors(&c, &x, &t);
    t.k.t.byte_offset += 8;
    t.v.t.byte_offset += 8;
    assert_int_equal(cinfer_batch_decode_run(op, &t.q.t, &t.k.t, &t.v.t, &t.indptr.t, &t.indices.t,
                                             &t.last.t, &t.out.t, &t.lse.t, NULL, stream),
                     CINFER_STATUS_UNSUPPORTED);
    assert_non_null(strstr(cinfer_last_error(), "16-byte aligned"));
    CINFER_TEST_SYNC(stream);
    CINFER_TEST_OK(cinfer_test_buf_check_poisoned(&x.d_out, x.out_bytes));
    cinfer_batch_decode_destroy(op);
    free_data(&x);
}

static void soft_cap_window_and_scale(void **state) {
    (void)state;
    decode_case c = base_case("soft cap 30");
    c.soft_cap = 30.0f;
    c.sm_scale = 0.5f; /* large logits, so the cap matters */
    run_case(&c, cinfer_test_seed() + 4000);
    static const int windows[] = {0, 1, 5, 100, 4000};
    for (size_t i = 0; i < sizeof windows / sizeof windows[0]; i++) {
        char desc[64];
        snprintf(desc, sizeof desc, "window_left %d", windows[i]);
        decode_case w = base_case(desc);
        w.window_left = windows[i];
        w.max_len = 3000;
        run_case(&w, cinfer_test_seed() + 4100 + i);
    }
    decode_case s = base_case("sm_scale 0.05");
    s.sm_scale = 0.05f;
    run_case(&s, cinfer_test_seed() + 4200);
}

static void edge_lengths(void **state) {
    (void)state;
    static const int mixed[] = {0, 5, 0, 1, 16, 17, 0, 1000};
    decode_case c = base_case("kv_len 0 mixed with others");
    c.batch = 8;
    c.lens = mixed;
    run_case(&c, cinfer_test_seed() + 5000);
    static const int zeros[] = {0, 0, 0};
    decode_case z = base_case("all kv_len 0");
    z.batch = 3;
    z.lens = zeros;
    run_case(&z, cinfer_test_seed() + 5001);
    static int ones[64];
    for (int i = 0; i < 64; i++)
        ones[i] = 1;
    decode_case o = base_case("64 requests of length 1");
    o.batch = 64;
    o.lens = ones;
    o.lse = 0;
    run_case(&o, cinfer_test_seed() + 5002);
    static const int short_page[] = {3, 7, 2};
    decode_case s = base_case("shorter than one page (64)");
    s.batch = 3;
    s.lens = short_page;
    s.page_size = 64;
    run_case(&s, cinfer_test_seed() + 5003);
    decode_case empty = base_case("batch 0");
    empty.batch = 0;
    run_case(&empty, cinfer_test_seed() + 5004);
}

static void one_long_request(void **state) {
    (void)state;
    static const int len[] = {131072};
    decode_case c = base_case("batch 1, 128k tokens (split-KV)");
    c.batch = 1;
    c.lens = len;
    run_case(&c, cinfer_test_seed() + 6000);
    static const int lens[] = {100000, 3, 50000, 0, 1};
    decode_case m = base_case("long and short together");
    m.batch = 5;
    m.lens = lens;
    m.hq = 8;
    m.hk = 1;
    run_case(&m, cinfer_test_seed() + 6001);
}

static void page_indices_need_64_bits(void **state) {
    (void)state;
    decode_case c = base_case("page indices near 2^31 / page_size");
    c.hq = 4;
    c.hk = 1;
    c.d = 64;
    c.batch = 3;
    c.max_len = 300;
    c.extra_pages = 0;
    /* (2^31 - 64) * page elements overflows 32-bit element offsets many times over. */
    c.page_index_base = 2147483647 - 64 - 100;
    run_case(&c, cinfer_test_seed() + 7000);
}

static void randomized_grid(void **state) {
    (void)state;
    cinfer_test_rng rng;
    cinfer_test_rng_init(&rng, cinfer_test_seed() + 8000);
    static const int groups[] = {1, 2, 4, 5, 7, 8, 16};
    static const int dims[] = {64, 128, 256, 96};
    static const int pages[] = {1, 8, 16, 32, 256};
    static const cinfer__dtype_t kvs[] = {CINFER__DT_BF16, CINFER__DT_F16, CINFER__DT_E4M3};
    for (int i = 0; i < 24; i++) {
        char desc[160];
        decode_case c = base_case(desc);
        c.hk = 1 + (int)cinfer_test_rng_below(&rng, 4);
        c.hq = c.hk * groups[cinfer_test_rng_below(&rng, 7)];
        c.d = dims[cinfer_test_rng_below(&rng, 4)];
        c.page_size = pages[cinfer_test_rng_below(&rng, 5)];
        c.layout = (cinfer_kv_layout_t)cinfer_test_rng_below(&rng, 2);
        c.kv_dtype = kvs[cinfer_test_rng_below(&rng, 3)];
        c.q_dtype = c.kv_dtype == CINFER__DT_F16 ? CINFER__DT_F16 : CINFER__DT_BF16;
        c.batch = 1 + (int)cinfer_test_rng_below(&rng, 48);
        c.max_len = 1 + (int)cinfer_test_rng_below(&rng, 6000);
        if (cinfer_test_rng_below(&rng, 4) == 0)
            c.window_left = (int)cinfer_test_rng_below(&rng, 500);
        snprintf(desc, sizeof desc,
                 "random #%d: B %d Hq %d Hk %d D %d page %d %s kv %s max_len %d win %d", i, c.batch,
                 c.hq, c.hk, c.d, c.page_size, c.layout ? "HND" : "NHD",
                 cinfer__dtype_name(c.kv_dtype), c.max_len, c.window_left);
        c.desc = desc;
        run_case(&c, cinfer_test_seed() + 8100 + (uint64_t)i);
    }
}

/* Capture one run in a CUDA graph, then re-plan other batches and lengths into the same buffers
 * and replay: every replay must match the reference for the new plan. */
static void cuda_graph_replays_after_replanning(void **state) {
    (void)state;
    const int max_batch = 64;
    decode_case big = base_case("graph capture");
    big.batch = max_batch;
    big.hq = 16;
    big.hk = 4;
    big.max_len = 100000;
    /* Buffers sized for the largest case: a pool for 64 x 100k tokens is too much host work for
     * the reference, so lengths stay moderate except one long request per replay. */
    cinfer_test_rng rng;
    cinfer_test_rng_init(&rng, cinfer_test_seed() + 9000);
    static int lens0[64];
    for (int b = 0; b < max_batch; b++)
        lens0[b] = 1 + (int)cinfer_test_rng_below(&rng, 2000);
    lens0[5] = 100000;
    big.lens = lens0;
    big.extra_pages = 7000; /* room for the replays' pools */
    decode_data x;
    make_data(&big, &rng, &x);
    upload(&big, &x, 1);
    cinfer_attention_options_t o = options_for(&big, max_batch);
    o.use_cuda_graph = 1;
    cinfer_batch_decode_t *op = create_planned(&o, &x, big.batch);
    decode_tensors t;
    make_tensors(&big, &x, &t);

    CUgraph graph;
    CUgraphExec exec;
    assert_int_equal(cu->cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
                     CUDA_SUCCESS);
    cinfer_status_t st =
        cinfer_batch_decode_run(op, &t.q.t, &t.k.t, &t.v.t, &t.indptr.t, &t.indices.t, &t.last.t,
                                &t.out.t, &t.lse.t, NULL, stream);
    /* A plan is host work: refused on a capturing stream, before it touches the plan or the
     * capture. */
    const cinfer_status_t plan_st =
        cinfer_batch_decode_plan(op, x.indptr, x.last, big.batch, stream);
    char plan_msg[512];
    snprintf(plan_msg, sizeof plan_msg, "%s", cinfer_last_error());
    assert_int_equal(cu->cuStreamEndCapture(stream, &graph), CUDA_SUCCESS);
    CINFER_TEST_OK(st);
    assert_int_equal(plan_st, CINFER_STATUS_INVALID_ARGUMENT);
    assert_non_null(strstr(plan_msg, "captured into a CUDA graph"));
    assert_int_equal(cu->cuGraphInstantiate(&exec, graph, 0), CUDA_SUCCESS);
    assert_int_equal(cu->cuGraphLaunch(exec, stream), CUDA_SUCCESS);
    CINFER_TEST_SYNC(stream);
    check_outputs(&big, &x, cinfer_test_seed() + 9000, &no_variant);

    /* Replays: other batch sizes and lengths, written into the same device buffers. */
    static const int batches[] = {1, 17, 64, 3};
    for (int r = 0; r < 4; r++) {
        decode_case c = big;
        char desc[64];
        snprintf(desc, sizeof desc, "graph replay %d (batch %d)", r, batches[r]);
        c.desc = desc;
        c.batch = batches[r];
        static int lens[64];
        for (int b = 0; b < c.batch; b++)
            lens[b] = (int)cinfer_test_rng_below(&rng, r == 3 ? 3 : 3000);
        lens[0] = r == 0 ? 100000 : r == 1 ? 1 : lens[0];
        /* Replay 1: 17 requests, one of them split into more than 8 chunks; 4 merge warps per
         * (request, head) would overrun the grid made for 64 requests, so the merge runs the
         * 2-warp path (replay 0, one request, the 4-warp one). */
        if (r == 1)
            lens[1] = 50000;
        c.lens = lens;
        decode_data y;
        cinfer_test_rng yr;
        cinfer_test_rng_init(&yr, cinfer_test_seed() + 9100 + (uint64_t)r);
        make_data(&c, &yr, &y);
        assert_true(y.cache_bytes <= x.cache_bytes);
        y.d_cache = x.d_cache, y.d_q = x.d_q, y.d_out = x.d_out, y.d_lse = x.d_lse;
        y.d_indptr = x.d_indptr, y.d_indices = x.d_indices, y.d_last = x.d_last;
        /* The pools differ in size: the device layout must be the big case's, so store the new
         * data with the big pool's strides by making it the same pool size. */
        assert_true(y.max_pages <= x.max_pages);
        y.max_pages = x.max_pages;
        free(y.cache);
        y.cache_bytes = x.cache_bytes;
        y.cache = malloc(y.cache_bytes);
        memset(y.cache, 0xff, y.cache_bytes);
        {
            int64_t s_page, s_slot, s_head, v_off;
            pool_strides(&c, &s_page, &s_slot, &s_head, &v_off, y.max_pages);
            for (int b = 0; b < c.batch; b++)
                for (int tk = 0; tk < y.lens[b]; tk++) {
                    int64_t page = y.indices[y.indptr[b] + tk / c.page_size],
                            slot = tk % c.page_size;
                    for (int h = 0; h < c.hk; h++)
                        for (int kv = 0; kv < 2; kv++) {
                            int64_t off =
                                page * s_page + slot * s_slot + h * s_head + (kv ? v_off : 0);
                            for (int i = 0; i < c.d; i++)
                                cinfer_test_store(c.kv_dtype, y.cache, off + i,
                                                  cinfer_test_rng_uniform(&yr, -1, 1));
                        }
                }
        }
        upload(&c, &y, 0);
        CINFER_TEST_OK(cinfer_batch_decode_plan(op, y.indptr, y.last, c.batch, stream));
        assert_int_equal(cu->cuGraphLaunch(exec, stream), CUDA_SUCCESS);
        CINFER_TEST_SYNC(stream);
        check_outputs(&c, &y, cinfer_test_seed() + 9100 + (uint64_t)r, &no_variant);
        /* The device buffers belong to x. */
        memset(&y.d_cache, 0, sizeof y.d_cache);
        y.d_q = y.d_out = y.d_lse = y.d_indptr = y.d_indices = y.d_last = y.d_cache;
        free_data(&y);
    }
    cu->cuGraphExecDestroy(exec);
    cu->cuGraphDestroy(graph);
    cinfer_batch_decode_destroy(op);
    free_data(&x);
}

static void single_decode_matches(void **state) {
    (void)state;
    static const int64_t lens[] = {0, 1, 7, 5000, 70000};
    /* NHD and HND with bf16 KV, then with e4m3 (the tensor-core kernel's fp8 path over contiguous
     * KV); then in-kernel RoPE (the CUDA-core kernel): NHD bf16 up to position 69999, HND e4m3
     * (rotating the dequantized K) with the variants. */
    for (int run = 0; run < 6; run++) {
        const int layout = run % 2, kvi = run < 4 ? run / 2 : run - 4, rope = run >= 4;
        const cinfer__dtype_t kvt = kvi ? CINFER__DT_E4M3 : CINFER__DT_BF16;
        const size_t esz = cinfer__dtype_size(kvt);
        for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
            const int hq = 32, hk = 8, d = 128;
            const int64_t len = lens[li];
            /* The reference's rotation of 70000 x 8 K heads takes seconds: once is enough. */
            if (run == 5 && len > 5000)
                continue;
            char desc[64];
            snprintf(desc, sizeof desc, "single %s kv %s kv_len %lld%s", layout ? "HND" : "NHD",
                     cinfer__dtype_name(kvt), (long long)len, rope ? " rope" : "");
            cinfer_test_rng rng;
            cinfer_test_rng_init(&rng, cinfer_test_seed() + 10000 + li + 100 * (uint64_t)run);
            const int64_t kv_elems = len * hk * d, q_elems = (int64_t)hq * d;
            unsigned char *k = malloc((size_t)kv_elems * esz + 2),
                          *v = malloc((size_t)kv_elems * esz + 2);
            unsigned char *q = malloc((size_t)q_elems * 2);
            cinfer_test_fill_uniform(&rng, kvt, kv_elems, -1, 1, k, NULL);
            cinfer_test_fill_uniform(&rng, kvt, kv_elems, -1, 1, v, NULL);
            cinfer_test_fill_uniform(&rng, CINFER__DT_BF16, q_elems, -1, 1, q, NULL);
            cinfer_test_buf dk, dv, dq, dout, dlse, dws;
            CINFER_TEST_OK(cinfer_test_buf_alloc(&dk, (size_t)kv_elems * esz));
            CINFER_TEST_OK(cinfer_test_buf_alloc(&dv, (size_t)kv_elems * esz));
            CINFER_TEST_OK(cinfer_test_buf_alloc(&dq, (size_t)q_elems * 2));
            CINFER_TEST_OK(cinfer_test_buf_alloc(&dout, (size_t)q_elems * 2));
            CINFER_TEST_OK(cinfer_test_buf_alloc(&dlse, (size_t)hq * 4));
            CINFER_TEST_OK(cinfer_test_buf_upload(&dk, 0, k, (size_t)kv_elems * esz));
            CINFER_TEST_OK(cinfer_test_buf_upload(&dv, 0, v, (size_t)kv_elems * esz));
            CINFER_TEST_OK(cinfer_test_buf_upload(&dq, 0, q, (size_t)q_elems * 2));
            decode_case c = base_case(desc);
            c.layout = (cinfer_kv_layout_t)layout;
            c.kv_dtype = kvt;
            c.rope = rope;
            c.rope_theta = run == 4 ? 5e5f : 0.0f;
            c.rope_scale = run == 5 ? 3.0f : 0.0f;
            cinfer_attention_options_t o = options_for(&c, 1);
            /* HND runs alternate two variants: sinks (split-KV on long KV) and the user one
             * (never split: it has an output transform). */
            tv_state var;
            tv_setup(&var, layout ? (li % 2 ? TV_SINKS : TV_USER) : TV_NONE, hq, &rng, 0, 0, NULL,
                     0, 0);
            o.variant = var.variant;
            size_t ws_bytes = 0;
            CINFER_TEST_OK(cinfer_single_decode_workspace_size(ctx, &o, len, &ws_bytes));
            CINFER_TEST_OK(cinfer_test_buf_alloc(&dws, ws_bytes));
            cinfer_test_tensor tq, tk, tv, tout, tlse;
            const int64_t q_shape[2] = {hq, d}, lse_shape[1] = {hq};
            int64_t kv_shape[3] = {len, hk, d};
            if (layout)
                kv_shape[0] = hk, kv_shape[1] = len;
            cinfer_test_tensor_init(&tq, &dq, 0, 0, CINFER__DT_BF16, 2, q_shape, NULL);
            cinfer_test_tensor_init(&tout, &dout, 0, 0, CINFER__DT_BF16, 2, q_shape, NULL);
            cinfer_test_tensor_init(&tlse, &dlse, 0, 0, CINFER__DT_F32, 1, lse_shape, NULL);
            cinfer_test_tensor_init(&tk, &dk, 0, 0, kvt, 3, kv_shape, NULL);
            cinfer_test_tensor_init(&tv, &dv, 0, 0, kvt, 3, kv_shape, NULL);
            CINFER_TEST_OK(cinfer_single_decode(ctx, &o, &tq.t, &tk.t, &tv.t, &tout.t, &tlse.t,
                                                tv_args(&var), (void *)(uintptr_t)dws.ptr, ws_bytes,
                                                stream));
            CINFER_TEST_SYNC(stream);

            cinfer__ref_heads_t heads = {hq, hk, d, d};
            cinfer__ref_strided3_t rq, rk, rv;
            cinfer__ref_strided3_packed(&rq, q, CINFER__REF_DTYPE_BF16, CINFER__REF_LAYOUT_NHD, 1,
                                        hq, d);
            cinfer__ref_strided3_packed(&rk, k, cinfer_test_ref_dtype_of(kvt),
                                        (cinfer__ref_layout_t)layout, len, hk, d);
            cinfer__ref_strided3_packed(&rv, v, cinfer_test_ref_dtype_of(kvt),
                                        (cinfer__ref_layout_t)layout, len, hk, d);
            cinfer__ref_attn_opts_t opts;
            cinfer__ref_attn_opts_init(&opts, d);
            ref_rope(&c, &opts);
            tv_ref_opts(&var, -1, &opts);
            uint8_t *mask = malloc((size_t)len + 1);
            for (int64_t j = 0; j < len; j++)
                mask[j] = (uint8_t)tv_user_keep(len - 1, j);
            if (var.kind == TV_USER)
                opts.custom_mask = mask;
            double *ro = malloc(sizeof(double) * (size_t)q_elems),
                   *rl = malloc(sizeof(double) * (size_t)hq);
            assert_int_equal(cinfer__ref_single(&heads, 1, len, &rq, &rk, &rv, &opts, ro, rl), 0);
            unsigned char *out = malloc((size_t)q_elems * 2);
            float lse[64];
            CINFER_TEST_OK(cinfer_test_buf_download(&dout, 0, out, (size_t)q_elems * 2));
            CINFER_TEST_OK(cinfer_test_buf_download(&dlse, 0, lse, (size_t)hq * 4));
            uint64_t seed = cinfer_test_seed() + 10000 + li + 100 * (uint64_t)run;
            CINFER_TEST_ASSERT_CLOSE(
                cinfer_test_compare(CINFER__DT_BF16, out, ro, q_elems, 1e-2, 0.05, 1e-3), "out",
                desc, seed);
            /* fp8 KV runs the mmas in fp16 with q * sm_scale rounded to fp16 (2^-11 relative per
             * element, cinfer.h): a logit moves by up to ~1e-3 of the sum of |q_i k_i| sm_scale
             * (H200: 3.3e-4 on a logit of -0.55 at kv_len 1, where the LSE is the logit). */
            const double lse_tol = kvi && !rope ? 1e-3 : 1e-4;
            CINFER_TEST_ASSERT_LSE_CLOSE(cinfer_test_compare_lse(lse, rl, hq, lse_tol), "lse", desc,
                                         seed);
            cinfer_test_buf *bufs[] = {&dk, &dv, &dq, &dout, &dlse, &dws};
            for (size_t i = 0; i < 6; i++)
                CINFER_TEST_OK(cinfer_test_buf_check_canaries(bufs[i]));
            for (size_t i = 0; i < 6; i++)
                cinfer_test_buf_free(bufs[i]);
            free(k), free(v), free(q), free(ro), free(rl), free(out), free(mask);
            tv_free(&var);
        }
    }
}

/*
 * In-kernel RoPE on batch decode (the CUDA-core kernel, also under CINFER_TEST_DECODE_TC): q at
 * kv_len - 1 and K at its positions, read through the page table; GQA slices of 4 and 8 heads,
 * fp8 KV (the dequantized K is rotated), head dims whose token rows do not fill a power of two of
 * lanes (48, 80), split-KV over 33k-45k positions with a window (only the last positions are
 * scheduled, still rotated at their absolute positions), rope_scale and rope_theta changed, and
 * a variant.
 */
static void rope(void **state) {
    (void)state;
    static const int long_lens[] = {0, 1, 33001, 45000, 17};
    for (int i = 0; i < 5; i++) {
        char desc[96];
        snprintf(desc, sizeof desc, "rope case %d", i);
        decode_case c = base_case(desc);
        c.rope = 1;
        switch (i) {
        case 0: /* Llama 3 heads, bf16, default scale and theta */
            c.batch = 7;
            break;
        case 1: /* e4m3 KV with a scale, HND, odd pages, 8 heads per KV head, D 64 */
            c.kv_dtype = CINFER__DT_E4M3;
            c.k_scale = 0.5f;
            c.v_scale = 2.0f;
            c.layout = CINFER_KV_LAYOUT_HND;
            c.page_size = 5;
            c.hq = 16;
            c.hk = 2;
            c.d = 64;
            c.rope_scale = 2.0f;
            c.rope_theta = 5e5f;
            break;
        case 2: /* D 48 (6 lanes of 8), group 3 */
            c.d = 48;
            c.hq = 6;
            c.hk = 2;
            c.q_dtype = c.kv_dtype = CINFER__DT_F16;
            break;
        case 3: /* D 80 (10 lanes of 16), combined cache, sinks */
            c.d = 80;
            c.hq = 8;
            c.hk = 4;
            c.combined = 1;
            c.variant = TV_SINKS;
            c.rope_theta = 1e6f;
            break;
        default: /* long requests (split-KV) with a window, fp16, D 256 */
            c.batch = 5;
            c.lens = long_lens;
            c.hq = 4;
            c.hk = 2;
            c.d = 256;
            c.q_dtype = c.kv_dtype = CINFER__DT_F16;
            c.window_left = 3000;
            c.rope_theta = 5e5f;
            c.rope_scale = 0.75f;
            break;
        }
        run_case(&c, cinfer_test_seed() + 12000 + (uint64_t)i);
    }
    /* Plan refuses a request past CINFER_ROPE_MAX_LEN (2^24 + 1 tokens), naming it; the same
     * lengths plan without RoPE; the tensor-core kernel is refused with RoPE. */
    decode_case c = base_case("rope limits");
    c.rope = 1;
    cinfer_attention_options_t o = options_for(&c, 2);
    cinfer_test_buf ws;
    /* One workspace for both objects: without RoPE the tensor-core kernel is chosen, whose
     * schedule (its own resident CTAs) may need more than the CUDA-core kernel's. */
    size_t ws_bytes = 0, ws_plain = 0;
    CINFER_TEST_OK(cinfer_batch_decode_workspace_size(ctx, &o, &ws_bytes));
    o.pos_encoding_mode = CINFER_POS_ENCODING_NONE;
    CINFER_TEST_OK(cinfer_batch_decode_workspace_size(ctx, &o, &ws_plain));
    ws_bytes = ws_plain > ws_bytes ? ws_plain : ws_bytes;
    CINFER_TEST_OK(cinfer_test_buf_alloc(&ws, ws_bytes));
    /* Request 1: 2^20 + 1 pages of 16, the last holding 1 token: 2^24 + 1 tokens. */
    const int32_t indptr[3] = {0, 1, 2 + (CINFER_ROPE_MAX_LEN / 16)}, last[2] = {3, 1};
    for (int on = 1; on >= 0; on--) {
        o.pos_encoding_mode = on ? CINFER_POS_ENCODING_ROPE_LLAMA : CINFER_POS_ENCODING_NONE;
        cinfer_batch_decode_t *op = NULL;
        CINFER_TEST_OK(
            cinfer_batch_decode_create(ctx, &o, (void *)(uintptr_t)ws.ptr, ws_bytes, &op));
        const cinfer_status_t st = cinfer_batch_decode_plan(op, indptr, last, 2, stream);
        if (on) {
            assert_int_equal(st, CINFER_STATUS_UNSUPPORTED);
            assert_non_null(strstr(cinfer_last_error(), "request 1: kv_len = 16777217"));
        } else {
            CINFER_TEST_OK(st);
        }
        cinfer_batch_decode_destroy(op);
    }
    CINFER_TEST_SYNC(stream);
    cinfer_test_buf_free(&ws);
    o.pos_encoding_mode = CINFER_POS_ENCODING_ROPE_LLAMA;
    o.use_tensor_cores = 1;
    assert_int_equal(cinfer_batch_decode_workspace_size(ctx, &o, &ws_bytes),
                     CINFER_STATUS_UNSUPPORTED);
    assert_non_null(strstr(cinfer_last_error(), "use_tensor_cores = 1"));
}

/* Every built-in variant and the suites' user variant on batch decode: GQA, random lengths with
 * an empty request, split-KV (one long request among short ones), a sliding window. */
static void run_variant(tv_kind k) {
    static const int mixed[] = {0, 3000, 17, 1, 30000, 250};
    for (int shape = 0; shape < 4; shape++) {
        char desc[96];
        snprintf(desc, sizeof desc, "variant %s, shape %d", tv_name(k), shape);
        decode_case c = base_case(desc);
        c.variant = k;
        c.lse = tv_has_lse(c.variant);
        c.hq = 8;
        c.hk = 2;
        if (shape == 0) {
            c.batch = 6;
            c.lens = mixed;
        } else if (shape == 1) {
            c.batch = 9;
            c.max_len = 1500;
            c.window_left = 100;
            c.layout = CINFER_KV_LAYOUT_HND;
        } else if (shape == 2) {
            c.batch = 40;
            c.max_len = 600;
            c.page_size = 1;
        } else {
            /* fp8 KV: the tensor-core kernel's 32-token tiles through every hook. */
            c.batch = 5;
            c.max_len = 900;
            c.kv_dtype = CINFER__DT_E4M3;
            c.k_scale = 0.7f;
            c.v_scale = 1.3f;
        }
        run_case(&c, cinfer_test_seed() + 20000 + (uint64_t)(k * 10 + shape));
    }
}

/* One test per variant (a failure in one still runs the others): *state is its tv_kind. */
static void variant(void **state) {
    run_variant(*(const tv_kind *)*state);
}

static void bad_arguments_are_errors(void **state) {
    (void)state;
    decode_case c = base_case("errors");
    c.batch = 4;
    cinfer_test_rng rng;
    cinfer_test_rng_init(&rng, cinfer_test_seed() + 11000);
    decode_data x;
    make_data(&c, &rng, &x);
    upload(&c, &x, 1);
    cinfer_attention_options_t o = options_for(&c, 4);
    size_t ws_bytes = 0;
    CINFER_TEST_OK(cinfer_batch_decode_workspace_size(ctx, &o, &ws_bytes));
    CINFER_TEST_OK(cinfer_test_buf_alloc(&x.d_ws, ws_bytes));
    cinfer_batch_decode_t *op = NULL;
    /* One byte short of the exact size. */
    assert_int_equal(
        cinfer_batch_decode_create(ctx, &o, (void *)(uintptr_t)x.d_ws.ptr, ws_bytes - 1, &op),
        CINFER_STATUS_WORKSPACE_TOO_SMALL);
    assert_null(op);
    cinfer_attention_options_t bad = o;
    bad.num_qo_heads = 30; /* not a multiple of 8 */
    assert_int_equal(
        cinfer_batch_decode_create(ctx, &bad, (void *)(uintptr_t)x.d_ws.ptr, ws_bytes, &op),
        CINFER_STATUS_INVALID_ARGUMENT);
    assert_non_null(strstr(cinfer_last_error(), "num_qo_heads"));
    bad = o;
    bad.head_dim = 100;
    assert_int_not_equal(
        cinfer_batch_decode_create(ctx, &bad, (void *)(uintptr_t)x.d_ws.ptr, ws_bytes, &op),
        CINFER_STATUS_SUCCESS);
    /* The tensor-core kernel cannot take head dim 96 (only 64, 128, 256); a value outside -1..1
     * is no choice at all. */
    bad = o;
    bad.use_tensor_cores = 1;
    bad.head_dim = 96;
    assert_int_equal(
        cinfer_batch_decode_create(ctx, &bad, (void *)(uintptr_t)x.d_ws.ptr, ws_bytes, &op),
        CINFER_STATUS_UNSUPPORTED);
    assert_non_null(strstr(cinfer_last_error(), "use_tensor_cores"));
    bad = o;
    bad.use_tensor_cores = 2;
    assert_int_equal(
        cinfer_batch_decode_create(ctx, &bad, (void *)(uintptr_t)x.d_ws.ptr, ws_bytes, &op),
        CINFER_STATUS_INVALID_ARGUMENT);
    CINFER_TEST_OK(
        cinfer_batch_decode_create(ctx, &o, (void *)(uintptr_t)x.d_ws.ptr, ws_bytes, &op));
    assert_int_equal(cinfer_batch_decode_plan(op, x.indptr, x.last, 5, stream),
                     CINFER_STATUS_INVALID_ARGUMENT);
    int32_t bad_last[4] = {x.last[0], 17, x.last[2], x.last[3]};
    if (x.indptr[2] > x.indptr[1]) {
        assert_int_equal(cinfer_batch_decode_plan(op, x.indptr, bad_last, 4, stream),
                         CINFER_STATUS_INVALID_ARGUMENT);
        assert_non_null(strstr(cinfer_last_error(), "last_page_len"));
    }
    CINFER_TEST_OK(cinfer_batch_decode_plan(op, x.indptr, x.last, 4, stream));
    decode_tensors t;
    make_tensors(&c, &x, &t);
    /* q with a batch the plan does not have. */
    t.q.shape[0] = 3;
    assert_int_not_equal(cinfer_batch_decode_run(op, &t.q.t, &t.k.t, &t.v.t, &t.indptr.t,
                                                 &t.indices.t, &t.last.t, &t.out.t, &t.lse.t, NULL,
                                                 stream),
                         CINFER_STATUS_SUCCESS);
    assert_non_null(strstr(cinfer_last_error(), "q"));
    /* A negative size and a NULL shape array: INVALID_ARGUMENT naming q, not a plan mismatch. */
    t.q.shape[0] = -4;
    assert_int_equal(cinfer_batch_decode_run(op, &t.q.t, &t.k.t, &t.v.t, &t.indptr.t, &t.indices.t,
                                             &t.last.t, &t.out.t, &t.lse.t, NULL, stream),
                     CINFER_STATUS_INVALID_ARGUMENT);
    assert_non_null(strstr(cinfer_last_error(), "q: shape[0] = -4"));
    t.q.shape[0] = 4;
    t.k.t.shape = NULL;
    assert_int_equal(cinfer_batch_decode_run(op, &t.q.t, &t.k.t, &t.v.t, &t.indptr.t, &t.indices.t,
                                             &t.last.t, &t.out.t, &t.lse.t, NULL, stream),
                     CINFER_STATUS_INVALID_ARGUMENT);
    assert_non_null(strstr(cinfer_last_error(), "k_cache: shape is NULL"));
    t.k.t.shape = t.k.shape;
    /* fp16 output for a bf16 plan. */
    t.out.t.dtype = cinfer_test_dl_dtype(CINFER__DT_F16);
    assert_int_not_equal(cinfer_batch_decode_run(op, &t.q.t, &t.k.t, &t.v.t, &t.indptr.t,
                                                 &t.indices.t, &t.last.t, &t.out.t, &t.lse.t, NULL,
                                                 stream),
                         CINFER_STATUS_SUCCESS);
    assert_non_null(strstr(cinfer_last_error(), "out"));
    t.out.t.dtype = cinfer_test_dl_dtype(CINFER__DT_BF16);
    /* A cache with another head count. */
    t.k.shape[2] = 4;
    assert_int_not_equal(cinfer_batch_decode_run(op, &t.q.t, &t.k.t, &t.v.t, &t.indptr.t,
                                                 &t.indices.t, &t.last.t, &t.out.t, &t.lse.t, NULL,
                                                 stream),
                         CINFER_STATUS_SUCCESS);
    t.k.shape[2] = c.hk;
    CINFER_TEST_SYNC(stream);
    /* Nothing was written by the failed runs. */
    CINFER_TEST_OK(cinfer_test_buf_check_poisoned(&x.d_out, x.out_bytes));
    cinfer_batch_decode_destroy(op);
    free_data(&x);
}

int main(void) {
    const char *tc = getenv("CINFER_TEST_DECODE_TC");
    force_tensor_cores = tc && tc[0] == '1';
    int rc = cinfer_test_gpu_setup(&ctx);
    if (rc)
        return rc;
    if (cinfer__cuda_get(&cu) != CINFER_STATUS_SUCCESS ||
        cinfer_test_stream_create(&stream) != CINFER_STATUS_SUCCESS) {
        fprintf(stderr, "error: %s\n", cinfer_last_error());
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(basic_llama_heads, cinfer_test_teardown_buffers),
        cmocka_unit_test_teardown(layouts_and_page_sizes, cinfer_test_teardown_buffers),
        cmocka_unit_test_teardown(gqa_groups_and_head_dims, cinfer_test_teardown_buffers),
        cmocka_unit_test_teardown(dtypes_and_scales, cinfer_test_teardown_buffers),
        cmocka_unit_test_teardown(fp8_layouts_pages_groups_and_head_dims,
                                  cinfer_test_teardown_buffers),
        cmocka_unit_test_teardown(fp8_rows_on_tensor_cores_need_16_bytes,
                                  cinfer_test_teardown_buffers),
        cmocka_unit_test_teardown(soft_cap_window_and_scale, cinfer_test_teardown_buffers),
        cmocka_unit_test_teardown(edge_lengths, cinfer_test_teardown_buffers),
        cmocka_unit_test_teardown(one_long_request, cinfer_test_teardown_buffers),
        cmocka_unit_test_teardown(page_indices_need_64_bits, cinfer_test_teardown_buffers),
        cmocka_unit_test_teardown(randomized_grid, cinfer_test_teardown_buffers),
        cmocka_unit_test_teardown(cuda_graph_replays_after_replanning,
                                  cinfer_test_teardown_buffers),
        cmocka_unit_test_teardown(single_decode_matches, cinfer_test_teardown_buffers),
        cmocka_unit_test_teardown(rope, cinfer_test_teardown_buffers),
        cmocka_unit_test_teardown(bad_arguments_are_errors, cinfer_test_teardown_buffers),
        TV_CMOCKA_TEST(variant, TV_SIGMOID, cinfer_test_teardown_buffers),
        TV_CMOCKA_TEST(variant, TV_SINKS, cinfer_test_teardown_buffers),
        TV_CMOCKA_TEST(variant, TV_ALIBI, cinfer_test_teardown_buffers),
        TV_CMOCKA_TEST(variant, TV_ALIBI_DEFAULT, cinfer_test_teardown_buffers),
        TV_CMOCKA_TEST(variant, TV_DUMP, cinfer_test_teardown_buffers),
        TV_CMOCKA_TEST(variant, TV_USER, cinfer_test_teardown_buffers),
        TV_CMOCKA_TEST(variant, TV_MASK, cinfer_test_teardown_buffers),
    };
    rc = cinfer_test_run_suite("gpu_test_decode", tests, sizeof tests / sizeof tests[0]);
    cinfer_test_stream_destroy(stream);
    cinfer_test_gpu_teardown(ctx);
    return rc;
}
