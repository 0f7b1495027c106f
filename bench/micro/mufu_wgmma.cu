/*
 * Microbenchmark: the MUFU throughput of one warpgroup while another warpgroup of the same SM runs
 * wgmma (a question of the sm90 prefill kernel's soft cap, bench/RESULTS.md 2026-12-01).
 *
 * One CTA per SM (132 on an H200), two warpgroups. Warpgroup 0 streams 200 x 64 independent MUFU
 * operations per thread, each fed by an FFMA and followed by an FADD and an FMUL (ex2.approx: the
 * softmax's pattern; or tanh.approx: the soft cap's), and times them with clock64 (SM cycles, so
 * the figure does not move with the clock rate). Warpgroup 1 meanwhile is idle, or issues groups
 * of eight wgmma m64n128k16 bf16 (a 64 x 128 x 128 product, as one P V or Q K^T of the kernel)
 * back to back until warpgroup 0 is done: A from registers (RS, as P V) or from shared memory
 * (SS, as Q K^T). Prints the mean and largest cycles per MUFU warp instruction over the 528
 * warps of warpgroup 0 (8 is the pipe's rate: 16 operations per clock per SM).
 *
 *     nvcc -gencode arch=compute_90a,code=sm_90a -O3 -o mufu_wgmma bench/micro/mufu_wgmma.cu
 *     ./mufu_wgmma
 */
#include <stdio.h>

#include <cuda_runtime.h>

/* The kernels' wgmma fragments (kernels/wgmma.cuh) for bf16, without kernels/common.cuh, whose
 * fixed-width typedefs (written for NVRTC, which has no system headers) clash with the host's. */
#define CINFER_COMMON_CUH
#define CINFER_DT_BF16 2
#define CINFER_DTYPE_Q CINFER_DT_BF16
#include "../../kernels/wgmma.cuh"

enum { OTHER_IDLE, OTHER_WGMMA_RS, OTHER_WGMMA_SS };
enum { STREAM_EX2, STREAM_TANH };
#define REPS     200
#define SMEM     65536
#define SPIN     20000 /* cycles warpgroup 0 waits first, so that the other group's work runs */
#define MAX_CTAS 1024

/* Warpgroup 1: groups of eight wgmma (one k16 step each) until *done, A from registers (rs) or
 * from shared memory; one (inlined) function per form, so that no accumulator is shared by both
 * (ptxas would then wait between the products). */
#define OTHER_GROUP(name, PRODUCT)                                                                 \
    __device__ __forceinline__ void name(unsigned base, volatile int *done, float *sink) {         \
        float d[64];                                                                               \
        unsigned a[8][4];                                                                          \
        for (int i = 0; i < 64; i++)                                                               \
            d[i] = 0.0f;                                                                           \
        for (int k = 0; k < 8; k++)                                                                \
            for (int r = 0; r < 4; r++)                                                            \
                a[k][r] = 0x3f803f80u ^ (threadIdx.x * 7u + k * 4u + r);                           \
        while (!*done) {                                                                           \
            cinfer_wgmma_fence();                                                                  \
            _Pragma("unroll") for (int k = 0; k < 8; k++) PRODUCT;                                 \
            cinfer_wgmma_commit();                                                                 \
            CINFER_WGMMA_WAIT(0);                                                                  \
        }                                                                                          \
        float s = 0.0f;                                                                            \
        for (int i = 0; i < 64; i++)                                                               \
            s += d[i];                                                                             \
        if (s == 12345.0f) /* never: keeps the products */                                         \
            sink[threadIdx.x] = s;                                                                 \
    }
/* B as V in P V: MN-major, two 64-column blocks 8 KB apart */
OTHER_GROUP(other_group_rs,
            cinfer_wgmma_rs_tb(d, a[k], cinfer_wgmma_desc(base + 32768 + k * 2048, 8192, 1024)))
/* A and B K-major, 32 bytes per k16 step, as Q and K in Q K^T (a[k][0] & 0: a is unused here) */
OTHER_GROUP(other_group_ss,
            cinfer_wgmma_ss(d, cinfer_wgmma_desc(base + k * 32 + (a[k][0] & 0u), 0, 1024),
                            cinfer_wgmma_desc(base + 32768 + k * 32, 0, 1024), 1))

