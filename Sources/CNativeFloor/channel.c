#define _GNU_SOURCE
#include "floor_internal.h"

#include <time.h>

#include <linux/futex.h>
#include <mqueue.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

static const struct nf_operations *operations_for(nf_mechanism mechanism) {
    switch (mechanism) {
    case NF_UNIX_STREAM: return &nf_unix_stream_operations;
    case NF_MQUEUE: return &nf_mqueue_operations;
    case NF_FUTEX: return &nf_futex_operations;
    case NF_INOTIFY: return &nf_inotify_operations;
    case NF_PIPE: return &nf_pipe_operations;
    case NF_UNIX_STREAM_EPOLL: return &nf_unix_stream_operations;
    case NF_MQUEUE_EPOLL: return &nf_mqueue_operations;
    case NF_EVENTFD_EPOLL: return &nf_eventfd_operations;
    case NF_UNIX_STREAM_SPIN: return &nf_unix_stream_operations;
    case NF_MQUEUE_SPIN: return &nf_mqueue_operations;
    case NF_SHM_SPIN: return &nf_shm_spin_operations;
    case NF_JOURNAL: return &nf_journal_operations;
    case NF_UNIX_STREAM_EPOLL_HANDOFF: return &nf_unix_stream_operations;
    case NF_UNIX_STREAM_IO_URING: return &nf_unix_stream_operations;
    case NF_EVENTFD_IO_URING: return &nf_eventfd_operations;
    case NF_MQUEUE_POLL: return &nf_mqueue_operations;
    case NF_EVENTFD_EPOLL_HANDOFF: return &nf_eventfd_operations;
    case NF_MQUEUE_EPOLL_HANDOFF: return &nf_mqueue_operations;
    case NF_SHM_SPIN_HANDOFF: return &nf_shm_spin_operations;
    case NF_UNIX_STREAM_SPIN_HANDOFF: return &nf_unix_stream_operations;
    case NF_MQUEUE_SPIN_HANDOFF: return &nf_mqueue_operations;
    case NF_JOURNAL_HANDOFF: return &nf_journal_operations;
    }
    return NULL;
}

/// Whether every wait for a stream or queue message polls without blocking first.
static bool waits_by_polling(nf_mechanism mechanism) {
    return mechanism == NF_UNIX_STREAM_SPIN || mechanism == NF_MQUEUE_SPIN || mechanism == NF_UNIX_STREAM_SPIN_HANDOFF
        || mechanism == NF_MQUEUE_SPIN_HANDOFF;
}

bool nf_liveness_due(uint64_t *last) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    if ((uint64_t)now.tv_sec < *last + NF_LIVENESS_PERIOD_SECONDS) return false;
    *last = (uint64_t)now.tv_sec;
    return true;
}

uint64_t nf_monotonic_nanoseconds(void) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (uint64_t)now.tv_sec * 1000000000u + (uint64_t)now.tv_nsec;
}

bool nf_still_spinning(uint32_t *polls, uint64_t *end) {
    if ((*polls)++ % NF_SPIN_CLOCK_EVERY != 0) return true;
    uint64_t now = nf_monotonic_nanoseconds();
    if (*end == 0) *end = now + NF_SPIN_LIMIT_NANOSECONDS;
    return now < *end;
}

/// Waits in poll(2) until `fd` is readable (or hung up); the initiator checks every
/// NF_LIVENESS_PERIOD_SECONDS that the responder is alive.
static int poll_until_readable(nf_channel *channel, int fd) {
    for (;;) {
        struct pollfd entry = {.fd = fd, .events = POLLIN};
        int count = ipc_sys_poll(&entry, 1, channel->responder ? -1 : NF_LIVENESS_PERIOD_SECONDS * 1000);
        if (count > 0) return 0;
        if (count < 0 && errno != EINTR) return -1;
        if (count == 0 && !channel->responder && !nf_process_alive(channel->responder_pid)) {
            errno = ECONNRESET;
            return -1;
        }
    }
}

