/*
 * Parameters of the bit-packing kernels (kernels/packbits.cu), shared by the host
 * (src/ops/packbits.c) and the device: plain C types only.
 */
#ifndef CINFER_PACKBITS_PARAMS_H
#define CINFER_PACKBITS_PARAMS_H

/* Threads per block of packbits and segment_packbits. */
#define CINFER_PACKBITS_BLOCK 128
/* Output bytes per thread of packbits: one 16-byte store, from eight 16-byte loads. */
#define CINFER_PACKBITS_BYTES_PER_THREAD 16
/* Threads of the one block that computes the packed segments' indptr (the block-wide scan). */
#define CINFER_PACKBITS_SCAN_BLOCK 1024

typedef struct cinfer_packbits_params {
    const unsigned char *x; /* [n] */
    unsigned char *y;       /* [y_len] */
    const int *indptr;      /* segment_packbits*: [batch_size + 1] */
    int *indptr_new;        /* segment_packbits*: [batch_size + 1], written by the scan kernel */
    long long n;
    long long y_len;
    int batch_size;
    int big; /* 1: bit 7 - k of a byte is element k (big bit order); 0: bit k (little) */
} cinfer_packbits_params;

#endif
