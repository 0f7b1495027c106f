/*
 * Single-request prefill against the float64 CPU reference: head dims (64/128/256, whose copies
 * keep a chunk column per thread, and the others), fp16/bf16, GQA ratios, NHD/HND, q/k/v as slices
 * of a packed QKV, strided out/lse, causal and non-causal masks, sliding windows, soft cap and
 * scales, qo_len > kv_len (fully masked rows), empty KV, lengths around the tile sizes, every tile
 * configuration the spec accepts, a randomized grid, in-kernel RoPE, argument errors, and fp8
 * K/V (e4m3, e5m2) through the same paths.
 *
 * Every output buffer is poisoned (NaN) before the run and surrounded by canaries; elements of an
 * output buffer outside the output view must keep the poison; every K/V/Q element outside its
 * view (padding tokens, other heads' columns of a packed QKV) holds NaN, so a read past kv_len or
 * into a wrong head shows up as NaN in the output. The reference runs per query head on exactly
 * the bytes the GPU read; large cases check a random subset of heads (all heads are still scanned
 * for NaN, which catches rows that were never written).
 */
#include "support/gpu.h"
#include "support/variants.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops/prefill.h"

static cinfer_context_t *ctx;
static CUstream stream;

typedef struct prefill_case {
    const char *desc;
    int qo_len, kv_len;
    int hq, hk, d;
    int dvo;                  /* head dim of v and out (options->head_dim_vo); 0 = d */
    cinfer__dtype_t dtype;    /* q and out */
    cinfer__dtype_t kv_dtype; /* k and v: CINFER__DT_NONE = dtype */
    cinfer_kv_layout_t layout;
    int causal;
    float soft_cap, sm_scale, k_scale, v_scale;
    int window_left;
    int packed;      /* NHD: q, k, v are slices of one [tokens, Hq + 2 Hk, D] QKV buffer */
    int strided_out; /* out is a slice [qo, Hq, D] of [qo, Hq + 2, D]; lse of [qo, Hq + 1] */
    int no_lse;      /* pass lse = NULL */
    int check_heads; /* 0: compare every query head; else this many random heads */
    double q_range;  /* q uniform in [-q_range, q_range] (0: 1) */
    double kv_range; /* k and v uniform in [-kv_range, kv_range] (0: 1) */
    /* q in [q_range / 2, q_range] and k in [-kv_range, -kv_range / 2]: every logit q . k at most
     * -d q_range kv_range / 4 (with a soft cap and sm_scale 1, every logit near -cap) */
    int all_negative;
    const cinfer__prefill_config_t *tiles; /* NULL: the default tiles */
    tv_kind variant;                       /* TV_NONE: default attention */
    int rope;                              /* in-kernel RoPE (pos_encoding_mode = ROPE_LLAMA) */
    float rope_scale, rope_theta;          /* with rope; 0: the defaults 1 and 1e4 */
    /* Through cinfer_single_prefill_with_workspace (tiles NULL), with the workspace its size
     * function asks for: WS_SPLIT expects a split plan (a size above 0), WS_NONE none (0: NULL
     * workspace), WS_ANY either. 0: cinfer__single_prefill_config. */
    int workspace;
} prefill_case;

enum { WS_SPLIT = 1, WS_NONE, WS_ANY };

static prefill_case base_case(const char *desc) {
    prefill_case c;
    memset(&c, 0, sizeof c);
    c.desc = desc;
    c.qo_len = 200;
    c.kv_len = 300;
    c.hq = 4;
    c.hk = 2;
    c.d = 128;
    c.dtype = CINFER__DT_BF16;
    c.layout = CINFER_KV_LAYOUT_NHD;
    c.causal = 1;
    c.k_scale = c.v_scale = 1.0f;
    c.window_left = -1;
    c.q_range = 2.0;
    return c;
}

/* Where a [tokens, heads, D] view lives in its buffer: element (t, h, i) is at
 * off + t * s_tok + h * s_head + i. */
typedef struct view {
    int buf; /* index into prefill_data.bufs */
    int64_t off, s_tok, s_head;
    int64_t tokens, heads;
} view_t;

enum { B_Q, B_K, B_V, B_OUT, B_LSE, NUM_BUFS };

typedef struct prefill_data {
    view_t q, k, v, out, lse;
    int64_t elems[NUM_BUFS]; /* buffer sizes in elements (0 = unused) */
    unsigned char *host[NUM_BUFS];
    cinfer_test_buf dev[NUM_BUFS];
} prefill_data;

static void free_data(prefill_data *x) {
    for (int i = 0; i < NUM_BUFS; i++) {
        free(x->host[i]);
        cinfer_test_buf_free(&x->dev[i]);
    }
    memset(x, 0, sizeof *x);
}

/* The head dim of v and out. */
static int dvo_of(const prefill_case *c) {
    return c->dvo > 0 ? c->dvo : c->d;
}

/* The dtype of k and v. */
static cinfer__dtype_t kv_dtype_of(const prefill_case *c) {
    return c->kv_dtype != CINFER__DT_NONE ? c->kv_dtype : c->dtype;
}

static int is_fp8(const prefill_case *c) {
    return kv_dtype_of(c) == CINFER__DT_E4M3 || kv_dtype_of(c) == CINFER__DT_E5M2;
}

/* The dtype of buffer b (a packed QKV buffer is q's, see make_data). */
static cinfer__dtype_t buf_dtype(const prefill_case *c, int b) {
    return b == B_LSE ? CINFER__DT_F32 : b == B_K || b == B_V ? kv_dtype_of(c) : c->dtype;
}

static size_t buf_esz(const prefill_case *c, int b) {
    return cinfer__dtype_size(buf_dtype(c, b));
}

/* Fills a view's elements (rows of d) with uniform values in [lo, hi]. */
static void fill_view(const prefill_case *c, cinfer_test_rng *rng, prefill_data *x, const view_t *v,
                      int d, double lo, double hi) {
    for (int64_t t = 0; t < v->tokens; t++)
        for (int64_t h = 0; h < v->heads; h++) {
            const int64_t base = v->off + t * v->s_tok + h * v->s_head;
            for (int i = 0; i < d; i++)
                cinfer_test_store(buf_dtype(c, v->buf), x->host[v->buf], base + i,
                                  cinfer_test_rng_uniform(rng, lo, hi));
        }
}

/* Lays out the views (see prefill_case), fills inputs (NaN outside the views), uploads them and
 * allocates the poisoned outputs. */
static void make_data(const prefill_case *c, cinfer_test_rng *rng, prefill_data *x) {
    memset(x, 0, sizeof *x);
    const int64_t qo = c->qo_len, kv = c->kv_len, hq = c->hq, hk = c->hk, d = c->d;
    const int64_t dv = dvo_of(c);         /* v's and out's head dim */
    const int64_t pad = 19;               /* NaN tokens past the end of K/V (and Q) */
    assert_false(c->packed && is_fp8(c)); /* one buffer holds one dtype */
    if (c->packed) {
        /* One QKV buffer of n tokens: q is the last qo tokens, k and v the first kv. */
        const int64_t n = (qo > kv ? qo : kv) + pad, w = (hq + hk) * d + hk * dv;
        x->elems[B_Q] = n * w;
        x->q = (view_t){B_Q, (n - pad - qo) * w, w, d, qo, hq};
        x->k = (view_t){B_Q, hq * d, w, d, kv, hk};
        x->v = (view_t){B_Q, (hq + hk) * d, w, dv, kv, hk};
    } else {
        x->elems[B_Q] = (qo + pad) * hq * d;
        x->q = (view_t){B_Q, 0, hq * d, d, qo, hq};
        x->elems[B_K] = (kv + pad) * hk * d;
        x->elems[B_V] = (kv + pad) * hk * dv;
        if (c->layout == CINFER_KV_LAYOUT_NHD) {
            x->k = (view_t){B_K, 0, hk * d, d, kv, hk};
            x->v = (view_t){B_V, 0, hk * dv, dv, kv, hk};
        } else {
            x->k = (view_t){B_K, 0, d, (kv + pad) * d, kv, hk};
            x->v = (view_t){B_V, 0, dv, (kv + pad) * dv, kv, hk};
        }
    }
    if (c->strided_out) {
        x->elems[B_OUT] = qo * (hq + 2) * dv;
        x->out = (view_t){B_OUT, dv, (hq + 2) * dv, dv, qo, hq};
        x->elems[B_LSE] = qo * (hq + 1);
        x->lse = (view_t){B_LSE, 1, hq + 1, 1, qo, hq};
    } else {
        x->elems[B_OUT] = qo * hq * dv;
        x->out = (view_t){B_OUT, 0, hq * dv, dv, qo, hq};
        x->elems[B_LSE] = qo * hq;
        x->lse = (view_t){B_LSE, 0, hq, 1, qo, hq};
    }
    for (int b = 0; b < NUM_BUFS; b++) {
        if (!x->elems[b] && b <= B_V)
            continue;
        const size_t bytes = (size_t)x->elems[b] * buf_esz(c, b);
        x->host[b] = malloc(bytes + 16);
        memset(x->host[b], 0xff, bytes); /* NaN in fp16, bf16, fp32, e4m3 and e5m2 */
    }
    const double qr = c->q_range > 0 ? c->q_range : 1.0, kvr = c->kv_range > 0 ? c->kv_range : 1.0;
    fill_view(c, rng, x, &x->q, c->d, c->all_negative ? qr / 2 : -qr, qr);
    fill_view(c, rng, x, &x->k, c->d, -kvr, c->all_negative ? -kvr / 2 : kvr);
    fill_view(c, rng, x, &x->v, dvo_of(c), -kvr, kvr);
    for (int b = 0; b < NUM_BUFS; b++) {
        if (!x->host[b])
            continue;
        const size_t bytes = (size_t)x->elems[b] * buf_esz(c, b);
        CINFER_TEST_OK(cinfer_test_buf_alloc(&x->dev[b], bytes));
        if (b <= B_V && bytes)
            CINFER_TEST_OK(cinfer_test_buf_upload(&x->dev[b], 0, x->host[b], bytes));
    }
}

typedef struct prefill_tensors {
    cinfer_test_tensor q, k, v, out, lse;
} prefill_tensors;

/* A DLTensor over a view; the view's offset goes into DLPack's byte_offset. */
static void view_tensor(cinfer_test_tensor *t, const prefill_data *x, const view_t *v,
                        cinfer__dtype_t dtype, int d, int hnd) {
    const int64_t esz = (int64_t)cinfer__dtype_size(dtype);
    if (d == 0) { /* lse: [tokens, heads] */
        const int64_t shape[2] = {v->tokens, v->heads}, strides[2] = {v->s_tok, v->s_head};
        cinfer_test_tensor_init(t, &x->dev[v->buf], 0, (uint64_t)(v->off * esz), dtype, 2, shape,
                                strides);
        return;
    }
    if (hnd) {
        const int64_t shape[3] = {v->heads, v->tokens, d}, strides[3] = {v->s_head, v->s_tok, 1};
        cinfer_test_tensor_init(t, &x->dev[v->buf], 0, (uint64_t)(v->off * esz), dtype, 3, shape,
                                strides);
    } else {
        const int64_t shape[3] = {v->tokens, v->heads, d}, strides[3] = {v->s_tok, v->s_head, 1};
        cinfer_test_tensor_init(t, &x->dev[v->buf], 0, (uint64_t)(v->off * esz), dtype, 3, shape,
                                strides);
    }
}

static void make_tensors(const prefill_case *c, const prefill_data *x, prefill_tensors *t) {
    const int hnd = !c->packed && c->layout == CINFER_KV_LAYOUT_HND;
    view_tensor(&t->q, x, &x->q, c->dtype, c->d, 0);
    view_tensor(&t->k, x, &x->k, kv_dtype_of(c), c->d, hnd);
    view_tensor(&t->v, x, &x->v, kv_dtype_of(c), dvo_of(c), hnd);
    view_tensor(&t->out, x, &x->out, c->dtype, dvo_of(c), 0);
    view_tensor(&t->lse, x, &x->lse, CINFER__DT_F32, 0, 0);
}

static cinfer_attention_options_t options_for(const prefill_case *c) {
    cinfer_attention_options_t o = CINFER_ATTENTION_OPTIONS_INIT;
    o.num_qo_heads = c->hq;
    o.num_kv_heads = c->hk;
    o.head_dim = c->d;
    o.head_dim_vo = c->dvo;
    o.kv_layout = c->packed ? CINFER_KV_LAYOUT_NHD : c->layout;
    o.q_dtype = cinfer_test_dl_dtype(c->dtype);
    o.kv_dtype = cinfer_test_dl_dtype(kv_dtype_of(c));
    o.sm_scale = c->sm_scale;
    o.logits_soft_cap = c->soft_cap;
    o.window_left = c->window_left;
    o.k_scale = c->k_scale;
    o.v_scale = c->v_scale;
    if (c->rope) {
        o.pos_encoding_mode = CINFER_POS_ENCODING_ROPE_LLAMA;
        if (c->rope_scale > 0)
            o.rope_scale = c->rope_scale;
        if (c->rope_theta > 0)
            o.rope_theta = c->rope_theta;
    }
    return o;
}

