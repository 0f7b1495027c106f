/*
 * Batch prefill (ragged and paged K/V) against the float64 CPU reference (cinfer__ref_batch_ragged,
 * cinfer__ref_batch_paged): batches of 1..64 requests, query lengths 0..~1k (and decode-like
 * batches of a few rows, which take the small tile), KV lengths 0..~4k with qo_len > kv_len too,
 * page sizes 1..256 (odd ones included), NHD/HND, combined K/V caches, fp16/bf16, head dims
 * 64/128/256 and the padded 80 and 208, GQA 1..8, causal on and off, sliding window, soft cap,
 * LSE, in-kernel RoPE, CUDA-graph capture and replay after re-planning, argument errors,
 * split-KV (few query rows over 4k-16k positions: chunks merged by the merge kernel, rows empty in
 * a chunk or in all, windows, variants, an exact workspace), and GQA packing (the query heads of a
 * KV head in one CTA's rows: the default for G = 2, 4, 8, 16, which most cases above use; forced
 * for G = 3, 5, 6 and turned off for G = 4 in gqa_packing). At D = 128 with 16-bit K/V, without
 * soft cap and RoPE, batches whose mean query length exceeds the 128-row tile's tokens (32 packed
 * by 4, 64 by 2) take the 256-row tile whose two warp groups take turns (kernels/prefill.cu,
 * PINGPONG): most cases above, the variants, the cascade prefix's split and the graph-mode ones.
 *
 * Every output is poisoned (NaN) and surrounded by canaries; q rows that no request owns (the
 * plan starts at qo_indptr[0] > 0 and leaves rows after the last request) must keep the poison in
 * out and lse; every K/V row or page slot no request owns holds NaN, so a read of a wrong row,
 * page or slot shows up as NaN. The kernels used here (a few dtype/head-dim/flag sets, three
 * query tiles each) compile in about 30 s on first use; the reference dominates the rest, so
 * each case keeps sum(qo_len x kv_len) x Hq x D below a budget.
 */
#include "ops/prefill.h"
#include "support/gpu.h"
#include "support/variants.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static cinfer_context_t *ctx;
static CUstream stream;
/* The variant the next cases run with (tests/support/variants.h); NULL = default attention. */
static tv_state *g_tv;
static const cinfer__cuda_t *cu;

/* sum_b qo_len_b x kv_len_b x Hq x D of one case: about a second of reference work. */
#define REF_BUDGET 2.5e8

typedef struct bp_case {
    const char *desc;
    int batch;
    int max_qo, max_kv;           /* random lengths in [0, max] (or [1, max] for qo) */
    const int *qo_lens, *kv_lens; /* or fixed lengths */
    int hq, hk, d;
    int dvo;                  /* D of v and out (head_dim_vo); 0 = d */
    cinfer__dtype_t dtype;    /* q and out */
    cinfer__dtype_t kv_dtype; /* K/V: CINFER__DT_NONE = dtype */
    cinfer_kv_layout_t layout;
    int paged, page_size, combined;
    int causal;
    float soft_cap, sm_scale, k_scale, v_scale;
    int window_left;
    int lse;
    int high_pages;   /* paged: the requests own the last pages of the pool, in reverse order */
    int page_runs;    /* paged: table entry i is page i (1), or runs of 5 pages 7 apart (2) */
    int expect_split; /* 1: the plan must split the KV (split-KV), -1: it must not, 0: either */
    int rope;         /* in-kernel RoPE (pos_encoding_mode = ROPE_LLAMA) */
    float rope_scale, rope_theta; /* with rope; 0: the defaults 1 and 1e4 */
    int expect_group;             /* 0: either; else the GQA group the object must pack (1: none) */
    int expect_sm90; /* 1: the plan must run the sm90 kernel (on sm_90a), -1: it must not */
} bp_case;

static bp_case base_case(const char *desc) {
    bp_case c;
    memset(&c, 0, sizeof c);
    c.desc = desc;
    c.batch = 7;
    c.max_qo = 300;
    c.max_kv = 1200;
    c.hq = 32;
    c.hk = 8;
    c.d = 128;
    c.dtype = CINFER__DT_BF16;
    c.layout = CINFER_KV_LAYOUT_NHD;
    c.paged = 1;
    c.page_size = 16;
    c.causal = 1;
    c.window_left = -1;
    c.lse = 1;
    c.k_scale = c.v_scale = 1.0f;
    return c;
}

static cinfer__dtype_t kv_dtype_of(const bp_case *c) {
    return c->kv_dtype != CINFER__DT_NONE ? c->kv_dtype : c->dtype;
}

static int dvo_of(const bp_case *c) {
    return c->dvo ? c->dvo : c->d;
}

static int is_fp8(const bp_case *c) {
    return kv_dtype_of(c) == CINFER__DT_E4M3 || kv_dtype_of(c) == CINFER__DT_E5M2;
}

/* Rows of q/out before the first request and after the last one (never read or written). */
enum { Q_FRONT = 3, Q_BACK = 5, KV_FRONT = 4, KV_BACK = 9, EXTRA_PAGES = 5 };

typedef struct bp_data {
    int batch;
    int *qo_len, *kv_len;
    int32_t *qo_indptr, *kv_indptr, *last, *indices;
    int64_t q_rows;  /* rows of q, out and lse */
    int64_t kv_rows; /* ragged: rows of K/V; paged: max_pages */
    int64_t num_indices;
    size_t q_bytes, out_bytes; /* q (D_qk), out (D_vo) */
    size_t kv_bytes, v_bytes;  /* K; V (the combined cache holds both in k: 2 kv_bytes) */
    unsigned char *q, *k, *v;  /* host; combined: k holds the whole cache, v is NULL */
    cinfer_test_buf d_q, d_k, d_v, d_out, d_lse, d_indices, d_ws;
} bp_data;

static void free_host(bp_data *x) {
    free(x->qo_len);
    free(x->kv_len);
    free(x->qo_indptr);
    free(x->kv_indptr);
    free(x->last);
    free(x->indices);
    free(x->q);
    free(x->k);
    free(x->v);
}

static void free_data(bp_data *x) {
    free_host(x);
    cinfer_test_buf_free(&x->d_q);
    cinfer_test_buf_free(&x->d_k);
    cinfer_test_buf_free(&x->d_v);
    cinfer_test_buf_free(&x->d_out);
    cinfer_test_buf_free(&x->d_lse);
    cinfer_test_buf_free(&x->d_indices);
    cinfer_test_buf_free(&x->d_ws);
    memset(x, 0, sizeof *x);
}

/* Element strides of K (or V) rows: token, head, page (paged), and where V starts relative to
 * the K data of the same host/device buffer (combined cache) or 0. */
typedef struct kv_strides {
    int64_t token, head, page, v_offset;
} kv_strides;

/* K's strides (d = c->d) or V's (d = dvo_of(c): they differ when the head dims do). */
static kv_strides strides_of(const bp_case *c, const bp_data *x, int64_t d) {
    kv_strides s = {0, 0, 0, 0};
    const int64_t hk = c->hk;
    if (!c->paged) {
        s.token = c->layout == CINFER_KV_LAYOUT_NHD ? hk * d : d;
        s.head = c->layout == CINFER_KV_LAYOUT_NHD ? d : x->kv_rows * d;
        return s;
    }
    const int64_t p = c->page_size, page = p * hk * d;
    s.token = c->layout == CINFER_KV_LAYOUT_NHD ? hk * d : d;
    s.head = c->layout == CINFER_KV_LAYOUT_NHD ? d : p * d;
    s.page = c->combined ? 2 * page : page;
    s.v_offset = c->combined ? page : 0;
    return s;
}

/* Element offset of token t's head-h row of request b in the K buffer. */
static int64_t kv_row(const bp_case *c, const bp_data *x, const kv_strides *s, int b, int t,
                      int h) {
    if (!c->paged)
        return (int64_t)(x->kv_indptr[b] + t) * s->token + h * s->head;
    const int64_t page = x->indices[x->kv_indptr[b] + t / c->page_size];
    return page * s->page + (int64_t)(t % c->page_size) * s->token + h * s->head;
}

/*
 * Lengths (fixed, or random with the reference budget), indptr arrays starting at Q_FRONT /
 * KV_FRONT (paged: a shuffled page pool with EXTRA_PAGES unowned pages), and the host data: NaN
 * everywhere but the owned rows. Capacities q_cap / kv_cap (0 = just enough) let graph replays
 * reuse the first case's buffers.
 */
static void make_data(const bp_case *c, cinfer_test_rng *rng, bp_data *x, int64_t q_cap,
                      int64_t kv_cap) {
    memset(x, 0, sizeof *x);
    const int B = c->batch;
    x->batch = B;
    x->qo_len = calloc((size_t)B + 1, sizeof(int));
    x->kv_len = calloc((size_t)B + 1, sizeof(int));
    x->qo_indptr = calloc((size_t)B + 1, sizeof(int32_t));
    x->kv_indptr = calloc((size_t)B + 1, sizeof(int32_t));
    x->last = calloc((size_t)B + 1, sizeof(int32_t));
    int max_qo = c->max_qo, max_kv = c->max_kv;
    for (;;) {
        double cost = 0;
        for (int b = 0; b < B; b++) {
            x->qo_len[b] =
                c->qo_lens ? c->qo_lens[b] : (int)cinfer_test_rng_below(rng, (uint64_t)max_qo + 1);
            x->kv_len[b] =
                c->kv_lens ? c->kv_lens[b] : (int)cinfer_test_rng_below(rng, (uint64_t)max_kv + 1);
            cost += (double)x->qo_len[b] * x->kv_len[b] * c->hq * c->d;
        }
        if (cost <= REF_BUDGET || (c->qo_lens && c->kv_lens))
            break;
        max_qo = max_qo > 1 ? max_qo * 3 / 4 : 1;
        max_kv = max_kv > 1 ? max_kv * 3 / 4 : 1;
    }
    x->qo_indptr[0] = Q_FRONT;
    x->kv_indptr[0] = c->paged ? 2 : KV_FRONT; /* paged: page-table entries 0, 1 unused */
    for (int b = 0; b < B; b++) {
        x->qo_indptr[b + 1] = x->qo_indptr[b] + x->qo_len[b];
        if (c->paged) {
            const int pages = (x->kv_len[b] + c->page_size - 1) / c->page_size;
            x->kv_indptr[b + 1] = x->kv_indptr[b] + pages;
            /* A request without pages gets a garbage last_page_len, which must be ignored. */
            x->last[b] = pages ? x->kv_len[b] - (pages - 1) * c->page_size : 12345;
        } else {
            x->kv_indptr[b + 1] = x->kv_indptr[b] + x->kv_len[b];
        }
    }
    x->q_rows = x->qo_indptr[B] + Q_BACK;
    if (q_cap) {
        assert_true(x->q_rows <= q_cap);
        x->q_rows = q_cap;
    }
    const int64_t esz = (int64_t)cinfer__dtype_size(c->dtype);
    const int64_t kv_esz = (int64_t)cinfer__dtype_size(kv_dtype_of(c));
    if (c->paged) {
        x->num_indices = x->kv_indptr[B] + 3;
        x->kv_rows = x->kv_indptr[B] + EXTRA_PAGES; /* max_pages */
        if (kv_cap) {
            assert_true(x->kv_rows <= kv_cap);
            x->kv_rows = x->num_indices = kv_cap;
        }
        /* A random permutation of the pool; entries outside the requests are garbage pages. */
        x->indices = malloc(sizeof(int32_t) * (size_t)x->num_indices);
        int32_t *perm = malloc(sizeof(int32_t) * (size_t)x->kv_rows);
        for (int64_t i = 0; i < x->kv_rows; i++)
            perm[i] = (int32_t)i;
        for (int64_t i = x->kv_rows - 1; i > 0; i--) {
            const int64_t j = (int64_t)cinfer_test_rng_below(rng, (uint64_t)i + 1);
            const int32_t t = perm[i];
            perm[i] = perm[j];
            perm[j] = t;
        }
        for (int64_t i = 0; i < x->num_indices; i++)
            x->indices[i] = c->high_pages       ? (int32_t)(x->kv_rows - 1 - i % x->kv_rows)
                            : c->page_runs == 1 ? (int32_t)(i % x->kv_rows)
                            : c->page_runs == 2 ? (int32_t)((i / 5 * 7 + i % 5) % x->kv_rows)
                                                : perm[i % x->kv_rows];
        free(perm);
        const int64_t page = (int64_t)c->page_size * c->hk;
        x->kv_bytes = (size_t)(x->kv_rows * page * c->d * kv_esz);
        x->v_bytes = (size_t)(x->kv_rows * page * dvo_of(c) * kv_esz);
    } else {
        x->kv_rows = x->kv_indptr[B] + KV_BACK;
        if (kv_cap) {
            assert_true(x->kv_rows <= kv_cap);
            x->kv_rows = kv_cap;
        }
        x->kv_bytes = (size_t)(x->kv_rows * c->hk * c->d * kv_esz);
        x->v_bytes = (size_t)(x->kv_rows * c->hk * dvo_of(c) * kv_esz);
    }
    assert_true(!c->combined || dvo_of(c) == c->d);
    x->q_bytes = (size_t)(x->q_rows * c->hq * c->d * esz);
    x->out_bytes = (size_t)(x->q_rows * c->hq * dvo_of(c) * esz);
    x->q = malloc(x->q_bytes + 1);
    memset(x->q, 0xff, x->q_bytes);
    for (int64_t r = x->qo_indptr[0]; r < x->qo_indptr[B]; r++)
        for (int64_t i = 0; i < (int64_t)c->hq * c->d; i++)
            cinfer_test_store(c->dtype, x->q, r * c->hq * c->d + i,
                              cinfer_test_rng_uniform(rng, -2.0, 2.0));
    const size_t k_bytes = c->combined ? 2 * x->kv_bytes : x->kv_bytes;
    x->k = malloc(k_bytes + 1);
    memset(x->k, 0xff, k_bytes); /* NaN in every dtype (e4m3 and e5m2: 0xff is NaN) */
    if (!c->combined) {
        x->v = malloc(x->v_bytes + 1);
        memset(x->v, 0xff, x->v_bytes);
    }
    const kv_strides s = strides_of(c, x, c->d), sv = strides_of(c, x, dvo_of(c));
    for (int b = 0; b < B; b++)
        for (int t = 0; t < x->kv_len[b]; t++)
            for (int h = 0; h < c->hk; h++) {
                const int64_t row = kv_row(c, x, &s, b, t, h), v_row = kv_row(c, x, &sv, b, t, h);
                for (int i = 0; i < c->d || i < dvo_of(c); i++) {
                    if (i < c->d)
                        cinfer_test_store(kv_dtype_of(c), x->k, row + i,
                                          cinfer_test_rng_uniform(rng, -1, 1));
                    if (i < dvo_of(c))
                        cinfer_test_store(kv_dtype_of(c), c->combined ? x->k : x->v,
                                          v_row + sv.v_offset + i,
                                          cinfer_test_rng_uniform(rng, -1, 1));
                }
            }
}

