// swift-tools-version: 6.1
// Instructions per round trip between two processes, counted by callgrind
// (Scripts/instructions.sh). A package of its own: package-benchmark's plugin runs every
// executable of the Benchmarks package as a suite, and this one is not a suite (valgrind cannot
// run an async main, which the suites have).
import PackageDescription

let package = Package(
    name: "round-trip-instructions",
    platforms: [.macOS(.v15)],
    dependencies: [.package(name: "ipcbench", path: "../..")],
    targets: [
        .target(name: "CFloorSystem"),
        .executableTarget(
            name: "round-trip-instructions",
            dependencies: [
                "CFloorSystem", .product(name: "IPCCore", package: "ipcbench"), .product(name: "UnixSocketTransport", package: "ipcbench"),
                .product(name: "NotifyTransport", package: "ipcbench"), .product(name: "MessagePortTransport", package: "ipcbench"),
            ]
        ),
    ],
    swiftLanguageModes: [.v6]
)
