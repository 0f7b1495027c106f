/*
 * cinfer: an attention engine for LLM serving, in C.
 *
 * This header is the whole public contract of the library. What is not declared here is not API.
 *
 * Overview
 * --------
 * Every GPU kernel the library runs is described by a kernel spec, rendered to CUDA C, compiled at
 * run time with NVRTC (or ahead of time), cached on disk and loaded with the CUDA driver API.
 * libcuda.so.1 and libnvrtc are opened at first use with dlopen, so the library loads (and the
 * `cinfer` tool compiles kernels) on a machine without a GPU; every call that takes a context
 * (plans included) needs a device: there, cinfer_context_create returns
 * CINFER_STATUS_NO_DEVICE, and a call given no context returns INVALID_ARGUMENT (checked before
 * its other arguments, except a NULL result pointer: `out` or `device_bytes`).
 *
 * Conventions
 * -----------
 * - Every function returns a cinfer_status_t. On failure, cinfer_last_error() returns a message
 *   for the calling thread that names the argument, the value and what was expected.
 * - Tensors are described with DLPack's DLTensor (dlpack/dlpack.h). Shapes below are written
 *   row-major, last dimension first-fastest: "[n, H, D]" means shape {n, H, D}. The last dimension
 *   must be contiguous (stride 1, or strides == NULL for a compact tensor); other strides may be
 *   arbitrary (for example slices of a packed QKV tensor). Device tensors must live on the
 *   context's device (kDLCUDA with the same device_id). A tensor holds at most 2^48 elements and
 *   its strides reach at most 2^48 elements from its first (beyond any device's memory; so that
 *   no size or offset computed from them overflows); its byte_offset is at most 2^56; a 0-d
 *   tensor holds one element. A tensor a call writes (outputs, in-place states and caches) gives
 *   each index its own element: over its dims of more than one index, taken by increasing
 *   |stride|, each |stride| passes the span of those before it (INVALID_ARGUMENT otherwise).
 * - A tensor a call writes shares no byte with any other tensor of the call, input or output
 *   (a variant's tensor arguments included), nor with the workspace the call uses (its kernels
 *   would read what other threads already overwrote), except where a function allows an output
 *   to be one of its inputs exactly, in place: the same data + byte_offset, element size, shape
 *   and strides. Views that interleave without sharing an element (slices of a packed QKV
 *   tensor, the K and V halves of one combined cache) do not overlap: strided views are taken
 *   apart dim by dim, and only a layout too tangled to settle that way (thousands of rows of one
 *   between the rows of another) is refused without a shared byte. Inputs may overlap each
 *   other freely. INVALID_ARGUMENT otherwise, naming both tensors and their bytes.
 * - LSE (log-sum-exp) values are in base 2: lse = log2(sum_j exp(s_j)), where s_j are the logits
 *   in natural units. An empty state has lse = -inf and value 0.
 * - Work is enqueued on the CUDA stream passed as the last argument (NULL = the legacy default
 *   stream) and is asynchronous with respect to the host.
 * - Handles are opaque. Destroying NULL is a no-op. Options structs begin with `size` and
 *   `version` and must be initialized with their _INIT macro, so they can grow without breaking
 *   the ABI.
 * - Threading: functions are thread-safe unless a function says otherwise. A context may be used
 *   from several threads at once; a plan object may not.
 *
 * Environment variables (read once, at first use):
 *   CINFER_CACHE_DIR   kernel cache folder (default $XDG_CACHE_HOME/cinfer, else ~/.cache/cinfer)
 *   CINFER_LOG         0 = quiet (default), 1 = info (one line per JIT compile, and NVRTC's log
 *                      of a compile that has one), 2 = debug
 *   CINFER_JIT         "off" makes every compile an error (CINFER_STATUS_NOT_FOUND), to prove
 *                      kernels come from the AOT bundle or the cache
 *   CINFER_NVRTC_PATH  full path of libnvrtc to load instead of searching for it
 *   CINFER_CUDA_PATH   full path of the CUDA driver library (default libcuda.so.1)
 *   CINFER_AOT_PATH    the ahead-of-time kernel bundle (`cinfer aot`). Without it the library
 *                      looks for libcinfer.aot next to libcinfer.so; a program that links the
 *                      library statically has no such folder and uses no bundle unless this is
 *                      set. Kernels are looked up in the process's loaded modules, then the
 *                      bundle, then the disk cache, and compiled last.
 */
#ifndef CINFER_H
#define CINFER_H

#include <stddef.h>
#include <stdint.h>

#include <cuda.h>
#include <dlpack/dlpack.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define CINFER_API __attribute__((visibility("default")))
#else
#define CINFER_API
#endif

/* ---------------------------------------------------------------------------------------------
 * Versions
 * ------------------------------------------------------------------------------------------- */

#define CINFER_VERSION_MAJOR 0
#define CINFER_VERSION_MINOR 1
#define CINFER_VERSION_PATCH 0
/* The version as one integer: major * 10000 + minor * 100 + patch. */
#define CINFER_VERSION                                                                             \
    (CINFER_VERSION_MAJOR * 10000 + CINFER_VERSION_MINOR * 100 + CINFER_VERSION_PATCH)

/* The version of the library loaded at run time, in the CINFER_VERSION encoding. */
CINFER_API int cinfer_version(void);
/* The same as a static string, "major.minor.patch". */
CINFER_API const char *cinfer_version_string(void);

/* ---------------------------------------------------------------------------------------------
 * Status codes
 * ------------------------------------------------------------------------------------------- */

/* X(name, value, description): the one table of status codes and their strings. */
#define CINFER_STATUS_LIST(X)                                                                      \
    X(SUCCESS, 0, "success")                                                                       \
    X(INVALID_ARGUMENT, 1, "invalid argument")                                                     \
    X(UNSUPPORTED, 2, "unsupported configuration")                                                 \
    X(NO_DEVICE, 3, "no CUDA device or driver")                                                    \
    X(CUDA_ERROR, 4, "CUDA driver error")                                                          \
    X(COMPILE_ERROR, 5, "kernel compilation failed")                                               \
    X(OUT_OF_MEMORY, 6, "out of memory")                                                           \
    X(WORKSPACE_TOO_SMALL, 7, "workspace too small")                                               \
    X(NOT_FOUND, 8, "kernel not found (JIT off and not in the AOT bundle)")                        \
    X(PLAN_MISMATCH, 9, "run arguments contradict the plan")                                       \
    X(IO_ERROR, 10, "file input/output error")                                                     \
    X(INTERNAL, 11, "internal error")

typedef enum cinfer_status {
#define CINFER__STATUS_ENUM(name, value, text) CINFER_STATUS_##name = value,
    CINFER_STATUS_LIST(CINFER__STATUS_ENUM)
#undef CINFER__STATUS_ENUM
} cinfer_status_t;

/* The static description of a status code ("invalid argument"); "unknown status" otherwise. */
CINFER_API const char *cinfer_status_string(cinfer_status_t status);
/* The static name of a status code ("CINFER_STATUS_INVALID_ARGUMENT"). */
CINFER_API const char *cinfer_status_name(cinfer_status_t status);

/*
 * The message of the last failing call made by this thread ("" if none). The pointer stays valid
 * until the next cinfer call on this thread. Successful calls do not clear it.
 */
CINFER_API const char *cinfer_last_error(void);

/* ---------------------------------------------------------------------------------------------
 * Context: one CUDA device
 * ------------------------------------------------------------------------------------------- */

typedef struct cinfer_context cinfer_context_t;

typedef struct cinfer_context_options {
    size_t size;      /* sizeof(cinfer_context_options_t) */
    uint32_t version; /* CINFER_CONTEXT_OPTIONS_VERSION */
    int device;       /* CUDA device ordinal */
} cinfer_context_options_t;

#define CINFER_CONTEXT_OPTIONS_VERSION 1
#define CINFER_CONTEXT_OPTIONS_INIT                                                                \
    { sizeof(cinfer_context_options_t), CINFER_CONTEXT_OPTIONS_VERSION, 0 }

/*
 * Creates a context bound to one CUDA device. The context retains the device's primary CUDA
 * context (the one the CUDA runtime and frameworks such as PyTorch use), so tensors allocated by
 * them can be passed directly. Compiled kernels are loaded into the context on first use and
 * kept until cinfer_context_destroy.
 *
 * options: NULL for the defaults (device 0).
 * out: receives the new context; set to NULL on failure.
 * Returns: SUCCESS; INVALID_ARGUMENT (out NULL, bad options size/version, device out of range);
 * NO_DEVICE (no driver, or no device); CUDA_ERROR.
 * Thread-safe.
 */
CINFER_API cinfer_status_t cinfer_context_create(const cinfer_context_options_t *options,
                                                 cinfer_context_t **out);

/* Unloads the context's kernels and releases the device's primary context. NULL is a no-op. The
 * caller must make sure no work the context enqueued is still running on any stream. */
CINFER_API void cinfer_context_destroy(cinfer_context_t *ctx);

/* The device ordinal and the compute capability (e.g. 90 for sm_90) of the context's device. */
CINFER_API cinfer_status_t cinfer_context_get_device(const cinfer_context_t *ctx, int *device,
                                                     int *compute_capability);

/* ---------------------------------------------------------------------------------------------
 * JIT and kernel cache
 * ------------------------------------------------------------------------------------------- */

typedef struct cinfer_jit_stats {
    size_t size;                /* sizeof(cinfer_jit_stats_t), set by the caller */
    uint32_t version;           /* CINFER_JIT_STATS_VERSION, set by the caller */
    uint64_t memory_hits;       /* kernels found already loaded in the context */
    uint64_t disk_hits;         /* kernels loaded from the disk cache */
    uint64_t aot_hits;          /* kernels loaded from the AOT bundle */
    uint64_t misses;            /* lookups that needed a compile */
    uint64_t compiles;          /* NVRTC compiles done by this process */
    double compile_seconds;     /* wall time spent in NVRTC by this process */
    uint64_t cache_write_fails; /* entries that could not be written (read-only cache) */
} cinfer_jit_stats_t;

#define CINFER_JIT_STATS_VERSION 1
#define CINFER_JIT_STATS_INIT                                                                      \
    { sizeof(cinfer_jit_stats_t), CINFER_JIT_STATS_VERSION, 0, 0, 0, 0, 0, 0.0, 0 }

/* Copies the process-wide JIT statistics into *stats (initialized with CINFER_JIT_STATS_INIT). */
CINFER_API cinfer_status_t cinfer_jit_get_stats(cinfer_jit_stats_t *stats);

/*
 * The kernel cache folder in use (CINFER_CACHE_DIR, else $XDG_CACHE_HOME/cinfer, else
 * ~/.cache/cinfer). The pointer is static and valid for the life of the process.
 */
CINFER_API const char *cinfer_cache_dir(void);

