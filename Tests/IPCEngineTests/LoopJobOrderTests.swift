import Dispatch
import IPCEngine
import Synchronization
import Testing

/// Jobs the loop's own thread queues skip the lock and the shared queue (`EventLoop.localJobs`);
/// the order jobs run in, and the loop's other work, must not notice.
@Suite("Engine: the order of the loop's jobs")
struct LoopJobOrderTests {
    @Test("jobs run in the order they were queued, whichever thread queued them")
    func orderAcrossThreads() throws {
        let loop = try EventLoop(name: "order-test", stallThreshold: .seconds(30)) { _ in }
        let order = Mutex<[String]>([])
        let done = DispatchSemaphore(value: 0)
        let loopQueued = Atomic<Bool>(false)
        let otherQueued = Atomic<Bool>(false)
        @Sendable func job(_ name: String) -> @Sendable () -> Void {
            { order.withLock { $0.append(name) }; done.signal() }
        }
        // 1. The loop queues a job (nothing of another thread's waits), then another thread
        //    queues one: the loop's runs first.
        loop.execute {
            loop.execute(job("loop, first"))
            loopQueued.store(true, ordering: .sequentiallyConsistent)
        }
        while !loopQueued.load(ordering: .sequentiallyConsistent) {}
        loop.execute(job("other, after the loop's"))
        // 2. Another thread queues a job while the loop runs one of its own, which then queues
        //    another: the other thread's, queued first, runs first.
        let running = Atomic<Bool>(false)
        loop.execute {
            running.store(true, ordering: .sequentiallyConsistent)
            // Waits on the loop's thread (a test only): the other thread's job is queued meanwhile.
            while !otherQueued.load(ordering: .sequentiallyConsistent) {}
            loop.execute(job("loop, after the other's"))
        }
        while !running.load(ordering: .sequentiallyConsistent) {}
        loop.execute(job("other, first"))
        otherQueued.store(true, ordering: .sequentiallyConsistent)
        for _ in 0..<4 {
            try #require(done.wait(timeout: .now() + .seconds(20)) == .success, "a job did not run within 20 s")
        }
        #expect(order.withLock { $0 } == ["loop, first", "other, after the loop's", "other, first", "loop, after the other's"])
    }

    @Test("a job that queues itself again and again does not starve the loop's timers")
    func requeueingJobDoesNotStarveTimers() throws {
        let loop = try EventLoop(name: "order-test", stallThreshold: .seconds(30)) { _ in }
        let stop = Atomic<Bool>(false)
        let rounds = Atomic<Int>(0)
        let stopped = DispatchSemaphore(value: 0)
        @Sendable func again() {
            if stop.load(ordering: .relaxed) {
                stopped.signal()
                return
            }
            rounds.add(1, ordering: .relaxed)
            loop.execute(again)
        }
        loop.execute {
            // Queued from the loop's thread: each run queues the next on the loop's own queue.
            loop.schedule(at: monotonicNanoseconds() &+ 1_000_000) { stop.store(true, ordering: .relaxed) }
            again()
        }
        try #require(stopped.wait(timeout: .now() + .seconds(20)) == .success, "the timer did not fire within 20 s of the job queueing itself")
        #expect(rounds.load(ordering: .relaxed) > 0)
    }
}
