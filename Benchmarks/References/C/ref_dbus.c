/*
 * ref-dbus: D-Bus method calls with sd-bus (libsystemd) as reference systems of ipcbench.
 *
 *   dbus-daemon  through a PRIVATE bus: serve starts its own dbus-daemon with a generated config
 *                whose only listen address is DIR/dbus-daemon.sock (never the system or session
 *                bus), owns org.ipcbench.Echo on it, and stops the daemon on exit.
 *   dbus-p2p     peer to peer, no daemon: serve listens on DIR/dbus-p2p.sock and runs an sd-bus
 *                server connection (sd_bus_set_server, anonymous auth allowed) on each accepted
 *                socket.
 *
 * Object /org/ipcbench/Echo, interface org.ipcbench.Echo:
 *   Echo(ay) -> ay              the latency round trip
 *   Begin(u payload, t n)       starts a one-way phase of n messages
 *   Push(ay)                    one message of the phase, sent with NO_REPLY_EXPECTED
 *   Done() -> (t taken, t bad)  answered after every Push before it (one connection keeps order),
 *                               so its reply is the receiver's acknowledgement of the last message
 * See ../README.md for the contract.
 */
#include "ref_common.h"

#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <systemd/sd-bus.h>

static const char *const systems[] = {"dbus-daemon", "dbus-p2p", NULL};

#define BUS_NAME "org.ipcbench.Echo"
#define OBJECT_PATH "/org/ipcbench/Echo"
#define INTERFACE "org.ipcbench.Echo"

static int corrupt_echoes;

/* ----------------------------------------------------------------------------------------------
 * The server object
 */

struct phase {
    struct ref_pattern pattern;
    uint64_t expected, received, bad;
    char sender[256]; /* the caller of Begin (through the daemon, clients share one connection) */
};

/* Whether message comes from the client that began the phase (always, peer to peer). */
static int from_phase_owner(const struct phase *phase, sd_bus_message *message)
{
    const char *sender = sd_bus_message_get_sender(message);
    return !sender || !strcmp(sender, phase->sender);
}

struct connection {
    sd_bus *bus;
    sd_bus_slot *slot;
    struct phase phase;
};

static int method_echo(sd_bus_message *message, void *userdata, sd_bus_error *error)
{
    (void)userdata;
    (void)error;
    const void *data = NULL;
    size_t size = 0;
    int r = sd_bus_message_read_array(message, 'y', &data, &size);
    if (r < 0) return r;
    sd_bus_message *reply = NULL;
    r = sd_bus_message_new_method_return(message, &reply);
    if (r < 0) return r;
    static const uint8_t empty[1];
    uint8_t *wrong = NULL;
    if (corrupt_echoes) data = wrong = ref_corrupted_copy(data, &size);
    r = sd_bus_message_append_array(reply, 'y', size ? data : empty, size);
    if (r >= 0) r = sd_bus_send(NULL, reply, NULL);
    sd_bus_message_unref(reply);
    free(wrong);
    return r;
}

static int method_begin(sd_bus_message *message, void *userdata, sd_bus_error *error)
{
    (void)error;
    struct connection *connection = userdata;
    uint32_t payload;
    uint64_t n;
    int r = sd_bus_message_read(message, "ut", &payload, &n);
    if (r < 0) return r;
    if (payload > REF_MAX_PAYLOAD) return sd_bus_reply_method_errorf(message, SD_BUS_ERROR_INVALID_ARGS, "payload too large");
    ref_pattern_init(&connection->phase.pattern, payload);
    connection->phase.expected = n;
    connection->phase.received = connection->phase.bad = 0;
    const char *sender = sd_bus_message_get_sender(message);
    snprintf(connection->phase.sender, sizeof connection->phase.sender, "%s", sender ? sender : "");
    return sd_bus_reply_method_return(message, "");
}

static int method_push(sd_bus_message *message, void *userdata, sd_bus_error *error)
{
    (void)error;
    struct connection *connection = userdata;
    struct phase *phase = &connection->phase;
    if (!from_phase_owner(phase, message)) return 0; /* a straggler from a client that has gone */
    const void *data = NULL;
    size_t size = 0;
    int r = sd_bus_message_read_array(message, 'y', &data, &size);
    if (r < 0 || !phase->pattern.base || phase->received >= phase->expected ||
        !ref_check(&phase->pattern, phase->received, data, size))
        phase->bad++;
    phase->received++;
    return 0; /* NO_REPLY_EXPECTED */
}

