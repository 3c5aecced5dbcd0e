import IPCCore
@testable import IPCEngine
import Testing

/// The engine's lookup tables on their own: the event loop's registrations by token, and a
/// connection's requests by correlation with their deadlines.
@Suite("Engine: token table and request table", .timeLimit(.minutes(2)))
struct RequestTableTests {
    @Test("a token finds its value until it is removed, and never the value that reuses its slot")
    func tokens() {
        var table = TokenTable<String>()
        let first = table.insert("a")
        let second = table.insert("b")
        #expect(first != second)
        #expect(table[first] == "a")
        #expect(table[second] == "b")
        #expect(table.count == 2)
        #expect(table.remove(first) == "a")
        #expect(table[first] == nil)
        #expect(table.remove(first) == nil)
        // The freed slot is reused under a new token; the old one still finds nothing.
        let third = table.insert("c")
        #expect(third != first)
        #expect(third & 0xFFFF_FFFF == first & 0xFFFF_FFFF)
        #expect(table[first] == nil)
        #expect(table[third] == "c")
        table[first] = "stale"
        #expect(table[third] == "c")
        table[third] = "d"
        #expect(table[third] == "d")
        table[third] = nil
        #expect(table[third] == nil)
        #expect(table.count == 1)
        #expect(table.values == ["b"])
        // Tokens the poller keeps for itself, and ones never given, find nothing.
        for foreign: UInt64 in [0, .max, 1 << 32 | 99, second ^ (1 << 32)] {
            #expect(table[foreign] == nil)
        }
        // Reusing one slot many times never gives 0, `UInt64.max` or an earlier token.
        var seen: Set<UInt64> = [first, second, third]
        for _ in 0..<10_000 {
            let token = table.insert("x")
            #expect(token != 0 && token != .max)
            #expect(seen.insert(token).inserted)
            table.remove(token)
        }
    }

    @Test("requests with different receive timeouts: each expires at its own deadline, the others still get their replies")
    func deadlinesApart() async throws {
        let loop = try EventLoop(name: "table-test")
        let table = RequestTable(loop: loop)
        let short = try table.register()
        let long = try table.register()
        let middle = try table.register()
        async let shortOutcome = Result(awaiting: { try await table.reply(to: short, timeout: .milliseconds(50)) })
        async let longOutcome = Result(awaiting: { try await table.reply(to: long, timeout: .seconds(600)) })
        async let middleOutcome = Result(awaiting: { try await table.reply(to: middle, timeout: .milliseconds(150)) })
        for outcome in [await shortOutcome, await middleOutcome] {
            #expect(throws: IPCError.self) { try outcome.get() }
            if case .failure(let error as IPCError) = outcome { #expect(error.code == .receiveTimeout) }
        }
        // The long request still waits; a reply for an expired one is refused.
        #expect(table.pendingCount == 1)
        #expect(!table.complete(short, with: .success([9])))
        #expect(table.complete(long, with: .success([1, 2])))
        #expect(try await longOutcome.get() == [1, 2])
        #expect(table.pendingCount == 0)
    }

    @Test("a reply that comes before the request waits is kept for it; closing fails what waits and what comes later")
    func earlyReplyAndClose() async throws {
        let loop = try EventLoop(name: "table-test")
        let table = RequestTable(loop: loop)
        let early = try table.register()
        #expect(table.complete(early, with: .success([7])))
        #expect(!table.complete(early, with: .success([8])))
        #expect(try await table.reply(to: early, timeout: .seconds(600)) == [7])
        let waiting = try table.register()
        let unwaited = try table.register()
        async let waitingOutcome = Result(awaiting: { try await table.reply(to: waiting, timeout: .seconds(600)) })
        try await Task.sleep(for: .milliseconds(50))
        table.close(with: IPCError(code: .invalidated, message: "closed"))
        let outcome = await waitingOutcome
        if case .failure(let error as IPCError) = outcome { #expect(error.code == .invalidated) } else { Issue.record("\(outcome)") }
        // A request registered before the close and waited for after it gets the close's error.
        await #expect(throws: IPCError.self) { try await table.reply(to: unwaited, timeout: .seconds(600)) }
        #expect(throws: IPCError.self) { try table.register() }
        #expect(table.pendingCount == 0)
        #expect(table.keptOutcomeCount == 0)
    }

    @Test("a cancelled request ends with CancellationError, cancelled before or while it waits; a request that ends keeps nothing behind")
    func cancellationAndCleanUp() async throws {
        let loop = try EventLoop(name: "table-test")
        let table = RequestTable(loop: loop)
        // Cancelled while it waits: the cancellation handler resumes it.
        let waiting = try table.register()
        let waiter = Task { try await table.reply(to: waiting, timeout: .seconds(600)) }
        // Generous (60 s; the suite's limit is 2 minutes): the waiter must have stored its
        // continuation, so that this is the handler's path.
        for _ in 0..<6_000 where !table.isWaiting(waiting) { try await Task.sleep(for: .milliseconds(10)) }
        #expect(table.isWaiting(waiting))
        waiter.cancel()
        await #expect(throws: CancellationError.self) { try await waiter.value }
        #expect(table.pendingCount == 0)
        #expect(!table.complete(waiting, with: .success([1])))
        // Cancelled before it waits: it ends at once, without a reply.
        let early = try table.register()
        let cancelled = Task {
            withUnsafeCurrentTask { $0?.cancel() }
            return try await table.reply(to: early, timeout: .seconds(600))
        }
        await #expect(throws: CancellationError.self) { try await cancelled.value }
        #expect(table.pendingCount == 0)
        // An outcome kept for a request whose task never waits (its send failed) goes with it.
        let unsent = try table.register()
        #expect(table.complete(unsent, with: .success([2])))
        #expect(table.keptOutcomeCount == 1)
        table.cancel(unsent)
        #expect(table.pendingCount == 0 && table.keptOutcomeCount == 0)
        #expect(!table.complete(unsent, with: .success([3])))
        // A spinning request takes an outcome kept for it without suspending.
        let spun = try table.register()
        #expect(table.takeFinished(spun) == nil)
        #expect(table.complete(spun, with: .failure(IPCError(code: .transportFailure, message: "x"))))
        if case .failure(let error)? = table.takeFinished(spun) { #expect(error.code == .transportFailure) } else { Issue.record("no outcome kept") }
        #expect(table.pendingCount == 0 && table.keptOutcomeCount == 0)
        // Many requests through one slot: nothing accumulates.
        for index in 0..<1_000 {
            let correlation = try table.register()
            if index.isMultiple(of: 2) { #expect(table.complete(correlation, with: .success([UInt8(index & 0xFF)]))) }
            else { Task { _ = table.complete(correlation, with: .success([1])) } }
            _ = try await table.reply(to: correlation, timeout: .seconds(600))
        }
        #expect(table.pendingCount == 0 && table.keptOutcomeCount == 0)
    }
}

extension Result where Failure == any Error {
    fileprivate init(awaiting body: () async throws -> Success) async {
        do { self = .success(try await body()) } catch { self = .failure(error) }
    }
}
