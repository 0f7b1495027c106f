/*
 * cinfer CPU reference: the float64 oracle every GPU kernel is tested against.
 *
 * Overview
 * --------
 * This module computes, in plain double-precision loops, exactly what
 * design/SEMANTICS.md says every attention path must compute. It is written from the math and
 * shares no code with the GPU kernels, so that a bug in a kernel cannot hide behind the same bug
 * in its oracle. Clarity beats speed here: the attention core is O(qo_len * kv_len * D) per head.
 *
 * The module has five parts:
 *   1. dtype helpers: decode raw fp16 / bf16 / fp32 / fp8 e4m3 / fp8 e5m2 bits to double and
 *      encode double to raw bits with round-to-nearest-even, one element or whole buffers;
 *   2. the single-request attention core on contiguous double arrays (the math contract below);
 *   3. wrappers over the real memory layouts (strided single request, ragged batch, paged batch)
 *      that read raw typed buffers, so a test can hand the reference exactly what the GPU got;
 *   4. merging of attention states (v, lse) as SEMANTICS.md defines it;
 *   5. error metrics for comparing a GPU output buffer with the double reference.
 *
 * Conventions
 * -----------
 * - All internal symbols start with cinfer__ref_; nothing here is public API of libcinfer.
 * - Sizes, counts and element offsets are int64_t; index arrays that mirror the GPU interface
 *   (indptr, page indices, last_page_len) are int32_t, and all address arithmetic on them is done
 *   in int64_t, so a page index near 2^31 / page_size cannot overflow.
 * - Strides are in elements, not bytes, and may be any int64_t value; the reference trusts them
 *   and cannot check that they stay inside the caller's buffer.
 * - Every function that can fail returns an int: CINFER__REF_OK (0) on success,
 *   CINFER__REF_EINVAL (-1) for an invalid argument (NULL where a pointer is required, bad size,
 *   heads not divisible, bad page table, ...), CINFER__REF_ENOMEM (-2) when an internal
 *   allocation fails. On failure the outputs may be partially written.
 * - No function aborts, exits or asserts, and none keeps global state: all are thread-safe as
 *   long as callers do not share output buffers.
 *
 * The math contract (per request; query row i, query head h, KV position j)
 * ------------------------------------------------------------------------
 * Shapes: q [qo_len, Hq, Dqk], k [kv_len, Hk, Dqk], v [kv_len, Hk, Dvo]; Hq % Hk == 0 and query
 * head h reads KV head h / (Hq / Hk). The steps, in this order:
 *   1. Absolute query position p_i = i + kv_len - qo_len (the query block is the last qo_len
 *      tokens of the request, so causal masking is bottom-right aligned; p_i may be negative).
 *   2. RoPE (rope_llama): q_i is rotated at position p_i and k_j at position j, rotate-half
 *      convention with D = Dqk (even, at most 1024), as cinfer__ref_rope_row (ref_utils.h) with
 *      rotary_dim = D: for pair m in [0, D/2),
 *        freq_m = rope_theta^(-2m/D) / rope_scale, angle = pos * freq_m,
 *        out[m]       = x[m] cos(angle) - x[m + D/2] sin(angle),
 *        out[m + D/2] = x[m + D/2] cos(angle) + x[m] sin(angle).
 *   3. Logit s = (q_i . k_j) * sm_scale * k_scale.
 *   4. ALiBi: s += slope_h * (j - p_i).
 *   5. Soft cap c = logits_soft_cap > 0: s = c * tanh(s / c).
 *   6. Masks; an element is kept only if every active mask keeps it:
 *        causal: keep j <= p_i;  window_left = w >= 0: keep j >= p_i - w;
 *        custom: keep mask[i * kv_len + j] != 0.
 *   7. Combine, by variant:
 *      DEFAULT: o_i = v_scale * sum_j softmax(s)_ij v_j over kept j,
 *               lse_i = log2(sum_j exp(s_ij)) (base 2 of the natural-exp sum).
 *      SINKS:   with one learned logit sink_h per query head (natural-log units, like s),
 *               o_i = v_scale * sum_j exp(s_ij) v_j / (exp(sink_h) + sum_j exp(s_ij)),
 *               lse_i = log2(exp(sink_h) + sum_j exp(s_ij)).
 *      SIGMOID: o_i = v_scale * sum_j sigmoid(s_ij * sigmoid_scale + sigmoid_bias) v_j over kept
 *               j; there is no normalizer, so no lse is defined and lse is NOT written (the
 *               caller's buffer is left untouched).
 *   Empty rows (kv_len 0 or every position masked): DEFAULT gives o = 0 and lse = -inf, never
 *   NaN; SINKS gives o = 0 and lse = sink_h / ln 2 (the sink alone is in the denominator);
 *   SIGMOID gives o = 0. Exponentials subtract the row maximum, so large logits cannot overflow.
 */
