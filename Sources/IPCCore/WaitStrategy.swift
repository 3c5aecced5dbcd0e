/// How a connection waits for its peer.
///
/// Blocking puts the waiting thread to sleep in the kernel at once; the peer's message then costs
/// a wake-up, which dominates a small round trip when the two processes run on different cores.
/// Spin-then-block polls without sleeping for at most ``spinDuration`` first (each poll is a
/// non-blocking system call or a load from shared memory), and blocks only if nothing arrived
/// by then.
///
/// Spinning buys latency with CPU time: a spinning receiver burns its core for up to the spin
/// time after every message. It pays only when the peer runs on another core; when both
/// processes share one core, the spinner delays the very peer it waits for. The harness never
/// spins with both processes on one core, and a transport that has no way to poll ignores the
/// strategy (``TransportCapabilities/supportsSpinning``).
public struct WaitStrategy: Sendable, Hashable, Codable, CustomStringConvertible {
    /// ``spinDuration`` in nanoseconds: what the spin loops compare with the monotonic clock
    /// (and the key the strategy is encoded under).
    package var spinNanoseconds: Int64

    /// Polls for `spin` before blocking; `.zero` blocks at once.
    /// - Precondition: `spin` is not negative.
    public init(spinFor spin: Duration) {
        precondition(spin >= .zero, "a spin time cannot be negative")
        spinNanoseconds = Int64(clamping: spin.wholeNanoseconds)
    }

    /// How long to poll before blocking (to the nanosecond); `.zero` blocks at once.
    public var spinDuration: Duration {
        get { .nanoseconds(spinNanoseconds) }
        set { self = WaitStrategy(spinFor: newValue) }
    }

    /// Block at once.
    public static let blocking = WaitStrategy(spinFor: .zero)

    /// Poll for `spin` (50 µs by default) before blocking.
    public static func spinThenBlock(_ spin: Duration = .microseconds(50)) -> WaitStrategy {
        WaitStrategy(spinFor: max(.zero, spin))
    }

    public var spins: Bool { spinNanoseconds > 0 }

    /// `blocking`, or `spin-then-block` (a name for reports and result files).
    public var name: String { spins ? "spin-then-block" : "blocking" }

    public var description: String { spins ? "spin-then-block (\(spinNanoseconds / 1000) µs)" : "blocking" }
}
