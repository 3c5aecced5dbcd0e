import Foundation
import IPCCore
import Synchronization

/// How a server serves: XPC's rule that a slow or stuck handler holds up its own connection
/// only, per-connection order and concurrency, cancellation when a connection ends, and clients
/// that never read. The peer serves with ``ConnectionOptions/requestHandler`` (tasks off the
/// loop), as an application is told to.
///
/// The cases never require a duration to be short: a check that another connection was not
/// held up compares it with the slow handler's own (seconds against milliseconds), and the
/// added latency is recorded for the report, not graded.
enum ServingCases {
    static let all: [ConformanceCase] = [slowHandler, stuckHandler, serialOrder, boundedConcurrency, cancelledOnEnd, clientsThatNeverRead]

    /// A delayed echo's payload: the delay, then a tag.
    static func delayed(_ milliseconds: UInt32, _ tag: String) -> [UInt8] {
        withUnsafeBytes(of: milliseconds.bigEndian, Array.init) + Array(tag.utf8)
    }

    /// The p50 of `count` echo round trips on `connection`, in milliseconds, and the slowest.
    static func echoes(_ count: Int, on connection: ConnectionProbe, _ context: CaseContext, _ what: String) async throws -> (median: Double, slowest: Double) {
        var times: [Double] = []
        for index in 0..<count {
            let start = ContinuousClock.now
            try await context.checkEcho(connection, "\(what), echo \(index)", payload: Array("echo \(index)".utf8))
            times.append((ContinuousClock.now - start).milliseconds)
        }
        times.sort()
        return (times[times.count / 2], times.last!)
    }

    static let slowHandler = ConformanceCase(
        "11.1", "A request whose handler takes 2 s on one connection holds up no other connection of the same listener", requires: .requestReply
    ) { context in
        let endpoint = try context.endpoint("slow")
        _ = try await context.launchPeer(.server, at: endpoint)
        let slow = try await context.connect(endpoint)
        let other = try await context.connect(endpoint)
        let before = try await echoes(20, on: other, context, "before the slow request")
        let slowRequest = Task {
            try await slow.connection.request(delayed(2000, "slow"), msgid: ConformancePeer.Request.delayedEcho, sendTimeout: .seconds(10), receiveTimeout: .seconds(60))
        }
        try await Task.sleep(for: .milliseconds(100))
        let during = try await echoes(20, on: other, context, "while the other connection's handler runs")
        let slowDone = await result(of: slowRequest, within: .milliseconds(1))
        try check(slowDone == nil, "the other connection's 20 echoes came back only after the slow request's reply: they waited for its handler")
        try check(during.slowest < 1000, "an echo on the other connection took \(during.slowest) ms while a 2 s handler ran on the first one")
        guard case .some(.success(let reply)) = await result(of: slowRequest, within: .seconds(30)) else {
            throw ConformanceFailure("the slow request did not complete within 30 s")
        }
        try check(reply == delayed(2000, "slow"), "the slow request's reply came back different")
        let added = max(0, during.median - before.median)
        context.record("addedMillisecondsP50", added)
        context.record("slowestEchoMilliseconds", during.slowest)
        return .passed(
            "20 echoes on the other connection during the 2 s handler: p50 \(format(during.median)) ms against \(format(before.median)) ms before (+\(format(added)) ms), slowest \(format(during.slowest)) ms"
        )
    }

    static let stuckHandler = ConformanceCase(
        "11.2", "A handler that never returns leaves its connection's one-way messages, the other connections and new clients served", requires: .requestReply
    ) { context in
        let endpoint = try context.endpoint("stuck")
        _ = try await context.launchPeer(.server, at: endpoint)
        let stuck = try await context.connect(endpoint)
        let other = try await context.connect(endpoint)
        let stalled = Task {
            try await stuck.connection.request([1], msgid: ConformancePeer.Request.stall, sendTimeout: .seconds(10), receiveTimeout: .seconds(120))
        }
        defer { stalled.cancel() }
        try await Task.sleep(for: .milliseconds(200))
        try await context.checkEcho(other, "a connected client, while another connection's handler never returns")
        let newcomer = try await context.connect(endpoint)
        try await context.checkEcho(newcomer, "a new client, while another connection's handler never returns")
        // The stuck connection itself is still read: its one-way messages are echoed.
        try await stuck.connection.send(Array("still read".utf8), msgid: 42, timeout: .seconds(10))
        let echoed = try await stuck.messages(1, within: .seconds(30), "the one-way echo on the stuck connection")
        try check(echoed[0].payload == Array("still read".utf8), "the one-way echo on the stuck connection came back different")
        try check(await result(of: stalled, within: .milliseconds(1)) == nil, "the request that never returns was answered")
        return .passed("with one handler stuck: a connected client and a new one were answered, and the stuck connection's one-way messages were still read")
    }

