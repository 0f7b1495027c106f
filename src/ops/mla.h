/* Internals of MLA (src/ops/mla.c) that tests use. */
#ifndef CINFER_OPS_MLA_H
#define CINFER_OPS_MLA_H

#include <stdbool.h>

#include "core/core.h"
#include "jit/spec.h"

/* The specs of the attention and merge kernels an MLA object of options o and causal flag loads
 * on a device of arch ("sm_90a", "sm_80", ...; options checked as by create); for ahead-of-time
 * builds. */
cinfer_status_t cinfer__batch_mla_specs(const cinfer_mla_options_t *o, int causal, const char *arch,
                                        cinfer__spec_t *attention, cinfer__spec_t *merge);

/* Tests: with on, MLA objects created afterwards use the mma.sync kernel on sm_90a too. */
void cinfer__mla_test_no_sm90(bool on);

/* Whether op's current plan splits the KV (the merge kernel runs); false without a plan. */
bool cinfer__batch_mla_split(const cinfer_batch_mla_t *op);

#endif
