import Foundation
public import IPCEngine
public import IPCFraming

/// The result file `ipcbench` writes. The schema is versioned: readers check ``schema``.
public struct RunResults: Codable, Sendable {
    public static let currentSchema = "ipcbench.results/1"

    public var schema: String
    public var context: RunContext
    public var latency: [LatencyResult]
    /// One-way throughput; absent in files from before it was measured.
    public var throughput: [ThroughputResult]?
    /// Time from SIGKILL of the peer to the invalidation handler, per transport.
    public var invalidation: [InvalidationResult]
    /// Framing and secure decoding measured in this process.
    public var inProcess: [InProcessResult]
    /// One client's latency to a Unix socket server alone and with other clients sending;
    /// absent in files from before it was measured.
    public var scale: [ScaleResult]?
    /// Reference systems (``ReferenceSystem``) asked for and not measured, or measured in part,
    /// with the reason; absent when none was skipped.
    public var skippedReferences: [SkippedReference]?
    /// Callbacks that held an event loop's thread for longer than its stall threshold (100 ms
    /// by default), in this process and in the peers (``LoopStallRecord``): empty when none did;
    /// absent in files from before stalls were counted.
    public var loopStalls: [LoopStallRecord]?
    /// The same measurements as Google Benchmark JSON entries (one `iteration` entry per
    /// repetition block, then a `median` aggregate), so its `compare.py` can read this file.
    public var benchmarks: [BenchmarkEntry]

    public init(
        context: RunContext, latency: [LatencyResult], throughput: [ThroughputResult] = [], invalidation: [InvalidationResult] = [],
        inProcess: [InProcessResult] = [], scale: [ScaleResult] = [], skippedReferences: [SkippedReference] = [], loopStalls: [LoopStallRecord] = []
    ) {
        self.loopStalls = loopStalls
        self.skippedReferences = skippedReferences.isEmpty ? nil : skippedReferences
        self.schema = Self.currentSchema
        self.context = context
        self.latency = latency
        self.throughput = throughput
        self.invalidation = invalidation
        self.inProcess = inProcess
        self.scale = scale.isEmpty ? nil : scale
        self.benchmarks = latency.flatMap { BenchmarkEntry.entries(for: $0) } + throughput.flatMap(BenchmarkEntry.entries(for:))
            + inProcess.flatMap(BenchmarkEntry.entries(for:))
            + scale.flatMap { [BenchmarkEntry.entries(for: $0.alone, name: $0.name + "/alone"), BenchmarkEntry.entries(for: $0.loaded, name: $0.name + "/loaded")].joined() }
    }
}

/// One entry of Google Benchmark's JSON output (`--benchmark_format=json`), with ipcbench's
/// percentiles and placement as extra fields (Google Benchmark's tools ignore fields they do not know).
public struct BenchmarkEntry: Codable, Sendable {
    public var name: String
    public var runName: String
    public var runType: String
    public var aggregateName: String?
    public var repetitions: Int
    public var repetitionIndex: Int?
    public var threads: Int
    public var iterations: Int
    public var realTime: Double
    public var cpuTime: Double
    public var timeUnit: String
    public var placement: Placement?
    public var payloadBytes: Int
    public var p50: UInt64?
    public var p99: UInt64?
    public var p999: UInt64?
    /// Throughput entries: messages and payload bytes per second, as Google Benchmark's
    /// `items_per_second` and `bytes_per_second` counters.
    public var itemsPerSecond: Double?
    public var bytesPerSecond: Double?

    enum CodingKeys: String, CodingKey {
        case name, repetitions, threads, iterations, placement, p50, p99, p999
        case itemsPerSecond = "items_per_second", bytesPerSecond = "bytes_per_second"
        case runName = "run_name", runType = "run_type", aggregateName = "aggregate_name"
        case repetitionIndex = "repetition_index", realTime = "real_time", cpuTime = "cpu_time"
        case timeUnit = "time_unit", payloadBytes = "payload_bytes"
    }

