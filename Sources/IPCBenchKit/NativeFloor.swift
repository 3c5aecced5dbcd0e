import CNativeFloor
import Foundation
public import IPCCore
import IPCEngine
import IPCSystem
import Synchronization

/// A kernel mechanism under a transport, measured raw (in C, no framing, no threads) as that
/// transport's native floor: the cheapest round trip the mechanism allows between two processes.
public enum FloorMechanism: String, Sendable, Hashable, Codable, CaseIterable, CustomStringConvertible {
    /// An AF_UNIX stream socket: under `unix-socket`.
    case unixStream = "unix-stream"
    /// A pair of POSIX message queues, large messages fragmented: under `message-port`.
    case mqueue
    /// A futex per direction on a shared file mapping that carries the payload: under `notify`.
    case futex
    /// Write and close a file, wait for inotify's IN_CLOSE_WRITE, read it: under `file-presenter`.
    case inotify
    /// A pair of FIFOs: no transport uses it; the classic reference.
    case pipe
    /// ``unixStream`` with an `epoll_wait` before every read: the kernel work of an event loop.
    case unixStreamEpoll = "unix-stream+epoll"
    /// ``mqueue`` with an `epoll_wait` before every receive.
    case mqueueEpoll = "mqueue+epoll"
    /// ``futex``'s shared mapping with eventfd doorbells waited on with `epoll_wait`
    /// (edge-triggered), the notify transport's kernel work.
    case eventfdEpoll = "eventfd+epoll"
    /// ``unixStream``, each end polling by receiving: a `recvmsg` that does not wait
    /// (`MSG_DONTWAIT`), again and again until a message is there, so a message costs one call
    /// when it comes (a `poll(2)` first would cost a second).
    case unixStreamSpin = "unix-stream+spin"
    /// ``mqueue``, polled the same way: `mq_timedreceive` with a deadline in the past.
    case mqueueSpin = "mqueue+spin"
    /// ``futex``'s shared mapping, busy-polled: no system call at all, the limit of any
    /// shared-memory transport.
    case shmSpin = "shm+spin"
    /// A journal file per direction kept as the file-presenter transport keeps its journals
    /// (exclusive lock, write, end published through a mapping, unlock; inotify wake-up, shared
    /// lock, read, unlock).
    case journal
    /// ``unixStreamEpoll`` with the responder's echo written by a second thread, handed each
    /// request by the thread that waits and reads: the kernel work of a server whose request
    /// handler runs off its event loop (unix-socket's async handler on the serving threads).
    case unixStreamEpollHandoff = "unix-stream+epoll+handoff"
    /// ``unixStream`` waited on with io_uring: one `io_uring_enter` per half round trip submits
    /// the send and waits for the receive (the kernel work of an event loop on io_uring).
    case unixStreamIoUring = "unix-stream+io_uring"
    /// ``eventfdEpoll``'s mapping and doorbells, the doorbell written and read through io_uring:
    /// one `io_uring_enter` per half round trip.
    case eventfdIoUring = "eventfd+io_uring"
    /// ``mqueue`` with a `poll` of the one queue descriptor before every receive.
    case mqueuePoll = "mqueue+poll"
    /// ``eventfdEpoll`` with the responder's echo published and its doorbell rung by a second
    /// thread, handed each request as ``unixStreamEpollHandoff`` hands it: notify's async handler
    /// on the serving threads.
    case eventfdEpollHandoff = "eventfd+epoll+handoff"
    /// ``mqueueEpoll`` with the responder's echo sent by a second thread, handed each request as
    /// ``unixStreamEpollHandoff`` hands it: message-port's async handler on the serving threads.
    case mqueueEpollHandoff = "mqueue+epoll+handoff"
    /// ``shmSpin`` with the responder's echo published by a second thread: the thread that
    /// busy-polls hands each request to it (a futex wake), as ``unixStreamEpollHandoff`` hands
    /// it, and polls again. The limit of a spinning notify-style server whose request handler
    /// runs off its event loop (notify's async handler while it spins).
    case shmSpinHandoff = "shm+spin+handoff"
    /// ``unixStreamSpin`` with the echo written by a second thread, handed over as
    /// ``shmSpinHandoff`` hands it (unix-socket's async handler while it spins).
    case unixStreamSpinHandoff = "unix-stream+spin+handoff"
    /// ``mqueueSpin`` with the echo sent by a second thread, handed over as ``shmSpinHandoff``
    /// hands it (message-port's async handler while it spins).
    case mqueueSpinHandoff = "mqueue+spin+handoff"
    /// ``journal`` with the responder's echo written by a second thread, handed each request as
    /// ``unixStreamEpollHandoff`` hands it: file-presenter's async handler on the serving threads.
    case journalHandoff = "journal+handoff"

