import Glibc
import IPCCore
import IPCFraming
import IPCPosix
import Synchronization

/// A listening `AF_UNIX` socket: accepts clients on a thread of its own, passes each through the
/// accept filter with its kernel-verified credentials, and keeps the valid connections for
/// broadcast and per-client sends.
public final class UnixSocketListener: MessageListener, Sendable {
    public let endpoint: Endpoint
    public let connections: AsyncStream<UnixSocketConnection>

    private let path: String
    private let listenFD: CInt
    private let lock: EndpointLock
    private let framing: Framing
    private let options: ConnectionOptions
    private let acceptFilter: AcceptFilter?
    private let connectionSink: AsyncStream<UnixSocketConnection>.Continuation

    private struct State {
        var closed = false
        var active: [ObjectIdentifier: UnixSocketConnection] = [:]
    }

    private let state = Mutex(State())

    init(endpoint: Endpoint, framing: Framing, options: ConnectionOptions, acceptFilter: AcceptFilter?) throws {
        try GroupDirectories.prepare(endpoint.group)
        let lock = try EndpointLock(endpoint: endpoint)
        let path = UnixSocketTransport.socketPath(endpoint)
        // We hold the endpoint's lock, so a socket file still here belongs to a dead listener.
        unlink(path)
        do {
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
        (connections, connectionSink) = AsyncStream.makeStream(of: UnixSocketConnection.self)
        do {
            try PosixThread.detach(name: "ipc-unix-accept") { [self] in acceptLoop() }
        } catch {
            close()
            closeDescriptor(listenFD)
            throw error
        }
    }

    public var activeConnections: [UnixSocketConnection] {
        state.withLock { Array($0.active.values) }
    }

    @discardableResult
    public func broadcast(_ payload: [UInt8], msgid: UInt32, timeout: Duration) -> Int {
        activeConnections.broadcast(payload, msgid: msgid, timeout: timeout)
    }

    public func close() {
        let toInvalidate: [UnixSocketConnection]? = state.withLock { state in
            guard !state.closed else { return nil }
            state.closed = true
            return Array(state.active.values)
        }
        guard let toInvalidate else { return }
        // Remove the socket file before giving up the name, so a successor never loses its own file.
        unlink(path)
        UnixSocket.shutdown(listenFD)
        lock.release()
        connectionSink.finish()
        for connection in toInvalidate { connection.invalidate() }
    }

    private func acceptLoop() {
        while let fd = try? UnixSocket.accept(listenFD) {
            guard let peer = try? UnixSocket.peerCredentials(fd), acceptFilter?(peer) ?? true else {
                closeDescriptor(fd)
                continue
            }
            let connection = UnixSocketConnection(fd: fd, peer: peer, framing: framing, options: options) { [weak self] connection in
                _ = self?.state.withLock { $0.active.removeValue(forKey: ObjectIdentifier(connection)) }
            }
            let accepted = state.withLock { state in
                guard !state.closed else { return false }
                state.active[ObjectIdentifier(connection)] = connection
                return true
            }
            guard accepted, (try? connection.start()) != nil else {
                if !accepted { closeDescriptor(fd) }
                continue
            }
            connectionSink.yield(connection)
        }
        closeDescriptor(listenFD)
    }
}
