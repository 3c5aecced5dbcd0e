/*
 * ref_common.h: what every C reference system of ipcbench shares. The command line, CPU pinning,
 * the payload pattern, /proc accounting of CPU time and context switches, measure's latency and
 * one-way stream loops, the serve loop's stop conditions (SIGTERM, SIGINT, end of standard input)
 * and the one-line JSON result.
 *
 * The contract these implement is written down in ../README.md; keep the two in step.
 * Header-only: each reference is one translation unit (ref_zmq.c, ref_dbus.c, ref_iceoryx.c,
 * ref_grpc_cpp.cc) that includes it. It compiles as C (gnu11) and as C++ (ref_grpc_cpp.cc): void
 * pointers are cast, and the watchdog's timestamp uses the compilers' __atomic builtins rather
 * than C11's _Atomic.
 */
#ifndef REF_COMMON_H
#define REF_COMMON_H

#ifndef _GNU_SOURCE /* g++ defines it already */
#define _GNU_SOURCE
#endif
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

/* Exit statuses of the contract. */
#define REF_EXIT_USAGE 2       /* bad arguments */
#define REF_EXIT_FAILURE 3     /* mismatch, short echo, timeout, connection failure */
#define REF_EXIT_UNSUPPORTED 4 /* the system cannot carry this payload or mode */

/* Every blocking wait gives up after this long without progress. */
#define REF_TIMEOUT_MS 10000
#define REF_TIMEOUT_US (REF_TIMEOUT_MS * 1000ULL)

/* Largest payload accepted on the command line (the harness uses at most 1 MiB). */
#define REF_MAX_PAYLOAD (64L * 1024 * 1024)

static const char *ref_program = "ref";

/* Run by ref_exit before the process ends (removes a client's own socket, stops a daemon). */
static void (*ref_on_exit)(void);

/* Set by a reference whose library cleans up in exit-time destructors (iceoryx's runtime
 * deregisters from RouDi and removes its socket in /tmp in one): ref_exit then ends the process
 * with exit(), which runs them, when it is called on the main thread. On any other thread (the
 * watchdog) it still uses _exit, since the main thread may be inside the library. */
static int ref_exit_runs_destructors;

/* ----------------------------------------------------------------------------------------------
 * Failures
 */

__attribute__((format(printf, 2, 3), noreturn)) static void ref_exit(int status, const char *format, ...)
{
    va_list arguments;
    char line[1024];
    va_start(arguments, format);
    vsnprintf(line, sizeof line, format, arguments);
    va_end(arguments);
    /* One line, whatever the message held. */
    for (char *c = line; *c; c++)
        if (*c == '\n' || *c == '\r') *c = ' ';
    fprintf(stderr, "%s: %s\n", ref_program, line);
    fflush(stderr);
    if (ref_on_exit) ref_on_exit();
    if (ref_exit_runs_destructors && gettid() == getpid()) exit(status);
    _exit(status);
}

#define ref_fail(...) ref_exit(REF_EXIT_FAILURE, __VA_ARGS__)

/* ----------------------------------------------------------------------------------------------
 * Command line
 */

enum ref_command { REF_SERVE, REF_MEASURE };
enum ref_mode { REF_LATENCY, REF_THROUGHPUT };

struct ref_args {
    enum ref_command command;
    const char *system;
    const char *address; /* a directory */
    int cpu;             /* -1: not pinned */
    pid_t server_pid;
    enum ref_mode mode;
    long payload;
    long warmup;
    long count;
    int corrupt; /* self-test only: serve echoes a wrong byte; measure sends one wrong byte */
};

static void ref_usage(FILE *out, const char *const *systems)
{
    fprintf(out,
            "usage: %s serve   --system S --address DIR [--cpu N]\n"
            "       %s measure --system S --address DIR --server-pid PID --mode latency|throughput\n"
            "                  --payload BYTES --warmup N --count N [--cpu N]\n"
            "       %s --help\n"
            "systems:",
            ref_program, ref_program, ref_program);
    for (const char *const *s = systems; *s; s++) fprintf(out, " %s", *s);
    fprintf(out,
            "\n"
            "serve prints 'ready' once clients can connect and runs until SIGTERM or end of stdin.\n"
            "measure prints one JSON line. Exit status: 0 ok, 2 bad arguments, 3 failure\n"
            "(mismatch, timeout, connection), 4 unsupported payload or mode.\n"
            "The contract is in Benchmarks/References/README.md.\n");
}

