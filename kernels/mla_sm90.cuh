/*
 * MLA on Hopper's warpgroup tensor cores (sm_90a only): kernels/mla.cu includes this file in place
 * of its mma.sync body when the spec has 64 rows (tile_q 64). What is computed, the work list, the
 * split-KV partial states and the merge are those of kernels/mla_params.h.
 *
 * A CTA holds 64 query rows: 64 query heads (head0 ..) of one token, so the latent KV tile it reads
 * serves 64 heads at once (the mma.sync kernel's 16 rows read it once per 16 heads: at H = 128,
 * eight times). O (64 x 512 fp32) is too large for one warpgroup's registers, so each of the two
 * warpgroups owns half of its columns (warpgroup w: 256 w .. 256 w + 255, the ckv blocks 4 w ..
 * 4 w + 3 as V), and the two take turns at the logits, tile by tile (FlashMLA's "seesaw", its
 * deep-dive of 2025-04-22, with P shared through shared memory):
 *
 *   step i, tiles A = 2 i (warpgroup 0's logits) and B = 2 i + 1 (warpgroup 1's):
 *   wg 0: S_A = Q K_A^T (all 576 dims) | softmax from the running maximum m -> m_A, P_A; publish
 *         P_A and m_A | O_L = O_L a_A + P_A V_A,L | wait for P_B, m_B | O_L = O_L a_B, and
 *         O_L += P_B V_B,L issued with the next step's S_A
 *   wg 1: S_B = Q K_B^T | wait for P_A, m_A | softmax from m_A -> m_B, P_B; publish P_B and m_B |
 *         O_R = O_R a_A + P_A V_A,R | O_R = O_R a_B, and O_R += P_B V_B,R issued with the next
 *         step's S_B
 *
 * with a_t = 2^(m_before - m_after): O accumulates the tiles in order, as one online softmax would
 * (FlashAttention-2's recurrence), the two halves with the same maxima. Each warpgroup's logits run
 * on the tensor cores while the other's softmax runs on the FMA and MUFU pipes. Each warpgroup
 * sums the P of its own tiles (d, rescaled by every a_t); the two sums meet at the end. The
 * maximum is lazy (a row's stays until a tile's exceeds it by more than CINFER_LAZY_MAX_SLACK),
 * so a_t is mostly 1 and O's rescale is skipped when no row of the warp took a new maximum; the
 * warpgroup that reads m_t computes a_t with the same operations as the one that wrote it. No
 * wgmma is in flight across a loop's back edge (ptxas would serialize them).
 *
 * KV tiles of TILE_KV = 32 positions (576 dims: 9 blocks of 64 columns, the 128-byte swizzled
 * layout of kernels/wgmma.cuh) live in 4 stages: tile t in stage t % 4, so a step's two tiles
 * load while the previous step's are read. Warpgroup 0 copies the A tiles with cp.async (in step
 * i, tile A of step i + 1 once it has issued tile A's logits and warpgroup 1 has finished P V on
 * the stage's previous tile: the wait and the copies are not in front of the logits), warpgroup
 * 1 the B tiles (in step i, tile B of step i + 1, after its own and warpgroup 0's P V on that
 * stage); a thread's row costs one page-table read. A step past the last tile
 * (an odd count) has a zero-filled B tile whose logits are masked. Copies are generic-proxy
 * writes: each thread fences them to the async proxy (fence.proxy.async) before the barrier after
 * which wgmma reads them. Named barriers, bar.sync on both sides (the publishing side's
 * bar.arrive measured no faster on the H200, and racecheck follows bar.sync): BAR_A / BAR_B
 * (256: P and m of a step's A / B tile published), BAR_FREE_A (256: warpgroup 1 is done with the
 * step's A stage), BAR_LOAD (128, one per warpgroup: its own copies landed).
 *
 * Shared memory (aligned up to 1024 bytes): the Q tile (9 blocks of 64 rows x 128 bytes, 72 KiB),
 * 4 KV stages (9 blocks of 32 rows x 128 bytes, 36 KiB each), the two published P tiles (the A
 * registers of P V, 8 per thread, 4 KiB each) and maxima (64 floats each): 225.5 KiB + 1 KiB,
 * one CTA per SM.
 *
 * Prelude: as the mma.sync kernel, with CINFER_TILE_Q 64, CINFER_TILE_KV 32, CINFER_WARPS 8,
 * CINFER_STAGES 4, CINFER_GQA_PACK 64.
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
#define QK_STEPS       ((D_CKV + D_KPE) / 16) /* k16 steps of Q K^T */
#define O_REGS         128                    /* 256 columns of 64 rows per warpgroup */
#define P_REGS         (TILE_KV / 16 * 4)     /* P's A registers per thread */
#define P_BYTES        (P_REGS * 128 * 4)     /* one published P tile */
#define Q_THREADS      (THREADS / ROWS)       /* threads per Q row in the copies */
#define KV_THREADS     (128 / TILE_KV)        /* threads of a warpgroup per K/V row */
#define BAR_A          1
#define BAR_B          2
#define BAR_FREE_A     3
#define BAR_LOAD       4 /* + the warpgroup */
#if ROWS != 64 || TILE_KV != 32 || THREADS != 256 || G != 64 || KV_THREADS != 4 ||                 \
    (BLOCKS * 8) % Q_THREADS != 0 || STAGES != 4
