import ArgumentParser
import Foundation
import IPCBenchKit
import IPCSystem

struct FloorCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "floor",
        abstract: "Measure the native floor of each kernel mechanism on its own.",
        discussion: """
        A raw C ping-pong per mechanism against a floor peer process, timed like a transport's \
        round trip (same clock, histogram, placement and sample counts as 'run'). Prints a table; \
        with --output, writes results.json and report.md there as 'run' does.
        """
    )

    @Option(name: .customLong("mechanism"), help: "Mechanism; repeat for several. Known: \(FloorMechanism.allCases.map(\.rawValue).joined(separator: ", ")). Default: all.")
    var mechanisms: [FloorMechanism] = []

    @Option(name: .customLong("placement"), help: "Core placement: same-core, split-cores or unpinned; repeat for several. Default: same-core and split-cores.")
    var placements: [Placement] = []

    @Option(name: .customLong("size"), help: "Payload size in bytes; repeat for several. Default: 0, 64, 4096, 65536 and 1048576.")
    var sizes: [Int] = []

    @Option(help: "Multiply the default sample counts, as for 'run'.")
    var sampleScale: Double = 1

    @Option(help: "Directory for results.json and report.md.")
    var output: String?

    func validate() throws {
        guard sizes.allSatisfy({ (0...(64 << 20)).contains($0) }) else { throw ValidationError("--size takes 0 to \(64 << 20) bytes") }
        guard sampleScale > 0 else { throw ValidationError("--sample-scale must be positive") }
    }

    func run() async throws {
        let plan = LatencyPlan(
            placements: placements.isEmpty ? [.sameCore, .splitCores] : placements,
            payloadSizes: sizes.isEmpty ? [0, 64, 4096, 65536, 1 << 20] : sizes,
            sampleScale: sampleScale
        )
        let progress = ProgressReporter()
        var results: [LatencyResult] = []
        let unavailable = (mechanisms.isEmpty ? FloorMechanism.allCases : mechanisms).filter { !$0.isAvailable }
        for mechanism in unavailable {
            FileHandle.standardError.write(Data("skipped \(mechanism.resultName): this kernel does not let this process use io_uring (kernel.io_uring_disabled, or a seccomp filter)\n".utf8))
        }
        let chosenMechanisms = (mechanisms.isEmpty ? FloorMechanism.allCases : mechanisms).filter(\.isAvailable)
        let runnablePlacements = plan.placements.filter { $0.requiredCPUCount <= CPUAffinity.onlineCount }
        let total = chosenMechanisms.reduce(0) { sum, mechanism in
            sum + runnablePlacements.filter { !mechanism.spins || $0.spreadsProcesses }.count * plan.payloadSizes.count
        }
        for mechanism in chosenMechanisms {
            // Two spinning ends on one core would each wait out the other's time slice.
            for placement in runnablePlacements where !mechanism.spins || placement.spreadsProcesses {
                for size in plan.payloadSizes {
                    let label = "\(mechanism.resultName) \(placement) \(formatBytes(size))"
                    progress.begin(step: results.count + 1, of: total, label: label)
                    let result = try await NativeFloor.measure(mechanism, placement: placement, payloadSize: size, samples: plan.samples(forPayload: size), warmup: plan.warmup(forPayload: size))
                    progress.end(label: label, summary: "p50 \(formatMicroseconds(result.p50)) p99 \(formatMicroseconds(result.p99))")
                    results.append(result)
                }
            }
        }
        print(ReportRenderer.table(results), terminator: "")
        if let output {
            let command = (["ipcbench"] + CommandLine.arguments.dropFirst()).joined(separator: " ")
            try ResultStore.write(RunResults(context: .current(command: command), latency: results), to: output)
            progress.note("wrote \(output)/results.json and \(output)/report.md")
        }
    }
}
