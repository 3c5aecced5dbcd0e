// The threads that run request handlers off the event loop (RequestHandlerExecutor.servingThreads).
#if os(Linux)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif
import DequeModule
import IPCCore
import Synchronization

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
    // Its state is a Mutex and an atomic word, both Sendable: the `@unchecked` on the class is
    // no longer needed, and is kept so that its public declaration stays as it was.
    private struct Queue {
        var jobs = Deque<UnownedJob>()
        /// Threads that found no job and sleep, or are about to sleep, on `wakeups`, and ones
        /// woken that have not taken the lock again yet.
        var idle = 0
    }

    /// The jobs, behind a `Mutex` (a compare-and-swap when free, inlined): the pthread mutex
    /// and condition variable this used before cost about 375 instructions more a request, in
    /// the library calls and the condition's own locking (callgrind, `Scripts/instructions.sh`).
    private let queue = Mutex(Queue())
    /// Bumped when a job comes while a thread is idle; a thread sleeps only while the word holds
    /// the value it read with the queue empty, so a job queued after that look either keeps it
    /// from sleeping or wakes a sleeping thread, which looks at the queue again.
    private let wakeups = FutexWord()

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
        let wake: Bool = queue.withLock { queue in
            queue.jobs.append(job)
            return queue.idle > 0
        }
        // A thread that is awake takes every job queued before it sleeps again.
        if wake { wakeups.bump(waking: 1) }
    }

    private func work() {
        var slept = false
        while true {
            let (job, seen): (UnownedJob?, UInt32) = queue.withLock { queue in
                if slept { queue.idle -= 1 }
                if let job = queue.jobs.popFirst() { return (job, 0) }
                queue.idle += 1
                // Read with the lock held: a job queued from now on finds this thread idle and
                // moves the word, so this thread does not sleep past it, or another wakes.
                return (nil, wakeups.value)
            }
            if let job {
                slept = false
                job.runSynchronously(on: asUnownedTaskExecutor())
            } else {
                wakeups.wait(whileEquals: seen)
                slept = true
            }
        }
    }
}