    /// `name` replaces the result's own (``LatencyResult/name``), for the phases of a scale measurement.
    static func entries(for result: LatencyResult, name: String? = nil) -> [BenchmarkEntry] {
        let runName = name ?? result.name
        let cpu = (result.localCPUPerRoundTrip ?? 0) + (result.peerCPUPerRoundTrip ?? 0)
        let blocks = result.repetitionMedians
        func entry(_ realTime: UInt64, index: Int?, aggregate: String?) -> BenchmarkEntry {
            BenchmarkEntry(
                name: runName + (aggregate.map { "_" + $0 } ?? ""), runName: runName,
                runType: aggregate == nil ? "iteration" : "aggregate", aggregateName: aggregate,
                repetitions: blocks.count, repetitionIndex: index, threads: 1,
                iterations: aggregate == nil ? result.samples / max(1, blocks.count) : blocks.count,
                realTime: Double(realTime), cpuTime: cpu, timeUnit: "ns",
                placement: result.placement, payloadBytes: result.payloadBytes,
                p50: result.p50, p99: result.p99, p999: result.p999
            )
        }
        return blocks.enumerated().map { entry($1, index: $0, aggregate: nil) } + [entry(result.p50, index: nil, aggregate: "median")]
    }

    /// Real time is nanoseconds per message, so that lower is better as for every other entry.
    static func entries(for result: ThroughputResult) -> [BenchmarkEntry] {
        let cpu = (result.localCPUPerMessage ?? 0) + (result.peerCPUPerMessage ?? 0)
        let rates = result.repetitionMessagesPerSecond
        func entry(_ rate: Double, index: Int?, aggregate: String?) -> BenchmarkEntry {
            BenchmarkEntry(
                name: result.name + (aggregate.map { "_" + $0 } ?? ""), runName: result.name,
                runType: aggregate == nil ? "iteration" : "aggregate", aggregateName: aggregate,
                repetitions: rates.count, repetitionIndex: index, threads: 1,
                iterations: aggregate == nil ? result.messagesPerRepetition : rates.count,
                realTime: rate > 0 ? 1e9 / rate : 0, cpuTime: cpu, timeUnit: "ns",
                placement: result.placement, payloadBytes: result.payloadBytes,
                p50: nil, p99: nil, p999: nil,
                itemsPerSecond: rate, bytesPerSecond: rate * Double(result.payloadBytes)
            )
        }
        return rates.enumerated().map { entry($1, index: $0, aggregate: nil) } + [entry(result.messagesPerSecond, index: nil, aggregate: "median")]
    }

    static func entries(for result: InProcessResult) -> [BenchmarkEntry] {
        func entry(_ time: Double, index: Int?, aggregate: String?) -> BenchmarkEntry {
            BenchmarkEntry(
                name: result.name + (aggregate.map { "_" + $0 } ?? ""), runName: result.name,
                runType: aggregate == nil ? "iteration" : "aggregate", aggregateName: aggregate,
                repetitions: result.repetitionNanoseconds.count, repetitionIndex: index, threads: 1,
                iterations: result.operations / max(1, result.repetitionNanoseconds.count),
                realTime: time, cpuTime: time, timeUnit: "ns", placement: nil, payloadBytes: result.bytes,
                p50: nil, p99: nil, p999: nil
            )
        }
        return result.repetitionNanoseconds.enumerated().map { entry($1, index: $0, aggregate: nil) }
            + [entry(result.nanosecondsPerOperation, index: nil, aggregate: "median")]
    }
}

/// How and where a run happened, so that numbers are never quoted without their conditions.
public struct RunContext: Codable, Sendable {
    public var date: String
    public var hostname: String
    public var cpuModel: String
    public var cpuCount: Int
    public var kernel: String
    public var swiftVersion: String
    public var buildConfiguration: String
    public var command: String
    /// The CPU, kernel and mitigations in detail; absent in files from before it was recorded.
    public var machine: MachineDescription? = nil
    /// How the engine's loops moved the rest of large frames in this run: `io_uring`, or `epoll`
    /// with why (``IPCEngine/EventLoop/LargeTransfers/inUse()``); every process of the run
    /// inherits the same `IPCBENCH_LARGE_TRANSFERS`. Absent in files from before it was recorded.
    public var largeTransfers: String? = nil

