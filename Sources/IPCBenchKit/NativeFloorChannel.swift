import CNativeFloor
import Foundation
import IPCCore
import IPCSystem
import Synchronization

/// The responder end, in the floor peer process.
final class FloorResponder: @unchecked Sendable {
    // @unchecked: the C channel is used by one serving thread, and released under `closed`'s
    // lock so that a stop request from another thread never touches it afterwards.
    let mechanism: FloorMechanism
    private let channel: OpaquePointer
    /// Whether the channel is released; held while a stop request unlinks its names.
    private let closed = Mutex(false)

    /// Creates the mechanism's named objects in `directory`; an initiator may open them once this returns.
    /// - Throws: ``IPCError`` (``IPCError/Code/transportFailure``, or
    ///   ``IPCError/Code/invalidEndpoint`` for a directory whose paths are too long).
    init(mechanism: FloorMechanism, directory: String, maximumPayload: Int) throws {
        var made = nf_responder_create(mechanism.cValue, directory, maximumPayload)
        var code = errno
        if made == nil, code == EMFILE, mechanism.usesMessageQueues {
            // This user's queue memory is used up: by queues killed runs left, most often. They
            // are removed (those no live process holds open), and the queues made again, once.
            // (The removal's own calls may set errno: the create's is kept.)
            let removed = MessageQueue.removeAbandoned(matching: LeftoverQueues.madeByIPCBench)
            if !removed.isEmpty {
                made = nf_responder_create(mechanism.cValue, directory, maximumPayload)
                code = errno
            }
        }
        guard let channel = made else {
            throw IPCError.floor("creating the responder", mechanism: mechanism, errno: code)
        }
        self.mechanism = mechanism
        self.channel = channel
    }

    /// Echoes requests until the initiator says goodbye or closes its end; then releases the channel.
    /// - Throws: ``IPCError`` if a request is malformed or over the maximum, or a system call fails.
    func serve() throws {
        let result = nf_responder_serve(channel)
        let error = errno
        closed.withLock { closed in
            closed = true
            nf_close(channel)
        }
        guard result == 0 else { throw IPCError.floor("serving", mechanism: mechanism, errno: error) }
    }

    /// Unlinks the channel's names, even while ``serve()`` runs on another thread.
    func removeNames() {
        closed.withLock { closed in
            if !closed { nf_remove_names(channel) }
        }
    }
}

/// The initiator end, in the measuring process. Sendable so that it can move to a measuring
/// thread; its owner serializes the calls (``FloorSession`` keeps it in a `Mutex`).
final class FloorInitiator: @unchecked Sendable {
    // @unchecked: its owner serializes every call (see above).
    let mechanism: FloorMechanism
    private let channel: OpaquePointer

    /// Opens the channel the responder process `responder` created in `directory`.
    /// - Throws: ``IPCError`` (``IPCError/Code/peerInvalidated`` if the responder is gone).
    init(mechanism: FloorMechanism, directory: String, maximumPayload: Int, responder: Int32) throws {
        guard let channel = nf_initiator_open(mechanism.cValue, directory, maximumPayload, responder) else {
            throw IPCError.floor("opening the initiator", mechanism: mechanism, errno: errno)
        }
        self.mechanism = mechanism
        self.channel = channel
    }

    deinit {
        nf_close(channel)
    }

    /// Sends `request` and waits for its echo in `reply`, which must have room for as many bytes.
    /// - Throws: ``IPCError/Code/payloadTooLarge`` above the maximum payload;
    ///   ``IPCError/Code/peerInvalidated`` if the responder went away;
    ///   ``IPCError/Code/malformedFrame`` for a reply of another length.
    @inline(__always)
    func roundTrip(_ request: UnsafeRawBufferPointer, reply: UnsafeMutableRawBufferPointer) throws {
        precondition(reply.count >= request.count, "the reply buffer is smaller than the request")
        // An empty buffer has no base address; the C side touches no byte of a zero-length payload.
        guard nf_round_trip(channel, request.baseAddress, reply.baseAddress, request.count) == 0 else { throw IPCError.floor("a round trip", mechanism: mechanism, errno: errno) }
    }

    /// Sends `count` one-way messages carrying `payload`, `batch` to a write, and returns once
    /// the responder has read them all: the nanoseconds from the first send until then.
    /// - Throws: ``IPCError/Code/unsupportedOperation`` for a mechanism that cannot stream
    ///   (``FloorMechanism/streams``) or batch (``FloorMechanism/streamsInBatches``);
    ///   ``IPCError/Code/transportFailure`` for a batch outside 1...512; otherwise as
    ///   ``roundTrip(_:reply:)``.
    func stream(_ payload: UnsafeRawBufferPointer, count: Int, batch: Int) throws -> UInt64 {
        var nanoseconds: UInt64 = 0
        guard nf_stream(channel, payload.baseAddress, payload.count, count, batch, &nanoseconds) == 0 else { throw IPCError.floor("a stream", mechanism: mechanism, errno: errno) }
        return nanoseconds
    }
}

