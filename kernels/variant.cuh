/*
 * The variant interface every attention kernel is written against (include/cinfer.h, "Attention
 * variants", has the contract). A variant's source, rendered into the prelude before the kernel
 * template, defines some hooks and announces each with its VARIANT_* macro; this file supplies
 * the defaults of the others. A kernel tests the macros with #if, so an unused hook leaves no
 * code behind: default attention compiles to the same instructions as before the interface.
 */
#ifndef CINFER_VARIANT_CUH
#define CINFER_VARIANT_CUH

#include "common.cuh"
#include "dtype.cuh"

#define CINFER_LOG2E 1.4426950408889634f

#ifndef CINFER_VARIANT
/* Default attention: its parameters travel in the kernel's own parameter struct. */
typedef struct cinfer_variant_params {
    int cinfer_unused_;
} cinfer_variant_params;
#define CINFER_VARIANT_HOST_USE_SOFTMAX      1
#define CINFER_VARIANT_HOST_OUTPUT_TRANSFORM 0
#define CINFER_VARIANT_HOST_LOGITS           0
#endif

#ifndef VARIANT_QUERY_TRANSFORM
#define VARIANT_QUERY_TRANSFORM 0
__device__ __forceinline__ float variant_query_transform(const cinfer_variant_params *params,
                                                         float q, int batch_idx, int qo_idx,
                                                         int qo_head_idx, int dim_idx) {
    return q;
}
#endif

#ifndef VARIANT_LOGITS_TRANSFORM
#define VARIANT_LOGITS_TRANSFORM 0
__device__ __forceinline__ float variant_logits_transform(const cinfer_variant_params *params,
                                                          float logit, int batch_idx, int qo_idx,
                                                          int kv_idx, int qo_head_idx,
                                                          int kv_head_idx) {
    return logit;
}
#endif

/* The mask comes one position at a time (variant_logits_mask), as bit words, up to 32
 * consecutive positions of one query row at once (variant_logits_mask_bits): bit k keeps
 * kv_idx + k, for k < count (1 <= count <= 32; the higher bits are ignored, and the hook must not
 * read anything for their positions), or as the place of a query row's bits in global memory
 * (variant_logits_mask_row): position kv_idx is kept when bit *bit + kv_idx of the returned
 * 4-byte aligned words is set (bit b is bit b & 31 of word b >> 5), and a kernel reads only whole
 * words that hold a bit of a position inside the request. A variant may define any of them; what
 * it leaves out is built from the others (the row form cannot be built). Prefill copies a row's
 * words per KV tile itself where a variant gives the row form, else calls the bit words where a
 * variant defines them; decode, and prefill for a variant with only the per-position form, call
 * that. */
#ifndef VARIANT_LOGITS_MASK_ROW
#define VARIANT_LOGITS_MASK_ROW 0
__device__ __forceinline__ const uint32_t *
variant_logits_mask_row(const cinfer_variant_params *params, int batch_idx, int qo_idx,
                        int qo_head_idx, int kv_head_idx, int64_t *bit) {
    *bit = 0;
    return 0;
}
#endif

/* Bit words from the row form: the run's bits lie in at most two aligned words, both loaded whole
 * and funnel-shifted into place, the second only when it holds a bit of the run's first count
 * positions (so every word read holds a bit of a position inside the request). */
#if VARIANT_LOGITS_MASK_ROW && !defined(VARIANT_LOGITS_MASK_BITS)
#define VARIANT_LOGITS_MASK_BITS 1
__device__ __forceinline__ uint32_t variant_logits_mask_bits(const cinfer_variant_params *params,
                                                             int batch_idx, int qo_idx, int kv_idx,
                                                             int count, int qo_head_idx,
                                                             int kv_head_idx) {
    int64_t bit;
    const uint32_t *words =
        variant_logits_mask_row(params, batch_idx, qo_idx, qo_head_idx, kv_head_idx, &bit);
    bit += kv_idx;
    const int64_t w = bit >> 5;
    const int shift = (int)(bit & 31);
    const uint32_t lo = __ldg(words + w);
    const uint32_t hi = shift != 0 && 32 - shift < count ? __ldg(words + w + 1) : 0u;
    return __funnelshift_r(lo, hi, (unsigned)shift);
}
#endif

#ifndef VARIANT_LOGITS_MASK_BITS
#define VARIANT_LOGITS_MASK_BITS 0
#endif

#ifndef VARIANT_LOGITS_MASK
#if VARIANT_LOGITS_MASK_BITS
#define VARIANT_LOGITS_MASK 1
__device__ __forceinline__ bool variant_logits_mask(const cinfer_variant_params *params,
                                                    int batch_idx, int qo_idx, int kv_idx,
                                                    int qo_head_idx, int kv_head_idx) {
    return variant_logits_mask_bits(params, batch_idx, qo_idx, kv_idx, 1, qo_head_idx,
                                    kv_head_idx) &
           1u;
}
#else
#define VARIANT_LOGITS_MASK 0
__device__ __forceinline__ bool variant_logits_mask(const cinfer_variant_params *params,
                                                    int batch_idx, int qo_idx, int kv_idx,
                                                    int qo_head_idx, int kv_head_idx) {
    return true;
}
#endif
#endif

