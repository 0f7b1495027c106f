/*
 * `cinfer info`: what this process sees of the library, the CUDA driver, NVRTC, the devices, the
 * kernel cache and the JIT settings. Missing pieces (no driver, no NVRTC, no cache folder) are
 * reported on their line and are not errors, so the command answers on any machine.
 */
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"
#include "jit/aot.h"
#include "cuda/context.h"
#include "jit/cache.h"

/* The width of the labels, so the values line up. */
#define LABEL "%-14s"

cinfer_status_t cli_device_query(const cinfer__cuda_t *cu, int ordinal, cli_device_t *out) {
    memset(out, 0, sizeof *out);
    CUdevice dev;
    size_t bytes = 0;
    CINFER__CU(cu, cuDeviceGet(&dev, ordinal), "cuDeviceGet");
    CINFER__CU(cu, cuDeviceGetName(out->name, (int)sizeof out->name, dev), "cuDeviceGetName");
    CINFER__CU(
        cu, cuDeviceGetAttribute(&out->cc_major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev),
        "cuDeviceGetAttribute");
    CINFER__CU(
        cu, cuDeviceGetAttribute(&out->cc_minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev),
        "cuDeviceGetAttribute");
    CINFER__CU(cu,
               cuDeviceGetAttribute(&out->num_sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev),
               "cuDeviceGetAttribute");
    CINFER__CU(cu, cuDeviceTotalMem(&bytes, dev), "cuDeviceTotalMem");
    out->memory_bytes = bytes;
    cinfer__arch_for(out->cc_major, out->cc_minor, out->arch, sizeof out->arch);
    return CINFER_STATUS_SUCCESS;
}

/* The file a loaded library function lives in (dlopen was given a bare soname, which says little
 * about which installation answered). */
static const char *library_file(const void *function_pointer_bytes, size_t n) {
    void *address = NULL;
    memcpy(&address, function_pointer_bytes, n < sizeof address ? n : sizeof address);
    Dl_info where;
    if (address && dladdr(address, &where) && where.dli_fname)
        return where.dli_fname;
    return NULL;
}

/* "13.0" from the driver's 13000. */
static void driver_version_text(int version, char *dst, size_t cap) {
    cinfer__fmt(dst, cap, "%d.%d", version / 1000, (version % 1000) / 10);
}

static const cinfer__cuda_t *print_driver(void) {
    const cinfer__cuda_t *cu = NULL;
    if (cinfer__cuda_get(&cu) != CINFER_STATUS_SUCCESS) {
        printf(LABEL "not found: %s\n", "CUDA driver:", cinfer_last_error());
        return NULL;
    }
    char version[32];
    driver_version_text(cu->driver_version, version, sizeof version);
    const char *file = library_file(&cu->cuInit, sizeof cu->cuInit);
    printf(LABEL "found, version %s (%d)%s%s\n", "CUDA driver:", version, cu->driver_version,
           file ? ", " : "", file ? file : "");
    return cu;
}

/* The archs NVRTC can target, as "sm_75 .. sm_120". */
static void nvrtc_archs_text(const cinfer__nvrtc_t *nv, char *dst, size_t cap) {
    int n = 0;
    int archs[64];
    dst[0] = '\0';
    if (nv->nvrtcGetNumSupportedArchs(&n) != NVRTC_SUCCESS || n <= 0 ||
        n > (int)(sizeof archs / sizeof archs[0]) ||
        nv->nvrtcGetSupportedArchs(archs) != NVRTC_SUCCESS)
        return;
    cinfer__fmt(dst, cap, ", targets sm_%d .. sm_%d", archs[0], archs[n - 1]);
}

static void print_nvrtc(void) {
    const cinfer__nvrtc_t *nv = NULL;
    if (cinfer__nvrtc_get(&nv) != CINFER_STATUS_SUCCESS) {
        printf(LABEL "unavailable: %s\n", "NVRTC:", cinfer_last_error());
        return;
    }
    const char *file = library_file(&nv->nvrtcVersion, sizeof nv->nvrtcVersion);
    char archs[64];
    nvrtc_archs_text(nv, archs, sizeof archs);
    printf(LABEL "version %d.%d, %s%s\n", "NVRTC:", nv->major, nv->minor, file ? file : nv->path,
           archs);
}

