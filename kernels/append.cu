/*
 * The paged KV cache's page-table kernels: appending the K/V rows of new tokens to their pages
 * (append_paged_kv_cache), the request and position of each appended token
 * (batch_indices_positions) and the KV length of each request (seq_lens).
 *
 * Prelude: one of CINFER_OP_APPEND_PAGED_KV_CACHE, CINFER_OP_BATCH_INDICES_POSITIONS,
 * CINFER_OP_SEQ_LENS. The append also gets CINFER_DTYPE_O (the appended rows: fp16 or bf16),
 * CINFER_DTYPE_KV (the cache: fp16, bf16, e4m3 or e5m2), CINFER_HEAD_DIM_VO (D) and CINFER_VEC
 * (8 when D % 8 == 0 and every row starts on a 16-byte boundary, 8-byte for fp8 caches; else 1).
 */
#include "common.cuh"
#include "append_params.h"

#define BLOCK CINFER_APPEND_BLOCK

#if defined(CINFER_OP_APPEND_PAGED_KV_CACHE)

#define D       CINFER_HEAD_DIM_VO
#define VEC     CINFER_VEC
#define CHUNKS  (D / VEC)
#define SRC_DT  CINFER_DTYPE_O
#define DST_DT  CINFER_DTYPE_KV
#define DST_FP8 (DST_DT == CINFER_DT_E4M3 || DST_DT == CINFER_DT_E5M2)

/*
 * float -> OCP fp8 (e4m3fn or e5m2) bits, rounded to nearest even and saturated: a magnitude that
 * rounds above the largest finite value (448, 57344), infinity included, becomes it; NaN becomes
 * 0x7f (e4m3) or 0x7e (e5m2). Integer arithmetic on the float's bits, so every arch (sm_80 has
 * no fp8 conversion instruction) stores the same bits.
 */
__device__ __forceinline__ unsigned cinfer_f32_to_fp8(int dtype, float f) {
    const bool e4m3 = dtype == CINFER_DT_E4M3;
    const unsigned bits = __float_as_uint(f);
    const unsigned sign = (bits >> 24) & 0x80u;
    const unsigned mag = bits & 0x7fffffffu;
    if (mag > 0x7f800000u)
        return e4m3 ? 0x7fu : 0x7eu;
    const float a = __uint_as_float(mag);
    unsigned code;
    if (a < (e4m3 ? 0x1p-6f : 0x1p-14f)) {
        /* Below the smallest normal the grid is uniform (steps of 2^-9, 2^-16): scaling by a power
         * of two is exact and rintf rounds half to even. A result of 8 (4) is the smallest normal's
         * code, so it needs no special case. */
        code = (unsigned)rintf(a * (e4m3 ? 0x1p9f : 0x1p16f));
    } else {
        /* Keep 3 (2) mantissa bits: round the dropped ones half to even by adding just under half
         * plus the lowest kept bit; a carry moves into the exponent, as it should. Then rebias the
         * exponent from 127 to 7 (15). */
        const int drop = e4m3 ? 20 : 21;
        const unsigned rounded = mag + ((1u << (drop - 1)) - 1u) + ((mag >> drop) & 1u);
        code = (rounded >> drop) - (e4m3 ? (120u << 3) : (112u << 2));
    }
    const unsigned max_code = e4m3 ? 0x7eu : 0x7bu;
    return sign | (code > max_code ? max_code : code);
}

/* A 16-byte store as one instruction. Built from converted halves, a uint4 store can be split
 * into four 4-byte stores by the compiler (seen on sm_90a when the row offset is a loop
 * induction variable); the PTX vector store cannot. */
__device__ __forceinline__ void store16(void *dst, uint4 v) {
    asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(dst), "r"(v.x), "r"(v.y),
                 "r"(v.z), "r"(v.w)
                 : "memory");
}

/* Stores VEC elements (x holds them as loaded from the appended row) at element `offset` of a
 * cache, converted to the cache's dtype. */
#if VEC == 8
__device__ __forceinline__ void store_row(void *cache, long long offset, uint4 x, float inv_scale) {
#if DST_DT == SRC_DT
    *(uint4 *)((cinfer_half_bits *)cache + offset) = x;
#elif DST_FP8
    float f[8];
    cinfer_unpack8(f, SRC_DT, x);
    unsigned words[2] = {0u, 0u};
#pragma unroll
    for (int i = 0; i < 8; i++)
        words[i / 4] |= cinfer_f32_to_fp8(DST_DT, f[i] * inv_scale) << (8 * (i % 4));
    *(uint2 *)((unsigned char *)cache + offset) = make_uint2(words[0], words[1]);
#else
    float f[8];
    cinfer_unpack8(f, SRC_DT, x);
    store16((cinfer_half_bits *)cache + offset, cinfer_pack8(DST_DT, f));
#endif
}
typedef uint4 row_t;
#define LOAD_ROW(ptr) (*(const uint4 *)(ptr))
#else
__device__ __forceinline__ void store_row(void *cache, long long offset, cinfer_half_bits x,
                                          float inv_scale) {
#if DST_DT == SRC_DT
    ((cinfer_half_bits *)cache)[offset] = x;
#elif DST_FP8
    ((unsigned char *)cache)[offset] =
        (unsigned char)cinfer_f32_to_fp8(DST_DT, cinfer_half_to_f32(SRC_DT, x) * inv_scale);
#else
    ((cinfer_half_bits *)cache)[offset] = cinfer_f32_to_half(DST_DT, cinfer_half_to_f32(SRC_DT, x));
#endif
}
typedef cinfer_half_bits row_t;
#define LOAD_ROW(ptr) (*(ptr))
#endif

