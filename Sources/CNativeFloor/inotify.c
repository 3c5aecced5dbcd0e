// A file per direction, as a file presenter sees it: the sender opens the file, writes the
// message and closes it; the receiver sleeps in read(2) on an inotify descriptor until the
// kernel reports IN_CLOSE_WRITE for that file, then reads the message. Files are overwritten
// in place, not truncated (the header says how long the message is), so the floor pays for no
// block freeing a transport could avoid; each end keeps the file it reads open for the
// channel's lifetime, so only the writer pays for an open and a close per message.
#define _GNU_SOURCE
#include "floor_internal.h"

#include <fcntl.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/mman.h>
#include <sys/stat.h>
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

/// Opens the file this end reads (read-write for a journal, which it locks) and watches it for
/// `event` (IN_CLOSE_WRITE, or IN_MODIFY for a journal).
static int watch_read_file(nf_channel *channel, uint32_t event) {
    const char *path = channel->names[read_name(channel)];
    channel->in_fd = inotify_init1(IN_CLOEXEC);
    if (channel->in_fd < 0 || inotify_add_watch(channel->in_fd, path, event) < 0) return -1;
    channel->file_fd = open(path, (event == IN_MODIFY ? O_RDWR : O_RDONLY) | O_CLOEXEC);
    return channel->file_fd < 0 ? -1 : 0;
}

static int create_files(nf_channel *channel, uint32_t event) {
    if (set_paths(channel) != 0) return -1;
    for (int index = 0; index < NF_NAME_COUNT; index++) {
        if (create_file(channel->names[index]) != 0) return -1;
    }
    channel->alive_fd = open(channel->names[NF_NAME_ALIVE], O_WRONLY | O_CLOEXEC);
    if (channel->alive_fd < 0) return -1;
    return watch_read_file(channel, event);
}

static int inotify_create(nf_channel *channel) {
    return create_files(channel, IN_CLOSE_WRITE);
}

static int open_files(nf_channel *channel, uint32_t event) {
    if (set_paths(channel) != 0 || watch_read_file(channel, event) != 0) return -1;
    channel->alive_watch = inotify_add_watch(channel->in_fd, channel->names[NF_NAME_ALIVE], IN_CLOSE_WRITE);
    if (channel->alive_watch < 0) return -1;
    // A responder that died before the watch was in place will not close the alive file again.
    if (!nf_process_alive(channel->responder_pid)) {
        errno = ECONNRESET;
        return -1;
    }
    return 0;
}

static int inotify_open(nf_channel *channel) {
    return open_files(channel, IN_CLOSE_WRITE);
}

static int inotify_send(nf_channel *channel, uint32_t length, const void *payload) {
    int fd = NF_RETRY(open(channel->names[written_name(channel)], O_WRONLY | O_CLOEXEC));
    if (fd < 0) return -1;
    uint32_t header = length;
    struct iovec vector[2] = {{&header, NF_HEADER_LENGTH}, {(void *)payload, NF_IS_CONTROL(length) ? 0 : length}};
    int result = nf_write_all(fd, vector, 2, false, NULL);
    // The close is the signal: it raises IN_CLOSE_WRITE at the reader.
    nf_close_fd(&fd);
    return result;
}

/// Sleeps until inotify reports `event` (IN_CLOSE_WRITE or IN_MODIFY) on the file this end reads.
static int await_event(nf_channel *channel, uint32_t wanted) {
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
            if (event->mask & wanted) written = true;
            offset += (ssize_t)(sizeof(struct inotify_event) + event->len);
        }
        if (written) return 0;
    }
}

static int inotify_receive(nf_channel *channel, uint32_t *length, void *payload, size_t capacity) {
    if (await_event(channel, IN_CLOSE_WRITE) != 0) return -1;
    return nf_read_message(channel->file_fd, true, false, length, payload, capacity);
}

const struct nf_operations nf_inotify_operations = {
    .create = inotify_create,
    .accept = NULL,
    .open = inotify_open,
    .send = inotify_send,
    .receive = inotify_receive,
};

// journal: a file per direction kept the way the file-presenter transport keeps its journals. A
// 64-byte header holds a sequence number and the end of the record; the record follows it. The
// writer takes the file's exclusive open-file-description lock, copies the record into a shared
// mapping of the file (which raises no inotify event), stores the end and the next sequence
// number through the same mapping, unlocks, and then writes one byte of the header's reserved
// area, whose IN_MODIFY wakes the reader with the lock already free. A record longer than the
// mapped window is written with pwritev instead, under the lock, and that write is the wake-up
// (the reader then waits for the lock). The reader sleeps in read(2) on inotify until
// IN_MODIFY, takes the shared lock, reads the sequence number and the end, reads the record with
// pread, and unlocks. Each record overwrites the last one (in a ping-pong the reader has always
// taken it), so the file does not grow.

#define JOURNAL_HEADER 64
/// Records up to this long (payloads up to 64 KiB, where the transport draws the line too) are
/// copied through the mapping; each file is this long past its header.
#define JOURNAL_WINDOW (64 * 1024 + NF_HEADER_LENGTH)
/// The header byte whose write wakes the reader (in the header's unused part).
#define JOURNAL_WAKE_OFFSET (JOURNAL_HEADER - 1)

struct journal_header {
    _Atomic uint64_t sequence;
    _Atomic uint64_t end;
};

static int lock_journal(int fd, short type) {
    struct flock lock = {.l_type = type, .l_whence = SEEK_SET, .l_start = 0, .l_len = 0};
    return NF_RETRY(fcntl(fd, F_OFD_SETLKW, &lock));
}

