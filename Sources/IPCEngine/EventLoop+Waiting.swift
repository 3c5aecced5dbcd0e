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
        let waiter = ReadinessWaiter()
        guard abortable({ waiter.finish(.cancelled) }) else { return .cancelled }
        // Registered before the task waits, so that the token is known to the code that
        // deregisters it; a report that comes first is kept by the waiter for its start.
        // Edge-triggered: reported once, at registration if the descriptor is ready already.
        let token = try register(fd, interest: [readiness == .readable ? .readable : .writable, .edgeTriggered], handler: waiter)
        defer { deregister(token) }
        schedule(at: deadline) { waiter.finish(.deadlinePassed) }
        return await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<WaitOutcome, Never>) in
                waiter.start(continuation)
                if Task.isCancelled { waiter.finish(.cancelled) }
            }
        } onCancel: {
            waiter.finish(.cancelled)
        }
    }

    /// One task waiting for a descriptor: resumed once, by the first of the readiness report, its
    /// deadline's timer and its cancellation.
    private final class ReadinessWaiter: EventHandler, Sendable {
        private enum State {
            case idle
            case waiting(CheckedContinuation<WaitOutcome, Never>)
            /// Ended before the task began to wait (a report, an abort, a cancellation).
            case ended(WaitOutcome)
            case resumed
        }

        private let state = Mutex(State.idle)

        var stallLabel: String { "a task's wait for a descriptor to be ready" }

        func start(_ continuation: CheckedContinuation<WaitOutcome, Never>) {
            let early: WaitOutcome? = state.withLock { state in
                if case .ended(let outcome) = state {
                    state = .resumed
                    return outcome
                }
                state = .waiting(continuation)
                return nil
            }
            if let early { continuation.resume(returning: early) }
        }

        func finish(_ outcome: WaitOutcome) {
            let continuation: CheckedContinuation<WaitOutcome, Never>? = state.withLock { state in
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
            finish(.ready)
        }
    }
}
