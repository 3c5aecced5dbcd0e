// A futex per direction on a MAP_SHARED file mapping that also carries the payload: the sender
// copies the payload in, publishes its length and a new sequence number, and wakes the other
// end, which sleeps in FUTEX_WAIT until the sequence number moves and copies the payload out.
// Both copies are part of the floor, because a transport must make them too.
#define _GNU_SOURCE
#include "floor_internal.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define PAGE 4096
#define MAGIC 0x464C4F52u /* "FLOR" */

/// One direction. Each sits on its own cache line so the two ends do not contend.
struct lane {
    /// The futex word: bumped by the sender after the payload and length are in place.
    _Atomic uint32_t sequence;
    uint32_t length;
    char padding[64 - 2 * sizeof(uint32_t)];
};

/// The first page of the mapping; the payload areas follow, request then reply.
struct shared_header {
    uint32_t magic;
    uint32_t reserved;
    uint64_t capacity;
    /// eventfd+epoll: the responder's descriptor numbers of the two doorbells, [lane] woken when
    /// that lane has a new message; the initiator takes them with pidfd_getfd.
    int32_t bells[2];
    char padding[64 - 4 * sizeof(uint32_t) - sizeof(uint64_t)];
    /// [0]: initiator to responder, [1]: responder to initiator.
    struct lane lanes[2];
};

_Static_assert(sizeof(struct shared_header) <= PAGE, "the header fits in its page");

static size_t area_length(size_t capacity) {
    size_t length = capacity > 0 ? capacity : 1;
    return (length + PAGE - 1) / PAGE * PAGE;
}

static struct shared_header *header_of(const nf_channel *channel) {
    return channel->mapping;
}

static unsigned char *area(const nf_channel *channel, int lane) {
    return (unsigned char *)channel->mapping + PAGE + (size_t)lane * area_length(header_of(channel)->capacity);
}

/// The lane this end writes to, and the one it reads.
static int outgoing(const nf_channel *channel) { return channel->responder ? 1 : 0; }
static int incoming(const nf_channel *channel) { return channel->responder ? 0 : 1; }

static int futex_wait(_Atomic uint32_t *word, uint32_t expected, const struct timespec *timeout) {
    // Not FUTEX_PRIVATE_FLAG: the word is shared with another process.
    return (int)syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT, expected, timeout, NULL, 0);
}

static int futex_wake(_Atomic uint32_t *word) {
    return (int)syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE, 1, NULL, NULL, 0);
}

