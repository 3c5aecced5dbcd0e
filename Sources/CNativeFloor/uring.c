// The io_uring floors: the kernel work of an event loop that waits with io_uring instead of
// epoll. Each end keeps its sends queued until it waits: one io_uring_enter per half round trip
// submits the send (and the receive) and waits for the receive's completion, where the epoll
// floors make an epoll_wait, a read and a write (eventfd+io_uring rings with write(2), see
// eventfd_send). The ring is set up the fastest way the kernel
// allows here (IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN, else COOP_TASKRUN, else
// plain), with the socket or eventfds registered as fixed files. Raw system calls: no liburing
// is needed to build the package.
#define _GNU_SOURCE
#include "floor_internal.h"

#include <linux/io_uring.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/// Sends in flight at once; a send beyond it waits for one to complete.
#define SLOTS 8
/// The completion of the receive carries this; a tracked send's carries its slot plus one; a
/// send that posts a completion only if it fails carries UNTRACKED_TAG.
#define RECEIVE_TAG 0
#define UNTRACKED_TAG (SLOTS + 1)

struct send_slot {
    bool busy;
    uint32_t header;
    struct iovec vector[2];
    struct msghdr message;
    /// A small message's copy (NF_COALESCED_LIMIT), sent as one buffer while the send is in
    /// flight; made at the slot's first such send.
    unsigned char *coalesced;
};

struct nf_uring {
    int fd;
    /// The thread that made the ring: with IORING_SETUP_SINGLE_ISSUER only it may submit.
    pid_t owner;
    unsigned *sq_head, *sq_tail, *sq_mask, *sq_array;
    unsigned *cq_head, *cq_tail, *cq_mask;
    struct io_uring_sqe *sqes;
    struct io_uring_cqe *cqes;
    void *sq_ring, *cq_ring;
    size_t sq_ring_length, cq_ring_length, sqes_length;
    unsigned sq_entries;
    /// Entries queued and not yet submitted.
    unsigned queued;
    /// Sends submitted or queued whose completion has not been seen.
    unsigned sends_outstanding;
    /// The last tracked send queued since the last submission (linked to the next one queued).
    struct io_uring_sqe *last_tracked;
    /// The receive's result once its completion is seen; `receiving` while it is outstanding.
    bool receiving;
    bool received;
    int32_t receive_result;
    /// The descriptors as the ring knows them (fixed-file indexes when registered).
    bool fixed;
    struct send_slot slots[SLOTS];
    /// A stream's bytes read and not yet taken (unix-stream+io_uring).
    unsigned char *input;
    size_t input_capacity, input_start, input_end;
    /// eventfd+io_uring: where the doorbell's count is read to.
    uint64_t bell_count;
};

static int ring_enter(int fd, unsigned submit, unsigned wait, unsigned flags, const struct timespec *timeout) {
    if (timeout == NULL) return (int)syscall(SYS_io_uring_enter, fd, submit, wait, flags, NULL, 0);
    struct io_uring_getevents_arg argument = {.ts = (uint64_t)(uintptr_t)timeout};
    return (int)syscall(SYS_io_uring_enter, fd, submit, wait, flags | IORING_ENTER_EXT_ARG, &argument, sizeof(argument));
}

static void ring_free(struct nf_uring *ring) {
    if (ring == NULL) return;
    if (ring->sqes != NULL && ring->sqes != MAP_FAILED) munmap(ring->sqes, ring->sqes_length);
    if (ring->cq_ring != NULL && ring->cq_ring != MAP_FAILED && ring->cq_ring != ring->sq_ring) munmap(ring->cq_ring, ring->cq_ring_length);
    if (ring->sq_ring != NULL && ring->sq_ring != MAP_FAILED) munmap(ring->sq_ring, ring->sq_ring_length);
    if (ring->fd >= 0) close(ring->fd);
    free(ring->input);
    for (int index = 0; index < SLOTS; index++) free(ring->slots[index].coalesced);
    free(ring);
}

