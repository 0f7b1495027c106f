/*
 * Prefill on Hopper's warpgroup tensor cores (the sm90 backend, FlashAttention-3's scheme: wgmma,
 * TMA, mbarriers; sm_90a only). kernels/prefill.cu includes this file in place of its sm80 body
 * when the spec's backend is sm90 (CINFER_BACKEND 2); the parameters, the grid's items (and their
 * order, but for non-causal single prefill: ITEM_SETUP), the work list of batch kernels (split-KV
 * partial states, GQA packing) and what is computed are the same (kernels/prefill_params.h), for
 * the specs spec.c's validate_prefill lets through:
 * 16-bit q = out, K/V of that dtype or fp8 (e4m3, e5m2: converted to fp16 in shared memory, KV_FP8
 * below; not at 192 / 128), D = 64, 128 or 256 (or D_qk / D_vo = 192 / 128: Q and K in three column
 * blocks, V and O in two; DeepSeek's prefill heads), no mask or causal, soft cap, sliding window,
 * default attention or a variant of ALiBi slopes, a mask in row form (custom_mask) and state inits
 * (no RoPE); single prefill, or batch over a ragged K/V or a paged cache whose pages hold a power
 * of two of 8..256 rows (the host checks the page size).
 *
 * An item (a grid item of prefill_params.h) is TILE_Q = 64 x CONSUMERS query rows of one query
 * head, or with GQA packing TILE_Q / G tokens of G query heads: what one CTA of the sm80 kernel
 * computes. The grid is persistent: at most one CTA per SM (the host launches min(items, SMs)),
 * CTA b of G taking items b, 2G - 1 - b, 2G + b, ... (item_index), so that the copies of an item's
 * Q and first KV tiles go out while the previous one's last tiles are computed, and a new item
 * costs no CTA launch, barrier set-up or pipeline fill. The stage ring, the Q tile and the groups'
 * turns run on from one item to the next (counters of tiles and items, not of the item's own).
 * A CTA's warps:
 *   consumers  CONSUMERS warpgroups (warps 0..4 CONSUMERS - 1), 64 rows each;
 *   producer   one warpgroup after them, whose first warp issues every copy: an item's Q tile
 *              (once every consumer thread is done with its last Q K^T of the previous item that
 *              had KV tiles: "q_empty"; an item without any gets no copies), then each KV tile's
 *              K and V into a ring of STAGES stages, as TMA boxes of 64 columns x rows x 1 head
 *              (the tensor maps of prefill_params.h, built by the host): one box of TILE_KV rows,
 *              or with a paged cache one per page of the tile (a lane each, from the page table)
 *              or a TILE_KV-row part of a longer page (a tile of consecutive pages: one box).
 *              The item's tiles go first to last, or last to first with an ALiBi bias
 *              at D = 128 and 256 (REVERSE_KV). A stage's "full" mbarrier counts the bytes
 *              in; its "empty" one counts the consumer threads out, and the producer waits for
 *              that before it copies the tile STAGES ahead there. With 2 stages (D = 256) K and V
 *              have a pair each (KV_APART), so that K is released once Q K^T has read it, a
 *              softmax and a P V before V (FlashAttention-3's K and V pipelines): with one pair,
 *              a stage freed by group 1's last P V was the one group 0 wanted next, and each
 *              tile's copies waited in full (H200, D = 256, 16k: 493 -> 675 TFLOP/s causal). With
 *              3 stages (D = 64, 128) the one pair per stage is 2% faster (bench/RESULTS.md,
 *              developers' session 23). A batch tile that reaches past its request's KV (rows of
 *              another request, rows of a page past kv_len, or pages not copied) gets those V
 *              rows zeroed by the producer before its V is marked full: P is 0 there, but 0 x
 *              NaN would not be. With fp8 K/V (KV_FP8 below) the boxes are 64 x 2 x rows, the
 *              copies complete on "landed" barriers, and the warpgroup's other three warps
 *              convert each landed tile in place (zeroing those rows) and then mark it full.
 * Each consumer warpgroup, for KV tile t:
 *   S_t = Q K_t^T   wgmma m64nTILE_KVk16, A (its 64 rows of Q) and B (K_t) from shared memory;
 *   O += P_{t-1} V_{t-1}  (m64nDk16) issued right after, A = P_{t-1} in registers, B = V_{t-1} read
 *                   transposed from shared memory (its rows are K of this product);
 *   softmax of S_t  base-2 logits (q_scale includes log2(e); a soft cap first makes them element
 *                   by element; an ALiBi bias is in S from the start, S's accumulators set to it
 *                   before S = bias + Q K^T; a custom mask's bits then drop some), the
 *                   running row maximum over the quad's lanes, P_t = exp2(s - m) in place, row
 *                   sums per lane; then O is rescaled once its product landed (at D = 128 and
 *                   256 only if some row's maximum grew past a slack: LAZY_RESCALE), and P_t
 *                   packed to 16-bit A registers for the next iteration. The source waits for P V
 *                   after the softmax, but ptxas (NVRTC 13.0) puts a wgmma wait at the top of its
 *                   basic block (after the edge mask's branch here), so a group's softmax does not
 *                   overlap its own P V (FlashAttention-3's intra-warpgroup overlap is not had;
 *                   FlashAttention-3's order, O rescaled before the next P V is issued, moves
 *                   nothing, and a branch before the wait makes ptxas serialize the wgmmas).
 * With two consumer warpgroups, they take turns to issue their tensor-core work (named barriers 1
 * and 2), so that one's softmax runs while the other's products do (FlashAttention-3's ping-pong);
 * with a soft cap, also at the softmax itself (3 and 4, SOFTMAX_TURNS below).
 *
 * Masking: positions at or past kv_len and, causal, past the row's own position (rows bottom-right
 * aligned: query token i is at i + kv_len - qo_len) get -inf; a row that keeps nothing ends with
 * output 0 and LSE -inf. A causal CTA visits only the KV tiles up to its last row's position, a
 * split one only its chunk's. GQA packing (batch): tile row r is query token q0 + r / G of head
 * kv_head G + r % G, copied as one box of (64 columns, G heads, TILE_Q / G tokens).
 *
 * Shared memory (dynamic, aligned up to 1024 bytes for the swizzle): the Q tile as D / 64 blocks of
 * TILE_Q rows x 128 bytes, then STAGES stages of K and V, each D / 64 blocks of TILE_KV rows x 128
 * bytes (kernels/wgmma.cuh gives the layout). D = 128, TILE_Q = 128, TILE_KV = 128, 3 stages (the
 * default): 224 KiB + 1 KiB, one CTA per SM; at D = 64 the same tiles take 112 KiB + 1 KiB; at D =
 * 256 (O in 128 registers per thread) TILE_KV = 64 in 2 stages, 192 KiB + 1 KiB; at 192 / 128
 * TILE_KV = 128 in 2 stages (K 48 KiB and V 32 KiB a stage), 208 KiB + 1 KiB. H200, 16k, causal /
 * non-causal, bench_prefill --head-dim 192 --tile (developers' session 39): 128-row KV tiles in 2
 * stages 730 / 657 TFLOP/s, 64-row ones in 3 stages 645 / 589, in 2 stages 650 / 637.
 */
/* fp8 K/V (e4m3, e5m2; D = D_VO): both products run in fp16 (see KV_FP8 below). */
#define KV_FP8 (CINFER_DTYPE_KV == CINFER_DT_E4M3 || CINFER_DTYPE_KV == CINFER_DT_E5M2)
#if KV_FP8
#define CINFER_WGMMA_F16 1
#endif
#include "wgmma.cuh"

#define D              CINFER_HEAD_DIM_QK            /* Q's and K's head dim */
#define D_VO           CINFER_HEAD_DIM_VO            /* V's and O's: D, or 128 at D = 192 */
#define DT             CINFER_DTYPE_Q                /* q's and out's */
#define MMA_DT         (KV_FP8 ? CINFER_DT_F16 : DT) /* the products' inputs (P's too) */
#define TILE_Q         CINFER_TILE_Q
#define TILE_KV        CINFER_TILE_KV
#define STAGES         CINFER_STAGES
#define CONSUMERS      (TILE_Q / 64)
#define THREADS        (CONSUMERS * 128 + 128) /* and the producer warpgroup */
#define CAUSAL         (CINFER_MASK == 1)
#define DBLOCKS        (D / 64)    /* column blocks of Q and K */
#define VBLOCKS        (D_VO / 64) /* of V */
#define Q_BLOCK_BYTES  (TILE_Q * 128)
#define Q_BYTES        (DBLOCKS * Q_BLOCK_BYTES) /* one Q tile */
#define KV_BLOCK_BYTES (TILE_KV * 128)
#define K_TILE_BYTES   (DBLOCKS * KV_BLOCK_BYTES) /* a stage's K, then its V */
#define V_TILE_BYTES   (VBLOCKS * KV_BLOCK_BYTES)
/* Where row r, columns 64 b .. 64 b + 63 of a K or V tile lie: in the 8-row group of 128-byte
 * rows at (r / 8) KV_GROUP_BYTES + b KV_BLOCK_STRIDE, row r % 8 of it. A paged batch kernel at
 * D = 128 or 256 interleaves the column blocks by group (KV_INTERLEAVED: group 0 of every block,
 * then group 1 of each), so that one TMA box copies every column block of a page (a 5-d map,
 * kernels/prefill_params.h) where one box per 64 columns did: the TMA unit's cost goes with the
 * boxes (bench/RESULTS.md, developers' sessions 24, 35 and 36). Other kernels keep each column
 * block's rows together (TILE_KV rows x 128 bytes a block). */
#define KV_INTERLEAVED                                                                             \
    (CINFER_BATCH && CINFER_PAGED && (D == 128 || D == 256) && D_VO == D && !KV_FP8)
