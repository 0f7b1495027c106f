/*
 * append_paged_kv_cache, get_batch_indices_positions, get_seq_lens: argument checks, specs and
 * launches of the page-table kernels (kernels/append.cu).
 */
#include <math.h>
#include <string.h>

#include "append_params.h"
#include "cinfer.h"
#include "jit/jit.h"
#include "ops/append.h"
#include "ops/tensor.h"

/* The public error bits are the kernel's. */
_Static_assert(CINFER_APPEND_ERROR_BATCH_INDEX == CINFER_APPEND_ERR_BATCH, "error bits");
_Static_assert(CINFER_APPEND_ERROR_POSITION == CINFER_APPEND_ERR_POSITION, "error bits");
_Static_assert(CINFER_APPEND_ERROR_PAGE == CINFER_APPEND_ERR_PAGE, "error bits");

#define MAX_HEAD_DIM 1024
#define INT32_LIMIT  2147483647ll

static cinfer_status_t check_ctx(const cinfer_context_t *ctx) {
    if (!ctx)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT, CINFER__NULL_CTX);
    return CINFER_STATUS_SUCCESS;
}

/* A 1-d int32 index tensor of `len` entries (-1 = any). */
static cinfer_status_t check_index(const cinfer_context_t *ctx, const char *arg, const DLTensor *t,
                                   int64_t len) {
    const int64_t shape[1] = {len};
    return cinfer__tensor_check(ctx, arg, t, 1, shape, CINFER__DTS(CINFER__DT_I32));
}

/* True if every row of t starts on an `align`-byte boundary: the data address and the byte
 * stride of every dim with more than one index. */
static bool rows_aligned(const DLTensor *t, int64_t align) {
    const int64_t elem = (int64_t)cinfer__dtype_size(cinfer__tensor_dtype(t));
    if ((uintptr_t)cinfer__tensor_data(t) % (uintptr_t)align != 0)
        return false;
    for (int i = 0; i < t->ndim - 1; i++)
        if (t->shape[i] > 1 && (cinfer__tensor_stride(t, i) * elem) % align != 0)
            return false;
    return true;
}

/* Loads the kernel of spec and launches it on `blocks` x `threads`. */
static cinfer_status_t launch(cinfer_context_t *ctx, const cinfer__spec_t *spec, int64_t blocks,
                              unsigned threads, void *params, CUstream stream, const char *what) {
    cinfer__kernel_t k;
    CINFER__CHECK(cinfer__jit_kernel(ctx, spec, &k));
    CINFER__CHECK(cinfer__context_activate(ctx));
    if (blocks > INT32_LIMIT)
        return cinfer__error(CINFER_STATUS_UNSUPPORTED,
                             "%s: %lld blocks is more than one launch can hold (2^31 - 1)", what,
                             (long long)blocks);
    void *args[] = {params};
    CINFER__CU(
        ctx->cu,
        cuLaunchKernel(k.function, (unsigned)blocks, 1, 1, threads, 1, 1, 0, stream, args, NULL),
        what);
    return CINFER_STATUS_SUCCESS;
}

void cinfer__append_kernel_spec(cinfer__dtype_t src_dtype, cinfer__dtype_t cache_dtype,
                                int head_dim, bool vec, cinfer__spec_t *spec) {
    cinfer__spec_init(spec, CINFER__OP_APPEND_PAGED_KV_CACHE);
    spec->dtype_o = src_dtype;
    spec->dtype_kv = cache_dtype;
    spec->head_dim_vo = (int32_t)head_dim;
    spec->vec = vec ? 8 : 1;
}

void cinfer__seq_lens_kernel_spec(cinfer__spec_t *spec) {
    cinfer__spec_init(spec, CINFER__OP_SEQ_LENS);
}

void cinfer__batch_indices_positions_kernel_spec(cinfer__spec_t *spec) {
    cinfer__spec_init(spec, CINFER__OP_BATCH_INDICES_POSITIONS);
}

