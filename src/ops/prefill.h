/*
 * Prefill attention: the internal side of cinfer_single_prefill (src/ops/prefill.c), the tile
 * configuration of the sm80 kernel (kernels/prefill.cu), and a variant of the call with explicit
 * tiles for benchmarks and tests.
 */
#ifndef CINFER_OPS_PREFILL_H
#define CINFER_OPS_PREFILL_H

#include "cinfer.h"
#include "cuda/context.h"
#include "jit/spec.h"

/* Tiles of the sm80 prefill kernel (the spec's tile_q, tile_kv, warps and stages). */
typedef struct cinfer__prefill_config {
    int tile_q;  /* query rows per CTA: 16 or 32 per warp */
    int tile_kv; /* KV rows per pipeline stage: 16, 32, 64 or 128 */
    int warps;   /* 1, 2, 4 or 8 */
    int stages;  /* K/V tiles buffered in shared memory: 2..4 */
} cinfer__prefill_config_t;

/* Dynamic shared memory of the kernel for head dim d (kernels/prefill.cu's layout): the Q tile
 * and `stages` K and V tiles, rows of d / 8 16-byte chunks, padded by one chunk unless d % 64 == 0.
 */
size_t cinfer__prefill_smem_bytes(int head_dim, const cinfer__prefill_config_t *cfg);

/*
 * The default tiles for head_dim (a multiple of 16, at most 256) that fit max_smem bytes of
 * shared memory per block (the device's opt-in limit): see the function for the reasoning behind
 * each choice.
 */
void cinfer__prefill_default_config(int head_dim, int max_smem, cinfer__prefill_config_t *cfg);

/* The default tiles for head_dim on the context's device (what cinfer_single_prefill uses). */
void cinfer__prefill_context_config(const cinfer_context_t *ctx, int head_dim,
                                    cinfer__prefill_config_t *cfg);

/* cinfer_single_prefill with explicit tiles (cfg NULL = the default); UNSUPPORTED when they do not
 * fit the device. */
cinfer_status_t cinfer__single_prefill_config(cinfer_context_t *ctx,
                                              const cinfer_attention_options_t *options, int causal,
                                              const DLTensor *q, const DLTensor *k,
                                              const DLTensor *v, DLTensor *out, DLTensor *lse,
                                              const cinfer_args_t *args,
                                              const cinfer__prefill_config_t *cfg, CUstream stream);

/*
 * The spec of the kernel cinfer_single_prefill loads for these options and causal flag, with the
 * default tiles of a device allowing max_smem_optin bytes of shared memory per block: what
 * ahead-of-time builds compile. Validates the options.
 */
cinfer_status_t cinfer__prefill_kernel_spec(const cinfer_attention_options_t *o, int causal,
                                            int max_smem_optin, cinfer__spec_t *spec);

#endif
