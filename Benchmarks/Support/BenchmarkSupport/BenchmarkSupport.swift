import Benchmark

/// The configuration every suite starts from: time, throughput and allocations per operation,
/// with `tolerance` allocations of room either way in the threshold check (an absolute tolerance
/// alone: package-benchmark fails a check that exceeds either kind). Only allocation counts are
/// held to a threshold: they are exact, while times on a shared two-CPU machine move by more
/// than any useful tolerance.
public func suiteConfiguration(tolerance: Int) -> Benchmark.Configuration {
    .init(
        metrics: [.wallClock, .throughput, .mallocCountTotal],
        timeUnits: .nanoseconds,
        // Fixed units, so the Markdown tables read the same from run to run (and parse).
        units: [.mallocCountTotal: .count, .throughput: .count],
        warmupIterations: 10,
        maxDuration: .seconds(1),
        maxIterations: 100_000,
        thresholds: [.mallocCountTotal: .init(absolute: [.p90: tolerance])]
    )
}

/// A size for a benchmark's name. Names hold no space or slash: package-benchmark 1.38.1 writes
/// a threshold file under the name with those replaced by underscores, but looks it up under
/// the name as it is.
public func sizeLabel(_ bytes: Int) -> String {
    bytes >= 1 << 20 ? "\(bytes >> 20)MiB" : bytes >= 1024 ? "\(bytes >> 10)KiB" : "\(bytes)B"
}
