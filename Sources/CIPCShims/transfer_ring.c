// The event loop's transfer ring (docs/ENGINE.md, "Large frames in the kernel's hands"):
// io_uring, by raw system calls, for the rest of a large frame only. The rest of a frame being
// sent goes as one `sendmsg`, the rest of one being received as one `recv`, both with
// MSG_WAITALL: the kernel goes on with them as the peer makes room or sends more, without a
// return to user space. While any is in flight, the loop waits in the ring (ipc_ring_wait)
// rather than in epoll_wait, with the epoll descriptor watched by a poll request on the ring, so
// that those retries run inside its wait. Used by the loop's thread alone.
#define _GNU_SOURCE
#include "shims.h"

#include <errno.h>
#include <linux/io_uring.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/utsname.h>
#include <stdio.h>
#include <unistd.h>

/// A completion with this tag is a cancellation's own (nothing waits for it); one with POLL_TAG
/// is the poll of the epoll descriptor; a transfer's tag is its slot plus one.
#define CANCEL_TAG 0
#define POLL_TAG UINT64_MAX

struct send_slot {
    bool busy;
    struct iovec vector[2];
    struct msghdr message;
    /// A copy of the frame's header bytes still to go (the caller's may not outlive the call).
    unsigned char *head;
    size_t head_capacity;
};

struct ipc_ring {
    int fd;
    unsigned *sq_head, *sq_tail, *sq_mask, *sq_array;
    unsigned *cq_head, *cq_tail, *cq_mask;
    struct io_uring_sqe *sqes;
    struct io_uring_cqe *cqes;
    void *rings;
    size_t rings_length, sqes_length;
    unsigned sq_entries;
    int slot_count;
    struct send_slot *slots;
    /// Transfers in flight (busy slots).
    int in_flight;
    /// Entries queued and not yet submitted (the poll request, before a wait).
    unsigned queued;
    /// A poll of the epoll descriptor is armed (submitted, not yet completed).
    bool poll_armed;
};

void ipc_ring_close(ipc_ring *ring) {
    if (ring == NULL) return;
    // Only with nothing in flight (the header says so): the kernel tears a ring down after its
    // descriptor is closed, and until then a transfer still in flight could use its buffer.
    if (ring->sqes != NULL && ring->sqes != MAP_FAILED) munmap(ring->sqes, ring->sqes_length);
    if (ring->rings != NULL && ring->rings != MAP_FAILED) munmap(ring->rings, ring->rings_length);
    if (ring->fd >= 0) close(ring->fd);
    if (ring->slots != NULL) {
        for (int index = 0; index < ring->slot_count; index++) free(ring->slots[index].head);
        free(ring->slots);
    }
    free(ring);
}

/// Whether the running kernel is at least `major`.`minor` (uname's release).
static bool kernel_at_least(int major, int minor) {
    struct utsname name;
    if (uname(&name) != 0) return false;
    int found_major = 0, found_minor = 0;
    if (sscanf(name.release, "%d.%d", &found_major, &found_minor) != 2) return false;
    return found_major > major || (found_major == major && found_minor >= minor);
}

/// Whether the ring's kernel has every operation the ring uses (IORING_REGISTER_PROBE).
static bool has_operations(int fd) {
    size_t length = sizeof(struct io_uring_probe) + 256 * sizeof(struct io_uring_probe_op);
    struct io_uring_probe *probe = calloc(1, length);
    if (probe == NULL) return false;
    bool ok = syscall(SYS_io_uring_register, fd, IORING_REGISTER_PROBE, probe, 256) == 0;
    static const int needed[] = {IORING_OP_SENDMSG, IORING_OP_RECV, IORING_OP_POLL_ADD, IORING_OP_ASYNC_CANCEL};
    for (size_t index = 0; ok && index < sizeof(needed) / sizeof(needed[0]); index++) {
        int op = needed[index];
        ok = op <= probe->last_op && (probe->ops[op].flags & IO_URING_OP_SUPPORTED) != 0;
    }
    free(probe);
    return ok;
}