/* Allocates the device buffers for x's sizes (poisoned outputs). */
static void alloc_device(const bp_case *c, bp_data *x) {
    CINFER_TEST_OK(cinfer_test_buf_alloc(&x->d_q, x->q_bytes));
    CINFER_TEST_OK(cinfer_test_buf_alloc(&x->d_k, c->combined ? 2 * x->kv_bytes : x->kv_bytes));
    if (!c->combined)
        CINFER_TEST_OK(cinfer_test_buf_alloc(&x->d_v, x->v_bytes));
    CINFER_TEST_OK(cinfer_test_buf_alloc(&x->d_out, x->out_bytes));
    CINFER_TEST_OK(cinfer_test_buf_alloc(&x->d_lse, (size_t)(x->q_rows * c->hq) * 4));
    if (c->paged)
        CINFER_TEST_OK(cinfer_test_buf_alloc(&x->d_indices, (size_t)x->num_indices * 4));
}

/* Uploads the inputs and re-poisons the outputs. */
static void upload(const bp_case *c, bp_data *x) {
    CINFER_TEST_OK(cinfer_test_buf_upload(&x->d_q, 0, x->q, x->q_bytes));
    CINFER_TEST_OK(
        cinfer_test_buf_upload(&x->d_k, 0, x->k, c->combined ? 2 * x->kv_bytes : x->kv_bytes));
    if (!c->combined)
        CINFER_TEST_OK(cinfer_test_buf_upload(&x->d_v, 0, x->v, x->v_bytes));
    if (c->paged)
        CINFER_TEST_OK(
            cinfer_test_buf_upload(&x->d_indices, 0, x->indices, (size_t)x->num_indices * 4));
    CINFER_TEST_OK(cinfer_test_buf_poison(&x->d_out));
    CINFER_TEST_OK(cinfer_test_buf_poison(&x->d_lse));
}

typedef struct bp_tensors {
    cinfer_test_tensor q, k, v, indices, out, lse;
} bp_tensors;

static void make_tensors(const bp_case *c, const bp_data *x, bp_tensors *t) {
    const int64_t q_shape[3] = {x->q_rows, c->hq, c->d}, lse_shape[2] = {x->q_rows, c->hq};
    const int64_t out_shape[3] = {x->q_rows, c->hq, dvo_of(c)};
    cinfer_test_tensor_init(&t->q, &x->d_q, 0, 0, c->dtype, 3, q_shape, NULL);
    cinfer_test_tensor_init(&t->out, &x->d_out, 0, 0, c->dtype, 3, out_shape, NULL);
    cinfer_test_tensor_init(&t->lse, &x->d_lse, 0, 0, CINFER__DT_F32, 2, lse_shape, NULL);
    const bool nhd = c->layout == CINFER_KV_LAYOUT_NHD;
    if (!c->paged) {
        const int64_t shape[3] = {nhd ? x->kv_rows : c->hk, nhd ? c->hk : x->kv_rows, c->d};
        const int64_t v_shape[3] = {shape[0], shape[1], dvo_of(c)};
        cinfer_test_tensor_init(&t->k, &x->d_k, 0, 0, kv_dtype_of(c), 3, shape, NULL);
        cinfer_test_tensor_init(&t->v, &x->d_v, 0, 0, kv_dtype_of(c), 3, v_shape, NULL);
        return;
    }
    const int64_t a = nhd ? c->page_size : c->hk, b = nhd ? c->hk : c->page_size;
    if (c->combined) {
        const int64_t shape[5] = {x->kv_rows, 2, a, b, c->d};
        cinfer_test_tensor_init(&t->k, &x->d_k, 0, 0, kv_dtype_of(c), 5, shape, NULL);
    } else {
        const int64_t shape[4] = {x->kv_rows, a, b, c->d},
                      v_shape[4] = {x->kv_rows, a, b, dvo_of(c)};
        cinfer_test_tensor_init(&t->k, &x->d_k, 0, 0, kv_dtype_of(c), 4, shape, NULL);
        cinfer_test_tensor_init(&t->v, &x->d_v, 0, 0, kv_dtype_of(c), 4, v_shape, NULL);
    }
    const int64_t i_shape[1] = {x->num_indices};
    cinfer_test_tensor_init(&t->indices, &x->d_indices, 0, 0, CINFER__DT_I32, 1, i_shape, NULL);
}

static cinfer_attention_options_t options_for(const bp_case *c, int max_batch) {
    cinfer_attention_options_t o = CINFER_ATTENTION_OPTIONS_INIT;
    o.num_qo_heads = c->hq;
    o.num_kv_heads = c->hk;
    o.head_dim = c->d;
    o.head_dim_vo = c->dvo;
    o.page_size = c->page_size;
    o.kv_layout = c->layout;
    o.q_dtype = cinfer_test_dl_dtype(c->dtype);
    o.kv_dtype = cinfer_test_dl_dtype(kv_dtype_of(c));
    o.sm_scale = c->sm_scale;
    o.logits_soft_cap = c->soft_cap;
    o.window_left = c->window_left;
    o.k_scale = c->k_scale;
    o.v_scale = c->v_scale;
    o.max_batch_size = max_batch;
    if (c->rope) {
        o.pos_encoding_mode = CINFER_POS_ENCODING_ROPE_LLAMA;
        if (c->rope_scale > 0)
            o.rope_scale = c->rope_scale;
        if (c->rope_theta > 0)
            o.rope_theta = c->rope_theta;
    }
    return o;
}

/* The reference for every row of q (rows outside the requests stay 0 and are not compared). */
static void reference(const bp_case *c, const bp_data *x, double *o, double *lse) {
    cinfer__ref_heads_t heads = {c->hq, c->hk, c->d, dvo_of(c)};
    cinfer__ref_strided3_t q;
    cinfer__ref_strided3_packed(&q, x->q, cinfer_test_ref_dtype_of(c->dtype),
                                CINFER__REF_LAYOUT_NHD, x->q_rows, c->hq, c->d);
    cinfer__ref_attn_opts_t opts;
    cinfer__ref_attn_opts_init(&opts, c->d);
    if (c->sm_scale > 0)
        opts.sm_scale = c->sm_scale;
    opts.causal = c->causal != 0;
    opts.window_left = c->window_left;
    opts.logits_soft_cap = c->soft_cap;
    opts.rope_llama = c->rope != 0;
    opts.rope_scale = c->rope_scale > 0 ? c->rope_scale : 1.0;
    opts.rope_theta = c->rope_theta > 0 ? c->rope_theta : 1e4;
    /* prefill rounds the rotated q and k to its 16-bit operands (include/cinfer.h) */
    opts.rope_round = (int)cinfer_test_ref_dtype_of(c->dtype);
    opts.k_scale = c->k_scale;
    opts.v_scale = c->v_scale;
    uint8_t *mask = NULL;
    if (g_tv) {
        tv_ref_opts(g_tv, -1, &opts);
        if (g_tv->kind == TV_USER) {
            /* The user variant's mask, per request [qo_len, kv_len], rows at their positions. */
            int64_t total = 0;
            for (int b = 0; b < c->batch; b++)
                total += (int64_t)x->qo_len[b] * x->kv_len[b];
            mask = malloc((size_t)total + 1);
            int64_t at = 0;
            for (int b = 0; b < c->batch; b++)
                for (int i = 0; i < x->qo_len[b]; i++)
                    for (int j = 0; j < x->kv_len[b]; j++)
                        mask[at++] = (uint8_t)tv_user_keep(i + x->kv_len[b] - x->qo_len[b], j);
        }
    }
    const kv_strides s = strides_of(c, x, c->d), sv = strides_of(c, x, dvo_of(c));
    int rc;
    if (!c->paged) {
        const cinfer__ref_dtype_t kvd = cinfer_test_ref_dtype_of(kv_dtype_of(c));
        cinfer__ref_strided3_t k = {x->k, kvd, s.token, s.head, 1};
        cinfer__ref_strided3_t v = {x->v, kvd, sv.token, sv.head, 1};
        rc = cinfer__ref_batch_ragged(&heads, c->batch, &q, x->qo_indptr, &k, &v, x->kv_indptr,
                                      g_tv && g_tv->kind == TV_MASK ? g_tv->mask : mask, NULL,
                                      &opts, o, lse);
    } else {
        const size_t esz = cinfer__dtype_size(kv_dtype_of(c));
        cinfer__ref_paged_t k = {
            x->k, cinfer_test_ref_dtype_of(kv_dtype_of(c)), s.page, s.token, s.head, 1};
        cinfer__ref_paged_t v = {
            x->v, cinfer_test_ref_dtype_of(kv_dtype_of(c)), sv.page, sv.token, sv.head, 1};
        if (c->combined)
            v.data = x->k + (size_t)s.v_offset * esz;
        cinfer__ref_page_table_t table = {c->batch,     c->page_size, x->kv_rows,
                                          x->kv_indptr, x->indices,   x->last};
        rc = cinfer__ref_batch_paged(&heads, &q, x->qo_indptr, &k, &v, &table,
                                     g_tv && g_tv->kind == TV_MASK ? g_tv->mask : mask, NULL, &opts,
                                     o, lse);
    }
    free(mask);
    if (rc != 0)
        fail_msg("%s: the reference failed (%d)", c->desc, rc);
}

/* Downloads the outputs and checks canaries, untouched rows, NaN, values and LSE. */
static void check_outputs(const bp_case *c, bp_data *x, uint64_t seed) {
    CINFER_TEST_OK(cinfer_test_buf_check_canaries(&x->d_out));
    CINFER_TEST_OK(cinfer_test_buf_check_canaries(&x->d_lse));
    CINFER_TEST_OK(cinfer_test_buf_check_canaries(&x->d_q));
    CINFER_TEST_OK(cinfer_test_buf_check_canaries(&x->d_k));
    const int64_t row_elems = (int64_t)c->hq * dvo_of(c);
    uint16_t *out = malloc(x->out_bytes + 2);
    float *lse = malloc((size_t)(x->q_rows * c->hq) * 4 + 4);
    CINFER_TEST_OK(cinfer_test_buf_download(&x->d_out, 0, out, x->out_bytes));
    CINFER_TEST_OK(cinfer_test_buf_download(&x->d_lse, 0, lse, (size_t)(x->q_rows * c->hq) * 4));
    const int64_t r0 = x->qo_indptr[0], r1 = x->qo_indptr[x->batch];
    for (int64_t r = 0; r < x->q_rows; r++) {
        const bool owned = r >= r0 && r < r1;
        for (int64_t i = 0; i < row_elems; i++) {
            const uint16_t bits = out[r * row_elems + i];
            if (!owned && bits != 0xffff)
                fail_msg("%s: out row %lld (no request's) element %lld was written (0x%04x)",
                         c->desc, (long long)r, (long long)i, bits);
            if (owned && isnan(cinfer_test_load(c->dtype, out, r * row_elems + i)))
                fail_msg("%s: out row %lld element %lld is NaN", c->desc, (long long)r,
                         (long long)i);
        }
        for (int h = 0; h < c->hq; h++) {
            uint32_t bits;
            memcpy(&bits, &lse[r * c->hq + h], 4);
            if ((!owned || !c->lse) && bits != 0xffffffffu)
                fail_msg("%s: lse row %lld head %d was written (0x%08x) though %s", c->desc,
                         (long long)r, h, bits,
                         c->lse ? "no request owns the row" : "lse was NULL");
        }
    }
    double *ref_o = calloc((size_t)(x->q_rows * row_elems) + 1, sizeof(double));
    double *ref_lse = calloc((size_t)(x->q_rows * c->hq) + 1, sizeof(double));
    reference(c, x, ref_o, ref_lse);
    const int64_t n = (r1 - r0) * row_elems;
    CINFER_TEST_ASSERT_CLOSE(
        cinfer_test_compare(c->dtype, out + r0 * row_elems, ref_o + r0 * row_elems, n,
                            cinfer_test_value_tolerance(c->dtype),
                            g_tv ? tv_max_abs_tol(g_tv, ref_o + r0 * row_elems, n) : 0.05, 1e-3),
        "out", c->desc, seed);
    if (c->lse)
        CINFER_TEST_ASSERT_LSE_CLOSE(cinfer_test_compare_lse(lse + r0 * c->hq, ref_lse + r0 * c->hq,
                                                             (r1 - r0) * c->hq,
                                                             is_fp8(c) ? 2e-3 : 1e-4),
                                     "lse", c->desc, seed);
    free(ref_o);
    free(ref_lse);
    free(out);
    free(lse);
}

static cinfer_status_t run_op(cinfer_batch_prefill_t *op, const bp_case *c, bp_tensors *t) {
    return cinfer_batch_prefill_run(op, &t->q.t, &t->k.t, c->combined ? NULL : &t->v.t,
                                    c->paged ? &t->indices.t : NULL, &t->out.t,
                                    c->lse ? &t->lse.t : NULL, g_tv ? tv_args(g_tv) : NULL, stream);
}