/* A strided3 reference view of head h of a view (one head: the head stride is never used). */
static cinfer__ref_strided3_t ref_view(const prefill_case *c, const prefill_data *x,
                                       const view_t *v, int64_t h) {
    cinfer__ref_strided3_t r;
    const cinfer__dtype_t dtype = buf_dtype(c, v->buf);
    r.data = x->host[v->buf] + (size_t)(v->off + h * v->s_head) * cinfer__dtype_size(dtype);
    r.dtype = cinfer_test_ref_dtype_of(dtype);
    r.stride_token = v->s_tok;
    r.stride_head = v->s_head;
    r.stride_dim = 1;
    return r;
}

/* Downloads the outputs and checks: canaries, the poison outside the output views, NaN in any
 * output row, and the values of the checked heads against the reference. */
static void check_outputs(const prefill_case *c, prefill_data *x, cinfer_test_rng *rng,
                          uint64_t seed, tv_state *tv) {
    const int64_t qo = c->qo_len, d = c->d, dv = dvo_of(c), group = c->hq / c->hk;
    for (int b = 0; b < NUM_BUFS; b++)
        if (x->dev[b].base)
            CINFER_TEST_OK(cinfer_test_buf_check_canaries(&x->dev[b]));
    const size_t out_bytes = (size_t)x->elems[B_OUT] * cinfer__dtype_size(c->dtype);
    const size_t lse_bytes = (size_t)x->elems[B_LSE] * 4;
    if (out_bytes)
        CINFER_TEST_OK(cinfer_test_buf_download(&x->dev[B_OUT], 0, x->host[B_OUT], out_bytes));
    if (lse_bytes)
        CINFER_TEST_OK(cinfer_test_buf_download(&x->dev[B_LSE], 0, x->host[B_LSE], lse_bytes));

    /* Which elements the views cover: everything else must still be poison. */
    unsigned char *covered = calloc((size_t)x->elems[B_OUT] + (size_t)x->elems[B_LSE] + 1, 1);
    unsigned char *lse_covered = covered + x->elems[B_OUT];
    for (int64_t t = 0; t < qo; t++)
        for (int64_t h = 0; h < c->hq; h++) {
            const int64_t o0 = x->out.off + t * x->out.s_tok + h * x->out.s_head;
            memset(covered + o0, 1, (size_t)dv);
            lse_covered[x->lse.off + t * x->lse.s_tok + h * x->lse.s_head] = 1;
        }
    const uint16_t *out16 = (const uint16_t *)x->host[B_OUT];
    for (int64_t i = 0; i < x->elems[B_OUT]; i++) {
        if (!covered[i] && out16[i] != 0xffff)
            fail_msg("%s: out element %lld outside the output view was written (0x%04x)", c->desc,
                     (long long)i, out16[i]);
        if (covered[i] && isnan(cinfer_test_load(c->dtype, out16, i)))
            fail_msg("%s: out element %lld is NaN (never written, or computed NaN)", c->desc,
                     (long long)i);
    }
    const uint32_t *lse32 = (const uint32_t *)x->host[B_LSE];
    for (int64_t i = 0; i < x->elems[B_LSE]; i++) {
        const int poisoned = lse32[i] == 0xffffffffu;
        if ((!lse_covered[i] || c->no_lse) && !poisoned)
            fail_msg("%s: lse element %lld was written (0x%08x) though %s", c->desc, (long long)i,
                     lse32[i], c->no_lse ? "lse was NULL" : "it is outside the lse view");
    }
    free(covered);

    /* The heads to compare. */
    int64_t heads[64];
    int64_t num_heads = 0;
    if (c->check_heads <= 0 || c->check_heads >= c->hq) {
        for (int64_t h = 0; h < c->hq && h < 64; h++)
            heads[num_heads++] = h;
    } else {
        for (int i = 0; i < c->check_heads && i < 64; i++)
            heads[num_heads++] = (int64_t)cinfer_test_rng_below(rng, (uint64_t)c->hq);
    }
    double *ref_o = malloc(sizeof(double) * (size_t)(qo * dv + 1));
    double *ref_lse = malloc(sizeof(double) * (size_t)(qo + 1));
    uint16_t *got = malloc(sizeof(uint16_t) * (size_t)(qo * dv + 1));
    float *got_lse = malloc(sizeof(float) * (size_t)(qo + 1));
    const int64_t kv = c->kv_len, delta = kv - qo;
    uint8_t *mask = NULL;
    if (tv->kind == TV_USER) {
        mask = malloc((size_t)(qo * kv + 1));
        for (int64_t i = 0; i < qo; i++)
            for (int64_t j = 0; j < kv; j++)
                mask[i * kv + j] = (uint8_t)tv_user_keep(i + delta, j);
    }
    double *ref_logits = NULL;
    if (tv->kind == TV_DUMP) {
        ref_logits = malloc(sizeof(double) * (size_t)(qo * kv + 1));
        tv_download_logits(tv);
    }
    for (int64_t hi = 0; hi < num_heads; hi++) {
        const int64_t h = heads[hi];
        cinfer__ref_heads_t rh = {1, 1, d, dv};
        cinfer__ref_strided3_t rq = ref_view(c, x, &x->q, h);
        cinfer__ref_strided3_t rk = ref_view(c, x, &x->k, h / group);
        cinfer__ref_strided3_t rv = ref_view(c, x, &x->v, h / group);
        cinfer__ref_attn_opts_t opts;
        cinfer__ref_attn_opts_init(&opts, d);
        if (c->sm_scale > 0)
            opts.sm_scale = c->sm_scale;
        opts.k_scale = c->k_scale;
        opts.v_scale = c->v_scale;
        opts.causal = c->causal != 0;
        opts.window_left = c->window_left;
        opts.logits_soft_cap = c->soft_cap;
        tv_ref_opts(tv, (int)h, &opts);
        opts.rope_llama = c->rope != 0;
        opts.rope_scale = c->rope_scale > 0 ? c->rope_scale : 1.0;
        opts.rope_theta = c->rope_theta > 0 ? c->rope_theta : 1e4;
        /* prefill rounds the rotated q and k to its 16-bit operands (include/cinfer.h) */
        opts.rope_round = (int)cinfer_test_ref_dtype_of(c->dtype);
        opts.custom_mask = tv->kind == TV_MASK ? tv->mask : mask;
        opts.logits_out = ref_logits;
        int rc = cinfer__ref_single(&rh, qo, c->kv_len, &rq, &rk, &rv, &opts, ref_o, ref_lse);
        if (rc != 0)
            fail_msg("%s: the reference failed (%d)", c->desc, rc);
        if (ref_logits) {
            /* Every kept logit was visited and dumped at h * qo * kv + i * kv + j. */
            for (int64_t i = 0; i < qo * kv; i++) {
                if (!isfinite(ref_logits[i]))
                    continue;
                const double g = tv->logits[h * qo * kv + i];
                if (!(fabs(g - ref_logits[i]) <= 2e-3 * (1.0 + fabs(ref_logits[i]))))
                    fail_msg("%s: dumped logit of head %lld, row %lld, key %lld is %g, expected "
                             "%g (seed %llu)",
                             c->desc, (long long)h, (long long)(i / kv), (long long)(i % kv), g,
                             ref_logits[i], (unsigned long long)seed);
            }
        }
        for (int64_t t = 0; t < qo; t++) {
            memcpy(got + t * dv, out16 + x->out.off + t * x->out.s_tok + h * x->out.s_head,
                   sizeof(uint16_t) * (size_t)dv);
            memcpy(&got_lse[t], lse32 + x->lse.off + t * x->lse.s_tok + h * x->lse.s_head, 4);
        }
        char what[64];
        snprintf(what, sizeof what, "out of head %lld", (long long)h);
        CINFER_TEST_ASSERT_CLOSE(cinfer_test_compare(c->dtype, got, ref_o, qo * dv,
                                                     cinfer_test_value_tolerance(c->dtype),
                                                     tv_max_abs_tol(tv, ref_o, qo * dv), 1e-3),
                                 what, c->desc, seed);
        if (!c->no_lse) {
            /* fp8 K/V runs the mmas in fp16 with q * sm_scale rounded to fp16 (2^-11 relative
             * per element): a logit moves by up to ~1e-3 of the sum of |q_i k_i| sm_scale. */
            const double lse_tol = is_fp8(c) ? 2e-3 : 1e-4;
            snprintf(what, sizeof what, "lse of head %lld", (long long)h);
            CINFER_TEST_ASSERT_LSE_CLOSE(cinfer_test_compare_lse(got_lse, ref_lse, qo, lse_tol),
                                         what, c->desc, seed);
        }
    }
    free(ref_o);
    free(ref_lse);
    free(got);
    free(got_lse);
    free(mask);
    free(ref_logits);
}

/* Runs one case end to end and checks it. */
static void run_case(const prefill_case *c, uint64_t seed) {
    cinfer_test_case(c->desc);
    cinfer_test_rng rng;
    cinfer_test_rng_init(&rng, seed);
    prefill_data x;
    make_data(c, &rng, &x);
    prefill_tensors t;
    make_tensors(c, &x, &t);
    cinfer_attention_options_t o = options_for(c);
    /* Dumped logits of head h, row i, key j land at h * qo * kv + i * kv + j. */
    const int64_t qo = c->qo_len, kv = c->kv_len;
    const int64_t row_offset = -(kv - qo) * kv;
    tv_state tv;
    tv_setup(&tv, c->variant, c->hq, &rng, c->hq * qo * kv + 1, 1, &row_offset, qo * kv, kv);
    if (c->variant == TV_MASK)
        tv_setup_mask(&tv, &rng, 1, &c->qo_len, &c->kv_len);
    o.variant = tv.variant;
    DLTensor *lse = c->no_lse ? NULL : &t.lse.t;
    cinfer_test_buf ws;
    memset(&ws, 0, sizeof ws);
    if (c->workspace) {
        size_t bytes = 0;
        CINFER_TEST_OK(cinfer_single_prefill_workspace_size(ctx, &o, c->causal, qo, kv, &bytes));
        if (c->workspace == WS_SPLIT && bytes == 0)
            fail_msg("%s: expected a split plan, the workspace size is 0", c->desc);
        if (c->workspace == WS_NONE && bytes != 0)
            fail_msg("%s: expected no split, the workspace size is %zu", c->desc, bytes);
        if (bytes) {
            CINFER_TEST_OK(cinfer_test_buf_alloc(&ws, bytes));
            /* One byte short: refused. */
            assert_int_equal(cinfer_single_prefill_with_workspace(
                                 ctx, &o, c->causal, &t.q.t, &t.k.t, &t.v.t, &t.out.t, lse,
                                 tv_args(&tv), (void *)(uintptr_t)ws.ptr, bytes - 1, stream),
                             CINFER_STATUS_WORKSPACE_TOO_SMALL);
        }
        CINFER_TEST_OK(cinfer_single_prefill_with_workspace(
            ctx, &o, c->causal, &t.q.t, &t.k.t, &t.v.t, &t.out.t, lse, tv_args(&tv),
            bytes ? (void *)(uintptr_t)ws.ptr : NULL, bytes, stream));
    } else {
        CINFER_TEST_OK(cinfer__single_prefill_config(ctx, &o, c->causal, &t.q.t, &t.k.t, &t.v.t,
                                                     &t.out.t, lse, tv_args(&tv), c->tiles,
                                                     stream));
    }
    CINFER_TEST_SYNC(stream);
    if (ws.base) {
        CINFER_TEST_OK(cinfer_test_buf_check_canaries(&ws));
        cinfer_test_buf_free(&ws);
    }
    check_outputs(c, &x, &rng, seed, &tv);
    tv_free(&tv);
    free_data(&x);
}

/* ---- tests ---- */

static void llama_heads(void **state) {
    (void)state;
    for (int causal = 0; causal < 2; causal++) {
        prefill_case c = base_case(causal ? "llama 32/8 causal" : "llama 32/8 non-causal");
        c.hq = 32;
        c.hk = 8;
        c.qo_len = c.kv_len = 1000;
        c.causal = causal;
        c.check_heads = 3;
        /* Through the public entry point (default tiles). */
        cinfer_test_rng rng;
        const uint64_t seed = cinfer_test_seed() + 100 + (uint64_t)causal;
        cinfer_test_rng_init(&rng, seed);
        prefill_data x;
        make_data(&c, &rng, &x);
        prefill_tensors t;
        make_tensors(&c, &x, &t);
        cinfer_attention_options_t o = options_for(&c);
        CINFER_TEST_OK(cinfer_single_prefill(ctx, &o, c.causal, &t.q.t, &t.k.t, &t.v.t, &t.out.t,
                                             &t.lse.t, NULL, stream));
        CINFER_TEST_SYNC(stream);
        {
            tv_state none;
            tv_setup(&none, TV_NONE, c.hq, &rng, 0, 0, NULL, 0, 0);
            check_outputs(&c, &x, &rng, seed, &none);
        }
        free_data(&x);
    }
}

