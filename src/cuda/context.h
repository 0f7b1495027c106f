/* The context object behind cinfer_context_t: one device, its primary CUDA context, its kernels. */
#ifndef CINFER_CUDA_CONTEXT_H
#define CINFER_CUDA_CONTEXT_H

#include <pthread.h>

#include "cuda/driver.h"
#include "jit/spec.h"

typedef struct cinfer__module_entry {
    cinfer__spec_t spec; /* normalized; compared with memcmp */
    CUmodule module;
    CUfunction function;
    int max_threads, num_regs;
} cinfer__module_entry_t;

struct cinfer_context {
    const cinfer__cuda_t *cu;
    int device;
    CUdevice cu_device;
    CUcontext cu_context; /* the device's primary context, retained */
    int cc_major, cc_minor;
    char arch[16]; /* NVRTC target: sm_90a on Hopper, sm_XY otherwise */
    int num_sms;
    int max_smem_per_block_optin;
    int l2_bytes;

    pthread_mutex_t lock; /* guards the module table */
    cinfer__module_entry_t *modules;
    size_t num_modules, cap_modules;
};

/* Makes the context's CUDA context current on this thread (cheap when it already is). */
cinfer_status_t cinfer__context_activate(cinfer_context_t *ctx);

/* The NVRTC arch string for a compute capability: "sm_90a" for 9.0, "sm_XY" otherwise. */
void cinfer__arch_for(int cc_major, int cc_minor, char *dst, size_t cap);

#endif
