/*
 * ref-iceoryx: Eclipse iceoryx 2.0 (shared-memory, zero-copy) through its C binding, as reference
 * systems of ipcbench.
 *
 *   iceoryx       every wait blocks in an iceoryx WaitSet (iox_ws_timed_wait / iox_ws_wait)
 *   iceoryx-spin  every wait busy-polls the take calls (no WaitSet wait), on both sides
 *
 * serve starts its OWN RouDi (iox-roudi, iceoryx's broker daemon) with a generated config
 * DIR/iox-roudi.toml, writes its pid to DIR/iox-roudi.pid, registers its runtime and offers, in
 * service "ipcbench", instance S (the system's name):
 *   event "echo"     a server (request/response): each request's payload, copied into a loaned
 *                    response chunk, is the response (the latency round trip)
 *   event "control"  a server: "begin <payload> <n>" answered "ok"; "done" answered
 *                    "ack <taken> <mismatched> <lost>" once the n-th message of the stream has
 *                    been taken and checked (or at once if the subscriber lost chunks)
 *   event "stream"   a subscriber: the one-way messages, one loaned chunk each
 * Every message is a loaned chunk: the sender writes the payload into shared memory it borrowed
 * from RouDi's pool and hands over the chunk; the receiver reads it in place (zero-copy: iceoryx
 * copies nothing; the program's own writes of the payload into the chunk, and the echo's copy
 * from the request chunk into the response chunk, are the only copies).
 * Queues never drop: subscriber and request/response queues BLOCK_PRODUCER, producers
 * WAIT_FOR_CONSUMER (iceoryx 2.0 then busy-waits with sched_yield in the sender until there is
 * room), and a lost chunk is reported by the receiver all the same.
 *
 * iceoryx 2.0 allows one RouDi per machine (fixed names: /tmp/roudi, /dev/shm/iceoryx_mgmt ...):
 * serve refuses (status 3) while another one is alive, and stops its own on exit, so that
 * nothing of it is left in /tmp, /dev/shm or DIR. See ../README.md for the contract and the notes.
 */
#include "ref_common.h"

#include <stdatomic.h>

#include <grp.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/statvfs.h>
#include <sys/wait.h>

#include "iceoryx_binding_c/api.h"

static const char *const systems[] = {"iceoryx", "iceoryx-spin", NULL};

/* From ref_iceoryx_chunk.cpp: the user-payload size of a chunk received from iceoryx. */
uint32_t ref_iox_user_payload_size(const void *user_payload);

/* The largest payload: RouDi's config below has chunks for it, and no larger (status 4 above). */
#define IOX_MAX_PAYLOAD (1024L * 1024)
/* Room in each pool's chunk for iceoryx's request/response header and alignment. */
#define IOX_HEADER_ROOM 1024
/* The stream subscriber's queue: at most this many one-way messages wait for the receiver;
 * every pool has more chunks than that, so a fast sender is held back by the queue, never by an
 * empty pool. */
#define IOX_STREAM_QUEUE 64
#define IOX_REQUEST_QUEUE 8
#define IOX_RESPONSE_QUEUE 4

/* RouDi's memory pools: chunk-payload size (user header + payload + alignment) and count. With
 * the management segment RouDi always creates (about 63 MiB), about 157 MiB of shared memory. */
static const struct {
    uint32_t size, count;
} pools[] = {
    {256, 512},                                /* payloads up to 64 B, control messages */
    {4096 + IOX_HEADER_ROOM, 256},             /* up to 4 KiB */
    {65536 + IOX_HEADER_ROOM, 128},            /* up to 64 KiB */
    {IOX_MAX_PAYLOAD + IOX_HEADER_ROOM, 80},   /* up to 1 MiB */
};

/* iceoryx 2.0's fixed names (iceoryx_hoofs platform settings: "/tmp/" for sockets and locks). */
#define IOX_TMP "/tmp/"
#define ROUDI_LOCK IOX_TMP "iox-unique-roudi.lock"
#define ROUDI_SOCKET IOX_TMP "roudi"
#define ROUDI_SOCKET_LOCK IOX_TMP "roudi.lock"
#define ROUDI_MGMT_SHM "/dev/shm/iceoryx_mgmt"
/* Runtime names: an app's socket is /tmp/<runtime name> (and /tmp/<runtime name>.lock). */
#define RUNTIME_PREFIX "ipcbench-iox-"

#define SERVICE "ipcbench"

static int spinning; /* iceoryx-spin */
static int corrupt_echoes;

/* ----------------------------------------------------------------------------------------------
 * Shared helpers
 */