static void head_dims_and_dtypes(void **state) {
    (void)state;
    static const int dims[] = {16, 32, 48, 64, 80, 96, 112, 128, 144, 160, 192, 240, 256};
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++) {
        for (int dt = 0; dt < 2; dt++) {
            char desc[64];
            snprintf(desc, sizeof desc, "D %d %s", dims[i], dt ? "f16" : "bf16");
            prefill_case c = base_case(desc);
            c.d = dims[i];
            c.dtype = dt ? CINFER__DT_F16 : CINFER__DT_BF16;
            c.qo_len = 150 + 37 * (int)i;
            c.kv_len = 300 + 53 * (int)i;
            c.causal = (int)(i + dt) % 2;
            run_case(&c, cinfer_test_seed() + 200 + 2 * i + (uint64_t)dt);
        }
    }
}

static void gqa_groups(void **state) {
    (void)state;
    static const int groups[][2] = {{1, 1}, {3, 1}, {4, 2}, {5, 1},  {6, 2},
                                    {7, 1}, {8, 1}, {8, 4}, {16, 1}, {2, 2}};
    for (size_t i = 0; i < sizeof groups / sizeof groups[0]; i++) {
        char desc[64];
        snprintf(desc, sizeof desc, "GQA %d/%d", groups[i][0], groups[i][1]);
        prefill_case c = base_case(desc);
        c.hq = groups[i][0];
        c.hk = groups[i][1];
        c.d = i % 2 ? 64 : 128;
        c.qo_len = 97 + 11 * (int)i;
        c.kv_len = 211 + 31 * (int)i;
        c.causal = (int)i % 3 != 0;
        run_case(&c, cinfer_test_seed() + 300 + i);
    }
}

static void layouts_and_strides(void **state) {
    (void)state;
    for (int mode = 0; mode < 8; mode++) {
        char desc[96];
        prefill_case c = base_case("");
        c.layout = mode & 1 ? CINFER_KV_LAYOUT_HND : CINFER_KV_LAYOUT_NHD;
        c.packed = (mode & 2) && c.layout == CINFER_KV_LAYOUT_NHD;
        c.strided_out = (mode & 4) != 0;
        c.hq = 8;
        c.hk = 2;
        c.d = mode % 3 == 0 ? 256 : mode % 3 == 1 ? 128 : 64;
        c.qo_len = mode & 1 ? 333 : 420;
        c.kv_len = mode & 2 ? 333 : 517;
        c.causal = mode % 2;
        snprintf(desc, sizeof desc, "%s%s%s D %d causal %d",
                 c.layout == CINFER_KV_LAYOUT_HND ? "HND" : "NHD", c.packed ? " packed QKV" : "",
                 c.strided_out ? " strided out/lse" : "", c.d, c.causal);
        c.desc = desc;
        run_case(&c, cinfer_test_seed() + 400 + (uint64_t)mode);
    }
}

static void masks_and_scales(void **state) {
    (void)state;
    static const int windows[] = {0, 1, 17, 63, 64, 100, 511, 5000};
    for (size_t i = 0; i < sizeof windows / sizeof windows[0]; i++) {
        for (int causal = 0; causal < 2; causal++) {
            char desc[64];
            snprintf(desc, sizeof desc, "window %d causal %d", windows[i], causal);
            prefill_case c = base_case(desc);
            c.window_left = windows[i];
            c.causal = causal;
            c.qo_len = 300 + 17 * (int)i;
            c.kv_len = causal ? 700 : 200 + 61 * (int)i;
            c.d = i % 2 ? 64 : 128;
            run_case(&c, cinfer_test_seed() + 500 + 2 * i + (uint64_t)causal);
        }
    }
    /* Soft cap with logits large enough to saturate tanh, and with a cap that barely bends; the
     * softmax subtracts a fixed maximum for caps up to 44.3 (bf16) or 10 (fp16) and the running
     * one above (kernels/prefill.cu, SOFTCAP_FIXED_MAX), so both sides of each limit, and every
     * logit within 0.1% of -cap (P at the bottom of the fixed maximum's window: 2^-86.6 at cap 30,
     * bf16; 2^-96 at cap 44, whose window is shifted up by 2^31). */
    static const struct {
        float cap;
        cinfer__dtype_t dtype;
        int all_negative;
    } caps[] = {
        {30.0f, CINFER__DT_BF16, 0}, {5.0f, CINFER__DT_F16, 0},   {1000.0f, CINFER__DT_BF16, 0},
        {44.0f, CINFER__DT_BF16, 0}, {45.0f, CINFER__DT_BF16, 0}, {30.0f, CINFER__DT_BF16, 1},
        {44.0f, CINFER__DT_BF16, 1}, {9.5f, CINFER__DT_F16, 1},   {11.0f, CINFER__DT_F16, 1}};
    for (size_t i = 0; i < sizeof caps / sizeof caps[0]; i++) {
        char desc[64];
        snprintf(desc, sizeof desc, "soft cap %g %s%s", (double)caps[i].cap,
                 cinfer__dtype_name(caps[i].dtype), caps[i].all_negative ? " all at -cap" : "");
        prefill_case c = base_case(desc);
        c.soft_cap = caps[i].cap;
        c.sm_scale = 1.0f;
        c.q_range = 3.0;
        c.causal = (int)i % 2;
        c.window_left = i == 2 ? 40 : -1;
        c.dtype = caps[i].dtype;
        c.all_negative = caps[i].all_negative;
        c.kv_range = c.all_negative ? 2.0 : 0.0; /* q . k <= -192: tanh(-192 / 44) < -0.9996 */
        run_case(&c, cinfer_test_seed() + (i < 3 ? 520 : 537) + i);
    }
    /* Peaked softmax (large logits: exp2 underflow, frequent max changes), and the scales. */
    prefill_case c = base_case("sm_scale 0.5, q in [-4, 4]");
    c.sm_scale = 0.5f;
    c.q_range = 4.0;
    run_case(&c, cinfer_test_seed() + 530);
    c = base_case("k_scale 0.25, v_scale 3");
    c.k_scale = 0.25f;
    c.v_scale = 3.0f;
    c.causal = 0;
    run_case(&c, cinfer_test_seed() + 531);
}

static void edge_lengths(void **state) {
    (void)state;
    static const int lens[][2] = {{1, 0},     {5, 0},     {0, 10},    {1, 1},    {1, 1000},
                                  {1000, 1},  {300, 100}, {100, 99},  {128, 64}, {129, 65},
                                  {127, 63},  {64, 4000}, {2000, 17}, {16, 16},  {17, 15},
                                  {255, 257}, {3, 4096}};
    for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
        for (int causal = 0; causal < 2; causal++) {
            char desc[64];
            snprintf(desc, sizeof desc, "qo_len %d kv_len %d causal %d", lens[i][0], lens[i][1],
                     causal);
            prefill_case c = base_case(desc);
            c.qo_len = lens[i][0];
            c.kv_len = lens[i][1];
            c.causal = causal;
            c.hq = 2;
            c.hk = 1;
            c.d = i % 3 == 0 ? 64 : i % 3 == 1 ? 128 : 256;
            c.no_lse = i == 4;
            c.window_left = i == 6 ? 30 : -1;
            run_case(&c, cinfer_test_seed() + 600 + 2 * i + (uint64_t)causal);
        }
    }
}

/*
 * The tile configurations the validator accepts, at the head dims with their own code paths
 * (64 and 128: a chunk column per thread, Q in registers or not; 80: the generic copy loop; 256:
 * Q re-read from shared memory). Configurations whose O and S accumulators alone exceed 192
 * registers per lane are valid but spill; they are left out to save compile time, as are those
 * the device's shared memory cannot hold (with 1 KiB for the static shared memory sm_90a kernels
 * reserve).
 */
static void all_tile_configs(void **state) {
    (void)state;
    static const int dims[] = {64, 128, 80, 256};
    static const int warps[] = {1, 2, 4, 8};
    static const int kvs[] = {16, 32, 64, 128};
    int n = 0;
    for (size_t di = 0; di < 4; di++)
        for (size_t wi = 0; wi < 4; wi++)
            for (int rows = 16; rows <= 32; rows += 16)
                for (size_t ki = 0; ki < 4; ki++) {
                    cinfer__prefill_config_t cfg = {.tile_q = rows * warps[wi],
                                                    .tile_kv = kvs[ki],
                                                    .warps = warps[wi],
                                                    .stages = 2 + (int)((wi + ki) % 3)};
                    if ((rows / 16) * (dims[di] / 2 + kvs[ki] / 2) > 192 ||
                        cinfer__prefill_smem_bytes(dims[di], &cfg) + 1024 >
                            (size_t)ctx->max_smem_per_block_optin)
                        continue;
                    char desc[96];
                    snprintf(desc, sizeof desc, "D %d tiles q%d kv%d w%d s%d", dims[di], cfg.tile_q,
                             cfg.tile_kv, cfg.warps, cfg.stages);
                    prefill_case c = base_case(desc);
                    c.d = dims[di];
                    c.hq = 2;
                    c.hk = 1;
                    c.qo_len = 333;
                    c.kv_len = 777;
                    c.causal = n % 2;
                    c.window_left = n % 3 == 0 ? 200 : -1;
                    c.tiles = &cfg;
                    run_case(&c, cinfer_test_seed() + 700 + (uint64_t)n);
                    n++;
                }
}

/*
 * The sm90 kernel (kernels/prefill_sm90.cuh; sm_90a devices only) through explicit tiles (its
 * default, 3 stages; 2 stages; one consumer warpgroup of 64 rows), both masks: lengths around its
 * 128-row tiles (one row, one tile, one past, qo_len > kv_len where the first rows keep nothing, an
 * empty KV, a short query over a long KV and the reverse), fp16 and bf16, NHD and HND, a packed QKV
 * (q, k, v strided slices), a strided out, GQA groups, scales, and with and without LSE; then soft
 * cap, sliding window and the variants it takes (ALiBi, sinks), then grids of more items than SMs
 * (CTAs taking several items). Its choice by default (a grid of a wave or more) is covered by
 * llama_heads and the randomized grid.
 */
/* Sixteen sm90 cases at head dim d (sm90_tiles): lengths off the tiles, both masks, the given
 * tiles (tiles[f % 3] for case f), GQA, dtypes and layouts, a soft cap (fixed and running maximum),
 * a window, ALiBi, sinks and a custom mask, and a grid of more items than SMs. The offsets and
 * residues vary which case gets which length, mask, dtype and layout from one d to another. */
typedef struct sm90_dim_cases {
    int d;
    const cinfer__prefill_config_t *tiles[3];
    int len_shift, causal_shift; /* case f: lengths (f + len_shift) % 8, causal (f + f / 8 + ..) */
    int f16_at;                  /* f % 2 == f16_at: fp16, else bf16 */
    int hnd_at, packed_at;       /* f % 4: HND K/V; q, k, v slices of one QKV buffer */
    int strided_at;              /* f % 5: out a slice of a wider buffer */
    int no_lse_at;               /* f: lse = NULL */
    uint64_t seed;
    int dvo; /* v's and out's head dim (0: d) */
} sm90_dim_cases;