/* ---------------------------------------------------------------------------------------------
 * Merging attention states
 *
 * An attention state is the pair (v, lse) of a partial attention result over a subset of the KV
 * positions: v is the softmax-weighted sum of values over that subset and lse = log2(sum exp(s))
 * of its logits. Two states over disjoint subsets merge exactly into the state over their union:
 *   lse = log2(2^lse_a + 2^lse_b),  v = (2^lse_a v_a + 2^lse_b v_b) / 2^lse.
 * Empty states (lse = -inf) contribute nothing; two empty states merge to (0, -inf).
 * Values are fp16 or bf16; lse is float32. Head dims 1 <= D <= 1024 (beyond: UNSUPPORTED); v's
 * last dim must be contiguous.
 * ------------------------------------------------------------------------------------------- */

/*
 * v_out, lse_out = merge((v_a, lse_a), (v_b, lse_b)).
 * v_a, v_b, v_out: [n, H, D] fp16 or bf16 (one dtype for all three).
 * lse_a, lse_b, lse_out: [n, H] float32, base 2.
 * An output may be an input exactly (in place: the same data + byte_offset, shape and strides);
 * any other overlap of an output with an input or the other output is INVALID_ARGUMENT.
 * Returns SUCCESS, INVALID_ARGUMENT, UNSUPPORTED, NO_DEVICE, CUDA_ERROR, COMPILE_ERROR, NOT_FOUND.
 */
CINFER_API cinfer_status_t cinfer_merge_state(cinfer_context_t *ctx, const DLTensor *v_a,
                                              const DLTensor *lse_a, const DLTensor *v_b,
                                              const DLTensor *lse_b, DLTensor *v_out,
                                              DLTensor *lse_out, CUstream stream);

/*
 * (v, lse) = merge((v, lse), (v_other, lse_other)) in place, for the rows where mask is nonzero.
 * v, v_other: [n, H, D] fp16 or bf16; lse, lse_other: [n, H] float32 base 2;
 * mask: NULL (every row) or [n] uint8/bool on the device.
 * v_other and lse_other may be v and lse exactly (a state merged with itself); otherwise
 * v_other, lse_other and mask must not overlap v or lse, nor v and lse each other
 * (INVALID_ARGUMENT).
 * Returns SUCCESS, INVALID_ARGUMENT, UNSUPPORTED, NO_DEVICE, CUDA_ERROR, COMPILE_ERROR, NOT_FOUND.
 */
CINFER_API cinfer_status_t cinfer_merge_state_in_place(cinfer_context_t *ctx, DLTensor *v,
                                                       DLTensor *lse, const DLTensor *v_other,
                                                       const DLTensor *lse_other,
                                                       const DLTensor *mask, CUstream stream);

/*
 * Folds num_states states per row: v: [n, num_states, H, D] fp16 or bf16, lse: [n, num_states, H]
 * float32 -> v_out: [n, H, D] (same dtype as v), lse_out: [n, H] float32. num_states may be 0
 * (every output row is (0, -inf)). lse_out may be NULL. v_out and lse_out must not overlap v,
 * lse or each other (INVALID_ARGUMENT).
 * Returns SUCCESS, INVALID_ARGUMENT, UNSUPPORTED, NO_DEVICE, CUDA_ERROR, COMPILE_ERROR, NOT_FOUND.
 */
CINFER_API cinfer_status_t cinfer_merge_states(cinfer_context_t *ctx, const DLTensor *v,
                                               const DLTensor *lse, DLTensor *v_out,
                                               DLTensor *lse_out, CUstream stream);

/* ---------------------------------------------------------------------------------------------
 * Attention variants
 *
 * Every attention kernel (single and batch, decode and prefill) is written once against a small
 * variant interface: hooks with fixed names that a variant may define in CUDA C. Default attention
 * is the built-in variant (options->variant = NULL) whose parameters come from the options
 * (sm_scale, logits_soft_cap, window_left, k_scale, v_scale). A variant is compiled into the
 * kernels that use it (its source is part of every cache key), so an unused hook costs nothing.
 *
 * Source: CUDA C compiled after the kernel's prelude. It sees the generated struct
 * `cinfer_variant_params` (the declared parameters, in order: a tensor is a `T *` member named
 * like it, pointing at its element 0, with T = float, double, int32_t, int64_t, uint32_t, uint8_t,
 * or cinfer_half_bits (the raw bits of float16 / bfloat16; convert with cinfer_f16_to_f32 /
 * cinfer_bf16_to_f32); a scalar is a member of its C type), then defines any
 * of these hooks, announcing each with its macro (a hook defined without its macro is a
 * redefinition error; a macro without the hook does not compile):
 *
 *   #define VARIANT_QUERY_TRANSFORM 1
 *   __device__ float variant_query_transform(const cinfer_variant_params *params, float q,
 *       int batch_idx, int qo_idx, int qo_head_idx, int dim_idx);
 *     each query element q[dim_idx] as the kernel loads it (after in-kernel RoPE, before
 *     sm_scale); returns the new element, which prefill rounds back to q's 16-bit dtype. Prefill
 *     runs such a variant on the mma.sync template (the sm90 kernel takes no transforms).
 *   #define VARIANT_LOGITS_TRANSFORM 1
 *   __device__ float variant_logits_transform(const cinfer_variant_params *params, float logit,
 *       int batch_idx, int qo_idx, int kv_idx, int qo_head_idx, int kv_head_idx);
 *     logit = (q . k) * sm_scale * k_scale, natural-log units; returns the new logit (with
 *     VARIANT_USE_SOFTMAX 0: the unnormalized weight itself).
 *   #define VARIANT_LOGITS_MASK 1
 *   __device__ bool variant_logits_mask(const cinfer_variant_params *params, int batch_idx,
 *       int qo_idx, int kv_idx, int qo_head_idx, int kv_head_idx);
 *     false drops the position (after the kernel's own causal / window masks).
 *   #define VARIANT_LOGITS_MASK_BITS 1
 *   __device__ uint32_t variant_logits_mask_bits(const cinfer_variant_params *params,
 *       int batch_idx, int qo_idx, int kv_idx, int count, int qo_head_idx, int kv_head_idx);
 *     the same mask for count (1..32) consecutive positions of one query: bit k keeps
 *     kv_idx + k; bits at or above count are ignored, and their positions (which may lie past the
 *     request) must not be read. Prefill asks for whole runs of 32, so a mask stored as bits costs
 *     a word or two per 32 logits instead of a load per logit.
 *   #define VARIANT_LOGITS_MASK_ROW 1
 *   __device__ const uint32_t *variant_logits_mask_row(const cinfer_variant_params *params,
 *       int batch_idx, int qo_idx, int qo_head_idx, int kv_head_idx, int64_t *bit);
 *     the same mask for a whole query row, as bits in device memory: kv_idx is kept when bit
 *     b = *bit + kv_idx of the returned 4-byte aligned words is set (bit b & 31 of word b >> 5).
 *     Kernels read only whole words that hold the bit of some kv_idx inside the request. Prefill
 *     copies each KV tile's words into shared memory with the tile's K and V, and skips the
 *     per-position test on a tile whose positions all the queries of a warp keep.
 *   Define any of the three mask hooks: those left out are built from the others (one position
 *   is a run of count 1; the row form gives the bit words), except the row form itself.
 *   #define VARIANT_ALIBI_SLOPE 1
 *   __device__ float variant_alibi_slope(const cinfer_variant_params *params, int batch_idx,
 *       int qo_head_idx);
 *     a bias linear in the relative position (ALiBi): the logit gains
 *     slope * (kv_idx - qo_idx), natural-log units, before the logits transform sees it. As the
 *     slope depends only on the request and the head, prefill without a logits transform asks
 *     for it once and adds the bias with an fma per logit (a transform pays a conversion and an
 *     fma per logit). Prefill holds the bias in units of its kernels' q . k, slope * (kv_idx -
 *     qo_idx) / q_scale, in float32, where q_scale = sm_scale * k_scale for 16-bit K/V; for fp8
 *     K/V q_scale = k_scale (* 256 for e4m3 on the sm80 template), because the kernel multiplies
 *     q by sm_scale as it converts it, so sm_scale does not enter. Prefill refuses
 *     (CINFER_STATUS_UNSUPPORTED) such a variant when q_scale (k_scale for e4m3) is below 2^-64;
 *     with |kv_idx - qo_idx| < 2^31 the bias then stays finite for |slope| up to 2^32. Larger
 *     slopes are not checked (the hook is device code) and may make the bias infinite.
 *   #define VARIANT_STATE_INIT 1
 *   __device__ void variant_state_init(const cinfer_variant_params *params, int batch_idx,
 *       int qo_idx, int qo_head_idx, float *max_log2, float *denominator);
 *     the online softmax's running max (base-2 units) and denominator before the first KV
 *     position (default -inf and 0); a sink logit s adds exp(s) to the denominator by setting
 *     *max_log2 = s * log2(e), *denominator = 1. Applied once per query row, also under split-KV.
 *   #define VARIANT_OUTPUT_TRANSFORM 1
 *   __device__ float variant_output_transform(const cinfer_variant_params *params, float o,
 *       int batch_idx, int qo_idx, int qo_head_idx, int dim_idx);
 *     each output element after normalization and v_scale (turns off split-KV in decode).
 *   #define VARIANT_USE_SOFTMAX 0
 *     no softmax: o = v_scale * sum_j w_j v_j with w_j the transformed logit (0 where masked);
 *     there is no LSE (lse must be NULL) and no split-KV.
 *
 * Indices passed to hooks are absolute: qo_idx is the query's position in its request
 * (bottom-right aligned: row i of qo_len rows over kv_len keys is at i + kv_len - qo_len; decode's
 * one row is at kv_len - 1), kv_idx the key's position, batch_idx the request (0 for single
 * requests). Hooks are only called for positions inside the request (0 <= kv_idx < kv_len) and
 * query heads that exist, but possibly more than once for the same position (several threads
 * may evaluate one logit), so side effects must be idempotent (plain stores of the same value).
 * ------------------------------------------------------------------------------------------- */

typedef struct cinfer_variant cinfer_variant_t;

typedef enum cinfer_param_kind {
    CINFER_PARAM_TENSOR = 1, /* a device tensor; a name starting with maybe_ may be given NULL */
    CINFER_PARAM_SCALAR = 2, /* a scalar passed by value */
} cinfer_param_kind_t;

/* One declared parameter of a variant. Tensors come first, then scalars. dtype: a tensor's
 * element type (float16, bfloat16, float32, float64, int32, int64, uint32, uint8) or a scalar's
 * C type (float32 = float, float64 = double, int32 = int32_t, int64 = int64_t, uint32 =
 * uint32_t). name: a C identifier of at most 63 characters, unique within the variant, not a
 * C/C++ keyword, not reserved (__x, _X) and not starting with cinfer_ (it becomes a member of the
 * generated struct). */
typedef struct cinfer_param {
    const char *name;
    cinfer_param_kind_t kind;
    DLDataType dtype;
} cinfer_param_t;

/* One run-time argument, matched by position against the declaration. */
typedef struct cinfer_arg {
    cinfer_param_kind_t kind;
    const DLTensor *tensor; /* CINFER_PARAM_TENSOR: on the context's device, contiguous */
    DLDataType dtype;       /* CINFER_PARAM_SCALAR: must equal the declared type */
    union {
        float f32;
        double f64;
        int32_t i32;
        int64_t i64;
        uint32_t u32;
    } value;
} cinfer_arg_t;

