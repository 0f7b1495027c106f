/*
 * Prefill attention on tensor cores, FA2-style (the portable sm80 backend: mma.sync, ldmatrix,
 * cp.async; runs on sm_80 and every later arch).
 *
 * One CTA computes TILE_Q query rows of one query head against that head's KV range
 * (kernels/prefill_params.h gives the grid). Each of the WARPS warps owns WARP_ROWS = 16 * MMA_Q
 * of the rows for the whole kernel, so the softmax state of a row never leaves its warp:
 *
 *   S = Q K^T   mma.m16n8k16, A = Q (registers when small enough, else ldmatrix from shared
 *               memory each step), B = K through ldmatrix (K rows are B's columns);
 *   softmax     online, in registers, base-2 logits (scaled by sm_scale * log2(e), so exp2 is one
 *               MUFU instruction); row maxima are reduced across the 4 lanes of a quad, row sums
 *               stay per lane until the end;
 *   O += P V    the S accumulators become P's A fragments (the C layout of two n8 tiles is the
 *               A layout of one k16 step), converted to fp16/bf16 in one step after the softmax;
 *               B = V through ldmatrix.trans. O is rescaled only when some row's maximum grew
 *               (with a position bias: by more than CINFER_LAZY_MAX_SLACK).
 *
 * Shared memory: Q [TILE_Q][D], then STAGES stages of K [TILE_KV][D] and of V [TILE_KV][D]. A row
 * is D / 8 chunks of 16 bytes, padded by one chunk: D / 8 + 1 is odd (D is a multiple of 16), so
 * the 8 consecutive rows an ldmatrix phase reads (same chunk) and the 8 consecutive chunks a
 * cp.async phase writes land in 8 different bank groups. Padding rather than an XOR swizzle keeps
 * every address linear in the row and chunk, so a lane reaches all its ldmatrix sources of one
 * operand from one register plus compile-time offsets (IMM_OFFSET).
 *
 * Registers: with 32 rows per warp at D = 128 and 64 KV rows, the O and S accumulators alone take
 * 192 of the 255 registers per thread, so what else stays live through the tile loop is kept
 * small: three ldmatrix addresses, one cp.async destination and two global cursors per thread,
 * the softmax state, and values derived from threadIdx.x recomputed where needed (thread_index).
 *
 * Pipeline (STAGES >= 2): the prologue issues Q and the first STAGES - 1 KV tiles (one cp.async
 * group each). Iteration t waits for tile t, passes a barrier (which also tells every warp that
 * tile t - 1's stage is free), issues tile t + STAGES - 1 into that stage, then computes tile t,
 * so STAGES - 1 tiles are in flight behind the math.
 *
 * Work skipping: a CTA visits only the KV tiles that some row of its tile keeps (causal: up to
 * the last row's position; sliding window: from the first row's window start). Only tiles that
 * cross the diagonal, the window edge or kv_len evaluate the element mask. Masked logits are
 * -inf; a row with nothing kept ends with output 0 and LSE -inf.
 *
 * A variant's mask (kernels/variant.cuh) is tested on every tile, but a mask in its row form
 * (bits in device memory) travels with the K/V: each KV tile's words of every query row are
 * copied into shared memory in the tile's cp.async group, so no global load waits in the loop,
 * and a warp whose rows keep every position of an inside tile (one shared-memory read per lane
 * and a vote) skips the per-element test, as for default attention.
 *
 * Single and batch: a single-prefill CTA finds its query tile and head in blockIdx; a batch CTA
 * (CINFER_BATCH) reads them from the planned work list, then rebases q, out, lse and a ragged
 * K/V onto its request, so the pipeline, the softmax and the epilogue below are the same code
 * for both. A paged K/V (CINFER_PAGED) differs only in where a KV row is copied from: each row's
 * page comes from the page table (load_kv_paged). Split-KV (batch): an item may cover one chunk
 * of its tile's KV range; the CTA then visits only that chunk's KV tiles and ends by writing
 * float32 partial states to the workspace, which the decode merge kernel folds into out/lse.
 *
 * In-kernel RoPE (CINFER_POS = 1, kernels/pos_rope.cuh): the Q tile is rotated in shared memory
 * once, after it arrives and before any warp reads it, and each K tile after it arrives and
 * before its ldmatrix reads, at absolute positions; the rotated values are rounded back to the
 * 16-bit dtype in place. This costs one more barrier per KV tile; without RoPE nothing changes.
 *
 * fp8 K/V (CINFER_DTYPE_KV e4m3 or e5m2; q and out fp16 or bf16): the stages hold fp8 rows of D
 * bytes (D / 16 chunks, padded to an odd count for the same bank spread), and one more K and one
 * more V tile of 16-bit rows (the layout above) after them hold the current tile as fp16. After a
 * tile lands, the CTA converts it once into those (convert_kv: each thread a slice, by
 * shifts and masks on the integer pipe, exact; e4m3 comes out divided by 256, which the host
 * folds into q_scale and v_scale) and passes a second barrier; the warps then run the 16-bit
 * ldmatrix / mma code above on it, both mmas in fp16. Converting per CTA rather than in each
 * warp's fragments does the work once instead of once per warp, away from the softmax's issue
 * slots, for one barrier and 32 bytes of shared-memory stores per 16 fp8 bytes. The fp8 stage is
 * free once converted, so it takes the tile STAGES ahead right after that barrier: STAGES tiles
 * are in flight behind the math (STAGES - 1 with 16-bit K/V). The Q tile is converted once, before
 * the first tile's barrier, to fp16 of q * q_in_scale (convert_q). Shared memory: with STAGES = 2
 * and an even D / 16, 32 bytes per KV row more than the 16-bit kernel's (104 KiB at the D = 128
 * default, still two CTAs per SM on sm_90), less otherwise.
 * P is packed as fp16 (it is in [0, 1]; fp16 keeps 3 more bits than bf16).
 *
 * GQA packing (CINFER_GQA_PACK = G > 0, batch kernels only): a CTA computes all G query heads of
 * one KV head (the group) for TILE_Q / G whole query tokens of its work item, so each K/V tile is
 * loaded once for the group instead of once per query head, and a few query tokens (a short
 * chunk, a cascade's shared-prefix level) fill the tile with G x as many rows. Tile row r is token
 * q0 + r / G, query head head + r % G (head = kv_head x G, the group's first). The Q tile is
 * gathered row by row when it is loaded; every per-row quantity (position, query head: the masks,
 * RoPE, ALiBi slopes, every variant hook, out, lse and split-KV partial states) comes from
 * row_token and row_head, which are the identity and the CTA's head without packing, so unpacked
 * kernels compile as before. Rows past (TILE_Q / G) x G, when G does not divide TILE_Q, are padding
 * like rows past the request's end: zero Q, never stored. The planner's items then hold
 * TILE_Q / G tokens and the grid multiplies them by Hk (prefill_params.h).
 *
 * The sm90 backend's kernel (CINFER_BACKEND 2: wgmma and TMA; its limits are
 * validate_prefill_sm90's in src/jit/spec.c) is kernels/prefill_sm90.cuh, which this file includes
 * in place of everything below.
 *
 * Prelude: CINFER_DTYPE_Q (== O), CINFER_DTYPE_KV (== Q, or e4m3 / e5m2), CINFER_HEAD_DIM_QK
 * and CINFER_HEAD_DIM_VO (see D_QK below), CINFER_MASK (0 none, 1 causal), CINFER_POS (0 none, 1
 * RoPE), CINFER_SOFTCAP, CINFER_WINDOW, CINFER_TILE_Q, CINFER_TILE_KV, CINFER_WARPS, CINFER_STAGES,
 * CINFER_BATCH, CINFER_PAGED, CINFER_GQA_PACK, CINFER_OP_PREFILL.
 */
#include "common.cuh"
#include "mma.cuh"
#include "pos_rope.cuh"
#include "prefill_params.h"
#include "prefill_tiles.cuh"
#include "soft_cap.cuh"
#include "variant.cuh"

#if defined(CINFER_OP_PREFILL) && CINFER_BACKEND == 2
#include "prefill_sm90.cuh"
#elif defined(CINFER_OP_PREFILL)

/* D_QK != D_VO (e.g. 192 / 128): the tiles and the mmas run at D = the larger of the two, Q and K
 * copied with their columns from D_QK on zero-filled and V with its columns from D_VO on
 * zero-filled, so Q K^T and P V are exact and O's columns from D_VO on are zero and never stored.
 * Those kernels copy K/V chunk by chunk (KV_BY_COLUMN off), take no fp8 K/V, RoPE or GQA packing
 * (the host's checks, src/ops/prefill.c). */
#define D_QK       CINFER_HEAD_DIM_QK
#define D_VO       CINFER_HEAD_DIM_VO
#define ASYM       (D_QK != D_VO)
#define D          (D_QK > D_VO ? D_QK : D_VO)
#define QK_CHUNKS  (D_QK / 8) /* 16-byte chunks of a Q or K row that exist */
#define VO_CHUNKS  (D_VO / 8) /* of a V or O row */
#define DT         CINFER_DTYPE_Q
#define WARPS      CINFER_WARPS
#define THREADS    (WARPS * 32)
#define TILE_Q     CINFER_TILE_Q
#define TILE_KV    CINFER_TILE_KV
#define STAGES     CINFER_STAGES
#define MMA_Q      (TILE_Q / (16 * WARPS)) /* m16 tiles of query rows per warp */
#define WARP_ROWS  (16 * MMA_Q)
#define K_STEPS    (D / 16)       /* k16 steps of Q K^T */
#define S_TILES    (TILE_KV / 8)  /* n8 tiles of S */
#define PV_STEPS   (TILE_KV / 16) /* k16 steps of P V */
#define O_TILES    (D / 8)        /* n8 tiles of O */
#define CHUNKS     (D / 8)        /* 16-byte chunks per row */
#define ROW_CHUNKS (CHUNKS + 1)   /* padded (see the layout above) */
#define ROW_BYTES  (ROW_CHUNKS * 16)
/* The K/V stages: 16-bit rows like Q's, or fp8 rows of D / 16 chunks padded to an odd count. */
#if CINFER_DTYPE_KV == CINFER_DT_E4M3 || CINFER_DTYPE_KV == CINFER_DT_E5M2
#define KV_FP8        1
#define MMA_DT        CINFER_DT_F16 /* the dtype of both mmas' operands */
#define KV_CHUNKS     (D / 16)
#define KV_ROW_CHUNKS ((D / 16) | 1)
/* K/V tiles issued ahead of the one computed: an fp8 stage is free once converted */
#define KV_AHEAD      STAGES
typedef unsigned char kv_elem;
#else
#define KV_FP8        0
#define MMA_DT        DT
#define KV_CHUNKS     CHUNKS
#define KV_ROW_CHUNKS ROW_CHUNKS
#define KV_AHEAD      (STAGES - 1)
typedef cinfer_half_bits kv_elem;
#endif
#if ASYM && (KV_FP8 || CINFER_ROPE || CINFER_GQA_PACK || D_QK % 16 != 0 || D_VO % 16 != 0)
#error "prefill: D_QK != D_VO takes 16-bit K/V, no RoPE, no GQA packing, multiples of 16"
#endif
/* K/V copies where each thread keeps one chunk column of every row (see load_kv_rows). */
#define KV_BY_COLUMN (THREADS % KV_CHUNKS == 0 && !ASYM)