extension FloorMechanism {
    /// Whether the kernel buffers this mechanism's messages, so that one-way throughput means
    /// something (a sender can run ahead of its receiver). `unix-stream+epoll` streams as an
    /// event loop does (writes that do not block, epoll_wait before each read); `mqueue+epoll`
    /// has no stream: its sender would block.
    public var streams: Bool {
        switch self {
        case .unixStream, .mqueue, .pipe, .unixStreamEpoll, .unixStreamIoUring: true
        case .futex, .inotify, .mqueueEpoll, .eventfdEpoll, .unixStreamSpin, .mqueueSpin, .shmSpin, .journal, .unixStreamEpollHandoff, .eventfdIoUring, .mqueuePoll,
            .eventfdEpollHandoff, .mqueueEpollHandoff, .shmSpinHandoff, .unixStreamSpinHandoff, .mqueueSpinHandoff, .journalHandoff: false
        }
    }

    /// Whether this floor's stream can write several messages in one gathering `sendmsg`
    /// (``FloorSession/streamTime(payloadSize:count:batch:)``): `unix-stream+epoll`'s, written
    /// as an event loop writes a batch (without blocking; after a partial write the rest from
    /// the byte where it stopped, once `epoll_wait` says there is room).
    public var streamsInBatches: Bool { self == .unixStreamEpoll }

    var cValue: nf_mechanism {
        switch self {
        case .unixStream: NF_UNIX_STREAM
        case .mqueue: NF_MQUEUE
        case .futex: NF_FUTEX
        case .inotify: NF_INOTIFY
        case .pipe: NF_PIPE
        case .unixStreamEpoll: NF_UNIX_STREAM_EPOLL
        case .mqueueEpoll: NF_MQUEUE_EPOLL
        case .eventfdEpoll: NF_EVENTFD_EPOLL
        case .unixStreamSpin: NF_UNIX_STREAM_SPIN
        case .mqueueSpin: NF_MQUEUE_SPIN
        case .shmSpin: NF_SHM_SPIN
        case .journal: NF_JOURNAL
        case .unixStreamEpollHandoff: NF_UNIX_STREAM_EPOLL_HANDOFF
        case .unixStreamIoUring: NF_UNIX_STREAM_IO_URING
        case .eventfdIoUring: NF_EVENTFD_IO_URING
        case .mqueuePoll: NF_MQUEUE_POLL
        case .eventfdEpollHandoff: NF_EVENTFD_EPOLL_HANDOFF
        case .mqueueEpollHandoff: NF_MQUEUE_EPOLL_HANDOFF
        case .shmSpinHandoff: NF_SHM_SPIN_HANDOFF
        case .unixStreamSpinHandoff: NF_UNIX_STREAM_SPIN_HANDOFF
        case .mqueueSpinHandoff: NF_MQUEUE_SPIN_HANDOFF
        case .journalHandoff: NF_JOURNAL_HANDOFF
        }
    }
}

extension IPCError {
    /// The error for a floor function that failed with `errno`.
    static func floor(_ operation: String, mechanism: FloorMechanism, errno code: Int32) -> IPCError {
        let kind: IPCError.Code
        switch code {
        case ECONNRESET, EPIPE: kind = .peerInvalidated
        case EMSGSIZE: kind = .payloadTooLarge
        case EPROTO: kind = .malformedFrame
        case ENAMETOOLONG: kind = .invalidEndpoint
        case ENOTSUP: kind = .unsupportedOperation
        default: kind = .transportFailure
        }
        if code == EMFILE, mechanism.usesMessageQueues {
            // mq_open's EMFILE is rarely about descriptors: it is the per-user queue memory.
            return IPCError(code: kind, message: "native floor \(mechanism): \(operation) failed: this user's message queue memory (RLIMIT_MSGQUEUE, `ulimit -q`, 800 KiB by default) is used up by queues live processes hold open; `ls -l /dev/mqueue` lists them (errno \(code), EMFILE)")
        }
        return IPCError(code: kind, message: "native floor \(mechanism): \(operation) failed: \(String(cString: strerror(code))) (errno \(code))")
    }
}

/// Pins the calling thread (only it) to `cpu`.
/// - Throws: ``IPCError/Code/transportFailure`` if the kernel refuses, for example for a CPU that
///   does not exist.
func pinCallingThread(to cpu: Int) throws {
    guard nf_pin_calling_thread(CInt(cpu)) == 0 else {
        let code = errno
        throw IPCError(code: .transportFailure, message: "sched_setaffinity to CPU \(cpu) failed: \(String(cString: strerror(code)))")
    }
}

/// The POSIX message queues this package makes: message-port's (`/ipcb.…`) and the mqueue
/// floors' (`….floor-…`). What `ipcbench clean` and a create that meets the quota may remove
/// once no process holds them.
public enum LeftoverQueues {
    public static func madeByIPCBench(_ name: String) -> Bool {
        name.hasPrefix("ipcb.") || name.contains(".floor-")
    }
}