static cinfer_status_t check_options(const cinfer_append_options_t *o) {
    if (o->size < sizeof *o || o->version != CINFER_APPEND_OPTIONS_VERSION)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "options: size %zu / version %u; initialize it with "
                             "CINFER_APPEND_OPTIONS_INIT (size %zu, version %u)",
                             o->size, o->version, sizeof *o, CINFER_APPEND_OPTIONS_VERSION);
    if (o->kv_layout != CINFER_KV_LAYOUT_NHD && o->kv_layout != CINFER_KV_LAYOUT_HND)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "options->kv_layout = %d, expected CINFER_KV_LAYOUT_NHD (0) or "
                             "CINFER_KV_LAYOUT_HND (1)",
                             (int)o->kv_layout);
    if (o->page_size < 1 || o->page_size > 256)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "options->page_size = %d, expected 1..256", o->page_size);
    if (!isfinite(o->k_scale) || o->k_scale <= 0.0f)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "options->k_scale = %g, expected a finite value > 0",
                             (double)o->k_scale);
    if (!isfinite(o->v_scale) || o->v_scale <= 0.0f)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "options->v_scale = %g, expected a finite value > 0",
                             (double)o->v_scale);
    return CINFER_STATUS_SUCCESS;
}

/*
 * Checks a paged cache tensor against [*, (2,) page_size, Hk, D] (NHD) or [*, (2,) Hk,
 * page_size, D] (HND); `pages` >= 0 also fixes its first dim, `dtype` (unless NONE) its dtype
 * (else any cache dtype: fp16, bf16, e4m3, e5m2).
 */
static cinfer_status_t check_cache(const cinfer_context_t *ctx, const char *arg, const DLTensor *t,
                                   bool combined, bool nhd, int64_t page_size, int64_t heads,
                                   int64_t head_dim, int64_t pages, cinfer__dtype_t dtype) {
    const uint32_t cache_dtypes =
        CINFER__DTS_HALF | CINFER__DTS(CINFER__DT_E4M3) | CINFER__DTS(CINFER__DT_E5M2);
    const int ndim = combined ? 5 : 4;
    CINFER__CHECK(
        cinfer__tensor_check(ctx, arg, t, ndim, NULL, dtype ? CINFER__DTS(dtype) : cache_dtypes));
    int64_t want[5];
    int n = 0;
    want[n++] = pages;
    if (combined)
        want[n++] = 2;
    want[n++] = nhd ? page_size : heads;
    want[n++] = nhd ? heads : page_size;
    want[n++] = head_dim;
    for (int i = 0; i < ndim; i++) {
        if (want[i] >= 0 && t->shape[i] != want[i]) {
            char got[128], expected[128];
            cinfer__shape_string(got, sizeof got, ndim, t->shape);
            cinfer__shape_string(expected, sizeof expected, ndim, want);
            return cinfer__error(
                CINFER_STATUS_INVALID_ARGUMENT,
                "%s: shape %s, expected %s: %s%s [max_pages, %s%s, head_dim] with page_size from "
                "the options and num_kv_heads, head_dim from append_k%s",
                arg, got, expected, combined ? "combined " : "", nhd ? "NHD" : "HND",
                combined ? "2, " : "", nhd ? "page_size, num_kv_heads" : "num_kv_heads, page_size",
                pages >= 0 ? ", max_pages from k_cache" : "");
        }
    }
    return cinfer__tensor_check_distinct(arg, t); /* the call writes the cache */
}