/// The spinning stream and queue floors: poll by receiving. Each round tries the receive
/// itself without waiting for a first byte (recvmsg with MSG_DONTWAIT; mq_timedreceive with a
/// deadline in the past), so that a message costs one call when it comes, as in the engine's
/// spinning loop; a poll(2) with a zero timeout, then the receive, costs a call more, and made a
/// round trip 7-17 % slower on this repository's VM (Reports/spinning-floors). After
/// NF_SPIN_LIMIT_NANOSECONDS the wait goes on in poll(2), without the CPU.
static int receive_spinning(nf_channel *channel, const struct nf_operations *operations, uint32_t *length, void *payload, size_t capacity) {
    uint32_t polls = 0;
    uint64_t end = 0;
    channel->receive_now = true;
    int status;
    bool nothing_yet;
    for (;;) {
        status = operations->receive(channel, length, payload, capacity);
        nothing_yet = status != 0 && errno == EAGAIN;
        if (!nothing_yet) break;
        nf_cpu_relax();
        if (!nf_still_spinning(&polls, &end)) break;
    }
    channel->receive_now = false;
    if (!nothing_yet) return status;
    if (poll_until_readable(channel, channel->in_fd) != 0) return -1;
    return operations->receive(channel, length, payload, capacity);
}

/// Whether every wait for a stream or queue message goes through epoll first (eventfd+epoll's
/// waits are in its receive: the doorbell, not the message, is what epoll watches).
static bool waits_through_epoll(nf_mechanism mechanism) {
    return mechanism == NF_UNIX_STREAM_EPOLL || mechanism == NF_MQUEUE_EPOLL || mechanism == NF_UNIX_STREAM_EPOLL_HANDOFF
        || mechanism == NF_MQUEUE_EPOLL_HANDOFF;
}

/// Whether the responder hands each request to a worker thread that sends the echo
/// (serve_handing_off).
static bool hands_off(nf_mechanism mechanism) {
    switch (mechanism) {
    case NF_UNIX_STREAM_EPOLL_HANDOFF: case NF_EVENTFD_EPOLL_HANDOFF: case NF_MQUEUE_EPOLL_HANDOFF:
    case NF_SHM_SPIN_HANDOFF: case NF_UNIX_STREAM_SPIN_HANDOFF: case NF_MQUEUE_SPIN_HANDOFF: case NF_JOURNAL_HANDOFF:
        return true;
    default:
        return false;
    }
}

/// Whether the channel is a pair of POSIX message queues (its names are queue names).
static bool uses_queues(nf_mechanism mechanism) {
    return operations_for(mechanism) == &nf_mqueue_operations;
}

/// The epoll instance every wait goes through, watching `fd` for input: made at the first wait.
static int epoll_watching(nf_channel *channel, int fd, bool edge) {
    if (channel->epoll_fd >= 0) return 0;
    channel->epoll_fd = epoll_create1(EPOLL_CLOEXEC);
    if (channel->epoll_fd < 0) return -1;
    struct epoll_event event = {.events = EPOLLIN | (edge ? EPOLLET : 0), .data = {.fd = fd}};
    if (epoll_ctl(channel->epoll_fd, EPOLL_CTL_ADD, fd, &event) != 0) {
        nf_close_fd(&channel->epoll_fd);
        return -1;
    }
    return 0;
}

/// One epoll_wait that returns an event (the initiator checks every NF_LIVENESS_PERIOD_SECONDS
/// that the responder is alive): its events.
static int epoll_wait_once(nf_channel *channel, uint32_t *events) {
    for (;;) {
        struct epoll_event event;
        int count = NF_RETRY(ipc_sys_epoll_wait(channel->epoll_fd, &event, 1, channel->responder ? -1 : NF_LIVENESS_PERIOD_SECONDS * 1000));
        if (count > 0) {
            *events = event.events;
            return 0;
        }
        if (count < 0) return -1;
        if (!nf_process_alive(channel->responder_pid)) {
            errno = ECONNRESET;
            return -1;
        }
    }
}

int nf_epoll_wait_readable(nf_channel *channel, int fd, bool edge) {
    uint32_t events;
    if (epoll_watching(channel, fd, edge) != 0) return -1;
    return epoll_wait_once(channel, &events);
}