    public var description: String { rawValue }

    /// Whether the floor's channel is a pair of POSIX message queues.
    var usesMessageQueues: Bool {
        switch self {
        case .mqueue, .mqueueEpoll, .mqueueSpin, .mqueuePoll, .mqueueEpollHandoff, .mqueueSpinHandoff: true
        default: false
        }
    }

    /// The floor that does the kernel work the transport's blocking round trip does: the
    /// mechanism waited on as an event loop waits (`epoll_wait`, then the read) for the
    /// transports on the event loop, the journal protocol for file-presenter. A transport's
    /// ratio to it is what its own code adds. `nil` for pipe and for these floors themselves.
    public var sameWork: FloorMechanism? {
        switch self {
        case .unixStream: .unixStreamEpoll
        case .mqueue: .mqueueEpoll
        case .futex: .eventfdEpoll
        case .inotify: .journal
        case .pipe, .unixStreamEpoll, .mqueueEpoll, .eventfdEpoll, .unixStreamSpin, .mqueueSpin, .shmSpin, .journal, .unixStreamEpollHandoff,
            .unixStreamIoUring, .eventfdIoUring, .mqueuePoll, .eventfdEpollHandoff, .mqueueEpollHandoff, .shmSpinHandoff, .unixStreamSpinHandoff,
            .mqueueSpinHandoff, .journalHandoff: nil
        }
    }

    /// Every event-driven floor that does the transport's kernel work and that a run measures:
    /// ``sameWork`` (epoll) and the same work waited on with io_uring, where there is such a
    /// floor. A transport's main rows are measured against the fastest of them in the same run,
    /// so that a faster kernel path the engine does not take still counts against it.
    /// ``mqueuePoll`` is measured by `ipcbench floor` only: a third floor's message queues,
    /// beside the mqueue and mqueue+epoll floors' and message-port's own, use up the user's
    /// `RLIMIT_MSGQUEUE` (800 KiB by default) in a full run.
    public var sameWorkFloors: [FloorMechanism] {
        switch self {
        case .unixStream: [.unixStreamEpoll, .unixStreamIoUring]
        case .futex: [.eventfdEpoll, .eventfdIoUring]
        default: sameWork.map { [$0] } ?? []
        }
    }

    /// The floor whose stream, written ``ThroughputResult/batch`` messages at a time
    /// (``FloorMechanism/streamsInBatches``: one gathering `sendmsg` a batch, each message its
    /// header and payload, or one `send` of a copy for a batch of at most 3,584 bytes, without
    /// blocking), does the kernel work of the transport's batched
    /// stream (`send(contentsOf:)`, one gathering write a batch): ``unixStreamEpoll`` for
    /// unix-socket, `nil` for the others.
    public var batchedSameWork: FloorMechanism? {
        self == .unixStream ? .unixStreamEpoll : nil
    }

    /// The floor that does the kernel work of the transport's round trip when its server's
    /// request handler runs off the event loop (the async handler on the serving threads): the
    /// same-work floor (epoll, or the journal protocol) plus one thread hand-over per request:
    /// unix-socket's, notify's, message-port's and file-presenter's; `nil` for the others.
    public var handOff: FloorMechanism? {
        switch self {
        case .unixStream: .unixStreamEpollHandoff
        case .futex: .eventfdEpollHandoff
        case .mqueue: .mqueueEpollHandoff
        case .inotify: .journalHandoff
        default: nil
        }
    }

