import Foundation
import IPCBenchKit
import IPCCore
import IPCSystem
import IPCTestSupport
import Testing

/// Every floor mechanism against a real `ipcbench floor-peer` process: echoes arrive intact at
/// every size the harness uses and at the edges of the mechanisms' own units (a queue message of
/// 8 KiB, a page), nothing is left behind, and a dead peer is an error, not a hang.
/// No timing is asserted. Serialized: each mqueue floor holds two queues of 80 KiB against the
/// user's 800 KiB RLIMIT_MSGQUEUE, which the message-port tests draw on at the same time.
@Suite("Native floor", .serialized, .usesMessageQueues)
struct NativeFloorTests {
    /// The payload sizes of the default run, the sizes around one queue message (with its
    /// 4-byte header) and one page, and those around the largest message a stream floor sends
    /// from one copy (3,584 bytes with its header, NF_COALESCED_LIMIT).
    static let sizes = [0, 1, 64, 3579, 3580, 3581, 4095, 4096, 8187, 8188, 8189, 8192, 65536, 1 << 20]

    @Test("echoes every payload size intact", arguments: FloorMechanism.allCases)
    func echo(mechanism: FloorMechanism) async throws {
        let group = try TestGroup()
        let session = try FloorSession(mechanism: mechanism, placement: .unpinned, group: group.directory)
        defer { session.close() }
        for size in Self.sizes {
            // Bytes that differ with their offset, so a fragment out of place shows.
            let payload = (0..<size).map { UInt8(truncatingIfNeeded: $0 &* 31 ^ $0 >> 8 ^ size) }
            let reply = try await withDeadline(seconds: 30, "\(mechanism) echo of \(size) bytes") { try await session.echo(payload) }
            #expect(reply == payload, "\(mechanism): the echo of \(size) bytes differs")
        }
        let times = try await session.roundTripTimes(payloadSize: 64, count: 50)
        #expect(times.count == 50)
    }

    /// A spinning floor's peer busy-polls only while it is being measured: left idle (between
    /// its measurements, while other peers are measured) it waits without the CPU, and answers
    /// again when asked. A busy-polling peer uses about a second of CPU a second (a quarter of
    /// one at the very least on a machine loaded four times over); the bound is a tenth.
    @Test("an idle spinning floor's peer gives up the CPU, and still answers", arguments: FloorMechanism.allCases.filter(\.spins))
    func idleSpinningPeer(mechanism: FloorMechanism) async throws {
        let group = try TestGroup()
        let session = try FloorSession(mechanism: mechanism, placement: .unpinned, group: group.directory)
        defer { session.close() }
        let payload = [UInt8](repeating: 0x3C, count: 64)
        #expect(try await withDeadline(seconds: 30, "\(mechanism) echo") { try await session.echo(payload) } == payload)
        try await Task.sleep(for: .milliseconds(200))
        let before = try #require(processCPUNanoseconds(pid: session.peerPID))
        try await Task.sleep(for: .seconds(1))
        let used = try #require(processCPUNanoseconds(pid: session.peerPID)) - before
        #expect(used < 100_000_000, "\(mechanism): the idle peer used \(used / 1_000_000) ms of CPU in a second")
        #expect(try await withDeadline(seconds: 30, "\(mechanism) echo after idling") { try await session.echo(payload) } == payload)
    }

    @Test("leaves no file or queue behind", arguments: FloorMechanism.allCases)
    func cleanup(mechanism: FloorMechanism) async throws {
        let group = try TestGroup()
        let session = try FloorSession(mechanism: mechanism, placement: .unpinned, group: group.directory)
        _ = try await session.echo([1, 2, 3])
        session.close()
        #expect(try FileManager.default.contentsOfDirectory(atPath: group.directory.path) == [])
        let queues = (try? FileManager.default.contentsOfDirectory(atPath: "/dev/mqueue")) ?? []
        #expect(queues.filter { $0.hasPrefix(group.directory.identifier) } == [])
    }

