/*
 * The specs of the page-table kernels (kernels/append.cu), shared by src/ops/append.c and the
 * tool, which compiles them without a device (`cinfer bench serve` on a machine without a GPU).
 */
#ifndef CINFER_OPS_APPEND_H
#define CINFER_OPS_APPEND_H

#include <stdbool.h>

#include "jit/spec.h"

/* The append_paged_kv_cache kernel for src_dtype rows of head_dim elements into a cache_dtype
 * cache; vec = the 16-byte row path (head_dim % 8 == 0 and aligned rows). */
void cinfer__append_kernel_spec(cinfer__dtype_t src_dtype, cinfer__dtype_t cache_dtype,
                                int head_dim, bool vec, cinfer__spec_t *spec);

/* The get_seq_lens kernel. */
void cinfer__seq_lens_kernel_spec(cinfer__spec_t *spec);

/* The get_batch_indices_positions kernel. */
void cinfer__batch_indices_positions_kernel_spec(cinfer__spec_t *spec);

#endif
