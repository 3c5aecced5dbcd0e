import Dispatch
import Foundation
import Glibc
import IPCCore
import IPCEngine
import IPCTestSupport
import Synchronization
import Testing

/// Held writes: one-way `async` sends made on the loop's thread, over a channel with a
/// ``EngineChannel/heldWriteLimit``, are held back and written together at the end of the
/// loop's round (``EngineConnection/send(_:msgid:timeout:)-async``), over a ``PairChannel``
/// that gathers and counts its write calls. Every test checks what the peer reads: each frame
/// once, intact, in order.
@Suite("Engine: sends held for one write at the end of the loop's round", .elasticThreads)
struct HeldWriteTests {
    private func connect(held: Int, sendBuffer: Int? = nil, options: ConnectionOptions = .defaults) throws -> (EngineConnection, PairChannel, PairPeer) {
        let (channel, peer) = try PairPeer.make(sendBuffer: sendBuffer, gathers: true, held: held)
        return (try EngineConnection(channel: channel, peer: nil, options: options), channel, peer)
    }

    /// 100 bytes of payload (117 with the pair channel's header), distinct per index.
    /// Written in place rather than with `map`, which is slow in the debug build: these are
    /// made on the shared loop, thousands in a test (WriteGatheringTests' payloads held it 4 s).
    private static func payload(_ index: Int) -> [UInt8] {
        [UInt8](unsafeUninitializedCapacity: 100) { bytes, initialized in
            for offset in 0..<100 { bytes[offset] = UInt8(truncatingIfNeeded: offset &* 7 &+ index) }
            initialized = 100
        }
    }

    /// Returns once the loop has finished the round it is in: a write's count is taken after its
    /// system call returns, so the peer may read the bytes before the count moves.
    private static func settled(_ connection: EngineConnection) async {
        await withTaskExecutorPreference(connection.eventLoop) {}
    }

    private static func readAll(_ peer: PairPeer, _ count: Int) async -> [Frame] {
        await blocking { (0..<count).compactMap { _ in peer.readFrame() } }
    }

    private static func expectInOrder(_ frames: [Frame], _ count: Int, msgidOffset: UInt32 = 0) {
        #expect(frames.count == count)
        for (index, frame) in frames.enumerated() {
            #expect(frame.kind == .message && frame.msgid == UInt32(index) + msgidOffset && frame.payload == payload(index), "frame \(index)")
        }
    }

    @Test("sends from a task on the loop are held in the round and go in one write at its end")
    func heldUntilTheRoundEnds() async throws {
        let (connection, channel, peer) = try connect(held: 4096)
        defer { connection.invalidate(); peer.close() }
        let count = 20
        try await withTaskExecutorPreference(connection.eventLoop) {
            #expect(connection.eventLoop.inEventLoop)
            for index in 0..<count {
                try await connection.send(Self.payload(index), msgid: UInt32(index), timeout: .seconds(60))
            }
            // Still in the round that made them: none is written yet.
            #expect(channel.gathering.withLock { $0.writes } == 0)
        }
        Self.expectInOrder(await Self.readAll(peer, count), count)
        await Self.settled(connection)
        let gathering = channel.gathering.withLock { $0 }
        #expect(gathering.writes == 1)
        #expect(gathering.mostFrames == count)
        #expect(connection.invalidationReason == nil)
    }

    @Test("a send that would take the held frames over the limit writes them first, at once")
    func limitWritesAtOnce() async throws {
        // 117 bytes a frame: eight fit in 1,024 bytes, the ninth writes the eight.
        let (connection, channel, peer) = try connect(held: 1024)
        defer { connection.invalidate(); peer.close() }
        let count = 100
        try await withTaskExecutorPreference(connection.eventLoop) {
            for index in 0..<count {
                try await connection.send(Self.payload(index), msgid: UInt32(index), timeout: .seconds(60))
            }
            // The ninth, 17th, ... 97th sends each wrote the eight before them.
            #expect(channel.gathering.withLock { $0.writes } == 12)
        }
        Self.expectInOrder(await Self.readAll(peer, count), count)
        await Self.settled(connection)
        let gathering = channel.gathering.withLock { $0 }
        #expect(gathering.writes == 13)
        #expect(gathering.mostFrames == 8)
    }

