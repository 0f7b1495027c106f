/*
 * MLA (cinfer_batch_mla_*) against the float64 CPU reference (cinfer__ref_batch_paged with one
 * KV head, D_qk = 576 and D_vo = 512: K = ckv | kpe and V = ckv of each position, q = q_nope |
 * q_pe): decode batches and prefill chunks, H = 1..128 (the kernel's rows packing 16 / H tokens
 * or 16 of H heads; on sm_90a for H a multiple of 64 the warpgroup kernel's 64 heads, and the
 * mma.sync kernel there too through cinfer__mla_test_no_sm90), fp16 / bf16, page sizes 1..64 (odd
 * ones included), causal on and off, empty requests, qo_len > kv_len, split-KV (few rows over long
 * KV: partial states merged by the MLA merge kernel), CUDA-graph capture and replay after
 * re-planning, and argument errors.
 *
 * Outputs are poisoned (NaN) inside canaries; q rows no request owns keep the poison in out and
 * lse; every cache slot no request owns holds NaN, so a read of a wrong page or slot shows up.
 */
#include "cuda/context.h"
#include "ops/mla.h"
#include "support/gpu.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static cinfer_context_t *ctx;
static CUstream stream;
static const cinfer__cuda_t *cu;

enum { CKV = 512, KPE = 64, DQK = CKV + KPE, Q_FRONT = 2, Q_BACK = 3, EXTRA_PAGES = 3 };

/* sum over requests of qo_len x kv_len x H x 576: about a second of reference work */
#define REF_BUDGET 3e8

typedef struct mla_case {
    const char *desc;
    int batch;
    const int *qo_lens, *kv_lens; /* fixed lengths, or NULL: random in [1, max_qo] / [0, max_kv] */
    int max_qo, max_kv;
    int heads, page_size, causal, lse;
    cinfer__dtype_t dtype;
    int expect_split; /* 1: the plan must split, -1: it must not, 0: either */
    double q_amp;     /* q uniform in [-q_amp, q_amp] (0: 1); large: logits whose row maxima grow
                         past the kernels' lazy-maximum slack from tile to tile */
} mla_case;

typedef struct mla_data {
    int batch;
    int *qo_len, *kv_len;
    int32_t *qo_indptr, *kv_indptr, *last, *indices;
    int64_t rows, pages, num_indices;
    size_t qn_bytes, qp_bytes, ckv_bytes, kpe_bytes, out_bytes;
    unsigned char *qn, *qp, *ckv, *kpe;
    cinfer_test_buf d_qn, d_qp, d_ckv, d_kpe, d_out, d_lse, d_indices, d_ws;
} mla_data;

static void free_host(mla_data *x) {
    free(x->qo_len);
    free(x->kv_len);
    free(x->qo_indptr);
    free(x->kv_indptr);
    free(x->last);
    free(x->indices);
    free(x->qn);
    free(x->qp);
    free(x->ckv);
    free(x->kpe);
}

static void free_data(mla_data *x) {
    free_host(x);
    cinfer_test_buf_free(&x->d_qn);
    cinfer_test_buf_free(&x->d_qp);
    cinfer_test_buf_free(&x->d_ckv);
    cinfer_test_buf_free(&x->d_kpe);
    cinfer_test_buf_free(&x->d_out);
    cinfer_test_buf_free(&x->d_lse);
    cinfer_test_buf_free(&x->d_indices);
    cinfer_test_buf_free(&x->d_ws);
    memset(x, 0, sizeof *x);
}

/* Lengths, a shuffled page pool with spare pages, and host data: NaN everywhere no request owns.
 * rows_cap / pages_cap (0 = just enough) let graph replays reuse the captured buffers. */
