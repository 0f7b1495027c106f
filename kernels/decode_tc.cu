/*
 * Decode attention on tensor cores: the query heads of one GQA group slice (HPC <= 16 heads) are
 * the rows of an m16n8k16 tile, so one mma.sync computes 16 heads x 8 KV tokens of logits, and the
 * dot products, the exp2 and the accumulation stop costing more issue slots than the bytes take
 * to arrive. Same work items, partial states and merge kernel as kernels/decode.cu.
 *
 * Each of the WARPS warps walks its own tiles of TOKENS tokens (16 for 16-bit KV) of the work
 * item's KV range (tile i of warp w covers tokens kv_begin + (i * WARPS + w) * TOKENS ..), staged
 * through STAGES shared-memory buffers per warp with cp.async, so the warps never wait for each
 * other until the final merge of their online-softmax states. A tile row (one token of K or V) is
 * D 16-bit elements; the 16-byte chunk c of token t is stored at chunk c ^ (t % 8), so the eight
 * rows an ldmatrix phase reads fall in eight different bank groups.
 *
 * S = Q K^T: Q (HPC rows, padded to 16 with zero rows) stays in A-fragment registers; K comes from
 * ldmatrix (non-transposed: K stored [token][d] is the "col" B operand). P V: P is rebuilt from
 * the S accumulators as an A fragment (the FA2 register trick) and V comes from ldmatrix.trans.
 *
 * fp8 KV (e4m3, e5m2): a warp tile is 32 tokens (the stage bytes of a 16-bit tile, so as many
 * bytes stay in flight), kept in shared memory as loaded, and the mma B fragments are built from
 * the fp8 bytes in registers (kernels/dtype.cuh; exact; both mmas run in fp16, with q converted
 * to fp16 after multiplying it by q_in_scale = sm_scale, so that |q| up to 65504 / sm_scale stays
 * finite). ldmatrix reads the fp8 rows as 16-bit pairs:
 *  - K (plain): lane (g, t) gets token g's bytes 4t .. 4t + 3 of a 16-byte chunk. The mma's k order
 *    inside each 16-dim step is permuted so that these are its k slots 2t, 2t + 1 (low pair) and
 *    2t + 8, 2t + 9 (high pair); Q's A fragments are loaded in the same permuted order.
 *  - V (transposed): lane (g, t) gets the pairs (2g, 2g + 1) of tokens 2t and 2t + 1; byte permutes
 *    split them into the B fragments of two n8 tiles, one of the chunk's even dims (16 c + 2 g)
 *    and one of its odd dims (16 c + 2 g + 1). The output columns are permuted the same way and
 *    put back in order by the final merge.
 * Q's A fragments wait in shared memory (Q_BYTES, one copy for the CTA), not in registers: from
 * registers ptxas rebuilt them around the mmas (60-90 moves a tile at D = 128) and spilled at
 * D = 256, where the 128 output accumulators leave no room.
 * The 16-byte chunk c of token t sits at chunk c ^ f(t), f(t) = 2 (t % 4) + (t / 4) % 2 (at
 * D = 64, where two 64-byte rows share a 128-byte line, f(t) = the two bits of t / 2 % 4 swapped):
 * the eight rows an ldmatrix phase reads fall in eight different bank groups (a cp.async copy
 * writes whole rows, see load_tile, conflict-free under any chunk permutation).
 *
 * Prelude: CINFER_DTYPE_Q/O (fp16 or bf16), CINFER_DTYPE_KV (the same as q, or e4m3 / e5m2),
 * CINFER_HEAD_DIM_QK (== VO, 64, 128 or 256), CINFER_PAGED, CINFER_SOFTCAP, CINFER_TILE_Q (HPC),
 * CINFER_WARPS, CINFER_STAGES.
 */
#include "common.cuh"
#include "decode_kv.cuh"
#include "decode_params.h"
#include "decode_work.cuh"
#include "mma.cuh"
#include "soft_cap.cuh"
#include "variant.cuh"