    @Test("streams one-way messages where the kernel buffers them; refuses where it does not", arguments: FloorMechanism.allCases)
    func stream(mechanism: FloorMechanism) async throws {
        let group = try TestGroup()
        let session = try FloorSession(mechanism: mechanism, placement: .unpinned, group: group.directory)
        defer { session.close() }
        guard mechanism.streams else {
            let error = await #expect(throws: IPCError.self) { _ = try await session.streamTime(payloadSize: 64, count: 10) }
            #expect(error?.code == .unsupportedOperation)
            return
        }
        // 3580 and 3581: the largest message a stream floor sends from one copy, and the next
        // (NF_COALESCED_LIMIT; io_uring's tracked sends each have their copy in flight). The
        // peer's sink checks every message's header where the lengths before it put it: a
        // stream whose messages' bytes interleave fails (unix-stream+io_uring's did, at 64 KiB
        // and 1 MiB, while it kept several sends in flight unordered).
        // 262139 and 262140: the largest message the sink reads through its 1 MiB buffer with
        // others, and the smallest it reads alone into a buffer of its size (NF_SINK_ALONE, a
        // quarter MiB with its header).
        for size in [0, 64, 3580, 3581, 8189, 65536, 262_139, 262_140, 1 << 20] {
            let nanoseconds = try await withDeadline(seconds: 30, "\(mechanism) stream of \(size) bytes") {
                try await session.streamTime(payloadSize: size, count: size > 65536 ? 16 : 200)
            }
            #expect(nanoseconds > 0)
        }
        // The stream leaves the channel in step: round trips still work.
        #expect(try await session.echo([9, 8, 7]) == [9, 8, 7])
    }

    /// unix-stream+epoll's batched stream, 8 messages a `sendmsg`, in every placement this
    /// machine has: counts that are not a multiple of 8 (the last write shorter) and one below
    /// it, sizes from empty to 1 MiB (8 MiB a write: partial writes, and waits for room), and
    /// batches of 3,584 bytes and just over (one copy a batch up to NF_COALESCED_LIMIT). The
    /// peer's sink reads exactly count × (4 + size) bytes before it acknowledges, so a byte
    /// short hangs the stream (the deadline fails it), and a byte too many is read as the next
    /// request, which fails the echo after it.
    @Test("a batched stream delivers every byte, the last batch shorter, in every placement",
          arguments: Placement.allCases.filter { $0.requiredCPUCount <= CPUAffinity.onlineCount })
    func batchedStream(placement: Placement) async throws {
        let group = try TestGroup()
        let session = try FloorSession(mechanism: .unixStreamEpoll, placement: placement, group: group.directory)
        defer { session.close() }
        for (size, count) in [(0, 203), (64, 203), (64, 3), (444, 203), (445, 203), (8189, 203), (1 << 20, 11)] {
            let nanoseconds = try await withDeadline(seconds: 30, "batched stream of \(count) × \(size) bytes, \(placement)") {
                try await session.streamTime(payloadSize: size, count: count, batch: 8)
            }
            #expect(nanoseconds > 0)
            #expect(try await withDeadline(seconds: 30, "echo after \(count) × \(size) bytes, \(placement)") { try await session.echo([9, 8, 7]) } == [9, 8, 7])
        }
    }

    /// Only unix-stream+epoll's stream is written in batches; the refusal comes before anything
    /// is sent, so the channel stays in step.
    @Test("refuses a batched stream where the floor does not batch, and a batch out of range", arguments: FloorMechanism.allCases.filter { $0.streams && $0.isAvailable })
    func batchRefused(mechanism: FloorMechanism) async throws {
        let group = try TestGroup()
        let session = try FloorSession(mechanism: mechanism, placement: .unpinned, group: group.directory)
        defer { session.close() }
        let batches = mechanism.streamsInBatches ? [0, -1, 513] : [8]
        for batch in batches {
            let error = await #expect(throws: IPCError.self) { _ = try await session.streamTime(payloadSize: 64, count: 10, batch: batch) }
            #expect(error?.code == (mechanism.streamsInBatches ? .transportFailure : .unsupportedOperation), "\(mechanism), batch \(batch): \(String(describing: error))")
        }
        #expect(try await session.echo([4, 5, 6]) == [4, 5, 6])
        #expect(FloorMechanism.allCases.filter(\.streamsInBatches) == [.unixStreamEpoll])
    }

