// Reads `valgrind --tool=lackey --trace-mem=yes` output on standard input and, for each window
// of WINDOW instructions, prints the window's number and the distinct 64-byte lines of code and
// of data it touched. With WINDOW set to 100 round trips' instructions (callgrind's count), the
// steady windows give the lines one round trip's work keeps coming back to (see trace-lines.sh).
//
//   cc -O2 -o trace-lines trace-lines.c
//   valgrind --tool=lackey --trace-mem=yes --log-file=FIFO PROGRAM ... & ./trace-lines WINDOW < FIFO
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#define CAP (1u<<22)
static uint64_t *ti, *td; static uint32_t ni, nd;
static int add(uint64_t *t, uint64_t line) {
    uint64_t h = (line * 0x9E3779B97F4A7C15ull) >> 42; // 22 bits
    for (;;) { h &= CAP-1; if (t[h]==0) { t[h]=line; return 1; } if (t[h]==line) return 0; h++; }
}
int main(int argc, char **argv) {
    if (argc != 2 || atol(argv[1]) <= 0) {
        fprintf(stderr, "usage: %s WINDOW (instructions per window) < lackey trace\n", argv[0]);
        return 64;
    }
    long window = atol(argv[1]);
    ti = calloc(CAP, 8); td = calloc(CAP, 8);
    char buf[256]; long icount = 0; long w = 0;
    while (fgets(buf, sizeof buf, stdin)) {
        char kind; unsigned long addr; unsigned size;
        char *p = buf; while (*p == ' ') p++;
        kind = *p; if (kind!='I' && kind!='L' && kind!='S' && kind!='M') continue;
        if (sscanf(p+1, " %lx,%u", &addr, &size) != 2) continue;
        uint64_t first = addr >> 6, last = (addr + size - 1) >> 6;
        for (uint64_t l = first; l <= last; l++) {
            if (kind == 'I') ni += add(ti, l+1); else nd += add(td, l+1);
        }
        if (kind == 'I' && ++icount == window) {
            printf("%ld %u %u\n", w++, ni, nd);
            memset(ti, 0, CAP*8); memset(td, 0, CAP*8); ni = nd = 0; icount = 0;
        }
    }
    return 0;
}
