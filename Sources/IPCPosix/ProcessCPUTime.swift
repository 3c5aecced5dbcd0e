import Glibc

/// CPU time (user + system) a process has used, in nanoseconds: this process, or another one of
/// the same user through its CPU-time clock (`clock_getcpuclockid`). `nil` if the process is gone.
public func processCPUNanoseconds(pid: Int32? = nil) -> UInt64? {
    var clock = CLOCK_PROCESS_CPUTIME_ID
    if let pid, clock_getcpuclockid(pid, &clock) != 0 { return nil }
    var time = timespec()
    guard clock_gettime(clock, &time) == 0 else { return nil }
    return UInt64(time.tv_sec) * 1_000_000_000 + UInt64(time.tv_nsec)
}
