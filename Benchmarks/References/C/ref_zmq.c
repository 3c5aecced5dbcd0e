/*
 * ref-zmq: libzmq over ipc:// as a reference system of ipcbench.
 *
 *   zmq-reqrep    REQ/REP echo (latency). REQ/REP is lockstep: it has no one-way stream, so
 *                 throughput mode exits 4 and points at zmq-pushpull.
 *   zmq-pushpull  PUSH/PULL. The server's PULL is bound at DIR/zmq-pushpull.sock; each client
 *                 binds its own PULL at DIR/zmq-pushpull-<pid>.sock for the way back, which the
 *                 server connects a PUSH to. Latency: ping-pong over the two pipes. Throughput:
 *                 N messages one way, and the server pushes an acknowledgement back once it has
 *                 taken and checked the last one.
 *
 * Control messages (hello, ok, ack, bye) are two-frame messages whose first frame is "ctl"; data
 * messages are one frame holding exactly the payload. See ../README.md for the contract.
 */
#include "ref_common.h"

#include <zmq.h>

static const char *const systems[] = {"zmq-reqrep", "zmq-pushpull", NULL};

static void set_int(void *socket, int option, int value)
{
    if (zmq_setsockopt(socket, option, &value, sizeof value) != 0)
        ref_fail("zmq_setsockopt(%d): %s", option, zmq_strerror(zmq_errno()));
}

static void *new_socket(void *context, int type)
{
    void *socket = zmq_socket(context, type);
    if (!socket) ref_fail("zmq_socket: %s", zmq_strerror(zmq_errno()));
    set_int(socket, ZMQ_LINGER, 0);
    return socket;
}

/* A client socket: every blocking send or receive gives up after the contract's deadline. */
static void *new_client_socket(void *context, int type)
{
    void *socket = new_socket(context, type);
    set_int(socket, ZMQ_RCVTIMEO, REF_TIMEOUT_MS);
    set_int(socket, ZMQ_SNDTIMEO, REF_TIMEOUT_MS);
    return socket;
}

static char *endpoint_of(const char *path)
{
    char *endpoint = NULL;
    if (asprintf(&endpoint, "ipc://%s", path) < 0) ref_fail("out of memory");
    return endpoint;
}

/* Failure of a client's zmq call: a timeout (EAGAIN) or anything else. */
__attribute__((noreturn)) static void client_zmq_failure(const char *what)
{
    int error = zmq_errno();
    if (error == EAGAIN) ref_fail("%s: no progress for %d s", what, REF_TIMEOUT_MS / 1000);
    ref_fail("%s: %s", what, zmq_strerror(error));
}

static void send_control(void *socket, const char *text, int client)
{
    if (zmq_send(socket, "ctl", 3, ZMQ_SNDMORE) < 0 || zmq_send(socket, text, strlen(text), 0) < 0) {
        if (client) client_zmq_failure("sending a control message");
        fprintf(stderr, "%s: cannot send control message '%s': %s\n", ref_program, text, zmq_strerror(zmq_errno()));
    }
}

/* The corruption of serve --corrupt: one byte flipped, or one byte where none was sent. */
static void corrupt_message(zmq_msg_t *message)
{
    size_t size = zmq_msg_size(message);
    if (size > 0) {
        ((uint8_t *)zmq_msg_data(message))[size / 2] ^= 0xff;
    } else {
        zmq_msg_close(message);
        zmq_msg_init_size(message, 1);
        ((uint8_t *)zmq_msg_data(message))[0] = 0x5a;
    }
}

/* ----------------------------------------------------------------------------------------------
 * serve
 */

/* zmq_poll's revents of a plain descriptor as poll(2)'s: a pipe's end of file is POLLHUP, which
 * zmq_poll reports as ZMQ_POLLERR. */
static short poll_events(short zmq_revents)
{
    return (short)(((zmq_revents & ZMQ_POLLIN) ? POLLIN : 0) | ((zmq_revents & ZMQ_POLLERR) ? POLLERR : 0));
}

