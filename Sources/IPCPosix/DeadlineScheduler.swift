import Glibc
import HeapModule
import IPCCore
import Synchronization

/// Runs actions at deadlines on one background thread.
///
/// Request timeouts use it instead of a sleeping task per request: a sleeping task would have to
/// be woken to be cancelled when the reply arrives, a thread hop on every reply.
public final class DeadlineScheduler: @unchecked Sendable {
    private struct Entry: Comparable {
        var deadline: UInt64
        var sequence: UInt64
        var action: @Sendable () -> Void

        static func < (lhs: Entry, rhs: Entry) -> Bool {
            (lhs.deadline, lhs.sequence) < (rhs.deadline, rhs.sequence)
        }

        static func == (lhs: Entry, rhs: Entry) -> Bool {
            lhs.deadline == rhs.deadline && lhs.sequence == rhs.sequence
        }
    }

    public static let shared = DeadlineScheduler()

    // Guarded by `mutex`.
    private var heap = Heap<Entry>()
    private var sequence: UInt64 = 0
    private var threadStarted = false
    private var mutex = pthread_mutex_t()
    private var condition = pthread_cond_t()

    private init() {
        pthread_mutex_init(&mutex, nil)
        var attributes = pthread_condattr_t()
        pthread_condattr_init(&attributes)
        pthread_condattr_setclock(&attributes, CLOCK_MONOTONIC)
        pthread_cond_init(&condition, &attributes)
        pthread_condattr_destroy(&attributes)
    }

    /// Runs `action` on the scheduler's thread at `deadline` (``monotonicNanoseconds()``).
    public func schedule(at deadline: UInt64, _ action: @escaping @Sendable () -> Void) {
        pthread_mutex_lock(&mutex)
        sequence &+= 1
        let becomesEarliest = heap.min.map { deadline < $0.deadline } ?? true
        heap.insert(Entry(deadline: deadline, sequence: sequence, action: action))
        if !threadStarted {
            threadStarted = true
            try? PosixThread.detach(name: "ipc-deadlines") { [self] in run() }
        }
        pthread_mutex_unlock(&mutex)
        if becomesEarliest { pthread_cond_signal(&condition) }
    }

    /// A duration in whole nanoseconds, clamped to zero and above.
    public static func nanoseconds(_ duration: Duration) -> UInt64 {
        let (seconds, attoseconds) = duration.components
        return UInt64(clamping: max(0, seconds)) &* 1_000_000_000 &+ UInt64(clamping: max(0, attoseconds / 1_000_000_000))
    }

    private func run() {
        pthread_mutex_lock(&mutex)
        while true {
            guard let next = heap.min else {
                pthread_cond_wait(&condition, &mutex)
                continue
            }
            let now = monotonicNanoseconds()
            if next.deadline <= now {
                let entry = heap.removeMin()
                pthread_mutex_unlock(&mutex)
                entry.action()
                pthread_mutex_lock(&mutex)
                continue
            }
            var wake = timespec(tv_sec: Int(next.deadline / 1_000_000_000), tv_nsec: Int(next.deadline % 1_000_000_000))
            pthread_cond_timedwait(&condition, &mutex, &wake)
        }
    }
}
