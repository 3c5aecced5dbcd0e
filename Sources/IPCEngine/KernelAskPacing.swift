/// When a spinning event loop whose registrations poll themselves asks the kernel's readiness
/// list (`epoll_wait` with no timeout) for everything else: other descriptors, room to write,
/// timers.
///
/// It asks on every 16th spin round at most, and never sooner after its last ask than
/// ``costMultiple`` times what that ask took, up to ``longestGap``. A system call's cost varies
/// by a factor of ten between machines: 0.1–0.2 µs on one without kernel page-table isolation,
/// 1.3–2 µs for an empty `epoll_wait` on an Intel VM with it (and IBRS and MDS buffer clearing)
/// on every entry. Paced by rounds alone, the loop there spent most of a spinning notify
/// connection's spin inside the kernel, and a reply that came meanwhile waited for the call to
/// return before the next poll found it. Paced by their own cost, the asks hold at most about a
/// ninth of the spin wherever it runs, and what only the kernel reports is seen within
/// ``longestGap`` (or 16 spin rounds, if they take longer).
package struct KernelAskPacing {
    /// The gap after an ask, as a multiple of how long it took.
    package static var costMultiple: UInt64 { 8 }
    /// The longest gap (an ask the thread was preempted in does not hold off the next for
    /// longer).
    package static var longestGap: UInt64 { 20_000 }

    /// When the last ask returned, and how long to leave the kernel unasked after it.
    private var lastAskEnded: UInt64 = 0
    private var gap: UInt64 = 0

    package init() {}

    /// Whether to ask the kernel in spin round `round` at monotonic time `now` (nanoseconds).
    @inline(__always)
    package func shouldAsk(round: Int, now: UInt64) -> Bool {
        round & 15 == 0 && now &- lastAskEnded >= gap
    }

    /// Records an ask that started at `start` and returned at `end` (monotonic nanoseconds).
    @inline(__always)
    package mutating func asked(from start: UInt64, to end: UInt64) {
        lastAskEnded = end
        gap = min((end &- start) &* Self.costMultiple, Self.longestGap)
    }
}