    public static func current(command: String) -> RunContext {
        var name = utsname()
        uname(&name)
        let kernel = [name.sysname, name.release, name.machine].map { field in
            withUnsafeBytes(of: field) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
        }.joined(separator: " ")
        let cpuinfo = (try? String(contentsOfFile: "/proc/cpuinfo", encoding: .utf8)) ?? ""
        let model = cpuinfo.split(separator: "\n").first { $0.hasPrefix("model name") }
            .map { $0.split(separator: ":", maxSplits: 1).last.map { $0.trimmingCharacters(in: .whitespaces) } ?? "" } ?? "unknown"
        #if DEBUG
        let configuration = "debug"
        #else
        let configuration = "release"
        #endif
        return RunContext(
            date: ISO8601DateFormatter().string(from: Date()),
            hostname: ProcessInfo.processInfo.hostName,
            cpuModel: model,
            cpuCount: ProcessInfo.processInfo.activeProcessorCount,
            kernel: kernel,
            swiftVersion: Self.swiftVersion,
            buildConfiguration: configuration,
            command: command,
            machine: MachineDescription.current(cpuCount: ProcessInfo.processInfo.activeProcessorCount, kernel: kernel),
            largeTransfers: EventLoop.LargeTransfers.inUse()
        )
    }

    /// The CPU as reports show it: the machine's summary, or the model name of older files.
    public var cpuSummary: String {
        machine?.summary ?? "\(cpuModel) × \(cpuCount)"
    }

    static var swiftVersion: String {
        #if compiler(>=6.4)
        "6.4 or later"
        #elseif compiler(>=6.3)
        "6.3"
        #elseif compiler(>=6.2)
        "6.2"
        #else
        "6.1 or earlier"
        #endif
    }
}

/// Round-trip latency of one transport, framing, placement and payload size.
/// Times are nanoseconds, read from an HDR histogram with three significant digits.
public struct LatencyResult: Codable, Sendable {
    public var transport: String
    /// The framing, for transports that carry a selectable one; `nil` for the others.
    public var framing: Framing?
    public var placement: Placement
    /// `blocking` or `spin-then-block` (``IPCCore/WaitStrategy/name``), or `spin` for a spinning
    /// reference system's rows (``ReferenceSystem/spinWaitStrategy``); absent in files from
    /// before wait strategies were measured, which were all blocking.
    public var waitStrategy: String?
    /// The executor the harness's requests ran on, for transports that offer one
    /// (``IPCCore/MessageConnection/preferredTaskExecutor``): ``preferredExecutor``, the
    /// hop-free path, or ``globalExecutor``, what a task gets by default. `nil` for the others
    /// and in files from before it was recorded.
    public var executor: String? = nil
    /// How the peer answered the requests: ``taskHandler`` (the async request handler, tasks off
    /// the peer's loop: the main rows, what users are told to use) or ``onLoopHandler`` (the
    /// synchronous fast path on the loop). `nil` for floors and references, and in files from
    /// before it was recorded, whose peers all served on the loop.
    public var handler: String? = nil
    public var payloadBytes: Int
    public var warmup: Int
    public var samples: Int
    public var minimum: UInt64
    public var p50: UInt64
    public var p90: UInt64
    public var p99: UInt64
    public var p999: UInt64
    public var maximum: UInt64
    public var mean: Double
    public var standardDeviation: Double
    /// The median of each repetition (the samples are taken in ``repetitions`` blocks spread
    /// over the run): what `ipcbench compare` tests, and what Google Benchmark's tools read.
    public var repetitionMedians: [UInt64]
    /// CPU time this process and the peer used per round trip, in nanoseconds (`nil` if it could
    /// not be read).
    public var localCPUPerRoundTrip: Double?
    public var peerCPUPerRoundTrip: Double?
    /// Context switches (voluntary and involuntary, all threads) this process and the peer made
    /// per round trip; a raw C ping-pong makes 2.00 in all. `nil` if they could not be read, and
    /// in files from before they were recorded.
    public var localContextSwitchesPerRoundTrip: Double? = nil
    public var peerContextSwitchesPerRoundTrip: Double? = nil
    /// `true` for a reference system's row (`ref:<system>`: D-Bus, ZeroMQ, gRPC, SwiftNIO),
    /// absent otherwise. Its "local" side is the reference's own client process.
    public var reference: Bool? = nil

    /// The native floor this measurement is divided by: the floor of its transport's mechanism,
    /// same placement and payload, blocking, from `results` (one run's rows); `nil` for a floor
    /// itself and for a transport without one.
    public func floor(in results: [LatencyResult]) -> LatencyResult? {
        guard let mechanism = FloorMechanism(transport: transport) else { return nil }
        return results.first { $0.transport == mechanism.resultName && $0.placement == placement && $0.payloadBytes == payloadBytes && !$0.spins }
    }