/* Captures one run of op into a CUDA graph and instantiates it. */
static void capture_run(cinfer_batch_prefill_t *op, const bp_case *c, bp_tensors *t, CUgraph *graph,
                        CUgraphExec *exec) {
    assert_int_equal(cu->cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
                     CUDA_SUCCESS);
    cinfer_status_t st = run_op(op, c, t);
    assert_int_equal(cu->cuStreamEndCapture(stream, graph), CUDA_SUCCESS);
    CINFER_TEST_OK(st);
    assert_int_equal(cu->cuGraphInstantiate(exec, *graph, 0), CUDA_SUCCESS);
}

static cinfer_batch_prefill_t *make_op(const bp_case *c, bp_data *x, int max_batch,
                                       int64_t max_total, int graph) {
    cinfer_attention_options_t o = options_for(c, max_batch);
    o.use_cuda_graph = graph;
    o.variant = g_tv ? g_tv->variant : NULL;
    const cinfer_kv_storage_t storage =
        c->paged ? CINFER_KV_STORAGE_PAGED : CINFER_KV_STORAGE_RAGGED;
    size_t ws = 0;
    CINFER_TEST_OK(
        cinfer_batch_prefill_workspace_size(ctx, &o, storage, c->causal, max_total, &ws));
    CINFER_TEST_OK(cinfer_test_buf_alloc(&x->d_ws, ws));
    cinfer_batch_prefill_t *op = NULL;
    CINFER_TEST_OK(cinfer_batch_prefill_create(ctx, &o, storage, c->causal, max_total,
                                               (void *)(uintptr_t)x->d_ws.ptr, ws, &op));
    return op;
}

/* The capture set-up of the graph-mode tests: case c's data (from seed; capacities q_cap rows and
 * kv_cap rows or pages) on the device, its tensors, and a graph-mode object of max_batch requests
 * and max_total query rows planned for it. */
static cinfer_batch_prefill_t *graph_setup(const bp_case *c, uint64_t seed, int64_t q_cap,
                                           int64_t kv_cap, int max_batch, int64_t max_total,
                                           bp_data *x, bp_tensors *t) {
    cinfer_test_rng rng;
    cinfer_test_rng_init(&rng, seed);
    make_data(c, &rng, x, q_cap, kv_cap);
    alloc_device(c, x);
    upload(c, x);
    make_tensors(c, x, t);
    cinfer_batch_prefill_t *op = make_op(c, x, max_batch, max_total, 1);
    CINFER_TEST_OK(
        cinfer_batch_prefill_plan(op, x->qo_indptr, x->kv_indptr, x->last, c->batch, stream));
    return op;
}

/* A graph replay's step: case c's host data (from seed) in the device buffers of the captured
 * data x, uploaded and planned into op. */
static void graph_replan(cinfer_batch_prefill_t *op, const bp_case *c, uint64_t seed, int64_t q_cap,
                         int64_t kv_cap, const bp_data *x, bp_data *y) {
    cinfer_test_rng rng;
    cinfer_test_rng_init(&rng, seed);
    make_data(c, &rng, y, q_cap, kv_cap);
    y->d_q = x->d_q, y->d_k = x->d_k, y->d_v = x->d_v, y->d_out = x->d_out, y->d_lse = x->d_lse;
    y->d_indices = x->d_indices;
    assert_true(y->num_indices <= x->num_indices);
    upload(c, y);
    CINFER_TEST_OK(
        cinfer_batch_prefill_plan(op, y->qo_indptr, y->kv_indptr, y->last, c->batch, stream));
}

/* One case end to end; kv_cap: 0, or the paged pool's size in pages. */
static void run_case_in(const bp_case *c, uint64_t seed, int64_t kv_cap) {
    cinfer_test_case(c->desc);
    cinfer_test_rng rng;
    cinfer_test_rng_init(&rng, seed);
    bp_data x;
    make_data(c, &rng, &x, 0, kv_cap);
    if (g_tv && g_tv->kind == TV_MASK)
        tv_setup_mask(g_tv, &rng, c->batch, x.qo_len, x.kv_len);
    alloc_device(c, &x);
    upload(c, &x);
    bp_tensors t;
    make_tensors(c, &x, &t);
    const int64_t total = x.qo_indptr[c->batch] - x.qo_indptr[0];
    cinfer_batch_prefill_t *op =
        make_op(c, &x, c->batch > 0 ? c->batch : 1, total > 0 ? total : 1, 0);
    CINFER_TEST_OK(cinfer_batch_prefill_plan(op, x.qo_indptr, x.kv_indptr, c->paged ? x.last : NULL,
                                             c->batch, stream));
    const int chunk = cinfer__batch_prefill_chunk_size(op);
    if ((c->expect_split > 0 && chunk == 0) || (c->expect_split < 0 && chunk != 0))
        fail_msg("%s: the plan %s the KV (chunk size %d)", c->desc,
                 chunk ? "split" : "did not split", chunk);
    if (c->expect_group && cinfer__batch_prefill_group(op) != c->expect_group)
        fail_msg("%s: the object packs %d query heads per KV head, expected %d", c->desc,
                 cinfer__batch_prefill_group(op), c->expect_group);
    const bool sm90 = cinfer__batch_prefill_sm90(op);
    if ((c->expect_sm90 > 0 && !sm90) || (c->expect_sm90 < 0 && sm90))
        fail_msg("%s: the plan %s the sm90 kernel", c->desc, sm90 ? "runs" : "does not run");
    CINFER_TEST_OK(run_op(op, c, &t));
    CINFER_TEST_SYNC(stream);
    /* The workspace is exactly what workspace_size reported: nothing past it is written. */
    CINFER_TEST_OK(cinfer_test_buf_check_canaries(&x.d_ws));
    check_outputs(c, &x, seed);
    cinfer_batch_prefill_destroy(op);
    free_data(&x);
}

static void run_case(const bp_case *c, uint64_t seed) {
    run_case_in(c, seed, 0);
}

/* run_case with variant `kind` (parameters drawn from the seed) set up for its duration. */
static void run_variant_case(const bp_case *c, tv_kind kind, uint64_t seed) {
    cinfer_test_rng rng;
    cinfer_test_rng_init(&rng, seed ^ 0x77);
    tv_state tv;
    tv_setup(&tv, kind, c->hq, &rng, 0, 0, NULL, 0, 0);
    g_tv = &tv;
    run_case(c, seed);
    g_tv = NULL;
    tv_free(&tv);
}

/* Every test's teardown: a case that failed inside run_variant_case left g_tv at its stack
 * variant (the tests after it then read freed memory), one that failed among sm90_kernel's
 * unfolded maps left them on, and the buffers it allocated. */
static int teardown_case(void **state) {
    g_tv = NULL;
    cinfer__batch_prefill_test_no_fold(false);
    return cinfer_test_teardown_buffers(state);
}

/* ---- tests ---- */

static void llama_heads(void **state) {
    (void)state;
    for (int paged = 0; paged < 2; paged++)
        for (int causal = 0; causal < 2; causal++) {
            char desc[64];
            snprintf(desc, sizeof desc, "Llama heads %s causal %d", paged ? "paged" : "ragged",
                     causal);
            bp_case c = base_case(desc);
            c.paged = paged;
            c.causal = causal;
            run_case(&c, cinfer_test_seed() + 100 + 2 * (uint64_t)paged + (uint64_t)causal);
        }
}

static void page_sizes_and_layouts(void **state) {
    (void)state;
    static const int pages[] = {1, 3, 16, 17, 100, 256};
    for (size_t i = 0; i < sizeof pages / sizeof pages[0]; i++)
        for (int hnd = 0; hnd < 2; hnd++) {
            char desc[96];
            bp_case c = base_case("");
            c.page_size = pages[i];
            c.layout = hnd ? CINFER_KV_LAYOUT_HND : CINFER_KV_LAYOUT_NHD;
            c.combined = (int)(i + (size_t)hnd) % 2;
            c.hq = 8;
            c.hk = 2;
            c.batch = 5;
            c.max_kv = 900;
            snprintf(desc, sizeof desc, "page %d %s%s", c.page_size, hnd ? "HND" : "NHD",
                     c.combined ? " combined" : "");
            c.desc = desc;
            run_case(&c, cinfer_test_seed() + 200 + 2 * i + (uint64_t)hnd);
        }
    /* Ragged HND. */
    bp_case c = base_case("ragged HND");
    c.paged = 0;
    c.layout = CINFER_KV_LAYOUT_HND;
    run_case(&c, cinfer_test_seed() + 230);
}

static void head_dims_dtypes_and_groups(void **state) {
    (void)state;
    static const int dims[] = {64, 128, 256, 80, 208};
    static const int groups[][2] = {{4, 4}, {6, 2}, {4, 1}, {8, 1}, {16, 2}};
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++) {
        char desc[96];
        bp_case c = base_case("");
        c.d = dims[i];
        c.hq = groups[i][0];
        c.hk = groups[i][1];
        c.dtype = i == 1 ? CINFER__DT_F16 : CINFER__DT_BF16;
        c.paged = i % 2 == 0;
        c.page_size = 16;
        snprintf(desc, sizeof desc, "D %d %s heads %d/%d %s", c.d, cinfer__dtype_name(c.dtype),
                 c.hq, c.hk, c.paged ? "paged" : "ragged");
        c.desc = desc;
        run_case(&c, cinfer_test_seed() + 300 + i);
    }
}

/* Decode-like and chunked-prefill batches: few rows per request, so the 32-row tile, and many
 * requests (up to 64). */
static void short_queries(void **state) {
    (void)state;
    static const int max_qo[] = {1, 8, 40, 100};
    for (size_t i = 0; i < sizeof max_qo / sizeof max_qo[0]; i++) {
        char desc[64];
        bp_case c = base_case("");
        c.batch = i % 2 ? 64 : 33;
        c.max_qo = max_qo[i];
        c.max_kv = 4000;
        c.paged = i != 2;
        snprintf(desc, sizeof desc, "short queries: batch %d, qo_len <= %d", c.batch, c.max_qo);
        c.desc = desc;
        run_case(&c, cinfer_test_seed() + 400 + i);
    }
}

static void masks_and_edges(void **state) {
    (void)state;
    /* qo_len > kv_len, empty KV, empty queries, one row, lengths around the tiles. */
    static const int qo[] = {100, 5, 0, 1, 129, 64, 300, 33, 1000};
    static const int kv[] = {10, 0, 50, 1, 65, 64, 299, 4000, 1000};
    for (int causal = 0; causal < 2; causal++) {
        char desc[64];
        snprintf(desc, sizeof desc, "edge lengths causal %d", causal);
        bp_case c = base_case(desc);
        c.batch = 9;
        c.qo_lens = qo;
        c.kv_lens = kv;
        c.hq = 4;
        c.hk = 2;
        c.causal = causal;
        run_case(&c, cinfer_test_seed() + 500 + (uint64_t)causal);
    }
    static const int windows[] = {0, 17, 200};
    for (size_t i = 0; i < 3; i++) {
        char desc[64];
        snprintf(desc, sizeof desc, "window %d", windows[i]);
        bp_case c = base_case(desc);
        c.window_left = windows[i];
        c.causal = i != 1;
        c.paged = i != 2;
        c.hq = 8;
        c.hk = 2;
        run_case(&c, cinfer_test_seed() + 510 + i);
    }
    bp_case c = base_case("soft cap 30, sm_scale 0.5");
    c.soft_cap = 30.0f;
    c.sm_scale = 0.5f;
    c.hq = 8;
    c.hk = 2;
    run_case(&c, cinfer_test_seed() + 520);
    c = base_case("soft cap 20 + window 64, no lse");
    c.soft_cap = 20.0f;
    c.window_left = 64;
    c.lse = 0;
    c.hq = 8;
    c.hk = 2;
    run_case(&c, cinfer_test_seed() + 521);
}

/*
 * The batch kernels with 32 query rows per warp at D = 128 (tile_q 128 on four warps; the default
 * tiles keep 16 rows per warp, so the test swaps them in as the largest batch tile), ragged and
 * paged, causal and not, one batch with a soft cap and a window. The mean query length (~120)
 * picks the 128-row tile.
 */
static void wide_warp_tiles(void **state) {
    (void)state;
    static const cinfer__prefill_config_t tiles[] = {{128, 64, 4, 2, false},
                                                     {128, 32, 4, 3, false}};
    static const int qo[] = {200, 77, 130, 1, 190};
    static const int kv[] = {300, 77, 100, 40, 500};
    int n = 0;
    for (size_t i = 0; i < sizeof tiles / sizeof tiles[0]; i++) {
        cinfer__prefill_test_default_config(&tiles[i]);
        for (int paged = 0; paged < 2; paged++)
            for (int causal = 0; causal < 2; causal++) {
                char desc[96];
                bp_case c = base_case("");
                c.batch = 5;
                c.qo_lens = qo;
                c.kv_lens = kv;
                c.hq = 8;
                c.hk = 2;
                c.paged = paged;
                c.causal = causal;
                if (i == 1 && paged && causal) {
                    c.soft_cap = 30.0f;
                    c.window_left = 150;
                }
                snprintf(desc, sizeof desc, "tiles q%d kv%d w%d s%d %s causal %d%s",
                         tiles[i].tile_q, tiles[i].tile_kv, tiles[i].warps, tiles[i].stages,
                         paged ? "paged" : "ragged", causal,
                         c.soft_cap > 0 ? " soft cap 30 window 150" : "");
                c.desc = desc;
                run_case(&c, cinfer_test_seed() + 550 + (uint64_t)n++);
            }
    }
    cinfer__prefill_test_default_config(NULL);
}

/* wide_warp_tiles' teardown: the default tiles come back even when a case failed. */
static int teardown_default_tiles(void **state) {
    cinfer__prefill_test_default_config(NULL);
    return teardown_case(state);
}

/* Random batches over the kernel sets the cases above already compiled (the dtype, head dim and
 * flags come from that menu; everything else is random). */
