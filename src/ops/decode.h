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

#endif
