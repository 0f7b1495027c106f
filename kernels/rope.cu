/*
 * Rotary position embeddings applied to q and k (in place or out of place): positions from a
 * ragged batch (indptr + offsets), from explicit position ids, or cos/sin read from a table.
 *
 * The threads of a token split the units of a head row (rope_params.h) and walk the token's q and
 * k head rows, so each thread computes the cos/sin of its unit once per token. Angles are
 * position * frequency in float64 (the frequencies come from the host, in float64, with rope_scale
 * and the Llama 3.1 smoothing already applied), reduced to [-pi, pi], then a float32 sincosf;
 * the rotation itself is float32.
 *
 * Prelude: one of CINFER_OP_ROPE, CINFER_OP_ROPE_POS_IDS, CINFER_OP_ROPE_COS_SIN_CACHE;
 * CINFER_DTYPE_O (q and k: fp16 or bf16), CINFER_HEAD_DIM_VO (D), CINFER_VEC (8: 16-byte
 * accesses, D % 8 == 0 and the rotary dim a multiple of 16, or 8 when interleaved; 1: scalar).
 */
#include "common.cuh"
#include "rope_params.h"

#define D     CINFER_HEAD_DIM_VO
#define VEC   CINFER_VEC
#define DT    CINFER_DTYPE_O
#define BLOCK CINFER_ROPE_BLOCK
/* Pairs of a rotated unit: 8 on the 16-byte path (4 of them used when interleaved), else 1. */
#define UNIT_PAIRS (VEC == 8 ? 8 : 1)

/* sin and cos of an angle in radians: reduced to [-pi, pi] in float64 with 2 pi split in two
 * parts (the product k * 2pi_hi is exact in the fma), so |angle| up to 2^31 keeps its accuracy
 * (a float32 angle loses 2^-24 of its size: 0.006 rad at position 10^5). On [-pi, pi] the
 * hardware __sincosf is within 2^-21.4 absolute (CUDA C Programming Guide, intrinsic functions),
 * far below a 16-bit result's rounding, and sincosf's slow path for large arguments (which
 * needs local memory) is never compiled in. */
__device__ __forceinline__ void rope_sincos(double angle, float *s, float *c) {
    const double two_pi_hi = 0x1.921fb54442d18p+2;
    const double two_pi_lo = 0x1.1a62633145c07p-52;
    const double k = rint(angle * 0x1.45f306dc9c883p-3); /* 1 / (2 pi) */
    double r = fma(-k, two_pi_hi, angle);
    r = fma(-k, two_pi_lo, r);
    __sincosf((float)r, s, c);
}

/* The position of token i; false when it has none (rope: no request covers it; cos/sin table:
 * outside the table). */
__device__ __forceinline__ bool token_position(const cinfer_rope_params &p, long long i,
                                               long long *pos) {
#if defined(CINFER_OP_ROPE)
    /* The first j in [1, batch_size] with indptr[j] > i, or batch_size + 1. */
    int lo = 1, hi = p.batch_size + 1;
    while (lo < hi) {
        const int mid = lo + (hi - lo) / 2;
        if (p.indptr[mid] > i)
            hi = mid;
        else
            lo = mid + 1;
    }
    if (lo > p.batch_size || p.indptr[lo - 1] > i)
        return false;
    *pos = (long long)p.offsets[lo - 1] + (i - p.indptr[lo - 1]);
    return true;
#else
    *pos = p.pos_ids[i];
#if defined(CINFER_OP_ROPE_COS_SIN_CACHE)
    return *pos >= 0 && *pos < p.cache_rows;
#else
    return true;
#endif
#endif
}

/* cos and sin of pair j at position pos. Without a position: a table lookup gives NaN (the error
 * must show), the ragged form the identity rotation (the row is copied). */
__device__ __forceinline__ void pair_cos_sin(const cinfer_rope_params &p, bool valid, long long pos,
                                             int j, float *c, float *s) {
#if defined(CINFER_OP_ROPE_COS_SIN_CACHE)
    if (valid) {
        const float *row = p.cos_sin_cache + pos * p.cache_stride;
        *c = row[j];
        *s = row[p.rotary_dim / 2 + j];
    } else {
        *c = *s = __int_as_float(0x7fc00000);
    }
#else
    if (valid) {
        rope_sincos((double)pos * p.freq[j], s, c);
    } else {
        *c = 1.0f;
        *s = 0.0f;
    }
#endif
}

