// The threads that run request handlers off the event loop (RequestHandlerExecutor.servingThreads).
#if os(Linux)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif
import DequeModule
import IPCCore

/// A few threads of the engine's own that run request handlers' tasks off the event loop
/// (``IPCCore/RequestHandlerExecutor/servingThreads``, the default): the loop queues the
/// handler's job and wakes one sleeping thread, one futex wake, as a C server hands a request
/// from its loop thread to a worker (`floor:unix-stream+epoll+handoff`).
///
/// One thread per online CPU, at least two, started when the process first serves with it.
/// A job runs until it suspends: a handler that suspends (`await`) frees its thread, one that
/// blocks its thread holds it, as on Swift's global executor, whose pool is as wide. Measured
/// against that executor in `Reports/serving-threads`.
public final class ServingExecutor: TaskExecutor, @unchecked Sendable {
    // @unchecked: `jobs` and `idle` are used only with `lock` held, which is also why their
    // dynamic exclusivity checks (a runtime call per access) are left out.
    private let lock = ConditionLock()
    @exclusivity(unchecked) private var jobs = Deque<UnownedJob>()
    /// Threads waiting on `lock`'s condition for a job.
    @exclusivity(unchecked) private var idle = 0

    /// The process's serving threads, or `nil` if the kernel refused the first of them (the
    /// handlers then run on Swift's global executor).
    public static let shared: ServingExecutor? = try? ServingExecutor(threads: max(2, Int(sysconf(Int32(_SC_NPROCESSORS_ONLN)))))

    /// Starts `threads` threads (at least one), named `ipc-serve-<n>`; they live as long as the
    /// process.
    /// - Throws: ``IPCCore/IPCError/Code/transportFailure`` if the kernel refuses the first one
    ///   (one refused later leaves the ones started).
    public init(threads: Int) throws {
        for index in 0..<max(1, threads) {
            do {
                try PosixThread.detach(name: "ipc-serve-\(index)") { [self] in work() }
            } catch where index > 0 {
                break
            }
        }
    }

    public func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        let wake: Bool = lock.withLock {
            jobs.append(job)
            return idle > 0
        }
        // A thread that is awake takes every job queued before it waits again.
        if wake { lock.signal() }
    }

    private func work() {
        while true {
            let job: UnownedJob = lock.withLock {
                while jobs.isEmpty {
                    idle += 1
                    lock.wait()
                    idle -= 1
                }
                return jobs.removeFirst()
            }
            job.runSynchronously(on: asUnownedTaskExecutor())
        }
    }
}
