#define _GNU_SOURCE
#include "shims.h"

#include <sched.h>
#include <sys/syscall.h>
#include <fcntl.h>
#include <unistd.h>

int ipc_pidfd_open(pid_t pid, unsigned int flags) {
    return (int)syscall(SYS_pidfd_open, pid, flags);
}

int ipc_set_affinity(pid_t pid, const int *cpus, int count) {
    cpu_set_t set;
    CPU_ZERO(&set);
    for (int i = 0; i < count; i++) {
        CPU_SET(cpus[i], &set);
    }
    return sched_setaffinity(pid, sizeof(set), &set);
}

int ipc_get_affinity(pid_t pid, int *cpus, int capacity) {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(pid, sizeof(set), &set) != 0) {
        return -1;
    }
    int count = 0;
    for (int cpu = 0; cpu < CPU_SETSIZE && count < capacity; cpu++) {
        if (CPU_ISSET(cpu, &set)) {
            cpus[count++] = cpu;
        }
    }
    return count;
}

int ipc_accept4(int fd, int flags) {
    return accept4(fd, NULL, NULL, flags);
}

int ipc_set_thread_name(pthread_t thread, const char *name) {
    return pthread_setname_np(thread, name);
}

int ipc_peer_credentials(int fd, pid_t *pid, uid_t *uid, gid_t *gid) {
    struct ucred credentials;
    socklen_t length = sizeof(credentials);
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &credentials, &length) != 0) {
        return -1;
    }
    *pid = credentials.pid;
    *uid = credentials.uid;
    *gid = credentials.gid;
    return 0;
}

int ipc_mq_open(const char *name, int flags, unsigned int mode, long max_messages, long message_size) {
    if (flags & O_CREAT) {
        struct mq_attr attributes = {0};
        attributes.mq_maxmsg = max_messages;
        attributes.mq_msgsize = message_size;
        return (int)mq_open(name, flags, (mode_t)mode, &attributes);
    }
    return (int)mq_open(name, flags);
}

#include <linux/futex.h>
#include <stdint.h>
#include <time.h>

uint64_t ipc_atomic_load_u64(const uint64_t *address) {
    return __atomic_load_n(address, __ATOMIC_ACQUIRE);
}

void ipc_atomic_store_u64(uint64_t *address, uint64_t value) {
    __atomic_store_n(address, value, __ATOMIC_RELEASE);
}

uint32_t ipc_atomic_load_u32(const uint32_t *address) {
    return __atomic_load_n(address, __ATOMIC_ACQUIRE);
}

void ipc_atomic_store_u32(uint32_t *address, uint32_t value) {
    __atomic_store_n(address, value, __ATOMIC_RELEASE);
}

uint32_t ipc_atomic_fetch_add_u32(uint32_t *address, uint32_t value) {
    return __atomic_fetch_add(address, value, __ATOMIC_SEQ_CST);
}

int ipc_atomic_compare_exchange_u32(uint32_t *address, uint32_t expected, uint32_t desired) {
    return __atomic_compare_exchange_n(address, &expected, desired, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
}

int ipc_futex_wait(uint32_t *address, uint32_t expected, int64_t timeout_ns) {
    struct timespec timeout;
    struct timespec *relative = NULL;
    if (timeout_ns >= 0) {
        timeout.tv_sec = timeout_ns / 1000000000;
        timeout.tv_nsec = timeout_ns % 1000000000;
        relative = &timeout;
    }
    return (int)syscall(SYS_futex, address, FUTEX_WAIT, expected, relative, NULL, 0);
}

int ipc_futex_wake(uint32_t *address, int count) {
    return (int)syscall(SYS_futex, address, FUTEX_WAKE, count, NULL, NULL, 0);
}

uint32_t ipc_futex_counter_post(uint32_t *address) {
    uint32_t old = __atomic_load_n(address, __ATOMIC_RELAXED);
    uint32_t next;
    do {
        next = (old + 1) & ~IPC_FUTEX_COUNTER_WAITERS;
    } while (!__atomic_compare_exchange_n(address, &old, next, 1, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED));
    // Only the post that clears the flag wakes; a waiter that arrives later sets it again
    // against the new count. Every waiter sleeps on a flagged value, so none is left asleep.
    if (old & IPC_FUTEX_COUNTER_WAITERS) {
        ipc_futex_wake(address, INT32_MAX);
    }
    return next;
}

uint32_t ipc_futex_counter_wait(uint32_t *address, uint32_t seen, int64_t timeout_ns) {
    uint32_t current = __atomic_load_n(address, __ATOMIC_SEQ_CST);
    while ((current & ~IPC_FUTEX_COUNTER_WAITERS) == (seen & ~IPC_FUTEX_COUNTER_WAITERS)) {
        if (!(current & IPC_FUTEX_COUNTER_WAITERS)) {
            uint32_t flagged = current | IPC_FUTEX_COUNTER_WAITERS;
            if (!__atomic_compare_exchange_n(address, &current, flagged, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
                continue; // current now holds the word as it changed: check it again
            }
            current = flagged;
        }
        // Returns at once (EAGAIN) if a post changed the word since it was read.
        ipc_futex_wait(address, current, timeout_ns);
        break;
    }
    return __atomic_load_n(address, __ATOMIC_ACQUIRE) & ~IPC_FUTEX_COUNTER_WAITERS;
}

int ipc_ofd_lock(int fd, short type) {
    struct flock lock = {0};
    lock.l_type = type;
    lock.l_whence = SEEK_SET;
    return fcntl(fd, F_OFD_SETLK, &lock);
}

int ipc_open_unnamed_file(const char *directory) {
    return open(directory, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
}
