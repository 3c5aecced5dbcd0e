// Seam: a raw AF_UNIX stream client (socket, connect, send, poll, recv, shutdown), the same
// calls on Linux and Darwin; only SIGPIPE suppression differs. The Darwin branch has never been
// compiled (docs/DARWIN.md).
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif
public import IPCCore
public import IPCFraming
import SystemPackage

/// How the framing cases reach a stream transport's endpoint below the transport: an
/// `AF_UNIX` stream socket at a path derived from the endpoint, speaking a ``Framing``. Through
/// it a case sends bytes no well-behaved peer would: frames split at every byte, hostile
/// lengths, garbage, a stream cut inside a frame.
public struct RawStreamAccess: Sendable {
    /// The framing the transport's endpoints speak.
    public var framing: Framing
    /// The socket path of an endpoint.
    public var socketPath: @Sendable (Endpoint) -> String

    public init(framing: Framing, socketPath: @escaping @Sendable (Endpoint) -> String) {
        self.framing = framing
        self.socketPath = socketPath
    }
}

/// One raw connection to a listening endpoint.
final class RawByteStream: Sendable {
    private let fd: CInt

    /// - Throws: ``IPCError/Code/endpointNotFound`` if nobody listens at `path`,
    ///   ``IPCError/Code/accessDenied`` if the caller may not connect, otherwise
    ///   ``IPCError/Code/transportFailure``.
    init(path: String) throws {
        #if canImport(Glibc)
        let fd = socket(AF_UNIX, CInt(SOCK_STREAM.rawValue) | CInt(SOCK_CLOEXEC.rawValue), 0)
        #else
        let fd = socket(AF_UNIX, SOCK_STREAM, 0)
        #endif
        guard fd >= 0 else { throw Self.failure("socket", path) }
        #if canImport(Darwin)
        var on: CInt = 1
        _ = setsockopt(fd, SOL_SOCKET, SO_NOSIGPIPE, &on, socklen_t(MemoryLayout<CInt>.size))
        #endif
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        let capacity = MemoryLayout.size(ofValue: address.sun_path)
        let bytes = Array(path.utf8)
        guard bytes.count < capacity else {
            close(fd)
            throw IPCError(code: .invalidEndpoint, message: "socket path longer than \(capacity - 1) bytes: \(path)")
        }
        withUnsafeMutableBytes(of: &address.sun_path) { $0.copyBytes(from: bytes) }
        // A listener under test that accepts nobody lets its backlog fill, and a blocking connect
        // would then wait for it without end: the send timeout bounds that wait (Linux), after
        // which the connect fails with EAGAIN. (A signal restarts the wait: bounded all the same
        // unless signals keep coming.)
        var wait = timeval(tv_sec: 10, tv_usec: 0)
        _ = setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &wait, socklen_t(MemoryLayout<timeval>.size))
        let result = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { address in Self.retrying { connect(fd, address, socklen_t(MemoryLayout<sockaddr_un>.size)) } }
        }
        guard result == 0 else {
            let error = Errno(rawValue: errno)
            close(fd)
            switch error {
            case .noSuchFileOrDirectory, .connectionRefused:
                throw IPCError(code: .endpointNotFound, message: "nobody listens on \(path)", cause: error)
            case .permissionDenied, .notPermitted:
                throw IPCError(code: .accessDenied, message: "not allowed to connect to \(path)", cause: error)
            case .resourceTemporarilyUnavailable:
                throw IPCError(code: .transportFailure, message: "the listener on \(path) took no connection within 10 s: its backlog is full", cause: error)
            default:
                throw IPCError(code: .transportFailure, message: "connect failed (\(path)): \(error)", cause: error)
            }
        }
        var none = timeval(tv_sec: 0, tv_usec: 0)
        _ = setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &none, socklen_t(MemoryLayout<timeval>.size))
        self.fd = fd
    }

    deinit {
        close(fd)
    }

    /// Writes all of `bytes` within five seconds.
    /// - Throws: ``IPCError/Code/peerInvalidated`` if the other side closed the connection,
    ///   ``IPCError/Code/sendTimeout`` if it stopped reading.
    func write(_ bytes: [UInt8]) throws {
        let deadline = ContinuousClock.now + .seconds(5)
        var written = 0
        while written < bytes.count {
            #if canImport(Glibc)
            let flags = CInt(MSG_NOSIGNAL | MSG_DONTWAIT)
            #else
            let flags = MSG_DONTWAIT
            #endif
            let count = bytes.withUnsafeBytes { buffer in
                Self.retrying { send(fd, buffer.baseAddress! + written, buffer.count - written, flags) }
            }
            if count >= 0 {
                written += count
                continue
            }
            let error = Errno(rawValue: errno)
            switch error {
            case .wouldBlock, .resourceTemporarilyUnavailable:
                guard wait(for: Int16(POLLOUT), until: deadline) else {
                    throw IPCError(code: .sendTimeout, message: "the peer stopped reading: \(written) of \(bytes.count) bytes written")
                }
            case .brokenPipe, .connectionReset:
                throw IPCError(code: .peerInvalidated, message: "the peer closed the connection", cause: error)
            default:
                throw IPCError(code: .transportFailure, message: "send failed: \(error)", cause: error)
            }
        }
    }

    /// Ends this direction of the stream, as a peer that stops writing does.
    func shutDownWriting() {
        _ = shutdown(fd, CInt(SHUT_WR))
    }

    /// Reads until the other side closes the connection or `limit` passes; returns the bytes
    /// read and whether the stream ended. A reset counts as the end.
    func readUntilClosed(within limit: Duration) -> (bytes: [UInt8], closed: Bool) {
        let deadline = ContinuousClock.now + limit
        var bytes: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 64 * 1024)
        while true {
            guard wait(for: Int16(POLLIN), until: deadline) else { return (bytes, false) }
            let count = chunk.withUnsafeMutableBytes { buffer in Self.retrying { recv(fd, buffer.baseAddress, buffer.count, 0) } }
            if count < 0, Errno(rawValue: errno) == .wouldBlock || Errno(rawValue: errno) == .resourceTemporarilyUnavailable { continue }
            if count <= 0 { return (bytes, true) }
            bytes += chunk[..<count]
        }
    }

    /// Waits until the socket is ready for `events` (or hung up); false once `deadline` passes.
    private func wait(for events: Int16, until deadline: ContinuousClock.Instant) -> Bool {
        while true {
            let remaining = ContinuousClock.now.duration(to: deadline)
            guard remaining > .zero else { return false }
            var descriptor = pollfd(fd: fd, events: events, revents: 0)
            let milliseconds = remaining.components.seconds * 1000 + remaining.components.attoseconds / 1_000_000_000_000_000 + 1
            if poll(&descriptor, 1, CInt(clamping: milliseconds)) > 0 { return true }
        }
    }

    private static func retrying<T: BinaryInteger>(_ call: () -> T) -> T {
        while true {
            let result = call()
            if result >= 0 || errno != EINTR { return result }
        }
    }

    private static func failure(_ call: String, _ path: String) -> IPCError {
        let error = Errno(rawValue: errno)
        return IPCError(code: .transportFailure, message: "\(call) failed (\(path)): \(error)", cause: error)
    }
}
