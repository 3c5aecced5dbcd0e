#ifndef IPCBENCH_NATIVE_FLOOR_H
#define IPCBENCH_NATIVE_FLOOR_H

/*
 * The native floor: the cheapest request/reply round trip each kernel mechanism allows between
 * two processes, written in plain C so that no runtime sits between the caller and the system
 * calls. ipcbench times nf_round_trip() exactly as it times a transport's request (same clock,
 * same histogram, same core placement), and the Google Benchmark cross-check in Benchmarks/
 * times the same functions with an independent tool.
 *
 * Every message is a 4-byte payload length in host byte order (both ends share one machine)
 * followed by the payload; the responder echoes it. The two ends meet in a directory that both
 * can reach (the group directory):
 *
 *   responder                          initiator
 *   nf_responder_create(dir)   --->    (after the responder is ready)
 *   nf_responder_serve()               nf_initiator_open(dir, responder pid)
 *     echoes every request               nf_round_trip() ... as often as wanted
 *     returns 0 on goodbye <------------ nf_close() says goodbye
 *   nf_close()
 *
 * Names (socket, FIFOs, queues, mapping file) are unlinked as soon as both ends hold them open,
 * and again by nf_close and nf_remove_names, so nothing is left behind however a run ends.
 *
 * Functions return 0 (or a channel) on success, and -1 (or NULL) with errno set on failure.
 * EINTR is retried inside; it never reaches the caller.
 */

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

