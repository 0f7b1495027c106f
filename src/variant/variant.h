/*
 * Attention variants (include/cinfer.h, "Attention variants"): the object behind cinfer_variant_t,
 * the generated parameter struct, and the packing of a run's argument list into that struct.
 */
#ifndef CINFER_VARIANT_VARIANT_H
#define CINFER_VARIANT_VARIANT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cuda/context.h"
#include "jit/spec.h"

#define CINFER__VARIANT_MAX_PARAMS 32
#define CINFER__VARIANT_NAME_MAX   64
/* The largest packed parameter struct: 32 members of at most 8 bytes. */
#define CINFER__VARIANT_MAX_BYTES (CINFER__VARIANT_MAX_PARAMS * 8)

/* Hook switches the host must know (read from the source's #defines, and checked by the kernel
 * with #error, so a source that sets them some other way fails to compile rather than running
 * with a wrong plan). */
enum {
    CINFER__VARIANT_NO_SOFTMAX = 1u << 0,       /* #define VARIANT_USE_SOFTMAX 0 */
    CINFER__VARIANT_OUTPUT_TRANSFORM = 1u << 1, /* #define VARIANT_OUTPUT_TRANSFORM 1 */
    /* logits go through hooks in natural-log units: VARIANT_LOGITS_TRANSFORM 1,
     * VARIANT_LOGITS_MASK 1, VARIANT_LOGITS_MASK_BITS 1, VARIANT_LOGITS_MASK_ROW 1,
     * VARIANT_ALIBI_SLOPE 1 or VARIANT_USE_SOFTMAX 0; the kernel's q_scale then has no log2(e) */
    CINFER__VARIANT_LOGITS = 1u << 2,
    /* the hooks the sm90 prefill kernel has (kernels/prefill_sm90.cuh): the source names none of
     * VARIANT_LOGITS_TRANSFORM, VARIANT_QUERY_TRANSFORM, VARIANT_OUTPUT_TRANSFORM and
     * VARIANT_USE_SOFTMAX, and of the masks only VARIANT_LOGITS_MASK_ROW, defined 1 (ALiBi
     * slopes, masks in row form and state inits); the kernel's #error stops a source that defines
     * them some other way */
    CINFER__VARIANT_SM90 = 1u << 3,
    /* #define VARIANT_ALIBI_SLOPE 1: the prefill kernels start Q K^T's accumulators at the bias in
     * q . k units, slope / q_scale (ops/prefill.c bounds q_scale for it) */
    CINFER__VARIANT_ALIBI_SLOPE = 1u << 4,
};

/* What a built-in variant's parameter must hold, checked when a run packs its arguments (a user
 * variant's tensors are its own to size: its source indexes them). */
enum {
    CINFER__VARIANT_SIZE_ANY = 0,
    CINFER__VARIANT_SIZE_QO_HEADS, /* a 1-d tensor of at least num_qo_heads elements */
    CINFER__VARIANT_SIZE_BATCH,    /* a 1-d tensor of at least batch_size elements */
    CINFER__VARIANT_SIZE_POSITIVE, /* an int32 scalar >= 1 */
};

struct cinfer_variant {
    char name[CINFER__VARIANT_NAME_MAX];
    char *source;
    int num_params;
    cinfer_param_t params[CINFER__VARIANT_MAX_PARAMS];
    char param_names[CINFER__VARIANT_MAX_PARAMS][CINFER__VARIANT_NAME_MAX];
    size_t offsets[CINFER__VARIANT_MAX_PARAMS];      /* byte offset of each member in the struct */
    size_t struct_bytes;                             /* sizeof the generated struct */
    uint32_t hooks;                                  /* CINFER__VARIANT_* */
    uint64_t id;                                     /* XXH3-64 of name, declaration and source */
    unsigned char sizes[CINFER__VARIANT_MAX_PARAMS]; /* CINFER__VARIANT_SIZE_* (built-ins) */
    bool builtin;
};

/* The id that identifies a variant's content in specs (0 for default attention). */
static inline uint64_t cinfer__variant_id(const cinfer_variant_t *v) {
    return v ? v->id : 0;
}

/* Appends the generated `cinfer_variant_params` struct and the variant's source (after a #line
 * directive naming "variant:NAME") to a kernel's prelude. */
void cinfer__variant_render(const cinfer_variant_t *v, cinfer__str_t *prelude);

/*
 * Packs a run's argument list into the kernel's variant struct: checks it against the declaration
 * (count, order, kind, dtype, NULL only for maybe_ tensors, tensors on ctx's device and
 * contiguous; a built-in's sizes against the run's num_qo_heads and batch_size), then writes the
 * members at their offsets. v = NULL (default attention) takes no arguments and packs 4 zero
 * bytes. `op` names the operation in messages. *bytes receives the struct size. INVALID_ARGUMENT
 * names the argument and what was expected.
 */
cinfer_status_t cinfer__variant_pack(const cinfer_variant_t *v, const cinfer_args_t *args,
                                     int64_t num_qo_heads, int64_t batch_size,
                                     const cinfer_context_t *ctx, const char *op,
                                     unsigned char blob[CINFER__VARIANT_MAX_BYTES], size_t *bytes);

/* After cinfer__variant_pack: the outputs out and lse (NULL: none) must not overlap the variant's
 * tensor arguments, which the kernels read (or, like dump_logits' logits, write); INVALID_ARGUMENT
 * naming the parameter otherwise (cinfer__tensor_check_disjoint). */
cinfer_status_t cinfer__variant_check_disjoint(const cinfer_variant_t *v, const cinfer_args_t *args,
                                               const DLTensor *out, const DLTensor *lse);

/* A variant without softmax has no LSE: lse must be NULL (INVALID_ARGUMENT naming `op`). */
cinfer_status_t cinfer__variant_lse_check(const cinfer_variant_t *v, const DLTensor *lse,
                                          const char *op);

/* Checks the variant options shared by every attention operation: a custom variant takes no
 * logits_soft_cap. */
cinfer_status_t cinfer__variant_options_check(const cinfer_attention_options_t *o);

/* The built-in variant with this name, or NULL. */
const cinfer_variant_t *cinfer__variant_builtin(const char *name, size_t len);

#endif