int nf_epoll_wait_writable(nf_channel *channel, int fd) {
    if (epoll_watching(channel, fd, false) != 0) return -1;
    struct epoll_event interest = {.events = EPOLLIN | EPOLLOUT, .data = {.fd = fd}};
    if (epoll_ctl(channel->epoll_fd, EPOLL_CTL_MOD, fd, &interest) != 0) return -1;
    uint32_t events = 0;
    int status = 0;
    // Input alone (the other end's acknowledgement, read later) is not what this waits for; an
    // error or hang-up is, and the next write reports it.
    while (status == 0 && (events & (EPOLLOUT | EPOLLERR | EPOLLHUP)) == 0) status = epoll_wait_once(channel, &events);
    int saved = errno;
    interest.events = EPOLLIN;
    if (epoll_ctl(channel->epoll_fd, EPOLL_CTL_MOD, fd, &interest) != 0 && status == 0) return -1;
    errno = saved;
    return status;
}

/// Receives one message; for the epoll variants of the stream and queue, after epoll says the
/// descriptor is readable (one epoll_wait and one read per message, as an event loop does).
static int receive_message(nf_channel *channel, const struct nf_operations *operations, uint32_t *length, void *payload, size_t capacity) {
    if (waits_through_epoll(channel->mechanism) && nf_epoll_wait_readable(channel, channel->in_fd, false) != 0) return -1;
    if (waits_by_polling(channel->mechanism)) return receive_spinning(channel, operations, length, payload, capacity);
    if (channel->mechanism == NF_MQUEUE_POLL && poll_until_readable(channel, channel->in_fd) != 0) return -1;
    return operations->receive(channel, length, payload, capacity);
}

const char *nf_mechanism_name(nf_mechanism mechanism) {
    switch (mechanism) {
    case NF_UNIX_STREAM: return "unix-stream";
    case NF_MQUEUE: return "mqueue";
    case NF_FUTEX: return "futex";
    case NF_INOTIFY: return "inotify";
    case NF_PIPE: return "pipe";
    case NF_UNIX_STREAM_EPOLL: return "unix-stream+epoll";
    case NF_MQUEUE_EPOLL: return "mqueue+epoll";
    case NF_EVENTFD_EPOLL: return "eventfd+epoll";
    case NF_UNIX_STREAM_SPIN: return "unix-stream+spin";
    case NF_MQUEUE_SPIN: return "mqueue+spin";
    case NF_SHM_SPIN: return "shm+spin";
    case NF_JOURNAL: return "journal";
    case NF_UNIX_STREAM_EPOLL_HANDOFF: return "unix-stream+epoll+handoff";
    case NF_UNIX_STREAM_IO_URING: return "unix-stream+io_uring";
    case NF_EVENTFD_IO_URING: return "eventfd+io_uring";
    case NF_MQUEUE_POLL: return "mqueue+poll";
    case NF_EVENTFD_EPOLL_HANDOFF: return "eventfd+epoll+handoff";
    case NF_MQUEUE_EPOLL_HANDOFF: return "mqueue+epoll+handoff";
    case NF_SHM_SPIN_HANDOFF: return "shm+spin+handoff";
    case NF_UNIX_STREAM_SPIN_HANDOFF: return "unix-stream+spin+handoff";
    case NF_MQUEUE_SPIN_HANDOFF: return "mqueue+spin+handoff";
    case NF_JOURNAL_HANDOFF: return "journal+handoff";
    }
    return NULL;
}

static nf_channel *channel_new(nf_mechanism mechanism, const char *directory, size_t max_payload, pid_t responder_pid, bool responder) {
    if (operations_for(mechanism) == NULL || max_payload >= NF_STREAM || responder_pid <= 0) {
        errno = EINVAL;
        return NULL;
    }
    nf_channel *channel = calloc(1, sizeof(*channel));
    if (channel == NULL) return NULL;
    channel->mechanism = mechanism;
    channel->responder = responder;
    channel->max_payload = max_payload;
    channel->responder_pid = responder_pid;
    channel->in_fd = channel->out_fd = channel->listen_fd = channel->file_fd = channel->alive_fd = -1;
    channel->alive_watch = -1;
    channel->epoll_fd = channel->ring_fd = channel->bell_fd = -1;
    if (snprintf(channel->directory, sizeof(channel->directory), "%s", directory) >= (int)sizeof(channel->directory)) {
        free(channel);
        errno = ENAMETOOLONG;
        return NULL;
    }
    return channel;
}