static void serve_reqrep(const struct ref_args *args, void *context, struct ref_stop *stop)
{
    char *path = ref_path(args, "zmq-reqrep.sock");
    char *endpoint = endpoint_of(path);
    unlink(path);
    void *socket = new_socket(context, ZMQ_REP);
    /* A reply to a client that has gone must not hold the server up. */
    set_int(socket, ZMQ_SNDTIMEO, 1000);
    if (zmq_bind(socket, endpoint) != 0) ref_fail("zmq_bind %s: %s", endpoint, zmq_strerror(zmq_errno()));
    ref_ready();

    for (;;) {
        zmq_pollitem_t items[3] = {
            {socket, 0, ZMQ_POLLIN, 0},
            {NULL, stop->signal_fd, ZMQ_POLLIN, 0},
            {NULL, STDIN_FILENO, ZMQ_POLLIN, 0},
        };
        if (zmq_poll(items, 3, -1) < 0) {
            if (zmq_errno() == EINTR) continue;
            ref_fail("zmq_poll: %s", zmq_strerror(zmq_errno()));
        }
        if (ref_stop_check(stop, items[1].revents, poll_events(items[2].revents))) break;
        if (!(items[0].revents & ZMQ_POLLIN)) continue;
        for (;;) {
            zmq_msg_t message;
            zmq_msg_init(&message);
            if (zmq_msg_recv(&message, socket, ZMQ_DONTWAIT) < 0) {
                zmq_msg_close(&message);
                break;
            }
            if (args->corrupt) corrupt_message(&message);
            if (zmq_msg_send(&message, socket, 0) < 0) zmq_msg_close(&message);
        }
    }
    zmq_close(socket);
    unlink(path);
    free(endpoint);
    free(path);
}

struct pushpull_session {
    int active;
    enum ref_mode mode;
    void *back;
    struct ref_pattern pattern;
    uint64_t phases[2]; /* messages in each throughput phase: warmup (if any), then timed */
    int phase, phase_count;
    uint64_t received, bad;
};

static void session_end(struct pushpull_session *session)
{
    if (session->back) zmq_close(session->back);
    session->back = NULL;
    session->active = 0;
}

static void advance_phase(struct pushpull_session *session)
{
    while (session->phase < session->phase_count && session->phases[session->phase] == 0) session->phase++;
}

static void handle_control(void *context, struct pushpull_session *session, const char *text)
{
    char mode[16], back[4352];
    unsigned long long payload, warmup, count;
    if (!strcmp(text, "bye")) {
        session_end(session);
        return;
    }
    if (sscanf(text, "hello %15s %llu %llu %llu %4300s", mode, &payload, &warmup, &count, back) != 5 ||
        payload > (unsigned long long)REF_MAX_PAYLOAD) {
        fprintf(stderr, "%s: ignoring control message '%.80s'\n", ref_program, text);
        return;
    }
    session_end(session);
    session->mode = !strcmp(mode, "throughput") ? REF_THROUGHPUT : REF_LATENCY;
    ref_pattern_init(&session->pattern, (size_t)payload);
    session->phase_count = 0;
    if (warmup) session->phases[session->phase_count++] = warmup;
    session->phases[session->phase_count++] = count;
    session->phase = 0;
    session->received = session->bad = 0;
    session->back = new_socket(context, ZMQ_PUSH);
    set_int(session->back, ZMQ_SNDTIMEO, REF_TIMEOUT_MS);
    if (zmq_connect(session->back, back) != 0) {
        fprintf(stderr, "%s: cannot connect back to %s: %s\n", ref_program, back, zmq_strerror(zmq_errno()));
        session_end(session);
        return;
    }
    session->active = 1;
    send_control(session->back, "ok", 0);
}

