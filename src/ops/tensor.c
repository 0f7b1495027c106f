#include <stdlib.h>
#include <string.h>

#include "ops/tensor.h"

/* DLPack's name of a device type (dlpack.h's DLDeviceType), for messages. */
static const char *dl_device_name(DLDeviceType type) {
    switch (type) {
    case kDLCPU:
        return "kDLCPU";
    case kDLCUDA:
        return "kDLCUDA";
    case kDLCUDAHost:
        return "kDLCUDAHost";
    case kDLCUDAManaged:
        return "kDLCUDAManaged";
    case kDLROCM:
        return "kDLROCM";
    default:
        return "another DLPack device type";
    }
}

/* DLPack 1.x codes for fp8 and bool, which the installed dlpack.h (0.6) may not name. */
#define CINFER__DL_BOOL          6
#define CINFER__DL_FLOAT8_E4M3FN 10
#define CINFER__DL_FLOAT8_E5M2   12

cinfer__dtype_t cinfer__tensor_dtype(const DLTensor *t) {
    const DLDataType d = t->dtype;
    if (d.lanes != 1)
        return CINFER__DT_NONE;
    if (d.code == kDLFloat && d.bits == 16)
        return CINFER__DT_F16;
    if (d.code == kDLBfloat && d.bits == 16)
        return CINFER__DT_BF16;
    if (d.code == kDLFloat && d.bits == 32)
        return CINFER__DT_F32;
    if (d.code == kDLInt && d.bits == 32)
        return CINFER__DT_I32;
    if ((d.code == kDLUInt || d.code == CINFER__DL_BOOL) && d.bits == 8)
        return CINFER__DT_U8;
    if (d.code == CINFER__DL_FLOAT8_E4M3FN && d.bits == 8)
        return CINFER__DT_E4M3;
    if (d.code == CINFER__DL_FLOAT8_E5M2 && d.bits == 8)
        return CINFER__DT_E5M2;
    return CINFER__DT_NONE;
}

void cinfer__shape_string(char *dst, size_t cap, int ndim, const int64_t *shape) {
    size_t n = 0;
    cinfer__fmt(dst, cap, "[");
    for (int i = 0; i < ndim; i++) {
        n = strlen(dst);
        if (shape[i] < 0)
            cinfer__fmt(dst + n, cap - n, "%s*", i ? ", " : "");
        else
            cinfer__fmt(dst + n, cap - n, "%s%lld", i ? ", " : "", (long long)shape[i]);
    }
    n = strlen(dst);
    cinfer__fmt(dst + n, cap - n, "]");
}

/* A dtype accepted as u8 is DLPack's uint8 or bool (1 byte): the messages say which. */
static const char *accepted_name(int dt) {
    return dt == CINFER__DT_U8 ? "u8 (uint8 or bool)" : cinfer__dtype_name((cinfer__dtype_t)dt);
}

/* The dtype of t as its messages name it: bool for DLPack's bool, else the accepted dtype's name,
 * or "unsupported". */
static const char *tensor_dtype_name(const DLTensor *t, cinfer__dtype_t dt) {
    if (dt == CINFER__DT_U8 && t->dtype.code == CINFER__DL_BOOL)
        return "bool";
    return dt ? cinfer__dtype_name(dt) : "unsupported";
}

static void dtype_list(char *dst, size_t cap, uint32_t dtypes) {
    dst[0] = '\0';
    for (int dt = 1; dt < CINFER__DT_COUNT; dt++) {
        if (!(dtypes & CINFER__DTS(dt)))
            continue;
        size_t n = strlen(dst);
        cinfer__fmt(dst + n, cap - n, "%s%s", n ? " or " : "", accepted_name(dt));
    }
}

int64_t cinfer__tensor_stride(const DLTensor *t, int dim) {
    if (t->strides)
        return t->strides[dim];
    int64_t s = 1;
    for (int i = t->ndim - 1; i > dim; i--)
        s *= t->shape[i];
    return s;
}

