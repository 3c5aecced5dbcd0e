import Foundation
import Glibc
import IPCCore
import IPCEngine
import IPCTestSupport
import Synchronization
import Testing

/// The engine itself, in process: an ``EngineConnection`` over a ``PairChannel``, with the test
/// playing the peer on the socketpair's other end.
@Suite("Engine: request/reply, timeouts, cancellation, invalidation, backpressure", .elasticThreads)
struct EngineConnectionTests {
    private func connect(_ options: ConnectionOptions = .defaults, sendBuffer: Int? = nil) throws -> (EngineConnection, PairPeer) {
        let (channel, peer) = try PairPeer.make(sendBuffer: sendBuffer)
        return (try EngineConnection(channel: channel, peer: nil, options: options), peer)
    }

    /// A peer that answers every request with its payload reversed, in an order of its own:
    /// it collects `count` requests first, then replies to them last to first.
    private func answerReversed(_ peer: PairPeer, count: Int) {
        onThread {
            var requests: [Frame] = []
            while requests.count < count, let frame = peer.readFrame() {
                if frame.kind == .request { requests.append(frame) }
            }
            for request in requests.reversed() {
                peer.send(Frame(kind: .reply, msgid: request.msgid, correlation: request.correlation, payload: request.payload.reversed()))
            }
        }
    }

    @Test("concurrent requests each get their own reply, whatever order the replies come in")
    func correlation() async throws {
        let (connection, peer) = try connect()
        defer { connection.invalidate(); peer.close() }
        let count = 200
        answerReversed(peer, count: count)
        let replies = try await withThrowingTaskGroup(of: (Int, [UInt8]).self) { group in
            for index in 0..<count {
                group.addTask {
                    let payload = Array("request \(index)".utf8)
                    return (index, try await connection.request(payload, msgid: UInt32(index), sendTimeout: .seconds(10), receiveTimeout: .seconds(30)))
                }
            }
            return try await group.reduce(into: [Int: [UInt8]]()) { $0[$1.0] = $1.1 }
        }
        #expect(replies.count == count)
        for (index, reply) in replies {
            #expect(reply == Array("request \(index)".utf8).reversed())
        }
    }