static const char *allocation_error(enum iox_AllocationResult r)
{
    switch (r) {
    case AllocationResult_NO_MEMPOOLS_AVAILABLE: return "no mempools available";
    case AllocationResult_RUNNING_OUT_OF_CHUNKS: return "the pool for this size has no free chunk";
    case AllocationResult_TOO_MANY_CHUNKS_ALLOCATED_IN_PARALLEL: return "too many chunks loaned at once";
    case AllocationResult_INVALID_CHUNK: return "invalid chunk";
    case AllocationResult_INVALID_PARAMETER_FOR_USER_PAYLOAD_OR_USER_HEADER: return "invalid payload size";
    case AllocationResult_INVALID_PARAMETER_FOR_CHUNK: return "invalid chunk parameter";
    case AllocationResult_INVALID_PARAMETER_FOR_REQUEST_HEADER: return "invalid request header";
    case AllocationResult_SUCCESS: return "success";
    default: return "undefined error";
    }
}

static char runtime_name[64];
static char runtime_socket[128], runtime_socket_lock[160];

static void name_runtime(const char *role)
{
    snprintf(runtime_name, sizeof runtime_name, RUNTIME_PREFIX "%s-%d", role, (int)getpid());
    snprintf(runtime_socket, sizeof runtime_socket, IOX_TMP "%s", runtime_name);
    snprintf(runtime_socket_lock, sizeof runtime_socket_lock, "%s.lock", runtime_socket);
}

/* What the runtime's destructor removes, for the exits that skip it: ref_exit on another thread
 * than the main one (the watchdog) ends with _exit; on the main thread exit() runs it. */
static void remove_runtime_socket(void)
{
    if (runtime_name[0] && gettid() != getpid()) {
        unlink(runtime_socket);
        unlink(runtime_socket_lock);
    }
}

static struct timespec timespec_from_ns(uint64_t ns)
{
    struct timespec t = {(time_t)(ns / 1000000000ULL), (long)(ns % 1000000000ULL)};
    return t;
}

/* ----------------------------------------------------------------------------------------------
 * serve: RouDi
 */

static pid_t roudi_pid = -1;
static int roudi_out = -1; /* RouDi's standard output, forwarded to ours's standard error */
static int roudi_started;  /* this serve started a RouDi (and may clean up after it) */
static char *roudi_config, *roudi_pidfile;

static void forward_roudi_output(void)
{
    char buffer[4096];
    ssize_t n;
    while (roudi_out >= 0 && (n = read(roudi_out, buffer, sizeof buffer)) > 0) {
        ssize_t ignored = write(STDERR_FILENO, buffer, (size_t)n);
        (void)ignored;
    }
}

/* The shared-memory segment RouDi names after the writer group (by default the user's group). */
static void user_segment_path(char *out, size_t size)
{
    struct group *group = getgrgid(getegid());
    snprintf(out, size, "/dev/shm/%s", group ? group->gr_name : "");
}

/* After our RouDi has ended: if it could not clean up (SIGKILL, a crash), its files are stale,
 * which the free lock proves (RouDi holds it for as long as it lives): remove them. */
static void remove_dead_roudi_files(void)
{
    int fd = open(ROUDI_LOCK, O_RDWR | O_CLOEXEC);
    if (fd < 0) return; /* RouDi's own shutdown removed it, and everything else */
    if (flock(fd, LOCK_EX | LOCK_NB) == 0) {
        char segment[300];
        user_segment_path(segment, sizeof segment);
        unlink(ROUDI_SOCKET);
        unlink(ROUDI_SOCKET_LOCK);
        unlink(ROUDI_MGMT_SHM);
        if (segment[9]) unlink(segment);
        unlink(ROUDI_LOCK);
    }
    close(fd);
}

/* Sockets of this program's runtimes whose process has gone (a client killed by a signal). */
static void remove_dead_runtime_sockets(void)
{
    DIR *tmp = opendir(IOX_TMP);
    struct dirent *entry;
    while (tmp && (entry = readdir(tmp))) {
        if (strncmp(entry->d_name, RUNTIME_PREFIX, strlen(RUNTIME_PREFIX)) != 0) continue;
        const char *dash = strrchr(entry->d_name, '-');
        if (!dash) continue;
        int pid = atoi(dash + 1);
        if (pid <= 0 || (pid != (int)getpid() && (kill(pid, 0) == 0 || errno != ESRCH))) continue;
        char path[512];
        snprintf(path, sizeof path, IOX_TMP "%s", entry->d_name);
        unlink(path);
    }
    if (tmp) closedir(tmp);
}

/* Registered with atexit BEFORE the runtime exists, so that it runs after the runtime's
 * destructor has deregistered this process from RouDi (a RouDi that still had it registered
 * would SIGTERM it and wait for it to end). SIGTERM, then SIGKILL after 2 s. */