static void randomized_grid(void **state) {
    (void)state;
    for (int i = 0; i < 12; i++) {
        const uint64_t seed = cinfer_test_seed() + 800 + (uint64_t)i;
        cinfer_test_rng rng;
        cinfer_test_rng_init(&rng, seed ^ 0x5bd1e995u);
        static const int pages[] = {1, 5, 16, 64, 256};
        static const int groups[] = {1, 2, 3, 4, 8};
        char desc[160];
        bp_case c = base_case("");
        c.batch = 1 + (int)cinfer_test_rng_below(&rng, 64);
        c.max_qo = 1 + (int)cinfer_test_rng_below(&rng, 1000);
        c.max_kv = (int)cinfer_test_rng_below(&rng, 4001);
        c.hk = 1 + (int)cinfer_test_rng_below(&rng, 2);
        c.hq = c.hk * groups[cinfer_test_rng_below(&rng, 5)];
        c.paged = cinfer_test_rng_below(&rng, 2) != 0;
        c.page_size = pages[cinfer_test_rng_below(&rng, 5)];
        c.layout = cinfer_test_rng_below(&rng, 2) ? CINFER_KV_LAYOUT_HND : CINFER_KV_LAYOUT_NHD;
        c.combined = c.paged && cinfer_test_rng_below(&rng, 2);
        c.causal = cinfer_test_rng_below(&rng, 3) != 0;
        c.lse = cinfer_test_rng_below(&rng, 4) != 0;
        snprintf(desc, sizeof desc,
                 "random %d: batch %d qo <= %d kv <= %d heads %d/%d %s page %d %s%s causal %d", i,
                 c.batch, c.max_qo, c.max_kv, c.hq, c.hk, c.paged ? "paged" : "ragged", c.page_size,
                 c.layout == CINFER_KV_LAYOUT_HND ? "HND" : "NHD", c.combined ? " combined" : "",
                 c.causal);
        c.desc = desc;
        run_case(&c, seed);
    }
}

/* sm90_kernel's requests: six of up to 400 rows over up to 900 keys (an empty query and an empty
 * KV among them); two long prompts' last chunks (100-150 rows over 5k-6k keys: split-KV); and for
 * D = 256, which runs with a quarter of the heads (the same group sizes) so that its float64
 * reference takes about D = 64's time, 20 short requests (qo 0, kv 0, qo > kv among them) so that
 * its plans still have the CTAs to fill the SMs with the sm90 tile (a plan with fewer gives it up
 * for a smaller tile). */
static const int sm90_qo[] = {400, 0, 200, 129, 300, 64}, sm90_kv[] = {500, 50, 200, 900, 300, 0};
static const int sm90_qo_split[] = {150, 100}, sm90_kv_split[] = {6000, 5000};
static const int sm90_qo_d256[] = {96, 120, 64,  128, 100, 33,  128, 90, 70,  128,
                                   0,  111, 128, 64,  77,  128, 100, 50, 128, 96};
static const int sm90_kv_d256[] = {96, 300, 64,  200, 400, 33,  100, 250, 70,  128,
                                   40, 111, 260, 64,  177, 128, 300, 50,  128, 0};

/* A paged sm90_kernel case at head dim d that must take the sm90 kernel: the six requests with
 * 32 / 8 heads, or at D = 256 the 20 short ones with 8 / 2. */
static bp_case sm90_paged_case(int d) {
    bp_case c = base_case("");
    c.d = d;
    c.paged = 1;
    c.batch = d == 256 ? 20 : 6;
    c.qo_lens = d == 256 ? sm90_qo_d256 : sm90_qo;
    c.kv_lens = d == 256 ? sm90_kv_d256 : sm90_kv;
    if (d == 256) {
        c.hq = 8;
        c.hk = 2;
    }
    c.expect_sm90 = 1;
    return c;
}

/*
 * The sm90 kernel (kernels/prefill_sm90.cuh; sm_90a only), which batches of long queries at D =
 * 128 with 16-bit K/V take as their largest tile: ragged and paged (pages of 8..256 rows, whole
 * boxes or parts of a page; NHD, HND, combined; pages of 17 rows keep the sm80 kernels), GQA groups
 * packed by 2, 4 and 8 or none, both masks, fp16, qo_len > kv_len, empty requests, a plan that
 * starts past row 0, split-KV (few rows over a long KV), and a short batch that keeps a smaller
 * sm80 tile. Every K/V row or slot no request owns holds NaN (the kernel zeroes V rows past a
 * request before P V).
 */
static void sm90_kernel(void **state) {
    (void)state;
    if (!cinfer_test_sm90_device(ctx, "sm90_kernel"))
        return;
    static const struct {
        int paged, page_size, layout_hnd, combined, hq, hk, causal, f16;
    } shapes[] = {
        {0, 0, 0, 0, 32, 8, 1, 0},    {0, 0, 1, 0, 32, 8, 0, 1},   {1, 16, 0, 0, 32, 8, 1, 0},
        {1, 8, 1, 1, 16, 8, 1, 0},    {1, 32, 0, 1, 32, 4, 0, 0},  {1, 64, 1, 0, 32, 8, 1, 1},
        {1, 128, 0, 0, 16, 16, 1, 0}, {1, 256, 0, 1, 32, 8, 0, 0}, {1, 256, 1, 0, 32, 8, 1, 0},
        {0, 0, 0, 0, 16, 16, 1, 0},   {1, 17, 0, 0, 32, 8, 1, 0},
    };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        char desc[160];
        bp_case c = base_case("");
        c.batch = 6;
        c.qo_lens = sm90_qo;
        c.kv_lens = sm90_kv;
        c.paged = shapes[i].paged;
        c.page_size = shapes[i].paged ? shapes[i].page_size : 16;
        c.layout = shapes[i].layout_hnd ? CINFER_KV_LAYOUT_HND : CINFER_KV_LAYOUT_NHD;
        c.combined = shapes[i].combined;
        c.hq = shapes[i].hq;
        c.hk = shapes[i].hk;
        c.causal = shapes[i].causal;
        c.dtype = shapes[i].f16 ? CINFER__DT_F16 : CINFER__DT_BF16;
        c.lse = i % 3 != 1;
        c.high_pages = i % 2;
        c.expect_sm90 = shapes[i].paged && shapes[i].page_size == 17 ? -1 : 1;
        snprintf(desc, sizeof desc, "sm90: %s page %d %s%s heads %d/%d causal %d %s",
                 c.paged ? "paged" : "ragged", c.page_size, shapes[i].layout_hnd ? "HND" : "NHD",
                 c.combined ? " combined" : "", c.hq, c.hk, c.causal, cinfer__dtype_name(c.dtype));
        c.desc = desc;
        run_case(&c, cinfer_test_seed() + 1500 + i);
    }
    /* Split-KV on the sm90 kernel: long prompts' last chunks (100-150 rows over 5k-6k). */
    {
        for (int paged = 0; paged < 2; paged++) {
            bp_case c = base_case(paged ? "sm90: split-KV, paged" : "sm90: split-KV, ragged");
            c.batch = 2;
            c.qo_lens = sm90_qo_split;
            c.kv_lens = sm90_kv_split;
            c.hq = 8;
            c.hk = 8;
            c.paged = paged;
            c.page_size = 32;
            c.causal = paged;
            c.expect_sm90 = 1;
            c.expect_split = 1;
            run_case(&c, cinfer_test_seed() + 1520 + (uint64_t)paged);
        }
    }
    /* Soft cap, window, and the variants the kernel takes (ALiBi with slopes and with the
     * paper's, sinks, custom masks), paged and ragged. */
    static const tv_kind kinds[] = {TV_NONE,  TV_NONE, TV_ALIBI, TV_ALIBI_DEFAULT,
                                    TV_SINKS, TV_MASK, TV_MASK};
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
        char desc[128];
        bp_case c = base_case("");
        c.batch = 6;
        c.qo_lens = sm90_qo;
        c.kv_lens = sm90_kv;
        c.paged = (int)(k % 2);
        c.causal = k != 2 && k != 6;
        c.soft_cap = k == 0 ? 30.0f : 0.0f;
        c.window_left = k == 1 ? 150 : -1;
        c.expect_sm90 = 1;
        snprintf(desc, sizeof desc, "sm90: %s cap %g window %d variant %s",
                 c.paged ? "paged" : "ragged", (double)c.soft_cap, c.window_left,
                 tv_name(kinds[k]));
        c.desc = desc;
        if (kinds[k] == TV_NONE) {
            run_case(&c, cinfer_test_seed() + 1540 + k);
        } else {
            c.lse = tv_has_lse(kinds[k]);
            run_variant_case(&c, kinds[k], cinfer_test_seed() + 1540 + k);
        }
    }
    /* D = 64 (P V as m64n64k16, 32 O registers per thread) and D = 256 (128 O registers, K/V
     * tiles of 64 rows in 2 stages): ragged and paged, GQA packed and not, fp16, split-KV, a soft
     * cap, a window, sinks and a custom mask; D = 256 with its short requests and a quarter of
     * the heads (8 / 8 unpacked). */
    for (int n = 0; n < 16; n++) {
        char desc[128];
        const int k = n % 8;
        bp_case c = base_case("");
        c.d = n < 8 ? 64 : 256;
        c.batch = k == 3 ? 2 : c.d == 256 ? 20 : 6;
        c.qo_lens = k == 3 ? sm90_qo_split : c.d == 256 ? sm90_qo_d256 : sm90_qo;
        c.kv_lens = k == 3 ? sm90_kv_split : c.d == 256 ? sm90_kv_d256 : sm90_kv;
        c.hq = k == 2 ? 16 : 32;
        c.hk = k == 2 ? 16 : k == 4 ? 4 : 8;
        if (c.d == 256) {
            c.hq = 8;
            c.hk = k == 2 ? 8 : k == 4 ? 1 : 2;
        }
        c.paged = k % 2;
        c.page_size = k == 5 ? 64 : 16;
        c.layout = k == 1 ? CINFER_KV_LAYOUT_HND : CINFER_KV_LAYOUT_NHD;
        c.combined = k == 5;
        c.causal = k != 1 && k != 6;
        c.dtype = k == 1 || k == 4 ? CINFER__DT_F16 : CINFER__DT_BF16;
        c.soft_cap = k == 4 ? 30.0f : 0.0f;
        c.window_left = k == 5 ? 150 : -1;
        c.lse = k != 2;
        c.expect_sm90 = 1;
        c.expect_split = k == 3;
        snprintf(desc, sizeof desc,
                 "sm90 D %d: %s page %d heads %d/%d causal %d cap %g window %d%s", c.d,
                 c.paged ? "paged" : "ragged", c.page_size, c.hq, c.hk, c.causal,
                 (double)c.soft_cap, c.window_left, k == 3 ? " split" : "");
        c.desc = desc;
        if (k < 6) {
            run_case(&c, cinfer_test_seed() + 1560 + (uint64_t)n);
        } else {
            const tv_kind kind = k == 6 ? TV_SINKS : TV_MASK;
            c.lse = tv_has_lse(kind);
            run_variant_case(&c, kind, cinfer_test_seed() + 1560 + (uint64_t)n);
        }
    }
    /* Tiles whose pages follow each other in the pool, copied as one box a tile: every
     * tile (page_runs 1) or some (runs of 5 pages: 2), NHD and HND, D = 128 and 256 (the latter
     * with D = 256's short requests above); and at D = 256 8-row pages in runs and scattered
     * 128-row pages (a tile's part of a page per box, page_runs 0). */
    static const struct {
        int page_size, page_runs, d, hnd;
    } runs[] = {{16, 1, 128, 0}, {8, 2, 128, 1}, {32, 2, 128, 0}, {16, 1, 256, 1},
                {32, 2, 256, 0}, {8, 2, 256, 0}, {128, 0, 256, 1}};
    for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++) {
        char desc[128];
        bp_case c = sm90_paged_case(runs[i].d);
        c.page_size = runs[i].page_size;
        c.page_runs = runs[i].page_runs;
        c.layout = runs[i].hnd ? CINFER_KV_LAYOUT_HND : CINFER_KV_LAYOUT_NHD;
        c.causal = (int)(i % 2);
        snprintf(desc, sizeof desc, "sm90 D %d: page %d, %s, %s, causal %d", c.d, c.page_size,
                 c.page_runs == 1   ? "consecutive pages"
                 : c.page_runs == 2 ? "runs of 5 pages"
                                    : "scattered pages",
                 runs[i].hnd ? "HND" : "NHD", c.causal);
        c.desc = desc;
        run_case(&c, cinfer_test_seed() + 1580 + (uint64_t)i);
    }
    /* D = 128 and 256 paged caches whose KV heads are not packed (forced here): boxes of 8 rows x
     * 64 columns in the interleaved layout, no page runs (D = 256 with its short requests). */
    static const struct {
        int page_size, page_runs, hnd, combined, d;
    } unfolded[] = {{16, 1, 0, 0, 128}, {8, 2, 1, 1, 128},  {256, 0, 0, 1, 128},
                    {64, 0, 1, 0, 128}, {16, 1, 1, 0, 256}, {128, 0, 0, 1, 256}};
    cinfer__batch_prefill_test_no_fold(true);
    for (size_t i = 0; i < sizeof unfolded / sizeof unfolded[0]; i++) {
        char desc[128];
        bp_case c = sm90_paged_case(unfolded[i].d);
        c.page_size = unfolded[i].page_size;
        c.page_runs = unfolded[i].page_runs;
        c.layout = unfolded[i].hnd ? CINFER_KV_LAYOUT_HND : CINFER_KV_LAYOUT_NHD;
        c.combined = unfolded[i].combined;
        c.causal = (int)(i % 2 == 0);
        c.high_pages = (int)(i % 2);
        snprintf(desc, sizeof desc, "sm90 unfolded maps: D %d, page %d, %s%s, causal %d", c.d,
                 c.page_size, unfolded[i].hnd ? "HND" : "NHD", c.combined ? " combined" : "",
                 c.causal);
        c.desc = desc;
        run_case(&c, cinfer_test_seed() + 1590 + (uint64_t)i);
    }
    cinfer__batch_prefill_test_no_fold(false);
    /* A batch of short queries keeps the sm80 kernel of a smaller tile. */
    bp_case c = base_case("sm90: short queries keep the sm80 tiles");
    c.batch = 16;
    c.max_qo = 4;
    c.expect_sm90 = -1;
    run_case(&c, cinfer_test_seed() + 1530);
}

