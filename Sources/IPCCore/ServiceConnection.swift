import Synchronization

/// A connection to a named service that outlives the service's restarts: XPC's model, over any
/// transport.
///
/// The first operation connects (retrying while nobody listens, within the operation's
/// timeout: ``ConnectRetry``). When the service's side goes away — its process dies, or it ends
/// the connection — the connection is *interrupted*, not invalidated: the interruption handler
/// runs once, requests that were waiting fail with ``IPCError/Code/interrupted``, and the next
/// operation connects to the service again by its endpoint. Only ``invalidate()`` invalidates:
/// the invalidation handler runs once, waiting requests fail with
/// ``IPCError/Code/invalidated``, and nothing reconnects afterwards.
///
/// Messages the service sends on its own (one-way) are not carried across reconnections; use
/// a ``MessageConnection`` for those.
public final class ServiceConnection: Sendable {
    /// Makes a new connection to the service (a transport's ``MessageTransport/connect(to:options:)``).
    public typealias Connect = @Sendable () throws -> any MessageConnection

    private struct State {
        var current: (any MessageConnection)?
        /// Counts connections made, so that a late report about an old one changes nothing.
        var generation = 0
        var invalidated: InvalidationReason?
        var interruptionHandler: (@Sendable (InvalidationReason) -> Void)?
        var invalidationHandler: (@Sendable (InvalidationReason) -> Void)?
        var interruptions = 0
    }

    private let connect: Connect
    private let state = Mutex(State())
    /// The on-demand start, for a connection that has one.
    private let starts: OnDemandStart?

    /// A service connection that connects with `connect` whenever it needs a connection.
    public convenience init(connecting connect: @escaping Connect) {
        self.init(connecting: connect, starts: nil)
    }

    private init(connecting connect: @escaping Connect, starts: OnDemandStart?) {
        self.connect = connect
        self.starts = starts
    }

    /// A service connection to `endpoint` over `transport`.
    public convenience init<Transport: MessageTransport>(to endpoint: Endpoint, over transport: Transport, options: ConnectionOptions = .defaults) {
        self.init { try transport.connect(to: endpoint, options: options) }
    }

    /// A service connection that starts its service on demand, as launchd starts a registered
    /// service: when an operation finds nobody listening (`connect` throws
    /// ``IPCError/Code/endpointNotFound``), `start` is called — it should start the service's
    /// process and return; at most once per `startInterval`, so that a service slow to come up
    /// is not started over and over — and the operation waits for the service to listen, within
    /// its timeout, instead of failing. A service that exits when idle is started again by the
    /// next operation (the connection is interrupted meanwhile, as for any restart).
    ///
    /// What counts as delivered is a request's reply: a one-way message sent just as the service
    /// decides to exit can be lost with its process, as on any transport.
    /// - Parameter start: starts the service; an error it throws fails the operation.
    public convenience init(connecting connect: @escaping Connect, startInterval: Duration = .seconds(1), startingOnDemand start: @escaping @Sendable () throws -> Void) {
        let starter = OnDemandStart(interval: startInterval, start: start)
        self.init(connecting: {
            do {
                return try connect()
            } catch let error as IPCError where error.code == .endpointNotFound {
                try starter.startIfDue()
                throw error
            }
        }, starts: starter)
    }

    /// ``init(connecting:startInterval:startingOnDemand:)`` to `endpoint` over `transport`.
    public convenience init<Transport: MessageTransport>(
        to endpoint: Endpoint, over transport: Transport, options: ConnectionOptions = .defaults,
        startInterval: Duration = .seconds(1), startingOnDemand start: @escaping @Sendable () throws -> Void
    ) {
        self.init(connecting: { try transport.connect(to: endpoint, options: options) }, startInterval: startInterval, startingOnDemand: start)
    }

    /// How many times this connection started its service on demand (0 for one that does not).
    public var startCount: Int { starts?.count ?? 0 }

    /// How many times the service went away under this connection.
    public var interruptionCount: Int { state.withLock { $0.interruptions } }

    /// Why the connection was invalidated, or `nil` while it is usable.
    public var invalidationReason: InvalidationReason? { state.withLock { $0.invalidated } }

    /// Runs `handler` each time the service goes away under this connection (with the reason the
    /// connection to it ended), on whatever thread noticed.
    public func setInterruptionHandler(_ handler: @escaping @Sendable (InvalidationReason) -> Void) {
        state.withLock { $0.interruptionHandler = handler }
    }

    /// Runs `handler` once, when ``invalidate()`` is called (at once if it was already called).
    public func setInvalidationHandler(_ handler: @escaping @Sendable (InvalidationReason) -> Void) {
        let already: InvalidationReason? = state.withLock { state in
            if let reason = state.invalidated { return reason }
            state.invalidationHandler = handler
            return nil
        }
        if let already { handler(already) }
    }

    /// Ends this connection for good. Idempotent.
    public func invalidate() {
        let (connection, handler, reason): ((any MessageConnection)?, (@Sendable (InvalidationReason) -> Void)?, InvalidationReason?) = state.withLock { state in
            guard state.invalidated == nil else { return (nil, nil, nil) }
            let reason = InvalidationReason(.invalidatedLocally)
            state.invalidated = reason
            defer {
                state.current = nil
                state.invalidationHandler = nil
                state.interruptionHandler = nil
            }
            return (state.current, state.invalidationHandler, reason)
        }
        guard let reason else { return }
        connection?.invalidate()
        handler?(reason)
    }

