/*
 * The CUDA driver API and NVRTC, opened with dlopen at first use. Function pointers keep the exact
 * prototypes of <cuda.h> and <nvrtc.h> (taken with __typeof__), and driver entry points are looked
 * up with cuGetProcAddress so each name resolves to the ABI version this library was written for.
 */
#ifndef CINFER_CUDA_DRIVER_H
#define CINFER_CUDA_DRIVER_H

#include <cuda.h>
#include <nvrtc.h>

#include "core/core.h"

/* X(name): every driver function the library calls. */
#define CINFER__CU_FUNCS(X)                                                                        \
    X(cuInit)                                                                                      \
    X(cuDriverGetVersion)                                                                          \
    X(cuGetErrorName)                                                                              \
    X(cuGetErrorString)                                                                            \
    X(cuDeviceGet)                                                                                 \
    X(cuDeviceGetCount)                                                                            \
    X(cuDeviceGetAttribute)                                                                        \
    X(cuDeviceGetName)                                                                             \
    X(cuDeviceTotalMem)                                                                            \
    X(cuDevicePrimaryCtxRetain)                                                                    \
    X(cuDevicePrimaryCtxRelease)                                                                   \
    X(cuCtxGetCurrent)                                                                             \
    X(cuCtxSetCurrent)                                                                             \
    X(cuCtxSynchronize)                                                                            \
    X(cuModuleLoadData)                                                                            \
    X(cuModuleUnload)                                                                              \
    X(cuModuleGetFunction)                                                                         \
    X(cuFuncSetAttribute)                                                                          \
    X(cuFuncGetAttribute)                                                                          \
    X(cuLaunchKernel)                                                                              \
    X(cuLaunchKernelEx)                                                                            \
    X(cuOccupancyMaxActiveBlocksPerMultiprocessor)                                                 \
    X(cuTensorMapEncodeTiled)                                                                      \
    X(cuMemAlloc)                                                                                  \
    X(cuMemFree)                                                                                   \
    X(cuMemAllocHost)                                                                              \
    X(cuMemFreeHost)                                                                               \
    X(cuMemcpyHtoD)                                                                                \
    X(cuMemcpyDtoH)                                                                                \
    X(cuMemcpyHtoDAsync)                                                                           \
    X(cuMemcpyDtoHAsync)                                                                           \
    X(cuMemcpyDtoDAsync)                                                                           \
    X(cuMemsetD8)                                                                                  \
    X(cuMemsetD8Async)                                                                             \
    X(cuMemsetD32Async)                                                                            \
    X(cuMemGetInfo)                                                                                \
    X(cuPointerGetAttribute)                                                                       \
    X(cuStreamCreate)                                                                              \
    X(cuStreamDestroy)                                                                             \
    X(cuStreamSynchronize)                                                                         \
    X(cuStreamQuery)                                                                               \
    X(cuStreamBeginCapture)                                                                        \
    X(cuStreamEndCapture)                                                                          \
    X(cuStreamIsCapturing)                                                                         \
    X(cuGraphInstantiate)                                                                          \
    X(cuGraphLaunch)                                                                               \
    X(cuGraphExecDestroy)                                                                          \
    X(cuGraphDestroy)                                                                              \
    X(cuEventCreate)                                                                               \
    X(cuEventDestroy)                                                                              \
    X(cuEventRecord)                                                                               \
    X(cuEventQuery)                                                                                \
    X(cuEventSynchronize)                                                                          \
    X(cuEventElapsedTime)

/* X(name): every NVRTC function the library calls. */
#define CINFER__NVRTC_FUNCS(X)                                                                     \
    X(nvrtcVersion)                                                                                \
    X(nvrtcGetErrorString)                                                                         \
    X(nvrtcCreateProgram)                                                                          \
    X(nvrtcDestroyProgram)                                                                         \
    X(nvrtcCompileProgram)                                                                         \
    X(nvrtcGetProgramLogSize)                                                                      \
    X(nvrtcGetProgramLog)                                                                          \
    X(nvrtcGetCUBINSize)                                                                           \
    X(nvrtcGetCUBIN)                                                                               \
    X(nvrtcGetSupportedArchs)                                                                      \
    X(nvrtcGetNumSupportedArchs)

typedef struct cinfer__cuda {
#define CINFER__CU_FIELD(name) __typeof__(&name) name;
    CINFER__CU_FUNCS(CINFER__CU_FIELD)
#undef CINFER__CU_FIELD
    int driver_version; /* e.g. 13000 */
    int device_count;
} cinfer__cuda_t;

typedef struct cinfer__nvrtc {
#define CINFER__NVRTC_FIELD(name) __typeof__(&name) name;
    CINFER__NVRTC_FUNCS(CINFER__NVRTC_FIELD)
#undef CINFER__NVRTC_FIELD
    int major, minor;
    char path[4096]; /* where it was loaded from, for `cinfer info` */
} cinfer__nvrtc_t;

/*
 * Loads libcuda.so.1 and initializes the driver once per process. On a machine without a driver
 * or device returns NO_DEVICE with a message (the same one on every call); *out is set only on
 * success.
 */
cinfer_status_t cinfer__cuda_get(const cinfer__cuda_t **out);

/* Loads NVRTC once per process; COMPILE_ERROR with a message naming the paths tried. */
cinfer_status_t cinfer__nvrtc_get(const cinfer__nvrtc_t **out);

/* Turns a failed CUresult into CUDA_ERROR with "<what>: <name> (<description>)". */
cinfer_status_t cinfer__cu_error(CUresult res, const char *what);

/* Evaluates a driver call through the loaded table `cu` and returns CUDA_ERROR on failure. */
#define CINFER__CU(cu, call, what)                                                                 \
    do {                                                                                           \
        CUresult cinfer__res_ = (cu)->call;                                                        \
        if (cinfer__res_ != CUDA_SUCCESS)                                                          \
            return cinfer__cu_error(cinfer__res_, what);                                           \
    } while (0)

#endif