#if KV_INTERLEAVED
#define KV_GROUP_BYTES  (DBLOCKS * 1024)
#define KV_BLOCK_STRIDE 1024
/* kv_fold of the tensor maps (a value: the address of a parameter would put it in local memory) */
#define KV_FOLD make_int4(tma.kv_fold[0], tma.kv_fold[1], tma.kv_fold[2], 0)
/* 16-byte chunk c (8 a row) of column block b */
#define KV_CHUNK_OFFSET(c, b) ((c) / 64 * KV_GROUP_BYTES + (b)*KV_BLOCK_STRIDE + (c) % 64 * 16)
#if TILE_KV / 8 * DBLOCKS != 32
#error "KV_INTERLEAVED: a warp's lane per 8-row group and column block of a tile"
#endif
#else
#define KV_GROUP_BYTES        1024
#define KV_BLOCK_STRIDE       KV_BLOCK_BYTES
#define KV_CHUNK_OFFSET(c, b) ((b)*KV_BLOCK_BYTES + (c)*16)
#define KV_FOLD               make_int4(0, 0, 0, 0)
#endif
#define STAGE_BYTES (K_TILE_BYTES + V_TILE_BYTES)
/*
 * fp8 K/V (KV_FP8): the stages keep the fp16 layout above, and each tile is converted in place.
 * The producer's TMA boxes (64 columns x 2 x rows; the middle dim has one index in the tensor
 * maps, so its second half is out of bounds and comes in as zeros) put a row's 64 fp8 bytes of a
 * column block in the first half of the 128 bytes that the block's fp16 row takes, and the
 * producer warpgroup's other three warps (converters) turn each such row into its fp16 row in
 * place: four lanes a row, all loads before a __syncwarp and the stores after it, so no row is
 * read by one warp and written by another. With an even number of column blocks (FP8_PAIRS: D =
 * 128, 256) the odd blocks' boxes start the middle dim at -1, so that their bytes take the second
 * half of the row: a quarter warp's load of a row of block 2 p and one of block 2 p + 1 then spans
 * all 32 banks (with every row's bytes in the first half, 8 rows' loads took 8 wavefronts for 512
 * bytes).
 * e4m3 comes out exact (F2FP, cinfer_fp8x4_to_f16x2x2 in kernels/dtype.cuh; the host leaves out
 * of this kernel's q_scale and v_scale the 256 it puts into the sm80 template's), e5m2 exactly too
 * (byte permutes). Rows past the request's
 * K/V (or not copied) come out zero. Each Q tile is converted in place too, to fp16 of q x
 * q_in_scale (sm_scale, so that a bf16 q beyond fp16's range stays finite; q_scale leaves it out).
 * The converters then arrive at the barriers the consumers wait for (a tile's "full" ones, the Q
 * tile's q_conv), and the TMA copies complete on barriers of their own ("landed"). Both products
 * run in fp16, P too.
 */
#define FP8_PAIRS (KV_FP8 && DBLOCKS % 2 == 0)
/* Arrivals at a full barrier per copy: the converter warps' with fp8 K/V, else the copy's. */
#define CONVERTERS (KV_FP8 ? 3 : 1)
#define PINGPONG   (CONSUMERS == 2)
/* Q tiles in shared memory: two for single prefill at D = 64 on the two-group tile without a soft
 * cap, an ALiBi bias or a mask in row form (where ITEM_OVERLAP, below, runs; the host allocates
 * two at D = 64 for every tile), taken item by item in turn, so that the next item's Q is copied
 * while the current one runs. H200, 16k, 4k, 1k, causal and not (bench/RESULTS.md, developers'
 * sessions 26 and 27): plain and the window +4-7%; the soft cap's and ALiBi's kernels ran 2-3%
 * slower with it, the one-group tile 1-2%, trace batches 1-4%; at D = 128 two Q tiles need 2
 * stages, and those ran 2-6% slower with the overlap than without. */
#define Q_BUFS                                                                                     \
    (D == 64 && PINGPONG && !CINFER_BATCH && !CINFER_SOFTCAP && !VARIANT_ALIBI_SLOPE &&            \
             !MASK_ROWS && !KV_FP8                                                                 \
         ? 2                                                                                       \
         : 1)
/* K and V halves of the stages on barriers of their own (2 stages, D = 256), else one pair per
 * stage (the top of this file); KV_BARS: full (or empty) barriers of the stages. */
#define KV_APART (STAGES == 2)
#define KV_BARS  (KV_APART ? 2 * STAGES : STAGES)
/* O's accumulators per consumer thread (64 rows x D_VO of its warpgroup) and its n8 column blocks;
 * the same for S (64 rows x TILE_KV). */
#define O_REGS (D_VO / 2)
#define O_COLS (D_VO / 8)
#define S_REGS (TILE_KV / 2)
#define S_COLS (TILE_KV / 8)
/* GQA packing: PACK query heads of each token in the tile's rows (1: none). */
#if CINFER_GQA_PACK > 0
#define PACK      CINFER_GQA_PACK
#define CTA_HEADS num_kv_heads
#else
#define PACK      1
#define CTA_HEADS num_qo_heads
#endif

#if KV_FP8 && D != D_VO
#error "the sm90 prefill kernel takes fp8 K/V with D = D_VO"
#endif
#if !((D == D_VO && (D == 64 || D == 128 || D == 256)) || (D == 192 && D_VO == 128)) ||            \
    (TILE_KV != 64 && TILE_KV != 128) || (CONSUMERS != 1 && CONSUMERS != 2) || TILE_Q % PACK != 0
#error                                                                                             \
    "the sm90 prefill kernel takes D = D_VO = 64, 128 or 256, or 192 / 128, TILE_KV = 64 or 128, TILE_Q = 64 or 128"
#endif
/* A mask in its row form (VARIANT_LOGITS_MASK_ROW, e.g. the custom_mask variant): each consumer
 * lane reads its two rows' bit words of a KV tile from global memory one tile ahead (load_mask),
 * into registers; there is no room left in shared memory for slots of them. */
#define MASK_ROWS (VARIANT_LOGITS_MASK_ROW && CINFER_VARIANT_NO_TRANSFORM)
#if VARIANT_QUERY_TRANSFORM || VARIANT_LOGITS_TRANSFORM || VARIANT_OUTPUT_TRANSFORM ||             \
    (VARIANT_LOGITS_MASK && !MASK_ROWS) || !VARIANT_USE_SOFTMAX || CINFER_POS
#error "the sm90 prefill kernel takes variants of ALiBi slopes, masks in row form and state inits"
#endif
#if CINFER_SOFTCAP && CINFER_VARIANT_LOGITS
#error "the sm90 prefill kernel takes a soft cap with default attention only"
#endif

/* Logits computed element by element before the softmax (prepare_logits): with a soft cap; else
 * the softmax folds the scale in and only tiles at a mask's edge are masked (mask_tile). A
 * variant's ALiBi slope (ALIBI_ACC) starts S's accumulators at the bias (set_bias, in units of
 * q . k), so that S = bias + Q K^T comes out of the tensor cores and the softmax takes it as plain
 * attention's. */
#define PREPARE   CINFER_SOFTCAP
#define ALIBI_ACC VARIANT_ALIBI_SLOPE
/* The soft cap leaves t = tanh(q . k q_scale) in S (tanh.approx, kernels/soft_cap.cuh), and the
 * softmax takes the base-2 logit cap2 t shifted by -cap2 (scale cap2, shift -cap2; the LSE adds
 * cap2 back), which lies in [-2 cap2, 0]. As on the sm80 template (SOFTCAP_FIXED_MAX there), a
 * cap whose logits fit the window of p.soft_cap_fixed is softmaxed against the fixed maximum
 * p.soft_cap_max: no row maximum, no shuffles, no rescaling of O. */

/* Softmax turns: with two consumer warpgroups and a soft cap (or at D = 64), the groups also take
 * turns at the logits and softmax (named barriers 3 and 4, group 0 first), as they do at the
 * tensor cores. A soft cap's softmax needs as much MUFU time as the tile's products need of the
 * tensor cores (two operations per logit against 2 x 128 multiply-adds; at D = 64 one against 2 x
 * 64), and left to themselves the groups drift into running their softmaxes together (sharing the
 * MUFU pipe, with the tensor cores idle while both wait for theirs; a clock trace,
 * bench/RESULTS.md, session 18) rather than one group's beside the other's products. Without a
 * soft cap ptxas moves the turn's pass above the exp2s, so the turn holds the mask and the row
 * maximum only; H200, D = 64, 16k (bench/RESULTS.md, developers' session 22): plain +1-2%, ALiBi
 * +4%; a pass kept after the exp2s lost 5-9%, and custom masks (MASK_ROWS, not taken) 3%. */
#define SOFTMAX_TURNS (PINGPONG && (PREPARE || (D == 64 && !MASK_ROWS)))
#if SOFTMAX_TURNS
/* Before the softmax of the CTA's first tile or a later one; group 0's first goes first.
 * turn_q_scale is q_scale (the tanh's; without a soft cap the softmax's scale) plus a 0 read from
 * shared memory after the wait: the logits' work depends on that load, which ptxas keeps after the
 * barrier (without it, ptxas moves the tanh burst above). */
#if PREPARE
#define TURN_SCALE p.q_scale
#else
#define TURN_SCALE scale
#endif
#define SOFTMAX_TURN_WAIT(first)                                                                   \
    do {                                                                                           \
        if (!((first) && wg == 0))                                                                 \
            cinfer_bar_sync(3 + wg, 256);                                                          \
        turn_q_scale = TURN_SCALE + cinfer_ld_shared_f32(cinfer_smem_addr(&zero));                 \
    } while (0)
/* After it: the other group's turn (group 1's last one of the CTA is taken at its end). */
#define SOFTMAX_TURN_PASS() cinfer_bar_arrive(4 - wg, 256)
#else
#define SOFTMAX_TURN_WAIT(first) ((void)0)
#define SOFTMAX_TURN_PASS()      ((void)0)
#endif

/* Registers per thread of the producer warpgroup and of each consumer one after setmaxnreg (a
 * multiple of 8). setmaxnreg moves registers within what the CTA got at launch: with
 * __launch_bounds__(THREADS, 1), 168 a thread (64 Ki / 384, rounded down to 8), so PRODUCER_REGS +
 * 2 x CONSUMER_REGS may not pass 3 x 168 = 504. With more, the consumers' setmaxnreg.inc waits
 * forever (a hang, not an error: developers' session 41), so the check below refuses it. With one
 * consumer, 256 threads get 255 registers each at launch and nothing moves. */
#if KV_FP8
/* the converters' conversions of two quads in flight and their lane constants, with no local
 * memory: the consumers' code uses fewer than 210 */
#define PRODUCER_REGS 56
#define CONSUMER_REGS 224
#else
#define PRODUCER_REGS 40
#define CONSUMER_REGS 232
#endif
#if CONSUMERS == 2 && PRODUCER_REGS + 2 * CONSUMER_REGS > 3 * (65536 / THREADS / 8 * 8)
#error "setmaxnreg: PRODUCER_REGS + 2 x CONSUMER_REGS exceed the CTA's registers at launch"
#endif

/* S of KV tile kv0 with -inf where a position is at or past kv_len, (causal) past the position of
 * the lane's row (pos[0] for its first row, pos[1] for its second, 8 rows on), or (window) before
 * that position less window_left. */
__device__ __forceinline__ void mask_tile(float *s, int kv0, int kv_len, int window_left,
                                          const int *pos, int lane) {
#pragma unroll
    for (int j = 0; j < S_COLS; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int col = kv0 + 8 * j + 2 * (lane % 4) + (e & 1);
            bool drop = col >= kv_len;
#if CAUSAL
            drop = drop || col > pos[e >> 1];
#endif
#if CINFER_WINDOW
            drop = drop || col < pos[e >> 1] - window_left;
#endif
            if (drop)
                s[4 * j + e] = -CINFER_INF;
        }
}