    /// Sends a one-way message to the service, connecting first if needed.
    /// - Throws: ``IPCError/Code/invalidated`` after ``invalidate()``; ``IPCError/Code/interrupted``
    ///   if the service went away while it was being sent; what connecting and sending throw.
    public func send(_ payload: [UInt8], msgid: UInt32, timeout: Duration) async throws {
        let (connection, generation) = try await currentConnection(within: timeout)
        do {
            try await connection.send(payload, msgid: msgid, timeout: timeout)
        } catch {
            throw translated(error, connection: connection, generation: generation)
        }
    }

    /// Sends a request to the service and waits for its reply, connecting first if needed.
    /// - Throws: ``IPCError/Code/invalidated`` after ``invalidate()``; ``IPCError/Code/interrupted``
    ///   if the service went away before it answered; what connecting and requesting throw.
    public func request(_ payload: [UInt8], msgid: UInt32, sendTimeout: Duration, receiveTimeout: Duration) async throws -> [UInt8] {
        let (connection, generation) = try await currentConnection(within: sendTimeout)
        do {
            return try await connection.request(payload, msgid: msgid, sendTimeout: sendTimeout, receiveTimeout: receiveTimeout)
        } catch {
            throw translated(error, connection: connection, generation: generation)
        }
    }

    /// The connection in use, or a new one (retrying while the service does not listen, for at
    /// most `limit`).
    private func currentConnection(within limit: Duration) async throws -> (any MessageConnection, Int) {
        if let found = try existing() { return found }
        return try await ConnectRetry(for: limit).run {
            if let found = try existing() { return found }
            // The connect may wait for the service's answer: not on a cooperative thread.
            let connection = try await runBlocking(connect)
            // Operations racing to connect keep the first connection stored; the others' go.
            enum Outcome { case stored(Int, Interruption?), raced((any MessageConnection, Int)), invalidated }
            let outcome: Outcome = state.withLock { state in
                guard state.invalidated == nil else { return .invalidated }
                if let current = state.current, current.invalidationReason == nil { return .raced((current, state.generation)) }
                // A connection that ended before its handler told us: the service went away.
                let interruption = Self.interrupt(&state)
                state.generation += 1
                state.current = connection
                return .stored(state.generation, interruption)
            }
            switch outcome {
            case .stored(let generation, let interruption):
                interruption?.report()
                connection.setInvalidationHandler { [weak self] reason in
                    self?.ended(generation: generation, reason: reason)
                }
                return (connection, generation)
            case .raced(let winner):
                connection.invalidate()
                return winner
            case .invalidated:
                connection.invalidate()
                throw IPCError(code: .invalidated, message: "the service connection was invalidated")
            }
        }
    }

    private func existing() throws -> (any MessageConnection, Int)? {
        try state.withLock { state in
            if let reason = state.invalidated {
                throw IPCError(code: .invalidated, message: "the service connection was invalidated (\(reason))")
            }
            guard let current = state.current, current.invalidationReason == nil else { return nil }
            return (current, state.generation)
        }
    }

    /// An interruption to report, outside the lock.
    private struct Interruption {
        var reason: InvalidationReason
        var handler: (@Sendable (InvalidationReason) -> Void)?

        func report() { handler?(reason) }
    }

    /// Counts the end of the current connection as an interruption, once, and forgets it.
    private static func interrupt(_ state: inout State) -> Interruption? {
        guard state.invalidated == nil, let current = state.current else { return nil }
        state.current = nil
        state.interruptions += 1
        return Interruption(reason: current.invalidationReason ?? InvalidationReason(.peerClosed), handler: state.interruptionHandler)
    }

    /// The connection of `generation` ended: unless this side invalidated it (or it was
    /// counted already), the service went away.
    private func ended(generation: Int, reason: InvalidationReason) {
        let interruption: Interruption? = state.withLock { state in
            guard state.generation == generation else { return nil }
            return Self.interrupt(&state)
        }
        interruption.map { Interruption(reason: reason, handler: $0.handler) }?.report()
    }

    /// What an operation on the connection of `generation` reports for `error`.
    private func translated(_ error: any Error, connection: any MessageConnection, generation: Int) -> any Error {
        guard let error = error as? IPCError, error.code == .peerInvalidated || error.code == .invalidated else { return error }
        if let reason = state.withLock({ $0.invalidated }) {
            return IPCError(code: .invalidated, message: "the service connection was invalidated (\(reason))", cause: error)
        }
        let reason = connection.invalidationReason.map { "\($0)" } ?? "its connection ended"
        return IPCError(code: .interrupted, message: "the service went away (\(reason)); the next operation reconnects", cause: error)
    }
}

/// Starts a service at most once per interval (``ServiceConnection/init(to:over:options:startInterval:startingOnDemand:)``).
final class OnDemandStart: Sendable {
    private let interval: Duration
    private let start: @Sendable () throws -> Void
    private let state = Mutex<(count: Int, last: ContinuousClock.Instant?)>((0, nil))

    init(interval: Duration, start: @escaping @Sendable () throws -> Void) {
        self.interval = interval
        self.start = start
    }

    var count: Int { state.withLock { $0.count } }

    func startIfDue() throws {
        let due: Bool = state.withLock { state in
            let now = ContinuousClock.now
            if let last = state.last, last.duration(to: now) < interval { return false }
            state.last = now
            state.count += 1
            return true
        }
        if due { try start() }
    }
}