/// Opens the file this end writes (kept open, mapped with its record window) and maps the header
/// of the one it reads.
static int journal_prepare(nf_channel *channel) {
    channel->out_fd = open(channel->names[written_name(channel)], O_RDWR | O_CLOEXEC);
    if (channel->out_fd < 0) return -1;
    const off_t length = JOURNAL_HEADER + JOURNAL_WINDOW;
    struct stat status;
    if (fstat(channel->file_fd, &status) != 0) return -1;
    if (status.st_size < length && ftruncate(channel->file_fd, length) != 0) return -1;
    if (fstat(channel->out_fd, &status) != 0) return -1;
    if (status.st_size < length && ftruncate(channel->out_fd, length) != 0) return -1;
    // One page, then the written file's header and window, reserved as one range (so nf_close
    // unmaps all of it), each mapped over its part: the header this end reads, then the file it
    // writes.
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    channel->mapping_length = page + (size_t)length;
    channel->mapping = mmap(NULL, channel->mapping_length, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (channel->mapping == MAP_FAILED) {
        channel->mapping = NULL;
        return -1;
    }
    char *base = channel->mapping;
    if (mmap(base, JOURNAL_HEADER, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, channel->file_fd, 0) == MAP_FAILED) return -1;
    if (mmap(base + page, (size_t)length, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, channel->out_fd, 0) == MAP_FAILED) return -1;
    return 0;
}

static struct journal_header *incoming_header(const nf_channel *channel) { return (struct journal_header *)channel->mapping; }
static char *outgoing_file(const nf_channel *channel) {
    return (char *)channel->mapping + channel->mapping_length - (JOURNAL_HEADER + JOURNAL_WINDOW);
}
static struct journal_header *outgoing_header(const nf_channel *channel) { return (struct journal_header *)outgoing_file(channel); }

static int journal_create(nf_channel *channel) {
    return create_files(channel, IN_MODIFY) == 0 ? journal_prepare(channel) : -1;
}

static int journal_open(nf_channel *channel) {
    return open_files(channel, IN_MODIFY) == 0 ? journal_prepare(channel) : -1;
}

static int journal_send(nf_channel *channel, uint32_t length, const void *payload) {
    if (lock_journal(channel->out_fd, F_WRLCK) != 0) return -1;
    uint32_t header = length;
    size_t payload_length = NF_IS_CONTROL(length) ? 0 : length;
    bool mapped = NF_HEADER_LENGTH + payload_length <= JOURNAL_WINDOW;
    int result = 0;
    if (mapped) {
        char *record = outgoing_file(channel) + JOURNAL_HEADER;
        memcpy(record, &header, NF_HEADER_LENGTH);
        if (payload_length > 0) memcpy(record + NF_HEADER_LENGTH, payload, payload_length);
    } else {
        struct iovec vector[2] = {{&header, NF_HEADER_LENGTH}, {(void *)payload, payload_length}};
        ssize_t written = NF_RETRY(pwritev(channel->out_fd, vector, 2, JOURNAL_HEADER));
        result = written == (ssize_t)(NF_HEADER_LENGTH + payload_length) ? 0 : -1;
    }
    if (result == 0) {
        struct journal_header *out = outgoing_header(channel);
        atomic_store_explicit(&out->end, JOURNAL_HEADER + NF_HEADER_LENGTH + payload_length, memory_order_relaxed);
        atomic_store_explicit(&out->sequence, ++channel->sent, memory_order_release);
    }
    int error = errno;
    lock_journal(channel->out_fd, F_UNLCK);
    if (result == 0 && mapped) {
        // The wake-up, with the lock free: the reader does not wake to wait for this writer.
        static const char zero = 0;
        if (NF_RETRY(pwrite(channel->out_fd, &zero, 1, JOURNAL_WAKE_OFFSET)) != 1) return -1;
    }
    errno = error;
    return result;
}

static int journal_receive(nf_channel *channel, uint32_t *length, void *payload, size_t capacity) {
    struct journal_header *in = incoming_header(channel);
    for (;;) {
        if (lock_journal(channel->file_fd, F_RDLCK) != 0) return -1;
        uint64_t sequence = atomic_load_explicit(&in->sequence, memory_order_acquire);
        if (sequence != channel->seen) {
            channel->seen = (uint32_t)sequence;
            uint64_t end = atomic_load_explicit(&in->end, memory_order_relaxed);
            uint32_t header = 0;
            int result = -1;
            if (end >= JOURNAL_HEADER + NF_HEADER_LENGTH && NF_RETRY(pread(channel->file_fd, &header, NF_HEADER_LENGTH, JOURNAL_HEADER)) == NF_HEADER_LENGTH) {
                size_t payload_length = NF_IS_CONTROL(header) ? 0 : header;
                if (payload_length > capacity) {
                    errno = EMSGSIZE;
                } else if (end != JOURNAL_HEADER + NF_HEADER_LENGTH + payload_length) {
                    errno = EPROTO;
                } else if (payload_length == 0 || NF_RETRY(pread(channel->file_fd, payload, payload_length, JOURNAL_HEADER + NF_HEADER_LENGTH)) == (ssize_t)payload_length) {
                    *length = header;
                    result = 0;
                }
            } else {
                errno = EPROTO;
            }
            int error = errno;
            lock_journal(channel->file_fd, F_UNLCK);
            errno = error;
            return result;
        }
        lock_journal(channel->file_fd, F_UNLCK);
        if (await_event(channel, IN_MODIFY) != 0) return -1;
    }
}

const struct nf_operations nf_journal_operations = {
    .create = journal_create,
    .accept = NULL,
    .open = journal_open,
    .send = journal_send,
    .receive = journal_receive,
};