ipc_ring *ipc_ring_open(int slots) {
    if (slots < 1 || slots > 1024) {
        errno = EINVAL;
        return NULL;
    }
    // Sends and receives that the kernel retries until MSG_WAITALL is met, and a cancelled
    // transfer that reports the bytes it moved, came by Linux 6.1; an older kernel gets the
    // epoll way (ENOSYS).
    if (!kernel_at_least(6, 1)) {
        errno = ENOSYS;
        return NULL;
    }
    ipc_ring *ring = calloc(1, sizeof(*ring));
    if (ring == NULL) return NULL;
    ring->fd = -1;
    ring->slot_count = slots;
    ring->slots = calloc((size_t)slots, sizeof(struct send_slot));
    if (ring->slots == NULL) goto failed;
    struct io_uring_params parameters;
    memset(&parameters, 0, sizeof(parameters));
    // Room for every slot's transfer, a cancellation of each and the poll request; the completion
    // queue is twice that.
    ring->fd = (int)syscall(SYS_io_uring_setup, (unsigned)(2 * slots + 1), &parameters);
    if (ring->fd < 0) goto failed;
    if (!has_operations(ring->fd)) {
        errno = ENOSYS;
        goto failed;
    }
    // One mapping for both rings (every kernel with MSG_WAITALL sends has IORING_FEAT_SINGLE_MMAP).
    if ((parameters.features & IORING_FEAT_SINGLE_MMAP) == 0) {
        errno = ENOSYS;
        goto failed;
    }
    ring->sq_entries = parameters.sq_entries;
    size_t sq_length = parameters.sq_off.array + parameters.sq_entries * sizeof(unsigned);
    size_t cq_length = parameters.cq_off.cqes + parameters.cq_entries * sizeof(struct io_uring_cqe);
    ring->rings_length = sq_length > cq_length ? sq_length : cq_length;
    ring->rings = mmap(NULL, ring->rings_length, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, ring->fd, IORING_OFF_SQ_RING);
    if (ring->rings == MAP_FAILED) goto failed;
    ring->sqes_length = parameters.sq_entries * sizeof(struct io_uring_sqe);
    ring->sqes = mmap(NULL, ring->sqes_length, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, ring->fd, IORING_OFF_SQES);
    if (ring->sqes == MAP_FAILED) goto failed;
    unsigned char *base = ring->rings;
    ring->sq_head = (unsigned *)(base + parameters.sq_off.head);
    ring->sq_tail = (unsigned *)(base + parameters.sq_off.tail);
    ring->sq_mask = (unsigned *)(base + parameters.sq_off.ring_mask);
    ring->sq_array = (unsigned *)(base + parameters.sq_off.array);
    ring->cq_head = (unsigned *)(base + parameters.cq_off.head);
    ring->cq_tail = (unsigned *)(base + parameters.cq_off.tail);
    ring->cq_mask = (unsigned *)(base + parameters.cq_off.ring_mask);
    ring->cqes = (struct io_uring_cqe *)(base + parameters.cq_off.cqes);
    return ring;
failed:;
    int error = errno;
    ipc_ring_close(ring);
    errno = error;
    return NULL;
}

/// Queues one entry, zeroed, for the caller to fill; submitted by `submit_one`.
static struct io_uring_sqe *next_entry(ipc_ring *ring) {
    unsigned tail = *ring->sq_tail;
    unsigned head = atomic_load_explicit((_Atomic unsigned *)ring->sq_head, memory_order_acquire);
    if (tail - head >= ring->sq_entries) return NULL;
    unsigned index = tail & *ring->sq_mask;
    struct io_uring_sqe *entry = &ring->sqes[index];
    memset(entry, 0, sizeof(*entry));
    ring->sq_array[index] = index;
    return entry;
}

/// After io_uring_enter: what the kernel has not taken stays queued. It takes entries in order,
/// so if any is left, the newest (the caller's) is among them: it is withdrawn (nothing was
/// submitted for it) and `withdrawn` says so.
static void settle_queue(ipc_ring *ring, bool *withdrawn) {
    unsigned head = atomic_load_explicit((_Atomic unsigned *)ring->sq_head, memory_order_acquire);
    unsigned tail = *ring->sq_tail;
    *withdrawn = false;
    if (tail != head) {
        atomic_store_explicit((_Atomic unsigned *)ring->sq_tail, tail - 1, memory_order_release);
        tail--;
        *withdrawn = true;
    }
    ring->queued = tail - head;
}