/* The argument list of one run: num_args arguments, in declaration order. A run of a variant
 * without parameters, or of default attention, takes NULL. */
typedef struct cinfer_args {
    int num_args;
    const cinfer_arg_t *args;
} cinfer_args_t;

/* Argument constructors (C99 compound literals): CINFER_ARG_TENSOR(&t), CINFER_ARG_F32(0.5f). */
#define CINFER_ARG_TENSOR(t) ((cinfer_arg_t){CINFER_PARAM_TENSOR, (t), {kDLFloat, 0, 0}, {0}})
#define CINFER_ARG_F32(x)                                                                          \
    ((cinfer_arg_t){CINFER_PARAM_SCALAR, NULL, {kDLFloat, 32, 1}, {.f32 = (x)}})
#define CINFER_ARG_F64(x)                                                                          \
    ((cinfer_arg_t){CINFER_PARAM_SCALAR, NULL, {kDLFloat, 64, 1}, {.f64 = (x)}})
#define CINFER_ARG_I32(x) ((cinfer_arg_t){CINFER_PARAM_SCALAR, NULL, {kDLInt, 32, 1}, {.i32 = (x)}})
#define CINFER_ARG_I64(x) ((cinfer_arg_t){CINFER_PARAM_SCALAR, NULL, {kDLInt, 64, 1}, {.i64 = (x)}})
#define CINFER_ARG_U32(x)                                                                          \
    ((cinfer_arg_t){CINFER_PARAM_SCALAR, NULL, {kDLUInt, 32, 1}, {.u32 = (x)}})

/*
 * Creates a variant from its name (a C identifier, at most 63 characters, used in kernel names),
 * its CUDA C source (copied) and its parameter declarations (copied; num_params 0..32, params
 * may be NULL when 0). Checks the declaration (names, order: tensors before scalars, dtypes) but
 * does not compile: a compile error in the source is reported by the first operation that needs
 * a kernel, as COMPILE_ERROR with NVRTC's log (lines of the source are numbered from 1 under the
 * file name "variant:NAME"). A variant may be shared by any number of operations and threads;
 * destroy it only after every operation created with it.
 * Returns SUCCESS, INVALID_ARGUMENT (naming the parameter), OUT_OF_MEMORY.
 */
CINFER_API cinfer_status_t cinfer_variant_create(const char *name, const char *source,
                                                 const cinfer_param_t *params, int num_params,
                                                 cinfer_variant_t **out);

/*
 * The built-in example variants, written like user code (cinfer_variant_source gives their
 * sources):
 *   "sigmoid":     no softmax; w = 1 / (1 + exp(-(logit * scale + bias))). Scalars: float scale,
 *                  float bias.
 *   "sinks":       one learned logit per query head in the softmax denominator (gpt-oss).
 *                  Tensor: float32 sinks [Hq] (natural-log units).
 *   "alibi":       logit + slope[h] * (kv_idx - qo_idx) (VARIANT_ALIBI_SLOPE). Tensor: float32
 *                  maybe_alibi_slopes [Hq] (NULL = the ALiBi paper's slopes for num_heads heads);
 *                  scalar: int32 num_heads >= 1.
 *   "dump_logits": default attention that also writes every visited logit (after scaling, in
 *                  natural-log units) to logits[row_offset[batch_idx] + qo_head_idx * head_stride
 *                  + qo_idx * pos_stride + kv_idx]. Tensors: float32 logits, int64 row_offset
 *                  [batch]; scalars: int64 head_stride, int64 pos_stride.
 *   "custom_mask": default attention with a bit-packed boolean mask per request (packbits'
 *                  "little" bit order): position qo_idx of request b sees kv_idx when bit
 *                  row_offset[b] + qo_idx * row_stride[b] + kv_idx of packed_mask is set; for a
 *                  request's [qo_len, kv_len] row-major mask at byte mask_indptr[b],
 *                  row_stride[b] = kv_len and row_offset[b] = 8 mask_indptr[b] - (kv_len -
 *                  qo_len) kv_len. Tensors: uint8 packed_mask, int64 row_offset [batch], int32
 *                  row_stride [batch]. The mask is read in aligned 4-byte words (its row form,
 *                  VARIANT_LOGITS_MASK_ROW): the words that hold its first and last bytes are
 *                  read whole, up to 3 bytes beyond the tensor on either side.
 * A run checks the built-ins' 1-d tensors of [Hq] and [batch] (batch: the plan's requests; 1 for
 * single decode and prefill) to hold at least that many elements (INVALID_ARGUMENT); a CUDA graph
 * captured once replays with the tensors of its capture, so size them for the largest batch it
 * replays. The offsets into logits and packed_mask are device data, which the caller keeps
 * within those tensors.
 * The returned object is owned by the library (never destroy it). NULL for an unknown name.
 */
CINFER_API const cinfer_variant_t *cinfer_variant_builtin(const char *name);

/* The variant's name; its source; its parameter declarations (*num_params receives the count).
 * For NULL: NULL, NULL, and NULL with *num_params = 0. */
CINFER_API const char *cinfer_variant_name(const cinfer_variant_t *variant);
CINFER_API const char *cinfer_variant_source(const cinfer_variant_t *variant);
CINFER_API const cinfer_param_t *cinfer_variant_params(const cinfer_variant_t *variant,
                                                       int *num_params);

/* Destroys a variant made by cinfer_variant_create. NULL and built-ins are no-ops. */
CINFER_API void cinfer_variant_destroy(cinfer_variant_t *variant);

/* ---------------------------------------------------------------------------------------------
 * Attention options, shared by decode and prefill
 * ------------------------------------------------------------------------------------------- */

typedef enum cinfer_kv_layout {
    CINFER_KV_LAYOUT_NHD = 0, /* K/V [.., tokens, Hk, D]: paged [max_pages, page_size, Hk, D] */
    CINFER_KV_LAYOUT_HND = 1, /* K/V [.., Hk, tokens, D]: paged [max_pages, Hk, page_size, D] */
} cinfer_kv_layout_t;

/* Position encodings the attention kernels apply themselves (FlashInfer's pos_encoding_mode; its
 * "ALIBI" is the built-in "alibi" variant here). */
typedef enum cinfer_pos_encoding {
    CINFER_POS_ENCODING_NONE = 0,       /* q and k are used as given */
    CINFER_POS_ENCODING_ROPE_LLAMA = 1, /* rotary embedding of q and k, Llama rotate-half */
} cinfer_pos_encoding_t;

/* The largest qo_len and kv_len of attention with in-kernel RoPE: positions are exact in float32
 * below 2^24. */
#define CINFER_ROPE_MAX_LEN (1 << 24)

/*
 * What a batch of attention computes (SEMANTICS.md): heads, head dims, dtypes, KV layout, scaling
 * and masks. Initialize with CINFER_ATTENTION_OPTIONS_INIT and set the fields you need.
 *
 * The logit of query row i and KV position j is s = (q_i . k_j) * sm_scale * k_scale, then
 * s = c * tanh(s / c) when logits_soft_cap = c > 0; positions j < p_i - window_left are masked
 * when window_left >= 0 (p_i is the query's absolute position, kv_len - 1 in decode). The output
 * is softmax(s) V * v_scale, accumulated in float32. LSE is log2(sum_j exp(s_j)).
 *
 * In-kernel RoPE (pos_encoding_mode = CINFER_POS_ENCODING_ROPE_LLAMA, FlashInfer's "ROPE_LLAMA"):
 * before the dot product, q_i is rotated at its position p_i (row i of qo_len rows over kv_len
 * keys is at i + kv_len - qo_len; decode's one row at kv_len - 1) and k_j at its position j in the
 * request's KV (the cache holds un-rotated K; the kernels rotate what they read; V is never
 * rotated). Llama's rotate-half convention over the whole head dim D: pair m in [0, D/2) is
 * (x[m], x[m + D/2]), rotated by the angle a = (pos / rope_scale) * rope_theta^(-2m / D) radians:
 *   out[m]       = x[m] cos(a) - x[m + D/2] sin(a),
 *   out[m + D/2] = x[m + D/2] cos(a) + x[m] sin(a)
 * (Su et al., "RoFormer", 2021; the pairing of Hugging Face's LlamaModel). The rotation is
 * computed in float32 with the angle reduced to one turn in extended precision (error about 1e-6
 * absolute in cos/sin at any position below 2^24); prefill rounds the rotated q and k to the
 * 16-bit input dtype before its tensor-core products, decode keeps them in float32. Limits:
 * head_dim a multiple of 16; qo_len and kv_len at most CINFER_ROPE_MAX_LEN (2^24, positions stay
 * exact in float32); prefill (single and batch) with fp8 KV and the tensor-core decode kernel
 * (use_tensor_cores = 1) are UNSUPPORTED with RoPE (-1 picks the CUDA-core decode kernel). A
 * variant sees the rotated q (its query transform runs after the rotation) and logits of rotated
 * vectors. RoPE is compiled into the kernels (part of their cache key); rope_scale and rope_theta
 * are run-time values.
 */
typedef struct cinfer_attention_options {
    size_t size;      /* sizeof(cinfer_attention_options_t) */
    uint32_t version; /* CINFER_ATTENTION_OPTIONS_VERSION */
    int num_qo_heads; /* Hq, a multiple of num_kv_heads */
    int num_kv_heads; /* Hk */
    int head_dim;     /* D of q and k, and of v and out unless head_dim_vo is set (a multiple of
                         8 for decode, of 16 for prefill; 64, 128, 256 are the fast paths) */
    int page_size;    /* tokens per page of the paged KV cache, 1..256 (batch decode, paged batch
                         prefill) */
    cinfer_kv_layout_t kv_layout;
    DLDataType q_dtype;     /* fp16 or bf16; out has the same dtype */
    DLDataType kv_dtype;    /* fp16, bf16, or fp8 (DLPack float8_e4m3fn = code 10, e5m2 = code 12,
                               bits 8) with k_scale/v_scale */
    float sm_scale;         /* 0 = 1 / sqrt(head_dim) */
    float logits_soft_cap;  /* 0 = off */
    int window_left;        /* -1 = off */
    float k_scale, v_scale; /* dequantization scales of fp8 KV; 1 otherwise */
    int use_cuda_graph;     /* 1 = fixed grid and buffers for up to max_batch_size requests */
    int max_batch_size;     /* batch decode: the most requests one plan may hold */
    /* Decode: 1 = tensor-core kernel (GQA heads as mma rows; KV of q's 16-bit dtype, or fp8
     * converted to fp16 on the way, in which case q * sm_scale and the softmax weights are rounded
     * to fp16 too, 2^-11 relative; head dim 64, 128 or 256; else UNSUPPORTED), 0 = CUDA-core
     * kernel, -1 (default) = the tensor-core kernel where it can run, else the CUDA-core one. */
    int use_tensor_cores;
    /* The attention variant: NULL = default attention. A custom variant takes its parameters from
     * the run's argument list; logits_soft_cap must then be 0 (the variant transforms logits
     * itself); sm_scale, k_scale, v_scale, window_left and causal masking still apply. */
    const cinfer_variant_t *variant;
    /* Position encoding applied inside the kernels (see above): NONE (default) or ROPE_LLAMA. */
    cinfer_pos_encoding_t pos_encoding_mode;
    float rope_scale; /* ROPE_LLAMA: > 0, positions are divided by it (default 1) */
    float rope_theta; /* ROPE_LLAMA: > 0, the frequency base (default 1e4) */
    /* D of v and out when it differs from head_dim (D_qk != D_vo, e.g. 192 / 128); 0 (default) =
     * head_dim. Single and batch prefill with 16-bit K/V, no in-kernel RoPE, both dims multiples
     * of 16 up to 256 (on sm_90a 192 / 128 runs the wgmma/TMA kernel where it applies, else the
     * mma.sync template at the larger dim); the default sm_scale stays 1/sqrt(head_dim). Decode
     * returns CINFER_STATUS_UNSUPPORTED for it. */
    int head_dim_vo;
} cinfer_attention_options_t;