extern "C" __global__ void __launch_bounds__(BLOCK) CINFER_KERNEL_NAME(const cinfer_rope_params p) {
    /* A token's threads are lanes x rows_per_pass, the host's mapping exactly; the block's spare
     * threads (when that does not divide the block) exit, since they would otherwise repeat the
     * next block's first token, which in place rotates some of its elements twice. */
    const int threads_per_token = p.lanes * p.rows_per_pass;
    const int local = (int)threadIdx.x / threads_per_token;
    if (local >= p.tokens_per_block)
        return;
    const long long token = (long long)blockIdx.x * p.tokens_per_block + local;
    const int t = (int)threadIdx.x % threads_per_token;
    if (token >= p.nnz)
        return;
    const int lane = t % p.lanes, row0 = t / p.lanes;
    const int num_rows = p.num_heads[0] + p.num_heads[1];
    const int half = p.rotary_dim / 2;
    long long pos = 0;
    const bool valid = token_position(p, token, &pos);

    for (int u = lane; u < p.units; u += p.lanes) {
        const bool rotated = u < p.rot_units;
        float c[UNIT_PAIRS], s[UNIT_PAIRS];
        const int pairs = VEC == 8 && p.interleave ? 4 : UNIT_PAIRS;
        if (rotated) {
#pragma unroll
            for (int i = 0; i < UNIT_PAIRS; i++)
                if (i < pairs)
                    pair_cos_sin(p, valid, pos, u * pairs + i, &c[i], &s[i]);
        }
        /* Element offsets in the row: the unit's first (and, rotating halves, second) vector. */
        const int e0 = rotated ? (p.interleave ? (VEC == 8 ? u * 8 : 2 * u) : u * VEC)
                               : p.rotary_dim + (u - p.rot_units) * VEC;
        const int e1 = p.interleave ? e0 + 1 : e0 + half;
        for (int r = row0; r < num_rows; r += p.rows_per_pass) {
            const int which = r >= p.num_heads[0];
            const int head = which ? r - p.num_heads[0] : r;
            const cinfer_half_bits *x = (const cinfer_half_bits *)p.in[which] +
                                        token * p.in_stride[which][0] +
                                        (long long)head * p.in_stride[which][1];
            cinfer_half_bits *y = (cinfer_half_bits *)p.out[which] +
                                  token * p.out_stride[which][0] +
                                  (long long)head * p.out_stride[which][1];
#if VEC == 8
            if (!rotated) {
                *(uint4 *)(y + e0) = *(const uint4 *)(x + e0);
            } else if (p.interleave) {
                float v[8], o[8];
                cinfer_unpack8(v, DT, *(const uint4 *)(x + e0));
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    o[2 * i] = v[2 * i] * c[i] - v[2 * i + 1] * s[i];
                    o[2 * i + 1] = v[2 * i + 1] * c[i] + v[2 * i] * s[i];
                }
                *(uint4 *)(y + e0) = cinfer_pack8(DT, o);
            } else {
                float a[8], b[8], oa[8], ob[8];
                cinfer_unpack8(a, DT, *(const uint4 *)(x + e0));
                cinfer_unpack8(b, DT, *(const uint4 *)(x + e1));
#pragma unroll
                for (int i = 0; i < 8; i++) {
                    oa[i] = a[i] * c[i] - b[i] * s[i];
                    ob[i] = b[i] * c[i] + a[i] * s[i];
                }
                *(uint4 *)(y + e0) = cinfer_pack8(DT, oa);
                *(uint4 *)(y + e1) = cinfer_pack8(DT, ob);
            }
#else
            if (!rotated) {
                y[e0] = x[e0];
            } else {
                const float a = cinfer_half_to_f32(DT, x[e0]);
                const float b = cinfer_half_to_f32(DT, x[e1]);
                y[e0] = cinfer_f32_to_half(DT, a * c[0] - b * s[0]);
                y[e1] = cinfer_f32_to_half(DT, b * c[0] + a * s[0]);
            }
#endif
        }
    }
}