/// Submits the entry just filled (and any queued before it). Returns 0 if the kernel took it, or
/// -1 with errno if it did not (it is then withdrawn).
static int submit_one(ipc_ring *ring) {
    atomic_store_explicit((_Atomic unsigned *)ring->sq_tail, *ring->sq_tail + 1, memory_order_release);
    ring->queued++;
    for (;;) {
        int result = (int)syscall(SYS_io_uring_enter, ring->fd, ring->queued, 0, 0, NULL, 0);
        if (result < 0 && errno == EINTR) continue;
        int error = result < 0 ? errno : EAGAIN;
        bool withdrawn;
        settle_queue(ring, &withdrawn);
        if (!withdrawn) return 0;
        errno = error;
        return -1;
    }
}

/// A free slot, or -1 with errno EBUSY.
static int free_slot(ipc_ring *ring) {
    for (int index = 0; index < ring->slot_count; index++) {
        if (!ring->slots[index].busy) return index;
    }
    errno = EBUSY;
    return -1;
}

int ipc_ring_send(ipc_ring *ring, int fd, const void *head, size_t head_length, const void *payload, size_t payload_length) {
    int slot_index = free_slot(ring);
    if (slot_index < 0) return -1;
    struct send_slot *slot = &ring->slots[slot_index];
    if (head_length > slot->head_capacity) {
        unsigned char *grown = realloc(slot->head, head_length);
        if (grown == NULL) return -1;
        slot->head = grown;
        slot->head_capacity = head_length;
    }
    struct io_uring_sqe *entry = next_entry(ring);
    if (entry == NULL) {
        errno = EBUSY;
        return -1;
    }
    int count = 0;
    if (head_length > 0) {
        memcpy(slot->head, head, head_length);
        slot->vector[count++] = (struct iovec){slot->head, head_length};
    }
    if (payload_length > 0) slot->vector[count++] = (struct iovec){(void *)payload, payload_length};
    memset(&slot->message, 0, sizeof(slot->message));
    slot->message.msg_iov = slot->vector;
    slot->message.msg_iovlen = (size_t)count;
    entry->opcode = IORING_OP_SENDMSG;
    entry->fd = fd;
    entry->addr = (uint64_t)(uintptr_t)&slot->message;
    entry->len = 1;
    // MSG_WAITALL: the kernel sends the rest each time the socket has room, and completes once
    // all of it went, or with a short count if the connection broke or the kernel stopped short.
    entry->msg_flags = MSG_NOSIGNAL | MSG_WAITALL;
    entry->user_data = (uint64_t)slot_index + 1;
    if (submit_one(ring) != 0) return -1;
    slot->busy = true;
    ring->in_flight++;
    return slot_index;
}

int ipc_ring_receive(ipc_ring *ring, int fd, void *buffer, size_t length) {
    if (length > UINT32_MAX) {
        errno = EINVAL;
        return -1;
    }
    int slot_index = free_slot(ring);
    if (slot_index < 0) return -1;
    struct io_uring_sqe *entry = next_entry(ring);
    if (entry == NULL) {
        errno = EBUSY;
        return -1;
    }
    entry->opcode = IORING_OP_RECV;
    entry->fd = fd;
    entry->addr = (uint64_t)(uintptr_t)buffer;
    entry->len = (unsigned)length;
    // MSG_WAITALL: the kernel completes once `length` bytes came, or the stream ended or broke
    // (fewer then).
    entry->msg_flags = MSG_WAITALL;
    entry->user_data = (uint64_t)slot_index + 1;
    if (submit_one(ring) != 0) return -1;
    ring->slots[slot_index].busy = true;
    ring->in_flight++;
    return slot_index;
}

int ipc_ring_in_flight(const ipc_ring *ring) { return ring->in_flight; }

