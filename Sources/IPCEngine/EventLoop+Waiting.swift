import IPCCore
import Synchronization

extension EventLoop {
    /// What ``waitUntil(_:is:deadline:abortable:)`` waits for.
    package enum Readiness: Sendable {
        case readable, writable
    }

    /// How a ``waitUntil(_:is:deadline:abortable:)`` ended.
    package enum WaitOutcome: Sendable {
        case ready, deadlinePassed, cancelled
    }

    /// Suspends the calling task, without holding a thread, until `fd` is readable or writable
    /// (the loop watches it, once), `deadline` (``monotonicNanoseconds()``) passes, or the task
    /// is cancelled. For a sender whose descriptor has no room now, such as a full message
    /// queue, or a receiver waiting for one answer before a connection exists (a handshake).
    /// `fd` must not be registered with the loop already (one waiter per descriptor at a time).
    /// `abortable` is given a function that ends the wait as if cancelled (for whoever closes
    /// `fd`), and returns `false` to end it at once.
    /// - Throws: ``IPCError/Code/transportFailure`` if the loop cannot watch `fd`.
    package func waitUntil(
        _ fd: CInt, is readiness: Readiness, deadline: UInt64, abortable: (_ abort: @escaping @Sendable () -> Void) -> Bool = { _ in true }
    ) async throws -> WaitOutcome {
        let waiter = WritableWaiter()
        guard abortable({ waiter.finish(.success(.cancelled)) }) else { return .cancelled }
        let outcome: Result<WaitOutcome, any Error> = await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<Result<WaitOutcome, any Error>, Never>) in
                waiter.start(continuation)
                guard waiter.isWaiting else { return }
                do {
                    // Edge-triggered: reported once, at registration if there is room already.
                    let token = try register(fd, interest: [readiness == .readable ? .readable : .writable, .edgeTriggered], handler: waiter)
                    waiter.token.withLock { $0 = token }
                } catch {
                    waiter.finish(.failure(error))
                    return
                }
                schedule(at: deadline) { waiter.finish(.success(.deadlinePassed)) }
                if Task.isCancelled { waiter.finish(.success(.cancelled)) }
            }
        } onCancel: {
            waiter.finish(.success(.cancelled))
        }
        if let token = waiter.token.withLock({ $0 }) { deregister(token) }
        return try outcome.get()
    }

    /// One task waiting for a descriptor: resumed once, by the first of the readiness report, its
    /// deadline's timer and its cancellation.
    private final class WritableWaiter: EventHandler, Sendable {
        private enum State {
            case idle
            case waiting(CheckedContinuation<Result<WaitOutcome, any Error>, Never>)
            /// Ended before the task began to wait (an abort, a cancellation).
            case ended(Result<WaitOutcome, any Error>)
            case resumed
        }

        private let state = Mutex(State.idle)
        let token = Mutex<UInt64?>(nil)

        var stallLabel: String { "a task's wait for a descriptor to be ready" }

        var isWaiting: Bool {
            state.withLock { if case .waiting = $0 { true } else { false } }
        }

        func start(_ continuation: CheckedContinuation<Result<WaitOutcome, any Error>, Never>) {
            let early: Result<WaitOutcome, any Error>? = state.withLock { state in
                if case .ended(let outcome) = state {
                    state = .resumed
                    return outcome
                }
                state = .waiting(continuation)
                return nil
            }
            if let early { continuation.resume(returning: early) }
        }

        func finish(_ outcome: Result<WaitOutcome, any Error>) {
            let continuation: CheckedContinuation<Result<WaitOutcome, any Error>, Never>? = state.withLock { state in
                switch state {
                case .idle:
                    state = .ended(outcome)
                    return nil
                case .waiting(let continuation):
                    state = .resumed
                    return continuation
                case .ended, .resumed:
                    return nil
                }
            }
            continuation?.resume(returning: outcome)
        }

        func handleEvent(readable: Bool, writable: Bool, hangUp: Bool) {
            // An error on the descriptor also ends the wait: the next read or write reports it.
            finish(.success(.ready))
        }
    }
}