static void handle_data(const struct ref_args *args, struct pushpull_session *session, zmq_msg_t *message)
{
    if (!session->active) return; /* left over from a client that went away */
    if (session->mode == REF_LATENCY) {
        if (args->corrupt) corrupt_message(message);
        if (zmq_msg_send(message, session->back, 0) < 0) {
            fprintf(stderr, "%s: cannot echo: %s\n", ref_program, zmq_strerror(zmq_errno()));
            session_end(session);
        }
        return;
    }
    advance_phase(session);
    if (session->phase >= session->phase_count) {
        session->bad++; /* more messages than announced */
        return;
    }
    if (!ref_check(&session->pattern, session->received, zmq_msg_data(message), zmq_msg_size(message)))
        session->bad++;
    session->received++;
    if (session->received == session->phases[session->phase]) {
        char ack[96];
        snprintf(ack, sizeof ack, "ack %" PRIu64 " %" PRIu64, session->received, session->bad);
        send_control(session->back, ack, 0);
        session->phase++;
        session->received = session->bad = 0;
    }
}

static void serve_pushpull(const struct ref_args *args, void *context, struct ref_stop *stop)
{
    char *path = ref_path(args, "zmq-pushpull.sock");
    char *endpoint = endpoint_of(path);
    unlink(path);
    void *pull = new_socket(context, ZMQ_PULL);
    if (zmq_bind(pull, endpoint) != 0) ref_fail("zmq_bind %s: %s", endpoint, zmq_strerror(zmq_errno()));
    struct pushpull_session session = {0};
    ref_ready();

    for (;;) {
        zmq_pollitem_t items[3] = {
            {pull, 0, ZMQ_POLLIN, 0},
            {NULL, stop->signal_fd, ZMQ_POLLIN, 0},
            {NULL, STDIN_FILENO, ZMQ_POLLIN, 0},
        };
        if (zmq_poll(items, 3, -1) < 0) {
            if (zmq_errno() == EINTR) continue;
            ref_fail("zmq_poll: %s", zmq_strerror(zmq_errno()));
        }
        if (ref_stop_check(stop, items[1].revents, poll_events(items[2].revents))) break;
        if (!(items[0].revents & ZMQ_POLLIN)) continue;
        for (;;) {
            zmq_msg_t message;
            zmq_msg_init(&message);
            if (zmq_msg_recv(&message, pull, ZMQ_DONTWAIT) < 0) {
                zmq_msg_close(&message);
                break;
            }
            if (zmq_msg_more(&message)) {
                /* Control: "ctl" then the text. */
                zmq_msg_t text;
                zmq_msg_init(&text);
                if (zmq_msg_recv(&text, pull, 0) >= 0) {
                    char buffer[PATH_MAX + 128];
                    size_t size = zmq_msg_size(&text);
                    if (size >= sizeof buffer) size = sizeof buffer - 1;
                    memcpy(buffer, zmq_msg_data(&text), size);
                    buffer[size] = '\0';
                    while (zmq_msg_more(&text)) { /* drop any further frames */
                        zmq_msg_close(&text);
                        zmq_msg_init(&text);
                        if (zmq_msg_recv(&text, pull, 0) < 0) break;
                    }
                    handle_control(context, &session, buffer);
                }
                zmq_msg_close(&text);
                zmq_msg_close(&message);
                continue;
            }
            handle_data(args, &session, &message);
            zmq_msg_close(&message);
        }
    }
    session_end(&session);
    zmq_close(pull);
    unlink(path);
    free(endpoint);
    free(path);
}

/* ----------------------------------------------------------------------------------------------
 * measure
 */

/* Receives one data message into message; fails on a control message where data was due. */
static void receive_data(void *socket, zmq_msg_t *message)
{
    if (zmq_msg_recv(message, socket, 0) < 0) client_zmq_failure("waiting for the echo");
    if (zmq_msg_more(message)) ref_fail("a multi-frame message arrived where an echo was due");
}

static void check_echo(const struct ref_pattern *pattern, uint64_t k, zmq_msg_t *message)
{
    if (!ref_check(pattern, k, zmq_msg_data(message), zmq_msg_size(message))) {
        char why[160];
        ref_describe_mismatch(why, sizeof why, pattern, k, zmq_msg_data(message), zmq_msg_size(message));
        ref_fail("wrong echo: %s", why);
    }
}

