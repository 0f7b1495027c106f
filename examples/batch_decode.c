/*
 * A complete program against the installed library: one batch decode step over a paged KV cache
 * at Llama-3-8B's attention shape (32 query / 8 KV heads, head dim 128, bf16, 16-token pages),
 * checked against a plain float computation on the host. Its kernels are in every AOT set, so it
 * also runs with CINFER_JIT=off from an install that carries libcinfer.aot. Without a GPU it says
 * so and exits 0. Build: see examples/CMakeLists.txt (find_package(cinfer)).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cinfer.h>
#include <cuda_runtime_api.h>

enum { HQ = 32, HK = 8, D = 128, PAGE = 16, BATCH = 3, MAX_PAGES = 64 };
static const int kv_len[BATCH] = {1, 100, 517};

/* bf16 bits of a float, rounded to nearest even (finite inputs). */
static unsigned short to_bf16(float x) {
    uint32_t bits;
    memcpy(&bits, &x, 4);
    return (unsigned short)((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

static float from_bf16(unsigned short h) {
    const uint32_t bits = (uint32_t)h << 16;
    float x;
    memcpy(&x, &bits, 4);
    return x;
}

static DLTensor tensor(void *data, DLDataType dtype, int ndim, int64_t *shape) {
    DLTensor t;
    memset(&t, 0, sizeof t);
    t.data = data;
    t.device.device_type = kDLCUDA;
    t.ndim = ndim;
    t.dtype = dtype;
    t.shape = shape;
    return t;
}

#define CHECK(call)                                                                                \
    do {                                                                                           \
        cinfer_status_t st_ = (call);                                                              \
        if (st_ != CINFER_STATUS_SUCCESS) {                                                        \
            fprintf(stderr, "%s: %s\n", #call, cinfer_last_error());                               \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

int main(void) {
    cinfer_context_t *ctx = NULL;
    cinfer_status_t st = cinfer_context_create(NULL, &ctx);
    if (st == CINFER_STATUS_NO_DEVICE) {
        printf("cinfer %s: no GPU here (%s)\n", cinfer_version_string(), cinfer_last_error());
        return 0;
    }
    CHECK(st);

    /* The page table: request b owns pages from a shared pool, in a scattered order. */
    int32_t indptr[BATCH + 1] = {0}, last[BATCH], indices[MAX_PAGES];
    for (int b = 0; b < BATCH; b++) {
        const int pages = (kv_len[b] + PAGE - 1) / PAGE;
        indptr[b + 1] = indptr[b] + pages;
        last[b] = kv_len[b] - (pages - 1) * PAGE;
    }
    for (int i = 0; i < indptr[BATCH]; i++)
        indices[i] = (i * 37) % MAX_PAGES;
    const size_t cache_elems = (size_t)MAX_PAGES * PAGE * HK * D;
    unsigned short *k = malloc(cache_elems * 2), *v = malloc(cache_elems * 2);
    static unsigned short q[BATCH][HQ][D], out[BATCH][HQ][D];
    srand(7);
    for (size_t i = 0; i < cache_elems; i++) {
        k[i] = to_bf16((float)rand() / RAND_MAX * 2.0f - 1.0f);
        v[i] = to_bf16((float)rand() / RAND_MAX * 2.0f - 1.0f);
    }
    for (int b = 0; b < BATCH; b++)
        for (int h = 0; h < HQ; h++)
            for (int d = 0; d < D; d++)
                q[b][h][d] = to_bf16((float)rand() / RAND_MAX * 2.0f - 1.0f);

    void *d_k, *d_v, *d_q, *d_out, *d_indptr, *d_indices, *d_last;
    if (cudaMalloc(&d_k, cache_elems * 2) || cudaMalloc(&d_v, cache_elems * 2) ||
        cudaMalloc(&d_q, sizeof q) || cudaMalloc(&d_out, sizeof out) ||
        cudaMalloc(&d_indptr, sizeof indptr) || cudaMalloc(&d_indices, sizeof indices) ||
        cudaMalloc(&d_last, sizeof last) ||
        cudaMemcpy(d_k, k, cache_elems * 2, cudaMemcpyHostToDevice) ||
        cudaMemcpy(d_v, v, cache_elems * 2, cudaMemcpyHostToDevice) ||
        cudaMemcpy(d_q, q, sizeof q, cudaMemcpyHostToDevice) ||
        cudaMemcpy(d_indptr, indptr, sizeof indptr, cudaMemcpyHostToDevice) ||
        cudaMemcpy(d_indices, indices, sizeof indices, cudaMemcpyHostToDevice) ||
        cudaMemcpy(d_last, last, sizeof last, cudaMemcpyHostToDevice)) {
        fprintf(stderr, "CUDA runtime error\n");
        return 1;
    }

    cinfer_attention_options_t o = CINFER_ATTENTION_OPTIONS_INIT;
    o.num_qo_heads = HQ;
    o.num_kv_heads = HK;
    o.head_dim = D;
    o.page_size = PAGE;
    o.q_dtype = o.kv_dtype = (DLDataType){kDLBfloat, 16, 1};
    o.max_batch_size = BATCH;
    size_t ws_bytes = 0;
    CHECK(cinfer_batch_decode_workspace_size(ctx, &o, &ws_bytes));
    void *ws;
    if (cudaMalloc(&ws, ws_bytes)) {
        fprintf(stderr, "CUDA runtime error\n");
        return 1;
    }
    cinfer_batch_decode_t *op = NULL;
    CHECK(cinfer_batch_decode_create(ctx, &o, ws, ws_bytes, &op));
    CHECK(cinfer_batch_decode_plan(op, indptr, last, BATCH, NULL));
    const DLDataType bf16 = {kDLBfloat, 16, 1}, i32 = {kDLInt, 32, 1};
    int64_t q_shape[3] = {BATCH, HQ, D}, cache_shape[4] = {MAX_PAGES, PAGE, HK, D};
    int64_t indptr_shape[1] = {BATCH + 1}, last_shape[1] = {BATCH},
            indices_shape[1] = {indptr[BATCH]};
    DLTensor tq = tensor(d_q, bf16, 3, q_shape), tout = tensor(d_out, bf16, 3, q_shape);
    DLTensor tk = tensor(d_k, bf16, 4, cache_shape), tv = tensor(d_v, bf16, 4, cache_shape);
    DLTensor tindptr = tensor(d_indptr, i32, 1, indptr_shape);
    DLTensor tindices = tensor(d_indices, i32, 1, indices_shape);
    DLTensor tlast = tensor(d_last, i32, 1, last_shape);
    CHECK(cinfer_batch_decode_run(op, &tq, &tk, &tv, &tindptr, &tindices, &tlast, &tout, NULL, NULL,
                                  NULL));
    if (cudaMemcpy(out, d_out, sizeof out, cudaMemcpyDeviceToHost)) {
        fprintf(stderr, "CUDA runtime error\n");
        return 1;
    }

    /* out = softmax(q k^T / sqrt(D)) v, per request and query head, in float. */
    float worst = 0.0f;
    float *p = malloc(sizeof(float) * 1024);
    for (int b = 0; b < BATCH; b++)
        for (int h = 0; h < HQ; h++) {
            const int kh = h / (HQ / HK);
            float mx = -INFINITY, sum = 0.0f;
            for (int t = 0; t < kv_len[b]; t++) {
                const size_t row =
                    ((size_t)indices[indptr[b] + t / PAGE] * PAGE + t % PAGE) * HK + kh;
                float s = 0.0f;
                for (int d = 0; d < D; d++)
                    s += from_bf16(q[b][h][d]) * from_bf16(k[row * D + d]);
                p[t] = s / sqrtf((float)D);
                mx = fmaxf(mx, p[t]);
            }
            for (int t = 0; t < kv_len[b]; t++)
                sum += p[t] = expf(p[t] - mx);
            for (int d = 0; d < D; d++) {
                float o_ref = 0.0f;
                for (int t = 0; t < kv_len[b]; t++) {
                    const size_t row =
                        ((size_t)indices[indptr[b] + t / PAGE] * PAGE + t % PAGE) * HK + kh;
                    o_ref += p[t] * from_bf16(v[row * D + d]);
                }
                worst = fmaxf(worst, fabsf(from_bf16(out[b][h][d]) - o_ref / sum));
            }
        }
    const int ok = worst < 2e-2f; /* bf16 output rounding and P in bf16 */
    printf("cinfer %s: batch decode (32/8 heads, D 128, bf16, page 16) max error %.2e (%s)\n",
           cinfer_version_string(), worst, ok ? "ok" : "WRONG");
    cinfer_batch_decode_destroy(op);
    cinfer_context_destroy(ctx);
    free(p), free(k), free(v);
    return ok ? 0 : 1;
}
