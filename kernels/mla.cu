/*
 * MLA (multi-head latent attention) over a paged latent cache, on tensor cores (mma.sync, sm_80 and
 * later): kernels/mla_params.h says what is computed and how the work is laid out.
 *
 * CINFER_OP_MLA: one CTA of 4 warps per (work item, group of G query heads): 16 rows, row r being
 * query head head0 + r % G of the item's token q0 + r / G. Per KV tile of TILE_KV = 32 positions
 * (their 512 ckv and 64 kpe elements in one shared row of 576, the Q tile likewise):
 *   S = Q K^T   warp w computes the 16 x 8 logits of positions 8 w .. 8 w + 7 over all 576 dims;
 *   softmax     each row's tile maximum goes through shared memory, so all warps hold one running
 *               maximum per row; P (16 x 32, q's dtype) is written to shared memory;
 *   O += P V    warp w owns output columns 128 w .. 128 w + 127 of all 16 rows (64 floats per
 *               thread), V being the ckv part of the same K tile.
 * Each warp keeps its own part of the denominator (its 8 positions per tile, rescaled with the
 * shared maximum); the parts are summed at the end. K/V tiles are copied with cp.async, STAGES
 * deep. A split work item (partial >= 0) writes float32 partial states instead of out and lse.
 *
 * CINFER_OP_MLA_MERGE: one CTA of 128 threads (4 columns each) per (merge row, head) folds the
 * row's chunks into out and lse, as the decode merge does for D <= 256.
 *
 * Prelude: CINFER_DTYPE_Q (== KV == O, fp16 or bf16), CINFER_HEAD_DIM_QK (576),
 * CINFER_HEAD_DIM_VO (512), CINFER_MASK (0 none, 1 causal), CINFER_TILE_Q (16), CINFER_TILE_KV
 * (32), CINFER_WARPS (4), CINFER_STAGES, CINFER_GQA_PACK (G; 0 = 1), CINFER_OP_MLA; or
 * CINFER_DTYPE_O, CINFER_HEAD_DIM_VO, CINFER_OP_MLA_MERGE.
 */
#include "common.cuh"
#include "mla_params.h"
#include "mma.cuh"
/* The KV range of a tile: batch items, no window (kernels/prefill_tiles.cuh). */
#define CINFER_BATCH  1
#define CINFER_WINDOW 0
#include "prefill_tiles.cuh"

#define D_CKV 512
#define D_KPE 64

#if defined(CINFER_OP_MLA)

#if CINFER_HEAD_DIM_QK != D_CKV + D_KPE || CINFER_HEAD_DIM_VO != D_CKV
#error "mla: head dims 576 (512 ckv + 64 kpe) and 512"
#endif
#define DT         CINFER_DTYPE_Q
#define ROWS       CINFER_TILE_Q
#define TILE_KV    CINFER_TILE_KV
#define WARPS      CINFER_WARPS
#define THREADS    (WARPS * 32)
#define STAGES     CINFER_STAGES
#define G          (CINFER_GQA_PACK > 1 ? CINFER_GQA_PACK : 1) /* query heads per token */
#define TOKENS     (ROWS / G)                                  /* tokens per CTA */
#define CHUNKS     ((D_CKV + D_KPE) / 8)                       /* 16-byte chunks of a row */
#define CKV_CHUNKS (D_CKV / 8)
#define ROW_BYTES  ((CHUNKS + 1) * 16) /* padded by a chunk: ldmatrix rows hit other banks */
#define KV_BYTES   (TILE_KV * ROW_BYTES)
#define K_STEPS    ((D_CKV + D_KPE) / 16) /* k16 steps of Q K^T */
#define WARP_COLS  (D_CKV / WARPS)        /* output columns per warp */
#define O_TILES    (WARP_COLS / 8)
#define P_ROW_BYTES ((TILE_KV / 8 + 1) * 16)
#if ROWS != 16 || WARPS != 4 || TILE_KV != 8 * WARPS || ROWS % G != 0 || K_STEPS % 2 != 0
#error "mla: 16 rows, 4 warps, one n8 tile of logits per warp, G dividing the rows"
#endif

/* The cp.async copies of KV tile `tile` (positions tile * TILE_KV ..) into the stage at dst: row j
 * is position t = tile * TILE_KV + j, its ckv chunks then its kpe chunks; rows past kv_len are
 * zero-filled (their logits are masked, and 0 * V stays 0). */
