import Glibc
import IPCCore
import IPCEngine
import SystemPackage

/// A listening toy endpoint: `G/name.toy`, guarded by an `flock` on `G/name.toy-lock` that the
/// listener holds while it lives, so a second listener is refused and a dead one's socket file
/// is known to be stale. Accepts on the engine's event loop; the engine's registry keeps the
/// connections.
public final class ToyListener: MessageListener, Sendable {
    public let endpoint: Endpoint

    private let fd: CInt
    private let lockFD: CInt
    private let path: String
    private let options: ConnectionOptions
    private let loop: EventLoop
    private let registry = ConnectionRegistry<ToyConnection>()
    private let watch: EventLoop.ReadinessWatch

    init(endpoint: Endpoint, options: ConnectionOptions) throws {
        loop = try EventLoop.shared()
        mkdir(endpoint.group.path, 0o700)
        lockFD = open(endpoint.path(suffix: ".toy-lock"), O_CREAT | O_RDWR | O_CLOEXEC, 0o600)
        guard lockFD >= 0 else { throw PacketSocket.failure("open lock file", errno) }
        guard flock(lockFD, LOCK_EX | LOCK_NB) == 0 else {
            Glibc.close(lockFD)
            throw IPCError(code: .endpointInUse, message: "another process listens on \(endpoint)")
        }
        path = endpoint.path(suffix: ".toy")
        // We hold the lock, so a socket file still here belongs to a dead listener.
        unlink(path)
        do {
            fd = try PacketSocket.listen(path: path)
        } catch {
            Glibc.close(lockFD)
            throw error
        }
        self.endpoint = endpoint
        self.options = options
        let registry = registry
        let (fd, loop, options) = (fd, loop, options)
        do {
            watch = try loop.watchReadable(FileDescriptor(rawValue: fd)) {
                Self.acceptWaiting(fd, options: options, loop: loop, registry: registry)
            }
        } catch {
            Glibc.close(fd)
            Glibc.close(lockFD)
            throw error
        }
    }

    public var connections: AsyncStream<ToyConnection> { registry.connections }

    public var activeConnections: [ToyConnection] { registry.activeConnections }

    @discardableResult
    public func broadcast(_ payload: [UInt8], msgid: UInt32, timeout: Duration) -> Int {
        registry.broadcast(payload, msgid: msgid, timeout: timeout)
    }

    public func close() {
        guard let connections = registry.close() else { return }
        unlink(path)
        Glibc.close(lockFD)
        // The loop may be accepting right now: stop watching and close on it.
        loop.execute { [loop, watch, fd] in
            loop.cancel(watch)
            Glibc.close(fd)
        }
        connections.forEach { $0.invalidate() }
    }

    /// Accepts every connection waiting (on the loop's thread; the socket is non-blocking).
    private static func acceptWaiting(_ fd: CInt, options: ConnectionOptions, loop: EventLoop, registry: ConnectionRegistry<ToyConnection>) {
        while !registry.isClosed {
            let client = PacketSocket.retrying { Int(accept(fd, nil, nil)) }
            if client.result < 0 {
                // ECONNABORTED is a client gone before it was accepted; EAGAIN, none waiting.
                if client.errno == ECONNABORTED { continue }
                return
            }
            // Glibc's module hides accept4, so close-on-exec is set just after: a process
            // spawned in that instant could inherit this one descriptor.
            _ = fcntl(CInt(client.result), F_SETFD, FD_CLOEXEC)
            let channel = ToyChannel(fd: CInt(client.result), maximumPayloadLength: options.maximumPayloadLength)
            guard let connection = try? EngineConnection(channel: channel, peer: nil, options: options, loop: loop, onInvalidated: { [weak registry] in
                registry?.remove($0)
            }) else { continue }
            if !registry.add(connection) { connection.invalidate() }
        }
    }
}