/// Runs the create or open step; on failure releases the channel and keeps the step's errno.
static nf_channel *establish(nf_channel *channel, int (*step)(nf_channel *)) {
    if (channel == NULL) return NULL;
    if (step(channel) != 0) {
        int error = errno;
        nf_close(channel);
        errno = error;
        return NULL;
    }
    channel->established = true;
    return channel;
}

nf_channel *nf_responder_create(nf_mechanism mechanism, const char *directory, size_t max_payload) {
    nf_channel *channel = channel_new(mechanism, directory, max_payload, getpid(), true);
    if (channel == NULL) return NULL;
    // One byte at least, so that a zero-byte floor still has a buffer to point at.
    channel->buffer = malloc(max_payload > 0 ? max_payload : 1);
    if (channel->buffer == NULL) {
        free(channel);
        return NULL;
    }
    return establish(channel, operations_for(mechanism)->create);
}

nf_channel *nf_initiator_open(nf_mechanism mechanism, const char *directory, size_t max_payload, pid_t responder) {
    nf_channel *channel = channel_new(mechanism, directory, max_payload, responder, false);
    if (channel == NULL) return NULL;
    return establish(channel, operations_for(mechanism)->open);
}

/// Responder: the rest of a stream after its NF_STREAM header: an empty acknowledgement (a
/// stream's reader may have read ahead only as far as the header), the stream's parameters, its
/// messages, then an empty acknowledgement again.
static int sink_stream(nf_channel *channel, const struct nf_operations *operations) {
    uint32_t parameters[2];
    uint32_t length;
    if (operations->send(channel, 0, NULL) != 0) return -1;
    if (receive_message(channel, operations, &length, parameters, sizeof(parameters)) != 0) return -1;
    if (length != sizeof(parameters) || parameters[1] > channel->max_payload) {
        errno = EPROTO;
        return -1;
    }
    size_t count = parameters[0], payload = parameters[1];
    if (operations->sink != NULL) {
        if (operations->sink(channel, count, payload) != 0) return -1;
    } else {
        for (size_t index = 0; index < count; index++) {
            if (receive_message(channel, operations, &length, channel->buffer, channel->max_payload) != 0) return -1;
            if (length != payload) {
                errno = EPROTO;
                return -1;
            }
        }
    }
    return operations->send(channel, 0, NULL);
}

/// The hand-off floors (unix-stream, eventfd and mqueue +epoll+handoff; shm, unix-stream and
/// mqueue +spin+handoff, whose loop thread polls where the others' wait; journal+handoff, whose
/// loop thread sleeps in inotify as the journal floor's does): the worker thread that
/// sends the echoes, and what the loop thread hands it. One request is outstanding at a time
/// (the initiator waits for each echo). The loop thread calls its receive again as soon as it
/// has handed a request over, while the worker sends the echo; that receive waits in the kernel
/// for the initiator's next request, which comes only once the echo has arrived whole. What a
/// mechanism's send and receive both use (the channel's buffer, the message-queue floors'
/// scratch) the receive writes only once that request is there, after the worker's send is done
/// with it; the rest they keep apart (each its own descriptor, lock, mapped page and sequence
/// number: journal+handoff's worker writes the reply journal and `sent`, its loop reads the
/// request journal and `seen`), and errno is per thread.
struct handoff {
    nf_channel *channel;
    const struct nf_operations *operations;
    /// Requests handed over, and echoed: the worker waits (futex) while they are equal.
    _Atomic uint32_t posted;
    uint32_t echoed;
    uint32_t length;
    _Atomic bool stop;
};

static void *handoff_worker(void *argument) {
    struct handoff *handoff = argument;
    for (;;) {
        uint32_t posted;
        while ((posted = atomic_load(&handoff->posted)) == handoff->echoed) {
            syscall(SYS_futex, &handoff->posted, FUTEX_WAIT_PRIVATE, handoff->echoed, NULL, NULL, 0);
        }
        if (atomic_load(&handoff->stop)) return NULL;
        handoff->echoed = posted;
        if (handoff->operations->send(handoff->channel, handoff->length, handoff->channel->buffer) != 0) {
            // The loop thread waits for a request the initiator will not send, and the
            // initiator for this echo: nothing would end the wait. The floor peer is a process
            // of its own (`ipcbench floor-peer`), so it ends, which the initiator reports.
            int error = errno == 0 ? EIO : errno;
            fprintf(stderr, "floor %s: the hand-off worker's send failed: %s\n", nf_mechanism_name(handoff->channel->mechanism), strerror(error));
            _exit(70);
        }
    }
}

