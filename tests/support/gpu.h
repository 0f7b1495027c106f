/*
 * Helpers shared by every GPU test suite (tests/gpu/): context setup with the "skipped" exit code,
 * device buffers wrapped in canary zones, DLTensor views of them, seeded random inputs encoded
 * exactly as the GPU will read them, comparison with the float64 reference, and stream sync.
 * The CPU tests of argument checks (tests/api, tests/ops) take their DLTensor views from here too
 * (cinfer_test_dl_view).
 *
 * A GPU test's main() starts with
 *
 *     int rc = cinfer_test_gpu_setup(&ctx);
 *     if (rc)
 *         return rc;
 *
 * which returns 77 (ctest's "skipped") on a machine without a driver or device. The setup makes
 * the context's CUDA context current on the calling thread, which is the thread cmocka runs the
 * tests on, so the buffer helpers below need no context argument.
 *
 * Buffers allocated here are also remembered in a process-wide list, so a test that fails half
 * way (cmocka leaves it with a longjmp) does not leak them: cinfer_test_buf_free_all() releases
 * whatever is left, and cinfer_test_gpu_teardown() calls it before destroying the context.
 *
 * Functions returning cinfer_status_t set cinfer_last_error() on failure; wrap them in
 * CINFER_TEST_OK() inside a test to turn a failure into a readable cmocka failure.
 */
#ifndef CINFER_TESTS_SUPPORT_GPU_H
#define CINFER_TESTS_SUPPORT_GPU_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "cinfer.h"
#include "cuda/driver.h"
#include "jit/spec.h"
#include "ref/ref.h"

/* ---------------------------------------------------------------------------------------------
 * Setup and failure reporting
 * ------------------------------------------------------------------------------------------- */

/* The exit code ctest reports as "skipped" (SKIP_RETURN_CODE in tests/CMakeLists.txt). */
#define CINFER_TEST_SKIPPED 77

/*
 * Creates a context on device 0 and makes its CUDA context current on this thread. Returns 0 with
 * *ctx set; 77 after printing "skipped: <message>" when there is no driver or device (NO_DEVICE);
 * 1 after printing "error: <status>: <message>" on any other failure.
 */
int cinfer_test_gpu_setup(cinfer_context_t **ctx);

/*
 * Runs a suite's tests as cmocka_run_group_tests does, or, with CINFER_TEST_PART = "k/n"
 * (0 <= k < n), only those whose index in tests[] is k modulo n, so that ctest can run the parts of
 * a long suite side by side (tests/CMakeLists.txt). With CINFER_TEST_FILTER set, only the tests
 * whose names match it (a cmocka pattern, '*' and '?') run. Returns cmocka's count of failed
 * tests, or 1 after printing an error for a malformed CINFER_TEST_PART.
 */
int cinfer_test_run_suite(const char *name, const struct CMUnitTest *tests, size_t count);

/* Frees every buffer still allocated (cinfer_test_buf_free_all) and destroys ctx (NULL is a
 * no-op). */
void cinfer_test_gpu_teardown(cinfer_context_t *ctx);

/* The device ordinal of the context made by cinfer_test_gpu_setup (0). */
int cinfer_test_device(void);

/* True if ctx's device is sm_90a (the wgmma/TMA kernels' arch); else prints "<test>: the device is
 * <arch>, not sm_90a; skipped" and returns false. */
bool cinfer_test_sm90_device(const cinfer_context_t *ctx, const char *test);

/* Prints "file:line: <message>" as a cmocka error and fails the current test (longjmp). */
void cinfer_test_fail_at(const char *file, int line, const char *fmt, ...) CINFER__PRINTF(3, 4);

/* Fails the current test unless expr returns CINFER_STATUS_SUCCESS; the message carries the
 * expression, the status name and cinfer_last_error(). */
#define CINFER_TEST_OK(expr)                                                                       \
    do {                                                                                           \
        cinfer_status_t cinfer_test_st_ = (expr);                                                  \
        if (cinfer_test_st_ != CINFER_STATUS_SUCCESS)                                              \
            cinfer_test_fail_at(__FILE__, __LINE__, "%s returned %s: %s", #expr,                   \
                                cinfer_status_name(cinfer_test_st_), cinfer_last_error());         \
    } while (0)

/* ---------------------------------------------------------------------------------------------
 * Device buffers with canaries
 * ------------------------------------------------------------------------------------------- */