__attribute__((noreturn)) static void ref_bad_args(const char *const *systems, const char *format, ...)
{
    va_list arguments;
    fprintf(stderr, "%s: ", ref_program);
    va_start(arguments, format);
    vfprintf(stderr, format, arguments);
    va_end(arguments);
    fprintf(stderr, "\n");
    ref_usage(stderr, systems);
    exit(REF_EXIT_USAGE);
}

static long ref_parse_number(const char *const *systems, const char *option, const char *text, long max)
{
    char *end = NULL;
    errno = 0;
    long long value = strtoll(text, &end, 10);
    if (errno || end == text || *end != '\0' || !isdigit((unsigned char)text[0]) || value < 0 || value > max)
        ref_bad_args(systems, "%s: '%s' is not a whole number from 0 to %ld", option, text, max);
    return (long)value;
}

/* Every descriptor this program inherited, past standard input, output and error, is made
 * close-on-exec, so that no program it runs (serve's daemons: dbus-daemon, iox-roudi) holds one.
 * The harness starts references with Foundation's Process, which on Linux learns of a child's
 * exit when the child's end of a socket pair it inherited closes (swift-corelibs-foundation,
 * Process.run); a daemon holding that end kept the harness waiting on a serve that had been
 * SIGKILLed until the daemon ended: 45 s for RouDi, which itself waited for that unreaped serve
 * (Benchmarks/References/README.md, "Descriptors"). */
static void ref_keep_inherited_descriptors(void)
{
    DIR *directory = opendir("/proc/self/fd");
    if (!directory) return;
    struct dirent *entry;
    while ((entry = readdir(directory)) != NULL) {
        char *end;
        long fd = strtol(entry->d_name, &end, 10);
        if (*end != '\0' || end == entry->d_name || fd < 3 || fd == dirfd(directory)) continue;
        int flags = fcntl((int)fd, F_GETFD);
        if (flags >= 0 && !(flags & FD_CLOEXEC)) fcntl((int)fd, F_SETFD, flags | FD_CLOEXEC);
    }
    closedir(directory);
}

