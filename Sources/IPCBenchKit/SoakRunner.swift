import Foundation
import IPCConformance
import IPCCore
import IPCEngine
import Synchronization
import IPCFraming

/// What a soak runs: which transports, for how long, and from which seed.
public struct SoakOptions: Sendable {
    public var transports: [String]
    /// Kill cycles in all, shared among the transports in turn; `nil` for no limit.
    public var cycles: Int?
    /// Stop starting cycles after this long; `nil` for no limit. With both limits, the first wins.
    public var duration: Duration?
    /// Fixes each cycle's role, kill point and message mix.
    public var seed: UInt64
    /// How long one cycle may take before the watchdog fails the run.
    public var cycleDeadline: Duration
    /// How soon after the peer's death the survivor must report it.
    public var invalidationDeadline: Duration
    /// The most messages and requests a cycle sends before its kill.
    public var maximumMessages: Int

    public init(
        transports: [String] = TransportCatalog.names,
        cycles: Int? = 1000,
        duration: Duration? = nil,
        seed: UInt64 = UInt64.random(in: 0...UInt64.max),
        cycleDeadline: Duration = .seconds(60),
        invalidationDeadline: Duration = .seconds(10),
        maximumMessages: Int = 200
    ) {
        self.transports = transports
        self.cycles = cycles
        self.duration = duration
        self.seed = seed
        self.cycleDeadline = cycleDeadline
        self.invalidationDeadline = invalidationDeadline
        self.maximumMessages = maximumMessages
    }
}

/// Runs every transport while its peers are killed at random points.
///
/// Each cycle starts a real peer process (`ipcbench peer`), exchanges sequence-numbered
/// one-way messages (which the peer echoes) and requests (which it answers) with it, and
/// SIGKILLs it: after a random number of messages (sometimes with a request left pending), after
/// a random delay while messages flow, or, when the harness serves, while the client peer is
/// still connecting. Cycles alternate, per transport, between killing a server peer the harness
/// is a client of and killing a client peer the harness serves. Each cycle then checks that the
/// connection was invalidated, that a pending request failed with `peerInvalidated`, and that
/// every acknowledged message was delivered exactly once and in order (``DeliveryCheck``).
///
/// Before the first kill cycle, one clean cycle per transport and role (the peer is stopped,
/// not killed, and every message must come back) warms up what a process creates once, and the
/// event loop's transfer ring, which only a frame the loop could not write or read at once
/// would make, is made; the resources are counted after it and again after the run, once every
/// endpoint the run used has been listened on and closed again, as the next listener would (a
/// killed server cannot remove its endpoint; its successor reclaims it). Any difference is a
/// leak.
///
/// Each cycle runs on a thread of its own under a watchdog: a cycle that takes longer than
/// ``SoakOptions/cycleDeadline`` ends the run with a ``SoakHang`` naming the transport, cycle
/// and what it was doing.
public struct SoakRunner: Sendable {
    public var options: SoakOptions
    public var progress: ProgressReporter

    public init(options: SoakOptions, progress: ProgressReporter) {
        self.options = options
        self.progress = progress
    }