/* The sm90 kernel at D_qk / D_vo = 192 / 128 (DeepSeek's prefill heads) over a ragged K/V and a
 * paged cache: both masks, fp16 and HND, GQA, a soft cap, a window, sinks and split-KV. */
static void sm90_kernel_d192(void **state) {
    (void)state;
    if (!cinfer_test_sm90_device(ctx, "sm90_kernel_d192"))
        return;
    /* Ragged (0-5), then paged (6-10), whose V maps have V's own head dim and strides: pages of
     * 16 rows scattered and in runs (one box per 64 columns of a tile's pages), 8-row pages HND
     * at the pool's end (64-bit offsets), 128 rows (a tile), 256 (a tile of a page's rows). The
     * split cases have a head per KV head (8 / 8), which keeps the sm90 tile (at 32 / 8 the plan
     * may take a smaller sm80 tile), so that the kernel's D_vo partial states are checked. */
    static const int page_sizes[] = {16, 8, 128, 256};
    for (int k = 0; k < 11; k++) {
        char desc[160];
        bp_case c = base_case("");
        const bool split = k == 2 || k == 10;
        c.d = 192;
        c.dvo = 128;
        c.batch = split ? 2 : 6;
        c.qo_lens = split ? sm90_qo_split : sm90_qo;
        c.kv_lens = split ? sm90_kv_split : sm90_kv;
        c.hq = split ? 8 : k == 1 || k == 7 ? 16 : 32;
        c.hk = split ? 8 : k == 1 ? 16 : k == 8 ? 4 : 8;
        c.paged = k >= 6;
        c.page_size = k >= 6 && k < 10 ? page_sizes[k - 6] : k == 10 ? 32 : 16;
        c.page_runs = k == 6 ? 1 : 0;
        c.high_pages = k == 7;
        c.layout = k == 1 || k == 7 ? CINFER_KV_LAYOUT_HND : CINFER_KV_LAYOUT_NHD;
        c.causal = k != 1 && k != 7;
        c.dtype = k == 1 || k == 7 ? CINFER__DT_F16 : CINFER__DT_BF16;
        c.soft_cap = k == 3 ? 30.0f : 0.0f;
        c.window_left = k == 4 || k == 9 ? 150 : -1;
        c.lse = k != 8;
        c.expect_group = 1;
        c.expect_sm90 = 1;
        c.expect_split = split;
        snprintf(desc, sizeof desc,
                 "sm90 D_qk 192 D_vo 128: %s page %d%s heads %d/%d causal %d cap %g window %d%s%s",
                 c.paged ? "paged" : "ragged", c.paged ? c.page_size : 0,
                 c.page_runs ? " runs" : "", c.hq, c.hk, c.causal, (double)c.soft_cap,
                 c.window_left, split ? " split" : "", k == 5 ? " sinks" : "");
        c.desc = desc;
        if (k == 5) {
            c.lse = tv_has_lse(TV_SINKS);
            run_variant_case(&c, TV_SINKS, cinfer_test_seed() + 1600 + (uint64_t)k);
        } else {
            run_case(&c, cinfer_test_seed() + 1600 + (uint64_t)k);
        }
    }
}

/* fp8 K/V (e4m3, e5m2) on the sm90 kernel (each K/V tile converted to fp16 in shared memory):
 * ragged and paged (pages of 8-256 rows, scattered, in runs and at the pool's end, a combined
 * cache), D = 64, 128 and 256, both masks, fp16 and bf16 q, GQA packed and not, HND, k_scale /
 * v_scale, split-KV, a soft cap, a window and sinks. */
static void sm90_kernel_fp8(void **state) {
    (void)state;
    if (!cinfer_test_sm90_device(ctx, "sm90_kernel_fp8"))
        return;
    static const struct {
        int d, paged, page_size, runs, high, combined, hnd, causal, e5m2, f16, hq, hk, scales;
        int split, window;
        float cap;
        tv_kind variant;
    } cases[] = {
        {128, 0, 0, 0, 0, 0, 0, 1, 0, 0, 32, 8, 0, 0, -1, 0.0f, TV_NONE},
        {128, 0, 0, 0, 0, 0, 1, 0, 1, 1, 16, 16, 1, 0, -1, 0.0f, TV_NONE},
        {128, 1, 16, 0, 0, 0, 0, 1, 0, 0, 32, 8, 1, 0, -1, 0.0f, TV_NONE},
        {128, 1, 8, 0, 1, 0, 1, 1, 1, 0, 16, 8, 0, 0, -1, 0.0f, TV_NONE},
        {128, 1, 64, 1, 0, 0, 0, 0, 0, 1, 32, 4, 0, 0, -1, 0.0f, TV_NONE},
        {128, 1, 256, 0, 0, 1, 0, 1, 1, 0, 32, 8, 0, 0, -1, 0.0f, TV_NONE},
        {64, 1, 16, 0, 0, 0, 0, 1, 1, 0, 32, 8, 0, 0, -1, 0.0f, TV_NONE},
        {256, 1, 16, 0, 0, 0, 1, 1, 0, 1, 8, 2, 1, 0, -1, 0.0f, TV_NONE},
        {256, 0, 0, 0, 0, 0, 0, 0, 1, 0, 8, 8, 0, 0, -1, 0.0f, TV_NONE},
        {128, 0, 0, 0, 0, 0, 0, 1, 0, 0, 8, 8, 0, 1, -1, 0.0f, TV_NONE},
        {128, 1, 32, 0, 0, 0, 0, 0, 1, 0, 8, 8, 1, 1, -1, 0.0f, TV_NONE},
        {128, 1, 16, 0, 0, 0, 0, 1, 0, 0, 32, 8, 0, 0, -1, 30.0f, TV_NONE},
        {128, 0, 0, 0, 0, 0, 0, 1, 1, 0, 32, 8, 0, 0, 150, 0.0f, TV_NONE},
        {128, 1, 16, 0, 0, 0, 0, 1, 0, 1, 32, 8, 0, 0, -1, 0.0f, TV_SINKS},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char desc[192];
        bp_case c = base_case("");
        c.d = cases[i].d;
        c.batch = cases[i].split ? 2 : c.d == 256 ? 20 : 6;
        c.qo_lens = cases[i].split ? sm90_qo_split : c.d == 256 ? sm90_qo_d256 : sm90_qo;
        c.kv_lens = cases[i].split ? sm90_kv_split : c.d == 256 ? sm90_kv_d256 : sm90_kv;
        c.paged = cases[i].paged;
        c.page_size = c.paged ? cases[i].page_size : 16;
        c.page_runs = cases[i].runs;
        c.high_pages = cases[i].high;
        c.combined = cases[i].combined;
        c.layout = cases[i].hnd ? CINFER_KV_LAYOUT_HND : CINFER_KV_LAYOUT_NHD;
        c.causal = cases[i].causal;
        c.kv_dtype = cases[i].e5m2 ? CINFER__DT_E5M2 : CINFER__DT_E4M3;
        c.dtype = cases[i].f16 ? CINFER__DT_F16 : CINFER__DT_BF16;
        c.hq = cases[i].hq;
        c.hk = cases[i].hk;
        if (cases[i].scales) {
            c.k_scale = 0.7f;
            c.v_scale = 2.5f;
        }
        c.soft_cap = cases[i].cap;
        c.window_left = cases[i].window;
        c.expect_sm90 = 1;
        c.expect_split = cases[i].split;
        snprintf(desc, sizeof desc,
                 "sm90 fp8 %s D %d: %s page %d%s%s%s%s heads %d/%d causal %d q %s%s%s cap %g "
                 "window %d %s",
                 cinfer__dtype_name(c.kv_dtype), c.d, c.paged ? "paged" : "ragged",
                 c.paged ? c.page_size : 0, c.page_runs ? " runs" : "", c.high_pages ? " high" : "",
                 c.combined ? " combined" : "", cases[i].hnd ? " HND" : "", c.hq, c.hk, c.causal,
                 cinfer__dtype_name(c.dtype), cases[i].scales ? " k/v scales" : "",
                 cases[i].split ? " split" : "", (double)c.soft_cap, c.window_left,
                 tv_name(cases[i].variant));
        c.desc = desc;
        if (cases[i].variant != TV_NONE) {
            c.lse = tv_has_lse(cases[i].variant);
            run_variant_case(&c, cases[i].variant, cinfer_test_seed() + 1700 + i);
        } else {
            run_case(&c, cinfer_test_seed() + 1700 + i);
        }
    }
}

/*
 * Split-KV: few query rows over a long KV, where the query tiles alone fill a small part of the
 * GPU, so the plan splits each tile's KV into chunks and the merge kernel folds their float32
 * partial states into out and lse. Every case checks that the plan split (few heads keep the
 * unsplit grid far below one wave of an H200) and compares with the reference like every other
 * case: poisoned out/lse/workspace, canaries around each (the workspace's too), NaN scan.
 */
static void split_kv(void **state) {
    (void)state;
    /* qo_len 1..64 over 4k-16k positions, ragged and paged (odd page size), causal or not. */
    static const int qo[] = {1, 17, 64, 40}, kv[] = {4096, 16384, 9000, 12000};
    for (int paged = 0; paged < 2; paged++)
        for (int causal = 0; causal < 2; causal++) {
            char desc[96];
            snprintf(desc, sizeof desc, "split-KV: qo 1..64 over kv 4k-16k, %s, causal %d",
                     paged ? "paged" : "ragged", causal);
            bp_case c = base_case(desc);
            c.batch = 4;
            c.qo_lens = qo;
            c.kv_lens = kv;
            c.hq = 4;
            c.hk = 1;
            c.paged = paged;
            c.page_size = 17;
            c.causal = causal;
            c.expect_split = 1;
            run_case(&c, cinfer_test_seed() + 1000 + 2 * (uint64_t)paged + (uint64_t)causal);
        }
    /* The cascade's shared prefix: 64 rows of one group over 8192 positions, 32/8 heads, not
     * causal, paged (bench/cascade.py's level 0). */
    {
        static const int qo_c[] = {64}, kv_c[] = {8192};
        bp_case c = base_case("split-KV: cascade prefix, 64 rows over 8192, 32/8 heads");
        c.batch = 1;
        c.qo_lens = qo_c;
        c.kv_lens = kv_c;
        c.causal = 0;
        c.expect_split = 1;
        run_case(&c, cinfer_test_seed() + 1010);
    }
    /* Rows that keep nothing: qo_len > kv_len under causal next to a split request (its first
     * rows keep no position: 0, LSE -inf), and 128 rows over 4160 positions, whose chunk
     * [4096, 4160) holds nothing for its first 64 rows (empty partial states to merge). */
    static const int qo_m[] = {64, 30}, kv_m[] = {40, 8000};
    static const int qo_t[] = {128}, kv_t[] = {4160};
    for (int i = 0; i < 4; i++) {
        char desc[96];
        snprintf(desc, sizeof desc, "split-KV: %s, %s",
                 i < 2 ? "qo_len > kv_len next to a long request" : "rows empty in the last chunk",
                 i % 2 ? "paged" : "ragged");
        bp_case c = base_case(desc);
        c.batch = i < 2 ? 2 : 1;
        c.qo_lens = i < 2 ? qo_m : qo_t;
        c.kv_lens = i < 2 ? kv_m : kv_t;
        c.hq = 4;
        c.hk = 2;
        c.paged = i % 2;
        c.expect_split = 1;
        run_case(&c, cinfer_test_seed() + 1020 + (uint64_t)i);
    }
    /* Sliding windows (causal and not), no LSE with a soft cap, and other head dims, dtypes
     * and GQA groups (the merge's lanes per row change with D). */
    static const int qo_w[] = {64, 8}, kv_w[] = {12000, 5000};
    for (int causal = 0; causal < 2; causal++) {
        char desc[96];
        snprintf(desc, sizeof desc, "split-KV: window %d, causal %d", causal ? 1000 : 3000, causal);
        bp_case c = base_case(desc);
        c.batch = 2;
        c.qo_lens = qo_w;
        c.kv_lens = kv_w;
        c.hq = 4;
        c.hk = 1;
        c.causal = causal;
        c.window_left = causal ? 1000 : 3000;
        c.paged = causal;
        c.expect_split = 1;
        run_case(&c, cinfer_test_seed() + 1030 + (uint64_t)causal);
    }
    {
        static const int qo_s[] = {33}, kv_s[] = {10000};
        bp_case c = base_case("split-KV: soft cap 30, no lse");
        c.batch = 1;
        c.qo_lens = qo_s;
        c.kv_lens = kv_s;
        c.hq = 4;
        c.hk = 2;
        c.soft_cap = 30.0f;
        c.lse = 0;
        c.expect_split = 1;
        run_case(&c, cinfer_test_seed() + 1040);
    }
    static const int dims[] = {64, 256, 80};
    static const int groups[][2] = {{8, 1}, {4, 2}, {2, 1}};
    static const int qo_d[] = {20, 50}, kv_d[] = {6000, 7000};
    for (size_t i = 0; i < 3; i++) {
        char desc[96];
        bp_case c = base_case("");
        c.batch = 2;
        c.qo_lens = qo_d;
        c.kv_lens = kv_d;
        c.d = dims[i];
        c.hq = groups[i][0];
        c.hk = groups[i][1];
        c.dtype = i == 0 ? CINFER__DT_F16 : CINFER__DT_BF16;
        c.paged = i != 1;
        c.layout = i == 2 ? CINFER_KV_LAYOUT_HND : CINFER_KV_LAYOUT_NHD;
        c.expect_split = 1;
        snprintf(desc, sizeof desc, "split-KV: D %d %s heads %d/%d", c.d,
                 cinfer__dtype_name(c.dtype), c.hq, c.hk);
        c.desc = desc;
        run_case(&c, cinfer_test_seed() + 1050 + i);
    }
    /* Variants: the initial state (sinks) joins once per row, in its first chunk; ALiBi and the
     * custom mask see absolute positions in every chunk. Without softmax (sigmoid) or with an
     * output transform (the user variant) nothing is split. */
    static const tv_kind kinds[] = {TV_SINKS, TV_ALIBI,   TV_ALIBI_DEFAULT,
                                    TV_MASK,  TV_SIGMOID, TV_USER};
    static const int qo_v[] = {40, 3}, kv_v[] = {6000, 9000};
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
        char desc[96];
        snprintf(desc, sizeof desc, "split-KV: variant %s", tv_name(kinds[k]));
        bp_case c = base_case(desc);
        c.batch = 2;
        c.qo_lens = qo_v;
        c.kv_lens = kv_v;
        c.hq = 8;
        c.hk = 2;
        c.paged = (int)(k % 2);
        c.lse = tv_has_lse(kinds[k]);
        c.expect_split = kinds[k] == TV_SIGMOID || kinds[k] == TV_USER ? -1 : 1;
        run_variant_case(&c, kinds[k], cinfer_test_seed() + 1060 + k);
    }
}

