/*
 * The device ceilings `cinfer bench serve` reports its figures against, measured at start:
 *
 * - copy bandwidth: a device-to-device cuMemcpy of a large buffer, counting bytes read plus
 *   written (what bench/bench_decode.c measures; PERF.md's 4.28 TB/s on the H200);
 * - dense bf16 GEMM: an 8192^3 matmul through cuBLASLt (bf16 in and out, float32 accumulation),
 *   the tensor-core rate a well-tuned library reaches (PERF.md: 671 TFLOP/s via PyTorch's cuBLAS).
 *
 * cuBLASLt is opened at run time with dlopen, as the library opens libcuda and NVRTC, so the tool
 * neither links it nor needs it: without it the GEMM ceiling is reported as unavailable, with the
 * paths tried. A calibrated mma.sync kernel through cinfer's own JIT would avoid the dependency but
 * measure only what that kernel reaches; cuBLASLt ships with every CUDA toolkit and is the number
 * a reader compares against.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* cublasLt.h declares one function without a prototype. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstrict-prototypes"
#include <cublasLt.h>
#pragma GCC diagnostic pop

#include "cli.h"
#include "ref/ref.h"

/* Timed repetitions after the warm-up ones; the median is reported. */
#define WARMUP 3
#define RUNS   11

static int cmp_float(const void *a, const void *b) {
    const float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* Median milliseconds of RUNS events-timed calls of fn(arg) on stream, after WARMUP calls. */
static cinfer_status_t time_median(const cinfer__cuda_t *cu, CUstream stream,
                                   cinfer_status_t (*fn)(void *arg), void *arg, float *ms) {
    CUevent e0 = NULL, e1 = NULL;
    cinfer_status_t st = CINFER_STATUS_SUCCESS;
    float times[RUNS];
    CUresult res = cu->cuEventCreate(&e0, 0);
    if (res == CUDA_SUCCESS)
        res = cu->cuEventCreate(&e1, 0);
    for (int i = -WARMUP; i < RUNS && res == CUDA_SUCCESS && !st; i++) {
        if ((res = cu->cuEventRecord(e0, stream)) != CUDA_SUCCESS || (st = fn(arg)) ||
            (res = cu->cuEventRecord(e1, stream)) != CUDA_SUCCESS ||
            (res = cu->cuEventSynchronize(e1)) != CUDA_SUCCESS)
            break;
        if (i >= 0)
            res = cu->cuEventElapsedTime(&times[i], e0, e1);
    }
    if (res != CUDA_SUCCESS && !st)
        st = cinfer__cu_error(res, "timing a ceiling");
    if (e0)
        cu->cuEventDestroy(e0);
    if (e1)
        cu->cuEventDestroy(e1);
    if (!st) {
        qsort(times, RUNS, sizeof times[0], cmp_float);
        *ms = times[RUNS / 2];
    }
    return st;
}

/* Fills bytes of device memory with random bf16 values in [-1, 1] (never zeros: a GEMM on zeros
 * draws less power and runs faster than on real data). */
static cinfer_status_t fill_bf16(const cinfer__cuda_t *cu, CUdeviceptr dst, size_t bytes) {
    const size_t block = 16u << 20;
    uint16_t *host = malloc(block);
    if (!host)
        return cinfer__error(CINFER_STATUS_OUT_OF_MEMORY, "ceilings: out of host memory");
    uint64_t state = 0x853c49e6748fea9bull;
    for (size_t i = 0; i < block / 2; i++) {
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        host[i] =
            cinfer__ref_double_to_bf16((double)(state >> 11) * (2.0 / 9007199254740992.0) - 1.0);
    }
    cinfer_status_t st = CINFER_STATUS_SUCCESS;
    for (size_t off = 0; off < bytes && !st; off += block) {
        const CUresult res =
            cu->cuMemcpyHtoD(dst + off, host, bytes - off < block ? bytes - off : block);
        if (res != CUDA_SUCCESS)
            st = cinfer__cu_error(res, "ceilings: uploading random data");
    }
    free(host);
    return st;
}

typedef struct copy_job {
    const cinfer__cuda_t *cu;
    CUdeviceptr src, dst;
    size_t bytes;
    CUstream stream;
} copy_job_t;

static cinfer_status_t copy_once(void *arg) {
    const copy_job_t *j = arg;
    CINFER__CU(j->cu, cuMemcpyDtoDAsync(j->dst, j->src, j->bytes, j->stream),
               "ceilings: cuMemcpyDtoDAsync");
    return CINFER_STATUS_SUCCESS;
}

cinfer_status_t cli_copy_ceiling(const cinfer__cuda_t *cu, CUstream stream, size_t bytes,
                                 double *tbps) {
    copy_job_t j = {cu, 0, 0, bytes, stream};
    cinfer_status_t st = CINFER_STATUS_SUCCESS;
    CUresult res = cu->cuMemAlloc(&j.src, bytes);
    if (res == CUDA_SUCCESS)
        res = cu->cuMemAlloc(&j.dst, bytes);
    if (res == CUDA_SUCCESS)
        res = cu->cuMemsetD8(j.src, 0x5a, bytes);
    float ms = 0;
    if (res != CUDA_SUCCESS)
        st = cinfer__cu_error(res, "ceilings: copy buffers");
    else
        st = time_median(cu, stream, copy_once, &j, &ms);
    if (j.src)
        cu->cuMemFree(j.src);
    if (j.dst)
        cu->cuMemFree(j.dst);
    if (!st)
        *tbps = 2.0 * (double)bytes / (ms * 1e-3) / 1e12;
    return st;
}

/* ---- cuBLASLt ---- */

#define LT_FUNCS(X)                                                                                \
    X(cublasLtCreate)                                                                              \
    X(cublasLtDestroy)                                                                             \
    X(cublasLtMatmulDescCreate)                                                                    \
    X(cublasLtMatmulDescDestroy)                                                                   \
    X(cublasLtMatmulDescSetAttribute)                                                              \
    X(cublasLtMatrixLayoutCreate)                                                                  \
    X(cublasLtMatrixLayoutDestroy)                                                                 \
    X(cublasLtMatmulPreferenceCreate)                                                              \
    X(cublasLtMatmulPreferenceDestroy)                                                             \
    X(cublasLtMatmulPreferenceSetAttribute)                                                        \
    X(cublasLtMatmulAlgoGetHeuristic)                                                              \
    X(cublasLtMatmul)

typedef struct lt {
#define LT_FIELD(name) __typeof__(&name) name;
    LT_FUNCS(LT_FIELD)
#undef LT_FIELD
} lt_t;

/* The GEMM: M = N = K = GEMM_N, column-major C = A^T B (cuBLAS's fastest "TN" layout). */
#define GEMM_N  8192
#define LT_WS   (32u << 20)
#define LT_PATH 4096

typedef struct gemm_job {
    const lt_t *lt;
    cublasLtHandle_t handle;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t a_layout, b_layout, c_layout;
    cublasLtMatmulHeuristicResult_t algo;
    CUdeviceptr a, b, c, ws;
    CUstream stream;
} gemm_job_t;

static cinfer_status_t gemm_once(void *arg) {
    const gemm_job_t *j = arg;
    const float alpha = 1.0f, beta = 0.0f;
    const cublasStatus_t s = j->lt->cublasLtMatmul(
        j->handle, j->desc, &alpha, (const void *)(uintptr_t)j->a, j->a_layout,
        (const void *)(uintptr_t)j->b, j->b_layout, &beta, (const void *)(uintptr_t)j->c,
        j->c_layout, (void *)(uintptr_t)j->c, j->c_layout, &j->algo.algo, (void *)(uintptr_t)j->ws,
        LT_WS, (cudaStream_t)j->stream);
    if (s != CUBLAS_STATUS_SUCCESS)
        return cinfer__error(CINFER_STATUS_CUDA_ERROR, "cublasLtMatmul returned status %d", (int)s);
    return CINFER_STATUS_SUCCESS;
}

/* dlopen of libcublasLt: the toolkit's soname we were built with, then any, then the toolkit
 * folders. */
static void *open_lt(char *tried, size_t cap) {
    char candidates[6][LT_PATH];
    int n = 0;
    snprintf(candidates[n++], LT_PATH, "libcublasLt.so.%d", CUBLAS_VER_MAJOR);
    snprintf(candidates[n++], LT_PATH, "libcublasLt.so");
    const char *homes[] = {getenv("CUDA_HOME"), getenv("CUDA_PATH"), "/usr/local/cuda"};
    for (int i = 0; i < 3; i++)
        if (homes[i] && homes[i][0])
            snprintf(candidates[n++], LT_PATH, "%s/lib64/libcublasLt.so.%d", homes[i],
                     CUBLAS_VER_MAJOR);
    tried[0] = '\0';
    for (int i = 0; i < n; i++) {
        void *lib = dlopen(candidates[i], RTLD_NOW | RTLD_LOCAL);
        if (lib)
            return lib;
        const size_t len = strlen(tried);
        snprintf(tried + len, cap - len, "%s%s", i ? ", " : "", candidates[i]);
    }
    return NULL;
}

#define LT_CALL(call, what)                                                                        \
    do {                                                                                           \
        const cublasStatus_t s_ = lt.call;                                                         \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                         \
            st = cinfer__error(CINFER_STATUS_CUDA_ERROR, "cuBLASLt: %s returned status %d", what,  \
                               (int)s_);                                                           \
            goto out_free;                                                                         \
        }                                                                                          \
    } while (0)

