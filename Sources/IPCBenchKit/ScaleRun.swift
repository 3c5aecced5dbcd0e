import Foundation
import IPCCore
import IPCEngine
public import IPCFraming
import IPCSystem
import UnixSocketTransport

/// What a scale measurement does: one client's round-trip latency to a Unix socket server, alone
/// and while other clients are connected and sending (issue 9, target 6: p99 loaded within 2 × of
/// p99 alone).
public struct ScalePlan: Sendable {
    /// Other clients connected and sending during the loaded phase.
    public var clients: Int
    /// Echo requests each other client sends per second. 500 × 64 clients = 32,000 requests/s:
    /// a busy server, well below what one core serves (a round trip costs the server a few
    /// microseconds of CPU), so the measurement asks whether the server keeps one client's tail
    /// short while it serves others, not what happens once the cores are saturated.
    public var requestsPerSecondPerClient: Double
    public var payloadBytes: Int
    /// Where the measuring process (`local`) and the server (`peer`) run. The load process runs
    /// on the measuring process's CPU (``loadCPU``).
    public var placement: Placement
    /// Repetitions of each phase; the phases alternate (alone, loaded, alone, ...) so that drift
    /// on a shared machine affects both alike.
    public var repetitions: Int
    /// Round trips measured per phase and repetition, after ``warmupPerBlock`` unmeasured ones.
    public var samplesPerBlock: Int
    public var warmupPerBlock: Int
    /// Time given to the load to reach its steady rate before a loaded block is measured.
    public var settle: Duration

    public init(
        clients: Int = 64,
        requestsPerSecondPerClient: Double = 500,
        payloadBytes: Int = 64,
        placement: Placement = .splitCores,
        repetitions: Int = 5,
        samplesPerBlock: Int = 4_000,
        warmupPerBlock: Int = 200,
        settle: Duration = .milliseconds(200)
    ) {
        self.clients = clients
        self.requestsPerSecondPerClient = requestsPerSecondPerClient
        self.payloadBytes = payloadBytes
        self.placement = placement
        self.repetitions = repetitions
        self.samplesPerBlock = samplesPerBlock
        self.warmupPerBlock = warmupPerBlock
        self.settle = settle
    }

    /// The smoke-run variant of `self`: a tenth of the samples, shorter settling.
    public var quick: ScalePlan {
        var plan = self
        plan.samplesPerBlock = max(10, samplesPerBlock / 10)
        plan.warmupPerBlock = max(5, warmupPerBlock / 10)
        plan.settle = .milliseconds(50)
        return plan
    }

    /// The CPU the load process is pinned to: the measuring process's. The server keeps a core
    /// to itself, as in the alone phase, so the loaded phase measures what serving other clients
    /// costs the server's scheduling of this one, not a fight between the load generator and the
    /// server for the server's core. The load generator (one thread, mostly in `ppoll`) does
    /// share the measuring process's core; its CPU share is reported.
    public var loadCPU: Int? { placement.cpus?.local }
}

/// One client's latency to a Unix socket server alone and with ``clients`` other clients
/// connected and sending, measured side by side in one run.
public struct ScaleResult: Codable, Sendable {
    public var transport: String
    public var framing: Framing
    /// Where the measuring process and the server ran.
    public var placement: Placement
    /// The CPU the load process was pinned to; `nil` if unpinned.
    public var loadCPU: Int?
    public var clients: Int
    public var payloadBytes: Int
    public var requestsPerSecondPerClient: Double
    /// `clients × requestsPerSecondPerClient`.
    public var offeredRequestsPerSecond: Double
    /// Requests the server answered per second, counted by the load process (the median
    /// repetition, and each repetition's figure in run order).
    public var achievedRequestsPerSecond: Double
    public var repetitionAchievedRequestsPerSecond: [Double]
    /// Slots the load clients skipped because their previous reply had not come yet.
    public var skippedSlots: UInt64
    /// The measuring client's round trips alone and loaded. Their `repetitionMedians` are per
    /// phase block; CPU per round trip is the measuring process's and the server's (loaded: the
    /// server's CPU time includes serving the other clients).
    public var alone: LatencyResult
    public var loaded: LatencyResult
    /// CPU time of the server, and of the load process, as a share of one CPU over the loaded
    /// blocks.
    public var serverCPUShareLoaded: Double?
    public var loadCPUShare: Double?

    /// p99 loaded ÷ p99 alone: target 6 asks for at most 2.
    public var p99Ratio: Double { Double(loaded.p99) / Double(max(1, alone.p99)) }
    public var p50Ratio: Double { Double(loaded.p50) / Double(max(1, alone.p50)) }

    /// The target's bound on ``p99Ratio``.
    public static let targetRatio = 2.0

    /// `scale/<transport>/<framing>/<placement>/<bytes>/<clients>-clients`.
    public var name: String {
        ["scale", transport, framing.rawValue, placement.rawValue, String(payloadBytes), "\(clients)-clients"].joined(separator: "/")
    }
}

/// Runs a ``ScalePlan``: one `ipcbench peer` server, this process as the measuring client, and
/// for each loaded block an `ipcbench load` process with the other clients.
public struct ScaleRunner: Sendable {
    public var plan: ScalePlan
    public var progress: ProgressReporter

