// A pair of POSIX message queues, one per direction. A message longer than the queue's message
// size (msgsize_max, 8 KiB by default) travels as several queue messages: the first carries the
// header and the start of the payload, the others the rest, each as large as the queue allows.
// Fragments go straight from and into the caller's payload wherever whole; only the first and
// a short last one pass through a scratch buffer.
#define _GNU_SOURCE
#include "floor_internal.h"

#include <fcntl.h>
#include <libgen.h>
#include <mqueue.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

/// Reads a limit from /proc/sys/fs/mqueue, or returns `fallback`.
static long queue_limit(const char *name, long fallback) {
    char path[64];
    snprintf(path, sizeof(path), "/proc/sys/fs/mqueue/%s", name);
    FILE *file = fopen(path, "re");
    if (file == NULL) return fallback;
    long value = fallback;
    if (fscanf(file, "%ld", &value) != 1) value = fallback;
    fclose(file);
    return value;
}

/// Queue names live in one namespace for the whole machine, not in the directory: name them
/// after the directory's last component and the responder's process id.
static int queue_name(nf_channel *channel, int index, const char *leaf) {
    char directory[PATH_MAX];
    snprintf(directory, sizeof(directory), "%s", channel->directory);
    const char *base = basename(directory);
    int length = snprintf(channel->names[index], sizeof(channel->names[index]), "/%s.floor-%d.%s", base, (int)channel->responder_pid, leaf);
    if (length >= NAME_MAX) {
        channel->names[index][0] = '\0';
        errno = ENAMETOOLONG;
        return -1;
    }
    return 0;
}

static int queue_names(nf_channel *channel) {
    return queue_name(channel, NF_NAME_REQUEST, "request") == 0 && queue_name(channel, NF_NAME_REPLY, "reply") == 0 ? 0 : -1;
}

static int allocate_scratch(nf_channel *channel) {
    channel->scratch = malloc((size_t)channel->message_size);
    return channel->scratch == NULL ? -1 : 0;
}

/// RLIMIT_MSGQUEUE bounds the bytes of all the queues this user holds, other programs' queues
/// included: raise it as far as this process may, so that they cannot make the floor fail.
static void raise_queue_limit(void) {
    struct rlimit unlimited = {RLIM_INFINITY, RLIM_INFINITY};
    if (setrlimit(RLIMIT_MSGQUEUE, &unlimited) == 0) return;
    struct rlimit limit;
    if (getrlimit(RLIMIT_MSGQUEUE, &limit) != 0) return;
    limit.rlim_cur = limit.rlim_max;
    setrlimit(RLIMIT_MSGQUEUE, &limit);
}

static int mqueue_create(nf_channel *channel) {
    if (queue_names(channel) != 0) return -1;
    raise_queue_limit();
    struct mq_attr attributes = {0};
    long message_limit = queue_limit("msg_max", 10);
    attributes.mq_maxmsg = message_limit < 10 ? message_limit : 10;
    attributes.mq_msgsize = queue_limit("msgsize_max", 8192);
    channel->message_size = attributes.mq_msgsize;
    if (channel->message_size <= NF_HEADER_LENGTH) {
        errno = EINVAL;
        return -1;
    }
    int flags = O_CREAT | O_EXCL | O_CLOEXEC;
    channel->in_fd = mq_open(channel->names[NF_NAME_REQUEST], O_RDONLY | flags, 0600, &attributes);
    if (channel->in_fd < 0) return -1;
    channel->out_fd = mq_open(channel->names[NF_NAME_REPLY], O_WRONLY | flags, 0600, &attributes);
    if (channel->out_fd < 0) return -1;
    return allocate_scratch(channel);
}

static int mqueue_open(nf_channel *channel) {
    if (queue_names(channel) != 0) return -1;
    channel->out_fd = mq_open(channel->names[NF_NAME_REQUEST], O_WRONLY | O_CLOEXEC);
    if (channel->out_fd < 0) return -1;
    channel->in_fd = mq_open(channel->names[NF_NAME_REPLY], O_RDONLY | O_CLOEXEC);
    if (channel->in_fd < 0) return -1;
    nf_remove_names(channel);
    struct mq_attr attributes;
    if (mq_getattr(channel->in_fd, &attributes) != 0) return -1;
    channel->message_size = attributes.mq_msgsize;
    return allocate_scratch(channel);
}

/// The initiator's waits (a full queue, no reply yet) end every NF_LIVENESS_PERIOD_SECONDS to
/// check that the responder is alive; the responder waits for as long as it takes.
static struct timespec liveness_deadline(void) {
    struct timespec deadline;
    clock_gettime(CLOCK_REALTIME, &deadline);
    deadline.tv_sec += NF_LIVENESS_PERIOD_SECONDS;
    return deadline;
}

