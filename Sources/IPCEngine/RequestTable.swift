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
/// runs on its preferred executor, which is that same thread when the task prefers the loop.
/// The continuations are unchecked (a checked one allocates per request): each is taken out of
/// the table under its lock before it is resumed, so it is resumed exactly once.
package final class RequestTable: Sendable {
    private enum Slot {
        case waiting(UnsafeContinuation<[UInt8], any Error>?)
        case finished(Result<[UInt8], IPCError>)
    }

    /// One request: its slot, and once it is waited for, its receive deadline. Updated in
    /// place (``TokenTable/update(_:_:)``): a copy of an entry retains what its slot holds.
    private struct Entry {
        var slot: Slot
        /// Monotonic nanoseconds, and the timeout it came from (for the error's message).
        var deadline: (at: UInt64, timeout: Duration)?
    }

    private struct State {
        var entries = TokenTable<Entry>()
        /// The earliest wake-up armed with the scheduler, if any.
        var armedWake: UInt64?
        /// The last timeout converted to nanoseconds, and what it came to: requests on a
        /// connection mostly share one timeout, and `Duration`'s conversion divides 128-bit
        /// attoseconds (about 190 instructions a request, measured with callgrind).
        var lastTimeout: (duration: Duration, nanoseconds: UInt64) = (.zero, 0)
        /// Set once the connection is invalid: every later request fails at once with it.
        var closedWith: IPCError?

        /// Removes the request's entry and returns its continuation if one waits; if it waits
        /// without one yet, keeps `result` for it instead. `nil`: no such request waits.
        mutating func finish(_ correlation: UInt64, with result: Result<[UInt8], IPCError>) -> UnsafeContinuation<[UInt8], any Error>?? {
            let found: UnsafeContinuation<[UInt8], any Error>??? = entries.update(correlation) { entry in
                switch entry.slot {
                case .waiting(let continuation?):
                    return .some(continuation)
                case .waiting(nil):
                    entry.slot = .finished(result)
                    return .some(nil)
                case .finished:
                    return nil
                }
            }
            guard let found, let outcome = found else { return nil }
            if outcome != nil { entries.remove(correlation) }
            return outcome
        }
    }

    private let state = Mutex(State())
    private let loop: EventLoop

    package init(loop: EventLoop) {
        self.loop = loop
    }

    /// The number of requests still waiting for a reply.
    package var pendingCount: Int { state.withLock { $0.entries.count } }

    /// Reserves a correlation id for a request about to be sent.
    /// - Throws: the invalidation error if the connection is already invalid.
    package func register() throws -> UInt64 {
        try state.withLock { state in
            if let closed = state.closedWith { throw closed }
            return state.entries.insert(Entry(slot: .waiting(nil)))
        }
    }

    /// Forgets a request whose send failed.
    package func cancel(_ correlation: UInt64) {
        _ = state.withLock { $0.entries.remove(correlation) }
    }

    /// Waits for the reply to a registered request. Under a spinning `strategy` the calling
    /// thread first polls for the reply (the receive path completes it) without suspending.
    /// - Throws: ``IPCError/Code/receiveTimeout`` after `timeout`; the invalidation error if
    ///   the connection becomes invalid first; `CancellationError` if the task is cancelled.
    @inline(__always)
    package func reply(to correlation: UInt64, timeout: Duration, strategy: WaitStrategy = .blocking) async throws -> [UInt8] {
        // Never spin on the loop's own thread: the loop reads the reply once this task suspends.
        if !loop.inEventLoop, let finished = SpinWait.poll(strategy, { takeFinished(correlation) }) {
            return try finished.get()
        }
        let now = monotonicNanoseconds()
        let armAt: UInt64? = state.withLock { state in
            if state.lastTimeout.duration != timeout { state.lastTimeout = (timeout, timeout.wholeNanoseconds) }
            let deadline = now &+ state.lastTimeout.nanoseconds
            guard state.entries.update(correlation, { $0.deadline = (deadline, timeout) }) != nil else { return nil }
            guard state.armedWake.map({ deadline < $0 }) ?? true else { return nil }
            state.armedWake = deadline
            return deadline
        }
        if let armAt { armWake(at: armAt) }
        return try await withTaskCancellationHandler {
            try await withUnsafeThrowingContinuation { continuation in
                let finished: Result<[UInt8], any Error>? = state.withLock { state in
                    // `nil`: stored, the request waits; otherwise its outcome, and it ends here.
                    let outcome: Result<[UInt8], any Error>?? = state.entries.update(correlation) { entry in
                        switch entry.slot {
                        case .finished(let result):
                            return result.mapError { $0 }
                        case .waiting:
                            // Cancelled before the continuation was stored: the cancellation handler
                            // found nothing to resume, so the request ends here.
                            if Task.isCancelled { return .failure(CancellationError()) }
                            entry.slot = .waiting(continuation)
                            return nil
                        }
                    }
                    guard let outcome else {
                        return .failure(IPCError(code: .receiveTimeout, message: "request \(correlation) is no longer pending"))
                    }
                    if outcome != nil { state.entries.remove(correlation) }
                    return outcome
                }
                if let finished { continuation.resume(with: finished) }
            }
        } onCancel: {
            if let continuation = takeContinuation(correlation) {
                continuation.resume(throwing: CancellationError())
            }
        }
    }

    /// The outcome of a request that has one, which is then forgotten.
    package func takeFinished(_ correlation: UInt64) -> Result<[UInt8], IPCError>? {
        state.withLock { state in
            guard case .finished(let result)?? = state.entries.update(correlation, { entry -> Slot? in
                if case .finished = entry.slot { entry.slot }
                else { nil }
            }) else { return nil }
            state.entries.remove(correlation)
            return result
        }
    }

    private func takeContinuation(_ correlation: UInt64) -> UnsafeContinuation<[UInt8], any Error>? {
        state.withLock { state in
            guard case .waiting(let continuation?)?? = state.entries.update(correlation, { entry -> Slot? in
                if case .waiting(_?) = entry.slot { entry.slot }
                else { nil }
            }) else { return nil }
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
                if deadline.at <= now {
                    expired.append((correlation, deadline.timeout))
                } else {
                    next = min(next ?? .max, deadline.at)
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
