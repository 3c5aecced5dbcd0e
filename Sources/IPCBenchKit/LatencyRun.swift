import CIPCShims
import Foundation
public import IPCConformance
public import IPCCore
import IPCEngine
public import IPCFraming
import IPCSystem
import Synchronization

/// What a cross-process run measures: round-trip latency and one-way throughput.
public struct LatencyPlan: Sendable {
    public var transports: [String]
    public var framings: [Framing]
    public var placements: [Placement]
    public var payloadSizes: [Int]
    /// Multiplies the default sample counts (``samples(forPayload:)``); 0.05 makes a smoke run.
    public var sampleScale: Double
    /// Also measure the native floor (``FloorMechanism``) under each transport, in the same run
    /// and placements, so each transport can be reported as a multiple of its floor.
    public var includeFloors: Bool
    /// Wait strategies to measure. Spin-then-block is measured only where it can pay: with the
    /// processes on different cores, for transports that support it
    /// (``IPCCore/TransportCapabilities/supportsSpinning``). Never with both on one core.
    public var waitStrategies: [WaitStrategy]
    /// Also measure one-way throughput for each payload size.
    public var includeThroughput: Bool
    /// Besides the hop-free path (the harness's requests run on the connection's
    /// ``IPCCore/MessageConnection/preferredTaskExecutor``), also measure what a task gets by
    /// default, resumed on Swift's global executor: blocking, binary framing, for the transports
    /// that have a preferred executor.
    public var includeGlobalExecutor: Bool
    /// Besides the main rows, whose peer serves with the async request handler (tasks off its
    /// loop, what users are told to use), also measure the on-loop fast path
    /// (``IPCCore/ConnectionOptions/onLoopRequestHandler``) against a peer of its own: blocking,
    /// binary framing (``LatencyResult/handler``).
    public var includeOnLoopHandler: Bool
    /// How the main rows' peer serves: ``ConformancePeer/Configuration/Serving/task`` (the
    /// default) or ``ConformancePeer/Configuration/Serving/taskOnLoop``.
    public var mainServing: ConformancePeer.Serving
    /// Reference systems (D-Bus, ZeroMQ, gRPC, SwiftNIO, iceoryx) to measure beside the
    /// transports, in the first blocking phase's sweeps, and the spinning ones (iceoryx-spin) in
    /// the first spinning phase's, split cores only (see ``ReferenceSystem``).
    public var references: [ReferenceSystem]
    /// Besides the per-message streams, a one-way stream sent `batchedStream` messages at a time
    /// (``IPCCore/MessageConnection/send(contentsOf:msgid:timeout:)``: one gathering write a batch
    /// where the transport has one), from the connection's executor: blocking, binary framing, for
    /// the transports that have a preferred executor (``ThroughputResult/batch``). 0: not measured.
    public var batchedStream = 8

    public init(
        transports: [String] = TransportCatalog.names,
        framings: [Framing] = Framing.measuredByDefault,
        placements: [Placement] = [.sameCore, .splitCores],
        payloadSizes: [Int] = [0, 64, 4096, 65536, 1 << 20],
        sampleScale: Double = 1,
        includeFloors: Bool = true,
        waitStrategies: [WaitStrategy] = [.blocking, .spinThenBlock()],
        includeThroughput: Bool = true,
        includeGlobalExecutor: Bool = true,
        includeOnLoopHandler: Bool = true,
        mainServing: ConformancePeer.Serving = .task,
        references: [ReferenceSystem] = []
    ) {
        self.includeOnLoopHandler = includeOnLoopHandler
        self.mainServing = mainServing
        self.references = references
        self.transports = transports
        self.framings = framings
        self.placements = placements
        self.payloadSizes = payloadSizes
        self.sampleScale = sampleScale
        self.includeFloors = includeFloors
        self.waitStrategies = waitStrategies
        self.includeThroughput = includeThroughput
        self.includeGlobalExecutor = includeGlobalExecutor
    }

    /// Messages per throughput repetition: about 64 MiB of payload, between 20 and 5,000
    /// messages (scaled down by a `sampleScale` below 1, never up; at least 10). An engine
    /// repetition of 64 KiB or 1 MiB lasts 11 to 14 ms on this repository's VM, long enough that
    /// the slow start of a stream after round trips (an estimated 0.3 to 0.6 ms on one core,
    /// cause not found) weighs a few percent of it rather than a fifth of a 64 KiB repetition,
    /// as it did with 8 MiB (docs/HARNESS.md, Reports/throughput-volume).
    public func throughputMessages(forPayload bytes: Int) -> Int {
        let count = min(5_000, max(20, (64 << 20) / max(1, bytes)))
        return max(10, Int(Double(count) * min(1, sampleScale)))
    }

    /// Enough round trips that the p99.9 rests on at least 20 samples for payloads up to 4 KiB;
    /// fewer for large payloads so the default run stays within its time budget.
    public func samples(forPayload bytes: Int) -> Int {
        let base: Int
        switch bytes {
        case ..<8192: base = 20_000
        case ..<(256 * 1024): base = 5_000
        default: base = 1_000
        }
        return max(10, Int(Double(base) * sampleScale))
    }

