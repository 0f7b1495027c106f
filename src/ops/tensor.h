/* Checking DLTensor arguments: one place that turns a bad tensor into a precise message. */
#ifndef CINFER_OPS_TENSOR_H
#define CINFER_OPS_TENSOR_H

#include "cuda/context.h"
#include "jit/spec.h"

/* Bit set of accepted dtypes: 1u << cinfer__dtype_t. */
#define CINFER__DTS(dt)  (1u << (dt))
#define CINFER__DTS_HALF (CINFER__DTS(CINFER__DT_F16) | CINFER__DTS(CINFER__DT_BF16))

/* The cinfer dtype of a tensor, or CINFER__DT_NONE if it has none (e.g. int64). */
cinfer__dtype_t cinfer__tensor_dtype(const DLTensor *t);

/* The most elements a tensor argument may hold, and the farthest its strides may reach (in
 * elements): 2^48, beyond any device's memory, so that sizes and offsets computed from shapes and
 * strides (times an element size, a tile's rows, ...) cannot overflow int64. */
#define CINFER__TENSOR_MAX_ELEMENTS (INT64_C(1) << 48)
/* The largest byte_offset a tensor argument may carry: 2^56 bytes, past any device's address
 * space (a larger one, or one that carries data past 2^64, is refused). */
#define CINFER__TENSOR_MAX_BYTE_OFFSET (UINT64_C(1) << 56)

/*
 * The first check of a tensor argument named `arg`, before anything reads its shape: not NULL,
 * `ndim` dimensions, a shape array (where ndim > 0), no negative size, at most
 * CINFER__TENSOR_MAX_ELEMENTS elements and strides that reach no farther, a byte_offset of at most
 * CINFER__TENSOR_MAX_BYTE_OFFSET that does not carry data past 2^64. INVALID_ARGUMENT with a
 * message like "q: shape[0] = -4, expected a size >= 0".
 */
cinfer_status_t cinfer__tensor_check_dims(const char *arg, const DLTensor *t, int ndim);

/*
 * Checks one tensor argument named `arg`: cinfer__tensor_check_dims, on the context's device (ctx
 * may be NULL to skip), ndim, shape (-1 = any), dtype in `dtypes`, last dim contiguous. Returns
 * INVALID_ARGUMENT with a message like "v_a: shape [4, 8, 100], expected [4, 8, 128]".
 */
cinfer_status_t cinfer__tensor_check(const cinfer_context_t *ctx, const char *arg,
                                     const DLTensor *t, int ndim, const int64_t *shape,
                                     uint32_t dtypes);

/*
 * cinfer__tensor_check for one dtype, its shape and dtype errors given their own statuses (e.g.
 * PLAN_MISMATCH for a shape a plan fixed) and `origin`, where the expected shape comes from, in
 * the ndim and shape messages: NULL, ndim and dims (INVALID_ARGUMENT), dtype (dtype_status),
 * shape with -1 = any (shape_status), then the rest of cinfer__tensor_check.
 */
cinfer_status_t cinfer__tensor_check_as(const cinfer_context_t *ctx, const char *arg,
                                        const DLTensor *t, int ndim, const int64_t *shape,
                                        cinfer__dtype_t dtype, cinfer_status_t dtype_status,
                                        cinfer_status_t shape_status, const char *origin);

/*
 * For a tensor the call writes (after its cinfer__tensor_check): no two of its indices may name
 * one element, or the kernels' stores would race. Over the dims of more than one index, taken by
 * increasing |stride|, each |stride| must pass the span of the dims before it (PyTorch's rule for
 * written-to tensors; it also refuses some distinct layouts, e.g. interleaved ones). Compact
 * strides always pass. INVALID_ARGUMENT naming the two dims otherwise.
 */
cinfer_status_t cinfer__tensor_check_distinct(const char *arg, const DLTensor *t);

/*
 * The bytes a tensor's elements occupy, from its lowest byte to one past its highest (data +
 * byte_offset, moved by every dim's stride times its last index, negative strides included, plus
 * the element's bytes); false for an empty tensor (a size of 0), which occupies none. After
 * cinfer__tensor_check_dims.
 */
