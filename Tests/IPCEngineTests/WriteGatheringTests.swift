import Foundation
import Glibc
import IPCCore
import IPCEngine
import IPCTestSupport
import Synchronization
import Testing

/// Gathering writes: several waiting frames in one write (``EngineChannel``'s frames variant of
/// `write`), and the batched send (``EngineConnection/send(contentsOf:msgid:timeout:)``), over a
/// ``PairChannel`` that gathers, with a small socket buffer so that writes stop inside frames.
@Suite("Engine: gathering writes and batched sends", .elasticThreads)
struct WriteGatheringTests {
    private func connect(sendBuffer: Int? = 4096) throws -> (EngineConnection, PairChannel, PairPeer) {
        let (channel, peer) = try PairPeer.make(sendBuffer: sendBuffer, gathers: true)
        return (try EngineConnection(channel: channel, peer: nil, options: .defaults), channel, peer)
    }

    /// A payload of its own for each index, of sizes that do not line up with the socket's buffer.
    /// Written in place rather than with `map`, which the debug build runs unspecialized: 400 of
    /// these (595,000 bytes) made with it on the shared loop held the loop, and every test using
    /// it, for 4.3–5.0 s in the filtered rerun of `.ci/run` on a 2-vCPU VM (found with `perf
    /// record`; a back-off test and a cancellation test failed behind it).
    private static func payload(_ index: Int) -> [UInt8] {
        let count = index &* 37 % 3000 + 1
        return [UInt8](unsafeUninitializedCapacity: count) { bytes, initialized in
            for offset in 0..<count { bytes[offset] = UInt8(truncatingIfNeeded: offset &+ index) }
            initialized = count
        }
    }

    @Test("frames queued on the loop are drained in gathered writes: intact, in order, torn frames resumed at their byte")
    func queuedFramesDrainGathered() async throws {
        let (connection, channel, peer) = try connect()
        defer { connection.invalidate(); peer.close() }
        let count = 400
        // Sent from the loop's thread while the peer does not read: the kernel takes the first
        // few, the rest queue, and the loop drains them as the peer makes room. (Made before, off
        // the loop, which every connection of the process shares.)
        let payloads = (0..<count).map(Self.payload)
        try await withTaskExecutorPreference(connection.eventLoop) {
            #expect(connection.eventLoop.inEventLoop)
            for (index, payload) in payloads.enumerated() {
                try connection.send(payload, msgid: UInt32(index), timeout: .seconds(120))
            }
        }
        let frames = await blocking { (0..<count).compactMap { _ in peer.readFrame() } }
        #expect(frames.count == count)
        for (index, frame) in frames.enumerated() {
            #expect(frame.msgid == UInt32(index) && frame.payload == Self.payload(index), "frame \(index)")
        }
        let gathering = channel.gathering.withLock { $0 }
        #expect(gathering.calls > 0)
        #expect(gathering.mostFrames > 1)
        #expect(gathering.mostFrames <= 64)
        #expect(gathering.tornInside > 0, "a gathered write that stopped inside a frame after its first")
        #expect(gathering.resumed > 0, "a gathered write that began inside its first frame")
        #expect(connection.invalidationReason == nil)
    }

    @Test("cancelling a queued send not yet begun takes it out; the frames around it are gathered and arrive in order")
    func cancelQueuedAmongGathered() async throws {
        let (connection, channel, peer) = try connect()
        defer { connection.invalidate(); peer.close() }
        // A frame begun from the loop fills the peer's buffer; the sends after it queue whole.
        let big = [UInt8](repeating: 1, count: 512 * 1024)
        try await withTaskExecutorPreference(connection.eventLoop) {
            try connection.send(big, msgid: 100, timeout: .seconds(120))
        }
        var senders: [Task<Void, any Error>] = []
        for index in 0..<6 {
            senders.append(Task.detached(executorPreference: ElasticExecutor.elastic) {
                try await connection.send([UInt8](repeating: UInt8(index), count: 100 + index), msgid: UInt32(index), timeout: .seconds(120))
            })
            try await Task.sleep(for: .milliseconds(50))
        }
        senders[3].cancel()
        let outcome = await senders[3].result
        #expect(throws: CancellationError.self) { try outcome.get() }
        let frames = await blocking { (0..<6).compactMap { _ in peer.readFrame() } }
        #expect(frames.map(\.msgid) == [100, 0, 1, 2, 4, 5])
        #expect(frames.first?.payload == big)
        for (frame, index) in zip(frames.dropFirst(), [0, 1, 2, 4, 5]) {
            #expect(frame.payload == [UInt8](repeating: UInt8(index), count: 100 + index))
        }
        for (index, sender) in senders.enumerated() where index != 3 {
            try await sender.value
        }
        #expect(channel.gathering.withLock { $0.mostFrames } > 1)
        #expect(connection.invalidationReason == nil)
    }

