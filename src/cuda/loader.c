/*
 * dlopen of the CUDA driver and NVRTC. Both are loaded once per process under pthread_once; the
 * outcome (table or error message) is remembered, so a machine without a driver answers every
 * call with the same NO_DEVICE message and never retries expensively.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/driver.h"

static cinfer__cuda_t cuda_table;
static cinfer_status_t cuda_status;
static char cuda_message[1024];
static pthread_once_t cuda_once = PTHREAD_ONCE_INIT;

static cinfer__nvrtc_t nvrtc_table;
static cinfer_status_t nvrtc_status;
static char nvrtc_message[4096];
static pthread_once_t nvrtc_once = PTHREAD_ONCE_INIT;

static void load_cuda(void) {
    const cinfer__settings_t *settings = cinfer__settings();
    const char *path = settings->cuda_path[0] ? settings->cuda_path : "libcuda.so.1";
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        cuda_status = CINFER_STATUS_NO_DEVICE;
        cinfer__fmt(cuda_message, sizeof cuda_message,
                    "no CUDA driver: dlopen(\"%s\") failed (%s); install the NVIDIA driver or set "
                    "CINFER_CUDA_PATH",
                    path, dlerror());
        return;
    }
    /* Each entry point is taken by the exact symbol <cuda.h> maps its name to (cuMemAlloc ->
     * cuMemAlloc_v2, cuGraphInstantiate -> cuGraphInstantiateWithFlags, ...), so the pointer
     * always has the prototype we call it with. cuGetProcAddress at one version for every name
     * would not: under CUDA 13 it hands out cuCtxSynchronize(CUcontext) for the name whose
     * header prototype is cuCtxSynchronize(void). */
    cinfer__cuda_t t;
    memset(&t, 0, sizeof t);
#define CINFER__XSTR(x)   #x
#define CINFER__SYMBOL(x) CINFER__XSTR(x)
#define CINFER__CU_LOAD(name)                                                                      \
    do {                                                                                           \
        void *fn = dlsym(lib, CINFER__SYMBOL(name));                                               \
        if (!fn) {                                                                                 \
            cuda_status = CINFER_STATUS_NO_DEVICE;                                                 \
            cinfer__fmt(cuda_message, sizeof cuda_message,                                         \
                        "the CUDA driver at \"%s\" lacks %s (a driver for CUDA %d.%d or later is " \
                        "needed)",                                                                 \
                        path, CINFER__SYMBOL(name), CUDA_VERSION / 1000,                           \
                        CUDA_VERSION % 1000 / 10);                                                 \
            return;                                                                                \
        }                                                                                          \
        memcpy(&t.name, &fn, sizeof fn);                                                           \
    } while (0);
    CINFER__CU_FUNCS(CINFER__CU_LOAD)
#undef CINFER__CU_LOAD
    int version = 0;
    t.cuDriverGetVersion(&version);
    t.driver_version = version;
    CUresult res = t.cuInit(0);
    if (res == CUDA_SUCCESS)
        res = t.cuDeviceGetCount(&t.device_count);
    if (res != CUDA_SUCCESS || t.device_count == 0) {
        cuda_status = CINFER_STATUS_NO_DEVICE;
        if (res == CUDA_SUCCESS) {
            cinfer__fmt(cuda_message, sizeof cuda_message,
                        "no CUDA device: the driver at \"%s\" (version %d) loaded but reports 0 "
                        "devices",
                        path, version);
            return;
        }
        /* The toolkit's stub libcuda (lib64/stubs, for linking only) fails every call, naming
         * its errors included: the code and a hint then say what was loaded. */
        const char *name = NULL;
        if (t.cuGetErrorName(res, &name) != CUDA_SUCCESS || !name || !name[0])
            name = "an unnamed error";
        cinfer__fmt(cuda_message, sizeof cuda_message,
                    "no CUDA device: the driver at \"%s\" (version %d) loaded but failed with %s "
                    "(CUresult %d)%s",
                    path, version, name, (int)res,
                    res == CUDA_ERROR_STUB_LIBRARY
                        ? ": it is the CUDA toolkit's stub library (lib64/stubs, for linking "
                          "only); install the NVIDIA driver, or point CINFER_CUDA_PATH at the "
                          "driver's libcuda.so.1"
                        : "");
        return;
    }
    cuda_table = t;
    cuda_status = CINFER_STATUS_SUCCESS;
}

cinfer_status_t cinfer__cuda_get(const cinfer__cuda_t **out) {
    pthread_once(&cuda_once, load_cuda);
    if (cuda_status != CINFER_STATUS_SUCCESS)
        return cinfer__error(cuda_status, "%s", cuda_message);
    *out = &cuda_table;
    return CINFER_STATUS_SUCCESS;
}

