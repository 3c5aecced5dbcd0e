import Glibc
import IPCCore
import IPCFraming
import IPCPosix

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

    /// - Throws: what ``UnixSocket/connect(path:)`` throws.
    init(path: String) throws {
        fd = try UnixSocket.connect(path: path)
    }

    deinit {
        closeDescriptor(fd)
    }

    /// Writes all of `bytes`.
    /// - Throws: ``IPCError/Code/peerInvalidated`` if the other side closed the connection.
    func write(_ bytes: [UInt8]) throws {
        var written = 0
        try bytes.withUnsafeBytes { buffer in
            try UnixSocket.sendAll(fd, header: buffer, payload: UnsafeRawBufferPointer(start: nil, count: 0), deadline: .now + .seconds(5), written: &written)
        }
    }

    /// Ends this direction of the stream, as a peer that stops writing does.
    func shutDownWriting() {
        _ = Glibc.shutdown(fd, CInt(SHUT_WR))
    }

    /// Reads until the other side closes the connection or `limit` passes; returns the bytes
    /// read and whether the stream ended.
    func readUntilClosed(within limit: Duration) -> (bytes: [UInt8], closed: Bool) {
        let deadline = ContinuousClock.now + limit
        var bytes: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 64 * 1024)
        while true {
            let remaining = ContinuousClock.now.duration(to: deadline)
            guard remaining > .zero else { return (bytes, false) }
            var descriptor = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
            guard poll(&descriptor, 1, CInt(max(1, remaining.milliseconds))) > 0 else { continue }
            let count = chunk.withUnsafeMutableBytes { (try? UnixSocket.read(fd, into: $0)) ?? 0 }
            if count == 0 { return (bytes, true) }
            bytes += chunk[..<count]
        }
    }
}