static void stop_roudi(void)
{
    if (roudi_pid > 0) {
        kill(roudi_pid, SIGTERM);
        uint64_t deadline = ref_now_ns() + 2000000000ULL;
        int status;
        while (waitpid(roudi_pid, &status, WNOHANG) == 0) {
            forward_roudi_output();
            if (ref_now_ns() > deadline) {
                fprintf(stderr, "%s: RouDi (pid %d) did not stop within 2 s of SIGTERM: SIGKILL\n", ref_program,
                        (int)roudi_pid);
                kill(roudi_pid, SIGKILL);
                waitpid(roudi_pid, &status, 0);
                break;
            }
            usleep(5000);
        }
        forward_roudi_output();
        roudi_pid = -1;
    }
    if (roudi_started) {
        remove_dead_roudi_files();
        remove_dead_runtime_sockets();
    }
    if (roudi_config) unlink(roudi_config);
    if (roudi_pidfile) unlink(roudi_pidfile);
}

static void write_roudi_config(void)
{
    FILE *file = fopen(roudi_config, "w");
    if (!file) ref_fail("cannot write %s: %s", roudi_config, strerror(errno));
    fprintf(file, "# ref-iceoryx serve: RouDi's memory pools (one segment, the user's group)\n"
                  "[general]\nversion = 1\n\n[[segment]]\n");
    for (size_t i = 0; i < sizeof pools / sizeof pools[0]; i++)
        fprintf(file, "\n[[segment.mempool]]\nsize = %u\ncount = %u\n", pools[i].size, pools[i].count);
    if (fclose(file) != 0) ref_fail("cannot write %s: %s", roudi_config, strerror(errno));
}