cinfer_status_t cinfer__cu_error(CUresult res, const char *what) {
    const char *name = "CUDA_ERROR_UNKNOWN", *text = "";
    if (cuda_status == CINFER_STATUS_SUCCESS) {
        cuda_table.cuGetErrorName(res, &name);
        cuda_table.cuGetErrorString(res, &text);
    }
    if (res == CUDA_ERROR_OUT_OF_MEMORY)
        return cinfer__error(CINFER_STATUS_OUT_OF_MEMORY, "%s: %s (%s)", what, name, text);
    return cinfer__error(CINFER_STATUS_CUDA_ERROR, "%s: %s (%s)", what, name, text);
}

static void *open_nvrtc(char *tried, size_t cap, char *found, size_t found_cap) {
    const cinfer__settings_t *settings = cinfer__settings();
    char candidates[8][4096];
    int n = 0;
    if (settings->nvrtc_path[0]) {
        cinfer__fmt(candidates[n++], sizeof candidates[0], "%s", settings->nvrtc_path);
    } else {
        /* The soname of the toolkit we were built against first, then any installed one. */
        cinfer__fmt(candidates[n++], sizeof candidates[0], "libnvrtc.so.%d", CUDA_VERSION / 1000);
        cinfer__fmt(candidates[n++], sizeof candidates[0], "libnvrtc.so");
        const char *homes[] = {getenv("CUDA_HOME"), getenv("CUDA_PATH"), "/usr/local/cuda"};
        for (int i = 0; i < 3; i++) {
            if (!homes[i] || !homes[i][0])
                continue;
            cinfer__fmt(candidates[n++], sizeof candidates[0], "%s/lib64/libnvrtc.so.%d", homes[i],
                        CUDA_VERSION / 1000);
        }
    }
    tried[0] = '\0';
    for (int i = 0; i < n; i++) {
        void *lib = dlopen(candidates[i], RTLD_NOW | RTLD_LOCAL);
        if (lib) {
            cinfer__fmt(found, found_cap, "%s", candidates[i]);
            return lib;
        }
        size_t len = strlen(tried);
        cinfer__fmt(tried + len, cap - len, "%s%s", i ? ", " : "", candidates[i]);
    }
    return NULL;
}

static void load_nvrtc(void) {
    cinfer__nvrtc_t t;
    memset(&t, 0, sizeof t);
    char tried[2048];
    void *lib = open_nvrtc(tried, sizeof tried, t.path, sizeof t.path);
    if (!lib) {
        nvrtc_status = CINFER_STATUS_COMPILE_ERROR;
        const char *why = dlerror();
        if (cinfer__settings()->nvrtc_path[0])
            cinfer__fmt(nvrtc_message, sizeof nvrtc_message,
                        "CINFER_NVRTC_PATH = \"%s\" could not be loaded (%s); point it at a CUDA "
                        "toolkit's libnvrtc.so, or unset it to search the usual places",
                        tried, why ? why : "dlopen failed");
        else
            cinfer__fmt(nvrtc_message, sizeof nvrtc_message,
                        "NVRTC not found (tried %s); install the CUDA toolkit's NVRTC or set "
                        "CINFER_NVRTC_PATH",
                        tried);
        return;
    }
#define CINFER__NVRTC_LOAD(name)                                                                   \
    do {                                                                                           \
        void *fn = dlsym(lib, #name);                                                              \
        if (!fn) {                                                                                 \
            nvrtc_status = CINFER_STATUS_COMPILE_ERROR;                                            \
            cinfer__fmt(nvrtc_message, sizeof nvrtc_message, "NVRTC at %s lacks %s", t.path,       \
                        #name);                                                                    \
            return;                                                                                \
        }                                                                                          \
        memcpy(&t.name, &fn, sizeof fn);                                                           \
    } while (0);
    CINFER__NVRTC_FUNCS(CINFER__NVRTC_LOAD)
#undef CINFER__NVRTC_LOAD
    t.nvrtcVersion(&t.major, &t.minor);
    nvrtc_table = t;
    nvrtc_status = CINFER_STATUS_SUCCESS;
}

cinfer_status_t cinfer__nvrtc_get(const cinfer__nvrtc_t **out) {
    pthread_once(&nvrtc_once, load_nvrtc);
    if (nvrtc_status != CINFER_STATUS_SUCCESS)
        return cinfer__error(nvrtc_status, "%s", nvrtc_message);
    *out = &nvrtc_table;
    return CINFER_STATUS_SUCCESS;
}
