/*
 * MLA (multi-head latent attention) over a paged latent cache, on tensor cores (mma.sync, sm_80 and
 * later): kernels/mla_params.h says what is computed and how the work is laid out.
 *
 * CINFER_OP_MLA: one CTA of 4 warps per (work item, group of G query heads): 16 rows, row r being
 * query head head0 + r % G of the item's token q0 + r / G. Per KV tile of TILE_KV = 16 or 32
 * positions (their 512 ckv and 64 kpe elements in one shared row of 576, the Q tile likewise):
 *   S = Q K^T   warp w computes the partial logits of all 16 x TILE_KV over its 144 of 576 dims,
 *               its Q slice held in registers as mma fragments for the whole KV range, four
 *               independent accumulators; the partials meet in shared memory and every warp
 *               sums all four (in one order, so all warps hold the same logits);
 *   softmax     per warp, on whole rows: the same running maximum and denominator in every warp;
 *               P stays in registers as the A fragments of the next product;
 *   O += P V    warp w owns output columns 128 w .. 128 w + 127 of all 16 rows (64 floats per
 *               thread), V being the ckv part of the same K tile.
 * Two barriers per tile (the stage landed; the partial logits written). K/V tiles are copied with
 * cp.async, STAGES deep, each thread one row's page-table read and its chunks. A split work item
 * (partial >= 0) writes float32 partial states instead of out and lse.
 *
 * With 64 rows (CINFER_TILE_Q 64, sm_90a), CINFER_OP_MLA is the warpgroup kernel of
 * kernels/mla_sm90.cuh instead: 64 heads of a token per CTA, for H a multiple of 64.
 *
 * CINFER_OP_MLA_MERGE: one CTA of 128 threads per (merge row, head, slice of 512 / C columns)
 * folds the row's chunks into out (and slice 0 into lse), C groups of threads taking every C-th
 * chunk (C = merge_groups, chosen by the host).
 *
 * Prelude: CINFER_DTYPE_Q (== KV == O, fp16 or bf16), CINFER_HEAD_DIM_QK (576),
 * CINFER_HEAD_DIM_VO (512), CINFER_MASK (0 none, 1 causal), CINFER_TILE_Q (16), CINFER_TILE_KV
 * (16 or 32), CINFER_WARPS (4), CINFER_STAGES, CINFER_GQA_PACK (G; 0 = 1), CINFER_OP_MLA; or
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
/* The ckv and kpe rows of position t through the page table when valid (t < kv_len); the caches'
 * starts otherwise (a zero-filling copy reads nothing from them). */
__device__ __forceinline__ void mla_kv_row(const cinfer_mla_params &p, const int *table, int t,
                                           bool valid, const cinfer_half_bits **ckv,
                                           const cinfer_half_bits **kpe) {
    *ckv = (const cinfer_half_bits *)p.ckv;
    *kpe = (const cinfer_half_bits *)p.kpe;
    if (valid) {
        const int slot = p.page_shift >= 0 ? t >> p.page_shift : t / p.page_size;
        const int in_page = t - slot * p.page_size;
        const long long page = (long long)(unsigned)__ldg(table + slot);
        *ckv += page * p.ckv_stride_page + (long long)in_page * p.ckv_stride_n;
        *kpe += page * p.kpe_stride_page + (long long)in_page * p.kpe_stride_n;
    }
}

/* The CTA's work item and first query head (H / g CTAs per item, g heads each); false for a
 * spare CTA of a CUDA-graph grid. Then lets the split-KV merge (a programmatic dependent launch)
 * start its blocks: they wait for this grid to finish before they read a partial state. */
__device__ __forceinline__ bool mla_cta_work(const cinfer_mla_params &p, int g,
                                             cinfer_prefill_work *w, int *head0) {
    const int cta_heads = p.num_heads / g;
    const unsigned item = blockIdx.x / (unsigned)cta_heads;
    if (item >= (unsigned)p.header->num_work)
        return false;
    *w = p.work[item];
    *head0 = (int)(blockIdx.x % (unsigned)cta_heads) * g;
    cinfer_pdl_launch_dependents();
    return true;
}

