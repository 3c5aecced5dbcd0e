import IPCCore
import Synchronization

/// A connection under observation: every message it delivers and every run of its
/// invalidation handler are recorded with the time they happened, from the moment it exists.
final class ConnectionProbe: Sendable {
    let connection: any MessageConnection

    private struct State {
        var messages: [ReceivedMessage] = []
        var streamFinishedAt: ContinuousClock.Instant?
        var invalidations: [(reason: InvalidationReason, at: ContinuousClock.Instant)] = []
    }

    private let state = Mutex(State())

    init(_ connection: any MessageConnection) {
        self.connection = connection
        let messages = connection.messages
        // Weak: the connection keeps its handler and its stream, which must not keep the
        // probe, and with it the connection, alive.
        Task { [weak self] in
            for await message in messages {
                self?.state.withLock { $0.messages.append(message) }
            }
            self?.state.withLock { $0.streamFinishedAt = .now }
        }
        connection.setInvalidationHandler { [weak self] reason in
            self?.state.withLock { $0.invalidations.append((reason, .now)) }
        }
    }

    var messages: [ReceivedMessage] { state.withLock { $0.messages } }
    var messageCount: Int { state.withLock { $0.messages.count } }
    var streamFinishedAt: ContinuousClock.Instant? { state.withLock { $0.streamFinishedAt } }
    var invalidationCount: Int { state.withLock { $0.invalidations.count } }
    var firstInvalidation: (reason: InvalidationReason, at: ContinuousClock.Instant)? { state.withLock { $0.invalidations.first } }

    /// Waits until at least `count` messages arrived, and returns the first `count`.
    ///
    /// Gives up early when no message has arrived for `stall` (5 s by default): a message that
    /// was lost will not come, and waiting out the whole limit would only slow the suite.
    /// - Throws: ``ConformanceFailure`` naming how many arrived if fewer did.
    func messages(_ count: Int, within limit: Duration, stall: Duration = .seconds(5), _ what: String) async throws -> [ReceivedMessage] {
        let deadline = ContinuousClock.now + limit
        var seen = messageCount
        var lastProgress = ContinuousClock.now
        while seen < count {
            let now = ContinuousClock.now
            try check(now < deadline, "\(what): \(seen) of \(count) messages arrived within \(limit)\(endState)")
            try check(now - lastProgress < stall, "\(what): \(seen) of \(count) messages arrived, then none for \(stall)\(endState)")
            try? await Task.sleep(for: .milliseconds(2))
            let current = messageCount
            if current != seen {
                seen = current
                lastProgress = .now
            }
        }
        return Array(messages.prefix(count))
    }

    /// What a failure to receive adds: whether the connection ended meanwhile, and why, so that
    /// a lost message is told from a connection that ended.
    private var endState: String {
        if let first = firstInvalidation { return " (the connection was invalidated: \(first.reason))" }
        return streamFinishedAt != nil ? " (the message stream ended)" : " (the connection is still valid)"
    }

    /// Waits for the invalidation handler to run; returns when it ran, or `nil` if it did not
    /// within `limit`.
    func invalidation(within limit: Duration) async -> ContinuousClock.Instant? {
        _ = await poll(within: limit) { self.invalidationCount > 0 }
        return firstInvalidation?.at
    }

    /// Waits for the invalidation handler, and returns how long after `start` it ran.
    /// - Throws: ``ConformanceFailure`` if it did not run within `limit` of now.
    func invalidationDelay(since start: ContinuousClock.Instant, within limit: Duration, _ what: String) async throws -> Duration {
        guard let at = await invalidation(within: limit) else {
            throw ConformanceFailure("\(what): the invalidation handler did not run within \(limit)")
        }
        return at - start
    }
}