#ifndef CINFER_REF_REF_H
#define CINFER_REF_REF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Return codes of every fallible function in this module. */
#define CINFER__REF_OK     0
#define CINFER__REF_EINVAL (-1)
#define CINFER__REF_ENOMEM (-2)

/* ============================================================================================ */
/* 1. Dtypes                                                                                     */
/* ============================================================================================ */

/*
 * Element types of raw buffers. Elements are stored in native byte order, as the GPU writes them.
 *   F16:  IEEE binary16 (1 sign, 5 exponent bits with bias 15, 10 mantissa bits), with
 *         subnormals, inf and NaN; max finite 65504.
 *   BF16: bfloat16 (1, 8 bits bias 127, 7), with subnormals, inf and NaN.
 *   F32:  IEEE binary32.
 *   E4M3: OCP fp8 "e4m3fn" (1, 4 bits bias 7, 3); no inf; NaN is S.1111.111 only; max finite 448.
 *   E5M2: OCP fp8 e5m2 (1, 5 bits bias 15, 2), IEEE-like with inf and NaN; max finite 57344.
 */
typedef enum {
    CINFER__REF_DTYPE_F16,
    CINFER__REF_DTYPE_BF16,
    CINFER__REF_DTYPE_F32,
    CINFER__REF_DTYPE_E4M3,
    CINFER__REF_DTYPE_E5M2,
} cinfer__ref_dtype_t;

/* Size in bytes of one element of dtype (2, 2, 4, 1, 1), or 0 for a value outside the enum. */
size_t cinfer__ref_dtype_size(cinfer__ref_dtype_t dtype);

/*
 * Single-element conversions. Decoding is exact (every value of these formats is a double).
 * Encoding rounds to nearest, ties to even, as if the exponent range were unbounded, and then:
 *   - F16, BF16, F32, E5M2: a result above the largest finite value becomes inf (IEEE overflow);
 *     inf stays inf; NaN becomes the canonical positive quiet NaN (0x7E00, 0x7FC0, 0x7FC00000,
 *     0x7E); the sign of zero is kept.
 *   - E4M3: a result above 448 in magnitude, and +-inf, saturate to +-448 (0x7E / 0xFE), the
 *     "satfinite" conversion that fp8 KV caches use; NaN becomes 0x7F.
 * Values below half the smallest subnormal round to a zero of the same sign.
 */
double cinfer__ref_f16_to_double(uint16_t bits);
uint16_t cinfer__ref_double_to_f16(double x);
double cinfer__ref_bf16_to_double(uint16_t bits);
uint16_t cinfer__ref_double_to_bf16(double x);
double cinfer__ref_f32_to_double(uint32_t bits);
uint32_t cinfer__ref_double_to_f32(double x);
double cinfer__ref_e4m3_to_double(uint8_t bits);
uint8_t cinfer__ref_double_to_e4m3(double x);
double cinfer__ref_e5m2_to_double(uint8_t bits);
uint8_t cinfer__ref_double_to_e5m2(double x);

/*
 * Reads element `index` (an element offset, may be negative relative to base) of a raw buffer of
 * dtype and returns it as a double. Returns NaN for a dtype outside the enum or a NULL base.
 */
double cinfer__ref_load(cinfer__ref_dtype_t dtype, const void *base, int64_t index);

/*
 * Bulk conversions of n contiguous elements.
 *   cinfer__ref_to_double:   src is a raw buffer of n elements of dtype, dst is double[n].
 *   cinfer__ref_from_double: src is double[n], dst is a raw buffer of n elements of dtype,
 *                            rounded as the single-element encoders above.
 * Returns CINFER__REF_EINVAL for n < 0, a dtype outside the enum, or a NULL pointer when n > 0.
 */
int cinfer__ref_to_double(cinfer__ref_dtype_t dtype, const void *src, int64_t n, double *dst);
int cinfer__ref_from_double(cinfer__ref_dtype_t dtype, const double *src, int64_t n, void *dst);

