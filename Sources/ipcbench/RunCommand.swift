public import ArgumentParser
import CMallocCounter
import Foundation
import IPCBenchKit
import IPCConformance
import IPCCore
import IPCEngine
import IPCFraming

struct RunCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "run",
        abstract: "Measure latency and throughput against peer processes (the default command).",
        discussion: """
        For every transport, framing and core placement: round-trip latency (HDR percentiles, CPU \
        time per round trip on both sides) and one-way throughput (messages and bytes per second, \
        timed until the receiving process has consumed everything), beside the native floor of \
        each kernel mechanism, measured the same way in the same run. With split-cores, the \
        transports that support it are measured again with a spin-then-block wait strategy; \
        spinning is never used with both processes on one core. Then invalidation latency after \
        SIGKILL and in-process framing and secure-decoding speed: under 2 minutes on a 2-vCPU VM. \
        --full adds rows from Swift's global executor and with the on-loop handler, 0-byte \
        payloads, and the scale of a Unix socket server: one client's latency alone and while \
        --scale-clients other clients send --scale-rate requests/s each (from a separate load \
        process), interleaved (about 5 minutes). --references adds the reference systems.
        """
    )

    @Option(name: .customLong("transport"), help: "Transport to measure; repeat for several. Known: \(TransportCatalog.names.joined(separator: ", ")). Default: all.")
    var transports: [String] = []

    @Option(name: .customLong("framing"), help: "Framing: binary, http or llbsd (HTTP compatible with LLBSDMessaging peers); repeat for several. Default: binary and http.")
    var framings: [Framing] = []

    @Option(name: .customLong("placement"), help: "Core placement: same-core, split-cores or unpinned; repeat for several. Default: same-core and split-cores.")
    var placements: [Placement] = []

    @Option(help: "Payload sizes in bytes, comma-separated. Default: 64,4096,65536,1048576; with --full also 0.")
    var sizes: String?

    @Flag(help: ArgumentHelp(
        "Everything: the default run, and also the global-executor rows, the on-loop-handler rows, the scale measurement and 0-byte payloads.",
        discussion: "The default run answers which transport to use and how close each is to its floor (every transport, framing and placement, the floors, spinning, throughput, peer death, in-process framing and decoding): 110 s on this repository's 2-vCPU VM. --full took 266 s there. --references adds the reference systems to the sweeps and their peer-death trials: Scripts/bench.sh --references --full took 14 min 14 s there on a fresh clone, building the reference programs from nothing (README.md has the measured times). The --skip-… options apply to --full as well."
    ))
    var full = false

    @Option(help: "Multiply the default sample counts (20,000 round trips up to 4 KiB, 5,000 to 64 KiB, 1,000 above).")
    var sampleScale: Double = 1

    @Flag(help: "A smoke run: 5% of the samples. Checks that everything works; its numbers are rough.")
    var quick = false

    @Option(help: "Directory for results.json and report.md. Default: Reports/runs/<UTC date and time>.")
    var output: String?

    @Flag(help: "Skip the native floor (a raw C ping-pong over each transport's kernel mechanism).")
    var skipFloor = false

    @Flag(help: "Skip measuring the time from SIGKILL of a peer to invalidation (and, with --references, the time each reference system's client takes to notice its server's death; a system that does not notice costs its client's 10 s deadline).")
    var skipInvalidation = false

    @Flag(help: "Skip one-way throughput.")
    var skipThroughput = false

    @Flag(help: ArgumentHelp(
        "With --full: skip the global-executor rows.",
        discussion: "Round trips run on the connection's preferred executor (the event loop that reads its replies, for transports built on the connection engine). --full also measures the same connections from a task on Swift's global executor, what a task gets without a preference."
    ))
    var skipGlobalExecutor = false

    @Flag(help: ArgumentHelp(
        "With --full: skip the on-loop handler rows.",
        discussion: "The main rows' peer answers with the async request handler, as tasks off its event loop (what users are told to serve with). --full also measures, against a peer of its own, the on-loop fast path (a synchronous handler on the loop): binary framing, blocking and (split cores) spinning."
    ))
    var skipOnLoopHandler = false

    @Option(help: ArgumentHelp(
        "How the main rows' peer serves: task or task-on-loop.",
        discussion: "task (the default): the async request handler as tasks on the engine's serving threads, off the peer's loop. task-on-loop: the same handler with its tasks started on the loop's executor (no thread hand-over; the handler runs on the loop until it suspends)."
    ))
    var handler: ConformancePeer.Serving = .task

    @Option(help: "Spin time of the spin-then-block wait strategy, in microseconds; 0 measures blocking waits only.")
    var spinMicroseconds: Int64 = 50

    @Flag(help: "With --full: skip the scale measurement (one client's latency to a Unix socket server, alone and with other clients sending).")
    var skipScale = false

    @Option(help: "Scale measurement: the other clients connected and sending during the loaded phase.")
    var scaleClients: Int = 64

    @Option(help: "Scale measurement: echo requests per second from each other client.")
    var scaleRate: Double = 500

    @Option(help: "Scale measurement: where this process and the server run (the load process runs on this process's CPU).")
    var scalePlacement: Placement = .splitCores

    @Flag(help: "Skip the in-process framing and secure-decoding measurements.")
    var skipInProcess = false

    @Flag(help: "Run only the in-process framing and secure-decoding measurements (no peer process).")
    var inProcessOnly = false

    @Option(help: ArgumentHelp(
        "Also measure the reference systems (ZeroMQ, D-Bus, SwiftNIO, gRPC, iceoryx) whose programs are in this directory.",
        discussion: "Benchmarks/References/build.sh builds them into Benchmarks/References/.build/bin (Scripts/bench.sh --references does both). A system whose program is missing, or whose server does not start, is listed as skipped in the report with the reason.",
        valueName: "directory"
    ))
    var references: String?

    @Option(name: .customLong("reference"), help: "With --references: measure only this system (repeat for several): \(ReferenceSystem.catalog.flatMap(\.systems).joined(separator: ", ")).")
    var referenceSystems: [String] = []

    @Flag(help: "Do not show progress on standard error.")
    var noProgress = false

    func validate() throws {
        for transport in transports where !TransportCatalog.names.contains(transport) {
            throw ValidationError("unknown transport '\(transport)'; known: \(TransportCatalog.names.joined(separator: ", "))")
        }
        _ = try parsedSizes()
        if inProcessOnly && skipInProcess { throw ValidationError("--in-process-only and --skip-in-process exclude each other") }
        guard handler == .task || handler == .taskOnLoop else {
            throw ValidationError("--handler takes task or task-on-loop (the on-loop fast path has rows of its own; --skip-on-loop-handler skips them)")
        }
        guard sampleScale > 0 else { throw ValidationError("--sample-scale must be positive") }
        guard (1...4096).contains(scaleClients) else { throw ValidationError("--scale-clients takes 1 to 4096") }
        guard scaleRate > 0, scaleRate <= 100_000 else { throw ValidationError("--scale-rate takes a positive rate up to 100000") }
        guard (0...1_000_000).contains(spinMicroseconds) else { throw ValidationError("--spin-microseconds takes 0 to 1000000") }
        let known = ReferenceSystem.catalog.flatMap(\.systems)
        for system in referenceSystems where !known.contains(system) {
            throw ValidationError("unknown reference system '\(system)'; known: \(known.joined(separator: ", "))")
        }
        if !referenceSystems.isEmpty, references == nil { throw ValidationError("--reference needs --references <directory>") }
        if let references {
            var isDirectory: ObjCBool = false
            guard FileManager.default.fileExists(atPath: references, isDirectory: &isDirectory), isDirectory.boolValue else {
                throw ValidationError("--references: no directory at \(references); build the reference programs with Benchmarks/References/build.sh")
            }
        }
    }

    func parsedSizes() throws -> [Int] {
        let sizes = sizes ?? (full ? "0,64,4096,65536,1048576" : "64,4096,65536,1048576")
        let values = sizes.split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) }
        let parsed = values.compactMap { Int($0) }
        guard !parsed.isEmpty, parsed.count == values.count, parsed.allSatisfy({ $0 >= 0 && $0 <= 64 << 20 }) else {
            throw ValidationError("--sizes takes comma-separated byte counts from 0 to \(64 << 20), got '\(sizes)'")
        }
        return parsed
    }

    func run() async throws {
        let discovered = references.map { ReferenceSystem.discover(in: URL(fileURLWithPath: $0), only: referenceSystems) } ?? (systems: [], skipped: [])
        let plan = LatencyPlan(
            transports: transports.isEmpty ? TransportCatalog.names : transports,
            framings: framings.isEmpty ? Framing.measuredByDefault : framings,
            placements: placements.isEmpty ? [.sameCore, .splitCores] : placements,
            payloadSizes: try parsedSizes(),
            sampleScale: quick ? 0.05 : sampleScale,
            includeFloors: !skipFloor,
            waitStrategies: spinMicroseconds > 0 ? [.blocking, WaitStrategy(spinFor: .microseconds(spinMicroseconds))] : [.blocking],
            includeThroughput: !skipThroughput,
            includeGlobalExecutor: full && !skipGlobalExecutor,
            includeOnLoopHandler: full && !skipOnLoopHandler,
            mainServing: handler,
            references: inProcessOnly ? [] : discovered.systems
        )
        let progress = ProgressReporter(enabled: !noProgress)
        let command = (["ipcbench"] + CommandLine.arguments.dropFirst()).joined(separator: " ")
        let crossProcess = inProcessOnly ? CrossProcessResults() : try await LatencyRunner(plan: plan, progress: progress).run()
        let scalePlan = ScalePlan(clients: scaleClients, requestsPerSecondPerClient: scaleRate, placement: scalePlacement)
        let measuresScale = full && !skipScale && !inProcessOnly && plan.transports.contains("unix-socket")
        let scale = measuresScale ? [try await ScaleRunner(plan: quick ? scalePlan.quick : scalePlan, progress: progress).run()] : []
        var invalidation = skipInvalidation || inProcessOnly ? [] : try await InvalidationRunner(transports: plan.transports, trials: quick ? 3 : 7, progress: progress).run()
        // The reference systems that were measured, killed under a client in turn.
        let measuredReferences = discovered.systems.filter { reference in !reference.spins && crossProcess.latency.contains { $0.transport == reference.resultName } }
        var peerDeathSkipped: [SkippedReference] = []
        if !skipInvalidation, !measuredReferences.isEmpty {
            let peerDeath = try await ReferencePeerDeathRunner(references: measuredReferences, trials: quick ? 1 : 3, progress: progress).run()
            invalidation += peerDeath.results
            peerDeathSkipped = peerDeath.skipped
        }
        let inProcess = skipInProcess ? [] : try InProcessRunner(
            repetitionBudget: quick ? .milliseconds(2) : .milliseconds(20), progress: progress,
            allocationCount: { ipc_thread_allocation_count() }
        ).run()
        let skipped = discovered.skipped + crossProcess.skippedReferences + peerDeathSkipped
        // This process's loop served the harness's own connections throughout.
        let ownStalls = (try? EventLoop.shared().stalls).map { LoopStallRecord(process: "harness", stalls: $0) }
        let loopStalls = (ownStalls.map { $0.count > 0 ? [$0] : [] } ?? []) + crossProcess.peerLoopStalls
        let results = RunResults(
            context: .current(command: command), latency: crossProcess.latency, throughput: crossProcess.throughput,
            invalidation: invalidation, inProcess: inProcess, scale: scale, skippedReferences: skipped, loopStalls: loopStalls
        )
        for line in ReportRenderer.skippedReferenceLines(skipped) { print(line) }
        for stall in loopStalls {
            print("event loop stalls in the \(stall.process): \(stall.count), the longest \(String(format: "%.0f", stall.longestMilliseconds)) ms (\(stall.culprits.joined(separator: "; ")))")
        }
        if !crossProcess.latency.isEmpty { print(ReportRenderer.table(crossProcess.latency), terminator: "") }
        if !crossProcess.throughput.isEmpty { print("\n" + ReportRenderer.throughputTable(crossProcess.throughput), terminator: "") }
        if !scale.isEmpty { print("\n" + ReportRenderer.scaleTable(scale), terminator: "") }
        if !invalidation.isEmpty { print("\n" + ReportRenderer.invalidationTable(invalidation), terminator: "") }
        if !inProcess.isEmpty { print("\n" + ReportRenderer.inProcessTable(inProcess), terminator: "") }
        let directory = output ?? "Reports/runs/" + Self.timestamp()
        try ResultStore.write(results, to: directory)
        progress.note("wrote \(directory)/results.json, report.md and report.html")
    }

    static func timestamp() -> String {
        let formatter = DateFormatter()
        formatter.locale = Locale(identifier: "en_US_POSIX")
        formatter.timeZone = TimeZone(identifier: "UTC")
        formatter.dateFormat = "yyyy-MM-dd'T'HHmmss'Z'"
        return formatter.string(from: Date())
    }
}

extension Framing: ExpressibleByArgument {}
extension Placement: ExpressibleByArgument {}