static int method_done(sd_bus_message *message, void *userdata, sd_bus_error *error)
{
    (void)error;
    struct connection *connection = userdata;
    return sd_bus_reply_method_return(message, "tt", connection->phase.received, connection->phase.bad);
}

static const sd_bus_vtable echo_vtable[] = {
    SD_BUS_VTABLE_START(0),
    SD_BUS_METHOD("Echo", "ay", "ay", method_echo, 0),
    SD_BUS_METHOD("Begin", "ut", "", method_begin, 0),
    SD_BUS_METHOD("Push", "ay", "", method_push, SD_BUS_VTABLE_METHOD_NO_REPLY),
    SD_BUS_METHOD("Done", "", "tt", method_done, 0),
    SD_BUS_VTABLE_END,
};

/* Runs sd_bus_process until it has nothing to do. Returns <0 if the connection is finished. */
static int process_all(sd_bus *bus)
{
    for (;;) {
        int r = sd_bus_process(bus, NULL);
        if (r < 0) return r;
        if (r == 0) return sd_bus_is_open(bus) > 0 ? 0 : -ENOTCONN;
    }
}

/* poll() timeout in ms for sd_bus_get_timeout's absolute CLOCK_MONOTONIC microseconds. */
static int poll_timeout(sd_bus *bus, int current)
{
    uint64_t until;
    if (sd_bus_get_timeout(bus, &until) < 0 || until == UINT64_MAX) return current;
    uint64_t now = ref_now_ns() / 1000;
    int ms = until <= now ? 0 : (int)((until - now + 999) / 1000);
    return current < 0 || ms < current ? ms : current;
}

/* ----------------------------------------------------------------------------------------------
 * serve dbus-daemon
 */

static pid_t daemon_pid = -1;
static char *daemon_socket, *daemon_config, *daemon_pidfile;

static void stop_daemon(void)
{
    if (daemon_pid > 0) {
        kill(daemon_pid, SIGTERM);
        uint64_t deadline = ref_now_ns() + 2000000000ULL;
        int status;
        while (waitpid(daemon_pid, &status, WNOHANG) == 0) {
            if (ref_now_ns() > deadline) {
                kill(daemon_pid, SIGKILL);
                waitpid(daemon_pid, &status, 0);
                break;
            }
            usleep(5000);
        }
        daemon_pid = -1;
    }
    if (daemon_socket) unlink(daemon_socket);
    if (daemon_config) unlink(daemon_config);
    if (daemon_pidfile) unlink(daemon_pidfile);
}

static void write_daemon_config(void)
{
    FILE *file = fopen(daemon_config, "w");
    if (!file) ref_fail("cannot write %s: %s", daemon_config, strerror(errno));
    /* The session bus's policy and limits (/usr/share/dbus-1/session.conf), on a private socket. */
    fprintf(file,
            "<!DOCTYPE busconfig PUBLIC \"-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN\"\n"
            " \"http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd\">\n"
            "<busconfig>\n"
            "  <keep_umask/>\n"
            "  <listen>unix:path=%s</listen>\n"
            "  <auth>EXTERNAL</auth>\n"
            "  <pidfile>%s</pidfile>\n"
            "  <policy context=\"default\">\n"
            "    <allow send_destination=\"*\" eavesdrop=\"true\"/>\n"
            "    <allow eavesdrop=\"true\"/>\n"
            "    <allow own=\"*\"/>\n"
            "  </policy>\n"
            "  <limit name=\"max_incoming_bytes\">1000000000</limit>\n"
            "  <limit name=\"max_outgoing_bytes\">1000000000</limit>\n"
            "  <limit name=\"max_message_size\">1000000000</limit>\n"
            "  <limit name=\"max_replies_per_connection\">50000</limit>\n"
            "</busconfig>\n",
            daemon_socket, daemon_pidfile);
    if (fclose(file) != 0) ref_fail("cannot write %s: %s", daemon_config, strerror(errno));
}