cinfer_status_t cinfer__tensor_check_dims(const char *arg, const DLTensor *t, int ndim) {
    if (!t)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT, "%s is NULL", arg);
    if (t->ndim < 0)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT, "%s: ndim %d, expected >= 0", arg,
                             t->ndim);
    if (t->ndim != ndim)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT, "%s: ndim %d, expected %d", arg,
                             t->ndim, ndim);
    if (ndim > 0 && !t->shape)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "%s: shape is NULL, expected %d dimensions", arg, ndim);
    /* extent: the product of the sizes with 0 taken as 1 (bounding compact strides too) */
    int64_t extent = 1;
    for (int i = 0; i < ndim; i++) {
        if (t->shape[i] < 0)
            return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                                 "%s: shape[%d] = %lld, expected a size >= 0", arg, i,
                                 (long long)t->shape[i]);
        const int64_t size = t->shape[i] > 0 ? t->shape[i] : 1;
        if (size > CINFER__TENSOR_MAX_ELEMENTS / extent) {
            char got[160];
            cinfer__shape_string(got, sizeof got, ndim, t->shape);
            return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                                 "%s: shape %s has more than 2^48 elements (sizes of 0 taken as "
                                 "1, as for compact strides), expected fewer (a tensor larger "
                                 "than any device's memory)",
                                 arg, got);
        }
        extent *= size;
    }
    /* The farthest element from the first, in elements, within the same bound (an empty
     * tensor's too: host code multiplies its strides by its sizes); so that no offset a check or
     * a kernel's parameters compute from the strides overflows. */
    if (t->strides) {
        int64_t span = 0;
        for (int i = 0; i < ndim; i++) {
            const int64_t st = t->strides[i], reach = t->shape[i] > 0 ? t->shape[i] - 1 : 0;
            const int64_t step = st < 0 ? (st < -CINFER__TENSOR_MAX_ELEMENTS ? -1 : -st) : st;
            if (step < 0 || step > CINFER__TENSOR_MAX_ELEMENTS ||
                (reach > 0 && step > (CINFER__TENSOR_MAX_ELEMENTS - span) / reach))
                return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                                     "%s: strides[%d] = %lld spans more than 2^48 elements, "
                                     "expected less (a view larger than any device's memory)",
                                     arg, i, (long long)st);
            span += step * reach;
        }
    }
    if (t->byte_offset > CINFER__TENSOR_MAX_BYTE_OFFSET ||
        (uintptr_t)t->data > UINTPTR_MAX - (uintptr_t)t->byte_offset)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "%s: byte_offset %llu with data %p, expected an offset of at most "
                             "2^56 bytes that keeps the address below 2^64",
                             arg, (unsigned long long)t->byte_offset, t->data);
    return CINFER_STATUS_SUCCESS;
}

cinfer_status_t cinfer__tensor_check_distinct(const char *arg, const DLTensor *t) {
    if (!t->strides)
        return CINFER_STATUS_SUCCESS;
    if (t->ndim > 8)
        return cinfer__error(CINFER_STATUS_UNSUPPORTED,
                             "%s: %d dims, expected at most 8 in a tensor the call writes", arg,
                             t->ndim);
    int dims[8], n = 0;
    for (int i = 0; i < t->ndim; i++)
        if (t->shape[i] > 1)
            dims[n++] = i;
    for (int i = 1; i < n; i++) /* insertion sort by |stride| (check_dims bounded them) */
        for (int j = i; j > 0 && llabs((long long)t->strides[dims[j]]) <
                                     llabs((long long)t->strides[dims[j - 1]]);
             j--) {
            const int d = dims[j];
            dims[j] = dims[j - 1];
            dims[j - 1] = d;
        }
    int64_t span = 0; /* the farthest element of the dims so far, in elements */
    for (int i = 0; i < n; i++) {
        const int d = dims[i];
        const int64_t step = llabs((long long)t->strides[d]);
        if (step == 0)
            return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                                 "%s: strides[%d] = 0 over %lld indices: the call writes this "
                                 "tensor, expected a stride that gives each index its own element",
                                 arg, d, (long long)t->shape[d]);
        if (step <= span)
            return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                                 "%s: strides[%d] = %lld lands inside the %lld elements that the "
                                 "dims of smaller strides span: the call writes this tensor, and "
                                 "two of its indices would name one element",
                                 arg, d, (long long)t->strides[d], (long long)span + 1);
        span += step * (t->shape[d] - 1);
    }
    return CINFER_STATUS_SUCCESS;
}

/* The checks after dims, shape and dtype: element alignment, a contiguous last dim, data where
 * there are elements, and the context's device. */
