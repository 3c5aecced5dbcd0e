#ifndef IPCBENCH_SHIMS_H
#define IPCBENCH_SHIMS_H

#include <sys/types.h>

/// pidfd_open(2): Glibc exports no wrapper, and syscall(2) is variadic, which Swift cannot call.
int ipc_pidfd_open(pid_t pid, unsigned int flags);

/// Pins the calling thread's process to the given CPUs (CPU_SET is a macro Swift cannot use).
/// Returns 0 or -1 with errno set.
int ipc_set_affinity(pid_t pid, const int *cpus, int count);

/// Writes the CPUs the process may run on into cpus (at most capacity); returns how many, or -1.
int ipc_get_affinity(pid_t pid, int *cpus, int capacity);



#include <sys/socket.h>
#include <pthread.h>

/// accept4(2) and pthread_setname_np(3) are GNU extensions that Glibc's module map hides.
int ipc_accept4(int fd, int flags);
int ipc_set_thread_name(pthread_t thread, const char *name);

/// SO_PEERCRED's struct ucred is hidden behind _GNU_SOURCE too. Returns 0 or -1 with errno set.
int ipc_peer_credentials(int fd, pid_t *pid, uid_t *uid, gid_t *gid);

#include <mqueue.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/timerfd.h>

/// mq_open(3) is variadic. Opens (or with O_CREAT creates, with the given mode and attributes)
/// a POSIX message queue. Returns the descriptor or -1 with errno set.
int ipc_mq_open(const char *name, int flags, unsigned int mode, long max_messages, long message_size);

#include <stdint.h>

/// Atomics and futexes on memory shared between processes (a MAP_SHARED file mapping), which
/// Swift's own atomics cannot address. Loads acquire, stores release, read-modify-writes are
/// sequentially consistent.
uint64_t ipc_atomic_load_u64(const uint64_t *address);
void ipc_atomic_store_u64(uint64_t *address, uint64_t value);
uint32_t ipc_atomic_load_u32(const uint32_t *address);
void ipc_atomic_store_u32(uint32_t *address, uint32_t value);
uint32_t ipc_atomic_fetch_add_u32(uint32_t *address, uint32_t value);
int ipc_atomic_compare_exchange_u32(uint32_t *address, uint32_t expected, uint32_t desired);
uint32_t ipc_atomic_exchange_u32(uint32_t *address, uint32_t value);
/// A sequentially consistent fence: no load after it is performed before a store before it.
void ipc_atomic_fence(void);

/// FUTEX_WAIT (shared, not private): sleeps while *address == expected, at most timeout_ns
/// (negative: no limit). Returns 0 when woken, or -1 with errno ETIMEDOUT, EAGAIN (the value
/// already differed) or EINTR.
int ipc_futex_wait(uint32_t *address, uint32_t expected, int64_t timeout_ns);
/// FUTEX_WAKE: wakes up to count waiters; returns how many were woken, or -1.
int ipc_futex_wake(uint32_t *address, int count);

/// FUTEX_WAIT_PRIVATE: ipc_futex_wait for a word in this process's own memory (the kernel
/// keys it by address alone, without looking up the mapping). Same results.
int ipc_futex_wait_private(uint32_t *address, uint32_t expected, int64_t timeout_ns);
/// FUTEX_WAKE_PRIVATE: wakes up to count waiters on a word of this process's own memory.
int ipc_futex_wake_private(uint32_t *address, int count);

/// The waiters flag of a futex counter word: bit 31. The low 31 bits count posts (wrapping);
/// the flag says that a waiter may be asleep on the word, so that a post makes the FUTEX_WAKE
/// system call only then.
#define IPC_FUTEX_COUNTER_WAITERS 0x80000000u

/// Increments the 31-bit count of a futex counter word and clears its waiters flag in one
/// sequentially consistent step; if the flag was set, wakes every waiter. Returns the new count.
uint32_t ipc_futex_counter_post(uint32_t *address);

