// swift-tools-version: 6.1
import PackageDescription

// A transport written outside ipcbench, checked by ipcbench's conformance suite the way any
// third party would: by depending on the `IPCConformance` product.
let package = Package(
    name: "ToyTransport",
    platforms: [.macOS(.v15)],
    dependencies: [
        .package(name: "ipcbench", path: "../.."),
        // The sources use swift-system's FileDescriptor (an EngineChannel's descriptor).
        .package(url: "https://github.com/apple/swift-system", from: "1.4.0"),
    ],
    targets: [
        // The transport: AF_UNIX sequenced-packet sockets, one packet per message, served by
        // ipcbench's connection engine (the transport supplies an EngineChannel) and listener
        // kit (SocketEndpoint), with IPCSystem's socket calls and group-directory checks.
        .target(
            name: "ToyTransport",
            dependencies: [
                .product(name: "IPCCore", package: "ipcbench"), .product(name: "IPCEngine", package: "ipcbench"),
                .product(name: "IPCSystem", package: "ipcbench"), .product(name: "SystemPackage", package: "swift-system"),
            ]
        ),
        // The peer the suite starts in another process: ConformancePeer over the toy transport.
        .executableTarget(
            name: "toy-peer",
            dependencies: ["ToyTransport", .product(name: "IPCConformance", package: "ipcbench")]
        ),
        .testTarget(
            name: "ToyTransportTests",
            dependencies: ["ToyTransport", "toy-peer", .product(name: "IPCConformance", package: "ipcbench")]
        ),
    ],
    swiftLanguageModes: [.v6]
)