static cinfer_status_t check_layout(const cinfer_context_t *ctx, const char *arg, const DLTensor *t,
                                    int ndim, cinfer__dtype_t dt) {
    const size_t esz = cinfer__dtype_size(dt);
    if (esz > 1 && (uintptr_t)cinfer__tensor_data(t) % esz != 0)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "%s: data %p + byte_offset %llu is not aligned to its %zu-byte "
                             "elements",
                             arg, t->data, (unsigned long long)t->byte_offset, esz);
    if (ndim > 0 && t->shape[ndim - 1] > 1 && cinfer__tensor_stride(t, ndim - 1) != 1)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "%s: the last dimension must be contiguous (stride %lld, expected 1)",
                             arg, (long long)cinfer__tensor_stride(t, ndim - 1));
    if (!t->data) {
        int64_t count = 1; /* a 0-d tensor holds one element */
        for (int i = 0; i < ndim; i++)
            count *= t->shape[i];
        if (count > 0)
            return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT, "%s: data is NULL", arg);
    }
    if (ctx) {
        if (t->device.device_type != kDLCUDA || t->device.device_id != ctx->device)
            return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                                 "%s: on device type %d (%s) id %d, expected CUDA device %d "
                                 "(kDLCUDA)",
                                 arg, (int)t->device.device_type,
                                 dl_device_name(t->device.device_type), t->device.device_id,
                                 ctx->device);
    }
    return CINFER_STATUS_SUCCESS;
}

cinfer_status_t cinfer__tensor_check(const cinfer_context_t *ctx, const char *arg,
                                     const DLTensor *t, int ndim, const int64_t *shape,
                                     uint32_t dtypes) {
    CINFER__CHECK(cinfer__tensor_check_dims(arg, t, ndim));
    for (int i = 0; shape && i < ndim; i++) {
        if (shape[i] >= 0 && t->shape[i] != shape[i]) {
            char got[128], want[128];
            cinfer__shape_string(got, sizeof got, ndim, t->shape);
            cinfer__shape_string(want, sizeof want, ndim, shape);
            return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT, "%s: shape %s, expected %s", arg,
                                 got, want);
        }
    }
    cinfer__dtype_t dt = cinfer__tensor_dtype(t);
    if (!(dtypes & CINFER__DTS(dt))) {
        char want[96];
        dtype_list(want, sizeof want, dtypes);
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "%s: dtype (code %u, %u bits, %u lanes) is %s, expected %s", arg,
                             t->dtype.code, t->dtype.bits, t->dtype.lanes, tensor_dtype_name(t, dt),
                             want);
    }
    return check_layout(ctx, arg, t, ndim, dt);
}

cinfer_status_t cinfer__tensor_check_as(const cinfer_context_t *ctx, const char *arg,
                                        const DLTensor *t, int ndim, const int64_t *shape,
                                        cinfer__dtype_t dtype, cinfer_status_t dtype_status,
                                        cinfer_status_t shape_status, const char *origin) {
    if (!t)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT, "%s is NULL", arg);
    if (t->ndim != ndim)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT, "%s: ndim %d, expected %d (%s)", arg,
                             t->ndim, ndim, origin);
    CINFER__CHECK(cinfer__tensor_check_dims(arg, t, ndim));
    const cinfer__dtype_t dt = cinfer__tensor_dtype(t);
    if (dt != dtype)
        return cinfer__error(dtype_status, "%s: dtype %s (code %u, %u bits, %u lanes), expected %s",
                             arg, tensor_dtype_name(t, dt), t->dtype.code, t->dtype.bits,
                             t->dtype.lanes, accepted_name(dtype));
    for (int i = 0; i < ndim; i++) {
        if (shape[i] >= 0 && t->shape[i] != shape[i]) {
            char got[128], want[128];
            cinfer__shape_string(got, sizeof got, ndim, t->shape);
            cinfer__shape_string(want, sizeof want, ndim, shape);
            return cinfer__error(shape_status, "%s: shape %s, expected %s (%s)", arg, got, want,
                                 origin);
        }
    }
    return check_layout(ctx, arg, t, ndim, dt);
}

long long cinfer__tensor_step(const DLTensor *t, int dim) {
    return t->shape[dim] > 1 ? (long long)cinfer__tensor_stride(t, dim) : 0;
}

int cinfer__page_shift(int page_size) {
    for (int shift = 0; shift < 31; shift++)
        if (page_size == 1 << shift)
            return shift;
    return -1;
}

/* ---- overlap between tensors ---- */

/* Bytes per element: the dtype's bits times lanes, rounded up to whole bytes (at least one). */
static int64_t elem_bytes(const DLTensor *t) {
    const int64_t bits = (int64_t)t->dtype.bits * (t->dtype.lanes ? t->dtype.lanes : 1);
    return bits > 8 ? (bits + 7) / 8 : 1;
}

static bool is_empty(const DLTensor *t) {
    for (int i = 0; i < t->ndim; i++)
        if (t->shape[i] == 0)
            return true;
    return false;
}

