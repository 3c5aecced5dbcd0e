package import IPCCore
import Synchronization

/// The requests a connection has sent and not yet had answered, keyed by correlation id.
///
/// A correlation id is the request's token in a ``TokenTable`` (a slot's index plus one in the
/// low 32 bits, the slot's reuse count in the high 32): found without hashing, and a late reply
/// to a request that ended finds nothing even once its slot holds a newer request.
///
/// Every transport that offers request/reply uses it, so correlation, timeouts and failure on
/// invalidation behave the same everywhere. A request is registered *before* it is sent, so a
/// reply that overtakes the waiting task is kept, not lost.
///
/// Receive timeouts cost the reply path nothing: each request records its deadline, and the
/// table keeps one timer on the ``EventLoop`` for its earliest deadline; when it fires, the
/// table fails what has expired and arms the next. A completed request leaves nothing behind.
///
/// A waiting request's continuation is resumed on the thread that completes it; the task then
/// runs on its caller's executor (the wait is `nonisolated(nonsending)`): the caller's actor,
/// else its preferred executor, which is that same thread when the task prefers the loop, else
/// the global executor.
/// The continuations are unchecked (a checked one allocates per request): each is taken out of
/// the table under its lock before it is resumed, so it is resumed exactly once.
package final class RequestTable: Sendable {
    /// One request. Trivial data (nothing reference-counted), so that the table's
    /// inserts, lookups and removals copy it as bytes: an entry holding its outcome inline was
    /// copied and destroyed through the runtime's generic value witnesses, about 400
    /// instructions a request (callgrind). An outcome that arrives before its task waits is kept
    /// apart, in ``State/early``.
    private struct Entry {
        /// The waiting task, once it has suspended.
        var continuation: UnsafeContinuation<[UInt8], any Error>?
        /// The outcome came before the task waited: it is in ``State/early``.
        var finishedEarly = false
        /// The task was cancelled before it stored its continuation: it ends when it comes to.
        var cancelledEarly = false
        /// Monotonic nanoseconds, once the task waits.
        var deadline: UInt64?
        /// The receive timeout the deadline came from (for the error's message).
        var timeout: Duration = .zero
    }

    private struct State {
        var entries = TokenTable<Entry>()
        /// Outcomes that came before their task waited for them, by correlation id: each is
        /// taken when its task waits (or polls), or dropped with its entry.
        var early: [UInt64: Result<[UInt8], IPCError>] = [:]
        /// The earliest wake-up armed with the scheduler, if any.
        var armedWake: UInt64?
        /// The last timeout converted to nanoseconds, and what it came to: requests on a
        /// connection mostly share one timeout, and `Duration`'s conversion divides 128-bit
        /// attoseconds (about 190 instructions a request, measured with callgrind).
        var lastTimeout: (duration: Duration, nanoseconds: UInt64) = (.zero, 0)
        /// Set once the connection is invalid: every later request fails at once with it.
        var closedWith: IPCError?

        /// Removes the request's entry and returns its continuation if one waits; if it waits
        /// without one yet, keeps `result` for it instead. `nil`: no such request waits, or it
        /// already has an outcome.
        mutating func finish(_ correlation: UInt64, with result: Result<[UInt8], IPCError>) -> UnsafeContinuation<[UInt8], any Error>?? {
            guard let entry = entries[correlation], !entry.finishedEarly else { return nil }
            if let continuation = entry.continuation {
                entries.remove(correlation)
                return .some(continuation)
            }
            entries.update(correlation) { $0.finishedEarly = true }
            early[correlation] = result
            return .some(nil)
        }

        /// Removes the request's entry and returns its early outcome, if it has one.
        mutating func takeEarly(_ correlation: UInt64) -> Result<[UInt8], IPCError>? {
            guard entries[correlation]?.finishedEarly == true else { return nil }
            entries.remove(correlation)
            return early.removeValue(forKey: correlation)
        }
    }

    private let state = Mutex(State())
    private let loop: EventLoop

    package init(loop: EventLoop) {
        self.loop = loop
    }

    /// The number of requests still waiting for a reply.
    package var pendingCount: Int { state.withLock { $0.entries.count } }

    /// Whether a task waits for the request's reply: it has stored its continuation (and
    /// suspends, or has suspended).
    package func isWaiting(_ correlation: UInt64) -> Bool {
        state.withLock { $0.entries[correlation]?.continuation != nil }
    }

    /// The number of outcomes kept for requests that have not waited for them yet.
    package var keptOutcomeCount: Int { state.withLock { $0.early.count } }

    /// Reserves a correlation id for a request about to be sent.
    /// - Throws: the invalidation error if the connection is already invalid.
    package func register() throws -> UInt64 {
        try state.withLock { state in
            if let closed = state.closedWith { throw closed }
            return state.entries.insert(Entry())
        }
    }

    /// Forgets a request whose send failed.
    package func cancel(_ correlation: UInt64) {
        state.withLock { state in
            if state.entries.remove(correlation)?.finishedEarly == true { state.early[correlation] = nil }
        }
    }

    /// Waits for the reply to a registered request. Under a spinning `strategy` the calling
    /// thread first polls for the reply (the receive path completes it) without suspending.
    /// - Throws: ``IPCError/Code/receiveTimeout`` after `timeout`; the invalidation error if
    ///   the connection becomes invalid first; `CancellationError` if the task is cancelled.
    @inline(__always)
    package nonisolated(nonsending) func reply(to correlation: UInt64, timeout: Duration, strategy: WaitStrategy = .blocking) async throws -> [UInt8] {
        // Never spin on the loop's own thread: the loop reads the reply once this task suspends.
        // (Checked here too, so that a task on the loop makes no hop to find that out.)
        if strategy.spins, !loop.inEventLoop, let finished = await spinForFinished(correlation, strategy) {
            return try finished.get()
        }
        let now = monotonicNanoseconds()
        // The cancellation handler's record is added without a switch of executor:
        // `withTaskCancellationHandler` takes an `isolated (any Actor)?` parameter, so entering it
        // and returning from it are each a switch to that isolation, which for a task with an
        // executor preference means looking the preference up under the task's status-record
        // lock. This function is the same operation (the record added before the operation, run
        // at once if the task is cancelled already, removed after it) without that parameter:
        // the runtime's original entry point, public, kept for code built before #isolation,
        // which inherits its caller's executor. The record is removed where the operation
        // returns (the generic executor: the loop, for a task that prefers it); `request`, which
        // calls this and is nonsending, switches back to its caller's isolation after it, as
        // before. About 620 fewer instructions a round trip in the client (callgrind,
        // Reports/cancellation-hops).
        return try await _unsafeInheritExecutor_withTaskCancellationHandler {
            try await withUnsafeThrowingContinuation { continuation in
                // One lock: the outcome if the request has one already, else the continuation
                // and the deadline are stored together (and the earliest deadline is armed).
                let (finished, armAt): (Result<[UInt8], any Error>?, UInt64?) = state.withLock { state in
                    guard let entry = state.entries[correlation] else {
                        return (.failure(IPCError(code: .receiveTimeout, message: "request \(correlation) is no longer pending")), nil)
                    }
                    if entry.finishedEarly {
                        let early = state.takeEarly(correlation)
                        return (early.map { $0.mapError { $0 } } ?? .failure(IPCError(code: .receiveTimeout, message: "request \(correlation) is no longer pending")), nil)
                    }
                    // Cancelled before the continuation was stored: the cancellation handler
                    // found nothing to resume and marked the entry, so the request ends here.
                    // (Read from the entry, under the lock the handler takes too: asking
                    // `Task.isCancelled` costs about 95 instructions a request.)
                    if entry.cancelledEarly {
                        state.entries.remove(correlation)
                        return (.failure(CancellationError()), nil)
                    }
                    if state.lastTimeout.duration != timeout { state.lastTimeout = (timeout, timeout.wholeNanoseconds) }
                    let deadline = now &+ state.lastTimeout.nanoseconds
                    state.entries.update(correlation) { entry in
                        entry.continuation = continuation
                        entry.deadline = deadline
                        entry.timeout = timeout
                    }
                    guard state.armedWake.map({ deadline < $0 }) ?? true else { return (nil, nil) }
                    state.armedWake = deadline
                    return (nil, deadline)
                }
                if let armAt { armWake(at: armAt) }
                if let finished { continuation.resume(with: finished) }
            }
        } onCancel: {
            if let continuation = cancelWaiting(correlation) {
                continuation.resume(throwing: CancellationError())
            }
        }
    }

    /// Polls for the request's outcome for the strategy's spin time. `@concurrent`, unlike the
    /// wait that calls it: it runs on the generic executor (the task's preferred one, else the
    /// global), so that a request made on an actor never spins on the actor's thread. That
    /// executor may be the loop (a task on an actor that prefers the loop), where it must not
    /// spin either: the loop reads the reply once the task suspends.
    @concurrent private func spinForFinished(_ correlation: UInt64, _ strategy: WaitStrategy) async -> Result<[UInt8], IPCError>? {
        guard !loop.inEventLoop else { return nil }
        return SpinWait.poll(strategy) { takeFinished(correlation) }
    }

    /// The outcome of a request that has one, which is then forgotten.
    package func takeFinished(_ correlation: UInt64) -> Result<[UInt8], IPCError>? {
        state.withLock { $0.takeEarly(correlation) }
    }

    /// The task waiting for the request was cancelled: returns its continuation, the request
    /// forgotten, if it waits; if it has not stored its continuation yet, marks the request so
    /// that it ends when it does.
    private func cancelWaiting(_ correlation: UInt64) -> UnsafeContinuation<[UInt8], any Error>? {
        state.withLock { state in
            guard let entry = state.entries[correlation] else { return nil }
            guard let continuation = entry.continuation else {
                state.entries.update(correlation) { $0.cancelledEarly = true }
                return nil
            }
            state.entries.remove(correlation)
            return continuation
        }
    }

    private func armWake(at deadline: UInt64) {
        // Strong: the table lives until its earliest deadline at the longest. A weak reference
        // would give it a side table and slow every retain of it.
        loop.schedule(at: deadline) { [self] in expire() }
    }

    /// Fails every request whose deadline has passed, then arms a wake-up for the next deadline.
    private func expire() {
        let now = monotonicNanoseconds()
        var expired: [(UInt64, Duration)] = []
        let next: UInt64? = state.withLock { state in
            var next: UInt64?
            for (correlation, entry) in state.entries.tokensAndValues {
                guard let deadline = entry.deadline else { continue }
                if deadline <= now {
                    expired.append((correlation, entry.timeout))
                } else {
                    next = min(next ?? .max, deadline)
                }
            }
            for (correlation, _) in expired { state.entries.update(correlation) { $0.deadline = nil } }
            // Keep an earlier wake that is still armed; otherwise this call arms the next one.
            if let armed = state.armedWake, armed > now, let next, armed <= next { return nil }
            state.armedWake = next
            return next
        }
        if let next { armWake(at: next) }
        for (correlation, timeout) in expired {
            complete(correlation, with: .failure(IPCError(code: .receiveTimeout, message: "no reply to request \(correlation) within \(timeout)")))
        }
    }

    /// Delivers the outcome of a request. Returns `false` if no such request is pending (a late
    /// reply after a timeout, or a reply the peer made up), which the caller may ignore.
    @discardableResult
    package func complete(_ correlation: UInt64, with result: Result<[UInt8], IPCError>) -> Bool {
        guard let continuation = state.withLock({ $0.finish(correlation, with: result) }) else { return false }
        continuation?.resume(with: result)
        return true
    }

    /// Fails every pending request and every later one with `error`.
    package func close(with error: IPCError) {
        let waiting: [UnsafeContinuation<[UInt8], any Error>] = state.withLock { state in
            state.closedWith = error
            var continuations: [UnsafeContinuation<[UInt8], any Error>] = []
            for (correlation, _) in state.entries.tokensAndValues {
                state.entries.update(correlation) { $0.deadline = nil }
                if case let continuation?? = state.finish(correlation, with: .failure(error)) {
                    continuations.append(continuation)
                }
            }
            return continuations
        }
        for continuation in waiting { continuation.resume(throwing: error) }
    }
}
