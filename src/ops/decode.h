/* Decode internals other parts of the library and the tool use. */
#ifndef CINFER_OPS_DECODE_H
#define CINFER_OPS_DECODE_H

#include "jit/spec.h"

/*
 * The specs of the kernels a decode with these options runs (batch: paged batch decode, else
 * single decode) and the attention kernel's dynamic shared memory in bytes, without a device:
 * what create loads, what `cinfer demo` and ahead-of-time builds compile. Validates the options.
 */
cinfer_status_t cinfer__decode_kernel_specs(const cinfer_attention_options_t *o, bool batch,
                                            cinfer__spec_t *attention, cinfer__spec_t *merge,
                                            unsigned *attention_smem);

/*
 * The spec of the split-KV merge kernel (kernels/decode.cu, CINFER_OP_DECODE_MERGE) for outputs of
 * dtype (fp16 or bf16) and head_dim (a multiple of 8, at most 256). Batch decode and batch prefill
 * both fold their float32 partial states with it.
 */
cinfer_status_t cinfer__decode_merge_spec(cinfer__dtype_t dtype, int head_dim,
                                          cinfer__spec_t *spec);

#endif
