/*
 * Decode attention on CUDA cores: one query token per request over a paged (or contiguous) KV
 * cache, one CTA per work item of the plan (kernels/decode_params.h), and the merge of split-KV
 * partial states.
 *
 * Thread layout of the attention kernel: a KV token's head row of D elements is read by TX
 * consecutive lanes, VEC = 8 elements (16 bytes of fp16/bf16, 8 bytes of fp8) each, so a row is
 * one coalesced segment. A warp covers TY = 32 / TX tokens at once, the CTA WARPS * TY "token
 * rows", and each thread walks U tokens per step, with the next step's K/V loads issued before
 * the current step's arithmetic (register double buffering) so enough bytes are in flight to
 * cover memory latency. The query heads of one GQA group slice (HPC heads) share every K/V load.
 * Each token row keeps its own online-softmax state (running max m, denominator d, accumulator);
 * the rows are merged through shared memory at the end.
 *
 * Logits are kept in base-2 units (q is pre-scaled by log2(e)), so exp2 is one instruction.
 *
 * In-kernel RoPE (CINFER_POS = 1, kernels/pos_rope.cuh): q is rotated once per work item at the
 * query's position, and every K vector after it is unpacked, at its token's position, in float32
 * (nothing is rounded). A pair's two elements sit D / 16 lanes apart in a token row (lane tx holds
 * elements 8 tx .. 8 tx + 7), so each lane fetches its partners with shuffles.
 *
 * Prelude: CINFER_DTYPE_Q/KV/O, CINFER_HEAD_DIM_QK (== CINFER_HEAD_DIM_VO), CINFER_PAGED,
 * CINFER_POS (0 none, 1 RoPE), CINFER_SOFTCAP, CINFER_TILE_Q (HPC), CINFER_TILE_KV (U),
 * CINFER_WARPS, and CINFER_OP_DECODE or CINFER_OP_DECODE_MERGE.
 */
#include "common.cuh"
#include "decode_kv.cuh"
#include "decode_params.h"
#include "decode_work.cuh"
#include "pos_rope.cuh"
#include "soft_cap.cuh"
#include "variant.cuh"

#define D         CINFER_HEAD_DIM_VO
#define VEC       8
#define ROW_LANES (D / VEC)
/* Lanes per token row: the next power of two >= D / 8, so a butterfly reduction stays in a row. */
#define TX                                                                                         \
    (ROW_LANES > 16  ? 32                                                                          \
     : ROW_LANES > 8 ? 16                                                                          \
     : ROW_LANES > 4 ? 8                                                                           \
     : ROW_LANES > 2 ? 4                                                                           \
     : ROW_LANES > 1 ? 2                                                                           \
                     : 1)
#define TY      (32 / TX)
#define WARPS   CINFER_WARPS
#define THREADS (WARPS * 32)
#define ROWS    (WARPS * TY)

#if CINFER_DTYPE_KV == CINFER_DT_E4M3 || CINFER_DTYPE_KV == CINFER_DT_E5M2
#define KV_FP8 1
typedef uint2 kv_vec;
#else
#define KV_FP8 0
typedef uint4 kv_vec;
#endif

#if defined(CINFER_OP_DECODE)

#define HPC CINFER_TILE_Q
#define U   CINFER_TILE_KV

__device__ __forceinline__ void kv_unpack(float *dst, kv_vec v) {
#if KV_FP8
    cinfer_unpack8_fp8(dst, CINFER_DTYPE_KV, v);
#else
    cinfer_unpack8(dst, CINFER_DTYPE_KV, v);
#endif
}

/* Loads the K and V vectors of this thread's U tokens of the step starting at t0. */
__device__ __forceinline__ void load_step(const cinfer_decode_params &p, int page_begin,
                                          long long head_offset, int t0, int row, int tx,
                                          int kv_end, kv_vec *k, kv_vec *v) {
#pragma unroll
    for (int u = 0; u < U; u++) {
        const int t = t0 + u * ROWS + row;
        if (t < kv_end && tx < ROW_LANES) {
            const long long off =
                cinfer_decode_token_offset(p, page_begin, t) + head_offset + tx * VEC;
            k[u] = *(const kv_vec *)((const unsigned char *)p.k + off * (KV_FP8 ? 1 : 2));
            v[u] = *(const kv_vec *)((const unsigned char *)p.v + off * (KV_FP8 ? 1 : 2));
        } else {
#if KV_FP8
            k[u] = make_uint2(0, 0);
            v[u] = make_uint2(0, 0);
#else
            k[u] = make_uint4(0, 0, 0, 0);
            v[u] = make_uint4(0, 0, 0, 0);
#endif
        }
    }
}