static void print_devices(const cinfer__cuda_t *cu) {
    if (!cu) {
        /* The CUDA driver line holds the reason. */
        printf(LABEL "none (%s)\n", "devices:", cinfer_status_string(CINFER_STATUS_NO_DEVICE));
        return;
    }
    printf(LABEL "%d\n", "devices:", cu->device_count);
    for (int i = 0; i < cu->device_count; i++) {
        cli_device_t d;
        if (cli_device_query(cu, i, &d) != CINFER_STATUS_SUCCESS) {
            printf("  device %d: cannot be queried: %s\n", i, cinfer_last_error());
            continue;
        }
        char memory[32];
        cli_format_bytes(d.memory_bytes, memory, sizeof memory);
        printf("  device %d: %s, compute capability %d.%d, %d SMs, %s, arch %s%s\n", i, d.name,
               d.cc_major, d.cc_minor, d.num_sms, memory, d.arch,
               d.cc_major < 8 ? " (unsupported: cinfer needs 8.0 or later)" : "");
    }
}

static void print_cache(void) {
    const char *dir = cinfer_cache_dir();
    if (!dir[0]) {
        printf(LABEL "none (set CINFER_CACHE_DIR; HOME and XDG_CACHE_HOME are unset)\n",
               "kernel cache:");
        return;
    }
    uint64_t entries = 0, bytes = 0;
    if (cinfer__cache_usage(dir, &entries, &bytes) != CINFER_STATUS_SUCCESS) {
        printf(LABEL "%s (unreadable: %s)\n", "kernel cache:", dir, cinfer_last_error());
        return;
    }
    char size[32];
    cli_format_bytes(bytes, size, sizeof size);
    struct stat st;
    const bool missing = stat(dir, &st) != 0 && errno == ENOENT;
    printf(LABEL "%s (%llu entries, %s%s)\n", "kernel cache:", dir, (unsigned long long)entries,
           size, missing ? "; the folder does not exist yet: the first compile creates it" : "");
}

/* The AOT bundle this process would use (CINFER_AOT_PATH, else libcinfer.aot next to the library;
 * a statically linked tool has no library to sit next to). */
static void print_aot(void) {
    const cinfer__aot_bundle_t *bundle = cinfer__aot_process_bundle();
    if (!bundle) {
        printf(LABEL "none (set CINFER_AOT_PATH, or install libcinfer.aot next to libcinfer.so)\n",
               "AOT bundle:");
        return;
    }
    cinfer__aot_info_t info;
    cinfer__aot_info(bundle, &info);
    char size[32];
    cli_format_bytes(info.bytes, size, sizeof size);
    printf(LABEL "%s (%u kernels for %s, %s)\n", "AOT bundle:", info.path, info.count, info.archs,
           size);
}

static void print_jit(void) {
    cinfer_jit_stats_t stats = CINFER_JIT_STATS_INIT;
    if (cinfer_jit_get_stats(&stats) != CINFER_STATUS_SUCCESS) {
        printf(LABEL "unavailable: %s\n", "JIT stats:", cinfer_last_error());
    } else {
        printf(LABEL "%llu memory hits, %llu disk hits, %llu AOT hits, %llu misses, %.2f s "
                     "compiling (this process)\n",
               "JIT stats:", (unsigned long long)stats.memory_hits,
               (unsigned long long)stats.disk_hits, (unsigned long long)stats.aot_hits,
               (unsigned long long)stats.misses, stats.compile_seconds);
    }
    const cinfer__settings_t *s = cinfer__settings();
    const char *level = s->log_level <= CINFER__LOG_QUIET  ? "quiet"
                        : s->log_level == CINFER__LOG_INFO ? "info"
                                                           : "debug";
    printf(LABEL "CINFER_LOG=%d (%s), CINFER_JIT=%s\n", "settings:", s->log_level, level,
           s->jit_enabled ? "on" : "off");
}

int cli_info(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        if (cli_is_help(argv[i]))
            return cli_print_help("info");
        return cli_usage_error("info", "unexpected argument \"%s\"", argv[i]);
    }
    printf(LABEL "%s\n", "cinfer:", cinfer_version_string());
    const cinfer__cuda_t *cu = print_driver();
    print_nvrtc();
    print_devices(cu);
    print_cache();
    print_aot();
    print_jit();
    return CLI_EXIT_OK;
}
