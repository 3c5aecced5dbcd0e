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

/// mq_open(3) is variadic. Opens (or with O_CREAT creates, with the given mode and attributes)
/// a POSIX message queue. Returns the descriptor or -1 with errno set.
int ipc_mq_open(const char *name, int flags, unsigned int mode, long max_messages, long message_size);

#endif