    /// Round trips run and discarded before measuring: they fault in buffers and let the
    /// peer's threads and the caches settle.
    public func warmup(forPayload bytes: Int) -> Int {
        max(5, samples(forPayload: bytes) / 20)
    }
}

/// What a cross-process run found.
public struct CrossProcessResults: Sendable {
    public var latency: [LatencyResult]
    public var throughput: [ThroughputResult]
    /// Reference systems, or measurements of one, that could not be made, and why.
    public var skippedReferences: [SkippedReference]
    /// What the peers' event loops counted as stalls, for the peers whose loop stalled.
    public var peerLoopStalls: [LoopStallRecord]

    public init(
        latency: [LatencyResult] = [], throughput: [ThroughputResult] = [], skippedReferences: [SkippedReference] = [], peerLoopStalls: [LoopStallRecord] = []
    ) {
        self.latency = latency
        self.throughput = throughput
        self.skippedReferences = skippedReferences
        self.peerLoopStalls = peerLoopStalls
    }
}

/// Runs round-trip latency and one-way throughput measurements against peer processes.
///
/// Every combination (transport, framing, placement, wait strategy) gets its own peer process
/// and connection, all started up front. The samples are then taken in ``LatencyResult/repetitions``
/// repetitions that sweep the whole matrix each, so a measurement's repetitions are spread over
/// the run: drift on a shared machine shows up as spread between repetitions instead of
/// silently biasing whichever measurement ran during it. `ipcbench compare` tests those
/// repetitions.
public struct LatencyRunner: Sendable {
    public var plan: LatencyPlan
    public var progress: ProgressReporter

    public init(plan: LatencyPlan, progress: ProgressReporter) {
        self.plan = plan
        self.progress = progress
    }

    /// One peer process, a way to make timed round trips with it, and what has been measured so
    /// far: a transport's connection to an `ipcbench peer`, or a native floor's raw channel.
    private final class Session {
        /// The transport's name, or `floor:<mechanism>` for a native floor.
        let name: String
        let framing: Framing?
        let placement: Placement
        let waitStrategy: WaitStrategy
        /// Which executor the requests' task runs on (``LatencyResult/executor``).
        let executor: String?
        /// How the peer answers (``LatencyResult/handler``); `nil` for floors and references.
        let handler: String?
        /// Messages a batched stream sends at a time (``ThroughputResult/batch``): a session that
        /// measures that stream only (no round trips); `nil` for the others.
        var batch: Int?
        let peerPID: Int32
        /// Makes `count` round trips of `size` bytes; returns each one's time in nanoseconds.
        let roundTrips: (_ size: Int, _ count: Int) async throws -> [UInt64]
        /// Sends `count` one-way messages of `size` bytes; returns the nanoseconds until the
        /// peer had them all. `nil` where one-way throughput means nothing.
        /// One-way stream of `count` messages: the time until the receiver had them all, and the
        /// allocations the receiver reported making while taking them (`nil` if not counted).
        let stream: ((_ size: Int, _ count: Int) async throws -> (nanoseconds: UInt64, peerAllocations: UInt64?))?
        let close: () -> Void
        /// A reference system's server: its `measure` client takes the samples, and reads both
        /// sides' CPU time itself (``roundTrips`` and ``stream`` are not used).
        let reference: ReferenceSession?
        var measurements: [Int: LatencyAccumulator] = [:]
        var throughput: [Int: ThroughputAccumulator] = [:]
        /// What a reference system could not measure (its client's exit status 4), by mode and size.
        var unsupported: [String: SkippedReference] = [:]
        /// Asks the peer what its event loop counted as stalls (`nil` for floors and references).
        var loopStalls: (() async -> LoopStalls?)?
        /// Why a reference system's measurement failed (its own byte-for-byte check, or its
        /// client): it is then measured no more, and none of its rows is reported.
        var failure: SkippedReference?

        init(name: String, framing: Framing?, placement: Placement, waitStrategy: WaitStrategy = .blocking, executor: String? = nil, handler: String? = nil, peerPID: Int32,
             roundTrips: @escaping (Int, Int) async throws -> [UInt64],
             stream: ((Int, Int) async throws -> (nanoseconds: UInt64, peerAllocations: UInt64?))?, close: @escaping () -> Void,
             reference: ReferenceSession? = nil) {
            self.reference = reference
            self.name = name
            self.framing = framing
            self.placement = placement
            self.waitStrategy = waitStrategy
            self.executor = executor
            self.handler = handler
            self.peerPID = peerPID
            self.roundTrips = roundTrips
            self.stream = stream
            self.close = close
        }

        /// The wait strategy of its rows: the phase's, but `spin` for a spinning reference system.
        var waitStrategyName: String {
            reference?.reference.spins == true ? ReferenceSystem.spinWaitStrategy : waitStrategy.name
        }

        var label: String {
            [name, framing?.rawValue, placement.rawValue, waitStrategy.spins ? waitStrategyName : nil, executor == LatencyResult.globalExecutor ? "global executor" : nil,
             handler == LatencyResult.onLoopHandler ? "on-loop handler" : nil]
                .compactMap { $0 }.joined(separator: " ")
        }
    }

