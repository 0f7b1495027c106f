/* Padded test views ("fields"); see field.h. */
#include "support/field.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

void *cinfer_test_xmalloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p)
        cinfer_test_fail_at(__FILE__, __LINE__, "out of host memory (%zu bytes)", bytes);
    return p;
}

/* Element index in the allocation of element `flat` (row-major) of the view. */
int64_t field_phys(const field_t *f, int64_t flat) {
    int64_t p = f->origin;
    for (int k = f->ndim - 1; k >= 0; k--) {
        p += (flat % f->shape[k]) * f->stride[k];
        flat /= f->shape[k];
    }
    return p;
}

/* (Re)builds f->tensor from the field's geometry; error tests mutate it afterwards. */
DLTensor *field_tensor(field_t *f) {
    return cinfer_test_tensor_init(&f->tensor, &f->buf, f->shift, (uint64_t)f->origin * f->esize,
                                   f->dtype, f->ndim, f->shape, f->strided ? f->stride : NULL);
}

/* Allocates a view of `shape` laid out as `lay`; the payload starts poisoned (host and device). */
void field_make(field_t *f, cinfer__dtype_t dtype, int ndim, const int64_t *shape,
                const layout_t *lay) {
    memset(f, 0, sizeof *f);
    f->dtype = dtype;
    f->esize = cinfer__dtype_size(dtype);
    f->ndim = ndim;
    f->shift = lay->shift;
    f->count = 1;
    f->phys_count = 1;
    for (int k = 0; k < ndim; k++) {
        if (lay->off[k] < 0 || lay->off[k] > lay->pad[k])
            cinfer_test_fail_at(__FILE__, __LINE__, "layout: off %" PRId64 " > pad %" PRId64,
                                lay->off[k], lay->pad[k]);
        f->shape[k] = shape[k];
        f->phys[k] = shape[k] + lay->pad[k];
        f->count *= shape[k];
        f->phys_count *= f->phys[k];
        if (lay->pad[k] != 0)
            f->strided = 1;
    }
    for (int k = ndim - 1; k >= 0; k--)
        f->stride[k] = k == ndim - 1 ? 1 : f->stride[k + 1] * f->phys[k + 1];
    for (int k = 0; k < ndim; k++)
        f->origin += lay->off[k] * f->stride[k];
    f->bytes = f->shift + (size_t)f->phys_count * f->esize;
    CINFER_TEST_OK(cinfer_test_buf_alloc(&f->buf, f->bytes));
    f->host = cinfer_test_xmalloc(f->bytes);
    f->before = cinfer_test_xmalloc(f->bytes);
    f->inview = cinfer_test_xmalloc((size_t)f->phys_count);
    memset(f->host, CINFER_TEST_POISON_BYTE, f->bytes);
    memset(f->before, CINFER_TEST_POISON_BYTE, f->bytes);
    memset(f->inview, 0, (size_t)f->phys_count);
    for (int64_t i = 0; i < f->count; i++)
        f->inview[field_phys(f, i)] = 1;
    field_tensor(f);
}

void field_free(field_t *f) {
    cinfer_test_buf_free(&f->buf);
    free(f->host);
    free(f->before);
    free(f->inview);
    memset(f, 0, sizeof *f);
}

double field_get(const field_t *f, int64_t flat) {
    return cinfer_test_load(f->dtype, f->host + f->shift, field_phys(f, flat));
}

void field_set(field_t *f, int64_t flat, double x) {
    cinfer_test_store(f->dtype, f->host + f->shift, field_phys(f, flat), x);
}

/* Random values in [lo, hi] in every element of the allocation, so padding holds finite data
 * that would show up in the output if a kernel read it. */
void field_fill(field_t *f, cinfer_test_rng *rng, double lo, double hi) {
    cinfer_test_fill_uniform(rng, f->dtype, f->phys_count, lo, hi, f->host + f->shift, NULL);
}

/* Uploads the host mirror; it becomes the "before" state. */
void field_upload(field_t *f) {
    CINFER_TEST_OK(cinfer_test_buf_upload(&f->buf, 0, f->host, f->bytes));
    memcpy(f->before, f->host, f->bytes);
}

void field_download(field_t *f) {
    CINFER_TEST_OK(cinfer_test_buf_download(&f->buf, 0, f->host, f->bytes));
}