#error "mla (64 rows): 64 heads of one token, 8 warps, KV tiles of 32 positions in 4 stages"
#endif

/* Byte offset of 16-byte chunk c (0..7) of row r in a block of the 128-byte swizzle. */
#define SWZ(r, c) ((unsigned)((r)*128 + (((c) ^ ((r) % 8)) * 16)))

/* The cp.async copies of the CTA's local KV tile `tile` (positions (tile_begin + tile) *
 * TILE_KV ..) into the stage at dst by the 128 threads of one warpgroup (tid its thread): row j =
 * tid / 4 (one page-table read), chunks tid % 4 and tid % 4 + 4 of each of the 9 blocks (8 of
 * ckv, 1 of kpe). A row past kv_len, or of a tile past the CTA's last, is zero-filled. */
__device__ __forceinline__ void load_kv(unsigned dst, const cinfer_mla_params &p, const int *table,
                                        int tile, int num_tiles, int tile_begin, int kv_len,
                                        int tid) {
    const int j = tid / KV_THREADS, cb = tid % KV_THREADS;
    const int t = (tile_begin + tile) * TILE_KV + j;
    const bool valid = tile < num_tiles && t < kv_len;
    const cinfer_half_bits *ckv, *kpe;
    mla_kv_row(p, table, t, valid, &ckv, &kpe);
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int c = cb + 4 * h;
        const unsigned to = dst + SWZ(j, c);
#pragma unroll
        for (int b = 0; b < BLOCKS; b++) {
            const cinfer_half_bits *src = !valid           ? ckv
                                          : b < CKV_BLOCKS ? ckv + (b * 8 + c) * 8
                                                           : kpe + c * 8;
            cinfer_cp_async_16(to + b * KV_BLOCK_BYTES, src, valid);
        }
    }
}

/* This warpgroup's copies landed and are seen by the async proxy for all its threads. */
__device__ __forceinline__ void loads_landed(int wg) {
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    cinfer_bar_sync(BAR_LOAD + wg, 128);
}

/* s = Q K^T of the KV tile in the stage at kv (64 x 32, all 576 dims). */
__device__ __forceinline__ void issue_qk(float *s, unsigned s_q, unsigned kv) {
#pragma unroll
    for (int k = 0; k < QK_STEPS; k++)
        cinfer_wgmma_ss_n32(
            s, cinfer_wgmma_desc(s_q + (k / 4) * Q_BLOCK_BYTES + (k % 4) * 32, 16, 1024),
            cinfer_wgmma_desc(kv + (k / 4) * KV_BLOCK_BYTES + (k % 4) * 32, 16, 1024), k > 0);
}

/* o += P V over warpgroup wg's 256 columns (ckv blocks 4 wg .. 4 wg + 3 of the stage at kv). */
__device__ __forceinline__ void issue_pv(float *o, const unsigned *pa, unsigned kv, int wg) {
#pragma unroll
    for (int kk = 0; kk < TILE_KV / 16; kk++) {
        const unsigned v = kv + (unsigned)(4 * wg * KV_BLOCK_BYTES + kk * 16 * 128);
        cinfer_wgmma_rs_tb(o, pa + 4 * kk, cinfer_wgmma_desc(v, KV_BLOCK_BYTES, 1024));
        cinfer_wgmma_rs_tb(o + 64, pa + 4 * kk,
                           cinfer_wgmma_desc(v + 2 * KV_BLOCK_BYTES, KV_BLOCK_BYTES, 1024));
    }
}

/* A step's start for warpgroup wg: its tile of the step (copied in the step before) landed for all
 * its threads; then that tile's logits s (Q K^T against the stage at `stage`) and the previous B
 * tile's P V over its half of O (pb against the stage at v_b), each in a group of its own. */
