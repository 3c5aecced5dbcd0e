#if os(Linux)
import CIPCShims
import Dispatch
import Glibc
package import IPCCore
package import IPCSystem
import Synchronization
public import SystemPackage

/// The answer a listener gives on a rendezvous socket: one 32-bit little-endian word
/// (docs/WIRE-FORMAT.md, section 6).
public enum RendezvousStatus: UInt32, Sendable {
    case accepted = 1
    /// The accept filter refused this client's credentials.
    case refused = 2
    /// The hello (or what came with it) was not valid.
    case malformed = 3
    /// Too many clients are in the middle of connecting, or the listener keeps as many
    /// connections as its ``IPCCore/ConnectionOptions/maximumConnections``.
    case busy = 4

    public var bytes: [UInt8] { withUnsafeBytes(of: rawValue.littleEndian, Array.init) }

    /// Sends this answer without waiting (a client that does not read it is not waited for).
    public func send(on socket: FileDescriptor) {
        _ = bytes.withUnsafeBytes { Glibc.send(socket.rawValue, $0.baseAddress, $0.count, CInt(MSG_DONTWAIT | MSG_NOSIGNAL)) }
    }

    /// The client's side: waits up to `timeout` for the listener's answer on `socket`, and
    /// returns if it is ``accepted``.
    /// - Throws: ``IPCError/Code/accessDenied`` if the accept filter refused this process;
    ///   ``IPCError/Code/endpointNotFound`` if the listener was busy (made with
    ///   ``IPCError/listenerBusy(_:answered:)``) or did not answer in time (plain: this variant
    ///   cannot tell whether a process holds the endpoint);
    ///   ``IPCError/Code/transportFailure`` if it found the hello malformed or did not answer
    ///   with a status word. `listener` names the transport in the messages.
    public static func awaitAcceptance(on socket: FileDescriptor, timeout: Duration, listener: String) throws {
        try awaitAcceptance(on: socket, deadline: monotonicNanoseconds() &+ timeout.wholeNanoseconds, listener: listener) { false }
    }

    /// ``awaitAcceptance(on:timeout:listener:)`` until a ``monotonicNanoseconds()`` deadline.
    /// `claimed` says, once no answer came in time, whether a process holds the endpoint (its
    /// ``IPCSystem/EndpointLock``): then the listener runs, flooded with clients, hung or
    /// stopped, and the error is its busy answer without an answer
    /// (``IPCCore/IPCError/ListenerBusy/answered`` `false`: a ``IPCCore/ServiceConnection`` does
    /// not start another copy). Otherwise no listener of the endpoint runs (the socket that took
    /// the connection was put there by another process, or is a launcher's whose service has not
    /// taken the endpoint yet), and the error is a plain ``IPCError/Code/endpointNotFound``.
    package static func awaitAcceptance(on socket: FileDescriptor, deadline: UInt64, listener: String, claimed: () -> Bool) throws {
        guard let status = try read(from: socket, deadline: deadline) else {
            guard claimed() else {
                throw IPCError(code: .endpointNotFound, message: "the \(listener) listener did not answer within the connect timeout, and no process holds its endpoint")
            }
            throw IPCError.listenerBusy(
                "the \(listener) listener took the connection but did not answer within the connect timeout: it runs, but is flooded with clients, hung or stopped; try again later",
                answered: false
            )
        }
        switch status {
        case .accepted:
            return
        case .refused:
            throw IPCError(code: .accessDenied, message: "the \(listener) listener's accept filter refused this process")
        case .busy:
            throw IPCError.listenerBusy("the \(listener) listener is full (as many connections as it keeps, or too many clients connecting at once); try again later")
        case .malformed:
            throw IPCError(code: .transportFailure, message: "the \(listener) listener did not accept the hello (malformed)")
        }
    }

