/*
 * merge_state, merge_state_in_place, merge_states: argument checks, spec, launch.
 */
#include <string.h>

#include "jit/jit.h"
#include "merge_params.h"
#include "ops/tensor.h"

/* (row, head) pairs per block: the kernel's thread mapping (kernels/merge_params.h). */
static int rows_per_block(int head_dim, int vec) {
    return CINFER_MERGE_BLOCK / CINFER_MERGE_TPR(head_dim, vec);
}

/* True if a value tensor's rows start on 16-byte boundaries, so 8-wide vector accesses are safe. */
static bool aligned16(const DLTensor *t, int ndim) {
    if ((uintptr_t)cinfer__tensor_data(t) % 16 != 0)
        return false;
    for (int i = 0; i < ndim - 1; i++)
        if (t->shape[i] > 1 && (cinfer__tensor_stride(t, i) * 2) % 16 != 0)
            return false;
    return true;
}

typedef struct merge_launch {
    cinfer__op_t op;
    cinfer__dtype_t dtype;
    int head_dim;
    bool aligned;
    cinfer_merge_params params;
} merge_launch_t;

static cinfer_status_t launch(cinfer_context_t *ctx, merge_launch_t *m, CUstream stream) {
    int64_t pairs = m->params.num_rows * m->params.num_heads;
    if (pairs == 0)
        return CINFER_STATUS_SUCCESS;
    cinfer__spec_t spec;
    cinfer__spec_init(&spec, m->op);
    spec.dtype_o = m->dtype;
    spec.head_dim_vo = m->head_dim;
    spec.vec = (m->aligned && m->head_dim % 8 == 0) ? 8 : 1;
    cinfer__kernel_t k;
    CINFER__CHECK(cinfer__jit_kernel(ctx, &spec, &k));
    CINFER__CHECK(cinfer__context_activate(ctx));
    int rpb = rows_per_block(m->head_dim, spec.vec);
    int64_t blocks = (pairs + rpb - 1) / rpb;
    if (blocks > 0x7fffffff)
        return cinfer__error(CINFER_STATUS_UNSUPPORTED,
                             "%lld (row, head) pairs is too many for one "
                             "launch (at most %lld)",
                             (long long)pairs, (long long)0x7fffffff * rpb);
    void *args[] = {&m->params};
    CINFER__CU(ctx->cu,
               cuLaunchKernel(k.function, (unsigned)blocks, 1, 1, CINFER_MERGE_BLOCK, 1, 1, 0,
                              stream, args, NULL),
               "launching the merge kernel");
    return CINFER_STATUS_SUCCESS;
}

static cinfer_status_t check_ctx(cinfer_context_t *ctx) {
    if (!ctx)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT, CINFER__NULL_CTX);
    return CINFER_STATUS_SUCCESS;
}

/* Fills tensor slot t of the params from a [n, H, D] value tensor and [n, H] lse tensor. */
static void set_input(cinfer_merge_params *p, int t, const DLTensor *v, const DLTensor *lse) {
    p->v_in[t] = cinfer__tensor_data(v);
    p->lse_in[t] = cinfer__tensor_data(lse);
    p->v_in_stride[t][0] = cinfer__tensor_stride(v, 0);
    p->v_in_stride[t][1] = 0;
    p->v_in_stride[t][2] = cinfer__tensor_stride(v, 1);
    p->lse_in_stride[t][0] = cinfer__tensor_stride(lse, 0);
    p->lse_in_stride[t][1] = 0;
    p->lse_in_stride[t][2] = cinfer__tensor_stride(lse, 1);
}

static void set_output(cinfer_merge_params *p, DLTensor *v, DLTensor *lse) {
    p->v_out = cinfer__tensor_data(v);
    p->v_out_stride[0] = cinfer__tensor_stride(v, 0);
    p->v_out_stride[1] = cinfer__tensor_stride(v, 1);
    if (lse) {
        p->lse_out = cinfer__tensor_data(lse);
        p->lse_out_stride[0] = cinfer__tensor_stride(lse, 0);
        p->lse_out_stride[1] = cinfer__tensor_stride(lse, 1);
    }
}

/* Checks a state's v [n, H, D] and lse [n, H] (like: the checked tensor, named like_name, whose
 * shape and dtype v must have, NULL for any 16-bit one); `written`: the call writes them
 * (cinfer__tensor_check_distinct). A mismatch names both tensors, as either may be the odd one. */
