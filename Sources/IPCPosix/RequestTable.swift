import IPCCore
import Synchronization

/// The requests a connection has sent and not yet had answered, keyed by correlation id.
///
/// Every transport that offers request/reply uses it, so correlation, timeouts and failure on
/// invalidation behave the same everywhere. A request is registered *before* it is sent, so a
/// reply that overtakes the waiting task is kept, not lost.
public final class RequestTable: Sendable {
    private enum Slot {
        case waiting(CheckedContinuation<[UInt8], any Error>?)
        case finished(Result<[UInt8], IPCError>)
    }

    private struct State {
        var nextCorrelation: UInt64 = 1
        var slots: [UInt64: Slot] = [:]
        /// Set once the connection is invalid: every later request fails at once with it.
        var closedWith: IPCError?
    }

    private let state = Mutex(State())

    public init() {}

    /// The number of requests still waiting for a reply.
    public var pendingCount: Int { state.withLock { $0.slots.count } }

    /// Reserves a correlation id for a request about to be sent.
    /// - Throws: the invalidation error if the connection is already invalid.
    public func register() throws -> UInt64 {
        try state.withLock { state in
            if let closed = state.closedWith { throw closed }
            let correlation = state.nextCorrelation
            state.nextCorrelation &+= 1
            if state.nextCorrelation == 0 { state.nextCorrelation = 1 }
            state.slots[correlation] = .waiting(nil)
            return correlation
        }
    }

    /// Forgets a request whose send failed.
    public func cancel(_ correlation: UInt64) {
        _ = state.withLock { $0.slots.removeValue(forKey: correlation) }
    }

    /// Waits for the reply to a registered request.
    /// - Throws: ``IPCError/Code/receiveTimeout`` after `timeout`; the invalidation error if
    ///   the connection becomes invalid first; `CancellationError` if the task is cancelled.
    public func reply(to correlation: UInt64, timeout: Duration) async throws -> [UInt8] {
        DeadlineScheduler.shared.schedule(after: timeout) { [self] in
            complete(correlation, with: .failure(IPCError(code: .receiveTimeout, message: "no reply to request \(correlation) within \(timeout)")))
        }
        return try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { continuation in
                let finished: Result<[UInt8], IPCError>? = state.withLock { state in
                    switch state.slots[correlation] {
                    case .finished(let result):
                        state.slots[correlation] = nil
                        return result
                    case .waiting:
                        state.slots[correlation] = .waiting(continuation)
                        return nil
                    case nil:
                        return .failure(IPCError(code: .receiveTimeout, message: "request \(correlation) is no longer pending"))
                    }
                }
                if let finished { continuation.resume(with: finished) }
            }
        } onCancel: {
            if let continuation = takeContinuation(correlation) {
                continuation.resume(throwing: CancellationError())
            }
        }
    }

    private func takeContinuation(_ correlation: UInt64) -> CheckedContinuation<[UInt8], any Error>? {
        state.withLock { state in
            guard case .waiting(let continuation?) = state.slots[correlation] else { return nil }
            state.slots[correlation] = nil
            return continuation
        }
    }

    /// Delivers the outcome of a request. Returns `false` if no such request is pending (a late
    /// reply after a timeout, or a reply the peer made up), which the caller may ignore.
    @discardableResult
    public func complete(_ correlation: UInt64, with result: Result<[UInt8], IPCError>) -> Bool {
        let continuation: CheckedContinuation<[UInt8], any Error>?? = state.withLock { state in
            switch state.slots[correlation] {
            case .waiting(let continuation?):
                state.slots[correlation] = nil
                return .some(continuation)
            case .waiting(nil):
                state.slots[correlation] = .finished(result)
                return .some(nil)
            case .finished, nil:
                return nil
            }
        }
        guard let continuation else { return false }
        continuation?.resume(with: result)
        return true
    }

    /// Fails every pending request and every later one with `error`.
    public func close(with error: IPCError) {
        let waiting: [CheckedContinuation<[UInt8], any Error>] = state.withLock { state in
            state.closedWith = error
            var continuations: [CheckedContinuation<[UInt8], any Error>] = []
            for (correlation, slot) in state.slots {
                switch slot {
                case .waiting(let continuation?):
                    continuations.append(continuation)
                    state.slots[correlation] = nil
                case .waiting(nil):
                    state.slots[correlation] = .finished(.failure(error))
                case .finished:
                    break
                }
            }
            return continuations
        }
        for continuation in waiting { continuation.resume(throwing: error) }
    }
}
