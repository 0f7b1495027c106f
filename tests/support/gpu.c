/*
 * Shared GPU test helpers; see gpu.h for the contract of each function.
 */
#include "support/gpu.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda/context.h"

/* ---------------------------------------------------------------------------------------------
 * Setup and failure reporting
 * ------------------------------------------------------------------------------------------- */

static int test_device;

int cinfer_test_run_suite(const char *name, const struct CMUnitTest *tests, size_t count) {
    /* CINFER_TEST_FILTER: only the tests whose names match this cmocka pattern ('*', '?'). */
    const char *filter = getenv("CINFER_TEST_FILTER");
    if (filter != NULL && filter[0] != '\0')
        cmocka_set_test_filter(filter);
    const char *part = getenv("CINFER_TEST_PART");
    if (part == NULL || part[0] == '\0')
        return _cmocka_run_group_tests(name, tests, count, NULL, NULL);
    unsigned k = 0, n = 0;
    char end = 0;
    if (sscanf(part, "%u/%u%c", &k, &n, &end) != 2 || n == 0 || k >= n) {
        fprintf(stderr, "error: CINFER_TEST_PART=%s, expected k/n with 0 <= k < n\n", part);
        return 1;
    }
    struct CMUnitTest *mine = malloc((count > 0 ? count : 1) * sizeof *mine);
    if (mine == NULL) {
        fprintf(stderr, "error: out of memory for the tests of part %s\n", part);
        return 1;
    }
    size_t m = 0;
    for (size_t i = k; i < count; i += n)
        mine[m++] = tests[i];
    printf("%s: part %u of %u: %zu of %zu tests\n", name, k, n, m, count);
    fflush(stdout);
    const int failed = _cmocka_run_group_tests(name, mine, m, NULL, NULL);
    free(mine);
    return failed;
}

int cinfer_test_gpu_setup(cinfer_context_t **ctx) {
    cinfer_context_options_t options = CINFER_CONTEXT_OPTIONS_INIT;
    cinfer_status_t st;

    *ctx = NULL;
    options.device = 0;
    st = cinfer_context_create(&options, ctx);
    if (st == CINFER_STATUS_NO_DEVICE) {
        printf("skipped: %s\n", cinfer_last_error());
        fflush(stdout);
        return CINFER_TEST_SKIPPED;
    }
    if (st != CINFER_STATUS_SUCCESS) {
        fprintf(stderr, "error: cinfer_context_create: %s: %s\n", cinfer_status_name(st),
                cinfer_last_error());
        return 1;
    }
    /* cuMemAlloc and the copies below act on the calling thread's current CUDA context. */
    st = cinfer__context_activate(*ctx);
    if (st != CINFER_STATUS_SUCCESS) {
        fprintf(stderr, "error: making the context current: %s: %s\n", cinfer_status_name(st),
                cinfer_last_error());
        cinfer_context_destroy(*ctx);
        *ctx = NULL;
        return 1;
    }
    test_device = options.device;
    return 0;
}

void cinfer_test_gpu_teardown(cinfer_context_t *ctx) {
    cinfer_test_buf_free_all();
    cinfer_context_destroy(ctx);
}

bool cinfer_test_sm90_device(const cinfer_context_t *ctx, const char *test) {
    if (strcmp(ctx->arch, "sm_90a") == 0)
        return true;
    printf("%s: the device is %s, not sm_90a; skipped\n", test, ctx->arch);
    return false;
}

int cinfer_test_device(void) {
    return test_device;
}

void cinfer_test_fail_at(const char *file, int line, const char *fmt, ...) {
    char msg[2048];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    print_error("%s:%d: %s\n", file, line, msg);
    _fail(file, line);
}

/* ---------------------------------------------------------------------------------------------
 * Device buffers with canaries
 * ------------------------------------------------------------------------------------------- */

/* Every live allocation, so cinfer_test_buf_free_all can release what a failed test left. */
static CUdeviceptr *live_bases;
static size_t num_live, cap_live;

