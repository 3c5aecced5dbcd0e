// What a one-way stream of large messages costs each side, user and system time apart, written
// and read as the `unix-stream+epoll` floor does: the sender writes each message (a 20-byte
// header and the payload, one `sendmsg` of two segments) without blocking and, when the socket
// is full, adds EPOLLOUT, waits in `epoll_wait`, removes it and writes the rest; the receiver
// waits in `epoll_wait` before each `read` of up to 1 MiB into the start of its buffer. Two
// processes over a socketpair, both on the CPUs `taskset` gives them. Prints messages a second
// and, per message, each side's user and system CPU time (getrusage) and its voluntary and
// involuntary context switches. With a send-buffer size, the sender sets SO_SNDBUF to it first
// (the kernel doubles it, at most net.core.wmem_max doubled) and prints what it got.
// With --frames the receiver does what a message receiver must: it puts each message whole in
// one place, reading header and payload into one buffer of their size (the same buffer for
// every message, and no read past a message's end), instead of draining the stream into the
// start of its buffer.
// The C side of docs/ENGINE.md, "Where the large streams' time goes". Not built by the package:
//
//   cc -O2 -o /tmp/stream-cost Benchmarks/StreamCost/stream-cost.c
//   taskset -c 0 /tmp/stream-cost [--frames] <payload bytes> <messages> [send buffer bytes]
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

enum { HEADER = 20, READ_SIZE = 1 << 20 };

static void fail(const char *what) {
    perror(what);
    exit(1);
}

static long parse(const char *text, const char *name, long minimum, long maximum) {
    char *end;
    errno = 0;
    long value = strtol(text, &end, 10);
    if (errno != 0 || *end != '\0' || end == text || value < minimum || value > maximum) {
        fprintf(stderr, "stream-cost: %s must be a whole number from %ld to %ld, not '%s'\n", name, minimum, maximum, text);
        exit(2);
    }
    return value;
}

/// Each side's figures per message: user and system microseconds, voluntary and involuntary switches.
static void report(const char *side, long messages) {
    struct rusage usage;
    if (getrusage(RUSAGE_SELF, &usage) != 0) fail("getrusage");
    printf("%s: user %.2f µs, system %.2f µs, switches %.3f voluntary + %.3f involuntary, per message\n", side,
           (usage.ru_utime.tv_sec * 1e6 + usage.ru_utime.tv_usec) / messages, (usage.ru_stime.tv_sec * 1e6 + usage.ru_stime.tv_usec) / messages,
           (double)usage.ru_nvcsw / messages, (double)usage.ru_nivcsw / messages);
    fflush(stdout);
}

static void wait_for(int poller, int fd) {
    struct epoll_event event;
    int count;
    do {
        count = epoll_wait(poller, &event, 1, -1);
    } while (count < 0 && errno == EINTR);
    if (count != 1 || event.data.fd != fd) fail("epoll_wait");
}

static void receive(int fd, size_t payload, long messages, int frames) {
    int poller = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event event = {.events = EPOLLIN, .data.fd = fd};
    if (poller < 0 || epoll_ctl(poller, EPOLL_CTL_ADD, fd, &event) != 0) fail("epoll (receiver)");
    // --frames: one message's header and payload, at the offset the bytes have in their message.
    size_t frame = HEADER + payload;
    unsigned char *buffer = malloc(frames ? frame : READ_SIZE);
    if (buffer == NULL) fail("malloc");
    size_t remaining = (size_t)messages * frame;
    while (remaining > 0) {
        wait_for(poller, fd);
        size_t at = frames ? frame - (remaining - 1) % frame - 1 : 0;
        size_t wanted = frames ? frame - at : (remaining < READ_SIZE ? remaining : READ_SIZE);
        ssize_t count = read(fd, buffer + at, wanted);
        if (count < 0 && (errno == EAGAIN || errno == EINTR)) continue;
        if (count <= 0) {
            fprintf(stderr, "stream-cost: the stream ended %zu bytes early\n", remaining);
            exit(1);
        }
        remaining -= (size_t)count;
    }
    report("receiver", messages);
    // The sender's signal that everything was read.
    if (write(fd, "", 1) != 1) fail("write (receiver)");
}

