// A C epoll ping-pong over a unix stream socketpair between two processes (64-byte messages)
// in which each side, after every epoll_wait, re-reads TOUCH cache lines of a private buffer:
// a pointer chase through the same lines every time, in a shuffled order, STRIDE lines apart
// (build with -DSTRIDE=1 for adjacent lines; 4 puts them in a quarter of L1's sets). What a
// wake-up's re-read working set costs a round trip, on one core and on two.
//
//   cc -O2 -DSTRIDE=1 -o touch-ping-pong touch-ping-pong.c
//   ./touch-ping-pong ROUND_TRIPS TOUCH SERVER_CPU CLIENT_CPU
//
// Prints TOUCH and the mean round trip in nanoseconds (the first 2,000 round trips are not timed).
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include <sys/socket.h>
#include <sys/epoll.h>
#include <sys/wait.h>
#include <time.h>
#include <stdint.h>
#include <sched.h>
static void **chain; static long touch;
static void build(long lines) {
    if (!lines) return;
    char *mem = aligned_alloc(64, lines * 64 * STRIDE);
    long *order = malloc(sizeof(long) * lines);
    for (long i = 0; i < lines; i++) order[i] = i * STRIDE; // every 4th line: defeats adjacent-line prefetch
    srand(1);
    for (long i = lines - 1; i > 0; i--) { long j = rand() % (i + 1); long t = order[i]; order[i] = order[j]; order[j] = t; }
    for (long i = 0; i < lines; i++) *(void **)(mem + order[i] * 64) = mem + order[(i + 1) % lines] * 64;
    chain = (void **)(mem + order[0] * 64);
}
void * volatile sink;
static void walk(void) { void **p = chain; for (long i = 0; i < touch; i++) p = *p; sink = p; }
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e9 + t.tv_nsec; }
static void side(int fd, long n, int client) {
    int ep = epoll_create1(0);
    struct epoll_event ev = { .events = EPOLLIN, .data.fd = fd }, out;
    epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
    char buf[64] = {0};
    if (client) send(fd, buf, 64, 0);
    for (long i = 0; i < n; i++) {
        epoll_wait(ep, &out, 1, -1);
        walk();
        recv(fd, buf, 64, 0);
        if (client && i == n - 1) break;
        send(fd, buf, 64, 0);
    }
}
int main(int argc, char **argv) {
    if (argc != 5 || atol(argv[1]) <= 2000 || atol(argv[2]) < 0) {
        fprintf(stderr, "usage: %s ROUND_TRIPS(>2000) TOUCH SERVER_CPU CLIENT_CPU\n", argv[0]);
        return 64;
    }
    long n = atol(argv[1]); touch = atol(argv[2]);
    int cpu_s = atoi(argv[3]), cpu_c = atoi(argv[4]);
    build(touch);
    int sv[2]; socketpair(AF_UNIX, SOCK_STREAM, 0, sv);
    pid_t pid = fork();
    cpu_set_t set; CPU_ZERO(&set); CPU_SET(pid == 0 ? cpu_s : cpu_c, &set); sched_setaffinity(0, sizeof set, &set);
    if (pid == 0) { side(sv[1], n, 0); _exit(0); }
    side(sv[0], 2000, 1); // warm-up
    double t0 = now(); side(sv[0], n - 2000, 1); double t1 = now();
    waitpid(pid, 0, 0);
    printf("%ld %.0f\n", touch, (t1 - t0) / (n - 2000));
    return 0;
}