/* ============================================================================================ */
/* 2. Single-request attention core                                                              */
/* ============================================================================================ */

/* Head counts and head dims shared by every attention entry point. */
typedef struct {
    int64_t num_qo_heads; /* Hq >= 1 */
    int64_t num_kv_heads; /* Hk >= 1, Hq % Hk == 0 */
    int64_t head_dim_qk;  /* Dqk >= 1 (even when RoPE is on) */
    int64_t head_dim_vo;  /* Dvo >= 1 */
} cinfer__ref_heads_t;

/* How query and key logits are turned into an output row; see step 7 of the contract. */
typedef enum {
    CINFER__REF_VARIANT_DEFAULT,
    CINFER__REF_VARIANT_SIGMOID,
    CINFER__REF_VARIANT_SINKS,
} cinfer__ref_variant_t;

/*
 * Options of one attention call. Fill with cinfer__ref_attn_opts_init, then change fields.
 * Pointers are borrowed for the duration of the call only.
 */
typedef struct {
    double sm_scale; /* softmax scale; the caller passes it, init sets 1/sqrt(Dqk) */
    double k_scale;  /* fp8 K dequant scale, multiplies sm_scale; 1.0 = none */
    double v_scale;  /* fp8 V dequant scale, multiplies the output; 1.0 = none */

    bool causal;                /* keep j <= p_i */
    int64_t window_left;        /* w >= 0: keep j >= p_i - w; -1 = off; < -1 is invalid */
    const uint8_t *custom_mask; /* single request only: bool [qo_len, kv_len] row-major, 0 = drop;
                                   NULL = none. Batch calls take their mask as arguments and
                                   require this to be NULL. */

    double logits_soft_cap; /* c > 0: s = c * tanh(s / c); 0 = off; negative or NaN is invalid */

    bool alibi;                 /* add slope_h * (j - p_i) */
    const double *alibi_slopes; /* [Hq] slopes, or NULL for cinfer__ref_alibi_default_slopes */

    bool rope_llama;   /* rotate q and k in the kernel (Llama rotate-half) */
    double rope_theta; /* finite > 0, default 1e4 */
    double rope_scale; /* finite > 0, positions are divided by it; default 1 */
    int rope_round;    /* -1 (default): rotated q and k stay exact; else the cinfer__ref_dtype_t
                          (F16 or BF16) they are rounded to after the rotation, as a kernel that
                          rotates into its 16-bit mma operands does (prefill, include/cinfer.h) */

    cinfer__ref_variant_t variant;
    double sigmoid_scale; /* SIGMOID only: multiplies s before the bias; default 1 */
    double sigmoid_bias;  /* SIGMOID only: added after the scale; default 0 */
    const double *sinks;  /* SINKS only, required: [Hq] learned logits in natural-log units */

    /*
     * Optional debug dump ("dump logits" variant): [Hq, qo_len, kv_len] doubles receiving the
     * final logit s_ij after steps 1-5 (before softmax, and for SIGMOID before sigmoid_scale and
     * sigmoid_bias), -inf where masked. NULL = no dump. In batch calls the per-request blocks are
     * concatenated in request order: request b starts at sum_{b' < b} Hq * qo_len_b' * kv_len_b'.
     */
    double *logits_out;
} cinfer__ref_attn_opts_t;

/* 1 / sqrt(head_dim_qk), the default sm_scale; NaN when head_dim_qk <= 0. */
double cinfer__ref_default_sm_scale(int64_t head_dim_qk);

/*
 * Sets every field of *opts to its default: sm_scale = 1/sqrt(head_dim_qk), k_scale = v_scale = 1,
 * no masks (window_left = -1), no soft cap, no ALiBi, no RoPE (rope_theta = 1e4, rope_scale = 1),
 * DEFAULT variant (sigmoid_scale = 1, sigmoid_bias = 0), no sinks, no logits dump.
 * Returns CINFER__REF_EINVAL when opts is NULL or head_dim_qk <= 0.
 */
int cinfer__ref_attn_opts_init(cinfer__ref_attn_opts_t *opts, int64_t head_dim_qk);

/*
 * Writes the ALiBi paper's default slopes for num_heads heads into out[num_heads]:
 *   num_heads a power of two: slope_h = 2^(-8 (h + 1) / H);
 *   otherwise, with n the largest power of two <= H: the n slopes of the n-head series, followed
 *   by H - n slopes of the 2n-head series at its even indices 0, 2, 4, ..., i.e.
 *   2^(-8 (2k + 1) / (2n)) for k = 0 .. H - n - 1.
 * Returns CINFER__REF_EINVAL when num_heads < 1 or out is NULL.
 */