static void make_data(const mla_case *c, cinfer_test_rng *rng, mla_data *x, int64_t rows_cap,
                      int64_t pages_cap) {
    memset(x, 0, sizeof *x);
    const int B = c->batch, H = c->heads, P = c->page_size;
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
                c->qo_lens ? c->qo_lens[b] : 1 + (int)cinfer_test_rng_below(rng, (uint64_t)max_qo);
            x->kv_len[b] =
                c->kv_lens ? c->kv_lens[b] : (int)cinfer_test_rng_below(rng, (uint64_t)max_kv + 1);
            cost += (double)x->qo_len[b] * x->kv_len[b] * H * DQK;
        }
        if (cost <= REF_BUDGET || (c->qo_lens && c->kv_lens))
            break;
        max_qo = max_qo > 1 ? max_qo * 3 / 4 : 1;
        max_kv = max_kv > 1 ? max_kv * 3 / 4 : 1;
    }
    x->qo_indptr[0] = Q_FRONT;
    x->kv_indptr[0] = 1; /* page-table entry 0 unused */
    for (int b = 0; b < B; b++) {
        x->qo_indptr[b + 1] = x->qo_indptr[b] + x->qo_len[b];
        const int pages = (x->kv_len[b] + P - 1) / P;
        x->kv_indptr[b + 1] = x->kv_indptr[b] + pages;
        x->last[b] = pages ? x->kv_len[b] - (pages - 1) * P : 999; /* ignored without pages */
    }
    x->rows = x->qo_indptr[B] + Q_BACK;
    if (rows_cap) {
        assert_true(x->rows <= rows_cap);
        x->rows = rows_cap;
    }
    x->num_indices = x->kv_indptr[B] + 2;
    x->pages = x->kv_indptr[B] + EXTRA_PAGES;
    if (pages_cap) {
        assert_true(x->pages <= pages_cap);
        x->pages = x->num_indices = pages_cap;
    }
    x->indices = malloc(sizeof(int32_t) * (size_t)x->num_indices);
    int32_t *perm = malloc(sizeof(int32_t) * (size_t)x->pages);
    for (int64_t i = 0; i < x->pages; i++)
        perm[i] = (int32_t)i;
    for (int64_t i = x->pages - 1; i > 0; i--) {
        const int64_t j = (int64_t)cinfer_test_rng_below(rng, (uint64_t)i + 1);
        const int32_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    for (int64_t i = 0; i < x->num_indices; i++)
        x->indices[i] = perm[i % x->pages];
    free(perm);
    const size_t esz = cinfer__dtype_size(c->dtype);
    x->qn_bytes = (size_t)(x->rows * H * CKV) * esz;
    x->qp_bytes = (size_t)(x->rows * H * KPE) * esz;
    x->out_bytes = x->qn_bytes;
    x->ckv_bytes = (size_t)(x->pages * P * CKV) * esz;
    x->kpe_bytes = (size_t)(x->pages * P * KPE) * esz;
    x->qn = malloc(x->qn_bytes + 1);
    x->qp = malloc(x->qp_bytes + 1);
    x->ckv = malloc(x->ckv_bytes + 1);
    x->kpe = malloc(x->kpe_bytes + 1);
    memset(x->qn, 0xff, x->qn_bytes);
    memset(x->qp, 0xff, x->qp_bytes);
    memset(x->ckv, 0xff, x->ckv_bytes);
    memset(x->kpe, 0xff, x->kpe_bytes);
    const double amp = c->q_amp > 0 ? c->q_amp : 1.0;
    for (int64_t r = x->qo_indptr[0]; r < x->qo_indptr[B]; r++)
        for (int64_t h = 0; h < H; h++) {
            for (int d = 0; d < CKV; d++)
                cinfer_test_store(c->dtype, x->qn, (r * H + h) * CKV + d,
                                  cinfer_test_rng_uniform(rng, -amp, amp));
            for (int d = 0; d < KPE; d++)
                cinfer_test_store(c->dtype, x->qp, (r * H + h) * KPE + d,
                                  cinfer_test_rng_uniform(rng, -amp, amp));
        }
    for (int b = 0; b < B; b++)
        for (int t = 0; t < x->kv_len[b]; t++) {
            const int64_t slot =
                (int64_t)x->indices[x->kv_indptr[b] + t / P] * P + (int64_t)(t % P);
            for (int d = 0; d < CKV; d++)
                cinfer_test_store(c->dtype, x->ckv, slot * CKV + d,
                                  cinfer_test_rng_uniform(rng, -1.0, 1.0));
            for (int d = 0; d < KPE; d++)
                cinfer_test_store(c->dtype, x->kpe, slot * KPE + d,
                                  cinfer_test_rng_uniform(rng, -1.0, 1.0));
        }
}

static void alloc_device(mla_data *x) {
    CINFER_TEST_OK(cinfer_test_buf_alloc(&x->d_qn, x->qn_bytes));
    CINFER_TEST_OK(cinfer_test_buf_alloc(&x->d_qp, x->qp_bytes));
    CINFER_TEST_OK(cinfer_test_buf_alloc(&x->d_ckv, x->ckv_bytes));
    CINFER_TEST_OK(cinfer_test_buf_alloc(&x->d_kpe, x->kpe_bytes));
    CINFER_TEST_OK(cinfer_test_buf_alloc(&x->d_out, x->out_bytes));
    CINFER_TEST_OK(cinfer_test_buf_alloc(&x->d_lse, (size_t)x->rows * 4 * 128));
    CINFER_TEST_OK(cinfer_test_buf_alloc(&x->d_indices, (size_t)x->num_indices * 4));
}