#if KV_FP8 && CINFER_ROPE
#error "prefill: in-kernel RoPE rotates 16-bit K tiles; fp8 K/V with RoPE is rejected at plan time"
#endif
#define KV_CHUNK_ELEMS (16 / (int)sizeof(kv_elem)) /* K/V elements per 16-byte chunk */
#define KV_ROW_BYTES   (KV_ROW_CHUNKS * 16)
#define KV_BYTES       (TILE_KV * KV_ROW_BYTES) /* one stage of K (or V) */
/* The K and V tiles the mmas read: each stage's with 16-bit K/V, the fp16 tiles (at 0) with fp8 */
#if KV_FP8
#define MMA_KV_OFFSET(stage) 0
#else
#define MMA_KV_OFFSET(stage) ((stage)*KV_BYTES)
#endif
/* Q fragments stay in registers when they take at most 32 per lane (16 x D x MMA_Q halves over a
 * warp); larger ones would push the O accumulators into local memory, so they are re-read from
 * shared memory at each k step instead. */
#define Q_IN_REGS (MMA_Q * D <= 128)
#define CAUSAL    (CINFER_MASK == 1)
/* The LSE from the softmax's max and sum (the soft cap's logits are shifted by -cap2) */
#if CINFER_SOFTCAP && !CINFER_VARIANT_LOGITS
#define LSE_OF(max, sum) ((max) + log2f(sum) + p.soft_cap_log2)
#else
#define LSE_OF(max, sum) ((max) + log2f(sum))
#endif
/*
 * KV_COPY_LATE: the next KV tile's copies are issued after this tile's Q K^T mmas instead of right
 * after the tile's barrier, so that they fall among the soft cap's and softmax's waits rather
 * than delay the warp's first mmas. Soft cap kernels only: same-run A/B on the H200
 * (bench/RESULTS.md, 2026-11-30), soft cap 16k causal 297 -> 330 TFLOP/s (its 32-byte spill
 * notwithstanding), but plain 16k -3 to -4%, window -2%, 1k non-causal -8%.
 */
#define KV_COPY_LATE (!KV_FP8 && CINFER_SOFTCAP)
/*
 * PINGPONG: eight warps of 32 rows (TILE_Q = 256) form two groups of four (warps 0-3 rows 0-127,
 * warps 4-7 rows 128-255); warps w and w + 4 share a scheduler. The groups take turns at P V:
 * each tile's P V mmas of group 0, then of group 1, then group 0's of the next tile, ..., through
 * named barriers 1 (group 0's turn) and 2 (group 1's): a group waits on its own before its P V
 * and counts itself in on the other's after it. So the two warps of a scheduler are offset by
 * about a turn, and one's Q K^T and softmax run beside the other's P V instead of both warps
 * reaching their softmax together (two independent CTAs per SM overlap only by chance).
 * The groups share every K/V tile but never meet at a CTA barrier in the loop: a tile's arrival
 * is an mbarrier per stage on which every thread's copies arrive (cp.async.mbarrier.arrive), and
 * the stage of tile t - 1 is free once both groups' P V of tile t - 1 is done, which each group
 * knows when its P V turn of tile t begins; it issues its share of tile t + STAGES - 1's copies
 * after that turn (not inside it, where they delayed the mmas), so STAGES >= 3 keeps tiles in
 * flight; a custom mask's row form (MASK_ROWS), whose copies include the tile's mask words,
 * issues them at the start of the turn (PP_COPY_IN_TURN: 341 against 299 TFLOP/s at 16k causal
 * in two full runs of the benchmark). 16-bit K/V, no RoPE (both add CTA barriers per tile).
 * H200, 16k causal / non-causal, same-run A/B (bench/RESULTS.md, 2026-11-30): 400-404 / 389-393
 * TFLOP/s in 4 stages against 369-383 / 370-376 for 128 x 64 tiles on four warps; the copies
 * inside the turn 392 / 393-395; turns at Q K^T as well 383-384 / 377-381 (4 stages); Q K^T of the
 * next tile inside the P V turn 353 (3 stages). The soft cap kernel loses (272-299 against
 * 331-343): the host keeps it on the four-warp tiles.
 */
#define PINGPONG     (WARPS == 8 && MMA_Q == 2 && STAGES >= 3 && !KV_FP8 && !CINFER_ROPE)
#if PINGPONG
#define PP_THREADS       256 /* both groups: a named barrier's count */
/* Group wg's turn begins / ends (the other group's may begin). */
#define PP_TURN_WAIT(wg) cinfer_bar_sync(1 + (wg), PP_THREADS)
#define PP_TURN_PASS(wg) cinfer_bar_arrive(2 - (wg), PP_THREADS)
/* This thread's copies issued so far count toward stage st's arrival. */
#define PP_ARRIVE(st)    cinfer_cp_async_mbarrier_arrive(kv_full + (unsigned)(st)*8u)
#define PP_COPY_IN_TURN  MASK_ROWS
#else
#define PP_ARRIVE(st) ((void)0)
#endif
/*
 * SOFTCAP_FIXED_MAX: a capped logit is bounded, so the softmax can subtract a fixed maximum rather
 * than track each row's. With the soft cap's h in S (kernels/soft_cap.cuh) the softmax's argument
 * x = 2 cap2 h lies in [-2 cap2, 0]; with the host's p.soft_cap_max = m every P = 2^(x - m) lies in
 * [2^(-2 cap2 - m), 2^-m], a window where P is a normal number of the mmas' dtype (ops/prefill.c).
 * No row maximum, no shuffles, no rescaling of O, and no wait of a tile's exp2 for its other
 * logits; the sum, O and the LSE are those of the running maximum up to rounding. Caps too large
 * for the window (p.soft_cap_fixed 0) keep the running maximum.
 */
#define SOFTCAP_FIXED_MAX                                                                          \
    (CINFER_SOFTCAP && !CINFER_VARIANT_LOGITS && VARIANT_USE_SOFTMAX && !VARIANT_STATE_INIT)
/*
 * A position bias (ALiBi) rises toward the diagonal by slope * TILE_KV per KV tile, so a row's
 * maximum grows on nearly every tile and O would be rescaled on each (a CPU model of the 16k
 * causal benchmark's data: 100% of a warp's tiles, against 43% for default attention; 61% with
 * the slack). With LAZY_MAX the running maximum is lazy (CINFER_LAZY_MAX_SLACK, common.cuh):
 * heads whose bias rises by less than the slack per tile skip most rescales. Default attention
 * keeps the exact maximum (and its instructions).
 */
#define LAZY_MAX   (CINFER_VARIANT_NO_TRANSFORM && VARIANT_ALIBI_SLOPE)
/*
 * The KV tile of a CTA's iteration t (in the kernel's scope). With LAZY_MAX the tiles go from the
 * last to the first (REVERSE_KV, FlashAttention-2's order): the bias is largest at the last tiles,
 * so the first tile visited sets a row's maximum and the later ones seldom raise it past the
 * slack. The contiguous K/V cursors (LOAD_KV) step backward then (by the tile's bytes, window or
 * not). H200, D = 128, 16k causal, same run (bench/RESULTS.md, developers' session 25): ALiBi's
 * share of plain 91-92% -> 92-94.5%.
 */
#define REVERSE_KV LAZY_MAX
#if REVERSE_KV
#define KV_TILE(t) (tile_begin + num_tiles - 1 - (t))
#else
#define KV_TILE(t) (tile_begin + (t))
#endif
/* 32-bit words of mask bits per row of a KV tile (VARIANT_LOGITS_MASK_BITS) */
#define MASK_WORDS CINFER_CEIL_DIV(TILE_KV, 32)
/*
 * A mask in its row form (VARIANT_LOGITS_MASK_ROW) travels with the K/V tiles: for each KV tile
 * and query row, the MASK_RAW_WORDS aligned words that hold the tile's bits are copied (cp.async)
 * into the row's slot of MASK_SLOT_WORDS words, whose last word holds the bit of the tile's first
 * position in the first. MASK_STAGES slots per row: the tiles in flight and the one computed.
 * Static shared memory, 2 KiB per slot stage and 2 KiB of row places at TILE_Q = 128: 6 KiB at
 * the D = 128 default (8 with fp8 K/V), so two CTAs still share an sm_90 SM (2 x (102 + 6 + 1
 * reserved) KiB of 228; 2 x (104 + 8 + 1) with fp8).
 */
#if CINFER_VARIANT_NO_TRANSFORM && VARIANT_LOGITS_MASK_ROW
#define MASK_ROWS       1
#define MASK_RAW_WORDS  (MASK_WORDS + 1)
#define MASK_SLOT_WORDS (MASK_RAW_WORDS + 1 <= 4 ? 4 : 8)
#define MASK_SLOT_BYTES (MASK_SLOT_WORDS * 4)
#define MASK_STAGES     (KV_AHEAD + 1)
/* The bits of a row's last mask word that belong to the tile */
#define MASK_LAST_BITS  (TILE_KV % 32 == 0 ? ~0u : (1u << (TILE_KV % 32)) - 1u)
#else
#define MASK_ROWS 0
#endif

#if D % 16 != 0 || TILE_KV % 16 != 0 || TILE_Q % (16 * WARPS) != 0 || STAGES < 2
#error "prefill: unsupported tile configuration (the spec validator should have refused it)"
#endif

/* GQA packing (see the top): PACK query heads per token in the tile's rows, 0 = off. */
#define PACK CINFER_GQA_PACK
#if PACK
#if !CINFER_BATCH || PACK > TILE_Q
#error "prefill: GQA packing needs a batch kernel and at most TILE_Q heads per group"
#endif
#define PACK_TOKENS (TILE_Q / PACK) /* whole query tokens per tile */
/* The CTAs of one work item: one per KV head (packed) or per query head */
#define CTA_HEADS   num_kv_heads
#else
#define CTA_HEADS num_qo_heads
#endif

/* The query token of tile row `row`, counted from the tile's first (q0). */
__device__ __forceinline__ int row_token(int row) {
#if PACK
    return (int)((unsigned)row / PACK);
#else
    return row;
#endif
}

/* The query head of tile row `row` of a CTA of query head `head` (packed: the group's first). */
__device__ __forceinline__ int row_head(int head, int row) {
#if PACK
    return head + (int)((unsigned)row % PACK);
#else
    return head;
#endif
}

/* Whether the KV tile at j0 crosses an edge of what the query tile's rows keep (q0 + delta: the
 * first row's position; q_span: the tile's query tokens; q_rows: its real rows, q_span x PACK
 * when packed): kv_len, the causal diagonal, the window's left end, and with partial_rows a tile
 * of fewer than TILE_Q real rows. Inside tiles keep every position for every row. */
__device__ __forceinline__ bool tile_crosses_edge(const cinfer_prefill_params &p, int j0, int q0,
                                                  int delta, int q_span, int q_rows,
                                                  bool partial_rows) {
    bool edge = j0 + TILE_KV > p.kv_len || (partial_rows && q_rows < TILE_Q);
#if CAUSAL
    edge = edge || j0 + TILE_KV - 1 > q0 + delta;
#endif
#if CINFER_WINDOW
    edge = edge || j0 < q0 + q_span - 1 + delta - p.window_left;
#endif
    return edge;
}

/* threadIdx.x, read where it is used (cinfer_opaque_u32): what the kernel derives from it there
 * (rows, columns) is computed on the spot instead of held in registers through the tile loop. */
__device__ __forceinline__ int thread_index(void) {
    return (int)cinfer_opaque_u32(threadIdx.x);
}

/* Byte offset of 16-byte chunk `chunk` of row `row` in a tile (see the layout above). */
__device__ __forceinline__ unsigned tile_offset(int row, int chunk) {
    return (unsigned)(row * ROW_BYTES + chunk * 16);
}

/* Byte offset of 16-byte chunk `chunk` of row `row` in a K or V tile. */
__device__ __forceinline__ unsigned kv_tile_offset(int row, int chunk) {
    return (unsigned)(row * KV_ROW_BYTES + chunk * 16);
}

/*
 * ldmatrix addresses split into a lane part and a compile-time part: a lane reads row R + row_l,
 * chunk C + c_l of a tile, R and C compile-time, at tile_offset(row_l, c_l) + IMM_OFFSET(R, C),
 * so every address in the unrolled loops is one register plus an immediate.
 */
