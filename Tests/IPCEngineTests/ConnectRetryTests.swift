import IPCCore
import IPCTestSupport
import Synchronization
import Testing

@Suite("ConnectRetry: retrying a connect while nobody listens", .elasticThreads)
struct ConnectRetryTests {
    static let notFound = IPCError(code: .endpointNotFound, message: "nobody listens")

    @Test("endpointNotFound is retried until the attempt succeeds")
    func retriesUntilSuccess() async throws {
        let attempts = Mutex(0)
        // A limit no run reaches: on a loaded machine the cooperative pool may resume the waits
        // late, and this test is about retrying, not the limit (tested below).
        let result = try await ConnectRetry(for: .seconds(3600), initialDelay: .milliseconds(1)).run {
            let attempt = attempts.withLock { $0 += 1; return $0 }
            if attempt < 4 { throw Self.notFound }
            return attempt
        }
        #expect(result == 4)
    }

    @Test("any other error ends it at once")
    func otherErrorsAreNotRetried() async throws {
        let attempts = Mutex(0)
        let error = await #expect(throws: IPCError.self) {
            try await ConnectRetry(for: .seconds(30)).run { () -> Int in
                attempts.withLock { $0 += 1 }
                throw IPCError(code: .accessDenied, message: "refused")
            }
        }
        #expect(error?.code == .accessDenied)
        #expect(attempts.withLock { $0 } == 1)
    }

    @Test("once the limit has passed, the last endpointNotFound is thrown (never before the limit)")
    func givesUpAtTheLimit() async throws {
        let attempts = Mutex(0)
        let start = ContinuousClock.now
        let error = await #expect(throws: IPCError.self) {
            try await ConnectRetry(for: .milliseconds(300), initialDelay: .milliseconds(10), maximumDelay: .milliseconds(80)).run { () -> Int in
                attempts.withLock { $0 += 1 }
                throw Self.notFound
            }
        }
        #expect(error?.code == .endpointNotFound)
        #expect(ContinuousClock.now - start >= .milliseconds(300))
        #expect(attempts.withLock { $0 } >= 2)
    }

    @Test("the waits double from the initial delay and are capped")
    func waitsGrowAndAreCapped() {
        let retry = ConnectRetry(for: .seconds(10), initialDelay: .milliseconds(10), maximumDelay: .milliseconds(80))
        #expect((1...7).map(retry.delay(afterAttempt:)) == [10, 20, 40, 80, 80, 80, 80].map { Duration.milliseconds($0) })
        // A maximum below the initial delay is raised to it.
        #expect(ConnectRetry(for: .seconds(1), initialDelay: .seconds(1), maximumDelay: .milliseconds(1)).delay(afterAttempt: 5) == .seconds(1))
    }

    @Test("each wait is drawn between (1 - jitter) and all of its ceiling, and the draws differ")
    func waitsAreJittered() {
        let retry = ConnectRetry(for: .seconds(10), initialDelay: .milliseconds(100), maximumDelay: .seconds(1), jitter: 0.5)
        let waits = (0..<200).map { _ in retry.wait(afterAttempt: 3) }
        #expect(waits.allSatisfy { $0 >= .milliseconds(200) && $0 <= .milliseconds(400) })
        #expect(Set(waits).count > 100)
        let exact = ConnectRetry(for: .seconds(10), initialDelay: .milliseconds(100), jitter: 0)
        #expect(exact.wait(afterAttempt: 2) == .milliseconds(200))
    }

    @Test("cancelling the task ends the wait with CancellationError")
    func cancellationEndsTheWait() async throws {
        let task = Task(executorPreference: ElasticExecutor.elastic) {
            try await ConnectRetry(for: .seconds(600), initialDelay: .seconds(300)).run { () -> Int in throw Self.notFound }
        }
        try await Task.sleep(for: .milliseconds(50))
        task.cancel()
        let outcome = await task.result
        guard case .failure(let error) = outcome else {
            Issue.record("expected a failure, got \(outcome)")
            return
        }
        #expect(error is CancellationError)
    }
}
