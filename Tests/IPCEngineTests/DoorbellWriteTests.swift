import CIPCShims
import Foundation
import Glibc
import IPCCore
import IPCEngine
import Synchronization
import SystemPackage
import Testing
import IPCTestSupport

/// A doorbell channel's queued frames: a ring is reported once, so a frame that waits in the
/// outbound queue is written only if something looks at the queue after it was queued.
@Suite("Engine: a doorbell channel's queued frames", .elasticThreads)
struct DoorbellWriteTests {
    /// Frames queued by one sender while the loop wrote another's (found the queue empty, and
    /// not yet given back the right to write) once waited, unwritten, for a ring that a doorbell
    /// channel never gives when it had room: the conformance cases 1.8 and 1.9 on notify stalled
    /// that way under load ("196 of 300 messages arrived, then none for 5.0 seconds").
    @Test("senders on several threads racing the loop's writer: every frame is written, none waits for a ring")
    func racingSenders() async throws {
        let channel = try SinkDoorbellChannel()
        let connection = try EngineConnection(channel: channel, peer: nil, options: .defaults)
        defer { connection.invalidate() }
        let threads = 4
        let perThread = 25_000
        let failures = EventLog()
        await withTaskGroup(of: Void.self) { group in
            for thread in 0..<threads {
                group.addTask {
                    await blocking {
                        for index in 0..<perThread {
                            do {
                                // A stuck frame fails at its deadline; none should.
                                try connection.send([UInt8(truncatingIfNeeded: index)], msgid: UInt32(thread), timeout: .seconds(10))
                            } catch {
                                failures.append("thread \(thread), message \(index): \(error)")
                                return
                            }
                        }
                    }
                }
            }
        }
        #expect(failures.entries == [])
        #expect(channel.framesWritten == threads * perThread)
    }
}

/// A ``ChannelReadiness/doorbell`` channel whose writes always have room and go nowhere (they
/// are counted), and whose bell (an eventfd) nothing rings: frames leave the outbound queue
/// only through what the engine itself does.
final class SinkDoorbellChannel: EngineChannel, @unchecked Sendable {
    // @unchecked: immutable but for the atomic counter.
    let descriptor: FileDescriptor
    var readiness: ChannelReadiness { .doorbell }
    private let written = Atomic<Int>(0)

    init() throws {
        let fd = eventfd(0, CInt(EFD_CLOEXEC) | CInt(EFD_NONBLOCK))
        guard fd >= 0 else { throw IPCError(code: .transportFailure, message: "eventfd failed: errno \(errno)") }
        descriptor = FileDescriptor(rawValue: fd)
    }

    var framesWritten: Int { written.load(ordering: .relaxed) }

    func readAvailable() throws -> Int? { nil }
    func nextFrame() throws -> Frame? { nil }
    var hasPartialFrame: Bool { false }
    func finishReading() throws {}
    func encodedLength(of frame: Frame) throws -> Int { frame.payload.count + 1 }

    func write(_ frame: Frame, from offset: Int) throws -> Int {
        written.add(1, ordering: .relaxed)
        return frame.payload.count + 1 - offset
    }

    func shutdown() {}
    func close() { _ = Glibc.close(descriptor.rawValue) }
}