    /// Measures every combination in the plan.
    /// - Throws: ``IPCError`` if a peer cannot be started or a request fails.
    public func run() async throws -> CrossProcessResults {
        let group = try TemporaryGroup()
        // Reference systems whose server did not start, or that this run's phases and placements
        // leave out (a spinning one without a spinning phase or split cores), with the reason.
        var unstarted = referencesLeftOut()
        defer { group.remove() }
        let originalAffinity = CPUAffinity.current()
        defer { try? CPUAffinity.pinCurrentProcess(to: originalAffinity) }
        var measured: [Session] = []
        var peerLoopStalls: [LoopStallRecord] = []
        // One phase per wait strategy, each with its own peers, started when the phase starts and
        // stopped when it ends: all of them at once would hold more POSIX message queues than a
        // user's RLIMIT_MSGQUEUE (800 KiB by default) allows. The blocking floors run in the
        // blocking phase, the spinning floors beside the spinning transports.
        for phase in phases() {
            var sessions: [Session] = []
            defer {
                for session in sessions { session.close() }
            }
            try startSessions(
                phase.strategy, transports: phase.transports, placements: phase.placements, part: phase.part, floors: plan.includeFloors,
                references: phase.references, group: group.directory, into: &sessions, skipped: &unstarted
            )
            guard !sessions.isEmpty else { continue }
            let strategy = phase.strategy
            progress.note("\(strategy.name): started \(sessions.count) peer processes (\(phase.transports.joined(separator: ", ")); \(phase.placements.map(\.rawValue).joined(separator: ", ")))")
            try await sweep(sessions, phase: strategy.name, originalAffinity: originalAffinity)
            for session in sessions {
                if let stalls = await session.loopStalls?(), stalls.count > 0 {
                    peerLoopStalls.append(LoopStallRecord(process: "peer of \(session.label)", stalls: stalls))
                }
            }
            measured += sessions
        }
        let failed = measured.compactMap(\.failure)
        measured.removeAll { $0.failure != nil }
        let latency = measured.filter { $0.batch == nil }.flatMap { session in
            plan.payloadSizes.map { size in
                var row = result(session, size: size)
                if session.reference != nil { row.reference = true }
                row.waitStrategy = session.waitStrategyName
                return row
            }
        }
        let throughput = measured.flatMap { session in
            plan.payloadSizes.compactMap { size -> ThroughputResult? in
                guard var row = session.throughput[size]?.result(
                    transport: session.name, framing: session.framing, placement: session.placement,
                    waitStrategy: session.waitStrategyName, executor: session.executor, handler: session.handler, payloadBytes: size
                ) else { return nil }
                row.batch = session.batch
                if session.reference != nil { row.reference = true }
                return row
            }
        }
        let skipped = unstarted + failed + measured.flatMap { $0.unsupported.values.sorted { ($0.mode ?? "", $0.payloadBytes ?? 0) < ($1.mode ?? "", $1.payloadBytes ?? 0) } }
        return CrossProcessResults(
            // A reference's rows for a size it could not carry have no samples.
            latency: latency.filter { $0.samples > 0 }, throughput: throughput, skippedReferences: orderedUnique(skipped), peerLoopStalls: peerLoopStalls
        )
    }

