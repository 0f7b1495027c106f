/*
 * Parameters of the merge kernels, shared by the host (src/ops/merge.c) and the device
 * (kernels/merge.cu): plain C types only, so both compilers lay the struct out identically.
 *
 * The three operations are one kernel: merge_state and merge_state_in_place merge state 0 of
 * tensor 0 with state 0 of tensor 1; merge_states folds states 0..num_states-1 of tensor 0.
 * Strides are in elements: [row, state, head] for inputs, [row, head] for outputs.
 */
#ifndef CINFER_MERGE_PARAMS_H
#define CINFER_MERGE_PARAMS_H

/* Threads per (row, head) for a head dim d and vector width vec: enough lanes to cover d in one
 * step, at most a warp. The kernel's thread mapping and the host's grid both use it. */
#define CINFER_MERGE_TPR(d, vec)                                                                   \
    (((d) + (vec)-1) / (vec) >= 32   ? 32                                                          \
     : ((d) + (vec)-1) / (vec) >= 16 ? 16                                                          \
     : ((d) + (vec)-1) / (vec) >= 8  ? 8                                                           \
     : ((d) + (vec)-1) / (vec) >= 4  ? 4                                                           \
     : ((d) + (vec)-1) / (vec) >= 2  ? 2                                                           \
                                     : 1)
/* Threads per block of the merge kernels. */
#define CINFER_MERGE_BLOCK 128

typedef struct cinfer_merge_params {
    const void *v_in[2];
    const float *lse_in[2];
    void *v_out;
    float *lse_out;            /* may be NULL (merge_states) */
    const unsigned char *mask; /* [rows], may be NULL (merge_state_in_place) */
    long long v_in_stride[2][3];
    long long lse_in_stride[2][3];
    long long v_out_stride[2];
    long long lse_out_stride[2];
    long long num_rows; /* n */
    int num_heads;
    int num_states;
} cinfer_merge_params;

#endif
