/*
 * MLA on Hopper's warpgroup tensor cores (sm_90a only): kernels/mla.cu includes this file in place
 * of its mma.sync body when the spec has 64 rows (tile_q 64). What is computed, the work list, the
 * split-KV partial states and the merge are those of kernels/mla_params.h.
 *
 * A CTA holds 64 query rows: 64 query heads (head0 ..) of one token, so the latent KV tile it reads
 * serves 64 heads at once (the mma.sync kernel's 16 rows read it once per 16 heads: at H = 128,
 * eight times). Two warpgroups of 4 warps, both over the same 64 rows:
 *   S = Q K^T   warpgroup w sums its half of the 576 dims (18 k16 steps of wgmma m64n32k16, Q and
 *               K from shared memory); the two halves meet in shared memory and each warpgroup
 *               adds the other's to its own (a + b = b + a: both hold the same logits, so the
 *               same running maximum and denominator);
 *   softmax     per warpgroup, the same in both; P stays in registers as the A operand;
 *   O += P V    warpgroup w owns output columns 256 w .. 256 w + 255 (two m64n128k16 products per
 *               k16 step, 128 accumulators per thread), V being the ckv part of the K tile.
 * Tiles of TILE_KV = 32 positions (576 dims: 9 blocks of 64 columns, the 128-byte swizzled layout
 * of kernels/wgmma.cuh) are copied with cp.async by all 256 threads, STAGES deep; a thread's row
 * costs one page-table read. Copies are generic-proxy writes: each thread fences them to the async
 * proxy (fence.proxy.async) before the barrier after which wgmma reads them.
 *
 * Shared memory (aligned up to 1024 bytes): the Q tile (9 blocks of 64 rows x 128 bytes, 72 KiB),
 * STAGES KV tiles (9 blocks of 32 rows x 128 bytes, 36 KiB each) and the two warpgroups' partial
 * logits (16 floats x 128 threads each, 16 KiB): 196 KiB + 1 KiB at 3 stages, one CTA per SM.
 *
 * Prelude: as the mma.sync kernel, with CINFER_TILE_Q 64, CINFER_TILE_KV 32, CINFER_WARPS 8,
 * CINFER_GQA_PACK 64.
 */
#include "wgmma.cuh"

#if !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "mla (64 rows): wgmma needs sm_90a"
#endif

#define DT             CINFER_DTYPE_Q
#define ROWS           CINFER_TILE_Q
#define TILE_KV        CINFER_TILE_KV
#define STAGES         CINFER_STAGES
#define G              CINFER_GQA_PACK
#define THREADS        (CINFER_WARPS * 32)
#define BLOCKS         ((D_CKV + D_KPE) / 64) /* blocks of 64 columns in a row */
#define CKV_BLOCKS     (D_CKV / 64)
#define Q_BLOCK_BYTES  (ROWS * 128)
#define KV_BLOCK_BYTES (TILE_KV * 128)
#define Q_BYTES        (BLOCKS * Q_BLOCK_BYTES)
#define KV_BYTES       (BLOCKS * KV_BLOCK_BYTES)
#define S_REGS         (TILE_KV / 2)          /* m64nTILE_KV fp32 accumulators per thread */
#define HALF_STEPS     ((D_CKV + D_KPE) / 32) /* k16 steps of Q K^T per warpgroup */
#define O_REGS         128                    /* 256 columns of 64 rows per warpgroup */
#define Q_THREADS      (THREADS / ROWS)       /* threads per Q row in the copies */
#define KV_THREADS     (THREADS / TILE_KV)    /* threads per K/V row: one chunk of each block */
#if ROWS != 64 || TILE_KV != 32 || THREADS != 256 || G != 64 || KV_THREADS != 8 ||                 \
    (BLOCKS * 8) % Q_THREADS != 0 || STAGES < 2
#error "mla (64 rows): 64 heads of one token, 8 warps, KV tiles of 32 positions"
#endif

/* Byte offset of 16-byte chunk c (0..7) of row r in a block of the 128-byte swizzle. */
#define SWZ(r, c) ((unsigned)((r)*128 + (((c) ^ ((r) % 8)) * 16)))

/* The cp.async copies of KV tile `tile` into the stage at dst: this thread copies row j =
 * threadIdx.x / 8 (position tile * TILE_KV + j: one page-table read), chunk threadIdx.x % 8 of
 * each of the 9 blocks (8 of ckv, 1 of kpe); a row past kv_len is zero-filled. */
__device__ __forceinline__ void load_kv(unsigned dst, const cinfer_mla_params &p, const int *table,
                                        int tile, int kv_len) {
    const int j = (int)threadIdx.x / KV_THREADS, cb = (int)threadIdx.x % KV_THREADS;
    const int t = tile * TILE_KV + j;
    const bool valid = t < kv_len;
    const cinfer_half_bits *ckv, *kpe;
    mla_kv_row(p, table, t, valid, &ckv, &kpe);
    const unsigned to = dst + SWZ(j, cb);
#pragma unroll
    for (int b = 0; b < BLOCKS; b++) {
        const cinfer_half_bits *src = !valid           ? ckv
                                      : b < CKV_BLOCKS ? ckv + (b * 8 + cb) * 8
                                                       : kpe + cb * 8;
        cinfer_cp_async_16(to + b * KV_BLOCK_BYTES, src, valid);
    }
}

