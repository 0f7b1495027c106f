/*
 * Parameters of the prefill kernels, shared by the host (src/ops/prefill.c) and the device
 * (kernels/prefill.cu): plain C types only, so both compilers lay the struct out identically.
 *
 * One CTA computes one tile of CINFER_TILE_Q query rows of one query head. The grid is
 * num_q_tiles * num_qo_heads CTAs, the query head varying fastest (so the query heads of a GQA
 * group, which read the same K/V, run side by side and share it in L2), and the query tiles in
 * decreasing order (under a causal mask the last tiles have the most KV to visit, so they start
 * first and the short ones fill the tail).
 *
 * Strides are in elements; every address is computed in 64 bits.
 */
#ifndef CINFER_PREFILL_PARAMS_H
#define CINFER_PREFILL_PARAMS_H

/* The largest qo_len and kv_len the kernel accepts: positions and their differences (j - p_i,
 * p_i - window_left) then fit a 32-bit int. */
#define CINFER_PREFILL_MAX_LEN ((1 << 30) - 1)

typedef struct cinfer_prefill_params {
    /* q: [qo_len, Hq, D] */
    const void *q;
    long long q_stride_n, q_stride_h;
    /* k, v: [kv_len, Hk, D] through strides (NHD or HND are just different strides) */
    const void *k;
    const void *v;
    long long k_stride_n, k_stride_h;
    long long v_stride_n, v_stride_h;
    /* out: [qo_len, Hq, D]; lse: [qo_len, Hq] float32 base 2, may be NULL */
    void *out;
    long long out_stride_n, out_stride_h;
    float *lse;
    long long lse_stride_n, lse_stride_h;
    int qo_len, kv_len;
    int num_qo_heads, num_kv_heads;
    int num_q_tiles;
    /* keep j >= p_i - window_left (CINFER_WINDOW kernels); clamped by the host to [0, kv_len] */
    int window_left;
    /* logits in base-2 units: s2 = (q . k) * q_scale with q_scale = sm_scale * k_scale * log2(e);
     * with a soft cap c, q_scale = sm_scale * k_scale / c and s2 = soft_cap_log2 * tanh(q . k *
     * q_scale) with soft_cap_log2 = c * log2(e) */
    float q_scale;
    float soft_cap_log2;
    float v_scale; /* multiplies the output */
} cinfer_prefill_params;

#endif