/* Receives a control message's text. */
static void receive_control(void *socket, char *out, size_t out_size, const char *waiting_for)
{
    zmq_msg_t frame;
    zmq_msg_init(&frame);
    if (zmq_msg_recv(&frame, socket, 0) < 0) client_zmq_failure(waiting_for);
    if (!zmq_msg_more(&frame) || zmq_msg_size(&frame) != 3 || memcmp(zmq_msg_data(&frame), "ctl", 3))
        ref_fail("%s: a data message arrived instead", waiting_for);
    zmq_msg_close(&frame);
    zmq_msg_init(&frame);
    if (zmq_msg_recv(&frame, socket, 0) < 0) client_zmq_failure(waiting_for);
    size_t size = zmq_msg_size(&frame) < out_size - 1 ? zmq_msg_size(&frame) : out_size - 1;
    memcpy(out, zmq_msg_data(&frame), size);
    out[size] = '\0';
    zmq_msg_close(&frame);
}

static void measure_reqrep(const struct ref_args *args, void *context, struct ref_accounting *accounting)
{
    if (args->mode == REF_THROUGHPUT)
        ref_exit(REF_EXIT_UNSUPPORTED,
                 "zmq-reqrep: REQ/REP is lockstep and has no one-way stream; zmq-pushpull is ZeroMQ's throughput "
                 "reference");
    char *path = ref_path(args, "zmq-reqrep.sock");
    ref_require_socket(path);
    char *endpoint = endpoint_of(path);
    void *request = new_client_socket(context, ZMQ_REQ);
    if (zmq_connect(request, endpoint) != 0) ref_fail("zmq_connect %s: %s", endpoint, zmq_strerror(zmq_errno()));

    struct ref_pattern pattern = {0};
    ref_pattern_init(&pattern, (size_t)args->payload);
    uint64_t *samples = calloc((size_t)args->count, sizeof *samples);
    if (!samples) ref_fail("out of memory");
    long total = args->warmup + args->count;
    for (long k = 0; k < total; k++) {
        if (k == args->warmup) ref_accounting_start(accounting);
        zmq_msg_t reply;
        zmq_msg_init(&reply);
        uint64_t start = ref_now_ns();
        if (zmq_send(request, ref_message(&pattern, (uint64_t)k), (size_t)args->payload, 0) < 0)
            client_zmq_failure("sending a request");
        receive_data(request, &reply);
        uint64_t end = ref_now_ns();
        check_echo(&pattern, (uint64_t)k, &reply);
        zmq_msg_close(&reply);
        ref_progress();
        if (k >= args->warmup) samples[k - args->warmup] = ref_sample(start, end);
    }
    ref_accounting_stop(accounting);
    zmq_close(request);
    ref_print_latency(args, samples, accounting);
}

static char *client_back_path;

static void remove_client_back(void)
{
    if (client_back_path) unlink(client_back_path);
}

static void wait_for_ack(void *back, uint64_t expected)
{
    char text[128];
    unsigned long long received, bad;
    receive_control(back, text, sizeof text, "waiting for the receiver's acknowledgement");
    if (sscanf(text, "ack %llu %llu", &received, &bad) != 2) ref_fail("unexpected acknowledgement '%s'", text);
    if (bad) ref_fail("the receiver found %llu of %llu messages wrong", bad, received);
    if (received != expected) ref_fail("the receiver took %llu messages, expected %" PRIu64, received, expected);
}

static void send_stream(void *push, const struct ref_pattern *pattern, long count, int corrupt_first)
{
    uint8_t *wrong = NULL;
    for (long k = 0; k < count; k++) {
        const void *data = ref_message(pattern, (uint64_t)k);
        size_t size = pattern->payload;
        if (k == 0 && corrupt_first) {
            wrong = malloc(size + 1);
            memcpy(wrong, data, size);
            if (size) wrong[size / 2] ^= 0xff;
            else size = 1, wrong[0] = 0x5a;
            data = wrong;
        }
        if (zmq_send(push, data, size, 0) < 0) client_zmq_failure("sending a message");
        ref_progress();
    }
    free(wrong);
}

