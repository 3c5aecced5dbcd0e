import Foundation
import IPCCore
import IPCEngine
import IPCTestSupport
import Synchronization
import Testing

/// The serving threads that run request handlers off the loop by default
/// (``RequestHandlerExecutor/servingThreads``).
@Suite("Engine: serving threads for request handlers", .elasticThreads)
struct ServingExecutorTests {
    /// The calling thread's name (at most 15 bytes on Linux).
    private static func threadName() -> String {
        let name = (try? String(contentsOfFile: "/proc/thread-self/comm", encoding: .utf8)) ?? ""
        return name.trimmingCharacters(in: .newlines)
    }

    @Test("every job runs, on a serving thread")
    func jobsRunOnServingThreads() async throws {
        let executor = try ServingExecutor(threads: 2)
        let names = try await withDeadline(seconds: 60, "200 tasks on the serving threads") {
            try await withThrowingTaskGroup(of: String.self) { group in
                for _ in 0..<200 {
                    group.addTask(executorPreference: executor) {
                        await Task.yield()
                        return Self.threadName()
                    }
                }
                return try await group.reduce(into: [String]()) { $0.append($1) }
            }
        }
        #expect(names.count == 200)
        #expect(names.allSatisfy { $0.hasPrefix("ipc-serve-") }, "\(Set(names))")
    }

    @Test("a job that blocks its thread holds up no job while another thread is free")
    func blockedThreadLeavesTheOthers() async throws {
        let executor = try ServingExecutor(threads: 2)
        let release = DispatchSemaphore(value: 0)
        let blocked = Task(executorPreference: executor) {
            // Blocks a serving thread, as a handler that waits synchronously would.
            release.wait()
            return Self.threadName()
        }
        defer { release.signal() }
        let done = try await withDeadline(seconds: 60, "100 tasks beside a blocked one") {
            try await withThrowingTaskGroup(of: Bool.self) { group in
                for _ in 0..<100 {
                    group.addTask(executorPreference: executor) { Self.threadName().hasPrefix("ipc-serve-") }
                }
                return try await group.reduce(0) { $0 + ($1 ? 1 : 0) }
            }
        }
        #expect(done == 100)
        release.signal()
        #expect(await blocked.value.hasPrefix("ipc-serve-"))
    }

    @Test("by default a request handler runs on a serving thread, off the loop's thread")
    func defaultHandlerRunsOnServingThread() async throws {
        let seen = Mutex<(name: String, onLoop: Bool)?>(nil)
        let (channel, peer) = try PairPeer.make(sendBuffer: nil)
        let connection = try EngineConnection(channel: channel, peer: nil, options: .defaults {
            $0.requestHandler = { _, payload in
                let onLoop = try EventLoop.shared().inEventLoop
                seen.withLock { $0 = (Self.threadName(), onLoop) }
                return payload
            }
        })
        defer { connection.invalidate(); peer.close() }
        peer.send(Frame(kind: .request, msgid: 3, correlation: 9, payload: [4, 2]))
        let reply = try #require(await blocking { peer.readFrame() })
        #expect(reply.kind == .reply && reply.correlation == 9 && reply.payload == [4, 2])
        let observed = try #require(seen.withLock { $0 })
        #expect(observed.name.hasPrefix("ipc-serve-"), "\(observed.name)")
        #expect(!observed.onLoop)
    }
}