    /// Starts a session for every transport, framing and placement that `strategy` applies to
    /// (spinning only where the processes are on different cores and the transport can poll),
    /// and the native floors under the transports if `floors` is set; of them, the ones `part`
    /// says (``Phase/Part``).
    private func startSessions(
        _ strategy: WaitStrategy, transports: [String], placements: [Placement], part: Phase.Part, floors: Bool, references: Bool, group: GroupDirectory,
        into sessions: inout [Session], skipped: inout [SkippedReference]
    ) throws {
        // The placements of each transport whose batched stream this phase measures.
        var batchedPlacements: [String: [Placement]] = [:]
        for name in transports where !strategy.spins || TransportCatalog.supportsSpinning(name) {
            for framing in TransportCatalog.usesFraming(name) ? plan.framings.map(Optional.some) : [nil] {
                for placement in placements where !strategy.spins || placement.spreadsProcesses {
                    if part != .onLoop {
                        let session = try transportSession(name, framing: framing, placement: placement, waitStrategy: strategy, serving: plan.mainServing, group: group)
                        sessions.append(session.main)
                        if plan.includeGlobalExecutor, !strategy.spins, framing ?? .binary == .binary, let global = session.global {
                            sessions.append(global)
                        }
                        if plan.includeThroughput, plan.batchedStream > 1, !strategy.spins, framing ?? .binary == .binary, let batched = session.batched {
                            sessions.append(batched)
                            batchedPlacements[name, default: []].append(placement)
                        }
                    }
                    if part != .offLoop, plan.includeOnLoopHandler, plan.mainServing != .onLoop, framing ?? .binary == .binary {
                        sessions.append(try transportSession(name, framing: framing, placement: placement, waitStrategy: strategy, serving: .onLoop, group: group).main)
                    }
                }
            }
        }
        // The reference systems: the blocking ones beside the blocking transports, the spinning
        // ones (split cores only) beside the spinning transports. One of which only one server can
        // run on the machine (iceoryx's RouDi) is started for each of its turns (see sweep).
        if references {
            for reference in plan.references where reference.spins == strategy.spins {
                for placement in placements where !reference.spins || placement.spreadsProcesses {
                    do {
                        let server = try ReferenceSession(
                            reference, placement: placement, group: URL(fileURLWithPath: group.path), startNow: !reference.oneServerPerMachine
                        )
                        sessions.append(Session(
                            name: reference.resultName, framing: nil, placement: placement, waitStrategy: strategy, peerPID: server.pid ?? 0,
                            roundTrips: { _, _ in [] }, stream: { _, _ in (0, nil) }, close: { server.stop() }, reference: server
                        ))
                    } catch {
                        progress.note("skipped \(reference.resultName) \(placement.rawValue): \(error)")
                        skipped.append(SkippedReference(system: reference.system, reason: "its server did not start (\(placement.rawValue)): \(error)"))
                    }
                }
            }
        }
        guard floors else { return }
        let base = transports.compactMap(FloorMechanism.init(transport:))
        let handingOff = plan.mainServing == .task && part != .onLoop ? base.compactMap(\.handOff) : []
        // A mechanism's plain event-driven floors (epoll, io_uring) are the same work of rows
        // served on the loop; main rows served off it are compared with its hand-off floor. So
        // where there is a hand-off floor, they are measured only with the on-loop rows (--full).
        let sameWork = base.flatMap { mechanism -> [FloorMechanism] in
            let mainRowsNeedThem = mechanism.handOff == nil || plan.mainServing != .task
            switch part {
            case .all: return mainRowsNeedThem || plan.includeOnLoopHandler ? mechanism.sameWorkFloors : []
            case .offLoop: return mainRowsNeedThem ? mechanism.sameWorkFloors : []
            case .onLoop: return mechanism.sameWorkFloors
            }
        }
        // The io_uring floors only where the kernel allows io_uring (a note says when it does not).
        let native = part == .onLoop ? [] : base
        // Spinning: the floor that spins as the transport does and, for main rows served off the
        // loop, the same with a hand-off.
        let spinning = base.compactMap(\.spinning) + (plan.mainServing == .task ? base.compactMap(\.spinningHandOff) : [])
        let mechanisms = (strategy.spins ? spinning : native + sameWork + handingOff).filter(\.isAvailable)
        for mechanism in orderedUnique(mechanisms) {
            for placement in placements where !mechanism.spins || placement.spreadsProcesses {
                sessions.append(try floorSession(mechanism, placement: placement, waitStrategy: mechanism.spins ? strategy : .blocking, group: group))
            }
        }
        // The batched streams' same work (unix-socket's: one gathering write a batch), where a
        // transport's batched stream is measured: a floor peer of its own whose stream only is
        // measured, batched as the transport's.
        for name in transports {
            guard let placements = batchedPlacements[name], let mechanism = FloorMechanism(transport: name)?.batchedSameWork, mechanism.isAvailable else { continue }
            for placement in placements {
                sessions.append(try floorSession(mechanism, placement: placement, waitStrategy: .blocking, group: group, batch: plan.batchedStream))
            }
        }
    }

    /// A session over a new floor peer. With `batch`, it measures the floor's stream only, sent
    /// `batch` messages a write (``ThroughputResult/batch``); without, round trips and, where
    /// the mechanism buffers, the stream one message a write.
    private func floorSession(_ mechanism: FloorMechanism, placement: Placement, waitStrategy: WaitStrategy, group: GroupDirectory, batch: Int? = nil) throws -> Session {
        let floor = try FloorSession(mechanism: mechanism, placement: placement, group: group, maximumPayload: max(1, plan.payloadSizes.max() ?? 1))
        let session = Session(
            name: mechanism.resultName, framing: nil, placement: placement, waitStrategy: waitStrategy, peerPID: floor.peerPID,
            roundTrips: { size, count in batch == nil ? try await floor.roundTripTimes(payloadSize: size, count: count) : [] },
            stream: mechanism.streams ? { size, count in (try await floor.streamTime(payloadSize: size, count: count, batch: batch ?? 1), nil) } : nil,
            close: { floor.close() }
        )
        session.batch = batch
        return session
    }

    /// One phase of a run: the sessions whose peers live at the same time, measured interleaved.
    struct Phase {
        var strategy: WaitStrategy
        var transports: [String]
        var placements: [Placement]
        /// Whether the reference systems of this phase's kind (blocking or spinning) run in it:
        /// the first blocking phase, and the first spinning one.
        var references = false
        /// Which of its transports' sessions and floors the phase starts.
        var part = Part.all

        /// A phase's share of its transports' sessions and floors.
        enum Part {
            /// All of them.
            case all
            /// The rows served off the loop (main, global executor, batched stream) with the
            /// native and hand-off floors.
            case offLoop
            /// The on-loop handler's rows with the plain event-driven floors, their same work.
            case onLoop
        }
    }

