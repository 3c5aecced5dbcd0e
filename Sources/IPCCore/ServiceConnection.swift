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
/// Failures back off, whatever the error: a connect that fails, or a connection that ends
/// before any operation on it succeeded (a service that accepts and closes, refuses, or crashes
/// at once), counts as one, and the next attempt waits as ``Policy`` says (exponential, with
/// jitter, capped at 1 s by default), so a failing service costs each client a few connects a
/// second at most. An operation that would have to wait beyond its own timeout for the next
/// attempt fails at once with ``IPCError/Code/interrupted``, as does one that finds a service it
/// reached before not listening: it does not spend its whole timeout retrying. Only the first
/// connection (a client that may start before its service), a service started on demand, and a
/// service that is running but full (its listener answered busy) are waited for within the
/// operation's timeout.
///
/// A full service (its listener turned the client away as busy: ``IPCError/isListenerBusy``,
/// from the connect or as the refusal of the connection's first operation) is running: it is
/// never started on demand, and an operation it turned away tries again, spaced by the back-off,
/// until there is room or its timeout has passed. The listener refused it before reading it, so
/// nothing is sent twice. A busy answer ends an outage: it resets ``Policy/outageLimit``'s clock
/// and ``Policy/maximumFailures``' count, so a full service is never given up. A service whose
/// listener holds the endpoint but did not answer a connect within the transport's connect
/// timeout (``IPCError/ListenerBusy/answered`` `false`: flooded, hung or stopped) is not started
/// on demand either, but an operation makes one such attempt (it took a connect timeout, which
/// may be longer than the operation's), and its silence counts toward the policy's limits, so a
/// service that stays hung is given up. A one-way send
/// is the exception where a stream socket's connect completes before the listener decides
/// (unix sockets): the send has returned when the refusal comes, and the refusal drops it; the
/// interruption handler runs, and the next operations wait for the back-off. Where delivery
/// matters, send a request.
///
/// A service gone for good invalidates the connection: once connects have failed for
/// ``Policy/outageLimit`` (or ``Policy/maximumFailures`` times in a row), or starting the service
/// on demand failed, the invalidation handler runs with
/// ``InvalidationReason/Kind/serviceUnavailable`` and the last error, and every operation fails
/// with ``IPCError/Code/invalidated`` — as XPC invalidates a connection whose service cannot be
/// found.
///
/// Messages the service sends on its own (one-way) are not carried across reconnections; use
/// a ``MessageConnection`` for those.
public final class ServiceConnection: Sendable {
    /// How a service connection spaces its attempts after failures, and when it gives its service
    /// up for gone.
    public struct Policy: Sendable, Hashable {
        /// The spacing of attempts after consecutive failures (its ``ConnectRetry/limit`` is not
        /// used): by default 10 ms after the first, doubling to 1 s, half of each at random.
        public var backoff: ConnectRetry
        /// How long connects may keep failing, from the first failure of an outage, before the
        /// connection is invalidated; `nil`: no time limit.
        public var outageLimit: Duration?
        /// How many failures in a row invalidate the connection; `nil`: no count limit.
        public var maximumFailures: Int?

        public init(backoff: ConnectRetry = ConnectRetry(for: .zero), outageLimit: Duration? = .seconds(30), maximumFailures: Int? = nil) {
            self.backoff = backoff
            self.outageLimit = outageLimit
            self.maximumFailures = maximumFailures.map { max($0, 1) }
        }

        /// 30 seconds of failures, spaced from 10 ms to 1 s.
        public static var `default`: Policy { Policy() }
    }
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
        /// An operation on the connection of `generation` succeeded.
        var succeeded = false
        /// The service was reached once (a connection was made).
        var reached = false
        /// The last failure was a busy listener's answer (``IPCError/isListenerBusy``), if it
        /// was: the service runs, and is waited for as a service started on demand is. Its
        /// ``IPCError/ListenerBusy/answered`` says whether the listener said so (it is full) or
        /// held the endpoint but did not answer the connect in time.
        var busy: IPCError.ListenerBusy?
        /// Failures in a row, busy answers included: what spaces the attempts.
        var failures = 0
        /// Failures in a row that were not answered busy (an answered busy starts the count
        /// again): what ``Policy/maximumFailures`` counts. The outage's start is forgotten at an
        /// answered busy too: a full service is not gone. A connect the listener did not answer
        /// in time counts: a hung service may be given up.
        var unavailable = 0
        var outageStarted: ContinuousClock.Instant?
        var notBefore: ContinuousClock.Instant?
        /// Connect attempts made (for tests and reports).
        var attempts = 0

