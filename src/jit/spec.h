/*
 * Kernel specs: the plain description of one kernel, and the one renderer that turns it into the
 * source NVRTC compiles (prelude + family template), the cache key and the readable kernel name.
 * The three come from the same function, so they can never disagree.
 */
#ifndef CINFER_JIT_SPEC_H
#define CINFER_JIT_SPEC_H

#include <stdbool.h>
#include <stdint.h>

#include "core/core.h"

/* Element types, shared by specs and tensor checks. The values are the CINFER_DT_* macros the
 * kernels see (kernels/dtype.cuh). */
typedef enum cinfer__dtype {
    CINFER__DT_NONE = 0,
    CINFER__DT_F16 = 1,
    CINFER__DT_BF16 = 2,
    CINFER__DT_F32 = 3,
    CINFER__DT_E4M3 = 4,
    CINFER__DT_E5M2 = 5,
    CINFER__DT_I32 = 6,
    CINFER__DT_U8 = 7,
    CINFER__DT_COUNT
} cinfer__dtype_t;

const char *cinfer__dtype_name(cinfer__dtype_t dt); /* "bf16", ... */
size_t cinfer__dtype_size(cinfer__dtype_t dt);      /* bytes per element */

/* The operation (kernel family) a spec describes. */
typedef enum cinfer__op {
    CINFER__OP_MERGE_STATE = 0,
    CINFER__OP_MERGE_STATE_IN_PLACE,
    CINFER__OP_MERGE_STATES,
    CINFER__OP_DECODE,
    CINFER__OP_DECODE_MERGE,
    CINFER__OP_DECODE_TC,
    CINFER__OP_PREFILL,
    CINFER__OP_APPEND_PAGED_KV_CACHE,
    CINFER__OP_BATCH_INDICES_POSITIONS,
    CINFER__OP_SEQ_LENS,
    CINFER__OP_ROPE,
    CINFER__OP_ROPE_POS_IDS,
    CINFER__OP_ROPE_COS_SIN_CACHE,
    CINFER__OP_PACKBITS,
    CINFER__OP_SEGMENT_PACKBITS_INDPTR,
    CINFER__OP_SEGMENT_PACKBITS,
    CINFER__OP_MLA,
    CINFER__OP_MLA_MERGE,
    CINFER__OP_COUNT
} cinfer__op_t;

typedef enum cinfer__backend {
    CINFER__BACKEND_SIMT = 0, /* CUDA cores only */
    CINFER__BACKEND_SM80 = 1, /* FA2-style mma.sync, sm_80 and later */
    CINFER__BACKEND_SM90 = 2, /* FA3-style wgmma/TMA, sm_90a */
} cinfer__backend_t;

typedef enum cinfer__layout { CINFER__LAYOUT_NHD = 0, CINFER__LAYOUT_HND = 1 } cinfer__layout_t;
/* The masks a kernel applies by position alone. A custom mask is data passed at run time: the
 * custom_mask variant (variant/), not a value of this field. */
typedef enum cinfer__mask { CINFER__MASK_NONE = 0, CINFER__MASK_CAUSAL } cinfer__mask_t;
typedef enum cinfer__pos {
    CINFER__POS_NONE = 0,
    CINFER__POS_ROPE_LLAMA,
    CINFER__POS_ALIBI
} cinfer__pos_t;

/* Switches compiled into a kernel only when used. */
enum { CINFER__FLAG_SOFT_CAP = 1u << 0, CINFER__FLAG_WINDOW = 1u << 1 };

/*
 * One kernel. Build it with cinfer__spec_init (which zeroes every byte, padding included) and set
 * only the fields its family uses; cinfer__spec_normalize clears the others, so two specs of the
 * same kernel compare equal with memcmp and render the same key.
 */
typedef struct cinfer__spec {
    cinfer__op_t op;
    cinfer__backend_t backend;
    cinfer__dtype_t dtype_q, dtype_kv, dtype_o;
    int32_t head_dim_qk, head_dim_vo;
    cinfer__layout_t layout;
    int32_t paged; /* K/V in a paged cache (decode, batch prefill) */
    int32_t batch; /* prefill: 1 = a batch from a planned work list, 0 = one request */
    cinfer__mask_t mask;
    cinfer__pos_t pos;
    uint32_t flags;
    int32_t tile_q, tile_kv, warps, stages; /* tile configuration; meaning is per family */
    int32_t vec; /* elements per vector access (1 when inputs are not 16-byte aligned) */
    /* batch prefill: 0, or the GQA group size G (query heads per KV head) whose query heads a CTA
     * packs into its tile rows (kernels/prefill.cu, "GQA packing") */
    int32_t gqa_pack;
    /* The attention variant: NULL and 0 = default attention; else the variant object and its
     * content id (so a spec never matches a different variant allocated at the same address). */
    const cinfer_variant_t *variant;
    uint64_t variant_id;
} cinfer__spec_t;