/// The kernel mechanisms under ipcbench's transports, plus a pipe as a reference.
typedef enum nf_mechanism {
    /// AF_UNIX stream socket, bound in the directory (the unix-socket transport).
    NF_UNIX_STREAM = 0,
    /// A pair of POSIX message queues, messages fragmented to the queue's message size (the
    /// message-port transport). The responder raises its RLIMIT_MSGQUEUE as far as it may.
    NF_MQUEUE = 1,
    /// A futex per direction on a MAP_SHARED file mapping that carries the payload (the notify
    /// transport).
    NF_FUTEX = 2,
    /// A file per direction: write and close it, and the reader waits for inotify's
    /// IN_CLOSE_WRITE, then reads the file (the file-presenter transport).
    NF_INOTIFY = 3,
    /// A pair of FIFOs: the classic pipe round trip, for reference.
    NF_PIPE = 4,
    /// NF_UNIX_STREAM, with every wait for a message an epoll_wait on the socket before the read,
    /// and writes that do not block (a full socket is waited on with epoll, EPOLLOUT added to the
    /// interest for the wait): the kernel work of an event-driven transport (one poller for all
    /// connections).
    NF_UNIX_STREAM_EPOLL = 5,
    /// NF_MQUEUE, with every wait an epoll_wait on the queue before the receive.
    NF_MQUEUE_EPOLL = 6,
    /// NF_FUTEX's shared mapping, with an eventfd per direction as the doorbell instead of the
    /// futex: the sender writes the receiver's eventfd, the receiver waits in epoll_wait on it
    /// (edge-triggered, never read), as the notify transport does. The initiator takes the
    /// responder's eventfds with pidfd_getfd (same user, or ptrace rights over the responder).
    NF_EVENTFD_EPOLL = 7,
    /// NF_UNIX_STREAM, each end polling the socket without blocking (poll(2) with a zero timeout,
    /// in a loop) until a message is there: the floor for a transport that spins with its
    /// event loop's poll. Only meaningful with the two ends on different cores.
    NF_UNIX_STREAM_SPIN = 8,
    /// NF_MQUEUE, polling the queue the same way.
    NF_MQUEUE_SPIN = 9,
    /// NF_FUTEX's shared mapping, each end busy-polling the sequence number (no system call at
    /// all): the limit for any shared-memory transport.
    NF_SHM_SPIN = 10,
    /// A journal file per direction, as the file-presenter transport keeps one: the writer takes
    /// an exclusive open-file-description lock, writes the record, publishes its end in the
    /// header through a shared mapping and unlocks; the reader waits for inotify's IN_MODIFY,
    /// takes the shared lock, reads the end and the record, and unlocks.
    NF_JOURNAL = 11,
    /// NF_UNIX_STREAM_EPOLL, with the responder's echo written by a second thread: its loop
    /// thread waits in epoll_wait and reads each request, hands it to a worker thread (a futex
    /// wake) and waits again; the worker writes the echo. The kernel work of a server whose
    /// request handler runs off its event loop (one thread hand-over per request).
    NF_UNIX_STREAM_EPOLL_HANDOFF = 12,
    /// NF_UNIX_STREAM, waited on with io_uring instead of epoll: each end queues its send and,
    /// when it waits, submits it with a receive in one io_uring_enter that returns once the
    /// receive has completed (one system call per half round trip). The ring is set up with
    /// IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN where the kernel allows, the
    /// socket registered as a fixed file. EPERM or ENOSYS where io_uring is disabled.
    NF_UNIX_STREAM_IO_URING = 13,
    /// NF_EVENTFD_EPOLL's mapping and doorbells, with this end's bell read through io_uring (one
    /// io_uring_enter per wait) and the other's rung with write(2): io_uring has no inline
    /// write for an eventfd and hands each to a worker thread.
    NF_EVENTFD_IO_URING = 14,
    /// NF_MQUEUE, with every wait a poll(2) of the one queue descriptor before the receive: the
    /// event-driven wait with the least kernel bookkeeping for a single descriptor.
    NF_MQUEUE_POLL = 15,
    /// NF_EVENTFD_EPOLL, with the responder's echo written (and its doorbell rung) by a second
    /// thread, handed each request as NF_UNIX_STREAM_EPOLL_HANDOFF hands it: the kernel work of
    /// the notify transport's server whose request handler runs off its event loop.
    NF_EVENTFD_EPOLL_HANDOFF = 16,
    /// NF_MQUEUE_EPOLL, with the responder's echo sent by a second thread, handed each request as
    /// NF_UNIX_STREAM_EPOLL_HANDOFF hands it: the kernel work of the message-port transport's
    /// server whose request handler runs off its event loop.
    NF_MQUEUE_EPOLL_HANDOFF = 17,
    /// NF_SHM_SPIN, with the responder's echo published by a second thread: its loop thread
    /// busy-polls for each request and hands it to a worker thread (a futex wake) as
    /// NF_UNIX_STREAM_EPOLL_HANDOFF hands it, then polls again; the worker publishes the echo and
    /// sleeps in FUTEX_WAIT until the next. The kernel work of a spinning server whose request
    /// handler runs off its event loop (notify's async handler while it spins). With the
    /// responder's threads on one core, each request costs them two context switches that no
    /// spinning responder without a hand-off makes.
    NF_SHM_SPIN_HANDOFF = 18,
    /// NF_UNIX_STREAM_SPIN, with the echo written by a second thread as NF_SHM_SPIN_HANDOFF hands
    /// it over (unix-socket's async handler while it spins).
    NF_UNIX_STREAM_SPIN_HANDOFF = 19,
    /// NF_MQUEUE_SPIN, with the echo sent by a second thread as NF_SHM_SPIN_HANDOFF hands it over
    /// (message-port's async handler while it spins).
    NF_MQUEUE_SPIN_HANDOFF = 20,
    /// NF_JOURNAL, with the responder's echo written by a second thread, handed each request as
    /// NF_UNIX_STREAM_EPOLL_HANDOFF hands it: the kernel work of the file-presenter transport's
    /// server whose request handler runs off its event loop.
    NF_JOURNAL_HANDOFF = 21,
} nf_mechanism;

/// One end of a floor ping-pong.
typedef struct nf_channel nf_channel;

/// Whether this kernel lets the calling process use the mechanism: 0 for the io_uring floors
/// where io_uring is disabled (`kernel.io_uring_disabled`) or refused (a seccomp filter), with
/// errno saying why; 1 otherwise.
int nf_mechanism_available(nf_mechanism mechanism);

/// Responder, step 1: creates the mechanism's named objects in `directory` (for NF_MQUEUE,
/// queues named after the directory's last path component), named after the calling process's
/// id, for payloads of at most `max_payload` bytes. Once this returns, an initiator may open
/// the channel.
/// Errors: ENAMETOOLONG for a directory too long for a socket address, EEXIST if the objects
/// exist already, EINVAL for an unknown mechanism, and whatever the system calls report.
nf_channel *nf_responder_create(nf_mechanism mechanism, const char *directory, size_t max_payload);

