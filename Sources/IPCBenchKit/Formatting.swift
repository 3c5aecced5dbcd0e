import Foundation

/// `4 KiB`, `1 MiB`, `64 B`.
public func formatBytes(_ bytes: Int) -> String {
    if bytes >= 1 << 20, bytes % (1 << 20) == 0 { return "\(bytes >> 20) MiB" }
    if bytes >= 1 << 10, bytes % (1 << 10) == 0 { return "\(bytes >> 10) KiB" }
    return "\(bytes) B"
}

/// Nanoseconds shown as microseconds with one decimal.
public func formatMicroseconds(_ nanoseconds: UInt64) -> String {
    String(format: "%.1f µs", Double(nanoseconds) / 1000)
}