__device__ __forceinline__ void start_step(float *s, float *o, const unsigned *pb, unsigned s_q,
                                           unsigned stage, unsigned v_b, int wg) {
    CINFER_CP_ASYNC_WAIT(0);
    loads_landed(wg);
    cinfer_wgmma_fence();
    issue_qk(s, s_q, stage);
    cinfer_wgmma_commit();
    issue_pv(o, pb, v_b, wg);
    cinfer_wgmma_commit();
}

/* The lazy maximum's step for one row: the kept maximum after a tile whose maximum (with the
 * old one) is mx, and a = 2^(m - kept) (1 when it stays). Both warpgroups call it on the same
 * values, or compute a from the published kept maximum with rescale_of. */
__device__ __forceinline__ float lazy_max(float m, float mx) {
    return mx > m + CINFER_LAZY_MAX_SLACK ? mx : m;
}
__device__ __forceinline__ float rescale_of(float m_old, float m_new) {
    return m_new != m_old ? cinfer_fast_exp2(m_old - m_new) : 1.0f;
}

/* The softmax of tile t's logits s (local tile `tile`, positions kv0 ..) from the running maxima
 * m (updated): masked (a tile past the CTA's last, past kv_len, causal: past the token's position
 * pos), scaled to base 2, P = 2^(x - m) in s, d = d a + the row sums; a per row. */