static void ref_parse_args(int argc, char **argv, const char *const *systems, struct ref_args *args)
{
    const char *slash = strrchr(argv[0], '/');
    ref_program = slash ? slash + 1 : argv[0];
    ref_keep_inherited_descriptors();
    memset(args, 0, sizeof *args);
    args->cpu = -1;
    args->server_pid = -1;
    args->payload = args->warmup = args->count = -1;
    int have_mode = 0;

    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            ref_usage(stdout, systems);
            exit(0);
        }
    if (argc < 2) ref_bad_args(systems, "missing command (serve or measure)");
    if (!strcmp(argv[1], "serve"))
        args->command = REF_SERVE;
    else if (!strcmp(argv[1], "measure"))
        args->command = REF_MEASURE;
    else
        ref_bad_args(systems, "unknown command '%s'", argv[1]);

    for (int i = 2; i < argc; i++) {
        const char *option = argv[i];
        const char *value = NULL;
        char name[64];
        const char *equals = strchr(option, '=');
        if (strncmp(option, "--", 2) != 0) ref_bad_args(systems, "unexpected argument '%s'", option);
        if (equals) {
            size_t length = (size_t)(equals - option);
            if (length >= sizeof name) ref_bad_args(systems, "unknown option '%s'", option);
            memcpy(name, option, length);
            name[length] = '\0';
            value = equals + 1;
        } else {
            snprintf(name, sizeof name, "%s", option);
        }
        if (!strcmp(name, "--corrupt")) {
            if (value) ref_bad_args(systems, "--corrupt takes no value");
            args->corrupt = 1;
            continue;
        }
        if (!value) {
            if (i + 1 >= argc) ref_bad_args(systems, "%s needs a value", name);
            value = argv[++i];
        }
        if (!strcmp(name, "--system"))
            args->system = value;
        else if (!strcmp(name, "--address"))
            args->address = value;
        else if (!strcmp(name, "--cpu"))
            args->cpu = (int)ref_parse_number(systems, name, value, CPU_SETSIZE - 1);
        else if (!strcmp(name, "--server-pid") && args->command == REF_MEASURE)
            args->server_pid = (pid_t)ref_parse_number(systems, name, value, INT_MAX);
        else if (!strcmp(name, "--mode") && args->command == REF_MEASURE) {
            if (!strcmp(value, "latency"))
                args->mode = REF_LATENCY;
            else if (!strcmp(value, "throughput"))
                args->mode = REF_THROUGHPUT;
            else
                ref_bad_args(systems, "--mode: '%s' is neither latency nor throughput", value);
            have_mode = 1;
        } else if (!strcmp(name, "--payload") && args->command == REF_MEASURE)
            args->payload = ref_parse_number(systems, name, value, REF_MAX_PAYLOAD);
        else if (!strcmp(name, "--warmup") && args->command == REF_MEASURE)
            args->warmup = ref_parse_number(systems, name, value, INT_MAX);
        else if (!strcmp(name, "--count") && args->command == REF_MEASURE)
            args->count = ref_parse_number(systems, name, value, INT_MAX);
        else
            ref_bad_args(systems, "unknown option '%s' for %s", name, argv[1]);
    }

    if (!args->system) ref_bad_args(systems, "--system is required");
    int known = 0;
    for (const char *const *s = systems; *s; s++) known |= !strcmp(*s, args->system);
    if (!known) ref_bad_args(systems, "--system: '%s' is not one of this program's systems", args->system);
    if (!args->address) ref_bad_args(systems, "--address is required");
    struct stat info;
    if (stat(args->address, &info) != 0 || !S_ISDIR(info.st_mode))
        ref_bad_args(systems, "--address: '%s' is not an existing directory", args->address);
    if (args->command == REF_MEASURE) {
        if (args->server_pid <= 0) ref_bad_args(systems, "--server-pid is required (a positive pid)");
        if (!have_mode) ref_bad_args(systems, "--mode is required");
        if (args->payload < 0) ref_bad_args(systems, "--payload is required");
        if (args->warmup < 0) ref_bad_args(systems, "--warmup is required");
        if (args->count < 1) ref_bad_args(systems, "--count is required and at least 1");
    }
}

/* A file inside --address; fails (status 3) if it would not fit a Unix socket address. */
static char *ref_path(const struct ref_args *args, const char *name)
{
    char *path = NULL;
    if (asprintf(&path, "%s/%s", args->address, name) < 0) ref_fail("out of memory");
    if (strlen(path) >= sizeof(((struct sockaddr_un *)0)->sun_path))
        ref_fail("socket path '%s' is longer than a Unix socket address allows (%zu bytes)", path,
                 sizeof(((struct sockaddr_un *)0)->sun_path) - 1);
    return path;
}

/* --cpu N: every thread of the process (a runtime may have started some before main), and so
 * every thread and child (the D-Bus daemon) started later, which inherit it. */
static void ref_pin(const struct ref_args *args)
{
    if (args->cpu < 0) return;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(args->cpu, &set);
    if (sched_setaffinity(0, sizeof set, &set) != 0) ref_fail("cannot pin to CPU %d: %s", args->cpu, strerror(errno));
    DIR *tasks = opendir("/proc/self/task");
    struct dirent *entry;
    while (tasks && (entry = readdir(tasks)))
        if (entry->d_name[0] != '.') sched_setaffinity((pid_t)atoi(entry->d_name), sizeof set, &set);
    if (tasks) closedir(tasks);
}

/* ----------------------------------------------------------------------------------------------
 * Time
 */

static inline uint64_t ref_now_ns(void)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (uint64_t)now.tv_sec * 1000000000ULL + (uint64_t)now.tv_nsec;
}