    @Test("frames above the limit are held in batches of their own, of at most eight; a batch never mixes them with small ones")
    func largeFramesHeldInEights() async throws {
        // 1,024 bytes for small frames; a 2,000-byte payload makes a larger frame.
        let (connection, channel, peer) = try connect(held: 1024)
        defer { connection.invalidate(); peer.close() }
        let large = (0..<20).map { index in [UInt8](repeating: UInt8(index), count: 2000) }
        try await withTaskExecutorPreference(connection.eventLoop) {
            for (index, payload) in large.enumerated() {
                try await connection.send(payload, msgid: UInt32(index), timeout: .seconds(60))
            }
            // The ninth and the 17th each wrote the eight before them.
            #expect(channel.gathering.withLock { $0.writes } == 2)
            // A small frame writes the four larger ones held before it, and is held alone.
            try await connection.send(Self.payload(0), msgid: 100, timeout: .seconds(60))
            #expect(channel.gathering.withLock { $0.writes } == 3)
            // A larger frame after it writes it.
            try await connection.send(large[0], msgid: 101, timeout: .seconds(60))
            #expect(channel.gathering.withLock { $0.writes } == 4)
        }
        let frames = await Self.readAll(peer, 22)
        #expect(frames.map(\.msgid) == Array(0..<20) + [100, 101])
        #expect(frames.map(\.payload) == large + [Self.payload(0), large[0]])
        await Self.settled(connection)
        let gathering = channel.gathering.withLock { $0 }
        #expect(gathering.writes == 5)
        #expect(gathering.mostFrames == 8)
    }

    @Test("frames with payloads of 64 KiB are held, three to a batch (256 KiB); a frame above 65 KiB is written by its own send")
    func largestHeldFrames() async throws {
        let (connection, channel, peer) = try connect(held: 1024)
        defer { connection.invalidate(); peer.close() }
        // 65,553 bytes a frame with the pair channel's header: three fit in 256 KiB, four do not.
        let payloads = (0..<7).map { index in [UInt8](repeating: UInt8(index), count: 64 * 1024) }
        // The peer reads as the frames come (the socket holds about three), on a thread started
        // now, whatever the test's executors are doing.
        let (read, delivered) = AsyncStream<[Frame]>.makeStream()
        onThread {
            delivered.yield((0..<payloads.count).compactMap { _ in peer.readFrame() })
            delivered.finish()
        }
        try await withTaskExecutorPreference(connection.eventLoop) {
            for (index, payload) in payloads.enumerated() {
                try await connection.send(payload, msgid: UInt32(index), timeout: .seconds(60))
                if index == 3 {
                    // The fourth send wrote the first three, in one call, and nothing else has
                    // written yet (later, the rest of a partial write may gather more frames).
                    let gathering = channel.gathering.withLock { $0 }
                    #expect(gathering.writes == 1 && gathering.mostFrames == 3)
                }
            }
        }
        var reading = read.makeAsyncIterator()
        let frames = await reading.next() ?? []
        #expect(frames.map(\.msgid) == Array(0..<7))
        #expect(frames.map(\.payload) == payloads)
        await Self.settled(connection)
        // Above the size held: its send writes it before it returns, in the round it is made in.
        let beyond = [UInt8](repeating: 0xEE, count: 64 * 1024 + 1024)
        let before = channel.gathering.withLock { $0.writes }
        try await withTaskExecutorPreference(connection.eventLoop) {
            try await connection.send(beyond, msgid: 7, timeout: .seconds(60))
            #expect(channel.gathering.withLock { $0.writes } == before + 1)
        }
        let last = await Self.readAll(peer, 1)
        #expect(last.map(\.msgid) == [7])
        #expect(last.first?.payload == beyond)
        #expect(connection.invalidationReason == nil)
    }

    @Test("frames sent after held ones by the other sends, on the loop, go after them, in order")
    func otherSendsQueueBehindHeld() async throws {
        let (connection, channel, peer) = try connect(held: 4096)
        defer { connection.invalidate(); peer.close() }
        try await withTaskExecutorPreference(connection.eventLoop) {
            try await connection.send(Self.payload(0), msgid: 0, timeout: .seconds(60))
            // The synchronous send on the loop's thread queues behind the held frame.
            let sendNow: () throws -> Void = { try connection.send(Self.payload(1), msgid: 1, timeout: .seconds(60)) }
            try sendNow()
            #expect(channel.gathering.withLock { $0.writes } == 0)
            // The batch takes nothing after a queued frame: this send writes the held frame,
            // then the queued one, and is held in a batch of its own.
            try await connection.send(Self.payload(2), msgid: 2, timeout: .seconds(60))
            #expect(channel.gathering.withLock { $0.writes } == 2)
            // A batched send waits for its frames to be written: the round's end writes all.
            try await connection.send(contentsOf: [Self.payload(3), Self.payload(4)], msgid: 3, timeout: .seconds(60))
        }
        let frames = await Self.readAll(peer, 5)
        #expect(frames.map(\.msgid) == [0, 1, 2, 3, 3])
        #expect(frames.map(\.payload) == (0..<5).map(Self.payload))
        #expect(connection.invalidationReason == nil)
    }

    @Test("invalidating on the loop right after held sends: the peer reads every one, then the end")
    func invalidateOnLoopWritesHeld() async throws {
        let (connection, _, peer) = try connect(held: 4096)
        defer { peer.close() }
        let count = 10
        try await withTaskExecutorPreference(connection.eventLoop) {
            for index in 0..<count {
                try await connection.send(Self.payload(index), msgid: UInt32(index), timeout: .seconds(60))
            }
            connection.invalidate()
        }
        Self.expectInOrder(await Self.readAll(peer, count), count)
        #expect(await blocking { peer.readFrame(seconds: 30) } == nil, "the end of the stream after the held frames")
        #expect(connection.invalidationReason?.kind == .invalidatedLocally)
    }