#define CINFER_ATTENTION_OPTIONS_VERSION 4
#define CINFER_ATTENTION_OPTIONS_INIT                                                              \
    {                                                                                              \
        sizeof(cinfer_attention_options_t), CINFER_ATTENTION_OPTIONS_VERSION, 0, 0, 0, 16,         \
            CINFER_KV_LAYOUT_NHD, {kDLBfloat, 16, 1}, {kDLBfloat, 16, 1}, 0.0f, 0.0f, -1, 1.0f,    \
            1.0f, 0, 1, -1, NULL, CINFER_POS_ENCODING_NONE, 1.0f, 1e4f, 0                          \
    }

/* ---------------------------------------------------------------------------------------------
 * Decode: one query token per request over its KV cache
 * ------------------------------------------------------------------------------------------- */

typedef struct cinfer_batch_decode cinfer_batch_decode_t;

/*
 * The device workspace (bytes) a batch decode object needs for these options on this context's
 * device: the schedule (work items, per-request merge information) and the float32 split-KV
 * partial states of any plan of up to options->max_batch_size requests. The size is exact: create
 * accepts exactly this many bytes or more. It depends on how many decode CTAs fit on the device
 * at once, so, like create, it loads the decode kernels (JIT-compiling them on first use).
 * *device_bytes is 0 on failure. Decode supports head_dim a multiple of 8 up to 256 and
 * page_size 1..256.
 * Returns SUCCESS, INVALID_ARGUMENT or UNSUPPORTED (naming the option), NO_DEVICE, CUDA_ERROR,
 * COMPILE_ERROR, NOT_FOUND.
 */
CINFER_API cinfer_status_t cinfer_batch_decode_workspace_size(
    cinfer_context_t *ctx, const cinfer_attention_options_t *options, size_t *device_bytes);

/*
 * Creates a batch decode object over a caller-owned device workspace of workspace_bytes bytes
 * (device memory of the context's device, at least cinfer_batch_decode_workspace_size, 256-byte
 * aligned). Validates the options and loads (JIT-compiling on first use) the kernels they need,
 * so plan and run never compile. The object also owns a small pinned host buffer for staging
 * schedules. The workspace must outlive the object. *out is NULL on failure.
 * Returns SUCCESS, INVALID_ARGUMENT, UNSUPPORTED, WORKSPACE_TOO_SMALL, NO_DEVICE, CUDA_ERROR,
 * COMPILE_ERROR, NOT_FOUND, OUT_OF_MEMORY. Not thread-safe per object.
 */
CINFER_API cinfer_status_t cinfer_batch_decode_create(cinfer_context_t *ctx,
                                                      const cinfer_attention_options_t *options,
                                                      void *workspace, size_t workspace_bytes,
                                                      cinfer_batch_decode_t **out);

/*
 * Plans one decode step (once per step, shared by all layers): from the host copies of the page
 * table's kv_indptr [batch_size + 1] and kv_last_page_len [batch_size] (int32), chooses the
 * split-KV schedule (one wave of chunks, or beyond one wave equal-cost runs of the requests' KV
 * ranges per group of CTAs) and writes it into the workspace with an asynchronous copy on
 * stream (runs on another stream must be ordered after it by the caller, and the plan after the
 * earlier plans and runs of the object on other streams: they share the workspace). A plan is
 * never captured into a CUDA graph (only run is): a capturing stream is INVALID_ARGUMENT, before
 * the previous plan is touched. kv_len of request b =
 * (pages - 1) * page_size + last_page_len (0 without pages; last_page_len is then ignored); with
 * window_left = w >= 0 only the last w + 1 positions of each request are scheduled. The schedule
 * is staged in the object's pinned host buffers: plan blocks only until the copy made two plans
 * earlier has completed. An argument error leaves the previous plan in place.
 * Returns SUCCESS, INVALID_ARGUMENT (op NULL, batch_size outside [0, options->max_batch_size],
 * kv_indptr[0] < 0, non-monotone kv_indptr, last_page_len outside [1, page_size] for a request
 * with pages, kv_len above 2^31 - 1; the message names the index and value; a capturing
 * stream), UNSUPPORTED (with in-kernel RoPE, a kv_len above CINFER_ROPE_MAX_LEN, naming the
 * request), OUT_OF_MEMORY (host scratch of a schedule beyond one wave), CUDA_ERROR. Not
 * thread-safe per object.
 */
CINFER_API cinfer_status_t cinfer_batch_decode_plan(cinfer_batch_decode_t *op,
                                                    const int32_t *kv_indptr,
                                                    const int32_t *kv_last_page_len, int batch_size,
                                                    CUstream stream);

/*
 * Runs the planned step on stream (once per layer): never allocates, synchronizes, compiles or
 * logs, so it can be captured in a CUDA graph. In graph mode (use_cuda_graph = 1) the grids are
 * fixed for max_batch_size and the kernels read the batch size and schedule from the workspace,
 * so a captured run replays correctly after any later plan, provided the captured tensors (same
 * addresses and strides) hold the new step's data: capture with buffers that have room for the
 * largest batch you will replay.
 * q: [batch, Hq, D] q_dtype, batch = the planned batch_size. k_cache, v_cache: paged caches in
 * kv_layout and kv_dtype ([max_pages, page_size, Hk, D] NHD or [max_pages, Hk, page_size, D] HND),
 * with the same shape and strides; or k_cache = the combined cache [max_pages, 2, ...] (index
 * 0 = K, 1 = V) and v_cache = NULL. kv_indptr [batch + 1], kv_indices [>= kv_indptr[batch]],
 * kv_last_page_len [batch]: int32 on the device, the same values that were planned (page indices
 * are not range-checked). out: [batch, Hq, D] q_dtype. lse: NULL or [batch, Hq] float32 (base 2).
 * The kernels read rows with vector loads: q, out, k and v rows must start on 16-byte boundaries
 * (8 bytes for fp8 KV on the CUDA-core kernel), i.e. the data addresses and the strides of every
 * dimension longer than 1.
 * args: the arguments of options->variant (NULL for default attention and for variants without
 * parameters), checked against its declaration; they are passed by value, so a captured graph
 * replays with the values of the capture.
 * out and lse must not overlap each other, q, the caches, the page table, the workspace or the
 * tensors of args.
 * Returns SUCCESS; INVALID_ARGUMENT (NULL, no plan yet, wrong ndim, non-contiguous last dim, not
 * on the context's device, index arrays not int32, lse not float32, out or lse overlapping
 * another tensor or the workspace); PLAN_MISMATCH (shapes or dtypes that differ from the options
 * or the plan); UNSUPPORTED (misaligned rows, K and V with different strides); CUDA_ERROR.
 */
CINFER_API cinfer_status_t cinfer_batch_decode_run(
    cinfer_batch_decode_t *op, const DLTensor *q, const DLTensor *k_cache, const DLTensor *v_cache,
    const DLTensor *kv_indptr, const DLTensor *kv_indices, const DLTensor *kv_last_page_len,
    DLTensor *out, DLTensor *lse, const cinfer_args_t *args, CUstream stream);

/* Destroys the object (not the workspace). NULL is a no-op. */
CINFER_API void cinfer_batch_decode_destroy(cinfer_batch_decode_t *op);

/*
 * Single-request decode: q [Hq, D] q_dtype; k, v [kv_len, Hk, D] (NHD) or [Hk, kv_len, D] (HND)
 * kv_dtype, with the same shape and strides; out [Hq, D] q_dtype; lse NULL or [Hq] float32
 * (base 2). Row alignment as for cinfer_batch_decode_run. Long KV is split across CTAs and
 * merged. workspace: device memory, 256-byte aligned, of at least
 * cinfer_single_decode_workspace_size(ctx, options, kv_len) bytes (exact for this kv_len and
 * these options). page_size, use_cuda_graph and max_batch_size of options are ignored.
 * Each call validates, loads the kernels (JIT-compiling on first use) and plans on the host. A
 * plan whose head slices (at most num_qo_heads) fit one wave of resident CTAs (528 of the
 * tensor-core kernel on an H200) travels in the kernels' parameters, whatever kv_len (0
 * included), and such a call can be captured in a CUDA graph (a replay repeats it at the
 * captured kv_len and addresses). Otherwise the schedule is copied into the workspace from
 * pageable memory (an asynchronous copy on stream), and a call while stream is capturing returns
 * UNSUPPORTED (capture batch decode in graph mode instead). args: the arguments of
 * options->variant, as for cinfer_batch_decode_run. out and lse must not overlap each other, q, k,
 * v, the workspace or the tensors of args (INVALID_ARGUMENT).
 * Returns SUCCESS, INVALID_ARGUMENT, UNSUPPORTED, WORKSPACE_TOO_SMALL, NO_DEVICE, CUDA_ERROR,
 * COMPILE_ERROR, NOT_FOUND, OUT_OF_MEMORY.
 */
CINFER_API cinfer_status_t cinfer_single_decode_workspace_size(
    cinfer_context_t *ctx, const cinfer_attention_options_t *options, int64_t kv_len,
    size_t *device_bytes);
CINFER_API cinfer_status_t cinfer_single_decode(cinfer_context_t *ctx,
                                                const cinfer_attention_options_t *options,
                                                const DLTensor *q, const DLTensor *k,
                                                const DLTensor *v, DLTensor *out, DLTensor *lse,
                                                const cinfer_args_t *args, void *workspace,
                                                size_t workspace_bytes, CUstream stream);

/* ---------------------------------------------------------------------------------------------
 * Prefill: many query tokens per request (tensor cores)
 * ------------------------------------------------------------------------------------------- */