__device__ __forceinline__ void load_kv(unsigned dst, const cinfer_mla_params &p, const int *table,
                                        int tile, int kv_len) {
#pragma unroll 2
    for (int c = (int)threadIdx.x; c < TILE_KV * CHUNKS; c += THREADS) {
        const int j = c / CHUNKS, ch = c % CHUNKS;
        const int t = tile * TILE_KV + j;
        const bool valid = t < kv_len;
        const cinfer_half_bits *src = (const cinfer_half_bits *)p.ckv;
        if (valid) {
            const int slot = p.page_shift >= 0 ? t >> p.page_shift : t / p.page_size;
            const int in_page = t - slot * p.page_size;
            const long long page = (long long)(unsigned)__ldg(table + slot);
            src = ch < CKV_CHUNKS ? (const cinfer_half_bits *)p.ckv + page * p.ckv_stride_page +
                                        (long long)in_page * p.ckv_stride_n + ch * 8
                                  : (const cinfer_half_bits *)p.kpe + page * p.kpe_stride_page +
                                        (long long)in_page * p.kpe_stride_n +
                                        (ch - CKV_CHUNKS) * 8;
        }
        cinfer_cp_async_16(dst + (unsigned)(j * ROW_BYTES + ch * 16), src, valid);
    }
}

