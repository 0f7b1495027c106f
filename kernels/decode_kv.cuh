/*
 * KV token addressing of the decode kernels (decode.cu, decode_tc.cu): where token t of a request
 * lives in a paged cache (CINFER_PAGED = 1) or in one contiguous sequence (single decode).
 */
#ifndef CINFER_DECODE_KV_CUH
#define CINFER_DECODE_KV_CUH

#include "decode_params.h"

/* Element offset of token t's head-0 row; page_begin = kv_indptr[request]. 64-bit throughout:
 * page indices near 2^31 / page_size are valid. Power-of-two page sizes avoid the division. */
__device__ __forceinline__ long long cinfer_decode_token_offset(const cinfer_decode_params &p,
                                                                int page_begin, int t) {
#if CINFER_PAGED
    int page_slot, in_page;
    if (p.page_shift >= 0) {
        page_slot = t >> p.page_shift;
        in_page = t & ((1 << p.page_shift) - 1);
    } else {
        page_slot = t / p.page_size;
        in_page = t - page_slot * p.page_size;
    }
    const long long page = p.kv_indices[page_begin + page_slot];
    return page * p.kv_stride_page + (long long)in_page * p.kv_stride_token;
#else
    return (long long)t * p.kv_stride_token;
#endif
}

#endif
