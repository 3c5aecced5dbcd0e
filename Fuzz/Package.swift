// swift-tools-version: 6.1
// libFuzzer targets for ipcbench's decoders: a separate package, so that the main package's graph
// carries no fuzzing code. Build and run them with `Scripts/fuzz.sh` from the repository root.
import PackageDescription

let package = Package(
    name: "ipcbench-fuzz",
    platforms: [.macOS(.v15)],
    dependencies: [
        .package(name: "ipcbench", path: "../"),
    ],
    targets: [
        // What the targets share: the invariants each decoder must keep, checked with preconditions.
        .target(
            name: "FuzzSupport",
            dependencies: [
                .product(name: "IPCCore", package: "ipcbench"),
                .product(name: "IPCFraming", package: "ipcbench"),
                .product(name: "IPCSecureCoding", package: "ipcbench"),
            ]
        ),
        // One executable per fuzz target, each exporting LLVMFuzzerTestOneInput.
        .executableTarget(name: "FuzzBinaryFrameDecoder", dependencies: ["FuzzSupport"]),
        .executableTarget(name: "FuzzHTTPFrameDecoder", dependencies: ["FuzzSupport"]),
        .executableTarget(name: "FuzzReassemblyOracle", dependencies: ["FuzzSupport"]),
        .executableTarget(name: "FuzzJSONPayload", dependencies: ["FuzzSupport"]),
        .executableTarget(name: "FuzzPropertyListPayload", dependencies: ["FuzzSupport"]),
        .executableTarget(name: "FuzzKeyedArchivePayload", dependencies: ["FuzzSupport"]),
        .executableTarget(name: "FuzzBinaryCodablePayload", dependencies: ["FuzzSupport"]),
    ],
    swiftLanguageModes: [.v6]
)
