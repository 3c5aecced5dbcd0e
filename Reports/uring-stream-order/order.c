// Do several sends in flight at once on one unix stream socket, through io_uring, keep their
// messages apart? The sender (CPU 0) keeps up to DEPTH IORING_OP_SENDMSG with MSG_WAITALL in
// flight, message i being a 4-byte i and LENGTH bytes of (i & 0xff); the receiver (a child on
// CPU 1, blocking reads) checks every message's header and bytes.
//
//   cc -O2 -o order order.c && ./order LENGTH MESSAGES DEPTH MODE
//   MODE 0: the sends in flight unordered (as unix-stream+io_uring's stream sent them before)
//        1: each submission's sends linked (IOSQE_IO_LINK), the first of a submission drained
//           (IOSQE_IO_DRAIN) behind those still in flight
//        2: each submission's sends linked, and a submission only once the one before it has
//           completed (what the floor does now: a ring that has used IOSQE_CQE_SKIP_SUCCESS,
//           as the floor's round trips do, refuses IOSQE_IO_DRAIN)
// Exit status 1 if the receiver found a message out of place. The rate counts the receiver's
// checks, the same in every mode: compare modes with each other, not with the floors.
#define _GNU_SOURCE
#include <errno.h>
#include <linux/io_uring.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static int ring_fd;
static unsigned *sq_tail, *sq_mask, *sq_array, *cq_head, *cq_tail, *cq_mask;
static struct io_uring_sqe *sqes;
static struct io_uring_cqe *cqes;

static void setup(void) {
    struct io_uring_params p;
    memset(&p, 0, sizeof p);
    p.flags = IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN;
    ring_fd = (int)syscall(SYS_io_uring_setup, 64, &p);
    if (ring_fd < 0) { perror("io_uring_setup"); exit(2); }
    size_t length = p.sq_off.array + p.sq_entries * sizeof(unsigned), cq_length = p.cq_off.cqes + p.cq_entries * sizeof(struct io_uring_cqe);
    if (cq_length > length) length = cq_length;
    char *ring = mmap(0, length, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, ring_fd, IORING_OFF_SQ_RING);
    sqes = mmap(0, p.sq_entries * sizeof(struct io_uring_sqe), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, ring_fd, IORING_OFF_SQES);
    if (ring == MAP_FAILED || sqes == MAP_FAILED) { perror("mmap"); exit(2); }
    sq_tail = (unsigned *)(ring + p.sq_off.tail); sq_mask = (unsigned *)(ring + p.sq_off.ring_mask); sq_array = (unsigned *)(ring + p.sq_off.array);
    cq_head = (unsigned *)(ring + p.cq_off.head); cq_tail = (unsigned *)(ring + p.cq_off.tail); cq_mask = (unsigned *)(ring + p.cq_off.ring_mask);
    cqes = (struct io_uring_cqe *)(ring + p.cq_off.cqes);
}

static void pin(int cpu) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    sched_setaffinity(0, sizeof set, &set);
}

static int receive(int fd, size_t length, int messages) {
    unsigned char *buffer = malloc(length + 4), *expected = malloc(length);
    long bad = 0;
    for (int i = 0; i < messages; i++) {
        for (size_t got = 0; got < length + 4;) {
            ssize_t n = read(fd, buffer + got, length + 4 - got);
            if (n <= 0) { fprintf(stderr, "read: %zd\n", n); return 3; }
            got += (size_t)n;
        }
        uint32_t header;
        memcpy(&header, buffer, 4);
        memset(expected, i & 0xff, length);
        if (header != (uint32_t)i || memcmp(buffer + 4, expected, length) != 0) {
            if (bad++ < 3) fprintf(stderr, "message %d: header %u, first byte %u, last byte %u\n", i, header, length ? buffer[4] : 0, length ? buffer[3 + length] : 0);
        }
    }
    printf("receiver: %d messages, %ld out of place\n", messages, bad);
    return bad ? 1 : 0;
}