    /// - Throws: what ``PeerProcess/executableURL()`` throws, or a failure to create the group
    ///   directory; everything else is reported in the ``SoakReport``.
    public func run() async throws -> SoakReport {
        let group = try TemporaryGroup()
        defer { group.remove() }
        let context = SoakCycle.Context(executable: try PeerProcess.executableURL(), group: group.directory, options: options)
        var results = options.transports.map(SoakTransportResult.init(transport:))
        var failures: [String] = []
        var hang: SoakHang?

        progress.note("soak: seed \(options.seed); warm-up: one clean cycle per transport and role")
        warmUp: for (position, transport) in options.transports.enumerated() {
            for role in SoakRole.allCases {
                let plan = SoakCyclePlan(transport: transport, index: 0, role: role, kill: .none, seed: options.seed)
                switch await Self.run(plan, context: context) {
                case .finished(let outcome):
                    results[position].errors += outcome.violations
                    if outcome.violations > 0 { failures.append(outcome.describe(plan)) }
                case .hung(let phase):
                    hang = SoakHang(transport: transport, cycle: 0, role: role.rawValue, phase: phase, deadlineSeconds: options.cycleDeadline.secondsValue)
                    break warmUp
                }
            }
        }

        // The loop's transfer ring is made once, at the first frame whose rest the loop hands to
        // the kernel, which a warm-up cycle may not send: made now, it is counted before.
        if let loop = try? EventLoop.shared() { await loop.makeTransferRingNow() }
        let before = SoakCensus.settled(group: group.directory)
        let start = ContinuousClock.now
        var lastNote = start
        var index = 0
        var stoppedBy = hang == nil ? "" : "a hang"
        while hang == nil {
            if let cycles = options.cycles, index >= cycles {
                stoppedBy = "--cycles"
                break
            }
            if let duration = options.duration, ContinuousClock.now - start >= duration {
                stoppedBy = "--duration"
                break
            }
            index += 1
            let plan = SoakCyclePlan.make(index: index, options: options)
            let position = (index - 1) % options.transports.count
            switch await Self.run(plan, context: context) {
            case .finished(let outcome):
                results[position].record(outcome, plan: plan)
                if outcome.violations > 0, failures.count < 50 { failures.append(outcome.describe(plan)) }
            case .hung(let phase):
                hang = SoakHang(transport: plan.transport, cycle: index, role: plan.role.rawValue, phase: phase, deadlineSeconds: options.cycleDeadline.secondsValue)
                stoppedBy = "a hang"
            }
            let now = ContinuousClock.now
            let violations = results.reduce(0) { $0 + $1.violations }
            progress.update(label: "soak: cycle \(index), \(violations) violation(s)", fraction: options.cycles.map { Double(index) / Double(max($0, 1)) } ?? ((now - start) / (options.duration ?? .seconds(1))))
            if now - lastNote >= .seconds(15) {
                lastNote = now
                progress.end(label: "soak", summary: "\(index) cycles in \(Int((now - start).secondsValue)) s, \(violations) violation(s)")
            }
        }
        let elapsed = (ContinuousClock.now - start).secondsValue

        var resources: [SoakResourceCount] = []
        if let hang {
            failures.append("\(hang.transport) cycle \(hang.cycle) (\(hang.role)) hung: \(hang.phase); resources not counted")
        } else {
            Self.reclaimEndpoints(context)
            resources = SoakCensus.compare(before, SoakCensus.settled(group: group.directory, baseline: before))
        }
        progress.end(label: "soak", summary: "\(index) cycles in \(Int(elapsed)) s")
        return SoakReport(seed: options.seed, transports: results, resources: resources, hang: hang, failures: failures, elapsedSeconds: elapsed, stoppedBy: stoppedBy)
    }

    /// Listens on every endpoint the run used and closes again: what the next listener on each
    /// would do, reclaiming what killed servers (and clients killed while connecting) left.
    private static func reclaimEndpoints(_ context: SoakCycle.Context) {
        for name in context.options.transports {
            guard let transport = try? TransportCatalog.transport(named: name, framing: .binary) else { continue }
            for role in SoakRole.allCases {
                guard let endpoint = try? context.endpoint(name, role) else { continue }
                (try? transport.listen(at: endpoint, options: .defaults, acceptFilter: nil))?.close()
            }
        }
    }

    /// Runs one cycle on a thread of its own, under the watchdog.
    static func run(_ plan: SoakCyclePlan, context: SoakCycle.Context) async -> CycleResult {
        let cycle = SoakCycle(plan: plan, context: context)
        if let outcome = await runOnThread(within: context.options.cycleDeadline, cycle.run) {
            return .finished(outcome)
        }
        let phase = cycle.phase
        // Unblock what waits on the peer, so the abandoned cycle's thread can finish.
        cycle.killPeer()
        return .hung(phase: phase)
    }

    enum CycleResult {
        case finished(CycleOutcome)
        case hung(phase: String)
    }
}

