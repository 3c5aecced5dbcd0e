import Foundation
import IPCCore
import IPCFraming
import IPCPosix

/// What a latency run measures.
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

    public init(
        transports: [String] = TransportCatalog.names,
        framings: [Framing] = Framing.allCases,
        placements: [Placement] = [.sameCore, .splitCores],
        payloadSizes: [Int] = [0, 64, 4096, 65536, 1 << 20],
        sampleScale: Double = 1,
        includeFloors: Bool = true
    ) {
        self.transports = transports
        self.framings = framings
        self.placements = placements
        self.payloadSizes = payloadSizes
        self.sampleScale = sampleScale
        self.includeFloors = includeFloors
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

/// Runs round-trip latency measurements against peer processes.
///
/// Every combination (transport, framing, placement) gets its own peer process and connection,
/// all started up front. The samples are then taken in ``LatencyResult/repetitions``
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
        let peerPID: Int32
        /// Makes `count` round trips of `size` bytes; returns each one's time in nanoseconds.
        let roundTrips: (_ size: Int, _ count: Int) async throws -> [UInt64]
        let close: () -> Void
        var measurements: [Int: LatencyAccumulator] = [:]

        init(name: String, framing: Framing?, placement: Placement, peerPID: Int32,
             roundTrips: @escaping (Int, Int) async throws -> [UInt64], close: @escaping () -> Void) {
            self.name = name
            self.framing = framing
            self.placement = placement
            self.peerPID = peerPID
            self.roundTrips = roundTrips
            self.close = close
        }

        var label: String { [name, framing?.rawValue, placement.rawValue].compactMap { $0 }.joined(separator: " ") }
    }

    /// Measures every combination in the plan.
    /// - Throws: ``IPCError`` if a peer cannot be started or a request fails.
    public func run() async throws -> [LatencyResult] {
        let group = try TemporaryGroup()
        defer { group.remove() }
        let placements = plan.placements.filter { $0.requiredCPUCount <= CPUAffinity.onlineCount }
        let combinations = plan.transports.flatMap { name in
            (TransportCatalog.usesFraming(name) ? plan.framings.map(Optional.some) : [nil]).map { (name, $0) }
        }
        let originalAffinity = CPUAffinity.current()
        defer { try? CPUAffinity.pinCurrentProcess(to: originalAffinity) }
        var sessions: [Session] = []
        defer {
            for session in sessions { session.close() }
        }
        let floors = plan.includeFloors ? orderedUnique(plan.transports.compactMap(FloorMechanism.init(transport:))) : []
        progress.note("starting \((combinations.count + floors.count) * placements.count) peer processes")
        for (transportName, framing) in combinations {
            for placement in placements {
                sessions.append(try transportSession(transportName, framing: framing, placement: placement, group: group.directory))
            }
        }
        for mechanism in floors {
            for placement in placements {
                let floor = try FloorSession(mechanism: mechanism, placement: placement, group: group.directory, maximumPayload: max(1, plan.payloadSizes.max() ?? 1))
                sessions.append(Session(
                    name: mechanism.resultName, framing: nil, placement: placement, peerPID: floor.peerPID,
                    roundTrips: { size, count in try await floor.roundTripTimes(payloadSize: size, count: count) },
                    close: { floor.close() }
                ))
            }
        }
        let repetitions = LatencyResult.repetitions
        for repetition in 1...repetitions {
            let label = "repetition \(repetition)/\(repetitions)"
            progress.begin(step: repetition, of: repetitions, label: label)
            for (index, session) in sessions.enumerated() {
                try CPUAffinity.pinCurrentProcess(to: session.placement.cpus.map { [$0.local] } ?? originalAffinity)
                for size in plan.payloadSizes {
                    let blockSamples = max(1, plan.samples(forPayload: size) / repetitions)
                    // Warm up before each block: the connection may have been idle while others ran.
                    try await measureBlock(session, size: size, samples: max(2, plan.warmup(forPayload: size) / repetitions), record: false)
                    try await measureBlock(session, size: size, samples: blockSamples, record: true)
                }
                progress.update(label: label, fraction: Double(index + 1) / Double(sessions.count))
            }
            progress.end(label: label, summary: "\(sessions.count * plan.payloadSizes.count) measurements")
        }
        return sessions.flatMap { session in
            plan.payloadSizes.map { size in result(session, size: size) }
        }
    }

    private func transportSession(_ name: String, framing: Framing?, placement: Placement, group: GroupDirectory) throws -> Session {
        let transport = try TransportCatalog.transport(named: name, framing: framing ?? .binary)
        let variant = [name, framing?.rawValue].compactMap { $0 }.joined(separator: "-")
        let endpoint = try Endpoint(group: group, name: "\(group.identifier).bench-\(variant)-\(placement)")
        let peer = try PeerProcess(transport: name, framing: framing ?? .binary, endpoint: endpoint, role: .server, cpu: placement.cpus?.peer)
        let connection: any MessageConnection
        do {
            connection = try transport.connect(to: endpoint, options: .defaults)
        } catch {
            peer.stop()
            throw error
        }
        let label = [name, framing?.rawValue, placement.rawValue].compactMap { $0 }.joined(separator: " ")
        return Session(
            name: name, framing: framing, placement: placement, peerPID: peer.pid,
            roundTrips: { size, count in
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
            },
            close: {
                connection.invalidate()
                peer.stop()
            }
        )
    }

    private func measureBlock(_ session: Session, size: Int, samples: Int, record: Bool) async throws {
        let cpuBefore = (local: processCPUNanoseconds(), peer: processCPUNanoseconds(pid: session.peerPID))
        let elapsedTimes = try await session.roundTrips(size, samples)
        guard record else { return }
        let cpuAfter = (local: processCPUNanoseconds(), peer: processCPUNanoseconds(pid: session.peerPID))
        session.measurements[size, default: LatencyAccumulator()].record(block: elapsedTimes, cpuBefore: cpuBefore, cpuAfter: cpuAfter)
    }

    private func result(_ session: Session, size: Int) -> LatencyResult {
        (session.measurements[size] ?? LatencyAccumulator()).result(
            transport: session.name, framing: session.framing, placement: session.placement, payloadBytes: size,
            warmup: max(2, plan.warmup(forPayload: size) / LatencyResult.repetitions) * LatencyResult.repetitions
        )
    }
}

func orderedUnique<T: Hashable>(_ values: [T]) -> [T] {
    var seen: Set<T> = []
    return values.filter { seen.insert($0).inserted }
}

/// A private group directory under the system's temporary directory, removed at the end.
struct TemporaryGroup {
    let directory: GroupDirectory

    init() throws {
        var template = Array((NSTemporaryDirectory() + "ipcbench-XXXXXX").utf8CString)
        guard let path = template.withUnsafeMutableBufferPointer({ mkdtemp($0.baseAddress!) }) else {
            throw IPCError(code: .transportFailure, message: "mkdtemp failed: errno \(errno)")
        }
        directory = GroupDirectory(path: String(cString: path))
    }

    func remove() {
        try? FileManager.default.removeItem(atPath: directory.path)
    }
}