/// Sleeps while the count of a futex counter word equals seen, at most timeout_ns (negative: no
/// limit): sets the waiters flag (compare-and-swap, sequentially consistent) and then waits with
/// FUTEX_WAIT on the flagged value, so a post between the check and the sleep changes the word and
/// the wait returns at once. Returns the count then held (it may still equal seen after a timeout
/// or a wake without a post).
uint32_t ipc_futex_counter_wait(uint32_t *address, uint32_t seen, int64_t timeout_ns);

/// The most counters ipc_futex_counters_wait takes (the kernel's FUTEX_WAITV_MAX).
#define IPC_FUTEX_COUNTERS_MAX 128

/// ipc_futex_counter_wait for up to IPC_FUTEX_COUNTERS_MAX counters at once (futex_waitv, Linux
/// 5.16 and later): sleeps while every counter's count equals its seen value, setting each one's
/// waiters flag first. Returns 1 if a count already differed (no sleep), 0 after a sleep that a
/// wake, a change or the timeout ended, -1 with errno ENOSYS where the kernel has no futex_waitv
/// (the caller then sleeps another way), or -1 with another errno.
int ipc_futex_counters_wait(uint32_t *const *addresses, const uint32_t *seen, int count, int64_t timeout_ns);

/// Tells the CPU that the caller is spinning (x86 `pause`, ARM `yield`): it slows the loop a
/// little and frees the core's shared resources for a sibling hyperthread. Not a system call.
static inline void ipc_cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/// Open file description locks (F_OFD_SETLK) are a GNU extension that Glibc's module map hides.
/// Takes (type F_RDLCK or F_WRLCK) or releases (F_UNLCK) a lock on the whole file without
/// waiting. Returns 0, or -1 with errno set (EAGAIN while another description holds a
/// conflicting lock).
int ipc_ofd_lock(int fd, short type);

/// O_TMPFILE is hidden too: opens an unnamed regular file, read-write, close-on-exec, in
/// directory. Returns the descriptor or -1 with errno set.
int ipc_open_unnamed_file(const char *directory);

/// Descriptors over an AF_UNIX socket (SCM_RIGHTS; the CMSG_* macros are not callable from
/// Swift). Sends length bytes of data with count descriptors in one sendmsg (MSG_NOSIGNAL).
/// Returns the bytes sent or -1 with errno set.
long ipc_send_with_descriptors(int socket, const void *data, unsigned long length, const int *fds, int count);

/// Receives at most capacity bytes and at most fd_capacity descriptors in one recvmsg
/// (MSG_DONTWAIT | MSG_CMSG_CLOEXEC). Stores the descriptors received in fds and their number
/// in fd_count. Returns the bytes received (0 at end of stream) or -1 with errno set; when the
/// sender passed more descriptors than fit (MSG_CTRUNC), closes every one received and fails
/// with EMSGSIZE, so that none leaks.
long ipc_receive_with_descriptors(int socket, void *data, unsigned long capacity, int *fds, int fd_capacity, int *fd_count);

/// memfd_create(2) with MFD_CLOEXEC | MFD_ALLOW_SEALING: an anonymous shared-memory file whose
/// size can be sealed. Returns the descriptor or -1 with errno set.
int ipc_memfd_create_sealable(const char *name);

/// Seals a memfd's size (F_SEAL_SHRINK | F_SEAL_GROW) and its seals (F_SEAL_SEAL): nobody, the
/// creator included, can truncate or grow it from now on, so a mapping of it can never fault
/// with SIGBUS. Returns 0 or -1 with errno set.
int ipc_seal_size(int fd);

/// Whether fd is a memfd whose size is sealed against shrinking and growing: 1 if so, 0 if not,
/// -1 with errno set if its seals cannot be read (it is not a memfd).
int ipc_size_is_sealed(int fd);

/// Whether fd is an eventfd (its /proc/self/fd link reads "anon_inode:[eventfd]"): 1, 0, or -1.
int ipc_is_eventfd(int fd);

