public import IPCCore
import Synchronization

/// A listener's bookkeeping, the same in every transport: the stream of accepted connections,
/// the ones still valid, broadcast, and closing once.
///
/// A transport's listener accepts in its own way and hands each connection to ``add(_:)``;
/// the connection calls ``remove(_:)`` when it is invalidated.
public final class ConnectionRegistry<Connection: MessageConnection>: Sendable {
    public let connections: AsyncStream<Connection>
    private let sink: AsyncStream<Connection>.Continuation

    private struct State {
        var closed = false
        var active: [ObjectIdentifier: Connection] = [:]
    }

    private let state = Mutex(State())

    public init() {
        (connections, sink) = AsyncStream.makeStream(of: Connection.self)
    }

    /// The connections that are currently valid.
    public var activeConnections: [Connection] {
        state.withLock { Array($0.active.values) }
    }

    /// How many connections are currently valid (without copying them out, as
    /// ``activeConnections`` does).
    package var activeConnectionCount: Int {
        state.withLock { $0.active.count }
    }

    public var isClosed: Bool { state.withLock { $0.closed } }

    /// Keeps `connection` and yields it to ``connections``. Returns `false` (and keeps nothing)
    /// once the registry is closed: the caller then invalidates the connection.
    public func add(_ connection: Connection) -> Bool {
        let added = state.withLock { state in
            guard !state.closed else { return false }
            // An invalidation that ran before this line has already called remove: keep only
            // what is still valid.
            guard connection.invalidationReason == nil else { return true }
            state.active[ObjectIdentifier(connection)] = connection
            return true
        }
        if added { sink.yield(connection) }
        return added
    }

    /// Forgets `connection` (it was invalidated).
    public func remove(_ connection: Connection) {
        _ = state.withLock { $0.active.removeValue(forKey: ObjectIdentifier(connection)) }
    }

    /// Sends a one-way message to every valid connection and returns how many took it. A
    /// connection whose send fails is invalidated; the others still get the message.
    @discardableResult
    public func broadcast(_ payload: [UInt8], msgid: UInt32, timeout: Duration) -> Int {
        activeConnections.reduce(0) { delivered, connection in
            do {
                try connection.send(payload, msgid: msgid, timeout: timeout)
                return delivered + 1
            } catch {
                connection.invalidate()
                return delivered
            }
        }
    }

    /// Closes once: ends ``connections`` and returns the connections to invalidate (`nil` if
    /// it was closed already). The caller stops accepting first and invalidates these after.
    public func close() -> [Connection]? {
        let active: [Connection]? = state.withLock { state in
            guard !state.closed else { return nil }
            state.closed = true
            defer { state.active.removeAll() }
            return Array(state.active.values)
        }
        guard let active else { return nil }
        sink.finish()
        return active
    }
}