int cinfer__ref_alibi_default_slopes(int64_t num_heads, double *out);

/*
 * Attention of one request on contiguous double arrays, following the contract at the top.
 *   q [qo_len, Hq, Dqk], k [kv_len, Hk, Dqk], v [kv_len, Hk, Dvo] (k and v may be NULL when
 *   kv_len == 0), o [qo_len, Hq, Dvo] (required when qo_len > 0), lse [qo_len, Hq] or NULL.
 * qo_len and kv_len may be 0. Returns CINFER__REF_EINVAL for bad sizes or options (see the
 * field comments of cinfer__ref_attn_opts_t), CINFER__REF_ENOMEM when scratch allocation fails.
 */
int cinfer__ref_attention(const cinfer__ref_heads_t *heads, int64_t qo_len, int64_t kv_len,
                          const double *q, const double *k, const double *v,
                          const cinfer__ref_attn_opts_t *opts, double *o, double *lse);

/* ============================================================================================ */
/* 3. Wrappers over the real memory layouts (raw typed buffers)                                  */
/* ============================================================================================ */

/* Order of the token and head dimensions of a K/V tensor, named as SEMANTICS.md names them. */
typedef enum {
    CINFER__REF_LAYOUT_NHD, /* [tokens, heads, dim] */
    CINFER__REF_LAYOUT_HND, /* [heads, tokens, dim] */
} cinfer__ref_layout_t;

/*
 * A strided 3-d tensor [tokens, heads, dim] of raw elements: element (t, h, d) is at element
 * offset t * stride_token + h * stride_head + d * stride_dim from data. NHD, HND and slices of a
 * packed QKV tensor are all just different strides.
 */
typedef struct {
    const void *data;
    cinfer__ref_dtype_t dtype;
    int64_t stride_token;
    int64_t stride_head;
    int64_t stride_dim;
} cinfer__ref_strided3_t;

/*
 * A paged K or V cache [max_pages, ...] of raw elements: element (page, slot, h, d) is at
 * element offset page * stride_page + slot * stride_slot + h * stride_head + d * stride_dim.
 * NHD is [max_pages, page_size, Hk, D], HND is [max_pages, Hk, page_size, D]. A combined cache
 * [max_pages, 2, ...] is two of these: K at data with stride_page = 2 * page_size * Hk * D, and V
 * at data + page_size * Hk * D elements with the same strides.
 */
typedef struct {
    const void *data;
    cinfer__ref_dtype_t dtype;
    int64_t stride_page;
    int64_t stride_slot;
    int64_t stride_head;
    int64_t stride_dim;
} cinfer__ref_paged_t;

/*
 * Fills *t for a densely packed tensor of num_tokens x num_heads x head_dim elements in the given
 * layout (the last dim contiguous). Returns CINFER__REF_EINVAL for a NULL t, a negative size or
 * a layout outside the enum.
 */
int cinfer__ref_strided3_packed(cinfer__ref_strided3_t *t, const void *data,
                                cinfer__ref_dtype_t dtype, cinfer__ref_layout_t layout,
                                int64_t num_tokens, int64_t num_heads, int64_t head_dim);

/* Same for a densely packed paged cache with page_size slots per page. */
int cinfer__ref_paged_packed(cinfer__ref_paged_t *t, const void *data, cinfer__ref_dtype_t dtype,
                             cinfer__ref_layout_t layout, int64_t page_size, int64_t num_heads,
                             int64_t head_dim);

/*
 * A CSR page table. Request b owns pages indices[indptr[b] .. indptr[b+1]) in order, and has
 *   kv_len_b = (num_pages_b - 1) * page_size + last_page_len[b], or 0 when num_pages_b == 0
 *   (last_page_len[b] is then ignored).
 * Valid when: batch_size >= 0, page_size >= 1, max_pages >= 0, pointers non-NULL (indices may be
 * NULL when no request has pages), indptr[0] >= 0 and non-decreasing, last_page_len[b] in
 * [1, page_size] for every request with pages, and every referenced page index in
 * [0, max_pages).
 */