/* Bytes of canary before and after every payload; 256 also keeps the payload 256-byte aligned. */
#define CINFER_TEST_CANARY_BYTES 256
/* The byte every payload is poisoned with: 0xFFFF is NaN in fp16 and bf16, 0xFFFFFFFF in fp32. */
#define CINFER_TEST_POISON_BYTE 0xFF

/*
 * One cuMemAlloc of CANARY + bytes + CANARY. The canary zones hold cinfer_test_canary_byte(i)
 * (i counted from the start of each zone), a pattern that is neither the poison nor zero, so a
 * stray write of either shows up.
 */
typedef struct cinfer_test_buf {
    CUdeviceptr base; /* the allocation: the front canary starts here */
    CUdeviceptr ptr;  /* the payload, base + CINFER_TEST_CANARY_BYTES */
    size_t bytes;     /* payload size (may be 0) */
} cinfer_test_buf;

/* Byte i of a canary zone. */
unsigned char cinfer_test_canary_byte(size_t i);

/*
 * Allocates, writes both canary zones and poisons the payload. *buf is zeroed on failure.
 * Uploads, poison and downloads run on the legacy stream and are complete when they return.
 */
cinfer_status_t cinfer_test_buf_alloc(cinfer_test_buf *buf, size_t bytes);
/* Fills the payload with CINFER_TEST_POISON_BYTE (synchronous). */
cinfer_status_t cinfer_test_buf_poison(const cinfer_test_buf *buf);
/* Copies bytes from host to payload[offset, offset + bytes) (synchronous); INVALID_ARGUMENT when
 * the range leaves the payload. */
cinfer_status_t cinfer_test_buf_upload(const cinfer_test_buf *buf, size_t offset, const void *host,
                                       size_t bytes);
/* Copies payload[offset, offset + bytes) to host (synchronous); same range rule. */
cinfer_status_t cinfer_test_buf_download(const cinfer_test_buf *buf, size_t offset, void *host,
                                         size_t bytes);
/* Downloads payload[0, bytes); INTERNAL naming the first byte that is not
 * CINFER_TEST_POISON_BYTE (an output a failed call must not have written). */
cinfer_status_t cinfer_test_buf_check_poisoned(const cinfer_test_buf *buf, size_t bytes);
/* Downloads both canary zones; INTERNAL naming the zone and the first changed byte when one was
 * written. */
cinfer_status_t cinfer_test_buf_check_canaries(const cinfer_test_buf *buf);
/* Frees the allocation and zeroes *buf; a zeroed buf is a no-op. */
void cinfer_test_buf_free(cinfer_test_buf *buf);
/* Frees every buffer not yet freed (cleanup after a failed test). Returns how many it freed. */
size_t cinfer_test_buf_free_all(void);
/* A cmocka teardown that frees every buffer the test left (cinfer_test_buf_free_all): a failed
 * test leaves through longjmp, past its own frees. */
int cinfer_test_teardown_buffers(void **state);

/* ---------------------------------------------------------------------------------------------
 * DLTensor views
 * ------------------------------------------------------------------------------------------- */

#define CINFER_TEST_MAX_DIMS 6

/*
 * A DLTensor together with the shape and stride arrays it points to. t.shape and t.strides point
 * into this struct, so it must not be copied by value: fill it in place with
 * cinfer_test_tensor_init and pass &x.t (or the returned pointer).
 */
typedef struct cinfer_test_tensor {
    DLTensor t;
    int64_t shape[CINFER_TEST_MAX_DIMS];
    int64_t strides[CINFER_TEST_MAX_DIMS];
} cinfer_test_tensor;

/* The DLPack dtype of a cinfer dtype: fp16/bf16/f32/i32/u8 with the DLPack codes, fp8 e4m3fn and
 * e5m2 as DLPack 1.x codes 10 and 12; {0, 0, 0} for CINFER__DT_NONE. */
DLDataType cinfer_test_dl_dtype(cinfer__dtype_t dtype);

/*
 * Fills *x as a view of buf on the test device (kDLCUDA, cinfer_test_device()):
 * data = buf->ptr + data_shift (buf NULL: data NULL), byte_offset as given, the dtype, ndim
 * (<= CINFER_TEST_MAX_DIMS) and shape; strides in elements, or NULL for a compact tensor
 * (t.strides = NULL). data_shift lets a test misalign the data pointer itself, byte_offset
 * exercises DLPack's offset field. Returns &x->t.
 */