extern "C" __global__ void __launch_bounds__(THREADS, 1)
    CINFER_KERNEL_NAME(const cinfer_mla_params p) {
    extern __shared__ uint4 smem[];
    const unsigned s_q = (cinfer_smem_addr(smem) + 1023u) & ~1023u;
    const unsigned s_kv = s_q + Q_BYTES;
    /* [2][S_REGS][128] floats: each warpgroup's partial logits, by register and thread */
    float *s_part =
        (float *)((char *)smem + (s_q - cinfer_smem_addr(smem)) + Q_BYTES + STAGES * KV_BYTES);

    cinfer_prefill_work w;
    int head0;
    if (!mla_cta_work(p, G, &w, &head0))
        return; /* a spare CTA of a CUDA-graph grid */
    const int wg = (int)threadIdx.x / 128, tid = (int)threadIdx.x % 128;
    const int wq = tid / 32, lane = tid % 32;
    const int q0 = w.q_begin; /* the tile's token within the request */
    const int q_rows = CINFER_MIN(1, w.qo_len - q0) * G;
    const int delta = w.kv_len - w.qo_len; /* token i is at position i + delta */
    const int pos = q0 + delta;
    const int *table = p.kv_indices + w.kv_begin;
    int tile_begin;
    const int num_tiles = cinfer_prefill_kv_tiles(TILE_KV, q0, 1, delta, w.kv_len, 0, w.chunk_begin,
                                                  w.chunk_end, &tile_begin);

    /* The Q tile: row r = threadIdx.x / Q_THREADS is q_nope then q_pe of head head0 + r; rows
     * past the tile (none while H is a multiple of 64 and the token exists) are zero-filled. */
    {
        const int r = (int)threadIdx.x / Q_THREADS, c0 = (int)threadIdx.x % Q_THREADS;
        const bool valid = r < q_rows;
        const long long token = (long long)w.qo_begin + q0;
        const cinfer_half_bits *qn, *qp;
        mla_q_row(p, token, head0 + r, valid, &qn, &qp);
#pragma unroll
        for (int i = 0; i < BLOCKS * 8 / Q_THREADS; i++) {
            const int ch = c0 + i * Q_THREADS; /* chunk of the 72 in the row */
            const cinfer_half_bits *src = !valid                ? qn
                                          : ch < CKV_BLOCKS * 8 ? qn + ch * 8
                                                                : qp + (ch - CKV_BLOCKS * 8) * 8;
            cinfer_cp_async_16(s_q + (unsigned)((ch / 8) * Q_BLOCK_BYTES) + SWZ(r, ch % 8), src,
                               valid);
        }
    }
    cinfer_cp_async_commit();
#pragma unroll
    for (int s = 0; s < STAGES - 1; s++) {
        if (s < num_tiles)
            load_kv(s_kv + s * KV_BYTES, p, table, tile_begin + s, w.kv_len);
        cinfer_cp_async_commit();
    }

    /* This thread's rows 16 wq + lane / 4 (+ 8), its logits columns 8 j + 2 (lane % 4) (+ 1),
     * j = 0..3, and output columns 256 wg + 128 n + 8 j + 2 (lane % 4) (+ 1), j = 0..15. */
    float o[O_REGS];
#pragma unroll
    for (int i = 0; i < O_REGS; i++)
        o[i] = 0.0f;
    float m[2] = {-CINFER_INF, -CINFER_INF}, d[2] = {0.0f, 0.0f};
    float *my_part = s_part + wg * S_REGS * 128 + tid;
    const float *other_part = s_part + (1 - wg) * S_REGS * 128 + tid;

    for (int it = 0; it < num_tiles; it++) {
        /* Tile it (and Q) landed, seen by the async proxy; every thread is done with tile it - 1
         * (its stage, the partial logits). */
        CINFER_CP_ASYNC_WAIT(STAGES - 2);
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        __syncthreads();
        if (it + STAGES - 1 < num_tiles)
            load_kv(s_kv + ((it + STAGES - 1) % STAGES) * KV_BYTES, p, table,
                    tile_begin + it + STAGES - 1, w.kv_len);
        cinfer_cp_async_commit();
        const unsigned stage = s_kv + (it % STAGES) * KV_BYTES;
        const int kv0 = (tile_begin + it) * TILE_KV;

        /* This warpgroup's half of the logits: dims 288 wg .. 288 wg + 287. */
        float s[S_REGS];
        cinfer_wgmma_fence();
#pragma unroll
        for (int k = 0; k < HALF_STEPS; k++) {
            const int kk = wg * HALF_STEPS + k;
            cinfer_wgmma_ss_n32(
                s, cinfer_wgmma_desc(s_q + (kk / 4) * Q_BLOCK_BYTES + (kk % 4) * 32, 16, 1024),
                cinfer_wgmma_desc(stage + (kk / 4) * KV_BLOCK_BYTES + (kk % 4) * 32, 16, 1024),
                k > 0);
        }
        cinfer_wgmma_commit();
        CINFER_WGMMA_WAIT(0);
        cinfer_wgmma_pin_n(s, S_REGS);
#pragma unroll
        for (int r = 0; r < S_REGS; r++)
            my_part[r * 128] = s[r];
        __syncthreads();

        /* The logits (the halves summed), scaled to base 2, masked (past kv_len; causal: past
         * the token's position); the online softmax; P as the A registers of P V. */
#pragma unroll
        for (int r = 0; r < S_REGS; r++) {
            const int j = kv0 + 8 * (r / 4) + 2 * (lane % 4) + (r & 1);
            const bool keep = j < w.kv_len && (CINFER_MASK != 1 || j <= pos);
            s[r] = keep ? (s[r] + other_part[r * 128]) * p.q_scale : -CINFER_INF;
        }
        unsigned pa[TILE_KV / 16][4];
#pragma unroll
        for (int h = 0; h < 2; h++) {
            float mx = m[h];
#pragma unroll
            for (int j = 0; j < S_REGS / 4; j++)
                mx = fmaxf(mx, fmaxf(s[4 * j + 2 * h], s[4 * j + 2 * h + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            /* Nothing kept yet: subtract 0, so every exponential is of -inf and gives 0. */
            const float m_use = mx == -CINFER_INF ? 0.0f : mx;
            const float alpha = cinfer_fast_exp2(m[h] - m_use);
            float sum = 0.0f;
#pragma unroll
            for (int j = 0; j < S_REGS / 4; j++) {
                s[4 * j + 2 * h] = cinfer_fast_exp2(s[4 * j + 2 * h] - m_use);
                s[4 * j + 2 * h + 1] = cinfer_fast_exp2(s[4 * j + 2 * h + 1] - m_use);
                sum += s[4 * j + 2 * h] + s[4 * j + 2 * h + 1];
            }
            d[h] = d[h] * alpha + sum;
#pragma unroll
            for (int j = 0; j < O_REGS / 4; j++) {
                o[4 * j + 2 * h] *= alpha;
                o[4 * j + 2 * h + 1] *= alpha;
            }
            m[h] = mx;
        }
#pragma unroll
        for (int kk = 0; kk < TILE_KV / 16; kk++)
#pragma unroll
            for (int r = 0; r < 4; r++)
                pa[kk][r] = cinfer_pack_half2(DT, s[8 * kk + 2 * r], s[8 * kk + 2 * r + 1]);

        /* O += P V over this warpgroup's 256 columns: blocks 4 wg .. 4 wg + 3 of the ckv part. */
        cinfer_wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < TILE_KV / 16; kk++) {
            const unsigned v = stage + (unsigned)(4 * wg * KV_BLOCK_BYTES + kk * 16 * 128);
            cinfer_wgmma_rs_tb(o, pa[kk], cinfer_wgmma_desc(v, KV_BLOCK_BYTES, 1024));
            cinfer_wgmma_rs_tb(o + 64, pa[kk],
                               cinfer_wgmma_desc(v + 2 * KV_BLOCK_BYTES, KV_BLOCK_BYTES, 1024));
        }
        cinfer_wgmma_commit();
        CINFER_WGMMA_WAIT(0);
        cinfer_wgmma_pin_n(o, O_REGS);
    }
    CINFER_CP_ASYNC_WAIT(0);

    float inv2[2], lse2[2];
    mla_row_ends(d, m, inv2, lse2);
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int row = 16 * wq + lane / 4 + 8 * h;
        if (row >= q_rows)
            continue;
        const float inv = inv2[h], lse = lse2[h];
        const int head = head0 + row;
        const int col = 256 * wg + 2 * (lane % 4);
        if (w.partial >= 0) {
            const long long slot = (long long)w.partial + (long long)head * w.num_chunks;
            float *po = p.partial_o + slot * D_CKV + col;
#pragma unroll
            for (int j = 0; j < O_REGS / 4; j++)
                *(float2 *)(po + 8 * j) =
                    make_float2(o[4 * j + 2 * h] * inv, o[4 * j + 2 * h + 1] * inv);
            if (wg == 0 && lane % 4 == 0)
                p.partial_lse[slot] = lse;
            continue;
        }
        const long long r = (long long)w.qo_begin + q0;
        cinfer_half_bits *out =
            (cinfer_half_bits *)p.out + r * p.out_stride_n + (long long)head * p.out_stride_h + col;
#pragma unroll
        for (int j = 0; j < O_REGS / 4; j++)
            *(unsigned *)(out + 8 * j) =
                cinfer_pack_half2(DT, o[4 * j + 2 * h] * inv, o[4 * j + 2 * h + 1] * inv);
        if (p.lse && wg == 0 && lane % 4 == 0)
            p.lse[r * p.lse_stride_n + (long long)head * p.lse_stride_h] = lse;
    }
}