static void upload(mla_data *x) {
    CINFER_TEST_OK(cinfer_test_buf_upload(&x->d_qn, 0, x->qn, x->qn_bytes));
    CINFER_TEST_OK(cinfer_test_buf_upload(&x->d_qp, 0, x->qp, x->qp_bytes));
    CINFER_TEST_OK(cinfer_test_buf_upload(&x->d_ckv, 0, x->ckv, x->ckv_bytes));
    CINFER_TEST_OK(cinfer_test_buf_upload(&x->d_kpe, 0, x->kpe, x->kpe_bytes));
    CINFER_TEST_OK(
        cinfer_test_buf_upload(&x->d_indices, 0, x->indices, (size_t)x->num_indices * 4));
    CINFER_TEST_OK(cinfer_test_buf_poison(&x->d_out));
    CINFER_TEST_OK(cinfer_test_buf_poison(&x->d_lse));
}

typedef struct mla_tensors {
    cinfer_test_tensor qn, qp, ckv, kpe, indices, out, lse;
} mla_tensors;

static void make_tensors(const mla_case *c, const mla_data *x, mla_tensors *t) {
    const int64_t qn[3] = {x->rows, c->heads, CKV}, qp[3] = {x->rows, c->heads, KPE};
    const int64_t ckv[3] = {x->pages, c->page_size, CKV}, kpe[3] = {x->pages, c->page_size, KPE};
    const int64_t lse[2] = {x->rows, c->heads}, idx[1] = {x->num_indices};
    cinfer_test_tensor_init(&t->qn, &x->d_qn, 0, 0, c->dtype, 3, qn, NULL);
    cinfer_test_tensor_init(&t->qp, &x->d_qp, 0, 0, c->dtype, 3, qp, NULL);
    cinfer_test_tensor_init(&t->ckv, &x->d_ckv, 0, 0, c->dtype, 3, ckv, NULL);
    cinfer_test_tensor_init(&t->kpe, &x->d_kpe, 0, 0, c->dtype, 3, kpe, NULL);
    cinfer_test_tensor_init(&t->out, &x->d_out, 0, 0, c->dtype, 3, qn, NULL);
    cinfer_test_tensor_init(&t->lse, &x->d_lse, 0, 0, CINFER__DT_F32, 2, lse, NULL);
    cinfer_test_tensor_init(&t->indices, &x->d_indices, 0, 0, CINFER__DT_I32, 1, idx, NULL);
}

static float sm_scale_of(void) {
    return 1.0f / sqrtf(192.0f); /* DeepSeek's 1 / sqrt(128 + 64) */
}

static cinfer_mla_options_t options_for(const mla_case *c, int max_batch, int graph) {
    cinfer_mla_options_t o = CINFER_MLA_OPTIONS_INIT;
    o.num_heads = c->heads;
    o.page_size = c->page_size;
    o.q_dtype = o.kv_dtype = cinfer_test_dl_dtype(c->dtype);
    o.sm_scale = sm_scale_of();
    o.max_batch_size = max_batch;
    o.use_cuda_graph = graph;
    return o;
}

/* The reference: q = q_nope | q_pe and K = ckv | kpe as 576-wide copies, V = ckv itself. */
static void reference(const mla_case *c, const mla_data *x, double *o, double *lse) {
    const int H = c->heads, P = c->page_size;
    const size_t esz = cinfer__dtype_size(c->dtype);
    unsigned char *q = malloc((size_t)(x->rows * H * DQK) * esz + 1);
    unsigned char *k = malloc((size_t)(x->pages * P * DQK) * esz + 1);
    for (int64_t r = 0; r < x->rows * H; r++) {
        memcpy(q + (size_t)(r * DQK) * esz, x->qn + (size_t)(r * CKV) * esz, CKV * esz);
        memcpy(q + (size_t)(r * DQK + CKV) * esz, x->qp + (size_t)(r * KPE) * esz, KPE * esz);
    }
    for (int64_t s = 0; s < x->pages * P; s++) {
        memcpy(k + (size_t)(s * DQK) * esz, x->ckv + (size_t)(s * CKV) * esz, CKV * esz);
        memcpy(k + (size_t)(s * DQK + CKV) * esz, x->kpe + (size_t)(s * KPE) * esz, KPE * esz);
    }
    const cinfer__ref_dtype_t rd = cinfer_test_ref_dtype_of(c->dtype);
    cinfer__ref_heads_t heads = {H, 1, DQK, CKV};
    cinfer__ref_strided3_t qs = {q, rd, (int64_t)H * DQK, DQK, 1};
    cinfer__ref_paged_t ks = {k, rd, (int64_t)P * DQK, DQK, 0, 1};
    cinfer__ref_paged_t vs = {x->ckv, rd, (int64_t)P * CKV, CKV, 0, 1};
    cinfer__ref_page_table_t table = {c->batch, P, x->pages, x->kv_indptr, x->indices, x->last};
    cinfer__ref_attn_opts_t opts;
    cinfer__ref_attn_opts_init(&opts, DQK);
    opts.sm_scale = sm_scale_of();
    opts.causal = c->causal != 0;
    const int rc = cinfer__ref_batch_paged(&heads, &qs, x->qo_indptr, &ks, &vs, &table, NULL, NULL,
                                           &opts, o, lse);
    free(q);
    free(k);
    if (rc != 0)
        fail_msg("%s: the reference failed (%d)", c->desc, rc);
}