DLTensor *cinfer_test_tensor_init(cinfer_test_tensor *x, const cinfer_test_buf *buf,
                                  size_t data_shift, uint64_t byte_offset, cinfer__dtype_t dtype,
                                  int ndim, const int64_t *shape, const int64_t *strides);

/* A DLTensor on device 0 (kDLCUDA) over data with ndim dims of `shape` (the caller's array,
 * which the tensor points to: a test may change it, or point elsewhere, afterwards), compact
 * strides and one lane of (code, bits): for CPU tests of argument checks, which read no data. */
DLTensor cinfer_test_dl_view(void *data, int ndim, int64_t *shape, DLDataTypeCode code,
                             uint8_t bits);

/* ---------------------------------------------------------------------------------------------
 * Element access and seeded random data
 * ------------------------------------------------------------------------------------------- */

/* The reference's dtype for a float cinfer dtype; returns 0 on success, -1 for I32, U8, NONE. */
int cinfer_test_ref_dtype(cinfer__dtype_t dtype, cinfer__ref_dtype_t *out);
/* The same, failing the current test for a dtype the reference does not decode. */
cinfer__ref_dtype_t cinfer_test_ref_dtype_of(cinfer__dtype_t dtype);

/* Relative L2 tolerance of attention outputs in an fp16/bf16 dtype: bf16 keeps 8 significant
 * bits (relative rounding 2^-9), fp16 11 (2^-12); P is rounded to that dtype before P V, and the
 * float32 accumulation adds far less. */
double cinfer_test_value_tolerance(cinfer__dtype_t dtype);

/* Element index of a raw host buffer as a double: float types through the reference's exact
 * decoders, i32 and u8 as integers; NaN for CINFER__DT_NONE. */
double cinfer_test_load(cinfer__dtype_t dtype, const void *base, int64_t index);
/* Stores x into element index: float types with the reference's round-to-nearest-even encoders,
 * i32 and u8 truncated toward zero (the caller passes integers). */
void cinfer_test_store(cinfer__dtype_t dtype, void *base, int64_t index, double x);

/* The base seed: CINFER_TEST_SEED from the environment (decimal or 0x hex), else a fixed value,
 * so every run is reproducible and a failing seed can be replayed. */
uint64_t cinfer_test_seed(void);

/* A splitmix64 generator; `seed` is kept for messages. */
typedef struct cinfer_test_rng {
    uint64_t state;
    uint64_t seed;
} cinfer_test_rng;

void cinfer_test_rng_init(cinfer_test_rng *rng, uint64_t seed);
uint64_t cinfer_test_rng_next(cinfer_test_rng *rng);
/* Uniform in [lo, hi] with 53 random bits. */
double cinfer_test_rng_uniform(cinfer_test_rng *rng, double lo, double hi);
/* Uniform integer in [0, n) (n >= 1). */
uint64_t cinfer_test_rng_below(cinfer_test_rng *rng, uint64_t n);

/*
 * Fills raw[0, n) with values uniform in [lo, hi], encoded with cinfer_test_store (so rounded to
 * nearest even for float types), and, when exact is not NULL, exact[k] = the value element k
 * actually holds (decoded back), which is what the reference must be given.
 */
void cinfer_test_fill_uniform(cinfer_test_rng *rng, cinfer__dtype_t dtype, int64_t n, double lo,
                              double hi, void *raw, double *exact);

/* ---------------------------------------------------------------------------------------------
 * Comparison with the reference
 * ------------------------------------------------------------------------------------------- */

/*
 * Values: n elements of a raw output (fp16/bf16/f32/fp8) against the float64 reference, via
 * cinfer__ref_compare, plus a NaN/Inf scan. The relative L2 error is measured against
 * max(||ref||_2, ref_norm_floor): near-zero references (a single element that happens to be tiny)
 * would otherwise turn rounding noise into a large relative error. Passes when nothing is
 * non-finite where the reference is finite, max_abs_err <= max_abs_tol and
 * rel_l2_err <= rel_l2_tol.
 */
typedef struct cinfer_test_cmp {
    int64_t n;
    double max_abs_err, rel_l2_err;
    double max_abs_tol, rel_l2_tol;
    int64_t worst_index; /* the element of max_abs_err, -1 when n == 0 */
    double worst_out, worst_ref;
    int64_t num_nan, num_inf; /* in the output */
    int ok;
} cinfer_test_cmp;

cinfer_test_cmp cinfer_test_compare(cinfer__dtype_t dtype, const void *out, const double *ref,
                                    int64_t n, double rel_l2_tol, double max_abs_tol,
                                    double ref_norm_floor);

