/*
 * The public entry points' argument checks without a GPU: the library runs against the stand-in
 * driver of tests/fake_driver (CINFER_CUDA_PATH, set by tests/CMakeLists.txt), whose kernel
 * launches only count. Each bad call must return its status with a message naming the argument
 * and the value, and launch nothing; a good call of the same shape launches, so the count can
 * tell. The inputs are the ones a fuzzing pass found crashing or reaching a kernel
 * (bench/RESULTS.md, developers' session 37): negative sizes, NULL shape arrays, sizes past 2^48
 * elements, a 0-d tensor without data, short built-in variant tensors, overlapping outputs, and
 * scales whose float32 products overflow.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cinfer.h"
#include "support/gpu.h"

static cinfer_context_t *ctx;
static long (*launches)(void);
static char pool[1 << 20] __attribute__((aligned(256))); /* "device" memory: the fake's is host */

static DLTensor tensor(void *data, int ndim, int64_t *shape, DLDataTypeCode code, uint8_t bits) {
    return cinfer_test_dl_view(data, ndim, shape, code, bits);
}

/* A bad call: status `want`, a message holding `part`, and no kernel launched. */
#define EXPECT_REFUSED(want, part, call)                                                           \
    do {                                                                                           \
        const long before_ = launches();                                                           \
        const cinfer_status_t st_ = (call);                                                        \
        if (st_ != (want) || !strstr(cinfer_last_error(), (part)))                                 \
            fail_msg("%s: %s \"%s\", expected %s with \"%s\"", #call, cinfer_status_name(st_),     \
                     cinfer_last_error(), cinfer_status_name(want), (part));                       \
        if (launches() != before_)                                                                 \
            fail_msg("%s: refused, yet launched %ld kernels", #call, launches() - before_);        \
    } while (0)

/* A good call: SUCCESS and at least one kernel launched. */
#define EXPECT_RUNS(call)                                                                          \
    do {                                                                                           \
        const long before_ = launches();                                                           \
        const cinfer_status_t st_ = (call);                                                        \
        if (st_ != CINFER_STATUS_SUCCESS)                                                          \
            fail_msg("%s: %s \"%s\", expected SUCCESS", #call, cinfer_status_name(st_),            \
                     cinfer_last_error());                                                         \
        if (launches() == before_)                                                                 \
            fail_msg("%s: SUCCESS without a launch", #call);                                       \
    } while (0)

/* A call refused for an output that overlaps another tensor: INVALID_ARGUMENT with a message
 * that starts with the output's name and names the other one. */
#define EXPECT_OVERLAP(out, other, call)                                                           \
    do {                                                                                           \
        const long before_ = launches();                                                           \
        const cinfer_status_t st_ = (call);                                                        \
        const char *msg_ = cinfer_last_error();                                                    \
        if (st_ != CINFER_STATUS_INVALID_ARGUMENT ||                                               \
            strncmp(msg_, out ": [0x", strlen(out) + 5) ||                                         \
            !strstr(msg_, ") overlaps " other " [0x"))                                             \
            fail_msg("%s: %s \"%s\", expected INVALID_ARGUMENT: %s overlapping %s", #call,         \
                     cinfer_status_name(st_), msg_, out, other);                                   \
        if (launches() != before_)                                                                 \
            fail_msg("%s: refused, yet launched %ld kernels", #call, launches() - before_);        \
    } while (0)

static int setup(void **state) {
    (void)state;
    const char *fake = getenv("CINFER_CUDA_PATH");
    void *lib = fake ? dlopen(fake, RTLD_NOW | RTLD_LOCAL) : NULL;
    if (!lib || !(*(void **)&launches = dlsym(lib, "cinfer_fake_cuda_launches"))) {
        fprintf(stderr,
                "test_api_errors: CINFER_CUDA_PATH must name tests/fake_driver's library\n");
        return -1;
    }
    if (cinfer_context_create(NULL, &ctx) != CINFER_STATUS_SUCCESS) {
        fprintf(stderr, "test_api_errors: no context on the fake driver: %s\n",
                cinfer_last_error());
        return -1;
    }
    return 0;
}

static int teardown(void **state) {
    (void)state;
    cinfer_context_destroy(ctx);
    return 0;
}

static void merge_state_shapes(void **state) {
    (void)state;
    int64_t vs[3] = {4, 8, 64}, ls[2] = {4, 8};
    DLTensor v = tensor(pool, 3, vs, kDLFloat, 16), l = tensor(pool + 65536, 2, ls, kDLFloat, 32);
    DLTensor vo = tensor(pool + 131072, 3, vs, kDLFloat, 16);
    DLTensor lo = tensor(pool + 196608, 2, ls, kDLFloat, 32);
    const long before = launches();
    assert_int_equal(cinfer_merge_state(ctx, &v, &l, &v, &l, &vo, &lo, NULL),
                     CINFER_STATUS_SUCCESS);
    assert_int_equal(launches(), before + 1); /* the count sees a launch */

    int64_t negative[3] = {-4, 8, 64};
    DLTensor bad = tensor(pool, 3, negative, kDLFloat, 16);
    EXPECT_REFUSED(CINFER_STATUS_INVALID_ARGUMENT, "v_a: shape[0] = -4",
                   cinfer_merge_state(ctx, &bad, &l, &v, &l, &vo, &lo, NULL));
    bad = v;
    bad.shape = NULL;
    EXPECT_REFUSED(CINFER_STATUS_INVALID_ARGUMENT, "v_b: shape is NULL",
                   cinfer_merge_state(ctx, &v, &l, &bad, &l, &vo, &lo, NULL));
    /* A dtype or shape mismatch names both tensors: here v_a is the odd one, and the message on
     * v_b says what it was compared with. */
    bad = v;
    bad.dtype.code = kDLBfloat;
    EXPECT_REFUSED(CINFER_STATUS_INVALID_ARGUMENT,
                   "v_b: dtype f16 (code 2, 16 bits, 1 lanes) "
                   "differs from v_a's bf16",
                   cinfer_merge_state(ctx, &bad, &l, &v, &l, &vo, &lo, NULL));
    int64_t wide[3] = {4, 8, 128};
    bad = tensor(pool + 262144, 3, wide, kDLFloat, 16);
    EXPECT_REFUSED(CINFER_STATUS_INVALID_ARGUMENT,
                   "v_other: shape [4, 8, 128], expected [4, 8, 64] (v's shape)",
                   cinfer_merge_state_in_place(ctx, &v, &l, &bad, &l, NULL, NULL));

    /* merge_states: 2^34 x 2^30 states, whose element count once wrapped to 0, with NULL data. */
    int64_t huge[4] = {INT64_C(1) << 34, INT64_C(1) << 30, 1, 1}, huge_l[3] = {huge[0], huge[1], 1};
    int64_t out[3] = {huge[0], 1, 1}, out_l[2] = {huge[0], 1};
    DLTensor hv = tensor(NULL, 4, huge, kDLFloat, 16), hl = tensor(NULL, 3, huge_l, kDLFloat, 32);
    DLTensor ov = tensor(pool, 3, out, kDLFloat, 16), ol = tensor(pool, 2, out_l, kDLFloat, 32);
    EXPECT_REFUSED(CINFER_STATUS_INVALID_ARGUMENT, "more than 2^48 elements",
                   cinfer_merge_states(ctx, &hv, &hl, &ov, &ol, NULL));
}

static void packbits_shapes(void **state) {
    (void)state;
    int64_t n[1] = {-5}, one[1] = {1}, most[1] = {INT64_MAX};
    DLTensor x = tensor(pool, 1, n, kDLUInt, 8), y = tensor(pool + 4096, 1, one, kDLUInt, 8);
    EXPECT_REFUSED(CINFER_STATUS_INVALID_ARGUMENT, "x: shape[0] = -5",
                   cinfer_packbits(ctx, &x, CINFER_BITORDER_LITTLE, &y, NULL));
    /* DLPack's bool is accepted as u8, and the messages say so */
    x.shape = one;
    x.dtype.code = kDLInt;
    EXPECT_REFUSED(CINFER_STATUS_INVALID_ARGUMENT, "expected u8 (uint8 or bool)",
                   cinfer_packbits(ctx, &x, CINFER_BITORDER_LITTLE, &y, NULL));
    x.dtype.code = kDLUInt;
    x.shape = most; /* (n + 7) / 8 once overflowed into "any size" for y */
    EXPECT_REFUSED(CINFER_STATUS_INVALID_ARGUMENT,
                   "x: shape [9223372036854775807] has more than 2^48",
                   cinfer_packbits(ctx, &x, CINFER_BITORDER_LITTLE, &y, NULL));

    /* segment_packbits: indptr_new one entry into indptr. */
    int64_t xs[1] = {16}, is[1] = {3}, ys[1] = {4};
    int32_t *indptr = (int32_t *)(pool + 8192);
    indptr[0] = 0, indptr[1] = 8, indptr[2] = 16;
    DLTensor bits = tensor(pool, 1, xs, kDLUInt, 8),
             packed = tensor(pool + 4096, 1, ys, kDLUInt, 8);
    DLTensor in = tensor(indptr, 1, is, kDLInt, 32), out = in;
    out.byte_offset = sizeof(int32_t);
    EXPECT_REFUSED(
        CINFER_STATUS_INVALID_ARGUMENT, "indptr_new",
        cinfer_segment_packbits(ctx, &bits, &in, CINFER_BITORDER_LITTLE, &packed, &out, NULL));
}

static void append_error_flag_without_data(void **state) {
    (void)state;
    const cinfer_append_options_t o = CINFER_APPEND_OPTIONS_INIT;
    int64_t ak[3] = {2, 1, 64}, idx[1] = {2}, cache[4] = {4, 16, 1, 64}, pages[1] = {1},
            ptr[2] = {2}, last[1] = {1};
    DLTensor k = tensor(pool, 3, ak, kDLFloat, 16), b = tensor(pool + 4096, 1, idx, kDLInt, 32);
    DLTensor pos = tensor(pool + 8192, 1, idx, kDLInt, 32);
    DLTensor kc = tensor(pool + 65536, 4, cache, kDLFloat, 16);
    DLTensor vc = tensor(pool + 131072, 4, cache, kDLFloat, 16);
    DLTensor ind = tensor(pool + 12288, 1, pages, kDLInt, 32);
    DLTensor iptr = tensor(pool + 16384, 1, ptr, kDLInt, 32);
    DLTensor lastp = tensor(pool + 20480, 1, last, kDLInt, 32);
    DLTensor flag = tensor(NULL, 0, NULL, kDLInt, 32); /* 0-d: one element, so data is needed */
    flag.byte_offset = 64;
    EXPECT_REFUSED(CINFER_STATUS_INVALID_ARGUMENT, "error_flag: data is NULL",
                   cinfer_append_paged_kv_cache(ctx, &o, &k, &k, &b, &pos, &kc, &vc, &ind, &iptr,
                                                &lastp, &flag, NULL));
}

static cinfer_attention_options_t llama_options(void) {
    cinfer_attention_options_t o = CINFER_ATTENTION_OPTIONS_INIT;
    o.num_qo_heads = 32;
    o.num_kv_heads = 8;
    o.head_dim = 128;
    o.page_size = 16;
    o.max_batch_size = 4;
    o.q_dtype = o.kv_dtype = (DLDataType){kDLBfloat, 16, 1};
    return o;
}

/*
 * Two requests of one page each (5 and 16 tokens) at llama_options(): the op, created and planned,
 * and its run's arguments: q and out in `pool`, the two pages of K then V in `kv`, the page table's
 * device copy at pool + 65536 (kv_indptr [3], kv_indices [2] from int 4, kv_last_page_len [2] from
 * int 8), lse at pool + 98304. The tensors point at the struct's shape arrays (a test may change
 * them in place), so the struct stays where two_requests_init filled it.
 */
typedef struct two_requests {
    cinfer_batch_decode_t *op;
    void *workspace;
    char *kv;
    int64_t q_shape[3], cache_shape[4], indptr_shape[1], pages_shape[1], lse_shape[2];
    DLTensor q, k, v, indptr, indices, last_len, out, lse;
} two_requests_t;

static void two_requests_init(two_requests_t *r) {
    const cinfer_attention_options_t o = llama_options();
    size_t bytes = 0;
    assert_int_equal(cinfer_batch_decode_workspace_size(ctx, &o, &bytes), CINFER_STATUS_SUCCESS);
    r->workspace = aligned_alloc(256, (bytes + 255) / 256 * 256);
    assert_non_null(r->workspace);
    r->op = NULL;
    assert_int_equal(cinfer_batch_decode_create(ctx, &o, r->workspace, bytes, &r->op),
                     CINFER_STATUS_SUCCESS);
    const int32_t indptr[3] = {0, 1, 2}, last_len[2] = {5, 16};
    assert_int_equal(cinfer_batch_decode_plan(r->op, indptr, last_len, 2, NULL),
                     CINFER_STATUS_SUCCESS);
    int32_t *dev = (int32_t *)(pool + 65536);
    memcpy(dev, indptr, sizeof indptr);
    dev[4] = 0, dev[5] = 1, dev[8] = 5, dev[9] = 16;
    const size_t cache_bytes = (size_t)2 * 16 * 8 * 128 * 2;
    r->kv = malloc(2 * cache_bytes);
    assert_non_null(r->kv);
    const int64_t q_shape[3] = {2, 32, 128}, cache_shape[4] = {2, 16, 8, 128},
                  lse_shape[2] = {2, 32};
    memcpy(r->q_shape, q_shape, sizeof q_shape);
    memcpy(r->cache_shape, cache_shape, sizeof cache_shape);
    memcpy(r->lse_shape, lse_shape, sizeof lse_shape);
    r->indptr_shape[0] = 3;
    r->pages_shape[0] = 2;
    r->q = tensor(pool, 3, r->q_shape, kDLBfloat, 16);
    r->k = tensor(r->kv, 4, r->cache_shape, kDLBfloat, 16);
    r->v = tensor(r->kv + cache_bytes, 4, r->cache_shape, kDLBfloat, 16);
    r->indptr = tensor(dev, 1, r->indptr_shape, kDLInt, 32);
    r->indices = tensor(dev + 4, 1, r->pages_shape, kDLInt, 32);
    r->last_len = tensor(dev + 8, 1, r->pages_shape, kDLInt, 32);
    r->out = tensor(pool + 32768, 3, r->q_shape, kDLBfloat, 16);
    r->lse = tensor(pool + 98304, 2, r->lse_shape, kDLFloat, 32);
}

static cinfer_status_t two_requests_run(two_requests_t *r) {
    return cinfer_batch_decode_run(r->op, &r->q, &r->k, &r->v, &r->indptr, &r->indices,
                                   &r->last_len, &r->out, &r->lse, NULL, NULL);
}

static void two_requests_free(two_requests_t *r) {
    cinfer_batch_decode_destroy(r->op);
    free(r->workspace);
    free(r->kv);
}

static void batch_decode_run_shapes(void **state) {
    (void)state;
    cinfer_attention_options_t o = llama_options();
    o.sm_scale = 3.4e38f;
    o.k_scale = 3.4e38f;
    size_t bytes = 0;
    EXPECT_REFUSED(CINFER_STATUS_INVALID_ARGUMENT, "options->sm_scale x k_scale",
                   cinfer_batch_decode_workspace_size(ctx, &o, &bytes));

    two_requests_t r;
    two_requests_init(&r);
    const long before = launches();
    assert_int_equal(two_requests_run(&r), CINFER_STATUS_SUCCESS);
    assert_true(launches() > before);

    r.q_shape[0] = 3; /* a batch the plan does not have: a plan mismatch */
    EXPECT_REFUSED(CINFER_STATUS_PLAN_MISMATCH, "q: shape [3, 32, 128], expected [2, 32, 128]",
                   two_requests_run(&r));
    r.q_shape[0] = -4; /* a negative size: INVALID_ARGUMENT showing it, not a plan mismatch */
    EXPECT_REFUSED(CINFER_STATUS_INVALID_ARGUMENT, "q: shape[0] = -4", two_requests_run(&r));
    r.q_shape[0] = 2;
    r.k.shape = NULL;
    EXPECT_REFUSED(CINFER_STATUS_INVALID_ARGUMENT, "k_cache: shape is NULL", two_requests_run(&r));
    r.k.shape = r.cache_shape;
    int64_t far[4] = {INT64_C(1) << 62, 16 * 8 * 128, 128, 1}; /* a page stride past 2^48 */
    r.k.strides = far;
    EXPECT_REFUSED(CINFER_STATUS_INVALID_ARGUMENT, "k_cache: strides[0]", two_requests_run(&r));
    r.k.strides = NULL;
    int64_t overlapping[2] = {2, 1}; /* lse rows 2 elements apart: row 1 is row 0 moved by 2 */
    r.lse.strides = overlapping;
    EXPECT_REFUSED(CINFER_STATUS_INVALID_ARGUMENT, "lse: strides[0] = 2 lands inside",
                   two_requests_run(&r));
    two_requests_free(&r);
}

static void builtin_variant_sizes(void **state) {
    (void)state;
    cinfer_attention_options_t o = llama_options();
    o.variant = cinfer_variant_builtin("sinks");
    int64_t qs[3] = {16, 32, 128}, ks[3] = {16, 8, 128}, one[1] = {1};
    DLTensor q = tensor(pool, 3, qs, kDLBfloat, 16),
             k = tensor(pool + 131072, 3, ks, kDLBfloat, 16);
    DLTensor out = tensor(pool + 262144, 3, qs, kDLBfloat, 16);
    DLTensor sinks = tensor(pool + 524288, 1, one, kDLFloat, 32); /* [1], 32 heads read */
    const cinfer_arg_t arg = CINFER_ARG_TENSOR(&sinks);
    const cinfer_args_t args = {1, &arg};
    EXPECT_REFUSED(CINFER_STATUS_INVALID_ARGUMENT,
                   "(tensor sinks) of variant sinks: shape [1], expected 1-d with at least 32",
                   cinfer_single_prefill(ctx, &o, 1, &q, &k, &k, &out, NULL, &args, NULL));
    /* ... and [32] inside out, which the call writes while it reads them */
    int64_t heads[1] = {32};
    sinks = tensor(pool + 262144 + 4096, 1, heads, kDLFloat, 32);
    EXPECT_OVERLAP("out", "sinks (argument 0 of variant sinks)",
                   cinfer_single_prefill(ctx, &o, 1, &q, &k, &k, &out, NULL, &args, NULL));
}

/* A ragged batch prefill object of options o over a host workspace (*workspace, free() it after
 * destroying the object), planned for one request of 16 query rows over 16 keys. */
static cinfer_batch_prefill_t *planned_ragged_prefill(const cinfer_attention_options_t *o,
                                                      void **workspace) {
    size_t bytes = 0;
    assert_int_equal(
        cinfer_batch_prefill_workspace_size(ctx, o, CINFER_KV_STORAGE_RAGGED, 1, 64, &bytes),
        CINFER_STATUS_SUCCESS);
    *workspace = aligned_alloc(256, (bytes + 255) / 256 * 256);
    assert_non_null(*workspace);
    cinfer_batch_prefill_t *op = NULL;
    assert_int_equal(cinfer_batch_prefill_create(ctx, o, CINFER_KV_STORAGE_RAGGED, 1, 64,
                                                 *workspace, bytes, &op),
                     CINFER_STATUS_SUCCESS);
    const int32_t qo_indptr[2] = {0, 16}, kv_indptr[2] = {0, 16};
    assert_int_equal(cinfer_batch_prefill_plan(op, qo_indptr, kv_indptr, NULL, 1, NULL),
                     CINFER_STATUS_SUCCESS);
    return op;
}

static void batch_prefill_run_shapes(void **state) {
    (void)state;
    cinfer_attention_options_t o = llama_options();
    void *workspace = NULL;
    cinfer_batch_prefill_t *op = planned_ragged_prefill(&o, &workspace);
    int64_t qs[3] = {16, 32, 128}, ks[3] = {16, 8, 128};
    DLTensor q = tensor(pool, 3, qs, kDLBfloat, 16),
             k = tensor(pool + 131072, 3, ks, kDLBfloat, 16);
    DLTensor out = tensor(pool + 262144, 3, qs, kDLBfloat, 16);
    const long before = launches();
    assert_int_equal(cinfer_batch_prefill_run(op, &q, &k, &k, NULL, &out, NULL, NULL, NULL),
                     CINFER_STATUS_SUCCESS);
    assert_true(launches() > before);

    ks[1] = 4; /* KV heads other than the options': a plan mismatch */
    EXPECT_REFUSED(CINFER_STATUS_PLAN_MISMATCH, "k: shape [16, 4, 128], expected [*, 8, 128]",
                   cinfer_batch_prefill_run(op, &q, &k, &k, NULL, &out, NULL, NULL, NULL));
    ks[1] = 8;
    q.shape = NULL;
    EXPECT_REFUSED(CINFER_STATUS_INVALID_ARGUMENT, "q: shape is NULL",
                   cinfer_batch_prefill_run(op, &q, &k, &k, NULL, &out, NULL, NULL, NULL));
    q.shape = qs;
    ks[0] = -16;
    EXPECT_REFUSED(CINFER_STATUS_INVALID_ARGUMENT, "k: shape[0] = -16",
                   cinfer_batch_prefill_run(op, &q, &k, &k, NULL, &out, NULL, NULL, NULL));
    ks[0] = 16;
    int64_t far[3] = {INT64_C(1) << 50, 128, 1}; /* row stride x rows past 2^48 elements */
    k.strides = far;
    EXPECT_REFUSED(CINFER_STATUS_INVALID_ARGUMENT, "k: strides[0]",
                   cinfer_batch_prefill_run(op, &q, &k, &k, NULL, &out, NULL, NULL, NULL));
    cinfer_batch_prefill_destroy(op);
    free(workspace);
}

static void mla_and_rope_limits(void **state) {
    (void)state;
    cinfer_mla_options_t m = CINFER_MLA_OPTIONS_INIT;
    m.num_heads = 16;
    m.sm_scale = 3.0e38f; /* finite, but not times log2(e) in float32 */
    size_t bytes = 0;
    EXPECT_REFUSED(CINFER_STATUS_INVALID_ARGUMENT, "options->sm_scale = 3e+38",
                   cinfer_batch_mla_workspace_size(ctx, &m, 1, 64, &bytes));

    /* q's head count, once added to k's, wrapped to a negative head count for the kernel. */
    const cinfer_rope_options_t r = CINFER_ROPE_OPTIONS_INIT;
    int64_t qs[3] = {1, INT64_MAX, 8}, ks[3] = {1, 2, 8}, ps[1] = {1};
    DLTensor q = tensor(pool, 3, qs, kDLFloat, 16), k = tensor(pool + 4096, 3, ks, kDLFloat, 16);
    DLTensor qo = tensor(pool + 8192, 3, qs, kDLFloat, 16);
    DLTensor ko = tensor(pool + 12288, 3, ks, kDLFloat, 16);
    DLTensor pos = tensor(pool + 16384, 1, ps, kDLInt, 32);
    EXPECT_REFUSED(CINFER_STATUS_INVALID_ARGUMENT,
                   "q: shape [1, 9223372036854775807, 8] has more than 2^48",
                   cinfer_apply_rope_pos_ids(ctx, &r, &q, &k, &qo, &ko, &pos, NULL));
}

/* ---- outputs that overlap inputs or each other ---- */

/* A view of `pool` at byte `at` with explicit strides (NULL: compact). */
static DLTensor view(size_t at, int ndim, int64_t *shape, int64_t *strides, DLDataTypeCode code,
                     uint8_t bits) {
    DLTensor t = tensor(pool + at, ndim, shape, code, bits);
    t.strides = strides;
    return t;
}

static void merge_outputs_may_only_be_inputs_exactly(void **state) {
    (void)state;
    int64_t vs[3] = {4, 8, 64}, ls[2] = {4, 8}, permuted[3] = {64, 256, 1};
    DLTensor va = view(0x0000, 3, vs, NULL, kDLFloat, 16),
             vb = view(0x1000, 3, vs, NULL, kDLFloat, 16);
    DLTensor la = view(0x8000, 2, ls, NULL, kDLFloat, 32),
             lb = view(0x8100, 2, ls, NULL, kDLFloat, 32);
    DLTensor vo = view(0x2000, 3, vs, NULL, kDLFloat, 16),
             lo = view(0x8200, 2, ls, NULL, kDLFloat, 32);
    EXPECT_RUNS(cinfer_merge_state(ctx, &va, &la, &vb, &lb, &vo, &lo, NULL));
    /* in place over either input, exactly: documented */
    EXPECT_RUNS(cinfer_merge_state(ctx, &va, &la, &vb, &lb, &va, &la, NULL));
    EXPECT_RUNS(cinfer_merge_state(ctx, &va, &la, &vb, &lb, &vb, &lb, NULL));
    /* inputs overlap each other freely: b 64 bytes into a */
    DLTensor shifted = va;
    shifted.byte_offset = 64;
    EXPECT_RUNS(cinfer_merge_state(ctx, &va, &la, &shifted, &lb, &vo, &lo, NULL));
    /* v_out over v_a's memory with permuted strides, or 64 bytes into it */
    DLTensor bad = va;
    bad.strides = permuted;
    EXPECT_OVERLAP("v_out", "v_a", cinfer_merge_state(ctx, &va, &la, &vb, &lb, &bad, &lo, NULL));
    EXPECT_OVERLAP("v_out", "v_a",
                   cinfer_merge_state(ctx, &va, &la, &vb, &lb, &shifted, &lo, NULL));
    EXPECT_REFUSED(CINFER_STATUS_INVALID_ARGUMENT, "or to be v_a exactly",
                   cinfer_merge_state(ctx, &va, &la, &vb, &lb, &shifted, &lo, NULL));
    /* the two outputs at one address */
    DLTensor lse_on_v = lo;
    lse_on_v.data = vo.data;
    EXPECT_OVERLAP("v_out", "lse_out",
                   cinfer_merge_state(ctx, &va, &la, &vb, &lb, &vo, &lse_on_v, NULL));
    /* lse_out over v_b */
    lse_on_v.data = vb.data;
    EXPECT_OVERLAP("lse_out", "v_b",
                   cinfer_merge_state(ctx, &va, &la, &vb, &lb, &vo, &lse_on_v, NULL));

    /* merge_state_in_place: the other state may be (v, lse) exactly, nothing else may meet them */
    int64_t ms[1] = {4};
    DLTensor mask = view(0x9000, 1, ms, NULL, kDLUInt, 8);
    EXPECT_RUNS(cinfer_merge_state_in_place(ctx, &va, &la, &vb, &lb, &mask, NULL));
    EXPECT_RUNS(cinfer_merge_state_in_place(ctx, &va, &la, &va, &la, NULL, NULL));
    EXPECT_OVERLAP("v", "v_other",
                   cinfer_merge_state_in_place(ctx, &va, &la, &shifted, &lb, NULL, NULL));
    DLTensor mask_in_lse = mask;
    mask_in_lse.data = la.data;
    EXPECT_OVERLAP("lse", "mask",
                   cinfer_merge_state_in_place(ctx, &va, &la, &vb, &lb, &mask_in_lse, NULL));

    /* merge_states: v_out as v's first state, lse_out inside lse */
    int64_t s4[4] = {4, 3, 8, 64}, s3[3] = {4, 3, 8}, first[3] = {3 * 8 * 64, 64, 1};
    DLTensor v = view(0x10000, 4, s4, NULL, kDLFloat, 16),
             l = view(0x18000, 3, s3, NULL, kDLFloat, 32);
    EXPECT_RUNS(cinfer_merge_states(ctx, &v, &l, &vo, &lo, NULL));
    EXPECT_RUNS(cinfer_merge_states(ctx, &v, &l, &vo, NULL, NULL));
    DLTensor state0 = view(0x10000, 3, vs, first, kDLFloat, 16);
    EXPECT_OVERLAP("v_out", "v", cinfer_merge_states(ctx, &v, &l, &state0, &lo, NULL));
    DLTensor lse_in_l = view(0x18000 + 64, 2, ls, NULL, kDLFloat, 32);
    EXPECT_OVERLAP("lse_out", "lse", cinfer_merge_states(ctx, &v, &l, &vo, &lse_in_l, NULL));
}

static void rope_outputs_in_place_or_apart(void **state) {
    (void)state;
    const cinfer_rope_options_t o = CINFER_ROPE_OPTIONS_INIT;
    /* q, k, v of a packed [4, 4 + 2 + 2, 64] bf16 QKV tensor */
    int64_t qs[3] = {4, 4, 64}, ks[3] = {4, 2, 64}, packed[3] = {8 * 64, 64, 1}, ps[1] = {4};
    DLTensor q = view(0x30000, 3, qs, packed, kDLBfloat, 16),
             k = view(0x30000, 3, ks, packed, kDLBfloat, 16);
    k.byte_offset = 4 * 64 * 2;
    DLTensor pos = view(0x38000, 1, ps, NULL, kDLInt, 32);
    DLTensor qo = view(0x40000, 3, qs, NULL, kDLBfloat, 16),
             ko = view(0x41000, 3, ks, NULL, kDLBfloat, 16);
    EXPECT_RUNS(cinfer_apply_rope_pos_ids(ctx, &o, &q, &k, NULL, NULL, &pos, NULL));
    EXPECT_RUNS(cinfer_apply_rope_pos_ids(ctx, &o, &q, &k, &q, &k, &pos, NULL));
    EXPECT_RUNS(cinfer_apply_rope_pos_ids(ctx, &o, &q, &k, &qo, &ko, &pos, NULL));
    EXPECT_RUNS(cinfer_apply_rope_pos_ids(ctx, &o, &q, &k, &qo, NULL, &pos, NULL));
    /* q_out 256 bytes into q; q_out over k and v (q's rows moved by half a row) */
    DLTensor bad = q;
    bad.byte_offset = 256;
    EXPECT_OVERLAP("q_out", "q", cinfer_apply_rope_pos_ids(ctx, &o, &q, &k, &bad, &ko, &pos, NULL));
    bad.byte_offset = 4 * 64 * 2;
    EXPECT_OVERLAP("q_out", "k", cinfer_apply_rope_pos_ids(ctx, &o, &q, &k, &bad, &ko, &pos, NULL));
    /* the two outputs at one address; k_out over the positions */
    DLTensor ko_on_qo = ko;
    ko_on_qo.data = qo.data;
    EXPECT_OVERLAP("q_out", "k_out",
                   cinfer_apply_rope_pos_ids(ctx, &o, &q, &k, &qo, &ko_on_qo, &pos, NULL));
    DLTensor ko_on_pos = ko;
    ko_on_pos.data = pos.data;
    EXPECT_OVERLAP("k_out", "pos_ids",
                   cinfer_apply_rope_pos_ids(ctx, &o, &q, &k, &qo, &ko_on_pos, &pos, NULL));
    /* in place, with k over q's last two heads */
    DLTensor k_in_q = k;
    k_in_q.byte_offset = 2 * 64 * 2;
    EXPECT_OVERLAP("q (rotated in place)", "k (rotated in place)",
                   cinfer_apply_rope_pos_ids(ctx, &o, &q, &k_in_q, NULL, NULL, &pos, NULL));
    /* ... while as inputs of separate outputs they may overlap */
    EXPECT_RUNS(cinfer_apply_rope_pos_ids(ctx, &o, &q, &k_in_q, &qo, &ko, &pos, NULL));

    /* ragged: q_out over offsets; Llama 3.1: k_out over indptr */
    int64_t is[1] = {2}, os[1] = {1};
    DLTensor indptr = view(0x38100, 1, is, NULL, kDLInt, 32),
             offsets = view(0x40000, 1, os, NULL, kDLInt, 32);
    EXPECT_OVERLAP("q_out", "offsets",
                   cinfer_apply_rope(ctx, NULL, &q, &k, &qo, &ko, &indptr, &offsets, NULL));
    DLTensor ko_on_indptr = ko;
    ko_on_indptr.data = indptr.data;
    offsets.data = pool + 0x38200;
    EXPECT_OVERLAP(
        "k_out", "indptr",
        cinfer_apply_llama31_rope(ctx, NULL, &q, &k, &qo, &ko_on_indptr, &indptr, &offsets, NULL));
    EXPECT_OVERLAP(
        "k (rotated in place)", "pos_ids",
        cinfer_apply_llama31_rope_pos_ids(ctx, NULL, &q, &ko_on_pos, &qo, NULL, &pos, NULL));
    /* the cos/sin table: k_out over it */
    int64_t ts[2] = {16, 64};
    DLTensor table = view(0x50000, 2, ts, NULL, kDLFloat, 32), ko_on_table = ko;
    ko_on_table.data = table.data;
    EXPECT_OVERLAP("k_out", "cos_sin_cache",
                   cinfer_apply_rope_with_cos_sin_cache(ctx, &q, &k, &qo, &ko_on_table, &pos,
                                                        &table, 0, NULL));
}

static void append_and_page_table_outputs_apart(void **state) {
    (void)state;
    cinfer_append_options_t o = CINFER_APPEND_OPTIONS_INIT;
    int64_t as[3] = {2, 1, 64}, two[1] = {2}, one[1] = {1};
    DLTensor ak = view(0x60000, 3, as, NULL, kDLBfloat, 16),
             av = view(0x60100, 3, as, NULL, kDLBfloat, 16);
    DLTensor bi = view(0x61000, 1, two, NULL, kDLInt, 32),
             pos = view(0x61010, 1, two, NULL, kDLInt, 32);
    DLTensor ind = view(0x61020, 1, one, NULL, kDLInt, 32),
             iptr = view(0x61030, 1, two, NULL, kDLInt, 32);
    DLTensor last = view(0x61040, 1, one, NULL, kDLInt, 32);
    DLTensor flag = view(0x61050, 0, NULL, NULL, kDLInt, 32);
    /* a combined [4, 2, 16, 1, 64] cache, whole or as its K and V halves */
    int64_t cs5[5] = {4, 2, 16, 1, 64}, cs[4] = {4, 16, 1, 64}, half[4] = {2 * 16 * 64, 64, 64, 1};
    DLTensor kv = view(0x70000, 5, cs5, NULL, kDLBfloat, 16);
    DLTensor kc = view(0x70000, 4, cs, half, kDLBfloat, 16), vc = kc;
    vc.byte_offset = 16 * 64 * 2;
    EXPECT_RUNS(cinfer_append_paged_kv_cache(ctx, &o, &ak, &av, &bi, &pos, &kv, NULL, &ind, &iptr,
                                             &last, &flag, NULL));
    EXPECT_RUNS(cinfer_append_paged_kv_cache(ctx, &o, &ak, &av, &bi, &pos, &kc, &vc, &ind, &iptr,
                                             &last, &flag, NULL));
    /* K and V given as one (not combined) cache */
    EXPECT_OVERLAP("k_cache", "v_cache",
                   cinfer_append_paged_kv_cache(ctx, &o, &ak, &av, &bi, &pos, &kc, &kc, &ind, &iptr,
                                                &last, &flag, NULL));
    /* the flag inside the V half; the appended K rows inside the K half */
    DLTensor flag_in_v = flag;
    flag_in_v.data = pool + 0x70000 + 16 * 64 * 2;
    EXPECT_OVERLAP("v_cache", "error_flag",
                   cinfer_append_paged_kv_cache(ctx, &o, &ak, &av, &bi, &pos, &kc, &vc, &ind, &iptr,
                                                &last, &flag_in_v, NULL));
    DLTensor ak_in_k = ak;
    ak_in_k.data = kc.data;
    EXPECT_OVERLAP("k_cache", "append_k",
                   cinfer_append_paged_kv_cache(ctx, &o, &ak_in_k, &av, &bi, &pos, &kv, NULL, &ind,
                                                &iptr, &last, &flag, NULL));
    /* the page table inside the combined cache; the flag over positions */
    DLTensor ind_in_kv = ind;
    ind_in_kv.data = pool + 0x70000 + 6000;
    EXPECT_OVERLAP("k_cache", "kv_indices",
                   cinfer_append_paged_kv_cache(ctx, &o, &ak, &av, &bi, &pos, &kv, NULL, &ind_in_kv,
                                                &iptr, &last, &flag, NULL));
    DLTensor flag_on_pos = flag;
    flag_on_pos.data = pos.data;
    EXPECT_OVERLAP("error_flag", "positions",
                   cinfer_append_paged_kv_cache(ctx, &o, &ak, &av, &bi, &pos, &kv, NULL, &ind,
                                                &iptr, &last, &flag_on_pos, NULL));

    /* get_batch_indices_positions: both outputs in one tensor; positions over seq_lens */
    int64_t nnz[1] = {8};
    DLTensor append_indptr = view(0x62000, 1, two, NULL, kDLInt, 32),
             seq_lens = view(0x62010, 1, one, NULL, kDLInt, 32);
    DLTensor out_b = view(0x62100, 1, nnz, NULL, kDLInt, 32),
             out_p = view(0x62200, 1, nnz, NULL, kDLInt, 32);
    EXPECT_RUNS(
        cinfer_get_batch_indices_positions(ctx, &append_indptr, &seq_lens, &out_b, &out_p, NULL));
    EXPECT_OVERLAP(
        "batch_indices", "positions",
        cinfer_get_batch_indices_positions(ctx, &append_indptr, &seq_lens, &out_b, &out_b, NULL));
    DLTensor p_on_lens = out_p;
    p_on_lens.data = pool + 0x62000 + 12;
    EXPECT_OVERLAP("positions", "seq_lens",
                   cinfer_get_batch_indices_positions(ctx, &append_indptr, &seq_lens, &out_b,
                                                      &p_on_lens, NULL));
    /* get_seq_lens into its own kv_last_page_len */
    EXPECT_RUNS(cinfer_get_seq_lens(ctx, &iptr, &last, 16, &seq_lens, NULL));
    EXPECT_OVERLAP("seq_lens", "kv_last_page_len",
                   cinfer_get_seq_lens(ctx, &iptr, &last, 16, &last, NULL));
}

static void packbits_outputs_apart(void **state) {
    (void)state;
    int64_t n[1] = {64}, bytes[1] = {8};
    DLTensor x = view(0x63000, 1, n, NULL, kDLUInt, 8),
             y = view(0x63100, 1, bytes, NULL, kDLUInt, 8);
    EXPECT_RUNS(cinfer_packbits(ctx, &x, CINFER_BITORDER_LITTLE, &y, NULL));
    DLTensor y_on_x = view(0x63000, 1, bytes, NULL, kDLUInt, 8);
    EXPECT_OVERLAP("y", "x", cinfer_packbits(ctx, &x, CINFER_BITORDER_LITTLE, &y_on_x, NULL));

    int64_t is[1] = {3};
    int32_t *ip = (int32_t *)(pool + 0x63200);
    ip[0] = 0, ip[1] = 32, ip[2] = 64;
    DLTensor indptr = view(0x63200, 1, is, NULL, kDLInt, 32),
             indptr_new = view(0x63300, 1, is, NULL, kDLInt, 32);
    EXPECT_RUNS(
        cinfer_segment_packbits(ctx, &x, &indptr, CINFER_BITORDER_BIG, &y, &indptr_new, NULL));
    EXPECT_OVERLAP(
        "y", "x",
        cinfer_segment_packbits(ctx, &x, &indptr, CINFER_BITORDER_BIG, &y_on_x, &indptr_new, NULL));
    DLTensor new_on_y = indptr_new;
    new_on_y.data = y.data;
    EXPECT_OVERLAP(
        "indptr_new", "y",
        cinfer_segment_packbits(ctx, &x, &indptr, CINFER_BITORDER_BIG, &y, &new_on_y, NULL));
    new_on_y.data = indptr.data;
    EXPECT_OVERLAP(
        "indptr_new", "indptr",
        cinfer_segment_packbits(ctx, &x, &indptr, CINFER_BITORDER_BIG, &y, &new_on_y, NULL));
}

static void attention_outputs_apart_from_inputs(void **state) {
    (void)state;
    /* batch decode: K and V as the halves of one combined [2, 2, 16, 8, 128] cache, and as one
     * tensor (both inputs), run; out over q, lse inside out, lse over the page table do not */
    two_requests_t r;
    two_requests_init(&r);
    int64_t half[4] = {2 * 16 * 8 * 128, 8 * 128, 128, 1};
    r.k.strides = r.v.strides = half;
    r.v.data = r.kv;
    r.v.byte_offset = 16 * 8 * 128 * 2;
    EXPECT_RUNS(two_requests_run(&r));
    r.v = r.k;
    EXPECT_RUNS(two_requests_run(&r));
    r.out.data = r.q.data;
    EXPECT_OVERLAP("out", "q", two_requests_run(&r));
    r.out.data = pool + 32768;
    r.lse.data = pool + 32768 + 4096;
    EXPECT_OVERLAP("out", "lse", two_requests_run(&r));
    r.lse.data = r.indptr.data;
    EXPECT_OVERLAP("lse", "kv_indptr", two_requests_run(&r));
    r.lse.data = pool + 98304;
    r.out.data = r.kv + 96; /* 16-byte aligned rows */
    EXPECT_OVERLAP("out", "k_cache", two_requests_run(&r));
    /* the workspace (schedule and partial states) holds out, or q */
    r.out.data = r.workspace;
    EXPECT_OVERLAP("workspace", "out", two_requests_run(&r));
    r.out.data = pool + 32768;
    r.q.data = (char *)r.workspace + 256;
    EXPECT_OVERLAP("workspace", "q", two_requests_run(&r));
    two_requests_free(&r);

    /* single prefill and single decode over q, k, v of a packed [16, 32 + 8 + 8, 128] tensor:
     * out over q, lse over v */
    const cinfer_attention_options_t o = llama_options();
    int64_t qs[3] = {16, 32, 128}, ks[3] = {16, 8, 128}, packed[3] = {48 * 128, 128, 1},
            ls[2] = {16, 32};
    DLTensor q = view(0, 3, qs, packed, kDLBfloat, 16), k = view(0, 3, ks, packed, kDLBfloat, 16);
    k.byte_offset = 32 * 128 * 2;
    DLTensor v = k;
    v.byte_offset = 40 * 128 * 2;
    DLTensor out = view(0x40000, 3, qs, NULL, kDLBfloat, 16),
             lse = view(0x60000, 2, ls, NULL, kDLFloat, 32);
    EXPECT_OVERLAP("out", "q", cinfer_single_prefill(ctx, &o, 1, &q, &k, &v, &q, &lse, NULL, NULL));
    DLTensor lse_on_v = lse;
    lse_on_v.data = pool + 40 * 128 * 2;
    EXPECT_OVERLAP("lse", "v",
                   cinfer_single_prefill(ctx, &o, 1, &q, &k, &v, &out, &lse_on_v, NULL, NULL));
    EXPECT_OVERLAP("lse", "v",
                   cinfer_single_prefill_with_workspace(ctx, &o, 1, &q, &k, &v, &out, &lse_on_v,
                                                        NULL, NULL, 0, NULL));
    int64_t q1[2] = {32, 128}, l1[1] = {32}, step[2] = {128, 1};
    DLTensor dq = view(0, 2, q1, step, kDLBfloat, 16),
             dout = view(0x40000, 2, q1, NULL, kDLBfloat, 16);
    DLTensor dlse = view(0x60000, 1, l1, NULL, kDLFloat, 32), dout_on_k = dout;
    dout_on_k.data = pool + 32 * 128 * 2;
    EXPECT_OVERLAP(
        "out", "k",
        cinfer_single_decode(ctx, &o, &dq, &k, &v, &dout_on_k, &dlse, NULL, NULL, 0, NULL));
    DLTensor dlse_on_out = dlse;
    dlse_on_out.data = dout.data;
    EXPECT_OVERLAP(
        "out", "lse",
        cinfer_single_decode(ctx, &o, &dq, &k, &v, &dout, &dlse_on_out, NULL, NULL, 0, NULL));
    size_t need = 0; /* a workspace over out */
    assert_int_equal(cinfer_single_decode_workspace_size(ctx, &o, 16, &need),
                     CINFER_STATUS_SUCCESS);
    assert_true(need > 0 && need < 0x20000);
    EXPECT_OVERLAP(
        "workspace", "out",
        cinfer_single_decode(ctx, &o, &dq, &k, &v, &dout, &dlse, NULL, pool + 0x40000, need, NULL));

    /* batch prefill over the packed q, k, v runs; out as q, lse over k do not */
    void *workspace = NULL;
    cinfer_batch_prefill_t *op = planned_ragged_prefill(&o, &workspace);
    EXPECT_RUNS(cinfer_batch_prefill_run(op, &q, &k, &v, NULL, &out, &lse, NULL, NULL));
    EXPECT_OVERLAP("out", "q",
                   cinfer_batch_prefill_run(op, &q, &k, &v, NULL, &q, &lse, NULL, NULL));
    DLTensor lse_on_k = lse;
    lse_on_k.data = pool + 32 * 128 * 2;
    EXPECT_OVERLAP("lse", "k",
                   cinfer_batch_prefill_run(op, &q, &k, &v, NULL, &out, &lse_on_k, NULL, NULL));
    DLTensor lse_in_workspace = lse;
    lse_in_workspace.data = workspace;
    EXPECT_OVERLAP(
        "workspace", "lse",
        cinfer_batch_prefill_run(op, &q, &k, &v, NULL, &out, &lse_in_workspace, NULL, NULL));
    cinfer_batch_prefill_destroy(op);
    free(workspace);
}

/* MLA: out over the latent cache, lse over q_pe */
static void mla_outputs_apart_from_inputs(void **state) {
    (void)state;
    cinfer_mla_options_t m = CINFER_MLA_OPTIONS_INIT;
    m.num_heads = 16;
    m.sm_scale = 0.1f;
    size_t bytes = 0;
    assert_int_equal(cinfer_batch_mla_workspace_size(ctx, &m, 1, 64, &bytes),
                     CINFER_STATUS_SUCCESS);
    void *workspace = aligned_alloc(256, (bytes + 255) / 256 * 256);
    assert_non_null(workspace);
    cinfer_batch_mla_t *op = NULL;
    assert_int_equal(cinfer_batch_mla_create(ctx, &m, 1, 64, workspace, bytes, &op),
                     CINFER_STATUS_SUCCESS);
    const int32_t qo_indptr[2] = {0, 1}, kv_indptr[2] = {0, 1}, last[1] = {10};
    assert_int_equal(cinfer_batch_mla_plan(op, qo_indptr, kv_indptr, last, 1, NULL),
                     CINFER_STATUS_SUCCESS);
    int64_t qn[3] = {1, 16, 512}, qp[3] = {1, 16, 64}, ckv[3] = {1, 64, 512}, kpe[3] = {1, 64, 64},
            one[1] = {1}, ls[2] = {1, 16};
    DLTensor q_nope = view(0, 3, qn, NULL, kDLBfloat, 16),
             q_pe = view(0x4000, 3, qp, NULL, kDLBfloat, 16);
    DLTensor c = view(0x10000, 3, ckv, NULL, kDLBfloat, 16),
             p = view(0x20000, 3, kpe, NULL, kDLBfloat, 16);
    DLTensor ind = view(0x23000, 1, one, NULL, kDLInt, 32);
    DLTensor out = view(0x30000, 3, qn, NULL, kDLBfloat, 16),
             lse = view(0x34000, 2, ls, NULL, kDLFloat, 32);
    EXPECT_RUNS(cinfer_batch_mla_run(op, &q_nope, &q_pe, &c, &p, &ind, &out, &lse, NULL));
    DLTensor out_on_c = out;
    out_on_c.data = c.data;
    EXPECT_OVERLAP("out", "ckv_cache",
                   cinfer_batch_mla_run(op, &q_nope, &q_pe, &c, &p, &ind, &out_on_c, &lse, NULL));
    DLTensor lse_on_pe = lse;
    lse_on_pe.data = q_pe.data;
    EXPECT_OVERLAP("lse", "q_pe",
                   cinfer_batch_mla_run(op, &q_nope, &q_pe, &c, &p, &ind, &out, &lse_on_pe, NULL));
    DLTensor out_in_workspace = out;
    out_in_workspace.data = workspace;
    EXPECT_OVERLAP(
        "workspace", "out",
        cinfer_batch_mla_run(op, &q_nope, &q_pe, &c, &p, &ind, &out_in_workspace, &lse, NULL));
    cinfer_batch_mla_destroy(op);
    free(workspace);
}

/* ---- mutated tensors ---- */

/* One argument's descriptor and room for its shape and strides (8 dims, whatever ndim says). */
typedef struct mutable_tensor {
    DLTensor t;
    int64_t shape[8], strides[8];
} mutable_tensor_t;

static void mutable_init(mutable_tensor_t *m, const DLTensor *good) {
    memset(m, 0, sizeof *m);
    m->t = *good;
    memcpy(m->shape, good->shape, sizeof(int64_t) * (size_t)good->ndim);
    m->t.shape = m->shape;
    m->t.strides = NULL;
}

/* One random change to a descriptor: a size, the rank, strides, the dtype, the device, the data
 * pointer or the byte offset, drawn from values at and past every limit. */
static void mutate(mutable_tensor_t *m, cinfer_test_rng *rng) {
    static const int64_t sizes[] = {-1,
                                    0,
                                    1,
                                    2,
                                    3,
                                    31,
                                    4096,
                                    INT64_C(1) << 31,
                                    INT64_C(1) << 40,
                                    INT64_C(1) << 48,
                                    INT64_MAX,
                                    INT64_MIN};
    const int64_t pick = sizes[cinfer_test_rng_below(rng, sizeof sizes / sizeof sizes[0])];
    DLTensor *t = &m->t;
    const int dim = t->ndim > 0 ? (int)cinfer_test_rng_below(rng, (uint64_t)t->ndim) : 0;
    switch (cinfer_test_rng_below(rng, 9)) {
    case 0:
        if (t->ndim > 0)
            m->shape[dim] = pick;
        break;
    case 1:
        if (t->ndim > 0)
            m->shape[dim] += cinfer_test_rng_below(rng, 2) ? 1 : -1;
        break;
    case 2: /* another rank over the same arrays (at most 8 dims, so reads stay inside them) */
        t->ndim = (int)cinfer_test_rng_below(rng, 10) - 1;
        break;
    case 3: /* strides: contiguous ones, then one changed */
        for (int i = 7, step = 1; i >= 0; i--) {
            m->strides[i] = step;
            step *= (i < t->ndim && m->shape[i] > 0 && m->shape[i] < 4096) ? (int)m->shape[i] : 1;
        }
        if (t->ndim > 0)
            m->strides[dim] = cinfer_test_rng_below(rng, 2) ? pick : m->strides[dim] * 2;
        t->strides = m->strides;
        break;
    case 4: {
        static const DLDataType dtypes[] = {{kDLFloat, 16, 1},  {kDLBfloat, 16, 1},
                                            {kDLFloat, 32, 1},  {kDLFloat, 8, 1},
                                            {kDLInt, 32, 1},    {kDLFloat, 16, 2},
                                            {kDLUInt, 8, 1},    {10, 8, 1} /* float8_e4m3fn */,
                                            {kDLComplex, 64, 1}};
        t->dtype = dtypes[cinfer_test_rng_below(rng, sizeof dtypes / sizeof dtypes[0])];
        break;
    }
    case 5:
        t->device.device_type = cinfer_test_rng_below(rng, 2) ? kDLCPU : kDLCUDAHost;
        t->device.device_id = (int32_t)cinfer_test_rng_below(rng, 3) - 1;
        break;
    case 6:
        t->data = cinfer_test_rng_below(rng, 2) ? NULL : (char *)t->data + 1;
        break;
    case 7:
        t->byte_offset = (uint64_t)pick;
        break;
    default:
        t->shape = cinfer_test_rng_below(rng, 4) == 0 ? NULL : t->shape;
        break;
    }
}

/* The outcome of a call on mutated arguments: a status with a message and no launch, or success
 * with launches; never anything else (a crash or a read past the descriptors' arrays ends the
 * test under `make test-sanitize`). Counts the refusals. */
static void expect_status_or_launch(cinfer_status_t st, long launched, int iter, int *refused) {
    if (st == CINFER_STATUS_SUCCESS) {
        if (launched <= 0)
            fail_msg("mutation %d: SUCCESS without a launch", iter);
        return;
    }
    if (st != CINFER_STATUS_INVALID_ARGUMENT && st != CINFER_STATUS_PLAN_MISMATCH &&
        st != CINFER_STATUS_UNSUPPORTED)
        fail_msg("mutation %d: %s \"%s\"", iter, cinfer_status_name(st), cinfer_last_error());
    if (!cinfer_last_error()[0])
        fail_msg("mutation %d: %s without a message", iter, cinfer_status_name(st));
    if (launched != 0)
        fail_msg("mutation %d: refused (%s), yet launched %ld kernels", iter,
                 cinfer_status_name(st), launched);
    (*refused)++;
}

/* `calls` calls of `call` on the arguments `good[0, n)` (n <= 8), one to three of their
 * descriptors mutated in each, each checked by expect_status_or_launch; returns the refusals. */
typedef cinfer_status_t (*mutated_call_t)(mutable_tensor_t *a, void *data);
static int run_mutated(const DLTensor *good, int n, mutated_call_t call, void *data, int calls,
                       cinfer_test_rng *rng) {
    int refused = 0;
    for (int iter = 0; iter < calls; iter++) {
        mutable_tensor_t a[8];
        for (int i = 0; i < n; i++)
            mutable_init(&a[i], &good[i]);
        const int changes = 1 + (int)cinfer_test_rng_below(rng, 3);
        for (int c = 0; c < changes; c++)
            mutate(&a[cinfer_test_rng_below(rng, (uint64_t)n)], rng);
        const long before = launches();
        const cinfer_status_t st = call(a, data);
        expect_status_or_launch(st, launches() - before, iter, &refused);
    }
    return refused;
}

static cinfer_status_t call_merge_state(mutable_tensor_t *a, void *data) {
    (void)data;
    return cinfer_merge_state(ctx, &a[0].t, &a[1].t, &a[2].t, &a[3].t, &a[4].t, &a[5].t, NULL);
}

static cinfer_status_t call_batch_decode_run(mutable_tensor_t *a, void *op) {
    return cinfer_batch_decode_run(op, &a[0].t, &a[1].t, &a[2].t, &a[3].t, &a[4].t, &a[5].t,
                                   &a[6].t, &a[7].t, NULL, NULL);
}

/* merge_state and batch decode's run with one to three arguments' descriptors mutated at a time,
 * 1500 calls each. */
static void mutated_tensors_are_refused_or_run(void **state) {
    (void)state;
    cinfer_test_rng rng;
    cinfer_test_rng_init(&rng, 0x5EED0F7E57ull); /* the same calls on every run */

    int64_t vs[3] = {4, 8, 64}, ls[2] = {4, 8};
    const DLTensor merge_args[6] = {
        tensor(pool, 3, vs, kDLFloat, 16),          tensor(pool + 65536, 2, ls, kDLFloat, 32),
        tensor(pool + 4096, 3, vs, kDLFloat, 16),   tensor(pool + 69632, 2, ls, kDLFloat, 32),
        tensor(pool + 131072, 3, vs, kDLFloat, 16), tensor(pool + 196608, 2, ls, kDLFloat, 32)};
    int refused = run_mutated(merge_args, 6, call_merge_state, NULL, 1500, &rng);
    printf("merge_state: %d of 1500 mutated calls refused\n", refused);
    assert_true(refused > 750);

    two_requests_t r;
    two_requests_init(&r);
    const DLTensor decode_args[8] = {r.q, r.k, r.v, r.indptr, r.indices, r.last_len, r.out, r.lse};
    refused = run_mutated(decode_args, 8, call_batch_decode_run, r.op, 1500, &rng);
    printf("batch decode run: %d of 1500 mutated calls refused\n", refused);
    assert_true(refused > 750);
    two_requests_free(&r);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(merge_state_shapes),
        cmocka_unit_test(packbits_shapes),
        cmocka_unit_test(append_error_flag_without_data),
        cmocka_unit_test(batch_decode_run_shapes),
        cmocka_unit_test(builtin_variant_sizes),
        cmocka_unit_test(batch_prefill_run_shapes),
        cmocka_unit_test(mla_and_rope_limits),
        cmocka_unit_test(merge_outputs_may_only_be_inputs_exactly),
        cmocka_unit_test(rope_outputs_in_place_or_apart),
        cmocka_unit_test(append_and_page_table_outputs_apart),
        cmocka_unit_test(packbits_outputs_apart),
        cmocka_unit_test(attention_outputs_apart_from_inputs),
        cmocka_unit_test(mla_outputs_apart_from_inputs),
        cmocka_unit_test(mutated_tensors_are_refused_or_run),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