static void check_outputs(const mla_case *c, mla_data *x, uint64_t seed) {
    CINFER_TEST_OK(cinfer_test_buf_check_canaries(&x->d_out));
    CINFER_TEST_OK(cinfer_test_buf_check_canaries(&x->d_lse));
    const int H = c->heads;
    const int64_t row_elems = (int64_t)H * CKV;
    uint16_t *out = malloc(x->out_bytes + 2);
    float *lse = malloc((size_t)(x->rows * H) * 4 + 4);
    CINFER_TEST_OK(cinfer_test_buf_download(&x->d_out, 0, out, x->out_bytes));
    CINFER_TEST_OK(cinfer_test_buf_download(&x->d_lse, 0, lse, (size_t)(x->rows * H) * 4));
    const int64_t r0 = x->qo_indptr[0], r1 = x->qo_indptr[x->batch];
    for (int64_t r = 0; r < x->rows; r++) {
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
        for (int h = 0; h < H; h++) {
            uint32_t bits;
            memcpy(&bits, &lse[r * H + h], 4);
            if ((!owned || !c->lse) && bits != 0xffffffffu)
                fail_msg("%s: lse row %lld head %d was written (0x%08x)", c->desc, (long long)r, h,
                         bits);
        }
    }
    double *ref_o = calloc((size_t)(x->rows * row_elems) + 1, sizeof(double));
    double *ref_lse = calloc((size_t)(x->rows * H) + 1, sizeof(double));
    reference(c, x, ref_o, ref_lse);
    const int64_t n = (r1 - r0) * row_elems;
    CINFER_TEST_ASSERT_CLOSE(cinfer_test_compare(c->dtype, out + r0 * row_elems,
                                                 ref_o + r0 * row_elems, n,
                                                 cinfer_test_value_tolerance(c->dtype), 0.05, 1e-3),
                             "out", c->desc, seed);
    if (c->lse)
        CINFER_TEST_ASSERT_LSE_CLOSE(
            cinfer_test_compare_lse(lse + r0 * H, ref_lse + r0 * H, (r1 - r0) * H, 1e-4), "lse",
            c->desc, seed);
    free(ref_o);
    free(ref_lse);
    free(out);
    free(lse);
}

static cinfer_status_t run_op(cinfer_batch_mla_t *op, const mla_case *c, mla_tensors *t) {
    return cinfer_batch_mla_run(op, &t->qn.t, &t->qp.t, &t->ckv.t, &t->kpe.t, &t->indices.t,
                                &t->out.t, c->lse ? &t->lse.t : NULL, stream);
}

static cinfer_batch_mla_t *make_op(const mla_case *c, mla_data *x, int max_batch, int64_t max_total,
                                   int graph) {
    cinfer_mla_options_t o = options_for(c, max_batch, graph);
    size_t ws = 0;
    CINFER_TEST_OK(cinfer_batch_mla_workspace_size(ctx, &o, c->causal, max_total, &ws));
    CINFER_TEST_OK(cinfer_test_buf_alloc(&x->d_ws, ws));
    cinfer_batch_mla_t *op = NULL;
    CINFER_TEST_OK(cinfer_batch_mla_create(ctx, &o, c->causal, max_total,
                                           (void *)(uintptr_t)x->d_ws.ptr, ws, &op));
    return op;
}

static void run_case(const mla_case *c, uint64_t seed) {
    cinfer_test_case(c->desc);
    cinfer_test_rng rng;
    cinfer_test_rng_init(&rng, seed);
    mla_data x;
    make_data(c, &rng, &x, 0, 0);
    alloc_device(&x);
    upload(&x);
    mla_tensors t;
    make_tensors(c, &x, &t);
    const int64_t total = x.qo_indptr[c->batch] - x.qo_indptr[0];
    cinfer_batch_mla_t *op = make_op(c, &x, c->batch > 0 ? c->batch : 1, total > 0 ? total : 1, 0);
    CINFER_TEST_OK(cinfer_batch_mla_plan(op, x.qo_indptr, x.kv_indptr, x.last, c->batch, stream));
    const bool split = cinfer__batch_mla_split(op);
    if ((c->expect_split > 0 && !split) || (c->expect_split < 0 && split))
        fail_msg("%s: the plan %s the KV", c->desc, split ? "split" : "did not split");
    CINFER_TEST_OK(run_op(op, c, &t));
    CINFER_TEST_SYNC(stream);
    /* The workspace is exactly what workspace_size reported: nothing past it is written. */
    CINFER_TEST_OK(cinfer_test_buf_check_canaries(&x.d_ws));
    check_outputs(c, &x, seed);
    cinfer_batch_mla_destroy(op);
    free_data(&x);
}

