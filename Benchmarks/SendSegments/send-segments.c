// What a small message costs the sender in the kernel, written three ways to an AF_UNIX stream
// socket whose other end a thread on another CPU drains: one `send` of a contiguous copy of
// header and payload; one `sendmsg` of header and payload as two segments; one `sendmsg` of the
// copy as one segment. With a batch count above 1, `batch` messages a call: one `send` of their
// copy, or one `sendmsg` of 2 × batch segments. Prints, for each way, the median and the least
// of five rounds of the sending thread's CPU time per call (getrusage, user and system).
// The measurement behind UnixSocketChannel.coalescedFrameLimit and NF_COALESCED_LIMIT
// (docs/ENGINE.md, "Sending"). Not built by the package:
//
//   cc -O2 -o /tmp/send-segments Benchmarks/SendSegments/send-segments.c -lpthread
//   /tmp/send-segments <payload bytes> [batch]      (needs two CPUs)
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

enum { HEADER = 20, CALLS = 200000, ROUNDS = 5, MAX_BATCH = 32 };

static int sockets[2];

static void *drain(void *unused) {
    (void)unused;
    static char buffer[1 << 16];
    while (read(sockets[1], buffer, sizeof buffer) > 0) {}
    return NULL;
}

static double thread_cpu_ns(void) {
    struct rusage usage;
    getrusage(RUSAGE_THREAD, &usage);
    return (usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) * 1e9 + (usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) * 1e3;
}

static int compare(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    if (argc < 2 || argc > 3) {
        fprintf(stderr, "usage: %s <payload bytes> [batch, 1 to %d]\n", argv[0], MAX_BATCH);
        return 64;
    }
    long size = strtol(argv[1], NULL, 10);
    long batch = argc == 3 ? strtol(argv[2], NULL, 10) : 1;
    if (size < 0 || size > 65536 || batch < 1 || batch > MAX_BATCH) {
        fprintf(stderr, "payload bytes must be 0 to 65536 and batch 1 to %d\n", MAX_BATCH);
        return 64;
    }
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sockets) != 0) { perror("socketpair"); return 1; }
    cpu_set_t cpus;
    CPU_ZERO(&cpus);
    CPU_SET(0, &cpus);
    if (sched_setaffinity(0, sizeof cpus, &cpus) != 0) { perror("sched_setaffinity"); return 1; }
    pthread_t reader;
    if (pthread_create(&reader, NULL, drain, NULL) != 0) { perror("pthread_create"); return 1; }
    CPU_ZERO(&cpus);
    CPU_SET(1, &cpus);
    if (pthread_setaffinity_np(reader, sizeof cpus, &cpus) != 0) { fprintf(stderr, "the reader needs CPU 1\n"); return 1; }

    static char header[HEADER], payload[65536], copy[MAX_BATCH * (HEADER + 65536)];
    const char *names[3] = {"one send of a copy", "sendmsg, header and payload segments", "sendmsg of a copy, one segment"};
    int ways = batch == 1 ? 3 : 2;
    double samples[3][ROUNDS];
    for (int round = 0; round < ROUNDS; round++) {
        for (int way = 0; way < ways; way++) {
            double start = thread_cpu_ns();
            for (int call = 0; call < CALLS; call++) {
                struct iovec vectors[2 * MAX_BATCH];
                struct msghdr message = {0};
                size_t length = 0;
                if (way != 1) {
                    for (long index = 0; index < batch; index++) {
                        memcpy(copy + length, header, HEADER);
                        memcpy(copy + length + HEADER, payload, (size_t)size);
                        length += HEADER + (size_t)size;
                    }
                }
                if (way == 0) {
                    if (send(sockets[0], copy, length, MSG_NOSIGNAL) < 0) { perror("send"); return 1; }
                    continue;
                }
                if (way == 1) {
                    for (long index = 0; index < batch; index++) {
                        vectors[2 * index] = (struct iovec){header, HEADER};
                        vectors[2 * index + 1] = (struct iovec){payload, (size_t)size};
                    }
                    message.msg_iovlen = (size_t)(2 * batch);
                } else {
                    vectors[0] = (struct iovec){copy, length};
                    message.msg_iovlen = 1;
                }
                message.msg_iov = vectors;
                if (sendmsg(sockets[0], &message, MSG_NOSIGNAL) < 0) { perror("sendmsg"); return 1; }
            }
            samples[way][round] = (thread_cpu_ns() - start) / CALLS;
        }
    }
    for (int way = 0; way < ways; way++) {
        qsort(samples[way], ROUNDS, sizeof(double), compare);
        printf("%ld × %ld B, %s: median %.0f ns, least %.0f ns per call\n", batch, size, names[way], samples[way][ROUNDS / 2], samples[way][0]);
    }
    shutdown(sockets[0], SHUT_WR);
    pthread_join(reader, NULL);
    return 0;
}