    /// The phases of a run: one per wait strategy, each with its own peers. With the floors,
    /// message-port's blocking measurements are phases of their own, one per placement: a
    /// connection's two queues and the two mqueue floors' (blocking and epoll) take about half of
    /// a user's RLIMIT_MSGQUEUE (800 KiB, a cap that root in a user namespace cannot raise), so
    /// beside the other placement's, or other transports' peers, they could not all start. They
    /// run right after the other transports' blocking phase, each with its floors interleaved.
    /// With the on-loop rows beside the main rows (served off the loop), a third mqueue floor is
    /// measured (mqueue+epoll for the on-loop rows, mqueue+epoll+handoff for the main rows), which
    /// does not fit either: each placement's phase is then two, the main rows with the native and
    /// hand-off floors, then the on-loop rows with mqueue+epoll. The spinning phase stays one:
    /// it has one placement (split cores), and with the on-loop rows holds four pairs of queues
    /// (message-port's main and on-loop peers, mqueue+spin and mqueue+spin+handoff), eight queues
    /// of about 81 KiB at the default sizes: about 650 of the 800 KiB.
    func phases() -> [Phase] {
        let placements = plan.placements.filter { $0.requiredCPUCount <= CPUAffinity.onlineCount }
        var phases = plan.waitStrategies.flatMap { strategy -> [Phase] in
            let queued = plan.transports.filter { $0 == "message-port" }
            guard plan.includeFloors, !strategy.spins, !queued.isEmpty else {
                return [Phase(strategy: strategy, transports: plan.transports, placements: placements)]
            }
            let others = plan.transports.filter { !queued.contains($0) }
            let parts: [Phase.Part] = plan.includeOnLoopHandler && plan.mainServing == .task ? [.offLoop, .onLoop] : [.all]
            return (others.isEmpty ? [] : [Phase(strategy: strategy, transports: others, placements: placements)])
                + placements.flatMap { placement in parts.map { Phase(strategy: strategy, transports: queued, placements: [placement], part: $0) } }
        }
        // The reference systems are measured interleaved with the first blocking phase's
        // transports, and the spinning ones with the first spinning phase's.
        if plan.references.contains(where: { !$0.spins }) {
            if let first = phases.firstIndex(where: { !$0.strategy.spins }) {
                phases[first].references = true
            } else {
                phases.append(Phase(strategy: .blocking, transports: [], placements: placements, references: true))
            }
        }
        if plan.references.contains(where: \.spins), let first = phases.firstIndex(where: { $0.strategy.spins }) {
            phases[first].references = true
        }
        return phases
    }

    /// The spinning reference systems this run cannot measure, and why: they run only in a
    /// spinning phase, with the processes on different cores.
    func referencesLeftOut() -> [SkippedReference] {
        let phases = phases()
        let spinning = phases.first { $0.strategy.spins && $0.references }
        return plan.references.filter(\.spins).compactMap { reference in
            if spinning == nil {
                return SkippedReference(system: reference.system, reason: "it spins, and is measured only in the spinning phase, which this run does not have (--spin-microseconds 0)")
            }
            if spinning?.placements.contains(where: \.spreadsProcesses) != true {
                return SkippedReference(system: reference.system, reason: "it spins, and is measured only with the processes on different cores (split-cores), which this run does not measure")
            }
            return nil
        }
    }

    /// Takes the samples of `sessions` in ``LatencyResult/repetitions`` sweeps.
    private func sweep(_ sessions: [Session], phase: String, originalAffinity: [Int]) async throws {
        let repetitions = LatencyResult.repetitions
        for repetition in 1...repetitions {
            let label = "\(phase): repetition \(repetition)/\(repetitions)"
            progress.begin(step: repetition, of: repetitions, label: label)
            for (index, session) in sessions.enumerated() where session.failure == nil {
                try CPUAffinity.pinCurrentProcess(to: session.placement.cpus.map { [$0.local] } ?? originalAffinity)
                // A reference of which one server can run on the machine at a time (iceoryx's
                // RouDi) runs for its turn only, so that its other placement's can run in theirs.
                let onItsTurn = session.reference.flatMap { $0.reference.oneServerPerMachine ? $0 : nil }
                do {
                    // Started and stopped off the cooperative pool: both wait for the process.
                    if let onItsTurn { try await runBlocking { try onItsTurn.start() } }
                    do {
                        for size in plan.payloadSizes {
                            let blockSamples = max(1, plan.samples(forPayload: size) / repetitions)
                            // Warm up before each block: the connection may have been idle while others ran.
                            if session.batch == nil {
                                try await measureBlock(session, size: size, samples: max(2, plan.warmup(forPayload: size) / repetitions), record: false)
                                try await measureBlock(session, size: size, samples: blockSamples, record: true)
                            }
                            if plan.includeThroughput, session.stream != nil {
                                try await measureThroughput(session, size: size)
                            }
                        }
                    } catch {
                        if let onItsTurn { _ = try? await runBlocking { onItsTurn.stop() } }
                        throw error
                    }
                    if let onItsTurn { _ = try? await runBlocking { onItsTurn.stop() } }
                } catch let error where session.reference != nil {
                    // A reference system that fails (a wrong echo, a crash) is reported as such,
                    // never with figures, and the run goes on with the others.
                    let system = session.reference!.reference.system
                    session.failure = SkippedReference(system: system, reason: "FAILED in repetition \(repetition), \(session.placement.rawValue): \(error)")
                    progress.note("\(session.name) \(session.placement.rawValue) failed: \(error)")
                }
                progress.update(label: label, fraction: Double(index + 1) / Double(sessions.count))
            }
            progress.end(label: label, summary: "\(sessions.count * plan.payloadSizes.count) measurements")
        }
    }