/* Fails (status 3) if a RouDi is alive: it holds ROUDI_LOCK (flock) for as long as it runs. */
static void refuse_if_roudi_runs(void)
{
    int fd = open(ROUDI_LOCK, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    int held = flock(fd, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK;
    close(fd);
    if (held)
        ref_fail("a RouDi is already running on this machine (it holds %s); iceoryx 2.0 allows one per machine, "
                 "and this serve does not stop another's",
                 ROUDI_LOCK);
    /* Not held: whatever a dead RouDi left is stale, and a new RouDi purges it when it starts
     * (it unlinks /tmp/roudi and recreates the shared memory). */
}

static void start_roudi(void)
{
    refuse_if_roudi_runs();
    write_roudi_config();
    int out[2];
    if (pipe2(out, O_CLOEXEC) != 0) ref_fail("pipe: %s", strerror(errno));
    pid_t parent = getpid();
    pid_t child = fork();
    if (child < 0) ref_fail("fork: %s", strerror(errno));
    if (child == 0) {
        /* RouDi ends with its server, however the server ends. */
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (getppid() != parent) _exit(1);
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        /* Ignored across exec: should serve die first, RouDi's last lines must not kill it
         * (SIGPIPE) before it has removed its files. */
        signal(SIGPIPE, SIG_IGN);
        int null = open("/dev/null", O_RDONLY);
        if (null >= 0) dup2(null, STDIN_FILENO);
        dup2(out[1], STDOUT_FILENO);
        execlp("iox-roudi", "iox-roudi", "-c", roudi_config, "-l", "warning", (char *)NULL);
        fprintf(stderr, "%s: cannot run iox-roudi (Debian package iceoryx): %s\n", ref_program, strerror(errno));
        _exit(127);
    }
    roudi_pid = child;
    roudi_started = 1;
    close(out[1]);
    roudi_out = out[0];

    /* RouDi prints "RouDi is ready for clients" on its standard output once it listens. */
    char text[8192];
    size_t length = 0;
    uint64_t deadline = ref_now_ns() + REF_TIMEOUT_MS * 1000000ULL;
    for (;;) {
        struct pollfd item = {roudi_out, POLLIN, 0};
        uint64_t now = ref_now_ns();
        if (now >= deadline) ref_fail("iox-roudi did not say it was ready within %d s", REF_TIMEOUT_MS / 1000);
        int r = poll(&item, 1, (int)((deadline - now) / 1000000 + 1));
        if (r <= 0) continue;
        ssize_t n = read(roudi_out, text + length, sizeof text - 1 - length);
        if (n <= 0) {
            int status = 0;
            waitpid(roudi_pid, &status, 0);
            roudi_pid = -1;
            ref_fail("iox-roudi exited before it was ready (%s %d)%s",
                     WIFSIGNALED(status) ? "signal" : "status",
                     WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status),
                     WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT
                         ? ": another RouDi may have started meanwhile (iceoryx 2.0 allows one per machine)"
                         : "");
        }
        length += (size_t)n;
        text[length] = '\0';
        if (strstr(text, "RouDi is ready for clients")) break;
        if (length == sizeof text - 1) length = 0; /* only the last lines matter */
    }
    /* From now on RouDi's output goes to our standard error (forward_roudi_output). */
    fcntl(roudi_out, F_SETFL, fcntl(roudi_out, F_GETFL) | O_NONBLOCK);

    FILE *file = fopen(roudi_pidfile, "w");
    if (!file || fprintf(file, "%d\n", (int)roudi_pid) < 0 || fclose(file) != 0)
        ref_fail("cannot write %s: %s", roudi_pidfile, strerror(errno));
}

/* ----------------------------------------------------------------------------------------------
 * serve: the echo, control and stream ports
 */

struct stream_phase {
    struct ref_pattern pattern;
    uint64_t expected, taken, bad;
    int begun;
    const void *pending_done; /* a "done" request held until the n-th message is in */
};

struct server {
    iox_server_storage_t echo_storage, control_storage;
    iox_sub_storage_t stream_storage;
    iox_server_t echo, control;
    iox_sub_t stream;
    struct stream_phase phase;
};

/* Sends text as the response to request (a control request). */
static void respond_text(iox_server_t server, const void *request, const char *text)
{
    size_t size = strlen(text);
    void *response = NULL;
    enum iox_AllocationResult r = iox_server_loan_response(server, request, &response, (uint32_t)size);
    if (r != AllocationResult_SUCCESS) {
        fprintf(stderr, "%s: cannot loan a control response: %s\n", ref_program, allocation_error(r));
    } else {
        memcpy(response, text, size);
        enum iox_ServerSendResult s = iox_server_send(server, response);
        if (s != ServerSendResult_SUCCESS) fprintf(stderr, "%s: cannot send a control response (%d)\n", ref_program, (int)s);
    }
    iox_server_release_request(server, request);
}

static void answer_done(struct server *server)
{
    struct stream_phase *phase = &server->phase;
    char text[128];
    int lost = iox_sub_has_lost_chunks(server->stream) ? 1 : 0;
    snprintf(text, sizeof text, "ack %" PRIu64 " %" PRIu64 " %d", phase->taken, phase->bad, lost);
    respond_text(server->control, phase->pending_done, text);
    phase->pending_done = NULL;
    phase->begun = 0;
}

static void handle_echo(struct server *server, const void *request)
{
    size_t size = ref_iox_user_payload_size(request);
    const void *data = request;
    uint8_t *wrong = NULL;
    if (corrupt_echoes) data = wrong = ref_corrupted_copy(request, &size);
    void *response = NULL;
    enum iox_AllocationResult r = iox_server_loan_response(server->echo, request, &response, (uint32_t)size);
    if (r != AllocationResult_SUCCESS) {
        fprintf(stderr, "%s: cannot loan a %zu-byte response: %s\n", ref_program, size, allocation_error(r));
    } else {
        if (size) memcpy(response, data, size);
        enum iox_ServerSendResult s = iox_server_send(server->echo, response);
        if (s != ServerSendResult_SUCCESS) fprintf(stderr, "%s: cannot send a response (%d)\n", ref_program, (int)s);
    }
    free(wrong);
    iox_server_release_request(server->echo, request);
}

static void handle_control(struct server *server, const void *request)
{
    struct stream_phase *phase = &server->phase;
    char text[128];
    size_t size = ref_iox_user_payload_size(request);
    if (size >= sizeof text) size = sizeof text - 1;
    memcpy(text, request, size);
    text[size] = '\0';
    unsigned long payload = 0;
    unsigned long long n = 0;
    if (sscanf(text, "begin %lu %llu", &payload, &n) == 2 && payload <= (unsigned long)IOX_MAX_PAYLOAD + 1) {
        if (phase->pending_done) iox_server_release_request(server->control, phase->pending_done);
        /* A new stream: what an earlier sender left queued is not part of it. */
        iox_sub_release_queued_chunks(server->stream);
        (void)iox_sub_has_lost_chunks(server->stream); /* resets the flag */
        ref_pattern_init(&phase->pattern, payload);
        phase->expected = n;
        phase->taken = phase->bad = 0;
        phase->begun = 1;
        phase->pending_done = NULL;
        respond_text(server->control, request, "ok");
    } else if (!strcmp(text, "done")) {
        if (phase->pending_done) iox_server_release_request(server->control, phase->pending_done);
        phase->pending_done = request;
        if (!phase->begun || phase->taken >= phase->expected || iox_sub_has_lost_chunks(server->stream))
            answer_done(server);
    } else {
        respond_text(server->control, request, "error: unknown control request");
    }
}

static void handle_stream(struct server *server, const void *chunk)
{
    struct stream_phase *phase = &server->phase;
    size_t size = ref_iox_user_payload_size(chunk);
    if (!phase->begun || phase->taken >= phase->expected || !ref_check(&phase->pattern, phase->taken, chunk, size))
        phase->bad++;
    phase->taken++;
    iox_sub_release_chunk(server->stream, chunk);
    if (phase->pending_done && phase->taken >= phase->expected) answer_done(server);
}

/* Takes and handles everything waiting; returns how many it handled. */
static int serve_pending(struct server *server)
{
    int handled = 0;
    const void *item = NULL;
    enum iox_ServerRequestResult r;
    while ((r = iox_server_take_request(server->echo, &item)) == ServerRequestResult_SUCCESS)
        handle_echo(server, item), handled++;
    while ((r = iox_server_take_request(server->control, &item)) == ServerRequestResult_SUCCESS)
        handle_control(server, item), handled++;
    enum iox_ChunkReceiveResult c;
    while ((c = iox_sub_take_chunk(server->stream, &item)) == ChunkReceiveResult_SUCCESS)
        handle_stream(server, item), handled++;
    return handled;
}

/* The stop thread: waits for a stop signal, end of stdin or RouDi's end (its output pipe closes),
 * forwarding RouDi's output meanwhile; then sets `stop` and wakes the WaitSet. */
static atomic_int stop_requested, roudi_ended;
static iox_user_trigger_t stop_trigger;

static void *stop_thread(void *argument)
{
    struct ref_stop *stop = argument;
    for (;;) {
        struct pollfd items[3] = {{stop->signal_fd, POLLIN, 0}, {STDIN_FILENO, POLLIN, 0}, {roudi_out, POLLIN, 0}};
        if (poll(items, 3, -1) < 0 && errno != EINTR) break;
        if (ref_stop_check(stop, items[0].revents, items[1].revents)) break;
        if (items[2].revents) {
            char buffer[4096];
            ssize_t n = read(roudi_out, buffer, sizeof buffer);
            if (n > 0) {
                ssize_t ignored = write(STDERR_FILENO, buffer, (size_t)n);
                (void)ignored;
            } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
                atomic_store(&roudi_ended, 1);
                break;
            }
        }
    }
    atomic_store(&stop_requested, 1);
    iox_user_trigger_trigger(stop_trigger);
    return NULL;
}

