import Glibc
import IPCCore
import IPCEngine
import IPCFraming
import IPCPosix
import Synchronization
import SystemPackage

/// A listening `AF_UNIX` socket: accepts clients on the event loop (draining the accept queue on
/// each wake-up; backlog `SOMAXCONN`), passes each through the accept filter with its
/// kernel-verified credentials, and keeps the valid connections for broadcast and per-client
/// sends.
public final class UnixSocketListener: IdleClosingListener, Sendable {
    public let endpoint: Endpoint

    private let path: String
    /// The socket came from a launcher (``SocketActivatedTransport``): its file stays.
    private let activated: Bool
    private let lock: EndpointLock
    private let registry = ConnectionRegistry<UnixSocketConnection>()
    private let acceptor = Mutex<SocketAcceptor?>(nil)

    init(endpoint: Endpoint, framing: Framing, options: ConnectionOptions, acceptFilter: AcceptFilter?, activated: Bool = false) throws {
        try GroupDirectories.prepare(endpoint.group)
        let lock = try EndpointLock(endpoint: endpoint)
        let path = UnixSocketTransport.socketPath(endpoint)
        // We hold the endpoint's lock, so a socket file still here belongs to a dead listener
        // (or, socket-activated, to the launcher that handed it over).
        if !activated { unlink(path) }
        self.endpoint = endpoint
        self.path = path
        self.lock = lock
        self.activated = activated
        do {
            let loop = try EventLoop.shared()
            let acceptor = try SocketAcceptor(
                path: path,
                activated: activated,
                loop: loop,
                acceptFilter: acceptFilter,
                mode: .immediate(refusal: UnixSocketTransport.refusal(framing: framing)) { [registry] fd, peer in
                    let channel = UnixSocketChannel(fd: fd, framing: framing, maximumPayloadLength: options.maximumPayloadLength)
                    guard let connection = try? EngineConnection(
                        channel: channel, peer: peer, options: options, loop: loop, label: "a unix-socket connection to \(endpoint.name)",
                        onInvalidated: { [weak registry] connection in registry?.remove(connection) }
                    ) else { return }
                    if !registry.add(connection) { connection.invalidate() }
                }
            )
            self.acceptor.withLock { $0 = acceptor }
        } catch {
            if !activated { unlink(path) }
            lock.release()
            throw error
        }
    }

    public var connections: AsyncStream<UnixSocketConnection> { registry.connections }

    public var activeConnections: [UnixSocketConnection] { registry.activeConnections }

    @discardableResult
    public func broadcast(_ payload: [UInt8], msgid: UInt32, timeout: Duration) -> Int {
        registry.broadcast(payload, msgid: msgid, timeout: timeout)
    }

    public func close() {
        guard let toInvalidate = registry.close() else { return }
        // Remove the socket file before giving up the name, so a successor never loses its own file.
        if !activated { unlink(path) }
        acceptor.withLock { $0.take() }?.close()
        lock.release()
        for connection in toInvalidate { connection.invalidate() }
    }

    public func closeIfIdle(handOver: IdleHandOver) async -> Bool {
        guard let acceptor = acceptor.withLock({ $0 }) else { return true }
        guard await acceptor.stopIfIdle(handOver: handOver, isIdle: { [registry] in registry.activeConnections.isEmpty }) else { return false }
        close()
        return true
    }

    deinit {
        close()
    }
}
