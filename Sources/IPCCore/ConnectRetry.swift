import Foundation

/// How a client connects to a service that may not be listening yet: it tries again while the
/// connect fails with ``IPCError/Code/endpointNotFound``, waiting longer each time, until a
/// deadline. The pattern LLBSDMessaging's and CFMessagePort's documentation give for a client
/// that can start before its server registers.
///
/// The waits grow exponentially: after failed attempt *n* the ceiling is ``initialDelay`` ×
/// 2^(n−1), capped at ``maximumDelay``, and the wait is drawn at random between (1 − ``jitter``)
/// × ceiling and the ceiling ("equal jitter"), so that many clients failing together do not
/// retry in step. With the defaults (10 ms, 1 s, 0.5) a client makes at most about 2 attempts a
/// second once it has failed 8 times in a row.
///
///     let connection = try await transport.connect(to: endpoint, options: .defaults,
///                                                  retrying: ConnectRetry(for: .seconds(10)))
public struct ConnectRetry: Sendable, Hashable {
    /// How long to keep trying, from the first attempt.
    public var limit: Duration
    /// The ceiling of the wait after the first failed attempt; it doubles after each one.
    public var initialDelay: Duration
    /// The largest ceiling of a wait between two attempts.
    public var maximumDelay: Duration
    /// The share of each wait taken off at random, 0 (none: every wait is its ceiling) to 1.
    public var jitter: Double

    public init(for limit: Duration, initialDelay: Duration = .milliseconds(10), maximumDelay: Duration = .seconds(1), jitter: Double = 0.5) {
        self.limit = limit
        self.initialDelay = max(initialDelay, .zero)
        self.maximumDelay = max(maximumDelay, self.initialDelay)
        self.jitter = jitter.isNaN ? 0.5 : min(max(jitter, 0), 1)
    }

    /// The ceiling of the wait after failed attempt `attempt` (1 for the first): ``initialDelay``
    /// doubled for each attempt before it, at most ``maximumDelay``.
    public func delay(afterAttempt attempt: Int) -> Duration {
        var delay = initialDelay
        for _ in 1..<max(1, attempt) {
            guard delay < maximumDelay else { break }
            delay = min(delay * 2, maximumDelay)
        }
        return delay
    }

    /// The wait after failed attempt `attempt`: ``delay(afterAttempt:)`` less a random share of
    /// at most ``jitter`` of it.
    public func wait<Generator: RandomNumberGenerator>(afterAttempt attempt: Int, using generator: inout Generator) -> Duration {
        let ceiling = delay(afterAttempt: attempt)
        guard jitter > 0 else { return ceiling }
        return ceiling * (1 - jitter * Double.random(in: 0..<1, using: &generator))
    }

    /// ``wait(afterAttempt:using:)`` with the system's generator.
    public func wait(afterAttempt attempt: Int) -> Duration {
        var generator = SystemRandomNumberGenerator()
        return wait(afterAttempt: attempt, using: &generator)
    }

    /// Calls `attempt` until it returns, and returns what it returned.
    ///
    /// Waits between attempts with `Task.sleep`: no thread is held while waiting, and cancelling
    /// the task ends the wait at once. The last wait is cut short so that the last attempt starts
    /// before the deadline.
    /// - Throws: what `attempt` throws, at once, unless it is an `endpointNotFound`; the last
    ///   `endpointNotFound` once the deadline has passed; `CancellationError` if the task is
    ///   cancelled while waiting.
    public func run<Result>(_ attempt: () async throws -> Result) async throws -> Result {
        let clock = ContinuousClock()
        let deadline = clock.now + limit
        var attempts = 0
        while true {
            do {
                return try await attempt()
            } catch let error as IPCError where error.code == .endpointNotFound {
                attempts += 1
                let remaining = clock.now.duration(to: deadline)
                guard remaining > .zero else { throw error }
                try await Task.sleep(for: min(wait(afterAttempt: attempts), remaining))
            }
        }
    }
}

extension MessageTransport {
    /// Connects to `endpoint`, trying again while nobody listens there, as `retrying` says. Each
    /// attempt is the `async` connect, which holds none of Swift's cooperative threads while the
    /// listener answers.
    /// - Throws: what ``connect(to:options:)`` throws (an `endpointNotFound` only once the
    ///   retry's limit has passed); `CancellationError` if the task is cancelled while waiting.
    public func connect(to endpoint: Endpoint, options: ConnectionOptions, retrying: ConnectRetry) async throws -> Connection {
        try await retrying.run { try await connect(to: endpoint, options: options) }
    }
}

/// Runs a synchronous call that may block (a transport's connect, a system call that waits, a
/// child process's exit) on a thread of its own, and waits for it without holding one of Swift's
/// cooperative threads, which are few (one per core). The package's one way to call blocking
/// code from `async` code: `Scripts/check-blocking-calls.sh` knows it.
@discardableResult
public func runBlocking<Result: Sendable>(_ body: @escaping @Sendable () throws -> Result) async throws -> Result {
    try await withCheckedThrowingContinuation { continuation in
        Thread.detachNewThread { continuation.resume(with: Swift.Result { try body() }) }
    }
}