/* RouDi maps its segments in /dev/shm without checking that they fit; a smaller /dev/shm (64 MiB
 * in a default Docker container) would end in SIGBUS on first touch. So serve checks first. */
#define IOX_SHM_NEEDED (160ull << 20)

static void refuse_if_shm_too_small(void)
{
    struct statvfs shm;
    if (statvfs("/dev/shm", &shm) != 0)
        ref_fail("cannot read the size of /dev/shm, where RouDi puts its shared memory: %s", strerror(errno));
    unsigned long long available = (unsigned long long)shm.f_bavail * shm.f_frsize;
    if (available < IOX_SHM_NEEDED)
        ref_fail("/dev/shm has %llu MiB free; RouDi's pools and management segment need about %llu MiB",
                 available >> 20, IOX_SHM_NEEDED >> 20);
}

static int serve(const struct ref_args *args, struct ref_stop *stop)
{
    refuse_if_shm_too_small();
    roudi_config = ref_path(args, "iox-roudi.toml");
    roudi_pidfile = ref_path(args, "iox-roudi.pid");
    ref_exit_runs_destructors = 1;
    /* Before the runtime exists, so that it runs after the runtime's destructor (see stop_roudi). */
    atexit(stop_roudi);
    start_roudi();

    name_runtime("serve");
    iox_set_loglevel(Iceoryx_LogLevel_Warn);
    iox_runtime_init(runtime_name);

    struct server server;
    memset(&server, 0, sizeof server);
    iox_server_options_t server_options;
    iox_server_options_init(&server_options);
    server_options.requestQueueCapacity = IOX_REQUEST_QUEUE;
    server_options.offerOnCreate = true;
    server_options.requestQueueFullPolicy = QueueFullPolicy_BLOCK_PRODUCER;
    server_options.clientTooSlowPolicy = ConsumerTooSlowPolicy_WAIT_FOR_CONSUMER;
    server.echo = iox_server_init(&server.echo_storage, SERVICE, args->system, "echo", &server_options);
    server.control = iox_server_init(&server.control_storage, SERVICE, args->system, "control", &server_options);
    iox_sub_options_t sub_options;
    iox_sub_options_init(&sub_options);
    sub_options.queueCapacity = IOX_STREAM_QUEUE;
    sub_options.historyRequest = 0;
    sub_options.subscribeOnCreate = true;
    sub_options.queueFullPolicy = QueueFullPolicy_BLOCK_PRODUCER;
    server.stream = iox_sub_init(&server.stream_storage, SERVICE, args->system, "stream", &sub_options);

    iox_ws_storage_t ws_storage;
    iox_ws_t ws = iox_ws_init(&ws_storage);
    iox_user_trigger_storage_t trigger_storage;
    stop_trigger = iox_user_trigger_init(&trigger_storage);
    if (iox_ws_attach_user_trigger_event(ws, stop_trigger, 0, NULL) != WaitSetResult_SUCCESS ||
        iox_ws_attach_server_state(ws, server.echo, ServerState_HAS_REQUEST, 1, NULL) != WaitSetResult_SUCCESS ||
        iox_ws_attach_server_state(ws, server.control, ServerState_HAS_REQUEST, 2, NULL) != WaitSetResult_SUCCESS ||
        iox_ws_attach_subscriber_state(ws, server.stream, SubscriberState_HAS_DATA, 3, NULL) != WaitSetResult_SUCCESS)
        ref_fail("cannot attach the ports to a WaitSet");

    pthread_t stopper;
    if (pthread_create(&stopper, NULL, stop_thread, stop) != 0) ref_fail("cannot start the stop thread");
    ref_ready();

    iox_notification_info_t infos[8];
    uint64_t missed = 0;
    while (!atomic_load_explicit(&stop_requested, memory_order_relaxed)) {
        if (spinning) {
            serve_pending(&server); /* busy-polls: no WaitSet wait */
        } else {
            serve_pending(&server);
            iox_ws_wait(ws, infos, 8, &missed);
        }
    }
    pthread_join(stopper, NULL);
    int status = 0;
    if (atomic_load(&roudi_ended)) {
        fprintf(stderr, "%s: RouDi (pid %d) ended while serving\n", ref_program, (int)roudi_pid);
        status = REF_EXIT_FAILURE;
    }
    if (server.phase.pending_done) iox_server_release_request(server.control, server.phase.pending_done);
    iox_ws_deinit(ws);
    iox_user_trigger_deinit(stop_trigger);
    iox_sub_deinit(server.stream);
    iox_server_deinit(server.control);
    iox_server_deinit(server.echo);
    free(server.phase.pattern.base);
    /* exit() runs the runtime's destructor (it deregisters from RouDi and removes its socket),
     * then stop_roudi (registered before the runtime). */
    fflush(stdout);
    exit(status);
}

