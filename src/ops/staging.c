#include <string.h>

#include "ops/staging.h"

cinfer_status_t cinfer__staging_create(const cinfer_context_t *ctx, cinfer__staging_t *s,
                                       size_t bytes, size_t align, const char *what) {
    const cinfer__cuda_t *cu = ctx->cu;
    memset(s, 0, sizeof *s);
    s->stride = (bytes + align - 1) / align * align;
    void *host = NULL;
    CUresult res = cu->cuMemAllocHost(&host, 2 * s->stride);
    if (res != CUDA_SUCCESS)
        return res == CUDA_ERROR_OUT_OF_MEMORY
                   ? cinfer__error(CINFER_STATUS_OUT_OF_MEMORY,
                                   "%s: cuMemAllocHost of %zu bytes failed", what, 2 * s->stride)
                   : cinfer__cu_error(res, "cuMemAllocHost (schedule staging)");
    s->host = host;
    /* Plans copy whole regions; zeroing keeps their unused entries defined. */
    memset(s->host, 0, 2 * s->stride);
    for (int i = 0; i < 2; i++) {
        if ((res = cu->cuEventCreate(&s->copied[i], CU_EVENT_DISABLE_TIMING)) != CUDA_SUCCESS) {
            if (i == 1)
                cu->cuEventDestroy(s->copied[0]);
            cu->cuMemFreeHost(s->host);
            memset(s, 0, sizeof *s);
            return cinfer__cu_error(res, "cuEventCreate (schedule staging)");
        }
    }
    return CINFER_STATUS_SUCCESS;
}

cinfer_status_t cinfer__stream_capturing(cinfer_context_t *ctx, CUstream stream, bool *capturing) {
    CINFER__CHECK(cinfer__context_activate(ctx));
    CUstreamCaptureStatus capture = CU_STREAM_CAPTURE_STATUS_NONE;
    CINFER__CU(ctx->cu, cuStreamIsCapturing(stream, &capture), "cuStreamIsCapturing");
    *capturing = capture != CU_STREAM_CAPTURE_STATUS_NONE;
    return CINFER_STATUS_SUCCESS;
}

cinfer_status_t cinfer__staging_check_stream(cinfer_context_t *ctx, CUstream stream,
                                             const char *what) {
    bool capturing = false;
    CINFER__CHECK(cinfer__stream_capturing(ctx, stream, &capturing));
    if (capturing)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "%s: stream is being captured into a CUDA graph; plan copies its "
                             "schedule from host memory, so call it outside the capture (a "
                             "captured run replays the schedule of the latest plan)",
                             what);
    return CINFER_STATUS_SUCCESS;
}

cinfer_status_t cinfer__staging_next(const cinfer_context_t *ctx, cinfer__staging_t *s,
                                     char **host) {
    const int i = s->next;
    if (s->pending[i]) {
        CINFER__CU(ctx->cu, cuEventSynchronize(s->copied[i]),
                   "waiting for an earlier plan's schedule copy");
        s->pending[i] = false;
    }
    *host = s->host + (size_t)i * s->stride;
    return CINFER_STATUS_SUCCESS;
}

cinfer_status_t cinfer__staging_copy_range(const cinfer_context_t *ctx, const cinfer__staging_t *s,
                                           void *dst, size_t offset, size_t bytes, CUstream stream,
                                           const char *what) {
    CINFER__CU(ctx->cu,
               cuMemcpyHtoDAsync((CUdeviceptr)(uintptr_t)((char *)dst + offset),
                                 s->host + (size_t)s->next * s->stride + offset, bytes, stream),
               what);
    return CINFER_STATUS_SUCCESS;
}

cinfer_status_t cinfer__staging_copy(const cinfer_context_t *ctx, cinfer__staging_t *s, void *dst,
                                     size_t bytes, CUstream stream, const char *what) {
    const int i = s->next;
    CUresult res = ctx->cu->cuMemcpyHtoDAsync((CUdeviceptr)(uintptr_t)dst,
                                              s->host + (size_t)i * s->stride, bytes, stream);
    if (res != CUDA_SUCCESS) {
        /* A range copy of this plan (cinfer__staging_copy_range) may still read the mirror. */
        ctx->cu->cuStreamSynchronize(stream);
        return cinfer__cu_error(res, what);
    }
    res = ctx->cu->cuEventRecord(s->copied[i], stream);
    if (res != CUDA_SUCCESS) {
        /* Without the event the mirror's copy cannot be tracked: let it finish here. */
        ctx->cu->cuStreamSynchronize(stream);
        return cinfer__cu_error(res, "cuEventRecord after a schedule copy");
    }
    s->pending[i] = true;
    s->next = 1 - i;
    return CINFER_STATUS_SUCCESS;
}

void cinfer__staging_destroy(const cinfer_context_t *ctx, cinfer__staging_t *s) {
    if (!s->host)
        return;
    const cinfer__cuda_t *cu = ctx->cu;
    for (int i = 0; i < 2; i++) {
        if (s->pending[i])
            cu->cuEventSynchronize(s->copied[i]);
        cu->cuEventDestroy(s->copied[i]);
    }
    cu->cuMemFreeHost(s->host);
    memset(s, 0, sizeof *s);
}

cinfer_status_t cinfer__copy_pageable(cinfer_context_t *ctx, void *dst, const void *host,
                                      size_t bytes, CUstream stream, const char *what) {
    CINFER__CHECK(cinfer__context_activate(ctx));
    CINFER__CU(ctx->cu, cuMemcpyHtoDAsync((CUdeviceptr)(uintptr_t)dst, host, bytes, stream), what);
    return CINFER_STATUS_SUCCESS;
}

cinfer_status_t cinfer__check_workspace(const void *workspace, size_t workspace_bytes, size_t need,
                                        size_t align, const char *size_function) {
    if (!workspace)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                             "workspace is NULL, expected %zu bytes of device memory (%s)", need,
                             size_function);
    if ((uintptr_t)workspace % align != 0)
        return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT, "workspace %p is not %zu-byte aligned",
                             workspace, align);
    if (workspace_bytes < need)
        return cinfer__error(CINFER_STATUS_WORKSPACE_TOO_SMALL,
                             "workspace_bytes = %zu, expected at least %zu (%s)", workspace_bytes,
                             need, size_function);
    return CINFER_STATUS_SUCCESS;
}