static mla_case base_case(const char *desc) {
    mla_case c;
    memset(&c, 0, sizeof c);
    c.desc = desc;
    c.batch = 8;
    c.max_qo = 1;
    c.max_kv = 1500;
    c.heads = 16;
    c.page_size = 64;
    c.causal = 1;
    c.lse = 1;
    c.dtype = CINFER__DT_BF16;
    return c;
}

/* ---- tests ---- */

/* Decode steps (one row per request) over heads 16 (DeepSeek-V3 at tensor parallel 8), 128 and
 * 32, empty requests and requests shorter than a page. */
static void decode_batches(void **state) {
    (void)state;
    static const struct {
        int heads, page_size, batch, max_kv;
        cinfer__dtype_t dtype;
    } cases[] = {
        {16, 64, 12, 2000, CINFER__DT_BF16},
        {128, 16, 4, 700, CINFER__DT_F16},
        {32, 1, 6, 500, CINFER__DT_BF16},
        {16, 7, 20, 300, CINFER__DT_F16},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char desc[96];
        snprintf(desc, sizeof desc, "decode: H %d, page %d, batch %d, %s", cases[i].heads,
                 cases[i].page_size, cases[i].batch, cinfer__dtype_name(cases[i].dtype));
        mla_case c = base_case(desc);
        c.heads = cases[i].heads;
        c.page_size = cases[i].page_size;
        c.batch = cases[i].batch;
        c.max_kv = cases[i].max_kv;
        c.dtype = cases[i].dtype;
        c.lse = i != 3;
        run_case(&c, cinfer_test_seed() + 100 + i);
    }
    static const int qo[] = {1, 1, 1, 1}, kv[] = {0, 1, 64, 65};
    mla_case c = base_case("decode: kv_len 0, 1, one page, a page and one");
    c.batch = 4;
    c.qo_lens = qo;
    c.kv_lens = kv;
    run_case(&c, cinfer_test_seed() + 110);
}

/* Prefill chunks: several tokens per request, causal (bottom-right, qo_len > kv_len too) and
 * not, with H below 16 (the rows pack 16 / H tokens) and at 16. */
static void prefill_chunks(void **state) {
    (void)state;
    static const struct {
        int heads, page_size, causal, max_qo, max_kv;
    } cases[] = {
        {8, 7, 1, 30, 400},  {1, 32, 0, 100, 300}, {2, 16, 1, 50, 200},
        {4, 64, 0, 40, 300}, {16, 16, 1, 20, 300},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char desc[96];
        snprintf(desc, sizeof desc, "prefill: H %d, page %d, causal %d", cases[i].heads,
                 cases[i].page_size, cases[i].causal);
        mla_case c = base_case(desc);
        c.heads = cases[i].heads;
        c.page_size = cases[i].page_size;
        c.causal = cases[i].causal;
        c.batch = 5;
        c.max_qo = cases[i].max_qo;
        c.max_kv = cases[i].max_kv;
        c.dtype = i % 2 ? CINFER__DT_F16 : CINFER__DT_BF16;
        run_case(&c, cinfer_test_seed() + 200 + i);
    }
    static const int qo[] = {40, 3, 17}, kv[] = {10, 3, 0};
    mla_case c = base_case("prefill: qo_len > kv_len, qo_len = kv_len, kv_len 0");
    c.batch = 3;
    c.qo_lens = qo;
    c.kv_lens = kv;
    c.heads = 4;
    run_case(&c, cinfer_test_seed() + 210);
}

/* Split-KV: one long request (its chunks fill the GPU), and a few rows over long KV. */
static void split_kv(void **state) {
    (void)state;
    static const int qo1[] = {1}, kv1[] = {20000};
    mla_case c = base_case("split-KV: one decode row over 20000 positions, H 16");
    c.batch = 1;
    c.qo_lens = qo1;
    c.kv_lens = kv1;
    c.expect_split = 1;
    run_case(&c, cinfer_test_seed() + 300);
    static const int qo2[] = {3, 1, 2}, kv2[] = {9000, 5000, 40};
    c = base_case("split-KV: prefill rows over long KV, H 32, causal, page 13");
    c.batch = 3;
    c.qo_lens = qo2;
    c.kv_lens = kv2;
    c.heads = 32;
    c.page_size = 13;
    c.expect_split = 1;
    c.dtype = CINFER__DT_F16;
    run_case(&c, cinfer_test_seed() + 301);
    static const int qo3[] = {16}, kv3[] = {6000};
    c = base_case("split-KV: 16 rows of H 1, not causal, no lse");
    c.batch = 1;
    c.qo_lens = qo3;
    c.kv_lens = kv3;
    c.heads = 1;
    c.causal = 0;
    c.lse = 0;
    c.expect_split = 1;
    run_case(&c, cinfer_test_seed() + 302);
    /* 8 split rows at H 16, 32, 64 and 128: 128 to 1024 (row, head) pairs, so the merge runs
     * with 8, 4, 2 and 1 column slices per pair (src/ops/mla.c). */
    static const int qo4[] = {1, 1, 1, 1, 1, 1, 1, 1},
                     kv4[] = {1500, 2100, 1800, 2500, 1300, 3000, 1700, 2200};
    static const int heads4[] = {16, 32, 64, 128};
    for (int i = 0; i < 4; i++) {
        char desc[96];
        snprintf(desc, sizeof desc, "split-KV: 8 decode rows, H %d", heads4[i]);
        c = base_case(desc);
        c.batch = 8;
        c.qo_lens = qo4;
        c.kv_lens = kv4;
        c.heads = heads4[i];
        c.page_size = 32;
        c.expect_split = 1;
        c.dtype = i % 2 ? CINFER__DT_F16 : CINFER__DT_BF16;
        run_case(&c, cinfer_test_seed() + 303 + i);
    }
}