/*
 * Single-request prefill on tensor cores (sm_80 and later: the mma.sync template, or on sm_90a the
 * wgmma/TMA kernel where it applies).
 * q: [qo_len, Hq, D] q_dtype (fp16 or bf16); k, v: [kv_len, Hk, D] (NHD) or [Hk, kv_len, D] (HND)
 * of q's dtype or fp8 (e4m3, e5m2: options->kv_dtype; the mmas then run in fp16 with q
 * multiplied by sm_scale and rounded to fp16, so |q| * sm_scale must stay below 65504, and K/V
 * decode exactly; an e4m3 NaN byte reads as +-480); out: [qo_len, Hq, D] q_dtype;
 * lse: NULL or [qo_len, Hq] float32 (base 2). Any strides with a contiguous last dim (slices of a
 * packed QKV work). D: a multiple of 16 up to 256 (UNSUPPORTED otherwise). With
 * options->head_dim_vo = D_vo != D (D_qk != D_vo, e.g. 192 / 128; 16-bit K/V, no RoPE, a multiple
 * of 16 up to 256), v is [kv_len, Hk, D_vo] (NHD) or [Hk, kv_len, D_vo] (HND) and out [qo_len, Hq,
 * D_vo]; the template then runs at the larger dim with the narrower matrices' columns zero-filled
 * (on sm_90a, 192 / 128 runs the wgmma/TMA kernel at each matrix's own dim where it applies).
 * On sm_90a the wgmma/TMA kernel takes fp8 K/V too (at D = 64, 128 and 256): it converts each K/V
 * tile to fp16 in shared memory, with the same fp16 math and q x sm_scale limit as the template.
 * causal: 1 keeps KV position j for query row i only if j <= i + kv_len - qo_len (bottom-right
 * alignment); window_left, logits_soft_cap, sm_scale and the GQA ratio come from options (its
 * page_size, use_cuda_graph, max_batch_size and use_tensor_cores are ignored). Rows with no kept
 * position (qo_len > kv_len under causal, kv_len 0) give 0 and lse -inf. KV tiles wholly outside
 * the causal or window mask are neither loaded nor computed. k_scale multiplies the logits and
 * v_scale the output, as in decode. Rows are read and written with 16-byte accesses: data
 * addresses and strides must keep every row 16-byte aligned (else UNSUPPORTED); qo_len and
 * kv_len must be below 2^30. One launch, no workspace; asynchronous on stream; never allocates
 * or synchronizes (it compiles the kernel on first use). The query tile is the default for D
 * unless that grid is under two waves of resident CTAs and the next smaller tile is estimated to
 * finish sooner (a short causal prompt, a short query over a long KV): such a call loads both
 * kernels. Thread-safe. args: the arguments of options->variant, as for cinfer_batch_decode_run.
 * out and lse must not overlap each other, q, k, v or the tensors of args (INVALID_ARGUMENT).
 * Returns SUCCESS, INVALID_ARGUMENT, UNSUPPORTED, NO_DEVICE, CUDA_ERROR, COMPILE_ERROR,
 * NOT_FOUND, OUT_OF_MEMORY.
 */
CINFER_API cinfer_status_t cinfer_single_prefill(cinfer_context_t *ctx,
                                                 const cinfer_attention_options_t *options,
                                                 int causal, const DLTensor *q, const DLTensor *k,
                                                 const DLTensor *v, DLTensor *out, DLTensor *lse,
                                                 const cinfer_args_t *args, CUstream stream);

/*
 * Single prefill that may split the KV across CTAs (split-KV) when its query tiles alone would
 * fill well under one wave of the GPU: a short query over a long KV (a chunk of a long prompt, a
 * few speculative tokens), where cinfer_single_prefill leaves most SMs idle. Such a call is batch
 * prefill's plan and run of one ragged request (cinfer_batch_prefill_plan's tile and split-KV
 * rules, its kernels): the schedule is built on the host and copied into the workspace from
 * pageable memory (an asynchronous copy on stream), the attention kernel writes float32 partial
 * states there, and a second kernel merges them. Any other call is cinfer_single_prefill: the
 * grid fills the GPU, the KV is at most 512 positions, qo_len or kv_len is 0, the variant has no
 * softmax or an output transform, the batch kernels cannot be had (not in the AOT bundle under
 * CINFER_JIT=off, or tiles whose shared memory the device lacks), or stream is capturing a CUDA
 * graph (which cannot take the pageable copy).
 * cinfer_single_prefill_workspace_size gives the exact bytes for these options and lengths: 0
 * when such a call does not split, and then workspace may be NULL with workspace_bytes 0 (a call
 * it gives bytes for may still run unsplit: under capture, or when the plan's sm90 tile meets
 * strides TMA cannot copy). workspace: device memory, 256-byte aligned, of at least that many
 * bytes; NULL with workspace_bytes 0 makes the call cinfer_single_prefill's, unsplit. Arguments,
 * math and edge cases are cinfer_single_prefill's (the merged output may differ from the unsplit
 * one in the last bits). The size function loads the batch kernels (JIT-compiling up to five on
 * first use) only when a split is possible. Returns cinfer_single_prefill's statuses and
 * WORKSPACE_TOO_SMALL; the size function returns SUCCESS, INVALID_ARGUMENT (NULL, bad options,
 * causal, negative lengths), UNSUPPORTED (a length of 2^30 or more), NO_DEVICE, CUDA_ERROR,
 * COMPILE_ERROR.
 */
CINFER_API cinfer_status_t cinfer_single_prefill_workspace_size(
    cinfer_context_t *ctx, const cinfer_attention_options_t *options, int causal, int64_t qo_len,
    int64_t kv_len, size_t *device_bytes);
CINFER_API cinfer_status_t cinfer_single_prefill_with_workspace(
    cinfer_context_t *ctx, const cinfer_attention_options_t *options, int causal, const DLTensor *q,
    const DLTensor *k, const DLTensor *v, DLTensor *out, DLTensor *lse, const cinfer_args_t *args,
    void *workspace, size_t workspace_bytes, CUstream stream);

/* ---------------------------------------------------------------------------------------------
 * Batch prefill: many requests, each with qo_len query rows over its kv_len keys (plan / run)
 *
 * Query rows of all requests are concatenated (ragged): request b owns rows
 * [qo_indptr[b], qo_indptr[b+1]) of q, out and lse, and its rows are the last qo_len of its
 * kv_len positions (row i is at position i + kv_len - qo_len; causal masking is bottom-right
 * aligned; qo_len > kv_len is allowed: under causal the first rows keep nothing). The K/V of the
 * batch is either
 *   - ragged (CINFER_KV_STORAGE_RAGGED, FlashInfer's BatchPrefillWithRaggedKVCacheWrapper): one
 *     [total_kv, Hk, D] (NHD) or [Hk, total_kv, D] (HND) tensor per K and V, request b owning
 *     rows [kv_indptr[b], kv_indptr[b+1]); or
 *   - paged (CINFER_KV_STORAGE_PAGED, FlashInfer's BatchPrefillWithPagedKVCacheWrapper): the
 *     paged cache of batch decode, with the page table (kv_indptr counting pages, kv_indices,
 *     kv_last_page_len): position t of request b is slot t % page_size of page
 *     kv_indices[kv_indptr[b] + t / page_size].
 * As with batch decode: create once (validates, loads the kernels), plan once per step from host
 * copies of the lengths (shared by all layers), run once per layer (capturable in a CUDA graph).
 * The math is SEMANTICS.md's: sm_scale, k_scale, v_scale, logits_soft_cap and window_left from
 * the options, rows with no kept position give 0 and lse -inf. The tensor-core kernel of single
 * prefill runs it (sm_80 and later; fp16/bf16 q and out of one dtype, K/V of that dtype or fp8
 * e4m3/e5m2 as in cinfer_single_prefill; head_dim a multiple of 16 up to 256; head_dim_vo as in
 * cinfer_single_prefill, with separate K and V arrays or caches). Split-KV: when the
 * query tiles of a step alone would fill well under one wave of the GPU (few query rows over a long
 * KV: a cascade's shared prefix, a long context with a short chunk), plan splits their KV into
 * chunks of 512 positions or more so the step fills one wave, and run merges the chunks' float32
 * partial states with a second kernel (in CUDA graph mode within grids fixed at create: see
 * cinfer_batch_prefill_run). Plans of variants without softmax or with an output transform are
 * never split.
 * ------------------------------------------------------------------------------------------- */

typedef struct cinfer_batch_prefill cinfer_batch_prefill_t;

/* Where a batch prefill's K/V live. */
typedef enum cinfer_kv_storage {
    CINFER_KV_STORAGE_RAGGED = 0, /* K, V: [total_kv, Hk, D] (NHD) or [Hk, total_kv, D] (HND) */
    CINFER_KV_STORAGE_PAGED = 1,  /* the paged cache of batch decode, with its page table */
} cinfer_kv_storage_t;

/*
 * The device workspace (bytes) of a batch prefill object: the schedule of any plan of at most
 * options->max_batch_size requests and max_total_qo_tokens query rows and, when plans may split
 * the KV, the float32 split-KV partial states (at most one wave of CTAs' worth). Exact: create
 * accepts this many bytes or more. When plans may split (CUDA-graph mode included), the size
 * depends on how many prefill CTAs fit on the device at once, so, like create, it loads the
 * kernels (JIT-compiling them on first use); with a variant without softmax or with an output
 * transform (whose plans never split) it loads and compiles nothing (ctx is still required: a
 * context needs a device). *device_bytes is 0 on failure. The arguments are checked as by
 * create. Returns SUCCESS, INVALID_ARGUMENT, UNSUPPORTED (naming the option or argument),
 * NO_DEVICE, CUDA_ERROR, COMPILE_ERROR, NOT_FOUND.
 */
CINFER_API cinfer_status_t cinfer_batch_prefill_workspace_size(
    cinfer_context_t *ctx, const cinfer_attention_options_t *options, cinfer_kv_storage_t storage,
    int causal, int64_t max_total_qo_tokens, size_t *device_bytes);

/*
 * Creates a batch prefill object over a caller-owned device workspace of workspace_bytes bytes
 * (device memory of the context's device, at least cinfer_batch_prefill_workspace_size, 256-byte
 * aligned; it must outlive the object).
 * options: heads, head_dim (a multiple of 16, at most 256), head_dim_vo (0, or D_vo as in
 *   cinfer_single_prefill), q_dtype (fp16 or bf16), kv_dtype
 *   (q_dtype, or fp8 e4m3 / e5m2 with k_scale and v_scale; split-KV works for every dtype),
 *   kv_layout, sm_scale, logits_soft_cap, window_left, k_scale, v_scale, max_batch_size (>= 1),
 *   use_cuda_graph; page_size (1..256) for a paged KV (ignored for a ragged one);
 *   use_tensor_cores is ignored; variant: NULL or any variant (its arguments go to run).
 * storage: CINFER_KV_STORAGE_RAGGED or CINFER_KV_STORAGE_PAGED.
 * causal: 1 = causal mask (bottom-right aligned per request), 0 = none. It selects the kernel;
 *   keep one object per value if both are needed.
 * max_total_qo_tokens: the most query rows (qo_indptr[batch] - qo_indptr[0]) any plan will hold,
 *   >= 1.
 * Loads (JIT-compiling on first use) the kernels the object may run: one per query tile size
 * (up to four: the fourth, at head_dim 128 with 16-bit K/V, no soft cap and no in-kernel RoPE, is
 * single prefill's 256-row turn-taking tile where the device's shared memory allows it; plan picks
 * the tile from the average query length; on sm_90a the 128-row tile is the wgmma/TMA kernel where
 * it applies: head_dim 64, 128 or 256 with head_dim_vo equal (or 192 / 128 with 16-bit K/V), K/V
 * of q's dtype or fp8, no in-kernel RoPE, a variant it takes, and for a paged KV a page_size that
 * is a power of two from 8 to 256; other page sizes run the mma.sync template) and the split-KV
 * merge kernel, or, with use_cuda_graph = 1, the one tile fixed for the average max_total_qo_tokens
 * / max_batch_size and the merge kernel. The object also owns a small pinned host buffer for
 * staging schedules. *out is NULL on failure. Returns SUCCESS, INVALID_ARGUMENT, UNSUPPORTED,
 * WORKSPACE_TOO_SMALL, NO_DEVICE, CUDA_ERROR, COMPILE_ERROR, NOT_FOUND, OUT_OF_MEMORY. Not
 * thread-safe per object.
 */
