public import IPCFraming

/// One-way throughput of one transport (or native floor), framing, placement, wait strategy and
/// payload size: messages sent back to back, timed from the first send until the receiving
/// process reports that its consumer has taken every one of them (``IPCConformance/ConformancePeer/Sink``).
public struct ThroughputResult: Codable, Sendable {
    public var transport: String
    public var framing: Framing?
    public var placement: Placement
    /// `blocking` or `spin-then-block`, or `spin` for a spinning reference system's rows
    /// (``ReferenceSystem/spinWaitStrategy``).
    public var waitStrategy: String
    public var payloadBytes: Int
    /// Messages per repetition, and the repetitions' rates (messages per second), in run order.
    public var messagesPerRepetition: Int
    public var repetitionMessagesPerSecond: [Double]
    /// The median repetition's rate, and the payload bytes per second it carried.
    public var messagesPerSecond: Double
    public var bytesPerSecond: Double
    /// CPU time this process and the receiver used per message, in nanoseconds.
    public var localCPUPerMessage: Double?
    public var peerCPUPerMessage: Double?
    /// Context switches of this process and of the receiver per message (voluntary and
    /// involuntary, all threads); absent in results written before they were counted.
    public var localContextSwitchesPerMessage: Double? = nil
    public var peerContextSwitchesPerMessage: Double? = nil
    /// Heap allocations per message on the receiver's receive path (its handler's thread), when
    /// the receiver counts them (`ipcbench peer` does; a native floor's C receiver does not).
    public var peerAllocationsPerMessage: Double? = nil
    /// `true` for a reference system's row (``LatencyResult/reference``), absent otherwise.
    public var reference: Bool? = nil
    /// The executor the sending task ran on, as ``LatencyResult/executor``: `preferred` (the
    /// connection's), `global` (Swift's global executor, for comparison), absent for a
    /// connection without one, for floors and references, and in results written before
    /// streams were measured on both.
    public var executor: String? = nil
    /// How the receiving peer served, as ``LatencyResult/handler``.
    public var handler: String? = nil
    /// For a batched stream: the messages sent at a time, with one
    /// ``IPCCore/MessageConnection/send(contentsOf:msgid:timeout:)`` (one gathering write a batch
    /// where the transport has one); absent for the per-message streams.
    public var batch: Int? = nil

    /// The middle half of the repetitions' rates, the report's spread: the rates as far from the
    /// slowest and from the fastest, a quarter of the way in (`sorted[n / 4]` and
    /// `sorted[n - 1 - n / 4]`: with ten, the third and the eighth, as ``messagesPerSecond`` is
    /// `sorted[n / 2]`); `nil` with fewer than four repetitions.
    public var repetitionQuartiles: (lower: Double, upper: Double)? {
        guard repetitionMessagesPerSecond.count >= 4 else { return nil }
        let sorted = repetitionMessagesPerSecond.sorted()
        return (sorted[sorted.count / 4], sorted[sorted.count - 1 - sorted.count / 4])
    }

    /// Whether the messages were sent from the global executor although the transport offers its own.
    public var onGlobalExecutor: Bool { executor == LatencyResult.globalExecutor }

    /// Whether the peer served with the on-loop fast path (``LatencyResult/handler``).
    public var onLoopHandler: Bool { handler == LatencyResult.onLoopHandler }

    /// The wait strategy, and the executor and handler when they are not the main ones: the
    /// report's `wait` column.
    public var waitDescription: String {
        waitStrategy + (onGlobalExecutor ? ", global executor" : "") + (LatencyResult.handlerVariant(handler).map { ", \($0) handler" } ?? "")
            + (batch.map { ", batched by \($0)" } ?? "")
    }

    /// A stable name:
    /// `throughput/<transport>[/<framing>]/<placement>[/spin-then-block][/global-executor][/<handler>-handler][/batched-<n>]/<bytes>`.
    public var name: String {
        (["throughput", transport] + (framing.map { [$0.rawValue] } ?? []) + [placement.rawValue]
            + (waitStrategy == "blocking" ? [] : [waitStrategy]) + (onGlobalExecutor ? ["global-executor"] : [])
            + (LatencyResult.handlerVariant(handler).map { ["\($0)-handler"] } ?? []) + (batch.map { ["batched-\($0)"] } ?? []) + [String(payloadBytes)]).joined(separator: "/")
    }

    /// Both processes' context switches per message.
    public var contextSwitchesPerMessage: Double? {
        localContextSwitchesPerMessage.flatMap { local in peerContextSwitchesPerMessage.map { local + $0 } }
    }

