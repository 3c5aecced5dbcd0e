import Glibc

/// What `/proc/<pid>/stat` says of a process: its state, and when it started. The start time
/// tells a process from a later one that was given the same pid.
package struct ProcessStat: Sendable, Equatable {
    /// The state letter (`R`, `S`, `D`, `Z` for a zombie, `X` for dead, and so on).
    package let state: UInt8
    /// When the process started, in clock ticks after boot (the file's 22nd field).
    package let startTime: UInt64

    /// Whether the process has exited (a zombie, not yet reaped, has).
    package var exited: Bool { state == UInt8(ascii: "Z") || state == UInt8(ascii: "X") }

    /// The stat of process `pid` now, or `nil` if there is none (or its file cannot be read or
    /// parsed: the caller treats that as gone).
    package static func read(pid: Int32) -> ProcessStat? {
        guard pid > 0, let text = readSmallFile("/proc/\(pid)/stat") else { return nil }
        return parse(Array(text.utf8))
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