/* Warpgroup 0: REPS x 64 MUFU operations per thread; returns the cycles they took. */
__device__ long long mufu_stream(int stream, float *sink) {
    float x[64], sum = 0.0f;
    for (int i = 0; i < 64; i++)
        x[i] = -0.001f * (float)(threadIdx.x + i);
    long long t0 = clock64();
    while (clock64() - t0 < SPIN) {
    }
    t0 = clock64();
    if (stream == STREAM_EX2) {
        for (int r = 0; r < REPS; r++)
#pragma unroll
            for (int i = 0; i < 64; i++) {
                float y;
                asm volatile("ex2.approx.ftz.f32 %0, %1;"
                             : "=f"(y)
                             : "f"(fmaf(x[i], 0.999f, -1e-4f)));
                sum += y;
                x[i] = y * -0.5f;
            }
    } else {
        for (int r = 0; r < REPS; r++)
#pragma unroll
            for (int i = 0; i < 64; i++) {
                float y;
                asm volatile("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(fmaf(x[i], 0.999f, -1e-4f)));
                sum += y;
                x[i] = y * -0.5f;
            }
    }
    const long long t = clock64() - t0;
    if (sum == 12345.0f)
        sink[threadIdx.x] = sum;
    return t;
}

__global__ void __launch_bounds__(256, 1)
    bench(int other, int stream, long long *cycles, float *sink) {
    extern __shared__ __align__(1024) unsigned char smem[];
    __shared__ volatile int done;
    if (threadIdx.x == 0)
        done = 0;
    for (int i = threadIdx.x; i < SMEM / 4; i += blockDim.x)
        ((unsigned *)smem)[i] = (unsigned)i * 2654435761u & 0x3f803f80u; /* finite bf16 pairs */
    __syncthreads();
    unsigned base;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(base) : "l"(smem));
    if (threadIdx.x >= 128) {
        if (other == OTHER_WGMMA_RS)
            other_group_rs(base, &done, sink);
        else if (other == OTHER_WGMMA_SS)
            other_group_ss(base, &done, sink);
        return;
    }
    const long long t = mufu_stream(stream, sink);
    asm volatile("bar.sync 1, 128;" ::: "memory");
    if (threadIdx.x == 0)
        done = 1;
    if (threadIdx.x % 32 == 0)
        cycles[blockIdx.x * 4 + threadIdx.x / 32] = t;
}

int main(void) {
    int sms = 0;
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
    if (sms < 1 || sms > MAX_CTAS) {
        printf("mufu_wgmma: no usable CUDA device\n");
        return 1;
    }
    long long *cycles;
    float *sink;
    static long long host[MAX_CTAS * 4];
    if (cudaMalloc((void **)&cycles, sizeof host) != cudaSuccess ||
        cudaMalloc((void **)&sink, 256 * sizeof(float)) != cudaSuccess ||
        cudaFuncSetAttribute(bench, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM) !=
            cudaSuccess) {
        printf("mufu_wgmma: %s\n", cudaGetErrorString(cudaGetLastError()));
        return 1;
    }
    static const char *const others[] = {"other group idle", "other group wgmma, A in registers",
                                         "other group wgmma, A in shared memory"};
    static const char *const streams[] = {"ex2 (ffma, ex2, fadd, fmul)",
                                          "tanh (ffma, tanh, fadd, fmul)"};
    printf("| MUFU stream | beside it | cycles per MUFU warp instruction (mean / max over %d "
           "warps) |\n|---|---|---|\n",
           sms * 4);
    for (int stream = 0; stream < 2; stream++)
        for (int round = 0; round < 2; round++)
            for (int other = 0; other < 3; other++) {
                bench<<<sms, 256, SMEM>>>(other, stream, cycles, sink);
                if (cudaDeviceSynchronize() != cudaSuccess) {
                    printf("mufu_wgmma: %s\n", cudaGetErrorString(cudaGetLastError()));
                    return 1;
                }
                cudaMemcpy(host, cycles, sms * 4 * sizeof(long long), cudaMemcpyDeviceToHost);
                double sum = 0.0;
                long long most = 0;
                for (int i = 0; i < sms * 4; i++) {
                    sum += (double)host[i];
                    most = host[i] > most ? host[i] : most;
                }
                printf("| %s | %s | %.2f / %.2f |\n", streams[stream], others[other],
                       sum / (sms * 4) / (REPS * 64.0), (double)most / (REPS * 64.0));
            }
    return 0;
}