/* CUDA graphs: one capture, then plans of other batch sizes and lengths (split and not)
 * replayed through the captured launches. */
static void graph_replays(int heads, uint64_t seed) {
    const int max_batch = 8;
    const int64_t max_total = 8, rows_cap = max_total + Q_FRONT + Q_BACK, pages_cap = 400;
    static const int qo_a[] = {1, 1, 1, 1, 1, 1, 1, 1}, kv_a[] = {300, 20, 0, 900, 5, 64, 1, 700};
    char name[64];
    snprintf(name, sizeof name, "graph capture, H %d", heads);
    mla_case c = base_case(name);
    c.batch = max_batch;
    c.qo_lens = qo_a;
    c.kv_lens = kv_a;
    c.heads = heads;
    cinfer_test_rng rng;
    cinfer_test_rng_init(&rng, seed);
    mla_data x;
    make_data(&c, &rng, &x, rows_cap, pages_cap);
    alloc_device(&x);
    upload(&x);
    mla_tensors t;
    make_tensors(&c, &x, &t);
    cinfer_batch_mla_t *op = make_op(&c, &x, max_batch, max_total, 1);
    CINFER_TEST_OK(cinfer_batch_mla_plan(op, x.qo_indptr, x.kv_indptr, x.last, c.batch, stream));
    CUgraph graph;
    CUgraphExec exec;
    assert_int_equal(cu->cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
                     CUDA_SUCCESS);
    const cinfer_status_t st = run_op(op, &c, &t);
    assert_int_equal(cu->cuStreamEndCapture(stream, &graph), CUDA_SUCCESS);
    CINFER_TEST_OK(st);
    assert_int_equal(cu->cuGraphInstantiate(&exec, graph, 0), CUDA_SUCCESS);
    assert_int_equal(cu->cuGraphLaunch(exec, stream), CUDA_SUCCESS);
    CINFER_TEST_SYNC(stream);
    check_outputs(&c, &x, seed);
    static const int qo_b[] = {1}, kv_b[] = {20000};
    static const int qo_c[] = {1, 1, 1}, kv_c[] = {3000, 0, 4000};
    const struct {
        int batch;
        const int *qo, *kv;
    } steps[] = {{1, qo_b, kv_b}, {3, qo_c, kv_c}, {8, qo_a, kv_a}, {0, qo_a, kv_a}};
    for (int s = 0; s < 4; s++) {
        char desc[64];
        snprintf(desc, sizeof desc, "graph replay %d (batch %d, H %d)", s, steps[s].batch, heads);
        mla_case r = c;
        r.desc = desc;
        r.batch = steps[s].batch;
        r.qo_lens = steps[s].qo;
        r.kv_lens = steps[s].kv;
        cinfer_test_rng_init(&rng, seed + 10 + (uint64_t)s);
        mla_data y;
        make_data(&r, &rng, &y, rows_cap, pages_cap);
        y.d_qn = x.d_qn, y.d_qp = x.d_qp, y.d_ckv = x.d_ckv, y.d_kpe = x.d_kpe;
        y.d_out = x.d_out, y.d_lse = x.d_lse, y.d_indices = x.d_indices;
        upload(&y);
        CINFER_TEST_OK(
            cinfer_batch_mla_plan(op, y.qo_indptr, y.kv_indptr, y.last, r.batch, stream));
        assert_int_equal(cu->cuGraphLaunch(exec, stream), CUDA_SUCCESS);
        CINFER_TEST_SYNC(stream);
        check_outputs(&r, &y, seed + 10 + (uint64_t)s);
        free_host(&y);
    }
    cu->cuGraphExecDestroy(exec);
    cu->cuGraphDestroy(graph);
    cinfer_batch_mla_destroy(op);
    free_data(&x);
}

/* CUDA graphs at H 16 (mma.sync kernel) and H 64 (the warpgroup kernel on sm_90a). */
static void cuda_graph_replays(void **state) {
    (void)state;
    graph_replays(16, cinfer_test_seed() + 400);
    graph_replays(64, cinfer_test_seed() + 420);
}

