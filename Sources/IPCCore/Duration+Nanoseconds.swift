extension Duration {
    /// This duration in whole nanoseconds, clamped to zero and above: for deadlines in the
    /// engine's `monotonicNanoseconds()` and for the integer timeouts of system calls (a
    /// `Duration` at the public boundary, nanoseconds below it).
    package var wholeNanoseconds: UInt64 {
        let (seconds, attoseconds) = components
        return UInt64(clamping: max(0, seconds)) &* 1_000_000_000 &+ UInt64(clamping: max(0, attoseconds / 1_000_000_000))
    }
}