static cinfer_status_t check_pair(cinfer_context_t *ctx, const char *v_name, const DLTensor *v,
                                  const char *lse_name, const DLTensor *lse, const char *like_name,
                                  const DLTensor *like, bool written) {
    if (like) {
        char origin[48];
        cinfer__fmt(origin, sizeof origin, "%s's shape", like_name);
        const cinfer__dtype_t dt = cinfer__tensor_dtype(like);
        CINFER__CHECK(cinfer__tensor_check_dims(v_name, v, 3));
        const cinfer__dtype_t own = cinfer__tensor_dtype(v);
        if (own != dt)
            return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                                 "%s: dtype %s (code %u, %u bits, %u lanes) differs from %s's %s, "
                                 "expected one dtype for every state and the output",
                                 v_name, own ? cinfer__dtype_name(own) : "unsupported",
                                 v->dtype.code, v->dtype.bits, v->dtype.lanes, like_name,
                                 cinfer__dtype_name(dt));
        CINFER__CHECK(cinfer__tensor_check_as(ctx, v_name, v, 3, like->shape, dt,
                                              CINFER_STATUS_INVALID_ARGUMENT,
                                              CINFER_STATUS_INVALID_ARGUMENT, origin));
    } else {
        CINFER__CHECK(cinfer__tensor_check(ctx, v_name, v, 3, NULL, CINFER__DTS_HALF));
    }
    const int64_t lse_shape[2] = {v->shape[0], v->shape[1]};
    CINFER__CHECK(
        cinfer__tensor_check(ctx, lse_name, lse, 2, lse_shape, CINFER__DTS(CINFER__DT_F32)));
    if (written) {
        CINFER__CHECK(cinfer__tensor_check_distinct(v_name, v));
        CINFER__CHECK(cinfer__tensor_check_distinct(lse_name, lse));
    }
    return CINFER_STATUS_SUCCESS;
}

/* Head dim and head count limits shared by the three operations. */
static cinfer_status_t check_dims(const char *arg, int64_t num_heads, int64_t head_dim) {
    if (head_dim < 1)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "%s: head dim %lld, expected 1 <= D <= 1024", arg,
                             (long long)head_dim);
    if (head_dim > 1024)
        return cinfer__error(CINFER_STATUS_UNSUPPORTED,
                             "%s: head dim %lld is not supported, expected 1 <= D <= 1024", arg,
                             (long long)head_dim);
    if (num_heads > 0x7fffffff)
        return cinfer__error(CINFER_STATUS_UNSUPPORTED, "%s: %lld heads, at most 2^31-1", arg,
                             (long long)num_heads);
    return CINFER_STATUS_SUCCESS;
}

cinfer_status_t cinfer_merge_state(cinfer_context_t *ctx, const DLTensor *v_a,
                                   const DLTensor *lse_a, const DLTensor *v_b,
                                   const DLTensor *lse_b, DLTensor *v_out, DLTensor *lse_out,
                                   CUstream stream) {
    CINFER__CHECK(check_ctx(ctx));
    CINFER__CHECK(check_pair(ctx, "v_a", v_a, "lse_a", lse_a, NULL, NULL, false));
    CINFER__CHECK(check_pair(ctx, "v_b", v_b, "lse_b", lse_b, "v_a", v_a, false));
    CINFER__CHECK(check_pair(ctx, "v_out", v_out, "lse_out", lse_out, "v_a", v_a, true));
    CINFER__CHECK(check_dims("v_a", v_a->shape[1], v_a->shape[2]));
    /* Each (row, head) reads its inputs before writing its outputs, so an output may be an input
     * exactly, but no other overlap. */
    const cinfer__tensor_arg_t tensors[] = {{"v_out", v_out, false}, {"lse_out", lse_out, false},
                                            {"v_a", v_a, true},      {"lse_a", lse_a, true},
                                            {"v_b", v_b, true},      {"lse_b", lse_b, true}};
    CINFER__CHECK(cinfer__tensor_check_written(tensors, 2, CINFER__TENSOR_COUNT(tensors)));
    merge_launch_t m;
    memset(&m, 0, sizeof m);
    m.op = CINFER__OP_MERGE_STATE;
    m.dtype = cinfer__tensor_dtype(v_a);
    m.head_dim = (int)v_a->shape[2];
    m.aligned = aligned16(v_a, 3) && aligned16(v_b, 3) && aligned16(v_out, 3);
    set_input(&m.params, 0, v_a, lse_a);
    set_input(&m.params, 1, v_b, lse_b);
    set_output(&m.params, v_out, lse_out);
    m.params.num_rows = v_a->shape[0];
    m.params.num_heads = (int)v_a->shape[1];
    m.params.num_states = 2;
    return launch(ctx, &m, stream);
}

