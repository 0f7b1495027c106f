/* Internals of MLA (src/ops/mla.c) that tests use. */
#ifndef CINFER_OPS_MLA_H
#define CINFER_OPS_MLA_H

#include <stdbool.h>

#include "core/core.h"
#include "jit/spec.h"

/* The specs of the attention and merge kernels an MLA object of options o and causal flag loads
 * (options checked as by create); for ahead-of-time builds. */
cinfer_status_t cinfer__batch_mla_specs(const cinfer_mla_options_t *o, int causal,
                                        cinfer__spec_t *attention, cinfer__spec_t *merge);

/* Whether op's current plan splits the KV (the merge kernel runs); false without a plan. */
bool cinfer__batch_mla_split(const cinfer_batch_mla_t *op);

#endif
