/*
 * The KV tiles a prefill CTA visits, shared by the sm80 and sm90 kernels (kernels/prefill.cu,
 * kernels/prefill_sm90.cuh): those holding a position that some row of its query tile keeps
 * (causal: up to its last token's position; sliding window: from its first token's window
 * start), within a split work item's chunk [chunk_begin, chunk_end) (batch kernels; the chunk's
 * edges are KV-tile edges, prefill_params.h). The tile's tokens q0 .. q0 + q_span - 1 are at
 * positions + delta (bottom-right aligned). Returns how many; *tile_begin is the first.
 */
#ifndef CINFER_PREFILL_TILES_CUH
#define CINFER_PREFILL_TILES_CUH

#include "common.cuh"

__device__ __forceinline__ int cinfer_prefill_kv_tiles(int tile_kv, int q0, int q_span, int delta,
                                                       int kv_len, int window_left, int chunk_begin,
                                                       int chunk_end, int *tile_begin) {
    int kv_end = kv_len, kv_begin = 0;
#if CINFER_MASK == 1
    kv_end = CINFER_MIN(kv_end, q0 + q_span + delta);
#endif
#if CINFER_WINDOW
    kv_begin = CINFER_MAX(0, q0 + delta - window_left);
#endif
#if CINFER_BATCH
    kv_begin = CINFER_MAX(kv_begin, chunk_begin);
    kv_end = CINFER_MIN(kv_end, chunk_end);
#endif
    *tile_begin = kv_begin / tile_kv;
    return kv_end > kv_begin ? CINFER_CEIL_DIV(kv_end, tile_kv) - *tile_begin : 0;
}

#endif