/* ----------------------------------------------------------------------------------------------
 * measure
 */

struct client {
    iox_client_storage_t storage;
    iox_client_t port;
};

struct measurer {
    const struct ref_args *args;
    struct ref_pattern pattern;
    iox_ws_storage_t ws_storage;
    iox_ws_t ws;
    struct client echo, control;
    iox_pub_storage_t pub_storage;
    iox_pub_t stream;
};

static void client_init(struct measurer *m, struct client *client, const char *event, uint64_t id)
{
    iox_client_options_t options;
    iox_client_options_init(&options);
    options.responseQueueCapacity = IOX_RESPONSE_QUEUE;
    options.connectOnCreate = true;
    options.responseQueueFullPolicy = QueueFullPolicy_BLOCK_PRODUCER;
    options.serverTooSlowPolicy = ConsumerTooSlowPolicy_WAIT_FOR_CONSUMER;
    client->port = iox_client_init(&client->storage, SERVICE, m->args->system, event, &options);
    if (!spinning && iox_ws_attach_client_state(m->ws, client->port, ClientState_HAS_RESPONSE, id, NULL) != WaitSetResult_SUCCESS)
        ref_fail("cannot attach the %s client to a WaitSet", event);
    /* RouDi's discovery (every 100 ms) connects it to the server. */
    uint64_t deadline = ref_now_ns() + REF_TIMEOUT_MS * 1000000ULL;
    while (iox_client_get_connection_state(client->port) != ConnectionState_CONNECTED) {
        if (ref_now_ns() > deadline)
            ref_fail("no %s server of '%s' offered within %d s (is serve --system %s running?)", event, m->args->system,
                     REF_TIMEOUT_MS / 1000, m->args->system);
        usleep(1000);
    }
    ref_progress();
}

/* The next response of client: WaitSet waits (iceoryx) or busy-polling (iceoryx-spin), failing
 * after 10 s without one. */
