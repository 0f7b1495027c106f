/*
 * Tensor-core fragments of the sm80 (FA2-style) backend, as C-style inline functions over inline
 * PTX: mma.sync m16n8k16 with fp16/bf16 inputs and fp32 accumulators, ldmatrix (plain and
 * transposed) from shared memory, cp.async global-to-shared copies with zero fill, and packing of
 * fp32 pairs into fp16x2/bf16x2 registers. Everything here is portable PTX for sm_80 and later.
 *
 * Fragment layouts of mma.m16n8k16.row.col (PTX ISA, "Matrix fragments for mma.m16n8k16"), with
 * g = lane / 4 and t = lane % 4:
 *   A (16 x 16, row-major), four 32-bit registers of two elements each:
 *     a0 = A[g][2t..2t+1], a1 = A[g+8][2t..2t+1], a2 = A[g][2t+8..2t+9], a3 = A[g+8][2t+8..2t+9];
 *   B (16 x 8, K x N, "col" = stored N-major), two registers:
 *     b0 = B[2t..2t+1][g], b1 = B[2t+8..2t+9][g];
 *   C/D (16 x 8 fp32), four registers:
 *     c0, c1 = C[g][2t], C[g][2t+1]; c2, c3 = C[g+8][2t], C[g+8][2t+1].
 * ldmatrix.x4 loads four 8 x 8 matrices of 16-bit elements; lane i gives the shared address of
 * row i % 8 of matrix i / 8, and register j of every lane receives matrix j's elements
 * [lane / 4][2 (lane % 4) .. +1] (with .trans: [2 (lane % 4) .. +1][lane / 4]), which is exactly
 * the A/B register layout above.
 *
 * Shared-memory addresses are 32-bit offsets in the shared window (what cvta.to.shared yields),
 * so address arithmetic stays in 32-bit registers.
 */
#ifndef CINFER_MMA_CUH
#define CINFER_MMA_CUH

/* The 32-bit shared-window address of a generic pointer into shared memory. */
__device__ __forceinline__ unsigned cinfer_smem_addr(const void *p) {
    unsigned addr;
    asm("{\n"
        "  .reg .u64 a;\n"
        "  cvta.to.shared.u64 a, %1;\n"
        "  cvt.u32.u64 %0, a;\n"
        "}"
        : "=r"(addr)
        : "l"(p));
    return addr;
}

/*
 * x, through an instruction the compiler cannot look into or move out of a loop. A kernel copies
 * its per-lane shared-memory addresses through this at the top of each loop iteration, so that
 * every address it derives there (the lane's address plus a compile-time offset) is formed in the
 * loop, where ptxas folds the offset into the load, instead of being hoisted before the loop as
 * one live register per distinct offset.
 */
__device__ __forceinline__ unsigned cinfer_opaque_u32(unsigned x) {
    unsigned y;
    asm volatile("mov.b32 %0, %1;" : "=r"(y) : "r"(x));
    return y;
}

/* d += a * b on fp16 inputs (m16n8k16, fp32 accumulate); a: 4 registers, b: 2, d: 4 floats. */
__device__ __forceinline__ void cinfer_mma_f16(float *d, const unsigned *a, const unsigned *b) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

/* d += a * b on bf16 inputs (m16n8k16, fp32 accumulate). */
__device__ __forceinline__ void cinfer_mma_bf16(float *d, const unsigned *a, const unsigned *b) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

/* Dispatch on a compile-time dtype (the branch folds away). */
__device__ __forceinline__ void cinfer_mma(int dtype, float *d, const unsigned *a,
                                           const unsigned *b) {
    if (dtype == CINFER_DT_BF16)
        cinfer_mma_bf16(d, a, b);
    else
        cinfer_mma_f16(d, a, b);
}

/* Four 8 x 8 matrices of 16-bit elements from shared memory into dst[0..3]. The "memory" clobber
 * keeps the compiler from moving the read across the barriers that publish cp.async data. */
__device__ __forceinline__ void cinfer_ldmatrix_x4(unsigned *dst, unsigned smem_addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(dst[0]), "=r"(dst[1]), "=r"(dst[2]), "=r"(dst[3])
                 : "r"(smem_addr)
                 : "memory");
}

/* The same, each matrix transposed (B fragments of a row-major K x N operand such as V). */
__device__ __forceinline__ void cinfer_ldmatrix_x4_trans(unsigned *dst, unsigned smem_addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(dst[0]), "=r"(dst[1]), "=r"(dst[2]), "=r"(dst[3])
                 : "r"(smem_addr)
                 : "memory");
}