/* A lane's two rows (h = 0, 1) at the end: their denominators d (a quarter of each per lane of
 * the quad) summed over the quad, then 1 / d (0 for a row that kept nothing) and the base-2 LSE
 * m + log2(d) (-inf then). */
__device__ __forceinline__ void mla_row_ends(float *d, const float *m, float *inv, float *lse) {
#pragma unroll
    for (int h = 0; h < 2; h++) {
        d[h] += __shfl_xor_sync(0xffffffffu, d[h], 1);
        d[h] += __shfl_xor_sync(0xffffffffu, d[h], 2);
        inv[h] = d[h] > 0.0f ? 1.0f / d[h] : 0.0f;
        lse[h] = d[h] > 0.0f ? m[h] + log2f(d[h]) : -CINFER_INF;
    }
}

/* The epilogue of one lane's row h (0 or 1) of either MLA kernel: n tiles of 8 output columns
 * from col, the lane's pair of each at o[4 j + 2 h] (the mma C layout of both kernels), scaled by
 * inv, for query head `head` of the request's token `token`. A split item (w.partial >= 0)
 * writes float32 partial state, at slot w.partial + ((token - w.q_begin) * H + head) *
 * num_chunks; else out, in q's dtype. lse_writer: the one lane of the row that writes its LSE
 * (p.lse's when given, or the partial LSE). */
__device__ __forceinline__ void mla_store_row(const cinfer_mla_params &p,
                                              const cinfer_prefill_work &w, const float *o,
                                              const int n, int h, int token, int head, int col,
                                              float inv, float lse, bool lse_writer) {
    if (w.partial >= 0) {
        const long long slot = (long long)w.partial +
                               ((long long)(token - w.q_begin) * p.num_heads + head) * w.num_chunks;
        float *po = p.partial_o + slot * D_CKV + col;
#pragma unroll
        for (int j = 0; j < n; j++)
            *(float2 *)(po + 8 * j) =
                make_float2(o[4 * j + 2 * h] * inv, o[4 * j + 2 * h + 1] * inv);
        if (lse_writer)
            p.partial_lse[slot] = lse;
        return;
    }
    const long long r = (long long)w.qo_begin + token;
    cinfer_half_bits *out =
        (cinfer_half_bits *)p.out + r * p.out_stride_n + (long long)head * p.out_stride_h + col;
#pragma unroll
    for (int j = 0; j < n; j++)
        *(unsigned *)(out + 8 * j) =
            cinfer_pack_half2(CINFER_DTYPE_Q, o[4 * j + 2 * h] * inv, o[4 * j + 2 * h + 1] * inv);
    if (p.lse && lse_writer)
        p.lse[r * p.lse_stride_n + (long long)head * p.lse_stride_h] = lse;
}

/* The q_nope and q_pe rows of (token, head) when valid; the tensors' starts otherwise. */
__device__ __forceinline__ void mla_q_row(const cinfer_mla_params &p, long long token, int head,
                                          bool valid, const cinfer_half_bits **qn,
                                          const cinfer_half_bits **qp) {
    *qn = (const cinfer_half_bits *)p.q_nope;
    *qp = (const cinfer_half_bits *)p.q_pe;
    if (valid) {
        *qn += token * p.q_nope_stride_n + (long long)head * p.q_nope_stride_h;
        *qp += token * p.q_pe_stride_n + (long long)head * p.q_pe_stride_h;
    }
}
#endif