/* ----------------------------------------------------------------------------------------------
 * Watchdog of a measuring client: a thread that fails the process (status 3) once nothing has
 * called ref_progress() for the contract's 10 s. A backstop behind each library's own deadlines
 * (sd-bus's authentication, for one, waits 90 s); it wakes once a second.
 */

static uint64_t ref_last_progress_ns; /* read and written with __atomic builtins only */

static inline void ref_progress(void)
{
    __atomic_store_n(&ref_last_progress_ns, ref_now_ns(), __ATOMIC_RELAXED);
}

static void *ref_watchdog_thread(void *argument)
{
    (void)argument;
    for (;;) {
        sleep(1);
        uint64_t last = __atomic_load_n(&ref_last_progress_ns, __ATOMIC_RELAXED);
        if (ref_now_ns() - last > REF_TIMEOUT_MS * 1000000ULL)
            ref_exit(REF_EXIT_FAILURE, "no progress for %d s", REF_TIMEOUT_MS / 1000);
    }
    return NULL;
}

static void ref_watchdog_start(void)
{
    ref_progress();
    pthread_t thread;
    if (pthread_create(&thread, NULL, ref_watchdog_thread, NULL) != 0) ref_fail("cannot start the watchdog thread");
    pthread_detach(thread);
}

/* ----------------------------------------------------------------------------------------------
 * Payload pattern: byte i of message k is (i*31 + k*7 + 1) & 0xff.
 *
 * Since 31 is odd it is invertible modulo 256 (31 * 223 = 1 mod 256), so message k is the base
 * sequence b(x) = (31x + 1) & 0xff read from offset (25k) & 0xff: 31(i + 25k) + 1 = 31i + 7k + 1
 * (mod 256). Building a message is then a pointer into one buffer of payload + 256 bytes, and
 * checking one is a memcmp: neither costs more than the transport's own copy.
 */

struct ref_pattern {
    uint8_t *base;
    size_t payload;
};

static void ref_pattern_init(struct ref_pattern *pattern, size_t payload)
{
    free(pattern->base);
    pattern->payload = payload;
    pattern->base = (uint8_t *)malloc(payload + 256);
    if (!pattern->base) ref_fail("out of memory for a %zu-byte payload", payload);
    for (size_t x = 0; x < payload + 256; x++) pattern->base[x] = (uint8_t)((x * 31 + 1) & 0xff);
}

static inline const uint8_t *ref_message(const struct ref_pattern *pattern, uint64_t k)
{
    return pattern->base + ((k * 25) & 0xff);
}

static inline int ref_check(const struct ref_pattern *pattern, uint64_t k, const void *data, size_t size)
{
    return size == pattern->payload && (size == 0 || memcmp(data, ref_message(pattern, k), size) == 0);
}

/* Why a received message k is wrong, for the one-line failure message. */
static void ref_describe_mismatch(char *out, size_t out_size, const struct ref_pattern *pattern, uint64_t k,
                                  const void *data, size_t size)
{
    if (size != pattern->payload) {
        snprintf(out, out_size, "message %" PRIu64 " has %zu bytes, expected %zu", k, size, pattern->payload);
        return;
    }
    const uint8_t *expected = ref_message(pattern, k), *got = (const uint8_t *)data;
    for (size_t i = 0; i < size; i++)
        if (got[i] != expected[i]) {
            snprintf(out, out_size, "message %" PRIu64 " byte %zu is 0x%02x, expected 0x%02x", k, i, got[i],
                     expected[i]);
            return;
        }
    snprintf(out, out_size, "message %" PRIu64 " matches", k);
}

/* A client's check of echo k: fails (status 3) with why it is wrong. */
static void ref_check_echo(const struct ref_pattern *pattern, uint64_t k, const void *data, size_t size)
{
    if (!ref_check(pattern, k, data, size)) {
        char why[160];
        ref_describe_mismatch(why, sizeof why, pattern, k, data, size);
        ref_fail("wrong echo: %s", why);
    }
}

