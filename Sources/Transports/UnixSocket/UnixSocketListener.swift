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
public final class UnixSocketListener: MessageListener, Sendable {
    public let endpoint: Endpoint

    private let path: String
    private let listenFD: CInt
    private let lock: EndpointLock
    private let framing: Framing
    private let options: ConnectionOptions
    private let acceptFilter: AcceptFilter?
    private let registry = ConnectionRegistry<UnixSocketConnection>()
    private let loop: EventLoop
    private let watch = Mutex<EventLoop.ReadinessWatch?>(nil)

    init(endpoint: Endpoint, framing: Framing, options: ConnectionOptions, acceptFilter: AcceptFilter?) throws {
        try GroupDirectories.prepare(endpoint.group)
        let lock = try EndpointLock(endpoint: endpoint)
        let path = UnixSocketTransport.socketPath(endpoint)
        // We hold the endpoint's lock, so a socket file still here belongs to a dead listener.
        unlink(path)
        let loop: EventLoop
        do {
            loop = try EventLoop.shared()
            listenFD = try UnixSocket.listen(path: path)
        } catch {
            lock.release()
            throw error
        }
        self.endpoint = endpoint
        self.path = path
        self.lock = lock
        self.framing = framing
        self.options = options
        self.acceptFilter = acceptFilter
        self.loop = loop
        do {
            // Weak: the loop's table must not keep a listener alive that its owner dropped.
            let watching = try loop.watchReadable(FileDescriptor(rawValue: listenFD)) { [weak self] in self?.acceptWaiting() }
            watch.withLock { $0 = watching }
        } catch {
            unlink(path)
            closeDescriptor(listenFD)
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
        unlink(path)
        UnixSocket.shutdown(listenFD)
        lock.release()
        // The loop may be accepting right now: it stops watching and closes, in its own time.
        let watch = watch.withLock { $0 }
        loop.execute { [listenFD, loop] in
            if let watch { loop.cancel(watch) }
            closeDescriptor(listenFD)
        }
        for connection in toInvalidate { connection.invalidate() }
    }

    deinit {
        close()
    }

    /// Accepts every connection waiting (on the loop's thread).
    private func acceptWaiting() {
        while !registry.isClosed {
            let fd: CInt
            do {
                switch try UnixSocket.acceptIfReady(listenFD) {
                case .accepted(let accepted): fd = accepted
                case .none, .closed: return
                }
            } catch {
                // A shortage of descriptors or memory: the connection stays queued; try again
                // shortly instead of spinning on a readable socket.
                pauseAccepting()
                return
            }
            guard let peer = try? UnixSocket.peerCredentials(fd), acceptFilter?(peer) ?? true else {
                closeDescriptor(fd)
                continue
            }
            let channel = UnixSocketChannel(fd: fd, framing: framing, maximumPayloadLength: options.maximumPayloadLength)
            guard let connection = try? EngineConnection(channel: channel, peer: peer, options: options, loop: loop, onInvalidated: { [weak registry] connection in
                registry?.remove(connection)
            }) else { continue }
            if !registry.add(connection) { connection.invalidate() }
        }
    }

    private func pauseAccepting() {
        guard let watch = watch.withLock({ $0 }) else { return }
        loop.pause(watch, forNanoseconds: 10_000_000)
    }
}