extern "C" __global__ void __launch_bounds__(THREADS) CINFER_KERNEL_NAME(const cinfer_mla_params p) {
    extern __shared__ uint4 smem[];
    const unsigned s_q = cinfer_smem_addr(smem);
    const unsigned s_kv = s_q + ROWS * ROW_BYTES;
    const unsigned s_p = s_kv + STAGES * KV_BYTES;
    /* [WARPS][ROWS] floats: the warps' row maxima, then their denominators */
    float *red = (float *)((char *)smem + ROWS * ROW_BYTES + STAGES * KV_BYTES + ROWS * P_ROW_BYTES);

    const int cta_heads = p.num_heads / G;
    const unsigned item = blockIdx.x / (unsigned)cta_heads;
    if (item >= (unsigned)p.header->num_work)
        return; /* a spare CTA of a CUDA-graph grid */
    const cinfer_prefill_work w = p.work[item];
    const int head0 = (int)(blockIdx.x % (unsigned)cta_heads) * G;
    const int warp = (int)threadIdx.x / 32, lane = (int)threadIdx.x % 32;
    const int q0 = w.q_begin; /* the tile's first token within the request */
    const int q_span = CINFER_MIN(TOKENS, w.qo_len - q0);
    const int q_rows = q_span * G;
    const int delta = w.kv_len - w.qo_len; /* token i is at position i + delta */
    const int *table = p.kv_indices + w.kv_begin;
    int tile_begin;
    const int num_tiles = cinfer_prefill_kv_tiles(TILE_KV, q0, q_span, delta, w.kv_len, 0,
                                                  w.chunk_begin, w.chunk_end, &tile_begin);

    /* The Q tile: row r's q_nope then q_pe; rows past the tile's tokens are zero-filled. */
    for (int c = (int)threadIdx.x; c < ROWS * CHUNKS; c += THREADS) {
        const int r = c / CHUNKS, ch = c % CHUNKS;
        const bool valid = r < q_rows;
        const long long token = (long long)w.qo_begin + q0 + r / G;
        const int head = head0 + r % G;
        const cinfer_half_bits *src = (const cinfer_half_bits *)p.q_nope;
        if (valid)
            src = ch < CKV_CHUNKS ? (const cinfer_half_bits *)p.q_nope + token * p.q_nope_stride_n +
                                        (long long)head * p.q_nope_stride_h + ch * 8
                                  : (const cinfer_half_bits *)p.q_pe + token * p.q_pe_stride_n +
                                        (long long)head * p.q_pe_stride_h + (ch - CKV_CHUNKS) * 8;
        cinfer_cp_async_16(s_q + (unsigned)(r * ROW_BYTES + ch * 16), src, valid);
    }
    cinfer_cp_async_commit();
#pragma unroll
    for (int s = 0; s < STAGES - 1; s++) {
        if (s < num_tiles)
            load_kv(s_kv + s * KV_BYTES, p, table, tile_begin + s, w.kv_len);
        cinfer_cp_async_commit();
    }

    /* This lane's rows of every fragment: row_a = lane / 4 and row_b = row_a + 8; its logits
     * columns 2 (lane % 4) and + 1 of the warp's 8, its output columns 2 (lane % 4) and + 1 of
     * each of the warp's n8 tiles. */
    const int row_a = lane / 4, row_b = row_a + 8;
    const int pos_a = q0 + row_a / G + delta, pos_b = q0 + row_b / G + delta;
    float o[O_TILES][4];
#pragma unroll
    for (int n = 0; n < O_TILES; n++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            o[n][e] = 0.0f;
    float m[2] = {-CINFER_INF, -CINFER_INF}, d[2] = {0.0f, 0.0f};
    const unsigned q_lane = s_q + (unsigned)((lane % 16) * ROW_BYTES + (lane / 16) * 16);
    const unsigned p_lane = s_p + (unsigned)((lane % 16) * P_ROW_BYTES + (lane / 16) * 16);

    for (int it = 0; it < num_tiles; it++) {
        /* Tile it has landed, and every warp is done with tile it - 1 (its stage, P, red). */
        CINFER_CP_ASYNC_WAIT(STAGES - 2);
        __syncthreads();
        if (it + STAGES - 1 < num_tiles)
            load_kv(s_kv + ((it + STAGES - 1) % STAGES) * KV_BYTES, p, table,
                    tile_begin + it + STAGES - 1, w.kv_len);
        cinfer_cp_async_commit();
        const unsigned stage = s_kv + (it % STAGES) * KV_BYTES;
        const int kv0 = (tile_begin + it) * TILE_KV;

        /* S: 16 rows x this warp's 8 positions. K matrices: rows lane % 8 of the warp's 8,
         * chunks 2 kk + lane / 8 (b[0..1] for step kk, b[2..3] for kk + 1). */
        float s[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        const unsigned k_lane = stage + (unsigned)((warp * 8 + lane % 8) * ROW_BYTES + (lane / 8) * 16);
#pragma unroll 6
        for (int kk = 0; kk < K_STEPS; kk += 2) {
            unsigned a0[4], a1[4], b[4];
            cinfer_ldmatrix_x4(a0, q_lane + kk * 32);
            cinfer_ldmatrix_x4(a1, q_lane + kk * 32 + 32);
            cinfer_ldmatrix_x4(b, k_lane + kk * 32);
            cinfer_mma(DT, s, a0, b);
            cinfer_mma(DT, s, a1, b + 2);
        }
        /* Scale to base 2 and mask (past kv_len; causal: past the row's position). */
        const int j0 = kv0 + warp * 8 + 2 * (lane % 4);
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int j = j0 + (e & 1);
            const int pos = e < 2 ? pos_a : pos_b;
            const bool keep = j < w.kv_len && (CINFER_MASK != 1 || j <= pos);
            s[e] = keep ? s[e] * p.q_scale : -CINFER_INF;
        }
        float mx[2] = {fmaxf(s[0], s[1]), fmaxf(s[2], s[3])};
#pragma unroll
        for (int h = 0; h < 2; h++) {
            mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
            mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
        }
        if (lane % 4 == 0) {
            red[warp * ROWS + row_a] = mx[0];
            red[warp * ROWS + row_b] = mx[1];
        }
        __syncthreads();
        float pv[4];
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int row = h ? row_b : row_a;
            float m_new = m[h];
#pragma unroll
            for (int x = 0; x < WARPS; x++)
                m_new = fmaxf(m_new, red[x * ROWS + row]);
            /* Nothing kept yet: subtract 0, so every exponential is of -inf and gives 0. */
            const float m_use = m_new == -CINFER_INF ? 0.0f : m_new;
            const float alpha = cinfer_fast_exp2(m[h] - m_use);
            pv[2 * h] = cinfer_fast_exp2(s[2 * h] - m_use);
            pv[2 * h + 1] = cinfer_fast_exp2(s[2 * h + 1] - m_use);
            d[h] = d[h] * alpha + pv[2 * h] + pv[2 * h + 1];
#pragma unroll
            for (int n = 0; n < O_TILES; n++) {
                o[n][2 * h] *= alpha;
                o[n][2 * h + 1] *= alpha;
            }
            m[h] = m_new;
        }
        const unsigned p_col = (unsigned)((warp * 8 + 2 * (lane % 4)) * 2);
        cinfer_st_shared_u32(s_p + row_a * P_ROW_BYTES + p_col, cinfer_pack_half2(DT, pv[0], pv[1]));
        cinfer_st_shared_u32(s_p + row_b * P_ROW_BYTES + p_col, cinfer_pack_half2(DT, pv[2], pv[3]));
        __syncthreads();

        /* O += P V over this warp's columns. V matrices (transposed): positions kk * 16 + lane %
         * 16, chunk of column tile 2 dp + lane / 16 of the warp's. */
        const unsigned v_lane = stage + (unsigned)((lane % 16) * ROW_BYTES +
                                                   (warp * (WARP_COLS / 8) + lane / 16) * 16);
#pragma unroll
        for (int kk = 0; kk < TILE_KV / 16; kk++) {
            unsigned pa[4];
            cinfer_ldmatrix_x4(pa, p_lane + kk * 32);
#pragma unroll
            for (int dp = 0; dp < O_TILES / 2; dp++) {
                unsigned b[4];
                cinfer_ldmatrix_x4_trans(b, v_lane + kk * 16 * ROW_BYTES + dp * 32);
                cinfer_mma(DT, o[2 * dp], pa, b);
                cinfer_mma(DT, o[2 * dp + 1], pa, b + 2);
            }
        }
    }
    CINFER_CP_ASYNC_WAIT(0);

    /* The denominators: each warp's part (its lanes' quads summed), added through red. */
#pragma unroll
    for (int h = 0; h < 2; h++) {
        d[h] += __shfl_xor_sync(0xffffffffu, d[h], 1);
        d[h] += __shfl_xor_sync(0xffffffffu, d[h], 2);
    }
    __syncthreads();
    if (lane % 4 == 0) {
        red[warp * ROWS + row_a] = d[0];
        red[warp * ROWS + row_b] = d[1];
    }
    __syncthreads();
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int row = h ? row_b : row_a;
        if (row >= q_rows)
            continue;
        float sum = 0.0f;
#pragma unroll
        for (int x = 0; x < WARPS; x++)
            sum += red[x * ROWS + row];
        const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
        const float lse = sum > 0.0f ? m[h] + log2f(sum) : -CINFER_INF;
        const int token = q0 + row / G, head = head0 + row % G;
        const int col = warp * WARP_COLS + 2 * (lane % 4);
        if (w.partial >= 0) {
            const long long slot = (long long)w.partial +
                                   ((long long)(row / G) * p.num_heads + head) * w.num_chunks;
            float *po = p.partial_o + slot * D_CKV + col;
#pragma unroll
            for (int n = 0; n < O_TILES; n++)
                *(float2 *)(po + n * 8) = make_float2(o[n][2 * h] * inv, o[n][2 * h + 1] * inv);
            if (warp == 0 && lane % 4 == 0)
                p.partial_lse[slot] = lse;
            continue;
        }
        const long long r = (long long)w.qo_begin + token;
        cinfer_half_bits *out = (cinfer_half_bits *)p.out + r * p.out_stride_n +
                                (long long)head * p.out_stride_h + col;
#pragma unroll
        for (int n = 0; n < O_TILES; n++)
            *(unsigned *)(out + n * 8) =
                cinfer_pack_half2(DT, o[n][2 * h] * inv, o[n][2 * h + 1] * inv);
        if (p.lse && warp == 0 && lane % 4 == 0)
            p.lse[r * p.lse_stride_n + (long long)head * p.lse_stride_h] = lse;
    }
}