static void run_sm90_dim_cases(const sm90_dim_cases *x) {
    static const int lens[][2] = {{1000, 1000}, {777, 1111}, {1111, 777}, {129, 300},
                                  {1, 1},       {5, 0},      {64, 4000},  {255, 257}};
    for (int f = 0; f < 16; f++) {
        char desc[160];
        prefill_case c = base_case("");
        c.d = x->d;
        c.dvo = x->dvo;
        c.qo_len = lens[(f + x->len_shift) % 8][0];
        c.kv_len = lens[(f + x->len_shift) % 8][1];
        c.causal = (f + f / 8 + x->causal_shift) % 2;
        c.tiles = x->tiles[f % 3];
        c.hq = f % 3 == 0 ? 8 : f % 3 == 1 ? 4 : 7;
        c.hk = f % 3 == 0 ? 2 : 1;
        c.dtype = f % 2 == x->f16_at ? CINFER__DT_F16 : CINFER__DT_BF16;
        c.layout = f % 4 == x->hnd_at ? CINFER_KV_LAYOUT_HND : CINFER_KV_LAYOUT_NHD;
        c.packed = f % 4 == x->packed_at;
        c.strided_out = f % 5 == x->strided_at;
        if (f >= 8) {
            c.soft_cap = f == 8 ? 30.0f : f == 9 ? 50.0f : 0.0f;
            c.window_left = f == 10 ? 300 : f == 14 ? 200 : -1;
            c.variant = f == 11   ? TV_ALIBI
                        : f == 12 ? TV_ALIBI_DEFAULT
                        : f == 13 ? TV_SINKS
                        : f == 14 ? TV_MASK
                                  : TV_NONE;
        }
        if (f == 15) { /* 256 items of the 2-group tile on 132 SMs or fewer */
            c.qo_len = c.kv_len = 1000;
            c.hq = 32;
            c.hk = 8;
            c.check_heads = 3;
            c.tiles = x->tiles[0];
        }
        c.no_lse = f == x->no_lse_at || (c.variant != TV_NONE && !tv_has_lse(c.variant));
        snprintf(desc, sizeof desc,
                 "sm90 D %d q%d s%d: qo %d kv %d causal %d heads %d/%d %s cap %g window %d %s", c.d,
                 c.tiles->tile_q, c.tiles->stages, c.qo_len, c.kv_len, c.causal, c.hq, c.hk,
                 cinfer__dtype_name(c.dtype), (double)c.soft_cap, c.window_left,
                 tv_name(c.variant));
        c.desc = desc;
        run_case(&c, cinfer_test_seed() + x->seed + (uint64_t)f);
    }
}

/* The D = 128 tiles the sm90 cases take: the library's (2 consumer warpgroups, 3 stages), that
 * one in 2 stages, and one consumer warpgroup (64 query rows). */
static void sm90_tile_set(cinfer__prefill_config_t tiles[3]) {
    cinfer__prefill_sm90_config(128, 128, &tiles[0]);
    tiles[1] = tiles[2] = tiles[0];
    tiles[1].stages = 2;
    tiles[2].tile_q = 64; /* one consumer warpgroup */
    tiles[2].warps = 4;
}

/* A grid of many items: 4000 causal queries over 300 positions with Llama heads at head dim d and
 * K/V of kv_dtype (CINFER__DT_NONE: q's) (1024 items, the 896 of the first 28 query tiles of each
 * head keeping nothing: most CTAs take one item with KV tiles, then items without). */
static void sm90_many_items_causal(int d, cinfer__dtype_t kv_dtype,
                                   const cinfer__prefill_config_t *tiles, uint64_t seed) {
    char desc[160];
    prefill_case c = base_case("");
    c.qo_len = 4000;
    c.kv_len = 300;
    c.causal = 1;
    c.d = d;
    c.kv_dtype = kv_dtype;
    c.tiles = tiles;
    c.hq = 32;
    c.hk = 8;
    c.check_heads = 3;
    snprintf(desc, sizeof desc, "sm90 D %d q%d s%d%s%s, many items: qo %d kv %d causal", c.d,
             c.tiles->tile_q, c.tiles->stages, kv_dtype != CINFER__DT_NONE ? " K/V " : "",
             kv_dtype != CINFER__DT_NONE ? cinfer__dtype_name(kv_dtype) : "", c.qo_len, c.kv_len);
    c.desc = desc;
    run_case(&c, seed);
}

static void sm90_tiles(void **state) {
    (void)state;
    if (!cinfer_test_sm90_device(ctx, "sm90_tiles"))
        return;
    static const int lens[][2] = {{1000, 1000}, {777, 1111}, {1111, 777}, {128, 128}, {129, 300},
                                  {300, 129},   {1, 1},      {5, 0},      {600, 300}, {64, 4000},
                                  {2000, 17},   {255, 257},  {3, 4096},   {256, 1}};
    cinfer__prefill_config_t tiles[3];
    sm90_tile_set(tiles);
    int n = 0;
    for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++)
        for (int causal = 0; causal < 2; causal++) {
            char desc[160];
            prefill_case c = base_case("");
            c.qo_len = lens[i][0];
            c.kv_len = lens[i][1];
            c.causal = causal;
            c.tiles = &tiles[n % 5 == 2 ? 1 : n % 5 == 4 ? 2 : 0];
            c.hq = i % 3 == 0 ? 32 : i % 3 == 1 ? 4 : 7;
            c.hk = i % 3 == 0 ? 8 : i % 3 == 1 ? 2 : 1;
            c.check_heads = c.hq > 8 ? 3 : 0;
            c.dtype = n % 2 ? CINFER__DT_F16 : CINFER__DT_BF16;
            c.layout = n % 4 == 1 ? CINFER_KV_LAYOUT_HND : CINFER_KV_LAYOUT_NHD;
            c.packed = n % 4 == 2;
            c.strided_out = n % 5 == 3;
            c.no_lse = n % 7 == 4;
            if (n % 6 == 5) {
                c.sm_scale = 0.05f;
                c.k_scale = 1.5f;
                c.v_scale = 0.75f;
            }
            snprintf(desc, sizeof desc, "sm90 q%d s%d: qo %d kv %d causal %d heads %d/%d %s %s%s%s",
                     c.tiles->tile_q, c.tiles->stages, c.qo_len, c.kv_len, causal, c.hq, c.hk,
                     cinfer__dtype_name(c.dtype), c.layout == CINFER_KV_LAYOUT_HND ? "HND" : "NHD",
                     c.packed ? " packed" : "", c.strided_out ? " strided out" : "");
            c.desc = desc;
            run_case(&c, cinfer_test_seed() + 1300 + (uint64_t)n++);
        }
    /* What it computes besides default attention: soft cap, sliding window (alone and with a soft
     * cap), and the variants of ALiBi slopes, state inits and masks in row form (ALiBi with a
     * slopes tensor and with the paper's slopes, sinks, custom masks, one with a window), on both
     * masks, lengths off the tiles, GQA. */
    static const int vlens[][2] = {{777, 1111}, {300, 129}, {600, 300}, {1000, 1000}};
    for (int f = 0; f < 7; f++)
        for (size_t i = 0; i < sizeof vlens / sizeof vlens[0]; i++) {
            char desc[160];
            prefill_case c = base_case("");
            c.qo_len = vlens[i][0];
            c.kv_len = vlens[i][1];
            c.causal = (int)((i + (size_t)f) % 2);
            c.tiles = &tiles[i == 3 ? 1 : 0];
            c.hq = 8;
            c.hk = 2;
            c.dtype = i == 2 ? CINFER__DT_F16 : CINFER__DT_BF16;
            switch (f) {
            case 0: /* 50 (Gemma 2's): too wide for bf16's fixed maximum; fp16 and 30 too */
                c.soft_cap = i == 1 ? 50.0f : 30.0f;
                break;
            case 1:
                c.window_left = i == 0 ? 300 : 100;
                break;
            case 2:
                c.window_left = 200;
                c.soft_cap = 5.0f;
                break;
            case 3:
                c.variant = TV_ALIBI;
                break;
            case 4:
                c.variant = TV_ALIBI_DEFAULT;
                break;
            case 5:
                c.variant = TV_SINKS;
                break;
            default:
                c.variant = TV_MASK;
                c.window_left = i == 2 ? 200 : -1;
                break;
            }
            c.no_lse = c.variant != TV_NONE && !tv_has_lse(c.variant);
            snprintf(desc, sizeof desc, "sm90 s%d: qo %d kv %d causal %d: cap %g window %d %s %s",
                     c.tiles->stages, c.qo_len, c.kv_len, c.causal, (double)c.soft_cap,
                     c.window_left, cinfer__dtype_name(c.dtype), tv_name(c.variant));
            c.desc = desc;
            run_case(&c, cinfer_test_seed() + 1400 + (uint64_t)n++);
        }
    /* Grids of more items than SMs (the kernel is persistent: a CTA takes item after item, its
     * stage ring, Q tile and the groups' turns running on across them): Llama heads over 1000 x
     * 1000 (256 items of the 2-group tile, 512 of the 1-group one), with the soft cap's softmax
     * turns (fixed maximum at 30, running one at 50), a window, sinks and a custom mask; then many
     * items without KV tiles, in 2 stages (sm90_tiles_d64 has that case at D = 64). */
    for (int f = 0; f < 6; f++) {
        char desc[160];
        prefill_case c = base_case("");
        c.qo_len = c.kv_len = 1000;
        c.causal = f % 2;
        c.tiles = &tiles[f == 5 ? 2 : f == 4 ? 1 : 0];
        c.hq = 32;
        c.hk = 8;
        c.check_heads = 3;
        c.soft_cap = f == 0 ? 30.0f : f == 1 ? 50.0f : 0.0f;
        c.window_left = f == 2 ? 300 : -1;
        c.variant = f == 3 ? TV_SINKS : f == 4 ? TV_MASK : TV_NONE;
        c.no_lse = c.variant != TV_NONE && !tv_has_lse(c.variant);
        snprintf(desc, sizeof desc,
                 "sm90 q%d s%d, many items: qo %d kv %d causal %d cap %g window %d %s",
                 c.tiles->tile_q, c.tiles->stages, c.qo_len, c.kv_len, c.causal, (double)c.soft_cap,
                 c.window_left, tv_name(c.variant));
        c.desc = desc;
        run_case(&c, cinfer_test_seed() + 1500 + (uint64_t)f);
    }
    sm90_many_items_causal(128, CINFER__DT_NONE, &tiles[1], cinfer_test_seed() + 1506);
}

/* D = 64 (P V as m64n64k16, 32 O registers per thread; single prefill without a soft cap, ALiBi
 * or a mask in row form has two Q tiles and runs an item's last P V with the next item's first
 * Q K^T) with the three tiles of sm90_tiles, and its many-items case. */
static void sm90_tiles_d64(void **state) {
    (void)state;
    if (!cinfer_test_sm90_device(ctx, "sm90_tiles_d64"))
        return;
    cinfer__prefill_config_t tiles[3];
    sm90_tile_set(tiles);
    const sm90_dim_cases d64 = {64, {&tiles[0], &tiles[1], &tiles[2]}, 0, 0, 1, 1, 2, 3, 4, 1600,
                                64};
    run_sm90_dim_cases(&d64);
    sm90_many_items_causal(64, CINFER__DT_NONE, &tiles[0], cinfer_test_seed() + 1507);
}

/* D = 256 (128 O registers per thread, K/V tiles of 64 rows in 2 stages; one consumer warpgroup
 * too). */
static void sm90_tiles_d256(void **state) {
    (void)state;
    if (!cinfer_test_sm90_device(ctx, "sm90_tiles_d256"))
        return;
    cinfer__prefill_config_t wide[2];
    cinfer__prefill_sm90_config(256, 256, &wide[0]);
    wide[1] = wide[0];
    wide[1].tile_q = 64;
    wide[1].warps = 4;
    const sm90_dim_cases d256 = {256, {&wide[0], &wide[0], &wide[1]}, 3, 1, 0, 3, 1, 2, 6, 1700,
                                 256};
    run_sm90_dim_cases(&d256);
}

/*
 * fp8 K/V (e4m3, e5m2) on the sm90 kernel, which converts each K/V tile in shared memory to fp16
 * and runs both products in fp16 (KV_FP8, kernels/prefill_sm90.cuh): at D = 128 its three tiles
 * (3 stages, 2 stages with K and V on barriers of their own, one consumer warpgroup), D = 64 and
 * 256; both masks, lengths off the tiles (kv_len 0, qo_len > kv_len), fp16 and bf16 q, GQA, HND,
 * strided out, k_scale / v_scale with q beyond [-1, 1], a soft cap, a window, ALiBi, sinks, a
 * custom mask, and a grid of more items than SMs.
 */