bool cinfer__tensor_span(const DLTensor *t, uintptr_t *lo, uintptr_t *hi) {
    *lo = *hi = 0;
    if (is_empty(t))
        return false;
    /* check_dims bounded the reach of the strides by 2^48 elements, so these do not overflow. */
    const uint64_t esz = (uint64_t)elem_bytes(t);
    uint64_t below = 0, above = esz;
    for (int i = 0; i < t->ndim; i++) {
        const int64_t st = cinfer__tensor_stride(t, i), last = t->shape[i] - 1;
        if (st < 0)
            below += (uint64_t)(-st) * (uint64_t)last * esz;
        else
            above += (uint64_t)st * (uint64_t)last * esz;
    }
    const uintptr_t at = (uintptr_t)cinfer__tensor_data(t);
    *lo = at >= below ? at - below : 0; /* clamped: no device address is that low or high */
    *hi = at <= UINTPTR_MAX - above ? at + above : UINTPTR_MAX;
    return true;
}

/* A tensor's elements as sets of bytes: from `base`, every sum of index_k * stride[k] (bytes) for
 * index_k in [0, size[k]), each `elem` bytes wide. Dims of one index and stride 0 are dropped
 * (they add no element), negative strides turned around (base moves to the lowest element),
 * the rest sorted by stride, largest first; reach[k] is the bytes that dims k.. span, element
 * included. */
typedef struct elements {
    int n;
    int64_t elem, size[8], stride[8], reach[9];
    uint64_t base;
} elements_t;

/* false when t has more dims than elements_t holds (the caller then assumes the worst). */
static bool elements_of(const DLTensor *t, elements_t *e) {
    memset(e, 0, sizeof *e);
    e->elem = elem_bytes(t);
    uint64_t base = (uint64_t)(uintptr_t)cinfer__tensor_data(t);
    for (int i = 0; i < t->ndim; i++) {
        int64_t st = cinfer__tensor_stride(t, i) * e->elem;
        if (t->shape[i] <= 1 || st == 0)
            continue;
        if (e->n == 8)
            return false;
        if (st < 0) {
            st = -st;
            base -= (uint64_t)st * (uint64_t)(t->shape[i] - 1);
        }
        int k = e->n++;
        for (; k > 0 && e->stride[k - 1] < st; k--) { /* insertion, largest stride first */
            e->stride[k] = e->stride[k - 1];
            e->size[k] = e->size[k - 1];
        }
        e->stride[k] = st;
        e->size[k] = t->shape[i];
    }
    e->base = base;
    e->reach[e->n] = e->elem;
    for (int k = e->n - 1; k >= 0; k--)
        e->reach[k] = e->reach[k + 1] + e->stride[k] * (e->size[k] - 1);
    return true;
}

/* floor(a / b) and ceil(a / b) for b > 0. */
static int64_t div_floor(int64_t a, int64_t b) {
    return a / b - (a % b != 0 && a < 0);
}
static int64_t div_ceil(int64_t a, int64_t b) {
    return a / b + (a % b != 0 && a > 0);
}

/*
 * Whether a's elements from dim ka on, at byte 0, and b's from dim kb on, at byte d, share a
 * byte. The larger outer stride S is taken apart: when both tensors step by S there (views of one
 * parent), only rows whose offset j - i puts them within each other's reach can meet, at most
 * a few offsets, each the same question one dim down; otherwise each row of the one with the
 * larger stride that falls within the other's reach is asked about in turn. *budget bounds the
 * questions; when it runs out the answer is "they meet".
 */
static bool elements_meet(const elements_t *a, int ka, const elements_t *b, int kb, int64_t d,
                          int *budget) {
    if (--*budget < 0)
        return true;
    if (d >= a->reach[ka] || d + b->reach[kb] <= 0)
        return false;
    if (ka == a->n && kb == b->n)
        return true;
    const int64_t sa = ka < a->n ? a->stride[ka] : 0, sb = kb < b->n ? b->stride[kb] : 0;
    if (sa == sb) {
        /* Row i of a at i S, row j of b at d + j S meet only if -reach_b < d + (j - i) S <
         * reach_a (one dim down), with 0 <= i < size_a and 0 <= j < size_b. */
        const int64_t ra = a->reach[ka + 1], rb = b->reach[kb + 1];
        int64_t first = div_floor(-rb - d, sa) + 1, last = div_ceil(ra - d, sa) - 1;
        if (first < 1 - a->size[ka])
            first = 1 - a->size[ka];
        if (last > b->size[kb] - 1)
            last = b->size[kb] - 1;
        for (int64_t j = first; j <= last; j++)
            if (elements_meet(a, ka + 1, b, kb + 1, d + j * sa, budget))
                return true;
        return false;
    }
    if (sa > sb) { /* rows i of a, [i S, i S + reach), against all of b's [d, d + reach_b) */
        const int64_t ra = a->reach[ka + 1];
        int64_t first = div_floor(d - ra, sa) + 1, last = div_ceil(d + b->reach[kb], sa) - 1;
        if (first < 0)
            first = 0;
        if (last > a->size[ka] - 1)
            last = a->size[ka] - 1;
        for (int64_t i = first; i <= last; i++)
            if (elements_meet(a, ka + 1, b, kb, d - i * sa, budget))
                return true;
        return false;
    }
    /* rows j of b, [d + j S, d + j S + reach), against all of a's [0, reach_a) */
    const int64_t rb = b->reach[kb + 1];
    int64_t first = div_floor(-rb - d, sb) + 1, last = div_ceil(a->reach[ka] - d, sb) - 1;
    if (first < 0)
        first = 0;
    if (last > b->size[kb] - 1)
        last = b->size[kb] - 1;
    for (int64_t j = first; j <= last; j++)
        if (elements_meet(a, ka, b, kb + 1, d + j * sb, budget))
            return true;
    return false;
}