/*
 * In-kernel RoPE: every request's q rows at i + kv_len - qo_len and its K at j, whatever its
 * offset in the ragged K/V or its pages (ragged and paged, random lengths with appends,
 * qo_len > kv_len and empty requests), rope_scale and rope_theta off their defaults, decode-like
 * short queries (the small tile, D 80), and split-KV over positions past 32k (each chunk rotates
 * its K tiles at their absolute positions).
 */
static void rope(void **state) {
    (void)state;
    static const int qo_s[] = {16, 5, 1}, kv_s[] = {40000, 33001, 34567};
    for (int i = 0; i < 4; i++) {
        char desc[96];
        snprintf(desc, sizeof desc, "rope case %d", i);
        bp_case c = base_case(desc);
        c.rope = 1;
        c.hq = 8;
        c.hk = 2;
        switch (i) {
        case 0: /* ragged, causal, default scale and theta */
            c.paged = 0;
            c.batch = 5;
            c.max_qo = 200;
            c.max_kv = 600;
            break;
        case 1: /* paged HND, fp16, not causal, scale and theta changed, D 64, odd pages */
            c.layout = CINFER_KV_LAYOUT_HND;
            c.dtype = CINFER__DT_F16;
            c.causal = 0;
            c.d = 64;
            c.page_size = 7;
            c.batch = 6;
            c.max_qo = 150;
            c.max_kv = 500;
            c.rope_scale = 4.0f;
            c.rope_theta = 5e5f;
            break;
        case 2: /* decode-like rows (the small tile), D 80, ragged */
            c.paged = 0;
            c.d = 80;
            c.batch = 9;
            c.max_qo = 3;
            c.max_kv = 900;
            c.rope_theta = 1e6f;
            break;
        default: /* split-KV over 33k-40k positions, paged, GQA 2 */
            c.batch = 3;
            c.qo_lens = qo_s;
            c.kv_lens = kv_s;
            c.hq = 2;
            c.hk = 1;
            c.page_size = 13;
            c.rope_theta = 5e5f;
            c.rope_scale = 2.0f;
            c.expect_split = 1;
            break;
        }
        run_case(&c, cinfer_test_seed() + 8000 + (uint64_t)i);
    }
    /* Plan refuses a request past CINFER_ROPE_MAX_LEN, naming it (the same plan succeeds
     * without RoPE). */
    bp_case c = base_case("rope limits");
    c.rope = 1;
    c.paged = 0;
    bp_data x;
    memset(&x, 0, sizeof x);
    const int32_t qo_indptr[3] = {0, 4, 5}, kv_indptr[3] = {0, 4, 4 + CINFER_ROPE_MAX_LEN + 1};
    for (int on = 1; on >= 0; on--) {
        c.rope = on;
        cinfer_batch_prefill_t *op = make_op(&c, &x, 2, 5, 0);
        const cinfer_status_t st =
            cinfer_batch_prefill_plan(op, qo_indptr, kv_indptr, NULL, 2, stream);
        if (on) {
            assert_int_equal(st, CINFER_STATUS_UNSUPPORTED);
            assert_non_null(
                strstr(cinfer_last_error(), "request 1: qo_len = 1, kv_len = 16777217"));
        } else {
            CINFER_TEST_OK(st);
        }
        CINFER_TEST_SYNC(stream);
        cinfer_batch_prefill_destroy(op);
        cinfer_test_buf_free(&x.d_ws);
    }
}

/*
 * fp8 K/V (e4m3, e5m2): ragged and paged (page sizes 1, 16 and 5, lengths off the pages and
 * tiles, a combined cache), causal and not, GQA 4, k_scale / v_scale, D 64, and split-KV
 * (partial states written by the fp8 kernel). Few distinct kernels.
 */
static void fp8_kv(void **state) {
    (void)state;
    uint64_t seed = cinfer_test_seed() + 3000;
    static const int pages[] = {16, 1, 5};
    for (int i = 0; i < 4; i++) {
        char desc[96];
        bp_case c = base_case("");
        c.kv_dtype = i % 2 ? CINFER__DT_E5M2 : CINFER__DT_E4M3;
        c.dtype = i % 2 ? CINFER__DT_F16 : CINFER__DT_BF16;
        c.batch = 5;
        c.max_qo = 150;
        c.max_kv = 500;
        c.hq = 8;
        c.hk = 2;
        c.paged = i > 0;
        c.page_size = i > 0 ? pages[i - 1] : 16;
        c.combined = i == 3;
        c.causal = i != 2;
        c.k_scale = i == 1 ? 0.7f : 1.0f;
        c.v_scale = i == 1 ? 2.5f : 1.0f;
        snprintf(desc, sizeof desc, "fp8 %s, %s page %d%s, causal %d%s", i % 2 ? "e5m2" : "e4m3",
                 c.paged ? "paged" : "ragged", c.page_size, c.combined ? " combined" : "", c.causal,
                 i == 1 ? ", k/v scales" : "");
        c.desc = desc;
        run_case(&c, seed++);
    }
    {
        bp_case c = base_case("fp8 e4m3, D 64, paged page 16, HND, no lse");
        c.kv_dtype = CINFER__DT_E4M3;
        c.d = 64;
        c.batch = 4;
        c.max_qo = 200;
        c.max_kv = 700;
        c.layout = CINFER_KV_LAYOUT_HND;
        c.lse = 0;
        run_case(&c, seed++);
    }
    static const int qo[] = {1, 40, 64}, kv[] = {5000, 9000, 3001};
    for (int paged = 0; paged < 2; paged++) {
        char desc[96];
        snprintf(desc, sizeof desc, "fp8 e4m3 split-KV: qo 1..64 over kv 3k-9k, %s",
                 paged ? "paged page 16" : "ragged");
        bp_case c = base_case(desc);
        c.kv_dtype = CINFER__DT_E4M3;
        c.batch = 3;
        c.qo_lens = qo;
        c.kv_lens = kv;
        c.hq = 8;
        c.hk = 2;
        c.paged = paged;
        c.causal = paged;
        c.expect_split = 1;
        run_case(&c, seed++);
    }
}

/* A splitting object's workspace holds the partial states, in CUDA-graph mode too (its fixed
 * tile's): one byte less than workspace_size is refused by create, before anything runs. */
static void split_kv_workspace_is_exact(void **state) {
    (void)state;
    bp_case c = base_case("split-KV workspace");
    cinfer_attention_options_t o = options_for(&c, 4);
    size_t unsplit_ws = 0;
    cinfer__batch_prefill_test_no_split(true);
    const cinfer_status_t st =
        cinfer_batch_prefill_workspace_size(ctx, &o, CINFER_KV_STORAGE_PAGED, 1, 256, &unsplit_ws);
    cinfer__batch_prefill_test_no_split(false);
    CINFER_TEST_OK(st);
    for (int graph = 0; graph < 2; graph++) {
        o.use_cuda_graph = graph;
        size_t ws = 0;
        CINFER_TEST_OK(
            cinfer_batch_prefill_workspace_size(ctx, &o, CINFER_KV_STORAGE_PAGED, 1, 256, &ws));
        assert_true(ws > unsplit_ws); /* the partial states */
        cinfer_test_buf buf;
        CINFER_TEST_OK(cinfer_test_buf_alloc(&buf, ws));
        cinfer_batch_prefill_t *op = NULL;
        assert_int_equal(cinfer_batch_prefill_create(ctx, &o, CINFER_KV_STORAGE_PAGED, 1, 256,
                                                     (void *)(uintptr_t)buf.ptr, ws - 1, &op),
                         CINFER_STATUS_WORKSPACE_TOO_SMALL);
        assert_null(op);
        CINFER_TEST_OK(cinfer_batch_prefill_create(ctx, &o, CINFER_KV_STORAGE_PAGED, 1, 256,
                                                   (void *)(uintptr_t)buf.ptr, ws, &op));
        cinfer_batch_prefill_destroy(op);
        cinfer_test_buf_free(&buf);
    }
}

/* Element offsets above 2^31: a combined cache of 4200 pages of 256 x 8 x 128 elements (1 MiB
 * each, 4.2 GiB), the requests owning the last pages, so every K and V row they read lies more
 * than 2^31 elements past the pool's start. */
static void page_offsets_need_64_bits(void **state) {
    (void)state;
    bp_case c = base_case("64-bit page offsets");
    c.page_size = 256;
    c.hq = 8;
    c.hk = 8;
    c.batch = 2;
    c.combined = 1;
    c.high_pages = 1;
    static const int qo[] = {50, 70}, kv[] = {1000, 2000};
    c.qo_lens = qo;
    c.kv_lens = kv;
    const int64_t pages = 4200, page_elems = 2 * 256 * 8 * 128;
    assert_true((pages - 20) * page_elems > INT32_MAX);
    run_case_in(&c, cinfer_test_seed() + 600, pages);
}

/* Capture one run in a CUDA graph, then re-plan other batches into the same buffers and replay. */
static void cuda_graph_replays_after_replanning(void **state) {
    (void)state;
    const int max_batch = 16;
    const int64_t max_total = 16 * 40, q_cap = max_total + Q_FRONT + Q_BACK, kv_cap = 16 * 200;
    bp_case big = base_case("graph capture");
    big.batch = max_batch;
    big.max_qo = 40;
    big.max_kv = 2000;
    big.hq = 8;
    big.hk = 2;
    bp_data x;
    bp_tensors t;
    cinfer_batch_prefill_t *op =
        graph_setup(&big, cinfer_test_seed() + 700, q_cap, kv_cap, max_batch, max_total, &x, &t);
    CUgraph graph;
    CUgraphExec exec;
    capture_run(op, &big, &t, &graph, &exec);
    assert_int_equal(cu->cuGraphLaunch(exec, stream), CUDA_SUCCESS);
    CINFER_TEST_SYNC(stream);
    check_outputs(&big, &x, cinfer_test_seed() + 700);

    static const int batches[] = {1, 16, 5, 0};
    for (int r = 0; r < 4; r++) {
        bp_case c = big;
        char desc[64];
        snprintf(desc, sizeof desc, "graph replay %d (batch %d)", r, batches[r]);
        c.desc = desc;
        c.batch = batches[r];
        c.max_qo = r == 0 ? 40 : 40 - 10 * r;
        bp_data y;
        graph_replan(op, &c, cinfer_test_seed() + 710 + (uint64_t)r, q_cap, kv_cap, &x, &y);
        assert_int_equal(cu->cuGraphLaunch(exec, stream), CUDA_SUCCESS);
        CINFER_TEST_SYNC(stream);
        check_outputs(&c, &y, cinfer_test_seed() + 710 + (uint64_t)r);
        free_host(&y);
    }
    cu->cuGraphExecDestroy(exec);
    cu->cuGraphDestroy(graph);
    cinfer_batch_prefill_destroy(op);
    free_data(&x);
}

/*
 * Split-KV in CUDA-graph mode: one capture, then plans that split (few rows over long KV, the
 * cascade prefix's shape among them), plans that do not (short KV, whose merge launch must do
 * nothing; rows past the merge's fixed range), other batch sizes and an empty batch, each
 * replayed and compared with the reference (rows outside the plan untouched). The captured plan
 * is a split one or an unsplit one (capture_split), so both kinds of capture replay both kinds of
 * plan. Rows start at Q_FRONT (qo_indptr[0] = 3): the merge's rows are absolute.
 */
typedef struct graph_step {
    int batch;
    int qo[4], kv[4];
    int split; /* 1: the plan must split, -1: it must not */
} graph_step;

