import Benchmark
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// The configuration every suite starts from: time, throughput and allocations per operation,
/// with `tolerance` allocations of room either way in the threshold check (an absolute tolerance
/// alone: package-benchmark fails a check that exceeds either kind). Only allocation counts are
/// held to a threshold: they are exact, while times on a shared two-CPU machine move by more
/// than any useful tolerance. Each benchmark runs for a second at most, a fifth of that when
/// `IPCBENCH_BENCHMARKS_QUICK` is 1 (`Scripts/benchmarks.sh --quick`, as CI runs it: the
/// allocation counts it checks are per operation and do not need the samples).
public func suiteConfiguration(tolerance: Int) -> Benchmark.Configuration {
    .init(
        metrics: [.wallClock, .throughput, .mallocCountTotal],
        timeUnits: .nanoseconds,
        // Fixed units, so the Markdown tables read the same from run to run (and parse).
        units: [.mallocCountTotal: .count, .throughput: .count],
        warmupIterations: 10,
        maxDuration: quickRun ? .milliseconds(200) : .seconds(1),
        maxIterations: 100_000,
        thresholds: [.mallocCountTotal: .init(absolute: [.p90: tolerance])]
    )
}

/// Whether `IPCBENCH_BENCHMARKS_QUICK` asks for short runs.
private let quickRun = getenv("IPCBENCH_BENCHMARKS_QUICK").map { String(cString: $0) } == "1"

/// A size for a benchmark's name. Names hold no space or slash: package-benchmark 1.38.1 writes
/// a threshold file under the name with those replaced by underscores, but looks it up under
/// the name as it is.
public func sizeLabel(_ bytes: Int) -> String {
    bytes >= 1 << 20 ? "\(bytes >> 20)MiB" : bytes >= 1024 ? "\(bytes >> 10)KiB" : "\(bytes)B"
}
