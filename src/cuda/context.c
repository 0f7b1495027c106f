#include <stdlib.h>
#include <string.h>

#include "cuda/context.h"

void cinfer__arch_for(int cc_major, int cc_minor, char *dst, size_t cap) {
    /* Hopper's wgmma and setmaxnreg exist only in the arch-specific sm_90a target. */
    if (cc_major == 9 && cc_minor == 0)
        cinfer__fmt(dst, cap, "sm_90a");
    else
        cinfer__fmt(dst, cap, "sm_%d%d", cc_major, cc_minor);
}

cinfer_status_t cinfer__context_activate(cinfer_context_t *ctx) {
    CUcontext current = NULL;
    CINFER__CU(ctx->cu, cuCtxGetCurrent(&current), "cuCtxGetCurrent");
    if (current != ctx->cu_context)
        CINFER__CU(ctx->cu, cuCtxSetCurrent(ctx->cu_context), "cuCtxSetCurrent");
    return CINFER_STATUS_SUCCESS;
}

static cinfer_status_t attribute(const cinfer__cuda_t *cu, CUdevice dev, CUdevice_attribute a,
                                 int *out) {
    CINFER__CU(cu, cuDeviceGetAttribute(out, a, dev), "cuDeviceGetAttribute");
    return CINFER_STATUS_SUCCESS;
}

cinfer_status_t cinfer_context_create(const cinfer_context_options_t *options,
                                      cinfer_context_t **out) {
    if (!out)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT, "out is NULL");
    *out = NULL;
    cinfer_context_options_t defaults = CINFER_CONTEXT_OPTIONS_INIT;
    if (!options)
        options = &defaults;
    if (options->size < sizeof *options || options->version != CINFER_CONTEXT_OPTIONS_VERSION)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "options: size %zu / version %u; initialize it with "
                             "CINFER_CONTEXT_OPTIONS_INIT (size %zu, version %u)",
                             options->size, options->version, sizeof *options,
                             CINFER_CONTEXT_OPTIONS_VERSION);
    /* A negative index is wrong on any machine: said before the driver is looked for. */
    if (options->device < 0)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "options->device = %d, expected a device index >= 0", options->device);
    const cinfer__cuda_t *cu;
    CINFER__CHECK(cinfer__cuda_get(&cu));
    if (options->device >= cu->device_count)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "options->device = %d, expected 0 <= device < %d (devices present)",
                             options->device, cu->device_count);

    cinfer_context_t *ctx = calloc(1, sizeof *ctx);
    if (!ctx)
        return cinfer__error(CINFER_STATUS_OUT_OF_MEMORY, "context: out of memory");
    ctx->cu = cu;
    ctx->device = options->device;
    cinfer_status_t st = CINFER_STATUS_SUCCESS;
    CUresult res = cu->cuDeviceGet(&ctx->cu_device, options->device);
    if (res == CUDA_SUCCESS)
        res = cu->cuDevicePrimaryCtxRetain(&ctx->cu_context, ctx->cu_device);
    if (res != CUDA_SUCCESS) {
        st = cinfer__cu_error(res, "retaining the device's primary context");
        goto out_free;
    }
    if ((st = attribute(cu, ctx->cu_device, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
                        &ctx->cc_major)) ||
        (st = attribute(cu, ctx->cu_device, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
                        &ctx->cc_minor)) ||
        (st = attribute(cu, ctx->cu_device, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
                        &ctx->num_sms)) ||
        (st = attribute(cu, ctx->cu_device, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
                        &ctx->max_smem_per_block_optin)) ||
        (st = attribute(cu, ctx->cu_device, CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, &ctx->l2_bytes)))
        goto out_release;
    if (ctx->cc_major < 8) {
        st = cinfer__error(CINFER_STATUS_UNSUPPORTED,
                           "device %d has compute capability %d.%d; cinfer needs 8.0 or later",
                           options->device, ctx->cc_major, ctx->cc_minor);
        goto out_release;
    }
    cinfer__arch_for(ctx->cc_major, ctx->cc_minor, ctx->arch, sizeof ctx->arch);
    if (pthread_mutex_init(&ctx->lock, NULL) != 0) {
        st = cinfer__error(CINFER_STATUS_INTERNAL, "context: pthread_mutex_init failed");
        goto out_release;
    }
    *out = ctx;
    return CINFER_STATUS_SUCCESS;

out_release:
    cu->cuDevicePrimaryCtxRelease(ctx->cu_device);
out_free:
    free(ctx);
    return st;
}

void cinfer_context_destroy(cinfer_context_t *ctx) {
    if (!ctx)
        return;
    if (cinfer__context_activate(ctx) == CINFER_STATUS_SUCCESS)
        for (size_t i = 0; i < ctx->num_modules; i++)
            ctx->cu->cuModuleUnload(ctx->modules[i].module);
    free(ctx->modules);
    pthread_mutex_destroy(&ctx->lock);
    ctx->cu->cuDevicePrimaryCtxRelease(ctx->cu_device);
    free(ctx);
}

cinfer_status_t cinfer_context_get_device(const cinfer_context_t *ctx, int *device,
                                          int *compute_capability) {
    if (!ctx)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT, CINFER__NULL_CTX);
    if (device)
        *device = ctx->device;
    if (compute_capability)
        *compute_capability = ctx->cc_major * 10 + ctx->cc_minor;
    return CINFER_STATUS_SUCCESS;
}
