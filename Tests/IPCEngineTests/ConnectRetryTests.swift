import IPCCore
import Synchronization
import Testing

@Suite("ConnectRetry: retrying a connect while nobody listens")
struct ConnectRetryTests {
    static let notFound = IPCError(code: .endpointNotFound, message: "nobody listens")

    @Test("endpointNotFound is retried until the attempt succeeds")
    func retriesUntilSuccess() async throws {
        let attempts = Mutex(0)
        let result = try await ConnectRetry(for: .seconds(30), initialDelay: .milliseconds(1)).run {
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

    @Test("once the limit has passed, the last endpointNotFound is thrown; the waits grow and are capped")
    func givesUpAtTheLimit() async throws {
        let times = Mutex<[ContinuousClock.Instant]>([])
        let start = ContinuousClock.now
        let error = await #expect(throws: IPCError.self) {
            try await ConnectRetry(for: .milliseconds(400), initialDelay: .milliseconds(10), maximumDelay: .milliseconds(80)).run { () -> Int in
                times.withLock { $0.append(.now) }
                throw Self.notFound
            }
        }
        #expect(error?.code == .endpointNotFound)
        #expect(ContinuousClock.now - start >= .milliseconds(400))
        let gaps = times.withLock { zip($0.dropFirst(), $0).map { $0 - $1 } }
        // 10, 20, 40, 80, 80, ... ms (sleeps last at least that long): never shorter than planned.
        let planned: [Duration] = [.milliseconds(10), .milliseconds(20), .milliseconds(40), .milliseconds(80), .milliseconds(80)]
        for (gap, least) in zip(gaps, planned) { #expect(gap >= least) }
        #expect(gaps.count >= 4)
    }

    @Test("cancelling the task ends the wait with CancellationError")
    func cancellationEndsTheWait() async throws {
        let task = Task {
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
