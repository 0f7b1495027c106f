/*
 * The soft cap of default attention (SEMANTICS.md): a logit s becomes c tanh(s / c). With
 * tanh x = 1 - 2 / (1 + e^(2 x)), the capped logit in base-2 units is
 *   c log2(e) tanh x = cap2 + 2 cap2 h,   h = (tanh x - 1) / 2 = -1 / (1 + 2^y),   y = 2 log2(e) x,
 * and h costs two MUFU operations (ex2, rcp) and one add; the caller forms y with one multiply
 * and folds cap2 and 2 cap2 into its own arithmetic. The absolute error is about 1e-7 (both MUFU
 * operations are within 2 ulp), h is exactly 0 or -1 where 2^y overflows or underflows (the cap
 * is met exactly), and NaN stays NaN. The mma.sync template and decode keep this form:
 * tanh.approx.f32 (one MUFU operation, cinfer_tanh_approx below, which the sm90 prefill kernel
 * takes) bought nothing on the template (H200, 16k causal, cap 30, same run, bench/RESULTS.md
 * 2026-11-30: 336-338 TFLOP/s on the four-warp tile against 334-340 for this form, 337-341 on
 * the turn-taking tile against 284-286; plain 398-403), and PTX bounds its relative error only
 * by 2^-10.99 on the sm_8x devices the template also runs on; a Newton reciprocal on the FMA
 * pipe in place of rcp ran 304-317 on both tiles.
 */
#ifndef CINFER_SOFT_CAP_CUH
#define CINFER_SOFT_CAP_CUH

/* y = x * CINFER_SOFT_CAP_Y_PER_X (2 log2(e)) */
#define CINFER_SOFT_CAP_Y_PER_X 2.8853900817779268f

/* h = -1 / (1 + 2^y), in [-1, 0]: the reciprocal of -1 - 2^y, whose negation is free in the add.
 * Flush-to-zero like the kernels' other exp2. */
__device__ __forceinline__ float cinfer_soft_cap_h(float y) {
    float e, h;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(y));
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(h) : "f"(-1.0f - e));
    return h;
}

/* The capped logit in base-2 units, cap2 tanh x, from y = 2 log2(e) x and cap2 = c log2(e). */
__device__ __forceinline__ float cinfer_soft_cap_log2(float y, float cap2) {
    return fmaf(2.0f * cap2, cinfer_soft_cap_h(y), cap2);
}

/* tanh x with one MUFU operation (tanh.approx.f32), for the sm90 prefill kernel, where the soft
 * cap's two (ex2, rcp) made MUFU the bound. PTX documents a relative error of up to 2^-10.99; on
 * the H200 (2026-11-30, 2.7 million values in [-12, 12], against double tanh) its largest
 * absolute error was 7.8e-6 (relative 1.1e-5 = 2^-16.5, at |x| near 0.6), so a logit capped at
 * 30 moves by at most 2.3e-4 (P by 0.02%, below the 2^-9 of P's bf16 rounding), against 6.8e-6
 * for the form above. That kernel ran 16k causal prefill with a cap of 30 at 487-497 TFLOP/s
 * with it, 394-410 with the form above (same call). */
__device__ __forceinline__ float cinfer_tanh_approx(float x) {
    float t;
    asm("tanh.approx.f32 %0, %1;" : "=f"(t) : "f"(x));
    return t;
}

#endif