typedef struct {
    int64_t batch_size;
    int64_t page_size;
    int64_t max_pages;
    const int32_t *indptr;        /* [batch_size + 1] */
    const int32_t *indices;       /* [indptr[batch_size]] */
    const int32_t *last_page_len; /* [batch_size] */
} cinfer__ref_page_table_t;

/* Checks every rule above; CINFER__REF_OK or CINFER__REF_EINVAL. */
int cinfer__ref_page_table_validate(const cinfer__ref_page_table_t *table);

/*
 * kv_len of request b of a table (which this function does not validate as a whole) into
 * *kv_len. Returns CINFER__REF_EINVAL for b out of range, a NULL pointer, or a
 * last_page_len out of [1, page_size] for a request with pages.
 */
int cinfer__ref_page_table_kv_len(const cinfer__ref_page_table_t *table, int64_t b,
                                  int64_t *kv_len);

/*
 * One request with K/V in any strided layout (use cinfer__ref_strided3_packed with NHD for
 * [kv_len, Hk, D] or HND for [Hk, kv_len, D]).
 *   q: [qo_len, Hq, Dqk] strided; k: [kv_len, Hk, Dqk]; v: [kv_len, Hk, Dvo];
 *   o: [qo_len, Hq, Dvo] doubles; lse: [qo_len, Hq] doubles or NULL.
 * opts->custom_mask, if set, is [qo_len, kv_len]. Single decode is qo_len == 1.
 * Returns as cinfer__ref_attention.
 */
int cinfer__ref_single(const cinfer__ref_heads_t *heads, int64_t qo_len, int64_t kv_len,
                       const cinfer__ref_strided3_t *q, const cinfer__ref_strided3_t *k,
                       const cinfer__ref_strided3_t *v, const cinfer__ref_attn_opts_t *opts,
                       double *o, double *lse);

/*
 * Batch attention over a ragged K/V.
 *   q: [total_qo, Hq, Dqk] strided, request b owns rows qo_indptr[b] .. qo_indptr[b+1];
 *   k, v: [total_kv, Hk, D] strided, request b owns tokens kv_indptr[b] .. kv_indptr[b+1];
 *   custom_mask: NULL, or the requests' bool masks [qo_len_b, kv_len_b] concatenated; request
 *   b's mask starts at element mask_indptr[b], or, when mask_indptr is NULL, at
 *   sum_{b' < b} qo_len_b' * kv_len_b';
 *   o: [total_qo, Hq, Dvo] doubles and lse: [total_qo, Hq] doubles or NULL, indexed by the same
 *   rows as q (rows outside every request are not written).
 * opts->custom_mask must be NULL. Both indptr arrays must start >= 0 and be non-decreasing.
 * Returns as cinfer__ref_attention.
 */
int cinfer__ref_batch_ragged(const cinfer__ref_heads_t *heads, int64_t batch_size,
                             const cinfer__ref_strided3_t *q, const int32_t *qo_indptr,
                             const cinfer__ref_strided3_t *k, const cinfer__ref_strided3_t *v,
                             const int32_t *kv_indptr, const uint8_t *custom_mask,
                             const int32_t *mask_indptr, const cinfer__ref_attn_opts_t *opts,
                             double *o, double *lse);

/*
 * Batch attention over a paged K/V cache (decode and prefill).
 *   q: [total_qo, Hq, Dqk] strided with qo_indptr[batch_size + 1]; qo_indptr == NULL means
 *   batch decode, one query row per request (qo_indptr = 0, 1, 2, ..., batch_size);
 *   k_cache: [max_pages, ...] with Dqk, v_cache with Dvo, see cinfer__ref_paged_t;
 *   table: the page table, validated first (CINFER__REF_EINVAL on any violation);
 *   custom_mask, mask_indptr, o, lse: as cinfer__ref_batch_ragged.
 * opts->custom_mask must be NULL. Returns as cinfer__ref_attention.
 */
int cinfer__ref_batch_paged(const cinfer__ref_heads_t *heads, const cinfer__ref_strided3_t *q,
                            const int32_t *qo_indptr, const cinfer__ref_paged_t *k_cache,
                            const cinfer__ref_paged_t *v_cache,
                            const cinfer__ref_page_table_t *table, const uint8_t *custom_mask,
                            const int32_t *mask_indptr, const cinfer__ref_attn_opts_t *opts,
                            double *o, double *lse);

/* ============================================================================================ */
/* 4. Merging attention states                                                                  */
/* ============================================================================================ */