    static let serialOrder = ConformanceCase(
        "11.3", "By default, one connection's requests are handled one at a time, in arrival order", requires: .requestReply
    ) { context in
        let (_, connection) = try await context.connectToServerPeer("serial")
        // Timed from before the first request is sent: handled one at a time, the echo sent
        // behind it cannot be answered before the first's 400 ms sleep ends (a sleep never
        // ends early); handled at once, it comes back about 100 ms in.
        let firstSent = ContinuousClock.now
        let first = Task {
            try await connection.connection.request(delayed(400, "first"), msgid: ConformancePeer.Request.delayedEcho, sendTimeout: .seconds(10), receiveTimeout: .seconds(60))
        }
        try await Task.sleep(for: .milliseconds(100))
        try await context.checkEcho(connection, "the request behind a 400 ms one")
        let echoed = ContinuousClock.now - firstSent
        let firstReply = try await first.value
        try check(firstReply == delayed(400, "first"), "the first request's reply came back different")
        try check(
            echoed >= .milliseconds(400),
            "the echo sent 100 ms after a 400 ms request came back \(echoed.formattedMilliseconds) after that request was sent: it did not wait for it (serial handling)"
        )
        return .passed("the echo sent 100 ms after a 400 ms request came back after it, \(echoed.formattedMilliseconds) after the first was sent")
    }

    static let boundedConcurrency = ConformanceCase(
        "11.4", "With a concurrency bound of N, up to N requests of one connection are handled at once, and the next waits", requires: .requestReply
    ) { context in
        let endpoint = try context.endpoint("bounded")
        let bound = 4
        _ = try await context.launchPeer(.server, at: endpoint) { $0.maximumConcurrentRequests = bound }
        let connection = try await context.connect(endpoint)
        let delay = Duration.seconds(1)
        let start = ContinuousClock.now
        let elapsed = try await withThrowingTaskGroup(of: Duration.self) { group in
            for index in 0...bound {
                group.addTask {
                    _ = try await connection.connection.request(
                        delayed(1000, "r\(index)"), msgid: ConformancePeer.Request.delayedEcho, sendTimeout: .seconds(10), receiveTimeout: .seconds(60)
                    )
                    return ContinuousClock.now - start
                }
            }
            return try await group.reduce(into: [Duration]()) { $0.append($1) }.sorted()
        }
        // A sleep never ends early: handled one at a time, the fifth 1 s request could not end
        // before 5 s; within the bound, the first four overlap and the fifth waits for a slot.
        try check(elapsed[bound - 1] < delay * (bound - 1), "\(bound) requests of 1 s took \(elapsed[bound - 1].formattedMilliseconds) with a bound of \(bound): they did not overlap")
        try check(elapsed[bound] >= delay * 2, "the request beyond the bound of \(bound) ended after \(elapsed[bound].formattedMilliseconds), before a slot could have freed")
        return .passed("\(bound) requests of 1 s ended by \(elapsed[bound - 1].formattedMilliseconds); the one beyond the bound at \(elapsed[bound].formattedMilliseconds)")
    }

    /// The peer's count of cancelled handlers (``ConformancePeer/Request/cancelledHandlers``).
    static func cancelledHandlers(_ connection: ConnectionProbe) async throws -> UInt64 {
        let reply = try await connection.connection.request([], msgid: ConformancePeer.Request.cancelledHandlers, sendTimeout: .seconds(10), receiveTimeout: .seconds(30))
        try check(reply.count == 8, "the cancelled-handler count came back as \(reply.count) bytes")
        return reply.reduce(0) { $0 << 8 | UInt64($1) }
    }

