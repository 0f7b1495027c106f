/*
 * Parameters of the RoPE kernels (kernels/rope.cu), shared by the host (src/ops/rope.c) and the
 * device: plain C types only, so both compilers lay the struct out identically. Strides are in
 * elements.
 *
 * Work is cut into units of one head row: a rotated unit holds the pairs of one vector (16-byte
 * path: the 8 pairs of chunk c and chunk c + R/2 when rotating halves, the 4 pairs of chunk c
 * when interleaved; scalar path: one pair), a pass-through unit one chunk (one element) of
 * [R, D). A unit's cos/sin are computed once and used for every head row of its token.
 */
#ifndef CINFER_ROPE_PARAMS_H
#define CINFER_ROPE_PARAMS_H

/* Threads per block. */
#define CINFER_ROPE_BLOCK 128
/* The largest rotary_dim / 2: the frequency table lives in the parameters (2 KiB of doubles,
 * within the 4 KiB every driver accepts). */
#define CINFER_ROPE_MAX_PAIRS 256

/* Rotated and pass-through units per head row for rotary dim r, head dim d, vector width vec. */
#define CINFER_ROPE_ROT_UNITS(r, interleave, vec)                                                  \
    ((vec) == 8 ? ((interleave) ? (r) / 8 : (r) / 16) : (r) / 2)
#define CINFER_ROPE_PASS_UNITS(d, r, vec) (((d) - (r)) / (vec))

typedef struct cinfer_rope_params {
    const void *in[2];          /* q [nnz, Hq, D], k [nnz, Hk, D] */
    void *out[2];               /* q_out, k_out (may equal in) */
    long long in_stride[2][2];  /* [q/k][token, head] */
    long long out_stride[2][2]; /* [q/k][token, head] */
    const int *pos_ids;         /* rope_pos_ids, rope_cos_sin_cache: [nnz] */
    const int *indptr;          /* rope: [batch_size + 1] */
    const int *offsets;         /* rope: [batch_size] */
    const float *cos_sin_cache; /* rope_cos_sin_cache: [cache_rows, rotary_dim] */
    long long cache_stride;     /* elements between rows of the table */
    long long cache_rows;
    long long nnz;
    int batch_size;
    int num_heads[2]; /* Hq, Hk */
    int rotary_dim;
    int interleave;
    int rot_units;     /* rotated units per head row (CINFER_ROPE_ROT_UNITS) */
    int units;         /* rot_units + the pass-through units (0 of those when rotating in place) */
    int lanes;         /* threads sharing the units of one head row */
    int rows_per_pass; /* head rows one token's threads cover at once */
    int tokens_per_block; /* tokens per block, each with CINFER_ROPE_BLOCK / tokens_per_block
                             threads */
    double freq[CINFER_ROPE_MAX_PAIRS]; /* rope, rope_pos_ids: radians per position of pair j */
} cinfer_rope_params;

#endif
