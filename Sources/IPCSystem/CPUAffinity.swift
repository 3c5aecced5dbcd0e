import CIPCShims
import Glibc
import IPCCore
import SystemPackage

/// Core placement: which CPUs a process may run on.
public enum CPUAffinity {
    /// Restricts every thread of the calling process, and the threads they create from now on,
    /// to `cpus`. (`sched_setaffinity` applies to one thread, so each task in `/proc/self/task`
    /// is pinned in turn.)
    /// - Throws: ``IPCError/Code/transportFailure`` if the kernel refuses (for example a CPU that
    ///   does not exist).
    public static func pinCurrentProcess(to cpus: [Int]) throws {
        for thread in threadIDs() {
            try pin(thread: thread, to: cpus)
        }
        try pin(thread: 0, to: cpus)
    }

    private static func pin(thread: pid_t, to cpus: [Int]) throws {
        let values = cpus.map(CInt.init)
        let result = values.withUnsafeBufferPointer { ipc_set_affinity(thread, $0.baseAddress, CInt($0.count)) }
        // A thread that exited since the directory was read is not an error.
        guard result == 0 || errno == ESRCH else {
            throw IPCError.syscall("sched_setaffinity", Errno(rawValue: errno), context: "cpus \(cpus)")
        }
    }

    private static func threadIDs() -> [pid_t] {
        guard let directory = opendir("/proc/self/task") else { return [] }
        defer { closedir(directory) }
        var threads: [pid_t] = []
        while let entry = readdir(directory) {
            let name = withUnsafeBytes(of: entry.pointee.d_name) { raw in
                String(decoding: raw.prefix { $0 != 0 }, as: UTF8.self)
            }
            if let thread = pid_t(name) { threads.append(thread) }
        }
        return threads
    }

    /// The CPUs the calling thread may run on.
    public static func current() -> [Int] {
        var cpus = [CInt](repeating: 0, count: 1024)
        let count = cpus.withUnsafeMutableBufferPointer { ipc_get_affinity(0, $0.baseAddress, CInt($0.count)) }
        return count < 0 ? [] : cpus.prefix(Int(count)).map(Int.init)
    }

    /// The number of CPUs online.
    public static var onlineCount: Int { Int(sysconf(CInt(_SC_NPROCESSORS_ONLN))) }
}