cinfer_status_t cinfer_merge_state_in_place(cinfer_context_t *ctx, DLTensor *v, DLTensor *lse,
                                            const DLTensor *v_other, const DLTensor *lse_other,
                                            const DLTensor *mask, CUstream stream) {
    CINFER__CHECK(check_ctx(ctx));
    CINFER__CHECK(check_pair(ctx, "v", v, "lse", lse, NULL, NULL, true));
    CINFER__CHECK(check_pair(ctx, "v_other", v_other, "lse_other", lse_other, "v", v, false));
    CINFER__CHECK(check_dims("v", v->shape[1], v->shape[2]));
    if (mask) {
        const int64_t mask_shape[1] = {v->shape[0]};
        CINFER__CHECK(
            cinfer__tensor_check(ctx, "mask", mask, 1, mask_shape, CINFER__DTS(CINFER__DT_U8)));
        if (mask->shape[0] > 1 && cinfer__tensor_stride(mask, 0) != 1)
            return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT, "mask: must be contiguous");
    }
    /* v and lse are read and written in place; the other state may be them exactly (a state
     * merged with itself), as merge_state's inputs may be its outputs. */
    const cinfer__tensor_arg_t tensors[] = {{"v", v, false},
                                            {"lse", lse, false},
                                            {"v_other", v_other, true},
                                            {"lse_other", lse_other, true},
                                            {"mask", mask, false}};
    CINFER__CHECK(cinfer__tensor_check_written(tensors, 2, CINFER__TENSOR_COUNT(tensors)));
    merge_launch_t m;
    memset(&m, 0, sizeof m);
    m.op = CINFER__OP_MERGE_STATE_IN_PLACE;
    m.dtype = cinfer__tensor_dtype(v);
    m.head_dim = (int)v->shape[2];
    m.aligned = aligned16(v, 3) && aligned16(v_other, 3);
    set_input(&m.params, 0, v, lse);
    set_input(&m.params, 1, v_other, lse_other);
    set_output(&m.params, v, lse);
    m.params.mask = mask ? cinfer__tensor_data(mask) : NULL;
    m.params.num_rows = v->shape[0];
    m.params.num_heads = (int)v->shape[1];
    m.params.num_states = 2;
    return launch(ctx, &m, stream);
}

cinfer_status_t cinfer_merge_states(cinfer_context_t *ctx, const DLTensor *v, const DLTensor *lse,
                                    DLTensor *v_out, DLTensor *lse_out, CUstream stream) {
    CINFER__CHECK(check_ctx(ctx));
    CINFER__CHECK(cinfer__tensor_check(ctx, "v", v, 4, NULL, CINFER__DTS_HALF));
    const int64_t lse_shape[3] = {v->shape[0], v->shape[1], v->shape[2]};
    CINFER__CHECK(cinfer__tensor_check(ctx, "lse", lse, 3, lse_shape, CINFER__DTS(CINFER__DT_F32)));
    const int64_t out_shape[3] = {v->shape[0], v->shape[2], v->shape[3]};
    CINFER__CHECK(cinfer__tensor_check(ctx, "v_out", v_out, 3, out_shape,
                                       CINFER__DTS(cinfer__tensor_dtype(v))));
    CINFER__CHECK(cinfer__tensor_check_distinct("v_out", v_out));
    if (lse_out) {
        const int64_t lse_out_shape[2] = {v->shape[0], v->shape[2]};
        CINFER__CHECK(cinfer__tensor_check(ctx, "lse_out", lse_out, 2, lse_out_shape,
                                           CINFER__DTS(CINFER__DT_F32)));
        CINFER__CHECK(cinfer__tensor_check_distinct("lse_out", lse_out));
    }
    CINFER__CHECK(check_dims("v", v->shape[2], v->shape[3]));
    if (v->shape[1] > 0x7fffffff)
        return cinfer__error(CINFER_STATUS_UNSUPPORTED, "v: %lld states per row, at most 2^31-1",
                             (long long)v->shape[1]);
    const cinfer__tensor_arg_t tensors[] = {
        {"v_out", v_out, false}, {"lse_out", lse_out, false}, {"v", v, false}, {"lse", lse, false}};
    CINFER__CHECK(cinfer__tensor_check_written(tensors, 2, CINFER__TENSOR_COUNT(tensors)));
    merge_launch_t m;
    memset(&m, 0, sizeof m);
    m.op = CINFER__OP_MERGE_STATES;
    m.dtype = cinfer__tensor_dtype(v);
    m.head_dim = (int)v->shape[3];
    m.aligned = aligned16(v, 4) && aligned16(v_out, 3);
    m.params.v_in[0] = cinfer__tensor_data(v);
    m.params.lse_in[0] = cinfer__tensor_data(lse);
    for (int i = 0; i < 3; i++) {
        m.params.v_in_stride[0][i] = cinfer__tensor_stride(v, i);
        m.params.lse_in_stride[0][i] = cinfer__tensor_stride(lse, i);
    }
    set_output(&m.params, v_out, lse_out);
    m.params.num_rows = v->shape[0];
    m.params.num_heads = (int)v->shape[2];
    m.params.num_states = (int)v->shape[1];
    return launch(ctx, &m, stream);
}