/// Sets a ring up with the first of `flags` the kernel takes.
static struct nf_uring *ring_new(void) {
    static const unsigned choices[] = {
        IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN,
        IORING_SETUP_COOP_TASKRUN,
        0,
    };
    struct nf_uring *ring = calloc(1, sizeof(*ring));
    if (ring == NULL) return NULL;
    ring->fd = -1;
    struct io_uring_params parameters;
    for (size_t index = 0; index < sizeof(choices) / sizeof(choices[0]); index++) {
        memset(&parameters, 0, sizeof(parameters));
        parameters.flags = choices[index];
        ring->fd = (int)syscall(SYS_io_uring_setup, 2 * SLOTS, &parameters);
        if (ring->fd >= 0 || errno != EINVAL) break;
    }
    if (ring->fd < 0) {
        int error = errno;
        free(ring);
        errno = error;
        return NULL;
    }
    ring->sq_entries = parameters.sq_entries;
    ring->sq_ring_length = parameters.sq_off.array + parameters.sq_entries * sizeof(unsigned);
    ring->cq_ring_length = parameters.cq_off.cqes + parameters.cq_entries * sizeof(struct io_uring_cqe);
    bool single = (parameters.features & IORING_FEAT_SINGLE_MMAP) != 0;
    if (single && ring->cq_ring_length > ring->sq_ring_length) ring->sq_ring_length = ring->cq_ring_length;
    ring->sq_ring = mmap(NULL, ring->sq_ring_length, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, ring->fd, IORING_OFF_SQ_RING);
    if (ring->sq_ring == MAP_FAILED) goto failed;
    ring->cq_ring = single ? ring->sq_ring
                           : mmap(NULL, ring->cq_ring_length, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, ring->fd, IORING_OFF_CQ_RING);
    if (ring->cq_ring == MAP_FAILED) goto failed;
    ring->sqes_length = parameters.sq_entries * sizeof(struct io_uring_sqe);
    ring->sqes = mmap(NULL, ring->sqes_length, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, ring->fd, IORING_OFF_SQES);
    if (ring->sqes == MAP_FAILED) goto failed;
    unsigned char *sq = ring->sq_ring, *cq = ring->cq_ring;
    ring->sq_head = (unsigned *)(sq + parameters.sq_off.head);
    ring->sq_tail = (unsigned *)(sq + parameters.sq_off.tail);
    ring->sq_mask = (unsigned *)(sq + parameters.sq_off.ring_mask);
    ring->sq_array = (unsigned *)(sq + parameters.sq_off.array);
    ring->cq_head = (unsigned *)(cq + parameters.cq_off.head);
    ring->cq_tail = (unsigned *)(cq + parameters.cq_off.tail);
    ring->cq_mask = (unsigned *)(cq + parameters.cq_off.ring_mask);
    ring->cqes = (struct io_uring_cqe *)(cq + parameters.cq_off.cqes);
    return ring;
failed:;
    int error = errno;
    ring_free(ring);
    errno = error;
    return NULL;
}

/// The channel's ring, made at first use by the calling thread; `fds` are registered as fixed
/// files 0, 1, ... A ring a single issuer made on another thread (the harness warms up and
/// measures on threads of their own) is made again on this one, between two round trips, when
/// nothing is in flight; the bytes read ahead move over.
static struct nf_uring *ring_of(nf_channel *channel, const int *fds, unsigned count) {
    pid_t self = (pid_t)syscall(SYS_gettid);
    struct nf_uring *old = channel->uring;
    if (old != NULL && old->owner == self) return old;
    if (old != NULL && (old->sends_outstanding > 0 || old->receiving || old->queued > 0)) {
        errno = EBUSY;
        return NULL;
    }
    struct nf_uring *ring = ring_new();
    if (ring == NULL) return NULL;
    ring->owner = self;
    ring->fixed = syscall(SYS_io_uring_register, ring->fd, IORING_REGISTER_FILES, fds, count) == 0;
    if (old != NULL) {
        ring->input = old->input;
        ring->input_capacity = old->input_capacity;
        ring->input_start = old->input_start;
        ring->input_end = old->input_end;
        old->input = NULL;
        ring_free(old);
    }
    channel->uring = ring;
    return ring;
}

