/*
 * CRefShims: the Swift references' way into ../../../C/ref_common.h, the one implementation of
 * the command-line contract (arguments, pinning, payload pattern, /proc accounting, JSON result,
 * stop conditions) that the C references use too. Plain C types only, for Swift to import.
 */
#pragma once
#include <stddef.h>
#include <stdint.h>

enum { REF_CLI_SERVE = 0, REF_CLI_MEASURE = 1 };
enum { REF_CLI_LATENCY = 0, REF_CLI_THROUGHPUT = 1 };

struct ref_cli {
    int command;        /* REF_CLI_SERVE or REF_CLI_MEASURE */
    const char *system;
    const char *address;
    int cpu;            /* -1: not pinned */
    int server_pid;
    int mode;           /* REF_CLI_LATENCY or REF_CLI_THROUGHPUT */
    long payload, warmup, count;
    int corrupt;
};

/* Parses the command line (exits 2 with usage on bad arguments, 0 after --help) and pins the
 * process (every thread) to --cpu. systems: NULL-terminated. */
void ref_cli_parse(int argc, char **argv, const char *const *systems, struct ref_cli *out);

/* One line on stderr and exit with status (3 failure, 4 unsupported). */
__attribute__((noreturn)) void ref_cli_exit(int status, const char *message);

/* PATH inside --address, checked to fit a Unix socket address (malloc'd). */
char *ref_cli_path(const char *name);
/* Fails (status 3) at once if PATH is not a socket. */
void ref_cli_require_socket(const char *path);

uint64_t ref_cli_now_ns(void);

/* The payload pattern of a payload size: an opaque handle, built once per size and never freed,
 * so that any thread may use it. Message k is payload bytes at ref_cli_message(pattern, k). */
const void *ref_cli_pattern(size_t payload);
const uint8_t *ref_cli_message(const void *pattern, uint64_t k);
/* 1 if data is message k of the pattern. */
int ref_cli_check(const void *pattern, uint64_t k, const void *data, size_t size);
/* Why it is not (for the failure line), into out. */
void ref_cli_describe(const void *pattern, uint64_t k, const void *data, size_t size, char *out, size_t out_size);

/* Accounting of the timed section: this process and --server-pid. */
void ref_cli_accounting_start(void);
void ref_cli_accounting_stop(void);
/* The one JSON line on stdout. */
void ref_cli_print_latency(const uint64_t *samples);
void ref_cli_print_throughput(uint64_t elapsed_ns);

/* Serving: catch SIGTERM/SIGINT/SIGHUP (a process-wide handler), print 'ready', and wait
 * (blocking the calling thread) until one of them arrives or stdin reaches end of file. */
void ref_cli_catch_stop_signals(void);
void ref_cli_ready(void);
void ref_cli_wait_for_stop(void);
/* A thread that ends the process with status after ms (a stop that hangs still ends). */
void ref_cli_exit_later(int ms, int status);

/* Measuring: a thread that fails the process (status 3) after 10 s without ref_cli_progress(). */
void ref_cli_watchdog_start(void);
void ref_cli_progress(void);