/*
 * LSE: n float32 values against the reference, via cinfer__ref_compare_lse. Passes when there is
 * no NaN, -inf appears exactly where the reference has -inf (and no other infinity), and every
 * finite element has |out - ref| <= abs_tol * (1 + |ref|).
 */
typedef struct cinfer_test_lse_cmp {
    int64_t n;
    double max_abs_err;    /* over finite pairs */
    double max_scaled_err; /* max |out - ref| / (1 + |ref|) over finite pairs */
    double abs_tol;
    int64_t num_nan, num_inf_mismatch;
    int64_t worst_index; /* the first NaN/inf mismatch, else the element of max_scaled_err */
    double worst_out, worst_ref;
    int ok;
} cinfer_test_lse_cmp;

cinfer_test_lse_cmp cinfer_test_compare_lse(const float *out, const double *ref, int64_t n,
                                            double abs_tol);

/* Formats one line "<what> of <desc> (seed 0x...): max abs err ... (tol ...) at [i] got ..,
 * want .., rel L2 err ... (tol ...), N NaN, M Inf of n". */
void cinfer_test_cmp_format(char *dst, size_t cap, const cinfer_test_cmp *c, const char *what,
                            const char *desc, uint64_t seed);
void cinfer_test_lse_cmp_format(char *dst, size_t cap, const cinfer_test_lse_cmp *c,
                                const char *what, const char *desc, uint64_t seed);

/* Fails the current test with the formatted line when a comparison did not pass. */
#define CINFER_TEST_ASSERT_CLOSE(cmp, what, desc, seed)                                            \
    do {                                                                                           \
        const cinfer_test_cmp cinfer_test_c_ = (cmp);                                              \
        if (!cinfer_test_c_.ok) {                                                                  \
            char cinfer_test_msg_[1024];                                                           \
            cinfer_test_cmp_format(cinfer_test_msg_, sizeof cinfer_test_msg_, &cinfer_test_c_,     \
                                   (what), (desc), (seed));                                        \
            cinfer_test_fail_at(__FILE__, __LINE__, "%s", cinfer_test_msg_);                       \
        }                                                                                          \
    } while (0)

#define CINFER_TEST_ASSERT_LSE_CLOSE(cmp, what, desc, seed)                                        \
    do {                                                                                           \
        const cinfer_test_lse_cmp cinfer_test_c_ = (cmp);                                          \
        if (!cinfer_test_c_.ok) {                                                                  \
            char cinfer_test_msg_[1024];                                                           \
            cinfer_test_lse_cmp_format(cinfer_test_msg_, sizeof cinfer_test_msg_, &cinfer_test_c_, \
                                       (what), (desc), (seed));                                    \
            cinfer_test_fail_at(__FILE__, __LINE__, "%s", cinfer_test_msg_);                       \
        }                                                                                          \
    } while (0)

/* ---------------------------------------------------------------------------------------------
 * Streams
 * ------------------------------------------------------------------------------------------- */

/*
 * cuStreamCreate with CU_STREAM_NON_BLOCKING, so nothing orders the library's work with the
 * legacy stream implicitly. The buffer helpers run on the legacy stream and synchronize it before
 * returning (uploads, poison), so the library sees their data; a test must synchronize its own
 * stream (CINFER_TEST_SYNC) before downloading results or checking canaries.
 */
cinfer_status_t cinfer_test_stream_create(CUstream *stream);
/*
 * Waits for the stream's work; a failure (e.g. a kernel fault) is CUDA_ERROR with the driver's
 * message. A stream that has not finished after CINFER_TEST_SYNC_TIMEOUT seconds (default 120; 0:
 * no limit) ends the process with exit status 1 after printing the case named by cinfer_test_case:
 * a kernel that never ends (a deadlock) cannot be recovered from, and a device call should not
 * spend its time limit on it.
 */
cinfer_status_t cinfer_test_stream_sync(CUstream stream);

/* Names the case about to run (copied), for the message of a stream that does not finish. */
void cinfer_test_case(const char *desc);

/* cuStreamDestroy; NULL is a no-op. */
void cinfer_test_stream_destroy(CUstream stream);

/* Synchronizes a stream and fails the test with cinfer__cu_error's message if that fails. */
#define CINFER_TEST_SYNC(stream) CINFER_TEST_OK(cinfer_test_stream_sync(stream))

#endif