/* Sum over the TX lanes of a token row. */
__device__ __forceinline__ float row_sum(float x) {
#pragma unroll
    for (int offset = TX / 2; offset > 0; offset /= 2)
        x += __shfl_xor_sync(0xffffffffu, x, offset);
    return x;
}

/* Hooks (or RoPE) that need the query's position. */
#define NEEDS_POS                                                                                  \
    (VARIANT_QUERY_TRANSFORM || CINFER_VARIANT_LOGITS || VARIANT_STATE_INIT ||                     \
     VARIANT_OUTPUT_TRANSFORM || CINFER_ROPE)

#if CINFER_ROPE
#define ROPE_HALF (D / 16) /* lanes between a pair's two elements */

/* RoPE of this lane's 8 elements x (lane tx of a token row, elements 8 tx ..) at position pos:
 * every lane of the warp calls it (the partners come by shuffle); lanes past the row
 * (tx >= ROW_LANES) keep their values. freq: the block's frequency table. */
__device__ __forceinline__ void rope_lane(float *x, int tx, float pos, const float2 *freq) {
    const int lane = (int)threadIdx.x % 32;
    const bool first = tx < ROPE_HALF, row = tx < ROW_LANES;
    const int src = lane + (!row ? 0 : first ? ROPE_HALF : -ROPE_HALF);
    const int m0 = (first ? tx : tx - ROPE_HALF) * 8;
    float partner[8];
#pragma unroll
    for (int i = 0; i < 8; i++)
        partner[i] = __shfl_sync(0xffffffffu, x[i], src);
    if (!row)
        return;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        float sn, cs;
        cinfer_rope_sincos(pos, freq[m0 + i], &sn, &cs);
        /* first half: x cos - partner sin; second half: x cos + partner sin */
        x[i] = fmaf(x[i], cs, (first ? -partner[i] : partner[i]) * sn);
    }
}
#endif

