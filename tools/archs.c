/*
 * The --arch lists of `cinfer compile`, `cinfer aot` and `cinfer bench serve`: NVRTC target names
 * checked for their form, against the oldest arch cinfer supports (sm_80) and, when NVRTC loads,
 * against the archs it can target.
 */
#include <stdbool.h>
#include <string.h>

#include "cli.h"
#include "jit/spec.h"

/* Checks one arch's form and minimum and, when NVRTC loads, that NVRTC can target it. */
static cinfer_status_t check_arch(const char *arch) {
    CINFER__CHECK(cinfer__arch_check(arch, "--arch"));
    const int number = cinfer__arch_number(arch);
    const cinfer__nvrtc_t *nv;
    int count = 0, archs[64];
    /* Without NVRTC only cached kernels can be had; the lookup reports that itself. */
    if (cinfer__nvrtc_get(&nv) != CINFER_STATUS_SUCCESS ||
        nv->nvrtcGetNumSupportedArchs(&count) != NVRTC_SUCCESS || count <= 0 ||
        count > (int)(sizeof archs / sizeof archs[0]) ||
        nv->nvrtcGetSupportedArchs(archs) != NVRTC_SUCCESS)
        return CINFER_STATUS_SUCCESS;
    /* The archs NVRTC and cinfer both support, for the message. */
    char known[512] = "";
    for (int i = 0; i < count; i++) {
        if (archs[i] == number)
            return CINFER_STATUS_SUCCESS;
        if (archs[i] < CINFER__MIN_ARCH)
            continue;
        size_t n = strlen(known);
        cinfer__fmt(known + n, sizeof known - n, "%ssm_%d", n ? ", " : "", archs[i]);
    }
    return cinfer__error(CINFER_STATUS_UNSUPPORTED,
                         "--arch: NVRTC %d.%d cannot target %s (of the archs cinfer supports, it "
                         "targets %s)",
                         nv->major, nv->minor, arch, known[0] ? known : "none");
}

cinfer_status_t cli_parse_archs(const char *list, char archs[][CLI_ARCH_CHARS], int max_archs,
                                int *count) {
    *count = 0;
    const char *p = list;
    for (;;) {
        size_t n = strcspn(p, ",");
        if (n == 0 || n >= CLI_ARCH_CHARS)
            return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                                 "--arch \"%s\": \"%.*s\" is not an arch (expected a comma list "
                                 "such as sm_80,sm_90a)",
                                 list, (int)n, p);
        char arch[CLI_ARCH_CHARS];
        memcpy(arch, p, n);
        arch[n] = '\0';
        CINFER__CHECK(check_arch(arch));
        bool seen = false;
        for (int i = 0; i < *count; i++)
            seen = seen || strcmp(archs[i], arch) == 0;
        if (!seen) {
            if (*count == max_archs)
                return cinfer__error(CINFER_STATUS_INVALID_ARGUMENT,
                                     "--arch \"%s\": expected at most %d arch%s", list, max_archs,
                                     max_archs == 1 ? "" : "s");
            memcpy(archs[(*count)++], arch, n + 1);
        }
        if (p[n] == '\0')
            return CINFER_STATUS_SUCCESS;
        p += n + 1;
    }
}