static void measure_pushpull(const struct ref_args *args, void *context, struct ref_accounting *accounting)
{
    char *path = ref_path(args, "zmq-pushpull.sock");
    ref_require_socket(path);
    char *endpoint = endpoint_of(path);
    char name[64];
    snprintf(name, sizeof name, "zmq-pushpull-%d.sock", (int)getpid());
    client_back_path = ref_path(args, name);
    char *back_endpoint = endpoint_of(client_back_path);
    atexit(remove_client_back);
    ref_on_exit = remove_client_back;

    void *back = new_client_socket(context, ZMQ_PULL);
    unlink(client_back_path);
    if (zmq_bind(back, back_endpoint) != 0)
        ref_fail("zmq_bind %s: %s", back_endpoint, zmq_strerror(zmq_errno()));
    void *push = new_client_socket(context, ZMQ_PUSH);
    if (zmq_connect(push, endpoint) != 0) ref_fail("zmq_connect %s: %s", endpoint, zmq_strerror(zmq_errno()));

    char hello[PATH_MAX + 128], text[128];
    snprintf(hello, sizeof hello, "hello %s %ld %ld %ld %s", args->mode == REF_LATENCY ? "latency" : "throughput",
             args->payload, args->mode == REF_LATENCY ? 0L : args->warmup, args->count, back_endpoint);
    send_control(push, hello, 1);
    receive_control(back, text, sizeof text, "waiting for the server's answer to hello");
    if (strcmp(text, "ok")) ref_fail("unexpected answer to hello: '%s'", text);

    struct ref_pattern pattern = {0};
    ref_pattern_init(&pattern, (size_t)args->payload);
    if (args->mode == REF_LATENCY) {
        uint64_t *samples = calloc((size_t)args->count, sizeof *samples);
        if (!samples) ref_fail("out of memory");
        long total = args->warmup + args->count;
        for (long k = 0; k < total; k++) {
            if (k == args->warmup) ref_accounting_start(accounting);
            zmq_msg_t echo;
            zmq_msg_init(&echo);
            uint64_t start = ref_now_ns();
            if (zmq_send(push, ref_message(&pattern, (uint64_t)k), (size_t)args->payload, 0) < 0)
                client_zmq_failure("sending a message");
            receive_data(back, &echo);
            uint64_t end = ref_now_ns();
            check_echo(&pattern, (uint64_t)k, &echo);
            zmq_msg_close(&echo);
            ref_progress();
            if (k >= args->warmup) samples[k - args->warmup] = ref_sample(start, end);
        }
        ref_accounting_stop(accounting);
        send_control(push, "bye", 1);
        ref_print_latency(args, samples, accounting);
    } else {
        if (args->warmup > 0) {
            send_stream(push, &pattern, args->warmup, 0);
            wait_for_ack(back, (uint64_t)args->warmup);
        }
        ref_accounting_start(accounting);
        uint64_t start = ref_now_ns();
        send_stream(push, &pattern, args->count, args->corrupt);
        wait_for_ack(back, (uint64_t)args->count);
        uint64_t end = ref_now_ns();
        ref_accounting_stop(accounting);
        send_control(push, "bye", 1);
        ref_print_throughput(args, ref_sample(start, end), accounting);
    }
    zmq_close(push);
    zmq_close(back);
}

int main(int argc, char **argv)
{
    struct ref_args args;
    ref_parse_args(argc, argv, systems, &args);
    ref_pin(&args);
    int pushpull = !strcmp(args.system, "zmq-pushpull");
    void *context = zmq_ctx_new();
    if (!context) ref_fail("zmq_ctx_new: %s", zmq_strerror(zmq_errno()));

    if (args.command == REF_SERVE) {
        struct ref_stop stop;
        ref_stop_init(&stop);
        if (pushpull)
            serve_pushpull(&args, context, &stop);
        else
            serve_reqrep(&args, context, &stop);
        zmq_ctx_term(context);
        return 0;
    }

    ref_watchdog_start();
    struct ref_accounting accounting = {0};
    ref_accounting_add_server(&accounting, args.server_pid);
    if (pushpull)
        measure_pushpull(&args, context, &accounting);
    else
        measure_reqrep(&args, context, &accounting);
    zmq_ctx_term(context);
    return 0;
}