/* Starts dbus-daemon and returns the address it printed. */
static char *start_daemon(void)
{
    int out[2];
    if (pipe2(out, O_CLOEXEC) != 0) ref_fail("pipe: %s", strerror(errno));
    pid_t parent = getpid();
    pid_t child = fork();
    if (child < 0) ref_fail("fork: %s", strerror(errno));
    if (child == 0) {
        /* The daemon ends with its server, however the server ends. */
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (getppid() != parent) _exit(1);
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        signal(SIGPIPE, SIG_DFL); /* the stop handlers are reset by exec; SIG_IGN would not be */
        int null = open("/dev/null", O_RDONLY);
        if (null >= 0) dup2(null, STDIN_FILENO);
        dup2(out[1], STDOUT_FILENO);
        char *config_option = NULL;
        if (asprintf(&config_option, "--config-file=%s", daemon_config) < 0) _exit(127);
        execlp("dbus-daemon", "dbus-daemon", config_option, "--nofork", "--print-address", (char *)NULL);
        fprintf(stderr, "%s: cannot run dbus-daemon (Debian package dbus-daemon): %s\n", ref_program,
                strerror(errno));
        _exit(127);
    }
    daemon_pid = child;
    close(out[1]);

    char address[4096];
    size_t length = 0;
    uint64_t deadline = ref_now_ns() + REF_TIMEOUT_MS * 1000000ULL;
    for (;;) {
        struct pollfd item = {out[0], POLLIN, 0};
        uint64_t now = ref_now_ns();
        if (now >= deadline) ref_fail("dbus-daemon printed no address within %d s", REF_TIMEOUT_MS / 1000);
        int r = poll(&item, 1, (int)((deadline - now) / 1000000 + 1));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) continue;
        ssize_t n = read(out[0], address + length, sizeof address - 1 - length);
        if (n <= 0) ref_fail("dbus-daemon exited before printing its address");
        length += (size_t)n;
        address[length] = '\0';
        char *newline = strchr(address, '\n');
        if (newline) {
            *newline = '\0';
            break;
        }
        if (length == sizeof address - 1) ref_fail("dbus-daemon printed an overlong address");
    }
    close(out[0]);
    /* The daemon writes the pid file the config names, sometimes just after printing its address:
     * wait for it, since measure reads the daemon's pid from it. */
    for (;;) {
        FILE *file = fopen(daemon_pidfile, "r");
        int pid = 0;
        if (file) {
            if (fscanf(file, "%d\n", &pid) != 1) pid = 0;
            fclose(file);
        }
        if (pid == (int)daemon_pid) break;
        if (pid > 0) ref_fail("%s names pid %d, not the daemon's %d", daemon_pidfile, pid, (int)daemon_pid);
        if (waitpid(daemon_pid, NULL, WNOHANG) == daemon_pid) {
            daemon_pid = -1;
            ref_fail("dbus-daemon exited before writing %s", daemon_pidfile);
        }
        if (ref_now_ns() >= deadline) ref_fail("dbus-daemon wrote no %s within %d s", daemon_pidfile, REF_TIMEOUT_MS / 1000);
        usleep(1000);
    }
    return strdup(address);
}

static int serve_daemon(const struct ref_args *args, struct ref_stop *stop)
{
    daemon_socket = ref_path(args, "dbus-daemon.sock");
    daemon_config = ref_path(args, "dbus-daemon.conf");
    daemon_pidfile = ref_path(args, "dbus-daemon.pid");
    unlink(daemon_socket);
    unlink(daemon_pidfile);
    ref_on_exit = stop_daemon;
    write_daemon_config();
    char *address = start_daemon();

    struct connection connection = {0};
    int r = sd_bus_new(&connection.bus);
    if (r >= 0) r = sd_bus_set_address(connection.bus, address);
    if (r >= 0) r = sd_bus_set_bus_client(connection.bus, 1);
    if (r >= 0) r = sd_bus_start(connection.bus);
    if (r < 0) ref_fail("cannot connect to the private dbus-daemon at %s: %s", address, strerror(-r));
    r = sd_bus_add_object_vtable(connection.bus, &connection.slot, OBJECT_PATH, INTERFACE, echo_vtable, &connection);
    if (r < 0) ref_fail("sd_bus_add_object_vtable: %s", strerror(-r));
    r = sd_bus_request_name(connection.bus, BUS_NAME, 0);
    if (r < 0) ref_fail("cannot own %s: %s", BUS_NAME, strerror(-r));
    ref_ready();

    int status = 0;
    for (;;) {
        if (process_all(connection.bus) < 0) {
            fprintf(stderr, "%s: lost the connection to dbus-daemon\n", ref_program);
            status = REF_EXIT_FAILURE;
            break;
        }
        struct pollfd items[3] = {
            {sd_bus_get_fd(connection.bus), (short)sd_bus_get_events(connection.bus), 0},
            {stop->signal_fd, POLLIN, 0},
            {STDIN_FILENO, POLLIN, 0},
        };
        if (poll(items, 3, poll_timeout(connection.bus, -1)) < 0 && errno != EINTR)
            ref_fail("poll: %s", strerror(errno));
        if (ref_stop_check(stop, items[1].revents, items[2].revents)) break;
    }
    sd_bus_slot_unref(connection.slot);
    sd_bus_close_unref(connection.bus);
    stop_daemon();
    free(address);
    return status;
}

