/*
 * "Fields": test tensors that are views into larger, padded device allocations, with a host mirror
 * of the whole allocation, so a test can check both the view (against the reference) and that
 * nothing outside it changed. Shared by the GPU suites; the payload starts poisoned.
 */
#ifndef CINFER_TESTS_SUPPORT_FIELD_H
#define CINFER_TESTS_SUPPORT_FIELD_H

#include "support/gpu.h"

#define FIELD_MAX_DIMS 5

/* malloc that fails the current test instead of returning NULL (0 bytes gives a 1-byte block). */
void *cinfer_test_xmalloc(size_t bytes);

/* Where a view lies inside its allocation. */
typedef struct layout {
    int64_t pad[FIELD_MAX_DIMS]; /* the allocation is shape + pad elements in each dim */
    int64_t off[FIELD_MAX_DIMS]; /* the view starts at off in each dim (off <= pad) */
    size_t shift; /* bytes the data pointer is moved by (2 breaks 16-byte alignment) */
} layout_t;

typedef struct field {
    cinfer__dtype_t dtype;
    size_t esize;
    int ndim;
    int64_t shape[FIELD_MAX_DIMS];  /* the view */
    int64_t phys[FIELD_MAX_DIMS];   /* the allocation */
    int64_t stride[FIELD_MAX_DIMS]; /* compact strides of the allocation, in elements */
    int64_t origin;                 /* element index of the view's first element */
    int strided;                    /* pass explicit strides (else NULL: compact) */
    size_t shift;
    int64_t count;      /* elements in the view */
    int64_t phys_count; /* elements in the allocation */
    size_t bytes;       /* shift + phys_count * esize: the payload */
    cinfer_test_buf buf;
    unsigned char *host;   /* the payload as last uploaded or downloaded */
    unsigned char *before; /* the payload as it was before the call under test */
    unsigned char *inview; /* [phys_count]: 1 for elements of the view */
    cinfer_test_tensor tensor;
} field_t;

/* Element index in the allocation of element `flat` (row-major) of the view. */
int64_t field_phys(const field_t *f, int64_t flat);
/* (Re)builds f->tensor from the field's geometry; error tests mutate it afterwards. */
DLTensor *field_tensor(field_t *f);
/* Allocates a view of `shape` laid out as `lay`; the payload starts poisoned (host and device). */
void field_make(field_t *f, cinfer__dtype_t dtype, int ndim, const int64_t *shape,
                const layout_t *lay);
void field_free(field_t *f);
/* Element `flat` of the view in the host mirror, as a double / stored from one. */
double field_get(const field_t *f, int64_t flat);
void field_set(field_t *f, int64_t flat, double x);
/* Random values in [lo, hi] in every element of the allocation, so padding holds finite data
 * that would show up in the output if a kernel read it. */
void field_fill(field_t *f, cinfer_test_rng *rng, double lo, double hi);
/* Uploads the host mirror; it becomes the "before" state. */
void field_upload(field_t *f);
void field_download(field_t *f);

#endif
