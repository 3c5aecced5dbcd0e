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

/// FUTEX_WAIT or FUTEX_WAIT_PRIVATE (op), with a relative timeout (negative: none).
static int futex_wait_op(uint32_t *address, int op, uint32_t expected, int64_t timeout_ns) {
    struct timespec timeout;
    struct timespec *relative = NULL;
    if (timeout_ns >= 0) {
        timeout.tv_sec = timeout_ns / 1000000000;
        timeout.tv_nsec = timeout_ns % 1000000000;
        relative = &timeout;
    }
    return (int)syscall(SYS_futex, address, op, expected, relative, NULL, 0);
}

int ipc_futex_wait(uint32_t *address, uint32_t expected, int64_t timeout_ns) {
    return futex_wait_op(address, FUTEX_WAIT, expected, timeout_ns);
}

int ipc_futex_wake(uint32_t *address, int count) {
    return (int)syscall(SYS_futex, address, FUTEX_WAKE, count, NULL, NULL, 0);
}

int ipc_futex_wait_private(uint32_t *address, uint32_t expected, int64_t timeout_ns) {
    return futex_wait_op(address, FUTEX_WAIT_PRIVATE, expected, timeout_ns);
}

int ipc_futex_wake_private(uint32_t *address, int count) {
    return (int)syscall(SYS_futex, address, FUTEX_WAKE_PRIVATE, count, NULL, NULL, 0);
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

#include <errno.h>

#ifndef SYS_futex_waitv
#define SYS_futex_waitv 449
#endif

int ipc_futex_counters_wait(uint32_t *const *addresses, const uint32_t *seen, int count, int64_t timeout_ns) {
    if (count < 0 || count > IPC_FUTEX_COUNTERS_MAX) {
        errno = EINVAL;
        return -1;
    }
    struct futex_waitv waiters[IPC_FUTEX_COUNTERS_MAX];
    for (int i = 0; i < count; i++) {
        uint32_t current = __atomic_load_n(addresses[i], __ATOMIC_SEQ_CST);
        for (;;) {
            if ((current & ~IPC_FUTEX_COUNTER_WAITERS) != (seen[i] & ~IPC_FUTEX_COUNTER_WAITERS)) return 1;
            if (current & IPC_FUTEX_COUNTER_WAITERS) break;
            uint32_t flagged = current | IPC_FUTEX_COUNTER_WAITERS;
            if (__atomic_compare_exchange_n(addresses[i], &current, flagged, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
                current = flagged;
                break;
            }
        }
        waiters[i].val = current;
        waiters[i].uaddr = (uint64_t)(uintptr_t)addresses[i];
        // Shared (not FUTEX_PRIVATE_FLAG): the counters are in memory other processes map.
        waiters[i].flags = FUTEX_32;
        waiters[i].__reserved = 0;
    }
    struct timespec deadline;
    struct timespec *until = NULL;
    if (timeout_ns >= 0) {
        clock_gettime(CLOCK_MONOTONIC, &deadline);
        int64_t nanoseconds = deadline.tv_nsec + timeout_ns % 1000000000;
        deadline.tv_sec += timeout_ns / 1000000000 + nanoseconds / 1000000000;
        deadline.tv_nsec = nanoseconds % 1000000000;
        until = &deadline;
    }
    // Returns at once (EAGAIN) if a word changed since it was read; any return means "look again".
    long result = syscall(SYS_futex_waitv, waiters, (unsigned int)count, 0, until, CLOCK_MONOTONIC);
    if (result < 0 && errno == ENOSYS) return -1;
    if (result < 0 && errno != EAGAIN && errno != ETIMEDOUT && errno != EINTR) return -1;
    return 0;
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

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

long ipc_send_with_descriptors(int socket, const void *data, unsigned long length, const int *fds, int count) {
    struct iovec vector = {.iov_base = (void *)data, .iov_len = length};
    union {
        char buffer[CMSG_SPACE(sizeof(int) * 4)];
        struct cmsghdr align;
    } control;
    if (count < 0 || count > 4) {
        errno = EINVAL;
        return -1;
    }
    struct msghdr message = {.msg_iov = &vector, .msg_iovlen = 1};
    if (count > 0) {
        memset(&control, 0, sizeof(control));
        message.msg_control = control.buffer;
        message.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)count);
        struct cmsghdr *header = CMSG_FIRSTHDR(&message);
        header->cmsg_level = SOL_SOCKET;
        header->cmsg_type = SCM_RIGHTS;
        header->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)count);
        memcpy(CMSG_DATA(header), fds, sizeof(int) * (size_t)count);
    }
    ssize_t sent;
    do {
        sent = sendmsg(socket, &message, MSG_NOSIGNAL);
    } while (sent < 0 && errno == EINTR);
    return (long)sent;
}