/* ----------------------------------------------------------------------------------------------
 * serve dbus-p2p
 */

#define MAX_CONNECTIONS 32

static char *p2p_socket;

static void remove_p2p_socket(void)
{
    if (p2p_socket) unlink(p2p_socket);
}

static void drop_connection(struct connection *connection)
{
    sd_bus_slot_unref(connection->slot);
    sd_bus_close_unref(connection->bus);
    free(connection->phase.pattern.base);
    memset(connection, 0, sizeof *connection);
}

static int accept_connection(int listener, struct connection *connection)
{
    int fd = accept4(listener, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) return -errno;
    sd_id128_t id;
    int r = sd_id128_randomize(&id);
    if (r >= 0) r = sd_bus_new(&connection->bus);
    if (r >= 0) r = sd_bus_set_fd(connection->bus, fd, fd);
    if (r >= 0) r = sd_bus_set_server(connection->bus, 1, id);
    if (r >= 0) r = sd_bus_set_anonymous(connection->bus, 1);
    if (r >= 0)
        r = sd_bus_add_object_vtable(connection->bus, &connection->slot, OBJECT_PATH, INTERFACE, echo_vtable,
                                     connection);
    if (r >= 0) r = sd_bus_start(connection->bus);
    if (r < 0) {
        if (connection->bus)
            drop_connection(connection); /* closes fd */
        else
            close(fd);
    }
    return r;
}

static int serve_p2p(const struct ref_args *args, struct ref_stop *stop)
{
    p2p_socket = ref_path(args, "dbus-p2p.sock");
    unlink(p2p_socket);
    ref_on_exit = remove_p2p_socket;
    int listener = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    struct sockaddr_un address = {.sun_family = AF_UNIX};
    snprintf(address.sun_path, sizeof address.sun_path, "%s", p2p_socket);
    if (listener < 0 || bind(listener, (struct sockaddr *)&address, sizeof address) != 0 || listen(listener, 16) != 0)
        ref_fail("cannot listen on %s: %s", p2p_socket, strerror(errno));
    struct connection *connections = calloc(MAX_CONNECTIONS, sizeof *connections);
    ref_ready();

    for (;;) {
        struct pollfd items[3 + MAX_CONNECTIONS];
        int count = 0, timeout = -1;
        items[count++] = (struct pollfd){listener, POLLIN, 0};
        items[count++] = (struct pollfd){stop->signal_fd, POLLIN, 0};
        items[count++] = (struct pollfd){STDIN_FILENO, POLLIN, 0};
        for (int i = 0; i < MAX_CONNECTIONS; i++) {
            if (!connections[i].bus) continue;
            if (process_all(connections[i].bus) < 0) {
                drop_connection(&connections[i]);
                continue;
            }
            items[count++] = (struct pollfd){sd_bus_get_fd(connections[i].bus),
                                             (short)sd_bus_get_events(connections[i].bus), 0};
            timeout = poll_timeout(connections[i].bus, timeout);
        }
        if (poll(items, (nfds_t)count, timeout) < 0 && errno != EINTR) ref_fail("poll: %s", strerror(errno));
        if (ref_stop_check(stop, items[1].revents, items[2].revents)) break;
        if (items[0].revents & POLLIN) {
            int slot = -1;
            for (int i = 0; i < MAX_CONNECTIONS && slot < 0; i++)
                if (!connections[i].bus) slot = i;
            if (slot < 0) {
                int fd = accept4(listener, NULL, NULL, SOCK_CLOEXEC);
                if (fd >= 0) close(fd); /* full: refuse */
            } else {
                int r = accept_connection(listener, &connections[slot]);
                if (r < 0 && r != -EAGAIN && r != -EINTR)
                    fprintf(stderr, "%s: cannot accept a connection: %s\n", ref_program, strerror(-r));
            }
        }
    }
    for (int i = 0; i < MAX_CONNECTIONS; i++)
        if (connections[i].bus) drop_connection(&connections[i]);
    free(connections);
    close(listener);
    remove_p2p_socket();
    return 0;
}