    /// The floor that does the kernel work this measurement's round trip does, same placement
    /// and payload, from `results`: for a blocking row the fastest (p50) of the
    /// ``FloorMechanism/sameWorkFloors`` of its transport's mechanism that the run measured
    /// (epoll or io_uring waits, or the journal protocol), for a spinning row
    /// ``FloorMechanism/spinning``. `nil` for floors and where there is none.
    /// A row whose peer served with the async handler off its loop (``taskHandler``) is divided
    /// by the hand-off floor where the run measured one (``FloorMechanism/handOff``, and
    /// ``FloorMechanism/spinningHandOff`` for a spinning row): the event loop's kernel work plus
    /// one thread hand-over per request.
    public func sameWorkFloor(in results: [LatencyResult]) -> LatencyResult? {
        guard let base = FloorMechanism(transport: transport) else { return nil }
        func row(_ mechanism: FloorMechanism) -> LatencyResult? {
            results.first { $0.transport == mechanism.resultName && $0.placement == placement && $0.payloadBytes == payloadBytes }
        }
        if handler == Self.taskHandler, let handOff = spins ? base.spinningHandOff : base.handOff, let floor = row(handOff) { return floor }
        if spins { return base.spinning.flatMap(row) }
        return base.sameWorkFloors.compactMap(row).min { $0.p50 < $1.p50 }
    }

    /// Both processes' context switches per round trip.
    public var contextSwitchesPerRoundTrip: Double? {
        localContextSwitchesPerRoundTrip.flatMap { local in peerContextSwitchesPerRoundTrip.map { local + $0 } }
    }

    /// Repetitions a run's samples are taken in.
    public static let repetitions = 10

    static func median(_ values: [UInt64]) -> UInt64 {
        let sorted = values.sorted()
        return sorted[sorted.count / 2]
    }

    /// Whether both ends spun before blocking.
    public var spins: Bool { (waitStrategy ?? "blocking") != "blocking" }

    /// ``executor`` when the harness's task preferred the connection's executor.
    public static let preferredExecutor = "preferred"
    /// ``executor`` when the harness's task ran on Swift's global executor.
    public static let globalExecutor = "global"

    /// ``handler`` when the peer served with the async request handler (on the global
    /// executor; `task-on-loop` when its tasks started on the loop's executor).
    public static let taskHandler = "task"
    /// ``handler`` when the peer served with the on-loop fast path.
    public static let onLoopHandler = "on-loop"

    /// Whether the requests ran on the global executor although the transport offers its own.
    public var onGlobalExecutor: Bool { executor == Self.globalExecutor }

    /// Whether the peer served with the on-loop fast path.
    public var onLoopHandler: Bool { handler == Self.onLoopHandler }

    /// The handler, when it is not the default async one on the serving threads (`on-loop`,
    /// `task-on-loop`): what the report's `wait` column and the row's name add.
    var handlerVariant: String? { Self.handlerVariant(handler) }

    static func handlerVariant(_ handler: String?) -> String? {
        guard let handler, handler != taskHandler else { return nil }
        return handler
    }

    /// The wait strategy, and the executor and handler when they are not the main ones: the
    /// report's `wait` column.
    public var waitDescription: String {
        (waitStrategy ?? "blocking") + (onGlobalExecutor ? ", global executor" : "") + (handlerVariant.map { ", \($0) handler" } ?? "")
    }

    /// A stable name for this measurement:
    /// `latency/<transport>[/<framing>]/<placement>[/spin-then-block][/global-executor][/<handler>-handler]/<bytes>`.
    public var name: String {
        (["latency", transport] + (framing.map { [$0.rawValue] } ?? []) + [placement.rawValue]
            + (spins ? [waitStrategy ?? ""] : []) + (onGlobalExecutor ? ["global-executor"] : [])
            + (handlerVariant.map { ["\($0)-handler"] } ?? []) + [String(payloadBytes)]).joined(separator: "/")
    }
}

/// What one process's event loop counted as stalls during a run (``IPCEngine/LoopStalls``).
public struct LoopStallRecord: Codable, Sendable, Equatable {
    /// `harness`, or `peer of <the measurement's label>`.
    public var process: String
    public var count: Int
    public var longestMilliseconds: Double
    /// What ran too long, each named once.
    public var culprits: [String]

    public init(process: String, stalls: LoopStalls) {
        self.process = process
        count = stalls.count
        longestMilliseconds = stalls.longestMilliseconds
        culprits = stalls.culprits
    }
}