/// The next submission entry, zeroed; the caller fills it. Room is made by the callers (at
/// most SLOTS sends and one receive or doorbell read are ever queued).
static struct io_uring_sqe *next_entry(struct nf_uring *ring) {
    unsigned tail = *ring->sq_tail;
    unsigned index = tail & *ring->sq_mask;
    struct io_uring_sqe *entry = &ring->sqes[index];
    memset(entry, 0, sizeof(*entry));
    ring->sq_array[index] = index;
    atomic_store_explicit((_Atomic unsigned *)ring->sq_tail, tail + 1, memory_order_release);
    ring->queued++;
    return entry;
}

static void set_file(struct nf_uring *ring, struct io_uring_sqe *entry, int fd, unsigned fixed_index) {
    if (ring->fixed) {
        entry->fd = (int)fixed_index;
        entry->flags |= IOSQE_FIXED_FILE;
    } else {
        entry->fd = fd;
    }
}

/// Takes the completions there are. A send that failed (or, on a stream, went short) fails the
/// channel: -1 with errno.
static int reap(struct nf_uring *ring) {
    unsigned head = *ring->cq_head;
    unsigned tail = atomic_load_explicit((_Atomic unsigned *)ring->cq_tail, memory_order_acquire);
    int status = 0;
    while (head != tail) {
        struct io_uring_cqe *completion = &ring->cqes[head & *ring->cq_mask];
        head++;
        if (completion->user_data == RECEIVE_TAG) {
            ring->receiving = false;
            ring->received = true;
            ring->receive_result = completion->res;
            continue;
        }
        if (completion->user_data == UNTRACKED_TAG) {
            // Only a failure posts one.
            if (status == 0) {
                errno = completion->res < 0 ? -completion->res : EPROTO;
                status = -1;
            }
            continue;
        }
        ring->sends_outstanding--;
        struct send_slot *slot = &ring->slots[completion->user_data - 1];
        size_t expected = slot->vector[0].iov_len + slot->vector[1].iov_len;
        slot->busy = false;
        if (status == 0 && completion->res < 0) {
            errno = -completion->res;
            status = -1;
        } else if (status == 0 && (size_t)completion->res != expected) {
            // MSG_WAITALL stops short only when the connection broke: the peer went away.
            errno = ECONNRESET;
            status = -1;
        }
    }
    atomic_store_explicit((_Atomic unsigned *)ring->cq_head, head, memory_order_release);
    return status;
}

/// Submits what is queued and waits for `wait` completions more (the initiator waking once a
/// second to check the responder is alive).
static int submit_and_wait(nf_channel *channel, struct nf_uring *ring, unsigned wait) {
    struct timespec period = {.tv_sec = NF_LIVENESS_PERIOD_SECONDS};
    for (;;) {
        int result = ring_enter(ring->fd, ring->queued, wait, wait > 0 ? IORING_ENTER_GETEVENTS : 0, channel->responder || wait == 0 ? NULL : &period);
        if (result >= 0) {
            // What the kernel took; with SQPOLL off it takes all or fails.
            ring->queued -= (unsigned)result < ring->queued ? (unsigned)result : ring->queued;
            if (ring->queued == 0) ring->last_tracked = NULL;
            return reap(ring);
        }
        if (errno == EINTR) continue;
        if (errno == ETIME || errno == EBUSY) {
            ring->queued = 0;
            ring->last_tracked = NULL;
            if (reap(ring) != 0) return -1;
            if (!channel->responder && !nf_process_alive(channel->responder_pid)) {
                errno = ECONNRESET;
                return -1;
            }
            // Whatever came meanwhile counts.
            return 0;
        }
        return -1;
    }
}