    /// The native floor's stream this measurement is compared with (same mechanism, placement
    /// and payload, blocking, one message a write), from one run's rows; `nil` where the
    /// mechanism has none.
    public func floor(in results: [ThroughputResult]) -> ThroughputResult? {
        guard let mechanism = FloorMechanism(transport: transport) else { return nil }
        return results.first { $0.transport == mechanism.resultName && $0.batch == nil && $0.placement == placement && $0.payloadBytes == payloadBytes && $0.waitStrategy == "blocking" }
    }

    /// The fastest event-driven C stream of this blocking measurement's mechanism in the run,
    /// same placement and payload: of its ``FloorMechanism/sameWorkFloors``, the streams sent one
    /// message a write (for unix-socket, writes that do not block and an `epoll_wait` before
    /// each read, or the same through io_uring); `nil` where there is none. The report's
    /// `÷ best event-driven`, for every row, batched or not.
    public func bestEventDrivenFloor(in results: [ThroughputResult]) -> ThroughputResult? {
        guard waitStrategy == "blocking", let mechanisms = FloorMechanism(transport: transport)?.sameWorkFloors else { return nil }
        return mechanisms.compactMap { mechanism in
            results.first { $0.transport == mechanism.resultName && $0.batch == nil && $0.placement == placement && $0.payloadBytes == payloadBytes }
        }.max { $0.messagesPerSecond < $1.messagesPerSecond }
    }

    /// The floor stream that does the kernel work this blocking measurement does, same placement
    /// and payload: for a batched row of a mechanism that has a batched floor
    /// (``FloorMechanism/batchedSameWork``), that floor's stream with the same ``batch`` (for
    /// unix-socket, `floor:unix-stream+epoll` writing `batch` messages in one `sendmsg`), else
    /// ``bestEventDrivenFloor(in:)``; `nil` where the run has none (a batched row's is never a
    /// per-message floor).
    public func sameWorkFloor(in results: [ThroughputResult]) -> ThroughputResult? {
        guard let batch, waitStrategy == "blocking", let mechanism = FloorMechanism(transport: transport)?.batchedSameWork else { return bestEventDrivenFloor(in: results) }
        return results.first { $0.transport == mechanism.resultName && $0.batch == batch && $0.placement == placement && $0.payloadBytes == payloadBytes }
    }
}

/// Collects the repetitions of one throughput measurement.
struct ThroughputAccumulator {
    private var rates: [Double] = []
    private var messages = 0
    private var cpu = CPUTotals()
    /// Allocations the receiver reported and the messages they cover; `nil` once a repetition
    /// came without a count.
    private var allocations: (count: UInt64, messages: Int)? = (0, 0)

    /// Adds a repetition: `count` messages in `nanoseconds`, the CPU times read around it, and
    /// the receiver's allocations while taking them (`nil` if not counted).
    mutating func record(count: Int, nanoseconds: UInt64, cpuBefore: CPUReading, cpuAfter: CPUReading, peerAllocations: UInt64? = nil) {
        rates.append(Double(count) / (Double(max(1, nanoseconds)) / 1e9))
        messages += count
        cpu.add(from: cpuBefore, to: cpuAfter)
        if let peerAllocations, let sum = allocations {
            allocations = (sum.count + peerAllocations, sum.messages + count)
        } else {
            allocations = nil
        }
    }

    func result(transport: String, framing: Framing?, placement: Placement, waitStrategy: String, executor: String? = nil, handler: String? = nil, payloadBytes: Int) -> ThroughputResult {
        let median = rates.isEmpty ? 0 : rates.sorted()[rates.count / 2]
        let perMessage = cpu.perOperation(messages)
        let switches = cpu.switchesPerOperation(messages)
        return ThroughputResult(
            transport: transport, framing: framing, placement: placement, waitStrategy: waitStrategy,
            payloadBytes: payloadBytes, messagesPerRepetition: messages / max(1, rates.count),
            repetitionMessagesPerSecond: rates, messagesPerSecond: median, bytesPerSecond: median * Double(payloadBytes),
            localCPUPerMessage: perMessage.local, peerCPUPerMessage: perMessage.peer,
            localContextSwitchesPerMessage: switches.local, peerContextSwitchesPerMessage: switches.peer,
            peerAllocationsPerMessage: allocations.flatMap { $0.messages > 0 ? Double($0.count) / Double($0.messages) : nil },
            executor: executor,
            handler: handler
        )
    }
}
