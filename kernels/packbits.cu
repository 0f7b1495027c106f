/*
 * Packing boolean arrays into bits: packbits (one array), and segment_packbits (each segment of a
 * ragged array packed on its own, in two kernels: the packed segments' indptr, then the bytes).
 * Element k of a group of 8 becomes bit k of its byte (little bit order) or bit 7 - k (big).
 *
 * Prelude: one of CINFER_OP_PACKBITS (with CINFER_VEC: 8 when x and y start on 16-byte
 * boundaries, else 1), CINFER_OP_SEGMENT_PACKBITS_INDPTR, CINFER_OP_SEGMENT_PACKBITS.
 */
#include "common.cuh"
#include "packbits_params.h"

#define BLOCK CINFER_PACKBITS_BLOCK

/* The bit of element k (0..7) of a group in the output byte. */
__device__ __forceinline__ unsigned bit_of(int k, int big) {
    return 1u << (big ? 7 - k : k);
}

/* Packs up to 8 elements x[start .. end) into one byte; elements outside [0, n) read as 0. */
__device__ __forceinline__ unsigned pack_range(const cinfer_packbits_params &p, long long start,
                                               long long end) {
    unsigned byte = 0;
#pragma unroll
    for (int k = 0; k < 8; k++) {
        const long long e = start + k;
        if (e < end && e >= 0 && e < p.n && p.x[e])
            byte |= bit_of(k, p.big);
    }
    return byte;
}

#if defined(CINFER_OP_PACKBITS)

#define VEC CINFER_VEC
#define BPT CINFER_PACKBITS_BYTES_PER_THREAD

/* One output byte from 8 input bytes held in a little-endian word (byte k = element k). */
__device__ __forceinline__ unsigned pack_word(unsigned lo, unsigned hi, int big) {
    const unsigned long long w = (unsigned long long)lo | ((unsigned long long)hi << 32);
    const unsigned long long low7 = 0x7f7f7f7f7f7f7f7full;
    /* Bit 7 of each byte is set iff the byte is nonzero: adding 0x7f to its low 7 bits carries
     * into bit 7 unless they are all 0 (at most 0xfe, so nothing crosses into the next byte), and
     * or-ing the byte itself covers bit 7. */
    const unsigned long long nonzero = (((w & low7) + low7) | w) & 0x8080808080808080ull;
    /* Byte k's flag, now at bit 8k, times the multiplier's bits 7 + 7i lands on bit 8k + 7 + 7i;
     * those positions are distinct for k, i in 0..7 (no carries), and i = 7 - k puts it at bit
     * 56 + k: the top byte holds the flags in little bit order. */
    const unsigned b = (unsigned)((((nonzero >> 7) * 0x0102040810204080ull) >> 56) & 0xffu);
    return big ? __brev(b) >> 24 : b;
}

/* One thread per BPT output bytes: 8 x 16 bytes in, 16 bytes out, where every input is in
 * range and the ends are aligned (vec 8); byte by byte otherwise and at the tail. */
extern "C" __global__ void __launch_bounds__(BLOCK)
    CINFER_KERNEL_NAME(const cinfer_packbits_params p) {
    const long long first = ((long long)blockIdx.x * BLOCK + threadIdx.x) * BPT;
    if (first >= p.y_len)
        return;
#if VEC == 8
    if ((first + BPT) * 8 <= p.n) {
        const uint4 *src = (const uint4 *)(p.x + first * 8);
        uint4 in[8];
#pragma unroll
        for (int i = 0; i < 8; i++)
            in[i] = src[i];
        unsigned words[4];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const uint4 a = in[2 * i], b = in[2 * i + 1];
            words[i] = pack_word(a.x, a.y, p.big) | (pack_word(a.z, a.w, p.big) << 8) |
                       (pack_word(b.x, b.y, p.big) << 16) | (pack_word(b.z, b.w, p.big) << 24);
        }
        *(uint4 *)(p.y + first) = make_uint4(words[0], words[1], words[2], words[3]);
        return;
    }
#endif
    const long long last = CINFER_MIN(first + BPT, p.y_len);
    for (long long o = first; o < last; o++)
        p.y[o] = (unsigned char)pack_range(p, o * 8, o * 8 + 8);
}

#elif defined(CINFER_OP_SEGMENT_PACKBITS_INDPTR)

#define SCAN CINFER_PACKBITS_SCAN_BLOCK

/* Packed bytes of segment s; a negative length counts as empty. */
__device__ __forceinline__ long long packed_len(const cinfer_packbits_params &p, long long s) {
    const long long len = (long long)p.indptr[s + 1] - p.indptr[s];
    return len > 0 ? (len + 7) / 8 : 0;
}

/*
 * One block: thread t sums the packed lengths of a contiguous run of segments, a block-wide
 * inclusive scan (Hillis-Steele over SCAN partial sums) gives each run its start, and the thread
 * writes its run's entries of indptr_new, saturated to the int32 range.
 */
extern "C" __global__ void __launch_bounds__(SCAN)
    CINFER_KERNEL_NAME(const cinfer_packbits_params p) {
    __shared__ long long sums[SCAN];
    const int t = threadIdx.x;
    const long long per = ((long long)p.batch_size + SCAN - 1) / SCAN;
    const long long begin = CINFER_MIN(t * per, (long long)p.batch_size);
    const long long end = CINFER_MIN(begin + per, (long long)p.batch_size);
    long long own = 0;
    for (long long s = begin; s < end; s++)
        own += packed_len(p, s);
    sums[t] = own;
    __syncthreads();
    for (int offset = 1; offset < SCAN; offset *= 2) {
        const long long add = t >= offset ? sums[t - offset] : 0;
        __syncthreads();
        sums[t] += add;
        __syncthreads();
    }
    long long prefix = sums[t] - own;
    if (t == 0)
        p.indptr_new[0] = 0;
    for (long long s = begin; s < end; s++) {
        prefix += packed_len(p, s);
        p.indptr_new[s + 1] = (int)CINFER_MIN(prefix, 2147483647ll);
    }
}

#elif defined(CINFER_OP_SEGMENT_PACKBITS)

/* One thread per output byte o < indptr_new[batch_size]: its segment by binary search over
 * indptr_new (empty segments are passed over), then its 8 elements. */
extern "C" __global__ void __launch_bounds__(BLOCK)
    CINFER_KERNEL_NAME(const cinfer_packbits_params p) {
    const long long o = (long long)blockIdx.x * BLOCK + threadIdx.x;
    if (o >= p.y_len || o >= p.indptr_new[p.batch_size])
        return;
    /* The first j in [1, batch_size] with indptr_new[j] > o; it exists, as o < indptr_new[B]. */
    int lo = 1, hi = p.batch_size;
    while (lo < hi) {
        const int mid = lo + (hi - lo) / 2;
        if (p.indptr_new[mid] > o)
            hi = mid;
        else
            lo = mid + 1;
    }
    const int s = lo - 1;
    const long long start = (long long)p.indptr[s] + 8 * (o - p.indptr_new[s]);
    const long long end = CINFER_MIN(start + 8, (long long)p.indptr[s + 1]);
    p.y[o] = (unsigned char)pack_range(p, start, end);
}

#endif