    @Test("a batched send arrives whole and in order through a small buffer, in gathered writes")
    func batchedSendThroughSmallBuffer() async throws {
        let (connection, channel, peer) = try connect()
        defer { connection.invalidate(); peer.close() }
        let payloads = (0..<500).map(Self.payload)
        let sender = Task.detached(executorPreference: ElasticExecutor.elastic) { try await connection.send(contentsOf: payloads, msgid: 9, timeout: .seconds(120)) }
        let frames = await blocking { (0..<payloads.count).compactMap { _ in peer.readFrame() } }
        try await sender.value
        #expect(frames.count == payloads.count)
        for (index, frame) in frames.enumerated() {
            #expect(frame.kind == .message && frame.msgid == 9 && frame.payload == payloads[index], "message \(index)")
        }
        let gathering = channel.gathering.withLock { $0 }
        #expect(gathering.mostFrames > 1)
        #expect(gathering.mostFrames <= 64)
        #expect(connection.invalidationReason == nil)
    }

    @Test("a batched send that meets a payload too large sends the messages before it, not it nor those after; the connection stays valid")
    func batchedSendStopsAtFirstFailure() async throws {
        let (connection, _, peer) = try connect(sendBuffer: nil)
        defer { connection.invalidate(); peer.close() }
        let tooLarge = [UInt8](repeating: 0, count: PairChannel.maximumPayloadLength + 1)
        await expectIPCError(.payloadTooLarge) {
            try await connection.send(contentsOf: [[1], [2], tooLarge, [4]], msgid: 5, timeout: .seconds(10))
        }
        #expect(connection.invalidationReason == nil)
        try await connection.send(contentsOf: [[9]], msgid: 6, timeout: .seconds(10))
        let frames = await blocking { (0..<3).compactMap { _ in peer.readFrame() } }
        #expect(frames.map(\.payload) == [[1], [2], [9]])
        #expect(frames.map(\.msgid) == [5, 5, 6])
        // An empty batch sends nothing and succeeds.
        try await connection.send(contentsOf: [], msgid: 7, timeout: .seconds(10))
        connection.invalidate()
        await expectIPCError(.invalidated) {
            try await connection.send(contentsOf: [[1], [2]], msgid: 5, timeout: .seconds(10))
        }
    }

    @Test("a batched send to a peer that is gone fails with peerInvalidated and ends the connection")
    func batchedSendToClosedPeer() async throws {
        let (connection, _, peer) = try connect(sendBuffer: nil)
        // Shut down first: in one CI run the send succeeded after a close alone, as it does
        // while a child process spawned by another test still holds the peer's descriptor.
        peer.shutdown()
        peer.close()
        defer { connection.invalidate() }
        let probe = AsyncStream<InvalidationReason>.makeStream()
        connection.setInvalidationHandler { probe.continuation.yield($0) }
        do {
            try await connection.send(contentsOf: [[1], [2], [3]], msgid: 5, timeout: .seconds(10))
            Issue.record("a batched send to a closed peer succeeded")
        } catch let error as IPCError {
            #expect(error.code == .peerInvalidated || error.code == .invalidated)
        }
        let watchdog = Task(executorPreference: ElasticExecutor.elastic) { try await Task.sleep(for: .seconds(60)); probe.continuation.finish() }
        defer { watchdog.cancel() }
        var iterator = probe.stream.makeAsyncIterator()
        let reason = try #require(await iterator.next())
        #expect(reason.kind == .peerClosed)
    }

    @Test("a channel that does not gather gets a frame a call; EngineChannel's default frames write writes them one after another")
    func nonGatheringChannel() async throws {
        let (channel, peer) = try PairPeer.make(sendBuffer: 4096, gathers: false)
        let connection = try EngineConnection(channel: channel, peer: nil, options: .defaults)
        defer { connection.invalidate(); peer.close() }
        let payloads = (0..<200).map(Self.payload)
        let sender = Task.detached(executorPreference: ElasticExecutor.elastic) { try await connection.send(contentsOf: payloads, msgid: 3, timeout: .seconds(120)) }
        let frames = await blocking { (0..<payloads.count).compactMap { _ in peer.readFrame() } }
        try await sender.value
        #expect(frames.map(\.payload) == payloads)
        #expect(channel.gathering.withLock { $0.calls } == 0)
        // The default: each frame by write(_:from:), the first from its offset, while each goes whole.
        let sink = try SinkDoorbellChannel()
        defer { sink.close() }
        let three = [Frame(kind: .message, msgid: 1, payload: [1, 2]), Frame(kind: .message, msgid: 2, payload: [3]), Frame(kind: .message, msgid: 3, payload: [])]
        #expect(try sink.write(three[...], from: 1) == 2 + 2 + 1)
        #expect(sink.framesWritten == 3)
    }
}