    /// The floor that spins the way the transport's spin-then-block strategy does: polling the
    /// socket or queue by receiving without waiting, or busy-polling shared memory. Measured with split cores
    /// only. `nil` where the transport does not spin.
    public var spinning: FloorMechanism? {
        switch self {
        case .unixStream: .unixStreamSpin
        case .mqueue: .mqueueSpin
        case .futex: .shmSpin
        case .inotify, .pipe, .unixStreamEpoll, .mqueueEpoll, .eventfdEpoll, .unixStreamSpin, .mqueueSpin, .shmSpin, .journal, .unixStreamEpollHandoff,
            .unixStreamIoUring, .eventfdIoUring, .mqueuePoll, .eventfdEpollHandoff, .mqueueEpollHandoff, .shmSpinHandoff, .unixStreamSpinHandoff,
            .mqueueSpinHandoff, .journalHandoff: nil
        }
    }

    /// ``spinning`` with one thread hand-over per request on the responder's side: the floor of
    /// the transport's spinning rows when its server's request handler runs off the event loop
    /// (the async handler on the serving threads), as ``handOff`` is of its blocking rows.
    /// Measured with split cores only, where the responder's two threads share the peer's core.
    public var spinningHandOff: FloorMechanism? {
        switch self {
        case .unixStream: .unixStreamSpinHandoff
        case .mqueue: .mqueueSpinHandoff
        case .futex: .shmSpinHandoff
        default: nil
        }
    }

    /// Whether this floor busy-polls (so it runs only with the two ends on different cores).
    public var spins: Bool {
        switch self {
        case .unixStreamSpin, .mqueueSpin, .shmSpin, .shmSpinHandoff, .unixStreamSpinHandoff, .mqueueSpinHandoff: true
        default: false
        }
    }

    /// The mechanism under the transport called `transport` (a ``TransportCatalog`` name), or
    /// `nil` for a name without one.
    public init?(transport: String) {
        switch transport {
        case "unix-socket": self = .unixStream
        case "message-port": self = .mqueue
        case "notify": self = .futex
        case "file-presenter": self = .inotify
        default: return nil
        }
    }

    /// Whether this kernel lets the process use the mechanism (the io_uring floors are skipped
    /// where io_uring is disabled or refused).
    public var isAvailable: Bool { nf_mechanism_available(cValue) == 1 }

    /// What results call this floor in ``LatencyResult/transport``: `floor:<mechanism>`.
    public var resultName: String { "floor:" + rawValue }
}

/// A floor peer process (`ipcbench floor-peer`) and this process's end of the channel to it.
///
/// The peer runs pinned to the placement's peer CPU. Round trips run on a thread of their own
/// pinned to the placement's local CPU, with SIGPIPE blocked there, so a pipe whose peer died
/// fails with an error instead of killing this process.
public final class FloorSession: Sendable {
    public let mechanism: FloorMechanism
    public let placement: Placement
    /// The largest payload, in bytes, a round trip may carry.
    public let maximumPayload: Int
    private let peer: PeerProcess
    /// `nil` once closed. The lock also keeps round trips from overlapping.
    private let initiator: Mutex<FloorInitiator?>

    /// The floor peer's process id, for reading its CPU time.
    public var peerPID: Int32 { peer.pid }

    /// Starts a floor peer whose names live in `group`, and opens the channel to it.
    /// - Throws: ``IPCError/Code/transportFailure`` if the peer cannot be started or the channel
    ///   opened; ``IPCError/Code/invalidEndpoint`` if the group directory's path is too long for
    ///   a socket address.
    public init(mechanism: FloorMechanism, placement: Placement, group: GroupDirectory, maximumPayload: Int = NativeFloor.defaultMaximumPayload) throws {
        var arguments = ["floor-peer", "--mechanism", mechanism.rawValue, "--group", group.path, "--max-payload", String(maximumPayload)]
        if let cpu = placement.cpus?.peer { arguments += ["--cpu", String(cpu)] }
        let peer = try PeerProcess(arguments: arguments)
        do {
            initiator = Mutex(try FloorInitiator(mechanism: mechanism, directory: group.path, maximumPayload: maximumPayload, responder: peer.pid))
        } catch {
            peer.stop()
            throw error
        }
        self.mechanism = mechanism
        self.placement = placement
        self.maximumPayload = maximumPayload
        self.peer = peer
    }