long ipc_receive_with_descriptors(int socket, void *data, unsigned long capacity, int *fds, int fd_capacity, int *fd_count) {
    struct iovec vector = {.iov_base = data, .iov_len = capacity};
    union {
        char buffer[CMSG_SPACE(sizeof(int) * 4)];
        struct cmsghdr align;
    } control;
    *fd_count = 0;
    if (fd_capacity < 0 || fd_capacity > 4) {
        errno = EINVAL;
        return -1;
    }
    struct msghdr message = {.msg_iov = &vector, .msg_iovlen = 1, .msg_control = control.buffer, .msg_controllen = sizeof(control.buffer)};
    ssize_t received;
    do {
        received = recvmsg(socket, &message, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    } while (received < 0 && errno == EINTR);
    if (received < 0) return -1;
    int count = 0;
    int overflow = (message.msg_flags & MSG_CTRUNC) != 0;
    for (struct cmsghdr *header = CMSG_FIRSTHDR(&message); header != NULL; header = CMSG_NXTHDR(&message, header)) {
        if (header->cmsg_level != SOL_SOCKET || header->cmsg_type != SCM_RIGHTS) continue;
        size_t n = (header->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        int *incoming = (int *)CMSG_DATA(header);
        for (size_t i = 0; i < n; i++) {
            int fd;
            memcpy(&fd, incoming + i, sizeof(int));
            if (count < fd_capacity) {
                fds[count++] = fd;
            } else {
                close(fd);
                overflow = 1;
            }
        }
    }
    if (overflow) {
        for (int i = 0; i < count; i++) close(fds[i]);
        errno = EMSGSIZE;
        return -1;
    }
    *fd_count = count;
    return (long)received;
}

int ipc_memfd_create_sealable(const char *name) {
    return memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
}

int ipc_seal_size(int fd) {
    return fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
}

int ipc_size_is_sealed(int fd) {
    int seals = fcntl(fd, F_GET_SEALS);
    if (seals < 0) return -1;
    return (seals & (F_SEAL_SHRINK | F_SEAL_GROW)) == (F_SEAL_SHRINK | F_SEAL_GROW) ? 1 : 0;
}

int ipc_is_eventfd(int fd) {
    char path[64];
    char target[64];
    snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
    ssize_t length = readlink(path, target, sizeof(target) - 1);
    if (length < 0) return -1;
    target[length] = '\0';
    return strcmp(target, "anon_inode:[eventfd]") == 0 ? 1 : 0;
}

int ipc_set_nonblocking(int fd) {
    int flags = fcntl(fd, F_GETFL);
    if (flags < 0) return -1;
    return fcntl(fd, F_SETFL, flags | O_NONBLOCK);
}

uint32_t ipc_atomic_exchange_u32(uint32_t *address, uint32_t value) {
    return __atomic_exchange_n(address, value, __ATOMIC_SEQ_CST);
}

void ipc_atomic_fence(void) {
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
}

#include <setjmp.h>
#include <signal.h>

// The jump of the thread's guarded access, read by the SIGBUS handler. Volatile, and set and
// cleared behind compiler barriers (GUARDED): the handler is invisible to the compiler, which at
// -O2 removed the store before the access as dead (overwritten by the clear after it, with
// nothing it knew of reading it between), so that a release build's guard caught nothing.
static _Thread_local sigjmp_buf *volatile guarded_access;
static struct sigaction previous_sigbus;
static pthread_once_t sigbus_once = PTHREAD_ONCE_INIT;

static void on_sigbus(int signal, siginfo_t *info, void *context) {
    // A fault of the guarded access (si_code > 0: the kernel's, not a SIGBUS another process
    // sent with kill(2), which may arrive while a guard is armed, as during a futex wait).
    sigjmp_buf *target = guarded_access;
    int fault = info != NULL && info->si_code > 0;
    if (target != NULL && fault) {
        guarded_access = NULL;
        siglongjmp(*target, 1);
    }
    // Not a guarded access: hand the signal to what handled it before.
    if (previous_sigbus.sa_flags & SA_SIGINFO) {
        if (previous_sigbus.sa_sigaction != NULL) { previous_sigbus.sa_sigaction(signal, info, context); return; }
    } else if (previous_sigbus.sa_handler != SIG_DFL && previous_sigbus.sa_handler != SIG_IGN && previous_sigbus.sa_handler != NULL) {
        previous_sigbus.sa_handler(signal);
        return;
    }
    // The default action (or ignoring it): a fault returns and runs the access again under it
    // (the process ends as it would have); a sent signal is raised again under it, not lost.
    sigaction(SIGBUS, &previous_sigbus, NULL);
    if (!fault) raise(SIGBUS);
}

static void install_sigbus_handler(void) {
    struct sigaction action;
    memset(&action, 0, sizeof(action));
    action.sa_sigaction = on_sigbus;
    action.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&action.sa_mask);
    sigaction(SIGBUS, &action, &previous_sigbus);
}

// sigsetjmp without saving the signal mask (which costs a system call each time): the handler is
// installed with SA_NODEFER and an empty sa_mask, so the fault changes no mask and the jump back
// has none to restore. GUARDED runs `statements` with the calling thread's SIGBUS jump armed, and
// returns `failure` from the function if they fault.
#define GUARDED(failure, statements)                                    \
    do {                                                                \
        pthread_once(&sigbus_once, install_sigbus_handler);             \
        sigjmp_buf target;                                              \
        if (sigsetjmp(target, 0) != 0) return (failure);                \
        guarded_access = &target;                                       \
        __asm__ __volatile__("" ::: "memory");                          \
        statements;                                                     \
        __asm__ __volatile__("" ::: "memory");                          \
        guarded_access = NULL;                                          \
    } while (0)

int ipc_guarded_load_u64(const uint64_t *address, uint64_t *value) {
    GUARDED(-1, *value = __atomic_load_n(address, __ATOMIC_ACQUIRE));
    return 0;
}

int ipc_guarded_store_u64(uint64_t *address, uint64_t value) {
    GUARDED(-1, __atomic_store_n(address, value, __ATOMIC_RELEASE));
    return 0;
}

int ipc_guarded_copy(void *destination, const void *source, size_t count) {
    GUARDED(-1, memcpy(destination, source, count));
    return 0;
}

int ipc_guarded_load_u32(const uint32_t *address, uint32_t *value) {
    GUARDED(-1, *value = __atomic_load_n(address, __ATOMIC_ACQUIRE));
    return 0;
}

int ipc_guarded_store_u32(uint32_t *address, uint32_t value) {
    GUARDED(-1, __atomic_store_n(address, value, __ATOMIC_RELEASE));
    return 0;
}

int ipc_guarded_futex_counter_post(uint32_t *address) {
    GUARDED(-1, ipc_futex_counter_post(address));
    return 0;
}

int ipc_guarded_futex_counter_wait(uint32_t *address, uint32_t seen, int64_t timeout_ns, uint32_t *value) {
    GUARDED(-1, *value = ipc_futex_counter_wait(address, seen, timeout_ns));
    return 0;
}

int ipc_guarded_futex_counters_wait(uint32_t *const *addresses, const uint32_t *seen, int count, int64_t timeout_ns) {
    int result = 0;
    GUARDED(-2, result = ipc_futex_counters_wait(addresses, seen, count, timeout_ns));
    return result;
}