/* S of a KV tile as the soft cap's tanh (PREPARE), element by element: tanh(q . k q_scale). The
 * masks are mask_tile's, on the tiles at an edge only, as for plain attention. */
__device__ __forceinline__ void prepare_logits(float *s, float q_scale) {
#pragma unroll
    for (int k = 0; k < S_REGS; k++)
        s[k] = cinfer_tanh_approx(s[k] * q_scale);
}

#if MASK_ROWS
/* The aligned words of a KV tile's mask bits for the lane's two rows: words[h] + kv0 / 32 holds
 * the bit of position kv0 at bit shift[h] (kv0 is a multiple of TILE_KV, so the shift is the
 * row's), and the tile's TILE_KV bits span MASK_RAW_WORDS words. Words past the one of the tile's
 * last position below kv_len are not read (0: those positions are masked as past kv_len). */
#define MASK_RAW_WORDS (TILE_KV / 32 + 1)
__device__ __forceinline__ void load_mask(uint32_t (*raw)[MASK_RAW_WORDS],
                                          const uint32_t *const *words, const int *shift, int kv0,
                                          int kv_len) {
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int last = (shift[h] + CINFER_MIN(TILE_KV, kv_len - kv0) - 1) >> 5;
        const uint32_t *src = words[h] + kv0 / 32;
#pragma unroll
        for (int k = 0; k < MASK_RAW_WORDS; k++)
            raw[h][k] = k <= last ? __ldg(src + k) : 0u;
    }
}

/* The next tile's words become the current one's. */
__device__ __forceinline__ void next_mask_in(uint32_t (*raw)[MASK_RAW_WORDS],
                                             const uint32_t (*next)[MASK_RAW_WORDS]) {
#pragma unroll
    for (int h = 0; h < 2; h++)
#pragma unroll
        for (int k = 0; k < MASK_RAW_WORDS; k++)
            raw[h][k] = next[h][k];
}

/* S with -inf where the mask's bit is clear, unless the warp's rows keep every position. The
 * lane's column 8 jj + 2 (lane % 4) + e is bit 8 (jj % 4) + e of the tile's word jj / 4 shifted
 * right by 2 (lane % 4): a compile-time bit index per logit. */
__device__ __forceinline__ void apply_mask(float *s, const uint32_t (*raw)[MASK_RAW_WORDS],
                                           const int *shift, int lane) {
    uint32_t bits[2][TILE_KV / 32], all = ~0u;
#pragma unroll
    for (int h = 0; h < 2; h++)
#pragma unroll
        for (int k = 0; k < TILE_KV / 32; k++) {
            bits[h][k] = __funnelshift_r(raw[h][k], raw[h][k + 1], shift[h]);
            all &= bits[h][k];
        }
    if (__all_sync(0xffffffffu, all == ~0u))
        return;
#pragma unroll
    for (int h = 0; h < 2; h++)
#pragma unroll
        for (int j = 0; j < S_COLS; j++) {
            const uint32_t w = bits[h][j / 4] >> (2 * (lane % 4));
#pragma unroll
            for (int e = 0; e < 2; e++)
                if (!((w >> (8 * (j % 4) + e)) & 1u))
                    s[4 * j + 2 * h + e] = -CINFER_INF;
        }
}
#endif

/* P = 2^(s scale + off) in place for the lane's row h (its elements 4 j + 2 h and 4 j + 2 h + 1),
 * and the row's sum over the lane's elements. */
__device__ __forceinline__ float exp2_row(float *s, int h, float scale, float off) {
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < S_COLS; j++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
            const float v = cinfer_fast_exp2(fmaf(s[4 * j + 2 * h + e], scale, off));
            s[4 * j + 2 * h + e] = v;
            sum += v;
        }
    return sum;
}

/*
 * The lazy running maximum (CINFER_LAZY_MAX_SLACK, FlashAttention-4's rescale threshold), with
 * O's rescale skipped (exactly) when no row of the warp has a new maximum: most tiles after a
 * row's first. It pays where O's rescale is long, D / 2 multiplies per thread per tile (H200, 16k
 * causal: D = 256 +12%, D = 128 +3-4%). At D = 64 it lost (non-causal 470 -> 413 TFLOP/s; there
 * the groups take turns at the softmax, SOFTMAX_TURNS, which its compares and vote lengthen;
 * bench/RESULTS.md, developers' session 24).
 */
#define LAZY_RESCALE (D_VO >= 128)
#if LAZY_RESCALE
#define O_RESCALE_WANTED() __any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)
#else
#define O_RESCALE_WANTED() true
#endif

/* The online softmax of the lane's two rows over S (in place: S becomes P = 2^(x - m), the logit
 * x = s scale, or with a soft cap s scale + shift): the row maxima m (base 2, over the quad's
 * lanes; with LAZY_RESCALE a row's stays unless the tile's exceeds it by more than the slack),
 * alpha = 2^(m_old - m_new) for O (1 where m stays), and the per-lane row sums l rescaled
 * and increased. */
