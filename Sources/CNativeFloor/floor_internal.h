#ifndef IPCBENCH_NATIVE_FLOOR_INTERNAL_H
#define IPCBENCH_NATIVE_FLOOR_INTERNAL_H

#include "native_floor.h"

#include <errno.h>
#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/uio.h>

/// The message path's system calls, made directly (ipc_sys_send, _read, _epoll_wait and the
/// rest): the engine's own (CIPCShims), so that each floor pays what the engine's path pays and
/// no glibc thread-cancellation brackets (docs/ENGINE.md, "System calls made directly").
#include "shims.h"

/// Every message starts with its payload length in this many bytes.
#define NF_HEADER_LENGTH 4
/// The largest message (header and payload) a stream floor writes from one contiguous copy with
/// one `send` (`write` for a FIFO) instead of as two segments of a gathering call; a batch of
/// messages no larger together is copied too. The engine's unix-socket channel does the same up
/// to the same size (UnixSocketChannel.coalescedFrameLimit): on Linux 6.18 a `sendmsg` costs
/// more for every segment: 470 to 850 ns a 64-byte message on this repository's VM (docs/ENGINE.md,
/// "Sending"; Benchmarks/SendSegments).
#define NF_COALESCED_LIMIT 3584
/// A header holding this value instead of a length says goodbye.
#define NF_GOODBYE UINT32_MAX
/// A header holding this value starts a one-way stream (nf_stream): the next message carries
/// the stream's message count and payload length (two uint32_t), then come the messages, which
/// the responder reads without echoing; it answers with one empty message once it has them all.
#define NF_STREAM (UINT32_MAX - 1)
/// Whether a header holds a control value (no payload follows) rather than a length.
#define NF_IS_CONTROL(header) ((header) >= NF_STREAM)
/// How long the initiator waits for a reply before checking that the responder is alive.
#define NF_LIVENESS_PERIOD_SECONDS 1
/// How long a spinning floor busy-polls for a message before it waits without the CPU. A round
/// trip being measured answers within microseconds, so it never gets that far; a peer left idle
/// between its measurements then sleeps, instead of taking the core from the processes measured
/// meanwhile (it used to spin for the whole phase, beside every other spinning peer there).
#define NF_SPIN_LIMIT_NANOSECONDS 1000000
/// How often a spinning wait reads the clock: every this many polls.
#define NF_SPIN_CLOCK_EVERY 64

/// Evaluates `expression` (a system call returning -1 with errno) again while it fails with
/// EINTR. The one place the floor retries interrupted calls.
#define NF_RETRY(expression)                                 \
    ({                                                       \
        __typeof__(expression) nf_result_;                   \
        do {                                                 \
            nf_result_ = (expression);                       \
        } while (nf_result_ == -1 && errno == EINTR);        \
        nf_result_;                                          \
    })

/// The names a channel may own: socket or mapping file, FIFOs or queues, inotify files.
enum { NF_NAME_REQUEST, NF_NAME_REPLY, NF_NAME_ALIVE, NF_NAME_COUNT };

struct nf_channel {
    nf_mechanism mechanism;
    bool responder;
    /// Set once create or open succeeded: only then does nf_close say goodbye.
    bool established;
    /// A spinning floor's poll (receive_spinning in channel.c): the receive must not wait for
    /// its first byte, and fails with EAGAIN when nothing is there. Set and read by the
    /// receiving thread only.
    bool receive_now;
    size_t max_payload;
    /// The responder's process id: it names the objects, and the initiator checks it is alive.
    pid_t responder_pid;
    char directory[PATH_MAX];
    /// Empty strings are unused slots.
    char names[NF_NAME_COUNT][PATH_MAX];
    /// Where requests (responder) or replies (initiator) arrive: socket, FIFO, queue, inotify.
    int in_fd;
    /// Where this end's messages leave: socket (same as in_fd), FIFO, queue.
    int out_fd;
    /// unix-stream responder: the listening socket, until the initiator connects.
    int listen_fd;
    /// inotify: the file this end reads, open for the channel's lifetime.
    int file_fd;
    /// inotify responder: open for writing while the responder lives, so that the kernel's close
    /// at its exit wakes the initiator (IN_CLOSE_WRITE). Initiator: the watch on that file.
    int alive_fd;
    int alive_watch;
    /// Responder: where a request is received and the echo sent from.
    unsigned char *buffer;
    /// mqueue: one queue message, for fragments that do not go straight to or from the payload.
    unsigned char *scratch;
    /// Streams: NF_COALESCED_LIMIT bytes where a small message (or batch) is copied whole before
    /// its write, made at the first such send. Only the sending thread uses it.
    unsigned char *coalesced;
    long message_size;
    /// The epoll variants: the epoll instance every wait for a message goes through, made at the
    /// first wait (the descriptor it watches may come only with the initiator's connection).
    int epoll_fd;
    /// eventfd+epoll: the doorbell this end rings (the other's) and the one it waits on.
    int ring_fd;
    int bell_fd;
    /// The io_uring variants: the ring, made at first use (uring.c).
    struct nf_uring *uring;
    /// Initiator: a one-way stream is being sent (nf_stream), so sends may run ahead of the
    /// replies and each is tracked until it completes.
    bool streaming;
    /// futex: the shared mapping and the last sequence numbers sent and seen.
    void *mapping;
    size_t mapping_length;
    uint32_t sent;
    uint32_t seen;
};

