// The byte-stream mechanisms: an AF_UNIX stream socket and a pair of FIFOs. Both carry a
// message as one write: of a copy of header and payload when it is small (NF_COALESCED_LIMIT),
// else a gathering write of the two. They read it with as few reads as the
// kernel allows; the other end closing reads as goodbye.
#define _GNU_SOURCE
#include "floor_internal.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

/// The channel's buffer for coalesced writes (NF_COALESCED_LIMIT bytes), made at first use.
static unsigned char *coalesced_buffer(nf_channel *channel) {
    if (channel->coalesced == NULL) channel->coalesced = malloc(NF_COALESCED_LIMIT);
    return channel->coalesced;
}

static int stream_send(nf_channel *channel, uint32_t length, const void *payload, bool socket) {
    uint32_t header = length;
    size_t payload_length = NF_IS_CONTROL(length) ? 0 : length;
    struct iovec vector[2] = {{&header, NF_HEADER_LENGTH}, {(void *)payload, payload_length}};
    int count = 2;
    // A small message goes as one copy in one segment (NF_COALESCED_LIMIT).
    if (NF_HEADER_LENGTH + payload_length <= NF_COALESCED_LIMIT) {
        unsigned char *buffer = coalesced_buffer(channel);
        if (buffer == NULL) return -1;
        memcpy(buffer, &header, NF_HEADER_LENGTH);
        if (payload_length > 0) memcpy(buffer + NF_HEADER_LENGTH, payload, payload_length);
        vector[0] = (struct iovec){buffer, NF_HEADER_LENGTH + payload_length};
        count = 1;
    }
    // unix-stream+epoll writes as an event loop does: without blocking, and after a partial
    // write it waits for room with epoll. unix-stream+epoll+handoff's responder writes from its
    // worker thread, which blocks for room (the epoll instance is its loop thread's).
    return nf_write_all(channel->out_fd, vector, count, socket, channel->mechanism == NF_UNIX_STREAM_EPOLL ? channel : NULL);
}

int nf_stream_send_batch(nf_channel *channel, uint32_t length, const void *payload, size_t messages, struct iovec *vector) {
    // Every header is the same length; the kernel only reads it.
    uint32_t header = length;
    // A batch no larger than NF_COALESCED_LIMIT goes as one copy in one segment.
    if (messages * (NF_HEADER_LENGTH + (size_t)length) <= NF_COALESCED_LIMIT) {
        unsigned char *buffer = coalesced_buffer(channel);
        if (buffer == NULL) return -1;
        unsigned char *end = buffer;
        for (size_t index = 0; index < messages; index++) {
            memcpy(end, &header, NF_HEADER_LENGTH);
            if (length > 0) memcpy(end + NF_HEADER_LENGTH, payload, length);
            end += NF_HEADER_LENGTH + length;
        }
        vector[0] = (struct iovec){buffer, (size_t)(end - buffer)};
        return nf_write_all(channel->out_fd, vector, 1, true, channel);
    }
    for (size_t index = 0; index < messages; index++) {
        vector[2 * index] = (struct iovec){&header, NF_HEADER_LENGTH};
        vector[2 * index + 1] = (struct iovec){(void *)payload, length};
    }
    return nf_write_all(channel->out_fd, vector, (int)(2 * messages), true, channel);
}

static int stream_receive(nf_channel *channel, uint32_t *length, void *payload, size_t capacity) {
    if (channel->mechanism == NF_UNIX_STREAM_IO_URING) return nf_uring_stream_receive(channel, length, payload, capacity);
    return nf_read_message(channel->in_fd, false, channel->receive_now, length, payload, capacity);
}

int nf_stream_sink_messages(nf_channel *channel, size_t count, size_t length, const unsigned char *buffered, size_t buffered_count, nf_sink_read read_some) {
    size_t frame = NF_HEADER_LENGTH + length;
    // The stream's bytes not yet in the buffer: no read goes past the last message.
    size_t left = count * frame;
    bool alone = frame >= NF_SINK_ALONE;
    size_t capacity = alone ? frame : NF_SINK_CAPACITY;
    unsigned char *buffer = malloc(capacity);
    if (buffer == NULL) return -1;
    size_t start = 0, end = 0;
    // What the channel read ahead before the stream (at most its 64 KiB input buffer, less than
    // either capacity) is the stream's first bytes.
    size_t ahead = buffered_count < left ? buffered_count : left;
    if (ahead > 0) memcpy(buffer, buffered, ahead);
    end = ahead;
    left -= ahead;
    for (;;) {
        // Every whole message in the buffer, its header checked where the lengths put it.
        while (end - start >= frame) {
            uint32_t header;
            memcpy(&header, buffer + start, NF_HEADER_LENGTH);
            if (header != (uint32_t)length) {
                free(buffer);
                errno = EPROTO;
                return -1;
            }
            start += frame;
        }
        if (start == end) start = end = 0;
        if (left == 0) break;
        // A message's first part goes to the front only when the rest of it would not fit behind
        // it, or when less than 64 KiB would: never for a message read alone (its buffer is its
        // size and it starts at the front).
        size_t rest = frame - (end - start);
        size_t room = capacity - end;
        if (start > 0 && (room < rest || room < (64 << 10))) {
            memmove(buffer, buffer + start, end - start);
            end -= start;
            start = 0;
            room = capacity - end;
        }
        size_t wanted = room < left ? room : left;
        ssize_t got = read_some(channel, buffer + end, wanted, alone);
        if (got <= 0) {
            if (got == 0) errno = EPROTO;
            free(buffer);
            return -1;
        }
        end += (size_t)got;
        left -= (size_t)got;
    }
    free(buffer);
    return 0;
}