cinfer_status_t cinfer_append_paged_kv_cache(
    cinfer_context_t *ctx, const cinfer_append_options_t *options, const DLTensor *append_k,
    const DLTensor *append_v, const DLTensor *batch_indices, const DLTensor *positions,
    DLTensor *k_cache, DLTensor *v_cache, const DLTensor *kv_indices, const DLTensor *kv_indptr,
    const DLTensor *kv_last_page_len, DLTensor *error_flag, CUstream stream) {
    const cinfer_append_options_t defaults = CINFER_APPEND_OPTIONS_INIT;
    const cinfer_append_options_t *o = options ? options : &defaults;
    CINFER__CHECK(check_ctx(ctx));
    CINFER__CHECK(check_options(o));
    const bool nhd = o->kv_layout == CINFER_KV_LAYOUT_NHD;

    CINFER__CHECK(cinfer__tensor_check(ctx, "append_k", append_k, 3, NULL, CINFER__DTS_HALF));
    const cinfer__dtype_t src_dtype = cinfer__tensor_dtype(append_k);
    const int64_t nnz = append_k->shape[0], Hk = append_k->shape[1], D = append_k->shape[2];
    CINFER__CHECK(cinfer__tensor_check(ctx, "append_v", append_v, 3, append_k->shape,
                                       CINFER__DTS(src_dtype)));
    if (D < 1 || D > MAX_HEAD_DIM)
        return cinfer__error(D < 1 ? CINFER_STATUS_INVALID_ARGUMENT : CINFER_STATUS_UNSUPPORTED,
                             "append_k: head dim %lld, expected 1..%d", (long long)D, MAX_HEAD_DIM);
    if (Hk * D > INT32_LIMIT)
        return cinfer__error(CINFER_STATUS_UNSUPPORTED,
                             "append_k: %lld heads x head dim %lld is more than 2^31 - 1 elements "
                             "per token",
                             (long long)Hk, (long long)D);
    CINFER__CHECK(check_index(ctx, "batch_indices", batch_indices, nnz));
    CINFER__CHECK(check_index(ctx, "positions", positions, nnz));

    const bool combined = v_cache == NULL;
    CINFER__CHECK(check_cache(ctx, "k_cache", k_cache, combined, nhd, o->page_size, Hk, D, -1,
                              CINFER__DT_NONE));
    const cinfer__dtype_t cache_dtype = cinfer__tensor_dtype(k_cache);
    if (!combined)
        CINFER__CHECK(check_cache(ctx, "v_cache", v_cache, false, nhd, o->page_size, Hk, D,
                                  k_cache->shape[0], cache_dtype));
    const bool fp8 = cache_dtype == CINFER__DT_E4M3 || cache_dtype == CINFER__DT_E5M2;
    if (!fp8 && (o->k_scale != 1.0f || o->v_scale != 1.0f))
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "options->k_scale = %g, v_scale = %g with a %s cache: scales apply "
                             "to fp8 caches only, expected 1",
                             (double)o->k_scale, (double)o->v_scale,
                             cinfer__dtype_name(cache_dtype));

    CINFER__CHECK(check_index(ctx, "kv_indptr", kv_indptr, -1));
    const int64_t batch_size = kv_indptr->shape[0] - 1;
    if (batch_size < 0 || batch_size > INT32_LIMIT - 1)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "kv_indptr: %lld entries, expected batch_size + 1 with 0 <= "
                             "batch_size < 2^31 - 1",
                             (long long)kv_indptr->shape[0]);
    CINFER__CHECK(check_index(ctx, "kv_indices", kv_indices, -1));
    CINFER__CHECK(check_index(ctx, "kv_last_page_len", kv_last_page_len, batch_size));
    if (error_flag) {
        const int64_t one[1] = {1};
        const int ndim = error_flag->ndim == 0 ? 0 : 1;
        CINFER__CHECK(cinfer__tensor_check(ctx, "error_flag", error_flag, ndim, one,
                                           CINFER__DTS(CINFER__DT_I32)));
    }
    /* The caches and the flag are written while other threads read the rows and the page
     * table: none may overlap another or an input (the halves of one buffer, e.g. a combined
     * cache given as two views, do not overlap). */
    const cinfer__tensor_arg_t tensors[] = {
        {"k_cache", k_cache, false},       {"v_cache", v_cache, false},
        {"error_flag", error_flag, false}, {"append_k", append_k, false},
        {"append_v", append_v, false},     {"batch_indices", batch_indices, false},
        {"positions", positions, false},   {"kv_indices", kv_indices, false},
        {"kv_indptr", kv_indptr, false},   {"kv_last_page_len", kv_last_page_len, false}};
    CINFER__CHECK(cinfer__tensor_check_written(tensors, 3, CINFER__TENSOR_COUNT(tensors)));
    if (nnz == 0 || Hk == 0)
        return CINFER_STATUS_SUCCESS;

    /* 16-byte rows of 8 elements in, 16 (fp16/bf16) or 8 (fp8) bytes out. */
    const int64_t cache_align = fp8 ? 8 : 16;
    const bool vec = D % 8 == 0 && rows_aligned(append_k, 16) && rows_aligned(append_v, 16) &&
                     rows_aligned(k_cache, cache_align) &&
                     (combined || rows_aligned(v_cache, cache_align));

    cinfer_append_params p;
    memset(&p, 0, sizeof p);
    p.src[0] = cinfer__tensor_data(append_k);
    p.src[1] = cinfer__tensor_data(append_v);
    p.src_stride[0][0] = cinfer__tensor_step(append_k, 0);
    p.src_stride[0][1] = cinfer__tensor_step(append_k, 1);
    p.src_stride[1][0] = cinfer__tensor_step(append_v, 0);
    p.src_stride[1][1] = cinfer__tensor_step(append_v, 1);
    /* The dims after the page (and K/V) dims: slot and head, in the layout's order. */
    const int first = combined ? 2 : 1;
    const int slot_dim = nhd ? first : first + 1, head_dim = nhd ? first + 1 : first;
    const DLTensor *caches[2] = {k_cache, combined ? k_cache : v_cache};
    for (int i = 0; i < 2; i++) {
        p.cache[i] = cinfer__tensor_data(caches[i]);
        p.cache_stride[i][0] = cinfer__tensor_step(caches[i], 0);
        p.cache_stride[i][1] = cinfer__tensor_step(caches[i], slot_dim);
        p.cache_stride[i][2] = cinfer__tensor_step(caches[i], head_dim);
    }
    if (combined)
        p.cache[1] = (char *)p.cache[0] +
                     cinfer__tensor_stride(k_cache, 1) * (int64_t)cinfer__dtype_size(cache_dtype);
    p.batch_indices = cinfer__tensor_data(batch_indices);
    p.positions = cinfer__tensor_data(positions);
    p.kv_indptr = cinfer__tensor_data(kv_indptr);
    p.kv_indices = cinfer__tensor_data(kv_indices);
    p.error_flag = error_flag ? cinfer__tensor_data(error_flag) : NULL;
    p.nnz = nnz;
    p.num_indices = kv_indices->shape[0];
    p.max_pages = k_cache->shape[0];
    p.batch_size = (int)batch_size;
    p.num_heads = (int)Hk;
    p.page_size = o->page_size;
    p.page_shift = cinfer__page_shift(o->page_size);
    p.inv_scale[0] = (float)(1.0 / o->k_scale);
    p.inv_scale[1] = (float)(1.0 / o->v_scale);

    cinfer__spec_t spec;
    cinfer__append_kernel_spec(src_dtype, cache_dtype, (int)D, vec, &spec);
    const int64_t blocks =
        (nnz + CINFER_APPEND_TOKENS_PER_BLOCK - 1) / CINFER_APPEND_TOKENS_PER_BLOCK;
    return launch(ctx, &spec, blocks, CINFER_APPEND_BLOCK, &p, stream,
                  "launching the append_paged_kv_cache kernel");
}

