import CIPCShims
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

/// Context switches (voluntary and involuntary) all threads of a process have made: this
/// process (`getrusage`), or another one of the same user (the sum over
/// `/proc/<pid>/task/*/status`, so threads that already exited are not counted). `nil` if they
/// cannot be read.
public func processContextSwitches(pid: Int32? = nil) -> UInt64? {
    guard let pid else {
        var usage = rusage()
        guard getrusage(RUSAGE_SELF.rawValue, &usage) == 0 else { return nil }
        return UInt64(max(0, usage.ru_nvcsw)) + UInt64(max(0, usage.ru_nivcsw))
    }
    guard let directory = opendir("/proc/\(pid)/task") else { return nil }
    defer { closedir(directory) }
    var total: UInt64 = 0
    while let entry = readdir(directory) {
        let name = withUnsafeBytes(of: entry.pointee.d_name) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
        guard Int32(name) != nil, let status = readSmallFile("/proc/\(pid)/task/\(name)/status") else { continue }
        for line in status.split(separator: "\n") where line.hasPrefix("voluntary_ctxt_switches") || line.hasPrefix("nonvoluntary_ctxt_switches") {
            total += line.split(separator: ":").last.flatMap { UInt64(String($0.filter(\.isNumber))) } ?? 0
        }
    }
    return total
}

/// A small text file from /proc (its first 4 KiB), or `nil`.
public func readSmallFile(_ path: String) -> String? {
    let fd = open(path, O_RDONLY | O_CLOEXEC)
    guard fd >= 0 else { return nil }
    defer { close(fd) }
    var bytes = [UInt8](repeating: 0, count: 4096)
    let count = read(fd, &bytes, bytes.count)
    guard count > 0 else { return nil }
    return String(decoding: bytes[..<count], as: UTF8.self)
}