/* H a multiple of 64: on sm_90a the warpgroup kernel (64 heads of a token per CTA), checked to be
 * the one loaded, then the same cases on the mma.sync kernel (16 heads per CTA), which other
 * devices run. Decode rows, prefill chunks causal and not, a split row. */
static void wide_heads(void **state) {
    (void)state;
    static const int qo_p[] = {7, 1, 12}, kv_p[] = {300, 64, 11};
    static const int qo_s[] = {1, 2}, kv_s[] = {9000, 4000};
    /* around the warpgroup kernel's tiles (32 positions) and steps (two tiles) */
    static const int kv_t[] = {0, 1, 31, 32, 33, 64, 65, 97};
    for (int narrow = 0; narrow < 2; narrow++) {
        cinfer__mla_test_no_sm90(narrow);
        for (int i = 0; i < 7; i++) {
            char desc[128];
            mla_case c = base_case("");
            c.heads = i % 2 ? 64 : 128;
            c.dtype = i % 2 ? CINFER__DT_F16 : CINFER__DT_BF16;
            if (i < 2) { /* decode rows */
                c.batch = 6;
                c.max_kv = 900;
                c.page_size = i ? 1 : 64;
            } else if (i < 4) { /* prefill chunks; one token with qo_len > kv_len */
                c.batch = 3;
                c.qo_lens = qo_p;
                c.kv_lens = kv_p;
                c.causal = i == 2;
                c.page_size = 13;
            } else if (i < 5) { /* split rows */
                c.batch = 2;
                c.qo_lens = qo_s;
                c.kv_lens = kv_s;
                c.causal = 1;
                c.expect_split = 1;
            } else if (i < 6) { /* decode rows of lengths around a tile and a step */
                c.batch = 8;
                c.kv_lens = kv_t;
                c.page_size = 16;
            } else { /* peaked logits: row maxima that keep growing past the lazy slack */
                c.batch = 6;
                c.max_kv = 900;
                c.q_amp = 16.0;
            }
            snprintf(desc, sizeof desc, "H %d, case %d, %s kernel", c.heads, i,
                     narrow ? "mma.sync" : "default");
            c.desc = desc;
            run_case(&c, cinfer_test_seed() + 500 + (uint64_t)(10 * narrow + i));
        }
        cinfer_mla_options_t o = CINFER_MLA_OPTIONS_INIT;
        o.num_heads = 128;
        o.sm_scale = 0.1f;
        o.q_dtype = o.kv_dtype = (DLDataType){kDLBfloat, 16, 1};
        cinfer__spec_t attention, merge;
        CINFER_TEST_OK(cinfer__batch_mla_specs(&o, 1, ctx->arch, &attention, &merge));
        const int want = !narrow && strcmp(ctx->arch, "sm_90a") == 0 ? 64 : 16;
        assert_int_equal(attention.tile_q, want);
    }
    cinfer__mla_test_no_sm90(false);
}