/* The questions elements_meet may ask before it assumes the worst: enough for views of one
 * parent (a few offsets per dim) and for a tensor interleaved with a few hundred rows of
 * another, and still only microseconds of host time in a run call. */
#define OVERLAP_BUDGET 1024

bool cinfer__tensor_overlap(const DLTensor *a, const DLTensor *b) {
    uintptr_t alo, ahi, blo, bhi;
    if (!cinfer__tensor_span(a, &alo, &ahi) || !cinfer__tensor_span(b, &blo, &bhi))
        return false;
    if (ahi <= blo || bhi <= alo)
        return false;
    elements_t ea, eb;
    if (!elements_of(a, &ea) || !elements_of(b, &eb))
        return true;
    /* The spans meet, so the bases are within 2^52 bytes of each other (2^48 elements of at
     * most 16 bytes each side): their difference fits an int64. */
    const int64_t d = (int64_t)(eb.base - ea.base);
    int budget = OVERLAP_BUDGET;
    return elements_meet(&ea, 0, &eb, 0, d, &budget);
}

bool cinfer__tensor_same(const DLTensor *a, const DLTensor *b) {
    if (cinfer__tensor_data(a) != cinfer__tensor_data(b) || a->ndim != b->ndim ||
        elem_bytes(a) != elem_bytes(b))
        return false;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i] || cinfer__tensor_step(a, i) != cinfer__tensor_step(b, i))
            return false;
    return true;
}

cinfer_status_t cinfer__tensor_check_disjoint(const char *arg, const DLTensor *t,
                                              const cinfer__tensor_arg_t *others, int n) {
    if (!t)
        return CINFER_STATUS_SUCCESS;
    for (int i = 0; i < n; i++) {
        const cinfer__tensor_arg_t *o = &others[i];
        if (!o->t || !cinfer__tensor_overlap(t, o->t) ||
            (o->same_ok && cinfer__tensor_same(t, o->t)))
            continue;
        uintptr_t lo, hi, olo, ohi;
        cinfer__tensor_span(t, &lo, &hi);
        cinfer__tensor_span(o->t, &olo, &ohi);
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "%s: [%p, %p) overlaps %s [%p, %p); the call writes %s, expected it "
                             "not to overlap %s%s%s%s",
                             arg, (void *)lo, (void *)hi, o->name, (void *)olo, (void *)ohi, arg,
                             o->name, o->same_ok ? ", or to be " : "", o->same_ok ? o->name : "",
                             o->same_ok ? " exactly (same data, shape and strides: in place)" : "");
    }
    return CINFER_STATUS_SUCCESS;
}

cinfer_status_t cinfer__tensor_check_written(const cinfer__tensor_arg_t *tensors, int num_written,
                                             int n) {
    for (int i = 0; i < num_written && i < n; i++)
        CINFER__CHECK(cinfer__tensor_check_disjoint(tensors[i].name, tensors[i].t, tensors + i + 1,
                                                    n - i - 1));
    return CINFER_STATUS_SUCCESS;
}

cinfer_status_t cinfer__tensor_check_workspace(const void *workspace, size_t bytes,
                                               const cinfer__tensor_arg_t *tensors, int n) {
    int64_t size = (int64_t)bytes;
    DLTensor ws;
    memset(&ws, 0, sizeof ws);
    ws.data = (void *)(uintptr_t)workspace;
    ws.ndim = 1;
    ws.shape = &size;
    ws.dtype.code = kDLUInt;
    ws.dtype.bits = 8;
    ws.dtype.lanes = 1;
    return cinfer__tensor_check_disjoint("workspace", &ws, tensors, n);
}