    static let cancelledOnEnd = ConformanceCase(
        "11.5", "A connection that ends cancels the tasks of its running request handlers", requires: .requestReply
    ) { context in
        let endpoint = try context.endpoint("cancel")
        _ = try await context.launchPeer(.server, at: endpoint)
        let observer = try await context.connect(endpoint)
        let before = try await cancelledHandlers(observer)
        let ending = try await context.connect(endpoint)
        let stalled = Task {
            try await ending.connection.request([1], msgid: ConformancePeer.Request.stall, sendTimeout: .seconds(10), receiveTimeout: .seconds(120))
        }
        try await Task.sleep(for: .milliseconds(200))
        ending.connection.invalidate()
        _ = await result(of: stalled, within: context.deadline)
        let start = ContinuousClock.now
        var count = before
        while count == before, ContinuousClock.now - start < context.deadline {
            try await Task.sleep(for: .milliseconds(20))
            count = try await cancelledHandlers(observer)
        }
        try check(count == before + 1, "the peer counted \(count - before) cancelled handlers \(context.deadline) after the connection with a running handler ended (expected 1)")
        return .passed("the running handler's task was cancelled within \((ContinuousClock.now - start).formattedMilliseconds) of the connection's end")
    }

    static let clientsThatNeverRead = ConformanceCase(
        "11.6", "Clients that never read cost the other clients nothing but their turn, and the server no thread each", requires: .requestReply
    ) { context in
        // The server under test is this process's listener: an async echo handler, and a task
        // per stopped client that floods it with one-way messages, suspending when it is full.
        let endpoint = try context.endpoint("noread")
        let listener = try context.listen(endpoint)
        let chunk = TestPayload.make(size: min(16 * 1024, context.capabilities.maximumPayloadLength))
        let stoppedCount = max(6, ProcessInfo.processInfo.activeProcessorCount + 1)
        var stopped: [ConnectionProbe] = []
        for index in 0..<stoppedCount {
            let peer = try await context.launchPeer(.client, at: endpoint)
            stopped.append(try await listener.nextConnection(within: .seconds(30), "stopped client \(index)"))
            peer.process.suspend()
        }
        // Threads that started the peers and the connections end by themselves: let them go,
        // so that the count before is this process's settled one.
        try await Task.sleep(for: .milliseconds(300))
        let threadsBefore = threadCount()
        let floods = stopped.map { connection in
            Task {
                // Until the peer's buffer is full and the send times out, or the case ends.
                while !Task.isCancelled {
                    do {
                        try await connection.connection.send(chunk, msgid: 7, timeout: .seconds(60))
                    } catch {
                        return
                    }
                }
            }
        }
        context.onTearDown { floods.forEach { $0.cancel() } }
        // Long enough for every flood to fill its peer and wait.
        try await Task.sleep(for: .milliseconds(500))
        let reader = try await context.connect(endpoint)
        let served = Task { try await echoes(20, on: reader, context, "a reading client while \(stoppedCount) others read nothing") }
        guard case .some(.success(let timing)) = await result(of: served, within: .seconds(30)) else {
            throw ConformanceFailure("a reading client's 20 echoes did not all come back within 30 s while \(stoppedCount) clients that never read were being sent to")
        }
        let threadsDuring = threadCount()
        try check(timing.slowest < 1000, "an echo took \(timing.slowest) ms while \(stoppedCount) clients that never read were being sent to")
        context.record("echoMillisecondsP50", timing.median)
        var threads = "thread count not readable here"
        if let threadsBefore, let threadsDuring {
            // A send that waits by holding a thread holds one per stopped client; a few threads
            // of the process's own may come and go meanwhile.
            try check(
                threadsDuring - threadsBefore < stoppedCount / 2,
                "sending to \(stoppedCount) clients that never read took this process from \(threadsBefore) to \(threadsDuring) threads: a waiting send holds a thread"
            )
            context.record("threadsAdded", Double(threadsDuring - threadsBefore))
            threads = "threads \(threadsBefore) before the sends waited, \(threadsDuring) while they did"
        }
        return .passed(
            "\(stoppedCount) stopped clients with full buffers: a reading client's 20 echoes p50 \(format(timing.median)) ms, slowest \(format(timing.slowest)) ms; \(threads)"
        )
    }

    /// The threads of this process, where the system lists them (`/proc/self/task`).
    private static func threadCount() -> Int? {
        (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/task"))?.count
    }

    private static func format(_ milliseconds: Double) -> String {
        String(format: "%.2f", milliseconds)
    }
}
