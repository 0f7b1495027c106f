/*
 * A stand-in CUDA driver for CPU tests (tests/api/): the library loads it through
 * CINFER_CUDA_PATH, so that contexts, plans and the argument checks of the public entry points run
 * on a machine without a GPU. It reports one sm_90 device (H200-like limits); every call succeeds
 * and nothing runs. Device memory is host memory, copies and memsets are done (so uploads and
 * downloads behave), and each kernel launch is counted: cinfer_fake_cuda_launches() lets a test
 * check that a refused call launched nothing.
 *
 * <cuda.h> maps each name to its versioned symbol (cuMemAlloc -> cuMemAlloc_v2, ...), so these
 * definitions carry the symbols the library's loader looks up (src/cuda/loader.c).
 */
#include <cuda.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define UNUSED(x) (void)(x)

static int context_object, module_object, function_object;
static _Thread_local CUcontext current;
static atomic_long launches;

long cinfer_fake_cuda_launches(void) {
    return atomic_load(&launches);
}

CUresult cuInit(unsigned flags) {
    UNUSED(flags);
    return CUDA_SUCCESS;
}

CUresult cuDriverGetVersion(int *version) {
    *version = CUDA_VERSION;
    return CUDA_SUCCESS;
}

CUresult cuGetErrorName(CUresult error, const char **name) {
    UNUSED(error);
    *name = "CUDA_ERROR_FAKE";
    return CUDA_SUCCESS;
}

