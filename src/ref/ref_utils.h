/*
 * cinfer CPU reference of the KV-cache and position utilities: appending to a paged KV cache,
 * the page-table helpers, rotary position embeddings and bit packing (include/cinfer.h).
 *
 * Like the attention reference (ref.h, whose conventions apply: cinfer__ref_ names, int64_t
 * sizes, int32_t index arrays with 64-bit address arithmetic, element strides, CINFER__REF_OK /
 * CINFER__REF_EINVAL returns, no global state), these are plain double-precision loops written
 * from the definitions in include/cinfer.h, sharing no code with the kernels.
 */
#ifndef CINFER_REF_REF_UTILS_H
#define CINFER_REF_REF_UTILS_H

#include <stdbool.h>
#include <stdint.h>

#include "ref/ref.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ============================================================================================ */
/* 1. Paged KV append and page-table helpers                                                     */
/* ============================================================================================ */

/* Error bits of cinfer__ref_append_paged_kv_cache (the values of CINFER_APPEND_ERROR_*). */
#define CINFER__REF_APPEND_ERROR_BATCH_INDEX 1
#define CINFER__REF_APPEND_ERROR_POSITION    2
#define CINFER__REF_APPEND_ERROR_PAGE        4

/* A writable paged cache: element (page, slot, h, d) at element offset page * stride_page +
 * slot * stride_slot + h * stride_head + d * stride_dim of data (see cinfer__ref_paged_t). */
typedef struct {
    void *data;
    cinfer__ref_dtype_t dtype;
    int64_t stride_page;
    int64_t stride_slot;
    int64_t stride_head;
    int64_t stride_dim;
} cinfer__ref_paged_out_t;

/*
 * Rounds x to a cache element of dtype, bits returned in the low bits: fp16 / bf16 (round to
 * nearest even, overflow to inf, as cinfer__ref_double_to_f16/bf16), fp8 e4m3 / e5m2 rounded
 * to nearest even and saturated: |x| that rounds above 448 (57344), infinities included, gives
 * +-448 (+-57344); NaN gives 0x7F (e4m3) or 0x7E (e5m2); F32 as cinfer__ref_double_to_f32.
 */
uint32_t cinfer__ref_cache_encode(cinfer__ref_dtype_t dtype, double x);

/*
 * The append of cinfer_append_paged_kv_cache, token by token in order:
 *   k, v: [nnz, num_heads, head_dim] strided (fp16/bf16 or any reference dtype);
 *   batch_indices, positions: [nnz];
 *   kv_indptr [batch_size + 1], kv_indices [num_indices]: the page table; max_pages: the pages
 *   of the caches; page_size >= 1;
 *   k_cache, v_cache: where element (page, slot, h, d) is written, as
 *   cinfer__ref_cache_encode(cache dtype, x / scale) with k_scale for K and v_scale for V.
 * Token i with batch_indices[i] == -1 is skipped. Otherwise, with b = batch_indices[i],
 * p = positions[i], begin = kv_indptr[b] and pages = kv_indptr[b + 1] - begin, it is skipped and
 * its bit OR'ed into *error_flags when b is outside [0, batch_size) (BATCH_INDEX), p is outside
 * [0, pages * page_size) (POSITION), begin + p / page_size is outside [0, num_indices) or
 * kv_indices[that] is outside [0, max_pages) (PAGE); else every (h, d) of K and V is written at
 * (kv_indices[begin + p / page_size], p % page_size, h, d).
 * error_flags may be NULL. Returns CINFER__REF_EINVAL for a negative size, page_size < 1, a
 * scale that is not finite and > 0, or a required NULL pointer (k, v, caches, index arrays when
 * nnz > 0).
 */
int cinfer__ref_append_paged_kv_cache(
    int64_t nnz, int64_t num_heads, int64_t head_dim, const cinfer__ref_strided3_t *k,
    const cinfer__ref_strided3_t *v, const int32_t *batch_indices, const int32_t *positions,
    int64_t batch_size, const int32_t *kv_indptr, const int32_t *kv_indices, int64_t num_indices,
    int64_t max_pages, int64_t page_size, const cinfer__ref_paged_out_t *k_cache,
    const cinfer__ref_paged_out_t *v_cache, double k_scale, double v_scale, int32_t *error_flags);

/*
 * get_batch_indices_positions: for i in [0, nnz), the b with append_indptr[b] <= i <
 * append_indptr[b + 1] (found by a linear scan over the requests; the last such b if several),
 * batch_indices[i] = b and positions[i] = seq_lens[b] - (append_indptr[b + 1] -
 * append_indptr[b]) + (i - append_indptr[b]); (-1, -1) when no request covers i.
 */