static void sm90_fp8(void **state) {
    (void)state;
    if (!cinfer_test_sm90_device(ctx, "sm90_fp8"))
        return;
    cinfer__prefill_config_t t128[3], t64, t256;
    sm90_tile_set(t128);
    cinfer__prefill_sm90_config(64, 64, &t64);
    cinfer__prefill_sm90_config(256, 256, &t256);
    static const struct {
        int d, tile, qo, kv, causal, e5m2, f16, hq, hk, hnd, strided, scales;
        float cap;
        int window;
        tv_kind variant;
    } cases[] = {
        {128, 0, 1000, 1000, 1, 0, 0, 8, 2, 0, 0, 0, 0.0f, -1, TV_NONE},
        {128, 0, 777, 1111, 0, 1, 1, 4, 1, 1, 0, 0, 0.0f, -1, TV_NONE},
        {128, 1, 1111, 777, 1, 0, 0, 8, 2, 0, 1, 1, 0.0f, -1, TV_NONE},
        {128, 2, 129, 300, 0, 1, 0, 7, 1, 0, 0, 0, 0.0f, -1, TV_NONE},
        {128, 0, 1, 1, 1, 1, 1, 4, 2, 0, 0, 0, 0.0f, -1, TV_NONE},
        {128, 1, 5, 0, 0, 0, 0, 4, 2, 1, 0, 0, 0.0f, -1, TV_NONE},
        {128, 0, 300, 100, 1, 0, 1, 8, 2, 0, 0, 1, 0.0f, -1, TV_NONE},
        {128, 0, 64, 4000, 1, 0, 0, 8, 2, 0, 0, 0, 30.0f, -1, TV_NONE},
        {128, 1, 1000, 1000, 1, 1, 0, 8, 2, 0, 0, 0, 0.0f, 300, TV_NONE},
        {128, 0, 255, 257, 0, 0, 0, 8, 2, 1, 0, 0, 0.0f, -1, TV_ALIBI},
        {128, 2, 777, 1111, 1, 1, 1, 4, 1, 0, 0, 0, 0.0f, -1, TV_SINKS},
        {128, 0, 600, 300, 0, 0, 0, 8, 2, 0, 0, 0, 0.0f, -1, TV_MASK},
        {64, 0, 1000, 1000, 1, 0, 0, 8, 2, 0, 0, 0, 0.0f, -1, TV_NONE},
        {64, 0, 777, 1111, 0, 1, 1, 4, 1, 1, 1, 1, 0.0f, -1, TV_NONE},
        {256, 0, 1111, 777, 1, 0, 1, 4, 1, 0, 0, 1, 0.0f, -1, TV_NONE},
        {256, 0, 129, 300, 0, 1, 0, 8, 2, 1, 0, 0, 30.0f, -1, TV_NONE},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char desc[192];
        prefill_case c = base_case("");
        c.d = cases[i].d;
        c.tiles = c.d == 64 ? &t64 : c.d == 256 ? &t256 : &t128[cases[i].tile];
        c.qo_len = cases[i].qo;
        c.kv_len = cases[i].kv;
        c.causal = cases[i].causal;
        c.kv_dtype = cases[i].e5m2 ? CINFER__DT_E5M2 : CINFER__DT_E4M3;
        c.dtype = cases[i].f16 ? CINFER__DT_F16 : CINFER__DT_BF16;
        c.hq = cases[i].hq;
        c.hk = cases[i].hk;
        c.layout = cases[i].hnd ? CINFER_KV_LAYOUT_HND : CINFER_KV_LAYOUT_NHD;
        c.strided_out = cases[i].strided;
        if (cases[i].scales) {
            c.k_scale = 0.5f;
            c.v_scale = 3.0f;
            c.q_range = 8.0;
        }
        c.soft_cap = cases[i].cap;
        c.window_left = cases[i].window;
        c.variant = cases[i].variant;
        c.no_lse = c.variant != TV_NONE && !tv_has_lse(c.variant);
        snprintf(desc, sizeof desc,
                 "sm90 fp8 %s D %d q%d s%d: qo %d kv %d causal %d heads %d/%d q %s%s%s cap %g "
                 "window %d %s",
                 cinfer__dtype_name(c.kv_dtype), c.d, c.tiles->tile_q, c.tiles->stages, c.qo_len,
                 c.kv_len, c.causal, c.hq, c.hk, cinfer__dtype_name(c.dtype),
                 cases[i].hnd ? " HND" : "", cases[i].scales ? " k/v scales" : "",
                 (double)c.soft_cap, c.window_left, tv_name(c.variant));
        c.desc = desc;
        run_case(&c, cinfer_test_seed() + 1800 + i);
    }
    sm90_many_items_causal(128, CINFER__DT_E4M3, &t128[0], cinfer_test_seed() + 1830);
}

/* D_qk / D_vo = 192 / 128 (DeepSeek's prefill heads: Q and K tiles of three column blocks, V and O
 * of two): the library's tiles (K/V tiles of 128 rows in 2 stages), K/V tiles of 64 rows in 3
 * stages, and one consumer warpgroup; then the library's choice for grids of a wave or more. */
static void sm90_tiles_d192(void **state) {
    (void)state;
    if (!cinfer_test_sm90_device(ctx, "sm90_tiles_d192"))
        return;
    cinfer__prefill_config_t t[3];
    cinfer__prefill_sm90_config(192, 128, &t[0]);
    t[1] = t[2] = t[0];
    t[1].tile_kv = 64;
    t[1].stages = 3;
    t[2].tile_q = 64;
    t[2].warps = 4;
    const sm90_dim_cases d192 = {192, {&t[0], &t[1], &t[2]}, 5, 0, 1, 2, 3, 1, 7, 1800, 128};
    run_sm90_dim_cases(&d192);
    for (int causal = 0; causal < 2; causal++) {
        prefill_case c =
            base_case(causal ? "sm90 D_qk 192 D_vo 128, the library's tiles, 2000 rows, causal"
                             : "sm90 D_qk 192 D_vo 128, the library's tiles, 2000 rows");
        c.d = 192;
        c.dvo = 128;
        c.qo_len = c.kv_len = 2000;
        c.causal = causal;
        c.hq = c.hk = 16; /* 256 query tiles: a grid of more than a wave */
        c.check_heads = 3;
        run_case(&c, cinfer_test_seed() + 1820 + (uint64_t)causal);
    }
}

/*
 * The tiles of 32 query rows per warp at D = 128 that bench_prefill --sweep measures (tile_q 128
 * on four warps, 64 or 32 KV rows, 2 or 3 stages; tile_q 256 on eight warps, the two warp groups
 * taking turns at the tensor cores): Llama heads, causal and not, lengths that are not tile
 * multiples, and on some a soft cap, a sliding window, fp16 or a variant.
 */
static void wide_warp_tiles(void **state) {
    (void)state;
    static const cinfer__prefill_config_t tiles[] = {
        {128, 64, 4, 2, false}, {128, 64, 4, 3, false}, {128, 32, 4, 2, false},
        {128, 32, 4, 3, false}, {256, 64, 8, 3, false}, {256, 64, 8, 4, false}};
    int n = 0;
    for (size_t i = 0; i < sizeof tiles / sizeof tiles[0]; i++)
        for (int causal = 0; causal < 2; causal++)
            for (int extra = 0; extra < 2; extra++) {
                char desc[128];
                prefill_case c = base_case("");
                c.hq = 32;
                c.hk = 8;
                c.qo_len = 777;
                c.kv_len = 1111;
                c.causal = causal;
                c.check_heads = 3;
                c.tiles = &tiles[i];
                if (extra) { /* one more feature per tile and mask */
                    switch ((i * 2 + (size_t)causal) % 4) {
                    case 0:
                        c.soft_cap = 30.0f;
                        break;
                    case 1:
                        c.window_left = 300;
                        break;
                    case 2:
                        c.dtype = CINFER__DT_F16;
                        c.layout = CINFER_KV_LAYOUT_HND;
                        break;
                    default:
                        c.variant = i < 2 ? TV_ALIBI : TV_SINKS;
                        c.no_lse = !tv_has_lse(c.variant);
                        break;
                    }
                }
                snprintf(desc, sizeof desc,
                         "tiles q%d kv%d w%d s%d causal %d: cap %g window %d %s %s variant %s",
                         c.tiles->tile_q, c.tiles->tile_kv, c.tiles->warps, c.tiles->stages, causal,
                         (double)c.soft_cap, c.window_left, cinfer__dtype_name(c.dtype),
                         c.layout == CINFER_KV_LAYOUT_HND ? "HND" : "NHD", tv_name(c.variant));
                c.desc = desc;
                run_case(&c, cinfer_test_seed() + 900 + (uint64_t)n++);
            }
    /* The turn-taking tiles where the groups differ: with qo_len > kv_len (causal) group 0's rows
     * of the first tile keep nothing while group 1's keep some, the last tile has 9 rows (group 1
     * none), one KV tile only, and an empty KV (no turn at all); and the variants whose code
     * differs in the loop (ALiBi's slopes and lazy maximum, a custom mask's rows, the user
     * variant with every hook but the state init, sinks' state init). */
    static const int lens[][3] = {{600, 300, 1}, {521, 40, 1}, {777, 64, 0}, {300, 0, 1}};
    static const tv_kind variants[] = {TV_ALIBI, TV_MASK, TV_USER, TV_SINKS};
    for (size_t i = 4; i < sizeof tiles / sizeof tiles[0]; i++)
        for (size_t l = 0; l < 8; l++) {
            char desc[128];
            prefill_case c = base_case("");
            c.hq = 4;
            c.hk = 2;
            c.tiles = &tiles[i];
            if (l < 4) {
                c.qo_len = lens[l][0];
                c.kv_len = lens[l][1];
                c.causal = lens[l][2];
            } else {
                c.qo_len = 700;
                c.kv_len = 900;
                c.causal = l % 2 == 0;
                c.variant = variants[l - 4];
                c.no_lse = !tv_has_lse(c.variant);
            }
            snprintf(desc, sizeof desc, "tiles q%d kv%d w%d s%d: qo %d kv %d causal %d variant %s",
                     c.tiles->tile_q, c.tiles->tile_kv, c.tiles->warps, c.tiles->stages, c.qo_len,
                     c.kv_len, c.causal, tv_name(c.variant));
            c.desc = desc;
            run_case(&c, cinfer_test_seed() + 950 + (uint64_t)n++);
        }
}

static void randomized_grid(void **state) {
    (void)state;
    static const int dims[] = {64, 128, 256};
    static const int groups[] = {1, 4, 8};
    for (int i = 0; i < 24; i++) {
        const uint64_t seed = cinfer_test_seed() + 800 + (uint64_t)i;
        cinfer_test_rng rng;
        cinfer_test_rng_init(&rng, seed ^ 0x5bd1e995u);
        char desc[160];
        prefill_case c = base_case("");
        c.qo_len = 1 + (int)cinfer_test_rng_below(&rng, 2000);
        c.kv_len = (int)cinfer_test_rng_below(&rng, 4001);
        c.d = dims[cinfer_test_rng_below(&rng, 3)];
        c.hk = 1 + (int)cinfer_test_rng_below(&rng, 2);
        c.hq = c.hk * groups[cinfer_test_rng_below(&rng, 3)];
        c.dtype = cinfer_test_rng_below(&rng, 2) ? CINFER__DT_F16 : CINFER__DT_BF16;
        c.layout = cinfer_test_rng_below(&rng, 2) ? CINFER_KV_LAYOUT_HND : CINFER_KV_LAYOUT_NHD;
        c.packed = c.layout == CINFER_KV_LAYOUT_NHD && cinfer_test_rng_below(&rng, 2);
        c.strided_out = cinfer_test_rng_below(&rng, 2) != 0;
        c.causal = cinfer_test_rng_below(&rng, 3) != 0;
        c.window_left = cinfer_test_rng_below(&rng, 10) < 3
                            ? (int)cinfer_test_rng_below(&rng, (uint64_t)c.kv_len + 2)
                            : -1;
        c.soft_cap = cinfer_test_rng_below(&rng, 5) == 0 ? 20.0f : 0.0f;
        c.q_range = cinfer_test_rng_uniform(&rng, 0.5, 4.0);
        c.check_heads = 2;
        snprintf(desc, sizeof desc,
                 "random %d: qo %d kv %d heads %d/%d D %d %s %s%s causal %d window %d cap %g", i,
                 c.qo_len, c.kv_len, c.hq, c.hk, c.d, cinfer__dtype_name(c.dtype),
                 c.layout == CINFER_KV_LAYOUT_HND ? "HND" : "NHD", c.packed ? " packed" : "",
                 c.causal, c.window_left, (double)c.soft_cap);
        c.desc = desc;
        run_case(&c, seed);
    }
}

/*
 * fp8 K/V (e4m3, e5m2) with fp16 and bf16 q: both masks, GQA 4, head dims 64 / 128 / 256 (one
 * chunk column per thread), 96 (the generic copies) and 48 (rows of an odd chunk count, a last
 * conversion pass that only some threads take), HND, k_scale / v_scale, soft cap with a window,
 * rows with nothing kept, lengths off the tile sizes, 16-row KV tiles in 3 stages (3 tiles in
 * flight), two-warp tiles, KV tiles of more rows than the CTA has threads (the conversion's
 * passes per column), e4m3 values that become fp16 subnormals in the kernel (K / 256), and
 * variants whose hooks see the output's dims. Few distinct kernels, to keep compile time down.
 */