/* The self-test's wrong message (an echo of serve --corrupt, the first timed message of measure
 * --corrupt): a copy of the size bytes at data with byte size/2 flipped, or the one byte 0x5a
 * where there were none. Sets *size to the copy's size; the caller frees the copy. */
static uint8_t *ref_corrupted_copy(const void *data, size_t *size)
{
    uint8_t *copy = (uint8_t *)malloc(*size + 1);
    if (!copy) ref_fail("out of memory");
    if (*size) memcpy(copy, data, *size), copy[*size / 2] ^= 0xff;
    else copy[0] = 0x5a, *size = 1;
    return copy;
}

/* ----------------------------------------------------------------------------------------------
 * Accounting: CPU time (the process's CPU clock, clock_getcpuclockid; the sum of the first field
 * of every thread's schedstat where that clock cannot be read) and context switches (status),
 * summed over every thread of a process, as /proc/PID/schedstat and /proc/PID/status count the
 * thread group leader only.
 */

struct ref_usage {
    uint64_t cpu_ns;
    uint64_t voluntary;
    uint64_t involuntary;
};

/* pid 0: this process. Returns -1 if the process is gone. */
static int ref_read_usage(pid_t pid, struct ref_usage *usage)
{
    char directory[64];
    if (pid == 0)
        snprintf(directory, sizeof directory, "/proc/self/task");
    else
        snprintf(directory, sizeof directory, "/proc/%d/task", (int)pid);
    DIR *tasks = opendir(directory);
    if (!tasks) return -1;
    memset(usage, 0, sizeof *usage);
    struct dirent *entry;
    int threads = 0;
    while ((entry = readdir(tasks))) {
        if (entry->d_name[0] == '.') continue;
        char path[384], line[256];
        FILE *file;
        snprintf(path, sizeof path, "%s/%s/schedstat", directory, entry->d_name);
        if ((file = fopen(path, "r"))) {
            unsigned long long on_cpu = 0;
            if (fscanf(file, "%llu", &on_cpu) == 1) usage->cpu_ns += on_cpu;
            fclose(file);
        }
        snprintf(path, sizeof path, "%s/%s/status", directory, entry->d_name);
        if ((file = fopen(path, "r"))) {
            while (fgets(line, sizeof line, file)) {
                unsigned long long n;
                if (sscanf(line, "voluntary_ctxt_switches: %llu", &n) == 1) usage->voluntary += n;
                else if (sscanf(line, "nonvoluntary_ctxt_switches: %llu", &n) == 1) usage->involuntary += n;
            }
            fclose(file);
        }
        threads++;
    }
    closedir(tasks);
    if (threads == 0) return -1;
    /* CPU time from the process's CPU clock when it can be read: the same sum over its threads,
     * still counting threads that have ended, and, for this process, up to date for the thread
     * reading it. A thread's stored runtime (schedstat's field, and what another process's clock
     * sums) is brought up to date only when it leaves its CPU or at a scheduler tick; a thread
     * that spins without leaving its CPU (iceoryx-spin's server) is therefore counted to within
     * a tick (4 ms at HZ=250) at each end of a timed section. */
    clockid_t clock = CLOCK_PROCESS_CPUTIME_ID;
    struct timespec cpu;
    if ((pid == 0 || clock_getcpuclockid(pid, &clock) == 0) && clock_gettime(clock, &cpu) == 0)
        usage->cpu_ns = (uint64_t)cpu.tv_sec * 1000000000ULL + (uint64_t)cpu.tv_nsec;
    return 0;
}

/* The serving side: the server process and any helper (the D-Bus daemon). */
struct ref_accounting {
    pid_t server_pids[4];
    int server_count;
    struct ref_usage client_before, server_before, client_delta, server_delta;
};

