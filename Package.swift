// swift-tools-version: 6.1
import PackageDescription

let package = Package(
    name: "ipcbench",
    platforms: [.macOS(.v15)],
    products: [
        .library(name: "IPCCore", targets: ["IPCCore"]),
        .library(name: "IPCFraming", targets: ["IPCFraming"]),
        .library(name: "IPCSecureCoding", targets: ["IPCSecureCoding"]),
        .library(name: "IPCSystem", targets: ["IPCSystem"]),
        .library(name: "IPCEngine", targets: ["IPCEngine"]),
        .library(name: "UnixSocketTransport", targets: ["UnixSocketTransport"]),
        .library(name: "MessagePortTransport", targets: ["MessagePortTransport"]),
        .library(name: "NotifyTransport", targets: ["NotifyTransport"]),
        .library(name: "IPCFileCoordination", targets: ["IPCFileCoordination"]),
        .library(name: "FilePresenterTransport", targets: ["FilePresenterTransport"]),
        .library(name: "Wormhole", targets: ["Wormhole"]),
        .library(name: "IPCConformance", targets: ["IPCConformance"]),
        .library(name: "IPCBenchKit", targets: ["IPCBenchKit"]),
        .executable(name: "ipcbench", targets: ["ipcbench"]),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-argument-parser", from: "1.5.0"),
        .package(url: "https://github.com/apple/swift-system", from: "1.4.0"),
        .package(url: "https://github.com/HdrHistogram/hdrhistogram-swift", from: "0.1.0"),
        .package(url: "https://github.com/apple/swift-collections", from: "1.1.0"),
    ],
    targets: [
        // Protocols and value types shared by every transport. No OS imports.
        .target(name: "IPCCore"),
        // Binary and HTTP/1.1 framing: encoders and incremental decoders. No OS imports.
        .target(name: "IPCFraming", dependencies: ["IPCCore"]),
        // Payload codecs that decode only the types a receiver allows.
        .target(name: "IPCSecureCoding", dependencies: ["IPCCore"]),
        // The one C shim: syscalls Glibc does not export (pidfd_open), and the message path's
        // system calls made directly, without glibc's thread-cancellation wrappers.
        .target(name: "CIPCShims"),
        // The native floor: raw C round trips per kernel mechanism, timed by the harness and by
        // the Google Benchmark cross-check in Benchmarks/.
        // Its message-path system calls are CIPCShims's direct ones, as the engine's are.
        .target(name: "CNativeFloor", dependencies: ["CIPCShims"]),
        // Linux system-call layer: typed descriptors, one EINTR-retry helper, sockets, processes.
        .target(
            name: "IPCSystem",
            dependencies: [
                "IPCCore", "CIPCShims",
                .product(name: "SystemPackage", package: "swift-system"),
            ]
        ),
        // The connection engine every transport shares: the event loop (one per process, a
        // TaskExecutor), request/reply, timeouts, cancellation, the bounded message stream,
        // invalidation, listener bookkeeping. A transport supplies an EngineChannel.
        .target(
            name: "IPCEngine",
            dependencies: [
                "IPCCore",
                // The Linux seam (Sources/IPCEngine/Linux): epoll, eventfd, timerfd, pidfd.
                .target(name: "IPCSystem", condition: .when(platforms: [.linux])),
                .target(name: "CIPCShims", condition: .when(platforms: [.linux])),
                .product(name: "SystemPackage", package: "swift-system"),
                .product(name: "HeapModule", package: "swift-collections"),
                .product(name: "DequeModule", package: "swift-collections"),
            ]
        ),
        // Transports: one folder each, same shape in each.
        .target(
            name: "UnixSocketTransport",
            dependencies: ["IPCCore", "IPCEngine", "IPCFraming", "IPCSystem", .product(name: "SystemPackage", package: "swift-system")],
            path: "Sources/Transports/UnixSocket"
        ),
        .target(
            name: "MessagePortTransport",
            dependencies: ["IPCCore", "IPCEngine", "IPCSystem", "CIPCShims", .product(name: "SystemPackage", package: "swift-system")],
            path: "Sources/Transports/MessagePort"
        ),
        .target(
            name: "NotifyTransport",
            dependencies: ["IPCCore", "IPCEngine", "IPCFraming", "IPCSystem", "CIPCShims", .product(name: "SystemPackage", package: "swift-system")],
            path: "Sources/Transports/Notify"
        ),
        // NSFileCoordinator / NSFilePresenter's counterpart: coordinated reads and writes (open
        // file description locks) and presenters told of changes and asked to save or
        // relinquish. Not a transport; the file-presenter transport's journals are built on it.
        .target(
            name: "IPCFileCoordination",
            dependencies: ["IPCCore", "IPCEngine", "IPCSystem", "CIPCShims", .product(name: "SystemPackage", package: "swift-system")]
        ),
        .target(
            name: "FilePresenterTransport",
            dependencies: [
                "IPCCore", "IPCEngine", "IPCFraming", "IPCSystem", "IPCFileCoordination", "CIPCShims",
                .product(name: "SystemPackage", package: "swift-system"),
            ],
            path: "Sources/Transports/FilePresenter"
        ),
        // MMWormhole's mailbox: the last message per identifier, stored in the group directory,
        // listeners told through any NamedNotificationCenter.
        .target(name: "Wormhole", dependencies: ["IPCCore", "IPCSystem", "IPCSecureCoding", "CIPCShims"]),
        // The conformance suite as a library any transport's tests can run: cases, the peer
        // service a peer executable runs, reports. No test framework: assertions throw.
        .target(
            name: "IPCConformance",
            dependencies: ["IPCCore", "IPCFraming", "IPCSecureCoding", .product(name: "SystemPackage", package: "swift-system")]
        ),
        // The harness as a library: peer mode, latency runs, reports. The executable is thin.
        .target(
            name: "IPCBenchKit",
            dependencies: [
                "IPCCore", "IPCEngine", "IPCFraming", "IPCSecureCoding", "IPCSystem", "UnixSocketTransport", "MessagePortTransport", "NotifyTransport",
                "CNativeFloor", "CIPCShims",
                "FilePresenterTransport", "IPCFileCoordination", "Wormhole",
                "IPCConformance",
                .product(name: "Histogram", package: "hdrhistogram-swift"),
                .product(name: "SystemPackage", package: "swift-system"),
            ]
        ),
        // Counting replacements of malloc and its kin, for the in-process allocation counts;
        // linked into the ipcbench executable only.
        .target(name: "CMallocCounter"),
        .executableTarget(
            name: "ipcbench",
            dependencies: [
                "IPCBenchKit", "NotifyTransport", "Wormhole", "IPCConformance", "IPCSystem", "CIPCShims", "CMallocCounter",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "SystemPackage", package: "swift-system"),
            ]
        ),
        // The engine in process, over a socketpair channel of the tests' own.
        .testTarget(name: "IPCEngineTests", dependencies: ["IPCCore", "IPCEngine", "IPCSystem", "CIPCShims", "IPCTestSupport"]),
        .testTarget(name: "IPCFramingTests", dependencies: ["IPCCore", "IPCFraming", "IPCTestSupport"]),
        .testTarget(name: "IPCSecureCodingTests", dependencies: ["IPCCore", "IPCSecureCoding", "IPCTestSupport"]),
        // Helpers shared by the test targets: temporary group directories, deadlines, probes.
        .target(name: "IPCTestSupport", dependencies: ["IPCCore", "IPCConformance"], path: "Tests/IPCTestSupport"),
        .testTarget(
            name: "UnixSocketTransportTests",
            dependencies: ["IPCCore", "IPCEngine", "IPCFraming", "IPCSystem", "UnixSocketTransport", "IPCBenchKit", "IPCConformance", "IPCTestSupport", "ipcbench", .product(name: "SystemPackage", package: "swift-system")]
        ),
        .testTarget(
            name: "NotifyTransportTests",
            dependencies: ["IPCCore", "IPCFraming", "IPCSystem", "CIPCShims", "NotifyTransport", "IPCBenchKit", "IPCTestSupport", "ipcbench", .product(name: "SystemPackage", package: "swift-system")]
        ),
        .testTarget(name: "WormholeTests", dependencies: ["IPCCore", "IPCSecureCoding", "Wormhole", "NotifyTransport", "IPCBenchKit", "IPCTestSupport", "ipcbench"]),
        .testTarget(
            name: "FilePresenterTransportTests",
            dependencies: [
                "CIPCShims", "IPCCore", "IPCSystem", "FilePresenterTransport", "IPCFileCoordination", "IPCBenchKit", "IPCTestSupport", "ipcbench", "IPCConformance",
                .product(name: "SystemPackage", package: "swift-system"),
            ]
        ),
        .testTarget(
            name: "MessagePortTransportTests",
            dependencies: ["IPCCore", "IPCSystem", "MessagePortTransport", "IPCBenchKit", "IPCTestSupport", "ipcbench"]
        ),
        .testTarget(
            name: "IPCConformanceTests",
            dependencies: ["IPCConformance", "IPCCore", "IPCEngine", "IPCFraming", "IPCSecureCoding", "UnixSocketTransport", "IPCBenchKit", "IPCTestSupport", "ipcbench", "FilePresenterTransport", "IPCFileCoordination", "NotifyTransport", "Wormhole"]
        ),
        .testTarget(
            name: "IPCBenchTests",
            dependencies: [
                "IPCBenchKit", "IPCTestSupport", "ipcbench", "IPCConformance", "IPCCore", "IPCFraming", "IPCSystem", "UnixSocketTransport", "MessagePortTransport", "NotifyTransport", "FilePresenterTransport",
                .product(name: "SystemPackage", package: "swift-system"),
            ]
        ),
        // Hostile peers against every transport's listening side, and the security guarantees.
        .testTarget(
            name: "HostileTests",
            dependencies: [
                "IPCCore", "IPCFraming", "IPCSystem", "UnixSocketTransport", "MessagePortTransport", "NotifyTransport",
                "FilePresenterTransport", "IPCFileCoordination", "IPCBenchKit", "IPCConformance", "IPCTestSupport", "ipcbench", "CIPCShims",
                .product(name: "SystemPackage", package: "swift-system"),
            ]
        ),
        .testTarget(name: "NativeFloorTests", dependencies: ["IPCBenchKit", "IPCCore", "IPCSystem", "IPCTestSupport", "ipcbench"]),
    ],
    swiftLanguageModes: [.v6]
)

// The upcoming features that gate the public API: `any` spelled out for every existential;
// members visible only from modules a file imports itself; and imports internal unless they
// say `public import`, so that a module's public signatures name every module they expose.
// (On a clean build the compiler may credit Glibc's `struct stat` to CIPCShims, whose header
// includes <mqueue.h> and through it <fcntl.h>: a file that uses `stat` imports both.)
for target in package.targets where target.type != .system && target.type != .plugin {
    guard !["CIPCShims", "CMallocCounter", "CNativeFloor"].contains(target.name) else { continue }
    target.swiftSettings = (target.swiftSettings ?? []) + [.enableUpcomingFeature("ExistentialAny"), .enableUpcomingFeature("MemberImportVisibility"), .enableUpcomingFeature("InternalImportsByDefault")]
}
