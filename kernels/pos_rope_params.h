/*
 * The frequency table of in-kernel RoPE (kernels/pos_rope.cuh), shared by the host
 * (src/ops/options.c, cinfer__attention_rope_params) and the device: plain C types only, so both
 * compilers lay it out alike.
 *
 * The host fills it once per set of options and passes it to the RoPE attention kernels
 * (CINFER_POS = 1, decode.cu and prefill.cu) as their last parameter, read in place in the
 * parameter space; each CTA copies it into shared memory. Before, every CTA computed it with a
 * float64 pow and division per pair at its start, ahead of its first work item.
 */
#ifndef CINFER_POS_ROPE_PARAMS_H
#define CINFER_POS_ROPE_PARAMS_H

/* Pairs of the largest head dim the attention kernels take (256): 1 KiB of table, which with the
 * kernels' own parameters (under 300 bytes) and a variant's (at most 256) stays within the 4 KiB
 * of parameters every driver accepts. */
#define CINFER_POS_ROPE_MAX_PAIRS 128

typedef struct cinfer_pos_rope_params {
    /* Pair m of a head dim D (m < D / 2): its frequency in turns per position,
     * f_m = rope_theta^(-2m / D) / (2 pi rope_scale) computed in float64, as the float32 pair
     * (hi, lo) = ((float)f_m, (float)(f_m - hi)); zeros past D / 2. */
    float freq[CINFER_POS_ROPE_MAX_PAIRS][2];
} cinfer_pos_rope_params;

#endif