#define IMM_OFFSET(R, C) ((R)*ROW_BYTES + (C)*16)

/*
 * Issues the cp.async copies of rows [row0, row0 + rows) of a strided [len, D] matrix into the
 * tile at smem (rows and cols compile-time constants after inlining). Rows >= len, and chunks >=
 * cols of each row (the columns a matrix narrower than D lacks, see D_QK), are zero-filled, so P =
 * 0 never meets a stale or uninitialized V value (0 * NaN would poison the output).
 *
 * When the chunks of a row divide the threads (D = 64, 128, 256, ...), each thread keeps one
 * chunk column and walks rows THREADS / CHUNKS apart, so a pass costs one pointer increment;
 * other head dims map every chunk separately.
 */
__device__ __forceinline__ void load_tile(unsigned smem, const cinfer_half_bits *base,
                                          long long stride, int row0, int len, int rows, int cols) {
#if THREADS % CHUNKS == 0
    const int rpp = THREADS / CHUNKS; /* rows per pass */
    const int r0 = (int)threadIdx.x / CHUNKS, ch = (int)threadIdx.x % CHUNKS;
    const cinfer_half_bits *src = base + (long long)(row0 + r0) * stride + ch * 8;
    const long long step = (long long)rpp * stride;
#pragma unroll
    for (int it = 0; it < CINFER_CEIL_DIV(rows, rpp); it++) {
        const int r = r0 + it * rpp;
        if (rows % rpp == 0 || r < rows) {
            const bool valid = row0 + r < len && (cols == CHUNKS || ch < cols);
            cinfer_cp_async_16(smem + tile_offset(r, ch), valid ? src + it * step : base, valid);
        }
    }
#else
#pragma unroll
    for (int it = 0; it < CINFER_CEIL_DIV(rows * CHUNKS, THREADS); it++) {
        const int c = (int)threadIdx.x + it * THREADS;
        if (c < rows * CHUNKS) {
            const int r = c / CHUNKS, ch = c % CHUNKS;
            const bool col = cols == CHUNKS || ch < cols; /* a column the matrix has */
            const bool valid = row0 + r < len && col;
            const cinfer_half_bits *src =
                base + (valid ? (long long)(row0 + r) * stride : 0) + (col ? ch * 8 : 0);
            cinfer_cp_async_16(smem + tile_offset(r, ch), src, valid);
        }
    }
#endif
}

#if PACK
/*
 * The cp.async copies of a packed Q tile (see the top): row r from token q0 + row_token(r) of
 * query head base's + r % PACK (base: the group's first head of the request's q); rows >= q_rows
 * are zero-filled. Once per CTA, so every chunk is mapped separately.
 */
__device__ __forceinline__ void load_q_packed(unsigned smem, const cinfer_half_bits *base,
                                              long long stride_n, long long stride_h, int q0,
                                              int q_rows) {
#pragma unroll
    for (int it = 0; it < CINFER_CEIL_DIV(TILE_Q * CHUNKS, THREADS); it++) {
        const int c = (int)threadIdx.x + it * THREADS;
        if ((TILE_Q * CHUNKS) % THREADS == 0 || c < TILE_Q * CHUNKS) {
            const int r = c / CHUNKS, ch = c % CHUNKS;
            const bool valid = r < q_rows;
            const long long at = valid ? (long long)(q0 + row_token(r)) * stride_n +
                                             (long long)(row_head(0, r)) * stride_h
                                       : 0;
            cinfer_cp_async_16(smem + tile_offset(r, ch), base + at + ch * 8, valid);
        }
    }
}
#endif

#if KV_FP8
/* load_tile for a K or V tile of fp8 rows, every chunk mapped separately (the copies of head
 * dims whose chunks do not divide the threads). */
__device__ __forceinline__ void load_kv_tile(unsigned smem, const kv_elem *base, long long stride,
                                             int row0, int len) {
#pragma unroll
    for (int it = 0; it < CINFER_CEIL_DIV(TILE_KV * KV_CHUNKS, THREADS); it++) {
        const int c = (int)threadIdx.x + it * THREADS;
        if (c < TILE_KV * KV_CHUNKS) {
            const int r = c / KV_CHUNKS, ch = c % KV_CHUNKS;
            const bool valid = row0 + r < len;
            const kv_elem *src =
                base + (valid ? (long long)(row0 + r) * stride : 0) + ch * KV_CHUNK_ELEMS;
            cinfer_cp_async_16(smem + kv_tile_offset(r, ch), src, valid);
        }
    }
}
#endif

/*
 * The K/V copies when a thread keeps one chunk column (THREADS % KV_CHUNKS == 0): pass `it`
 * copies row r0 + it * KV_RPP (r0 = threadIdx.x / KV_CHUNKS) of the tile, at the thread's
 * destination dst (kv_dst0: its chunk of row r0 in stage 0's K tile) plus a compile-time offset.
 */
#if KV_BY_COLUMN
#define KV_RPP    (THREADS / KV_CHUNKS) /* rows per pass */
#define KV_PASSES CINFER_CEIL_DIV(TILE_KV, KV_RPP)

__device__ __forceinline__ unsigned kv_dst0(unsigned s_k) {
    return s_k + kv_tile_offset((int)threadIdx.x / KV_CHUNKS, (int)threadIdx.x % KV_CHUNKS);
}
#endif

#if CINFER_PAGED
/*
 * The copies of K and V rows [row0, row0 + TILE_KV) of a paged request into the stage whose K
 * tile is `offset` bytes after stage 0's (dst: kv_dst0): row t is slot t % page_size of
 * page table[t / page_size] (table = the request's first page-table entry). With D_QK == D_VO
 * both caches share their strides, so each row's address is computed once for K and V; rows >=
 * len are zero-filled and never read an entry of their own (entries past the request's pages
 * may not exist).
 */
/* The page-table slot and the slot within its page of rows t[0 .. n), under one test of the page
 * size's form (n a compile-time constant after inlining: the arrays stay in registers). */
__device__ __forceinline__ void paged_rows(const cinfer_prefill_params &p, const int *t, int n,
                                           int *page_slot, int *in_page) {
    if (p.page_shift >= 0) {
#pragma unroll
        for (int i = 0; i < n; i++) {
            page_slot[i] = t[i] >> p.page_shift;
            in_page[i] = t[i] & ((1 << p.page_shift) - 1);
        }
    } else {
#pragma unroll
        for (int i = 0; i < n; i++) {
            page_slot[i] = t[i] / p.page_size;
            in_page[i] = t[i] - page_slot[i] * p.page_size;
        }
    }
}

/* The element offset of row t in a cache of page stride stride_page and slot stride stride_n. */
__device__ __forceinline__ long long paged_row_offset(const cinfer_prefill_params &p,
                                                      const int *table, int t,
                                                      long long stride_page, long long stride_n) {
    int page_slot, in_page;
    paged_rows(p, &t, 1, &page_slot, &in_page);
    return (long long)__ldg(table + page_slot) * stride_page + (long long)in_page * stride_n;
}

#if KV_BY_COLUMN
/*
 * A thread's rows are r0 + it * KV_RPP. Their page-table entries are read first, all of them,
 * then the copies go out: a row past len looks up the last row's entry instead (it exists; its
 * copy is zero-filled), so no branch separates the reads and they are in flight together rather
 * than one round trip per row before that row's copies. K and V share every stride (the host
 * checks), so one element offset serves both: page * k_stride_page + slot * stride_n + the
 * thread's head and chunk, products of the nonnegative page and slot (zero-extended) with the
 * signed strides as 64-bit integers.
 */
__device__ __forceinline__ void load_kv_paged(unsigned dst, unsigned offset,
                                              const cinfer_prefill_params &p, int kv_head,
                                              const int *table, int row0, int len) {
    const int tid = thread_index();
    const int r0 = tid / KV_CHUNKS, ch = tid % KV_CHUNKS;
    int row[KV_PASSES], page[KV_PASSES], in_page[KV_PASSES], page_slot[KV_PASSES];
#pragma unroll
    for (int it = 0; it < KV_PASSES; it++)
        row[it] = CINFER_MIN(row0 + r0 + it * KV_RPP, len - 1);
    paged_rows(p, row, KV_PASSES, page_slot, in_page);
#pragma unroll
    for (int it = 0; it < KV_PASSES; it++)
        page[it] = __ldg(table + page_slot[it]);
    const long long head_chunk = (long long)kv_head * p.k_stride_h + ch * KV_CHUNK_ELEMS;
#pragma unroll
    for (int it = 0; it < KV_PASSES; it++) {
        const int r = r0 + it * KV_RPP;
        if (TILE_KV % KV_RPP == 0 || r < TILE_KV) {
            const bool valid = row0 + r < len;
            const long long off = (long long)(unsigned)page[it] * p.k_stride_page +
                                  (long long)(unsigned)in_page[it] * p.k_stride_n + head_chunk;
            const unsigned to = dst + offset + it * KV_RPP * KV_ROW_BYTES;
            cinfer_cp_async_16(to, (const kv_elem *)p.k + off, valid);
            cinfer_cp_async_16(to + STAGES * KV_BYTES, (const kv_elem *)p.v + off, valid);
        }
    }
}
#else
__device__ __forceinline__ void load_kv_paged(unsigned s_k, unsigned s_v,
                                              const cinfer_prefill_params &p, const kv_elem *k_base,
                                              const kv_elem *v_base, const int *table, int row0,
                                              int len) {
#pragma unroll
    for (int it = 0; it < CINFER_CEIL_DIV(TILE_KV * KV_CHUNKS, THREADS); it++) {
        const int c = (int)threadIdx.x + it * THREADS;
        if (c < TILE_KV * KV_CHUNKS) {
            const int r = c / KV_CHUNKS, ch = c % KV_CHUNKS;
            const bool valid = row0 + r < len;
#if ASYM
            /* V has strides of its own; chunks past a matrix's own columns are zero-filled from
             * its base (see D_QK). */
            const bool k_ok = valid && ch < QK_CHUNKS, v_ok = valid && ch < VO_CHUNKS;
            const long long k_off =
                k_ok ? paged_row_offset(p, table, row0 + r, p.k_stride_page, p.k_stride_n) +
                           ch * KV_CHUNK_ELEMS
                     : 0;
            const long long v_off =
                v_ok ? paged_row_offset(p, table, row0 + r, p.v_stride_page, p.v_stride_n) +
                           ch * KV_CHUNK_ELEMS
                     : 0;
            cinfer_cp_async_16(s_k + kv_tile_offset(r, ch), k_base + k_off, k_ok);
            cinfer_cp_async_16(s_v + kv_tile_offset(r, ch), v_base + v_off, v_ok);
#else
            const long long off =
                (valid ? paged_row_offset(p, table, row0 + r, p.k_stride_page, p.k_stride_n) : 0) +
                ch * KV_CHUNK_ELEMS;
            cinfer_cp_async_16(s_k + kv_tile_offset(r, ch), k_base + off, valid);
            cinfer_cp_async_16(s_v + kv_tile_offset(r, ch), v_base + off, valid);
#endif
        }
    }
}
#endif
#elif KV_BY_COLUMN
/*
 * The copies of a contiguous K (or V) tile into the tile `offset` bytes after stage 0's K tile
 * (dst: kv_dst0): src points at this thread's first row of the tile (row0 + threadIdx.x /
 * KV_CHUNKS) and left is kv_len - row0. A tile that ends inside kv_len (all but the last) copies
 * without a bounds test; rows past kv_len are zero-filled from a mapped address (any: nothing is
 * read).
 */
