import Synchronization

/// Why a connection stopped being valid.
public struct InvalidationReason: Sendable, Hashable, CustomStringConvertible {
    public enum Kind: String, Sendable, Hashable {
        /// ``MessageConnection/invalidate()`` was called on this side.
        case invalidatedLocally
        /// The peer closed the connection (end of file, or its process closed its descriptors).
        case peerClosed
        /// The peer's process exited or was killed.
        case peerDied
        /// The peer sent bytes this side cannot decode; the error says what.
        case protocolError
        /// A system call failed; the error says which.
        case transportFailure
        /// A ``ServiceConnection``'s service stayed unreachable for longer than its
        /// ``ServiceConnection/Policy`` allows, or starting it on demand failed; the error is
        /// the last connect's (or the start's).
        case serviceUnavailable
    }

    public var kind: Kind
    public var error: IPCError?

    public init(_ kind: Kind, error: IPCError? = nil) {
        self.kind = kind
        self.error = error
    }

    public var description: String {
        error.map { "\(kind.rawValue): \($0)" } ?? kind.rawValue
    }
}

/// Runs an invalidation exactly once: the first caller of ``invalidate(_:)`` wins; it releases
/// resources and then calls ``complete()``, which runs the handler. A handler set after
/// completion runs at once. Each handler runs at most once.
package final class InvalidationLatch: Sendable {
    private struct State {
        var reason: InvalidationReason?
        var completed = false
        var handler: (@Sendable (InvalidationReason) -> Void)?
    }

    private let state = Mutex(State())
    /// Set once a reason is recorded: the hot paths (every send and receive asks) read it
    /// without taking the lock or copying the reason.
    private let invalidated = Atomic<Bool>(false)

    package init() {}

    package var reason: InvalidationReason? {
        invalidated.load(ordering: .acquiring) ? state.withLock { $0.reason } : nil
    }

    package var isValid: Bool { !invalidated.load(ordering: .acquiring) }

    /// Records the reason if none is recorded yet. Returns `true` for the one caller that did.
    package func invalidate(_ reason: InvalidationReason) -> Bool {
        state.withLock { state in
            guard state.reason == nil else { return false }
            state.reason = reason
            invalidated.store(true, ordering: .releasing)
            return true
        }
    }

    /// Marks the invalidation finished (everything else reported, resources released) and runs
    /// the handler, so that the handler is the last thing a connection reports.
    package func complete() {
        let pending: (@Sendable (InvalidationReason) -> Void, InvalidationReason)? = state.withLock { state in
            state.completed = true
            guard let reason = state.reason, let handler = state.handler else { return nil }
            state.handler = nil
            return (handler, reason)
        }
        if let (handler, reason) = pending { handler(reason) }
    }

    /// Sets the handler, replacing one that has not run. Runs it at once if invalidation has completed.
    package func setHandler(_ handler: @escaping @Sendable (InvalidationReason) -> Void) {
        let runNow: InvalidationReason? = state.withLock { state in
            if state.completed, let reason = state.reason { return reason }
            state.handler = handler
            return nil
        }
        if let runNow { handler(runNow) }
    }
}