extern "C" __global__ void __launch_bounds__(THREADS)
    CINFER_KERNEL_NAME(const cinfer_decode_params p,
                       const cinfer_variant_params vp CINFER_ROPE_KERNEL_PARAM) {
    [[maybe_unused]] __shared__ float smem_md[ROWS][HPC][2]; /* (unused without softmax) */
    __shared__ __align__(16) float smem_acc[ROWS][HPC][D];

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int tx = lane % TX, row = warp * TY + lane / TX;
    const int group = p.num_qo_heads / p.num_kv_heads;
    const int slices_per_head = group / HPC;
    /* The first item (decode_work.cuh), and each next one while the current one runs: an item's
     * start then waits for its page-table entries, q and KV only (the item carries
     * kv_indptr[request] and kv_len). */
    int num_ctas;
    cinfer_decode_work next_item = cinfer_decode_first_work(p, &num_ctas);
    /* The merge kernel (a programmatic dependent launch) may start its blocks now: they wait for
     * this grid to finish before they read a partial state. */
    cinfer_pdl_launch_dependents();
#if CINFER_ROPE
    /* The pairs' frequencies, from the host's table (pos_rope.cuh). */
    __shared__ float2 rope_freq[D / 2];
    cinfer_rope_freq_init(rope_freq, rope, D, (int)threadIdx.x, THREADS);
    __syncthreads();
#endif

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

        /* This thread's slice of each query head, pre-scaled into base-2 logit units. */
        float q[HPC][VEC];
#pragma unroll
        for (int g = 0; g < HPC; g++) {
            if (tx < ROW_LANES) {
                const cinfer_half_bits *qp = (const cinfer_half_bits *)p.q + b * p.q_stride_n +
                                             (long long)(qo_head0 + g) * p.q_stride_h + tx * VEC;
                cinfer_unpack8(q[g], CINFER_DTYPE_Q, *(const uint4 *)qp);
            } else {
#pragma unroll
                for (int i = 0; i < VEC; i++)
                    q[g][i] = 0.0f;
            }
#if CINFER_ROPE
            rope_lane(q[g], tx, (float)qo_pos, rope_freq);
#endif
#if VARIANT_QUERY_TRANSFORM
            if (tx < ROW_LANES) {
#pragma unroll
                for (int i = 0; i < VEC; i++)
                    q[g][i] = variant_query_transform(&vp, q[g][i], b, qo_pos, qo_head0 + g,
                                                      tx * VEC + i);
            }
#endif
#pragma unroll
            for (int i = 0; i < VEC; i++)
                q[g][i] *= p.q_scale;
        }

        float m[HPC], d[HPC], acc[HPC][VEC];
#pragma unroll
        for (int g = 0; g < HPC; g++) {
            m[g] = -CINFER_INF;
            d[g] = 0.0f;
#pragma unroll
            for (int i = 0; i < VEC; i++)
                acc[g][i] = 0.0f;
        }

        const int page_begin = item.page_begin; /* 0 for contiguous KV */
        const long long head_offset = (long long)kv_head * p.kv_stride_head;
        kv_vec k_next[U], v_next[U];
        load_step(p, page_begin, head_offset, item.kv_begin, row, tx, item.kv_end, k_next, v_next);

        for (int t0 = item.kv_begin; t0 < item.kv_end; t0 += ROWS * U) {
            kv_vec k_cur[U], v_cur[U];
#pragma unroll
            for (int u = 0; u < U; u++) {
                k_cur[u] = k_next[u];
                v_cur[u] = v_next[u];
            }
            if (t0 + ROWS * U < item.kv_end)
                load_step(p, page_begin, head_offset, t0 + ROWS * U, row, tx, item.kv_end, k_next,
                          v_next);

            float s[U][HPC];
#pragma unroll
            for (int u = 0; u < U; u++) {
                float k[VEC];
                kv_unpack(k, k_cur[u]);
                const bool valid = t0 + u * ROWS + row < item.kv_end;
#if CINFER_ROPE
                rope_lane(k, tx, (float)(t0 + u * ROWS + row), rope_freq);
#endif
#pragma unroll
                for (int g = 0; g < HPC; g++) {
                    float dot = 0.0f;
#pragma unroll
                    for (int i = 0; i < VEC; i++)
                        dot = fmaf(q[g][i], k[i], dot);
                    dot = row_sum(dot);
#if CINFER_VARIANT_LOGITS
                    /* Through the hooks in natural-log units (the host's q_scale has no log2(e)
                     * for these kernels); with softmax the result goes to base 2, without it is
                     * the weight itself (0 where dropped). */
                    float x = CINFER_VARIANT_DROPPED;
                    if (valid) {
                        x = cinfer_variant_logit(&vp, dot, b, qo_pos, t0 + u * ROWS + row,
                                                 qo_head0 + g, kv_head);
                        if (VARIANT_USE_SOFTMAX)
                            x *= CINFER_LOG2E; /* -inf stays -inf */
                    }
                    s[u][g] = x;
#else
#if CINFER_SOFTCAP
                    dot = cinfer_soft_cap_log2(dot * CINFER_SOFT_CAP_Y_PER_X, p.soft_cap_log2);
#endif
                    s[u][g] = valid ? dot : -CINFER_INF;
#endif
                }
            }

#if VARIANT_USE_SOFTMAX
#pragma unroll
            for (int g = 0; g < HPC; g++) {
                float m_new = m[g];
#pragma unroll
                for (int u = 0; u < U; u++)
                    m_new = fmaxf(m_new, s[u][g]);
                if (m_new == -CINFER_INF)
                    continue; /* nothing kept yet in this row: the state stays empty */
                const float alpha = exp2f(m[g] - m_new);
                m[g] = m_new;
                d[g] *= alpha;
#pragma unroll
                for (int i = 0; i < VEC; i++)
                    acc[g][i] *= alpha;
#pragma unroll
                for (int u = 0; u < U; u++)
                    s[u][g] = exp2f(s[u][g] - m_new);
            }
#endif
#pragma unroll
            for (int u = 0; u < U; u++) {
                float v[VEC];
                kv_unpack(v, v_cur[u]);
#pragma unroll
                for (int g = 0; g < HPC; g++) {
#if VARIANT_USE_SOFTMAX
                    if (m[g] == -CINFER_INF)
                        continue;
                    d[g] += s[u][g];
#endif
#pragma unroll
                    for (int i = 0; i < VEC; i++)
                        acc[g][i] = fmaf(s[u][g], v[i], acc[g][i]);
                }
            }
        }

        /* Merge the token rows' states through shared memory. */
#pragma unroll
        for (int g = 0; g < HPC; g++) {
            if (tx == 0) {
                smem_md[row][g][0] = m[g];
                smem_md[row][g][1] = d[g];
            }
            if (tx < ROW_LANES) {
#pragma unroll
                for (int i = 0; i < VEC; i++)
                    smem_acc[row][g][tx * VEC + i] = acc[g][i];
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
        for (int pair = threadIdx.x; pair < HPC * ROW_LANES; pair += THREADS) {
            const int g = pair / ROW_LANES, x = pair % ROW_LANES;
            const int head = qo_head0 + g;
            [[maybe_unused]] float d_all = 0.0f; /* (unused without softmax) */
            float o[VEC];
#pragma unroll
            for (int i = 0; i < VEC; i++)
                o[i] = 0.0f;
#if VARIANT_USE_SOFTMAX
            float m_all = -CINFER_INF;
            for (int r = 0; r < ROWS; r++)
                m_all = fmaxf(m_all, smem_md[r][g][0]);
#if VARIANT_STATE_INIT
            float m_init = -CINFER_INF, d_init = 0.0f;
            if (first_chunk)
                variant_state_init(&vp, b, qo_pos, head, &m_init, &d_init);
            m_all = fmaxf(m_all, m_init);
#endif
            if (m_all != -CINFER_INF) {
                for (int r = 0; r < ROWS; r++) {
                    const float scale = exp2f(smem_md[r][g][0] - m_all);
                    d_all += scale * smem_md[r][g][1];
#pragma unroll
                    for (int i = 0; i < VEC; i++)
                        o[i] = fmaf(scale, smem_acc[r][g][x * VEC + i], o[i]);
                }
#if VARIANT_STATE_INIT
                if (m_init != -CINFER_INF)
                    d_all += exp2f(m_init - m_all) * d_init;
#endif
                    /* An initial state may leave the denominator 0 (nothing else can). */
#if VARIANT_STATE_INIT
                const float inv = d_all > 0.0f ? p.v_scale / d_all : 0.0f;
#else
                const float inv = p.v_scale / d_all;
#endif
#pragma unroll
                for (int i = 0; i < VEC; i++)
                    o[i] *= inv;
            }
            /* log2(sum exp(s)) = m + log2(d) in base-2 units; an empty state is (0, -inf). */
#if VARIANT_STATE_INIT
            const float lse =
                m_all == -CINFER_INF || d_all <= 0.0f ? -CINFER_INF : m_all + log2f(d_all);
#else
            const float lse = m_all == -CINFER_INF ? -CINFER_INF : m_all + log2f(d_all);
#endif
#else
            /* No softmax: the rows' weighted sums add up; there is no LSE (the host passes none
             * and never splits). */
            for (int r = 0; r < ROWS; r++)
#pragma unroll
                for (int i = 0; i < VEC; i++)
                    o[i] += smem_acc[r][g][x * VEC + i];
#pragma unroll
            for (int i = 0; i < VEC; i++)
                o[i] *= p.v_scale;
            const float lse = -CINFER_INF;
            (void)d_all;
#endif
            if (item.partial < 0) {
#if VARIANT_OUTPUT_TRANSFORM
#pragma unroll
                for (int i = 0; i < VEC; i++)
                    o[i] = variant_output_transform(&vp, o[i], b, qo_pos, head, x * VEC + i);
#endif
                cinfer_half_bits *out = (cinfer_half_bits *)p.out + b * p.out_stride_n +
                                        (long long)head * p.out_stride_h + x * VEC;
                *(uint4 *)out = cinfer_pack8(CINFER_DTYPE_O, o);
                if (p.lse && x == 0)
                    p.lse[b * p.lse_stride_n + (long long)head * p.lse_stride_h] = lse;
            } else {
                const long long slot_head = (long long)item.partial * HPC + g;
                float *po = p.partial_o + slot_head * D + x * VEC;
                *(float4 *)po = make_float4(o[0], o[1], o[2], o[3]);
                *(float4 *)(po + 4) = make_float4(o[4], o[5], o[6], o[7]);
                if (x == 0)
                    p.partial_lse[slot_head] = lse;
            }
        }
        /* The shared buffers are reused by the next work item. */
        __syncthreads();
    }
}

#elif defined(CINFER_OP_DECODE_MERGE)

/*
 * Folds each split request's partial states into out/lse: MW = header->merge_warps (1, 2 or 4,
 * chosen by the plan: more when requests have many chunks) warps per (request, query head). The
 * MW warps' 32 / TX lane groups each take every (MW * 32 / TX)-th chunk, MERGE_UNROLL chunks per
 * step with their loads issued together (the partials come from L2 and a chunk-by-chunk loop would
 * wait one L2 round trip per chunk: 11.5 us for one 8k request's 32 chunks on the H200, more
 * than the attention kernel), each group keeping an online (max, weight sum, weighted output)
 * state; the groups' states are combined with shuffles, then the warps' through shared memory.
 * The warps of requests that were not split, or beyond the planned batch, exit (uniformly per
 * (request, head), so the named barrier of a pair's warps is never left waiting).
 */
#define MERGE_UNROLL 4
#if WARPS % 4 != 0
#error "decode merge: a block's warps must split into pairs of 1, 2 or 4 warps (header.merge_warps)"
#endif
extern "C" __global__ void __launch_bounds__(THREADS)
    CINFER_KERNEL_NAME(const cinfer_decode_params p) {
    __shared__ float sm_state[WARPS][TX][2 + VEC]; /* (m, w, o[VEC]) of warps 1.. of a pair */
    const int lane = threadIdx.x % 32, tx = lane % TX, group0 = lane / TX;
    const bool uniform = p.uniform.pieces > 0; /* no schedule in the workspace then */
    const int mw_plan = uniform ? p.uniform.merge_warps : p.header->merge_warps;
    const int mw = mw_plan == 2 || mw_plan == 4 ? mw_plan : 1;
    const int warp = threadIdx.x / 32, sub = warp % mw;
    const long long pair = (long long)blockIdx.x * (WARPS / mw) + warp / mw;
    const int batch = uniform ? 1 : p.header->batch_size;
    /* A block that leaves still waits for the attention grid first (cinfer_pdl_wait), so this
     * grid never completes before the grid it depends on: stream order then carries the
     * attention kernel's directly written rows (requests that were not split) to whatever the
     * caller launches next, even when no block of this grid has anything to merge. */
    if (pair >= (long long)batch * p.num_qo_heads) {
        cinfer_pdl_wait();
        return;
    }
    const int b = (int)(pair / p.num_qo_heads), head = (int)(pair % p.num_qo_heads);
    const int group = p.num_qo_heads / p.num_kv_heads, hpc = p.heads_per_cta;
    const int kv_head = head / group, in_group = head % group;
    const int slice = kv_head * (group / hpc) + in_group / hpc, g = in_group % hpc;
    /* Decode: one entry per (request, head slice), slots partial_base + c; batch prefill's rows:
     * one per row, slots partial_base + slice * num_chunks + c (kernels/decode_params.h). */
    const cinfer_decode_request req =
        p.slice_infos ? cinfer_decode_slice_request(p, b, slice, group / hpc) : p.requests[b];
    if (req.num_chunks <= 1) {
        cinfer_pdl_wait();
        return;
    }
    const long long slot0 =
        req.partial_base + (p.slice_infos ? 0 : (long long)slice * req.num_chunks);
    /* The schedule above was in place before the attention kernel started; its partial states
     * are not until it has finished (the host may launch this kernel as its programmatic
     * dependent). */
    cinfer_pdl_wait();
    /* Lanes past the row (D not a power of two times 8) read element 0 and write nothing. */
    const int x = tx < ROW_LANES ? tx : 0;
    const int groups = mw * TY;

    float m = -CINFER_INF, w = 0.0f, o[VEC];
#pragma unroll
    for (int i = 0; i < VEC; i++)
        o[i] = 0.0f;
    for (int c0 = sub * TY + group0; c0 < req.num_chunks; c0 += groups * MERGE_UNROLL) {
        float lse[MERGE_UNROLL];
        float4 lo[MERGE_UNROLL], hi[MERGE_UNROLL];
#pragma unroll
        for (int u = 0; u < MERGE_UNROLL; u++) {
            const int c = c0 + u * groups;
            lse[u] = -CINFER_INF;
            lo[u] = hi[u] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (c < req.num_chunks) {
                const long long slot_head = (slot0 + c) * hpc + g;
                const float *po = p.partial_o + slot_head * D + x * VEC;
                lse[u] = p.partial_lse[slot_head];
                lo[u] = *(const float4 *)po;
                hi[u] = *(const float4 *)(po + 4);
            }
        }
        float m_new = m;
#pragma unroll
        for (int u = 0; u < MERGE_UNROLL; u++)
            m_new = fmaxf(m_new, lse[u]);
        /* Nothing kept yet: subtract 0, so every exp2 is of -inf and gives 0. */
        const float m_use = m_new == -CINFER_INF ? 0.0f : m_new;
        const float scale = exp2f(m - m_use);
        w *= scale;
#pragma unroll
        for (int i = 0; i < VEC; i++)
            o[i] *= scale;
#pragma unroll
        for (int u = 0; u < MERGE_UNROLL; u++) {
            const float wu = exp2f(lse[u] - m_use);
            w += wu;
            o[0] = fmaf(wu, lo[u].x, o[0]);
            o[1] = fmaf(wu, lo[u].y, o[1]);
            o[2] = fmaf(wu, lo[u].z, o[2]);
            o[3] = fmaf(wu, lo[u].w, o[3]);
            o[4] = fmaf(wu, hi[u].x, o[4]);
            o[5] = fmaf(wu, hi[u].y, o[5]);
            o[6] = fmaf(wu, hi[u].z, o[6]);
            o[7] = fmaf(wu, hi[u].w, o[7]);
        }
        m = m_new;
    }
    /* Combine the TY groups: lanes tx, tx + TX, ... hold the same elements. */
#pragma unroll
    for (int off = TX; off < 32; off *= 2) {
        const float m_o = __shfl_xor_sync(0xffffffffu, m, off);
        const float w_o = __shfl_xor_sync(0xffffffffu, w, off);
        const float m_new = fmaxf(m, m_o);
        const float m_use = m_new == -CINFER_INF ? 0.0f : m_new;
        const float s_self = exp2f(m - m_use), s_o = exp2f(m_o - m_use);
        w = w * s_self + w_o * s_o;
#pragma unroll
        for (int i = 0; i < VEC; i++) {
            const float o_o = __shfl_xor_sync(0xffffffffu, o[i], off);
            o[i] = o[i] * s_self + o_o * s_o;
        }
        m = m_new;
    }
    if (mw > 1) {
        /* Warps 1.. of the pair leave their states (group 0's lanes hold them) in shared memory;
         * warp 0 folds them in after the pair's barrier (id 1 + pair slot; 0 is __syncthreads). */
        if (sub != 0 && group0 == 0) {
            float *st = sm_state[warp][tx];
            st[0] = m;
            st[1] = w;
#pragma unroll
            for (int i = 0; i < VEC; i++)
                st[2 + i] = o[i];
        }
        cinfer_bar_sync(1 + warp / mw, mw * 32);
        if (sub != 0)
            return;
        for (int k = 1; k < mw; k++) {
            const float *st = sm_state[warp + k][tx];
            const float m_o = st[0];
            const float m_new = fmaxf(m, m_o);
            const float m_use = m_new == -CINFER_INF ? 0.0f : m_new;
            const float s_self = exp2f(m - m_use), s_o = exp2f(m_o - m_use);
            w = w * s_self + st[1] * s_o;
#pragma unroll
            for (int i = 0; i < VEC; i++)
                o[i] = o[i] * s_self + st[2 + i] * s_o;
            m = m_new;
        }
    }
    if (group0 != 0 || tx >= ROW_LANES)
        return;
    if (m != -CINFER_INF) {
        const float inv = 1.0f / w;
#pragma unroll
        for (int i = 0; i < VEC; i++)
            o[i] *= inv;
    }
    cinfer_half_bits *out = (cinfer_half_bits *)p.out + b * p.out_stride_n +
                            (long long)head * p.out_stride_h + tx * VEC;
    *(uint4 *)out = cinfer_pack8(CINFER_DTYPE_O, o);
    if (p.lse && tx == 0)
        p.lse[b * p.lse_stride_n + (long long)head * p.lse_stride_h] =
            m == -CINFER_INF ? -CINFER_INF : m + log2f(w);
}

#endif
