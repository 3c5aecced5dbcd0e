extension Duration {
    /// This duration in whole nanoseconds, clamped to zero and above, and to about 285 years
    /// (9 × 10^18 ns) below: for deadlines in the engine's `monotonicNanoseconds()` (now plus
    /// this never wraps) and for the integer timeouts of system calls (a `Duration` at the
    /// public boundary, nanoseconds below it).
    package var wholeNanoseconds: UInt64 {
        let (seconds, attoseconds) = components
        guard seconds < 9_000_000_000 else { return 9_000_000_000 * 1_000_000_000 }
        return UInt64(clamping: max(0, seconds)) &* 1_000_000_000 &+ UInt64(clamping: max(0, attoseconds / 1_000_000_000))
    }
}