int main(int argc, char **argv) {
    if (argc != 5) { fprintf(stderr, "usage: %s LENGTH MESSAGES DEPTH MODE\n", argv[0]); return 64; }
    size_t length = strtoul(argv[1], 0, 10);
    int messages = atoi(argv[2]), depth = atoi(argv[3]), mode = atoi(argv[4]);
    int fds[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, fds) != 0) { perror("socketpair"); return 2; }
    pid_t child = fork();
    if (child == 0) {
        pin(1);
        close(fds[0]);
        _exit(receive(fds[1], length, messages));
    }
    close(fds[1]);
    pin(0);
    setup();
    struct timespec start, end;
    clock_gettime(CLOCK_MONOTONIC, &start);
    struct slot { uint32_t sequence; struct iovec vector[2]; struct msghdr message; unsigned char *payload; int busy; } *slots = calloc((size_t)depth, sizeof *slots);
    for (int s = 0; s < depth; s++) slots[s].payload = malloc(length);
    int next = 0, done = 0, in_flight = 0;
    while (done < messages) {
        unsigned queued = 0;
        struct io_uring_sqe *last = NULL;
        for (int s = 0; s < depth && next < messages; s++) {
            if (slots[s].busy) continue;
            if (mode == 2 && in_flight > 0) break;
            struct slot *slot = &slots[s];
            slot->busy = 1;
            slot->sequence = (uint32_t)next;
            memset(slot->payload, next & 0xff, length);
            slot->vector[0] = (struct iovec){&slot->sequence, 4};
            slot->vector[1] = (struct iovec){slot->payload, length};
            memset(&slot->message, 0, sizeof slot->message);
            slot->message.msg_iov = slot->vector;
            slot->message.msg_iovlen = 2;
            unsigned tail = *sq_tail, index = tail & *sq_mask;
            struct io_uring_sqe *entry = &sqes[index];
            memset(entry, 0, sizeof *entry);
            entry->opcode = IORING_OP_SENDMSG;
            entry->fd = fds[0];
            entry->addr = (uint64_t)(uintptr_t)&slot->message;
            entry->msg_flags = MSG_NOSIGNAL | MSG_WAITALL;
            entry->user_data = (uint64_t)s;
            if (mode >= 1) {
                if (last != NULL) last->flags |= IOSQE_IO_LINK;
                else if (mode == 1 && in_flight > 0) entry->flags |= IOSQE_IO_DRAIN;
                last = entry;
            }
            sq_array[index] = index;
            atomic_store_explicit((_Atomic unsigned *)sq_tail, tail + 1, memory_order_release);
            queued++;
            next++;
        }
        in_flight += (int)queued;
        if (syscall(SYS_io_uring_enter, ring_fd, queued, 1, IORING_ENTER_GETEVENTS, NULL, 0) < 0 && errno != EINTR) { perror("io_uring_enter"); return 2; }
        unsigned head = *cq_head;
        while (head != atomic_load_explicit((_Atomic unsigned *)cq_tail, memory_order_acquire)) {
            struct io_uring_cqe *completion = &cqes[head & *cq_mask];
            if (completion->res != (int)(length + 4)) fprintf(stderr, "send %u: %d\n", slots[completion->user_data].sequence, completion->res);
            slots[completion->user_data].busy = 0;
            done++;
            in_flight--;
            head++;
        }
        atomic_store_explicit((_Atomic unsigned *)cq_head, head, memory_order_release);
    }
    int status;
    waitpid(child, &status, 0);
    clock_gettime(CLOCK_MONOTONIC, &end);
    double seconds = (double)(end.tv_sec - start.tv_sec) + (double)(end.tv_nsec - start.tv_nsec) / 1e9;
    printf("sender: %d messages of %zu bytes, up to %d in flight, mode %d: %.0f messages a second (the receiver checking every byte); receiver's exit status %d\n",
           messages, length, depth, mode, messages / seconds, WEXITSTATUS(status));
    return WEXITSTATUS(status);
}