static void handoff_post(struct handoff *handoff) {
    atomic_fetch_add(&handoff->posted, 1);
    syscall(SYS_futex, &handoff->posted, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
}

/// The hand-off responder's loop: receive on this thread, echo on the worker.
static int serve_handing_off(nf_channel *channel, const struct nf_operations *operations) {
    struct handoff handoff = { .channel = channel, .operations = operations };
    pthread_t worker;
    int created = pthread_create(&worker, NULL, handoff_worker, &handoff);
    if (created != 0) {
        errno = created;
        return -1;
    }
    int status = 0;
    for (;;) {
        uint32_t length;
        if (receive_message(channel, operations, &length, channel->buffer, channel->max_payload) != 0) {
            status = -1;
            break;
        }
        if (length == NF_GOODBYE) break;
        if (length == NF_STREAM) {
            errno = ENOTSUP;
            status = -1;
            break;
        }
        handoff.length = length;
        handoff_post(&handoff);
    }
    int saved = errno;
    atomic_store(&handoff.stop, true);
    handoff_post(&handoff);
    pthread_join(worker, NULL);
    errno = saved;
    return status;
}

int nf_responder_serve(nf_channel *channel) {
    const struct nf_operations *operations = operations_for(channel->mechanism);
    if (!channel->responder) {
        errno = EINVAL;
        return -1;
    }
    if (operations->accept != NULL && operations->accept(channel) != 0) return -1;
    if (hands_off(channel->mechanism)) return serve_handing_off(channel, operations);
    for (;;) {
        uint32_t length;
        if (receive_message(channel, operations, &length, channel->buffer, channel->max_payload) != 0) return -1;
        if (length == NF_GOODBYE) return 0;
        if (length == NF_STREAM) {
            if (sink_stream(channel, operations) != 0) return -1;
            continue;
        }
        if (operations->send(channel, length, channel->buffer) != 0) return -1;
    }
}

int nf_round_trip(nf_channel *channel, const void *request, void *reply, size_t length) {
    const struct nf_operations *operations = operations_for(channel->mechanism);
    if (channel->responder || length > channel->max_payload) {
        errno = channel->responder ? EINVAL : EMSGSIZE;
        return -1;
    }
    if (operations->send(channel, (uint32_t)length, request) != 0) return -1;
    uint32_t reply_length;
    if (receive_message(channel, operations, &reply_length, reply, length) != 0) return -1;
    if (reply_length != length) {
        // A goodbye here means the responder's end closed: it went away.
        errno = reply_length == NF_GOODBYE ? ECONNRESET : EPROTO;
        return -1;
    }
    return 0;
}

static int receive_acknowledgement(nf_channel *channel, const struct nf_operations *operations) {
    uint32_t acknowledgement;
    if (receive_message(channel, operations, &acknowledgement, NULL, 0) != 0) return -1;
    if (acknowledgement != 0) {
        errno = acknowledgement == NF_GOODBYE ? ECONNRESET : EPROTO;
        return -1;
    }
    return 0;
}

static uint64_t monotonic_nanoseconds(void) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (uint64_t)now.tv_sec * 1000000000u + (uint64_t)now.tv_nsec;
}

/// A stream after the handshake, timed: its parameters, its messages (one send each, or with
/// `vector`, 2 × `batch` entries, `batch` at a time in one gathering write) and the
/// acknowledgement.
static int timed_stream(nf_channel *channel, const struct nf_operations *operations, const void *payload, uint32_t length, size_t count, size_t batch, struct iovec *vector, uint64_t *nanoseconds) {
    uint32_t parameters[2] = {(uint32_t)count, length};
    if (operations->send(channel, NF_STREAM, NULL) != 0 || receive_acknowledgement(channel, operations) != 0) return -1;
    uint64_t start = monotonic_nanoseconds();
    channel->streaming = true;
    if (operations->send(channel, sizeof(parameters), parameters) != 0) return -1;
    for (size_t sent = 0; sent < count;) {
        size_t messages = vector == NULL ? 1 : count - sent < batch ? count - sent : batch;
        if ((vector == NULL ? operations->send(channel, length, payload) : nf_stream_send_batch(channel, length, payload, messages, vector)) != 0) return -1;
        sent += messages;
    }
    channel->streaming = false;
    if (receive_acknowledgement(channel, operations) != 0) return -1;
    *nanoseconds = monotonic_nanoseconds() - start;
    return 0;
}