__device__ __forceinline__ void softmax_tile(float *s, float *m, float *l, float *alpha,
                                             float scale, [[maybe_unused]] float shift) {
#pragma unroll
    for (int h = 0; h < 2; h++) {
        float mx = -CINFER_INF;
#pragma unroll
        for (int j = 0; j < S_COLS; j++)
            mx = fmaxf(mx, fmaxf(s[4 * j + 2 * h], s[4 * j + 2 * h + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
#if PREPARE
        const float m_new = fmaxf(m[h], fmaf(mx, scale, shift));
#else
        const float m_new = fmaxf(m[h], mx * scale);
#endif
#if LAZY_RESCALE
        const bool grow = m_new > m[h] + CINFER_LAZY_MAX_SLACK;
#else
        const bool grow = true;
#endif
        const float m_keep = grow ? m_new : m[h];
        /* Nothing kept yet: subtract 0, so every exp2 is of -inf and gives 0. */
        const float m_use = m_keep == -CINFER_INF ? 0.0f : m_keep;
#if PREPARE
        const float off = shift - m_use;
#else
        const float off = -m_use;
#endif
        alpha[h] = grow ? cinfer_fast_exp2(m[h] - m_use) : 1.0f;
        m[h] = m_keep;
        l[h] = l[h] * alpha[h] + exp2_row(s, h, scale, off);
    }
}

#if PREPARE
/* softmax_tile against the fixed maximum m of both rows: O is not rescaled. */
__device__ __forceinline__ void softmax_fixed(float *s, float *l, float scale, float shift,
                                              float m) {
#pragma unroll
    for (int h = 0; h < 2; h++)
        l[h] += exp2_row(s, h, scale, shift - m);
}
#define SOFTMAX()                                                                                  \
    do {                                                                                           \
        if (fixed_max)                                                                             \
            softmax_fixed(s, l, scale, shift, m[0]);                                               \
        else                                                                                       \
            softmax_tile(s, m, l, alpha, scale, shift);                                            \
    } while (0)
#elif SOFTMAX_TURNS
#define SOFTMAX() softmax_tile(s, m, l, alpha, turn_q_scale, 0.0f)
#else
#define SOFTMAX() softmax_tile(s, m, l, alpha, scale, 0.0f)
#endif

/* P (the fp32 S registers) as the 16-bit A registers of P V's k16 steps. */
__device__ __forceinline__ void pack_p(const float *s, unsigned (*pa)[4]) {
#pragma unroll
    for (int kk = 0; kk < TILE_KV / 16; kk++)
#pragma unroll
        for (int r = 0; r < 4; r++)
            pa[kk][r] = cinfer_pack_half2(MMA_DT, s[8 * kk + 2 * r], s[8 * kk + 2 * r + 1]);
}

/* S = Q K^T of this warpgroup's 64 rows against the K tile at s_k (ALIBI_ACC: S += Q K^T, S holding
 * the bias). */
__device__ __forceinline__ void issue_qk(float *s, unsigned s_q_rows, unsigned s_k) {
#if KV_INTERLEAVED && D == 256
    /* Formed here, tile by tile: with the interleaved K descriptors ptxas otherwise keeps Q's 16
     * descriptors in 32 registers across the tile loop, and the consumers spill 88 bytes. */
    s_q_rows = cinfer_opaque_u32(s_q_rows);
#endif
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++)
#if TILE_KV == 128
        cinfer_wgmma_ss(
#else
        cinfer_wgmma_ss_n64(
#endif
            s, cinfer_wgmma_desc(s_q_rows + (kk / 4) * Q_BLOCK_BYTES + (kk % 4) * 32, 16, 1024),
            cinfer_wgmma_desc(s_k + (kk / 4) * KV_BLOCK_STRIDE + (kk % 4) * 32, 16, KV_GROUP_BYTES),
            ALIBI_ACC || kk > 0);
    cinfer_wgmma_commit();
}

#if ALIBI_ACC
/* S's accumulators at the ALiBi bias of KV tile kv0 in units of q . k: slope_qk (j - pos) with
 * slope_qk = slope log2(e) / (the softmax's scale); for column 8 jj + e of the lane, an fma with an
 * immediate from the row's base slope_qk (kv0 + 2 (lane % 4) - pos). */
__device__ __forceinline__ void set_bias(float *s, int kv0, const float *slope_qk, const int *pos,
                                         int lane) {
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const float base = slope_qk[h] * (float)(kv0 + 2 * (lane % 4) - pos[h]);
#pragma unroll
        for (int j = 0; j < S_COLS; j++)
#pragma unroll
            for (int e = 0; e < 2; e++)
                s[4 * j + 2 * h + e] = fmaf(slope_qk[h], (float)(8 * j + e), base);
    }
}
#define SET_BIAS(t) set_bias(s, (t)*TILE_KV, slope_qk, pos, lane)
#else
#define SET_BIAS(t) ((void)0)
#endif

/* The KV tile of an item's iteration i (in the scope of ITEM_SETUP). With an ALiBi bias and the
 * lazy rescale the tiles go from the item's last to its first (REVERSE_KV, FlashAttention-2's
 * order): the bias slope (j - pos) is largest at the last tiles, so the running maximum is set by
 * the first tile visited and the later ones seldom raise it past the slack, where in order every
 * tile of a steep slope's head raised it (and O was rescaled on every tile). H200, 16k causal,
 * same run (bench/RESULTS.md, developers' session 25): ALiBi's share of plain at D = 128 92-93%
 * -> 92-95%, at D = 256 86-89% -> 89-94%. D = 64, which rescales on every tile either way, kept
 * the first-to-last order: reversed, it ran 90-92% of plain against 94% before. */
#define REVERSE_KV (ALIBI_ACC && LAZY_RESCALE)
#if REVERSE_KV
#define KV_TILE(i) (tile_begin + num_tiles - 1 - (i))
#else
#define KV_TILE(i) (tile_begin + (i))
#endif

/* O += P V for the V tile at s_v (a k16 step: two 8-row groups). */
#if KV_INTERLEAVED
#define V_DESC(kk, b)                                                                              \
    cinfer_wgmma_desc(s_v + (kk)*2 * KV_GROUP_BYTES + (b)*KV_BLOCK_STRIDE, KV_BLOCK_STRIDE,        \
                      KV_GROUP_BYTES)
#else
#define V_DESC(kk, b)                                                                              \
    cinfer_wgmma_desc(s_v + (b)*KV_BLOCK_BYTES + (kk)*16 * 128, KV_BLOCK_BYTES, 1024)
#endif
__device__ __forceinline__ void issue_pv(float *o, unsigned (*pa)[4], unsigned s_v) {
#pragma unroll
    for (int kk = 0; kk < TILE_KV / 16; kk++)
#if D_VO == 256
    {
        /* two products of 128 columns (two blocks of 64 each), O's registers 0..63 and 64..127 */
        cinfer_wgmma_rs_tb(o, pa[kk], V_DESC(kk, 0));
        cinfer_wgmma_rs_tb(o + 64, pa[kk], V_DESC(kk, 2));
    }
#elif D_VO == 128
        cinfer_wgmma_rs_tb(o, pa[kk], V_DESC(kk, 0));
#else
        cinfer_wgmma_rs_tb_n64(o, pa[kk], V_DESC(kk, 0));
#endif
    cinfer_wgmma_commit();
}
#undef V_DESC
#define PIN_O() cinfer_wgmma_pin_n(o, O_REGS)
#define PIN_S() cinfer_wgmma_pin_n(s, S_REGS)

/* STORE16: the epilogue stores O in 16-byte pieces, after exchanges within a quad (quad_transpose;
 * lane pairs for split partial states), rather than each lane's 4-byte (8-byte for float32) pairs:
 * a quarter of the store instructions, each writing 64 contiguous bytes of a row. Same-run A/B on
 * the H200 (bench/RESULTS.md, developers' session 21): single prefill 1k +12-14%, 4k +3-4%, trace
 * batch prefill +3-8%. Kernels with a mask in row form keep the pairs: with 16-byte stores their
 * 16k causal step took 3.74-3.82 ms against 3.70-3.74 in four alternating rounds, with the same
 * tile loop instructions (not explained). */
#define STORE16 (!MASK_ROWS)

/* ITEM_OVERLAP: an item's last P V and the next item's first Q K^T go to the tensor cores in one
 * turn, and the epilogue (O / l, the stores) runs while they compute, where the tensor cores
 * otherwise idled through each group's epilogue, Q wait and first softmax of the next item. It
 * needs the next item's Q in shared memory before the current item's last Q K^T is done: the
 * kernels with two Q tiles (Q_BUFS; with one, session 26 measured 4-11% lost on trace batches). */
#define ITEM_OVERLAP (Q_BUFS == 2)

/* Regroups the O_COLS packed pairs of a row of O over the lane's quad for 16-byte stores: lane c =
 * lane % 4 holds pair j (columns 8 j + 2 c, + 1) in w[j]; afterwards it holds the 8 columns of j =
 * 4 b + c in w[4 b .. 4 b + 3], b = 0..O_COLS / 4 - 1. A 4 x 4 transpose of each block of four
 * pairs in two exchanges of two words: with lane c ^ 2 (lanes with bit 1 set send and take words 0,
 * 1; the others 2, 3), then with lane c ^ 1 (words 0, 2; the others 1, 3). */
__device__ __forceinline__ void quad_transpose(unsigned *w, int lane) {
    const bool hi = (lane & 2) != 0, lo = (lane & 1) != 0;
#pragma unroll
    for (int b = 0; b < O_COLS / 4; b++) {
        unsigned *x = w + 4 * b;
        /* selects, not a register index chosen at run time (which would go to local memory) */
        unsigned r0 = __shfl_xor_sync(0xffffffffu, hi ? x[0] : x[2], 2);
        unsigned r1 = __shfl_xor_sync(0xffffffffu, hi ? x[1] : x[3], 2);
        x[0] = hi ? r0 : x[0];
        x[1] = hi ? r1 : x[1];
        x[2] = hi ? x[2] : r0;
        x[3] = hi ? x[3] : r1;
        r0 = __shfl_xor_sync(0xffffffffu, lo ? x[0] : x[1], 1);
        r1 = __shfl_xor_sync(0xffffffffu, lo ? x[2] : x[3], 1);
        x[0] = lo ? r0 : x[0];
        x[1] = lo ? x[1] : r0;
        x[2] = lo ? r1 : x[2];
        x[3] = lo ? x[3] : r1;
    }
}

/* The rows of KV tile t inside the request (at most TILE_KV; 0 or less past it). */
__device__ __forceinline__ int tile_rows(const cinfer_prefill_params &p, int t) {
    return CINFER_MIN(TILE_KV, p.kv_len - t * TILE_KV);
}

#if CINFER_PAGED
/* Rows of a tile copied per box: a page, or a TILE_KV-row part of a longer page. */
#define PAGE_ROWS(p) ((p).page_size < TILE_KV ? (p).page_size : TILE_KV)

/* Whether the lane has a box of a paged tile of `rows` request rows (boxes of PAGE_ROWS rows, a
 * lane each, at most TILE_KV / 8 of them): pages holding no row of the request are not copied. */
__device__ __forceinline__ bool tile_box(const cinfer_prefill_params &p, int rows, int lane) {
    return lane * PAGE_ROWS(p) < rows;
}

/* The page of the lane's box of KV tile t, read by the producer warp a tile ahead of its copies; 0
 * for a lane with no box (or a tile past the request). */
__device__ __forceinline__ int tile_page(const cinfer_prefill_params &p, int t, int lane) {
    return tile_box(p, tile_rows(p, t), lane)
               ? p.kv_indices[(t * TILE_KV + lane * PAGE_ROWS(p)) >> p.page_shift]
               : 0;
}
#endif

/* A box of a K/V map at column c0 (64 b), row (in the page) and head (and page): 16-bit maps are
 * (D, rows, heads) or (D, page rows, heads, pages); fp8 maps have a middle dim of one index after
 * D (KV_FP8 above), which odd column blocks (FP8_PAIRS) take from -1: their rows' bytes come in
 * after the 64 zeros. */
#if KV_FP8
#define FP8_C1(c0) (FP8_PAIRS ? -(((c0) / 64) & 1) : 0)
#define KV_LOAD_RAGGED(dst, map, c0, row, head, bar)                                               \
    cinfer_tma_load_4d(dst, map, c0, FP8_C1(c0), row, head, bar)
#define KV_LOAD_PAGED(dst, map, c0, row, head, page, bar)                                          \
    cinfer_tma_load_5d(dst, map, c0, FP8_C1(c0), row, head, page, bar)
#else
#define KV_LOAD_RAGGED(dst, map, c0, row, head, bar)                                               \
    cinfer_tma_load_3d(dst, map, c0, row, head, bar)
#define KV_LOAD_PAGED(dst, map, c0, row, head, page, bar)                                          \
    cinfer_tma_load_4d(dst, map, c0, row, head, page, bar)
#endif

/* The producer warp's copies of one of K or V (map: its tensor map) of KV tile t (positions
 * t TILE_KV ..) into the stage's half at dst, completing on bar, which this call arms with the
 * bytes it copies. rows: the tile's rows that belong to the request (1..TILE_KV). A paged batch
 * kernel copies each page of the tile, a lane per page (tile_box), from page (tile_page); a whole
 * tile of pages that follow each other in the pool (page indices p0, p0 + 1, ..) is one box per
 * 64 columns through run_map (boxes of TILE_KV / page_size pages), as a ragged K/V's: the TMA
 * unit's cost goes with the boxes, and a box per page made 16-row pages 15-20% slower than
 * ragged (bench/RESULTS.md, developers' session 24). With KV_INTERLEAVED the maps are 5-d where
 * the host could fold the KV head into them (fold.x; kernels/prefill_params.h) and a box holds
 * every column block of its rows; else 4-d in boxes of 8 rows x 64 columns, a lane per group and
 * column block, and no page runs (caches whose heads are not packed). */
__device__ __forceinline__ void copy_kv_half(const cinfer_prefill_params &p, const void *map,
                                             [[maybe_unused]] const void *run_map,
                                             [[maybe_unused]] int4 fold, int blocks, int t,
                                             int rows, int kv_row0, int kv_head, unsigned dst,
                                             unsigned bar, int page, int lane) {
    const unsigned tile_bytes = (unsigned)blocks * KV_BLOCK_BYTES;
#if CINFER_PAGED
    const int page_rows = PAGE_ROWS(p);
    const int page0 = __shfl_sync(0xffffffffu, page, 0);
#if KV_INTERLEAVED
    const int c2 = kv_head * fold.y, c3 = kv_head * fold.z;
    if (!fold.x) {
        /* Boxes of one 8-row group's column block, a lane each (g, b), from the page of the lane
         * that holds the group's page. */
        const int g = lane / DBLOCKS, b = lane % DBLOCKS;
        const int gpage = __shfl_sync(0xffffffffu, page, g * 8 / page_rows);
        const bool mine = g * 8 < rows;
        const int boxes = __popc(__ballot_sync(0xffffffffu, mine));
        if (lane == 0)
            cinfer_mbarrier_arrive_expect_tx(bar, (unsigned)(boxes * 1024));
        __syncwarp();
        if (mine)
            cinfer_tma_load_4d(dst + g * KV_GROUP_BYTES + b * KV_BLOCK_STRIDE, map, b * 64,
                               (t * TILE_KV + 8 * g) & (p.page_size - 1), kv_head, gpage, bar);
        return;
    }
#endif
    if (rows == TILE_KV && page_rows < TILE_KV &&
        __all_sync(0xffffffffu, lane * page_rows >= TILE_KV || page == page0 + lane)) {
        if (lane == 0) {
            cinfer_mbarrier_arrive_expect_tx(bar, tile_bytes);
#if KV_INTERLEAVED
            cinfer_tma_load_5d(dst, run_map, 0, 0, c2, c3, page0, bar);
#else
#pragma unroll
            for (int b = 0; b < blocks; b++)
                KV_LOAD_PAGED(dst + b * KV_BLOCK_BYTES, run_map, b * 64, 0, kv_head, page0, bar);
#endif
        }
        return;
    }
    const bool mine = tile_box(p, rows, lane);
    const int pages = __popc(__ballot_sync(0xffffffffu, mine)); /* boxes to copy */
    if (lane == 0)
        cinfer_mbarrier_arrive_expect_tx(bar, (unsigned)(pages * page_rows * 128 * blocks));
    __syncwarp();
    if (mine) {
        const int in_page = (t * TILE_KV + lane * page_rows) & (p.page_size - 1);
#if KV_INTERLEAVED
        cinfer_tma_load_5d(dst + (unsigned)(lane * page_rows / 8 * KV_GROUP_BYTES), map, 0, 0, c2,
                           c3 + in_page / 8, page, bar);
#else
        const unsigned box = dst + (unsigned)(lane * page_rows * 128);
#pragma unroll
        for (int b = 0; b < blocks; b++)
            KV_LOAD_PAGED(box + b * KV_BLOCK_BYTES, map, b * 64, in_page, kv_head, page, bar);
#endif
    }
#else
    (void)p, (void)rows, (void)page;
    if (lane == 0) {
        cinfer_mbarrier_arrive_expect_tx(bar, tile_bytes);
#pragma unroll
        for (int b = 0; b < blocks; b++)
            KV_LOAD_RAGGED(dst + b * KV_BLOCK_BYTES, map, b * 64, kv_row0 + t * TILE_KV, kv_head,
                           bar);
    }
#endif
}

/* The logits of KV tile t in S, ready for the softmax (in the consumer's scope): made element by
 * element (PREPARE), then masked on the tiles at an edge. */
#if PREPARE
#if SOFTMAX_TURNS
#define PREPARE_TILE(t) prepare_logits(s, turn_q_scale)
#else
#define PREPARE_TILE(t) prepare_logits(s, p.q_scale)
#endif
#elif MASK_ROWS
#define PREPARE_TILE(t) apply_mask(s, mask_raw, mask_shift, lane)
#else
#define PREPARE_TILE(t) ((void)0)
#endif
#if CINFER_WINDOW
#define MASK_OR_PREPARE(t)                                                                         \
    do {                                                                                           \
        PREPARE_TILE(t);                                                                           \
        if ((t) >= mask_from || (t)*TILE_KV < window_until)                                        \
            mask_tile(s, (t)*TILE_KV, p.kv_len, p.window_left, pos, lane);                         \
    } while (0)
#else
#define MASK_OR_PREPARE(t)                                                                         \
    do {                                                                                           \
        PREPARE_TILE(t);                                                                           \
        if ((t) >= mask_from)                                                                      \
            mask_tile(s, (t)*TILE_KV, p.kv_len, 0, pos, lane);                                     \
    } while (0)
#endif

/* The persistent grid: CTA b of G takes items b, 2G - 1 - b, 2G + b, 4G - 1 - b, ... (forward and
 * back in turn: with the items in order of decreasing work, as single prefill's are, each CTA's
 * share comes out even) until they run out. */
__device__ __forceinline__ unsigned item_index(unsigned r) {
    const unsigned b = (r & 1u) ? gridDim.x - 1u - blockIdx.x : blockIdx.x;
    return r * gridDim.x + b;
}

#if KV_FP8
/* Converter warp cw (0..CONVERTERS - 1) of the Q tile at s_qt, in place: fp16 of q x scale. */
__device__ __forceinline__ void convert_q(unsigned s_qt, float scale, int cw, int lane) {
    for (int c = cw * 32 + lane; c < TILE_Q * D / 8; c += CONVERTERS * 32) {
        float f[8];
        cinfer_unpack8(f, DT, cinfer_ld_shared_v4(s_qt + 16u * c));
#pragma unroll
        for (int e = 0; e < 8; e++)
            f[e] *= scale;
        cinfer_st_shared_v4(s_qt + 16u * c, cinfer_pack8(CINFER_DT_F16, f));
    }
}

/* Row groups a converter warp has in flight at once (4 registers each). */
#define CONVERT_UNROLL 4

/* One 8-row group's fp8 bytes of a lane (in, as loaded) as the lane's two fp16 chunks of its row
 * (KV_FP8 above), stored at row + st0 and row + st1; zeros where keep is false. */
__device__ __forceinline__ void convert_store(uint4 in, unsigned row, unsigned st0, unsigned st1,
                                              bool keep) {
    const unsigned w[4] = {in.x, in.y, in.z, in.w};
    unsigned h[8];
#pragma unroll
    for (int e = 0; e < 4; e++)
#if CINFER_DTYPE_KV == CINFER_DT_E4M3
        cinfer_fp8x4_to_f16x2x2(CINFER_DTYPE_KV, w[e], &h[2 * e], &h[2 * e + 1]);
#else
        cinfer_fp8x4_to_f16x2x2_bits(CINFER_DTYPE_KV, w[e], &h[2 * e], &h[2 * e + 1]);
#endif
#pragma unroll
    for (int e = 0; e < 8; e++)
        h[e] = keep ? h[e] : 0u;
    cinfer_st_shared_v4(row + st0, make_uint4(h[0], h[1], h[2], h[3]));
    cinfer_st_shared_v4(row + st1, make_uint4(h[4], h[5], h[6], h[7]));
}

#if FP8_PAIRS
/* Converter warp cw's share of a K or V tile of `blocks` column blocks (even) at base, in place
 * (KV_FP8 above), in quads q of 16 row segments (a row's 64 columns of a block): block pair p = q
 * / (TILE_KV / 8), rows 8 h .. 8 h + 7 (h = q % (TILE_KV / 8)) of blocks 2 p and 2 p + 1, taken
 * in two loads per lane (v = 0, 1). Lane j = lane % 4 of a segment takes its fp8 bytes 16 j .. 16
 * j + 15 (after the 64 zeros in an odd block), which become fp16 chunks 2 j and 2 j + 1 of the
 * swizzled row (kernels/wgmma.cuh: chunk c of row r at c ^ (r % 8)). Lane 8 k + 4 b + j takes
 * block 2 p + b (half), row 8 h + 4 v + (k ^ b): a 16-byte access is served a quarter warp (8
 * lanes, 128 bytes) at a time, and each quarter reads a row of each block, the 32 banks, and
 * stores two rows of opposite parity, whose swizzled chunks are the 32 banks too. The warp takes
 * quads cw, cw + CONVERTERS, .., two at a time: their loads, a __syncwarp, their stores. Rows from
 * `rows` on come out zero. */
__device__ __forceinline__ void convert_kv(unsigned base, int blocks, int rows, int cw, int lane) {
    const int j = lane % 4, half = (lane / 4) % 2, k = lane / 8;
    unsigned row_of[2], st0[2], st1[2];
    int r_of[2];
#pragma unroll
    for (int v = 0; v < 2; v++) {
        r_of[v] = 4 * v + (k ^ half); /* the row in the octet */
        row_of[v] = (unsigned)half * KV_BLOCK_BYTES + 128u * r_of[v];
        st0[v] = 16u * ((2 * j) ^ r_of[v]);
        st1[v] = 16u * ((2 * j + 1) ^ r_of[v]);
    }
    const unsigned ld = 64u * half + 16u * j;
    const int quads = blocks / 2 * (TILE_KV / 8);
    for (int q0 = cw; q0 < quads; q0 += CONVERTERS * 2) {
        uint4 in[2][2];
        unsigned at[2]; /* quad q0 + u CONVERTERS's first row of block 2 p */
#pragma unroll
        for (int u = 0; u < 2; u++) {
            const int q = q0 + u * CONVERTERS;
            at[u] = base + (unsigned)(q / (TILE_KV / 8)) * 2 * KV_BLOCK_BYTES +
                    1024u * (q % (TILE_KV / 8));
            if (q < quads) {
                in[u][0] = cinfer_ld_shared_v4(at[u] + row_of[0] + ld);
                in[u][1] = cinfer_ld_shared_v4(at[u] + row_of[1] + ld);
            }
        }
        __syncwarp(); /* every lane's bytes of the rows are read before any is written */
#pragma unroll
        for (int u = 0; u < 2; u++) {
            const int q = q0 + u * CONVERTERS, r8 = 8 * (q % (TILE_KV / 8));
            if (q < quads)
#pragma unroll
                for (int v = 0; v < 2; v++)
                    convert_store(in[u][v], at[u] + row_of[v], st0[v], st1[v],
                                  rows >= TILE_KV || r8 + r_of[v] < rows);
        }
    }
}
#else
/* Converter warp cw's share of a K or V tile at base, in place (KV_FP8 above), in groups of 8 row
 * segments (a row's 64 columns of a column block): segment s (block s / TILE_KV, row s % TILE_KV)
 * at base + 128 s, so group g at base + 1024 g (`groups` of them: blocks x TILE_KV / 8). Four lanes
 * a segment: lane j = lane % 4 of segment lane / 4 takes fp8 bytes 16 j .. 16 j + 15, which become
 * fp16 chunks 2 j and 2 j + 1 of the swizzled row (kernels/wgmma.cuh: chunk c of row r at c ^ (r %
 * 8)), so every address is the lane's own plus 1024 g. The warp takes groups cw, cw + CONVERTERS,
 * .., CONVERT_UNROLL at a time: their loads, a __syncwarp, their stores. Rows from `rows` on come
 * out zero. */
__device__ __forceinline__ void convert_kv(unsigned base, int blocks, int rows, int cw, int lane) {
    const int groups = blocks * TILE_KV / 8;
    const int j = lane % 4, r8 = lane / 4;
    const unsigned lane_row = base + 128u * r8;
    const unsigned st0 = 16u * ((2 * j) ^ r8), st1 = 16u * ((2 * j + 1) ^ r8);
    for (int g0 = cw; g0 < groups; g0 += CONVERTERS * CONVERT_UNROLL) {
        uint4 in[CONVERT_UNROLL];
#pragma unroll
        for (int u = 0; u < CONVERT_UNROLL; u++)
            if (g0 + u * CONVERTERS < groups)
                in[u] = cinfer_ld_shared_v4(lane_row + 1024u * (g0 + u * CONVERTERS) + 16u * j);
        __syncwarp();          /* every lane's bytes of the rows are read before any is written */
        if (rows >= TILE_KV) { /* a whole tile: the common case, without the row test */
#pragma unroll
            for (int u = 0; u < CONVERT_UNROLL; u++)
                if (g0 + u * CONVERTERS < groups)
                    convert_store(in[u], lane_row + 1024u * (g0 + u * CONVERTERS), st0, st1, true);
        } else {
#pragma unroll
            for (int u = 0; u < CONVERT_UNROLL; u++) {
                const int g = g0 + u * CONVERTERS;
                if (g < groups)
                    convert_store(in[u], lane_row + 1024u * g, st0, st1,
                                  ((8 * g + r8) & (TILE_KV - 1)) < rows);
            }
        }
    }
}

#endif

/* A converter warp's writes are done: they reach the tensor cores (the async proxy) before its
 * arrival at bar. */
__device__ __forceinline__ void converted(unsigned bar, int lane) {
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    __syncwarp();
    if (lane == 0)
        cinfer_mbarrier_arrive(bar);
}
#endif

/* Declares item k's values (the same in the producer and the consumers): its query heads and KV
 * head, p (params of its request alone), its first K/V and q rows in the tensor maps, its query
 * tile (q0, q_span tokens, q_rows rows), delta (token i's position is i + delta), and the KV tiles
 * some row of it keeps (a split item: of its chunk). */
#if PACK > 1
/* The group of query heads [head, head + PACK) of KV head kv_head. */
#define ITEM_HEADS(k)                                                                              \
    [[maybe_unused]] const int kv_head = (int)((k) % (unsigned)params.num_kv_heads);               \
    [[maybe_unused]] const int head = kv_head * PACK
#else
/* Query head h and its KV head. */
#define ITEM_HEAD_IS(h)                                                                            \
    const int head = (h);                                                                          \
    [[maybe_unused]] const int kv_head = head / (params.num_qo_heads / params.num_kv_heads)
#define ITEM_HEADS(k) ITEM_HEAD_IS((int)((k) % (unsigned)params.num_qo_heads))
#endif
#if CINFER_BATCH && CINFER_PAGED
#define ITEM_KV_ROWS()                                                                             \
    p.kv_indices += w.kv_begin;                                                                    \
    [[maybe_unused]] const int kv_row0 = 0
#else
#define ITEM_KV_ROWS() [[maybe_unused]] const int kv_row0 = w.kv_begin /* its first K/V row */
#endif
#if CINFER_BATCH
#define ITEM_SETUP(k)                                                                              \
    ITEM_HEADS(k);                                                                                 \
    cinfer_prefill_params p = params;                                                              \
    const cinfer_prefill_work w = params.work[(k) / (unsigned)params.CTA_HEADS];                   \
    p.qo_len = w.qo_len;                                                                           \
    p.kv_len = w.kv_len;                                                                           \
    p.out = (cinfer_half_bits *)p.out + (long long)w.qo_begin * p.out_stride_n;                    \
    if (p.lse)                                                                                     \
        p.lse += (long long)w.qo_begin * p.lse_stride_n;                                           \
    ITEM_KV_ROWS();                                                                                \
    [[maybe_unused]] const int q_row0 = w.qo_begin; /* its first q row */                          \
    const int q0 = w.q_begin;                                                                      \
    const int q_span = CINFER_MIN(TILE_Q / PACK, p.qo_len - q0);                                   \
    [[maybe_unused]] const int q_rows = q_span * PACK;                                             \
    const int delta = p.kv_len - p.qo_len;                                                         \
    int tile_begin;                                                                                \
    const int num_tiles =                                                                          \
        cinfer_prefill_kv_tiles(TILE_KV, q0, q_span, delta, p.kv_len, p.window_left,               \
                                w.chunk_begin, w.chunk_end, &tile_begin)
#else
/* Single prefill: causal, the heaviest items first (every head's last query tile, then the tiles
 * before); else head by head (the items weigh the same), so that the CTAs running at once share
 * the K/V of one or two KV heads in the L2 rather than of all of them. */
#if CAUSAL
#define ITEM_HEAD(k)   ((int)((k) % (unsigned)params.num_qo_heads))
#define ITEM_Q_TILE(k) (params.num_q_tiles - 1 - (int)((k) / (unsigned)params.num_qo_heads))
#else
#define ITEM_HEAD(k)   ((int)((k) / (unsigned)params.num_q_tiles))
#define ITEM_Q_TILE(k) ((int)((k) % (unsigned)params.num_q_tiles))
#endif
#define ITEM_SETUP(k)                                                                              \
    ITEM_HEAD_IS(ITEM_HEAD(k));                                                                    \
    const cinfer_prefill_params &p = params;                                                       \
    [[maybe_unused]] const int kv_row0 = 0, q_row0 = 0;                                            \
    const int q0 = ITEM_Q_TILE(k) * TILE_Q;                                                        \
    const int q_span = CINFER_MIN(TILE_Q / PACK, p.qo_len - q0);                                   \
    [[maybe_unused]] const int q_rows = q_span * PACK;                                             \
    const int delta = p.kv_len - p.qo_len;                                                         \
    int tile_begin;                                                                                \
    const int num_tiles = cinfer_prefill_kv_tiles(TILE_KV, q0, q_span, delta, p.kv_len,            \
                                                  p.window_left, 0, 0, &tile_begin)
#endif

extern "C" __global__ void __launch_bounds__(THREADS, 1)
    CINFER_KERNEL_NAME(const cinfer_prefill_params params, const cinfer_variant_params vp,
                       const __grid_constant__ cinfer_prefill_tma tma) {
    extern __shared__ uint4 smem[];
    /* (fp8 K/V: the landed barriers of the stages' K and V, and q_conv) */
    __shared__ unsigned long long
        bars[2 * KV_BARS + 2 * Q_BUFS + 1 + (KV_FP8 ? 2 * STAGES + 1 : 0)];
#if SOFTMAX_TURNS
    __shared__ float zero; /* 0, read by SOFTMAX_TURN_WAIT */
#endif
    const unsigned s_q = (cinfer_smem_addr(smem) + 1023u) & ~1023u;
    const unsigned s_kv = s_q + Q_BUFS * Q_BYTES;
    /* The stages' full barriers (K's, then V's with KV_APART), their empty ones in the same
     * order, then the Q buffers' full ones, the partial tiles' fix-up and the Q buffers' empty
     * ones. */
    const unsigned full = cinfer_smem_addr(bars), empty = full + 8u * KV_BARS,
                   q_full = empty + 8u * KV_BARS, fix_bar = q_full + 8u * Q_BUFS,
                   q_empty = fix_bar + 8u;
#define FULL_K(st)  (full + 8u * (unsigned)(st))
#define EMPTY_K(st) (empty + 8u * (unsigned)(st))
#define FULL_V(st)  (full + 8u * (unsigned)((st) + (KV_APART ? STAGES : 0)))
#define EMPTY_V(st) (empty + 8u * (unsigned)((st) + (KV_APART ? STAGES : 0)))
#if KV_FP8
    /* The copies complete on a stage's landed barriers; the converters then arrive at its full
     * ones (and at q_conv once the Q tile is converted), which the consumers wait for. */
    const unsigned landed = q_empty + 8u * Q_BUFS, q_conv = landed + 16u * STAGES;
#define COPIED_K(st) (landed + 8u * (unsigned)(st))
#define COPIED_V(st) (landed + 8u * (unsigned)((st) + STAGES))
#define Q_READY(b)   (q_conv + 8u * (unsigned)(b))
#else
#define COPIED_K(st) FULL_K(st)
#define COPIED_V(st) FULL_V(st)
#define Q_READY(b)   (q_full + 8u * (unsigned)(b))
#endif

    const int warp = (int)threadIdx.x / 32, lane = (int)threadIdx.x % 32;
#if CINFER_BATCH
    const unsigned num_items = (unsigned)params.header->num_work * (unsigned)params.CTA_HEADS;
    /* The split-KV merge (a programmatic dependent launch) may start its blocks now: they wait
     * for this grid to finish before they read a partial state. */
    cinfer_pdl_launch_dependents();
#else
    const unsigned num_items = (unsigned)params.num_q_tiles * (unsigned)params.num_qo_heads;
#endif

    if (threadIdx.x == 0) {
        for (int st = 0; st < STAGES; st++) {
            /* One stage barrier pair takes both copies' arrivals (K's and V's). */
            cinfer_mbarrier_init(FULL_K(st), (KV_APART ? 1 : 2) * CONVERTERS);
            cinfer_mbarrier_init(EMPTY_K(st), CONSUMERS * 128);
#if KV_APART
            cinfer_mbarrier_init(FULL_V(st), CONVERTERS);
            cinfer_mbarrier_init(EMPTY_V(st), CONSUMERS * 128);
#endif
#if KV_FP8
            cinfer_mbarrier_init(COPIED_K(st), 1);
            cinfer_mbarrier_init(COPIED_V(st), 1);
#endif
        }
#if KV_FP8
        cinfer_mbarrier_init(Q_READY(0), CONVERTERS);
#endif
        for (int b = 0; b < Q_BUFS; b++)
            cinfer_mbarrier_init(q_full + 8u * b, 1);
        cinfer_mbarrier_init(fix_bar, 1);
        for (int b = 0; b < Q_BUFS; b++)
            cinfer_mbarrier_init(q_empty + 8u * b, CONSUMERS * 128);
#if SOFTMAX_TURNS
        zero = 0.0f;
#endif
        cinfer_mbarrier_init_fence();
    }
    __syncthreads();

    if (warp >= CONSUMERS * 4) {
        /* The producer warpgroup; its first warp issues every copy. */
#if CONSUMERS == 2
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(PRODUCER_REGS));
#endif
        /* Tiles copied, Q tiles copied and partial tiles fixed before the item's. */
        unsigned g = 0, qi = 0;
        [[maybe_unused]] unsigned fx = 0;
        for (unsigned r = 0; warp == CONSUMERS * 4; r++) {
            const unsigned k = item_index(r);
            if (k >= num_items)
                break;
            ITEM_SETUP(k);
            if (num_tiles <= 0)
                continue;
            if (lane == 0) {
                /* Q's buffer qi % Q_BUFS is free once both groups' last Q K^T of the item that
                 * used it before is done. */
                const unsigned qb = qi % Q_BUFS, q_use = qi / Q_BUFS;
                if (q_use > 0)
                    cinfer_mbarrier_wait(q_empty + 8u * qb, (q_use - 1) & 1u);
                cinfer_mbarrier_arrive_expect_tx(q_full + 8u * qb, TILE_Q * D * 2);
#pragma unroll
                for (int b = 0; b < DBLOCKS; b++)
#if PACK > 1
                    cinfer_tma_load_3d(s_q + qb * Q_BYTES + b * Q_BLOCK_BYTES, tma.q, b * 64, head,
                                       q_row0 + q0, q_full + 8u * qb);
#else
                    cinfer_tma_load_3d(s_q + qb * Q_BYTES + b * Q_BLOCK_BYTES, tma.q, b * 64,
                                       q_row0 + q0, head, q_full + 8u * qb);
#endif
            }
#if CINFER_PAGED
            int page = tile_page(p, KV_TILE(0), lane);
            /* The next tile's pages, read while this warp waits for its stage (after either
             * path of a tile's V: a request's partial tile is the first visited with REVERSE_KV).
             */
#define NEXT_PAGES()                                                                               \
    do {                                                                                           \
        if (i + 1 < num_tiles)                                                                     \
            page = tile_page(p, KV_TILE(i + 1), lane);                                             \
    } while (0)
#else
            const int page = 0;
#define NEXT_PAGES() ((void)0)
#endif
            qi++;
            for (int i = 0; i < num_tiles; i++) {
                const unsigned gi = g + (unsigned)i;
                const int st = (int)(gi % STAGES), t = KV_TILE(i);
                const unsigned s_k = s_kv + st * STAGE_BYTES, s_v = s_k + K_TILE_BYTES;
                /* The tile's rows inside the request; rows past it are another request's, a
                 * page's past kv_len, or not copied (paged), and V's are zeroed: at most once per
                 * item, for the request's last tile. */
                const int rows = tile_rows(p, t);
                /* K once both groups' Q K^T of the tile STAGES back is done, V once their P V. */
                if (gi >= STAGES)
                    cinfer_mbarrier_wait(EMPTY_K(st), (gi / STAGES - 1) & 1u);
                copy_kv_half(p, tma.k, tma.k_run, KV_FOLD, DBLOCKS, t, rows, kv_row0, kv_head, s_k,
                             COPIED_K(st), page, lane);
#if KV_APART
                if (gi >= STAGES)
                    cinfer_mbarrier_wait(EMPTY_V(st), (gi / STAGES - 1) & 1u);
#endif
#if CINFER_BATCH && !KV_FP8 /* (fp8: the converters zero the rows) */
                if (rows < TILE_KV) {
                    copy_kv_half(p, tma.v, tma.v_run, KV_FOLD, VBLOCKS, t, rows, kv_row0, kv_head,
                                 s_v, fix_bar, page, lane);
                    cinfer_mbarrier_wait(fix_bar, fx & 1u);
                    fx++;
                    for (int c = rows * 8 + lane; c < TILE_KV * 8; c += 32)
#pragma unroll
                        for (int b = 0; b < VBLOCKS; b++)
                            cinfer_st_shared_v4(s_v + KV_CHUNK_OFFSET(c, b),
                                                make_uint4(0, 0, 0, 0));
                    /* The zeros reach the tensor cores (the async proxy) before V is marked
                     * full. */
                    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
                    __syncwarp();
                    if (lane == 0)
                        cinfer_mbarrier_arrive(FULL_V(st));
                    NEXT_PAGES();
                    continue;
                }
#endif
                copy_kv_half(p, tma.v, tma.v_run, KV_FOLD, VBLOCKS, t, rows, kv_row0, kv_head, s_v,
                             COPIED_V(st), page, lane);
                NEXT_PAGES();
            }
            g += (unsigned)num_tiles;
        }
#if KV_FP8
        /* The converters (the warpgroup's other warps, cw 0..2): the same items and tiles as
         * the copies, each converted once it has landed (KV_FP8 above). */
        g = qi = 0;
        const int cw = warp - CONSUMERS * 4 - 1;
        for (unsigned r = 0; cw >= 0; r++) {
            const unsigned k = item_index(r);
            if (k >= num_items)
                break;
            ITEM_SETUP(k);
            if (num_tiles <= 0)
                continue;
            cinfer_mbarrier_wait(q_full + 8u * (qi % Q_BUFS), (qi / Q_BUFS) & 1u);
            convert_q(s_q + (qi % Q_BUFS) * Q_BYTES, p.q_in_scale, cw, lane);
            converted(Q_READY(qi % Q_BUFS), lane);
            qi++;
            for (int i = 0; i < num_tiles; i++) {
                const unsigned gi = g + (unsigned)i;
                const int st = (int)(gi % STAGES), rows = tile_rows(p, KV_TILE(i));
                const unsigned s_k = s_kv + st * STAGE_BYTES;
                cinfer_mbarrier_wait(COPIED_K(st), (gi / STAGES) & 1u);
                convert_kv(s_k, DBLOCKS, rows, cw, lane);
                converted(FULL_K(st), lane);
                cinfer_mbarrier_wait(COPIED_V(st), (gi / STAGES) & 1u);
                convert_kv(s_k + K_TILE_BYTES, VBLOCKS, rows, cw, lane);
                converted(FULL_V(st), lane);
            }
            g += (unsigned)num_tiles;
        }
#endif
    } else {
        /* A consumer: warpgroup wg, rows wg * 64 + 16 (warp % 4) + lane / 4 (+ 8) of the tile. */
#if CONSUMERS == 2
        asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(CONSUMER_REGS));
#endif
        const int wg = warp / 4;
        const int row0 = wg * 64 + (warp % 4) * 16 + lane / 4;
        const unsigned s_q_rows = s_q + wg * 64 * 128; /* in Q buffer 0 */
        /* Tiles consumed and items with tiles before the item's. */
        unsigned g = 0, qi = 0;
#if ITEM_OVERLAP
        /* O, S and P live on from one item to the next: an item's first Q K^T may have been
         * issued with the previous item's last P V (first_issued). */
        float o[O_REGS], s[S_REGS];
        unsigned pa[TILE_KV / 16][4];
        bool first_issued = false;
#else
        const bool first_issued = false;
#endif
        for (unsigned r = 0;; r++) {
            const unsigned k = item_index(r);
            if (k >= num_items)
                break;
            ITEM_SETUP(k);
            /* The positions of the lane's two rows' tokens. */
            const int pos[2] = {q0 + row0 / PACK + delta, q0 + (row0 + 8) / PACK + delta};
#if ITEM_OVERLAP
            float alpha[2];
#else
            float o[O_REGS], s[S_REGS], alpha[2];
            unsigned pa[TILE_KV / 16][4];
#endif
            float m[2] = {-CINFER_INF, -CINFER_INF}, l[2] = {0.0f, 0.0f};
#pragma unroll
            for (int i = 0; i < O_REGS; i++)
                o[i] = 0.0f;
#if CINFER_BATCH
            [[maybe_unused]] const int batch_idx = w.request; /* the variants' hooks take it */
#else
            [[maybe_unused]] const int batch_idx = 0;
#endif
#if VARIANT_STATE_INIT
            /* The variant's initial state (e.g. a sink logit) of each existing row; the row sums
             * are per lane until the end, so one lane of the quad holds its denominator. A split
             * tile's rows take it in their first chunk only (the merge adds the chunks'
             * denominators). */
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int row = row0 + 8 * h;
#if CINFER_BATCH
                if (row < q_rows && w.chunk == 0) {
#else
                if (row < q_rows) {
#endif
                    float mi = -CINFER_INF, di = 0.0f;
                    variant_state_init(&vp, batch_idx, pos[h], head + row % PACK, &mi, &di);
                    m[h] = mi;
                    l[h] = lane % 4 == 0 ? di : 0.0f;
                }
            }
#endif
#if PREPARE
            /* Logits go through prepare_logits on every tile (tanh in S; see PREPARE's comment). */
            const float scale = p.soft_cap_log2, shift = -p.soft_cap_log2;
            const bool fixed_max = p.soft_cap_fixed != 0;
            if (fixed_max)
                m[0] = m[1] = p.soft_cap_max;
#elif CINFER_VARIANT_LOGITS
            /* a mask's or ALiBi's variant: natural-log q_scale */
            const float scale = p.q_scale * CINFER_LOG2E;
#else
            const float scale = p.q_scale;
#endif
#if SOFTMAX_TURNS
            float turn_q_scale; /* set by SOFTMAX_TURN_WAIT */
#endif
#if ALIBI_ACC
            float slope_qk[2];
#pragma unroll
            for (int h = 0; h < 2; h++) {
                slope_qk[h] = variant_alibi_slope(&vp, batch_idx, head + (row0 + 8 * h) % PACK) *
                              CINFER_LOG2E / scale;
            }
#endif
#if ITEM_OVERLAP
            /* The next item's KV tiles (0: no next item), read now so that the loads are in by
             * this item's last P V. (ITEM_OVERLAP kernels have no ALiBi bias to set for it.) */
            int next_tiles = 0;
            {
                const unsigned k_next = item_index(r + 1);
                if (k_next < num_items) {
                    ITEM_SETUP(k_next);
                    next_tiles = num_tiles;
                }
            }
#endif
            /* Tiles that need the element mask: from the first one holding a position past the
             * warpgroup's first row (causal), the one holding kv_len, and (window) those holding a
             * position before its last row's window. */
#if CAUSAL
            const int first_pos = q0 + (wg * 64) / PACK + delta;
            const int mask_from = first_pos + 1 >= 0 ? (first_pos + 1) / TILE_KV : -1;
#else
            const int mask_from = p.kv_len / TILE_KV;
#endif
#if CINFER_WINDOW
            const int window_until = q0 + (wg * 64 + 63) / PACK + delta - p.window_left;
#endif
#if MASK_ROWS
            /* Where the mask of each of the lane's rows keeps position 0 (a row past q_rows reads
             * the last row's: its logits are never stored), and the words of the tile being
             * computed (mask_raw) and of the next one, loaded a tile ahead (mask_next). */
            const uint32_t *mask_words[2];
            int mask_shift[2];
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int row = CINFER_MIN(row0 + 8 * h, q_rows - 1);
                int64_t bit;
                const uint32_t *words = variant_logits_mask_row(
                    &vp, batch_idx, q0 + row / PACK + delta, head + row % PACK, kv_head, &bit);
                mask_words[h] = words + (bit >> 5);
                mask_shift[h] = (int)(bit & 31);
            }
            uint32_t mask_raw[2][MASK_RAW_WORDS], mask_next[2][MASK_RAW_WORDS];
            /* iteration i + 1's tile (the last iteration reads its own again) */
#define LOAD_NEXT_MASK(i)                                                                          \
    load_mask(mask_next, mask_words, mask_shift,                                                   \
              KV_TILE(CINFER_MIN((i) + 1, num_tiles - 1)) * TILE_KV, p.kv_len)
#define NEXT_MASK_IN() next_mask_in(mask_raw, mask_next)
#else
#define LOAD_NEXT_MASK(t) ((void)0)
#define NEXT_MASK_IN()    ((void)0)
#endif

            if (num_tiles > 0) {
#if MASK_ROWS
                load_mask(mask_raw, mask_words, mask_shift, KV_TILE(0) * TILE_KV, p.kv_len);
#endif
                /* The first tile: S only (unless issued with the previous item's last P V). */
                if (!first_issued) {
#if ITEM_OVERLAP
                    CINFER_WGMMA_WAIT(0); /* an unread Q K^T of the previous item's last turn */
#endif
                    cinfer_mbarrier_wait(Q_READY(qi % Q_BUFS), (qi / Q_BUFS) & 1u);
                    cinfer_mbarrier_wait(FULL_K(g % STAGES), (g / STAGES) & 1u);
#if PINGPONG
                    /* Group 0's first turn of the CTA is its own; every other waits for the other
                     * group's last issue (across items too). */
                    if (wg == 1 || qi > 0)
                        cinfer_bar_sync(1 + wg, 256);
#endif
                    SET_BIAS(KV_TILE(0));
                    cinfer_wgmma_fence();
                    issue_qk(s, s_q_rows + (qi % Q_BUFS) * Q_BYTES,
                             s_kv + (g % STAGES) * STAGE_BYTES);
#if PINGPONG
                    cinfer_bar_arrive(2 - wg, 256); /* the other group's turn */
#endif
                }
                LOAD_NEXT_MASK(0);
                CINFER_WGMMA_WAIT(0);
                PIN_S();
#if KV_APART
                cinfer_mbarrier_arrive(EMPTY_K(g % STAGES)); /* K is read */
#endif
                if (num_tiles == 1)
                    cinfer_mbarrier_arrive(q_empty +
                                           8u * (qi % Q_BUFS)); /* its last Q K^T is done */
                SOFTMAX_TURN_WAIT(qi == 0);
                MASK_OR_PREPARE(KV_TILE(0));
                SOFTMAX();
                SOFTMAX_TURN_PASS();
                pack_p(s, pa);
                NEXT_MASK_IN();
                if (num_tiles > 1)
                    SET_BIAS(KV_TILE(1));

                for (int i = 1; i < num_tiles; i++) {
                    const unsigned gi = g + (unsigned)i;
                    const int st = (int)(gi % STAGES), t = KV_TILE(i);
                    cinfer_mbarrier_wait(FULL_K(st), (gi / STAGES) & 1u);
#if KV_APART
                    cinfer_mbarrier_wait(FULL_V((gi - 1) % STAGES), ((gi - 1) / STAGES) & 1u);
#endif
#if PINGPONG
                    cinfer_bar_sync(1 + wg, 256);
#endif
                    PIN_O();
                    cinfer_wgmma_fence();
                    issue_qk(s, s_q_rows + (qi % Q_BUFS) * Q_BYTES, s_kv + st * STAGE_BYTES);
                    issue_pv(o, pa, s_kv + ((gi - 1) % STAGES) * STAGE_BYTES + K_TILE_BYTES);
#if PINGPONG
                    cinfer_bar_arrive(2 - wg, 256); /* the other group's turn */
#endif
                    LOAD_NEXT_MASK(i);
                    CINFER_WGMMA_WAIT(1);
                    PIN_S();
#if KV_APART
                    cinfer_mbarrier_arrive(EMPTY_K(st)); /* K is read */
#endif
                    if (i == num_tiles - 1)
                        cinfer_mbarrier_arrive(q_empty +
                                               8u * (qi % Q_BUFS)); /* its last Q K^T is done */
                    SOFTMAX_TURN_WAIT(false);
                    MASK_OR_PREPARE(t);
                    SOFTMAX();
                    SOFTMAX_TURN_PASS();
                    /* The softmax's results are tied before the wait below (ptxas still schedules
                     * the wait before the exp2s; see the top). */
                    PIN_S();
                    CINFER_WGMMA_WAIT(0);
                    PIN_O();
                    /* Tile i - 1's V is read (by the product just waited for; K by S_{i-1}). */
                    cinfer_mbarrier_arrive(EMPTY_V((gi - 1) % STAGES));
#if PREPARE
                    if (!fixed_max && O_RESCALE_WANTED())
#else
                    if (O_RESCALE_WANTED())
#endif
                    {
#pragma unroll
                        for (int r = 0; r < O_REGS; r++)
                            o[r] *= alpha[(r % 4) / 2];
                    }
                    pack_p(s, pa);
                    NEXT_MASK_IN();
                    if (i + 1 < num_tiles)
                        SET_BIAS(KV_TILE(i + 1)); /* S's registers are free until the next S */
                }
                /* The last tile's product. With ITEM_OVERLAP it goes in one turn with the next
                 * item's first Q K^T, which runs during this item's epilogue. Without a next item
                 * with tiles (the CTA's last item, or one before an item with none), that Q K^T
                 * is still issued, on whatever Q and stage hold, and its S is never read: ptxas
                 * serializes every wgmma of the kernel if the groups in flight at the epilogue
                 * depend on a branch. */
                const unsigned last = g + (unsigned)num_tiles - 1;
#if KV_APART
                cinfer_mbarrier_wait(FULL_V(last % STAGES), (last / STAGES) & 1u);
#endif
#if ITEM_OVERLAP
                const unsigned gn = last + 1;
                if (next_tiles > 0) {
                    cinfer_mbarrier_wait(q_full + 8u * ((qi + 1) % Q_BUFS),
                                         ((qi + 1) / Q_BUFS) & 1u);
                    cinfer_mbarrier_wait(FULL_K(gn % STAGES), (gn / STAGES) & 1u);
                }
                cinfer_wgmma_fence();
                issue_pv(o, pa, s_kv + (last % STAGES) * STAGE_BYTES + K_TILE_BYTES);
                issue_qk(s, s_q_rows + ((qi + 1) % Q_BUFS) * Q_BYTES,
                         s_kv + (gn % STAGES) * STAGE_BYTES);
                CINFER_WGMMA_WAIT(1);
                first_issued = next_tiles > 0;
#else
                cinfer_wgmma_fence();
                issue_pv(o, pa, s_kv + (last % STAGES) * STAGE_BYTES + K_TILE_BYTES);
                CINFER_WGMMA_WAIT(0);
#endif
                PIN_O();
                cinfer_mbarrier_arrive(EMPTY_V(last % STAGES));
                g += (unsigned)num_tiles;
                qi++;
            }

            /* Epilogue: row sums over the quad, then O / l (x v_scale) and LSE = m + log2(l): into
             * out and lse, or a split chunk's float32 partial states (prefill_params.h). */
#pragma unroll
            for (int h = 0; h < 2; h++) {
                float sum = l[h];
                sum += __shfl_xor_sync(0xffffffffu, sum, 1);
                sum += __shfl_xor_sync(0xffffffffu, sum, 2);
                const int row = row0 + 8 * h;
#if STORE16
                /* A row past q_rows still takes part in its quad's exchanges (all four lanes hold
                 * the same row), then stores nothing. */
                const bool live = row < q_rows;
#else
                if (row >= q_rows)
                    continue;
#endif
                const int token = row / PACK, row_head = head + row % PACK;
                const float inv = sum > 0.0f ? p.v_scale / sum : 0.0f;
#if PREPARE
                const float lse = sum > 0.0f ? m[h] + log2f(sum) + p.soft_cap_log2 : -CINFER_INF;
#else
                const float lse = sum > 0.0f ? m[h] + log2f(sum) : -CINFER_INF;
#endif
#if CINFER_BATCH
                if (w.partial >= 0) {
                    const long long slot =
                        (long long)w.partial +
                        ((long long)token * p.num_qo_heads + row_head) * (long long)w.num_chunks;
#if STORE16
                    /* float32 O as 16-byte stores: lanes c and c ^ 1 of a quad swap pairs, so that
                     * an even lane holds columns 16 a + 2 c .. + 3 of the row and an odd one 16 a +
                     * 8 + 2 (c - 1) .. + 3 (64 contiguous bytes per quad and instruction). */
                    const bool odd = (lane & 1) != 0;
                    float4 v[O_COLS / 2];
#pragma unroll
                    for (int a = 0; a < O_COLS / 2; a++) {
                        const float x0 = o[8 * a + 2 * h] * inv, y0 = o[8 * a + 2 * h + 1] * inv;
                        const float x1 = o[8 * a + 4 + 2 * h] * inv,
                                    y1 = o[8 * a + 4 + 2 * h + 1] * inv;
                        const float rx = __shfl_xor_sync(0xffffffffu, odd ? x0 : x1, 1);
                        const float ry = __shfl_xor_sync(0xffffffffu, odd ? y0 : y1, 1);
                        v[a] = odd ? make_float4(rx, ry, x1, y1) : make_float4(x0, y0, rx, ry);
                    }
                    if (!live)
                        continue;
                    float *po = p.partial_o + slot * D_VO + 2 * (lane & 2) + (odd ? 8 : 0);
#pragma unroll
                    for (int a = 0; a < O_COLS / 2; a++)
                        *(float4 *)(po + 16 * a) = v[a];
#else
                    float *po = p.partial_o + slot * D_VO + 2 * (lane % 4);
#pragma unroll
                    for (int j = 0; j < O_COLS; j++)
                        *(float2 *)(po + 8 * j) =
                            make_float2(o[4 * j + 2 * h] * inv, o[4 * j + 2 * h + 1] * inv);
#endif
                    if (lane % 4 == 0)
                        p.partial_lse[slot] = lse;
                    continue;
                }
#endif
#if STORE16
                /* The row's 16-bit O as 16-byte stores (the host checks out's rows are 16-byte
                 * aligned): a quad's lanes store 64 contiguous bytes per instruction. */
                unsigned words[O_COLS];
#pragma unroll
                for (int j = 0; j < O_COLS; j++)
                    words[j] =
                        cinfer_pack_half2(DT, o[4 * j + 2 * h] * inv, o[4 * j + 2 * h + 1] * inv);
                quad_transpose(words, lane);
                if (!live)
                    continue;
                cinfer_half_bits *dst = (cinfer_half_bits *)p.out +
                                        (long long)(q0 + token) * p.out_stride_n +
                                        (long long)row_head * p.out_stride_h + 8 * (lane % 4);
#pragma unroll
                for (int b = 0; b < O_COLS / 4; b++)
                    *(uint4 *)(dst + 32 * b) = make_uint4(words[4 * b], words[4 * b + 1],
                                                          words[4 * b + 2], words[4 * b + 3]);
#else
                cinfer_half_bits *dst = (cinfer_half_bits *)p.out +
                                        (long long)(q0 + token) * p.out_stride_n +
                                        (long long)row_head * p.out_stride_h + 2 * (lane % 4);
#pragma unroll
                for (int j = 0; j < O_COLS; j++)
                    *(unsigned *)(dst + 8 * j) =
                        cinfer_pack_half2(DT, o[4 * j + 2 * h] * inv, o[4 * j + 2 * h + 1] * inv);
#endif
                if (p.lse && lane % 4 == 0)
                    p.lse[(long long)(q0 + token) * p.lse_stride_n +
                          (long long)row_head * p.lse_stride_h] = lse;
            }
        }
#if ITEM_OVERLAP
        CINFER_WGMMA_WAIT(0); /* the last item's unread Q K^T */
#endif
#if PINGPONG
        /* Group 1's last turn passes to no one: taken here, so that no barrier is left half
         * arrived. */
        if (wg == 0 && qi > 0) {
            cinfer_bar_sync(1, 256);
#if SOFTMAX_TURNS
            cinfer_bar_sync(3, 256);
#endif
        }
#endif
    }
}
