/* Internals of MLA (src/ops/mla.c) that tests use. */
#ifndef CINFER_OPS_MLA_H
#define CINFER_OPS_MLA_H

#include <stdbool.h>

#include "core/core.h"

/* Whether op's current plan splits the KV (the merge kernel runs); false without a plan. */
bool cinfer__batch_mla_split(const cinfer_batch_mla_t *op);

#endif