int nf_stream(nf_channel *channel, const void *payload, size_t length, size_t count, size_t batch, uint64_t *nanoseconds) {
    const struct nf_operations *operations = operations_for(channel->mechanism);
    // A stream through epoll: the socket's (written and drained as an event loop does); the
    // queue's sender would block, so it has none; a one-way stream has nothing to hand over.
    bool buffered = operations->buffered && channel->mechanism != NF_MQUEUE_EPOLL && channel->mechanism != NF_MQUEUE_POLL && !hands_off(channel->mechanism)
        && !waits_by_polling(channel->mechanism);
    // Batches are the event loop's gathering write, on the socket it writes without blocking.
    bool batches = batch <= 1 || channel->mechanism == NF_UNIX_STREAM_EPOLL;
    bool invalid = channel->responder || batch == 0 || batch > NF_STREAM_BATCH_MAX;
    if (invalid || !buffered || !batches || length > channel->max_payload || count > UINT32_MAX) {
        errno = invalid ? EINVAL : !buffered || !batches ? ENOTSUP : EMSGSIZE;
        return -1;
    }
    struct iovec *vector = NULL;
    if (batch > 1 && (vector = malloc(2 * batch * sizeof(*vector))) == NULL) return -1;
    int status = timed_stream(channel, operations, payload, (uint32_t)length, count, batch, vector, nanoseconds);
    int saved = errno;
    free(vector);
    errno = saved;
    return status;
}

void nf_remove_names(const nf_channel *channel) {
    for (int index = 0; index < NF_NAME_COUNT; index++) {
        const char *name = channel->names[index];
        if (name[0] == '\0') continue;
        if (uses_queues(channel->mechanism)) {
            mq_unlink(name);
        } else {
            unlink(name);
        }
    }
}

void nf_close(nf_channel *channel) {
    if (channel == NULL) return;
    const struct nf_operations *operations = operations_for(channel->mechanism);
    if (channel->established && !channel->responder && !operations->closing_is_goodbye) {
        // Best effort: a responder that is gone already needs no goodbye.
        operations->send(channel, NF_GOODBYE, NULL);
    }
    nf_remove_names(channel);
    // A socket is one descriptor for both directions: close it once.
    if (channel->out_fd == channel->in_fd) channel->out_fd = -1;
    nf_close_fd(&channel->in_fd);
    nf_close_fd(&channel->out_fd);
    nf_close_fd(&channel->listen_fd);
    nf_close_fd(&channel->file_fd);
    nf_close_fd(&channel->alive_fd);
    nf_close_fd(&channel->epoll_fd);
    nf_close_fd(&channel->ring_fd);
    nf_close_fd(&channel->bell_fd);
    nf_uring_close(channel);
    if (channel->mapping != NULL) munmap(channel->mapping, channel->mapping_length);
    free(channel->buffer);
    free(channel->scratch);
    free(channel->coalesced);
    free(channel);
}

int nf_set_path(nf_channel *channel, int index, const char *leaf) {
    int length = snprintf(channel->names[index], sizeof(channel->names[index]), "%s/floor-%d.%s", channel->directory, (int)channel->responder_pid, leaf);
    if (length >= (int)sizeof(channel->names[index])) {
        channel->names[index][0] = '\0';
        errno = ENAMETOOLONG;
        return -1;
    }
    return 0;
}

void nf_close_fd(int *fd) {
    // close(2) is not retried: on Linux the descriptor is released even when it reports EINTR.
    if (*fd >= 0) close(*fd);
    *fd = -1;
}