static const void *take_response(struct measurer *m, struct client *client, const char *what)
{
    uint64_t deadline = ref_now_ns() + REF_TIMEOUT_MS * 1000000ULL;
    iox_notification_info_t infos[4];
    uint64_t missed = 0;
    for (uint64_t polls = 1;; polls++) {
        const void *response = NULL;
        enum iox_ChunkReceiveResult r = iox_client_take_response(client->port, &response);
        if (r == ChunkReceiveResult_SUCCESS) return response;
        if (r != ChunkReceiveResult_NO_CHUNK_AVAILABLE) ref_fail("%s: taking the response failed (%d)", what, (int)r);
        if (spinning) {
            if ((polls & 4095) == 0 && ref_now_ns() > deadline)
                ref_fail("%s: no response within %d s", what, REF_TIMEOUT_MS / 1000);
            continue;
        }
        uint64_t now = ref_now_ns();
        if (now > deadline) ref_fail("%s: no response within %d s", what, REF_TIMEOUT_MS / 1000);
        iox_ws_timed_wait(m->ws, timespec_from_ns(deadline - now), infos, 4, &missed);
    }
}

static void *loan_request(struct client *client, size_t size, const char *what)
{
    void *request = NULL;
    enum iox_AllocationResult r = iox_client_loan_request(client->port, &request, (uint32_t)size);
    if (r != AllocationResult_SUCCESS) ref_fail("%s: cannot loan a %zu-byte request chunk: %s", what, size, allocation_error(r));
    return request;
}

static void send_request(struct client *client, void *request, const char *what)
{
    enum iox_ClientSendResult r = iox_client_send(client->port, request);
    if (r != ClientSendResult_SUCCESS)
        ref_fail("%s: sending failed (%s)", what,
                 r == ClientSendResult_SERVER_NOT_AVAILABLE ? "server not available" : "iceoryx send error");
}

/* A latency round trip: loan a request chunk, write message k into it, send; the server echoes
 * it in a loaned response chunk; take it. The check comes after the sample. */
static uint64_t echo_round_trip(void *state, uint64_t k)
{
    struct measurer *m = state;
    size_t payload = m->pattern.payload;
    uint64_t start = ref_now_ns();
    void *request = loan_request(&m->echo, payload, "echo");
    if (payload) memcpy(request, ref_message(&m->pattern, k), payload);
    send_request(&m->echo, request, "echo");
    const void *response = take_response(m, &m->echo, "echo");
    uint64_t end = ref_now_ns();
    size_t size = ref_iox_user_payload_size(response);
    if (!ref_check(&m->pattern, k, response, size)) {
        char why[160];
        ref_describe_mismatch(why, sizeof why, &m->pattern, k, response, size);
        iox_client_release_response(m->echo.port, response);
        ref_fail("wrong echo: %s", why);
    }
    iox_client_release_response(m->echo.port, response);
    return ref_sample(start, end);
}

/* A control request and its text response. */
static void control_call(struct measurer *m, const char *text, char *reply, size_t reply_size)
{
    size_t size = strlen(text);
    void *request = loan_request(&m->control, size, text);
    memcpy(request, text, size);
    send_request(&m->control, request, text);
    const void *response = take_response(m, &m->control, text);
    size_t length = ref_iox_user_payload_size(response);
    if (length >= reply_size) length = reply_size - 1;
    memcpy(reply, response, length);
    reply[length] = '\0';
    iox_client_release_response(m->control.port, response);
    ref_progress();
}

/* One message of a one-way stream (ref_send_stream): a loaned chunk, the payload written into it,
 * published. A full subscriber queue holds publish back (WAIT_FOR_CONSUMER / BLOCK_PRODUCER). */
static void publish(void *state, const void *data, size_t size)
{
    struct measurer *m = state;
    void *chunk = NULL;
    enum iox_AllocationResult r = iox_pub_loan_chunk(m->stream, &chunk, (uint32_t)size);
    if (r != AllocationResult_SUCCESS) ref_fail("cannot loan a %zu-byte chunk: %s", size, allocation_error(r));
    if (size) memcpy(chunk, data, size);
    iox_pub_publish_chunk(m->stream, chunk);
}

static void stream(struct measurer *m, long count, int corrupt)
{
    char text[128], reply[128];
    snprintf(text, sizeof text, "begin %zu %ld", m->pattern.payload, count);
    control_call(m, text, reply, sizeof reply);
    if (strcmp(reply, "ok") != 0) ref_fail("the server answered '%s' to '%s'", reply, text);
    ref_send_stream(&m->pattern, count, corrupt, publish, m);
    control_call(m, "done", reply, sizeof reply);
    unsigned long long taken = 0, bad = 0;
    int lost = 0;
    if (sscanf(reply, "ack %llu %llu %d", &taken, &bad, &lost) != 3) ref_fail("the server answered '%s' to 'done'", reply);
    if (lost) ref_fail("the receiver's queue lost messages (took %llu of %ld)", taken, count);
    if (bad) ref_fail("the receiver found %llu of %llu messages wrong", bad, taken);
    if (taken != (unsigned long long)count) ref_fail("the receiver took %llu messages, expected %ld", taken, count);
}