#if !VARIANT_LOGITS_MASK_BITS
__device__ __forceinline__ uint32_t variant_logits_mask_bits(const cinfer_variant_params *params,
                                                             int batch_idx, int qo_idx, int kv_idx,
                                                             int count, int qo_head_idx,
                                                             int kv_head_idx) {
    uint32_t bits = 0;
    for (int k = 0; k < count; k++)
        bits |= (uint32_t)variant_logits_mask(params, batch_idx, qo_idx, kv_idx + k, qo_head_idx,
                                              kv_head_idx)
                << k;
    return bits;
}
#endif

/* A bias linear in the relative position (ALiBi): the logit gains slope * (kv_idx - qo_idx),
 * natural-log units, before the logits transform sees it. */
#ifndef VARIANT_ALIBI_SLOPE
#define VARIANT_ALIBI_SLOPE 0
__device__ __forceinline__ float variant_alibi_slope(const cinfer_variant_params *params,
                                                     int batch_idx, int qo_head_idx) {
    return 0.0f;
}
#endif

#ifndef VARIANT_STATE_INIT
#define VARIANT_STATE_INIT 0
__device__ __forceinline__ void variant_state_init(const cinfer_variant_params *params,
                                                   int batch_idx, int qo_idx, int qo_head_idx,
                                                   float *max_log2, float *denominator) {}
#endif

#ifndef VARIANT_OUTPUT_TRANSFORM
#define VARIANT_OUTPUT_TRANSFORM 0
__device__ __forceinline__ float variant_output_transform(const cinfer_variant_params *params,
                                                          float o, int batch_idx, int qo_idx,
                                                          int qo_head_idx, int dim_idx) {
    return o;
}
#endif

#ifndef VARIANT_USE_SOFTMAX
#define VARIANT_USE_SOFTMAX 1
#endif

/* The host plans split-KV, LSE and the logit scale from its own reading of these two switches; a
 * source that sets them in a way the host did not see must not run with that plan. */
#if VARIANT_USE_SOFTMAX != CINFER_VARIANT_HOST_USE_SOFTMAX
#error "variant: VARIANT_USE_SOFTMAX must be set by a plain '#define VARIANT_USE_SOFTMAX 0' line"
#endif
#if VARIANT_OUTPUT_TRANSFORM != CINFER_VARIANT_HOST_OUTPUT_TRANSFORM
#error                                                                                             \
    "variant: VARIANT_OUTPUT_TRANSFORM must be set by a plain '#define VARIANT_OUTPUT_TRANSFORM 1' line"
#endif

/* Logit hooks: the kernel leaves its folded-scale fast path for logits in natural-log units (the
 * host then leaves log2(e) out of q_scale), evaluated through the hooks (or, for the hooks that
 * never see a logit, by the kernel itself in base 2: CINFER_VARIANT_NO_TRANSFORM). */
#define CINFER_VARIANT_LOGITS                                                                      \
    (VARIANT_LOGITS_TRANSFORM || VARIANT_LOGITS_MASK || VARIANT_ALIBI_SLOPE || !VARIANT_USE_SOFTMAX)
#if CINFER_VARIANT_LOGITS != CINFER_VARIANT_HOST_LOGITS
#error                                                                                             \
    "variant: announce VARIANT_LOGITS_TRANSFORM / VARIANT_LOGITS_MASK / VARIANT_LOGITS_MASK_BITS / VARIANT_LOGITS_MASK_ROW / VARIANT_ALIBI_SLOPE with plain '#define NAME 1' lines"
#endif

/* Logit hooks that never see a logit (a mask, a linear position bias, or both; no logits
 * transform, softmax on): a kernel may keep its logits in its own units, add the bias and drop
 * positions itself. */
#define CINFER_VARIANT_NO_TRANSFORM                                                                \
    ((VARIANT_LOGITS_MASK || VARIANT_ALIBI_SLOPE) && !VARIANT_LOGITS_TRANSFORM &&                  \
     VARIANT_USE_SOFTMAX)

/* What a dropped position contributes: logit -inf with softmax, weight 0 without. */
#define CINFER_VARIANT_DROPPED (VARIANT_USE_SOFTMAX ? -CINFER_INF : 0.0f)

/* A logit (natural-log units) of a position that exists, through the position bias, the logits
 * transform and the mask: the transformed logit, or CINFER_VARIANT_DROPPED where the mask drops
 * the position. The one place where kernels evaluate these hooks position by position (prefill
 * also has a per-tile form of the bias and the mask for variants without a transform). */
__device__ __forceinline__ float cinfer_variant_logit(const cinfer_variant_params *params,
                                                      float logit, int batch_idx, int qo_idx,
                                                      int kv_idx, int qo_head_idx,
                                                      int kv_head_idx) {
#if VARIANT_ALIBI_SLOPE
    logit =
        fmaf(variant_alibi_slope(params, batch_idx, qo_head_idx), (float)(kv_idx - qo_idx), logit);
#endif
    const float x = variant_logits_transform(params, logit, batch_idx, qo_idx, kv_idx, qo_head_idx,
                                             kv_head_idx);
    return variant_logits_mask(params, batch_idx, qo_idx, kv_idx, qo_head_idx, kv_head_idx)
               ? x
               : CINFER_VARIANT_DROPPED;
}

#endif