/* ----------------------------------------------------------------------------------------------
 * measure
 */

struct client {
    sd_bus *bus;
    const char *destination; /* NULL on a peer-to-peer connection */
};

__attribute__((noreturn)) static void call_failed(const char *what, int r, const sd_bus_error *error)
{
    if (r == -ETIMEDOUT) ref_fail("%s: no reply within %d s", what, REF_TIMEOUT_MS / 1000);
    if (error && sd_bus_error_is_set(error))
        ref_fail("%s: %s: %s", what, error->name, error->message ? error->message : "");
    ref_fail("%s: %s", what, strerror(-r));
}

static sd_bus_message *new_call(struct client *client, const char *member)
{
    sd_bus_message *message = NULL;
    int r = sd_bus_message_new_method_call(client->bus, &message, client->destination, OBJECT_PATH, INTERFACE, member);
    if (r < 0) call_failed(member, r, NULL);
    return message;
}

static sd_bus_message *call(struct client *client, sd_bus_message *message, const char *what)
{
    sd_bus_error error = SD_BUS_ERROR_NULL;
    sd_bus_message *reply = NULL;
    int r = sd_bus_call(client->bus, message, REF_TIMEOUT_US, &error, &reply);
    if (r < 0) call_failed(what, r, &error);
    sd_bus_message_unref(message);
    return reply;
}

static void append_bytes(sd_bus_message *message, const void *data, size_t size)
{
    static const uint8_t empty[1];
    int r = sd_bus_message_append_array(message, 'y', size ? data : empty, size);
    if (r < 0) ref_exit(REF_EXIT_UNSUPPORTED, "cannot append a %zu-byte array to a D-Bus message: %s", size, strerror(-r));
}

/* Writes out the queue of one-way messages before the next is added, so that a fast sender is
 * held back by the socket (and the daemon) instead of queueing every message in memory. */
static void drain_writes(sd_bus *bus)
{
    for (;;) {
        uint64_t queued = 0;
        int r = sd_bus_get_n_queued_write(bus, &queued);
        if (r < 0) ref_fail("sd_bus_get_n_queued_write: %s", strerror(-r));
        if (queued == 0) return;
        r = sd_bus_process(bus, NULL);
        if (r < 0) ref_fail("connection lost while sending: %s", strerror(-r));
        if (r > 0) continue;
        r = sd_bus_wait(bus, REF_TIMEOUT_US);
        if (r < 0) ref_fail("connection lost while sending: %s", strerror(-r));
        if (r == 0) ref_fail("sending: no progress for %d s", REF_TIMEOUT_MS / 1000);
    }
}

static void begin_phase(struct client *client, const struct ref_pattern *pattern, long count)
{
    sd_bus_message *begin = new_call(client, "Begin");
    int r = sd_bus_message_append(begin, "ut", (uint32_t)pattern->payload, (uint64_t)count);
    if (r < 0) call_failed("Begin", r, NULL);
    sd_bus_message_unref(call(client, begin, "Begin"));
}

static void finish_phase(struct client *client, long count)
{
    sd_bus_message *reply = call(client, new_call(client, "Done"), "Done");
    uint64_t taken = 0, bad = 0;
    int r = sd_bus_message_read(reply, "tt", &taken, &bad);
    if (r < 0) call_failed("reading Done's reply", r, NULL);
    sd_bus_message_unref(reply);
    if (bad) ref_fail("the receiver found %" PRIu64 " of %" PRIu64 " messages wrong", bad, taken);
    if (taken != (uint64_t)count) ref_fail("the receiver took %" PRIu64 " messages, expected %ld", taken, count);
}