    /// Makes `count` round trips of `payloadSize` bytes back to back and returns how long each
    /// took in nanoseconds, read from ``monotonicNanoseconds()`` around each one exactly as
    /// ``LatencyRunner`` times a transport's request. The last echo is checked byte for byte.
    /// - Throws: ``IPCError/Code/payloadTooLarge`` above ``maximumPayload``;
    ///   ``IPCError/Code/peerInvalidated`` if the peer went away; ``IPCError/Code/invalidated``
    ///   after ``close()``; ``IPCError/Code/malformedPayload`` if the echo differs.
    public func roundTripTimes(payloadSize: Int, count: Int) async throws -> [UInt64] {
        try checkPayloadSize(payloadSize)
        return try await onMeasuringThread {
            let request = [UInt8](repeating: 0xA5, count: payloadSize)
            var reply = [UInt8](repeating: 0, count: payloadSize)
            var times: [UInt64] = []
            times.reserveCapacity(count)
            try self.withInitiator { initiator in
                try request.withUnsafeBytes { request in
                    try reply.withUnsafeMutableBytes { reply in
                        for _ in 0..<count {
                            let start = monotonicNanoseconds()
                            try initiator.roundTrip(request, reply: reply)
                            times.append(monotonicNanoseconds() - start)
                        }
                    }
                }
            }
            guard count == 0 || reply == request else {
                throw IPCError(code: .malformedPayload, message: "native floor \(self.mechanism): the echo of \(payloadSize) bytes differs from the request")
            }
            return times
        }
    }

    /// One round trip: sends `payload` and returns what came back.
    /// - Throws: as ``roundTripTimes(payloadSize:count:)``.
    public func echo(_ payload: [UInt8]) async throws -> [UInt8] {
        try checkPayloadSize(payload.count)
        return try await onMeasuringThread {
            var reply = [UInt8](repeating: 0, count: payload.count)
            try self.withInitiator { initiator in
                try payload.withUnsafeBytes { request in
                    try reply.withUnsafeMutableBytes { try initiator.roundTrip(request, reply: $0) }
                }
            }
            return reply
        }
    }

    /// Sends `count` one-way messages of `payloadSize` bytes back to back and returns how long it
    /// took until the peer had read them all, in nanoseconds: the one-way throughput floor.
    /// `batch` messages go in one gathering write (``FloorMechanism/streamsInBatches``; the last
    /// write carries the rest when `count` is not a multiple); 1, one write a message.
    /// - Throws: ``IPCError/Code/unsupportedOperation`` for a mechanism that does not buffer
    ///   (``FloorMechanism/streams``), or a batch above 1 of one that does not batch;
    ///   ``IPCError/Code/transportFailure`` for a batch below 1 or above 512; otherwise as
    ///   ``roundTripTimes(payloadSize:count:)``.
    public func streamTime(payloadSize: Int, count: Int, batch: Int = 1) async throws -> UInt64 {
        try checkPayloadSize(payloadSize)
        return try await onMeasuringThread {
            let payload = [UInt8](repeating: 0x5A, count: payloadSize)
            return try self.withInitiator { initiator in
                try payload.withUnsafeBytes { try initiator.stream($0, count: count, batch: batch) }
            }
        }
    }

    /// Says goodbye, waits for the peer to exit, and leaves no name behind. Later round trips
    /// fail; closing again does nothing.
    public func close() {
        initiator.withLock { $0 = nil }
        peer.stop()
    }

    private func checkPayloadSize(_ size: Int) throws {
        guard size <= maximumPayload else {
            throw IPCError(code: .payloadTooLarge, message: "native floor \(mechanism): \(size) bytes is over this session's maximum of \(maximumPayload)")
        }
    }

    private func withInitiator<T>(_ body: (FloorInitiator) throws -> T) throws -> T {
        try initiator.withLock { initiator in
            guard let initiator else { throw IPCError(code: .invalidated, message: "native floor \(mechanism): the session is closed") }
            return try body(initiator)
        }
    }

    /// Runs `body` on a new thread pinned to the placement's local CPU, with SIGPIPE blocked.
    /// A thread of its own rather than a task's: the round trips block in system calls, which
    /// must not hold one of the few threads Swift concurrency has (two on this machine).
    private func onMeasuringThread<T: Sendable>(_ body: @escaping @Sendable () throws -> T) async throws -> T {
        let cpu = placement.cpus?.local
        return try await runBlocking {
            var signals = sigset_t()
            sigemptyset(&signals)
            sigaddset(&signals, SIGPIPE)
            pthread_sigmask(SIG_BLOCK, &signals, nil)
            if let cpu { try pinCallingThread(to: cpu) }
            return try body()
        }
    }
}
