public import Testing

/// Runs the test cases that create POSIX message queues one at a time, whatever suite or target
/// they are in.
///
/// A user's queues share one small memory quota (`RLIMIT_MSGQUEUE`, 800 KiB by default: about
/// nine queues of the size the message-port transport and the mqueue floor use), and Swift
/// Testing runs suites in parallel. Tests that create queues at the same time would then fail
/// on the quota rather than on what they test.
public struct MessageQueueQuota: SuiteTrait, TestTrait, TestScoping {
    public var isRecursive: Bool { true }

    public func scopeProvider(for test: Test, testCase: Test.Case?) -> MessageQueueQuota? {
        // Once per test case, never around a whole suite (which would hold the turn for good).
        testCase == nil ? nil : self
    }

    public func provideScope(for test: Test, testCase: Test.Case?, performing function: @Sendable () async throws -> Void) async throws {
        await Turn.shared.acquire()
        do {
            try await function()
        } catch {
            await Turn.shared.release()
            throw error
        }
        await Turn.shared.release()
    }

    /// One turn at a time, first come first served.
    private actor Turn {
        static let shared = Turn()
        private var taken = false
        private var waiting: [CheckedContinuation<Void, Never>] = []

        func acquire() async {
            guard taken else {
                taken = true
                return
            }
            await withCheckedContinuation { waiting.append($0) }
        }

        func release() {
            if waiting.isEmpty {
                taken = false
            } else {
                waiting.removeFirst().resume()
            }
        }
    }
}

extension Trait where Self == MessageQueueQuota {
    /// The test creates POSIX message queues: run its cases one at a time with all others that do.
    public static var usesMessageQueues: Self { MessageQueueQuota() }
}