/// How one mechanism moves messages. Each returns 0, or -1 with errno set.
struct nf_operations {
    /// Responder: make the named objects (before the initiator opens them).
    int (*create)(nf_channel *channel);
    /// Responder: wait for the initiator (accept, or open the other FIFO); may be NULL.
    int (*accept)(nf_channel *channel);
    /// Initiator: open the responder's objects and unlink the names both ends now hold.
    int (*open)(nf_channel *channel);
    /// Sends a header holding `length` (or NF_GOODBYE, with no payload) and the payload.
    int (*send)(nf_channel *channel, uint32_t length, const void *payload);
    /// Receives one message: its header into *length and its payload (at most `capacity` bytes,
    /// else EMSGSIZE) into `payload`. The other end closing reads as NF_GOODBYE.
    int (*receive)(nf_channel *channel, uint32_t *length, void *payload, size_t capacity);
    /// Whether closing the initiator's end is seen by the responder (a stream's end), so that
    /// no goodbye is sent: a write to a FIFO whose reader died would raise SIGPIPE.
    bool closing_is_goodbye;
    /// Whether the kernel buffers messages, so that a sender can run ahead of the receiver
    /// (nf_stream works only then).
    bool buffered;
    /// Responder: reads a stream's `count` messages of `length` bytes without echoing them;
    /// NULL to receive them one by one with `receive`.
    int (*sink)(nf_channel *channel, size_t count, size_t length);
};

extern const struct nf_operations nf_unix_stream_operations;
extern const struct nf_operations nf_mqueue_operations;
extern const struct nf_operations nf_futex_operations;
extern const struct nf_operations nf_inotify_operations;
extern const struct nf_operations nf_pipe_operations;
extern const struct nf_operations nf_eventfd_operations;
extern const struct nf_operations nf_shm_spin_operations;
extern const struct nf_operations nf_journal_operations;

