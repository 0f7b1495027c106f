/* Basic definitions every kernel family includes. */
#ifndef CINFER_COMMON_CUH
#define CINFER_COMMON_CUH

/* NVRTC compiles without system headers; these are the fixed-width types the kernels use. */
typedef unsigned char uint8_t;
typedef int int32_t;
typedef unsigned int uint32_t;
typedef long long int64_t;
typedef unsigned long long uint64_t;

#define CINFER_INF            __int_as_float(0x7f800000)
#define CINFER_CEIL_DIV(a, b) (((a) + (b)-1) / (b))
#define CINFER_MIN(a, b)      ((a) < (b) ? (a) : (b))
#define CINFER_MAX(a, b)      ((a) > (b) ? (a) : (b))

#include "dtype.cuh"

#endif
