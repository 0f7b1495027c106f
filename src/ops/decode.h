/* Decode internals other parts of the library and the tool use. */
#ifndef CINFER_OPS_DECODE_H
#define CINFER_OPS_DECODE_H

#include "cuda/context.h"
#include "decode_params.h"
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

/*
 * Launches a merge kernel (`merge`, loaded on ctx's current context, taking one parameter struct
 * at `params`) over `grid` blocks of `threads` on stream. On sm_90 and later it is a programmatic
 * dependent launch of the kernel before it on the stream: its blocks start while that kernel
 * runs, read their schedule, then wait in griddepcontrol.wait until it has finished and its
 * partial states are visible (the kernel before it lets them start with
 * griddepcontrol.launch_dependents, or by finishing). `what` names the launch in the error
 * message. Decode's, batch prefill's and MLA's merges launch through it.
 */
cinfer_status_t cinfer__launch_merge(const cinfer_context_t *ctx, CUfunction merge, int64_t grid,
                                     unsigned threads, void *params, CUstream stream,
                                     const char *what);

#endif