/// unix-stream+io_uring (uring.c): a send queued until the next wait; one message received
/// (submitting what is queued); a stream's messages drained.
int nf_uring_stream_send(nf_channel *channel, uint32_t length, const void *payload);
int nf_uring_stream_receive(nf_channel *channel, uint32_t *length, void *payload, size_t capacity);
int nf_uring_stream_sink(nf_channel *channel, size_t count, size_t length);
/// A stream sink's read (stream.c, uring.c): up to `length` bytes into `buffer`; the bytes read,
/// 0 at the end of the stream, -1 with errno. `alone`: the bytes are the rest of one message read
/// alone (NF_SINK_ALONE), so the read may wait for all of them.
typedef ssize_t (*nf_sink_read)(nf_channel *channel, void *buffer, size_t length, bool alone);
/// A message of at least this many bytes, header and payload, is read alone into a buffer of its
/// size; smaller ones are read through a buffer of NF_SINK_CAPACITY bytes, as many at once as
/// the socket has.
#define NF_SINK_ALONE (256 * 1024)
#define NF_SINK_CAPACITY (1 << 20)
/// The stream floors' receiver (stream.c): takes `count` messages of `length` payload bytes the
/// way a message receiver must, each message whole in one place, where the engine's receiver
/// puts them:
/// - a message of NF_SINK_ALONE bytes or more alone, into a buffer of its size from the front,
///   no read past its end (the engine receives the rest of a large frame into its payload's
///   own array);
/// - smaller ones read through a 1 MiB buffer from front to back, a message's first part moved
///   to the front only when the rest of it (or 64 KiB) would not fit behind it (the engine's
///   lending reassembler).
/// It does not drain the socket into the start of one buffer: such a receiver never puts a
/// message in one place, and its copies land in the same few hundred kilobytes every time, which
/// a CPU whose L2 holds them makes cheaper than any message receiver's (Reports/whole-message-floors).
/// Each message's header must hold `length` where the lengths before it put it (EPROTO if not):
/// a sink that only counted bytes would pass a stream whose messages' bytes were interleaved (two
/// sends in flight at once), and so time a stream no receiver could read. `buffered` is what the
/// channel read ahead of the stream (its first bytes). 0, or -1 with errno.
int nf_stream_sink_messages(nf_channel *channel, size_t count, size_t length, const unsigned char *buffered, size_t buffered_count, nf_sink_read read_some);
/// unix-stream+epoll's batched stream (stream.c): `messages` messages of `length` bytes from
/// `payload` in one gathering write, each its header and payload (the first 2 × `messages`
/// entries of `vector`, which it fills), without blocking, waiting for room with epoll.
int nf_stream_send_batch(nf_channel *channel, uint32_t length, const void *payload, size_t messages, struct iovec *vector);
/// eventfd+io_uring (uring.c): a wait for this end's doorbell (its count read through the ring;
/// the other end's is rung with write(2), see eventfd_send).
int nf_uring_wait_bell(nf_channel *channel);
/// Releases the ring, if any.
void nf_uring_close(nf_channel *channel);

/// Tells the CPU the caller is spinning (x86 pause, ARM yield).
static inline void nf_cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/// For a spinning initiator: whether a second has passed since *last (CLOCK_MONOTONIC seconds;
/// updates it), so that it checks now and then that the responder is alive.
bool nf_liveness_due(uint64_t *last);

/// CLOCK_MONOTONIC in nanoseconds.
uint64_t nf_monotonic_nanoseconds(void);

/// A spinning wait's budget: call once per poll that found nothing; false once the wait has
/// polled for NF_SPIN_LIMIT_NANOSECONDS (the clock is read every NF_SPIN_CLOCK_EVERY polls).
/// Starts with `*polls` = 0 and `*end` = 0.
bool nf_still_spinning(uint32_t *polls, uint64_t *end);

/// The epoll variants: waits until `fd` is readable (registering it with the channel's epoll
/// instance, made on first use; edge-triggered if `edge`). The initiator wakes every
/// NF_LIVENESS_PERIOD_SECONDS to check the responder is alive (ECONNRESET if not).
int nf_epoll_wait_readable(nf_channel *channel, int fd, bool edge);

/// Waits until `fd` has room to write, as an event loop waits after a write the kernel took
/// only part of: EPOLLOUT added to the interest, epoll_wait, EPOLLOUT removed again. On the
/// channel's epoll instance (made if needed), with the initiator's liveness checks.
int nf_epoll_wait_writable(nf_channel *channel, int fd);

/// Sets channel->names[index] to "<directory>/floor-<responder pid>.<leaf>".
int nf_set_path(nf_channel *channel, int index, const char *leaf);

/// Writes every byte of the vector (a socket write never raises SIGPIPE). With `polling`, a
/// socket is written without blocking, and when it is full the write waits for room with
/// nf_epoll_wait_writable on that channel.
int nf_write_all(int fd, struct iovec *vector, int count, bool socket, nf_channel *polling);

/// Reads one message from a stream, or from a file at offset 0 when `file` is set. For a stream,
/// end of input before the first byte reads as NF_GOODBYE; anywhere else it is EPROTO. With
/// `now` (a socket only), the first read does not wait: nothing there yet fails with EAGAIN.
int nf_read_message(int fd, bool file, bool now, uint32_t *length, void *payload, size_t capacity);

/// Whether the process exists and has not exited (a zombie counts as gone).
bool nf_process_alive(pid_t pid);

/// Closes *fd if open and marks it closed.
void nf_close_fd(int *fd);

#endif
