// A native floor's instructions a round trip, each side, for callgrind: the responder is a forked
// child and both processes hold a second, idle thread, as ipcbench's and its floor peer's do
// (glibc brackets its cancellable wrappers only in a process with more than one thread).
// (With FLOOR_COUNT_ONE_THREAD=1 in the environment, neither makes it.)
// Built from a tree's Sources/CNativeFloor by floor-count.sh, which runs it under callgrind with
// two round-trip counts and takes the difference.
//
//   floor-count MECHANISM_NAME ROUND_TRIPS          (64-byte payloads, both on the calling CPU)
#define _GNU_SOURCE
#include "native_floor.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static void *idle(void *unused) {
    (void)unused;
    for (;;) pause();
    return NULL;
}

static void second_thread(void) {
    // FLOOR_COUNT_ONE_THREAD=1: no second thread, to count what a single-threaded process pays.
    const char *one = getenv("FLOOR_COUNT_ONE_THREAD");
    if (one != NULL && strcmp(one, "1") == 0) return;
    pthread_t thread;
    if (pthread_create(&thread, NULL, idle, NULL) != 0) abort();
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: floor-count MECHANISM_NAME ROUND_TRIPS\n");
        return 64;
    }
    nf_mechanism mechanism = 0;
    while (nf_mechanism_name(mechanism) != NULL && strcmp(nf_mechanism_name(mechanism), argv[1]) != 0) mechanism++;
    if (nf_mechanism_name(mechanism) == NULL) {
        fprintf(stderr, "unknown mechanism %s\n", argv[1]);
        return 64;
    }
    long trips = strtol(argv[2], NULL, 10);
    char directory[] = "/tmp/floor-count-XXXXXX";
    if (mkdtemp(directory) == NULL) return 1;
    int ready[2];
    if (pipe(ready) != 0) return 1;
    pid_t child = fork();
    if (child == 0) {
        second_thread();
        nf_channel *channel = nf_responder_create(mechanism, directory, 64);
        if (channel == NULL) _exit(2);
        if (write(ready[1], "r", 1) != 1) _exit(3);
        int status = nf_responder_serve(channel);
        nf_close(channel);
        _exit(status == 0 ? 0 : 4);
    }
    char byte;
    if (read(ready[0], &byte, 1) != 1) return 1;
    second_thread();
    nf_channel *channel = nf_initiator_open(mechanism, directory, 64, child);
    if (channel == NULL) return 2;
    unsigned char request[64] = {1}, reply[64];
    for (long trip = 0; trip < trips; trip++) {
        if (nf_round_trip(channel, request, reply, sizeof(request)) != 0) {
            perror("nf_round_trip");
            return 3;
        }
    }
    nf_close(channel);
    int status;
    waitpid(child, &status, 0);
    rmdir(directory);
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 4;
}