    /// The client's connect to the rendezvous socket at `path` of `endpoint`, before its hello:
    /// waits at most `connectTimeout` for room in the listener's backlog
    /// (``IPCSystem/UnixSocket/connect(path:kind:timeout:held:)``, busy without an answer while a
    /// process holds the endpoint), and returns the socket with the deadline for the listener's
    /// answer (a ``monotonicNanoseconds()`` reading). The one timeout covers the room and the
    /// answer, but the answer is given at least a quarter of it (a listener that made room late
    /// is draining its backlog, and answers next): a connect takes about 1.25 `connectTimeout`
    /// at most.
    /// - Throws: as ``IPCSystem/UnixSocket/connect(path:kind:timeout:held:)``.
    package static func connect(path: String, endpoint: Endpoint, connectTimeout: Duration) throws -> (socket: FileDescriptor, answerDeadline: UInt64) {
        let started = monotonicNanoseconds()
        let socket = try UnixSocket.connect(path: path, timeout: connectTimeout) { EndpointLock.owner(of: endpoint) != nil }
        let timeout = connectTimeout.wholeNanoseconds
        return (socket, max(started &+ timeout, monotonicNanoseconds() &+ timeout / 4))
    }

    /// The client's side: waits until `deadline` (``monotonicNanoseconds()``) for the listener's
    /// answer on `socket`, looking once more at the deadline (once, if it has passed); `nil` if
    /// none came by then.
    /// - Throws: ``IPCError/Code/transportFailure`` if the listener closed the socket without a
    ///   whole answer or answered something else.
    package static func read(from socket: FileDescriptor, deadline: UInt64) throws -> RendezvousStatus? {
        // The socket is looked at once more at the deadline (or once, if it has passed): an
        // answer that is there by then counts.
        var lookedLast = false
        while true {
            let now = monotonicNanoseconds()
            if now >= deadline {
                if lookedLast { return nil }
                lookedLast = true
            }
            var entry = pollfd(fd: socket.rawValue, events: Int16(POLLIN), revents: 0)
            let result = poll(&entry, 1, now >= deadline ? 0 : CInt(clamping: (deadline - now + 999_999) / 1_000_000))
            if result < 0, errno != EINTR { throw IPCError.syscall("poll", Errno(rawValue: errno)) }
            guard result > 0 else { continue }
            var answer = [UInt8](repeating: 0, count: 4)
            guard let count = try answer.withUnsafeMutableBytes({ try UnixSocket.readIfReady(socket, into: $0) }) else { continue }
            guard count == 4, let status = RendezvousStatus(rawValue: answer.reversed().reduce(UInt32(0)) { $0 << 8 | UInt32($1) }) else {
                throw IPCError(code: .transportFailure, message: "the listener did not answer with a status word (got \(answer.prefix(count)))")
            }
            return status
        }
    }
}

/// What a transport's handshake made of a readable client socket (``SocketEndpoint/Accept/afterHandshake(timeout:maximumPending:handshake:)``).
public enum RendezvousHandshake: Sendable {
    /// Not all of the hello is there yet: wait for more.
    case incomplete
    /// Answer with this status and close the socket.
    case finished(RendezvousStatus)
    /// Accepted and kept: the acceptor stops watching the socket, answers
    /// ``RendezvousStatus/accepted``, and then calls `adopt`, which owns the socket from then
    /// on (it may watch it on the loop: the acceptor's watch is gone).
    case accepted(adopt: @Sendable () -> Void)
}