static void graph_split_replays(int capture_split, uint64_t seed, int hq, int hk) {
    const int max_batch = 4;
    /* 256 rows of the object, 64 per request on average: the tile of 64 tokens (with the
     * heads packed by 4: the 256-row turn-taking tile; else the 64-row one). */
    const int64_t max_total = 256, q_cap = max_total + Q_FRONT + Q_BACK;
    static const graph_step steps[] = {
        {4, {64, 64, 64, 60}, {3000, 2500, 2000, 1500}, 1},  /* 4 tiles x 8 heads: split */
        {1, {64}, {8192}, 1},                                /* the cascade prefix's shape */
        {4, {64, 64, 64, 64}, {300, 200, 64, 100}, -1},      /* short KV: nothing to split */
        {2, {1, 40}, {7000, 33}, 1},                         /* a decode row over a long KV */
        {4, {64, 64, 64, 62}, {3000, 3000, 3000, 3000}, -1}, /* rows 3..257: past the merge's */
        {0, {0}, {0}, -1},                                   /* empty */
        {3, {20, 30, 10}, {4500, 9000, 600}, 1},
    };
    const int n_steps = (int)(sizeof steps / sizeof steps[0]);
    /* Pages: the largest step's, plus the 2 unused page-table entries before the first
     * request's (make_data) and the spare pages. */
    int64_t kv_cap = 0;
    for (int i = 0; i < n_steps; i++) {
        int64_t pages = 2 + EXTRA_PAGES;
        for (int b = 0; b < steps[i].batch; b++)
            pages += (steps[i].kv[b] + 15) / 16;
        kv_cap = pages > kv_cap ? pages : kv_cap;
    }
    const graph_step *first = &steps[capture_split ? 0 : 2];
    char big_desc[96];
    snprintf(big_desc, sizeof big_desc, "graph split, heads %d/%d: capture (%s)", hq, hk,
             capture_split ? "split" : "unsplit");
    bp_case big = base_case(big_desc);
    big.batch = first->batch;
    big.qo_lens = first->qo;
    big.kv_lens = first->kv;
    big.hq = hq;
    big.hk = hk;
    big.causal = 0;
    bp_data x;
    bp_tensors t;
    cinfer_batch_prefill_t *op =
        graph_setup(&big, seed, q_cap, kv_cap, max_batch, max_total, &x, &t);
    if ((cinfer__batch_prefill_chunk_size(op) != 0) != (first->split > 0))
        fail_msg("%s: the captured plan %s", big.desc,
                 first->split > 0 ? "did not split" : "split");
    CUgraph graph;
    CUgraphExec exec;
    capture_run(op, &big, &t, &graph, &exec);
    assert_int_equal(cu->cuGraphLaunch(exec, stream), CUDA_SUCCESS);
    CINFER_TEST_SYNC(stream);
    CINFER_TEST_OK(cinfer_test_buf_check_canaries(&x.d_ws));
    check_outputs(&big, &x, seed);

    for (int r = 0; r < n_steps; r++) {
        const graph_step *g = &steps[r];
        bp_case c = big;
        char desc[96];
        snprintf(desc, sizeof desc,
                 "graph split, heads %d/%d: capture %s, replay %d (batch %d, %s)", hq, hk,
                 capture_split ? "split" : "unsplit", r, g->batch,
                 g->split > 0 ? "split" : "unsplit");
        c.desc = desc;
        c.batch = g->batch;
        c.qo_lens = g->qo;
        c.kv_lens = g->kv;
        bp_data y;
        graph_replan(op, &c, seed + 10 + (uint64_t)r, q_cap, kv_cap, &x, &y);
        if ((cinfer__batch_prefill_chunk_size(op) != 0) != (g->split > 0))
            fail_msg("%s: the plan %s (chunk size %d)", desc,
                     g->split > 0 ? "did not split" : "split",
                     cinfer__batch_prefill_chunk_size(op));
        assert_int_equal(cu->cuGraphLaunch(exec, stream), CUDA_SUCCESS);
        CINFER_TEST_SYNC(stream);
        CINFER_TEST_OK(cinfer_test_buf_check_canaries(&x.d_ws));
        check_outputs(&c, &y, seed + 10 + (uint64_t)r);
        free_host(&y);
    }
    cu->cuGraphExecDestroy(exec);
    cu->cuGraphDestroy(graph);
    cinfer_batch_prefill_destroy(op);
    free_data(&x);
}

static void cuda_graph_split_kv(void **state) {
    (void)state;
    graph_split_replays(1, cinfer_test_seed() + 800, 8, 2);
    graph_split_replays(0, cinfer_test_seed() + 850, 8, 2);
}

static void bad_arguments_are_errors(void **state) {
    (void)state;
    bp_case c = base_case("errors");
    c.hq = 8;
    c.hk = 2;
    cinfer_test_rng rng;
    cinfer_test_rng_init(&rng, cinfer_test_seed() + 900);
    bp_data x;
    make_data(&c, &rng, &x, 0, 0);
    alloc_device(&c, &x);
    upload(&c, &x);
    bp_tensors t;
    make_tensors(&c, &x, &t);
    const int64_t total = x.qo_indptr[c.batch] - x.qo_indptr[0];
    cinfer_batch_prefill_t *op = make_op(&c, &x, c.batch, total > 0 ? total : 1, 0);
#define EXPECT(status, what, call)                                                                 \
    do {                                                                                           \
        assert_int_equal((call), (status));                                                        \
        if ((what)[0] && !strstr(cinfer_last_error(), (what)))                                     \
            fail_msg("message \"%s\" does not name \"%s\"", cinfer_last_error(), (what));          \
    } while (0)
#define RUN(q, k, v, idx, out, lse, args)                                                          \
    cinfer_batch_prefill_run(op, (q), (k), (v), (idx), (out), (lse), (args), stream)
    EXPECT(CINFER_STATUS_INVALID_ARGUMENT, "no plan",
           RUN(&t.q.t, &t.k.t, &t.v.t, &t.indices.t, &t.out.t, &t.lse.t, NULL));
    /* Plan errors leave no plan behind. */
    EXPECT(CINFER_STATUS_INVALID_ARGUMENT, "batch_size",
           cinfer_batch_prefill_plan(op, x.qo_indptr, x.kv_indptr, x.last, c.batch + 1, stream));
    EXPECT(CINFER_STATUS_INVALID_ARGUMENT, "qo_indptr is NULL",
           cinfer_batch_prefill_plan(op, NULL, x.kv_indptr, x.last, c.batch, stream));
    EXPECT(CINFER_STATUS_INVALID_ARGUMENT, "kv_last_page_len is NULL",
           cinfer_batch_prefill_plan(op, x.qo_indptr, x.kv_indptr, NULL, c.batch, stream));
    CINFER_TEST_OK(
        cinfer_batch_prefill_plan(op, x.qo_indptr, x.kv_indptr, x.last, c.batch, stream));
    cinfer_arg_t one = CINFER_ARG_F32(1.0f);
    cinfer_args_t args = {1, &one};
    EXPECT(CINFER_STATUS_INVALID_ARGUMENT, "1 variant argument(s) given, variant default attention",
           RUN(&t.q.t, &t.k.t, &t.v.t, &t.indices.t, &t.out.t, &t.lse.t, &args));
    EXPECT(CINFER_STATUS_INVALID_ARGUMENT, "q is NULL",
           RUN(NULL, &t.k.t, &t.v.t, &t.indices.t, &t.out.t, &t.lse.t, NULL));
    EXPECT(CINFER_STATUS_INVALID_ARGUMENT, "kv_indices is NULL",
           RUN(&t.q.t, &t.k.t, &t.v.t, NULL, &t.out.t, &t.lse.t, NULL));
    /* Shapes that contradict the options or the plan. */
    t.q.shape[1] = c.hq + 1;
    EXPECT(CINFER_STATUS_PLAN_MISMATCH, "q",
           RUN(&t.q.t, &t.k.t, &t.v.t, &t.indices.t, &t.out.t, &t.lse.t, NULL));
    t.q.shape[1] = c.hq;
    t.q.shape[0] = x.qo_indptr[c.batch] - 1;
    EXPECT(CINFER_STATUS_PLAN_MISMATCH, "qo_indptr[batch_size]",
           RUN(&t.q.t, &t.k.t, &t.v.t, &t.indices.t, &t.out.t, &t.lse.t, NULL));
    t.q.shape[0] = x.q_rows;
    t.out.shape[0] = x.q_rows - 1;
    EXPECT(CINFER_STATUS_PLAN_MISMATCH, "out",
           RUN(&t.q.t, &t.k.t, &t.v.t, &t.indices.t, &t.out.t, &t.lse.t, NULL));
    t.out.shape[0] = x.q_rows;
    t.indices.shape[0] = x.kv_indptr[c.batch] - 1;
    EXPECT(CINFER_STATUS_PLAN_MISMATCH, "kv_indices",
           RUN(&t.q.t, &t.k.t, &t.v.t, &t.indices.t, &t.out.t, &t.lse.t, NULL));
    t.indices.shape[0] = x.num_indices;
    t.k.shape[1] = c.page_size + 1;
    EXPECT(CINFER_STATUS_PLAN_MISMATCH, "k",
           RUN(&t.q.t, &t.k.t, &t.v.t, &t.indices.t, &t.out.t, &t.lse.t, NULL));
    t.k.shape[1] = c.page_size;
    t.lse.t.dtype = cinfer_test_dl_dtype(CINFER__DT_F16);
    EXPECT(CINFER_STATUS_INVALID_ARGUMENT, "lse",
           RUN(&t.q.t, &t.k.t, &t.v.t, &t.indices.t, &t.out.t, &t.lse.t, NULL));
    t.lse.t.dtype = cinfer_test_dl_dtype(CINFER__DT_F32);
    t.out.t.dtype = cinfer_test_dl_dtype(CINFER__DT_F16);
    EXPECT(CINFER_STATUS_INVALID_ARGUMENT, "out",
           RUN(&t.q.t, &t.k.t, &t.v.t, &t.indices.t, &t.out.t, &t.lse.t, NULL));
    t.out.t.dtype = cinfer_test_dl_dtype(CINFER__DT_BF16);
    /* Alignment and strides. */
    t.q.t.byte_offset += 8;
    EXPECT(CINFER_STATUS_UNSUPPORTED, "q",
           RUN(&t.q.t, &t.k.t, &t.v.t, &t.indices.t, &t.out.t, &t.lse.t, NULL));
    t.q.t.byte_offset -= 8;
    const int64_t v_strides[4] = {(int64_t)c.page_size * c.hk * c.d, (int64_t)c.hk * c.d, c.d, 1};
    cinfer_test_tensor v2;
    int64_t v2_strides[4];
    memcpy(v2_strides, v_strides, sizeof v2_strides);
    v2_strides[0] += 8; /* a padded page: different strides from k */
    cinfer_test_tensor_init(&v2, &x.d_v, 0, 0, c.dtype, 4, t.v.shape, v2_strides);
    EXPECT(CINFER_STATUS_UNSUPPORTED, "same strides",
           RUN(&t.q.t, &t.k.t, &v2.t, &t.indices.t, &t.out.t, &t.lse.t, NULL));
    CINFER_TEST_SYNC(stream);
    /* Nothing was written by the failed calls. */
    CINFER_TEST_OK(cinfer_test_buf_check_poisoned(&x.d_out, x.out_bytes));
    /* And the arguments, restored, work. */
    CINFER_TEST_OK(RUN(&t.q.t, &t.k.t, &t.v.t, &t.indices.t, &t.out.t, &t.lse.t, NULL));
    CINFER_TEST_SYNC(stream);
    check_outputs(&c, &x, cinfer_test_seed() + 900);
    cinfer_batch_prefill_destroy(op);
    /* Create refuses a soft cap with a variant (the variant transforms logits itself). */
    cinfer_attention_options_t o = options_for(&c, 4);
    cinfer_batch_prefill_t *bad = NULL;
    o.variant = cinfer_variant_builtin("sinks");
    o.logits_soft_cap = 30.0f;
    EXPECT(CINFER_STATUS_INVALID_ARGUMENT, "logits_soft_cap",
           cinfer_batch_prefill_create(ctx, &o, CINFER_KV_STORAGE_RAGGED, 1, 100,
                                       (void *)(uintptr_t)x.d_ws.ptr, x.d_ws.bytes, &bad));
    assert_null(bad);
    free_data(&x);
#undef RUN
#undef EXPECT
}

/*
 * D_qk != D_vo (options->head_dim_vo): v and out of another head dim than q and k, ragged and paged
 * (V's cache with strides of its own; odd and power-of-two pages), both layouts, GQA (unpacked),
 * windows, soft cap, variants and split-KV (partial states and merge at D_vo); then the arguments
 * that contradict it.
 */
static void head_dims_qk_vo(void **state) {
    (void)state;
    static const struct {
        int d, dvo, paged, page_size, hnd, causal, hq, hk;
    } dims[] = {
        {192, 128, 0, 0, 0, 1, 8, 8}, /* DeepSeek's prefill heads (128 nope + 64 rope / 128) */
        {192, 128, 1, 16, 0, 1, 8, 2}, {64, 128, 1, 7, 1, 0, 4, 4}, {128, 64, 0, 0, 1, 1, 8, 2},
        {256, 128, 1, 32, 0, 1, 4, 1}, {96, 256, 1, 1, 0, 0, 2, 1},
    };
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++) {
        char desc[96];
        snprintf(desc, sizeof desc, "D_qk %d D_vo %d, %s page %d, %s, causal %d", dims[i].d,
                 dims[i].dvo, dims[i].paged ? "paged" : "ragged", dims[i].page_size,
                 dims[i].hnd ? "HND" : "NHD", dims[i].causal);
        bp_case c = base_case(desc);
        c.d = dims[i].d;
        c.dvo = dims[i].dvo;
        c.paged = dims[i].paged;
        c.page_size = dims[i].paged ? dims[i].page_size : 16;
        c.layout = dims[i].hnd ? CINFER_KV_LAYOUT_HND : CINFER_KV_LAYOUT_NHD;
        c.causal = dims[i].causal;
        c.hq = dims[i].hq;
        c.hk = dims[i].hk;
        c.dtype = i % 2 ? CINFER__DT_F16 : CINFER__DT_BF16;
        c.expect_group = 1; /* never packed */
        /* 192 / 128 may take the sm90 kernel (sm90_kernel_d192's cases) */
        c.expect_sm90 = dims[i].d == 192 && dims[i].dvo == 128 ? 0 : -1;
        run_case(&c, cinfer_test_seed() + 4000 + i);
    }
    {
        bp_case c = base_case("D_qk 192 D_vo 128, window 100, soft cap 30, no lse");
        c.d = 192;
        c.dvo = 128;
        c.hq = 8;
        c.hk = 2;
        c.paged = 0;
        c.window_left = 100;
        c.soft_cap = 30.0f;
        c.lse = 0;
        run_case(&c, cinfer_test_seed() + 4010);
    }
    /* Split-KV: few rows over long KV, ragged and paged (an odd page size). */
    static const int qo_s[] = {17, 40, 1}, kv_s[] = {9000, 5000, 6000};
    for (int paged = 0; paged < 2; paged++) {
        char desc[96];
        snprintf(desc, sizeof desc, "D_qk 192 D_vo 128, split-KV, %s", paged ? "paged" : "ragged");
        bp_case c = base_case(desc);
        c.d = 192;
        c.dvo = 128;
        c.batch = 3;
        c.qo_lens = qo_s;
        c.kv_lens = kv_s;
        c.hq = 4;
        c.hk = 2;
        c.paged = paged;
        c.page_size = 13;
        c.causal = paged;
        c.expect_split = 1;
        run_case(&c, cinfer_test_seed() + 4020 + (uint64_t)paged);
    }
    /* Variants: sinks join the state once per row (split here), ALiBi and the user variant see
     * absolute positions; the user variant's output transform sees D_vo columns. */
    static const tv_kind kinds[] = {TV_SINKS, TV_ALIBI, TV_USER};
    static const int qo_v[] = {40, 3, 200}, kv_v[] = {6000, 9000, 300};
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
        char desc[96];
        snprintf(desc, sizeof desc, "D_qk 192 D_vo 128, variant %s", tv_name(kinds[k]));
        bp_case c = base_case(desc);
        c.d = 192;
        c.dvo = 128;
        c.batch = 3;
        c.qo_lens = qo_v;
        c.kv_lens = kv_v;
        c.hq = 8;
        c.hk = 2;
        c.paged = (int)(k % 2);
        c.lse = tv_has_lse(kinds[k]);
        run_variant_case(&c, kinds[k], cinfer_test_seed() + 4030 + k);
    }

    /* Errors: v or out of D_qk, a combined cache, and options D_qk != D_vo does not take. */
    bp_case c = base_case("D_qk 192 D_vo 128 errors");
    c.d = 192;
    c.dvo = 128;
    c.hq = 8;
    c.hk = 2;
    cinfer_test_rng rng;
    cinfer_test_rng_init(&rng, cinfer_test_seed() + 4040);
    bp_data x;
    make_data(&c, &rng, &x, 0, 0);
    alloc_device(&c, &x);
    upload(&c, &x);
    bp_tensors t;
    make_tensors(&c, &x, &t);
    const int64_t total = x.qo_indptr[c.batch] - x.qo_indptr[0];
    cinfer_batch_prefill_t *op = make_op(&c, &x, c.batch, total > 0 ? total : 1, 0);
    CINFER_TEST_OK(
        cinfer_batch_prefill_plan(op, x.qo_indptr, x.kv_indptr, x.last, c.batch, stream));