        /// The service works: the failures so far, busy answers included, are forgotten.
        mutating func forgetFailures() {
            failures = 0
            unavailable = 0
            busy = nil
            outageStarted = nil
            notBefore = nil
        }
    }

    private let connect: Connect
    private let state = Mutex(State())
    /// The on-demand start, for a connection that has one.
    private let starts: OnDemandStart?
    private let policy: Policy

    /// A service connection that connects with `connect` whenever it needs a connection.
    public convenience init(connecting connect: @escaping Connect, policy: Policy = .default) {
        self.init(connecting: connect, starts: nil, policy: policy)
    }

    private init(connecting connect: @escaping Connect, starts: OnDemandStart?, policy: Policy) {
        self.connect = connect
        self.starts = starts
        self.policy = policy
    }

    /// A service connection to `endpoint` over `transport`.
    public convenience init<Transport: MessageTransport>(to endpoint: Endpoint, over transport: Transport, options: ConnectionOptions = .defaults, policy: Policy = .default) {
        self.init(connecting: { try transport.connect(to: endpoint, options: options) }, policy: policy)
    }

    /// A service connection that starts its service on demand, as launchd starts a registered
    /// service: when an operation finds nobody listening (`connect` throws
    /// ``IPCError/Code/endpointNotFound``, and not a busy listener's ``IPCError/isListenerBusy``), `start` is called — it should start the service's
    /// process and return; at most once per `startInterval`, so that a service slow to come up
    /// is not started over and over — and the operation waits for the service to listen, within
    /// its timeout, instead of failing. A service that exits when idle is started again by the
    /// next operation (the connection is interrupted meanwhile, as for any restart).
    ///
    /// What counts as delivered is a request's reply: a one-way message sent just as the service
    /// decides to exit can be lost with its process, as on any transport.
    /// - Parameter start: starts the service; an error it throws invalidates the connection
    ///   (``InvalidationReason/Kind/serviceUnavailable``, the error as its cause) and fails the
    ///   operation with ``IPCError/Code/invalidated``.
    public convenience init(
        connecting connect: @escaping Connect, startInterval: Duration = .seconds(1), policy: Policy = .default,
        startingOnDemand start: @escaping @Sendable () throws -> Void
    ) {
        let starter = OnDemandStart(interval: startInterval, start: start)
        self.init(connecting: {
            do {
                return try connect()
            } catch let error as IPCError where error.code == .endpointNotFound && !error.isListenerBusy {
                do { try starter.startIfDue() } catch { throw StartFailure(error: error) }
                throw error
            }
        }, starts: starter, policy: policy)
    }

    /// ``init(connecting:startInterval:policy:startingOnDemand:)`` to `endpoint` over `transport`.
    public convenience init<Transport: MessageTransport>(
        to endpoint: Endpoint, over transport: Transport, options: ConnectionOptions = .defaults,
        startInterval: Duration = .seconds(1), policy: Policy = .default, startingOnDemand start: @escaping @Sendable () throws -> Void
    ) {
        self.init(connecting: { try transport.connect(to: endpoint, options: options) }, startInterval: startInterval, policy: policy, startingOnDemand: start)
    }

    /// Starting the service on demand failed.
    private struct StartFailure: Error {
        var error: any Error
    }

    /// How many connects this connection attempted.
    public var connectAttempts: Int { state.withLock { $0.attempts } }

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
    public nonisolated(nonsending) func send(_ payload: [UInt8], msgid: UInt32, timeout: Duration) async throws {
        try await operate(within: timeout, byReply: false) { connection, timeout in
            try await connection.send(payload, msgid: msgid, timeout: timeout)
        }
    }

    /// Sends a request to the service and waits for its reply, connecting first if needed.
    /// - Throws: ``IPCError/Code/invalidated`` after ``invalidate()``; ``IPCError/Code/interrupted``
    ///   if the service went away before it answered; what connecting and requesting throw.
    public nonisolated(nonsending) func request(_ payload: [UInt8], msgid: UInt32, sendTimeout: Duration, receiveTimeout: Duration) async throws -> [UInt8] {
        try await operate(within: sendTimeout, byReply: true) { connection, sendTimeout in
            try await connection.request(payload, msgid: msgid, sendTimeout: sendTimeout, receiveTimeout: receiveTimeout)
        }
    }

    /// Runs `operation` on the connection in use (or a new one), with the send timeout it may
    /// take: the whole `timeout` the first time, and what is left of it, once it has its
    /// connection, each time a full listener turned it away. `byReply`: its success shows that
    /// the service admitted the connection (``succeeded(_:byReply:)``).
    private nonisolated(nonsending) func operate<Result>(
        within timeout: Duration, byReply: Bool, _ operation: (any MessageConnection, Duration) async throws -> Result
    ) async throws -> Result {
        let deadline = ContinuousClock.now + timeout
        var retrying = false
        while true {
            let (connection, generation) = try await currentConnection(until: deadline)
            do {
                let result = try await operation(connection, retrying ? max(ContinuousClock.now.duration(to: deadline), .milliseconds(1)) : timeout)
                succeeded(generation, byReply: byReply)
                return result
            } catch {
                guard turnedAway(error, connection: connection, generation: generation, before: deadline) else {
                    throw translated(error, connection: connection, generation: generation)
                }
                try Task.checkCancellation()
                retrying = true
            }
        }
    }

    /// Whether an operation that failed with `error` on the connection of `generation` should go
    /// again: a full listener refused that connection (before reading anything from it), and the
    /// operation's timeout has not passed. A refused connection is counted as a failure here,
    /// if its end has not been (so the next attempt waits for the back-off), and invalidated,
    /// whether or not the operation goes again.
    private func turnedAway(_ error: any Error, connection: any MessageConnection, generation: Int, before deadline: ContinuousClock.Instant) -> Bool {
        guard let error = error as? IPCError, error.isListenerBusy else { return false }
        let retries: Bool = state.withLock { state in
            if state.generation == generation, state.current != nil {
                state.current = nil
                _ = Self.countFailure(&state, error: error, policy: policy, mayGiveUp: false)
            }
            guard state.invalidated == nil else { return false }
            state.busy = IPCError.ListenerBusy()
            return ContinuousClock.now < deadline
        }
        connection.invalidate()
        return retries
    }

    /// An operation on the connection of `generation` succeeded: the service works, and the
    /// failures so far are forgotten. A one-way send that the kernel took (`byReply` false)
    /// does not show that a service that answered busy admitted this connection (a unix-socket
    /// listener's refusal comes after it), so it forgets nothing then. (A listener that did not
    /// answer in time has answered since: this connection was made.)
    private func succeeded(_ generation: Int, byReply: Bool) {
        state.withLock { state in
            // After a send, a reply on the same connection still shows it was admitted.
            guard state.generation == generation, !state.succeeded || state.busy != nil else { return }
            state.succeeded = true
            if byReply || state.busy?.answered != true { state.forgetFailures() }
        }
    }

    /// The connection in use, or a new one. Waits for the back-off and retries until `deadline`
    /// only while the service was never reached, is being started on demand, or answered busy
    /// (a listener that did not answer in time: one attempt, see below); otherwise one attempt,
    /// or an `interrupted` at once if the back-off does not allow one yet.
    private func currentConnection(until deadline: ContinuousClock.Instant) async throws -> (any MessageConnection, Int) {
        let clock = ContinuousClock()
        while true {
            if let found = try existing() { return found }
            let (notBefore, waits, failures, busy) = state.withLock { ($0.notBefore, !$0.reached || starts != nil || $0.busy != nil, $0.failures, $0.busy) }
            if let notBefore, clock.now < notBefore {
                guard waits, notBefore < deadline else {
                    let what =
                        switch busy?.answered {
                        case nil: "unavailable (\(failures) failures in a row)"
                        case true?: "full: its listener turned this client away as busy (\(failures) attempts in a row)"
                        case false?: "not answering: its listener holds the endpoint but did not answer in time (\(failures) attempts in a row)"
                        }
                    throw IPCError(code: .interrupted, message: "the service is \(what); the next attempt waits \(clock.now.duration(to: notBefore)) more, and goes with a later operation")
                }
                try await Task.sleep(until: notBefore, clock: clock)
                if let found = try existing() { return found }
            }
            state.withLock { $0.attempts += 1 }
            let connection: any MessageConnection
            do {
                // The connect may wait for the service's answer: not on a cooperative thread.
                connection = try await runBlocking(connect)
            } catch let failure as StartFailure {
                throw gaveUp(InvalidationReason(.serviceUnavailable, error: IPCError(code: .transportFailure, message: "starting the service on demand failed: \(failure.error)", cause: failure.error)))
            } catch {
                let ipcError = error as? IPCError ?? IPCError(code: .transportFailure, message: "\(error)")
                if let reason = failed(ipcError) { throw gaveUp(reason) }
                guard ipcError.code == .endpointNotFound, clock.now < deadline else { throw error }
                // A listener that did not answer in time took a whole connect timeout (the
                // transport's, not this operation's): one such attempt an operation.
                guard ipcError.listenerBusyCause?.answered != false else { throw error }
                guard waits || ipcError.isListenerBusy else {
                    throw IPCError(code: .interrupted, message: "the service is not listening; a later operation tries again", cause: ipcError)
                }
                continue
            }
            // Operations racing to connect keep the first connection stored; the others' go.
            enum Outcome { case stored(Int, Interruption?), raced((any MessageConnection, Int)), invalidated }
            let outcome: Outcome = state.withLock { state in
                guard state.invalidated == nil else { return .invalidated }
                if let current = state.current, current.invalidationReason == nil { return .raced((current, state.generation)) }
                // A connection that ended before its handler told us: the service went away.
                let interruption = Self.interrupt(&state, policy: policy)
                state.generation += 1
                state.current = connection
                state.succeeded = false
                state.reached = true
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

    /// Counts a failure (a connect that failed, or a connection that ended before any operation
    /// on it succeeded) and sets when the next attempt may go. Returns the invalidation reason
    /// if the policy gives the service up now. Called with the lock held.
    private static func countFailure(_ state: inout State, error: IPCError?, policy: Policy, mayGiveUp: Bool = true) -> InvalidationReason? {
        let now = ContinuousClock.now
        state.failures += 1
        state.notBefore = now + policy.backoff.wait(afterAttempt: state.failures)
        state.busy = error?.listenerBusyCause
        // A full listener's service is running: its answers space the attempts, and end any
        // outage (its start and its count), so they never give the service up. One that did
        // not answer in time (hung, stopped) is not started again either, but its silence is
        // part of an outage, which may give it up.
        if state.busy?.answered == true {
            state.unavailable = 0
            state.outageStarted = nil
            return nil
        }
        state.unavailable += 1
        let started = state.outageStarted ?? now
        state.outageStarted = started
        guard mayGiveUp else { return nil }
        let outOfTime = policy.outageLimit.map { started.duration(to: now) >= $0 } ?? false
        let outOfAttempts = policy.maximumFailures.map { state.unavailable >= $0 } ?? false
        guard outOfTime || outOfAttempts else { return nil }
        let what = outOfAttempts ? "\(state.unavailable) failures in a row" : "failures for \(started.duration(to: now))"
        return InvalidationReason(.serviceUnavailable, error: IPCError(
            code: error?.code ?? .endpointNotFound, message: "the service stayed unavailable (\(what)); last: \(error.map { "\($0)" } ?? "its connection ended")", cause: error
        ))
    }

    /// A connect failed with `error`: counts it; returns the invalidation reason if the
    /// service is given up now.
    private func failed(_ error: IPCError) -> InvalidationReason? {
        state.withLock { state in
            guard state.invalidated == nil else { return nil }
            return Self.countFailure(&state, error: error, policy: policy)
        }
    }

    /// Invalidates for `reason` (unless invalidated already) and returns the error the
    /// operation that found it fails with.
    private func gaveUp(_ reason: InvalidationReason) -> IPCError {
        let handler: (@Sendable (InvalidationReason) -> Void)?? = state.withLock { state in
            guard state.invalidated == nil else { return nil }
            state.invalidated = reason
            defer {
                state.current = nil
                state.invalidationHandler = nil
                state.interruptionHandler = nil
            }
            return .some(state.invalidationHandler)
        }
        if case .some(let handler) = handler { handler?(reason) }
        return IPCError(code: .invalidated, message: "the service connection was invalidated (\(reason))", cause: reason.error)
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

    /// Counts the end of the current connection as an interruption, once, and forgets it; a
    /// connection on which nothing succeeded counts as a failure too (see ``Policy``).
    private static func interrupt(_ state: inout State, policy: Policy) -> Interruption? {
        guard state.invalidated == nil, let current = state.current else { return nil }
        state.current = nil
        let reason = current.invalidationReason ?? InvalidationReason(.peerClosed)
        // A full listener's refusal (unix sockets: after the connect) counts even after a send
        // that the kernel took, which the refusal dropped.
        let refusedBusy = reason.error?.isListenerBusy ?? false
        // Giving up happens at the next attempt, which counts again: here only the spacing.
        if !state.succeeded || refusedBusy {
            _ = countFailure(&state, error: reason.error, policy: policy, mayGiveUp: false)
        } else if state.busy != nil {
            // Something succeeded on it and it did not end refused: it was admitted, so the busy
            // answers before it (which a send alone did not forget) are over.
            state.forgetFailures()
        }
        // A connection refused before anything on it was done is an attempt that did not get
        // in, not a service that went away.
        guard state.succeeded || !refusedBusy else { return nil }
        state.interruptions += 1
        return Interruption(reason: reason, handler: state.interruptionHandler)
    }

    /// The connection of `generation` ended: unless this side invalidated it (or it was
    /// counted already), the service went away.
    private func ended(generation: Int, reason: InvalidationReason) {
        let interruption: Interruption? = state.withLock { state in
            guard state.generation == generation else { return nil }
            return Self.interrupt(&state, policy: policy)
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