static int remember(CUdeviceptr base) {
    if (num_live == cap_live) {
        size_t cap = cap_live ? 2 * cap_live : 64;
        CUdeviceptr *grown = realloc(live_bases, cap * sizeof *grown);
        if (!grown)
            return -1;
        live_bases = grown;
        cap_live = cap;
    }
    live_bases[num_live++] = base;
    return 0;
}

static void forget(CUdeviceptr base) {
    for (size_t i = 0; i < num_live; i++) {
        if (live_bases[i] == base) {
            live_bases[i] = live_bases[--num_live];
            return;
        }
    }
}

unsigned char cinfer_test_canary_byte(size_t i) {
    /* Varies with i (so a shifted copy is caught) and is never 0x00 or the 0xFF poison. */
    unsigned char b = (unsigned char)(0xA5u ^ (i * 0x3Bu));
    return b == 0x00 || b == CINFER_TEST_POISON_BYTE ? 0x5A : b;
}

static void canary_pattern(unsigned char *dst) {
    for (size_t i = 0; i < CINFER_TEST_CANARY_BYTES; i++)
        dst[i] = cinfer_test_canary_byte(i);
}

cinfer_status_t cinfer_test_buf_alloc(cinfer_test_buf *buf, size_t bytes) {
    const cinfer__cuda_t *cu;
    unsigned char pattern[CINFER_TEST_CANARY_BYTES];
    CUresult res;
    CUdeviceptr base = 0;
    cinfer_status_t st;

    memset(buf, 0, sizeof *buf);
    CINFER__CHECK(cinfer__cuda_get(&cu));
    res = cu->cuMemAlloc(&base, bytes + 2 * CINFER_TEST_CANARY_BYTES);
    if (res != CUDA_SUCCESS)
        return cinfer__cu_error(res, "cinfer_test_buf_alloc: cuMemAlloc");
    canary_pattern(pattern);
    res = cu->cuMemcpyHtoD(base, pattern, CINFER_TEST_CANARY_BYTES);
    if (res == CUDA_SUCCESS)
        res = cu->cuMemcpyHtoD(base + CINFER_TEST_CANARY_BYTES + bytes, pattern,
                               CINFER_TEST_CANARY_BYTES);
    if (res == CUDA_SUCCESS && bytes > 0)
        res = cu->cuMemsetD8(base + CINFER_TEST_CANARY_BYTES, CINFER_TEST_POISON_BYTE, bytes);
    if (res == CUDA_SUCCESS)
        res = cu->cuStreamSynchronize(NULL);
    if (res != CUDA_SUCCESS) {
        st = cinfer__cu_error(res, "cinfer_test_buf_alloc: writing canaries and poison");
        goto out_free;
    }
    if (remember(base) != 0) {
        st = cinfer__error(CINFER_STATUS_OUT_OF_MEMORY, "cinfer_test_buf_alloc: host allocation");
        goto out_free;
    }
    buf->base = base;
    buf->ptr = base + CINFER_TEST_CANARY_BYTES;
    buf->bytes = bytes;
    return CINFER_STATUS_SUCCESS;

out_free:
    cu->cuMemFree(base);
    return st;
}

cinfer_status_t cinfer_test_buf_poison(const cinfer_test_buf *buf) {
    const cinfer__cuda_t *cu;

    CINFER__CHECK(cinfer__cuda_get(&cu));
    if (buf->bytes > 0)
        CINFER__CU(cu, cuMemsetD8(buf->ptr, CINFER_TEST_POISON_BYTE, buf->bytes),
                   "cinfer_test_buf_poison: cuMemsetD8");
    /* A memset to device memory may still be running when cuMemsetD8 returns. */
    CINFER__CU(cu, cuStreamSynchronize(NULL), "cinfer_test_buf_poison: cuStreamSynchronize");
    return CINFER_STATUS_SUCCESS;
}

static cinfer_status_t check_range(const cinfer_test_buf *buf, size_t offset, size_t bytes,
                                   const char *what) {
    if (offset > buf->bytes || bytes > buf->bytes - offset)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "%s: bytes [%zu, %zu) leave the %zu-byte payload", what, offset,
                             offset + bytes, buf->bytes);
    return CINFER_STATUS_SUCCESS;
}