/// Makes an eventfd created elsewhere non-blocking (so that a write to a full counter fails
/// with EAGAIN instead of blocking). Returns 0 or -1.
int ipc_set_nonblocking(int fd);

/// Loads and stores on a shared file mapping that another process may truncate: a page past the
/// file's new end faults with SIGBUS, which would kill the process. These run the access with a
/// SIGBUS handler armed for the calling thread only (installed once, process-wide; a SIGBUS on
/// any other access goes to whatever handled it before, by default ending the process as it
/// would have). Return 0, or -1 if the page is gone (the file was truncated under the mapping).
int ipc_guarded_load_u64(const uint64_t *address, uint64_t *value);
int ipc_guarded_store_u64(uint64_t *address, uint64_t value);
/// Copies count bytes into or out of such a mapping: 0, or -1 if a page of it is gone (part of
/// the copy may have been made).
int ipc_guarded_copy(void *destination, const void *source, size_t count);
int ipc_guarded_load_u32(const uint32_t *address, uint32_t *value);
int ipc_guarded_store_u32(uint32_t *address, uint32_t value);
/// ipc_futex_counter_post, ipc_futex_counter_wait (its result in *value) and
/// ipc_futex_counters_wait on counters in such a mapping: as those, or -1 (-2 for the last, whose
/// own results include -1) if a counter's page is gone.
int ipc_guarded_futex_counter_post(uint32_t *address);
int ipc_guarded_futex_counter_wait(uint32_t *address, uint32_t seen, int64_t timeout_ns, uint32_t *value);
int ipc_guarded_futex_counters_wait(uint32_t *const *addresses, const uint32_t *seen, int count, int64_t timeout_ns);

#include <sys/syscall.h>
/// syscall(2), as <unistd.h> declares it (not included here: its names would then reach Swift
/// through this module rather than Glibc's).
long syscall(long number, ...);

/// The system calls of the message path, made with syscall(2) rather than through their glibc
/// wrappers. Those wrappers are thread-cancellation points: in a process with more than one
/// thread (every process with an event loop) each call is bracketed by
/// __pthread_enable_asynccancel and __pthread_disable_asynccancel, about 30 instructions a call.
/// Nothing in this package cancels a thread (pthread_cancel), so the brackets buy nothing here.
/// Same arguments, results and errno as send(2), sendmsg(2), recv(2), read(2), write(2),
/// epoll_wait(2) (made as epoll_pwait with no signal mask, which every architecture has),
/// mq_timedsend(3) and mq_timedreceive(3) (a null deadline waits without limit, as mq_send and
/// mq_receive).
static inline long ipc_sys_send(int fd, const void *buffer, unsigned long length, int flags) {
    return syscall(SYS_sendto, fd, buffer, length, flags, (void *)0, 0);
}
static inline long ipc_sys_sendmsg(int fd, const struct msghdr *message, int flags) {
    return syscall(SYS_sendmsg, fd, message, flags);
}
static inline long ipc_sys_recvmsg(int fd, struct msghdr *message, int flags) {
    return syscall(SYS_recvmsg, fd, message, flags);
}
static inline long ipc_sys_recv(int fd, void *buffer, unsigned long length, int flags) {
    return syscall(SYS_recvfrom, fd, buffer, length, flags, (void *)0, (void *)0);
}
static inline long ipc_sys_read(int fd, void *buffer, unsigned long length) {
    return syscall(SYS_read, fd, buffer, length);
}
static inline long ipc_sys_write(int fd, const void *buffer, unsigned long length) {
    return syscall(SYS_write, fd, buffer, length);
}
static inline int ipc_sys_epoll_wait(int epoll_fd, struct epoll_event *events, int capacity, int timeout_ms) {
    return (int)syscall(SYS_epoll_pwait, epoll_fd, events, capacity, timeout_ms, (void *)0, 8);
}
static inline int ipc_sys_mq_timedsend(mqd_t queue, const char *message, unsigned long length, unsigned int priority, const struct timespec *deadline) {
    return (int)syscall(SYS_mq_timedsend, queue, message, length, priority, deadline);
}
static inline long ipc_sys_mq_timedreceive(mqd_t queue, char *buffer, unsigned long capacity, unsigned int *priority, const struct timespec *deadline) {
    return syscall(SYS_mq_timedreceive, queue, buffer, capacity, priority, deadline);
}

