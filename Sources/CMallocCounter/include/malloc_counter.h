#ifndef IPCBENCH_MALLOC_COUNTER_H
#define IPCBENCH_MALLOC_COUNTER_H

#include <stdint.h>

/// Heap allocations (malloc, calloc, realloc, posix_memalign, aligned_alloc, memalign, valloc)
/// made so far by the calling thread. Linked only into the ipcbench executable, which then
/// replaces the C library's allocation functions with counting ones that forward to glibc's
/// (`__libc_malloc` and the rest), for every library in the process: what the in-process
/// measurements report as allocations per operation.
uint64_t ipc_thread_allocation_count(void);

#endif