/// The blocking and epoll streams' reads: `read(2)` of what the socket has, up to `length`;
/// unix-stream+epoll waits in epoll_wait before each, as an event loop does.
static ssize_t stream_sink_read(nf_channel *channel, void *buffer, size_t length, bool alone) {
    (void)alone;
    if (channel->mechanism == NF_UNIX_STREAM_EPOLL && nf_epoll_wait_readable(channel, channel->in_fd, false) != 0) return -1;
    return NF_RETRY(ipc_sys_read(channel->in_fd, buffer, length));
}

static int stream_sink(nf_channel *channel, size_t count, size_t length) {
    if (channel->mechanism == NF_UNIX_STREAM_IO_URING) return nf_uring_stream_sink(channel, count, length);
    return nf_stream_sink_messages(channel, count, length, NULL, 0, stream_sink_read);
}

// MARK: AF_UNIX stream socket

static int socket_address(const nf_channel *channel, struct sockaddr_un *address) {
    memset(address, 0, sizeof(*address));
    address->sun_family = AF_UNIX;
    const char *path = channel->names[NF_NAME_REQUEST];
    if (strlen(path) >= sizeof(address->sun_path)) {
        errno = ENAMETOOLONG;
        return -1;
    }
    strcpy(address->sun_path, path);
    return 0;
}

static int unix_create(nf_channel *channel) {
    struct sockaddr_un address;
    if (nf_set_path(channel, NF_NAME_REQUEST, "socket") != 0 || socket_address(channel, &address) != 0) return -1;
    channel->listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (channel->listen_fd < 0) return -1;
    if (bind(channel->listen_fd, (struct sockaddr *)&address, sizeof(address)) != 0) return -1;
    return listen(channel->listen_fd, 1);
}

static int unix_accept(nf_channel *channel) {
    int fd = NF_RETRY(accept4(channel->listen_fd, NULL, NULL, SOCK_CLOEXEC));
    if (fd < 0) return -1;
    channel->in_fd = channel->out_fd = fd;
    nf_close_fd(&channel->listen_fd);
    nf_remove_names(channel);
    return 0;
}

static int unix_open(nf_channel *channel) {
    struct sockaddr_un address;
    if (nf_set_path(channel, NF_NAME_REQUEST, "socket") != 0 || socket_address(channel, &address) != 0) return -1;
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    channel->in_fd = channel->out_fd = fd;
    if (NF_RETRY(connect(fd, (struct sockaddr *)&address, sizeof(address))) != 0) return -1;
    nf_remove_names(channel);
    return 0;
}

static int unix_send(nf_channel *channel, uint32_t length, const void *payload) {
    if (channel->mechanism == NF_UNIX_STREAM_IO_URING) return nf_uring_stream_send(channel, length, payload);
    return stream_send(channel, length, payload, true);
}

const struct nf_operations nf_unix_stream_operations = {
    .create = unix_create,
    .accept = unix_accept,
    .open = unix_open,
    .send = unix_send,
    .receive = stream_receive,
    .closing_is_goodbye = true,
    .buffered = true,
    .sink = stream_sink,
};

// MARK: FIFOs

static int pipe_create(nf_channel *channel) {
    if (nf_set_path(channel, NF_NAME_REQUEST, "request") != 0 || nf_set_path(channel, NF_NAME_REPLY, "reply") != 0) return -1;
    if (mkfifo(channel->names[NF_NAME_REQUEST], 0600) != 0 || mkfifo(channel->names[NF_NAME_REPLY], 0600) != 0) return -1;
    // Open the reading end now without waiting for a writer, so the initiator's open for writing
    // returns at once; then make reads block as usual.
    channel->in_fd = open(channel->names[NF_NAME_REQUEST], O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (channel->in_fd < 0) return -1;
    int flags = fcntl(channel->in_fd, F_GETFL);
    return flags < 0 ? -1 : fcntl(channel->in_fd, F_SETFL, flags & ~O_NONBLOCK);
}

static int pipe_accept(nf_channel *channel) {
    // Blocks until the initiator opens the reply FIFO for reading.
    channel->out_fd = NF_RETRY(open(channel->names[NF_NAME_REPLY], O_WRONLY | O_CLOEXEC));
    return channel->out_fd < 0 ? -1 : 0;
}

static int pipe_open(nf_channel *channel) {
    if (nf_set_path(channel, NF_NAME_REQUEST, "request") != 0 || nf_set_path(channel, NF_NAME_REPLY, "reply") != 0) return -1;
    channel->out_fd = NF_RETRY(open(channel->names[NF_NAME_REQUEST], O_WRONLY | O_CLOEXEC));
    if (channel->out_fd < 0) return -1;
    channel->in_fd = NF_RETRY(open(channel->names[NF_NAME_REPLY], O_RDONLY | O_CLOEXEC));
    if (channel->in_fd < 0) return -1;
    nf_remove_names(channel);
    return 0;
}

static int pipe_send(nf_channel *channel, uint32_t length, const void *payload) {
    return stream_send(channel, length, payload, false);
}

const struct nf_operations nf_pipe_operations = {
    .create = pipe_create,
    .accept = pipe_accept,
    .open = pipe_open,
    .send = pipe_send,
    .receive = stream_receive,
    .closing_is_goodbye = true,
    .buffered = true,
    .sink = stream_sink,
};
