/*
 * Parameters of the page-table kernels (kernels/append.cu), shared by the host
 * (src/ops/append.c) and the device: plain C types only, so both compilers lay the structs out
 * identically. Strides are in elements.
 */
#ifndef CINFER_APPEND_PARAMS_H
#define CINFER_APPEND_PARAMS_H

/* Threads per block of every kernel in kernels/append.cu. */
#define CINFER_APPEND_BLOCK 128
/* The append kernel gives each token one warp: its lanes stride over the (head, chunk) pairs of
 * the token's K and V rows, so the token's page-table lookup is done once per warp. */
#define CINFER_APPEND_TOKENS_PER_BLOCK (CINFER_APPEND_BLOCK / 32)

/* Error flag bits; the same values as the public CINFER_APPEND_ERROR_* (src/ops/utils_api.h). */
#define CINFER_APPEND_ERR_BATCH    1
#define CINFER_APPEND_ERR_POSITION 2
#define CINFER_APPEND_ERR_PAGE     4

typedef struct cinfer_append_params {
    const void *src[2];           /* append_k, append_v: [nnz, Hk, D] */
    void *cache[2];               /* K and V caches: element (page, slot, head, d) */
    const int *batch_indices;     /* [nnz] */
    const int *positions;         /* [nnz] */
    const int *kv_indptr;         /* [batch_size + 1] */
    const int *kv_indices;        /* [num_indices] */
    int *error_flag;              /* [1], may be NULL */
    long long src_stride[2][2];   /* [K/V][token, head] */
    long long cache_stride[2][3]; /* [K/V][page, slot, head] */
    long long nnz;
    long long num_indices; /* entries of kv_indices */
    long long max_pages;   /* pages of the cache */
    int batch_size;
    int num_heads;
    int page_size;
    int page_shift;     /* log2(page_size) when it is a power of two, else -1 */
    float inv_scale[2]; /* 1 / k_scale, 1 / v_scale: applied when the cache is fp8 */
} cinfer_append_params;

/* get_batch_indices_positions: one thread per entry of the outputs. */
typedef struct cinfer_batch_indices_params {
    const int *append_indptr; /* [batch_size + 1] */
    const int *seq_lens;      /* [batch_size] */
    int *batch_indices;       /* [nnz] */
    int *positions;           /* [nnz] */
    long long nnz;
    int batch_size;
} cinfer_batch_indices_params;

/* get_seq_lens: one thread per request. */
typedef struct cinfer_seq_lens_params {
    const int *kv_indptr;        /* [batch_size + 1] */
    const int *kv_last_page_len; /* [batch_size] */
    int *seq_lens;               /* [batch_size] */
    int batch_size;
    int page_size;
} cinfer_seq_lens_params;

#endif