    public init(plan: ScalePlan, progress: ProgressReporter) {
        self.plan = plan
        self.progress = progress
    }

    /// - Throws: ``IPCError`` if a process cannot be started, a request fails, or the load
    ///   process does not report.
    public func run() async throws -> ScaleResult {
        let placement = plan.placement.requiredCPUCount <= CPUAffinity.onlineCount ? plan.placement : .sameCore
        let group = try TemporaryGroup()
        defer { group.remove() }
        let originalAffinity = CPUAffinity.current()
        defer { try? CPUAffinity.pinCurrentProcess(to: originalAffinity) }
        let endpoint = try Endpoint(group: group.directory, name: "\(group.directory.identifier).scale")
        let server = try PeerProcess(transport: "unix-socket", framing: .binary, endpoint: endpoint, role: .server, cpu: placement.cpus?.peer)
        defer { server.stop() }
        let connection = try await UnixSocketTransport(framing: .binary).connect(to: endpoint, options: .defaults)
        defer { connection.invalidate() }
        if let cpus = placement.cpus { try CPUAffinity.pinCurrentProcess(to: [cpus.local]) }
        var loadArguments = [
            "load", "--group", group.directory.path, "--endpoint", endpoint.name, "--clients", String(plan.clients),
            "--rate", String(plan.requestsPerSecondPerClient), "--payload", String(plan.payloadBytes),
        ]
        if let cpu = placement.cpus?.local { loadArguments += ["--cpu", String(cpu)] }

        var alone = LatencyAccumulator()
        var loaded = LatencyAccumulator()
        var reports: [ScaleLoad.Report] = []
        var loadedWall: UInt64 = 0
        var serverLoadedCPU: UInt64? = 0
        var loadCPU: UInt64? = 0
        let label = "scale: \(plan.clients) clients"
        for repetition in 1...plan.repetitions {
            progress.begin(step: repetition, of: plan.repetitions, label: label)
            try await measureBlock(connection, server: server.pid, into: &alone)
            let load = try PeerProcess(arguments: loadArguments)
            let report: ScaleLoad.Report
            do {
                try await Task.sleep(for: plan.settle)
                let loadBefore = processCPUNanoseconds(pid: load.pid)
                let block = try await measureBlock(connection, server: server.pid, into: &loaded)
                let loadAfter = processCPUNanoseconds(pid: load.pid)
                loadedWall += block.wall
                serverLoadedCPU = add(serverLoadedCPU, block.serverCPU)
                loadCPU = add(loadCPU, loadBefore.flatMap { before in loadAfter.map { $0 - before } })
                let output = load.stopReadingOutput()
                guard let parsed = ScaleLoad.Report(output: output) else {
                    throw IPCError(code: .transportFailure, message: "the load process did not report (said \(output.debugDescription))")
                }
                report = parsed
            } catch {
                load.kill()
                throw error
            }
            reports.append(report)
            progress.end(label: label, summary: String(format: "%.0f requests/s served", report.servedPerSecond))
        }
        let rates = reports.map(\.servedPerSecond)
        let warmup = plan.warmupPerBlock * plan.repetitions
        return ScaleResult(
            transport: "unix-socket", framing: .binary, placement: placement, loadCPU: placement.cpus?.local,
            clients: plan.clients, payloadBytes: plan.payloadBytes, requestsPerSecondPerClient: plan.requestsPerSecondPerClient,
            offeredRequestsPerSecond: plan.requestsPerSecondPerClient * Double(plan.clients),
            achievedRequestsPerSecond: rates.sorted()[rates.count / 2], repetitionAchievedRequestsPerSecond: rates,
            skippedSlots: reports.reduce(0) { $0 + $1.skipped },
            alone: alone.result(transport: "unix-socket", framing: .binary, placement: placement, payloadBytes: plan.payloadBytes, warmup: warmup),
            loaded: loaded.result(transport: "unix-socket", framing: .binary, placement: placement, payloadBytes: plan.payloadBytes, warmup: warmup),
            serverCPUShareLoaded: serverLoadedCPU.map { Double($0) / Double(max(1, loadedWall)) },
            loadCPUShare: loadCPU.map { Double($0) / Double(max(1, loadedWall)) }
        )
    }

    private func add(_ total: UInt64?, _ value: UInt64?) -> UInt64? {
        guard let total, let value else { return nil }
        return total + value
    }

    /// Warms up, then measures one block into `accumulator`; returns its wall time and the
    /// server's CPU time over it.
    @discardableResult
    private func measureBlock(_ connection: some MessageConnection, server: Int32, into accumulator: inout LatencyAccumulator) async throws -> (wall: UInt64, serverCPU: UInt64?) {
        let label = "scale \(plan.payloadBytes) B"
        _ = try await timedEchoRoundTrips(connection, size: plan.payloadBytes, count: plan.warmupPerBlock, label: label)
        let before = CPUReading(peer: server)
        let start = monotonicNanoseconds()
        let times = try await timedEchoRoundTrips(connection, size: plan.payloadBytes, count: plan.samplesPerBlock, label: label)
        let wall = monotonicNanoseconds() - start
        let after = CPUReading(peer: server)
        accumulator.record(block: times, cpuBefore: before, cpuAfter: after)
        return (wall, before.peer.flatMap { before in after.peer.map { $0 - before } })
    }
}
