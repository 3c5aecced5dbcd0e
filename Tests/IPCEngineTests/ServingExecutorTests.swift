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

    /// What the producers of ``jobsWakeSleepingThreads()`` report, shared with the test.
    private final class Progress: Sendable {
        let ran = Atomic<Int>(0)
        let producersDone = Atomic<Int>(0)
    }

    @Test("a job queued while every thread sleeps wakes one: 200 from one producer after a pause each, then 2,000 from two producers")
    func jobsWakeSleepingThreads() async throws {
        let executor = try ServingExecutor(threads: 3)
        let progress = Progress()
        // Each job is awaited before the next is queued, so the threads have gone back to sleep
        // (or are going): each job must wake one. The producers are tasks of their own, which a
        // lost wake-up leaves waiting for good: the test then fails at its deadline instead of
        // hanging the run. They run on the suite's elastic threads: on the cooperative pool each
        // of their 2,600 resumptions queued behind the rest of the process (a full run here,
        // with gdb sampling the process: 3 jobs in 120 s).
        Task.detached(executorPreference: ElasticExecutor.elastic) {
            for _ in 0..<200 {
                try? await Task.sleep(for: .milliseconds(1))
                if await Task(executorPreference: executor, operation: { Self.threadName().hasPrefix("ipc-serve-") }).value { progress.ran.add(1, ordering: .relaxed) }
            }
            progress.producersDone.add(1, ordering: .sequentiallyConsistent)
            for _ in 0..<2 {
                Task.detached(executorPreference: ElasticExecutor.elastic) {
                    for round in 0..<1_000 {
                        if await Task(executorPreference: executor, operation: { Self.threadName().hasPrefix("ipc-serve-") }).value { progress.ran.add(1, ordering: .relaxed) }
                        if round.isMultiple(of: 100) { try? await Task.sleep(for: .milliseconds(1)) }
                    }
                    progress.producersDone.add(1, ordering: .sequentiallyConsistent)
                }
            }
        }
        let deadline = ContinuousClock.now + .seconds(120)
        while progress.producersDone.load(ordering: .sequentiallyConsistent) < 3, ContinuousClock.now < deadline {
            try await Task.sleep(for: .milliseconds(10))
        }
        #expect(progress.producersDone.load(ordering: .sequentiallyConsistent) == 3, "a job queued to sleeping threads did not run within 120 s")
        #expect(progress.ran.load(ordering: .sequentiallyConsistent) == 2_200)
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

    /// Set when a ``Held`` goes away.
    private final class Released: Sendable {
        let value = Atomic<Bool>(false)
    }

    /// Something a handler holds; its end says nothing kept the handler alive.
    private final class Held: Sendable {
        let released: Released
        init(_ released: Released) { self.released = released }
        deinit { released.value.store(true, ordering: .sequentiallyConsistent) }
    }

    @Test(
        "a connection that ends is freed with its handler, whether it served no request or its handler's task waits for the next one",
        arguments: [0, 5]
    )
    func endedConnectionIsFreed(requests: Int) async throws {
        let released = Released()
        nonisolated(unsafe) weak var ended: EngineConnection?
        do {
            let held = Held(released)
            let (channel, peer) = try PairPeer.make(sendBuffer: nil)
            let connection = try EngineConnection(channel: channel, peer: nil, options: .defaults {
                $0.requestHandler = { _, payload in
                    _ = held
                    return payload
                }
            })
            ended = connection
            for index in 0..<requests {
                let correlation = UInt64(index + 1)
                peer.send(Frame(kind: .request, msgid: 1, correlation: correlation, payload: [UInt8(index)]))
                let reply = try #require(await blocking { peer.readFrame() })
                #expect(reply.kind == .reply && reply.correlation == correlation && reply.payload == [UInt8(index)])
            }
            // The task that answered waits for another request now; the connection ends instead.
            connection.invalidate()
            peer.close()
        }
        let deadline = ContinuousClock.now + .seconds(30)
        while ended != nil || !released.value.load(ordering: .sequentiallyConsistent), ContinuousClock.now < deadline {
            try await Task.sleep(for: .milliseconds(5))
        }
        #expect(ended == nil, "the connection outlived its end")
        let handlerFreed = released.value.load(ordering: .sequentiallyConsistent)
        #expect(handlerFreed, "the handler outlived its connection")
    }

    /// A weak reference to an array's storage: gone once nothing holds the array's bytes.
    private final class StorageWatch: @unchecked Sendable {
        // @unchecked: set once, read after the handler that set it has returned.
        weak var storage: AnyObject?
        init(_ array: [UInt8]) { storage = unsafeBitCast(array, to: AnyObject.self) }
    }

    @Test("a handler's task, kept for the next request, holds neither the requests it answered nor their replies")
    func keptTaskHoldsNoPayload() async throws {
        let watches = Mutex<[StorageWatch]>([])
        let (channel, peer) = try PairPeer.make(sendBuffer: nil)
        let connection = try EngineConnection(channel: channel, peer: nil, options: .defaults {
            $0.requestHandler = { _, payload in
                let reply = payload.map { $0 &+ 1 }
                watches.withLock { $0 += [StorageWatch(payload), StorageWatch(reply)] }
                return reply
            }
        })
        defer { connection.invalidate(); peer.close() }
        for correlation: UInt64 in 1...3 {
            let payload = [UInt8](repeating: UInt8(correlation), count: 4096)
            peer.send(Frame(kind: .request, msgid: 1, correlation: correlation, payload: payload))
            let reply = try #require(await blocking { peer.readFrame() })
            #expect(reply.kind == .reply && reply.correlation == correlation && reply.payload == payload.map { $0 &+ 1 })
        }
        // The connection is open and its task waits for a fourth request: it should hold none
        // of the three requests' payloads or replies.
        let deadline = ContinuousClock.now + .seconds(30)
        func held() -> Int { watches.withLock { $0.filter { $0.storage != nil }.count } }
        while held() > 0, ContinuousClock.now < deadline { try await Task.sleep(for: .milliseconds(5)) }
        #expect(watches.withLock { $0.count } == 6)
        #expect(held() == 0, "payloads still held while the connection waits for its next request")
    }

    @Test("requests up to the concurrency bound run at once, in a second burst as in the first (the kept tasks take them)")
    func keptTasksServeConcurrently() async throws {
        let arrived = Mutex(0)
        let (channel, peer) = try PairPeer.make(sendBuffer: nil)
        let connection = try EngineConnection(channel: channel, peer: nil, options: .defaults {
            $0.maximumConcurrentRequests = 3
            // Each handler waits until all three of its burst are running: they must run at once.
            $0.requestHandler = { _, payload in
                let burst = arrived.withLock { count in
                    count += 1
                    return (count + 2) / 3
                }
                let deadline = ContinuousClock.now + .seconds(30)
                while arrived.withLock({ $0 }) < burst * 3 {
                    guard ContinuousClock.now < deadline else { throw CancellationError() }
                    try await Task.sleep(for: .milliseconds(1))
                }
                return payload
            }
        })
        defer { connection.invalidate(); peer.close() }
        for burst: UInt64 in 0..<2 {
            for index: UInt64 in 1...3 {
                peer.send(Frame(kind: .request, msgid: 2, correlation: burst * 3 + index, payload: [UInt8(index)]))
            }
            var answered: Set<UInt64> = []
            for _ in 0..<3 {
                let reply = try #require(await blocking { peer.readFrame() })
                #expect(reply.kind == .reply, "burst \(burst): \(String(decoding: reply.payload, as: UTF8.self))")
                answered.insert(reply.correlation)
            }
            #expect(answered == Set((1...3).map { burst * 3 + $0 }))
        }
    }
}