/// The listening side of an `AF_UNIX` stream socket in the group directory, on the event loop:
/// accepts every client waiting on each wake-up (backlog `SOMAXCONN`), takes its
/// kernel-verified credentials (`SO_PEERCRED`) and asks the accept filter, off the loop (a
/// serial queue of the acceptor's; at most ``maximumFiltering`` clients wait for it, the next
/// are turned away as busy, as below). Then, by ``Mode``:
///
/// - ``Mode/immediate(refusal:_:)`` (unix-socket, whose messages travel over the accepted
///   socket): the client is handed over at once; a refused one is sent the transport's refusal
///   (bytes the client reads as its first frame) and closed.
/// - ``Mode/handshake(timeout:maximumPending:_:)`` (notify, file-presenter: a *rendezvous*
///   socket that sets each connection up): a refused client is answered
///   ``RendezvousStatus/refused``; the transport's handshake is called each time the client's
///   socket is readable, until it finishes. A client that says nothing is dropped after
///   `timeout`, and at most `maximumPending` may be in the middle of connecting (the next are
///   answered ``RendezvousStatus/busy``), so clients that never finish cannot hold the
///   listener's descriptors.
///
/// With a room check (a listener's ``IPCCore/ConnectionOptions/maximumConnections``), a client
/// the filter let through is turned away as busy while the listener is full: answered
/// ``RendezvousStatus/busy``, or in immediate mode sent the transport's busy refusal.
///
/// Nothing here blocks the loop, whatever the accept filter does.
package final class SocketAcceptor: Sendable {
    package typealias Handshake = RendezvousHandshake

    /// What happens to a client the accept filter let through (loop thread).
    package enum Mode: Sendable {
        /// Hand the socket over at once; the callee owns it. A refused client is sent `refusal`
        /// (without waiting: it is small enough for any socket buffer) before it is closed.
        case immediate(refusal: [UInt8], @Sendable (FileDescriptor, PeerCredentials) -> Void)
        /// Wait for the client's hello (see ``Handshake``).
        case handshake(timeout: Duration, maximumPending: Int, @Sendable (FileDescriptor, PeerCredentials) -> Handshake)
    }

    private let listenFD: FileDescriptor
    /// The socket came from a launcher (socket activation), which keeps its own reference:
    /// closing must not shut it down, or the launcher's socket would refuse everyone after us.
    private let inherited: Bool
    private let loop: EventLoop
    private let acceptFilter: AcceptFilter?
    private let mode: Mode
    /// Whether one more client may be taken, given how many are in the middle of their
    /// handshake (loop thread); `nil`: always. One turned away is told it is busy: in handshake
    /// mode ``RendezvousStatus/busy``, in immediate mode ``busyRefusal``.
    private let hasRoom: (@Sendable (_ pending: Int) -> Bool)?
    /// What an immediate-mode client turned away by ``hasRoom`` is sent before its socket is closed.
    private let busyRefusal: [UInt8]
    private let watch = Mutex<EventLoop.ReadinessWatch?>(nil)
    private let closed = Atomic<Bool>(false)
    private let pending = Pending()

    /// Sockets of clients between connecting and the end of their handshake, by descriptor.
    private final class Pending: Sendable {
        struct Entry: Sendable {
            var watch: EventLoop.ReadinessWatch
            var peer: PeerCredentials
            /// Tells this handshake from a later one on a reused descriptor number.
            var serial: UInt64
        }

        let entries = Mutex<[FileDescriptor: Entry]>([:])
        private let nextSerial = Atomic<UInt64>(0)

        func add(_ fd: FileDescriptor, watch: EventLoop.ReadinessWatch, peer: PeerCredentials) -> UInt64 {
            let serial = nextSerial.add(1, ordering: .relaxed).newValue
            entries.withLock { $0[fd] = Entry(watch: watch, peer: peer, serial: serial) }
            return serial
        }

        /// Stops watching `fd` (loop thread) if it is pending (and is handshake `serial`, if
        /// given); returns its entry if so. The caller answers or closes `fd`.
        func remove(_ fd: FileDescriptor, serial: UInt64? = nil, on loop: EventLoop) -> Entry? {
            let entry: Entry? = entries.withLock { entries in
                guard let entry = entries[fd], serial == nil || entry.serial == serial else { return nil }
                entries[fd] = nil
                return entry
            }
            if let entry { loop.cancel(entry.watch) }
            return entry
        }
    }

    /// Listens on `path` (which the caller, holding the endpoint's lock, has cleared).
    /// - Throws: ``IPCError/Code/transportFailure`` if the socket cannot be made or watched.
    /// With `activated`, accepts on the listening socket bound to `path` that a launcher handed
    /// over (``SocketActivation``), which stays the launcher's: closing neither shuts it down
    /// nor removes its file.
    /// - Throws: ``IPCError/Code/invalidEndpoint`` if `activated` and no such socket was passed.
    /// With `hasRoom`, a client it says no to is turned away as busy (see ``hasRoom``).
    package convenience init(
        path: String, kind: UnixSocket.Kind = .stream, activated: Bool = false, loop: EventLoop, acceptFilter: AcceptFilter?, mode: Mode,
        hasRoom: (@Sendable (_ pending: Int) -> Bool)? = nil, busyRefusal: [UInt8] = []
    ) throws {
        let fd = activated ? try SocketActivation.takeListeningSocket(boundTo: path, kind: kind) : try UnixSocket.listen(path: path, kind: kind)
        try self.init(listening: fd, inherited: activated, loop: loop, acceptFilter: acceptFilter, mode: mode, hasRoom: hasRoom, busyRefusal: busyRefusal)
    }

    private init(
        listening fd: FileDescriptor, inherited: Bool, loop: EventLoop, acceptFilter: AcceptFilter?, mode: Mode,
        hasRoom: (@Sendable (_ pending: Int) -> Bool)?, busyRefusal: [UInt8]
    ) throws {
        listenFD = fd
        self.inherited = inherited
        self.loop = loop
        self.acceptFilter = acceptFilter
        self.mode = mode
        self.hasRoom = hasRoom
        self.busyRefusal = busyRefusal
        do {
            // Weak: the loop's table must not keep an acceptor alive that its owner dropped.
            let watching = try loop.watchReadable(listenFD) { [weak self] in self?.acceptWaiting() }
            watch.withLock { $0 = watching }
        } catch {
            try? listenFD.close()
            throw error
        }
    }

    /// Stops accepting; clients in the middle of their handshake are dropped. The caller removes
    /// the socket file. Idempotent; the loop stops watching and closes in its own time.
    package func close() {
        guard !closed.exchange(true, ordering: .acquiringAndReleasing) else { return }
        if !inherited { UnixSocket.shutdown(listenFD) }
        let watch = watch.withLock { $0 }
        loop.execute { [listenFD, loop, pending] in
            if let watch { loop.cancel(watch) }
            try? listenFD.close()
            for fd in pending.entries.withLock({ Array($0.keys) }) where pending.remove(fd, on: loop) != nil {
                try? fd.close()
            }
        }
    }

    deinit {
        close()
    }

    /// On the loop: accepts whatever waits in the backlog, then, if `isIdle()` and no client is
    /// in its handshake, closes and returns `true`; else returns `false` and keeps serving.
    /// With ``IdleHandOver/refuseNewConnections`` the socket is shut down for reading first, so
    /// from then on the kernel refuses new connects (`ECONNREFUSED`, which clients retry) and
    /// nothing can arrive between the last look and the exit: the listener drains what it
    /// accepted and closes at a later call that finds it idle.
    package func stopIfIdle(handOver: IdleHandOver, isIdle: @escaping @Sendable () -> Bool) async -> Bool {
        await withCheckedContinuation { (continuation: CheckedContinuation<Bool, Never>) in
            loop.execute { [self] in
                guard !closed.load(ordering: .acquiring) else { return continuation.resume(returning: true) }
                if handOver == .refuseNewConnections {
                    // A socket shut down for reading always polls readable: stop watching it
                    // (nothing new can arrive) and take what the backlog holds now.
                    _ = Glibc.shutdown(listenFD.rawValue, CInt(SHUT_RD))
                    if let watch = watch.withLock({ $0.take() }) { loop.cancel(watch) }
                }
                acceptWaiting()
                guard isIdle(), pending.entries.withLock({ $0.isEmpty }), filtering.load(ordering: .relaxed) == 0 else { return continuation.resume(returning: false) }
                close()
                continuation.resume(returning: true)
            }
        }
    }

    /// Accepts every connection waiting (on the loop's thread).
    private func acceptWaiting() {
        while !closed.load(ordering: .acquiring) {
            let fd: FileDescriptor
            do {
                switch try UnixSocket.acceptIfReady(listenFD) {
                case .accepted(let accepted): fd = accepted
                case .none, .closed: return
                }
            } catch {
                // A shortage of descriptors or memory: try again shortly instead of spinning.
                if let watch = watch.withLock({ $0 }) { loop.pause(watch, for: .milliseconds(10)) }
                return
            }
            guard let peer = try? UnixSocket.peerCredentials(fd) else {
                try? fd.close()
                continue
            }
            guard let acceptFilter else {
                take(fd, peer: peer, allowed: true)
                continue
            }
            // The filter is the user's code, which may take its time (a policy lookup, a log):
            // it runs off the loop, one client at a time, and its answer comes back here. A
            // bounded number wait for it; past that, a client is told the listener is busy, as
            // one turned away for want of room is, and closed: it may try again later.
            guard filtering.add(1, ordering: .relaxed).newValue <= Self.maximumFiltering else {
                filtering.subtract(1, ordering: .relaxed)
                turnAwayAsBusy(fd)
                continue
            }
            filters.async { [self] in
                // A client still waiting when the listener closed is not judged: it is closed.
                let allowed = !closed.load(ordering: .acquiring) && acceptFilter(peer)
                loop.execute { [self] in
                    filtering.subtract(1, ordering: .relaxed)
                    guard !closed.load(ordering: .acquiring) else {
                        try? fd.close()
                        return
                    }
                    take(fd, peer: peer, allowed: allowed)
                }
            }
        }
    }

    /// Clients waiting for the accept filter, at most.
    package static let maximumFiltering = 256
    private let filtering = Atomic<Int>(0)
    /// Where the accept filter runs (one client at a time).
    private let filters = DispatchQueue(label: "ipcbench.accept-filter")

    /// Answers a client the accept filter has judged, or that no filter judges (loop thread).
    private func take(_ fd: FileDescriptor, peer: PeerCredentials, allowed: Bool) {
        switch mode {
        case .immediate(let refusal, let accepted):
            guard allowed else {
                Self.send(refusal, on: fd)
                try? fd.close()
                return
            }
            guard hasRoom?(0) ?? true else { return turnAwayAsBusy(fd) }
            accepted(fd, peer)
        case .handshake(let timeout, let maximumPending, _):
            guard allowed else {
                RendezvousStatus.refused.send(on: fd)
                try? fd.close()
                return
            }
            let waiting = pending.entries.withLock { $0.count }
            guard waiting < maximumPending, hasRoom?(waiting) ?? true else { return turnAwayAsBusy(fd) }
            guard let watching = try? loop.watchReadable(fd, { [weak self] in self?.readable(fd) }) else {
                try? fd.close()
                return
            }
            let serial = pending.add(fd, watch: watching, peer: peer)
            loop.schedule(at: monotonicNanoseconds() &+ timeout.wholeNanoseconds) { [weak self] in
                guard let self, self.pending.remove(fd, serial: serial, on: self.loop) != nil else { return }
                try? fd.close()
            }
        }
    }

    /// Tells a client the listener is busy (``RendezvousStatus/busy``, or in immediate mode
    /// ``busyRefusal``), without waiting, and closes its socket (loop thread).
    private func turnAwayAsBusy(_ fd: FileDescriptor) {
        switch mode {
        case .immediate: Self.send(busyRefusal, on: fd)
        case .handshake: RendezvousStatus.busy.send(on: fd)
        }
        try? fd.close()
    }

    /// Sends a refusal without waiting: it is small enough for any socket buffer.
    private static func send(_ bytes: [UInt8], on fd: FileDescriptor) {
        _ = bytes.withUnsafeBytes { Glibc.send(fd.rawValue, $0.baseAddress, $0.count, CInt(MSG_DONTWAIT | MSG_NOSIGNAL)) }
    }

    /// A pending client's socket is readable (loop thread): hands it to the transport's handshake.
    private func readable(_ fd: FileDescriptor) {
        guard case .handshake(_, _, let handshake) = mode, let peer = pending.entries.withLock({ $0[fd]?.peer }) else { return }
        switch handshake(fd, peer) {
        case .incomplete:
            return
        case .finished(let status):
            guard pending.remove(fd, on: loop) != nil else { return }
            status.send(on: fd)
            try? fd.close()
        case .accepted(let adopt):
            guard pending.remove(fd, on: loop) != nil else { return }
            RendezvousStatus.accepted.send(on: fd)
            adopt()
        }
    }
}
#endif
