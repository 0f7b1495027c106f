/*
 * Warpgroup tensor-core fragments of the sm90 backend (sm_90a only): wgmma.mma_async m64n128k16
 * (and m64n64k16: S of 64-row K tiles, P V at D = 64; m64n32k16: MLA's logits) with fp16/bf16
 * inputs and fp32 accumulators, shared-memory matrix descriptors of the 128-byte swizzled layout,
 * bulk tensor copies (TMA) that complete on an mbarrier, and the mbarrier operations the pipeline
 * uses. PTX ISA: "Asynchronous Warpgroup Level Matrix Multiply-Accumulate Instructions", "Tensor
 * Copy Instructions", "mbarrier".
 *
 * Layouts (a warpgroup is 4 consecutive warps, the first at a warp index divisible by 4; w = warp
 * % 4, g = lane / 4, t = lane % 4):
 *   D (64 x 128 fp32), 64 registers per thread: d[4 j + e] is row 16 w + g + 8 (e / 2), column
 *     8 j + 2 t + e % 2 (j = 0..15), the mma.m16n8 C layout of kernels/mma.cuh for each n8 tile.
 *   A from registers (64 x 16, 16-bit): 4 registers, the mma.m16n8k16 A layout of the warp's 16
 *     rows, so the D registers of two n8 tiles, packed in pairs, are the A registers of one k16
 *     step.
 *   A and B from shared memory, through a descriptor (start address, leading and stride byte
 *     offsets, swizzle mode). Tiles here are rows of 64 16-bit elements (128 bytes) in groups of 8
 *     rows (1024 bytes, 1024-aligned), the 16-byte chunk c of row r stored at chunk c ^ (r % 8):
 *     the 128-byte swizzle, which a TMA copy with CU_TENSOR_MAP_SWIZZLE_128B writes. A K-major
 *     operand (K contiguous: Q, and K as the B of Q K^T) steps along K by adding 32 bytes per k16
 *     step to the start; its stride byte offset is 1024 (one 8-row group to the next) and its
 *     leading byte offset is unused. An MN-major B (N contiguous: V as the B of P V, whose K is
 *     the KV rows) is read transposed (imm-trans-b 1): leading byte offset = the distance between
 *     blocks of 64 columns, stride byte offset = 1024 (one group of 8 K rows to the next).
 */
#ifndef CINFER_WGMMA_CUH
#define CINFER_WGMMA_CUH

#include "common.cuh"

/* A shared-memory matrix descriptor of the 128-byte swizzled layout (mode 1 in bits 62-63). */
__device__ __forceinline__ unsigned long long cinfer_wgmma_desc(unsigned smem_addr, unsigned lbo,
                                                                unsigned sbo) {
    return (unsigned long long)((smem_addr & 0x3ffffu) >> 4) |
           ((unsigned long long)(lbo >> 4) << 16) | ((unsigned long long)(sbo >> 4) << 32) |
           (1ull << 62);
}

/* Orders this thread's register accesses before the wgmma operations issued after it. */
__device__ __forceinline__ void cinfer_wgmma_fence(void) {
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
}

/* Closes the group of wgmma operations this warpgroup issued since the last commit. */
__device__ __forceinline__ void cinfer_wgmma_commit(void) {
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}

/* Waits until at most n (a compile-time constant) of this warpgroup's groups are pending. */
#define CINFER_WGMMA_WAIT(n) asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(n) : "memory")

/* Ties n (a compile-time constant) accumulators to this point of the program (an empty asm that
 * "changes" them): the compiler moves no access to them across it, so nothing reads or writes them
 * between a wgmma's issue and the wait that completes it. */
__device__ __forceinline__ void cinfer_wgmma_pin_n(float *d, const int n) {
#pragma unroll
    for (int i = 0; i < n; i++)
        asm volatile("" : "+f"(d[i])::"memory");
}

#define CINFER__WGMMA_D                                                                            \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "  \
    "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, "   \
    "%38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, "   \
    "%56, %57, %58, %59, %60, %61, %62, %63}"
#define CINFER__WGMMA_D_OPS(d)                                                                     \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),            \
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),    \
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), \
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), \
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), \
        "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), \
        "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), \
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), \
        "+f"(d[63])

/* The instruction's input type for a kernel's 16-bit dtype (fp16 where the kernel defines
 * CINFER_WGMMA_F16 first: the sm90 prefill kernel's fp8 K/V, converted to fp16). */
#if CINFER_DTYPE_Q == CINFER_DT_BF16 && !defined(CINFER_WGMMA_F16)
#define CINFER__WGMMA_TYPES ".f32.bf16.bf16"
#else
#define CINFER__WGMMA_TYPES ".f32.f16.f16"
#endif

/* d (+)= A B for A (64 x 16) and B (16 x 128) both K-major in shared memory; accumulate 0
 * overwrites d. */
__device__ __forceinline__ void cinfer_wgmma_ss(float *d, unsigned long long a_desc,
                                                unsigned long long b_desc, int accumulate) {
    asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %66, 0;\n\t"
                 "wgmma.mma_async.sync.aligned.m64n128k16" CINFER__WGMMA_TYPES " " CINFER__WGMMA_D
                 ", %64, %65, p, 1, 1, 0, 0;\n\t}"
                 : CINFER__WGMMA_D_OPS(d)
                 : "l"(a_desc), "l"(b_desc), "r"(accumulate));
}

