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
