/*
 * Single prefill on Hopper's warpgroup tensor cores (the sm90 backend, FlashAttention-3's scheme:
 * wgmma, TMA, mbarriers; sm_90a only). kernels/prefill.cu includes this file in place of its sm80
 * body when the spec's backend is sm90 (CINFER_BACKEND 2); the parameters, the grid and what is
 * computed are the same (kernels/prefill_params.h), for the specs spec.c's validate_prefill lets
 * through: one request, 16-bit q = K/V = out, D = 128, no mask or causal, default attention.
 *
 * One CTA computes TILE_Q = 64 x CONSUMERS query rows of one query head. Its warps:
 *   consumers  CONSUMERS warpgroups (warps 0..4 CONSUMERS - 1), 64 rows each;
 *   producer   one warp after them, whose first lane issues every copy: the Q tile once, then each
 *              KV tile's K and V into a ring of STAGES stages, as TMA boxes of 64 columns x TILE_KV
 *              rows x 1 head (the tensor maps of prefill_params.h, built by the host). A stage's
 *              "full" mbarrier counts the bytes in; its "empty" one counts the consumer threads
 *              out, and the producer waits for that before it copies the tile STAGES ahead there.
 * Each consumer warpgroup, for KV tile t:
 *   S_t = Q K_t^T   wgmma m64n128k16, A (its 64 rows of Q) and B (K_t) from shared memory;
 *   O += P_{t-1} V_{t-1}  issued right after, A = P_{t-1} in registers, B = V_{t-1} read
 *                   transposed from shared memory (its rows are K of this product);
 *   softmax of S_t  while O's product runs: base-2 logits (q_scale includes log2(e)), the running
 *                   row maximum over the quad's lanes, P_t = exp2(s - m) in place, row sums per
 *                   lane; then O is rescaled once its product landed, and P_t packed to 16-bit A
 *                   registers for the next iteration.
 * With two consumer warpgroups, they take turns to issue their tensor-core work (named barriers 1
 * and 2), so that one's softmax runs while the other's products do (FlashAttention-3's ping-pong).
 *
 * Masking: positions at or past kv_len (a TMA box reads zeros there) and, causal, past the row's
 * own position (rows bottom-right aligned: row i is at i + kv_len - qo_len) get -inf; a row that
 * keeps nothing ends with output 0 and LSE -inf. A causal CTA visits only the KV tiles up to its
 * last row's position.
 *
 * Shared memory (dynamic, aligned up to 1024 bytes for the swizzle): the Q tile as D / 64 blocks of
 * TILE_Q rows x 128 bytes, then STAGES stages of K and V, each D / 64 blocks of TILE_KV rows x 128
 * bytes (kernels/wgmma.cuh gives the layout). D = 128, TILE_Q = 128, TILE_KV = 128, 2 stages:
 * 160 KiB + 1 KiB.
 */
#include "wgmma.cuh"

#define D              CINFER_HEAD_DIM_QK
#define DT             CINFER_DTYPE_Q
#define TILE_Q         CINFER_TILE_Q
#define TILE_KV        CINFER_TILE_KV
#define STAGES         CINFER_STAGES
#define CONSUMERS      (TILE_Q / 64)
#define THREADS        (CONSUMERS * 128 + 128) /* and the producer warpgroup */
#define CAUSAL         (CINFER_MASK == 1)
#define DBLOCKS        (D / 64)
#define Q_BLOCK_BYTES  (TILE_Q * 128)
#define KV_BLOCK_BYTES (TILE_KV * 128)
#define KV_TILE_BYTES  (DBLOCKS * KV_BLOCK_BYTES) /* one of K or V */
#define STAGE_BYTES    (2 * KV_TILE_BYTES)
#define PINGPONG       (CONSUMERS == 2)

#if D != 128 || TILE_KV != 128 || (CONSUMERS != 1 && CONSUMERS != 2)
#error "the sm90 prefill kernel takes D = 128, TILE_KV = 128 and TILE_Q = 64 or 128"
#endif

/* Registers per thread of the producer warpgroup and of each consumer one after setmaxnreg (a
 * multiple of 8; 128 x (PRODUCER_REGS + CONSUMERS x CONSUMER_REGS) within the 64 Ki registers of an
 * SM). With one consumer, 256 threads get 255 registers each at launch and nothing moves. */
