// A long one-way stream of the harness's C floors (Sources/CNativeFloor), outside the harness:
// a responder process on SERVER_CPU that sinks, an initiator on CPU 0 that streams COUNT
// messages of BYTES through `nf_stream`, as `ipcbench run` times a floor's repetition, but in
// one repetition as long as asked (the harness's are 64 messages at 1 MiB). Prints messages a
// second and each side's CPU time per message. Built by engine-vs-c.sh:
//
//   cc -O2 -I Sources/CNativeFloor/include -I Sources/CNativeFloor -I Sources/CIPCShims/include
//      -o /tmp/floor-stream Reports/kernel-receive-chain/floor-stream.c Sources/CNativeFloor/*.c
//      Sources/CIPCShims/shims.c -lrt -lpthread        (one command)
//   /tmp/floor-stream MECHANISM SERVER_CPU COUNT BYTES   (MECHANISM: 13 unix-stream+io_uring,
//                                                         5 unix-stream+epoll, 0 unix-stream)
#define _GNU_SOURCE
#include "native_floor.h"
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

static double microseconds_per(const struct timeval *time, size_t count) {
    return (time->tv_sec * 1e6 + time->tv_usec) / (double)count;
}

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: floor-stream MECHANISM SERVER_CPU COUNT BYTES\n");
        return 64;
    }
    nf_mechanism mechanism = (nf_mechanism)atoi(argv[1]);
    int server_cpu = atoi(argv[2]);
    size_t count = strtoul(argv[3], NULL, 10), length = strtoul(argv[4], NULL, 10);
    char directory[] = "/tmp/floor-stream-XXXXXX";
    if (mkdtemp(directory) == NULL) { perror("mkdtemp"); return 1; }
    int ready[2];
    if (pipe(ready) != 0) { perror("pipe"); return 1; }
    pid_t child = fork();
    if (child < 0) { perror("fork"); return 1; }
    if (child == 0) {
        if (nf_pin_calling_thread(server_cpu) != 0) { perror("pin"); _exit(1); }
        nf_channel *channel = nf_responder_create(mechanism, directory, length + 64);
        if (channel == NULL) { perror("responder"); _exit(1); }
        if (write(ready[1], "r", 1) != 1) _exit(1);
        int status = nf_responder_serve(channel);
        struct rusage usage;
        getrusage(RUSAGE_SELF, &usage);
        printf("responder: user %.1f µs, system %.1f µs a message\n", microseconds_per(&usage.ru_utime, count), microseconds_per(&usage.ru_stime, count));
        fflush(stdout);
        nf_close(channel);
        _exit(status == 0 ? 0 : 1);
    }
    char byte;
    if (read(ready[0], &byte, 1) != 1) { fprintf(stderr, "the responder did not start\n"); return 1; }
    if (nf_pin_calling_thread(0) != 0) { perror("pin"); return 1; }
    nf_channel *channel = nf_initiator_open(mechanism, directory, length + 64, child);
    if (channel == NULL) { perror("initiator"); return 1; }
    // A filled payload, as the harness's (0x5A): no page of it is the shared zero page.
    unsigned char *payload = malloc(length > 0 ? length : 1);
    if (payload == NULL) return 1;
    memset(payload, 0x5A, length);
    uint64_t nanoseconds = 0;
    if (nf_stream(channel, payload, length, count, 1, &nanoseconds) != 0) { perror("stream"); return 1; }
    struct rusage usage;
    getrusage(RUSAGE_SELF, &usage);
    fflush(stdout);
    nf_close(channel);
    int status = 0;
    waitpid(child, &status, 0);
    printf("%s: %zu messages of %zu bytes, %.0f messages/s, %.2f µs a message; initiator user %.1f µs, system %.1f µs a message\n",
           nf_mechanism_name(mechanism), count, length, count / (nanoseconds / 1e9), nanoseconds / 1e3 / (double)count,
           microseconds_per(&usage.ru_utime, count), microseconds_per(&usage.ru_stime, count));
    rmdir(directory);
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
}
