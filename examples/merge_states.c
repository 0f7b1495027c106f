/*
 * A complete program against the installed library: merges three partial attention states per
 * row with cinfer_merge_states and checks the result against the closed form. Without a GPU it
 * says so and exits 0. It allocates with the CUDA runtime, so it links libcudart (the library
 * itself needs neither). Build: see examples/CMakeLists.txt (find_package(cinfer)) or
 *   cc merge_states.c $(pkg-config --cflags --libs cinfer) -L/usr/local/cuda/lib64 -lcudart -lm
 * and run with the install's lib folder (and CUDA's) on LD_LIBRARY_PATH.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include <cinfer.h>
#include <cuda_runtime_api.h>

enum { ROWS = 4, STATES = 3, HEADS = 2, DIM = 64 };

/* fp16 bits of a small integer-valued float (exact in fp16). */
static unsigned short to_half(float x) {
    if (x == 0.0f)
        return 0;
    unsigned short sign = x < 0 ? 0x8000 : 0;
    float a = fabsf(x);
    int e = 0;
    while (a >= 2.0f) {
        a /= 2.0f;
        e++;
    }
    while (a < 1.0f) {
        a *= 2.0f;
        e--;
    }
    return (unsigned short)(sign | ((e + 15) << 10) | (unsigned short)((a - 1.0f) * 1024.0f));
}

static float from_half(unsigned short h) {
    int e = (h >> 10) & 0x1f;
    float m = (float)(h & 0x3ff) / 1024.0f;
    float v = e ? ldexpf(1.0f + m, e - 15) : ldexpf(m, -14);
    return (h & 0x8000) ? -v : v;
}

static DLTensor tensor(void *data, DLDataType dtype, int ndim, int64_t *shape) {
    DLTensor t;
    memset(&t, 0, sizeof t);
    t.data = data;
    t.device.device_type = kDLCUDA;
    t.device.device_id = 0;
    t.ndim = ndim;
    t.dtype = dtype;
    t.shape = shape;
    return t;
}

int main(void) {
    cinfer_context_t *ctx = NULL;
    cinfer_status_t st = cinfer_context_create(NULL, &ctx);
    if (st == CINFER_STATUS_NO_DEVICE) {
        printf("cinfer %s: no GPU here (%s)\n", cinfer_version_string(), cinfer_last_error());
        return 0;
    }
    if (st != CINFER_STATUS_SUCCESS) {
        fprintf(stderr, "cinfer_context_create: %s\n", cinfer_last_error());
        return 1;
    }
    /* State k of every row holds the value k + 1 everywhere and lse log2(k + 1): the merge weighs
     * the states 1 : 2 : 3, so every output element is (1 + 4 + 9) / 6 and the lse log2(6). */
    static unsigned short v[ROWS][STATES][HEADS][DIM], out[ROWS][HEADS][DIM];
    static float lse[ROWS][STATES][HEADS], lse_out[ROWS][HEADS];
    for (int r = 0; r < ROWS; r++)
        for (int k = 0; k < STATES; k++)
            for (int h = 0; h < HEADS; h++) {
                lse[r][k][h] = log2f((float)(k + 1));
                for (int d = 0; d < DIM; d++)
                    v[r][k][h][d] = to_half((float)(k + 1));
            }
    void *d_v, *d_lse, *d_out, *d_lse_out;
    if (cudaMalloc(&d_v, sizeof v) || cudaMalloc(&d_lse, sizeof lse) ||
        cudaMalloc(&d_out, sizeof out) || cudaMalloc(&d_lse_out, sizeof lse_out) ||
        cudaMemcpy(d_v, v, sizeof v, cudaMemcpyHostToDevice) ||
        cudaMemcpy(d_lse, lse, sizeof lse, cudaMemcpyHostToDevice)) {
        fprintf(stderr, "CUDA runtime error\n");
        return 1;
    }
    const DLDataType f16 = {kDLFloat, 16, 1}, f32 = {kDLFloat, 32, 1};
    int64_t v_shape[4] = {ROWS, STATES, HEADS, DIM}, lse_shape[3] = {ROWS, STATES, HEADS};
    int64_t out_shape[3] = {ROWS, HEADS, DIM}, lse_out_shape[2] = {ROWS, HEADS};
    DLTensor tv = tensor(d_v, f16, 4, v_shape), tlse = tensor(d_lse, f32, 3, lse_shape);
    DLTensor tout = tensor(d_out, f16, 3, out_shape),
             tlo = tensor(d_lse_out, f32, 2, lse_out_shape);
    st = cinfer_merge_states(ctx, &tv, &tlse, &tout, &tlo, NULL);
    if (st != CINFER_STATUS_SUCCESS) {
        fprintf(stderr, "cinfer_merge_states: %s\n", cinfer_last_error());
        return 1;
    }
    if (cudaMemcpy(out, d_out, sizeof out, cudaMemcpyDeviceToHost) ||
        cudaMemcpy(lse_out, d_lse_out, sizeof lse_out, cudaMemcpyDeviceToHost)) {
        fprintf(stderr, "CUDA runtime error\n");
        return 1;
    }
    const float want = 14.0f / 6.0f, want_lse = log2f(6.0f);
    float worst = 0.0f;
    for (int r = 0; r < ROWS; r++)
        for (int h = 0; h < HEADS; h++) {
            worst = fmaxf(worst, fabsf(lse_out[r][h] - want_lse));
            for (int d = 0; d < DIM; d++)
                worst = fmaxf(worst, fabsf(from_half(out[r][h][d]) - want));
        }
    printf("cinfer %s: merge_states max error %.2e (%s)\n", cinfer_version_string(), worst,
           worst < 2e-3f ? "ok" : "WRONG");
    cudaFree(d_v);
    cudaFree(d_lse);
    cudaFree(d_out);
    cudaFree(d_lse_out);
    cinfer_context_destroy(ctx);
    return worst < 2e-3f ? 0 : 1;
}
