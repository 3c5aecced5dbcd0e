import Glibc

/// What `/proc/<pid>/stat` says of a process: its state, and when it started. The start time
/// tells a process from a later one that was given the same pid.
package struct ProcessStat: Sendable, Equatable {
    /// The state letter (`R`, `S`, `D`, `Z` for a zombie, `X` for dead, and so on).
    package let state: UInt8
    /// When the process started, in clock ticks after boot (the file's 22nd field).
    package let startTime: UInt64
    /// Whether other threads of the process still run although the state, which is its main
    /// thread's, says zombie: the main thread ended (`pthread_exit`) before them. Read from
    /// `/proc/<pid>/status` (`Threads:` above 1) by ``read(pid:)``, only for a zombie.
    package let threadsRunOn: Bool

    package init(state: UInt8, startTime: UInt64, threadsRunOn: Bool = false) {
        self.state = state
        self.startTime = startTime
        self.threadsRunOn = threadsRunOn
    }

    /// Whether the process has exited: every thread of it has ended (a zombie, not yet reaped,
    /// has), as a pidfd reports it. A process whose main thread alone has ended has not.
    package var exited: Bool { (state == UInt8(ascii: "Z") || state == UInt8(ascii: "X")) && !threadsRunOn }

    /// What reading a process's stat file found.
    package enum Reading: Sendable, Equatable {
        /// The process, as its file says.
        case found(ProcessStat)
        /// No such process (no file, or one that vanished while being read).
        case gone
        /// The file could not be opened for another reason (a full descriptor table), or did not
        /// parse: this says nothing of the process.
        case unknown
    }

    /// The stat of process `pid` now.
    package static func read(pid: Int32) -> Reading {
        guard pid > 0 else { return .gone }
        let fd = open("/proc/\(pid)/stat", O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return errno == ENOENT || errno == ESRCH ? .gone : .unknown }
        defer { close(fd) }
        var bytes = [UInt8](repeating: 0, count: 1024)
        let count = bytes.withUnsafeMutableBytes { Glibc.read(fd, $0.baseAddress, $0.count) }
        // A process that exits while its file is open reads as an error (ESRCH) or nothing.
        guard count > 0 else { return count == 0 || errno == ESRCH ? .gone : .unknown }
        guard let stat = parse(Array(bytes[..<count])) else { return .unknown }
        guard stat.state == UInt8(ascii: "Z") else { return .found(stat) }
        // The main thread's state: the others may still run. A count that cannot be read is
        // taken as none (the process was a zombie a moment ago, and may be gone by now).
        let threads = threadCount(pid: pid) ?? 1
        return .found(ProcessStat(state: stat.state, startTime: stat.startTime, threadsRunOn: threads > 1))
    }

    /// The `Threads:` count of `/proc/<pid>/status`: the process's threads that have not ended
    /// (a zombie whose threads have all ended counts 1, itself).
    private static func threadCount(pid: Int32) -> Int? {
        let fd = open("/proc/\(pid)/status", O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return nil }
        defer { close(fd) }
        var bytes = [UInt8](repeating: 0, count: 4096)
        let count = bytes.withUnsafeMutableBytes { Glibc.read(fd, $0.baseAddress, $0.count) }
        guard count > 0 else { return nil }
        let key = Array("Threads:".utf8)
        for line in bytes[..<count].split(separator: UInt8(ascii: "\n")) where line.starts(with: key) {
            return Int(String(decoding: line.dropFirst(key.count).filter { $0 != UInt8(ascii: " ") && $0 != UInt8(ascii: "\t") }, as: UTF8.self))
        }
        return nil
    }

    /// Parses a stat line. The command name, in parentheses, may itself hold spaces and `) `:
    /// the fields are counted from the last `)`.
    package static func parse(_ line: [UInt8]) -> ProcessStat? {
        guard let close = line.lastIndex(of: UInt8(ascii: ")")) else { return nil }
        let fields = line[(close + 1)...].split(separator: UInt8(ascii: " "), omittingEmptySubsequences: true)
        // fields[0] is field 3 (the state); field 22 (the start time) is fields[19].
        guard fields.count > 19, fields[0].count == 1, let state = fields[0].first,
              let startTime = UInt64(String(decoding: fields[19], as: UTF8.self)) else { return nil }
        return ProcessStat(state: state, startTime: startTime)
    }
}