cinfer_status_t cli_gemm_ceiling(const cinfer__cuda_t *cu, CUstream stream, double *tflops,
                                 char *source, size_t source_cap) {
    char tried[4 * LT_PATH];
    void *lib = open_lt(tried, sizeof tried);
    if (!lib)
        return cinfer__error(CINFER_STATUS_NOT_FOUND, "libcublasLt not found (tried %s)", tried);
    lt_t lt;
    cinfer_status_t st = CINFER_STATUS_SUCCESS;
#define LT_LOAD(name)                                                                              \
    lt.name = (__typeof__(&name))dlsym(lib, #name);                                                \
    if (!lt.name) {                                                                                \
        dlclose(lib);                                                                              \
        return cinfer__error(CINFER_STATUS_NOT_FOUND, "libcublasLt lacks %s", #name);              \
    }
    LT_FUNCS(LT_LOAD)
#undef LT_LOAD
    gemm_job_t j;
    memset(&j, 0, sizeof j);
    j.lt = &lt;
    j.stream = stream;
    const size_t bytes = (size_t)GEMM_N * GEMM_N * 2;
    CUresult res = cu->cuMemAlloc(&j.a, bytes);
    if (res == CUDA_SUCCESS)
        res = cu->cuMemAlloc(&j.b, bytes);
    if (res == CUDA_SUCCESS)
        res = cu->cuMemAlloc(&j.c, bytes);
    if (res == CUDA_SUCCESS)
        res = cu->cuMemAlloc(&j.ws, LT_WS);
    if (res != CUDA_SUCCESS) {
        st = cinfer__cu_error(res, "ceilings: GEMM buffers");
        goto out_free;
    }
    if ((st = fill_bf16(cu, j.a, bytes)) || (st = fill_bf16(cu, j.b, bytes)))
        goto out_free;
    LT_CALL(cublasLtCreate(&j.handle), "cublasLtCreate");
    LT_CALL(cublasLtMatmulDescCreate(&j.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F),
            "cublasLtMatmulDescCreate");
    const cublasOperation_t trans = CUBLAS_OP_T, plain = CUBLAS_OP_N;
    LT_CALL(
        cublasLtMatmulDescSetAttribute(j.desc, CUBLASLT_MATMUL_DESC_TRANSA, &trans, sizeof trans),
        "setting TRANSA");
    LT_CALL(
        cublasLtMatmulDescSetAttribute(j.desc, CUBLASLT_MATMUL_DESC_TRANSB, &plain, sizeof plain),
        "setting TRANSB");
    LT_CALL(cublasLtMatrixLayoutCreate(&j.a_layout, CUDA_R_16BF, GEMM_N, GEMM_N, GEMM_N),
            "cublasLtMatrixLayoutCreate");
    LT_CALL(cublasLtMatrixLayoutCreate(&j.b_layout, CUDA_R_16BF, GEMM_N, GEMM_N, GEMM_N),
            "cublasLtMatrixLayoutCreate");
    LT_CALL(cublasLtMatrixLayoutCreate(&j.c_layout, CUDA_R_16BF, GEMM_N, GEMM_N, GEMM_N),
            "cublasLtMatrixLayoutCreate");
    cublasLtMatmulPreference_t pref = NULL;
    LT_CALL(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
    const size_t ws = LT_WS;
    int found = 0;
    cublasStatus_t hs = lt.cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
    if (hs == CUBLAS_STATUS_SUCCESS)
        hs = lt.cublasLtMatmulAlgoGetHeuristic(j.handle, j.desc, j.a_layout, j.b_layout, j.c_layout,
                                               j.c_layout, pref, 1, &j.algo, &found);
    lt.cublasLtMatmulPreferenceDestroy(pref);
    if (hs != CUBLAS_STATUS_SUCCESS || found < 1) {
        st = cinfer__error(CINFER_STATUS_CUDA_ERROR,
                           "cuBLASLt: no algorithm for a bf16 %d^3 GEMM (status %d, %d found)",
                           GEMM_N, (int)hs, found);
        goto out_free;
    }
    float ms = 0;
    if ((st = time_median(cu, stream, gemm_once, &j, &ms)))
        goto out_free;
    *tflops = 2.0 * GEMM_N * (double)GEMM_N * GEMM_N / (ms * 1e-3) / 1e12;
    snprintf(source, source_cap, "cuBLASLt %d.x, bf16 %d^3, float32 accumulation", CUBLAS_VER_MAJOR,
             GEMM_N);
out_free:
    if (j.c_layout)
        lt.cublasLtMatrixLayoutDestroy(j.c_layout);
    if (j.b_layout)
        lt.cublasLtMatrixLayoutDestroy(j.b_layout);
    if (j.a_layout)
        lt.cublasLtMatrixLayoutDestroy(j.a_layout);
    if (j.desc)
        lt.cublasLtMatmulDescDestroy(j.desc);
    if (j.handle)
        lt.cublasLtDestroy(j.handle);
    /* cuBLASLt may still hold work on the stream when a call failed half way. */
    cu->cuStreamSynchronize(stream);
    if (j.a)
        cu->cuMemFree(j.a);
    if (j.b)
        cu->cuMemFree(j.b);
    if (j.c)
        cu->cuMemFree(j.c);
    if (j.ws)
        cu->cuMemFree(j.ws);
    /* The library stays loaded: unloading cuBLASLt while its context state lives is not safe. */
    return st;
}