#define D       CINFER_HEAD_DIM_VO
#define HPC     CINFER_TILE_Q
#define WARPS   CINFER_WARPS
#define STAGES  CINFER_STAGES
#define THREADS (WARPS * 32)
#define CHUNKS  (D / 8)  /* 8-element chunks per token row (16 bytes of 16-bit KV) */
#define KSTEPS  (D / 16) /* k16 steps of Q K^T */
#if CINFER_DTYPE_KV == CINFER_DT_E4M3 || CINFER_DTYPE_KV == CINFER_DT_E5M2
#define KV_FP8 1
#define MMA_DT CINFER_DT_F16 /* the dtype both mmas run in */
#define TOKENS CINFER_DECODE_TC_TOKENS_FP8
#else
#define KV_FP8 0
#define MMA_DT CINFER_DTYPE_KV
#define TOKENS CINFER_DECODE_TC_TOKENS
#endif
#define NTILES_S   (TOKENS / 8)  /* n8 tiles of S = Q K^T (tokens) */
#define KSTEPS_PV  (TOKENS / 16) /* k16 steps of P V (tokens) */
#define NTILES_O   (D / 8)       /* n8 tiles of the output */
#define ROW_BYTES  (D * (KV_FP8 ? 1 : 2))
#define ROW_CHUNKS (ROW_BYTES / 16) /* 16-byte chunks per token row */
/* One K or V tile of TOKENS rows, as loaded; a stage holds K then V. */
#define TILE_BYTES  (TOKENS * ROW_BYTES)
#define STAGE_BYTES (2 * TILE_BYTES)
#define WARP_BYTES  (STAGES * STAGE_BYTES)
/* fp8: Q's A fragments in shared memory (after every warp's stages); 16-bit KV: 0, in registers. */
#define Q_BYTES CINFER_DECODE_TC_Q_BYTES(KV_FP8, D)

/* Shared offset of 16-byte chunk c of token row t in a tile (swizzled, see above). */
__device__ __forceinline__ unsigned tile_offset(int t, int c) {
#if !KV_FP8
    return (unsigned)(t * ROW_BYTES + ((c ^ (t % 8)) * 16));
#elif ROW_CHUNKS >= 8
    const int f = ((t % 4) << 1) | ((t / 4) % 2);
    return (unsigned)(t * ROW_BYTES + ((c ^ f) * 16));
#else
    const int h = (t / 2) % 4, f = ((h & 1) << 1) | (h >> 1);
    return (unsigned)(t * ROW_BYTES + ((c ^ f) * 16));
#endif
}

/* Token t0 + l of a tile is lane l's (l < TOKENS: 16 tokens of 16-bit KV, 32 of fp8; the other
 * lanes of a 16-bit tile look up tokens they never copy). Its place in the cache is found once per
 * tile, the page-table read one iteration before the tile's copies are issued, so that its latency
 * hides behind a tile of math instead of delaying the copies (a dependent read ahead of every
 * tile's copies otherwise); the copies take each row's offset from its lane by shuffle. Lanes past
 * kv_end take the last token's place: a mapped address for the zero-filled copies. */
typedef struct lane_kv {
    int page, in_page; /* paged: the token's page and slot; contiguous: page 0, slot = token */
} lane_kv;

__device__ __forceinline__ lane_kv lane_token(const cinfer_decode_params &p, int page_begin, int t0,
                                              int kv_end, int lane) {
    const int t = CINFER_MIN(t0 + lane, kv_end - 1);
    lane_kv x;
#if CINFER_PAGED
    cinfer_decode_token_page(p, page_begin, t, &x.page, &x.in_page);
#else
    x.page = 0;
    x.in_page = t;
#endif
    return x;
}