/*
 * A state is (v, s): v an attention output [D] over some set of keys and s its base-2 lse.
 * Merging two states gives the state over the union of the key sets:
 *   s = log2(2^s_a + 2^s_b),  v = (2^s_a v_a + 2^s_b v_b) / 2^s,
 * computed with the larger lse subtracted first so nothing overflows. A state with s = -inf is
 * empty and contributes nothing; merging only empty states gives (0, -inf), never NaN.
 */

/*
 * v_a, v_b: [n, H, D]; s_a, s_b: [n, H]; outputs v_out [n, H, D] and s_out [n, H] (s_out may be
 * NULL). Outputs may alias either input. Returns CINFER__REF_EINVAL for negative sizes or a
 * required NULL pointer.
 */
int cinfer__ref_merge_state(int64_t n, int64_t num_heads, int64_t head_dim, const double *v_a,
                            const double *s_a, const double *v_b, const double *s_b, double *v_out,
                            double *s_out);

/*
 * In-place merge: (v, s) <- merge((v, s), (v_other, s_other)) for every row r with mask == NULL
 * or mask[r] != 0; rows with mask[r] == 0 keep v and s unchanged.
 *   v [n, H, D], s [n, H], v_other [n, H, D], s_other [n, H], mask uint8 [n] or NULL.
 */
int cinfer__ref_merge_state_in_place(int64_t n, int64_t num_heads, int64_t head_dim, double *v,
                                     double *s, const double *v_other, const double *s_other,
                                     const uint8_t *mask);

/*
 * Merges num_states states per row in one step (directly from the definition, not by pairwise
 * folding): v [n, num_states, H, D], s [n, num_states, H] -> v_out [n, H, D], s_out [n, H]
 * (s_out may be NULL). num_states == 0 gives (0, -inf).
 */
int cinfer__ref_merge_states(int64_t n, int64_t num_states, int64_t num_heads, int64_t head_dim,
                             const double *v, const double *s, double *v_out, double *s_out);

/* ============================================================================================ */
/* 5. Error metrics for tests                                                                   */
/* ============================================================================================ */

/*
 * Result of comparing n output elements with the reference.
 *   max_abs_err: max_k |out_k - ref_k|;
 *   rel_l2_err:  ||out - ref||_2 / ||ref||_2, or ||out - ref||_2 when ||ref||_2 == 0;
 *   num_nonfinite: how many out_k are NaN or +-inf;
 *   max_abs_index: the k of max_abs_err (the first one on ties; -1 when n == 0).
 * An element where out_k == ref_k (including the same infinity) contributes zero error; any other
 * element involving a NaN or inf makes max_abs_err and rel_l2_err +inf, so a tolerance check on
 * either metric alone already fails on non-finite output.
 */
typedef struct {
    double max_abs_err;
    double rel_l2_err;
    int64_t num_nonfinite;
    int64_t max_abs_index;
} cinfer__ref_error_t;

/*
 * Compares out (a raw buffer of n elements of dtype, e.g. the GPU output copied to the host)
 * with ref (double[n]). Returns CINFER__REF_EINVAL for n < 0, a bad dtype or a NULL pointer.
 */
int cinfer__ref_compare(cinfer__ref_dtype_t dtype, const void *out, const double *ref, int64_t n,
                        cinfer__ref_error_t *err);

/*
 * Result of comparing n lse values.
 *   max_abs_err: max |out - ref| over elements where both are finite (0 if none);
 *   num_inf_mismatch: elements, neither side NaN, where at least one side is infinite and
 *     they are not both -inf (-inf == -inf counts as equal, -inf vs finite as a mismatch);
 *   num_nan: elements where out or ref is NaN (a NaN is never equal to anything);
 *   first_mismatch_index: the first element counted in num_inf_mismatch or num_nan, or -1.
 * A check passes when num_inf_mismatch == 0, num_nan == 0 and max_abs_err <= tolerance.
 */
typedef struct {
    double max_abs_err;
    int64_t num_inf_mismatch;
    int64_t num_nan;
    int64_t first_mismatch_index;
} cinfer__ref_lse_error_t;

/* Compares lse out (raw, usually F32) with ref (double[n]); errors as cinfer__ref_compare. */
int cinfer__ref_compare_lse(cinfer__ref_dtype_t dtype, const void *out, const double *ref,
                            int64_t n, cinfer__ref_lse_error_t *err);

#ifdef __cplusplus
}
#endif

#endif /* CINFER_REF_REF_H */
