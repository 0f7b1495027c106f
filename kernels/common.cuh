/* Basic definitions every kernel family includes. */
#ifndef CINFER_COMMON_CUH
#define CINFER_COMMON_CUH

/* NVRTC compiles without system headers; these are the fixed-width types the kernels use. */
typedef unsigned char uint8_t;
typedef int int32_t;
typedef unsigned int uint32_t;
typedef long long int64_t;
typedef unsigned long long uint64_t;

#define CINFER_INF            __int_as_float(0x7f800000)
#define CINFER_CEIL_DIV(a, b) (((a) + (b)-1) / (b))
#define CINFER_MIN(a, b)      ((a) < (b) ? (a) : (b))
#define CINFER_MAX(a, b)      ((a) > (b) ? (a) : (b))

/* Programmatic dependent launch (PTX griddepcontrol, sm_90 and later; no-ops before, and when the
 * launch has no programmatic dependency). launch_dependents: this block no longer holds back the
 * launch of the kernel that depends on this one; wait: block until the kernels this one depends on
 * have completed and their memory operations are visible. */
__device__ __forceinline__ void cinfer_pdl_launch_dependents() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

__device__ __forceinline__ void cinfer_pdl_wait() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

/* Named barrier `id` (1..15; 0 is __syncthreads') of `count` threads (a multiple of 32): bar_sync
 * waits for the barrier's completion, bar_arrive counts this warp in without waiting. Shared-memory
 * accesses before either are performed for every thread that passes the barrier. */
__device__ __forceinline__ void cinfer_bar_sync(int id, int count) {
    asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(count) : "memory");
}
__device__ __forceinline__ void cinfer_bar_arrive(int id, int count) {
    asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(count) : "memory");
}

/* 2^x with the MUFU unit (flush to zero); 2^-inf = +0. The softmax's exponential in prefill. */
__device__ __forceinline__ float cinfer_fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

/* A lazy running maximum (FlashAttention-4's rescale threshold): a row's maximum m stays until a
 * tile's logits exceed it by more than this slack (base 2), so P = 2^(x - m) <= 2^8, within the
 * range of fp16 and bf16, and O, the row sum and the LSE (m + log2(sum)) share the stale m: the
 * result is the same up to rounding, and most tiles after a row's first skip O's rescale. */
#define CINFER_LAZY_MAX_SLACK 8.0f

#include "dtype.cuh"

#endif