    /// The endpoint of a measured session: unique in the run's group for each transport,
    /// framing, wait, handler and placement, and within ``Endpoint``'s 64-character limit for
    /// every one of them (the handler and placement are abbreviated: `task-on-loop` with
    /// `split-cores` spelled out made a name of 66 characters, which `--handler task-on-loop`
    /// failed on).
    package static func sessionEndpointName(
        group: GroupDirectory, transport: String, framing: Framing?, spins: Bool, serving: ConformancePeer.Serving, placement: Placement
    ) -> String {
        let handler: String? = switch serving {
        case .task: nil
        case .taskOnLoop: "tl"
        case .onLoop: "ol"
        case .blockingOnLoop: "bl"
        }
        let core = switch placement {
        case .sameCore: "same"
        case .splitCores: "split"
        case .unpinned: "free"
        }
        let parts = [transport, framing?.rawValue, spins ? "spin" : nil, handler, core].compactMap { $0 }
        return "\(group.identifier).b-" + parts.joined(separator: "-")
    }

    /// A session over a new peer and connection; for a connection with a preferred executor,
    /// also a second session over the same connection whose requests run on the global
    /// executor (measured in blocks of its own, so the two never overlap).
    /// `serving`: how the peer answers; the main rows' peer serves with the async request
    /// handler (``ConformancePeer/Configuration/Serving/task``).
    private func transportSession(
        _ name: String, framing: Framing?, placement: Placement, waitStrategy: WaitStrategy, serving: ConformancePeer.Serving = .task, group: GroupDirectory
    ) throws -> (main: Session, global: Session?, batched: Session?) {
        let transport = try TransportCatalog.transport(named: name, framing: framing ?? .binary)
        let endpoint = try Endpoint(
            group: group, name: Self.sessionEndpointName(group: group, transport: name, framing: framing, spins: waitStrategy.spins, serving: serving, placement: placement)
        )
        let handler = serving.rawValue
        let peer = try PeerProcess(
            transport: name, framing: framing ?? .binary, endpoint: endpoint, role: .server, cpu: placement.cpus?.peer, waitStrategy: waitStrategy, serving: serving
        )
        let connection: any MessageConnection
        do {
            connection = try transport.connect(to: endpoint, options: .defaults { $0.waitStrategy = waitStrategy })
        } catch {
            peer.stop()
            throw error
        }
        let label = [name, framing?.rawValue, placement.rawValue, waitStrategy.spins ? waitStrategy.name : nil, serving == .task ? nil : "\(serving.rawValue) handler"]
            .compactMap { $0 }.joined(separator: " ")
        let sinkReports = SinkReports(connection.messages)
        let executor = connection.preferredTaskExecutor
        // A one-way stream sent from a task on `executor` (nil: Swift's global executor). Which
        // one is faster depends on the size: same core, a stream of 64 B messages sent from the
        // connection's loop is slower than one sent from the global executor (the receiver
        // preempts the loop's thread more often), and one of 64 KiB faster (a full socket
        // suspends the sender without waking a pool thread when room comes). Both are measured;
        // docs/ENGINE.md, "Throughput", has the figures.
        // `batch`: messages sent at a time with `send(contentsOf:)` (nil: one `send` a message).
        func stream(preferring executor: (any TaskExecutor)?, batch: Int? = nil) -> (Int, Int) async throws -> (nanoseconds: UInt64, peerAllocations: UInt64?) {
            { size, count in
                let payload = [UInt8](repeating: 0x5A, count: size)
                let timeout = Duration.seconds(30)
                let batchPayloads = [[UInt8]](repeating: payload, count: batch ?? 0)
                return try await withTaskExecutorPreference(executor) {
                    let start = monotonicNanoseconds()
                    if let batch {
                        var sent = 0
                        while sent < count {
                            let now = min(batch, count - sent)
                            try await connection.send(contentsOf: now == batch ? batchPayloads : Array(batchPayloads.prefix(now)), msgid: ConformancePeer.Sink.message, timeout: timeout)
                            sent += now
                        }
                    } else {
                        for _ in 0..<count {
                            try await connection.send(payload, msgid: ConformancePeer.Sink.message, timeout: timeout)
                        }
                    }
                    try await connection.send([], msgid: ConformancePeer.Sink.end, timeout: timeout)
                    let report = try await sinkReports.next(orInvalidate: connection, after: .seconds(60))
                    let elapsed = monotonicNanoseconds() - start
                    guard report.messages == count, report.bytes == UInt64(count * size) else {
                        throw IPCError(code: .malformedPayload, message: "\(label): the peer received \(report.messages) messages (\(report.bytes) bytes) of \(count) (\(count * size) bytes)")
                    }
                    return (elapsed, report.allocations)
                }
            }
        }
        let global = executor.map { _ in
            Session(
                name: name, framing: framing, placement: placement, waitStrategy: waitStrategy, executor: LatencyResult.globalExecutor, handler: handler, peerPID: peer.pid,
                roundTrips: { size, count in
                    try await withTaskExecutorPreference(nil) {
                        try await timedEchoRoundTrips(connection, size: size, count: count, label: label + " global executor")
                    }
                },
                stream: stream(preferring: nil), close: {}
            )
        }
        let main = Session(
            name: name, framing: framing, placement: placement, waitStrategy: waitStrategy,
            executor: executor == nil ? nil : LatencyResult.preferredExecutor, handler: handler, peerPID: peer.pid,
            roundTrips: { size, count in
                // The hop-free path: the task runs on the loop that reads its replies.
                try await withTaskExecutorPreference(executor) {
                    try await timedEchoRoundTrips(connection, size: size, count: count, label: label)
                }
            },
            stream: stream(preferring: executor),
            close: {
                connection.invalidate()
                peer.stop()
            }
        )
        // The batched stream: same connection and peer, measured in blocks of its own.
        let batched = executor.flatMap { _ -> Session? in
            guard plan.batchedStream > 1 else { return nil }
            let session = Session(
                name: name, framing: framing, placement: placement, waitStrategy: waitStrategy,
                executor: LatencyResult.preferredExecutor, handler: handler, peerPID: peer.pid,
                roundTrips: { _, _ in [] }, stream: stream(preferring: executor, batch: plan.batchedStream), close: {}
            )
            session.batch = plan.batchedStream
            return session
        }
        main.loopStalls = {
            let reply = try? await connection.request([], msgid: ConformancePeer.Request.loopStalls, sendTimeout: .seconds(5), receiveTimeout: .seconds(5))
            return reply.flatMap { try? JSONDecoder().decode(LoopStalls.self, from: Data($0)) }
        }
        return (main, global, batched)
    }