static void fp8_kv(void **state) {
    (void)state;
    static const cinfer__prefill_config_t kv16 = {
        .tile_q = 64, .tile_kv = 16, .warps = 4, .stages = 3};
    static const cinfer__prefill_config_t two_warps = {
        .tile_q = 32, .tile_kv = 32, .warps = 2, .stages = 2};
    static const cinfer__prefill_config_t long_kv = {
        .tile_q = 32, .tile_kv = 128, .warps = 2, .stages = 2};
    uint64_t seed = cinfer_test_seed() + 2000;
    for (int kv = 0; kv < 2; kv++)
        for (int causal = 0; causal < 2; causal++) {
            char desc[96];
            snprintf(desc, sizeof desc, "fp8 %s, q %s, GQA 8/2, D 128, causal %d",
                     kv ? "e5m2" : "e4m3", kv ? "f16" : "bf16", causal);
            prefill_case c = base_case(desc);
            c.kv_dtype = kv ? CINFER__DT_E5M2 : CINFER__DT_E4M3;
            c.dtype = kv ? CINFER__DT_F16 : CINFER__DT_BF16;
            c.hq = 8;
            c.hk = 2;
            c.causal = causal;
            c.qo_len = 250;
            c.kv_len = 333;
            run_case(&c, seed++);
        }
    prefill_case c = base_case("fp8 e4m3, k_scale 0.5, v_scale 3, q in [-8, 8]");
    c.kv_dtype = CINFER__DT_E4M3;
    c.k_scale = 0.5f;
    c.v_scale = 3.0f;
    c.q_range = 8.0;
    c.kv_range = 3.0;
    run_case(&c, seed++);
    c = base_case("fp8 e4m3, qo_len 300 > kv_len 100 (rows with nothing kept), no lse");
    c.kv_dtype = CINFER__DT_E4M3;
    c.qo_len = 300;
    c.kv_len = 100;
    c.no_lse = 1;
    run_case(&c, seed++);
    c = base_case("fp8 e4m3, qo_len 1, kv_len 1");
    c.kv_dtype = CINFER__DT_E4M3;
    c.qo_len = c.kv_len = 1;
    run_case(&c, seed++);
    /* |K| < 2^-6: fp16 subnormals once divided by 256, which the mma must not flush. */
    c = base_case("fp8 e4m3, |k| < 2^-6 with k_scale 64");
    c.kv_dtype = CINFER__DT_E4M3;
    c.kv_range = 0.015;
    c.k_scale = 64.0f;
    c.v_scale = 50.0f;
    run_case(&c, seed++);
    c = base_case("fp8 e4m3, soft cap 30 and window 70");
    c.kv_dtype = CINFER__DT_E4M3;
    c.soft_cap = 30.0f;
    c.sm_scale = 1.0f;
    c.window_left = 70;
    c.kv_len = 500;
    run_case(&c, seed++);
    static const int dims[] = {64, 256, 96, 48};
    for (int i = 0; i < 4; i++) {
        char desc[96];
        snprintf(desc, sizeof desc, "fp8 %s, D %d, %s", i % 2 ? "e5m2" : "e4m3", dims[i],
                 i == 1 ? "HND, non-causal" : "NHD, causal");
        c = base_case(desc);
        c.desc = desc;
        c.kv_dtype = i % 2 ? CINFER__DT_E5M2 : CINFER__DT_E4M3;
        c.d = dims[i];
        c.causal = i != 1;
        c.layout = i == 1 ? CINFER_KV_LAYOUT_HND : CINFER_KV_LAYOUT_NHD;
        c.qo_len = 131 + 40 * i;
        c.kv_len = 277 + 19 * i;
        run_case(&c, seed++);
    }
    c = base_case("fp8 e4m3, tiles q64 kv16 w4 s3");
    c.kv_dtype = CINFER__DT_E4M3;
    c.tiles = &kv16;
    c.kv_len = 301;
    run_case(&c, seed++);
    c = base_case("fp8 e5m2, tiles q32 kv32 w2 s2, strided out and lse");
    c.kv_dtype = CINFER__DT_E5M2;
    c.tiles = &two_warps;
    c.strided_out = 1;
    run_case(&c, seed++);
    /* 128 KV rows over 64 threads: two passes per chunk column; lengths off the tile. */
    for (int kv = 0; kv < 2; kv++) {
        c = base_case(kv ? "fp8 e5m2, tiles q32 kv128 w2 s2, causal"
                         : "fp8 e4m3, tiles q32 kv128 w2 s2, non-causal");
        c.kv_dtype = kv ? CINFER__DT_E5M2 : CINFER__DT_E4M3;
        c.tiles = &long_kv;
        c.causal = kv;
        c.qo_len = 200;
        c.kv_len = 333;
        run_case(&c, seed++);
    }
    /* The user variant transforms q, the logits and each output dim; custom_mask drops logits. */
    static const tv_kind kinds[] = {TV_USER, TV_MASK};
    for (int i = 0; i < 2; i++) {
        c = base_case(i ? "fp8 e4m3, custom_mask variant" : "fp8 e4m3, user variant");
        c.kv_dtype = CINFER__DT_E4M3;
        c.variant = kinds[i];
        c.no_lse = !tv_has_lse(c.variant);
        run_case(&c, seed++);
    }
}

/*
 * D_qk != D_vo (options->head_dim_vo): v and out narrower or wider than q and k, through
 * cinfer_single_prefill (the template at the larger dim with zero-filled columns), its workspace
 * variant (unsplit, and split by batch prefill's plan and kernels with partial states of D_vo)
 * and explicit tiles, against the reference with v's own head dim.
 */
static void head_dims_qk_vo(void **state) {
    (void)state;
    static const struct {
        int d, dvo, causal, hq, hk, qo, kv;
    } dims[] = {
        {192, 128, 1, 8, 2, 300, 500}, /* DeepSeek's prefill heads (128 nope + 64 rope / 128) */
        {192, 128, 0, 4, 4, 177, 333}, {128, 64, 1, 8, 1, 250, 250},  {64, 128, 0, 6, 2, 90, 410},
        {96, 64, 1, 4, 2, 260, 130},   {256, 128, 1, 4, 1, 129, 257}, {128, 192, 1, 4, 2, 64, 96},
        {32, 256, 0, 2, 1, 70, 150},
    };
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++) {
        char desc[96];
        snprintf(desc, sizeof desc, "D_qk %d D_vo %d %s", dims[i].d, dims[i].dvo,
                 dims[i].causal ? "causal" : "non-causal");
        prefill_case c = base_case(desc);
        c.d = dims[i].d;
        c.dvo = dims[i].dvo;
        c.causal = dims[i].causal;
        c.hq = dims[i].hq;
        c.hk = dims[i].hk;
        c.qo_len = dims[i].qo;
        c.kv_len = dims[i].kv;
        c.dtype = i % 2 ? CINFER__DT_F16 : CINFER__DT_BF16;
        c.layout = i % 3 == 1 ? CINFER_KV_LAYOUT_HND : CINFER_KV_LAYOUT_NHD;
        c.strided_out = i == 2;
        c.packed = i == 4;
        c.no_lse = i == 5;
        c.workspace = i == 6 ? WS_NONE : 0;
        run_case(&c, cinfer_test_seed() + 1900 + i);
    }
    /* Soft cap, a window and a scale on 64-row tiles; the sinks variant on 256-row tiles of 8
     * warps in 4 stages (the turn-taking kernel's shape, here without turns: D_qk != D_vo). */
    static const cinfer__prefill_config_t small = {64, 64, 4, 2, false},
                                          wide = {256, 64, 8, 4, false};
    prefill_case c = base_case("D_qk 192 D_vo 128 soft cap, window, sm_scale");
    c.d = 192;
    c.dvo = 128;
    c.soft_cap = 30.0f;
    c.window_left = 70;
    c.sm_scale = 0.05f;
    c.qo_len = 230;
    c.kv_len = 410;
    c.tiles = &small;
    run_case(&c, cinfer_test_seed() + 1950);
    c = base_case("D_qk 128 D_vo 64, 256-row tiles, sinks");
    c.dvo = 64;
    c.qo_len = c.kv_len = 700;
    c.tiles = &wide;
    c.variant = TV_SINKS;
    run_case(&c, cinfer_test_seed() + 1951);
    c = base_case("D_qk 192 D_vo 128, kv_len 0 and qo_len > kv_len");
    c.d = 192;
    c.dvo = 128;
    c.kv_len = 0;
    run_case(&c, cinfer_test_seed() + 1952);
    c.kv_len = 40;
    c.qo_len = 100;
    run_case(&c, cinfer_test_seed() + 1953);
    c = base_case("D_qk 192 D_vo 128, 16 rows over 12000 positions, split");
    c.d = 192;
    c.dvo = 128;
    c.hq = c.hk = 8;
    c.qo_len = 16;
    c.kv_len = 12000;
    c.workspace = WS_SPLIT;
    run_case(&c, cinfer_test_seed() + 1954);
    c = base_case("D_qk 64 D_vo 256, 40 rows over 7000 positions, HND, window, split");
    c.d = 64;
    c.dvo = 256;
    c.qo_len = 40;
    c.kv_len = 7000;
    c.causal = 0;
    c.window_left = 2500;
    c.layout = CINFER_KV_LAYOUT_HND;
    c.workspace = WS_SPLIT;
    run_case(&c, cinfer_test_seed() + 1955);
}