#define RUN(k, v, out)                                                                             \
    cinfer_batch_prefill_run(op, &t.q.t, (k), (v), &t.indices.t, (out), &t.lse.t, NULL, stream)
    t.v.shape[3] = c.d;
    assert_int_equal(RUN(&t.k.t, &t.v.t, &t.out.t), CINFER_STATUS_PLAN_MISMATCH);
    assert_non_null(strstr(cinfer_last_error(), "head_dim_vo"));
    t.v.shape[3] = c.dvo;
    t.out.shape[2] = c.d;
    assert_int_equal(RUN(&t.k.t, &t.v.t, &t.out.t), CINFER_STATUS_PLAN_MISMATCH);
    assert_non_null(strstr(cinfer_last_error(), "out"));
    t.out.shape[2] = c.dvo;
    assert_int_equal(RUN(&t.k.t, NULL, &t.out.t), CINFER_STATUS_INVALID_ARGUMENT);
    assert_non_null(strstr(cinfer_last_error(), "separate caches"));
    CINFER_TEST_SYNC(stream);
    CINFER_TEST_OK(cinfer_test_buf_check_poisoned(&x.d_out, x.out_bytes));
    CINFER_TEST_OK(RUN(&t.k.t, &t.v.t, &t.out.t));
    CINFER_TEST_SYNC(stream);
    check_outputs(&c, &x, cinfer_test_seed() + 4040);
#undef RUN
    cinfer_batch_prefill_destroy(op);
    cinfer_attention_options_t o = options_for(&c, 4);
    size_t bytes = 0;
    o.kv_dtype = cinfer_test_dl_dtype(CINFER__DT_E4M3);
    assert_int_equal(
        cinfer_batch_prefill_workspace_size(ctx, &o, CINFER_KV_STORAGE_PAGED, 1, 100, &bytes),
        CINFER_STATUS_UNSUPPORTED);
    assert_non_null(strstr(cinfer_last_error(), "head_dim_vo"));
    o = options_for(&c, 4);
    o.pos_encoding_mode = CINFER_POS_ENCODING_ROPE_LLAMA;
    assert_int_equal(
        cinfer_batch_prefill_workspace_size(ctx, &o, CINFER_KV_STORAGE_RAGGED, 1, 100, &bytes),
        CINFER_STATUS_UNSUPPORTED);
    assert_non_null(strstr(cinfer_last_error(), "head_dim_vo"));
    free_data(&x);
}

/* The built-in variants (but dump_logits, whose layout single prefill and decode test) and the
 * suites' user variant over ragged and paged batches: batch_idx reaches the hooks per request. */
static void variants(void **state) {
    (void)state;
    static const tv_kind kinds[] = {TV_SIGMOID,       TV_SINKS, TV_ALIBI,
                                    TV_ALIBI_DEFAULT, TV_USER,  TV_MASK};
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
        for (int paged = 0; paged < 2; paged++) {
            char desc[96];
            snprintf(desc, sizeof desc, "variant %s, %s", tv_name(kinds[k]),
                     paged ? "paged" : "ragged");
            bp_case c = base_case(desc);
            c.hq = 8;
            c.hk = 2;
            c.batch = 5;
            c.paged = paged;
            c.lse = tv_has_lse(kinds[k]);
            run_variant_case(&c, kinds[k],
                             cinfer_test_seed() + 3000 + (uint64_t)(k * 10 + (size_t)paged));
        }
    }
}

/*
 * GQA packing (kernels/prefill.cu, prefill_plan.h): batches whose query heads the kernels pack
 * into their rows (G of them per KV head) and the same shapes unpacked, against the reference.
 * G = 2, 4, 8 pack by default (G divides every tile); G = 3, 5, 6 pack only under
 * cinfer__batch_prefill_test_pack(1), with floor(tile / G) tokens per tile and padding rows;
 * mode -1 keeps G = 4 unpacked (the unpacked grouped kernels the other tests no longer run).
 * Short (decode-like, chunked) and long queries, causal or not, window and soft cap, RoPE (q rows
 * at their token's position), fp8 K/V, split-KV (partial states per token and head), and the
 * variants: ALiBi (each row's head's slope), the custom mask (each row's token's mask row), sinks
 * (each row's head's sink), sigmoid, and the user variant (every hook with its row's token and
 * head). Each case asserts the group the object packs.
 */
typedef enum pack_feature {
    PF_PLAIN,
    PF_WINDOW_SOFTCAP,
    PF_ROPE,
    PF_FP8,
    PF_SPLIT,
    PF_VARIANT
} pack_feature;

typedef struct pack_case {
    int hq, hk, mode; /* mode: cinfer__batch_prefill_test_pack */
    pack_feature feature;
    int max_qo; /* random query lengths in [1, max_qo] (PF_SPLIT: fixed) */
    tv_kind variant;
} pack_case;

static void gqa_packing(void **state) {
    (void)state;
    static const pack_case cases[] = {
        {8, 8, 0, PF_PLAIN, 100, TV_NONE},
        {4, 2, 0, PF_PLAIN, 6, TV_NONE},
        {8, 2, 0, PF_PLAIN, 300, TV_NONE},
        {8, 2, -1, PF_PLAIN, 300, TV_NONE},
        {8, 1, 0, PF_PLAIN, 40, TV_NONE},
        {10, 2, 1, PF_PLAIN, 9, TV_NONE},
        {10, 2, 1, PF_PLAIN, 300, TV_NONE},
        {10, 2, 0, PF_PLAIN, 50, TV_NONE},
        {6, 2, 1, PF_WINDOW_SOFTCAP, 200, TV_NONE},
        {8, 2, 0, PF_WINDOW_SOFTCAP, 120, TV_NONE},
        {12, 2, 1, PF_WINDOW_SOFTCAP, 30, TV_NONE},
        {8, 2, 0, PF_ROPE, 150, TV_NONE},
        {10, 2, 1, PF_ROPE, 20, TV_NONE},
        {8, 2, 0, PF_FP8, 150, TV_NONE},
        {10, 2, 1, PF_FP8, 40, TV_NONE},
        {8, 2, 0, PF_SPLIT, 0, TV_NONE},
        {16, 2, 0, PF_SPLIT, 0, TV_NONE},
        {10, 2, 1, PF_SPLIT, 0, TV_NONE},
        {8, 2, -1, PF_SPLIT, 0, TV_NONE},
        {8, 2, 0, PF_VARIANT, 80, TV_ALIBI},
        {10, 2, 1, PF_VARIANT, 80, TV_ALIBI},
        {8, 2, 0, PF_VARIANT, 80, TV_ALIBI_DEFAULT},
        {8, 2, 0, PF_VARIANT, 80, TV_MASK},
        {10, 2, 1, PF_VARIANT, 60, TV_MASK},
        {8, 2, 0, PF_VARIANT, 80, TV_SINKS},
        {10, 2, 1, PF_VARIANT, 80, TV_SINKS},
        {8, 2, 0, PF_VARIANT, 80, TV_SIGMOID},
        {8, 2, 0, PF_VARIANT, 80, TV_USER},
        {10, 2, 1, PF_VARIANT, 80, TV_USER},
    };
    static const int qo_s[] = {1, 17, 64}, kv_s[] = {5000, 9000, 3001};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const pack_case *k = &cases[i];
        const int g = k->hq / k->hk;
        char desc[160];
        bp_case c = base_case("");
        c.hq = k->hq;
        c.hk = k->hk;
        c.batch = k->max_qo < 10 ? 24 : 6;
        c.max_qo = k->max_qo;
        c.max_kv = 1500;
        c.paged = (int)(i % 2);
        c.causal = i % 3 != 2;
        c.expect_group = k->mode < 0 || g < 2 || (k->mode == 0 && 32 % g != 0) ? 1 : g;
        switch (k->feature) {
        case PF_PLAIN:
            break;
        case PF_WINDOW_SOFTCAP:
            c.window_left = 37 + 20 * (int)i;
            c.soft_cap = 30.0f;
            break;
        case PF_ROPE:
            c.rope = 1;
            c.rope_theta = 5e5f;
            break;
        case PF_FP8:
            c.kv_dtype = i % 2 ? CINFER__DT_E5M2 : CINFER__DT_E4M3;
            c.k_scale = 0.8f;
            c.v_scale = 1.5f;
            break;
        case PF_SPLIT:
            c.batch = 3;
            c.qo_lens = qo_s;
            c.kv_lens = kv_s;
            c.expect_split = 1;
            break;
        case PF_VARIANT:
            c.lse = tv_has_lse(k->variant);
            break;
        }
        snprintf(desc, sizeof desc,
                 "GQA packing %d/%d (mode %d, packs %d): %s%s, qo <= %d, %s causal %d", c.hq, c.hk,
                 k->mode, c.expect_group,
                 k->feature == PF_PLAIN            ? "plain"
                 : k->feature == PF_WINDOW_SOFTCAP ? "window + soft cap"
                 : k->feature == PF_ROPE           ? "rope"
                 : k->feature == PF_FP8            ? "fp8"
                 : k->feature == PF_SPLIT          ? "split-KV"
                                                   : "variant ",
                 k->feature == PF_VARIANT ? tv_name(k->variant) : "", k->max_qo,
                 c.paged ? "paged" : "ragged", c.causal);
        c.desc = desc;
        cinfer__batch_prefill_test_pack(k->mode);
        if (k->feature == PF_VARIANT)
            run_variant_case(&c, k->variant, cinfer_test_seed() + 9000 + i);
        else
            run_case(&c, cinfer_test_seed() + 9000 + i);
        cinfer__batch_prefill_test_pack(0);
    }
    /* CUDA-graph mode with split-KV: G = 5 packed (forced) and G = 4 unpacked, one capture each
     * replayed over split and unsplit plans (the default G = 4 packs in cuda_graph_split_kv). */
    cinfer__batch_prefill_test_pack(1);
    graph_split_replays(1, cinfer_test_seed() + 9100, 10, 2);
    cinfer__batch_prefill_test_pack(-1);
    graph_split_replays(0, cinfer_test_seed() + 9150, 8, 2);
    cinfer__batch_prefill_test_pack(0);
}

/* gqa_packing's teardown: packing is decided by default again even when a case failed. */
static int teardown_pack(void **state) {
    cinfer__batch_prefill_test_pack(0);
    return teardown_case(state);
}

int main(void) {
    int rc = cinfer_test_gpu_setup(&ctx);
    if (rc)
        return rc;
    if (cinfer__cuda_get(&cu) != CINFER_STATUS_SUCCESS ||
        cinfer_test_stream_create(&stream) != CINFER_STATUS_SUCCESS) {
        fprintf(stderr, "error: %s\n", cinfer_last_error());
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(llama_heads, teardown_case),
        cmocka_unit_test_teardown(page_sizes_and_layouts, teardown_case),
        cmocka_unit_test_teardown(head_dims_dtypes_and_groups, teardown_case),
        cmocka_unit_test_teardown(short_queries, teardown_case),
        cmocka_unit_test_teardown(masks_and_edges, teardown_case),
        cmocka_unit_test_teardown(wide_warp_tiles, teardown_default_tiles),
        cmocka_unit_test_teardown(randomized_grid, teardown_case),
        cmocka_unit_test_teardown(sm90_kernel, teardown_case),
        cmocka_unit_test_teardown(sm90_kernel_d192, teardown_case),
        cmocka_unit_test_teardown(sm90_kernel_fp8, teardown_case),
        cmocka_unit_test_teardown(split_kv, teardown_case),
        cmocka_unit_test_teardown(rope, teardown_case),
        cmocka_unit_test_teardown(split_kv_workspace_is_exact, teardown_case),
        cmocka_unit_test_teardown(fp8_kv, teardown_case),
        cmocka_unit_test_teardown(page_offsets_need_64_bits, teardown_case),
        cmocka_unit_test_teardown(cuda_graph_replays_after_replanning, teardown_case),
        cmocka_unit_test_teardown(cuda_graph_split_kv, teardown_case),
        cmocka_unit_test_teardown(bad_arguments_are_errors, teardown_case),
        cmocka_unit_test_teardown(variants, teardown_case),
        cmocka_unit_test_teardown(head_dims_qk_vo, teardown_case),
        cmocka_unit_test_teardown(gqa_packing, teardown_pack),
    };
    rc = cinfer_test_run_suite("gpu_test_batch_prefill", tests, sizeof tests / sizeof tests[0]);
    cinfer_test_stream_destroy(stream);
    cinfer_test_gpu_teardown(ctx);
    return rc;
}