    /// The sender of a stream spends most of it waiting for room in the socket (blocked in the
    /// write, or in epoll_wait for EPOLLOUT): the peer killed then is an error at once, not a hang.
    /// `batch`: messages a write (unix-stream+epoll's batched stream, 8 MiB a `sendmsg`).
    @Test("a stream to a peer killed mid-stream fails", arguments: [(FloorMechanism.unixStream, 1), (.unixStreamEpoll, 1), (.unixStreamEpoll, 8), (.unixStreamIoUring, 1)])
    func peerDeathMidStream(mechanism: FloorMechanism, batch: Int) async throws {
        let group = try TestGroup()
        let session = try FloorSession(mechanism: mechanism, placement: .unpinned, group: group.directory)
        defer { session.close() }
        _ = try await session.echo([1])
        // 100 GiB: far more than the 300 ms before the kill can carry.
        let streaming = Task { try await session.streamTime(payloadSize: 1 << 20, count: 100_000, batch: batch) }
        try await Task.sleep(for: .milliseconds(300))
        kill(session.peerPID, SIGKILL)
        let error = await #expect(throws: IPCError.self) {
            _ = try await withDeadline(seconds: 20, "\(mechanism) stream to a killed peer") { try await streaming.value }
        }
        #expect(error?.code == .peerInvalidated, "\(mechanism): \(String(describing: error))")
    }

    @Test("refuses a payload over the session's maximum")
    func oversizedPayload() async throws {
        let group = try TestGroup()
        let session = try FloorSession(mechanism: .unixStream, placement: .unpinned, group: group.directory, maximumPayload: 1024)
        defer { session.close() }
        await #expect(throws: IPCError.self) { _ = try await session.echo([UInt8](repeating: 7, count: 1025)) }
        #expect(try await session.echo([UInt8](repeating: 7, count: 1024)).count == 1024)
    }

    @Test("a killed peer fails the round trip", arguments: FloorMechanism.allCases)
    func peerDeath(mechanism: FloorMechanism) async throws {
        let group = try TestGroup()
        let session = try FloorSession(mechanism: mechanism, placement: .unpinned, group: group.directory)
        defer { session.close() }
        _ = try await session.echo([1])
        kill(session.peerPID, SIGKILL)
        let error = await #expect(throws: IPCError.self) {
            _ = try await withDeadline(seconds: 20, "\(mechanism) round trip to a dead peer") { try await session.echo([2]) }
        }
        #expect(error?.code == .peerInvalidated, "\(mechanism): \(String(describing: error))")
    }

    @Test("measure returns a floor result in the runner's shape")
    func measure() async throws {
        let result = try await NativeFloor.measure(.pipe, placement: .unpinned, payloadSize: 64, samples: 40, warmup: 20)
        #expect(result.transport == "floor:pipe")
        #expect(result.framing == nil)
        #expect(result.payloadBytes == 64)
        #expect(result.samples == 40)
        #expect(result.repetitionMedians.count == LatencyResult.repetitions)
        #expect(result.minimum <= result.p50 && result.p50 <= result.maximum)
    }

    @Test("maps each transport to the mechanism under it")
    func transportMapping() {
        #expect(FloorMechanism(transport: "unix-socket") == .unixStream)
        #expect(FloorMechanism(transport: "message-port") == .mqueue)
        #expect(FloorMechanism(transport: "notify") == .futex)
        #expect(FloorMechanism(transport: "file-presenter") == .inotify)
        #expect(FloorMechanism(transport: "carrier-pigeon") == nil)
        #expect(FloorMechanism.unixStream.resultName == "floor:unix-stream")
        // unix-socket's batched stream has unix-stream+epoll's, batched, as its same work.
        #expect(FloorMechanism.allCases.compactMap(\.batchedSameWork) == [.unixStreamEpoll])
        #expect(FloorMechanism.unixStream.batchedSameWork?.streamsInBatches == true)
        // Served off the loop, every transport's round trip has a hand-off floor: its epoll
        // floor (file-presenter's journal floor) with the echo sent by a second thread.
        #expect(FloorMechanism.unixStream.handOff == .unixStreamEpollHandoff)
        #expect(FloorMechanism.futex.handOff == .eventfdEpollHandoff)
        #expect(FloorMechanism.mqueue.handOff == .mqueueEpollHandoff)
        #expect(FloorMechanism.inotify.handOff == .journalHandoff)
        #expect(FloorMechanism.eventfdEpollHandoff.resultName == "floor:eventfd+epoll+handoff")
        #expect(FloorMechanism.mqueueEpollHandoff.resultName == "floor:mqueue+epoll+handoff")
        #expect(FloorMechanism.journalHandoff.resultName == "floor:journal+handoff")
        #expect(FloorMechanism.allCases.filter { $0.handOff != nil }.allSatisfy { $0.handOff.map { !$0.streams && !$0.spins && $0.isAvailable } == true })
        // Spinning, the same: the spinning floor with the echo sent by a second thread.
        #expect(FloorMechanism.unixStream.spinningHandOff == .unixStreamSpinHandoff)
        #expect(FloorMechanism.futex.spinningHandOff == .shmSpinHandoff)
        #expect(FloorMechanism.mqueue.spinningHandOff == .mqueueSpinHandoff)
        #expect(FloorMechanism.inotify.spinningHandOff == nil)
        #expect(FloorMechanism.shmSpinHandoff.resultName == "floor:shm+spin+handoff")
        for mechanism in FloorMechanism.allCases {
            guard let handOff = mechanism.spinningHandOff else { continue }
            #expect(handOff.spins && !handOff.streams && handOff.isAvailable, "\(handOff)")
            #expect(handOff.rawValue.hasPrefix(mechanism.spinning?.rawValue ?? "-"), "\(handOff)")
        }
    }
}