static void bad_arguments_are_errors(void **state) {
    (void)state;
    prefill_case c = base_case("errors");
    cinfer_test_rng rng;
    cinfer_test_rng_init(&rng, cinfer_test_seed() + 900);
    prefill_data x;
    make_data(&c, &rng, &x);
    prefill_tensors t;
    make_tensors(&c, &x, &t);
    cinfer_attention_options_t o = options_for(&c);
#define EXPECT(status, what, call)                                                                 \
    do {                                                                                           \
        assert_int_equal((call), (status));                                                        \
        if ((what)[0] && !strstr(cinfer_last_error(), (what)))                                     \
            fail_msg("message \"%s\" does not name \"%s\"", cinfer_last_error(), (what));          \
    } while (0)
#define RUN(opts, causal, q, k, v, out, lse)                                                       \
    cinfer_single_prefill(ctx, (opts), (causal), (q), (k), (v), (out), (lse), NULL, stream)
    EXPECT(CINFER_STATUS_INVALID_ARGUMENT, "ctx",
           cinfer_single_prefill(NULL, &o, 1, &t.q.t, &t.k.t, &t.v.t, &t.out.t, &t.lse.t, NULL,
                                 stream));
    EXPECT(CINFER_STATUS_INVALID_ARGUMENT, "options",
           RUN(NULL, 1, &t.q.t, &t.k.t, &t.v.t, &t.out.t, &t.lse.t));
    EXPECT(CINFER_STATUS_INVALID_ARGUMENT, "causal",
           RUN(&o, 2, &t.q.t, &t.k.t, &t.v.t, &t.out.t, &t.lse.t));
    EXPECT(CINFER_STATUS_INVALID_ARGUMENT, "q",
           RUN(&o, 1, NULL, &t.k.t, &t.v.t, &t.out.t, &t.lse.t));
    cinfer_attention_options_t bad = o;
    bad.num_qo_heads = 3;
    EXPECT(CINFER_STATUS_INVALID_ARGUMENT, "num_qo_heads",
           RUN(&bad, 1, &t.q.t, &t.k.t, &t.v.t, &t.out.t, &t.lse.t));
    bad = o;
    bad.head_dim = 100;
    EXPECT(CINFER_STATUS_UNSUPPORTED, "head_dim",
           RUN(&bad, 1, &t.q.t, &t.k.t, &t.v.t, &t.out.t, &t.lse.t));
    bad.head_dim = 272;
    EXPECT(CINFER_STATUS_UNSUPPORTED, "head_dim",
           RUN(&bad, 1, &t.q.t, &t.k.t, &t.v.t, &t.out.t, &t.lse.t));
    /* D_vo: its range, then tensors that do not have it, then what it does not combine with. */
    bad = o;
    bad.head_dim_vo = -1;
    EXPECT(CINFER_STATUS_INVALID_ARGUMENT, "head_dim_vo = -1",
           RUN(&bad, 1, &t.q.t, &t.k.t, &t.v.t, &t.out.t, &t.lse.t));
    bad.head_dim_vo = 72;
    EXPECT(CINFER_STATUS_UNSUPPORTED, "head_dim_vo = 72",
           RUN(&bad, 1, &t.q.t, &t.k.t, &t.v.t, &t.out.t, &t.lse.t));
    bad.head_dim_vo = 64; /* v and out still have 128 */
    EXPECT(CINFER_STATUS_INVALID_ARGUMENT, "v",
           RUN(&bad, 1, &t.q.t, &t.k.t, &t.v.t, &t.out.t, &t.lse.t));
    bad.kv_dtype = cinfer_test_dl_dtype(CINFER__DT_E4M3);
    EXPECT(CINFER_STATUS_UNSUPPORTED, "head_dim_vo = 64",
           RUN(&bad, 1, &t.q.t, &t.k.t, &t.v.t, &t.out.t, &t.lse.t));
    bad = o;
    bad.head_dim_vo = 64;
    bad.pos_encoding_mode = CINFER_POS_ENCODING_ROPE_LLAMA;
    EXPECT(CINFER_STATUS_UNSUPPORTED, "ROPE_LLAMA",
           RUN(&bad, 1, &t.q.t, &t.k.t, &t.v.t, &t.out.t, &t.lse.t));
    bad = o;
    bad.head_dim_vo = 64;
    {
        /* Batch prefill takes it (tests/gpu/test_batch_prefill.c, head_dims_qk_vo); decode
         * refuses it by name. */
        size_t bytes = 0;
        CINFER_TEST_OK(cinfer_batch_prefill_workspace_size(ctx, &bad, CINFER_KV_STORAGE_RAGGED, 1,
                                                           64, &bytes));
        assert_true(bytes > 0);
        EXPECT(CINFER_STATUS_UNSUPPORTED, "batch decode",
               cinfer_batch_decode_workspace_size(ctx, &bad, &bytes));
    }
    bad = o;
    bad.kv_dtype = cinfer_test_dl_dtype(CINFER__DT_F32);
    EXPECT(CINFER_STATUS_UNSUPPORTED, "kv_dtype",
           RUN(&bad, 1, &t.q.t, &t.k.t, &t.v.t, &t.out.t, &t.lse.t));
    /* fp8 K/V in the options, but 16-bit k and v tensors (and the other way round). */
    bad = o;
    bad.kv_dtype = cinfer_test_dl_dtype(CINFER__DT_E4M3);
    EXPECT(CINFER_STATUS_INVALID_ARGUMENT, "k: dtype bf16",
           RUN(&bad, 1, &t.q.t, &t.k.t, &t.v.t, &t.out.t, &t.lse.t));
    bad = o;
    bad.window_left = -2;
    EXPECT(CINFER_STATUS_INVALID_ARGUMENT, "window_left",
           RUN(&bad, 1, &t.q.t, &t.k.t, &t.v.t, &t.out.t, &t.lse.t));
    bad = o;
    bad.logits_soft_cap = -1.0f;
    EXPECT(CINFER_STATUS_INVALID_ARGUMENT, "logits_soft_cap",
           RUN(&bad, 1, &t.q.t, &t.k.t, &t.v.t, &t.out.t, &t.lse.t));
    /* The split-KV workspace: its size function's arguments; a call that would split refuses a
     * NULL workspace; checks run before the workspace is looked at. */
    size_t ws_bytes = 1;
    EXPECT(CINFER_STATUS_INVALID_ARGUMENT, "device_bytes",
           cinfer_single_prefill_workspace_size(ctx, &o, 1, 16, 8192, NULL));
    EXPECT(CINFER_STATUS_INVALID_ARGUMENT, "qo_len = -1",
           cinfer_single_prefill_workspace_size(ctx, &o, 1, -1, 8192, &ws_bytes));
    assert_int_equal(ws_bytes, 0);
    EXPECT(CINFER_STATUS_INVALID_ARGUMENT, "causal",
           cinfer_single_prefill_workspace_size(ctx, &o, 2, 16, 8192, &ws_bytes));
    EXPECT(CINFER_STATUS_UNSUPPORTED, "kv_len",
           cinfer_single_prefill_workspace_size(ctx, &o, 1, 16, 1 << 30, &ws_bytes));
    EXPECT(CINFER_STATUS_INVALID_ARGUMENT, "ctx",
           cinfer_single_prefill_workspace_size(NULL, &o, 1, 16, 8192, &ws_bytes));
    EXPECT(CINFER_STATUS_INVALID_ARGUMENT, "causal",
           cinfer_single_prefill_with_workspace(ctx, &o, 2, &t.q.t, &t.k.t, &t.v.t, &t.out.t,
                                                &t.lse.t, NULL, NULL, 0, stream));
    {
        /* q of 4 rows over K/V of 6000 (the errors case's buffers hold 300, so K and V get a
         * buffer of their own: views reaching past the K/V buffers' ends would overlap out and be
         * refused for that before the workspace is looked at; the call must fail before it reads
         * anything, so the buffer is left poisoned). */
        cinfer_test_tensor q4 = t.q, k6 = t.k, v6 = t.v, o4 = t.out, l4 = t.lse;
        cinfer_test_tensor *views[] = {&q4, &k6, &v6, &o4, &l4};
        for (int i = 0; i < 5; i++) { /* the copies' DLTensors point at their own arrays */
            views[i]->t.shape = views[i]->shape;
            views[i]->t.strides = views[i]->t.strides ? views[i]->strides : NULL;
        }
        q4.shape[0] = o4.shape[0] = l4.shape[0] = 4;
        k6.shape[0] = v6.shape[0] = 6000;
        const size_t kv_bytes =
            6000 * (size_t)(k6.t.strides ? k6.strides[0] : k6.shape[1] * k6.shape[2]) * 2;
        cinfer_test_buf kv6;
        CINFER_TEST_OK(cinfer_test_buf_alloc(&kv6, 2 * kv_bytes));
        k6.t.data = (void *)(uintptr_t)kv6.ptr;
        v6.t.data = (void *)(uintptr_t)(kv6.ptr + kv_bytes);
        k6.t.byte_offset = v6.t.byte_offset = 0;
        CINFER_TEST_OK(cinfer_single_prefill_workspace_size(ctx, &o, 1, 4, 6000, &ws_bytes));
        assert_true(ws_bytes > 0);
        EXPECT(CINFER_STATUS_INVALID_ARGUMENT, "workspace is NULL",
               cinfer_single_prefill_with_workspace(ctx, &o, 1, &q4.t, &k6.t, &v6.t, &o4.t, &l4.t,
                                                    NULL, NULL, ws_bytes, stream));
        EXPECT(CINFER_STATUS_INVALID_ARGUMENT, "aligned",
               cinfer_single_prefill_with_workspace(ctx, &o, 1, &q4.t, &k6.t, &v6.t, &o4.t, &l4.t,
                                                    NULL, (char *)t.out.t.data + 4, ws_bytes,
                                                    stream));
        /* A workspace over K's bytes: refused before the schedule is copied into it (the
         * buffer holds more than the workspace needs, so a missed check would still write only
         * inside it). */
        assert_true(ws_bytes <= 2 * kv_bytes);
        EXPECT(CINFER_STATUS_INVALID_ARGUMENT, "overlaps k",
               cinfer_single_prefill_with_workspace(ctx, &o, 1, &q4.t, &k6.t, &v6.t, &o4.t, &l4.t,
                                                    NULL, k6.t.data, ws_bytes, stream));
        cinfer_test_buf_free(&kv6);
    }
    /* Shapes: q with another head count, v shorter than k, out with other rows, lse wrong. */
    t.q.shape[1] = 8;
    EXPECT(CINFER_STATUS_INVALID_ARGUMENT, "q",
           RUN(&o, 1, &t.q.t, &t.k.t, &t.v.t, &t.out.t, &t.lse.t));
    t.q.shape[1] = c.hq;
    t.v.shape[0] = c.kv_len - 1;
    EXPECT(CINFER_STATUS_INVALID_ARGUMENT, "v",
           RUN(&o, 1, &t.q.t, &t.k.t, &t.v.t, &t.out.t, &t.lse.t));
    t.v.shape[0] = c.kv_len;
    t.out.shape[0] = c.qo_len - 1;
    EXPECT(CINFER_STATUS_INVALID_ARGUMENT, "out",
           RUN(&o, 1, &t.q.t, &t.k.t, &t.v.t, &t.out.t, &t.lse.t));
    t.out.shape[0] = c.qo_len;
    t.lse.shape[1] = c.hq + 1;
    EXPECT(CINFER_STATUS_INVALID_ARGUMENT, "lse",
           RUN(&o, 1, &t.q.t, &t.k.t, &t.v.t, &t.out.t, &t.lse.t));
    t.lse.shape[1] = c.hq;
    /* dtypes: fp16 out for a bf16 call, fp16 lse. */
    t.out.t.dtype = cinfer_test_dl_dtype(CINFER__DT_F16);
    EXPECT(CINFER_STATUS_INVALID_ARGUMENT, "out",
           RUN(&o, 1, &t.q.t, &t.k.t, &t.v.t, &t.out.t, &t.lse.t));
    t.out.t.dtype = cinfer_test_dl_dtype(CINFER__DT_BF16);
    t.lse.t.dtype = cinfer_test_dl_dtype(CINFER__DT_F16);
    EXPECT(CINFER_STATUS_INVALID_ARGUMENT, "lse",
           RUN(&o, 1, &t.q.t, &t.k.t, &t.v.t, &t.out.t, &t.lse.t));
    t.lse.t.dtype = cinfer_test_dl_dtype(CINFER__DT_F32);
    /* Alignment: a row stride that is not a multiple of 16 bytes, a misaligned address. */
    t.k.strides[0] += 4;
    EXPECT(CINFER_STATUS_UNSUPPORTED, "k", RUN(&o, 1, &t.q.t, &t.k.t, &t.v.t, &t.out.t, &t.lse.t));
    t.k.strides[0] -= 4;
    t.q.t.byte_offset += 8;
    EXPECT(CINFER_STATUS_UNSUPPORTED, "q", RUN(&o, 1, &t.q.t, &t.k.t, &t.v.t, &t.out.t, &t.lse.t));
    t.q.t.byte_offset -= 8;
    /* Tiles the device cannot hold. */
    cinfer__prefill_config_t huge = {.tile_q = 256, .tile_kv = 128, .warps = 8, .stages = 4};
    assert_int_not_equal(cinfer__single_prefill_config(ctx, &o, 1, &t.q.t, &t.k.t, &t.v.t, &t.out.t,
                                                       &t.lse.t, NULL, &huge, stream),
                         CINFER_STATUS_SUCCESS);
    CINFER_TEST_SYNC(stream);
    /* Variant arguments that do not match the declaration, and options a variant contradicts. */
    {
        cinfer_attention_options_t ov = o;
        ov.variant = cinfer_variant_builtin("sinks");
        cinfer_test_tensor sinks_i32;
        const int64_t hq_shape[1] = {c.hq};
        cinfer_test_tensor_init(&sinks_i32, &x.dev[B_LSE], 0, 0, CINFER__DT_I32, 1, hq_shape, NULL);
        cinfer_test_tensor sinks_f32;
        cinfer_test_tensor_init(&sinks_f32, &x.dev[B_LSE], 0, 0, CINFER__DT_F32, 1, hq_shape, NULL);
        cinfer_arg_t a[2] = {CINFER_ARG_TENSOR(&sinks_i32.t), CINFER_ARG_F32(1.0f)};
        cinfer_args_t list = {1, a};
#define RUNV(opts, args)                                                                           \
    cinfer_single_prefill(ctx, (opts), 1, &t.q.t, &t.k.t, &t.v.t, &t.out.t, NULL, (args), stream)
        EXPECT(CINFER_STATUS_INVALID_ARGUMENT, "declares 1", RUNV(&ov, NULL));
        EXPECT(CINFER_STATUS_INVALID_ARGUMENT, "sinks", RUNV(&ov, &list)); /* int32 for float32 */
        a[0] = CINFER_ARG_F32(1.0f);
        EXPECT(CINFER_STATUS_INVALID_ARGUMENT, "kind", RUNV(&ov, &list)); /* scalar for tensor */
        a[0] = CINFER_ARG_TENSOR(NULL);
        EXPECT(CINFER_STATUS_INVALID_ARGUMENT, "maybe_", RUNV(&ov, &list)); /* NULL, not maybe_ */
        a[0] = CINFER_ARG_TENSOR(&sinks_f32.t);
        list.num_args = 2;
        EXPECT(CINFER_STATUS_INVALID_ARGUMENT, "2 variant argument", RUNV(&ov, &list));
        list.num_args = 1;
        ov.logits_soft_cap = 30.0f;
        EXPECT(CINFER_STATUS_INVALID_ARGUMENT, "logits_soft_cap", RUNV(&ov, &list));
        /* Arguments given to default attention. */
        EXPECT(CINFER_STATUS_INVALID_ARGUMENT, "default attention", RUNV(&o, &list));
        /* sigmoid has no LSE. */
        ov = o;
        ov.variant = cinfer_variant_builtin("sigmoid");
        cinfer_arg_t sa[2] = {CINFER_ARG_F32(1.0f), CINFER_ARG_F32(0.0f)};
        cinfer_args_t slist = {2, sa};
        EXPECT(CINFER_STATUS_INVALID_ARGUMENT, "no LSE",
               cinfer_single_prefill(ctx, &ov, 1, &t.q.t, &t.k.t, &t.v.t, &t.out.t, &t.lse.t,
                                     &slist, stream));
        sa[1] = CINFER_ARG_I32(0);
        EXPECT(CINFER_STATUS_INVALID_ARGUMENT, "bias", RUNV(&ov, &slist)); /* int32 for float */
        /* A compile error in user code points at the user's line. */
        cinfer_variant_t *bad_variant = NULL;
        CINFER_TEST_OK(cinfer_variant_create("bad_user",
                                             "#define VARIANT_LOGITS_TRANSFORM 1\n"
                                             "__device__ float variant_logits_transform(\n"
                                             "    const cinfer_variant_params *params, float l,\n"
                                             "    int b, int q, int k, int qh, int kh) {\n"
                                             "    return l + no_such_name;\n"
                                             "}\n",
                                             NULL, 0, &bad_variant));
        ov = o;
        ov.variant = bad_variant;
        EXPECT(CINFER_STATUS_COMPILE_ERROR, "variant:bad_user(5)", RUNV(&ov, NULL));
        cinfer_variant_destroy(bad_variant);
#undef RUNV
    }
    /* Nothing was written by the failed calls. */
    CINFER_TEST_OK(cinfer_test_buf_check_poisoned(&x.dev[B_OUT], (size_t)x.elems[B_OUT] * 2));
    /* And the arguments, restored, work; head_dim_vo = head_dim (D_vo given explicitly) too. */
    CINFER_TEST_OK(RUN(&o, 1, &t.q.t, &t.k.t, &t.v.t, &t.out.t, &t.lse.t));
    bad = o;
    bad.head_dim_vo = 128;
    CINFER_TEST_OK(RUN(&bad, 1, &t.q.t, &t.k.t, &t.v.t, &t.out.t, &t.lse.t));
    CINFER_TEST_SYNC(stream);
    {
        tv_state none;
        tv_setup(&none, TV_NONE, c.hq, &rng, 0, 0, NULL, 0, 0);
        check_outputs(&c, &x, &rng, cinfer_test_seed() + 900, &none);
    }
    free_data(&x);
#undef RUN
#undef EXPECT
}