/*
 * One warp per appended token. The warp resolves the token's page once (every lane reads the same
 * words, served by one broadcast), then its lanes stride over the token's (head, chunk) pairs and
 * copy the K and V chunks. A token that cannot be written is skipped and reported in the error
 * flag; a batch index of -1 (padding) is skipped silently.
 */
extern "C" __global__ void __launch_bounds__(BLOCK)
    CINFER_KERNEL_NAME(const cinfer_append_params p) {
    const int lane = threadIdx.x % 32;
    const long long token =
        (long long)blockIdx.x * CINFER_APPEND_TOKENS_PER_BLOCK + threadIdx.x / 32;
    if (token >= p.nnz)
        return;
    const int b = p.batch_indices[token];
    if (b == -1)
        return;
    const int pos = p.positions[token];
    int error = 0, slot = 0;
    long long page = 0;
    if (b < 0 || b >= p.batch_size) {
        error = CINFER_APPEND_ERR_BATCH;
    } else {
        /* 64-bit: the page count and the request's capacity come from unchecked device data. */
        const long long begin = p.kv_indptr[b];
        const long long pages = (long long)p.kv_indptr[b + 1] - begin;
        if (pos < 0 || (long long)pos >= pages * p.page_size) {
            error = CINFER_APPEND_ERR_POSITION;
        } else {
            int page_slot;
            if (p.page_shift >= 0) {
                page_slot = pos >> p.page_shift;
                slot = pos & ((1 << p.page_shift) - 1);
            } else {
                page_slot = pos / p.page_size;
                slot = pos - page_slot * p.page_size;
            }
            const long long entry = begin + page_slot;
            if (entry < 0 || entry >= p.num_indices) {
                error = CINFER_APPEND_ERR_PAGE;
            } else {
                page = p.kv_indices[entry];
                if (page < 0 || page >= p.max_pages)
                    error = CINFER_APPEND_ERR_PAGE;
            }
        }
    }
    if (error) {
        if (lane == 0 && p.error_flag)
            atomicOr(p.error_flag, error);
        return;
    }

    const cinfer_half_bits *k_row = (const cinfer_half_bits *)p.src[0] + token * p.src_stride[0][0];
    const cinfer_half_bits *v_row = (const cinfer_half_bits *)p.src[1] + token * p.src_stride[1][0];
    const long long k_base = page * p.cache_stride[0][0] + (long long)slot * p.cache_stride[0][1];
    const long long v_base = page * p.cache_stride[1][0] + (long long)slot * p.cache_stride[1][1];
    for (int i = lane; i < p.num_heads * CHUNKS; i += 32) {
        const int head = i / CHUNKS;
        const int d = (i - head * CHUNKS) * VEC;
        /* Both loads are issued before either store. */
        const row_t k = LOAD_ROW(k_row + (long long)head * p.src_stride[0][1] + d);
        const row_t v = LOAD_ROW(v_row + (long long)head * p.src_stride[1][1] + d);
        store_row(p.cache[0], k_base + (long long)head * p.cache_stride[0][2] + d, k,
                  p.inv_scale[0]);
        store_row(p.cache[1], v_base + (long long)head * p.cache_stride[1][2] + d, v,
                  p.inv_scale[1]);
    }
}

#elif defined(CINFER_OP_BATCH_INDICES_POSITIONS)

/*
 * One thread per entry i: the request b with append_indptr[b] <= i < append_indptr[b + 1] by
 * binary search (requests with no appended token are passed over), then its position counted
 * back from the request's new length. Entries no request covers get (-1, -1).
 */
extern "C" __global__ void __launch_bounds__(BLOCK)
    CINFER_KERNEL_NAME(const cinfer_batch_indices_params p) {
    const long long i = (long long)blockIdx.x * BLOCK + threadIdx.x;
    if (i >= p.nnz)
        return;
    /* The first j in [1, batch_size] with append_indptr[j] > i, or batch_size + 1. */
    int lo = 1, hi = p.batch_size + 1;
    while (lo < hi) {
        const int mid = lo + (hi - lo) / 2;
        if (p.append_indptr[mid] > i)
            hi = mid;
        else
            lo = mid + 1;
    }
    int b = lo - 1;
    long long pos = -1;
    /* The second test also rejects i < append_indptr[0] (b = 0) and, with an indptr that is not
     * non-decreasing, a request that does not actually contain i. */
    if (lo <= p.batch_size && p.append_indptr[b] <= i) {
        const long long begin = p.append_indptr[b];
        const long long len = (long long)p.append_indptr[b + 1] - begin;
        pos = (long long)p.seq_lens[b] - len + (i - begin);
    } else {
        b = -1;
    }
    p.batch_indices[i] = b;
    p.positions[i] = (int)pos;
}

#elif defined(CINFER_OP_SEQ_LENS)

/* One thread per request: (pages - 1) * page_size + last_page_len, 0 without pages, in 64 bits
 * saturated to the int32 range. */
extern "C" __global__ void __launch_bounds__(BLOCK)
    CINFER_KERNEL_NAME(const cinfer_seq_lens_params p) {
    const long long b = (long long)blockIdx.x * BLOCK + threadIdx.x;
    if (b >= p.batch_size)
        return;
    const long long pages = (long long)p.kv_indptr[b + 1] - p.kv_indptr[b];
    long long len = pages > 0 ? (pages - 1) * p.page_size + p.kv_last_page_len[b] : 0;
    len = CINFER_MAX(CINFER_MIN(len, 2147483647ll), -2147483647ll - 1);
    p.seq_lens[b] = (int)len;
}

#endif
