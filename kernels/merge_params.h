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

typedef struct cinfer_merge_params {
    const void *v_in[2];
    const float *lse_in[2];
    void *v_out;
    float *lse_out;             /* may be NULL (merge_states) */
    const unsigned char *mask;  /* [rows], may be NULL (merge_state_in_place) */
    long long v_in_stride[2][3];
    long long lse_in_stride[2][3];
    long long v_out_stride[2];
    long long lse_out_stride[2];
    long long num_rows; /* n */
    int num_heads;
    int num_states;
} cinfer_merge_params;

#endif