bool cinfer__tensor_span(const DLTensor *t, uintptr_t *lo, uintptr_t *hi);

/*
 * Whether some byte of an element of a is a byte of an element of b (after
 * cinfer__tensor_check_dims of both). Spans that do not meet never overlap; spans that meet are
 * taken apart dim by dim, largest stride first, so that views that interleave without sharing an
 * element (the q and k slices of a packed QKV tensor, the K and V halves of a combined cache)
 * are told apart from views that share one. A layout too tangled to settle within a small
 * budget of steps counts as overlapping.
 */
bool cinfer__tensor_overlap(const DLTensor *a, const DLTensor *b);

/* Whether a and b name the same elements in the same order: the same data + byte_offset, ndim,
 * shape, element size and stride in every dim of more than one index (an exact, in-place alias). */
bool cinfer__tensor_same(const DLTensor *a, const DLTensor *b);

/* Another tensor argument of a call, for cinfer__tensor_check_disjoint. */
typedef struct cinfer__tensor_arg {
    const char *name;
    const DLTensor *t; /* NULL: not given, nothing to check */
    bool same_ok;      /* the written tensor may be this one exactly (cinfer__tensor_same) */
} cinfer__tensor_arg_t;

/*
 * For a tensor the call writes (`arg`, after its own checks; NULL passes): it must share no byte
 * with any of the call's `n` other tensors, inputs or outputs, except that it may be exactly one
 * marked same_ok (an in-place call), or a kernel would read what another part of it already
 * overwrote. INVALID_ARGUMENT naming both and their bytes otherwise, like "v_out: [0x..,
 * 0x..) overlaps v_a [0x.., 0x..); expected v_out not to overlap v_a, or to be v_a exactly".
 */
cinfer_status_t cinfer__tensor_check_disjoint(const char *arg, const DLTensor *t,
                                              const cinfer__tensor_arg_t *others, int n);

/* The number of entries of an array of cinfer__tensor_arg_t (the `n` of the two checks below). */
#define CINFER__TENSOR_COUNT(tensors) ((int)(sizeof(tensors) / sizeof((tensors)[0])))

/*
 * The tensors of a call, the first num_written of them written by it: each written one must pass
 * cinfer__tensor_check_disjoint against every tensor after it (the later outputs, the inputs), as
 * `tensors[i].name`. NULL tensors pass.
 */
cinfer_status_t cinfer__tensor_check_written(const cinfer__tensor_arg_t *tensors, int num_written,
                                             int n);

/*
 * For a device workspace of `bytes` bytes that a call writes (the schedule, split-KV partial
 * states): none of the call's `n` tensors may overlap it (cinfer__tensor_check_disjoint, the
 * workspace named "workspace").
 */
cinfer_status_t cinfer__tensor_check_workspace(const void *workspace, size_t bytes,
                                               const cinfer__tensor_arg_t *tensors, int n);

/* Stride of dim in elements (compact strides when t->strides is NULL). */
int64_t cinfer__tensor_stride(const DLTensor *t, int dim);

/* The stride a kernel steps dim by: cinfer__tensor_stride, or 0 when the dim has at most one
 * index (the kernel never moves along it, so an arbitrary stride there must not matter). */
long long cinfer__tensor_step(const DLTensor *t, int dim);

/* log2(page_size) when a paged cache's page size is a power of two (kernels then shift and mask),
 * else -1 (they divide). */
int cinfer__page_shift(int page_size);

/* data + byte_offset, added as addresses (a device pointer is not an object of this process, and
 * NULL + offset is not defined on pointers). */
static inline void *cinfer__tensor_data(const DLTensor *t) {
    return (void *)((uintptr_t)t->data + (uintptr_t)t->byte_offset);
}

/* Writes "[a, b, c]" of a shape, a negative size (an expected shape's "any") as "*". */
void cinfer__shape_string(char *dst, size_t cap, int ndim, const int64_t *shape);

#endif