CINFER_API cinfer_status_t cinfer_batch_prefill_create(cinfer_context_t *ctx,
                                                       const cinfer_attention_options_t *options,
                                                       cinfer_kv_storage_t storage, int causal,
                                                       int64_t max_total_qo_tokens, void *workspace,
                                                       size_t workspace_bytes,
                                                       cinfer_batch_prefill_t **out);

/*
 * Plans one step (once per step, shared by all layers) from host int32 arrays:
 *   qo_indptr [batch_size + 1]: query rows per request (qo_indptr[0] >= 0, non-decreasing);
 *   kv_indptr [batch_size + 1]: ragged: K/V rows per request; paged: page-table entries per
 *     request (kv_indptr[0] >= 0, non-decreasing);
 *   kv_last_page_len [batch_size]: paged: valid slots of each request's last page, 1..page_size
 *     for a request with pages (ignored without pages: kv_len 0); ragged: must be NULL.
 * kv_len of a request: ragged kv_indptr[b+1] - kv_indptr[b]; paged (pages - 1) * page_size +
 * last_page_len. qo_len and kv_len must be below 2^30. Chooses the query tile (outside graph
 * mode) and the split-KV chunking, builds the work list (longest first) and writes it into the
 * workspace with asynchronous copies on stream (runs on another stream must be ordered after it
 * by the caller, and the plan after the earlier plans and runs of the object on other streams:
 * they share the workspace). The schedule is staged in the object's pinned host buffers: plan
 * blocks only until the copies made two plans earlier have completed. An argument error leaves
 * the previous plan in place. A plan is never captured into a CUDA graph (only run is): a
 * capturing stream is INVALID_ARGUMENT, before the previous plan is touched.
 * Returns SUCCESS, INVALID_ARGUMENT (op NULL, batch_size outside [0, options->max_batch_size],
 * NULL or non-monotone indptr, too many query rows, last_page_len out of range, lengths too long;
 * the message names the argument, the index and the value; a capturing stream), UNSUPPORTED
 * (with in-kernel RoPE, a qo_len or kv_len above CINFER_ROPE_MAX_LEN, naming the request),
 * CUDA_ERROR, OUT_OF_MEMORY. Not thread-safe per object.
 */
CINFER_API cinfer_status_t cinfer_batch_prefill_plan(cinfer_batch_prefill_t *op,
                                                     const int32_t *qo_indptr,
                                                     const int32_t *kv_indptr,
                                                     const int32_t *kv_last_page_len,
                                                     int batch_size, CUstream stream);

/*
 * Runs the planned step on stream (once per layer): never allocates, synchronizes, compiles or
 * logs, so it can be captured in a CUDA graph. The lengths and offsets of the requests come from
 * the plan (the workspace), not from device copies of the indptr arrays; only the page indices
 * are read from the device. A split plan launches the merge kernel after the attention kernel
 * (both on stream). In graph mode (use_cuda_graph = 1) the grids are fixed for
 * max_total_qo_tokens, max_batch_size and one wave of CTAs, the merge kernel is launched by every
 * run (it does nothing after a plan that did not split) and both kernels read the schedule from
 * the workspace, so a captured run replays correctly after any later plan, split or not, provided
 * the captured tensors (same addresses and strides) hold the new step's data: capture with
 * buffers that have room for the largest step you will replay. A graph-mode plan splits only when
 * qo_indptr[batch_size] is within the merge's fixed rows (min(one wave of query tiles' rows,
 * max_total_qo_tokens)); with qo_indptr[0] = 0 every plan that would split does.
 * q: [total_q, Hq, D] q_dtype with total_q >= the planned qo_indptr[batch_size]; out: the same
 *   shape, q_dtype; lse: NULL or [total_q, Hq] float32 (base 2). Rows no request owns are
 *   neither read nor written.
 * Ragged (kv_indices NULL): k, v: [total_kv, Hk, D] (NHD) or [Hk, total_kv, D] (HND) of kv_dtype,
 *   with the same shape, total_kv >= the planned kv_indptr[batch_size].
 * Paged: k, v: the caches [max_pages, page_size, Hk, D] (NHD) or [max_pages, Hk, page_size, D]
 *   (HND) with the same shape and strides; or k = the combined cache [max_pages, 2, ...] (index
 *   0 = K, 1 = V) and v = NULL. kv_indices: int32 on the device, at least the planned
 *   kv_indptr[batch_size] entries, each in [0, max_pages) (not range-checked).
 * With options->head_dim_vo = D_vo != D, v and out have D_vo in place of D (v: [total_kv, Hk,
 *   D_vo] or its HND form; the V cache [max_pages, page_size, Hk, D_vo] or its HND form, whose
 *   strides may then differ from the K cache's (the same-strides rule above is for D_vo = D); no
 *   combined cache: v NULL is INVALID_ARGUMENT).
 * Any strides with a contiguous last dim (slices of a packed QKV work); rows move in 16-byte
 * pieces: data addresses and every stride of a dim longer than 1 must keep rows 16-byte aligned.
 * args: the variant's arguments (options->variant; NULL for default attention). batch_idx of
 *   the variant hooks is the request's index in the plan.
 * Returns SUCCESS; INVALID_ARGUMENT (NULL, no plan yet, wrong ndim or dtype, non-contiguous last
 * dim, not on the context's device, kv_indices given for a ragged KV or missing for a paged one,
 * variant arguments that do not match the declaration, lse with a variant without softmax, out
 * or lse overlapping each other, q, k, v, kv_indices, the workspace or the tensors of args);
 * PLAN_MISMATCH (shapes or dtypes that differ from the options or the plan); UNSUPPORTED
 * (misaligned rows, paged K and V with different strides); CUDA_ERROR.
 */
CINFER_API cinfer_status_t cinfer_batch_prefill_run(cinfer_batch_prefill_t *op, const DLTensor *q,
                                                    const DLTensor *k, const DLTensor *v,
                                                    const DLTensor *kv_indices, DLTensor *out,
                                                    DLTensor *lse, const cinfer_args_t *args,
                                                    CUstream stream);

/* Destroys the object (not the workspace). NULL is a no-op. */
CINFER_API void cinfer_batch_prefill_destroy(cinfer_batch_prefill_t *op);

/* ---------------------------------------------------------------------------------------------
 * MLA: multi-head latent attention (DeepSeek-V2/V3) over a paged latent cache
 *
 * Every query head h of token i attends over one latent KV that all heads share (the weight-
 * absorbed form of MLA): with q_nope [rows, H, 512], q_pe [rows, H, 64] and, per KV position j,
 * ckv[j] (512 elements) and kpe[j] (64),
 *   s_ij = (q_nope[i, h] . ckv[j] + q_pe[i, h] . kpe[j]) * sm_scale,
 *   out[i, h] = sum_j softmax_j(s_ij) ckv[j],  lse[i, h] = log2(sum_j exp(s_ij)) (base 2),
 * i.e. attention with D_qk = 576, D_vo = 512 and one KV head (FlashInfer's
 * BatchMLAPagedAttentionWrapper). The caches are paged without a head dim: ckv
 * [max_pages, page_size, 512] and kpe [max_pages, page_size, 64], position t of request b in slot
 * t % page_size of page kv_indices[kv_indptr[b] + t / page_size]. Requests are batch prefill's:
 * query rows [qo_indptr[b], qo_indptr[b+1]) are the last qo_len of the request's kv_len positions
 * (decode: one row each), causal masking bottom-right aligned, rows with no kept position give 0
 * and lse -inf. The same create / plan / run cycle as batch prefill, with its split-KV (few rows
 * over long KV: float32 partial states of 512 per (row, head), merged by a second kernel) and its
 * CUDA-graph mode. The kernel (tensor cores, sm_80 and later) computes 16 rows per CTA: G =
 * min(H, 16) heads of 16 / G tokens; on sm_90a (Hopper) for H a multiple of 64 a warpgroup
 * (wgmma) kernel computes 64 heads of one token per CTA instead, reading the latent cache once
 * per 64 heads. A split row's merge spreads its columns over up to 16 CTAs per (row, head).
 * ------------------------------------------------------------------------------------------- */

typedef struct cinfer_mla_options {
    size_t size;         /* sizeof(cinfer_mla_options_t) */
    uint32_t version;    /* CINFER_MLA_OPTIONS_VERSION */
    int num_heads;       /* H query heads: a multiple of 16, or 1, 2, 4 or 8 */
    int head_dim_ckv;    /* 512 (the only one supported) */
    int head_dim_kpe;    /* 64 (the only one supported) */
    int page_size;       /* tokens per page, 1..256 */
    DLDataType q_dtype;  /* fp16 or bf16; out has the same dtype */
    DLDataType kv_dtype; /* the latent cache's: the same as q_dtype */
    float sm_scale;      /* > 0: no default (DeepSeek's folds the rope and YaRN factors in) */
    int use_cuda_graph;  /* 1 = fixed grids and buffers for up to max_batch_size requests */
    int max_batch_size;  /* the most requests one plan may hold, >= 1 */
} cinfer_mla_options_t;

#define CINFER_MLA_OPTIONS_VERSION 1
#define CINFER_MLA_OPTIONS_INIT                                                                    \
    {                                                                                              \
        sizeof(cinfer_mla_options_t), CINFER_MLA_OPTIONS_VERSION, 0, 512, 64, 64,                  \
            {kDLBfloat, 16, 1}, {kDLBfloat, 16, 1}, 0.0f, 0, 1                                     \
    }

typedef struct cinfer_batch_mla cinfer_batch_mla_t;

/* The device workspace (bytes) of an MLA object for these options, causal flag (0 or 1) and
 * max_total_qo_tokens (as cinfer_batch_prefill_workspace_size: the schedule and, since plans may
 * split, the partial states; loads the kernels, JIT-compiling them on first use). Exact. Returns
 * SUCCESS, INVALID_ARGUMENT, UNSUPPORTED (naming the option), NO_DEVICE, CUDA_ERROR,
 * COMPILE_ERROR, NOT_FOUND; *device_bytes is 0 on failure. */