cinfer_status_t cinfer_test_buf_upload(const cinfer_test_buf *buf, size_t offset, const void *host,
                                       size_t bytes) {
    const cinfer__cuda_t *cu;

    CINFER__CHECK(check_range(buf, offset, bytes, "cinfer_test_buf_upload"));
    CINFER__CHECK(cinfer__cuda_get(&cu));
    if (bytes > 0)
        CINFER__CU(cu, cuMemcpyHtoD(buf->ptr + offset, host, bytes),
                   "cinfer_test_buf_upload: cuMemcpyHtoD");
    /* From pageable memory the DMA may still be in flight when cuMemcpyHtoD returns. */
    CINFER__CU(cu, cuStreamSynchronize(NULL), "cinfer_test_buf_upload: cuStreamSynchronize");
    return CINFER_STATUS_SUCCESS;
}

cinfer_status_t cinfer_test_buf_download(const cinfer_test_buf *buf, size_t offset, void *host,
                                         size_t bytes) {
    const cinfer__cuda_t *cu;

    CINFER__CHECK(check_range(buf, offset, bytes, "cinfer_test_buf_download"));
    CINFER__CHECK(cinfer__cuda_get(&cu));
    if (bytes > 0)
        CINFER__CU(cu, cuMemcpyDtoH(host, buf->ptr + offset, bytes),
                   "cinfer_test_buf_download: cuMemcpyDtoH");
    return CINFER_STATUS_SUCCESS;
}

cinfer_status_t cinfer_test_buf_check_poisoned(const cinfer_test_buf *buf, size_t bytes) {
    unsigned char *got = malloc(bytes ? bytes : 1);
    if (!got)
        return cinfer__error(CINFER_STATUS_OUT_OF_MEMORY,
                             "cinfer_test_buf_check_poisoned: no host memory for %zu bytes", bytes);
    cinfer_status_t st = cinfer_test_buf_download(buf, 0, got, bytes);
    for (size_t i = 0; st == CINFER_STATUS_SUCCESS && i < bytes; i++)
        if (got[i] != CINFER_TEST_POISON_BYTE)
            st = cinfer__error(CINFER_STATUS_INTERNAL,
                               "payload byte %zu of %zu written: 0x%02x (expected the poison "
                               "0x%02x)",
                               i, bytes, got[i], CINFER_TEST_POISON_BYTE);
    free(got);
    return st;
}

cinfer_status_t cinfer_test_buf_check_canaries(const cinfer_test_buf *buf) {
    const cinfer__cuda_t *cu;
    unsigned char got[CINFER_TEST_CANARY_BYTES];

    CINFER__CHECK(cinfer__cuda_get(&cu));
    for (int zone = 0; zone < 2; zone++) {
        CUdeviceptr at = zone == 0 ? buf->base : buf->ptr + buf->bytes;
        size_t changed = 0, nearest = 0;

        CINFER__CU(cu, cuMemcpyDtoH(got, at, CINFER_TEST_CANARY_BYTES),
                   "cinfer_test_buf_check_canaries: cuMemcpyDtoH");
        /* Report the changed byte nearest the payload: that is where an off-by-one write lands
         * (the last one of the front zone, the first one of the back zone). */
        for (size_t i = 0; i < CINFER_TEST_CANARY_BYTES; i++) {
            if (got[i] != cinfer_test_canary_byte(i)) {
                if (changed == 0 || zone == 0)
                    nearest = i;
                changed++;
            }
        }
        if (changed > 0)
            return cinfer__error(
                CINFER_STATUS_INTERNAL,
                "canary %s the %zu-byte payload overwritten: %zu of %d bytes changed; payload "
                "byte %s%zu is 0x%02x (expected 0x%02x)",
                zone == 0 ? "before" : "after", buf->bytes, changed, CINFER_TEST_CANARY_BYTES,
                zone == 0 ? "-" : "+",
                zone == 0 ? (size_t)CINFER_TEST_CANARY_BYTES - nearest : buf->bytes + nearest,
                got[nearest], cinfer_test_canary_byte(nearest));
    }
    return CINFER_STATUS_SUCCESS;
}