int nf_write_all(int fd, struct iovec *vector, int count, bool socket, nf_channel *polling) {
    while (count > 0) {
        ssize_t written;
        // One segment: `send` or `write`, which cost the kernel less than `sendmsg` or `writev`.
        if (socket && count == 1) {
            written = NF_RETRY(ipc_sys_send(fd, vector->iov_base, vector->iov_len, MSG_NOSIGNAL | (polling != NULL ? MSG_DONTWAIT : 0)));
        } else if (socket) {
            struct msghdr message = {.msg_iov = vector, .msg_iovlen = (size_t)count};
            written = NF_RETRY(ipc_sys_sendmsg(fd, &message, MSG_NOSIGNAL | (polling != NULL ? MSG_DONTWAIT : 0)));
        } else if (count == 1) {
            written = NF_RETRY(ipc_sys_write(fd, vector->iov_base, vector->iov_len));
        } else {
            written = NF_RETRY(ipc_sys_writev(fd, vector, count));
        }
        if (written < 0 && polling != NULL && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            if (nf_epoll_wait_writable(polling, fd) != 0) return -1;
            continue;
        }
        if (written < 0) return -1;
        // Skip what was written: whole entries, then part of the next.
        while (count > 0 && (size_t)written >= vector->iov_len) {
            written -= (ssize_t)vector->iov_len;
            vector++;
            count--;
        }
        if (count > 0) {
            vector->iov_base = (char *)vector->iov_base + written;
            vector->iov_len -= (size_t)written;
        }
    }
    return 0;
}

int nf_read_message(int fd, bool file, bool now, uint32_t *length, void *payload, size_t capacity) {
    uint32_t header = 0;
    // Header and payload in one call, so a small message costs one read. Until the header is in,
    // a stream may be read up to the capacity (in a ping-pong nothing follows the message); a
    // file is read only a page ahead, since old bytes of a longer earlier message follow it.
    struct iovec vector[2] = {{&header, NF_HEADER_LENGTH}, {payload, capacity}};
    size_t received = 0;
    size_t needed = NF_HEADER_LENGTH + (file && capacity > 4096 ? 4096 : capacity);
    bool header_known = false;
    while (!header_known || received < needed) {
        struct iovec window[2];
        int count = 0;
        size_t skip = received;
        size_t limit = needed - received;
        for (int index = 0; index < 2 && limit > 0; index++) {
            if (skip >= vector[index].iov_len) {
                skip -= vector[index].iov_len;
                continue;
            }
            size_t take = vector[index].iov_len - skip;
            if (take > limit) take = limit;
            window[count].iov_base = (char *)vector[index].iov_base + skip;
            window[count].iov_len = take;
            count++;
            limit -= take;
            skip = 0;
        }
        ssize_t count_read;
        if (file) {
            count_read = NF_RETRY(preadv(fd, window, count, (off_t)received));
        } else if (now && received == 0) {
            struct msghdr message = {.msg_iov = window, .msg_iovlen = (size_t)count};
            count_read = NF_RETRY(ipc_sys_recvmsg(fd, &message, MSG_DONTWAIT));
            if (count_read < 0 && errno == EWOULDBLOCK) errno = EAGAIN;
        } else {
            count_read = NF_RETRY(ipc_sys_readv(fd, window, count));
        }
        if (count_read < 0) return -1;
        if (count_read == 0) {
            if (!file && received == 0) {
                *length = NF_GOODBYE;
                return 0;
            }
            errno = EPROTO;
            return -1;
        }
        received += (size_t)count_read;
        if (!header_known && received >= NF_HEADER_LENGTH) {
            header_known = true;
            if (!NF_IS_CONTROL(header) && header > capacity) {
                errno = EMSGSIZE;
                return -1;
            }
            needed = NF_HEADER_LENGTH + (NF_IS_CONTROL(header) ? 0 : header);
            if (!file && received > needed) {
                // The other end sent a second message before this one was answered.
                errno = EPROTO;
                return -1;
            }
        }
    }
    *length = header;
    return 0;
}

bool nf_process_alive(pid_t pid) {
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    FILE *stat = fopen(path, "re");
    if (stat == NULL) return false;
    // The state follows the command name in parentheses, which may itself contain ") ".
    char line[512];
    bool alive = false;
    if (fgets(line, sizeof(line), stat) != NULL) {
        const char *end = strrchr(line, ')');
        alive = end != NULL && end[1] == ' ' && end[2] != 'Z' && end[2] != 'X';
    }
    fclose(stat);
    return alive;
}