#elif defined(CINFER_OP_MLA_MERGE)

#if CINFER_HEAD_DIM_VO != D_CKV
#error "mla merge: head dim 512"
#endif
#define MERGE_THREADS (D_CKV / 4)

extern "C" __global__ void __launch_bounds__(MERGE_THREADS)
    CINFER_KERNEL_NAME(const cinfer_mla_params p) {
    const long long pair = blockIdx.x;
    const int b = (int)(pair / p.num_heads), head = (int)(pair % p.num_heads);
    if (b >= p.merge_header->batch_size)
        return; /* a spare CTA of a CUDA-graph grid, or a plan that did not split */
    const cinfer_decode_request row = p.merge_rows[b];
    if (row.num_chunks <= 1)
        return; /* written by the attention kernel */
    const long long slot0 = (long long)row.partial_base + (long long)head * row.num_chunks;
    const int col = (int)threadIdx.x * 4;
    float m = -CINFER_INF, wsum = 0.0f, o[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int c = 0; c < row.num_chunks; c++) {
        const float lse = p.partial_lse[slot0 + c];
        const float4 v = *(const float4 *)(p.partial_o + (slot0 + c) * D_CKV + col);
        const float m_new = fmaxf(m, lse);
        const float m_use = m_new == -CINFER_INF ? 0.0f : m_new;
        const float scale = exp2f(m - m_use), wu = exp2f(lse - m_use);
        wsum = wsum * scale + wu;
        o[0] = o[0] * scale + wu * v.x;
        o[1] = o[1] * scale + wu * v.y;
        o[2] = o[2] * scale + wu * v.z;
        o[3] = o[3] * scale + wu * v.w;
        m = m_new;
    }
    const float inv = m == -CINFER_INF ? 0.0f : 1.0f / wsum;
    cinfer_half_bits *out = (cinfer_half_bits *)p.out + (long long)b * p.out_stride_n +
                            (long long)head * p.out_stride_h + col;
    *(uint2 *)out = make_uint2(cinfer_pack_half2(CINFER_DTYPE_O, o[0] * inv, o[1] * inv),
                               cinfer_pack_half2(CINFER_DTYPE_O, o[2] * inv, o[3] * inv));
    if (p.lse && threadIdx.x == 0)
        p.lse[(long long)b * p.lse_stride_n + (long long)head * p.lse_stride_h] =
            m == -CINFER_INF ? -CINFER_INF : m + log2f(wsum);
}

#endif