#if defined(CINFER_OP_MLA) && CINFER_TILE_Q == 64
#include "mla_sm90.cuh"
#elif defined(CINFER_OP_MLA)

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
#define WARP_STEPS ((D_CKV + D_KPE) / 16 / WARPS) /* k16 steps of Q K^T per warp */
#define WARP_COLS  (D_CKV / WARPS)                /* output columns per warp */
#define O_TILES    (WARP_COLS / 8)
#define S_TILES    (TILE_KV / 8)    /* n8 tiles of logits */
#define S_STRIDE   (TILE_KV + 8)    /* floats per row of a partial-logits buffer (no conflicts) */
#define Q_THREADS  (THREADS / ROWS) /* threads per Q row in the copies */
#define KV_THREADS (THREADS / TILE_KV) /* threads per K/V row */
#if ROWS != 16 || WARPS != 4 || (TILE_KV != 16 && TILE_KV != 32) || ROWS % G != 0 ||               \
    CHUNKS % Q_THREADS != 0 || CHUNKS % KV_THREADS != 0 || (D_CKV + D_KPE) % (16 * WARPS) != 0
#error "mla: 16 rows, 4 warps, KV tiles of 16 or 32 positions, G dividing the rows"
#endif

/* The cp.async copies of KV tile `tile` (positions tile * TILE_KV ..) into the stage at dst: this
 * thread copies row j = threadIdx.x / KV_THREADS (position t = tile * TILE_KV + j: one page-table
 * read), chunks threadIdx.x % KV_THREADS + KV_THREADS i, the ckv chunks then the kpe ones; a row
 * past kv_len is zero-filled (its logits are masked, and 0 * V stays 0). */
__device__ __forceinline__ void load_kv(unsigned dst, const cinfer_mla_params &p, const int *table,
                                        int tile, int kv_len) {
    const int j = (int)threadIdx.x / KV_THREADS, c0 = (int)threadIdx.x % KV_THREADS;
    const int t = tile * TILE_KV + j;
    const bool valid = t < kv_len;
    const cinfer_half_bits *ckv, *kpe;
    mla_kv_row(p, table, t, valid, &ckv, &kpe);
    const unsigned to = dst + (unsigned)(j * ROW_BYTES + c0 * 16);
#pragma unroll
    for (int i = 0; i < CHUNKS / KV_THREADS; i++) {
        const int ch = c0 + i * KV_THREADS;
        const cinfer_half_bits *src = !valid            ? ckv
                                      : ch < CKV_CHUNKS ? ckv + ch * 8
                                                        : kpe + (ch - CKV_CHUNKS) * 8;
        cinfer_cp_async_16(to + i * KV_THREADS * 16, src, valid);
    }
}