/* Issues the cp.async copies of one warp tile (tokens t0 .. t0 + TOKENS - 1, those < kv_end) into
 * the stage at shared address `stage`; rows past kv_end are zero-filled. Copy instruction i reads
 * rows whole: its 32 lanes take the 16-byte chunks i * 32 + lane of the tile in row order (2 rows
 * of 256 bytes at D = 128 with 16-bit KV, 4 rows of 128 bytes with fp8), each row's offset by
 * shuffle from the lane it belongs to. A row is then one L2 request of full sectors, where one
 * sector of 16 rows per instruction (fp8's previous scheme, two shuffles a tile) made four
 * requests of one sector per row and left the fp8 kernel bound by L2 requests (ncu: L2 80% busy
 * at 60% of DRAM bandwidth). */
__device__ __forceinline__ void load_tile(const cinfer_decode_params &p, lane_kv x,
                                          long long head_offset, int t0, int kv_end, unsigned stage,
                                          int lane) {
#if CINFER_PAGED
    const long long mine = cinfer_decode_slot_offset(p, x.page, x.in_page) + head_offset;
#else
    const long long mine = (long long)x.in_page * p.kv_stride_token + head_offset;
#endif
#pragma unroll
    for (int i = 0; i < TOKENS * ROW_CHUNKS / 32; i++) {
        const int idx = i * 32 + lane, t = idx / ROW_CHUNKS, c = idx % ROW_CHUNKS;
        const long long row = ((long long)__shfl_sync(0xffffffffu, (int)(mine >> 32), t) << 32) |
                              (unsigned)__shfl_sync(0xffffffffu, (int)mine, t);
        const bool valid = t0 + t < kv_end;
        const unsigned dst = stage + tile_offset(t, c);
        /* row counts elements: bytes for fp8, 16-bit units otherwise */
        const long long at = row * (ROW_BYTES / D) + c * 16;
        cinfer_cp_async_16(dst, (const unsigned char *)p.k + at, valid);
        cinfer_cp_async_16(dst + TILE_BYTES, (const unsigned char *)p.v + at, valid);
    }
}

/* Hooks that need the query's position. */
#define NEEDS_POS                                                                                  \
    (VARIANT_QUERY_TRANSFORM || CINFER_VARIANT_LOGITS || VARIANT_STATE_INIT ||                     \
     VARIANT_OUTPUT_TRANSFORM)

/* fp8 KV below D = 256: registers for 12 warps per SM (what 2 stages of shared memory allow at
 * D = 128: 4 CTAs of 3 warps); without the hint ptxas aims at more CTAs and spills at D = 64. At
 * D = 256 a hint made it spill instead. */
#if KV_FP8 && D < 256
#define LAUNCH_BOUNDS __launch_bounds__(THREADS, 12 / WARPS)
#else
#define LAUNCH_BOUNDS __launch_bounds__(THREADS)
#endif