#define PRODUCER_REGS 40
#define CONSUMER_REGS 232

__device__ __forceinline__ float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

/* S of KV tile kv0 with -inf where a position is at or past kv_len or (causal) past the row's own
 * position pos0 (+ 8 for the lane's second row). */
__device__ __forceinline__ void mask_tile(float *s, int kv0, int kv_len, int pos0, int lane) {
#pragma unroll
    for (int j = 0; j < 16; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int col = kv0 + 8 * j + 2 * (lane % 4) + (e & 1);
            bool drop = col >= kv_len;
#if CAUSAL
            drop = drop || col > pos0 + 8 * (e >> 1);
#endif
            if (drop)
                s[4 * j + e] = -CINFER_INF;
        }
}

/* The online softmax of the lane's two rows over S (in place: S becomes P = 2^(s scale - m)):
 * the new row maxima m (base 2, over the quad's lanes), alpha = 2^(m_old - m_new) for O, and the
 * per-lane row sums l rescaled and increased. */
__device__ __forceinline__ void softmax_tile(float *s, float *m, float *l, float *alpha,
                                             float scale) {
#pragma unroll
    for (int h = 0; h < 2; h++) {
        float mx = -CINFER_INF;
#pragma unroll
        for (int j = 0; j < 16; j++)
            mx = fmaxf(mx, fmaxf(s[4 * j + 2 * h], s[4 * j + 2 * h + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float m_new = fmaxf(m[h], mx * scale);
        /* Nothing kept yet: subtract 0, so every exp2 is of -inf and gives 0. */
        const float m_use = m_new == -CINFER_INF ? 0.0f : m_new;
        alpha[h] = fast_exp2(m[h] - m_use);
        m[h] = m_new;
        float sum = 0.0f;
#pragma unroll
        for (int j = 0; j < 16; j++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const float v = fast_exp2(fmaf(s[4 * j + 2 * h + e], scale, -m_use));
                s[4 * j + 2 * h + e] = v;
                sum += v;
            }
        l[h] = l[h] * alpha[h] + sum;
    }
}

/* P (the fp32 S registers) as the 16-bit A registers of P V's k16 steps. */
__device__ __forceinline__ void pack_p(const float *s, unsigned (*pa)[4]) {
#pragma unroll
    for (int kk = 0; kk < TILE_KV / 16; kk++)
#pragma unroll
        for (int r = 0; r < 4; r++)
            pa[kk][r] = cinfer_pack_half2(DT, s[8 * kk + 2 * r], s[8 * kk + 2 * r + 1]);
}

/* S = Q K^T of this warpgroup's 64 rows against the K tile at s_k. */
__device__ __forceinline__ void issue_qk(float *s, unsigned s_q_rows, unsigned s_k) {
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++)
        cinfer_wgmma_ss(
            s, cinfer_wgmma_desc(s_q_rows + (kk / 4) * Q_BLOCK_BYTES + (kk % 4) * 32, 16, 1024),
            cinfer_wgmma_desc(s_k + (kk / 4) * KV_BLOCK_BYTES + (kk % 4) * 32, 16, 1024), kk > 0);
    cinfer_wgmma_commit();
}

/* O += P V for the V tile at s_v. */
__device__ __forceinline__ void issue_pv(float *o, unsigned (*pa)[4], unsigned s_v) {
#pragma unroll
    for (int kk = 0; kk < TILE_KV / 16; kk++)
        cinfer_wgmma_rs_tb(o, pa[kk], cinfer_wgmma_desc(s_v + kk * 16 * 128, KV_BLOCK_BYTES, 1024));
    cinfer_wgmma_commit();
}

extern "C" __global__ void __launch_bounds__(THREADS, 1)
    CINFER_KERNEL_NAME(const cinfer_prefill_params p, const cinfer_variant_params vp,
                       const __grid_constant__ cinfer_prefill_tma tma) {
    extern __shared__ uint4 smem[];
    __shared__ unsigned long long bars[2 * STAGES + 1];
    const unsigned s_q = (cinfer_smem_addr(smem) + 1023u) & ~1023u;
    const unsigned s_kv = s_q + DBLOCKS * Q_BLOCK_BYTES;
    const unsigned full = cinfer_smem_addr(bars), empty = full + 8u * STAGES,
                   q_full = full + 16u * STAGES;

    const int warp = (int)threadIdx.x / 32, lane = (int)threadIdx.x % 32;
    const int head = (int)(blockIdx.x % (unsigned)p.num_qo_heads);
    const int q_tile = p.num_q_tiles - 1 - (int)(blockIdx.x / (unsigned)p.num_qo_heads);
    const int q0 = q_tile * TILE_Q;
    const int kv_head = head / (p.num_qo_heads / p.num_kv_heads);
    const int q_rows = CINFER_MIN(TILE_Q, p.qo_len - q0);
    /* Row i's absolute position is i + delta; lengths are below 2^30, so this fits an int. */
    const int delta = p.kv_len - p.qo_len;
    int kv_end = p.kv_len;
#if CAUSAL
    kv_end = CINFER_MIN(kv_end, q0 + q_rows + delta);
#endif
    const int num_tiles = kv_end > 0 ? CINFER_CEIL_DIV(kv_end, TILE_KV) : 0;

    if (threadIdx.x == 0) {
        for (int st = 0; st < STAGES; st++) {
            cinfer_mbarrier_init(full + 8u * st, 1);
            cinfer_mbarrier_init(empty + 8u * st, CONSUMERS * 128);
        }
        cinfer_mbarrier_init(q_full, 1);
        cinfer_mbarrier_init_fence();
    }
    __syncthreads();

    if (warp >= CONSUMERS * 4) {
        /* The producer warpgroup; its first lane issues every copy. */
#if CONSUMERS == 2
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(PRODUCER_REGS));
#endif
        if (threadIdx.x == CONSUMERS * 128 && num_tiles > 0) {
            cinfer_mbarrier_arrive_expect_tx(q_full, TILE_Q * D * 2);
#pragma unroll
            for (int b = 0; b < DBLOCKS; b++)
                cinfer_tma_load_3d(s_q + b * Q_BLOCK_BYTES, &tma.q, b * 64, q0, head, q_full);
            for (int t = 0; t < num_tiles; t++) {
                const int st = t % STAGES;
                if (t >= STAGES)
                    cinfer_mbarrier_wait(empty + 8u * st, (unsigned)(t / STAGES - 1) & 1u);
                const unsigned bar = full + 8u * st, s_k = s_kv + st * STAGE_BYTES;
                cinfer_mbarrier_arrive_expect_tx(bar, STAGE_BYTES);
#pragma unroll
                for (int b = 0; b < DBLOCKS; b++) {
                    cinfer_tma_load_3d(s_k + b * KV_BLOCK_BYTES, &tma.k, b * 64, t * TILE_KV,
                                       kv_head, bar);
                    cinfer_tma_load_3d(s_k + KV_TILE_BYTES + b * KV_BLOCK_BYTES, &tma.v, b * 64,
                                       t * TILE_KV, kv_head, bar);
                }
            }
        }
    } else {
        /* A consumer: warpgroup wg, rows wg * 64 + 16 (warp % 4) + lane / 4 (+ 8) of the tile. */
#if CONSUMERS == 2
        asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(CONSUMER_REGS));
#endif
        const int wg = warp / 4;
        const int row0 = wg * 64 + (warp % 4) * 16 + lane / 4;
        const int pos0 = q0 + row0 + delta; /* the lane's first row's position */
        const unsigned s_q_rows = s_q + wg * 64 * 128;
        const float scale = p.q_scale;
        float o[64], s[64], alpha[2];
        unsigned pa[TILE_KV / 16][4];
        float m[2] = {-CINFER_INF, -CINFER_INF}, l[2] = {0.0f, 0.0f};
#pragma unroll
        for (int i = 0; i < 64; i++)
            o[i] = 0.0f;
            /* Tiles that need the element mask: from the first one holding a position past the
             * warpgroup's first row (causal), and the one holding kv_len. */
#if CAUSAL
        const int mask_from = (q0 + wg * 64 + delta + 1) / TILE_KV;
#else
        const int mask_from = p.kv_len / TILE_KV;
#endif

        if (num_tiles > 0) {
            cinfer_mbarrier_wait(q_full, 0);
            /* Tile 0: S only. */
            cinfer_mbarrier_wait(full, 0);
#if PINGPONG
            if (wg == 1)
                cinfer_bar_sync(2, 256);
#endif
            cinfer_wgmma_fence();
            issue_qk(s, s_q_rows, s_kv);
#if PINGPONG
            if (wg == 0 || num_tiles > 1)
                cinfer_bar_arrive(2 - wg, 256); /* the other group's turn */
#endif
            CINFER_WGMMA_WAIT(0);
            cinfer_wgmma_pin(s);
            if (0 >= mask_from || TILE_KV > p.kv_len)
                mask_tile(s, 0, p.kv_len, pos0, lane);
            softmax_tile(s, m, l, alpha, scale);
            pack_p(s, pa);

            for (int t = 1; t < num_tiles; t++) {
                const int st = t % STAGES;
                cinfer_mbarrier_wait(full + 8u * st, (unsigned)(t / STAGES) & 1u);
#if PINGPONG
                cinfer_bar_sync(1 + wg, 256);
#endif
                cinfer_wgmma_pin(o);
                cinfer_wgmma_fence();
                issue_qk(s, s_q_rows, s_kv + st * STAGE_BYTES);
                issue_pv(o, pa, s_kv + ((t - 1) % STAGES) * STAGE_BYTES + KV_TILE_BYTES);
#if PINGPONG
                if (!(wg == 1 && t == num_tiles - 1))
                    cinfer_bar_arrive(2 - wg, 256); /* the other group's turn */
#endif
                CINFER_WGMMA_WAIT(1);
                cinfer_wgmma_pin(s);
                const int kv0 = t * TILE_KV;
                if (t >= mask_from || kv0 + TILE_KV > p.kv_len)
                    mask_tile(s, kv0, p.kv_len, pos0, lane);
                softmax_tile(s, m, l, alpha, scale);
                /* The softmax before the wait below, not sunk past it by the compiler. */
                cinfer_wgmma_pin(s);
                CINFER_WGMMA_WAIT(0);
                cinfer_wgmma_pin(o);
                /* Tile t - 1's stage is read (K by S_{t-1}, V by the product just waited for). */
                cinfer_mbarrier_arrive(empty + 8u * ((t - 1) % STAGES));
#pragma unroll
                for (int i = 0; i < 64; i++)
                    o[i] *= alpha[(i % 4) / 2];
                pack_p(s, pa);
            }
            /* The last tile's product. */
            cinfer_wgmma_fence();
            issue_pv(o, pa, s_kv + ((num_tiles - 1) % STAGES) * STAGE_BYTES + KV_TILE_BYTES);
            CINFER_WGMMA_WAIT(0);
            cinfer_wgmma_pin(o);
        }

        /* Epilogue: row sums over the quad, then out = O / l (x v_scale), LSE = m + log2(l). */
        cinfer_half_bits *out = (cinfer_half_bits *)p.out + (long long)head * p.out_stride_h;
#pragma unroll
        for (int h = 0; h < 2; h++) {
            float sum = l[h];
            sum += __shfl_xor_sync(0xffffffffu, sum, 1);
            sum += __shfl_xor_sync(0xffffffffu, sum, 2);
            const int row = row0 + 8 * h;
            if (row >= q_rows)
                continue;
            const float inv = sum > 0.0f ? p.v_scale / sum : 0.0f;
            cinfer_half_bits *dst = out + (long long)(q0 + row) * p.out_stride_n + 2 * (lane % 4);
#pragma unroll
            for (int j = 0; j < 16; j++)
                *(unsigned *)(dst + 8 * j) =
                    cinfer_pack_half2(DT, o[4 * j + 2 * h] * inv, o[4 * j + 2 * h + 1] * inv);
            if (p.lse && lane % 4 == 0)
                p.lse[(long long)(q0 + row) * p.lse_stride_n + (long long)head * p.lse_stride_h] =
                    sum > 0.0f ? m[h] + log2f(sum) : -CINFER_INF;
        }
    }
}
