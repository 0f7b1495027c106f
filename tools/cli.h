/*
 * The `cinfer` command-line tool: the command table and the helpers its commands share.
 *
 * The tool links the static internal library, so commands call `cinfer__*` functions directly.
 * Every failure that comes from the library (or that a command reports like one) is printed as
 * "cinfer: error: <cinfer_last_error()>" with exit status 1; a command line the tool cannot
 * understand exits with 2 after printing the command's synopsis.
 */
#ifndef CINFER_TOOLS_CLI_H
#define CINFER_TOOLS_CLI_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/core.h"
#include "cuda/driver.h"

/* Exit statuses of every command. */
enum { CLI_EXIT_OK = 0, CLI_EXIT_FAILED = 1, CLI_EXIT_USAGE = 2 };

/*
 * One command, `cinfer <name> ...`. run receives the arguments from the command name on (argv[0]
 * is the name) and returns an exit status. New commands are one row of the table in cinfer.c.
 */
typedef struct cli_command {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;  /* one line for `cinfer help` */
    const char *synopsis; /* usage lines and options, for `cinfer help <name>` and --help */
} cli_command_t;

int cli_info(int argc, char **argv);
int cli_cache(int argc, char **argv);
int cli_compile(int argc, char **argv);
int cli_aot(int argc, char **argv);
int cli_demo(int argc, char **argv);
int cli_bench(int argc, char **argv);

/* Prints "cinfer: error: <cinfer_last_error()>" to stderr and returns CLI_EXIT_FAILED. */
int cli_fail(void);

/* Prints "cinfer: error: <message>" and the synopsis of `command` (the command list when NULL)
 * to stderr and returns CLI_EXIT_USAGE. */
int cli_usage_error(const char *command, const char *fmt, ...) CINFER__PRINTF(2, 3);
/* The same with the caller's synopsis (NULL: the command list) and a va_list. */
int cli_vusage_error(const char *synopsis, const char *fmt, va_list ap);

/* The usage error of an option that takes one value given twice (option, first value, second
 * value): which one was meant is not for the tool to guess, so every command refuses it. */
#define CLI_GIVEN_TWICE "%s is given twice (\"%s\", then \"%s\"): give it once"

/* Prints the synopsis of `command` to stdout (the command list for "help") and returns
 * CLI_EXIT_OK (CLI_EXIT_USAGE for an unknown command). */
int cli_print_help(const char *command);

/* True for "-h" and "--help". */
bool cli_is_help(const char *arg);

/* "0 B", "512 B", "12.3 KiB", "1.5 GiB". */
void cli_format_bytes(uint64_t bytes, char *dst, size_t cap);

/* What `cinfer info` shows of one device and what `cinfer compile` needs for its default arch. */
typedef struct cli_device {
    char name[256];
    int cc_major, cc_minor;
    int num_sms;
    uint64_t memory_bytes;
    char arch[16]; /* cinfer__arch_for of the compute capability */
} cli_device_t;

/* Longest arch name + 1 ("sm_100a"). */
#define CLI_ARCH_CHARS 24

/*
 * Splits a comma list of archs ("sm_80,sm_90a") into archs[0..*count), duplicates dropped:
 * INVALID_ARGUMENT for a name not of the form sm_XY, sm_XYa or sm_XYf, an empty item or more than
 * max_archs, UNSUPPORTED for an arch older than sm_80 (cinfer__arch_check) or one the loaded
 * NVRTC cannot target (not checked when NVRTC is missing).
 */
cinfer_status_t cli_parse_archs(const char *list, char archs[][CLI_ARCH_CHARS], int max_archs,
                                int *count);

/* Queries device `ordinal` through the loaded driver table; CUDA_ERROR on a failed call. */
cinfer_status_t cli_device_query(const cinfer__cuda_t *cu, int ordinal, cli_device_t *out);

/*
 * Device ceilings (tools/ceilings.c), measured on stream with the context current:
 * cli_copy_ceiling: device-to-device copy of `bytes`, TB/s of bytes read plus written;
 * cli_gemm_ceiling: a bf16 8192^3 GEMM through cuBLASLt (opened with dlopen), TFLOP/s, and a
 * description of what was measured in source; NOT_FOUND when cuBLASLt cannot be loaded.
 */
cinfer_status_t cli_copy_ceiling(const cinfer__cuda_t *cu, CUstream stream, size_t bytes,
                                 double *tbps);
cinfer_status_t cli_gemm_ceiling(const cinfer__cuda_t *cu, CUstream stream, double *tflops,
                                 char *source, size_t source_cap);

#endif