    @Test("a receive timeout is its own error, leaves the connection valid, and a late reply is discarded")
    func receiveTimeout() async throws {
        let (connection, peer) = try connect()
        defer { connection.invalidate(); peer.close() }
        await #expect(throws: IPCError.self) {
            do {
                _ = try await connection.request([1], msgid: 1, sendTimeout: .seconds(5), receiveTimeout: .milliseconds(50))
            } catch let error as IPCError {
                #expect(error.code == .receiveTimeout)
                throw error
            }
        }
        let late = try #require(await blocking { peer.readFrame() })
        peer.send(Frame(kind: .reply, msgid: late.msgid, correlation: late.correlation, payload: [9]))
        // The next request gets its own reply, not the late one.
        onThread {
            guard let next = peer.readFrame() else { return }
            peer.send(Frame(kind: .reply, msgid: next.msgid, correlation: next.correlation, payload: [2]))
        }
        let reply = try await connection.request([2], msgid: 2, sendTimeout: .seconds(5), receiveTimeout: .seconds(10))
        #expect(reply == [2])
        #expect(connection.invalidationReason == nil)
    }

    @Test("cancelling the task of a pending request fails it promptly with CancellationError; the connection stays valid")
    func cancellation() async throws {
        let (connection, peer) = try connect()
        defer { connection.invalidate(); peer.close() }
        // The request's task runs on the loop, so the time it takes to see its cancellation does
        // not depend on how busy Swift's pool is with the other tests running beside this one.
        let failedAt = Mutex<UInt64>(0)
        let task = Task(executorPreference: connection.eventLoop) {
            do {
                return try await connection.request([1], msgid: 1, sendTimeout: .seconds(5), receiveTimeout: .seconds(600))
            } catch {
                failedAt.withLock { $0 = monotonicNanoseconds() }
                throw error
            }
        }
        // The peer's thread reads the request and cancels at once: neither step waits for a
        // thread of Swift's pool, which other tests may hold for a long time on a busy machine.
        let readAndCancelled = Mutex<(Frame?, UInt64)?>(nil)
        onThread {
            let frame = peer.readFrame()
            readAndCancelled.withLock { $0 = (frame, monotonicNanoseconds()) }
            task.cancel()
        }
        let outcome = await task.result
        let (frame, cancelled) = try #require(readAndCancelled.withLock { $0 }, "the request failed before the peer read it")
        let request = try #require(frame)
        #expect(throws: CancellationError.self) { try outcome.get() }
        // A request that failed on its own before the cancel (its timeout, on a starved
        // machine) is a failure of this test, not an overflow that ends the test process.
        let failed = failedAt.withLock { $0 }
        try #require(failed >= cancelled, "the request failed \(Double(cancelled - failed) / 1e6) ms before it was cancelled")
        let elapsed = Double(failed - cancelled) / 1e6
        // What this checks is that the cancel ends the request rather than the receive timeout
        // (600 s), so the bound is far from both: debug builds here take 1–65 ms with the suite's
        // other tests running beside this one, took 666 ms once with the whole test run starved
        // on this two-CPU VM, and 2,077 ms once in a fresh-clone CI run (the bound was 2 s then).
        // How fast it is belongs to the benchmarks, not to this test.
        #expect(elapsed < 30_000, "cancellation took \(elapsed) ms")
        print("engine: a cancelled request failed \(String(format: "%.3f", elapsed)) ms after cancel()")
        // The late reply is discarded; the connection serves the next request.
        peer.send(Frame(kind: .reply, msgid: 1, correlation: request.correlation, payload: [7]))
        onThread {
            guard let next = peer.readFrame() else { return }
            peer.send(Frame(kind: .reply, msgid: next.msgid, correlation: next.correlation, payload: [8]))
        }
        #expect(try await connection.request([2], msgid: 2, sendTimeout: .seconds(5), receiveTimeout: .seconds(10)) == [8])
        #expect(connection.invalidationReason == nil)
    }

    @Test("a request whose frame cannot be sent yet suspends; cancelling one not yet begun takes it out; the connection stays valid")
    func cancelBlockedSend() async throws {
        let (connection, peer) = try connect(sendBuffer: 4096)
        defer { connection.invalidate(); peer.close() }
        // The peer does not read yet: the first frame is written in part, the second waits
        // behind it without a thread.
        let big = [UInt8](repeating: 1, count: 512 * 1024)
        let first = Task(executorPreference: ElasticExecutor.elastic) { try await connection.request(big, msgid: 1, sendTimeout: .seconds(60), receiveTimeout: .seconds(60)) }
        try await Task.sleep(for: .milliseconds(100))
        let second = Task(executorPreference: ElasticExecutor.elastic) { try await connection.request([2], msgid: 2, sendTimeout: .seconds(60), receiveTimeout: .seconds(60)) }
        try await Task.sleep(for: .milliseconds(100))
        second.cancel()
        let outcome = await second.result
        #expect(throws: CancellationError.self) { try outcome.get() }
        // Now the peer reads: the first frame arrives whole, and its reply completes it.
        let request = try #require(await blocking { peer.readFrame() })
        #expect(request.payload == big)
        peer.send(Frame(kind: .reply, msgid: 1, correlation: request.correlation, payload: [1]))
        #expect(try await first.value == [1])
        #expect(connection.invalidationReason == nil)
    }

    @Test("a queued send with a shorter timeout than the frame ahead of it fails with sendTimeout at its own deadline; the frame ahead is still written")
    func queuedDeadlinesInAnyOrder() async throws {
        let (connection, peer) = try connect(sendBuffer: 4096)
        defer { connection.invalidate(); peer.close() }
        // A send on the loop's thread writes what the kernel takes and queues the rest: the
        // frame is begun, with a long timeout, before anything else is sent.
        let big = [UInt8](repeating: 1, count: 512 * 1024)
        try await withTaskExecutorPreference(connection.eventLoop) {
            #expect(connection.eventLoop.inEventLoop)
            try connection.send(big, msgid: 1, timeout: .seconds(120))
        }
        // A request queued behind it has a short timeout: the queue's one timer must fire for it
        // first. (Were its deadline ignored until the first frame's, both would expire together
        // after 120 s, the first torn, ending the connection.)
        let start = ContinuousClock.now
        let outcome = await Task(executorPreference: ElasticExecutor.elastic) { try await connection.request([2], msgid: 2, sendTimeout: .milliseconds(200), receiveTimeout: .seconds(600)) }.result
        #expect(ContinuousClock.now - start < .seconds(60))
        #expect(throws: IPCError.self) { try outcome.get() }
        if case .failure(let error as IPCError) = outcome { #expect(error.code == .sendTimeout) }
        #expect(connection.invalidationReason == nil)
        // The peer reads now: the first frame arrives whole, and nothing of the second.
        let message = try #require(await blocking { peer.readFrame() })
        #expect(message.msgid == 1 && message.payload == big)
        #expect(connection.invalidationReason == nil)
    }

    @Test("a frame sent on the loop's thread that cannot be written by its timeout ends the connection with sendTimeout instead of being dropped unseen")
    func loopSendNotWrittenEndsTheConnection() async throws {
        let (connection, peer) = try connect(sendBuffer: 4096)
        defer { peer.close() }
        let probe = AsyncStream<InvalidationReason>.makeStream()
        connection.setInvalidationHandler { probe.continuation.yield($0) }
        // A begun frame fills the peer's buffer; the second send queues whole behind it and
        // returns at once, with nobody left waiting for it.
        let big = [UInt8](repeating: 1, count: 512 * 1024)
        try await withTaskExecutorPreference(connection.eventLoop) {
            #expect(connection.eventLoop.inEventLoop)
            try connection.send(big, msgid: 1, timeout: .seconds(120))
            try connection.send([7], msgid: 7, timeout: .milliseconds(200))
        }
        // Without the fix the frame vanished and the connection stayed valid: end the wait.
        let watchdog = Task(executorPreference: ElasticExecutor.elastic) { try await Task.sleep(for: .seconds(60)); probe.continuation.finish() }
        defer { watchdog.cancel() }
        var iterator = probe.stream.makeAsyncIterator()
        let reason = try #require(await iterator.next())
        #expect(reason.kind == .transportFailure)
        #expect(reason.error?.code == .sendTimeout)
    }

    @Test("invalidation happens once: messages finish, pending requests fail with peerInvalidated, the handler runs once, later calls fail")
    func invalidationOrder() async throws {
        let (connection, peer) = try connect()
        let events = EventLog()
        let messagesDone = Task(executorPreference: ElasticExecutor.elastic) {
            for await _ in connection.messages {}
            events.append("messages finished")
        }
        let pending = Task(executorPreference: ElasticExecutor.elastic) {
            do {
                _ = try await connection.request([1], msgid: 1, sendTimeout: .seconds(5), receiveTimeout: .seconds(60))
            } catch let error as IPCError {
                events.append("request failed: \(error.code)")
            }
        }
        _ = try #require(await blocking { peer.readFrame() })
        let handled = AsyncStream<Void>.makeStream()
        connection.setInvalidationHandler { reason in
            // By now the connection refuses everything.
            let refused = (try? connection.send([1], msgid: 1, timeout: .seconds(1))) == nil
            events.append("handler: \(reason.kind), sends refused: \(refused)")
            handled.continuation.yield()
        }
        peer.close()
        var iterator = handled.stream.makeAsyncIterator()
        _ = await iterator.next()
        await messagesDone.value
        _ = await pending.result
        let seen = events.entries
        #expect(seen.contains("handler: peerClosed, sends refused: true"))
        #expect(seen.filter { $0.hasPrefix("handler") }.count == 1)
        #expect(seen.contains("request failed: peerInvalidated"))
        #expect(seen.contains("messages finished"))
        await #expect(throws: IPCError.self) { try await connection.request([1], msgid: 1, sendTimeout: .seconds(1), receiveTimeout: .seconds(1)) }
        #expect(throws: IPCError.self) { try connection.send([1], msgid: 1, timeout: .seconds(1)) }
    }

    @Test("a peer that stops in the middle of a frame and hangs up is a truncated frame, not a clean end")
    func deathMidFrame() async throws {
        let (connection, peer) = try connect()
        let probe = AsyncStream<InvalidationReason>.makeStream()
        connection.setInvalidationHandler { probe.continuation.yield($0) }
        let whole = PairChannel.encode(Frame(kind: .message, msgid: 5, payload: [UInt8](repeating: 3, count: 100)))
        peer.sendRaw(Array(whole[0..<40]))
        peer.close()
        var iterator = probe.stream.makeAsyncIterator()
        let reason = try #require(await iterator.next())
        #expect(reason.kind == .protocolError)
        #expect(reason.error?.code == .truncatedFrame)
    }

    @Test("a peer that stalls inside a frame is dropped after the stalled-frame timeout")
    func stalledFrame() async throws {
        let (connection, peer) = try connect(.defaults { $0.stalledFrameTimeout = .milliseconds(100) })
        defer { peer.close() }
        let probe = AsyncStream<InvalidationReason>.makeStream()
        connection.setInvalidationHandler { probe.continuation.yield($0) }
        peer.sendRaw([1, 0, 0])
        var iterator = probe.stream.makeAsyncIterator()
        let reason = try #require(await iterator.next())
        #expect(reason.error?.code == .truncatedFrame)
    }

    @Test("the message buffer holds at most its limit, the loop stops reading meanwhile, and nothing is lost")
    func backpressure() async throws {
        let limit = ConnectionOptions.BufferLimit(messages: 8, bytes: 1 << 20)
        let (connection, peer) = try connect(.defaults { $0.messageBufferLimit = limit }, sendBuffer: 8192)
        defer { connection.invalidate(); peer.close() }
        let count = 2_000
        onThread {
            for index in 0..<count {
                peer.send(Frame(kind: .message, msgid: UInt32(index), payload: [UInt8](repeating: UInt8(index & 0xFF), count: 512)))
            }
        }
        // The buffer fills up to its limit (however long a loaded machine takes to send), and
        // stays there while nobody takes a message: the loop has stopped reading.
        let deadline = ContinuousClock.now + .seconds(60)
        while connection.bufferedMessageCount < limit.messages, ContinuousClock.now < deadline {
            try await Task.sleep(for: .milliseconds(10))
        }
        try await Task.sleep(for: .milliseconds(300))
        #expect(connection.bufferedMessageCount == limit.messages)
        var received: [UInt32] = []
        for await message in connection.messages {
            #expect(connection.bufferedMessageCount <= limit.messages)
            #expect(message.payload == [UInt8](repeating: UInt8(message.msgid & 0xFF), count: 512))
            received.append(message.msgid)
            if received.count == count { break }
        }
        #expect(received == (0..<count).map { UInt32($0) })
    }

    @Test("a one-way message that arrives between two requests reaches its handler without waiting for the next request")
    func oneWayBetweenRequests() async throws {
        let arrived = AsyncStream<UInt64>.makeStream()
        let options = ConnectionOptions.defaults { options in
            options.makeOnLoopMessageHandler = {
                { _, _ in
                    arrived.continuation.yield(monotonicNanoseconds())
                    return true
                }
            }
        }
        let (connection, peer) = try connect(options)
        defer { connection.invalidate(); peer.close() }
        onThread {
            guard let request = peer.readFrame() else { return }
            peer.send(Frame(kind: .reply, msgid: request.msgid, correlation: request.correlation, payload: [1]))
        }
        _ = try await connection.request([1], msgid: 1, sendTimeout: .seconds(5), receiveTimeout: .seconds(10))
        let sent = monotonicNanoseconds()
        peer.send(Frame(kind: .message, msgid: 9, payload: [9]))
        var iterator = arrived.stream.makeAsyncIterator()
        let at = try #require(await iterator.next())
        // Generous bound (a shared VM: CI once saw 602 ms with the suite running); the old
        // parked receive thread took up to 16 ms, and a message that waited for the next request
        // would wait for good (no request follows).
        #expect(Double(at - sent) / 1e6 < 5_000)
    }

    @Test(
        "a borrowing handler is offered one-way messages, before the message handler and the stream; requests never — in place, and from a channel that does not lend",
        arguments: [true, false]
    )
    func borrowingHandler(channelLends: Bool) async throws {
        let offered = Mutex<[(msgid: UInt32, payload: [UInt8])]>([])
        let options = ConnectionOptions.defaults { options in
            options.makeOnLoopBorrowingMessageHandler = {
                { msgid, payload, send in
                    offered.withLock { $0.append((msgid, payload.withUnsafeBytes { Array($0) })) }
                    if msgid == 100 { try? send([42], 101) }
                    return msgid % 2 == 0
                }
            }
            // Sees only what the borrowing handler declined.
            options.makeOnLoopMessageHandler = {
                { message, _ in message.msgid % 3 == 0 }
            }
        }
        let (channel, peer) = try PairPeer.make()
        let connection = try EngineConnection(channel: channelLends ? channel : NonLendingChannel(channel), peer: nil, options: options)
        defer { connection.invalidate(); peer.close() }
        for msgid in UInt32(0)..<12 {
            peer.send(Frame(kind: .message, msgid: msgid, payload: [UInt8](repeating: UInt8(msgid), count: Int(msgid) * 1000)))
        }
        peer.send(Frame(kind: .request, msgid: 50, correlation: 9, payload: [5]))
        peer.send(Frame(kind: .message, msgid: 100, payload: []))
        var stream = connection.messages.makeAsyncIterator()
        var reached: [UInt32] = []
        for _ in 0..<5 {
            reached.append(try #require(await stream.next()).msgid)
        }
        // Odd msgids not divisible by 3, then the request (never offered).
        #expect(reached == [1, 5, 7, 11, 50])
        let answer = try #require(await blocking { peer.readFrame() })
        #expect(answer.kind == .message && answer.msgid == 101 && answer.payload == [42])
        let seen = offered.withLock { $0 }
        #expect(seen.map(\.msgid) == Array(0..<12) + [100])
        #expect(seen.allSatisfy { $0.payload == [UInt8](repeating: UInt8($0.msgid % 256), count: $0.msgid == 100 ? 0 : Int($0.msgid) * 1000) })
    }

    @Test("a task that prefers the event loop sends and is resumed on the loop's thread")
    func executorPreference() async throws {
        let (connection, peer) = try connect()
        defer { connection.invalidate(); peer.close() }
        onThread {
            while let request = peer.readFrame() {
                peer.send(Frame(kind: .reply, msgid: request.msgid, correlation: request.correlation, payload: request.payload))
            }
        }
        let loop = connection.eventLoop
        let onLoop = try await withTaskExecutorPreference(loop) {
            var every = true
            for index in 0..<100 {
                let reply = try await connection.request([UInt8(index)], msgid: 1, sendTimeout: .seconds(5), receiveTimeout: .seconds(10))
                every = every && reply == [UInt8(index)] && loop.inEventLoop
            }
            return every
        }
        #expect(onLoop)
    }

    @Test("requests answered by a handler on the loop reply through the same connection")
    func handlerReplies() async throws {
        let (connection, peer) = try connect(.defaults { $0.requestHandler = { _, payload in payload + [0] } })
        defer { connection.invalidate(); peer.close() }
        peer.send(Frame(kind: .request, msgid: 3, correlation: 77, payload: [1, 2]))
        let reply = try #require(await blocking { peer.readFrame() })
        #expect(reply.kind == .reply && reply.correlation == 77 && reply.payload == [1, 2, 0])
    }

    @Test("garbage from the peer ends the connection with a typed protocol error")
    func garbage() async throws {
        let (connection, peer) = try connect()
        defer { peer.close() }
        let probe = AsyncStream<InvalidationReason>.makeStream()
        connection.setInvalidationHandler { probe.continuation.yield($0) }
        peer.sendRaw([UInt8](repeating: 0xEE, count: 40))
        var iterator = probe.stream.makeAsyncIterator()
        let reason = try #require(await iterator.next())
        #expect(reason.kind == .protocolError)
        #expect(reason.error?.code == .malformedFrame)
    }
}

@Suite("Engine: one event loop for many connections", .elasticThreads)
struct EventLoopScaleTests {
    @Test("10,000 connections on one loop: no thread per connection, and a connection among them is served")
    func tenThousandConnections() async throws {
        guard ChildProcessTest.isChildRun else {
            return try await ChildProcessTest.run(filter: "tenThousandConnections")
        }
        let loop = try EventLoop(name: "ipc-loop-test")
        let before = ChildProcessTest.threadCount()
        var connections: [EngineConnection] = []
        defer { for connection in connections { connection.invalidate() } }
        let count = 10_000
        for _ in 0..<count {
            connections.append(try EngineConnection(channel: try IdleChannel(), peer: nil, options: .defaults, loop: loop))
        }
        let (channel, peer) = try PairPeer.make()
        defer { peer.close() }
        connections.append(try EngineConnection(channel: channel, peer: nil, options: .defaults { $0.requestHandler = { _, payload in payload }; $0.requestHandlerExecutor = .eventLoop }, loop: loop))
        #expect(loop.registrationCount == count + 1)
        // One loop thread, in a process of its own (a thread per connection would add 10,000).
        #expect(ChildProcessTest.threadCount() <= before + 2)
        print("engine scale: \(count) connections on one loop, threads \(before) → \(ChildProcessTest.threadCount())")
        for index in 0..<100 {
            peer.send(Frame(kind: .request, msgid: 1, correlation: UInt64(index + 1), payload: [UInt8(index)]))
            let reply = try #require(await blocking { peer.readFrame() })
            #expect(reply.correlation == UInt64(index + 1) && reply.payload == [UInt8(index)])
        }
        for connection in connections { connection.invalidate() }
        // The loop deregisters them as it gets to them: a loaded machine takes its time.
        let deadline = ContinuousClock.now + .seconds(60)
        while loop.registrationCount > 0, ContinuousClock.now < deadline { try await Task.sleep(for: .milliseconds(10)) }
        #expect(loop.registrationCount == 0)
    }
}

/// What a test saw, in order, from any thread.
final class EventLog: Sendable {
    private let state = Mutex<[String]>([])

    func append(_ entry: String) {
        state.withLock { $0.append(entry) }
    }

    var entries: [String] { state.withLock { $0 } }
}