/// Runs `body` on a thread of its own (``IPCCore/runBlocking(_:)``) and returns its result, or
/// `nil` if it has not finished within `deadline` (it is then left running).
func runOnThread<T: Sendable>(within deadline: Duration, _ body: @escaping @Sendable () -> T) async -> T? {
    let slot = ResumeOnce<T?>()
    return await withCheckedContinuation { continuation in
        slot.set(continuation)
        Task { slot.resume(returning: try? await runBlocking(body)) }
        Task {
            try? await Task.sleep(for: deadline)
            slot.resume(returning: nil)
        }
    }
}

/// A continuation that the first of several callers resumes.
final class ResumeOnce<T: Sendable>: Sendable {
    private let continuation = Mutex<CheckedContinuation<T, Never>?>(nil)

    func set(_ value: CheckedContinuation<T, Never>) {
        continuation.withLock { $0 = value }
    }

    func resume(returning value: T) {
        continuation.withLock { $0.take() }?.resume(returning: value)
    }
}

/// Which side the harness takes in a cycle, and so which peer is killed.
enum SoakRole: String, CaseIterable, Sendable {
    /// The peer serves, the harness connects; the server peer is killed.
    case peerServes = "server peer killed"
    /// The harness serves, the peer connects; the client peer is killed.
    case harnessServes = "client peer killed"

    var shortName: String { self == .peerServes ? "ps" : "hs" }
}

/// Where a cycle kills its peer.
enum SoakKillPoint: Sendable, Equatable, CustomStringConvertible {
    /// After this many messages and requests; with `stallFirst`, a request the peer never
    /// answers is pending at the kill.
    case afterMessages(Int, stallFirst: Bool)
    /// After this many milliseconds, from another thread, while messages flow.
    case afterDelay(milliseconds: Int)
    /// This many milliseconds after starting a client peer, before waiting for it to connect.
    case duringConnect(milliseconds: Int)
    /// Not at all: a clean cycle, whose peer is stopped once every message came back.
    case none

    var description: String {
        switch self {
        case .afterMessages(let count, let stall): "kill after \(count) messages\(stall ? " with a request pending" : "")"
        case .afterDelay(let milliseconds): "kill after \(milliseconds) ms"
        case .duringConnect(let milliseconds): "kill \(milliseconds) ms into connecting"
        case .none: "clean stop"
        }
    }
}

/// One cycle, as the seed chooses it.
struct SoakCyclePlan: Sendable {
    var transport: String
    /// 1 for the first kill cycle; 0 for warm-up.
    var index: Int
    var role: SoakRole
    var kill: SoakKillPoint
    /// Seeds the cycle's choice between one-way messages and requests.
    var seed: UInt64

    /// Cycle `index`: transports in turn, and for each transport the roles in turn.
    static func make(index: Int, options: SoakOptions) -> SoakCyclePlan {
        var random = SoakRandom(seed: options.seed ^ (UInt64(index) &* 0xD1B5_4A32_D192_ED03))
        let count = options.transports.count
        let role: SoakRole = ((index - 1) / count) % 2 == 0 ? .peerServes : .harnessServes
        let roll = Int.random(in: 0..<100, using: &random)
        let kill: SoakKillPoint
        if role == .harnessServes, roll < 15 {
            kill = .duringConnect(milliseconds: Int.random(in: 0...40, using: &random))
        } else if roll < 60 {
            kill = .afterMessages(Int.random(in: 0...options.maximumMessages, using: &random), stallFirst: Bool.random(using: &random))
        } else {
            kill = .afterDelay(milliseconds: Int.random(in: 0...30, using: &random))
        }
        return SoakCyclePlan(transport: options.transports[(index - 1) % count], index: index, role: role, kill: kill, seed: random.next())
    }
}

/// SplitMix64: small, fast, and the same sequence on every platform for a seed.
struct SoakRandom: RandomNumberGenerator {
    private var state: UInt64

    init(seed: UInt64) {
        state = seed
    }

    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}

extension Duration {
    var secondsValue: Double { self / .seconds(1) }
}
