/*
 * Element types and conversions, without cuda_fp16.h/cuda_bf16.h: kernels stay C-style, NVRTC
 * compiles them without any system header (which keeps cold compiles short), and every conversion
 * is one PTX instruction whose rounding is explicit.
 */
#ifndef CINFER_DTYPE_CUH
#define CINFER_DTYPE_CUH

/* The values of CINFER_DTYPE_* in the prelude (src/jit/spec.h, cinfer__dtype_t). */
#define CINFER_DT_F16  1
#define CINFER_DT_BF16 2
#define CINFER_DT_F32  3
#define CINFER_DT_E4M3 4
#define CINFER_DT_E5M2 5

typedef unsigned short cinfer_half_bits; /* fp16 or bf16, by the dtype in use */

__device__ __forceinline__ float cinfer_f16_to_f32(cinfer_half_bits h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

__device__ __forceinline__ cinfer_half_bits cinfer_f32_to_f16(float f) {
    cinfer_half_bits h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

/* bf16 is the top half of an fp32, so widening is a shift. */
__device__ __forceinline__ float cinfer_bf16_to_f32(cinfer_half_bits h) {
    return __uint_as_float(((unsigned)h) << 16);
}

__device__ __forceinline__ cinfer_half_bits cinfer_f32_to_bf16(float f) {
    cinfer_half_bits h;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

/* Dispatch on a compile-time dtype (the branch folds away). */
__device__ __forceinline__ float cinfer_half_to_f32(int dtype, cinfer_half_bits h) {
    return dtype == CINFER_DT_BF16 ? cinfer_bf16_to_f32(h) : cinfer_f16_to_f32(h);
}

__device__ __forceinline__ cinfer_half_bits cinfer_f32_to_half(int dtype, float f) {
    return dtype == CINFER_DT_BF16 ? cinfer_f32_to_bf16(f) : cinfer_f32_to_f16(f);
}

/* Unpacks 8 fp16/bf16 values held in a 16-byte vector. */
__device__ __forceinline__ void cinfer_unpack8(float *dst, int dtype, uint4 v) {
    const unsigned words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        dst[2 * i] = cinfer_half_to_f32(dtype, (cinfer_half_bits)(words[i] & 0xffffu));
        dst[2 * i + 1] = cinfer_half_to_f32(dtype, (cinfer_half_bits)(words[i] >> 16));
    }
}

/* Packs 8 floats into a 16-byte vector of fp16/bf16 (round to nearest even). */
__device__ __forceinline__ uint4 cinfer_pack8(int dtype, const float *src) {
    unsigned words[4];
#pragma unroll
    for (int i = 0; i < 4; i++)
        words[i] = (unsigned)cinfer_f32_to_half(dtype, src[2 * i]) |
                   ((unsigned)cinfer_f32_to_half(dtype, src[2 * i + 1]) << 16);
    return make_uint4(words[0], words[1], words[2], words[3]);
}

/*
 * fp8 to fp16 by moving bits: e5m2 is the top byte of an fp16, exactly. For e4m3 (bias 7) the
 * seven magnitude bits placed under an fp16 exponent (bias 15) give value / 2^8 exactly, normal
 * and subnormal alike, so callers fold 256 into their scale (k_scale, v_scale).
 */
__device__ __forceinline__ cinfer_half_bits cinfer_e4m3_to_f16_div256(unsigned b) {
    return (cinfer_half_bits)(((b & 0x7fu) << 7) | ((b & 0x80u) << 8));
}

__device__ __forceinline__ cinfer_half_bits cinfer_e5m2_to_f16(unsigned b) {
    return (cinfer_half_bits)((b & 0xffu) << 8);
}

/*
 * Exact fp8 to fp16x2, for the tensor-core decode's mma fragments (kernels/decode_tc.cu). e5m2 is
 * the top byte of an fp16, so one byte permute places two of them. e4m3 uses the sm_89+ converter
 * (one F2FP per pair, reading either half of the word in place); before sm_89 the bit move above
 * (value / 256) is multiplied back by 256 in fp16, which is exact (a power of two; the largest
 * e4m3, 448, stays far below 65504).
 *
 * Four fp8 values (element 0 in the low byte) as two fp16x2 words: lo = elements 0 and 1, hi =
 * elements 2 and 3.
 */
__device__ __forceinline__ void cinfer_fp8x4_to_f16x2x2(int dtype, unsigned w, unsigned *lo,
                                                        unsigned *hi) {
    if (dtype == CINFER_DT_E4M3) {
#if __CUDA_ARCH__ >= 890
        asm("{\n"
            "  .reg .b16 l, h;\n"
            "  mov.b32 {l, h}, %2;\n"
            "  cvt.rn.f16x2.e4m3x2 %0, l;\n"
            "  cvt.rn.f16x2.e4m3x2 %1, h;\n"
            "}"
            : "=r"(*lo), "=r"(*hi)
            : "r"(w));
#else
        unsigned a = __byte_perm(w, 0u, 0x1404u), b = __byte_perm(w, 0u, 0x3424u);
        a = ((a >> 1) & 0x3f803f80u) | (a & 0x80008000u);
        b = ((b >> 1) & 0x3f803f80u) | (b & 0x80008000u);
        const unsigned x256 = 0x5c005c00u; /* 256.0 in both halves */
        asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(*lo) : "r"(a), "r"(x256));
        asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(*hi) : "r"(b), "r"(x256));
#endif
    } else {
        *lo = __byte_perm(w, 0u, 0x1404u);
        *hi = __byte_perm(w, 0u, 0x3424u);
    }
}

