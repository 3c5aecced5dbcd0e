import CIPCShims
import Glibc
public import IPCCore
public import SystemPackage

/// Thin, typed wrappers over the `AF_UNIX` stream socket calls the Unix socket transport makes.
/// Sockets are swift-system `FileDescriptor`s, which the caller owns and closes (`close()`).
/// Every descriptor is created close-on-exec, so a child process never inherits a connection.
public enum UnixSocket {
    /// `sun_path` is 108 bytes including the terminating NUL.
    public static let maximumPathLength = 107

    /// The kind of `AF_UNIX` socket: a byte stream, or sequenced packets (message boundaries
    /// kept, connection-oriented, as a stream is).
    public enum Kind: Sendable {
        case stream
        case sequencedPacket

        package var type: CInt { self == .stream ? CInt(SOCK_STREAM.rawValue) : CInt(SOCK_SEQPACKET.rawValue) }
    }

    private static func withAddress<T>(_ path: String, _ body: (UnsafePointer<sockaddr>, socklen_t) throws -> T) throws -> T {
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        let bytes = Array(path.utf8)
        guard bytes.count <= maximumPathLength else {
            throw IPCError(code: .invalidEndpoint, message: "socket path \(path) is \(bytes.count) bytes; AF_UNIX allows at most \(maximumPathLength)")
        }
        withUnsafeMutableBytes(of: &address.sun_path) { raw in
            raw.copyBytes(from: bytes)
            raw[bytes.count] = 0
        }
        return try withUnsafePointer(to: &address) { pointer in
            try pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                try body($0, socklen_t(MemoryLayout<sockaddr_un>.size))
            }
        }
    }

    private static func makeSocket(_ kind: Kind, nonBlocking: Bool = false) throws -> FileDescriptor {
        let flags = kind.type | CInt(SOCK_CLOEXEC.rawValue) | (nonBlocking ? CInt(SOCK_NONBLOCK.rawValue) : 0)
        do {
            return FileDescriptor(rawValue: try syscallRetryingInterrupts { socket(AF_UNIX, flags, 0) })
        } catch {
            throw IPCError.syscall("socket", error)
        }
    }

    /// Binds and listens on `path`, which must not exist, with `backlog` (`nil`: the largest the
    /// kernel allows, `SOMAXCONN`). The socket file is made owner-only before `listen`, so no other
    /// user can ever connect. The socket is non-blocking: accept with ``acceptIfReady(_:)``
    /// when it is readable.
    public static func listen(path: String, kind: Kind = .stream, backlog: Int? = nil) throws -> FileDescriptor {
        let fd = try makeSocket(kind, nonBlocking: true)
        do {
            try withAddress(path) { address, length in
                do throws(Errno) { _ = try syscallRetryingInterrupts { bind(fd.rawValue, address, length) } } catch {
                    if error == .addressInUse {
                        throw IPCError(code: .endpointInUse, message: "\(path) already exists", cause: error)
                    }
                    throw IPCError.syscall("bind", error, context: path)
                }
            }
            do { _ = try syscallRetryingInterrupts { chmod(path, 0o600) } } catch { throw IPCError.syscall("chmod", error, context: path) }
            do { _ = try syscallRetryingInterrupts { Glibc.listen(fd.rawValue, backlog.map { CInt(clamping: $0) } ?? SOMAXCONN) } } catch { throw IPCError.syscall("listen", error, context: path) }
            return fd
        } catch {
            try? fd.close()
            throw error
        }
    }

    /// What ``acceptIfReady(_:)`` found.
    public enum AcceptOutcome: Sendable {
        /// A connection (close-on-exec, blocking mode; read and write it with the `IfReady` calls).
        case accepted(FileDescriptor)
        /// None is waiting now.
        case none
        /// The listening socket was shut down.
        case closed
    }

    /// Accepts one waiting connection, without blocking.
    public static func acceptIfReady(_ listener: FileDescriptor) throws -> AcceptOutcome {
        do {
            return .accepted(FileDescriptor(rawValue: try syscallRetryingInterrupts { ipc_accept4(listener.rawValue, CInt(SOCK_CLOEXEC.rawValue)) }))
        } catch {
            switch error {
            case .wouldBlock:
                return .none
            case .invalidArgument, .badFileDescriptor:
                return .closed
            case .connectionAbort, .protocolError:
                // A connection that died before it was accepted: look for the next one.
                return try acceptIfReady(listener)
            case .noMemory, .noBufferSpace, .tooManyOpenFiles, .tooManyOpenFilesInSystem:
                // A shortage: the connection stays queued; the caller tries again later.
                throw IPCError(code: .transportFailure, message: "accept4 failed: \(error)", cause: error)
            default:
                throw IPCError.syscall("accept4", error)
            }
        }
    }

    /// Connects to the socket at `path`.
    /// - Parameter nonBlocking: make the socket non-blocking, so that a listener whose backlog
    ///   is full (one that never accepts) fails the connect at once instead of blocking it.
    ///   A blocking connect to such a listener waits until it accepts, without end: a client
    ///   that must not hang uses ``connect(path:kind:timeout:held:)``.
    /// - Throws: ``IPCError/Code/endpointNotFound`` when there is no socket or nobody listens on
    ///   it (a stale file); ``IPCError/Code/accessDenied`` when permissions refuse it;
    ///   ``IPCError/Code/transportFailure`` with `EAGAIN` for a full backlog (non-blocking only).
    public static func connect(path: String, kind: Kind = .stream, nonBlocking: Bool = false) throws -> FileDescriptor {
        try connect(path: path, kind: kind, nonBlocking: nonBlocking, timeout: nil, held: { false })
    }

    /// Connects to the socket at `path` (a stream or sequenced-packet one: both queue
    /// connections in a backlog), waiting at most `timeout` for room in its
    /// listener's backlog (the kernel queues a connection there without the listener's help
    /// until the backlog is full; a listener that is stopped, hung or flooded lets it fill).
    /// The wait is the kernel's own (`SO_SNDTIMEO` bounds a blocking `connect(2)` of an
    /// `AF_UNIX` socket, rounded up to a clock tick); a signal that interrupts it is followed by
    /// a wait for the time left, and once none is left (or for a zero or negative `timeout`) one
    /// attempt is made without waiting. The socket is blocking, with no send timeout, when it
    /// returns.
    /// - Parameter held: asked once the backlog stayed full for `timeout`: whether a process
    ///   holds the endpoint whose socket this is (its `EndpointLock`).
    /// - Throws: as ``connect(path:kind:nonBlocking:)``; when the backlog stayed full,
    ///   ``IPCError/Code/endpointNotFound``, made with
    ///   ``IPCError/listenerBusy(_:answered:)`` (`answered` `false`) if `held` says a process
    ///   holds the endpoint (its listener runs, but accepts nobody), plain if not (the socket
    ///   is another process's, or a launcher's whose service has not taken the endpoint yet).
    public static func connect(path: String, kind: Kind = .stream, timeout: Duration, held: () -> Bool) throws -> FileDescriptor {
        try connect(path: path, kind: kind, nonBlocking: false, timeout: timeout, held: held)
    }

    private static func connect(path: String, kind: Kind, nonBlocking: Bool, timeout: Duration?, held: () -> Bool) throws -> FileDescriptor {
        let fd = try makeSocket(kind, nonBlocking: nonBlocking)
        do {
            let deadline = timeout.map { ContinuousClock.now + $0 }
            try withAddress(path) { address, length in
                while true {
                    // The kernel waits for the time left; with none left (a zero timeout, or a
                    // signal after the deadline), one attempt without waiting: a zero send timeout
                    // is none at all, and the shortest the kernel waits is a clock tick.
                    var lastLook = false
                    if let deadline {
                        let left = deadline - ContinuousClock.now
                        lastLook = left <= .zero
                        try lastLook ? setNonBlocking(fd, true, path) : setSendTimeout(fd, left, path)
                    }
                    let result = Glibc.connect(fd.rawValue, address, length)
                    let error = Errno(rawValue: errno)
                    if lastLook { try setNonBlocking(fd, false, path) }
                    if result == 0 { return }
                    // A signal (or a stop and continue) ends the kernel's wait (EINTR, whatever
                    // SA_RESTART says, once a send timeout is set): wait for the time left, not the
                    // whole timeout again. (An AF_UNIX connect that waited for room has changed
                    // nothing yet: it can be made again.)
                    if error == .interrupted { continue }
                    if let timeout, error == .resourceTemporarilyUnavailable {
                        guard held() else {
                            throw IPCError(code: .endpointNotFound, message: "the socket at \(path) took no connection within \(timeout) (its backlog is full), and no process holds its endpoint", cause: error)
                        }
                        throw IPCError.listenerBusy(
                            "the listener on \(path) took no connection within \(timeout): its backlog is full (it runs, but is stopped, hung or flooded with clients); try again later",
                            answered: false
                        )
                    }
                    switch error {
                    case .noSuchFileOrDirectory, .connectionRefused:
                        throw IPCError(code: .endpointNotFound, message: "nobody listens on \(path)", cause: error)
                    case .permissionDenied, .notPermitted:
                        throw IPCError(code: .accessDenied, message: "not allowed to connect to \(path)", cause: error)
                    default:
                        throw IPCError.syscall("connect", error, context: path)
                    }
                }
            }
            if timeout != nil { try setSendTimeout(fd, .zero, path) }
            return fd
        } catch {
            try? fd.close()
            throw error
        }
    }

    /// Sets or clears `O_NONBLOCK`.
    private static func setNonBlocking(_ fd: FileDescriptor, _ on: Bool, _ path: String) throws {
        let flags = fcntl(fd.rawValue, F_GETFL)
        guard flags >= 0, fcntl(fd.rawValue, F_SETFL, on ? flags | O_NONBLOCK : flags & ~O_NONBLOCK) == 0 else {
            throw IPCError.syscall("fcntl(O_NONBLOCK)", Errno(rawValue: errno), context: path)
        }
    }

    /// Sets `SO_SNDTIMEO`, rounded up to a microsecond (zero: none).
    private static func setSendTimeout(_ fd: FileDescriptor, _ timeout: Duration, _ path: String) throws {
        let nanoseconds = timeout.wholeNanoseconds
        let microseconds = nanoseconds / 1_000 + (nanoseconds % 1_000 > 0 ? 1 : 0)
        var value = timeval(tv_sec: Int(microseconds / 1_000_000), tv_usec: Int(microseconds % 1_000_000))
        guard setsockopt(fd.rawValue, SOL_SOCKET, SO_SNDTIMEO, &value, socklen_t(MemoryLayout<timeval>.size)) == 0 else {
            throw IPCError.syscall("setsockopt(SO_SNDTIMEO)", Errno(rawValue: errno), context: path)
        }
    }

    /// Whether a process listens on `path` right now (a connect succeeds).
    /// A listener whose backlog is full listens (the answer does not wait for it to accept).
    public static func isListening(path: String) -> Bool {
        do {
            try connect(path: path, nonBlocking: true).close()
            return true
        } catch {
            return ((error as? IPCError)?.cause as? Errno) == .resourceTemporarilyUnavailable
        }
    }

    /// The kernel-verified credentials of the process at the other end (`SO_PEERCRED`).
    public static func peerCredentials(_ socket: FileDescriptor) throws -> PeerCredentials {
        var pid: pid_t = 0
        var uid: uid_t = 0
        var gid: gid_t = 0
        do { _ = try syscallRetryingInterrupts { ipc_peer_credentials(socket.rawValue, &pid, &uid, &gid) } } catch {
            throw IPCError.syscall("getsockopt(SO_PEERCRED)", error)
        }
        return PeerCredentials(pid: pid, uid: uid, gid: gid)
    }

    /// Wakes a thread blocked reading or accepting on `socket`; the descriptor stays open.
    public static func shutdown(_ socket: FileDescriptor) {
        _ = Glibc.shutdown(socket.rawValue, CInt(SHUT_RDWR))
    }

    /// Reads into `buffer`, blocking. Returns 0 at end of stream.
    /// A connection reset by a peer that died is end of stream too: the connection is over either way.
    public static func read(_ socket: FileDescriptor, into buffer: UnsafeMutableRawBufferPointer) throws -> Int {
        do {
            return try syscallRetryingInterrupts { Glibc.read(socket.rawValue, buffer.baseAddress, buffer.count) }
        } catch {
            if error == .connectionReset { return 0 }
            throw IPCError.syscall("read", error)
        }
    }

    /// Reads what is there without blocking: `nil` if nothing is, 0 at end of stream.
    public static func readIfReady(_ socket: FileDescriptor, into buffer: UnsafeMutableRawBufferPointer) throws -> Int? {
        try receive(socket, into: buffer, flags: CInt(MSG_DONTWAIT))
    }

    /// Writes as much of `header` then `payload`, from byte `offset` of the two together, as the
    /// kernel takes now (one gathering `sendmsg`, never blocking, never raising SIGPIPE).
    /// Returns the bytes written, 0 if the buffer is full.
    /// - Throws: ``IPCError/Code/peerInvalidated`` if the peer closed the connection.
    public static func writeIfReady(_ socket: FileDescriptor, header: UnsafeRawBufferPointer, payload: UnsafeRawBufferPointer, from offset: Int) throws -> Int {
        try withUnsafeTemporaryAllocation(of: iovec.self, capacity: 2) { iov -> Int in
            var count = 0
            if offset < header.count {
                iov[0] = iovec(iov_base: UnsafeMutableRawPointer(mutating: header.baseAddress! + offset), iov_len: header.count - offset)
                count = 1
                if payload.count > 0 {
                    iov[1] = iovec(iov_base: UnsafeMutableRawPointer(mutating: payload.baseAddress!), iov_len: payload.count)
                    count = 2
                }
            } else {
                let start = offset - header.count
                iov[0] = iovec(iov_base: UnsafeMutableRawPointer(mutating: payload.baseAddress! + start), iov_len: payload.count - start)
                count = 1
            }
            return try sendNow(socket, iov.baseAddress!, count: count)
        }
    }

    /// Writes as much of `bytes` as the kernel takes now: one `send` (never blocking, never
    /// raising SIGPIPE). Returns the bytes written, 0 if the buffer is full. For a small frame,
    /// one contiguous buffer sent this way costs the kernel less than its header and payload as
    /// two segments of a `sendmsg` (docs/ENGINE.md, "Sending").
    /// - Throws: ``IPCError/Code/peerInvalidated`` if the peer closed the connection.
    public static func writeIfReady(_ socket: FileDescriptor, bytes: UnsafeRawBufferPointer) throws -> Int {
        guard let base = bytes.baseAddress, bytes.count > 0 else { return 0 }
        while true {
            if let written = try sent(ipc_sys_send(socket.rawValue, base, UInt(bytes.count), CInt(MSG_NOSIGNAL) | CInt(MSG_DONTWAIT)), by: "send") { return written }
        }
    }

    /// A non-blocking send's outcome: the bytes written (0 if the buffer is full), or `nil` if
    /// it was interrupted and is to be made again.
    /// - Throws: ``IPCError/Code/peerInvalidated`` if the peer closed the connection, else the
    ///   call's error.
    private static func sent(_ result: Int, by call: String) throws -> Int? {
        if result >= 0 { return result }
        let error = Errno(rawValue: errno)
        switch error {
        case .interrupted: return nil
        case .wouldBlock: return 0
        case .brokenPipe, .connectionReset, .socketNotConnected:
            throw IPCError(code: .peerInvalidated, message: "the peer closed the connection", cause: error)
        default:
            throw IPCError.syscall(call, error)
        }
    }

    /// The most segments ``writeIfReady(_:segments:from:)`` takes in one call (`IOV_MAX` is 1024).
    public static let maximumSegments = 1024

    /// Writes as much of `segments`, one after another, from byte `offset` of them all together,
    /// as the kernel takes now: one gathering `sendmsg` (never blocking, never raising SIGPIPE)
    /// for at most ``maximumSegments`` segments. Returns the bytes written, 0 if the buffer is full.
    /// - Throws: ``IPCError/Code/peerInvalidated`` if the peer closed the connection.
    public static func writeIfReady(_ socket: FileDescriptor, segments: UnsafeBufferPointer<UnsafeRawBufferPointer>, from offset: Int) throws -> Int {
        precondition(segments.count <= maximumSegments, "at most \(maximumSegments) segments a write")
        return try withUnsafeTemporaryAllocation(of: iovec.self, capacity: max(1, segments.count)) { iov -> Int in
            var count = 0
            var skip = offset
            for segment in segments where segment.count > 0 {
                if skip >= segment.count {
                    skip -= segment.count
                    continue
                }
                iov[count] = iovec(iov_base: UnsafeMutableRawPointer(mutating: segment.baseAddress! + skip), iov_len: segment.count - skip)
                skip = 0
                count += 1
            }
            guard count > 0 else { return 0 }
            return try sendNow(socket, iov.baseAddress!, count: count)
        }
    }

    /// One non-blocking `sendmsg` of `count` vectors (a `send` for one), retried when
    /// interrupted: the bytes written, 0 if the buffer is full.
    private static func sendNow(_ socket: FileDescriptor, _ vectors: UnsafeMutablePointer<iovec>, count: Int) throws -> Int {
        // One segment: `send`, which the kernel takes with less work than `sendmsg`.
        if count == 1 { return try writeIfReady(socket, bytes: UnsafeRawBufferPointer(start: vectors[0].iov_base, count: vectors[0].iov_len)) }
        var message = msghdr()
        message.msg_iov = vectors
        message.msg_iovlen = count
        while true {
            if let written = try sent(ipc_sys_sendmsg(socket.rawValue, &message, CInt(MSG_NOSIGNAL) | CInt(MSG_DONTWAIT)), by: "sendmsg") { return written }
        }
    }

    /// `recv` with `flags`: the byte count, 0 at end of stream (a reset by a dead peer too),
    /// `nil` when it would block.
    private static func receive(_ socket: FileDescriptor, into buffer: UnsafeMutableRawBufferPointer, flags: CInt) throws -> Int? {
        while true {
            let count = ipc_sys_recv(socket.rawValue, buffer.baseAddress, UInt(buffer.count), flags)
            if count >= 0 { return count }
            switch Errno(rawValue: errno) {
            case .interrupted: continue
            case .wouldBlock: return nil
            case .connectionReset: return 0
            case let error: throw IPCError.syscall("recv", error)
            }
        }
    }

    /// Writes `header` then `payload` whole, never raising SIGPIPE, waiting (on the calling
    /// thread) at most until `deadline` for buffer space. `written` counts the bytes the kernel
    /// took, so a caller can tell a clean failure (0) from a torn frame. For raw byte streams
    /// and tools; connections send through the engine, which never blocks its loop.
    /// - Throws: ``IPCError/Code/sendTimeout``; ``IPCError/Code/peerInvalidated``.
    public static func sendAll(
        _ socket: FileDescriptor,
        header: UnsafeRawBufferPointer,
        payload: UnsafeRawBufferPointer,
        deadline: ContinuousClock.Instant,
        written: inout Int
    ) throws {
        let total = header.count + payload.count
        written = 0
        while written < total {
            let count = try writeIfReady(socket, header: header, payload: payload, from: written)
            written += count
            guard count == 0 else { continue }
            let remaining = ContinuousClock.now.duration(to: deadline)
            guard remaining > .zero else {
                throw IPCError(code: .sendTimeout, message: "the peer's receive buffer stayed full; \(written) of \(total) bytes sent before the send timeout")
            }
            var descriptor = pollfd(fd: socket.rawValue, events: Int16(POLLOUT), revents: 0)
            let (seconds, attoseconds) = remaining.components
            _ = poll(&descriptor, 1, CInt(clamping: seconds * 1000 + attoseconds / 1_000_000_000_000_000 + 1))
        }
    }
}