static int map(nf_channel *channel, int fd, size_t length) {
    void *mapping = mmap(NULL, length, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (mapping == MAP_FAILED) return -1;
    channel->mapping = mapping;
    channel->mapping_length = length;
    return 0;
}

static int futex_create(nf_channel *channel) {
    if (nf_set_path(channel, NF_NAME_REQUEST, "shm") != 0) return -1;
    int fd = open(channel->names[NF_NAME_REQUEST], O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) return -1;
    size_t length = PAGE + 2 * area_length(channel->max_payload);
    int result = ftruncate(fd, (off_t)length) == 0 ? map(channel, fd, length) : -1;
    nf_close_fd(&fd);
    if (result != 0) return -1;
    struct shared_header *header = header_of(channel);
    header->capacity = channel->max_payload;
    atomic_store_explicit((_Atomic uint32_t *)&header->magic, MAGIC, memory_order_release);
    return 0;
}

static int futex_open(nf_channel *channel) {
    if (nf_set_path(channel, NF_NAME_REQUEST, "shm") != 0) return -1;
    int fd = open(channel->names[NF_NAME_REQUEST], O_RDWR | O_CLOEXEC);
    if (fd < 0) return -1;
    struct stat status;
    int result = fstat(fd, &status) == 0 && status.st_size >= PAGE ? map(channel, fd, (size_t)status.st_size) : -1;
    nf_close_fd(&fd);
    if (result != 0) return -1;
    nf_remove_names(channel);
    struct shared_header *header = header_of(channel);
    if (atomic_load_explicit((_Atomic uint32_t *)&header->magic, memory_order_acquire) != MAGIC ||
        (size_t)status.st_size < PAGE + 2 * area_length(header->capacity)) {
        errno = EPROTO;
        return -1;
    }
    if (header->capacity < channel->max_payload) {
        errno = EMSGSIZE;
        return -1;
    }
    return 0;
}

/// Copies the payload into this end's lane and publishes it; returns the lane.
static struct lane *publish(nf_channel *channel, uint32_t length, const void *payload) {
    struct lane *lane = &header_of(channel)->lanes[outgoing(channel)];
    if (!NF_IS_CONTROL(length) && length > 0) memcpy(area(channel, outgoing(channel)), payload, length);
    lane->length = length;
    // Release: the payload and length are visible before the new sequence number is.
    atomic_store_explicit(&lane->sequence, ++channel->sent, memory_order_release);
    return lane;
}

/// Takes the message that sequence number `sequence` published on the incoming lane.
static int take(nf_channel *channel, struct lane *lane, uint32_t sequence, uint32_t *length, void *payload, size_t capacity) {
    channel->seen = sequence;
    uint32_t header = lane->length;
    if (!NF_IS_CONTROL(header)) {
        if (header > capacity) {
            errno = EMSGSIZE;
            return -1;
        }
        if (header > 0) memcpy(payload, area(channel, incoming(channel)), header);
    }
    *length = header;
    return 0;
}

static int futex_send(nf_channel *channel, uint32_t length, const void *payload) {
    struct lane *lane = publish(channel, length, payload);
    return futex_wake(&lane->sequence) < 0 ? -1 : 0;
}

static int futex_receive(nf_channel *channel, uint32_t *length, void *payload, size_t capacity) {
    struct lane *lane = &header_of(channel)->lanes[incoming(channel)];
    // The initiator wakes up now and then to check that the responder is alive.
    const struct timespec period = {NF_LIVENESS_PERIOD_SECONDS, 0};
    uint32_t sequence;
    while ((sequence = atomic_load_explicit(&lane->sequence, memory_order_acquire)) == channel->seen) {
        if (futex_wait(&lane->sequence, channel->seen, channel->responder ? NULL : &period) == 0) continue;
        if (errno == ETIMEDOUT && !nf_process_alive(channel->responder_pid)) {
            errno = ECONNRESET;
            return -1;
        }
        // EAGAIN (the word moved before the kernel looked), EINTR, ETIMEDOUT: look again.
        if (errno != EAGAIN && errno != EINTR && errno != ETIMEDOUT) return -1;
    }
    return take(channel, lane, sequence, length, payload, capacity);
}

const struct nf_operations nf_futex_operations = {
    .create = futex_create,
    .accept = NULL,
    .open = futex_open,
    .send = futex_send,
    .receive = futex_receive,
};

// eventfd+epoll: the same mapping and lanes; the wake-up is an eventfd per lane that the reader
// waits on with epoll (edge-triggered, never read: each write is a new edge), as the notify
// transport's event loop does. The sequence numbers still say whether a message is there.

static int eventfd_create(nf_channel *channel) {
    if (futex_create(channel) != 0) return -1;
    int bells[2];
    for (int lane = 0; lane < 2; lane++) {
        // io_uring's read of a non-blocking eventfd would fail with EAGAIN instead of waiting.
        bells[lane] = eventfd(0, EFD_CLOEXEC | (channel->mechanism == NF_EVENTFD_IO_URING ? 0 : EFD_NONBLOCK));
        if (bells[lane] < 0) return -1;
    }
    // The responder waits on lane 0 and rings lane 1.
    channel->bell_fd = bells[0];
    channel->ring_fd = bells[1];
    header_of(channel)->bells[0] = bells[0];
    header_of(channel)->bells[1] = bells[1];
    return 0;
}

/// Takes descriptor `number` from the responder's table (pidfd_getfd).
static int take_descriptor(int pidfd, int number) {
    return (int)syscall(SYS_pidfd_getfd, pidfd, number, 0);
}

static int eventfd_open(nf_channel *channel) {
    if (futex_open(channel) != 0) return -1;
    int pidfd = (int)syscall(SYS_pidfd_open, channel->responder_pid, 0);
    if (pidfd < 0) return -1;
    channel->bell_fd = take_descriptor(pidfd, header_of(channel)->bells[1]);
    channel->ring_fd = take_descriptor(pidfd, header_of(channel)->bells[0]);
    int error = errno;
    close(pidfd);
    if (channel->bell_fd < 0 || channel->ring_fd < 0) {
        errno = error;
        return -1;
    }
    return 0;
}

static int eventfd_send(nf_channel *channel, uint32_t length, const void *payload) {
    // eventfd+io_uring rings this way too: io_uring has no inline write for an eventfd and hands
    // each IORING_OP_WRITE to an io-wq worker thread (131 µs and 6 context switches a round trip
    // on one core, measured on a debug build, against 7-10 µs with write(2)).
    publish(channel, length, payload);
    uint64_t one = 1;
    return NF_RETRY(ipc_sys_write(channel->ring_fd, &one, sizeof(one))) == sizeof(one) ? 0 : -1;
}

static int eventfd_receive(nf_channel *channel, uint32_t *length, void *payload, size_t capacity) {
    struct lane *lane = &header_of(channel)->lanes[incoming(channel)];
    uint32_t sequence;
    while ((sequence = atomic_load_explicit(&lane->sequence, memory_order_acquire)) == channel->seen) {
        if (channel->mechanism == NF_EVENTFD_IO_URING) {
            if (nf_uring_wait_bell(channel) != 0) return -1;
        } else if (nf_epoll_wait_readable(channel, channel->bell_fd, true) != 0) {
            return -1;
        }
    }
    return take(channel, lane, sequence, length, payload, capacity);
}

const struct nf_operations nf_eventfd_operations = {
    .create = eventfd_create,
    .accept = NULL,
    .open = eventfd_open,
    .send = eventfd_send,
    .receive = eventfd_receive,
};

// shm+spin: the same mapping and lanes, and no wake-up at all: the receiver busy-polls the
// sequence number. The limit for any transport whose messages are in shared memory. A receiver
// that found nothing for NF_SPIN_LIMIT_NANOSECONDS (an idle peer between its measurements)
// looks once a millisecond instead, asleep between looks: the sender makes no system call, so
// nothing could wake it sooner, and a measured round trip never waits that long.

static int shm_spin_send(nf_channel *channel, uint32_t length, const void *payload) {
    publish(channel, length, payload);
    return 0;
}

static int shm_spin_receive(nf_channel *channel, uint32_t *length, void *payload, size_t capacity) {
    struct lane *lane = &header_of(channel)->lanes[incoming(channel)];
    uint64_t checked = 0;
    nf_liveness_due(&checked);
    uint32_t sequence;
    uint32_t polls = 0;
    uint64_t end = 0;
    bool spinning = true;
    while ((sequence = atomic_load_explicit(&lane->sequence, memory_order_acquire)) == channel->seen) {
        if (spinning) {
            nf_cpu_relax();
            spinning = nf_still_spinning(&polls, &end);
        } else {
            struct timespec pause = {.tv_sec = 0, .tv_nsec = 1000000};
            nanosleep(&pause, NULL);
        }
        if (!channel->responder && nf_liveness_due(&checked) && !nf_process_alive(channel->responder_pid)) {
            errno = ECONNRESET;
            return -1;
        }
    }
    return take(channel, lane, sequence, length, payload, capacity);
}

const struct nf_operations nf_shm_spin_operations = {
    .create = futex_create,
    .accept = NULL,
    .open = futex_open,
    .send = shm_spin_send,
    .receive = shm_spin_receive,
};
