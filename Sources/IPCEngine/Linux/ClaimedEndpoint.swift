#if os(Linux)
public import IPCCore
import IPCSystem

/// An endpoint a listener holds, whatever its clients arrive on: the group directory prepared
/// and checked (owner-only, this user's), the endpoint's lock taken (a second listener gets
/// `endpointInUse`), the registry of its connections, broadcast, and the close order. Every
/// listener of the package stands on one: ``SocketEndpoint`` (unix-socket, notify,
/// file-presenter and the toy transport of `Examples/`) and the message port, whose clients
/// arrive on a queue.
public final class ClaimedEndpoint: Sendable {
    public let endpoint: Endpoint
    public let loop: EventLoop
    private let lock: EndpointLock
    private let registry = ConnectionRegistry<EngineConnection>()

    /// Prepares `endpoint`'s group directory and takes the endpoint's lock. Whatever the
    /// previous holder of the name left (a socket file, a queue) belongs to a dead listener
    /// from here on, and the caller may reclaim it.
    /// - Throws: ``IPCError/Code/endpointInUse`` if a live listener holds the endpoint;
    ///   ``IPCError/Code/invalidEndpoint`` or ``IPCError/Code/accessDenied`` for an unsafe
    ///   group directory; ``IPCError/Code/transportFailure``.
    public init(_ endpoint: Endpoint) throws {
        try GroupDirectories.prepare(endpoint.group)
        let lock = try EndpointLock(endpoint: endpoint)
        do {
            loop = try EventLoop.shared()
        } catch {
            lock.release()
            throw error
        }
        self.endpoint = endpoint
        self.lock = lock
    }

    /// Keeps the connection `make` makes, given the handler that takes it out of the registry
    /// when it is invalidated, and yields it to ``connections``. Returns it, or `nil` if `make`
    /// threw or the listener has closed (the connection is then invalidated). Whatever the
    /// client must be told before the listener's user can send to it (a welcome) is sent
    /// inside `make`.
    @discardableResult
    public func keep(_ make: (_ onInvalidated: @escaping @Sendable (EngineConnection) -> Void) throws -> EngineConnection) -> EngineConnection? {
        guard let connection = try? make({ [weak registry] connection in registry?.remove(connection) }) else { return nil }
        guard registry.add(connection) else {
            connection.invalidate()
            return nil
        }
        return connection
    }

    public var connections: AsyncStream<EngineConnection> { registry.connections }

    public var activeConnections: [EngineConnection] { registry.activeConnections }

    package var activeConnectionCount: Int { registry.activeConnectionCount }

    public var isClosed: Bool { registry.isClosed }

    @discardableResult
    public func broadcast(_ payload: [UInt8], msgid: UInt32, timeout: Duration) -> Int {
        registry.broadcast(payload, msgid: msgid, timeout: timeout)
    }

    /// Closes once, in the order that keeps a successor safe: ends ``connections``, runs
    /// `giveUpName` (remove the socket file or the queue's name, and stop accepting), releases
    /// the endpoint's lock, and only then invalidates the connections. Returns `false` if it was
    /// closed already (and runs nothing).
    @discardableResult
    public func close(giveUpName: () -> Void) -> Bool {
        guard let toInvalidate = registry.close() else { return false }
        // The name goes while the lock is held, so a successor never loses its own.
        giveUpName()
        lock.release()
        for connection in toInvalidate { connection.invalidate() }
        return true
    }

    deinit {
        close {}
    }
}
#endif