__device__ __forceinline__ void load_kv_rows(unsigned dst, unsigned offset, const kv_elem *src,
                                             long long stride, int left, const void *mapped) {
    const int r0 = (int)threadIdx.x / KV_CHUNKS;
    const long long step = (long long)KV_RPP * stride;
    if (left >= TILE_KV) {
#pragma unroll
        for (int it = 0; it < KV_PASSES; it++)
            if (TILE_KV % KV_RPP == 0 || r0 + it * KV_RPP < TILE_KV)
                cinfer_cp_async_16(dst + offset + it * KV_RPP * KV_ROW_BYTES, src + it * step,
                                   true);
    } else {
#pragma unroll
        for (int it = 0; it < KV_PASSES; it++) {
            const int r = r0 + it * KV_RPP;
            if (TILE_KV % KV_RPP == 0 || r < TILE_KV) {
                const bool valid = r < left;
                cinfer_cp_async_16(dst + offset + it * KV_RPP * KV_ROW_BYTES,
                                   valid ? src + it * step : mapped, valid);
            }
        }
    }
}
#endif

/*
 * Issues the cp.async copies of KV tile `tile` (rows tile * TILE_KV ..) into stage `stage`, dst
 * being the thread's kv_dst0. Tiles are issued in order, one call each: a contiguous K/V keeps
 * cursors k_next and v_next at this thread's first row of the next tile, so a row's address is
 * an add.
 *
 * The cursors step by the host's k_tile_bytes / v_tile_bytes (prefill_params.h): computed here
 * from the stride, the step was a constant load and a shift into registers that the tile's copies
 * had just read their addresses from, and each tile waited for those copies to leave the issue
 * queue first (ncu, bench/RESULTS.md 2026-11-30: 4% of the 16k kernel's stall samples). Measured
 * +2-3% for plain and soft cap at 4k and 16k, but -6% for the sliding window (the same instruction
 * mix; 251 against 255 registers), so window kernels keep the computed step.
 */
#if REVERSE_KV
#define KV_STEP(ptr, stride, bytes) ((const kv_elem *)((const char *)(ptr) - (bytes)))
#elif CINFER_WINDOW
#define KV_STEP(ptr, stride, bytes) ((ptr) + TILE_KV * (stride))
#else
#define KV_STEP(ptr, stride, bytes) ((const kv_elem *)((const char *)(ptr) + (bytes)))
#endif
#if !KV_BY_COLUMN
#define LOAD_KV(stage, tile, dst)                                                                  \
    LOAD_KV_GENERIC(s_k + (stage)*KV_BYTES, s_v + (stage)*KV_BYTES, (tile)*TILE_KV)
#elif CINFER_PAGED
#define LOAD_KV(stage, tile, dst)                                                                  \
    load_kv_paged(dst, (stage)*KV_BYTES, p, kv_head, p.kv_indices, (tile)*TILE_KV, p.kv_len)
#else
#define LOAD_KV(stage, tile, dst)                                                                  \
    do {                                                                                           \
        load_kv_rows(dst, (stage)*KV_BYTES, k_next, p.k_stride_n, p.kv_len - (tile)*TILE_KV,       \
                     PARAMS.k);                                                                    \
        load_kv_rows(dst, ((stage) + STAGES) * KV_BYTES, v_next, p.v_stride_n,                     \
                     p.kv_len - (tile)*TILE_KV, PARAMS.v);                                         \
        k_next = KV_STEP(k_next, p.k_stride_n, p.k_tile_bytes);                                    \
        v_next = KV_STEP(v_next, p.v_stride_n, p.v_tile_bytes);                                    \
    } while (0)
#endif
#if CINFER_PAGED
#define LOAD_KV_GENERIC(sk, sv, row0)                                                              \
    load_kv_paged(sk, sv, p, k_base, v_base, p.kv_indices, row0, p.kv_len)
#else
#if KV_FP8
#define LOAD_KV_GENERIC(sk, sv, row0)                                                              \
    do {                                                                                           \
        load_kv_tile(sk, k_base, p.k_stride_n, row0, p.kv_len);                                    \
        load_kv_tile(sv, v_base, p.v_stride_n, row0, p.kv_len);                                    \
    } while (0)
#else
#define LOAD_KV_GENERIC(sk, sv, row0)                                                              \
    do {                                                                                           \
        load_tile(sk, k_base, p.k_stride_n, row0, p.kv_len, TILE_KV, QK_CHUNKS);                   \
        load_tile(sv, v_base, p.v_stride_n, row0, p.kv_len, TILE_KV, VO_CHUNKS);                   \
    } while (0)
#endif
#endif

#if KV_FP8
/*
 * Rewrites the loaded Q tile at s_q in place as the A operand against fp8 K/V (see the top): fp16
 * of q * q_in_scale. Once per CTA, before the first tile's conversion barrier.
 */
__device__ __forceinline__ void convert_q(unsigned s_q, float q_in_scale) {
    for (int c = thread_index(); c < TILE_Q * CHUNKS; c += THREADS) {
        const unsigned at = s_q + tile_offset(c / CHUNKS, c % CHUNKS);
        float f[8];
        cinfer_unpack8(f, DT, cinfer_ld_shared_v4(at));
#pragma unroll
        for (int i = 0; i < 8; i++)
            f[i] *= q_in_scale;
        cinfer_st_shared_v4(at, cinfer_pack8(CINFER_DT_F16, f));
    }
}

/* The fp8 chunks of a K (or V) tile, and the passes of the threads over them (convert_kv). */
#define CONVERT_UNITS  (TILE_KV * KV_CHUNKS)
#define CONVERT_PASSES CINFER_CEIL_DIV(CONVERT_UNITS, THREADS)
/* Units whose loads are in flight together (4 registers each): all of K and V at the D = 128
 * default, where the O accumulators leave about 32 registers free, and a bound on what tiles of
 * more units per thread keep live. */
#define CONVERT_GROUP  8

/* The row and chunk of the unit that pass `it` of thread tid converts (ch may pass KV_CHUNKS in
 * the last pass). */
__device__ __forceinline__ void convert_unit(int tid, int it, int *row, int *ch) {
#if THREADS % TILE_KV == 0
    *row = tid % TILE_KV;
    *ch = tid / TILE_KV + it * (THREADS / TILE_KV);
#else /* both are powers of two: TILE_KV % THREADS == 0 */
    *row = tid + (it % (TILE_KV / THREADS)) * THREADS;
    *ch = it / (TILE_KV / THREADS);
#endif
}

/*
 * Converts the fp8 K and V tiles of a stage (src: its K tile; V's is STAGES stages later) into the
 * fp16 tiles (dst: the K one, V's after it) of the 16-bit layout above. A unit is one 16-byte fp8
 * chunk (16 dims of a row), two fp16 chunks out; the threads take consecutive rows of one chunk
 * column, so the 8 rows of a quarter warp's load and of each of its two stores lie an odd number
 * of 16-byte chunks apart: 8 different bank groups. Whole columns per pass (THREADS % TILE_KV ==
 * 0) or whole passes per column: every address is the thread's own plus a compile-time offset.
 * The loads of CONVERT_GROUP units are issued before their first store (the shared-memory
 * accesses are volatile and stay in order), so their latencies overlap.
 */
__device__ __forceinline__ void convert_kv(unsigned dst, unsigned src) {
    const int tid = thread_index();
#pragma unroll
    for (int j0 = 0; j0 < 2 * CONVERT_PASSES; j0 += CONVERT_GROUP) {
        /* Unit j: pass j % CONVERT_PASSES of K (j < CONVERT_PASSES) or V. */
        uint4 in[CONVERT_GROUP];
#pragma unroll
        for (int j = j0; j < j0 + CONVERT_GROUP && j < 2 * CONVERT_PASSES; j++) {
            int row, ch;
            convert_unit(tid, j % CONVERT_PASSES, &row, &ch);
            if (CONVERT_UNITS % THREADS == 0 || ch < KV_CHUNKS)
                in[j - j0] = cinfer_ld_shared_v4(src + (j / CONVERT_PASSES) * STAGES * KV_BYTES +
                                                 kv_tile_offset(row, ch));
        }
#pragma unroll
        for (int j = j0; j < j0 + CONVERT_GROUP && j < 2 * CONVERT_PASSES; j++) {
            int row, ch;
            convert_unit(tid, j % CONVERT_PASSES, &row, &ch);
            if (CONVERT_UNITS % THREADS == 0 || ch < KV_CHUNKS) {
                const unsigned w[4] = {in[j - j0].x, in[j - j0].y, in[j - j0].z, in[j - j0].w};
                unsigned h[8];
#pragma unroll
                for (int i = 0; i < 4; i++)
                    cinfer_fp8x4_to_f16x2x2_bits(CINFER_DTYPE_KV, w[i], &h[2 * i], &h[2 * i + 1]);
                const unsigned at =
                    dst + (j / CONVERT_PASSES) * TILE_KV * ROW_BYTES + tile_offset(row, 2 * ch);
                cinfer_st_shared_v4(at, make_uint4(h[0], h[1], h[2], h[3]));
                cinfer_st_shared_v4(at + 16, make_uint4(h[4], h[5], h[6], h[7]));
            }
        }
    }
}
#endif

#if CINFER_ROPE
/*
 * RoPE of rows [0, rows) of a tile in shared memory (generic pointer tile: row r at position
 * pos0 + r, or pos0 + row_token(r) for the Q tile's rows (is_q true)), in place. A unit of work
 * is one row's 8 pairs (m .. m + 7, chunk m / 8 and its partner chunk m / 8 + D / 16), the threads
 * taking consecutive units. freq: the pairs' frequencies (pos_rope.cuh). The caller synchronizes
 * before and after.
 */
#define ROPE_UNITS (D / 16) /* units per row */
__device__ __forceinline__ void rope_tile(unsigned char *tile, int rows, int pos0,
                                          const float2 *freq, bool is_q) {
    for (int u = thread_index(); u < rows * ROPE_UNITS; u += THREADS) {
        const int row = u / ROPE_UNITS, ch = u % ROPE_UNITS;
        uint4 *lo_p = (uint4 *)(tile + tile_offset(row, ch));
        uint4 *hi_p = (uint4 *)(tile + tile_offset(row, ch + ROPE_UNITS));
        float lo[8], hi[8];
        float2 f[8];
        cinfer_unpack8(lo, DT, *lo_p);
        cinfer_unpack8(hi, DT, *hi_p);
#pragma unroll
        for (int i = 0; i < 8; i++)
            f[i] = freq[ch * 8 + i];
        cinfer_rope_rotate8(lo, hi, (float)(pos0 + (is_q ? row_token(row) : row)), f);
        *lo_p = cinfer_pack8(DT, lo);
        *hi_p = cinfer_pack8(DT, hi);
    }
}
#endif

#if MASK_ROWS
/*
 * Writes the place of the mask of each query row this thread copies (rows threadIdx.x + k
 * THREADS of the tile) at row_at + 16 row: the generic address of the aligned word that holds the
 * row's position 0 (low, high half), that position's bit in it, and 1 if the row exists. A row
 * past q_rows takes the last row's place with 0 (its slots are zero-filled, but every address
 * the copies name is one of the mask's words). Only this thread reads them back (load_mask), so
 * no barrier is needed.
 */
__device__ __forceinline__ void mask_rows_init(unsigned row_at, const cinfer_variant_params *vp,
                                               int batch_idx, int pos0, int q_rows, int head,
                                               int kv_head) {
#pragma unroll
    for (int it = 0; it < CINFER_CEIL_DIV(TILE_Q, THREADS); it++) {
        const int r = (int)threadIdx.x + it * THREADS;
        if (TILE_Q % THREADS == 0 || r < TILE_Q) {
            int64_t bit;
            const int row = CINFER_MIN(r, q_rows - 1);
            const uint32_t *words = variant_logits_mask_row(vp, batch_idx, pos0 + row_token(row),
                                                            row_head(head, row), kv_head, &bit);
            const uint64_t first = (uint64_t)(words + (bit >> 5));
            cinfer_st_shared_v4(row_at + r * 16,
                                make_uint4((unsigned)first, (unsigned)(first >> 32),
                                           (unsigned)(bit & 31), r < q_rows));
        }
    }
}

