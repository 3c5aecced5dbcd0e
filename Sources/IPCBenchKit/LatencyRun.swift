import Foundation
import Histogram
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

    public init(
        transports: [String] = TransportCatalog.names,
        framings: [Framing] = Framing.allCases,
        placements: [Placement] = [.sameCore, .splitCores],
        payloadSizes: [Int] = [0, 64, 4096, 65536, 1 << 20],
        sampleScale: Double = 1
    ) {
        self.transports = transports
        self.framings = framings
        self.placements = placements
        self.payloadSizes = payloadSizes
        self.sampleScale = sampleScale
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
public struct LatencyRunner: Sendable {
    public var plan: LatencyPlan
    public var progress: ProgressReporter

    public init(plan: LatencyPlan, progress: ProgressReporter) {
        self.plan = plan
        self.progress = progress
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
        let total = combinations.count * placements.count * plan.payloadSizes.count
        var results: [LatencyResult] = []
        let originalAffinity = CPUAffinity.current()
        defer { try? CPUAffinity.pinCurrentProcess(to: originalAffinity) }
        for (transportName, framing) in combinations {
            for placement in placements {
                try CPUAffinity.pinCurrentProcess(to: placement.cpus.map { [$0.local] } ?? originalAffinity)
                let transport = try TransportCatalog.transport(named: transportName, framing: framing ?? .binary)
                let variant = [transportName, framing?.rawValue].compactMap { $0 }.joined(separator: "-")
                let endpoint = try Endpoint(group: group.directory, name: "\(group.directory.identifier).bench-\(variant)-\(placement)")
                let peer = try PeerProcess(transport: transportName, framing: framing ?? .binary, endpoint: endpoint, role: .server, cpu: placement.cpus?.peer)
                defer { peer.stop() }
                for size in plan.payloadSizes {
                    let label = "\(variant) \(placement) \(formatBytes(size))"
                    progress.begin(step: results.count + 1, of: total, label: label)
                    var result = try await measure(transport, endpoint: endpoint, size: size, placement: placement, label: label)
                    result.framing = framing
                    progress.end(label: label, summary: "p50 \(formatMicroseconds(result.p50)) p99 \(formatMicroseconds(result.p99))")
                    results.append(result)
                }
            }
        }
        return results
    }

    private func measure<T: MessageTransport>(_ transport: T, endpoint: Endpoint, size: Int, placement: Placement, label: String) async throws -> LatencyResult {
        let connection = try transport.connect(to: endpoint, options: .defaults)
        defer { connection.invalidate() }
        let payload = [UInt8](repeating: 0xA5, count: size)
        let timeout = Duration.seconds(30)
        let warmup = plan.warmup(forPayload: size)
        let samples = plan.samples(forPayload: size)
        for _ in 0..<warmup {
            let reply = try await connection.request(payload, msgid: PeerRequest.echo, sendTimeout: timeout, receiveTimeout: timeout)
            guard reply == payload else { throw IPCError(code: .malformedPayload, message: "echo returned different bytes for \(label)") }
        }
        var histogram = Histogram<UInt64>(highestTrackableValue: 60_000_000_000, numberOfSignificantValueDigits: .three)
        let reportEvery = max(1, samples / 50)
        for index in 0..<samples {
            let start = monotonicNanoseconds()
            let reply = try await connection.request(payload, msgid: PeerRequest.echo, sendTimeout: timeout, receiveTimeout: timeout)
            let elapsed = monotonicNanoseconds() - start
            _ = histogram.record(elapsed)
            guard reply.count == size else {
                throw IPCError(code: .malformedPayload, message: "echo returned \(reply.count) bytes instead of \(size) for \(label)")
            }
            if index % reportEvery == 0 { progress.update(label: label, fraction: Double(index) / Double(samples)) }
        }
        return LatencyResult(
            transport: transport.name,
            framing: nil,
            placement: placement,
            payloadBytes: size,
            warmup: warmup,
            samples: samples,
            minimum: histogram.min,
            p50: histogram.valueAtPercentile(50),
            p90: histogram.valueAtPercentile(90),
            p99: histogram.valueAtPercentile(99),
            p999: histogram.valueAtPercentile(99.9),
            maximum: histogram.max,
            mean: histogram.mean,
            standardDeviation: histogram.stdDeviation
        )
    }
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