static pid_t read_roudi_pid(const struct ref_args *args)
{
    char *path = ref_path(args, "iox-roudi.pid");
    FILE *file = fopen(path, "r");
    if (!file) ref_fail("no server: cannot read RouDi's pid file %s: %s", path, strerror(errno));
    int pid = -1;
    if (fscanf(file, "%d", &pid) != 1 || pid <= 0) ref_fail("no pid in %s", path);
    fclose(file);
    if (kill(pid, 0) != 0 && errno == ESRCH) ref_fail("no server: RouDi (pid %d, from %s) is gone", pid, path);
    free(path);
    return (pid_t)pid;
}

static void measure(const struct ref_args *args)
{
    if (args->payload > IOX_MAX_PAYLOAD)
        ref_exit(REF_EXIT_UNSUPPORTED,
                 "a %ld-byte payload is above %ld bytes, the largest chunk of the RouDi config serve writes "
                 "(DIR/iox-roudi.toml)",
                 args->payload, IOX_MAX_PAYLOAD);
    struct ref_accounting accounting = {0};
    ref_accounting_add_server(&accounting, args->server_pid);
    ref_accounting_add_server(&accounting, read_roudi_pid(args));
    struct stat info;
    if (stat(ROUDI_SOCKET, &info) != 0 || !S_ISSOCK(info.st_mode))
        ref_fail("no server: RouDi's socket %s is missing", ROUDI_SOCKET);

    ref_watchdog_start();
    name_runtime("measure");
    /* A watchdog exit (_exit) skips the runtime's destructor: remove its socket here instead. */
    ref_on_exit = remove_runtime_socket;
    ref_exit_runs_destructors = 1;
    iox_set_loglevel(Iceoryx_LogLevel_Fatal);
    iox_runtime_init(runtime_name);
    ref_progress();

    struct measurer m;
    memset(&m, 0, sizeof m);
    m.args = args;
    ref_pattern_init(&m.pattern, (size_t)args->payload);
    m.ws = iox_ws_init(&m.ws_storage);

    if (args->mode == REF_LATENCY) {
        client_init(&m, &m.echo, "echo", 1);
        uint64_t *samples = ref_latency_round_trips(args, &accounting, echo_round_trip, &m);
        ref_print_latency(args, samples, &accounting);
        free(samples);
        if (!spinning) iox_ws_detach_client_state(m.ws, m.echo.port, ClientState_HAS_RESPONSE);
        iox_client_deinit(m.echo.port);
    } else {
        client_init(&m, &m.control, "control", 2);
        iox_pub_options_t options;
        iox_pub_options_init(&options);
        options.historyCapacity = 0;
        options.offerOnCreate = true;
        options.subscriberTooSlowPolicy = ConsumerTooSlowPolicy_WAIT_FOR_CONSUMER;
        m.stream = iox_pub_init(&m.pub_storage, SERVICE, args->system, "stream", &options);
        /* A chunk published before the server's subscriber is connected would reach no one. */
        uint64_t deadline = ref_now_ns() + REF_TIMEOUT_MS * 1000000ULL;
        while (!iox_pub_has_subscribers(m.stream)) {
            if (ref_now_ns() > deadline) ref_fail("the server's stream subscriber did not connect within %d s", REF_TIMEOUT_MS / 1000);
            usleep(1000);
        }
        ref_progress();
        if (args->warmup > 0) stream(&m, args->warmup, 0);
        ref_accounting_start(&accounting);
        uint64_t start = ref_now_ns();
        stream(&m, args->count, args->corrupt);
        uint64_t end = ref_now_ns();
        ref_accounting_stop(&accounting);
        ref_print_throughput(args, ref_sample(start, end), &accounting);
        iox_pub_deinit(m.stream);
        if (!spinning) iox_ws_detach_client_state(m.ws, m.control.port, ClientState_HAS_RESPONSE);
        iox_client_deinit(m.control.port);
    }
    iox_ws_deinit(m.ws);
    free(m.pattern.base);
}

int main(int argc, char **argv)
{
    struct ref_args args;
    ref_parse_args(argc, argv, systems, &args);
    ref_pin(&args);
    spinning = !strcmp(args.system, "iceoryx-spin");
    if (args.command == REF_SERVE) {
        corrupt_echoes = args.corrupt;
        struct ref_stop stop;
        ref_stop_init(&stop);
        return serve(&args, &stop);
    }
    measure(&args);
    return 0; /* the runtime's destructor deregisters from RouDi and removes its socket */
}