    private func measureBlock(_ session: Session, size: Int, samples: Int, record: Bool) async throws {
        if let reference = session.reference {
            // The client's own warm-up comes before its timed round trips, in the same process.
            let warmup = max(2, plan.warmup(forPayload: size) / LatencyResult.repetitions)
            guard record, let measurement = try await measureReference(session, reference, mode: "latency", size: size, count: samples, warmup: warmup) else { return }
            let usage = measurement.usage
            session.measurements[size, default: LatencyAccumulator()].record(block: measurement.samplesNs ?? [], cpuBefore: usage.before, cpuAfter: usage.after)
            return
        }
        let cpuBefore = CPUReading(peer: session.peerPID)
        let elapsedTimes = try await session.roundTrips(size, samples)
        guard record else { return }
        let cpuAfter = CPUReading(peer: session.peerPID)
        session.measurements[size, default: LatencyAccumulator()].record(block: elapsedTimes, cpuBefore: cpuBefore, cpuAfter: cpuAfter)
    }

    /// Runs a reference system's `measure`; `nil` (and the measurement filed as skipped) if the
    /// system cannot carry this payload in this mode.
    private func measureReference(_ session: Session, _ reference: ReferenceSession, mode: String, size: Int, count: Int, warmup: Int) async throws -> ReferenceMeasurement? {
        let key = "\(mode)/\(size)"
        guard session.unsupported[key] == nil else { return nil }
        do {
            return try await reference.measure(mode: mode, payload: size, warmup: warmup, count: count)
        } catch let unsupported as ReferenceUnsupported {
            session.unsupported[key] = SkippedReference(system: reference.reference.system, reason: unsupported.reason, mode: mode, payloadBytes: size)
            return nil
        }
    }

    private func measureThroughput(_ session: Session, size: Int) async throws {
        let count = plan.throughputMessages(forPayload: size)
        if let reference = session.reference {
            guard let measurement = try await measureReference(session, reference, mode: "throughput", size: size, count: count, warmup: max(2, count / 20)) else { return }
            let usage = measurement.usage
            session.throughput[size, default: ThroughputAccumulator()].record(
                count: count, nanoseconds: measurement.elapsedNs ?? 0, cpuBefore: usage.before, cpuAfter: usage.after
            )
            return
        }
        guard let stream = session.stream else { return }
        // A short warm-up run first: buffers fault in, and the receiver is awake.
        _ = try await stream(size, max(2, count / 20))
        let cpuBefore = CPUReading(peer: session.peerPID)
        let (elapsed, peerAllocations) = try await stream(size, count)
        let cpuAfter = CPUReading(peer: session.peerPID)
        session.throughput[size, default: ThroughputAccumulator()].record(
            count: count, nanoseconds: elapsed, cpuBefore: cpuBefore, cpuAfter: cpuAfter, peerAllocations: peerAllocations
        )
    }

    private func result(_ session: Session, size: Int) -> LatencyResult {
        (session.measurements[size] ?? LatencyAccumulator()).result(
            transport: session.name, framing: session.framing, placement: session.placement, waitStrategy: session.waitStrategy,
            executor: session.executor, handler: session.handler, payloadBytes: size,
            warmup: max(2, plan.warmup(forPayload: size) / LatencyResult.repetitions) * LatencyResult.repetitions
        )
    }
}

/// Makes `count` echo requests (``PeerRequest/echo``) of `size` bytes on `connection`, one after
/// another, and returns each round trip's time in nanoseconds.
/// - Throws: what the request throws; ``IPCError/Code/malformedPayload`` if a reply is not the payload's size.
func timedEchoRoundTrips(_ connection: any MessageConnection, size: Int, count: Int, label: String) async throws -> [UInt64] {
    let payload = [UInt8](repeating: 0xA5, count: size)
    let timeout = Duration.seconds(30)
    var times: [UInt64] = []
    times.reserveCapacity(count)
    for _ in 0..<count {
        let start = monotonicNanoseconds()
        let reply = try await connection.request(payload, msgid: PeerRequest.echo, sendTimeout: timeout, receiveTimeout: timeout)
        times.append(monotonicNanoseconds() - start)
        guard reply.count == size else {
            throw IPCError(code: .malformedPayload, message: "echo returned \(reply.count) bytes instead of \(size) for \(label)")
        }
    }
    return times
}