/// Waits until the receive (queued or outstanding) has completed: its result (the bytes read),
/// or -1 with errno (the receive's own failure included).
static int await_receive(nf_channel *channel, struct nf_uring *ring) {
    while (!ring->received) {
        // Waits for one completion: a round trip's send posts none when it succeeds (and the
        // kernel's deferred work, such as the rest of a send that did not fit the socket, wakes
        // a waiter only as far as the completions it waits for: waiting for the send's too
        // would never wake for the work that finishes it).
        if (submit_and_wait(channel, ring, 1) != 0) return -1;
    }
    ring->received = false;
    if (ring->receive_result < 0) {
        errno = -ring->receive_result;
        return -1;
    }
    return ring->receive_result;
}

static void tag_send(struct nf_uring *ring, struct io_uring_sqe *entry, struct send_slot *slot, bool tracked);

/// Queues a send of a header and a payload. A tracked send (one of a stream, which runs ahead
/// of the replies) takes a slot of its own, after waiting for one to be free, and posts its
/// completion; a round trip's send posts one only if it fails, and always uses slot 0: the
/// protocol ends it before the next (the reply, or the next request, comes only after it).
static int queue_send(nf_channel *channel, struct nf_uring *ring, int fd, unsigned fixed_index, uint32_t header, const void *payload, size_t length, bool tracked) {
    struct send_slot *slot = tracked ? NULL : &ring->slots[0];
    while (slot == NULL) {
        // A new chain of tracked sends waits for the one submitted before it to complete (see
        // tag_send); a send that joins the chain being queued waits only for a free slot.
        if (ring->last_tracked != NULL || ring->sends_outstanding == 0) {
            for (int index = 1; index < SLOTS; index++) {
                if (!ring->slots[index].busy) {
                    slot = &ring->slots[index];
                    break;
                }
            }
        }
        if (slot == NULL && submit_and_wait(channel, ring, 1) != 0) return -1;
    }
    size_t payload_length = NF_IS_CONTROL(header) ? 0 : length;
    bool coalesce = NF_HEADER_LENGTH + payload_length <= NF_COALESCED_LIMIT;
    // Its buffer first: a slot that cannot have one is not taken.
    if (coalesce && slot->coalesced == NULL && (slot->coalesced = malloc(NF_COALESCED_LIMIT)) == NULL) return -1;
    slot->busy = tracked;
    slot->header = header;
    // A small message goes as one copy in one buffer (IORING_OP_SEND), as the other stream
    // floors send it (NF_COALESCED_LIMIT); a larger one as header and payload (IORING_OP_SENDMSG).
    if (coalesce) {
        memcpy(slot->coalesced, &slot->header, NF_HEADER_LENGTH);
        if (payload_length > 0) memcpy(slot->coalesced + NF_HEADER_LENGTH, payload, payload_length);
        // The vectors say what the completion must report (reap): here, the one buffer.
        slot->vector[0] = (struct iovec){slot->coalesced, NF_HEADER_LENGTH + payload_length};
        slot->vector[1] = (struct iovec){NULL, 0};
        struct io_uring_sqe *entry = next_entry(ring);
        entry->opcode = IORING_OP_SEND;
        set_file(ring, entry, fd, fixed_index);
        entry->addr = (uint64_t)(uintptr_t)slot->coalesced;
        entry->len = (uint32_t)(NF_HEADER_LENGTH + payload_length);
        entry->msg_flags = MSG_NOSIGNAL | MSG_WAITALL;
        tag_send(ring, entry, slot, tracked);
        return 0;
    }
    slot->vector[0] = (struct iovec){&slot->header, NF_HEADER_LENGTH};
    slot->vector[1] = (struct iovec){(void *)payload, payload_length};
    memset(&slot->message, 0, sizeof(slot->message));
    slot->message.msg_iov = slot->vector;
    slot->message.msg_iovlen = 2;
    struct io_uring_sqe *entry = next_entry(ring);
    entry->opcode = IORING_OP_SENDMSG;
    set_file(ring, entry, fd, fixed_index);
    entry->addr = (uint64_t)(uintptr_t)&slot->message;
    entry->msg_flags = MSG_NOSIGNAL | MSG_WAITALL;
    tag_send(ring, entry, slot, tracked);
    return 0;
}