/* The same four values, paired across the halves: even = elements 0 and 2, odd = elements 1 and
 * 3 (a transposed ldmatrix of fp8 byte pairs holds two rows' pairs in one word; this splits them
 * into the two columns). */
__device__ __forceinline__ void cinfer_fp8x4_to_f16x2x2_cross(int dtype, unsigned w, unsigned *even,
                                                              unsigned *odd) {
    if (dtype == CINFER_DT_E4M3) {
        cinfer_fp8x4_to_f16x2x2(dtype, __byte_perm(w, 0u, 0x3120u), even, odd);
    } else {
        *even = __byte_perm(w, 0u, 0x2404u);
        *odd = __byte_perm(w, 0u, 0x3414u);
    }
}

/*
 * Four fp8 values (element i in byte i) as two fp16x2 words, lo = elements 0 and 1, hi = elements
 * 2 and 3, by byte permutes, shifts and masks alone: the sm80 prefill template converts each K/V
 * tile with these (kernels/prefill.cu), on the integer pipe, and so does the sm90 kernel for e5m2.
 * e5m2 is the top byte of an fp16, exactly. e4m3 is value / 2^8, exactly (see
 * cinfer_e4m3_to_f16_div256; callers fold 256 into their scales), except that the NaN encodings
 * (0x7f, 0xff) come out as +-480 / 256.
 */
__device__ __forceinline__ void cinfer_fp8x4_to_f16x2x2_bits(int dtype, unsigned w, unsigned *lo,
                                                             unsigned *hi) {
    if (dtype == CINFER_DT_E4M3) {
        /* An fp16 of value / 256 is the sign in bit 15 and the seven magnitude bits in bits 7..13.
         * A prmt whose selector nibbles have bit 3 set fills a byte with the sign of the byte
         * they name, so each pair of values becomes two sign-extended 16-bit halves (the byte,
         * then its sign 8 times): shifted up 7, bit 15 of a half is the sign and bits 7..13 the
         * magnitude; the mask clears bit 14 (the sign again) and the low half's sign bits that
         * crossed into the high half. Three operations per pair. */
        unsigned x, y;
        asm("prmt.b32 %0, %1, 0, 0x9180;" : "=r"(x) : "r"(w));
        asm("prmt.b32 %0, %1, 0, 0xB3A2;" : "=r"(y) : "r"(w));
        *lo = (x << 7) & 0xbf80bf80u;
        *hi = (y << 7) & 0xbf80bf80u;
    } else {
        *lo = __byte_perm(w, 0u, 0x1404u);
        *hi = __byte_perm(w, 0u, 0x3424u);
    }
}

/* Unpacks 8 fp8 values held in an 8-byte vector (e4m3 values come out divided by 256). */
__device__ __forceinline__ void cinfer_unpack8_fp8(float *dst, int dtype, uint2 v) {
    const unsigned words[2] = {v.x, v.y};
#pragma unroll
    for (int i = 0; i < 2; i++) {
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const unsigned b = (words[i] >> (8 * j)) & 0xffu;
            dst[4 * i + j] = cinfer_f16_to_f32(
                dtype == CINFER_DT_E4M3 ? cinfer_e4m3_to_f16_div256(b) : cinfer_e5m2_to_f16(b));
        }
    }
}

#endif
