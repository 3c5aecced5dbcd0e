/* See include/CRefShims.h. The contract itself lives in the C references' shared header. */
#include "../../../C/ref_common.h"
#include "CRefShims.h"


static struct ref_args parsed;
static struct ref_accounting accounting;
static struct ref_stop stop;

void ref_cli_parse(int argc, char **argv, const char *const *systems, struct ref_cli *out)
{
    ref_parse_args(argc, argv, systems, &parsed);
    ref_pin(&parsed);
    out->command = parsed.command == REF_SERVE ? REF_CLI_SERVE : REF_CLI_MEASURE;
    out->system = parsed.system;
    out->address = parsed.address;
    out->cpu = parsed.cpu;
    out->server_pid = (int)parsed.server_pid;
    out->mode = parsed.mode == REF_LATENCY ? REF_CLI_LATENCY : REF_CLI_THROUGHPUT;
    out->payload = parsed.payload;
    out->warmup = parsed.warmup;
    out->count = parsed.count;
    out->corrupt = parsed.corrupt;
    if (parsed.command == REF_MEASURE) ref_accounting_add_server(&accounting, parsed.server_pid);
}

void ref_cli_exit(int status, const char *message) { ref_exit(status, "%s", message); }

char *ref_cli_path(const char *name) { return ref_path(&parsed, name); }

void ref_cli_require_socket(const char *path) { ref_require_socket(path); }

uint64_t ref_cli_now_ns(void) { return ref_now_ns(); }

static pthread_mutex_t patterns_lock = PTHREAD_MUTEX_INITIALIZER;
static struct ref_pattern *patterns[64];

const void *ref_cli_pattern(size_t payload)
{
    pthread_mutex_lock(&patterns_lock);
    struct ref_pattern *found = NULL;
    size_t i = 0;
    for (; i < sizeof patterns / sizeof patterns[0] && patterns[i]; i++)
        if (patterns[i]->payload == payload) found = patterns[i];
    if (!found) {
        found = calloc(1, sizeof *found);
        if (!found) ref_fail("out of memory");
        ref_pattern_init(found, payload);
        if (i < sizeof patterns / sizeof patterns[0]) patterns[i] = found; /* else: not cached */
    }
    pthread_mutex_unlock(&patterns_lock);
    return found;
}

const uint8_t *ref_cli_message(const void *pattern, uint64_t k) { return ref_message(pattern, k); }

int ref_cli_check(const void *pattern, uint64_t k, const void *data, size_t size)
{
    return ref_check(pattern, k, data, size);
}

void ref_cli_describe(const void *pattern, uint64_t k, const void *data, size_t size, char *out, size_t out_size)
{
    ref_describe_mismatch(out, out_size, pattern, k, data, size);
}

void ref_cli_accounting_start(void) { ref_accounting_start(&accounting); }
void ref_cli_accounting_stop(void) { ref_accounting_stop(&accounting); }
void ref_cli_print_latency(const uint64_t *samples) { ref_print_latency(&parsed, samples, &accounting); }
void ref_cli_print_throughput(uint64_t elapsed_ns) { ref_print_throughput(&parsed, elapsed_ns, &accounting); }

void ref_cli_catch_stop_signals(void) { ref_stop_init(&stop); }
void ref_cli_ready(void) { ref_ready(); }

void ref_cli_wait_for_stop(void)
{
    for (;;) {
        struct pollfd items[2] = {{stop.signal_fd, POLLIN, 0}, {STDIN_FILENO, POLLIN, 0}};
        if (poll(items, 2, -1) < 0 && errno != EINTR) return;
        if (ref_stop_check(&stop, items[0].revents, items[1].revents)) return;
    }
}

struct exit_later {
    int ms, status;
};

static void *exit_later_thread(void *argument)
{
    struct exit_later *later = argument;
    usleep((useconds_t)later->ms * 1000);
    fflush(stdout);
    _exit(later->status);
    return NULL;
}

void ref_cli_exit_later(int ms, int status)
{
    static struct exit_later later;
    later.ms = ms;
    later.status = status;
    pthread_t thread;
    if (pthread_create(&thread, NULL, exit_later_thread, &later) == 0) pthread_detach(thread);
}

void ref_cli_progress(void) { ref_progress(); }

void ref_cli_watchdog_start(void) { ref_watchdog_start(); }