/// Responder, step 2: waits for the initiator, then echoes every request until the initiator
/// says goodbye or closes its end (returns 0), or something fails (returns -1: EMSGSIZE for a
/// request over max_payload, EPROTO for a malformed message).
int nf_responder_serve(nf_channel *channel);

/// Initiator: opens the channel that the responder process `responder` created in `directory`
/// with the same `max_payload`. The names carry the responder's process id, so several floor
/// peers can share a directory; a wait for a reply fails with ECONNRESET instead of hanging when
/// that process dies.
nf_channel *nf_initiator_open(nf_mechanism mechanism, const char *directory, size_t max_payload, pid_t responder);

/// Initiator: sends `length` bytes from `request` and waits for the echo, which is written to
/// `reply` (room for `length` bytes). Fails with EMSGSIZE above max_payload, EPROTO if the reply
/// has another length, ECONNRESET if the responder went away.
/// For NF_PIPE a responder that died raises SIGPIPE in the calling thread, as any pipe write does;
/// block or ignore SIGPIPE in that thread to get EPIPE instead.
int nf_round_trip(nf_channel *channel, const void *request, void *reply, size_t length);

/// The most messages nf_stream writes at a time: two iovecs each, within the kernel's IOV_MAX (1024).
#define NF_STREAM_BATCH_MAX 512

/// Initiator: sends `count` one-way messages of `length` bytes from `payload` back to back and
/// returns once the responder has read them all (it acknowledges the last): one-way throughput.
/// `*nanoseconds` gets the time from the first send to the acknowledgement (CLOCK_MONOTONIC),
/// after a handshake that is not timed.
/// `batch` is how many messages go in one write: 1, one send a message; more (NF_UNIX_STREAM_EPOLL
/// only), one gathering sendmsg of `batch` messages, each its header and payload as two iovecs,
/// or one send of their copy when they come to at most 3,584 bytes (NF_COALESCED_LIMIT; the last
/// write carries what is left when `count` is not a multiple of `batch`), written as an
/// event loop writes: without blocking, and after a partial write the rest from the byte where
/// it stopped, once epoll says there is room. The responder takes the stream the same way
/// whatever the batch, each message whole (its reads do not see the writes' boundaries).
/// Only for mechanisms whose kernel buffers messages and that do not spin (unix-stream,
/// unix-stream+epoll, mqueue, pipe; mqueue+epoll's sender would block, so it has none);
/// ENOTSUP for the others and for a batch above 1 of another mechanism than NF_UNIX_STREAM_EPOLL,
/// EINVAL for a batch of 0 or above NF_STREAM_BATCH_MAX, EMSGSIZE above max_payload, ECONNRESET
/// if the responder went away.
int nf_stream(nf_channel *channel, const void *payload, size_t length, size_t count, size_t batch, uint64_t *nanoseconds);

/// Unlinks the channel's names. Safe to call while another thread is in nf_responder_serve
/// (a peer process that is told to stop does this before it exits).
void nf_remove_names(const nf_channel *channel);

/// Initiator: says goodbye (for the stream mechanisms the close itself says it, so nf_close
/// never raises SIGPIPE). Both ends: release everything and unlink the names. Accepts NULL.
void nf_close(nf_channel *channel);

/// Pins the calling thread, and no other, to `cpu`: the placement of one end of a measurement.
int nf_pin_calling_thread(int cpu);

/// The mechanism's name as ipcbench reports it ("unix-stream", "mqueue", "futex", "inotify",
/// "pipe", "unix-stream+epoll", "mqueue+epoll", "eventfd+epoll", "unix-stream+spin",
/// "mqueue+spin", "shm+spin", "journal", "unix-stream+epoll+handoff", "unix-stream+io_uring",
/// "eventfd+io_uring", "mqueue+poll", "eventfd+epoll+handoff", "mqueue+epoll+handoff",
/// "shm+spin+handoff", "unix-stream+spin+handoff", "mqueue+spin+handoff", "journal+handoff"),
/// or NULL for an unknown value.
const char *nf_mechanism_name(nf_mechanism mechanism);

#ifdef __cplusplus
}
#endif

#endif