static void bad_arguments_are_errors(void **state) {
    (void)state;
#define EXPECT(status, what, call)                                                                 \
    do {                                                                                           \
        assert_int_equal((call), (status));                                                        \
        if (!strstr(cinfer_last_error(), (what)))                                                  \
            fail_msg("message \"%s\" does not name \"%s\"", cinfer_last_error(), (what));          \
    } while (0)
    mla_case c = base_case("errors");
    size_t bytes = 0;
    cinfer_mla_options_t o = options_for(&c, 4, 0);
    o.num_heads = 12;
    EXPECT(CINFER_STATUS_UNSUPPORTED, "num_heads = 12",
           cinfer_batch_mla_workspace_size(ctx, &o, 1, 64, &bytes));
    o = options_for(&c, 4, 0);
    o.head_dim_ckv = 256;
    EXPECT(CINFER_STATUS_UNSUPPORTED, "head_dim_ckv = 256",
           cinfer_batch_mla_workspace_size(ctx, &o, 1, 64, &bytes));
    o = options_for(&c, 4, 0);
    o.kv_dtype = cinfer_test_dl_dtype(CINFER__DT_E4M3);
    EXPECT(CINFER_STATUS_UNSUPPORTED, "kv_dtype",
           cinfer_batch_mla_workspace_size(ctx, &o, 1, 64, &bytes));
    o = options_for(&c, 4, 0);
    o.sm_scale = 0.0f;
    EXPECT(CINFER_STATUS_INVALID_ARGUMENT, "sm_scale",
           cinfer_batch_mla_workspace_size(ctx, &o, 1, 64, &bytes));
    o.sm_scale = 3.0e38f; /* finite, but not times log2(e) in float32 */
    EXPECT(CINFER_STATUS_INVALID_ARGUMENT, "sm_scale = 3e+38",
           cinfer_batch_mla_workspace_size(ctx, &o, 1, 64, &bytes));
    o = options_for(&c, 4, 0);
    o.page_size = 0;
    EXPECT(CINFER_STATUS_INVALID_ARGUMENT, "page_size",
           cinfer_batch_mla_workspace_size(ctx, &o, 1, 64, &bytes));
    o = options_for(&c, 4, 0);
    EXPECT(CINFER_STATUS_INVALID_ARGUMENT, "causal",
           cinfer_batch_mla_workspace_size(ctx, &o, 2, 64, &bytes));
    assert_int_equal(bytes, 0);

    cinfer_test_rng rng;
    cinfer_test_rng_init(&rng, cinfer_test_seed() + 500);
    mla_data x;
    make_data(&c, &rng, &x, 0, 0);
    alloc_device(&x);
    upload(&x);
    mla_tensors t;
    make_tensors(&c, &x, &t);
    cinfer_batch_mla_t *op = make_op(&c, &x, c.batch, 64, 0);
    EXPECT(CINFER_STATUS_INVALID_ARGUMENT, "no plan", run_op(op, &c, &t));
    EXPECT(CINFER_STATUS_INVALID_ARGUMENT, "batch_size",
           cinfer_batch_mla_plan(op, x.qo_indptr, x.kv_indptr, x.last, c.batch + 1, stream));
    EXPECT(CINFER_STATUS_INVALID_ARGUMENT, "kv_last_page_len is NULL",
           cinfer_batch_mla_plan(op, x.qo_indptr, x.kv_indptr, NULL, c.batch, stream));
    CINFER_TEST_OK(cinfer_batch_mla_plan(op, x.qo_indptr, x.kv_indptr, x.last, c.batch, stream));
    t.qp.shape[2] = 32;
    EXPECT(CINFER_STATUS_PLAN_MISMATCH, "q_pe", run_op(op, &c, &t));
    t.qp.shape[2] = KPE;
    t.out.shape[1] = c.heads + 1;
    EXPECT(CINFER_STATUS_PLAN_MISMATCH, "out", run_op(op, &c, &t));
    t.out.shape[1] = c.heads;
    t.kpe.shape[0] = x.pages - 1;
    EXPECT(CINFER_STATUS_PLAN_MISMATCH, "kpe_cache", run_op(op, &c, &t));
    t.kpe.shape[0] = x.pages;
    t.qn.shape[0] = x.qo_indptr[c.batch] - 1;
    t.qp.shape[0] = t.out.shape[0] = t.lse.shape[0] = t.qn.shape[0];
    EXPECT(CINFER_STATUS_PLAN_MISMATCH, "qo_indptr[batch_size]", run_op(op, &c, &t));
    t.qn.shape[0] = t.qp.shape[0] = t.out.shape[0] = t.lse.shape[0] = x.rows;
    t.indices.shape[0] = x.kv_indptr[c.batch] - 1;
    EXPECT(CINFER_STATUS_PLAN_MISMATCH, "kv_indices", run_op(op, &c, &t));
    t.indices.shape[0] = x.num_indices;
    t.ckv.t.dtype = cinfer_test_dl_dtype(CINFER__DT_F16);
    EXPECT(CINFER_STATUS_INVALID_ARGUMENT, "ckv_cache", run_op(op, &c, &t));
    t.ckv.t.dtype = cinfer_test_dl_dtype(c.dtype);
    t.qn.t.byte_offset += 8;
    EXPECT(CINFER_STATUS_UNSUPPORTED, "q_nope", run_op(op, &c, &t));
    t.qn.t.byte_offset -= 8;
    CINFER_TEST_SYNC(stream);
    CINFER_TEST_OK(cinfer_test_buf_check_poisoned(&x.d_out, x.out_bytes));
    CINFER_TEST_OK(run_op(op, &c, &t));
    CINFER_TEST_SYNC(stream);
    check_outputs(&c, &x, cinfer_test_seed() + 500);
    cinfer_batch_mla_destroy(op);
    free_data(&x);
#undef EXPECT
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
        cmocka_unit_test_teardown(decode_batches, cinfer_test_teardown_buffers),
        cmocka_unit_test_teardown(prefill_chunks, cinfer_test_teardown_buffers),
        cmocka_unit_test_teardown(split_kv, cinfer_test_teardown_buffers),
        cmocka_unit_test_teardown(cuda_graph_replays, cinfer_test_teardown_buffers),
        cmocka_unit_test_teardown(wide_heads, cinfer_test_teardown_buffers),
        cmocka_unit_test_teardown(bad_arguments_are_errors, cinfer_test_teardown_buffers),
    };
    rc = cinfer_test_run_suite("gpu_test_mla", tests, sizeof tests / sizeof tests[0]);
    cinfer_test_stream_destroy(stream);
    cinfer_test_gpu_teardown(ctx);
    return rc;
}