/// Marks a queued send: a tracked one posts its completion with its slot, an untracked one only
/// if it fails.
///
/// Tracked sends run one after another, as one writer's sends on a stream must. A send that
/// does not fit the socket goes on in the kernel once there is room, and a second send in
/// flight beside it would put its bytes between the first's: with several sends of 1 MiB in
/// flight unordered, the receiver found a message's bytes inside the one before it
/// (Reports/uring-stream-order). So each is linked to the tracked send queued before it in the
/// same submission, and queue_send starts a new chain only once the sends submitted before it
/// have completed. (IOSQE_IO_DRAIN would let the kernel start it then, but a ring refuses it,
/// EOPNOTSUPP, once any request has used IOSQE_CQE_SKIP_SUCCESS, as the round trips' do.)
static void tag_send(struct nf_uring *ring, struct io_uring_sqe *entry, struct send_slot *slot, bool tracked) {
    if (tracked) {
        if (ring->last_tracked != NULL) ring->last_tracked->flags |= IOSQE_IO_LINK;
        ring->last_tracked = entry;
        entry->user_data = (uint64_t)(slot - ring->slots) + 1;
        ring->sends_outstanding++;
    } else {
        entry->flags |= IOSQE_CQE_SKIP_SUCCESS;
        entry->user_data = UNTRACKED_TAG;
    }
}

/// Queues a receive of up to `length` bytes into `buffer` and waits for it: the bytes read.
/// `flags`: the receive's (MSG_WAITALL: all `length` bytes, short only at the end of the stream).
static ssize_t receive_into(nf_channel *channel, struct nf_uring *ring, int fd, unsigned fixed_index, void *buffer, size_t length, int flags) {
    struct io_uring_sqe *entry = next_entry(ring);
    entry->opcode = IORING_OP_RECV;
    set_file(ring, entry, fd, fixed_index);
    entry->addr = (uint64_t)(uintptr_t)buffer;
    entry->len = (uint32_t)(length < UINT32_MAX ? length : UINT32_MAX);
    entry->msg_flags = (uint32_t)flags;
    entry->user_data = RECEIVE_TAG;
    ring->receiving = true;
    return await_receive(channel, ring);
}

// MARK: unix-stream+io_uring

static struct nf_uring *stream_ring(nf_channel *channel) {
    struct nf_uring *ring = ring_of(channel, &channel->in_fd, 1);
    if (ring != NULL && ring->input == NULL) {
        ring->input_capacity = 64 * 1024;
        ring->input = malloc(ring->input_capacity);
        if (ring->input == NULL) return NULL;
    }
    return ring;
}

int nf_uring_stream_send(nf_channel *channel, uint32_t length, const void *payload) {
    struct nf_uring *ring = stream_ring(channel);
    if (ring == NULL) return -1;
    if (queue_send(channel, ring, channel->out_fd, 0, length, payload, length, channel->streaming) != 0) return -1;
    // A goodbye goes now: nothing waits after it. Everything else goes with the next wait.
    return length == NF_GOODBYE ? submit_and_wait(channel, ring, 0) : 0;
}

/// Makes at least `count` bytes available in the input buffer: 0, or 1 at the end of the
/// stream, or -1.
static int fill_input(nf_channel *channel, struct nf_uring *ring, size_t count) {
    while (ring->input_end - ring->input_start < count) {
        if (ring->input_start > 0) {
            memmove(ring->input, ring->input + ring->input_start, ring->input_end - ring->input_start);
            ring->input_end -= ring->input_start;
            ring->input_start = 0;
        }
        ssize_t got = receive_into(channel, ring, channel->in_fd, 0, ring->input + ring->input_end, ring->input_capacity - ring->input_end, 0);
        if (got < 0) return -1;
        if (got == 0) return 1;
        ring->input_end += (size_t)got;
    }
    return 0;
}