/// Whether a wait that timed out should fail: then errno is ECONNRESET.
static bool responder_gone(const nf_channel *channel) {
    if (nf_process_alive(channel->responder_pid)) return false;
    errno = ECONNRESET;
    return true;
}

static int send_fragment(nf_channel *channel, const void *bytes, size_t length) {
    if (channel->responder) return NF_RETRY(ipc_sys_mq_timedsend(channel->out_fd, bytes, length, 0, NULL));
    for (;;) {
        struct timespec deadline = liveness_deadline();
        int sent = NF_RETRY(ipc_sys_mq_timedsend(channel->out_fd, bytes, length, 0, &deadline));
        if (sent == 0 || errno != ETIMEDOUT || responder_gone(channel)) return sent;
    }
}

static int mqueue_send(nf_channel *channel, uint32_t length, const void *payload) {
    size_t size = (size_t)channel->message_size;
    size_t payload_length = NF_IS_CONTROL(length) ? 0 : length;
    size_t first = payload_length < size - NF_HEADER_LENGTH ? payload_length : size - NF_HEADER_LENGTH;
    memcpy(channel->scratch, &length, NF_HEADER_LENGTH);
    if (first > 0) memcpy(channel->scratch + NF_HEADER_LENGTH, payload, first);
    if (send_fragment(channel, channel->scratch, NF_HEADER_LENGTH + first) != 0) return -1;
    for (size_t offset = first; offset < payload_length; offset += size) {
        size_t fragment = payload_length - offset < size ? payload_length - offset : size;
        if (send_fragment(channel, (const unsigned char *)payload + offset, fragment) != 0) return -1;
    }
    return 0;
}

/// Receives one queue message into `buffer` (room for a whole queue message). With `now`, does
/// not wait: an empty queue fails with EAGAIN (a deadline in the past, on the blocking
/// descriptor: an O_NONBLOCK one was no faster, Reports/spinning-floors).
static ssize_t receive_fragment(nf_channel *channel, void *buffer, bool now) {
    size_t size = (size_t)channel->message_size;
    if (now) {
        static const struct timespec past = {0, 0};
        ssize_t received = NF_RETRY(ipc_sys_mq_timedreceive(channel->in_fd, buffer, size, NULL, &past));
        if (received < 0 && errno == ETIMEDOUT) errno = EAGAIN;
        return received;
    }
    if (channel->responder) return NF_RETRY(ipc_sys_mq_timedreceive(channel->in_fd, buffer, size, NULL, NULL));
    for (;;) {
        struct timespec deadline = liveness_deadline();
        ssize_t received = NF_RETRY(ipc_sys_mq_timedreceive(channel->in_fd, buffer, size, NULL, &deadline));
        if (received >= 0 || errno != ETIMEDOUT || responder_gone(channel)) return received;
    }
}

static int mqueue_receive(nf_channel *channel, uint32_t *length, void *payload, size_t capacity) {
    size_t size = (size_t)channel->message_size;
    ssize_t received = receive_fragment(channel, channel->scratch, channel->receive_now);
    if (received < 0) return -1;
    if (received < NF_HEADER_LENGTH) {
        errno = EPROTO;
        return -1;
    }
    uint32_t header;
    memcpy(&header, channel->scratch, NF_HEADER_LENGTH);
    size_t payload_length = NF_IS_CONTROL(header) ? 0 : header;
    if (payload_length > capacity) {
        errno = EMSGSIZE;
        return -1;
    }
    size_t offset = (size_t)received - NF_HEADER_LENGTH;
    if (offset > payload_length) {
        errno = EPROTO;
        return -1;
    }
    if (offset > 0) memcpy(payload, channel->scratch + NF_HEADER_LENGTH, offset);
    while (offset < payload_length) {
        size_t remaining = payload_length - offset;
        // mq_receive needs room for a whole queue message: receive in place while there is.
        unsigned char *target = remaining >= size ? (unsigned char *)payload + offset : channel->scratch;
        received = receive_fragment(channel, target, false);
        if (received < 0) return -1;
        if (received == 0 || (size_t)received > remaining) {
            errno = EPROTO;
            return -1;
        }
        if (target == channel->scratch) memcpy((unsigned char *)payload + offset, channel->scratch, (size_t)received);
        offset += (size_t)received;
    }
    *length = header;
    return 0;
}

const struct nf_operations nf_mqueue_operations = {
    .create = mqueue_create,
    .accept = NULL,
    .open = mqueue_open,
    .send = mqueue_send,
    .receive = mqueue_receive,
    .buffered = true,
};
