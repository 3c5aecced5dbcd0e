import Glibc
import IPCCore

/// Polls for something to happen for at most a ``WaitStrategy``'s spin time, before the caller
/// falls back to blocking. Every poll is followed by `sched_yield`, so a thread that shares the
/// core (the other end of a request in the same process, say) still gets to run.
public enum SpinWait {
    /// Calls `poll` until it returns a value or the spin time is over; returns that value, or
    /// `nil` once the caller should block. With ``WaitStrategy/blocking`` it returns `nil` at
    /// once, without calling `poll`: blocking costs no extra system call.
    @inline(__always)
    public static func poll<T>(_ strategy: WaitStrategy, _ poll: () throws -> T?) rethrows -> T? {
        guard strategy.spins else { return nil }
        if let value = try poll() { return value }
        let deadline = monotonicNanoseconds() &+ UInt64(strategy.spinNanoseconds)
        repeat {
            sched_yield()
            if let value = try poll() { return value }
        } while monotonicNanoseconds() < deadline
        return nil
    }
}