/*
 * In-kernel RoPE against the reference's float64 rotation of the same 16-bit inputs: q at
 * i + kv_len - qo_len, k at j. Chunked prefill (qo_len < kv_len), non-causal fp16 HND with
 * rope_scale and rope_theta off their defaults, positions past 32k (where a float32 angle would
 * be off by whole radians), qo_len > kv_len (negative positions, fully masked rows), the generic
 * copy path (D 80) and the smallest head dim (16: one 8-pair unit per row), small tiles (a two-warp
 * CTA rotating K tiles of 16 rows), a window, and a variant (sinks) that sees the rotated logits.
 */
static void rope(void **state) {
    (void)state;
    static const cinfer__prefill_config_t small = {
        .tile_q = 32, .tile_kv = 16, .warps = 2, .stages = 3};
    for (int i = 0; i < 8; i++) {
        char desc[96];
        snprintf(desc, sizeof desc, "rope case %d", i);
        prefill_case c = base_case(desc);
        c.rope = 1;
        switch (i) {
        case 0: /* chunked prefill: 200 new rows after 100 cached, GQA 2, default scale/theta */
            break;
        case 1: /* non-causal, fp16, HND, scale and theta off their defaults */
            c.causal = 0;
            c.dtype = CINFER__DT_F16;
            c.layout = CINFER_KV_LAYOUT_HND;
            c.qo_len = 120;
            c.kv_len = 260;
            c.rope_scale = 2.5f;
            c.rope_theta = 5e5f;
            break;
        case 2: /* positions 40k: a short query block at the end of a long KV (Llama 3 base) */
            c.hq = 2;
            c.hk = 1;
            c.qo_len = 48;
            c.kv_len = 40000;
            c.rope_theta = 5e5f;
            break;
        case 3: /* positions past 100k, fp16 (finer rounding), rope_scale 0.5 */
            c.hq = 1;
            c.hk = 1;
            c.d = 64;
            c.dtype = CINFER__DT_F16;
            c.qo_len = 20;
            c.kv_len = 123457;
            c.rope_scale = 0.5f;
            c.check_heads = 1;
            break;
        case 4: /* qo_len > kv_len: negative positions, fully masked rows; D 80, GQA 4 */
            c.d = 80;
            c.hq = 8;
            c.hk = 2;
            c.qo_len = 150;
            c.kv_len = 90;
            c.dtype = CINFER__DT_F16;
            break;
        case 5: /* D 16 with a window */
            c.d = 16;
            c.qo_len = 77;
            c.kv_len = 333;
            c.window_left = 50;
            break;
        case 6: /* small tiles: 2 warps, K tiles of 16 rows in 3 stages */
            c.tiles = &small;
            c.qo_len = 70;
            c.kv_len = 190;
            c.rope_theta = 1e6f;
            break;
        default: /* a variant on top: sinks, D 256, packed QKV */
            c.variant = TV_SINKS;
            c.d = 256;
            c.packed = 1;
            c.qo_len = 90;
            c.kv_len = 170;
            break;
        }
        run_case(&c, cinfer_test_seed() + 7000 + (uint64_t)i);
    }
}

/* Every built-in variant and the suites' user variant (tests/support/variants.c) against the
 * reference's own implementation of each, causal and not, with a window, GQA, lengths that are
 * not tile multiples, qo_len > kv_len, and an empty KV; the custom mask also over 1100 keys. */
static void run_variant(tv_kind k) {
    for (int shape = 0; shape < (k == TV_MASK ? 6 : 5); shape++) {
        char desc[96];
        snprintf(desc, sizeof desc, "variant %s, shape %d", tv_name(k), shape);
        prefill_case c = base_case(desc);
        c.variant = k;
        c.no_lse = !tv_has_lse(c.variant);
        c.hq = 8;
        c.hk = 2;
        switch (shape) {
        case 0: /* causal, GQA 4, lengths off the tiles */
            c.qo_len = 157;
            c.kv_len = 301;
            break;
        case 1: /* non-causal, fp16, HND */
            c.causal = 0;
            c.dtype = CINFER__DT_F16;
            c.layout = CINFER_KV_LAYOUT_HND;
            c.qo_len = 64;
            c.kv_len = 700;
            break;
        case 2: /* causal with a window, qo_len > kv_len (fully masked rows), D 64 */
            c.window_left = 40;
            c.qo_len = 190;
            c.kv_len = 150;
            c.d = 64;
            break;
        case 3: /* D 240: KV tiles of 16 (a 32-position mask word spans two) */
            c.qo_len = 100;
            c.kv_len = 333;
            c.d = 240;
            break;
        case 5: /* custom mask only: long enough for tiles inside the causal and length edges,
                 * some of which the mask's kept blocks cover for a whole warp */
            c.qo_len = 520;
            c.kv_len = 1100;
            break;
        default: /* empty KV */
            c.qo_len = 33;
            c.kv_len = 0;
            break;
        }
        run_case(&c, cinfer_test_seed() + 5000 + (uint64_t)(k * 10 + shape));
    }
}

/* cinfer_single_prefill_with_workspace: short queries over long KV split across CTAs (batch
 * prefill's plan and kernels for one request), against the reference; calls that do not split
 * run single prefill's kernel without a workspace. */
static void workspace_split(void **state) {
    (void)state;
    for (int shape = 0; shape < 11; shape++) {
        char desc[96];
        snprintf(desc, sizeof desc, "single prefill with a workspace, shape %d", shape);
        prefill_case c = base_case(desc);
        c.workspace = WS_SPLIT;
        c.hq = 32;
        c.hk = 8;
        c.check_heads = 4;
        switch (shape) {
        case 0: /* a short chunk of a long prompt */
            c.qo_len = 16;
            c.kv_len = 16384;
            break;
        case 1: /* one query token, no GQA, fp16, HND, non-causal */
            c.qo_len = 1;
            c.kv_len = 5000;
            c.hq = c.hk = 8;
            c.check_heads = 0;
            c.dtype = CINFER__DT_F16;
            c.layout = CINFER_KV_LAYOUT_HND;
            c.causal = 0;
            break;
        case 2: /* slices of a packed QKV, out and lse slices, soft cap */
            c.qo_len = 64;
            c.kv_len = 8192;
            c.causal = 0;
            c.packed = 1;
            c.strided_out = 1;
            c.soft_cap = 30.0f;
            break;
        case 3: /* a sliding window and sinks, GQA 8 */
            c.qo_len = 100;
            c.kv_len = 9000;
            c.hq = 16;
            c.hk = 2;
            c.window_left = 3000;
            c.variant = TV_SINKS;
            break;
        case 4: /* fp8 K/V */
            c.qo_len = 8;
            c.kv_len = 10000;
            c.kv_dtype = CINFER__DT_E4M3;
            c.k_scale = 0.5f;
            c.v_scale = 2.0f;
            break;
        case 5: /* a custom mask */
            c.qo_len = 40;
            c.kv_len = 6000;
            c.hq = 8;
            c.hk = 2;
            c.variant = TV_MASK;
            break;
        case 6: /* no LSE, one KV head */
            c.qo_len = 24;
            c.kv_len = 4000;
            c.no_lse = 1;
            c.hq = 8;
            c.hk = 1;
            c.workspace = WS_ANY;
            break;
        case 7: /* a grid that fills the GPU: no split, no workspace */
            c.qo_len = c.kv_len = 2048;
            c.workspace = WS_NONE;
            break;
        case 8: /* a KV too short to split */
            c.qo_len = 16;
            c.kv_len = 300;
            c.workspace = WS_NONE;
            break;
        case 10: /* query tiles long enough for the sm90 kernel (where the device has it) */
            c.qo_len = 256;
            c.kv_len = 16384;
            break;
        default: /* the user variant (an output transform: never split) */
            c.qo_len = 16;
            c.kv_len = 8000;
            c.hq = 8;
            c.hk = 2;
            c.variant = TV_USER;
            c.workspace = WS_NONE;
            break;
        }
        run_case(&c, cinfer_test_seed() + 7000 + (uint64_t)shape);
    }
}

/* One test per variant (a failure in one still runs the others): *state is its tv_kind. */
static void variant(void **state) {
    run_variant(*(const tv_kind *)*state);
}

int main(void) {
    int rc = cinfer_test_gpu_setup(&ctx);
    if (rc)
        return rc;
    if (cinfer_test_stream_create(&stream) != CINFER_STATUS_SUCCESS) {
        fprintf(stderr, "error: %s\n", cinfer_last_error());
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(llama_heads, cinfer_test_teardown_buffers),
        cmocka_unit_test_teardown(head_dims_and_dtypes, cinfer_test_teardown_buffers),
        cmocka_unit_test_teardown(gqa_groups, cinfer_test_teardown_buffers),
        cmocka_unit_test_teardown(layouts_and_strides, cinfer_test_teardown_buffers),
        cmocka_unit_test_teardown(masks_and_scales, cinfer_test_teardown_buffers),
        cmocka_unit_test_teardown(edge_lengths, cinfer_test_teardown_buffers),
        cmocka_unit_test_teardown(all_tile_configs, cinfer_test_teardown_buffers),
        cmocka_unit_test_teardown(wide_warp_tiles, cinfer_test_teardown_buffers),
        cmocka_unit_test_teardown(sm90_tiles, cinfer_test_teardown_buffers),
        cmocka_unit_test_teardown(sm90_tiles_d64, cinfer_test_teardown_buffers),
        cmocka_unit_test_teardown(sm90_tiles_d256, cinfer_test_teardown_buffers),
        cmocka_unit_test_teardown(sm90_tiles_d192, cinfer_test_teardown_buffers),
        cmocka_unit_test_teardown(sm90_fp8, cinfer_test_teardown_buffers),
        cmocka_unit_test_teardown(randomized_grid, cinfer_test_teardown_buffers),
        cmocka_unit_test_teardown(fp8_kv, cinfer_test_teardown_buffers),
        cmocka_unit_test_teardown(bad_arguments_are_errors, cinfer_test_teardown_buffers),
        cmocka_unit_test_teardown(rope, cinfer_test_teardown_buffers),
        cmocka_unit_test_teardown(workspace_split, cinfer_test_teardown_buffers),
        cmocka_unit_test_teardown(head_dims_qk_vo, cinfer_test_teardown_buffers),
        TV_CMOCKA_TEST(variant, TV_SIGMOID, cinfer_test_teardown_buffers),
        TV_CMOCKA_TEST(variant, TV_SINKS, cinfer_test_teardown_buffers),
        TV_CMOCKA_TEST(variant, TV_ALIBI, cinfer_test_teardown_buffers),
        TV_CMOCKA_TEST(variant, TV_ALIBI_DEFAULT, cinfer_test_teardown_buffers),
        TV_CMOCKA_TEST(variant, TV_DUMP, cinfer_test_teardown_buffers),
        TV_CMOCKA_TEST(variant, TV_USER, cinfer_test_teardown_buffers),
        TV_CMOCKA_TEST(variant, TV_MASK, cinfer_test_teardown_buffers),
    };
    rc = cinfer_test_run_suite("gpu_test_prefill", tests, sizeof tests / sizeof tests[0]);
    cinfer_test_stream_destroy(stream);
    cinfer_test_gpu_teardown(ctx);
    return rc;
}