/* d += A B for A (64 x 16) in registers and B (16 x 128) MN-major in shared memory. */
__device__ __forceinline__ void cinfer_wgmma_rs_tb(float *d, const unsigned *a,
                                                   unsigned long long b_desc) {
    asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, 1, 0;\n\t"
                 "wgmma.mma_async.sync.aligned.m64n128k16" CINFER__WGMMA_TYPES " " CINFER__WGMMA_D
                 ", {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n\t}"
                 : CINFER__WGMMA_D_OPS(d)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc));
}

#define CINFER__WGMMA_D32                                                                          \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "  \
    "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define CINFER__WGMMA_D32_OPS(d)                                                                   \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),            \
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),    \
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), \
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), \
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])

/* cinfer_wgmma_ss for B of 16 x 64 (d: 64 x 64 fp32, 32 registers per thread as below). */
__device__ __forceinline__ void cinfer_wgmma_ss_n64(float *d, unsigned long long a_desc,
                                                    unsigned long long b_desc, int accumulate) {
    asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %34, 0;\n\t"
                 "wgmma.mma_async.sync.aligned.m64n64k16" CINFER__WGMMA_TYPES " " CINFER__WGMMA_D32
                 ", %32, %33, p, 1, 1, 0, 0;\n\t}"
                 : CINFER__WGMMA_D32_OPS(d)
                 : "l"(a_desc), "l"(b_desc), "r"(accumulate));
}

/* cinfer_wgmma_rs_tb for B of 16 x 64 (one block of 64 columns): d (64 x 64 fp32) holds 32
 * registers per thread, d[4 j + e] as above for j = 0..7. */
__device__ __forceinline__ void cinfer_wgmma_rs_tb_n64(float *d, const unsigned *a,
                                                       unsigned long long b_desc) {
    asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, 1, 0;\n\t"
                 "wgmma.mma_async.sync.aligned.m64n64k16" CINFER__WGMMA_TYPES " " CINFER__WGMMA_D32
                 ", {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n\t}"
                 : CINFER__WGMMA_D32_OPS(d)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc));
}

#define CINFER__WGMMA_D16 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}"
#define CINFER__WGMMA_D16_OPS(d)                                                                   \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),            \
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),    \
        "+f"(d[14]), "+f"(d[15])

/* cinfer_wgmma_ss for B of 16 x 32 (d: 64 x 32 fp32, 16 registers per thread, d[4 j + e] as
 * above for j = 0..3; the MLA kernel's logits of 32-position tiles). */
__device__ __forceinline__ void cinfer_wgmma_ss_n32(float *d, unsigned long long a_desc,
                                                    unsigned long long b_desc, int accumulate) {
    asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %18, 0;\n\t"
                 "wgmma.mma_async.sync.aligned.m64n32k16" CINFER__WGMMA_TYPES " " CINFER__WGMMA_D16
                 ", %16, %17, p, 1, 1, 0, 0;\n\t}"
                 : CINFER__WGMMA_D16_OPS(d)
                 : "l"(a_desc), "l"(b_desc), "r"(accumulate));
}

/* Makes mbarrier initializations visible to the async proxy (TMA's completions). */
__device__ __forceinline__ void cinfer_mbarrier_init_fence(void) {
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

/* One arrival on bar that also expects `bytes` more bytes of copies to complete on it. */
__device__ __forceinline__ void cinfer_mbarrier_arrive_expect_tx(unsigned bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes)
                 : "memory");
}

/* One plain arrival on bar. */
__device__ __forceinline__ void cinfer_mbarrier_arrive(unsigned bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}

/* Copies the box at coordinates (c0, c1, c2) of the 3-d tensor map at generic address map into
 * shared memory at dst, counting its bytes on bar. */
__device__ __forceinline__ void cinfer_tma_load_3d(unsigned dst, const void *map, int c0, int c1,
                                                   int c2, unsigned bar) {
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes "
                 "[%0], [%1, {%2, %3, %4}], [%5];" ::"r"(dst),
                 "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
                 : "memory");
}

/* The same for a 4-d tensor map. */
__device__ __forceinline__ void cinfer_tma_load_4d(unsigned dst, const void *map, int c0, int c1,
                                                   int c2, int c3, unsigned bar) {
    asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes "
                 "[%0], [%1, {%2, %3, %4, %5}], [%6];" ::"r"(dst),
                 "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
                 : "memory");
}

/* The same for a 5-d tensor map. */
__device__ __forceinline__ void cinfer_tma_load_5d(unsigned dst, const void *map, int c0, int c1,
                                                   int c2, int c3, int c4, unsigned bar) {
    asm volatile("cp.async.bulk.tensor.5d.shared::cluster.global.mbarrier::complete_tx::bytes "
                 "[%0], [%1, {%2, %3, %4, %5, %6}], [%7];" ::"r"(dst),
                 "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4), "r"(bar)
                 : "memory");
}

#endif
