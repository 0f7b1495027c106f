/*
 * `cinfer`: the command-line tool. Each command lives in its own file (cmd_*.c); this file holds
 * the command table, the help text, dispatch and the helpers the commands share.
 */
#include <stdarg.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

/* The one table of commands: dispatch, `cinfer help` and each command's --help come from it. */
static const cli_command_t commands[] = {
    {"info", cli_info,
     "show the library version, CUDA driver, NVRTC, devices, kernel cache and JIT settings",
     "usage: cinfer info\n"
     "\n"
     "Works without a GPU: what is missing is reported, not an error.\n"},
    {"cache", cli_cache, "list or clear the on-disk kernel cache",
     "usage: cinfer cache ls      one line per entry (kernel, key, arch, file size with its "
     "header,\n"
     "                            modified, age), then a total\n"
     "       cinfer cache clear   remove every entry, lock and temporary file of the cache\n"
     "\n"
     "The folder is CINFER_CACHE_DIR, else $XDG_CACHE_HOME/cinfer, else ~/.cache/cinfer. A folder\n"
     "that does not exist is an empty cache (the first compile creates it): said in a note on\n"
     "stderr, with exit status 0.\n"},
    {"compile", cli_compile, "compile kernel specs into the kernel cache, optionally load them",
     "usage: cinfer compile [--arch ARCH[,ARCH...]] [--load] SPEC...\n"
     "       cinfer compile --list-ops\n"
     "\n"
     "  SPEC          OP[:FIELD=VALUE,...], e.g. merge_states:dtype=bf16,head_dim=128,vec=8\n"
     "  --arch ARCH   NVRTC targets, comma-separated (sm_80,sm_90a), sm_80 or later;\n"
     "                default: the arch of device 0, or sm_90a without a device\n"
     "  --load        then load each spec into a fresh context on device 0 and time the load\n"
     "                (needs a device: without one nothing is compiled and the command fails)\n"
     "  --list-ops    print the known operations\n"},
    {"aot", cli_aot, "build an AOT kernel bundle from a set of specs, or list one",
     "usage: cinfer aot --arch ARCH[,ARCH...] [--set NAME] [-j N] -o FILE\n"
     "       cinfer aot --list FILE\n"
     "\n"
     "  --arch ARCH   NVRTC targets, comma-separated (sm_80,sm_90a), sm_80 or later; a device\n"
     "                of another arch finds nothing in the bundle and compiles its kernels as\n"
     "                usual\n"
     "  --set NAME    default: the serving shapes of Llama, Qwen, Mistral and Gemma (fp16 and\n"
     "                bf16 decode, prefill and KV-cache appends) and DeepSeek's MLA; ci: a\n"
     "                handful of specs (default: default)\n"
     "  -j N          compile on N threads (default: one per CPU)\n"
     "  -o FILE       the bundle to write; install it as libcinfer.aot next to libcinfer.so,\n"
     "                or point CINFER_AOT_PATH at it\n"
     "  --list FILE   print the kernels a bundle holds and whom it was built for\n"
     "\n"
     "Each kernel comes from the kernel cache or NVRTC under its usual cache key; one line per\n"
     "kernel (name, arch, seconds), then the bundle's size and the total build time.\n"},
    {"bench", cli_bench, "benchmarks: serve = replay a request trace through continuous batching",
     "usage: cinfer bench serve [options]\n"
     "\n"
     "Replays a request trace (default: the Azure LLM inference trace 2023) through continuous\n"
     "batching over a paged KV cache and reports decode, prefill and append time against the\n"
     "device's copy and GEMM ceilings. `cinfer bench serve --help` lists the options.\n"},
    {"demo", cli_demo, "a short serving replay on the GPU, checked against the CPU reference",
     "usage: cinfer demo\n"
     "\n"
     "The same as `cinfer bench serve --check --steps 64 --requests 256 --layers 2`: 64 steps of\n"
     "continuous batching (Llama-3-8B heads, bf16, paged KV cache) over the Azure trace, timed,\n"
     "with sampled steps checked against the float64 CPU reference. Without a GPU it says so,\n"
     "replays the schedule on the host, compiles the kernels for sm_90a and exits 0.\n"},
};
#define NUM_COMMANDS (sizeof commands / sizeof commands[0])

static const cli_command_t *find_command(const char *name) {
    for (size_t i = 0; i < NUM_COMMANDS; i++)
        if (strcmp(commands[i].name, name) == 0)
            return &commands[i];
    return NULL;
}

static void print_usage(FILE *out) {
    fprintf(out, "usage: cinfer <command> [arguments]\n"
                 "       cinfer help [command]   this list, or a command's usage and options\n"
                 "       cinfer --version        the library version\n"
                 "\n"
                 "commands:\n");
    for (size_t i = 0; i < NUM_COMMANDS; i++)
        fprintf(out, "  %-10s %s\n", commands[i].name, commands[i].summary);
    fprintf(
        out,
        "\n"
        "An option that takes a value is given once (a comma list holds several archs).\n"
        "environment: CINFER_CACHE_DIR, CINFER_AOT_PATH, CINFER_LOG (0, 1, 2), CINFER_JIT (off), "
        "CINFER_NVRTC_PATH, CINFER_CUDA_PATH (CUDA_HOME, CUDA_PATH: toolkits searched for "
        "NVRTC)\n");
}