/// The native floor's (CNativeFloor's) other message-path calls, made the same way so that a
/// floor costs no more than its kernel path: readv(2), writev(2), and poll(2) (SYS_poll, as
/// glibc makes it, where the architecture has it; else ppoll with no signal mask, a negative
/// timeout waiting without limit).
struct iovec;
struct pollfd;
static inline long ipc_sys_readv(int fd, const struct iovec *vector, int count) {
    return syscall(SYS_readv, fd, vector, count);
}
static inline long ipc_sys_writev(int fd, const struct iovec *vector, int count) {
    return syscall(SYS_writev, fd, vector, count);
}
static inline int ipc_sys_poll(struct pollfd *entries, unsigned long count, int timeout_ms) {
#ifdef SYS_poll
    return (int)syscall(SYS_poll, entries, count, timeout_ms);
#else
    struct timespec timeout = {.tv_sec = timeout_ms / 1000, .tv_nsec = (long)(timeout_ms % 1000) * 1000000};
    return (int)syscall(SYS_ppoll, entries, count, timeout_ms < 0 ? (struct timespec *)0 : &timeout, (void *)0, 8);
#endif
}

/// The event loop's transfer ring (transfer_ring.c): io_uring sends and receives the kernel
/// finishes, for the rest of a large frame. Used by one thread, the loop's.
typedef struct ipc_ring ipc_ring;
/// A ring for at most `slots` transfers in flight at once (1 to 1024); NULL with errno set if the
/// kernel refuses io_uring (ENOSYS, EPERM where kernel.io_uring_disabled forbids it, ENOMEM).
ipc_ring *ipc_ring_open(int slots);
/// Submits one sendmsg(2) with MSG_WAITALL | MSG_NOSIGNAL on `fd` of `head` (copied now) then
/// `payload` (not copied: it must stay valid, unchanged, until the send's completion is reaped).
/// Returns the transfer's slot, or -1 with errno (EBUSY: every slot is in flight; else the kernel's).
int ipc_ring_send(ipc_ring *ring, int fd, const void *head, size_t head_length, const void *payload, size_t payload_length);
/// Submits one recv(2) with MSG_WAITALL on `fd` of `length` bytes into `buffer`, which must stay
/// valid, and untouched by anyone else, until the receive's completion is reaped. Returns its
/// slot, or -1 with errno.
int ipc_ring_receive(ipc_ring *ring, int fd, void *buffer, size_t length);
/// Transfers submitted whose completion has not been reaped.
int ipc_ring_in_flight(const ipc_ring *ring);
/// Waits in the ring until a completion comes or `watched` (the loop's epoll descriptor) is
/// readable, arming a poll of it first if none is armed; returns at once if completions wait.
/// Returns 1 if `watched` may have events (its poll completed, the kernel did not take the poll
/// request, or the wait failed, errno then set: EINTR is a signal), 0 if only transfers
/// completed and epoll need not be asked.
int ipc_ring_wait(ipc_ring *ring, int watched);
/// Asks the kernel to cancel the transfer in `slot`; its completion still comes (-ECANCELED, or
/// the bytes it moved). Returns 0 or -1 with errno.
int ipc_ring_cancel(ipc_ring *ring, int slot);
/// Takes at most `capacity` completed transfers: their slots and results (the bytes moved, or
/// -errno). Returns how many. Each slot stays taken until ipc_ring_release.
int ipc_ring_reap(ipc_ring *ring, int *slots, int *results, int capacity);
/// Frees the slot of a transfer whose completion was reaped.
void ipc_ring_release(ipc_ring *ring, int slot);
/// Closes the ring. Only with nothing in flight: the kernel may still use a buffer otherwise.
void ipc_ring_close(ipc_ring *ring);

#endif