void ipc_ring_release(ipc_ring *ring, int slot) {
    if (slot < 0 || slot >= ring->slot_count || !ring->slots[slot].busy) return;
    ring->slots[slot].busy = false;
    ring->in_flight--;
}

int ipc_ring_wait(ipc_ring *ring, int watched) {
    if (!ring->poll_armed) {
        struct io_uring_sqe *entry = next_entry(ring);
        if (entry == NULL) {
            // The loop asks epoll as after any failed wait.
            errno = EBUSY;
            return 1;
        }
        entry->opcode = IORING_OP_POLL_ADD;
        entry->fd = watched;
        entry->poll32_events = POLLIN;
        entry->user_data = POLL_TAG;
        atomic_store_explicit((_Atomic unsigned *)ring->sq_tail, *ring->sq_tail + 1, memory_order_release);
        ring->queued++;
        ring->poll_armed = true;
    }
    unsigned head = *ring->cq_head;
    unsigned tail = atomic_load_explicit((_Atomic unsigned *)ring->cq_tail, memory_order_acquire);
    // Completions already there: no wait, but the poll request still goes in.
    unsigned wait = head == tail ? 1 : 0;
    int result = (int)syscall(SYS_io_uring_enter, ring->fd, ring->queued, wait, wait ? IORING_ENTER_GETEVENTS : 0, NULL, 0);
    int error = errno;
    // What the kernel did not take stays queued for the next call (the poll request included).
    ring->queued = *ring->sq_tail - atomic_load_explicit((_Atomic unsigned *)ring->sq_head, memory_order_acquire);
    if (result < 0) {
        // EINTR (a signal) or a refusal: the caller asks epoll as after any wait.
        errno = error;
        return 1;
    }
    // The kernel took less than was queued (short of memory), and then did not wait: the poll
    // request may be among what it left, so nothing watches epoll's descriptor; the caller asks.
    if (ring->queued > 0) return 1;
    // Only the poll's completion says the epoll descriptor was readable. One that came after
    // an earlier wait and was reaped with its round's transfers is not lost: the descriptor stays
    // readable until epoll_wait takes its events (the loop's registrations are level-triggered,
    // and an edge-triggered one's event waits in epoll's ready list), so the poll armed next
    // completes at once.
    tail = atomic_load_explicit((_Atomic unsigned *)ring->cq_tail, memory_order_acquire);
    for (; head != tail; head++) {
        if (ring->cqes[head & *ring->cq_mask].user_data == POLL_TAG) return 1;
    }
    return 0;
}

int ipc_ring_cancel(ipc_ring *ring, int slot) {
    if (slot < 0 || slot >= ring->slot_count || !ring->slots[slot].busy) {
        errno = ENOENT;
        return -1;
    }
    struct io_uring_sqe *entry = next_entry(ring);
    if (entry == NULL) {
        errno = EBUSY;
        return -1;
    }
    entry->opcode = IORING_OP_ASYNC_CANCEL;
    entry->fd = -1;
    entry->addr = (uint64_t)slot + 1;
    entry->user_data = CANCEL_TAG;
    return submit_one(ring);
}

int ipc_ring_reap(ipc_ring *ring, int *slots, int *results, int capacity) {
    unsigned head = *ring->cq_head;
    unsigned tail = atomic_load_explicit((_Atomic unsigned *)ring->cq_tail, memory_order_acquire);
    int count = 0;
    while (head != tail && count < capacity) {
        struct io_uring_cqe *completion = &ring->cqes[head & *ring->cq_mask];
        head++;
        uint64_t tag = completion->user_data;
        if (tag == POLL_TAG) {
            ring->poll_armed = false;
            continue;
        }
        if (tag == CANCEL_TAG || tag > (uint64_t)ring->slot_count) continue;
        // The slot stays taken until the caller releases it (ipc_ring_release), so that no
        // transfer started while this batch is handled takes the slot of one not yet handled.
        int slot = (int)(tag - 1);
        slots[count] = slot;
        results[count] = completion->res;
        count++;
    }
    atomic_store_explicit((_Atomic unsigned *)ring->cq_head, head, memory_order_release);
    return count;
}