void cinfer__spec_init(cinfer__spec_t *spec, cinfer__op_t op);
void cinfer__spec_normalize(cinfer__spec_t *spec);

/* "merge_states", ... ; NULL for an unknown op. */
const char *cinfer__op_name(cinfer__op_t op);

/*
 * Parses the text form "OP[:FIELD=VALUE[,FIELD=VALUE...]]", e.g.
 * "merge_states:dtype_o=bf16,head_dim_vo=128". Aliases: dtype= sets q, kv and o; head_dim= sets
 * qk and vo. Unknown ops, fields or values, a field set twice, a field the op does not have and
 * an empty item (",,", a trailing comma, nothing after the colon) are INVALID_ARGUMENT with a
 * message naming them. A spec that parses may still be incomplete (see cinfer__spec_validate).
 */
cinfer_status_t cinfer__spec_parse(const char *text, cinfer__spec_t *spec);
/* The canonical text form of a (normalized) spec; parses back to the same spec. */
void cinfer__spec_format(const cinfer__spec_t *spec, char *dst, size_t cap);

/* Checks that a spec is complete and within its family's limits (dtypes, head dims, tiles);
 * INVALID_ARGUMENT or UNSUPPORTED with a message naming the field. A field the family needs
 * (backend, dtypes, head dims, tiles, vec) left at 0 is INVALID_ARGUMENT, "not given". */
cinfer_status_t cinfer__spec_validate(const cinfer__spec_t *spec);
/* cinfer__spec_parse, then cinfer__spec_validate with what the text gave: a needed field the text
 * leaves out is "not given" (INVALID_ARGUMENT), one it gives as 0 is out of its family's limits,
 * named with its value and range. Validation errors begin with the spec text. */
cinfer_status_t cinfer__spec_parse_valid(const char *text, cinfer__spec_t *spec);
/* The dynamic shared memory of the sm90 prefill kernel (kernels/prefill_sm90.cuh) at these head
 * dims and tiles, in bytes; its specs are valid up to 227 KiB. */
size_t cinfer__spec_sm90_prefill_smem(int head_dim_qk, int head_dim_vo, int tile_q, int tile_kv,
                                      int stages);

/*
 * Arch names, as NVRTC takes them: "sm_" then two or three digits, then optionally "a"
 * (arch-specific) or "f" (family). cinfer__arch_number gives the digits as a number (80 for
 * "sm_80", 90 for "sm_90a"), or -1 for a name not of that form. cinfer__arch_check refuses such a
 * name (INVALID_ARGUMENT) and an arch older than CINFER__MIN_ARCH (UNSUPPORTED), with a message
 * that starts with `what` (the argument, e.g. "--arch").
 */
int cinfer__arch_number(const char *arch);
cinfer_status_t cinfer__arch_check(const char *arch, const char *what);
/* The oldest arch the kernels are written for: sm_80 (bf16, cp.async and mma.sync's m16n8k16,
 * which every kernel family uses); a device of compute capability below 8.0 is refused too. */
#define CINFER__MIN_ARCH 80

/* The result of rendering a spec for one target. */
typedef struct cinfer__rendered {
    char name[192];         /* readable kernel name, a C identifier: the entry point in the cubin */
    char file_stem[256];    /* name + "-" + key hash: the cache entry's file name */
    char key_hash[33];      /* XXH3-128 of key, in hex */
    cinfer__str_t source;   /* what NVRTC compiles: prelude + #include of the family template */
    cinfer__str_t key;      /* canonical key text */
    const char *options[8]; /* NVRTC options (static strings and `arch_option`) */
    int num_options;
    char arch_option[48];
} cinfer__rendered_t;

/*
 * Renders spec for arch ("sm_90a", "sm_80", ...): name, source, NVRTC options and the cache key
 * (library version, kernel-source hash, NVRTC version, arch, options, name and the whole source).
 * nvrtc_version is major * 1000 + minor * 10 (0 if unknown). Free with cinfer__rendered_free.
 * The spec is validated first; the arch is checked by cinfer__arch_check.
 */
cinfer_status_t cinfer__spec_render(const cinfer__spec_t *spec, const char *arch, int nvrtc_version,
                                    cinfer__rendered_t *out);
void cinfer__rendered_free(cinfer__rendered_t *r);

#endif