int cinfer__ref_batch_indices_positions(int64_t batch_size, const int32_t *append_indptr,
                                        const int32_t *seq_lens, int64_t nnz,
                                        int32_t *batch_indices, int32_t *positions);

/*
 * get_seq_lens: seq_lens[b] = (pages - 1) * page_size + kv_last_page_len[b] with pages =
 * kv_indptr[b + 1] - kv_indptr[b] > 0, else 0; saturated to the int32 range.
 */
int cinfer__ref_seq_lens(int64_t batch_size, const int32_t *kv_indptr,
                         const int32_t *kv_last_page_len, int64_t page_size, int32_t *seq_lens);

/* ============================================================================================ */
/* 2. Rotary position embeddings                                                                 */
/* ============================================================================================ */

/* What a RoPE call computes (include/cinfer.h): rotary_dim even >= 2, theta > 0, scale > 0; with
 * llama31, 0 < low_freq_factor < high_freq_factor and old_context_len > 0. */
typedef struct {
    int64_t rotary_dim;
    bool interleave; /* pairs (x[2j], x[2j+1]) instead of (x[j], x[j + rotary_dim / 2]) */
    double rope_theta;
    double rope_scale;
    bool llama31;
    double low_freq_factor;
    double high_freq_factor;
    double old_context_len;
} cinfer__ref_rope_t;

/*
 * Radians per position of pair j in [0, rotary_dim / 2), into *freq: base = theta^(-2j / R);
 * plain RoPE: base / scale; Llama 3.1, by wavelength (2 pi / base) against old_context_len /
 * high_freq_factor and old_context_len / low_freq_factor: shorter ones keep base, longer ones
 * get base / scale, and between them base blended as (1 - s) base / scale + s base with
 * s = (old_context_len / wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor).
 */
int cinfer__ref_rope_frequency(const cinfer__ref_rope_t *rope, int64_t j, double *freq);

/*
 * One head row x[head_dim] rotated at position pos into out[head_dim] (out may equal x): pair
 * j's angle is pos * frequency(j); elements from rotary_dim on are copied.
 */
int cinfer__ref_rope_row(const cinfer__ref_rope_t *rope, int64_t head_dim, double pos,
                         const double *x, double *out);

/*
 * The same from a cos/sin table row: cos_sin[rotary_dim] holds cos for pairs 0 .. R/2 - 1, then
 * sin for them. valid == false (a position outside the table) gives NaN in the rotated elements
 * (the others are copied), as cinfer_apply_rope_with_cos_sin_cache does.
 */
int cinfer__ref_rope_row_table(int64_t rotary_dim, bool interleave, int64_t head_dim,
                               const double *cos_sin, bool valid, const double *x, double *out);

/*
 * Positions of a ragged batch: token i in [indptr[b], indptr[b + 1]) is at offsets[b] + i -
 * indptr[b] (the last such b, by linear scan); covered[i] = 0 (and pos[i] = 0) when no request
 * contains i. pos: [nnz], covered: [nnz].
 */
int cinfer__ref_rope_ragged_positions(int64_t batch_size, const int32_t *indptr,
                                      const int32_t *offsets, int64_t nnz, int64_t *pos,
                                      uint8_t *covered);

/* ============================================================================================ */
/* 3. Bit packing                                                                                */
/* ============================================================================================ */

/*
 * y[(n + 7) / 8] = packbits(x[n]): element e (nonzero = 1) is bit e % 8 (big: 7 - e % 8) of
 * byte e / 8; the remaining bits of the last byte are 0.
 */
int cinfer__ref_packbits(const uint8_t *x, int64_t n, bool big, uint8_t *y);

/*
 * segment_packbits: indptr_new[0] = 0, indptr_new[s + 1] = indptr_new[s] + ceil(len_s / 8) with
 * len_s = max(indptr[s + 1] - indptr[s], 0); byte indptr_new[s] + j of y packs
 * x[indptr[s] + 8j .. min(indptr[s] + 8j + 8, indptr[s + 1])), elements outside [0, n) read as 0.
 * Bytes at or past y_capacity are not written (nor is anything past indptr_new[batch_size]).
 */
int cinfer__ref_segment_packbits(const uint8_t *x, int64_t n, int64_t batch_size,
                                 const int32_t *indptr, bool big, uint8_t *y, int64_t y_capacity,
                                 int32_t *indptr_new);

#ifdef __cplusplus
}
#endif

#endif
