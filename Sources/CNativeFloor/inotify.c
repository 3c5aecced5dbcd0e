// A file per direction, as a file presenter sees it: the sender opens the file, writes the
// message and closes it; the receiver sleeps in read(2) on an inotify descriptor until the
// kernel reports IN_CLOSE_WRITE for that file, then reads the message. Files are overwritten
// in place, not truncated (the header says how long the message is), so the floor pays for no
// block freeing a transport could avoid; each end keeps the file it reads open for the
// channel's lifetime, so only the writer pays for an open and a close per message.
#define _GNU_SOURCE
#include "floor_internal.h"

#include <fcntl.h>
#include <sys/inotify.h>
#include <unistd.h>

/// The file this end writes and the one it reads.
static int written_name(const nf_channel *channel) { return channel->responder ? NF_NAME_REPLY : NF_NAME_REQUEST; }
static int read_name(const nf_channel *channel) { return channel->responder ? NF_NAME_REQUEST : NF_NAME_REPLY; }

static int set_paths(nf_channel *channel) {
    return nf_set_path(channel, NF_NAME_REQUEST, "request") == 0 && nf_set_path(channel, NF_NAME_REPLY, "reply") == 0 &&
                   nf_set_path(channel, NF_NAME_ALIVE, "alive") == 0
               ? 0
               : -1;
}

static int create_file(const char *path) {
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) return -1;
    nf_close_fd(&fd);
    return 0;
}

/// Opens the file this end reads and watches it for IN_CLOSE_WRITE.
static int watch_read_file(nf_channel *channel) {
    const char *path = channel->names[read_name(channel)];
    channel->in_fd = inotify_init1(IN_CLOEXEC);
    if (channel->in_fd < 0 || inotify_add_watch(channel->in_fd, path, IN_CLOSE_WRITE) < 0) return -1;
    channel->file_fd = open(path, O_RDONLY | O_CLOEXEC);
    return channel->file_fd < 0 ? -1 : 0;
}

static int inotify_create(nf_channel *channel) {
    if (set_paths(channel) != 0) return -1;
    for (int index = 0; index < NF_NAME_COUNT; index++) {
        if (create_file(channel->names[index]) != 0) return -1;
    }
    channel->alive_fd = open(channel->names[NF_NAME_ALIVE], O_WRONLY | O_CLOEXEC);
    if (channel->alive_fd < 0) return -1;
    return watch_read_file(channel);
}

static int inotify_open(nf_channel *channel) {
    if (set_paths(channel) != 0 || watch_read_file(channel) != 0) return -1;
    channel->alive_watch = inotify_add_watch(channel->in_fd, channel->names[NF_NAME_ALIVE], IN_CLOSE_WRITE);
    if (channel->alive_watch < 0) return -1;
    // A responder that died before the watch was in place will not close the alive file again.
    if (!nf_process_alive(channel->responder_pid)) {
        errno = ECONNRESET;
        return -1;
    }
    return 0;
}

static int inotify_send(nf_channel *channel, uint32_t length, const void *payload) {
    int fd = NF_RETRY(open(channel->names[written_name(channel)], O_WRONLY | O_CLOEXEC));
    if (fd < 0) return -1;
    uint32_t header = length;
    struct iovec vector[2] = {{&header, NF_HEADER_LENGTH}, {(void *)payload, NF_IS_CONTROL(length) ? 0 : length}};
    int result = nf_write_all(fd, vector, 2, false);
    // The close is the signal: it raises IN_CLOSE_WRITE at the reader.
    nf_close_fd(&fd);
    return result;
}

/// Sleeps until the file this end reads was written and closed.
static int await_close_write(nf_channel *channel) {
    _Alignas(struct inotify_event) char events[sizeof(struct inotify_event) + NAME_MAX + 1];
    for (;;) {
        ssize_t length = NF_RETRY(read(channel->in_fd, events, sizeof(events)));
        if (length < 0) return -1;
        bool written = false;
        for (ssize_t offset = 0; offset < length;) {
            const struct inotify_event *event = (const struct inotify_event *)(events + offset);
            if (event->wd == channel->alive_watch) {
                errno = ECONNRESET;
                return -1;
            }
            if (event->mask & IN_CLOSE_WRITE) written = true;
            offset += (ssize_t)(sizeof(struct inotify_event) + event->len);
        }
        if (written) return 0;
    }
}

static int inotify_receive(nf_channel *channel, uint32_t *length, void *payload, size_t capacity) {
    if (await_close_write(channel) != 0) return -1;
    return nf_read_message(channel->file_fd, true, length, payload, capacity);
}

const struct nf_operations nf_inotify_operations = {
    .create = inotify_create,
    .accept = NULL,
    .open = inotify_open,
    .send = inotify_send,
    .receive = inotify_receive,
};