CUresult cuGetErrorString(CUresult error, const char **text) {
    UNUSED(error);
    *text = "an error of the fake driver";
    return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice *device, int ordinal) {
    *device = ordinal;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetCount(int *count) {
    *count = 1;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetAttribute(int *value, CUdevice_attribute attribute, CUdevice device) {
    UNUSED(device);
    switch (attribute) {
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR:
        *value = 9;
        break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR:
        *value = 0;
        break;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT:
        *value = 132;
        break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN:
        *value = 227 * 1024;
        break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR:
        *value = 228 * 1024;
        break;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR:
        *value = 2048;
        break;
    case CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE:
        *value = 60 << 20;
        break;
    default:
        *value = 1;
        break;
    }
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetName(char *name, int length, CUdevice device) {
    UNUSED(device);
    snprintf(name, (size_t)length, "fake sm_90 device (tests/fake_driver)");
    return CUDA_SUCCESS;
}

CUresult cuDeviceTotalMem(size_t *bytes, CUdevice device) {
    UNUSED(device);
    *bytes = (size_t)141 << 30;
    return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRetain(CUcontext *context, CUdevice device) {
    UNUSED(device);
    *context = (CUcontext)&context_object;
    return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRelease(CUdevice device) {
    UNUSED(device);
    return CUDA_SUCCESS;
}

CUresult cuCtxGetCurrent(CUcontext *context) {
    *context = current;
    return CUDA_SUCCESS;
}

CUresult cuCtxSetCurrent(CUcontext context) {
    current = context;
    return CUDA_SUCCESS;
}

CUresult cuCtxSynchronize(void) {
    return CUDA_SUCCESS;
}

CUresult cuModuleLoadData(CUmodule *module, const void *image) {
    UNUSED(image);
    *module = (CUmodule)&module_object;
    return CUDA_SUCCESS;
}

CUresult cuModuleUnload(CUmodule module) {
    UNUSED(module);
    return CUDA_SUCCESS;
}

CUresult cuModuleGetFunction(CUfunction *function, CUmodule module, const char *name) {
    UNUSED(module), UNUSED(name);
    *function = (CUfunction)&function_object;
    return CUDA_SUCCESS;
}

CUresult cuFuncSetAttribute(CUfunction function, CUfunction_attribute attribute, int value) {
    UNUSED(function), UNUSED(attribute), UNUSED(value);
    return CUDA_SUCCESS;
}

CUresult cuFuncGetAttribute(int *value, CUfunction_attribute attribute, CUfunction function) {
    UNUSED(function);
    *value = attribute == CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK ? 1024
             : attribute == CU_FUNC_ATTRIBUTE_NUM_REGS            ? 64
                                                                  : 0;
    return CUDA_SUCCESS;
}

CUresult cuLaunchKernel(CUfunction function, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                        unsigned by, unsigned bz, unsigned smem, CUstream stream, void **params,
                        void **extra) {
    UNUSED(function), UNUSED(gx), UNUSED(gy), UNUSED(gz), UNUSED(bx), UNUSED(by), UNUSED(bz);
    UNUSED(smem), UNUSED(stream), UNUSED(params), UNUSED(extra);
    atomic_fetch_add(&launches, 1);
    return CUDA_SUCCESS;
}

CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction function, void **params,
                          void **extra) {
    UNUSED(config), UNUSED(function), UNUSED(params), UNUSED(extra);
    atomic_fetch_add(&launches, 1);
    return CUDA_SUCCESS;
}

CUresult cuOccupancyMaxActiveBlocksPerMultiprocessor(int *blocks, CUfunction function,
                                                     int block_size, size_t smem) {
    UNUSED(function), UNUSED(block_size), UNUSED(smem);
    *blocks = 1;
    return CUDA_SUCCESS;
}

CUresult cuTensorMapEncodeTiled(CUtensorMap *map, CUtensorMapDataType dtype, cuuint32_t rank,
                                void *base, const cuuint64_t *dims, const cuuint64_t *strides,
                                const cuuint32_t *box, const cuuint32_t *element_strides,
                                CUtensorMapInterleave interleave, CUtensorMapSwizzle swizzle,
                                CUtensorMapL2promotion promotion, CUtensorMapFloatOOBfill fill) {
    UNUSED(dtype), UNUSED(rank), UNUSED(base), UNUSED(dims), UNUSED(strides), UNUSED(box);
    UNUSED(element_strides), UNUSED(interleave), UNUSED(swizzle), UNUSED(promotion), UNUSED(fill);
    memset(map, 0, sizeof *map);
    return CUDA_SUCCESS;
}

/* Device memory: host memory, 256-byte aligned as cuMemAlloc's. */
CUresult cuMemAlloc(CUdeviceptr *ptr, size_t bytes) {
    void *p = aligned_alloc(256, (bytes + 255) / 256 * 256 + 256);
    if (!p)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *ptr = (CUdeviceptr)p;
    return CUDA_SUCCESS;
}

CUresult cuMemFree(CUdeviceptr ptr) {
    free((void *)ptr);
    return CUDA_SUCCESS;
}

CUresult cuMemAllocHost(void **ptr, size_t bytes) {
    *ptr = malloc(bytes ? bytes : 1);
    return *ptr ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

CUresult cuMemFreeHost(void *ptr) {
    free(ptr);
    return CUDA_SUCCESS;
}

CUresult cuMemcpyHtoD(CUdeviceptr dst, const void *src, size_t bytes) {
    memcpy((void *)dst, src, bytes);
    return CUDA_SUCCESS;
}

CUresult cuMemcpyDtoH(void *dst, CUdeviceptr src, size_t bytes) {
    memcpy(dst, (const void *)src, bytes);
    return CUDA_SUCCESS;
}

CUresult cuMemcpyHtoDAsync(CUdeviceptr dst, const void *src, size_t bytes, CUstream stream) {
    UNUSED(stream);
    return cuMemcpyHtoD(dst, src, bytes);
}

CUresult cuMemcpyDtoHAsync(void *dst, CUdeviceptr src, size_t bytes, CUstream stream) {
    UNUSED(stream);
    return cuMemcpyDtoH(dst, src, bytes);
}

CUresult cuMemcpyDtoDAsync(CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream stream) {
    UNUSED(stream);
    memmove((void *)dst, (const void *)src, bytes);
    return CUDA_SUCCESS;
}

CUresult cuMemsetD8(CUdeviceptr dst, unsigned char value, size_t count) {
    memset((void *)dst, value, count);
    return CUDA_SUCCESS;
}

CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char value, size_t count, CUstream stream) {
    UNUSED(stream);
    return cuMemsetD8(dst, value, count);
}

CUresult cuMemsetD32Async(CUdeviceptr dst, unsigned value, size_t count, CUstream stream) {
    UNUSED(stream);
    for (size_t i = 0; i < count; i++)
        memcpy((char *)dst + 4 * i, &value, 4);
    return CUDA_SUCCESS;
}

CUresult cuMemGetInfo(size_t *free_bytes, size_t *total_bytes) {
    *free_bytes = (size_t)100 << 30;
    *total_bytes = (size_t)141 << 30;
    return CUDA_SUCCESS;
}

CUresult cuPointerGetAttribute(void *data, CUpointer_attribute attribute, CUdeviceptr ptr) {
    UNUSED(ptr);
    switch (attribute) {
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
        *(int *)data = 0;
        break;
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
        *(unsigned *)data = CU_MEMORYTYPE_DEVICE;
        break;
    case CU_POINTER_ATTRIBUTE_CONTEXT:
        *(CUcontext *)data = (CUcontext)&context_object;
        break;
    default:
        return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}

CUresult cuStreamCreate(CUstream *stream, unsigned flags) {
    UNUSED(flags);
    *stream = (CUstream)malloc(16);
    return *stream ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

CUresult cuStreamDestroy(CUstream stream) {
    free(stream);
    return CUDA_SUCCESS;
}

CUresult cuStreamSynchronize(CUstream stream) {
    UNUSED(stream);
    return CUDA_SUCCESS;
}

CUresult cuStreamQuery(CUstream stream) {
    UNUSED(stream);
    return CUDA_SUCCESS;
}

CUresult cuStreamBeginCapture(CUstream stream, CUstreamCaptureMode mode) {
    UNUSED(stream), UNUSED(mode);
    return CUDA_ERROR_NOT_SUPPORTED;
}

CUresult cuStreamEndCapture(CUstream stream, CUgraph *graph) {
    UNUSED(stream), UNUSED(graph);
    return CUDA_ERROR_NOT_SUPPORTED;
}

CUresult cuStreamIsCapturing(CUstream stream, CUstreamCaptureStatus *status) {
    UNUSED(stream);
    *status = CU_STREAM_CAPTURE_STATUS_NONE;
    return CUDA_SUCCESS;
}

CUresult cuGraphInstantiate(CUgraphExec *exec, CUgraph graph, unsigned long long flags) {
    UNUSED(exec), UNUSED(graph), UNUSED(flags);
    return CUDA_ERROR_NOT_SUPPORTED;
}

CUresult cuGraphLaunch(CUgraphExec exec, CUstream stream) {
    UNUSED(exec), UNUSED(stream);
    return CUDA_ERROR_NOT_SUPPORTED;
}

CUresult cuGraphExecDestroy(CUgraphExec exec) {
    UNUSED(exec);
    return CUDA_SUCCESS;
}

CUresult cuGraphDestroy(CUgraph graph) {
    UNUSED(graph);
    return CUDA_SUCCESS;
}

CUresult cuEventCreate(CUevent *event, unsigned flags) {
    UNUSED(flags);
    *event = (CUevent)malloc(16);
    return *event ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

CUresult cuEventDestroy(CUevent event) {
    free(event);
    return CUDA_SUCCESS;
}

CUresult cuEventRecord(CUevent event, CUstream stream) {
    UNUSED(event), UNUSED(stream);
    return CUDA_SUCCESS;
}

CUresult cuEventQuery(CUevent event) {
    UNUSED(event);
    return CUDA_SUCCESS;
}

CUresult cuEventSynchronize(CUevent event) {
    UNUSED(event);
    return CUDA_SUCCESS;
}

CUresult cuEventElapsedTime(float *ms, CUevent start, CUevent end) {
    UNUSED(start), UNUSED(end);
    *ms = 0.0f;
    return CUDA_SUCCESS;
}
