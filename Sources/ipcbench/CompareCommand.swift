import ArgumentParser
import IPCBenchKit

struct CompareCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "compare",
        abstract: "Compare two result files (or run directories); exit 1 if a measurement regressed.",
        discussion: """
        Latency and throughput are compared (throughput as time per message, so that up is worse \
        for both). Each measurement's samples are recorded as 10 repetition blocks; a change is a \
        regression only if the median moved by more than --minimum-change AND a two-sided \
        Mann-Whitney U test over the blocks gives p < --alpha. Re-runs on a noisy machine differ \
        by a few percent; the defaults are chosen so that a build compared with a re-run of itself \
        passes (see docs/HARNESS.md). When the two files come from different machines (CPU \
        vendor, family, model, stepping, model name, maximum clock, CPU count, kernel or \
        mitigations differ), or one does not say, the first line says so and each measurement is \
        compared as a multiple of its native floor from the same run; measurements without a \
        floor are listed as not comparable.
        """
    )

    @Argument(help: "The baseline: a results.json, or the run directory that holds one.")
    var baseline: String

    @Argument(help: "The current run: a results.json, or the run directory that holds one.")
    var current: String

    @Option(help: "Significance level of the U test.")
    var alpha: Double = 0.01

    @Option(help: "Smallest relative change of the median that can count as a regression (0.25 = 25%).")
    var minimumChange: Double = 0.25

    func validate() throws {
        guard alpha > 0, alpha < 1 else { throw ValidationError("--alpha must be between 0 and 1") }
        guard minimumChange >= 0 else { throw ValidationError("--minimum-change must not be negative") }
    }

    func run() throws {
        let before = try ResultStore.read(baseline)
        let now = try ResultStore.read(current)
        let basis: Comparison.Basis
        switch (before.context.machine, now.context.machine) {
        case let (then?, here?) where then.isSameMachine(as: here):
            basis = .absolute
        case let (then?, here?):
            print("different machines: the baseline ran on \(then.summary), kernel \(then.kernel); the current run on \(here.summary), kernel \(here.kernel)\(then.mitigations == here.mitigations ? "" : ", other mitigations"). Absolute times are not comparable: comparing each measurement's ratio to its native floor measured in the same run.")
            basis = .ratioToFloor
        default:
            print("machine unknown: \(before.context.machine == nil ? "the baseline" : "the current run") records no machine description (a file from before it was recorded), so absolute times may not be comparable: comparing each measurement's ratio to its native floor measured in the same run.")
            basis = .ratioToFloor
        }
        let comparison = Comparison(baseline: before, current: now, alpha: alpha, minimumChange: minimumChange, basis: basis)
        print(comparison.table(), terminator: "")
        let regressions = comparison.rows.filter { $0.verdict == .regression }.count
        print(regressions == 0 ? "verdict: no regression" : "verdict: \(regressions) regression(s)")
        if regressions > 0 { throw ExitCode(1) }
    }
}