cinfer_status_t cinfer_get_batch_indices_positions(cinfer_context_t *ctx,
                                                   const DLTensor *append_indptr,
                                                   const DLTensor *seq_lens,
                                                   DLTensor *batch_indices, DLTensor *positions,
                                                   CUstream stream) {
    CINFER__CHECK(check_ctx(ctx));
    CINFER__CHECK(check_index(ctx, "append_indptr", append_indptr, -1));
    const int64_t batch_size = append_indptr->shape[0] - 1;
    if (batch_size < 0 || batch_size > INT32_LIMIT - 1)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "append_indptr: %lld entries, expected batch_size + 1 with 0 <= "
                             "batch_size < 2^31 - 1",
                             (long long)append_indptr->shape[0]);
    CINFER__CHECK(check_index(ctx, "seq_lens", seq_lens, batch_size));
    CINFER__CHECK(check_index(ctx, "batch_indices", batch_indices, -1));
    const int64_t nnz = batch_indices->shape[0];
    CINFER__CHECK(check_index(ctx, "positions", positions, nnz));
    const cinfer__tensor_arg_t tensors[] = {{"batch_indices", batch_indices, false},
                                            {"positions", positions, false},
                                            {"append_indptr", append_indptr, false},
                                            {"seq_lens", seq_lens, false}};
    CINFER__CHECK(cinfer__tensor_check_written(tensors, 2, CINFER__TENSOR_COUNT(tensors)));
    if (nnz == 0)
        return CINFER_STATUS_SUCCESS;

    cinfer_batch_indices_params p;
    memset(&p, 0, sizeof p);
    p.append_indptr = cinfer__tensor_data(append_indptr);
    p.seq_lens = cinfer__tensor_data(seq_lens);
    p.batch_indices = cinfer__tensor_data(batch_indices);
    p.positions = cinfer__tensor_data(positions);
    p.nnz = nnz;
    p.batch_size = (int)batch_size;
    cinfer__spec_t spec;
    cinfer__batch_indices_positions_kernel_spec(&spec);
    return launch(ctx, &spec, (nnz + CINFER_APPEND_BLOCK - 1) / CINFER_APPEND_BLOCK,
                  CINFER_APPEND_BLOCK, &p, stream,
                  "launching the get_batch_indices_positions kernel");
}