extern "C" __global__ void __launch_bounds__(THREADS)
    CINFER_KERNEL_NAME(const cinfer_mla_params p) {
    extern __shared__ uint4 smem[];
    const unsigned s_q = cinfer_smem_addr(smem);
    const unsigned s_kv = s_q + ROWS * ROW_BYTES;
    /* [WARPS][ROWS][S_STRIDE] floats: each warp's partial logits of a tile (its dims) */
    float *s_part = (float *)((char *)smem + ROWS * ROW_BYTES + STAGES * KV_BYTES);

    cinfer_prefill_work w;
    int head0;
    if (!mla_cta_work(p, G, &w, &head0))
        return; /* a spare CTA of a CUDA-graph grid */
    const int warp = (int)threadIdx.x / 32, lane = (int)threadIdx.x % 32;
    const int q0 = w.q_begin; /* the tile's first token within the request */
    const int q_span = CINFER_MIN(TOKENS, w.qo_len - q0);
    const int q_rows = q_span * G;
    const int delta = w.kv_len - w.qo_len; /* token i is at position i + delta */
    const int *table = p.kv_indices + w.kv_begin;
    int tile_begin;
    const int num_tiles = cinfer_prefill_kv_tiles(TILE_KV, q0, q_span, delta, w.kv_len, 0,
                                                  w.chunk_begin, w.chunk_end, &tile_begin);

    /* The Q tile: row r (thread's: threadIdx.x / Q_THREADS) is q_nope then q_pe of head
     * head0 + r % G of token q0 + r / G; rows past the tile's tokens are zero-filled. */
    {
        const int r = (int)threadIdx.x / Q_THREADS, c0 = (int)threadIdx.x % Q_THREADS;
        const bool valid = r < q_rows;
        const long long token = (long long)w.qo_begin + q0 + r / G;
        const cinfer_half_bits *qn, *qp;
        mla_q_row(p, token, head0 + r % G, valid, &qn, &qp);
#pragma unroll
        for (int i = 0; i < CHUNKS / Q_THREADS; i++) {
            const int ch = c0 + i * Q_THREADS;
            const cinfer_half_bits *src = !valid            ? qn
                                          : ch < CKV_CHUNKS ? qn + ch * 8
                                                            : qp + (ch - CKV_CHUNKS) * 8;
            cinfer_cp_async_16(s_q + (unsigned)(r * ROW_BYTES + ch * 16), src, valid);
        }
    }
    cinfer_cp_async_commit();
#pragma unroll
    for (int s = 0; s < STAGES - 1; s++) {
        if (s < num_tiles)
            load_kv(s_kv + s * KV_BYTES, p, table, tile_begin + s, w.kv_len);
        cinfer_cp_async_commit();
    }

    /* This warp's slice of Q (dims WARP_STEPS * 16 warp ..) as mma A fragments, kept in
     * registers for every tile: matrices rows lane % 16, chunk lane / 16 of each k16 step. */
    CINFER_CP_ASYNC_WAIT(STAGES - 1);
    __syncthreads();
    unsigned qf[WARP_STEPS][4];
#pragma unroll
    for (int kk = 0; kk < WARP_STEPS; kk++)
        cinfer_ldmatrix_x4(qf[kk],
                           s_q + (unsigned)((lane % 16) * ROW_BYTES +
                                            (warp * WARP_STEPS * 2 + 2 * kk + lane / 16) * 16));

    /* This lane's rows of every fragment: row_a = lane / 4 and row_b = row_a + 8; its logits
     * columns 8 n + 2 (lane % 4) and + 1, its output columns 2 (lane % 4) and + 1 of each of the
     * warp's n8 tiles. Every warp holds the whole rows' logits (the partials summed in one
     * order), so all keep the same running maximum and denominator. */
    const int row_a = lane / 4, row_b = row_a + 8;
    const int pos_a = q0 + row_a / G + delta, pos_b = q0 + row_b / G + delta;
    float o[O_TILES][4];
#pragma unroll
    for (int n = 0; n < O_TILES; n++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            o[n][e] = 0.0f;
    float m[2] = {-CINFER_INF, -CINFER_INF}, d[2] = {0.0f, 0.0f};
    /* K matrices: rows np * 16 + (lane / 16) * 8 + lane % 8, chunk (lane / 8) % 2 of the warp's
     * k16 steps (b[0..1] for n tile 2 np, b[2..3] for 2 np + 1). V matrices (transposed):
     * positions kk * 16 + lane % 16, chunk lane / 16 of the warp's column tiles. */
    const unsigned k_lane = (unsigned)((((lane / 16) * 8 + lane % 8)) * ROW_BYTES +
                                       (warp * WARP_STEPS * 2 + (lane / 8) % 2) * 16);
    const unsigned v_lane =
        (unsigned)((lane % 16) * ROW_BYTES + (warp * (WARP_COLS / 8) + lane / 16) * 16);
    float *my_part = s_part + warp * ROWS * S_STRIDE;

    for (int it = 0; it < num_tiles; it++) {
        /* Tile it has landed, and every warp is done with tile it - 1 (its stage, the partial
         * logits). */
        CINFER_CP_ASYNC_WAIT(STAGES - 2);
        __syncthreads();
        if (it + STAGES - 1 < num_tiles)
            load_kv(s_kv + ((it + STAGES - 1) % STAGES) * KV_BYTES, p, table,
                    tile_begin + it + STAGES - 1, w.kv_len);
        cinfer_cp_async_commit();
        const unsigned stage = s_kv + (it % STAGES) * KV_BYTES;
        const int kv0 = (tile_begin + it) * TILE_KV;

        /* Partial logits over this warp's dims: 16 rows x TILE_KV positions, S_TILES
         * independent accumulators. */
        float acc[S_TILES][4];
#pragma unroll
        for (int n = 0; n < S_TILES; n++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                acc[n][e] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < WARP_STEPS; kk++) {
#pragma unroll
            for (int np = 0; np < S_TILES / 2; np++) {
                unsigned b[4];
                cinfer_ldmatrix_x4(b, stage + k_lane + (unsigned)(np * 16 * ROW_BYTES + kk * 32));
                cinfer_mma(DT, acc[2 * np], qf[kk], b);
                cinfer_mma(DT, acc[2 * np + 1], qf[kk], b + 2);
            }
        }
#pragma unroll
        for (int n = 0; n < S_TILES; n++) {
            const int col = n * 8 + 2 * (lane % 4);
            *(float2 *)(my_part + row_a * S_STRIDE + col) = make_float2(acc[n][0], acc[n][1]);
            *(float2 *)(my_part + row_b * S_STRIDE + col) = make_float2(acc[n][2], acc[n][3]);
        }
        __syncthreads();

        /* The logits: the warps' partials summed (in warp order), scaled to base 2, masked
         * (past kv_len; causal: past the row's position). */
        float s[S_TILES][4];
#pragma unroll
        for (int n = 0; n < S_TILES; n++) {
            const int col = n * 8 + 2 * (lane % 4);
            float2 a = *(const float2 *)(s_part + row_a * S_STRIDE + col);
            float2 b = *(const float2 *)(s_part + row_b * S_STRIDE + col);
#pragma unroll
            for (int x = 1; x < WARPS; x++) {
                const float2 ax = *(const float2 *)(s_part + (x * ROWS + row_a) * S_STRIDE + col);
                const float2 bx = *(const float2 *)(s_part + (x * ROWS + row_b) * S_STRIDE + col);
                a.x += ax.x;
                a.y += ax.y;
                b.x += bx.x;
                b.y += bx.y;
            }
            const float v[4] = {a.x, a.y, b.x, b.y};
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int j = kv0 + col + (e & 1);
                const bool keep =
                    j < w.kv_len && (CINFER_MASK != 1 || j <= (e < 2 ? pos_a : pos_b));
                s[n][e] = keep ? v[e] * p.q_scale : -CINFER_INF;
            }
        }
        /* Online softmax; P (q's dtype) becomes the A fragments of P V in registers. */
        unsigned pf[S_TILES][2];
#pragma unroll
        for (int h = 0; h < 2; h++) {
            float mx = m[h];
#pragma unroll
            for (int n = 0; n < S_TILES; n++)
                mx = fmaxf(mx, fmaxf(s[n][2 * h], s[n][2 * h + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            /* Nothing kept yet: subtract 0, so every exponential is of -inf and gives 0. */
            const float m_use = mx == -CINFER_INF ? 0.0f : mx;
            const float alpha = cinfer_fast_exp2(m[h] - m_use);
            float sum = 0.0f;
#pragma unroll
            for (int n = 0; n < S_TILES; n++) {
                const float p0 = cinfer_fast_exp2(s[n][2 * h] - m_use);
                const float p1 = cinfer_fast_exp2(s[n][2 * h + 1] - m_use);
                sum += p0 + p1;
                pf[n][h] = cinfer_pack_half2(DT, p0, p1);
            }
            d[h] = d[h] * alpha + sum;
#pragma unroll
            for (int n = 0; n < O_TILES; n++) {
                o[n][2 * h] *= alpha;
                o[n][2 * h + 1] *= alpha;
            }
            m[h] = mx;
        }

        /* O += P V over this warp's columns. */
#pragma unroll
        for (int kk = 0; kk < TILE_KV / 16; kk++) {
            const unsigned pa[4] = {pf[2 * kk][0], pf[2 * kk][1], pf[2 * kk + 1][0],
                                    pf[2 * kk + 1][1]};
#pragma unroll
            for (int dp = 0; dp < O_TILES / 2; dp++) {
                unsigned b[4];
                cinfer_ldmatrix_x4_trans(b, stage + v_lane +
                                                (unsigned)(kk * 16 * ROW_BYTES + dp * 32));
                cinfer_mma(DT, o[2 * dp], pa, b);
                cinfer_mma(DT, o[2 * dp + 1], pa, b + 2);
            }
        }
    }
    CINFER_CP_ASYNC_WAIT(0);

    float inv2[2], lse2[2];
    mla_row_ends(d, m, inv2, lse2);
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int row = h ? row_b : row_a;
        if (row >= q_rows)
            continue;
        const float inv = inv2[h], lse = lse2[h];
        mla_store_row(p, w, &o[0][0], O_TILES, h, q0 + row / G, head0 + row % G,
                      warp * WARP_COLS + 2 * (lane % 4), inv, lse, warp == 0 && lane % 4 == 0);
    }
}

#elif defined(CINFER_OP_MLA_MERGE)

#if CINFER_HEAD_DIM_VO != D_CKV
#error "mla merge: head dim 512"
#endif
#define MERGE_THREADS 128
#define MERGE_WARPS   (MERGE_THREADS / 32)
#define MERGE_UNROLL  8

/* The block's maximum (max) or sum of v, every thread getting it. */
__device__ __forceinline__ float block_reduce(float v, bool max, float *scratch) {
#pragma unroll
    for (int off = 16; off > 0; off /= 2) {
        const float o = __shfl_xor_sync(0xffffffffu, v, off);
        v = max ? fmaxf(v, o) : v + o;
    }
    __syncthreads(); /* scratch's previous use is over */
    if (threadIdx.x % 32 == 0)
        scratch[threadIdx.x / 32] = v;
    __syncthreads();
    v = scratch[0];
#pragma unroll
    for (int x = 1; x < MERGE_WARPS; x++)
        v = max ? fmaxf(v, scratch[x]) : v + scratch[x];
    return v;
}

/* The sum over chunks c = first, first + step, ... < n of 2^(lse[c] - m) times the 4 floats of
 * chunk c at po, MERGE_UNROLL chunks' loads in flight. */
__device__ __forceinline__ float4 merge_fold(const float *po, const float *lse, float m, int n,
                                             int first, int step) {
    float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int c0 = first; c0 < n; c0 += MERGE_UNROLL * step) {
        float wu[MERGE_UNROLL];
        float4 v[MERGE_UNROLL];
#pragma unroll
        for (int u = 0; u < MERGE_UNROLL; u++) {
            const int c = c0 + u * step;
            const bool in = c < n;
            wu[u] = in ? exp2f(lse[c] - m) : 0.0f;
            v[u] = in ? *(const float4 *)(po + (long long)c * D_CKV)
                      : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
#pragma unroll
        for (int u = 0; u < MERGE_UNROLL; u++) {
            o.x = fmaf(wu[u], v[u].x, o.x);
            o.y = fmaf(wu[u], v[u].y, o.y);
            o.z = fmaf(wu[u], v[u].z, o.z);
            o.w = fmaf(wu[u], v[u].w, o.w);
        }
    }
    return o;
}

/* One CTA per (row, head, slice): C = p.merge_groups (1, 2, 4, 8 or 16) slices of 512 / C
 * columns. The threads reduce the row's chunk LSEs to their maximum M and the weight sum W =
 * sum 2^(lse - M); then the CTA's threads form C groups of 128 / C, group g folding chunks g,
 * g + C, ... of the slice (each thread 4 columns, MERGE_UNROLL chunks' loads in flight), the
 * groups' sums meet in shared memory, and group 0 writes sum 2^(lse - M) o / W (slice 0 the
 * LSE too). The host picks C so that rows x heads x C CTAs fill the GPU: a long request's many
 * chunks are then read by many CTAs. */
extern "C" __global__ void __launch_bounds__(MERGE_THREADS)
    CINFER_KERNEL_NAME(const cinfer_mla_params p) {
    __shared__ float scratch[MERGE_WARPS];
    __shared__ float4 sums[MERGE_THREADS];
    const int groups = p.merge_groups;
    const long long pair = blockIdx.x / groups;
    const int slice = (int)(blockIdx.x % groups);
    const int b = (int)(pair / p.num_heads), head = (int)(pair % p.num_heads);
    /* The schedule was in place before the attention kernel started; its partial states are
     * not until it has finished (this kernel is its programmatic dependent). A block that leaves
     * early waits too, so this grid never completes before that one: stream order then carries
     * the rows the attention kernel wrote directly to whatever the caller launches next. */
    if (b >= p.merge_header->batch_size) {
        cinfer_pdl_wait();
        return; /* a spare CTA of a CUDA-graph grid, or a plan that did not split */
    }
    const cinfer_decode_request row = p.merge_rows[b];
    const int n = row.num_chunks;
    cinfer_pdl_wait();
    if (n <= 1)
        return; /* written by the attention kernel */
    const long long slot0 = (long long)row.partial_base + (long long)head * n;
    const float *lse = p.partial_lse + slot0;
    float m = -CINFER_INF;
    for (int c = (int)threadIdx.x; c < n; c += MERGE_THREADS)
        m = fmaxf(m, lse[c]);
    m = block_reduce(m, true, scratch);
    /* Nothing kept in any chunk: subtract 0, so every weight is 2^-inf = 0. */
    const float m_use = m == -CINFER_INF ? 0.0f : m;
    float wsum = 0.0f;
    for (int c = (int)threadIdx.x; c < n; c += MERGE_THREADS)
        wsum += exp2f(lse[c] - m_use);
    wsum = block_reduce(wsum, false, scratch);

    const int width = MERGE_THREADS / groups; /* threads per group */
    const int group = (int)threadIdx.x / width, lane = (int)threadIdx.x % width;
    const int col = slice * (D_CKV / groups) + lane * 4;
    const float *po = p.partial_o + slot0 * D_CKV + col;
    /* One group (the common case of many rows) with its chunk stride a constant. */
    float4 o = groups == 1 ? merge_fold(po, lse, m_use, n, 0, 1)
                           : merge_fold(po, lse, m_use, n, group, groups);
    if (groups > 1) {
        sums[threadIdx.x] = o;
        __syncthreads();
        if (group != 0)
            return;
        for (int g = 1; g < groups; g++) {
            const float4 x = sums[g * width + lane];
            o.x += x.x;
            o.y += x.y;
            o.z += x.z;
            o.w += x.w;
        }
    }
    const float inv = m == -CINFER_INF ? 0.0f : 1.0f / wsum;
    cinfer_half_bits *out = (cinfer_half_bits *)p.out + (long long)b * p.out_stride_n +
                            (long long)head * p.out_stride_h + col;
    *(uint2 *)out = make_uint2(cinfer_pack_half2(CINFER_DTYPE_O, o.x * inv, o.y * inv),
                               cinfer_pack_half2(CINFER_DTYPE_O, o.z * inv, o.w * inv));
    if (p.lse && slice == 0 && lane == 0)
        p.lse[(long long)b * p.lse_stride_n + (long long)head * p.lse_stride_h] =
            m == -CINFER_INF ? -CINFER_INF : m + log2f(wsum);
}

#endif
