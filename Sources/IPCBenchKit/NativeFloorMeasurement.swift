import Histogram
import IPCCore
import IPCFraming
import IPCSystem

/// Measuring native floors on their own. ``LatencyRunner`` can measure them in its own sweep
/// with ``FloorSession`` and ``LatencyAccumulator`` instead, interleaved with the transports.
public enum NativeFloor {
    /// The largest payload a floor peer is started for unless a larger one is asked for: the
    /// largest of the default run.
    public static let defaultMaximumPayload = 1 << 20

    /// Measures the native floor of `mechanism` as ``LatencyRunner`` measures a transport: a
    /// peer process placed as `placement` says, `samples` round trips of `payloadSize` bytes taken
    /// in ``LatencyResult/repetitions`` blocks, each block after its share of `warmup` unmeasured
    /// round trips, timed with the same clock into the same kind of histogram, with the CPU time
    /// of both processes. The result's transport is ``FloorMechanism/resultName``
    /// (`floor:unix-stream`, ...).
    /// - Throws: ``IPCError`` if the peer cannot be started or a round trip fails.
    public static func measure(
        _ mechanism: FloorMechanism,
        placement: Placement,
        payloadSize: Int,
        samples: Int,
        warmup: Int
    ) async throws -> LatencyResult {
        let group = try TemporaryGroup()
        defer { group.remove() }
        let session = try FloorSession(mechanism: mechanism, placement: placement, group: group.directory, maximumPayload: max(payloadSize, defaultMaximumPayload))
        defer { session.close() }
        let repetitions = LatencyResult.repetitions
        let blockWarmup = max(2, warmup / repetitions)
        var accumulator = LatencyAccumulator()
        for _ in 0..<repetitions {
            _ = try await session.roundTripTimes(payloadSize: payloadSize, count: blockWarmup)
            let before = CPUReading(peer: session.peerPID)
            let times = try await session.roundTripTimes(payloadSize: payloadSize, count: max(1, samples / repetitions))
            let after = CPUReading(peer: session.peerPID)
            accumulator.record(block: times, cpuBefore: before, cpuAfter: after)
        }
        // A spinning floor is filed with the spinning rows (it never blocks at all).
        return accumulator.result(
            transport: mechanism.resultName, framing: nil, placement: placement, waitStrategy: mechanism.spins ? .spinThenBlock() : .blocking,
            payloadBytes: payloadSize, warmup: blockWarmup * repetitions
        )
    }
}

/// The CPU time this process and a peer process have used so far (`nil` where unreadable).
struct CPUReading {
    let local: UInt64?
    let peer: UInt64?
    /// Context switches of this process and of the peer, all threads.
    let localSwitches: UInt64?
    let peerSwitches: UInt64?

    init(local: UInt64?, peer: UInt64?, localSwitches: UInt64?, peerSwitches: UInt64?) {
        self.local = local
        self.peer = peer
        self.localSwitches = localSwitches
        self.peerSwitches = peerSwitches
    }

    init(peer pid: Int32) {
        local = processCPUNanoseconds()
        peer = processCPUNanoseconds(pid: pid)
        localSwitches = processContextSwitches()
        peerSwitches = processContextSwitches(pid: pid)
    }
}

/// CPU time of this process and of a peer, summed over measured intervals; `nil` once unreadable.
struct CPUTotals {
    private var local: UInt64? = 0
    private var peer: UInt64? = 0
    private var localSwitches: UInt64? = 0
    private var peerSwitches: UInt64? = 0

    mutating func add(from before: CPUReading, to after: CPUReading) {
        func add(_ total: UInt64?, _ before: UInt64?, _ after: UInt64?) -> UInt64? {
            guard let total, let before, let after else { return nil }
            // A peer's context switches are summed over its live threads, so a thread that exits
            // within the interval takes its count with it and the sum can go down: that interval
            // then adds nothing (an undercount, never a trap).
            return total + (after >= before ? after - before : 0)
        }
        local = add(local, before.local, after.local)
        peer = add(peer, before.peer, after.peer)
        localSwitches = add(localSwitches, before.localSwitches, after.localSwitches)
        peerSwitches = add(peerSwitches, before.peerSwitches, after.peerSwitches)
    }

    /// Nanoseconds per operation, over `count` operations.
    func perOperation(_ count: Int) -> (local: Double?, peer: Double?) {
        let count = Double(max(1, count))
        return (local.map { Double($0) / count }, peer.map { Double($0) / count })
    }

    /// Context switches per operation, over `count` operations.
    func switchesPerOperation(_ count: Int) -> (local: Double?, peer: Double?) {
        let count = Double(max(1, count))
        return (localSwitches.map { Double($0) / count }, peerSwitches.map { Double($0) / count })
    }
}

/// The samples of one measurement as they come in, in blocks, and the ``LatencyResult`` they make.
struct LatencyAccumulator {
    private var histogram = Histogram<UInt64>(highestTrackableValue: 60_000_000_000, numberOfSignificantValueDigits: .three)
    private var blockMedians: [UInt64] = []
    private var samples = 0
    /// CPU time of this process and of the peer over the recorded blocks.
    private var cpu = CPUTotals()

    /// Adds a block of round-trip times in nanoseconds, and the CPU times read around it.
    mutating func record(block times: [UInt64], cpuBefore: CPUReading, cpuAfter: CPUReading) {
        guard !times.isEmpty else { return }
        for time in times { _ = histogram.record(time) }
        blockMedians.append(LatencyResult.median(times))
        samples += times.count
        cpu.add(from: cpuBefore, to: cpuAfter)
    }

    func result(transport: String, framing: Framing?, placement: Placement, waitStrategy: WaitStrategy = .blocking, executor: String? = nil, handler: String? = nil, payloadBytes: Int, warmup: Int) -> LatencyResult {
        let perRoundTrip = cpu.perOperation(samples)
        let switches = cpu.switchesPerOperation(samples)
        return LatencyResult(
            transport: transport,
            framing: framing,
            placement: placement,
            waitStrategy: waitStrategy.name,
            executor: executor,
            handler: handler,
            payloadBytes: payloadBytes,
            warmup: warmup,
            samples: samples,
            minimum: histogram.min,
            p50: histogram.valueAtPercentile(50),
            p90: histogram.valueAtPercentile(90),
            p99: histogram.valueAtPercentile(99),
            p999: histogram.valueAtPercentile(99.9),
            maximum: histogram.max,
            mean: histogram.mean,
            standardDeviation: histogram.stdDeviation,
            repetitionMedians: blockMedians,
            localCPUPerRoundTrip: perRoundTrip.local,
            peerCPUPerRoundTrip: perRoundTrip.peer,
            localContextSwitchesPerRoundTrip: switches.local,
            peerContextSwitchesPerRoundTrip: switches.peer
        )
    }
}
