/*
 * The one table of environment variables. Each is read once per process (pthread_once); tests
 * that change the environment call cinfer__settings_reload().
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/core.h"

static cinfer__settings_t settings;
static pthread_once_t settings_once = PTHREAD_ONCE_INIT;

static void copy_env(char *dst, size_t cap, const char *name) {
    const char *value = getenv(name);
    cinfer__fmt(dst, cap, "%s", value ? value : "");
}

static void read_cache_dir(cinfer__settings_t *s) {
    const char *dir = getenv("CINFER_CACHE_DIR");
    if (dir && dir[0]) {
        cinfer__fmt(s->cache_dir, sizeof s->cache_dir, "%s", dir);
        return;
    }
    const char *xdg = getenv("XDG_CACHE_HOME");
    if (xdg && xdg[0]) {
        cinfer__fmt(s->cache_dir, sizeof s->cache_dir, "%s/cinfer", xdg);
        return;
    }
    const char *home = getenv("HOME");
    if (home && home[0]) {
        cinfer__fmt(s->cache_dir, sizeof s->cache_dir, "%s/.cache/cinfer", home);
        return;
    }
    s->cache_dir[0] = '\0';
}

static void read_settings(void) {
    cinfer__settings_t s;
    memset(&s, 0, sizeof s);
    read_cache_dir(&s);
    const char *log = getenv("CINFER_LOG");
    s.log_level = CINFER__LOG_QUIET;
    if (log && log[0]) {
        if (strlen(log) == 1 && log[0] >= '0' && log[0] <= '2')
            s.log_level = log[0] - '0';
        else /* (not through cinfer__warn: it reads these settings) */
            fprintf(stderr,
                    "cinfer: warning: CINFER_LOG = \"%s\" is not 0, 1 or 2; logging stays "
                    "quiet\n",
                    log);
    }
    const char *jit = getenv("CINFER_JIT");
    s.jit_enabled = !(jit && (strcasecmp(jit, "off") == 0 || strcmp(jit, "0") == 0));
    if (jit && jit[0] && s.jit_enabled && strcasecmp(jit, "on") != 0 && strcmp(jit, "1") != 0)
        /* (Not through cinfer__warn: it reads these settings.) */
        fprintf(stderr,
                "cinfer: warning: CINFER_JIT = \"%s\" is not on, off, 1 or 0; the JIT "
                "stays on\n",
                jit);
    copy_env(s.nvrtc_path, sizeof s.nvrtc_path, "CINFER_NVRTC_PATH");
    copy_env(s.cuda_path, sizeof s.cuda_path, "CINFER_CUDA_PATH");
    copy_env(s.aot_path, sizeof s.aot_path, "CINFER_AOT_PATH");
    settings = s;
}

const cinfer__settings_t *cinfer__settings(void) {
    pthread_once(&settings_once, read_settings);
    return &settings;
}

void cinfer__settings_reload(void) {
    pthread_once(&settings_once, read_settings);
    read_settings();
}

const char *cinfer_cache_dir(void) {
    return cinfer__settings()->cache_dir;
}