/*
 * Issues the cp.async copies of the mask words of the KV tile at positions j0 .. j0 + TILE_KV - 1
 * into the slots of one stage (slots: row 0's), for this thread's rows (mask_rows_init). A word
 * is copied when it holds the bit of a position below kv_len of a row that exists, else
 * zero-filled from the last word that does (nothing is read, but the address is the mask's); the
 * slot's last word receives the tile's first bit. The copies join the tile's K/V group.
 */
__device__ __forceinline__ void load_mask(unsigned slots, unsigned row_at, int j0, int kv_len) {
    const int tid = thread_index();
#pragma unroll
    for (int it = 0; it < CINFER_CEIL_DIV(TILE_Q, THREADS); it++) {
        const int r = tid + it * THREADS;
        if (TILE_Q % THREADS == 0 || r < TILE_Q) {
            const uint4 at = cinfer_ld_shared_v4(row_at + r * 16);
            /* The tile's first bit, counted from the row's word, is b = at.z + j0: with whole
             * words per tile, bit at.z (< 32) of word j0 / 32. */
            const int b = (int)at.z + j0;
            const int first = TILE_KV % 32 == 0 ? j0 / 32 : b >> 5;
            const int shift = TILE_KV % 32 == 0 ? (int)at.z : b & 31;
            /* Addresses in 64-bit integers with 32-bit offsets (an add each, not a sign-extended
             * multiply-add per word) */
            const uint64_t src = (((uint64_t)at.y << 32) | at.x) + 4u * (unsigned)first;
            /* The word of the tile's last position below kv_len */
            const unsigned last = (unsigned)(shift + CINFER_MIN(TILE_KV, kv_len - j0) - 1) / 32;
            const unsigned dst = slots + r * MASK_SLOT_BYTES;
#pragma unroll
            for (unsigned k = 0; k < MASK_RAW_WORDS; k++)
                cinfer_cp_async_4(dst + 4 * k, (const void *)(src + 4u * CINFER_MIN(k, last)),
                                  at.w && k <= last);
            cinfer_st_shared_u32(dst + 4 * (MASK_SLOT_WORDS - 1), (unsigned)shift);
        }
    }
}

/* The MASK_WORDS bit words of one row's slot at `at` (bit k of word w: position j0 + 32 w + k).
 * The loads are volatile, so that a second read of the same slot in a tile is not merged with the
 * first (which would keep its words in registers in between). */
__device__ __forceinline__ void mask_slot_bits(uint32_t *bits, unsigned at) {
    uint32_t w[MASK_SLOT_WORDS];
#pragma unroll
    for (int i = 0; i < MASK_SLOT_WORDS; i += 4) {
        uint4 v;
        asm volatile("ld.volatile.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
                     : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                     : "r"(at + 4 * i)
                     : "memory");
        w[i] = v.x;
        w[i + 1] = v.y;
        w[i + 2] = v.z;
        w[i + 3] = v.w;
    }
#pragma unroll
    for (int i = 0; i < MASK_WORDS; i++)
        bits[i] = __funnelshift_r(w[i], w[i + 1], w[MASK_SLOT_WORDS - 1]);
}

/* The slot of this lane's first row (row_base) for loop tile t, at slots (stage 0's), from the
 * thread index read anew (not an address held through the loop). */
__device__ __forceinline__ unsigned mask_lane_slot(unsigned slots, int t) {
    const unsigned tid = cinfer_opaque_u32(threadIdx.x);
    return slots + (t % MASK_STAGES) * (TILE_Q * MASK_SLOT_BYTES) +
           ((tid / 32) * WARP_ROWS + (tid % 32) / 4) * MASK_SLOT_BYTES;
}

/* The mask words of iteration n's tile into slot stage n % MASK_STAGES. */
#define LOAD_MASK(n)                                                                               \
    load_mask(s_mask + ((n) % MASK_STAGES) * (TILE_Q * MASK_SLOT_BYTES), s_mask_at,                \
              KV_TILE(n) * TILE_KV, p.kv_len)
#else
#define LOAD_MASK(n) ((void)0)
#endif

/* A batch kernel rebases a local copy p of its parameters; a single one reads them in place. */
#if CINFER_BATCH
#define PARAMS params
#else
#define PARAMS p
#endif