CINFER_API cinfer_status_t cinfer_batch_mla_workspace_size(cinfer_context_t *ctx,
                                                           const cinfer_mla_options_t *options,
                                                           int causal, int64_t max_total_qo_tokens,
                                                           size_t *device_bytes);

/* Creates an MLA object over a caller-owned device workspace (at least the size above, 256-byte
 * aligned, outliving the object); loads the attention and merge kernels. Returns as
 * cinfer_batch_prefill_create. */
CINFER_API cinfer_status_t cinfer_batch_mla_create(cinfer_context_t *ctx,
                                                   const cinfer_mla_options_t *options, int causal,
                                                   int64_t max_total_qo_tokens, void *workspace,
                                                   size_t workspace_bytes,
                                                   cinfer_batch_mla_t **out);

/* Plans one step from host int32 arrays, as cinfer_batch_prefill_plan for a paged KV: qo_indptr
 * [batch_size + 1], kv_indptr [batch_size + 1] (page-table entries), kv_last_page_len
 * [batch_size]. Returns as cinfer_batch_prefill_plan. */
CINFER_API cinfer_status_t cinfer_batch_mla_plan(cinfer_batch_mla_t *op, const int32_t *qo_indptr,
                                                 const int32_t *kv_indptr,
                                                 const int32_t *kv_last_page_len, int batch_size,
                                                 CUstream stream);

/*
 * Runs the planned step on stream (capturable in a CUDA graph, as cinfer_batch_prefill_run):
 * q_nope [total_q, H, 512] and q_pe [total_q, H, 64] of q_dtype (total_q >= the planned
 * qo_indptr[batch_size]); ckv_cache [max_pages, page_size, 512] and kpe_cache [max_pages,
 * page_size, 64] of kv_dtype; kv_indices int32 on the device, at least kv_indptr[batch_size]
 * entries in [0, max_pages) (not range-checked); out [total_q, H, 512] of q_dtype; lse NULL or
 * [total_q, H] float32. Any strides with a contiguous last dim whose rows stay 16-byte aligned.
 * Returns SUCCESS; INVALID_ARGUMENT (NULL, no plan yet, wrong ndim or dtype, non-contiguous last
 * dim, not on the context's device, out or lse overlapping each other, an input or the
 * workspace); PLAN_MISMATCH (shapes that contradict the options or the plan); UNSUPPORTED
 * (misaligned rows); CUDA_ERROR.
 */
CINFER_API cinfer_status_t cinfer_batch_mla_run(cinfer_batch_mla_t *op, const DLTensor *q_nope,
                                                const DLTensor *q_pe, const DLTensor *ckv_cache,
                                                const DLTensor *kpe_cache,
                                                const DLTensor *kv_indices, DLTensor *out,
                                                DLTensor *lse, CUstream stream);

/* Destroys the object (not the workspace). NULL is a no-op. */
CINFER_API void cinfer_batch_mla_destroy(cinfer_batch_mla_t *op);

/* ---------------------------------------------------------------------------------------------
 * KV-cache and position utilities: appending to a paged KV cache, page-table helpers, rotary
 * position embeddings (RoPE) and bit packing of boolean masks. Every function returns a status
 * (SUCCESS; INVALID_ARGUMENT for a NULL, a wrong shape, dtype, device or stride, a bad option,
 * an output that overlaps an input or another output; UNSUPPORTED outside the kernels' limits;
 * NO_DEVICE; CUDA_ERROR; COMPILE_ERROR; NOT_FOUND),
 * enqueues its work on `stream` (last argument) asynchronously, never allocates, synchronizes or
 * reads device memory on the host (so it can be captured in a CUDA graph once its kernel is
 * loaded), and is thread-safe. Index tensors are int32.
 * ------------------------------------------------------------------------------------------- */

/* ---------------------------------------------------------------------------------------------
 * Appending to a paged KV cache
 *
 * A serving step appends the K/V rows of its new tokens (nnz of them, all requests concatenated:
 * a ragged [nnz, Hk, D] tensor) to each request's pages. Token i goes to request
 * batch_indices[i], at position positions[i] of that request (0-based token index within the
 * request). With the page table in CSR form (kv_indptr, kv_indices; SEMANTICS.md), position p of
 * request b is slot p % page_size of page kv_indices[kv_indptr[b] + p / page_size].
 *
 * As in FlashInfer, the page table must already include the appended tokens: the caller
 * allocates the pages first, then appends. A typical step:
 *   cinfer_get_seq_lens(kv_indptr, kv_last_page_len, page_size) -> seq_lens (new lengths),
 *   cinfer_get_batch_indices_positions(append_indptr, seq_lens) -> batch_indices, positions,
 *   cinfer_append_paged_kv_cache(...) once per layer.
 * ------------------------------------------------------------------------------------------- */

/*
 * Bits of the int32 error flag of cinfer_append_paged_kv_cache: a batch index outside
 * [0, batch_size) other than -1 (BATCH_INDEX); a position outside [0, pages * page_size) of its
 * request (POSITION); a page-table entry outside kv_indices, or a page index outside
 * [0, max_pages) (PAGE).
 */
#define CINFER_APPEND_ERROR_BATCH_INDEX 1
#define CINFER_APPEND_ERROR_POSITION    2
#define CINFER_APPEND_ERROR_PAGE        4

typedef struct cinfer_append_options {
    size_t size;                  /* sizeof(cinfer_append_options_t) */
    uint32_t version;             /* CINFER_APPEND_OPTIONS_VERSION */
    cinfer_kv_layout_t kv_layout; /* layout of the paged cache (NHD default) */
    int page_size;                /* tokens per page, 1..256; must equal the cache's page dim */
    float k_scale, v_scale;       /* fp8 caches: the value stored is x / scale rounded to fp8
                                     (the same scales attention multiplies back); fp16/bf16
                                     caches: must be 1 */
} cinfer_append_options_t;

#define CINFER_APPEND_OPTIONS_VERSION 1
#define CINFER_APPEND_OPTIONS_INIT                                                                 \
    {                                                                                              \
        sizeof(cinfer_append_options_t), CINFER_APPEND_OPTIONS_VERSION, CINFER_KV_LAYOUT_NHD, 16,  \
            1.0f, 1.0f                                                                             \
    }

/*
 * Writes append_k[i] and append_v[i] into the paged cache at (batch_indices[i], positions[i]) for
 * every i in [0, nnz).
 *
 * options: NULL for CINFER_APPEND_OPTIONS_INIT (NHD, page size 16, scales 1).
 * append_k, append_v: [nnz, Hk, D] fp16 or bf16 (one dtype for both), any token and head strides
 *   (slices of a packed QKV tensor work), last dim contiguous. They may have different strides.
 * batch_indices, positions: [nnz] int32 on the device. batch_indices[i] = -1 marks a padding
 *   token (e.g. a CUDA graph captured for more tokens than this step has): it is skipped silently.
 * k_cache, v_cache: the paged caches in options->kv_layout: [max_pages, page_size, Hk, D] (NHD) or
 *   [max_pages, Hk, page_size, D] (HND), each with any strides and a contiguous last dim; or
 *   k_cache = the combined cache [max_pages, 2, ...] (index 0 = K, 1 = V) and v_cache = NULL.
 *   Cache dtype: fp16 or bf16 (converted from the append dtype if it differs; scales must be 1),
 *   or fp8 e4m3 / e5m2 (DLPack codes 10 / 12): stored value = x / scale rounded to nearest even,
 *   saturated to the largest finite value (+-448 for e4m3, +-57344 for e5m2); NaN stays NaN.
 * kv_indptr [batch_size + 1], kv_indices [any length], kv_last_page_len
 *   [batch_size]: the page table (int32, on the device), already including the appended tokens.
 *   kv_last_page_len is checked for shape and dtype only: the bound on positions is the pages a
 *   request owns (below).
 * error_flag: NULL, or an int32 [1] tensor on the device. Tokens that cannot be written are
 *   skipped, never written elsewhere, and the kernel ORs the matching CINFER_APPEND_ERROR_* bits
 *   into *error_flag: a batch index outside [0, batch_size) other than -1, a position outside
 *   [0, (kv_indptr[b+1] - kv_indptr[b]) * page_size) of its request, a page-table entry
 *   kv_indptr[b] + position / page_size outside kv_indices, or a page index outside
 *   [0, max_pages). The flag is never cleared by the library: zero it once, run any number of
 *   appends (e.g. every layer of a step), then read it.
 *
 * Rows are copied with 16-byte accesses when D % 8 == 0 and every row starts on a 16-byte
 * boundary (8 for fp8 caches), element by element otherwise. Positions written twice in one call
 * (two tokens with the same request and position) hold one of the two rows. k_cache, v_cache and
 * error_flag must not overlap each other or any input (INVALID_ARGUMENT); the K and V halves of
 * one combined cache given as two views do not overlap.
 * Returns SUCCESS, INVALID_ARGUMENT, UNSUPPORTED (D outside 1..1024), NO_DEVICE, CUDA_ERROR,
 * COMPILE_ERROR, NOT_FOUND.
 */
CINFER_API cinfer_status_t cinfer_append_paged_kv_cache(
    cinfer_context_t *ctx, const cinfer_append_options_t *options, const DLTensor *append_k,
    const DLTensor *append_v, const DLTensor *batch_indices, const DLTensor *positions,
    DLTensor *k_cache, DLTensor *v_cache, const DLTensor *kv_indices, const DLTensor *kv_indptr,
    const DLTensor *kv_last_page_len, DLTensor *error_flag, CUstream stream);

/*
 * For a ragged batch of appended tokens, the request and position of each token (FlashInfer's
 * get_batch_indices_positions): for i in [append_indptr[b], append_indptr[b+1]),
 *   batch_indices[i] = b,
 *   positions[i] = seq_lens[b] - (append_indptr[b+1] - append_indptr[b]) + (i - append_indptr[b]),
 * i.e. the appended tokens are the last ones of each request (seq_lens are the lengths after the
 * append). Entries i in [0, nnz) that no request covers (i < append_indptr[0] or
 * i >= append_indptr[batch_size], e.g. padding) get batch index -1 and position -1, which
 * cinfer_append_paged_kv_cache skips.
 * append_indptr: [batch_size + 1] int32, non-decreasing; seq_lens: [batch_size] int32;
 * batch_indices, positions: [nnz] int32 outputs (nnz is their length), overlapping neither each
 * other nor the inputs (INVALID_ARGUMENT). All on the device.
 */
CINFER_API cinfer_status_t cinfer_get_batch_indices_positions(cinfer_context_t *ctx,
                                                              const DLTensor *append_indptr,
                                                              const DLTensor *seq_lens,
                                                              DLTensor *batch_indices,
                                                              DLTensor *positions, CUstream stream);

/*
 * The KV length of each request from its page table (FlashInfer's get_seq_lens):
 *   seq_lens[b] = (pages_b - 1) * page_size + kv_last_page_len[b], pages_b = kv_indptr[b+1] -
 *   kv_indptr[b], and 0 for a request without pages (SEMANTICS.md; FlashInfer returns
 *   kv_last_page_len[b] there, which agrees whenever that is 0). Computed in 64 bits and
 *   saturated to the int32 range.
 * kv_indptr: [batch_size + 1] int32; kv_last_page_len: [batch_size] int32; page_size >= 1;
 * seq_lens: [batch_size] int32 output, overlapping neither input (INVALID_ARGUMENT). All on the
 * device.
 */