int cli_fail(void) {
    const char *message = cinfer_last_error();
    if (message[0])
        fprintf(stderr, "cinfer: error: %s [%s]\n", message,
                cinfer_status_name(cinfer__last_status()));
    else
        fprintf(stderr, "cinfer: error: unknown failure\n");
    return CLI_EXIT_FAILED;
}

int cli_vusage_error(const char *synopsis, const char *fmt, va_list ap) {
    char message[1024];
    vsnprintf(message, sizeof message, fmt, ap);
    fprintf(stderr, "cinfer: error: %s\n", message);
    if (synopsis)
        fputs(synopsis, stderr);
    else
        print_usage(stderr);
    return CLI_EXIT_USAGE;
}

int cli_usage_error(const char *command, const char *fmt, ...) {
    const cli_command_t *cmd = command ? find_command(command) : NULL;
    va_list ap;
    va_start(ap, fmt);
    const int status = cli_vusage_error(cmd ? cmd->synopsis : NULL, fmt, ap);
    va_end(ap);
    return status;
}

int cli_print_help(const char *command) {
    /* `cinfer help help`: help is no row of the table; its usage is the command list's. */
    if (strcmp(command, "help") == 0) {
        print_usage(stdout);
        return CLI_EXIT_OK;
    }
    const cli_command_t *cmd = find_command(command);
    if (!cmd)
        return cli_usage_error(NULL, "unknown command \"%s\"", command);
    printf("cinfer %s: %s\n\n%s", cmd->name, cmd->summary, cmd->synopsis);
    return CLI_EXIT_OK;
}

bool cli_is_help(const char *arg) {
    return strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0;
}

void cli_format_bytes(uint64_t bytes, char *dst, size_t cap) {
    static const char *const units[] = {"KiB", "MiB", "GiB", "TiB"};
    if (bytes < 1024) {
        cinfer__fmt(dst, cap, "%llu B", (unsigned long long)bytes);
        return;
    }
    double value = (double)bytes / 1024.0;
    size_t unit = 0;
    while (value >= 1024.0 && unit + 1 < sizeof units / sizeof units[0]) {
        value /= 1024.0;
        unit++;
    }
    cinfer__fmt(dst, cap, "%.1f %s", value, units[unit]);
}

/*
 * The tool links the library statically, so the library cannot find a bundle "next to
 * libcinfer.so". For the commands that run kernels (and `info`, which reports the bundle), point
 * CINFER_AOT_PATH, when unset, at the bundle next to the tool (a build folder) or in ../lib or
 * ../lib64 (an install), as if the library were the shared one beside it.
 */
static void use_bundle_beside_the_tool(void) {
    if (getenv("CINFER_AOT_PATH"))
        return;
    char exe[PATH_MAX];
    const ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0)
        return;
    exe[n] = '\0';
    char *slash = strrchr(exe, '/');
    if (!slash)
        return;
    *slash = '\0';
    static const char *const places[] = {"", "/../lib", "/../lib64"};
    for (size_t i = 0; i < sizeof places / sizeof places[0]; i++) {
        char path[PATH_MAX + 32];
        snprintf(path, sizeof path, "%s%s/libcinfer.aot", exe, places[i]);
        if (access(path, R_OK) == 0) {
            setenv("CINFER_AOT_PATH", path, 0);
            return;
        }
    }
}

int main(int argc, char **argv) {
    if (argc < 2)
        return cli_usage_error(NULL, "no command given");
    const char *name = argv[1];
    if (cli_is_help(name)) {
        print_usage(stdout);
        return CLI_EXIT_OK;
    }
    if (strcmp(name, "--version") == 0) {
        printf("cinfer %s\n", cinfer_version_string());
        return CLI_EXIT_OK;
    }
    if (strcmp(name, "help") == 0) {
        if (argc == 2) {
            print_usage(stdout);
            return CLI_EXIT_OK;
        }
        if (argc > 3)
            return cli_usage_error(NULL, "help takes at most one command");
        return cli_print_help(argv[2]);
    }
    const cli_command_t *cmd = find_command(name);
    if (!cmd)
        return cli_usage_error(NULL, "unknown command \"%s\"", name);
    if (strcmp(name, "demo") == 0 || strcmp(name, "bench") == 0 || strcmp(name, "info") == 0)
        use_bundle_beside_the_tool();
    int status = cmd->run(argc - 1, argv + 1);
    /* A failed write (full disk, closed pipe) must not pass for success. */
    if ((fflush(stdout) != 0 || ferror(stdout)) && status == CLI_EXIT_OK) {
        fprintf(stderr, "cinfer: error: cannot write the output\n");
        return CLI_EXIT_FAILED;
    }
    return status;
}
