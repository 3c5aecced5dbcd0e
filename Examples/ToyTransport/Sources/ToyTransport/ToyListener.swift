import Foundation
import IPCCore
import Synchronization

/// A listening toy endpoint: `G/name.toy`, guarded by an `flock` on `G/name.toy-lock` that the
/// listener holds while it lives, so a second listener is refused and a dead one's socket file
/// is known to be stale.
public final class ToyListener: MessageListener, Sendable {
    public let endpoint: Endpoint
    public let connections: AsyncStream<ToyConnection>

    private let fd: CInt
    private let lockFD: CInt
    private let path: String
    private let options: ConnectionOptions
    private let sink: AsyncStream<ToyConnection>.Continuation
    private let state = Mutex<(closed: Bool, active: [ObjectIdentifier: ToyConnection])>((false, [:]))

    init(endpoint: Endpoint, options: ConnectionOptions) throws {
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
        (connections, sink) = AsyncStream.makeStream(of: ToyConnection.self)
        Thread.detachNewThread { [self] in acceptLoop() }
    }

    public var activeConnections: [ToyConnection] { state.withLock { Array($0.active.values) } }

    @discardableResult
    public func broadcast(_ payload: [UInt8], msgid: UInt32, timeout: Duration) -> Int {
        activeConnections.filter { (try? $0.send(payload, msgid: msgid, timeout: timeout)) != nil }.count
    }

    public func close() {
        let connections: [ToyConnection]? = state.withLock { state in
            guard !state.closed else { return nil }
            state.closed = true
            return Array(state.active.values)
        }
        guard let connections else { return }
        unlink(path)
        shutdown(fd, CInt(SHUT_RDWR))
        Glibc.close(lockFD)
        sink.finish()
        connections.forEach { $0.invalidate() }
    }

    private func acceptLoop() {
        while true {
            let client = PacketSocket.retrying { Int(accept(fd, nil, nil)) }
            if client.result < 0 {
                // ECONNABORTED is a client gone before it was accepted; anything else is the end.
                if client.errno == ECONNABORTED { continue }
                break
            }
            // Glibc's module hides accept4, so close-on-exec is set just after: a process
            // spawned in that instant could inherit this one descriptor.
            _ = fcntl(CInt(client.result), F_SETFD, FD_CLOEXEC)
            let connection = ToyConnection(fd: CInt(client.result), options: options) { [weak self] connection in
                _ = self?.state.withLock { $0.active.removeValue(forKey: ObjectIdentifier(connection)) }
            }
            let accepted = state.withLock { state in
                guard !state.closed else { return false }
                state.active[ObjectIdentifier(connection)] = connection
                return true
            }
            if accepted { sink.yield(connection) } else { connection.invalidate() }
        }
        Glibc.close(fd)
    }
}