extern "C" __global__ void LAUNCH_BOUNDS CINFER_KERNEL_NAME(const cinfer_decode_params p,
                                                            const cinfer_variant_params vp) {
    extern __shared__ __align__(128) unsigned char smem[];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int g = lane / 4, tq = lane % 4;
    const int group = p.num_qo_heads / p.num_kv_heads;
    const int slices_per_head = group / HPC;
    const unsigned warp_smem = cinfer_smem_addr(smem) + (unsigned)(warp * WARP_BYTES);
#if Q_BYTES
    /* Lane l's 16 bytes of k step ks (the same in every warp). */
    const unsigned q_smem = cinfer_smem_addr(smem) + (unsigned)(WARPS * WARP_BYTES + lane * 16);
#endif

    /* The first item (decode_work.cuh), and each next one (the item's link) while the current one
     * runs: an item's start then waits for its page-table entries and KV only (the item carries
     * kv_indptr[request] and kv_len). */
    int num_ctas;
    cinfer_decode_work next_item = cinfer_decode_first_work(p, &num_ctas);
    /* The merge kernel (a programmatic dependent launch) may start its blocks now: they wait for
     * this grid to finish before they read a partial state. */
    cinfer_pdl_launch_dependents();
    for (int w = (int)blockIdx.x < num_ctas ? (int)blockIdx.x : -1; w >= 0;) {
        const cinfer_decode_work item = next_item;
        w = item.next;
        if (w >= 0)
            next_item = cinfer_decode_load_work(p.work, w);
        const int b = item.request;
        const int kv_head = item.slice / slices_per_head;
        const int qo_head0 = cinfer_decode_item_head(&item, kv_head, group, slices_per_head, HPC);
#if NEEDS_POS
        const int qo_pos = item.kv_len - 1; /* the query's absolute position */
#endif

        /* Q as A fragments: rows g and g + 8 are query heads qo_head0 + row (zero past HPC); with
         * fp8 KV in the permuted k order (registers 0 and 2 of a k step are one 8-byte load). */
        unsigned qa[KSTEPS][4];
        {
            const unsigned *q_lo = NULL, *q_hi = NULL;
            if (g < HPC)
                q_lo = (const unsigned *)((const unsigned short *)p.q + b * p.q_stride_n +
                                          (long long)(qo_head0 + g) * p.q_stride_h);
            if (g + 8 < HPC)
                q_hi = (const unsigned *)((const unsigned short *)p.q + b * p.q_stride_n +
                                          (long long)(qo_head0 + g + 8) * p.q_stride_h);
#pragma unroll
            for (int ks = 0; ks < KSTEPS; ks++) {
#if KV_FP8
                const uint2 lo = q_lo ? *(const uint2 *)(q_lo + ks * 8 + 2 * tq) : make_uint2(0, 0);
                const uint2 hi = q_hi ? *(const uint2 *)(q_hi + ks * 8 + 2 * tq) : make_uint2(0, 0);
                qa[ks][0] = lo.x;
                qa[ks][1] = hi.x;
                qa[ks][2] = lo.y;
                qa[ks][3] = hi.y;
#else
                qa[ks][0] = q_lo ? q_lo[ks * 8 + tq] : 0u;
                qa[ks][1] = q_hi ? q_hi[ks * 8 + tq] : 0u;
                qa[ks][2] = q_lo ? q_lo[ks * 8 + 4 + tq] : 0u;
                qa[ks][3] = q_hi ? q_hi[ks * 8 + 4 + tq] : 0u;
#endif
            }
        }
#if VARIANT_QUERY_TRANSFORM || KV_FP8
        /* Through the query transform and, for fp8 KV, scaled by q_in_scale into fp16. Register j
         * of k step ks holds row g + 8 (j % 2), dims ks * 16 + 8 (j / 2) + 2 tq + 0..1 (fp8 KV:
         * ks * 16 + 4 tq + 2 (j / 2) + 0..1). */
#pragma unroll
        for (int ks = 0; ks < KSTEPS; ks++) {
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const int row = g + 8 * (j % 2);
                if (row < HPC) {
                    const unsigned w = qa[ks][j];
                    float lo = cinfer_half_to_f32(CINFER_DTYPE_Q, (cinfer_half_bits)(w & 0xffffu));
                    float hi = cinfer_half_to_f32(CINFER_DTYPE_Q, (cinfer_half_bits)(w >> 16));
#if VARIANT_QUERY_TRANSFORM
                    const int dim =
                        KV_FP8 ? ks * 16 + 4 * tq + 2 * (j / 2) : ks * 16 + 8 * (j / 2) + 2 * tq;
                    lo = variant_query_transform(&vp, lo, b, qo_pos, qo_head0 + row, dim);
                    hi = variant_query_transform(&vp, hi, b, qo_pos, qo_head0 + row, dim + 1);
#endif
#if KV_FP8
                    lo *= p.q_in_scale;
                    hi *= p.q_in_scale;
#endif
                    qa[ks][j] = cinfer_pack_half2(MMA_DT, lo, hi);
                }
            }
        }
#endif
#if Q_BYTES
        /* Warp 0's copy serves every warp; the previous item's readers passed its final barrier. */
        if (warp == 0) {
#pragma unroll
            for (int ks = 0; ks < KSTEPS; ks++)
                cinfer_st_shared_v4(q_smem + ks * 512,
                                    make_uint4(qa[ks][0], qa[ks][1], qa[ks][2], qa[ks][3]));
        }
        __syncthreads();
#endif

        float o[NTILES_O][4];
#pragma unroll
        for (int n = 0; n < NTILES_O; n++)
            o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
        float m[2] = {-CINFER_INF, -CINFER_INF}, l[2] = {0.0f, 0.0f};

        const int page_begin = item.page_begin; /* 0 for contiguous KV */
        const long long head_offset = (long long)kv_head * p.kv_stride_head;
        const int span = item.kv_end - item.kv_begin;
        const int num_tiles =
            span > warp * TOKENS ? CINFER_CEIL_DIV(span - warp * TOKENS, WARPS * TOKENS) : 0;

        /* Prologue: the first STAGES - 1 tiles in flight (one commit group each, empty or not). */
#pragma unroll
        for (int s = 0; s < STAGES - 1; s++) {
            if (s < num_tiles) {
                const int t0 = item.kv_begin + (s * WARPS + warp) * TOKENS;
                load_tile(p, lane_token(p, page_begin, t0, item.kv_end, lane), head_offset, t0,
                          item.kv_end, warp_smem + s * STAGE_BYTES, lane);
            }
            cinfer_cp_async_commit();
        }
        /* The place of the next tile to load. */
        lane_kv next_kv = {0, 0};
        if (STAGES - 1 < num_tiles)
            next_kv =
                lane_token(p, page_begin, item.kv_begin + ((STAGES - 1) * WARPS + warp) * TOKENS,
                           item.kv_end, lane);

        for (int i = 0; i < num_tiles; i++) {
            /* Tile i + STAGES - 1 goes into the stage tile i - 1 used, before waiting for tile i,
             * so STAGES tiles are in flight while the warp waits (every lane finished reading that
             * stage before the warp barrier that ends the previous iteration). */
            const int next = i + STAGES - 1;
            if (next < num_tiles)
                load_tile(p, next_kv, head_offset, item.kv_begin + (next * WARPS + warp) * TOKENS,
                          item.kv_end, warp_smem + (next % STAGES) * STAGE_BYTES, lane);
            cinfer_cp_async_commit();
            if (next + 1 < num_tiles)
                next_kv =
                    lane_token(p, page_begin, item.kv_begin + ((next + 1) * WARPS + warp) * TOKENS,
                               item.kv_end, lane);
            CINFER_CP_ASYNC_WAIT(STAGES - 1);
            /* Other lanes' copies of tile i are visible after the warp barrier. */
            __syncwarp();

            const unsigned k_tile = warp_smem + (i % STAGES) * STAGE_BYTES;
            const unsigned v_tile = k_tile + TILE_BYTES;
            const int t0 = item.kv_begin + (i * WARPS + warp) * TOKENS;

            /* S (16 rows x TOKENS tokens) = Q K^T as NTILES_S n8 tiles. */
            float s[NTILES_S][4];
#pragma unroll
            for (int n = 0; n < NTILES_S; n++)
                s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
            for (int ks = 0; ks < KSTEPS; ks++) {
#if KV_FP8
                /* ldmatrix.x4 matrices: tokens 8n .. 8n + 7 of chunk ks (16 dims), n = 0..3, so
                 * lane l addresses token l; register n -> the B fragment of n-tile n. */
                unsigned kr[4];
                cinfer_ldmatrix_x4(kr, k_tile + tile_offset(lane, ks));
                const uint4 qv = cinfer_ld_shared_v4(q_smem + ks * 512);
                const unsigned a[4] = {qv.x, qv.y, qv.z, qv.w};
#pragma unroll
                for (int n = 0; n < NTILES_S; n++) {
                    unsigned kb[2];
                    cinfer_fp8x4_to_f16x2x2(CINFER_DTYPE_KV, kr[n], &kb[0], &kb[1]);
                    cinfer_mma(MMA_DT, s[n], a, kb);
                }
#else
                /* ldmatrix.x4 matrices: (tokens 0-7, chunk 2ks), (tokens 0-7, chunk 2ks+1),
                 * (tokens 8-15, 2ks), (tokens 8-15, 2ks+1). */
                unsigned kb[4];
                const int row = (lane / 16) * 8 + lane % 8, chunk = 2 * ks + (lane / 8) % 2;
                cinfer_ldmatrix_x4(kb, k_tile + tile_offset(row, chunk));
                cinfer_mma(MMA_DT, s[0], qa[ks], &kb[0]);
                cinfer_mma(MMA_DT, s[1], qa[ks], &kb[2]);
#endif
            }

            /* Scale, soft cap and mask; element (n, r) of this lane is row g + 8 (r / 2), token
             * t0 + 8 n + 2 tq + r % 2. */
#pragma unroll
            for (int n = 0; n < NTILES_S; n++) {
#pragma unroll
                for (int r = 0; r < 4; r++) {
                    const int t = t0 + 8 * n + 2 * tq + (r % 2);
#if CINFER_VARIANT_LOGITS
                    /* Through the hooks in natural-log units (q_scale has no log2(e) here; rows
                     * past HPC are padding). */
                    const int row = g + 8 * (r / 2);
                    float x = CINFER_VARIANT_DROPPED;
                    if (t < item.kv_end && row < HPC) {
                        x = cinfer_variant_logit(&vp, s[n][r] * p.q_scale, b, qo_pos, t,
                                                 qo_head0 + row, kv_head);
                        if (VARIANT_USE_SOFTMAX)
                            x *= CINFER_LOG2E; /* -inf stays -inf */
                    }
                    s[n][r] = x;
#else
#if CINFER_SOFTCAP
                    const float x = cinfer_soft_cap_log2(
                        s[n][r] * (p.q_scale * CINFER_SOFT_CAP_Y_PER_X), p.soft_cap_log2);
#else
                    const float x = s[n][r] * p.q_scale;
#endif
                    s[n][r] = t < item.kv_end ? x : -CINFER_INF;
#endif
                }
            }

            /* Online softmax per row half (h = 0: row g, h = 1: row g + 8); without softmax the
             * weights are P as they are. */
#if VARIANT_USE_SOFTMAX
#pragma unroll
            for (int h = 0; h < 2; h++) {
                float mx = fmaxf(s[0][2 * h], s[0][2 * h + 1]);
#pragma unroll
                for (int n = 1; n < NTILES_S; n++)
                    mx = fmaxf(mx, fmaxf(s[n][2 * h], s[n][2 * h + 1]));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                const float m_new = fmaxf(m[h], mx);
                /* A row with nothing kept yet keeps an empty state; its p are all zero. */
                const float alpha = m_new == -CINFER_INF ? 1.0f : exp2f(m[h] - m_new);
                const float base = m_new == -CINFER_INF ? 0.0f : m_new;
                m[h] = m_new;
                l[h] *= alpha;
#pragma unroll
                for (int n = 0; n < NTILES_O; n++) {
                    o[n][2 * h] *= alpha;
                    o[n][2 * h + 1] *= alpha;
                }
#pragma unroll
                for (int n = 0; n < NTILES_S; n++) {
                    s[n][2 * h] = exp2f(s[n][2 * h] - base);
                    s[n][2 * h + 1] = exp2f(s[n][2 * h + 1] - base);
                    l[h] += s[n][2 * h] + s[n][2 * h + 1];
                }
            }
#endif

            /* P as the A fragments of P V, one per k step of 16 tokens. */
            unsigned pa[KSTEPS_PV][4];
#pragma unroll
            for (int kk = 0; kk < KSTEPS_PV; kk++) {
                pa[kk][0] = cinfer_pack_half2(MMA_DT, s[2 * kk][0], s[2 * kk][1]);
                pa[kk][1] = cinfer_pack_half2(MMA_DT, s[2 * kk][2], s[2 * kk][3]);
                pa[kk][2] = cinfer_pack_half2(MMA_DT, s[2 * kk + 1][0], s[2 * kk + 1][1]);
                pa[kk][3] = cinfer_pack_half2(MMA_DT, s[2 * kk + 1][2], s[2 * kk + 1][3]);
            }

#if KV_FP8
            /* O += P V. ldmatrix.x4.trans matrices: tokens 8m .. 8m + 7 of chunk c, m = 0..3 (lane
             * l addresses token l); register m holds the pairs of tokens 8m + 2tq, 8m + 2tq + 1.
             * n-tile 2c takes the chunk's even dims, 2c + 1 its odd dims. */
#pragma unroll
            for (int c = 0; c < D / 16; c++) {
                unsigned vr[4];
                cinfer_ldmatrix_x4_trans(vr, v_tile + tile_offset(lane, c));
#pragma unroll
                for (int kk = 0; kk < KSTEPS_PV; kk++) {
                    unsigned even[2], odd[2];
                    cinfer_fp8x4_to_f16x2x2_cross(CINFER_DTYPE_KV, vr[2 * kk], &even[0], &odd[0]);
                    cinfer_fp8x4_to_f16x2x2_cross(CINFER_DTYPE_KV, vr[2 * kk + 1], &even[1],
                                                  &odd[1]);
                    cinfer_mma(MMA_DT, o[2 * c], pa[kk], even);
                    cinfer_mma(MMA_DT, o[2 * c + 1], pa[kk], odd);
                }
            }
#else
            /* O += P V. ldmatrix.x4.trans matrices: (tokens 0-7, chunk n), (tokens 8-15, chunk n),
             * (tokens 0-7, chunk n+1), (tokens 8-15, chunk n+1) -> B of n-tiles n and n+1. */
#pragma unroll
            for (int n = 0; n < NTILES_O; n += 2) {
                unsigned vb[4];
                const int row = ((lane / 8) % 2) * 8 + lane % 8, chunk = n + lane / 16;
                cinfer_ldmatrix_x4_trans(vb, v_tile + tile_offset(row, chunk));
                cinfer_mma(MMA_DT, o[n], pa[0], &vb[0]);
                cinfer_mma(MMA_DT, o[n + 1], pa[0], &vb[2]);
            }
#endif
            /* Every lane has read tile i's stage before the next iteration's copies refill it. */
            __syncwarp();
        }
        CINFER_CP_ASYNC_WAIT(0);

        /* Row sums over the 4 lanes of a row. */
#pragma unroll
        for (int h = 0; h < 2; h++) {
            l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
            l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
        }

        /* Merge the warps' states through shared memory (the stage buffers are free now). */
        __syncthreads();
        float *sm_o = (float *)smem;          /* [WARPS][16][D] */
        float *sm_ml = sm_o + WARPS * 16 * D; /* [WARPS][16][2] */
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int row = g + 8 * h;
#if KV_FP8
            /* Back in dim order: n-tiles 2c and 2c + 1 hold dims 16c + 4tq + (0, 2) and (1, 3). */
#pragma unroll
            for (int c = 0; c < D / 16; c++)
                *(float4 *)&sm_o[(warp * 16 + row) * D + c * 16 + 4 * tq] =
                    make_float4(o[2 * c][2 * h], o[2 * c + 1][2 * h], o[2 * c][2 * h + 1],
                                o[2 * c + 1][2 * h + 1]);
#else
#pragma unroll
            for (int n = 0; n < NTILES_O; n++) {
                sm_o[(warp * 16 + row) * D + n * 8 + 2 * tq] = o[n][2 * h];
                sm_o[(warp * 16 + row) * D + n * 8 + 2 * tq + 1] = o[n][2 * h + 1];
            }
#endif
            if (tq == 0) {
                sm_ml[(warp * 16 + row) * 2] = m[h];
                sm_ml[(warp * 16 + row) * 2 + 1] = l[h];
            }
        }
        __syncthreads();
