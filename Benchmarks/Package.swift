// swift-tools-version: 6.1
// The benchmarks of ipcbench, as a package of their own (as swift-nio does) so that users of the
// main package never build benchmark dependencies.
//
//   swift package benchmark                                   run every suite (from this folder)
//   swift package benchmark thresholds check --path Thresholds/6.3 --metric mallocCountTotal
//
// The Google Benchmark cross-check of the native floor is in FloorCrossCheck/ (make), and
// Scripts/benchmarks.sh at the top of the repository runs it, the suites and the instruction
// counter, round-trip-instructions (RoundTripInstructions/Sources): an executable of this
// package, not a suite, since the benchmark plugin takes as suites only the executables whose
// folder is in Benchmarks/Benchmarks; built here, it shares the release build of the engine
// with the suites.
import PackageDescription

let package = Package(
    name: "benchmarks",
    platforms: [.macOS(.v15)],
    dependencies: [
        .package(name: "ipcbench", path: "../"),
        // The malloc interposer gives the malloc counts; naming the trait also leaves out the
        // Swift 6.3 runtime interposer, which package-benchmark enables by default.
        .package(url: "https://github.com/ordo-one/benchmark", from: "1.38.1", traits: ["MallocInterposer"]),
    ],
    targets: [
        // What the suites share: their configuration and how sizes are named.
        .target(
            name: "BenchmarkSupport",
            dependencies: [.product(name: "Benchmark", package: "benchmark")],
            path: "Support/BenchmarkSupport"
        ),
        // Binary and HTTP/1.1 framing: encoding and reassembling frames of 64 B to 1 MiB.
        suite("FramingBenchmarks", measuring: ["IPCCore", "IPCFraming"]),
        // Secure decoding per codec, of accepted and refused payloads.
        suite("SecureCodingBenchmarks", measuring: ["IPCCore", "IPCSecureCoding"]),
        // Request/reply through the connection engine, both ends in one process.
        suite("EngineBenchmarks", measuring: ["IPCCore", "UnixSocketTransport", "NotifyTransport"]),
        // Instructions per round trip between two processes, counted by callgrind
        // (Scripts/instructions.sh), and the Swift floor: a plain executable, since valgrind
        // cannot run an async main, which the suites have.
        .target(name: "CFloorSystem", path: "RoundTripInstructions/Sources/CFloorSystem"),
        .executableTarget(
            name: "round-trip-instructions",
            dependencies: [
                "CFloorSystem", .product(name: "IPCCore", package: "ipcbench"), .product(name: "UnixSocketTransport", package: "ipcbench"),
                .product(name: "NotifyTransport", package: "ipcbench"), .product(name: "MessagePortTransport", package: "ipcbench"),
            ],
            path: "RoundTripInstructions/Sources/round-trip-instructions"
        ),
    ],
    swiftLanguageModes: [.v6]
)

/// A package-benchmark suite: an executable target in Benchmarks/<name>, which the benchmark
/// plugin finds and runs, measuring the main package's `products`.
func suite(_ name: String, measuring products: [String]) -> Target {
    .executableTarget(
        name: name,
        dependencies: [.product(name: "Benchmark", package: "benchmark"), "BenchmarkSupport"] + products.map { .product(name: $0, package: "ipcbench") },
        path: "Benchmarks/\(name)",
        plugins: [.plugin(name: "BenchmarkPlugin", package: "benchmark")]
    )
}