extern "C" __global__ void __launch_bounds__(THREADS, 1)
    CINFER_KERNEL_NAME(const cinfer_prefill_params PARAMS,
                       const cinfer_variant_params vp CINFER_ROPE_KERNEL_PARAM) {
    extern __shared__ uint4 smem[];
    const unsigned s_q = cinfer_smem_addr(smem);
    const unsigned s_k = s_q + TILE_Q * ROW_CHUNKS * 16;
    const unsigned s_v = s_k + STAGES * KV_BYTES;
#if KV_FP8
    const unsigned s_k16 = s_v + STAGES * KV_BYTES; /* the fp16 tiles (see the top) */
    const unsigned s_v16 = s_k16 + TILE_KV * ROW_BYTES;
#endif
#if MASK_ROWS
    /* The mask rows' places and slots (MASK_ROWS) */
    __shared__ uint4 mask_row_at[TILE_Q];
    __shared__ uint4 mask_slots[MASK_STAGES * TILE_Q * MASK_SLOT_WORDS / 4];
    const unsigned s_mask_at = (unsigned)__cvta_generic_to_shared(mask_row_at),
                   s_mask = (unsigned)__cvta_generic_to_shared(mask_slots);
#endif

    const int warp = (int)threadIdx.x / 32, lane = (int)threadIdx.x % 32;
#if PACK
    /* The group of query heads [head, head + PACK) of KV head kv_head. */
    const int kv_head = (int)(blockIdx.x % (unsigned)PARAMS.num_kv_heads);
    const int head = kv_head * PACK;
#else
    const int head = (int)(blockIdx.x % (unsigned)PARAMS.num_qo_heads);
#endif
#if CINFER_BATCH
    /* The work item; then p describes its request alone: lengths from the item, and q, out, lse
     * (and a ragged K/V, or the page table) start at the request's first row. */
    const unsigned item = blockIdx.x / (unsigned)params.CTA_HEADS;
    if (item >= (unsigned)params.header->num_work)
        return; /* a spare CTA of a CUDA-graph grid */
    const cinfer_prefill_work w = params.work[item];
    /* The split-KV merge (a programmatic dependent launch) may start its blocks now: they wait
     * for this grid to finish before they read a partial state. */
    cinfer_pdl_launch_dependents();
    cinfer_prefill_params p = params;
    p.qo_len = w.qo_len;
    p.kv_len = w.kv_len;
    p.q = (const cinfer_half_bits *)p.q + (long long)w.qo_begin * p.q_stride_n;
    p.out = (cinfer_half_bits *)p.out + (long long)w.qo_begin * p.out_stride_n;
    if (p.lse)
        p.lse += (long long)w.qo_begin * p.lse_stride_n;
#if CINFER_PAGED
    p.kv_indices += w.kv_begin;
#else
    p.k = (const kv_elem *)p.k + (long long)w.kv_begin * p.k_stride_n;
    p.v = (const kv_elem *)p.v + (long long)w.kv_begin * p.v_stride_n;
#endif
    [[maybe_unused]] const int batch_idx = w.request; /* the variants' hooks take it */
    const int q0 = w.q_begin;
#else
    [[maybe_unused]] const int batch_idx = 0;
    const int q_tile = p.num_q_tiles - 1 - (int)(blockIdx.x / (unsigned)p.num_qo_heads);
    const int q0 = q_tile * TILE_Q;
#endif
#if PACK
    /* The tile's query tokens (q_span), each in PACK rows. */
    const int q_span = CINFER_MIN(PACK_TOKENS, p.qo_len - q0);
    const int q_rows = q_span * PACK;
#else
    const int kv_head = head / (p.num_qo_heads / p.num_kv_heads);
    const int q_rows = CINFER_MIN(TILE_Q, p.qo_len - q0);
    const int q_span = q_rows; /* the tile's query tokens */
#endif
    /* Row i's absolute position is i + delta (bottom-right aligned). All lengths are below 2^30
     * (CINFER_PREFILL_MAX_LEN), so positions and their differences fit an int. */
    const int delta = p.kv_len - p.qo_len;

    /* The KV tiles some row of the tile keeps (a split item: of its chunk). */
    int tile_begin;
#if CINFER_BATCH
    const int num_tiles =
        cinfer_prefill_kv_tiles(TILE_KV, q0, q_span, delta, p.kv_len, p.window_left, w.chunk_begin,
                                w.chunk_end, &tile_begin);
#else
    const int num_tiles = cinfer_prefill_kv_tiles(TILE_KV, q0, q_span, delta, p.kv_len,
                                                  p.window_left, 0, 0, &tile_begin);
#endif

    const cinfer_half_bits *q_base = (const cinfer_half_bits *)p.q + (long long)head * p.q_stride_h;
    /* Not read by every configuration below: */
    [[maybe_unused]] const kv_elem *k_base =
        (const kv_elem *)p.k + (long long)kv_head * p.k_stride_h;
    [[maybe_unused]] const kv_elem *v_base =
        (const kv_elem *)p.v + (long long)kv_head * p.v_stride_h;
#if KV_BY_COLUMN && !CINFER_PAGED
    /* This thread's first row of the first tile (load_kv_rows). */
    const int kv_row0 = KV_TILE(0) * TILE_KV + (int)threadIdx.x / KV_CHUNKS;
    const int kv_col0 = ((int)threadIdx.x % KV_CHUNKS) * KV_CHUNK_ELEMS;
    const kv_elem *k_next = k_base + (long long)kv_row0 * p.k_stride_n + kv_col0;
    const kv_elem *v_next = v_base + (long long)kv_row0 * p.v_stride_n + kv_col0;
#endif

    /* This lane's rows: m tile mq, half h (0: row lane / 4, 1: row lane / 4 + 8). */
    [[maybe_unused]] const int row_base = warp * WARP_ROWS + lane / 4;
    /* This lane's ldmatrix sources at their tiles' origins (IMM_OFFSET adds the rest): Q
     * (this warp's rows) and V matrices are rows lane % 16, chunk lane / 16; K matrices are rows
     * (lane / 16) * 8 + lane % 8, chunk (lane / 8) % 2. V's and K's are in stage 0 (another
     * stage adds a multiple of KV_BYTES), or in the fp16 tiles. */
    const unsigned q_lane = s_q + tile_offset(warp * WARP_ROWS + lane % 16, lane / 16);
#if KV_FP8
    const unsigned k_lane = s_k16 + tile_offset((lane / 16) * 8 + lane % 8, (lane / 8) % 2);
    const unsigned v_lane = s_v16 + tile_offset(lane % 16, lane / 16);
#else
    const unsigned k_lane = s_k + tile_offset((lane / 16) * 8 + lane % 8, (lane / 8) % 2);
    const unsigned v_lane = s_v + tile_offset(lane % 16, lane / 16);
#endif
#if KV_BY_COLUMN
    const unsigned kv_dst = kv_dst0(s_k);
#endif
    float o[MMA_Q][O_TILES][4];
    [[maybe_unused]] float m[MMA_Q][2]; /* (unused without softmax) */
    float d[MMA_Q][2];
#pragma unroll
    for (int mq = 0; mq < MMA_Q; mq++) {
#pragma unroll
        for (int h = 0; h < 2; h++) {
            m[mq][h] = -CINFER_INF;
            d[mq][h] = 0.0f;
        }
#pragma unroll
        for (int n = 0; n < O_TILES; n++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                o[mq][n][e] = 0.0f;
    }
#if SOFTCAP_FIXED_MAX
    const bool fixed_max = p.soft_cap_fixed != 0;
    if (fixed_max) {
#pragma unroll
        for (int mq = 0; mq < MMA_Q; mq++)
#pragma unroll
            for (int h = 0; h < 2; h++)
                m[mq][h] = p.soft_cap_max;
    }
#else
    [[maybe_unused]] const bool fixed_max = false;
#endif
#if VARIANT_STATE_INIT
    /* The variant's initial state (e.g. a sink logit); the denominator is kept per lane and
     * summed over the quad at the end, so one lane of the four holds it. A split tile's rows take
     * it in their first chunk only (the merge adds up the chunks' denominators). */
#pragma unroll
    for (int mq = 0; mq < MMA_Q; mq++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int row = row_base + mq * 16 + h * 8;
#if CINFER_BATCH
            if (row < q_rows && w.chunk == 0) {
#else
            if (row < q_rows) {
#endif
                float mi = -CINFER_INF, di = 0.0f;
                variant_state_init(&vp, batch_idx, q0 + row_token(row) + delta, row_head(head, row),
                                   &mi, &di);
                m[mq][h] = mi;
                d[mq][h] = lane % 4 == 0 ? di : 0.0f;
            }
        }
#endif

#if CINFER_VARIANT_NO_TRANSFORM
    /* The host's q_scale is in natural-log units for a variant with logit hooks; a mask and a
     * position bias never show a logit to the variant, so the kernel works in base 2 itself: the
     * logits are q_scale2 (q . k), or with a position bias q_scale2 (q . k + slope_qk (j - pos)),
     * scaled by the softmax as default attention's are. The bias is in the units of q . k
     * (slope / q_scale; q_scale > 0) so that it can start the accumulators of Q K^T. The slope
     * depends only on the request and the head: one hook call per CTA (packed: per row of the
     * lane, whose heads differ). */
    const float q_scale2 = p.q_scale * CINFER_LOG2E;
    const float scale = q_scale2;
#if VARIANT_ALIBI_SLOPE && PACK
    float slope_qk[MMA_Q][2];
#pragma unroll
    for (int mq = 0; mq < MMA_Q; mq++)
#pragma unroll
        for (int h = 0; h < 2; h++)
            slope_qk[mq][h] =
                variant_alibi_slope(&vp, batch_idx, row_head(head, row_base + mq * 16 + h * 8)) /
                p.q_scale;
#elif VARIANT_ALIBI_SLOPE
    const float slope_qk = variant_alibi_slope(&vp, batch_idx, head) / p.q_scale;
#endif
#elif CINFER_VARIANT_LOGITS
    [[maybe_unused]] const float scale = CINFER_LOG2E; /* hooks yield natural-log logits */
#elif CINFER_SOFTCAP
    /* The soft cap leaves h in S (kernels/soft_cap.cuh): the base-2 logit is cap2 + 2 cap2 h, so
     * the softmax scales by 2 cap2 and works on logits shifted by -cap2, which only the LSE sees
     * (it adds cap2 back). */
    const float scale = 2.0f * p.soft_cap_log2;
    const float y_scale = p.q_scale * CINFER_SOFT_CAP_Y_PER_X;
#else
    const float scale = p.q_scale;
#endif

#if CINFER_ROPE
    /* The pairs' frequencies, from the host's table; the loop's first barrier publishes them. */
    __shared__ float2 rope_freq[D / 2];
    cinfer_rope_freq_init(rope_freq, rope, D, (int)threadIdx.x, THREADS);
#endif

    if (num_tiles > 0) {
#if PINGPONG
        /* One mbarrier per stage, expecting every thread's copies. */
        __shared__ unsigned long long kv_full_bars[STAGES];
        const unsigned kv_full = cinfer_smem_addr(kv_full_bars);
        const int wg = (int)threadIdx.x / 128;
        if (threadIdx.x == 0)
            for (int st = 0; st < STAGES; st++)
                cinfer_mbarrier_init(kv_full + (unsigned)st * 8u, THREADS);
        __syncthreads();
#endif
#if MASK_ROWS
        mask_rows_init(s_mask_at, &vp, batch_idx, q0 + delta, q_rows, head, kv_head);
#endif
#if PACK
        load_q_packed(s_q, q_base, p.q_stride_n, p.q_stride_h, q0, q_rows);
#else
        load_tile(s_q, q_base, p.q_stride_n, q0, p.qo_len, TILE_Q, QK_CHUNKS);
#endif
        cinfer_cp_async_commit();
#pragma unroll
        for (int s = 0; s < KV_AHEAD; s++) {
            if (s < num_tiles) {
                LOAD_KV(s, KV_TILE(s), kv_dst);
                LOAD_MASK(s);
                PP_ARRIVE(s); /* stage 0's arrival also covers Q (copied first) */
            }
            cinfer_cp_async_commit();
        }
#if PINGPONG
        if (wg == 1)
            PP_TURN_PASS(1); /* group 0 takes the first turn */
#endif

        /* Q's fragments, when they stay in registers (Q_IN_REGS) */
        [[maybe_unused]] unsigned qf[Q_IN_REGS ? MMA_Q : 1][Q_IN_REGS ? K_STEPS : 1][4];
        for (int t = 0; t < num_tiles; t++) {
            const int stage = t % STAGES;
            /* This iteration's copies of the per-lane addresses (cinfer_opaque_u32): each
             * ldmatrix and cp.async below addresses one of them plus an immediate. */
            const unsigned ql = cinfer_opaque_u32(q_lane), kl = cinfer_opaque_u32(k_lane),
                           vl = cinfer_opaque_u32(v_lane);
#if KV_BY_COLUMN
            const unsigned dl = cinfer_opaque_u32(kv_dst);
#endif
            /* Groups committed so far: Q, KV_AHEAD prologue tiles, t loop tiles; Q and tiles
             * 0..t must be complete, so KV_AHEAD - 1 may still be in flight. */
#if PINGPONG
            cinfer_mbarrier_wait(kv_full + (unsigned)stage * 8u, (unsigned)(t / STAGES) & 1u);
#else
            CINFER_CP_ASYNC_WAIT(KV_AHEAD - 1);
            __syncthreads();
#endif
#if !KV_FP8
            /* The copies of tile t + STAGES - 1, into the stage the barrier above just freed:
             * here, or with KV_COPY_LATE after this tile's Q K^T mmas (ISSUE_NEXT_KV below); with
             * PINGPONG the wait above frees no stage, and the copies go after the group's P V turn
             * (MASK_ROWS: at its start), where tile t - 1's stage is known to be free. */
#define ISSUE_NEXT_KV()                                                                            \
    do {                                                                                           \
        const int next = t + STAGES - 1;                                                           \
        if (next < num_tiles) {                                                                    \
            LOAD_KV((stage + STAGES - 1) % STAGES, KV_TILE(next), dl);                             \
            LOAD_MASK(next);                                                                       \
            PP_ARRIVE((stage + STAGES - 1) % STAGES);                                              \
        }                                                                                          \
        cinfer_cp_async_commit();                                                                  \
    } while (0)
#if !KV_COPY_LATE && !PINGPONG
            ISSUE_NEXT_KV();
#endif
#endif
#if CINFER_ROPE
            /* Rotate Q (first tile only) and this K tile in place before any warp reads them:
             * rows that exist, at their absolute positions. */
            {
                unsigned char *const base = (unsigned char *)smem;
                if (t == 0)
                    rope_tile(base, q_rows, q0 + delta, rope_freq, true);
                const int k0 = KV_TILE(t) * TILE_KV;
                rope_tile(base + (s_k - s_q) + stage * KV_BYTES, CINFER_MIN(TILE_KV, p.kv_len - k0),
                          k0, rope_freq, false);
                __syncthreads();
            }
#endif
#if VARIANT_QUERY_TRANSFORM
            if (t == 0) {
                /* Transform the Q tile in place before any warp reads it. */
                for (int c = (int)threadIdx.x; c < TILE_Q * CHUNKS; c += THREADS) {
                    const int row = c / CHUNKS, ch = c % CHUNKS;
                    if (row < q_rows && (QK_CHUNKS == CHUNKS || ch < QK_CHUNKS)) {
                        uint4 *qp = (uint4 *)((unsigned char *)smem + tile_offset(row, ch));
                        float f[8];
                        cinfer_unpack8(f, DT, *qp);
#pragma unroll
                        for (int i = 0; i < 8; i++)
                            f[i] = variant_query_transform(&vp, f[i], batch_idx,
                                                           q0 + row_token(row) + delta,
                                                           row_head(head, row), ch * 8 + i);
                        *qp = cinfer_pack8(DT, f);
                    }
                }
                __syncthreads();
            }
#endif
#if KV_FP8
            /* Q (first tile only) and this tile to fp16 before any warp reads them; then this
             * stage is free for the tile KV_AHEAD = STAGES ahead. */
            if (t == 0)
                convert_q(s_q, p.q_in_scale);
            convert_kv(s_k16, s_k + stage * KV_BYTES);
            __syncthreads();
            {
                const int next = t + STAGES;
                if (next < num_tiles) {
                    LOAD_KV(stage, KV_TILE(next), dl);
                    LOAD_MASK(next);
                }
                cinfer_cp_async_commit();
            }
#endif
#if Q_IN_REGS
            if (t == 0) {
#pragma unroll
                for (int mq = 0; mq < MMA_Q; mq++)
#pragma unroll
                    for (int kk = 0; kk < K_STEPS; kk++)
                        cinfer_ldmatrix_x4(qf[mq][kk], ql + IMM_OFFSET(mq * 16, 2 * kk));
            }
#endif
            const int j0 = KV_TILE(t) * TILE_KV;

#if CINFER_VARIANT_NO_TRANSFORM && VARIANT_LOGITS_MASK_BITS && !MASK_ROWS
            /* This tile's mask words, loaded before Q K^T so that the loads' latency hides under
             * the MMAs. Straight-line calls, each for a row and a first position that exist: a
             * missing row asks for the tile's last row (its logits are never stored), a word
             * that starts at or past kv_len for the tile's first one (the mask below drops
             * positions past kv_len). */
            uint32_t bits[MMA_Q][2][MASK_WORDS];
#pragma unroll
            for (int mq = 0; mq < MMA_Q; mq++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const int row = CINFER_MIN(row_base + mq * 16 + h * 8, q_rows - 1);
#pragma unroll
                    for (int w = 0; w < MASK_WORDS; w++) {
                        const int first = j0 + 32 * w < p.kv_len ? j0 + 32 * w : j0;
                        bits[mq][h][w] = variant_logits_mask_bits(
                            &vp, batch_idx, q0 + row_token(row) + delta, first,
                            CINFER_MIN(32, p.kv_len - first), row_head(head, row), kv_head);
                    }
                }
#endif
#if MASK_ROWS
            /* Whether the warp's rows keep every position of this tile (full): then an inside tile
             * needs no mask test. Each lane of a quad reads one of the quad's rows (row lane / 4 +
             * 8 (lane % 4) of the warp's 32, or of its 16 twice) from the tile's slot stage
             * t % MASK_STAGES; the mask test below reads the lane's own rows again rather than
             * keeping their words through Q K^T. Zero-filled words (rows past q_rows,
             * positions past kv_len) are in edge tiles only. */
            bool full;
            {
                uint32_t words[MASK_WORDS], all = ~0u;
                mask_slot_bits(words, mask_lane_slot(s_mask, t) +
                                          (thread_index() % 4) % (2 * MMA_Q) * 8 * MASK_SLOT_BYTES);
#pragma unroll
                for (int w = 0; w < MASK_WORDS; w++)
                    all &= words[w] | (w == MASK_WORDS - 1 ? ~MASK_LAST_BITS : 0u);
                full = __all_sync(0xffffffffu, all == ~0u);
            }
#endif

            /* S = Q K^T. A position bias starts the accumulators: slope_qk (j - pos) is bias0 (this
             * lane's first element: its first position less its first row's) plus slope_qk times
             * the element's compile-time offset from it, one fma per logit and none after the
             * mmas. */
#if CINFER_VARIANT_NO_TRANSFORM && VARIANT_ALIBI_SLOPE && PACK
            /* Packed: each of the lane's rows has its own slope and position. */
            float bias0[MMA_Q][2];
#pragma unroll
            for (int mq = 0; mq < MMA_Q; mq++)
#pragma unroll
                for (int h = 0; h < 2; h++)
                    bias0[mq][h] = slope_qk[mq][h] *
                                   (float)(j0 + 2 * (lane % 4) -
                                           (q0 + row_token(row_base + mq * 16 + h * 8) + delta));
#elif CINFER_VARIANT_NO_TRANSFORM && VARIANT_ALIBI_SLOPE
            const float bias0 = slope_qk * (float)(j0 + 2 * (lane % 4) - (q0 + row_base + delta));
#endif
            float s[MMA_Q][S_TILES][4];
#pragma unroll
            for (int mq = 0; mq < MMA_Q; mq++)
#pragma unroll
                for (int n = 0; n < S_TILES; n++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
#if CINFER_VARIANT_NO_TRANSFORM && VARIANT_ALIBI_SLOPE && PACK
                        s[mq][n][e] =
                            fmaf(slope_qk[mq][e / 2], (float)(n * 8 + e % 2), bias0[mq][e / 2]);
#elif CINFER_VARIANT_NO_TRANSFORM && VARIANT_ALIBI_SLOPE
                        s[mq][n][e] =
                            fmaf(slope_qk, (float)(n * 8 + e % 2 - mq * 16 - (e / 2) * 8), bias0);
#else
                        s[mq][n][e] = 0.0f;
#endif
                    }
#pragma unroll
            for (int kk = 0; kk < K_STEPS; kk++) {
                unsigned a[MMA_Q][4];
#pragma unroll
                for (int mq = 0; mq < MMA_Q; mq++) {
#if Q_IN_REGS
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        a[mq][e] = qf[mq][kk][e];
#else
                    cinfer_ldmatrix_x4(a[mq], ql + IMM_OFFSET(mq * 16, 2 * kk));
#endif
                }
#pragma unroll
                for (int np = 0; np < S_TILES / 2; np++) {
                    /* Matrices: KV rows np*16 + 0..7 / + 8..15 (lanes / 16) by head-dim chunk
                     * 2 kk / 2 kk + 1 ((lane / 8) % 2): b[0..1] for n tile 2 np, b[2..3] for
                     * 2 np + 1. */
                    unsigned b[4];
                    cinfer_ldmatrix_x4(b, kl + MMA_KV_OFFSET(stage) + IMM_OFFSET(np * 16, 2 * kk));
#pragma unroll
                    for (int mq = 0; mq < MMA_Q; mq++) {
                        cinfer_mma(MMA_DT, s[mq][2 * np], a[mq], b);
                        cinfer_mma(MMA_DT, s[mq][2 * np + 1], a[mq], b + 2);
                    }
                }
            }
#if KV_COPY_LATE && !PINGPONG
            ISSUE_NEXT_KV();
#endif

#if CINFER_VARIANT_NO_TRANSFORM
            /* Hooks that never see a logit: the logits keep the kernel's units (a position bias
             * is in them already). The variant's mask drops positions on every tile, the kernel's
             * own masks where the tile crosses an edge; hooks see only rows and positions that
             * exist. With VARIANT_LOGITS_MASK_BITS each row of the tile comes as MASK_WORDS bit
             * words (loaded above, or read from the row's slot with MASK_ROWS), shifted once so
             * that an element's bit has a compile-time index: an element costs a bit test and a
             * select (rows past q_rows may keep anything: their logits are never stored). */
            {
                const bool edge = tile_crosses_edge(p, j0, q0, delta, q_span, q_rows, true);
#if MASK_ROWS
                uint32_t bits[MMA_Q][2][MASK_WORDS];
                /* An inside tile whose every position the warp's rows keep drops nothing. */
                if (edge || !full)
#endif
                {
#if MASK_ROWS
                    const unsigned mask_l = mask_lane_slot(s_mask, t);
#pragma unroll
                    for (int mq = 0; mq < MMA_Q; mq++) {
#pragma unroll
                        for (int h = 0; h < 2; h++)
                            mask_slot_bits(bits[mq][h],
                                           mask_l + (mq * 16 + h * 8) * MASK_SLOT_BYTES);
                    }
#endif
#if VARIANT_LOGITS_MASK_BITS
                    /* This lane's first position in a word is 2 (lane % 4). */
#pragma unroll
                    for (int mq = 0; mq < MMA_Q; mq++)
#pragma unroll
                        for (int h = 0; h < 2; h++)
#pragma unroll
                            for (int w = 0; w < MASK_WORDS; w++)
                                bits[mq][h][w] >>= 2 * (lane % 4);
#endif
#pragma unroll
                    for (int mq = 0; mq < MMA_Q; mq++)
#pragma unroll
                        for (int h = 0; h < 2; h++) {
                            const int row = row_base + mq * 16 + h * 8;
                            const int pos = q0 + row_token(row) + delta;
                            if (!edge) {
#pragma unroll
                                for (int n = 0; n < S_TILES; n++)
#pragma unroll
                                    for (int e = 2 * h; e < 2 * h + 2; e++) {
#if VARIANT_LOGITS_MASK_BITS
                                        const bool keep =
                                            (bits[mq][h][n / 4] >> ((n % 4) * 8 + e % 2)) & 1;
#elif VARIANT_LOGITS_MASK
                                        const int j = j0 + n * 8 + 2 * (lane % 4) + e % 2;
                                        const bool keep = variant_logits_mask(
                                            &vp, batch_idx, pos, j, row_head(head, row), kv_head);
#else
                                    const bool keep = true;
#endif
                                        if (!keep)
                                            s[mq][n][e] = -CINFER_INF;
                                    }
                            } else {
#pragma unroll
                                for (int n = 0; n < S_TILES; n++)
#pragma unroll
                                    for (int e = 2 * h; e < 2 * h + 2; e++) {
                                        const int j = j0 + n * 8 + 2 * (lane % 4) + e % 2;
#if VARIANT_LOGITS_MASK_BITS
                                        bool keep =
                                            j < p.kv_len &&
                                            (bits[mq][h][n / 4] >> ((n % 4) * 8 + e % 2)) & 1;
#elif VARIANT_LOGITS_MASK
                                        bool keep = j < p.kv_len && row < q_rows;
#else
                                    bool keep = j < p.kv_len;
#endif
#if CAUSAL
                                        keep = keep && j <= pos;
#endif
#if CINFER_WINDOW
                                        keep = keep && j >= pos - p.window_left;
#endif
#if VARIANT_LOGITS_MASK && !VARIANT_LOGITS_MASK_BITS
                                        if (keep)
                                            keep =
                                                variant_logits_mask(&vp, batch_idx, pos, j,
                                                                    row_head(head, row), kv_head);
#endif
                                        if (!keep)
                                            s[mq][n][e] = -CINFER_INF;
                                    }
                            }
                        }
                }
            }
#elif CINFER_VARIANT_LOGITS
            /* Every element through the hooks, in natural-log units (the host's q_scale has no
             * log2(e) for these kernels; the softmax's scale adds it). Hooks see only rows and
             * positions that exist: tiles that cross an edge (kv_len, the last query row, the
             * diagonal, the window) test each element first; inside tiles call the hooks
             * unconditionally, so what they compute per head (a slope, a loaded parameter) is
             * computed once per tile rather than per element. */
            {
                const bool edge = tile_crosses_edge(p, j0, q0, delta, q_span, q_rows, true);
                if (!edge) {
#pragma unroll
                    for (int mq = 0; mq < MMA_Q; mq++)
#pragma unroll
                        for (int n = 0; n < S_TILES; n++)
#pragma unroll
                            for (int e = 0; e < 4; e++) {
                                const int row = row_base + mq * 16 + (e / 2) * 8;
                                const int pos = q0 + row_token(row) + delta;
                                const int j = j0 + n * 8 + 2 * (lane % 4) + e % 2;
                                s[mq][n][e] =
                                    cinfer_variant_logit(&vp, s[mq][n][e] * p.q_scale, batch_idx,
                                                         pos, j, row_head(head, row), kv_head);
                            }
                } else {
#pragma unroll
                    for (int mq = 0; mq < MMA_Q; mq++)
#pragma unroll
                        for (int n = 0; n < S_TILES; n++)
#pragma unroll
                            for (int e = 0; e < 4; e++) {
                                const int row = row_base + mq * 16 + (e / 2) * 8;
                                const int pos = q0 + row_token(row) + delta;
                                const int j = j0 + n * 8 + 2 * (lane % 4) + e % 2;
                                bool keep = j < p.kv_len && row < q_rows;
#if CAUSAL
                                keep = keep && j <= pos;
#endif
#if CINFER_WINDOW
                                keep = keep && j >= pos - p.window_left;
#endif
                                float x = CINFER_VARIANT_DROPPED;
                                if (keep)
                                    x = cinfer_variant_logit(&vp, s[mq][n][e] * p.q_scale,
                                                             batch_idx, pos, j, row_head(head, row),
                                                             kv_head);
                                s[mq][n][e] = x;
                            }
                }
            }
#else
#if CINFER_SOFTCAP
#pragma unroll
            for (int mq = 0; mq < MMA_Q; mq++)
#pragma unroll
                for (int n = 0; n < S_TILES; n++)
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        s[mq][n][e] = cinfer_soft_cap_h(s[mq][n][e] * y_scale);
#endif

            /* The element mask, only where some element of the tile may be dropped. */
            const bool need_mask = tile_crosses_edge(p, j0, q0, delta, q_span, q_rows, false);
#if PACK
            if (need_mask) {
                /* Element (mq, n, e) is column c = n * 8 + e % 2 of the lane's row
                 * mq * 16 + (e / 2) * 8 (from row_base), so j = j0 + col0 + c; a row's limit
                 * lim = its position - j0 - col0 is computed per row (positions are not linear in
                 * packed rows). */
                const int tid = thread_index();
                const int col0 = 2 * (tid % 4);
                const int lane_row = (tid / 32) * WARP_ROWS + (tid % 32) / 4;
                const int len_lim = p.kv_len - j0 - col0;
#pragma unroll
                for (int mq = 0; mq < MMA_Q; mq++)
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        const int lim =
                            q0 + row_token(lane_row + mq * 16 + h * 8) + delta - j0 - col0;
#pragma unroll
                        for (int n = 0; n < S_TILES; n++)
#pragma unroll
                            for (int e = 2 * h; e < 2 * h + 2; e++) {
                                const int c = n * 8 + e % 2;
                                bool keep = c < len_lim;
#if CAUSAL
                                keep = keep && c <= lim; /* j <= position */
#endif
#if CINFER_WINDOW
                                keep = keep && c + p.window_left >= lim;
#endif
                                if (!keep)
                                    s[mq][n][e] = -CINFER_INF;
                            }
                    }
            }
#else
            if (need_mask) {
                /* Element (mq, n, e) is column c = n * 8 + e % 2 of row r = mq * 16 + (e / 2) *
                 * 8, so j = j0 + col0 + c and its row's position is diag0 + r + col0 (col0: the
                 * lane's first column; diag0: its first row's position less col0): every test
                 * compares a per-tile limit with the compile-time c or c - r. */
                const int tid = thread_index();
                const int col0 = 2 * (tid % 4);
                const int diag0 = q0 + delta + (tid / 32) * WARP_ROWS + (tid % 32) / 4 - col0;
                const int len_lim = p.kv_len - j0 - col0;
                /* (unused without a causal mask or a window) */
                [[maybe_unused]] const int diag_lim = diag0 - j0;
#pragma unroll
                for (int mq = 0; mq < MMA_Q; mq++)
#pragma unroll
                    for (int n = 0; n < S_TILES; n++)
#pragma unroll
                        for (int e = 0; e < 4; e++) {
                            const int c = n * 8 + e % 2;
                            [[maybe_unused]] const int r = mq * 16 + (e / 2) * 8;
                            bool keep = c < len_lim;
#if CAUSAL
                            keep = keep && c - r <= diag_lim; /* j <= position */
#endif
#if CINFER_WINDOW
                            keep = keep && c - r + p.window_left >= diag_lim;
#endif
                            if (!keep)
                                s[mq][n][e] = -CINFER_INF;
                        }
            }
#endif
#endif

            /* Online softmax; P overwrites S. (Without softmax P is S as it is.) The factors
             * alpha that rescale O are applied below, after P is packed. */
#if VARIANT_USE_SOFTMAX
            float alpha[MMA_Q][2];
#pragma unroll
            for (int mq = 0; mq < MMA_Q; mq++) {
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    if (fixed_max) {
                        float sum = 0.0f;
#pragma unroll
                        for (int n = 0; n < S_TILES; n++)
#pragma unroll
                            for (int e = 2 * h; e < 2 * h + 2; e++) {
                                s[mq][n][e] = cinfer_fast_exp2(fmaf(s[mq][n][e], scale, -m[mq][h]));
                                sum += s[mq][n][e];
                            }
                        d[mq][h] += sum;
                        alpha[mq][h] = 1.0f;
                        continue;
                    }
                    float mx = -CINFER_INF;
#pragma unroll
                    for (int n = 0; n < S_TILES; n++)
                        mx = fmaxf(mx, fmaxf(s[mq][n][2 * h], s[mq][n][2 * h + 1]));
                    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                    float m_new = fmaxf(m[mq][h], mx * scale);
#if LAZY_MAX
                    /* (NaN when nothing is kept yet: the new maximum is taken) */
                    if (m_new - m[mq][h] <= CINFER_LAZY_MAX_SLACK)
                        m_new = m[mq][h];
#endif
                    /* Nothing kept yet: subtract 0, so every exp2 is of -inf and gives 0. */
                    const float m_use = m_new == -CINFER_INF ? 0.0f : m_new;
                    alpha[mq][h] = cinfer_fast_exp2(m[mq][h] - m_use);
                    m[mq][h] = m_new;
                    float sum = 0.0f;
#pragma unroll
                    for (int n = 0; n < S_TILES; n++) {
#pragma unroll
                        for (int e = 2 * h; e < 2 * h + 2; e++) {
                            s[mq][n][e] = cinfer_fast_exp2(fmaf(s[mq][n][e], scale, -m_use));
                            sum += s[mq][n][e];
                        }
                    }
                    d[mq][h] = fmaf(d[mq][h], alpha[mq][h], sum);
                }
            }
#endif

            /* P as fp16/bf16 A fragments: row half h of n tile n is pf[mq][n][h]; packing all of
             * P here, before the branch below, frees the fp32 S registers before the P V mmas. */
            unsigned pf[MMA_Q][S_TILES][2];
#pragma unroll
            for (int mq = 0; mq < MMA_Q; mq++)
#pragma unroll
                for (int n = 0; n < S_TILES; n++)
#pragma unroll
                    for (int h = 0; h < 2; h++)
                        pf[mq][n][h] =
                            cinfer_pack_half2(MMA_DT, s[mq][n][2 * h], s[mq][n][2 * h + 1]);

#if VARIANT_USE_SOFTMAX
            /* O *= alpha, skipped (exactly: every alpha is 1) with a fixed maximum and when no row
             * of the warp has a new maximum, which is most tiles once a row has seen a few. */
            if (!fixed_max) {
                bool rescale = false;
#pragma unroll
                for (int mq = 0; mq < MMA_Q; mq++)
                    rescale = rescale || alpha[mq][0] != 1.0f || alpha[mq][1] != 1.0f;
                if (__any_sync(0xffffffffu, rescale)) {
#pragma unroll
                    for (int mq = 0; mq < MMA_Q; mq++)
#pragma unroll
                        for (int n = 0; n < O_TILES; n++)
#pragma unroll
                            for (int e = 0; e < 4; e++)
                                o[mq][n][e] *= alpha[mq][e / 2];
                }
            }
#endif

            /* O += P V */
#if PINGPONG
            PP_TURN_WAIT(wg);
#if PP_COPY_IN_TURN
            ISSUE_NEXT_KV();
#endif
#endif
#pragma unroll
            for (int kk = 0; kk < PV_STEPS; kk++) {
                unsigned pa[MMA_Q][4];
#pragma unroll
                for (int mq = 0; mq < MMA_Q; mq++) {
                    pa[mq][0] = pf[mq][2 * kk][0];
                    pa[mq][1] = pf[mq][2 * kk][1];
                    pa[mq][2] = pf[mq][2 * kk + 1][0];
                    pa[mq][3] = pf[mq][2 * kk + 1][1];
                }
#pragma unroll
                for (int dp = 0; dp < O_TILES / 2; dp++) {
                    /* Matrices (transposed): KV rows kk*16 + 0..15 (lane % 16) by head-dim chunk
                     * 2 dp / 2 dp + 1 (lane / 16): b[0..1] for d tile 2 dp, b[2..3] for
                     * 2 dp + 1. */
                    unsigned b[4];
                    cinfer_ldmatrix_x4_trans(b, vl + MMA_KV_OFFSET(stage) +
                                                    IMM_OFFSET(kk * 16, 2 * dp));
#pragma unroll
                    for (int mq = 0; mq < MMA_Q; mq++) {
                        cinfer_mma(MMA_DT, o[mq][2 * dp], pa[mq], b);
                        cinfer_mma(MMA_DT, o[mq][2 * dp + 1], pa[mq], b + 2);
                    }
                }
            }
#if PINGPONG
            /* Group 1's last turn passes to nobody (every barrier's arrivals stay matched). */
            if (wg == 0 || t + 1 < num_tiles)
                PP_TURN_PASS(wg);
#if !PP_COPY_IN_TURN
            ISSUE_NEXT_KV();
#endif
#endif
        }
        /* Only empty groups can remain; nothing may be in flight when the Q tile is reused. */
        CINFER_CP_ASYNC_WAIT(0);
    }

#if CINFER_BATCH && VARIANT_USE_SOFTMAX && !VARIANT_OUTPUT_TRANSFORM
    if (w.partial >= 0) {
        /* One chunk of a split tile: float32 partial states (normalized output, base-2 LSE) of its
         * rows for the merge kernel (prefill_params.h). A row that keeps nothing in this chunk
         * writes output 0 and LSE -inf. The host never splits variants without softmax or with an
         * output transform. Each quad stores 32 contiguous bytes per n tile: whole sectors. */
#pragma unroll
        for (int mq = 0; mq < MMA_Q; mq++) {
#pragma unroll
            for (int h = 0; h < 2; h++) {
                float sum = d[mq][h];
                sum += __shfl_xor_sync(0xffffffffu, sum, 1);
                sum += __shfl_xor_sync(0xffffffffu, sum, 2);
                const int row = row_base + mq * 16 + h * 8;
                if (row >= q_rows)
                    continue;
                const float inv = sum > 0.0f ? p.v_scale / sum : 0.0f;
                const long long slot =
                    (long long)w.partial +
                    ((long long)row_token(row) * p.num_qo_heads + row_head(head, row)) *
                        (long long)w.num_chunks;
                float *po = p.partial_o + slot * D_VO + 2 * (lane % 4);
#pragma unroll
                for (int n = 0; n < VO_CHUNKS; n++) /* O's n8 tiles that exist (see D_QK) */
                    *(float2 *)(po + n * 8) =
                        make_float2(o[mq][n][2 * h] * inv, o[mq][n][2 * h + 1] * inv);
                if (lane % 4 == 0)
                    p.partial_lse[slot] = sum > 0.0f ? LSE_OF(m[mq][h], sum) : -CINFER_INF;
            }
        }
        return;
    }
#endif

    /* Normalize, write LSE, and stage O (as fp16/bf16) in this warp's own rows of the Q tile,
     * which no other warp reads, so only the warp has to synchronize. The thread's rows are
     * derived anew from its index (thread_index), not kept in registers through the loop. */
    const int tid = thread_index();
    const int e_warp = tid / 32, e_lane = tid % 32;
    const int e_row_base = e_warp * WARP_ROWS + e_lane / 4;
    __syncwarp();
#pragma unroll
    for (int mq = 0; mq < MMA_Q; mq++) {
#pragma unroll
        for (int h = 0; h < 2; h++) {
            float sum = d[mq][h];
            sum += __shfl_xor_sync(0xffffffffu, sum, 1);
            sum += __shfl_xor_sync(0xffffffffu, sum, 2);
#if VARIANT_USE_SOFTMAX
            const float inv = sum > 0.0f ? p.v_scale / sum : 0.0f;
            const int row = e_row_base + mq * 16 + h * 8;
            if (p.lse && e_lane % 4 == 0 && row < q_rows)
                p.lse[(long long)(q0 + row_token(row)) * p.lse_stride_n +
                      (long long)row_head(head, row) * p.lse_stride_h] =
                    sum > 0.0f ? LSE_OF(m[mq][h], sum) : -CINFER_INF;
#else
            const float inv = p.v_scale; /* no normalization and no LSE */
            const int row = e_row_base + mq * 16 + h * 8;
#endif
#if VARIANT_OUTPUT_TRANSFORM
#pragma unroll
            for (int n = 0; n < O_TILES; n++) {
                float lo = o[mq][n][2 * h] * inv, hi = o[mq][n][2 * h + 1] * inv;
                if (row < q_rows && n < VO_CHUNKS) {
                    const int dim = n * 8 + 2 * (e_lane % 4);
                    const int pos = q0 + row_token(row) + delta, qo_head = row_head(head, row);
                    lo = variant_output_transform(&vp, lo, batch_idx, pos, qo_head, dim);
                    hi = variant_output_transform(&vp, hi, batch_idx, pos, qo_head, dim + 1);
                }
                cinfer_st_shared_u32(s_q + tile_offset(row, n) + (e_lane % 4) * 4,
                                     cinfer_pack_half2(DT, lo, hi));
            }
#else
#pragma unroll
            for (int n = 0; n < O_TILES; n++)
                cinfer_st_shared_u32(
                    s_q + tile_offset(row, n) + (e_lane % 4) * 4,
                    cinfer_pack_half2(DT, o[mq][n][2 * h] * inv, o[mq][n][2 * h + 1] * inv));
#endif
        }
    }
    __syncwarp();
    cinfer_half_bits *out = (cinfer_half_bits *)p.out + (long long)head * p.out_stride_h;
#pragma unroll
    for (int it = 0; it < WARP_ROWS * CHUNKS / 32; it++) {
        const int c = e_lane + it * 32;
        const int row = e_warp * WARP_ROWS + c / CHUNKS, ch = c % CHUNKS;
        if (row < q_rows && (VO_CHUNKS == CHUNKS || ch < VO_CHUNKS))
            *(uint4 *)(out + (long long)(q0 + row_token(row)) * p.out_stride_n +
                       (long long)(row_head(head, row) - head) * p.out_stride_h + ch * 8) =
                cinfer_ld_shared_v4(s_q + tile_offset(row, ch));
    }
}

#endif