/// The sink reports (``ConformancePeer/Sink/report``) arriving on a harness connection.
private final class SinkReports {
    private var iterator: AsyncStream<ReceivedMessage>.Iterator

    init(_ messages: AsyncStream<ReceivedMessage>) {
        iterator = messages.makeAsyncIterator()
    }

    /// The next report. If none comes within `limit`, the connection is invalidated (its message
    /// stream ends) and this throws: a lost message must not hang the run.
    func next(orInvalidate connection: any MessageConnection, after limit: Duration) async throws -> (messages: UInt64, bytes: UInt64, allocations: UInt64?) {
        let watchdog = Task {
            try await Task.sleep(for: limit)
            connection.invalidate()
        }
        defer { watchdog.cancel() }
        while let message = await iterator.next() {
            guard message.msgid == ConformancePeer.Sink.report else { continue }
            guard let report = ConformancePeer.Sink.parseReport(message.payload) else {
                throw IPCError(code: .malformedPayload, message: "a sink report of \(message.payload.count) bytes")
            }
            return report
        }
        throw IPCError(code: .peerInvalidated, message: "no sink report within \(limit): the connection ended (\(connection.invalidationReason.map { "\($0)" } ?? "invalidated"))")
    }
}

func orderedUnique<T: Hashable>(_ values: [T]) -> [T] {
    var seen: Set<T> = []
    return values.filter { seen.insert($0).inserted }
}

/// A private group directory under the system's temporary directory, removed at the end.
///
/// A harness killed with SIGKILL cannot remove it, nor the message queues named after it, which
/// outlive processes and count against a small per-user quota (two killed runs used to make
/// every later run fail at start-up). So the directory holds `harness.lock`, locked (`flock`)
/// while its run lives, and the first group a process makes first reclaims every
/// `ipcbench-*` directory of this user whose lock nobody holds, with its queues.
struct TemporaryGroup {
    static let prefix = "ipcbench-"
    static let lockName = "harness.lock"

    let directory: GroupDirectory
    /// Holds `harness.lock` for as long as the run uses the directory.
    private let lockDescriptor: CInt

    init() throws {
        _ = Self.reclaimOnce
        var template = Array((NSTemporaryDirectory() + Self.prefix + "XXXXXX").utf8CString)
        guard let path = template.withUnsafeMutableBufferPointer({ mkdtemp($0.baseAddress!) }) else {
            throw IPCError(code: .transportFailure, message: "mkdtemp failed: errno \(errno)")
        }
        directory = GroupDirectory(path: String(cString: path))
        let descriptor = open(directory.path + "/" + Self.lockName, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0o600)
        guard descriptor >= 0, flock(descriptor, LOCK_EX | LOCK_NB) == 0 else {
            let error = errno
            if descriptor >= 0 { close(descriptor) }
            try? FileManager.default.removeItem(atPath: directory.path)
            throw IPCError(code: .transportFailure, message: "cannot create and lock \(directory.path)/\(Self.lockName): errno \(error)")
        }
        lockDescriptor = descriptor
    }

    func remove() {
        try? FileManager.default.removeItem(atPath: directory.path)
        close(lockDescriptor)
    }

    private static let reclaimOnce: Void = { _ = reclaimAbandoned() }()

    /// Removes what runs that died left behind: each `ipcbench-*` directory of this user in
    /// `temporaryDirectory` whose `harness.lock` exists and is held by nobody, and the message
    /// queues named after it (the transports' `/ipcb.<hash>.<identifier>.…` and the native floor's
    /// `/<identifier>.floor-…`). A directory without the lock file is left alone: nothing says
    /// whether its run is over. Returns the directories removed.
    @discardableResult
    static func reclaimAbandoned(in temporaryDirectory: String = NSTemporaryDirectory()) -> [String] {
        let entries = (try? FileManager.default.contentsOfDirectory(atPath: temporaryDirectory)) ?? []
        var removed: [String] = []
        for entry in entries where entry.hasPrefix(prefix) {
            let path = (temporaryDirectory as NSString).appendingPathComponent(entry)
            var status = stat()
            guard lstat(path, &status) == 0, status.st_mode & S_IFMT == S_IFDIR, status.st_uid == geteuid() else { continue }
            let descriptor = open(path + "/" + lockName, O_RDWR | O_CLOEXEC | O_NOFOLLOW)
            guard descriptor >= 0 else { continue }
            defer { close(descriptor) }
            // Granted only if the run that made it is gone (the kernel drops a dead process's locks).
            guard flock(descriptor, LOCK_EX | LOCK_NB) == 0 else { continue }
            let queues = (try? FileManager.default.contentsOfDirectory(atPath: "/dev/mqueue")) ?? []
            for name in queues where name.contains("." + entry + ".") || name.hasPrefix(entry + ".") {
                MessageQueue.unlink(name: "/" + name)
            }
            try? FileManager.default.removeItem(atPath: path)
            removed.append(path)
        }
        return removed
    }
}