__device__ __forceinline__ void softmax_tile(float *s, float *m, float *d, float *a, int tile,
                                             int num_tiles, int kv0, int kv_len, int pos,
                                             float q_scale, int lane) {
#pragma unroll
    for (int r = 0; r < S_REGS; r++) {
        const int j = kv0 + 8 * (r / 4) + 2 * (lane % 4) + (r & 1);
        const bool keep = tile < num_tiles && j < kv_len && (CINFER_MASK != 1 || j <= pos);
        s[r] = keep ? s[r] * q_scale : -CINFER_INF;
    }
#pragma unroll
    for (int h = 0; h < 2; h++) {
        float mx = m[h];
#pragma unroll
        for (int j = 0; j < S_REGS / 4; j++)
            mx = fmaxf(mx, fmaxf(s[4 * j + 2 * h], s[4 * j + 2 * h + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float m_new = lazy_max(m[h], mx);
        a[h] = rescale_of(m[h], m_new);
        /* Nothing kept yet: subtract 0, so every exponential is of -inf and gives 0. */
        const float m_use = m_new == -CINFER_INF ? 0.0f : m_new;
        float sum = 0.0f;
#pragma unroll
        for (int j = 0; j < S_REGS / 4; j++) {
            s[4 * j + 2 * h] = cinfer_fast_exp2(s[4 * j + 2 * h] - m_use);
            s[4 * j + 2 * h + 1] = cinfer_fast_exp2(s[4 * j + 2 * h + 1] - m_use);
            sum += s[4 * j + 2 * h] + s[4 * j + 2 * h + 1];
        }
        d[h] = d[h] * a[h] + sum;
        m[h] = m_new;
    }
}

/* P (16-bit) of the softmax'd s as the A registers of P V. */
__device__ __forceinline__ void pack_p(unsigned *pa, const float *s) {
#pragma unroll
    for (int i = 0; i < P_REGS; i++)
        pa[i] = cinfer_pack_half2(DT, s[2 * i], s[2 * i + 1]);
}

/* o *= a per row, skipped when no row of the warp changed (a = 1 for both rows of every lane). */
__device__ __forceinline__ void rescale_o(float *o, const float *a) {
    if (__any_sync(0xffffffffu, a[0] != 1.0f || a[1] != 1.0f)) {
#pragma unroll
        for (int j = 0; j < O_REGS / 4; j++) {
            o[4 * j] *= a[0];
            o[4 * j + 1] *= a[0];
            o[4 * j + 2] *= a[1];
            o[4 * j + 3] *= a[1];
        }
    }
}

/* The running maxima m moved to the published m_new (the other warpgroup's tile): a = each row's
 * factor 2^(m - m_new) (1 where it stays), and the row sums d rescaled by it. */
__device__ __forceinline__ void adopt_maxima(float *m, float *d, float *a, const float *m_new) {
#pragma unroll
    for (int h = 0; h < 2; h++) {
        a[h] = rescale_of(m[h], m_new[h]);
        d[h] *= a[h];
        m[h] = m_new[h];
    }
}

/* Publishes a tile's P (this thread's A registers) and its rows' maxima (one lane per quad). */
__device__ __forceinline__ void publish(unsigned *p_buf, float *m_buf, const unsigned *pa,
                                        const float *m, int tid) {
#pragma unroll
    for (int i = 0; i < P_REGS; i++)
        p_buf[i * 128 + tid] = pa[i];
    if (tid % 4 == 0) {
        const int row = 16 * (tid / 32) + (tid % 32) / 4;
        m_buf[row] = m[0];
        m_buf[row + 8] = m[1];
    }
}

/* Reads what the other warpgroup published (the same rows and registers as this thread's). */
__device__ __forceinline__ void receive(unsigned *pa, float *m, const unsigned *p_buf,
                                        const float *m_buf, int tid) {
#pragma unroll
    for (int i = 0; i < P_REGS; i++)
        pa[i] = p_buf[i * 128 + tid];
    const int row = 16 * (tid / 32) + (tid % 32) / 4;
    m[0] = m_buf[row];
    m[1] = m_buf[row + 8];
}

extern "C" __global__ void __launch_bounds__(THREADS, 1)
    CINFER_KERNEL_NAME(const cinfer_mla_params p) {
    extern __shared__ uint4 smem[];
    const unsigned s_q = (cinfer_smem_addr(smem) + 1023u) & ~1023u;
    const unsigned s_kv = s_q + Q_BYTES;
    char *const base = (char *)smem + (s_q - cinfer_smem_addr(smem));
    /* the published P tiles [2][P_REGS][128] and maxima [2][64] (A tiles' first) */
    unsigned *const p_buf = (unsigned *)(base + Q_BYTES + STAGES * KV_BYTES);
    float *const m_buf = (float *)(base + Q_BYTES + STAGES * KV_BYTES + 2 * P_BYTES);

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
    const int num_steps = (num_tiles + 1) / 2;

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
    /* Step 0's tile of this warpgroup (A = 0, B = 1), then Q and it landed for all threads. */
    if (num_steps > 0)
        load_kv(s_kv + wg * KV_BYTES, p, table, wg, num_tiles, tile_begin, w.kv_len, tid);
    cinfer_cp_async_commit();
    CINFER_CP_ASYNC_WAIT(0);
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    __syncthreads();

    /* This thread's rows 16 wq + lane / 4 (+ 8), its logits columns 8 j + 2 (lane % 4) (+ 1),
     * j = 0..3, and output columns 256 wg + 128 n + 8 j + 2 (lane % 4) (+ 1), j = 0..15. */
    float o[O_REGS];
#pragma unroll
    for (int i = 0; i < O_REGS; i++)
        o[i] = 0.0f;
    float m[2] = {-CINFER_INF, -CINFER_INF}, d[2] = {0.0f, 0.0f};
    /* P of the previous step's B tile and its stage, whose P V is issued with this step's logits:
     * before step 0, P = 0 against the Q tile (finite values), a product that adds exactly 0. */
    unsigned pb[P_REGS];
#pragma unroll
    for (int i = 0; i < P_REGS; i++)
        pb[i] = 0u;
    unsigned v_b = s_q;

    if (wg == 0) {
        for (int i = 0; i < num_steps; i++) {
            const unsigned stage_a = s_kv + ((2 * i) % STAGES) * KV_BYTES;
            /* This step's A tile's logits first, then tile A of step i + 1 into the stage of
             * step i - 1's, which warpgroup 1 is done with. */
            float s[S_REGS];
            start_step(s, o, pb, s_q, stage_a, v_b, 0);
            if (i > 0)
                cinfer_bar_sync(BAR_FREE_A, 256);
            if (i + 1 < num_steps)
                load_kv(s_kv + ((2 * i + 2) % STAGES) * KV_BYTES, p, table, 2 * i + 2, num_tiles,
                        tile_begin, w.kv_len, tid);
            cinfer_cp_async_commit();
            CINFER_WGMMA_WAIT(1);
            cinfer_wgmma_pin_n(s, S_REGS);
            float a[2];
            softmax_tile(s, m, d, a, 2 * i, num_tiles, (tile_begin + 2 * i) * TILE_KV, w.kv_len,
                         pos, p.q_scale, lane);
            unsigned pa[P_REGS];
            pack_p(pa, s);
            /* Publish A, then wait for the previous B tile's P V before BAR_A, after which
             * warpgroup 1 refills that tile's stage (this wait must stay before the barrier);
             * the wait after the stores, or ptxas moves it before the exponentials. */
            publish(p_buf, m_buf, pa, m, tid);
            CINFER_WGMMA_WAIT(0);
            cinfer_wgmma_pin_n(o, O_REGS);
            cinfer_bar_sync(BAR_A, 256);
            rescale_o(o, a);
            cinfer_wgmma_fence();
            issue_pv(o, pa, stage_a, 0);
            cinfer_wgmma_commit();

            /* Tile B's P and maxima: O and d to them once A's P V is done. */
            cinfer_bar_sync(BAR_B, 256);
            float m_b[2];
            receive(pb, m_b, p_buf + P_REGS * 128, m_buf + 64, tid);
            adopt_maxima(m, d, a, m_b);
            CINFER_WGMMA_WAIT(0);
            cinfer_wgmma_pin_n(o, O_REGS);
            rescale_o(o, a);
            v_b = s_kv + ((2 * i + 1) % STAGES) * KV_BYTES;
        }
    } else {
        for (int i = 0; i < num_steps; i++) {
            const unsigned stage_a = s_kv + ((2 * i) % STAGES) * KV_BYTES;
            const unsigned stage_b = s_kv + ((2 * i + 1) % STAGES) * KV_BYTES;
            float s[S_REGS];
            start_step(s, o, pb, s_q, stage_b, v_b, 1);

            /* Tile A's P and maxima; O and d to them once the previous B tile's P V is done. */
            cinfer_bar_sync(BAR_A, 256);
            unsigned pa[P_REGS];
            float m_a[2], a[2];
            receive(pa, m_a, p_buf, m_buf, tid);
            adopt_maxima(m, d, a, m_a);
            CINFER_WGMMA_WAIT(0);
            cinfer_wgmma_pin_n(s, S_REGS);
            cinfer_wgmma_pin_n(o, O_REGS);
            /* Both warpgroups are done with the previous B tile's stage: tile B of step i + 1
             * into it (warpgroup 0 waited for its P V there before it arrived at BAR_A). */
            if (i + 1 < num_steps)
                load_kv(s_kv + ((2 * i + 3) % STAGES) * KV_BYTES, p, table, 2 * i + 3, num_tiles,
                        tile_begin, w.kv_len, tid);
            cinfer_cp_async_commit();

            float a_b[2];
            softmax_tile(s, m, d, a_b, 2 * i + 1, num_tiles, (tile_begin + 2 * i + 1) * TILE_KV,
                         w.kv_len, pos, p.q_scale, lane);
            pack_p(pb, s);
            publish(p_buf + P_REGS * 128, m_buf + 64, pb, m, tid);
            cinfer_bar_sync(BAR_B, 256);

            rescale_o(o, a);
            cinfer_wgmma_fence();
            issue_pv(o, pa, stage_a, 1);
            cinfer_wgmma_commit();
            CINFER_WGMMA_WAIT(0);
            cinfer_wgmma_pin_n(o, O_REGS);
            rescale_o(o, a_b);
            if (i + 1 < num_steps)
                cinfer_bar_sync(BAR_FREE_A, 256);
            v_b = stage_b;
        }
    }
    /* The last B tile's P V (with no tiles, P = 0 against Q: O stays 0). */
    cinfer_wgmma_fence();
    issue_pv(o, pb, v_b, wg);
    cinfer_wgmma_commit();
    CINFER_WGMMA_WAIT(0);
    cinfer_wgmma_pin_n(o, O_REGS);
    CINFER_CP_ASYNC_WAIT(0);

    /* The row sums: each warpgroup's d covers its own tiles (in the same maxima); the two meet
     * through the P buffers (both warpgroups add the same two partials, so the same sum). */
    __syncthreads();
    float *const d_buf = (float *)p_buf;
    d_buf[(2 * wg) * 128 + tid] = d[0];
    d_buf[(2 * wg + 1) * 128 + tid] = d[1];
    __syncthreads();
    d[0] += d_buf[(2 * (1 - wg)) * 128 + tid];
    d[1] += d_buf[(2 * (1 - wg) + 1) * 128 + tid];

    float inv2[2], lse2[2];
    mla_row_ends(d, m, inv2, lse2);
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int row = 16 * wq + lane / 4 + 8 * h;
        if (row >= q_rows)
            continue;
        const float inv = inv2[h], lse = lse2[h];
        mla_store_row(p, w, o, O_REGS / 4, h, q0, head0 + row, 256 * wg + 2 * (lane % 4), inv, lse,
                      wg == 0 && lane % 4 == 0);
    }
}