void cinfer_test_buf_free(cinfer_test_buf *buf) {
    const cinfer__cuda_t *cu;

    if (!buf || buf->base == 0)
        return;
    if (cinfer__cuda_get(&cu) == CINFER_STATUS_SUCCESS)
        cu->cuMemFree(buf->base);
    forget(buf->base);
    memset(buf, 0, sizeof *buf);
}

size_t cinfer_test_buf_free_all(void) {
    const cinfer__cuda_t *cu;
    size_t freed = num_live;

    if (num_live > 0 && cinfer__cuda_get(&cu) == CINFER_STATUS_SUCCESS)
        for (size_t i = 0; i < num_live; i++)
            cu->cuMemFree(live_bases[i]);
    num_live = 0;
    return freed;
}

int cinfer_test_teardown_buffers(void **state) {
    (void)state;
    cinfer_test_buf_free_all();
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * DLTensor views
 * ------------------------------------------------------------------------------------------- */

DLDataType cinfer_test_dl_dtype(cinfer__dtype_t dtype) {
    DLDataType d = {0, 0, 0};

    switch (dtype) {
    case CINFER__DT_F16:
        d.code = kDLFloat, d.bits = 16;
        break;
    case CINFER__DT_BF16:
        d.code = kDLBfloat, d.bits = 16;
        break;
    case CINFER__DT_F32:
        d.code = kDLFloat, d.bits = 32;
        break;
    case CINFER__DT_I32:
        d.code = kDLInt, d.bits = 32;
        break;
    case CINFER__DT_U8:
        d.code = kDLUInt, d.bits = 8;
        break;
    case CINFER__DT_E4M3:
        /* kDLFloat8_e4m3fn in DLPack 1.x; the installed dlpack.h may predate the name. */
        d.code = 10, d.bits = 8;
        break;
    case CINFER__DT_E5M2:
        /* kDLFloat8_e5m2 in DLPack 1.x. */
        d.code = 12, d.bits = 8;
        break;
    default:
        return d;
    }
    d.lanes = 1;
    return d;
}

DLTensor *cinfer_test_tensor_init(cinfer_test_tensor *x, const cinfer_test_buf *buf,
                                  size_t data_shift, uint64_t byte_offset, cinfer__dtype_t dtype,
                                  int ndim, const int64_t *shape, const int64_t *strides) {
    if (ndim < 0 || ndim > CINFER_TEST_MAX_DIMS)
        cinfer_test_fail_at(__FILE__, __LINE__, "cinfer_test_tensor_init: ndim %d outside [0, %d]",
                            ndim, CINFER_TEST_MAX_DIMS);
    memset(x, 0, sizeof *x);
    x->t.data = buf ? (void *)(uintptr_t)(buf->ptr + data_shift) : NULL;
    x->t.device.device_type = kDLCUDA;
    x->t.device.device_id = test_device;
    x->t.ndim = ndim;
    x->t.dtype = cinfer_test_dl_dtype(dtype);
    for (int i = 0; i < ndim; i++) {
        x->shape[i] = shape[i];
        x->strides[i] = strides ? strides[i] : 0;
    }
    x->t.shape = x->shape;
    x->t.strides = strides ? x->strides : NULL;
    x->t.byte_offset = byte_offset;
    return &x->t;
}

DLTensor cinfer_test_dl_view(void *data, int ndim, int64_t *shape, DLDataTypeCode code,
                             uint8_t bits) {
    DLTensor t;
    memset(&t, 0, sizeof t);
    t.data = data;
    t.device.device_type = kDLCUDA;
    t.ndim = ndim;
    t.shape = shape;
    t.dtype.code = (uint8_t)code;
    t.dtype.bits = bits;
    t.dtype.lanes = 1;
    return t;
}

/* ---------------------------------------------------------------------------------------------
 * Element access and seeded random data
 * ------------------------------------------------------------------------------------------- */

int cinfer_test_ref_dtype(cinfer__dtype_t dtype, cinfer__ref_dtype_t *out) {
    switch (dtype) {
    case CINFER__DT_F16:
        *out = CINFER__REF_DTYPE_F16;
        return 0;
    case CINFER__DT_BF16:
        *out = CINFER__REF_DTYPE_BF16;
        return 0;
    case CINFER__DT_F32:
        *out = CINFER__REF_DTYPE_F32;
        return 0;
    case CINFER__DT_E4M3:
        *out = CINFER__REF_DTYPE_E4M3;
        return 0;
    case CINFER__DT_E5M2:
        *out = CINFER__REF_DTYPE_E5M2;
        return 0;
    default:
        return -1;
    }
}

cinfer__ref_dtype_t cinfer_test_ref_dtype_of(cinfer__dtype_t dtype) {
    cinfer__ref_dtype_t r = CINFER__REF_DTYPE_F32;
    if (cinfer_test_ref_dtype(dtype, &r) != 0)
        fail_msg("no reference dtype for %s", cinfer__dtype_name(dtype));
    return r;
}

double cinfer_test_value_tolerance(cinfer__dtype_t dtype) {
    return dtype == CINFER__DT_BF16 ? 1e-2 : 3e-3;
}

double cinfer_test_load(cinfer__dtype_t dtype, const void *base, int64_t index) {
    cinfer__ref_dtype_t rd;

    if (cinfer_test_ref_dtype(dtype, &rd) == 0)
        return cinfer__ref_load(rd, base, index);
    if (dtype == CINFER__DT_I32) {
        int32_t v;
        memcpy(&v, (const char *)base + index * 4, sizeof v);
        return v;
    }
    if (dtype == CINFER__DT_U8)
        return ((const uint8_t *)base)[index];
    return NAN;
}

void cinfer_test_store(cinfer__dtype_t dtype, void *base, int64_t index, double x) {
    unsigned char *p = base;

    switch (dtype) {
    case CINFER__DT_F16: {
        uint16_t v = cinfer__ref_double_to_f16(x);
        memcpy(p + 2 * index, &v, sizeof v);
        break;
    }
    case CINFER__DT_BF16: {
        uint16_t v = cinfer__ref_double_to_bf16(x);
        memcpy(p + 2 * index, &v, sizeof v);
        break;
    }
    case CINFER__DT_F32: {
        uint32_t v = cinfer__ref_double_to_f32(x);
        memcpy(p + 4 * index, &v, sizeof v);
        break;
    }
    case CINFER__DT_E4M3:
        p[index] = cinfer__ref_double_to_e4m3(x);
        break;
    case CINFER__DT_E5M2:
        p[index] = cinfer__ref_double_to_e5m2(x);
        break;
    case CINFER__DT_I32: {
        int32_t v = (int32_t)x;
        memcpy(p + 4 * index, &v, sizeof v);
        break;
    }
    case CINFER__DT_U8:
        p[index] = (uint8_t)x;
        break;
    default:
        break;
    }
}

uint64_t cinfer_test_seed(void) {
    const char *text = getenv("CINFER_TEST_SEED");

    if (text && text[0])
        return strtoull(text, NULL, 0);
    return 0x5eedc1f3e0000001ull;
}

void cinfer_test_rng_init(cinfer_test_rng *rng, uint64_t seed) {
    rng->state = seed;
    rng->seed = seed;
}

uint64_t cinfer_test_rng_next(cinfer_test_rng *rng) {
    /* splitmix64 (Steele, Lea, Flood 2014): every seed, including 0, gives a full-period stream. */
    uint64_t z = (rng->state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

double cinfer_test_rng_uniform(cinfer_test_rng *rng, double lo, double hi) {
    /* The top 53 bits make a double in [0, 1) with every value equally likely. */
    double u = (double)(cinfer_test_rng_next(rng) >> 11) * (1.0 / 9007199254740992.0);
    return lo + (hi - lo) * u;
}

uint64_t cinfer_test_rng_below(cinfer_test_rng *rng, uint64_t n) {
    return n > 1 ? cinfer_test_rng_next(rng) % n : 0;
}

void cinfer_test_fill_uniform(cinfer_test_rng *rng, cinfer__dtype_t dtype, int64_t n, double lo,
                              double hi, void *raw, double *exact) {
    for (int64_t k = 0; k < n; k++) {
        cinfer_test_store(dtype, raw, k, cinfer_test_rng_uniform(rng, lo, hi));
        if (exact)
            exact[k] = cinfer_test_load(dtype, raw, k);
    }
}

/* ---------------------------------------------------------------------------------------------
 * Comparison with the reference
 * ------------------------------------------------------------------------------------------- */

cinfer_test_cmp cinfer_test_compare(cinfer__dtype_t dtype, const void *out, const double *ref,
                                    int64_t n, double rel_l2_tol, double max_abs_tol,
                                    double ref_norm_floor) {
    cinfer_test_cmp c;
    cinfer__ref_dtype_t rd;
    cinfer__ref_error_t e;
    double ref_sq = 0.0, ref_norm, diff_norm, denom;

    memset(&c, 0, sizeof c);
    c.n = n;
    c.rel_l2_tol = rel_l2_tol;
    c.max_abs_tol = max_abs_tol;
    c.worst_index = -1;
    c.worst_out = c.worst_ref = NAN;
    if (cinfer_test_ref_dtype(dtype, &rd) != 0 ||
        cinfer__ref_compare(rd, out, ref, n, &e) != CINFER__REF_OK) {
        /* A misuse of the helper (bad dtype, NULL buffer) must not pass silently. */
        c.max_abs_err = c.rel_l2_err = NAN;
        c.ok = 0;
        return c;
    }
    for (int64_t k = 0; k < n; k++) {
        double x = cinfer_test_load(dtype, out, k);
        if (isnan(x))
            c.num_nan++;
        else if (isinf(x))
            c.num_inf++;
        if (isfinite(ref[k]))
            ref_sq += ref[k] * ref[k];
    }
    ref_norm = sqrt(ref_sq);
    /* cinfer__ref_compare gives ||diff|| / ||ref||, or ||diff|| itself when ||ref|| == 0. */
    diff_norm = ref_norm > 0.0 ? e.rel_l2_err * ref_norm : e.rel_l2_err;
    denom = ref_norm > ref_norm_floor ? ref_norm : ref_norm_floor;
    c.max_abs_err = e.max_abs_err;
    c.rel_l2_err = denom > 0.0 ? diff_norm / denom : diff_norm;
    c.worst_index = e.max_abs_index;
    if (c.worst_index >= 0) {
        c.worst_out = cinfer_test_load(dtype, out, c.worst_index);
        c.worst_ref = ref[c.worst_index];
    }
    /* NaN compares false with everything, so a NaN metric fails these tests too. */
    c.ok = c.num_nan == 0 && c.max_abs_err <= max_abs_tol && c.rel_l2_err <= rel_l2_tol;
    return c;
}

cinfer_test_lse_cmp cinfer_test_compare_lse(const float *out, const double *ref, int64_t n,
                                            double abs_tol) {
    cinfer_test_lse_cmp c;
    cinfer__ref_lse_error_t e;
    int64_t scaled_index = -1;

    memset(&c, 0, sizeof c);
    c.n = n;
    c.abs_tol = abs_tol;
    c.worst_index = -1;
    c.worst_out = c.worst_ref = NAN;
    if (cinfer__ref_compare_lse(CINFER__REF_DTYPE_F32, out, ref, n, &e) != CINFER__REF_OK) {
        c.max_abs_err = c.max_scaled_err = NAN;
        c.ok = 0;
        return c;
    }
    for (int64_t k = 0; k < n; k++) {
        double x = out[k], r = ref[k];
        if (isfinite(x) && isfinite(r)) {
            double scaled = fabs(x - r) / (1.0 + fabs(r));
            if (scaled_index < 0 || scaled > c.max_scaled_err) {
                c.max_scaled_err = scaled;
                scaled_index = k;
            }
        }
    }
    c.max_abs_err = e.max_abs_err;
    c.num_nan = e.num_nan;
    c.num_inf_mismatch = e.num_inf_mismatch;
    c.worst_index = e.first_mismatch_index >= 0 ? e.first_mismatch_index : scaled_index;
    if (c.worst_index >= 0) {
        c.worst_out = out[c.worst_index];
        c.worst_ref = ref[c.worst_index];
    }
    c.ok = c.num_nan == 0 && c.num_inf_mismatch == 0 && c.max_scaled_err <= abs_tol;
    return c;
}

void cinfer_test_cmp_format(char *dst, size_t cap, const cinfer_test_cmp *c, const char *what,
                            const char *desc, uint64_t seed) {
    snprintf(dst, cap,
             "%s of %s (seed 0x%016" PRIx64 "): max abs err %.4g (tol %.4g) at [%" PRId64
             "] got %.9g want %.9g; rel L2 err %.4g (tol %.4g); %" PRId64 " NaN and %" PRId64
             " Inf among %" PRId64 " elements",
             what, desc, seed, c->max_abs_err, c->max_abs_tol, c->worst_index, c->worst_out,
             c->worst_ref, c->rel_l2_err, c->rel_l2_tol, c->num_nan, c->num_inf, c->n);
}

void cinfer_test_lse_cmp_format(char *dst, size_t cap, const cinfer_test_lse_cmp *c,
                                const char *what, const char *desc, uint64_t seed) {
    snprintf(dst, cap,
             "%s of %s (seed 0x%016" PRIx64 "): max |err| / (1 + |lse|) %.4g (tol %.4g), max abs "
             "err %.4g; worst [%" PRId64 "] got %.9g want %.9g; %" PRId64 " NaN, %" PRId64
             " -inf/inf mismatches among %" PRId64 " elements",
             what, desc, seed, c->max_scaled_err, c->abs_tol, c->max_abs_err, c->worst_index,
             c->worst_out, c->worst_ref, c->num_nan, c->num_inf_mismatch, c->n);
}

/* ---------------------------------------------------------------------------------------------
 * Streams
 * ------------------------------------------------------------------------------------------- */

cinfer_status_t cinfer_test_stream_create(CUstream *stream) {
    const cinfer__cuda_t *cu;

    *stream = NULL;
    CINFER__CHECK(cinfer__cuda_get(&cu));
    CINFER__CU(cu, cuStreamCreate(stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
    return CINFER_STATUS_SUCCESS;
}

static char test_case[256];

void cinfer_test_case(const char *desc) {
    snprintf(test_case, sizeof test_case, "%s", desc ? desc : "");
}

cinfer_status_t cinfer_test_stream_sync(CUstream stream) {
    const cinfer__cuda_t *cu;

    CINFER__CHECK(cinfer__cuda_get(&cu));
    const char *text = getenv("CINFER_TEST_SYNC_TIMEOUT");
    const double limit = text && text[0] ? atof(text) : 120.0;
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (;;) {
        const CUresult r = cu->cuStreamQuery(stream);
        if (r != CUDA_ERROR_NOT_READY)
            return r == CUDA_SUCCESS ? CINFER_STATUS_SUCCESS : cinfer__cu_error(r, "cuStreamQuery");
        clock_gettime(CLOCK_MONOTONIC, &now);
        const double waited =
            (double)(now.tv_sec - start.tv_sec) + 1e-9 * (double)(now.tv_nsec - start.tv_nsec);
        if (limit > 0 && waited > limit) {
            fprintf(stderr,
                    "error: the stream has not finished after %.0f s (CINFER_TEST_SYNC_TIMEOUT) in "
                    "case \"%s\": a kernel that never ends? exiting\n",
                    waited, test_case);
            fflush(stdout);
            fflush(stderr);
            exit(1);
        }
        const struct timespec pause = {0, 100000}; /* 0.1 ms */
        nanosleep(&pause, NULL);
    }
}

void cinfer_test_stream_destroy(CUstream stream) {
    const cinfer__cuda_t *cu;

    if (stream && cinfer__cuda_get(&cu) == CINFER_STATUS_SUCCESS)
        cu->cuStreamDestroy(stream);
}