cinfer_status_t cinfer_get_seq_lens(cinfer_context_t *ctx, const DLTensor *kv_indptr,
                                    const DLTensor *kv_last_page_len, int page_size,
                                    DLTensor *seq_lens, CUstream stream) {
    CINFER__CHECK(check_ctx(ctx));
    CINFER__CHECK(check_index(ctx, "kv_indptr", kv_indptr, -1));
    const int64_t batch_size = kv_indptr->shape[0] - 1;
    if (batch_size < 0 || batch_size > INT32_LIMIT - 1)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "kv_indptr: %lld entries, expected batch_size + 1 with 0 <= "
                             "batch_size < 2^31 - 1",
                             (long long)kv_indptr->shape[0]);
    CINFER__CHECK(check_index(ctx, "kv_last_page_len", kv_last_page_len, batch_size));
    if (page_size < 1)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT, "page_size = %d, expected >= 1",
                             page_size);
    CINFER__CHECK(check_index(ctx, "seq_lens", seq_lens, batch_size));
    const cinfer__tensor_arg_t inputs[] = {{"kv_indptr", kv_indptr, false},
                                           {"kv_last_page_len", kv_last_page_len, false}};
    CINFER__CHECK(cinfer__tensor_check_disjoint("seq_lens", seq_lens, inputs, 2));
    if (batch_size == 0)
        return CINFER_STATUS_SUCCESS;

    cinfer_seq_lens_params p;
    memset(&p, 0, sizeof p);
    p.kv_indptr = cinfer__tensor_data(kv_indptr);
    p.kv_last_page_len = cinfer__tensor_data(kv_last_page_len);
    p.seq_lens = cinfer__tensor_data(seq_lens);
    p.batch_size = (int)batch_size;
    p.page_size = page_size;
    cinfer__spec_t spec;
    cinfer__seq_lens_kernel_spec(&spec);
    return launch(ctx, &spec, (batch_size + CINFER_APPEND_BLOCK - 1) / CINFER_APPEND_BLOCK,
                  CINFER_APPEND_BLOCK, &p, stream, "launching the get_seq_lens kernel");
}