/* One message of a one-way stream (ref_send_stream): a Push call. */
static void push(void *state, const void *data, size_t size)
{
    struct client *client = state;
    sd_bus_message *message = new_call(client, "Push");
    sd_bus_message_set_expect_reply(message, 0);
    append_bytes(message, data, size);
    int r = sd_bus_send(client->bus, message, NULL);
    if (r < 0) call_failed("sending Push", r, NULL);
    sd_bus_message_unref(message);
    drain_writes(client->bus);
}

/* A latency round trip: an Echo call. */
struct round_trip {
    struct client *client;
    const struct ref_pattern *pattern;
};

static uint64_t echo_round_trip(void *state, uint64_t k)
{
    const struct round_trip *trip = state;
    uint64_t start = ref_now_ns();
    sd_bus_message *message = new_call(trip->client, "Echo");
    append_bytes(message, ref_message(trip->pattern, k), trip->pattern->payload);
    sd_bus_message *reply = call(trip->client, message, "Echo");
    const void *data = NULL;
    size_t size = 0;
    int r = sd_bus_message_read_array(reply, 'y', &data, &size);
    uint64_t end = ref_now_ns();
    if (r < 0) call_failed("reading Echo's reply", r, NULL);
    ref_check_echo(trip->pattern, k, data, size);
    sd_bus_message_unref(reply);
    return ref_sample(start, end);
}

static pid_t read_daemon_pid(const char *path)
{
    FILE *file = fopen(path, "r");
    if (!file) ref_fail("cannot read the daemon's pid file %s: %s", path, strerror(errno));
    int pid = -1;
    if (fscanf(file, "%d", &pid) != 1 || pid <= 0) ref_fail("no pid in %s", path);
    fclose(file);
    return (pid_t)pid;
}

static void measure(const struct ref_args *args, int via_daemon)
{
    ref_watchdog_start();
    struct ref_accounting accounting = {0};
    ref_accounting_add_server(&accounting, args->server_pid);
    char *socket_path = ref_path(args, via_daemon ? "dbus-daemon.sock" : "dbus-p2p.sock");
    ref_require_socket(socket_path);
    if (via_daemon) ref_accounting_add_server(&accounting, read_daemon_pid(ref_path(args, "dbus-daemon.pid")));

    struct client client = {NULL, via_daemon ? BUS_NAME : NULL};
    char *address = NULL;
    if (asprintf(&address, "unix:path=%s", socket_path) < 0) ref_fail("out of memory");
    int r = sd_bus_new(&client.bus);
    if (r >= 0) r = sd_bus_set_address(client.bus, address);
    if (r >= 0 && via_daemon) r = sd_bus_set_bus_client(client.bus, 1);
    if (r >= 0) r = sd_bus_set_method_call_timeout(client.bus, REF_TIMEOUT_US);
    if (r >= 0) r = sd_bus_start(client.bus);
    if (r < 0) ref_fail("cannot connect to %s: %s", address, strerror(-r));

    struct ref_pattern pattern = {0};
    ref_pattern_init(&pattern, (size_t)args->payload);

    if (args->mode == REF_LATENCY) {
        struct round_trip trip = {&client, &pattern};
        uint64_t *samples = ref_latency_round_trips(args, &accounting, echo_round_trip, &trip);
        ref_print_latency(args, samples, &accounting);
    } else {
        if (args->warmup > 0) {
            begin_phase(&client, &pattern, args->warmup);
            ref_send_stream(&pattern, args->warmup, 0, push, &client);
            finish_phase(&client, args->warmup);
        }
        begin_phase(&client, &pattern, args->count);
        ref_accounting_start(&accounting);
        uint64_t start = ref_now_ns();
        ref_send_stream(&pattern, args->count, args->corrupt, push, &client);
        finish_phase(&client, args->count);
        uint64_t end = ref_now_ns();
        ref_accounting_stop(&accounting);
        ref_print_throughput(args, ref_sample(start, end), &accounting);
    }
    sd_bus_close_unref(client.bus);
}

int main(int argc, char **argv)
{
    struct ref_args args;
    ref_parse_args(argc, argv, systems, &args);
    ref_pin(&args);
    int via_daemon = !strcmp(args.system, "dbus-daemon");
    if (args.command == REF_SERVE) {
        corrupt_echoes = args.corrupt;
        struct ref_stop stop;
        ref_stop_init(&stop);
        return via_daemon ? serve_daemon(&args, &stop) : serve_p2p(&args, &stop);
    }
    measure(&args, via_daemon);
    return 0;
}