    @Test("invalidated from another thread while frames are held: they are written before the close, and later sends fail")
    func invalidateOffLoopWhileHeld() async throws {
        let (connection, _, peer) = try connect(held: 4096)
        defer { peer.close() }
        let count = 10
        let afterwards: (any Error)? = try await withTaskExecutorPreference(connection.eventLoop) {
            for index in 0..<count {
                try await connection.send(Self.payload(index), msgid: UInt32(index), timeout: .seconds(60))
            }
            // Another thread invalidates while the loop's round still holds the frames (the
            // loop waits for it here, which only a test may do).
            let done = DispatchSemaphore(value: 0)
            onThread {
                #expect(!connection.eventLoop.inEventLoop)
                connection.invalidate()
                done.signal()
            }
            done.wait()
            do {
                try await connection.send(Self.payload(count), msgid: UInt32(count), timeout: .seconds(60))
                return nil
            } catch {
                return error
            }
        }
        #expect((afterwards as? IPCError)?.code == .invalidated, "a send after the invalidation: \(String(describing: afterwards))")
        Self.expectInOrder(await Self.readAll(peer, count), count)
        #expect(await blocking { peer.readFrame(seconds: 30) } == nil, "the end of the stream after the held frames")
    }

    @Test("sends off the loop's thread are not held: a write each")
    func offLoopNotHeld() async throws {
        let (connection, channel, peer) = try connect(held: 4096)
        defer { connection.invalidate(); peer.close() }
        let count = 20
        try await Task.detached(executorPreference: ElasticExecutor.elastic) {
            #expect(!connection.eventLoop.inEventLoop)
            for index in 0..<count {
                try await connection.send(Self.payload(index), msgid: UInt32(index), timeout: .seconds(60))
            }
        }.value
        Self.expectInOrder(await Self.readAll(peer, count), count)
        let gathering = channel.gathering.withLock { $0 }
        #expect(gathering.writes == count)
        #expect(gathering.calls == 0)
    }

    @Test("a channel without a limit holds nothing: a write each on the loop too")
    func noLimitNoHolding() async throws {
        let (connection, channel, peer) = try connect(held: 0)
        defer { connection.invalidate(); peer.close() }
        let count = 20
        try await withTaskExecutorPreference(connection.eventLoop) {
            for index in 0..<count {
                try await connection.send(Self.payload(index), msgid: UInt32(index), timeout: .seconds(60))
            }
            #expect(channel.gathering.withLock { $0.writes } == count)
        }
        Self.expectInOrder(await Self.readAll(peer, count), count)
    }

    @Test("held frames the kernel has no room for wait, the sends after them wait their turn, and all arrive in order")
    func fullPeerBackpressure() async throws {
        let (connection, channel, peer) = try connect(held: 3584, sendBuffer: 4096)
        defer { connection.invalidate(); peer.close() }
        let count = 600
        let sender = Task(executorPreference: connection.eventLoop) {
            for index in 0..<count {
                try await connection.send(Self.payload(index), msgid: UInt32(index), timeout: .seconds(120))
            }
        }
        // The peer reads only once the sender has filled the socket and waits.
        try await Task.sleep(for: .milliseconds(200))
        Self.expectInOrder(await Self.readAll(peer, count), count)
        try await sender.value
        #expect(channel.gathering.withLock { $0.mostFrames } > 1)
        #expect(connection.invalidationReason == nil)
    }

    @Test("held frames a peer never makes room for end the connection at their deadline, not silently")
    func heldFramesPastDeadline() async throws {
        let (connection, _, peer) = try connect(held: 3584, sendBuffer: 4096)
        defer { connection.invalidate(); peer.close() }
        let ended = AsyncStream<InvalidationReason>.makeStream()
        connection.setInvalidationHandler { ended.continuation.yield($0) }
        let sender = Task(executorPreference: connection.eventLoop) { () -> (any Error)? in
            do {
                for index in 0..<10_000 {
                    try await connection.send(Self.payload(index), msgid: UInt32(index), timeout: .milliseconds(300))
                }
                return nil
            } catch {
                return error
            }
        }
        let error = await sender.value
        #expect(error != nil, "10,000 sends to a peer that never reads all succeeded")
        let watchdog = Task(executorPreference: ElasticExecutor.elastic) { try await Task.sleep(for: .seconds(60)); ended.continuation.finish() }
        defer { watchdog.cancel() }
        var iterator = ended.stream.makeAsyncIterator()
        let reason = try #require(await iterator.next())
        #expect(reason.kind == .transportFailure)
        #expect(reason.error?.code == .sendTimeout)
    }
}