static void ref_read_side(struct ref_accounting *accounting, struct ref_usage *client, struct ref_usage *server)
{
    if (ref_read_usage(0, client) != 0) ref_fail("cannot read /proc/self/task");
    memset(server, 0, sizeof *server);
    for (int i = 0; i < accounting->server_count; i++) {
        struct ref_usage one;
        if (ref_read_usage(accounting->server_pids[i], &one) != 0)
            ref_fail("server process %d is gone (no /proc/%d/task)", (int)accounting->server_pids[i],
                     (int)accounting->server_pids[i]);
        server->cpu_ns += one.cpu_ns;
        server->voluntary += one.voluntary;
        server->involuntary += one.involuntary;
    }
}

static void ref_accounting_add_server(struct ref_accounting *accounting, pid_t pid)
{
    if (accounting->server_count < (int)(sizeof accounting->server_pids / sizeof accounting->server_pids[0]))
        accounting->server_pids[accounting->server_count++] = pid;
}

static void ref_accounting_start(struct ref_accounting *accounting)
{
    ref_read_side(accounting, &accounting->client_before, &accounting->server_before);
}

static void ref_accounting_stop(struct ref_accounting *accounting)
{
    struct ref_usage client, server;
    ref_read_side(accounting, &client, &server);
#define REF_DELTA(after, before) ((after) >= (before) ? (after) - (before) : 0)
    accounting->client_delta.cpu_ns = REF_DELTA(client.cpu_ns, accounting->client_before.cpu_ns);
    accounting->client_delta.voluntary = REF_DELTA(client.voluntary, accounting->client_before.voluntary);
    accounting->client_delta.involuntary = REF_DELTA(client.involuntary, accounting->client_before.involuntary);
    accounting->server_delta.cpu_ns = REF_DELTA(server.cpu_ns, accounting->server_before.cpu_ns);
    accounting->server_delta.voluntary = REF_DELTA(server.voluntary, accounting->server_before.voluntary);
    accounting->server_delta.involuntary = REF_DELTA(server.involuntary, accounting->server_before.involuntary);
#undef REF_DELTA
}

/* ----------------------------------------------------------------------------------------------
 * Result: exactly one JSON line on stdout.
 */

static void ref_print_usage_fields(const struct ref_accounting *accounting)
{
    printf(",\"clientCPUNs\":%" PRIu64 ",\"serverCPUNs\":%" PRIu64 ",\"clientVoluntarySwitches\":%" PRIu64
           ",\"clientInvoluntarySwitches\":%" PRIu64 ",\"serverVoluntarySwitches\":%" PRIu64
           ",\"serverInvoluntarySwitches\":%" PRIu64 "}\n",
           accounting->client_delta.cpu_ns, accounting->server_delta.cpu_ns, accounting->client_delta.voluntary,
           accounting->client_delta.involuntary, accounting->server_delta.voluntary,
           accounting->server_delta.involuntary);
}

/* System names are checked against a fixed list, so they need no escaping. */
static void ref_print_latency(const struct ref_args *args, const uint64_t *samples,
                              const struct ref_accounting *accounting)
{
    printf("{\"mode\":\"latency\",\"system\":\"%s\",\"payload\":%ld,\"samplesNs\":[", args->system, args->payload);
    for (long i = 0; i < args->count; i++) printf(i ? ",%" PRIu64 : "%" PRIu64, samples[i]);
    printf("]");
    ref_print_usage_fields(accounting);
    fflush(stdout);
}

static void ref_print_throughput(const struct ref_args *args, uint64_t elapsed_ns,
                                 const struct ref_accounting *accounting)
{
    printf("{\"mode\":\"throughput\",\"system\":\"%s\",\"payload\":%ld,\"messages\":%ld,\"elapsedNs\":%" PRIu64,
           args->system, args->payload, args->count, elapsed_ns);
    ref_print_usage_fields(accounting);
    fflush(stdout);
}

/* A round trip too fast for the clock still counts as a positive sample. */
static inline uint64_t ref_sample(uint64_t start, uint64_t end)
{
    return end > start ? end - start : 1;
}

/* ----------------------------------------------------------------------------------------------
 * Measuring: the loops both modes run, around a system's own send and receive.
 */

/* Latency: --warmup + --count round trips one after another, numbered k = 0, 1, ... from the first
 * warmup one on, with the accounting around the timed ones. round_trip(state, k) makes round trip
 * k, times it itself (ref_now_ns just before handing message k to the library, and again once the
 * whole echo has been received), checks the echo and returns ref_sample of the two. Returns the
 * --count samples, for ref_print_latency. */
