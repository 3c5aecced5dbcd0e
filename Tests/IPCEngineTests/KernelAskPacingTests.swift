import IPCEngine
import Testing

/// When a spinning loop asks the kernel's readiness list (KernelAskPacing): on every 16th spin
/// round at most, and no sooner after an ask than eight times what it took, up to 20 µs. The
/// times are given, not read from a clock.
@Suite("Engine: pacing a spinning loop's asks of the kernel")
struct KernelAskPacingTests {
    /// The rounds from `rounds` in which `pacing` asks at time `now`.
    static func due(_ pacing: KernelAskPacing, rounds: ClosedRange<Int>, now: UInt64) -> [Int] {
        rounds.filter { pacing.shouldAsk(round: $0, now: now) }
    }

    @Test("before the first ask: every 16th round, and only those")
    func everySixteenthRound() {
        let pacing = KernelAskPacing()
        #expect(Self.due(pacing, rounds: 1...64, now: 1_000_000) == [16, 32, 48, 64])
    }

    @Test("an ask that took 1.5 µs (a VM with page-table isolation) leaves the kernel unasked for 12 µs")
    func slowAskWidensTheGap() {
        var pacing = KernelAskPacing()
        pacing.asked(from: 1_000_000, to: 1_001_500)
        #expect(Self.due(pacing, rounds: 17...64, now: 1_001_500).isEmpty)
        #expect(Self.due(pacing, rounds: 17...64, now: 1_013_499).isEmpty)
        #expect(Self.due(pacing, rounds: 17...64, now: 1_013_500) == [32, 48, 64])
    }

    @Test("an ask that took 0.1 µs: the next 16th round asks once 0.8 µs have passed")
    func fastAskKeepsTheRoundPace() {
        var pacing = KernelAskPacing()
        pacing.asked(from: 5_000, to: 5_100)
        #expect(!pacing.shouldAsk(round: 32, now: 5_899))
        #expect(pacing.shouldAsk(round: 32, now: 5_900))
        #expect(!pacing.shouldAsk(round: 33, now: 9_000))
    }

    @Test("an ask the thread was preempted in (1 ms) leaves the kernel unasked for 20 µs at most")
    func gapIsBounded() {
        var pacing = KernelAskPacing()
        pacing.asked(from: 0, to: 1_000_000)
        #expect(!pacing.shouldAsk(round: 16, now: 1_019_999))
        #expect(pacing.shouldAsk(round: 16, now: 1_020_000))
        #expect(KernelAskPacing.longestGap == 20_000 && KernelAskPacing.costMultiple == 8)
    }

    @Test("each ask sets the gap anew: a fast one after a slow one narrows it again")
    func eachAskSetsTheGap() {
        var pacing = KernelAskPacing()
        pacing.asked(from: 0, to: 2_000)
        #expect(!pacing.shouldAsk(round: 16, now: 10_000))
        pacing.asked(from: 20_000, to: 20_200)
        #expect(pacing.shouldAsk(round: 16, now: 21_800))
    }
}
