/*
 * Merging attention states (v, lse base 2): merge_state, merge_state_in_place, merge_states.
 *
 * A group of CINFER_MERGE_TPR threads handles one (row, head): each thread owns VEC consecutive
 * elements of the head dim per step (16-byte accesses when D is a multiple of 8). States are
 * folded with weights 2^(lse_k - max_k lse_k), so no exp overflows and empty states (lse = -inf)
 * weigh exactly 0. A row whose states are all empty is written as (0, -inf).
 *
 * Prelude: CINFER_DTYPE_O (value dtype), CINFER_HEAD_DIM_VO (D), CINFER_VEC (8 when every value
 * row is 16-byte aligned, else 1), one of CINFER_OP_MERGE_*.
 */
#include "common.cuh"
#include "merge_params.h"

#define D     CINFER_HEAD_DIM_VO
#define VEC   CINFER_VEC
#define TPR   CINFER_MERGE_TPR(D, VEC)
#define BLOCK CINFER_MERGE_BLOCK

#if defined(CINFER_OP_MERGE_STATES)
#define STATE_TENSOR(k) 0
#define STATE_INDEX(k)  (k)
#else
#define STATE_TENSOR(k) (k)
#define STATE_INDEX(k)  0
#endif

__device__ __forceinline__ const cinfer_half_bits *state_values(const cinfer_merge_params &p, int k,
                                                                long long row, int head) {
    const int t = STATE_TENSOR(k);
    return (const cinfer_half_bits *)p.v_in[t] + row * p.v_in_stride[t][0] +
           (long long)STATE_INDEX(k) * p.v_in_stride[t][1] + (long long)head * p.v_in_stride[t][2];
}

__device__ __forceinline__ float state_lse(const cinfer_merge_params &p, int k, long long row,
                                           int head) {
    const int t = STATE_TENSOR(k);
    return p
        .lse_in[t][row * p.lse_in_stride[t][0] + (long long)STATE_INDEX(k) * p.lse_in_stride[t][1] +
                   (long long)head * p.lse_in_stride[t][2]];
}

extern "C" __global__ void __launch_bounds__(BLOCK)
    CINFER_KERNEL_NAME(const cinfer_merge_params p) {
    const int group = threadIdx.x / TPR, lane = threadIdx.x % TPR;
    const long long pair = (long long)blockIdx.x * (BLOCK / TPR) + group;
    if (pair >= p.num_rows * p.num_heads)
        return;
    const long long row = pair / p.num_heads;
    const int head = (int)(pair % p.num_heads);
#if defined(CINFER_OP_MERGE_STATE_IN_PLACE)
    if (p.mask && !p.mask[row])
        return;
#endif
#if defined(CINFER_OP_MERGE_STATES)
    const int num_states = p.num_states;
#else
    const int num_states = 2;
#endif

    float max_lse = -CINFER_INF;
    for (int k = 0; k < num_states; k++)
        max_lse = fmaxf(max_lse, state_lse(p, k, row, head));
    cinfer_half_bits *out =
        (cinfer_half_bits *)p.v_out + row * p.v_out_stride[0] + (long long)head * p.v_out_stride[1];
    float denom = 0.0f;

    for (int d0 = lane * VEC; d0 < D; d0 += TPR * VEC) {
        float acc[VEC];
#pragma unroll
        for (int i = 0; i < VEC; i++)
            acc[i] = 0.0f;
        denom = 0.0f;
        if (max_lse != -CINFER_INF) {
            for (int k = 0; k < num_states; k++) {
                /* An empty state contributes nothing, whatever its values hold. */
                const float lse_k = state_lse(p, k, row, head);
                if (lse_k == -CINFER_INF)
                    continue;
                const float w = exp2f(lse_k - max_lse);
                denom += w;
                const cinfer_half_bits *v = state_values(p, k, row, head) + d0;
                float x[VEC];
#if VEC == 8
                cinfer_unpack8(x, CINFER_DTYPE_O, *(const uint4 *)v);
#else
                x[0] = cinfer_half_to_f32(CINFER_DTYPE_O, v[0]);
#endif
#pragma unroll
                for (int i = 0; i < VEC; i++)
                    acc[i] += w * x[i];
            }
            const float inv = 1.0f / denom;
#pragma unroll
            for (int i = 0; i < VEC; i++)
                acc[i] *= inv;
        }
#if VEC == 8
        *(uint4 *)(out + d0) = cinfer_pack8(CINFER_DTYPE_O, acc);
#else
        out[d0] = cinfer_f32_to_half(CINFER_DTYPE_O, acc[0]);
#endif
    }

    /* The outputs may alias the inputs (in place): every lane of the group must have read the
     * input lse values before lane 0 overwrites them. A group never spans two warps. */
    const unsigned group_mask =
        TPR == 32 ? 0xffffffffu : (((1u << TPR) - 1u) << ((threadIdx.x % 32) / TPR * TPR));
    __syncwarp(group_mask);
    if (lane == 0 && p.lse_out) {
        /* Lane 0 always runs the loop above, so denom holds the sum of weights (>= 1: the state
         * with the largest lse weighs 1). With no non-empty state, log2(1) keeps lse at -inf. */
        if (max_lse == -CINFER_INF)
            denom = 1.0f;
        p.lse_out[row * p.lse_out_stride[0] + (long long)head * p.lse_out_stride[1]] =
            max_lse + log2f(denom);
    }
}