static void send_all(int fd, int poller, size_t payload_length, const unsigned char *payload, long messages) {
    unsigned char header[HEADER];
    memset(header, 0, sizeof header);
    memcpy(header, &payload_length, sizeof(uint32_t));
    for (long index = 0; index < messages; index++) {
        size_t done = 0, total = HEADER + payload_length;
        while (done < total) {
            struct iovec vector[2];
            int count = 0;
            if (done < HEADER) vector[count++] = (struct iovec){header + done, HEADER - done};
            size_t from = done > HEADER ? done - HEADER : 0;
            vector[count++] = (struct iovec){(void *)(payload + from), payload_length - from};
            struct msghdr message = {.msg_iov = vector, .msg_iovlen = count};
            ssize_t written = sendmsg(fd, &message, MSG_NOSIGNAL);
            if (written >= 0) {
                done += (size_t)written;
                continue;
            }
            if (errno == EINTR) continue;
            if (errno != EAGAIN) fail("sendmsg");
            struct epoll_event event = {.events = EPOLLOUT, .data.fd = fd};
            if (epoll_ctl(poller, EPOLL_CTL_ADD, fd, &event) != 0) fail("epoll_ctl (add)");
            wait_for(poller, fd);
            if (epoll_ctl(poller, EPOLL_CTL_DEL, fd, NULL) != 0) fail("epoll_ctl (delete)");
        }
    }
}

int main(int argc, char **argv) {
    int frames = argc > 1 && strcmp(argv[1], "--frames") == 0;
    argc -= frames;
    argv += frames;
    if (argc < 3 || argc > 4) {
        fprintf(stderr, "usage: stream-cost [--frames] <payload bytes> <messages> [send buffer bytes]\n");
        return 2;
    }
    size_t payload_length = (size_t)parse(argv[1], "the payload", 1, 64L << 20);
    long messages = parse(argv[2], "the message count", 1, 100000000L);
    int send_buffer = argc == 4 ? (int)parse(argv[3], "the send buffer", 1, 1L << 30) : 0;
    int sockets[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sockets) != 0) fail("socketpair");
    if (send_buffer > 0 && setsockopt(sockets[0], SOL_SOCKET, SO_SNDBUF, &send_buffer, sizeof send_buffer) != 0) fail("SO_SNDBUF");
    int granted = 0;
    socklen_t length = sizeof granted;
    if (getsockopt(sockets[0], SOL_SOCKET, SO_SNDBUF, &granted, &length) != 0) fail("getsockopt");
    fflush(stdout);
    pid_t child = fork();
    if (child < 0) fail("fork");
    if (child == 0) {
        close(sockets[0]);
        receive(sockets[1], payload_length, messages, frames);
        _exit(0);
    }
    close(sockets[1]);
    int fd = sockets[0];
    if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK) != 0) fail("O_NONBLOCK");
    int poller = epoll_create1(EPOLL_CLOEXEC);
    if (poller < 0) fail("epoll_create1");
    unsigned char *payload = malloc(payload_length);
    if (payload == NULL) fail("malloc");
    memset(payload, 0x5A, payload_length);
    struct timespec start, end;
    clock_gettime(CLOCK_MONOTONIC, &start);
    send_all(fd, poller, payload_length, payload, messages);
    // Until the receiver has read everything.
    if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK) != 0) fail("blocking");
    char done;
    if (read(fd, &done, 1) != 1) fail("read (sender)");
    clock_gettime(CLOCK_MONOTONIC, &end);
    int status;
    if (waitpid(child, &status, 0) != child || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "stream-cost: the receiver failed\n");
        return 1;
    }
    double seconds = (end.tv_sec - start.tv_sec) + (end.tv_nsec - start.tv_nsec) * 1e-9;
    printf("%zu-byte payloads, SO_SNDBUF %d, %s: %.0f messages/s\n", payload_length, granted, frames ? "each message read whole into one buffer" : "the stream drained", messages / seconds);
    report("sender", messages);
    return 0;
}
