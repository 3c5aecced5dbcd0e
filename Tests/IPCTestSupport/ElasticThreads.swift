import Foundation
public import Testing

/// Runs each test of a suite on threads of its own instead of Swift's cooperative pool.
///
/// Swift Testing runs tests in parallel on the cooperative pool, which has as many threads as
/// the machine has cores: two here. A suite whose tests keep a thread for long starves every
/// other test of the process: CI failed when the 18 cases of
/// `everyKindRoundTripsInEveryChunking` (debug build, pure computation) held both threads for
/// 67 s, and unrelated deadlines fired meanwhile (stacks taken with gdb showed it).
///
/// - ``Trait/elasticThreads``: in-process tests that wait a lot (the engine's, with a peer on
///   a thread of the test): a thread is added whenever a job waits and none is idle.
/// - ``Trait/offTheCooperativePool``: computation-bound suites: at most two threads, so that
///   they neither hold the pool nor crowd out the peer processes of the other tests.
///
/// Suites that start peer processes stay on the pool: they spawn through one gate
/// (`ChildProcess`), and letting all of them start at once made the gate itself the stall. They
/// wait for a peer's `READY` with `runBlocking`, off the pool (a peer started under load takes
/// seconds to say it, and gdb stacks showed such waits holding both threads at once). The notify center's suite
/// is elastic although it starts processes: only `notifyutil` posts, which end at once, and its
/// deliveries each take several hops that queued behind the whole process on the pool.
public struct ElasticThreads: SuiteTrait, TestTrait, TestScoping {
    let executor: ElasticExecutor
    public var isRecursive: Bool { true }

    public func provideScope(
        for test: Test, testCase: Test.Case?, performing function: @Sendable () async throws -> Void
    ) async throws {
        try await withTaskExecutorPreference(executor) { try await function() }
    }
}

extension Trait where Self == ElasticThreads {
    /// Runs the suite's tests on threads that are added as tests wait (see ``ElasticThreads``).
    public static var elasticThreads: Self { ElasticThreads(executor: .elastic) }

    /// Runs the suite's tests on two threads of their own (see ``ElasticThreads``).
    public static var offTheCooperativePool: Self { ElasticThreads(executor: .computation) }
}

/// A task executor that adds a thread whenever a job is waiting and no thread is idle (up to its
/// maximum), and lets a thread go after it has been idle for ten seconds.
public final class ElasticExecutor: TaskExecutor, @unchecked Sendable {
    // @unchecked: `jobs`, `idle` and `threads` are touched with `condition` locked only; a
    // condition variable is needed for idle threads to wait, which `Mutex` does not offer.
    /// The threads of ``Trait/elasticThreads``. `Task.detached` and `Task {}` do not inherit a
    /// suite's executor preference: a test of such a suite that starts a task of its own which
    /// must make progress gives it this one (`Task.detached(executorPreference: .elastic)`),
    /// else the task queues on the cooperative pool behind the rest of the process.
    public static let elastic = ElasticExecutor(maximumThreads: 256)
    static let computation = ElasticExecutor(maximumThreads: 2)

    private let condition = NSCondition()
    private var jobs: [UnownedJob] = []
    private var nextJob = 0
    private var idle = 0
    private var threads = 0
    /// Past it, jobs wait for a thread to come free.
    private let maximumThreads: Int
    private let idleSeconds = 10.0

    private init(maximumThreads: Int) {
        self.maximumThreads = maximumThreads
    }

    public func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        condition.lock()
        jobs.append(job)
        let waiting = jobs.count - nextJob
        let spawn = waiting > idle && threads < maximumThreads
        if spawn { threads += 1 } else { condition.signal() }
        condition.unlock()
        if spawn {
            let thread = Thread(block: { [self] in work() })
            thread.name = "elastic test thread"
            thread.start()
        }
    }

    private func work() {
        condition.lock()
        while true {
            if nextJob < jobs.count {
                let job = jobs[nextJob]
                nextJob += 1
                if nextJob == jobs.count {
                    jobs.removeAll(keepingCapacity: true)
                    nextJob = 0
                }
                condition.unlock()
                job.runSynchronously(on: asUnownedTaskExecutor())
                condition.lock()
                continue
            }
            idle += 1
            let signalled = condition.wait(until: Date(timeIntervalSinceNow: idleSeconds))
            idle -= 1
            if !signalled, nextJob == jobs.count {
                threads -= 1
                condition.unlock()
                return
            }
        }
    }
}
