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

/* The server's socket, bound at DIR/name. */
struct server {
    char *path, *endpoint;
    void *socket;
};

/* Binds a new socket of type at DIR/name (send_timeout_ms >= 0: with that ZMQ_SNDTIMEO), then
 * prints ready. */
static void server_listen(struct server *server, const struct ref_args *args, void *context, const char *name,
                          int type, int send_timeout_ms)
{
    server->path = ref_path(args, name);
    server->endpoint = endpoint_of(server->path);
    unlink(server->path);
    server->socket = new_socket(context, type);
    if (send_timeout_ms >= 0) set_int(server->socket, ZMQ_SNDTIMEO, send_timeout_ms);
    if (zmq_bind(server->socket, server->endpoint) != 0)
        ref_fail("zmq_bind %s: %s", server->endpoint, zmq_strerror(zmq_errno()));
    ref_ready();
}

static void server_close(struct server *server)
{
    zmq_close(server->socket);
    unlink(server->path);
    free(server->endpoint);
    free(server->path);
}

/* Serves until a stop signal or end of standard input: waits for the server's socket, and hands
 * every message that has arrived to take(state, socket, message), which owns it (sends or closes
 * it, and reads any further frames of it from socket). */
static void serve_messages(struct server *server, struct ref_stop *stop,
                           void (*take)(void *state, void *socket, zmq_msg_t *message), void *state)
{
    for (;;) {
        zmq_pollitem_t items[3] = {
            {server->socket, 0, ZMQ_POLLIN, 0},
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
            if (zmq_msg_recv(&message, server->socket, ZMQ_DONTWAIT) < 0) {
                zmq_msg_close(&message);
                break;
            }
            take(state, server->socket, &message);
        }
    }
}

/* zmq-reqrep: every request is echoed on the REP socket it came from. */
static void echo_request(void *state, void *socket, zmq_msg_t *message)
{
    const struct ref_args *args = state;
    if (args->corrupt) corrupt_message(message);
    if (zmq_msg_send(message, socket, 0) < 0) zmq_msg_close(message);
}

static void serve_reqrep(const struct ref_args *args, void *context, struct ref_stop *stop)
{
    struct server server;
    /* A reply to a client that has gone must not hold the server up. */
    server_listen(&server, args, context, "zmq-reqrep.sock", ZMQ_REP, 1000);
    serve_messages(&server, stop, echo_request, (void *)args);
    server_close(&server);
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

struct pushpull_server {
    const struct ref_args *args;
    void *context;
    struct pushpull_session session;
};

/* zmq-pushpull: a control message (the frame "ctl", then the text) or a data message. */
static void take_pushpull(void *state, void *pull, zmq_msg_t *message)
{
    struct pushpull_server *server = state;
    if (zmq_msg_more(message)) {
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
            handle_control(server->context, &server->session, buffer);
        }
        zmq_msg_close(&text);
        zmq_msg_close(message);
        return;
    }
    handle_data(server->args, &server->session, message);
    zmq_msg_close(message);
}

static void serve_pushpull(const struct ref_args *args, void *context, struct ref_stop *stop)
{
    struct server server;
    struct pushpull_server state = {args, context, {0}};
    server_listen(&server, args, context, "zmq-pushpull.sock", ZMQ_PULL, -1);
    serve_messages(&server, stop, take_pushpull, &state);
    session_end(&state.session);
    server_close(&server);
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

/* A latency round trip of both systems: message k out on one socket, its echo back on another
 * (REQ/REP: the same one). */
struct round_trip {
    const struct ref_pattern *pattern;
    void *out, *in;
    const char *sending; /* what a failure to send is called */
};

static uint64_t echo_round_trip(void *state, uint64_t k)
{
    const struct round_trip *trip = state;
    zmq_msg_t echo;
    zmq_msg_init(&echo);
    uint64_t start = ref_now_ns();
    if (zmq_send(trip->out, ref_message(trip->pattern, k), trip->pattern->payload, 0) < 0)
        client_zmq_failure(trip->sending);
    receive_data(trip->in, &echo);
    uint64_t end = ref_now_ns();
    ref_check_echo(trip->pattern, k, zmq_msg_data(&echo), zmq_msg_size(&echo));
    zmq_msg_close(&echo);
    return ref_sample(start, end);
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
    struct round_trip trip = {&pattern, request, request, "sending a request"};
    uint64_t *samples = ref_latency_round_trips(args, accounting, echo_round_trip, &trip);
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

/* One message of a one-way stream (ref_send_stream). */
static void send_message(void *push, const void *data, size_t size)
{
    if (zmq_send(push, data, size, 0) < 0) client_zmq_failure("sending a message");
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
        struct round_trip trip = {&pattern, push, back, "sending a message"};
        uint64_t *samples = ref_latency_round_trips(args, accounting, echo_round_trip, &trip);
        send_control(push, "bye", 1);
        ref_print_latency(args, samples, accounting);
    } else {
        if (args->warmup > 0) {
            ref_send_stream(&pattern, args->warmup, 0, send_message, push);
            wait_for_ack(back, (uint64_t)args->warmup);
        }
        ref_accounting_start(accounting);
        uint64_t start = ref_now_ns();
        ref_send_stream(&pattern, args->count, args->corrupt, send_message, push);
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
    } else {
        ref_watchdog_start();
        struct ref_accounting accounting = {0};
        ref_accounting_add_server(&accounting, args.server_pid);
        if (pushpull)
            measure_pushpull(&args, context, &accounting);
        else
            measure_reqrep(&args, context, &accounting);
    }
    zmq_ctx_term(context);
    return 0;
}
