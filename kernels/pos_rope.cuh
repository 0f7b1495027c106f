/*
 * In-kernel RoPE of the attention kernels (CINFER_POS = 1; include/cinfer.h, "In-kernel RoPE"):
 * pair m of a head row of D elements, (x[m], x[m + D/2]), turns by the angle
 * (pos / rope_scale) * rope_theta^(-2m / D). Not to be confused with kernels/rope.cu, the
 * stand-alone apply_rope operation.
 *
 * Accuracy at long positions: the angle reaches about 1.7e7 radians at position 2^24, where one
 * float32 ulp of it is 2 radians, so neither sincosf's argument nor __sincosf's (accurate only on
 * [-pi, pi]) can be a float32 product pos * freq. Instead the host computes, once per set of
 * options, every pair's frequency in turns per position, f_m = rope_theta^(-2m / D) /
 * (2 pi rope_scale), in float64 and keeps it as an unevaluated float32 sum hi + lo (48 significant
 * bits; kernels/pos_rope_params.h), which each CTA copies into shared memory. For an integer
 * position |pos| < 2^24 (exact in float32), pos * hi is split exactly into a rounded product and
 * its error (one fma), the integer number of turns is dropped exactly (a - rint(a)), and what
 * remains, the fraction of a turn in [-1/2, 1/2] with an absolute error near 2^-25, goes through
 * __sincosf (two MUFU operations, absolute error 2^-21.4 on [-pi, pi]). The result is the
 * rotation within about 1e-6 at any position the host accepts (CINFER_ROPE_MAX_LEN), for a few
 * FMAs and two MUFU operations per pair, far below the 2^-9 / 2^-12 rounding of a bf16 / fp16
 * result. (sincosf on the float32 angle would be both slower, with its Payne-Hanek path above
 * 105615 radians, and wrong by up to a radian.)
 */
#ifndef CINFER_POS_ROPE_CUH
#define CINFER_POS_ROPE_CUH

#include "pos_rope_params.h"

#if defined(CINFER_POS) && CINFER_POS == 1
#define CINFER_ROPE 1
#else
#define CINFER_ROPE 0
#endif

#define CINFER_ROPE_TWO_PI 6.28318530717958647692

#if CINFER_ROPE
/* The RoPE kernels' last parameter, after the variant's: the host's frequency table, read in the
 * parameter space (__grid_constant__: indexing it makes no local copy of the 1 KiB). */
#define CINFER_ROPE_KERNEL_PARAM , const __grid_constant__ cinfer_pos_rope_params rope
#else
#define CINFER_ROPE_KERNEL_PARAM
#endif

/* Copies pair m's frequency (m in [0, d / 2)) from the kernel parameter table into freq[m];
 * thread tid of nthreads takes m = tid, tid + nthreads, ... (a CTA of one or two warps has fewer
 * threads than a head dim of 256 has pairs). The caller synchronizes before use. */
__device__ __forceinline__ void cinfer_rope_freq_init(float2 *freq,
                                                      const cinfer_pos_rope_params &table, int d,
                                                      int tid, int nthreads) {
    for (int m = tid; m < d / 2; m += nthreads)
        freq[m] = make_float2(table.freq[m][0], table.freq[m][1]);
}

/* sin and cos of the angle of position pos (an integer, |pos| < 2^24) at frequency f (turns per
 * position, hi + lo): the whole turns are removed exactly before the float32 sincos. */
__device__ __forceinline__ void cinfer_rope_sincos(float pos, float2 f, float *s, float *c) {
    const float a = pos * f.x;
    const float a_err = fmaf(pos, f.x, -a); /* exact: pos * hi = a + a_err */
    const float turns = a - rintf(a);       /* exact: |turns| <= 1/2 */
    float t = turns + fmaf(pos, f.y, a_err);
    /* a_err is up to half an ulp of a (1/8 turn at a ~ 2^21, more for rope_scale < 1), so t can
     * leave [-1/2, 1/2] (0.73 turns at position 2^24 - 1 with rope_scale 1, 1.6 at 0.1, 14 at
     * 0.01); one more exact reduction keeps __sincosf's argument in [-pi, pi]. */
    t -= rintf(t);
    __sincosf(t * (float)CINFER_ROPE_TWO_PI, s, c);
}

/*
 * Rotates 8 pairs in place: lo[i] = x[m + i], hi[i] = x[m + D/2 + i] at position pos, freq the
 * pairs' frequencies (freq[i] for pair m + i).
 */
__device__ __forceinline__ void cinfer_rope_rotate8(float *lo, float *hi, float pos,
                                                    const float2 *freq) {
#pragma unroll
    for (int i = 0; i < 8; i++) {
        float s, c;
        cinfer_rope_sincos(pos, freq[i], &s, &c);
        const float x = lo[i], y = hi[i];
        lo[i] = fmaf(x, c, -y * s);
        hi[i] = fmaf(y, c, x * s);
    }
}

#endif
