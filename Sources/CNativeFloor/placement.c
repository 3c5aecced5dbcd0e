#define _GNU_SOURCE
#include "floor_internal.h"

#include <sched.h>

int nf_pin_calling_thread(int cpu) {
    if (cpu < 0 || cpu >= CPU_SETSIZE) {
        errno = EINVAL;
        return -1;
    }
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    // sched_setaffinity(0, ...) applies to the calling thread only.
    return sched_setaffinity(0, sizeof(set), &set);
}