static uint64_t *ref_latency_round_trips(const struct ref_args *args, struct ref_accounting *accounting,
                                         uint64_t (*round_trip)(void *state, uint64_t k), void *state)
{
    uint64_t *samples = (uint64_t *)calloc((size_t)args->count, sizeof *samples);
    if (!samples) ref_fail("out of memory");
    long total = args->warmup + args->count;
    for (long k = 0; k < total; k++) {
        if (k == args->warmup) ref_accounting_start(accounting);
        uint64_t sample = round_trip(state, (uint64_t)k);
        ref_progress();
        if (k >= args->warmup) samples[k - args->warmup] = sample;
    }
    ref_accounting_stop(accounting);
    return samples;
}

/* Throughput: messages 0 to count - 1 of a one-way stream, each handed to send(state, data, size)
 * in turn; with corrupt_first (measure --corrupt), message 0 is ref_corrupted_copy's instead. */
static void ref_send_stream(const struct ref_pattern *pattern, long count, int corrupt_first,
                            void (*send)(void *state, const void *data, size_t size), void *state)
{
    uint8_t *wrong = NULL;
    for (long k = 0; k < count; k++) {
        const void *data = ref_message(pattern, (uint64_t)k);
        size_t size = pattern->payload;
        if (k == 0 && corrupt_first) data = wrong = ref_corrupted_copy(data, &size);
        send(state, data, size);
        ref_progress();
    }
    free(wrong);
}

/* ----------------------------------------------------------------------------------------------
 * Serving: SIGTERM, SIGINT and SIGHUP write a byte to a pipe (a handler, process-wide, so that it
 * works whatever threads a library has started), and a serve loop polls that pipe and standard
 * input, stopping at a signal or at end of file.
 */

struct ref_stop {
    int signal_fd; /* read end of the signal pipe */
};

static int ref_signal_pipe[2] = {-1, -1};

static void ref_on_stop_signal(int number)
{
    int saved = errno;
    unsigned char byte = (unsigned char)number;
    ssize_t ignored = write(ref_signal_pipe[1], &byte, 1);
    (void)ignored;
    errno = saved;
}

static void ref_stop_init(struct ref_stop *stop)
{
    if (pipe2(ref_signal_pipe, O_CLOEXEC | O_NONBLOCK) != 0) ref_fail("pipe: %s", strerror(errno));
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_handler = ref_on_stop_signal;
    action.sa_flags = SA_RESTART;
    sigemptyset(&action.sa_mask);
    sigaction(SIGTERM, &action, NULL);
    sigaction(SIGINT, &action, NULL);
    sigaction(SIGHUP, &action, NULL);
    signal(SIGPIPE, SIG_IGN);
    stop->signal_fd = ref_signal_pipe[0];
}

/* Call when either descriptor polled readable (or hung up). Returns 1 if serving should stop. */
static int ref_stop_check(struct ref_stop *stop, short signal_revents, short stdin_revents)
{
    if (signal_revents) {
        unsigned char byte;
        if (read(stop->signal_fd, &byte, 1) > 0) return 1;
    }
    if (stdin_revents & (POLLIN | POLLHUP | POLLERR | POLLNVAL)) {
        char sink[4096];
        ssize_t n = (stdin_revents & POLLNVAL) ? 0 : read(STDIN_FILENO, sink, sizeof sink);
        if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN)) return 1;
    }
    return 0;
}

static void ref_ready(void)
{
    fputs("ready\n", stdout);
    fflush(stdout);
}

/* A file that a client checks for before connecting, so that a missing server fails at once. */
static void ref_require_socket(const char *path)
{
    struct stat info;
    if (stat(path, &info) != 0) ref_fail("no server socket at %s: %s", path, strerror(errno));
    if (!S_ISSOCK(info.st_mode)) ref_fail("%s is not a socket", path);
}

#endif /* REF_COMMON_H */