CINFER_API cinfer_status_t cinfer_get_seq_lens(cinfer_context_t *ctx, const DLTensor *kv_indptr,
                                               const DLTensor *kv_last_page_len, int page_size,
                                               DLTensor *seq_lens, CUstream stream);

/* ---------------------------------------------------------------------------------------------
 * Rotary position embeddings (RoPE) on q and k
 *
 * For a token at position p, the first rotary_dim elements of each q and k head row are rotated
 * in pairs: pair j in [0, rotary_dim / 2) is (x[j], x[j + rotary_dim / 2]) in the rotate-half
 * (Llama, GPT-NeoX) layout, or (x[2j], x[2j + 1]) when interleaved (GPT-J), and with angle
 * a = p * f_j:
 *   out_first  = x_first * cos(a) - x_second * sin(a),
 *   out_second = x_second * cos(a) + x_first * sin(a).
 * Elements from rotary_dim to head_dim are copied unchanged. The frequencies are
 *   f_j = rope_theta^(-2j / rotary_dim) / rope_scale,
 * and, for the Llama 3.1 functions, f_j = (1 - s) * base_j / rope_scale + s * base_j with
 * base_j = rope_theta^(-2j / rotary_dim) and the smoothing
 *   s = clamp((old_context_len * base_j / (2 pi) - low_freq_factor) /
 *             (high_freq_factor - low_freq_factor), 0, 1)
 * (high frequencies keep base_j, low ones are divided by rope_scale, the band between is blended).
 * Frequencies are computed in float64 on the host, angles in float64 on the device (reduced to
 * [-pi, pi] before a float32 sincos), the rotation in float32: the result is the exact rotation
 * within float32 noise, rounded once to the output dtype, even at positions in the millions.
 *
 * q: [nnz, Hq, D], k: [nnz, Hk, D], fp16 or bf16 (one dtype), any token and head strides, last
 * dim contiguous; Hq, Hk >= 0. q_out, k_out: the outputs, same shapes and dtype (any strides),
 * or NULL to rotate in place. An output may be the input itself (same data and strides) but must
 * not otherwise overlap it, nor the other input or output, nor the positions and tables (indptr,
 * offsets, pos_ids, positions, cos_sin_cache); rotated in place, q and k must not overlap each
 * other (INVALID_ARGUMENT). D up to 1024, rotary_dim even and at most min(D, 512).
 * Rows are processed with 16-byte accesses when D % 8 == 0, rotary_dim is a multiple of 16 (8
 * when interleaved) and every row starts on a 16-byte boundary.
 * ------------------------------------------------------------------------------------------- */

typedef struct cinfer_rope_options {
    size_t size;      /* sizeof(cinfer_rope_options_t) */
    uint32_t version; /* CINFER_ROPE_OPTIONS_VERSION */
    int rotary_dim;   /* elements rotated, even; 0 = head_dim */
    int interleave;   /* 0 = rotate-half pairs (x[j], x[j + rotary_dim/2]), 1 = (x[2j], x[2j+1]) */
    float rope_scale; /* > 0: frequencies are divided by it (positions interpolated) */
    float rope_theta; /* > 0: the frequency base */
    float low_freq_factor;  /* Llama 3.1 functions only: > 0 */
    float high_freq_factor; /* Llama 3.1 functions only: > low_freq_factor */
    float old_context_len;  /* Llama 3.1 functions only: > 0, the pre-training context */
} cinfer_rope_options_t;

#define CINFER_ROPE_OPTIONS_VERSION 1
/* FlashInfer's apply_rope defaults: full head dim, rotate-half, scale 1, theta 1e4. */
#define CINFER_ROPE_OPTIONS_INIT                                                                   \
    {                                                                                              \
        sizeof(cinfer_rope_options_t), CINFER_ROPE_OPTIONS_VERSION, 0, 0, 1.0f, 1e4f, 1.0f, 4.0f,  \
            8192.0f                                                                                \
    }
/* FlashInfer's apply_llama31_rope defaults: scale 8, theta 5e5, factors 1 and 4, context 8192. */
#define CINFER_LLAMA31_ROPE_OPTIONS_INIT                                                           \
    {                                                                                              \
        sizeof(cinfer_rope_options_t), CINFER_ROPE_OPTIONS_VERSION, 0, 0, 8.0f, 5e5f, 1.0f, 4.0f,  \
            8192.0f                                                                                \
    }

/*
 * RoPE by ragged batch (FlashInfer's apply_rope / apply_rope_inplace): token i of request b (i in
 * [indptr[b], indptr[b+1])) is at position offsets[b] + i - indptr[b].
 * indptr: [batch_size + 1] int32, non-decreasing, normally indptr[0] = 0 and indptr[batch_size] =
 * nnz; offsets: [batch_size] int32. A token no request covers is copied unrotated.
 * options: NULL for CINFER_ROPE_OPTIONS_INIT; its Llama 3.1 fields are ignored.
 */
CINFER_API cinfer_status_t cinfer_apply_rope(cinfer_context_t *ctx,
                                             const cinfer_rope_options_t *options,
                                             const DLTensor *q, const DLTensor *k, DLTensor *q_out,
                                             DLTensor *k_out, const DLTensor *indptr,
                                             const DLTensor *offsets, CUstream stream);

/*
 * RoPE by explicit positions (FlashInfer's apply_rope_pos_ids): token i is at position
 * pos_ids[i]. pos_ids: [nnz] int32 (any value, negative included).
 * options: NULL for CINFER_ROPE_OPTIONS_INIT; its Llama 3.1 fields are ignored.
 */
CINFER_API cinfer_status_t cinfer_apply_rope_pos_ids(cinfer_context_t *ctx,
                                                     const cinfer_rope_options_t *options,
                                                     const DLTensor *q, const DLTensor *k,
                                                     DLTensor *q_out, DLTensor *k_out,
                                                     const DLTensor *pos_ids, CUstream stream);

/*
 * cinfer_apply_rope and cinfer_apply_rope_pos_ids with Llama 3.1 frequencies (FlashInfer's
 * apply_llama31_rope and apply_llama31_rope_pos_ids). options: NULL for
 * CINFER_LLAMA31_ROPE_OPTIONS_INIT.
 */
CINFER_API cinfer_status_t cinfer_apply_llama31_rope(cinfer_context_t *ctx,
                                                     const cinfer_rope_options_t *options,
                                                     const DLTensor *q, const DLTensor *k,
                                                     DLTensor *q_out, DLTensor *k_out,
                                                     const DLTensor *indptr,
                                                     const DLTensor *offsets, CUstream stream);
CINFER_API cinfer_status_t cinfer_apply_llama31_rope_pos_ids(
    cinfer_context_t *ctx, const cinfer_rope_options_t *options, const DLTensor *q,
    const DLTensor *k, DLTensor *q_out, DLTensor *k_out, const DLTensor *pos_ids, CUstream stream);

/*
 * RoPE from a precomputed table (FlashInfer's apply_rope_with_cos_sin_cache, the SGLang/vLLM
 * layout): row p of cos_sin_cache [max_positions, rotary_dim] float32 holds cos(a_0..a_{R/2-1})
 * followed by sin(a_0..a_{R/2-1}) for position p (R = rotary_dim = the table's width, even, at
 * most min(D, 512)); pair j of a token at position positions[i] uses column j and column
 * R/2 + j of row positions[i]. The table may have any row stride (last dim contiguous).
 * interleave: 0 = rotate-half (FlashInfer's is_neox=True, its default), 1 = interleaved pairs
 * (is_neox=False). q, k: [nnz, H, D] (FlashInfer's [nnz, H * D] viewed per head).
 * positions: [nnz] int32; a position outside [0, max_positions) is never read: the rotated
 * elements of that token's rows are written as NaN (the others are copied), so the error shows.
 */
CINFER_API cinfer_status_t cinfer_apply_rope_with_cos_sin_cache(
    cinfer_context_t *ctx, const DLTensor *q, const DLTensor *k, DLTensor *q_out, DLTensor *k_out,
    const DLTensor *positions, const DLTensor *cos_sin_cache, int interleave, CUstream stream);

/* ---------------------------------------------------------------------------------------------
 * Bit packing (boolean masks -> the packed form attention masks use)
 * ------------------------------------------------------------------------------------------- */

typedef enum cinfer_bitorder {
    CINFER_BITORDER_LITTLE = 0, /* bit k of byte b is element 8b + k (the packed masks' order) */
    CINFER_BITORDER_BIG = 1,    /* bit 7 - k of byte b is element 8b + k (numpy's default) */
} cinfer_bitorder_t;

/*
 * y = packbits(x): element e of x (nonzero = 1) becomes one bit of byte e / 8 of y, in the given
 * bit order; the unused high (little) or low (big) bits of the last byte are 0.
 * x: [n] bool or uint8 (DLPack type code 6, kDLBool in DLPack >= 0.8, or kDLUInt; 8 bits),
 * contiguous; y: [(n + 7) / 8] uint8, contiguous, not overlapping x (INVALID_ARGUMENT). n may be
 * 0. Uses 16-byte accesses when both start on 16-byte boundaries.
 */
CINFER_API cinfer_status_t cinfer_packbits(cinfer_context_t *ctx, const DLTensor *x,
                                           cinfer_bitorder_t bitorder, DLTensor *y,
                                           CUstream stream);

/*
 * Packs each segment x[indptr[s] .. indptr[s+1]) separately (FlashInfer's segment_packbits):
 *   indptr_new[0] = 0, indptr_new[s+1] = indptr_new[s] + (len_s + 7) / 8,
 *   y[indptr_new[s] + j] = packbits of x[indptr[s] + 8j .. min(indptr[s] + 8j + 8, indptr[s+1])),
 * with len_s = indptr[s+1] - indptr[s] (a negative length counts as 0). Elements outside x
 * (an indptr beyond n) read as 0.
 * x: [n] bool or uint8, contiguous; indptr: [batch_size + 1] int32; indptr_new: [batch_size + 1]
 * int32 output; y: [capacity] uint8, contiguous. The packed size indptr_new[batch_size] is known
 * only on the device: bytes beyond y's capacity are not written, and a capacity of
 * (n + 7 * batch_size) / 8 always suffices (when indptr[batch_size] - indptr[0] <= n). Bytes of y
 * past indptr_new[batch_size] are left unchanged. y and indptr_new must not overlap each other, x
 * or indptr (INVALID_ARGUMENT).
 */
CINFER_API cinfer_status_t cinfer_segment_packbits(cinfer_context_t *ctx, const DLTensor *x,
                                                   const DLTensor *indptr,
                                                   cinfer_bitorder_t bitorder, DLTensor *y,
                                                   DLTensor *indptr_new, CUstream stream);

#ifdef __cplusplus
}
#endif

#endif /* CINFER_H */