int nf_uring_stream_receive(nf_channel *channel, uint32_t *length, void *payload, size_t capacity) {
    struct nf_uring *ring = stream_ring(channel);
    if (ring == NULL) return -1;
    int filled = fill_input(channel, ring, NF_HEADER_LENGTH);
    if (filled < 0) return -1;
    if (filled > 0) {
        if (ring->input_end != ring->input_start) {
            errno = EPROTO;
            return -1;
        }
        *length = NF_GOODBYE;
        return 0;
    }
    uint32_t header;
    memcpy(&header, ring->input + ring->input_start, NF_HEADER_LENGTH);
    ring->input_start += NF_HEADER_LENGTH;
    *length = header;
    if (NF_IS_CONTROL(header)) return 0;
    if (header > capacity) {
        errno = EMSGSIZE;
        return -1;
    }
    size_t have = ring->input_end - ring->input_start;
    size_t copied = have < header ? have : header;
    if (copied > 0) memcpy(payload, ring->input + ring->input_start, copied);
    ring->input_start += copied;
    // The rest of a message longer than what was read goes straight to the payload.
    while (copied < header) {
        ssize_t got = receive_into(channel, ring, channel->in_fd, 0, (unsigned char *)payload + copied, header - copied, 0);
        if (got <= 0) {
            if (got == 0) errno = EPROTO;
            return -1;
        }
        copied += (size_t)got;
    }
    return 0;
}

/// The io_uring stream's reads: one receive through the ring; the rest of a message read alone
/// with MSG_WAITALL, one request the kernel completes once the whole rest is there, as the
/// engine receives a large frame's rest.
static ssize_t uring_sink_read(nf_channel *channel, void *buffer, size_t length, bool alone) {
    return receive_into(channel, channel->uring, channel->in_fd, 0, buffer, length, alone ? MSG_WAITALL : 0);
}

int nf_uring_stream_sink(nf_channel *channel, size_t count, size_t length) {
    struct nf_uring *ring = stream_ring(channel);
    if (ring == NULL) return -1;
    // What a round trip's receive read ahead is the stream's first bytes (copied by the sink
    // before it reads; the ring's buffer is not read into meanwhile).
    size_t buffered = ring->input_end - ring->input_start;
    size_t stream = count * (NF_HEADER_LENGTH + length);
    size_t taken = buffered < stream ? buffered : stream;
    const unsigned char *ahead = ring->input + ring->input_start;
    ring->input_start += taken;
    return nf_stream_sink_messages(channel, count, length, ahead, taken, uring_sink_read);
}

// MARK: eventfd+io_uring

static struct nf_uring *bell_ring(nf_channel *channel) {
    int fds[2] = {channel->bell_fd, channel->ring_fd};
    return ring_of(channel, fds, 2);
}

int nf_uring_wait_bell(nf_channel *channel) {
    struct nf_uring *ring = bell_ring(channel);
    if (ring == NULL) return -1;
    struct io_uring_sqe *entry = next_entry(ring);
    entry->opcode = IORING_OP_READ;
    set_file(ring, entry, channel->bell_fd, 0);
    entry->addr = (uint64_t)(uintptr_t)&ring->bell_count;
    entry->len = sizeof(ring->bell_count);
    entry->user_data = RECEIVE_TAG;
    ring->receiving = true;
    return await_receive(channel, ring) < 0 ? -1 : 0;
}

int nf_mechanism_available(nf_mechanism mechanism) {
    if (mechanism != NF_UNIX_STREAM_IO_URING && mechanism != NF_EVENTFD_IO_URING) return 1;
    struct nf_uring *ring = ring_new();
    if (ring == NULL) return 0;
    ring_free(ring);
    return 1;
}

void nf_uring_close(nf_channel *channel) {
    ring_free(channel->uring);
    channel->uring = NULL;
}