/*
 * Copies 16 bytes from global src to shared dst asynchronously, bypassing L1 (.cg: every byte is
 * used once per CTA). When valid is false nothing is read and the 16 bytes are zero-filled
 * (src-size 0), so rows past the end of a tensor become zeros; src must still be a mapped
 * address, callers pass the tensor's base.
 */
__device__ __forceinline__ void cinfer_cp_async_16(unsigned dst, const void *src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src),
                 "r"(valid ? 16 : 0)
                 : "memory");
}

/* Copies 4 bytes from global src to shared dst asynchronously, through L1 (.ca: .cg copies only
 * 16 bytes), or zero-fills them when valid is false (src must still be a mapped address). */
__device__ __forceinline__ void cinfer_cp_async_4(unsigned dst, const void *src, bool valid) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(dst), "l"(src),
                 "r"(valid ? 4 : 0)
                 : "memory");
}

/* Closes the group of cp.async copies issued by this thread since the last commit. */
__device__ __forceinline__ void cinfer_cp_async_commit(void) {
    asm volatile("cp.async.commit_group;" ::: "memory");
}

/* Waits until at most n (a compile-time constant) of this thread's groups are still in flight. */
#define CINFER_CP_ASYNC_WAIT(n) asm volatile("cp.async.wait_group %0;" ::"n"(n) : "memory")

/* An mbarrier (8 bytes of shared memory at a shared-window address) expecting `count` arrivals per
 * phase. Publish the initialization with a CTA barrier before any thread uses it. */
__device__ __forceinline__ void cinfer_mbarrier_init(unsigned bar, unsigned count) {
    asm volatile("mbarrier.init.shared.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}

/* One arrival on `bar`, made once every cp.async this thread issued so far has landed; a thread
 * that passes the phase's wait then sees those bytes. */
__device__ __forceinline__ void cinfer_cp_async_mbarrier_arrive(unsigned bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared.b64 [%0];" ::"r"(bar) : "memory");
}

/* Waits until the phase of `bar` with this parity (0 for its first, 1 for its second, ...)
 * has completed: try_wait (which may suspend the thread for a while) from sm_90, test_wait (a
 * poll) before, where try_wait does not exist. */
#if __CUDA_ARCH__ >= 900
#define CINFER__MBARRIER_POLL "try_wait"
#else
#define CINFER__MBARRIER_POLL "test_wait"
#endif
__device__ __forceinline__ void cinfer_mbarrier_wait(unsigned bar, unsigned parity) {
    unsigned done;
    do {
        asm volatile("{\n\t.reg .pred p;\n\t"
                     "mbarrier." CINFER__MBARRIER_POLL ".parity.shared.b64 p, [%1], %2;\n\t"
                     "selp.u32 %0, 1, 0, p;\n\t}"
                     : "=r"(done)
                     : "r"(bar), "r"(parity)
                     : "memory");
    } while (!done);
}

/* Two floats as one fp16x2 / bf16x2 register (round to nearest even), lo in the low half. */
__device__ __forceinline__ unsigned cinfer_pack_half2(int dtype, float lo, float hi) {
    unsigned r;
    if (dtype == CINFER_DT_BF16)
        asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    else
        asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

/* 4 bytes to shared memory at a shared-window address. */
__device__ __forceinline__ void cinfer_st_shared_u32(unsigned smem_addr, unsigned v) {
    asm volatile("st.shared.u32 [%0], %1;" ::"r"(smem_addr), "r"(v) : "memory");
}

/* A float from shared memory at a shared-window address (volatile: ordered after barriers). */
__device__ __forceinline__ float cinfer_ld_shared_f32(unsigned smem_addr) {
    float v;
    asm volatile("ld.shared.f32 %0, [%1];" : "=f"(v) : "r"(smem_addr) : "memory");
    return v;
}

/* 16 bytes to shared memory at a shared-window address. */
__device__ __forceinline__ void cinfer_st_shared_v4(unsigned smem_addr, uint4 v) {
    asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};" ::"r"(smem_addr), "r"(v.x), "r"(v.y),
                 "r"(v.z), "r"(v.w)
                 : "memory");
}

/* 16 bytes from shared memory at a shared-window address. */
__device__ __forceinline__ uint4 cinfer_ld_shared_v4(unsigned smem_addr) {
    uint4 v;
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "r"(smem_addr)
                 : "memory");
    return v;
}

#endif
