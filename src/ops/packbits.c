/*
 * packbits and segment_packbits: argument checks, specs and launches of kernels/packbits.cu.
 */
#include <string.h>

#include "cinfer.h"
#include "jit/jit.h"
#include "ops/tensor.h"
#include "packbits_params.h"

#define INT32_LIMIT 2147483647ll

static cinfer_status_t check_common(const cinfer_context_t *ctx, const DLTensor *x,
                                    cinfer_bitorder_t bitorder) {
    if (!ctx)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT, CINFER__NULL_CTX);
    if (bitorder != CINFER_BITORDER_LITTLE && bitorder != CINFER_BITORDER_BIG)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "bitorder = %d, expected CINFER_BITORDER_LITTLE (0) or "
                             "CINFER_BITORDER_BIG (1)",
                             (int)bitorder);
    return cinfer__tensor_check(ctx, "x", x, 1, NULL, CINFER__DTS(CINFER__DT_U8));
}

/* Loads a kernel; launching waits until every kernel of the call is loaded, so a failed load
 * leaves no half-done work. */
static cinfer_status_t load(cinfer_context_t *ctx, cinfer__op_t op, int vec, cinfer__kernel_t *k) {
    cinfer__spec_t spec;
    cinfer__spec_init(&spec, op);
    spec.vec = vec;
    return cinfer__jit_kernel(ctx, &spec, k);
}

static cinfer_status_t launch(cinfer_context_t *ctx, const cinfer__kernel_t *k, int64_t blocks,
                              unsigned threads, cinfer_packbits_params *p, CUstream stream,
                              const char *what) {
    if (blocks > INT32_LIMIT)
        return cinfer__error(CINFER_STATUS_UNSUPPORTED,
                             "%s: %lld blocks is more than one launch can hold (2^31 - 1)", what,
                             (long long)blocks);
    void *args[] = {p};
    CINFER__CU(
        ctx->cu,
        cuLaunchKernel(k->function, (unsigned)blocks, 1, 1, threads, 1, 1, 0, stream, args, NULL),
        what);
    return CINFER_STATUS_SUCCESS;
}

cinfer_status_t cinfer_packbits(cinfer_context_t *ctx, const DLTensor *x,
                                cinfer_bitorder_t bitorder, DLTensor *y, CUstream stream) {
    CINFER__CHECK(check_common(ctx, x, bitorder));
    const int64_t n = x->shape[0];
    const int64_t y_shape[1] = {(n + 7) / 8};
    CINFER__CHECK(cinfer__tensor_check(ctx, "y", y, 1, y_shape, CINFER__DTS(CINFER__DT_U8)));
    const cinfer__tensor_arg_t input = {"x", x, false};
    CINFER__CHECK(cinfer__tensor_check_disjoint("y", y, &input, 1));
    if (n == 0)
        return CINFER_STATUS_SUCCESS;

    cinfer_packbits_params p;
    memset(&p, 0, sizeof p);
    p.x = cinfer__tensor_data(x);
    p.y = cinfer__tensor_data(y);
    p.n = n;
    p.y_len = y_shape[0];
    p.big = bitorder == CINFER_BITORDER_BIG;
    const bool vec = (uintptr_t)p.x % 16 == 0 && (uintptr_t)p.y % 16 == 0;
    cinfer__kernel_t k;
    CINFER__CHECK(load(ctx, CINFER__OP_PACKBITS, vec ? 8 : 1, &k));
    CINFER__CHECK(cinfer__context_activate(ctx));
    const int64_t threads =
        (p.y_len + CINFER_PACKBITS_BYTES_PER_THREAD - 1) / CINFER_PACKBITS_BYTES_PER_THREAD;
    return launch(ctx, &k, (threads + CINFER_PACKBITS_BLOCK - 1) / CINFER_PACKBITS_BLOCK,
                  CINFER_PACKBITS_BLOCK, &p, stream, "launching the packbits kernel");
}

cinfer_status_t cinfer_segment_packbits(cinfer_context_t *ctx, const DLTensor *x,
                                        const DLTensor *indptr, cinfer_bitorder_t bitorder,
                                        DLTensor *y, DLTensor *indptr_new, CUstream stream) {
    CINFER__CHECK(check_common(ctx, x, bitorder));
    const int64_t any[1] = {-1};
    CINFER__CHECK(cinfer__tensor_check(ctx, "indptr", indptr, 1, any, CINFER__DTS(CINFER__DT_I32)));
    const int64_t batch_size = indptr->shape[0] - 1;
    if (batch_size < 0 || batch_size > INT32_LIMIT - 1)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "indptr: %lld entries, expected batch_size + 1 with 0 <= batch_size "
                             "< 2^31 - 1",
                             (long long)indptr->shape[0]);
    CINFER__CHECK(cinfer__tensor_check(ctx, "y", y, 1, any, CINFER__DTS(CINFER__DT_U8)));
    CINFER__CHECK(cinfer__tensor_check(ctx, "indptr_new", indptr_new, 1, indptr->shape,
                                       CINFER__DTS(CINFER__DT_I32)));
    /* The scan writes indptr_new while the packing kernel's threads read indptr and x. */
    const cinfer__tensor_arg_t tensors[] = {{"indptr_new", indptr_new, false},
                                            {"y", y, false},
                                            {"indptr", indptr, false},
                                            {"x", x, false}};
    CINFER__CHECK(cinfer__tensor_check_written(tensors, 2, CINFER__TENSOR_COUNT(tensors)));

    cinfer_packbits_params p;
    memset(&p, 0, sizeof p);
    p.x = cinfer__tensor_data(x);
    p.y = cinfer__tensor_data(y);
    p.indptr = cinfer__tensor_data(indptr);
    p.indptr_new = cinfer__tensor_data(indptr_new);
    p.n = x->shape[0];
    p.y_len = y->shape[0];
    p.batch_size = (int)batch_size;
    p.big = bitorder == CINFER_BITORDER_BIG;
    cinfer__kernel_t scan, pack;
    CINFER__CHECK(load(ctx, CINFER__OP_SEGMENT_PACKBITS_INDPTR, 0, &scan));
    CINFER__CHECK(load(ctx, CINFER__OP_SEGMENT_PACKBITS, 0, &pack));
    CINFER__CHECK(cinfer__context_activate(ctx));
    /* indptr_new[0] = 0 is written even for an empty batch. */
    CINFER__CHECK(launch(ctx, &scan, 1, CINFER_PACKBITS_SCAN_BLOCK, &p, stream,
                         "launching the segment_packbits indptr kernel"));
    if (p.y_len == 0 || batch_size == 0)
        return CINFER_STATUS_SUCCESS;
    return launch(ctx, &pack, (p.y_len + CINFER_PACKBITS_BLOCK - 1) / CINFER_PACKBITS_BLOCK,
                  CINFER_PACKBITS_BLOCK, &p, stream, "launching the segment_packbits kernel");
}