#if VARIANT_STATE_INIT
        /* The initial state joins once per query row: in its slice's first chunk. */
        const bool first_chunk =
            item.partial < 0 ||
            item.partial ==
                cinfer_decode_slice_request(p, b, item.slice, slices_per_head).partial_base;
#endif
        for (int pair = threadIdx.x; pair < HPC * CHUNKS; pair += THREADS) {
            const int row = pair / CHUNKS, x = pair % CHUNKS;
            const int head = qo_head0 + row;
            float l_all = 0.0f, out8[8];
#pragma unroll
            for (int i = 0; i < 8; i++)
                out8[i] = 0.0f;
#if !VARIANT_USE_SOFTMAX
            /* No softmax: the warps' weighted sums add up; no LSE and no split-KV (the host). */
            for (int wi = 0; wi < WARPS; wi++)
#pragma unroll
                for (int i = 0; i < 8; i++)
                    out8[i] += sm_o[(wi * 16 + row) * D + x * 8 + i];
#pragma unroll
            for (int i = 0; i < 8; i++)
                out8[i] *= p.v_scale;
            const float m_all = -CINFER_INF;
#else
            float m_all = -CINFER_INF;
            for (int wi = 0; wi < WARPS; wi++)
                m_all = fmaxf(m_all, sm_ml[(wi * 16 + row) * 2]);
#if VARIANT_STATE_INIT
            float m_init = -CINFER_INF, l_init = 0.0f;
            if (first_chunk)
                variant_state_init(&vp, b, qo_pos, head, &m_init, &l_init);
            m_all = fmaxf(m_all, m_init);
            if (m_init != -CINFER_INF)
                l_all = exp2f(m_init - m_all) * l_init;
#endif
            if (m_all != -CINFER_INF) {
                for (int wi = 0; wi < WARPS; wi++) {
                    const float mw = sm_ml[(wi * 16 + row) * 2];
                    if (mw == -CINFER_INF)
                        continue;
                    const float scale = exp2f(mw - m_all);
                    l_all += scale * sm_ml[(wi * 16 + row) * 2 + 1];
#pragma unroll
                    for (int i = 0; i < 8; i++)
                        out8[i] = fmaf(scale, sm_o[(wi * 16 + row) * D + x * 8 + i], out8[i]);
                }
                /* An initial state may leave the denominator 0 (nothing else can). */
#if VARIANT_STATE_INIT
                const float inv = l_all > 0.0f ? p.v_scale / l_all : 0.0f;
#else
                const float inv = p.v_scale / l_all;
#endif
#pragma unroll
                for (int i = 0; i < 8; i++)
                    out8[i] *= inv;
            }
#endif
#if VARIANT_STATE_INIT
            const float lse =
                m_all == -CINFER_INF || l_all <= 0.0f ? -CINFER_INF : m_all + log2f(l_all);
#else
            const float lse = m_all == -CINFER_INF ? -CINFER_INF : m_all + log2f(l_all);
#endif
            if (item.partial < 0) {
#if VARIANT_OUTPUT_TRANSFORM
#pragma unroll
                for (int i = 0; i < 8; i++)
                    out8[i] = variant_output_transform(&vp, out8[i], b, qo_pos, head, x * 8 + i);
#endif
                cinfer_half_bits *out = (cinfer_half_bits *)p.out + b * p.out_stride_n +
                                        (long long)head * p.out_stride_h + x * 8;
                *(uint4 *)out = cinfer_pack8(CINFER_DTYPE_O, out8);
                if (p.lse && x == 0)
                    p.lse[b * p.lse_stride_n + (long long)head * p.lse_stride_h] = lse;
            } else {
                const long long slot_head = (long long)item.partial * HPC + row;
                float *po = p.partial_o + slot_head * D + x * 8;
                *(float4 *)po = make_float4(out8[0], out8[1], out8[2], out8[3]);
                *(float4 *)(po + 4) = make_float4(out8[4], out8[5], out8[6], out8[7]);
                if (x == 0)
                    p.partial_lse[slot_head] = lse;
            }
        }
        /* The shared buffers are reused by the next work item. */
        __syncthreads();
    }
}
